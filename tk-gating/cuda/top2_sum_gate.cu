// top2_sum_gate: the full MoE router of tk-gating's top2_sum_gate.rs, one warp per token.
//
// Defines:
//   TK_E        routed experts E (<= 1024: the row sits in registers)
//   TK_K        routed slots K (1 <= K <= E)
//   TK_G, TK_GK groups and kept groups when group-limited routing is active, else both 0
//   TK_SCORING  0 sigmoid, 1 sqrt-softplus, 2 softmax
//   TK_WARPS    warps per block
// Run-time options (null pointers when absent): mask, fix_routing_mask + unmapped_topk_idx,
// to_physical_map + logical_count; S shared slots; the EP/TP ranks.
//
// Per token: the logits row is loaded into registers (lane l owns runs of A = 4 or 8 experts,
// run i at expert i*32A + lA, see RUN8 below; 16-byte loads when aligned), one token ahead: the
// grid is at most one resident wave and each warp prefetches its next token's row while routing
// the current one; scores as scoring.rs (double-precision exp/log1p rounded once to fp32, IEEE
// fp32 for the rest; softmax's Z summed per lane in slot order, then an XOR butterfly 16..1).
// Sigmoid scoring is straight-line (gating.cuh sigmoid_n: CUDA's double exp main path on
// clamped arguments, the fast path of IEEE division), so the lane's exp chains interleave.
// Ranking keys s + bias (logit + bias for softmax) as order keys. With groups, the groups are
// scored by their top-2 sums and the GK best kept; experts of the other groups stop being
// candidates. Power-of-two groups of A..32A experts (G <= 32) stay in registers (REG_GROUPS
// below: per-run top-2 keys merged with shuffles, all groups ranked at once); other shapes go
// through shared memory (group_keys, then GK warp rounds). K warp rounds pick the experts
// (WarpSelect, gating.cuh, on keys only); the score of each pick is read back from the warp's
// copy of the scores in shared memory (one broadcast load), so every lane accumulates the weight
// denominator 1e-20 + s0 + s1 + ... in pick order. Lane r % 32 then writes slot r: weight
// (s / den) * rsf (1.0 for shared slots), replica (64-bit), EP/TP masking.
#include "gating.cuh"

#if !defined(TK_E) || !defined(TK_K) || !defined(TK_G) || !defined(TK_GK) || !defined(TK_SCORING) || !defined(TK_WARPS)
#error "TK_E, TK_K, TK_G, TK_GK, TK_SCORING and TK_WARPS must be defined"
#endif

#if TK_SCORING < 0 || TK_SCORING > 2
#error "TK_SCORING must be 0 (sigmoid), 1 (sqrt-softplus) or 2 (softmax)"
#endif

using namespace tkg;

constexpr u32 E = TK_E, K = TK_K;
// Row layout (gating.cuh): lane l owns runs of A consecutive experts, run i of lane l starting
// at expert i * 32A + lA. A = 8 where it lets every lane's run lie in one group of a
// register-held grouping (G > 0, elementwise scores, 8 | E / G | 256, 256 | E): then a lane
// scores one group per 256-expert vector and a group's top-2 merge needs log2(E / G / 8) XOR
// rounds instead of log2(E / G / 4) per 128-expert vector (DeepSeek-V3: 2 rounds on one run
// instead of 3 on each of two). Otherwise A = 4 (softmax sums Z in the A = 4 slot order).
#if TK_G > 0
constexpr bool RUN8 = TK_SCORING != 2 && TK_E % 256 == 0 && (TK_E / TK_G) % 8 == 0 && 256 % (TK_E / TK_G) == 0;
#else
constexpr bool RUN8 = false;
#endif
constexpr int A = RUN8 ? 8 : 4;
constexpr u32 VW = 32 * A;                   // experts per row vector
constexpr int N = A * ((TK_E + VW - 1) / VW);  // row slots per lane
// Depth of the lanes' candidate caches in the expert selection (WarpSelect): with 3, a lane
// rescans its slots only on its 3rd, 6th, ... pick (DeepSeek-V3: K = 8 picks among the 16 lanes
// of the 4 kept groups: 0.08 rescans per token instead of 1.14 with 2, simulated on normal logits).
#ifndef TK_SEL_DEPTH
#define TK_SEL_DEPTH 3
#endif
constexpr int SD = TK_SEL_DEPTH;
// The expert selection rounds are unrolled for up to 16 picks (the lane test and the loop
// counter of each round become constants; a round's rescan stays behind its vote).
constexpr int SEL_UNROLL = TK_K <= 16 ? TK_K : 1;
constexpr int KC = (TK_K + 31) / 32;         // routed slots per lane
constexpr int PC = (TK_K + 2 + 31) / 32;     // output slots per lane (S <= 2)
constexpr bool SOFTMAX = TK_SCORING == 2;
// Groups in registers: every A-element run of a lane lies in one group and a group's part of
// each VW-element row vector is held by C = PG / A consecutive lanes (PG = E / G a power of two,
// A <= PG <= VW), so lane l holds group i * (VW / PG) + l / C in vector i. Otherwise the keys go
// through shared memory (group_keys).
#if TK_G > 0
constexpr bool REG_GROUPS = TK_G <= 32 && (TK_E / TK_G) % A == 0 && VW % (TK_E / TK_G) == 0;
#else
constexpr bool REG_GROUPS = false;
#endif
// Blocks per SM the register budget must allow: on sm_90, 8 (64 registers, 32 warps to hide
// the latency of the exp/log1p chains) for elementwise scores on rows of 4 or 8 full slots per
// lane, which fit without spilling; 4 otherwise (softmax and longer or ragged rows need more
// registers, and sm_100's code for the same rows would spill at 64).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 1000
constexpr int MIN_BLOCKS = !SOFTMAX && (N == 4 || (N == 8 && TK_E % 128 == 0)) ? 8 : 4;
#else
constexpr int MIN_BLOCKS = 4;
#endif

// The score of one logit for an elementwise scoring function.
__device__ __forceinline__ float score(float x) {
#if TK_SCORING == 0
    return sigmoid(x);
#else
    return sqrt_softplus(x);
#endif
}

// Outputs: idx, w (T, K + S) contiguous. unmapped (T, K) row stride ldu or null. logits (T, E)
// row stride ld; bias (E,) stride bs; mask, fix (T,) strides ms, fs or null; map (E + S, D)
// strides (mp0, mp1) and count (E + S,) stride cs, or null. vec: 16-byte row loads allowed.
extern "C" __global__ void __launch_bounds__(TK_WARPS * 32, MIN_BLOCKS)
    tk_top2_sum_gate(i64* __restrict__ idx, float* __restrict__ w, i64* __restrict__ unmapped, u64 ldu,
                     const float* __restrict__ logits, u64 ld, const float* __restrict__ bias, u64 bs,
                     const u8* __restrict__ mask, u64 ms, const u8* __restrict__ fix, u64 fs,
                     const i32* __restrict__ map, u64 mp0, u64 mp1, const i32* __restrict__ count, u64 cs,
                     u32 T, u32 S, u32 D, u32 vec, float rsf, u64 ep_rank, u32 R, u32 tp_rank, u32 tp) {
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#if TK_G > 0
    constexpr u32 G = TK_G, PG = TK_E / TK_G;
    constexpr int NG = (TK_G + 31) / 32;
    constexpr u32 L = lanes_per_group(G, PG);
    __shared__ float skey[REG_GROUPS ? 1 : TK_WARPS][REG_GROUPS ? 1 : E];  // per warp: keys (E,)
    __shared__ u32 sgroup[REG_GROUPS ? 1 : TK_WARPS][REG_GROUPS ? 1 : G];  // per warp: group keys
#endif
    __shared__ __align__(16) float sscore[TK_WARPS][N * 32];  // per warp: the scores of the token (row layout)
    const u32 P = K + S;
    const u64 warps = (u64)gridDim.x * TK_WARPS;
    const float pad = SOFTMAX ? -__int_as_float(0x7f800000) : 0.0f;
    u64 t = (u64)blockIdx.x * TK_WARPS + warp;
    float xn[N];  // (N,) this lane's logits of token t, loaded one token ahead
    if (t < T) load_row<A, N>(xn, logits + t * ld, E, lane, vec != 0, pad);
    // The bias, the same for every token, in shared memory rather than N registers per lane
    // (filled while the first rows are in flight).
    __shared__ __align__(16) float sbias[N * 32];  // (32N,) bias (E,), then zeros
    for (u32 j = threadIdx.x; j < N * 32; j += TK_WARPS * 32) sbias[j] = j < E ? __ldg(bias + j * bs) : 0.0f;
    __syncthreads();
    for (; t < T; t += warps) {
        float x[N];  // (N,) this lane's logits
#pragma unroll
        for (int i = 0; i < N; ++i) x[i] = xn[i];
        if (t + warps < T) load_row<A, N>(xn, logits + (t + warps) * ld, E, lane, vec != 0, pad);
        i64* io = idx + t * P;                                 // (P,)
        float* wo = w + t * P;                                 // (P,)
        i64* uo = unmapped ? unmapped + t * ldu : nullptr;     // (K,)
        if (mask && mask[t * ms] == 0) {  // padding token: not routed, logits unused
            for (u32 r = lane; r < P; r += 32) {
                io[r] = -1;
                wo[r] = 0.0f;
            }
            if (uo)
                for (u32 r = lane; r < K; r += 32) uo[r] = -1;
            continue;
        }
        const float* row = logits + t * ld;  // (E,)

        float s[N];  // (N,) scores
        float m = 0.0f, z = 0.0f;
        if (SOFTMAX) {
            m = x[0];
#pragma unroll
            for (int i = 1; i < N; ++i) m = fmaxf(m, x[i]);  // padding is -inf
#pragma unroll
            for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(FULL, m, off));
            float zl = 0.0f;
#pragma unroll
            for (int i = 0; i < N; ++i) {
                s[i] = slot_index<A>(i, lane) < E ? exp_f32(__fsub_rn(x[i], m)) : 0.0f;
                zl = __fadd_rn(zl, s[i]);  // + 0.0 for padding is exact
            }
#pragma unroll
            for (int off = 16; off > 0; off /= 2) zl = __fadd_rn(zl, __shfl_xor_sync(FULL, zl, off));
            z = zl;
#pragma unroll
            for (int i = 0; i < N; ++i) s[i] = __fdiv_rn(s[i], z);
        } else {
#if TK_SCORING == 0
            sigmoid_n<N>(s, x);
#else
#pragma unroll
            for (int i = 0; i < N; ++i) s[i] = score(x[i]);
#endif
#pragma unroll
            for (int i = 0; i < N; ++i)
                if (slot_index<A>(i, lane) >= E) s[i] = 0.0f;  // padding
        }

        const bool fixed = fix && fix[t * fs] != 0;
        i64 sel[KC];    // routed slot c*32 + lane: logical expert
        float ss[KC];   // ... and its score
        float den = 1e-20f;
#pragma unroll
        for (int c = 0; c < KC; ++c) {
            sel[c] = 0;
            ss[c] = 0.0f;
        }
        if (!fixed) {
            // The scores go to shared memory now, so that they need no registers from here on.
            __syncwarp();  // the previous token's reads of sscore are done
#pragma unroll
            for (int i = 0; i < N; ++i) sscore[warp][slot_index<A>(i, lane)] = s[i];
            __syncwarp();
            u32 key[N];  // (N,) ranking keys as order keys, NONE past the row end
            IdxTop<SD> first;  // REG_GROUPS: the lane's top-SD candidates, known before selection
#if TK_G > 0
            constexpr int NV = N / A;
            IdxTop<SD> top[NV];  // (NV,) this lane's top-SD candidates of each A-element run (REG_GROUPS)
#endif
            float b[N];  // (N,) this lane's bias values
#pragma unroll
            for (int i = 0; i < N; i += 4) {  // 4-element pieces are 16-byte aligned
                const float4 q = *reinterpret_cast<const float4*>(&sbias[slot_index<A>(i, lane)]);
                b[i] = q.x;
                b[i + 1] = q.y;
                b[i + 2] = q.z;
                b[i + 3] = q.w;
            }
#pragma unroll
            for (int i = 0; i < N; ++i) {
                const u32 j = slot_index<A>(i, lane);
                key[i] = NONE;
                if (j < E) {
                    const float kf = __fadd_rn(SOFTMAX ? x[i] : s[i], b[i]);
                    key[i] = order_key(kf);
#if TK_G > 0
                    if constexpr (REG_GROUPS)
                        top[i / A].insert(key[i], j);
                    else
                        skey[warp][j] = kf;
#endif
                }
            }
#if TK_G > 0
            // Group-limited routing: keep the GK best groups by top-2 sums.
            if constexpr (REG_GROUPS) {
                constexpr u32 C = PG / A, GPV = VW / PG;  // lanes per group run, groups per vector
                u32 gkey[NV];  // (NV,) the key of group v * GPV + lane / C (NONE past G)
#pragma unroll
                for (int v = 0; v < NV; ++v) {
                    KeyTop2 g{top[v].k[0], top[v].k[1]};
#pragma unroll
                    for (u32 off = 1; off < C; off *= 2) g.merge_xor(off);
                    gkey[v] = v * GPV + lane / C < G ? g.sum_key() : NONE;
                }
                // Lane q < G takes group q's key (slot q / GPV of lane (q % GPV) * C) and ranks
                // it against all G keys at once (higher key first, then the smaller group); the
                // kept groups are those ranked below GK, as GK selection rounds would pick them.
                u32 mine = NONE;
#pragma unroll
                for (int v = 0; v < NV; ++v) {
                    const u32 kv = __shfl_sync(FULL, gkey[v], (lane % GPV) * C);
                    if (lane / GPV == (u32)v && lane < G) mine = kv;
                }
                u32 rank = 0;
#pragma unroll
                for (u32 q = 0; q < G; ++q) {
                    const u32 kq = __shfl_sync(FULL, mine, q);
                    rank += (kq > mine || (kq == mine && q < lane)) ? 1u : 0u;
                }
                const u32 kept = __ballot_sync(FULL, lane < G && rank < TK_GK);  // bit q: kept
                // Experts of the other groups stop being candidates; the lane's top-SD candidates
                // are those of its kept runs, merged in run (= expert) order.
#pragma unroll
                for (int v = 0; v < NV; ++v) {
                    const u32 q = v * GPV + lane / C;
                    if (q >= G || ((kept >> q) & 1u) == 0) {  // not kept
#pragma unroll
                        for (int i = v * A; i < (v + 1) * A; ++i) key[i] = NONE;
                    } else if (v == 0) {
                        first = top[0];  // first is still empty
                    } else {
#pragma unroll
                        for (int d = 0; d < SD; ++d) first.insert(top[v].k[d], top[v].j[d]);
                    }
                }
            } else {
                __syncwarp();
                u32 gkey[NG];  // group q at element index q * L
                group_keys<2, G, PG, NG>(gkey, &skey[warp][0], PG, lane);
#pragma unroll
                for (int i = 0; i < NG; ++i)
                    if (gkey[i] != NONE) sgroup[warp][slot_index<1>(i, lane) / L] = gkey[i];
                __syncwarp();
                u32 gpk = 0, gpj = 0;  // the last kept group: kept = ranked at or before it
                WarpSelect<1, NG> gsel(gkey, lane);
                for (u32 r = 0; r < TK_GK; ++r) {
                    const Pick p = gsel.take();
                    gpk = p.key;
                    gpj = p.idx;
                }
#pragma unroll
                for (int i = 0; i < N; ++i) {
                    const u32 j = slot_index<A>(i, lane);
                    if (j < E) {
                        const u32 q = j / PG;
                        if (ranks_after(sgroup[warp][q], q * L, gpk, gpj)) key[i] = NONE;  // not kept
                    }
                }
                __syncwarp();  // shared memory reads done before the next token's writes
            }
#endif
            // K rounds of expert selection, best first; the scores of the picks are read back from
            // sscore (one broadcast load), so the lanes' candidate caches carry no scores.
            auto pick = [&]() {
                if constexpr (REG_GROUPS)
                    return WarpSelect<A, N, SD>(key, lane, first);
                else
                    return WarpSelect<A, N, SD>(key, lane);
            }();
#pragma unroll
            for (int c = 0; c < KC; ++c) {
#pragma unroll SEL_UNROLL
                for (u32 rr = 0; rr < 32 && c * 32 + rr < K; ++rr) {
                    const Pick p = pick.take();
                    const float v = sscore[warp][p.idx];
                    den = __fadd_rn(den, v);
                    if (lane == rr) {
                        sel[c] = p.idx;
                        ss[c] = v;
                    }
                }
            }
        } else {
            // Fix routing: the given experts, their scores recomputed exactly as above.
#pragma unroll
            for (int c = 0; c < KC; ++c) {
                const u32 r = c * 32 + lane;
                if (r < K) {
                    const i64 id = uo[r];
                    sel[c] = id;
                    if (id >= 0 && id < (i64)E) {
                        const float xv = __ldg(row + id);
                        ss[c] = SOFTMAX ? __fdiv_rn(exp_f32(__fsub_rn(xv, m)), z) : score(xv);
                    }
                }
            }
#pragma unroll
            for (int c = 0; c < KC; ++c)
                for (u32 rr = 0; rr < 32 && c * 32 + rr < K; ++rr)
                    den = __fadd_rn(den, __shfl_sync(FULL, ss[c], rr));
        }

        // Slots: weights, shared experts, replica, EP/TP masking.
#pragma unroll
        for (int c = 0; c < PC; ++c) {
            const u32 r = c * 32 + lane;
            if (r >= P) continue;
            i64 id;
            float wv;
            if (r < K) {
                const i64 l = c < KC ? sel[c] : 0;
                id = (l >= 0 && l < (i64)E) ? l : -1;
                wv = __fmul_rn(__fdiv_rn(c < KC ? ss[c] : 0.0f, den), rsf);
                if (uo) uo[r] = l;
            } else {
                id = (i64)(E + (r - K));
                wv = 1.0f;
            }
            if (map && id >= 0) {
                const i32 n = count[(u64)id * cs];
                if (n < 1 || (u32)n > D) {
                    id = -1;
                } else {
                    const u64 col = (ep_rank + t * 23333u) % (u64)n;  // 64-bit: no overflow
                    id = map[(u64)id * mp0 + col * mp1];
                    if (id >= (i64)(E + D - 1)) id = -1;  // outside the physical ids
                }
            }
            io[r] = mask_ep_tp(id, R, tp_rank, tp);
            wo[r] = wv;
        }
    }
}
