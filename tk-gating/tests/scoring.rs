//! Scoring functions (`spec/moe.md` §4.1): names and parsing, hand-computed values, the softplus
//! threshold, softmax's summation order and overflow safety, and accuracy against f64 within the
//! documented ulp bounds.
#![cfg(feature = "cpu")]

mod common;

use common::{assert_param, score_f64, softplus_f64};
use tk_core::testing::Rng;
use tk_gating::scoring::{
    expf, log1pf, sigmoid, softmax_into, softplus, sqrt_softplus, warp_sum, ScoringFunc,
};
use tk_gating::testing::ulp_distance;

#[test]
fn names_values_and_parsing() {
    let names = ["sigmoid", "sqrtsoftplus", "softmax", "identity"];
    for (i, f) in ScoringFunc::ALL.into_iter().enumerate() {
        assert_eq!(f.value(), i as i32);
        assert_eq!(f.to_string(), names[i]);
        assert_eq!(ScoringFunc::from_label(names[i]).unwrap(), f);
        assert_eq!(names[i].to_uppercase().parse::<ScoringFunc>().unwrap(), f);
    }
    assert_eq!(
        "SqrtSoftPlus".parse::<ScoringFunc>().unwrap(),
        ScoringFunc::SqrtSoftplus
    );
    for bad in ["", "relu", "sigmoid ", "soft_max"] {
        assert_param(
            bad.parse::<ScoringFunc>().unwrap_err(),
            "scoring_func",
            &["unknown"],
        );
    }
    assert!(ScoringFunc::Sigmoid.is_elementwise() && !ScoringFunc::Softmax.is_elementwise());
    assert_eq!(ScoringFunc::Softmax.score(1.0), None);
    assert_eq!(ScoringFunc::Identity.score(-3.5), Some(-3.5));
}

#[test]
fn hand_values() {
    assert_eq!(sigmoid(0.0), 0.5);
    assert_eq!(sigmoid(f32::NEG_INFINITY), 0.0);
    assert_eq!(sigmoid(f32::INFINITY), 1.0);
    assert_eq!(sigmoid(-200.0), 0.0); // exp(200) overflows fp32: 1 / inf
    assert!(sigmoid(f32::NAN).is_nan());
    // sigmoid(ln 3) = 1/(1 + 1/3) = 0.75, to the ulp.
    assert!(ulp_distance(sigmoid(3f32.ln()), 0.75) <= 1);
    assert_eq!(expf(0.0), 1.0);
    assert_eq!(log1pf(0.0), 0.0);
    // softplus(0) = ln 2 correctly rounded, sqrt-softplus(0) = sqrt(fl(ln 2)).
    assert_eq!(softplus(0.0), std::f32::consts::LN_2);
    assert_eq!(sqrt_softplus(0.0), std::f32::consts::LN_2.sqrt());
    assert_eq!(
        ScoringFunc::SqrtSoftplus.score(0.0),
        Some(sqrt_softplus(0.0))
    );
    assert_eq!(ScoringFunc::Sigmoid.score(0.0), Some(0.5));
}

#[test]
fn softplus_threshold() {
    // Near 20 both branches round to the same fp32 value (log1p(exp(x)) = x + 2e-9), so the
    // strictness of `x > 20` is not observable there; check each side against its branch.
    for x in [19.5f32, 19.999998, 20.0] {
        assert_eq!(softplus(x), log1pf(expf(x)), "x = {x}");
    }
    for x in [20.000002f32, 20.5, 50.0] {
        assert_eq!(softplus(x), x, "x = {x}");
    }
    // The threshold is what keeps large inputs finite: log1p(exp(100)) overflows to inf.
    for x in [89.0f32, 100.0] {
        assert_eq!(softplus(x), x);
        assert_eq!(log1pf(expf(x)), f32::INFINITY);
    }
    // Below the threshold the function is not the identity.
    assert_ne!(softplus(5.0), 5.0);
    assert_eq!(softplus(f32::INFINITY), f32::INFINITY);
    assert_eq!(softplus(f32::NEG_INFINITY), 0.0);
    assert!(softplus(f32::NAN).is_nan());
    assert!(sqrt_softplus(f32::NAN).is_nan());
}

#[test]
fn softmax_hand_values() {
    let mut out = [0f32; 4];
    softmax_into(&[0.0; 4], &mut out);
    assert_eq!(out, [0.25; 4]);
    // Shift invariance without overflow: exp(1000) would be inf, exp(x - max) is not.
    let mut two = [0f32; 2];
    softmax_into(&[1000.0, 1000.0], &mut two);
    assert_eq!(two, [0.5, 0.5]);
    softmax_into(&[f32::MAX, -f32::MAX], &mut two);
    assert_eq!(two, [1.0, 0.0]);
    // ln 3 and 0: p = (3, 1) / 4 to the ulp.
    softmax_into(&[3f32.ln(), 0.0], &mut two);
    assert!(ulp_distance(two[0], 0.75) <= 1 && ulp_distance(two[1], 0.25) <= 1);
    // Non-finite rows: NaN or +inf anywhere makes the row NaN; -inf entries get 0.
    softmax_into(&[1.0, f32::NAN], &mut two);
    assert!(two.iter().all(|v| v.is_nan()));
    softmax_into(&[1.0, f32::INFINITY], &mut two);
    assert!(two.iter().all(|v| v.is_nan()));
    softmax_into(&[1.0, f32::NEG_INFINITY], &mut two);
    assert_eq!(two, [1.0, 0.0]);
    // Length mismatch: nothing written.
    let mut three = [7f32; 3];
    softmax_into(&[0.0; 2], &mut three);
    assert_eq!(three, [7.0; 3]);
    // score_row dispatches to the same function.
    let mut via = [0f32; 2];
    ScoringFunc::Softmax.score_row(&[3f32.ln(), 0.0], &mut via);
    softmax_into(&[3f32.ln(), 0.0], &mut two);
    assert_eq!(via, two);
}

/// The documented order, re-implemented from its description: lane l sums elements with
/// (j / 4) % 32 == l in increasing j, then pairs (l, l ^ 16), (l, l ^ 8), ... are added.
fn documented_warp_sum(v: &[f32]) -> f32 {
    let mut lanes: Vec<f32> = (0..32)
        .map(|l| {
            v.iter()
                .enumerate()
                .filter(|(j, _)| (j / 4) % 32 == l)
                .fold(0.0f32, |a, (_, &x)| a + x)
        })
        .collect();
    for off in [16, 8, 4, 2, 1] {
        lanes = (0..32).map(|l| lanes[l] + lanes[l ^ off]).collect();
    }
    lanes[0]
}

#[test]
fn softmax_denominator_uses_the_warp_order() {
    let mut rng = Rng::for_case("softmax_denominator_uses_the_warp_order");
    for e in [1usize, 3, 4, 6, 16, 72, 127, 128, 129, 160, 256, 384, 1000] {
        for _ in 0..5 {
            let x: Vec<f32> = (0..e).map(|_| rng.normal() * 3.0).collect();
            let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let ex: Vec<f32> = x.iter().map(|&v| expf(v - m)).collect();
            let z = documented_warp_sum(&ex);
            assert_eq!(warp_sum(&ex).to_bits(), z.to_bits(), "E = {e}");
            let mut p = vec![0f32; e];
            softmax_into(&x, &mut p);
            for j in 0..e {
                assert_eq!(p[j].to_bits(), (ex[j] / z).to_bits(), "E = {e}, j = {j}");
            }
        }
    }
    // A case where the order matters (the sequential sum differs).
    let v = [16_777_216.0f32, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
    assert_eq!(documented_warp_sum(&v), 16_777_220.0);
    assert_eq!(warp_sum(&v), 16_777_220.0);
}

#[test]
fn elementwise_accuracy_against_f64() {
    // Documented bounds against the real functions: sigmoid <= 3 ulp (three roundings),
    // softplus <= 2 ulp, sqrt-softplus <= 2 ulp.
    let mut worst = [0u64; 3];
    let mut rng = Rng::for_case("elementwise_accuracy_against_f64");
    let mut xs: Vec<f32> = (0..20_000).map(|_| rng.normal() * 8.0).collect();
    xs.extend((-400..=400).map(|i| i as f32 * 0.0625));
    xs.extend([
        19.999998, 20.0, 20.000002, 25.0, -80.0, -87.0, 1e-30, -1e-30, 0.0, -0.0,
    ]);
    for &x in &xs {
        let s = sigmoid(x);
        let s64 = 1.0 / (1.0 + (-(x as f64)).exp());
        worst[0] = worst[0].max(ulp_distance(s, s64 as f32));
        let sp = softplus(x);
        let sp64 = if x > 20.0 {
            x as f64
        } else {
            softplus_f64(x as f64)
        };
        worst[1] = worst[1].max(ulp_distance(sp, sp64 as f32));
        worst[2] = worst[2].max(ulp_distance(sqrt_softplus(x), sp64.sqrt() as f32));
    }
    assert!(worst[0] <= 3, "sigmoid: {} ulp", worst[0]);
    assert!(worst[1] <= 2, "softplus: {} ulp", worst[1]);
    assert!(worst[2] <= 2, "sqrt-softplus: {} ulp", worst[2]);
    // ... and the functions are not trivially exact in f64 arithmetic: at least one sigmoid
    // value differs from the correctly rounded real value (three fp32 roundings).
    assert!(worst[0] >= 1);
}

#[test]
fn softmax_accuracy_against_f64() {
    // Relative error bound (units of 2^-24): |x_j - m| (the subtraction's rounding, amplified
    // by exp) + 1 (exp) + 7 (lane sums of <= ceil(E/128)*4 terms, then 5 butterfly levels, all
    // relative to Z... bounded loosely) + 1 (division); checked as ulp <= 2 * that.
    let mut rng = Rng::for_case("softmax_accuracy_against_f64");
    for e in [4usize, 16, 72, 160, 256, 384] {
        for _ in 0..20 {
            let x: Vec<f32> = (0..e).map(|_| rng.normal() * 2.0).collect();
            let mut p = vec![0f32; e];
            ScoringFunc::Softmax.score_row(&x, &mut p);
            let p64 = score_f64(ScoringFunc::Softmax, &x);
            let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let lane_terms = e.div_ceil(128) * 4;
            for j in 0..e {
                let bound = 2 * (((x[j] - m).abs().ceil() as u64) + 1 + lane_terms as u64 + 5 + 1);
                let d = ulp_distance(p[j], p64[j] as f32);
                assert!(d <= bound, "E = {e}, j = {j}: {d} ulp > {bound}");
            }
        }
    }
}
