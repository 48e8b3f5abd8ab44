// mask_indices_by_tp (spec/moe.md 4.8): keep the ids of one TP rank, renumbered; every other
// entry, and every illegal one (negative, or >= n), becomes -1. Element-wise, one thread per
// entry (grid-stride).
//
// Defines: TK_I64 (1: int64 indices, 0: int32), TK_K (slots per row).
#include "tk/moe.cuh"

#if !defined(TK_I64) || !defined(TK_K)
#error "TK_I64 and TK_K must be defined"
#endif

using namespace tkm;
#if TK_I64
typedef i64 idx_t;
#else
typedef i32 idx_t;
#endif

// out: (T, K) contiguous; in: (T, K) row stride ld. r = n / num_ep_ranks experts per EP rank.
extern "C" __global__ void __launch_bounds__(256) tk_mask_indices_by_tp(idx_t* __restrict__ out, const idx_t* __restrict__ in,
                                                                        u64 ld, u64 T, i64 n, i64 r, i64 tp,
                                                                        i64 tp_rank) {
    const u64 total = T * TK_K;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        i64 v = legal_or_minus_one(__ldg(in + (i / TK_K) * ld + i % TK_K), n);
        if (v >= 0 && (v / r) % tp == tp_rank) {
            const i64 per_dp = r * tp;
            v -= tp_rank * r;
            v -= (v / per_dp) * (per_dp - r);
            if (v < 0) v = -1;
        } else {
            v = -1;
        }
        out[i] = (idx_t)v;
    }
}
