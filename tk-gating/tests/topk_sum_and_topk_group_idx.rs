//! `topk_sum_and_topk_group_idx` (`spec/moe.md` §4.4, §5.1, §5.2): hand-computed examples,
//! duplicated maxima counted twice, planted ties, NaN / inf groups, strided input, every
//! rejection path, and agreement with a naive implementation on the spec's grid and on group
//! counts and sizes beyond upstream's limits.
#![cfg(feature = "cpu")]

mod common;

use common::{assert_param, naive_group_idx};
use test_case::test_case;
use tk_core::testing::Rng;
use tk_core::{HostTensor, Layout, TkError};
use tk_gating::reference::topk_sum_and_topk_group_idx;
use tk_gating::TopkSumAndTopkGroupIdxParams as Params;

const NINF: f32 = f32::NEG_INFINITY;
const INF: f32 = f32::INFINITY;
const NAN: f32 = f32::NAN;

/// One token's groups `(G, P)` → the group indices.
fn groups_of(groups: &[&[f32]], n: usize, gk: usize) -> Vec<i64> {
    let (g, p) = (groups.len(), groups[0].len());
    let flat: Vec<f32> = groups.iter().flat_map(|r| r.iter().copied()).collect();
    let x = HostTensor::from_vec(flat, &[1, g, p]).unwrap();
    let out = topk_sum_and_topk_group_idx(&x.view(), &Params::new(n, gk)).unwrap();
    assert_eq!(out.shape(), &[1, gk]);
    out.into_vec()
}

#[test]
fn duplicated_maximum_counts_twice() {
    // [5, 5, 1] scores 10 and beats [9, 0.5, 0] (9.5); by top-1 the order flips.
    let g: [&[f32]; 2] = [&[5.0, 1.0, 5.0], &[9.0, 0.5, 0.0]];
    assert_eq!(groups_of(&g, 2, 2), vec![0, 1]);
    assert_eq!(groups_of(&g, 1, 2), vec![1, 0]);
}

#[test]
fn hand_example_in_rank_order() {
    let g: [&[f32]; 4] = [
        &[0.0, 1.0, 0.5],   // top2 1.5, top1 1.0
        &[2.0, -1.0, -1.0], // top2 1.0, top1 2.0
        &[0.75, 0.75, 0.0], // top2 1.5, top1 0.75
        &[3.0, 0.5, 0.25],  // top2 3.5, top1 3.0
    ];
    assert_eq!(groups_of(&g, 2, 4), vec![3, 0, 2, 1]);
    assert_eq!(groups_of(&g, 2, 2), vec![3, 0]);
    assert_eq!(groups_of(&g, 1, 3), vec![3, 1, 0]);
}

#[test]
fn ties_go_to_the_smaller_group() {
    let g: [&[f32]; 4] = [&[1.0, 1.0], &[2.0, 0.0], &[0.0, 2.0], &[1.5, 0.5]];
    assert_eq!(groups_of(&g, 2, 4), vec![0, 1, 2, 3]);
    let g: [&[f32]; 3] = [&[0.0, 1.0], &[1.0, 0.5], &[0.0, 0.0]];
    assert_eq!(groups_of(&g, 1, 3), vec![0, 1, 2]);
    // -0.0 + -0.0 = -0.0 ties with 0.0.
    let g: [&[f32]; 2] = [&[-0.0, -0.0], &[0.0, 0.0]];
    assert_eq!(groups_of(&g, 2, 2), vec![0, 1]);
}

#[test]
fn nan_and_infinite_groups() {
    // A group holding a NaN scores NaN and ranks first (reference order).
    let g: [&[f32]; 3] = [&[1.0, 2.0], &[NAN, -5.0], &[INF, 0.0]];
    assert_eq!(groups_of(&g, 2, 3), vec![1, 2, 0]);
    assert_eq!(groups_of(&g, 1, 3), vec![1, 2, 0]);
    // All -inf groups tie at -inf: by index, after finite ones.
    let g: [&[f32]; 3] = [&[NINF, NINF], &[0.0, -1.0], &[NINF, NINF]];
    assert_eq!(groups_of(&g, 2, 3), vec![1, 0, 2]);
    // (+inf) + (-inf) = NaN: that group ranks first, as in the reference.
    let g: [&[f32]; 2] = [&[1.0, 1.0], &[INF, NINF]];
    assert_eq!(groups_of(&g, 2, 2), vec![1, 0]);
    assert_eq!(groups_of(&g, 1, 2), vec![1, 0]);
}

#[test]
fn zero_tokens_and_strides() {
    let empty = HostTensor::<f32>::from_vec(vec![], &[0, 4, 3]).unwrap();
    let out = topk_sum_and_topk_group_idx(&empty.view(), &Params::new(2, 2)).unwrap();
    assert_eq!(out.shape(), &[0, 2]);
    // (2, 2, 2) window of a (2, 2, 3) buffer: P stride 1, G stride 3, T stride 6.
    let buf = HostTensor::from_vec(
        vec![
            1.0, 1.0, 99.0, 0.0, 3.0, 99.0, 5.0, 0.0, 99.0, 2.0, 2.0, 99.0,
        ],
        &[2, 2, 3],
    )
    .unwrap();
    let w = buf.view().narrow(2, 0, 2).unwrap();
    let out = topk_sum_and_topk_group_idx(&w, &Params::new(2, 2)).unwrap();
    assert_eq!(out.as_slice(), &[1, 0, 0, 1]);
    let out = topk_sum_and_topk_group_idx(&w, &Params::new(1, 1)).unwrap();
    assert_eq!(out.as_slice(), &[1, 0]);
}

#[test]
fn rejections_name_the_argument() {
    let x = HostTensor::<f32>::from_vec(vec![0.0; 24], &[2, 4, 3]).unwrap();
    let v = x.view();
    for n in [0, 3] {
        assert_param(
            topk_sum_and_topk_group_idx(&v, &Params::new(n, 2)).unwrap_err(),
            "num_topk_sum",
            &["1 or 2"],
        );
    }
    for gk in [0, 5] {
        assert_param(
            topk_sum_and_topk_group_idx(&v, &Params::new(1, gk)).unwrap_err(),
            "num_topk_groups",
            &["G = 4"],
        );
    }
    let p1 = HostTensor::<f32>::from_vec(vec![0.0; 8], &[2, 4, 1]).unwrap();
    assert_param(
        topk_sum_and_topk_group_idx(&p1.view(), &Params::new(2, 2)).unwrap_err(),
        "num_topk_sum",
        &["P = 1"],
    );
    assert!(topk_sum_and_topk_group_idx(&p1.view(), &Params::new(1, 2)).is_ok());
    let flat = HostTensor::<f32>::from_vec(vec![0.0; 24], &[2, 12]).unwrap();
    let e = topk_sum_and_topk_group_idx(&flat.view(), &Params::new(1, 1)).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "scores", .. }), "{e:?}");
    for shape in [[2usize, 0, 3], [2, 4, 0]] {
        let z = HostTensor::<f32>::from_vec(vec![], &shape).unwrap();
        let e = topk_sum_and_topk_group_idx(&z.view(), &Params::new(1, 1)).unwrap_err();
        assert!(matches!(e, TkError::Empty { arg: "scores", .. }), "{e:?}");
    }
    let strided = v
        .with_layout(Layout::new(vec![2, 4, 3], vec![12, 1, 4], 0).unwrap())
        .unwrap();
    let e = topk_sum_and_topk_group_idx(&strided, &Params::new(1, 1)).unwrap_err();
    assert!(matches!(e, TkError::Stride { arg: "scores", .. }), "{e:?}");
    let shape = Params::new(2, 3).validate(v.layout()).unwrap();
    assert_eq!(
        (shape.num_groups, shape.group_size, shape.out_shape()),
        (4, 3, [2, 3])
    );
}

/// Random tokens (every third one with planted ties from a small value set, some with -inf and
/// NaN) against the naive implementation.
fn check_random(case: &str, t: usize, g: usize, p: usize, n: usize, gk: usize) {
    let mut rng = Rng::for_case(case);
    let data: Vec<f32> = (0..t * g * p)
        .map(|i| match (i / (g * p)) % 3 {
            0 => rng.normal(),
            1 => (rng.below(3) as f32) * 0.25,
            _ => match rng.below(12) {
                0 => NAN,
                1 => NINF,
                2 => INF,
                _ => rng.normal(),
            },
        })
        .collect();
    let x = HostTensor::from_vec(data, &[t, g, p]).unwrap();
    let out = topk_sum_and_topk_group_idx(&x.view(), &Params::new(n, gk)).unwrap();
    for row in 0..t {
        let groups: Vec<Vec<f32>> = (0..g)
            .map(|q| x.as_slice()[(row * g + q) * p..(row * g + q + 1) * p].to_vec())
            .collect();
        let want: Vec<i64> = naive_group_idx(&groups, n, gk)
            .into_iter()
            .map(|q| q as i64)
            .collect();
        assert_eq!(
            &out.as_slice()[row * gk..(row + 1) * gk],
            &want[..],
            "{case}: row {row}"
        );
    }
}

/// The spec's grid (§4.4): (E, G) with E % G == 0 × num_topk_sum {1, 2} × num_topk_groups {2, 4}.
#[test]
fn spec_grid_matches_naive() {
    for (e, g) in tk_gating::topk_sum_and_topk_group_idx::SPEC_CONFIGS {
        for n in [1, 2] {
            for gk in [2, 4] {
                check_random(&format!("group spec {e} {g} {n} {gk}"), 9, g, e / g, n, gk);
            }
        }
    }
}

// Beyond upstream's limits and off-grid: G > 32, one group, P = 1 / 2 / 33, Gk = G,
// 1 / 3 / 37 tokens, 160 and 384 experts.
#[test_case(37, 40, 4, 2, 7; "G 40 above the warp")]
#[test_case(3, 64, 6, 1, 64; "G 64 all kept")]
#[test_case(37, 1, 5, 2, 1; "one group")]
#[test_case(37, 6, 1, 1, 3; "P 1 top-1")]
#[test_case(37, 6, 2, 2, 3; "P 2 top-2")]
#[test_case(3, 5, 33, 2, 4; "P 33")]
#[test_case(1, 8, 20, 2, 4; "E 160 one token")]
#[test_case(37, 8, 20, 1, 3; "E 160")]
#[test_case(3, 12, 32, 2, 4; "E 384")]
#[test_case(37, 48, 8, 2, 7; "E 384 G 48")]
fn beyond_upstream_limits_matches_naive(t: usize, g: usize, p: usize, n: usize, gk: usize) {
    check_random(
        &format!("group off-grid {t} {g} {p} {n} {gk}"),
        t,
        g,
        p,
        n,
        gk,
    );
}
