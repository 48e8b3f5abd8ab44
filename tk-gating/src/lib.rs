//! # tk-gating
//!
//! MoE gating of tile-kernels (`spec/moe.md` §4.1–§4.5): scoring functions, the stable top-k
//! gate, group ranking by top-1/top-2 sums, and the full router `top2_sum_gate` (bias,
//! group-limited routing, routed scaling, shared experts as routed slots, the logical →
//! physical expert map, EP/TP masking, token masks and fix routing).
//!
//! **Backends.** The GPU ops (feature `cuda`, default): [`topk_gate()`], [`topk_sum_and_topk_group_idx()`]
//! and [`top2_sum_gate()`] with `*_into` forms writing caller-provided outputs; kernels compiled
//! at run time for the exact shape (NVRTC), listed by [`registered_kernels`], compiled ahead by
//! [`prewarm`]; they never synchronise with the host. The CPU references
//! ([`reference`](mod@reference), feature `cpu`, default) are the correctness argument and the
//! CPU backend: the GPU tests compare with them — indices bit for bit, weights within the spec's
//! tolerance (they agree bit for bit in practice, see [`top2_sum_gate`](mod@top2_sum_gate)).
//!
//! | module | contents |
//! |---|---|
//! | [`scoring`] | [`ScoringFunc`] and the exact fp32 formulas (sigmoid, softplus, sqrt-softplus, softmax with the kernel's summation order) |
//! | [`ranking`] | the one selection order: higher key first, then lower index; NaN first; distinct indices |
//! | [`topk_gate`](mod@topk_gate) | [`TopkGateParams`]: top-`k` of a score matrix; the GPU op |
//! | [`topk_sum_and_topk_group_idx`](mod@topk_sum_and_topk_group_idx) | [`TopkSumAndTopkGroupIdxParams`]: best groups by top-1/top-2 sums; the GPU op |
//! | [`top2_sum_gate`](mod@top2_sum_gate) | [`Top2SumGateParams`], [`Top2SumGateLayouts`], [`Top2SumGateShape`], [`replica_column`], [`mask_ep_tp`]; the GPU op and [`Top2SumGateDeviceInputs`] |
//! | [`reference`](mod@reference) | CPU [`stable_topk`](reference::stable_topk), [`topk_gate`](reference::topk_gate), [`topk_sum_and_topk_group_idx`](reference::topk_sum_and_topk_group_idx), [`top2_sum_gate`](reference::top2_sum_gate) |
//! | [`testing`](mod@testing) | tolerances, ulp distance, the gap-respecting input generator of the spec's test |
//!
//! Each op's module documents its shapes and dtypes, its tie rule, its NaN/`-inf` behaviour
//! and its limits. Every function validates its arguments and returns a [`tk_core::TkError`]
//! naming the offending one; nothing panics on bad input.
//!
//! ```
//! # #[cfg(feature = "cpu")] {
//! use tk_core::HostTensor;
//! use tk_gating::reference::{top2_sum_gate, Top2SumGateInputs};
//! use tk_gating::{ScoringFunc, Top2SumGateParams};
//!
//! # fn main() -> tk_core::Result<()> {
//! // One token, 8 experts in 4 groups of 2; keep the 2 best groups, then the 2 best experts.
//! let logits = HostTensor::<f32>::from_vec(vec![0.0; 8], &[1, 8])?; // sigmoid: every s = 0.5
//! let bias = HostTensor::from_vec(vec![0.0, 0.25, 1.0, 0.0, 0.5, 0.5, 0.0, 0.75], &[8])?;
//! // keys s + bias = [0.5, 0.75 | 1.5, 0.5 | 1.0, 1.0 | 0.5, 1.25]
//! // group top-2 sums  [1.25   | 2.0      | 2.0      | 1.75]  -> groups 1 and 2 (tie: lower index)
//! let params = Top2SumGateParams::new(2, ScoringFunc::Sigmoid)
//!     .with_groups(4, 2)
//!     .with_routed_scaling_factor(2.5);
//! let out = top2_sum_gate(&Top2SumGateInputs::new(logits.view(), bias.view()), &params)?;
//! // Expert 7 (key 1.25) lost with its group; experts 4 and 5 tie: the lower id wins.
//! assert_eq!(out.topk_idx.as_slice(), &[2, 4]);
//! // Weights use the un-biased scores: 0.5 / (1e-20 + 0.5 + 0.5) * 2.5.
//! assert_eq!(out.topk_weights.as_slice(), &[1.25, 1.25]);
//! # Ok(()) }
//! # main().unwrap();
//! # }
//! ```

// Without the CPU backend or the GPU ops the links to them in these docs have no target.
#![cfg_attr(
    not(all(feature = "cpu", feature = "cuda")),
    allow(rustdoc::broken_intra_doc_links)
)]

mod checks;
#[cfg(feature = "cuda")]
mod gpu;
pub mod ranking;
#[cfg(feature = "cpu")]
pub mod reference;
pub mod scoring;
#[cfg(feature = "cpu")]
pub mod testing;
pub mod top2_sum_gate;
pub mod topk_gate;
pub mod topk_sum_and_topk_group_idx;

pub use scoring::ScoringFunc;
pub use top2_sum_gate::{
    mask_ep_tp, replica_column, Grouping, Top2SumGateLayouts, Top2SumGateParams, Top2SumGateShape,
};
pub use topk_gate::{TopkGateParams, TopkGateShape};
pub use topk_sum_and_topk_group_idx::{TopkGroupShape, TopkSumAndTopkGroupIdxParams};

#[cfg(feature = "cuda")]
pub use gpu::{prewarm, registered_kernels, DEEPSEEK_V3, DEEPSEEK_V4};
#[cfg(feature = "cuda")]
pub use top2_sum_gate::{top2_sum_gate, top2_sum_gate_into, Top2SumGateDeviceInputs};
#[cfg(feature = "cuda")]
pub use topk_gate::{topk_gate, topk_gate_into};
#[cfg(feature = "cuda")]
pub use topk_sum_and_topk_group_idx::{
    topk_sum_and_topk_group_idx, topk_sum_and_topk_group_idx_into,
};
