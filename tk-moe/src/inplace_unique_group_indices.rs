//! `inplace_unique_group_indices` (`spec/moe.md` §4.9, §5.11, §5.12): remove repeated group ids
//! from each token's row, in place.
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `group_indices` | `(T, K)` | i64 | contiguous, modified in place; entries `-1` or in `0..G` |
//! | `num_groups` (`G`) | `1 <= G <=` [`MAX_GROUPS`] | | |
//!
//! **Semantics.** Per row, scan the slots left to right; a value `>= 0` that already appeared in
//! an earlier slot of the row becomes `-1`. **The leftmost occurrence is kept**; `-1` is never
//! changed and never counts as seen. The op reports how many entries it changed.
//!
//! **Index contract** ([`crate::index`]). Upstream's kernel device-asserts `v < align(G, 64)`
//! and leaves other negative values untouched (its reference instead dedupes repeated negative
//! values too). Here entries must be `-1` or in `0..G`: the CPU checks the whole tensor first and
//! returns [`TkError::Param`] naming `group_indices` **without modifying it**; the GPU reads
//! (and writes back) illegal entries as `-1`.

use tk_core::{Layout, Result, TkError};

use crate::checks::check_matrix;

/// The largest `num_groups` (two 64-bit seen-masks per row upstream).
pub const MAX_GROUPS: usize = 128;

/// The parameters of `inplace_unique_group_indices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InplaceUniqueGroupIndicesParams {
    /// `G`, `1..=`[`MAX_GROUPS`].
    pub num_groups: usize,
}

impl InplaceUniqueGroupIndicesParams {
    /// Parameters for ids in `0..num_groups`.
    pub const fn new(num_groups: usize) -> Self {
        Self { num_groups }
    }

    /// Validates `group_indices` (rank 2 `(T, K)`, unit last stride) and
    /// `1 <= num_groups <= 128`; returns `(T, K)`.
    ///
    /// Errors: [`TkError::Shape`] / [`TkError::Stride`] naming `group_indices`,
    /// [`TkError::Param`] naming `num_groups`.
    pub fn validate(&self, group_indices: &Layout) -> Result<(usize, usize)> {
        let tk = check_matrix("group_indices", group_indices, "rank 2 (T, K)")?;
        if self.num_groups == 0 || self.num_groups > MAX_GROUPS {
            return Err(TkError::param(
                "num_groups",
                format!(
                    "must satisfy 1 <= num_groups <= {MAX_GROUPS}, got {}",
                    self.num_groups
                ),
            ));
        }
        Ok(tk)
    }
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU op (feature `cuda`). **Kernel** (`cuda/inplace_unique_group_indices.cu`): one thread
/// per row with two 64-bit seen-masks, `K` and `G` compile-time constants. Illegal entries
/// (negative other than `-1`, or `>= G`) are written back as `-1` and never count as seen. The
/// GPU op does not report the number of changed entries (that would need a host sync). No host
/// sync; nothing is launched for `T == 0`.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu {
    use cudarc::driver::PushKernelArg;
    use tk_core::error::DriverContext;
    use tk_core::{DeviceViewMut, KernelSource, KernelSpec, Result};

    use super::InplaceUniqueGroupIndicesParams;
    use crate::gpu::{blocks, config, row_stride, HEADERS, ROW_THREADS};

    static SOURCE: KernelSource = KernelSource {
        file: "inplace_unique_group_indices.cu",
        entry: "tk_inplace_unique_group_indices",
        code: include_str!("../cuda/inplace_unique_group_indices.cu"),
        headers: HEADERS,
        needs_cuda_headers: false,
    };

    /// The kernel for `num_topk` slots per row and `num_groups` groups.
    pub fn kernel_spec(num_topk: usize, num_groups: usize) -> KernelSpec {
        KernelSpec::new(&SOURCE)
            .define("TK_K", num_topk)
            .define("TK_G", num_groups)
    }

    /// Representative specialisations (the spec's top-k values and group counts), for compile
    /// checks and [`crate::prewarm`].
    pub fn registered_kernels() -> Vec<KernelSpec> {
        let mut v = Vec::new();
        for k in [2, 6, 8, 9] {
            for g in [8, 16, 72, 128] {
                v.push(kernel_spec(k, g));
            }
        }
        v
    }

    /// GPU `inplace_unique_group_indices(group_indices (T, K) i64)`, in place (see the
    /// [module docs](mod@crate::inplace_unique_group_indices)). Any row stride (unit last stride).
    ///
    /// Errors: those of [`InplaceUniqueGroupIndicesParams::validate`].
    pub fn inplace_unique_group_indices(
        group_indices: &mut DeviceViewMut<'_, i64>,
        params: &InplaceUniqueGroupIndicesParams,
    ) -> Result<()> {
        let (t, k) = params.validate(group_indices.layout())?;
        if t == 0 || k == 0 {
            return Ok(());
        }
        let dev = group_indices.device();
        let f = dev.function(&kernel_spec(k, params.num_groups))?;
        let ld = row_stride(group_indices.layout());
        let (idx, t64) = (group_indices.address(), t as u64);
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&idx).arg(&ld).arg(&t64);
        // SAFETY: thread t < T reads and writes group_indices[t, 0..K] only (the validated
        // view); the buffer outlives the launch.
        unsafe { l.launch(config(blocks(t, ROW_THREADS as usize), ROW_THREADS)) }
            .ctx("launching tk_inplace_unique_group_indices")?;
        Ok(())
    }
}
