//! `per_channel_cast_and_transpose` (`spec/quant.md` §3.7): FP8 e4m3 cast with one scale per
//! column per block of `npt` rows, the data written transposed.
//!
//! # What it computes
//!
//! For each column `c` and row block `b` (rows `[npt·b, npt·b + npt)`):
//!
//! 1. `amax = max |x[r, c]|` over the block (NaN ignored);
//! 2. `(sf, inv)` per §1.4 for e4m3 (`ε = 1e-4`, `Q = 448`; powers of two with `round_sf`),
//!    `out_sf[b, c] = sf`;
//! 3. `out[c, r] = enc8(fl(x[r, c] · inv))`: the **data** is transposed, the scales are not.
//!
//! It is the generic cast ([`reference::cast`](fn@crate::reference::cast)) with block
//! `(npt, 1)`, layout A, followed by a transpose of the data, as upstream's reference says.
//!
//! | argument | dtype | shape | notes |
//! |---|---|---|---|
//! | `x` | bf16 | `(M, K)`, `M % 128 == 0`, `K % 64 == 0` | unit column stride, any row stride |
//! | `out` | e4m3 | `(K, M)` | contiguous |
//! | `out_sf` | fp32 | `(M/npt, K)` | layout A (row-major), never transposed |
//!
//! # Preconditions ([`validate`])
//!
//! * `x` bf16 (by type: [`tk_core::HostView`]`<bf16>`), `M % 128 == 0` (`M = 0` allowed),
//!   `K % 64 == 0`, `K >= 1`.
//! * `num_per_tokens` ∈ {32, 128} ([`NUM_PER_TOKENS`]). The format is e4m3.
//!
//! # Deviations from upstream
//!
//! * Any row stride is accepted (upstream: contiguous).
//! * NaN / inf inputs follow the GPU (§5 item 6), as in the generic reference.

use half::bf16;
use tk_core::{HostView, Result, TkError};

use crate::plan::{require_multiple, CastPlan};
use crate::scale::ScaleLayout;
use crate::types::PlainInput;

/// The row-block heights `npt` the op accepts.
pub const NUM_PER_TOKENS: [usize; 2] = [32, 128];

/// The parameters of the op (upstream's `num_per_tokens` and `round_sf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PerChannelCastAndTransposeParams {
    /// `npt`, rows per scale: 32 or 128.
    pub num_per_tokens: usize,
    /// Round each scale up to a power of two (§1.4).
    pub round_sf: bool,
}

impl PerChannelCastAndTransposeParams {
    /// Bundles the parameters.
    pub const fn new(num_per_tokens: usize, round_sf: bool) -> Self {
        Self {
            num_per_tokens,
            round_sf,
        }
    }
}

/// Validates a call and returns its plan: block `(npt, 1)`, grid `(M/npt, K)`, layout A.
///
/// Errors: `x` ([`TkError::Shape`]: rank, `M % 128 != 0`, `K % 64 != 0`; [`TkError::Stride`];
/// [`TkError::Empty`] for `K = 0`), `num_per_tokens` ([`TkError::Param`]).
pub fn validate(
    x: &HostView<'_, bf16>,
    params: &PerChannelCastAndTransposeParams,
) -> Result<CastPlan> {
    let (m, k) = PlainInput::BF16(x.clone()).validate("x")?;
    validate_dims(m, k, params)
}

/// The device-independent part of [`validate`], on `(M, K)`.
pub fn validate_dims(
    m: usize,
    k: usize,
    params: &PerChannelCastAndTransposeParams,
) -> Result<CastPlan> {
    require_multiple("x", &[m, k], "M", m, 128, "the kernel tiles rows by 128")?;
    require_multiple("x", &[m, k], "K", k, 64, "the kernel tiles columns by 64")?;
    let npt = params.num_per_tokens;
    if !NUM_PER_TOKENS.contains(&npt) {
        return Err(TkError::param(
            "num_per_tokens",
            format!("must be 32 or 128, got {npt}"),
        ));
    }
    CastPlan::new_arg(m, k, (npt, 1), ScaleLayout::RowMajorF32, "num_per_tokens")
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU op (feature `cuda`) and the launch shared by the per-channel kernels
/// (`cuda/per_channel.cuh`: this op, [`crate::per_channel_cast_fused`] and
/// [`crate::swiglu_forward_and_per_channel_cast_and_transpose`]); bit-exact with
/// [`reference::per_channel_cast_and_transpose`](fn@crate::reference::per_channel_cast_and_transpose).
///
/// Kernel: a CTA of 256 threads casts a tile of 128 rows × 64 columns; each thread loads 8
/// columns of 4 rows (16-byte loads), column maxima come from registers, warp shuffles and
/// shared memory across the `npt / 16` warps of a scale block, then one thread per (block,
/// column) computes the scale and shares its inverse through shared memory; the transposed
/// codes are staged in shared memory and written as 16-byte chunks, 8 threads per 128-byte run
/// of an output row. At most the resident CTAs are launched, each looping over row tiles and
/// loading its next tile while it stores the current one (software pipeline). No host
/// synchronisation.
#[cfg(feature = "cuda")]
mod gpu {
    use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
    use half::bf16;
    use tk_core::error::DriverContext;
    use tk_core::{Device, DeviceView, KernelSource, KernelSpec, Result};

    use super::{validate_dims, PerChannelCastAndTransposeParams, NUM_PER_TOKENS};
    use crate::cast::{check_out_scales, check_same_device};
    use crate::device::{DeviceQuantData, DeviceQuantDataViewMut, DeviceScales};
    use crate::plan::CastPlan;
    use crate::swiglu::all_aligned16;
    use crate::types::{check_matrix, check_nonempty_k, CastFormat};

    /// The headers of the per-channel kernels.
    pub(crate) const PER_CHANNEL_HEADERS: &[(&str, &str)] = &[
        (
            "tk/quant_scale.cuh",
            include_str!("../cuda/quant_scale.cuh"),
        ),
        ("tk/fused_io.cuh", include_str!("../cuda/fused_io.cuh")),
        (
            "tk/per_channel.cuh",
            include_str!("../cuda/per_channel.cuh"),
        ),
    ];

    static SOURCE: KernelSource = KernelSource {
        file: "per_channel_cast_and_transpose.cu",
        entry: "tk_per_channel_cast_and_transpose",
        code: include_str!("../cuda/per_channel_cast_and_transpose.cu"),
        headers: PER_CHANNEL_HEADERS,
        needs_cuda_headers: true,
    };

    /// The arguments of every per-channel kernel, field for field `Params` in
    /// `cuda/per_channel.cuh` (each op fills the fields it uses).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    pub(crate) struct PerChannelArgs {
        pub x: u64,
        pub ldx: u64,
        pub xs: u64,
        pub xs_ld: u64,
        pub map: u64,
        pub map_s: u64,
        pub n_in: u64,
        pub out: u64,
        pub sf: u64,
        pub m: u64,
        pub k: u64,
        pub h: u64,
        /// SwiGLU clamp mode: 0 none, 1 compares and selects, 2 min / max in fp32 (`C > 0`),
        /// 3 min / max on the raw bf16 words (`C > 0` a bf16 value).
        pub has_clamp: u32,
        pub clamp: f32,
        /// The launch's CTA count in tiles: `step_r` rows of `K/64` column tiles plus `step_c`
        /// (set by [`launch_per_channel`]).
        pub step_r: u32,
        pub step_c: u32,
    }

    // SAFETY: `PerChannelArgs` is `repr(C)` plain old data (12 × u64 then 4 × 4 bytes, no
    // padding), laid out exactly as the kernels' `Params`, received by value.
    unsafe impl DeviceRepr for PerChannelArgs {}

    /// CTAs per SM the per-channel kernels of a plain or gathered input are compiled for
    /// (`__launch_bounds__(256, 5)`: at most 48 registers, which they fit without spilling).
    pub(crate) const PLAIN_MIN_BLOCKS: usize = 5;

    /// A per-channel kernel specialisation: `source` with the tile's defines (`min_blocks`:
    /// CTAs per SM for the launch bounds; `grid`: the tile loop, see [`PerChannelGrid`]) and
    /// the op's own.
    pub(crate) fn per_channel_spec(
        source: &'static KernelSource,
        npt: usize,
        round_sf: bool,
        transpose: bool,
        vecio: bool,
        min_blocks: usize,
        grid: PerChannelGrid,
    ) -> KernelSpec {
        KernelSpec::new(source)
            .define("TK_NPT", npt)
            .define("TK_ROUND", round_sf as u8)
            .define("TK_TRANSPOSE", transpose as u8)
            .define("TK_VECIO", vecio as u8)
            .define("TK_MINB", min_blocks)
            .define("TK_PC_RUN", grid.run())
    }

    /// How the CTAs of a per-channel launch cover the 128 x 64 tiles.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum PerChannelGrid {
        /// A 2D grid `(K/64, min(row tiles, 65535))`, CTA `(x, y)` taking column tile `x` of
        /// row tiles `y`, `y + rows`, ...
        Tiles,
        /// At most `sm_count x b` CTAs (`b` = the kernel's CTAs per SM), the tiles dealt
        /// round-robin (row-major), each CTA looping over its tiles (for a Src whose next tile
        /// is prefetched).
        Persistent(usize),
        /// Runs of `r` consecutive row-major tiles per CTA (`TK_PC_RUN`; column tiles of one
        /// row tile, for a Src that keeps per-row work across them), a 1D grid of
        /// `ceil(tiles / r)` CTAs.
        Runs(usize),
    }

    impl PerChannelGrid {
        /// `TK_PC_RUN`: the run length (1 unless `Runs`).
        pub(crate) fn run(self) -> usize {
            match self {
                PerChannelGrid::Runs(r) => r,
                _ => 1,
            }
        }

        /// The launch grid `(x, y)` over the tiles of an `(M, K)` cast (`K/64` column tiles,
        /// `ceil(M/128)` row tiles) on a device of `sm_count` SMs.
        pub(crate) fn dims(self, m: usize, k: usize, sm_count: usize) -> (u32, u32) {
            let (tiles_c, tiles_r) = (k / 64, m.div_ceil(128));
            match self {
                // Every resident CTA, the tiles dealt round-robin (row-major): per SM at most
                // one tile more than the average (2.8 % faster on the H200 than one CTA per
                // column tile x the fewest CTA rows holding the row tiles in one wave, which
                // left some SMs with a CTA fewer).
                PerChannelGrid::Persistent(per_sm) => {
                    ((tiles_r * tiles_c).min(sm_count * per_sm) as u32, 1)
                }
                // Fewer than 2^31 CTAs: every tile is at least 8 KiB of the output.
                PerChannelGrid::Runs(r) => ((tiles_r * tiles_c).div_ceil(r) as u32, 1),
                PerChannelGrid::Tiles => (tiles_c as u32, tiles_r.min(65535) as u32),
            }
        }
    }

    /// Checks the e4m3 output (`(M, K)`, or `(K, M)` when `transpose`) and the scales against
    /// `plan` (block `(npt, 1)`, layout A), then launches `spec_for(vecio)` over `plan`'s
    /// tiles with `args` (inputs filled in by the op; `input_align`: their addresses and row
    /// pitches in bytes, for the vector-access decision) into `(out, out_sf)`;
    /// `grid`: how the CTAs cover the tiles (the kernel's `TK_PC_RUN` must match: `spec_for`
    /// builds it with [`per_channel_spec`] and the same `grid`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_per_channel(
        dev: &Device,
        plan: &CastPlan,
        transpose: bool,
        grid: PerChannelGrid,
        mut args: PerChannelArgs,
        input_align: &[u64],
        (out, out_sf): (&mut DeviceQuantDataViewMut<'_>, &mut DeviceScales),
        spec_for: impl Fn(bool) -> KernelSpec,
    ) -> Result<()> {
        let (m, k) = (plan.m, plan.k);
        let (rows, cols) = if transpose { (k, m) } else { (m, k) };
        out.check_output("out", CastFormat::E4M3, rows, cols)?;
        check_same_device("out", dev, out.device())?;
        check_out_scales(out_sf, plan)?;
        check_same_device("out_sf", dev, out_sf.device())?;
        (args.out, args.sf, args.m, args.k) = (out.address(), out_sf.address(), m as u64, k as u64);
        let mut align = input_align.to_vec();
        align.extend([args.out, args.sf]);
        let spec = spec_for(all_aligned16(&align));
        if m == 0 {
            return Ok(());
        }
        let tiles_c = k / 64;
        let grid = grid.dims(m, k, dev.props().sm_count.max(1) as usize);
        let nb = grid.0 as usize * grid.1 as usize;
        (args.step_r, args.step_c) = ((nb / tiles_c) as u32, (nb % tiles_c) as u32);
        let f = dev.function(&spec)?;
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&args);
        // SAFETY: the op validated its inputs (shapes, unit column strides, row strides passed
        // in args; gathered rows are bounds-checked in the kernel against n_in) and this
        // function the e4m3 output (contiguous, exact shape) and the scales (layout A of the
        // plan's grid), all on one device; the kernel reads rows < M (K % 64 == 0 columns) and
        // writes inside those outputs; a transposed output needs M % 128 == 0, which every op
        // with `transpose` validated. Vector accesses only when every address and row pitch is
        // 16-byte aligned. Buffers outlive the launch.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (grid.0, grid.1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .ctx("launching a per-channel cast")?;
        Ok(())
    }

    /// The specialisations the tests and benchmarks launch.
    pub(crate) fn registered_kernels() -> Vec<KernelSpec> {
        let mut v = Vec::new();
        for npt in NUM_PER_TOKENS {
            for round in [false, true] {
                v.push(plain_spec(npt, round, true));
            }
        }
        v
    }

    /// Validates bf16 `x` and returns the plan and the input part of the kernel arguments.
    fn prepare(
        x: &DeviceView<'_, bf16>,
        params: &PerChannelCastAndTransposeParams,
    ) -> Result<(CastPlan, PerChannelArgs)> {
        let (m, k) = check_matrix("x", x.layout())?;
        check_nonempty_k("x", x.layout(), k)?;
        let plan = validate_dims(m, k, params)?;
        let args = PerChannelArgs {
            x: x.address(),
            ldx: x.strides()[0] as u64,
            n_in: m as u64,
            ..PerChannelArgs::default()
        };
        Ok((plan, args))
    }

    /// `per_channel_cast_and_transpose` on the GPU into caller-provided contiguous `out`
    /// (e4m3 `(K, M)`) and `out_sf` (fp32 layout A `(M/npt, K)`); `x` is bf16 `(M, K)` with
    /// unit column stride.
    ///
    /// Errors: those of [`super::validate`], `out` / `out_sf` (format, shape, contiguity,
    /// layout, grid), [`tk_core::TkError::Placement`].
    pub fn per_channel_cast_and_transpose_into(
        x: &DeviceView<'_, bf16>,
        params: &PerChannelCastAndTransposeParams,
        out: &mut DeviceQuantDataViewMut<'_>,
        out_sf: &mut DeviceScales,
    ) -> Result<()> {
        let (plan, args) = prepare(x, params)?;
        launch_per_channel(
            x.device(),
            &plan,
            true,
            PerChannelGrid::Persistent(PLAIN_MIN_BLOCKS),
            args,
            &[args.x, args.ldx * 2],
            (out, out_sf),
            |vec| plain_spec(params.num_per_tokens, params.round_sf, vec),
        )
    }

    /// This op's kernel specialisation (`vecio`: 16-byte accesses).
    fn plain_spec(npt: usize, round_sf: bool, vecio: bool) -> KernelSpec {
        per_channel_spec(
            &SOURCE,
            npt,
            round_sf,
            true,
            vecio,
            PLAIN_MIN_BLOCKS,
            PerChannelGrid::Persistent(PLAIN_MIN_BLOCKS),
        )
    }

    /// `per_channel_cast_and_transpose` on the GPU: e4m3 data `(K, M)` (the transpose) and
    /// fp32 layout-A scales `(M/npt, K)`.
    ///
    /// Errors: see [`per_channel_cast_and_transpose_into`].
    pub fn per_channel_cast_and_transpose(
        x: &DeviceView<'_, bf16>,
        params: &PerChannelCastAndTransposeParams,
    ) -> Result<(DeviceQuantData, DeviceScales)> {
        let (plan, _) = prepare(x, params)?;
        let dev = x.device();
        let mut d = DeviceQuantData::alloc(dev, CastFormat::E4M3, plan.k, plan.m)?;
        let mut s = DeviceScales::alloc(dev, plan.sf_layout, plan.grid)?;
        per_channel_cast_and_transpose_into(x, params, &mut d.view_mut(), &mut s)?;
        Ok((d, s))
    }
}

/// CPU models of the per-channel kernels' index math (`cuda/per_channel.cuh`).
#[cfg(test)]
mod index_model {
    /// The tile loop with `TK_PC_RUN = run > 1`: CTA `b` of `ceil(T / run)` takes tiles
    /// `run b ..` stepped `(tr, tc + 1)` with a carry, while `tr < tiles_r` and `n < run`.
    fn run_tiles(tiles_r: u32, tiles_c: u32, run: u32) -> Vec<(u32, u32)> {
        let ctas = (tiles_r * tiles_c).div_ceil(run);
        let mut v = Vec::new();
        for b in 0..ctas {
            let t0 = b * run;
            let (mut tr, mut tc) = (t0 / tiles_c, t0 % tiles_c);
            let mut n = 0;
            while tr < tiles_r && n < run {
                v.push((tr, tc));
                tc += 1;
                if tc == tiles_c {
                    (tc, tr) = (0, tr + 1);
                }
                n += 1;
            }
        }
        v
    }

    /// `TK_PC_WHOLE` (`tiles_c % run == 0`): CTA `b` takes `(t0 / tiles_c, t0 % tiles_c + n)`
    /// for `n < run`, without the carry or the row bound: the same tiles in the same order.
    #[test]
    fn whole_runs_are_the_runs() {
        for tiles_r in [1, 2, 7, 198] {
            for (tiles_c, run) in [(2, 2), (10, 2), (112, 2), (4, 4), (112, 4), (40, 4)] {
                let whole: Vec<_> = (0..tiles_r * tiles_c / run)
                    .flat_map(|b| (0..run).map(move |n| (b * run / tiles_c, b * run % tiles_c + n)))
                    .collect();
                assert_eq!(
                    whole,
                    run_tiles(tiles_r, tiles_c, run),
                    "{tiles_r}x{tiles_c} run {run}"
                );
            }
        }
    }

    #[test]
    fn runs_cover_every_tile_once() {
        for tiles_r in [1, 2, 3, 7, 198] {
            for tiles_c in [1, 2, 3, 9, 10, 112] {
                for run in [2, 3, 4, 8] {
                    let mut v = run_tiles(tiles_r, tiles_c, run);
                    v.sort_unstable();
                    let all: Vec<_> = (0..tiles_r)
                        .flat_map(|r| (0..tiles_c).map(move |c| (r, c)))
                        .collect();
                    assert_eq!(v, all, "tiles {tiles_r}x{tiles_c} run {run}");
                }
            }
        }
    }
}
