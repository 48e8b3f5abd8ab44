// get_fused_mapping (spec/moe.md 4.11): the expert-major layout of the legal entries of topk_idx
// (T, K), rows inside a segment in ascending flat index t*K + k. Deterministic: counts are exact
// integers and every position comes from prefix sums, never from the order of atomics.
//
// Defines: TK_K (slots per token), TK_E (experts, <= 1024).
//
// One cooperative launch in the capacity mode (tk_fused_one, at the end of this file, for
// E <= 256); otherwise two entries, launched in this order on one stream (the host-sync
// convenience reads the layout's end between them to size the row maps):
// 1. tk_fused_count_scan (B blocks of 1024): block b counts the entries of its flat chunk
//    [b*L, (b+1)*L) per expert into cnt[b, :] (shared histogram with 32 lane copies per expert
//    for E <= 256; each thread loads four 16-byte pairs of entries before counting them). The
//    last block to finish (moe.cuh last_block_done: a ticket in the per-stream workspace, which
//    it resets) then scans: per expert e, c_e = sum_b cnt[b, e] (kept in cnt[B, e], summed by
//    up to 32 threads per expert) and A_e = align(c_e, a); an exclusive block scan of A_e gives
//    expert_start; it writes start, end and A_e, and turns cnt[b, e] into the first row of
//    chunk b's entries of expert e.
// 2. tk_fused_scatter (B blocks of 256): warp w of block b owns an eighth of chunk b and walks
//    it twice, 32 entries at a time (the first 8 groups loaded before anything else): it counts
//    its entries per expert, one block-wide scan over the warps gives each warp's offsets, and
//    it places them: an entry's row is base[e] + (same-expert entries of earlier warps) +
//    (the warp's earlier same-expert entries) + (same-expert lanes below it, __match_any_sync).
//    Entries whose row would be >= M (capacity too small) get token_topk_to_pos = -1 and no row.
//    The blocks also write -1 to the padding rows: the tail of expert e's segment (block
//    e mod B) and the rows after the last segment (grid-stride).
// Positions are computed in 64 bits; values written to the int32 outputs saturate at INT32_MAX.
#include "tk/moe.cuh"

#ifndef TK_K
#error "TK_K must be defined"
#endif
#ifndef TK_E
#error "TK_E must be defined"
#endif

using namespace tkm;
constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr i64 I32_MAX = 2147483647;

__device__ __forceinline__ i32 sat_i32(i64 v) { return (i32)(v < I32_MAX ? v : I32_MAX); }

// Threads per expert in the scan: a power of two <= 32 (one warp segment) with
// E_pad * G <= SCAN_THREADS, E_pad the next power of two >= E.
constexpr int SCAN_THREADS = 1024;
__host__ __device__ constexpr int pow2_at_least(int v) { return v <= 1 ? 1 : 2 * pow2_at_least((v + 1) / 2); }
constexpr int SCAN_G =
    SCAN_THREADS / pow2_at_least(TK_E) < 32 ? SCAN_THREADS / pow2_at_least(TK_E) : 32;

// Exclusive block scan (a multiple of 32 threads, at most 1024) of one i64 per thread.
__device__ __forceinline__ i64 block_exclusive_scan(i64 v, i64* warp_sums) {
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    i64 incl = v;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
        const i64 o = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += o;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        i64 s = lane < blockDim.x / 32 ? warp_sums[lane] : 0;
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
            const i64 o = __shfl_up_sync(0xffffffffu, s, d);
            if (lane >= d) s += o;
        }
        warp_sums[lane] = s;  // inclusive over warps
    }
    __syncthreads();
    return incl - v + (warp > 0 ? warp_sums[warp - 1] : 0);
}

// The scan of the last block. cnt: (B + 1, E) i32; rows 0..B in: chunk counts (written by
// other blocks of this launch: read through L2 with __ldcg), out: first row of each chunk's
// entries (saturated); row B out: c_e (the raw counts); expert_start, expert_end,
// num_tokens_per_expert: (E,) i32. SCAN_G consecutive threads per expert (a warp segment)
// share its B chunks (the first CB of each thread kept in registers between the two passes),
// scan their partial sums with shuffles, and one block scan over the experts gives the
// segment starts.
__device__ __forceinline__ void scan_chunks(i32* __restrict__ cnt, u64 B, i64 a, i32* __restrict__ expert_start,
                                            i32* __restrict__ expert_end,
                                            i32* __restrict__ num_tokens_per_expert) {
    __shared__ i64 warp_sums[32];
    __shared__ i64 seg[SCAN_THREADS];  // (E,) A_e, then expert_start
    const u32 e = threadIdx.x / SCAN_G, s = threadIdx.x % SCAN_G;
    const bool active = e < TK_E;
    const u64 per = (B + SCAN_G - 1) / SCAN_G, b0 = min(s * per, B), b1 = min(b0 + per, B);
    constexpr int CB = 8;  // chunk counts loaded together
    i32 head[CB];          // (CB,) counts of chunks b0 .. b0 + CB (0 past b1)
#pragma unroll
    for (int r = 0; r < CB; ++r) head[r] = active && b0 + r < b1 ? __ldcg(cnt + (b0 + r) * TK_E + e) : 0;
    i64 local = 0;  // this thread's chunks of expert e
#pragma unroll
    for (int r = 0; r < CB; ++r) local += head[r];
    for (u64 b = b0 + CB; active && b < b1; b += CB) {
        i32 c[CB];  // (CB,) counts of chunks b ..
#pragma unroll
        for (int r = 0; r < CB; ++r) c[r] = b + r < b1 ? __ldcg(cnt + (b + r) * TK_E + e) : 0;
#pragma unroll
        for (int r = 0; r < CB; ++r) local += c[r];
    }
    i64 incl = local;  // inclusive scan within the expert's segment of SCAN_G lanes
#pragma unroll
    for (int d = 1; d < SCAN_G; d *= 2) {
        const i64 o = __shfl_up_sync(0xffffffffu, incl, d, SCAN_G);
        if (s >= d) incl += o;
    }
    const i64 total = __shfl_sync(0xffffffffu, incl, SCAN_G - 1, SCAN_G);  // c_e
    const i64 len = (total + a - 1) / a * a;                               // A_e
    if (active && s == 0) seg[e] = len;
    __syncthreads();
    const i64 start_t = block_exclusive_scan(threadIdx.x < TK_E ? seg[threadIdx.x] : 0, warp_sums);
    __syncthreads();  // every seg[] read is done
    if (threadIdx.x < TK_E) seg[threadIdx.x] = start_t;
    __syncthreads();
    if (!active) return;
    const i64 start = seg[e];
    if (s == 0) {
        cnt[B * TK_E + e] = (i32)total;  // <= T*K <= INT32_MAX
        expert_start[e] = sat_i32(start);
        expert_end[e] = sat_i32(start + len);
        num_tokens_per_expert[e] = sat_i32(len);
    }
    i64 run = start + incl - local;
#pragma unroll
    for (int r = 0; r < CB; ++r) {
        if (b0 + r < b1) cnt[(b0 + r) * TK_E + e] = sat_i32(run);
        run += head[r];
    }
    for (u64 b = b0 + CB; b < b1; b += CB) {
        i32 c[CB];  // (CB,) counts of chunks b ..
#pragma unroll
        for (int r = 0; r < CB; ++r) c[r] = b + r < b1 ? __ldcg(cnt + (b + r) * TK_E + e) : 0;
#pragma unroll
        for (int r = 0; r < CB; ++r) {
            if (b + r < b1) cnt[(b + r) * TK_E + e] = sat_i32(run);
            run += c[r];
        }
    }
}

// cnt: (B + 1, E) i32 scratch (B = gridDim.x; row b written by block b, then all rows by the
// scan); ws: the per-stream zeroed workspace (word 0: the ticket, left zero); idx: (T, K) i64
// row stride ld (flat: one contiguous 16-byte aligned run); expert_start, expert_end,
// num_tokens_per_expert: (E,) i32. L (the chunk length) is a multiple of 256.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
    tk_fused_count_scan(i32* __restrict__ cnt, u32* __restrict__ ws, const i64* __restrict__ idx, u64 ld, u64 T,
                        u64 L, u32 flat, i64 a, i32* __restrict__ expert_start, i32* __restrict__ expert_end,
                        i32* __restrict__ num_tokens_per_expert) {
    constexpr u32 REPL = TK_E <= REPL_BINS ? 32 : 1;
    __shared__ u32 hist[TK_E * REPL];       // (E, REPL) counts of this chunk
    __shared__ u32 tot[REPL > 1 ? TK_E : 1];  // (E,) the folded copies (REPL > 1)
    for (u32 i = threadIdx.x; i < TK_E * REPL; i += SCAN_THREADS) hist[i] = 0;
    __syncthreads();
    const u64 begin = blockIdx.x * L, end = min(begin + L, T * TK_K);  // begin is even
    count_pairs<REPL, 4>(hist, idx, ld, TK_K, end, flat != 0, 0, TK_E, begin / 2, threadIdx.x, SCAN_THREADS, [] {});
    __syncthreads();
    if (REPL > 1) {
        fold_copies<REPL>(tot, hist, TK_E);
        __syncthreads();
    }
    const u32* sums = REPL > 1 ? tot : hist;
    for (u32 e = threadIdx.x; e < TK_E; e += SCAN_THREADS) cnt[(u64)blockIdx.x * TK_E + e] = (i32)sums[e];
    if (last_block_done(ws)) scan_chunks(cnt, gridDim.x, a, expert_start, expert_end, num_tokens_per_expert);
}

// The three row maps, token_topk_to_pos and the row count M of one launch.
struct Maps {
    i32* __restrict__ ttp;                // (T, K) i32 contiguous
    i32* __restrict__ pos_to_expert;      // (M,) i32
    i32* __restrict__ pos_to_token;       // (M,) i32
    i32* __restrict__ pos_to_token_topk;  // (M,) i32
    u64 M;
};

// Stores the maps of entry i (expert v >= 0, fused row p): its row p when p < M, else
// token_topk_to_pos = -1 only (capacity too small).
__device__ __forceinline__ void place(const Maps& m, u64 i, i64 v, i64 p) {
    if (p < (i64)m.M) {
        m.ttp[i] = (i32)p;
        m.pos_to_expert[p] = (i32)v;
        m.pos_to_token[p] = (i32)(i / TK_K);
        m.pos_to_token_topk[p] = (i32)i;
    } else {
        m.ttp[i] = -1;
    }
}

// Writes -1 to the rows first, first + step, .. below last of the three row maps.
__device__ __forceinline__ void pad_rows(const Maps& m, u64 first, u64 last, u64 step) {
    for (u64 p = first; p < last; p += step) {
        m.pos_to_expert[p] = -1;
        m.pos_to_token[p] = -1;
        m.pos_to_token_topk[p] = -1;
    }
}

constexpr int R = 8;  // groups of 32 entries per lane held in registers by the walks

// vs: (R,) this lane's entry of each group of 32 from g0 (its legal expert, or -1 past wend).
__device__ __forceinline__ void load_groups(i32 (&vs)[R], const i64* __restrict__ idx, u64 ld, u64 g0, u64 wend,
                                            u32 lane) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const u64 i = g0 + r * 32 + lane;
        vs[r] = i < wend ? (i32)legal_or_minus_one(__ldg(idx + (i / TK_K) * ld + i % TK_K), TK_E) : -1;
    }
}

// Walk 1 of a warp over its sub-chunk [wbegin, wend), 32 entries at a time: adds its entries
// per expert to my (E,) (shared, its row of wcnt). vs holds the first groups (loaded by the
// caller); afterwards it holds the last ones. The leaders of a group hold distinct experts;
// __syncwarp orders a leader's update before another lane's in the next group.
__device__ __forceinline__ void count_walk(u32* my, i32 (&vs)[R], const i64* __restrict__ idx, u64 ld, u64 wbegin,
                                           u64 wend, u32 lane) {
    for (u64 g0 = wbegin; g0 < wend; g0 += R * 32) {
        if (g0 != wbegin) load_groups(vs, idx, ld, g0, wend, lane);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const i32 v = vs[r];
            const u32 same = __match_any_sync(0xffffffffu, (u32)v);
            if (v >= 0 && __popc(same & ((1u << lane) - 1)) == 0) my[v] += __popc(same);
            __syncwarp();
        }
    }
}

// Turns the per-warp counts wcnt[.][e] (WARPS, E) into exclusive offsets over the warps (the
// entries of warp w come after those of the warps before it); returns the chunk's count of e.
__device__ __forceinline__ u32 warp_offsets(u32 (*wcnt)[TK_E], u32 e) {
    u32 run = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
        const u32 c = wcnt[w][e];
        wcnt[w][e] = run;
        run += c;
    }
    return run;
}

// Walk 2 of a warp, in flat order: places its entries at running[v] (first row of this
// block's entries of expert v) + my[v] (the warp's offset, advanced as it goes) + the
// same-expert lanes below (__match_any_sync). vs: as count_walk left it (the only groups when
// one_round).
__device__ __forceinline__ void place_walk(const Maps& m, const i64* running, u32* my, i32 (&vs)[R],
                                           const i64* __restrict__ idx, u64 ld, u64 wbegin, u64 wend, u32 lane) {
    const bool one_round = wend - wbegin <= R * 32;
    for (u64 g0 = wbegin; g0 < wend; g0 += R * 32) {
        if (!one_round) load_groups(vs, idx, ld, g0, wend, lane);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const u64 i = g0 + r * 32 + lane;
            const i32 v = vs[r];
            const u32 same = __match_any_sync(0xffffffffu, (u32)v);
            const u32 below = __popc(same & ((1u << lane) - 1));
            if (v >= 0)
                place(m, i, v, running[v] + my[v] + below);
            else if (i < wend)
                m.ttp[i] = -1;
            __syncwarp();  // every lane has read my[v] before its leader advances it
            if (v >= 0 && below == 0) my[v] += __popc(same);
            __syncwarp();
        }
    }
}

// base: (B + 1, E) i32 from tk_fused_count_scan; idx: (T, K) i64 row stride ld; ttp: (T, K) i32
// contiguous; pos_to_*: (M,) i32; expert_start, expert_end: (E,) i32 from tk_fused_count_scan.
// Warp w of block b owns the sub-chunk [b*L + w*L/8, b*L + (w+1)*L/8) (L/8 is a multiple of 32)
// and walks it twice, 32 entries at a time: first counting its entries per expert (wcnt[w, :]),
// then, after one block-wide exclusive scan of wcnt over the warps, placing them (row = the
// chunk's base + the earlier warps' count + the warp's running count + same-expert lanes below,
// __match_any_sync). Only three block barriers in all; R groups of 32 entries per lane stay in
// registers between the two walks (all of a sub-chunk on the moe12 shapes).
extern "C" __global__ void __launch_bounds__(THREADS)
    tk_fused_scatter(const i32* __restrict__ base, const i64* __restrict__ idx, u64 ld, u64 T, u64 L, u64 M,
                     i32* __restrict__ ttp, i32* __restrict__ pos_to_expert, i32* __restrict__ pos_to_token,
                     i32* __restrict__ pos_to_token_topk, const i32* __restrict__ expert_start,
                     const i32* __restrict__ expert_end) {
    const Maps maps{ttp, pos_to_expert, pos_to_token, pos_to_token_topk, M};
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const u64 sub = L / WARPS;
    const u64 wbegin = min(blockIdx.x * L + warp * sub, T * TK_K), wend = min(wbegin + sub, T * TK_K);
    i32 vs[R];  // (R,) this lane's entry of each group: its legal expert or -1
    // The first groups' entries are loaded first, so that their latency overlaps the padding
    // rows and the setup below.
    load_groups(vs, idx, ld, wbegin, wend, lane);
    // The other global values the setup needs are loaded next, before any of them is used, so
    // that the setup costs one memory round (for E <= 256): this block's chunk base of expert
    // threadIdx.x, the end of the last segment, and the first padding segment (expert b, when
    // b < E).
    const i32 base0 = threadIdx.x < TK_E ? base[(u64)blockIdx.x * TK_E + threadIdx.x] : 0;
    const u64 B = gridDim.x;
    const u64 tail = (u64)expert_end[TK_E - 1];
    u64 first = 0, last = 0;  // padding rows of expert b
    if (blockIdx.x < TK_E) {
        first = (u64)expert_start[blockIdx.x] + (u64)base[B * TK_E + blockIdx.x];
        last = min((u64)expert_end[blockIdx.x], M);
    }
    // Padding rows: the tail of each segment (experts e = b mod B), then the rows after the
    // last segment (grid-stride). Disjoint from the rows of real entries.
    for (u32 e = blockIdx.x; e < TK_E; e += gridDim.x) {
        if (e != blockIdx.x) {
            first = (u64)expert_start[e] + (u64)base[B * TK_E + e];
            last = min((u64)expert_end[e], M);
        }
        pad_rows(maps, first + threadIdx.x, last, THREADS);
    }
    pad_rows(maps, tail + (u64)blockIdx.x * THREADS + threadIdx.x, M, B * THREADS);
    __shared__ i64 running[TK_E];      // (E,) first row of this block's entries of each expert
    __shared__ u32 wcnt[WARPS][TK_E];  // (warps, E) per warp: its count, then its running offset
    for (u32 e = threadIdx.x; e < TK_E; e += THREADS) {
        running[e] = e == threadIdx.x ? base0 : base[(u64)blockIdx.x * TK_E + e];
#pragma unroll
        for (int w = 0; w < WARPS; ++w) wcnt[w][e] = 0;
    }
    __syncthreads();
    count_walk(wcnt[warp], vs, idx, ld, wbegin, wend, lane);
    __syncthreads();
    for (u32 e = threadIdx.x; e < TK_E; e += THREADS) warp_offsets(wcnt, e);
    __syncthreads();
    place_walk(maps, running, wcnt[warp], vs, idx, ld, wbegin, wend, lane);
}

// ----- one launch (capacity mode, cooperative launch) ----------------------------------------
//
// tk_fused_one (B blocks of THREADS, all co-resident: the host launches it cooperatively, B <=
// the SM count): block b runs walk 1 of the scatter on its chunk (its entries stay in registers
// when a warp's share is <= R groups), turns the per-warp counts into warp offsets and
// publishes its chunk counts cnt[b, :]; a grid barrier (ws word 0: arrivals, spun on with
// ld.acquire.gpu; word 1: departures, the last CTA to depart zeroes both); then EVERY block
// reads the (B, E) counts (G threads per expert, through L2) and computes the totals c_e, its
// own prefix sum_{b' < b} cnt[b', e], A_e and (a block scan) the segment starts, so no block
// waits for a serial scan or a second launch; block 0 writes the per-expert outputs; each block
// writes its padding rows and places its entries (walk 2) exactly as tk_fused_scatter does
// (same rows: bit-identical maps). Compiled for E <= THREADS only (one expert per thread in
// the scan); the host keeps the two launches for larger E.
#define TK_ONE_MAX_E 256  // = THREADS (a macro: the preprocessor does not see constexpr values)
#if TK_E <= TK_ONE_MAX_E
static_assert(TK_ONE_MAX_E == THREADS, "one expert per thread in tk_fused_one's scan");
// Chunk counts a thread loads at once after the grid barrier (knob, a multiple of 4: the counts
// are read as int4 vectors): 24 covers a thread's whole share (17 rounded up to 20 at B = 132,
// E = 32) in one L2 round of 5 vector loads.
#ifndef TK_ONE_CB
#define TK_ONE_CB 24
#endif
constexpr int ONE_G = THREADS / pow2_at_least(TK_E) < 32 ? THREADS / pow2_at_least(TK_E) : 32;

// Block-wide: returns when every block of the grid has called it; afterwards the block sees
// every global write the other blocks made before calling it (release fence + arrival atomic,
// acquire load + fence, then the CTA barrier: the pattern of last_block_done).
__device__ __forceinline__ void grid_barrier(u32* ws) {
    __syncthreads();
    if (threadIdx.x == 0) {
        fence_acq_rel_gpu();  // release: this CTA's writes before its arrival
        atomicAdd(ws + WS_TICKET, 1u);
        u32 arrived;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(arrived) : "l"(ws + WS_TICKET) : "memory");
        } while (arrived < gridDim.x);
        fence_acq_rel_gpu();  // acquire: the other CTAs' writes are seen from here on
    }
    __syncthreads();
}

// Block-wide, after the block's last read of what the barrier published: the last block to
// depart zeroes the arrival and departure words (every block has passed its spin by then).
__device__ __forceinline__ void grid_barrier_depart(u32* ws) {
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(ws + WS_TICKET + 1, 1u) == gridDim.x - 1) {
        atomicExch(ws + WS_TICKET, 0u);
        atomicExch(ws + WS_TICKET + 1, 0u);
    }
}

// cnt: (E, LDB) i32 scratch, LDB = B rounded up to a multiple of 4 (column b written by block
// b; expert e's chunk counts are contiguous, so a thread reads its share as int4 vectors); ws: the per-stream zeroed workspace
// (words 0 and 1, left zero); idx: (T, K) i64 row stride ld; ttp: (T, K) i32 contiguous;
// pos_to_*: (M,) i32; expert_start, expert_end, num_tokens_per_expert: (E,) i32. L (the chunk
// length) is a multiple of 256.
extern "C" __global__ void __launch_bounds__(THREADS)
    tk_fused_one(i32* __restrict__ cnt, u32* __restrict__ ws, const i64* __restrict__ idx, u64 ld, u64 T, u64 L,
                 i64 a, u64 M, i32* __restrict__ ttp, i32* __restrict__ pos_to_expert,
                 i32* __restrict__ pos_to_token, i32* __restrict__ pos_to_token_topk,
                 i32* __restrict__ expert_start, i32* __restrict__ expert_end,
                 i32* __restrict__ num_tokens_per_expert) {
    const Maps maps{ttp, pos_to_expert, pos_to_token, pos_to_token_topk, M};
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const u64 B = gridDim.x, b = blockIdx.x;
    const u64 sub = L / WARPS;
    const u64 wbegin = min(b * L + warp * sub, T * TK_K), wend = min(wbegin + sub, T * TK_K);
    i32 vs[R];  // (R,) this lane's entry of each group: its legal expert or -1
    load_groups(vs, idx, ld, wbegin, wend, lane);
    __shared__ u32 wcnt[WARPS][TK_E];  // (warps, E) per warp: its count, then its running offset
    __shared__ i64 running[TK_E];      // (E,) first row of this block's entries of each expert
    __shared__ i64 seg[TK_E];          // (E,) A_e, then the segment starts
    __shared__ u32 ctot[TK_E];         // (E,) c_e
    __shared__ i64 warp_sums[32];
    for (u32 e = threadIdx.x; e < TK_E; e += THREADS) {
#pragma unroll
        for (int w = 0; w < WARPS; ++w) wcnt[w][e] = 0;
    }
    __syncthreads();
    count_walk(wcnt[warp], vs, idx, ld, wbegin, wend, lane);
    __syncthreads();
    const u64 LDB = (B + 3) & ~3ull;
    if (threadIdx.x < TK_E) cnt[threadIdx.x * LDB + b] = (i32)warp_offsets(wcnt, threadIdx.x);
    grid_barrier(ws);
    // Expert e = threadIdx.x / ONE_G: its ONE_G threads share the B chunk counts, in runs of a
    // multiple of 4 chunks (whole int4 vectors of cnt's row e).
    const u32 e = threadIdx.x / ONE_G, s = threadIdx.x % ONE_G;
    const u64 per = ((B + ONE_G - 1) / ONE_G + 3) & ~3ull, b0 = min(s * per, B), b1 = min(b0 + per, B);
    // This thread's chunks of expert e: all, those before block b (32-bit: <= T*K <= INT32_MAX).
    i32 total = 0, before = 0;
    constexpr int CV = TK_ONE_CB / 4;  // int4 vectors of chunk counts loaded together
    static_assert(TK_ONE_CB % 4 == 0, "TK_ONE_CB must be a multiple of 4");
    const int4* row = reinterpret_cast<const int4*>(cnt + (e < TK_E ? e : 0) * LDB);  // (LDB / 4,) of expert e
    for (u64 c0 = b0; e < TK_E && c0 < b1; c0 += 4 * CV) {
        // The CV loads are unconditional (a vector past b1 re-reads the last one and is masked
        // below), so all of them issue before the first add: one L2 round per 4 * CV counts.
        int4 v[CV];  // (CV,) counts of chunks c0 .. c0 + 4 CV
#pragma unroll
        for (int r = 0; r < CV; ++r) v[r] = __ldcg(row + min(c0 / 4 + r, (b1 - 1) / 4));
        const i32 nv = (i32)(b1 - c0), nb = b > c0 ? (i32)min(b - c0, b1 - c0) : 0;  // valid, before b
#pragma unroll
        for (int r = 0; r < CV; ++r) {
            const i32 c[4] = {v[r].x, v[r].y, v[r].z, v[r].w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                total += 4 * r + j < nv ? c[j] : 0;
                before += 4 * r + j < nb ? c[j] : 0;
            }
        }
    }
#pragma unroll
    for (int d = ONE_G / 2; d >= 1; d /= 2) {
        total += __shfl_xor_sync(0xffffffffu, total, d, ONE_G);
        before += __shfl_xor_sync(0xffffffffu, before, d, ONE_G);
    }
    if (e < TK_E && s == 0) {
        ctot[e] = (u32)total;  // <= T*K <= INT32_MAX
        seg[e] = (total + a - 1) / a * a;
        running[e] = before;
    }
    __syncthreads();
    const u32 t = threadIdx.x;
    const i64 len = t < TK_E ? seg[t] : 0;
    const i64 start = block_exclusive_scan(len, warp_sums);  // synchronises: every cnt read is done
    grid_barrier_depart(ws);
    if (t < TK_E) {
        seg[t] = start;
        running[t] += start;
        if (b == 0) {
            expert_start[t] = sat_i32(start);
            expert_end[t] = sat_i32(start + len);
            num_tokens_per_expert[t] = sat_i32(len);
        }
    }
    __syncthreads();
    // Padding rows, as tk_fused_scatter: segment tails of experts b mod B, then the rows after
    // the last segment.
    const auto seg_end = [&](u32 x) { return seg[x] + ((i64)ctot[x] + a - 1) / a * a; };
    for (u32 x = blockIdx.x; x < TK_E; x += gridDim.x)
        pad_rows(maps, (u64)(seg[x] + ctot[x]) + threadIdx.x, min((u64)seg_end(x), M), THREADS);
    pad_rows(maps, (u64)seg_end(TK_E - 1) + b * THREADS + threadIdx.x, M, B * THREADS);
    place_walk(maps, running, wcnt[warp], vs, idx, ld, wbegin, wend, lane);
}
#endif
