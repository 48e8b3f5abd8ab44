//! `group_count` (`spec/moe.md` §4.7): a histogram of group (or expert) ids.
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `group_idx` | `(T, K)`, `T·K <= i32::MAX` | i64 | unit last stride, any row stride; entries `-1` or in `0..G` |
//! | `num_groups` (`G`) | `>= 1` | | |
//! | output | `(G,)` | i32 | contiguous |
//!
//! **Semantics (exact).** `out[g]` = number of entries equal to `g`; every entry counts (a row
//! listing an id twice counts it twice); `-1` entries are skipped. `T == 0` gives zeros.
//!
//! **Index contract** ([`crate::index`]): upstream device-asserts `-1 <= v < G`; the CPU returns
//! [`tk_core::TkError::Param`] naming `group_idx`, the GPU skips illegal entries (reads them as
//! `-1`).

use tk_core::{Layout, Result, TkError};

use crate::checks::{check_flat_fits_i32, check_matrix};

/// The parameters of `group_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCountParams {
    /// `G`: the number of bins, `>= 1`.
    pub num_groups: usize,
}

impl GroupCountParams {
    /// Parameters counting into `num_groups` bins.
    pub const fn new(num_groups: usize) -> Self {
        Self { num_groups }
    }

    /// Validates `group_idx` (rank 2 `(T, K)`, unit last stride, `T·K <= i32::MAX` so that
    /// every count fits in int32) and `num_groups >= 1`; returns `(T, K)`.
    ///
    /// Errors: [`TkError::Shape`] / [`TkError::Stride`] naming `group_idx`, [`TkError::Param`]
    /// naming `num_groups`.
    pub fn validate(&self, group_idx: &Layout) -> Result<(usize, usize)> {
        let (t, k) = check_matrix("group_idx", group_idx, "rank 2 (T, K)")?;
        check_flat_fits_i32("group_idx", t, k)?;
        if self.num_groups == 0 {
            return Err(TkError::param("num_groups", "must be >= 1, got 0"));
        }
        Ok((t, k))
    }
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// Launch plumbing shared by `group_count` and `aux_fi` (both count ids into `bins` counters
/// with `moe.cuh`'s `cluster_histogram`).
#[cfg(feature = "cuda")]
pub(crate) mod count {
    use cudarc::driver::LaunchConfig;
    use tk_core::{Result, TkError};

    use crate::gpu::config;

    /// CTAs of the counting cluster (the kernels' `CLUSTER`).
    const CLUSTER: u32 = 8;
    /// Threads per CTA (the kernels' `COUNT_THREADS`).
    const COUNT_THREADS: u32 = 1024;

    /// The launch of a counting kernel: one thread-block cluster (its size is compiled in).
    pub(crate) fn launch_config() -> LaunchConfig {
        config(CLUSTER, COUNT_THREADS)
    }

    /// The GPU limit on the bin count `bins` (the argument `arg`): `<= i32::MAX`.
    pub(crate) fn check_bins(arg: &'static str, bins: usize) -> Result<()> {
        if bins > i32::MAX as usize {
            return Err(TkError::param(
                arg,
                format!("must be <= {} on the GPU, got {bins}", i32::MAX),
            ));
        }
        Ok(())
    }
}

/// The GPU op (feature `cuda`). **Kernel** (`cuda/group_count.cu`): one launch of one
/// thread-block cluster of 8 CTAs × 1024 threads; each CTA counts a share of the entries into a
/// shared-memory histogram, and after a cluster barrier each bin's total is summed from the 8
/// histograms through distributed shared memory and written (zeros included: no memset). For
/// `G > 8192` the CTAs split the bins in windows of 8192 instead. Exact and deterministic (no
/// global atomics). Illegal entries are skipped (read as `-1`). No host sync.
///
/// GPU limit beyond [`GroupCountParams::validate`]: `G <= i32::MAX` ([`TkError::Param`] naming
/// `num_groups`).
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu {
    use cudarc::driver::PushKernelArg;
    use tk_core::error::DriverContext;
    use tk_core::{DeviceTensor, DeviceView, DeviceViewMut, KernelSource, KernelSpec, Result};

    use super::count::{check_bins, launch_config};
    use super::GroupCountParams;
    use crate::gpu::{check_device, check_out, flat_entries, row_stride, HEADERS};

    static SOURCE: KernelSource = KernelSource {
        file: "group_count.cu",
        entry: "tk_group_count",
        code: include_str!("../cuda/group_count.cu"),
        headers: HEADERS,
        needs_cuda_headers: false,
    };

    /// The kernel for `num_groups` bins.
    pub fn kernel_spec(num_groups: usize) -> KernelSpec {
        KernelSpec::new(&SOURCE).define("TK_G", num_groups)
    }

    /// Representative specialisations (the moe12 local expert counts), for compile checks and
    /// [`crate::prewarm`].
    pub fn registered_kernels() -> Vec<KernelSpec> {
        [4, 9, 32, 100_000].map(kernel_spec).to_vec()
    }

    /// GPU `group_count(group_idx (T, K) i64) -> (G,)` i32 into a new tensor (see the
    /// [module docs](mod@crate::group_count)).
    ///
    /// Errors: those of [`GroupCountParams::validate`].
    pub fn group_count(
        group_idx: &DeviceView<'_, i64>,
        params: &GroupCountParams,
    ) -> Result<DeviceTensor<i32>> {
        params.validate(group_idx.layout())?;
        let mut out = group_idx.device().alloc::<i32>(&[params.num_groups])?;
        group_count_into(group_idx, params, &mut out.view_mut())?;
        Ok(out)
    }

    /// [`group_count`] into a caller-provided contiguous `out (G,)` i32.
    ///
    /// Errors: as [`group_count`], and [`tk_core::TkError::Shape`] /
    /// [`tk_core::TkError::Stride`] / [`tk_core::TkError::Placement`] naming `out`.
    pub fn group_count_into(
        group_idx: &DeviceView<'_, i64>,
        params: &GroupCountParams,
        out: &mut DeviceViewMut<'_, i32>,
    ) -> Result<()> {
        let (t, k) = params.validate(group_idx.layout())?;
        check_bins("num_groups", params.num_groups)?;
        let dev = group_idx.device();
        check_device("out", dev, out.device())?;
        check_out("out", out.layout(), &[params.num_groups])?;
        let f = dev.function(&kernel_spec(params.num_groups))?;
        let counts = out.address();
        let (idx, ld) = (group_idx.address(), row_stride(group_idx.layout()));
        let (t64, k32, flat) = (t as u64, k as u32, flat_entries(group_idx));
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&counts)
            .arg(&idx)
            .arg(&ld)
            .arg(&t64)
            .arg(&k32)
            .arg(&flat);
        // SAFETY: the kernel reads group_idx[t, k] for t < T, k < K (the validated view; pairs
        // with one 16-byte load only when `flat` says the entries are one aligned run) and
        // writes counts[g] for every 0 <= g < G (the checked (G,) output); T·K <= i32::MAX.
        unsafe { l.launch(launch_config()) }.ctx("launching tk_group_count")?;
        Ok(())
    }
}
