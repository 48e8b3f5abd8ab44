//! CPU `per_channel_cast_fused` (`spec/quant.md` §3.6): the op's validation
//! ([`crate::per_channel_cast_fused::validate`]), the gathered (and, fused, dequantized) rows
//! `y`, then the generic reference [`cast`](fn@super::cast) with block `(128, 1)` (e4m3,
//! layout A).
//!
//! See [`crate::per_channel_cast_fused`](mod@crate::per_channel_cast_fused) for shapes, dtypes, preconditions and the deviations
//! from upstream.

use tk_core::convert::e4m3_to_f32;
use tk_core::{HostTensor, HostView, Result};

use super::par_rows;
use crate::per_channel_cast_fused::{
    validate, FusedInput, PerChannelCastFusedParams, NUM_PER_CHANNELS,
};
use crate::scale::{HostScales, ScaleOptions};
use crate::types::{row, CastFormat, QuantData};

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
    // The gathered rows, in parallel.
    let mut y = vec![0.0f32; n_out * k];
    par_rows(&mut y, k, k, |first, run| {
        let mut buf = Vec::with_capacity(k);
        for (i, out) in run.chunks_mut(k).enumerate() {
            let src = pos_to_token.map_or((first + i) as i64, |m| m.at(&[first + i]) as i64);
            if src < 0 {
                continue;
            }
            let src = src as usize;
            match x {
                FusedInput::Plain(p) => {
                    buf.clear();
                    p.push_row(src, &mut buf);
                    out.copy_from_slice(&buf);
                }
                FusedInput::Quantized { data, sf } => {
                    let groups = out
                        .chunks_mut(NUM_PER_CHANNELS)
                        .zip(row(data, src).chunks(NUM_PER_CHANNELS));
                    for (g, (os, bs)) in groups.enumerate() {
                        let s = sf.at(&[src, g]);
                        for (o, b) in os.iter_mut().zip(bs) {
                            *o = e4m3_to_f32(b.to_bits()) * s;
                        }
                    }
                }
            }
        }
    });
    super::cast::cast_owned(
        HostTensor::from_vec(y, &[n_out, k])?,
        CastFormat::E4M3,
        plan.cast.block,
        ScaleOptions::row_major(params.round_sf),
    )
}
