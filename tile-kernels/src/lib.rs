//! # tile-kernels
//!
//! GPU kernels for the critical path of mixture-of-experts models and low-precision inference
//! and training, in Rust + CUDA C++ (compiled at run time by NVRTC; no CUDA toolkit needed to
//! build). This facade re-exports each kernel family behind a feature of the same name; depend
//! on a family crate directly (`tk-transpose`, ...) if you need only that family.
//!
//! | feature | crate | ops |
//! |---|---|---|
//! | `transpose` (default) | [`tk_transpose`] | `transpose`, `batched_transpose` |
//! | `quant` (default) | [`tk_quant`] | per-token / per-block / per-channel casts to FP8, FP4, E5M6 and back, lossless FP4 → FP8, fused SwiGLU + cast ops (GPU kernels and CPU references) |
//! | `moe` (default) | [`tk_moe`] | `get_fused_mapping`, `expand_to_fused(_with_sf)`, `reduce_fused`, `normalize_weight`, `group_count`, `aux_fi`, `inplace_unique_group_indices`, `mask_indices_by_tp` (GPU kernels and CPU references) |
//! | `gating` (default) | [`tk_gating`] | scoring functions; `topk_gate`, `topk_sum_and_topk_group_idx`, `top2_sum_gate` on the GPU, with CPU references |
//!
//! The core types (devices, tensors, dtypes, errors) are re-exported from [`tk_core`] as
//! [`core`].

pub use tk_core as core;
pub use tk_core::{
    DType, Device, DeviceTensor, DeviceView, DeviceViewMut, Element, HostTensor, HostView, Result,
    TkError,
};

#[cfg(feature = "transpose")]
pub use tk_transpose as transpose;

#[cfg(feature = "quant")]
pub use tk_quant as quant;

#[cfg(feature = "gating")]
pub use tk_gating as gating;

#[cfg(feature = "moe")]
pub use tk_moe as moe;

/// Every kernel specialisation registered by the enabled families, with the family's name
/// (for compile checks and prewarming).
pub fn registered_kernels() -> Vec<(&'static str, tk_core::KernelSpec)> {
    #[allow(unused_mut)]
    let mut v: Vec<(&'static str, tk_core::KernelSpec)> = vec![
        ("core", tk_core::bench::copy_kernel_spec()),
        ("core", tk_core::bench::fill_kernel_spec()),
        ("core", tk_core::testing::convert_check_kernel_spec()),
    ];
    v.extend(
        tk_core::bench::stream_kernel_specs()
            .into_iter()
            .map(|s| ("core", s)),
    );
    #[cfg(feature = "transpose")]
    v.extend(
        tk_transpose::registered_kernels()
            .into_iter()
            .map(|s| ("transpose", s)),
    );
    #[cfg(feature = "quant")]
    v.extend(
        tk_quant::registered_kernels()
            .into_iter()
            .map(|s| ("quant", s)),
    );
    #[cfg(feature = "gating")]
    v.extend(
        tk_gating::registered_kernels()
            .into_iter()
            .map(|s| ("gating", s)),
    );
    #[cfg(feature = "moe")]
    v.extend(tk_moe::registered_kernels().into_iter().map(|s| ("moe", s)));
    v
}
