//! The per-block cast ops (`spec/quant.md` §3.3, §5): every precondition's rejection, a
//! hand-computed example, the §5 edge cases, and agreement with the generic reference.
#![cfg(feature = "cpu")]

mod common;
mod op_common;

use common::{calc_diff_f32, check_bias, div_f32, pow2_ceil};
use half::bf16;
use op_common::{
    all_configs, assert_err, bad_packed_configs, bits, codes, f32s, strided_buffer, to_bf16, widen,
    window,
};
use tk_core::convert::e4m3_from_f32;
use tk_core::testing::Rng;
use tk_core::{HostTensor, Layout};
use tk_quant::per_block_cast::{validate, validate_dims, BLOCK_SIZES};
use tk_quant::reference::{
    cast, cast_back, cast_sf_only, cast_with_precomputed_sf, per_block_cast,
    per_block_cast_with_precomputed_sf, per_block_cast_with_sf_only,
};
use tk_quant::{
    CastFormat, CastInput, CastMode, PerBlockCastParams, PlainInput, QuantInput, ScaleGrid,
    ScaleLayout, ScaleOptions,
};

const E4M3: CastFormat = CastFormat::E4M3;
const E2M1: CastFormat = CastFormat::E2M1;

fn params(fmt: CastFormat, block: (usize, usize), opts: ScaleOptions) -> PerBlockCastParams {
    PerBlockCastParams::new(fmt, block, opts)
}

fn blocks() -> Vec<(usize, usize)> {
    BLOCK_SIZES
        .iter()
        .flat_map(|&bm| BLOCK_SIZES.iter().map(move |&bk| (bm, bk)))
        .collect()
}

#[test]
fn validate_returns_the_plan() {
    let x = HostTensor::from_fn(&[45, 576], |i| i as f32);
    let xv = PlainInput::from(x.view());
    for opts in all_configs() {
        for (bm, bk) in blocks() {
            let p = validate(&xv, &params(E2M1, (bm, bk), opts), CastMode::Cast).unwrap();
            assert_eq!((p.m, p.k, p.block), (45, 576, (bm, bk)));
            assert_eq!(
                p.grid,
                ScaleGrid::new(45usize.div_ceil(bm), 576usize.div_ceil(bk)).unwrap()
            );
            assert_eq!(p.sf_layout, opts.layout().unwrap());
        }
    }
    let p = validate_dims(
        0,
        64,
        &params(E4M3, (128, 32), ScaleOptions::row_major(true)),
        CastMode::PrecomputedSf,
    )
    .unwrap();
    assert_eq!(
        (p.grid.nbm(), p.grid.nbk(), p.sf_layout),
        (0, 2, ScaleLayout::RowMajorF32)
    );
}

#[test]
fn rejections_name_the_argument() {
    let d = ScaleOptions::default();
    let x = HostTensor::from_fn(&[40, 128], |i| (i % 9) as f32 - 4.0);
    let xv = PlainInput::from(x.view());
    // K % 64 (M is unconstrained).
    for k in [32, 96, 130] {
        let xk = HostTensor::from_fn(&[4, k], |i| i as f32);
        let e = per_block_cast(&xk.view().into(), &params(E4M3, (32, 32), d)).unwrap_err();
        assert_err(e, "Shape", "x");
    }
    assert!(per_block_cast(&xv, &params(E4M3, (128, 128), d)).is_ok());
    // Block shapes other than {32, 128}².
    for block in [
        (64, 128),
        (1, 128),
        (128, 64),
        (0, 32),
        (32, 0),
        (16, 16),
        (128, 1),
    ] {
        let e = per_block_cast(&xv, &params(E4M3, block, d)).unwrap_err();
        assert_err(e, "Param", "block_size");
        let e = per_block_cast_with_sf_only(&xv, &params(E2M1, block, d)).unwrap_err();
        assert_err(e, "Param", "block_size");
    }
    // Scale flags.
    for opts in bad_packed_configs() {
        let e = per_block_cast(&xv, &params(E4M3, (32, 32), opts)).unwrap_err();
        assert_err(e, "Param", "use_packed_ue8m0");
        let e = per_block_cast_with_sf_only(&xv, &params(E4M3, (32, 32), opts)).unwrap_err();
        assert_err(e, "Param", "use_packed_ue8m0");
    }
    // Precomputed: layout A only; and the scales' shape.
    let sf = HostTensor::from_vec(vec![1.0f32; 8], &[2, 4]).unwrap();
    assert!(
        per_block_cast_with_precomputed_sf(&xv, &params(E4M3, (32, 32), d), &sf.view()).is_ok()
    );
    let e = per_block_cast_with_precomputed_sf(
        &xv,
        &params(E4M3, (32, 32), ScaleOptions::packed_ue8m0()),
        &sf.view(),
    )
    .unwrap_err();
    assert_err(e, "Param", "use_packed_ue8m0");
    let e = per_block_cast_with_precomputed_sf(
        &xv,
        &params(E4M3, (32, 32), ScaleOptions::col_major(true)),
        &sf.view(),
    )
    .unwrap_err();
    assert_err(e, "Param", "use_tma_aligned_col_major_sf");
    let e = per_block_cast_with_precomputed_sf(&xv, &params(E4M3, (32, 128), d), &sf.view())
        .unwrap_err();
    assert_err(e, "Shape", "sf");
    // x: K = 0, rank, column stride.
    let k0 = HostTensor::<bf16>::from_vec(vec![], &[3, 0]).unwrap();
    let e = per_block_cast(&k0.view().into(), &params(E4M3, (32, 32), d)).unwrap_err();
    assert_err(e, "Empty", "x");
    let rank3 = x
        .view()
        .with_layout(Layout::contiguous(&[2, 20, 128]))
        .unwrap();
    let e = per_block_cast(&rank3.into(), &params(E4M3, (32, 32), d)).unwrap_err();
    assert_err(e, "Shape", "x");
    let cols2 = x
        .view()
        .with_layout(Layout::new(vec![40, 64], vec![128, 2], 0).unwrap())
        .unwrap();
    let e = per_block_cast(&cols2.into(), &params(E4M3, (32, 32), d)).unwrap_err();
    assert_err(e, "Stride", "x");
}

#[test]
fn op_equals_generic_reference() {
    let mut rng = Rng::new(41);
    for (m, k) in [(45, 576), (130, 64)] {
        let x = rng.randn(&[m, k], |v| v);
        let xb = rng.randn(&[m, k], bf16::from_f32);
        for fmt in [E4M3, E2M1] {
            for block in blocks() {
                for opts in all_configs() {
                    for (input, orig) in [
                        (PlainInput::from(x.view()), x.clone()),
                        (PlainInput::from(xb.view()), widen(&xb)),
                    ] {
                        let case = format!("{fmt:?} ({m}, {k}) {block:?} {opts:?}");
                        let ci = CastInput::Plain(input.clone());
                        let p = params(fmt, block, opts);
                        let got = per_block_cast(&input, &p).unwrap();
                        assert_eq!(got, cast(&ci, fmt, block, opts).unwrap(), "{case}");
                        let only = per_block_cast_with_sf_only(&input, &p).unwrap();
                        assert_eq!(only, got.1, "{case}");
                        assert_eq!(only, cast_sf_only(&ci, fmt, block, opts).unwrap());
                        if !opts.use_tma_aligned_col_major_sf {
                            // Upstream's assertion 3: precomputed with the produced scales.
                            let g = got.1.grid();
                            let sf =
                                HostTensor::from_vec(got.1.to_grid(), &[g.nbm(), g.nbk()]).unwrap();
                            let pre =
                                per_block_cast_with_precomputed_sf(&input, &p, &sf.view()).unwrap();
                            assert_eq!(
                                pre,
                                cast_with_precomputed_sf(&ci, fmt, block, &sf.view()).unwrap()
                            );
                            if opts.round_sf {
                                assert_eq!(pre, got.0, "{case}");
                            }
                        }
                        // Upstream's assertion 2: no rounding bias after the round trip.
                        if opts.round_sf {
                            let back = cast_back::<f32>(&QuantInput::new(
                                got.0.view(),
                                got.1.view(),
                                block,
                            ))
                            .unwrap();
                            check_bias(&case, back.as_slice(), orig.as_slice());
                            let tol = if fmt == E4M3 { 1e-3 } else { 2e-2 };
                            assert!(calc_diff_f32(orig.as_slice(), back.as_slice()) < tol);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn hand_example_with_partial_row_blocks() {
    // M = 40, K = 64, block (32, 32): grid (2, 2), the second block row holds rows 32..40.
    // Block (0, 0): ones and a 7 → sf = 2^-6, inv = 64: 1 → 64 (0x68), 7 → 448 (0x7E).
    // Blocks (0, 1), (1, 1): ones → non-rounded inv = 448 → 0x7E; rounded sf = 2^-8 → 256 (0x78).
    // Block (1, 0): ones and a −3.5 → sf = 2^-7, inv = 128: 1 → 128 (0x70), −3.5 → 0xFE.
    let (m, k) = (40, 64);
    let mut v = vec![1.0f32; m * k];
    v[5 * k + 3] = 7.0;
    v[39 * k] = -3.5;
    let x = f32s(m, k, &v);
    for opts in all_configs() {
        let (q, sf) = per_block_cast(&x.view().into(), &params(E4M3, (32, 32), opts)).unwrap();
        let ones = if opts.round_sf { 0x78 } else { 0x7E };
        let want: Vec<u8> = (0..m * k)
            .map(|i| match (i / k, i % k) {
                (5, 3) => 0x7E,
                (39, 0) => 0xFE,
                (r, c) if r < 32 && c < 32 => 0x68,
                (_, c) if c < 32 => 0x70,
                _ => ones,
            })
            .collect();
        assert_eq!(q.bytes(), want, "{opts:?}");
        let unit = if opts.round_sf {
            2f32.powi(-8)
        } else {
            div_f32(1.0, 448.0)
        };
        assert_eq!(
            bits(&sf.to_grid()),
            bits(&[2f32.powi(-6), unit, 2f32.powi(-7), unit]),
            "{opts:?}"
        );
    }
    // Layout C: one int32 column of align(2, 4) = 4 rows; bytes 4j+b >= nbk and rows >= nbm zero.
    let (_, sf) = per_block_cast(
        &x.view().into(),
        &params(E4M3, (32, 32), ScaleOptions::packed_ue8m0()),
    )
    .unwrap();
    assert_eq!(
        sf.storage_bytes(),
        [121, 119, 0, 0, 120, 119, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!((sf.shape(), sf.strides()), ([2, 1], [1, 4]));
}

#[test]
fn partial_blocks_use_only_real_elements() {
    // M = 45 with bm = 32 / 128 and K = 576 with bk = 128: partial blocks at the bottom and
    // right; each scale from an independent max over the block's real elements.
    let mut rng = Rng::new(43);
    let x = rng.randn(&[45, 576], |v| v);
    for (bm, bk) in blocks() {
        for opts in all_configs() {
            let (q, sf) = per_block_cast(&x.view().into(), &params(E4M3, (bm, bk), opts)).unwrap();
            for mb in 0..45usize.div_ceil(bm) {
                for kb in 0..576usize.div_ceil(bk) {
                    let mut amax = 0.0f32;
                    for r in mb * bm..((mb + 1) * bm).min(45) {
                        for c in kb * bk..((kb + 1) * bk).min(576) {
                            amax = amax.max(x.as_slice()[r * 576 + c].abs());
                        }
                    }
                    let exact = div_f32(amax, 448.0);
                    let (s, inv) = if opts.round_sf {
                        (pow2_ceil(exact), 1.0 / pow2_ceil(exact))
                    } else {
                        (exact, div_f32(448.0, amax))
                    };
                    assert_eq!(sf.get(mb, kb).unwrap().to_bits(), s.to_bits());
                    let r = (mb * bm).min(44);
                    let c = kb * bk;
                    assert_eq!(
                        q.bytes()[r * 576 + c],
                        e4m3_from_f32(x.as_slice()[r * 576 + c] * inv)
                    );
                }
            }
        }
    }
}

#[test]
fn edge_cases() {
    // §5 items 1, 4, 6, 7 through the per-block op: an all-zero block (ε scales) with signed
    // zeros; an e2m1 block of fp32 subnormals scaled by 2^126 without flushing; NaN ignored.
    let t = |e: i32| 2f64.powi(e) as f32;
    let (m, k) = (64, 64);
    let mut v = vec![0.0f32; m * k];
    for r in 0..32 {
        for c in 0..32 {
            if (r + c) % 2 == 1 {
                v[r * k + c] = -0.0;
            }
        }
    }
    v[32 * k + 32] = t(-127); // block (1, 1): subnormals only
    v[33 * k + 33] = -t(-128) * 3.0;
    v[40] = f32::NAN; // block (0, 1)
    v[41] = 3.0;
    v[40 * k] = f32::INFINITY; // block (1, 0): an infinite amax
    v[40 * k + 1] = 1.0;
    let x = f32s(m, k, &v);
    for opts in all_configs() {
        let (q, sf) = per_block_cast(&x.view().into(), &params(E2M1, (32, 32), opts)).unwrap();
        let c = codes(&q);
        assert_eq!(sf.get(0, 0), Some(t(-126)));
        assert_eq!(sf.get(1, 1), Some(t(-126)));
        for r in 0..32 {
            for cc in 0..32 {
                assert_eq!(c[r * k + cc], if (r + cc) % 2 == 1 { 8 } else { 0 });
            }
        }
        assert_eq!((c[32 * k + 32], c[33 * k + 33]), (1, 10)); // 0.5, −0.75 → −1
                                                               // NaN ignored by amax: block (0, 1) scale from 3.0 (3/6 = 2^-1, rounded or not); NaN
                                                               // encodes to +6, 3 · 2 = 6 → code 7.
        assert_eq!(sf.get(0, 1), Some(0.5));
        assert_eq!((c[40], c[41]), (7, 7));
        let (q, sf) = per_block_cast(&x.view().into(), &params(E4M3, (32, 32), opts)).unwrap();
        let eps_sf = if opts.round_sf {
            t(-22)
        } else {
            div_f32(1e-4, 448.0)
        };
        assert_eq!(sf.get(0, 0).unwrap().to_bits(), eps_sf.to_bits());
        assert_eq!(q.bytes()[1], 0x80);
        assert_eq!(q.bytes()[40], 0x7F);
        // Infinite amax (§5 item 6, the GPU's behaviour): sf = +inf; non-rounded inv = 0
        // (inf → NaN 0x7F, 1 → 0, 0 → 0), rounded inv = −inf (inf, 1 → −448; 0 → NaN).
        assert_eq!(sf.get(1, 0), Some(f32::INFINITY));
        let b = q.bytes();
        let got = (b[40 * k], b[40 * k + 1], b[40 * k + 2]);
        assert_eq!(
            got,
            if opts.round_sf {
                (0xFE, 0xFE, 0x7F)
            } else {
                (0x7F, 0x00, 0x00)
            }
        );
    }
}

#[test]
fn empty_input_and_strided_rows() {
    let x = HostTensor::<f32>::from_vec(vec![], &[0, 192]).unwrap();
    for fmt in [E4M3, E2M1] {
        for opts in all_configs() {
            let (q, sf) = per_block_cast(&x.view().into(), &params(fmt, (128, 32), opts)).unwrap();
            assert_eq!(q.logical_shape(), (0, 192));
            let want = if opts.use_packed_ue8m0 { 2 } else { 6 };
            assert_eq!(sf.shape(), [0, want]);
        }
    }
    // Deviation: any row stride is accepted, with the results of a contiguous copy.
    let x = Rng::new(47).randn(&[37, 128], |v| v);
    let xb = to_bf16(&x);
    let buf = strided_buffer(&x, f32::MAX);
    let bufb = strided_buffer(&xb, bf16::MAX);
    for fmt in [E4M3, E2M1] {
        for opts in all_configs() {
            let p = params(fmt, (32, 128), opts);
            assert_eq!(
                per_block_cast(&window(&buf, 128).into(), &p).unwrap(),
                per_block_cast(&x.view().into(), &p).unwrap()
            );
            assert_eq!(
                per_block_cast(&window(&bufb, 128).into(), &p).unwrap(),
                per_block_cast(&xb.view().into(), &p).unwrap()
            );
        }
    }
}
