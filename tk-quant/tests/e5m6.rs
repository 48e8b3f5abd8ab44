//! CPU reference of the E5M6 cast and cast back (`spec/quant.md` §1.3, §3.2, §3.9): upstream's
//! special inputs bit-checked against a straightforward independent formula, random inputs
//! against an independent round-to-nearest-even formula, the sub-2^-14 quirk, scale layouts,
//! round trips and every rejection path.
#![cfg(feature = "cpu")]

mod common;

use common::{assert_param, calc_diff_f32, div_f32, err_arg, pow2_ceil};
use half::{bf16, f16};
use tk_core::dtype::{E5M6Bytes, Ue8m0x4};
use tk_core::testing::Rng;
use tk_core::{HostTensor, HostView, Layout, TkError};
use tk_quant::reference::{cast_back_from_e5m6, cast_to_e5m6};
use tk_quant::{HostScales, PlainInput, ScaleGrid, ScaleLayout, ScaleOptions, ScaleView};

fn all_configs() -> [ScaleOptions; 5] {
    [
        ScaleOptions::row_major(false),
        ScaleOptions::col_major(false),
        ScaleOptions::row_major(true),
        ScaleOptions::col_major(true),
        ScaleOptions::packed_ue8m0(),
    ]
}

/// Independent packer: the 8 codes as 24 hex digits (c0 first), split into three 8-digit words
/// stored little-endian.
fn pack_hex(codes: &[u16]) -> Vec<u8> {
    let mut out = Vec::new();
    for group in codes.chunks(8) {
        let hex: String = group.iter().map(|c| format!("{c:03x}")).collect();
        for w in 0..3 {
            let word = u32::from_str_radix(&hex[8 * w..8 * w + 8], 16).unwrap();
            out.extend(word.to_le_bytes());
        }
    }
    out
}

/// The code of a value that E5M6 represents exactly: its binary16 pattern shifted right by 4
/// (the low 4 bits must be zero).
fn exact_code(v: f32) -> u16 {
    let h = f16::from_f32(v);
    assert_eq!(h.to_f32(), v, "{v} is not a binary16 value");
    assert_eq!(h.to_bits() & 0xF, 0, "{v} needs more than 6 mantissa bits");
    h.to_bits() >> 4
}

/// Round to nearest, ties to even, onto the E5M6 grid for `2^-14 <= |v| <= 65024`, in f64.
fn rne_code(v: f32) -> u16 {
    let sign = if v.is_sign_negative() { 0x800 } else { 0 };
    let a = v.abs() as f64;
    let mut e = 0i32;
    while 2f64.powi(e) > a {
        e -= 1;
    }
    while 2f64.powi(e + 1) <= a {
        e += 1;
    }
    let q = a / 2f64.powi(e - 6); // in [64, 128)
    let mut n = q.floor();
    let frac = q - n;
    if frac > 0.5 || (frac == 0.5 && n % 2.0 == 1.0) {
        n += 1.0;
    }
    if n == 128.0 {
        e += 1;
        n = 64.0;
    }
    sign | (((e + 15) as u16) << 6) | (n as u16 - 64)
}

/// Independent decoder: binary16 `code << 4` widened.
fn decode(code: u16) -> f32 {
    f16::from_bits(code << 4).to_f32()
}

/// Unpacks the output bytes of one row with the independent hex layout.
fn unpack_hex(bytes: &[u8]) -> Vec<u16> {
    let mut codes = Vec::new();
    for g in bytes.chunks(12) {
        let hex: String = g
            .chunks(4)
            .map(|w| format!("{:08x}", u32::from_le_bytes([w[0], w[1], w[2], w[3]])))
            .collect();
        for i in 0..8 {
            codes.push(u16::from_str_radix(&hex[3 * i..3 * i + 3], 16).unwrap());
        }
    }
    codes
}

fn raw(t: &HostTensor<E5M6Bytes>) -> Vec<u8> {
    t.as_slice().iter().map(|b| b.0).collect()
}

#[test]
fn special_inputs_bit_exact() {
    // generate_e5m6_inputs: constants 2^-20, 2^-14·63/64, 2^-14, last column 65024. amax is
    // 65024, so sf = inv = 1 in every mode and the codes are the exact ones.
    let specials = [2f32.powi(-20), 2f32.powi(-14) * 63.0 / 64.0, 2f32.powi(-14)];
    assert_eq!(specials.map(exact_code), [0x001, 0x03F, 0x040]);
    assert_eq!(exact_code(65024.0), 0x7BF);
    let m = 3;
    for k in [8, 64, 576] {
        for &c in &specials {
            let vals: Vec<f32> = (0..m * k)
                .map(|i| if i % k == k - 1 { 65024.0 } else { c })
                .collect();
            let x = HostTensor::from_vec(vals.clone(), &[m, k]).unwrap();
            let xb =
                HostTensor::from_vec(vals.iter().map(|&v| bf16::from_f32(v)).collect(), &[m, k])
                    .unwrap();
            assert!(xb
                .as_slice()
                .iter()
                .zip(&vals)
                .all(|(b, v)| b.to_f32() == *v));
            let codes: Vec<u16> = vals.iter().map(|&v| exact_code(v)).collect();
            let want = pack_hex(&codes);
            for opts in all_configs() {
                for input in [PlainInput::from(x.view()), PlainInput::from(xb.view())] {
                    let (q, sf) = cast_to_e5m6(&input, opts).unwrap();
                    assert_eq!(q.shape(), [m, 3 * k / 2]);
                    assert_eq!(raw(&q), want, "{c} K={k} {opts:?}");
                    for r in 0..m {
                        assert_eq!(sf.get(r, 0), Some(1.0));
                    }
                    if opts.use_packed_ue8m0 {
                        // int32 (3, 1), strides (1, 4): byte 0 = 127, bytes 1–3 and row 3 zero.
                        assert_eq!(sf.shape(), [3, 1]);
                        assert_eq!(sf.strides(), [1, 4]);
                        let mut b = vec![0u8; 16];
                        b[0] = 127;
                        b[4] = 127;
                        b[8] = 127;
                        assert_eq!(sf.storage_bytes(), b);
                    }
                    // Cast back: exact, so calc_diff is 0 (< 5e-6 required).
                    for block in [(1, k), (1, 8)] {
                        let sfb = if block == (1, k) {
                            sf.clone()
                        } else {
                            HostScales::from_fn(
                                ScaleLayout::RowMajorF32,
                                ScaleGrid::for_matrix(m, k, block).unwrap(),
                                |_, _| 1.0,
                            )
                            .unwrap()
                        };
                        let back =
                            cast_back_from_e5m6::<f32>(&q.view(), &sfb.view(), block).unwrap();
                        assert_eq!(back.as_slice(), &vals[..]);
                        assert!(calc_diff_f32(&vals, back.as_slice()) < 5e-6);
                        let back =
                            cast_back_from_e5m6::<bf16>(&q.view(), &sfb.view(), block).unwrap();
                        assert!(back
                            .as_slice()
                            .iter()
                            .zip(&vals)
                            .all(|(b, v)| b.to_f32() == *v));
                    }
                }
            }
        }
    }
}

#[test]
fn random_inputs_match_independent_rne() {
    let mut rng = Rng::new(17);
    let (m, k) = (9, 576);
    let x = rng.randn(&[m, k], |v| v);
    let xb = rng.randn(&[m, k], bf16::from_f32);
    let xb32: Vec<f32> = xb.as_slice().iter().map(|v| v.to_f32()).collect();
    for opts in all_configs() {
        for (input, vals) in [
            (PlainInput::from(x.view()), x.as_slice()),
            (PlainInput::from(xb.view()), &xb32[..]),
        ] {
            let (q, sf) = cast_to_e5m6(&input, opts).unwrap();
            let bytes = raw(&q);
            for r in 0..m {
                let row = &vals[r * k..(r + 1) * k];
                let amax = row.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let c = amax.max(1e-4);
                let (want_sf, inv) = if opts.round_sf {
                    let p = pow2_ceil(div_f32(c, 65024.0));
                    (p, 1.0 / p)
                } else {
                    (div_f32(c, 65024.0), div_f32(65024.0, c))
                };
                assert_eq!(sf.get(r, 0).unwrap().to_bits(), want_sf.to_bits());
                let codes = unpack_hex(&bytes[r * 3 * k / 2..(r + 1) * 3 * k / 2]);
                for (j, (&v, &code)) in row.iter().zip(&codes).enumerate() {
                    let y = v * inv;
                    assert!(
                        y.abs() >= 2f32.powi(-14),
                        "random data stays in the normal range"
                    );
                    assert_eq!(code, rne_code(y), "{opts:?} ({r}, {j}): {y}");
                    // Within half a quantum (2^(e-7) for |y| in [2^e, 2^(e+1))).
                    let half = 2f32.powi(y.abs().log2().floor() as i32 - 7);
                    assert!((decode(code) - y).abs() <= half);
                }
            }
            // Round trip within the spec's tolerance.
            let back = cast_back_from_e5m6::<f32>(&q.view(), &sf.view(), (1, k)).unwrap();
            assert!(calc_diff_f32(vals, back.as_slice()) < 1e-4);
            let back16 = cast_back_from_e5m6::<bf16>(&q.view(), &sf.view(), (1, k)).unwrap();
            let codes = unpack_hex(&bytes);
            for (i, (a, b)) in back16.as_slice().iter().zip(back.as_slice()).enumerate() {
                assert_eq!(a.to_bits(), bf16::from_f32(*b).to_bits(), "{i}");
                let want = decode(codes[i]) * sf.get(i / k, 0).unwrap();
                assert_eq!(b.to_bits(), want.to_bits());
            }
        }
    }
}

#[test]
fn all_zero_rows_and_tiny_values() {
    // Row 0 all zeros with signs; row 1: 65024 (inv = 1), ±tiny values below 2^-24 whose low 17
    // fp32 bits exceed 0x10000: they become ±2^-20 (code 1), not 0 — the kernel's quirk (§1.3).
    let tiny = f32::from_bits(0x3301_8000);
    assert!(tiny < 2f32.powi(-24));
    let vals = [
        0.0, -0.0, 0.0, -0.0, 0.0, 0.0, 0.0, -0.0, 65024.0, tiny, -tiny, 0.0, -0.0, 1.0, 0.0, 0.0,
    ];
    let x = HostTensor::from_vec(vals.to_vec(), &[2, 8]).unwrap();
    for opts in all_configs() {
        let (q, sf) = cast_to_e5m6(&x.view().into(), opts).unwrap();
        let want_sf = if opts.round_sf {
            2f32.powi(-29)
        } else {
            div_f32(1e-4, 65024.0)
        };
        assert_eq!(
            sf.get(0, 0).unwrap().to_bits(),
            want_sf.to_bits(),
            "{opts:?}"
        );
        assert_eq!(sf.get(1, 0), Some(1.0));
        let codes = [
            0, 0x800, 0, 0x800, 0, 0, 0, 0x800, 0x7BF, 0x001, 0x801, 0, 0x800, 0x3C0, 0, 0,
        ];
        assert_eq!(raw(&q), pack_hex(&codes), "{opts:?}");
    }
    let (_, sf) = cast_to_e5m6(&x.view().into(), ScaleOptions::packed_ue8m0()).unwrap();
    assert_eq!(sf.ue8m0_byte(0, 0), Some(98));
    assert_eq!(sf.ue8m0_byte(1, 0), Some(127));
}

#[test]
fn packed_scale_bytes_per_row() {
    // Row r is 65024 · 2^r: rounded sf = 2^r, byte 127 + r; codes all 0x7BF.
    let (m, k) = (5, 16);
    let x = HostTensor::from_fn(&[m, k], |i| 65024.0 * 2f32.powi((i / k) as i32));
    let (q, sf) = cast_to_e5m6(&x.view().into(), ScaleOptions::packed_ue8m0()).unwrap();
    assert_eq!((sf.shape(), sf.strides()), ([5, 1], [1, 8]));
    let mut want = vec![0u8; 32];
    for r in 0..5 {
        want[4 * r] = 127 + r as u8;
    }
    assert_eq!(sf.storage_bytes(), want);
    assert_eq!(raw(&q), pack_hex(&[0x7BF; 80]));
    let (_, sf) = cast_to_e5m6(&x.view().into(), ScaleOptions::col_major(true)).unwrap();
    assert_eq!((sf.shape(), sf.strides()), ([5, 1], [1, 8]));
    assert_eq!(
        sf.f32_storage().unwrap(),
        &[1.0, 2.0, 4.0, 8.0, 16.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn cast_back_with_general_blocks() {
    let mut rng = Rng::new(23);
    let (m, k) = (6, 32);
    let x = rng.randn(&[m, k], |v| v);
    let (q, _) = cast_to_e5m6(&x.view().into(), ScaleOptions::default()).unwrap();
    let bytes = raw(&q);
    // Block (2, 16) in layout B, and a partial last block (4, 24) in layout A.
    for (block, layout) in [
        ((2, 16), ScaleLayout::ColMajorF32),
        ((4, 24), ScaleLayout::RowMajorF32),
    ] {
        let grid = ScaleGrid::for_matrix(m, k, block).unwrap();
        let sf = HostScales::from_fn(layout, grid, |_, _| rng.uniform() + 0.5).unwrap();
        let got = cast_back_from_e5m6::<f32>(&q.view(), &sf.view(), block).unwrap();
        for r in 0..m {
            let codes = unpack_hex(&bytes[r * 48..(r + 1) * 48]);
            for (c, &code) in codes.iter().enumerate() {
                let want = decode(code) * sf.get(r / block.0, c / block.1).unwrap();
                assert_eq!(got.as_slice()[r * k + c].to_bits(), want.to_bits());
            }
        }
    }
}

#[test]
fn strided_rows_and_empty_input() {
    let mut rng = Rng::new(29);
    let buf = rng.randn(&[5, 80], |v| v);
    let window = buf.view().narrow(1, 0, 40).unwrap();
    let contiguous = window.to_tensor();
    for opts in all_configs() {
        let (q1, s1) = cast_to_e5m6(&window.clone().into(), opts).unwrap();
        let (q2, s2) = cast_to_e5m6(&contiguous.view().into(), opts).unwrap();
        assert_eq!(q1, q2);
        assert_eq!(s1.storage_bytes(), s2.storage_bytes());
        // Cast back reads a strided byte view too.
        let qbuf = HostTensor::from_fn(&[5, 120], |i| {
            if i % 120 < 60 {
                q1.as_slice()[i / 120 * 60 + i % 120]
            } else {
                E5M6Bytes(0xFF)
            }
        });
        let qwin = qbuf.view().narrow(1, 0, 60).unwrap();
        let a = cast_back_from_e5m6::<f32>(&qwin, &s1.view(), (1, 40)).unwrap();
        let b = cast_back_from_e5m6::<f32>(&q1.view(), &s1.view(), (1, 40)).unwrap();
        assert_eq!(a, b);
        // M = 0.
        let x = HostTensor::<f32>::from_vec(vec![], &[0, 16]).unwrap();
        let (q, sf) = cast_to_e5m6(&x.view().into(), opts).unwrap();
        assert_eq!(q.shape(), [0, 24]);
        assert_eq!(sf.shape(), [0, 1]);
        if opts.use_tma_aligned_col_major_sf {
            assert_eq!(sf.strides(), [1, 1]);
        }
        let back = cast_back_from_e5m6::<bf16>(&q.view(), &sf.view(), (1, 16)).unwrap();
        assert_eq!(back.shape(), [0, 16]);
    }
}

#[test]
fn rejections_name_the_argument() {
    let x12 = HostTensor::<f32>::from_vec(vec![1.0; 24], &[2, 12]).unwrap();
    let e = cast_to_e5m6(&x12.view().into(), ScaleOptions::default()).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "x", .. }), "{e:?}");
    let x0 = HostTensor::<bf16>::from_vec(vec![], &[2, 0]).unwrap();
    let e = cast_to_e5m6(&x0.view().into(), ScaleOptions::default()).unwrap_err();
    assert!(matches!(e, TkError::Empty { arg: "x", .. }), "{e:?}");
    let x = HostTensor::<f32>::from_vec(vec![1.0; 32], &[2, 16]).unwrap();
    let packed_unrounded = ScaleOptions {
        round_sf: false,
        use_tma_aligned_col_major_sf: true,
        use_packed_ue8m0: true,
    };
    assert_param(
        cast_to_e5m6(&x.view().into(), packed_unrounded).unwrap_err(),
        "use_packed_ue8m0",
        &["round_sf = true"],
    );
    let packed_rowmajor = ScaleOptions {
        round_sf: true,
        use_tma_aligned_col_major_sf: false,
        use_packed_ue8m0: true,
    };
    assert_param(
        cast_to_e5m6(&x.view().into(), packed_rowmajor).unwrap_err(),
        "use_packed_ue8m0",
        &["column-major"],
    );
    let rank3 = x
        .view()
        .with_layout(Layout::contiguous(&[2, 2, 8]))
        .unwrap();
    assert!(matches!(
        cast_to_e5m6(&rank3.into(), ScaleOptions::default()).unwrap_err(),
        TkError::Shape { arg: "x", .. }
    ));
    let cols2 = x
        .view()
        .with_layout(Layout::new(vec![2, 8], vec![16, 2], 0).unwrap())
        .unwrap();
    assert!(matches!(
        cast_to_e5m6(&cols2.into(), ScaleOptions::default()).unwrap_err(),
        TkError::Stride { arg: "x", .. }
    ));

    let (q, sf) = cast_to_e5m6(&x.view().into(), ScaleOptions::packed_ue8m0()).unwrap();
    assert!(cast_back_from_e5m6::<f32>(&q.view(), &sf.view(), (1, 16)).is_ok());
    let bytes9 = HostTensor::from_vec(vec![E5M6Bytes(0); 18], &[2, 9]).unwrap();
    let e = cast_back_from_e5m6::<f32>(&bytes9.view(), &sf.view(), (1, 16)).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "x", .. }), "{e:?}");
    let bytes0 = HostTensor::from_vec(vec![], &[2, 0]).unwrap();
    let e = cast_back_from_e5m6::<f32>(&bytes0.view(), &sf.view(), (1, 16)).unwrap_err();
    assert!(matches!(e, TkError::Empty { arg: "x", .. }), "{e:?}");
    assert_param(
        cast_back_from_e5m6::<f32>(&q.view(), &sf.view(), (1, 0)).unwrap_err(),
        "x_block_size",
        &["at least 1"],
    );
    let e = cast_back_from_e5m6::<f32>(&q.view(), &sf.view(), (2, 16)).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "x.sf", .. }), "{e:?}");
    let words = vec![Ue8m0x4(0x7F); 4];
    let row_major = ScaleView::Packed(HostView::new(&words, Layout::contiguous(&[2, 2])).unwrap());
    let e = cast_back_from_e5m6::<f32>(&q.view(), &row_major, (1, 4)).unwrap_err();
    assert_eq!(err_arg(&e), "x.sf");
    let cols = q
        .view()
        .with_layout(Layout::new(vec![2, 12], vec![24, 2], 0).unwrap())
        .unwrap();
    let e = cast_back_from_e5m6::<f32>(&cols, &sf.view(), (1, 16)).unwrap_err();
    assert!(matches!(e, TkError::Stride { arg: "x", .. }), "{e:?}");
}
