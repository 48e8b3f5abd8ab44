//! `group_count` (`spec/moe.md` §4.7): hand-computed histograms (duplicates count twice, `-1`
//! skipped), the moe12 grid (subsampled: 600 sent tokens) against a naive count, strided input,
//! and every rejection.
#![cfg(feature = "cpu")]

mod common;

use common::{assert_param, assert_shape_err, grid, mat, padded_rows, topk_idx_sub};
use tk_core::{HostTensor, HostView, Layout};
use tk_moe::reference::group_count;
use tk_moe::GroupCountParams;

#[test]
fn hand_example() {
    let idx = mat(&[&[0i64, 2, 2], &[-1, 1, 0], &[-1, -1, -1]]);
    let c = group_count(&idx.view(), &GroupCountParams::new(4)).unwrap();
    assert_eq!(c.shape(), &[4]);
    assert_eq!(c.as_slice(), &[2, 1, 2, 0]);
    let empty = HostTensor::<i64>::from_vec(vec![], &[0, 3]).unwrap();
    assert_eq!(
        group_count(&empty.view(), &GroupCountParams::new(3))
            .unwrap()
            .as_slice(),
        &[0, 0, 0]
    );
}

#[test]
fn rejections() {
    let p = GroupCountParams::new(4);
    let e = group_count(&mat(&[&[0i64, -3]]).view(), &p).unwrap_err();
    assert_param(e, "group_idx", &["[0, 1]", "-3", "only legal negative"]);
    let e = group_count(&mat(&[&[0i64, 4]]).view(), &p).unwrap_err();
    assert_param(e, "group_idx", &["= 4", "out of range", "0..G = 4"]);
    let e = group_count(&mat(&[&[0i64]]).view(), &GroupCountParams::new(0)).unwrap_err();
    assert_param(e, "num_groups", &[">= 1"]);
    let v = HostTensor::<i64>::from_vec(vec![0], &[1]).unwrap();
    assert_shape_err(group_count(&v.view(), &p).unwrap_err(), "group_idx");
    assert_shape_err(
        p.validate(&Layout::contiguous(&[1 << 31, 1])).unwrap_err(),
        "group_idx",
    );
}

#[test]
fn moe12_grid_and_strided() {
    for p in grid() {
        let idx = topk_idx_sub("group_count", &p, usize::MAX);
        let params = GroupCountParams::new(p.num_experts);
        let c = group_count(&idx.view(), &params).unwrap();
        let naive: Vec<i32> = (0..p.num_experts as i64)
            .map(|g| idx.as_slice().iter().filter(|&&v| v == g).count() as i32)
            .collect();
        assert_eq!(c.as_slice(), &naive[..], "{}", p.name());
        let (buf, layout) = padded_rows(&idx, 2, -5);
        assert_eq!(
            group_count(&HostView::new(&buf, layout).unwrap(), &params).unwrap(),
            c
        );
    }
}
