// CUDA's expf as the SwiGLU kernels evaluate it (non-fast-math, no flush to zero), element by
// element: out[i] = expf(x[i]) for i < n. The SwiGLU tests feed these values to the CPU
// references (which are parameterised by expf) to check every SwiGLU output bit for bit.
#include "tk/common.cuh"

extern "C" __global__ void __launch_bounds__(256) tk_swiglu_expf(const float* __restrict__ x, float* __restrict__ out, tk::u64 n) {
    for (tk::u64 i = (tk::u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (tk::u64)gridDim.x * blockDim.x)
        out[i] = expf(x[i]);  // (n,) fp32
}
