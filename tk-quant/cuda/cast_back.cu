// Cast back (spec/quant.md §2.2, §3.8): out[r, c] = convert(fl(dec(x[r, c]) * S[r/BM, c/BK]))
// for e4m3 or packed e2m1 data, convert = identity (fp32) or round-to-nearest-even (bf16).
//
// Compile-time constants (defines):
//   TK_IN        2 e4m3, 3 packed e2m1
//   TK_IN_SF     0 fp32 scales with any strides, 1 packed UE8M0 int32
//   TK_BM, TK_BK the scale block (any sizes >= 1)
//   TK_OUT       0 fp32, 1 bf16
//   TK_VECIO     1: vector accesses (aligned rows); 0: element accesses
//
// A thread handles fragments of 8 logical elements of a row (K % 64 == 0, so fragments never
// straddle the row end), FPT of them per iteration of a grid-stride loop over the M * K / 8
// fragments; consecutive threads on consecutive fragments of a row. One scale per fragment when BK % 8 == 0.
#include "tk/quant_io.cuh"

#if TK_IN < 2
#error "cast back reads quantized data (TK_IN 2 or 3)"
#endif

// Kernel arguments (mirrored by `CastBackArgs` in src/cast_back.rs).
struct Params {
    u64 x;               // (M, K) e4m3 or (M, K/2) e2m1, row stride ldx (storage elements)
    u64 ldx;
    u64 x_sf;            // scales: fp32 or packed int32
    u64 xsf_s0, xsf_s1;  // their element strides
    u64 out;             // (M, K) fp32 / bf16, contiguous
    u64 m, k;
};

constexpr int FPT = 2;  // fragments per thread and iteration (loads issued before any store)

extern "C" __global__ void __launch_bounds__(256) tk_cast_back(const Params p) {
    const u64 frags_per_row = p.k / VEC, total = p.m * frags_per_row;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const void* sf = reinterpret_cast<const void*>(p.x_sf);
    for (u64 base = (u64)blockIdx.x * blockDim.x + threadIdx.x; base < total; base += FPT * stride) {
        Raw raw[FPT];  // (FPT fragments, VEC elements)
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
            float v[VEC];  // (VEC,) dequantized values
            if constexpr (TK_BK % VEC == 0) {
                const float s = in_scale(sf, p.xsf_s0, p.xsf_s1, r / TK_BM, c0 / TK_BK);
#pragma unroll
                for (int j = 0; j < VEC; ++j) v[j] = __fmul_rn(decode_elem(raw[i], j), s);
            } else {
#pragma unroll
                for (int j = 0; j < VEC; ++j) v[j] = __fmul_rn(decode_elem(raw[i], j), in_scale(sf, p.xsf_s0, p.xsf_s1, r / TK_BM, (c0 + j) / TK_BK));
            }
#if !TK_VECIO
            for (int j = 0; j < VEC; ++j) {
#if TK_OUT == 0
                reinterpret_cast<float*>(p.out)[r * p.k + c0 + j] = v[j];  // (M, K) fp32
#else
                reinterpret_cast<__nv_bfloat16*>(p.out)[r * p.k + c0 + j] = __float2bfloat16_rn(v[j]);  // (M, K) bf16
#endif
            }
#elif TK_OUT == 0
            float4* dst = reinterpret_cast<float4*>(reinterpret_cast<float*>(p.out) + r * p.k + c0);  // (2,) x 4 fp32
            dst[0] = make_float4(v[0], v[1], v[2], v[3]);
            dst[1] = make_float4(v[4], v[5], v[6], v[7]);
#else
            u32 w[VEC / 2];  // (VEC/2,) bf16 pairs, even column in the low half
#pragma unroll
            for (int j = 0; j < VEC / 2; ++j) {
                const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
                w[j] = *reinterpret_cast<const u32*>(&b);
            }
            *reinterpret_cast<uint4*>(reinterpret_cast<u16*>(p.out) + r * p.k + c0) = make_uint4(w[0], w[1], w[2], w[3]);
#endif
        }
    }
}
