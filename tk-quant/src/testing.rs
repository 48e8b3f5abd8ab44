//! Test support for the quantization kernels: a test kernel that compares the fast scale
//! arithmetic of `cuda/quant_scale.cuh` with the division forms it replaces, bit for bit, on
//! the GPU.

use tk_core::{KernelSource, KernelSpec};

static SCALE_CHECK: KernelSource = KernelSource {
    file: "scale_check.cu",
    entry: "tk_scale_check",
    code: include_str!("../cuda/scale_check.cu"),
    headers: &[(
        "tk/quant_scale.cuh",
        include_str!("../cuda/quant_scale.cuh"),
    )],
    needs_cuda_headers: true,
};

/// The test kernel `tk_scale_check(lo: u32, hi: u32, out: *mut u32)`: for every fp32 `c` with
/// bits `lo ..= hi` it compares `scale_pair_e4m3_fast(c)` with `scale_pair<false>(c, 1e-4,
/// 448)` (the e4m3 scales of `tk_core::convert::compute_scale`, not rounded); `out[0]` counts
/// the pairs that differ (`atomicAdd`), `out[1]` gets the smallest such bits (`atomicMin`) and
/// `out[2]` counts the values compared, so the caller sets `out` to `[0, u32::MAX, 0]`. Any
/// grid with `hi - lo` plus its thread count below `2^32`; `lo <= hi`.
pub fn scale_check_kernel_spec() -> KernelSpec {
    KernelSpec::new(&SCALE_CHECK)
}
