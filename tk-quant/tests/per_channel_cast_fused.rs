//! `per_channel_cast_fused` (`spec/quant.md` §3.6, §5): every rejection, hand-computed
//! examples (gather, padding rows, fused cast back), and agreement with the generic reference
//! and with `per_channel_cast` (§3.5), which it generalises.
#![cfg(feature = "cpu")]

mod common;
mod op_common;

use float8::F8E4M3;
use half::bf16;
use op_common::{assert_err, e4m3_data, strided_buffer, window};
use tk_core::testing::Rng;
use tk_core::{HostTensor, HostView, Layout};
use tk_quant::per_channel_cast_fused::validate;
use tk_quant::reference::{cast, per_channel_cast, per_channel_cast_fused, per_token_cast};
use tk_quant::{
    CastFormat, CastInput, FusedInput, PerChannelCastFusedParams as Params, PerChannelCastParams,
    PerTokenCastParams, PlainInput, QuantInput, ScaleOptions, ScaleView,
};

fn map(v: &[i32]) -> HostTensor<i32> {
    HostTensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
}

fn plain(x: &HostTensor<f32>) -> FusedInput<'_> {
    FusedInput::Plain(PlainInput::from(x.view()))
}

/// Per-token e4m3 data with non-rounded (1, 128) fp32 scales, as upstream's test builds it.
fn quantized(x: &HostTensor<f32>) -> (HostTensor<F8E4M3>, HostTensor<f32>) {
    let (q, sf) = per_token_cast(
        &CastInput::from(x.view()),
        &PerTokenCastParams::new(CastFormat::E4M3, 128, ScaleOptions::row_major(false)),
    )
    .unwrap();
    let [r, c] = sf.shape();
    let sf = HostTensor::from_vec(sf.to_grid(), &[r, c]).unwrap();
    (q.as_e4m3().unwrap().clone(), sf)
}

#[test]
fn rejections_name_the_argument() {
    let x = HostTensor::from_fn(&[128, 256], |i| (i % 7) as f32);
    let (d, s) = quantized(&x);
    let fused = FusedInput::Quantized {
        data: d.view(),
        sf: s.view(),
    };
    let e = |x: &FusedInput<'_>, m: Option<&HostView<'_, i32>>, p: Params| {
        validate(x, m, &p).unwrap_err()
    };
    let p = Params::plain(false);
    assert_err(
        e(
            &plain(&x),
            None,
            Params {
                num_per_tokens: 64,
                ..p
            },
        ),
        "Param",
        "num_per_tokens",
    );
    assert_err(
        e(&plain(&x), None, Params::fused(false)),
        "Param",
        "num_per_channels",
    );
    assert_err(e(&fused, None, p), "Param", "num_per_channels");
    assert_err(
        e(
            &fused,
            None,
            Params {
                num_per_channels: Some(64),
                ..p
            },
        ),
        "Param",
        "num_per_channels",
    );
    // K: plain needs K % 64, fused K % 128; K = 0 is empty.
    let x96 = HostTensor::from_fn(&[128, 96], |_| 1.0f32);
    assert_err(e(&plain(&x96), None, p), "Shape", "x");
    let d192 = e4m3_data(128, 192, &[0x38; 128 * 192]);
    let s192 = HostTensor::from_vec(vec![1.0f32; 128], &[128, 1]).unwrap();
    let f192 = FusedInput::Quantized {
        data: d192.view(),
        sf: s192.view(),
    };
    assert_err(e(&f192, None, Params::fused(false)), "Shape", "x");
    let d0 = e4m3_data(128, 0, &[]);
    let f0 = FusedInput::Quantized {
        data: d0.view(),
        sf: s192.view(),
    };
    assert_err(e(&f0, None, Params::fused(false)), "Empty", "x");
    // Wrong input scale shape.
    let bad_sf = HostTensor::from_vec(vec![1.0f32; 128 * 3], &[128, 3]).unwrap();
    let fb = FusedInput::Quantized {
        data: d.view(),
        sf: bad_sf.view(),
    };
    assert_err(e(&fb, None, Params::fused(false)), "Shape", "x.sf");
    // Without a map N_in % 128; with one N_out % 16, rank 1, entries < N_in.
    let x100 = HostTensor::from_fn(&[100, 64], |_| 1.0f32);
    assert_err(e(&plain(&x100), None, p), "Shape", "x");
    let m24 = map(&[0; 24]);
    assert_err(
        e(&plain(&x100), Some(&m24.view()), p),
        "Shape",
        "pos_to_token",
    );
    let m2d = HostTensor::from_vec(vec![0i32; 32], &[2, 16]).unwrap();
    assert_err(
        e(&plain(&x100), Some(&m2d.view()), p),
        "Shape",
        "pos_to_token",
    );
    let mut v = vec![-1i32; 16];
    v[3] = 100;
    assert_err(
        e(&plain(&x100), Some(&map(&v).view()), p),
        "Param",
        "pos_to_token",
    );
    v[3] = 99;
    assert!(validate(&plain(&x100), Some(&map(&v).view()), &p).is_ok());
}

#[test]
fn without_extras_it_is_per_channel_cast() {
    let mut rng = Rng::for_case("per_channel_cast_fused/plain");
    let x = rng.randn(&[256, 576], |v| v);
    let xb = rng.randn(&[128, 256], bf16::from_f32);
    for round in [false, true] {
        let got = per_channel_cast_fused(&plain(&x), None, &Params::plain(round)).unwrap();
        let want = per_channel_cast(
            &PlainInput::from(x.view()),
            &PerChannelCastParams::new(128, round),
        )
        .unwrap();
        assert_eq!(got, want);
        let r = cast(
            &CastInput::from(x.view()),
            CastFormat::E4M3,
            (128, 1),
            ScaleOptions::row_major(round),
        )
        .unwrap();
        assert_eq!(got, r);
        let gb = per_channel_cast_fused(
            &FusedInput::Plain(xb.view().into()),
            None,
            &Params::plain(round),
        )
        .unwrap();
        let rb = cast(
            &CastInput::from(xb.view()),
            CastFormat::E4M3,
            (128, 1),
            ScaleOptions::row_major(round),
        )
        .unwrap();
        assert_eq!(gb, rb);
        // Row-strided input: identical.
        let buf = strided_buffer(&x, 9.0);
        let gs = per_channel_cast_fused(
            &FusedInput::Plain(window(&buf, 576).into()),
            None,
            &Params::plain(round),
        )
        .unwrap();
        assert_eq!(gs, got);
    }
}

#[test]
fn fused_cast_back_is_the_requantizing_generic_cast() {
    let mut rng = Rng::for_case("per_channel_cast_fused/fused");
    for k in [128, 384] {
        let x = rng.randn(&[128, k], |v| v);
        let (d, s) = quantized(&x);
        let fused = FusedInput::Quantized {
            data: d.view(),
            sf: s.view(),
        };
        for round in [false, true] {
            let got = per_channel_cast_fused(&fused, None, &Params::fused(round)).unwrap();
            let qin = QuantInput::new(
                tk_quant::QuantDataView::E4M3(d.view()),
                ScaleView::F32(s.view()),
                (1, 128),
            );
            let want = cast(
                &CastInput::from(qin),
                CastFormat::E4M3,
                (128, 1),
                ScaleOptions::row_major(round),
            )
            .unwrap();
            assert_eq!(got, want, "K = {k}, round {round}");
        }
    }
}

#[test]
fn hand_example_fused_gather_and_padding() {
    // x: 2 rows, K = 128, e4m3 data 2.0 (0x40) in row 0 and 1.5 (0x3C) in row 1; scales 0.5
    // and 4: dequantized 1.0 and 6.0. Map of 16: [1, -1, 0, 1, -1 x 12].
    let mut bytes = vec![0x40u8; 128];
    bytes.extend([0x3Cu8; 128]);
    let d = e4m3_data(2, 128, &bytes);
    let s = HostTensor::from_vec(vec![0.5f32, 4.0], &[2, 1]).unwrap();
    let fused = FusedInput::Quantized {
        data: d.view(),
        sf: s.view(),
    };
    let mut v = vec![-1i32; 16];
    v[0] = 1;
    v[2] = 0;
    v[3] = 1;
    let m = map(&v);
    let (q, sf) = per_channel_cast_fused(&fused, Some(&m.view()), &Params::fused(false)).unwrap();
    assert_eq!(q.shape(), [16, 128]);
    assert_eq!(sf.shape(), [1, 128]);
    // amax = 6 per column (one partial block of 16 rows): sf = 6/448, inv = 448/6.
    let (sfv, inv) = (6.0f32 / 448.0, 448.0f32 / 6.0);
    assert!((0..128).all(|c| sf.get(0, c) == Some(sfv)));
    let b = q.bytes();
    let enc = tk_core::convert::e4m3_from_f32;
    for c in 0..128 {
        assert_eq!(b[c], 0x7E); // 6 * 448/6 -> 448 (saturating the 1-ulp excess)
        assert_eq!(b[2 * 128 + c], enc(1.0 * inv));
        assert_eq!(b[3 * 128 + c], 0x7E);
        for r in [1, 4, 15] {
            assert_eq!(b[r * 128 + c], 0x00, "padding row {r}");
        }
    }
    // All rows padding: amax 0 -> sf = fl(1e-4/448), data +0.
    let allpad = map(&[-1; 16]);
    let (q, sf) =
        per_channel_cast_fused(&fused, Some(&allpad.view()), &Params::fused(true)).unwrap();
    assert!(q.bytes().iter().all(|&b| b == 0));
    assert_eq!(sf.get(0, 5), Some(2f32.powi(-22)));
}

#[test]
fn gather_equals_cast_of_gathered_rows() {
    let mut rng = Rng::for_case("per_channel_cast_fused/gather");
    let (n_in, k) = (40, 256);
    let x = rng.randn(&[n_in, k], bf16::from_f32);
    // N_out = 144: one full block and a partial one of 16 rows.
    let v: Vec<i32> = (0..144)
        .map(|_| rng.below(n_in as u64 + 10) as i32 - 10)
        .collect();
    let m = map(&v);
    for round in [false, true] {
        let got = per_channel_cast_fused(
            &FusedInput::Plain(x.view().into()),
            Some(&m.view()),
            &Params::plain(round),
        )
        .unwrap();
        let gathered = HostTensor::from_fn(&[144, k], |i| {
            let src = v[i / k];
            if src < 0 {
                bf16::ZERO
            } else {
                x.as_slice()[src as usize * k + i % k]
            }
        });
        let want = cast(
            &CastInput::from(gathered.view()),
            CastFormat::E4M3,
            (128, 1),
            ScaleOptions::row_major(round),
        )
        .unwrap();
        assert_eq!(got, want);
        assert_eq!(got.1.shape(), [2, k]);
        let b = got.0.bytes();
        for (i, &src) in v.iter().enumerate() {
            if src < 0 {
                assert!(
                    b[i * k..(i + 1) * k].iter().all(|&c| c == 0),
                    "padding row {i}"
                );
            }
        }
    }
    // A strided map (every other entry) gives the same result as its contiguous copy.
    let strided = m
        .view()
        .with_layout(Layout::new(vec![64], vec![2], 0).unwrap())
        .unwrap();
    let copy = map(&strided.to_contiguous_vec());
    let xi = FusedInput::Plain(x.view().into());
    assert_eq!(
        per_channel_cast_fused(&xi, Some(&strided), &Params::plain(true)).unwrap(),
        per_channel_cast_fused(&xi, Some(&copy.view()), &Params::plain(true)).unwrap()
    );
}

#[test]
fn empty_input() {
    let x = HostTensor::<f32>::from_vec(vec![], &[0, 128]).unwrap();
    let (q, sf) = per_channel_cast_fused(&plain(&x), None, &Params::plain(false)).unwrap();
    assert_eq!((q.shape(), sf.shape()), (&[0usize, 128][..], [0, 128]));
    let m = map(&[]);
    let x1 = HostTensor::from_fn(&[4, 128], |_| 1.0f32);
    let (q, _) =
        per_channel_cast_fused(&plain(&x1), Some(&m.view()), &Params::plain(false)).unwrap();
    assert_eq!(q.shape(), [0, 128]);
}
