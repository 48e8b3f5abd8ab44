// SwiGLU forward rounded to bf16, then a per-channel e4m3 cast, the data transposed or not
// (spec/quant.md §3.12). For r < M, j < H (x is bf16 (M, 2H)):
//   l = x[r, j], v = x[r, H + j], clamped in fp32 (has_clamp: l <= C, v in [-C, C])
//   A[r, j] = bf16(fl(fl(l / fl(1 + expf(-l))) * v))
// then the per-channel cast of A (tk/per_channel.cuh; defines TK_NPT, TK_ROUND, TK_VECIO,
// TK_TRANSPOSE).
#include "tk/per_channel.cuh"

struct SwigluSrc : pc::RowwiseLoad<SwigluSrc> {
    static __device__ __forceinline__ void load(const Params& p, u64 r, u64 c0, float (&v)[8]) {
        const u8* row = reinterpret_cast<const u8*>(p.x) + r * p.ldx * 2;  // (2H,) bf16
        float l[8];
        tkq::load8<1, pc::VECIO>(row + c0 * 2, l);
        tkq::load8<1, pc::VECIO>(row + (p.h + c0) * 2, v);
        if (p.has_clamp)
#pragma unroll
            for (int j = 0; j < 8; ++j) tkq::swiglu_clamp<true>(l[j], v[j], p.clamp);
        float a[8];  // (8,) activations
        tkq::swiglu_act8(l, v, a);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = tkq::round_bf16(a[j]);
    }
};

extern "C" __global__ void __launch_bounds__(256, TK_MINB) tk_swiglu_forward_and_per_channel_cast_and_transpose(const Params p) {
    pc::tile_kernel<SwigluSrc>(p);
}
