//! `normalize_weight` (`spec/moe.md` §4.10, §5.5): divide each token's top-k weights by their
//! sum.
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `topk_weights` | `(T, K)` | fp32 | unit last stride, any row stride; `K = 0` allowed |
//! | output `denominator` | `(T,)` | fp32 | contiguous |
//! | output `normalized_weights` | `(T, K)` | fp32 | contiguous |
//!
//! **Semantics (bit-exact).** `den_t = ((fp32(1e-20) + w[t,0]) + w[t,1]) + … + w[t,K-1]`:
//! sequential fp32 additions in slot order starting from `fp32(1e-20)` ([`DENOMINATOR_EPS`],
//! the convention of `top2_sum_gate`), then `normalized[t,k] = w[t,k] / den_t`, one correctly
//! rounded fp32 division. Weights are not checked (negative, infinite or NaN weights propagate
//! by IEEE rules). Identical to upstream's kernel and reference.

use tk_core::{Layout, Result};

use crate::checks::check_matrix;

/// `1e-20` as fp32: the first term of every denominator.
pub const DENOMINATOR_EPS: f32 = 1e-20;

/// The parameters of `normalize_weight` (there are none besides the tensor).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NormalizeWeightParams;

impl NormalizeWeightParams {
    /// Validates `topk_weights` (rank 2 `(T, K)`, unit last stride) and returns `(T, K)`.
    ///
    /// Errors: [`tk_core::TkError::Shape`] / [`tk_core::TkError::Stride`] naming `topk_weights`.
    pub fn validate(&self, topk_weights: &Layout) -> Result<(usize, usize)> {
        check_matrix("topk_weights", topk_weights, "rank 2 (T, K)")
    }
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU op (feature `cuda`). **Kernel** (`cuda/normalize_weight.cu`): one thread per token,
/// `K` a compile-time constant; `__fadd_rn` in slot order and `__fdiv_rn`, so the bits equal
/// the CPU reference's. No host sync; nothing is launched for `T == 0`.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu {
    use cudarc::driver::PushKernelArg;
    use tk_core::error::DriverContext;
    use tk_core::{DeviceTensor, DeviceView, DeviceViewMut, KernelSource, KernelSpec, Result};

    use super::NormalizeWeightParams;
    use crate::gpu::{
        access_bytes, blocks, check_device, check_out, config, row_stride, HEADERS, THREADS,
    };

    static SOURCE: KernelSource = KernelSource {
        file: "normalize_weight.cu",
        entry: "tk_normalize_weight",
        code: include_str!("../cuda/normalize_weight.cu"),
        headers: HEADERS,
        needs_cuda_headers: false,
    };

    /// The kernel for `num_topk` slots.
    pub fn kernel_spec(num_topk: usize) -> KernelSpec {
        KernelSpec::new(&SOURCE).define("TK_K", num_topk)
    }

    /// Representative specialisations (the spec's top-k values), for compile checks and
    /// [`crate::prewarm`].
    pub fn registered_kernels() -> Vec<KernelSpec> {
        [2, 6, 8, 9].map(kernel_spec).to_vec()
    }

    /// GPU `normalize_weight(topk_weights (T, K) fp32) -> (denominator (T,), normalized (T, K))`
    /// into new tensors (see the [module docs](mod@crate::normalize_weight)).
    ///
    /// Errors: those of [`NormalizeWeightParams::validate`].
    pub fn normalize_weight(
        topk_weights: &DeviceView<'_, f32>,
    ) -> Result<(DeviceTensor<f32>, DeviceTensor<f32>)> {
        let (t, k) = NormalizeWeightParams.validate(topk_weights.layout())?;
        let dev = topk_weights.device();
        let (mut den, mut out) = (dev.alloc::<f32>(&[t])?, dev.alloc::<f32>(&[t, k])?);
        normalize_weight_into(topk_weights, &mut den.view_mut(), &mut out.view_mut())?;
        Ok((den, out))
    }

    /// [`normalize_weight`] into caller-provided contiguous `denominator (T,)` and
    /// `normalized (T, K)`. With `K == 0` every denominator is `1e-20` (the kernel still runs).
    ///
    /// Errors: as [`normalize_weight`], and [`tk_core::TkError::Shape`] /
    /// [`tk_core::TkError::Stride`] / [`tk_core::TkError::Placement`] naming an output.
    pub fn normalize_weight_into(
        topk_weights: &DeviceView<'_, f32>,
        denominator: &mut DeviceViewMut<'_, f32>,
        normalized: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let (t, k) = NormalizeWeightParams.validate(topk_weights.layout())?;
        let dev = topk_weights.device();
        check_device("denominator", dev, denominator.device())?;
        check_device("normalized", dev, normalized.device())?;
        check_out("denominator", denominator.layout(), &[t])?;
        check_out("normalized", normalized.layout(), &[t, k])?;
        if t == 0 {
            return Ok(());
        }
        let f = dev.function(&kernel_spec(k))?;
        let (den, out) = (denominator.address(), normalized.address());
        let (w, ld, t64) = (
            topk_weights.address(),
            row_stride(topk_weights.layout()),
            t as u64,
        );
        // 16-byte row accesses when every row of w and of out starts on a 16-byte boundary.
        let vec = (k % 4 == 0 && access_bytes(&[w, ld * 4, out]) == 16) as u32;
        // One thread per token in CTAs of 256 (85 CTAs at T = 21671). H200 (meas23, two
        // runs): 256-thread CTAs 1.95-1.98 us at K = 8, T = 21671 against 1.98-2.02 with 128
        // and 2.02 with 64 or 32 (one 32 ns CUPTI tick: within noise, but never slower).
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&den).arg(&out).arg(&w).arg(&ld).arg(&t64).arg(&vec);
        // SAFETY: thread t < T reads w[t, 0..K] (the validated view; 16-byte vectors only when
        // `vec` says every row is aligned and K % 4 == 0) and writes den[t] and out[t, 0..K]
        // (checked contiguous outputs); the buffers outlive the launch.
        unsafe { l.launch(config(blocks(t, THREADS as usize), THREADS)) }
            .ctx("launching tk_normalize_weight")?;
        Ok(())
    }
}
