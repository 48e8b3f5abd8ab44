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
