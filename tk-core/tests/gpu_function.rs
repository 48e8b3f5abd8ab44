//! `Device::function` on the GPU: a spec's function attributes are set when its function is
//! loaded, belong to that spec's function only, and bad values are typed errors. Skips
//! (printing why) without a GPU; fails with `TK_REQUIRE_GPU=1`.

use cudarc::driver::sys::CUfunction_attribute as A;
use tk_core::testing::{convert_check_kernel_spec, gpu_or_skip};
use tk_core::{FuncAttr, TkError};

#[test]
fn gpu_function_attributes_set_on_load() {
    let Some(dev) = gpu_or_skip("gpu_function_attributes_set_on_load") else {
        return;
    };
    let get = |f: &cudarc::driver::CudaFunction, a: A| f.get_attribute(a).unwrap();
    // 64 KB: above the 48 KB a function may use without opting in.
    let dynamic = 64u32 << 10;
    let spec = convert_check_kernel_spec()
        .attribute(FuncAttr::SharedCarveout(100))
        .attribute(FuncAttr::MaxDynamicShared(dynamic));
    let f = dev.function(&spec).unwrap();
    assert_eq!(
        get(&f, A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES),
        dynamic as i32
    );
    assert_eq!(
        get(&f, A::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT),
        100
    );
    // The cached function is the one loaded with the attributes.
    let again = dev.function(&spec).unwrap();
    assert_eq!(
        get(&again, A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES),
        dynamic as i32
    );
    // The same code without attributes is another function, with the driver's defaults.
    let plain = dev.function(&convert_check_kernel_spec()).unwrap();
    let plain_max = get(&plain, A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
    assert!(plain_max < dynamic as i32, "{plain_max}");
    // Values the driver or the attribute's type cannot take: typed errors, nothing cached.
    let too_big = convert_check_kernel_spec().attribute(FuncAttr::MaxDynamicShared(u32::MAX));
    match dev.function(&too_big) {
        Err(TkError::Param { arg, .. }) => assert_eq!(arg, "attribute"),
        other => panic!("expected a Param error naming attribute, got {other:?}"),
    }
    let beyond_device = dev.props().max_smem_per_block_optin as u32 + (64 << 10);
    let refused = convert_check_kernel_spec().attribute(FuncAttr::MaxDynamicShared(beyond_device));
    assert!(dev.function(&refused).is_err());
    assert!(dev.function(&refused).is_err(), "a refused spec was cached");
}
