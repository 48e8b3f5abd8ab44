// inplace_unique_group_indices (spec/moe.md 4.9): per row, a legal id that already appeared in
// an earlier slot becomes -1 (the leftmost occurrence stays); illegal entries (negative other
// than -1, or >= G) are written as -1. One thread per row, two 64-bit seen-masks (G <= 128).
//
// Defines: TK_K (slots per row), TK_G (groups, <= 128).
#include "tk/moe.cuh"

#if !defined(TK_K) || !defined(TK_G)
#error "TK_K and TK_G must be defined"
#endif

using namespace tkm;

// idx: (T, K) i64 row stride ld, modified in place.
extern "C" __global__ void __launch_bounds__(256) tk_inplace_unique_group_indices(i64* __restrict__ idx, u64 ld, u64 T) {
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < T; t += (u64)gridDim.x * blockDim.x) {
        u64 seen[2] = {0, 0};  // bit v of word v / 64: id v seen in an earlier slot
        i64* row = idx + t * ld;  // (K,)
#pragma unroll
        for (int k = 0; k < TK_K; ++k) {
            const i64 raw = row[k];
            const i64 v = legal_or_minus_one(raw, TK_G);
            if (v < 0) {
                if (raw != -1) row[k] = -1;
                continue;
            }
            const u64 bit = 1ull << (v % 64);
            if (seen[v / 64] & bit) row[k] = -1;
            seen[v / 64] |= bit;
        }
    }
}
