//! # tk-quant
//!
//! Scaled casts of tile-kernels (`spec/quant.md`): per-token, per-block and per-channel casts
//! of fp32/bf16 (or already quantized) activations to FP8 e4m3, FP4 e2m1 and E5M6 with fp32 or
//! UE8M0 scale factors, and the casts back.
//!
//! **Status:** every op runs on the GPU (feature `cuda`, default), on device types from
//! [`device`], and has a CPU reference ([`reference`](mod@reference), feature `cpu`, default)
//! it matches bit for bit: the block-scaled casts [`per_token_cast`](fn@per_token_cast) (+
//! sf-only, precomputed, from quantized input, [`per_token_cast_to_e5m6`](fn@per_token_cast_to_e5m6)),
//! [`per_block_cast`](fn@per_block_cast) (+ variants), [`per_block_cast_lossless`](fn@per_block_cast_lossless),
//! [`per_channel_cast`](fn@per_channel_cast), the casts back ([`cast_back`](fn@cast_back),
//! [`per_token_cast_back`](fn@per_token_cast_back), [`cast_back_e5m6`](fn@cast_back_e5m6)) —
//! data and the scales' full allocation, padding included — and the fused ops: SwiGLU forward /
//! backward with a per-token cast, SwiGLU forward with a per-channel cast (and transpose),
//! `per_channel_cast_and_transpose` and `per_channel_cast_fused` (the SwiGLU ones exact given
//! CUDA's `expf`, see [`swiglu`]).
//!
//! | module | contents |
//! |---|---|
//! | [`device`] | device argument and result types: [`DevicePlainInput`], [`DeviceQuantDataView`] / [`DeviceQuantData`], [`DeviceScaleView`] / [`DeviceScales`], [`DeviceQuantInput`], [`DeviceCastInput`] |
//! | [`scale`] | [`ScaleOptions`] → [`ScaleLayout`] (A row-major fp32, B TMA-aligned column-major fp32, C packed UE8M0), [`ScaleGrid`] geometry, [`HostScales`], the input-scale reader rules ([`scale::detect_scale_layout`], [`ScaleView`]) |
//! | [`types`] | [`CastFormat`], [`PlainInput`], [`QuantDataView`] / [`QuantData`], [`QuantInput`], [`CastInput`], [`DequantElement`] |
//! | [`plan`] | [`CastMode`] (cast / sf-only / precomputed), [`CastPlan`] (what every op's `validate` returns) |
//! | [`per_token_cast`](mod@per_token_cast) | §3.1–§3.2: [`PerTokenCastParams`], [`PerTokenE5M6Params`], `validate`, `validate_e5m6` |
//! | [`per_block_cast`](mod@per_block_cast) | §3.3: [`PerBlockCastParams`], `validate` |
//! | [`per_block_cast_lossless`](mod@per_block_cast_lossless) | §3.4: [`LosslessCastParams`], [`LosslessPlan`], `validate` |
//! | [`per_channel_cast`](mod@per_channel_cast) | §3.5: [`PerChannelCastParams`], `validate` |
//! | [`per_channel_cast_fused`](mod@per_channel_cast_fused) | §3.6: [`FusedInput`], [`PerChannelCastFusedParams`], `validate` |
//! | [`per_channel_cast_and_transpose`](mod@per_channel_cast_and_transpose) | §3.7: [`PerChannelCastAndTransposeParams`], `validate` |
//! | [`cast_back`](mod@cast_back) | §3.8–§3.9: `validate`, `validate_e5m6` |
//! | [`swiglu`] | §3.10–§3.12 shared: the activation's op order, how the references handle CUDA's `expf` |
//! | [`swiglu_forward_and_per_token_cast`](mod@swiglu_forward_and_per_token_cast) | §3.10: [`SwigluForwardInputs`], [`TopkWeights`], [`SwigluForwardParams`], [`SwigluOutFormat`], `validate` |
//! | [`swiglu_backward_and_per_token_cast`](mod@swiglu_backward_and_per_token_cast) | §3.11: [`SwigluBackwardInputs`], [`SwigluBackwardParams`], `validate` |
//! | [`swiglu_forward_and_per_channel_cast_and_transpose`](mod@swiglu_forward_and_per_channel_cast_and_transpose) | §3.12: [`SwigluPerChannelParams`], `validate` |
//! | [`reference`](mod@reference) | generic references [`cast`](fn@reference::cast) (+ sf-only, precomputed), [`cast_back`](fn@reference::cast_back), [`cast_to_e5m6`](fn@reference::cast_to_e5m6), [`cast_back_from_e5m6`](fn@reference::cast_back_from_e5m6); the ops on the CPU ([`per_token_cast`](fn@reference::per_token_cast), [`per_block_cast`](fn@reference::per_block_cast), [`per_block_cast_lossless`](fn@reference::per_block_cast_lossless), [`per_channel_cast`](fn@reference::per_channel_cast), [`cast_back_op`](fn@reference::cast_back_op), [`per_token_cast_back`](fn@reference::per_token_cast_back), ...) |
//! | [`testing`](mod@testing) | test support (feature `cuda`): a test kernel that compares the kernels' fast scale arithmetic with the divisions it replaces, on the GPU |
//!
//! Every function validates its arguments and returns a [`tk_core::TkError`] naming the
//! offending one; nothing panics on bad input.
//!
//! ```
//! # #[cfg(feature = "cpu")] {
//! use tk_core::HostTensor;
//! use tk_quant::reference::{cast, cast_back};
//! use tk_quant::{CastFormat, QuantInput, ScaleOptions};
//!
//! # fn main() -> tk_core::Result<()> {
//! // (M, K) = (2, 4) fp32, one scale per row (block (1, 4)), power-of-two scales, layout C.
//! let x = HostTensor::<f32>::from_vec(vec![0.5, -1.0, 3.0, 7.0, 0.0, 0.0, 0.0, 0.0], &[2, 4])?;
//! let (q, sf) = cast(&x.view().into(), CastFormat::E4M3, (1, 4), ScaleOptions::packed_ue8m0())?;
//! assert_eq!(q.bytes()[..4], [0x60, 0xE8, 0x74, 0x7E]); // 32, -64, 192, 448 in e4m3
//! assert_eq!(sf.get(0, 0), Some(1.0 / 64.0)); // amax 7: sf = 7/448 = 2^-6
//! assert_eq!(sf.ue8m0_byte(1, 0), Some(127 - 22)); // all-zero row: sf = 2^-22
//! let back = cast_back::<f32>(&QuantInput::new(q.view(), sf.view(), (1, 4)))?;
//! assert_eq!(back.as_slice()[..4], [0.5, -1.0, 3.0, 7.0]);
//! # Ok(()) }
//! # main().unwrap();
//! # }
//! ```

// Without the CPU backend or the GPU ops the links to them in these docs have no target.
#![cfg_attr(
    not(all(feature = "cpu", feature = "cuda")),
    allow(rustdoc::broken_intra_doc_links)
)]

#[cfg(feature = "cuda")]
mod cast;
pub mod cast_back;
#[cfg(feature = "cuda")]
pub mod device;
pub mod per_block_cast;
pub mod per_block_cast_lossless;
pub mod per_channel_cast;
pub mod per_channel_cast_and_transpose;
pub mod per_channel_cast_fused;
pub mod per_token_cast;
pub mod plan;
#[cfg(feature = "cpu")]
pub mod reference;
pub mod scale;
pub mod swiglu;
pub mod swiglu_backward_and_per_token_cast;
pub mod swiglu_forward_and_per_channel_cast_and_transpose;
pub mod swiglu_forward_and_per_token_cast;
#[cfg(feature = "cuda")]
pub mod testing;
pub mod types;

#[cfg(feature = "cuda")]
pub use cast_back::{
    cast_back, cast_back_e5m6, cast_back_e5m6_into, cast_back_into, per_token_cast_back,
};
#[cfg(feature = "cuda")]
pub use device::{
    DeviceCastInput, DevicePlainInput, DeviceQuantData, DeviceQuantDataView,
    DeviceQuantDataViewMut, DeviceQuantInput, DeviceScaleView, DeviceScales,
};
pub use per_block_cast::PerBlockCastParams;
#[cfg(feature = "cuda")]
pub use per_block_cast::{
    per_block_cast, per_block_cast_into, per_block_cast_with_precomputed_sf,
    per_block_cast_with_sf_only,
};
#[cfg(feature = "cuda")]
pub use per_block_cast_lossless::{
    per_block_cast_lossless, per_block_cast_lossless_into, LosslessStatus,
};
pub use per_block_cast_lossless::{LosslessCastParams, LosslessPlan};
pub use per_channel_cast::PerChannelCastParams;
#[cfg(feature = "cuda")]
pub use per_channel_cast::{per_channel_cast, per_channel_cast_into};
pub use per_channel_cast_and_transpose::PerChannelCastAndTransposeParams;
#[cfg(feature = "cuda")]
pub use per_channel_cast_and_transpose::{
    per_channel_cast_and_transpose, per_channel_cast_and_transpose_into,
};
#[cfg(feature = "cuda")]
pub use per_channel_cast_fused::{
    per_channel_cast_fused, per_channel_cast_fused_into, DeviceFusedInput,
};
pub use per_channel_cast_fused::{FusedInput, PerChannelCastFusedParams};
#[cfg(feature = "cuda")]
pub use per_token_cast::{
    per_token_cast, per_token_cast_into, per_token_cast_to_e5m6, per_token_cast_to_e5m6_into,
    per_token_cast_with_precomputed_sf, per_token_cast_with_precomputed_sf_into,
    per_token_cast_with_sf_only, per_token_cast_with_sf_only_into,
};
pub use per_token_cast::{PerTokenCastParams, PerTokenE5M6Params};
pub use plan::{CastMode, CastPlan};
pub use scale::{HostScales, ScaleGrid, ScaleLayout, ScaleOptions, ScaleView};
#[cfg(feature = "cuda")]
pub use swiglu_backward_and_per_token_cast::{
    swiglu_backward_and_per_token_cast, swiglu_backward_and_per_token_cast_into,
    DeviceSwigluBackwardInputs, DeviceSwigluBackwardOutput, DeviceSwigluBackwardOutputsMut,
};
pub use swiglu_backward_and_per_token_cast::{SwigluBackwardInputs, SwigluBackwardParams};
pub use swiglu_forward_and_per_channel_cast_and_transpose::SwigluPerChannelParams;
#[cfg(feature = "cuda")]
pub use swiglu_forward_and_per_channel_cast_and_transpose::{
    swiglu_forward_and_per_channel_cast_and_transpose,
    swiglu_forward_and_per_channel_cast_and_transpose_into,
};
#[cfg(feature = "cuda")]
pub use swiglu_forward_and_per_token_cast::{
    swiglu_forward_and_per_token_cast, swiglu_forward_and_per_token_cast_into,
    DeviceSwigluForwardInputs, DeviceSwigluForwardOutput, DeviceSwigluOut, DeviceSwigluOutMut,
    DeviceTopkWeights,
};
pub use swiglu_forward_and_per_token_cast::{
    SwigluForwardInputs, SwigluForwardParams, SwigluOutFormat, TopkWeights,
};
pub use types::{
    CastFormat, CastInput, DequantElement, PlainInput, QuantData, QuantDataView, QuantInput,
};

/// Every kernel specialisation the tests and benchmarks of this crate launch (for compile
/// checks and [`prewarm`]). Other shapes compile on first use.
#[cfg(feature = "cuda")]
pub fn registered_kernels() -> Vec<tk_core::KernelSpec> {
    let mut v = cast::registered_kernels();
    v.extend(cast_back::registered_kernels());
    v.extend(per_block_cast_lossless::registered_kernels());
    v.extend(swiglu::registered_kernels());
    v.extend(swiglu_forward_and_per_token_cast::registered_kernels());
    v.extend(swiglu_backward_and_per_token_cast::registered_kernels());
    v.extend(per_channel_cast_and_transpose::registered_kernels());
    v.extend(per_channel_cast_fused::registered_kernels());
    v.extend(swiglu_forward_and_per_channel_cast_and_transpose::registered_kernels());
    v.push(testing::scale_check_kernel_spec());
    v
}

/// Compiles (or loads from the disk cache) [`registered_kernels`] on `dev`, e.g. before
/// capturing a CUDA graph.
#[cfg(feature = "cuda")]
pub fn prewarm(dev: &tk_core::Device) -> tk_core::Result<()> {
    dev.prewarm(&registered_kernels())
}
