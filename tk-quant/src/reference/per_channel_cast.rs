//! CPU per-channel cast (`spec/quant.md` §3.5): the op's validation
//! ([`crate::per_channel_cast::validate`]) followed by the generic reference
//! [`cast`](fn@super::cast) with block `(128, 1)`, e4m3, layout A.
//!
//! See [`crate::per_channel_cast`](mod@crate::per_channel_cast) for shapes, dtypes, preconditions and the deviations from
//! upstream.

use tk_core::Result;

use crate::per_channel_cast::{validate, PerChannelCastParams};
use crate::scale::{HostScales, ScaleOptions};
use crate::types::{CastFormat, CastInput, PlainInput, QuantData};

/// `per_channel_cast(x, 'e4m3', 128, round_sf)`: e4m3 data `(M, K)` (contiguous) and fp32
/// layout-A scales `(M/128, K)`, one per column per 128 rows. `x` is fp32/bf16 `(M, K)` with
/// `M % 128 == 0`, `K % 64 == 0`, any row stride.
///
/// Errors: see [`crate::per_channel_cast::validate`].
pub fn per_channel_cast(
    x: &PlainInput<'_>,
    params: &PerChannelCastParams,
) -> Result<(QuantData, HostScales)> {
    let plan = validate(x, params)?;
    super::cast(
        &CastInput::Plain(x.clone()),
        CastFormat::E4M3,
        plan.block,
        ScaleOptions::row_major(params.round_sf),
    )
}
