// SwiGLU forward fused with a per-token cast (spec/quant.md §3.10; the CPU reference is
// reference::swiglu_forward_and_per_token_cast, which this kernel matches bit for bit given
// CUDA's expf).
//
// For each row i < N, processed unless pos_to_expert[i] < 0, and column j < H:
//   l = fp32(x[i, j]), v = fp32(x[i, H + j]), clamped (if has_clamp: l <= C, v in [-C, C])
//   a = fl(fl(l / fl(1 + expf(-l))) * v), then a = fl(a * w_i) with weights
//   (w_i = topk_weights.flat[pos_to_token_topk[i]], 0 for a negative or out-of-range entry)
//   out: a (fp32), bf16(a), or the per-token cast of a in groups of NPC (128 or H) columns.
// Padding rows are written as zeros with a zero scale and are not counted.
// Clamp counts (TK_CLAMP 2): [#(l > C), #(v > C), #(v < -C)] over processed rows, added with
// one 64-bit atomic per CTA and counter (order-independent integer sums).
//
// Compile-time constants (defines):
//   TK_IN        0 fp32, 1 bf16 input
//   TK_OUT       0 fp32, 1 bf16, 2 e4m3, 3 packed e2m1
//   TK_SF_OUT    (quantized) 0 layout A, 1 layout B, 2 layout C
//   TK_ROUND     (quantized) 1: power-of-two scales
//   TK_VECIO     1: vector accesses (every row start 16-byte aligned); 0: bytewise
//   TK_CLAMP     0: no clamp; 1: clamp to C; 2: clamp and count (p.count set); 3: clamp to C
//                by min / max (tkq::swiglu_clamp_minmax; the host's choice for C != -0.0);
//                4: the same on the raw bf16 pairs before widening (bf16 input, C exact in bf16)
//   TK_W         0: no routing weights (p.ptt is 0; no weight code); 1: weights if p.ptt
//   TK_RPT       tiled path: rows per team
//   TK_FPL       tiled path: 8-column fragments per lane and row (1 or 2; default 1); the
//                host uses RPT x FPL = 2 for bf16 (RPT 1, FPL 2), 1 for fp32 input: 64 bytes
//                of x in flight per lane
//   TK_MINB      tiled path: CTAs per SM for __launch_bounds__ (4: at most 64 registers, 5: 48)
//   TK_CT        tiled path: consecutive column tiles per CTA (the host launches
//                ceil(H / 128 / TK_CT) CTAs in x); 1: one tile per CTA (the old geometry)
//   TK_SKIPPAD   tiled path: 1: padding rows (pos_to_expert < 0) are not loaded (p.pte set)
//   TK_TAIL      tiled path: 1: a 1-D grid of p.nbig runs then single-tile CTAs (see the
//                kernel); 0: the 2-D grid (runs x row tiles), every CTA a run
//   TK_Q4        tiled path, fp32 output: 1: a lane's columns are quads (4 columns) spaced
//                by 4 TEAM, so every load and store instruction of a team covers whole 32-byte
//                sectors (16-byte stores side by side); 0: 8 FPL adjacent columns
//   TK_THREADS, TK_NF  whole-row path (one scale per row, npc == H): threads per CTA and
//                fragments per thread; undefined: the tiled path (groups of 128 columns)
#include "tk/fused_io.cuh"

using tk::u8;
using tk::u32;
using tk::u64;
using tk::i32;

// Kernel arguments (mirrored by `FwdArgs` in src/swiglu_forward_and_per_token_cast.rs).
struct Params {
    u64 x, ldx;              // (N, 2H) fp32 / bf16, row stride ldx elements
    u64 ptt, ptt_s;          // pos_to_token_topk (N,) int32, stride (0 pointer: no weights)
    u64 tw, tw_s0, tw_s1;    // topk_weights (T, k) fp32, strides
    u64 tw_k, tw_len;        // k and T * k
    u64 pte, pte_s;          // pos_to_expert (N,) int32, stride (0 pointer: every row processed)
    u64 out;                 // (N, H) fp32 / bf16 / e4m3 or (N, H/2) e2m1, contiguous
    u64 sf;                  // scales (quantized): full storage of grid (N, H/npc)
    u64 count;               // int64 (3,) clamp counts (0: not counting)
    u64 n, h, nbk, ra;       // rows, H, scale columns, align(N, 4)
    u64 nbig;                // tiled path, TK_TAIL 1: CTAs taking a whole run (the rest one tile)
    float clamp;             // C (TK_CLAMP 1-4)
    float eps;               // amax clamp (sf_clamp_min or the format's)
};

#if TK_OUT < 2
#define TK_SF_OUT 0  // plain outputs have no scales: the scale code below is compiled, never run
#define TK_ROUND 0
#endif
constexpr bool QUANT = TK_OUT >= 2;
constexpr bool VECIO = TK_VECIO != 0;
constexpr int IN_BYTES = TK_IN == 0 ? 4 : 2;
#if TK_OUT == 3
constexpr float QMAX = 6.0f;
#else
constexpr float QMAX = 448.0f;
#endif

constexpr int CLAMP = TK_CLAMP;
static_assert(CLAMP != 4 || TK_IN == 1, "TK_CLAMP 4 clamps bf16 input");
constexpr bool WEIGHTS = TK_W != 0;  // the routing-weight code is compiled (used if p.ptt)
#ifndef TK_SKIPPAD
#define TK_SKIPPAD 0  // tiled path, 1: padding rows are not loaded (see load_tile)
#endif
using Words = u32[IN_BYTES * 2];  // the raw words of one 8-column fragment of x

// Per-row routing state: processed (not padding) and the pos_to_token_topk entry (-1: none).
// Loaded (with the dependent weight) once per row tile, before the row's data.
struct RowInfo {
    bool processed;
    i32 slot;
};

__device__ __forceinline__ RowInfo row_info(const Params& p, u64 r) {
    RowInfo ri{true, -1};
    if (p.pte) ri.processed = reinterpret_cast<const i32*>(p.pte)[r * p.pte_s] >= 0;
    if (WEIGHTS && p.ptt) ri.slot = reinterpret_cast<const i32*>(p.ptt)[r * p.ptt_s];
    return ri;
}

// The routing weight of a row: topk_weights.flat[slot], 0 for a negative or out-of-range slot
// (1 without weights, not used). Row-contiguous weights (s0 = k s1, the usual (T, k) tensor):
// the flat index times s1, no division. Otherwise (slot / k, slot % k): a valid slot is below
// 2^31, so this is a 32-bit division (inline, ~15 instructions, not the 64-bit division's
// ~70-instruction call once per row); k >= 2^32 is clamped to 2^32 - 1 > slot, which gives the
// same (0, slot).
__device__ __forceinline__ float row_weight(const Params& p, i32 slot) {
    if (!WEIGHTS || !p.ptt) return 1.0f;
    const bool ok = slot >= 0 && (u64)slot < p.tw_len;
    const u32 q = ok ? (u32)slot : 0u;
    u64 at;  // element offset of topk_weights.flat[q]
    if (p.tw_s0 == p.tw_k * p.tw_s1) {
        at = (u64)q * p.tw_s1;
    } else {
        const u32 k = p.tw_k > 0xFFFFFFFFull ? 0xFFFFFFFFu : (u32)p.tw_k;
        at = (u64)(q / k) * p.tw_s0 + (u64)(q % k) * p.tw_s1;
    }
    return ok ? reinterpret_cast<const float*>(p.tw)[at] : 0.0f;
}

// Loads the raw gate and value fragments f < F (8 columns from c0 + 8 f each) of row r: one
// row offset, the fragments at constant byte offsets from it.
template <int F>
__device__ __forceinline__ void load_pairs(const Params& p, u64 r, u64 c0, Words (&l)[F], Words (&v)[F]) {
    const u8* gate = reinterpret_cast<const u8*>(p.x) + (r * p.ldx + c0) * IN_BYTES;  // (2H - c0,) elements
    const u8* val = gate + p.h * IN_BYTES;                                             // (H - c0,) elements
#pragma unroll
    for (int f = 0; f < F; ++f) {
        tkq::load_bytes<IN_BYTES * 8, VECIO>(gate + f * 8 * IN_BYTES, l[f]);
        tkq::load_bytes<IN_BYTES * 8, VECIO>(val + f * 8 * IN_BYTES, v[f]);
    }
}

// Loads the raw gate and value fragments (8 columns from c0) of row r.
__device__ __forceinline__ void load_pair(const Params& p, u64 r, u64 c0, Words& l, Words& v) {
    load_pairs<1>(p, r, c0, reinterpret_cast<Words (&)[1]>(l), reinterpret_cast<Words (&)[1]>(v));
}

// TK_CLAMP 4: clamps raw bf16 gate and value pairs in place, two elements per HMNMX2: for C
// exact in bf16, min / max of the bf16 values are the fp32 ones (widening is exact and
// monotonic, a clamped element becomes C or -C exactly), so this is swiglu_clamp_minmax
// element for element.
__device__ __forceinline__ void clamp_raw(const Params& p, Words& lw, Words& vw) {
    const u32 c2 = tkq::bf16x2_bits(p.clamp, p.clamp), m2 = c2 ^ 0x80008000u;  // (C, C), (-C, -C)
#pragma unroll
    for (int i = 0; i < IN_BYTES * 2; ++i) {
        lw[i] = tkq::bf16x2_min_nan(lw[i], c2);
        vw[i] = tkq::bf16x2_min_nan(tkq::bf16x2_max_nan(vw[i], m2), c2);
    }
}

// bf16 input whose gates reach the division as loaded or clamped on the raw pairs (TK_CLAMP 0
// or 4), tiled path: the inline division's range check (tkq::fast_div_ok: |l| in [2^-40, 40])
// runs once per tile on the raw bf16 words (|l| as 16-bit integers, in the order of the
// values, NaN above inf: one mask per pair, u16x2 minima and maxima over the lane's 16 gates,
// 4 compares) instead of two fp32 compares per gate and fragment (sm_90a bf16 -> e4m3 layout
// C: ~38 -> ~28 instructions per tile). Measured with the balanced grid of session 8 (since
// removed; meas m4, H200): the per-fragment fp32 check was 1.018x slower in the mean (K=6
// H=3584 N=24240 weights 165.4 vs 160.6 us, clamp 0.5 with pos_to_expert 130.3 vs 126.1 us).
constexpr bool RAWCHECK = TK_IN == 1 && (CLAMP == 0 || CLAMP == 4);

// Whether every gate of the K raw bf16 fragments g passes tkq::fast_div_ok: with |l| as a
// 16-bit integer b (sign cleared), |l| in [2^-40, 40] iff b in [0x2B80, 0x4220] (non-negative
// bf16 order as their bits; inf 0x7F80 and NaN above 40, zeros and denormals below 2^-40).
template <int K>
__device__ __forceinline__ bool gates_ok_raw(const Words (&g)[K]) {
    u32 mx = g[0][0] & 0x7FFF7FFFu, mn = mx;  // (2,) u16 maxima and minima of |l|
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
        for (int i = (k == 0); i < IN_BYTES * 2; ++i) {
            const u32 b = g[k][i] & 0x7FFF7FFFu;
            mx = tkq::u16x2_max(mx, b);
            mn = tkq::u16x2_min(mn, b);
        }
    // high halves by the 32-bit compare, low halves shifted up
    return (mx <= 0x4220FFFFu) & ((mx << 16) <= 0x42200000u) & (mn >= 0x2B800000u) & ((mn << 16) >= 0x2B800000u);
}

// The activation a (8,) of a fragment from its raw gate lw and value vw, times the row weight
// w with routing weights; counts the clamps of a processed row. A padding row's values are
// not used (store_out writes its zeros). RAW: lw and vw already went through clamp_raw
// (TK_CLAMP 4) and ok is the range check of the gates (gates_ok_raw).
template <bool RAW>
__device__ __forceinline__ void activate(const Params& p, bool processed, float w, const Words& lw, const Words& vw, float (&a)[8], u32 (&cnt)[3], bool ok) {
    float l[8], v[8];  // (8,) gate and value
    if constexpr (CLAMP == 4 && !RAW) {
        Words lc = {}, vc = {};  // clamped raw gate and value pairs
#pragma unroll
        for (int i = 0; i < IN_BYTES * 2; ++i) lc[i] = lw[i], vc[i] = vw[i];
        clamp_raw(p, lc, vc);
        tkq::widen8<TK_IN>(lc, l);
        tkq::widen8<TK_IN>(vc, v);
    } else {
        tkq::widen8<TK_IN>(lw, l);
        tkq::widen8<TK_IN>(vw, v);
    }
    if constexpr (CLAMP == 3) {
#pragma unroll
        for (int j = 0; j < 8; ++j) tkq::swiglu_clamp_minmax(l[j], v[j], p.clamp);
    } else if constexpr (CLAMP == 1 || CLAMP == 2) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const tkq::ClampFlags f = tkq::swiglu_clamp<true>(l[j], v[j], p.clamp);
            if (CLAMP == 2 && processed) {
                cnt[0] += f.gate;
                cnt[1] += f.hi;
                cnt[2] += f.lo;
            }
        }
    }
    if constexpr (RAW) tkq::swiglu_act8_checked(l, v, a, ok);
    else tkq::swiglu_act8(l, v, a);
    if (WEIGHTS && p.ptt)
#pragma unroll
        for (int j = 0; j < 8; ++j) a[j] = __fmul_rn(a[j], w);
}

// The output words of a fragment (fp32, bf16, e4m3 or e2m1 codes) and their byte offset in
// out per element.
#if TK_OUT < 2
constexpr int OUT_WORDS = tkq::Plain8<TK_OUT>::WORDS;
#else
constexpr int OUT_WORDS = tkq::Quant8<TK_OUT - 2>::WORDS;
#endif

// Stores the fragments f < F (8 columns from c0 + 8 f each; c0 a multiple of 8 F) of row r
// in the output format (quantized with inv) as one run of F OUT_WORDS words (one 16-byte
// store for two e4m3 fragments); a padding row (not processed) gets +0 codes, selected on the
// packed words (OUT_WORDS selects instead of 8 on the values).
template <int F>
__device__ __forceinline__ void store_outs(const Params& p, bool processed, u64 r, u64 c0, const float (&a)[F][8], float inv) {
    u32 w[F * OUT_WORDS];  // (F OUT_WORDS,) packed output of the 8 F columns
#pragma unroll
    for (int f = 0; f < F; ++f) {
        u32 (&wf)[OUT_WORDS] = *reinterpret_cast<u32 (*)[OUT_WORDS]>(w + f * OUT_WORDS);  // fragment f's words
#if TK_OUT < 2
        tkq::pack8_plain<TK_OUT>(a[f], wf);
#else
        tkq::pack8_quant<TK_OUT - 2>(a[f], inv, wf);
#endif
    }
#pragma unroll
    for (int j = 0; j < F * OUT_WORDS; ++j) w[j] = processed ? w[j] : 0u;
    // (N, H) fp32 / bf16 / e4m3 or (N, H/2) e2m1: 8 columns are OUT_WORDS * 4 bytes; the run
    // starts at a multiple of F OUT_WORDS * 4 bytes (H is a multiple of 128)
    u8* out = reinterpret_cast<u8*>(p.out) + (r * p.h + c0) / 8 * (OUT_WORDS * 4);
    tkq::store_bytes<F * OUT_WORDS * 4, VECIO>(out, w);
}

// Stores the fragment at row r, columns c0.. (store_outs of one fragment).
__device__ __forceinline__ void store_out(const Params& p, bool processed, u64 r, u64 c0, const float (&a)[8], float inv) {
    store_outs<1>(p, processed, r, c0, reinterpret_cast<const float (&)[1][8]>(a), inv);
}

// (sf, inv) of a group with maximum amax; a padding row gets (0, 0) (store_out zeroes its codes).
__device__ __forceinline__ void group_scale(const Params& p, bool processed, float amax, float& sf, float& inv) {
    tkq::scale_pair<TK_ROUND != 0>(amax, p.eps, QMAX, sf, inv);
    if (!processed) sf = inv = 0.0f;
}

__device__ __forceinline__ void store_group_scale(const Params& p, u64 r, u64 kb, float sf) {
    if constexpr (QUANT) tkq::store_scale<TK_SF_OUT>(p.sf, p.n, p.nbk, p.ra, r, kb, sf);
}

// Adds the CTA's clamp counts to p.count (one atomic per counter; TK_CLAMP 2); every thread
// must call it.
__device__ __forceinline__ void flush_counts(const Params& p, u32 (&cnt)[3]) {
    __shared__ u32 total[3];  // (3,) CTA sums
    if constexpr (CLAMP != 2) return;
    if (threadIdx.x < 3) total[threadIdx.x] = 0;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 3; ++k) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) cnt[k] += __shfl_xor_sync(0xFFFFFFFFu, cnt[k], o);
        if (threadIdx.x % 32 == 0 && cnt[k]) atomicAdd(&total[k], cnt[k]);
    }
    __syncthreads();
    if (threadIdx.x < 3 && total[threadIdx.x])
        atomicAdd(reinterpret_cast<unsigned long long*>(p.count) + threadIdx.x, (unsigned long long)total[threadIdx.x]);
}

#ifndef TK_THREADS
// ---------------------------------------------------------------------------------------------
// Tiled path (groups of 128 columns, or a plain output): CTA of 256 threads = teams of
// TEAM = 16 / FPL lanes; a team covers one 128-column group of RPT rows, each lane FPL
// adjacent fragments (8 FPL columns) of each row. Tile: TEAMS RPT rows x 128 columns; grid x
// over runs of CT consecutive column tiles, y over row tiles (TK_TAIL 0; TK_TAIL 1: a 1-D grid
// of the same runs in the same order, a small last partial wave's cut into single tiles). A
// lane loads its rows' routing entries and weights once per row tile (the dependent
// pos_to_token_topk -> topk_weights chain and the index arithmetic are paid once for CT tiles,
// not once per tile: with one tile per CTA these per-thread costs were about half the executed
// instructions); then per column tile it loads all its x fragments (raw words, kept narrow
// until used), activates them and reduces the rows' team maxima together (the RPT shuffle
// chains interleave). With FPL 2 a row's per-tile costs (row offsets, log2(TEAM) shuffles,
// scale, row checks) are shared by 16 elements instead of 8, and the second fragment's
// addresses are the first's plus a constant.
// At most 64 registers (TK_MINB 4) give 32 resident warps per SM, 48 (TK_MINB 5) 40.
// ---------------------------------------------------------------------------------------------
#ifndef TK_CT
#define TK_CT 1
#endif
#ifndef TK_FPL
#define TK_FPL 1
#endif
#ifndef TK_Q4
#define TK_Q4 0
#endif
constexpr int RPT = TK_RPT, FPL = TK_FPL, NS = RPT * FPL;  // NS fragments (slots) per lane
constexpr int TC = 128, TEAM = TC / (8 * FPL), TEAMS = 256 / TEAM, TR = TEAMS * RPT;
constexpr bool Q4 = TK_Q4 != 0;
static_assert(FPL == 1 || FPL == 2, "TK_FPL is 1 or 2");
static_assert(!Q4 || TK_OUT == 0, "TK_Q4 is for fp32 output");

#ifndef TK_PACKC
#define TK_PACKC 0
#endif
// Layout C (packed UE8M0: 4 scale bytes per int32 along the scale columns) with every run a
// full 4 tiles starting at a multiple of 4 (TK_CT 4, H / 128 a multiple of 4; the host's
// choice): a run's 4 scale bytes of a row are one int32 of the storage, collected in a
// register and stored once after the run (one 4-byte store and its index arithmetic per 4
// tiles instead of a byte store per tile, whose ~30 instructions every warp issued for its
// storing lanes). TK_TAIL 1: a single-tile CTA of the tail stores its byte alone.
constexpr bool PACK_C = TK_PACKC != 0;
static_assert(!PACK_C || (QUANT && TK_SF_OUT == 2 && TK_CT == 4), "TK_PACKC needs layout C and runs of 4 tiles");

#ifndef TK_TAIL
#define TK_TAIL 1
#endif

// Stores the int32 word w of layout C (4 scale bytes, scale column 4 c4 + k in byte k) of row
// r for the run of 4 tiles from tc0 = 4 c4 (word), else the low byte of w, the scale of the
// single tile tc0 (scale column tc0: byte tc0 % 4 of word c4 = tc0 / 4; the same address, as
// tc0 % 4 is 0 for a run); and zeros there for the alignment rows N..ra when r is the last row
// (store_scale's padding for these columns; there are no padding columns: nbk = H / 128 is a
// multiple of 4).
__device__ __forceinline__ void store_scale_word(const Params& p, u64 r, u64 tc0, u32 w, bool word) {
#if !TK_TAIL  // runs only (word): the store as before TK_TAIL (the form below spilled 36-40 bytes in the counting kernels at TK_TAIL 0)
    u32* s = reinterpret_cast<u32*>(p.sf);  // storage (nbk / 4, ra) int32 (a Ue8m0x4 tensor: 4-byte aligned)
    s[tc0 / 4 * p.ra + r] = w;
    if (r + 1 == p.n)
        for (u64 r2 = p.n; r2 < p.ra; ++r2) s[tc0 / 4 * p.ra + r2] = 0;
#else
    u8* s = reinterpret_cast<u8*>(p.sf) + 4 * (tc0 / 4 * p.ra) + tc0 % 4;  // storage (nbk / 4, ra) int32 (4-byte aligned) as bytes, word tc0 / 4 from byte tc0 % 4
    for (u64 r2 = r; r2 < (r + 1 == p.n ? p.ra : r + 1); ++r2) {
        const u32 v = r2 == r ? w : 0u;  // the scales, then the alignment rows' zeros
        if (word) *reinterpret_cast<u32*>(s + 4 * r2) = v;
        else s[4 * r2] = (u8)v;
    }
#endif
}

// The lane's FPL fragments of row r in column tile tc: fragment f, half h (4 columns, words
// [h IN_BYTES, (h + 1) IN_BYTES) of the raw fragment) is quad q = 2 f + h at columns
// tc TC + 4 (q TEAM + tl) with TK_Q4, else columns tc TC + 8 (FPL tl + f) + 4 h.
__device__ __forceinline__ u64 lane_col(u64 tc, u32 tl) {
    return tc * TC + (Q4 ? 4 * tl : 8 * FPL * tl);
}

// Loads the raw gate and value fragments of the lane in row r, column tile tc.
__device__ __forceinline__ void load_lane(const Params& p, u64 r, u64 tc, u32 tl, Words (&l)[FPL], Words (&v)[FPL]) {
    if constexpr (Q4) {
        const u8* gate = reinterpret_cast<const u8*>(p.x) + (r * p.ldx + lane_col(tc, tl)) * IN_BYTES;  // (2H - c,) elements
        const u8* val = gate + p.h * IN_BYTES;                                                           // (H - c,) elements
#pragma unroll
        for (int q = 0; q < 2 * FPL; ++q) {
            const int off = q * TEAM * 4 * IN_BYTES;  // quad q's byte offset from the lane's first column
            tkq::load_bytes<IN_BYTES * 4, VECIO>(gate + off, *reinterpret_cast<u32 (*)[IN_BYTES]>(l[q / 2] + (q % 2) * IN_BYTES));
            tkq::load_bytes<IN_BYTES * 4, VECIO>(val + off, *reinterpret_cast<u32 (*)[IN_BYTES]>(v[q / 2] + (q % 2) * IN_BYTES));
        }
    } else {
        load_pairs<FPL>(p, r, lane_col(tc, tl), l, v);
    }
}

// Loads the lane's fragments of the team's RPT rows from r0 in column tile tc (routing state
// ri); a row beyond N gets constant words (it is never stored). TK_SKIPPAD 1: so does a
// padding row (pos_to_expert < 0, stored as zeros whatever x holds), which saves its x reads
// (K=2 256/EP8 N=8256: ~3 % of the rows) at the cost of waiting for the row's pos_to_expert
// entry before the first tile's loads of a row tile; the constant gates are 1.0 so that such
// rows take the inline division (0.0 gates would take the __fdiv_rn fallback). 0: padding
// rows are loaded, rows beyond N get zero words.
constexpr u32 GATE_FILL = !TK_SKIPPAD ? 0u : TK_IN == 0 ? 0x3F800000u : 0x3F803F80u;  // fp32 1.0 / bf16 (1.0, 1.0)
__device__ __forceinline__ void load_tile(const Params& p, u64 r0, const RowInfo (&ri)[RPT], u64 tc, u32 tl, Words (&l)[RPT][FPL], Words (&v)[RPT][FPL]) {
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
        if (TK_SKIPPAD ? ri[i].processed : r0 + i < p.n) load_lane(p, r0 + i, tc, tl, l[i], v[i]);
        else
#pragma unroll
            for (int f = 0; f < FPL; ++f)
#pragma unroll
                for (int j = 0; j < IN_BYTES * 2; ++j) l[i][f][j] = GATE_FILL, v[i][f][j] = 0;
    }
}

// Stores the lane's activations a (FPL fragments) of row r in column tile tc (store_outs, or
// with TK_Q4 one 16-byte store per quad).
__device__ __forceinline__ void store_lane(const Params& p, bool processed, u64 r, u64 tc, u32 tl, const float (&a)[FPL][8], float inv) {
#if TK_Q4  // fp32 output only
    {
        constexpr int QW = OUT_WORDS / 2, QB = QW * 4;  // words and bytes of a quad's output
        u32 w[FPL * OUT_WORDS];                         // (FPL OUT_WORDS,) packed output, quad q at words q QW
#pragma unroll
        for (int f = 0; f < FPL; ++f) tkq::pack8_plain<TK_OUT>(a[f], *reinterpret_cast<u32 (*)[OUT_WORDS]>(w + f * OUT_WORDS));
#pragma unroll
        for (int j = 0; j < FPL * OUT_WORDS; ++j) w[j] = processed ? w[j] : 0u;
        u8* out = reinterpret_cast<u8*>(p.out) + (r * p.h + lane_col(tc, tl)) / 4 * QB;  // (N, H) fp32
#pragma unroll
        for (int q = 0; q < 2 * FPL; ++q) tkq::store_bytes<QB, VECIO>(out + q * TEAM * QB, *reinterpret_cast<const u32 (*)[QW]>(w + q * QW));
    }
#else
    store_outs<FPL>(p, processed, r, lane_col(tc, tl), a, inv);
#endif
}

// TK_TAIL 1: the grid's last partial wave is cut into single tiles. With every CTA a run of 4
// column tiles (the 2-D grid of TK_TAIL 0), the CTAs of a launch run in near-lockstep waves of
// SMs x 5 and a partial last wave costs a whole one: its few CTAs run alone, latency-bound
// (meas32: times fit ceil(waves) x ~13.6 us; K=6 H=3584 N=24240: 5306 CTAs = 8.04 waves of
// 660, the 0.04 costing ~12 us). The host (which knows the SMs and the occupancy) launches
// p.nbig run CTAs (whole waves, in the 2-D grid's order: runs of a row tile side by side), then
// the remaining runs' tiles one per CTA (after them in blockIdx order, so the hardware hands
// them out last): the tail costs ceil(4 r / slots) single-tile rounds (r runs left) instead of
// one run round. A single-tile CTA stores its layout C scale as a byte (store_scale_word).
// The host cuts only without pos_to_expert and r <= slots / 16 (tiled_grid: with it the
// padding tiles finish early, the waves are not lockstep and the cut lost 0.8-2.0 %; larger
// remainders lost 1.8-2.9 %); otherwise p.nbig is every run. Measured (D2, H200): K=6 H=3584
// N=24240 (26 runs left of 660) e4m3 layout C 116.91 -> 111.42 us, bf16 131.82 -> 126.30.

// Row tile tr over the column tiles tc0 .. tc0 + nt - 1 (nt <= TK_CT; the tiles of one run).
// PACK_C: nt 4, a run of 4 tiles from a multiple of 4 (its scales stored as one int32), or nt
// 1, a single tile (its scale byte stored alone, after the loop as well: a per-tile branch
// between the two stores cost ~14 SASS instructions per tile, a template with two inlined
// loops spilled 16 bytes on sm_100a, and a separate flag 4-16 bytes).
__device__ __forceinline__ void row_tile(const Params& p, u32 tr, u64 tc0, u32 nt, u32 tl, u32 team, u32 (&cnt)[3]) {
    // tr and tr TR in u32: x has fewer than 2^32 rows (each row holds at least 512 bytes).
    // With the raw-word range check, u64 (main's type) spilled 12 bytes in the sm_100a H = 1280
    // layout C kernels, and a u64 product 8-36 bytes in five others.
    const u64 r0 = tr * TR + team * RPT;  // first row of this team
    u32 sf_word = 0;                      // (4,) scale bytes of row r0 + tl (PACK_C)
    RowInfo ri[RPT];                      // rows beyond N: not processed
#pragma unroll
    for (int i = 0; i < RPT; ++i) ri[i] = r0 + i < p.n ? row_info(p, r0 + i) : RowInfo{false, -1};
    float w[RPT];  // (RPT,) routing weights
#pragma unroll
    for (int i = 0; i < RPT; ++i) w[i] = row_weight(p, ri[i].slot);
#pragma unroll 1
    for (u32 k = 0; k < nt; ++k) {
        const u64 tc = tc0 + k;  // column tile
        // Slot s = i FPL + f: row r0 + i, the lane's fragment f (load_lane) of the tile.
        Words l[RPT][FPL], v[RPT][FPL];  // (RPT rows, FPL) raw gate and value fragments, all in flight
        load_tile(p, r0, ri, tc, tl, l, v);
        float a[RPT][FPL][8];  // (RPT rows, FPL fragments, 8 columns) activations
        bool ok[RPT];          // (RPT,) RAWCHECK: the rows' gates pass the inline division's range
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            ok[i] = true;
            if constexpr (RAWCHECK) {
                if constexpr (CLAMP == 4)
#pragma unroll
                    for (int f = 0; f < FPL; ++f) clamp_raw(p, l[i][f], v[i][f]);
                ok[i] = gates_ok_raw(l[i]);
            }
        }
#pragma unroll
        for (int s = 0; s < NS; ++s)
            activate<RAWCHECK>(p, ri[s / FPL].processed, w[s / FPL], l[s / FPL][s % FPL], v[s / FPL][s % FPL], a[s / FPL][s % FPL], cnt, ok[s / FPL]);
        // The rows' team maxima reduced together (their shuffle chains interleave), then
        // their scales; lane i < RPT stores the scale of row r0 + i.
        float inv[RPT], my_sf = 0.0f;  // (RPT,) inverse scales
#pragma unroll
        for (int i = 0; i < RPT; ++i) inv[i] = 0.0f;
        if constexpr (QUANT) {
            float am[RPT];  // (RPT,) row maxima over the lane's, then the team's, columns
#pragma unroll
            for (int i = 0; i < RPT; ++i) am[i] = 0.0f;
#pragma unroll
            for (int s = 0; s < NS; ++s)
#pragma unroll
                for (int j = 0; j < 8; ++j) am[s / FPL] = fmaxf(am[s / FPL], fabsf(a[s / FPL][s % FPL][j]));
#pragma unroll
            for (int o = 1; o < TEAM; o <<= 1)
#pragma unroll
                for (int i = 0; i < RPT; ++i) am[i] = fmaxf(am[i], __shfl_xor_sync(0xFFFFFFFFu, am[i], o));
#pragma unroll
            for (int i = 0; i < RPT; ++i) {
                float sf;
                group_scale(p, ri[i].processed, am[i], sf, inv[i]);
                if (tl == i) my_sf = sf;
            }
        }
#pragma unroll
        for (int i = 0; i < RPT; ++i)
            if (r0 + i < p.n) store_lane(p, ri[i].processed, r0 + i, tc, tl, a[i], inv[i]);
        if (PACK_C) sf_word |= (__float_as_uint(my_sf) >> 23) << (8 * k);  // sf >= 0: its exponent byte
        if (QUANT && !PACK_C && tl < RPT && r0 + tl < p.n) store_group_scale(p, r0 + tl, tc, my_sf);
    }
    if (PACK_C && tl < RPT && r0 + tl < p.n) store_scale_word(p, r0 + tl, tc0, sf_word, nt > 1);
}

extern "C" __global__ void __launch_bounds__(256, TK_MINB) tk_swiglu_forward_and_per_token_cast(const Params p) {
    const u32 tl = threadIdx.x % TEAM, team = threadIdx.x / TEAM;
    const u64 tiles_c = p.h / TC;
    u32 cnt[3] = {0, 0, 0};
#if TK_TAIL
    // CTA b < nbig: run b (row tile b / runs_x, run b % runs_x); then single tiles: CTA
    // nbig + s takes tile s % CT of run nbig + s / CT. Fewer than 2^31 CTAs (a u32 grid x).
    const u32 runs_x = (u32)((tiles_c + TK_CT - 1) / TK_CT);  // runs per row tile
    const u32 nbig = (u32)p.nbig;
    const bool big = blockIdx.x < nbig;
    const u32 q = big ? blockIdx.x : nbig + (blockIdx.x - nbig) / TK_CT;  // run
    const u64 tc0 = (u64)(q % runs_x) * TK_CT + (big ? 0 : (blockIdx.x - nbig) % TK_CT);  // first tile
    if (tc0 >= tiles_c) return;  // a single tile past a partial run's end (the whole CTA)
    const u32 nt = !big ? 1 : PACK_C ? 4 : (u32)(tiles_c - tc0 < TK_CT ? tiles_c - tc0 : TK_CT);
    row_tile(p, q / runs_x, tc0, nt, tl, team, cnt);
#else
    const u64 tiles_r = (p.n + TR - 1) / TR;
    const u64 tc0 = (u64)blockIdx.x * TK_CT;                        // first column tile
    const u64 tc1 = tc0 + TK_CT < tiles_c ? tc0 + TK_CT : tiles_c;  // end of the run
    const u32 nt = PACK_C ? 4 : (u32)(tc1 - tc0);                   // tiles in the run (<= TK_CT)
    for (u32 tr = blockIdx.y; tr < tiles_r; tr += gridDim.y) row_tile(p, tr, tc0, nt, tl, team, cnt);
#endif
    flush_counts(p, cnt);
}

#else
// ---------------------------------------------------------------------------------------------
// Whole-row path (quantized, one scale per row): one CTA per row; thread t owns fragments
// f = i * THREADS + t (i < NF, f < H / 8), held in registers between the amax and the cast.
// ---------------------------------------------------------------------------------------------
#if !(TK_OUT >= 2)
#error "the whole-row path casts (TK_OUT 2 or 3)"
#endif
constexpr int NWARPS = TK_THREADS / 32;

extern "C" __global__ void __launch_bounds__(TK_THREADS) tk_swiglu_forward_and_per_token_cast(const Params p) {
    __shared__ float red[NWARPS];  // (warps,) partial amax
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const u64 frags = p.h / 8;
    u32 cnt[3] = {0, 0, 0};
    for (u64 r = blockIdx.x; r < p.n; r += gridDim.x) {
        const RowInfo ri = row_info(p, r);
        float a[TK_NF][8];      // (NF fragments, 8 columns) activations
        Words l[TK_NF], v[TK_NF];  // (NF fragments) raw gate and value
#pragma unroll
        for (int i = 0; i < TK_NF; ++i) {
            const u64 f = (u64)i * TK_THREADS + threadIdx.x;
            if (f < frags) load_pair(p, r, f * 8, l[i], v[i]);
        }
        const float w = row_weight(p, ri.slot);
        float am = 0.0f;
#pragma unroll
        for (int i = 0; i < TK_NF; ++i) {
            const u64 f = (u64)i * TK_THREADS + threadIdx.x;
            if (f >= frags) continue;
            activate<false>(p, ri.processed, w, l[i], v[i], a[i], cnt, true);
#pragma unroll
            for (int j = 0; j < 8; ++j) am = fmaxf(am, fabsf(a[i][j]));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xFFFFFFFFu, am, o));
        if (lane == 0) red[warp] = am;
        __syncthreads();
        am = 0.0f;
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) am = fmaxf(am, red[w]);
        __syncthreads();  // red is reused by the next row
        float sf, inv;
        group_scale(p, ri.processed, am, sf, inv);
        if (threadIdx.x == 0) store_group_scale(p, r, 0, sf);
#pragma unroll
        for (int i = 0; i < TK_NF; ++i) {
            const u64 f = (u64)i * TK_THREADS + threadIdx.x;
            if (f < frags) store_out(p, ri.processed, r, f * 8, a[i], inv);
        }
    }
    flush_counts(p, cnt);
}
#endif
