// tile-kernels gating: pieces shared by the gating kernels (include as "gating.cuh").
//
// * The selection order of tk-gating's ranking.rs as a u32 "order key": higher key = selected
//   earlier; NaN above every number (all NaNs equal), -0.0 == +0.0, -inf an ordinary value.
//   Key 0 (NONE) lies below every number: padding, non-candidates.
// * Warp selection without removal: round r picks the best (key, index) that ranks strictly
//   after round r-1's pick (higher key first, then smaller index), so picks are distinct and
//   nothing has to be overwritten (upstream overwrites with -inf and can repeat an index).
// * Scores exactly as scoring.rs: exp and log1p in double precision rounded once to fp32 (the
//   construction of tk_core::math), every other step one IEEE fp32 operation (_rn intrinsics,
//   so no FMA contraction).
// * Row layout of a warp: lane `l` owns elements i*128 + 4l + v (v < 4) of a row, i.e. slot
//   s = 4i + v holds element (s/4)*128 + 4l + s%4; this is the order of scoring.rs warp_sum.
#pragma once
#include "tk/common.cuh"

namespace tkg {

using tk::i32;
using tk::i64;
using tk::u32;
using tk::u64;
using tk::u8;

constexpr u32 FULL = 0xffffffffu;
constexpr u32 NONE = 0u;           // below every number
constexpr u32 NAN_KEY = 0xfffffff0u;  // every NaN; above +inf (0xff800000)
constexpr u32 NO_INDEX = 0xffffffffu;

// The order key of x (see the file comment).
__device__ __forceinline__ u32 order_key(float x) {
    const u32 b = __float_as_uint(x);
    if (x != x) return NAN_KEY;
    if ((b << 1) == 0u) return 0x80000000u;  // +0.0 and -0.0 tie
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// True when (k, j) ranks strictly after (pk, pj): lower key, or equal key and larger index.
__device__ __forceinline__ bool ranks_after(u32 k, u32 j, u32 pk, u32 pj) {
    return k < pk || (k == pk && j > pj);
}

// Element index of slot s of lane `lane` when a lane owns runs of A consecutive elements:
// (s / A) * 32A + lane * A + s % A (A = 4: the row layout above; A = 1: one element per lane).
template <int A>
__device__ __forceinline__ u32 slot_index(int s, u32 lane) {
    return (u32)(s / A) * (32u * A) + lane * A + (u32)(s % A);
}

// A lane's best candidate of one selection round.
struct Best {
    u32 key = NONE, idx = NO_INDEX;
    float val = 0.0f;
    // Takes (k, j, v) if it ranks after the previous pick (pk, pj) and beats the current best.
    // Candidates must be offered in increasing j, so that the first of equal keys is kept.
    __device__ __forceinline__ void offer(u32 k, u32 j, float v, u32 pk, u32 pj) {
        if (ranks_after(k, j, pk, pj) && k > key) {
            key = k;
            idx = j;
            val = v;
        }
    }
};

// The warp's pick: the best of the lanes' bests (max key, then min index), with its value
// broadcast from the lane that owns it (element j lives in lane (j / A) % 32).
struct Pick {
    u32 key, idx;
    float val;
};
template <int A>
__device__ __forceinline__ Pick warp_pick(const Best& b) {
    const u32 k = __reduce_max_sync(FULL, b.key);
    const u32 j = __reduce_min_sync(FULL, b.key == k ? b.idx : NO_INDEX);
    const float v = __shfl_sync(FULL, b.val, (j / A) % 32u);
    return {k, j, v};
}

// One selection round over register slots key[N] (padding slots hold NONE).
template <int A, int N>
__device__ __forceinline__ Pick warp_next(const u32 (&key)[N], const float (&val)[N], u32 lane,
                                          u32 pk, u32 pj) {
    Best b;
#pragma unroll
    for (int s = 0; s < N; ++s) b.offer(key[s], slot_index<A>(s, lane), val[s], pk, pj);
    return warp_pick<A>(b);
}

// The previous pick before the first round: everything ranks after it.
constexpr u32 FIRST_KEY = 0xffffffffu, FIRST_IDX = 0u;

// Loads elements [0, n) of a row (unit stride) into the row layout; slots past n get `pad`.
// `vec`: the row start is 16-byte aligned, so whole in-range vectors use one 16-byte load.
template <int N>
__device__ __forceinline__ void load_row(float (&x)[N], const float* __restrict__ row, u32 n, u32 lane,
                                         bool vec, float pad) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
        const u32 j0 = slot_index<4>(4 * i, lane);
        if (vec && j0 + 4 <= n) {
            const float4 q = __ldg(reinterpret_cast<const float4*>(row + j0));
            x[4 * i] = q.x;
            x[4 * i + 1] = q.y;
            x[4 * i + 2] = q.z;
            x[4 * i + 3] = q.w;
        } else {
#pragma unroll
            for (int v = 0; v < 4; ++v) x[4 * i + v] = (j0 + v < n) ? __ldg(row + j0 + v) : pad;
        }
    }
}

// ----- scores (scoring.rs) -------------------------------------------------------------------

// exp(x) rounded once to fp32 from a double evaluation (as tk_core::math::expf).
__device__ __forceinline__ float exp_f32(float x) { return __double2float_rn(exp((double)x)); }
// log(1 + x) rounded once to fp32 from a double evaluation (as tk_core::math::log1pf).
__device__ __forceinline__ float log1p_f32(float x) { return __double2float_rn(log1p((double)x)); }

// e = exp(-x); d = 1 + e; s = 1 / d.
__device__ __forceinline__ float sigmoid(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_f32(-x)));
}
// x if x > 20 (strict), else log1p(exp(x)).
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1p_f32(exp_f32(x)); }
__device__ __forceinline__ float sqrt_softplus(float x) { return __fsqrt_rn(softplus(x)); }

// ----- groups (topk_sum_and_topk_group_idx, top2_sum_gate) ------------------------------------

// The order key of a group's score: its best value (NSUM = 1) or the one fp32 sum of its two best
// values as a multiset (NSUM = 2), over g[0..p). The scan starts at `rot` and wraps (spreads the
// lanes of a warp over shared-memory banks; the values found do not depend on it: equal keys only
// differ in the sign of zero or a NaN payload, which leave the sum's key unchanged).
template <int NSUM>
__device__ __forceinline__ u32 group_key(const float* g, u32 p, u32 rot) {
    u32 k1 = NONE, k2 = NONE;
    float v1 = 0.0f, v2 = 0.0f;
    for (u32 c = 0; c < p; ++c) {
        u32 j = c + rot;
        j = j >= p ? j - p : j;
        const float v = g[j];
        const u32 k = order_key(v);
        if (k > k1) {
            k2 = k1;
            v2 = v1;
            k1 = k;
            v1 = v;
        } else if (k > k2) {
            k2 = k;
            v2 = v;
        }
    }
    return NSUM == 1 ? k1 : order_key(__fadd_rn(v1, v2));
}

// ----- EP/TP masking and the replica choice (top2_sum_gate.rs) -----------------------------

// mask_ep_tp: -1 unless the owner EP rank id / r has TP index tp_rank, else the local id.
__device__ __forceinline__ i64 mask_ep_tp(i64 id, i64 r, i64 tp_rank, i64 tp) {
    if (id < 0) return -1;
    if ((id / r) % tp != tp_rank) return -1;
    const i64 per_dp = r * tp;
    const i64 v = id - tp_rank * r;
    const i64 local = v - (v / per_dp) * (per_dp - r);
    return local < 0 ? -1 : local;
}

}  // namespace tkg
