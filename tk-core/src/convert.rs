//! Bit-exact conversions between fp32 and the narrow formats of `spec/quant.md` §1.
//!
//! Every encoder here reproduces the **GPU (kernel side)** result bit for bit, so that CPU
//! references for the CUDA kernels can be built on top of these functions:
//!
//! | format | encoder | GPU operation reproduced |
//! |---|---|---|
//! | FP8 e4m3 | [`e4m3_from_f32`] | `cvt.rn.satfinite.e4m3x2.f32` |
//! | FP8 e5m2 | [`e5m2_from_f32`] | `cvt.rn.satfinite.e5m2x2.f32` |
//! | FP4 e2m1 | [`e2m1_from_f32`] | `__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)` |
//! | E5M6 | [`e5m6_from_f32`] | the `float_to_e5m6` macro ("enc12", built on `__float2half_rz`) |
//! | binary16, RZ | [`f32_to_f16_bits_rz`] | `__float2half_rz` (`cvt.rz.f16.f32`) |
//! | bf16 / f16, RNE | [`bf16_from_f32`], [`f16_from_f32`] | `__float2bfloat16` / `__float2half` (finite values) |
//!
//! Decoders are exact. Scale factors (§1.4) are computed by [`compute_scale`]; UE8M0 scale
//! bytes are handled by [`ue8m0_to_f32`], [`ue8m0_from_pow2`], [`pack_ue8m0x4`] and
//! [`unpack_ue8m0x4`].
//!
//! NaN inputs are not a supported use of the kernels (spec §5 item 6); where the GPU result for
//! a NaN is known it is reproduced and documented on the function.

// ---------------------------------------------------------------------------------------------
// Private helpers
// ---------------------------------------------------------------------------------------------

/// `2^e` as an fp32 built from its bits. Valid for `-126 <= e <= 127`.
const fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// `sig / 2^shift` rounded to the nearest integer, ties to even.
#[inline]
const fn rne_shr(sig: u64, shift: u32) -> u64 {
    if shift == 0 {
        return sig;
    }
    if shift >= 64 {
        // Callers pass `sig < 2^25`, so the quotient is below 1/2.
        return 0;
    }
    let q = sig >> shift;
    let rem = sig & ((1u64 << shift) - 1);
    let half = 1u64 << (shift - 1);
    if rem > half || (rem == half && (q & 1) == 1) {
        q + 1
    } else {
        q
    }
}

/// Magnitude code (`exponent << mbits | mantissa`) of `|x|` rounded to nearest, ties to even,
/// onto a minifloat grid with `mbits` mantissa bits whose smallest normal exponent is `emin`
/// (subnormals included). The grid is unbounded above: the caller saturates.
///
/// `abs` is the fp32 bit pattern of `|x|`, which must not be NaN (infinity gives a code larger
/// than any finite one).
#[inline]
const fn minifloat_rne_magnitude(abs: u32, mbits: u32, emin: i32) -> u32 {
    let e_field = (abs >> 23) as i32;
    let frac = abs & 0x007F_FFFF;
    // |x| = sig · 2^(e − 23).
    let (e, sig) = if e_field == 0 {
        (-126, frac)
    } else {
        (e_field - 127, frac | 0x0080_0000)
    };
    // The target quantum at this magnitude is 2^(max(e, emin) − mbits).
    let top = if e > emin { e } else { emin };
    let shift = (23 + top - mbits as i32 - e) as u32; // >= 23 − mbits > 0
    let n = rne_shr(sig as u64, shift) as u32;
    if e >= emin {
        // n is in [2^mbits, 2^(mbits+1)]; a carry out of the mantissa bumps the exponent.
        (((e - emin) as u32) << mbits) + n
    } else {
        // Subnormal range: n counts subnormal quanta; n = 2^mbits is the smallest normal.
        n
    }
}

/// Exact value of a minifloat magnitude code (no NaN/inf handling).
fn minifloat_magnitude_value(mag: u32, mbits: u32, emin: i32) -> f32 {
    let e = mag >> mbits;
    let m = mag & ((1 << mbits) - 1);
    if e == 0 {
        m as f32 * pow2(emin - mbits as i32)
    } else {
        (m + (1 << mbits)) as f32 * pow2(e as i32 - 1 + emin - mbits as i32)
    }
}

// ---------------------------------------------------------------------------------------------
// FP8 e4m3 (§1.1)
// ---------------------------------------------------------------------------------------------

/// Largest finite FP8 e4m3 magnitude code (448).
const E4M3_MAX_CODE: u32 = 0x7E;

/// Encodes an fp32 as FP8 e4m3fn exactly like the GPU's `cvt.rn.satfinite.e4m3x2.f32` (§1.1).
///
/// * Round to nearest, ties to even, on the e4m3 grid including subnormals (down to 2^-9).
/// * Saturation: every finite value whose rounded magnitude would exceed 448 (that is every
///   `|x| > 448`), and ±inf, become ±448 (`0x7E` / `0xFE`); never NaN.
/// * The sign is always kept: −0.0 and negatives that round to zero give `0x80`.
/// * NaN gives `0x7F` whatever its sign (the GPU drops it; PyTorch would give `0xFF`).
///
/// `#[inline]` (with its helpers) so other crates' CPU references, which call it once per
/// element, inline it: the SwiGLU forward's downstream reference casts ran 17 % faster.
#[inline]
pub fn e4m3_from_f32(x: f32) -> u8 {
    fp8_from_f32_satfinite(x, 3, -6, E4M3_MAX_CODE)
}

/// The shared FP8 encoder: RNE onto the grid with `mant_bits` mantissa bits and smallest normal
/// exponent `emin`, magnitude saturated to `max_code`, sign kept, NaN → `0x7F`.
#[inline]
fn fp8_from_f32_satfinite(x: f32, mant_bits: u32, emin: i32, max_code: u32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let mag = minifloat_rne_magnitude(bits & 0x7FFF_FFFF, mant_bits, emin).min(max_code);
    sign | mag as u8
}

/// Decodes an FP8 e4m3fn byte exactly (§1.1).
///
/// Normal (`e` = bits 6..3 in 1..15): `(-1)^s · 2^(e-7) · (1 + m/8)`; subnormal (`e = 0`):
/// `(-1)^s · 2^-6 · m/8`. `0x7F` and `0xFF` are NaN; there are no infinities. `0x80` is −0.0.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let mag = u32::from(b & 0x7F);
    let v = if mag == 0x7F {
        f32::NAN
    } else {
        minifloat_magnitude_value(mag, 3, -6)
    };
    if b & 0x80 != 0 {
        -v
    } else {
        v
    }
}

// ---------------------------------------------------------------------------------------------
// FP8 e5m2 (not used by the quant family; provided for the `E5M2` dtype)
// ---------------------------------------------------------------------------------------------

/// Largest finite FP8 e5m2 magnitude code (57344).
const E5M2_MAX_CODE: u32 = 0x7B;

/// Encodes an fp32 as FP8 e5m2 with the semantics of the GPU's `cvt.rn.satfinite.e5m2x2.f32`.
///
/// * Round to nearest, ties to even, on the e5m2 grid (bias 15, 2 mantissa bits, subnormals down
///   to 2^-16).
/// * Saturation: every `|x| > 57344` and ±inf become ±57344 (`0x7B` / `0xFB`); never inf/NaN.
/// * The sign is always kept (−0.0 gives `0x80`).
/// * NaN gives `0x7F` whatever its sign.
///
/// The quant spec does not use e5m2; these semantics are the PTX `satfinite` ones.
pub fn e5m2_from_f32(x: f32) -> u8 {
    fp8_from_f32_satfinite(x, 2, -14, E5M2_MAX_CODE)
}

/// Decodes an FP8 e5m2 byte exactly.
///
/// Normal (`e` = bits 6..2 in 1..30): `(-1)^s · 2^(e-15) · (1 + m/4)`; subnormal (`e = 0`):
/// `(-1)^s · 2^-14 · m/4`. `e = 31` is ±inf for `m = 0` (`0x7C` / `0xFC`) and NaN otherwise.
pub fn e5m2_to_f32(b: u8) -> f32 {
    let mag = u32::from(b & 0x7F);
    let v = if mag == 0x7C {
        f32::INFINITY
    } else if mag > 0x7C {
        f32::NAN
    } else {
        minifloat_magnitude_value(mag, 2, -14)
    };
    if b & 0x80 != 0 {
        -v
    } else {
        v
    }
}

// ---------------------------------------------------------------------------------------------
// FP4 e2m1 (§1.2, §3.14)
// ---------------------------------------------------------------------------------------------

/// Encodes an fp32 as an FP4 e2m1 nibble (`0..=15`) exactly like CUDA's
/// `__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)` on sm_90 (§1.2).
///
/// * Round to nearest, ties to even, on the grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}
///   (ties: 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4).
/// * Every magnitude above 5, and ±inf, saturates to 6 (code 7 / 15).
/// * Bit 3 copies the fp32 sign bit: −0.0 and tiny negatives give code 8.
/// * NaN gives code 7 (+6) whatever its sign (the PyTorch reference would give `7 | sign << 3`).
///
/// Implemented as the spec's bit-level reference algorithm `convert_to_e2m1_bits` (steps 1–7),
/// which equals the CUDA routine for every finite input, plus the GPU's NaN rule.
pub fn e2m1_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 7;
    }
    // Step 1: split.
    let q = x.to_bits();
    let s = q >> 31;
    let e = (q >> 23) & 0xFF;
    let m = q & 0x007F_FFFF;
    // Steps 2–3: working mantissa `w` and sticky bit.
    let (w, mut sticky) = if e < 127 {
        let p = 0x0040_0000 | (m >> 1);
        let t = 126 - e;
        if t >= 31 {
            (0, true)
        } else {
            let dropped = p & ((1u32 << t) - 1);
            (p >> t, (m & 1) != 0 || dropped != 0)
        }
    } else {
        (m, false)
    };
    // Step 4: exponent field.
    let ee = e.max(126) - 126;
    // Step 5: keep, guard, sticky.
    let keep = (w >> 22) & 1;
    let guard = (w >> 21) & 1;
    sticky |= (w & 0x001F_FFFF) != 0;
    // Step 6: increment.
    let inc = guard & u32::from(sticky || keep == 1);
    // Step 7: code, capped at 7, with the sign.
    let code = (((ee << 2) | (keep << 1) | guard) + inc) >> 1;
    (code.min(7) | (s << 3)) as u8
}

/// Decodes an FP4 e2m1 nibble exactly (§3.14). Only the low 4 bits of `nibble` are used.
///
/// Value = sign × (`m/2` if `e == 0`, else `2^(e−1)·(1+m/2)`) with `s` = bit 3, `e` = bits 2..1,
/// `m` = bit 0. Codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; code 8 is −0.0.
pub fn e2m1_to_f32(nibble: u8) -> f32 {
    let e = (nibble >> 1) & 3;
    let m = f32::from(nibble & 1);
    let v = if e == 0 {
        m * 0.5
    } else {
        pow2(i32::from(e) - 1) * (1.0 + m * 0.5)
    };
    if nibble & 8 != 0 {
        -v
    } else {
        v
    }
}

/// Packs two e2m1 nibbles into a byte: `lo` (the even logical column) in bits 3..0, `hi` (the odd
/// column) in bits 7..4 (§1.2 Packing). Only the low 4 bits of each argument are used.
pub const fn pack_e2m1(lo: u8, hi: u8) -> u8 {
    (lo & 0x0F) | ((hi & 0x0F) << 4)
}

/// Splits a packed e2m1 byte into `(lo, hi)` nibbles: `lo` = bits 3..0 (even column),
/// `hi` = bits 7..4 (odd column). Inverse of [`pack_e2m1`].
pub const fn unpack_e2m1(byte: u8) -> (u8, u8) {
    (byte & 0x0F, byte >> 4)
}

// ---------------------------------------------------------------------------------------------
// E5M6 (§1.3)
// ---------------------------------------------------------------------------------------------

/// Converts an fp32 to a binary16 bit pattern rounded toward zero, exactly like CUDA's
/// `__float2half_rz` (`cvt.rz.f16.f32`) (§1.3).
///
/// For fp32 biased exponent `E`, mantissa `m` and `sign` = the fp32 sign moved to bit 15:
///
/// | Case | Result |
/// |---|---|
/// | NaN | `0x7FFF` (sign dropped, as on the GPU) |
/// | ±inf | `sign \| 0x7C00` |
/// | `143 <= E <= 254` (finite `\|v\| >= 65536`) | `sign \| 0x7BFF` (±65504, as on the GPU) |
/// | `113 <= E <= 142` | `sign \| (E-112)<<10 \| m>>13` |
/// | `103 <= E <= 112` | `sign \| (0x800000\|m) >> (126-E)` |
/// | `E < 103` | `sign` |
///
/// This is the spec's table for the reference emulation `_float32_to_fp16_rtz_bits` except for
/// the two documented kernel differences: finite `|v| >= 65536` gives ±65504 instead of ±inf,
/// and NaN gives `0x7FFF` instead of `sign | 0x7FFF`.
pub const fn f32_to_f16_bits_rz(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let e = (bits >> 23) & 0xFF;
    let m = bits & 0x007F_FFFF;
    match e {
        255 => {
            if m != 0 {
                0x7FFF
            } else {
                sign | 0x7C00
            }
        }
        143..=254 => sign | 0x7BFF,
        113..=142 => sign | (((e - 112) << 10) | (m >> 13)) as u16,
        103..=112 => sign | ((0x0080_0000 | m) >> (126 - e)) as u16,
        _ => sign,
    }
}

/// Encodes an fp32 as a 12-bit E5M6 code ("enc12", §1.3) with the **kernel** semantics.
///
/// 1. `h = f32_to_f16_bits_rz(v)` (CUDA `__float2half_rz`);
/// 2. `t = h >> 4`;
/// 3. `r = bits(v) & 0x1FFFF`;
/// 4. if `(t & 1) + r > 0x10000`, `t += 1`;
/// 5. the code is `t & 0xFFF`.
///
/// For `2^-14 <= |v| < 65536` this is round-to-nearest-even onto the E5M6 grid (a tie at the
/// top rounds to the inf code `0x7C0`). Outside that range the rule is reproduced as written,
/// not as RNE:
///
/// * `|v| < 2^-14`: the binary16 subnormal (or zero) is adjusted using the fp32's low 17 bits,
///   which are not the dropped bits; e.g. any `|v| < 2^-24` with `r > 0x10000` becomes ±code 1
///   (±2^-20), and `1.5·2^-20` truncates to code 1.
/// * Finite `|v| >= 65536`: `t = 0x7BF` (±65024) then step 4, so the code is `0x7BF` or the inf
///   code `0x7C0` (sign in bit 11).
/// * ±inf: `0x7C0` / `0xFC0`.
/// * NaN: `h = 0x7FFF` so `t = 0x7FF`, and step 4 still applies: a NaN whose low 17 fp32 bits
///   are `>= 0x10000` (e.g. the GPU's canonical arithmetic NaN `0x7FFFFFFF`) gives `0x800`,
///   others (e.g. `0x7FC00000`) give `0x7FF`.
pub const fn e5m6_from_f32(v: f32) -> u16 {
    let mut t = f32_to_f16_bits_rz(v) >> 4;
    let r = v.to_bits() & 0x0001_FFFF;
    if (t & 1) as u32 + r > 0x0001_0000 {
        t += 1;
    }
    t & 0x0FFF
}

/// Decodes a 12-bit E5M6 code exactly: the binary16 pattern `code << 4` widened to fp32 (§1.3).
/// Only the low 12 bits of `code` are used. Exponent 31 decodes to ±inf (`m = 0`) or NaN.
pub fn e5m6_to_f32(code: u16) -> f32 {
    half::f16::from_bits((code & 0x0FFF) << 4).to_f32()
}

/// Packs 8 E5M6 codes into 12 bytes (§1.3 Packing). Only the low 12 bits of each code are used.
///
/// `B = Σ c_i · 2^(84 − 12 i)` (so `c0` is most significant) is split into three 32-bit words
/// `W0 = B[95:64]`, `W1 = B[63:32]`, `W2 = B[31:0]`, stored in that order, each little-endian:
/// byte `4w + b` holds bits `[8b+7 : 8b]` of `W_w`.
pub fn pack_e5m6(codes: &[u16; 8]) -> [u8; 12] {
    let b = codes.iter().enumerate().fold(0u128, |acc, (i, &c)| {
        acc | (u128::from(c & 0x0FFF) << (84 - 12 * i))
    });
    let mut out = [0u8; 12];
    for (w, chunk) in out.chunks_exact_mut(4).enumerate() {
        let word = (b >> (64 - 32 * w)) as u32;
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    out
}

/// Unpacks 12 bytes into 8 E5M6 codes; the exact inverse of [`pack_e5m6`].
pub fn unpack_e5m6(bytes: &[u8; 12]) -> [u16; 8] {
    let b = bytes.chunks_exact(4).fold(0u128, |acc, chunk| {
        let word = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        (acc << 32) | u128::from(word)
    });
    std::array::from_fn(|i| ((b >> (84 - 12 * i)) & 0x0FFF) as u16)
}

// ---------------------------------------------------------------------------------------------
// bf16 / f16
// ---------------------------------------------------------------------------------------------

/// Converts an fp32 to bfloat16, round to nearest, ties to even.
///
/// This is `half::bf16::from_f32`, which is RNE for every non-NaN input (overflow rounds to ±inf,
/// as IEEE RNE does) and equals the GPU's `__float2bfloat16` there. A NaN stays a NaN: `half`
/// keeps its sign and top payload bits and sets the quiet bit, whereas the GPU produces the
/// canonical `0x7FFF`; compare NaNs by class, not by bits.
pub fn bf16_from_f32(x: f32) -> half::bf16 {
    half::bf16::from_f32(x)
}

/// Converts an fp32 to IEEE binary16, round to nearest, ties to even (subnormals included).
///
/// This is `half::f16::from_f32` (hardware `F16C` or its software fallback, both RNE), which
/// equals the GPU's `__float2half` for every non-NaN input. A NaN stays a NaN (sign and top
/// payload bits kept, quiet bit set), whereas the GPU produces the canonical `0x7FFF`.
pub fn f16_from_f32(x: f32) -> half::f16 {
    half::f16::from_f32(x)
}

// ---------------------------------------------------------------------------------------------
// UE8M0 and scale factors (§1.4)
// ---------------------------------------------------------------------------------------------

/// Decodes a UE8M0 scale byte: the fp32 with bits `b << 23` (§1.4).
///
/// So `b = 0` gives **+0.0** (not 2^-127), `b = 255` gives **+inf**, otherwise `2^(b − 127)`.
pub const fn ue8m0_to_f32(b: u8) -> f32 {
    f32::from_bits((b as u32) << 23)
}

/// The UE8M0 byte of a power-of-two scale: its fp32 biased exponent field, `(bits(sf) >> 23) & 0xFF`.
///
/// For `sf = 2^e` (normal, as every scale of [`compute_scale`] is) this is `e + 127`, and
/// [`ue8m0_to_f32`] gives `sf` back. `+inf` (from an infinite `amax`) gives 255. For a scale that
/// is not a power of two it gives the floor exponent byte, like the reference does.
pub const fn ue8m0_from_pow2(sf: f32) -> u8 {
    ((sf.to_bits() >> 23) & 0xFF) as u8
}

/// Packs four UE8M0 bytes into an int32; `b[0]` is the least significant byte (§1.5 layout C).
pub const fn pack_ue8m0x4(b: [u8; 4]) -> i32 {
    i32::from_le_bytes(b)
}

/// Splits an int32 into its four UE8M0 bytes, least significant first; inverse of
/// [`pack_ue8m0x4`].
pub const fn unpack_ue8m0x4(v: i32) -> [u8; 4] {
    v.to_le_bytes()
}

/// A quantized target format of the cast family, for scale computation (§1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// FP8 e4m3fn: `Q = 448`, `ε = 1e-4`.
    E4M3,
    /// FP4 e2m1: `Q = 6`, `ε = 6 · 2^-126`.
    E2M1,
    /// E5M6: `Q = 65024`, `ε = 1e-4`.
    E5M6,
}

impl QuantFormat {
    /// `Q`, the largest finite value of the format: 448, 6 or 65024.
    pub const fn max_value(self) -> f32 {
        match self {
            QuantFormat::E4M3 => 448.0,
            QuantFormat::E2M1 => 6.0,
            QuantFormat::E5M6 => 65024.0,
        }
    }

    /// `ε_fmt`, the lower clamp of `amax` (§1.4 step 2): `1e-4` (fp32 `0x38D1B717`) for e4m3 and
    /// E5M6, `6 · 2^-126` (fp32 `0x01C00000`) for e2m1.
    pub const fn eps(self) -> f32 {
        match self {
            QuantFormat::E4M3 | QuantFormat::E5M6 => f32::from_bits(0x38D1_B717),
            QuantFormat::E2M1 => f32::from_bits(0x01C0_0000),
        }
    }
}

/// Computes the scale pair `(sf, inv)` of a scale group from its `amax` (§1.4 steps 2–3), as the
/// kernels do. `sf` is the dequantization multiplier (`x ≈ dec(q) · sf`) and `inv` the
/// quantization multiplier (`q = enc(fl(x · inv))`).
///
/// * `c = max(amax, fmt.eps())`.
/// * `round_sf == false`: `sf = fl(c / Q)` and `inv = fl(Q / c)`, two separate correctly rounded
///   divisions (`inv` is **not** `1/sf`).
/// * `round_sf == true` (UE8M0 scale): with `u = bits(fl(c / Q))`,
///   `e = ((u − 1) >> 23) + 1 − 127 = ceil(log2(c/Q))`, `sf = 2^e` (bits `(127+e)<<23`) and
///   `inv = 2^-e` (bits `(127−e)<<23`). The UE8M0 byte is [`ue8m0_from_pow2`]`(sf) = e + 127`.
///
/// `amax` is meant to be a max of absolute values (non-negative). The kernels' reductions ignore
/// NaN; `f32::max` does too, so a NaN `amax` is treated as 0. An infinite `amax` gives
/// `(inf, 0)` when not rounded and, rounded, `e = 128`: `sf = +inf` and `inv` built from the
/// wrapped exponent, which is `-inf`, exactly as the kernel computes it.
pub fn compute_scale(amax: f32, fmt: QuantFormat, round_sf: bool) -> (f32, f32) {
    compute_scale_with_eps(amax, fmt.max_value(), fmt.eps(), round_sf)
}

/// [`compute_scale`] with an explicit largest value `q` and clamp `eps` (ops such as the SwiGLU
/// cast let the caller replace the format's `eps`).
pub fn compute_scale_with_eps(amax: f32, q: f32, eps: f32, round_sf: bool) -> (f32, f32) {
    let c = amax.max(eps);
    if !round_sf {
        return (c / q, q / c);
    }
    let u = (c / q).to_bits();
    let e = (u.wrapping_sub(1) >> 23) as i32 + 1 - 127;
    let sf = f32::from_bits((127i32.wrapping_add(e) as u32) << 23);
    let inv = f32::from_bits((127i32.wrapping_sub(e) as u32) << 23);
    (sf, inv)
}
