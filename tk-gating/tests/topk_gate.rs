//! `topk_gate` and `stable_topk` (`spec/moe.md` §4.2, §4.3, §5.1, §5.16): hand-computed
//! examples, planted ties, `-inf` rows (distinct indices), NaN behaviour, strided input, every
//! rejection path, and agreement with a naive max-and-remove implementation on the spec's grid
//! and off-grid shapes.
#![cfg(feature = "cpu")]

mod common;

use common::{assert_param, err_arg, naive_topk};
use test_case::test_case;
use tk_core::testing::Rng;
use tk_core::{HostTensor, Layout, TkError};
use tk_gating::reference::{stable_topk, topk_gate};
use tk_gating::TopkGateParams;

const NINF: f32 = f32::NEG_INFINITY;
const INF: f32 = f32::INFINITY;
const NAN: f32 = f32::NAN;

fn gate(rows: &[&[f32]], k: usize) -> Vec<Vec<i64>> {
    let e = rows[0].len();
    let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    let x = HostTensor::from_vec(flat, &[rows.len(), e]).unwrap();
    let out = topk_gate(&x.view(), &TopkGateParams::new(k)).unwrap();
    assert_eq!(out.shape(), &[rows.len(), k]);
    out.as_slice().chunks(k).map(|c| c.to_vec()).collect()
}

#[test]
fn hand_examples_best_first() {
    assert_eq!(
        gate(&[&[0.1, 0.9, -2.0, 0.5], &[3.0, 2.0, 1.0, 0.0]], 2),
        vec![vec![1, 3], vec![0, 1]]
    );
    assert_eq!(gate(&[&[0.1, 0.9, -2.0, 0.5]], 4), vec![vec![1, 3, 0, 2]]);
    assert_eq!(gate(&[&[7.0]], 1), vec![vec![0]]);
}

#[test]
fn ties_go_to_the_smaller_index() {
    assert_eq!(gate(&[&[1.0, 3.0, 3.0, 2.0, 3.0]], 3), vec![vec![1, 2, 4]]);
    assert_eq!(gate(&[&[0.0; 6]], 4), vec![vec![0, 1, 2, 3]]);
    // -0.0 and +0.0 are equal.
    assert_eq!(gate(&[&[-0.0, 0.0, -1.0]], 2), vec![vec![0, 1]]);
    assert_eq!(gate(&[&[0.0, -0.0, -1.0]], 2), vec![vec![0, 1]]);
    // +inf ties like any value.
    assert_eq!(gate(&[&[1.0, INF, 2.0, INF]], 3), vec![vec![1, 3, 2]]);
}

#[test]
fn neg_inf_rows_give_distinct_indices() {
    // Upstream's kernel overwrites selected entries with -inf and can return an index twice
    // here; the reference (and this crate) return distinct indices.
    assert_eq!(gate(&[&[NINF; 5]], 5), vec![vec![0, 1, 2, 3, 4]]);
    assert_eq!(gate(&[&[NINF, 5.0, NINF, NINF]], 3), vec![vec![1, 0, 2]]);
    assert_eq!(
        gate(&[&[NINF, NINF, 2.0, NINF, 1.0]], 5),
        vec![vec![2, 4, 0, 1, 3]]
    );
    for row in gate(&[&[NINF, 0.0, NINF, NINF, NINF, NINF, 1.0, NINF]], 8) {
        let mut sorted = row.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 8, "{row:?} has duplicates");
    }
}

#[test]
fn nan_ranks_first_like_the_reference() {
    // NaN above every number (+inf included), NaNs among themselves by index; any sign/payload.
    let neg_nan = -NAN;
    let payload = f32::from_bits(0x7fc0_1234);
    assert_eq!(
        gate(&[&[1.0, NAN, 3.0, NAN, INF]], 5),
        vec![vec![1, 3, 4, 2, 0]]
    );
    assert_eq!(
        gate(&[&[2.0, neg_nan, payload, 9.0]], 3),
        vec![vec![1, 2, 3]]
    );
    assert_eq!(gate(&[&[NAN; 4]], 2), vec![vec![0, 1]]);
    assert_eq!(gate(&[&[NINF, NAN, NINF]], 3), vec![vec![1, 0, 2]]);
}

#[test]
fn zero_tokens_and_strided_rows() {
    let empty = HostTensor::<f32>::from_vec(vec![], &[0, 5]).unwrap();
    let out = topk_gate(&empty.view(), &TopkGateParams::new(3)).unwrap();
    assert_eq!(out.shape(), &[0, 3]);
    // A (3, 4) window of a (3, 6) buffer: row stride 6.
    let buf = HostTensor::from_vec(
        vec![
            9.0, 1.0, 2.0, 3.0, 4.0, 9.0, //
            9.0, 4.0, 3.0, 2.0, 1.0, 9.0, //
            9.0, 0.0, 5.0, 5.0, 0.0, 9.0,
        ],
        &[3, 6],
    )
    .unwrap();
    let window = buf.view().narrow(1, 1, 4).unwrap();
    let out = topk_gate(&window, &TopkGateParams::new(2)).unwrap();
    assert_eq!(out.as_slice(), &[3, 2, 0, 1, 1, 2]);
}

#[test]
fn stable_topk_is_the_same_selection_and_allows_k_zero() {
    let x = HostTensor::from_vec(vec![1.0, 3.0, 3.0, NAN, NINF, 2.0], &[2, 3]).unwrap();
    let a = stable_topk(&x.view(), 3).unwrap();
    let b = topk_gate(&x.view(), &TopkGateParams::new(3)).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.as_slice(), &[1, 2, 0, 0, 2, 1]);
    let z = stable_topk(&x.view(), 0).unwrap();
    assert_eq!(z.shape(), &[2, 0]);
    assert_param(stable_topk(&x.view(), 4).unwrap_err(), "k", &["E = 3"]);
}

#[test]
fn rejections_name_the_argument() {
    let x = HostTensor::<f32>::from_vec(vec![0.0; 12], &[3, 4]).unwrap();
    for k in [0, 5] {
        assert_param(
            topk_gate(&x.view(), &TopkGateParams::new(k)).unwrap_err(),
            "num_topk",
            &["1 <= num_topk <= E = 4"],
        );
    }
    let flat = HostTensor::<f32>::from_vec(vec![0.0; 12], &[12]).unwrap();
    let e = topk_gate(&flat.view(), &TopkGateParams::new(1)).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "scores", .. }), "{e:?}");
    let no_cols = HostTensor::<f32>::from_vec(vec![], &[3, 0]).unwrap();
    let e = topk_gate(&no_cols.view(), &TopkGateParams::new(1)).unwrap_err();
    assert!(matches!(e, TkError::Empty { arg: "scores", .. }), "{e:?}");
    // A transposed (column-major) view: column stride 3.
    let t = x
        .view()
        .with_layout(Layout::new(vec![4, 3], vec![1, 4], 0).unwrap())
        .unwrap();
    let e = topk_gate(&t, &TopkGateParams::new(1)).unwrap_err();
    assert!(matches!(e, TkError::Stride { arg: "scores", .. }), "{e:?}");
    // Validation alone (shared with the GPU launch).
    let shape = TopkGateParams::new(2).validate(x.view().layout()).unwrap();
    assert_eq!(shape.out_shape(), [3, 2]);
    assert_eq!(
        err_arg(
            &TopkGateParams::new(9)
                .validate(x.view().layout())
                .unwrap_err()
        ),
        "num_topk"
    );
}

/// Random rows, half of them drawn from a small set of values (planted ties), some with -inf
/// and NaN entries, against the naive implementation.
fn check_random(case: &str, t: usize, e: usize, k: usize) {
    let mut rng = Rng::for_case(case);
    let mut data = Vec::with_capacity(t * e);
    for row in 0..t {
        for _ in 0..e {
            let v = match row % 4 {
                0 => rng.normal(),
                1 => (rng.below(4) as f32) * 0.5, // many ties
                2 => {
                    if rng.below(3) == 0 {
                        NINF
                    } else {
                        rng.normal()
                    }
                }
                _ => match rng.below(10) {
                    0 => NAN,
                    1 => INF,
                    2 => NINF,
                    _ => (rng.below(3) as f32) - 1.0,
                },
            };
            data.push(v);
        }
    }
    let x = HostTensor::from_vec(data, &[t, e]).unwrap();
    let out = topk_gate(&x.view(), &TopkGateParams::new(k)).unwrap();
    for row in 0..t {
        let keys = &x.as_slice()[row * e..(row + 1) * e];
        let want: Vec<i64> = naive_topk(keys, k).into_iter().map(|i| i as i64).collect();
        assert_eq!(
            &out.as_slice()[row * k..(row + 1) * k],
            &want[..],
            "{case}: row {row}"
        );
    }
}

// The spec's (E, K) grid (§4.3), with a few tokens.
#[test_case(72, 6)]
#[test_case(32, 6)]
#[test_case(64, 6)]
#[test_case(96, 6)]
#[test_case(16, 6)]
#[test_case(36, 6)]
#[test_case(108, 6)]
#[test_case(128, 6)]
#[test_case(144, 6)]
#[test_case(256, 8)]
fn spec_grid_matches_naive(e: usize, k: usize) {
    check_random(&format!("topk_gate spec {e} {k}"), 37, e, k);
}

// Off-grid shapes: 160 and 384 experts, k 4 and 7, 1 / 3 / 37 tokens; odd E; k = E; k > 32.
#[test_case(1, 160, 4)]
#[test_case(3, 160, 7)]
#[test_case(37, 160, 4)]
#[test_case(1, 384, 7)]
#[test_case(3, 384, 4)]
#[test_case(37, 384, 7)]
#[test_case(37, 384, 40)]
#[test_case(37, 7, 7)]
#[test_case(37, 1, 1)]
#[test_case(37, 33, 1)]
#[test_case(5, 1000, 64)]
fn off_grid_matches_naive(t: usize, e: usize, k: usize) {
    check_random(&format!("topk_gate off-grid {t} {e} {k}"), t, e, k);
}
