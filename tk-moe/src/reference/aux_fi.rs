//! `aux_fi` (§4.6).

use tk_core::{HostTensor, HostView, Result};

use super::group_count::histogram;
use crate::aux_fi::AuxFiParams;
use crate::index::check_indices;

/// CPU `aux_fi(topk_idx (T, K) i64, params) -> f (E,)` fp32 (§4.6): exact counts, then
/// `fp32(c_e·E) / fp32(T·num_aux_topk)` ([`AuxFiParams::fraction`]); deterministic and
/// bit-exact run to run.
///
/// Errors: those of [`AuxFiParams::validate`], and [`tk_core::TkError::Param`] naming
/// `topk_idx` for an entry other than `-1` or `0..E`.
pub fn aux_fi(topk_idx: &HostView<'_, i64>, params: &AuxFiParams) -> Result<HostTensor<f32>> {
    let (t, k) = params.validate(topk_idx.layout())?;
    let e = params.num_experts;
    check_indices(
        "topk_idx",
        topk_idx,
        e,
        &format!("an expert id in 0..E = {e}"),
    )?;
    let f = histogram(topk_idx, t, k, e)
        .into_iter()
        .map(|c| params.fraction(c, t))
        .collect();
    HostTensor::from_vec(f, &[e])
}
