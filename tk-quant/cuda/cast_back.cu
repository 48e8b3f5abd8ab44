// Cast back (spec/quant.md §2.2, §3.8, §3.9): out[r, c] = convert(fl(dec(x[r, c]) * S[r/BM, c/BK]))
// for e4m3, packed e2m1 or packed E5M6 data, convert = identity (fp32) or round-to-nearest-even
// (bf16).
//
// Compile-time constants (defines):
//   TK_IN        2 e4m3, 3 packed e2m1, 4 packed E5M6
//   TK_IN_SF     0 fp32 scales with any strides, 1 packed UE8M0 int32
//   TK_BM, TK_BK the scale block (any sizes >= 1)
//   TK_OUT       0 fp32, 1 bf16
//   TK_VECIO     1: vector accesses (aligned rows); 0: element accesses
//   TK_SF_VEC    1: TK_BK == 1 with fp32 scales of unit column stride and 16-byte aligned scale
//                rows: the scales of a store are read as float4 (0 otherwise)
//   TK_J         fragments each lane loads per task, all issued before the first store
// e4m3 fragments are one store wide (TK_E4M3_VEC of quant_io.cuh: 4 values for fp32 output, 8
// for bf16), e2m1 and E5M6 fragments 8 values (4 or 12 bytes).
//
// Work split: a warp task is SEG = TK_J * 32 * VEC consecutive columns of one row (the last one
// of a row masked, K % 64 == 0 or, E5M6, K % 8 == 0, so a fragment or store never straddles
// the row end); warps loop over the M * ceil(K / SEG) tasks, consecutive warps on consecutive
// tasks. Lane l loads fragment j (VEC values, >= 4 bytes) at column 32 * VEC * j + VEC * l of
// the task, and every store instruction of the warp writes 32 * 16 = 512 contiguous bytes
// (full sectors): for fp32 output of e2m1 / E5M6 (8-value fragments, 4-value stores) the
// fragments are exchanged by warp shuffles (store h of fragment j in lane l takes the half
// l % 2 of lane 16 h + l / 2's fragment).
#if TK_IN == 2
#define TK_E4M3_VEC (TK_OUT == 0 ? 4 : 8)
#endif
#include "tk/quant_io.cuh"
#include "tk/quant_scale.cuh"

#if TK_IN < 2
#error "cast back reads quantized data (TK_IN 2, 3 or 4)"
#endif

// Kernel arguments (mirrored by `CastBackArgs` in src/cast_back.rs).
struct Params {
    u64 x;               // (M, K) e4m3, (M, K/2) e2m1 or (M, 3K/2) E5M6, row stride ldx (storage elements)
    u64 ldx;
    u64 x_sf;            // scales: fp32 or packed int32
    u64 xsf_s0, xsf_s1;  // their element strides
    u64 out;             // (M, K) fp32 / bf16, contiguous
    u64 m, k;
};

constexpr int OUT_VEC = TK_OUT == 0 ? 4 : 8;  // values per 16-byte store
constexpr int PAIR = VEC / OUT_VEC;           // stores per fragment
constexpr int STEP = 32 * VEC;                // columns of one warp-wide fragment load
constexpr int SEG = TK_J * STEP;              // columns per warp task
constexpr int WARPS = 8;                      // warps per CTA (256 threads)
constexpr int SCALES_PER_STORE = TK_BK % OUT_VEC == 0 ? 1 : OUT_VEC;
constexpr bool TASK_SCALE = TK_BK % SEG == 0;  // one scale block holds a whole task
static_assert(PAIR == 1 || (PAIR == 2 && TK_IN != 2), "e4m3 fragments are one store wide");
static_assert(!TK_SF_VEC || (TK_IN_SF == 0 && TK_BK == 1), "vector scale loads need fp32 scales and TK_BK == 1");

// Packed UE8M0 scales with one scale per store whose groups of a task span whole int32 words
// (SEG a multiple of 4 * BK: npc=128 tasks of 512 or 1024 columns, 1 or 2 words) are read as
// those NW words, once per task and warp-uniform, and each store cuts its exponent byte out of
// them (a shift and a mask), instead of one byte load per store with its own 64-bit address
// arithmetic (SASS sm_90a, e4m3 -> fp32 npc=128: 4 LDG.U8 per task and lane, ~12 address
// instructions each). Words wholly past the
// last scale column (a task running over the row end) are not read. H200: the byte loads were
// 0.8 % slower on average over per_token_cast_back (up to 2 %).
constexpr int NW = SEG / (4 * TK_BK) > 0 ? SEG / (4 * TK_BK) : 1;  // int32 scale words per task
constexpr bool TASK_WORDS = TK_IN_SF == 1 && SCALES_PER_STORE == 1 && !TASK_SCALE && SEG % (4 * TK_BK) == 0 && NW <= 4;

// The scales of the OUT_VEC values of row r from column c (c % OUT_VEC == 0): one when a
// scale block holds the whole store, else one per value.
struct StoreScales {
    float s[SCALES_PER_STORE];
};

__device__ __forceinline__ StoreScales load_scales(const Params& p, u64 r, u64 c) {
    StoreScales sc;
    const void* sf = reinterpret_cast<const void*>(p.x_sf);
    if constexpr (SCALES_PER_STORE == 1) {
        sc.s[0] = in_scale(sf, p.xsf_s0, p.xsf_s1, r / TK_BM, c / TK_BK);
    } else {
#if TK_SF_VEC
        // (OUT_VEC,) fp32 scales of columns c.., unit stride, 16-byte aligned (checked by the host)
        const float4* src = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(sf) + (r / TK_BM) * p.xsf_s0 + c);
#pragma unroll
        for (int i = 0; i < OUT_VEC / 4; ++i) {
            const float4 t = __ldg(src + i);
            sc.s[4 * i] = t.x; sc.s[4 * i + 1] = t.y; sc.s[4 * i + 2] = t.z; sc.s[4 * i + 3] = t.w;
        }
#else
#pragma unroll
        for (int q = 0; q < OUT_VEC; ++q) sc.s[q] = in_scale(sf, p.xsf_s0, p.xsf_s1, r / TK_BM, (c + q) / TK_BK);
#endif
    }
    return sc;
}

// The fragment of lane `src` of the warp (all 32 lanes call it together).
__device__ __forceinline__ Raw shfl_raw(const Raw& a, int src) {
    Raw b;
#pragma unroll
    for (int i = 0; i < RAW_WORDS; ++i) b.w[i] = __shfl_sync(0xFFFFFFFFu, a.w[i], src);
    return b;
}

// The fragment's values VEC/2.. moved to the front (e2m1: 16 bits of one word; E5M6: the
// 96-bit big-endian word stream shifted left by 48 bits).
__device__ __forceinline__ Raw second_half(const Raw& a) {
    Raw b;
#if TK_IN == 3
    b.w[0] = a.w[0] >> 16;
#elif TK_IN == 4
    b.w[0] = (a.w[1] << 16) | (a.w[2] >> 16);
    b.w[1] = a.w[2] << 16;
    b.w[2] = 0;
#else
    b = a;
#endif
    return b;
}

// With one scale s per store and |s| < 4 (casts of data with block maxima below 24, or up to 12
// with power-of-two scales; NaN fails the test), the e2m1 values are multiplied by s * 2^126
// straight from e2m1_value_m126: one FMUL per value instead of two (H200: e2m1 -> bf16 50.8 ->
// 39.2 us). Other scales (large, infinite, NaN) take the two exact multiplies. bf16 output
// tests each store's scale. fp32 output only with TASK_WORDS, where the test is made once per
// task on its scale words (every UE8M0 byte <= 128, i.e. |s| < 4; warp-uniform): a per-store
// test and branch (3 instructions) per 4-value fp32 store would eat the 4 saved FMULs; per task
// it leaves ~42 -> ~37 issued per store (SASS sm_90a, e2m1 -> fp32 npc=128). bf16 output keeps
// its per-store test: with the task test ptxas recomputed the word check at every store (7
// instructions instead of 2). H200: within 0.5 % of the per-store form (e2m1 -> fp32 npc=128
// 70.6 us, 86 % of the copy ceiling).
constexpr bool FUSED_TASK = TK_IN == 3 && TK_OUT == 0 && TASK_WORDS;
constexpr bool E2M1_FUSED = TK_IN == 3 && SCALES_PER_STORE == 1 && (TK_OUT == 1 || FUSED_TASK);

// Value q (< OUT_VEC) of the fragment src, decoded to fp32 (exact). e2m1: tkq::e2m1_value
// (subnormal placement + one exact FMUL: ~5 instructions per value instead of decode_elem's
// ~10 with its compares and selects; bit-identical).
__device__ __forceinline__ float decode_value(const Raw& src, int q) {
#if TK_IN == 3
    return tkq::e2m1_value(src.w[0], q);
#else
    return decode_elem(src, q);
#endif
}

// Writes the OUT_VEC values v of row r from column c of the contiguous (M, K) output.
__device__ __forceinline__ void store_out(const Params& p, u64 r, u64 c, const float (&v)[OUT_VEC]) {
#if !TK_VECIO
    for (int q = 0; q < OUT_VEC; ++q) {
#if TK_OUT == 0
        reinterpret_cast<float*>(p.out)[r * p.k + c + q] = v[q];  // (M, K) fp32
#else
        reinterpret_cast<__nv_bfloat16*>(p.out)[r * p.k + c + q] = __float2bfloat16_rn(v[q]);  // (M, K) bf16
#endif
    }
#elif TK_OUT == 0
    // __stwb keeps the 16-byte store whole (a plain float4 assignment was split into 4 STG.E)
    __stwb(reinterpret_cast<float4*>(reinterpret_cast<float*>(p.out) + r * p.k + c), make_float4(v[0], v[1], v[2], v[3]));  // (4,) fp32
#else
    u32 w[OUT_VEC / 2];  // (OUT_VEC/2,) bf16 pairs, even column in the low half
#pragma unroll
    for (int j = 0; j < OUT_VEC / 2; ++j) {
        const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
        w[j] = *reinterpret_cast<const u32*>(&b);
    }
    __stwb(reinterpret_cast<uint4*>(reinterpret_cast<u16*>(p.out) + r * p.k + c), make_uint4(w[0], w[1], w[2], w[3]));  // (8,) bf16
#endif
}

extern "C" __global__ void __launch_bounds__(256) tk_cast_back(const Params p) {
    const int lane = threadIdx.x % 32;
    const u64 segs = (p.k + SEG - 1) / SEG, tasks = p.m * segs;
    const void* x = reinterpret_cast<const void*>(p.x);
    for (u64 t = (u64)blockIdx.x * WARPS + threadIdx.x / 32; t < tasks; t += (u64)gridDim.x * WARPS) {
        const u64 r = t / segs, c_task = (t - r * segs) * SEG;  // warp-uniform row and first column
        Raw raw[TK_J];                                           // (TK_J, VEC) elements of row r
        StoreScales sc[TASK_SCALE || TASK_WORDS ? 1 : TK_J][TASK_SCALE || TASK_WORDS ? 1 : PAIR];  // the scales of each store
        if constexpr (TASK_SCALE) sc[0][0] = load_scales(p, r, c_task);
        u32 sw[NW];  // (NW,) TASK_WORDS: packed UE8M0 words of scale columns c_task / BK .. (4 per word)
        if constexpr (TASK_WORDS) {
            const u64 w0 = c_task / TK_BK / 4;  // first word (c_task / BK is a multiple of 4)
#pragma unroll
            for (int i = 0; i < NW; ++i)
                sw[i] = 4 * (w0 + i) * TK_BK < p.k ? __ldg(reinterpret_cast<const u32*>(p.x_sf) + (r / TK_BM) * p.xsf_s0 + (w0 + i) * p.xsf_s1) : 0u;
        }
        bool fused_task = false;  // FUSED_TASK: every scale of the task has |s| < 4 (UE8M0 byte <= 128)
        if constexpr (FUSED_TASK) {
            u32 big = 0;  // bit 7 of a byte: that byte is > 0x80 (bit 7 set and low bits nonzero)
#pragma unroll
            for (int i = 0; i < NW; ++i) big |= sw[i] & ((sw[i] & 0x7F7F7F7Fu) + 0x7F7F7F7Fu) & 0x80808080u;
            fused_task = big == 0;
        }
#pragma unroll
        for (int j = 0; j < TK_J; ++j) {
            const u64 c = c_task + j * STEP + lane * VEC;
            if (c < p.k) {
                raw[j] = load_frag(x, p.ldx, p.k, r, c);
            } else {
#pragma unroll
                for (int i = 0; i < RAW_WORDS; ++i) raw[j].w[i] = 0;
            }
#pragma unroll
            for (int h = 0; h < (TASK_SCALE || TASK_WORDS ? 0 : PAIR); ++h) {
                const u64 cs = c_task + j * STEP + h * 32 * OUT_VEC + lane * OUT_VEC;
                if (cs < p.k) sc[j][h] = load_scales(p, r, cs);
            }
        }
#pragma unroll
        for (int j = 0; j < TK_J; ++j) {
#pragma unroll
            for (int h = 0; h < PAIR; ++h) {
                Raw src = raw[j];
                if constexpr (PAIR == 2) {
                    src = shfl_raw(raw[j], 16 * h + lane / 2);
                    if (lane % 2) src = second_half(src);
                }
                const u64 cs = c_task + j * STEP + h * 32 * OUT_VEC + lane * OUT_VEC;
                if (cs >= p.k) continue;
                StoreScales s = sc[TASK_SCALE || TASK_WORDS ? 0 : j][TASK_SCALE || TASK_WORDS ? 0 : h];
                if constexpr (TASK_WORDS) {
                    const u32 g = (u32)(j * STEP + h * 32 * OUT_VEC + lane * OUT_VEC) / TK_BK;  // scale column - c_task / BK
                    u32 w = sw[0];
#pragma unroll
                    for (int i = 1; i < NW; ++i)
                        if (g / 4 == (u32)i) w = sw[i];
                    s.s[0] = __uint_as_float(((w >> (8 * (g % 4))) & 0xFFu) << 23);  // in_scale's UE8M0 decode
                }
                float v[OUT_VEC];  // (OUT_VEC,) dequantized values of row r from column cs
                if (E2M1_FUSED && (FUSED_TASK ? fused_task : fabsf(s.s[0]) < 4.0f)) {
                    // s * 2^126 is exact and finite, so the one rounding of
                    // (value * 2^-126) * (s * 2^126) is that of value * s.
                    const float s126 = __fmul_rn(s.s[0], 0x1p126f);
#pragma unroll
                    for (int q = 0; q < OUT_VEC; ++q) v[q] = __fmul_rn(tkq::e2m1_value_m126(src.w[0], q), s126);
                    store_out(p, r, cs, v);
                    continue;
                }
#if TK_IN == 2
                // e4m3: two codes per conversion (tkq::e4m3x2_value; H200: within 0.5 % of the
                // one-code form, both ways).
#pragma unroll
                for (int q = 0; q < OUT_VEC; q += 2) {
                    const float2 f = tkq::e4m3x2_value(src.w[q / 4], q % 4);  // (2,) decoded values q, q + 1
                    v[q] = __fmul_rn(f.x, s.s[SCALES_PER_STORE == 1 ? 0 : q]);
                    v[q + 1] = __fmul_rn(f.y, s.s[SCALES_PER_STORE == 1 ? 0 : q + 1]);
                }
#else
#pragma unroll
                for (int q = 0; q < OUT_VEC; ++q) v[q] = __fmul_rn(decode_value(src, q), s.s[SCALES_PER_STORE == 1 ? 0 : q]);
#endif
                store_out(p, r, cs, v);
            }
        }
    }
}
