// topk_gate: the k best columns of every row of scores (T, E), best first, in tk-gating's
// selection order (higher first, then the smaller index; NaN first; distinct indices).
//
// Defines:
//   TK_E      E, the row length (>= 1)
//   TK_K      k, picks per row (1 <= k <= E)
//   TK_NV     16-byte vectors per lane in the register path (ceil(E / 128)), or 0 for the
//             streamed path (rows too long for registers: each round re-reads the row, L1/L2)
//   TK_WARPS  warps per block
//
// One warp per token. Register path: the row sits in registers as order keys (lane l owns
// elements i*128 + 4l + v), loaded with 16-byte loads when the row is 16-byte aligned; then k
// rounds that take the best (key, index) out (WarpSelect: per-lane cached top-2, two redux.sync
// per round, a rescan of the winning lane's slots only when its cache runs dry). Streamed
// path: each round re-reads the row and picks the best element ranked after the previous pick.
// Lane r % 32 keeps pick r; the picks are stored 32 at a time as int64.
#include "gating.cuh"

#ifndef TK_E
#error "TK_E must be defined"
#endif
#ifndef TK_K
#error "TK_K must be defined"
#endif
#ifndef TK_NV
#error "TK_NV must be defined"
#endif
#ifndef TK_WARPS
#error "TK_WARPS must be defined"
#endif

using namespace tkg;

constexpr u32 E = TK_E, K = TK_K;
constexpr int NV = TK_NV, N = 4 * NV;
// Blocks per SM the register budget must allow: for rows of 1 or 2 vectors per lane (E <= 256),
// which fit in 32 registers without spilling, 2048 threads' worth (all 64 warps of an SM
// resident: T = 8001 then runs in one wave); otherwise the compiler's choice.
constexpr int MIN_BLOCKS = (NV == 1 || NV == 2) ? 2048 / (TK_WARPS * 32) : 1;
// The pick rounds of the register path are unrolled for up to 16 picks: the rounds' lane tests
// and the store of the picks become constants, and the compiler schedules across rounds.
constexpr int PICK_UNROLL = (NV > 0 && K <= 16) ? (int)K : 1;

// out: (T, K) int64 contiguous; scores: (T, E) fp32, row stride ld (elements), unit columns.
// vec: scores and ld allow 16-byte loads of row vectors.
extern "C" __global__ void __launch_bounds__(TK_WARPS * 32, MIN_BLOCKS)
    tk_topk_gate(i64* __restrict__ out, const float* __restrict__ scores, u64 ld, u32 T, u32 vec) {
    const u32 lane = threadIdx.x % 32;
    const u64 warps = (u64)gridDim.x * TK_WARPS;
    for (u64 t = (u64)blockIdx.x * TK_WARPS + threadIdx.x / 32; t < T; t += warps) {
        const float* row = scores + t * ld;  // (E,)
        i64* o = out + t * K;                // (K,)
#if TK_NV > 0
        float x[N];  // (NV vectors, 4): this lane's elements of the row
        load_row<4, N>(x, row, E, lane, vec != 0, 0.0f);
        u32 key[N];  // order keys, NONE past the row end
#pragma unroll
        for (int s = 0; s < N; ++s) key[s] = slot_index<4>(s, lane) < E ? order_key(x[s]) : NONE;
#endif
        u32 mine = 0;
#if TK_NV > 0
        WarpSelect<4, N> sel(key, lane);
#else
        u32 pk = FIRST_KEY, pj = FIRST_IDX;  // the last pick
#endif
#pragma unroll PICK_UNROLL
        for (u32 r = 0; r < K; ++r) {
#if TK_NV > 0
            const Pick p = sel.take();
#else
            Best b;
            for (u32 j0 = 4 * lane; j0 < E; j0 += 128)
#pragma unroll
                for (u32 v = 0; v < 4; ++v)
                    if (j0 + v < E) b.offer(order_key(__ldg(row + j0 + v)), j0 + v, pk, pj);
            const Pick p = b.warp_pick();
            pk = p.key;
            pj = p.idx;
#endif
            if (lane == r % 32) mine = p.idx;
            if (r % 32 == 31 || r + 1 == K) {  // store picks r - r%32 .. r
                const u32 base = r - r % 32;
                if (base + lane <= r) o[base + lane] = (i64)mine;
            }
        }
    }
}
