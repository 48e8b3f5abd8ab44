//! `swiglu_backward_and_per_token_cast` (`spec/quant.md` §3.11, §5, Appendix A.2): every
//! rejection, a hand-computed example, the exact operation order (the one FMA) against an
//! independent implementation written from the spec with `f32::mul_add`, an independent check
//! that `f32::mul_add` is a true single-rounding FMA, the clamp and sign edge cases, and
//! agreement with the generic `reference::cast` for `x_grad_fp8`.
#![cfg(feature = "cpu")]

mod common;
mod op_common;

use float8::F8E4M3;
use half::bf16;
use op_common::{assert_err, e4m3_data};
use std::sync::atomic::{AtomicUsize, Ordering};
use tk_core::testing::Rng;
use tk_core::HostTensor;
use tk_quant::reference::swiglu::{clamp_gate, cpu_expf};
use tk_quant::reference::{
    cast, per_token_cast, swiglu_backward_and_per_token_cast,
    swiglu_backward_and_per_token_cast_with_expf, swiglu_backward_element,
    swiglu_backward_grad_with_expf, BackwardElement, SwigluBackwardGrad, SwigluBackwardOutput,
};
use tk_quant::swiglu_backward_and_per_token_cast::{validate, validate_dims};
use tk_quant::{
    CastFormat, CastInput, PerTokenCastParams, QuantDataView, ScaleOptions,
    SwigluBackwardInputs as Inputs, SwigluBackwardParams as Params,
};

/// Everything a case owns.
struct Case {
    xq: HostTensor<F8E4M3>,
    xs: HostTensor<f32>,
    grad: HostTensor<bf16>,
    weight: HostTensor<f32>,
    p2t: HostTensor<i32>,
    t2p: HostTensor<i32>,
}

impl Case {
    /// Row `i`'s weight: its routing slot's, 0 for a padding row.
    fn row_weight(&self, i: usize) -> f32 {
        let p = self.p2t.as_slice()[i];
        if p >= 0 {
            self.weight.as_slice()[p as usize]
        } else {
            0.0
        }
    }

    /// The dequantized `x[i, col]` (`npc` columns per input scale).
    fn deq(&self, i: usize, col: usize, npc: usize) -> f32 {
        let two_h = self.xq.shape()[1];
        tk_core::convert::e4m3_to_f32(self.xq.as_slice()[i * two_h + col].to_bits())
            * self.xs.as_slice()[i * (two_h / npc) + col / npc]
    }

    fn inputs(&self) -> Inputs<'_> {
        Inputs {
            x: QuantDataView::E4M3(self.xq.view()),
            x_sf: self.xs.view(),
            grad_out: self.grad.view(),
            weight: self.weight.view(),
            pos_to_token_topk: self.p2t.view(),
            token_topk_to_pos: self.t2p.view(),
        }
    }
}

/// `t` tokens with `k` slots each, routed to `n` rows (slot order shuffled); rows without a
/// slot are padding; some slots are unrouted (−1). x is a per-token cast of randn with
/// non-rounded scales, as upstream's test builds it.
fn random_case(rng: &mut Rng, t: usize, k: usize, h: usize, npc: usize) -> Case {
    let mut slots: Vec<usize> = (0..t * k).collect();
    for i in (1..slots.len()).rev() {
        slots.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let routed = &slots[..t * k - 2]; // two slots stay unrouted
    let n = routed.len() + 3; // three padding rows
    let mut p2t = vec![-1i32; n];
    let mut t2p = vec![-1i32; t * k];
    for (j, &s) in routed.iter().enumerate() {
        let row = j + (j >= 4) as usize + (j >= 7) as usize * 2; // padding rows at 4, 8, 9
        p2t[row] = s as i32;
        t2p[s] = row as i32;
    }
    let x = rng.randn(&[n, 2 * h], |v| v);
    let (q, sf) = per_token_cast(
        &CastInput::from(x.view()),
        &PerTokenCastParams::new(CastFormat::E4M3, npc, ScaleOptions::row_major(false)),
    )
    .unwrap();
    Case {
        xq: q.as_e4m3().unwrap().clone(),
        xs: HostTensor::from_vec(sf.to_grid(), &[n, 2 * h / npc]).unwrap(),
        grad: rng.randn(&[n, h], bf16::from_f32),
        weight: HostTensor::from_fn(&[t, k], |_| rng.uniform()),
        p2t: HostTensor::from_vec(p2t, &[n]).unwrap(),
        t2p: HostTensor::from_vec(t2p, &[t, k]).unwrap(),
    }
}

/// The op's `out` and `x_grad` at row `i`, gate column `j` are element `e`'s, rounded to bf16.
fn assert_element(o: &SwigluBackwardOutput, i: usize, j: usize, e: &BackwardElement) {
    let h = o.out.shape()[1];
    let at = |v: &HostTensor<bf16>, idx: usize| v.as_slice()[idx].to_bits();
    assert_eq!(
        at(&o.out, i * h + j),
        bf16::from_f32(e.out).to_bits(),
        "out[{i}, {j}]"
    );
    assert_eq!(
        at(&o.x_grad, i * 2 * h + j),
        bf16::from_f32(e.dx).to_bits(),
        "dx[{i}, {j}]"
    );
    assert_eq!(
        at(&o.x_grad, i * 2 * h + h + j),
        bf16::from_f32(e.dy).to_bits(),
        "dy[{i}, {j}]"
    );
}

/// The spec's §3.11 steps, written independently: `(out, dX, dY, act)` in fp32.
fn independent(x: f32, y: f32, g: f32, w: f32, c: Option<f32>) -> (f32, f32, f32, f32) {
    let (mut x, mut y) = (x, y);
    let (mut cx, mut cy) = (false, false);
    if let Some(c) = c {
        if x > c {
            x = c;
            cx = true;
        }
        if y > c {
            y = c;
            cy = true;
        } else if y < -c {
            y = -c;
            cy = true;
        }
    }
    let e = ((-x) as f64).exp() as f32;
    let t = 1.0f32 + e;
    let s = 1.0f32 / t;
    let act = (x / t) * y;
    let gws = (g * w) * s;
    let one_minus_s = 1.0f32 - s;
    let fma = f32::mul_add(x, one_minus_s, 1.0);
    let dx = if cx { 0.0 } else { (gws * y) * fma };
    let dy = if cy { 0.0 } else { gws * x };
    (act * w, dx, dy, act)
}

/// `fma(a, b, c)` with one rounding, without `mul_add`: the exact product in f64, the sum
/// rounded to odd in f64 (TwoSum error term), then one rounding to f32 (correct, since f64
/// has more than 24 + 2 bits).
fn fma_round_to_odd(a: f32, b: f32, c: f32) -> f32 {
    let p = a as f64 * b as f64; // exact: 48 bits
    let c = c as f64;
    let s = p + c;
    let bb = s - p;
    let err = (p - (s - bb)) + (c - bb); // exact: p + c = s + err
    let s = if err != 0.0 && s.to_bits() & 1 == 0 {
        let up = (err > 0.0) == (s > 0.0);
        f64::from_bits(if up { s.to_bits() + 1 } else { s.to_bits() - 1 })
    } else {
        s
    };
    s as f32
}

#[test]
fn mul_add_is_a_single_rounding() {
    let mut rng = Rng::for_case("swiglu_bwd/fma");
    let mut differs_from_unfused = 0;
    for _ in 0..20000 {
        let x = rng.normal() * 3.0;
        let s = rng.uniform();
        let om = 1.0 - s;
        let f = f32::mul_add(x, om, 1.0);
        assert_eq!(
            f.to_bits(),
            fma_round_to_odd(x, om, 1.0).to_bits(),
            "{x} {om}"
        );
        differs_from_unfused += (f.to_bits() != (x * om + 1.0).to_bits()) as usize;
    }
    // The FMA matters: a contracted-nothing evaluation differs for many inputs.
    assert!(differs_from_unfused > 1000, "{differs_from_unfused}");
}

#[test]
fn element_follows_the_spec_order() {
    let mut rng = Rng::for_case("swiglu_bwd/element");
    let mut fma_visible = 0;
    for _ in 0..20000 {
        let (x, y, g, w) = (
            rng.normal() * 3.0,
            rng.normal() * 3.0,
            rng.normal(),
            rng.uniform(),
        );
        for c in [None, Some(10.0), Some(0.5)] {
            let e = swiglu_backward_element(x, y, g, w, c, &cpu_expf);
            let (out, dx, dy, act) = independent(x, y, g, w, c);
            assert_eq!(
                [e.out, e.dx, e.dy, e.act].map(f32::to_bits),
                [out, dx, dy, act].map(f32::to_bits),
                "x {x} y {y} g {g} w {w} c {c:?}"
            );
        }
        // How often an unfused dX would differ (so the check above has teeth).
        let t = 1.0f32 + cpu_expf(-x);
        let s = 1.0 / t;
        let gws = (g * w) * s;
        fma_visible += (((gws * y) * (x * (1.0 - s) + 1.0)).to_bits()
            != swiglu_backward_element(x, y, g, w, None, &cpu_expf)
                .dx
                .to_bits()) as usize;
    }
    assert!(fma_visible > 100, "{fma_visible}");
}

#[test]
fn hand_example() {
    // X = 0 (e4m3 0x00), Y = 2 (0x40, scale 1): t = 2, s = 0.5, act = 0;
    // g = 1, w = 0.5: gws = 0.25, dX = fl(0.25·2)·fma(0, 0.5, 1) = 0.5, dY = 0.25·0 = 0.
    // Row 1 has no routing slot: w = 0, everything ±0. npc = 32, H = 32.
    let (h, npc) = (32, 32);
    let mut bytes = vec![0u8; 2 * 2 * h];
    bytes[h..2 * h].fill(0x40);
    bytes[2 * h + h..].fill(0xC0); // row 1: X = 0, Y = -2
    let case = Case {
        xq: e4m3_data(2, 2 * h, &bytes),
        xs: HostTensor::from_vec(vec![1.0f32; 4], &[2, 2]).unwrap(),
        grad: HostTensor::from_fn(&[2, h], |_| bf16::ONE),
        weight: HostTensor::from_vec(vec![0.5f32, 0.25], &[1, 2]).unwrap(),
        p2t: HostTensor::from_vec(vec![0, -1], &[2]).unwrap(),
        t2p: HostTensor::from_vec(vec![0, -1], &[1, 2]).unwrap(),
    };
    let o =
        swiglu_backward_and_per_token_cast(&case.inputs(), &Params::new(npc, false, None)).unwrap();
    let xg: Vec<f32> = o.x_grad.as_slice().iter().map(|v| v.to_f32()).collect();
    assert!(xg[..h].iter().all(|&v| v == 0.5));
    assert!(xg[h..2 * h].iter().all(|&v| v.to_bits() == 0));
    assert!(o.out.as_slice().iter().all(|v| v.to_f32() == 0.0));
    // Row 1: gws = (1·0)·0.5 = +0; dX = fl(0·-2)·1 = -0; dY = 0·0 = +0.
    assert!(xg[2 * h..3 * h]
        .iter()
        .all(|&v| v.to_bits() == (-0.0f32).to_bits()));
    assert!(xg[3 * h..].iter().all(|&v| v.to_bits() == 0));
    // x_grad_fp8: row 0 group 0 amax 0.5: sf = 0.5/448, data 448 = 0x7E; zero groups ε/Q.
    assert_eq!(o.x_grad_fp8_sf.get(0, 0), Some(0.5f32 / 448.0));
    assert_eq!(o.x_grad_fp8_sf.get(0, 1), Some(1e-4f32 / 448.0));
    let b = o.x_grad_fp8.bytes();
    assert!(b[..h].iter().all(|&c| c == 0x7E));
    assert!(b[2 * h..3 * h].iter().all(|&c| c == 0x80));
    // weight_grad: slot 0 = Σ g·act = 0; slot 1 (−1) = 0.
    assert_eq!(o.weight_grad.as_slice(), &[0.0, 0.0]);
    // Clamp C = 0.5: Y = 2 -> 0.5 (dY zeroed anyway); X = 0 not clamped: dX = fl(0.25·0.5) = 0.125.
    let o = swiglu_backward_and_per_token_cast(&case.inputs(), &Params::new(npc, false, Some(0.5)))
        .unwrap();
    assert_eq!(o.x_grad.as_slice()[0].to_f32(), 0.125);
}

#[test]
fn op_equals_independent_implementation() {
    let mut rng = Rng::for_case("swiglu_bwd/op");
    for npc in [32, 128] {
        let (t, k, h) = (5, 2, 256);
        let case = random_case(&mut rng, t, k, h, npc);
        let n = case.p2t.shape()[0];
        for round in [false, true] {
            for c in [None, Some(10.0), Some(0.5)] {
                let o =
                    swiglu_backward_and_per_token_cast(&case.inputs(), &Params::new(npc, round, c))
                        .unwrap();
                let mut out = vec![];
                let mut grad = vec![0.0f32; n * 2 * h];
                let mut wg = vec![0.0f32; t * k];
                for i in 0..n {
                    let p = case.p2t.as_slice()[i];
                    let w = case.row_weight(i);
                    let deq = |col: usize| case.deq(i, col, npc);
                    let mut sum = 0.0f32;
                    for j in 0..h {
                        let g = case.grad.as_slice()[i * h + j].to_f32();
                        let (o_, dx, dy, act) = independent(deq(j), deq(h + j), g, w, c);
                        out.push(bf16::from_f32(o_));
                        grad[i * 2 * h + j] = dx;
                        grad[i * 2 * h + h + j] = dy;
                        sum += g * act;
                    }
                    if p >= 0 {
                        wg[p as usize] = sum;
                    }
                }
                let bits16 = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits16(o.out.as_slice()), bits16(&out));
                let xg: Vec<bf16> = grad.iter().map(|&v| bf16::from_f32(v)).collect();
                assert_eq!(bits16(o.x_grad.as_slice()), bits16(&xg));
                let g = HostTensor::from_vec(grad, &[n, 2 * h]).unwrap();
                let (rq, rsf) = cast(
                    &CastInput::from(g.view()),
                    CastFormat::E4M3,
                    (1, npc),
                    ScaleOptions::row_major(round),
                )
                .unwrap();
                assert_eq!((&o.x_grad_fp8, &o.x_grad_fp8_sf), (&rq, &rsf));
                // weight_grad: the spec's tolerance against a plain f32 sum; unrouted slots 0.
                for (p, (&a, &b)) in o.weight_grad.as_slice().iter().zip(&wg).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-4 + 1e-4 * b.abs(),
                        "slot {p}: {a} vs {b}"
                    );
                    if case.t2p.as_slice()[p] == -1 {
                        assert_eq!(a.to_bits(), 0);
                    }
                }
                // Clamped elements have zero gradients.
                if let Some(c) = c {
                    for i in 0..n {
                        for j in 0..h {
                            let xv = tk_core::convert::e4m3_to_f32(
                                case.xq.as_slice()[i * 2 * h + j].to_bits(),
                            ) * case.xs.as_slice()[i * (2 * h / npc) + j / npc];
                            if xv > c {
                                assert_eq!(o.x_grad.as_slice()[i * 2 * h + j].to_bits(), 0);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Rows split over threads (a case above the reference's parallel threshold): `expf` is asked
/// exactly once per element `e = i · H + j` with that element's `−X`, and the outputs are the
/// element function's, row by row (`weight_grad` the same f64 sum).
#[test]
fn rows_in_parallel_ask_expf_by_element() {
    let mut rng = Rng::for_case("swiglu_bwd/parallel");
    let (t, k, h, npc) = (64, 2, 2048, 128);
    let case = random_case(&mut rng, t, k, h, npc);
    let n = case.p2t.shape()[0];
    let c = Some(0.5);
    let deq = |i: usize, col: usize| case.deq(i, col, npc);
    let args: Vec<f32> = (0..n * h)
        .map(|e| -clamp_gate(deq(e / h, e % h), c).0)
        .collect();
    let calls = AtomicUsize::new(0);
    let p = Params::new(npc, true, c);
    let o = swiglu_backward_and_per_token_cast_with_expf(&case.inputs(), &p, &|e, v| {
        assert_eq!(v.to_bits(), args[e].to_bits(), "element {e}");
        calls.fetch_add(1, Ordering::Relaxed);
        cpu_expf(v)
    })
    .unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), n * h);
    let mut wg = vec![0.0f32; t * k];
    for i in 0..n {
        let pi = case.p2t.as_slice()[i];
        let w = case.row_weight(i);
        let mut sum = 0.0f64;
        for j in 0..h {
            let g = case.grad.as_slice()[i * h + j].to_f32();
            let e = swiglu_backward_element(deq(i, j), deq(i, h + j), g, w, c, &cpu_expf);
            assert_element(&o, i, j, &e);
            sum += g as f64 * e.act as f64;
        }
        if pi >= 0 {
            wg[pi as usize] = sum as f32;
        }
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(o.weight_grad.as_slice()), bits(&wg));
}

/// The gradient computed once and cast for each rounding is the op's output for that rounding
/// (a multi-thread case: `x_grad`'s bf16 rows in parallel).
#[test]
fn grad_then_cast_is_the_op() {
    let mut rng = Rng::for_case("swiglu_bwd/grad");
    let (t, k, h, npc) = (64, 2, 2048, 32);
    let case = random_case(&mut rng, t, k, h, npc);
    let expf = |_: usize, v: f32| cpu_expf(v);
    let g = swiglu_backward_grad_with_expf(&case.inputs(), &Params::new(npc, false, None), &expf)
        .unwrap();
    let x_grad = g.x_grad().unwrap();
    for round in [false, true] {
        let o = swiglu_backward_and_per_token_cast(&case.inputs(), &Params::new(npc, round, None))
            .unwrap();
        assert_eq!(g.cast(npc, round).unwrap(), (o.x_grad_fp8, o.x_grad_fp8_sf));
        let bits16 = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits16(x_grad.as_slice()), bits16(o.x_grad.as_slice()));
        assert_eq!(bits16(g.out.as_slice()), bits16(o.out.as_slice()));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(g.weight_grad.as_slice()),
            bits(o.weight_grad.as_slice())
        );
    }
}

#[test]
fn a_foreign_expf_changes_only_what_depends_on_it() {
    // The GPU tests run the reference with the GPU's expf; here a one-ulp-up expf must be
    // reproduced exactly by the element function with the same expf.
    let mut rng = Rng::for_case("swiglu_bwd/foreign");
    let case = random_case(&mut rng, 4, 2, 128, 128);
    let other = |v: f32| {
        let e = cpu_expf(v);
        if e.is_finite() {
            f32::from_bits(e.to_bits() + 1)
        } else {
            e
        }
    };
    let p = Params::new(128, true, None);
    let a =
        swiglu_backward_and_per_token_cast_with_expf(&case.inputs(), &p, &|_, v| other(v)).unwrap();
    let h = 128;
    let n = case.p2t.shape()[0];
    let mut fp32_changes = 0;
    for i in 0..n {
        let deq = |col: usize| case.deq(i, col, 128);
        let w = case.row_weight(i);
        for j in 0..h {
            let g = case.grad.as_slice()[i * h + j].to_f32();
            let e = swiglu_backward_element(deq(j), deq(h + j), g, w, None, &other);
            let e0 = swiglu_backward_element(deq(j), deq(h + j), g, w, None, &cpu_expf);
            fp32_changes += (e.dx.to_bits() != e0.dx.to_bits()) as usize;
            assert_element(&a, i, j, &e);
        }
    }
    assert!(fp32_changes > 0);
}

#[test]
fn rejections_name_the_argument() {
    let mut rng = Rng::for_case("swiglu_bwd/reject");
    let case = random_case(&mut rng, 4, 2, 128, 32);
    let p = Params::new(32, false, None);
    assert!(validate(&case.inputs(), &p).is_ok());
    for npc in [0, 16, 64, 256] {
        assert_err(
            validate_dims(4, 256, &Params::new(npc, false, None)).unwrap_err(),
            "Param",
            "num_per_channels",
        );
    }
    assert_err(
        validate_dims(4, 192, &Params::new(128, false, None)).unwrap_err(),
        "Shape",
        "x",
    );
    assert_err(validate_dims(4, 96, &p).unwrap_err(), "Shape", "x");
    for c in [f32::NAN, -0.5] {
        assert_err(
            validate_dims(4, 256, &Params::new(32, false, Some(c))).unwrap_err(),
            "Param",
            "swiglu_clamp_value",
        );
    }
    // npc must match the input scales: 2H/npc columns.
    assert_err(
        validate(&case.inputs(), &Params::new(128, false, None)).unwrap_err(),
        "Shape",
        "x_sf",
    );
    let mut i = case.inputs();
    let e2m1 = HostTensor::from_vec(vec![tk_core::dtype::E2M1x2(0); 128], &[1, 128]).unwrap();
    i.x = QuantDataView::E2M1(e2m1.view());
    assert_err(validate(&i, &p).unwrap_err(), "Dtype", "x");
    let g = HostTensor::from_fn(&[case.p2t.shape()[0], 64], |_| bf16::ONE);
    let mut i = case.inputs();
    i.grad_out = g.view();
    assert_err(validate(&i, &p).unwrap_err(), "Shape", "grad_out");
    let w1 = HostTensor::from_vec(vec![1.0f32; 8], &[8]).unwrap();
    let mut i = case.inputs();
    i.weight = w1.view();
    assert_err(validate(&i, &p).unwrap_err(), "Shape", "weight");
    let t2p = HostTensor::from_vec(vec![-1i32; 8], &[2, 4]).unwrap();
    let mut i = case.inputs();
    i.token_topk_to_pos = t2p.view();
    assert_err(validate(&i, &p).unwrap_err(), "Shape", "token_topk_to_pos");
    let short = HostTensor::from_vec(vec![-1i32; 3], &[3]).unwrap();
    let mut i = case.inputs();
    i.pos_to_token_topk = short.view();
    assert_err(validate(&i, &p).unwrap_err(), "Shape", "pos_to_token_topk");
    // Map contents: out of range, not inverse (both directions), entries below -1.
    let n = case.p2t.shape()[0];
    let edit_p2t = |f: &dyn Fn(&mut Vec<i32>)| {
        let mut v = case.p2t.as_slice().to_vec();
        f(&mut v);
        HostTensor::from_vec(v, &[n]).unwrap()
    };
    let edit_t2p = |f: &dyn Fn(&mut Vec<i32>)| {
        let mut v = case.t2p.as_slice().to_vec();
        f(&mut v);
        HostTensor::from_vec(v, &[4, 2]).unwrap()
    };
    let bad = edit_p2t(&|v| v[0] = 8);
    let mut i = case.inputs();
    i.pos_to_token_topk = bad.view();
    assert_err(validate(&i, &p).unwrap_err(), "Param", "pos_to_token_topk");
    let first = case.p2t.as_slice().iter().position(|&p| p >= 0).unwrap();
    let dup = edit_p2t(&|v| {
        let other = v.iter().rposition(|&p| p >= 0).unwrap();
        v[other] = v[first];
    });
    let mut i = case.inputs();
    i.pos_to_token_topk = dup.view();
    assert_err(validate(&i, &p).unwrap_err(), "Param", "token_topk_to_pos");
    let slot = case.p2t.as_slice()[first] as usize;
    for val in [-2, n as i32, -1] {
        let t = edit_t2p(&|v| v[slot] = val);
        let mut i = case.inputs();
        i.token_topk_to_pos = t.view();
        assert_err(validate(&i, &p).unwrap_err(), "Param", "token_topk_to_pos");
    }
}

#[test]
fn empty_input() {
    let case = Case {
        xq: e4m3_data(0, 256, &[]),
        xs: HostTensor::from_vec(vec![], &[0, 2]).unwrap(),
        grad: HostTensor::from_vec(vec![], &[0, 128]).unwrap(),
        weight: HostTensor::from_vec(vec![1.0f32; 4], &[2, 2]).unwrap(),
        p2t: HostTensor::from_vec(vec![], &[0]).unwrap(),
        t2p: HostTensor::from_vec(vec![-1i32; 4], &[2, 2]).unwrap(),
    };
    let o =
        swiglu_backward_and_per_token_cast(&case.inputs(), &Params::new(128, true, None)).unwrap();
    assert_eq!(o.x_grad_fp8.shape(), [0, 256]);
    assert_eq!(o.weight_grad.as_slice(), &[0.0; 4]);
}

#[test]
fn grad_cast_is_the_generic_cast() {
    // `SwigluBackwardGrad::cast` (the row cast, one pass per row) against the generic
    // reference `cast` with block (1, npc), on random rows with special values mixed in
    // (NaN, infinities, signed zeros, values beyond 448 and below e4m3's subnormals), an
    // all-zero row, and a partial last group (K = 3 · 32 + 16).
    let mut rng = Rng::for_case("swiglu_bwd/grad_cast");
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        0.0,
        1e6,
        -3e-12,
        448.0,
    ];
    for (m, k) in [(9, 256), (5, 112)] {
        let mut grad = rng.randn(&[m, k], |v| v * 4.0);
        let n_special = m * k / 7;
        for i in 0..n_special {
            let at = (i * 7 + 3) % (m * k);
            grad.as_mut_slice()[at] = specials[i % specials.len()];
        }
        grad.as_mut_slice()[k..2 * k].fill(0.0);
        let g = SwigluBackwardGrad {
            out: HostTensor::from_vec(vec![bf16::ZERO; m], &[m, 1]).unwrap(),
            grad: grad.clone(),
            weight_grad: HostTensor::from_vec(vec![0.0], &[1, 1]).unwrap(),
        };
        for npc in [32, 128] {
            for round in [false, true] {
                let want = cast(
                    &CastInput::from(grad.view()),
                    CastFormat::E4M3,
                    (1, npc),
                    ScaleOptions::row_major(round),
                )
                .unwrap();
                assert_eq!(
                    g.cast(npc, round).unwrap(),
                    want,
                    "({m}, {k}) npc={npc} round={round}"
                );
            }
        }
    }
}
