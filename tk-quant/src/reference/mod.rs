//! CPU references (also the CPU backend): the exact semantics of `spec/quant.md`, written for
//! clarity rather than speed. The GPU kernels of this crate are tested against them bit for
//! bit.
//!
//! Generic references (any block, any `K >= 1`):
//!
//! | function | spec | what |
//! |---|---|---|
//! | [`cast`](fn@cast), [`cast_sf_only`], [`cast_with_precomputed_sf`] | §2.1, §3.1, §3.3 | block-scaled cast to FP8 e4m3 / FP4 e2m1 |
//! | [`cast_back`](fn@cast_back) | §2.2, §3.8 | FP8 / FP4 → fp32 / bf16 |
//! | [`cast_to_e5m6`] | §3.2 | per-row cast to packed E5M6 |
//! | [`cast_back_from_e5m6`] | §3.9 | E5M6 → fp32 / bf16 |
//!
//! The ops, on the CPU: each op's validation (with upstream's preconditions, see the op's host
//! module) followed by the generic reference with the op's block, or, for the lossless cast,
//! its own algorithm:
//!
//! | function | op module | spec | block |
//! |---|---|---|---|
//! | [`per_token_cast`](fn@per_token_cast), [`per_token_cast_with_sf_only`], [`per_token_cast_with_precomputed_sf`] | [`crate::per_token_cast`](mod@crate::per_token_cast) | §3.1 | `(1, npc)` |
//! | [`per_token_cast_to_e5m6`] | [`crate::per_token_cast`](mod@crate::per_token_cast) | §3.2 | `(1, K)` |
//! | [`per_block_cast`](fn@per_block_cast), [`per_block_cast_with_sf_only`], [`per_block_cast_with_precomputed_sf`] | [`crate::per_block_cast`](mod@crate::per_block_cast) | §3.3 | `(bm, bk)` |
//! | [`per_block_cast_lossless`](fn@per_block_cast_lossless) | [`crate::per_block_cast_lossless`](mod@crate::per_block_cast_lossless) | §3.4 | `(ih, iw)` → `(oh, ow)` |
//! | [`per_channel_cast`](fn@per_channel_cast) | [`crate::per_channel_cast`](mod@crate::per_channel_cast) | §3.5 | `(128, 1)` |
//! | [`cast_back_op`](fn@cast_back_op), [`per_token_cast_back`] | [`crate::cast_back`](mod@crate::cast_back) | §3.8 | `x_block_size`, `(1, npc)` |
//! | [`cast_back_e5m6`], [`per_token_cast_back_e5m6`] | [`crate::cast_back`](mod@crate::cast_back) | §3.9 | `x_block_size`, `(1, npc)` |
//! | [`per_channel_cast_fused`](fn@per_channel_cast_fused) | [`crate::per_channel_cast_fused`](mod@crate::per_channel_cast_fused) | §3.6 | `(128, 1)` after gather / dequantization |
//! | [`per_channel_cast_and_transpose`](fn@per_channel_cast_and_transpose) | [`crate::per_channel_cast_and_transpose`](mod@crate::per_channel_cast_and_transpose) | §3.7 | `(npt, 1)`, data transposed |
//! | [`swiglu_forward_and_per_token_cast`](fn@swiglu_forward_and_per_token_cast) (+ `_with_expf`, [`swiglu_forward_activation`], [`swiglu_forward_downstream`]) | [`crate::swiglu_forward_and_per_token_cast`](mod@crate::swiglu_forward_and_per_token_cast) | §3.10 | `(1, npc)` of the activation |
//! | [`swiglu_backward_and_per_token_cast`](fn@swiglu_backward_and_per_token_cast) (+ `_with_expf`, [`swiglu_backward_element`]) | [`crate::swiglu_backward_and_per_token_cast`](mod@crate::swiglu_backward_and_per_token_cast) | §3.11 | `(1, npc)` of the gradient |
//! | [`swiglu_forward_and_per_channel_cast_and_transpose`](fn@swiglu_forward_and_per_channel_cast_and_transpose) (+ `_with_expf`, [`swiglu_per_channel_activation`], [`swiglu_per_channel_downstream`]) | [`crate::swiglu_forward_and_per_channel_cast_and_transpose`](mod@crate::swiglu_forward_and_per_channel_cast_and_transpose) | §3.12 | `(npt, 1)` of the bf16 activation |
//!
//! The SwiGLU references take the `expf` they use as a parameter (default [`swiglu::cpu_expf`],
//! the correctly rounded `exp`), so that everything but `expf` is bit-exact against the GPU;
//! see [`crate::swiglu`] and [`swiglu`](mod@swiglu).

pub mod cast;
pub mod cast_back_op;
pub mod e5m6;
pub mod per_block_cast;
pub mod per_block_cast_lossless;
pub mod per_channel_cast;
pub mod per_channel_cast_and_transpose;
pub mod per_channel_cast_fused;
pub mod per_token_cast;
pub mod swiglu;
pub mod swiglu_backward_and_per_token_cast;
pub mod swiglu_forward_and_per_channel_cast_and_transpose;
pub mod swiglu_forward_and_per_token_cast;

pub use cast::{cast, cast_back, cast_sf_only, cast_with_precomputed_sf};
pub use cast_back_op::{
    cast_back_e5m6, cast_back_op, per_token_cast_back, per_token_cast_back_e5m6,
};
pub use e5m6::{cast_back_from_e5m6, cast_to_e5m6};
pub use per_block_cast::{
    per_block_cast, per_block_cast_with_precomputed_sf, per_block_cast_with_sf_only,
};
pub use per_block_cast_lossless::per_block_cast_lossless;
pub use per_channel_cast::per_channel_cast;
pub use per_channel_cast_and_transpose::per_channel_cast_and_transpose;
pub use per_channel_cast_fused::per_channel_cast_fused;
pub use per_token_cast::{
    per_token_cast, per_token_cast_to_e5m6, per_token_cast_with_precomputed_sf,
    per_token_cast_with_sf_only,
};
pub use swiglu_backward_and_per_token_cast::{
    swiglu_backward_and_per_token_cast, swiglu_backward_and_per_token_cast_with_expf,
    swiglu_backward_element, BackwardElement, SwigluBackwardOutput,
};
pub use swiglu_forward_and_per_channel_cast_and_transpose::{
    swiglu_forward_and_per_channel_cast_and_transpose,
    swiglu_forward_and_per_channel_cast_and_transpose_with_expf, swiglu_per_channel_activation,
    swiglu_per_channel_downstream,
};
pub use swiglu_forward_and_per_token_cast::{
    swiglu_forward_activation, swiglu_forward_and_per_token_cast,
    swiglu_forward_and_per_token_cast_with_expf, swiglu_forward_downstream, SwigluForwardOutput,
    SwigluOut,
};
