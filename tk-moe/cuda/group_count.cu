// group_count (spec/moe.md 4.7): counts[g] = number of entries of group_idx (T, K) equal to g;
// entries that are not legal (-1 or out of range) are skipped.
//
// Defines: TK_G (bins).
// One launch over the whole GPU (moe.cuh grid_histogram: exact integer counts in the per-stream
// workspace, no memset); for G <= 256 the last CTA to reach a bin writes it (per-bin arrival),
// else the last CTA writes every bin; zeros included.
#include "tk/moe.cuh"

#ifndef TK_G
#error "TK_G must be defined"
#endif

using namespace tkm;

// counts: (G,) i32; ws: zeroed workspace (moe.cuh grid_histogram; left zeroed); idx: (T, K) i64 row
// stride ld (flat: one contiguous 16-byte aligned run).
extern "C" __global__ void __launch_bounds__(COUNT_THREADS)
    tk_group_count(i32* __restrict__ counts, u32* __restrict__ ws, const i64* __restrict__ idx, u64 ld, u64 T,
                   u32 K, u32 flat) {
    grid_histogram<TK_G>(ws, idx, ld, K, T * K, flat != 0, [&](u32 g, u32 c) { counts[g] = (i32)c; });
}
