//! CPU `per_channel_cast_and_transpose` (`spec/quant.md` §3.7): the op's validation
//! ([`crate::per_channel_cast_and_transpose::validate`]), the generic reference
//! [`cast`](fn@super::cast) with block `(npt, 1)` (e4m3, layout A), then a transpose of the
//! data.
//!
//! See [`crate::per_channel_cast_and_transpose`](mod@crate::per_channel_cast_and_transpose) for shapes, dtypes, preconditions and the
//! deviations from upstream.

use float8::F8E4M3;
use half::bf16;
use tk_core::{HostTensor, HostView, Result};

use crate::per_channel_cast_and_transpose::{validate, PerChannelCastAndTransposeParams};
use crate::scale::{HostScales, ScaleOptions};
use crate::types::{CastFormat, CastInput, QuantData};

/// `per_channel_cast_and_transpose(x, 'e4m3', npt, round_sf)`: e4m3 data `(K, M)` (the
/// transpose) and fp32 layout-A scales `(M/npt, K)`.
///
/// Errors: see [`crate::per_channel_cast_and_transpose::validate`].
pub fn per_channel_cast_and_transpose(
    x: &HostView<'_, bf16>,
    params: &PerChannelCastAndTransposeParams,
) -> Result<(QuantData, HostScales)> {
    let plan = validate(x, params)?;
    let (q, sf) = super::cast(
        &CastInput::from(x.clone()),
        CastFormat::E4M3,
        plan.block,
        ScaleOptions::row_major(params.round_sf),
    )?;
    Ok((transpose_e4m3(&q)?, sf))
}

/// The transpose `(K, M)` of e4m3 data `(M, K)`.
pub(crate) fn transpose_e4m3(q: &QuantData) -> Result<QuantData> {
    let t = q
        .as_e4m3()
        .expect("the per-channel casts produce e4m3 data");
    let (m, k) = (t.shape()[0], t.shape()[1]);
    let src = t.as_slice();
    let data: Vec<F8E4M3> = (0..k * m).map(|i| src[(i % m) * k + i / m]).collect();
    Ok(QuantData::E4M3(HostTensor::from_vec(data, &[k, m])?))
}
