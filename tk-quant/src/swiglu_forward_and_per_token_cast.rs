//! `swiglu_forward_and_per_token_cast` (`spec/quant.md` §3.10): the SwiGLU activation with an
//! optional clamp, an optional per-row routing weight and optional padding rows, fused with a
//! per-token cast.
//!
//! # What it computes
//!
//! Input `x` is `(N, 2H)` fp32/bf16: gate `l = x[i, j]`, value `v = x[i, H + j]`, `j < H`.
//! Row `i` is *processed* unless `pos_to_expert` is given and `pos_to_expert[i] < 0` (a padding
//! row). For each processed row and `j < H`:
//!
//! 1. clamp (if `swiglu_clamp_value = C`): `l = C` if `l > C`; `v` into `[−C, C]` (fp32
//!    comparisons, [`crate::swiglu`]);
//! 2. `a = fl(fl(l / fl(1 + expf(−l))) · v)`;
//! 3. with routing weights: `a = fl(a · w_i)`, `w_i = topk_weights.flat[pos_to_token_topk[i]]`,
//!    or `w_i = 0` when `pos_to_token_topk[i] < 0` (upstream's reference; see deviations);
//! 4. output, by [`SwigluOutFormat`]:
//!    * `F32`: `a` itself (the activation: what the GPU tests compare with a tolerance);
//!    * `BF16`: `bf16(a)` (RNE);
//!    * `E4M3` / `E2M1`: a per-token cast of the row in groups of `npc` columns (§1.4):
//!      `amax`, `c = max(amax, ε)` with `ε = sf_clamp_min` if given (else 1e-4 for e4m3,
//!      `6·2^-126` for e2m1), `(sf, inv)`, `enc(fl(a · inv))`; scales in layout A, B or C.
//!
//! Clamp counting (`count_clamped`, needs `C`): over the processed rows' elements, before the
//! clamp, `[#(l > C), #(v > C), #(v < −C)]` (upstream adds these into an int64 `(3,)` tensor).
//!
//! | argument | dtype | shape | notes |
//! |---|---|---|---|
//! | `x` | fp32 / bf16 | `(N, 2H)`, `H % 128 == 0` | unit column stride, any row stride |
//! | `pos_to_token_topk` | int32 | `(N,)` | with `topk_weights`; `p >= 0` selects `topk_weights.flat[p]`, `p < T·k` |
//! | `topk_weights` | fp32 | `(T, k)` | flattened row-major |
//! | `pos_to_expert` | int32 | `(N,)` | `< 0`: padding row |
//! | `out` | fp32 / bf16 / e4m3 / packed e2m1 | `(N, H)` / `(N, H/2)` | contiguous |
//! | `out_sf` | fp32 / packed UE8M0 | grid `(N, H/npc)` | quantized formats only; layout A, B or C |
//! | `clamped_count` | int64 | `(3,)` | when `count_clamped` |
//!
//! # Preconditions ([`validate`])
//!
//! * `x`: 2-D, `2H` columns with `H % 128 == 0` (so `H >= 128`); `N` may be 0.
//! * Quantized formats: `num_per_channels` ∈ {128, H}; `npc == H` forbids the column-major
//!   flag (so layouts B and C); the scale flags select a valid layout ([`ScaleOptions::layout`]);
//!   `sf_clamp_min`, if given, finite and `> 0`.
//! * Plain formats (`F32`, `BF16`): `sf_clamp_min` must be `None`; `num_per_channels` and
//!   `opts` are not used.
//! * `pos_to_token_topk` and `topk_weights` come together ([`TopkWeights`]); every entry
//!   `p >= 0` of `pos_to_token_topk` must be `< T·k`.
//! * `pos_to_expert`: `(N,)`.
//! * `count_clamped` needs `swiglu_clamp_value`; `swiglu_clamp_value` finite and `>= 0`
//!   ([`crate::swiglu::check_clamp_value`]).
//!
//! # Deviations from upstream (documented choices)
//!
//! * **Padding rows are defined**: rows with `pos_to_expert < 0` are written as zeros (+0.0,
//!   code 0x00) with a **zero scale** (+0.0, UE8M0 byte 0) in every format, and are not counted.
//!   Upstream leaves them uninitialised or writes garbage there (its tests mask them); the GPU
//!   kernels of this crate must write the same zeros.
//! * **Negative `pos_to_token_topk` with weights** uses `w = 0` (upstream's reference; its
//!   kernel reads an uninitialised register): the row becomes `fl(a · 0)` (±0, sign kept), cast
//!   with the all-zero scale `ε/Q`.
//! * **Output formats**: upstream supports e4m3 only; this crate adds e2m1 (same cast, `Q = 6`)
//!   and the plain fp32 / bf16 activation (no scales), the latter being what lets the GPU tests
//!   check the activation on its own.
//! * `x` may have any row stride (upstream: contiguous); index and weight tensors any strides.
//! * `count_clamped` is allowed with `npc == H` (upstream's tests never count there).
//! * NaN / inf inputs are unsupported (§5 item 6); the cast follows the GPU rules of
//!   [`reference::cast`](mod@crate::reference::cast).

use tk_core::{HostView, Result, TkError};

use crate::plan::{require_multiple, CastPlan};
use crate::scale::ScaleOptions;
use crate::swiglu::{check_clamp_value, check_rank2, check_vector};
use crate::types::{CastFormat, PlainInput};

/// The output format of [`swiglu_forward_and_per_token_cast`](fn@crate::reference::swiglu_forward_and_per_token_cast).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SwigluOutFormat {
    /// The fp32 activation (after the weight), no scales.
    F32,
    /// The activation rounded to bf16 (RNE), no scales.
    BF16,
    /// FP8 e4m3 with per-token scales (upstream's only format).
    E4M3,
    /// FP4 e2m1, packed two per byte, with per-token scales.
    E2M1,
}

impl SwigluOutFormat {
    /// The cast format of the quantized formats, `None` for fp32 / bf16.
    pub const fn cast_format(self) -> Option<CastFormat> {
        match self {
            SwigluOutFormat::E4M3 => Some(CastFormat::E4M3),
            SwigluOutFormat::E2M1 => Some(CastFormat::E2M1),
            SwigluOutFormat::F32 | SwigluOutFormat::BF16 => None,
        }
    }
}

/// The group widths besides `npc == H`.
pub const NUM_PER_CHANNELS: usize = 128;

/// The routing weight of each row: `pos_to_token_topk` `(N,)` int32 indexes the flattened
/// `topk_weights` `(T, k)` fp32; a negative entry means weight 0.
#[derive(Debug, Clone)]
pub struct TopkWeights<'a> {
    /// `(N,)` int32: `p >= 0` selects `topk_weights.flat[p]` (`p < T·k`).
    pub pos_to_token_topk: HostView<'a, i32>,
    /// `(T, k)` fp32, flattened row-major.
    pub topk_weights: HostView<'a, f32>,
}

impl TopkWeights<'_> {
    /// The weight of row `i` (after validation): `topk_weights.flat[p]`, or 0 for `p < 0`.
    pub fn weight(&self, i: usize) -> f32 {
        let p = self.pos_to_token_topk.at(&[i]);
        if p < 0 {
            return 0.0;
        }
        let k = self.topk_weights.shape()[1];
        let p = p as usize;
        self.topk_weights.at(&[p / k, p % k])
    }
}

/// The tensor arguments of the op.
#[derive(Debug, Clone)]
pub struct SwigluForwardInputs<'a> {
    /// `(N, 2H)` fp32 / bf16.
    pub x: PlainInput<'a>,
    /// Optional routing weights.
    pub topk: Option<TopkWeights<'a>>,
    /// Optional `(N,)` int32; rows with a negative entry are padding.
    pub pos_to_expert: Option<HostView<'a, i32>>,
}

impl<'a> SwigluForwardInputs<'a> {
    /// Just `x`: every row processed, no weights.
    pub fn new(x: impl Into<PlainInput<'a>>) -> Self {
        Self {
            x: x.into(),
            topk: None,
            pos_to_expert: None,
        }
    }

    /// True if row `i` is processed (not a padding row).
    pub fn is_processed(&self, i: usize) -> bool {
        is_processed(self.pos_to_expert.as_ref(), i)
    }
}

/// True unless `pos_to_expert[i] < 0`.
pub(crate) fn is_processed(pos_to_expert: Option<&HostView<'_, i32>>, i: usize) -> bool {
    pos_to_expert.is_none_or(|p| p.at(&[i]) >= 0)
}

/// The scalar parameters of the op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwigluForwardParams {
    /// Output format (upstream: e4m3 only).
    pub out_format: SwigluOutFormat,
    /// `npc`: 128 or `H` (quantized formats).
    pub num_per_channels: usize,
    /// Scale rounding and layout (quantized formats).
    pub opts: ScaleOptions,
    /// Optional clamp `C`.
    pub swiglu_clamp_value: Option<f32>,
    /// Return the clamp counts (upstream's `clamped_count` tensor); needs `swiglu_clamp_value`.
    pub count_clamped: bool,
    /// Optional replacement of the format's `ε` (quantized formats).
    pub sf_clamp_min: Option<f32>,
}

impl SwigluForwardParams {
    /// A quantized output: `fmt` with groups of `npc` and the given scale options; no clamp,
    /// no counting, the format's `ε`.
    pub const fn cast(fmt: CastFormat, num_per_channels: usize, opts: ScaleOptions) -> Self {
        let out_format = match fmt {
            CastFormat::E4M3 => SwigluOutFormat::E4M3,
            CastFormat::E2M1 => SwigluOutFormat::E2M1,
        };
        Self {
            out_format,
            num_per_channels,
            opts,
            swiglu_clamp_value: None,
            count_clamped: false,
            sf_clamp_min: None,
        }
    }

    /// A plain output (`F32` or `BF16`; a quantized format gets `npc = 128`, layout A).
    pub const fn plain(out_format: SwigluOutFormat) -> Self {
        Self {
            out_format,
            num_per_channels: NUM_PER_CHANNELS,
            opts: ScaleOptions::row_major(false),
            swiglu_clamp_value: None,
            count_clamped: false,
            sf_clamp_min: None,
        }
    }

    /// With the clamp `C`.
    pub const fn with_clamp(mut self, c: f32) -> Self {
        self.swiglu_clamp_value = Some(c);
        self
    }
}

/// The validated geometry of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwigluForwardPlan {
    /// Rows `N`.
    pub n: usize,
    /// Output width `H` (the input has `2H` columns).
    pub h: usize,
    /// The cast of the `(N, H)` activation: block `(1, npc)` and its scale layout; `None` for
    /// the plain formats.
    pub cast: Option<CastPlan>,
}

/// Validates a call (see the [module docs](self) for every rule).
///
/// Errors, naming the argument: `x` ([`TkError::Shape`]: rank, `2H` not a multiple of 256;
/// [`TkError::Stride`]; [`TkError::Empty`]), `pos_to_token_topk` / `pos_to_expert`
/// ([`TkError::Shape`]: not `(N,)`; [`TkError::Param`]: an index `>= T·k`), `topk_weights`
/// ([`TkError::Shape`]: not 2-D), `num_per_channels`, `use_tma_aligned_col_major_sf`,
/// `use_packed_ue8m0`, `sf_clamp_min`, `swiglu_clamp_value`, `count_clamped`
/// ([`TkError::Param`]).
pub fn validate(
    inputs: &SwigluForwardInputs<'_>,
    params: &SwigluForwardParams,
) -> Result<SwigluForwardPlan> {
    let (n, two_h) = inputs.x.validate("x")?;
    if let Some(tw) = &inputs.topk {
        check_vector("pos_to_token_topk", &tw.pos_to_token_topk, n)?;
        let (t, k) = check_rank2("topk_weights", &tw.topk_weights, "(T, k) fp32")?;
        check_topk_indices("pos_to_token_topk", &tw.pos_to_token_topk, t * k)?;
    }
    if let Some(p) = &inputs.pos_to_expert {
        check_vector("pos_to_expert", p, n)?;
    }
    validate_dims(n, two_h, params)
}

/// Checks that every entry `p >= 0` of the `(N,)` vector `idx` is below `len`.
pub(crate) fn check_topk_indices(
    arg: &'static str,
    idx: &HostView<'_, i32>,
    len: usize,
) -> Result<()> {
    let n = idx.shape()[0];
    for i in 0..n {
        let p = idx.at(&[i]);
        if p >= 0 && p as usize >= len {
            return Err(TkError::param(
                arg,
                format!("entry {i} is {p}, out of range for T·k = {len} weights"),
            ));
        }
    }
    Ok(())
}

/// The device-independent part of [`validate`], on `N` and the input width `2H`.
pub fn validate_dims(
    n: usize,
    two_h: usize,
    params: &SwigluForwardParams,
) -> Result<SwigluForwardPlan> {
    require_multiple(
        "x",
        &[n, two_h],
        "2H",
        two_h,
        256,
        "the SwiGLU input is gate | value, each H wide with H % 128 == 0",
    )?;
    let h = two_h / 2;
    check_clamp_value(params.swiglu_clamp_value)?;
    if params.count_clamped && params.swiglu_clamp_value.is_none() {
        return Err(TkError::param(
            "count_clamped",
            "counting clamped elements needs swiglu_clamp_value",
        ));
    }
    if params.out_format.cast_format().is_none() {
        if params.sf_clamp_min.is_some() {
            return Err(TkError::param(
                "sf_clamp_min",
                "a plain (fp32 / bf16) output has no scales: sf_clamp_min must be None",
            ));
        }
        return Ok(SwigluForwardPlan { n, h, cast: None });
    }
    let layout = params.opts.layout()?;
    let npc = params.num_per_channels;
    if npc != NUM_PER_CHANNELS && npc != h {
        return Err(TkError::param(
            "num_per_channels",
            format!("must be 128 or H = {h}, got {npc}"),
        ));
    }
    if npc == h && params.opts.use_tma_aligned_col_major_sf {
        return Err(TkError::param(
            "use_tma_aligned_col_major_sf",
            format!(
                "npc == H = {h} (one scale per row) supports row-major fp32 scales only \
                 (layout A), as upstream asserts"
            ),
        ));
    }
    if let Some(eps) = params.sf_clamp_min {
        if !(eps.is_finite() && eps > 0.0) {
            return Err(TkError::param(
                "sf_clamp_min",
                format!("must be finite and > 0 (it replaces the amax clamp ε), got {eps}"),
            ));
        }
    }
    Ok(SwigluForwardPlan {
        n,
        h,
        cast: Some(CastPlan::new_arg(
            n,
            h,
            (1, npc),
            layout,
            "num_per_channels",
        )?),
    })
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU op (feature `cuda`): `cuda/swiglu_forward_and_per_token_cast.cu`, bit-exact with
/// [`reference::swiglu_forward_and_per_token_cast_with_expf`](fn@crate::reference::swiglu_forward_and_per_token_cast_with_expf)
/// given CUDA's `expf` (see [`crate::swiglu`]).
///
/// Kernel: groups of 128 columns (and the plain formats) use a tiled kernel, a CTA of 32 teams
/// of 8 lanes, each lane 16 columns of one row (bf16 input; fp32: 16 teams of 16 lanes, 8
/// columns per lane; 16-byte loads of gate and value, the group's amax by 3 or 4 warp
/// shuffles), 4 column tiles per CTA with the row's routing loaded once, at most 64
/// registers; `npc == H` uses
/// one CTA per row, the row's activations held in registers between the amax and the cast.
/// The division runs inline when a fragment's gates allow (the exact fast path of CUDA's
/// division, see `cuda/fused_io.cuh`). No host synchronisation.
///
/// Device-side differences from [`validate`]: index *values* cannot be checked without a host
/// synchronisation, so a `pos_to_token_topk` entry `>= T·k` (rejected on the CPU) reads no
/// memory and gives weight 0, like a negative one.
#[cfg(feature = "cuda")]
mod gpu {
    use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
    use half::bf16;
    use tk_core::error::DriverContext;
    use tk_core::{
        Device, DeviceTensor, DeviceView, DeviceViewMut, KernelSource, KernelSpec, Result, TkError,
    };

    use super::{validate_dims, SwigluForwardParams, SwigluForwardPlan, SwigluOutFormat};
    use crate::cast::{check_out_scales, check_same_device};
    use crate::device::{
        check_contiguous, DevicePlainInput, DeviceQuantData, DeviceQuantDataViewMut, DeviceScales,
    };
    use crate::scale::ScaleLayout;
    use crate::swiglu::{all_aligned16, check_device_rank2, check_device_vector};
    use crate::types::CastFormat;

    static SOURCE: KernelSource = KernelSource {
        file: "swiglu_forward_and_per_token_cast.cu",
        entry: "tk_swiglu_forward_and_per_token_cast",
        code: include_str!("../cuda/swiglu_forward_and_per_token_cast.cu"),
        headers: &[
            (
                "tk/quant_scale.cuh",
                include_str!("../cuda/quant_scale.cuh"),
            ),
            ("tk/fused_io.cuh", include_str!("../cuda/fused_io.cuh")),
        ],
        needs_cuda_headers: true,
    };

    /// The device routing weights: [`super::TopkWeights`] on the GPU.
    #[derive(Debug, Clone)]
    pub struct DeviceTopkWeights<'a> {
        /// `(N,)` int32: `p >= 0` selects `topk_weights.flat[p]`; negative (or `>= T·k`):
        /// weight 0.
        pub pos_to_token_topk: DeviceView<'a, i32>,
        /// `(T, k)` fp32, any strides.
        pub topk_weights: DeviceView<'a, f32>,
    }

    /// The tensor arguments of the GPU op ([`super::SwigluForwardInputs`] on the device).
    #[derive(Debug, Clone)]
    pub struct DeviceSwigluForwardInputs<'a> {
        /// `(N, 2H)` fp32 / bf16, unit column stride, any row stride.
        pub x: DevicePlainInput<'a>,
        /// Optional routing weights.
        pub topk: Option<DeviceTopkWeights<'a>>,
        /// Optional `(N,)` int32; rows with a negative entry are padding (zeros, zero scale).
        pub pos_to_expert: Option<DeviceView<'a, i32>>,
    }

    impl<'a> DeviceSwigluForwardInputs<'a> {
        /// Just `x`: every row processed, no weights.
        pub fn new(x: impl Into<DevicePlainInput<'a>>) -> Self {
            Self {
                x: x.into(),
                topk: None,
                pos_to_expert: None,
            }
        }
    }

    /// The output data of the GPU op, by format.
    #[derive(Debug)]
    pub enum DeviceSwigluOut {
        /// `F32`: the activation `(N, H)`.
        F32(DeviceTensor<f32>),
        /// `BF16`: `(N, H)`.
        BF16(DeviceTensor<bf16>),
        /// `E4M3` / `E2M1`: data `(N, H)` / `(N, H/2)` and scales of grid `(N, H/npc)`.
        Quantized(DeviceQuantData, DeviceScales),
    }

    /// Where [`swiglu_forward_and_per_token_cast_into`] writes, by format.
    #[derive(Debug)]
    pub enum DeviceSwigluOutMut<'a> {
        /// `F32`: contiguous fp32 `(N, H)`.
        F32(DeviceViewMut<'a, f32>),
        /// `BF16`: contiguous bf16 `(N, H)`.
        BF16(DeviceViewMut<'a, bf16>),
        /// `E4M3` / `E2M1`: contiguous data and scales of the planned layout and grid.
        Quantized(DeviceQuantDataViewMut<'a>, &'a mut DeviceScales),
    }

    /// What the allocating GPU op returns.
    #[derive(Debug)]
    pub struct DeviceSwigluForwardOutput {
        /// The data (and scales).
        pub out: DeviceSwigluOut,
        /// int64 `(3,)` `[#(l > C), #(v > C), #(v < −C)]` when `count_clamped`.
        pub clamped_count: Option<DeviceTensor<i64>>,
    }

    /// The kernel arguments, field for field `Params` in the kernel.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    struct FwdArgs {
        x: u64,
        ldx: u64,
        ptt: u64,
        ptt_s: u64,
        tw: u64,
        tw_s0: u64,
        tw_s1: u64,
        tw_k: u64,
        tw_len: u64,
        pte: u64,
        pte_s: u64,
        out: u64,
        sf: u64,
        count: u64,
        n: u64,
        h: u64,
        nbk: u64,
        ra: u64,
        nbig: u64,
        clamp: f32,
        eps: f32,
    }

    // SAFETY: `FwdArgs` is `repr(C)` plain old data (19 × u64 then 2 × 4 bytes, no padding),
    // laid out exactly as the kernel's `Params`, which the kernel receives by value.
    unsafe impl DeviceRepr for FwdArgs {}

    /// One specialisation of the kernel.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub(crate) struct FwdKernel {
        /// bf16 (else fp32) input.
        pub bf16_in: bool,
        pub out: SwigluOutFormat,
        /// Scale layout and rounding (quantized formats).
        pub sf: Option<(ScaleLayout, bool)>,
        pub vecio: bool,
        /// The clamp: 0 none, 1 clamp, 2 clamp and count, 3 / 4 clamp by min / max in fp32 / on bf16
        /// pairs ([`clamp_code`]).
        pub clamp: u8,
        /// Routing weights given (`TK_W`; selects the tiled path's shape for fp32 output). Kernels
        /// without them are compiled without the weight code (no `pos_to_token_topk` /
        /// `topk_weights` loads, no `· 1.0` per element; measured 1.007x geomean, e4m3 rows
        /// 1.011-1.020x, meas31).
        pub weights: bool,
        /// `pos_to_expert` given: the tiled path does not load the padding rows' `x`
        /// (`TK_SKIPPAD`; their output is zeros whatever `x` holds; K=2 256/EP8 N=8256 has ~3 %
        /// of them). It costs the wait for a row tile's `pos_to_expert` entries before its
        /// first loads and ~13 SASS instructions per tile at the 48-register cap (sm_90a, bf16
        /// -> e4m3 layout C: 507 -> 520), so only these kernels get it. Measured (meas m4,
        /// H200, session 8: the build without the balanced grid, tried and removed): K=6
        /// H=3584 N=24240 with `pos_to_expert` 113.4 vs 121.3 µs on main (no clamp) and 117.9
        /// vs 124.4 µs (clamp 0.5), the same shapes without `pos_to_expert` (no skipping)
        /// 119.4 µs; with the balanced grid, skipping off was 1.037x slower in the mean.
        pub pte: bool,
        /// Whole-row path: `(threads, fragments per thread)`.
        pub whole_row: Option<(usize, usize)>,
        /// Column tiles of 128 columns per row (`H / 128`; selects the tiled path's run length).
        pub tiles: usize,
        /// Tiled path: the grid's partial last wave cut into single-tile CTAs (`TK_TAIL` 1, a
        /// 1-D grid, chosen per launch by [`tiled_grid`]); `false`, the 2-D grid of runs.
        pub tail: bool,
    }

    /// The tiled path's shape: rows per team (`TK_RPT`), fragments per lane (`TK_FPL`) and
    /// column tiles of 128 columns per CTA (`TK_CT`). A lane's routing entries, weights and
    /// index arithmetic are computed once per CTA row tile for `col_tiles` tiles.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct TiledShape {
        rpt: usize,
        fpl: usize,
        col_tiles: usize,
    }

    impl TiledShape {
        /// The tiled path's rows per CTA tile: `256 / (16 / fpl) * rpt`.
        fn tile_rows(&self) -> usize {
            16 * self.fpl * self.rpt
        }
    }

    impl FwdKernel {
        /// Measured on the H200 (tk-quant PERF.md): 16 columns of one row per lane (teams of 8)
        /// for bf16 input and 8 columns of one row (teams of 16) for fp32, 4 column tiles per
        /// CTA: e4m3 / bf16 outputs 10-34 % faster than one tile per CTA with 8 columns of two
        /// rows. fp32 output without weights keeps the earlier shape (1 tile per CTA, bf16: 8
        /// columns of 2 rows), which measured 24 % faster there (171 vs 212 µs at K=6 H=3584).
        fn tiled(&self) -> TiledShape {
            if self.out == SwigluOutFormat::F32 && !self.weights {
                let rpt = if self.bf16_in { 2 } else { 1 };
                TiledShape {
                    rpt,
                    fpl: 1,
                    col_tiles: 1,
                }
            } else {
                let fpl = if self.bf16_in { 2 } else { 1 };
                // Runs of 4 tiles, or of 5 where 5 divides the row and 4 does not (H = 1280:
                // 5 + 5 instead of 4 + 4 + 2).
                let col_tiles = if self.tiles % 4 != 0 && self.tiles % 5 == 0 {
                    5
                } else {
                    4
                };
                TiledShape {
                    rpt: 1,
                    fpl,
                    col_tiles,
                }
            }
        }

        /// `TK_MINB` of the tiled path: [`FWD_QUANT_MIN_BLOCKS`] / [`FWD_PLAIN_MIN_BLOCKS`],
        /// but 4 for the select clamp without counting (`TK_CLAMP` 1: only `C = -0.0`, see
        /// [`clamp_code`]), whose H = 1280 layout-C kernel spills 8 bytes at 48 registers on
        /// sm_100a.
        fn min_blocks(&self) -> usize {
            if self.clamp == 1 {
                4
            } else if self.sf.is_some() {
                FWD_QUANT_MIN_BLOCKS
            } else {
                FWD_PLAIN_MIN_BLOCKS
            }
        }

        pub(crate) fn spec(&self) -> KernelSpec {
            let out = match self.out {
                SwigluOutFormat::F32 => 0,
                SwigluOutFormat::BF16 => 1,
                SwigluOutFormat::E4M3 => 2,
                SwigluOutFormat::E2M1 => 3,
            };
            let s = KernelSpec::new(&SOURCE)
                .define("TK_IN", self.bf16_in as u8)
                .define("TK_OUT", out)
                .define("TK_VECIO", self.vecio as u8)
                .define("TK_CLAMP", self.clamp)
                .define("TK_W", self.weights as u8);
            let s = match self.sf {
                Some((layout, round)) => s
                    .define("TK_SF_OUT", layout_code(layout))
                    .define("TK_ROUND", round as u8),
                None => s,
            };
            match self.whole_row {
                Some((threads, nf)) => s.define("TK_THREADS", threads).define("TK_NF", nf),
                None => {
                    let t = self.tiled();
                    // fp32 output: a lane's columns are quads of 4 spaced by the team width, so
                    // each load and store instruction of a team covers whole 32-byte sectors
                    // (16-byte stores side by side) instead of half of every sector (ncu on the
                    // H200: 50 % excessive sectors, L1 hit 57 %). Measured 1.026x geomean, fp32
                    // with routing weights 1.324x (meas31). Tried for bf16 output too (8-byte
                    // accesses): 0.996x, removed.
                    let q4 = self.out == SwigluOutFormat::F32;
                    // Layout C with runs of 4 column tiles and `H / 128` a multiple of 4: a run's
                    // 4 scale bytes of a row are stored as one int32 after the run instead of one
                    // byte per tile (measured 1.027x, meas31).
                    let pack_c = matches!(self.sf, Some((ScaleLayout::PackedUe8m0, _)))
                        && t.col_tiles == 4
                        && self.tiles % 4 == 0;
                    s.define("TK_RPT", t.rpt)
                        .define("TK_FPL", t.fpl)
                        .define("TK_MINB", self.min_blocks())
                        .define("TK_CT", t.col_tiles)
                        .define("TK_Q4", q4 as u8)
                        .define("TK_PACKC", pack_c as u8)
                        .define("TK_SKIPPAD", self.pte as u8)
                        .define("TK_TAIL", self.tail as u8)
                }
            }
        }
    }

    /// The tiled path's grid. Without `pos_to_expert` the run CTAs (a run: `TK_CT` column
    /// tiles of one row tile) go in near-lockstep waves of `SMs × 5` and a partial last wave
    /// costs a whole one (meas32: ceil(waves) × ~13.6 µs): K=6 H=3584 N=24240 is 8 waves of 660
    /// runs + 26, whose 104 single tiles take a quarter-round. Where the rule below cuts, the
    /// launch is a 1-D grid of the whole waves' runs followed by the cut runs' single tiles
    /// (`TK_TAIL` 1); elsewhere the 2-D grid (runs × row tiles) of the `TK_TAIL` 0 kernel,
    /// which measured 1-3 % faster than the 1-D kernel without a cut (D3). Measured (D3, H200,
    /// 2 interleaved rounds, CUPTI medians, cut vs 2-D grid): K=6 e4m3 npc=128 C clamp=None
    /// 118.73 → 112.47 µs (+5.6 %), clamp=0.5 121.54 → 117.34 (+3.6 %), weights 124.28 → 119.00
    /// (+4.4 %), bf16 clamp=0.5 132.56 → 126.91 (+4.5 %), fp32 weights +0.6 %.
    ///
    /// `(run CTAs, grid x)` of the 1-D grid for `runs` runs of `ct` tiles
    /// (`tiles` per row, `row_tiles` row tiles) and `slots` resident CTAs; `pte`:
    /// `pos_to_expert` given (`TK_SKIPPAD`). The last partial wave's `r` runs become single
    /// tiles only without `pos_to_expert` and when `r <= slots / 16` (K=6 H=3584 N=24240: 26
    /// of 660, 3.9 %: cut); otherwise every CTA is a run. Why (D2, H200, first rule cutting
    /// whenever `ceil(ct r / slots) < ct`): with `pos_to_expert` the padding rows' tiles
    /// finish early and the waves are not lockstep, so the partial wave is not paid in full
    /// and the cut only adds CTAs (K=6 pte clamp=None 111.22 → 112.11 µs, clamp=0.5 114.50 →
    /// 116.78: −0.8 / −2.0 %); a large remainder's single tiles take longer than its runs
    /// (K=2 H=3584 N=8256, 486 runs left: −1.8 / −2.9 %, with `pos_to_expert` −0.8 / −2.8 %;
    /// K=8 H=2048 N=32128, 56 runs = 8.5 %: −2.2 %, −1.3 % with it; K=8 H=3584, 428 runs:
    /// −2.9 %, −2.4 % with it). A run past the row's end
    /// (`tiles % ct != 0`) keeps its `ct` single-tile CTAs, the surplus ones returning at once.
    fn tiled_grid(
        tiles: usize,
        ct: usize,
        row_tiles: usize,
        slots: usize,
        pte: bool,
    ) -> (usize, usize) {
        let runs = tiles.div_ceil(ct) * row_tiles;
        let r = runs % slots.max(1);
        let cut = if !pte && ct > 1 && 16 * r <= slots {
            r
        } else {
            0
        };
        (runs - cut, runs - cut + ct * cut)
    }

    /// CTAs per SM the tiled kernels are compiled for (`__launch_bounds__(256, TK_MINB)`), for
    /// quantized and plain outputs: 5 caps them at 48 registers, 40 warps per SM (sm_90a: no
    /// spills in any specialisation, the hot loop's instruction count within 2 of the
    /// 64-register build); measured 1.027x faster (geomean, meas31) than 4 (64 registers, 32
    /// warps; main `219ed73`). 6 (40 registers) spills 4-30 bytes.
    const FWD_QUANT_MIN_BLOCKS: usize = 5;
    const FWD_PLAIN_MIN_BLOCKS: usize = 5;

    /// The kernel's `TK_CLAMP` for clamp `c`, counting and bf16 input. Without counting, every
    /// `C` but `−0.0` clamps by `min.NaN(l, C)`, `min.NaN(max.NaN(v, −C), C)` (3: 3
    /// instructions per pair instead of ~5 compares and selects; measured 1.029x geomean, up to
    /// 1.101x, meas31), and with bf16 input and `C` exact in bf16 on the raw bf16 pairs before
    /// widening (4: 1.5 instead of 3 instructions per element; 1.010x, up to 1.038x). `C =
    /// −0.0` keeps the compares and selects (1): min / max order the zeros differently from the
    /// spec's comparisons there.
    fn clamp_code(c: Option<f32>, count: bool, bf16_in: bool) -> u8 {
        match (c, count) {
            (None, _) => 0,
            (Some(_), true) => 2,
            (Some(c), false) if c.is_sign_positive() => {
                if bf16_in && crate::swiglu::is_bf16_value(c) {
                    4
                } else {
                    3
                }
            }
            (Some(_), false) => 1,
        }
    }

    /// The kernels' code of a scale layout (A 0, B 1, C 2).
    pub(crate) fn layout_code(layout: ScaleLayout) -> u8 {
        match layout {
            ScaleLayout::RowMajorF32 => 0,
            ScaleLayout::ColMajorF32 => 1,
            ScaleLayout::PackedUe8m0 => 2,
        }
    }

    /// Whole-row geometry for `h` columns in fragments of 8: `(threads, fragments per
    /// thread)`, at most 8 fragments per thread (so `H <= 65536`).
    fn whole_row_shape(h: usize) -> Result<(usize, usize)> {
        let frags = h / 8;
        let threads = frags.div_ceil(4).next_power_of_two().clamp(32, 1024);
        let nf = frags.div_ceil(threads);
        if nf > 8 {
            return Err(TkError::param(
                "num_per_channels",
                format!(
                    "one scale per row of H = {h} columns exceeds the GPU kernel's limit of \
                     65536 columns; use num_per_channels = 128"
                ),
            ));
        }
        Ok((threads, nf))
    }

    /// The specialisations the tests and benchmarks launch: bf16 and fp32 input to every
    /// format, groups of 128 in layouts A and C, and a whole-row cast, each without the clamp
    /// and with both clamp forms (selects, min / max), without routing weights and (no clamp)
    /// with them; the counting clamp for bf16 to e4m3 in layout C.
    pub(crate) fn registered_kernels() -> Vec<KernelSpec> {
        let mut v = Vec::new();
        let mut push_tiles =
            |bf16_in, out, sf: Option<_>, clamp, whole_row: Option<_>, weights, tiles| {
                // With pos_to_expert too: every tiled kernel (TK_SKIPPAD).
                let ptes: &[bool] = if whole_row.is_none() {
                    &[false, true]
                } else {
                    &[false]
                };
                for &pte in ptes {
                    let k = FwdKernel {
                        bf16_in,
                        out,
                        sf,
                        vecio: true,
                        clamp,
                        weights,
                        pte,
                        whole_row,
                        tiles,
                        tail: false,
                    };
                    v.push(k.spec());
                    // The cut last wave (tiled_grid): runs of several tiles, no pos_to_expert.
                    if whole_row.is_none() && !pte && k.tiled().col_tiles > 1 {
                        v.push(FwdKernel { tail: true, ..k }.spec());
                    }
                }
            };
        // Runs of 5 column tiles (H = 1280): bf16 to e4m3 in layouts A and C.
        for clamp in [0, 1, 3, 4] {
            for sf in [
                (ScaleLayout::RowMajorF32, true),
                (ScaleLayout::PackedUe8m0, true),
            ] {
                push_tiles(
                    true,
                    SwigluOutFormat::E4M3,
                    Some(sf),
                    clamp,
                    None,
                    false,
                    10,
                );
            }
        }
        let mut push = |bf16_in, out, sf, clamp, whole_row, weights| {
            push_tiles(bf16_in, out, sf, clamp, whole_row, weights, 56)
        };
        for bf16_in in [true, false] {
            let clamps: &[u8] = if bf16_in { &[0, 1, 3, 4] } else { &[0, 1, 3] };
            for &clamp in clamps {
                // fp32 output: both tiled shapes.
                for weights in [false, true] {
                    push(bf16_in, SwigluOutFormat::F32, None, clamp, None, weights);
                }
                // Routing weights (TK_W 1) without the clamp, as upstream's benchmark.
                let ws: &[bool] = if clamp == 0 { &[false, true] } else { &[false] };
                for &weights in ws {
                    push(bf16_in, SwigluOutFormat::BF16, None, clamp, None, weights);
                    for out in [SwigluOutFormat::E4M3, SwigluOutFormat::E2M1] {
                        for sf in [
                            (ScaleLayout::RowMajorF32, true),
                            (ScaleLayout::PackedUe8m0, true),
                        ] {
                            push(bf16_in, out, Some(sf), clamp, None, weights);
                        }
                        let sf = Some((ScaleLayout::RowMajorF32, true));
                        push(bf16_in, out, sf, clamp, Some((256, 2)), weights);
                    }
                }
            }
        }
        let sf = Some((ScaleLayout::PackedUe8m0, true));
        push(true, SwigluOutFormat::E4M3, sf, 2, None, false);
        v
    }

    /// Validates the device inputs as [`super::validate`] does (shapes; index values are not
    /// read, see the module docs) and returns the plan and the kernel arguments for them.
    fn prepare(
        inputs: &DeviceSwigluForwardInputs<'_>,
        params: &SwigluForwardParams,
    ) -> Result<(SwigluForwardPlan, FwdArgs)> {
        let dev = inputs.x.device();
        let (n, two_h) = inputs.x.validate("x")?;
        let plan = validate_dims(n, two_h, params)?;
        let mut a = FwdArgs {
            x: inputs.x.address(),
            ldx: inputs.x.layout().strides()[0] as u64,
            n: n as u64,
            h: plan.h as u64,
            ..FwdArgs::default()
        };
        if let Some(tw) = &inputs.topk {
            a.ptt_s = check_device_vector("pos_to_token_topk", &tw.pos_to_token_topk, n, dev)?;
            let ((t, k), (s0, s1)) =
                check_device_rank2("topk_weights", &tw.topk_weights, "(T, k) fp32", dev)?;
            a.ptt = tw.pos_to_token_topk.address();
            (a.tw, a.tw_s0, a.tw_s1) = (tw.topk_weights.address(), s0, s1);
            (a.tw_k, a.tw_len) = (k.max(1) as u64, (t * k) as u64);
        }
        if let Some(p) = &inputs.pos_to_expert {
            a.pte_s = check_device_vector("pos_to_expert", p, n, dev)?;
            a.pte = p.address();
        }
        if let Some(c) = params.swiglu_clamp_value {
            a.clamp = c;
        }
        if let Some(cast) = &plan.cast {
            let fmt = cast_format(params.out_format);
            a.eps = params.sf_clamp_min.unwrap_or(match fmt {
                CastFormat::E4M3 => f32::from_bits(0x38D1_B717),
                CastFormat::E2M1 => f32::from_bits(0x01C0_0000),
            });
            a.nbk = cast.grid.nbk() as u64;
            a.ra = cast.grid.rows_aligned() as u64;
        }
        Ok((plan, a))
    }

    fn cast_format(f: SwigluOutFormat) -> CastFormat {
        f.cast_format()
            .expect("a cast plan exists for quantized formats only")
    }

    /// `swiglu_forward_and_per_token_cast` on the GPU into caller-provided outputs: `out` in
    /// `params.out_format` (contiguous `(N, H)`, or `(N, H/2)` for e2m1, with scales of the
    /// planned layout and grid `(N, H/npc)`), and, when `params.count_clamped`, the int64
    /// `(3,)` counter `clamped_count`, **to which the counts are added** (upstream's
    /// semantics; zero it first for fresh counts).
    ///
    /// Errors: those of [`super::validate`] on the shapes, `out` / `out_sf` (format, shape,
    /// contiguity, scale layout and grid), `clamped_count` (missing, or not int64 `(3,)`
    /// contiguous), and [`TkError::Placement`] for tensors on another device.
    pub fn swiglu_forward_and_per_token_cast_into(
        inputs: &DeviceSwigluForwardInputs<'_>,
        params: &SwigluForwardParams,
        out: &mut DeviceSwigluOutMut<'_>,
        clamped_count: Option<&mut DeviceViewMut<'_, i64>>,
    ) -> Result<()> {
        let dev = inputs.x.device();
        let (plan, mut a) = prepare(inputs, params)?;
        let (n, h) = (plan.n, plan.h);
        let fmt_err = || {
            TkError::param(
                "out",
                format!(
                    "the output does not match out_format = {:?}",
                    params.out_format
                ),
            )
        };
        match (params.out_format, &mut *out) {
            (SwigluOutFormat::F32, DeviceSwigluOutMut::F32(o)) => {
                check_contiguous("out", o.layout(), &[n, h])?;
                check_same_device("out", dev, o.device())?;
                a.out = o.address();
            }
            (SwigluOutFormat::BF16, DeviceSwigluOutMut::BF16(o)) => {
                check_contiguous("out", o.layout(), &[n, h])?;
                check_same_device("out", dev, o.device())?;
                a.out = o.address();
            }
            (
                f @ (SwigluOutFormat::E4M3 | SwigluOutFormat::E2M1),
                DeviceSwigluOutMut::Quantized(d, s),
            ) => {
                let cast = plan.cast.as_ref().ok_or_else(fmt_err)?;
                d.check_output("out", cast_format(f), n, h)?;
                check_same_device("out", dev, d.device())?;
                check_out_scales(s, cast)?;
                check_same_device("out_sf", dev, s.device())?;
                a.out = d.address();
                a.sf = s.address();
            }
            _ => return Err(fmt_err()),
        }
        match (params.count_clamped, clamped_count) {
            (false, _) => {}
            (true, None) => {
                return Err(TkError::param(
                    "clamped_count",
                    "count_clamped is set: pass an int64 (3,) counter",
                ))
            }
            (true, Some(c)) => {
                check_contiguous("clamped_count", c.layout(), &[3])?;
                check_same_device("clamped_count", dev, c.device())?;
                a.count = c.address();
            }
        }
        let in_bytes = if matches!(inputs.x, DevicePlainInput::BF16(_)) {
            2
        } else {
            4
        };
        let vecio = all_aligned16(&[a.x, a.ldx * in_bytes, a.out]);
        let quant = plan
            .cast
            .as_ref()
            .map(|c| (c.sf_layout, params.opts.round_sf));
        let npc = plan.cast.map_or(0, |c| c.block.1);
        let mut kernel = FwdKernel {
            bf16_in: in_bytes == 2,
            out: params.out_format,
            sf: quant,
            vecio,
            clamp: clamp_code(
                params.swiglu_clamp_value,
                params.count_clamped,
                in_bytes == 2,
            ),
            weights: inputs.topk.is_some(),
            pte: inputs.pos_to_expert.is_some(),
            whole_row: if quant.is_some() && npc == h && h > 128 {
                Some(whole_row_shape(h)?)
            } else {
                None
            },
            tiles: h / 128,
            tail: false,
        };
        if n == 0 {
            return Ok(());
        }
        let mut f = dev.function(&kernel.spec())?;
        let cfg = match kernel.whole_row {
            Some((threads, _)) => LaunchConfig {
                grid_dim: (n.min(i32::MAX as usize) as u32, 1, 1),
                block_dim: (threads as u32, 1, 1),
                shared_mem_bytes: 0,
            },
            None => {
                let t = kernel.tiled();
                let row_tiles = n.div_ceil(t.tile_rows());
                // The cut needs the resident CTAs; the TK_TAIL 1 kernel has the same
                // `__launch_bounds__` and so the same occupancy as this TK_TAIL 0 one.
                let (nbig, grid) = if kernel.pte || t.col_tiles == 1 {
                    (0, 0)
                } else {
                    let slots = dev.resident_blocks(&f, 256)?;
                    tiled_grid(h / 128, t.col_tiles, row_tiles, slots, kernel.pte)
                };
                if grid > nbig {
                    kernel.tail = true;
                    f = dev.function(&kernel.spec())?;
                    a.nbig = nbig as u64;
                    // Fewer than 2^31 CTAs: every tile is at least 16 rows x 128 columns
                    // (>= 9 KiB of x and out).
                    LaunchConfig {
                        grid_dim: (grid as u32, 1, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    }
                } else {
                    LaunchConfig {
                        grid_dim: (
                            (h / 128).div_ceil(t.col_tiles) as u32,
                            row_tiles.min(65535) as u32,
                            1,
                        ),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    }
                }
            }
        };
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&a);
        // SAFETY: x was validated as (N, 2H) with unit column stride and the row stride passed;
        // the index vectors as (N,) and topk_weights as (T, k) with their strides (entries are
        // bounds-checked in the kernel: only 0 <= p < T·k is read); every output was checked
        // contiguous with the exact shape (scales: layout and grid, the kernel writing inside
        // storage_len), the counter as (3,) int64; all on x's device. Vector accesses are used
        // only when every row start is 16-byte aligned. Buffers outlive the launch.
        unsafe { l.launch(cfg) }.ctx("launching tk_swiglu_forward_and_per_token_cast")?;
        Ok(())
    }

    /// `swiglu_forward_and_per_token_cast` on the GPU, allocating the outputs (the clamp
    /// counter starts from zero).
    ///
    /// Errors: see [`swiglu_forward_and_per_token_cast_into`].
    pub fn swiglu_forward_and_per_token_cast(
        inputs: &DeviceSwigluForwardInputs<'_>,
        params: &SwigluForwardParams,
    ) -> Result<DeviceSwigluForwardOutput> {
        let dev: &Device = inputs.x.device();
        let (n, two_h) = inputs.x.validate("x")?;
        let plan = validate_dims(n, two_h, params)?;
        let h = plan.h;
        let mut counts = if params.count_clamped {
            Some(dev.zeros::<i64>(&[3])?)
        } else {
            None
        };
        let out = match (params.out_format, &plan.cast) {
            (SwigluOutFormat::F32, _) => {
                let mut t = dev.alloc::<f32>(&[n, h])?;
                let mut o = DeviceSwigluOutMut::F32(t.view_mut());
                swiglu_forward_and_per_token_cast_into(
                    inputs,
                    params,
                    &mut o,
                    counts.as_mut().map(|c| c.view_mut()).as_mut(),
                )?;
                DeviceSwigluOut::F32(t)
            }
            (SwigluOutFormat::BF16, _) => {
                let mut t = dev.alloc::<bf16>(&[n, h])?;
                let mut o = DeviceSwigluOutMut::BF16(t.view_mut());
                swiglu_forward_and_per_token_cast_into(
                    inputs,
                    params,
                    &mut o,
                    counts.as_mut().map(|c| c.view_mut()).as_mut(),
                )?;
                DeviceSwigluOut::BF16(t)
            }
            (f, Some(cast)) => {
                let mut d = DeviceQuantData::alloc(dev, cast_format(f), n, h)?;
                let mut s = DeviceScales::alloc(dev, cast.sf_layout, cast.grid)?;
                let mut o = DeviceSwigluOutMut::Quantized(d.view_mut(), &mut s);
                swiglu_forward_and_per_token_cast_into(
                    inputs,
                    params,
                    &mut o,
                    counts.as_mut().map(|c| c.view_mut()).as_mut(),
                )?;
                drop(o);
                DeviceSwigluOut::Quantized(d, s)
            }
            (_, None) => unreachable!("validate_dims plans a cast for every quantized format"),
        };
        Ok(DeviceSwigluForwardOutput {
            out,
            clamped_count: counts,
        })
    }

    /// A CPU model of the kernel's `TK_TAIL` 1 task decoding.
    #[cfg(test)]
    mod tail_model {
        use super::tiled_grid;

        /// The (row tile, column tile) pairs of CTA `b` (the kernel's decoding: run CTAs
        /// below `nbig`, then single tiles, those past a run's end returning at once).
        fn cta_tiles(b: usize, nbig: usize, tiles: usize, ct: usize) -> Vec<(usize, usize)> {
            let runs_x = tiles.div_ceil(ct);
            let big = b < nbig;
            let q = if big { b } else { nbig + (b - nbig) / ct };
            let tc0 = q % runs_x * ct + if big { 0 } else { (b - nbig) % ct };
            let nt = if big {
                ct.min(tiles.saturating_sub(tc0))
            } else {
                1
            };
            (tc0..(tc0 + nt).min(tiles))
                .map(|tc| (q / runs_x, tc))
                .collect()
        }

        #[test]
        fn tasks_cover_every_tile_once() {
            let (mut cuts, mut cuts_partial_run) = (0, 0);
            for tiles in [1, 5, 9, 10, 16, 28, 56] {
                for ct in [1, 4, 5] {
                    for row_tiles in [1, 2, 7, 258, 758] {
                        for slots in [1, 8, 64, 660] {
                            for pte in [false, true] {
                                let (nbig, grid) = tiled_grid(tiles, ct, row_tiles, slots, pte);
                                if grid > nbig {
                                    cuts += 1;
                                    cuts_partial_run += usize::from(tiles % ct != 0);
                                }
                                let mut v: Vec<_> = (0..grid)
                                    .flat_map(|b| cta_tiles(b, nbig, tiles, ct))
                                    .collect();
                                v.sort_unstable();
                                let all: Vec<_> = (0..row_tiles)
                                    .flat_map(|r| (0..tiles).map(move |c| (r, c)))
                                    .collect();
                                let case = format!(
                                    "{tiles} tiles, ct {ct}, {row_tiles} rows, {slots}, pte {pte}"
                                );
                                assert_eq!(v, all, "{case}");
                            }
                        }
                    }
                }
            }
            // The decoding of single tiles is exercised, past a row's end too.
            assert!(
                cuts_partial_run > 0 && cuts > cuts_partial_run,
                "{cuts} {cuts_partial_run}"
            );
        }

        #[test]
        fn only_a_small_remainder_without_pos_to_expert_is_cut() {
            // K=6 H=3584 N=24240: 5306 runs = 8 waves of 660 + 26 runs (3.9 %) -> 104 single
            // tiles; with pos_to_expert kept as runs.
            assert_eq!(tiled_grid(28, 4, 758, 660, false), (5280, 5384));
            assert_eq!(tiled_grid(28, 4, 758, 660, true), (5306, 5306));
            // K=2 H=3584 N=8256: 1806 runs = 2 waves + 486 runs: kept as runs.
            assert_eq!(tiled_grid(28, 4, 258, 660, false), (1806, 1806));
            // K=8 H=2048 N=32128: 4016 runs = 6 waves + 56 runs (8.5 %): kept as runs.
            assert_eq!(tiled_grid(16, 4, 1004, 660, false), (4016, 4016));
            // K=8 H=3584 N=32128: 7028 runs = 10 waves + 428 runs: kept as runs.
            assert_eq!(tiled_grid(28, 4, 1004, 660, false), (7028, 7028));
            // The bound: 41 runs of 660 slots are cut (16 x 41 = 656), 42 are not.
            assert_eq!(tiled_grid(4, 4, 701, 660, false), (660, 824));
            assert_eq!(tiled_grid(4, 4, 702, 660, false), (702, 702));
            // One tile per CTA (ct 1): nothing to cut.
            assert_eq!(tiled_grid(28, 1, 24, 660, false), (672, 672));
        }
    }
}
