// reduce_fused (spec/moe.md 4.14): out[t, h] = convert(sf * sum_k fma order of x[p_k, h] * s_k),
// s_k = w[t, k] (or 1) times x_sf[p_k] (when given), accumulated in fp32 from +0.0 in slot order
// with one fused multiply-add per slot; slots whose position is not legal are skipped.
//
// Defines: TK_IN (0 fp32, 1 bf16, 2 fp16), TK_E4M3 (1: e4m3fn output, saturating; 0: output in
// the input dtype), TK_W (columns per lane access: 16 bytes of input, or 1), TK_K (slots),
// TK_WEIGHTS, TK_XSF, TK_SF (0/1: whether topk_weights, x_sf, sf are given), TK_TPB (tokens,
// i.e. warps, per block: 1 by default, 4 before; a knob for an A/B run), TK_SPLIT (column
// chunks per token of the tail tokens [head, T): see the kernel).
//
// The tail (TK_SPLIT, src/reduce_fused.rs TAIL_TOKENS_PER_SM): a token's time grows with its
// legal slots (one slot: 2 batches of H = 7168 bf16; three: 7), and under full load every batch
// waits several microseconds in the memory queues. The tokens dispatched last therefore end at
// very different times: the ncu profile of the EP8 bench shows the SMs active only 92 % of the
// elapsed cycles (one SM 7.6 % above the mean, one 4 % below), i.e. ~12 µs per SM with no
// warp at all while a few 3-slot tokens finish alone (each batch then one unloaded DRAM round
// with only 6 KB in flight per SM). The last TAIL_TOKENS_PER_SM · sm_count tokens are
// therefore split into TK_SPLIT column chunks, one warp each (a 3-slot chunk: 2 batches instead
// of 7; a 1-slot chunk one batch of 7 loads per lane), so the kernel ends on short tasks. The
// head is unchanged (whole tokens keep their 7 KB per warp in flight); each tail task pays its
// own index round (an L2 hit), hidden while the memory system is saturated. Bit-exact: every
// output column is computed the same way whichever warp computes it.
//
// One warp per token (TK_TPB per block, 20 / TK_TPB blocks per SM at <= 96 registers: 20 warps).
// A token's time grows with its legal slots (on the EP8 benchmark ~70 % of the tokens have one
// legal slot of 6, ~25 % two, ~5 % three: 4 batches for one slot, 7 for two, 14 for three or
// four), and a block holds its SM slot until its slowest warp is done: with 4 tokens per block
// ~3/4 of the blocks wait on a 2+-slot token while their other warps idle (mean 5.3 batches per
// token against 7.6 for the slowest of 4: ~0.7 of the resident warps busy). One warp per block
// frees each warp's slot as soon as its token is done, so every resident warp keeps its loads in
// flight. Lane j of slot group g first reads slot 32g + j; the group's legal slots are then
// compacted in slot order (lane r holds the r-th legal slot's row p and scalar s), so the sweep touches only the
// (a skipped slot never changes acc, so the FMA order is the spec's). A token
// whose legal slots fit one batch (one slot group, at most LOADS = 8: every token of the K = 6
// benchmark) is swept by sweep_batch<SB>, SB the smallest power of two >= its legal slots: each
// batch loads LOADS_ONE / SB column vectors (16 bytes) of each slot per lane, LOADS_ONE = 14
// (7 KB per warp; 12 loads for 3-4 slots) in flight for up to 4 legal slots (~1.4 of 6 on the EP8 benchmark; 8
// loads, one vector per slot, for 5 to 8),
// and each output vector is finished and stored right after its loads. Other tokens use sweep
// (one column vector per lane, batches of 8 slots). All loads of a batch are issued before its
// FMAs, which run in slot order.
// The arithmetic uses explicit __fmaf_rn / __fmul_rn so that no contraction or reassociation
// can change the bits.
// A warp's first memory round (the token's positions and weights: first-touch DRAM misses of a
// few bytes) has no row data in flight. Each warp therefore asks L2 for the positions and
// weights of token t + ahead (ahead = 4 tokens per SM, so the warp handling it
// starts a few microseconds later and finds them in L2): a hint only, never a result.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include "tk/moe.cuh"

#if !defined(TK_IN) || !defined(TK_E4M3) || !defined(TK_W) || !defined(TK_K) || !defined(TK_WEIGHTS) || \
    !defined(TK_XSF) || !defined(TK_SF) || !defined(TK_TPB) || !defined(TK_SPLIT)
#error "TK_IN, TK_E4M3, TK_W, TK_K, TK_WEIGHTS, TK_XSF, TK_SF, TK_TPB and TK_SPLIT must be defined"
#endif

using namespace tkm;

#if TK_IN == 0
typedef float in_t;
__device__ __forceinline__ float to_f32(in_t v) { return v; }
#elif TK_IN == 1
typedef __nv_bfloat16 in_t;
__device__ __forceinline__ float to_f32(in_t v) { return __bfloat162float(v); }
#else
typedef __half in_t;
__device__ __forceinline__ float to_f32(in_t v) { return __half2float(v); }
#endif

#if TK_E4M3
typedef tk::u8 out_t;
__device__ __forceinline__ out_t from_f32(float v) { return (out_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); }
#elif TK_IN == 0
typedef float out_t;
__device__ __forceinline__ out_t from_f32(float v) { return v; }
#elif TK_IN == 1
typedef __nv_bfloat16 out_t;
__device__ __forceinline__ out_t from_f32(float v) { return __float2bfloat16_rn(v); }
#else
typedef __half out_t;
__device__ __forceinline__ out_t from_f32(float v) { return __float2half_rn(v); }
#endif

typedef tk::uint_of_size<TK_W * sizeof(in_t)>::type in_vec_t;    // TK_W inputs
typedef tk::uint_of_size<TK_W * sizeof(out_t)>::type out_vec_t;  // TK_W outputs
constexpr int WARPS = TK_TPB;                     // tokens per block (one per warp)
constexpr int BLOCKS_PER_SM = 20 / WARPS;         // launch bounds: <= 96 registers, 20 warps per SM
static_assert(WARPS >= 1 && 20 % WARPS == 0, "TK_TPB must divide 20");
constexpr int KG = (TK_K + 31) / 32;
constexpr int LOADS = 8;  // compacted slots per batch of the multi-batch sweep
// Vector loads per lane in flight for a token whose legal slots fit one batch (sweep_batch:
// at most LOADS slots in one slot group): LOADS_ONE / SB column vectors of each of SB slots.
// TK_LOADS_ONE (per architecture: 14 on sm_90a; 16 before the tail split, 8 before that):
// 7 KB per warp in flight, 2 full rounds per H = 7168 bf16 row for a single-slot token (16 gave
// 16 + 12 loads: the same 2 rounds). 14 because the tail split's column bound (a register,
// where the head's was the argument n) made 16 spill 4-12 bytes at 96 registers (fp32 and
// e4m3-out variants); with 14 every registered variant is spill-free. Cost: 3-4 slot tokens
// load 3 vectors of each slot per batch instead of 4 (10 rounds of an H = 7168 bf16 row
// instead of 7; ~5 % of the EP8 bench's tokens).
// On sm_100a (not measured; ptxas spilled 46-56 bytes with 16) the default stays 8.
#ifndef TK_LOADS_ONE
#if __CUDA_ARCH__ >= 1000
#define TK_LOADS_ONE 8
#else
#define TK_LOADS_ONE 14
#endif
#endif
constexpr int LOADS_ONE = TK_LOADS_ONE;

union InVec {
    in_vec_t raw;
    in_t e[TK_W];
};
union OutVec {
    out_vec_t raw;
    out_t e[TK_W];
};

// The sweep of a token whose legal slots fit one batch (one slot group, nv <= SB): pos/scl:
// lane r holds the row and scalar of the r-th legal slot (-1 and 0 for r >= nv); U = LOADS_ONE /
// SB column vectors per lane per batch (one for SB = 8). All loads of a batch are issued first; then each output
// vector's FMAs run in slot order from +0 and it is stored at once, so no accumulator lives
// beside another vector's loads (LOADS_ONE 16-byte loads per lane fit in registers). Slot 0's
// FMA runs unconditionally: with no legal slot (SB = 1 only) x = +0 and s = 0, and
// fma(+0, 0, +0) = +0 is the empty sum. out_row: output vectors of the token, of which this
// sweep writes [lo, n).
template <int SB>
__device__ __forceinline__ void sweep_batch(out_vec_t* __restrict__ out_row, const in_vec_t* __restrict__ x, u64 ldx,
                                            i32 pos, float scl, u32 nv, float gsf, u64 lo, u64 n, u32 lane) {
    // 5-8 slots keep one vector each (8 loads): 16 spilled a few registers.
    constexpr int U = SB >= LOADS || LOADS_ONE / SB < 1 ? 1 : LOADS_ONE / SB;
    i32 p[SB];    // (SB,) rows of the compacted slots (-1: none; warp-uniform)
    float s[SB];  // (SB,) their scalars
#pragma unroll
    for (int j = 0; j < SB; ++j) {
        p[j] = __shfl_sync(0xffffffffu, pos, j);
        s[j] = __shfl_sync(0xffffffffu, scl, j);
        if (j >= (int)nv) p[j] = -1;
    }
    for (u64 b = lo; b < n; b += 32 * U) {
        in_vec_t v[SB][U];  // (SB, U) vectors of TK_W inputs, columns b + 32u + lane
#pragma unroll
        for (int j = 0; j < SB; ++j)
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const u64 c = b + u * 32 + lane;
                v[j][u] = (p[j] >= 0 && c < n) ? __ldg(x + (u64)p[j] * ldx + c) : in_vec_t{};
            }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u64 c = b + u * 32 + lane;
            if (c >= n) continue;
            float acc[TK_W];  // (TK_W,) columns of vector c
#pragma unroll
            for (int i = 0; i < TK_W; ++i) acc[i] = 0.0f;
#pragma unroll
            for (int j = 0; j < SB; ++j) {
                if (j > 0 && p[j] < 0) continue;
                InVec e;
                e.raw = v[j][u];
#pragma unroll
                for (int i = 0; i < TK_W; ++i) acc[i] = __fmaf_rn(to_f32(e.e[i]), s[j], acc[i]);
            }
            OutVec o;
#pragma unroll
            for (int i = 0; i < TK_W; ++i) o.e[i] = from_f32(TK_SF ? __fmul_rn(acc[i], gsf) : acc[i]);
            out_row[c] = o.raw;
        }
    }
}

// The sweep of a token with more legal slots than one batch holds (or more than one slot
// group): pos/scl/nv as in the kernel (per slot group g: lane r holds the group's r-th legal
// slot, nv[g] legal slots, warp-uniform). Each column vector's accumulator stays live over
// batches of LOADS compacted slots (one 16-byte load of each per lane), FMAs in slot order.
// out_row: output vectors of the token, of which this sweep writes [lo, n).
__device__ __forceinline__ void sweep(out_vec_t* __restrict__ out_row, const in_vec_t* __restrict__ x, u64 ldx,
                                      const i32 (&pos)[KG], const float (&scl)[KG], const u32 (&nv)[KG],
                                      float gsf, u64 lo, u64 n, u32 lane) {
    for (u64 c0 = lo; c0 < n; c0 += 32) {  // the whole warp iterates: shuffles need every lane
        const u64 c = c0 + lane;
        float acc[TK_W];  // (TK_W,) columns of vector c
#pragma unroll
        for (int i = 0; i < TK_W; ++i) acc[i] = 0.0f;
#pragma unroll
        for (int g = 0; g < KG; ++g) {
            for (u32 j0 = 0; j0 < nv[g]; j0 += LOADS) {  // warp-uniform
                i32 p[LOADS];
                float s[LOADS];
                in_vec_t v[LOADS];  // (LOADS,) vectors of TK_W inputs
#pragma unroll
                for (int j = 0; j < LOADS; ++j) {
                    p[j] = __shfl_sync(0xffffffffu, pos[g], (j0 + j) % 32);
                    s[j] = __shfl_sync(0xffffffffu, scl[g], (j0 + j) % 32);
                    if (j0 + j >= nv[g]) p[j] = -1;
                    v[j] = (p[j] >= 0 && c < n) ? __ldg(x + (u64)p[j] * ldx + c) : in_vec_t{};
                }
#pragma unroll
                for (int j = 0; j < LOADS; ++j) {
                    if (p[j] < 0) continue;
                    InVec e;
                    e.raw = v[j];
#pragma unroll
                    for (int i = 0; i < TK_W; ++i) acc[i] = __fmaf_rn(to_f32(e.e[i]), s[j], acc[i]);
                }
            }
        }
        if (c >= n) continue;
        OutVec o;
#pragma unroll
        for (int i = 0; i < TK_W; ++i) o.e[i] = from_f32(TK_SF ? __fmul_rn(acc[i], gsf) : acc[i]);
        out_row[c] = o.raw;
    }
}

// Asks for the L2 line holding *p (a hint: no value, no fault).
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// out: (T, n) output vectors, contiguous; x: (M, n) input vectors, row stride ldx (vectors);
// x_sf: (M,) fp32 stride ld_xsf; w: (T, K) fp32 row stride ld_w; ttp: (T, K) i32 row stride
// ld_ttp; sf: (1,) fp32. n = H / TK_W. ahead: the token distance of the L2 prefetch.
// One task per warp, task = task0 + global warp index (the host launches as many warps as
// tasks, in launches of at most 2^30 blocks: no grid-stride loop state stays live beside the
// loads): tasks [0, head) are tokens [0, head), all n vectors; tokens [head, T) are TK_SPLIT
// tasks each, task c covering the vectors [c·chunk, min(n, (c+1)·chunk)) (the host splits only
// when TK_SPLIT divides n, chunk = n / TK_SPLIT; an empty range is skipped).
extern "C" __global__ void __launch_bounds__(WARPS * 32, BLOCKS_PER_SM)
    tk_reduce_fused(out_vec_t* __restrict__ out, const in_vec_t* __restrict__ x, u64 ldx, const float* __restrict__ x_sf,
                    u64 ld_xsf, const float* __restrict__ w, u64 ld_w, const i32* __restrict__ ttp, u64 ld_ttp,
                    const float* __restrict__ sf, u64 T, u64 M, u64 n, u64 ahead, u64 head, u64 chunk, u64 task0) {
    const u32 lane = threadIdx.x % 32;
    __shared__ i32 cpos[WARPS][32];    // (WARPS, 32) per warp: the compacted rows of a group
    __shared__ float cscl[WARPS][32];  // (WARPS, 32) and scalars
    i32* my_pos = cpos[threadIdx.x / 32];
    float* my_scl = cscl[threadIdx.x / 32];
    const u64 task = task0 + (u64)blockIdx.x * WARPS + threadIdx.x / 32;
    u64 t = task, lo = 0, hi = n;  // token t, its output vectors [lo, hi) (warp-uniform)
    if (task >= head) {
        const u64 r = task - head;
        t = head + r / TK_SPLIT;
        lo = (r % TK_SPLIT) * chunk;
        hi = min(n, lo + chunk);
    }
    if (t >= T || lo >= hi) return;  // warp-uniform
    const float gsf = TK_SF ? __ldg(sf) : 1.0f;
    const u64 tp = t + ahead;  // the token whose positions and weights are prefetched
    if (lo == 0 && tp < T && lane < TK_K) {
        prefetch_l2(ttp + tp * ld_ttp + lane);
        if (TK_WEIGHTS) prefetch_l2(w + tp * ld_w + lane);
    }
    i32 pos[KG];    // lane r of group g: the row of the group's r-th legal slot
    float scl[KG];  // and its scalar s
    u32 nv[KG];     // legal slots of group g (warp-uniform)
    u32 total = 0;
#pragma unroll
    for (int g = 0; g < KG; ++g) {
        const u32 k = g * 32 + lane;
        // The weight is loaded with the position, not after it (it is in the validated
        // (T, K) tensor whatever the position): one memory round instead of two.
        const i32 q = k < TK_K ? (i32)legal_or_minus_one(__ldg(ttp + t * ld_ttp + k), (i64)M) : -1;
        const float wk = TK_WEIGHTS && k < TK_K ? __ldg(w + t * ld_w + k) : 1.0f;
        float s = 1.0f;
#if TK_WEIGHTS
        if (q >= 0) s = wk;
#endif
#if TK_XSF
        if (q >= 0) s = __fmul_rn(s, __ldg(x_sf + (u64)q * ld_xsf));
#endif
        const u32 legal = __ballot_sync(0xffffffffu, q >= 0);
        nv[g] = __popc(legal);
        total += nv[g];
        // Compaction in slot order: the legal slot of rank r (legal lanes below it) goes to
        // lane r through the warp's shared row; lanes >= nv[g] keep -1 (never read).
        if (q >= 0) {
            const u32 r = __popc(legal & ((1u << lane) - 1u));
            my_pos[r] = q;
            my_scl[r] = s;
        }
        __syncwarp();
        pos[g] = lane < nv[g] ? my_pos[lane] : -1;
        scl[g] = lane < nv[g] ? my_scl[lane] : 0.0f;
        __syncwarp();  // the reads finish before the next group's writes
    }
    out_vec_t* out_row = out + t * n;  // (n,) output vectors of token t, [lo, hi) written here
    if (KG == 1 && total <= 1)
        sweep_batch<1>(out_row, x, ldx, pos[0], scl[0], nv[0], gsf, lo, hi, lane);
    else if (KG == 1 && total <= 2)
        sweep_batch<2>(out_row, x, ldx, pos[0], scl[0], nv[0], gsf, lo, hi, lane);
    else if (KG == 1 && total <= 4)
        sweep_batch<4>(out_row, x, ldx, pos[0], scl[0], nv[0], gsf, lo, hi, lane);
    else if (KG == 1 && (TK_K <= LOADS || total <= LOADS))  // K <= LOADS: sweep is never needed
        sweep_batch<LOADS>(out_row, x, ldx, pos[0], scl[0], nv[0], gsf, lo, hi, lane);
    else
        sweep(out_row, x, ldx, pos, scl, nv, gsf, lo, hi, lane);
}
