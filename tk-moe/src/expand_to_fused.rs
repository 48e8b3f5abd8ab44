//! `expand_to_fused` (`spec/moe.md` §4.12, §5.14, §5.17): copy every token's row to each of its
//! fused rows (token-major → expert-major).
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `x` | `(T, H)` | any element type (bit copy; tests use bf16) | unit last stride, any row stride |
//! | `token_topk_to_pos` | `(T, K)`, `K >= 1` | i32 | unit last stride; entries `-1` or in `0..M`, no two equal |
//! | `pos_to_expert` | `(M,)` | i32 | any stride; `< 0` marks a padding row |
//! | output `out` | `(M, H)` | as `x` | contiguous |
//!
//! **Semantics.** `out[p, :] = x[t, :]` (a bit copy) for every slot with
//! `p = token_topk_to_pos[t, k] >= 0`, and **every other row is zero** (all-zero bits). This is
//! upstream's reference. Upstream's kernel zero-fills only the rows with `pos_to_expert < 0`,
//! leaves a row with `pos_to_expert >= 0` that no slot targets uninitialised, and is not launched
//! at all for `T == 0` (so an `M > 0` output is entirely uninitialised): **we always zero-fill**
//! (§5.17), so the output is fully defined whatever the mapping. With mappings from
//! `get_fused_mapping` both agree.
//!
//! **Contract** (checked in full on the CPU before anything is written, each a
//! [`TkError::Param`] naming `token_topk_to_pos`):
//! * entries are `-1` or in `0..M` ([`crate::index`]; the GPU reads illegal entries as `-1`);
//! * no two slots target the same row (upstream: "positions must not collide"; on the GPU a
//!   collision leaves one of the colliding rows, unspecified which, never anything else);
//! * a targeted row must not be a padding row (`pos_to_expert[p] >= 0`): upstream's kernel
//!   would zero it and copy into it concurrently. (On the GPU the copy wins.)
//!
//! `pos_to_expert`'s values are otherwise unused: its length is `M`.

use tk_core::{Layout, Result, TkError};

use crate::checks::{check_matrix, check_rank};

/// The parameters of `expand_to_fused` (there are none besides the tensors).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpandToFusedParams;

/// The validated geometry of one `expand_to_fused` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpandShape {
    /// `T`.
    pub num_tokens: usize,
    /// `K`.
    pub num_topk: usize,
    /// Stored columns of `x` (`H`, or `H/2` bytes for packed FP4).
    pub columns: usize,
    /// `M`: rows of the fused buffer.
    pub num_rows: usize,
}

impl ExpandShape {
    /// The output shape `(M, columns)`.
    pub fn out_shape(&self) -> [usize; 2] {
        [self.num_rows, self.columns]
    }
}

/// Validates the three layouts shared by both expand ops.
pub(crate) fn validate_expand(
    x_arg: &'static str,
    x: &Layout,
    token_topk_to_pos: &Layout,
    pos_to_expert: &Layout,
) -> Result<ExpandShape> {
    let (t, h) = check_matrix(x_arg, x, "rank 2 (T, H)")?;
    let (t2, k) = check_matrix("token_topk_to_pos", token_topk_to_pos, "rank 2 (T, K)")?;
    if t2 != t {
        return Err(TkError::Shape {
            arg: "token_topk_to_pos",
            expected: format!("(T, K) with T = {t} ({x_arg}'s row count)"),
            got: token_topk_to_pos.shape().to_vec(),
        });
    }
    if k == 0 {
        return Err(TkError::Empty {
            arg: "token_topk_to_pos",
            shape: token_topk_to_pos.shape().to_vec(),
        });
    }
    check_rank("pos_to_expert", pos_to_expert, 1, "rank 1 (M,)")?;
    let m = pos_to_expert.shape()[0];
    if m > i32::MAX as usize {
        return Err(TkError::Shape {
            arg: "pos_to_expert",
            expected: format!("(M,) with M <= {} (positions are int32)", i32::MAX),
            got: vec![m],
        });
    }
    Ok(ExpandShape {
        num_tokens: t,
        num_topk: k,
        columns: h,
        num_rows: m,
    })
}

impl ExpandToFusedParams {
    /// Validates the layouts: `x (T, H)` and `token_topk_to_pos (T, K)` with unit last strides
    /// and the same `T`, `K >= 1`, `pos_to_expert (M,)` with `M <= i32::MAX`. The entries are
    /// checked by the op (module docs).
    ///
    /// Errors: [`TkError::Shape`] / [`TkError::Stride`] / [`TkError::Empty`] naming the tensor.
    pub fn validate(
        &self,
        x: &Layout,
        token_topk_to_pos: &Layout,
        pos_to_expert: &Layout,
    ) -> Result<ExpandShape> {
        validate_expand("x", x, token_topk_to_pos, pos_to_expert)
    }
}
