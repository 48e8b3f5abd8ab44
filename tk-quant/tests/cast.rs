//! CPU reference of the FP8/FP4 cast and cast back (`spec/quant.md` §2.1, §2.2, §3.1, §3.3,
//! §3.8, §5): hand-computed examples in every scale layout, edge cases, requantization,
//! precomputed and sf-only modes, every rejection path, round trips and rounding properties.
#![cfg(feature = "cpu")]

mod common;

use common::{
    assert_nearest, assert_param, calc_diff_f32, check_bias, div_f32, e2m1_grid, e4m3_grid,
    err_arg, pow2_ceil,
};
use float8::F8E4M3;
use half::bf16;
use tk_core::convert::{e2m1_to_f32, e4m3_from_f32, e4m3_to_f32};
use tk_core::dtype::{E2M1x2, Ue8m0x4};
use tk_core::testing::Rng;
use tk_core::{HostTensor, HostView, Layout, TkError};
use tk_quant::reference::{cast, cast_back, cast_sf_only, cast_with_precomputed_sf};
use tk_quant::{
    CastFormat, CastInput, HostScales, PlainInput, QuantData, QuantDataView, QuantInput, ScaleGrid,
    ScaleLayout, ScaleOptions, ScaleView,
};

const E4M3: CastFormat = CastFormat::E4M3;
const E2M1: CastFormat = CastFormat::E2M1;

/// The three layouts, as options with power-of-two scales (A, B, C) — upstream's test configs
/// plus B.
fn rounded_configs() -> [ScaleOptions; 3] {
    [
        ScaleOptions::row_major(true),
        ScaleOptions::col_major(true),
        ScaleOptions::packed_ue8m0(),
    ]
}

/// Every valid option set (A, B non-rounded and rounded, C).
fn all_configs() -> [ScaleOptions; 5] {
    [
        ScaleOptions::row_major(false),
        ScaleOptions::col_major(false),
        ScaleOptions::row_major(true),
        ScaleOptions::col_major(true),
        ScaleOptions::packed_ue8m0(),
    ]
}

fn f32s(m: usize, k: usize, v: &[f32]) -> HostTensor<f32> {
    HostTensor::from_vec(v.to_vec(), &[m, k]).unwrap()
}

fn e4m3_data(m: usize, k: usize, bytes: &[u8]) -> HostTensor<F8E4M3> {
    HostTensor::from_vec(
        bytes.iter().map(|&b| F8E4M3::from_bits(b)).collect(),
        &[m, k],
    )
    .unwrap()
}

fn cast_f32(
    x: &HostTensor<f32>,
    fmt: CastFormat,
    block: (usize, usize),
    opts: ScaleOptions,
) -> (QuantData, HostScales) {
    cast(&x.view().into(), fmt, block, opts).unwrap()
}

fn back_f32(q: &QuantData, sf: &HostScales, block: (usize, usize)) -> Vec<f32> {
    cast_back::<f32>(&QuantInput::new(q.view(), sf.view(), block))
        .unwrap()
        .into_vec()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

// ---------------------------------------------------------------------------------------------
// Hand-computed examples
// ---------------------------------------------------------------------------------------------

#[test]
fn e4m3_per_token_hand_example() {
    // Row 0: amax 7, c/Q = 2^-6 exactly (rounded or not): inv = 64 → 32, −64, 192, 448.
    // Row 1: amax 8. Non-rounded: sf = fl(8/448), inv = 56 → 56, −448, fl(0.1·56) = 5.6 → 5.5,
    //        112. Rounded: sf = 2^-5, inv = 32 → 32, −256, fl(0.1·32) = 3.2 → 3.25, 64.
    let x = f32s(2, 4, &[0.5, -1.0, 3.0, 7.0, 1.0, -8.0, 0.1, 2.0]);
    let row0 = [0x60, 0xE8, 0x74, 0x7E];
    for opts in all_configs() {
        let (q, sf) = cast_f32(&x, E4M3, (1, 4), opts);
        let (row1, sf1) = if opts.round_sf {
            ([0x60, 0xF8, 0x45, 0x68], 2f32.powi(-5))
        } else {
            ([0x66, 0xFE, 0x4B, 0x6E], div_f32(8.0, 448.0))
        };
        assert_eq!(q.bytes(), [row0, row1].concat(), "{opts:?}");
        assert_eq!(q.shape(), [2, 4]);
        assert_eq!(sf.layout(), opts.layout().unwrap());
        assert_eq!(bits(&sf.to_grid()), bits(&[2f32.powi(-6), sf1]), "{opts:?}");
    }
    let (_, sf) = cast_f32(&x, E4M3, (1, 4), ScaleOptions::packed_ue8m0());
    assert_eq!(
        sf.storage_bytes(),
        [121, 0, 0, 0, 122, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
}

#[test]
fn non_rounded_inv_is_q_over_c_not_reciprocal_of_sf() {
    // c = 1.296875, x = 0.75·c: fl(x · fl(448/c)) = 336 exactly, a tie → 320 (0x7A), while
    // fl(x · fl(1/fl(c/448))) = 336.00003 → 352 (0x7B).
    let (c, x) = (1.296875f32, 0.97265625f32);
    let inv = div_f32(448.0, c);
    assert_eq!(x * inv, 336.0);
    assert_eq!(e4m3_from_f32(x * (1.0 / div_f32(c, 448.0))), 0x7B);
    let t = f32s(1, 2, &[c, x]);
    let (q, sf) = cast_f32(&t, E4M3, (1, 2), ScaleOptions::default());
    assert_eq!(q.bytes(), [0x7E, 0x7A]);
    // So precomputed mode (inv = fl(1/sf)) with the same non-power-of-two sf differs.
    let sfv = f32s(1, 1, &sf.to_grid());
    let p = cast_with_precomputed_sf(&t.view().into(), E4M3, (1, 2), &sfv.view()).unwrap();
    assert_eq!(p.bytes(), [0x7E, 0x7B]);
}

#[test]
fn e2m1_ties_and_packing() {
    // amax 6 → sf = inv = 1. Ties: 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4.
    // Codes 0, 2, 2, 4, 4, 6, 6, 15 (−6); even column in the low nibble.
    let x = f32s(1, 8, &[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -6.0]);
    for opts in all_configs() {
        let (q, sf) = cast_f32(&x, E2M1, (1, 8), opts);
        assert_eq!(q.shape(), [1, 4]);
        assert_eq!(q.logical_shape(), (1, 8));
        assert_eq!(q.bytes(), [0x20, 0x42, 0x64, 0xF6], "{opts:?}");
        assert_eq!(sf.get(0, 0), Some(1.0));
    }
    // amax 12 → sf = 2, inv = 0.5: 0.1 → 0.05 → 0; 12 → 6 (code 7); −0.5 → −0.25 → −0 (tie to
    // even 0, sign kept: nibble 8); 7 → 3.5 → 4 (code 6).
    let x = f32s(1, 4, &[0.1, 12.0, -0.5, 7.0]);
    let (q, sf) = cast_f32(&x, E2M1, (1, 4), ScaleOptions::default());
    assert_eq!(q.bytes(), [0x70, 0x68]);
    assert_eq!(sf.get(0, 0), Some(2.0));
}

#[test]
fn all_zero_blocks_and_signed_zeros() {
    let x = f32s(2, 4, &[0.0, -0.0, 0.0, -0.0, -1e-9, 1.0, 0.0, 0.0]);
    // e4m3 non-rounded: sf = fl(1e-4/448), inv = fl(448/1e-4).
    let eps = f32::from_bits(0x38D1_B717);
    assert_eq!(eps, 1e-4f32);
    let (q, sf) = cast_f32(&x, E4M3, (1, 4), ScaleOptions::default());
    assert_eq!(
        sf.get(0, 0).unwrap().to_bits(),
        div_f32(eps, 448.0).to_bits()
    );
    assert!((sf.get(0, 0).unwrap() - 2.232e-7).abs() < 1e-10);
    // −0.0 → 0x80; −1e-9 · 448 underflows to −0 → 0x80.
    assert_eq!(q.bytes(), [0x00, 0x80, 0x00, 0x80, 0x80, 0x7E, 0x00, 0x00]);
    // Rounded: sf = 2^-22 (UE8M0 byte 105).
    for opts in rounded_configs() {
        let (q2, sf) = cast_f32(&x, E4M3, (1, 4), opts);
        assert_eq!(sf.get(0, 0), Some(2f32.powi(-22)), "{opts:?}");
        assert_eq!(q2.bytes()[..4], [0x00, 0x80, 0x00, 0x80]);
    }
    let (_, sf) = cast_f32(&x, E4M3, (1, 4), ScaleOptions::packed_ue8m0());
    assert_eq!(sf.ue8m0_byte(0, 0), Some(105));
    // e2m1: sf = 2^-126 and inv = 2^126 exactly, rounded or not.
    for opts in all_configs() {
        let (q, sf) = cast_f32(&x, E2M1, (1, 4), opts);
        assert_eq!(sf.get(0, 0).unwrap().to_bits(), 0x0080_0000, "{opts:?}");
        assert_eq!(q.bytes()[..2], [0x80, 0x80]);
    }
    let (_, sf) = cast_f32(&x, E2M1, (1, 4), ScaleOptions::packed_ue8m0());
    assert_eq!(sf.ue8m0_byte(0, 0), Some(1));
}

/// The partial-block matrix: M = 3, K = 6, block (2, 4) → grid (2, 2) with block amax
/// 4, 2 (rows 0–1) and 8, 1 (row 2). Reading past a block's last column into the next row
/// would see 4 in block (0, 1); reading a fourth row or past column 5 would see 1000.
const PARTIAL: [f32; 18] = [
    1.0, -4.0, 0.5, 0.0, 2.0, -1.0, //
    4.0, 0.25, -3.0, 1.0, -2.0, 0.5, //
    8.0, 0.0, 0.0, -1.0, 1.0, 0.125,
];
const PARTIAL_AMAX: [f32; 4] = [4.0, 2.0, 8.0, 1.0];

#[test]
fn partial_blocks_use_only_real_elements() {
    // Contiguous, and as a (3, 6) window of a (4, 8) buffer full of 1000s.
    let x = f32s(3, 6, &PARTIAL);
    let mut buf = vec![1000.0f32; 32];
    for r in 0..3 {
        buf[8 * r..8 * r + 6].copy_from_slice(&PARTIAL[6 * r..6 * r + 6]);
    }
    let buf = HostTensor::from_vec(buf, &[4, 8]).unwrap();
    let window = buf.view().narrow(0, 0, 3).unwrap().narrow(1, 0, 6).unwrap();
    for opts in all_configs() {
        for input in [CastInput::from(x.view()), CastInput::from(window.clone())] {
            let (q, sf) = cast(&input, E4M3, (2, 4), opts).unwrap();
            assert_eq!(sf.grid(), ScaleGrid::new(2, 2).unwrap());
            for (i, &amax) in PARTIAL_AMAX.iter().enumerate() {
                let exact = div_f32(amax, 448.0);
                let want = if opts.round_sf {
                    pow2_ceil(exact)
                } else {
                    exact
                };
                assert_eq!(
                    sf.get(i / 2, i % 2).unwrap().to_bits(),
                    want.to_bits(),
                    "{opts:?} {i}"
                );
            }
            for (i, (&b, &v)) in q.bytes().iter().zip(&PARTIAL).enumerate() {
                let blk = (i / 6 / 2) * 2 + (i % 6) / 4;
                let c = PARTIAL_AMAX[blk];
                let inv = if opts.round_sf {
                    1.0 / pow2_ceil(div_f32(c, 448.0))
                } else {
                    div_f32(448.0, c)
                };
                assert_eq!(b, e4m3_from_f32(v * inv), "{opts:?} element {i}");
            }
        }
    }
    // Layout C bytes: rounded sf 2^-6, 2^-7 (row 0), 2^-5, 2^-8 (row 1) → 121, 120, 122, 119.
    let (_, sf) = cast_f32(&x, E4M3, (2, 4), ScaleOptions::packed_ue8m0());
    assert_eq!(
        sf.storage_bytes(),
        [121, 120, 0, 0, 122, 119, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
}

// ---------------------------------------------------------------------------------------------
// Properties on random data, against independent formulas
// ---------------------------------------------------------------------------------------------

/// Independent check of a cast of `x` (row-major `(m, k)`): each block's scale from its exact
/// element range, each code a nearest grid value of `fl(x · inv)`, and the dequantized value
/// within half a quantum of `x` (scaled).
fn check_cast_properties(
    case: &str,
    x: &HostTensor<f32>,
    fmt: CastFormat,
    block: (usize, usize),
    opts: ScaleOptions,
    q: &QuantData,
    sf: &HostScales,
) {
    let (m, k) = (x.shape()[0], x.shape()[1]);
    let x = x.as_slice();
    let (bm, bk) = block;
    let (q_max, eps, grid) = match fmt {
        CastFormat::E4M3 => (448.0, 1e-4f32, e4m3_grid()),
        CastFormat::E2M1 => (6.0, f32::from_bits(0x01C0_0000), e2m1_grid()),
    };
    assert_eq!(
        sf.grid(),
        ScaleGrid::new(m.div_ceil(bm), k.div_ceil(bk)).unwrap()
    );
    let mut inv = vec![0.0f32; sf.grid().nbm() * sf.grid().nbk()];
    for mb in 0..m.div_ceil(bm) {
        for kb in 0..k.div_ceil(bk) {
            let mut amax = 0.0f32;
            for r in mb * bm..((mb + 1) * bm).min(m) {
                for c in kb * bk..((kb + 1) * bk).min(k) {
                    amax = amax.max(x[r * k + c].abs());
                }
            }
            let c = amax.max(eps);
            let (want_sf, want_inv) = if opts.round_sf {
                let p = pow2_ceil(div_f32(c, q_max));
                (p, 1.0 / p)
            } else {
                (div_f32(c, q_max), div_f32(q_max, c))
            };
            let got = sf.get(mb, kb).unwrap();
            assert_eq!(got.to_bits(), want_sf.to_bits(), "{case}: sf[{mb}, {kb}]");
            inv[mb * sf.grid().nbk() + kb] = want_inv;
        }
    }
    let bytes = q.bytes();
    for r in 0..m {
        for c in 0..k {
            let i = r * k + c;
            let code = match fmt {
                CastFormat::E4M3 => bytes[i],
                CastFormat::E2M1 => (bytes[i / 2] >> (4 * (c % 2))) & 0xF,
            };
            let y = x[i] * inv[(r / bm) * sf.grid().nbk() + c / bk];
            let sign_bit = if fmt == E4M3 { 0x80 } else { 0x8 };
            assert_eq!(
                code & sign_bit != 0,
                y.is_sign_negative(),
                "{case}: sign of {i}"
            );
            let what = format!("{case}: element ({r}, {c})");
            assert_nearest(&what, y, code & (sign_bit - 1), &grid);
            // Half a quantum: the gap between the grid values around |y|, halved.
            let a = y.abs() as f64;
            let dec = fmt.decode(code) as f64;
            if a < grid.last().unwrap().1 {
                let i = grid.partition_point(|g| g.1 <= a);
                let (lo, hi) = (grid[i - 1].1, grid[i].1);
                assert!(
                    (dec.abs() - a).abs() <= (hi - lo) / 2.0,
                    "{what}: {y} → {dec}"
                );
            }
        }
    }
}

#[test]
fn random_casts_match_independent_formulas() {
    let mut rng = Rng::new(7);
    let (m, k) = (19, 160);
    let x = rng.randn(&[m, k], |v| v);
    let xb = rng.randn(&[m, k], bf16::from_f32);
    let xb_f32 = HostTensor::from_fn(&[m, k], |i| xb.as_slice()[i].to_f32());
    for fmt in [E4M3, E2M1] {
        for block in [
            (1, 32),
            (1, 128),
            (1, k),
            (32, 32),
            (128, 128),
            (128, 1),
            (3, 7),
        ] {
            for opts in all_configs() {
                let case = format!("{fmt:?} {block:?} {opts:?}");
                let (q, sf) = cast_f32(&x, fmt, block, opts);
                check_cast_properties(&case, &x, fmt, block, opts, &q, &sf);
                let (q, sf) = cast(&xb.view().into(), fmt, block, opts).unwrap();
                check_cast_properties(&case, &xb_f32, fmt, block, opts, &q, &sf);
            }
        }
    }
}

#[test]
fn round_trips_within_spec_tolerance() {
    let mut rng = Rng::new(11);
    let (m, k) = (37, 576);
    let x = rng.randn(&[m, k], |v| v);
    let xb = rng.randn(&[m, k], bf16::from_f32);
    let xb_f32: Vec<f32> = xb.as_slice().iter().map(|v| v.to_f32()).collect();
    for fmt in [E4M3, E2M1] {
        let tol = if fmt == E4M3 { 1e-3 } else { 2e-2 };
        for block in [(1, 32), (1, 128), (1, k), (32, 32), (128, 128)] {
            for opts in rounded_configs() {
                for (input, orig) in [
                    (CastInput::from(x.view()), x.as_slice()),
                    (CastInput::from(xb.view()), &xb_f32[..]),
                ] {
                    let (q, sf) = cast(&input, fmt, block, opts).unwrap();
                    let qi = QuantInput::new(q.view(), sf.view(), block);
                    let back = cast_back::<f32>(&qi).unwrap();
                    let case = format!("{fmt:?} {block:?} {opts:?}");
                    let d = calc_diff_f32(orig, back.as_slice());
                    assert!(d < tol, "{case}: calc_diff {d}");
                    check_bias(&case, back.as_slice(), orig);
                    // bf16 output is the RNE of the fp32 output.
                    let back16 = cast_back::<bf16>(&qi).unwrap();
                    for (a, b) in back16.as_slice().iter().zip(back.as_slice()) {
                        assert_eq!(a.to_bits(), bf16::from_f32(*b).to_bits());
                    }
                    let b16: Vec<f32> = back16.as_slice().iter().map(|v| v.to_f32()).collect();
                    assert!(calc_diff_f32(orig, &b16) < tol);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Modes
// ---------------------------------------------------------------------------------------------

#[test]
fn sf_only_equals_cast_scales() {
    let x = Rng::new(3).randn(&[9, 100], |v| v);
    for fmt in [E4M3, E2M1] {
        for block in [(1, 32), (4, 16)] {
            for opts in all_configs() {
                let (_, sf) = cast_f32(&x, fmt, block, opts);
                let only = cast_sf_only(&x.view().into(), fmt, block, opts).unwrap();
                assert_eq!(only.storage_bytes(), sf.storage_bytes());
                assert_eq!(only.layout(), sf.layout());
            }
        }
    }
}

#[test]
fn precomputed_scales() {
    let mut rng = Rng::new(5);
    let x = rng.randn(&[9, 100], |v| v);
    let xb = rng.randn(&[9, 100], bf16::from_f32); // bf16 values hit e4m3/e2m1 ties often
    for fmt in [E4M3, E2M1] {
        // Power-of-two scales from a rounded cast reproduce its data bit for bit, also through a
        // view with padded rows.
        for input in [CastInput::from(x.view()), CastInput::from(xb.view())] {
            let (q, sf) = cast(&input, fmt, (2, 32), ScaleOptions::row_major(true)).unwrap();
            let grid = sf.grid();
            let a = sf.f32_storage().unwrap();
            let dense = HostTensor::from_vec(a.to_vec(), &[grid.nbm(), grid.nbk()]).unwrap();
            let got = cast_with_precomputed_sf(&input, fmt, (2, 32), &dense.view()).unwrap();
            assert_eq!(got, q);
            let padded: Vec<f32> = a
                .chunks(grid.nbk())
                .flat_map(|r| [r, &[9.0; 3]].concat())
                .collect();
            let padded = HostTensor::from_vec(padded, &[grid.nbm(), grid.nbk() + 3]).unwrap();
            let view = padded.view().narrow(1, 0, grid.nbk()).unwrap();
            let got = cast_with_precomputed_sf(&input, fmt, (2, 32), &view).unwrap();
            assert_eq!(got, q);
        }
        // Arbitrary scales: inv = fl(1/sf), q = enc(fl(x · inv)).
        let sfs = HostTensor::from_fn(&[5, 4], |_| 0.01 + rng.uniform());
        let got = cast_with_precomputed_sf(&x.view().into(), fmt, (2, 32), &sfs.view()).unwrap();
        let want: Vec<u8> = (0..900)
            .map(|i| {
                let inv = 1.0 / sfs.as_slice()[(i / 100 / 2) * 4 + (i % 100) / 32];
                fmt.encode(x.as_slice()[i] * inv)
            })
            .collect();
        let want = match fmt {
            E4M3 => want,
            E2M1 => want.chunks(2).map(|p| p[0] | (p[1] << 4)).collect(),
        };
        assert_eq!(got.bytes(), want);
    }
    // A zero scale gives inv = +inf: positive → 448, zero → NaN (0x7F), negative → −448.
    let x = f32s(1, 3, &[1.0, 0.0, -2.0]);
    let zero = f32s(1, 1, &[0.0]);
    let got = cast_with_precomputed_sf(&x.view().into(), E4M3, (1, 3), &zero.view()).unwrap();
    assert_eq!(got.bytes(), [0x7E, 0x7F, 0xFE]);
    // Rejections: shape, column-major strides, rank.
    let x = Rng::new(1).randn(&[8, 64], |v| v);
    let wrong = HostTensor::from_vec(vec![1.0f32; 6], &[2, 3]).unwrap();
    let e = cast_with_precomputed_sf(&x.view().into(), E4M3, (4, 32), &wrong.view()).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "sf", .. }), "{e:?}");
    let colmaj = wrong
        .view()
        .with_layout(Layout::new(vec![2, 2], vec![1, 2], 0).unwrap())
        .unwrap();
    let e = cast_with_precomputed_sf(&x.view().into(), E4M3, (4, 32), &colmaj).unwrap_err();
    assert!(matches!(e, TkError::Stride { arg: "sf", .. }), "{e:?}");
    let rank3 = wrong
        .view()
        .with_layout(Layout::contiguous(&[1, 2, 2]))
        .unwrap();
    let e = cast_with_precomputed_sf(&x.view().into(), E4M3, (4, 32), &rank3).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "sf", .. }), "{e:?}");
    // Input and block errors are reported before sf errors.
    let e = cast_with_precomputed_sf(&x.view().into(), E4M3, (0, 32), &wrong.view()).unwrap_err();
    assert_eq!(err_arg(&e), "block_size");
}

// ---------------------------------------------------------------------------------------------
// Quantized input (requantization)
// ---------------------------------------------------------------------------------------------

#[test]
fn requantization_uses_the_reference_order() {
    // data [9, 448] with per-element fp32 scales [s0, s1] (x_block_size (1, 1)), requantized to
    // e4m3 per row, non-rounded. amax = fl(448·s1), inv = fl(448/amax).
    let s0 = f32::from_bits(0x3FAB_1533);
    let s1 = f32::from_bits(0x3F92_A475);
    let data = e4m3_data(1, 2, &[0x51, 0x7E]);
    let in_sf = HostScales::from_grid(
        ScaleLayout::RowMajorF32,
        ScaleGrid::new(1, 2).unwrap(),
        &[s0, s1],
    )
    .unwrap();
    let x = QuantInput::new(QuantDataView::E4M3(data.view()), in_sf.view(), (1, 1));
    let (q, sf) = cast(&x.into(), E4M3, (1, 2), ScaleOptions::default()).unwrap();
    let amax = 448.0 * s1;
    let inv = div_f32(448.0, amax);
    assert_eq!(
        sf.get(0, 0).unwrap().to_bits(),
        div_f32(amax, 448.0).to_bits()
    );
    // Reference order: fl(fl(9·s0)·inv) = 10.5 exactly, a tie → 10 (0x52).
    let reference = (9.0 * s0) * inv;
    assert_eq!(reference, 10.5);
    assert_eq!(q.bytes()[0], 0x52);
    // The kernel's folded order, fl(9·fl(s0·inv)), would give 10.500001 → 11 (0x53): this
    // example tells the two apart.
    let folded = 9.0 * (s0 * inv);
    assert_eq!(e4m3_from_f32(folded), 0x53);
    assert_eq!(q.bytes()[1], 0x7E);
}

#[test]
fn requantization_equals_cast_of_dequantized_values() {
    // Upstream's test setup: x0 = randn bf16, quantized by the reference with x_block_size and
    // the same layout flags as the output, then requantized per token.
    let mut rng = Rng::new(9);
    let (m, k) = (45, 192);
    let x0 = rng.randn(&[m, k], bf16::from_f32);
    for in_fmt in [E4M3, E2M1] {
        for x_block in [(32, 32), (128, 128), (1, 64)] {
            for fmt in [E4M3, E2M1] {
                for npc in [32, 128] {
                    let mut outputs = Vec::new();
                    for opts in rounded_configs() {
                        let (qin, sin) = cast(&x0.view().into(), in_fmt, x_block, opts).unwrap();
                        let qi = QuantInput::new(qin.view(), sin.view(), x_block);
                        let (q, sf) = cast(&qi.clone().into(), fmt, (1, npc), opts).unwrap();
                        // The same cast of the dequantized fp32 values fl(dec · s_in).
                        let deq = cast_back::<f32>(&qi).unwrap();
                        let (q2, sf2) = cast_f32(&deq, fmt, (1, npc), opts);
                        assert_eq!(q, q2);
                        assert_eq!(sf.storage_bytes(), sf2.storage_bytes());
                        let d = calc_diff_f32(
                            &x0.as_slice().iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
                            &back_f32(&q, &sf, (1, npc)),
                        );
                        assert!(
                            d < if fmt == E2M1 || in_fmt == E2M1 {
                                4e-2
                            } else {
                                2e-3
                            },
                            "{d}"
                        );
                        outputs.push((q, sf.to_grid()));
                    }
                    // The input scale layout never changes the result.
                    assert_eq!(outputs[0], outputs[1]);
                    assert_eq!(outputs[0], outputs[2]);
                }
            }
        }
    }
}

#[test]
fn quantized_e2m1_input_decodes_nibbles_in_column_order() {
    // Byte 0x71: column 0 = code 1 (0.5), column 1 = code 7 (6); byte 0xF8: −0.0, −6.
    let data = HostTensor::from_vec(vec![E2M1x2(0x71), E2M1x2(0xF8)], &[1, 2]).unwrap();
    let sf = HostScales::from_grid(
        ScaleLayout::PackedUe8m0,
        ScaleGrid::new(1, 1).unwrap(),
        &[4.0],
    )
    .unwrap();
    let qi = QuantInput::new(QuantDataView::E2M1(data.view()), sf.view(), (1, 4));
    let back = cast_back::<f32>(&qi).unwrap();
    assert_eq!(bits(back.as_slice()), bits(&[2.0, 24.0, -0.0, -24.0]));
    // Requantized to e4m3, one scale per row: amax 24 → sf = 2^-4 rounded (24/448 ≈ 0.054).
    let (q, sf) = cast(&qi.into(), E4M3, (1, 4), ScaleOptions::packed_ue8m0()).unwrap();
    assert_eq!(sf.get(0, 0), Some(0.0625));
    // inv = 16: 32, 384 (1.5·2^8), −0, −384.
    assert_eq!(q.bytes(), [0x60, 0x7C, 0x80, 0xFC]);
}

// ---------------------------------------------------------------------------------------------
// NaN and infinity (§5 item 6: unsupported upstream; we follow the GPU)
// ---------------------------------------------------------------------------------------------

#[test]
fn nan_and_inf_follow_the_gpu() {
    // NaN is ignored by amax (fmaxf) and encodes to 0x7F / +6 whatever its sign.
    let x = f32s(1, 4, &[1.0, f32::NAN, -2.0, -f32::NAN]);
    let (q, sf) = cast_f32(&x, E4M3, (1, 4), ScaleOptions::default());
    assert_eq!(
        sf.get(0, 0).unwrap().to_bits(),
        div_f32(2.0, 448.0).to_bits()
    );
    assert_eq!(q.bytes(), [0x76, 0x7F, 0xFE, 0x7F]); // inv = 224: 224, NaN, −448, NaN
    let (q, sf) = cast_f32(&x, E2M1, (1, 4), ScaleOptions::default());
    assert_eq!(sf.get(0, 0), Some(div_f32(2.0, 6.0)));
    assert_eq!(q.bytes(), [0x75, 0x7F]); // inv = 3: 3 (code 5), NaN (7), −6 (15), NaN (7)
                                         // An infinite amax, non-rounded: sf = +inf, inv = 0 → ±0, and inf·0 = NaN → 0x7F.
    let x = f32s(1, 4, &[f32::INFINITY, 1.0, -1.0, 0.0]);
    let (q, sf) = cast_f32(&x, E4M3, (1, 4), ScaleOptions::default());
    assert_eq!(sf.get(0, 0), Some(f32::INFINITY));
    assert_eq!(q.bytes(), [0x7F, 0x00, 0x80, 0x00]);
    // Rounded: sf = +inf (UE8M0 byte 255), inv = −inf (the kernel's wrapped exponent).
    let (q, sf) = cast_f32(&x, E4M3, (1, 4), ScaleOptions::packed_ue8m0());
    assert_eq!(sf.ue8m0_byte(0, 0), Some(255));
    assert_eq!(sf.get(0, 0), Some(f32::INFINITY));
    // inf·−inf = −inf → −448; 1·−inf → −448; −1·−inf → 448; 0·−inf = NaN → 0x7F.
    assert_eq!(q.bytes(), [0xFE, 0xFE, 0x7E, 0x7F]);
    let (q, _) = cast_f32(&x, E2M1, (1, 4), ScaleOptions::row_major(true));
    assert_eq!(q.bytes(), [0xFF, 0x77]);
}

// ---------------------------------------------------------------------------------------------
// Layout of the input, empty input
// ---------------------------------------------------------------------------------------------

#[test]
fn strided_rows_match_contiguous() {
    let mut rng = Rng::new(13);
    let (m, k) = (7, 96);
    let buf = rng.randn(&[m, 2 * k], |v| v);
    let bufb = HostTensor::from_vec(
        buf.as_slice().iter().map(|&v| bf16::from_f32(v)).collect(),
        &[m, 2 * k],
    )
    .unwrap();
    let contiguous = buf.view().narrow(1, 0, k).unwrap().to_tensor();
    let contiguous_b = bufb.view().narrow(1, 0, k).unwrap().to_tensor();
    for fmt in [E4M3, E2M1] {
        for opts in all_configs() {
            for block in [(1, 32), (2, 64)] {
                let want = cast_f32(&contiguous, fmt, block, opts);
                let got = cast(
                    &buf.view().narrow(1, 0, k).unwrap().into(),
                    fmt,
                    block,
                    opts,
                )
                .unwrap();
                assert_eq!(got.0, want.0);
                assert_eq!(got.1.storage_bytes(), want.1.storage_bytes());
                let want = cast(&contiguous_b.view().into(), fmt, block, opts).unwrap();
                let got = cast(
                    &bufb.view().narrow(1, 0, k).unwrap().into(),
                    fmt,
                    block,
                    opts,
                )
                .unwrap();
                assert_eq!(got.0, want.0);
                assert_eq!(got.1.storage_bytes(), want.1.storage_bytes());
            }
        }
    }
}

#[test]
fn empty_input() {
    let x = HostTensor::<f32>::from_vec(vec![], &[0, 300]).unwrap();
    for fmt in [E4M3, E2M1] {
        for opts in all_configs() {
            let (q, sf) = cast_f32(&x, fmt, (1, 128), opts);
            let width = if fmt == E4M3 { 300 } else { 150 };
            assert_eq!(q.shape(), [0, width]);
            assert_eq!((sf.grid().nbm(), sf.grid().nbk()), (0, 3));
            let layout = opts.layout().unwrap();
            let (shape, strides) = match layout {
                ScaleLayout::RowMajorF32 => ([0, 3], [3, 1]),
                ScaleLayout::ColMajorF32 => ([0, 3], [1, 1]),
                ScaleLayout::PackedUe8m0 => ([0, 1], [1, 1]),
            };
            assert_eq!((sf.shape(), sf.strides()), (shape, strides), "{opts:?}");
            assert!(sf.storage_bytes().is_empty());
            let only = cast_sf_only(&x.view().into(), fmt, (1, 128), opts).unwrap();
            assert_eq!(only, sf);
            let back = cast_back::<bf16>(&QuantInput::new(q.view(), sf.view(), (1, 128))).unwrap();
            assert_eq!(back.shape(), [0, 300]);
        }
        let none = HostTensor::<f32>::from_vec(vec![], &[0, 3]).unwrap();
        let q = cast_with_precomputed_sf(&x.view().into(), fmt, (1, 128), &none.view()).unwrap();
        assert_eq!(q.logical_shape(), (0, 300));
    }
}

// ---------------------------------------------------------------------------------------------
// Rejections
// ---------------------------------------------------------------------------------------------

#[test]
fn rejections_name_the_argument() {
    let x = f32s(2, 6, &[1.0; 12]);
    let xv: CastInput<'_> = x.view().into();
    let bad_opts = ScaleOptions {
        round_sf: false,
        use_tma_aligned_col_major_sf: true,
        use_packed_ue8m0: true,
    };
    assert_param(
        cast(&xv, E4M3, (1, 2), bad_opts).unwrap_err(),
        "use_packed_ue8m0",
        &["round_sf"],
    );
    assert_param(
        cast_sf_only(&xv, E4M3, (1, 2), bad_opts).unwrap_err(),
        "use_packed_ue8m0",
        &["round_sf"],
    );
    let bad_opts = ScaleOptions {
        round_sf: true,
        use_tma_aligned_col_major_sf: false,
        use_packed_ue8m0: true,
    };
    assert_param(
        cast(&xv, E4M3, (1, 2), bad_opts).unwrap_err(),
        "use_packed_ue8m0",
        &["column"],
    );
    for block in [(0, 2), (1, 0)] {
        assert_param(
            cast(&xv, E4M3, block, ScaleOptions::default()).unwrap_err(),
            "block_size",
            &["at least 1"],
        );
    }
    // Shape of x: rank, column stride, K = 0, odd K for e2m1 (also when M = 0).
    let rank3 = x
        .view()
        .with_layout(Layout::contiguous(&[2, 2, 3]))
        .unwrap();
    let e = cast(&rank3.into(), E4M3, (1, 2), ScaleOptions::default()).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "x", .. }), "{e:?}");
    let cols2 = x
        .view()
        .with_layout(Layout::new(vec![2, 3], vec![6, 2], 0).unwrap())
        .unwrap();
    let e = cast(&cols2.into(), E4M3, (1, 2), ScaleOptions::default()).unwrap_err();
    assert!(matches!(e, TkError::Stride { arg: "x", .. }), "{e:?}");
    let k0 = HostTensor::<bf16>::from_vec(vec![], &[3, 0]).unwrap();
    let e = cast(&k0.view().into(), E4M3, (1, 2), ScaleOptions::default()).unwrap_err();
    assert!(matches!(e, TkError::Empty { arg: "x", .. }), "{e:?}");
    for m in [2, 0] {
        let odd = HostTensor::<f32>::from_vec(vec![1.0; 5 * m], &[m, 5]).unwrap();
        let e = cast(&odd.view().into(), E2M1, (1, 2), ScaleOptions::default()).unwrap_err();
        assert!(matches!(e, TkError::Shape { arg: "x", .. }), "{e:?}");
        assert!(cast(&odd.view().into(), E4M3, (1, 2), ScaleOptions::default()).is_ok());
    }
    // Quantized input: data, x_block_size, x.sf (shape, dtype/strides).
    let (q, sf) = cast_f32(&x, E4M3, (1, 2), ScaleOptions::packed_ue8m0());
    let good = QuantInput::new(q.view(), sf.view(), (1, 2));
    assert!(cast_back::<f32>(&good).is_ok());
    let bad_block = QuantInput::new(q.view(), sf.view(), (0, 2));
    assert_param(
        cast_back::<f32>(&bad_block).unwrap_err(),
        "x_block_size",
        &["at least 1"],
    );
    let e = cast(&bad_block.into(), E4M3, (1, 2), ScaleOptions::default()).unwrap_err();
    assert_eq!(err_arg(&e), "x_block_size");
    let wrong_grid = QuantInput::new(q.view(), sf.view(), (2, 2));
    let e = cast_back::<f32>(&wrong_grid).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "x.sf", .. }), "{e:?}");
    let e = cast(&wrong_grid.into(), E2M1, (1, 2), ScaleOptions::default()).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "x.sf", .. }), "{e:?}");
    // Packed scales stored row-major: rejected by the reader rules.
    let words = vec![Ue8m0x4(0x7F7F_7F7F); 2];
    let row_major = HostView::new(&words, Layout::contiguous(&[2, 1])).unwrap();
    let row_major = row_major
        .with_layout(Layout::new(vec![2, 1], vec![1, 1], 0).unwrap())
        .unwrap();
    assert!(cast_back::<f32>(&QuantInput::new(
        q.view(),
        ScaleView::Packed(row_major),
        (1, 2)
    ))
    .is_ok());
    let words4 = vec![Ue8m0x4(0x7F7F_7F7F); 4];
    let pk = HostView::new(&words4, Layout::contiguous(&[2, 2])).unwrap();
    let e =
        cast_back::<f32>(&QuantInput::new(q.view(), ScaleView::Packed(pk), (1, 1))).unwrap_err();
    assert!(matches!(e, TkError::Dtype { arg: "x.sf", .. }), "{e:?}");
    // Quantized data with a column stride.
    let bytes = e4m3_data(2, 6, &[0x38; 12]);
    let strided = bytes
        .view()
        .with_layout(Layout::new(vec![2, 3], vec![6, 2], 0).unwrap())
        .unwrap();
    let sf3 = HostScales::zeros(ScaleLayout::RowMajorF32, ScaleGrid::new(2, 3).unwrap());
    let e = cast_back::<f32>(&QuantInput::new(
        QuantDataView::E4M3(strided),
        sf3.view(),
        (1, 1),
    ))
    .unwrap_err();
    assert!(matches!(e, TkError::Stride { arg: "x", .. }), "{e:?}");
    // Plain input types also come in through PlainInput.
    let p = PlainInput::from(x.view());
    assert_eq!(p.validate("x").unwrap(), (2, 6));
}

// ---------------------------------------------------------------------------------------------
// Cast back
// ---------------------------------------------------------------------------------------------

#[test]
fn cast_back_hand_examples_in_every_layout() {
    // Row 0: 1, −1, 448, 2^-9; row 1: 2, 0, −0, 1.5. Block (1, 2); scales [[0.5, 4], [2^-10, 1]].
    let data = e4m3_data(2, 4, &[0x38, 0xB8, 0x7E, 0x01, 0x40, 0x00, 0x80, 0x3C]);
    let grid = ScaleGrid::new(2, 2).unwrap();
    let want = [
        0.5,
        -0.5,
        1792.0,
        2f32.powi(-7),
        2f32.powi(-9),
        0.0,
        -0.0,
        1.5,
    ];
    for layout in [
        ScaleLayout::RowMajorF32,
        ScaleLayout::ColMajorF32,
        ScaleLayout::PackedUe8m0,
    ] {
        let sf = HostScales::from_grid(layout, grid, &[0.5, 4.0, 2f32.powi(-10), 1.0]).unwrap();
        let qi = QuantInput::new(QuantDataView::E4M3(data.view()), sf.view(), (1, 2));
        let got = cast_back::<f32>(&qi).unwrap();
        assert_eq!(got.shape(), [2, 4]);
        assert_eq!(bits(got.as_slice()), bits(&want), "{layout:?}");
    }
    // bf16 output rounds to nearest even: 1 + 2^-8 (a tie) → 1.0; 1 + 3·2^-8 (a tie) → 1 + 2^-6.
    let ones = e4m3_data(1, 4, &[0x38; 4]);
    for layout in [ScaleLayout::RowMajorF32, ScaleLayout::ColMajorF32] {
        let sf = HostScales::from_grid(
            layout,
            ScaleGrid::new(1, 2).unwrap(),
            &[1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8)],
        )
        .unwrap();
        let qi = QuantInput::new(QuantDataView::E4M3(ones.view()), sf.view(), (1, 2));
        let got = cast_back::<bf16>(&qi).unwrap();
        let got: Vec<u16> = got.as_slice().iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, [0x3F80, 0x3F80, 0x3F82, 0x3F82]);
    }
    // UE8M0 byte 0 is +0.0 (1·0 = 0, −1·0 = −0) and byte 255 is +inf (1·inf = inf, 0·inf = NaN).
    let d = e4m3_data(1, 4, &[0x38, 0xB8, 0x38, 0x00]);
    let sf = HostScales::from_grid(
        ScaleLayout::PackedUe8m0,
        ScaleGrid::new(1, 2).unwrap(),
        &[0.0, f32::INFINITY],
    )
    .unwrap();
    assert_eq!(sf.storage_bytes()[..4], [0, 255, 0, 0]);
    let got = cast_back::<f32>(&QuantInput::new(
        QuantDataView::E4M3(d.view()),
        sf.view(),
        (1, 2),
    ))
    .unwrap();
    let g = got.as_slice();
    assert_eq!(
        (g[0].to_bits(), g[1].to_bits(), g[2]),
        (0, 0x8000_0000, f32::INFINITY)
    );
    assert!(g[3].is_nan());
}

#[test]
fn cast_back_is_exact_product_on_random_codes() {
    // Every code (NaN aside) times random scales: fl(dec · s), with partial blocks.
    let mut rng = Rng::new(21);
    let (m, k) = (5, 30);
    let codes: Vec<u8> = (0..m * k)
        .map(|_| (rng.next_u64() & 0xFF) as u8)
        .map(|c| if c & 0x7F == 0x7F { 0x7E } else { c })
        .collect();
    let data = e4m3_data(m, k, &codes);
    let grid = ScaleGrid::for_matrix(m, k, (2, 8)).unwrap();
    let sf =
        HostScales::from_fn(ScaleLayout::ColMajorF32, grid, |_, _| rng.uniform() * 4.0).unwrap();
    let qi = QuantInput::new(QuantDataView::E4M3(data.view()), sf.view(), (2, 8));
    let got = cast_back::<f32>(&qi).unwrap();
    let got16 = cast_back::<bf16>(&qi).unwrap();
    for (i, &code) in codes.iter().enumerate() {
        let (r, c) = (i / k, i % k);
        let want = e4m3_to_f32(code) * sf.get(r / 2, c / 8).unwrap();
        assert_eq!(got.as_slice()[i].to_bits(), want.to_bits());
        assert_eq!(got16.as_slice()[i], bf16::from_f32(want));
    }
    // e2m1: every nibble pair.
    let bytes: Vec<E2M1x2> = (0..=255u8).map(E2M1x2).collect();
    let data = HostTensor::from_vec(bytes, &[16, 16]).unwrap();
    let sf = HostScales::from_fn(
        ScaleLayout::PackedUe8m0,
        ScaleGrid::new(16, 1).unwrap(),
        |mb, _| 2f32.powi(mb as i32 - 8),
    )
    .unwrap();
    let got = cast_back::<f32>(&QuantInput::new(
        QuantDataView::E2M1(data.view()),
        sf.view(),
        (1, 32),
    ))
    .unwrap();
    for b in 0..256usize {
        let (r, j) = (b / 16, b % 16);
        let s = 2f32.powi(r as i32 - 8);
        assert_eq!(
            got.as_slice()[r * 32 + 2 * j].to_bits(),
            (e2m1_to_f32(b as u8 & 0xF) * s).to_bits()
        );
        assert_eq!(
            got.as_slice()[r * 32 + 2 * j + 1].to_bits(),
            (e2m1_to_f32(b as u8 >> 4) * s).to_bits()
        );
    }
}

#[test]
fn equality_is_bitwise() {
    // float8's own `==` says +0 == −0 and NaN != NaN; QuantData and HostScales compare bits.
    let a = QuantData::E4M3(e4m3_data(1, 2, &[0x00, 0x7F]));
    let b = QuantData::E4M3(e4m3_data(1, 2, &[0x80, 0x7F]));
    assert_eq!(a, a.clone());
    assert_ne!(a, b);
    let e2 = QuantData::E2M1(HostTensor::from_vec(vec![E2M1x2(0x00)], &[1, 1]).unwrap());
    assert_ne!(QuantData::E4M3(e4m3_data(1, 1, &[0x00])), e2);
    let grid = ScaleGrid::new(1, 1).unwrap();
    let nan = HostScales::from_grid(ScaleLayout::RowMajorF32, grid, &[f32::NAN]).unwrap();
    assert_eq!(nan, nan.clone());
    let pz = HostScales::from_grid(ScaleLayout::RowMajorF32, grid, &[0.0]).unwrap();
    let nz = HostScales::from_grid(ScaleLayout::RowMajorF32, grid, &[-0.0]).unwrap();
    assert_ne!(pz, nz);
    assert_ne!(pz, pz.to_layout(ScaleLayout::ColMajorF32).unwrap());
}
