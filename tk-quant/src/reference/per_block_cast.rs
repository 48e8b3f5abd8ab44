//! CPU per-block casts (`spec/quant.md` §3.3): the op's validation
//! ([`crate::per_block_cast::validate`]) followed by the generic reference with block
//! `(bm, bk)` ([`cast`](fn@super::cast), [`cast_sf_only`](fn@super::cast_sf_only),
//! [`cast_with_precomputed_sf`](fn@super::cast_with_precomputed_sf)).
//!
//! See [`crate::per_block_cast`](mod@crate::per_block_cast) for shapes, dtypes, preconditions and the deviations from
//! upstream.

use tk_core::{HostView, Result};

use crate::per_block_cast::{validate, PerBlockCastParams};
use crate::plan::CastMode;
use crate::scale::HostScales;
use crate::types::{CastInput, PlainInput, QuantData};

/// `per_block_cast(x, fmt, block_size, col, round_sf, packed)`: the data (e4m3 `(M, K)` or
/// packed e2m1 `(M, K/2)`, contiguous) and the scales (grid `(ceil(M/bm), ceil(K/bk))` in the
/// layout `params.opts` selects). `x` is fp32/bf16 `(M, K)`, `K % 64 == 0`, any row stride.
///
/// Errors: see [`crate::per_block_cast::validate`].
pub fn per_block_cast(
    x: &PlainInput<'_>,
    params: &PerBlockCastParams,
) -> Result<(QuantData, HostScales)> {
    let plan = validate(x, params, CastMode::Cast)?;
    super::cast(
        &CastInput::Plain(x.clone()),
        params.fmt,
        plan.block,
        params.opts,
    )
}

/// `per_block_cast_with_sf_only`: the scales [`per_block_cast`] returns, without the data.
///
/// Errors: see [`crate::per_block_cast::validate`].
pub fn per_block_cast_with_sf_only(
    x: &PlainInput<'_>,
    params: &PerBlockCastParams,
) -> Result<HostScales> {
    let plan = validate(x, params, CastMode::SfOnly)?;
    super::cast_sf_only(
        &CastInput::Plain(x.clone()),
        params.fmt,
        plan.block,
        params.opts,
    )
}

/// `per_block_cast_with_precomputed_sf`: the data quantized with the caller's scales `sf`
/// (fp32 layout A `(ceil(M/bm), ceil(K/bk))`, any row stride): `inv = fl(1/sf)` per block.
/// Neither the column-major nor the packed flag may be set.
///
/// Errors: see [`crate::per_block_cast::validate`]; `sf` ([`tk_core::TkError::Shape`],
/// [`tk_core::TkError::Stride`]).
pub fn per_block_cast_with_precomputed_sf(
    x: &PlainInput<'_>,
    params: &PerBlockCastParams,
    sf: &HostView<'_, f32>,
) -> Result<QuantData> {
    let plan = validate(x, params, CastMode::PrecomputedSf)?;
    super::cast_with_precomputed_sf(&CastInput::Plain(x.clone()), params.fmt, plan.block, sf)
}
