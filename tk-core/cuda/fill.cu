// Zero fill with 16-byte stores: the bench's L2 flush in the form of upstream's harness, whose
// flush is `torch.zero_()` of a 256 MB int32 buffer (an elementwise kernel of 128-thread blocks,
// 16-byte vector stores, each block writing one contiguous chunk).
#include "tk/common.cuh"

constexpr int THREADS = 128;
constexpr int VECS = 4;  // 16-byte vectors per thread

// dst: (n16,) uint4 — block b zeroes vectors [b * THREADS * VECS, (b + 1) * THREADS * VECS).
extern "C" __global__ void __launch_bounds__(THREADS) tk_fill16(uint4* __restrict__ dst, tk::u64 n16) {
    const tk::u64 base = (tk::u64)blockIdx.x * THREADS * VECS + threadIdx.x;
#pragma unroll
    for (int k = 0; k < VECS; ++k) {
        const tk::u64 i = base + (tk::u64)k * THREADS;  // coalesced: a warp stores 512 B
        if (i < n16) dst[i] = make_uint4(0, 0, 0, 0);
    }
}
