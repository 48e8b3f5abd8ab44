//! Every registered kernel, and off-grid specialisations (top-k 1, 7 and 40 — more than one
//! warp of slots —, narrow accesses, one expert, the largest E, f16, windowed histograms for
//! E > 8192), compile with NVRTC for sm_90a and sm_100a (no GPU needed; skipped with a printed
//! reason when NVRTC is not loadable, unless TK_REQUIRE_NVRTC=1).
#![cfg(feature = "cuda")]

use tk_core::{DType, KernelSpec};
use tk_moe::reduce_fused::ReduceOptions;
use tk_moe::ReduceOut;

fn off_grid_specs() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for k in [1, 7, 40] {
        for access in [1, 2, 4, 8, 16] {
            v.push(tk_moe::expand_to_fused::kernel_spec(access, k));
        }
        v.push(tk_moe::expand_to_fused::mark_kernel_spec(k));
        v.push(tk_moe::expand_to_fused_with_sf::kernel_spec(1, k, true));
        for (dt, cols) in [(DType::F32, 1), (DType::BF16, 8), (DType::F16, 8)] {
            for out in [ReduceOut::Input, ReduceOut::E4m3] {
                let o = ReduceOptions {
                    weights: k != 7,
                    x_sf: k == 40,
                    sf: out == ReduceOut::E4m3,
                };
                v.push(tk_moe::reduce_fused::kernel_spec(dt, out, cols, k, o));
            }
        }
        for e in [1, 160, 1024] {
            v.extend(tk_moe::get_fused_mapping::kernel_specs(k, e));
            v.extend(tk_moe::get_fused_mapping::one_launch_spec(k, e));
        }
        v.push(tk_moe::normalize_weight::kernel_spec(k));
        v.push(tk_moe::inplace_unique_group_indices::kernel_spec(k, 1));
        v.push(tk_moe::mask_indices_by_tp::kernel_spec(DType::I32, k));
    }
    v.push(tk_moe::normalize_weight::kernel_spec(0));
    v.push(tk_moe::normalize_weight::kernel_spec(16));
    v.push(tk_moe::group_count::kernel_spec(1));
    v.push(tk_moe::aux_fi::kernel_spec(8193));
    v
}

#[test]
fn registered_and_off_grid_kernels_compile() {
    if let Err(e) = tk_core::kernel::nvrtc_version() {
        assert!(
            std::env::var("TK_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "NVRTC required: {e}"
        );
        tk_core::testing::report_skip(
            "registered_and_off_grid_kernels_compile",
            format_args!("{e}"),
        );
        return;
    }
    let specs: Vec<KernelSpec> = tk_moe::registered_kernels()
        .into_iter()
        .chain(off_grid_specs())
        .collect();
    // Two threads: the machine's cores (NVRTC compiles are independent).
    std::thread::scope(|s| {
        for half in specs.chunks(specs.len().div_ceil(2)) {
            s.spawn(move || {
                for spec in half {
                    for arch in ["sm_90a", "sm_100a"] {
                        if let Err(e) = tk_core::kernel::compile(spec, arch) {
                            panic!(
                                "{} ({}) on {arch}: {e}",
                                spec.source().entry,
                                spec.describe()
                            );
                        }
                    }
                }
            });
        }
    });
}
