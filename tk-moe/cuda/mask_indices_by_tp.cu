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

// A legal id v (0 <= v < n) kept by rank tp_rank, renumbered, or -1; in U arithmetic (u32
// when every value and r * tp fit: 32-bit divisions are several times cheaper than 64-bit).
// A kept v has v div r >= tp_rank, so v - tp_rank * r and the result are never negative.
template <typename U>
__device__ __forceinline__ i64 keep(U v, U r, U tp, U tp_rank) {
    if ((v / r) % tp != tp_rank) return -1;
    const U per_dp = r * tp;
    v -= tp_rank * r;
    return (i64)(v - (v / per_dp) * (per_dp - r));
}

// out: (T, K) contiguous; in: (T, K) row stride ld. r = n / num_ep_ranks experts per EP rank;
// narrow: n and r * tp fit in u32 (the host checks).
extern "C" __global__ void __launch_bounds__(256) tk_mask_indices_by_tp(idx_t* __restrict__ out, const idx_t* __restrict__ in,
                                                                        u64 ld, u64 T, i64 n, i64 r, i64 tp,
                                                                        i64 tp_rank, u32 narrow) {
    const u64 total = T * TK_K;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const i64 v = legal_or_minus_one(__ldg(in + (i / TK_K) * ld + i % TK_K), n);
        out[i] = (idx_t)(v < 0      ? -1
                         : narrow ? keep<u32>((u32)v, (u32)r, (u32)tp, (u32)tp_rank)
                                  : keep<u64>((u64)v, (u64)r, (u64)tp, (u64)tp_rank));
    }
}
