// normalize_weight (spec/moe.md 4.10): den[t] = ((1e-20 + w[t,0]) + w[t,1]) + ... in slot
// order, out[t, k] = w[t, k] / den[t] (IEEE division). One thread per token (16-byte row
// accesses when K % 4 == 0 and the rows are aligned), or TK_LANES adjacent lanes per token.
//
// Defines: TK_K (slots per token), TK_LANES (lanes per token: 1, or a power of two <= 32 with
// K % (4 * TK_LANES) == 0, used only with 16-byte aligned rows; the host chooses).
#include "tk/moe.cuh"

#ifndef TK_K
#error "TK_K must be defined"
#endif
#ifndef TK_LANES
#error "TK_LANES must be defined"
#endif

using namespace tkm;

constexpr int KV = TK_K % 4 == 0 ? TK_K / 4 : 0;  // 16-byte vectors per row (0: none)
constexpr int L = TK_LANES;
static_assert(L == 1 || (L <= 32 && (L & (L - 1)) == 0 && KV % L == 0 && KV > 0), "TK_LANES: see above");
constexpr int KVL = L > 1 ? KV / L : 0;  // 16-byte vectors per lane (L > 1)

// L > 1: lane h (of L adjacent lanes) of the group of token t holds the slots
// [4 * KVL * h, 4 * KVL * (h + 1)) of w's row t. The denominator keeps the slot order: the
// group's running sum starts at 1e-20 in every lane; for s = 0, 1, .., lane s adds its slots in
// order and the sum is broadcast from lane s (a shuffle), so lane s + 1 continues from it and
// every lane ends with the sequential sum (the same additions as one thread doing them all).
// A warp's 32 / L tokens are read and written as whole contiguous rows (16-byte accesses of
// adjacent lanes at adjacent addresses), and T * L threads spread the rows over more CTAs.
__device__ __forceinline__ void normalize_lanes(float* __restrict__ den, float* __restrict__ out,
                                                const float* __restrict__ w, u64 ld, u64 T) {
    const u32 lane = threadIdx.x % 32, h = lane % L, first = lane - h;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    // g0: the warp's first thread; every lane of the warp runs the same iterations (shuffles).
    for (u64 g0 = (u64)blockIdx.x * blockDim.x + (threadIdx.x - lane); g0 < T * L; g0 += stride) {
        const u64 t = (g0 + lane) / L;
        const bool live = t < T;
        float v[4 * (KVL > 0 ? KVL : 1)];  // (4 * KVL,) this lane's slots of token t
#pragma unroll
        for (int j = 0; j < KVL; ++j) {
            float4 q = make_float4(0.f, 0.f, 0.f, 0.f);
            if (live) q = __ldg(reinterpret_cast<const float4*>(w + t * ld) + h * KVL + j);
            v[4 * j] = q.x;
            v[4 * j + 1] = q.y;
            v[4 * j + 2] = q.z;
            v[4 * j + 3] = q.w;
        }
        float d = 1e-20f;
#pragma unroll
        for (u32 s = 0; s < (u32)L; ++s) {
            if (h == s) {
#pragma unroll
                for (int k = 0; k < 4 * KVL; ++k) d = __fadd_rn(d, v[k]);
            }
            d = __shfl_sync(0xffffffffu, d, first + s);
        }
        if (!live) continue;
        if (h == 0) den[t] = d;
#pragma unroll
        for (int j = 0; j < KVL; ++j)
            reinterpret_cast<float4*>(out + t * TK_K)[h * KVL + j] =
                make_float4(__fdiv_rn(v[4 * j], d), __fdiv_rn(v[4 * j + 1], d), __fdiv_rn(v[4 * j + 2], d),
                            __fdiv_rn(v[4 * j + 3], d));
    }
}

// den: (T,) fp32; out: (T, K) fp32 contiguous; w: (T, K) fp32 row stride ld. vec: w's rows and
// out are 16-byte aligned (the host checks; only used when K % 4 == 0): each row is read and
// written with K / 4 16-byte accesses (L > 1: always, and by L lanes).
extern "C" __global__ void __launch_bounds__(256) tk_normalize_weight(float* __restrict__ den, float* __restrict__ out,
                                                                      const float* __restrict__ w, u64 ld, u64 T,
                                                                      u32 vec) {
    if (L > 1) {
        normalize_lanes(den, out, w, ld, T);
        return;
    }
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
