//! CPU per-token casts (`spec/quant.md` §3.1, §3.2): the op's validation
//! ([`crate::per_token_cast::validate`]) followed by the generic reference with block
//! `(1, npc)` ([`cast`](fn@super::cast), [`cast_sf_only`](fn@super::cast_sf_only),
//! [`cast_with_precomputed_sf`](fn@super::cast_with_precomputed_sf)), or by
//! [`cast_to_e5m6`](fn@super::cast_to_e5m6) for E5M6.
//!
//! See [`crate::per_token_cast`](mod@crate::per_token_cast) for shapes, dtypes, preconditions and the deviations from
//! upstream.

use tk_core::dtype::E5M6Bytes;
use tk_core::{HostTensor, HostView, Result};

use crate::per_token_cast::{validate, validate_e5m6, PerTokenCastParams, PerTokenE5M6Params};
use crate::plan::CastMode;
use crate::scale::HostScales;
use crate::types::{CastInput, PlainInput, QuantData};

/// `per_token_cast(x, fmt, npc, x_block_size, col, round_sf, packed)`: the data (e4m3
/// `(M, K)` or packed e2m1 `(M, K/2)`, contiguous) and the scales (grid `(M, ceil(K/npc))` in
/// the layout `params.opts` selects).
///
/// `x` is plain fp32/bf16 `(M, K)` (any row stride) or quantized data with its scales and
/// `x_block_size` ([`crate::QuantInput`]). Errors: see [`crate::per_token_cast::validate`].
pub fn per_token_cast(
    x: &CastInput<'_>,
    params: &PerTokenCastParams,
) -> Result<(QuantData, HostScales)> {
    let plan = validate(x, params, CastMode::Cast)?;
    super::cast(x, params.fmt, plan.block, params.opts)
}

/// `per_token_cast_with_sf_only`: the scales [`per_token_cast`] returns, without the data.
/// Plain input only, `npc != K`. Errors: see [`crate::per_token_cast::validate`].
pub fn per_token_cast_with_sf_only(
    x: &CastInput<'_>,
    params: &PerTokenCastParams,
) -> Result<HostScales> {
    let plan = validate(x, params, CastMode::SfOnly)?;
    super::cast_sf_only(x, params.fmt, plan.block, params.opts)
}

/// `per_token_cast_with_precomputed_sf`: the data quantized with the caller's scales `sf`
/// (fp32 layout A `(M, ceil(K/npc))`, any row stride): `inv = fl(1/sf)` per group,
/// `out = enc(fl(x · inv))`. Plain input only, `npc != K`, neither the column-major nor the
/// packed flag. With the power-of-two scales of a rounded [`per_token_cast`] the result equals
/// its data bit for bit.
///
/// Errors: see [`crate::per_token_cast::validate`]; `sf` ([`tk_core::TkError::Shape`],
/// [`tk_core::TkError::Stride`]).
pub fn per_token_cast_with_precomputed_sf(
    x: &CastInput<'_>,
    params: &PerTokenCastParams,
    sf: &HostView<'_, f32>,
) -> Result<QuantData> {
    let plan = validate(x, params, CastMode::PrecomputedSf)?;
    super::cast_with_precomputed_sf(x, params.fmt, plan.block, sf)
}

/// `per_token_cast(x, 'e5m6', npc = K, col, round_sf, packed)`: packed E5M6 bytes `(M, 3K/2)`
/// and one scale per row (grid `(M, 1)`). Errors: see
/// [`crate::per_token_cast::validate_e5m6`].
pub fn per_token_cast_to_e5m6(
    x: &PlainInput<'_>,
    params: &PerTokenE5M6Params,
) -> Result<(HostTensor<E5M6Bytes>, HostScales)> {
    validate_e5m6(x, params)?;
    super::cast_to_e5m6(x, params.opts)
}
