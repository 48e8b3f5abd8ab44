// normalize_weight (spec/moe.md 4.10): den[t] = ((1e-20 + w[t,0]) + w[t,1]) + ... in slot
// order, out[t, k] = w[t, k] / den[t] (IEEE division). One thread per token (16-byte row
// accesses when K % 4 == 0 and the rows are aligned).
//
// Defines: TK_K (slots per token).
#include "tk/moe.cuh"

#ifndef TK_K
#error "TK_K must be defined"
#endif

using namespace tkm;

constexpr int KV = TK_K % 4 == 0 ? TK_K / 4 : 0;  // 16-byte vectors per row (0: none)

// den: (T,) fp32; out: (T, K) fp32 contiguous; w: (T, K) fp32 row stride ld. vec: w's rows and
// out are 16-byte aligned (the host checks; only used when K % 4 == 0): each row is read and
// written with K / 4 16-byte accesses.
extern "C" __global__ void __launch_bounds__(256) tk_normalize_weight(float* __restrict__ den, float* __restrict__ out,
                                                                      const float* __restrict__ w, u64 ld, u64 T,
                                                                      u32 vec) {
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < T; t += (u64)gridDim.x * blockDim.x) {
        float v[TK_K > 0 ? TK_K : 1];  // (K,) this token's weights
        if (KV > 0 && vec) {
#pragma unroll
            for (int j = 0; j < KV; ++j) {
                const float4 q = __ldg(reinterpret_cast<const float4*>(w + t * ld) + j);
                v[4 * j] = q.x;
                v[4 * j + 1] = q.y;
                v[4 * j + 2] = q.z;
                v[4 * j + 3] = q.w;
            }
        } else {
#pragma unroll
            for (int k = 0; k < TK_K; ++k) v[k] = __ldg(w + t * ld + k);
        }
        float d = 1e-20f;
#pragma unroll
        for (int k = 0; k < TK_K; ++k) d = __fadd_rn(d, v[k]);
        den[t] = d;
#pragma unroll
        for (int k = 0; k < TK_K; ++k) v[k] = __fdiv_rn(v[k], d);
        if (KV > 0 && vec) {
#pragma unroll
            for (int j = 0; j < KV; ++j)
                reinterpret_cast<float4*>(out + t * TK_K)[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
        } else {
#pragma unroll
            for (int k = 0; k < TK_K; ++k) out[t * TK_K + k] = v[k];
        }
    }
}
