//! `aux_fi` (`spec/moe.md` §4.6, §5.19): hand-computed fractions, the documented formula
//! (`fp32(c·E) / fp32(T·num_aux_topk)`) bit for bit against an independent computation on the
//! moe12 grid (subsampled: 600 sent tokens) × `num_aux_topk ∈ {1, K}`, the spec's tolerance
//! against upstream's reference formula, determinism (repeated runs, strided and reordered
//! rows), and rejections.
#![cfg(feature = "cpu")]

mod common;

use common::{assert_param, assert_shape_err, grid, mat, padded_rows, topk_idx_sub};
use tk_core::testing::{assert_bits_eq, calc_diff};
use tk_core::{HostTensor, HostView};
use tk_moe::reference::aux_fi;
use tk_moe::AuxFiParams;

#[test]
fn hand_example() {
    // T = 3, E = 4, counts [2, 1, 2, 0]: f = c·4 / (3·2).
    let idx = mat(&[&[0i64, 2, 2], &[-1, 1, 0], &[-1, -1, -1]]);
    let f = aux_fi(&idx.view(), &AuxFiParams::new(4, 2)).unwrap();
    assert_eq!(f.as_slice(), &[8.0f32 / 6.0, 4.0 / 6.0, 8.0 / 6.0, 0.0]);
    let empty = HostTensor::<i64>::from_vec(vec![], &[0, 3]).unwrap();
    assert_eq!(
        aux_fi(&empty.view(), &AuxFiParams::new(3, 3))
            .unwrap()
            .as_slice(),
        &[0.0; 3]
    );
}

#[test]
fn formula_rounds_each_product_once() {
    // c·E = 16777217 (2^24 + 1) rounds to 2^24 in fp32 before the division: 2^24 / 1.
    let p = AuxFiParams::new(16_777_217, 1);
    assert_eq!(p.fraction(1, 1), 16_777_216.0);
    // T·num_aux_topk = 3·7 = 21: one correctly rounded division.
    assert_eq!(AuxFiParams::new(5, 7).fraction(4, 3), 20.0f32 / 21.0);
    assert_eq!(AuxFiParams::new(5, 7).fraction(4, 0), 0.0);
}

#[test]
fn rejections() {
    let idx = mat(&[&[0i64, 1]]);
    assert_param(
        aux_fi(&mat(&[&[0i64, -2]]).view(), &AuxFiParams::new(4, 1)).unwrap_err(),
        "topk_idx",
        &["-2", "only legal negative"],
    );
    assert_param(
        aux_fi(&mat(&[&[0i64, 4]]).view(), &AuxFiParams::new(4, 1)).unwrap_err(),
        "topk_idx",
        &["out of range"],
    );
    assert_param(
        aux_fi(&idx.view(), &AuxFiParams::new(0, 1)).unwrap_err(),
        "num_experts",
        &[">= 1"],
    );
    assert_param(
        aux_fi(&idx.view(), &AuxFiParams::new(4, 0)).unwrap_err(),
        "num_aux_topk",
        &[">= 1"],
    );
    let v = HostTensor::<i64>::from_vec(vec![0], &[1]).unwrap();
    assert_shape_err(
        aux_fi(&v.view(), &AuxFiParams::new(4, 1)).unwrap_err(),
        "topk_idx",
    );
}

#[test]
fn moe12_grid_exact_and_deterministic() {
    for p in grid() {
        let idx = topk_idx_sub("aux_fi", &p, usize::MAX);
        let (t, k) = (idx.shape()[0], idx.shape()[1]);
        let e = p.num_experts;
        for naux in [1, k] {
            let params = AuxFiParams::new(e, naux);
            let f = aux_fi(&idx.view(), &params).unwrap();
            // Independent: exact counts, then the documented formula.
            let expected: Vec<f32> = (0..e as i64)
                .map(|g| {
                    let c = idx.as_slice().iter().filter(|&&v| v == g).count();
                    (c * e) as f32 / (t * naux) as f32
                })
                .collect();
            assert_bits_eq(&p.name(), f.as_slice(), &expected);
            // Within the spec's tolerance of upstream's reference (`c.float() * E / (T·n)`).
            let upstream: Vec<f64> = (0..e as i64)
                .map(|g| {
                    let c = idx.as_slice().iter().filter(|&&v| v == g).count() as f32;
                    (c * e as f32 / (t * naux) as f32) as f64
                })
                .collect();
            let ours: Vec<f64> = f.as_slice().iter().map(|&v| v as f64).collect();
            assert!(calc_diff(&ours, &upstream) < 2e-7, "{}", p.name());
            // Deterministic: again, strided, and with the rows reversed (any grid order).
            assert_eq!(aux_fi(&idx.view(), &params).unwrap(), f);
            let (buf, layout) = padded_rows(&idx, 1, 99);
            assert_eq!(
                aux_fi(&HostView::new(&buf, layout).unwrap(), &params).unwrap(),
                f
            );
            let rev: Vec<i64> = idx.as_slice().chunks(k).rev().flatten().copied().collect();
            let rev = HostTensor::from_vec(rev, &[t, k]).unwrap();
            assert_eq!(aux_fi(&rev.view(), &params).unwrap(), f);
        }
    }
}
