//! CPU references (also the CPU backend, feature `cpu`): the exact semantics of
//! `spec/moe.md` §4.2–§4.5, written for clarity rather than speed. They share their validation
//! with the GPU ops ([`TopkGateParams::validate`](crate::TopkGateParams::validate) etc.), and the
//! GPU kernels are tested against them: indices bit for bit, weights within the spec's tolerance
//! (bit for bit up to rare last-bit differences of `exp`/`log1p`, see [`crate::scoring`]).
//!
//! | function | spec | what |
//! |---|---|---|
//! | [`stable_topk`] | §4.2 | first `k` of a stable descending sort of each row (`0 <= k <= E`) |
//! | [`topk_gate`] | §4.3 | the same as an op (`1 <= k <= E`) |
//! | [`topk_sum_and_topk_group_idx`] | §4.4 | group ranking by top-1 / top-2 sums |
//! | [`top2_sum_gate`] | §4.5 | the full router |
//!
//! Deviations from upstream's *kernels* (each documented on its op): distinct indices when
//! `-inf` inputs must be selected and a total order with NaN first (both as upstream's
//! references), a 64-bit replica choice, range checks instead of out-of-bounds reads, and none
//! of the kernels' size limits.

mod top2_sum_gate;
mod topk;
mod topk_group;

pub use top2_sum_gate::{top2_sum_gate, PhysicalMap, Top2SumGateInputs, Top2SumGateOutput};
pub use topk::{stable_topk, topk_gate};
pub use topk_group::topk_sum_and_topk_group_idx;

pub(crate) use topk_group::group_score as topk_group_score;

use tk_core::{Element, HostView};

/// The `len` elements starting at multi-index `start` of a view whose last dimension has unit
/// stride (or at most one element), as a slice. `start` must be in bounds (or `len == 0`).
pub(crate) fn run<'v, T: Element>(view: &HostView<'v, T>, start: &[usize], len: usize) -> &'v [T] {
    if len == 0 {
        return &[];
    }
    let i = view.layout().index(start);
    &view.raw_data()[i..i + len]
}
