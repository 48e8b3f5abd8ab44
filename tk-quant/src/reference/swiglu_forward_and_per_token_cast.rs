//! CPU `swiglu_forward_and_per_token_cast` (`spec/quant.md` §3.10), split in two so that the
//! GPU tests can be exact (see [`crate::swiglu`]):
//!
//! * [`swiglu_forward_activation`]: the fp32 activation `(N, H)` (clamp, SiLU · value, weight)
//!   with a caller-given `expf`, plus the clamp counts; padding rows are zero;
//! * [`swiglu_forward_downstream`]: everything after it (bf16 rounding or the per-token cast,
//!   padding rows zeroed), bit-exact given the activation.
//!
//! [`swiglu_forward_and_per_token_cast`] chains the two with [`cpu_expf`];
//! [`swiglu_forward_and_per_token_cast_with_expf`] with any `expf`. With the `F32` format the
//! output *is* the activation.
//!
//! See [`crate::swiglu_forward_and_per_token_cast`](mod@crate::swiglu_forward_and_per_token_cast) for shapes, dtypes, preconditions and the
//! deviations from upstream.

use half::bf16;
use tk_core::convert::bf16_from_f32;
use tk_core::{HostTensor, HostView, Result};

use super::par_rows;
use super::swiglu::{cast_rows, clamp_gate, clamp_value, cpu_expf, RowCast};
use crate::scale::HostScales;
use crate::swiglu::check_vector;
use crate::swiglu_forward_and_per_token_cast::{
    is_processed, validate, validate_dims, SwigluForwardInputs, SwigluForwardParams,
    SwigluOutFormat,
};
use crate::types::{check_matrix, QuantData};

/// The output data of the op, by format.
#[derive(Debug, Clone, PartialEq)]
pub enum SwigluOut {
    /// `F32`: the activation `(N, H)`.
    F32(HostTensor<f32>),
    /// `BF16`: the activation rounded to bf16, `(N, H)`.
    BF16(HostTensor<bf16>),
    /// `E4M3` / `E2M1`: the data (`(N, H)` / `(N, H/2)`) and the scales (grid `(N, H/npc)`).
    Quantized(QuantData, HostScales),
}

/// What the op returns.
#[derive(Debug, Clone, PartialEq)]
pub struct SwigluForwardOutput {
    /// The data (and scales).
    pub out: SwigluOut,
    /// `[#(l > C), #(v > C), #(v < −C)]` over the processed rows, when `count_clamped`.
    pub clamped_count: Option<[i64; 3]>,
}

/// The activation of every processed row, `(N, H)` fp32 contiguous:
/// `fl(fl(fl(l / fl(1 + expf(−l))) · v) · w)` after the clamp (no `· w` without weights;
/// `w = 0` for a negative `pos_to_token_topk`). Padding rows (`pos_to_expert < 0`) are +0.0
/// and not counted. Also returns the clamp counts when `params.count_clamped`.
///
/// Errors: see [`crate::swiglu_forward_and_per_token_cast::validate`].
pub fn swiglu_forward_activation(
    inputs: &SwigluForwardInputs<'_>,
    params: &SwigluForwardParams,
    expf: &(impl Fn(f32) -> f32 + Sync + ?Sized),
) -> Result<(HostTensor<f32>, Option<[i64; 3]>)> {
    let plan = validate(inputs, params)?;
    let (n, h) = (plan.n, plan.h);
    let c = params.swiglu_clamp_value;
    let mut act = vec![0.0f32; n * h];
    // Rows in parallel, each with the sequential arithmetic; the counts are integer sums.
    let parts = par_rows(&mut act, h, 3 * h, |first, run| {
        let mut counts = [0i64; 3];
        let mut row = Vec::with_capacity(2 * h);
        for (r, out) in run.chunks_mut(h).enumerate() {
            let i = first + r;
            if !inputs.is_processed(i) {
                continue;
            }
            row.clear();
            inputs.x.push_row(i, &mut row);
            let w = inputs.topk.as_ref().map(|t| t.weight(i));
            for (j, o) in out.iter_mut().enumerate() {
                let (l, cl) = clamp_gate(row[j], c);
                let (v, hi, lo) = clamp_value(row[h + j], c);
                counts[0] += cl as i64;
                counts[1] += hi as i64;
                counts[2] += lo as i64;
                let t = 1.0 + expf(-l);
                let a = (l / t) * v;
                *o = match w {
                    Some(w) => a * w,
                    None => a,
                };
            }
        }
        counts
    });
    let counts = parts.iter().fold([0i64; 3], |acc, p| {
        [acc[0] + p[0], acc[1] + p[1], acc[2] + p[2]]
    });
    let counts = params.count_clamped.then_some(counts);
    Ok((HostTensor::from_vec(act, &[n, h])?, counts))
}

/// Everything after the activation, exact: given the `(N, H)` activation `act` (fp32, unit
/// column stride; e.g. the GPU's `F32` output), the op's output in `params.out_format`:
/// `act` itself, `bf16(act)`, or the per-token cast (§1.4, `ε = sf_clamp_min` or the
/// format's). Rows with `pos_to_expert < 0` become zeros with a zero scale, whatever `act`
/// holds there. Clamp and counting parameters are validated but not used.
///
/// Errors: `act` (rank, column stride, `H % 128 != 0`, named `x` with the width `2H`),
/// `pos_to_expert` (not `(N,)`), and the parameter errors of
/// [`crate::swiglu_forward_and_per_token_cast::validate_dims`].
pub fn swiglu_forward_downstream(
    act: &HostView<'_, f32>,
    pos_to_expert: Option<&HostView<'_, i32>>,
    params: &SwigluForwardParams,
) -> Result<SwigluOut> {
    let (n, h) = check_matrix("act", act.layout())?;
    let plan = validate_dims(n, 2 * h, params)?;
    if let Some(p) = pos_to_expert {
        check_vector("pos_to_expert", p, n)?;
    }
    let skip = |i: usize| !is_processed(pos_to_expert, i);
    // The plain outputs: `act` with the skipped rows zeroed.
    let values = || {
        let mut values = act.to_contiguous_vec();
        for i in (0..n).filter(|&i| skip(i)) {
            values[i * h..(i + 1) * h].fill(0.0);
        }
        values
    };
    Ok(match (params.out_format, plan.cast) {
        (SwigluOutFormat::F32, _) => SwigluOut::F32(HostTensor::from_vec(values(), &[n, h])?),
        (SwigluOutFormat::BF16, _) => SwigluOut::BF16(HostTensor::from_vec(
            values().iter().map(|&a| bf16_from_f32(a)).collect(),
            &[n, h],
        )?),
        (fmt, Some(cast)) => {
            let fmt = fmt
                .cast_format()
                .expect("quantized formats have a cast plan");
            let (q, sf) = cast_rows(
                act,
                RowCast {
                    fmt,
                    npc: cast.block.1,
                    layout: cast.sf_layout,
                    round_sf: params.opts.round_sf,
                    eps: params.sf_clamp_min,
                },
                &skip,
            )?;
            SwigluOut::Quantized(q, sf)
        }
        (_, None) => unreachable!("validate_dims plans a cast for every quantized format"),
    })
}

/// `swiglu_forward_and_per_token_cast` with the CPU `expf` ([`cpu_expf`]).
///
/// Errors: see [`crate::swiglu_forward_and_per_token_cast::validate`].
pub fn swiglu_forward_and_per_token_cast(
    inputs: &SwigluForwardInputs<'_>,
    params: &SwigluForwardParams,
) -> Result<SwigluForwardOutput> {
    swiglu_forward_and_per_token_cast_with_expf(inputs, params, &cpu_expf)
}

/// `swiglu_forward_and_per_token_cast` with a caller-given `expf` (e.g. a table of the GPU's
/// values): [`swiglu_forward_activation`] then [`swiglu_forward_downstream`].
pub fn swiglu_forward_and_per_token_cast_with_expf(
    inputs: &SwigluForwardInputs<'_>,
    params: &SwigluForwardParams,
    expf: &(impl Fn(f32) -> f32 + Sync + ?Sized),
) -> Result<SwigluForwardOutput> {
    let (act, clamped_count) = swiglu_forward_activation(inputs, params, expf)?;
    let out = swiglu_forward_downstream(&act.view(), inputs.pos_to_expert.as_ref(), params)?;
    Ok(SwigluForwardOutput { out, clamped_count })
}
