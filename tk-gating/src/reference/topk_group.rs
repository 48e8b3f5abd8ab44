//! `topk_sum_and_topk_group_idx` (§4.4).

use tk_core::{HostTensor, HostView, Result};

use super::run;
use crate::ranking::{stable_topk_indices, top1, top2};
use crate::topk_sum_and_topk_group_idx::TopkSumAndTopkGroupIdxParams;

/// CPU `topk_sum_and_topk_group_idx(scores (T, G, P), params) -> (T, Gk)` i64 (§4.4). See
/// [`crate::topk_sum_and_topk_group_idx`](mod@crate::topk_sum_and_topk_group_idx) for the semantics, the tie rule and the NaN / inf
/// behaviour.
///
/// Errors: those of [`TopkSumAndTopkGroupIdxParams::validate`].
pub fn topk_sum_and_topk_group_idx(
    scores: &HostView<'_, f32>,
    params: &TopkSumAndTopkGroupIdxParams,
) -> Result<HostTensor<i64>> {
    let shape = params.validate(scores.layout())?;
    let (t, g, p, gk) = (
        shape.num_tokens,
        shape.num_groups,
        shape.group_size,
        shape.num_topk_groups,
    );
    let mut out = Vec::with_capacity(t * gk);
    let mut group_scores = vec![0.0f32; g];
    for row in 0..t {
        for (q, gs) in group_scores.iter_mut().enumerate() {
            *gs = group_score(run(scores, &[row, q, 0], p), shape.num_topk_sum);
        }
        out.extend(
            stable_topk_indices(&group_scores, gk)
                .into_iter()
                .map(|q| q as i64),
        );
    }
    HostTensor::from_vec(out, &[t, gk])
}

/// The score of one group: its largest key (`n == 1`) or `top1 + top2` of the multiset
/// (`n == 2`, one fp32 addition). `group` has at least `n` keys.
pub(crate) fn group_score(group: &[f32], n: usize) -> f32 {
    if n == 1 {
        top1(group.iter().copied()).unwrap_or(f32::NEG_INFINITY)
    } else {
        top2(group.iter().copied()).map_or(f32::NEG_INFINITY, |(a, b)| a + b)
    }
}
