//! `reduce_fused` (§4.14).

use float8::F8E4M3;
use tk_core::{HostTensor, HostView, Result};

use super::{elem, row};
use crate::index::check_indices;
use crate::reduce_fused::{
    ReduceElement, ReduceFusedParams, ReduceFusedShape, ReduceFusedTensors, ReduceOut,
};

/// The tensor arguments of [`reduce_fused`] / [`reduce_fused_e4m3`]:
/// [`ReduceFusedTensors`] of host views (shapes and rules in [`crate::reduce_fused`](mod@crate::reduce_fused)).
pub type ReduceFusedInputs<'a, T> =
    ReduceFusedTensors<HostView<'a, T>, HostView<'a, f32>, HostView<'a, i32>>;

/// Validates and computes the fp32 results `r` of every `(t, h)` (before the conversion).
fn reduce_f32<T: ReduceElement>(
    inputs: &ReduceFusedInputs<'_, T>,
    out: ReduceOut,
) -> Result<(ReduceFusedShape, Vec<f32>)> {
    let shape = ReduceFusedParams::new(out).validate(&inputs.layouts(), T::DTYPE)?;
    let (t_n, k_n, m, h) = (
        shape.num_tokens,
        shape.num_topk,
        shape.num_rows,
        shape.hidden,
    );
    check_indices(
        "token_topk_to_pos",
        &inputs.token_topk_to_pos,
        m,
        &format!("a row of x in 0..M = {m}"),
    )?;
    let sf = inputs.sf.as_ref().map(|s| elem(s, 0));
    let mut res = vec![0f32; t_n * h];
    let mut acc = vec![0f32; h];
    for t in 0..t_n {
        acc.fill(0.0);
        let pos = row(&inputs.token_topk_to_pos, t, k_n);
        let weights = inputs.topk_weights.as_ref().map(|w| row(w, t, k_n));
        for (k, &p) in pos.iter().enumerate() {
            if p < 0 {
                continue;
            }
            let p = p as usize;
            let mut s = weights.map_or(1.0, |w| w[k]);
            if let Some(x_sf) = &inputs.x_sf {
                s *= elem(x_sf, p);
            }
            for (a, &x) in acc.iter_mut().zip(row(&inputs.x, p, h)) {
                *a = x.to_f32().mul_add(s, *a);
            }
        }
        let dst = &mut res[t * h..(t + 1) * h];
        match sf {
            Some(sf) => dst.iter_mut().zip(&acc).for_each(|(d, &a)| *d = a * sf),
            None => dst.copy_from_slice(&acc),
        }
    }
    Ok((shape, res))
}

/// CPU `reduce_fused` with output in `x`'s dtype (`fp8_format = ''`, §4.14): per token, the
/// FMA accumulation in slot order of [`crate::reduce_fused`](mod@crate::reduce_fused), rounded RNE to `T`.
///
/// Errors: those of [`ReduceFusedParams::validate`] (`sf` given is an error here), and
/// [`tk_core::TkError::Param`] naming `token_topk_to_pos` for an entry other than `-1` or
/// `0..M`.
pub fn reduce_fused<T: ReduceElement>(inputs: &ReduceFusedInputs<'_, T>) -> Result<HostTensor<T>> {
    let (shape, r) = reduce_f32(inputs, ReduceOut::Input)?;
    HostTensor::from_vec(
        r.into_iter().map(T::from_f32_rne).collect(),
        &shape.out_shape(),
    )
}

/// CPU `reduce_fused` with FP8 e4m3fn output (`fp8_format = 'e4m3'`, §4.14): the same
/// accumulation, times `sf[0]` when given, then the **saturating** RNE conversion
/// ([`tk_core::convert::e4m3_from_f32`]: `|r| > 448` → ±448, NaN → `0x7F`).
///
/// Errors: as [`reduce_fused`] (`sf` is allowed).
pub fn reduce_fused_e4m3<T: ReduceElement>(
    inputs: &ReduceFusedInputs<'_, T>,
) -> Result<HostTensor<F8E4M3>> {
    let (shape, r) = reduce_f32(inputs, ReduceOut::E4m3)?;
    HostTensor::from_vec(
        r.into_iter()
            .map(|v| F8E4M3::from_bits(tk_core::convert::e4m3_from_f32(v)))
            .collect(),
        &shape.out_shape(),
    )
}
