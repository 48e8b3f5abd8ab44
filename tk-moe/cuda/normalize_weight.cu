// normalize_weight (spec/moe.md 4.10): den[t] = ((1e-20 + w[t,0]) + w[t,1]) + ... in slot
// order, out[t, k] = w[t, k] / den[t] (IEEE division). One thread per token.
//
// Defines: TK_K (slots per token).
#include "tk/moe.cuh"

#ifndef TK_K
#error "TK_K must be defined"
#endif

using namespace tkm;

// den: (T,) fp32; out: (T, K) fp32 contiguous; w: (T, K) fp32 row stride ld.
extern "C" __global__ void __launch_bounds__(256) tk_normalize_weight(float* __restrict__ den, float* __restrict__ out,
                                                                      const float* __restrict__ w, u64 ld, u64 T) {
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < T; t += (u64)gridDim.x * blockDim.x) {
        float v[TK_K > 0 ? TK_K : 1];  // (K,) this token's weights
        float d = 1e-20f;
#pragma unroll
        for (int k = 0; k < TK_K; ++k) {
            v[k] = __ldg(w + t * ld + k);
            d = __fadd_rn(d, v[k]);
        }
        den[t] = d;
#pragma unroll
        for (int k = 0; k < TK_K; ++k) out[t * TK_K + k] = __fdiv_rn(v[k], d);
    }
}
