//! Every registered kernel compiles with NVRTC for sm_90a and sm_100a (no GPU needed; skipped
//! with a printed reason when NVRTC is not loadable, unless TK_REQUIRE_NVRTC=1).
#![cfg(feature = "cuda")]

#[test]
fn registered_kernels_compile() {
    if let Err(e) = tk_core::kernel::nvrtc_version() {
        assert!(
            std::env::var("TK_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "NVRTC required: {e}"
        );
        eprintln!("SKIPPED registered_kernels_compile: {e}");
        return;
    }
    for spec in tk_moe::registered_kernels() {
        for arch in ["sm_90a", "sm_100a"] {
            if let Err(e) = tk_core::kernel::compile(&spec, arch) {
                panic!(
                    "{} ({}) on {arch}: {e}",
                    spec.source().entry,
                    spec.describe()
                );
            }
        }
    }
}
