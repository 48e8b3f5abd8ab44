// tk-quant: the per-channel cast tile shared by per_channel_cast_and_transpose (§3.7),
// per_channel_cast_fused (§3.6) and swiglu_forward_and_per_channel_cast_and_transpose (§3.12)
// (include as "tk/per_channel.cuh"). Each op supplies a Src with
//   static __device__ void load(const Params& p, u64 r, u64 c0, float (&v)[8])
// giving the 8 fp32 values y[r, c0..c0+8] (r < M) of its cast input; this header casts them to
// e4m3 with one scale per column per NPT rows:
//   amax[b, c] = max |y[r, c]| over rows r of block b (rows >= M absent), (sf, inv) per §1.4
//   (eps 1e-4, Q 448, TK_ROUND: powers of two), sf stored row-major (ceil(M/NPT), K) fp32,
//   out = enc8(fl(y * inv)) at out[r, c] (M, K), or at out[c, r] (K, M) with TK_TRANSPOSE.
//
// Defines: TK_NPT (32 or 128), TK_ROUND, TK_TRANSPOSE, TK_MINB (the kernels' CTAs per SM for
// __launch_bounds__), TK_VECIO (1: 16-byte accesses; every row start and the outputs 16-byte
// aligned), TK_PC_RUN (tiles per CTA run, 1: the strided tile loop), plus the op's own.
//
// Tile: 128 rows x 64 columns per CTA iteration (K % 64 == 0). CTA: 8 warps; a warp is 4 row
// groups x 8 lanes along K; row group g (0..31) owns rows 4g..4g+3, a lane 8 columns. Column
// maxima: registers over 4 rows, shuffles over a warp's 16 rows, shared memory across the
// NPT/16 warps of a block; each (block, column) scale is then computed once, by one thread,
// and its inverse shared through shared memory. The transposed output is staged as codes in
// shared memory (64 columns x 128 rows, rows padded by 4 bytes; lanes 4..7 of a row group stage
// their columns rotated by 4, avoiding 2-way bank conflicts) and written as 16-byte chunks, 8
// consecutive threads per 128-byte run of an output row (full sectors per store instruction).
// A Src with PIPE (PlainSrc; its host then launches at most the resident CTAs, each looping
// over row tiles) has the raw words of its next tile loaded right after the current tile's
// codes are computed (with EARLY, GatherSrc's e4m3 runs: right after its values), so those loads are in flight during the current tile's staging, barriers
// and global stores (software pipeline).
#pragma once
#include "tk/fused_io.cuh"

// Options an op's .cu may set to 1 (0 otherwise; bit-identical either way; per_channel_cast_fused
// sets them for e4m3 input, where they were measured: tk-quant/PERF.md, session 9).
// TK_PC_TREE 1: the block's column maximum over its WPB warps as a tree instead of a chain.
#ifndef TK_PC_TREE
#define TK_PC_TREE 0
#endif
// TK_PC_ROWS32 1 (row-major output): the thread's count of rows inside the output from u32
// row numbers (M < 2^32: M * K bytes of output) instead of a 64-bit compare and subtract.
#ifndef TK_PC_ROWS32
#define TK_PC_ROWS32 0
#endif
// TK_PC_NO_END_BARRIER 1 (row-major output): no barrier at the end of a tile (why it is
// safe: there).
#ifndef TK_PC_NO_END_BARRIER
#define TK_PC_NO_END_BARRIER 0
#endif
// TK_PC_FAST_SCALES 1: the scales without IEEE division calls, the same values: rounded ones
// (TK_ROUND) from the exponent bits (tkq::scale_pair_pow2), the others by
// tkq::scale_pair_e4m3_fast.
#ifndef TK_PC_FAST_SCALES
#define TK_PC_FAST_SCALES 0
#endif
// TK_PC_STAGED 1 (a PIPE Src with STAGES, issue, commit and land; per_channel_cast_fused's
// e4m3 runs): the raw data of the tiles Src::STAGES - 1 ahead of the current one are in flight
// (Src::issue, asynchronous copies into shared memory, one commit group per tile) instead of
// one tile's raw words in registers (Src::fetch).
#ifndef TK_PC_STAGED
#define TK_PC_STAGED 0
#endif
// TK_PC_XRED 1: the warp's column maxima folded over its 4 row groups by a transposing
// exchange (each step keeps half the columns: 6 shuffles instead of 16), each lane then
// publishing 2 columns.
#ifndef TK_PC_XRED
#define TK_PC_XRED 0
#endif
// TK_PC_WHOLE 1 (TK_PC_RUN > 1; the host's promise: K / 64 % TK_PC_RUN == 0 and a grid of
// exactly T / TK_PC_RUN CTAs): every CTA's run is TK_PC_RUN whole tiles of one row tile, so the
// tile loop is unrolled (constant slots, per-run addresses) without per-tile bound checks.
#ifndef TK_PC_WHOLE
#define TK_PC_WHOLE 0
#endif
// TK_PC_ARRIVE 1: the tile's first barrier (every warp's partial maxima published) waits only
// in the scale threads' warps (bar.sync on named barrier 1); the other warps announce their
// partials (bar.arrive) and go straight on to the second barrier, where they wait for the
// inverses anyway.
#ifndef TK_PC_ARRIVE
#define TK_PC_ARRIVE 0
#endif
// TK_PC_SF_AFTER 1: the scale threads store their column scales after the second barrier (kept
// in a register), so that only the inverses sit between the two barriers.
#ifndef TK_PC_SF_AFTER
#define TK_PC_SF_AFTER 0
#endif

using tk::u8;
using tk::u32;
using tk::u64;
using tk::i32;

// Kernel arguments of the per-channel ops (mirrored by `PerChannelArgs` in
// src/per_channel_cast_and_transpose.rs); each op reads the fields it needs.
struct Params {
    u64 x, ldx;        // input rows, row stride in elements
    u64 xs, xs_ld;     // fused cast back: (N_in, K/128) fp32 input scales, row stride
    u64 map, map_s;    // per_channel_cast_fused: pos_to_token (M,) int32, stride (0: none)
    u64 n_in;          // rows of x (gathers only read src < n_in)
    u64 out;           // e4m3 (M, K), or (K, M) transposed; contiguous
    u64 sf;            // fp32 (ceil(M/NPT), K), contiguous
    u64 m, k;          // output rows and columns
    u64 h;             // SwiGLU: offset of the value half (= K)
    u32 has_clamp;     // SwiGLU: 0 no clamp, 1 compares and selects, 2 min / max (C > 0),
                       // 3 min / max on the raw bf16 words (C > 0 a bf16 value)
    float clamp;
    u32 step_r, step_c;  // the grid's CTA count nb as (row, column) tiles: nb = step_r * K/64 + step_c
};

namespace pc {

constexpr int TR = 128, TC = 64, RPT = 4, LX = 8, LY = 4, WARPS = 8;
constexpr int WPB = TK_NPT / (LY * RPT);  // warps per scale block
constexpr int NB = TR / TK_NPT;           // scale blocks per tile
constexpr int ROW_PITCH = TR + 4;         // staged bytes per column
constexpr bool VECIO = TK_VECIO != 0;
static_assert(TK_NPT == 32 || TK_NPT == 128, "NPT must be 32 or 128");
static_assert(RPT == 4, "a staging word holds the codes of 4 rows");

// The members of a Src without the raw prefetch of the pipeline (see PlainSrc for one with it).
struct NoPipe {
    static constexpr bool PIPE = false, EARLY = false;
    struct Raw {};
    static __device__ __forceinline__ void fetch(const Params&, u64, u64, Raw&) {}
    static __device__ __forceinline__ void widen(const Raw&, float (&)[RPT][8]) {}
};

// The default Src::rows: y[i] = values of row r0 + i (Src::load; 0 for rows >= M), row by row.
template <class Src>
struct RowwiseLoad : NoPipe {
    static __device__ __forceinline__ void rows(const Params& p, u64 r0, u64 c0, float (&y)[RPT][8]) {
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            if (r0 + i < p.m) Src::load(p, r0 + i, c0, y[i]);
            else
#pragma unroll
                for (int j = 0; j < 8; ++j) y[i][j] = 0.0f;
        }
    }
};

// Column c of scale block b, whose maximum |y| is a: its scale (returned) and inverse, shared
// through inv_s[b][c] (§1.4: eps 1e-4, Q 448, TK_ROUND powers of two; TK_PC_FAST_SCALES
// without division calls).
__device__ __forceinline__ float share_scale(float a, u32 b, u32 c, float (&inv_s)[NB][TC]) {
    float sf, inv;
    if constexpr (TK_PC_FAST_SCALES && TK_ROUND != 0) tkq::scale_pair_pow2(a, __uint_as_float(0x38D1B717u), 448.0f, sf, inv);
    else if constexpr (TK_PC_FAST_SCALES) tkq::scale_pair_e4m3_fast(a, sf, inv);
    else tkq::scale_pair<TK_ROUND != 0>(a, __uint_as_float(0x38D1B717u), 448.0f, sf, inv);
    inv_s[b][c] = inv;
    return sf;
}

// Stores the scale sf of column c of scale block b of tile (tr, tc) at sf[row / NPT, column]
// when the block starts inside the output.
__device__ __forceinline__ void store_scale(const Params& p, u64 tr, u64 tc, u32 b, u32 c, float sf) {
    const u64 rb = tr * TR + b * TK_NPT;  // first row of the scale block
    if (rb < p.m) reinterpret_cast<float*>(p.sf)[(rb / TK_NPT) * p.k + tc * TC + c] = sf;  // sf[rb / NPT, column]
}

// share_scale, then store_scale.
__device__ __forceinline__ void put_scale(const Params& p, u64 tr, u64 tc, u32 b, u32 c, float a, float (&inv_s)[NB][TC]) {
    store_scale(p, tr, tc, b, c, share_scale(a, b, c, inv_s));
}

// inv[j] = inv_s[b][lx * 8 + j]: the inverse scales of a lane's 8 columns (two 16-byte loads).
__device__ __forceinline__ void get_inv(const float (&inv_s)[NB][TC], u32 b, u32 lx, float (&inv)[8]) {
    const float4* is = reinterpret_cast<const float4*>(&inv_s[b][lx * 8]);
    const float4 i0 = is[0], i1 = is[1];
    inv[0] = i0.x; inv[1] = i0.y; inv[2] = i0.z; inv[3] = i0.w;
    inv[4] = i1.x; inv[5] = i1.y; inv[6] = i1.z; inv[7] = i1.w;
}

// Src provides rows(p, r0, c0, y): y[i][j] = value at (row r0 + i, column c0 + j) for i < RPT,
// 0 for rows >= M (RowwiseLoad builds it from a per-row load); with PIPE instead fetch(p, r0,
// c0, raw) (the raw words of those values, issued one tile ahead: right after the current tile's
// widen(raw, y) with EARLY, else after its codes) and widen(raw, y); with TK_PC_STAGED
// instead issue(p, tr, tc, slot) (the copies of tile (tr, tc) into shared slot slot < STAGES),
// the static commit() (closes a tile's copy group) and land(slot, y) (waits for the oldest
// group, then y from the slot). One Src
// object per thread lives across the tile loop (members may cache per-row work).
template <class Src>
__device__ __forceinline__ void tile_kernel(const Params& p) {
#if TK_PC_XRED
    __shared__ __align__(16) float red[WARPS][TC];  // (warps, columns) partial column maxima
#else
    __shared__ float red[WARPS][TC];                // (warps, columns) partial column maxima
#endif
    __shared__ __align__(16) float inv_s[NB][TC];  // (scale blocks, columns) inverse scales
#if TK_TRANSPOSE
    __shared__ __align__(16) u8 stage[TC * ROW_PITCH];  // (columns, rows + pad) e4m3 codes
#endif
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32, lx = lane % LX, ly = lane / LX;
    const u32 rg = warp * LY + ly;  // row group: rows 4 rg .. 4 rg + 3 of the tile
    // Tiles in row-major order (t = tr * tiles_c + tc), CTA b (of nb) taking t = b, b + nb, ...:
    // a 2D grid (tiles_c, rows) gives CTA (x, y) column tile x and rows y, y + rows, ...; a 1D
    // persistent grid spreads the tiles evenly over every resident CTA. The stride nb is
    // (step_r, step_c) in (row, column) tiles (kernel arguments: no registers), stepped with
    // one carry (no division per tile). With TK_PC_RUN = R > 1 (runs; 1D grid of ceil(T / R)
    // CTAs) CTA b takes the R consecutive tiles t = R b .. R b + R - 1 instead: consecutive
    // column tiles of one row tile (wrapping to the next row tile), so a Src keeps its per-row
    // work (a gather's source rows) across them. u32: an output holds at least 8 KiB per tile,
    // so there are fewer than 2^32 tiles (and R b < T + R).
    const u32 tiles_c = (u32)(p.k / TC), tiles_r = (u32)((p.m + TR - 1) / TR);
    const u32 b = blockIdx.y * gridDim.x + blockIdx.x;
    constexpr u32 RUN = TK_PC_RUN;
    constexpr bool WHOLE = TK_PC_WHOLE != 0;
    static_assert(!WHOLE || RUN > 1, "whole runs need runs");
    const auto step = [&](u32& tr, u32& tc) {  // (tr, tc) of this CTA's next tile
        if constexpr (WHOLE) {
            ++tc;
        } else if constexpr (RUN > 1) {
            if (++tc == tiles_c) tc = 0, ++tr;
        } else {  // t + nb (host-computed stride)
            tc += p.step_c;
            tr += p.step_r;
            if (tc >= tiles_c) tc -= tiles_c, ++tr;
        }
    };
    // Whether this CTA's n-th tile (row tile tr) exists (whole runs: every CTA's RUN tiles).
    const auto live = [&](u32 n, u32 tr) {
        return WHOLE ? n < RUN : tr < tiles_r && (RUN == 1 || n < RUN);
    };
    constexpr bool PIPE = Src::PIPE;
    Src src;                // the source (state: e.g. GatherSrc's source rows)
    typename Src::Raw raw;  // PIPE: the raw words of tile (tr, tc), loaded one tile ahead
    const u32 t0 = RUN > 1 ? b * RUN : b;            // this CTA's first tile
    u32 tr32 = t0 / tiles_c, tc32 = t0 % tiles_c;  // this CTA's current tile
    if (WHOLE && tr32 >= tiles_r) return;
#if TK_PC_STAGED
    // Staged: tile n's copies go to slot n % S, issued S - 1 tiles ahead (one commit group per
    // tile, empty past the CTA's last tile, so that group n is complete after wait_group S - 1
    // at tile n). The slot of tile n + S - 1 is tile n - 1's, read before tile n - 1's barriers.
    constexpr u32 S = Src::STAGES;
    u32 atr = tr32, atc = tc32;  // the next tile to issue (tile S - 1 after the prologue)
#pragma unroll
    for (u32 k = 0; k + 1 < S; ++k, step(atr, atc)) {
        if (live(k, atr)) src.issue(p, atr, atc, k);
        Src::commit();
    }
#else
    if constexpr (PIPE)
        if (live(0, tr32)) src.fetch(p, u64{tr32} * TR + rg * RPT, u64{tc32} * TC + lx * 8, raw);
#endif
#if TK_PC_WHOLE
#pragma unroll
#endif
    for (u32 n = 0; live(n, tr32); ++n, step(tr32, tc32)) {
        const u64 tr = tr32, tc = tc32;  // row tile, column tile
        const u64 r0 = tr * TR + rg * RPT, c0 = tc * TC + lx * 8;
        float y[RPT][8];  // (rows, columns) values
        // PIPE: the loads of this CTA's next tile, into raw (dead once y holds its values).
        const auto prefetch = [&] {
            u32 ntr = tr32, ntc = tc32;  // this CTA's next tile
            step(ntr, ntc);
            if (live(n + 1, ntr)) src.fetch(p, u64{ntr} * TR + rg * RPT, u64{ntc} * TC + lx * 8, raw);
        };
#if TK_PC_STAGED
        if (live(n + S - 1, atr)) src.issue(p, atr, atc, (n + S - 1) % S);
        Src::commit();
        step(atr, atc);
        src.land(n % S, y);  // waits for tile n's group: y = its values
#else
        if constexpr (PIPE) {
            src.widen(raw, y);  // raw holds tile (tr, tc)
            // Src::EARLY (a Src with few raw words): the next tile's loads go out now, in flight
            // during this whole tile (reduction, barriers, scales, codes, stores).
            if constexpr (Src::EARLY) prefetch();
        } else {
            src.rows(p, r0, c0, y);
        }
#endif
        float am[8];  // (columns,) max over this thread's rows, then over the block
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            am[j] = 0.0f;
#pragma unroll
            for (int i = 0; i < RPT; ++i) am[j] = fmaxf(am[j], fabsf(y[i][j]));
#if !TK_PC_XRED
#pragma unroll
            for (int o = LX; o < 32; o <<= 1) am[j] = fmaxf(am[j], __shfl_xor_sync(0xFFFFFFFFu, am[j], o));
#endif
        }
#if TK_PC_XRED
        {
            // Lane (ly, lx) ends with columns 8 lx + 4 (ly & 1) + 2 (ly >> 1) + {0, 1}: the xor-8
            // step keeps the half of the 8 columns named by ly & 1 and sends the other half to
            // its partner, the xor-16 step the same for ly >> 1 on the 4 kept columns.
            const bool b0 = ly & 1, b1 = ly & 2;
            float h[4];  // (columns 8 lx + 4 b0 + k,) max over 2 row groups
#pragma unroll
            for (int k = 0; k < 4; ++k)
                h[k] = fmaxf(b0 ? am[4 + k] : am[k], __shfl_xor_sync(0xFFFFFFFFu, b0 ? am[k] : am[4 + k], LX));
            float2 m2;  // (columns 8 lx + 4 b0 + 2 b1 + {0, 1},) max over the warp's 16 rows
            m2.x = fmaxf(b1 ? h[2] : h[0], __shfl_xor_sync(0xFFFFFFFFu, b1 ? h[0] : h[2], 2 * LX));
            m2.y = fmaxf(b1 ? h[3] : h[1], __shfl_xor_sync(0xFFFFFFFFu, b1 ? h[1] : h[3], 2 * LX));
            *reinterpret_cast<float2*>(&red[warp][lx * 8 + 4 * b0 + 2 * b1]) = m2;
        }
#else
        if (ly == 0)
#pragma unroll
            for (int j = 0; j < 8; ++j) red[warp][lx * 8 + j] = am[j];
#endif
#if TK_PC_ARRIVE
        static_assert(NB * TC % 32 == 0, "the scale threads are whole warps");
        if (warp < NB * TC / 32) asm volatile("bar.sync 1, %0;" ::"n"(WARPS * 32) : "memory");
        else asm volatile("bar.arrive 1, %0;" ::"n"(WARPS * 32) : "memory");
#else
        __syncthreads();
#endif
        // One thread per (scale block, column) of the tile: the block's column maximum over
        // its WPB warps, its scale (stored) and inverse (shared with the block's threads).
#if TK_PC_SF_AFTER
        float sf = 0.0f;  // a scale thread's column scale, stored after the second barrier
#endif
        if (threadIdx.x < NB * TC) {
            const u32 b = threadIdx.x / TC, c = threadIdx.x % TC;
            float a = 0.0f;
            if constexpr (TK_PC_TREE) {
                // Every partial is fmaxf(+0, ...) of absolute values: +0 .. inf, never NaN, so
                // the maximum does not depend on the order (and the chain's initial 0 is one).
                float m[WPB];  // (warps,) the block's warps' partial maxima
#pragma unroll
                for (int w = 0; w < WPB; ++w) m[w] = red[b * WPB + w][c];
#pragma unroll
                for (int s = 1; s < WPB; s <<= 1)
#pragma unroll
                    for (int w = 0; w + s < WPB; w += 2 * s) m[w] = fmaxf(m[w], m[w + s]);
                a = m[0];
            } else {
#pragma unroll
                for (int w = 0; w < WPB; ++w) a = fmaxf(a, red[b * WPB + w][c]);
            }
#if TK_PC_SF_AFTER
            sf = share_scale(a, b, c, inv_s);
#else
            put_scale(p, tr, tc, b, c, a, inv_s);
#endif
        }
        __syncthreads();
#if TK_PC_SF_AFTER
        if (threadIdx.x < NB * TC) store_scale(p, tr, tc, threadIdx.x / TC, threadIdx.x % TC, sf);
#endif
        float inv[8];  // (columns,) inverse scales of this thread's block
        get_inv(inv_s, warp / WPB, lx, inv);
#if TK_TRANSPOSE
        // The transposed tile wants, per column, the codes of the thread's 4 rows as one word
        // (row i in byte i): each column's 4 scaled values go through e4m3_pack4 directly (the
        // same 2 conversions per 4 values as the row words, no byte gather afterwards).
        u32 cw[8];  // (columns,) rows 4 rg .. +3 of column lx * 8 + j as one word
#pragma unroll
        for (int j = 0; j < 8; ++j)
            cw[j] = tkq::e4m3_pack4(__fmul_rn(y[0][j], inv[j]), __fmul_rn(y[1][j], inv[j]), __fmul_rn(y[2][j], inv[j]),
                                    __fmul_rn(y[3][j], inv[j]));
#else
        u32 q[RPT][2];  // (rows, 8 codes as 2 words)
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            float z[8];  // (columns,) scaled values
#pragma unroll
            for (int j = 0; j < 8; ++j) z[j] = __fmul_rn(y[i][j], inv[j]);
            q[i][0] = tkq::e4m3_pack4(z[0], z[1], z[2], z[3]);
            q[i][1] = tkq::e4m3_pack4(z[4], z[5], z[6], z[7]);
        }
#endif
        // Otherwise the loads of the next tile go out now (fewer registers live: the codes
        // instead of y), to be in flight during this tile's stores.
        if constexpr (PIPE && !Src::EARLY) prefetch();
#if TK_TRANSPOSE
        u8* const st = stage + lx * 8 * ROW_PITCH + rg * RPT;  // column lx * 8, rows 4 rg ..
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            // Lanes lx >= 4 write column (s + 4) % 8 of theirs at step s: their bank
            // (8 lx + j + rg) % 32 would otherwise repeat that of lane lx - 4 (2-way).
            const bool hi = lx >= 4;
            const int jb = (s + 4) % 8;
            *reinterpret_cast<u32*>(st + (hi ? jb : s) * ROW_PITCH) = hi ? cw[jb] : cw[s];
        }
        __syncthreads();
        // 512 chunks of 16 bytes: chunk ch is bytes 16 (ch % 8) .. +16 of column ch / 8, so
        // 8 consecutive threads write one column's 128 contiguous bytes per instruction (full
        // sectors); shared banks (column + 4 (ch % 8) + t) % 32 are distinct across a warp.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 ch = threadIdx.x + 256 * h, col = ch / 8, part = ch % 8;
            u32 w[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) w[u] = *reinterpret_cast<const u32*>(stage + col * ROW_PITCH + part * 16 + 4 * u);
            u8* dst = reinterpret_cast<u8*>(p.out) + (tc * TC + col) * p.m + tr * TR + part * 16;  // (16,) of out row
            tkq::store_bytes<16, VECIO>(dst, w);
        }
#else
        {
            // One 64-bit address for row r0, stepped by the row pitch K; the rows < M test as a
            // u32 count (rows of this thread inside the output: 0 .. RPT).
            u8* o = reinterpret_cast<u8*>(p.out) + r0 * p.k + c0;  // (8,) of out row r0
            u32 rows;                                              // rows of this thread inside the output
            if constexpr (TK_PC_ROWS32) {
                const u32 m32 = (u32)p.m, r32 = (u32)r0;
                rows = m32 > r32 ? min(m32 - r32, u32{RPT}) : 0u;
            } else {
                rows = p.m > r0 ? (u32)min(p.m - r0, u64{RPT}) : 0u;
            }
#pragma unroll
            for (int i = 0; i < RPT; ++i, o += p.k)
                if ((u32)i < rows) tkq::store_bytes<8, VECIO>(o, q[i]);
        }
#endif
        // red (and stage) are reused by the next tile. The transposed output keeps this barrier
        // (stage); the row-major one needs none (TK_PC_NO_END_BARRIER). Every thread of the
        // CTA runs the same tiles (live() and step() depend only on CTA-uniform values) and
        // every warp meets each barrier once per tile (with TK_PC_ARRIVE the first one as a
        // bar.sync or a bar.arrive on barrier 1, chosen per warp), so barrier k of each thread
        // is the same one. With TK_PC_ARRIVE a warp that only arrives at the first barrier
        // does not wait there; "after leaving" it below holds for the scale threads, which
        // leave it only once every warp has arrived, and that is all the argument uses.
        // The two shared arrays, between tile n and tile n + 1:
        //   red: the scale threads read tile n's before they arrive at tile n's second barrier;
        //     a warp writes tile n + 1's only after leaving that barrier, which needs every
        //     thread's arrival (no WAR race); tile n + 1's reads follow its first barrier, so
        //     after every warp's write (RAW).
        //   inv_s: every thread reads tile n's (after tile n's second barrier) before it
        //     arrives at tile n + 1's first barrier; the scale threads write tile n + 1's only
        //     after leaving that barrier (no WAR race); tile n + 1's reads follow its second
        //     barrier (RAW).
        // Nothing else in shared memory (the column scales, codes and prefetched raw words are
        // global stores, loads and registers); tile n + 2 against n + 1 is the same argument.
        // A warp done with its stores starts the next tile's widen and maxima instead of
        // waiting for the slowest warp. H200 (session 9): 0.1-1.6 % faster (mean 1.006) with
        // the column scales stored after the second barrier (that ordering is not kept), the
        // one measurement of this form; alone in session 7: 0.9999.
        if constexpr (!(TK_PC_NO_END_BARRIER && !TK_TRANSPOSE)) __syncthreads();
    }
}

// Plain fp32 (IN 0) or bf16 (IN 1) rows of x: y = fp32(x[r, c]).
template <int IN>
struct PlainSrc : RowwiseLoad<PlainSrc<IN>> {
    static constexpr bool PIPE = true, EARLY = false;
    static constexpr int W = tkq::Frag<IN>::BYTES / 4;
    struct Raw {
        u32 w[RPT][W];  // (rows, words) of x rows r0 .. r0 + 3 (every row < M: full tiles)
    };
    // The raw words of y[r0 + i, c0 .. c0 + 8) for i < RPT.
    static __device__ __forceinline__ void fetch(const Params& p, u64 r0, u64 c0, Raw& raw) {
        // Every tile is full (per_channel_cast_and_transpose validated M % 128 == 0).
        constexpr int B = IN == 0 ? 4 : 2;
        const u8* a = reinterpret_cast<const u8*>(p.x) + (r0 * p.ldx + c0) * B;  // (8,) of x row r0
        const u64 pitch = p.ldx * B;                                              // row pitch in bytes
#pragma unroll
        for (int i = 0; i < RPT; ++i, a += pitch) tkq::load_bytes<tkq::Frag<IN>::BYTES, VECIO>(a, raw.w[i]);
    }
    static __device__ __forceinline__ void widen(const Raw& raw, float (&y)[RPT][8]) {
#pragma unroll
        for (int i = 0; i < RPT; ++i) tkq::widen8<IN>(raw.w[i], y[i]);
    }
    static __device__ __forceinline__ void load(const Params& p, u64 r, u64 c0, float (&v)[8]) {
        constexpr int B = IN == 0 ? 4 : 2;
        tkq::load8<IN, VECIO>(reinterpret_cast<const u8*>(p.x) + (r * p.ldx + c0) * B, v);
    }
};

}  // namespace pc

// ---------------------------------------------------------------------------------------------
// tile_kernel_bf16: tile_kernel for a Src whose values are bf16 numbers (the SwiGLU forward's
// bf16 activations), handed over as their raw words: Src::rows_bf16(p, r0, c0, b) gives
// b[i][t] = the bf16 pair (column c0 + 2t in the low half, c0 + 2t + 1 in the high half) of row
// r0 + i. Same outputs as tile_kernel over the widened values, bit for bit; NoPipe Src and
// TK_PC_RUN 1 only. Used by swiglu_forward_and_per_channel_cast_and_transpose only. It differs
// from tile_kernel in three ways, each measured on the H200 against tile_kernel's way (session
// 10, D1, 2 interleaved rounds, CUPTI medians; "slower": the old way's time over this one's):
// * Packed maxima: the column maxima on the packed bf16 words (abs.bf16x2 on the FMA pipe,
//   max.bf16x2 on 2 columns at once) through the rows and the warp's shuffles, and the warps'
//   partial maxima stored packed (one 16-byte store per lane); the scale threads reduce the
//   packed partials and unpack their column. Per thread and tile (sm_90a): 16 SHFL -> 8,
//   48 FMNMX -> 8 VHMNMX (3 inputs) + 8 HMNMX2 (ALU) + 16 HFMA2 (abs, FMA pipe), 2 STS.128 -> 1.
//   Bit for bit fmaxf's chain from +0: the bf16 values widen exactly, max.bf16x2 ignores a NaN
//   lane like fmaxf (the fold starts at +0, so a lane of only NaN ends as +0 too), and |x| is +0
//   for both zeros (CPU model: tile_bf16_model::packed_maxima in the op's .rs). The tile's 16
//   words live instead of its 32 widened values until the codes are made (fewer registers
//   across the barriers; no spill on sm_90a, where tile_kernel spilled 4-20 bytes). The fp32
//   maxima of the widened values (knob TK_PCB_PACKMAX 0) were 0-2.8 % slower (mean 1.2 %; plain
//   rows 1.7-2.8 %, transposed 0.5-0.9 %).
// * Skewed staging (transposed output): the staged codes at column pitch SK_PITCH = 144 bytes,
//   each group of 8 columns (one lane's) 16 bytes further than the last: a lane's staging stores
//   go to base + s * 144 (no per-step address or value selects: the banks 4 lx + 4 s + rg are
//   distinct across a warp without tile_kernel's rotation), and the 16-byte chunks of the output
//   are read as one LDS.128 each (16-byte aligned; 8 threads per column read 128 contiguous
//   bytes: no conflict) instead of 4 LDS.32. Per thread and tile: ~24 SEL / IADD3 and 6 LDS
//   fewer (CPU model: tile_bf16_model::skewed_staging). tile_kernel's rotated staging (knob
//   TK_PCB_SKEW 0) was 0.5-2.3 % slower on the transposed rows (mean 1.4 %).
// * The 2D grid: the CTA's tiles read off the 2D grid of per-tile CTAs that the op launches
//   (PerChannelGrid::Tiles: gridDim.x = K / 64 column tiles, gridDim.y row tiles or 65535):
//   column tile blockIdx.x, row tiles blockIdx.y, + gridDim.y, ... No division for the first
//   tile and no K / 64 kept across the tile (sm_90a: its register was spilled, one STL per CTA
//   and one LDL per tile). tile_kernel's division and (step_r, step_c) carry stepping (knob
//   TK_PCB_GRID2D 0) was 2.2-4.4 % slower (mean 3.3 %).

namespace pc {

constexpr int SK_PITCH = 144;               // staged bytes per column
constexpr int SK_GROUP = 8 * SK_PITCH + 16;  // bytes per group of 8 columns

template <class Src>
__device__ __forceinline__ void tile_kernel_bf16(const Params& p) {
    static_assert(!Src::PIPE && TK_PC_RUN == 1, "per-tile CTAs of a NoPipe Src");
    __shared__ __align__(16) u32 red[WARPS][TC / 2];  // (warps, column pairs) packed partial maxima
    __shared__ __align__(16) float inv_s[NB][TC];     // (scale blocks, columns) inverse scales
#if TK_TRANSPOSE
    __shared__ __align__(16) u8 stage[TC / 8 * SK_GROUP];  // (column groups, 8 columns, rows + pad) e4m3 codes
#endif
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32, lx = lane % LX, ly = lane / LX;
    const u32 rg = warp * LY + ly;  // row group: rows 4 rg .. 4 rg + 3 of the tile
    const u32 tiles_r = (u32)((p.m + TR - 1) / TR);
    u32 tr32 = blockIdx.y;
    const u32 tc32 = blockIdx.x;  // this CTA's current tile
    while (tr32 < tiles_r) {
        const u64 tr = tr32, tc = tc32;  // row tile, column tile
        const u64 r0 = tr * TR + rg * RPT, c0 = tc * TC + lx * 8;
        u32 bw[RPT][4];  // (rows, column pairs) bf16 values
        Src::rows_bf16(p, r0, c0, bw);
        {
            u32 am[4];  // (column pairs,) packed max |y| over this thread's rows, then the warp's
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                am[t] = 0;
#pragma unroll
                for (int i = 0; i < RPT; ++i) am[t] = tkq::bf16x2_max(am[t], tkq::bf16x2_abs(bw[i][t]));
#pragma unroll
                for (int o = LX; o < 32; o <<= 1) am[t] = tkq::bf16x2_max(am[t], __shfl_xor_sync(0xFFFFFFFFu, am[t], o));
            }
            if (ly == 0) *reinterpret_cast<uint4*>(&red[warp][lx * 4]) = make_uint4(am[0], am[1], am[2], am[3]);
        }
        __syncthreads();
        // One thread per (scale block, column) of the tile: the block's column maximum over
        // its WPB warps, its scale (stored) and inverse (shared with the block's threads).
        if (threadIdx.x < NB * TC) {
            const u32 sb = threadIdx.x / TC, c = threadIdx.x % TC;
            u32 m2 = 0;  // (2,) packed maxima of columns c & ~1, c | 1 (+0 start: NaN -> 0)
#pragma unroll
            for (int w = 0; w < WPB; ++w) m2 = tkq::bf16x2_max(m2, red[sb * WPB + w][c / 2]);
            const float a = __uint_as_float(c % 2 ? m2 & 0xFFFF0000u : m2 << 16);
            put_scale(p, tr, tc, sb, c, a, inv_s);
        }
        __syncthreads();
        float inv[8];  // (columns,) inverse scales of this thread's block
        get_inv(inv_s, warp / WPB, lx, inv);
        float y[RPT][8];  // (rows, columns) the values, widened
#pragma unroll
        for (int i = 0; i < RPT; ++i)
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                y[i][2 * t] = __uint_as_float(bw[i][t] << 16);
                y[i][2 * t + 1] = __uint_as_float(bw[i][t] & 0xFFFF0000u);
            }
#if TK_TRANSPOSE
        u32 cw[8];  // (columns,) rows 4 rg .. +3 of column lx * 8 + j as one word (row i in byte i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
            cw[j] = tkq::e4m3_pack4(__fmul_rn(y[0][j], inv[j]), __fmul_rn(y[1][j], inv[j]), __fmul_rn(y[2][j], inv[j]),
                                    __fmul_rn(y[3][j], inv[j]));
        {
            u8* const st = stage + lx * SK_GROUP + rg * RPT;  // column lx * 8, rows 4 rg ..
#pragma unroll
            for (int s = 0; s < 8; ++s) *reinterpret_cast<u32*>(st + s * SK_PITCH) = cw[s];
        }
        __syncthreads();
        // 512 chunks of 16 bytes: chunk ch is bytes 16 (ch % 8) .. +16 of column ch / 8.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 ch = threadIdx.x + 256 * h, col = ch / 8, part = ch % 8;
            const uint4 q = *reinterpret_cast<const uint4*>(stage + col / 8 * SK_GROUP + col % 8 * SK_PITCH + part * 16);
            const u32 w[4] = {q.x, q.y, q.z, q.w};  // (16,) codes of column col, rows 16 part ..
            u8* dst = reinterpret_cast<u8*>(p.out) + (tc * TC + col) * p.m + tr * TR + part * 16;  // (16,) of out row
            tkq::store_bytes<16, VECIO>(dst, w);
        }
#else
        {
            u8* o = reinterpret_cast<u8*>(p.out) + r0 * p.k + c0;  // (8,) of out row r0
            const u32 rows = p.m > r0 ? (u32)min(p.m - r0, u64{RPT}) : 0u;  // rows inside the output
#pragma unroll
            for (int i = 0; i < RPT; ++i, o += p.k) {
                float z[8];  // (columns,) scaled values
#pragma unroll
                for (int j = 0; j < 8; ++j) z[j] = __fmul_rn(y[i][j], inv[j]);
                const u32 q[2] = {tkq::e4m3_pack4(z[0], z[1], z[2], z[3]), tkq::e4m3_pack4(z[4], z[5], z[6], z[7])};  // (8 codes,)
                if ((u32)i < rows) tkq::store_bytes<8, VECIO>(o, q);
            }
        }
#endif
        // red, inv_s (and stage) are reused by the next tile (tile_kernel's argument).
        __syncthreads();
        tr32 += gridDim.y;  // the next tile: the same column tile, gridDim.y row tiles further
    }
}

}  // namespace pc
