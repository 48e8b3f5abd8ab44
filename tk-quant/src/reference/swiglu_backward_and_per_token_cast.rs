//! CPU `swiglu_backward_and_per_token_cast` (`spec/quant.md` §3.11).
//!
//! The only operation a CPU cannot reproduce is CUDA's `expf` (see [`crate::swiglu`]), so the
//! reference is parameterised by it: [`swiglu_backward_and_per_token_cast_with_expf`] with the
//! GPU's own `expf` values (e.g. the GPU's `expf` of every element's `−X`, looked up by the
//! element's index) is bit-exact for `out`, `x_grad`, `x_grad_fp8` and its scales;
//! [`swiglu_backward_and_per_token_cast`] uses [`cpu_expf`]. Rows are computed in parallel,
//! each with the sequential arithmetic. [`swiglu_backward_element`] is the per-element
//! arithmetic, in the spec's exact order, with its single FMA ([`f32::mul_add`]).
//!
//! See [`crate::swiglu_backward_and_per_token_cast`](mod@crate::swiglu_backward_and_per_token_cast) for shapes, dtypes, preconditions and the
//! deviations from upstream.

use half::bf16;
use tk_core::convert::{bf16_from_f32, e4m3_to_f32};
use tk_core::{HostTensor, Result};

use super::par_rows;
use super::swiglu::{cast_rows, clamp_gate, clamp_value, cpu_expf, RowCast};
use crate::scale::{HostScales, ScaleLayout};
use crate::swiglu_backward_and_per_token_cast::{
    validate, SwigluBackwardInputs, SwigluBackwardParams,
};
use crate::types::{row, CastFormat, QuantData, QuantDataView};

/// The fp32 results of one element of the backward (before the bf16 roundings).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackwardElement {
    /// `act = fl(fl(X / t) · Y)` (the forward activation before the weight).
    pub act: f32,
    /// `fl(act · w)`: `out` before its bf16 rounding.
    pub out: f32,
    /// `dX`: `+0` if the gate was clamped, else `fl(fl(gws · Y) · fma(X, fl(1 − s), 1))`.
    pub dx: f32,
    /// `dY`: `+0` if the value was clamped, else `fl(gws · X)`.
    pub dy: f32,
}

/// One element of the backward (§3.11 steps 2–8): `x`, `y` are the dequantized gate and
/// value (before the clamp), `g` the output gradient, `w` the row's weight, `c` the clamp.
///
/// `t = fl(1 + expf(−X))`, `s = fl(1/t)`, `act = fl(fl(X/t) · Y)`, `gws = fl(fl(g · w) · s)`,
/// `dX = fl(fl(gws · Y) · fma(X, fl(1 − s), 1))` with one rounding for the FMA
/// ([`f32::mul_add`]), `dY = fl(gws · X)`; each other operation rounded on its own.
pub fn swiglu_backward_element(
    x: f32,
    y: f32,
    g: f32,
    w: f32,
    c: Option<f32>,
    expf: &dyn Fn(f32) -> f32,
) -> BackwardElement {
    let (x, cx) = clamp_gate(x, c);
    let (y, hi, lo) = clamp_value(y, c);
    let cy = hi || lo;
    let t = 1.0 + expf(-x);
    let s = 1.0 / t;
    let act = (x / t) * y;
    let gws = (g * w) * s;
    let dx = if cx {
        0.0
    } else {
        (gws * y) * x.mul_add(1.0 - s, 1.0)
    };
    let dy = if cy { 0.0 } else { gws * x };
    BackwardElement {
        act,
        out: act * w,
        dx,
        dy,
    }
}

/// What the op returns.
#[derive(Debug, Clone, PartialEq)]
pub struct SwigluBackwardOutput {
    /// `(N, H)` bf16: `bf16(fl(act · w))`.
    pub out: HostTensor<bf16>,
    /// `(N, 2H)` e4m3: the per-token cast of the fp32 gradient `[dX | dY]`.
    pub x_grad_fp8: QuantData,
    /// Its scales: fp32 layout A `(N, 2H/npc)`.
    pub x_grad_fp8_sf: HostScales,
    /// `(N, 2H)` bf16: `[bf16(dX) | bf16(dY)]`.
    pub x_grad: HostTensor<bf16>,
    /// `(T, k)` fp32: `Σ_j g_j · act_j` at each row's routing slot, 0 elsewhere.
    pub weight_grad: HostTensor<f32>,
}

/// The backward before its cast: what [`swiglu_backward_and_per_token_cast_with_expf`] casts
/// (one computation serves both roundings of the scales).
#[derive(Debug, Clone, PartialEq)]
pub struct SwigluBackwardGrad {
    /// `(N, H)` bf16: `bf16(fl(act · w))`.
    pub out: HostTensor<bf16>,
    /// `(N, 2H)` fp32: the gradient `[dX | dY]`.
    pub grad: HostTensor<f32>,
    /// `(T, k)` fp32: `Σ_j g_j · act_j` at each row's routing slot, 0 elsewhere.
    pub weight_grad: HostTensor<f32>,
}

impl SwigluBackwardGrad {
    /// `x_grad_fp8` `(N, 2H)` e4m3 and its scales (fp32 layout A `(N, 2H/npc)`): the per-token
    /// cast of `grad` in groups of `npc` columns, scales rounded to powers of two when
    /// `round_sf`.
    ///
    /// The same data and scales as [`super::cast()`] with block `(1, npc)`, computed by the
    /// SwiGLU family's row cast straight from `grad` (no fp32 copy of the matrix; the GPU
    /// tests cast gradients of up to 49024 x 14336 values, several per case).
    ///
    /// Errors: `npc` zero.
    pub fn cast(&self, npc: usize, round_sf: bool) -> Result<(QuantData, HostScales)> {
        let p = RowCast {
            fmt: CastFormat::E4M3,
            npc,
            layout: ScaleLayout::RowMajorF32,
            round_sf,
            eps: None,
        };
        cast_rows(&self.grad.view(), p, &|_| false)
    }

    /// `x_grad` `(N, 2H)` bf16: `bf16(grad)`, rows in parallel.
    ///
    /// Errors: none for a gradient built by [`swiglu_backward_grad_with_expf`].
    pub fn x_grad(&self) -> Result<HostTensor<bf16>> {
        let (n, w) = (self.grad.shape()[0], self.grad.shape()[1]);
        let src = self.grad.as_slice();
        let mut v = vec![bf16::ZERO; n * w];
        par_rows(&mut v, w, w, |first, run| {
            let part = &src[first * w..first * w + run.len()];
            for (o, &g) in run.iter_mut().zip(part) {
                *o = bf16_from_f32(g);
            }
        });
        HostTensor::from_vec(v, &[n, w])
    }
}

/// `swiglu_backward_and_per_token_cast` with the CPU `expf` ([`cpu_expf`]).
///
/// Errors: see [`crate::swiglu_backward_and_per_token_cast::validate`].
pub fn swiglu_backward_and_per_token_cast(
    inputs: &SwigluBackwardInputs<'_>,
    params: &SwigluBackwardParams,
) -> Result<SwigluBackwardOutput> {
    swiglu_backward_and_per_token_cast_with_expf(inputs, params, &|_, v| cpu_expf(v))
}

/// `swiglu_backward_and_per_token_cast` with a caller-given `expf`; everything else is exact.
/// `expf(e, v)` is asked once for each element `e = i · H + j` (row `i`, gate column `j`) with
/// its argument `v = −X`, from several threads (rows in parallel), so a caller can look the
/// value up by `e`. `weight_grad` is summed in f64 (each product `g · act` exact) and rounded
/// once.
///
/// Errors: see [`crate::swiglu_backward_and_per_token_cast::validate`].
pub fn swiglu_backward_and_per_token_cast_with_expf(
    inputs: &SwigluBackwardInputs<'_>,
    params: &SwigluBackwardParams,
    expf: &(dyn Fn(usize, f32) -> f32 + Sync),
) -> Result<SwigluBackwardOutput> {
    let g = swiglu_backward_grad_with_expf(inputs, params, expf)?;
    let (x_grad_fp8, x_grad_fp8_sf) = g.cast(params.num_per_channels, params.round_sf)?;
    let x_grad = g.x_grad()?;
    Ok(SwigluBackwardOutput {
        out: g.out,
        x_grad_fp8,
        x_grad_fp8_sf,
        x_grad,
        weight_grad: g.weight_grad,
    })
}

/// The backward up to its cast ([`SwigluBackwardGrad`]; `params.round_sf` is validated but
/// not used), with `expf` asked as by [`swiglu_backward_and_per_token_cast_with_expf`].
///
/// Errors: see [`crate::swiglu_backward_and_per_token_cast::validate`].
pub fn swiglu_backward_grad_with_expf(
    inputs: &SwigluBackwardInputs<'_>,
    params: &SwigluBackwardParams,
    expf: &(dyn Fn(usize, f32) -> f32 + Sync),
) -> Result<SwigluBackwardGrad> {
    let plan = validate(inputs, params)?;
    let (n, h, npc) = (plan.n, plan.h, params.num_per_channels);
    let (t, k) = plan.topk_shape;
    let QuantDataView::E4M3(xq) = &inputs.x else {
        unreachable!("validate requires e4m3 data")
    };
    let mut grad = vec![0.0f32; n * 2 * h];
    let dec: [f32; 256] = std::array::from_fn(|b| e4m3_to_f32(b as u8)); // (codes,) e4m3 values
                                                                         // Rows in parallel: each run of rows returns its `out` rows and each row's
                                                                         // (routing slot, weight_grad) in row order.
    let parts = par_rows(&mut grad, 2 * h, 3 * h, |first, run| {
        let mut out = Vec::with_capacity(run.len() / 2);
        let mut sums = Vec::with_capacity(run.len() / (2 * h));
        let mut sf = vec![0.0f32; 2 * h / npc]; // (groups,) the row's input scales
        for (r, grow2) in run.chunks_mut(2 * h).enumerate() {
            let i = first + r;
            let p = inputs.pos_to_token_topk.at(&[i]);
            let w = if p >= 0 {
                inputs.weight.at(&[p as usize / k, p as usize % k])
            } else {
                0.0
            };
            let xrow = row(xq, i);
            let grow = row(&inputs.grad_out, i);
            for (b, v) in sf.iter_mut().enumerate() {
                *v = inputs.x_sf.at(&[i, b]);
            }
            let deq = |c: usize| dec[xrow[c].to_bits() as usize] * sf[c / npc];
            let mut sum = 0.0f64;
            for j in 0..h {
                let g = grow[j].to_f32();
                let e = swiglu_backward_element(
                    deq(j),
                    deq(h + j),
                    g,
                    w,
                    params.swiglu_clamp_value,
                    &|v| expf(i * h + j, v),
                );
                out.push(bf16_from_f32(e.out));
                grow2[j] = e.dx;
                grow2[h + j] = e.dy;
                sum += g as f64 * e.act as f64;
            }
            sums.push((p, sum as f32));
        }
        (out, sums)
    });
    let mut out = Vec::with_capacity(n * h);
    let mut weight_grad = vec![0.0f32; t * k];
    for (o, sums) in parts {
        out.extend(o);
        for (p, sum) in sums {
            if p >= 0 {
                weight_grad[p as usize] = sum;
            }
        }
    }
    Ok(SwigluBackwardGrad {
        out: HostTensor::from_vec(out, &[n, h])?,
        grad: HostTensor::from_vec(grad, &[n, 2 * h])?,
        weight_grad: HostTensor::from_vec(weight_grad, &[t, k])?,
    })
}
