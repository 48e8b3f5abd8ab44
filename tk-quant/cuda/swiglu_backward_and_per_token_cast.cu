// SwiGLU backward from an FP8 input, fused with a per-token FP8 cast of the input gradient
// (spec/quant.md §3.11; CPU reference reference::swiglu_backward_and_per_token_cast_with_expf,
// matched bit for bit given CUDA's expf, except weight_grad's summation order).
//
// For each row i < N, w = weight.flat[p] for p = pos_to_token_topk[i] in [0, T*k), else 0;
// for each j < H (one rounding per operation, the single FMA marked):
//   X = fl(dec8(x[i, j]) * xs[i, j/NPC]),  Y = fl(dec8(x[i, H+j]) * xs[i, (H+j)/NPC])
//   clamp (has_clamp): cx = X > C (X = C); Y = C if Y > C, -C if Y < -C, cy = either
//   g = fp32(grad[i, j]); t = fl(1 + expf(-X)); s = fl(1 / t); act = fl(fl(X / t) * Y)
//   gws = fl(fl(g * w) * s)
//   dX = cx ? +0 : fl(fl(gws * Y) * fmaf(X, fl(1 - s), 1))      <- the one FMA
//   dY = cy ? +0 : fl(gws * X)
//   out[i, j] = bf16(fl(act * w)); x_grad[i, j] = bf16(dX); x_grad[i, H+j] = bf16(dY)
//   x_grad_fp8: per-token e4m3 cast of the fp32 row [dX | dY] in groups of NPC (eps 1e-4),
//               fp32 scales row-major (N, 2H/NPC)
//   weight_grad.flat[p] = sum_j g * act (fp32 FMA accumulation + tree), and every slot s
//               with token_topk_to_pos.flat[s] == -1 is zeroed.
//
// Compile-time constants (defines):
//   TK_NPC     32 or 128 (H % NPC == 0)
//   TK_ROUND   1: power-of-two scales
//   TK_VECIO   1: vector accesses (every row start 16-byte aligned); 0: bytewise
//   TK_WARPS   warps per CTA (below)
//
// One CTA of THREADS threads per row (grid-stride); thread t owns the COLS = 16 columns
// of unit u = c * THREADS + t of chunk c, so a group of NPC columns is NPC/COLS adjacent lanes. The loads of
// chunk c + 1 are issued before chunk c is processed (two chunks in flight); the divisions run
// inline when the fragment's gates allow (tkq::div8_by).
#include "tk/fused_io.cuh"

using tk::u8;
using tk::u32;
using tk::u64;
using tk::i32;

// Kernel arguments (mirrored by `BwdArgs` in src/swiglu_backward_and_per_token_cast.rs).
struct Params {
    u64 x, ldx;               // (N, 2H) e4m3, row stride (bytes = elements)
    u64 xs, xs_ld;            // (N, 2H/NPC) fp32 dequantization scales, row stride
    u64 g, ldg;               // (N, H) bf16 grad_out, row stride (elements)
    u64 w, w_s0, w_s1;        // (T, k) fp32 weight, strides
    u64 k, tk;                // k and T * k
    u64 ptt, ptt_s;           // (N,) int32 pos_to_token_topk, stride
    u64 ttp, ttp_s0, ttp_s1;  // (T, k) int32 token_topk_to_pos, strides
    u64 out;                  // (N, H) bf16, contiguous
    u64 q;                    // (N, 2H) e4m3 x_grad_fp8, contiguous
    u64 qsf;                  // (N, 2H/NPC) fp32 scales, contiguous
    u64 xg;                   // (N, 2H) bf16 x_grad, contiguous
    u64 wg;                   // (T, k) fp32 weight_grad, contiguous
    u64 n, h;
    u32 has_clamp;
    float clamp;
};

// TK_WARPS: warps per CTA (1..4), chosen by the host so that the lanes tile the row's H / 16
// lane units exactly (no chunk with idle lanes). A lane owns 16 consecutive columns of a chunk
// (FPL = 2 fragments of 8: one LDG.128 each of x and y, two of grad, one STG.128 of each e4m3
// half), so the per-lane fixed work of a chunk (row offsets, the two scale loads, the group amax
// shuffles, the two scale_pair and the scale stores) is paid once per 16 elements.
#ifndef TK_WARPS
#define TK_WARPS 4
#endif
// CTAs per SM asked of the register allocator: 12 warps per SM at every TK_WARPS, which caps
// the kernel at 168 registers (it takes 128 on sm_90a, no spills).
constexpr int THREADS = 32 * TK_WARPS, NWARPS = TK_WARPS, MINB = 12 / TK_WARPS;
constexpr int FPL = 2, COLS = 8 * FPL;  // fragments and columns per lane
constexpr int LK = TK_NPC / COLS;       // lanes per group
constexpr bool VECIO = TK_VECIO != 0;
static_assert(TK_NPC == 32 || TK_NPC == 128, "NPC must be 32 or 128");
static_assert(TK_WARPS >= 1 && TK_WARPS <= 4, "TK_WARPS must be 1..4");

// The raw loads of one lane unit u of a row (COLS columns from u * COLS; zeros beyond the
// row's units): gate and value e4m3 codes, their dequantization scales (one group, as
// COLS divides NPC), and the bf16 gradient.
struct Raw {
    u32 x[2 * FPL], y[2 * FPL], g[4 * FPL];
    float sx, sy;
};

__device__ __forceinline__ Raw load_raw(const Params& p, const u8* xrow, const float* srow, const u8* grow, u64 u, u64 units) {
    Raw r;
#pragma unroll
    for (int i = 0; i < 2 * FPL; ++i) r.x[i] = r.y[i] = 0;
#pragma unroll
    for (int i = 0; i < 4 * FPL; ++i) r.g[i] = 0;
    r.sx = r.sy = 0.0f;
    if (u < units) {
        const u64 j0 = u * COLS;
        tkq::load_bytes<COLS, VECIO>(xrow + j0, r.x);          // (COLS,) e4m3 of X
        tkq::load_bytes<COLS, VECIO>(xrow + p.h + j0, r.y);    // (COLS,) e4m3 of Y
        tkq::load_bytes<2 * COLS, VECIO>(grow + j0 * 2, r.g);  // (COLS,) bf16 of grad_out
        r.sx = srow[j0 / TK_NPC];
        r.sy = srow[(p.h + j0) / TK_NPC];
    }
    return r;
}

// Max over the LK lanes of a group.
__device__ __forceinline__ float group_max(float a) {
#pragma unroll
    for (int o = 1; o < LK; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
    return a;
}


// The rows r = blockIdx.x + i * gridDim.x: out, x_grad, x_grad_fp8 and its scales, and the
// weight_grad entry of each routed row. CLAMP = p.has_clamp: the loop is instantiated with and
// without the clamp and chosen once per CTA (with the test inside the loop the sm_90a SASS
// branches around every element's clamp and keeps the clamp flags live across the division).
template <bool CLAMP>
__device__ __forceinline__ void backward_rows(const Params& p, float (&red)[NWARPS]) {
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const u64 units = p.h / COLS, nbk = 2 * p.h / TK_NPC;  // H % NPC == 0, so COLS | H
    for (u64 r = blockIdx.x; r < p.n; r += gridDim.x) {
        const i32 slot = reinterpret_cast<const i32*>(p.ptt)[r * p.ptt_s];
        const bool has_w = slot >= 0 && (u64)slot < p.tk;
        const u64 sl = has_w ? (u64)slot : 0;
        const float w = has_w ? reinterpret_cast<const float*>(p.w)[(sl / p.k) * p.w_s0 + (sl % p.k) * p.w_s1] : 0.0f;
        const u8* xrow = reinterpret_cast<const u8*>(p.x) + r * p.ldx;                 // (2H,) e4m3
        const float* srow = reinterpret_cast<const float*>(p.xs) + r * p.xs_ld;         // (2H/NPC,) fp32
        const u8* grow = reinterpret_cast<const u8*>(p.g) + r * p.ldg * 2;              // (H,) bf16
        float wsum = 0.0f;
        Raw cur = load_raw(p, xrow, srow, grow, threadIdx.x, units);
        for (u64 c0 = 0; c0 < units; c0 += THREADS) {
            // The next chunk's loads are issued before this chunk is processed.
            const Raw nxt = load_raw(p, xrow, srow, grow, c0 + THREADS + threadIdx.x, units);
            const u64 u = c0 + threadIdx.x;  // this lane's unit (groups never straddle chunks)
            const bool ok = u < units;
            const u64 j0 = u * COLS;         // first column of the unit
            float X[COLS], Y[COLS], G[COLS];  // (COLS,) dequantized gate, value; gradient
#pragma unroll
            for (int fr = 0; fr < FPL; ++fr) {
                const u32 xw[2] = {cur.x[2 * fr], cur.x[2 * fr + 1]};
                const u32 yw[2] = {cur.y[2 * fr], cur.y[2 * fr + 1]};
                const u32 gw[4] = {cur.g[4 * fr], cur.g[4 * fr + 1], cur.g[4 * fr + 2], cur.g[4 * fr + 3]};
                tkq::widen8<2>(xw, *reinterpret_cast<float(*)[8]>(X + 8 * fr));
                tkq::widen8<2>(yw, *reinterpret_cast<float(*)[8]>(Y + 8 * fr));
                tkq::widen8<1>(gw, *reinterpret_cast<float(*)[8]>(G + 8 * fr));
            }
#pragma unroll
            for (int e = 0; e < COLS; ++e) {
                X[e] = __fmul_rn(X[e], cur.sx);
                Y[e] = __fmul_rn(Y[e], cur.sy);
            }
            cur = nxt;
            float xv[COLS], yv[COLS], t[COLS], s[COLS], xt[COLS];  // (COLS,) clamped inputs, fl(1 + expf(-X)), 1/t, X/t
            tkq::ClampFlags fl[COLS];
#pragma unroll
            for (int e = 0; e < COLS; ++e) {
                xv[e] = X[e];
                yv[e] = Y[e];
                fl[e] = tkq::ClampFlags{false, false, false};
                if (CLAMP) fl[e] = tkq::swiglu_clamp<true>(xv[e], yv[e], p.clamp);
                t[e] = __fadd_rn(1.0f, expf(-xv[e]));
            }
#pragma unroll
            for (int fr = 0; fr < FPL; ++fr)
                tkq::div8_by(*reinterpret_cast<const float(*)[8]>(xv + 8 * fr), *reinterpret_cast<const float(*)[8]>(t + 8 * fr),
                             *reinterpret_cast<float(*)[8]>(s + 8 * fr), *reinterpret_cast<float(*)[8]>(xt + 8 * fr));
            float o[COLS], dx[COLS], dy[COLS];  // (COLS,) out before bf16, gradients
            float ax = 0.0f, ay = 0.0f;
#pragma unroll
            for (int e = 0; e < COLS; ++e) {
                const float act = __fmul_rn(xt[e], yv[e]);
                const float gws = __fmul_rn(__fmul_rn(G[e], w), s[e]);
                dx[e] = fl[e].gate ? 0.0f : __fmul_rn(__fmul_rn(gws, yv[e]), __fmaf_rn(xv[e], __fsub_rn(1.0f, s[e]), 1.0f));
                dy[e] = (fl[e].hi || fl[e].lo) ? 0.0f : __fmul_rn(gws, xv[e]);
                o[e] = __fmul_rn(act, w);
                if (ok) wsum = __fmaf_rn(G[e], act, wsum);
                ax = fmaxf(ax, fabsf(dx[e]));
                ay = fmaxf(ay, fabsf(dy[e]));
            }
            ax = group_max(ax);
            ay = group_max(ay);
            float sfx, invx, sfy, invy;
            tkq::scale_pair<TK_ROUND != 0>(ax, __uint_as_float(0x38D1B717u), 448.0f, sfx, invx);
            tkq::scale_pair<TK_ROUND != 0>(ay, __uint_as_float(0x38D1B717u), 448.0f, sfy, invy);
            if (!ok) continue;
            u32 wo[4 * FPL], wx[4 * FPL], wy[4 * FPL], qx[2 * FPL], qy[2 * FPL];  // packed words of the unit
#pragma unroll
            for (int fr = 0; fr < FPL; ++fr) {
                tkq::pack8_plain<1>(*reinterpret_cast<const float(*)[8]>(o + 8 * fr), *reinterpret_cast<u32(*)[4]>(wo + 4 * fr));
                tkq::pack8_plain<1>(*reinterpret_cast<const float(*)[8]>(dx + 8 * fr), *reinterpret_cast<u32(*)[4]>(wx + 4 * fr));
                tkq::pack8_plain<1>(*reinterpret_cast<const float(*)[8]>(dy + 8 * fr), *reinterpret_cast<u32(*)[4]>(wy + 4 * fr));
                tkq::pack8_quant<0>(*reinterpret_cast<const float(*)[8]>(dx + 8 * fr), invx, *reinterpret_cast<u32(*)[2]>(qx + 2 * fr));
                tkq::pack8_quant<0>(*reinterpret_cast<const float(*)[8]>(dy + 8 * fr), invy, *reinterpret_cast<u32(*)[2]>(qy + 2 * fr));
            }
            u8* out = reinterpret_cast<u8*>(p.out) + (r * p.h + j0) * 2;    // (COLS,) bf16 of out
            u8* xg = reinterpret_cast<u8*>(p.xg) + (r * 2 * p.h + j0) * 2;  // (COLS,) bf16 of x_grad (dX half)
            u8* q = reinterpret_cast<u8*>(p.q) + r * 2 * p.h + j0;          // (COLS,) e4m3 of x_grad_fp8 (dX half)
            tkq::store_bytes<2 * COLS, VECIO>(out, wo);
            tkq::store_bytes<2 * COLS, VECIO>(xg, wx);
            tkq::store_bytes<2 * COLS, VECIO>(xg + p.h * 2, wy);
            tkq::store_bytes<COLS, VECIO>(q, qx);
            tkq::store_bytes<COLS, VECIO>(q + p.h, qy);
            if (u % LK == 0) {
                float* sf = reinterpret_cast<float*>(p.qsf) + r * nbk;  // (2H/NPC,) scales of row r
                sf[j0 / TK_NPC] = sfx;
                sf[(p.h + j0) / TK_NPC] = sfy;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) wsum += __shfl_xor_sync(0xFFFFFFFFu, wsum, o);
        if (lane == 0) red[warp] = wsum;
        __syncthreads();
        if (threadIdx.x == 0 && has_w) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < NWARPS; ++i) s += red[i];
            reinterpret_cast<float*>(p.wg)[slot] = s;
        }
        __syncthreads();  // red is reused by the next row
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, MINB) tk_swiglu_backward_and_per_token_cast(const Params p) {
    __shared__ float red[NWARPS];  // (warps,) partial weight-gradient sums
    // Zero the weight_grad slots no row owns (token_topk_to_pos == -1).
    for (u64 s = (u64)blockIdx.x * THREADS + threadIdx.x; s < p.tk; s += (u64)gridDim.x * THREADS) {
        const i32 pos = reinterpret_cast<const i32*>(p.ttp)[(s / p.k) * p.ttp_s0 + (s % p.k) * p.ttp_s1];
        if (pos == -1) reinterpret_cast<float*>(p.wg)[s] = 0.0f;
    }
    if (p.has_clamp) backward_rows<true>(p, red);
    else backward_rows<false>(p, red);
}

