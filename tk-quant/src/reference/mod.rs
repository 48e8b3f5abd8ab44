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
//! | [`per_token_cast`](fn@per_token_cast), [`per_token_cast_with_sf_only`], [`per_token_cast_with_precomputed_sf`] | [`crate::per_token_cast`] | §3.1 | `(1, npc)` |
//! | [`per_token_cast_to_e5m6`] | [`crate::per_token_cast`] | §3.2 | `(1, K)` |
//! | [`per_block_cast`](fn@per_block_cast), [`per_block_cast_with_sf_only`], [`per_block_cast_with_precomputed_sf`] | [`crate::per_block_cast`] | §3.3 | `(bm, bk)` |
//! | [`per_block_cast_lossless`](fn@per_block_cast_lossless) | [`crate::per_block_cast_lossless`] | §3.4 | `(ih, iw)` → `(oh, ow)` |
//! | [`per_channel_cast`](fn@per_channel_cast) | [`crate::per_channel_cast`] | §3.5 | `(128, 1)` |
//! | [`cast_back_op`](fn@cast_back_op), [`per_token_cast_back`] | [`crate::cast_back`] | §3.8 | `x_block_size`, `(1, npc)` |
//! | [`cast_back_e5m6`], [`per_token_cast_back_e5m6`] | [`crate::cast_back`] | §3.9 | `x_block_size`, `(1, npc)` |

pub mod cast;
pub mod cast_back_op;
pub mod e5m6;
pub mod per_block_cast;
pub mod per_block_cast_lossless;
pub mod per_channel_cast;
pub mod per_token_cast;

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
pub use per_token_cast::{
    per_token_cast, per_token_cast_to_e5m6, per_token_cast_with_precomputed_sf,
    per_token_cast_with_sf_only,
};
