// Per-channel (128-row) e4m3 cast with an optional row gather and an optional fused cast back
// (spec/quant.md §3.6). Output row i reads source row src = pos_to_token[i] (or i without a
// map); src < 0 (or >= N_in, rejected on the CPU) gives a row of +0:
//   plain input (TK_IN 0 fp32, 1 bf16): y = fp32(x[src, c])
//   fused cast back (TK_IN 2, e4m3 with fp32 (N_in, K/128) scales): y = fl(dec8(x[src, c]) * xs[src, c/128])
// then the per-channel cast of tk/per_channel.cuh (defines TK_NPT = 128, TK_ROUND, TK_VECIO,
// TK_TRANSPOSE = 0; rows >= M, the tail of a partial last block, are absent from the maxima).
#include "tk/per_channel.cuh"

struct GatherSrc {
    static __device__ __forceinline__ void load(const Params& p, u64 r, u64 c0, float (&v)[8]) {
        i32 src = (i32)r;
        if (p.map) src = reinterpret_cast<const i32*>(p.map)[r * p.map_s];
        if (src < 0 || (u64)src >= p.n_in) {
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = 0.0f;
            return;
        }
        constexpr int B = TK_IN == 0 ? 4 : TK_IN == 1 ? 2 : 1;
        tkq::load8<TK_IN, pc::VECIO>(reinterpret_cast<const u8*>(p.x) + ((u64)src * p.ldx + c0) * B, v);
#if TK_IN == 2
        const float s = reinterpret_cast<const float*>(p.xs)[(u64)src * p.xs_ld + c0 / 128];
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = __fmul_rn(v[j], s);
#endif
    }
};

extern "C" __global__ void __launch_bounds__(256, TK_MINB) tk_per_channel_cast_fused(const Params p) {
    pc::tile_kernel<GatherSrc>(p);
}
