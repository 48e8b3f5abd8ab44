//! `topk_gate` (`spec/moe.md` §4.3): the stable descending top-`k` of every row of a score
//! matrix.
//!
//! | argument | shape | dtype | layout |
//! |---|---|---|---|
//! | `scores` | `(T, E)`, `T >= 0`, `E >= 1` | fp32 | unit column stride, any row stride |
//! | `num_topk` (`k`) | `1 <= k <= E` | | |
//! | output `topk_idx` | `(T, k)` | i64 | contiguous |
//!
//! **Semantics.** Row `t` of the output lists the `k` best columns of `scores[t]`, best first:
//! `k` rounds of "take the maximum, the smallest index among equal maxima, and remove it". This
//! is upstream's reference `stable_topk` (a stable descending sort, first `k`).
//!
//! **Tie rule:** equal scores go to the smaller index; `-0.0` and `+0.0` are equal.
//!
//! **NaN / ±inf** ([`crate::ranking`]): `+inf` is an ordinary value. `-inf` entries are selected
//! like any value, and the indices of a row are always **distinct** (upstream's kernel can
//! repeat an index when it has to select `-inf` inputs; its reference does not — we follow the
//! reference). **NaN ranks above every number** (`+inf` included), NaNs tie with each other and
//! go to the smaller index: exactly `torch.sort(descending=True, stable=True)`, i.e. upstream's
//! reference (upstream's kernel returns garbage for NaN).
//!
//! **Limits:** none beyond the shape rules above. Upstream's kernel needs a contiguous input;
//! any row stride is accepted here. `T == 0` gives an empty `(0, k)` output.

use tk_core::{Layout, Result, TkError};

use crate::checks::{check_rank, check_unit_last_stride};

/// The parameters of `topk_gate`: just `num_topk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopkGateParams {
    /// `k`: entries selected per row, `1 <= k <= E`.
    pub num_topk: usize,
}

/// The validated geometry of one `topk_gate` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopkGateShape {
    /// `T`: rows (tokens), may be 0.
    pub num_tokens: usize,
    /// `E`: columns (experts), at least 1.
    pub num_experts: usize,
    /// `k`.
    pub num_topk: usize,
}

impl TopkGateShape {
    /// The output shape `(T, k)`.
    pub fn out_shape(&self) -> [usize; 2] {
        [self.num_tokens, self.num_topk]
    }
}

impl TopkGateParams {
    /// Parameters selecting `num_topk` entries per row.
    pub const fn new(num_topk: usize) -> Self {
        Self { num_topk }
    }

    /// Validates `scores`' layout (rank 2 `(T, E)`, `E >= 1`, unit column stride) and
    /// `1 <= num_topk <= E`. Errors: [`TkError::Shape`] / [`TkError::Empty`] /
    /// [`TkError::Stride`] naming `scores`, [`TkError::Param`] naming `num_topk`.
    pub fn validate(&self, scores: &Layout) -> Result<TopkGateShape> {
        check_rank("scores", scores, 2, "rank 2 (T, E)")?;
        let (t, e) = (scores.shape()[0], scores.shape()[1]);
        if e == 0 {
            return Err(TkError::Empty {
                arg: "scores",
                shape: scores.shape().to_vec(),
            });
        }
        check_unit_last_stride("scores", scores)?;
        if self.num_topk == 0 || self.num_topk > e {
            return Err(TkError::param(
                "num_topk",
                format!(
                    "must satisfy 1 <= num_topk <= E = {e} (scores' column count), got {}",
                    self.num_topk
                ),
            ));
        }
        Ok(TopkGateShape {
            num_tokens: t,
            num_experts: e,
            num_topk: self.num_topk,
        })
    }
}
