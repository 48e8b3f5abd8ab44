// Per-channel (128-row) e4m3 cast with an optional row gather and an optional fused cast back
// (spec/quant.md §3.6). Output row i reads source row src = pos_to_token[i] (or i without a
// map); src < 0 (or >= N_in, rejected on the CPU) gives a row of +0:
//   plain input (TK_IN 0 fp32, 1 bf16): y = fp32(x[src, c])
//   fused cast back (TK_IN 2, e4m3 with fp32 (N_in, K/128) scales): y = fl(dec8(x[src, c]) * xs[src, c/128])
// then the per-channel cast of tk/per_channel.cuh (defines TK_NPT = 128, TK_ROUND, TK_VECIO,
// TK_TRANSPOSE = 0; rows >= M, the tail of a partial last block, are absent from the maxima).
// e4m3 + fp32 scales input (TK_IN 2) sets three options of tk/per_channel.cuh, measured for
// it (session 9, H200 A/B, tk-quant/PERF.md; fp32 / bf16 input keeps the header's defaults, not
// measured with them): TK_PC_TREE (the block's column maximum over its 8 warps as a tree of
// depth 3 instead of a chain of 8 dependent max; the same value), TK_PC_ROWS32 (the stores'
// count of rows inside the output from u32 row numbers: sm_90a 8 SASS per tile fewer, the
// 64-bit compare and subtract) and TK_PC_NO_END_BARRIER (no barrier at the end of the tile; why
// it is safe: tk/per_channel.cuh). The first two with the high-half decode (e4m3x2_half)
// measured 0.0-1.8 % faster (mean 1.004); no end barrier 0.1-1.6 % (mean 1.006; see there).
#define TK_PC_TREE (TK_IN == 2)
#define TK_PC_ROWS32 (TK_IN == 2)
#define TK_PC_NO_END_BARRIER (TK_IN == 2)
#include "tk/per_channel.cuh"

#ifndef TK_PCF_PITCH32
#error "TK_PCF_PITCH32 (1: the row pitches of x and its scales in bytes are below 2^32) must be defined"
#endif
#ifndef TK_GATHER32
#error "TK_GATHER32 (1: u32 row indices, 0: u64) must be defined"
#endif

// a * b + c (64-bit) in one PTX mad.wide.u32: from C++, ptxas reassociates c's parts (a base
// pointer plus offsets) around the product and reloads them per use.
__device__ __forceinline__ u64 mad_wide(u32 a, u32 b, u64 c) {
    u64 d;
    asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(d) : "r"(a), "r"(b), "l"(c));
    return d;
}

// The fp32 values of the e4m3 codes in bytes 0, 1 (hi false) or 2, 3 (hi true) of w (exact,
// as tkq::e4m3x2_value): the pair is the 16-bit half of w (mov.b32 {lo, hi}), not w >> 16, so
// sm_90a converts it in place (F2FP.F16.E4M3.UNPACK_B R.H1): 8 SHF per tile fewer (session 9,
// measured with TK_PC_TREE and TK_PC_ROWS32: see the top of this file).
__device__ __forceinline__ float2 e4m3x2_half(u32 w, bool hi) {
    u32 h;  // (2,) f16 values
    if (hi) asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, h; }" : "=r"(h) : "r"(w));
    else asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, l; }" : "=r"(h) : "r"(w));
    return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// The RPT rows of a thread in three phases: every source index (map loads back to back), every
// valid row's raw data (and scale) load, then the widening; so the rows' loads overlap (row by
// row, the map load, the branch on its value, the data load and its use serialised two round
// trips per row). Absent rows (src < 0, >= N_in, or row >= M) are raw zeros: +0 values.
// The source rows of the thread's RPT output rows are kept for the next tiles of a run
// (TK_PC_RUN: consecutive column tiles of the same rows): the map loads, their checks and the
// selects happen once per row tile, not once per tile. e4m3 input (TK_IN 2) in runs (the only
// input the host runs: TK_PC_RUN > 1) has the software pipeline: the raw codes and scales of
// the run's next tile (12 words) are loaded at the top of this tile, in flight while it is
// reduced, scaled and stored; otherwise every tile loads its rows at its top.
struct GatherSrc {
    static constexpr int B = TK_IN == 0 ? 4 : TK_IN == 1 ? 2 : 1;  // bytes per element
    static constexpr bool PIPE = TK_IN == 2 && TK_PC_RUN > 1;
    static constexpr bool EARLY = true;  // 12 raw words: prefetched at the top of the tile
    // Row indices in u32 (TK_GATHER32, chosen by the host) or u64: M and N_in are below 2^32
    // (each row is at least 64 bytes of a device buffer), so with u32 the indices, the
    // comparisons and the selects need one register and one instruction instead of two (the
    // widening to u64 happens in the address products).
#if TK_GATHER32
    using Row = u32;
#else
    using Row = u64;
#endif
    static constexpr u32 ABSENT = ~0u;  // src of an absent row (N_in < 2^32)
    u32 src[pc::RPT];                   // (rows,) source row, or ABSENT
    u32 rows_of = ~0u;                  // the r0 (first output row) src belongs to; ~0: none yet (r0 < M < 2^32)

    struct Raw {
        u32 w[pc::RPT][B * 2];  // (rows, raw words of 8 elements); 0 (= +0 values) for absent rows
        float sc[pc::RPT];      // (rows,) input scale (fused cast back), 1 for absent rows
    };

    // The raw words (and scales) of output rows r0 .. r0 + RPT - 1, columns c0 .. c0 + 8.
    __device__ __forceinline__ void fetch(const Params& p, u64 r0, u64 c0, Raw& raw) {
        const Row m = (Row)p.m, n_in = (Row)p.n_in;
        // A new row tile (always the first time; every tile without runs, where nothing is kept).
        if (TK_PC_RUN == 1 || (u32)r0 != rows_of) {
            rows_of = (u32)r0;
#pragma unroll
            for (int i = 0; i < pc::RPT; ++i) {
                const Row r = (Row)r0 + i;
                i32 s = (i32)r;
                if (p.map && r < m) s = reinterpret_cast<const i32*>(p.map)[u64{r} * p.map_s];
                src[i] = r < m && s >= 0 && (Row)s < n_in ? (u32)s : ABSENT;
            }
        }
#if TK_PCF_PITCH32
        // Column c0 of source row 0 (xb, sb), then one 32x32 -> 64-bit multiply-add per row
        // and address (mad_wide: src * pitch + base); the host sets TK_PCF_PITCH32 only
        // when both row pitches in bytes are below 2^32. With u64 pitches ptxas reloads the
        // parameters from the constant bank under each row's predicate and needs IMAD.WIDE +
        // IMAD + LEA + LEA.HI.X per address (sm_90a, e4m3 + fp32 scales: the 4 rows' address
        // block ~90 -> ~60 SASS per tile, the kernel 883 -> 838; H200: e4m3 + fp32 scales
        // 0.7-2.0 % faster, session 8, tk-quant/PERF.md).
        const u64 xb = p.x + c0 * B, sb = p.xs + c0 / 128 * 4;           // addresses: (8,) of x row 0, its scale
        const u32 pitch = (u32)(p.ldx * B), spitch = (u32)(p.xs_ld * 4);  // row pitches in bytes
#endif
#pragma unroll
        for (int i = 0; i < pc::RPT; ++i) {
#pragma unroll
            for (int t = 0; t < B * 2; ++t) raw.w[i][t] = 0;
            raw.sc[i] = 1.0f;
            if (src[i] != ABSENT) {
#if TK_PCF_PITCH32
                tkq::load_bytes<B * 8, pc::VECIO>(reinterpret_cast<const u8*>(mad_wide(src[i], pitch, xb)), raw.w[i]);
                if (TK_IN == 2) raw.sc[i] = __ldg(reinterpret_cast<const float*>(mad_wide(src[i], spitch, sb)));
#else
                tkq::load_bytes<B * 8, pc::VECIO>(reinterpret_cast<const u8*>(p.x) + (u64{src[i]} * p.ldx + c0) * B, raw.w[i]);
                if (TK_IN == 2) raw.sc[i] = reinterpret_cast<const float*>(p.xs)[u64{src[i]} * p.xs_ld + c0 / 128];
#endif
            }
        }
    }

    // y[i][j]: the values of raw's words.
    static __device__ __forceinline__ void widen(const Raw& raw, float (&y)[pc::RPT][8]) {
#pragma unroll
        for (int i = 0; i < pc::RPT; ++i) {
#if TK_IN == 2
            // e4m3: two codes per conversion (e4m3x2_half; H200: 5 % faster than one code
            // per conversion, 2026-12-01).
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                const float2 f = e4m3x2_half(raw.w[i][j / 4], j % 4 != 0);  // (2,) decoded values j, j + 1
                y[i][j] = __fmul_rn(f.x, raw.sc[i]);
                y[i][j + 1] = __fmul_rn(f.y, raw.sc[i]);
            }
#else
            tkq::widen8<TK_IN>(raw.w[i], y[i]);
#endif
        }
    }

    // Without PIPE: the tile's loads, then the widening.
    __device__ __forceinline__ void rows(const Params& p, u64 r0, u64 c0, float (&y)[pc::RPT][8]) {
        Raw raw;  // the tile's raw words
        fetch(p, r0, c0, raw);
        widen(raw, y);
    }
};

extern "C" __global__ void __launch_bounds__(256, TK_MINB) tk_per_channel_cast_fused(const Params p) {
    pc::tile_kernel<GatherSrc>(p);
}
