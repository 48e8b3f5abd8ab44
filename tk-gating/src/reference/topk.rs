//! `stable_topk` (§4.2) and `topk_gate` (§4.3).

use tk_core::{HostTensor, HostView, Result, TkError};

use super::run;
use crate::ranking::stable_topk_indices;
use crate::topk_gate::TopkGateParams;

/// `stable_topk(scores (T, E), k) -> (T, k)` i64 (§4.2): the first `k` indices of a stable
/// descending sort of every row, best first, in the order of [`crate::ranking`] (ties to the
/// smaller index, NaN first, distinct indices). `0 <= k <= E`; `scores` needs a unit column
/// stride (any row stride).
///
/// Errors: [`TkError::Shape`] / [`TkError::Stride`] naming `scores`, [`TkError::Param`] naming
/// `k`.
pub fn stable_topk(scores: &HostView<'_, f32>, k: usize) -> Result<HostTensor<i64>> {
    if k == 0 {
        // Validate the layout as for k = 1 (when there is a column), then return (T, 0).
        crate::checks::check_rank("scores", scores.layout(), 2, "rank 2 (T, E)")?;
        crate::checks::check_unit_last_stride("scores", scores.layout())?;
        return HostTensor::from_vec(Vec::new(), &[scores.shape()[0], 0]);
    }
    let shape = TopkGateParams::new(k)
        .validate(scores.layout())
        .map_err(|e| match e {
            TkError::Param { msg, .. } => TkError::Param { arg: "k", msg },
            e => e,
        })?;
    select_rows(scores, shape.num_tokens, shape.num_experts, k)
}

/// CPU `topk_gate(scores (T, E), params) -> topk_idx (T, k)` i64 (§4.3). See
/// [`crate::topk_gate`](mod@crate::topk_gate) for the semantics, the tie rule and the NaN / `-inf` behaviour.
///
/// Errors: those of [`TopkGateParams::validate`].
pub fn topk_gate(scores: &HostView<'_, f32>, params: &TopkGateParams) -> Result<HostTensor<i64>> {
    let shape = params.validate(scores.layout())?;
    select_rows(scores, shape.num_tokens, shape.num_experts, shape.num_topk)
}

fn select_rows(
    scores: &HostView<'_, f32>,
    t: usize,
    e: usize,
    k: usize,
) -> Result<HostTensor<i64>> {
    let mut out = Vec::with_capacity(t * k);
    for row in 0..t {
        let keys = run(scores, &[row, 0], e);
        out.extend(stable_topk_indices(keys, k).into_iter().map(|i| i as i64));
    }
    HostTensor::from_vec(out, &[t, k])
}
