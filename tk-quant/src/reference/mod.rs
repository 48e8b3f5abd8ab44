//! CPU references (also the CPU backend): the exact semantics of `spec/quant.md`, written for
//! clarity rather than speed. The GPU kernels of this crate are tested against them bit for
//! bit.
//!
//! | function | spec | what |
//! |---|---|---|
//! | [`cast`](fn@cast), [`cast_sf_only`], [`cast_with_precomputed_sf`] | §2.1, §3.1, §3.3 | block-scaled cast to FP8 e4m3 / FP4 e2m1 |
//! | [`cast_back`] | §2.2, §3.8 | FP8 / FP4 → fp32 / bf16 |
//! | [`cast_to_e5m6`] | §3.2 | per-row cast to packed E5M6 |
//! | [`cast_back_from_e5m6`] | §3.9 | E5M6 → fp32 / bf16 |

pub mod cast;
pub mod e5m6;

pub use cast::{cast, cast_back, cast_sf_only, cast_with_precomputed_sf};
pub use e5m6::{cast_back_from_e5m6, cast_to_e5m6};
