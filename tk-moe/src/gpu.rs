//! Launch plumbing shared by the GPU ops (feature `cuda`): the crate's kernel headers, output
//! and placement checks, grid sizes and access widths.

use cudarc::driver::LaunchConfig;
pub(crate) use tk_core::validate::{
    check_contiguous as check_out, check_same_device as check_device,
};
use tk_core::{DeviceView, Layout};

/// The headers every kernel of this crate may include (`#include "tk/moe.cuh"`).
pub(crate) const HEADERS: &[(&str, &str)] = &[("tk/moe.cuh", include_str!("../cuda/moe.cuh"))];

/// Threads per block of every kernel but `tk_fused_count_scan`, the counting kernels and
/// `inplace_unique_group_indices` (`normalize_weight` too: one thread per row).
pub(crate) const THREADS: u32 = 256;

/// Threads per block of `inplace_unique_group_indices` (one thread per row): small blocks
/// spread the few rows over more SMs.
pub(crate) const ROW_THREADS: u32 = 128;

/// The row stride (elements) of a rank-2 layout.
pub(crate) fn row_stride(layout: &Layout) -> u64 {
    layout.strides()[0] as u64
}

/// Blocks for `work` items at `per_block` items per block: at least 1, at most 2^30 (the
/// kernels loop over the rest).
pub(crate) fn blocks(work: usize, per_block: usize) -> u32 {
    work.div_ceil(per_block.max(1)).clamp(1, 1 << 30) as u32
}

/// A 1-D launch configuration.
pub(crate) fn config(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The widest access (16, 8, 4, 2 or 1 bytes) that divides every value of `parts` (addresses,
/// row pitches and row lengths in bytes).
pub(crate) fn access_bytes(parts: &[u64]) -> usize {
    [16u64, 8, 4, 2]
        .into_iter()
        .find(|&v| parts.iter().all(|p| p % v == 0))
        .unwrap_or(1) as usize
}

/// The `flat` argument of the kernels reading an index tensor `idx (T, K)` in pairs of entries
/// (`moe.cuh` `load_pair`): 1 when its entries are one contiguous run starting on a 16-byte
/// boundary (one 16-byte load per pair), else 0.
pub(crate) fn flat_entries(idx: &DeviceView<'_, i64>) -> u32 {
    let (t, k) = (idx.shape()[0], idx.shape()[1]);
    ((t <= 1 || row_stride(idx.layout()) == k as u64) && idx.address() % 16 == 0) as u32
}
