//! `normalize_weight` (`spec/moe.md` §4.10, §5.5): hand-computed sums in slot order from
//! `1e-20`, bit-exact agreement with an independent implementation on the moe12 grid
//! (subsampled: 600 sent tokens), strided input, and rejections.
#![cfg(feature = "cpu")]

mod common;

use common::{assert_shape_err, grid, mat, padded_rows, topk_idx_sub};
use tk_core::testing::{assert_bits_eq, Rng};
use tk_core::{HostTensor, HostView, Layout, TkError};
use tk_moe::normalize_weight::DENOMINATOR_EPS;
use tk_moe::reference::normalize_weight;
use tk_moe::testing::random_weights;

#[test]
fn hand_examples() {
    let w = mat(&[&[1.0f32, 3.0], &[0.0, 0.0], &[0.25, 0.25]]);
    let r = normalize_weight(&w.view()).unwrap();
    assert_eq!(r.denominator.as_slice(), &[4.0, 1e-20, 0.5]);
    assert_eq!(
        r.normalized_weights.as_slice(),
        &[0.25, 0.75, 0.0, 0.0, 0.5, 0.5]
    );
    assert_eq!(r.normalized_weights.shape(), &[3, 2]);
    assert_eq!(DENOMINATOR_EPS, 1e-20f32);
}

#[test]
fn sum_order_is_slot_order_from_eps() {
    // ((1e-20 + 1) + 2^-24) + 2^-24 = 1 (each tiny add is a tie to even), whereas any order
    // that adds the two 2^-24 first gives 1 + 2^-23.
    let t = 2f32.powi(-24);
    let r = normalize_weight(&mat(&[&[1.0f32, t, t]]).view()).unwrap();
    assert_eq!(r.denominator.as_slice(), &[1.0]);
    let r = normalize_weight(&mat(&[&[t, t, 1.0f32]]).view()).unwrap();
    assert_eq!(r.denominator.as_slice(), &[1.0 + 2f32.powi(-23)]);
    // Division is one correctly rounded fp32 division: 1/3.
    let r = normalize_weight(&mat(&[&[1.0f32, 2.0]]).view()).unwrap();
    assert_eq!(r.normalized_weights.as_slice()[0], 1.0f32 / 3.0);
}

#[test]
fn zero_rows_and_zero_columns() {
    let w = HostTensor::<f32>::from_vec(vec![], &[0, 6]).unwrap();
    let r = normalize_weight(&w.view()).unwrap();
    assert_eq!(
        (r.denominator.shape(), r.normalized_weights.shape()),
        (&[0usize][..], &[0usize, 6][..])
    );
    let w = HostTensor::<f32>::from_vec(vec![], &[2, 0]).unwrap();
    let r = normalize_weight(&w.view()).unwrap();
    assert_eq!(r.denominator.as_slice(), &[1e-20, 1e-20]);
}

#[test]
fn rejections() {
    let v = HostTensor::<f32>::from_vec(vec![1.0, 2.0], &[2]).unwrap();
    assert_shape_err(normalize_weight(&v.view()).unwrap_err(), "topk_weights");
    let buf = [1.0f32; 6];
    let cm = HostView::new(&buf, Layout::new(vec![3, 2], vec![1, 3], 0).unwrap()).unwrap();
    let e = normalize_weight(&cm).unwrap_err();
    assert!(
        matches!(
            e,
            TkError::Stride {
                arg: "topk_weights",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn moe12_grid_and_strided() {
    for p in grid() {
        let t = topk_idx_sub("normalize_weight", &p, usize::MAX).shape()[0];
        let mut rng = Rng::for_case(&format!("normalize_weight {}", p.name()));
        let w = random_weights(&mut rng, t, p.num_topk);
        let r = normalize_weight(&w.view()).unwrap();
        let (mut den, mut out) = (Vec::new(), Vec::new());
        for row in w.as_slice().chunks(p.num_topk) {
            let mut d = 1e-20f32;
            for &x in row {
                d += x;
            }
            den.push(d);
            out.extend(row.iter().map(|&x| x / d));
        }
        assert_bits_eq("denominator", r.denominator.as_slice(), &den);
        assert_bits_eq("normalized", r.normalized_weights.as_slice(), &out);
        let (buf, layout) = padded_rows(&w, 3, f32::NAN);
        let strided = normalize_weight(&HostView::new(&buf, layout).unwrap()).unwrap();
        assert_eq!(strided, r);
    }
}
