// Device-to-device copy with 16-byte accesses: the bandwidth ceiling every bench reports against.
#include "tk/common.cuh"

// dst, src: (n16,) uint4 — grid-stride loop, 4 independent 16-byte loads in flight per thread.
extern "C" __global__ void __launch_bounds__(256) tk_copy16(uint4* __restrict__ dst,
                                                            const uint4* __restrict__ src,
                                                            tk::u64 n16) {
    const tk::u64 stride = (tk::u64)gridDim.x * blockDim.x;
    tk::u64 i = (tk::u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
        dst[i] = a;
        dst[i + stride] = b;
        dst[i + 2 * stride] = c;
        dst[i + 3 * stride] = d;
    }
    for (; i < n16; i += stride) dst[i] = src[i];
}
