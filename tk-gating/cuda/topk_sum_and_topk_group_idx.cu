// topk_sum_and_topk_group_idx: per token, score each of G groups of P experts by its best value
// (NSUM = 1) or the fp32 sum of its two best values as a multiset (NSUM = 2), and output the GK
// best groups, best first (higher score first, then the smaller group; NaN first).
//
// Defines:
//   TK_G, TK_P    groups and experts per group (G <= 1024: the group keys sit in registers)
//   TK_NSUM       1 or 2 (<= P)
//   TK_GK         groups returned (1 <= GK <= G)
//   TK_STAGE      1: the token's G*P scores are first copied to shared memory with coalesced
//                 loads; 0 (long rows): each lane scans its groups in global memory
//   TK_WARPS      warps per block
//
// One warp per token; the lanes score the groups (G <= 32: 32/G lanes per group, each scanning
// part of it, merged with shuffles; G > 32: lane l scores groups l, l + 32, ...; gating.cuh),
// then GK warp selection rounds over the group keys; lane r % 32 keeps pick r, stored as int64.
#include "gating.cuh"

#if !defined(TK_G) || !defined(TK_P) || !defined(TK_NSUM) || !defined(TK_GK) || !defined(TK_STAGE) || !defined(TK_WARPS)
#error "TK_G, TK_P, TK_NSUM, TK_GK, TK_STAGE and TK_WARPS must be defined"
#endif

using namespace tkg;

constexpr u32 G = TK_G, P = TK_P, GK = TK_GK;
constexpr int NG = (TK_G + 31) / 32;  // group slots per lane

// out: (T, GK) int64 contiguous; scores: (T, G, P) fp32 with strides (s0, s1, 1).
extern "C" __global__ void __launch_bounds__(TK_WARPS * 32)
    tk_topk_sum_and_topk_group_idx(i64* __restrict__ out, const float* __restrict__ scores, u64 s0,
                                   u64 s1, u32 T) {
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#if TK_STAGE
    __shared__ float stage[TK_WARPS][G * P];  // per warp: (G, P), one token
#endif
    const u64 warps = (u64)gridDim.x * TK_WARPS;
    for (u64 t = (u64)blockIdx.x * TK_WARPS + warp; t < T; t += warps) {
        const float* x = scores + t * s0;  // (G, P), strides (s1, 1)
#if TK_STAGE
        __syncwarp();  // the previous token's scans are done
        for (u32 f = lane; f < G * P; f += 32) {
            const u32 q = f / P;
            stage[warp][f] = __ldg(x + q * s1 + (f - q * P));
        }
        __syncwarp();
        const float* base = stage[warp];  // (G, P), strides (P, 1)
        const u64 gs = P;
#else
        const float* base = x;  // (G, P), strides (s1, 1)
        const u64 gs = s1;
#endif
        u32 key[NG];  // group keys; group q at element index q * lanes_per_group
        group_keys<TK_NSUM, G, P, NG>(key, base, gs, lane);
        i64* o = out + t * GK;  // (GK,)
        u32 mine = 0;
        WarpSelect<1, NG> sel(key, lane);
        for (u32 r = 0; r < GK; ++r) {
            const Pick p = sel.take();
            if (lane == r % 32) mine = p.idx / lanes_per_group(G, P);
            if (r % 32 == 31 || r + 1 == GK) {
                const u32 b = r - r % 32;
                if (b + lane <= r) o[b + lane] = (i64)mine;
            }
        }
    }
}
