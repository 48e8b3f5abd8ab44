//! `expand_to_fused` and `expand_to_fused_with_sf` (`spec/moe.md` §4.12, §4.13, §5.14, §5.17):
//! hand-computed examples, zero-filled rows (padding, untargeted, `T == 0`), both scale layouts
//! (fp32 row-major, packed UE8M0 column-major with its padded stride, FP4 data), every
//! rejection, and the moe12 grid (subsampled: 600 sent tokens instead of 4001 and the first 512 / 256
//! rows of each `topk_idx`, two hidden sizes) against an independent gather through `pos_to_token`.
#![cfg(feature = "cpu")]

mod common;

use common::{assert_param, assert_shape_err, grid, mat, topk_idx_sub, vec1};
use float8::F8E4M3;
use half::bf16;
use tk_core::dtype::{E2M1x2, E5M6Bytes, Ue8m0x4};
use tk_core::testing::{assert_bits_eq, Rng};
use tk_core::{Element, HostTensor, HostView, Layout, TkError};
use tk_moe::reference::{expand_to_fused, expand_to_fused_with_sf, get_fused_mapping};
use tk_moe::{ExpandToFusedWithSfParams, GetFusedMappingParams};

/// The mapping of the crate docs' example: 3 tokens, K = 2, 2 experts, alignment 2.
fn example_map() -> (HostTensor<i32>, HostTensor<i32>) {
    (
        mat(&[&[2, 0], &[1, 3], &[4, -1]]),
        vec1(&[0, 0, 1, 1, 1, -1]),
    )
}

#[test]
fn hand_example() {
    let (ttp, pte) = example_map();
    let x = mat(&[&[1.0f32, -1.0], &[2.0, -2.0], &[3.0, -3.0]]);
    let out = expand_to_fused(&x.view(), &ttp.view(), &pte.view()).unwrap();
    assert_eq!(out.shape(), &[6, 2]);
    assert_eq!(
        out.as_slice(),
        &[1.0, -1.0, 2.0, -2.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.0, 0.0]
    );
    // The zero rows are +0.0 (all-zero bits), whatever dtype.
    assert_eq!(out.as_slice()[10].to_bits(), 0);
}

#[test]
fn bit_copies_of_nan_and_negative_zero() {
    let (ttp, pte) = example_map();
    let x = HostTensor::from_vec(
        vec![
            f32::from_bits(0x7fc0_1234),
            -0.0,
            f32::from_bits(0xffff_ffff),
            1.0,
            f32::INFINITY,
            f32::MIN_POSITIVE / 4.0,
        ],
        &[3, 2],
    )
    .unwrap();
    let out = expand_to_fused(&x.view(), &ttp.view(), &pte.view()).unwrap();
    let rows: Vec<u32> = out.as_slice().iter().map(|v| v.to_bits()).collect();
    let xb: Vec<u32> = x.as_slice().iter().map(|v| v.to_bits()).collect();
    assert_eq!(&rows[0..2], &xb[0..2]);
    assert_eq!(&rows[4..6], &xb[0..2]);
    assert_eq!(&rows[8..10], &xb[4..6]);
    assert_eq!(&rows[10..12], &[0, 0]);
}

#[test]
fn untargeted_rows_and_zero_tokens_are_zero() {
    // Row 3 claims expert 1 but no slot targets it: zero here (upstream: uninitialised).
    let ttp = mat(&[&[0i32, 2]]);
    let pte = vec1(&[0, 0, 1, 1]);
    let x = mat(&[&[bf16::from_f32(5.0)]]);
    let out = expand_to_fused(&x.view(), &ttp.view(), &pte.view()).unwrap();
    assert_eq!(
        out.as_slice(),
        &[
            bf16::from_f32(5.0),
            bf16::ZERO,
            bf16::from_f32(5.0),
            bf16::ZERO
        ]
    );
    // T == 0 with M > 0: every row zero (upstream does not launch: uninitialised).
    let ttp0 = HostTensor::<i32>::from_vec(vec![], &[0, 4]).unwrap();
    let x0 = HostTensor::<bf16>::from_vec(vec![], &[0, 3]).unwrap();
    let out = expand_to_fused(&x0.view(), &ttp0.view(), &vec1(&[-1, -1, 0]).view()).unwrap();
    assert_eq!(out.shape(), &[3, 3]);
    assert!(out.as_slice().iter().all(|v| v.to_bits() == 0));
    // M == 0.
    let out = expand_to_fused(&x0.view(), &ttp0.view(), &vec1::<i32>(&[]).view()).unwrap();
    assert_eq!(out.shape(), &[0, 3]);
}

#[test]
fn rejects_bad_positions() {
    let x = mat(&[&[1.0f32], &[2.0]]);
    let pte = vec1(&[0, 0, 1, -1]);
    let run =
        |ttp: HostTensor<i32>| expand_to_fused(&x.view(), &ttp.view(), &pte.view()).unwrap_err();
    assert_param(
        run(mat(&[&[0, -2], &[1, 2]])),
        "token_topk_to_pos",
        &["[0, 1]", "-2", "only legal negative"],
    );
    assert_param(
        run(mat(&[&[0, 4], &[1, 2]])),
        "token_topk_to_pos",
        &["= 4", "out of range", "0..M = 4"],
    );
    assert_param(
        run(mat(&[&[0, 1], &[2, 1]])),
        "token_topk_to_pos",
        &["[0, 1]", "[1, 1]", "collide"],
    );
    assert_param(
        run(mat(&[&[0, 1], &[3, -1]])),
        "token_topk_to_pos",
        &["[1, 0]", "padding row", "3"],
    );
}

#[test]
fn rejects_bad_shapes() {
    let x = mat(&[&[1.0f32], &[2.0]]);
    let ttp = mat(&[&[0i32, 1], &[2, -1]]);
    let pte = vec1(&[0, 0, 1, -1]);
    let ttp3 = mat(&[&[0i32, 1], &[2, -1], &[-1, -1]]);
    assert_shape_err(
        expand_to_fused(&x.view(), &ttp3.view(), &pte.view()).unwrap_err(),
        "token_topk_to_pos",
    );
    let x1 = vec1(&[1.0f32, 2.0]);
    assert_shape_err(
        expand_to_fused(&x1.view(), &ttp.view(), &pte.view()).unwrap_err(),
        "x",
    );
    let pte2 = mat(&[&[0i32, 0], &[1, -1]]);
    assert_shape_err(
        expand_to_fused(&x.view(), &ttp.view(), &pte2.view()).unwrap_err(),
        "pos_to_expert",
    );
    let k0 = HostTensor::<i32>::from_vec(vec![], &[2, 0]).unwrap();
    let e = expand_to_fused(&x.view(), &k0.view(), &pte.view()).unwrap_err();
    assert!(
        matches!(
            e,
            TkError::Empty {
                arg: "token_topk_to_pos",
                ..
            }
        ),
        "{e:?}"
    );
    let buf = [1.0f32, 2.0, 3.0, 4.0];
    let xt = HostView::new(&buf, Layout::new(vec![2, 2], vec![1, 2], 0).unwrap()).unwrap();
    let e = expand_to_fused(&xt, &ttp.view(), &pte.view()).unwrap_err();
    assert!(matches!(e, TkError::Stride { arg: "x", .. }), "{e:?}");
}

/// The independent gather: row `p` is `x[pos_to_token[p]]` or zero.
fn gather<T: Element>(x: &HostTensor<T>, pos_to_token: &[i32]) -> Vec<T> {
    let c = x.shape()[1];
    let mut out = Vec::new();
    for &t in pos_to_token {
        if t < 0 {
            out.extend(std::iter::repeat_n(T::from_bits_u64(0), c));
        } else {
            out.extend_from_slice(&x.as_slice()[t as usize * c..(t as usize + 1) * c]);
        }
    }
    out
}

#[test]
fn moe12_grid_subsampled() {
    for p in grid() {
        let idx = topk_idx_sub("expand_to_fused", &p, 512);
        let t = idx.shape()[0];
        let map = get_fused_mapping(
            &idx.view(),
            &GetFusedMappingParams::host_sync(p.num_experts, 16),
        )
        .unwrap();
        for h in [576, 2048] {
            let mut rng = Rng::for_case(&format!("expand {} {h}", p.name()));
            let x = rng.random_bits::<bf16>(&[t, h]);
            let out = expand_to_fused(
                &x.view(),
                &map.token_topk_to_pos.view(),
                &map.pos_to_expert.view(),
            )
            .unwrap();
            assert_eq!(out.shape(), &[map.num_rows(), h]);
            assert_bits_eq(
                &format!("{} h={h}", p.name()),
                out.as_slice(),
                &gather(&x, map.pos_to_token.as_slice()),
            );
        }
    }
}

// ----- with scale factors --------------------------------------------------------------------

#[test]
fn with_sf_row_major_fp32() {
    let (ttp, pte) = example_map();
    // H = 64 FP8 values per row, npc = 32: Hs = 2.
    let mut rng = Rng::for_case("with_sf_row_major_fp32");
    let data = rng.random_bits::<F8E4M3>(&[3, 64]);
    let sf = mat(&[&[1.0f32, 2.0], &[3.0, 4.0], &[5.0, 6.0]]);
    let params = ExpandToFusedWithSfParams::new(32, false);
    let r = expand_to_fused_with_sf(&data.view(), &sf.view(), &ttp.view(), &pte.view(), &params)
        .unwrap();
    assert_eq!(r.out.shape(), &[6, 64]);
    assert_eq!(r.out_sf_layout, Layout::contiguous(&[6, 2]));
    assert_eq!(
        r.out_sf_storage.as_slice(),
        &[1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0]
    );
    let plain = expand_to_fused(&data.view(), &ttp.view(), &pte.view()).unwrap();
    assert_bits_eq("data", r.out.as_slice(), plain.as_slice());
}

#[test]
fn with_sf_col_major_fp32_and_packed() {
    let (ttp, pte) = example_map(); // M = 6: align(M, 4) = 8
    let data = mat(&[
        &[F8E4M3::from_f32(1.0); 256],
        &[F8E4M3::from_f32(2.0); 256],
        &[F8E4M3::from_f32(3.0); 256],
    ]);
    // fp32, npc = 128: Hs = 2, column-major storage (2, 8), strides (1, 8).
    let sf = mat(&[&[1.0f32, 2.0], &[3.0, 4.0], &[5.0, 6.0]]);
    let params = ExpandToFusedWithSfParams::new(128, true);
    let r = expand_to_fused_with_sf(&data.view(), &sf.view(), &ttp.view(), &pte.view(), &params)
        .unwrap();
    assert_eq!(r.out_sf_layout.strides(), &[1, 8]);
    assert_eq!(r.out_sf_layout.shape(), &[6, 2]);
    assert_eq!(
        r.out_sf_storage.as_slice(),
        &[1.0, 3.0, 1.0, 3.0, 5.0, 0.0, 0.0, 0.0, 2.0, 4.0, 2.0, 4.0, 6.0, 0.0, 0.0, 0.0]
    );
    assert_eq!(
        r.out_sf().to_contiguous_vec(),
        vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0]
    );
    // Packed UE8M0 words (i32 and Ue8m0x4 alike), npc = 32: ceil(ceil(256/32)/4) = 2 words.
    let words = mat(&[
        &[0x7f7f_7f7fi32, 0x0102_0304],
        &[-1, 5],
        &[0x1234_5678, i32::MIN],
    ]);
    let r = expand_to_fused_with_sf(
        &data.view(),
        &words.view(),
        &ttp.view(),
        &pte.view(),
        &ExpandToFusedWithSfParams::new(32, true),
    )
    .unwrap();
    assert_eq!(
        r.out_sf_storage.as_slice(),
        &[
            0x7f7f_7f7f,
            -1,
            0x7f7f_7f7f,
            -1,
            0x1234_5678,
            0,
            0,
            0,
            0x0102_0304,
            5,
            0x0102_0304,
            5,
            i32::MIN,
            0,
            0,
            0
        ]
    );
    let typed = HostTensor::from_fn(&[3, 2], |i| Ue8m0x4(words.as_slice()[i]));
    let r2 = expand_to_fused_with_sf(
        &data.view(),
        &typed.view(),
        &ttp.view(),
        &pte.view(),
        &ExpandToFusedWithSfParams::new(32, true),
    )
    .unwrap();
    let as_i32: Vec<i32> = r2.out_sf_storage.as_slice().iter().map(|w| w.0).collect();
    assert_eq!(as_i32, r.out_sf_storage.as_slice());
}

#[test]
fn with_sf_fp4_data_and_empty() {
    // FP4: 128 logical values = 64 bytes per row; npc = 32 gives Hs = 4 fp32 scales.
    let ttp = mat(&[&[1i32], &[0]]);
    let pte = vec1(&[0, 0, -1]);
    let data = HostTensor::from_fn(&[2, 64], |i| E2M1x2(i as u8));
    let sf = HostTensor::from_fn(&[2, 4], |i| i as f32);
    let r = expand_to_fused_with_sf(
        &data.view(),
        &sf.view(),
        &ttp.view(),
        &pte.view(),
        &ExpandToFusedWithSfParams::new(32, false),
    )
    .unwrap();
    assert_eq!(r.out.shape(), &[3, 64]);
    assert_eq!(&r.out.as_slice()[..64], &data.as_slice()[64..]);
    assert_eq!(
        r.out_sf_storage.as_slice(),
        &[4.0, 5.0, 6.0, 7.0, 0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0]
    );
    // Wrong Hs for FP4 (the byte count would give 2).
    let sf2 = HostTensor::from_fn(&[2, 2], |i| i as f32);
    let e = expand_to_fused_with_sf(
        &data.view(),
        &sf2.view(),
        &ttp.view(),
        &pte.view(),
        &ExpandToFusedWithSfParams::new(32, false),
    )
    .unwrap_err();
    assert_shape_err(e, "sf");
    // T == 0, M = 5, column-major: zero storage of 2 columns of align(5, 4) = 8.
    let ttp0 = HostTensor::<i32>::from_vec(vec![], &[0, 2]).unwrap();
    let d0 = HostTensor::<F8E4M3>::from_vec(vec![], &[0, 256]).unwrap();
    let s0 = HostTensor::<f32>::from_vec(vec![], &[0, 2]).unwrap();
    let r = expand_to_fused_with_sf(
        &d0.view(),
        &s0.view(),
        &ttp0.view(),
        &vec1(&[-1; 5]).view(),
        &ExpandToFusedWithSfParams::new(128, true),
    )
    .unwrap();
    assert_eq!(r.out.as_slice().len(), 5 * 256);
    assert!(r.out.as_slice().iter().all(|v| v.to_bits() == 0));
    assert_eq!(r.out_sf_storage.as_slice(), &[0.0; 16]);
    assert_eq!(r.out_sf_layout.strides(), &[1, 8]);
}

#[test]
fn with_sf_rejections() {
    let (ttp, pte) = example_map();
    let data = HostTensor::from_fn(&[3, 64], |_| F8E4M3::from_f32(1.0));
    let sf = HostTensor::from_fn(&[3, 2], |_| 1.0f32);
    let run = |p: ExpandToFusedWithSfParams| {
        expand_to_fused_with_sf(&data.view(), &sf.view(), &ttp.view(), &pte.view(), &p).unwrap_err()
    };
    assert_param(
        run(ExpandToFusedWithSfParams::new(64, false)),
        "num_per_channels",
        &["32 or 128"],
    );
    assert_shape_err(run(ExpandToFusedWithSfParams::new(128, false)), "sf"); // Hs would be 1
    let words = HostTensor::from_fn(&[3, 1], |_| 0i32);
    let e = expand_to_fused_with_sf(
        &data.view(),
        &words.view(),
        &ttp.view(),
        &pte.view(),
        &ExpandToFusedWithSfParams::new(32, false),
    )
    .unwrap_err();
    assert_param(e, "use_tma_aligned_col_major_sf", &["column-major"]);
    let bad_data = HostTensor::from_fn(&[3, 48], |_| E5M6Bytes(0));
    let e = expand_to_fused_with_sf(
        &bad_data.view(),
        &sf.view(),
        &ttp.view(),
        &pte.view(),
        &ExpandToFusedWithSfParams::new(32, false),
    )
    .unwrap_err();
    assert!(matches!(e, TkError::Dtype { arg: "data", .. }), "{e:?}");
    let sf_t = HostTensor::from_fn(&[2, 2], |_| 1.0f32);
    let e = expand_to_fused_with_sf(
        &data.view(),
        &sf_t.view(),
        &ttp.view(),
        &pte.view(),
        &ExpandToFusedWithSfParams::new(32, false),
    )
    .unwrap_err();
    assert_shape_err(e, "sf");
    let bad_ttp = mat(&[&[2i32, 0], &[1, 3], &[4, 6]]);
    let e = expand_to_fused_with_sf(
        &data.view(),
        &sf.view(),
        &bad_ttp.view(),
        &pte.view(),
        &ExpandToFusedWithSfParams::new(32, false),
    )
    .unwrap_err();
    assert_param(e, "token_topk_to_pos", &["out of range"]);
}

#[test]
fn with_sf_moe12_grid_subsampled() {
    for p in grid() {
        let idx = topk_idx_sub("expand_to_fused_with_sf", &p, 256);
        let t = idx.shape()[0];
        let map = get_fused_mapping(
            &idx.view(),
            &GetFusedMappingParams::host_sync(p.num_experts, 16),
        )
        .unwrap();
        let m = map.num_rows();
        let mut rng = Rng::for_case(&format!("with_sf {}", p.name()));
        let h = 576;
        let data = rng.random_bits::<F8E4M3>(&[t, h]);
        for npc in [32, 128] {
            // fp32 row-major, and packed column-major.
            let hs = h.div_ceil(npc);
            let sf = HostTensor::from_fn(&[t, hs], |i| i as f32 + 0.5);
            let r = expand_to_fused_with_sf(
                &data.view(),
                &sf.view(),
                &map.token_topk_to_pos.view(),
                &map.pos_to_expert.view(),
                &ExpandToFusedWithSfParams::new(npc, false),
            )
            .unwrap();
            assert_bits_eq(
                "data",
                r.out.as_slice(),
                &gather(&data, map.pos_to_token.as_slice()),
            );
            assert_bits_eq(
                "sf",
                r.out_sf_storage.as_slice(),
                &gather(&sf, map.pos_to_token.as_slice()),
            );
            let hw = hs.div_ceil(4);
            let words = rng.random_bits::<Ue8m0x4>(&[t, hw]);
            let r = expand_to_fused_with_sf(
                &data.view(),
                &words.view(),
                &map.token_topk_to_pos.view(),
                &map.pos_to_expert.view(),
                &ExpandToFusedWithSfParams::new(npc, true),
            )
            .unwrap();
            assert_eq!(r.out_sf_layout.strides(), &[1, m.div_ceil(4) * 4]);
            assert_bits_eq(
                "packed sf",
                &r.out_sf().to_contiguous_vec(),
                &gather(&words, map.pos_to_token.as_slice()),
            );
            // Storage padding columns M..align(M, 4) are zero.
            for j in 0..hw {
                let col = &r.out_sf_storage.as_slice()
                    [j * m.div_ceil(4) * 4..(j + 1) * m.div_ceil(4) * 4];
                assert!(col[m..].iter().all(|w| w.0 == 0));
            }
        }
    }
}
