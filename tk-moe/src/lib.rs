//! # tk-moe
//!
//! MoE routing of tile-kernels (`spec/moe.md` §4.6–§4.14): the token → expert-major ("fused")
//! mapping, expanding token rows (and their FP8/FP4 scale factors) into the fused buffer, the
//! weighted FMA reduce back to tokens (optionally to FP8 e4m3), weight normalisation, id
//! histograms, the load-balancing statistic `f_i`, per-token group dedupe and EP/TP masking.
//!
//! Every op has a GPU implementation (feature `cuda`, default: CUDA C++ in `cuda/<op>.cu`,
//! compiled at run time by NVRTC and specialised on its shape constants) and a CPU reference
//! ([`reference`](mod@reference), feature `cpu`, default), which is the correctness argument:
//! the GPU ops are tested against it bit for bit (every op here is exact or has a documented
//! fp32 operation order). GPU ops take device views, write caller-provided outputs (`*_into`,
//! with allocating conveniences), never synchronise with the host (except the opt-in
//! [`FusedRows::HostSync`] of `get_fused_mapping`) and read illegal indices as `-1`
//! ([`index`]). [`registered_kernels`] and [`prewarm`] cover representative shapes.
//!
//! | module | contents |
//! |---|---|
//! | [`index`] | the index contract of every op: `-1` or an id in range; a typed error on the CPU, read as `-1` on the GPU |
//! | [`get_fused_mapping`](mod@get_fused_mapping) | [`GetFusedMappingParams`], [`FusedRows`] (graph-safe capacity or opt-in host sync), [`max_fused_rows`]; row order: ascending token order |
//! | [`expand_to_fused`](mod@expand_to_fused) | [`ExpandToFusedParams`]: rows copied to the fused buffer, every other row zero |
//! | [`expand_to_fused_with_sf`](mod@expand_to_fused_with_sf) | [`ExpandToFusedWithSfParams`], [`ScaleElement`]: data and scale factors permuted together |
//! | [`reduce_fused`](mod@reduce_fused) | [`ReduceFusedParams`], [`ReduceOut`], [`ReduceElement`]: `acc = fma(x, w·x_sf, acc)` in slot order, saturating e4m3 output |
//! | [`normalize_weight`](mod@normalize_weight) | [`NormalizeWeightParams`]: `w / (1e-20 + Σ w)` in slot order |
//! | [`group_count`](mod@group_count) | [`GroupCountParams`]: exact histogram |
//! | [`aux_fi`](mod@aux_fi) | [`AuxFiParams`]: `fp32(c·E) / fp32(T·num_aux_topk)`, deterministic (upstream is not) |
//! | [`inplace_unique_group_indices`](mod@inplace_unique_group_indices) | [`InplaceUniqueGroupIndicesParams`]: leftmost occurrence kept |
//! | [`mask_indices_by_tp`](mod@mask_indices_by_tp) | [`MaskIndicesByTpParams`]: keep one TP rank's experts, renumbered |
//! | [`reference`](mod@reference) | the CPU ops |
//! | [`testing`](mod@testing) | the spec's MoE grid and seeded `topk_idx` generator |
//!
//! Each op's module documents its shapes and dtypes, orders and tie rules, its index contract
//! and its deviations from upstream. Every function validates its arguments and returns a
//! [`tk_core::TkError`] naming the offending one; nothing panics on bad input.
//!
//! ```
//! # #[cfg(feature = "cpu")] {
//! use tk_core::HostTensor;
//! use tk_moe::reference::{expand_to_fused, get_fused_mapping, reduce_fused, ReduceFusedInputs};
//! use tk_moe::GetFusedMappingParams;
//!
//! # fn main() -> tk_core::Result<()> {
//! // 3 tokens, 2 slots each, 2 local experts; slot (2, 1) belongs to another rank (-1).
//! let topk_idx = HostTensor::<i64>::from_vec(vec![1, 0, 0, 1, 1, -1], &[3, 2])?;
//! // Segments aligned to 2 rows: expert 0 has 2 rows, expert 1 has 3 (+1 padding row).
//! let map = get_fused_mapping(&topk_idx.view(), &GetFusedMappingParams::host_sync(2, 2))?;
//! assert_eq!(map.expert_start.as_slice(), &[0, 2]);
//! assert_eq!(map.num_tokens_per_expert.as_slice(), &[2, 4]); // padded counts
//! // Inside a segment: ascending token order.
//! assert_eq!(map.pos_to_token.as_slice(), &[0, 1, 0, 1, 2, -1]);
//! assert_eq!(map.token_topk_to_pos.as_slice(), &[2, 0, 1, 3, 4, -1]);
//!
//! // Expand one-column token rows, then reduce them back with weights.
//! let x = HostTensor::<f32>::from_vec(vec![1.0, 10.0, 100.0], &[3, 1])?;
//! let fused = expand_to_fused(&x.view(), &map.token_topk_to_pos.view(), &map.pos_to_expert.view())?;
//! assert_eq!(fused.as_slice(), &[1.0, 10.0, 1.0, 10.0, 100.0, 0.0]); // padding row zeroed
//! let w = HostTensor::<f32>::from_vec(vec![0.5, 0.25, 1.0, 2.0, 3.0, 7.0], &[3, 2])?;
//! let inputs = ReduceFusedInputs::new(fused.view(), map.token_topk_to_pos.view())
//!     .with_weights(w.view());
//! let y = reduce_fused(&inputs)?;
//! assert_eq!(y.as_slice(), &[0.75, 30.0, 300.0]); // the -1 slot's weight (7.0) is unused
//! # Ok(()) }
//! # main().unwrap();
//! # }
//! ```
//!
//! On the GPU (feature `cuda`) the same chain, graph-safe (no host synchronisation):
//!
//! ```no_run
//! # #[cfg(feature = "cuda")] {
//! use tk_core::{testing::Rng, Device, HostTensor};
//! use tk_moe::{max_fused_rows, DeviceReduceFusedInputs, GetFusedMappingParams};
//!
//! # fn main() -> tk_core::Result<()> {
//! let dev = Device::new(0)?;
//! let (t, k, e, h) = (4096, 8, 32, 7168);
//! let mut rng = Rng::new(0);
//! let idx = HostTensor::<i64>::from_fn(&[t, k], |i| ((i * 7) % e) as i64);
//! let x = rng.randn(&[t, h], half::bf16::from_f32);
//! let (idx, x) = (dev.upload(&idx)?, dev.upload(&x)?);
//! // A capacity that always suffices: no host sync, capturable in a CUDA graph.
//! let m = max_fused_rows(t, k, e, 128).unwrap();
//! let map = tk_moe::get_fused_mapping(&idx.view(), &GetFusedMappingParams::new(e, 128, m))?;
//! let fused = tk_moe::expand_to_fused(
//!     &x.view(),
//!     &map.token_topk_to_pos.view(),
//!     &map.pos_to_expert.view(),
//! )?;
//! // ... grouped expert GEMMs over the segments [expert_start[e], expert_end[e]) ...
//! let y = tk_moe::reduce_fused(&DeviceReduceFusedInputs::new(
//!     fused.view(),
//!     map.token_topk_to_pos.view(),
//! ))?; // (t, h) bf16: the sum of each token's K copies
//! # let _ = y;
//! # Ok(()) }
//! # }
//! ```

// Without the CPU backend the links to it in these docs have no target.
#![cfg_attr(not(feature = "cpu"), allow(rustdoc::broken_intra_doc_links))]
#![deny(unsafe_code)]

pub mod aux_fi;
mod checks;
pub mod expand_to_fused;
pub mod expand_to_fused_with_sf;
pub mod get_fused_mapping;
#[cfg(feature = "cuda")]
mod gpu;
pub mod group_count;
pub mod index;
pub mod inplace_unique_group_indices;
pub mod mask_indices_by_tp;
pub mod normalize_weight;
pub mod reduce_fused;
#[cfg(feature = "cpu")]
pub mod reference;
#[cfg(feature = "cpu")]
pub mod testing;
#[cfg(feature = "cuda")]
mod workspace;

/// Every kernel specialisation this crate registers (representative shapes of every op), for
/// compile checks (`tk compile-check`) and [`prewarm`].
#[cfg(feature = "cuda")]
pub fn registered_kernels() -> Vec<tk_core::KernelSpec> {
    [
        expand_to_fused::registered_kernels(),
        expand_to_fused_with_sf::registered_kernels(),
        reduce_fused::registered_kernels(),
        get_fused_mapping::registered_kernels(),
        normalize_weight::registered_kernels(),
        group_count::registered_kernels(),
        aux_fi::registered_kernels(),
        inplace_unique_group_indices::registered_kernels(),
        mask_indices_by_tp::registered_kernels(),
    ]
    .concat()
}

/// Compiles (or loads from the disk cache) every registered kernel on `dev`, and prepares the
/// zeroed workspace of `dev`'s stream (enough for up to 4095 bins of `aux_fi` / `group_count`),
/// e.g. before CUDA graph capture. Other shapes compile on first use.
#[cfg(feature = "cuda")]
pub fn prewarm(dev: &tk_core::Device) -> tk_core::Result<()> {
    dev.prewarm(&registered_kernels())?;
    workspace::zeroed_words(dev, workspace::MIN_WORDS).map(|_| ())
}

pub use aux_fi::AuxFiParams;
#[cfg(feature = "cuda")]
pub use aux_fi::{aux_fi, aux_fi_into};
#[cfg(feature = "cuda")]
pub use expand_to_fused::{expand_to_fused, expand_to_fused_into};
pub use expand_to_fused::{ExpandShape, ExpandToFusedParams};
#[cfg(feature = "cuda")]
pub use expand_to_fused_with_sf::{
    expand_to_fused_with_sf, expand_to_fused_with_sf_into, DeviceFusedWithSf,
};
pub use expand_to_fused_with_sf::{ExpandToFusedWithSfParams, ExpandWithSfShape, ScaleElement};
#[cfg(feature = "cuda")]
pub use get_fused_mapping::{
    get_fused_mapping, get_fused_mapping_into, get_fused_mapping_into_with, DeviceFusedMapping,
    FusedLaunch,
};
pub use get_fused_mapping::{
    max_fused_rows, segment_len, FusedMappingShape, FusedMaps, FusedRows, GetFusedMappingParams,
    MAX_EXPERTS,
};
pub use group_count::GroupCountParams;
#[cfg(feature = "cuda")]
pub use group_count::{group_count, group_count_into};
pub use index::IndexElement;
#[cfg(feature = "cuda")]
pub use inplace_unique_group_indices::inplace_unique_group_indices;
pub use inplace_unique_group_indices::InplaceUniqueGroupIndicesParams;
pub use mask_indices_by_tp::MaskIndicesByTpParams;
#[cfg(feature = "cuda")]
pub use mask_indices_by_tp::{mask_indices_by_tp, mask_indices_by_tp_into};
pub use normalize_weight::NormalizeWeightParams;
#[cfg(feature = "cuda")]
pub use normalize_weight::{normalize_weight, normalize_weight_into};
#[cfg(feature = "cuda")]
pub use reduce_fused::{
    reduce_fused, reduce_fused_e4m3, reduce_fused_e4m3_into, reduce_fused_into,
    DeviceReduceFusedInputs,
};
pub use reduce_fused::{
    ReduceElement, ReduceFusedLayouts, ReduceFusedParams, ReduceFusedShape, ReduceFusedTensors,
    ReduceOut, ViewLayout,
};
