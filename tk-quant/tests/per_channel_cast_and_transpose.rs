//! `per_channel_cast_and_transpose` (`spec/quant.md` §3.7, §5): every rejection, a
//! hand-computed example, the edge cases, and agreement with the generic reference (block
//! `(npt, 1)`, data transposed).
#![cfg(feature = "cpu")]

mod common;
mod op_common;

use half::bf16;
use op_common::{assert_err, strided_buffer, window};
use tk_core::testing::Rng;
use tk_core::{HostTensor, Layout};
use tk_quant::per_channel_cast_and_transpose::{validate, validate_dims, NUM_PER_TOKENS};
use tk_quant::reference::{cast, per_channel_cast_and_transpose};
use tk_quant::{
    CastFormat, CastInput, PerChannelCastAndTransposeParams as Params, ScaleGrid, ScaleLayout,
    ScaleOptions,
};

fn bf16s(m: usize, k: usize, f: impl Fn(usize, usize) -> f32) -> HostTensor<bf16> {
    HostTensor::from_fn(&[m, k], |i| bf16::from_f32(f(i / k, i % k)))
}

#[test]
fn validate_returns_the_plan() {
    let x = bf16s(256, 192, |_, _| 1.0);
    for npt in NUM_PER_TOKENS {
        let p = validate(&x.view(), &Params::new(npt, true)).unwrap();
        assert_eq!((p.m, p.k, p.block), (256, 192, (npt, 1)));
        assert_eq!(p.grid, ScaleGrid::new(256 / npt, 192).unwrap());
        assert_eq!(p.sf_layout, ScaleLayout::RowMajorF32);
    }
}

#[test]
fn rejections_name_the_argument() {
    let p = Params::new(128, false);
    assert_err(validate_dims(100, 64, &p).unwrap_err(), "Shape", "x");
    assert_err(validate_dims(128, 96, &p).unwrap_err(), "Shape", "x");
    for npt in [0, 1, 16, 64, 256] {
        assert_err(
            validate_dims(128, 64, &Params::new(npt, false)).unwrap_err(),
            "Param",
            "num_per_tokens",
        );
    }
    let x = bf16s(128, 64, |_, _| 1.0);
    let rank1 = x
        .view()
        .with_layout(Layout::contiguous(&[128 * 64]))
        .unwrap();
    assert_err(validate(&rank1, &p).unwrap_err(), "Shape", "x");
    let empty = HostTensor::<bf16>::from_vec(vec![], &[128, 0]).unwrap();
    assert_err(validate(&empty.view(), &p).unwrap_err(), "Empty", "x");
    let colstride = x
        .view()
        .with_layout(Layout::new(vec![128, 32], vec![64, 2], 0).unwrap())
        .unwrap();
    assert_err(validate(&colstride, &p).unwrap_err(), "Stride", "x");
}

#[test]
fn hand_example() {
    // Column 0: a single 7.0 at row 5 (amax 7: sf = 7/448 = 2^-6, inv = 64, 7 -> 448 = 0x7E);
    // column 1: all -0.0 (all-zero block: sf = fl(1e-4/448), data 0x80); column 2: row r holds
    // r/64 in block 0 (amax 127/64).
    let (m, k) = (128, 64);
    let x = bf16s(m, k, |r, c| match c {
        0 => {
            if r == 5 {
                7.0
            } else {
                0.0
            }
        }
        1 => -0.0,
        2 => r as f32 / 64.0,
        _ => 1.0,
    });
    let (q, sf) = per_channel_cast_and_transpose(&x.view(), &Params::new(128, false)).unwrap();
    assert_eq!(q.shape(), [k, m]);
    assert_eq!(sf.shape(), [1, k]);
    let b = q.bytes();
    let at = |c: usize, r: usize| b[c * m + r];
    assert_eq!(at(0, 5), 0x7E);
    assert!((0..m).filter(|&r| r != 5).all(|r| at(0, r) == 0));
    assert_eq!(sf.get(0, 0), Some(1.0 / 64.0));
    assert!((0..m).all(|r| at(1, r) == 0x80));
    assert_eq!(sf.get(0, 1), Some(1e-4f32 / 448.0));
    // Column 2: amax = 127/64; row 127 scales to exactly 448 (up to the 1-ulp excess, §5.5).
    assert_eq!(at(2, 127), 0x7E);
    assert_eq!(sf.get(0, 2), Some((127.0f32 / 64.0) / 448.0));
    // Rounded: sf = 2^ceil(log2(7/448)) = 2^-6 for column 0; 2^-22 for the zero column.
    let (_, sf) = per_channel_cast_and_transpose(&x.view(), &Params::new(32, true)).unwrap();
    assert_eq!(sf.shape(), [4, k]);
    assert_eq!(sf.get(0, 0), Some(1.0 / 64.0));
    assert_eq!(sf.get(1, 0), Some(2f32.powi(-22)));
    assert_eq!(sf.get(3, 1), Some(2f32.powi(-22)));
}

#[test]
fn equals_generic_reference_transposed() {
    let mut rng = Rng::for_case("per_channel_cast_and_transpose");
    let (m, k) = (256, 192);
    let x = rng.randn(&[m, k], bf16::from_f32);
    for npt in NUM_PER_TOKENS {
        for round in [false, true] {
            let (q, sf) =
                per_channel_cast_and_transpose(&x.view(), &Params::new(npt, round)).unwrap();
            let (rq, rsf) = cast(
                &CastInput::from(x.view()),
                CastFormat::E4M3,
                (npt, 1),
                ScaleOptions::row_major(round),
            )
            .unwrap();
            assert_eq!(sf, rsf);
            let rb = rq.bytes();
            let b = q.bytes();
            for r in 0..m {
                for c in 0..k {
                    assert_eq!(b[c * m + r], rb[r * k + c], "({r}, {c})");
                }
            }
            // Row-strided input: identical.
            let buf = strided_buffer(&x, bf16::from_f32(3.0));
            let (q2, sf2) =
                per_channel_cast_and_transpose(&window(&buf, k), &Params::new(npt, round)).unwrap();
            assert_eq!((q2, sf2), (q.clone(), sf.clone()));
        }
    }
}

#[test]
fn empty_input() {
    let x = HostTensor::<bf16>::from_vec(vec![], &[0, 64]).unwrap();
    let (q, sf) = per_channel_cast_and_transpose(&x.view(), &Params::new(32, true)).unwrap();
    assert_eq!(q.shape(), [64, 0]);
    assert_eq!(sf.shape(), [0, 64]);
}
