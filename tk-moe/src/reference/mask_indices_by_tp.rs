//! `mask_indices_by_tp` (§4.8).

use tk_core::{HostTensor, HostView, Result};

use super::row;
use crate::index::{check_indices, IndexElement};
use crate::mask_indices_by_tp::MaskIndicesByTpParams;

/// CPU `mask_indices_by_tp(indices (T, K), params) -> (T, K)` of the same integer type
/// (§4.8): [`MaskIndicesByTpParams::mask`] element-wise.
///
/// Errors: those of [`MaskIndicesByTpParams::validate`], and [`tk_core::TkError::Param`] naming
/// `indices` for an entry other than `-1` or `0..n`.
pub fn mask_indices_by_tp<I: IndexElement>(
    indices: &HostView<'_, I>,
    params: &MaskIndicesByTpParams,
) -> Result<HostTensor<I>> {
    let (t, k) = params.validate(indices.layout())?;
    let n = params.num_experts;
    check_indices(
        "indices",
        indices,
        n,
        &format!("an expert id in 0..n = {n}"),
    )?;
    let mut out = Vec::with_capacity(t * k);
    for r in 0..t {
        out.extend(
            row(indices, r, k)
                .iter()
                .map(|&v| I::from_i64_lossy(params.mask(v.to_i64()))),
        );
    }
    HostTensor::from_vec(out, &[t, k])
}
