//! `group_count` (§4.7).

use tk_core::{HostTensor, HostView, Result};

use super::row;
use crate::group_count::GroupCountParams;
use crate::index::check_indices;

/// Exact counts of every id in `0..upper` (entries already checked).
pub(crate) fn histogram(idx: &HostView<'_, i64>, t: usize, k: usize, upper: usize) -> Vec<u64> {
    let mut counts = vec![0u64; upper];
    for r in 0..t {
        for &v in row(idx, r, k) {
            if v >= 0 {
                counts[v as usize] += 1;
            }
        }
    }
    counts
}

/// CPU `group_count(group_idx (T, K) i64, params) -> (G,)` i32 (§4.7): the number of entries
/// equal to each id, `-1` skipped.
///
/// Errors: those of [`GroupCountParams::validate`], and [`tk_core::TkError::Param`] naming
/// `group_idx` for an entry other than `-1` or `0..G`.
pub fn group_count(
    group_idx: &HostView<'_, i64>,
    params: &GroupCountParams,
) -> Result<HostTensor<i32>> {
    let (t, k) = params.validate(group_idx.layout())?;
    let g = params.num_groups;
    check_indices(
        "group_idx",
        group_idx,
        g,
        &format!("a group id in 0..G = {g}"),
    )?;
    let counts = histogram(group_idx, t, k, g);
    // Counts are <= T·K <= i32::MAX (validated).
    HostTensor::from_vec(counts.into_iter().map(|c| c as i32).collect(), &[g])
}
