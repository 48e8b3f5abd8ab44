// SwiGLU forward rounded to bf16, then a per-channel e4m3 cast, the data transposed or not
// (spec/quant.md §3.12). For r < M, j < H (x is bf16 (M, 2H)):
//   l = x[r, j], v = x[r, H + j], clamped in fp32 (has_clamp: l <= C, v in [-C, C])
//   A[r, j] = bf16(fl(fl(l / fl(1 + expf(-l))) * v))
// then the per-channel cast of A (tk/per_channel.cuh; defines TK_NPT, TK_ROUND, TK_VECIO,
// TK_TRANSPOSE, TK_MINB).
#include "tk/per_channel.cuh"

// The cast tile is pc::tile_kernel_bf16 (tk/per_channel.cuh): the activations are handed over
// as their bf16 words (SwigluSrc::rows_bf16), their column maxima taken on the packed words and
// the words widened only for the products, instead of pc::tile_kernel over the widened fp32
// activations (session 9). Bit for bit the same; fewer registers live across the barriers (no
// spill on sm_90a, where tile_kernel spilled 4-20 bytes). H200 A/B (session 10, D1, knob
// TK_SWPC_BF16TILE, CUPTI medians): pc::tile_kernel was 4.2-8.1 % slower (mean 6.1 %; 8064x7168
// plain 4.2-5.4 %, transposed 6.5-8.1 %, 4096x2048 4.8-5.4 %).

// The divisions: the inline div_fast for the whole tile of a thread (4 rows x 8 columns), one
// range flag over all 32 gates; when a gate is out of div_fast's range (rare: |l| > 40, tiny or
// non-finite gates), the 4 rows are reloaded and recomputed with CUDA's IEEE division
// (swiglu_act). Both give __fdiv_rn's quotient bit for bit (tk/fused_io.cuh), as swiglu_act8
// does per fragment; one cold path per tile (instead of one per fragment) keeps the divide's
// slow-path calls, and the registers they clobber, out of the hot loop. The tile's words are
// loaded at its top (no software pipeline: with the next tile's 32 words live across the stores
// and 3 CTAs per SM it measured 10-25 % slower on the H200 than this at 4 CTAs per SM).
// The range check of the divisions is done on the tile's raw bf16 gate words (gates_in_range:
// packed 16-bit min / max of |bits|, ~1.5 instructions per gate pair, instead of two compares
// per fp32 gate). The clamp mode is read in the row loop (one code path for all modes).
// Clamp mode 3 (the host's choice for a C > 0 that is a bf16 value): the clamp of mode 2 done on
// the raw bf16 words before the widening, two elements per min.NaN / max.NaN.bf16x2 (1.5
// HMNMX2 per element instead of 3 FMNMX.NAN): widening is an exact order-preserving map and C,
// -C are bf16 values, so the clamped values are mode 2's; a NaN comes out as a canonical NaN
// (the activation's last FMUL makes any NaN the canonical one either way). The exact fallback
// clamps as mode 2. H200 A/B (session 9, D2, against mode 2 for every C > 0): the clamp=0.5
// rows +1.7-3.7 % (npt=128 transposed clamp=0.5 85.70 -> 82.62 µs), the others unchanged.

// The activations are rounded to bf16 two per conversion (cvt.rn.bf16x2.f32, one
// F2FP.BF16.F32.PACK_AB per pair, then the halves widened back) instead of one F2F.BF16.F32 +
// shift each (tkq::round_bf16): the same RNE rounding, 16 fewer conversions (a quarter-rate pipe
// on Hopper) and 16 fewer instructions per 32 values. H200 A/B (session 9, D2, against
// round_bf16 per value): +0.9-3.9 % on every 8064x7168 and 4096x2048 row (mean 2.9 %; e.g.
// npt=32 transposed clamp=0.5 87.24 -> 84.69 µs, npt=128 plain clamp=None 79.70 -> 76.83).

// Whether every bf16 gate in words g[0 .. n) (2 per word) has |l| in [2^-40, 40], i.e.
// tkq::fast_div_ok of its (exact) fp32 widening: for bf16 bits with the sign cleared the
// numeric order is the unsigned order, 2^-40 is 0x2B80 and 40.0 is 0x4220 (both bf16 values);
// NaN and infinity (>= 0x7F80) and zeros fail like the fp32 compares.
template <int N>
__device__ __forceinline__ bool gates_in_range(const u32 (&g)[N]) {
    u32 mn = 0xFFFFFFFFu, mx = 0;  // (2,) per-half minimum / maximum of |bits|
#pragma unroll
    for (int t = 0; t < N; ++t) {
        const u32 a = g[t] & 0x7FFF7FFFu;
        asm("min.u16x2 %0, %0, %1;" : "+r"(mn) : "r"(a));
        asm("max.u16x2 %0, %0, %1;" : "+r"(mx) : "r"(a));
    }
    return (mn & 0xFFFFu) >= 0x2B80u && (mn >> 16) >= 0x2B80u && (mx & 0xFFFFu) <= 0x4220u && (mx >> 16) <= 0x4220u;
}

struct SwigluSrc : pc::NoPipe {
    // The raw gate and value words of row r (16 bytes each): gate x[r, c0 .. c0 + 8) then value
    // x[r, H + c0 ..); zeros (activations +0) for rows >= M.
    static __device__ __forceinline__ void fetch_row(const Params& p, u64 r, u64 c0, u32 (&w)[8]) {
        if (r >= p.m) {
#pragma unroll
            for (int t = 0; t < 8; ++t) w[t] = 0;
            return;
        }
        const u8* row = reinterpret_cast<const u8*>(p.x) + r * p.ldx * 2;  // (2H,) bf16
        u32 g[4], v[4];  // (words,) gate, value
        tkq::load_bytes<16, pc::VECIO>(row + c0 * 2, g);
        tkq::load_bytes<16, pc::VECIO>(row + (p.h + c0) * 2, v);
#pragma unroll
        for (int t = 0; t < 4; ++t) w[t] = g[t], w[4 + t] = v[t];
    }
    // The clamped gate and value of one row's raw words (has_clamp: 0 none, 1 compares and
    // selects, 2 min / max: tkq::swiglu_clamp_minmax, bit for bit the selects for every finite C
    // with a clear sign bit; the host uses it for C > 0; 3 the same on the raw bf16 words when
    // RAW_CLAMP, else as 2).
    template <bool RAW_CLAMP>
    static __device__ __forceinline__ void gate_value(const Params& p, const u32 (&w)[8], float (&l)[8], float (&v)[8]) {
        u32 gw[4] = {w[0], w[1], w[2], w[3]}, vw[4] = {w[4], w[5], w[6], w[7]};  // (words,) gate, value
        if (RAW_CLAMP && p.has_clamp == 3) {
            const u32 c2 = bf16_pair(p.clamp), nc2 = c2 ^ 0x80008000u;  // (2,) C, -C as bf16 pairs
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                gw[t] = tkq::bf16x2_min_nan(gw[t], c2);
                vw[t] = tkq::bf16x2_min_nan(tkq::bf16x2_max_nan(vw[t], nc2), c2);
            }
        }
        tkq::widen8<1>(gw, l);
        tkq::widen8<1>(vw, v);
        if (p.has_clamp == 2 || (!RAW_CLAMP && p.has_clamp == 3))
#pragma unroll
            for (int j = 0; j < 8; ++j) tkq::swiglu_clamp_minmax(l[j], v[j], p.clamp);
        else if (p.has_clamp == 1)
#pragma unroll
            for (int j = 0; j < 8; ++j) tkq::swiglu_clamp<true>(l[j], v[j], p.clamp);
    }
    // c (a bf16 value) in both halves of a word.
    static __device__ __forceinline__ u32 bf16_pair(float c) {
        const u32 b = __float_as_uint(c) >> 16;
        return b | b << 16;
    }
    // The tile's raw words of rows r0 .. r0 + 3 (w[i]: 4 gate then 4 value words) and whether
    // every (clamped) gate is in div_fast's range.
    static __device__ __forceinline__ bool load_tile(const Params& p, u64 r0, u64 c0, u32 (&w)[pc::RPT][8]) {
        {
            // Every tile is full (the op validated M % 128 == 0): no row checks, one 64-bit
            // address stepped by the row pitch.
            const u8* g = reinterpret_cast<const u8*>(p.x) + (r0 * p.ldx + c0) * 2;  // (8,) gate of row r0
            const u64 pitch = p.ldx * 2, hb = p.h * 2;                              // row pitch, value offset (bytes)
#pragma unroll
            for (int i = 0; i < pc::RPT; ++i, g += pitch) {
                u32 gw[4], vw[4];  // (words,) gate, value
                tkq::load_bytes<16, pc::VECIO>(g, gw);
                tkq::load_bytes<16, pc::VECIO>(g + hb, vw);
#pragma unroll
                for (int t = 0; t < 4; ++t) w[i][t] = gw[t], w[i][4 + t] = vw[t];
            }
        }
        // On the raw gates; then the clamped ones are in range too when C >= 2^-40: a clamped
        // gate is C < l <= 40. A clamp below 2^-40 (C = 0) always takes the exact fallback.
        const u32 g[pc::RPT * 4] = {w[0][0], w[0][1], w[0][2], w[0][3], w[1][0], w[1][1], w[1][2], w[1][3],
                                    w[2][0], w[2][1], w[2][2], w[2][3], w[3][0], w[3][1], w[3][2], w[3][3]};  // (words,) gates
        static_assert(pc::RPT == 4, "gate words of 4 rows");
        return gates_in_range(g) && (!p.has_clamp || p.clamp >= 0x1p-40f);
    }
    // The fp32 activations (before the bf16 rounding) of one row's raw words, with div_fast.
    static __device__ __forceinline__ void act_fast(const Params& p, const u32 (&w)[8], float (&a)[8]) {
        float l[8], v[8];  // (8,) gate, value
        gate_value<true>(p, w, l, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) a[j] = __fmul_rn(tkq::div_fast(l[j], tkq::one_plus_expf(-l[j])), v[j]);
    }
    // The exact fallback's bf16 activations (as fp32) of row r, columns c0 .. c0 + 8 (reloaded).
    static __device__ __forceinline__ void act_exact(const Params& p, u64 r, u64 c0, float (&y)[8]) {
        u32 wi[8];  // (words,) row r, reloaded
        fetch_row(p, r, c0, wi);
        float l[8], v[8];  // (8,) gate, value
        gate_value<false>(p, wi, l, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = tkq::round_bf16(tkq::swiglu_act(l[j], v[j]));
    }
    // b[i][t] = the bf16 activations at row r0 + i, columns c0 + 2t (low half) and c0 + 2t + 1
    // (pc::tile_kernel_bf16), as raw bf16 words.
    static __device__ __forceinline__ void rows_bf16(const Params& p, u64 r0, u64 c0, u32 (&b)[pc::RPT][4]) {
        u32 w[pc::RPT][8];                      // (rows, words) the tile's raw words
        const bool ok = load_tile(p, r0, c0, w);  // every (clamped) gate in div_fast's range
#pragma unroll
        for (int i = 0; i < pc::RPT; ++i) {
            float a[8];  // (8,) fp32 activations
            act_fast(p, w[i], a);
#pragma unroll
            for (int t = 0; t < 4; ++t) b[i][t] = tkq::bf16x2_bits(a[2 * t], a[2 * t + 1]);  // (2,) bf16 RNE
        }
        if (!ok)
#pragma unroll
            for (int i = 0; i < pc::RPT; ++i) {
                float y[8];  // (8,) bf16 activations (as fp32, low 16 bits zero)
                act_exact(p, r0 + i, c0, y);
#pragma unroll
                for (int t = 0; t < 4; ++t) b[i][t] = __float_as_uint(y[2 * t]) >> 16 | (__float_as_uint(y[2 * t + 1]) & 0xFFFF0000u);
            }
    }
};

extern "C" __global__ void __launch_bounds__(256, TK_MINB) tk_swiglu_forward_and_per_channel_cast_and_transpose(const Params p) {
    pc::tile_kernel_bf16<SwigluSrc>(p);
}
