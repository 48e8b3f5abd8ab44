// tk-moe: device helpers shared by the routing kernels (include as "tk/moe.cuh").
#pragma once
#include "tk/common.cuh"

namespace tkm {

using tk::i32;
using tk::i64;
using tk::u32;
using tk::u64;
using tk::u8;

// The GPU reading of the index contract (tk_moe::index): `v` when 0 <= v < upper, else -1.
// Every kernel reads its index inputs through this, so no illegal entry is ever dereferenced.
template <typename I>
__device__ __forceinline__ i64 legal_or_minus_one(I v, i64 upper) {
    const i64 w = (i64)v;
    return (w >= 0 && w < upper) ? w : -1;
}

// Counts the legal entries of idx (T, K) row stride `ld` (elements) with flat index in
// [begin, end) (step `step`) into the counters `hist` (`bins` of them, zeroed by the caller;
// shared or global memory). Warp-aggregated atomics: the lanes holding the same id add their
// number once (ids are few, so plain atomics would serialise on the same address). Integer
// counts: exact and independent of the order.
__device__ __forceinline__ void count_into(u32* hist, const i64* __restrict__ idx, u64 ld, u32 K,
                                           u64 begin, u64 end, u64 step, i64 bins) {
    const u32 lane = threadIdx.x % 32;
    for (u64 i = begin; i < end; i += step) {
        const u64 t = i / K, k = i % K;
        const i64 v = legal_or_minus_one(__ldg(idx + t * ld + k), bins);
        const u32 peers = __match_any_sync(__activemask(), (unsigned long long)v);
        if (v >= 0 && lane == (u32)(__ffs(peers) - 1)) atomicAdd(hist + v, (u32)__popc(peers));
    }
}

// Grid-wide histogram of the legal entries of idx (T, K) (row stride ld) into the global
// counters `counts` (`bins` of them, zeroed by the host): each block counts a grid-stride share
// of the flat indices into `hist` (shared memory when SMEM, then one global atomic per non-zero
// bin; global atomics directly otherwise). Integer atomics: exact and order-independent.
template <bool SMEM>
__device__ __forceinline__ void histogram(u32* __restrict__ counts, u32* hist, const i64* __restrict__ idx, u64 ld,
                                          u64 T, u32 K, i64 bins) {
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x, step = (u64)gridDim.x * blockDim.x;
    if (SMEM) {
        for (i64 e = threadIdx.x; e < bins; e += blockDim.x) hist[e] = 0;
        __syncthreads();
        count_into(hist, idx, ld, K, first, T * K, step, bins);
        __syncthreads();
        for (i64 e = threadIdx.x; e < bins; e += blockDim.x)
            if (hist[e]) atomicAdd(counts + e, hist[e]);
    } else {
        count_into(counts, idx, ld, K, first, T * K, step, bins);
    }
}

// expand_to_fused(_with_sf): true when fused row p is targeted by a legal slot. src[p] is written
// by tk_expand_mark (the flat slot i = t*K + k of one slot targeting p) for every targeted row
// and left uninitialised otherwise; it must name a slot i < T*K whose position is p. A stale
// value can only pass by naming a slot that does target p, so the answer is exact without
// zero-initialising src.
__device__ __forceinline__ bool row_targeted(const u32* __restrict__ src, const i32* __restrict__ ttp, u64 ld_ttp,
                                             u64 T, u32 K, u64 M, u64 p) {
    const u64 i = src[p];
    if (i >= T * K) return false;
    return legal_or_minus_one(__ldg(ttp + (i / K) * ld_ttp + i % K), (i64)M) == (i64)p;
}

// One warp copies a row of `n` vectors `src` to the rows `pos` (one per slot, -1 = none) of
// `out` (rows of `n` vectors), UNROLL vectors per lane in flight. `pos_lane` holds, in lane j,
// the row of slot k0 + j for each group of 32 slots (KG groups).
template <typename V, int UNROLL, int KG>
__device__ __forceinline__ void warp_scatter_row(V* __restrict__ out, const V* __restrict__ src, u64 n,
                                                 const i64 (&pos_lane)[KG], u32 K, u32 lane) {
    for (u64 b = 0; b < n; b += 32 * UNROLL) {  // the whole warp iterates: shuffles need every lane
        const u64 c0 = b + lane;
        V v[UNROLL];  // (UNROLL,) vectors of the source row
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (c0 + u * 32 < n) v[u] = __ldg(src + c0 + u * 32);
#pragma unroll
        for (int g = 0; g < KG; ++g) {
            const u32 kn = min(32u, K - g * 32);
            for (u32 j = 0; j < kn; ++j) {
                const i64 p = __shfl_sync(0xffffffffu, pos_lane[g], j);
                if (p < 0) continue;
                V* dst = out + (u64)p * n;  // (n,) vectors
#pragma unroll
                for (int u = 0; u < UNROLL; ++u)
                    if (c0 + u * 32 < n) dst[c0 + u * 32] = v[u];
            }
        }
    }
}

// One warp writes zeros to a row of `n` vectors.
template <typename V>
__device__ __forceinline__ void warp_zero_row(V* __restrict__ row, u64 n, u32 lane) {
    const V z{};
    for (u64 c = lane; c < n; c += 32) row[c] = z;
}

}  // namespace tkm
