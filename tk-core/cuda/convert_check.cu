// Test kernel: the GPU's own conversions (CUDA's intrinsics, as the quantization kernels use
// them), so tests can compare them bit for bit with tk_core::convert on the CPU.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_fp4.h>
#include "tk/common.cuh"

using tk::u8;
using tk::u16;
using tk::u32;

// in: (n,) fp32 bit patterns; each output: (n,) codes of the same element.
extern "C" __global__ void tk_convert_check(const u32* __restrict__ in, u32 n, u8* __restrict__ e4m3,
                                            u8* __restrict__ e5m2, u8* __restrict__ e2m1,
                                            u16* __restrict__ bf16, u16* __restrict__ f16,
                                            u16* __restrict__ e5m6) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const u32 bits = in[i];
        const float v = __uint_as_float(bits);
        e4m3[i] = (u8)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
        e5m2[i] = (u8)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
        e2m1[i] = (u8)__nv_cvt_float_to_fp4(v, __NV_E2M1, cudaRoundNearest);
        bf16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
        f16[i] = __half_as_ushort(__float2half_rn(v));
        // E5M6 (spec/quant.md 1.3): round-toward-zero binary16, then the 17-low-bit adjustment.
        u16 t = __half_as_ushort(__float2half_rz(v)) >> 4;
        if ((u32)(t & 1) + (bits & 0x1FFFFu) > 0x10000u) ++t;
        e5m6[i] = t & 0xFFF;
    }
}
