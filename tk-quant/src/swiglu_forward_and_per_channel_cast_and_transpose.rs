//! `swiglu_forward_and_per_channel_cast_and_transpose` (`spec/quant.md` §3.12): the SwiGLU
//! activation, rounded to bf16, then an FP8 e4m3 cast with one scale per column per `npt` rows,
//! the data written transposed (or not).
//!
//! # What it computes
//!
//! Input `x` is bf16 `(M, 2H)`: gate `l = x[r, j]`, value `v = x[r, H + j]`, `j < H`.
//!
//! 1. For each `(r, j)`: clamp (if `C`: `l = C` if `l > C`, `v` into `[−C, C]`, in fp32),
//!    `a = fl(fl(l / fl(1 + expf(−l))) · v)`, then **`A[r, j] = bf16(a)`** (RNE);
//! 2. for each column `j` and row block `b` of `npt` rows: `amax = max |A|`, `(sf, inv)` per
//!    §1.4 (e4m3, `ε = 1e-4`; powers of two with `round_sf`), `out_sf[b, j] = sf`;
//! 3. `enc8(fl(A[r, j] · inv))` written to `out[j, r]`, or `out[r, j]` with
//!    `without_transpose`.
//!
//! Steps 2–3 are exactly [`per_channel_cast_and_transpose`](fn@crate::reference::per_channel_cast_and_transpose)
//! of `A` (or its untransposed form), i.e. the generic cast with block `(npt, 1)`.
//!
//! | argument | dtype | shape | notes |
//! |---|---|---|---|
//! | `x` | bf16 | `(M, 2H)`, `M % 128 == 0`, `2H % 128 == 0` | unit column stride, any row stride |
//! | `out` | e4m3 | `(H, M)`, or `(M, H)` with `without_transpose` | contiguous |
//! | `out_sf` | fp32 | `(M/npt, H)` | layout A, never transposed |
//!
//! # Preconditions ([`validate`])
//!
//! * `x` bf16 (by type), `M % 128 == 0` (`M = 0` allowed), `2H % 128 == 0` (so `H % 64 == 0`,
//!   `H >= 64`).
//! * `num_per_tokens` ∈ {32, 128}; the format is e4m3.
//! * `swiglu_clamp_value` finite and `>= 0` ([`crate::swiglu::check_clamp_value`]).
//!
//! # Deviations from upstream (documented choices)
//!
//! * **The clamp is in fp32** (upstream's reference). Upstream's kernel compares the bf16
//!   input with `bf16(C)`; the two agree whenever `C` is exactly representable in bf16 (the
//!   tested 10.0 and 0.5). The GPU kernels of this crate must clamp in fp32, so any `C` works.
//! * Any row stride is accepted (upstream: contiguous).
//! * NaN / inf inputs are unsupported (§5 item 6).

use half::bf16;
use tk_core::{HostView, Result, TkError};

use crate::plan::{require_multiple, CastPlan};
use crate::scale::ScaleLayout;
use crate::swiglu::check_clamp_value;
use crate::types::PlainInput;

/// The row-block heights `npt` the op accepts.
pub const NUM_PER_TOKENS: [usize; 2] = [32, 128];

/// The scalar parameters of the op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwigluPerChannelParams {
    /// `npt`, rows per scale: 32 or 128.
    pub num_per_tokens: usize,
    /// Round each scale up to a power of two (§1.4).
    pub round_sf: bool,
    /// Write the data `(M, H)` instead of `(H, M)`.
    pub without_transpose: bool,
    /// Optional clamp `C` (a compile-time constant of upstream's kernel).
    pub swiglu_clamp_value: Option<f32>,
}

impl SwigluPerChannelParams {
    /// Bundles the parameters (transposed output, no clamp).
    pub const fn new(num_per_tokens: usize, round_sf: bool) -> Self {
        Self {
            num_per_tokens,
            round_sf,
            without_transpose: false,
            swiglu_clamp_value: None,
        }
    }
}

/// Validates a call and returns the plan of the cast of the `(M, H)` activation: block
/// `(npt, 1)`, grid `(M/npt, H)`, layout A.
///
/// Errors: `x` ([`TkError::Shape`]: rank, `M % 128 != 0`, `2H % 128 != 0`;
/// [`TkError::Stride`]; [`TkError::Empty`]), `num_per_tokens`, `swiglu_clamp_value`
/// ([`TkError::Param`]).
pub fn validate(x: &HostView<'_, bf16>, params: &SwigluPerChannelParams) -> Result<CastPlan> {
    let (m, two_h) = PlainInput::BF16(x.clone()).validate("x")?;
    validate_dims(m, two_h, params)
}

/// The device-independent part of [`validate`], on `M` and the input width `2H`.
pub fn validate_dims(m: usize, two_h: usize, params: &SwigluPerChannelParams) -> Result<CastPlan> {
    require_multiple(
        "x",
        &[m, two_h],
        "M",
        m,
        128,
        "the kernel tiles rows by 128",
    )?;
    require_multiple(
        "x",
        &[m, two_h],
        "2H",
        two_h,
        128,
        "the SwiGLU input is gate | value, each H wide with H % 64 == 0",
    )?;
    let npt = params.num_per_tokens;
    if !NUM_PER_TOKENS.contains(&npt) {
        return Err(TkError::param(
            "num_per_tokens",
            format!("must be 32 or 128, got {npt}"),
        ));
    }
    check_clamp_value(params.swiglu_clamp_value)?;
    CastPlan::new_arg(
        m,
        two_h / 2,
        (npt, 1),
        ScaleLayout::RowMajorF32,
        "num_per_tokens",
    )
}
