// aux_fi (spec/moe.md 4.6): f[e] = fp32(c_e * E) / fp32(T * num_aux_topk), c_e the exact count
// of entries equal to e (illegal entries skipped); all zeros when T == 0.
//
// Defines: TK_E (experts), TK_SMEM (1: block histograms in shared memory, TK_E <= 8192).
// Deterministic: exact integer counts first (as group_count.cu, into the zeroed scratch
// `counts`), then the last block to finish (a ticket counter, also zeroed by the host) applies
// the formula once per expert: one u64 -> fp32 conversion (RNE) and one IEEE division by `den`,
// the host's fp32(T * num_aux_topk). Run to run and for any grid, the bits are the same.
#include "tk/moe.cuh"

#if !defined(TK_E) || !defined(TK_SMEM)
#error "TK_E and TK_SMEM must be defined"
#endif

using namespace tkm;

// f: (E,) fp32; counts: (E + 1,) u32 scratch, zero on entry (the last one is the ticket);
// idx: (T, K) i64 row stride ld.
extern "C" __global__ void __launch_bounds__(256) tk_aux_fi(float* __restrict__ f, u32* __restrict__ counts,
                                                            const i64* __restrict__ idx, u64 ld, u64 T, u32 K,
                                                            float den) {
#if TK_SMEM
    __shared__ u32 hist[TK_E];  // (E,) this block's counts
#else
    u32* hist = nullptr;
#endif
    __shared__ bool last;
    histogram<TK_SMEM>(counts, hist, idx, ld, T, K, TK_E);
    __threadfence();  // this block's counts are visible before its ticket
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counts + TK_E, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (u32 e = threadIdx.x; e < TK_E; e += blockDim.x) {
        const u32 c = atomicAdd(counts + e, 0u);  // a coherent read of the final count
        f[e] = T == 0 ? 0.0f : __fdiv_rn(__ull2float_rn((u64)c * (u64)TK_E), den);
    }
}
