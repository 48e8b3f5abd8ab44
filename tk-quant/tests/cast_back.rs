//! The cast back ops (`spec/quant.md` §3.8, §3.9, §5): every precondition's rejection,
//! hand-computed examples (UE8M0 decoding, bf16 rounding), upstream's round-trip assertions,
//! and agreement with the generic references.
#![cfg(feature = "cpu")]

mod common;
mod op_common;

use common::calc_diff_f32;
use half::bf16;
use op_common::{all_configs, assert_err, bits, e4m3_data, rounded_configs, widen};
use tk_core::dtype::{E2M1x2, E5M6Bytes, Ue8m0x4};
use tk_core::testing::Rng;
use tk_core::{HostTensor, HostView, Layout};
use tk_quant::cast_back::{validate, validate_dims, validate_e5m6};
use tk_quant::reference::{
    cast, cast_back, cast_back_e5m6, cast_back_from_e5m6, cast_back_op, per_token_cast,
    per_token_cast_back, per_token_cast_back_e5m6, per_token_cast_to_e5m6,
};
use tk_quant::{
    CastFormat, HostScales, PerTokenCastParams, PerTokenE5M6Params, QuantDataView, QuantInput,
    ScaleGrid, ScaleLayout, ScaleOptions, ScaleView,
};

#[test]
fn validate_returns_the_plan() {
    let x = Rng::new(1).randn(&[37, 128], |v| v);
    for opts in all_configs() {
        let (q, sf) = cast(&x.view().into(), CastFormat::E2M1, (32, 32), opts).unwrap();
        let p = validate(&QuantInput::new(q.view(), sf.view(), (32, 32))).unwrap();
        assert_eq!((p.m, p.k, p.block), (37, 128, (32, 32)));
        assert_eq!(p.grid, ScaleGrid::new(2, 4).unwrap());
        assert_eq!(p.sf_layout, opts.layout().unwrap());
    }
    let p = validate_dims(0, 64, (1, 64), ScaleLayout::PackedUe8m0).unwrap();
    assert_eq!((p.grid.nbm(), p.grid.nbk()), (0, 1));
}

#[test]
fn rejections_name_the_argument() {
    // Logical K % 64: e4m3 (K = 96) and e2m1 (K = 96, 48 bytes; K = 32, 16 bytes).
    let x96 = Rng::new(2).randn(&[4, 96], |v| v);
    let x32 = Rng::new(3).randn(&[4, 32], |v| v);
    for (x, fmt) in [
        (&x96, CastFormat::E4M3),
        (&x96, CastFormat::E2M1),
        (&x32, CastFormat::E2M1),
    ] {
        let (q, sf) = cast(&x.view().into(), fmt, (1, 32), ScaleOptions::default()).unwrap();
        let qi = QuantInput::new(q.view(), sf.view(), (1, 32));
        assert!(cast_back::<f32>(&qi).is_ok()); // the generic reference takes any K
        assert_err(cast_back_op::<f32>(&qi).unwrap_err(), "Shape", "x");
        assert_err(
            per_token_cast_back::<bf16>(q.view(), sf.view(), 32).unwrap_err(),
            "Shape",
            "x",
        );
    }
    // Block 0, scales of the wrong grid, K = 0, column-strided data.
    let x = Rng::new(4).randn(&[4, 64], |v| v);
    let (q, sf) = cast(
        &x.view().into(),
        CastFormat::E4M3,
        (1, 32),
        ScaleOptions::packed_ue8m0(),
    )
    .unwrap();
    assert_err(
        per_token_cast_back::<f32>(q.view(), sf.view(), 0).unwrap_err(),
        "Param",
        "x_block_size",
    );
    assert_err(
        cast_back_op::<f32>(&QuantInput::new(q.view(), sf.view(), (2, 32))).unwrap_err(),
        "Shape",
        "x.sf",
    );
    let k0 = e4m3_data(2, 0, &[]);
    let sf0 = HostScales::zeros(ScaleLayout::RowMajorF32, ScaleGrid::new(2, 0).unwrap());
    let e = cast_back_op::<f32>(&QuantInput::new(
        QuantDataView::E4M3(k0.view()),
        sf0.view(),
        (1, 32),
    ))
    .unwrap_err();
    assert_err(e, "Empty", "x");
    let d = e4m3_data(2, 128, &[0x38; 256]);
    let strided = d
        .view()
        .with_layout(Layout::new(vec![2, 64], vec![128, 2], 0).unwrap())
        .unwrap();
    let sf2 = HostScales::zeros(ScaleLayout::RowMajorF32, ScaleGrid::new(2, 1).unwrap());
    let e = cast_back_op::<f32>(&QuantInput::new(
        QuantDataView::E4M3(strided),
        sf2.view(),
        (1, 64),
    ))
    .unwrap_err();
    assert_err(e, "Stride", "x");
    // E5M6: byte columns a multiple of 12 (K % 8), non-empty, block, scales.
    let sf1 = HostScales::zeros(ScaleLayout::RowMajorF32, ScaleGrid::new(2, 1).unwrap());
    let bytes18 = HostTensor::from_vec(vec![E5M6Bytes(0); 36], &[2, 18]).unwrap();
    let e = cast_back_e5m6::<f32>(&bytes18.view(), &sf1.view(), (1, 12)).unwrap_err();
    assert_err(e, "Shape", "x");
    let bytes0 = HostTensor::<E5M6Bytes>::from_vec(vec![], &[2, 0]).unwrap();
    let e = cast_back_e5m6::<f32>(&bytes0.view(), &sf1.view(), (1, 8)).unwrap_err();
    assert_err(e, "Empty", "x");
    let bytes12 = HostTensor::from_vec(vec![E5M6Bytes(0); 24], &[2, 12]).unwrap();
    let e = per_token_cast_back_e5m6::<f32>(&bytes12.view(), &sf1.view(), 0).unwrap_err();
    assert_err(e, "Param", "x_block_size");
    let e = cast_back_e5m6::<f32>(&bytes12.view(), &sf1.view(), (1, 4)).unwrap_err();
    assert_err(e, "Shape", "x.sf");
    assert!(validate_e5m6(&bytes12.view(), &sf1.view(), (1, 8)).is_ok());
}

#[test]
fn op_equals_generic_reference() {
    let mut rng = Rng::new(71);
    let (m, k) = (19, 576);
    let x = rng.randn(&[m, k], |v| v);
    for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
        for block in [(1, 128), (1, k), (128, 1), (128, 128), (32, 32), (3, 64)] {
            for opts in all_configs() {
                let (q, sf) = cast(&x.view().into(), fmt, block, opts).unwrap();
                let qi = QuantInput::new(q.view(), sf.view(), block);
                let got = cast_back_op::<f32>(&qi).unwrap();
                assert_eq!(got.as_slice(), cast_back::<f32>(&qi).unwrap().as_slice());
                let got16 = cast_back_op::<bf16>(&qi).unwrap();
                assert_eq!(got16.as_slice(), cast_back::<bf16>(&qi).unwrap().as_slice());
                if block.0 == 1 {
                    let pt = per_token_cast_back::<f32>(q.view(), sf.view(), block.1).unwrap();
                    assert_eq!(bits(pt.as_slice()), bits(got.as_slice()));
                }
            }
        }
    }
}

#[test]
fn per_token_round_trip_like_upstream() {
    // test_cast_back_per_token: x = randn (output dtype), (q, sf) = per_token_cast(x, fmt, npc,
    // col, round, packed); calc_diff below 2e-2 (e2m1) / 1e-3 (e4m3); bit-equal to the
    // generic reference. npc ∈ {128, K}.
    let mut rng = Rng::new(73);
    let (m, k) = (21, 576);
    let xf = rng.randn(&[m, k], |v| v);
    let xb = rng.randn(&[m, k], bf16::from_f32);
    for fmt in [CastFormat::E2M1, CastFormat::E4M3] {
        let tol = if fmt == CastFormat::E2M1 { 2e-2 } else { 1e-3 };
        for npc in [128, k] {
            for opts in rounded_configs() {
                let p = PerTokenCastParams::new(fmt, npc, opts);
                // fp32 output.
                let (q, sf) = per_token_cast(&xf.view().into(), &p).unwrap();
                let back = per_token_cast_back::<f32>(q.view(), sf.view(), npc).unwrap();
                assert!(calc_diff_f32(xf.as_slice(), back.as_slice()) < tol);
                let generic = cast_back::<f32>(&QuantInput::new(q.view(), sf.view(), (1, npc)));
                assert_eq!(bits(back.as_slice()), bits(generic.unwrap().as_slice()));
                // bf16 output.
                let (q, sf) = per_token_cast(&xb.view().into(), &p).unwrap();
                let back = per_token_cast_back::<bf16>(q.view(), sf.view(), npc).unwrap();
                let backf = widen(&back);
                assert!(calc_diff_f32(widen(&xb).as_slice(), backf.as_slice()) < tol);
                let generic = cast_back::<bf16>(&QuantInput::new(q.view(), sf.view(), (1, npc)));
                assert_eq!(back.as_slice(), generic.unwrap().as_slice());
            }
        }
    }
}

#[test]
fn hand_examples_ue8m0_decoding_and_bf16_rounding() {
    // K = 64, block (1, 32), packed scales: byte 0 is +0.0 (1·0 = 0, −1·0 = −0), byte 255 is
    // +inf (1·inf = inf, 0·inf = NaN); byte 120 is 2^-7.
    let mut d = vec![0x38u8; 64]; // 1.0
    d[1] = 0xB8; // −1.0
    d[33] = 0x00; // 0
    d[34] = 0x7E; // 448
    let data = e4m3_data(1, 64, &d);
    let words = [Ue8m0x4(i32::from_le_bytes([0, 255, 0, 0]))];
    let view = HostView::new(&words, Layout::new(vec![1, 1], vec![1, 4], 0).unwrap()).unwrap();
    let got = per_token_cast_back::<f32>(
        QuantDataView::E4M3(data.view()),
        ScaleView::Packed(view),
        32,
    )
    .unwrap();
    let g = got.as_slice();
    assert_eq!((g[0].to_bits(), g[1].to_bits()), (0, 0x8000_0000));
    assert_eq!((g[32], g[34]), (f32::INFINITY, f32::INFINITY));
    assert!(g[33].is_nan());
    // fp32 scales 1 + 2^-8 and 1 + 3·2^-8 make bf16 ties: 1 + 2^-8 → 1.0, 1 + 3·2^-8 → 1 + 2^-6.
    let ones = e4m3_data(1, 64, &[0x38; 64]);
    for layout in [ScaleLayout::RowMajorF32, ScaleLayout::ColMajorF32] {
        let sf = HostScales::from_grid(
            layout,
            ScaleGrid::new(1, 2).unwrap(),
            &[1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8)],
        )
        .unwrap();
        let qi = QuantInput::new(QuantDataView::E4M3(ones.view()), sf.view(), (1, 32));
        let b = cast_back_op::<bf16>(&qi).unwrap();
        assert_eq!(b.as_slice()[0].to_bits(), 0x3F80);
        assert_eq!(b.as_slice()[63].to_bits(), 0x3F82);
        let f = cast_back_op::<f32>(&qi).unwrap();
        assert_eq!(f.as_slice()[0], 1.0 + 2f32.powi(-8));
    }
    // e2m1 nibbles in column order with a (2, 64) block: byte 0xF1 = [0.5, −6].
    let data = HostTensor::from_vec(vec![E2M1x2(0xF1); 64], &[2, 32]).unwrap();
    let sf = HostScales::from_grid(
        ScaleLayout::PackedUe8m0,
        ScaleGrid::new(1, 1).unwrap(),
        &[4.0],
    )
    .unwrap();
    let got = cast_back_op::<f32>(&QuantInput::new(
        QuantDataView::E2M1(data.view()),
        sf.view(),
        (2, 64),
    ))
    .unwrap();
    assert_eq!(&got.as_slice()[..2], [2.0, -24.0]);
    assert_eq!(&got.as_slice()[126..], [2.0, -24.0]);
}

#[test]
fn empty_input_and_strided_rows() {
    let x = HostTensor::<f32>::from_vec(vec![], &[0, 128]).unwrap();
    for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
        for opts in all_configs() {
            let (q, sf) = cast(&x.view().into(), fmt, (1, 128), opts).unwrap();
            let back = per_token_cast_back::<bf16>(q.view(), sf.view(), 128).unwrap();
            assert_eq!(back.shape(), [0, 128]);
        }
    }
    // Deviation: any row stride of the data (upstream needs it contiguous).
    let x = Rng::new(79).randn(&[9, 64], |v| v);
    let (q, sf) = cast(
        &x.view().into(),
        CastFormat::E4M3,
        (1, 64),
        ScaleOptions::packed_ue8m0(),
    )
    .unwrap();
    let mut buf = vec![0x7Fu8; 9 * 100];
    for r in 0..9 {
        buf[r * 100..r * 100 + 64].copy_from_slice(&q.bytes()[r * 64..(r + 1) * 64]);
    }
    let buf = e4m3_data(9, 100, &buf);
    let strided = buf.view().narrow(1, 0, 64).unwrap();
    let got = per_token_cast_back::<f32>(QuantDataView::E4M3(strided), sf.view(), 64).unwrap();
    let want = per_token_cast_back::<f32>(q.view(), sf.view(), 64).unwrap();
    assert_eq!(bits(got.as_slice()), bits(want.as_slice()));
}

// ---------------------------------------------------------------------------------------------
// E5M6 (§3.9)
// ---------------------------------------------------------------------------------------------

#[test]
fn e5m6_round_trip_like_upstream() {
    // test_cast_back_e5m6: for the random tensor and the three special ones (2^-20,
    // 2^-14·63/64, 2^-14, last column 65024): calc_diff below 1e-4 (random) / 5e-6 (special),
    // and bit-equal to the generic reference.
    let mut rng = Rng::new(83);
    let (m, k) = (6, 576);
    let specials = [2f32.powi(-20), 2f32.powi(-14) * 63.0 / 64.0, 2f32.powi(-14)];
    let mut inputs = vec![(rng.randn(&[m, k], |v| v), 1e-4)];
    for c in specials {
        let x = HostTensor::from_fn(&[m, k], |i| if i % k == k - 1 { 65024.0 } else { c });
        inputs.push((x, 5e-6));
    }
    for (x, tol) in &inputs {
        for opts in rounded_configs() {
            let (q, sf) =
                per_token_cast_to_e5m6(&x.view().into(), &PerTokenE5M6Params::new(k, opts))
                    .unwrap();
            let back = per_token_cast_back_e5m6::<f32>(&q.view(), &sf.view(), k).unwrap();
            let d = calc_diff_f32(x.as_slice(), back.as_slice());
            assert!(d < *tol, "calc_diff {d}");
            let generic = cast_back_from_e5m6::<f32>(&q.view(), &sf.view(), (1, k)).unwrap();
            assert_eq!(bits(back.as_slice()), bits(generic.as_slice()));
            let b16 = per_token_cast_back_e5m6::<bf16>(&q.view(), &sf.view(), k).unwrap();
            let g16 = cast_back_from_e5m6::<bf16>(&q.view(), &sf.view(), (1, k)).unwrap();
            assert_eq!(b16.as_slice(), g16.as_slice());
        }
    }
    // Deviation: a partial last column block (K % bk != 0) is accepted: K = 576, bk = 80.
    let x = &inputs[0].0;
    let (q, _) = per_token_cast_to_e5m6(
        &x.view().into(),
        &PerTokenE5M6Params::new(k, ScaleOptions::default()),
    )
    .unwrap();
    let sf = HostScales::from_fn(
        ScaleLayout::ColMajorF32,
        ScaleGrid::for_matrix(m, k, (2, 80)).unwrap(),
        |mb, kb| (mb + kb) as f32 * 0.25,
    )
    .unwrap();
    let got = cast_back_e5m6::<f32>(&q.view(), &sf.view(), (2, 80)).unwrap();
    let want = cast_back_from_e5m6::<f32>(&q.view(), &sf.view(), (2, 80)).unwrap();
    assert_eq!(bits(got.as_slice()), bits(want.as_slice()));
    let p = validate_e5m6(&q.view(), &sf.view(), (2, 80)).unwrap();
    assert_eq!(
        (p.k, p.grid, p.sf_layout),
        (k, ScaleGrid::new(3, 8).unwrap(), ScaleLayout::ColMajorF32)
    );
}
