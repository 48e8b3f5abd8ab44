//! Pieces shared by the GPU launches of the gating ops (feature `cuda`): the shared CUDA header,
//! the one-warp-per-token launch shape, output and placement checks, and the registry of every
//! kernel specialisation the crate's tests, benches and the DeepSeek-V3 / V4 configurations use.

use cudarc::driver::{CudaFunction, LaunchConfig};
pub(crate) use tk_core::validate::{
    check_contiguous as check_out, check_same_device as check_device,
};
use tk_core::{Device, KernelSpec, Result, TkError};

use crate::scoring::ScoringFunc;
use crate::{top2_sum_gate, topk_gate, topk_sum_and_topk_group_idx};

/// The shared header of the gating kernels (`cuda/gating.cuh`): order keys, warp selection,
/// the exact scoring functions, group scores, EP/TP masking.
pub(crate) const HEADERS: &[(&str, &str)] = &[("gating.cuh", include_str!("../cuda/gating.cuh"))];

/// Warps per block of every gating kernel (one warp per token).
pub(crate) const WARPS: usize = 4;

/// One warp per token, [`WARPS`] per block; the kernels loop over tokens past the grid.
pub(crate) fn token_grid(num_tokens: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            num_tokens.div_ceil(WARPS).clamp(1, i32::MAX as usize) as u32,
            1,
            1,
        ),
        block_dim: (32 * WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// [`token_grid`] capped at one resident wave of `f` on `dev` (blocks per SM from the driver's
/// occupancy calculator): for kernels whose warps prefetch their next token while routing the
/// current one, so that every warp but the last few has a next token.
pub(crate) fn resident_token_grid(
    dev: &Device,
    f: &CudaFunction,
    num_tokens: usize,
) -> Result<LaunchConfig> {
    let mut cfg = token_grid(num_tokens);
    let wave = (dev.resident_blocks(f, cfg.block_dim.0)?.max(1) as u64).min(u32::MAX as u64);
    cfg.grid_dim.0 = cfg.grid_dim.0.min(wave as u32);
    Ok(cfg)
}

/// The kernels count tokens in 32 bits.
pub(crate) fn check_tokens(arg: &'static str, num_tokens: usize) -> Result<u32> {
    u32::try_from(num_tokens).map_err(|_| {
        TkError::param(
            arg,
            format!("{num_tokens} tokens exceed the GPU kernels' limit of 2^32 - 1"),
        )
    })
}

/// The DeepSeek-V3 router: 256 experts, 8 groups, top-4 groups, top-8, sigmoid (with bias).
pub const DEEPSEEK_V3: (usize, usize, usize, usize, ScoringFunc) =
    (256, 8, 8, 4, ScoringFunc::Sigmoid);
/// The DeepSeek-V4 router: 256 experts, top-6, sqrt-softplus, no groups.
pub const DEEPSEEK_V4: (usize, usize, usize, usize, ScoringFunc) =
    (256, 6, 0, 0, ScoringFunc::SqrtSoftplus);

/// Every specialisation this crate registers for compile checks and [`prewarm`]: the spec's
/// grids (`spec/moe.md` §4.3–§4.5), the off-grid shapes of the GPU tests, and the DeepSeek-V3 /
/// V4 routers. Other shapes compile on first use.
pub fn registered_kernels() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    // topk_gate: the spec's (E, K) pairs, off-grid shapes, a streamed (long-row) one.
    let off_grid = [(160, 4), (384, 7), (37, 5), (1, 1), (384, 40), (3000, 9)];
    for (e, k) in topk_gate::SPEC_CONFIGS.into_iter().chain(off_grid) {
        v.push(topk_gate::kernel_spec(e, k));
    }
    // topk_sum_and_topk_group_idx: the spec's 24 configurations.
    for (e, g) in topk_sum_and_topk_group_idx::SPEC_CONFIGS {
        for n in [1, 2] {
            for gk in [2, 4] {
                v.push(topk_sum_and_topk_group_idx::kernel_spec(g, e / g, n, gk));
            }
        }
    }
    // top2_sum_gate: the spec's 11 configurations x 3 scorings, DeepSeek-V3 and V4.
    for (g, gk, e, _, k) in top2_sum_gate::SPEC_CONFIGS {
        for f in [
            ScoringFunc::Sigmoid,
            ScoringFunc::SqrtSoftplus,
            ScoringFunc::Softmax,
        ] {
            v.push(top2_sum_gate::kernel_spec(e, k, g, gk, f));
        }
    }
    for (e, k, g, gk, f) in [DEEPSEEK_V3, DEEPSEEK_V4] {
        v.push(top2_sum_gate::kernel_spec(e, k, g, gk, f));
    }
    v
}

/// Compiles (or loads from the disk cache) every registered gating kernel on `dev`, e.g. before
/// capturing a CUDA graph.
pub fn prewarm(dev: &Device) -> Result<()> {
    dev.prewarm(&registered_kernels())
}
