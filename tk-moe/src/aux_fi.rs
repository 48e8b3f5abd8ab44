//! `aux_fi` (`spec/moe.md` §4.6, §5.19): the per-expert load fraction `f_i` of the MoE
//! load-balancing loss.
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `topk_idx` | `(T, K)` | i64 | unit last stride, any row stride; entries `-1` or in `0..E` |
//! | `num_experts` (`E`) | `>= 1` | | |
//! | `num_aux_topk` | `>= 1` | | normaliser only |
//! | output `f` | `(E,)` | fp32 | contiguous |
//!
//! **Semantics (ours: exact, deterministic, bit-exact run to run).** With `c_e` the number of
//! entries equal to `e` (counted exactly, `-1` skipped):
//!
//! ```text
//! f[e] = fp32(c_e · E) / fp32(T · num_aux_topk)
//! ```
//!
//! The two integer products are exact (64-bit), each converted to fp32 once (RNE), then one
//! correctly rounded fp32 division. `T == 0` gives all zeros (no division).
//!
//! **Deviation from upstream.** Upstream's kernel adds one such quotient *per block* with fp32
//! atomics, so its result depends on the SM count and the atomics' order and is not
//! reproducible; its reference computes `float(c_e) · E`, then divides by `T · num_aux_topk`
//! in fp32 with torch's rounding. Ours is upstream's per-block formula applied once to the
//! global count: no order dependence at all, and within the spec's tolerance
//! (`calc_diff < 2e-7`) of both. GPU kernels must count exactly first (integer atomics) and
//! apply the formula once, so they match this reference bit for bit whatever the grid.
//!
//! **Index contract** ([`crate::index`]): the CPU rejects illegal entries
//! ([`TkError::Param`] naming `topk_idx`), the GPU skips them.

use tk_core::{Layout, Result, TkError};

use crate::checks::check_matrix;

/// The parameters of `aux_fi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuxFiParams {
    /// `E`, `>= 1`.
    pub num_experts: usize,
    /// The normaliser `num_aux_topk`, `>= 1`.
    pub num_aux_topk: usize,
}

impl AuxFiParams {
    /// Parameters for `E` experts and normaliser `num_aux_topk`.
    pub const fn new(num_experts: usize, num_aux_topk: usize) -> Self {
        Self {
            num_experts,
            num_aux_topk,
        }
    }

    /// The value of one expert: `fp32(count·E) / fp32(T·num_aux_topk)`, or `0.0` when
    /// `num_tokens == 0` (module docs).
    pub fn fraction(&self, count: u64, num_tokens: usize) -> f32 {
        if num_tokens == 0 {
            return 0.0;
        }
        let num = count as u128 * self.num_experts as u128;
        let den = num_tokens as u128 * self.num_aux_topk as u128;
        // u128 → f32 is one round-to-nearest-even conversion.
        num as f32 / den as f32
    }

    /// Validates `topk_idx` (rank 2 `(T, K)`, unit last stride), `num_experts >= 1` and
    /// `num_aux_topk >= 1`; returns `(T, K)`.
    ///
    /// Errors: [`TkError::Shape`] / [`TkError::Stride`] naming `topk_idx`, [`TkError::Param`]
    /// naming `num_experts` or `num_aux_topk`.
    pub fn validate(&self, topk_idx: &Layout) -> Result<(usize, usize)> {
        let tk = check_matrix("topk_idx", topk_idx, "rank 2 (T, K)")?;
        if self.num_experts == 0 {
            return Err(TkError::param("num_experts", "must be >= 1, got 0"));
        }
        if self.num_aux_topk == 0 {
            return Err(TkError::param("num_aux_topk", "must be >= 1, got 0"));
        }
        Ok(tk)
    }
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU op (feature `cuda`). **Kernel** (`cuda/aux_fi.cu`): one launch, no memset: the ids
/// are counted exactly as in `group_count` (shared-memory histograms over the whole GPU, summed
/// with integer global atomics in the per-stream workspace), and the thread that sees an
/// expert's exact total (for `E <= 256` the last CTA to reach that expert, else the last CTA)
/// applies the formula once: `fp32(c_e·E)` (one RNE conversion of the exact 64-bit product)
/// divided (`__fdiv_rn`) by `fp32(T·num_aux_topk)` computed on the host. Bit-exact with the
/// CPU reference and identical run to run, whatever the grid. Illegal entries are skipped
/// (read as `-1`). No host sync.
///
/// GPU limits beyond [`AuxFiParams::validate`]: `T·K <= i32::MAX` and `E <= i32::MAX`
/// ([`TkError::Shape`] naming `topk_idx` / [`TkError::Param`] naming `num_experts`). The
/// stream's workspace is sized as for `group_count` (allocated by the first call on the stream
/// that needs it: not inside a graph capture; see [`crate::prewarm`]).
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu {
    use cudarc::driver::PushKernelArg;
    use tk_core::error::DriverContext;
    use tk_core::{DeviceTensor, DeviceView, DeviceViewMut, KernelSource, KernelSpec, Result};

    use super::AuxFiParams;
    use crate::checks::check_flat_fits_i32;
    use crate::gpu::{check_device, check_out, flat_entries, row_stride, HEADERS};
    use crate::group_count::count::{check_bins, launch_config, workspace};

    static SOURCE: KernelSource = KernelSource {
        file: "aux_fi.cu",
        entry: "tk_aux_fi",
        code: include_str!("../cuda/aux_fi.cu"),
        headers: HEADERS,
        needs_cuda_headers: false,
    };

    /// The kernel for `num_experts` experts.
    pub fn kernel_spec(num_experts: usize) -> KernelSpec {
        KernelSpec::new(&SOURCE).define("TK_E", num_experts)
    }

    /// Representative specialisations (the moe12 local expert counts), for compile checks and
    /// [`crate::prewarm`].
    pub fn registered_kernels() -> Vec<KernelSpec> {
        [4, 9, 32, 100_000].map(kernel_spec).to_vec()
    }

    /// GPU `aux_fi(topk_idx (T, K) i64) -> f (E,)` fp32 into a new tensor (see the
    /// [module docs](mod@crate::aux_fi)).
    ///
    /// Errors: those of [`AuxFiParams::validate`] and the GPU limits above.
    pub fn aux_fi(
        topk_idx: &DeviceView<'_, i64>,
        params: &AuxFiParams,
    ) -> Result<DeviceTensor<f32>> {
        params.validate(topk_idx.layout())?;
        let mut out = topk_idx.device().alloc::<f32>(&[params.num_experts])?;
        aux_fi_into(topk_idx, params, &mut out.view_mut())?;
        Ok(out)
    }

    /// [`aux_fi`] into a caller-provided contiguous `f (E,)` fp32.
    ///
    /// Errors: as [`aux_fi`], and [`tk_core::TkError::Shape`] /
    /// [`tk_core::TkError::Stride`] / [`tk_core::TkError::Placement`] naming `out`.
    pub fn aux_fi_into(
        topk_idx: &DeviceView<'_, i64>,
        params: &AuxFiParams,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let (t, k) = params.validate(topk_idx.layout())?;
        check_flat_fits_i32("topk_idx", t, k)?;
        let e = params.num_experts;
        check_bins("num_experts", e)?;
        let dev = topk_idx.device();
        check_device("out", dev, out.device())?;
        check_out("out", out.layout(), &[e])?;
        let f = dev.function(&kernel_spec(e))?;
        let f_addr = out.address();
        let ws = workspace(dev, e)?;
        let (idx, ld) = (topk_idx.address(), row_stride(topk_idx.layout()));
        let (t64, k32, flat) = (t as u64, k as u32, flat_entries(topk_idx));
        // fp32(T·num_aux_topk), rounded once as the CPU reference does (0 when T == 0: unused).
        let den = (t as u128 * params.num_aux_topk as u128) as f32;
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&f_addr)
            .arg(&ws)
            .arg(&idx)
            .arg(&ld)
            .arg(&t64)
            .arg(&k32)
            .arg(&flat)
            .arg(&den);
        // SAFETY: the kernel reads topk_idx[t, k] for t < T, k < K (the validated view; pairs
        // with one 16-byte load only when `flat` says the entries are one aligned run) and
        // writes f[e] for every 0 <= e < E (the checked (E,) output). It updates the first
        // `workspace_words(E)` words of the stream's workspace (`workspace` allocated at least
        // that many) and leaves them zero; launches on this stream are ordered, so no other
        // kernel uses them meanwhile.
        unsafe { l.launch(launch_config(dev, t * k)) }.ctx("launching tk_aux_fi")?;
        Ok(())
    }
}
