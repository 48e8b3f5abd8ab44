// Block-scaled cast to FP8 e4m3 / FP4 e2m1 (spec/quant.md §2.1; the per-token §3.1, per-block
// §3.3 and per-channel §3.5 casts are this kernel with a particular scale block (BM, BK)).
//
//   v   = fp32(x[r, c])                      plain input, or
//   v   = fl(dec(x[r, c]) * s_in[r/IH, c/IW])  quantized input
//   amax = max |v| over the block (NaN ignored: fmaxf), (sf, inv) per §1.4
//   out = enc(fl(v * inv)), sf stored in layout A / B / C with zero padding
//
// Compile-time constants (defines):
//   TK_IN        0 fp32, 1 bf16 (plain); 2 e4m3, 3 packed e2m1 (quantized, with input scales)
//   TK_IN_SF     (quantized input) 0 fp32 scales with any strides, 1 packed UE8M0 int32
//   TK_IH, TK_IW (quantized input) the input scale block
//   TK_BM, TK_BK the output scale block. Tiled path: BM = 1 or 8 * rows-per-thread (<= 128),
//                BK = 1 or VEC * 2^j <= 32 * VEC. TK_BK = 0: one scale per row (whole-row path).
//   TK_FMT       0 e4m3 (Q = 448), 1 e2m1 (Q = 6), 2 packed E5M6 (Q = 65024; whole-row path only)
//   TK_SF_OUT    0 layout A (row-major fp32), 1 layout B (column-major fp32, rows padded to 4),
//                2 layout C (packed UE8M0, column-major)
//   TK_ROUND     1: power-of-two scales
//   TK_MODE      0 data + scales, 1 scales only, 2 data from precomputed fp32 layout-A scales
//   TK_VECIO     1: vector accesses (aligned rows, K % VEC == 0); 0: element accesses
//   TK_THREADS, TK_NF  (whole-row path) threads per CTA and fragments per thread
//   TK_LX, TK_FK, TK_MINB, TK_WB  (tiled path) lanes along K, fragments per lane along K,
//                minimum resident CTAs per SM, n > 0: warp blocks (BM > 1; each warp holds n
//                whole blocks side by side along K)
#include "tk/quant_io.cuh"
#include "tk/quant_scale.cuh"

// Kernel arguments (one struct, passed by value; mirrored by `CastArgs` in src/cast.rs).
struct Params {
    u64 x;             // input: (M, K) fp32/bf16/e4m3 or (M, K/2) e2m1 bytes, row stride ldx
    u64 ldx;           // row stride of x in storage elements
    u64 x_sf;          // input scales (quantized input): fp32 or packed int32
    u64 xsf_s0, xsf_s1;  // their element strides
    u64 out;           // (M, K) e4m3 or (M, K/2) e2m1, contiguous
    u64 sf;            // output scales (full allocation), or precomputed fp32 scales (mode 2)
    u64 sf_ld;         // row stride of the precomputed scales
    u64 m, k;          // logical shape
    u64 nbm, nbk;      // scale grid
    u64 rows_aligned;  // align(nbm, 4): padded rows of layouts B and C
};

// TK_IDX32 (set by the host when M, K, the row stride and the scale grid are all below 2^31
// and it measured faster: quantized input and tiled e2m1 outputs, see CastKernel::with_idx32):
// rows, columns, tile indices and their sums and compares are 32-bit (ix), read from Params
// through PM, PK, ... Address products are still formed in 64 bits ((u64) casts, or a u64
// operand: one IMAD.WIDE.U32 each). The u64 version spends 2 instructions (IADD3 + IADD3.X,
// ISETP + ISETP.EX, SHF.U64 pairs) on most index operations: 127 of the 1184 SASS instructions
// of per-token bf16 -> e2m1 npc=128 were high halves, and the ncu profile of that kernel has
// the ALU pipe (which runs them) at 80 %.
#if defined(TK_IDX32) && TK_IDX32
using ix = u32;
#else
using ix = u64;
#endif
#define PM ((ix)p.m)
#define PK ((ix)p.k)
#define PLDX ((ix)p.ldx)
#define PNBM ((ix)p.nbm)
#define PNBK ((ix)p.nbk)
#define PRA ((ix)p.rows_aligned)

#if TK_FMT == 0
#define TK_Q 448.0f
#define TK_EPS __uint_as_float(0x38D1B717u)  // 1e-4
#elif TK_FMT == 2
#define TK_Q 65024.0f
#define TK_EPS __uint_as_float(0x38D1B717u)  // 1e-4
#else
#define TK_Q 6.0f
#define TK_EPS __uint_as_float(0x01C00000u)  // 6 * 2^-126
#endif

#if TK_IN == 1
using tkq::bf16x2_max;  // lane-wise max of two bf16 pairs (a NaN lane gives the other lane)
#endif

// The fragment's values v (VEC,) of row r at columns c0..: plain fp32(x), or fl(dec * s_in).
// Columns >= K give 0.
__device__ __forceinline__ void values(const Params& p, const Raw& raw, ix r, ix c0, float (&v)[VEC]) {
#if TK_IN == 2
    // e4m3: two codes per conversion (tkq::e4m3x2_value).
#pragma unroll
    for (int j = 0; j < VEC; j += 2) {
        const float2 f = tkq::e4m3x2_value(raw.w[j / 4], j % 4);  // (2,) values j, j + 1
        v[j] = f.x;
        v[j + 1] = f.y;
    }
#elif TK_IN == 3
    // e2m1: tkq::e2m1_value (subnormal placement + one exact FMUL, ~5 instructions per code
    // instead of decode_elem's ~10 compares, selects and shifts; bit-identical).
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = tkq::e2m1_value(raw.w[0], j);
#else
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = decode_elem(raw, j);
#endif
#if TK_IN >= 2
    if constexpr (TK_IW % VEC == 0) {
        const float s = in_scale(reinterpret_cast<const void*>(p.x_sf), p.xsf_s0, p.xsf_s1, r / TK_IH, c0 / TK_IW);
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[j] = __fmul_rn(v[j], s);
    } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j)
            if (c0 + j < PK) v[j] = __fmul_rn(v[j], in_scale(reinterpret_cast<const void*>(p.x_sf), p.xsf_s0, p.xsf_s1, r / TK_IH, (c0 + j) / TK_IW));
    }
#endif
}

// max(0, |v_j|) over the fragment's values (NaN ignored), exactly as fmaxf over values() gives.
// bf16: |x| of a pair by clearing both sign bits, then max.bf16x2 (which, like fmaxf, returns
// the other operand when one is NaN) over the 4 words and fmaxf of the two halves: 9
// instructions per 8 values instead of 16 (decode + fmaxf each).
__device__ __forceinline__ float frag_amax(const Params& p, const Raw& raw, ix r, ix c0) {
#if TK_IN == 1
    (void)p; (void)r; (void)c0;
    u32 m = tkq::bf16x2_abs(raw.w[0]);  // (2,) bf16 |x| (a NaN lane stays NaN: ignored by the max)
#pragma unroll
    for (int w = 1; w < RAW_WORDS; ++w) m = bf16x2_max(m, tkq::bf16x2_abs(raw.w[w]));
    return fmaxf(fmaxf(0.0f, __uint_as_float(m << 16)), __uint_as_float(m & 0xFFFF0000u));
#else
    float v[VEC];  // (VEC,) values
    values(p, raw, r, c0, v);
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < VEC; ++j) a = fmaxf(a, fabsf(v[j]));
    return a;
#endif
}

// (sf, inv) from amax, exactly tk_core::convert::compute_scale_with_eps (§1.4). Power-of-two
// scales come from the exponent bits (tkq::scale_pair_pow2) instead of an IEEE division per
// block, except for per-channel blocks (TK_BK 1), where the H200 measured the division-free
// form 7 % slower (8064x7168 bf16 -> e4m3 npt=128 round: 50.0-50.5 us against 46.7-46.9;
// per-token bf16 -> e4m3 npc=128 49.3-49.7 against 50.3-50.6, E5M6 bf16 1.5 % faster).
__device__ __forceinline__ void compute_scale(float amax, float& sf, float& inv) {
#if TK_ROUND && TK_BK != 1
    tkq::scale_pair_pow2(amax, TK_EPS, TK_Q, sf, inv);
#else
    tkq::scale_pair<TK_ROUND != 0>(amax, TK_EPS, TK_Q, sf, inv);
#endif
}

#if TK_MODE != 2
// Stores S[mb, kb] (mb < nbm, kb < nbk) in the output layout with its padding (tkq::store_scale).
__device__ __forceinline__ void store_sf(const Params& p, ix mb, ix kb, float sf) {
    tkq::store_scale<TK_SF_OUT>(p.sf, PNBM, PNBK, PRA, mb, kb, sf);
}
#endif

#if TK_MODE != 1
#if TK_FMT == 2
// E5M6 ("enc12", spec/quant.md 1.3) of the 8 values v * inv: round-toward-zero binary16, then
// the 17-low-bit adjustment; packed into three little-endian words (c0 most significant).
__device__ __forceinline__ void e5m6_words(const float (&v)[VEC], const float (&inv)[VEC], u32* w) {  // w: (3,) words
    u32 c[8];  // (8,) 12-bit codes
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        const float x0 = __fmul_rn(v[j], inv[j]), x1 = __fmul_rn(v[j + 1], inv[j + 1]);
        u32 h;  // (2,) binary16 RZ(x0) low, RZ(x1) high: __float2half_rz of each, one conversion
        asm("cvt.rz.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(x1), "f"(x0));
        u32 t0 = (h & 0xFFFFu) >> 4, t1 = h >> 20;
        if ((t0 & 1) + (__float_as_uint(x0) & 0x1FFFFu) > 0x10000u) ++t0;
        if ((t1 & 1) + (__float_as_uint(x1) & 0x1FFFFu) > 0x10000u) ++t1;
        c[j] = t0 & 0xFFF;
        c[j + 1] = t1 & 0xFFF;
    }
    w[0] = c[0] << 20 | c[1] << 8 | c[2] >> 4;
    w[1] = (c[2] & 0xF) << 28 | c[3] << 16 | c[4] << 4 | c[5] >> 8;
    w[2] = (c[5] & 0xFF) << 24 | c[6] << 12 | c[7];
}
#endif

// Bytes of one output row: K e4m3 codes, K/2 bytes of e2m1 pairs, or 3K/2 bytes of E5M6.
__device__ __forceinline__ u64 out_row_bytes(const Params& p) {
#if TK_FMT == 0
    return (u64)PK;
#elif TK_FMT == 2
    return p.k / 2 * 3;
#else
    return (u64)(PK / 2);
#endif
}

// The byte offset in the output of row r from column c0 (a fragment's first column). The stores
// add it to p.out themselves, so that the compiler sees global addresses (STG, not generic ST).
__device__ __forceinline__ u64 out_at(const Params& p, ix r, ix c0) {
#if TK_FMT == 0
    return (u64)r * PK + c0;
#elif TK_FMT == 2
    return (u64)r * (p.k / 2 * 3) + (u64)c0 / 2 * 3;
#else
    return (u64)r * (PK / 2) + c0 / 2;
#endif
}

#if TK_FMT == 1
// Stores q, the VEC/2 bytes of packed e2m1 pairs of the fragment at columns c0.. of a row, at
// byte offset out (out_at; even column in the low nibble; columns < K only).
__device__ __forceinline__ void store_e2m1(const Params& p, u64 out, ix c0, u32 q) {
    u8* dst = reinterpret_cast<u8*>(p.out) + out;  // (VEC/2,) bytes of the row
#if TK_VECIO
    if constexpr (VEC == 8)
        *reinterpret_cast<u32*>(dst) = q;
    else
        *reinterpret_cast<u16*>(dst) = (u16)q;
#else
#pragma unroll
    for (int j = 0; j < VEC / 2; ++j)
        if (c0 + 2 * j < PK) dst[j] = (u8)(q >> (8 * j));
#endif
}
#endif

// Quantizes v * inv[j] and stores the fragment at columns c0.. of a row at byte offset out
// (out_at; columns < K only).
__device__ __forceinline__ void store_frag(const Params& p, u64 out, ix c0, const float (&v)[VEC], const float (&inv)[VEC]) {
#if TK_FMT == 0
    u32 q[VEC / 4];  // (VEC/4,) words of 4 e4m3 codes, little-endian
#pragma unroll
    for (int j = 0; j < VEC / 4; ++j)
        q[j] = tkq::e4m3_code2(__fmul_rn(v[4 * j], inv[4 * j]), __fmul_rn(v[4 * j + 1], inv[4 * j + 1])) |
               tkq::e4m3_code2(__fmul_rn(v[4 * j + 2], inv[4 * j + 2]), __fmul_rn(v[4 * j + 3], inv[4 * j + 3])) << 16;
    u8* dst = reinterpret_cast<u8*>(p.out) + out;  // (VEC,) bytes of the row
#if TK_VECIO
    if constexpr (VEC == 8)
        *reinterpret_cast<uint2*>(dst) = make_uint2(q[0], q[VEC / 8]);
    else
        *reinterpret_cast<u32*>(dst) = q[0];
#else
#pragma unroll
    for (int j = 0; j < VEC; ++j)
        if (c0 + j < PK) dst[j] = (u8)(q[j / 4] >> (8 * (j % 4)));
#endif
#elif TK_FMT == 2
    u32 w[3];  // (3,) packed words of 8 E5M6 codes
    e5m6_words(v, inv, w);
    u8* dst = reinterpret_cast<u8*>(p.out) + out;  // (12,) bytes of the row
#if TK_VECIO
    u32* d = reinterpret_cast<u32*>(dst);
    d[0] = w[0]; d[1] = w[1]; d[2] = w[2];
#else
#pragma unroll
    for (int b = 0; b < 12; ++b) dst[b] = (u8)(w[b / 4] >> (8 * (b % 4)));
#endif
#else
    float y[VEC];  // (VEC,) values to encode
#pragma unroll
    for (int j = 0; j < VEC; ++j) y[j] = __fmul_rn(v[j], inv[j]);
    store_e2m1(p, out, c0, tkq::e2m1_pack(y));
#endif
}

// bf16 -> e2m1 casts with power-of-two scales encode on packed bf16 pairs
// (tkq::e2m1_pack_bf16_pow2_abs, ~6 instead of ~13 instructions per value with the decode and
// the fp32 product), bit-identical to store_frag. Fragments whose inverse scales exceed 2^120
// (blocks with amax below ~6 * 2^-120, or an infinite amax) take store_frag: then a subnormal
// bf16 input could be significant after the product, and the encoder must not depend on
// whether the bf16 multiply flushes subnormal inputs.
#define E2M1_PACKED (TK_IN == 1 && TK_FMT == 1 && TK_ROUND && TK_MODE == 0)

// The encoder assumes |x * inv| <= 6 for every non-NaN x (it drops the clamp of |y| to 6; see
// tkq::e2m1_pack_bf16_pow2_abs). That holds wherever it runs here: the inverse is the block's own
// power of two 2^-e with 2^e >= fl(c / 6) >= amax / 6 (c = max(amax, eps) a bf16 magnitude or
// eps, so fl(c / 6) never rounds down onto a power of two: bf16 has no significand in
// (1.5, 1.5 (1 + 2^-22))), checked on the CPU for every bf16 amax (src/cast.rs tests).

// Casts the fragment raw of row r at columns c0.. with the inverse scales iv[j] and stores it at
// byte offset out (out_at(p, r, c0); columns < K only): store_frag of values(raw).
__device__ __forceinline__ void cast_frag(const Params& p, const Raw& raw, ix r, ix c0, const float (&iv)[VEC], u64 out) {
#if E2M1_PACKED
    u32 inv2[VEC / 2];  // (VEC/2,) bf16 pairs of inverse scales (exact: powers of two)
    bool pow2_small = true;
#pragma unroll
    for (int j = 0; j < VEC / 2; ++j) {
        inv2[j] = __byte_perm(__float_as_uint(iv[2 * j]), __float_as_uint(iv[2 * j + 1]), 0x7632);
        pow2_small &= __float_as_uint(iv[2 * j]) <= 0x7B800000u && __float_as_uint(iv[2 * j + 1]) <= 0x7B800000u;  // (0, 2^120]
    }
    if (pow2_small) {
        store_e2m1(p, out, c0, tkq::e2m1_pack_bf16_pow2_abs(raw.w, inv2));
        return;
    }
#endif
    float v[VEC];  // (VEC,) values
    values(p, raw, r, c0, v);
    store_frag(p, out, c0, v, iv);
}
#endif

#if TK_BK > 0
// ---------------------------------------------------------------------------------------------
// Tiled path. CTA: 8 warps; a warp is LY = 32/LX row groups x LX lanes along K. Lane
// (ly, lx) of warp w owns the FK adjacent fragments of rows tile_m*TM + (w*LY + ly)*RPT + i
// (i < RPT) at columns tile_k*TKC + lx*FK*VEC .. (+FK*VEC). BM == 1: each row is its own block
// row; BM > 1: the tile's rows are one block row (TM == BM). A column block is LK =
// BK/(FK*VEC) adjacent lanes (BK >= FK*VEC) or a single column (BK == 1). FK = 2 (per-token
// casts of plain input) halves the per-row work per value (block max shuffles, scale, scale
// store) at the same registers (half the rows per thread).
// TK_WB (warp blocks) places the 8 warps side by side along K instead (see WB below): a lane
// (ly, lx) of warp w owns rows tile_m*TM + ly*RPT + i at columns tile_k*TKC + (w*LX + lx)*VEC.
// ---------------------------------------------------------------------------------------------
#ifndef TK_LX
#error "TK_LX (lanes along K) must be defined for the tiled path"
#endif
#if TK_FMT == 2
#error "E5M6 casts take the whole-row path"
#endif
constexpr int WARPS = 8;
constexpr int LX = TK_LX, LY = 32 / TK_LX;                 // warp shape (lanes along K, M)
#ifndef TK_WB
#error "TK_WB (warp blocks) must be defined for the tiled path"
#endif
// TK_WB (warp blocks; the host sets it for per-block e2m1 casts whose blocks fit a warp): a warp
// holds TK_WB whole (BM, BK) blocks side by side, LX = TK_WB * BK/VEC lanes along K (LK = BK/VEC
// lanes per block) times LY row groups of RPT = BM/LY rows, and the CTA's 8 warps sit side by
// side along K (a tile is BM rows x 8 TK_WB blocks). The block maximum is then a shuffle
// butterfly inside the warp (the LK lanes of the block, then the LY row groups) and every lane
// computes the scale itself: no shared memory, no barrier, no serial one-thread-per-block-column
// step (TK_WB 0: the warps stack along M and meet in `red` behind two __syncthreads, while all 8
// warps wait for the 8..16 threads that compute the scales). TK_WB 2 (bf16 32x32; host
// CastKernel::with_warp_blocks): a warp's store of a row is 8 lanes x 4 bytes = one whole 32-byte
// sector (TK_WB 1: 16 bytes, half a sector, whose other half came from the next warp: ncu counted
// 2 L2 store sectors per output sector, 83 % L2 throughput at 60 % DRAM) and a row's load 128
// contiguous bytes, with 8 rows (32 raw words) per thread instead of 4: twice the bytes in flight.
constexpr bool WB = TK_WB != 0;
constexpr int WM = WB ? 1 : WARPS;                         // warps along M
constexpr int WK = WB ? WARPS : 1;                         // warps along K
#ifndef TK_FK
#error "TK_FK (adjacent fragments per thread along K) must be defined for the tiled path"
#endif
constexpr int FK = TK_FK;                                        // fragments per thread along K
constexpr int RPT = TK_BM == 1 ? 4 / FK : TK_BM / (WM * LY);    // rows per thread
constexpr int TM = WM * LY * RPT;                                // rows per tile
constexpr int TKC = WK * LX * VEC * FK;                          // columns per tile
constexpr int NR = TK_BM == 1 ? RPT : 1;                         // block rows per thread
constexpr int NB = TK_BK == 1 ? VEC : 1;                         // block columns per thread
constexpr int LK = TK_BK == 1 ? 1 : TK_BK / (VEC * FK);          // lanes per block column
static_assert(FK == 1 || (FK == 2 && TK_BM == 1 && TK_MODE != 2 && TK_IN < 2), "FK = 2: per-token casts of plain input");
static_assert(RPT >= 1 && (TK_BM == 1 || TK_BM == TM), "BM must be 1 or a multiple of 8 * LY");
static_assert(!WB || (TK_BM > 1 && TK_WB * TK_BK == LX * VEC && FK == 1), "warp blocks: a warp's LX lanes span TK_WB block columns");
static_assert(LX * NB <= WARPS * 32, "one thread per block column of a tile");
static_assert(TK_BK == 1 || (TK_BK % (VEC * FK) == 0 && TKC % TK_BK == 0), "BK must be 1 or FK * VEC * 2^j <= TKC");

#ifndef TK_MINB
#error "TK_MINB (minimum resident CTAs per SM, for the register budget) must be defined"
#endif

// Per-token scales in layout C go out as whole int32 words, or halves of them, when a tile row
// spans SF_G = 4 (or 2) or more blocks (it then starts at a multiple of SF_G blocks: each group of
// SF_G bytes of layout C lies in one warp). store_sf's byte path costs the warp ~35 issued
// instructions per row (64-bit address math, the padding checks; divergent: 32 / LK lanes store)
// and one byte store per block; here one or two shuffles gather the SF_G exponent bytes and one
// lane in SF_G * LK stores them (H200: faster than the byte path).
constexpr int SF_G = TKC / TK_BK >= 4 ? 4 : TKC / TK_BK;  // blocks per scale store
constexpr bool SF_WORDS = TK_BM == 1 && TK_SF_OUT == 2 && TK_MODE != 2 && TK_BK > 1 && SF_G >= 2;

// Per-token tiles of bf16 input reduce the group maxima of two rows at once (H200: 0.7 % faster
// on average over the per-token casts, up to 6 %, than a shuffle chain per row). A bf16 |x| maximum is itself a bf16, so rows i and i + 1
// travel as one packed pair through the LK-lane butterfly: one SHFL and one max.bf16x2 per level
// for two rows instead of a SHFL and an FMNMX per row (npc=128, FK 1: 4 levels, 8 SHFL + 8 FMNMX
// fewer per 4 rows), and the two rows' lane maxima are folded by 2 PRMT + 1 max.bf16x2 instead
// of 2 x (2 unpacks + 2 FMNMX). max.bf16x2 ignores NaN like fmaxf; a group of NaN only gives NaN
// instead of 0, and compute_scale maps both to eps (fmaxf(amax, eps)): the same scales.
constexpr bool AMAX_PAIRS = TK_IN == 1 && TK_BM == 1 && TK_MODE != 2 && RPT % 2 == 0;

#if TK_IN == 1
// (2,) bf16 lane-wise max of |x| over the FK fragments of one row (NaN ignored, +0 if none).
__device__ __forceinline__ u32 row_amax2(const Raw* raw) {
    u32 m = tkq::bf16x2_abs(raw[0].w[0]);
#pragma unroll
    for (int f = 0; f < FK; ++f)
#pragma unroll
        for (int w = f == 0 ? 1 : 0; w < RAW_WORDS; ++w) m = bf16x2_max(m, tkq::bf16x2_abs(raw[f].w[w]));
    return m;
}
#endif

// The row padding of layout C (zero words in rows nbm..ra below the last row) is written once
// per tile, after the row loop, by the lanes holding row nbm - 1, instead of being tested for in
// every row's scale store: the test r + 1 == nbm and the padding loop's bounds cost ~15 issued
// instructions per row (64-bit compares, the loop's trip count computed ahead of the branch;
// SASS sm_90a, bf16 -> e4m3 npc=128). The same bytes, each written once. H200: the per-row test
// was 8 % slower on average over the per-token casts, up to 25 %.

// ROWPTR (vector accesses only): a tile's input rows are addressed from one row pointer (at the thread's first column, computed once per column tile)
// stepped by the row stride in bytes, instead of r * ldx + c per fragment: the SASS of
// per-token bf16 -> e4m3 npc=128 formed each of the 4 row addresses from scratch (64-bit
// multiply, the column offset shifted and masked again under each load's predicate: ~70 issued
// instructions for the tile's 4 loads). H200: per-block casts 3 % faster on average (up to
// 16 %), per-token 0.8 %.
#define ROWPTR (TK_VECIO != 0)  // element accesses keep load_frag (per-channel blocks spilled)

#if TK_MODE != 2
// The layout-C word column of this lane's block (SF_WORDS; TK_WB 2: the warp's pair): the lane
// storing G = 4 (or 2) blocks kb.. (kb % G == 0) writes rows of it with put(row, v), a whole
// int32, or the half word of its pair of blocks; a pair in the low half of a word whose high
// half holds only blocks >= nbk (no other writer) writes the whole word (the column padding).
template <int G>
struct SfWordColumn {
    u8* s;       // (ra, 4) bytes of word column kb / 4
    ix half;     // byte offset of the pair in the word (kb % 4)
    bool whole;  // the store covers the whole word
    __device__ __forceinline__ SfWordColumn(const Params& p, ix c0) {
        const ix kb = c0 / TK_BK;
        s = reinterpret_cast<u8*>(p.sf) + 4 * ((u64)(kb / 4) * PRA);
        half = kb % 4;
        whole = G == 4 || (kb % 4 == 0 && kb + 2 >= PNBK);
    }
    __device__ __forceinline__ void put(ix row, u32 v) const {
        if (whole) *reinterpret_cast<u32*>(s + 4 * (u64)row) = v;
        else *reinterpret_cast<u16*>(s + 4 * (u64)row + half) = (u16)v;
    }
};

// Stores the scale sf of this lane's block of row r (per-token blocks, SF_WORDS; called by the
// whole warp, uniformly). Lanes lx, lx + LK (, lx + 2 LK, lx + 3 LK) hold the SF_G blocks
// kb.. of one store of layout C (storage (ceil(nbk/4), ra) int32 as bytes); lane lx % (SF_G LK)
// == 0 writes them, with zero bytes for blocks >= nbk (their lanes have c0 >= K). A pair in the
// low half of a word whose high half holds only blocks >= nbk (no other writer) writes the whole
// word, zeros above: the column padding. The row padding: store_sf_word_pad. The same bytes as
// store_scale<2>.
__device__ __forceinline__ void store_sf_word(const Params& p, ix r, ix c0, u32 lx, bool row_ok, float sf) {
    u32 w = c0 < PK ? __float_as_uint(sf) >> 23 : 0u;  // this lane's UE8M0 byte (sf > 0)
    w |= __shfl_down_sync(0xFFFFFFFFu, w, LK) << 8;     // bytes of blocks kb, kb + 1
    if constexpr (SF_G == 4) w |= __shfl_down_sync(0xFFFFFFFFu, w, 2 * LK) << 16;  // kb .. kb + 3
    if (!row_ok || lx % (SF_G * LK) != 0) return;
    const SfWordColumn<SF_G> col(p, c0);
    col.put(r, w);
}

// The row padding of this lane's word column (SF_WORDS): zeros in rows nbm..ra,
// written by the lane that stores row nbm - 1's word (col_ok, lx % (SF_G LK) == 0).
__device__ __forceinline__ void store_sf_word_pad(const Params& p, ix c0, u32 lx) {
    if (c0 >= PK || lx % (SF_G * LK) != 0) return;
    const SfWordColumn<SF_G> col(p, c0);
    for (ix r2 = PNBM; r2 < PRA; ++r2) col.put(r2, 0u);
}
#endif

extern "C" __global__ void __launch_bounds__(256, TK_MINB) tk_cast(const Params p) {
#if !TK_WB
    __shared__ float red[TK_BM > 1 ? WARPS : 1][LX * NB];  // (warps, lanes along K * block columns) partial amax
    __shared__ float scl[TK_BM > 1 ? LX * NB : 1];         // (lanes along K * block columns) inverse scales
#endif
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32, lx = lane % LX, ly = lane / LX;
    const u32 kl = WB ? warp * LX + lx : lx;  // this thread's lane column in the tile (along K)
    const u32 ml = WB ? ly : warp * LY + ly;  // this thread's row group in the tile (along M)
    const ix tiles_m = (PM + TM - 1) / TM, tiles_k = (PK + TKC - 1) / TKC;
    // Per-token tiles: grid x walks column tiles (concurrent CTAs read whole row bands), y row
    // tiles; taller blocks: x row tiles, y column tiles. Column tiles are the outer loop, so a CTA
    // that walks several row tiles (per-token with quantized input: QUANT_ROW_TILES in
    // src/cast.rs) keeps the column-dependent work (column indices and masks, the scale column
    // offsets) out of its row loop.
#if ROWPTR
    const u64 ldx_bytes = (u64)PLDX * IN_STORAGE_BYTES;  // bytes between input rows
#endif
    const ix k_first = TK_BM == 1 ? blockIdx.x : blockIdx.y, k_step = TK_BM == 1 ? gridDim.x : gridDim.y;
    const ix m_first = TK_BM == 1 ? blockIdx.y : blockIdx.x, m_step = TK_BM == 1 ? gridDim.y : gridDim.x;
    for (ix tk = k_first; tk < tiles_k; tk += k_step) {
#if ROWPTR
        const u8* xcol = reinterpret_cast<const u8*>(p.x) + (u64)(tk * TKC + kl * FK * VEC) * IN_BITS / 8;  // row 0 of x at this thread's first column
#endif
        for (ix tm = m_first; tm < tiles_m; tm += m_step) {
            const ix c0 = tk * TKC + kl * FK * VEC;  // first column of this thread's fragments
            const ix r0 = tm * TM + ml * RPT;        // first row of this thread's fragments
            const bool col_ok = c0 < PK;
            Raw raw[RPT * FK];  // (RPT rows, FK fragments of VEC columns)
#if ROWPTR
            const u8* xrow = xcol + (u64)r0 * ldx_bytes;  // row r0 of x from this thread's first column
#endif
#pragma unroll
            for (int i = 0; i < RPT; ++i) {
#pragma unroll
                for (int f = 0; f < FK; ++f) {
                    Raw& rf = raw[i * FK + f];
#if ROWPTR
                    if (c0 + f * VEC < PK && r0 + i < PM) rf = load_frag_at(xrow, PK, f * VEC);
#else
                    if (c0 + f * VEC < PK && r0 + i < PM) rf = load_frag(reinterpret_cast<const void*>(p.x), PLDX, PK, r0 + i, c0 + f * VEC);
#endif
                    else for (int w = 0; w < RAW_WORDS; ++w) rf.w[w] = 0;
                }
#if ROWPTR
                xrow += ldx_bytes;
#endif
            }
#if TK_BM == 1 && TK_MODE != 2
            // Per-token blocks: one row at a time (amax, scale, cast), so that only the raw
            // fragments stay live across rows (fewer registers: more CTAs, more loads in flight).
            float apair[AMAX_PAIRS ? 2 : 1];  // group maxima of rows i, i + 1 (AMAX_PAIRS, even i)
#pragma unroll
            for (int i = 0; i < RPT; ++i) {
                const bool row_ok = col_ok && r0 + i < PM;
#if TK_IN >= 2
                // Quantized input: each fragment decoded and rescaled once, for the block
                // maximum and the cast (frag_amax and cast_frag would decode it twice).
                float v[FK][VEC];  // (FK fragments, VEC columns) values of row r0 + i
                float a = 0.0f;
#pragma unroll
                for (int f = 0; f < FK; ++f) {
                    values(p, raw[i * FK + f], r0 + i, c0 + f * VEC, v[f]);
#pragma unroll
                    for (int j = 0; j < VEC; ++j) a = fmaxf(a, fabsf(v[f][j]));
                }
#pragma unroll
                for (int o = 1; o < LK; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
#else
                float a;
                if constexpr (AMAX_PAIRS) {
#if TK_IN == 1
                    if (i % 2 == 0) {
                        const u32 m0 = row_amax2(raw + i * FK), m1 = row_amax2(raw + (i + 1) * FK);  // (2,) lane maxima of rows i, i + 1
                        u32 pm = bf16x2_max(__byte_perm(m0, m1, 0x5410), __byte_perm(m0, m1, 0x7632));  // (row i, row i + 1)
#pragma unroll
                        for (int o = 1; o < LK; o <<= 1) pm = bf16x2_max(pm, __shfl_xor_sync(0xFFFFFFFFu, pm, o));
                        apair[0] = __uint_as_float(pm << 16);
                        apair[1] = __uint_as_float(pm & 0xFFFF0000u);
                    }
#endif
                    a = apair[i % 2];
                } else {
                    a = frag_amax(p, raw[i * FK], r0 + i, c0);
#pragma unroll
                    for (int f = 1; f < FK; ++f) a = fmaxf(a, frag_amax(p, raw[i * FK + f], r0 + i, c0 + f * VEC));
#pragma unroll
                    for (int o = 1; o < LK; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
                }
#endif
                float sf, inv;
                compute_scale(a, sf, inv);
                if constexpr (SF_WORDS) {
                    store_sf_word(p, r0 + i, c0, lx, row_ok, sf);
                } else {
                    const ix kb = c0 / TK_BK;
                    if (row_ok && lx % LK == 0 && r0 + i < PNBM && kb < PNBK) store_sf(p, r0 + i, kb, sf);
                }
#if TK_MODE == 0
                float iv[VEC];  // (VEC,) inverse scale of row r0 + i
#pragma unroll
                for (int j = 0; j < VEC; ++j) iv[j] = inv;
#pragma unroll
                for (int f = 0; f < FK; ++f) {
                    if (!row_ok || c0 + f * VEC >= PK) continue;
#if TK_IN >= 2
                    store_frag(p, out_at(p, r0 + i, c0 + f * VEC), c0 + f * VEC, v[f], iv);
#else
                    cast_frag(p, raw[i * FK + f], r0 + i, c0 + f * VEC, iv, out_at(p, r0 + i, c0 + f * VEC));
#endif
                }
#endif
            }
            if constexpr (SF_WORDS) {
                if (r0 < PNBM && PNBM <= r0 + RPT) store_sf_word_pad(p, c0, lx);  // this thread holds row nbm - 1
            }
            continue;
#endif
            float sf[NR][NB], inv[NR][NB];  // per block row and block column of the fragments
#if TK_MODE == 2
#pragma unroll
            for (int i = 0; i < NR; ++i)
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    const ix mb = TK_BM == 1 ? r0 + i : tm, kb = TK_BK == 1 ? c0 + b : c0 / TK_BK;
                    sf[i][b] = (mb < PNBM && kb < PNBK) ? __ldg(reinterpret_cast<const float*>(p.sf) + mb * p.sf_ld + kb) : 1.0f;
                    inv[i][b] = __frcp_rn(sf[i][b]);
                }
#else
            float am[NR][NB];  // block maxima of |v| (NaN ignored)
#if TK_IN == 1 && TK_BK == 1
            // bf16 per-channel blocks: the column maxima stay packed bf16 pairs through the rows
            // and the shuffles across the warp's row groups (half the instructions and shuffles).
            u32 amp[RAW_WORDS];  // (VEC/2,) packed column maxima of |x|
#pragma unroll
            for (int w = 0; w < RAW_WORDS; ++w) amp[w] = 0;
#pragma unroll
            for (int i = 0; i < RPT; ++i)
#pragma unroll
                for (int w = 0; w < RAW_WORDS; ++w) amp[w] = bf16x2_max(amp[w], raw[i].w[w] & 0x7FFF7FFFu);
#pragma unroll
            for (int o = LX; o < 32; o <<= 1)
#pragma unroll
                for (int w = 0; w < RAW_WORDS; ++w) amp[w] = bf16x2_max(amp[w], __shfl_xor_sync(0xFFFFFFFFu, amp[w], o));
#pragma unroll
            for (int w = 0; w < RAW_WORDS; ++w) {
                am[0][2 * w] = __uint_as_float(amp[w] << 16);
                am[0][2 * w + 1] = __uint_as_float(amp[w] & 0xFFFF0000u);
            }
            if (TK_BM > 1) {
#else
#pragma unroll
            for (int i = 0; i < NR; ++i)
#pragma unroll
                for (int b = 0; b < NB; ++b) am[i][b] = 0.0f;
#if TK_IN == 1
            if constexpr (TK_BM > 1 && TK_BK > 1) {
                // All the thread's rows belong to one block: their |x| maxima stay packed bf16
                // pairs through the rows (2 three-input VHMNMX per row) and are unpacked once per
                // tile, instead of frag_amax's unpack and 3 FMNMX per row (ALU: ~6 -> ~2 per row
                // of 8 values). The same maximum: max.bf16x2 ignores NaN like fmaxf, and an
                // all-NaN lane pair ends as NaN, which fmaxf(0, .) maps to 0 as frag_amax did.
                // H200 (session 9, against frag_amax per row, with the encoder below): bf16 ->
                // e4m3 8001x7168 32x32 1.0 % faster, bf16 -> e2m1 32x32 0.5 %, 128x128 0.4 %
                // (6 rows: mean 1.004; session 7 alone, when the kernel was bound elsewhere: 1.002).
                u32 m = tkq::bf16x2_abs(raw[0].w[0]);  // (2,) packed max |x| over the rows
#pragma unroll
                for (int i = 0; i < RPT; ++i)
#pragma unroll
                    for (int w = i == 0 ? 1 : 0; w < RAW_WORDS; ++w) m = bf16x2_max(m, tkq::bf16x2_abs(raw[i].w[w]));
                am[0][0] = fmaxf(fmaxf(0.0f, __uint_as_float(m << 16)), __uint_as_float(m & 0xFFFF0000u));
            } else
#endif
            {
#pragma unroll
                for (int i = 0; i < RPT; ++i) {
                    float& a0 = am[TK_BM == 1 ? i : 0][0];
                    if constexpr (TK_BK == 1) {
                        float v[VEC];  // (VEC,) values of row r0 + i, one block column each
                        values(p, raw[i], r0 + i, c0, v);
#pragma unroll
                        for (int j = 0; j < VEC; ++j) am[0][TK_BK == 1 ? j : 0] = fmaxf(am[0][TK_BK == 1 ? j : 0], fabsf(v[j]));
                    } else {
                        a0 = fmaxf(a0, frag_amax(p, raw[i], r0 + i, c0));
                    }
                }
            }
#pragma unroll
            for (int o = 1; o < LK; o <<= 1)
#pragma unroll
                for (int i = 0; i < NR; ++i) am[i][0] = fmaxf(am[i][0], __shfl_xor_sync(0xFFFFFFFFu, am[i][0], o));
            if (TK_BM > 1) {
#pragma unroll
                for (int o = LX; o < 32; o <<= 1)
#pragma unroll
                    for (int b = 0; b < NB; ++b) am[0][b] = fmaxf(am[0][b], __shfl_xor_sync(0xFFFFFFFFu, am[0][b], o));
#endif
#if TK_WB
                // The warp's butterflies above gave every lane its block's maximum: each lane
                // computes the scale (power-of-two scales: a few integer instructions) and the
                // block's first lane (row group 0, lx % LK == 0) stores it (c0 is the block's
                // first column there).
                compute_scale(am[0][0], sf[0][0], inv[0][0]);
                if constexpr (TK_WB == 2 && TK_SF_OUT == 2 && TK_MODE != 2) {
                    // The warp's two blocks kb, kb + 1 (kb = c0 / BK even for lane 0) are the
                    // half word kb % 4 of layout C: lane LK's byte comes over by one shuffle and
                    // lane 0 stores both (the row padding too, on the last block row), instead
                    // of two divergent byte stores with store_scale's 64-bit index and padding
                    // paths (whose registers spilled 8 bytes at this kernel's 64).
                    u32 w = col_ok ? __float_as_uint(sf[0][0]) >> 23 : 0u;  // UE8M0 byte (0: block >= nbk)
                    w |= __shfl_down_sync(0xFFFFFFFFu, w, LK) << 8;          // blocks kb, kb + 1
                    if (lane == 0 && col_ok && tm < PNBM) {
                        const SfWordColumn<2> col(p, c0);
                        col.put(tm, w);
                        if (tm + 1 == PNBM)
                            for (ix r2 = PNBM; r2 < PRA; ++r2) col.put(r2, 0u);
                    }
                } else {
                    const ix kb = c0 / TK_BK;
                    if (ly == 0 && lx % LK == 0 && col_ok && tm < PNBM && kb < PNBK) store_sf(p, tm, kb, sf[0][0]);
                }
#else
                if (ly == 0) {
#pragma unroll
                    for (int b = 0; b < NB; ++b) red[TK_BM > 1 ? warp : 0][lx * NB + b] = am[0][b];
                }
                __syncthreads();
                // One thread per block column of the tile (LX * NB <= 256) folds the warps'
                // maxima, computes the scale once (not once per row group of every warp: 8 * LY
                // times; per-channel tiles: 8 divisions per thread -> at most 1) and stores it;
                // every thread reads its inverse scales back. red and scl are rewritten by the
                // next tile only after its first barrier, which follows these reads.
                if (threadIdx.x < LX * NB) {
                    const u32 t = threadIdx.x, tlx = t / NB, tb = t % NB;  // block column t: lane tlx, column tb
                    float a = 0.0f;
#pragma unroll
                    for (int w = 0; w < (TK_BM > 1 ? WARPS : 1); ++w) a = fmaxf(a, red[w][t]);
                    float s, iv;
                    compute_scale(a, s, iv);
                    scl[t] = iv;
                    const ix tc0 = tk * TKC + tlx * VEC;  // first column of lane tlx (FK == 1)
                    const ix kb = TK_BK == 1 ? tc0 + tb : tc0 / TK_BK;
                    if (tc0 < PK && tlx % LK == 0 && tm < PNBM && kb < PNBK) store_sf(p, tm, kb, s);
                }
                __syncthreads();
#pragma unroll
                for (int b = 0; b < NB; ++b) inv[0][b] = scl[lx * NB + b];
#endif
            } else {
#pragma unroll
                for (int i = 0; i < NR; ++i)
#pragma unroll
                    for (int b = 0; b < NB; ++b) compute_scale(am[i][b], sf[i][b], inv[i][b]);
                if (col_ok && lx % LK == 0) {
#pragma unroll
                    for (int i = 0; i < NR; ++i)
#pragma unroll
                        for (int b = 0; b < NB; ++b) {
                            const ix mb = r0 + i, kb = TK_BK == 1 ? c0 + b : c0 / TK_BK;
                            if (mb < PNBM && kb < PNBK) store_sf(p, mb, kb, sf[i][b]);
                        }
                }
            }
#endif
#if TK_MODE != 1
            // One output offset stepped by the row's bytes, not r * rowbytes + column formed from
            // scratch for each of the 4..16 rows (SASS of bf16 -> e2m1 128x128: ~8 issued
            // instructions per row for that, beside ~48 for the packed encode and store of 8
            // values).
            u64 orow = out_at(p, r0, c0);  // output offset of row r0 + i from column c0
#if E2M1_PACKED
            if constexpr (TK_BM > 1 && TK_BK > 1) {
                // One inverse scale for all the thread's rows (one block row, one block column):
                // its bf16 pair and the 2^120 test of cast_frag made once per tile, then a
                // straight run of packed encodes with predicated stores. The SASS of cast_frag
                // per row (bf16 -> e2m1 32x32 / 128x128) rebuilt the pair (2 PRMT), branched on
                // the hoisted test and on the row's bounds (BSSY/BSYNC, 2 BRA): ~8 of the ~57
                // issued instructions of a row of 8 values. Bit-identical: the same encoder on
                // the same operands; the fallback (inverse above 2^120) stays cast_frag's.
                const u32 ib = __float_as_uint(inv[0][0]);  // positive: (0, 2^120] <=> ib <= 0x7B800000
                if (ib <= 0x7B800000u) {
                    u32 inv2[RAW_WORDS];  // (VEC/2,) bf16 pairs of the inverse scale (exact: a power of two)
#pragma unroll
                    for (int w = 0; w < RAW_WORDS; ++w) inv2[w] = __byte_perm(ib, ib, 0x7632);
#pragma unroll
                    for (int i = 0; i < RPT; ++i) {
                        const u32 q = tkq::e2m1_pack_bf16_pow2_abs(raw[i].w, inv2);  // (VEC/2,) bytes of row r0 + i
                        if (col_ok && r0 + i < PM) store_e2m1(p, orow, c0, q);
                        orow += out_row_bytes(p);
                    }
                    continue;
                }
            }
#endif
#pragma unroll
            for (int i = 0; i < RPT; ++i) {
                const u64 out = orow;
                orow += out_row_bytes(p);
                if (!col_ok || r0 + i >= PM) continue;
                float iv[VEC];  // (VEC,) inverse scales of the fragment's columns
#pragma unroll
                for (int j = 0; j < VEC; ++j) iv[j] = inv[TK_BM == 1 ? i : 0][TK_BK == 1 ? j : 0];
                cast_frag(p, raw[i], r0 + i, c0, iv, out);
            }
#endif
        }
    }
}

#else
// ---------------------------------------------------------------------------------------------
// Whole-row path (one scale per row, plain input, data + scales): one CTA per row; thread t
// owns fragments f = i*THREADS + t (i < NF), held in registers between the amax and the cast.
// ---------------------------------------------------------------------------------------------
#if TK_IN >= 2 || TK_MODE != 0 || TK_BM != 1
#error "the whole-row path takes plain input, cast mode and BM == 1"
#endif
constexpr int NWARPS = TK_THREADS / 32;
// The warps' partial maxima alternate between two buffers by row parity, so no barrier is
// needed to keep a fast warp from overwriting them before slow warps have read them (the write
// for row n + 2 comes after row n + 1's barrier, which every warp reaches after its reads for
// row n); H200: 0.5 % faster than one buffer and that second barrier.

extern "C" __global__ void __launch_bounds__(TK_THREADS) tk_cast(const Params p) {
    __shared__ float red[2][NWARPS];  // (row parity, warps) partial amax
    int par = 0;                                 // buffer of the current row
#if TK_FMT == 2 && TK_VECIO
    __shared__ __align__(16) u32 stage_buf[NWARPS][96];  // (warps, 32 lanes x 3 words) E5M6 staging
    u32 (*stage)[96] = stage_buf;
#endif
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (ix r = blockIdx.x; r < PM; r += gridDim.x) {
        Raw raw[TK_NF];  // (NF fragments, VEC columns)
        float am = 0.0f;
#pragma unroll
        for (int i = 0; i < TK_NF; ++i) {
            const ix c0 = ((ix)i * TK_THREADS + threadIdx.x) * VEC;
            if (c0 < PK) raw[i] = load_frag(reinterpret_cast<const void*>(p.x), PLDX, PK, r, c0);
        }
#pragma unroll
        for (int i = 0; i < TK_NF; ++i) {
            const ix c0 = ((ix)i * TK_THREADS + threadIdx.x) * VEC;
            if (c0 < PK) am = fmaxf(am, frag_amax(p, raw[i], r, c0));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xFFFFFFFFu, am, o));
        if (lane == 0) red[par][warp] = am;
        __syncthreads();
        am = 0.0f;
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) am = fmaxf(am, red[par][w]);
        par ^= 1;
        float sf, inv;
        compute_scale(am, sf, inv);
        if (threadIdx.x == 0) store_sf(p, r, 0, sf);
        float iv[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) iv[j] = inv;
#pragma unroll
        for (int i = 0; i < TK_NF; ++i) {
            const ix c0 = ((ix)i * TK_THREADS + threadIdx.x) * VEC;
#if TK_FMT == 2 && TK_VECIO
            // E5M6: a warp's 32 fragments are 384 contiguous bytes; staged through shared
            // memory they go out as 24 coalesced 16-byte stores instead of 96 scattered words.
            const u64 row_bytes = p.k / 2 * 3;
            const bool staged = __all_sync(0xFFFFFFFFu, c0 < PK) && (p.out + r * row_bytes) % 16 == 0;
            if (staged) {
                float v[VEC];
                values(p, raw[i], r, c0, v);
                e5m6_words(v, iv, stage[warp] + 3 * lane);
                __syncwarp();
                if (lane < 24) {
                    uint4* dst = reinterpret_cast<uint4*>(reinterpret_cast<u8*>(p.out) + r * row_bytes + (c0 - lane * VEC) / 2 * 3);  // (24,) x 16 bytes
                    dst[lane] = reinterpret_cast<const uint4*>(stage[warp])[lane];
                }
                __syncwarp();
                continue;
            }
#endif
            if (c0 < PK) cast_frag(p, raw[i], r, c0, iv, out_at(p, r, c0));
        }
    }
}
#endif
