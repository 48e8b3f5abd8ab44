//! `mask_indices_by_tp` (`spec/moe.md` §2, §4.8): hand-computed masks, the formula against the
//! closed form on every id of small configurations (i64 and i32), the moe12 grid (subsampled: 600
//! sent tokens) × `num_tp_ranks ∈ {2, 4, 8}` with every `tp_rank` (upstream's test draws one),
//! and rejections.
#![cfg(feature = "cpu")]

mod common;

use common::{assert_param, assert_shape_err, grid, mat, padded_rows, topk_idx_sub};
use tk_core::{HostTensor, HostView};
use tk_moe::reference::mask_indices_by_tp;
use tk_moe::MaskIndicesByTpParams;

fn params(n: usize, ep: usize, tp_rank: usize, tp: usize) -> MaskIndicesByTpParams {
    MaskIndicesByTpParams {
        num_experts: n,
        num_ep_ranks: ep,
        tp_rank,
        num_tp_ranks: tp,
    }
}

#[test]
fn hand_example() {
    // n = 16, 8 EP ranks (R = 2), 2 TP ranks: TP rank 1 owns EP ranks 1, 3, 5, 7 = ids
    // 2,3 | 6,7 | 10,11 | 14,15 -> local 0,1 | 2,3 | 4,5 | 6,7.
    let idx = mat(&[&[2i64, 3, 6, 7], &[10, 11, 14, 15], &[0, 1, 4, -1]]);
    let out = mask_indices_by_tp(&idx.view(), &params(16, 8, 1, 2)).unwrap();
    assert_eq!(out.as_slice(), &[0, 1, 2, 3, 4, 5, 6, 7, -1, -1, -1, -1]);
    let out = mask_indices_by_tp(&idx.view(), &params(16, 8, 0, 2)).unwrap();
    assert_eq!(
        out.as_slice(),
        &[-1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 2, -1]
    );
    // i32 indices, one TP rank: identity.
    let idx32 = mat(&[&[0i32, 5, -1]]);
    assert_eq!(
        mask_indices_by_tp(&idx32.view(), &params(6, 3, 0, 1))
            .unwrap()
            .as_slice(),
        &[0, 5, -1]
    );
}

#[test]
fn formula_equals_closed_form() {
    for r in 1..5usize {
        for tp in 1..5usize {
            for dp in 1..4usize {
                let ep = tp * dp;
                let n = r * ep;
                for tp_rank in 0..tp {
                    let all: Vec<i64> = (-1..n as i64).collect();
                    let idx = HostTensor::from_vec(all.clone(), &[1, all.len()]).unwrap();
                    let out = mask_indices_by_tp(&idx.view(), &params(n, ep, tp_rank, tp)).unwrap();
                    let idx32 = HostTensor::from_vec(
                        all.iter().map(|&v| v as i32).collect(),
                        &[1, all.len()],
                    )
                    .unwrap();
                    let out32 =
                        mask_indices_by_tp(&idx32.view(), &params(n, ep, tp_rank, tp)).unwrap();
                    for (j, &id) in all.iter().enumerate() {
                        let want = if id < 0 {
                            -1
                        } else {
                            let owner = id as usize / r;
                            if owner % tp == tp_rank {
                                ((owner / tp) * r + id as usize % r) as i64
                            } else {
                                -1
                            }
                        };
                        assert_eq!(
                            out.as_slice()[j],
                            want,
                            "r={r} tp={tp} ep={ep} rank={tp_rank} id={id}"
                        );
                        assert_eq!(out32.as_slice()[j] as i64, want);
                    }
                }
            }
        }
    }
}

#[test]
fn rejections() {
    let idx = mat(&[&[0i64, 1]]);
    assert_param(
        mask_indices_by_tp(&mat(&[&[0i64, -2]]).view(), &params(16, 8, 0, 2)).unwrap_err(),
        "indices",
        &["-2", "only legal negative"],
    );
    assert_param(
        mask_indices_by_tp(&mat(&[&[0i64, 16]]).view(), &params(16, 8, 0, 2)).unwrap_err(),
        "indices",
        &["= 16", "out of range"],
    );
    assert_param(
        mask_indices_by_tp(&idx.view(), &params(16, 0, 0, 2)).unwrap_err(),
        "num_ep_ranks",
        &[">= 1"],
    );
    assert_param(
        mask_indices_by_tp(&idx.view(), &params(16, 8, 0, 0)).unwrap_err(),
        "num_tp_ranks",
        &[">= 1"],
    );
    assert_param(
        mask_indices_by_tp(&idx.view(), &params(16, 8, 2, 2)).unwrap_err(),
        "tp_rank",
        &["< num_tp_ranks"],
    );
    assert_param(
        mask_indices_by_tp(&idx.view(), &params(4, 8, 0, 2)).unwrap_err(),
        "num_experts",
        &["at least one expert"],
    );
    let v = HostTensor::<i64>::from_vec(vec![0], &[1]).unwrap();
    assert_shape_err(
        mask_indices_by_tp(&v.view(), &params(16, 8, 0, 2)).unwrap_err(),
        "indices",
    );
}

#[test]
fn moe12_grid_every_tp_rank() {
    for p in grid() {
        let idx = topk_idx_sub("mask_indices_by_tp", &p, usize::MAX);
        let n = p.global_experts();
        let (buf, layout) = padded_rows(&idx, 1, -7);
        let strided = HostView::new(&buf, layout).unwrap();
        for tp in [2usize, 4, 8] {
            for tp_rank in 0..tp {
                let prm = params(n, p.num_ep_ranks, tp_rank, tp);
                let out = mask_indices_by_tp(&idx.view(), &prm).unwrap();
                // The generated ids are local (< R): rank 0 keeps them unchanged, others get -1.
                let want: Vec<i64> = idx
                    .as_slice()
                    .iter()
                    .map(|&v| if tp_rank == 0 { v } else { -1 })
                    .collect();
                assert_eq!(
                    out.as_slice(),
                    &want[..],
                    "{} tp={tp} rank={tp_rank}",
                    p.name()
                );
                assert_eq!(mask_indices_by_tp(&strided, &prm).unwrap(), out);
            }
        }
    }
}
