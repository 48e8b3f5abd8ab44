//! The CPU conversions of `tk_core::convert` against CUDA's own intrinsics on the GPU, bit for
//! bit, over ~1M fp32 bit patterns spread over all 2^32 plus every tie and boundary case of
//! the narrow formats; and `DeviceTensor::truncate` on device memory. Skips (printing why)
//! without a GPU; fails with `TK_REQUIRE_GPU=1`.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use tk_core::convert::{
    bf16_from_f32, e2m1_from_f32, e2m1_to_f32, e4m3_from_f32, e4m3_to_f32, e5m2_from_f32,
    e5m2_to_f32, e5m6_from_f32, e5m6_to_f32, f16_from_f32,
};
use tk_core::error::DriverContext;
use tk_core::testing::{convert_check_kernel_spec, gpu_or_skip, poison};
use tk_core::{DeviceTensor, Element, HostTensor};

/// fp32 patterns: a stride over all 2^32, and the neighbourhood of every value and midpoint of
/// the e4m3, e5m2, e2m1 and E5M6 grids (ties included), both signs.
fn inputs() -> Vec<u32> {
    let mut v: Vec<u32> = (0..(1u64 << 32)).step_by(4093).map(|b| b as u32).collect();
    let mut grid: Vec<f32> = Vec::new();
    grid.extend((0..=255u8).map(e4m3_to_f32));
    grid.extend((0..=255u8).map(e5m2_to_f32));
    grid.extend((0..16u8).map(e2m1_to_f32));
    grid.extend((0..4096u16).map(e5m6_to_f32));
    grid.retain(|g| g.is_finite());
    grid.sort_by(f32::total_cmp);
    let mids: Vec<f32> = grid.windows(2).map(|w| (w[0] + w[1]) * 0.5).collect();
    for g in grid.iter().chain(&mids) {
        for d in -3i64..=3 {
            let b = (g.abs().to_bits() as i64 + d).clamp(0, u32::MAX as i64) as u32;
            v.push(b);
            v.push(b | 0x8000_0000);
        }
    }
    v.extend([
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0xffc0_0000,
        0x7fff_ffff,
        0x4380_0000,
        0x43e8_0000,
        0x4780_0000,
    ]);
    v
}

fn first_mismatch<T: PartialEq + std::fmt::Debug>(
    what: &str,
    inputs: &[u32],
    got: &[T],
    want: impl Fn(u32) -> Option<T>,
) -> usize {
    let mut bad = 0;
    for (i, (&b, g)) in inputs.iter().zip(got).enumerate() {
        if let Some(w) = want(b) {
            if *g != w {
                if bad < 5 {
                    eprintln!(
                        "{what}: input {b:#010x} ({}) GPU {g:?} CPU {w:?} (index {i})",
                        f32::from_bits(b)
                    );
                }
                bad += 1;
            }
        }
    }
    bad
}

fn out<T: Element>(dev: &tk_core::Device, n: usize) -> DeviceTensor<T> {
    let mut t = dev.alloc::<T>(&[n]).unwrap();
    poison(&mut t).unwrap();
    t
}

#[test]
fn gpu_conversions_match_cpu_bit_for_bit() {
    let Some(dev) = gpu_or_skip("gpu_conversions_match_cpu_bit_for_bit") else {
        return;
    };
    let input = inputs();
    let n = input.len();
    let x = dev
        .upload(
            &HostTensor::<i32>::from_vec(input.iter().map(|&b| b as i32).collect(), &[n]).unwrap(),
        )
        .unwrap();
    let (mut e4m3, mut e5m2, mut e2m1) =
        (out::<u8>(&dev, n), out::<u8>(&dev, n), out::<u8>(&dev, n));
    let (mut bf16, mut f16, mut e5m6) = (
        out::<half::f16>(&dev, n),
        out::<half::f16>(&dev, n),
        out::<half::f16>(&dev, n),
    );
    let f = dev.function(&convert_check_kernel_spec()).unwrap();
    let addrs = [
        x.view().address(),
        e4m3.view_mut().address(),
        e5m2.view_mut().address(),
        e2m1.view_mut().address(),
    ];
    let addrs16 = [
        bf16.view_mut().address(),
        f16.view_mut().address(),
        e5m6.view_mut().address(),
    ];
    let n32 = n as u32;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(&addrs[0])
        .arg(&n32)
        .arg(&addrs[1])
        .arg(&addrs[2])
        .arg(&addrs[3])
        .arg(&addrs16[0])
        .arg(&addrs16[1])
        .arg(&addrs16[2]);
    let cfg = LaunchConfig {
        grid_dim: (1024, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: every buffer holds n elements of the kernel's type and outlives the launch.
    unsafe { l.launch(cfg) }
        .map(|_| ())
        .ctx("launching tk_convert_check")
        .unwrap();
    let bits16 = |t: &DeviceTensor<half::f16>| {
        t.to_host()
            .unwrap()
            .as_slice()
            .iter()
            .map(|h| h.to_bits())
            .collect::<Vec<u16>>()
    };
    let mut bad = 0;
    bad += first_mismatch("e4m3", &input, e4m3.to_host().unwrap().as_slice(), |b| {
        Some(e4m3_from_f32(f32::from_bits(b)))
    });
    bad += first_mismatch("e5m2", &input, e5m2.to_host().unwrap().as_slice(), |b| {
        Some(e5m2_from_f32(f32::from_bits(b)))
    });
    bad += first_mismatch("e2m1", &input, e2m1.to_host().unwrap().as_slice(), |b| {
        Some(e2m1_from_f32(f32::from_bits(b)))
    });
    // bf16/f16 NaN payloads differ by design (documented in tk_core::convert): compare non-NaN.
    let not_nan = |b: u32| !f32::from_bits(b).is_nan();
    bad += first_mismatch("bf16", &input, &bits16(&bf16), |b| {
        not_nan(b).then(|| bf16_from_f32(f32::from_bits(b)).to_bits())
    });
    bad += first_mismatch("f16", &input, &bits16(&f16), |b| {
        not_nan(b).then(|| f16_from_f32(f32::from_bits(b)).to_bits())
    });
    bad += first_mismatch("e5m6", &input, &bits16(&e5m6), |b| {
        Some(e5m6_from_f32(f32::from_bits(b)))
    });
    assert_eq!(
        bad, 0,
        "{bad} conversions differ between the GPU and tk_core::convert"
    );
    println!("GPU conversions of {n} fp32 patterns match tk_core::convert bit for bit");
}

/// `DeviceTensor::truncate` keeps the first rows in place (no copy) and rejects growing.
#[test]
fn gpu_device_tensor_truncate() {
    let Some(dev) = gpu_or_skip("gpu_device_tensor_truncate") else {
        return;
    };
    let data: Vec<i32> = (0..5 * 3).map(|i| i * 7 - 20).collect();
    let mut x = dev
        .upload(&HostTensor::from_vec(data.clone(), &[5, 3]).unwrap())
        .unwrap();
    x.truncate(2).unwrap();
    assert_eq!(x.shape(), &[2, 3]);
    assert_eq!(x.to_host().unwrap().as_slice(), &data[..6]);
    x.truncate(0).unwrap();
    assert_eq!(x.to_host().unwrap().as_slice(), &[] as &[i32]);
    match x.truncate(1) {
        Err(tk_core::TkError::Param { arg, .. }) => assert_eq!(arg, "len"),
        other => panic!("expected a Param error naming len, got {other:?}"),
    }
}
