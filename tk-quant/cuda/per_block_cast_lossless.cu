// Lossless FP4 e2m1 -> FP8 e4m3 requantization in exponent space (spec/quant.md §3.4; see
// src/per_block_cast_lossless.rs for the algorithm and its data-dependent error rules).
//
// Compile-time constants (defines):
//   TK_PASS      1: one warp (or, for small blocks, one thread) per output block: E_out = max(E_in) - 6 (saturating), the scale
//                   written in the output layout, error bits 1 (an input scale is not a positive
//                   normal power of two) and 2 (an input block more than 2^11 below E_max);
//                2: a warp per task of 1024 columns of a row: out = enc8(dec4 * 2^(E_in - E_out)),
//                   error bit 4 (scale 0.0 over nonzero data).
//   TK_IN = 3 (e2m1), TK_IN_SF (0 fp32 / 1 packed input scales), TK_IH, TK_IW, TK_OH, TK_OW,
//   TK_SF_OUT (0 A, 1 B, 2 C), TK_VECIO (pass 2: 0 byte accesses, 1 rows 4-byte aligned (FP4)
//   and 8-byte aligned (FP8), 2 rows 8- and 16-byte aligned).
// Pass 2 requantizes with integer byte permutes (16 columns per lane fragment) where
// TK_VECIO == 2 and TK_IW, TK_OW are multiples of 16, else with an fp32 multiply + F2FP
// (8 columns per fragment).
// Errors are OR-ed into *flag with atomicOr (only when one occurs); the host reads it later.
#include "tk/quant_io.cuh"

// Kernel arguments (mirrored by `LosslessArgs` in src/per_block_cast_lossless.rs).
struct Params {
    u64 x;               // (M, K/2) packed e2m1, row stride ldx bytes
    u64 ldx;
    u64 x_sf;            // input scales: fp32 or packed int32, strides (xsf_s0, xsf_s1)
    u64 xsf_s0, xsf_s1;
    u64 out;             // (M, K) e4m3, contiguous
    u64 sf;              // output scales (full allocation)
    u64 flag;            // (1,) u32 error bits
    u64 m, k;
    u64 in_nbm, in_nbk;  // input scale grid
    u64 nbm, nbk;        // output scale grid
    u64 rows_aligned;    // align(nbm, 4)
};

// Byte offset of input scale (mb, kb) = in_sf_row(mb) + in_sf_col(kb): fp32 at mb*s0 + kb*s1,
// or UE8M0 byte kb%4 of the int32 at (mb, kb/4).
__device__ __forceinline__ u64 in_sf_row(const Params& p, u64 mb) { return 4 * mb * p.xsf_s0; }
__device__ __forceinline__ u64 in_sf_col(const Params& p, u64 kb) {
#if TK_IN_SF == 0
    return 4 * kb * p.xsf_s1;
#else
    return 4 * (kb / 4) * p.xsf_s1 + kb % 4;
#endif
}

// The input scale at byte offset `off`: its fp32 bits or its UE8M0 byte.
__device__ __forceinline__ u32 in_scale_bits(const Params& p, u64 off) {
    const u8* sf = reinterpret_cast<const u8*>(p.x_sf);  // input scales as bytes
#if TK_IN_SF == 0
    return __ldg(reinterpret_cast<const u32*>(sf + off));
#else
    return __ldg(sf + off);
#endif
}

// E_in of an input scale (in_scale_bits), or 0 when it is not a positive normal power of two.
__device__ __forceinline__ u32 in_exponent_of(u32 bits) {
#if TK_IN_SF == 0
    const u32 e = bits >> 23;
    return ((bits & 0x807FFFFFu) == 0 && e >= 1 && e <= 254) ? e : 0;
#else
    return bits <= 254 ? bits : 0;
#endif
}

// E_in of input block (mb, kb).
__device__ __forceinline__ u32 in_exponent(const Params& p, u64 mb, u64 kb) {
    return in_exponent_of(in_scale_bits(p, in_sf_row(p, mb) + in_sf_col(p, kb)));
}

// Byte offset (layout C) or element index (A, B) of output scale (mo, ko) =
// out_sf_row(mo) + out_sf_col(ko).
__device__ __forceinline__ u64 out_sf_row(const Params& p, u64 mo) {
#if TK_SF_OUT == 0
    return mo * p.nbk;
#elif TK_SF_OUT == 1
    return mo;
#else
    return 4 * mo;
#endif
}
__device__ __forceinline__ u64 out_sf_col(const Params& p, u64 ko) {
#if TK_SF_OUT == 0
    return ko;
#elif TK_SF_OUT == 1
    return ko * p.rows_aligned;
#else
    return 4 * (ko / 4) * p.rows_aligned + ko % 4;
#endif
}
__device__ __forceinline__ u64 out_index(const Params& p, u64 mo, u64 ko) { return out_sf_row(p, mo) + out_sf_col(p, ko); }

#if TK_PASS == 1
// One team of TEAM lanes per output block: a warp when the block holds at least 64 input
// blocks (or, with packed column-major input scales, a column of at least 32:
// the lanes then read consecutive int32), else a single thread; the team's lanes take its
// RH x RW input blocks in row-major order (constant trip count: the loads are issued
// together), then reduce.
constexpr u64 RH = TK_OH / TK_IH, RW = TK_OW / TK_IW;  // input blocks per output block
constexpr u32 NB = RH * RW;
constexpr u32 TEAM = NB >= 64 || (TK_IN_SF == 1 && RH >= 32) ? 32 : 1;
constexpr u32 PER = (NB + TEAM - 1) / TEAM;  // input blocks per lane
constexpr u32 CH = PER < 16 ? PER : 16;       // of them loaded together
extern "C" __global__ void __launch_bounds__(256) tk_lossless(const Params p) {
    const u32 lane = threadIdx.x % TEAM;
    const u64 total = p.nbm * p.nbk, teams = (u64)gridDim.x * blockDim.x / TEAM;
    // Consecutive teams take consecutive block rows, or (single threads over row-major fp32
    // input scales) consecutive block columns: the direction of contiguous scales.
    const bool kfast = TEAM == 1 && TK_IN_SF == 0 && p.xsf_s1 == 1;
    const u64 n_fast = kfast ? p.nbk : p.nbm;
    for (u64 i = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / TEAM; i < total; i += teams) {
        const u64 q = i / n_fast, f = i - q * n_fast;
        const u64 mo = kfast ? q : f, ko = kfast ? f : q;
        const u64 mb0 = mo * RH, kb0 = ko * RW;
        u32 e_max = 0, e_min = 255, bad = 0;
        // the last input block row and column of the output block inside the grid: indices
        // past them (or past the block, b >= NB) are clamped to them, repeating a member
        const u64 mb_last = min(mb0 + RH, p.in_nbm) - 1, kb_last = min(kb0 + RW, p.in_nbk) - 1;
        for (u32 n0 = 0; n0 < PER; n0 += CH) {
            u32 e[CH];  // (CH,) exponents of this lane's input blocks n0 .. n0 + CH - 1
#pragma unroll
            for (u32 c = 0; c < CH; ++c) {
                const u32 b = (n0 + c) * TEAM + lane;  // row-major index in the output block
                e[c] = in_exponent(p, min(mb0 + b / RW, mb_last), min(kb0 + b % RW, kb_last));
            }
#pragma unroll
            for (u32 c = 0; c < CH; ++c) {
                bad |= e[c] == 0;
                e_max = max(e_max, e[c]);
                e_min = min(e_min, e[c]);
            }
        }
        if constexpr (TEAM == 32) {
            e_max = __reduce_max_sync(0xFFFFFFFFu, e_max);
            e_min = __reduce_min_sync(0xFFFFFFFFu, e_min);
            bad = __reduce_or_sync(0xFFFFFFFFu, bad);
        }
        if (lane != 0) continue;
        const u32 eo = e_max > 6 ? e_max - 6 : 0;
        const u32 err = (bad ? 1u : 0u) | (e_min + 5 < eo ? 2u : 0u);
        if (err) atomicOr(reinterpret_cast<u32*>(p.flag), err);
#if TK_SF_OUT == 2
        u8* s = reinterpret_cast<u8*>(p.sf);  // (ceil(nbk/4), rows_aligned) int32 as bytes
        s[out_index(p, mo, ko)] = (u8)eo;
        const u64 kend = 4 * ((p.nbk + 3) / 4);
        if (mo + 1 == p.nbm)
            for (u64 r = p.nbm; r < p.rows_aligned; ++r) s[out_index(p, r, ko)] = 0;
        if (ko + 1 == p.nbk)
            for (u64 k2 = p.nbk; k2 < kend; ++k2)
                for (u64 r = mo; r < (mo + 1 == p.nbm ? p.rows_aligned : mo + 1); ++r) s[out_index(p, r, k2)] = 0;
#else
        float* s = reinterpret_cast<float*>(p.sf);
        s[out_index(p, mo, ko)] = __uint_as_float(eo << 23);
#if TK_SF_OUT == 1
        if (mo + 1 == p.nbm)
            for (u64 r = p.nbm; r < p.rows_aligned; ++r) s[out_index(p, r, ko)] = 0.0f;
#endif
#endif
    }
}

#else
// E_out of the output scale at `idx` (out_index), read back from the scales pass 1 wrote.
__device__ __forceinline__ u32 out_exponent_at(const Params& p, u64 idx) {
#if TK_SF_OUT == 2
    return reinterpret_cast<const u8*>(p.sf)[idx];
#else
    return __float_as_uint(reinterpret_cast<const float*>(p.sf)[idx]) >> 23;
#endif
}

constexpr int WARPS = 8;     // warps per CTA (256 threads)
constexpr int SEG = 1024;    // columns per warp task (the host's PASS2_TASK_COLUMNS)

// The warp tasks (row r, segment s of SEG columns) t0, t0 + stride, ... in order, advanced
// without a division per task.
struct Tasks {
    u64 r, dr;
    u32 s, ds, segs;
    __device__ __forceinline__ Tasks(u64 k, u64 t0, u64 stride) {
        segs = (u32)((k + SEG - 1) / SEG);
        r = t0 / segs;
        s = (u32)(t0 - r * segs);
        dr = stride / segs;
        ds = (u32)(stride - dr * segs);
    }
    __device__ __forceinline__ void next() {
        r += dr;
        s += ds;
        if (s >= segs) {
            s -= segs;
            ++r;
        }
    }
};

#if TK_VECIO == 2 && TK_IW % 16 == 0 && TK_OW % 16 == 0
constexpr int FW = 16;           // columns per lane fragment: 8 bytes of FP4 in, 16 of FP8 out
constexpr int J = SEG / 32 / FW; // fragments per lane and task (loads issued before any store)

// e4m3 codes of the e2m1 magnitudes 0..7 (0, 0.5, 1, 1.5 | 2, 3, 4, 6) times 2^0, byte m of
// {LUT_HI:LUT_LO}: magnitude 2^e (1 + f/2) is the e4m3 code (e + 7) << 3 | f << 2.
constexpr u32 LUT_LO = 0x3C383000u, LUT_HI = 0x4C484440u;

// PTX prmt.b32 in its default mode: byte i of the result is byte (s >> 4i) & 7 of {b:a}, or,
// when bit 3 of that selector nibble is set, that byte's sign bit replicated (0x00 / 0xFF).
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 s) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
    return d;
}

// The 8 e4m3 codes of the 8 e2m1 codes of `w` (column j in bits 4j..4j+3) times 2^d, given the
// magnitude table {hi:lo} for d: byte j of the result (x: columns 0..3, y: 4..7) is
// table[magnitude] | sign << 7. The sign of column 2i is bit 7 of byte i of w << 4, that of
// column 2i + 1 bit 7 of byte i of w: sign-replicating selectors (0xD9C8, 0xFBEA) spread them.
__device__ __forceinline__ uint2 requant8(u32 w, u32 lo, u32 hi) {
    const u32 mag = w & 0x77777777u, w4 = w << 4;  // (8,) 3-bit table indices; signs of even columns
    const u32 t0 = prmt(lo, hi, mag), t1 = prmt(lo, hi, mag >> 16);      // (4,) magnitudes each
    const u32 s0 = prmt(w4, w, 0xD9C8u), s1 = prmt(w4, w, 0xFBEAu);      // (4,) 0x00 / 0xFF each
    return make_uint2(t0 | (s0 & 0x80808080u), t1 | (s1 & 0x80808080u));
}

// A warp per task of SEG consecutive columns of one row (masked at the row end, K % 32 == 0):
// lane l handles fragment j at column 32 FW j + FW l of the task, so each store instruction
// writes 512 contiguous bytes. Exactness: whenever the op succeeds, d = E_in - E_out lies in
// [-5, 6] and every nonzero e2m1 value v = 2^e (1 + f/2), e in [-1, 2], times 2^d is the normal
// e4m3 value with exponent field e + d + 7 in [1, 15] and mantissa f << 2 (at most 0x7C = 384):
// adding 8 d to each nonzero table byte is the exact encoding, bit for bit what
// enc8(dec4 * 2^d) gives; zeros stay (signed) zeros. For other d (an error is then reported
// by pass 1 or here) the bytes are unspecified.
// At most 32 registers: 8 CTAs per SM, the full 64 warps (the host launches one wave of
// resident CTAs; the register cap measured neutral on the H200, within 1 %).
extern "C" __global__ void __launch_bounds__(256, 8) tk_lossless(const Params p) {
    const u32 lane = threadIdx.x % 32;
    bool lost = false;
    for (Tasks t(p.k, (u64)blockIdx.x * WARPS + threadIdx.x / 32, (u64)gridDim.x * WARPS); t.r < p.m; t.next()) {
        const u64 r = t.r, c_task = (u64)t.s * SEG;
        const u8* xrow = reinterpret_cast<const u8*>(p.x) + r * p.ldx;  // (K/2,) packed e2m1 of row r
        u8* orow = reinterpret_cast<u8*>(p.out) + r * p.k;              // (K,) e4m3 of row r
        const u64 in_row = in_sf_row(p, r / TK_IH), out_row = out_sf_row(p, r / TK_OH);
        uint2 raw[J];   // (J, 16 nibbles) of row r
        u32 si[J], eo[J];  // input scale bits, E_out of each fragment
        // Loads only (no use before the second loop): all of them are in flight at once.
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const u64 c = c_task + j * 32 * FW + lane * FW;
            if (c >= p.k) continue;
            raw[j] = __ldg(reinterpret_cast<const uint2*>(xrow + c / 2));
            eo[j] = out_exponent_at(p, out_row + out_sf_col(p, c / TK_OW));
            si[j] = in_scale_bits(p, in_row + in_sf_col(p, c / TK_IW));
        }
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const u64 c = c_task + j * 32 * FW + lane * FW;
            if (c >= p.k) continue;
            lost |= eo[j] == 0 && ((raw[j].x | raw[j].y) & 0x77777777u) != 0;  // a nonzero magnitude
            const u32 d = in_exponent_of(si[j]) - eo[j];  // E_in - E_out (two's complement)
            const u32 lo = LUT_LO + d * 0x08080800u, hi = LUT_HI + d * 0x08080808u;
            const uint2 a = requant8(raw[j].x, lo, hi), b = requant8(raw[j].y, lo, hi);
            *reinterpret_cast<uint4*>(orow + c) = make_uint4(a.x, a.y, b.x, b.y);  // (16,) e4m3
        }
    }
    if (lost) atomicOr(reinterpret_cast<u32*>(p.flag), 4u);
}

#else
constexpr int J = 4;                   // fragments per lane and warp task (loads issued before any store)
constexpr int STEP = 32 * VEC;         // columns of one warp-wide fragment load
static_assert(J * STEP == SEG, "a task is J fragments");
constexpr bool FRAG_SCALES = TK_IW % VEC == 0 && TK_OW % VEC == 0;  // one E_in / E_out per fragment

// E_out of output block (mo, ko).
__device__ __forceinline__ u32 out_exponent(const Params& p, u64 mo, u64 ko) { return out_exponent_at(p, out_index(p, mo, ko)); }

// The 8 e4m3 codes of fragment `raw` of row r from column c0, and whether a nonzero value met
// an output scale 0.0 (E_out = 0).
__device__ __forceinline__ uint2 requant(const Params& p, const Raw& raw, u64 r, u64 c0, u32 ei0, u32 eo0, bool& lost) {
    u32 w[2] = {0, 0};  // (2,) words of 4 e4m3 codes, column c0 in the low byte
    if constexpr (FRAG_SCALES) lost |= eo0 == 0 && (raw.w[0] & 0x77777777u) != 0;  // a nonzero magnitude
#pragma unroll
    for (int j = 0; j < VEC; j += 2) {
        float v[2];  // (2,) values of columns c0 + j, c0 + j + 1, rescaled
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u64 c = c0 + j + i;
            const u32 ei = FRAG_SCALES ? ei0 : in_exponent(p, r / TK_IH, c / TK_IW);
            const u32 eo = FRAG_SCALES ? eo0 : out_exponent(p, r / TK_OH, c / TK_OW);
            const int d = min(max((int)ei - (int)eo, -126), 127);
            const float x = decode_elem(raw, j + i);
            if constexpr (!FRAG_SCALES) lost |= eo == 0 && x != 0.0f;
            v[i] = __fmul_rn(x, __uint_as_float((u32)(d + 127) << 23));
        }
        // one F2FP converts the pair, each exactly as __nv_cvt_float_to_fp8 would
        const u32 two = __nv_cvt_float2_to_fp8x2(make_float2(v[0], v[1]), __NV_SATFINITE, __NV_E4M3);
        w[j / 4] |= two << (8 * (j % 4));
    }
    return make_uint2(w[0], w[1]);
}

// A warp per task of SEG consecutive columns of one row (masked at the row end, K % 32 == 0):
// lane l handles fragment j at column STEP * j + VEC * l of the task, so each store instruction
// writes 256 contiguous bytes.
extern "C" __global__ void __launch_bounds__(256) tk_lossless(const Params p) {
    const int lane = threadIdx.x % 32;
    bool lost = false;
    for (Tasks t(p.k, (u64)blockIdx.x * WARPS + threadIdx.x / 32, (u64)gridDim.x * WARPS); t.r < p.m; t.next()) {
        const u64 r = t.r, c_task = (u64)t.s * SEG;  // warp-uniform row and first column
        Raw raw[J];                                              // (J, 8 nibbles) of row r
        u32 ei[J], eo[J];                                        // E_in, E_out of each fragment
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const u64 c = c_task + j * STEP + lane * VEC;
            if (c >= p.k) continue;
            raw[j] = load_frag(reinterpret_cast<const void*>(p.x), p.ldx, p.k, r, c);
            if constexpr (FRAG_SCALES) {
                ei[j] = in_exponent(p, r / TK_IH, c / TK_IW);
                eo[j] = out_exponent(p, r / TK_OH, c / TK_OW);
            }
        }
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const u64 c = c_task + j * STEP + lane * VEC;
            if (c >= p.k) continue;
            const uint2 q = requant(p, raw[j], r, c, FRAG_SCALES ? ei[j] : 0, FRAG_SCALES ? eo[j] : 0, lost);
            u8* dst = reinterpret_cast<u8*>(p.out) + r * p.k + c;  // (VEC,) e4m3 bytes of row r
#if TK_VECIO
            *reinterpret_cast<uint2*>(dst) = q;
#else
#pragma unroll
            for (int i = 0; i < VEC; ++i) dst[i] = (u8)((i < 4 ? q.x : q.y) >> (8 * (i % 4)));
#endif
        }
    }
    if (lost) atomicOr(reinterpret_cast<u32*>(p.flag), 4u);
}
#endif
#endif
