//! `topk_gate` (`spec/moe.md` §4.3): the stable descending top-`k` of every row of a score
//! matrix.
//!
//! | argument | shape | dtype | layout |
//! |---|---|---|---|
//! | `scores` | `(T, E)`, `T >= 0`, `E >= 1` | fp32 | unit column stride, any row stride |
//! | `num_topk` (`k`) | `1 <= k <= E` | | |
//! | output `topk_idx` | `(T, k)` | i64 | contiguous |
//!
//! **Semantics.** Row `t` of the output lists the `k` best columns of `scores[t]`, best first:
//! `k` rounds of "take the maximum, the smallest index among equal maxima, and remove it". This
//! is upstream's reference `stable_topk` (a stable descending sort, first `k`).
//!
//! **Tie rule:** equal scores go to the smaller index; `-0.0` and `+0.0` are equal.
//!
//! **NaN / ±inf** ([`crate::ranking`]): `+inf` is an ordinary value. `-inf` entries are selected
//! like any value, and the indices of a row are always **distinct** (upstream's kernel can
//! repeat an index when it has to select `-inf` inputs; its reference does not — we follow the
//! reference). **NaN ranks above every number** (`+inf` included), NaNs tie with each other and
//! go to the smaller index: exactly `torch.sort(descending=True, stable=True)`, i.e. upstream's
//! reference (upstream's kernel returns garbage for NaN).
//!
//! **Limits:** none beyond the shape rules above (the GPU op also needs `T < 2^32`). Upstream's
//! kernel needs a contiguous input; any row stride is accepted here. `T == 0` gives an empty
//! `(0, k)` output (no launch).
//!
//! **GPU kernel** (`cuda/topk_gate.cu`, feature `cuda`), specialised on `(E, k)`: one warp per
//! token. For `E <= 1024` the row sits in registers as order keys (16-byte loads when the row
//! is 16-byte aligned); each lane caches its two best remaining candidates, and each of the
//! `k` rounds takes the warp's best `(key, index)` with two `redux.sync` reductions, the winning
//! lane moving its second candidate up (and rescanning its candidates ranked after the pick
//! only when its cache runs dry) — nothing is overwritten, so indices are distinct; longer rows
//! are re-read (from L1/L2) every round, each lane keeping its best ranked after the previous
//! pick. The op never synchronises with
//! the host. Results equal the CPU reference bit for bit (no arithmetic), NaN and `±inf`
//! included.

use tk_core::{Layout, Result, TkError};

use crate::checks::{check_rank, check_unit_last_stride};

/// The `(E, K)` configurations of the spec's `topk_gate` test and benchmark grid (§4.3, §6).
pub const SPEC_CONFIGS: [(usize, usize); 10] = [
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
];

/// The parameters of `topk_gate`: just `num_topk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopkGateParams {
    /// `k`: entries selected per row, `1 <= k <= E`.
    pub num_topk: usize,
}

/// The validated geometry of one `topk_gate` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopkGateShape {
    /// `T`: rows (tokens), may be 0.
    pub num_tokens: usize,
    /// `E`: columns (experts), at least 1.
    pub num_experts: usize,
    /// `k`.
    pub num_topk: usize,
}

impl TopkGateShape {
    /// The output shape `(T, k)`.
    pub fn out_shape(&self) -> [usize; 2] {
        [self.num_tokens, self.num_topk]
    }
}

impl TopkGateParams {
    /// Parameters selecting `num_topk` entries per row.
    pub const fn new(num_topk: usize) -> Self {
        Self { num_topk }
    }

    /// Validates `scores`' layout (rank 2 `(T, E)`, `E >= 1`, unit column stride) and
    /// `1 <= num_topk <= E`. Errors: [`TkError::Shape`] / [`TkError::Empty`] /
    /// [`TkError::Stride`] naming `scores`, [`TkError::Param`] naming `num_topk`.
    pub fn validate(&self, scores: &Layout) -> Result<TopkGateShape> {
        check_rank("scores", scores, 2, "rank 2 (T, E)")?;
        let (t, e) = (scores.shape()[0], scores.shape()[1]);
        if e == 0 {
            return Err(TkError::Empty {
                arg: "scores",
                shape: scores.shape().to_vec(),
            });
        }
        check_unit_last_stride("scores", scores)?;
        if self.num_topk == 0 || self.num_topk > e {
            return Err(TkError::param(
                "num_topk",
                format!(
                    "must satisfy 1 <= num_topk <= E = {e} (scores' column count), got {}",
                    self.num_topk
                ),
            ));
        }
        Ok(TopkGateShape {
            num_tokens: t,
            num_experts: e,
            num_topk: self.num_topk,
        })
    }
}

#[cfg(feature = "cuda")]
pub use gpu::{kernel_spec, topk_gate, topk_gate_into};

/// The GPU op (feature `cuda`).
#[cfg(feature = "cuda")]
mod gpu {
    use cudarc::driver::PushKernelArg;
    use tk_core::error::DriverContext;
    use tk_core::{DeviceTensor, DeviceView, DeviceViewMut, KernelSource, KernelSpec, Result};

    use super::TopkGateParams;
    use crate::gpu::{check_device, check_out, check_tokens, token_grid, HEADERS, WARPS};

    static SOURCE: KernelSource = KernelSource {
        file: "topk_gate.cu",
        entry: "tk_topk_gate",
        code: include_str!("../cuda/topk_gate.cu"),
        headers: HEADERS,
        needs_cuda_headers: false,
    };

    /// Longest row kept in registers (8 16-byte vectors per lane); longer rows are streamed.
    const MAX_REGISTER_ROW: usize = 1024;

    /// The kernel specialisation for `E` columns and `k` picks.
    pub fn kernel_spec(num_experts: usize, num_topk: usize) -> KernelSpec {
        let nv = if num_experts <= MAX_REGISTER_ROW {
            num_experts.div_ceil(128)
        } else {
            0
        };
        KernelSpec::new(&SOURCE)
            .define("TK_E", num_experts)
            .define("TK_K", num_topk)
            .define("TK_NV", nv)
            .define("TK_WARPS", WARPS)
    }

    /// GPU `topk_gate(scores (T, E) fp32, params) -> topk_idx (T, k)` i64, contiguous. See the
    /// module docs for the semantics, tie rule, NaN / `-inf` behaviour and limits. Enqueued on
    /// `scores`' device stream; no host sync.
    ///
    /// Errors: those of [`TopkGateParams::validate`], [`TkError::Param`](tk_core::TkError::Param)
    /// naming `scores` for `T >= 2^32`.
    pub fn topk_gate(
        scores: &DeviceView<'_, f32>,
        params: &TopkGateParams,
    ) -> Result<DeviceTensor<i64>> {
        let shape = params.validate(scores.layout())?;
        let mut out = scores.device().alloc::<i64>(&shape.out_shape())?;
        topk_gate_into(scores, params, &mut out.view_mut())?;
        Ok(out)
    }

    /// [`topk_gate`] into a caller-provided contiguous `out` of shape `(T, k)` i64 (on the same
    /// device). Errors: as [`topk_gate`], plus [`TkError::Shape`](tk_core::TkError::Shape) /
    /// [`TkError::Stride`](tk_core::TkError::Stride) / [`TkError::Placement`](tk_core::TkError::Placement)
    /// naming `out`.
    pub fn topk_gate_into(
        scores: &DeviceView<'_, f32>,
        params: &TopkGateParams,
        out: &mut DeviceViewMut<'_, i64>,
    ) -> Result<()> {
        let shape = params.validate(scores.layout())?;
        let t = check_tokens("scores", shape.num_tokens)?;
        check_out("out", out.layout(), &shape.out_shape())?;
        let dev = scores.device();
        check_device("out", dev, out.device())?;
        if t == 0 {
            return Ok(());
        }
        let ld = scores.layout().strides()[0] as u64;
        let (x_addr, out_addr) = (scores.address(), out.address());
        let vec = (x_addr % 16 == 0 && (ld % 4 == 0 || t == 1)) as u32;
        let f = dev.function(&kernel_spec(shape.num_experts, shape.num_topk))?;
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&out_addr).arg(&x_addr).arg(&ld).arg(&t).arg(&vec);
        // SAFETY: validate() and check_out() proved the layouts: the kernel reads
        // scores[t * ld + j] for t < T, j < E (inside the view, which is bounds-checked at
        // creation), with 16-byte loads only when the row starts are 16-byte aligned (`vec`),
        // and writes out[t * k + r] for r < k into the contiguous (T, k) output. Both buffers
        // outlive the stream-ordered launch.
        unsafe { l.launch(token_grid(shape.num_tokens)) }.ctx("launching tk_topk_gate")?;
        Ok(())
    }
}
