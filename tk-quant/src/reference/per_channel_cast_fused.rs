//! CPU `per_channel_cast_fused` (`spec/quant.md` §3.6): the op's validation
//! ([`crate::per_channel_cast_fused::validate`]), the gathered (and, fused, dequantized) rows
//! `y`, then the generic reference [`cast`](fn@super::cast) with block `(128, 1)` (e4m3,
//! layout A).
//!
//! See [`crate::per_channel_cast_fused`](mod@crate::per_channel_cast_fused) for shapes, dtypes, preconditions and the deviations
//! from upstream.

use tk_core::convert::e4m3_to_f32;
use tk_core::{HostTensor, HostView, Result};

use crate::per_channel_cast_fused::{
    validate, FusedInput, PerChannelCastFusedParams, NUM_PER_CHANNELS,
};
use crate::scale::{HostScales, ScaleOptions};
use crate::types::{row, CastFormat, CastInput, QuantData};

/// `per_channel_cast_fused(x, 'e4m3', 128, round_sf, num_per_channels, pos_to_token)`: e4m3
/// data `(N_out, K)` and fp32 layout-A scales `(ceil(N_out/128), K)`. Padding rows
/// (`pos_to_token < 0`) are zeros.
///
/// Errors: see [`crate::per_channel_cast_fused::validate`].
pub fn per_channel_cast_fused(
    x: &FusedInput<'_>,
    pos_to_token: Option<&HostView<'_, i32>>,
    params: &PerChannelCastFusedParams,
) -> Result<(QuantData, HostScales)> {
    let plan = validate(x, pos_to_token, params)?;
    let (n_out, k) = (plan.cast.m, plan.cast.k);
    let mut y = Vec::with_capacity(n_out * k);
    for i in 0..n_out {
        let src = pos_to_token.map_or(i as i64, |m| m.at(&[i]) as i64);
        if src < 0 {
            y.resize(y.len() + k, 0.0);
            continue;
        }
        let src = src as usize;
        match x {
            FusedInput::Plain(p) => p.push_row(src, &mut y),
            FusedInput::Quantized { data, sf } => {
                let r = row(data, src);
                y.extend(
                    r.iter().enumerate().map(|(c, b)| {
                        e4m3_to_f32(b.to_bits()) * sf.at(&[src, c / NUM_PER_CHANNELS])
                    }),
                );
            }
        }
    }
    let y = HostTensor::from_vec(y, &[n_out, k])?;
    super::cast(
        &CastInput::from(y.view()),
        CastFormat::E4M3,
        plan.cast.block,
        ScaleOptions::row_major(params.round_sf),
    )
}
