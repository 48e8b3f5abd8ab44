// Per-channel e4m3 cast of bf16 x (M, K) with the data transposed (spec/quant.md §3.7):
// sf[b, c] over rows [NPT b, NPT b + NPT), out[c, r] = enc8(fl(x[r, c] * inv)). The tile is
// tk/per_channel.cuh (defines: TK_NPT, TK_ROUND, TK_VECIO; TK_TRANSPOSE = 1).
#include "tk/per_channel.cuh"

extern "C" __global__ void __launch_bounds__(256, TK_MINB) tk_per_channel_cast_and_transpose(const Params p) {
    pc::tile_kernel<pc::PlainSrc<1>>(p);
}
