//! `topk_sum_and_topk_group_idx` (`spec/moe.md` §4.4): rank the expert groups of every token by
//! the sum of their top-1 or top-2 scores and return the best `Gk` group indices.
//!
//! | argument | shape | dtype | layout |
//! |---|---|---|---|
//! | `scores` | `(T, G, P)`, `T >= 0`, `G >= 1`, `P >= 1` (`P` experts per group) | fp32 | unit stride along `P`, any other strides |
//! | `num_topk_sum` | `1` or `2`, and `<= P` | | |
//! | `num_topk_groups` (`Gk`) | `1 <= Gk <= G` | | |
//! | output | `(T, Gk)` | i64 | contiguous |
//!
//! **Semantics**, per token:
//! 1. group score `g_q` = the largest score of group `q` (`num_topk_sum = 1`), or `top1 + top2`
//!    (`num_topk_sum = 2`), the two largest of the group *as a multiset* — a duplicated maximum
//!    counts twice (`[5, 5, 1]` scores 10) — added in one fp32 addition;
//! 2. the `Gk` best groups by `g`, best first.
//!
//! **Tie rule:** equal group scores go to the smaller group index (also inside a group, which
//! does not change the values found).
//!
//! **NaN / ±inf** ([`crate::ranking`]): NaN ranks above every number, both inside a group (a
//! group holding a NaN scores NaN) and between groups (NaN groups come first, by index). This is
//! upstream's reference (`torch.topk` values summed, then `stable_topk`); upstream's kernel
//! returns garbage for NaN. `±inf` are ordinary values, with IEEE sums: a group whose top-2 is
//! `(+inf, -inf)` scores NaN and therefore ranks first — again as the reference.
//!
//! **Limits:** `num_topk_sum ∈ {1, 2}` is kept (for more terms the fp32 summation order would
//! become part of the contract, and no model uses it). Upstream's kernel limit `G <= 32` (one
//! lane per group) is lifted: the CPU reference takes any `G` and `P`, the GPU op any `P` and
//! `G <= 1024` ([`MAX_GPU_GROUPS`]: the group scores sit in registers, 32 per slot; a larger `G`
//! is a [`TkError::Param`] naming `scores`) and `T < 2^32`. The contiguity requirement is relaxed
//! to a unit stride along `P`. `T == 0` gives an empty `(0, Gk)` output (no launch).
//!
//! **GPU kernel** (`cuda/topk_sum_and_topk_group_idx.cu`, feature `cuda`), specialised on
//! `(G, P, num_topk_sum, Gk)`: one warp per token. The token's `G·P` scores are copied to shared
//! memory with coalesced loads (rows of more than 2048 scores are scanned in global memory
//! instead), lane `l` scores groups `l, l + 32, ...`, and `Gk` warp selection rounds over the
//! group scores pick the groups (no overwriting: distinct indices). Bit-exact with the CPU
//! reference, NaN and `±inf` included. No host sync.

use tk_core::{Layout, Result, TkError};

use crate::checks::{check_rank, check_unit_last_stride};

/// The `(E, G)` configurations of the spec's `topk_sum_and_topk_group_idx` grid (§4.4, §6); each
/// runs with top-1 and top-2 group scores and 2 or 4 kept groups.
pub const SPEC_CONFIGS: [(usize, usize); 6] =
    [(72, 4), (72, 8), (72, 12), (256, 4), (256, 8), (256, 16)];

/// The parameters of `topk_sum_and_topk_group_idx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopkSumAndTopkGroupIdxParams {
    /// How many of a group's best scores are summed: 1 or 2 (and at most `P`).
    pub num_topk_sum: usize,
    /// `Gk`: groups returned per token, `1 <= Gk <= G`.
    pub num_topk_groups: usize,
}

/// The validated geometry of one `topk_sum_and_topk_group_idx` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopkGroupShape {
    /// `T`: tokens, may be 0.
    pub num_tokens: usize,
    /// `G`: groups per token.
    pub num_groups: usize,
    /// `P`: experts per group.
    pub group_size: usize,
    /// 1 or 2.
    pub num_topk_sum: usize,
    /// `Gk`.
    pub num_topk_groups: usize,
}

impl TopkGroupShape {
    /// The output shape `(T, Gk)`.
    pub fn out_shape(&self) -> [usize; 2] {
        [self.num_tokens, self.num_topk_groups]
    }
}

impl TopkSumAndTopkGroupIdxParams {
    /// Parameters summing the top `num_topk_sum` scores of each group and keeping
    /// `num_topk_groups` groups.
    pub const fn new(num_topk_sum: usize, num_topk_groups: usize) -> Self {
        Self {
            num_topk_sum,
            num_topk_groups,
        }
    }

    /// Validates `scores`' layout (rank 3 `(T, G, P)`, `G, P >= 1`, unit stride along `P`) and
    /// the parameters. Errors: [`TkError::Shape`] / [`TkError::Empty`] / [`TkError::Stride`]
    /// naming `scores`; [`TkError::Param`] naming `num_topk_sum` or `num_topk_groups`.
    pub fn validate(&self, scores: &Layout) -> Result<TopkGroupShape> {
        check_rank("scores", scores, 3, "rank 3 (T, G, P)")?;
        let (t, g, p) = (scores.shape()[0], scores.shape()[1], scores.shape()[2]);
        if g == 0 || p == 0 {
            return Err(TkError::Empty {
                arg: "scores",
                shape: scores.shape().to_vec(),
            });
        }
        check_unit_last_stride("scores", scores)?;
        if !(1..=2).contains(&self.num_topk_sum) || self.num_topk_sum > p {
            return Err(TkError::param(
                "num_topk_sum",
                format!(
                    "must be 1 or 2 and at most P = {p} (experts per group), got {}",
                    self.num_topk_sum
                ),
            ));
        }
        if self.num_topk_groups == 0 || self.num_topk_groups > g {
            return Err(TkError::param(
                "num_topk_groups",
                format!(
                    "must satisfy 1 <= num_topk_groups <= G = {g}, got {}",
                    self.num_topk_groups
                ),
            ));
        }
        Ok(TopkGroupShape {
            num_tokens: t,
            num_groups: g,
            group_size: p,
            num_topk_sum: self.num_topk_sum,
            num_topk_groups: self.num_topk_groups,
        })
    }
}

/// The most groups the GPU op takes (the group scores sit in registers, 32 groups per slot).
pub const MAX_GPU_GROUPS: usize = 1024;

#[cfg(feature = "cuda")]
pub use gpu::{kernel_spec, topk_sum_and_topk_group_idx, topk_sum_and_topk_group_idx_into};

/// The GPU op (feature `cuda`).
#[cfg(feature = "cuda")]
mod gpu {
    use cudarc::driver::PushKernelArg;
    use tk_core::error::DriverContext;
    use tk_core::{
        DeviceTensor, DeviceView, DeviceViewMut, KernelSource, KernelSpec, Result, TkError,
    };

    use super::{TopkGroupShape, TopkSumAndTopkGroupIdxParams, MAX_GPU_GROUPS};
    use crate::gpu::{check_device, check_out, check_tokens, token_grid, HEADERS, WARPS};

    static SOURCE: KernelSource = KernelSource {
        file: "topk_sum_and_topk_group_idx.cu",
        entry: "tk_topk_sum_and_topk_group_idx",
        code: include_str!("../cuda/topk_sum_and_topk_group_idx.cu"),
        headers: HEADERS,
        needs_cuda_headers: false,
    };

    /// Longest token row (`G·P` scores) staged in shared memory (8 KiB per warp).
    const MAX_STAGED_ROW: usize = 2048;

    /// The kernel specialisation for `G` groups of `P` experts, summing `num_topk_sum` scores
    /// per group and returning `Gk` groups.
    pub fn kernel_spec(
        num_groups: usize,
        group_size: usize,
        num_topk_sum: usize,
        num_topk_groups: usize,
    ) -> KernelSpec {
        KernelSpec::new(&SOURCE)
            .define("TK_G", num_groups)
            .define("TK_P", group_size)
            .define("TK_NSUM", num_topk_sum)
            .define("TK_GK", num_topk_groups)
            .define(
                "TK_STAGE",
                (num_groups * group_size <= MAX_STAGED_ROW) as u8,
            )
            .define("TK_WARPS", WARPS)
    }

    fn validate(
        scores: &DeviceView<'_, f32>,
        params: &TopkSumAndTopkGroupIdxParams,
    ) -> Result<TopkGroupShape> {
        let shape = params.validate(scores.layout())?;
        if shape.num_groups > MAX_GPU_GROUPS {
            return Err(TkError::param(
                "scores",
                format!(
                    "the GPU op takes at most {MAX_GPU_GROUPS} groups, got G = {}",
                    shape.num_groups
                ),
            ));
        }
        check_tokens("scores", shape.num_tokens)?;
        Ok(shape)
    }

    /// GPU `topk_sum_and_topk_group_idx(scores (T, G, P) fp32, params) -> (T, Gk)` i64,
    /// contiguous. See the module docs for the semantics, tie rule, NaN / inf behaviour and
    /// limits. Enqueued on `scores`' device stream; no host sync.
    ///
    /// Errors: those of [`TopkSumAndTopkGroupIdxParams::validate`], [`TkError::Param`] naming
    /// `scores` for `G > 1024` or `T >= 2^32`.
    pub fn topk_sum_and_topk_group_idx(
        scores: &DeviceView<'_, f32>,
        params: &TopkSumAndTopkGroupIdxParams,
    ) -> Result<DeviceTensor<i64>> {
        let shape = validate(scores, params)?;
        let mut out = scores.device().alloc::<i64>(&shape.out_shape())?;
        topk_sum_and_topk_group_idx_into(scores, params, &mut out.view_mut())?;
        Ok(out)
    }

    /// [`topk_sum_and_topk_group_idx`] into a caller-provided contiguous `out` `(T, Gk)` i64 on
    /// the same device. Errors: as [`topk_sum_and_topk_group_idx`], plus [`TkError::Shape`] /
    /// [`TkError::Stride`] / [`TkError::Placement`] naming `out`.
    pub fn topk_sum_and_topk_group_idx_into(
        scores: &DeviceView<'_, f32>,
        params: &TopkSumAndTopkGroupIdxParams,
        out: &mut DeviceViewMut<'_, i64>,
    ) -> Result<()> {
        let shape = validate(scores, params)?;
        check_out("out", out.layout(), &shape.out_shape())?;
        let dev = scores.device();
        check_device("out", dev, out.device())?;
        if shape.num_tokens == 0 {
            return Ok(());
        }
        let strides = scores.layout().strides();
        let (s0, s1) = (strides[0] as u64, strides[1] as u64);
        let t = shape.num_tokens as u32;
        let (x_addr, out_addr) = (scores.address(), out.address());
        let f = dev.function(&kernel_spec(
            shape.num_groups,
            shape.group_size,
            shape.num_topk_sum,
            shape.num_topk_groups,
        ))?;
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&out_addr).arg(&x_addr).arg(&s0).arg(&s1).arg(&t);
        // SAFETY: validate() and check_out() proved the layouts: the kernel reads
        // scores[t * s0 + q * s1 + j] for t < T, q < G, j < P (inside the bounds-checked view)
        // and writes out[t * Gk + r] for r < Gk into the contiguous (T, Gk) output. Both buffers
        // outlive the stream-ordered launch.
        unsafe { l.launch(token_grid(shape.num_tokens)) }
            .ctx("launching tk_topk_sum_and_topk_group_idx")?;
        Ok(())
    }
}
