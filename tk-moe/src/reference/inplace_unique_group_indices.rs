//! `inplace_unique_group_indices` (§4.9).

use tk_core::{HostTensor, Result};

use crate::index::check_indices;
use crate::inplace_unique_group_indices::InplaceUniqueGroupIndicesParams;

/// CPU `inplace_unique_group_indices(group_indices (T, K) i64, params)` (§4.9): in every row,
/// each repeat of a value `>= 0` after its leftmost occurrence becomes `-1`. Returns the number
/// of entries changed.
///
/// Errors (the tensor is then unchanged): those of
/// [`InplaceUniqueGroupIndicesParams::validate`], and [`tk_core::TkError::Param`] naming
/// `group_indices` for an entry other than `-1` or `0..G`.
pub fn inplace_unique_group_indices(
    group_indices: &mut HostTensor<i64>,
    params: &InplaceUniqueGroupIndicesParams,
) -> Result<usize> {
    let view = group_indices.view();
    let (_, k) = params.validate(view.layout())?;
    let g = params.num_groups;
    check_indices(
        "group_indices",
        &view,
        g,
        &format!("a group id in 0..G = {g}"),
    )?;
    let mut changed = 0;
    if k == 0 {
        return Ok(0);
    }
    for r in group_indices.as_mut_slice().chunks_mut(k) {
        let mut seen = [false; crate::inplace_unique_group_indices::MAX_GROUPS];
        for v in r.iter_mut() {
            if *v < 0 {
                continue;
            }
            if seen[*v as usize] {
                *v = -1;
                changed += 1;
            } else {
                seen[*v as usize] = true;
            }
        }
    }
    Ok(changed)
}
