//! CPU-only tests of `tk_core::convert` against `spec/quant.md` §1 (number formats), §3.14 and
//! §5 item 1. Every encoder is checked against an independent "nearest grid value" model on a
//! large sample of fp32 bit patterns, and every decoder exhaustively.

use test_case::test_case;
use tk_core::convert::*;

// ---------------------------------------------------------------------------------------------
// Helpers: independent models and input samples
// ---------------------------------------------------------------------------------------------

/// Every fp32 bit pattern with a stride of 4093 over all 2^32 (about 1.05 million patterns), plus
/// the last one.
fn strided_sample() -> impl Iterator<Item = u32> {
    (0..=u32::MAX / 4093)
        .map(|i| i * 4093)
        .chain(std::iter::once(u32::MAX))
}

/// All fp32 patterns within `radius` ulps of each of `points` (non-negative finite values), with
/// both signs.
fn neighbourhoods(points: &[f64], radius: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for &p in points {
        let center = (p as f32).to_bits();
        assert_eq!(
            f64::from(f32::from_bits(center)),
            p,
            "point {p} not an fp32"
        );
        for b in center.saturating_sub(radius)..=center.saturating_add(radius).min(0x7F80_0000) {
            out.push(b);
            out.push(b | 0x8000_0000);
        }
    }
    out
}

/// The sorted non-negative finite grid of a format: `(magnitude code, value)`.
fn grid(codes: impl Iterator<Item = u32>, decode: impl Fn(u32) -> f32) -> Vec<(u32, f64)> {
    let g: Vec<(u32, f64)> = codes.map(|c| (c, f64::from(decode(c)))).collect();
    assert!(g.windows(2).all(|w| w[0].1 < w[1].1), "grid not increasing");
    g
}

/// Grid points and the midpoints between neighbours (for neighbourhood sampling).
fn points_and_midpoints(g: &[(u32, f64)]) -> Vec<f64> {
    let mut pts: Vec<f64> = g.iter().map(|&(_, v)| v).collect();
    pts.extend(g.windows(2).map(|w| (w[0].1 + w[1].1) / 2.0));
    pts
}

/// Independent model: the code of the grid value nearest to the finite `a >= 0`, ties to the
/// even code, and saturation to the last grid point. All comparisons are exact in f64
/// (`2a` and `lo + hi` are exact: the grid values have few significant bits).
fn nearest_code(g: &[(u32, f64)], a: f64) -> u32 {
    let idx = g.partition_point(|&(_, v)| v <= a);
    if idx == g.len() {
        return g[g.len() - 1].0;
    }
    let (lo, hi) = (g[idx - 1], g[idx]);
    let twice = 2.0 * a;
    let mid = lo.1 + hi.1;
    if twice < mid {
        lo.0
    } else if twice > mid {
        hi.0
    } else if lo.0 % 2 == 0 {
        lo.0
    } else {
        hi.0
    }
}

fn e4m3_grid() -> Vec<(u32, f64)> {
    grid(0..=0x7E, |c| e4m3_to_f32(c as u8))
}

fn e5m2_grid() -> Vec<(u32, f64)> {
    grid(0..=0x7B, |c| e5m2_to_f32(c as u8))
}

fn e2m1_grid() -> Vec<(u32, f64)> {
    grid(0..=7, |c| e2m1_to_f32(c as u8))
}

/// E5M6 grid extended by the inf code `0x7C0` valued 2^16, the value RNE would carry into.
fn e5m6_grid_with_carry() -> Vec<(u32, f64)> {
    grid(0..=0x7C0, |c| {
        if c == 0x7C0 {
            65536.0
        } else {
            e5m6_to_f32(c as u16)
        }
    })
}

/// Checks an FP8/FP4 encoder on one input against the nearest-grid model: NaN → `nan_code`,
/// ±inf → saturated, sign copied into `sign_bit` for everything else.
fn check_minifloat(
    bits: u32,
    g: &[(u32, f64)],
    sign_bit: u32,
    nan_code: u32,
    enc: impl Fn(f32) -> u8,
) {
    let x = f32::from_bits(bits);
    let got = u32::from(enc(x));
    let want = if x.is_nan() {
        nan_code
    } else {
        let mag = if x.is_infinite() {
            g[g.len() - 1].0
        } else {
            nearest_code(g, f64::from(x.abs()))
        };
        mag | if bits >> 31 == 1 { sign_bit } else { 0 }
    };
    assert_eq!(got, want, "input {x:e} (bits {bits:#010x})");
}

/// The reference's binary16 round-toward-zero emulation, transcribed from the spec's table
/// (`_float32_to_fp16_rtz_bits`): it differs from CUDA for finite |v| >= 65536 and NaN sign.
fn f16_rz_reference_table(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let e = (bits >> 23) & 0xFF;
    let m = bits & 0x7F_FFFF;
    if e == 255 {
        sign | if m != 0 { 0x7FFF } else { 0x7C00 }
    } else if e >= 143 {
        sign | 0x7C00
    } else if e >= 113 {
        sign | (((e - 112) << 10) | (m >> 13)) as u16
    } else if e >= 103 {
        sign | ((0x80_0000 | m) >> (126 - e)) as u16
    } else {
        sign
    }
}

/// Independent model of CUDA's `__float2half_rz`: the largest-magnitude binary16 not above |v|
/// (finite |v| >= 65536 → 65504, NaN → 0x7FFF), found from `half`'s RNE conversion.
fn f16_rz_model(v: f32) -> u16 {
    if v.is_nan() {
        return 0x7FFF;
    }
    let sign = if v.is_sign_negative() { 0x8000 } else { 0 };
    if v.is_infinite() {
        return sign | 0x7C00;
    }
    let a = v.abs();
    let mut h = half::f16::from_f32(a).to_bits();
    if h == 0x7C00 || half::f16::from_bits(h).to_f32() > a {
        h -= 1;
    }
    sign | h
}

/// A small deterministic generator (xorshift64*) for random packing tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn pow2(e: i32) -> f32 {
    2f32.powi(e)
}

// ---------------------------------------------------------------------------------------------
// FP8 e4m3 (§1.1)
// ---------------------------------------------------------------------------------------------

#[test]
fn e4m3_decode_all_codes_matches_formula() {
    for b in 0..=255u8 {
        let got = e4m3_to_f32(b);
        let (s, e, m) = (b >> 7, i32::from((b >> 3) & 15), f64::from(b & 7));
        if e == 15 && m == 7.0 {
            assert!(got.is_nan(), "{b:#04x}");
            continue;
        }
        let mag = if e == 0 {
            2f64.powi(-6) * m / 8.0
        } else {
            2f64.powi(e - 7) * (1.0 + m / 8.0)
        };
        let signed = if s == 1 { -mag } else { mag };
        let want = signed as f32;
        assert_eq!(got.to_bits(), want.to_bits(), "{b:#04x}");
        let f8 = float8::F8E4M3::from_bits(b).to_f32();
        assert_eq!(got.to_bits(), f8.to_bits(), "{b:#04x} vs float8 crate");
    }
    assert_eq!(e4m3_to_f32(0x7E), 448.0);
    assert_eq!(e4m3_to_f32(0x08), pow2(-6));
    assert_eq!(e4m3_to_f32(0x01), pow2(-9));
    assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
}

#[test]
fn e4m3_roundtrip_all_codes() {
    for b in 0..=255u8 {
        let want = if b & 0x7F == 0x7F { 0x7F } else { b };
        assert_eq!(e4m3_from_f32(e4m3_to_f32(b)), want, "{b:#04x}");
    }
}

#[test_case(0.0, 0x00; "zero")]
#[test_case(-0.0, 0x80; "negative zero")]
#[test_case(-1e-9, 0x80; "tiny negative")]
#[test_case(f32::from_bits(1), 0x00; "fp32 subnormal")]
#[test_case(f32::from_bits(0x8000_0001), 0x80; "negative fp32 subnormal")]
#[test_case(1.0, 0x38; "one")]
#[test_case(7.0, 0x4E; "seven")]
#[test_case(1.0625, 0x38; "tie 1 and 1.125 to even 0x38")]
#[test_case(1.1875, 0x3A; "tie 1.125 and 1.25 to even 0x3A")]
#[test_case(1.0625 + 1.0 / 1048576.0, 0x39; "just above tie rounds up")]
#[test_case(-1.1875, 0xBA; "negative tie")]
#[test_case(400.0, 0x7C; "tie 384 and 416 to even")]
#[test_case(432.0, 0x7E; "tie 416 and 448 to even")]
#[test_case(448.0, 0x7E; "max")]
#[test_case(f32::from_bits(448f32.to_bits() + 1), 0x7E; "one ulp above max")]
#[test_case(460.0, 0x7E; "between 448 and 464")]
#[test_case(464.0, 0x7E; "464 saturates, not NaN")]
#[test_case(465.0, 0x7E; "above 464")]
#[test_case(480.0, 0x7E; "480")]
#[test_case(1e6, 0x7E; "large")]
#[test_case(f32::MAX, 0x7E; "f32 max")]
#[test_case(-464.0, 0xFE; "negative saturation")]
#[test_case(f32::INFINITY, 0x7E; "inf")]
#[test_case(f32::NEG_INFINITY, 0xFE; "negative inf")]
#[test_case(1.0 / 1024.0, 0x00; "tie 0 and min subnormal to 0")]
#[test_case(1.0 / 1024.0 + 1.0 / 1073741824.0, 0x01; "just above half min subnormal")]
#[test_case(-1.0 / 1024.0, 0x80; "negative half min subnormal")]
#[test_case(3.0 / 1024.0, 0x02; "tie subnormals 1 and 2 to even")]
#[test_case(5.0 / 1024.0, 0x02; "tie subnormals 2 and 3 to even")]
#[test_case(15.0 / 1024.0, 0x08; "tie largest subnormal and min normal")]
#[test_case(f32::NAN, 0x7F; "nan")]
#[test_case(f32::from_bits(0xFFC0_0000), 0x7F; "negative nan")]
#[test_case(f32::from_bits(0xFF80_0001), 0x7F; "negative signalling nan")]
fn e4m3_cases(x: f32, want: u8) {
    assert_eq!(e4m3_from_f32(x), want, "{x:e}");
}

#[test]
fn e4m3_matches_nearest_grid_model() {
    let g = e4m3_grid();
    let near = neighbourhoods(&points_and_midpoints(&g), 64);
    for bits in strided_sample().chain(near) {
        check_minifloat(bits, &g, 0x80, 0x7F, e4m3_from_f32);
    }
}

// ---------------------------------------------------------------------------------------------
// FP8 e5m2
// ---------------------------------------------------------------------------------------------

#[test]
fn e5m2_decode_all_codes_matches_formula() {
    for b in 0..=255u8 {
        let got = e5m2_to_f32(b);
        let (s, e, m) = (b >> 7, i32::from((b >> 2) & 31), f64::from(b & 3));
        let mag = match (e, m) {
            (31, 0.0) => f64::INFINITY,
            (31, _) => {
                assert!(got.is_nan(), "{b:#04x}");
                continue;
            }
            (0, _) => 2f64.powi(-14) * m / 4.0,
            _ => 2f64.powi(e - 15) * (1.0 + m / 4.0),
        };
        let signed = if s == 1 { -mag } else { mag };
        let want = signed as f32;
        assert_eq!(got.to_bits(), want.to_bits(), "{b:#04x}");
        let f8 = float8::F8E5M2::from_bits(b).to_f32();
        assert_eq!(got.to_bits(), f8.to_bits(), "{b:#04x} vs float8 crate");
    }
    assert_eq!(e5m2_to_f32(0x7B), 57344.0);
    assert_eq!(e5m2_to_f32(0x01), pow2(-16));
}

#[test]
fn e5m2_roundtrip_all_codes() {
    for b in 0..=255u8 {
        let want = match b & 0x7F {
            0x7C => (b & 0x80) | 0x7B, // inf saturates
            0x7D..=0x7F => 0x7F,       // NaN
            _ => b,
        };
        assert_eq!(e5m2_from_f32(e5m2_to_f32(b)), want, "{b:#04x}");
    }
}

#[test_case(-0.0, 0x80; "negative zero")]
#[test_case(1.125, 0x3C; "tie 1 and 1.25 to even")]
#[test_case(1.375, 0x3E; "tie 1.25 and 1.5 to even")]
#[test_case(57344.0, 0x7B; "max")]
#[test_case(59392.0, 0x7B; "tie above max saturates")]
#[test_case(61440.0, 0x7B; "would-be inf saturates")]
#[test_case(f32::INFINITY, 0x7B; "inf")]
#[test_case(f32::NEG_INFINITY, 0xFB; "negative inf")]
#[test_case(1.0 / 131072.0, 0x00; "tie 0 and min subnormal")]
#[test_case(f32::from_bits(0xFFC0_0000), 0x7F; "negative nan")]
fn e5m2_cases(x: f32, want: u8) {
    assert_eq!(e5m2_from_f32(x), want, "{x:e}");
}

#[test]
fn e5m2_matches_nearest_grid_model() {
    let g = e5m2_grid();
    let near = neighbourhoods(&points_and_midpoints(&g), 64);
    for bits in strided_sample().chain(near) {
        check_minifloat(bits, &g, 0x80, 0x7F, e5m2_from_f32);
    }
}

// ---------------------------------------------------------------------------------------------
// FP4 e2m1 (§1.2, §3.14)
// ---------------------------------------------------------------------------------------------

#[test]
fn e2m1_decode_all_codes() {
    let table = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    for n in 0..16u8 {
        let want = if n & 8 != 0 {
            -table[usize::from(n & 7)]
        } else {
            table[usize::from(n)]
        };
        assert_eq!(e2m1_to_f32(n).to_bits(), want.to_bits(), "code {n}");
    }
    assert_eq!(e2m1_to_f32(8).to_bits(), 0x8000_0000, "code 8 is -0.0");
}

#[test]
fn e2m1_roundtrip_all_codes() {
    for n in 0..16u8 {
        assert_eq!(e2m1_from_f32(e2m1_to_f32(n)), n, "code {n}");
    }
}

#[test_case(0.25, 0; "0.25 to 0")]
#[test_case(0.75, 2; "0.75 to 1")]
#[test_case(1.25, 2; "1.25 to 1")]
#[test_case(1.75, 4; "1.75 to 2")]
#[test_case(2.5, 4; "2.5 to 2")]
#[test_case(3.5, 6; "3.5 to 4")]
#[test_case(5.0, 6; "5 to 4")]
#[test_case(-0.25, 8; "-0.25 to -0")]
#[test_case(-0.75, 10; "-0.75 to -1")]
#[test_case(-5.0, 14; "-5 to -4")]
#[test_case(0.2500001, 1; "just above 0.25")]
#[test_case(5.0000005, 7; "just above 5")]
#[test_case(7.0, 7; "seven saturates")]
#[test_case(1e30, 7; "large saturates")]
#[test_case(f32::INFINITY, 7; "inf")]
#[test_case(f32::NEG_INFINITY, 15; "negative inf")]
#[test_case(0.0, 0; "zero")]
#[test_case(-0.0, 8; "negative zero")]
#[test_case(-1e-9, 8; "tiny negative")]
#[test_case(f32::from_bits(0x8000_0001), 8; "negative fp32 subnormal")]
#[test_case(f32::NAN, 7; "nan")]
#[test_case(f32::from_bits(0xFFC0_0000), 7; "negative nan")]
#[test_case(f32::from_bits(0xFFFF_FFFF), 7; "negative nan all ones")]
fn e2m1_cases(x: f32, want: u8) {
    assert_eq!(e2m1_from_f32(x), want, "{x:e}");
}

#[test]
fn e2m1_matches_nearest_grid_model() {
    let g = e2m1_grid();
    let mut pts = points_and_midpoints(&g);
    pts.extend([7.0, 8.0, 0.125, 2f64.powi(-30)]);
    let near = neighbourhoods(&pts, 4096);
    for bits in strided_sample().chain(near) {
        check_minifloat(bits, &g, 8, 7, e2m1_from_f32);
    }
}

#[test]
fn e2m1_packing() {
    assert_eq!(pack_e2m1(0x3, 0xA), 0xA3);
    assert_eq!(unpack_e2m1(0xA3), (0x3, 0xA));
    assert_eq!(pack_e2m1(e2m1_from_f32(-6.0), e2m1_from_f32(0.5)), 0x1F);
    for b in 0..=255u8 {
        let (lo, hi) = unpack_e2m1(b);
        assert!(lo < 16 && hi < 16);
        assert_eq!(pack_e2m1(lo, hi), b);
    }
}

// ---------------------------------------------------------------------------------------------
// bf16 / f16
// ---------------------------------------------------------------------------------------------

#[test]
fn bf16_roundtrip_all_patterns() {
    for bits in 0..=u16::MAX {
        let x = half::bf16::from_bits(bits).to_f32();
        let back = bf16_from_f32(x);
        if x.is_nan() {
            // `half` quiets signalling NaNs when widening, so only the class is kept.
            assert!(back.is_nan(), "{bits:#06x}");
        } else {
            assert_eq!(x.to_bits(), u32::from(bits) << 16, "{bits:#06x}");
            assert_eq!(back.to_bits(), bits, "{bits:#06x}");
        }
    }
}

#[test]
fn f16_roundtrip_all_patterns() {
    for bits in 0..=u16::MAX {
        let x = half::f16::from_bits(bits).to_f32();
        let back = f16_from_f32(x);
        if x.is_nan() {
            assert!(back.is_nan(), "{bits:#06x}");
        } else {
            assert_eq!(back.to_bits(), bits, "{bits:#06x}");
        }
    }
}

#[test_case(0x3F80_8000, 0x3F80; "bf16 tie down to even")]
#[test_case(0x3F81_8000, 0x3F82; "bf16 tie up to even")]
#[test_case(0x3F80_8001, 0x3F81; "bf16 above tie")]
#[test_case(0x7F7F_FFFF, 0x7F80; "bf16 overflow to inf")]
#[test_case(0x8000_0000, 0x8000; "bf16 negative zero")]
fn bf16_rne_cases(x: u32, want: u16) {
    assert_eq!(bf16_from_f32(f32::from_bits(x)).to_bits(), want);
}

#[test_case(1.0 + 1.0 / 2048.0, 0x3C00; "f16 tie down to even")]
#[test_case(1.0 + 3.0 / 2048.0, 0x3C02; "f16 tie up to even")]
#[test_case(65520.0, 0x7C00; "f16 overflow tie to inf")]
#[test_case(1.0 / 33554432.0, 0x0000; "f16 half min subnormal to zero")]
#[test_case(3.0 / 33554432.0, 0x0002; "f16 subnormal tie to even")]
fn f16_rne_cases(x: f32, want: u16) {
    assert_eq!(f16_from_f32(x).to_bits(), want);
}

#[test]
fn bf16_f16_nan_stays_nan() {
    for bits in [0x7FC0_0000u32, 0xFFC0_0000, 0x7F80_0001, 0xFFFF_FFFF] {
        assert!(bf16_from_f32(f32::from_bits(bits)).is_nan());
        assert!(f16_from_f32(f32::from_bits(bits)).is_nan());
    }
}

// ---------------------------------------------------------------------------------------------
// E5M6 (§1.3)
// ---------------------------------------------------------------------------------------------

#[test]
fn e5m6_decode_all_codes_matches_formula() {
    for c in 0..4096u16 {
        let got = e5m6_to_f32(c);
        let (s, e, m) = (c >> 11, i32::from((c >> 6) & 31), f64::from(c & 63));
        let mag = match (e, m) {
            (31, 0.0) => f64::INFINITY,
            (31, _) => {
                assert!(got.is_nan(), "{c:#05x}");
                continue;
            }
            (0, _) => 2f64.powi(-14) * m / 64.0,
            _ => 2f64.powi(e - 15) * (1.0 + m / 64.0),
        };
        let signed = if s == 1 { -mag } else { mag };
        let want = signed as f32;
        assert_eq!(got.to_bits(), want.to_bits(), "{c:#05x}");
    }
    assert_eq!(e5m6_to_f32(0x7BF), 65024.0);
    assert_eq!(e5m6_to_f32(0x040), pow2(-14));
    assert_eq!(e5m6_to_f32(0x03F), pow2(-14) * 63.0 / 64.0);
    assert_eq!(e5m6_to_f32(0x001), pow2(-20));
    assert_eq!(e5m6_to_f32(0x800).to_bits(), 0x8000_0000);
    assert_eq!(e5m6_to_f32(0x7C0), f32::INFINITY);
    assert_eq!(e5m6_to_f32(0xFC0), f32::NEG_INFINITY);
}

#[test]
fn e5m6_roundtrip_all_non_nan_codes() {
    let mut checked = 0;
    for c in 0..4096u16 {
        let v = e5m6_to_f32(c);
        if v.is_nan() {
            continue;
        }
        assert_eq!(e5m6_from_f32(v), c, "{c:#05x} ({v:e})");
        checked += 1;
    }
    assert_eq!(checked, 4096 - 2 * 63);
}

#[test]
fn e5m6_is_rne_in_binary16_normal_range() {
    let g = e5m6_grid_with_carry();
    let near = neighbourhoods(&points_and_midpoints(&g[0x40..]), 8);
    let mut checked = 0u32;
    for bits in strided_sample().chain(near) {
        let v = f32::from_bits(bits);
        let a = f64::from(v.abs());
        if !(2f64.powi(-14)..65536.0).contains(&a) {
            continue;
        }
        let sign = if bits >> 31 == 1 { 0x800 } else { 0 };
        let want = nearest_code(&g, a) as u16 | sign;
        assert_eq!(e5m6_from_f32(v), want, "{v:e} ({bits:#010x})");
        checked += 1;
    }
    assert!(checked > 100_000);
}

#[test_case(f32::from_bits(0x3001_FFFF), 0x001; "below 2^-24 with r above 0x10000 becomes code 1")]
#[test_case(f32::from_bits(0xB001_FFFF), 0x801; "negative tiny becomes -code 1")]
#[test_case(f32::from_bits(0x3001_0000), 0x000; "below 2^-24 with r equal 0x10000 stays 0")]
#[test_case(f32::from_bits(0x0001_0001), 0x001; "fp32 subnormal with r above 0x10000")]
#[test_case(f32::from_bits(0x8000_0000), 0x800; "negative zero")]
#[test_case(1.5 / 1048576.0, 0x001; "1.5 x 2^-20 truncates to code 1 (RNE would give 2)")]
#[test_case(1.75 / 1048576.0, 0x001; "1.75 x 2^-20 truncates to code 1")]
#[test_case(f32::from_bits(0x3581_FFFF), 0x002; "just above 2^-20 with large r rounds up to code 2")]
#[test_case(65024.0, 0x7BF; "max")]
#[test_case(65280.0, 0x7C0; "tie above max rounds to inf code")]
#[test_case(65536.0, 0x7BF; "65536 gives 65024 in the kernel")]
#[test_case(70000.0, 0x7BF; "70000 r small")]
#[test_case(66048.0, 0x7C0; "66048 r equal 0x10000 bumps to inf code")]
#[test_case(-70000.0, 0xFBF; "negative large")]
#[test_case(f32::MAX, 0x7C0; "f32 max")]
#[test_case(f32::INFINITY, 0x7C0; "inf")]
#[test_case(f32::NEG_INFINITY, 0xFC0; "negative inf")]
#[test_case(f32::from_bits(0x7FC0_0000), 0x7FF; "canonical quiet nan")]
#[test_case(f32::from_bits(0xFFC0_0000), 0x7FF; "negative nan sign dropped")]
#[test_case(f32::from_bits(0x7FFF_FFFF), 0x800; "nan with large low bits bumps to 0x800")]
#[test_case(1.0 + 1.0 / 128.0, 0x3C0; "tie 1 and 1+1/64 to even")]
#[test_case(1.0 + 3.0 / 128.0, 0x3C2; "tie up to even")]
fn e5m6_cases(v: f32, want: u16) {
    assert_eq!(e5m6_from_f32(v), want, "{v:e}");
}

#[test_case(70000.0, 0x7BFF; "70000")]
#[test_case(-65536.0, 0xFBFF; "negative 65536")]
#[test_case(65535.0, 0x7BFF; "65535")]
#[test_case(65519.0, 0x7BFF; "65519 truncates")]
#[test_case(1.9999999, 0x3FFF; "truncates below 2")]
#[test_case(f32::INFINITY, 0x7C00; "inf")]
#[test_case(f32::NEG_INFINITY, 0xFC00; "negative inf")]
#[test_case(f32::NAN, 0x7FFF; "nan")]
#[test_case(f32::from_bits(0xFFC0_0000), 0x7FFF; "negative nan")]
#[test_case(5.9604645e-8, 0x0001; "2^-24")]
#[test_case(5.9e-8, 0x0000; "below 2^-24")]
#[test_case(-5.9e-8, 0x8000; "negative below 2^-24")]
fn f16_rz_cases(v: f32, want: u16) {
    assert_eq!(f32_to_f16_bits_rz(v), want, "{v:e}");
}

#[test]
fn f16_rz_matches_models() {
    let mut pts: Vec<f64> = (0..=0x7BFFu16)
        .map(|h| f64::from(half::f16::from_bits(h).to_f32()))
        .step_by(97)
        .collect();
    pts.extend([
        65504.0,
        65536.0,
        2f64.powi(-24),
        2f64.powi(-25),
        2f64.powi(-14),
    ]);
    let near = neighbourhoods(&pts, 16);
    for bits in strided_sample().chain(near) {
        let v = f32::from_bits(bits);
        let got = f32_to_f16_bits_rz(v);
        assert_eq!(got, f16_rz_model(v), "{v:e} ({bits:#010x}) vs model");
        let table = f16_rz_reference_table(v);
        if v.is_finite() && v.abs() >= 65536.0 {
            assert_eq!((got, table & 0x7FFF), (0x7BFF | (table & 0x8000), 0x7C00));
        } else if v.is_nan() {
            assert_eq!((got, table & 0x7FFF), (0x7FFF, 0x7FFF));
        } else {
            assert_eq!(got, table, "{v:e} ({bits:#010x}) vs spec table");
        }
    }
}

#[test]
fn e5m6_matches_enc12_steps_on_sample() {
    // The literal spec steps on top of the independent RZ model.
    for bits in strided_sample() {
        let v = f32::from_bits(bits);
        let mut t = f16_rz_model(v) >> 4;
        if u32::from(t & 1) + (bits & 0x1FFFF) > 0x10000 {
            t += 1;
        }
        assert_eq!(e5m6_from_f32(v), t & 0xFFF, "{v:e} ({bits:#010x})");
    }
}

#[test]
fn e5m6_packing_hand_example() {
    let codes = [0x123, 0x456, 0x789, 0xABC, 0xDEF, 0x012, 0x345, 0x678];
    // B = 0x123456789ABCDEF012345678: W0 = 0x12345678, W1 = 0x9ABCDEF0, W2 = 0x12345678.
    let bytes = [
        0x78, 0x56, 0x34, 0x12, 0xF0, 0xDE, 0xBC, 0x9A, 0x78, 0x56, 0x34, 0x12,
    ];
    assert_eq!(pack_e5m6(&codes), bytes);
    assert_eq!(unpack_e5m6(&bytes), codes);

    let codes = [0xFFF, 0, 0, 0, 0, 0, 0, 0x001];
    let bytes = [0x00, 0x00, 0xF0, 0xFF, 0, 0, 0, 0, 0x01, 0, 0, 0];
    assert_eq!(pack_e5m6(&codes), bytes);
    assert_eq!(unpack_e5m6(&bytes), codes);

    let codes = [0, 0, 0xF0F, 0, 0, 0xA5A, 0, 0];
    // c2 straddles W0/W1: W0 = c2 >> 4 = 0xF0, W1 bits 31..28 = c2 & 0xF.
    // c5 straddles W1/W2: W1 bits 3..0 = c5 >> 8 = 0xA, W2 bits 31..24 = c5 & 0xFF = 0x5A.
    // W0 = 0x000000F0, W1 = 0xF000000A, W2 = 0x5A000000.
    let bytes = [0xF0, 0, 0, 0, 0x0A, 0, 0, 0xF0, 0, 0, 0, 0x5A];
    assert_eq!(pack_e5m6(&codes), bytes);
    assert_eq!(unpack_e5m6(&bytes), codes);
}

#[test]
fn e5m6_packing_matches_kernel_word_formulas() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..10_000 {
        let c: [u16; 8] = std::array::from_fn(|_| (rng.next() & 0xFFF) as u16);
        let h = c.map(u32::from);
        // The kernel's `float_to_e5m6` word assembly (uint32 arithmetic).
        let w0 = (h[0] << 20) | (h[1] << 8) | (h[2] >> 4);
        let w1 = (h[2] << 28) | (h[3] << 16) | (h[4] << 4) | (h[5] >> 8);
        let w2 = (h[5] << 24) | (h[6] << 12) | h[7];
        let mut want = [0u8; 12];
        want[0..4].copy_from_slice(&w0.to_le_bytes());
        want[4..8].copy_from_slice(&w1.to_le_bytes());
        want[8..12].copy_from_slice(&w2.to_le_bytes());
        assert_eq!(pack_e5m6(&c), want, "{c:x?}");
        assert_eq!(unpack_e5m6(&want), c);
    }
}

// ---------------------------------------------------------------------------------------------
// UE8M0 and scales (§1.4, §5 item 1)
// ---------------------------------------------------------------------------------------------

#[test]
fn ue8m0_decoding() {
    assert_eq!(ue8m0_to_f32(0).to_bits(), 0, "0 is +0.0");
    assert_eq!(ue8m0_to_f32(255), f32::INFINITY);
    assert_eq!(ue8m0_to_f32(127), 1.0);
    assert_eq!(ue8m0_to_f32(1), pow2(-126));
    assert_eq!(ue8m0_to_f32(105), pow2(-22));
    assert_eq!(ue8m0_to_f32(254), pow2(127));
    for b in 1..=254u8 {
        assert_eq!(ue8m0_to_f32(b), pow2(i32::from(b) - 127));
        assert_eq!(ue8m0_from_pow2(ue8m0_to_f32(b)), b);
    }
    assert_eq!(ue8m0_from_pow2(f32::INFINITY), 255);
    assert_eq!(
        ue8m0_from_pow2(3.0),
        128,
        "non power of two gives the floor exponent"
    );
}

#[test]
fn ue8m0x4_packing() {
    assert_eq!(
        pack_ue8m0x4([0x7F, 0x80, 0x01, 0xFF]),
        0xFF01_807Fu32 as i32
    );
    assert_eq!(
        unpack_ue8m0x4(0xFF01_807Fu32 as i32),
        [0x7F, 0x80, 0x01, 0xFF]
    );
    assert_eq!(pack_ue8m0x4([1, 0, 0, 0]), 1);
    let mut rng = Rng(12345);
    for _ in 0..1000 {
        let v = rng.next() as u32 as i32;
        assert_eq!(pack_ue8m0x4(unpack_ue8m0x4(v)), v);
    }
}

#[test]
fn quant_format_constants() {
    assert_eq!(QuantFormat::E4M3.max_value(), 448.0);
    assert_eq!(QuantFormat::E2M1.max_value(), 6.0);
    assert_eq!(QuantFormat::E5M6.max_value(), 65024.0);
    assert_eq!(QuantFormat::E4M3.eps().to_bits(), 0x38D1_B717);
    assert_eq!(QuantFormat::E4M3.eps(), 1e-4);
    assert_eq!(QuantFormat::E5M6.eps(), 1e-4);
    assert_eq!(QuantFormat::E2M1.eps().to_bits(), 0x01C0_0000);
    assert_eq!(QuantFormat::E2M1.eps(), 6.0 * pow2(-126));
    // Q is the largest finite value of each format.
    assert_eq!(e4m3_to_f32(0x7E), QuantFormat::E4M3.max_value());
    assert_eq!(e2m1_to_f32(7), QuantFormat::E2M1.max_value());
    assert_eq!(e5m6_to_f32(0x7BF), QuantFormat::E5M6.max_value());
}

// §5 item 1: the scales of an all-zero group.
#[test_case(QuantFormat::E4M3, false, 1e-4f32 / 448.0, 448.0f32 / 1e-4; "e4m3 plain")]
#[test_case(QuantFormat::E4M3, true, pow2(-22), pow2(22); "e4m3 rounded")]
#[test_case(QuantFormat::E2M1, false, pow2(-126), pow2(126); "e2m1 plain")]
#[test_case(QuantFormat::E2M1, true, pow2(-126), pow2(126); "e2m1 rounded")]
#[test_case(QuantFormat::E5M6, false, 1e-4f32 / 65024.0, 65024.0f32 / 1e-4; "e5m6 plain")]
#[test_case(QuantFormat::E5M6, true, pow2(-29), pow2(29); "e5m6 rounded")]
fn compute_scale_all_zero_group(fmt: QuantFormat, round: bool, sf: f32, inv: f32) {
    for amax in [0.0f32, -0.0, f32::from_bits(1), f32::NAN] {
        let got = compute_scale(amax, fmt, round);
        assert_eq!(
            (got.0.to_bits(), got.1.to_bits()),
            (sf.to_bits(), inv.to_bits()),
            "{amax:e}"
        );
    }
}

#[test]
fn compute_scale_zero_group_values() {
    let (sf, inv) = compute_scale(0.0, QuantFormat::E4M3, false);
    assert!((sf - 2.232e-7).abs() < 1e-10, "{sf:e}");
    assert!((inv - 4.48e6).abs() < 1.0, "{inv:e}");
    assert_eq!(
        ue8m0_from_pow2(compute_scale(0.0, QuantFormat::E4M3, true).0),
        127 - 22
    );
    assert_eq!(
        ue8m0_from_pow2(compute_scale(0.0, QuantFormat::E2M1, true).0),
        1
    );
    assert_eq!(
        ue8m0_from_pow2(compute_scale(0.0, QuantFormat::E5M6, true).0),
        127 - 29
    );
}

#[test_case(QuantFormat::E4M3, 448.0, 1.0; "e4m3 exact power keeps exponent")]
#[test_case(QuantFormat::E4M3, 449.0, 2.0; "e4m3 above power goes up")]
#[test_case(QuantFormat::E4M3, 447.0, 1.0; "e4m3 below power")]
#[test_case(QuantFormat::E4M3, 224.0, 0.5; "e4m3 half")]
#[test_case(QuantFormat::E2M1, 6.0, 1.0; "e2m1 exact")]
#[test_case(QuantFormat::E2M1, 6.5, 2.0; "e2m1 above")]
#[test_case(QuantFormat::E2M1, 3.0, 0.5; "e2m1 half")]
#[test_case(QuantFormat::E5M6, 65024.0, 1.0; "e5m6 exact")]
fn compute_scale_rounded_cases(fmt: QuantFormat, amax: f32, sf: f32) {
    let got = compute_scale(amax, fmt, true);
    assert_eq!(got, (sf, 1.0 / sf));
}

#[test]
fn compute_scale_matches_definitions_on_sample() {
    let fmts = [QuantFormat::E4M3, QuantFormat::E2M1, QuantFormat::E5M6];
    let mut checked = 0;
    for bits in strided_sample().step_by(7) {
        let amax = f32::from_bits(bits);
        if !amax.is_finite() || amax < 0.0 {
            continue;
        }
        for fmt in fmts {
            let q = fmt.max_value();
            let c = amax.max(fmt.eps());
            // Non-rounded: two correctly rounded divisions (checked in f64, which is exact to
            // round once more to f32 here because f64 has more than 2·24+2 bits).
            let (sf, inv) = compute_scale(amax, fmt, false);
            assert_eq!(sf, (f64::from(c) / f64::from(q)) as f32);
            assert_eq!(inv, (f64::from(q) / f64::from(c)) as f32);
            // Rounded: the reference formula, and sf = 2^ceil(log2(fl(c/Q))).
            let (sf, inv) = compute_scale(amax, fmt, true);
            let u = (c / q).to_bits();
            let r = f32::from_bits((u + 0x7F_FFFF) & 0x7F80_0000);
            assert_eq!((sf, inv), (r, 1.0 / r), "{amax:e} {fmt:?}");
            let ratio = f64::from(c / q);
            assert!(f64::from(sf) >= ratio && f64::from(sf) / 2.0 < ratio);
            assert_eq!(ue8m0_to_f32(ue8m0_from_pow2(sf)), sf);
            checked += 1;
        }
    }
    assert!(checked > 100_000);
}

#[test]
fn compute_scale_infinite_amax() {
    let (sf, inv) = compute_scale(f32::INFINITY, QuantFormat::E4M3, false);
    assert_eq!((sf, inv), (f32::INFINITY, 0.0));
    let (sf, inv) = compute_scale(f32::INFINITY, QuantFormat::E4M3, true);
    assert_eq!((sf, inv), (f32::INFINITY, f32::NEG_INFINITY));
    assert_eq!(ue8m0_from_pow2(sf), 255);
    // Largest finite amax: e stays in range (e4m3: e <= 120).
    let (sf, _) = compute_scale(f32::MAX, QuantFormat::E4M3, true);
    assert_eq!(sf, pow2(120));
    let (sf, _) = compute_scale(f32::MAX, QuantFormat::E2M1, true);
    assert_eq!(sf, pow2(126));
    let (sf, _) = compute_scale(f32::MAX, QuantFormat::E5M6, true);
    assert_eq!(sf, pow2(113));
}
