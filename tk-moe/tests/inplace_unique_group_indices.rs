//! `inplace_unique_group_indices` (`spec/moe.md` §4.9, §5.12): hand-computed rows (leftmost
//! kept, `-1` untouched), ids up to 127, the moe12 grid (subsampled: 600 sent tokens) × `G ∈ {8,
//! 16, 72}` against a naive dedupe, and rejections that leave the tensor untouched.
#![cfg(feature = "cpu")]

mod common;

use common::{assert_param, grid, mat, topk_idx_sub};
use tk_core::HostTensor;
use tk_moe::reference::inplace_unique_group_indices;
use tk_moe::InplaceUniqueGroupIndicesParams;

#[test]
fn hand_example() {
    let mut g = mat(&[
        &[3i64, 1, 3, -1, 1, 3],
        &[-1, -1, 0, 0, 127, 127],
        &[5, 4, 3, 2, 1, 0],
    ]);
    let n =
        inplace_unique_group_indices(&mut g, &InplaceUniqueGroupIndicesParams::new(128)).unwrap();
    assert_eq!(
        g.as_slice(),
        &[3, 1, -1, -1, -1, -1, -1, -1, 0, -1, 127, -1, 5, 4, 3, 2, 1, 0]
    );
    assert_eq!(n, 5);
    let mut empty = HostTensor::<i64>::from_vec(vec![], &[0, 4]).unwrap();
    assert_eq!(
        inplace_unique_group_indices(&mut empty, &InplaceUniqueGroupIndicesParams::new(8)).unwrap(),
        0
    );
    let mut k0 = HostTensor::<i64>::from_vec(vec![], &[3, 0]).unwrap();
    assert_eq!(
        inplace_unique_group_indices(&mut k0, &InplaceUniqueGroupIndicesParams::new(8)).unwrap(),
        0
    );
}

#[test]
fn rejections_leave_the_tensor_untouched() {
    let orig = mat(&[&[1i64, 1], &[-2, -2]]);
    let mut g = orig.clone();
    let e =
        inplace_unique_group_indices(&mut g, &InplaceUniqueGroupIndicesParams::new(8)).unwrap_err();
    assert_param(e, "group_indices", &["[1, 0]", "-2", "only legal negative"]);
    assert_eq!(g, orig);
    let mut g = mat(&[&[1i64, 1], &[8, 0]]);
    let e =
        inplace_unique_group_indices(&mut g, &InplaceUniqueGroupIndicesParams::new(8)).unwrap_err();
    assert_param(e, "group_indices", &["= 8", "out of range"]);
    assert_eq!(g.as_slice(), &[1, 1, 8, 0]);
    for bad in [0, 129] {
        let e = inplace_unique_group_indices(&mut g, &InplaceUniqueGroupIndicesParams::new(bad))
            .unwrap_err();
        assert_param(e, "num_groups", &["128"]);
    }
}

#[test]
fn moe12_grid() {
    for p in grid() {
        let global = p.global_experts();
        let idx = topk_idx_sub("inplace_unique_group_indices", &p, usize::MAX);
        for g in [8usize, 16, 72] {
            if global % g != 0 {
                continue;
            }
            // Floor division keeps -1 as -1 (the spec's data).
            let per = (global / g) as i64;
            let groups: Vec<i64> = idx.as_slice().iter().map(|&v| v.div_euclid(per)).collect();
            let mut t = HostTensor::from_vec(groups.clone(), idx.shape()).unwrap();
            let n = inplace_unique_group_indices(&mut t, &InplaceUniqueGroupIndicesParams::new(g))
                .unwrap();
            let mut naive = groups.clone();
            for row in naive.chunks_mut(p.num_topk) {
                for j in 0..row.len() {
                    if row[j] >= 0 && row[..j].contains(&row[j]) {
                        row[j] = -1;
                    }
                }
            }
            assert_eq!(t.as_slice(), &naive[..], "{} G={g}", p.name());
            let changed = groups.iter().zip(&naive).filter(|(a, b)| a != b).count();
            assert_eq!(n, changed);
        }
    }
}
