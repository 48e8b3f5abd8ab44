//! Transpose tests: the CPU reference and validation everywhere, the GPU kernels against the
//! CPU reference (bit-exact, poisoned outputs) when a GPU is present.
//!
//! GPU grid (`spec/quant.md` §3.13): `transpose` over M ∈ {4032, 8064} (+0 with TK_FULL_TEST) ×
//! the 7 hidden sizes × {e4m3, bf16}, with x the left half of an (M, 2K) buffer; and
//! `batched_transpose` over the same M × K × B ∈ {8, 32} × {e4m3, bf16, fp32}. Plus off-grid
//! shapes: odd sizes, single rows/columns, padded row and batch strides, unaligned offsets,
//! sizes that exceed one grid's worth of blocks. Inputs are random bit patterns (every pattern
//! is a valid input to a bit copy, NaNs included), fresh per case.

use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};
use tk_core::testing::{
    assert_bits_eq, case_seed, generate_hidden_sizes, generate_num_tokens, gpu_or_skip,
    par_random_bits, poison,
};
use tk_core::{Device, DeviceView, Element, HostTensor, HostView, TkError};
use tk_transpose::{
    batched_transpose, batched_transpose_into, batched_transpose_into_tiled, reference, transpose,
    transpose_into, transpose_into_tiled, Tiling,
};

/// Runs `transpose`/`batched_transpose` (per the view's rank) on the device copy of `view` and
/// compares with the CPU reference bit for bit. `buf` is the backing host tensor of `view`.
fn check_on_gpu<T: Element>(dev: &Device, case: &str, buf: &HostTensor<T>, view: &HostView<'_, T>) {
    let rank = view.layout().rank();
    let expected = if rank == 2 {
        reference::transpose(view)
    } else {
        reference::batched_transpose(view)
    }
    .unwrap();
    let dbuf = dev.upload(buf).unwrap();
    let dview: DeviceView<'_, T> = dbuf.view().with_layout(view.layout().clone()).unwrap();
    let mut out = dev.alloc::<T>(expected.shape()).unwrap();
    poison(&mut out).unwrap();
    if rank == 2 {
        transpose_into(&dview, &mut out.view_mut()).unwrap();
    } else {
        batched_transpose_into(&dview, &mut out.view_mut()).unwrap();
    }
    let got = out.to_host().unwrap();
    assert_eq!(got.shape(), expected.shape(), "{case}: shape");
    assert_bits_eq(case, got.as_slice(), expected.as_slice());
    // The allocating form gives the same bits (checked where it costs little: it shares the
    // launch path, and the largest cases dominate the device time of the suite).
    if expected.as_slice().len() > 1 << 24 {
        return;
    }
    let alloc = if rank == 2 {
        transpose(&dview)
    } else {
        batched_transpose(&dview)
    }
    .unwrap();
    assert_bits_eq(
        &format!("{case} (allocating)"),
        alloc.to_host().unwrap().as_slice(),
        expected.as_slice(),
    );
}

fn spec_grid_transpose<T: Element>(dev: &Device, dtype: &str) {
    let mut n = 0;
    for m in generate_num_tokens(64, false) {
        for k in generate_hidden_sizes(64) {
            let case = format!("transpose M={m} K={k} {dtype} (row stride 2K)");
            let buf = par_random_bits::<T>(&[m, 2 * k], case_seed(&case));
            let view = buf.view().narrow(1, 0, k).unwrap();
            check_on_gpu(dev, &case, &buf, &view);
            n += 1;
        }
    }
    println!("transpose {dtype}: {n} spec-grid cases bit-exact");
}

fn spec_grid_batched<T: Element>(dev: &Device, dtype: &str) {
    let mut n = 0;
    for m in generate_num_tokens(64, false) {
        for k in generate_hidden_sizes(64) {
            for b in [8, 32] {
                let case = format!("batched_transpose B={b} M={m} K={k} {dtype}");
                let buf = par_random_bits::<T>(&[b, m, k], case_seed(&case));
                check_on_gpu(dev, &case, &buf, &buf.view());
                n += 1;
            }
        }
    }
    println!("batched_transpose {dtype}: {n} spec-grid cases bit-exact");
}

#[test]
fn gpu_transpose_spec_grid() {
    let Some(dev) = gpu_or_skip("gpu_transpose_spec_grid") else {
        return;
    };
    spec_grid_transpose::<F8E4M3>(&dev, "e4m3");
    spec_grid_transpose::<bf16>(&dev, "bf16");
}

#[test]
fn gpu_batched_transpose_spec_grid_e4m3() {
    let Some(dev) = gpu_or_skip("gpu_batched_transpose_spec_grid_e4m3") else {
        return;
    };
    spec_grid_batched::<F8E4M3>(&dev, "e4m3");
}

#[test]
fn gpu_batched_transpose_spec_grid_bf16() {
    let Some(dev) = gpu_or_skip("gpu_batched_transpose_spec_grid_bf16") else {
        return;
    };
    spec_grid_batched::<bf16>(&dev, "bf16");
}

#[test]
fn gpu_batched_transpose_spec_grid_fp32() {
    let Some(dev) = gpu_or_skip("gpu_batched_transpose_spec_grid_fp32") else {
        return;
    };
    spec_grid_batched::<f32>(&dev, "fp32");
}

/// Off-grid 2-D shapes `(X, Y)` and the columns of a wider buffer they are cut from:
/// `(X, Y, buffer columns, first column)`.
const OFF_GRID_2D: &[(usize, usize, usize, usize)] = &[
    (1, 1, 1, 0),
    (1, 7, 7, 0),
    (7, 1, 1, 0),
    (3, 5, 5, 0),
    (65, 33, 33, 0),
    (17, 130, 131, 1),  // unaligned start and odd row stride: generic path
    (64, 48, 48, 0),    // multiple of 16 bytes only for some dtypes
    (128, 256, 256, 0), // register path for every dtype
    (128, 256, 272, 16),
    (96, 80, 97, 0),
    (1, 100_003, 100_003, 0),
    (100_003, 1, 1, 0),
    (0, 5, 5, 0),
    (5, 0, 3, 0),
    (2_200_000, 4, 4, 0), // more row chunks than one grid dimension holds (grid loops)
    (2_200_000, 3, 3, 0),
];

fn off_grid_2d<T: Element>(dev: &Device, dtype: &str) {
    for &(x, y, cols, start) in OFF_GRID_2D {
        let case = format!("transpose off-grid X={x} Y={y} cols={cols} start={start} {dtype}");
        let buf = par_random_bits::<T>(&[x, cols], case_seed(&case));
        let view = buf.view().narrow(1, start, y).unwrap();
        check_on_gpu(dev, &case, &buf, &view);
    }
}

/// Off-grid batched shapes `(B, X, Y, rows per batch in the buffer)`: extra rows give a batch
/// stride larger than X · row stride.
const OFF_GRID_3D: &[(usize, usize, usize, usize)] = &[
    (3, 5, 7, 5),
    (2, 64, 64, 67),
    (4, 32, 48, 32),
    (70_000, 2, 16, 2),    // more batches than one grid dimension holds
    (70_000, 16, 16, 16),  // the same on the staged-tile path
    (1, 1024, 2048, 1024), // staged path, 64-byte tiles for fp32, 32-byte for e4m3 and bf16
    (1, 1, 1, 1),
    (0, 4, 4, 4),
    (5, 128, 64, 130),
];

fn off_grid_3d<T: Element>(dev: &Device, dtype: &str) {
    for &(b, x, y, rows) in OFF_GRID_3D {
        let case =
            format!("batched_transpose off-grid B={b} X={x} Y={y} rows/batch={rows} {dtype}");
        let buf = par_random_bits::<T>(&[b, rows, y], case_seed(&case));
        let view = buf.view().narrow(1, 0, x).unwrap();
        check_on_gpu(dev, &case, &buf, &view);
    }
}

#[test]
fn gpu_transpose_off_grid() {
    let Some(dev) = gpu_or_skip("gpu_transpose_off_grid") else {
        return;
    };
    off_grid_2d::<F8E4M3>(&dev, "e4m3");
    off_grid_2d::<F8E5M2>(&dev, "e5m2");
    off_grid_2d::<bf16>(&dev, "bf16");
    off_grid_2d::<f16>(&dev, "fp16");
    off_grid_2d::<f32>(&dev, "fp32");
    off_grid_2d::<i32>(&dev, "i32");
    off_grid_2d::<u8>(&dev, "u8");
    off_grid_3d::<F8E4M3>(&dev, "e4m3");
    off_grid_3d::<bf16>(&dev, "bf16");
    off_grid_3d::<f32>(&dev, "fp32");
}

/// More tiles along y than one grid dimension holds (staged-tile path: 128 columns a tile, so
/// more than 65535 · 128 columns); e4m3 only, as the grid loop does not depend on the dtype.
#[test]
fn gpu_transpose_grid_y_loop() {
    let Some(dev) = gpu_or_skip("gpu_transpose_grid_y_loop") else {
        return;
    };
    let (x, y) = (16, 65_538 * 128 + 16);
    let case = format!("transpose X={x} Y={y} e4m3 (grid y loops)");
    let buf = par_random_bits::<F8E4M3>(&[x, y], case_seed(&case));
    check_on_gpu(&dev, &case, &buf, &buf.view());
}

/// Every tiling of the staged-tile kernel (the explicit-tiling ops the bench uses to compare
/// them) on a spec shape with partial tiles along both axes, 2-D with row stride 2K and batched
/// with padded rows; bit-exact against the CPU reference.
fn every_tiling<T: Element>(dev: &Device, dtype: &str) {
    let e = std::mem::size_of::<T>();
    let (m, k) = (4032, 576);
    let case = format!("tiled transpose M={m} K={k} {dtype}");
    let buf = par_random_bits::<T>(&[m, 2 * k], case_seed(&case));
    let view = buf.view().narrow(1, 0, k).unwrap();
    let expected = reference::transpose(&view).unwrap();
    let dbuf = dev.upload(&buf).unwrap();
    let x = dbuf.view().narrow(1, 0, k).unwrap();
    let (b, rows) = (3, 136);
    let bcase = format!("tiled batched_transpose B={b} X=128 Y=384 rows/batch={rows} {dtype}");
    let bbuf = par_random_bits::<T>(&[b, rows, 384], case_seed(&bcase));
    let bview = bbuf.view().narrow(1, 0, 128).unwrap();
    let bexpected = reference::batched_transpose(&bview).unwrap();
    let dbbuf = dev.upload(&bbuf).unwrap();
    let bx = dbbuf.view().narrow(1, 0, 128).unwrap();
    for t in Tiling::supported(e) {
        let mut out = dev.alloc::<T>(expected.shape()).unwrap();
        poison(&mut out).unwrap();
        transpose_into_tiled(&x, &mut out.view_mut(), t).unwrap();
        let got = out.to_host().unwrap();
        assert_bits_eq(
            &format!("{case} {t:?}"),
            got.as_slice(),
            expected.as_slice(),
        );
        let mut bout = dev.alloc::<T>(bexpected.shape()).unwrap();
        poison(&mut bout).unwrap();
        batched_transpose_into_tiled(&bx, &mut bout.view_mut(), t).unwrap();
        let got = bout.to_host().unwrap();
        assert_bits_eq(
            &format!("{bcase} {t:?}"),
            got.as_slice(),
            bexpected.as_slice(),
        );
    }
    println!(
        "{dtype}: {} tilings bit-exact",
        Tiling::supported(e).count()
    );
}

#[test]
fn gpu_transpose_every_tiling() {
    let Some(dev) = gpu_or_skip("gpu_transpose_every_tiling") else {
        return;
    };
    every_tiling::<F8E4M3>(&dev, "e4m3");
    every_tiling::<bf16>(&dev, "bf16");
    every_tiling::<f32>(&dev, "fp32");
    // An unsupported tiling, and an input the staged kernel cannot take, are typed errors.
    let x = dev.upload(&par_random_bits::<bf16>(&[64, 64], 4)).unwrap();
    let mut out = dev.alloc::<bf16>(&[64, 64]).unwrap();
    let odd = Tiling { rows: 5, bands: 3 };
    assert!(matches!(
        transpose_into_tiled(&x.view(), &mut out.view_mut(), odd),
        Err(TkError::Param { arg: "tiling", .. })
    ));
    let wide = dev.upload(&par_random_bits::<bf16>(&[64, 65], 5)).unwrap();
    let unaligned = wide.view().narrow(1, 1, 64).unwrap(); // row stride 65: not 16-byte rows
    assert!(matches!(
        transpose_into_tiled(&unaligned, &mut out.view_mut(), Tiling::new(2, 128)),
        Err(TkError::Param { arg: "tiling", .. })
    ));
}

/// Off-grid shapes of the staged kernel: more tiles than an H200 or B200 holds at once, a
/// partial last tile along x (X = 8016: 80 rows of 128; X = 7952: 16 rows) and a partial last
/// band; with the 128- and 32-byte tilings and the picked one; bit-exact against the CPU
/// reference.
fn partial_tiles<T: Element>(dev: &Device, dtype: &str) {
    let e = std::mem::size_of::<T>();
    for x in [7952, 8016] {
        let y = 2064;
        let case = format!("partial-tile transpose X={x} Y={y} {dtype}");
        let buf = par_random_bits::<T>(&[x, y], case_seed(&case));
        let expected = reference::transpose(&buf.view()).unwrap();
        let dbuf = dev.upload(&buf).unwrap();
        for t in [Some(Tiling::new(e, 128)), Some(Tiling::new(e, 32)), None] {
            let mut out = dev.alloc::<T>(expected.shape()).unwrap();
            poison(&mut out).unwrap();
            match t {
                Some(t) => transpose_into_tiled(&dbuf.view(), &mut out.view_mut(), t).unwrap(),
                None => transpose_into(&dbuf.view(), &mut out.view_mut()).unwrap(),
            }
            let got = out.to_host().unwrap();
            assert_bits_eq(
                &format!("{case} {t:?}"),
                got.as_slice(),
                expected.as_slice(),
            );
        }
    }
}

#[test]
fn gpu_transpose_partial_tiles() {
    let Some(dev) = gpu_or_skip("gpu_transpose_partial_tiles") else {
        return;
    };
    partial_tiles::<F8E4M3>(&dev, "e4m3");
    partial_tiles::<bf16>(&dev, "bf16");
    partial_tiles::<f32>(&dev, "fp32");
}

#[test]
fn gpu_transpose_rejects_bad_input() {
    let Some(dev) = gpu_or_skip("gpu_transpose_rejects_bad_input") else {
        return;
    };
    let x = dev.upload(&par_random_bits::<bf16>(&[4, 6], 1)).unwrap();
    // rank
    assert!(matches!(
        batched_transpose(&x.view()),
        Err(TkError::Shape { arg: "x", .. })
    ));
    // output shape and layout
    let mut wrong = dev.alloc::<bf16>(&[4, 6]).unwrap();
    assert!(matches!(
        transpose_into(&x.view(), &mut wrong.view_mut()),
        Err(TkError::Shape { arg: "out", .. })
    ));
    let mut wide = dev.alloc::<bf16>(&[6, 8]).unwrap();
    let strided = wide.view_mut().narrow(1, 0, 4).unwrap();
    let mut strided = strided;
    assert!(matches!(
        transpose_into(&x.view(), &mut strided),
        Err(TkError::Stride { arg: "out", .. })
    ));
    // dtype
    let i64s = dev.upload(&par_random_bits::<i64>(&[4, 4], 2)).unwrap();
    assert!(matches!(
        transpose(&i64s.view()),
        Err(TkError::Dtype { arg: "x", .. })
    ));
    let fp4 = dev
        .upload(&par_random_bits::<tk_core::dtype::E2M1x2>(&[4, 4], 3))
        .unwrap();
    assert!(matches!(
        transpose(&fp4.view()),
        Err(TkError::Dtype { arg: "x", .. })
    ));
    // strides: last dimension not contiguous
    let col = x
        .view()
        .with_layout(tk_core::Layout::new(vec![3, 3], vec![1, 2], 0).unwrap())
        .unwrap();
    assert!(matches!(
        transpose(&col),
        Err(TkError::Stride { arg: "x", .. })
    ));
    // sizes beyond the kernel's 32-bit index range (a stride-0 view of one row)
    let huge = x
        .view()
        .with_layout(tk_core::Layout::new(vec![1usize << 33, 6], vec![0, 1], 0).unwrap())
        .unwrap();
    assert!(matches!(transpose(&huge), Err(TkError::Param { .. })));
    // a view reaching outside its buffer can't even be made
    assert!(x
        .view()
        .with_layout(tk_core::Layout::new(vec![5, 6], vec![6, 1], 0).unwrap())
        .is_err());
    // empty input is allowed and gives an empty output
    let empty = dev.alloc::<bf16>(&[0, 6]).unwrap();
    assert_eq!(transpose(&empty.view()).unwrap().shape(), &[6, 0]);
}

// ----- CPU (run everywhere) ------------------------------------------------------------------------

#[test]
fn reference_matches_definition() {
    let buf = HostTensor::<i32>::from_fn(&[2, 3, 5], |i| i as i32);
    let view = buf.view().narrow(2, 1, 3).unwrap(); // (2, 3, 3), row stride 5
    let t = reference::batched_transpose(&view).unwrap();
    assert_eq!(t.shape(), &[2, 3, 3]);
    for b in 0..2 {
        for j in 0..3 {
            for i in 0..3 {
                assert_eq!(
                    t.as_slice()[(b * 3 + j) * 3 + i],
                    (b * 15 + i * 5 + j + 1) as i32
                );
            }
        }
    }
    let m = HostTensor::<u8>::from_fn(&[2, 3], |i| i as u8);
    assert_eq!(
        reference::transpose(&m.view()).unwrap().as_slice(),
        &[0, 3, 1, 4, 2, 5]
    );
}

#[test]
fn reference_transpose_twice_is_identity_on_large_random_input() {
    let x = par_random_bits::<bf16>(&[300, 257], 7);
    let t = reference::transpose(&x.view()).unwrap();
    let back = reference::transpose(&t.view()).unwrap();
    assert_bits_eq("transpose twice", back.as_slice(), x.as_slice());
}

#[test]
fn reference_rejects_bad_input() {
    let x = HostTensor::<f32>::from_fn(&[2, 3], |i| i as f32);
    assert!(matches!(
        reference::batched_transpose(&x.view()),
        Err(TkError::Shape { arg: "x", .. })
    ));
    let c = x
        .view()
        .with_layout(tk_core::Layout::new(vec![3, 2], vec![1, 3], 0).unwrap())
        .unwrap();
    assert!(matches!(
        reference::transpose(&c),
        Err(TkError::Stride { arg: "x", .. })
    ));
    let l = HostTensor::<i64>::from_fn(&[2, 2], |i| i as i64);
    assert!(matches!(
        reference::transpose(&l.view()),
        Err(TkError::Dtype { .. })
    ));
    let e = HostTensor::<f32>::from_vec(vec![], &[0, 4]).unwrap();
    assert_eq!(reference::transpose(&e.view()).unwrap().shape(), &[4, 0]);
}
