//! The per-token cast ops (`spec/quant.md` §3.1, §3.2, §5): every precondition's rejection,
//! hand-computed examples, the §5 edge cases, and agreement with the generic reference.
#![cfg(feature = "cpu")]

mod common;
mod op_common;

use common::{check_bias, div_f32, pow2_ceil};
use half::bf16;
use op_common::{
    all_configs, assert_err, bad_packed_configs, bits, codes, f32s, rounded_configs,
    strided_buffer, to_bf16, widen, window,
};
use tk_core::convert::e4m3_from_f32;
use tk_core::testing::Rng;
use tk_core::{HostTensor, Layout};
use tk_quant::per_token_cast::{
    validate, validate_dims, validate_e5m6, validate_e5m6_dims, NUM_PER_CHANNELS,
};
use tk_quant::reference::{
    cast, cast_back, cast_sf_only, cast_to_e5m6, cast_with_precomputed_sf, per_token_cast,
    per_token_cast_to_e5m6, per_token_cast_with_precomputed_sf, per_token_cast_with_sf_only,
};
use tk_quant::{
    CastFormat, CastInput, CastMode, PerTokenCastParams, PerTokenE5M6Params, PlainInput,
    QuantInput, ScaleGrid, ScaleLayout, ScaleOptions,
};

const E4M3: CastFormat = CastFormat::E4M3;
const E2M1: CastFormat = CastFormat::E2M1;

fn params(fmt: CastFormat, npc: usize, opts: ScaleOptions) -> PerTokenCastParams {
    PerTokenCastParams::new(fmt, npc, opts)
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

#[test]
fn validate_returns_the_plan() {
    let x = HostTensor::from_fn(&[5, 576], |i| i as f32);
    let xv: CastInput<'_> = x.view().into();
    for opts in all_configs() {
        let layout = opts.layout().unwrap();
        let p = validate(&xv, &params(E4M3, 128, opts), CastMode::Cast).unwrap();
        assert_eq!((p.m, p.k, p.block), (5, 576, (1, 128)));
        assert_eq!(p.grid, ScaleGrid::new(5, 5).unwrap()); // 576 = 4·128 + 64
        assert_eq!(p.sf_layout, layout);
        // npc == K: one scale per row.
        let p = validate(&xv, &params(E2M1, 576, opts), CastMode::Cast).unwrap();
        assert_eq!((p.block, p.grid), ((1, 576), ScaleGrid::new(5, 1).unwrap()));
        // sf-only has the same plan as the cast.
        let p = validate(&xv, &params(E4M3, 16, opts), CastMode::SfOnly).unwrap();
        assert_eq!(p.grid, ScaleGrid::new(5, 36).unwrap());
    }
    // Precomputed scales are read in layout A, whatever round_sf says.
    for round in [false, true] {
        let p = validate(
            &xv,
            &params(E4M3, 64, ScaleOptions::row_major(round)),
            CastMode::PrecomputedSf,
        )
        .unwrap();
        assert_eq!(p.sf_layout, ScaleLayout::RowMajorF32);
        assert_eq!(p.grid, ScaleGrid::new(5, 9).unwrap());
    }
    // Every allowed npc, also wider than K (one partial group).
    for npc in NUM_PER_CHANNELS {
        let p = validate_dims(
            3,
            40,
            false,
            &params(E2M1, npc, ScaleOptions::default()),
            CastMode::Cast,
        )
        .unwrap();
        assert_eq!(p.grid.nbk(), 40usize.div_ceil(npc));
    }
    // K need not be a multiple of 64 unless npc == K; odd K is fine for e4m3.
    assert!(validate_dims(
        3,
        17,
        false,
        &params(E4M3, 16, ScaleOptions::default()),
        CastMode::Cast
    )
    .is_ok());
    // M = 0 is fine.
    let p = validate_dims(
        0,
        128,
        true,
        &params(E4M3, 32, ScaleOptions::packed_ue8m0()),
        CastMode::Cast,
    )
    .unwrap();
    assert_eq!((p.grid.nbm(), p.grid.nbk()), (0, 4));
}

#[test]
fn rejections_name_the_argument() {
    let d = ScaleOptions::default();
    let x = HostTensor::from_fn(&[4, 192], |i| (i % 7) as f32 - 3.0);
    let xv: CastInput<'_> = x.view().into();
    let cast_op = |p: PerTokenCastParams| per_token_cast(&xv, &p).unwrap_err();

    // npc outside {16, 32, 64, 128} and != K.
    for npc in [0, 1, 8, 48, 96, 256, 191, 193] {
        assert_err(cast_op(params(E4M3, npc, d)), "Param", "num_per_channels");
    }
    // npc == K needs K % 64 == 0 (K = 96 here; 96 is not in the set).
    let x96 = HostTensor::from_fn(&[2, 96], |i| i as f32);
    let e = per_token_cast(&x96.view().into(), &params(E4M3, 96, d)).unwrap_err();
    assert_err(e, "Param", "num_per_channels");
    assert!(per_token_cast(&x96.view().into(), &params(E4M3, 32, d)).is_ok());
    assert!(per_token_cast(&x.view().into(), &params(E4M3, 192, d)).is_ok());

    // npc == K with sf-only or precomputed mode (also when K is in the set: K = npc = 128).
    let x128 = HostTensor::from_fn(&[2, 128], |i| i as f32);
    for xx in [&x, &x128] {
        let k = xx.shape()[1];
        let xi: CastInput<'_> = xx.view().into();
        let e = per_token_cast_with_sf_only(&xi, &params(E4M3, k, d)).unwrap_err();
        assert_err(e, "Param", "num_per_channels");
        let rows = xx.shape()[0];
        let sf = HostTensor::from_vec(vec![1.0f32; rows], &[rows, 1]).unwrap();
        let e =
            per_token_cast_with_precomputed_sf(&xi, &params(E4M3, k, d), &sf.view()).unwrap_err();
        assert_err(e, "Param", "num_per_channels");
    }

    // Quantized input: with npc == K, with sf-only, with precomputed.
    let (q, s) = cast(
        &x.view().into(),
        E4M3,
        (32, 32),
        ScaleOptions::row_major(true),
    )
    .unwrap();
    let qi: CastInput<'_> = QuantInput::new(q.view(), s.view(), (32, 32)).into();
    assert!(per_token_cast(&qi, &params(E2M1, 32, d)).is_ok());
    assert_err(
        per_token_cast(&qi, &params(E4M3, 192, d)).unwrap_err(),
        "Param",
        "num_per_channels",
    );
    assert_err(
        per_token_cast_with_sf_only(&qi, &params(E4M3, 32, d)).unwrap_err(),
        "Param",
        "x",
    );
    let sf = HostTensor::from_vec(vec![1.0f32; 4 * 6], &[4, 6]).unwrap();
    let e = per_token_cast_with_precomputed_sf(&qi, &params(E4M3, 32, d), &sf.view()).unwrap_err();
    assert_err(e, "Param", "x");

    // Scale flags: packed without round_sf or without column-major, in every mode.
    for opts in bad_packed_configs() {
        assert_err(cast_op(params(E4M3, 32, opts)), "Param", "use_packed_ue8m0");
        let e = per_token_cast_with_sf_only(&xv, &params(E4M3, 32, opts)).unwrap_err();
        assert_err(e, "Param", "use_packed_ue8m0");
    }
    // Precomputed mode: only layout A.
    let e = per_token_cast_with_precomputed_sf(
        &xv,
        &params(E4M3, 32, ScaleOptions::packed_ue8m0()),
        &sf.view(),
    )
    .unwrap_err();
    assert_err(e, "Param", "use_packed_ue8m0");
    for round in [false, true] {
        let e = per_token_cast_with_precomputed_sf(
            &xv,
            &params(E4M3, 32, ScaleOptions::col_major(round)),
            &sf.view(),
        )
        .unwrap_err();
        assert_err(e, "Param", "use_tma_aligned_col_major_sf");
    }
    // ... and the precomputed scales' shape and strides.
    let wrong = HostTensor::from_vec(vec![1.0f32; 4 * 5], &[4, 5]).unwrap();
    let e =
        per_token_cast_with_precomputed_sf(&xv, &params(E4M3, 32, d), &wrong.view()).unwrap_err();
    assert_err(e, "Shape", "sf");

    // x: odd K with e2m1 output (also for M = 0), K = 0, rank, column stride.
    for m in [3, 0] {
        let odd = HostTensor::from_vec(vec![1.0f32; m * 33], &[m, 33]).unwrap();
        let e = per_token_cast(&odd.view().into(), &params(E2M1, 32, d)).unwrap_err();
        assert_err(e, "Shape", "x");
        assert!(per_token_cast(&odd.view().into(), &params(E4M3, 32, d)).is_ok());
    }
    let k0 = HostTensor::<bf16>::from_vec(vec![], &[3, 0]).unwrap();
    assert_err(
        per_token_cast(&k0.view().into(), &params(E4M3, 32, d)).unwrap_err(),
        "Empty",
        "x",
    );
    let rank3 = x
        .view()
        .with_layout(Layout::contiguous(&[2, 2, 192]))
        .unwrap();
    assert_err(
        per_token_cast(&rank3.into(), &params(E4M3, 32, d)).unwrap_err(),
        "Shape",
        "x",
    );
    let cols2 = x
        .view()
        .with_layout(Layout::new(vec![4, 96], vec![192, 2], 0).unwrap())
        .unwrap();
    assert_err(
        per_token_cast(&cols2.into(), &params(E4M3, 32, d)).unwrap_err(),
        "Stride",
        "x",
    );
    // Quantized input whose scales do not match x_block_size.
    let bad_q: CastInput<'_> = QuantInput::new(q.view(), s.view(), (1, 32)).into();
    assert_err(
        per_token_cast(&bad_q, &params(E4M3, 32, d)).unwrap_err(),
        "Shape",
        "x.sf",
    );
    let zero_blk: CastInput<'_> = QuantInput::new(q.view(), s.view(), (0, 32)).into();
    assert_err(
        per_token_cast(&zero_blk, &params(E4M3, 32, d)).unwrap_err(),
        "Param",
        "x_block_size",
    );
}

#[test]
fn e5m6_rejections_and_plan() {
    let x = HostTensor::from_fn(&[3, 64], |i| i as f32 - 90.0);
    let xv = PlainInput::from(x.view());
    let p = validate_e5m6(
        &xv,
        &PerTokenE5M6Params::new(64, ScaleOptions::packed_ue8m0()),
    )
    .unwrap();
    assert_eq!((p.block, p.grid), ((1, 64), ScaleGrid::new(3, 1).unwrap()));
    assert_eq!(p.sf_layout, ScaleLayout::PackedUe8m0);
    // npc must equal K (any K % 8 == 0, not only K % 64 == 0).
    for npc in [32, 128, 63] {
        let e = per_token_cast_to_e5m6(&xv, &PerTokenE5M6Params::new(npc, ScaleOptions::default()))
            .unwrap_err();
        assert_err(e, "Param", "num_per_channels");
    }
    assert!(
        validate_e5m6_dims(2, 24, &PerTokenE5M6Params::new(24, ScaleOptions::default())).is_ok()
    );
    // K % 8.
    let x12 = HostTensor::from_fn(&[2, 12], |i| i as f32);
    let e = per_token_cast_to_e5m6(
        &x12.view().into(),
        &PerTokenE5M6Params::new(12, ScaleOptions::default()),
    )
    .unwrap_err();
    assert_err(e, "Shape", "x");
    // Scale flags.
    for opts in bad_packed_configs() {
        let e = per_token_cast_to_e5m6(&xv, &PerTokenE5M6Params::new(64, opts)).unwrap_err();
        assert_err(e, "Param", "use_packed_ue8m0");
    }
    // Empty K.
    let k0 = HostTensor::<f32>::from_vec(vec![], &[2, 0]).unwrap();
    let e = per_token_cast_to_e5m6(
        &k0.view().into(),
        &PerTokenE5M6Params::new(0, ScaleOptions::default()),
    )
    .unwrap_err();
    assert_err(e, "Empty", "x");
}

// ---------------------------------------------------------------------------------------------
// Agreement with the generic reference
// ---------------------------------------------------------------------------------------------

#[test]
fn op_equals_generic_reference_with_block_1_npc() {
    let mut rng = Rng::new(101);
    for (m, k) in [(9, 64), (7, 576), (5, 200)] {
        let x = rng.randn(&[m, k], |v| v);
        let xb = rng.randn(&[m, k], bf16::from_f32);
        for fmt in [E4M3, E2M1] {
            let mut npcs = NUM_PER_CHANNELS.to_vec();
            if k % 64 == 0 {
                npcs.push(k);
            }
            for &npc in &npcs {
                for opts in all_configs() {
                    for input in [CastInput::from(x.view()), CastInput::from(xb.view())] {
                        let case = format!("{fmt:?} ({m}, {k}) npc {npc} {opts:?}");
                        let p = params(fmt, npc, opts);
                        let got = per_token_cast(&input, &p).unwrap();
                        let want = cast(&input, fmt, (1, npc), opts).unwrap();
                        assert_eq!(got.0, want.0, "{case}");
                        assert_eq!(got.1, want.1, "{case}");
                        if npc == k {
                            continue;
                        }
                        let only = per_token_cast_with_sf_only(&input, &p).unwrap();
                        assert_eq!(only, got.1, "{case}");
                        assert_eq!(only, cast_sf_only(&input, fmt, (1, npc), opts).unwrap());
                        if opts.layout().unwrap() == ScaleLayout::RowMajorF32 {
                            // Precomputed with the op's own scales, rounded or not, equals the
                            // generic precomputed cast; with power-of-two scales it also
                            // reproduces the op's data.
                            let grid = got.1.grid();
                            let sf =
                                HostTensor::from_vec(got.1.to_grid(), &[grid.nbm(), grid.nbk()])
                                    .unwrap();
                            let pre =
                                per_token_cast_with_precomputed_sf(&input, &p, &sf.view()).unwrap();
                            let generic =
                                cast_with_precomputed_sf(&input, fmt, (1, npc), &sf.view())
                                    .unwrap();
                            assert_eq!(pre, generic, "{case}");
                            if opts.round_sf {
                                assert_eq!(pre, got.0, "{case}");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn e5m6_op_equals_generic_reference() {
    let mut rng = Rng::new(3);
    for (m, k) in [(5, 8), (6, 576), (0, 64)] {
        let x = rng.randn(&[m, k], |v| v * 100.0);
        let xb = to_bf16(&x);
        for opts in all_configs() {
            for input in [PlainInput::from(x.view()), PlainInput::from(xb.view())] {
                let got =
                    per_token_cast_to_e5m6(&input, &PerTokenE5M6Params::new(k, opts)).unwrap();
                let want = cast_to_e5m6(&input, opts).unwrap();
                assert_eq!(got.0.as_slice(), want.0.as_slice());
                assert_eq!(got.0.shape(), [m, 3 * k / 2]);
                assert_eq!(got.1, want.1);
                assert_eq!(got.1.grid(), ScaleGrid::new(m, 1).unwrap());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Hand-computed examples
// ---------------------------------------------------------------------------------------------

#[test]
fn e4m3_hand_example_with_partial_group() {
    // K = 40, npc = 16: groups [0, 16), [16, 32), [32, 40).
    // Group 0: 0.5 (×14), 7.0, −0.0: amax 7, sf = 2^-6, inv = 64 → 32 (0x60), 448 (0x7E), −0.
    // Group 1: 1.0 (×15), −3.5: amax 3.5, sf = 2^-7, inv = 128 → 128 (0x70), −448 (0xFE).
    // Group 2: 0 (×7), 0.25: non-rounded inv = fl(448/0.25) = 1792 → 448 (0x7E); rounded
    //          sf = 2^ceil(log2(0.25/448)) = 2^-10, inv = 1024 → 256 (0x78).
    let mut v = vec![0.5f32; 16];
    v[3] = 7.0;
    v[5] = -0.0;
    v.extend([1.0f32; 16]);
    v[20] = -3.5;
    v.extend([0.0f32; 8]);
    v[39] = 0.25;
    let x = f32s(1, 40, &v);
    let mut want = vec![0x60u8; 16];
    want[3] = 0x7E;
    want[5] = 0x80;
    want.extend([0x70u8; 16]);
    want[20] = 0xFE;
    want.extend([0x00u8; 8]);
    for opts in all_configs() {
        let (q, sf) = per_token_cast(&x.view().into(), &params(E4M3, 16, opts)).unwrap();
        want[39] = if opts.round_sf { 0x78 } else { 0x7E };
        assert_eq!(q.bytes(), want, "{opts:?}");
        let sf2 = if opts.round_sf {
            2f32.powi(-10)
        } else {
            div_f32(0.25, 448.0)
        };
        assert_eq!(
            bits(&sf.to_grid()),
            bits(&[2f32.powi(-6), 2f32.powi(-7), sf2]),
            "{opts:?}"
        );
    }
    // Layout C: UE8M0 bytes 121, 120, 117 in one int32; three padding rows of zeros.
    let (_, sf) = per_token_cast(
        &x.view().into(),
        &params(E4M3, 16, ScaleOptions::packed_ue8m0()),
    )
    .unwrap();
    let mut bytes = vec![0u8; 16];
    bytes[..3].copy_from_slice(&[121, 120, 117]);
    assert_eq!(sf.storage_bytes(), bytes);
    assert_eq!((sf.shape(), sf.strides()), ([1, 1], [1, 4]));
}

#[test]
fn e2m1_hand_example() {
    // K = 64, npc = 32. Group 0: amax 6 → sf = inv = 1; the ties 0.25→0, 0.75→1, 1.25→1,
    // 1.75→2, 2.5→2, 3.5→4, 5→4, then −6 (15) and −0.0 (8). Group 1: amax 12 → sf = 2,
    // inv = 0.5: 12 → 6 (7), 0.1 → 0.05 → 0, −0.5 → −0.25 → −0 (8), 7 → 3.5 → 4 (6).
    let mut v = vec![0.0f32; 64];
    v[..9].copy_from_slice(&[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -6.0, -0.0]);
    v[32..36].copy_from_slice(&[12.0, 0.1, -0.5, 7.0]);
    let x = f32s(1, 64, &v);
    let mut want = vec![0u8; 32];
    want[..5].copy_from_slice(&[0x20, 0x42, 0x64, 0xF6, 0x08]);
    want[16..18].copy_from_slice(&[0x07, 0x68]);
    for opts in all_configs() {
        let (q, sf) = per_token_cast(&x.view().into(), &params(E2M1, 32, opts)).unwrap();
        assert_eq!(q.shape(), [1, 32]);
        assert_eq!(q.bytes(), want, "{opts:?}");
        assert_eq!(sf.to_grid(), [1.0, 2.0]);
    }
}

#[test]
fn whole_row_groups_have_one_scale_per_row() {
    // npc == K (K = 128 is also in the set; K = 192 is not): one scale per row, from the
    // whole row's amax.
    let mut rng = Rng::new(17);
    for k in [128, 192] {
        let x = rng.randn(&[6, k], |v| v * 3.0);
        for opts in all_configs() {
            let (q, sf) = per_token_cast(&x.view().into(), &params(E4M3, k, opts)).unwrap();
            assert_eq!(sf.grid(), ScaleGrid::new(6, 1).unwrap());
            for r in 0..6 {
                let row = &x.as_slice()[r * k..(r + 1) * k];
                let amax = row.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let exact = div_f32(amax, 448.0);
                let (s, inv) = if opts.round_sf {
                    let p = pow2_ceil(exact);
                    (p, 1.0 / p)
                } else {
                    (exact, div_f32(448.0, amax))
                };
                assert_eq!(sf.get(r, 0).unwrap().to_bits(), s.to_bits());
                for (c, &v) in row.iter().enumerate() {
                    assert_eq!(q.bytes()[r * k + c], e4m3_from_f32(v * inv));
                }
            }
        }
    }
}

#[test]
fn partial_last_group_576() {
    // K = 576, npc = 128: five groups, the last 64 wide (§5 item 2). A spike at column 575
    // sets only group 4's scale; a spike at column 511 only group 3's.
    let mut rng = Rng::new(23);
    let mut x = rng.randn(&[3, 576], |v| v);
    x.as_mut_slice()[575] = 1000.0;
    x.as_mut_slice()[576 + 511] = -2000.0;
    for opts in all_configs() {
        let (_, sf) = per_token_cast(&x.view().into(), &params(E4M3, 128, opts)).unwrap();
        assert_eq!(sf.grid(), ScaleGrid::new(3, 5).unwrap());
        for r in 0..3 {
            for g in 0..5 {
                let cols = g * 128..((g + 1) * 128).min(576);
                let amax = x.as_slice()[r * 576 + cols.start..r * 576 + cols.end]
                    .iter()
                    .fold(0.0f32, |a, v| a.max(v.abs()));
                let exact = div_f32(amax, 448.0);
                let want = if opts.round_sf {
                    pow2_ceil(exact)
                } else {
                    exact
                };
                assert_eq!(
                    sf.get(r, g).unwrap().to_bits(),
                    want.to_bits(),
                    "{opts:?} {r} {g}"
                );
            }
        }
        assert!(sf.get(0, 4).unwrap() >= 1000.0 / 448.0);
        assert!(sf.get(1, 3).unwrap() >= 2000.0 / 448.0);
        assert!(sf.get(0, 3).unwrap() < 0.1);
    }
}

// ---------------------------------------------------------------------------------------------
// §5 edge cases
// ---------------------------------------------------------------------------------------------

#[test]
fn all_zero_groups_and_signed_zeros() {
    // Row 0 all zeros (both signs); row 1 has a zero group and a nonzero one.
    let mut v = vec![0.0f32; 128];
    for (i, x) in v.iter_mut().enumerate().take(64) {
        if i % 3 == 0 {
            *x = -0.0;
        }
    }
    v[64 + 32..]
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = i as f32 - 10.0);
    v[64 + 5] = -(2f64.powi(-131) as f32); // a subnormal that underflows to −0 after scaling
    let x = f32s(2, 64, &v);
    let eps_sf = div_f32(1e-4, 448.0);
    for fmt in [E4M3, E2M1] {
        for npc in [32, 64] {
            for opts in all_configs() {
                let (q, sf) = per_token_cast(&x.view().into(), &params(fmt, npc, opts)).unwrap();
                let want_zero = match (fmt, opts.round_sf) {
                    (E4M3, false) => eps_sf,
                    (E4M3, true) => 2f32.powi(-22),
                    (E2M1, _) => 2f32.powi(-126),
                };
                assert_eq!(sf.get(0, 0).unwrap().to_bits(), want_zero.to_bits());
                assert!(sf.get(0, 0).unwrap().is_normal());
                if npc == 32 {
                    assert_eq!(sf.get(1, 0).unwrap().to_bits(), want_zero.to_bits());
                }
                // Signed zeros survive: −0.0 → 0x80 / nibble 8, +0.0 → 0.
                let c = codes(&q);
                let neg = if fmt == E4M3 { 0x80 } else { 0x8 };
                for (i, &code) in c.iter().enumerate().take(64) {
                    assert_eq!(code, if i % 3 == 0 { neg } else { 0 }, "{fmt:?} {i}");
                }
                assert_eq!(c[64 + 5], neg);
                if opts.use_packed_ue8m0 {
                    let b = sf.ue8m0_byte(0, 0).unwrap();
                    assert_eq!(b, if fmt == E4M3 { 105 } else { 1 });
                }
            }
        }
    }
    // Exact value of the e4m3 ε scale: fl(1e-4/448) ≈ 2.232e-7.
    assert!((eps_sf - 2.232e-7).abs() < 1e-10);
}

#[test]
fn one_ulp_excess_saturates_never_nan() {
    // Find amax values with fl(amax · fl(Q/amax)) > Q (§5 item 5); the group's largest element
    // must encode to ±Q, never NaN.
    for (fmt, q_max) in [(E4M3, 448.0f32), (E2M1, 6.0)] {
        let mut found = 0;
        let mut b = 1.0f32.to_bits();
        while found < 3 {
            let a = f32::from_bits(b);
            b += 1;
            if a * (q_max / a) <= q_max {
                continue;
            }
            found += 1;
            let x = f32s(1, 32, &[[a, -a].as_slice(), &[0.5; 30]].concat());
            let (q, _) =
                per_token_cast(&x.view().into(), &params(fmt, 32, ScaleOptions::default()))
                    .unwrap();
            let c = codes(&q);
            let (pos, neg) = if fmt == E4M3 { (0x7E, 0xFE) } else { (7, 15) };
            assert_eq!((c[0], c[1]), (pos, neg), "{fmt:?} amax {a}");
            assert!(
                b - 1.0f32.to_bits() < 1 << 22,
                "no 1-ulp-excess example found"
            );
        }
    }
}

#[test]
fn denormals_are_not_flushed() {
    // e2m1: a group of fp32 subnormals. amax < ε = 6·2^-126, so inv = 2^126 exactly (rounded
    // or not) and the subnormals scale into the FP4 range: 2^-127 → 0.5 (1), 2^-128 → 0.25 →
    // tie → 0, 3·2^-128 → 0.75 → tie → 1.0 (2), −2^-127 → −0.5 (9).
    let t = |e: i32| 2f64.powi(e) as f32; // exact (f32::powi overflows 2^128 in debug)
    let mut v = vec![0.0f32; 32];
    v[..4].copy_from_slice(&[t(-127), t(-128), 3.0 * t(-128), -t(-127)]);
    assert!(v[..4].iter().all(|x| x.is_subnormal()));
    let x = f32s(1, 32, &v);
    for opts in all_configs() {
        let (q, sf) = per_token_cast(&x.view().into(), &params(E2M1, 32, opts)).unwrap();
        assert_eq!(&codes(&q)[..5], [1, 0, 2, 9, 0], "{opts:?}");
        assert_eq!(sf.get(0, 0), Some(t(-126)));
    }
    // e4m3 subnormal outputs by RNE: amax 448 → inv = 1; 2^-9 → 0x01, 2^-10 → tie → 0x00,
    // 3·2^-10 → tie → 2·2^-9 (0x02), −2^-9 → 0x81, 5·2^-10 → tie → 2·2^-9 (0x02).
    let mut v = vec![0.0f32; 16];
    v[..6].copy_from_slice(&[448.0, t(-9), t(-10), 3.0 * t(-10), -t(-9), 5.0 * t(-10)]);
    let x = f32s(1, 16, &v);
    for opts in all_configs() {
        let (q, _) = per_token_cast(&x.view().into(), &params(E4M3, 16, opts)).unwrap();
        assert_eq!(
            &q.bytes()[..6],
            [0x7E, 0x01, 0x00, 0x02, 0x81, 0x02],
            "{opts:?}"
        );
    }
    // e4m3 on fp32 subnormals: amax < 1e-4, so c = ε and the values underflow to signed zeros.
    let x = f32s(
        1,
        16,
        &[[t(-140), -t(-149)].as_slice(), &[0.0; 14]].concat(),
    );
    let (q, sf) =
        per_token_cast(&x.view().into(), &params(E4M3, 16, ScaleOptions::default())).unwrap();
    assert_eq!(&q.bytes()[..2], [0x00, 0x80]);
    assert_eq!(
        sf.get(0, 0).unwrap().to_bits(),
        div_f32(1e-4, 448.0).to_bits()
    );
    // And an e2m1 subnormal-only input through bf16 (bf16 has fp32's exponent range).
    let xb = to_bf16(&f32s(1, 32, &[[t(-127)].as_slice(), &[0.0; 31]].concat()));
    let (q, _) = per_token_cast(
        &xb.view().into(),
        &params(E2M1, 32, ScaleOptions::default()),
    )
    .unwrap();
    assert_eq!(codes(&q)[0], 1);
}

#[test]
fn nan_and_inf_follow_the_gpu() {
    // NaN is ignored by amax (fmaxf) and encodes to 0x7F / +6 whatever its sign.
    let x = f32s(
        1,
        16,
        &[[1.0, f32::NAN, -2.0, -f32::NAN].as_slice(), &[0.0; 12]].concat(),
    );
    let (q, sf) =
        per_token_cast(&x.view().into(), &params(E4M3, 16, ScaleOptions::default())).unwrap();
    assert_eq!(
        sf.get(0, 0).unwrap().to_bits(),
        div_f32(2.0, 448.0).to_bits()
    );
    assert_eq!(&q.bytes()[..4], [0x76, 0x7F, 0xFE, 0x7F]);
    let (q, _) =
        per_token_cast(&x.view().into(), &params(E2M1, 16, ScaleOptions::default())).unwrap();
    assert_eq!(&codes(&q)[..4], [5, 7, 15, 7]);
    // Infinite amax: non-rounded sf = +inf, inv = 0; rounded sf = +inf (byte 255).
    let x = f32s(
        1,
        16,
        &[[f32::INFINITY, 1.0, -1.0].as_slice(), &[0.0; 13]].concat(),
    );
    let (q, sf) =
        per_token_cast(&x.view().into(), &params(E4M3, 16, ScaleOptions::default())).unwrap();
    assert_eq!(sf.get(0, 0), Some(f32::INFINITY));
    assert_eq!(&q.bytes()[..3], [0x7F, 0x00, 0x80]);
    let (_, sf) = per_token_cast(
        &x.view().into(),
        &params(E4M3, 16, ScaleOptions::packed_ue8m0()),
    )
    .unwrap();
    assert_eq!(sf.ue8m0_byte(0, 0), Some(255));
}

#[test]
fn empty_input() {
    let x = HostTensor::<bf16>::from_vec(vec![], &[0, 576]).unwrap();
    for fmt in [E4M3, E2M1] {
        for npc in [32, 576] {
            for opts in all_configs() {
                let (q, sf) = per_token_cast(&x.view().into(), &params(fmt, npc, opts)).unwrap();
                assert_eq!(q.logical_shape(), (0, 576));
                assert_eq!(q.shape(), [0, 576 / fmt.values_per_byte()]);
                let nbk = 576usize.div_ceil(npc);
                let want = if opts.use_packed_ue8m0 {
                    nbk.div_ceil(4)
                } else {
                    nbk
                };
                assert_eq!(sf.shape(), [0, want]);
                assert!(sf.storage_bytes().is_empty());
            }
        }
    }
    let (q, sf) = per_token_cast_to_e5m6(
        &PlainInput::from(x.view()),
        &PerTokenE5M6Params::new(576, ScaleOptions::packed_ue8m0()),
    )
    .unwrap();
    assert_eq!((q.shape(), sf.shape()), (&[0, 864][..], [0, 1]));
}

#[test]
fn strided_rows_match_contiguous() {
    // §5 item 14: any row stride, results identical to a contiguous copy (plain input, also
    // bf16; E5M6 too).
    let mut rng = Rng::new(29);
    let x = rng.randn(&[7, 192], |v| v);
    let xb = to_bf16(&x);
    let buf = strided_buffer(&x, 1e30);
    let bufb = strided_buffer(&xb, bf16::from_f32(-1e30));
    for fmt in [E4M3, E2M1] {
        for npc in [16, 64, 192] {
            for opts in all_configs() {
                let p = params(fmt, npc, opts);
                let want = per_token_cast(&x.view().into(), &p).unwrap();
                let got = per_token_cast(&window(&buf, 192).into(), &p).unwrap();
                assert_eq!(got, want);
                let want = per_token_cast(&xb.view().into(), &p).unwrap();
                let got = per_token_cast(&window(&bufb, 192).into(), &p).unwrap();
                assert_eq!(got, want);
            }
        }
    }
    let p = PerTokenE5M6Params::new(192, ScaleOptions::default());
    let want = per_token_cast_to_e5m6(&x.view().into(), &p).unwrap();
    let got = per_token_cast_to_e5m6(&window(&buf, 192).into(), &p).unwrap();
    assert_eq!((got.0.as_slice(), &got.1), (want.0.as_slice(), &want.1));
}

// ---------------------------------------------------------------------------------------------
// Requantization (§3.1 quantized input, §5 item 11)
// ---------------------------------------------------------------------------------------------

#[test]
fn requantization_equals_cast_of_dequantized_values() {
    // Upstream's setup: x0 = randn bf16, quantized by the reference with x_block_size and the
    // output's layout flags, then requantized per token. Input blocks beyond upstream's
    // (1, 16) and (3, 5) work too: amax is the exact per-element max here.
    let mut rng = Rng::new(31);
    let (m, k) = (19, 256);
    let x0 = rng.randn(&[m, k], bf16::from_f32);
    let x0f = widen(&x0);
    for in_fmt in [E4M3, E2M1] {
        for x_block in [(32, 32), (128, 128), (1, 16), (3, 5)] {
            for fmt in [E4M3, E2M1] {
                for npc in [16, 128] {
                    for opts in rounded_configs() {
                        let case = format!("{in_fmt:?} {x_block:?} → {fmt:?} npc {npc} {opts:?}");
                        let (qin, sin) = cast(&x0.view().into(), in_fmt, x_block, opts).unwrap();
                        let qi = QuantInput::new(qin.view(), sin.view(), x_block);
                        let got =
                            per_token_cast(&qi.clone().into(), &params(fmt, npc, opts)).unwrap();
                        let want = cast(&qi.clone().into(), fmt, (1, npc), opts).unwrap();
                        assert_eq!(got, want, "{case}");
                        let deq = cast_back::<f32>(&qi).unwrap();
                        let from_deq = cast(&deq.view().into(), fmt, (1, npc), opts).unwrap();
                        assert_eq!(got, from_deq, "{case}");
                        // Round trip to the bf16 source, and no systematic bias.
                        let back = cast_back::<f32>(&QuantInput::new(
                            got.0.view(),
                            got.1.view(),
                            (1, npc),
                        ))
                        .unwrap();
                        let d = common::calc_diff_f32(x0f.as_slice(), back.as_slice());
                        let tol = if fmt == E2M1 || in_fmt == E2M1 {
                            4e-2
                        } else {
                            2e-3
                        };
                        assert!(d < tol, "{case}: calc_diff {d}");
                        check_bias(&case, back.as_slice(), x0f.as_slice());
                    }
                }
            }
        }
    }
}

#[test]
fn requantization_uses_the_reference_order() {
    // The op inherits the generic reference's order, enc(fl(fl(dec · s_in) · inv)), which
    // differs from upstream kernel's folded fl(dec · fl(s_in · inv)) for this input (see
    // tests/cast.rs): data [9, 448], per-element scales [s0, s1] (block (1, 1)).
    let s0 = f32::from_bits(0x3FAB_1533);
    let s1 = f32::from_bits(0x3F92_A475);
    let data = op_common::e4m3_data(1, 32, &[[0x51u8, 0x7E].as_slice(), &[0; 30]].concat());
    let mut svals = vec![1.0f32; 32];
    svals[..2].copy_from_slice(&[s0, s1]);
    let in_sf = tk_quant::HostScales::from_grid(
        ScaleLayout::RowMajorF32,
        ScaleGrid::new(1, 32).unwrap(),
        &svals,
    )
    .unwrap();
    let qi = QuantInput::new(
        tk_quant::QuantDataView::E4M3(data.view()),
        in_sf.view(),
        (1, 1),
    );
    let (q, _) = per_token_cast(&qi.into(), &params(E4M3, 16, ScaleOptions::default())).unwrap();
    let inv = div_f32(448.0, 448.0 * s1);
    assert_eq!((9.0 * s0) * inv, 10.5);
    assert_eq!(q.bytes()[0], 0x52); // 10.5 → tie → 10
    assert_eq!(e4m3_from_f32(9.0 * (s0 * inv)), 0x53); // what the folded order would give
}
