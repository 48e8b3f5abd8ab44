//! CPU references (also the CPU backend, feature `cpu`): the exact semantics of
//! `spec/moe.md` §4.6–§4.14, written for clarity rather than speed. They share their validation
//! with the GPU ops (each op's `*Params::validate`), check every index input against the
//! contract of [`crate::index`] before writing anything, and are what the GPU kernels are
//! tested against, bit for bit.
//!
//! | function | spec | what |
//! |---|---|---|
//! | [`get_fused_mapping`] | §4.11 | token → expert-major layout and all its maps ([`FusedMapping`]) |
//! | [`expand_to_fused`] | §4.12 | copy token rows into the fused buffer, other rows zero |
//! | [`expand_to_fused_with_sf`] | §4.13 | the same for quantized data and its scale factors ([`FusedWithSf`]) |
//! | [`reduce_fused`], [`reduce_fused_e4m3`] | §4.14 | weighted FMA gather-reduce back to tokens ([`ReduceFusedInputs`]) |
//! | [`normalize_weight`] | §4.10 | `w / (1e-20 + Σ w)` ([`NormalizedWeights`]) |
//! | [`group_count`] | §4.7 | histogram of ids |
//! | [`aux_fi`] | §4.6 | `f_e = c_e·E / (T·num_aux_topk)`, deterministic |
//! | [`inplace_unique_group_indices`] | §4.9 | per-row dedupe, leftmost kept |
//! | [`mask_indices_by_tp`] | §4.8 | EP/TP masking and renumbering |

mod aux_fi;
mod expand_to_fused;
mod expand_to_fused_with_sf;
mod get_fused_mapping;
mod group_count;
mod inplace_unique_group_indices;
mod mask_indices_by_tp;
mod normalize_weight;
mod reduce_fused;

pub use aux_fi::aux_fi;
pub use expand_to_fused::expand_to_fused;
pub use expand_to_fused_with_sf::{expand_to_fused_with_sf, FusedWithSf};
pub use get_fused_mapping::{get_fused_mapping, FusedMapping};
pub use group_count::group_count;
pub use inplace_unique_group_indices::inplace_unique_group_indices;
pub use mask_indices_by_tp::mask_indices_by_tp;
pub use normalize_weight::{normalize_weight, NormalizedWeights};
pub use reduce_fused::{reduce_fused, reduce_fused_e4m3, ReduceFusedInputs};

use tk_core::{Element, HostView};

/// Row `r` (`len` elements) of a rank-2 view whose last dimension has unit stride (or at most
/// one element), as a slice. `r` must be in bounds (or `len == 0`).
pub(crate) fn row<'v, T: Element>(view: &HostView<'v, T>, r: usize, len: usize) -> &'v [T] {
    if len == 0 {
        return &[];
    }
    let i = view.layout().index(&[r, 0]);
    &view.raw_data()[i..i + len]
}

/// Element `i` of a rank-1 view.
pub(crate) fn elem<T: Element>(view: &HostView<'_, T>, i: usize) -> T {
    view.raw_data()[view.layout().index(&[i])]
}
