//! Pieces shared by the GPU launches of the gating ops (feature `cuda`): the shared CUDA header,
//! the one-warp-per-token launch shape, output and placement checks, and the registry of every
//! kernel specialisation the crate's tests, benches and the DeepSeek-V3 / V4 configurations use.

use cudarc::driver::{CudaFunction, LaunchConfig};
use tk_core::error::DriverContext;
use tk_core::{Device, KernelSpec, Layout, Result, TkError};

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
    let per_sm = f
        .occupancy_max_active_blocks_per_multiprocessor(cfg.block_dim.0, 0, None)
        .ctx("querying the occupancy of a gating kernel")?;
    let wave = (per_sm.max(1) as u64 * dev.props().sm_count.max(1) as u64).min(u32::MAX as u64);
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

/// Checks that the output `arg` has shape `expected` and is contiguous.
pub(crate) fn check_out(arg: &'static str, layout: &Layout, expected: &[usize]) -> Result<()> {
    if layout.shape() != expected {
        return Err(TkError::Shape {
            arg,
            expected: format!("{expected:?}"),
            got: layout.shape().to_vec(),
        });
    }
    if !layout.is_contiguous() {
        return Err(TkError::Stride {
            arg,
            expected: "a contiguous (row-major) output".into(),
            got: layout.strides().to_vec(),
        });
    }
    Ok(())
}

/// Checks that `other` (the tensor `arg`) lives on `dev`.
pub(crate) fn check_device(arg: &'static str, dev: &Device, other: &Device) -> Result<()> {
    if dev.same_device(other) {
        Ok(())
    } else {
        Err(TkError::Placement {
            arg,
            msg: "must be on the same device as the op's first input".into(),
        })
    }
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
    for (e, k) in [
        (72, 6),
        (32, 6),
        (64, 6),
        (96, 6),
        (16, 6),
        (36, 6),
        (108, 6),
        (128, 6),
        (144, 6),
        (256, 8),
        (160, 4),
        (384, 7),
        (37, 5),
        (1, 1),
        (384, 40),
        (3000, 9),
    ] {
        v.push(topk_gate::kernel_spec(e, k));
    }
    // topk_sum_and_topk_group_idx: the spec's 24 configurations.
    for (e, g) in [(72, 4), (72, 8), (72, 12), (256, 4), (256, 8), (256, 16)] {
        for n in [1, 2] {
            for gk in [2, 4] {
                v.push(topk_sum_and_topk_group_idx::kernel_spec(g, e / g, n, gk));
            }
        }
    }
    // top2_sum_gate: the spec's 11 configurations x 3 scorings, DeepSeek-V3 and V4.
    let configs = [
        (72, 6, 0, 0),
        (32, 6, 0, 0),
        (64, 6, 0, 0),
        (96, 6, 0, 0),
        (16, 6, 0, 0),
        (36, 6, 0, 0),
        (108, 6, 0, 0),
        (128, 6, 0, 0),
        (144, 6, 0, 0),
        (256, 8, 8, 8),
        (256, 8, 8, 4),
    ];
    for (e, k, g, gk) in configs {
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
