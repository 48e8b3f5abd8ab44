//! `swiglu_forward_and_per_channel_cast_and_transpose` (`spec/quant.md` §3.12, §5): every
//! rejection, a hand-computed example, the bf16 rounding of the activation, the fp32 clamp,
//! agreement with the generic `reference::cast` (block `(npt, 1)`) and with
//! `per_channel_cast_and_transpose` of the activation, with and without transpose.
#![cfg(feature = "cpu")]

mod common;
mod op_common;

use half::bf16;
use op_common::{assert_err, strided_buffer, window};
use tk_core::testing::Rng;
use tk_core::{HostTensor, Layout};
use tk_quant::reference::swiglu::{cpu_expf, swiglu_activation};
use tk_quant::reference::{
    cast, per_channel_cast_and_transpose, swiglu_forward_and_per_channel_cast_and_transpose as op,
    swiglu_forward_and_per_channel_cast_and_transpose_with_expf as op_with,
    swiglu_per_channel_activation, swiglu_per_channel_downstream,
};
use tk_quant::swiglu_forward_and_per_channel_cast_and_transpose::{
    validate, validate_dims, NUM_PER_TOKENS,
};
use tk_quant::{
    CastFormat, CastInput, PerChannelCastAndTransposeParams, ScaleOptions,
    SwigluPerChannelParams as Params,
};

fn input(
    m: usize,
    h: usize,
    l: impl Fn(usize, usize) -> f32,
    v: impl Fn(usize, usize) -> f32,
) -> HostTensor<bf16> {
    HostTensor::from_fn(&[m, 2 * h], |i| {
        let (r, c) = (i / (2 * h), i % (2 * h));
        bf16::from_f32(if c < h { l(r, c) } else { v(r, c - h) })
    })
}

#[test]
fn rejections_name_the_argument() {
    let p = Params::new(128, false);
    assert_err(validate_dims(100, 128, &p).unwrap_err(), "Shape", "x");
    assert_err(validate_dims(128, 192, &p).unwrap_err(), "Shape", "x");
    assert!(validate_dims(128, 128, &p).is_ok()); // H = 64
    for npt in [0, 16, 64, 256] {
        assert_err(
            validate_dims(128, 128, &Params::new(npt, false)).unwrap_err(),
            "Param",
            "num_per_tokens",
        );
    }
    for c in [f32::NAN, f32::NEG_INFINITY, -2.0] {
        let pc = Params {
            swiglu_clamp_value: Some(c),
            ..p
        };
        assert_err(
            validate_dims(128, 128, &pc).unwrap_err(),
            "Param",
            "swiglu_clamp_value",
        );
    }
    let x = input(128, 64, |_, _| 1.0, |_, _| 1.0);
    let rank1 = x
        .view()
        .with_layout(Layout::contiguous(&[128 * 128]))
        .unwrap();
    assert_err(validate(&rank1, &p).unwrap_err(), "Shape", "x");
    let empty = HostTensor::<bf16>::from_vec(vec![], &[128, 0]).unwrap();
    assert_err(validate(&empty.view(), &p).unwrap_err(), "Empty", "x");
    let a = HostTensor::<bf16>::from_vec(vec![bf16::ZERO; 128 * 96], &[128, 96]).unwrap();
    assert_err(
        swiglu_per_channel_downstream(&a.view(), &p).unwrap_err(),
        "Shape",
        "x",
    );
}

#[test]
fn hand_example() {
    // expf ≡ 0: t = 1, a = fl(l·v). Column 0: l = 3, v = 1.5 at row 7 (a = 4.5), 0 elsewhere;
    // column 1: l = 1, v = 1/3 (a = fl(1/3) -> bf16 0.333984375). H = 64, M = 128, npt = 128.
    let zero = |_: f32| 0.0f32;
    let x = input(
        128,
        64,
        |r, j| match (r, j) {
            (7, 0) => 3.0,
            (_, 1) => 1.0,
            _ => 0.0,
        },
        |r, j| match (r, j) {
            (7, 0) => 1.5,
            (_, 1) => 1.0 / 3.0,
            _ => 0.0,
        },
    );
    let (q, sf) = op_with(&x.view(), &Params::new(128, false), &zero).unwrap();
    assert_eq!(q.shape(), [64, 128]);
    assert_eq!(sf.shape(), [1, 64]);
    // Column 0: sf = 4.5/448, 4.5 -> 448.
    assert_eq!(sf.get(0, 0), Some(4.5f32 / 448.0));
    let b = q.bytes();
    assert_eq!(b[7], 0x7E);
    assert!(b[..128].iter().enumerate().all(|(r, &c)| r == 7 || c == 0));
    // Column 1: v = bf16(1/3) = 0.333984375 exactly, a = that; sf = a/448, every row 448.
    let a1 = bf16::from_f32(1.0 / 3.0).to_f32();
    assert_eq!(sf.get(0, 1), Some(a1 / 448.0));
    assert!(b[128..256].iter().all(|&c| c == 0x7E));
    // Without transpose: the same data, (M, H).
    let (qn, sfn) = op_with(
        &x.view(),
        &Params {
            without_transpose: true,
            ..Params::new(128, false)
        },
        &zero,
    )
    .unwrap();
    assert_eq!((qn.shape(), &sfn), (&[128usize, 64][..], &sf));
    assert_eq!(qn.bytes()[7 * 64], 0x7E);
}

#[test]
fn clamp_is_in_fp32() {
    // C = 0.3 is not a bf16 value; l = bf16(0.30078125) > 0.3 is clamped to 0.3f32 exactly.
    let c = 0.3f32;
    let x = input(128, 64, |_, _| 0.30078125, |_, _| 2.0);
    let p = Params {
        swiglu_clamp_value: Some(c),
        ..Params::new(32, true)
    };
    let a = swiglu_per_channel_activation(&x.view(), &p, &cpu_expf).unwrap();
    let want = bf16::from_f32((c / (1.0 + cpu_expf(-c))) * c); // v = 2 clamped to C too
    assert!(a.as_slice().iter().all(|v| v.to_bits() == want.to_bits()));
}

#[test]
fn equals_generic_cast_of_the_bf16_activation() {
    let mut rng = Rng::for_case("swiglu_per_channel");
    let (m, h) = (256, 192);
    let x = rng.randn(&[m, 2 * h], bf16::from_f32);
    for npt in NUM_PER_TOKENS {
        for round in [false, true] {
            for clamp in [None, Some(10.0), Some(0.5)] {
                let p = Params {
                    swiglu_clamp_value: clamp,
                    ..Params::new(npt, round)
                };
                let a = swiglu_per_channel_activation(&x.view(), &p, &cpu_expf).unwrap();
                // The activation, element by element.
                for r in (0..m).step_by(37) {
                    for j in 0..h {
                        let (l, v) = (
                            x.as_slice()[r * 2 * h + j].to_f32(),
                            x.as_slice()[r * 2 * h + h + j].to_f32(),
                        );
                        let want = bf16::from_f32(swiglu_activation(l, v, clamp, &cpu_expf));
                        assert_eq!(a.as_slice()[r * h + j].to_bits(), want.to_bits());
                    }
                }
                let (q, sf) = op(&x.view(), &p).unwrap();
                let (rq, rsf) = cast(
                    &CastInput::from(a.view()),
                    CastFormat::E4M3,
                    (npt, 1),
                    ScaleOptions::row_major(round),
                )
                .unwrap();
                assert_eq!(sf, rsf);
                let (b, rb) = (q.bytes(), rq.bytes());
                for r in 0..m {
                    for j in 0..h {
                        assert_eq!(b[j * m + r], rb[r * h + j]);
                    }
                }
                // The downstream is per_channel_cast_and_transpose of the activation.
                let pct = per_channel_cast_and_transpose(
                    &a.view(),
                    &PerChannelCastAndTransposeParams::new(npt, round),
                )
                .unwrap();
                assert_eq!((q.clone(), sf.clone()), pct);
                // Without transpose: the untransposed generic cast.
                let pn = Params {
                    without_transpose: true,
                    ..p
                };
                assert_eq!(op(&x.view(), &pn).unwrap(), (rq, rsf));
            }
        }
    }
    // Row-strided input: identical.
    let buf = strided_buffer(&x, bf16::from_f32(2.0));
    let p = Params::new(32, true);
    assert_eq!(
        op(&window(&buf, 2 * h), &p).unwrap(),
        op(&x.view(), &p).unwrap()
    );
}

#[test]
fn empty_input() {
    let x = HostTensor::<bf16>::from_vec(vec![], &[0, 128]).unwrap();
    let (q, sf) = op(&x.view(), &Params::new(128, true)).unwrap();
    assert_eq!((q.shape(), sf.shape()), (&[64usize, 0][..], [0, 64]));
}
