// tile-kernels gating: pieces shared by the gating kernels (include as "gating.cuh").
//
// * The selection order of tk-gating's ranking.rs as a u32 "order key": higher key = selected
//   earlier; NaN above every number (all NaNs equal), -0.0 == +0.0, -inf an ordinary value.
//   Key 0 (NONE) lies below every number: padding, non-candidates.
// * Warp selection: round r takes the best (key, index) out of the candidates; a lane's remaining
//   slots are those ranked after its last pick, so picks are distinct even when -inf must be
//   picked (upstream overwrites picks with -inf and can then repeat an index).
// * Scores exactly as scoring.rs: exp and log1p in double precision rounded once to fp32 (the
//   construction of tk_core::math), every other step one IEEE fp32 operation (_rn intrinsics,
//   so no FMA contraction).
// * Row layout of a warp: lane `l` owns runs of A consecutive elements, slot s = A*i + v
//   holding element i*32A + A*l + v (slot_index<A>); A = 4 is the order of scoring.rs warp_sum.
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

// The order key of x (see the file comment), branch-free: x + 0 turns -0.0 into +0.0 and leaves
// every other number unchanged; then negative bit patterns are inverted and positive ones get
// the top bit (one LOP3 with the sign mask); NaN is replaced by NAN_KEY.
__device__ __forceinline__ u32 order_key(float x) {
    const u32 b = __float_as_uint(__fadd_rn(x, 0.0f));
    const u32 k = b ^ ((u32)((i32)b >> 31) | 0x80000000u);
    return x != x ? NAN_KEY : k;
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

// Warp selection over register slots: each take() returns the warp's best remaining
// (key, index), ties to the smaller element index, and takes it out. Lane `lane` owns slot s,
// element slot_index<A>(s, lane), with key[s] (NONE: not a candidate); slots are in increasing
// element order and the keys are not changed while selecting. Each lane caches the first D of
// its remaining slots (its "top-D", D >= 2); a round reduces the lanes' firsts (max key, then
// min index: two redux.sync) and the winning lane moves its cache up. A lane that wins D times
// since its last scan has no known next candidate and rescans its slots ranked after that pick:
// its picks come in its own order, so those are exactly its remaining slots. Rescans run only in
// rounds where the winner needs one (warp vote), so a round costs a few instructions instead of
// a scan of all N slots; a deeper cache costs a few instructions per slot and per round and
// makes rescans rarer. Every take() needs a candidate left somewhere.

// A running top-D of (order key, element index) candidates offered in increasing index order
// (k[0] >= k[1] >= ...; NONE = empty): strict > keeps the first of equal keys, as warp selection
// orders them.
template <int D>
struct IdxTop {
    u32 k[D], j[D];
    __device__ __forceinline__ IdxTop() {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            k[d] = NONE;
            j[d] = NO_INDEX;
        }
    }
    __device__ __forceinline__ void insert(u32 kk, u32 jj) {
#pragma unroll
        for (int d = D - 1; d > 0; --d) {  // entry d - 1 moves down, or kk lands at d
            if (kk > k[d - 1]) {
                k[d] = k[d - 1];
                j[d] = j[d - 1];
            } else if (kk > k[d]) {
                k[d] = kk;
                j[d] = jj;
            }
        }
        if (kk > k[0]) {
            k[0] = kk;
            j[0] = jj;
        }
    }
    // Takes the first entry out: the others move up, the last becomes (NONE, last_j).
    __device__ __forceinline__ void pop(u32 last_j) {
#pragma unroll
        for (int d = 0; d + 1 < D; ++d) {
            k[d] = k[d + 1];
            j[d] = j[d + 1];
        }
        k[D - 1] = NONE;
        j[D - 1] = last_j;
    }
};

struct Pick {
    u32 key, idx;
};
template <int A, int N, int D = 2>
struct WarpSelect {
    static_assert(D >= 2, "a cache of at least two");
    const u32 (&key)[N];
    const u32 lane;
    // The lane's first remaining slots, best first; (NONE, NO_INDEX) entries: no more slots,
    // (NONE, UNKNOWN): not known (moved up by the lane's wins since its last scan).
    IdxTop<D> c;
    static constexpr u32 UNKNOWN = NO_INDEX - 1;

    __device__ __forceinline__ WarpSelect(const u32 (&k)[N], u32 l) : key(k), lane(l) { cache<true>(0u, 0u); }
    // Starts from the lane's top-D candidates when the caller already has them.
    __device__ __forceinline__ WarpSelect(const u32 (&k)[N], u32 l, const IdxTop<D>& t) : key(k), lane(l), c(t) {}

    // The top-D of this lane's slots (ALL) or of those ranked after (pk, pj).
    template <bool ALL>
    __device__ __forceinline__ void cache(u32 pk, u32 pj) {
        c = IdxTop<D>();
#pragma unroll
        for (int s = 0; s < N; ++s) {
            const u32 j = slot_index<A>(s, lane);
            c.insert((ALL || ranks_after(key[s], j, pk, pj)) ? key[s] : NONE, j);
        }
    }

    __device__ __forceinline__ Pick take() {
        // Whether a win leaves this lane without a known next (pop moves c.j[1] up); taken
        // before the reductions, so the vote below waits on one test instead of on the pop.
        const bool dry = c.j[1] == UNKNOWN;
        const u32 k = __reduce_max_sync(FULL, c.k[0]);
        const u32 wj = __reduce_min_sync(FULL, c.k[0] == k ? c.j[0] : NO_INDEX);
        const bool won = c.j[0] == wj;  // lanes own distinct elements: only the owner matches
        if (won) c.pop(UNKNOWN);
        const bool rescan = won && dry;
        // With N <= D the first cache held every slot: an unknown next means none is left.
        if (N > D && __any_sync(FULL, rescan)) {
            if (rescan) cache<false>(k, wj);
        }
        return {k, wj};
    }
};

// Rows too long for registers (topk_gate): a lane's best element ranked strictly after the
// previous pick (pk, pj); nothing is removed, each round re-reads the row.
struct Best {
    u32 key = NONE, idx = NO_INDEX;
    // Candidates must be offered in increasing j, so that the first of equal keys is kept.
    __device__ __forceinline__ void offer(u32 k, u32 j, u32 pk, u32 pj) {
        if (ranks_after(k, j, pk, pj) && k > key) {
            key = k;
            idx = j;
        }
    }
    // The warp's best: max key, then min index.
    __device__ __forceinline__ Pick warp_pick() const {
        const u32 k = __reduce_max_sync(FULL, key);
        const u32 j = __reduce_min_sync(FULL, key == k ? idx : NO_INDEX);
        return {k, j};
    }
};

// The previous pick before the first round of the streamed path: everything ranks after it.
constexpr u32 FIRST_KEY = 0xffffffffu, FIRST_IDX = 0u;

// Loads elements [0, n) of a row (unit stride) into the layout of slot_index<A> (A a multiple
// of 4); slots past n get `pad`. `vec`: the row start is 16-byte aligned, so whole in-range
// 4-element pieces use one 16-byte load.
template <int A, int N>
__device__ __forceinline__ void load_row(float (&x)[N], const float* __restrict__ row, u32 n, u32 lane,
                                         bool vec, float pad) {
    static_assert(A % 4 == 0 && N % A == 0, "runs of whole 4-element pieces");
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
        const u32 j0 = slot_index<A>(4 * i, lane);
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

// exp(x) in double for |x| <= 708: the main path of CUDA's double exp() (libdevice), written out
// with its constants and its operations in its order, so the result is the same double: round
// k = rint(x / ln 2) with the 1.5 * 2^52 shift, reduce r = x - k ln2_hi - k ln2_lo, evaluate
// the degree-11 polynomial by Horner, add k to the exponent field. CUDA's exp() branches to its
// overflow/underflow path for |x| > 708.39; without that branch, calls on several values can be
// interleaved by the scheduler (the chains are 16 dependent double operations long).
__device__ __forceinline__ double exp_main_path(double x) {
    const double shift = 6755399441055744.0;  // 1.5 * 2^52: t's low word is k
    const double t = __fma_rn(x, __longlong_as_double(0x3ff71547652b82fell), shift);  // x log2(e) + shift
    const double k = __dadd_rn(t, -shift);
    double r = __fma_rn(k, -__longlong_as_double(0x3fe62e42fefa39efll), x);  // - k ln2_hi
    r = __fma_rn(k, -__longlong_as_double(0x3c7abc9e3b39803fll), r);         // - k ln2_lo
    double p = __fma_rn(r, __longlong_as_double(0x3e5ade1569ce2bdfll), __longlong_as_double(0x3e928af3fca213eall));
    p = __fma_rn(r, p, __longlong_as_double(0x3ec71dee62401315ll));
    p = __fma_rn(r, p, __longlong_as_double(0x3efa01997c89eb71ll));
    p = __fma_rn(r, p, __longlong_as_double(0x3f2a01a014761f65ll));
    p = __fma_rn(r, p, __longlong_as_double(0x3f56c16c1852b7afll));
    p = __fma_rn(r, p, __longlong_as_double(0x3f81111111122322ll));
    p = __fma_rn(r, p, __longlong_as_double(0x3fa55555555502a1ll));
    p = __fma_rn(r, p, __longlong_as_double(0x3fc5555555555511ll));
    p = __fma_rn(r, p, __longlong_as_double(0x3fe000000000000bll));
    p = __fma_rn(r, p, 1.0);
    p = __fma_rn(r, p, 1.0);
    return __hiloint2double(__double2hiint(p) + (__double2loint(t) << 20), __double2loint(p));
}

// exp(x) rounded once to fp32 from a double evaluation (as tk_core::math::expf), branch-free.
// Arguments are clamped to [-104, 89] first: exp(-104) < 2^-150 rounds to +0 in fp32 and
// exp(89) > FLT_MAX rounds to +inf, as every exp of an argument beyond them does, and inside
// the clamp exp_main_path is CUDA's exp(). NaN returns NaN.
__device__ __forceinline__ float exp_f32(float x) {
    const float c = fminf(fmaxf(x, -104.0f), 89.0f);
    const float e = __double2float_rn(exp_main_path((double)c));
    return x != x ? x : e;
}
// log(1 + x) rounded once to fp32 from a double evaluation (as tk_core::math::log1pf).
__device__ __forceinline__ float log1p_f32(float x) { return __double2float_rn(log1p((double)x)); }

// 1 / d correctly rounded (as __fdiv_rn(1.0f, d)) for 1 <= d < 2^64, branch-free: the fast
// path of CUDA's IEEE fp32 division, operation for operation (approximate reciprocal, one
// Newton step, quotient, remainder, corrected quotient). CUDA's division takes it whenever its
// FCHK range check passes, which it does for a dividend of 1 and such divisors; other divisors
// need __fdiv_rn itself.
__device__ __forceinline__ float rcp_fast_path(float d) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));  // MUFU.RCP; d, 1/d are normal
    r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
    const float q = __fmaf_rn(r, 1.0f, 0.0f);
    return __fmaf_rn(r, __fmaf_rn(-d, q, 1.0f), q);
}
// The divisor of a sigmoid: d = 1 + exp(-x).
__device__ __forceinline__ float sigmoid_den(float x) { return __fadd_rn(1.0f, exp_f32(-x)); }
// Below this divisor (x > -44.3) rcp_fast_path gives the sigmoid.
constexpr float SIGMOID_FAST_DEN = 18446744073709551616.0f;  // 2^64
// e = exp(-x); d = 1 + e; s = 1 / d.
__device__ __forceinline__ float sigmoid(float x) {
    const float d = sigmoid_den(x);
    return d < SIGMOID_FAST_DEN ? rcp_fast_path(d) : __fdiv_rn(1.0f, d);
}
// sigmoid() of N values, the common case straight-line (so the N exp chains interleave): a
// divisor of 2^64 or more (x < -44.3) or NaN is kept in s (it is > 1 or NaN, never a sigmoid
// in [0, 1]) and divided afterwards, behind one branch.
template <int N>
__device__ __forceinline__ void sigmoid_n(float (&s)[N], const float (&x)[N]) {
    bool slow = false;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const float d = sigmoid_den(x[i]);
        const bool fast = d < SIGMOID_FAST_DEN;
        s[i] = fast ? rcp_fast_path(d) : d;
        slow = slow || !fast;
    }
    if (slow) {
#pragma unroll
        for (int i = 0; i < N; ++i)
            if (!(s[i] <= 1.0f)) s[i] = __fdiv_rn(1.0f, s[i]);
    }
}
// x if x > 20 (strict), else log1p(exp(x)).
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1p_f32(exp_f32(x)); }
__device__ __forceinline__ float sqrt_softplus(float x) { return __fsqrt_rn(softplus(x)); }

// ----- groups (topk_sum_and_topk_group_idx, top2_sum_gate) ------------------------------------

// A running multiset top-2 (k1 >= k2 by order key; NONE = empty).
struct Top2 {
    u32 k1 = NONE, k2 = NONE;
    float v1 = 0.0f, v2 = 0.0f;
    __device__ __forceinline__ void insert(float v) { insert(order_key(v), v); }
    // Inserts v with its order key k.
    __device__ __forceinline__ void insert(u32 k, float v) {
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
    // Merges another lane's top-2 (lane ^ off) into this one.
    __device__ __forceinline__ void merge_xor(u32 off) {
        const u32 o1 = __shfl_xor_sync(FULL, k1, off), o2 = __shfl_xor_sync(FULL, k2, off);
        const float w1 = __shfl_xor_sync(FULL, v1, off), w2 = __shfl_xor_sync(FULL, v2, off);
        if (o1 > k1) {  // theirs is the best; second: our best or their second
            const bool ours = k1 > o2;
            k2 = ours ? k1 : o2;
            v2 = ours ? v1 : w2;
            k1 = o1;
            v1 = w1;
        } else if (o1 > k2) {  // our best stays; their best is the second
            k2 = o1;
            v2 = w1;
        }
    }
    // The order key of the group score: the best value (NSUM = 1) or the fp32 sum of the two.
    template <int NSUM>
    __device__ __forceinline__ u32 score_key() const {
        return NSUM == 1 ? k1 : order_key(__fadd_rn(v1, v2));
    }
};

// A running multiset top-2 of order keys (k1 >= k2; NONE = empty), for group scores that only
// need the key of the top-2 sum: the values are rebuilt from the keys (value_of_key), which
// turns -0.0 into +0.0 and canonicalises NaN payloads; neither changes the key of the sum
// (-0 + -0 and +0 + +0 have the same key, NaN stays NaN), so sum_key() equals
// Top2::score_key<2>() with half the shuffles per merge.
__device__ __forceinline__ float value_of_key(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? k ^ 0x80000000u : ~k);  // inverse of order_key
}
struct KeyTop2 {
    u32 k1 = NONE, k2 = NONE;
    // Merges another lane's top-2 (lane ^ off) into this one.
    __device__ __forceinline__ void merge_xor(u32 off) {
        const u32 o1 = __shfl_xor_sync(FULL, k1, off), o2 = __shfl_xor_sync(FULL, k2, off);
        k2 = max(max(k2, o2), min(k1, o1));
        k1 = max(k1, o1);
    }
    // The order key of the fp32 sum of the two values (both must be present).
    __device__ __forceinline__ u32 sum_key() const {
        return order_key(__fadd_rn(value_of_key(k1), value_of_key(k2)));
    }
};

// Lanes that score one group together: the largest power of two L with G*L <= 32 and L <= P
// (1 when G > 32: each lane then scores groups lane, lane + 32, ...).
__host__ __device__ constexpr u32 lanes_per_group(u32 g, u32 p) {
    u32 l = 1;
    while (g <= 32 && 2 * l * g <= 32 && 2 * l <= p) l *= 2;
    return l;
}

// The group score keys of one token in the selection layout of WarpSelect<1, NG>: the key of
// group q sits at element index q * L (L = lanes_per_group), so a pick's group is idx / L.
// Group q's P values are base[q * gs + e], e < P. Equal keys only differ in the sign of zero or
// a NaN payload, which leave a score's key unchanged, so the scan and merge orders are free:
// with L lanes per group, lane q*L + sub scans e = sub + L*c starting at c = q mod ceil(P/L)
// (spreading a warp's shared-memory reads over the banks), then the L partial top-2s are merged
// with XOR shuffles. Every lane of the warp must call this (shuffles).
template <int NSUM, u32 G, u32 P, int NG>
__device__ __forceinline__ void group_keys(u32 (&gkey)[NG], const float* base, u64 gs, u32 lane) {
    constexpr u32 L = lanes_per_group(G, P);
    if constexpr (G <= 32) {
        static_assert(NG == 1, "one group slot per lane when G <= 32");
        constexpr u32 NCH = (P + L - 1) / L;  // elements per lane
        const u32 q = lane / L, sub = lane % L;
        Top2 t;
        if (q < G) {
            const float* g = base + q * gs;  // (P,)
            u32 c = q % NCH;
            for (u32 i = 0; i < NCH; ++i) {
                const u32 e = sub + L * c;
                if (e < P) t.insert(g[e]);
                c = c + 1 == NCH ? 0 : c + 1;
            }
        }
#pragma unroll
        for (u32 off = 1; off < L; off *= 2) t.merge_xor(off);
        gkey[0] = (q < G && sub == 0) ? t.template score_key<NSUM>() : NONE;
    } else {
#pragma unroll
        for (int i = 0; i < NG; ++i) {
            const u32 q = slot_index<1>(i, lane);
            Top2 t;
            if (q < G) {
                const float* g = base + q * gs;  // (P,)
                u32 e = lane % P;
                for (u32 c = 0; c < P; ++c) {
                    t.insert(g[e]);
                    e = e + 1 == P ? 0 : e + 1;
                }
            }
            gkey[i] = q < G ? t.template score_key<NSUM>() : NONE;
        }
    }
}

// ----- EP/TP masking and the replica choice (top2_sum_gate.rs) -----------------------------

// mask_ep_tp (top2_sum_gate.rs), in its closed form (equal for id >= 0, see the Rust unit test):
// with owner rank = id / r, -1 unless rank % tp == tp_rank, else (rank / tp) * r + id % r. The
// launch checks that ids, r and tp fit in 31 bits, so 32-bit unsigned division suffices.
// With tp == 1 (so tp_rank == 0) every id >= 0 maps to itself: the divisions are skipped.
__device__ __forceinline__ i64 mask_ep_tp(i64 id, u32 r, u32 tp_rank, u32 tp) {
    if (id < 0) return -1;
    if (tp == 1) return id;
    const u32 u = (u32)id, rank = u / r;
    if (rank % tp != tp_rank) return -1;
    return (i64)((rank / tp) * r + (u - rank * r));
}

}  // namespace tkg
