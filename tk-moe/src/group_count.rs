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

/// Launch plumbing shared by `group_count` and `aux_fi` (both count ids into `bins` bins with
/// `moe.cuh`'s `grid_histogram`).
#[cfg(feature = "cuda")]
pub(crate) mod count {
    use cudarc::driver::LaunchConfig;
    use tk_core::{Device, Result, TkError};

    use crate::gpu::{blocks, config};
    use crate::workspace::zeroed_words;

    /// Threads per CTA (the kernels' `COUNT_THREADS`).
    const COUNT_THREADS: u32 = 256;
    /// Pairs of entries each thread loads together (the kernels' `COUNT_PAIRS`).
    const COUNT_PAIRS: usize = 4;
    /// CTAs per SM at most (the CTAs loop over larger inputs).
    const CTAS_PER_SM: u32 = 4;
    /// Bins up to which the kernels finish per bin (`moe.cuh` `ARRIVAL_BINS`): one 64-bit
    /// arrival word per bin in the workspace.
    const ARRIVAL_BINS: usize = COUNT_THREADS as usize;

    /// The launch of a counting kernel over `entries` index entries: one CTA per
    /// `2·COUNT_PAIRS·COUNT_THREADS` entries (every load in flight at once), at most
    /// `CTAS_PER_SM` per SM.
    pub(crate) fn launch_config(dev: &Device, entries: usize) -> LaunchConfig {
        let most = dev.props().sm_count.max(1) * CTAS_PER_SM;
        let per_cta = 2 * COUNT_PAIRS * COUNT_THREADS as usize;
        config(blocks(entries, per_cta).min(most), COUNT_THREADS)
    }

    /// The u32 words of the workspace of a counting kernel with `bins` bins: `bins` packed
    /// 64-bit arrival words up to `ARRIVAL_BINS` bins, else a ticket and `bins` counters.
    fn workspace_words(bins: usize) -> usize {
        if bins <= ARRIVAL_BINS {
            2 * bins
        } else {
            1 + bins
        }
    }

    /// The zeroed workspace of a counting kernel with `bins` bins on `dev`'s stream
    /// (`crate::workspace`, [`workspace_words`] words).
    pub(crate) fn workspace(dev: &Device, bins: usize) -> Result<u64> {
        zeroed_words(dev, workspace_words(bins))
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

    /// A CPU model of the per-bin arrival finish (`moe.cuh` `finish_by_arrival`): whatever the
    /// order in which the CTAs' atomics reach a bin's word, exactly one CTA sees all the other
    /// arrivals, its total is the exact count, and the word ends at zero.
    #[cfg(test)]
    mod tests {
        use tk_core::testing::Rng;

        #[test]
        fn arrival_finish_is_exact_in_any_order() {
            let mut rng = Rng::for_case("arrival model");
            for ctas in [1u32, 2, 86, 528] {
                let counts: Vec<u32> = (0..ctas).map(|_| rng.below(5000) as u32).collect();
                let mut order: Vec<usize> = (0..ctas as usize).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.below(i as u64 + 1) as usize);
                }
                let mut word = 0u64;
                let mut puts = Vec::new();
                for &b in &order {
                    let c = counts[b];
                    let old = word;
                    word = word.wrapping_add((1u64 << 32) | c as u64);
                    if (old >> 32) as u32 == ctas - 1 {
                        puts.push((old as u32).wrapping_add(c));
                        word = 0;
                    }
                }
                let total: u32 = counts.iter().sum();
                assert_eq!(puts, vec![total], "{ctas} CTAs");
                assert_eq!(word, 0);
            }
        }
    }
}

/// The GPU op (feature `cuda`). **Kernel** (`cuda/group_count.cu`): one launch over the whole
/// GPU (CTAs of 256 threads, each loading 4 pairs of entries per thread at once); each CTA
/// counts its share of the entries into a shared-memory histogram. For `G <= 256` every CTA then
/// adds `(1 << 32) | count` to each bin's 64-bit arrival word with one returning atomic per bin,
/// and the CTA whose atomic returns all the other CTAs' arrivals writes that bin (the returned
/// count plus its own) and stores the word back to zero: no fence, no ticket. For larger `G`
/// each CTA adds its non-zero bins to integer counters with global atomics (for `G > 8192`,
/// every entry is one global atomic), and the last CTA to finish (a ticket) writes every bin
/// and resets the counters. Zeros are written too. The words live in a per-stream zeroed
/// workspace that every launch leaves zero (no memset launch; see `prewarm` before graph
/// capture). Exact and deterministic (integer sums). Illegal entries are skipped (read as
/// `-1`). No host sync.
///
/// GPU limit beyond [`GroupCountParams::validate`]: `G <= i32::MAX` ([`TkError::Param`] naming
/// `num_groups`). The stream's workspace holds `G + 1` counters (4 bytes each), or for
/// `G <= 256` one packed 64-bit word per bin, rounded up to a power of two, at least 16 KiB,
/// kept for later calls on that stream; it is allocated (and zero-filled) by the first call on
/// the stream that needs it, which therefore must not be inside a CUDA graph capture
/// ([`crate::prewarm`] prepares 4095 bins).
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu {
    use cudarc::driver::PushKernelArg;
    use tk_core::error::DriverContext;
    use tk_core::{DeviceTensor, DeviceView, DeviceViewMut, KernelSource, KernelSpec, Result};

    use super::count::{check_bins, launch_config, workspace};
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
        let ws = workspace(dev, params.num_groups)?;
        let (idx, ld) = (group_idx.address(), row_stride(group_idx.layout()));
        let (t64, k32, flat) = (t as u64, k as u32, flat_entries(group_idx));
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&counts)
            .arg(&ws)
            .arg(&idx)
            .arg(&ld)
            .arg(&t64)
            .arg(&k32)
            .arg(&flat);
        // SAFETY: the kernel reads group_idx[t, k] for t < T, k < K (the validated view; pairs
        // with one 16-byte load only when `flat` says the entries are one aligned run) and
        // writes counts[g] for every 0 <= g < G (the checked (G,) output); T·K <= i32::MAX. It
        // updates the first `workspace_words(G)` words of the stream's workspace (`workspace`
        // allocated at least that many) and leaves them zero; launches on this stream are
        // ordered, so no other kernel uses them meanwhile.
        unsafe { l.launch(launch_config(dev, t * k)) }.ctx("launching tk_group_count")?;
        Ok(())
    }
}
