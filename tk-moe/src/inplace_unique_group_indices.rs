//! `inplace_unique_group_indices` (`spec/moe.md` §4.9, §5.11, §5.12): remove repeated group ids
//! from each token's row, in place.
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `group_indices` | `(T, K)` | i64 | contiguous, modified in place; entries `-1` or in `0..G` |
//! | `num_groups` (`G`) | `1 <= G <=` [`MAX_GROUPS`] | | |
//!
//! **Semantics.** Per row, scan the slots left to right; a value `>= 0` that already appeared in
//! an earlier slot of the row becomes `-1`. **The leftmost occurrence is kept**; `-1` is never
//! changed and never counts as seen. The op reports how many entries it changed.
//!
//! **Index contract** ([`crate::index`]). Upstream's kernel device-asserts `v < align(G, 64)`
//! and leaves other negative values untouched (its reference instead dedupes repeated negative
//! values too). Here entries must be `-1` or in `0..G`: the CPU checks the whole tensor first and
//! returns [`TkError::Param`] naming `group_indices` **without modifying it**; the GPU reads
//! (and writes back) illegal entries as `-1`.

use tk_core::{Layout, Result, TkError};

use crate::checks::check_matrix;

/// The largest `num_groups` (two 64-bit seen-masks per row upstream).
pub const MAX_GROUPS: usize = 128;

/// The parameters of `inplace_unique_group_indices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InplaceUniqueGroupIndicesParams {
    /// `G`, `1..=`[`MAX_GROUPS`].
    pub num_groups: usize,
}

impl InplaceUniqueGroupIndicesParams {
    /// Parameters for ids in `0..num_groups`.
    pub const fn new(num_groups: usize) -> Self {
        Self { num_groups }
    }

    /// Validates `group_indices` (rank 2 `(T, K)`, unit last stride) and
    /// `1 <= num_groups <= 128`; returns `(T, K)`.
    ///
    /// Errors: [`TkError::Shape`] / [`TkError::Stride`] naming `group_indices`,
    /// [`TkError::Param`] naming `num_groups`.
    pub fn validate(&self, group_indices: &Layout) -> Result<(usize, usize)> {
        let tk = check_matrix("group_indices", group_indices, "rank 2 (T, K)")?;
        if self.num_groups == 0 || self.num_groups > MAX_GROUPS {
            return Err(TkError::param(
                "num_groups",
                format!(
                    "must satisfy 1 <= num_groups <= {MAX_GROUPS}, got {}",
                    self.num_groups
                ),
            ));
        }
        Ok(tk)
    }
}
