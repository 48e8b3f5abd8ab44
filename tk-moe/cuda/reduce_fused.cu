// reduce_fused (spec/moe.md 4.14): out[t, h] = convert(sf * sum_k fma order of x[p_k, h] * s_k),
// s_k = w[t, k] (or 1) times x_sf[p_k] (when given), accumulated in fp32 from +0.0 in slot order
// with one fused multiply-add per slot; slots whose position is not legal are skipped.
//
// Defines: TK_IN (0 fp32, 1 bf16, 2 fp16), TK_E4M3 (1: e4m3fn output, saturating; 0: output in
// the input dtype), TK_W (columns per lane access: 16 bytes of input, or 1), TK_K (slots),
// TK_WEIGHTS, TK_XSF, TK_SF (0/1: whether topk_weights, x_sf, sf are given).
//
// One warp per token: lane j of slot group g first computes (p, s) of slot 32g + j; then the
// warp sweeps the columns TK_W at a time, each lane loading the K rows' vectors (batches of up
// to 16 predicated loads in flight), accumulating, converting and storing its TK_W outputs. The arithmetic uses explicit
// __fmaf_rn / __fmul_rn so that no contraction or reassociation can change the bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include "tk/moe.cuh"

#if !defined(TK_IN) || !defined(TK_E4M3) || !defined(TK_W) || !defined(TK_K) || !defined(TK_WEIGHTS) || \
    !defined(TK_XSF) || !defined(TK_SF)
#error "TK_IN, TK_E4M3, TK_W, TK_K, TK_WEIGHTS, TK_XSF and TK_SF must be defined"
#endif

using namespace tkm;

#if TK_IN == 0
typedef float in_t;
__device__ __forceinline__ float to_f32(in_t v) { return v; }
#elif TK_IN == 1
typedef __nv_bfloat16 in_t;
__device__ __forceinline__ float to_f32(in_t v) { return __bfloat162float(v); }
#else
typedef __half in_t;
__device__ __forceinline__ float to_f32(in_t v) { return __half2float(v); }
#endif

#if TK_E4M3
typedef tk::u8 out_t;
__device__ __forceinline__ out_t from_f32(float v) { return (out_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); }
#elif TK_IN == 0
typedef float out_t;
__device__ __forceinline__ out_t from_f32(float v) { return v; }
#elif TK_IN == 1
typedef __nv_bfloat16 out_t;
__device__ __forceinline__ out_t from_f32(float v) { return __float2bfloat16_rn(v); }
#else
typedef __half out_t;
__device__ __forceinline__ out_t from_f32(float v) { return __float2half_rn(v); }
#endif

typedef tk::uint_of_size<TK_W * sizeof(in_t)>::type in_vec_t;    // TK_W inputs
typedef tk::uint_of_size<TK_W * sizeof(out_t)>::type out_vec_t;  // TK_W outputs
constexpr int WARPS = 8;
constexpr int KG = (TK_K + 31) / 32;
constexpr int SB = TK_K < 16 ? TK_K : 16;  // slots per load batch

union InVec {
    in_vec_t raw;
    in_t e[TK_W];
};
union OutVec {
    out_vec_t raw;
    out_t e[TK_W];
};

// out: (T, n) output vectors, contiguous; x: (M, n) input vectors, row stride ldx (vectors);
// x_sf: (M,) fp32 stride ld_xsf; w: (T, K) fp32 row stride ld_w; ttp: (T, K) i32 row stride
// ld_ttp; sf: (1,) fp32. n = H / TK_W.
extern "C" __global__ void __launch_bounds__(256) tk_reduce_fused(out_vec_t* __restrict__ out, const in_vec_t* __restrict__ x,
                                                                  u64 ldx, const float* __restrict__ x_sf, u64 ld_xsf,
                                                                  const float* __restrict__ w, u64 ld_w,
                                                                  const i32* __restrict__ ttp, u64 ld_ttp,
                                                                  const float* __restrict__ sf, u64 T, u64 M, u64 n) {
    const u32 lane = threadIdx.x % 32;
    for (u64 t = (u64)blockIdx.x * WARPS + threadIdx.x / 32; t < T; t += (u64)gridDim.x * WARPS) {
        i64 pos[KG];    // lane j of group g: the row of slot 32g + j, or -1
        float scl[KG];  // and its scalar s
#pragma unroll
        for (int g = 0; g < KG; ++g) {
            const u32 k = g * 32 + lane;
            pos[g] = k < TK_K ? legal_or_minus_one(__ldg(ttp + t * ld_ttp + k), (i64)M) : -1;
            float s = 1.0f;
#if TK_WEIGHTS
            if (pos[g] >= 0) s = __ldg(w + t * ld_w + k);
#endif
#if TK_XSF
            if (pos[g] >= 0) s = __fmul_rn(s, __ldg(x_sf + pos[g] * ld_xsf));
#endif
            scl[g] = s;
        }
#if TK_SF
        const float gsf = __ldg(sf);
#endif
        for (u64 b = 0; b < n; b += 32) {  // the whole warp iterates: shuffles need every lane
            const u64 c = b + lane;
            float acc[TK_W];
#pragma unroll
            for (int i = 0; i < TK_W; ++i) acc[i] = 0.0f;
            // Batches of SB slots: all SB loads are issued (predicated) before the FMAs, which
            // then run in slot order; a skipped slot leaves acc untouched.
#pragma unroll
            for (int k0 = 0; k0 < TK_K; k0 += SB) {
                i64 p[SB];
                float s[SB];
                in_vec_t v[SB];  // (SB,) vectors of TK_W inputs
#pragma unroll
                for (int j = 0; j < SB; ++j) {
                    const int k = k0 + j;
                    p[j] = k < TK_K ? __shfl_sync(0xffffffffu, pos[k / 32], k % 32) : -1;
                    s[j] = k < TK_K ? __shfl_sync(0xffffffffu, scl[k / 32], k % 32) : 0.0f;
                    v[j] = (p[j] >= 0 && c < n) ? __ldg(x + (u64)p[j] * ldx + c) : in_vec_t{};
                }
#pragma unroll
                for (int j = 0; j < SB; ++j) {
                    if (p[j] < 0) continue;
                    InVec u;
                    u.raw = v[j];
#pragma unroll
                    for (int i = 0; i < TK_W; ++i) acc[i] = __fmaf_rn(to_f32(u.e[i]), s[j], acc[i]);
                }
            }
            if (c >= n) continue;
            OutVec o;
#pragma unroll
            for (int i = 0; i < TK_W; ++i) {
#if TK_SF
                o.e[i] = from_f32(__fmul_rn(acc[i], gsf));
#else
                o.e[i] = from_f32(acc[i]);
#endif
            }
            out[t * n + c] = o.raw;
        }
    }
}
