//! `normalize_weight` (§4.10).

use tk_core::{HostTensor, HostView, Result};

use super::row;
use crate::normalize_weight::{NormalizeWeightParams, DENOMINATOR_EPS};

/// The outputs of [`normalize_weight`].
#[derive(Debug, Clone, PartialEq)]
pub struct NormalizedWeights {
    /// `(T,)`: `1e-20 + Σ_k w[t, k]`, summed in slot order.
    pub denominator: HostTensor<f32>,
    /// `(T, K)`: `w[t, k] / denominator[t]`.
    pub normalized_weights: HostTensor<f32>,
}

/// CPU `normalize_weight(topk_weights (T, K)) -> (denominator (T,), normalized (T, K))`
/// (§4.10), bit-exact: see [`crate::normalize_weight`](mod@crate::normalize_weight).
///
/// Errors: those of [`NormalizeWeightParams::validate`].
pub fn normalize_weight(topk_weights: &HostView<'_, f32>) -> Result<NormalizedWeights> {
    let (t, k) = NormalizeWeightParams.validate(topk_weights.layout())?;
    let mut den = Vec::with_capacity(t);
    let mut out = Vec::with_capacity(t * k);
    for r in 0..t {
        let w = row(topk_weights, r, k);
        let d = w.iter().fold(DENOMINATOR_EPS, |acc, &x| acc + x);
        den.push(d);
        out.extend(w.iter().map(|&x| x / d));
    }
    Ok(NormalizedWeights {
        denominator: HostTensor::from_vec(den, &[t])?,
        normalized_weights: HostTensor::from_vec(out, &[t, k])?,
    })
}
