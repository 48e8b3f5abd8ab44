// aux_fi (spec/moe.md 4.6): f[e] = fp32(c_e * E) / fp32(T * num_aux_topk), c_e the exact count
// of entries equal to e (illegal entries skipped); all zeros when T == 0.
//
// Defines: TK_E (experts).
// One launch over the whole GPU (moe.cuh grid_histogram: exact integer counts in the per-stream
// workspace, no memset), then the formula once per expert, on its exact total (in the last CTA
// to reach the bin for E <= 256, else in the last CTA): one u64 -> fp32
// conversion (RNE) and one IEEE division by `den`, the host's fp32(T * num_aux_topk). Run to
// run and for any grid, the bits are the same.
#include "tk/moe.cuh"

#ifndef TK_E
#error "TK_E must be defined"
#endif

using namespace tkm;

// f: (E,) fp32; ws: zeroed workspace (moe.cuh grid_histogram; left zeroed); idx: (T, K) i64 row stride ld
// (flat: one contiguous 16-byte aligned run).
extern "C" __global__ void __launch_bounds__(COUNT_THREADS)
    tk_aux_fi(float* __restrict__ f, u32* __restrict__ ws, const i64* __restrict__ idx, u64 ld, u64 T, u32 K,
              u32 flat, float den) {
    grid_histogram<TK_E>(ws, idx, ld, K, T * K, flat != 0, [&](u32 e, u32 c) {
        f[e] = T == 0 ? 0.0f : __fdiv_rn(__ull2float_rn((u64)c * (u64)TK_E), den);
    });
}
