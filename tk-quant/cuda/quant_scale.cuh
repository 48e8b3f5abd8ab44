// tk-quant: the scale arithmetic, the FP8 / FP4 encoders and the scale-layout stores shared by
// every cast kernel (include as "tk/quant_scale.cuh"; spec/quant.md §1.1, §1.2, §1.4, §1.5).
// Everything here is exactly what the CPU references compute (tk_core::convert).
#pragma once
#include "tk/common.cuh"
#include <cuda_fp8.h>

namespace tkq {

using tk::u8;
using tk::u32;
using tk::u64;

// (sf, inv) of §1.4 for amax with the clamp eps and the format maximum q, exactly
// tk_core::convert::compute_scale_with_eps: c = max(amax, eps) (NaN amax -> eps);
// non-rounded: sf = fl(c/q), inv = fl(q/c) (two correctly rounded divisions);
// rounded: e = ceil(log2(fl(c/q))) from the bits, sf = 2^e, inv = 2^-e.
template <bool ROUND>
__device__ __forceinline__ void scale_pair(float amax, float eps, float q, float& sf, float& inv) {
    const float c = fmaxf(amax, eps);
    if constexpr (ROUND) {
        const u32 u = __float_as_uint(__fdiv_rn(c, q));
        const int e = (int)((u - 1) >> 23) + 1 - 127;
        sf = __uint_as_float((u32)(127 + e) << 23);
        inv = __uint_as_float((u32)(127 - e) << 23);
    } else {
        sf = __fdiv_rn(c, q);
        inv = __fdiv_rn(q, c);
    }
}

// scale_pair<false> for e4m3 (q = 448, eps = 1e-4) without the IEEE divisions' range check and
// slow-path call: the same sf = fl(c / 448) and inv = fl(448 / c) for every c = max(amax, eps)
// in [eps, inf] (checked for every such fp32 c on the GPU against scale_pair<false> by the test
// gpu_scale_pair_e4m3_fast_is_the_division in tests/gpu_fused.rs, so far on the H200 (sm_90a):
// 448 / c depends on the hardware's approximate reciprocal; the c / 448 half also on the CPU
// once, session 21).
// * c / 448: y = fl(c * rq) with rq = fl(1 / 448), then Markstein's correction
//   fl(y + fl(c - 448 y) * rq) (the remainder exact by FMA).
// * 448 / c: the division's own fast path (approximate reciprocal, one Newton step, product,
//   remainder correction) on operands scaled by 2^-64 when c >= 2^64, whose reciprocal would be
//   subnormal (flushed); c = inf gives (inf, +0) as the divisions do.
__device__ __forceinline__ void scale_pair_e4m3_fast(float amax, float& sf, float& inv) {
    constexpr float Q = 448.0f;
    const float rq = __uint_as_float(0x3B124925u);  // fl(1 / 448)
    const float c = fmaxf(amax, __uint_as_float(0x38D1B717u));
    const float y = __fmul_rn(c, rq);
    const float d = __fmaf_rn(__fmaf_rn(-Q, y, c), rq, y);
    const bool big = c >= __uint_as_float(0x5F800000u);  // 2^64
    const float cs = big ? __fmul_rn(c, __uint_as_float(0x1F800000u)) : c;  // c (* 2^-64, exact)
    const float qs = big ? __uint_as_float(0x23E00000u) : Q;              // 448 (* 2^-64)
    float r;  // ~1 / cs
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(cs));
    r = __fmaf_rn(r, __fmaf_rn(-cs, r, 1.0f), r);
    const float z = __fmul_rn(qs, r);
    const float v = __fmaf_rn(__fmaf_rn(-cs, z, qs), r, z);
    const bool inf = c == __uint_as_float(0x7F800000u);
    sf = inf ? c : d;
    inv = inf ? 0.0f : v;
}

// scale_pair<true> without the division, for a constant eps with eps / q >= 2^-126 (the cast
// kernels' eps and q): with c = max(amax, eps) = 2^E (1 + f) and q = 2^Eq (1 + fq),
// fl(c / q) <= 2^k iff c <= q 2^k (q (1 + 2^-24) lies below the successor of q as 1 + fq < 2,
// and c 2^-k stays normal), so e = ceil(log2(fl(c / q))) = E - Eq + (f > fq): the carry of
// f + (1 - 2^-23 - fq) into the exponent field, one integer add and a shift instead of an IEEE
// division (FCHK, branch, slow-path call). c = inf gives e = 128 as the division does. Checked on
// the CPU against scale_pair<true> for every fp32 c in [eps, inf] and q = 6, 448, 65024 when it
// was written; for e4m3 (q = 448, eps = 1e-4) by the unit test
// `pow2_scales_equal_the_division_form_for_e4m3` (src/cast.rs).
__device__ __forceinline__ void scale_pair_pow2(float amax, float eps, float q, float& sf, float& inv) {
    const u32 cb = __float_as_uint(fmaxf(amax, eps)), qb = __float_as_uint(q);
    const int e = cb >= 0x7F800000u ? 128 : (int)((cb + (0x7FFFFFu - (qb & 0x7FFFFFu))) >> 23) - (int)(qb >> 23);
    sf = __uint_as_float((u32)(127 + e) << 23);
    inv = __uint_as_float((u32)(127 - e) << 23);
}

// FP8 e4m3 code of x: RNE, saturating to +-448, sign of zero kept, NaN -> 0x7F (§1.1).
__device__ __forceinline__ u32 e4m3_code(float x) {
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

// The fp32 value of an e4m3 code (exact).
__device__ __forceinline__ float e4m3_value(u32 code) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)(code & 0xFF), __NV_E4M3);
    return __half2float(__half(h));
}

// The fp32 values of the e4m3 codes in bytes j and j + 1 of w (j even; exact): one
// cvt.rn.f16x2.e4m3x2 for the pair (the instruction e4m3_value issues for one code: the same
// halves), then exact widening; per 2 values 1 conversion and 1 shift instead of 2 byte
// extractions and 2 conversions.
__device__ __forceinline__ float2 e4m3x2_value(u32 w, int j) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> (8 * j)), __NV_E4M3);
    return __half22float2(__half2(h));
}

// FP4 e2m1 code of x: round to nearest even among {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating to 6;
// the sign of zero is kept; NaN -> 7 (+6). Hopper has no e2m1 conversion instruction, so the
// rounding is done by a float add: with s = the e2m1 spacing at |x| (0.5 below 2, then 1,
// then 2) and M = 1.5 * 2^23 * s, fl(|x| + M) - M is |x| rounded to a multiple of s, to
// nearest even (IEEE addition). Bit-identical to __nv_cvt_float_to_fp4 (checked on the GPU).
__device__ __forceinline__ u32 e2m1_code(float x) {
    const float a = fminf(fabsf(x), 8.0f);                          // NaN -> 8 (saturates below)
    const u32 e = max(__float_as_uint(a) >> 23, 127u);              // biased exponent, at least that of 1.0
    const float m = __uint_as_float(((e + 22) << 23) | 0x400000u);  // 1.5 * 2^23 * spacing
    const float r = fminf(__fsub_rn(__fadd_rn(a, m), m), 6.0f);     // rounded, saturated
    // r in {0, .5, 1, 1.5, 2, 3, 4, 6}: (bits >> 22) - 252 is the code from 1 up (1 -> 2,
    // 1.5 -> 3, 2 -> 4, 3 -> 5, 4 -> 6, 6 -> 7), 0 for 0.5 and negative for 0; integer ops only.
    const u32 rb = __float_as_uint(r);
    const u32 mag = (u32)max((int)(rb >> 22) - 252, 0) + (rb == 0x3F000000u ? 1u : 0u);
    const u32 sign = x != x ? 0u : (__float_as_uint(x) >> 28) & 8;  // NaN -> +6
    return mag | sign;
}

// The e2m1 code in nibble j (bits 4j..4j+3) of w as the fp32 value * 2^-126, exactly (see
// e2m1_value): the sign to bit 31, the 3-bit magnitude code to bits 22..24.
__device__ __forceinline__ float e2m1_value_m126(u32 w, int j) {
    const u32 x = w << (28 - 4 * j);  // sign at bit 31, magnitude code at bits 28..30
    return __uint_as_float((x & 0x80000000u) | ((x >> 6) & 0x01C00000u));
}

// The fp32 value of the e2m1 code in nibble j (bits 4j..4j+3) of w, exactly, the sign of zero
// kept: decode_elem's value without its compares and selects. The sign goes to bit 31 and the
// 3-bit magnitude code (exponent e, mantissa m) to bits 22..24, i.e. fp32 exponent field e and
// mantissa m / 2: that fp32 is the e2m1 value times 2^-126 (code 1, 0.5, is the subnormal
// 2^-127; code 0 is zero), and one exact multiply by 2^126 (no flush: the kernels are built
// without ftz) gives the value. 2 shifts, 2 logic ops and an FMUL instead of ~10 instructions.
// Checked on the CPU against decode_elem for all 16 codes at every nibble position j.
__device__ __forceinline__ float e2m1_value(u32 w, int j) {
    return __fmul_rn(e2m1_value_m126(w, j), 0x1p126f);
}

// e4m3 codes of a and b, a in the low byte: e4m3_code of each (the same conversion, two lanes).
__device__ __forceinline__ u32 e4m3_code2(float a, float b) {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

// The e2m1 value of x (rounded as e2m1_code: RNE on the e2m1 grid, saturated to +-6, sign of x
// kept, NaN -> +6) times 2^-6, exactly. With a = min(|x|, 6) and 2^e <= max(a, 1) (e = 0, 1, 2:
// e2m1 spacing 2^(e-1)), m = 2^(e+16) has ulp 2^(e-7) = spacing * 2^-6, so the single rounding
// of the exact a * 2^-6 + m (FMA) is a rounded to the e2m1 grid, to nearest even, and the
// difference with m is exact. 6 instructions plus 2 for the sign, instead of e2m1_code's ~17.
__device__ __forceinline__ float e2m1_scaled(float x) {
    const float a = fminf(fabsf(x), 6.0f);  // NaN -> 6
    const float m = __uint_as_float((__float_as_uint(fmaxf(a, 1.0f)) & 0x7F800000u) + (16u << 23));
    const float r = __fsub_rn(__fmaf_rn(a, 0x1p-6f, m), m);
    return __uint_as_float(__float_as_uint(r) | (__float_as_uint(fminf(x, 6.0f)) & 0x80000000u));
}

// N (4 or 8) e2m1 codes (e2m1_code bit for bit) packed two per byte, element 0 in the low
// nibble: N/2 bytes in the low end of the result. e2m1_scaled(x) = +-r * 2^-6 converts exactly
// to the e4m3 byte sign << 7 | code << 2 (e2m1 and e4m3 share the exponent layout after the
// 2^(1-7) bias shift; r = 0.5 is the e4m3 subnormal 4 * 2^-9), two per hardware conversion;
// the nibbles are then cut out of four bytes at a time.
template <int N>
__device__ __forceinline__ u32 e2m1_pack(const float (&y)[N]) {
    static_assert(N == 4 || N == 8, "e2m1_pack packs 4 or 8 values");
    u32 b[N / 4];  // (N/4,) words of 4 byte-wide nibbles
#pragma unroll
    for (int h = 0; h < N / 4; ++h) {
        const u32 x = e4m3_code2(e2m1_scaled(y[4 * h]), e2m1_scaled(y[4 * h + 1])) |
                      e4m3_code2(e2m1_scaled(y[4 * h + 2]), e2m1_scaled(y[4 * h + 3])) << 16;  // (4,) e4m3 bytes
        const u32 n = ((x >> 2) & 0x07070707u) | ((x >> 4) & 0x08080808u);  // (4,) nibbles, one per byte
        b[h] = n | n >> 4;  // bytes 0 and 2: two nibbles each
    }
    if constexpr (N == 8) return __byte_perm(b[0], b[1], 0x6420);
    else return __byte_perm(b[0], 0, 0x4420);
}

// Packed bf16 pair arithmetic (PTX, one instruction each; lane 0 = the low half). min / max
// return the other operand when one is NaN (like fminf / fmaxf); mul / add round once, RNE.
#define TK_BF16X2_OP(name, ptx)                                   \
    __device__ __forceinline__ u32 name(u32 a, u32 b) {           \
        u32 d;                                                    \
        asm(ptx " %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));       \
        return d;                                                 \
    }
TK_BF16X2_OP(bf16x2_max, "max.bf16x2")
TK_BF16X2_OP(bf16x2_min, "min.bf16x2")
TK_BF16X2_OP(bf16x2_mul, "mul.rn.bf16x2")
TK_BF16X2_OP(bf16x2_add, "add.rn.bf16x2")
#undef TK_BF16X2_OP

// |x| of a bf16 pair by abs.bf16x2, which ptxas issues as HFMA2.BF16_V2 (-0 * 0 + |x|, exact:
// subnormals kept, -0 + +0 = +0) on the FMA pipe, instead of an AND on the ALU pipe, the pipe
// that bounds the e2m1 casts (ncu: ALU 80 %; H200: faster than the AND). NaN lanes give an
// unspecified NaN (the AND keeps the payload): every caller ignores NaN (max) or never passes one.
__device__ __forceinline__ u32 bf16x2_abs(u32 a) {
    u32 d;
    asm("abs.bf16x2 %0, %1;" : "=r"(d) : "r"(a));
    return d;
}

// bf16 pair fma (one rounding, RNE): a * b + c lane-wise; ptxas issues HFMA2.BF16_V2 (FMA pipe).
__device__ __forceinline__ u32 bf16x2_fma(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// 8 e2m1 codes packed two per byte (element 0 in the low nibble), exactly e2m1_pack of
// y_j = fl(x_j * inv_j) for bf16 x_j (w[j/2], element 2i in the low half of w[i]) when every
// inv_j is a power of two (power-of-two scales: the round_sf inverse of scale_pair; inv2[i]
// holds the bf16 inv of elements 2i, 2i+1, exact as the low 16 bits of such an fp32 are zero)
// and every y_j is NaN or |y_j| <= 6 (the caller's block inverse: cast.cu). Then x * inv is
// exact in bf16 as in fp32 (8 significant bits) except below 2^-126, where both give a magnitude
// that encodes to 0 with the sign kept, so the whole encoder runs on packed pairs, two values
// per instruction:
//   c  = min(y, 6)                        NaN -> +6 (min ignores NaN); the sign of the code
//   A  = |c|                              <= 6 (the precondition: no second clamp)
//   B  = 2^e                              e = exponent of max(A, 1) (0, 1, 2): B in {1, 2, 4}
//   m  = B (3 B + 49) + 20                72, 130, 264 by two bf16 FMAs (every intermediate an
//                                         exact bf16: 52, 55, 61; 52, 110, 244): the bf16 ulp
//                                         of m is the e2m1 spacing 2^(e-1) at A; m's mantissa
//                                         field (16, 2, 4) is 2e modulo 8 and even
//   t  = fl(A + m)                        one RNE rounding of A onto the e2m1 grid, ties
//                                         to even (m's mantissa is even), no binade crossing
//                                         (t <= 74, 134, 270)
// so t's low 3 mantissa bits are 2e + round(A / 2^(e-1)) = the e2m1 code of A (at most 7), and
// the sign bit of c is the sign of the code (y >= 6 and NaN: +; else c = y keeps y's sign, -0
// included). The codes and signs of 4 values are gathered with byte permutes in the order
// (x1, x0, x3, x2) (prmt; the sign-replicating mode for the sign bytes), so q * 0x1001
// (= q + (q << 12), disjoint bits: no carries) puts x0 | x1 << 4 in byte 1 and x2 | x3 << 4 in
// byte 3, which the last permute takes. Checked on the CPU (tk-quant src/cast.rs tests) against
// tk_core's e2m1_from_f32 of the fp32 product for every bf16 x and every inv 2^k, k in
// [-126, 120], with |x * inv| <= 6 or NaN, also with bf16 operations that flush subnormals to
// signed zero (cast.cu's guard keeps inv <= 2^120), and the nibble gather against the packed
// word's definition.
//
// Why this form: the ALU pipe (half the FMA pipe's rate on Hopper) bounds the e2m1 tiles. The
// previous form (second min(|c|, 6); m = e + (e >> 6) + 0x0202 by LEA.HI + VIADD; bytes in
// element order and q | q >> 4 by LEA.HI) issued 306 ALU and 110 FMA-pipe instructions for a
// tile's encode (8 rows of 8 values, SASS sm_90a, per-block 32x32); this one 197 / 193 (the
// FMAs, the IMAD and abs.bf16x2 run on the FMA pipe). H200 (session 9, with the per-block packed
// maximum): bf16 -> e2m1 8001x7168 per-block 32x32 42.18 -> 41.57 µs, 128x128 42.49 -> 42.19,
// per-token npc=128 40.96 -> 40.40 (6 rows: 1.001-1.017, mean 1.012).
__device__ __forceinline__ u32 e2m1_pack_bf16_pow2_abs(const u32 (&w)[4], const u32 (&inv2)[4]) {
    u32 c[4], t[4];  // (4,) bf16 pairs: min(y, 6) (the signs); |rounded| (code in mantissa bits 0..2)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        c[i] = bf16x2_min(bf16x2_mul(w[i], inv2[i]), 0x40C040C0u);                          // min(y, 6); NaN -> 6
        const u32 a = bf16x2_abs(c[i]);                                                      // A = |c| <= 6
        const u32 e = bf16x2_max(a, 0x3F803F80u) & 0x7F807F80u;                             // B = 2^e: exponent of max(A, 1)
        const u32 m = bf16x2_fma(e, bf16x2_fma(e, 0x40404040u, 0x42444244u), 0x41A041A0u);  // B (3 B + 49) + 20
        t[i] = bf16x2_add(a, m);                                                             // A + m (see above)
    }
    u32 n[2];  // (2,) words with bytes 1 and 3 holding two nibbles each
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        u32 b, s;  // (4,) bytes of elements 1, 0, 3, 2: low byte of each half of t (code in bits 0..2); sign of each half of c (0 / 0xFF)
        asm("prmt.b32 %0, %1, %2, 0x4602;" : "=r"(b) : "r"(t[2 * h]), "r"(t[2 * h + 1]));
        asm("prmt.b32 %0, %1, %2, 0xDF9B;" : "=r"(s) : "r"(c[2 * h]), "r"(c[2 * h + 1]));
        const u32 q = (b & 0x07070707u) | (s & 0x08080808u);  // (4,) nibbles, one per byte
        n[h] = q * 0x1001u;
    }
    return __byte_perm(n[0], n[1], 0x7531);
}

// Stores S[mb, kb] (mb < nbm, kb < nbk) of a scale grid in layout LAYOUT (0: A row-major fp32
// (nbm, nbk); 1: B column-major fp32, storage (nbk, ra); 2: C packed UE8M0, storage
// (ceil(nbk/4), ra) int32 as bytes), ra = align(nbm, 4), plus the padding attached to it (rows
// nbm..ra below the last row; in layout C, bytes nbk..4*ceil(nbk/4) right of the last column),
// so that every padding element is written zero exactly once when every S[mb, kb] is stored.
template <int LAYOUT>
__device__ __forceinline__ void store_scale(u64 base, u64 nbm, u64 nbk, u64 ra, u64 mb, u64 kb, float sf) {
    if constexpr (LAYOUT == 0) {
        reinterpret_cast<float*>(base)[mb * nbk + kb] = sf;  // (nbm, nbk)
    } else if constexpr (LAYOUT == 1) {
        float* s = reinterpret_cast<float*>(base);  // storage (nbk, ra)
        s[kb * ra + mb] = sf;
        if (mb + 1 == nbm)
            for (u64 r = nbm; r < ra; ++r) s[kb * ra + r] = 0.0f;
    } else {
        u8* s = reinterpret_cast<u8*>(base);  // storage (ceil(nbk/4), ra) int32 as bytes
        const u64 kend = 4 * ((nbk + 3) / 4);
        s[4 * ((kb / 4) * ra + mb) + kb % 4] = (u8)(__float_as_uint(sf) >> 23);
        if (mb + 1 == nbm)
            for (u64 r = nbm; r < ra; ++r) s[4 * ((kb / 4) * ra + r) + kb % 4] = 0;
        if (kb + 1 == nbk)
            for (u64 k2 = nbk; k2 < kend; ++k2)
                for (u64 r = mb; r < (mb + 1 == nbm ? ra : mb + 1); ++r) s[4 * ((k2 / 4) * ra + r) + k2 % 4] = 0;
    }
}

}  // namespace tkq
