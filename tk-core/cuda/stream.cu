// Streaming probe: the bandwidth of a pure data stream with a given read : write byte ratio, the
// ceiling of ops that read and write unequal amounts (casts narrow 2:1 .. 8:1, casts back widen
// 1:2 .. 1:8). Each item reads TK_R 16-byte vectors and writes TK_W; every output vector depends
// on all of the item's input vectors, so the stores wait for the loads as in a real op.
//
// Defines: TK_R, TK_W (1, 2, 4 or 8) vectors read / written per item; TK_CS 1: streaming stores
// (st.global.cs, evict-first), 0: plain stores.
#include "tk/common.cuh"

#if !defined(TK_R) || !defined(TK_W) || !defined(TK_CS)
#error "TK_R, TK_W and TK_CS must be defined"
#endif

using tk::u32;
using tk::u64;

constexpr int U = TK_R >= 4 ? 1 : 4 / TK_R;  // items per thread and iteration (>= 4 loads in flight)

__device__ __forceinline__ void store16(uint4* p, uint4 v) {
#if TK_CS
    __stcs(p, v);
#else
    *p = v;
#endif
}

// dst: (TK_W, items) uint4; src: (TK_R, items) uint4 — vector k of item i at k * items + i, so
// every load and store instruction of a warp covers 512 contiguous bytes. Grid-stride loop.
extern "C" __global__ void __launch_bounds__(256) tk_stream(uint4* __restrict__ dst,
                                                            const uint4* __restrict__ src, u64 items) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i0 = (u64)blockIdx.x * blockDim.x + threadIdx.x; i0 < items; i0 += U * stride) {
        uint4 a[U][TK_R];  // (items, vectors) this iteration's input
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int k = 0; k < TK_R; ++k)
                if (i0 + u * stride < items) a[u][k] = src[k * items + i0 + u * stride];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u64 i = i0 + u * stride;
            if (i >= items) break;
            uint4 x = a[u][0];  // every input vector folded in
#pragma unroll
            for (int k = 1; k < TK_R; ++k) {
                x.x ^= a[u][k].x; x.y ^= a[u][k].y; x.z ^= a[u][k].z; x.w ^= a[u][k].w;
            }
#pragma unroll
            for (int k = 0; k < TK_W; ++k) store16(dst + k * items + i, make_uint4(x.x + k, x.y, x.z, x.w));
        }
    }
}
