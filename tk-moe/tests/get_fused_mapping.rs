//! `get_fused_mapping` (`spec/moe.md` §4.11, §5.13): a hand-computed example, our documented
//! row order, graph-safe capacities (larger, exact, too small, zero), every rejection, the
//! spec's invariants on the moe12 grid (4001 tokens per rank, alignments 64 and 128 as upstream's
//! test, plus 1 and 16 which the other ops' tests use) and off-grid configurations.
#![cfg(feature = "cpu")]

mod common;

use common::{assert_param, assert_shape_err, check_mapping, grid, mat, padded_rows, topk_idx_for};
use tk_core::testing::Rng;
use tk_core::{HostTensor, HostView, Layout, TkError};
use tk_moe::reference::get_fused_mapping;
use tk_moe::testing::{generate_topk_idx, MoeParams};
use tk_moe::{max_fused_rows, FusedRows, GetFusedMappingParams};

fn example() -> HostTensor<i64> {
    // Token 3 lists expert 2 twice (legal: duplicates get one row each, in slot order).
    mat(&[&[2, 0], &[0, 2], &[-1, 0], &[2, 2]])
}

#[test]
fn hand_example_host_sync() {
    let map =
        get_fused_mapping(&example().view(), &GetFusedMappingParams::host_sync(3, 4)).unwrap();
    // c = [3, 0, 4], A = [4, 0, 4].
    assert_eq!(map.num_tokens_per_expert.as_slice(), &[4, 0, 4]);
    assert_eq!(map.expert_start.as_slice(), &[0, 4, 4]);
    assert_eq!(map.expert_end.as_slice(), &[4, 4, 8]);
    assert_eq!(map.pos_to_expert.as_slice(), &[0, 0, 0, -1, 2, 2, 2, 2]);
    assert_eq!(map.pos_to_token.as_slice(), &[0, 1, 2, -1, 0, 1, 3, 3]);
    assert_eq!(map.pos_to_token_topk.as_slice(), &[1, 2, 5, -1, 0, 3, 6, 7]);
    assert_eq!(map.token_topk_to_pos.as_slice(), &[4, 0, 1, 5, -1, 2, 6, 7]);
    assert_eq!(map.token_topk_to_pos.shape(), &[4, 2]);
    assert_eq!((map.num_rows(), map.used_rows()), (8, 8));
    check_mapping("example", &example().view(), 3, 4, 8, &map);
}

#[test]
fn hand_example_alignment_one() {
    let map =
        get_fused_mapping(&example().view(), &GetFusedMappingParams::host_sync(3, 1)).unwrap();
    assert_eq!(map.num_tokens_per_expert.as_slice(), &[3, 0, 4]);
    assert_eq!(map.expert_end.as_slice(), &[3, 3, 7]);
    assert_eq!(map.pos_to_token_topk.as_slice(), &[1, 2, 5, 0, 3, 6, 7]);
    assert_eq!(map.token_topk_to_pos.as_slice(), &[3, 0, 1, 4, -1, 2, 5, 6]);
}

#[test]
fn rows_are_in_ascending_token_order() {
    // Tokens listed in an order that a reverse or per-warp scheme would not produce.
    let idx = mat(&[&[1, 0], &[1, -1], &[0, 1], &[1, 1], &[-1, 1]]);
    let map = get_fused_mapping(&idx.view(), &GetFusedMappingParams::host_sync(2, 1)).unwrap();
    assert_eq!(map.pos_to_token.as_slice(), &[0, 2, 0, 1, 2, 3, 3, 4]);
    assert_eq!(map.pos_to_token_topk.as_slice(), &[1, 4, 0, 2, 5, 6, 7, 9]);
}

#[test]
fn graph_safe_capacity() {
    let idx = example();
    let synced = get_fused_mapping(&idx.view(), &GetFusedMappingParams::host_sync(3, 4)).unwrap();
    // The bound: ((T·K + (a-1)·E) / a)·a = ((8 + 9) / 4)·4 = 16.
    assert_eq!(max_fused_rows(4, 2, 3, 4), Some(16));
    for m in [8, 9, 16, 100] {
        let map = get_fused_mapping(&idx.view(), &GetFusedMappingParams::new(3, 4, m)).unwrap();
        check_mapping(&format!("capacity {m}"), &idx.view(), 3, 4, m, &map);
        assert_eq!(map.num_rows(), m);
        assert_eq!(map.used_rows(), 8);
        assert_eq!(
            &map.pos_to_expert.as_slice()[..8],
            synced.pos_to_expert.as_slice()
        );
        assert!(map.pos_to_token.as_slice()[8..].iter().all(|&v| v == -1));
        assert_eq!(map.token_topk_to_pos, synced.token_topk_to_pos);
        assert_eq!(map.expert_start, synced.expert_start);
    }
    // One row short: an error naming the capacity, with the needed count.
    let e = get_fused_mapping(&idx.view(), &GetFusedMappingParams::new(3, 4, 7)).unwrap_err();
    assert_param(e, "num_expanded_tokens", &["too small", "7", "8"]);
    let e = get_fused_mapping(&idx.view(), &GetFusedMappingParams::new(3, 4, 0)).unwrap_err();
    assert_param(e, "num_expanded_tokens", &["too small"]);
    // Capacity 0 with no valid entry: upstream's force_no_sync case, empty maps.
    let none = mat(&[&[-1i64, -1], &[-1, -1]]);
    let map = get_fused_mapping(&none.view(), &GetFusedMappingParams::new(3, 4, 0)).unwrap();
    assert_eq!(map.num_rows(), 0);
    assert_eq!(map.token_topk_to_pos.as_slice(), &[-1; 4]);
    assert_eq!(map.expert_end.as_slice(), &[0, 0, 0]);
}

#[test]
fn max_fused_rows_bounds_every_layout() {
    let mut rng = Rng::for_case("max_fused_rows_bounds_every_layout");
    for _ in 0..200 {
        let (t, k, e, a) = (
            rng.below(40) as usize,
            1 + rng.below(5) as usize,
            1 + rng.below(12) as usize,
            1 + rng.below(20) as usize,
        );
        let idx = HostTensor::from_fn(&[t, k], |_| rng.below(e as u64 + 1) as i64 - 1);
        let map = get_fused_mapping(&idx.view(), &GetFusedMappingParams::host_sync(e, a)).unwrap();
        let bound = max_fused_rows(t, k, e, a).unwrap();
        assert!(
            map.used_rows() <= bound,
            "{t} {k} {e} {a}: {} > {bound}",
            map.used_rows()
        );
        assert_eq!(bound % a, 0);
        let capped =
            get_fused_mapping(&idx.view(), &GetFusedMappingParams::new(e, a, bound)).unwrap();
        check_mapping("bound", &idx.view(), e, a, bound, &capped);
    }
    assert_eq!(max_fused_rows(1, 1, 1, 0), None);
    assert_eq!(max_fused_rows(usize::MAX, 2, 1, 1), None);
}

#[test]
fn strided_topk_idx_gives_the_same_mapping() {
    let idx = example();
    let (buf, layout) = padded_rows(&idx, 3, 77i64); // padding holds an illegal id: never read
    let view = HostView::new(&buf, layout).unwrap();
    let params = GetFusedMappingParams::host_sync(3, 4);
    assert_eq!(
        get_fused_mapping(&view, &params).unwrap(),
        get_fused_mapping(&idx.view(), &params).unwrap()
    );
}

#[test]
fn rejects_illegal_entries() {
    let p = GetFusedMappingParams::host_sync(3, 4);
    let e = get_fused_mapping(&mat(&[&[0i64, 1], &[-2, 0]]).view(), &p).unwrap_err();
    assert_param(e, "topk_idx", &["[1, 0]", "-2", "only legal negative"]);
    let e = get_fused_mapping(&mat(&[&[0i64, 3]]).view(), &p).unwrap_err();
    assert_param(
        e,
        "topk_idx",
        &["[0, 1]", "= 3", "out of range", "0..E = 3"],
    );
    let e = get_fused_mapping(&mat(&[&[i64::MIN, 0]]).view(), &p).unwrap_err();
    assert_param(e, "topk_idx", &["only legal negative"]);
    let e = get_fused_mapping(
        &mat(&[&[0i64, i64::MAX]]).view(),
        &GetFusedMappingParams::new(3, 4, 64),
    )
    .unwrap_err();
    assert_param(e, "topk_idx", &["out of range"]);
}

#[test]
fn rejects_bad_shapes_and_params() {
    let ok = example();
    let rank1 = HostTensor::<i64>::from_vec(vec![0, 1], &[2]).unwrap();
    assert_shape_err(
        get_fused_mapping(&rank1.view(), &GetFusedMappingParams::host_sync(3, 4)).unwrap_err(),
        "topk_idx",
    );
    let empty_k = HostTensor::<i64>::from_vec(vec![], &[3, 0]).unwrap();
    let e =
        get_fused_mapping(&empty_k.view(), &GetFusedMappingParams::host_sync(3, 4)).unwrap_err();
    assert!(
        matches!(
            e,
            TkError::Empty {
                arg: "topk_idx",
                ..
            }
        ),
        "{e:?}"
    );
    // Column-major (T, K): non-unit last stride.
    let buf: Vec<i64> = vec![0; 8];
    let cm = HostView::new(&buf, Layout::new(vec![4, 2], vec![1, 4], 0).unwrap()).unwrap();
    let e = get_fused_mapping(&cm, &GetFusedMappingParams::host_sync(3, 4)).unwrap_err();
    assert!(
        matches!(
            e,
            TkError::Stride {
                arg: "topk_idx",
                ..
            }
        ),
        "{e:?}"
    );
    for bad_e in [0, 1025] {
        let e =
            get_fused_mapping(&ok.view(), &GetFusedMappingParams::host_sync(bad_e, 4)).unwrap_err();
        assert_param(e, "num_experts", &["1024"]);
    }
    let e = get_fused_mapping(&ok.view(), &GetFusedMappingParams::host_sync(3, 0)).unwrap_err();
    assert_param(e, "alignment", &["1 <= alignment"]);
    let e = get_fused_mapping(
        &ok.view(),
        &GetFusedMappingParams::new(3, 4, i32::MAX as usize + 1),
    )
    .unwrap_err();
    assert_param(e, "num_expanded_tokens", &["int32"]);
    // T·K beyond int32 (layout-only validation).
    let huge = Layout::contiguous(&[1 << 30, 3]);
    assert_shape_err(
        GetFusedMappingParams::host_sync(3, 4)
            .validate(&huge)
            .unwrap_err(),
        "topk_idx",
    );
    assert_eq!(
        GetFusedMappingParams::new(3, 4, 9)
            .validate(&Layout::contiguous(&[4, 2]))
            .unwrap()
            .rows,
        FusedRows::Capacity(9)
    );
}

#[test]
fn moe12_invariants() {
    for p in grid() {
        let idx = topk_idx_for("get_fused_mapping", &p);
        for a in [1, 16, 64, 128] {
            let what = format!("{} a={a}", p.name());
            let map = get_fused_mapping(
                &idx.view(),
                &GetFusedMappingParams::host_sync(p.num_experts, a),
            )
            .unwrap();
            let m = map.used_rows();
            check_mapping(&what, &idx.view(), p.num_experts, a, m, &map);
            // Graph-safe with upstream's bound: the same maps, more padding rows.
            let (t, k) = (idx.shape()[0], idx.shape()[1]);
            let bound = max_fused_rows(t, k, p.num_experts, a).unwrap();
            let capped = get_fused_mapping(
                &idx.view(),
                &GetFusedMappingParams::new(p.num_experts, a, bound),
            )
            .unwrap();
            assert_eq!(
                &capped.pos_to_token_topk.as_slice()[..m],
                map.pos_to_token_topk.as_slice(),
                "{what}"
            );
            assert_eq!(capped.token_topk_to_pos, map.token_topk_to_pos, "{what}");
            assert!(
                capped.pos_to_expert.as_slice()[m..]
                    .iter()
                    .all(|&v| v == -1),
                "{what}"
            );
        }
    }
}

fn off_grid(case: &str, p: MoeParams, alignments: &[usize]) {
    let mut rng = Rng::for_case(case);
    let idx = generate_topk_idx(&mut rng, &p).unwrap();
    for &a in alignments {
        let map = get_fused_mapping(
            &idx.view(),
            &GetFusedMappingParams::host_sync(p.num_experts, a),
        )
        .unwrap();
        check_mapping(
            &format!("{case} a={a}"),
            &idx.view(),
            p.num_experts,
            a,
            map.used_rows(),
            &map,
        );
    }
}

#[test]
fn off_grid_expert_counts_and_topk() {
    let mk = |send, k, e, ep| MoeParams {
        num_send_tokens: send,
        num_topk: k,
        num_experts: e,
        num_ep_ranks: ep,
    };
    off_grid("e160 k7", mk(500, 7, 160, 1), &[1, 64, 128]);
    off_grid("e384 k1", mk(500, 1, 384, 1), &[1, 128]);
    off_grid("e384/8 k7", mk(500, 7, 48, 8), &[16, 128]);
    off_grid("e160/2 k1", mk(500, 1, 80, 2), &[1, 64]);
    off_grid("e1024 k9", mk(300, 9, 1024, 1), &[1, 32]);
    off_grid("e1 k1", mk(50, 1, 1, 1), &[1, 3]);
}

#[test]
fn zero_tokens() {
    let idx = HostTensor::<i64>::from_vec(vec![], &[0, 6]).unwrap();
    let map = get_fused_mapping(&idx.view(), &GetFusedMappingParams::host_sync(5, 64)).unwrap();
    assert_eq!(map.num_rows(), 0);
    assert_eq!(map.token_topk_to_pos.shape(), &[0, 6]);
    for v in [
        &map.expert_start,
        &map.expert_end,
        &map.num_tokens_per_expert,
    ] {
        assert_eq!(v.as_slice(), &[0; 5]);
    }
    // Graph-safe with upstream's positive estimate ((a-1)·E / a)·a = 256: all padding.
    let m = max_fused_rows(0, 6, 5, 64).unwrap();
    assert_eq!(m, 256);
    let map = get_fused_mapping(&idx.view(), &GetFusedMappingParams::new(5, 64, m)).unwrap();
    check_mapping("zero tokens", &idx.view(), 5, 64, m, &map);
    assert!(map.pos_to_expert.as_slice().iter().all(|&v| v == -1));
}

#[test]
fn all_tokens_to_one_expert_and_empty_experts() {
    let idx = HostTensor::from_fn(&[1000, 1], |_| 3i64);
    let map = get_fused_mapping(&idx.view(), &GetFusedMappingParams::host_sync(8, 128)).unwrap();
    check_mapping("one expert", &idx.view(), 8, 128, 1024, &map);
    assert_eq!(
        map.num_tokens_per_expert.as_slice(),
        &[0, 0, 0, 1024, 0, 0, 0, 0]
    );
    assert_eq!(
        map.expert_start.as_slice(),
        &[0, 0, 0, 0, 1024, 1024, 1024, 1024]
    );
    assert_eq!(
        &map.pos_to_token.as_slice()[..1000],
        &(0..1000).collect::<Vec<i32>>()[..]
    );
    // Only even experts, K = 3 with -1 slots mixed in.
    let mut rng = Rng::for_case("even experts");
    let idx = HostTensor::from_fn(&[700, 3], |_| match rng.below(6) {
        0 => -1,
        v => 2 * (v as i64 - 1),
    });
    let map = get_fused_mapping(&idx.view(), &GetFusedMappingParams::host_sync(10, 16)).unwrap();
    check_mapping("even experts", &idx.view(), 10, 16, map.used_rows(), &map);
    for ex in (1..10).step_by(2) {
        assert_eq!(map.num_tokens_per_expert.as_slice()[ex], 0);
    }
}
