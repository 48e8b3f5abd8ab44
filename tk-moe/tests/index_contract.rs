//! The index contract (`tk_moe::index`, `spec/moe.md` §5.11): legality, the CPU error's content,
//! the GPU reading (`sanitize_indices`), and that every op given sanitized indices accepts them.
#![cfg(feature = "cpu")]

mod common;

use common::{assert_param, mat};
use tk_core::{HostView, Layout};
use tk_moe::index::{check_indices, is_legal, sanitize_indices};
use tk_moe::reference::{aux_fi, get_fused_mapping, group_count};
use tk_moe::{AuxFiParams, GetFusedMappingParams, GroupCountParams};

#[test]
fn legality() {
    assert!(is_legal(-1, 0));
    assert!(is_legal(0, 1) && is_legal(8, 9));
    assert!(!is_legal(9, 9) && !is_legal(-2, 9) && !is_legal(i64::MIN, 9) && !is_legal(0, 0));
}

#[test]
fn check_reports_the_first_illegal_entry_in_row_major_order() {
    let m = mat(&[&[0i64, 1, 2], &[3, -5, 9]]);
    let e = check_indices("topk_idx", &m.view(), 4, "an expert id in 0..4").unwrap_err();
    assert_param(
        e,
        "topk_idx",
        &["[1, 1]", "-5", "0..4", "only legal negative"],
    );
    // Transposed view: the logical order decides which entry is first.
    let buf = [0i64, 7, -1, 2];
    let t = HostView::new(&buf, Layout::new(vec![2, 2], vec![1, 2], 0).unwrap()).unwrap();
    let e = check_indices("x", &t, 4, "in 0..4").unwrap_err();
    assert_param(e, "x", &["[1, 0]", "= 7", "out of range"]);
    assert!(check_indices("x", &mat(&[&[-1i32, 3]]).view(), 4, "").is_ok());
}

#[test]
fn sanitize_maps_illegal_entries_to_minus_one() {
    let m = mat(&[&[0i64, -2, 4], &[3, -1, i64::MAX]]);
    let s = sanitize_indices(&m.view(), 4);
    assert_eq!(s.as_slice(), &[0, -1, -1, 3, -1, -1]);
    let m32 = mat(&[&[i32::MIN, 1]]);
    assert_eq!(sanitize_indices(&m32.view(), 1).as_slice(), &[-1, -1]);
    // The sanitized tensor is legal for every op.
    assert!(get_fused_mapping(&s.view(), &GetFusedMappingParams::host_sync(4, 8)).is_ok());
    assert_eq!(
        group_count(&s.view(), &GroupCountParams::new(4))
            .unwrap()
            .as_slice(),
        &[1, 0, 0, 1]
    );
    assert!(aux_fi(&s.view(), &AuxFiParams::new(4, 1)).is_ok());
    assert!(group_count(&m.view(), &GroupCountParams::new(4)).is_err());
}
