// tk-quant: what the fused kernels (SwiGLU + cast, per-channel casts) share (include as
// "tk/fused_io.cuh"): fragments of 8 consecutive elements of one row moved as raw bytes (one
// or two 16-byte vectors, or 8 / 4 bytes, when the caller proved the alignment; bytewise
// otherwise), bf16 / e4m3 / e2m1 packing of a fragment, and the SwiGLU activation with the
// spec's exact operation order (§3.10 step 3, Appendix A.2).
#pragma once
#include "tk/quant_scale.cuh"
#include <cuda_bf16.h>

namespace tkq {

using tk::u16;

// NB bytes (4, 8, 16 or 32) at src as little-endian words: vector loads if VEC (src aligned
// to min(NB, 16)), bytewise otherwise.
template <int NB, bool VEC>
__device__ __forceinline__ void load_bytes(const void* src, u32 (&w)[NB / 4]) {
    if constexpr (VEC) {
        if constexpr (NB >= 16) {
#pragma unroll
            for (int i = 0; i < NB / 16; ++i) {
                const uint4 t = __ldg(reinterpret_cast<const uint4*>(src) + i);
                w[4 * i] = t.x; w[4 * i + 1] = t.y; w[4 * i + 2] = t.z; w[4 * i + 3] = t.w;
            }
        } else if constexpr (NB == 8) {
            const uint2 t = __ldg(reinterpret_cast<const uint2*>(src));
            w[0] = t.x; w[1] = t.y;
        } else {
            w[0] = __ldg(reinterpret_cast<const u32*>(src));
        }
    } else {
        const u8* b = reinterpret_cast<const u8*>(src);
#pragma unroll
        for (int i = 0; i < NB / 4; ++i)
            w[i] = b[4 * i] | b[4 * i + 1] << 8 | b[4 * i + 2] << 16 | (u32)b[4 * i + 3] << 24;
    }
}

// Stores NB bytes (4, 8, 16 or 32) given as little-endian words at dst (same rules as load_bytes).
template <int NB, bool VEC>
__device__ __forceinline__ void store_bytes(void* dst, const u32 (&w)[NB / 4]) {
    if constexpr (VEC) {
        if constexpr (NB >= 16) {
#pragma unroll
            for (int i = 0; i < NB / 16; ++i)
                reinterpret_cast<uint4*>(dst)[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
        } else if constexpr (NB == 8) {
            *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
        } else {
            *reinterpret_cast<u32*>(dst) = w[0];
        }
    } else {
        u8* b = reinterpret_cast<u8*>(dst);
#pragma unroll
        for (int i = 0; i < NB; ++i) b[i] = (u8)(w[i / 4] >> (8 * (i % 4)));
    }
}

// A fragment of 8 elements of type IN (0 fp32, 1 bf16, 2 e4m3): its size in bytes; load8 reads
// one at src widened to fp32 (exact).
template <int IN> struct Frag;
template <> struct Frag<0> { static constexpr int BYTES = 32; };
template <> struct Frag<1> { static constexpr int BYTES = 16; };
template <> struct Frag<2> { static constexpr int BYTES = 8; };

// The 8 values of a fragment of element type IN given as its raw little-endian words, widened
// to fp32 (exact).
template <int IN>
__device__ __forceinline__ void widen8(const u32 (&w)[Frag<IN>::BYTES / 4], float (&v)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if constexpr (IN == 0) v[j] = __uint_as_float(w[j]);
        else if constexpr (IN == 1) v[j] = __uint_as_float(((w[j / 2] >> (16 * (j % 2))) & 0xFFFF) << 16);
        else v[j] = e4m3_value(w[j / 4] >> (8 * (j % 4)));
    }
}

template <int IN, bool VEC>
__device__ __forceinline__ void load8(const void* src, float (&v)[8]) {
    u32 w[Frag<IN>::BYTES / 4];
    load_bytes<Frag<IN>::BYTES, VEC>(src, w);
    widen8<IN>(w, v);
}

// bf16 RNE of a pair, even element in the low half.
__device__ __forceinline__ u32 bf16x2_bits(float lo, float hi) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const u32*>(&b);
}

// fp32 of a bf16 rounding (RNE) of x.
__device__ __forceinline__ float round_bf16(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
}

// The raw words of 8 fp32 values as fp32 (OUT 0, 8 words) or bf16 (OUT 1, 4 words, RNE).
template <int OUT> struct Plain8 { static constexpr int WORDS = OUT == 0 ? 8 : 4; };

template <int OUT>
__device__ __forceinline__ void pack8_plain(const float (&v)[8], u32 (&w)[Plain8<OUT>::WORDS]) {
#pragma unroll
    for (int j = 0; j < Plain8<OUT>::WORDS; ++j) {
        if constexpr (OUT == 0) w[j] = __float_as_uint(v[j]);
        else w[j] = bf16x2_bits(v[2 * j], v[2 * j + 1]);
    }
}

// Stores 8 fp32 values as fp32 (OUT 0, 32 bytes) or bf16 (OUT 1, 16 bytes, RNE).
template <int OUT, bool VEC>
__device__ __forceinline__ void store8_plain(void* dst, const float (&v)[8]) {
    u32 w[Plain8<OUT>::WORDS];
    pack8_plain<OUT>(v, w);
    store_bytes<Plain8<OUT>::WORDS * 4, VEC>(dst, w);
}

// The e4m3 codes of 4 values, element 0 in the low byte: e4m3_code of each, converted two per
// instruction (one F2FP.E4M3 with two sources instead of two with one).
__device__ __forceinline__ u32 e4m3_pack4(float a, float b, float c, float d) {
    return e4m3_code2(a, b) | e4m3_code2(c, d) << 16;
}

// The codes of fl(v[j] * inv) (8 values) as words: e4m3 (FMT 0, 2 words) or packed e2m1 (FMT 1,
// 1 word, even element in the low nibble; e2m1_pack, bit for bit e2m1_code).
template <int FMT> struct Quant8 { static constexpr int WORDS = FMT == 0 ? 2 : 1; };

template <int FMT>
__device__ __forceinline__ void pack8_quant(const float (&v)[8], float inv, u32 (&w)[Quant8<FMT>::WORDS]) {
    float y[8];  // (8,) scaled values
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = __fmul_rn(v[j], inv);
    if constexpr (FMT == 0) {
        w[0] = e4m3_pack4(y[0], y[1], y[2], y[3]);
        w[1] = e4m3_pack4(y[4], y[5], y[6], y[7]);
    } else {
        w[0] = e2m1_pack<8>(y);
    }
}

// Quantizes fl(v[j] * inv) and stores the 8 codes: e4m3 (FMT 0, 8 bytes) or packed e2m1
// (FMT 1, 4 bytes, even element in the low nibble).
template <int FMT, bool VEC>
__device__ __forceinline__ void store8_quant(void* dst, const float (&v)[8], float inv) {
    u32 w[Quant8<FMT>::WORDS];
    pack8_quant<FMT>(v, inv, w);
    store_bytes<Quant8<FMT>::WORDS * 4, VEC>(dst, w);
}

// Clamp flags of one SwiGLU pair (for the counts and the backward's zeroed gradients).
struct ClampFlags {
    bool gate, hi, lo;  // l > C, v > C, v < -C
};

// The clamp of §3.10 step 2 in fp32 (no-op unless CLAMP): l = C if l > C; v = C if v > C,
// -C if v < -C. A NaN passes unchanged, as in the CPU reference.
template <bool CLAMP>
__device__ __forceinline__ ClampFlags swiglu_clamp(float& l, float& v, float c) {
    ClampFlags f{false, false, false};
    if constexpr (CLAMP) {
        f.gate = l > c;
        f.hi = v > c;
        f.lo = v < -c;
        l = f.gate ? c : l;  // selects, not branches
        v = f.hi ? c : f.lo ? -c : v;
    }
    return f;
}

// A two-operand PTX instruction `INSTR d, a, b` as a function NAME(T a, T b) -> T (C: the
// operands' register constraint).
#define TKQ_ASM_BINARY(NAME, T, C, INSTR)                                     \
    __device__ __forceinline__ T NAME(T a, T b) {                            \
        T r;                                                                 \
        asm(INSTR " %0, %1, %2;" : "=" C(r) : C(a), C(b));                   \
        return r;                                                            \
    }

// max(a, b) and min(a, b), NaN if either is NaN (max.NaN / min.NaN: one FMNMX.NAN each).
TKQ_ASM_BINARY(fmax_nan, float, "f", "max.NaN.f32")
TKQ_ASM_BINARY(fmin_nan, float, "f", "min.NaN.f32")
// Elementwise min / max of two bf16 pairs (even element in the low half), NaN if either is NaN
// (min.NaN / max.NaN.bf16x2: one HMNMX2 each; -0 < +0 as for fp32).
TKQ_ASM_BINARY(bf16x2_min_nan, u32, "r", "min.NaN.bf16x2")
TKQ_ASM_BINARY(bf16x2_max_nan, u32, "r", "max.NaN.bf16x2")
// Elementwise min / max of two pairs of unsigned 16-bit integers (one VIMNMX each).
TKQ_ASM_BINARY(u16x2_min, u32, "r", "min.u16x2")
TKQ_ASM_BINARY(u16x2_max, u32, "r", "max.u16x2")
#undef TKQ_ASM_BINARY

// The clamp of §3.10 step 2 without flags, as min.NaN / max.NaN (3 FMNMX.NAN instead of ~5
// FSETP / SEL per pair): l = min(l, C), v = max(min(v, C), -C). Bit for bit swiglu_clamp<true>
// for every finite C whose sign bit is clear (the comparisons agree; equal values differ only
// as +-0, where min / max order -0 < +0 exactly as the selects resolve them for C = +0), but
// NOT for C = -0.0 (min(+0, -0) = -0 where swiglu_clamp keeps +0). A NaN l or v comes out as
// the canonical NaN instead of itself; the activation's arithmetic on it (every path ends in
// an FMUL by v) gives the canonical NaN either way.
__device__ __forceinline__ void swiglu_clamp_minmax(float& l, float& v, float c) {
    l = fmin_nan(l, c);
    v = fmin_nan(fmax_nan(v, -c), c);
}

// a = fl(fl(l / fl(1 + expf(-l))) * v): CUDA's (non-fast-math) expf, then three separately
// rounded operations (no contraction).
__device__ __forceinline__ float swiglu_act(float l, float v) {
    return __fmul_rn(__fdiv_rn(l, __fadd_rn(1.0f, expf(-l))), v);
}

// fl(1 + expf(x)) for x in [-40, 40], bit for bit __fadd_rn(1.0f, expf(x)) with CUDA's
// (non-fast-math) expf, whose sequence (CUDA 12 / 13 headers, as NVRTC inlines it) is
// reproduced operation for operation: t = sat(fma(x, 0x3BBB989D, 0.5)); j = fma.rm(t, 252,
// 0x4B400001); f = fma(x, 0x32A57060, fma(x, log2(e) 0x3FB8AA3B, -(j + 0xCB40007F)));
// expf = fl(ex2.approx.ftz(f) * s) with s = 2^n the float of bits j << 23. For |x| <= 40,
// n is in [-124, 125] (in fact about +-58) and |f| < 2, so e = ex2(f) is normal in [1/4, 4] and
// s * e (a power of two times a normal float, within the normal range) is exact:
// fl(1 + fl(s * e)) = fma(e, s, 1).
// The CPU model test `one_plus_expf_model` (src/swiglu_forward_and_per_channel_cast_and_transpose.rs)
// checks n and f over every bf16 and a dense fp32 sweep of [-40, 40].
// Used where the divisions run inline (every gate in fast_div_ok's range): one FFMA instead of
// FMUL + FADD, 32 fewer FMA-pipe instructions per 32 gates. H200 A/B (session 9, D2, against
// __fadd_rn(1.0f, expf(-l))): swiglu_forward_and_per_channel_cast_and_transpose 8064x7168
// +1.0-1.8 % (e.g. npt=128 transposed round clamp=0.5 83.88 -> 82.42 µs), the per-token
// forward neutral (within 0.4 %; session 7 had measured it 1.000x there alone).
__device__ __forceinline__ float one_plus_expf(float x) {
    const float t = __saturatef(__fmaf_rn(x, __uint_as_float(0x3BBB989Du), 0.5f));
    const float j = __fmaf_rd(t, __uint_as_float(0x437C0000u), __uint_as_float(0x4B400001u));  // 252, 2^23 + 2^22 + 1
    float f = __fadd_rn(j, __uint_as_float(0xCB40007Fu));
    f = __fmaf_rn(x, __uint_as_float(0x3FB8AA3Bu), -f);
    f = __fmaf_rn(x, __uint_as_float(0x32A57060u), f);
    const float s = __uint_as_float(__float_as_uint(j) << 23);  // 2^n
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(f));  // MUFU.EX2
    return __fmaf_rn(e, s, 1.0f);
}

// fl(l / d) for d in [1, 2^58] and |l| in [2^-40, 40]: exactly the instruction sequence CUDA's
// IEEE division (__fdiv_rn) runs when its range check (FCHK) passes: approximate reciprocal
// (MUFU.RCP), one Newton step, the quotient and one residual correction, all single FMAs. In
// this range every intermediate is a normal number (r >= 2^-58, |q| >= 2^-98), so the check
// passes and the result is the correctly rounded quotient, bit for bit __fdiv_rn's; the
// divide's slow-path call (and the branch around it) leaves the hot loop.
__device__ __forceinline__ float div_fast(float l, float d) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));  // MUFU.RCP (d and 1/d are normal)
    r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
    const float q0 = __fmul_rn(l, r);
    return __fmaf_rn(r, __fmaf_rn(-d, q0, l), q0);
}

// Whether gate l is in div_fast's range: |l| in [2^-40, 40] (so d = fl(1 + expf(-l)) is in
// [1, 1 + e^40] within [1, 2^58]); false for zeros, NaN and infinities.
__device__ __forceinline__ bool fast_div_ok(float l) {
    return (fabsf(l) >= 0x1p-40f) & (fabsf(l) <= 40.0f);  // two FSETPs on |l|
}

// s[j] = fl(1 / t[j]) and q[j] = fl(l[j] / t[j]) for t[j] = fl(1 + expf(-l[j])) (the
// backward's two divisions), bit for bit __fdiv_rn's: inline (div_fast) when every gate of the
// fragment is in its range, else with __fdiv_rn.
__device__ __forceinline__ void div8_by(const float (&l)[8], const float (&t)[8], float (&s)[8], float (&q)[8]) {
    bool ok = true;
#pragma unroll
    for (int j = 0; j < 8; ++j) ok &= fast_div_ok(l[j]);
    if (ok) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            s[j] = div_fast(1.0f, t[j]);
            q[j] = div_fast(l[j], t[j]);
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        s[j] = __fdiv_rn(1.0f, t[j]);
        q[j] = __fdiv_rn(l[j], t[j]);
    }
}

// The activations a[j] = swiglu_act(l[j], v[j]) of a fragment, bit for bit: the divisions run
// inline (div_fast) unless a gate of the fragment is out of its range, in which case (rare:
// |l| > 40, tiny or non-finite gates) the fragment is computed with __fdiv_rn (the inline
// division measured 8 % faster over the SwiGLU forward bench than __fdiv_rn everywhere). The
// range check runs before either path, so no inline quotients are live across the fallback
// (the quotients first, recomputed when the check failed: 1.33x the time on the H200, meas31;
// with the min / max clamp it spilled 20 bytes at 64 registers). swiglu_act8_checked takes the
// check's result from the caller (ok: every l[j] passes fast_div_ok); swiglu_act8 runs it.
__device__ __forceinline__ void swiglu_act8_checked(const float (&l)[8], const float (&v)[8], float (&a)[8], bool ok) {
    float q[8];  // (8,) fl(l / d)
    if (ok) {
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = div_fast(l[j], one_plus_expf(-l[j]));
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = __fdiv_rn(l[j], __fadd_rn(1.0f, expf(-l[j])));
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = __fmul_rn(q[j], v[j]);
}

__device__ __forceinline__ void swiglu_act8(const float (&l)[8], const float (&v)[8], float (&a)[8]) {
    bool ok = true;
#pragma unroll
    for (int j = 0; j < 8; ++j) ok &= fast_div_ok(l[j]);
    swiglu_act8_checked(l, v, a, ok);
}

}  // namespace tkq
