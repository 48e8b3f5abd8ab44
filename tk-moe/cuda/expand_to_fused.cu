// expand_to_fused (spec/moe.md 4.12): out[p, :] = x[t, :] for every slot (t, k) with
// p = token_topk_to_pos[t, k] legal; every fused row no slot targets is zero.
//
// Defines: TK_VEC (bytes per access: 16, 8, 4, 2 or 1, dividing the row bytes, the row pitch
// and both base addresses), TK_K (slots per token).
//
// Two entries, launched in this order:
// * tk_expand_mark: src[p] = t*K + k for every legal slot (t, k) targeting row p (one thread per
//   slot; src is not initialised: see row_targeted in moe.cuh);
// * tk_expand_to_fused: one warp per "task": tasks [0, Z) (Z = ceil(M / 32)) zero the rows
//   32z .. 32z + 31 that no slot targets (moe.cuh warp_zero_untargeted; first, so that their
//   index latency overlaps the copies), tasks [Z, Z + T) copy token t = task - Z's row to all
//   its rows (the row is read once, written K times, TK_VEC-byte accesses, 8 in flight per
//   lane). A row is thus either copied or zeroed, never both, and every row of the output is
//   written.
#include "tk/moe.cuh"

#ifndef TK_VEC
#error "TK_VEC must be defined"
#endif
#ifndef TK_K
#error "TK_K must be defined"
#endif

using namespace tkm;
typedef tk::uint_of_size<TK_VEC>::type vec_t;
constexpr int WARPS = 8;                   // warps per block
constexpr int KG = (TK_K + 31) / 32;       // groups of 32 slots

// src: (M,) u32; ttp: (T, K) i32 row stride ld_ttp.
extern "C" __global__ void __launch_bounds__(256) tk_expand_mark(u32* __restrict__ src, const i32* __restrict__ ttp,
                                                                 u64 ld_ttp, u64 T, u64 M) {
    const u64 n = T * TK_K;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const i64 p = legal_or_minus_one(__ldg(ttp + (i / TK_K) * ld_ttp + i % TK_K), (i64)M);
        if (p >= 0) src[p] = (u32)i;
    }
}

// out: (M, n) vectors, contiguous; x: (T, n) vectors, row stride ldx (vectors);
// ttp: (T, K) i32 row stride ld_ttp; src: (M,) u32 from tk_expand_mark.
extern "C" __global__ void __launch_bounds__(256, 4) tk_expand_to_fused(vec_t* __restrict__ out, const vec_t* __restrict__ x,
                                                                     u64 ldx, const i32* __restrict__ ttp, u64 ld_ttp,
                                                                     const u32* __restrict__ src, u64 T, u64 M, u64 n) {
    const u32 lane = threadIdx.x % 32;
    const u64 Z = (M + 31) / 32;  // zero tasks
    for (u64 task = (u64)blockIdx.x * WARPS + threadIdx.x / 32; task < Z + T; task += (u64)gridDim.x * WARPS) {
        if (task >= Z) {
            const u64 t = task - Z;
            i64 pos[KG];  // lane j of group g: the row of slot 32g + j
#pragma unroll
            for (int g = 0; g < KG; ++g) {
                const u32 k = g * 32 + lane;
                pos[g] = k < TK_K ? legal_or_minus_one(__ldg(ttp + t * ld_ttp + k), (i64)M) : -1;
            }
            warp_scatter_row<vec_t, 8, KG>(out, x + t * ldx, n, pos, TK_K, lane);
        } else {
            warp_zero_untargeted(src, ttp, ld_ttp, T, TK_K, M, M, 32 * task, lane,
                                 [&](u64 p) { warp_zero_row(out + p * n, n, lane); });
        }
    }
}
