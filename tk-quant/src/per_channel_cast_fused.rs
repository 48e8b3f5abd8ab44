//! `per_channel_cast_fused` (`spec/quant.md` §3.6): per-channel (128-row) FP8 e4m3 cast with two
//! optional fused stages: dequantizing a per-token FP8 input with `(1, 128)` scales ("fused
//! cast back"), and gathering rows through an index map (`pos_to_token`).
//!
//! # What it computes
//!
//! For output row `i < N_out`:
//!
//! 1. the source row `src = pos_to_token[i]` with a map, else `i`;
//! 2. if `src < 0` (a padding row): `y[i, c] = +0.0` for every column;
//! 3. else plain input: `y[i, c] = fp32(x[src, c])`; fused cast back:
//!    `y[i, c] = fl(dec8(data[src, c]) · sf[src, c/128])`;
//! 4. for each column `c` and 128-row output block `b`: `amax = max |y|` over the block's
//!    rows (`< N_out`), `(sf, inv)` per §1.4 (e4m3, `ε = 1e-4`; powers of two with `round_sf`);
//! 5. `out[i, c] = enc8(fl(y[i, c] · inv))`: in the fused case `fl(fl(dec8 · sf_in) · inv)`,
//!    left to right, as upstream's kernel and reference both do.
//!
//! Padding rows give `0x00`. It is the generic cast ([`reference::cast`](fn@crate::reference::cast))
//! of the gathered `y` with block `(128, 1)`, layout A; without a map, of `x` itself (a
//! [`crate::QuantInput`] with block `(1, 128)` when fused).
//!
//! | argument | dtype | shape | notes |
//! |---|---|---|---|
//! | `x` plain | fp32 / bf16 | `(N_in, K)`, `K % 64 == 0` | unit column stride, any row stride |
//! | `x` fused | e4m3 + fp32 scales | `(N_in, K)` + `(N_in, K/128)`, `K % 128 == 0` | scales are dequantization multipliers of `(1, 128)` groups |
//! | `pos_to_token` | int32 | `(N_out,)`, `N_out % 16 == 0` | entries `< N_in`, negative for padding rows |
//! | `out` | e4m3 | `(N_out, K)` | contiguous |
//! | `out_sf` | fp32 | `(ceil(N_out/128), K)` | layout A |
//!
//! # Preconditions ([`validate`])
//!
//! * `num_per_tokens == 128`; the format is e4m3.
//! * Plain input: `num_per_channels` is `None`; `K % 64 == 0`.
//! * Fused cast back: `num_per_channels == Some(128)`; data e4m3 `(N_in, K)` with
//!   `K % 128 == 0`; scales fp32 `(N_in, K/128)`.
//! * With a map: `N_out % 16 == 0` and every entry `< N_in`. Without: `N_out = N_in` and
//!   `N_in % 128 == 0`.
//!
//! # Deviations from upstream (documented choices)
//!
//! * **`K`**: upstream's wrapper does not check it. Plain input needs `K % 64 == 0` here (what
//!   upstream exercises, through `per_channel_cast`, and the kernel's column tiling), fused
//!   input `K % 128 == 0` (implied upstream by the scale shape). `K = 128` with fused input
//!   works here; upstream reads its `(N_in, 1)` scales as column-major and fails.
//! * **`N_out % 128 != 0`** (allowed with a map): the last block is partial, and its rows past
//!   `N_out` do not count towards `amax` (upstream's reference; its kernel relies on TileLang's
//!   bounds handling there).
//! * Map entries are range-checked (upstream trusts them). Inputs may have any row stride.
//! * NaN / inf inputs follow the GPU (§5 item 6), as in the generic reference.

use float8::F8E4M3;
use tk_core::{HostView, Result, TkError};

use crate::plan::{require_multiple, CastPlan};
use crate::scale::ScaleLayout;
use crate::types::{check_matrix, PlainInput};

/// The only row-block height the op accepts.
pub const NUM_PER_TOKENS: usize = 128;

/// The group width of a fused cast back's input scales.
pub const NUM_PER_CHANNELS: usize = 128;

/// The input `x` of the op.
#[derive(Debug, Clone)]
pub enum FusedInput<'a> {
    /// fp32 / bf16 `(N_in, K)`.
    Plain(PlainInput<'a>),
    /// Per-token FP8 data with its scales (the fused cast back).
    Quantized {
        /// e4m3 `(N_in, K)`.
        data: HostView<'a, F8E4M3>,
        /// fp32 `(N_in, K/128)`: the dequantization multiplier of each `(1, 128)` group.
        sf: HostView<'a, f32>,
    },
}

impl<'a> From<PlainInput<'a>> for FusedInput<'a> {
    fn from(x: PlainInput<'a>) -> Self {
        FusedInput::Plain(x)
    }
}

/// The scalar parameters of the op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PerChannelCastFusedParams {
    /// `npt`, rows per scale: must be 128.
    pub num_per_tokens: usize,
    /// Round each scale up to a power of two (§1.4).
    pub round_sf: bool,
    /// `None` for plain input; `Some(128)` (the input scales' group) for a fused cast back.
    pub num_per_channels: Option<usize>,
}

impl PerChannelCastFusedParams {
    /// Plain input: `npt = 128`, no input groups.
    pub const fn plain(round_sf: bool) -> Self {
        Self {
            num_per_tokens: NUM_PER_TOKENS,
            round_sf,
            num_per_channels: None,
        }
    }

    /// Fused cast back: `npt = 128`, input groups of 128.
    pub const fn fused(round_sf: bool) -> Self {
        Self {
            num_per_tokens: NUM_PER_TOKENS,
            round_sf,
            num_per_channels: Some(NUM_PER_CHANNELS),
        }
    }
}

/// The validated geometry of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerChannelCastFusedPlan {
    /// Input rows `N_in`.
    pub n_in: usize,
    /// The output cast: `(N_out, K)`, block `(128, 1)`, layout A.
    pub cast: CastPlan,
}

/// Validates a call (see the [module docs](self) for every rule).
///
/// Errors, naming the argument: `x` ([`TkError::Shape`]: rank, `K`, `N_in % 128` without a
/// map; [`TkError::Stride`]; [`TkError::Empty`]), `x.sf` ([`TkError::Shape`],
/// [`TkError::Stride`]), `pos_to_token` ([`TkError::Shape`]: not 1-D, `N_out % 16 != 0`;
/// [`TkError::Param`]: an entry `>= N_in`), `num_per_tokens`, `num_per_channels`
/// ([`TkError::Param`]).
pub fn validate(
    x: &FusedInput<'_>,
    pos_to_token: Option<&HostView<'_, i32>>,
    params: &PerChannelCastFusedParams,
) -> Result<PerChannelCastFusedPlan> {
    check_num_per_tokens(params)?;
    let (n_in, k) = match x {
        FusedInput::Plain(p) => {
            check_num_per_channels(false, params)?;
            let (n, k) = p.validate("x")?;
            check_k(n, k, false)?;
            (n, k)
        }
        FusedInput::Quantized { data, sf } => {
            check_num_per_channels(true, params)?;
            let (n, k) = check_matrix("x", data.layout())?;
            if k == 0 {
                return Err(TkError::Empty {
                    arg: "x",
                    shape: data.shape().to_vec(),
                });
            }
            check_k(n, k, true)?;
            check_input_scales(n, k, check_matrix("x.sf", sf.layout())?)?;
            (n, k)
        }
    };
    let n_out = match pos_to_token {
        Some(map) => {
            let n_out = map_len(map.shape())?;
            for i in 0..n_out {
                let src = map.at(&[i]);
                if src >= 0 && src as usize >= n_in {
                    return Err(TkError::param(
                        "pos_to_token",
                        format!("entry {i} is {src}, out of range for N_in = {n_in} rows of x"),
                    ));
                }
            }
            Some(n_out)
        }
        None => None,
    };
    plan(n_in, k, n_out)
}

/// `num_per_tokens` must be 128.
pub(crate) fn check_num_per_tokens(params: &PerChannelCastFusedParams) -> Result<()> {
    if params.num_per_tokens != NUM_PER_TOKENS {
        return Err(TkError::param(
            "num_per_tokens",
            format!(
                "per_channel_cast_fused supports num_per_tokens = 128 only, got {}",
                params.num_per_tokens
            ),
        ));
    }
    Ok(())
}

/// `num_per_channels` must be `None` for plain input and `Some(128)` for a fused cast back.
pub(crate) fn check_num_per_channels(
    quantized: bool,
    params: &PerChannelCastFusedParams,
) -> Result<()> {
    match (quantized, params.num_per_channels) {
        (false, Some(npc)) => Err(TkError::param(
            "num_per_channels",
            format!("must be None for a plain (fp32 / bf16) input, got {npc}"),
        )),
        (true, npc) if npc != Some(NUM_PER_CHANNELS) => Err(TkError::param(
            "num_per_channels",
            format!(
                "a fused cast back reads (1, 128) input scales: num_per_channels must be \
                 Some(128), got {npc:?}"
            ),
        )),
        _ => Ok(()),
    }
}

/// `K % 64 == 0` for plain input, `K % 128 == 0` for a fused cast back (`x` is `(n, k)`).
pub(crate) fn check_k(n: usize, k: usize, quantized: bool) -> Result<()> {
    if quantized {
        require_multiple(
            "x",
            &[n, k],
            "K",
            k,
            NUM_PER_CHANNELS,
            "the input scales cover groups of 128 columns",
        )
    } else {
        require_multiple("x", &[n, k], "K", k, 64, "the kernel tiles columns by 64")
    }
}

/// The fused cast back's scales `(sr, sc)` must be `(N_in, K/128)`.
pub(crate) fn check_input_scales(n: usize, k: usize, (sr, sc): (usize, usize)) -> Result<()> {
    if (sr, sc) != (n, k / NUM_PER_CHANNELS) {
        return Err(TkError::Shape {
            arg: "x.sf",
            expected: format!("(N_in, K/128) = ({n}, {}) fp32", k / NUM_PER_CHANNELS),
            got: vec![sr, sc],
        });
    }
    Ok(())
}

/// The length `N_out` of a `pos_to_token` of shape `shape`: 1-D with `N_out % 16 == 0`.
pub(crate) fn map_len(shape: &[usize]) -> Result<usize> {
    let [n_out] = *shape else {
        return Err(TkError::Shape {
            arg: "pos_to_token",
            expected: "rank 1 (N_out,) int32".into(),
            got: shape.to_vec(),
        });
    };
    require_multiple(
        "pos_to_token",
        &[n_out],
        "N_out",
        n_out,
        16,
        "upstream's kernel tiles gathered rows by 16",
    )?;
    Ok(n_out)
}

/// The plan of a call on `(n_in, k)` input with `n_out` mapped rows (`None`: no map, then
/// `N_in % 128 == 0`).
pub(crate) fn plan(n_in: usize, k: usize, n_out: Option<usize>) -> Result<PerChannelCastFusedPlan> {
    let n_out = match n_out {
        Some(n) => n,
        None => {
            require_multiple(
                "x",
                &[n_in, k],
                "M",
                n_in,
                128,
                "without pos_to_token the output has the input's rows, in blocks of 128",
            )?;
            n_in
        }
    };
    Ok(PerChannelCastFusedPlan {
        n_in,
        cast: CastPlan::new_arg(
            n_out,
            k,
            (NUM_PER_TOKENS, 1),
            ScaleLayout::RowMajorF32,
            "num_per_tokens",
        )?,
    })
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU op (feature `cuda`): `cuda/per_channel_cast_fused.cu`, the per-channel tile of
/// [`crate::per_channel_cast_and_transpose`] (not transposed, `npt = 128`) whose rows are
/// gathered through `pos_to_token` and, fused, dequantized (`fl(dec8 · s_in)`) on load;
/// bit-exact with [`reference::per_channel_cast_fused`](fn@crate::reference::per_channel_cast_fused).
/// For e4m3 input a CTA casts a run of consecutive column tiles of one row tile, its threads'
/// source rows looked up once per run, and has the run's next tiles in flight while casting the
/// current one: gathered rows (`pos_to_token` given) in runs of 4 through asynchronous copies
/// into shared memory (all 4 tiles of the run from its first tile on); plain rows in runs of 2
/// the same way where those runs fill the device's resident CTAs at least once, else in runs
/// of 4 with the next tile's raw words in registers. fp32 / bf16 input takes one CTA per tile.
/// No host synchronisation.
///
/// Device-side difference from [`validate`]: map *values* are not checked (that needs a host
/// synchronisation); an entry `>= N_in` (rejected on the CPU) reads no memory and gives a
/// zero row, like a negative one.
#[cfg(feature = "cuda")]
mod gpu {
    use float8::F8E4M3;
    use tk_core::{DeviceView, KernelSource, KernelSpec, Result};

    use super::{
        check_input_scales, check_k, check_num_per_channels, check_num_per_tokens, map_len, plan,
        PerChannelCastFusedParams, NUM_PER_TOKENS,
    };
    use crate::cast::check_same_device;
    use crate::device::{DevicePlainInput, DeviceQuantData, DeviceQuantDataViewMut, DeviceScales};
    use crate::per_channel_cast_and_transpose::{
        launch_per_channel, per_channel_spec, PerChannelArgs, PerChannelGrid, PER_CHANNEL_HEADERS,
        PLAIN_MIN_BLOCKS,
    };
    use crate::plan::CastPlan;
    use crate::swiglu::check_device_vector;
    use crate::types::{check_matrix, check_nonempty_k, CastFormat};

    static SOURCE: KernelSource = KernelSource {
        file: "per_channel_cast_fused.cu",
        entry: "tk_per_channel_cast_fused",
        code: include_str!("../cuda/per_channel_cast_fused.cu"),
        headers: PER_CHANNEL_HEADERS,
        needs_cuda_headers: true,
    };

    /// The input `x` of the GPU op ([`super::FusedInput`] on the device).
    #[derive(Debug, Clone)]
    pub enum DeviceFusedInput<'a> {
        /// fp32 / bf16 `(N_in, K)`, unit column stride, any row stride.
        Plain(DevicePlainInput<'a>),
        /// Per-token FP8 data with its scales (the fused cast back).
        Quantized {
            /// e4m3 `(N_in, K)`, unit column stride.
            data: DeviceView<'a, F8E4M3>,
            /// fp32 `(N_in, K/128)`, unit column stride.
            sf: DeviceView<'a, f32>,
        },
    }

    impl<'a> From<DevicePlainInput<'a>> for DeviceFusedInput<'a> {
        fn from(x: DevicePlainInput<'a>) -> Self {
            DeviceFusedInput::Plain(x)
        }
    }

    /// The kernel's `TK_IN`: 0 fp32, 1 bf16, 2 e4m3 with scales.
    fn input_code(x: &DeviceFusedInput<'_>) -> u8 {
        match x {
            DeviceFusedInput::Plain(DevicePlainInput::F32(_)) => 0,
            DeviceFusedInput::Plain(DevicePlainInput::BF16(_)) => 1,
            DeviceFusedInput::Quantized { .. } => 2,
        }
    }

    /// CTAs per SM (launch bounds) for e4m3 input: 4 (64 registers, no spills with runs); 5
    /// (48 registers: 32-40 bytes of spills with runs) measured plain e4m3 2.39x slower.
    const E4M3_MIN_BLOCKS: usize = 4;

    /// Whether the kernel forms each gathered row's data and scale address as one 32x32 ->
    /// 64-bit multiply-add from the tile's column base (`TK_PCF_PITCH32`) for `args`: e4m3 input
    /// whose data and scale row pitches, in bytes, are below 2^32 (otherwise the u64 form
    /// `base + (src * ldx + c0) * B` per row). With u64 pitches ptxas reloads the parameters
    /// under each row's predicate (sm_90a, e4m3 with fp32 scales: 883 -> 838 SASS instructions,
    /// the 4 rows' addresses ~90 -> ~60 per tile). H200 (session 8, runs of 4): e4m3 + scales
    /// 0.7-2.0 % faster (plain K = 7168 23.85 -> 23.40 µs, K=6 256/EP8 N = 25344 128.91 ->
    /// 127.77 µs, K=6 72/EP8 N = 24704 125.51 -> 124.64 µs); fp32 / bf16 input keeps the u64 form.
    fn pitch32(input: u8, args: &PerChannelArgs) -> bool {
        input == 2 && args.ldx <= u32::MAX as u64 && args.xs_ld < 1 << 30
    }

    /// How the CTAs of input `input` (0 fp32, 1 bf16, 2 e4m3 + scales) cover the tiles of an
    /// `(M, K)` output on a device of `sms` SMs, with or without a row gather, and the slots of
    /// the staged e4m3 pipeline (`TK_PCF_STAGES`; 0: the next tile's raw words prefetched into
    /// registers instead). A run is consecutive column tiles of one row tile: the threads'
    /// source rows (map loads, checks) are found once per run (`GatherSrc`).
    /// * fp32 / bf16: one CTA per tile (2D grid). Runs of 4 measured plain bf16 (N = 4096) 16 %
    ///   and bf16 K=6 1.4-2.6 % slower (H200, meas31).
    /// * e4m3, gathered: runs of 4, all 4 tiles in flight through shared memory from the run's
    ///   first tile on (H200: runs of 4 made e4m3 + scales K=6 20 % faster than one tile per
    ///   CTA, meas31; runs of 8 5-10 % slower, session 9; staged instead of the register
    ///   prefetch 8.6-11.1 % faster at K=7168, session 11; runs of 2 with 2 slots 6 % and runs
    ///   of 3 with 3 slots 3 % slower, session 17).
    /// * e4m3, plain: runs of 2 with both tiles in flight through shared memory where those
    ///   runs fill the resident CTAs at least once, else runs of 4 with the register prefetch
    ///   (smaller grids: staged runs measured no faster there, sessions 12 and 14). H200,
    ///   session 17 (D6, 3 interleaved rounds, every round of this rule below every round of
    ///   the old one), N = 4096, against staged runs of 4 (K >= 6144) or the register prefetch
    ///   (K <= 4096): K=7168 22.82-22.93 -> 21.50-21.55 µs, K=6144 20.06-20.13 -> 19.39-19.46,
    ///   K=4096 14.30-14.43 -> 13.52-13.60, K=3072 11.35-11.36 -> 11.04-11.07, K=2560
    ///   10.11-10.14 -> 9.57-9.60; the rounded rows 2.8-7.5 % faster likewise.
    fn pipeline(
        input: u8,
        gathered: bool,
        m: usize,
        k: usize,
        sms: usize,
    ) -> (PerChannelGrid, u32) {
        let slots = sms * E4M3_MIN_BLOCKS;
        match input {
            0 | 1 => (PerChannelGrid::Tiles, 0),
            _ if gathered => (PerChannelGrid::Runs(4), 4),
            _ => {
                let pairs = PerChannelGrid::Runs(2).dims(m, k, sms).0 as usize;
                if pairs >= slots {
                    (PerChannelGrid::Runs(2), 2)
                } else {
                    (PerChannelGrid::Runs(4), 0)
                }
            }
        }
    }

    /// Whether the staged runs of `(grid, stages)` over `K = k` columns are whole
    /// (`TK_PC_WHOLE`: `K / 64` a multiple of the run, so each CTA's run is that many column
    /// tiles of one row tile, and the kernel unrolls its tile loop with constant slots). H200
    /// (session 23): see `TK_PC_WHOLE` in `cuda/per_channel_cast_fused.cu`. Launches take them
    /// on sm_90 devices only (where they were measured).
    fn whole_runs((grid, stages): (PerChannelGrid, u32), k: usize) -> bool {
        stages > 1 && (k / 64) % grid.run() == 0
    }

    fn spec(
        input: u8,
        round_sf: bool,
        vecio: bool,
        pitch32: bool,
        (grid, stages): (PerChannelGrid, u32),
        whole: bool,
    ) -> KernelSpec {
        per_channel_spec(
            &SOURCE,
            NUM_PER_TOKENS,
            round_sf,
            false,
            vecio,
            // fp32 rows hold 32 raw words per thread across the gather's load phase: 48
            // registers (5 CTAs per SM) spilled 32 bytes there, 64 (4 CTAs) do not. e4m3 input
            // in runs (the cached source rows): 32-40 bytes of spills at 48 registers.
            match input {
                0 => 4,
                1 => PLAIN_MIN_BLOCKS,
                _ => E4M3_MIN_BLOCKS,
            },
            grid,
        )
        .define("TK_IN", input)
        // u32 row indices for e4m3 input with fp32 scales (3-4 % faster on the H200); with
        // rounded scales they make ptxas spill 24 bytes (7 % slower), for fp32 / bf16 input u64
        // measured up to 1 % faster.
        .define("TK_GATHER32", (input == 2 && !round_sf) as u8)
        .define("TK_PCF_PITCH32", pitch32 as u8)
        .define("TK_PCF_STAGES", stages)
        .define("TK_PC_WHOLE", whole as u8)
    }

    /// The specialisations the tests and benchmarks launch, plus the u64-address form of e4m3
    /// input (row pitches of 2^32 bytes or more) so that the compile check covers it.
    pub(crate) fn registered_kernels() -> Vec<KernelSpec> {
        let mut v = Vec::new();
        for input in [0, 1, 2] {
            for round in [false, true] {
                // Every pipeline: plain rows under one wave of runs of 2 (1x64 on 1 SM, whose 4
                // slots hold 1 run) and at it (512x128: 4 runs), gathered rows.
                let mut pipes = vec![
                    pipeline(input, false, 1, 64, 1),
                    pipeline(input, false, 512, 128, 1),
                    pipeline(input, true, 1, 64, 1),
                ];
                pipes.dedup();
                for pipe in pipes {
                    // Staged runs whole (K = 256: 4 column tiles) and not (K = 128: runs of 4
                    // only; e4m3 input has K % 128 == 0, so its runs of 2 are always whole).
                    let mut wholes = vec![whole_runs(pipe, 128), whole_runs(pipe, 256)];
                    wholes.dedup();
                    for whole in wholes {
                        v.push(spec(input, round, true, input == 2, pipe, whole));
                        if input == 2 {
                            v.push(spec(input, round, true, false, pipe, whole));
                        }
                    }
                }
            }
        }
        v
    }

    /// Validates the device arguments as [`super::validate`] does (map values aside) and
    /// returns the plan, the kernel arguments of the inputs and their alignment values.
    fn prepare(
        x: &DeviceFusedInput<'_>,
        pos_to_token: Option<&DeviceView<'_, i32>>,
        params: &PerChannelCastFusedParams,
    ) -> Result<(CastPlan, PerChannelArgs, Vec<u64>)> {
        check_num_per_tokens(params)?;
        let mut a = PerChannelArgs::default();
        let (n_in, k, align) = match x {
            DeviceFusedInput::Plain(p) => {
                check_num_per_channels(false, params)?;
                let (n, k) = p.validate("x")?;
                check_k(n, k, false)?;
                let bytes = if matches!(p, DevicePlainInput::BF16(_)) {
                    2
                } else {
                    4
                };
                (a.x, a.ldx) = (p.address(), p.layout().strides()[0] as u64);
                (n, k, vec![a.x, a.ldx * bytes])
            }
            DeviceFusedInput::Quantized { data, sf } => {
                check_num_per_channels(true, params)?;
                let (n, k) = check_matrix("x", data.layout())?;
                check_nonempty_k("x", data.layout(), k)?;
                check_k(n, k, true)?;
                check_input_scales(n, k, check_matrix("x.sf", sf.layout())?)?;
                check_same_device("x.sf", data.device(), sf.device())?;
                (a.x, a.ldx) = (data.address(), data.strides()[0] as u64);
                (a.xs, a.xs_ld) = (sf.address(), sf.strides()[0] as u64);
                (n, k, vec![a.x, a.ldx])
            }
        };
        a.n_in = n_in as u64;
        let n_out = match pos_to_token {
            Some(map) => {
                let n_out = map_len(map.shape())?;
                a.map_s = check_device_vector("pos_to_token", map, n_out, device(x))?;
                a.map = map.address();
                Some(n_out)
            }
            None => None,
        };
        Ok((plan(n_in, k, n_out)?.cast, a, align))
    }

    fn device<'d>(x: &'d DeviceFusedInput<'_>) -> &'d tk_core::Device {
        match x {
            DeviceFusedInput::Plain(p) => p.device(),
            DeviceFusedInput::Quantized { data, .. } => data.device(),
        }
    }

    /// `per_channel_cast_fused` on the GPU into caller-provided contiguous `out` (e4m3
    /// `(N_out, K)`) and `out_sf` (fp32 layout A `(ceil(N_out/128), K)`).
    ///
    /// Errors: those of [`super::validate`] (map values aside, see the module docs), `out` /
    /// `out_sf` (format, shape, contiguity, layout, grid), [`tk_core::TkError::Placement`].
    pub fn per_channel_cast_fused_into(
        x: &DeviceFusedInput<'_>,
        pos_to_token: Option<&DeviceView<'_, i32>>,
        params: &PerChannelCastFusedParams,
        out: &mut DeviceQuantDataViewMut<'_>,
        out_sf: &mut DeviceScales,
    ) -> Result<()> {
        let (plan, args, align) = prepare(x, pos_to_token, params)?;
        let input = input_code(x);
        let pitch32 = pitch32(input, &args);
        let dev = device(x);
        let sms = dev.props().sm_count.max(1) as usize;
        let pipe = pipeline(input, pos_to_token.is_some(), plan.m, plan.k, sms);
        // Whole runs where they were measured (sm_90: no spills); sm_100a spills 8 bytes in
        // the runs-of-4 kernels, and no sm_100 device has measured them.
        let sm90 = dev.props().compute_capability.0 == 9;
        launch_per_channel(
            dev,
            &plan,
            false,
            pipe.0,
            args,
            &align,
            (out, out_sf),
            |vec| {
                spec(
                    input,
                    params.round_sf,
                    vec,
                    pitch32,
                    pipe,
                    whole_runs(pipe, plan.k) && sm90,
                )
            },
        )
    }

    /// `per_channel_cast_fused` on the GPU: e4m3 data `(N_out, K)` and fp32 layout-A scales
    /// `(ceil(N_out/128), K)`; padding rows (`pos_to_token < 0`) are zeros.
    ///
    /// Errors: see [`per_channel_cast_fused_into`].
    pub fn per_channel_cast_fused(
        x: &DeviceFusedInput<'_>,
        pos_to_token: Option<&DeviceView<'_, i32>>,
        params: &PerChannelCastFusedParams,
    ) -> Result<(DeviceQuantData, DeviceScales)> {
        let (plan, _, _) = prepare(x, pos_to_token, params)?;
        let dev = device(x);
        let mut d = DeviceQuantData::alloc(dev, CastFormat::E4M3, plan.m, plan.k)?;
        let mut s = DeviceScales::alloc(dev, plan.sf_layout, plan.grid)?;
        per_channel_cast_fused_into(x, pos_to_token, params, &mut d.view_mut(), &mut s)?;
        Ok((d, s))
    }

    #[cfg(test)]
    mod tests {
        use super::{pipeline, whole_runs, PerChannelGrid};

        /// The e4m3 pipelines: staged runs of 2, runs of 4 with the register prefetch, staged
        /// runs of 4.
        const RUNS2: (PerChannelGrid, u32) = (PerChannelGrid::Runs(2), 2);
        const RUNS4: (PerChannelGrid, u32) = (PerChannelGrid::Runs(4), 0);
        const STAGED4: (PerChannelGrid, u32) = (PerChannelGrid::Runs(4), 4);

        /// Whole runs: staged pipelines whose run divides the column tiles only.
        #[test]
        fn whole_runs_by_pipeline_and_k() {
            for k in [256, 2048, 2560, 3072, 4096, 6144, 7168] {
                assert!(whole_runs(STAGED4, k) && whole_runs(RUNS2, k), "K = {k}");
                assert!(!whole_runs(RUNS4, k), "K = {k}");
                assert!(!whole_runs((PerChannelGrid::Tiles, 0), k), "K = {k}");
            }
            for k in [64, 128, 384, 640, 4224] {
                assert!(!whole_runs(STAGED4, k), "K = {k}");
            }
        }

        /// On the H200's 132 SMs (528 resident CTAs): plain e4m3 rows in runs of 2, staged,
        /// where those runs fill a wave (N = 4096: K >= 2112), else in runs of 4 with the
        /// register prefetch; gathered e4m3 rows in staged runs of 4; fp32 / bf16 per tile.
        #[test]
        fn pipeline_by_input_gather_and_grid() {
            for k in [2560, 3072, 4096, 6144, 7168] {
                assert_eq!(pipeline(2, false, 4096, k, 132), RUNS2, "K = {k}");
            }
            // 32 x 33 tiles: 528 runs of 2, one wave; 32 x 32: 512, under it.
            assert_eq!(pipeline(2, false, 4096, 2112, 132), RUNS2);
            assert_eq!(pipeline(2, false, 4096, 2048, 132), RUNS4);
            assert_eq!(pipeline(2, true, 128, 64, 132), STAGED4);
            assert_eq!(pipeline(2, true, 24704, 7168, 132), STAGED4);
            for input in [0, 1] {
                for gathered in [false, true] {
                    assert_eq!(
                        pipeline(input, gathered, 4096, 7168, 132),
                        (PerChannelGrid::Tiles, 0)
                    );
                }
            }
        }
    }
}

/// CPU models of the staged e4m3 pipeline of `cuda/per_channel_cast_fused.cu`
/// (`TK_PCF_STAGES`: `GatherSrc::issue` / `land` and `pc::tile_kernel`'s slot schedule).
#[cfg(test)]
mod staging_model {
    /// Rows, bytes (e4m3 columns) and threads of a tile.
    const TR: usize = 128;
    const TC: usize = 64;
    const THREADS: usize = 256;

    /// The slot row of tile row `4 rg + i` (row groups with `rg` odd swap each pair of rows).
    fn slot_row(rg: usize, i: usize) -> usize {
        4 * rg + (i ^ (rg % 2))
    }

    /// The copy map (thread `t`: row group `rg = t / 8`, lane `lx = t % 8` copies tile row
    /// `4 rg + lx / 2`, bytes `32 (lx % 2) .. + 32`, as two 16-byte chunks, and with `lx` even
    /// that row's scale) and the read map (thread `t` reads its 4 rows' 8 bytes at `8 lx` with
    /// one LDS.64 per row, and the 4 scales at `4 rg` with one LDS.128) agree: every slot byte
    /// and scale is written once, holds what its readers expect, and was copied by a lane of
    /// the reader's warp (so `wait_group` + `__syncwarp` suffice); the chunks are 16-byte
    /// aligned on both sides; each half warp's LDS.64 of a row hits 32 distinct banks.
    #[test]
    fn copy_and_read_maps() {
        // (row, byte) of the tile each slot byte holds, and the warp that copied it
        let mut slot = vec![None; TR * TC];
        let mut scale = vec![None; TR];
        for t in 0..THREADS {
            let (rg, lx, warp) = (t / 8, t % 8, t / 32);
            let ri = lx / 2;
            for h in 0..2 {
                let (col, a) = (
                    32 * (lx % 2) + 16 * h,
                    slot_row(rg, ri) * TC + 32 * (lx % 2) + 16 * h,
                );
                assert_eq!((col % 16, a % 16), (0, 0), "16-byte chunks");
                for u in 0..16 {
                    assert!(slot[a + u].is_none(), "slot byte {} written twice", a + u);
                    slot[a + u] = Some((4 * rg + ri, col + u, warp));
                }
            }
            if lx % 2 == 0 {
                assert!(scale[4 * rg + ri].is_none());
                scale[4 * rg + ri] = Some((4 * rg + ri, warp));
            }
        }
        assert!(slot.iter().all(Option::is_some) && scale.iter().all(Option::is_some));
        for t in 0..THREADS {
            let (rg, lx, warp) = (t / 8, t % 8, t / 32);
            for i in 0..4 {
                for b in 0..8 {
                    let a = slot_row(rg, i) * TC + 8 * lx + b;
                    assert_eq!(
                        slot[a],
                        Some((4 * rg + i, 8 * lx + b, warp)),
                        "thread {t} row {i} byte {b}"
                    );
                }
                assert_eq!(scale[4 * rg + i], Some((4 * rg + i, warp)));
            }
        }
        for warp in 0..8 {
            for i in 0..4 {
                for half in 0..2 {
                    let mut banks = [false; 32];
                    for lane in 16 * half..16 * half + 16 {
                        let t = 32 * warp + lane;
                        let a = slot_row(t / 8, i) * TC + 8 * (t % 8);
                        for bank in [a / 4 % 32, a / 4 % 32 + 1] {
                            assert!(
                                !banks[bank],
                                "warp {warp} row {i} half {half}: bank {bank} twice"
                            );
                            banks[bank] = true;
                        }
                    }
                }
            }
        }
    }

    /// `pc::tile_kernel`'s schedule with `S` slots for a CTA of `live` tiles (runs of 2 or 4,
    /// the last run possibly cut by the row tiles): S - 1 groups in the prologue (tiles 0 .. S - 2,
    /// empty past `live`), at tile n the group of tile n + S - 1 into slot (n + S - 1) % S,
    /// then `wait_group S - 1`. Tile n's group is complete when it is read, and a slot is
    /// overwritten only after the tile that held it was read at an earlier tile (whose two
    /// barriers order the reads before the copies).
    #[test]
    fn slot_schedule() {
        for s in 2..=4usize {
            for live in 1..=4usize {
                let mut groups: Vec<Option<usize>> = Vec::new(); // committed groups: the tile copied, if any
                let mut holder: Vec<Option<(usize, Option<usize>)>> = vec![None; s]; // slot: (tile, tile n that read it)
                let issue =
                    |k: usize,
                     n: Option<usize>,
                     groups: &mut Vec<Option<usize>>,
                     holder: &mut Vec<Option<(usize, Option<usize>)>>| {
                        if k < live {
                            if let Some((old, read)) = holder[k % s] {
                                let read = read.unwrap_or_else(|| {
                                    panic!("S={s}: tile {old} overwritten unread")
                                });
                                assert!(
                                    read < n.expect("prologue slots are fresh"),
                                    "S={s}: slot reused too early"
                                );
                            }
                            holder[k % s] = Some((k, None));
                            groups.push(Some(k));
                        } else {
                            groups.push(None);
                        }
                    };
                for k in 0..s - 1 {
                    issue(k, None, &mut groups, &mut holder);
                }
                for n in 0..live {
                    issue(n + s - 1, Some(n), &mut groups, &mut holder);
                    let complete = groups.len() - (s - 1); // wait_group S - 1
                    assert!(
                        groups[..complete].contains(&Some(n)),
                        "S={s} live={live}: tile {n} not landed"
                    );
                    let (tile, read) = holder[n % s].as_mut().unwrap();
                    assert_eq!((*tile, *read), (n, None));
                    *read = Some(n);
                }
            }
        }
    }
}
