//! The per-channel cast op (`spec/quant.md` §3.5, §5): every precondition's rejection, a
//! hand-computed example, the §5 edge cases, and agreement with the generic reference.
#![cfg(feature = "cpu")]

mod common;
mod op_common;

use common::{check_bias, div_f32, pow2_ceil};
use half::bf16;
use op_common::{assert_err, bits, f32s, strided_buffer, to_bf16, widen, window};
use tk_core::convert::e4m3_from_f32;
use tk_core::testing::Rng;
use tk_core::{HostTensor, Layout};
use tk_quant::per_channel_cast::{validate, validate_dims, NUM_PER_TOKENS};
use tk_quant::reference::{cast, cast_back, per_channel_cast};
use tk_quant::{
    CastFormat, PerChannelCastParams, PlainInput, QuantInput, ScaleGrid, ScaleLayout, ScaleOptions,
};

fn params(round_sf: bool) -> PerChannelCastParams {
    PerChannelCastParams::new(NUM_PER_TOKENS, round_sf)
}

#[test]
fn validate_returns_the_plan() {
    let x = HostTensor::from_fn(&[256, 576], |i| (i % 11) as f32);
    for round in [false, true] {
        let p = validate(&PlainInput::from(x.view()), &params(round)).unwrap();
        assert_eq!((p.m, p.k, p.block), (256, 576, (128, 1)));
        assert_eq!(p.grid, ScaleGrid::new(2, 576).unwrap());
        assert_eq!(p.sf_layout, ScaleLayout::RowMajorF32);
    }
    assert_eq!(PerChannelCastParams::default(), params(false));
    let p = validate_dims(0, 64, &params(true)).unwrap();
    assert_eq!((p.grid.nbm(), p.grid.nbk()), (0, 64));
}

#[test]
fn rejections_name_the_argument() {
    // M % 128 (also M < 128), K % 64.
    for (m, k) in [(100, 64), (129, 64), (64, 64), (128, 100), (128, 32)] {
        let x = HostTensor::from_fn(&[m, k], |i| i as f32);
        let e = per_channel_cast(&x.view().into(), &params(false)).unwrap_err();
        assert_err(e, "Shape", "x");
    }
    // num_per_tokens other than 128.
    let x = HostTensor::from_fn(&[128, 64], |i| i as f32);
    for npt in [0, 1, 32, 64, 256] {
        let e =
            per_channel_cast(&x.view().into(), &PerChannelCastParams::new(npt, true)).unwrap_err();
        assert_err(e, "Param", "num_per_tokens");
    }
    // x: K = 0, rank, column stride.
    let k0 = HostTensor::<bf16>::from_vec(vec![], &[128, 0]).unwrap();
    assert_err(
        per_channel_cast(&k0.view().into(), &params(false)).unwrap_err(),
        "Empty",
        "x",
    );
    let rank3 = x
        .view()
        .with_layout(Layout::contiguous(&[2, 64, 64]))
        .unwrap();
    assert_err(
        per_channel_cast(&rank3.into(), &params(false)).unwrap_err(),
        "Shape",
        "x",
    );
    let cols2 = x
        .view()
        .with_layout(Layout::new(vec![128, 32], vec![64, 2], 0).unwrap())
        .unwrap();
    assert_err(
        per_channel_cast(&cols2.into(), &params(false)).unwrap_err(),
        "Stride",
        "x",
    );
}

#[test]
fn op_equals_generic_reference() {
    let mut rng = Rng::new(53);
    for (m, k) in [(128, 576), (256, 64)] {
        let x = rng.randn(&[m, k], |v| v);
        let xb = rng.randn(&[m, k], bf16::from_f32);
        for round in [false, true] {
            for (input, orig) in [
                (PlainInput::from(x.view()), x.clone()),
                (PlainInput::from(xb.view()), widen(&xb)),
            ] {
                let got = per_channel_cast(&input, &params(round)).unwrap();
                let want = cast(
                    &input.clone().into(),
                    CastFormat::E4M3,
                    (128, 1),
                    ScaleOptions::row_major(round),
                )
                .unwrap();
                assert_eq!(got, want);
                assert_eq!(got.1.shape(), [m / 128, k]);
                assert_eq!(got.1.strides(), [k, 1]);
                // Upstream's assertion: the round trip has no rounding bias.
                let back = cast_back::<f32>(&QuantInput::new(got.0.view(), got.1.view(), (128, 1)))
                    .unwrap();
                check_bias("per_channel_cast", back.as_slice(), orig.as_slice());
            }
        }
    }
}

#[test]
fn hand_example_and_edge_cases() {
    // M = 128, K = 64. Column 0: ones and a 7 (sf 2^-6, inv 64: 1 → 0x68, 7 → 0x7E).
    // Column 1: all zeros, half of them −0.0 (ε scale; 0x00 / 0x80). Column 2: ones and −3.5
    // (sf 2^-7: 1 → 0x70, −3.5 → 0xFE). Column 3: an fp32 subnormal only (ε scale, signed
    // zero out). Column 4: NaN and 2 (NaN ignored: sf from 2, NaN → 0x7F). Column 5: a and −a
    // with fl(a · fl(448/a)) > 448 (saturates, never NaN). Other columns: 0.5.
    let (m, k) = (128, 64);
    let mut a = 1.0f32;
    while a * (448.0 / a) <= 448.0 {
        a = f32::from_bits(a.to_bits() + 1);
    }
    let mut v = vec![0.5f32; m * k];
    for r in 0..m {
        v[r * k] = if r == 9 { 7.0 } else { 1.0 };
        v[r * k + 1] = if r % 2 == 0 { 0.0 } else { -0.0 };
        v[r * k + 2] = if r == 127 { -3.5 } else { 1.0 };
        v[r * k + 3] = 0.0;
        v[r * k + 4] = 0.0;
        v[r * k + 5] = 0.0;
    }
    v[50 * k + 3] = -(2f64.powi(-140) as f32);
    v[4] = f32::NAN;
    v[k + 4] = 2.0;
    v[5] = a;
    v[k + 5] = -a;
    // Column 7: an infinite amax (§5 item 6, the GPU's behaviour): sf = +inf; non-rounded
    // inv = 0 (inf → NaN 0x7F, ±1 → ±0), rounded inv = −inf (inf → −448, ±1 → ∓448, 0 → NaN).
    for r in 0..m {
        v[r * k + 7] = [f32::INFINITY, 1.0, -1.0].get(r).copied().unwrap_or(0.0);
    }
    let x = f32s(m, k, &v);
    for round in [false, true] {
        let (q, sf) = per_channel_cast(&x.view().into(), &params(round)).unwrap();
        let b = q.bytes();
        let at = |r: usize, c: usize| b[r * k + c];
        assert_eq!((at(0, 0), at(9, 0)), (0x68, 0x7E));
        assert_eq!((at(0, 1), at(1, 1)), (0x00, 0x80));
        assert_eq!((at(0, 2), at(127, 2)), (0x70, 0xFE));
        assert_eq!((at(50, 3), at(51, 3)), (0x80, 0x00));
        // 2 · 224 = 448 (0x7E); rounded sf = 2^-7: 2 · 128 = 256 (0x78).
        assert_eq!(
            (at(0, 4), at(1, 4)),
            (0x7F, if round { 0x78 } else { 0x7E })
        );
        if !round {
            assert_eq!((at(0, 5), at(1, 5)), (0x7E, 0xFE));
        }
        let eps = if round {
            2f32.powi(-22)
        } else {
            div_f32(1e-4, 448.0)
        };
        let pick = |v: f32| if round { pow2_ceil(v) } else { v };
        let s = sf.f32_storage().unwrap();
        assert_eq!(s.len(), 64); // layout A (1, 64), no padding
        assert_eq!(
            bits(&s[..5]),
            bits(&[
                2f32.powi(-6),
                eps,
                2f32.powi(-7),
                eps,
                pick(div_f32(2.0, 448.0))
            ])
        );
        assert_eq!(s[6].to_bits(), pick(div_f32(0.5, 448.0)).to_bits());
        for (c, &sfc) in s.iter().enumerate() {
            assert!(c == 7 || sfc.is_normal(), "column {c}");
        }
        assert_eq!(s[7], f32::INFINITY);
        let col7 = [at(0, 7), at(1, 7), at(2, 7), at(3, 7)];
        let want = if round {
            [0xFE, 0xFE, 0x7E, 0x7F]
        } else {
            [0x7F, 0x00, 0x80, 0x00]
        };
        assert_eq!(col7, want);
        // Column 6: 0.5 · inv.
        let inv = if round {
            1.0 / pick(div_f32(0.5, 448.0))
        } else {
            div_f32(448.0, 0.5)
        };
        assert_eq!(at(3, 6), e4m3_from_f32(0.5 * inv));
    }
}

#[test]
fn empty_input_and_strided_rows() {
    let x = HostTensor::<bf16>::from_vec(vec![], &[0, 128]).unwrap();
    let (q, sf) = per_channel_cast(&x.view().into(), &params(true)).unwrap();
    assert_eq!((q.shape(), sf.shape()), (&[0, 128][..], [0, 128]));
    // Deviation: any row stride, identical to a contiguous copy.
    let x = Rng::new(59).randn(&[128, 64], |v| v);
    let xb = to_bf16(&x);
    let buf = strided_buffer(&x, -f32::MAX);
    let bufb = strided_buffer(&xb, bf16::MAX);
    for round in [false, true] {
        assert_eq!(
            per_channel_cast(&window(&buf, 64).into(), &params(round)).unwrap(),
            per_channel_cast(&x.view().into(), &params(round)).unwrap()
        );
        assert_eq!(
            per_channel_cast(&window(&bufb, 64).into(), &params(round)).unwrap(),
            per_channel_cast(&xb.view().into(), &params(round)).unwrap()
        );
    }
}
