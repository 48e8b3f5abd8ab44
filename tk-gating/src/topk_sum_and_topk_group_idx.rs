//! `topk_sum_and_topk_group_idx` (`spec/moe.md` §4.4): rank the expert groups of every token by
//! the sum of their top-1 or top-2 scores and return the best `Gk` group indices.
//!
//! | argument | shape | dtype | layout |
//! |---|---|---|---|
//! | `scores` | `(T, G, P)`, `T >= 0`, `G >= 1`, `P >= 1` (`P` experts per group) | fp32 | unit stride along `P`, any other strides |
//! | `num_topk_sum` | `1` or `2`, and `<= P` | | |
//! | `num_topk_groups` (`Gk`) | `1 <= Gk <= G` | | |
//! | output | `(T, Gk)` | i64 | contiguous |
//!
//! **Semantics**, per token:
//! 1. group score `g_q` = the largest score of group `q` (`num_topk_sum = 1`), or `top1 + top2`
//!    (`num_topk_sum = 2`), the two largest of the group *as a multiset* — a duplicated maximum
//!    counts twice (`[5, 5, 1]` scores 10) — added in one fp32 addition;
//! 2. the `Gk` best groups by `g`, best first.
//!
//! **Tie rule:** equal group scores go to the smaller group index (also inside a group, which
//! does not change the values found).
//!
//! **NaN / ±inf** ([`crate::ranking`]): NaN ranks above every number, both inside a group (a
//! group holding a NaN scores NaN) and between groups (NaN groups come first, by index). This is
//! upstream's reference (`torch.topk` values summed, then `stable_topk`); upstream's kernel
//! returns garbage for NaN. `±inf` are ordinary values, with IEEE sums: a group whose top-2 is
//! `(+inf, -inf)` scores NaN and therefore ranks first — again as the reference.
//!
//! **Limits:** `num_topk_sum ∈ {1, 2}` is kept (for more terms the fp32 summation order would
//! become part of the contract, and no model uses it). Upstream's kernel limit `G <= 32` (one
//! lane per group) is lifted: any `G` and `P` work. The contiguity requirement is relaxed to a
//! unit stride along `P`. `T == 0` gives an empty `(0, Gk)` output.

use tk_core::{Layout, Result, TkError};

use crate::checks::{check_rank, check_unit_last_stride};

/// The parameters of `topk_sum_and_topk_group_idx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopkSumAndTopkGroupIdxParams {
    /// How many of a group's best scores are summed: 1 or 2 (and at most `P`).
    pub num_topk_sum: usize,
    /// `Gk`: groups returned per token, `1 <= Gk <= G`.
    pub num_topk_groups: usize,
}

/// The validated geometry of one `topk_sum_and_topk_group_idx` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopkGroupShape {
    /// `T`: tokens, may be 0.
    pub num_tokens: usize,
    /// `G`: groups per token.
    pub num_groups: usize,
    /// `P`: experts per group.
    pub group_size: usize,
    /// 1 or 2.
    pub num_topk_sum: usize,
    /// `Gk`.
    pub num_topk_groups: usize,
}

impl TopkGroupShape {
    /// The output shape `(T, Gk)`.
    pub fn out_shape(&self) -> [usize; 2] {
        [self.num_tokens, self.num_topk_groups]
    }
}

impl TopkSumAndTopkGroupIdxParams {
    /// Parameters summing the top `num_topk_sum` scores of each group and keeping
    /// `num_topk_groups` groups.
    pub const fn new(num_topk_sum: usize, num_topk_groups: usize) -> Self {
        Self {
            num_topk_sum,
            num_topk_groups,
        }
    }

    /// Validates `scores`' layout (rank 3 `(T, G, P)`, `G, P >= 1`, unit stride along `P`) and
    /// the parameters. Errors: [`TkError::Shape`] / [`TkError::Empty`] / [`TkError::Stride`]
    /// naming `scores`; [`TkError::Param`] naming `num_topk_sum` or `num_topk_groups`.
    pub fn validate(&self, scores: &Layout) -> Result<TopkGroupShape> {
        check_rank("scores", scores, 3, "rank 3 (T, G, P)")?;
        let (t, g, p) = (scores.shape()[0], scores.shape()[1], scores.shape()[2]);
        if g == 0 || p == 0 {
            return Err(TkError::Empty {
                arg: "scores",
                shape: scores.shape().to_vec(),
            });
        }
        check_unit_last_stride("scores", scores)?;
        if !(1..=2).contains(&self.num_topk_sum) || self.num_topk_sum > p {
            return Err(TkError::param(
                "num_topk_sum",
                format!(
                    "must be 1 or 2 and at most P = {p} (experts per group), got {}",
                    self.num_topk_sum
                ),
            ));
        }
        if self.num_topk_groups == 0 || self.num_topk_groups > g {
            return Err(TkError::param(
                "num_topk_groups",
                format!(
                    "must satisfy 1 <= num_topk_groups <= G = {g}, got {}",
                    self.num_topk_groups
                ),
            ));
        }
        Ok(TopkGroupShape {
            num_tokens: t,
            num_groups: g,
            group_size: p,
            num_topk_sum: self.num_topk_sum,
            num_topk_groups: self.num_topk_groups,
        })
    }
}
