//! `normalize_weight` (`spec/moe.md` §4.10, §5.5): divide each token's top-k weights by their
//! sum.
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `topk_weights` | `(T, K)` | fp32 | unit last stride, any row stride; `K = 0` allowed |
//! | output `denominator` | `(T,)` | fp32 | contiguous |
//! | output `normalized_weights` | `(T, K)` | fp32 | contiguous |
//!
//! **Semantics (bit-exact).** `den_t = ((fp32(1e-20) + w[t,0]) + w[t,1]) + … + w[t,K-1]`:
//! sequential fp32 additions in slot order starting from `fp32(1e-20)` ([`DENOMINATOR_EPS`],
//! the convention of `top2_sum_gate`), then `normalized[t,k] = w[t,k] / den_t`, one correctly
//! rounded fp32 division. Weights are not checked (negative, infinite or NaN weights propagate
//! by IEEE rules). Identical to upstream's kernel and reference.

use tk_core::{Layout, Result};

use crate::checks::check_matrix;

/// `1e-20` as fp32: the first term of every denominator.
pub const DENOMINATOR_EPS: f32 = 1e-20;

/// The parameters of `normalize_weight` (there are none besides the tensor).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NormalizeWeightParams;

impl NormalizeWeightParams {
    /// Validates `topk_weights` (rank 2 `(T, K)`, unit last stride) and returns `(T, K)`.
    ///
    /// Errors: [`tk_core::TkError::Shape`] / [`tk_core::TkError::Stride`] naming `topk_weights`.
    pub fn validate(&self, topk_weights: &Layout) -> Result<(usize, usize)> {
        check_matrix("topk_weights", topk_weights, "rank 2 (T, K)")
    }
}
