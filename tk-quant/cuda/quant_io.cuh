// tk-quant: reading FP32 / BF16 / FP8 e4m3 / FP4 e2m1 inputs and their scales, shared by the
// cast kernels (include as "tk/quant_io.cuh").
//
// Defines used: TK_IN (0 fp32, 1 bf16, 2 e4m3, 3 packed e2m1, 4 packed E5M6), TK_FMT (cast
// target; 2 = E5M6 widens fp32 fragments to 8 values), TK_IN_SF (quantized input:
// 0 fp32 scales with any strides, 1 packed UE8M0 int32), TK_VECIO (1: vector loads),
// TK_E4M3_VEC (optional: e4m3 fragment width 4 or 8, default 8).
#pragma once
#include "tk/common.cuh"
#include <cuda_fp8.h>

using tk::u8;
using tk::u16;
using tk::u32;
using tk::u64;

#if TK_IN == 0 && defined(TK_FMT) && TK_FMT == 2
constexpr int VEC = 8;  // 32 bytes of fp32 (an E5M6 cast packs 8 values at a time)
constexpr int IN_BITS = 32;
#elif TK_IN == 0
constexpr int VEC = 4;  // logical elements per thread fragment (16 bytes of fp32)
constexpr int IN_BITS = 32;
#elif TK_IN == 1
constexpr int VEC = 8;  // 16 bytes of bf16
constexpr int IN_BITS = 16;
#elif TK_IN == 2 && defined(TK_E4M3_VEC)
constexpr int VEC = TK_E4M3_VEC;  // 4 or 8 bytes of e4m3
constexpr int IN_BITS = 8;
#elif TK_IN == 2
constexpr int VEC = 8;  // 8 bytes of e4m3
constexpr int IN_BITS = 8;
#elif TK_IN == 3
constexpr int VEC = 8;  // 4 bytes of e2m1
constexpr int IN_BITS = 4;
#else
constexpr int VEC = 8;  // 12 bytes of packed E5M6
constexpr int IN_BITS = 12;
#endif
constexpr int IN_STORAGE_BYTES = IN_BITS >= 8 ? IN_BITS / 8 : 1;  // bytes per storage element
constexpr int RAW_WORDS = VEC * IN_BITS / 32;                     // 32-bit words per fragment

// The raw bits of one fragment: VEC consecutive logical elements of one row.
struct Raw {
    u32 w[RAW_WORDS];
};

// Loads the fragment of a row (row: its first byte) starting at logical column c0 (a multiple
// of VEC); elements at columns >= K read as zero bits. The caller guarantees c0 < K.
__device__ __forceinline__ Raw load_frag_at(const u8* row, u64 k, u64 c0) {
    Raw raw;
#if TK_VECIO
    const u8* src = row + c0 * IN_BITS / 8;
    if constexpr (RAW_WORDS == 8) {
        const uint4 a = __ldg(reinterpret_cast<const uint4*>(src)), b = __ldg(reinterpret_cast<const uint4*>(src) + 1);
        raw.w[0] = a.x; raw.w[1] = a.y; raw.w[2] = a.z; raw.w[3] = a.w;
        raw.w[4] = b.x; raw.w[5] = b.y; raw.w[6] = b.z; raw.w[7] = b.w;
    } else if constexpr (RAW_WORDS == 4) {
        const uint4 t = __ldg(reinterpret_cast<const uint4*>(src));
        raw.w[0] = t.x; raw.w[1] = t.y; raw.w[2] = t.z; raw.w[3] = t.w;
    } else if constexpr (RAW_WORDS == 2) {
        const uint2 t = __ldg(reinterpret_cast<const uint2*>(src));
        raw.w[0] = t.x; raw.w[1] = t.y;
    } else if constexpr (RAW_WORDS == 3) {
        const u32* w = reinterpret_cast<const u32*>(src);
        raw.w[0] = __ldg(w); raw.w[1] = __ldg(w + 1); raw.w[2] = __ldg(w + 2);
    } else {
        raw.w[0] = __ldg(reinterpret_cast<const u32*>(src));
    }
#else
#pragma unroll
    for (int i = 0; i < RAW_WORDS; ++i) raw.w[i] = 0;
    if constexpr (IN_BITS == 12) {  // 12 bytes, little-endian words (K % 8 == 0: never partial)
        const u8* src = row + c0 * 3 / 2;
#pragma unroll
        for (int b = 0; b < 12; ++b) raw.w[b / 4] |= (u32)src[b] << (8 * (b % 4));
        return raw;
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        const u64 c = c0 + j;
        if (c < k) {
            u32 bits;
            if (IN_BITS == 32) bits = reinterpret_cast<const u32*>(row)[c];
            else if (IN_BITS == 16) bits = reinterpret_cast<const u16*>(row)[c];
            else if (IN_BITS == 8) bits = row[c];
            else bits = (row[c / 2] >> (4 * (c % 2))) & 0xF;
            raw.w[j * IN_BITS / 32] |= bits << ((j * IN_BITS) % 32);
        }
    }
#endif
    return raw;
}

// Loads the fragment of row r (row stride ldx storage elements) starting at logical column c0
// (load_frag_at; r < M, c0 < K).
__device__ __forceinline__ Raw load_frag(const void* x, u64 ldx, u64 k, u64 r, u64 c0) {
    return load_frag_at(reinterpret_cast<const u8*>(x) + r * ldx * IN_STORAGE_BYTES, k, c0);
}

#if TK_IN >= 2
// Input scale S_in[mb, kb]: fp32 at mb*s0 + kb*s1, or UE8M0 byte kb%4 of the int32 at
// (mb, kb/4), decoded as the fp32 with bits b << 23.
__device__ __forceinline__ float in_scale(const void* sf, u64 s0, u64 s1, u64 mb, u64 kb) {
#if TK_IN_SF == 0
    return __ldg(reinterpret_cast<const float*>(sf) + mb * s0 + kb * s1);
#else
    const u8* b = reinterpret_cast<const u8*>(sf);  // int32 (nbm, ceil(nbk/4)) as bytes
    const u32 byte = __ldg(b + 4 * (mb * s0 + (kb / 4) * s1) + kb % 4);
    return __uint_as_float(byte << 23);
#endif
}
#endif

// Element j of a fragment decoded to fp32 (exact).
__device__ __forceinline__ float decode_elem(const Raw& raw, int j) {
    const u32 w = raw.w[j * IN_BITS / 32];
#if TK_IN == 0
    return __uint_as_float(w);
#elif TK_IN == 1
    return __uint_as_float(((w >> (16 * (j % 2))) & 0xFFFF) << 16);
#elif TK_IN == 2
    // 0x7F / 0xFF are NaN; CUDA's conversion gives the half NaN 0x7FFF (fp32 0x7FFFE000),
    // the CPU decoder a quiet NaN 0x7FC00000: NaN input data is unsupported (spec §5 item 6).
    const __half_raw h = __nv_cvt_fp8_to_halfraw((w >> (8 * (j % 4))) & 0xFF, __NV_E4M3);
    return __half2float(__half(h));
#elif TK_IN == 3
    const u32 nib = (w >> (4 * j)) & 0xF, mag = nib & 7;
    u32 bits = mag >= 2 ? (((mag >> 1) + 126) << 23) | ((mag & 1) << 22) : (mag ? 0x3F000000u : 0u);
    return __uint_as_float(bits | ((nib & 8) << 28));
#else
    // Packed E5M6 (spec/quant.md 1.3): B = sum c_i << (84 - 12 i) in words W0 = B[95:64],
    // W1 = B[63:32], W2 = B[31:0]; a code is the binary16 pattern code << 4.
    (void)w;
    const u32 w0 = raw.w[0], w1 = raw.w[1], w2 = raw.w[2];
    const u32 codes[8] = {w0 >> 20, (w0 >> 8) & 0xFFF, ((w0 & 0xFF) << 4) | (w1 >> 28), (w1 >> 16) & 0xFFF,
                          (w1 >> 4) & 0xFFF, ((w1 & 0xF) << 8) | (w2 >> 24), (w2 >> 12) & 0xFFF, w2 & 0xFFF};
    return __half2float(__ushort_as_half((unsigned short)(codes[j] << 4)));
#endif
}

