//! `expand_to_fused` (§4.12).

use tk_core::{Element, HostTensor, HostView, Result, TkError};

use super::{elem, row};
use crate::expand_to_fused::ExpandToFusedParams;
use crate::index::check_indices;

/// For every fused row, the token copied into it (`None`: a zero row), after checking the
/// contract of [`crate::expand_to_fused`](mod@crate::expand_to_fused): entries `-1` or in `0..M`, no collision, no targeted
/// padding row. Errors are [`TkError::Param`] naming `token_topk_to_pos`.
pub(crate) fn row_sources(
    token_topk_to_pos: &HostView<'_, i32>,
    pos_to_expert: &HostView<'_, i32>,
    num_tokens: usize,
    num_topk: usize,
    num_rows: usize,
) -> Result<Vec<Option<usize>>> {
    check_indices(
        "token_topk_to_pos",
        token_topk_to_pos,
        num_rows,
        &format!("a fused row in 0..M = {num_rows}"),
    )?;
    let mut src: Vec<Option<(usize, usize)>> = vec![None; num_rows];
    for t in 0..num_tokens {
        for (k, &p) in row(token_topk_to_pos, t, num_topk).iter().enumerate() {
            if p < 0 {
                continue;
            }
            let p = p as usize;
            if let Some((t0, k0)) = src[p] {
                return Err(TkError::param(
                    "token_topk_to_pos",
                    format!("entries [{t0}, {k0}] and [{t}, {k}] both target fused row {p} (positions must not collide)"),
                ));
            }
            let e = elem(pos_to_expert, p);
            if e < 0 {
                return Err(TkError::param(
                    "token_topk_to_pos",
                    format!("entry [{t}, {k}] targets fused row {p}, a padding row (pos_to_expert[{p}] = {e})"),
                ));
            }
            src[p] = Some((t, k));
        }
    }
    Ok(src.into_iter().map(|s| s.map(|(t, _)| t)).collect())
}

/// Copies row `src[p]` of `x` (`cols` elements) into row `p` of a zero `(M, cols)` tensor.
pub(crate) fn scatter_rows<T: Element>(
    x: &HostView<'_, T>,
    src: &[Option<usize>],
    cols: usize,
) -> Result<HostTensor<T>> {
    let zero = T::from_bits_u64(0);
    let mut out = vec![zero; src.len() * cols];
    if cols > 0 {
        for (dst, s) in out.chunks_mut(cols).zip(src) {
            if let Some(t) = *s {
                dst.copy_from_slice(row(x, t, cols));
            }
        }
    }
    HostTensor::from_vec(out, &[src.len(), cols])
}

/// CPU `expand_to_fused(x (T, H), token_topk_to_pos (T, K), pos_to_expert (M,)) -> (M, H)`
/// (§4.12): bit copies of token rows into their fused rows; every other row is all-zero bits.
///
/// Errors: those of [`ExpandToFusedParams::validate`], and [`TkError::Param`] naming
/// `token_topk_to_pos` for an illegal entry, a collision or a targeted padding row (checked
/// before anything is written).
pub fn expand_to_fused<T: Element>(
    x: &HostView<'_, T>,
    token_topk_to_pos: &HostView<'_, i32>,
    pos_to_expert: &HostView<'_, i32>,
) -> Result<HostTensor<T>> {
    let shape = ExpandToFusedParams.validate(
        x.layout(),
        token_topk_to_pos.layout(),
        pos_to_expert.layout(),
    )?;
    let src = row_sources(
        token_topk_to_pos,
        pos_to_expert,
        shape.num_tokens,
        shape.num_topk,
        shape.num_rows,
    )?;
    scatter_rows(x, &src, shape.columns)
}
