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
// TK_PC_FAST_SCALES (the scales without division calls: the scale phase between the tile's two
// barriers is on every warp's path) for the staged e4m3 pipeline, where it was measured (H200,
// session 21): rounded scales (D7, 4 interleaved rounds) made the gathered round rows 0.5-1.6 %
// faster at K >= 2560 (K=6 K=7168 72/EP8 100.75-101.02 -> 100.19-100.61 µs, 256/EP8
// 102.40-102.88 -> 101.90-102.16, 256/EP64 99.69-99.86 -> 99.09-99.41), the staged plain round
// rows 1.0-2.5 %; the others (scale_pair_e4m3_fast; D9, 3 interleaved rounds) the gathered rows
// 0.6-1.7 % at K >= 2560 (K=6 K=7168 72/EP8 101.49-101.78 -> 100.90-101.06 µs, 256/EP8
// 102.99-103.26 -> 102.27-102.38, 256/EP64 100.29-100.30 -> 99.30-99.39), the staged plain rows
// 2.7-4.4 %. Not for the register prefetch (TK_PCF_STAGES 0): 24-28 bytes of spills on sm_90a,
// plain K=2048 round 25 % slower. (Flush-to-zero divisions, which keep the division's call,
// measured 0.4-0.6 % slower.)
#define TK_PC_FAST_SCALES (TK_IN == 2 && TK_PCF_STAGES > 1)
// TK_PC_ARRIVE (only the scale warps wait at the tile's first barrier) and TK_PC_SF_AFTER (the
// column scales stored after the second barrier) for the staged e4m3 pipeline, where they were
// measured (H200, session 22, D10 and D11, 4 interleaved rounds each): the first made the
// gathered K=7168 round rows 0.3-0.5 % faster (72/EP8 100.50-100.77 -> 100.00-100.19 µs) and
// left the others within +-0.2 %; the second, on top, the non-round ones 0.3-0.4 % (72/EP8
// 100.83-101.14 -> 100.40-100.66 µs). Together 0.1-0.4 % on every gathered K=7168 row.
#define TK_PC_ARRIVE (TK_IN == 2 && TK_PCF_STAGES > 1)
#define TK_PC_SF_AFTER (TK_IN == 2 && TK_PCF_STAGES > 1)
// TK_PC_XRED (the warp's column maxima by a transposing exchange: 6 shuffles instead of 16, 12
// selects more) for the staged gathered rows (4 slots), where it was measured (H200, session
// 22, D13, 4 interleaved rounds): gathered K=7168 rows 0.2-0.6 % faster (K=6 72/EP8
// 100.33-100.53 -> 99.73-100.11 µs, 256/EP64 98.91-99.18 -> 98.58-98.88), K=4096 0.2-0.7 %;
// the plain rows (runs of 2, 2 slots) 1 % slower with it, so they keep the shuffles.
#define TK_PC_XRED (TK_IN == 2 && TK_PCF_STAGES > 2)
// TK_PC_WHOLE (set by the host for staged runs whose length divides K / 64, on sm_90 devices:
// every CTA's run is whole column tiles of one row tile) unrolls the tile loop: constant slots
// and offsets, no per-tile bound checks (sm_90a, gathered K=7168: 270-330 SASS per tile
// instead of ~370; no spills; sm_100a spills 8 bytes in runs of 4 and is not measured, so the
// host keeps it off there). H200 (session 23, D1, 3 interleaved rounds against the same build
// without it; medians): gathered e4m3+sf rows -0.2..+8.6 % faster (K=2048 2.3-8.6 %, K=7168
// 0.1-0.6 %: 72/EP8 100.11-100.30 -> 99.53-99.73 µs), staged plain rows -0.2..+3.2 %;
// geometric mean over the 48 e4m3+sf rows 0.984. Session 13's straight-line runs, the same
// idea before the later per-tile changes, spilled 8-16 bytes on sm_90a and were 2-6 % slower.
// TK_PCF_STAGES (set by the host): slots of the staged e4m3 pipeline, 2..4 (the host sets as
// many as the run has tiles, so a run's tiles are all in flight from its first tile on: 4 for
// gathered rows, 2 for plain grids of runs of 2 filling at least one wave of CTAs), or 0: the
// next tile's 12 raw words prefetched into registers (the host's choice for smaller plain
// grids). Why the staging: with 4 CTAs x 8 KiB of reads in flight per SM the gathered e4m3 +
// fp32 scales rows ran at 61-72 % of the copy ceiling; the staged copies put S - 1 tiles
// (8.5 KiB each) per CTA in flight without registers (GatherSrc::issue), each with the
// `.L2::256B` hint. H200 (tk-quant/PERF.md): session 11,
// gathered K=6 rows 2-13 % faster; session 12, the hint another 4.5-9 % on the gathered rows;
// plain rows staged 9 % faster (K=6144) to 1.5 % (K=7168) in grids over one wave, up to 10 %
// slower in grids under it (sessions 12 and 14).
#ifndef TK_PCF_STAGES
#error "TK_PCF_STAGES (0, or 2..4 staged slots) must be defined"
#endif
// Staged only for e4m3 runs with 16-byte aligned rows (16-byte asynchronous copies).
#define TK_PC_STAGED (TK_IN == 2 && TK_PC_RUN > 1 && TK_VECIO && TK_PCF_STAGES > 1)
#include "tk/per_channel.cuh"

#if TK_PC_STAGED
static_assert(TK_PCF_STAGES <= 4, "at most 4 slots (4 x 8.5 KiB per CTA)");
// The staged raw tiles (tile n of a CTA in slot n % S): slot rows in the tile's row order, except
// that the row groups rg with rg odd swap the rows of each pair (row 4 rg + i at 4 rg + (i ^ 1)),
// so the two row groups of a half warp read different bank halves (conflict-free LDS.64: rows
// 4 rg + i of the two are 4 rows = 256 bytes apart, the same banks, without the swap).
__shared__ __align__(16) u8 pcf_stage_x[TK_PCF_STAGES][pc::TR][pc::TC];  // (slots, rows, columns) e4m3 codes
__shared__ __align__(16) float pcf_stage_s[TK_PCF_STAGES][pc::TR];       // (slots, rows) input scales
#endif

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
// reduced, scaled and stored; otherwise every tile loads its rows at its top. With
// TK_PC_STAGED (TK_PCF_STAGES > 1: gathered rows) e4m3 runs use issue / land instead: the
// tiles' bytes and scales go through shared memory, STAGES - 1 tiles ahead (below).
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

    // The source row of output row r: pos_to_token[r] (r itself without a map), or ABSENT for
    // a row past M, a negative entry or one >= N_in (one map load).
    static __device__ __forceinline__ u32 source_row(const Params& p, Row r) {
        const Row m = (Row)p.m;
        i32 s = (i32)r;
        if (p.map && r < m) s = reinterpret_cast<const i32*>(p.map)[u64{r} * p.map_s];
        return r < m && s >= 0 && (Row)s < (Row)p.n_in ? (u32)s : ABSENT;
    }

    // The raw words (and scales) of output rows r0 .. r0 + RPT - 1, columns c0 .. c0 + 8.
    __device__ __forceinline__ void fetch(const Params& p, u64 r0, u64 c0, Raw& raw) {
        // A new row tile (always the first time; every tile without runs, where nothing is kept).
        if (TK_PC_RUN == 1 || (u32)r0 != rows_of) {
            rows_of = (u32)r0;
#pragma unroll
            for (int i = 0; i < pc::RPT; ++i) src[i] = source_row(p, (Row)r0 + i);
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

#if TK_PC_STAGED
    // Staged (TK_PC_STAGED): the copies of a tile go to shared memory, issued STAGES - 1 tiles
    // ahead by tile_kernel. Copy map: the 8 lanes of row group rg copy its 4 rows, lane lx row
    // 4 rg + lx / 2, bytes 32 (lx % 2) .. + 32 of the tile's 64 (two 16-byte cp.async.cg with
    // `.L2::256B`: L2 fetches the aligned 256 bytes around each copy, i.e. the row's piece of 4
    // tiles (64 bytes each: a run of 4, or two runs of 2) with the first copy; H200, session
    // 12: gathered K=6 rows 4.5-9 % faster than without the hint; the same hint on the 4-byte scale copies
    // measured neutral, and copies that fill whole 32-byte sectors per instruction 1-3 % slower),
    // and the even lanes the row's input scale (4-byte cp.async.ca); absent rows are zero-filled
    // (source size 0: nothing read; codes +0 times scale +0 = +0, as the register path's
    // +0 times 1). So a lane needs one source row (csrc), and a warp reads only what its own
    // lanes copied (wait_group, then __syncwarp; no CTA barrier). Slot reuse (tile n + S - 1
    // into tile n - 1's slot) is ordered by tile n - 1's two barriers after its reads.
    static constexpr int STAGES = TK_PCF_STAGES;
    u32 csrc = ABSENT;  // source row of the row this lane copies (4 rg + lx / 2 of tile rows_of), or ABSENT

    __device__ __forceinline__ void issue(const Params& p, u32 tr, u32 tc, u32 slot) {
        const u32 lx = threadIdx.x % pc::LX, rg = threadIdx.x / pc::LX, ri = lx / 2;  // ri: the copied row, of rg's 4
        if (tr != rows_of) {  // a new row tile: this lane's source row (map load, checks) once per row tile
            rows_of = tr;
            csrc = source_row(p, (Row)tr * pc::TR + rg * pc::RPT + ri);
        }
        const bool ok = csrc != ABSENT;
        const u32 s = ok ? csrc : 0u, nx = ok ? 16u : 0u, ns = ok ? 4u : 0u;  // source row (absent: row 0, not read), bytes read
        const u64 c = u64{tc} * pc::TC + 32 * (lx % 2);                         // first column of this lane's 32 bytes
#if TK_PCF_PITCH32
        const u64 gx = mad_wide(s, (u32)p.ldx, p.x + c), gs = mad_wide(s, (u32)(p.xs_ld * 4), p.xs + c / 128 * 4);  // addresses: (32,) codes, scale
#else
        const u64 gx = p.x + u64{s} * p.ldx + c, gs = p.xs + (u64{s} * p.xs_ld + c / 128) * 4;  // addresses: (32,) codes, scale
#endif
        const u32 dx = (u32)__cvta_generic_to_shared(&pcf_stage_x[slot][rg * pc::RPT + (ri ^ (rg % 2))][32 * (lx % 2)]);  // (32,) slot bytes
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(dx), "l"(gx), "r"(nx) : "memory");
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(dx + 16), "l"(gx + 16), "r"(nx) : "memory");
        if (lx % 2 == 0) {
            const u32 ds = (u32)__cvta_generic_to_shared(&pcf_stage_s[slot][rg * pc::RPT + ri]);  // (1,) slot scale
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(ds), "l"(gs), "r"(ns) : "memory");
        }
    }

    static __device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

    // Waits until at most STAGES - 1 groups are pending (tile n's group is complete at tile n),
    // then y from slot slot.
    static __device__ __forceinline__ void land(u32 slot, float (&y)[pc::RPT][8]) {
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 1) : "memory");
        __syncwarp();  // the row group's other lanes copied most of this thread's bytes
        const u32 lx = threadIdx.x % pc::LX, rg = threadIdx.x / pc::LX;
        const float4 sc = *reinterpret_cast<const float4*>(&pcf_stage_s[slot][rg * pc::RPT]);  // (4,) rows' scales
        Raw raw;
        raw.sc[0] = sc.x; raw.sc[1] = sc.y; raw.sc[2] = sc.z; raw.sc[3] = sc.w;
#pragma unroll
        for (int i = 0; i < pc::RPT; ++i) {
            const uint2 w = *reinterpret_cast<const uint2*>(&pcf_stage_x[slot][rg * pc::RPT + (i ^ (rg % 2))][8 * lx]);  // (8,) codes
            raw.w[i][0] = w.x;
            raw.w[i][1] = w.y;
        }
        widen(raw, y);
    }
#endif

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
