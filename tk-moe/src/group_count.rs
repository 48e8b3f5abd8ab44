//! `group_count` (`spec/moe.md` §4.7): a histogram of group (or expert) ids.
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `group_idx` | `(T, K)`, `T·K <= i32::MAX` | i64 | unit last stride, any row stride; entries `-1` or in `0..G` |
//! | `num_groups` (`G`) | `>= 1` | | |
//! | output | `(G,)` | i32 | contiguous |
//!
//! **Semantics (exact).** `out[g]` = number of entries equal to `g`; every entry counts (a row
//! listing an id twice counts it twice); `-1` entries are skipped. `T == 0` gives zeros.
//!
//! **Index contract** ([`crate::index`]): upstream device-asserts `-1 <= v < G`; the CPU returns
//! [`tk_core::TkError::Param`] naming `group_idx`, the GPU skips illegal entries (reads them as
//! `-1`).

use tk_core::{Layout, Result, TkError};

use crate::checks::{check_flat_fits_i32, check_matrix};

/// The parameters of `group_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCountParams {
    /// `G`: the number of bins, `>= 1`.
    pub num_groups: usize,
}

impl GroupCountParams {
    /// Parameters counting into `num_groups` bins.
    pub const fn new(num_groups: usize) -> Self {
        Self { num_groups }
    }

    /// Validates `group_idx` (rank 2 `(T, K)`, unit last stride, `T·K <= i32::MAX` so that
    /// every count fits in int32) and `num_groups >= 1`; returns `(T, K)`.
    ///
    /// Errors: [`TkError::Shape`] / [`TkError::Stride`] naming `group_idx`, [`TkError::Param`]
    /// naming `num_groups`.
    pub fn validate(&self, group_idx: &Layout) -> Result<(usize, usize)> {
        let (t, k) = check_matrix("group_idx", group_idx, "rank 2 (T, K)")?;
        check_flat_fits_i32("group_idx", t, k)?;
        if self.num_groups == 0 {
            return Err(TkError::param("num_groups", "must be >= 1, got 0"));
        }
        Ok((t, k))
    }
}
