//! `aux_fi` (`spec/moe.md` §4.6, §5.19): the per-expert load fraction `f_i` of the MoE
//! load-balancing loss.
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `topk_idx` | `(T, K)` | i64 | unit last stride, any row stride; entries `-1` or in `0..E` |
//! | `num_experts` (`E`) | `>= 1` | | |
//! | `num_aux_topk` | `>= 1` | | normaliser only |
//! | output `f` | `(E,)` | fp32 | contiguous |
//!
//! **Semantics (ours: exact, deterministic, bit-exact run to run).** With `c_e` the number of
//! entries equal to `e` (counted exactly, `-1` skipped):
//!
//! ```text
//! f[e] = fp32(c_e · E) / fp32(T · num_aux_topk)
//! ```
//!
//! The two integer products are exact (64-bit), each converted to fp32 once (RNE), then one
//! correctly rounded fp32 division. `T == 0` gives all zeros (no division).
//!
//! **Deviation from upstream.** Upstream's kernel adds one such quotient *per block* with fp32
//! atomics, so its result depends on the SM count and the atomics' order and is not
//! reproducible; its reference computes `float(c_e) · E`, then divides by `T · num_aux_topk`
//! in fp32 with torch's rounding. Ours is upstream's per-block formula applied once to the
//! global count: no order dependence at all, and within the spec's tolerance
//! (`calc_diff < 2e-7`) of both. GPU kernels must count exactly first (integer atomics) and
//! apply the formula once, so they match this reference bit for bit whatever the grid.
//!
//! **Index contract** ([`crate::index`]): the CPU rejects illegal entries
//! ([`TkError::Param`] naming `topk_idx`), the GPU skips them.

use tk_core::{Layout, Result, TkError};

use crate::checks::check_matrix;

/// The parameters of `aux_fi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuxFiParams {
    /// `E`, `>= 1`.
    pub num_experts: usize,
    /// The normaliser `num_aux_topk`, `>= 1`.
    pub num_aux_topk: usize,
}

impl AuxFiParams {
    /// Parameters for `E` experts and normaliser `num_aux_topk`.
    pub const fn new(num_experts: usize, num_aux_topk: usize) -> Self {
        Self {
            num_experts,
            num_aux_topk,
        }
    }

    /// The value of one expert: `fp32(count·E) / fp32(T·num_aux_topk)`, or `0.0` when
    /// `num_tokens == 0` (module docs).
    pub fn fraction(&self, count: u64, num_tokens: usize) -> f32 {
        if num_tokens == 0 {
            return 0.0;
        }
        let num = count as u128 * self.num_experts as u128;
        let den = num_tokens as u128 * self.num_aux_topk as u128;
        // u128 → f32 is one round-to-nearest-even conversion.
        num as f32 / den as f32
    }

    /// Validates `topk_idx` (rank 2 `(T, K)`, unit last stride), `num_experts >= 1` and
    /// `num_aux_topk >= 1`; returns `(T, K)`.
    ///
    /// Errors: [`TkError::Shape`] / [`TkError::Stride`] naming `topk_idx`, [`TkError::Param`]
    /// naming `num_experts` or `num_aux_topk`.
    pub fn validate(&self, topk_idx: &Layout) -> Result<(usize, usize)> {
        let tk = check_matrix("topk_idx", topk_idx, "rank 2 (T, K)")?;
        if self.num_experts == 0 {
            return Err(TkError::param("num_experts", "must be >= 1, got 0"));
        }
        if self.num_aux_topk == 0 {
            return Err(TkError::param("num_aux_topk", "must be >= 1, got 0"));
        }
        Ok(tk)
    }
}
