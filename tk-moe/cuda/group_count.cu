// group_count (spec/moe.md 4.7): counts[g] = number of entries of group_idx (T, K) equal to g;
// entries that are not legal (-1 or out of range) are skipped.
//
// Defines: TK_G (bins), TK_SMEM (1: block histograms in shared memory, for TK_G <= 8192).
// The host zeroes `counts` first; blocks of 256 threads, grid-stride over the flat indices.
#include "tk/moe.cuh"

#if !defined(TK_G) || !defined(TK_SMEM)
#error "TK_G and TK_SMEM must be defined"
#endif

using namespace tkm;

// counts: (G,) i32 (as u32), zero on entry; idx: (T, K) i64 row stride ld.
extern "C" __global__ void __launch_bounds__(256) tk_group_count(u32* __restrict__ counts, const i64* __restrict__ idx,
                                                                 u64 ld, u64 T, u32 K) {
#if TK_SMEM
    __shared__ u32 hist[TK_G];  // (G,) this block's counts
#else
    u32* hist = nullptr;
#endif
    histogram<TK_SMEM>(counts, hist, idx, ld, T, K, TK_G);
}
