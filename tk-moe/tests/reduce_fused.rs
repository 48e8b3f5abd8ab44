//! `reduce_fused` (`spec/moe.md` §4.14, §5.15): hand-computed examples, planted cases where the
//! FMA, the slot order, the `w·x_sf` product and the final `sf` multiply each change the bits,
//! the saturating e4m3 conversion, every rejection, and the moe12 grid (subsampled: 600 sent
//! tokens, the first 64 rows, `H = 256`; the fused buffer has `T·K` rows as upstream's test)
//! over `in ∈ {fp32, bf16}` × `out ∈ {in, e4m3}` × weights × `x_sf`, bit for bit against an
//! independent `f32::mul_add` implementation of the spec's pseudo-code.
#![cfg(feature = "cpu")]

mod common;

use common::{assert_param, assert_shape_err, grid, mat, naive_reduce, topk_idx_sub, vec1};
use float8::F8E4M3;
use half::bf16;
use tk_core::convert::e4m3_from_f32;
use tk_core::testing::{assert_bits_eq, Rng};
use tk_core::{DType, HostTensor, Layout, TkError};
use tk_moe::reference::{get_fused_mapping, reduce_fused, reduce_fused_e4m3, ReduceFusedInputs};
use tk_moe::{
    GetFusedMappingParams, ReduceElement, ReduceFusedLayouts, ReduceFusedParams, ReduceOut,
};

fn x4() -> HostTensor<f32> {
    mat(&[&[1.0, 2.0], &[3.0, 4.0], &[5.0, 6.0], &[7.0, 8.0]])
}

fn ttp() -> HostTensor<i32> {
    // Token 1 reads row 1 twice (allowed); token 0 has an invalid slot.
    mat(&[&[2, -1, 0], &[1, 3, 1]])
}

fn w() -> HostTensor<f32> {
    mat(&[&[0.5, 100.0, 2.0], &[1.0, 0.25, 3.0]])
}

#[test]
fn hand_examples() {
    let (x, ttp, w) = (x4(), ttp(), w());
    let base = ReduceFusedInputs::new(x.view(), ttp.view());
    // No weights: plain sums.
    assert_eq!(
        reduce_fused(&base).unwrap().as_slice(),
        &[6.0, 8.0, 13.0, 16.0]
    );
    let weighted = base.clone().with_weights(w.view());
    let out = reduce_fused(&weighted).unwrap();
    assert_eq!(out.shape(), &[2, 2]);
    assert_eq!(out.as_slice(), &[4.5, 7.0, 13.75, 18.0]);
    // x_sf scales the slot's weight: s = w · x_sf[p].
    let x_sf = vec1(&[1.0f32, 2.0, 4.0, 8.0]);
    let scaled = weighted.clone().with_x_sf(x_sf.view());
    assert_eq!(
        reduce_fused(&scaled).unwrap().as_slice(),
        &[12.0, 16.0, 38.0, 48.0]
    );
    // e4m3 with sf = -0.5: -6, -8, -19 (a tie: to even, -20), -24.
    let sf = vec1(&[-0.5f32]);
    let q = reduce_fused_e4m3(&scaled.clone().with_sf(sf.view())).unwrap();
    let vals: Vec<f32> = q.as_slice().iter().map(|v| v.to_f32()).collect();
    assert_eq!(vals, vec![-6.0, -8.0, -20.0, -24.0]);
    // e4m3 without sf.
    let q = reduce_fused_e4m3(&scaled).unwrap();
    let vals: Vec<f32> = q.as_slice().iter().map(|v| v.to_f32()).collect();
    assert_eq!(vals, vec![12.0, 16.0, 40.0, 48.0]); // 38 -> 40 (grid step 4 in [32, 64), tie to even)
}

fn one_token(xs: &[f32], ws: &[f32]) -> f32 {
    let k = xs.len();
    let x = HostTensor::from_vec(xs.to_vec(), &[k, 1]).unwrap();
    let pos = HostTensor::from_vec((0..k as i32).collect(), &[1, k]).unwrap();
    let w = HostTensor::from_vec(ws.to_vec(), &[1, k]).unwrap();
    reduce_fused(&ReduceFusedInputs::new(x.view(), pos.view()).with_weights(w.view()))
        .unwrap()
        .as_slice()[0]
}

#[test]
fn fma_is_fused() {
    // acc = -1, then fma(1 + 2^-12, 1 + 2^-12, -1) = 2^-11 + 2^-24 exactly; an unfused
    // multiply rounds the product to 1 + 2^-11 first (a tie, to even) and gives 2^-11.
    let a = 1.0 + 2f32.powi(-12);
    let got = one_token(&[-1.0, a], &[1.0, a]);
    assert_eq!(got, 2f32.powi(-11) + 2f32.powi(-24));
    assert_ne!(got, a * a - 1.0);
}

#[test]
fn slot_order_is_kept() {
    // (1e8 + 1) - 1e8 = 0 in fp32 (ulp 8 at 1e8); another order would give 1.
    assert_eq!(one_token(&[1e8, 1.0, -1e8], &[1.0, 1.0, 1.0]), 0.0);
    assert_eq!(one_token(&[1e8, -1e8, 1.0], &[1.0, 1.0, 1.0]), 1.0);
}

#[test]
fn x_sf_multiplies_the_weight_before_the_fma() {
    // x = 1 + 2^-10, w = 1 + 2^-12, x_sf = 1 + 2^-13.
    // s = w·x_sf = 1 + 3·2^-13 + 2^-25, rounded to 1 + 3·2^-13;
    // fma(x, s, -1) = 2^-10 + 3·2^-13 + 3·2^-23 (exact).
    let (xv, wv, sv) = (
        1.0 + 2f32.powi(-10),
        1.0 + 2f32.powi(-12),
        1.0 + 2f32.powi(-13),
    );
    let x = mat(&[&[-1.0f32], &[xv]]);
    let pos = mat(&[&[0i32, 1]]);
    let w = mat(&[&[1.0f32, wv]]);
    let x_sf = vec1(&[1.0f32, sv]);
    let inputs = ReduceFusedInputs::new(x.view(), pos.view())
        .with_weights(w.view())
        .with_x_sf(x_sf.view());
    let got = reduce_fused(&inputs).unwrap().as_slice()[0];
    assert_eq!(
        got,
        2f32.powi(-10) + 3.0 * 2f32.powi(-13) + 3.0 * 2f32.powi(-23)
    );
    // Scaling x instead of the weight, (x·x_sf)·w, gives other bits (an extra 2^-25).
    assert_ne!(got, (xv * sv).mul_add(wv, -1.0));
}

#[test]
fn global_sf_and_empty_tokens() {
    let x = mat(&[&[3.0f32]]);
    let pos = mat(&[&[0i32, -1], &[-1, -1]]);
    let sf = vec1(&[-2.0f32]);
    let q = reduce_fused_e4m3(&ReduceFusedInputs::new(x.view(), pos.view()).with_sf(sf.view()))
        .unwrap();
    // Token 0: 3·(-2) = -6 = -(1.5·2^2): sign 1, exponent 2 + 7 = 0b1001, mantissa 0b100
    // (0xCC); token 1: +0.0 · -2 = -0.0 (0x80).
    let bits: Vec<u8> = q.as_slice().iter().map(|v| v.to_bits()).collect();
    assert_eq!(bits, vec![0xCC, 0x80]);
    let plain = reduce_fused(&ReduceFusedInputs::new(x.view(), pos.view())).unwrap();
    assert_eq!(plain.as_slice()[1].to_bits(), 0); // +0.0
}

#[test]
fn e4m3_saturates() {
    let vals = [
        500.0f32,
        464.0,
        448.0,
        -1e30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        0.001,
    ];
    let x = HostTensor::from_vec(vals.to_vec(), &[1, vals.len()]).unwrap();
    let pos = mat(&[&[0i32]]);
    let q = reduce_fused_e4m3(&ReduceFusedInputs::new(x.view(), pos.view())).unwrap();
    let bits: Vec<u8> = q.as_slice().iter().map(|v| v.to_bits()).collect();
    // Every |r| >= 448 and ±inf: ±448 (0x7E / 0xFE), never NaN; NaN: 0x7F. 0.001 is above half
    // the smallest subnormal 2^-9 ≈ 0.00195, so it rounds up to it (0x01).
    assert_eq!(bits, vec![0x7E, 0x7E, 0x7E, 0xFE, 0x7E, 0xFE, 0x7F, 0x01]);
}

#[test]
fn bf16_output_rounds_to_nearest_even() {
    let x = HostTensor::from_vec(
        vec![
            bf16::from_f32(1.0),
            bf16::from_f32(2f32.powi(-8)),
            bf16::from_f32(2f32.powi(-20)),
        ],
        &[3, 1],
    )
    .unwrap();
    // 1 + 2^-8: a tie between 1 and 1 + 2^-7 -> 1; 1 + 2^-8 + 2^-20 -> 1 + 2^-7.
    let tie = reduce_fused(&ReduceFusedInputs::new(x.view(), mat(&[&[0i32, 1]]).view())).unwrap();
    assert_eq!(tie.as_slice()[0], bf16::from_f32(1.0));
    let up = reduce_fused(&ReduceFusedInputs::new(
        x.view(),
        mat(&[&[0i32, 1, 2]]).view(),
    ))
    .unwrap();
    assert_eq!(up.as_slice()[0], bf16::from_f32(1.0 + 2f32.powi(-7)));
}

#[test]
fn zero_tokens_and_zero_hidden() {
    let x = HostTensor::<f32>::from_vec(vec![], &[0, 256]).unwrap();
    let pos = HostTensor::<i32>::from_vec(vec![], &[0, 6]).unwrap();
    assert_eq!(
        reduce_fused(&ReduceFusedInputs::new(x.view(), pos.view()))
            .unwrap()
            .shape(),
        &[0, 256]
    );
    let x = HostTensor::<f32>::from_vec(vec![], &[2, 0]).unwrap();
    let pos = mat(&[&[1i32, 0]]);
    assert_eq!(
        reduce_fused(&ReduceFusedInputs::new(x.view(), pos.view()))
            .unwrap()
            .shape(),
        &[1, 0]
    );
}

#[test]
fn rejections() {
    let (x, ttp, w) = (x4(), ttp(), w());
    let base = ReduceFusedInputs::new(x.view(), ttp.view());
    let sf = vec1(&[1.0f32]);
    assert_param(
        reduce_fused(&base.clone().with_sf(sf.view())).unwrap_err(),
        "sf",
        &["only FP8"],
    );
    let sf2 = vec1(&[1.0f32, 2.0]);
    assert_shape_err(
        reduce_fused_e4m3(&base.clone().with_sf(sf2.view())).unwrap_err(),
        "sf",
    );
    let x_sf = vec1(&[1.0f32; 3]);
    assert_shape_err(
        reduce_fused(&base.clone().with_x_sf(x_sf.view())).unwrap_err(),
        "x_sf",
    );
    let w_t = mat(&[&[1.0f32, 1.0], &[1.0, 1.0]]);
    assert_shape_err(
        reduce_fused(&base.clone().with_weights(w_t.view())).unwrap_err(),
        "topk_weights",
    );
    let _ = w;
    for (bad, words) in [
        (-2, &["-2", "only legal negative"][..]),
        (4, &["= 4", "out of range", "0..M = 4"][..]),
    ] {
        let pos = mat(&[&[2i32, -1, 0], &[1, bad, 1]]);
        let e = reduce_fused(&ReduceFusedInputs::new(x.view(), pos.view())).unwrap_err();
        assert_param(e, "token_topk_to_pos", words);
        assert!(e_arg_is(
            &reduce_fused_e4m3(&ReduceFusedInputs::new(x.view(), pos.view())).unwrap_err(),
            "token_topk_to_pos"
        ));
    }
    let x1 = vec1(&[1.0f32; 4]);
    assert_shape_err(
        reduce_fused(&ReduceFusedInputs::new(x1.view(), ttp.view())).unwrap_err(),
        "x",
    );
    let k0 = HostTensor::<i32>::from_vec(vec![], &[2, 0]).unwrap();
    let e = reduce_fused(&ReduceFusedInputs::new(x.view(), k0.view())).unwrap_err();
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
    // Dtype (through the shared validation).
    let l = Layout::contiguous(&[4, 2]);
    let p = Layout::contiguous(&[2, 3]);
    let layouts = ReduceFusedLayouts {
        x: &l,
        x_sf: None,
        topk_weights: None,
        token_topk_to_pos: &p,
        sf: None,
    };
    let e = ReduceFusedParams::new(ReduceOut::Input)
        .validate(&layouts, DType::E4M3)
        .unwrap_err();
    assert!(matches!(e, TkError::Dtype { arg: "x", .. }), "{e:?}");
    assert!(ReduceFusedParams::new(ReduceOut::E4m3)
        .validate(&layouts, DType::BF16)
        .is_ok());
}

fn e_arg_is(e: &TkError, arg: &str) -> bool {
    e.arg() == Some(arg)
}

fn grid_case<T: ReduceElement>(name: &str, conv: impl Fn(f32) -> T) {
    for p in grid() {
        let idx = topk_idx_sub("reduce_fused", &p, 64);
        let (t, k) = (idx.shape()[0], idx.shape()[1]);
        let h = 256;
        let map = get_fused_mapping(
            &idx.view(),
            &GetFusedMappingParams::host_sync(p.num_experts, 1),
        )
        .unwrap();
        let mut rng = Rng::for_case(&format!("reduce_fused {name} {}", p.name()));
        let x = rng.randn(&[t * k, h], &conv);
        let xf: Vec<f32> = x.as_slice().iter().map(|v| v.to_f32()).collect();
        let w = HostTensor::from_fn(&[t, k], |_| rng.uniform());
        let x_sf = rng.randn(&[t * k], |v| v);
        let sf = rng.randn(&[1], |v| v);
        let pos = map.token_topk_to_pos.as_slice();
        for with_w in [false, true] {
            for with_xsf in [false, true] {
                let what = format!("{name} {} w={with_w} x_sf={with_xsf}", p.name());
                let mut inputs = ReduceFusedInputs::new(x.view(), map.token_topk_to_pos.view());
                if with_w {
                    inputs = inputs.with_weights(w.view());
                }
                if with_xsf {
                    inputs = inputs.with_x_sf(x_sf.view());
                }
                let wv = with_w.then_some(w.as_slice());
                let sv = with_xsf.then_some(x_sf.as_slice());
                // Output in the input dtype.
                let expected: Vec<T> = naive_reduce(&xf, h, sv, wv, pos, k, None)
                    .into_iter()
                    .map(T::from_f32_rne)
                    .collect();
                assert_bits_eq(&what, reduce_fused(&inputs).unwrap().as_slice(), &expected);
                // e4m3 with the global sf.
                let expected: Vec<F8E4M3> =
                    naive_reduce(&xf, h, sv, wv, pos, k, Some(sf.as_slice()[0]))
                        .into_iter()
                        .map(|v| F8E4M3::from_bits(e4m3_from_f32(v)))
                        .collect();
                let got = reduce_fused_e4m3(&inputs.clone().with_sf(sf.view())).unwrap();
                assert_bits_eq(&format!("{what} e4m3"), got.as_slice(), &expected);
            }
        }
    }
}

#[test]
fn moe12_grid_fp32() {
    grid_case::<f32>("fp32", |v| v);
}

#[test]
fn moe12_grid_bf16() {
    grid_case::<bf16>("bf16", bf16::from_f32);
}
