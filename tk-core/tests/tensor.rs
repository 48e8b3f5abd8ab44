//! CPU-only tests of `tk_core::tensor` (layouts, host tensors and views) and of the seeded
//! generators and comparison helpers in `tk_core::testing`. Nothing here needs a GPU or NVRTC.

use std::panic::catch_unwind;

use tk_core::testing::{
    align, assert_bits_eq, calc_diff, case_seed, full_test, generate_hidden_sizes,
    generate_num_tokens, par_random_bits, Rng,
};
use tk_core::{HostTensor, HostView, Layout, TkError};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A layout that must be valid (shape and strides of equal rank).
fn layout(shape: &[usize], strides: &[usize], offset: usize) -> Layout {
    Layout::new(shape.to_vec(), strides.to_vec(), offset).expect("ranks match")
}

/// The argument name of a `TkError::Param`, panicking on any other variant.
fn param_arg(e: TkError) -> &'static str {
    match e {
        TkError::Param { arg, .. } => arg,
        other => panic!("expected TkError::Param, got {other:?}"),
    }
}

/// Naive model of a layout's buffer indices in row-major order of the logical index (rank 3).
fn naive_indices_3d(l: &Layout) -> Vec<usize> {
    let (sh, st) = (l.shape(), l.strides());
    let mut out = Vec::new();
    for i in 0..sh[0] {
        for j in 0..sh[1] {
            for k in 0..sh[2] {
                out.push(l.offset() + i * st[0] + j * st[1] + k * st[2]);
            }
        }
    }
    out
}

fn f32_data(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

// ---------------------------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------------------------

#[test]
fn layout_contiguous_strides() {
    let l = Layout::contiguous(&[2, 3, 4]);
    assert_eq!(l.shape(), &[2, 3, 4]);
    assert_eq!(l.strides(), &[12, 4, 1]);
    assert_eq!(l.offset(), 0);
    assert_eq!(l.rank(), 3);
    assert_eq!(l.numel(), 24);

    let l = Layout::contiguous(&[7]);
    assert_eq!(l.strides(), &[1]);
    assert_eq!(l.numel(), 7);

    // Rank 0: one element, no strides.
    let l = Layout::contiguous(&[]);
    assert_eq!(l.strides(), &[] as &[usize]);
    assert_eq!(l.rank(), 0);
    assert_eq!(l.numel(), 1);
}

#[test]
fn layout_contiguous_strides_with_zero_size_dims() {
    // A zero-size dimension counts as 1 for the strides of the dimensions before it (as in
    // PyTorch), so strides never collapse to 0.
    let l = Layout::contiguous(&[2, 0, 3]);
    assert_eq!(l.strides(), &[3, 3, 1]);
    assert_eq!(l.numel(), 0);

    let l = Layout::contiguous(&[0, 5]);
    assert_eq!(l.strides(), &[5, 1]);
    assert_eq!(l.numel(), 0);

    let l = Layout::contiguous(&[4, 5, 0]);
    assert_eq!(l.strides(), &[5, 1, 1]);
    assert_eq!(l.numel(), 0);
}

#[test]
fn layout_new_rank_mismatch_is_a_stride_error() {
    let e = Layout::new(vec![2, 3], vec![3], 0).unwrap_err();
    match e {
        TkError::Stride { arg, got, .. } => {
            assert_eq!(arg, "strides");
            assert_eq!(got, vec![3]);
        }
        other => panic!("expected TkError::Stride, got {other:?}"),
    }
    assert!(matches!(
        Layout::new(vec![], vec![1], 0),
        Err(TkError::Stride { .. })
    ));
    let l = Layout::new(vec![2, 3], vec![1, 2], 5).unwrap();
    assert_eq!(
        (l.shape(), l.strides(), l.offset()),
        (&[2, 3][..], &[1, 2][..], 5)
    );
}

#[test]
fn layout_is_contiguous() {
    assert!(Layout::contiguous(&[2, 3, 4]).is_contiguous());
    assert!(Layout::contiguous(&[]).is_contiguous());
    // Offset doesn't matter.
    assert!(layout(&[2, 3], &[3, 1], 17).is_contiguous());
    // Size-1 dimensions may have any stride.
    assert!(layout(&[2, 1, 3], &[3, 999, 1], 0).is_contiguous());
    assert!(layout(&[1, 4], &[7, 1], 0).is_contiguous());
    assert!(layout(&[4, 1], &[1, 0], 0).is_contiguous());
    assert!(layout(&[1, 1, 1], &[5, 6, 7], 3).is_contiguous());
    // Empty layouts are contiguous whatever their strides.
    assert!(layout(&[0, 3], &[100, 7], 0).is_contiguous());
    assert!(layout(&[3, 0], &[0, 0], 9).is_contiguous());

    // Not contiguous: padded rows, transposed, broadcast, strided inner dimension.
    assert!(!layout(&[2, 3], &[4, 1], 0).is_contiguous());
    assert!(!layout(&[3, 2], &[1, 3], 0).is_contiguous());
    assert!(!layout(&[2, 3], &[0, 1], 0).is_contiguous());
    assert!(!layout(&[2, 3], &[6, 2], 0).is_contiguous());
    assert!(!layout(&[2, 3], &[3, 0], 0).is_contiguous());
}

#[test]
fn layout_narrowed_views_contiguity() {
    let l = Layout::contiguous(&[4, 6]);
    // Narrowing an inner dimension leaves gaps between rows.
    assert!(!l.narrow(1, 1, 3).unwrap().is_contiguous());
    assert!(!l.narrow(1, 0, 5).unwrap().is_contiguous());
    // A block of whole rows is still dense (at an offset).
    let rows = l.narrow(0, 1, 2).unwrap();
    assert!(rows.is_contiguous());
    assert_eq!(rows.offset(), 6);
    // Narrowing the inner dimension to a single row makes it contiguous again.
    assert!(l
        .narrow(0, 2, 1)
        .unwrap()
        .narrow(1, 1, 3)
        .unwrap()
        .is_contiguous());
}

#[test]
fn layout_span() {
    assert_eq!(Layout::contiguous(&[2, 3, 4]).span(), (0, 24));
    assert_eq!(layout(&[2, 3, 4], &[12, 4, 1], 5).span(), (5, 29));
    // Strided: last element at 1 + 1*10 + 2*2 = 15.
    assert_eq!(layout(&[2, 3], &[10, 2], 1).span(), (1, 16));
    // Transposed.
    assert_eq!(layout(&[3, 2], &[1, 3], 0).span(), (0, 6));
    // Broadcast dimension.
    assert_eq!(layout(&[5, 2], &[0, 1], 4).span(), (4, 6));
    // Rank 0: one element at the offset.
    assert_eq!(layout(&[], &[], 7).span(), (7, 8));
    // Empty: nothing is touched.
    assert_eq!(layout(&[0, 3], &[3, 1], 7).span(), (7, 7));
    assert_eq!(layout(&[4, 0], &[100, 1], 2).span(), (2, 2));
}

#[test]
fn layout_index() {
    let l = Layout::contiguous(&[2, 3, 4]);
    assert_eq!(l.index(&[0, 0, 0]), 0);
    assert_eq!(l.index(&[1, 2, 3]), 23);
    assert_eq!(l.index(&[0, 1, 0]), 4);
    let l = layout(&[2, 3, 4], &[1, 40, 5], 3);
    assert_eq!(l.index(&[0, 0, 0]), 3);
    assert_eq!(l.index(&[1, 2, 3]), 3 + 1 + 80 + 15);
    assert_eq!(layout(&[], &[], 9).index(&[]), 9);
}

#[test]
fn layout_narrow_valid() {
    let l = layout(&[4, 6], &[10, 2], 3);
    let n = l.narrow(1, 2, 3).unwrap();
    assert_eq!(n.shape(), &[4, 3]);
    assert_eq!(n.strides(), &[10, 2]);
    assert_eq!(n.offset(), 3 + 2 * 2);
    // Every element of the narrowed layout is the matching element of the original.
    for i in 0..4 {
        for j in 0..3 {
            assert_eq!(n.index(&[i, j]), l.index(&[i, j + 2]));
        }
    }
    let n = l.narrow(0, 1, 3).unwrap();
    assert_eq!((n.shape(), n.offset()), (&[3, 6][..], 13));
    // The whole dimension, an empty range in the middle and an empty range at the end.
    assert_eq!(l.narrow(0, 0, 4).unwrap(), l);
    assert_eq!(l.narrow(1, 3, 0).unwrap().shape(), &[4, 0]);
    let end = l.narrow(1, 6, 0).unwrap();
    assert_eq!(end.shape(), &[4, 0]);
    assert_eq!(end.numel(), 0);
}

#[test]
fn layout_narrow_errors() {
    let l = Layout::contiguous(&[4, 6]);
    // Bad dimension.
    assert_eq!(param_arg(l.narrow(2, 0, 1).unwrap_err()), "dim");
    assert_eq!(param_arg(l.narrow(usize::MAX, 0, 1).unwrap_err()), "dim");
    assert_eq!(
        param_arg(Layout::contiguous(&[]).narrow(0, 0, 0).unwrap_err()),
        "dim"
    );
    // Out of range start / length.
    assert_eq!(param_arg(l.narrow(1, 7, 0).unwrap_err()), "start/len");
    assert_eq!(param_arg(l.narrow(1, 0, 7).unwrap_err()), "start/len");
    assert_eq!(param_arg(l.narrow(1, 4, 3).unwrap_err()), "start/len");
    assert_eq!(param_arg(l.narrow(0, 4, 1).unwrap_err()), "start/len");
    // start + len overflows usize: an error, not a panic or a wrapped success.
    assert_eq!(
        param_arg(l.narrow(1, usize::MAX, 2).unwrap_err()),
        "start/len"
    );
    assert_eq!(
        param_arg(l.narrow(1, 2, usize::MAX).unwrap_err()),
        "start/len"
    );
    // The message names the offending range and the dimension's size.
    let msg = l.narrow(1, 5, 2).unwrap_err().to_string();
    assert!(msg.contains('5') && msg.contains('6'), "{msg}");
}

#[test]
fn layout_unsqueeze() {
    let l = Layout::contiguous(&[2, 3]);
    let u = l.unsqueeze(0).unwrap();
    assert_eq!((u.shape(), u.strides()), (&[1, 2, 3][..], &[6, 3, 1][..]));
    let u = l.unsqueeze(1).unwrap();
    assert_eq!((u.shape(), u.strides()), (&[2, 1, 3][..], &[3, 3, 1][..]));
    let u = l.unsqueeze(2).unwrap();
    assert_eq!((u.shape(), u.strides()), (&[2, 3, 1][..], &[3, 1, 1][..]));
    for dim in 0..=2 {
        let u = l.unsqueeze(dim).unwrap();
        assert!(u.is_contiguous(), "unsqueeze({dim})");
        assert_eq!(u.numel(), l.numel());
        assert_eq!(u.span(), l.span());
        assert_eq!(u.offset(), l.offset());
    }
    assert_eq!(param_arg(l.unsqueeze(3).unwrap_err()), "dim");

    // A strided layout with an offset visits the same elements after an unsqueeze.
    let s = layout(&[3, 4], &[1, 5], 2);
    let u = s.unsqueeze(1).unwrap();
    assert_eq!(u.shape(), &[3, 1, 4]);
    assert_eq!(u.offset(), 2);
    for i in 0..3 {
        for j in 0..4 {
            assert_eq!(u.index(&[i, 0, j]), s.index(&[i, j]));
        }
    }
    // Rank 0 → rank 1.
    let u = Layout::contiguous(&[]).unsqueeze(0).unwrap();
    assert_eq!((u.shape(), u.strides()), (&[1][..], &[1][..]));
}

#[test]
fn layout_for_each_index_matches_naive_loop() {
    let cases = [
        layout(&[2, 3, 4], &[5, 40, 2], 3), // permuted and padded
        layout(&[3, 2, 5], &[1, 3, 6], 0),  // fully transposed
        layout(&[2, 4, 3], &[0, 3, 1], 1),  // broadcast outer dimension
        layout(&[2, 3, 4], &[12, 4, 1], 0), // contiguous
        layout(&[1, 5, 1], &[9, 2, 7], 4),  // size-1 dimensions
        Layout::contiguous(&[4, 6, 8])
            .narrow(1, 2, 3)
            .unwrap()
            .narrow(2, 1, 5)
            .unwrap(),
    ];
    for l in &cases {
        let mut got = Vec::new();
        l.for_each_index(|i| got.push(i));
        assert_eq!(got, naive_indices_3d(l), "layout {l:?}");
        assert_eq!(got.len(), l.numel());
    }
}

#[test]
fn layout_for_each_index_edge_cases() {
    let mut got = Vec::new();
    layout(&[2, 0, 3], &[3, 3, 1], 0).for_each_index(|i| got.push(i));
    assert!(got.is_empty(), "empty layout visited {got:?}");
    layout(&[], &[], 11).for_each_index(|i| got.push(i));
    assert_eq!(got, vec![11]);
    got.clear();
    layout(&[4], &[3], 2).for_each_index(|i| got.push(i));
    assert_eq!(got, vec![2, 5, 8, 11]);
}

// ---------------------------------------------------------------------------------------------
// HostTensor / HostView
// ---------------------------------------------------------------------------------------------

#[test]
fn host_tensor_from_vec() {
    let t = HostTensor::from_vec(f32_data(6), &[2, 3]).unwrap();
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(t.as_slice(), &f32_data(6)[..]);
    assert_eq!(t.view().layout(), &Layout::contiguous(&[2, 3]));
    let e = HostTensor::<u8>::from_vec(vec![], &[2, 0]).unwrap();
    assert_eq!(e.shape(), &[2, 0]);

    match HostTensor::from_vec(f32_data(5), &[2, 3]).unwrap_err() {
        TkError::Shape { arg, got, expected } => {
            assert_eq!(arg, "data");
            assert_eq!(got, vec![5]);
            assert!(expected.contains('6'), "{expected}");
        }
        other => panic!("expected TkError::Shape, got {other:?}"),
    }
    assert!(matches!(
        HostTensor::from_vec(f32_data(7), &[2, 3]),
        Err(TkError::Shape { arg: "data", .. })
    ));
    assert!(matches!(
        HostTensor::from_vec(f32_data(1), &[0]),
        Err(TkError::Shape { arg: "data", .. })
    ));
}

#[test]
fn host_tensor_from_fn() {
    let t = HostTensor::<i32>::from_fn(&[2, 3], |i| 10 * i as i32);
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(t.as_slice(), &[0, 10, 20, 30, 40, 50]);
    assert_eq!(t.view().at(&[1, 2]), 50);
    let e = HostTensor::<i32>::from_fn(&[3, 0], |_| panic!("called for an empty tensor"));
    assert!(e.as_slice().is_empty());
    let mut t = t;
    t.as_mut_slice()[1] = -1;
    assert_eq!(t.into_vec(), vec![0, -1, 20, 30, 40, 50]);
}

#[test]
fn host_view_new_bounds() {
    let data = f32_data(12);
    // Exactly fills the buffer: fine. One element more: an error naming `layout`.
    assert!(HostView::new(&data, Layout::contiguous(&[3, 4])).is_ok());
    assert!(HostView::new(&data, layout(&[3, 4], &[4, 1], 0)).is_ok());
    match HostView::new(&data, layout(&[3, 4], &[4, 1], 1)).unwrap_err() {
        TkError::Shape { arg, got, .. } => {
            assert_eq!(arg, "layout");
            assert_eq!(got, vec![3, 4]);
        }
        other => panic!("expected TkError::Shape, got {other:?}"),
    }
    assert!(HostView::new(&data, Layout::contiguous(&[13])).is_err());
    assert!(HostView::new(&data, layout(&[2, 2], &[11, 1], 0)).is_err());
    assert!(HostView::new(&data, layout(&[2, 2], &[10, 1], 0)).is_ok());
    // Empty layouts touch nothing, so their offset may be the buffer's length but not beyond.
    assert!(HostView::new(&data, layout(&[0, 4], &[4, 1], 12)).is_ok());
    assert!(HostView::new(&data, layout(&[0, 4], &[4, 1], 13)).is_err());
    // Rank 0 at the last element, and one past it.
    assert!(HostView::new(&data, layout(&[], &[], 11)).is_ok());
    assert!(HostView::new(&data, layout(&[], &[], 12)).is_err());
}

/// A layout whose span or element count overflows `usize` must be refused with an error, not
/// wrapped around into a small span that passes the bounds check (release build) nor panic on
/// the overflow (debug build).
#[test]
fn host_view_new_refuses_overflowing_layouts() {
    let data = f32_data(12);
    let r = catch_unwind(|| {
        (
            HostView::new(&data, layout(&[2], &[usize::MAX], 0)).is_err(),
            HostView::new(&data, layout(&[3], &[1 << (usize::BITS - 1)], 0)).is_err(),
            HostView::new(&data, layout(&[2, 2], &[1, 1], usize::MAX)).is_err(),
            // numel = 2^64 wraps to 0, which would make the layout look empty.
            HostView::new(&data, layout(&[1 << (usize::BITS - 1), 2], &[2, 1], 0)).is_err(),
        )
    });
    assert_eq!(
        r.ok(),
        Some((true, true, true, true)),
        "overflowing layouts must be refused with an error"
    );
}

#[test]
fn host_view_with_layout_and_narrow_bounds() {
    let t = HostTensor::from_vec(f32_data(24), &[4, 6]).unwrap();
    let v = t.view();
    // Transposed view of the same buffer.
    let tr = v.with_layout(layout(&[6, 4], &[1, 6], 0)).unwrap();
    assert_eq!(tr.at(&[5, 3]), 23.0);
    assert!(matches!(
        v.with_layout(layout(&[6, 4], &[1, 6], 1)),
        Err(TkError::Shape { arg: "layout", .. })
    ));
    assert!(v.with_layout(Layout::contiguous(&[5, 5])).is_err());

    let n = v.narrow(1, 2, 3).unwrap();
    assert_eq!(n.shape(), &[4, 3]);
    assert_eq!(n.at(&[0, 0]), 2.0);
    assert_eq!(n.at(&[3, 2]), 22.0);
    // Narrowing a narrowed view is checked against the narrowed shape.
    assert_eq!(param_arg(n.narrow(1, 1, 3).unwrap_err()), "start/len");
    assert_eq!(param_arg(n.narrow(2, 0, 1).unwrap_err()), "dim");
    assert_eq!(param_arg(v.narrow(0, 3, 2).unwrap_err()), "start/len");
    assert_eq!(n.narrow(1, 1, 2).unwrap().at(&[1, 0]), 9.0);
}

#[test]
fn host_view_at() {
    let data = f32_data(30);
    // shape (2, 3) with row stride 10, column stride 3, offset 4.
    let v = HostView::new(&data, layout(&[2, 3], &[10, 3], 4)).unwrap();
    for i in 0..2 {
        for j in 0..3 {
            assert_eq!(v.at(&[i, j]), (4 + 10 * i + 3 * j) as f32);
        }
    }
    assert!(std::ptr::eq(v.raw_data(), &data[..]));
    // Out of bounds (even when the buffer index would still be inside the buffer) and wrong rank.
    assert!(catch_unwind(|| v.at(&[0, 3])).is_err());
    assert!(catch_unwind(|| v.at(&[2, 0])).is_err());
    assert!(catch_unwind(|| v.at(&[1])).is_err());
    assert!(catch_unwind(|| v.at(&[1, 1, 0])).is_err());
}

#[test]
fn host_view_to_contiguous_vec_strided() {
    let t = HostTensor::<i32>::from_fn(&[3, 4], |i| i as i32);
    let v = t.view();
    // Transpose.
    let tr = v.with_layout(layout(&[4, 3], &[1, 4], 0)).unwrap();
    assert_eq!(
        tr.to_contiguous_vec(),
        vec![0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
    );
    // Column window.
    assert_eq!(
        v.narrow(1, 1, 2).unwrap().to_contiguous_vec(),
        vec![1, 2, 5, 6, 9, 10]
    );
    // Every other column, starting at 1, last two rows.
    let s = v.with_layout(layout(&[2, 2], &[4, 2], 5)).unwrap();
    assert_eq!(s.to_contiguous_vec(), vec![5, 7, 9, 11]);
    // Broadcast rows.
    let b = v.with_layout(layout(&[3, 2], &[0, 1], 2)).unwrap();
    assert_eq!(b.to_contiguous_vec(), vec![2, 3, 2, 3, 2, 3]);
    // Row window (contiguous at an offset) and empty.
    assert_eq!(
        v.narrow(0, 1, 2).unwrap().to_contiguous_vec(),
        (4..12).collect::<Vec<_>>()
    );
    assert!(v.narrow(1, 4, 0).unwrap().to_contiguous_vec().is_empty());
    // to_tensor: a contiguous copy with the view's shape.
    let c = tr.to_tensor();
    assert_eq!(c.shape(), &[4, 3]);
    assert_eq!(c.as_slice(), &tr.to_contiguous_vec()[..]);
}

#[test]
fn host_view_contiguous_slice() {
    let t = HostTensor::<i32>::from_fn(&[3, 4], |i| i as i32);
    let v = t.view();
    assert_eq!(v.contiguous_slice(), Some(t.as_slice()));
    assert_eq!(
        v.narrow(0, 1, 2).unwrap().contiguous_slice(),
        Some(&t.as_slice()[4..12])
    );
    assert_eq!(
        v.narrow(0, 2, 1)
            .unwrap()
            .narrow(1, 1, 2)
            .unwrap()
            .contiguous_slice(),
        Some(&t.as_slice()[9..11])
    );
    // Size-1 dimension with an odd stride.
    let odd = v.with_layout(layout(&[1, 3], &[100, 1], 2)).unwrap();
    assert_eq!(odd.contiguous_slice(), Some(&t.as_slice()[2..5]));
    // Empty.
    assert_eq!(
        v.narrow(0, 3, 0).unwrap().contiguous_slice(),
        Some(&[] as &[i32])
    );
    // Not contiguous: column window, transpose, broadcast.
    assert_eq!(v.narrow(1, 0, 3).unwrap().contiguous_slice(), None);
    assert_eq!(
        v.with_layout(layout(&[4, 3], &[1, 4], 0))
            .unwrap()
            .contiguous_slice(),
        None
    );
    assert_eq!(
        v.with_layout(layout(&[2, 4], &[0, 1], 0))
            .unwrap()
            .contiguous_slice(),
        None
    );
}

// ---------------------------------------------------------------------------------------------
// tk_core::testing
// ---------------------------------------------------------------------------------------------

#[test]
fn rng_is_deterministic_per_seed() {
    let a: Vec<u64> = {
        let mut r = Rng::new(42);
        (0..1000).map(|_| r.next_u64()).collect()
    };
    let b: Vec<u64> = {
        let mut r = Rng::new(42);
        (0..1000).map(|_| r.next_u64()).collect()
    };
    let c: Vec<u64> = {
        let mut r = Rng::new(43);
        (0..1000).map(|_| r.next_u64()).collect()
    };
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Different seeds give different streams, not shifted copies of one stream.
    let same_positions = a.iter().zip(&c).filter(|(x, y)| x == y).count();
    assert_eq!(same_positions, 0);
    assert!(!c.windows(2).any(|w| a.contains(&w[0]) && a.contains(&w[1])));
    // Values are spread over the whole range.
    assert!(a.iter().any(|&x| x >> 63 == 1) && a.iter().any(|&x| x >> 63 == 0));
    // A clone continues the same stream.
    let mut r = Rng::new(7);
    r.next_u64();
    let mut s = r.clone();
    assert_eq!(r.next_u64(), s.next_u64());
    // SplitMix64 reference value: the first output for state 0.
    assert_eq!(Rng::new(0).next_u64(), 0xe220_a839_7b1d_cdaf);
    // for_case uses case_seed.
    assert_eq!(
        Rng::for_case("some case").next_u64(),
        Rng::new(case_seed("some case")).next_u64()
    );
}

#[test]
fn rng_normal_moments() {
    let mut r = Rng::new(0x5eed);
    let n = 100_000;
    let xs: Vec<f64> = (0..n).map(|_| f64::from(r.normal())).collect();
    assert!(xs.iter().all(|x| x.is_finite()));
    let mean = xs.iter().sum::<f64>() / n as f64;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
    assert!(mean.abs() < 0.02, "mean {mean}");
    assert!((var - 1.0).abs() < 0.03, "variance {var}");
    // Symmetric and with Gaussian tails: about 4.55% beyond 2 sigma.
    let beyond2 = xs.iter().filter(|x| x.abs() > 2.0).count() as f64 / n as f64;
    assert!((beyond2 - 0.0455).abs() < 0.005, "P(|x|>2) = {beyond2}");
    let positive = xs.iter().filter(|&&x| x > 0.0).count() as f64 / n as f64;
    assert!((positive - 0.5).abs() < 0.01, "P(x>0) = {positive}");
}

#[test]
fn rng_uniform_and_below_ranges() {
    let mut r = Rng::new(99);
    for _ in 0..10_000 {
        let u = r.uniform();
        assert!((0.0..1.0).contains(&u), "uniform {u}");
    }
    for _ in 0..1000 {
        assert_eq!(r.below(1), 0);
    }
    for n in [2u64, 7, 1000, 1 << 40, u64::MAX] {
        for _ in 0..10_000 {
            let x = r.below(n);
            assert!(x < n, "below({n}) gave {x}");
        }
    }
    // Every value of a small range is reached, roughly uniformly.
    let mut counts = [0usize; 7];
    for _ in 0..70_000 {
        counts[r.below(7) as usize] += 1;
    }
    assert!(
        counts.iter().all(|&c| (9_000..11_000).contains(&c)),
        "{counts:?}"
    );
    // Large bounds reach the upper half too.
    assert!((0..100).any(|_| r.below(u64::MAX) > u64::MAX / 2));
}

#[test]
fn par_random_bits_follows_the_chunk_seed_rule() {
    const CHUNK: usize = 1 << 20;
    let n = 2 * CHUNK + 12_345; // three chunks, the last one partial
    let seed = 1234;
    let a = par_random_bits::<i64>(&[n], seed);
    assert_eq!(a.shape(), &[n]);
    // Documented rule: chunk k of 1 Mi elements is the stream seeded `seed + k`.
    let mut expected = Vec::with_capacity(n);
    for k in 0..n.div_ceil(CHUNK) {
        let mut r = Rng::new(seed + k as u64);
        let len = CHUNK.min(n - k * CHUNK);
        expected.extend((0..len).map(|_| r.next_u64() as i64));
    }
    assert!(a.as_slice() == &expected[..], "par_random_bits != model");
}

#[test]
fn par_random_bits_deterministic_and_not_zero() {
    let shape = [3, 1000, 700];
    let a = par_random_bits::<u8>(&shape, 5);
    let b = par_random_bits::<u8>(&shape, 5);
    let c = par_random_bits::<u8>(&shape, 6);
    assert_eq!(a.shape(), &shape);
    assert_eq!(a.as_slice().len(), 2_100_000);
    assert!(a == b, "same seed and shape gave different data");
    assert!(
        a.as_slice() != c.as_slice(),
        "different seeds gave equal data"
    );
    assert!(a.as_slice().iter().any(|&x| x != 0));
    // Every byte value shows up (uniform bit patterns).
    let mut seen = [false; 256];
    a.as_slice().iter().for_each(|&x| seen[x as usize] = true);
    assert!(seen.iter().all(|&s| s));
    // f32 bit patterns: from raw bits, so NaNs and all exponents occur.
    let f = par_random_bits::<f32>(&[1 << 16], 1);
    assert!(f.as_slice().iter().any(|x| x.is_nan()));
    assert!(f.as_slice().iter().any(|x| x.abs() > 1e30));
    // Empty shapes work.
    assert!(par_random_bits::<f32>(&[0, 8], 1).as_slice().is_empty());
}

#[test]
fn case_seed_differs_per_case() {
    let names = [
        "a",
        "b",
        "ab",
        "ba",
        "transpose/bf16/4032x576",
        "transpose/bf16/4032x577",
        "",
    ];
    let seeds: Vec<u64> = names.iter().map(|n| case_seed(n)).collect();
    for i in 0..seeds.len() {
        for j in i + 1..seeds.len() {
            assert_ne!(seeds[i], seeds[j], "{:?} vs {:?}", names[i], names[j]);
        }
    }
    assert_eq!(case_seed("a"), case_seed("a"));
    // Many similar names, as a parameter grid produces: all seeds distinct.
    let mut grid: Vec<u64> = (0..4096)
        .map(|i| case_seed(&format!("case/{}x{}", i / 64, i % 64)))
        .collect();
    grid.sort_unstable();
    grid.dedup();
    assert_eq!(grid.len(), 4096, "case seeds collide");
}

#[test]
fn calc_diff_values() {
    let x: Vec<f64> = (0..1000)
        .map(|i| ((i * 37) % 101) as f64 / 7.0 - 5.0)
        .collect();
    let neg: Vec<f64> = x.iter().map(|v| -v).collect();
    let d = calc_diff(&x, &x);
    assert!(d.abs() < 1e-12, "identical: {d}");
    let d = calc_diff(&x, &neg);
    assert!((d - 2.0).abs() < 1e-12, "negated: {d}");
    assert_eq!(calc_diff(&[0.0; 16], &[0.0; 16]), 0.0);
    assert_eq!(calc_diff(&[], &[]), 0.0);
    // Orthogonal vectors: 1; a scaled copy: (a-b)²/(a²+b²) = 1/5 for scale 2.
    assert!((calc_diff(&[1.0, 0.0], &[0.0, 1.0]) - 1.0).abs() < 1e-15);
    let twice: Vec<f64> = x.iter().map(|v| 2.0 * v).collect();
    assert!((calc_diff(&x, &twice) - 0.2).abs() < 1e-12);
}

#[test]
fn assert_bits_eq_detects_mismatches() {
    let a = [1.0f32, 2.0, 3.0];
    assert!(catch_unwind(|| assert_bits_eq("value", &a, &[1.0f32, 2.5, 3.0])).is_err());
    // Bit comparison, not `==`: +0.0 and -0.0 differ.
    assert!(catch_unwind(|| assert_bits_eq("sign", &[0.0f32], &[-0.0f32])).is_err());
    // NaNs with different payloads differ.
    let (n1, n2) = (f32::from_bits(0x7fc0_0001), f32::from_bits(0x7fc0_0002));
    assert!(catch_unwind(|| assert_bits_eq("nan payload", &[n1], &[n2])).is_err());
    // Length mismatch.
    assert!(catch_unwind(|| assert_bits_eq("length", &a, &a[..2])).is_err());
    // The panic message names the check and the first differing index.
    let err =
        catch_unwind(|| assert_bits_eq("my-check", &[1u8, 2, 3, 4], &[1u8, 2, 9, 4])).unwrap_err();
    let msg = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(msg.contains("my-check") && msg.contains("[2]"), "{msg}");
}

#[test]
fn assert_bits_eq_accepts_equal_bits_including_nans() {
    let nan = f32::from_bits(0x7fc0_1234);
    let neg_nan = f32::from_bits(0xffc0_0000);
    let a = [1.0f32, nan, -0.0, neg_nan, f32::INFINITY];
    let b = a;
    // `a != b` under float equality, yet the bits are equal.
    assert_ne!(a[..], b[..]);
    assert!(catch_unwind(|| assert_bits_eq("nans", &a, &b)).is_ok());
    assert!(catch_unwind(|| assert_bits_eq::<f32>("empty", &[], &[])).is_ok());
    let h = [half::bf16::from_bits(0x7fc1), half::bf16::from_bits(0x0001)];
    assert!(catch_unwind(|| assert_bits_eq("bf16", &h, &h)).is_ok());
}

#[test]
fn align_rounds_up() {
    assert_eq!(align(0, 64), 0);
    assert_eq!(align(1, 64), 64);
    assert_eq!(align(64, 64), 64);
    assert_eq!(align(65, 64), 128);
    assert_eq!(align(4001, 128), 4096);
}

#[test]
fn generate_num_tokens_per_spec() {
    let full = full_test();
    let expect = |v: &[usize]| -> Vec<usize> {
        if full {
            std::iter::once(0).chain(v.iter().copied()).collect()
        } else {
            v.to_vec()
        }
    };
    assert_eq!(generate_num_tokens(64, false), expect(&[4032, 8064]));
    assert_eq!(generate_num_tokens(128, false), expect(&[4096, 8064]));
    // Benchmarks never get the empty case.
    assert_eq!(generate_num_tokens(64, true), vec![4032, 8064]);
    assert_eq!(generate_num_tokens(128, true), vec![4096, 8064]);
    assert_eq!(generate_num_tokens(1, true), vec![4001, 8001]);
}

#[test]
fn generate_hidden_sizes_per_spec() {
    assert_eq!(
        generate_hidden_sizes(64),
        vec![576, 2048, 2560, 3072, 4096, 6144, 7168]
    );
    assert_eq!(
        generate_hidden_sizes(128),
        vec![2048, 2560, 3072, 4096, 6144, 7168]
    );
    assert_eq!(
        generate_hidden_sizes(1024),
        vec![2048, 3072, 4096, 6144, 7168]
    );
}
