//! CPU `swiglu_forward_and_per_channel_cast_and_transpose` (`spec/quant.md` §3.12), split in
//! two so that the GPU tests can be exact (see [`crate::swiglu`]):
//!
//! * [`swiglu_per_channel_activation`]: the bf16 activation `A` `(M, H)` with a caller-given
//!   `expf`;
//! * [`swiglu_per_channel_downstream`]: the per-channel cast of `A` (block `(npt, 1)`) and the
//!   optional transpose, bit-exact given `A`.
//!
//! [`swiglu_forward_and_per_channel_cast_and_transpose`] chains them with [`cpu_expf`];
//! [`swiglu_forward_and_per_channel_cast_and_transpose_with_expf`] with any `expf`.
//!
//! See [`crate::swiglu_forward_and_per_channel_cast_and_transpose`](mod@crate::swiglu_forward_and_per_channel_cast_and_transpose) for shapes, dtypes,
//! preconditions and the deviations from upstream.

use half::bf16;
use tk_core::convert::bf16_from_f32;
use tk_core::{HostTensor, HostView, Result};

use super::par_rows;
use super::per_channel_cast_and_transpose::transpose_e4m3;
use super::swiglu::{cpu_expf, swiglu_activation};
use crate::scale::{HostScales, ScaleOptions};
use crate::swiglu_forward_and_per_channel_cast_and_transpose::{
    validate, validate_dims, SwigluPerChannelParams,
};
use crate::types::{check_matrix, row, CastFormat, CastInput, QuantData};

/// The bf16 activation `A[r, j] = bf16(fl(fl(l / fl(1 + expf(−l))) · v))` (after the clamp),
/// `(M, H)` contiguous.
///
/// Errors: see [`crate::swiglu_forward_and_per_channel_cast_and_transpose::validate`].
pub fn swiglu_per_channel_activation(
    x: &HostView<'_, bf16>,
    params: &SwigluPerChannelParams,
    expf: &(impl Fn(f32) -> f32 + Sync + ?Sized),
) -> Result<HostTensor<bf16>> {
    let plan = validate(x, params)?;
    let (m, h) = (plan.m, plan.k);
    let mut a = vec![bf16::ZERO; m * h];
    par_rows(&mut a, h, 2 * h, |first, run| {
        for (i, out) in run.chunks_mut(h).enumerate() {
            let xr = row(x, first + i);
            for (j, o) in out.iter_mut().enumerate() {
                *o = bf16_from_f32(swiglu_activation(
                    xr[j].to_f32(),
                    xr[h + j].to_f32(),
                    params.swiglu_clamp_value,
                    expf,
                ));
            }
        }
    });
    HostTensor::from_vec(a, &[m, h])
}

/// Everything after the activation, exact: the e4m3 cast of `a` `(M, H)` with block
/// `(npt, 1)` (layout A scales `(M/npt, H)`), the data transposed to `(H, M)` unless
/// `params.without_transpose`. The clamp is validated but not used.
///
/// Errors: `a` (named `act`: rank, column stride; `M % 128`, `H % 64` reported on `x` with the
/// width `2H`), `num_per_tokens`, `swiglu_clamp_value`.
pub fn swiglu_per_channel_downstream(
    a: &HostView<'_, bf16>,
    params: &SwigluPerChannelParams,
) -> Result<(QuantData, HostScales)> {
    let (m, h) = check_matrix("act", a.layout())?;
    let plan = validate_dims(m, 2 * h, params)?;
    let (q, sf) = super::cast(
        &CastInput::from(a.clone()),
        CastFormat::E4M3,
        plan.block,
        ScaleOptions::row_major(params.round_sf),
    )?;
    let q = if params.without_transpose {
        q
    } else {
        transpose_e4m3(&q)?
    };
    Ok((q, sf))
}

/// `swiglu_forward_and_per_channel_cast_and_transpose` with the CPU `expf` ([`cpu_expf`]).
///
/// Errors: see [`crate::swiglu_forward_and_per_channel_cast_and_transpose::validate`].
pub fn swiglu_forward_and_per_channel_cast_and_transpose(
    x: &HostView<'_, bf16>,
    params: &SwigluPerChannelParams,
) -> Result<(QuantData, HostScales)> {
    swiglu_forward_and_per_channel_cast_and_transpose_with_expf(x, params, &cpu_expf)
}

/// `swiglu_forward_and_per_channel_cast_and_transpose` with a caller-given `expf`:
/// [`swiglu_per_channel_activation`] then [`swiglu_per_channel_downstream`].
pub fn swiglu_forward_and_per_channel_cast_and_transpose_with_expf(
    x: &HostView<'_, bf16>,
    params: &SwigluPerChannelParams,
    expf: &(impl Fn(f32) -> f32 + Sync + ?Sized),
) -> Result<(QuantData, HostScales)> {
    let a = swiglu_per_channel_activation(x, params, expf)?;
    swiglu_per_channel_downstream(&a.view(), params)
}
