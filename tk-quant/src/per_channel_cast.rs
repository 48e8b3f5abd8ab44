//! `per_channel_cast` (`spec/quant.md` §3.5): FP8 e4m3 cast with one scale per column per
//! block of 128 rows.
//!
//! # What it computes
//!
//! For each column `c` and row block `b` (rows `[128·b, 128·b + 128)`):
//!
//! 1. `amax = max |x[r, c]|` over the block's rows (NaN ignored);
//! 2. `(sf, inv)` per §1.4 for e4m3 (`c = max(amax, 1e-4)`, `Q = 448`; powers of two with
//!    `round_sf`), `out_sf[b, c] = sf`;
//! 3. `out[r, c] = enc8(fl(x[r, c] · inv))`.
//!
//! It is the generic cast ([`reference::cast`](fn@crate::reference::cast)) with block
//! `(128, 1)` and layout A, as upstream's reference says (upstream's op forwards to
//! `per_channel_cast_fused` without a map or fused cast back).
//!
//! | argument | dtype | shape | notes |
//! |---|---|---|---|
//! | `x` | fp32 / bf16 | `(M, K)`, `M % 128 == 0`, `K % 64 == 0` | unit column stride, any row stride |
//! | `out` | e4m3 | `(M, K)` | contiguous |
//! | `out_sf` | fp32 | `(M/128, K)` | layout A (row-major), always |
//!
//! # Preconditions ([`validate`])
//!
//! * `M % 128 == 0` (so `M = 0` is allowed), `K % 64 == 0`.
//! * `num_per_tokens == 128` ([`NUM_PER_TOKENS`]).
//! * The format is e4m3 (upstream's `fmt` must be `'e4m3'`; here there is no format argument).
//!
//! # Deviations from upstream
//!
//! * **Any row stride** is accepted (upstream requires a contiguous `x`).
//! * NaN / inf inputs follow the GPU (§5 item 6), as in the generic reference.

use tk_core::{Result, TkError};

use crate::plan::{require_multiple, CastPlan};
use crate::scale::ScaleLayout;
use crate::types::PlainInput;

/// The only row-block height `npt` a per-channel cast accepts.
pub const NUM_PER_TOKENS: usize = 128;

/// The parameters of a per-channel cast (upstream's `num_per_tokens` and `round_sf`; the
/// format is always e4m3 and the scales always fp32 layout A).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PerChannelCastParams {
    /// `npt`, rows per scale: must be 128.
    pub num_per_tokens: usize,
    /// Round each scale up to a power of two (§1.4).
    pub round_sf: bool,
}

impl PerChannelCastParams {
    /// Bundles the parameters.
    pub const fn new(num_per_tokens: usize, round_sf: bool) -> Self {
        Self {
            num_per_tokens,
            round_sf,
        }
    }
}

impl Default for PerChannelCastParams {
    /// `npt = 128`, `round_sf = false`.
    fn default() -> Self {
        Self::new(NUM_PER_TOKENS, false)
    }
}

/// Validates a per-channel cast of `x` (see the [module docs](self)) and returns its plan:
/// block `(128, 1)`, grid `(M/128, K)`, layout A.
///
/// Errors: `x` (rank, column stride, `K = 0`, `M % 128 != 0`, `K % 64 != 0`),
/// `num_per_tokens` ([`TkError::Param`]).
pub fn validate(x: &PlainInput<'_>, params: &PerChannelCastParams) -> Result<CastPlan> {
    let (m, k) = x.validate("x")?;
    validate_dims(m, k, params)
}

/// The device-independent part of [`validate`], on the logical size `(m, k)`.
pub fn validate_dims(m: usize, k: usize, params: &PerChannelCastParams) -> Result<CastPlan> {
    require_multiple(
        "x",
        &[m, k],
        "M",
        m,
        128,
        "per_channel_cast scales blocks of 128 rows",
    )?;
    require_multiple(
        "x",
        &[m, k],
        "K",
        k,
        64,
        "per_channel_cast tiles columns by 64",
    )?;
    if params.num_per_tokens != NUM_PER_TOKENS {
        return Err(TkError::param(
            "num_per_tokens",
            format!(
                "per_channel_cast supports num_per_tokens = 128 only, got {} (the generic \
                 reference::cast accepts any block (npt, 1))",
                params.num_per_tokens
            ),
        ));
    }
    CastPlan::new(m, k, (NUM_PER_TOKENS, 1), ScaleLayout::RowMajorF32)
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU ops (feature `cuda`): the same rules as [`validate`], one kernel (`cuda/cast.cu`)
/// with block `(128, 1)`; bit-exact with [`crate::reference::per_channel_cast`].
#[cfg(feature = "cuda")]
mod gpu {
    use tk_core::Result;

    use super::{validate_dims, PerChannelCastParams};
    use crate::cast::{self, CastOutputs};
    use crate::device::{
        DeviceCastInput, DevicePlainInput, DeviceQuantData, DeviceQuantDataViewMut, DeviceScales,
    };
    use crate::plan::CastMode;
    use crate::types::CastFormat;

    /// Per-channel cast of `x` (fp32/bf16 `(M, K)`, `M % 128 == 0`, `K % 64 == 0`) to e4m3:
    /// data `(M, K)` and fp32 row-major scales `(M/128, K)`.
    pub fn per_channel_cast(
        x: &DevicePlainInput<'_>,
        params: &PerChannelCastParams,
    ) -> Result<(DeviceQuantData, DeviceScales)> {
        let (m, k) = x.validate("x")?;
        let plan = validate_dims(m, k, params)?;
        let x = DeviceCastInput::Plain(x.clone());
        cast::cast_alloc(&x, CastFormat::E4M3, &plan, params.round_sf)
    }

    /// [`per_channel_cast`] into caller-provided contiguous `out` (e4m3) and `out_sf`.
    pub fn per_channel_cast_into(
        x: &DevicePlainInput<'_>,
        params: &PerChannelCastParams,
        out: &mut DeviceQuantDataViewMut<'_>,
        out_sf: &mut DeviceScales,
    ) -> Result<()> {
        let (m, k) = x.validate("x")?;
        let plan = validate_dims(m, k, params)?;
        let outs = CastOutputs {
            out: Some(out),
            out_sf: Some(out_sf),
            sf: None,
        };
        let x = DeviceCastInput::Plain(x.clone());
        cast::launch(
            &x,
            CastFormat::E4M3,
            &plan,
            params.round_sf,
            CastMode::Cast,
            outs,
        )
    }
}
