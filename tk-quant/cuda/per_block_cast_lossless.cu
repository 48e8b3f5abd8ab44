// Lossless FP4 e2m1 -> FP8 e4m3 requantization in exponent space (spec/quant.md §3.4; see
// src/per_block_cast_lossless.rs for the algorithm and its data-dependent error rules).
//
// Compile-time constants (defines):
//   TK_PASS      1: one warp (or, for small blocks, one thread) per output block: E_out = max(E_in) - 6 (saturating), the scale
//                   written in the output layout, error bits 1 (an input scale is not a positive
//                   normal power of two) and 2 (an input block more than 2^11 below E_max);
//                2: FPT fragments of 8 logical elements per thread and iteration: out = enc8(dec4 * 2^(E_in - E_out)),
//                   error bit 4 (scale 0.0 over nonzero data).
//   TK_IN = 3 (e2m1), TK_IN_SF (0 fp32 / 1 packed input scales), TK_IH, TK_IW, TK_OH, TK_OW,
//   TK_SF_OUT (0 A, 1 B, 2 C), TK_VECIO (pass 2: vector loads/stores).
// Errors are OR-ed into *flag with atomicOr (only when one occurs); the host reads it later.
#include "tk/quant_io.cuh"

// Kernel arguments (mirrored by `LosslessArgs` in src/per_block_cast_lossless.rs).
struct Params {
    u64 x;               // (M, K/2) packed e2m1, row stride ldx bytes
    u64 ldx;
    u64 x_sf;            // input scales: fp32 or packed int32, strides (xsf_s0, xsf_s1)
    u64 xsf_s0, xsf_s1;
    u64 out;             // (M, K) e4m3, contiguous
    u64 sf;              // output scales (full allocation)
    u64 flag;            // (1,) u32 error bits
    u64 m, k;
    u64 in_nbm, in_nbk;  // input scale grid
    u64 nbm, nbk;        // output scale grid
    u64 rows_aligned;    // align(nbm, 4)
};

// E_in of input block (mb, kb), or 0 when the scale is not a positive normal power of two.
__device__ __forceinline__ u32 in_exponent(const Params& p, u64 mb, u64 kb) {
#if TK_IN_SF == 0
    const u32 bits = __float_as_uint(in_scale(reinterpret_cast<const void*>(p.x_sf), p.xsf_s0, p.xsf_s1, mb, kb));
    const u32 e = bits >> 23;
    return ((bits & 0x807FFFFFu) == 0 && e >= 1 && e <= 254) ? e : 0;
#else
    const u32 e = __float_as_uint(in_scale(reinterpret_cast<const void*>(p.x_sf), p.xsf_s0, p.xsf_s1, mb, kb)) >> 23;
    return e <= 254 ? e : 0;
#endif
}

// Byte offset (layout C) or element index (A, B) of output scale (mo, ko).
__device__ __forceinline__ u64 out_index(const Params& p, u64 mo, u64 ko) {
#if TK_SF_OUT == 0
    return mo * p.nbk + ko;
#elif TK_SF_OUT == 1
    return ko * p.rows_aligned + mo;
#else
    return 4 * ((ko / 4) * p.rows_aligned + mo) + ko % 4;
#endif
}

#if TK_PASS == 1
// One team of TEAM lanes per output block: a warp when the block holds at least 64 input
// blocks, else a single thread; the team strides over its RH x RW input blocks, then reduces.
constexpr u64 RH = TK_OH / TK_IH, RW = TK_OW / TK_IW;  // input blocks per output block
constexpr u32 TEAM = RH * RW >= 64 ? 32 : 1;
extern "C" __global__ void __launch_bounds__(256) tk_lossless(const Params p) {
    const u32 lane = threadIdx.x % TEAM;
    const u64 total = p.nbm * p.nbk, teams = (u64)gridDim.x * blockDim.x / TEAM;
    for (u64 i = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / TEAM; i < total; i += teams) {
        const u64 mo = i % p.nbm, ko = i / p.nbm;  // consecutive teams: consecutive block rows
        const u64 mb0 = mo * RH, kb0 = ko * RW;
        const u64 rows = min(mb0 + RH, p.in_nbm) - mb0, cols = min(kb0 + RW, p.in_nbk) - kb0;
        u32 e_max = 0, e_min = 255, bad = 0;
        for (u64 b = lane; b < rows * cols; b += TEAM) {
            const u32 e = in_exponent(p, mb0 + b / cols, kb0 + b % cols);
            bad |= e == 0;
            e_max = max(e_max, e);
            e_min = min(e_min, e);
        }
        if constexpr (TEAM == 32) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                e_max = max(e_max, __shfl_xor_sync(0xFFFFFFFFu, e_max, o));
                e_min = min(e_min, __shfl_xor_sync(0xFFFFFFFFu, e_min, o));
                bad |= __shfl_xor_sync(0xFFFFFFFFu, bad, o);
            }
        }
        if (lane != 0) continue;
        const u32 eo = e_max > 6 ? e_max - 6 : 0;
        const u32 err = (bad ? 1u : 0u) | (e_min + 5 < eo ? 2u : 0u);
        if (err) atomicOr(reinterpret_cast<u32*>(p.flag), err);
#if TK_SF_OUT == 2
        u8* s = reinterpret_cast<u8*>(p.sf);  // (ceil(nbk/4), rows_aligned) int32 as bytes
        s[out_index(p, mo, ko)] = (u8)eo;
        const u64 kend = 4 * ((p.nbk + 3) / 4);
        if (mo + 1 == p.nbm)
            for (u64 r = p.nbm; r < p.rows_aligned; ++r) s[out_index(p, r, ko)] = 0;
        if (ko + 1 == p.nbk)
            for (u64 k2 = p.nbk; k2 < kend; ++k2)
                for (u64 r = mo; r < (mo + 1 == p.nbm ? p.rows_aligned : mo + 1); ++r) s[out_index(p, r, k2)] = 0;
#else
        float* s = reinterpret_cast<float*>(p.sf);
        s[out_index(p, mo, ko)] = __uint_as_float(eo << 23);
#if TK_SF_OUT == 1
        if (mo + 1 == p.nbm)
            for (u64 r = p.nbm; r < p.rows_aligned; ++r) s[out_index(p, r, ko)] = 0.0f;
#endif
#endif
    }
}

#else
// E_out of output block (mo, ko), read back from the scales pass 1 wrote.
__device__ __forceinline__ u32 out_exponent(const Params& p, u64 mo, u64 ko) {
#if TK_SF_OUT == 2
    return reinterpret_cast<const u8*>(p.sf)[out_index(p, mo, ko)];
#else
    return __float_as_uint(reinterpret_cast<const float*>(p.sf)[out_index(p, mo, ko)]) >> 23;
#endif
}

constexpr int FPT = 4;  // fragments per thread and iteration (loads issued before any store)

extern "C" __global__ void __launch_bounds__(256) tk_lossless(const Params p) {
    const u64 frags_per_row = p.k / VEC, total = p.m * frags_per_row;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 base = (u64)blockIdx.x * blockDim.x + threadIdx.x; base < total; base += FPT * stride) {
        Raw raw[FPT];  // (FPT fragments, 8 nibbles)
#pragma unroll
        for (int i = 0; i < FPT; ++i) {
            const u64 f = base + i * stride;
            if (f < total) raw[i] = load_frag(reinterpret_cast<const void*>(p.x), p.ldx, p.k, f / frags_per_row, (f % frags_per_row) * VEC);
        }
#pragma unroll
        for (int i = 0; i < FPT; ++i) {
            const u64 f = base + i * stride;
            if (f >= total) continue;
            const u64 r = f / frags_per_row, c0 = (f % frags_per_row) * VEC;
            u8 q[VEC];  // (VEC,) e4m3 codes
            u32 lost = 0;
            // One input / output scale per fragment when the block widths are multiples of 8.
            const u32 ei0 = TK_IW % VEC == 0 ? in_exponent(p, r / TK_IH, c0 / TK_IW) : 0;
            const u32 eo0 = TK_OW % VEC == 0 ? out_exponent(p, r / TK_OH, c0 / TK_OW) : 0;
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                const u64 c = c0 + j;
                const u32 ei = TK_IW % VEC == 0 ? ei0 : in_exponent(p, r / TK_IH, c / TK_IW);
                const u32 eo = TK_OW % VEC == 0 ? eo0 : out_exponent(p, r / TK_OH, c / TK_OW);
                const int d = min(max((int)ei - (int)eo, -126), 127);
                const float v = decode_elem(raw[i], j);
                lost |= eo == 0 && v != 0.0f;
                q[j] = __nv_cvt_float_to_fp8(__fmul_rn(v, __uint_as_float((u32)(d + 127) << 23)), __NV_SATFINITE, __NV_E4M3);
            }
            if (lost) atomicOr(reinterpret_cast<u32*>(p.flag), 4u);
            u8* dst = reinterpret_cast<u8*>(p.out) + r * p.k + c0;  // (VEC,) bytes of row r
#if TK_VECIO
            *reinterpret_cast<uint2*>(dst) = make_uint2(q[0] | q[1] << 8 | q[2] << 16 | (u32)q[3] << 24,
                                                        q[4] | q[5] << 8 | q[6] << 16 | (u32)q[7] << 24);
#else
#pragma unroll
            for (int j = 0; j < VEC; ++j) dst[j] = q[j];
#endif
        }
    }
}
#endif
