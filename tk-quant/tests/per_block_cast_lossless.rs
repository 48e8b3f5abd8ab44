//! The lossless FP4 → FP8 requantization (`spec/quant.md` §3.4, §5 item 12): checked against
//! an independent criterion (every value dequantizes to the same fp32 bits before and after;
//! output scales from an independent exponent computation), a hand-computed example, every
//! static precondition, and every data-dependent typed error, with its boundary.
#![cfg(feature = "cpu")]

mod common;
mod op_common;

use op_common::{
    all_configs, assert_err, bad_packed_configs, bits, e4m3_data, rand_float, rounded_configs,
};
use tk_core::dtype::{E2M1x2, Ue8m0x4};
use tk_core::testing::Rng;
use tk_core::{HostTensor, HostView, Layout};
use tk_quant::per_block_cast_lossless::{
    input_exponent, output_exponent, validate, validate_dims, EXPONENT_SHIFT, MAX_EXPONENT_SPREAD,
};
use tk_quant::reference::{cast, cast_back, per_block_cast_lossless};
use tk_quant::{
    CastFormat, HostScales, LosslessCastParams, QuantData, QuantDataView, QuantInput, ScaleGrid,
    ScaleLayout, ScaleOptions, ScaleView,
};

/// `2^e` exactly (f32::powi overflows intermediate powers in debug builds).
fn p2(e: i32) -> f32 {
    2f64.powi(e) as f32
}

/// Packed e2m1 data `(m, k/2)` from one nibble per logical element.
fn fp4(m: usize, k: usize, nibbles: &[u8]) -> HostTensor<E2M1x2> {
    HostTensor::from_vec(
        nibbles
            .chunks(2)
            .map(|p| E2M1x2(p[0] | (p[1] << 4)))
            .collect(),
        &[m, k / 2],
    )
    .unwrap()
}

/// fp32 layout-A scales for the grid of `(m, k)` with `block`, `S[mb, kb] = f(mb, kb)`.
fn scales(
    layout: ScaleLayout,
    m: usize,
    k: usize,
    block: (usize, usize),
    f: impl FnMut(usize, usize) -> f32,
) -> HostScales {
    HostScales::from_fn(layout, ScaleGrid::for_matrix(m, k, block).unwrap(), f).unwrap()
}

/// The independent check: dequantized values equal bit for bit, and every output scale is
/// `2^(E_max − 6 − 127)` (0.0 when `E_max <= 6`) with `E_max` from the input scales' base-2
/// logarithms.
fn check_lossless(
    case: &str,
    x: &QuantInput<'_>,
    out_block: (usize, usize),
    out: &(QuantData, HostScales),
) {
    let (q, sf) = out;
    let before = cast_back::<f32>(x).unwrap();
    let after = cast_back::<f32>(&QuantInput::new(q.view(), sf.view(), out_block)).unwrap();
    assert_eq!(bits(after.as_slice()), bits(before.as_slice()), "{case}");
    let (m, k) = q.logical_shape();
    let (ih, iw) = x.block;
    let (oh, ow) = out_block;
    for mo in 0..m.div_ceil(oh) {
        for ko in 0..k.div_ceil(ow) {
            let mut e_max = i32::MIN;
            for mb in (mo * oh / ih)..((mo + 1) * oh).min(m).div_ceil(ih) {
                for kb in (ko * ow / iw)..((ko + 1) * ow).min(k).div_ceil(iw) {
                    let s = x.sf.get(mb, kb).unwrap() as f64;
                    e_max = e_max.max(s.log2() as i32 + 127);
                }
            }
            // The saturating rule: E_out = max(E_max − 6, 0); exponent 0 is the scale +0.0.
            let e_out = (e_max - 6).max(0);
            let want = if e_out == 0 { 0.0 } else { p2(e_out - 127) };
            assert_eq!(
                sf.get(mo, ko).unwrap().to_bits(),
                want.to_bits(),
                "{case}: out scale ({mo}, {ko})"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Against the independent check
// ---------------------------------------------------------------------------------------------

#[test]
fn random_inputs_are_requantized_losslessly() {
    let mut rng = Rng::new(61);
    for (m, k) in [(37, 576), (130, 96)] {
        for u in [-110, 120] {
            let x = rand_float(&mut rng, m, k, u);
            for (in_block, out_blocks) in [
                (
                    (1, 32),
                    vec![(1, 128), (32, 32), (128, 128), (2, 64), (3, 32)],
                ),
                ((2, 16), vec![(2, 16), (4, 64), (128, 128)]),
            ] {
                for (i, in_opts) in rounded_configs().into_iter().enumerate() {
                    let (qin, sin) =
                        cast(&x.view().into(), CastFormat::E2M1, in_block, in_opts).unwrap();
                    let xi = QuantInput::new(qin.view(), sin.view(), in_block);
                    for (b, &out_block) in out_blocks.iter().enumerate() {
                        for (j, out_opts) in rounded_configs().into_iter().enumerate() {
                            // A third of the layout pairs per output block (every pair over
                            // the blocks): the layouts never change a value.
                            if (i + j + b) % 3 != 0 {
                                continue;
                            }
                            let case = format!(
                                "({m}, {k}) 2^{u} {in_block:?} {in_opts:?} → {out_block:?} \
                                 {out_opts:?}"
                            );
                            let p = LosslessCastParams::new(out_block, out_opts);
                            let out = per_block_cast_lossless(&xi, &p).unwrap();
                            assert_eq!(out.1.layout(), out_opts.layout().unwrap());
                            check_lossless(&case, &xi, out_block, &out);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn hand_example() {
    // M = 2, K = 64, input block (1, 32): scales 2^-3, 2^2 (row 0), 2^0, 2^5 (row 1), i.e.
    // E_in = 124, 129, 127, 132. Output block (2, 64): E_max = 132, E_out = 126 (scale 2^-1),
    // d = −2, 3, 1, 6. Values: 6·2^-2 = 1.5 (0x3C), 0.5·2^-2 = 2^-3 (0x20), −0 (0x80);
    // 6·2^3 = 48 (0x64); −6·2 = −12 (0xD4); −6·2^6 = −384 (0xFC), 0.5·2^6 = 32 (0x60).
    let mut nib = vec![0u8; 128];
    nib[0] = 7;
    nib[1] = 1;
    nib[2] = 8;
    nib[32] = 7;
    nib[64] = 15;
    nib[96] = 15;
    nib[97] = 1;
    let data = fp4(2, 64, &nib);
    let in_scales = [p2(-3), p2(2), p2(0), p2(5)];
    for in_layout in [
        ScaleLayout::RowMajorF32,
        ScaleLayout::ColMajorF32,
        ScaleLayout::PackedUe8m0,
    ] {
        let sf = scales(in_layout, 2, 64, (1, 32), |mb, kb| in_scales[mb * 2 + kb]);
        let xi = QuantInput::new(QuantDataView::E2M1(data.view()), sf.view(), (1, 32));
        for opts in all_configs() {
            let p = LosslessCastParams::new((2, 64), opts);
            let (q, osf) = per_block_cast_lossless(&xi, &p).unwrap();
            let mut want = vec![0u8; 128];
            want[..3].copy_from_slice(&[0x3C, 0x20, 0x80]);
            want[32] = 0x64;
            want[64] = 0xD4;
            want[96..98].copy_from_slice(&[0xFC, 0x60]);
            assert_eq!(q.bytes(), want, "{in_layout:?} {opts:?}");
            assert_eq!(osf.get(0, 0), Some(0.5));
            if opts.use_packed_ue8m0 {
                assert_eq!(
                    osf.storage_bytes(),
                    [126, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
                );
            }
            check_lossless("hand", &xi, (2, 64), &(q, osf));
        }
    }
}

#[test]
fn exponent_helpers() {
    assert_eq!(input_exponent(1.0), Some(127));
    assert_eq!(input_exponent(p2(-126)), Some(1));
    assert_eq!(input_exponent(p2(127)), Some(254));
    for bad in [
        0.0,
        -0.0,
        1.5,
        -1.0,
        p2(-127),
        f32::INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE * 3.0,
    ] {
        assert_eq!(input_exponent(bad), None, "{bad:e}");
    }
    assert_eq!(output_exponent(132), 126);
    assert_eq!(output_exponent(7), 1);
    assert_eq!(output_exponent(6), 0);
    assert_eq!(output_exponent(1), 0);
    assert_eq!((EXPONENT_SHIFT, MAX_EXPONENT_SPREAD), (6, 11));
}

// ---------------------------------------------------------------------------------------------
// Static preconditions
// ---------------------------------------------------------------------------------------------

#[test]
fn validate_returns_the_plan_and_rejects_static_violations() {
    let d = ScaleOptions::row_major(true);
    let data = fp4(40, 96, &[1; 40 * 96]);
    let sf = scales(ScaleLayout::PackedUe8m0, 40, 96, (1, 32), |_, _| 1.0);
    let xi = QuantInput::new(QuantDataView::E2M1(data.view()), sf.view(), (1, 32));
    let p = validate(
        &xi,
        &LosslessCastParams::new((32, 64), ScaleOptions::packed_ue8m0()),
    )
    .unwrap();
    assert_eq!(
        (p.input.block, p.input.sf_layout),
        ((1, 32), ScaleLayout::PackedUe8m0)
    );
    assert_eq!(p.input.grid, ScaleGrid::new(40, 3).unwrap());
    assert_eq!(
        (p.output.block, p.output.grid),
        ((32, 64), ScaleGrid::new(2, 2).unwrap())
    );
    assert_eq!(p.output.sf_layout, ScaleLayout::PackedUe8m0);

    let lossless = |x: &QuantInput<'_>, out: (usize, usize), opts: ScaleOptions| {
        per_block_cast_lossless(x, &LosslessCastParams::new(out, opts)).unwrap_err()
    };
    // e4m3 data.
    let e4 = e4m3_data(40, 96, &[0x38; 40 * 96]);
    let xe4 = QuantInput::new(QuantDataView::E4M3(e4.view()), sf.view(), (1, 32));
    assert_err(lossless(&xe4, (32, 64), d), "Dtype", "x");
    // K % 32.
    for k in [16, 48] {
        let dk = fp4(4, k, &vec![1; 4 * k]);
        let sk = scales(ScaleLayout::RowMajorF32, 4, k, (1, 16), |_, _| 1.0);
        let x = QuantInput::new(QuantDataView::E2M1(dk.view()), sk.view(), (1, 16));
        assert_err(lossless(&x, (1, 16), d), "Shape", "x");
    }
    // Input block width not a power of two.
    let s48 = scales(ScaleLayout::RowMajorF32, 40, 96, (1, 48), |_, _| 1.0);
    let x48 = QuantInput::new(QuantDataView::E2M1(data.view()), s48.view(), (1, 48));
    assert_err(lossless(&x48, (1, 96), d), "Param", "x_block_size");
    // Output block width not a power of two; not a multiple of the input block; zero.
    for out in [(1, 96), (3, 48), (1, 0), (0, 32), (1, 16)] {
        assert_err(lossless(&xi, out, d), "Param", "out_block_size");
    }
    let s2 = scales(ScaleLayout::RowMajorF32, 40, 96, (2, 32), |_, _| 1.0);
    let x2 = QuantInput::new(QuantDataView::E2M1(data.view()), s2.view(), (2, 32));
    assert_err(lossless(&x2, (3, 64), d), "Param", "out_block_size");
    assert!(per_block_cast_lossless(&x2, &LosslessCastParams::new((6, 64), d)).is_ok());
    // Zero input block, and scales not matching it.
    let x0 = QuantInput::new(QuantDataView::E2M1(data.view()), sf.view(), (0, 32));
    assert_err(lossless(&x0, (32, 32), d), "Param", "x_block_size");
    let xw = QuantInput::new(QuantDataView::E2M1(data.view()), sf.view(), (2, 32));
    assert_err(lossless(&xw, (32, 32), d), "Shape", "x.sf");
    // Scale flags.
    for opts in bad_packed_configs() {
        assert_err(lossless(&xi, (32, 32), opts), "Param", "use_packed_ue8m0");
    }
    // The device-independent form.
    assert!(validate_dims(
        8,
        64,
        (1, 32),
        ScaleLayout::RowMajorF32,
        &LosslessCastParams::new((8, 32), d)
    )
    .is_ok());
    let e = validate_dims(
        8,
        64,
        (1, 0),
        ScaleLayout::RowMajorF32,
        &LosslessCastParams::new((8, 32), d),
    )
    .unwrap_err();
    assert_err(e, "Param", "x_block_size");
}

// ---------------------------------------------------------------------------------------------
// Data-dependent errors (where upstream traps or silently writes a wrong scale)
// ---------------------------------------------------------------------------------------------

#[test]
fn input_scales_must_be_positive_normal_powers_of_two() {
    let data = fp4(2, 64, &[3; 128]);
    for bad in [1.5f32, 0.0, -1.0, p2(-130), f32::INFINITY, f32::NAN, 3.0] {
        let sf = scales(ScaleLayout::RowMajorF32, 2, 64, (1, 32), |mb, kb| {
            if (mb, kb) == (1, 0) {
                bad
            } else {
                1.0
            }
        });
        let xi = QuantInput::new(QuantDataView::E2M1(data.view()), sf.view(), (1, 32));
        let e = per_block_cast_lossless(
            &xi,
            &LosslessCastParams::new((1, 64), ScaleOptions::default()),
        )
        .unwrap_err();
        assert_err(e, "Param", "x.sf");
    }
    // Packed UE8M0 bytes 0 (+0.0) and 255 (+inf). Bytes 1 and 254 are fine (with zero data
    // where E_max would leave the output exponent at 0).
    for (byte, ok) in [(0u8, false), (255, false), (254, true)] {
        let words = vec![Ue8m0x4(i32::from_le_bytes([byte, 127, 0, 0])); 4];
        let view = HostView::new(&words, Layout::new(vec![2, 1], vec![1, 4], 0).unwrap()).unwrap();
        let xi = QuantInput::new(
            QuantDataView::E2M1(data.view()),
            ScaleView::Packed(view),
            (1, 32),
        );
        // With (1, 64) output blocks 2^127 next to 2^0 breaks the spread rule; with (1, 32)
        // blocks byte 254 is a valid scale (E_out = 248, d = 6: 1.5 · 64 = 96).
        let r = per_block_cast_lossless(
            &xi,
            &LosslessCastParams::new((1, 64), ScaleOptions::default()),
        );
        assert_err(r.unwrap_err(), "Param", "x.sf");
        let r = per_block_cast_lossless(
            &xi,
            &LosslessCastParams::new((1, 32), ScaleOptions::default()),
        );
        if ok {
            let out = r.unwrap();
            assert_eq!(out.0.bytes()[0], 0x6C); // 96
            check_lossless("byte 254", &xi, (1, 32), &out);
        } else {
            assert_err(r.unwrap_err(), "Param", "x.sf");
        }
    }
}

#[test]
fn spread_beyond_2_pow_11_is_an_error_and_2_pow_11_is_lossless() {
    // Input block (1, 32), output block (1, 64): scales 2^0 and 2^-s. E_max = 127,
    // E_out = 121; E_in = 127 − s must satisfy E_in + 5 >= 121, i.e. s <= 11.
    let mut nib = vec![0u8; 64];
    for (i, n) in nib.iter_mut().enumerate() {
        *n = (i % 16) as u8; // every code, both signs
    }
    let data = fp4(1, 64, &nib);
    for s in [10, 11, 12, 20] {
        let sf = scales(ScaleLayout::RowMajorF32, 1, 64, (1, 32), |_, kb| {
            if kb == 0 {
                1.0
            } else {
                p2(-s)
            }
        });
        let xi = QuantInput::new(QuantDataView::E2M1(data.view()), sf.view(), (1, 32));
        for opts in rounded_configs() {
            let r = per_block_cast_lossless(&xi, &LosslessCastParams::new((1, 64), opts));
            if s <= 11 {
                let out = r.unwrap();
                check_lossless(&format!("spread {s}"), &xi, (1, 64), &out);
                if s == 11 {
                    // d = −5: 0.5 · 2^-5 = 2^-6, e4m3's smallest normal (0x08).
                    assert_eq!(out.0.bytes()[33], 0x08);
                }
            } else {
                assert_err(r.unwrap_err(), "Param", "x.sf");
            }
        }
    }
}

#[test]
fn output_scale_zero_only_for_all_zero_blocks() {
    // E_max = 6 (input scale 2^-121): E_out = 0, scale 0.0. Upstream writes it silently and
    // the nonzero values dequantize to 0: an error here. (The spec says lossless "as long as
    // E_max >= 6"; the boundary is really E_max >= 7.)
    let nonzero = fp4(1, 32, &[[5u8].as_slice(), &[0; 31]].concat());
    for (e, ok) in [(6, false), (5, false), (1, false), (7, true), (8, true)] {
        let sf = scales(ScaleLayout::RowMajorF32, 1, 32, (1, 32), |_, _| p2(e - 127));
        let xi = QuantInput::new(QuantDataView::E2M1(nonzero.view()), sf.view(), (1, 32));
        for opts in rounded_configs() {
            let r = per_block_cast_lossless(&xi, &LosslessCastParams::new((1, 32), opts));
            if ok {
                let out = r.unwrap();
                assert_eq!(out.1.get(0, 0), Some(p2(e - 6 - 127)));
                check_lossless(&format!("E_max {e}"), &xi, (1, 32), &out);
            } else {
                assert_err(r.unwrap_err(), "Param", "x.sf");
            }
        }
    }
    // An all-zero output block (signed zeros) with E_max <= 6 is lossless with scale 0.0:
    // upstream's result, data ±0. This is what all-zero FP4 blocks from a cast look like
    // (scale 2^-126, E_in = 1), so all-zero tensors requantize fine.
    let x = HostTensor::from_fn(&[4, 64], |i| if i % 3 == 0 { -0.0f32 } else { 0.0 });
    for in_opts in rounded_configs() {
        let (qin, sin) = cast(&x.view().into(), CastFormat::E2M1, (1, 32), in_opts).unwrap();
        assert_eq!(sin.get(0, 0), Some(p2(-126)));
        let xi = QuantInput::new(qin.view(), sin.view(), (1, 32));
        for out_opts in rounded_configs() {
            let out =
                per_block_cast_lossless(&xi, &LosslessCastParams::new((2, 64), out_opts)).unwrap();
            assert_eq!(out.1.get(0, 0), Some(0.0));
            if out_opts.use_packed_ue8m0 {
                assert_eq!(out.1.ue8m0_byte(1, 0), Some(0));
            }
            let want: Vec<u8> = (0..256)
                .map(|i| if i % 3 == 0 { 0x80 } else { 0 })
                .collect();
            assert_eq!(out.0.bytes(), want);
            check_lossless("zeros", &xi, (2, 64), &out);
        }
    }
}

#[test]
fn all_zero_input_block_among_large_values_is_an_error() {
    // Row 1 is all zero: its FP4 scale is 2^-126 (E_in = 1) while row 0's is about 2^-2;
    // in a (2, 32) output block that spread exceeds 2^11 (upstream's device assertion). With
    // (1, 32) output blocks the same input is fine.
    let x = HostTensor::from_fn(&[2, 32], |i| {
        if i < 32 {
            (i as f32 - 15.5) / 10.0
        } else {
            0.0
        }
    });
    let (qin, sin) = cast(
        &x.view().into(),
        CastFormat::E2M1,
        (1, 32),
        ScaleOptions::packed_ue8m0(),
    )
    .unwrap();
    let xi = QuantInput::new(qin.view(), sin.view(), (1, 32));
    let e = per_block_cast_lossless(
        &xi,
        &LosslessCastParams::new((2, 32), ScaleOptions::packed_ue8m0()),
    )
    .unwrap_err();
    assert_err(e, "Param", "x.sf");
    let out = per_block_cast_lossless(
        &xi,
        &LosslessCastParams::new((1, 32), ScaleOptions::packed_ue8m0()),
    )
    .unwrap();
    check_lossless("row blocks", &xi, (1, 32), &out);
}

// ---------------------------------------------------------------------------------------------
// Empty input, partial blocks, strided rows
// ---------------------------------------------------------------------------------------------

#[test]
fn empty_input() {
    let data = HostTensor::<E2M1x2>::from_vec(vec![], &[0, 32]).unwrap();
    let sf = scales(ScaleLayout::PackedUe8m0, 0, 64, (1, 32), |_, _| 1.0);
    let xi = QuantInput::new(QuantDataView::E2M1(data.view()), sf.view(), (1, 32));
    for opts in all_configs() {
        let (q, osf) =
            per_block_cast_lossless(&xi, &LosslessCastParams::new((128, 128), opts)).unwrap();
        assert_eq!(q.shape(), [0, 64]);
        assert_eq!(osf.shape(), [0, 1]); // nbk = 1, also ceil(nbk/4) = 1 packed
        assert!(osf.storage_bytes().is_empty());
    }
}

#[test]
fn partial_blocks_and_strided_rows() {
    // M = 5 with oh = 4 (a one-row second block), K = 96 with ow = 64 (a 32-wide second
    // block), ih = 2 (a one-row last input block). Data in a wider buffer (row stride 80
    // bytes) gives the same result as contiguous data.
    let mut rng = Rng::new(67);
    let x = rand_float(&mut rng, 5, 96, 3);
    for opts in rounded_configs() {
        let (qin, sin) = cast(&x.view().into(), CastFormat::E2M1, (2, 32), opts).unwrap();
        let xi = QuantInput::new(qin.view(), sin.view(), (2, 32));
        let p = LosslessCastParams::new((4, 64), opts);
        let out = per_block_cast_lossless(&xi, &p).unwrap();
        assert_eq!(out.1.grid(), ScaleGrid::new(2, 2).unwrap());
        check_lossless("partial", &xi, (4, 64), &out);
        let packed = qin.as_e2m1().unwrap();
        let mut buf = vec![E2M1x2(0x77); 5 * 80];
        for r in 0..5 {
            buf[r * 80..r * 80 + 48].copy_from_slice(&packed.as_slice()[r * 48..(r + 1) * 48]);
        }
        let buf = HostTensor::from_vec(buf, &[5, 80]).unwrap();
        let strided = buf.view().narrow(1, 0, 48).unwrap();
        let xs = QuantInput::new(QuantDataView::E2M1(strided), sin.view(), (2, 32));
        assert_eq!(per_block_cast_lossless(&xs, &p).unwrap(), out);
    }
}
