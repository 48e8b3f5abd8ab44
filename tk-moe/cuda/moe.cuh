// tk-moe: device helpers shared by the routing kernels (include as "tk/moe.cuh").
#pragma once
#include "tk/common.cuh"

namespace tkm {

using tk::i32;
using tk::i64;
using tk::u32;
using tk::u64;
using tk::u8;

// The GPU reading of the index contract (tk_moe::index): `v` when 0 <= v < upper, else -1.
// Every kernel reads its index inputs through this, so no illegal entry is ever dereferenced.
template <typename I>
__device__ __forceinline__ i64 legal_or_minus_one(I v, i64 upper) {
    const i64 w = (i64)v;
    return (w >= 0 && w < upper) ? w : -1;
}

// ----- one-launch exact histograms (aux_fi, group_count) over the whole GPU ----------------
//
// A grid of COUNT_THREADS-thread CTAs (as many as the entries need, up to a few per SM): each
// CTA counts its grid-stride share of the entries into a shared-memory histogram and adds its
// non-zero bins to the per-stream workspace's integer counters with global atomics (integer
// sums: exact, whatever the order). The last CTA to finish (ticket counter, last_block_done)
// reads every total while resetting the counters to zero (atomicExch) and writes the output, so
// the workspace is all zeros again when the kernel ends: no memset launch, graph-safe.
constexpr u32 COUNT_THREADS = 256;
constexpr u32 COUNT_BINS = 8192;  // bins up to which a CTA histograms in shared memory (32 KiB)
constexpr int COUNT_PAIRS = 4;    // pairs per thread in flight (64 B of loads per thread)

// The workspace of the ops that finish in their last CTA (src/workspace.rs): word 0 is the
// ticket counter, words 1.. the counters of grid_histogram; all zero between kernels.
constexpr u32 WS_TICKET = 0;
constexpr u32 WS_BINS = 1;

// Block-wide (every thread calls it): true in every thread of the last CTA to arrive, after
// which that CTA sees every global write and atomic the other CTAs made before arriving. Resets
// the ticket to zero in the last CTA (every other CTA has taken its ticket by then). The pattern
// of a grid barrier: the CTA barrier orders its threads' accesses before thread 0's fence and
// ticket; one thread fences (a fence per thread would cost a MEMBAR each). The ticket is
// reset AFTER the acquire fence: a fence waits until the thread's earlier memory operations are
// performed, so a reset issued before it put one more L2 round trip (the reset's) on the last
// CTA's critical path; after it, nothing waits for the reset (nobody reads the ticket again in
// this launch; the next launch on the stream sees it zero).
//
// The two fences are `fence.acq_rel.gpu` (SASS `MEMBAR.ALL.GPU`): a release fence
// before the ticket's atomic and an acquire fence after it is the PTX memory model's
// message-passing pattern (release and acquire patterns through the ticket: the CTAs' writes
// happen before the last CTA's reads; the CTA barrier before thread 0's fence makes the other
// threads' writes part of it, as for the SC fence). The sequentially consistent
// `fence.sc.gpu` (`__threadfence()`, SASS `MEMBAR.SC.GPU`) adds a total order over all SC
// fences that nothing here needs, and measured ~1 % slower on the H200 (two fences on the last
// CTA's critical path).
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

__device__ __forceinline__ bool last_block_done(u32* ws) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        fence_acq_rel_gpu();  // release: this CTA's global writes and atomics before its ticket
        last = atomicAdd(ws + WS_TICKET, 1u) == gridDim.x - 1;
        if (last) {
            fence_acq_rel_gpu();  // acquire: the other CTAs' writes are seen from here on
            atomicExch(ws + WS_TICKET, 0u);
        }
    }
    __syncthreads();
    return last;
}

// Entries 2j and 2j + 1 of the flat (T*K = N entries) view of idx (row stride ld), -1 past the
// end. flat: idx is one contiguous, 16-byte aligned run (one 16-byte load per pair).
__device__ __forceinline__ void load_pair(const i64* __restrict__ idx, u64 ld, u32 K, u64 N, bool flat, u64 j,
                                          i64& a, i64& b) {
    const u64 i = 2 * j;
    a = b = -1;
    if (i >= N) return;
    if (flat && i + 1 < N) {
        const longlong2 v = __ldg(reinterpret_cast<const longlong2*>(idx) + j);
        a = v.x;
        b = v.y;
        return;
    }
    a = __ldg(idx + (i / K) * ld + i % K);
    if (i + 1 < N) b = __ldg(idx + ((i + 1) / K) * ld + (i + 1) % K);
}

// Adds 1 to the count of bin v - lo for an entry v in [lo, hi): hist holds REPL copies of each
// bin, lane l of every warp adding to copy l % REPL (with 32 copies the lanes of a warp never
// hit the same address, whatever the ids: no serialised shared atomics when the ids are few).
template <u32 REPL>
__device__ __forceinline__ void tally(u32* hist, i64 v, i64 lo, i64 hi, u32 lane) {
    if (v >= lo && v < hi) atomicAdd(hist + (u64)(v - lo) * REPL + lane % REPL, 1u);
}

// Counts the entries in [lo, hi) with flat index < N of the pairs j = first + g + ng*r
// (r = 0, 1, ..: thread g of ng) into hist (shared, REPL copies per bin, or global counters),
// R pairs per thread loaded before they are counted. Every thread runs the first round (its
// loads predicated off past the end) and calls init() (block-wide: every thread calls it;
// `[] {}` for none) after issuing that round's loads and before counting them: the grid
// histogram zeroes its shared histogram there, so the zeroing and its barrier run while the
// first loads are in flight.
template <u32 REPL, int R, class Init>
__device__ __forceinline__ void count_pairs(u32* hist, const i64* __restrict__ idx, u64 ld, u32 K, u64 N, bool flat,
                                            i64 lo, i64 hi, u64 first, u32 g, u32 ng, Init init) {
    const u32 lane = threadIdx.x % 32;
    const u64 pairs = (N + 1) / 2;
    bool once = true;
    u64 j0 = first + g;
    do {
        i64 a[R], b[R];  // (R,) pairs of entries
#pragma unroll
        for (int r = 0; r < R; ++r) load_pair(idx, ld, K, N, flat, j0 + (u64)r * ng, a[r], b[r]);
        if (once) init();
        once = false;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            tally<REPL>(hist, a[r], lo, hi, lane);
            tally<REPL>(hist, b[r], lo, hi, lane);
        }
        j0 += (u64)ng * R;
    } while (j0 < pairs);
}

// Bins up to which histograms keep 32 lane copies per bin (32 KiB of shared memory).
constexpr u32 REPL_BINS = 256;

// Folds the REPL copies of each of the `bins` bins of hist into sums (shared; block-wide, the
// caller synchronises before and after). Rotated reads: no bank conflicts.
template <u32 REPL>
__device__ __forceinline__ void fold_copies(u32* sums, const u32* hist, u32 bins) {
    for (u32 e = threadIdx.x; e < bins; e += blockDim.x) {
        u32 c = 0;
#pragma unroll
        for (u32 l = 0; l < REPL; ++l) c += hist[e * REPL + (l + e) % REPL];
        sums[e] = c;
    }
}

// Bins up to which grid_histogram finishes per bin (one returning atomic per bin and CTA,
// every bin by its own thread): as many as a CTA has threads.
constexpr u32 ARRIVAL_BINS = COUNT_THREADS;

// Per-bin arrival finish (E <= ARRIVAL_BINS): the workspace holds, for each bin e, one 64-bit word
// (arrivals << 32) | count at u64 index e (packed: 16 bins per 128-byte line; the host sizes the
// workspace to 2 * E u32 words), zero between kernels. EVERY CTA adds (1 << 32) | c (its count c, zero included) to every bin with one returning
// atomic; the CTA whose atomic returns gridDim.x - 1 arrivals is the last to touch that bin in
// this launch (atomics on one word are totally ordered and each CTA adds once), so the returned
// count plus its own is the bin's exact total: it puts it and stores 0 back to the word (same
// thread, same word, after its atomic: ordered after every add). No fence, no ticket, no second
// round: the critical path after the counts is one L2 atomic round (the ticket finish is a fenced
// RED round, the ticket round, then the exchange round). Totals < 2^31 (host: T*K <= i32::MAX), so
// the count never carries into the arrivals; gridDim.x < 2^32.
template <class Put>
__device__ __forceinline__ void finish_by_arrival(u64* ws, u32 e, u32 c, Put put) {
    unsigned long long* const w = reinterpret_cast<unsigned long long*>(ws) + e;
    const u64 old = atomicAdd(w, (1ull << 32) | c);
    if ((u32)(old >> 32) != gridDim.x - 1) return;
    put(e, (u32)old + c);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(w), "l"(0ull) : "memory");
}

// The exact count c_e of the entries equal to e of idx (T, K) row stride ld (N = T*K entries),
// for every e in [0, E): calls put(e, c_e) once per bin, from one thread (of the last CTA to
// finish, or, per-bin arrival, of the last CTA to reach that bin). ws: the zeroed workspace
// (1 + E words, or 2 * E words with the per-bin arrival; left zeroed).
// E <= COUNT_BINS: each CTA counts into a shared histogram (32 lane copies per bin for
// E <= REPL_BINS, folded after counting); E <= ARRIVAL_BINS finishes per bin
// (finish_by_arrival), larger E adds its non-zero bins to ws and finishes in the last CTA;
// larger E than COUNT_BINS: every entry is one global atomic on ws.
template <u32 E, class Put>
__device__ __forceinline__ void grid_histogram(u32* ws, const i64* __restrict__ idx, u64 ld, u32 K, u64 N, bool flat,
                                               Put put) {
    constexpr bool SHARED = E <= COUNT_BINS;
    constexpr bool ARRIVAL = E <= ARRIVAL_BINS;
    constexpr u32 W = SHARED ? E : 1;
    constexpr u32 REPL = E <= REPL_BINS ? 32 : 1;
    __shared__ u32 hist[W * REPL];            // (W, REPL) this CTA's counts (SHARED)
    __shared__ u32 tot[REPL > 1 ? W : 1];     // (W,) the folded copies (REPL > 1)
    u32* const bins = ws + WS_BINS;           // (E,) the grid's counts (ticket finish)
    const u32 g = blockIdx.x * COUNT_THREADS + threadIdx.x, ng = gridDim.x * COUNT_THREADS;
    if (SHARED) {
        const auto zero = [&] {
            for (u32 i = threadIdx.x; i < W * REPL; i += COUNT_THREADS) hist[i] = 0;
            __syncthreads();
        };
        count_pairs<REPL, COUNT_PAIRS>(hist, idx, ld, K, N, flat, 0, E, 0, g, ng, zero);
        __syncthreads();
        if (REPL > 1) {
            fold_copies<REPL>(tot, hist, W);
            __syncthreads();
        }
        const u32* sums = REPL > 1 ? tot : hist;  // (W,) this CTA's count per bin
        if (ARRIVAL) {
            static_assert(!ARRIVAL || REPL > 1, "the arrival finish reads the folded counts");
            // One bin per thread (E <= COUNT_THREADS); reads the thread's own fold (e = thread).
            if (threadIdx.x < E)
                finish_by_arrival(reinterpret_cast<u64*>(ws), threadIdx.x, sums[threadIdx.x], put);
            return;
        }
        for (u32 e = threadIdx.x; e < W; e += COUNT_THREADS)
            if (sums[e] != 0) atomicAdd(bins + e, sums[e]);
    } else {
        count_pairs<1, COUNT_PAIRS>(bins, idx, ld, K, N, flat, 0, E, 0, g, ng, [] {});
    }
    if (!last_block_done(ws)) return;
    for (u32 e = threadIdx.x; e < E; e += COUNT_THREADS) put(e, atomicExch(bins + e, 0u));
}

// The flat slot i = t*K + k of a legal slot targeting fused row p (the one tk_expand_mark
// recorded), or T*K when no slot targets p (see row_targeted).
__device__ __forceinline__ u64 targeting_slot(const u32* __restrict__ src, const i32* __restrict__ ttp, u64 ld_ttp,
                                              u64 T, u32 K, u64 M, u64 p) {
    const u64 i = src[p];
    if (i >= T * K) return T * K;
    return legal_or_minus_one(__ldg(ttp + (i / K) * ld_ttp + i % K), (i64)M) == (i64)p ? i : T * K;
}

// expand_to_fused(_with_sf): true when fused row p is targeted by a legal slot. src[p] is written
// by tk_expand_mark (the flat slot i = t*K + k of one slot targeting p) for every targeted row
// and left uninitialised otherwise; it must name a slot i < T*K whose position is p. A stale
// value can only pass by naming a slot that does target p, so the answer is exact without
// zero-initialising src.
__device__ __forceinline__ bool row_targeted(const u32* __restrict__ src, const i32* __restrict__ ttp, u64 ld_ttp,
                                             u64 T, u32 K, u64 M, u64 p) {
    return targeting_slot(src, ttp, ld_ttp, T, K, M, p) < T * K;
}

// expand_to_fused(_with_sf): the rows no legal slot targets, 32 at a time, so that a warp's
// two dependent index loads cover 32 rows (the zero tasks are few and come first in the grid:
// their latency overlaps the copies instead of trailing them). Lane l checks row p0 + l; then
// the warp calls zero(p) (every lane) for each row p < rows that is >= M (a storage-only row)
// or not targeted (row_targeted).
template <class Zero>
__device__ __forceinline__ void warp_zero_untargeted(const u32* __restrict__ src, const i32* __restrict__ ttp,
                                                     u64 ld_ttp, u64 T, u32 K, u64 M, u64 rows, u64 p0, u32 lane,
                                                     Zero zero) {
    const u64 p = p0 + lane;
    const bool z = p < rows && (p >= M || !row_targeted(src, ttp, ld_ttp, T, K, M, p));
    for (u32 m = __ballot_sync(0xffffffffu, z); m != 0; m &= m - 1) zero(p0 + __ffs(m) - 1);
}

// One warp copies a row of `n` vectors `src` to the rows `pos` (one per slot, -1 = none) of
// `out` (rows of `n` vectors), UNROLL vectors per lane in flight. `pos_lane` holds, in lane j,
// the row of slot k0 + j for each group of 32 slots (KG groups).
template <typename V, int UNROLL, int KG>
__device__ __forceinline__ void warp_scatter_row(V* __restrict__ out, const V* __restrict__ src, u64 n,
                                                 const i64 (&pos_lane)[KG], u32 K, u32 lane) {
    for (u64 b = 0; b < n; b += 32 * UNROLL) {  // the whole warp iterates: shuffles need every lane
        const u64 c0 = b + lane;
        V v[UNROLL];  // (UNROLL,) vectors of the source row
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (c0 + u * 32 < n) v[u] = __ldg(src + c0 + u * 32);
#pragma unroll
        for (int g = 0; g < KG; ++g) {
            const u32 kn = min(32u, K - g * 32);
            for (u32 j = 0; j < kn; ++j) {
                const i64 p = __shfl_sync(0xffffffffu, pos_lane[g], j);
                if (p < 0) continue;
                V* dst = out + (u64)p * n;  // (n,) vectors
#pragma unroll
                for (int u = 0; u < UNROLL; ++u)
                    if (c0 + u * 32 < n) dst[c0 + u * 32] = v[u];
            }
        }
    }
}

// One warp writes zeros to a row of `n` vectors.
template <typename V>
__device__ __forceinline__ void warp_zero_row(V* __restrict__ row, u64 n, u32 lane) {
    const V z{};
    for (u64 c = lane; c < n; c += 32) row[c] = z;
}

}  // namespace tkm
