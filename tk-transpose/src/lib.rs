//! # tk-transpose
//!
//! Batched transpose for tile-kernels: `out[b, j, i] = x[b, i, j]` for any element type of 1, 2
//! or 4 bytes, any sizes, any row and batch strides, bit-exact, at memory bandwidth.
//!
//! ```no_run
//! use tk_core::{testing::Rng, Device};
//! # fn main() -> tk_core::Result<()> {
//! let dev = Device::new(0)?;
//! let x = Rng::new(0).randn(&[4032, 576], half::bf16::from_f32); // host (X, Y)
//! let d = dev.upload(&x)?;
//! let t = tk_transpose::transpose(&d.view())?; // device (Y, X), enqueued, no host sync
//! let cpu = tk_transpose::reference::transpose(&x.view())?;
//! assert_eq!(t.to_host()?.as_slice(), cpu.as_slice());
//! # Ok(()) }
//! ```
//!
//! Feature `cuda` (default) gives the GPU ops, `cpu` (default) the CPU backend in [`mod@reference`].

pub mod batched_transpose;
#[cfg(feature = "cpu")]
pub mod reference;

#[cfg(feature = "cuda")]
pub use batched_transpose::{
    batched_transpose, batched_transpose_into, batched_transpose_into_tiled, prewarm,
    registered_kernels, transpose, transpose_into, transpose_into_tiled, Tiling,
};
