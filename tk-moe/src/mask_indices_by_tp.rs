//! `mask_indices_by_tp` (`spec/moe.md` §2 "EP/TP masking", §4.8): keep the expert ids owned by
//! one tensor-parallel rank and renumber them into its compact local space.
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `indices` | `(T, K)` | i64 or i32 ([`IndexElement`](crate::index::IndexElement)) | unit last stride, any row stride; entries `-1` or in `0..n` |
//! | `num_experts` (`n`) | `>= num_ep_ranks` | | experts over all EP ranks |
//! | `num_ep_ranks`, `num_tp_ranks` | `>= 1` | | |
//! | `tp_rank` | `< num_tp_ranks` | | |
//! | output | `(T, K)` | as `indices` | contiguous |
//!
//! **Semantics** ([`MaskIndicesByTpParams::mask`]), with `R = per_gpu = n / num_ep_ranks`
//! (floor) and `per_dp = num_tp_ranks · R`, element-wise on `v`:
//! * `-1`, or `(v / R) mod num_tp_ranks != tp_rank` → `-1`;
//! * otherwise `v' = v - tp_rank·R`, `dp = v' / per_dp`, output `v' - dp·(per_dp - R)`
//!   (equal to `(v / R / num_tp_ranks)·R + v mod R`; never negative once kept).
//!
//! **Index contract** ([`crate::index`]): entries must be `-1` or in `0..n`. Upstream maps every
//! negative value to `-1` and applies the formula to any id `>= n`; the CPU rejects both
//! ([`TkError::Param`] naming `indices`), the GPU reads them as `-1` (so a negative value still
//! gives `-1`, as upstream).

use tk_core::{Layout, Result, TkError};

use crate::checks::check_matrix;

/// The parameters of `mask_indices_by_tp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskIndicesByTpParams {
    /// `n`: experts over all EP ranks.
    pub num_experts: usize,
    /// EP ranks, `>= 1`.
    pub num_ep_ranks: usize,
    /// This TP rank, `< num_tp_ranks`.
    pub tp_rank: usize,
    /// TP ranks, `>= 1`.
    pub num_tp_ranks: usize,
}

impl MaskIndicesByTpParams {
    /// `R = n / num_ep_ranks` (floor): experts per EP rank.
    pub const fn per_gpu(&self) -> usize {
        self.num_experts / self.num_ep_ranks
    }

    /// `per_dp = num_tp_ranks · R`.
    pub const fn per_dp(&self) -> usize {
        self.num_tp_ranks * self.per_gpu()
    }

    /// The output for one legal id `v` (`-1` or in `0..n`; a validated call). Uses the
    /// implementations' formula (module docs).
    pub fn mask(&self, v: i64) -> i64 {
        let r = self.per_gpu() as i64;
        let tp = self.num_tp_ranks as i64;
        let tp_rank = self.tp_rank as i64;
        if v < 0 || (v / r) % tp != tp_rank {
            return -1;
        }
        let per_dp = r * tp;
        let v = v - tp_rank * r;
        let dp = v / per_dp;
        let out = v - dp * (per_dp - r);
        if out < 0 {
            -1
        } else {
            out
        }
    }

    /// Validates `indices` (rank 2 `(T, K)`, unit last stride) and the parameters
    /// (`num_ep_ranks >= 1`, `num_tp_ranks >= 1`, `tp_rank < num_tp_ranks`,
    /// `R = n / num_ep_ranks >= 1`);
    /// returns `(T, K)`.
    ///
    /// Errors: [`TkError::Shape`] / [`TkError::Stride`] naming `indices`, [`TkError::Param`]
    /// naming the parameter.
    pub fn validate(&self, indices: &Layout) -> Result<(usize, usize)> {
        let tk = check_matrix("indices", indices, "rank 2 (T, K)")?;
        if self.num_ep_ranks == 0 {
            return Err(TkError::param("num_ep_ranks", "must be >= 1, got 0"));
        }
        if self.num_tp_ranks == 0 {
            return Err(TkError::param("num_tp_ranks", "must be >= 1, got 0"));
        }
        if self.tp_rank >= self.num_tp_ranks {
            return Err(TkError::param(
                "tp_rank",
                format!(
                    "must be < num_tp_ranks = {}, got {}",
                    self.num_tp_ranks, self.tp_rank
                ),
            ));
        }
        if self.per_gpu() == 0 {
            return Err(TkError::param(
                "num_experts",
                format!(
                    "must be >= num_ep_ranks = {} (at least one expert per rank), got {}",
                    self.num_ep_ranks, self.num_experts
                ),
            ));
        }
        if self.num_experts > i64::MAX as usize
            || self.num_tp_ranks.checked_mul(self.per_gpu()).is_none()
        {
            return Err(TkError::param("num_experts", "too large"));
        }
        Ok(tk)
    }
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU op (feature `cuda`). **Kernel** (`cuda/mask_indices_by_tp.cu`): element-wise, one
/// thread per entry (grid-stride), specialised on the index type and `K`; the parameters are
/// kernel arguments (one compiled kernel serves every rank). Illegal entries (negative, or
/// `>= n`) give `-1`. No host sync; nothing is launched for `T == 0`.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu {
    use cudarc::driver::PushKernelArg;
    use tk_core::error::DriverContext;
    use tk_core::{
        DType, DeviceTensor, DeviceView, DeviceViewMut, KernelSource, KernelSpec, Result,
    };

    use super::MaskIndicesByTpParams;
    use crate::gpu::{blocks, check_device, check_out, config, row_stride, HEADERS, THREADS};
    use crate::index::IndexElement;

    static SOURCE: KernelSource = KernelSource {
        file: "mask_indices_by_tp.cu",
        entry: "tk_mask_indices_by_tp",
        code: include_str!("../cuda/mask_indices_by_tp.cu"),
        headers: HEADERS,
        needs_cuda_headers: false,
    };

    /// The kernel for `dtype` (i32 or i64) indices with `num_topk` slots per row.
    pub fn kernel_spec(dtype: DType, num_topk: usize) -> KernelSpec {
        KernelSpec::new(&SOURCE)
            .define("TK_I64", (dtype == DType::I64) as u8)
            .define("TK_K", num_topk)
    }

    /// Representative specialisations (the spec's top-k values, both index types), for compile
    /// checks and [`crate::prewarm`].
    pub fn registered_kernels() -> Vec<KernelSpec> {
        [2, 6, 8, 9]
            .into_iter()
            .flat_map(|k| [kernel_spec(DType::I64, k), kernel_spec(DType::I32, k)])
            .collect()
    }

    /// GPU `mask_indices_by_tp(indices (T, K), params) -> (T, K)` of the same index type, into
    /// a new tensor (see the [module docs](mod@crate::mask_indices_by_tp)).
    ///
    /// Errors: those of [`MaskIndicesByTpParams::validate`].
    pub fn mask_indices_by_tp<I: IndexElement>(
        indices: &DeviceView<'_, I>,
        params: &MaskIndicesByTpParams,
    ) -> Result<DeviceTensor<I>> {
        let (t, k) = params.validate(indices.layout())?;
        let mut out = indices.device().alloc::<I>(&[t, k])?;
        mask_indices_by_tp_into(indices, params, &mut out.view_mut())?;
        Ok(out)
    }

    /// [`mask_indices_by_tp`] into a caller-provided contiguous `out (T, K)`.
    ///
    /// Errors: as [`mask_indices_by_tp`], and [`tk_core::TkError::Shape`] /
    /// [`tk_core::TkError::Stride`] / [`tk_core::TkError::Placement`] naming `out`.
    pub fn mask_indices_by_tp_into<I: IndexElement>(
        indices: &DeviceView<'_, I>,
        params: &MaskIndicesByTpParams,
        out: &mut DeviceViewMut<'_, I>,
    ) -> Result<()> {
        let (t, k) = params.validate(indices.layout())?;
        let dev = indices.device();
        check_device("out", dev, out.device())?;
        check_out("out", out.layout(), &[t, k])?;
        if t * k == 0 {
            return Ok(());
        }
        let f = dev.function(&kernel_spec(I::DTYPE, k))?;
        let (o, i, ld, t64) = (
            out.address(),
            indices.address(),
            row_stride(indices.layout()),
            t as u64,
        );
        let (n, r, tp, rank) = (
            params.num_experts as i64,
            params.per_gpu() as i64,
            params.num_tp_ranks as i64,
            params.tp_rank as i64,
        );
        // 32-bit arithmetic when every value fits (ids < n, r·tp).
        let narrow = (n <= u32::MAX as i64
            && r.checked_mul(tp).is_some_and(|p| p <= u32::MAX as i64)) as u32;
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&o)
            .arg(&i)
            .arg(&ld)
            .arg(&t64)
            .arg(&n)
            .arg(&r)
            .arg(&tp)
            .arg(&rank)
            .arg(&narrow);
        // SAFETY: thread i < T·K reads indices[i / K, i % K] (the validated view) and writes
        // out[i] (the checked contiguous (T, K) output); the buffers outlive the launch.
        unsafe { l.launch(config(blocks(t * k, THREADS as usize), THREADS)) }
            .ctx("launching tk_mask_indices_by_tp")?;
        Ok(())
    }
}
