//! `swiglu_forward_and_per_token_cast` (`spec/quant.md` §3.10, §5, Appendix A): every
//! rejection, hand-computed examples (clamp, counts, weights, padding rows, `sf_clamp_min`),
//! every output format and scale layout, agreement with the generic `reference::cast` of the
//! activation, and the activation/downstream split the GPU tests rely on.
#![cfg(feature = "cpu")]

mod common;
mod op_common;

use half::bf16;
use op_common::{all_configs, assert_err, bad_packed_configs, strided_buffer, window};
use tk_core::testing::Rng;
use tk_core::{HostTensor, Layout};
use tk_quant::reference::swiglu::{
    activation_within_tolerance, cpu_expf, swiglu_activation, ACTIVATION_REL_TOL,
};
use tk_quant::reference::{
    cast, swiglu_forward_activation, swiglu_forward_and_per_token_cast,
    swiglu_forward_and_per_token_cast_with_expf, swiglu_forward_downstream, SwigluOut,
};
use tk_quant::swiglu_forward_and_per_token_cast::{validate, validate_dims};
use tk_quant::{
    CastFormat, CastInput, PlainInput, ScaleOptions, SwigluForwardInputs as Inputs,
    SwigluForwardParams as Params, SwigluOutFormat, TopkWeights,
};

const H: usize = 128;

/// An fp32 `(n, 2H)` input with gate `l(i, j)` and value `v(i, j)`.
fn input(
    n: usize,
    h: usize,
    l: impl Fn(usize, usize) -> f32,
    v: impl Fn(usize, usize) -> f32,
) -> HostTensor<f32> {
    HostTensor::from_fn(&[n, 2 * h], |i| {
        let (r, c) = (i / (2 * h), i % (2 * h));
        if c < h {
            l(r, c)
        } else {
            v(r, c - h)
        }
    })
}

fn vec_i32(v: &[i32]) -> HostTensor<i32> {
    HostTensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
}

fn e4m3(npc: usize, opts: ScaleOptions) -> Params {
    Params::cast(CastFormat::E4M3, npc, opts)
}

fn quantized(out: &SwigluOut) -> (&tk_quant::QuantData, &tk_quant::HostScales) {
    match out {
        SwigluOut::Quantized(q, s) => (q, s),
        o => panic!("expected quantized output, got {o:?}"),
    }
}

#[test]
fn rejections_name_the_argument() {
    let p = e4m3(128, ScaleOptions::row_major(false));
    // 2H must be a multiple of 256.
    for two_h in [128, 384, 200] {
        assert_err(validate_dims(4, two_h, &p).unwrap_err(), "Shape", "x");
    }
    for npc in [0, 32, 64, 512] {
        assert_err(
            validate_dims(4, 512, &e4m3(npc, ScaleOptions::row_major(true))).unwrap_err(),
            "Param",
            "num_per_channels",
        );
    }
    // npc == H: no column-major scales (B or C).
    for opts in [ScaleOptions::col_major(true), ScaleOptions::packed_ue8m0()] {
        assert_err(
            validate_dims(4, 512, &e4m3(256, opts)).unwrap_err(),
            "Param",
            "use_tma_aligned_col_major_sf",
        );
        assert!(validate_dims(4, 512, &e4m3(128, opts)).is_ok());
    }
    assert!(validate_dims(4, 512, &e4m3(256, ScaleOptions::row_major(true))).is_ok());
    for opts in bad_packed_configs() {
        assert_err(
            validate_dims(4, 256, &e4m3(128, opts)).unwrap_err(),
            "Param",
            "use_packed_ue8m0",
        );
    }
    assert_err(
        validate_dims(
            4,
            256,
            &Params {
                count_clamped: true,
                ..p
            },
        )
        .unwrap_err(),
        "Param",
        "count_clamped",
    );
    for c in [f32::NAN, f32::INFINITY, -1.0] {
        assert_err(
            validate_dims(4, 256, &p.with_clamp(c)).unwrap_err(),
            "Param",
            "swiglu_clamp_value",
        );
    }
    for eps in [0.0, -1e-4, f32::NAN, f32::INFINITY] {
        assert_err(
            validate_dims(
                4,
                256,
                &Params {
                    sf_clamp_min: Some(eps),
                    ..p
                },
            )
            .unwrap_err(),
            "Param",
            "sf_clamp_min",
        );
    }
    for fmt in [SwigluOutFormat::F32, SwigluOutFormat::BF16] {
        let pp = Params {
            sf_clamp_min: Some(1e-3),
            ..Params::plain(fmt)
        };
        assert_err(
            validate_dims(4, 256, &pp).unwrap_err(),
            "Param",
            "sf_clamp_min",
        );
        // npc and opts are not used by the plain formats.
        assert!(validate_dims(
            4,
            256,
            &Params {
                num_per_channels: 7,
                ..Params::plain(fmt)
            }
        )
        .is_ok());
    }
    // Tensor arguments.
    let x = input(4, H, |_, _| 1.0, |_, _| 1.0);
    let w = HostTensor::from_vec(vec![0.5f32; 6], &[3, 2]).unwrap();
    let ok_idx = vec_i32(&[0, 5, -1, 2]);
    let short = vec_i32(&[0, 1, 2]);
    let bad_idx = vec_i32(&[0, 6, -1, 2]);
    let w1 = HostTensor::from_vec(vec![0.5f32; 6], &[6]).unwrap();
    fn mk<'a>(
        x: &'a HostTensor<f32>,
        idx: &'a HostTensor<i32>,
        w: &'a HostTensor<f32>,
    ) -> Inputs<'a> {
        Inputs {
            x: x.view().into(),
            topk: Some(TopkWeights {
                pos_to_token_topk: idx.view(),
                topk_weights: w.view(),
            }),
            pos_to_expert: None,
        }
    }
    assert!(validate(&mk(&x, &ok_idx, &w), &p).is_ok());
    assert_err(
        validate(&mk(&x, &short, &w), &p).unwrap_err(),
        "Shape",
        "pos_to_token_topk",
    );
    assert_err(
        validate(&mk(&x, &bad_idx, &w), &p).unwrap_err(),
        "Param",
        "pos_to_token_topk",
    );
    assert_err(
        validate(&mk(&x, &ok_idx, &w1), &p).unwrap_err(),
        "Shape",
        "topk_weights",
    );
    let pe = Inputs {
        pos_to_expert: Some(short.view()),
        ..Inputs::new(x.view())
    };
    assert_err(validate(&pe, &p).unwrap_err(), "Shape", "pos_to_expert");
    let rank1 = x
        .view()
        .with_layout(Layout::contiguous(&[4 * 2 * H]))
        .unwrap();
    assert_err(validate(&Inputs::new(rank1), &p).unwrap_err(), "Shape", "x");
    let empty = HostTensor::<f32>::from_vec(vec![], &[4, 0]).unwrap();
    assert_err(
        validate(&Inputs::new(empty.view()), &p).unwrap_err(),
        "Empty",
        "x",
    );
    // The downstream validates its own arguments.
    let act = HostTensor::from_vec(vec![0.0f32; 4 * 192], &[4, 192]).unwrap();
    assert_err(
        swiglu_forward_downstream(&act.view(), None, &p).unwrap_err(),
        "Shape",
        "x",
    );
    let act = HostTensor::from_vec(vec![0.0f32; 4 * H], &[4, H]).unwrap();
    assert_err(
        swiglu_forward_downstream(&act.view(), Some(&short.view()), &p).unwrap_err(),
        "Shape",
        "pos_to_expert",
    );
}

#[test]
fn hand_example_with_a_fixed_expf() {
    // expf ≡ 1 makes t = 2, so a = fl(fl(l/2)·v): exact by hand.
    let one = |_: f32| 1.0f32;
    // Row 0: l = 2 everywhere, v_0 = 7, v_1 = -3.5, others 0 -> a = v (amax 7).
    // Row 1: all zero except l_0 = -0 (a = -0·0 = -0? no: (-0/2)·0 = -0·0 = -0).
    let x = input(
        2,
        H,
        |r, j| {
            if r == 0 {
                2.0
            } else if j == 0 {
                -0.0
            } else {
                0.0
            }
        },
        |r, j| match (r, j) {
            (0, 0) => 7.0,
            (0, 1) => -3.5,
            _ => 0.0,
        },
    );
    let inputs = Inputs::new(x.view());
    let out = swiglu_forward_and_per_token_cast_with_expf(
        &inputs,
        &e4m3(128, ScaleOptions::row_major(false)),
        &one,
    )
    .unwrap();
    assert_eq!(out.clamped_count, None);
    let (q, sf) = quantized(&out.out);
    assert_eq!(q.shape(), [2, H]);
    let b = q.bytes();
    // sf = 7/448 = 2^-6, inv = 64: 7 -> 448 (0x7E), -3.5 -> -224 (0xF6).
    assert_eq!(sf.get(0, 0), Some(1.0 / 64.0));
    assert_eq!((b[0], b[1], b[2]), (0x7E, 0xF6, 0x00));
    // Row 1: all-zero: sf = fl(1e-4/448); the -0 keeps its sign (0x80).
    assert_eq!(sf.get(1, 0), Some(1e-4f32 / 448.0));
    assert_eq!((b[H], b[H + 1]), (0x80, 0x00));
    // The fp32 output is the activation itself.
    let f = swiglu_forward_and_per_token_cast_with_expf(
        &inputs,
        &Params::plain(SwigluOutFormat::F32),
        &one,
    )
    .unwrap();
    let SwigluOut::F32(a) = &f.out else { panic!() };
    assert_eq!(&a.as_slice()[..3], &[7.0, -3.5, 0.0]);
    assert_eq!(a.as_slice()[H].to_bits(), (-0.0f32).to_bits());
    // sf_clamp_min = 1: c = max(7, 1) = 7 (row 0 unchanged); row 1 c = 1: sf = 1/448.
    let p = Params {
        sf_clamp_min: Some(1.0),
        ..e4m3(128, ScaleOptions::row_major(false))
    };
    let o = swiglu_forward_and_per_token_cast_with_expf(&inputs, &p, &one).unwrap();
    let (_, sf) = quantized(&o.out);
    assert_eq!(
        (sf.get(0, 0), sf.get(1, 0)),
        (Some(1.0 / 64.0), Some(1.0 / 448.0))
    );
    // A tiny sf_clamp_min below the format's ε replaces it (not max'ed with it): rounded,
    // c = 2^-40 gives sf = 2^ceil(log2(2^-40/448)) = 2^-48.
    let p = Params {
        sf_clamp_min: Some(2f32.powi(-40)),
        ..e4m3(128, ScaleOptions::row_major(true))
    };
    let o = swiglu_forward_and_per_token_cast_with_expf(&inputs, &p, &one).unwrap();
    assert_eq!(quantized(&o.out).1.get(1, 0), Some(2f32.powi(-48)));
}

#[test]
fn clamp_counts_and_weights() {
    let one = |_: f32| 1.0f32;
    // C = 0.5. Row 0: l = 3 (clamped to 0.5), v = -2 (to -0.5): a = fl(0.25 · -0.5) = -0.125.
    // Row 1: l = 0.25, v = 0.75 (to 0.5): a = 0.0625. Row 2 is padding (not counted).
    let x = input(
        3,
        H,
        |r, _| [3.0, 0.25, 9.0][r],
        |r, _| [-2.0, 0.75, 9.0][r],
    );
    let pe = vec_i32(&[0, 3, -1]);
    let idx = vec_i32(&[1, -1, 0]);
    let w = HostTensor::from_vec(vec![8.0f32, 4.0], &[1, 2]).unwrap();
    let inputs = Inputs {
        x: x.view().into(),
        topk: Some(TopkWeights {
            pos_to_token_topk: idx.view(),
            topk_weights: w.view(),
        }),
        pos_to_expert: Some(pe.view()),
    };
    let p = Params {
        count_clamped: true,
        ..Params::plain(SwigluOutFormat::F32).with_clamp(0.5)
    };
    let (act, counts) = swiglu_forward_activation(&inputs, &p, &one).unwrap();
    assert_eq!(counts, Some([H as i64, H as i64, H as i64]));
    let a = act.as_slice();
    // Row 0 weight flat[1] = 4: -0.5; row 1 weight 0 (negative index): +0; row 2 padding: +0.
    assert!(a[..H].iter().all(|&v| v == -0.5));
    assert!(a[H..].iter().all(|&v| v.to_bits() == 0));
    // Without the padding row the counts include row 2 (l = 9 > C, v = 9 > C).
    let inputs2 = Inputs {
        pos_to_expert: None,
        ..inputs.clone()
    };
    let (_, counts) = swiglu_forward_activation(&inputs2, &p, &one).unwrap();
    assert_eq!(counts, Some([2 * H as i64, 2 * H as i64, H as i64]));
    // A negative weight index keeps IEEE sign semantics: a · 0 with a < 0 is -0 (e4m3 0x80).
    let x3 = input(1, H, |_, _| 1.0, |_, _| -1.0);
    let idx3 = vec_i32(&[-1]);
    let in3 = Inputs {
        x: x3.view().into(),
        topk: Some(TopkWeights {
            pos_to_token_topk: idx3.view(),
            topk_weights: w.view(),
        }),
        pos_to_expert: None,
    };
    // (H = 128 = npc is "npc == H": layout A only, as upstream asserts.)
    assert!(validate_dims(1, 2 * H, &e4m3(128, ScaleOptions::packed_ue8m0())).is_err());
    let o = swiglu_forward_and_per_token_cast_with_expf(
        &in3,
        &e4m3(128, ScaleOptions::row_major(true)),
        &one,
    )
    .unwrap();
    let (q, sf) = quantized(&o.out);
    assert!(q.bytes().iter().all(|&b| b == 0x80));
    assert_eq!(sf.get(0, 0), Some(2f32.powi(-22)));
}

/// Random inputs with weights and padding rows, as upstream's test builds them.
fn random_case(
    rng: &mut Rng,
    n: usize,
    h: usize,
) -> (
    HostTensor<bf16>,
    HostTensor<i32>,
    HostTensor<f32>,
    HostTensor<i32>,
) {
    let x = rng.randn(&[n, 2 * h], bf16::from_f32);
    let (t, k) = (n, 2);
    let idx: Vec<i32> = (0..n)
        .map(|i| {
            if i % 5 == 3 {
                -1
            } else {
                rng.below((t * k) as u64) as i32
            }
        })
        .collect();
    let pe: Vec<i32> = idx
        .iter()
        .map(|&p| if p < 0 { -1 } else { p % 7 })
        .collect();
    let w = rng.randn(&[t, k], |v| v);
    (x, vec_i32(&idx), w, vec_i32(&pe))
}

#[test]
fn padding_rows_are_zero_in_every_format_and_layout() {
    let mut rng = Rng::for_case("swiglu_fwd/padding");
    let (n, h) = (10, 256);
    let (x, idx, w, pe) = random_case(&mut rng, n, h);
    let inputs = Inputs {
        x: x.view().into(),
        topk: Some(TopkWeights {
            pos_to_token_topk: idx.view(),
            topk_weights: w.view(),
        }),
        pos_to_expert: Some(pe.view()),
    };
    let pad: Vec<usize> = (0..n).filter(|&i| pe.as_slice()[i] < 0).collect();
    assert!(!pad.is_empty());
    for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
        for npc in [128, h] {
            for opts in all_configs() {
                let p = Params::cast(fmt, npc, opts).with_clamp(10.0);
                if validate_dims(n, 2 * h, &p).is_err() {
                    continue; // npc == H with column-major scales
                }
                let o = swiglu_forward_and_per_token_cast(&inputs, &p).unwrap();
                let (q, sf) = quantized(&o.out);
                let bytes_per_row = h / fmt.values_per_byte();
                let b = q.bytes();
                for &i in &pad {
                    assert!(b[i * bytes_per_row..(i + 1) * bytes_per_row]
                        .iter()
                        .all(|&c| c == 0));
                    for g in 0..h / npc {
                        assert_eq!(
                            sf.get(i, g).map(f32::to_bits),
                            Some(0),
                            "{fmt:?} {npc} {opts:?}"
                        );
                    }
                }
                // Non-padding rows never have a zero scale (c >= ε > 0).
                assert!((0..n)
                    .filter(|i| !pad.contains(i))
                    .all(|i| sf.get(i, 0).unwrap() > 0.0));
            }
        }
    }
    for fmt in [SwigluOutFormat::F32, SwigluOutFormat::BF16] {
        let o = swiglu_forward_and_per_token_cast(&inputs, &Params::plain(fmt)).unwrap();
        let zero_rows = |bits: Vec<u32>| {
            pad.iter()
                .all(|&i| bits[i * h..(i + 1) * h].iter().all(|&b| b == 0))
        };
        match &o.out {
            SwigluOut::F32(a) => assert!(zero_rows(
                a.as_slice().iter().map(|v| v.to_bits()).collect()
            )),
            SwigluOut::BF16(a) => assert!(zero_rows(
                a.as_slice().iter().map(|v| v.to_bits() as u32).collect()
            )),
            _ => panic!(),
        }
    }
}

#[test]
fn equals_generic_cast_of_the_activation() {
    let mut rng = Rng::for_case("swiglu_fwd/generic");
    let (n, h) = (12, 256);
    let (x, idx, w, _) = random_case(&mut rng, n, h);
    let xf = HostTensor::from_vec(
        x.as_slice().iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
        &[n, 2 * h],
    )
    .unwrap();
    for with_weights in [false, true] {
        for clamp in [None, Some(10.0), Some(0.5)] {
            let topk = with_weights.then(|| TopkWeights {
                pos_to_token_topk: idx.view(),
                topk_weights: w.view(),
            });
            let inputs = Inputs {
                x: x.view().into(),
                topk: topk.clone(),
                pos_to_expert: None,
            };
            let base = Params {
                swiglu_clamp_value: clamp,
                ..Params::plain(SwigluOutFormat::F32)
            };
            let (act, _) = swiglu_forward_activation(&inputs, &base, &cpu_expf).unwrap();
            // The activation, element by element, in the spec's order (independently written).
            for i in 0..n {
                let wi = topk.as_ref().map(|t| t.weight(i));
                for j in 0..h {
                    let mut l = x.as_slice()[i * 2 * h + j].to_f32();
                    let mut v = x.as_slice()[i * 2 * h + h + j].to_f32();
                    if let Some(c) = clamp {
                        l = l.min(c);
                        v = v.clamp(-c, c);
                    }
                    let e = ((-l) as f64).exp() as f32;
                    let mut a = (l / (1.0 + e)) * v;
                    if let Some(wi) = wi {
                        a *= wi;
                    }
                    assert_eq!(act.as_slice()[i * h + j].to_bits(), a.to_bits());
                    assert_eq!(
                        swiglu_activation(l, v, None, &cpu_expf).to_bits(),
                        ((l / (1.0 + e)) * v).to_bits()
                    );
                }
            }
            // fp32 and bf16 inputs with the same values agree.
            let in_f = Inputs {
                x: PlainInput::from(xf.view()),
                topk: topk.clone(),
                pos_to_expert: None,
            };
            assert_eq!(
                swiglu_forward_activation(&in_f, &base, &cpu_expf)
                    .unwrap()
                    .0,
                act
            );
            for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
                for npc in [128, h] {
                    for opts in all_configs() {
                        let p = Params {
                            swiglu_clamp_value: clamp,
                            ..Params::cast(fmt, npc, opts)
                        };
                        if validate_dims(n, 2 * h, &p).is_err() {
                            continue;
                        }
                        let o = swiglu_forward_and_per_token_cast(&inputs, &p).unwrap();
                        let want = cast(&CastInput::from(act.view()), fmt, (1, npc), opts).unwrap();
                        let (q, sf) = quantized(&o.out);
                        assert_eq!((q, sf), (&want.0, &want.1), "{fmt:?} npc {npc} {opts:?}");
                    }
                }
            }
            let o = swiglu_forward_and_per_token_cast(
                &inputs,
                &Params {
                    swiglu_clamp_value: clamp,
                    ..Params::plain(SwigluOutFormat::BF16)
                },
            )
            .unwrap();
            let SwigluOut::BF16(b) = &o.out else { panic!() };
            assert!(b
                .as_slice()
                .iter()
                .zip(act.as_slice())
                .all(|(b, a)| b.to_bits() == bf16::from_f32(*a).to_bits()));
        }
    }
    // Row-strided input: identical.
    let buf = strided_buffer(&x, bf16::from_f32(5.0));
    let p = e4m3(128, ScaleOptions::packed_ue8m0());
    assert_eq!(
        swiglu_forward_and_per_token_cast(&Inputs::new(window(&buf, 2 * h)), &p).unwrap(),
        swiglu_forward_and_per_token_cast(&Inputs::new(x.view()), &p).unwrap()
    );
}

#[test]
fn downstream_is_exact_given_foreign_activations() {
    // What the GPU tests do: an `expf` that differs from the CPU's in the last bit (here: one
    // ulp up for every other input) changes some activations, within the tolerance; the
    // downstream of those activations reproduces the whole op run with that `expf` bit for bit.
    let mut rng = Rng::for_case("swiglu_fwd/foreign");
    let (n, h) = (16, 256);
    let (x, idx, w, pe) = random_case(&mut rng, n, h);
    let other = |v: f32| {
        let e = cpu_expf(v);
        if e.is_finite() && e.to_bits() % 2 == 0 {
            f32::from_bits(e.to_bits() + 1)
        } else {
            e
        }
    };
    let inputs = Inputs {
        x: x.view().into(),
        topk: Some(TopkWeights {
            pos_to_token_topk: idx.view(),
            topk_weights: w.view(),
        }),
        pos_to_expert: Some(pe.view()),
    };
    let f32p = Params::plain(SwigluOutFormat::F32).with_clamp(10.0);
    let (cpu, _) = swiglu_forward_activation(&inputs, &f32p, &cpu_expf).unwrap();
    let (gpu, _) = swiglu_forward_activation(&inputs, &f32p, &other).unwrap();
    let differ = cpu
        .as_slice()
        .iter()
        .zip(gpu.as_slice())
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert!(differ > 0);
    assert!(cpu
        .as_slice()
        .iter()
        .zip(gpu.as_slice())
        .all(|(&c, &g)| activation_within_tolerance(g, c)));
    for p in [
        e4m3(128, ScaleOptions::packed_ue8m0()),
        Params::cast(CastFormat::E2M1, h, ScaleOptions::row_major(false)),
        Params::plain(SwigluOutFormat::BF16),
    ] {
        let p = p.with_clamp(10.0);
        let whole = swiglu_forward_and_per_token_cast_with_expf(&inputs, &p, &other).unwrap();
        let down = swiglu_forward_downstream(&gpu.view(), Some(&pe.view()), &p).unwrap();
        assert_eq!(whole.out, down);
    }
}

#[test]
fn activation_tolerance() {
    assert!(activation_within_tolerance(1.0, 1.0));
    assert!(activation_within_tolerance(f32::NAN, f32::NAN));
    assert!(!activation_within_tolerance(f32::INFINITY, f32::MAX));
    let x = 3.0f32;
    let near = f32::from_bits(x.to_bits() + 7); // 7 ulps at 2^1: relative 7·2^-23/1.5 < 2^-20
    assert!(activation_within_tolerance(near, x));
    let far = x * (1.0 + 4.0 * ACTIVATION_REL_TOL);
    assert!(!activation_within_tolerance(far, x));
    // The exp-overflow boundary: -0 against a tiny finite value.
    assert!(activation_within_tolerance(-0.0, -89.0 / f32::MAX * 3.0));
    // The f32 chain with the CPU expf is within tolerance of the exact activation (f64).
    let mut rng = Rng::for_case("swiglu_fwd/tolerance");
    for _ in 0..2000 {
        let (l, v) = (rng.normal() * 4.0, rng.normal() * 4.0);
        let exact = (l as f64 / (1.0 + (-(l as f64)).exp()) * v as f64) as f32;
        assert!(
            activation_within_tolerance(swiglu_activation(l, v, None, &cpu_expf), exact),
            "{l} {v}"
        );
    }
}

#[test]
fn empty_input() {
    let x = HostTensor::<f32>::from_vec(vec![], &[0, 512]).unwrap();
    for opts in all_configs() {
        let o =
            swiglu_forward_and_per_token_cast(&Inputs::new(x.view()), &e4m3(128, opts)).unwrap();
        let (q, sf) = quantized(&o.out);
        assert_eq!(
            (q.shape(), sf.grid().nbm(), sf.grid().nbk()),
            (&[0usize, 256][..], 0, 2)
        );
    }
    let p = Params {
        count_clamped: true,
        ..e4m3(256, ScaleOptions::row_major(false)).with_clamp(1.0)
    };
    let o = swiglu_forward_and_per_token_cast(&Inputs::new(x.view()), &p).unwrap();
    assert_eq!(o.clamped_count, Some([0, 0, 0]));
}

/// PTX `min.NaN` / `max.NaN` (f32 and bf16 alike): NaN if either operand is NaN, else the
/// smaller / larger, `-0 < +0` (PTX ISA: "If values of both inputs are 0.0, then +0.0 > -0.0").
fn ptx_min_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}

fn ptx_max_nan(a: f32, b: f32) -> f32 {
    -ptx_min_nan(-a, -b)
}

/// The spec's clamp (§3.10 step 2) as the kernels' selects: `l = C if l > C`, `v` into `[-C, C]`.
fn select_clamp(l: f32, v: f32, c: f32) -> (f32, f32) {
    let l = if l > c { c } else { l };
    let v = if v > c {
        c
    } else if v < -c {
        -c
    } else {
        v
    };
    (l, v)
}

/// The GPU forward's min / max clamp (`TK_CLAMP` 3: `min(l, C)`, `min(max(v, -C), C)`, in fp32;
/// `TK_CLAMP` 4: the same on bf16 values before the exact widening) agrees bit for bit with
/// the select clamp for every non-NaN operand when `C` has a clear sign bit, and differs for
/// `C = -0.0` (which is why the host keeps the select clamp there). Checked over every bf16
/// value (as fp32) against special values of `C`.
#[test]
fn min_max_clamp_model_matches_the_select_clamp() {
    let clamp_minmax =
        |l: f32, v: f32, c: f32| (ptx_min_nan(l, c), ptx_min_nan(ptx_max_nan(v, -c), c));
    let values: Vec<f32> = (0..=0xFFFFu32)
        .map(|b| f32::from_bits(b << 16))
        .filter(|x| !x.is_nan())
        .chain([0.3f32, -0.3, 0.5000001, -0.4999999])
        .collect();
    for c in [0.0f32, 0.5, 0.3, 10.0, 40.0, f32::MIN_POSITIVE, 1e-45] {
        for &x in &values {
            // the gate against the value's extremes and vice versa
            for (l, v) in [
                (x, x),
                (x, c),
                (x, -c),
                (c, x),
                (-c, x),
                (x, 0.0),
                (x, -0.0),
            ] {
                let (sl, sv) = select_clamp(l, v, c);
                let (ml, mv) = clamp_minmax(l, v, c);
                assert_eq!(
                    (ml.to_bits(), mv.to_bits()),
                    (sl.to_bits(), sv.to_bits()),
                    "C={c:e} l={l:e} v={v:e}"
                );
            }
        }
    }
    // C = -0.0: min(+0, -0) = -0 where the selects keep +0.
    let (sl, _) = select_clamp(0.0, 0.0, -0.0);
    let (ml, _) = clamp_minmax(0.0, 0.0, -0.0);
    assert_ne!(ml.to_bits(), sl.to_bits());
    // TK_CLAMP 4: min / max of bf16 values then widening = widening then min / max, for C
    // exact in bf16 (low 16 bits zero, what the host checks).
    for c in [0.0f32, 0.5, 10.0, 40.0] {
        assert_eq!(c.to_bits() & 0xFFFF, 0);
        let cb = bf16::from_f32(c);
        for b in 0..=0xFFFFu16 {
            let x = bf16::from_bits(b);
            if x.is_nan() {
                continue;
            }
            let lo = if x < cb || (x == cb && x.is_sign_negative()) {
                x
            } else {
                cb
            };
            assert_eq!(lo.to_f32().to_bits(), ptx_min_nan(x.to_f32(), c).to_bits());
        }
    }
}

/// The fp32-output quad layout (`TK_Q4`): for teams of `16 / FPL` lanes with `FPL`
/// 8-column fragments each, fragment `f` element `j` of lane `tl` is column
/// `4 ((2 f + j / 4) TEAM + tl) + j % 4` of the 128-column tile (loaded from and stored to the
/// same column, raw words `[j / 4 IN_BYTES, ...)` of the fragment; bf16 or fp32 input): every
/// column exactly once.
#[test]
fn quad_lane_layout_covers_every_column_once() {
    for fpl in [1usize, 2] {
        let team = 16 / fpl;
        let mut seen = [0u32; 128];
        for tl in 0..team {
            for f in 0..fpl {
                for j in 0..8 {
                    let q = 2 * f + j / 4;
                    let col = 4 * (q * team + tl) + j % 4;
                    seen[col] += 1;
                    // load (bf16 / fp32 input) and fp32 store: byte offset
                    // (lane_col / 4) QB + q TEAM QB + (j % 4) element bytes
                    for elem_bytes in [2usize, 4] {
                        let qb = 4 * elem_bytes;
                        let at = (4 * tl) / 4 * qb + q * team * qb + (j % 4) * elem_bytes;
                        assert_eq!(at, col * elem_bytes, "FPL={fpl} tl={tl} f={f} j={j}");
                    }
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "FPL={fpl}: {seen:?}");
    }
}
