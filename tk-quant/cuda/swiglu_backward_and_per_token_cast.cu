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
//
// One CTA of THREADS threads per row (grid-stride); thread t owns the 8-column fragments
// f = c * THREADS + t of chunk c, so a group of NPC columns is NPC/8 adjacent lanes. The loads of
// chunk c + 1 are issued before chunk c is processed (two chunks in flight); the divisions run
// inline when the fragment's gates allow (tkq::div8_by, TK_FASTDIV).
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

constexpr int THREADS = 128, NWARPS = THREADS / 32;
constexpr int LK = TK_NPC / 8;  // lanes per group
constexpr bool VECIO = TK_VECIO != 0;
static_assert(TK_NPC == 32 || TK_NPC == 128, "NPC must be 32 or 128");

// The raw loads of one 8-column fragment f of a row (zeros beyond the row's fragments): gate
// and value e4m3 codes, their dequantization scales, and the bf16 gradient.
struct Raw {
    u32 x[2], y[2], g[4];
    float sx, sy;
};

__device__ __forceinline__ Raw load_raw(const Params& p, const u8* xrow, const float* srow, const u8* grow, u64 f, u64 frags) {
    Raw r{{0, 0}, {0, 0}, {0, 0, 0, 0}, 0.0f, 0.0f};
    if (f < frags) {
        const u64 j0 = f * 8;
        tkq::load_bytes<8, VECIO>(xrow + j0, r.x);         // (8,) e4m3 of X
        tkq::load_bytes<8, VECIO>(xrow + p.h + j0, r.y);   // (8,) e4m3 of Y
        tkq::load_bytes<16, VECIO>(grow + j0 * 2, r.g);    // (8,) bf16 of grad_out
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

extern "C" __global__ void __launch_bounds__(THREADS) tk_swiglu_backward_and_per_token_cast(const Params p) {
    __shared__ float red[NWARPS];  // (warps,) partial weight-gradient sums
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    // Zero the weight_grad slots no row owns (token_topk_to_pos == -1).
    for (u64 s = (u64)blockIdx.x * THREADS + threadIdx.x; s < p.tk; s += (u64)gridDim.x * THREADS) {
        const i32 pos = reinterpret_cast<const i32*>(p.ttp)[(s / p.k) * p.ttp_s0 + (s % p.k) * p.ttp_s1];
        if (pos == -1) reinterpret_cast<float*>(p.wg)[s] = 0.0f;
    }
    const u64 frags = p.h / 8, nbk = 2 * p.h / TK_NPC;
    for (u64 r = blockIdx.x; r < p.n; r += gridDim.x) {
        const i32 slot = reinterpret_cast<const i32*>(p.ptt)[r * p.ptt_s];
        const bool has_w = slot >= 0 && (u64)slot < p.tk;
        const u64 sl = has_w ? (u64)slot : 0;
        const float w = has_w ? reinterpret_cast<const float*>(p.w)[(sl / p.k) * p.w_s0 + (sl % p.k) * p.w_s1] : 0.0f;
        const u8* xrow = reinterpret_cast<const u8*>(p.x) + r * p.ldx;                 // (2H,) e4m3
        const float* srow = reinterpret_cast<const float*>(p.xs) + r * p.xs_ld;         // (2H/NPC,) fp32
        const u8* grow = reinterpret_cast<const u8*>(p.g) + r * p.ldg * 2;              // (H,) bf16
        float wsum = 0.0f;
        Raw cur = load_raw(p, xrow, srow, grow, threadIdx.x, frags);
        for (u64 c0 = 0; c0 < frags; c0 += THREADS) {
            // The next chunk's loads are issued before this chunk is processed.
            const Raw nxt = load_raw(p, xrow, srow, grow, c0 + THREADS + threadIdx.x, frags);
            const u64 f = c0 + threadIdx.x;  // this lane's fragment (groups never straddle chunks)
            const bool ok = f < frags;
            const u64 j0 = f * 8;            // first column of the fragment
            float X[8], Y[8], G[8];
            tkq::widen8<2>(cur.x, X);
            tkq::widen8<2>(cur.y, Y);
            tkq::widen8<1>(cur.g, G);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                X[e] = __fmul_rn(X[e], cur.sx);
                Y[e] = __fmul_rn(Y[e], cur.sy);
            }
            cur = nxt;
            float xv[8], yv[8], t[8], s[8], xt[8];  // (8,) clamped inputs, fl(1 + expf(-X)), 1/t, X/t
            tkq::ClampFlags fl[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                xv[e] = X[e];
                yv[e] = Y[e];
                fl[e] = tkq::ClampFlags{false, false, false};
                if (p.has_clamp) fl[e] = tkq::swiglu_clamp<true>(xv[e], yv[e], p.clamp);
                t[e] = __fadd_rn(1.0f, expf(-xv[e]));
            }
            tkq::div8_by(xv, t, s, xt);
            float o[8], dx[8], dy[8];  // (8,) out before bf16, gradients
            float ax = 0.0f, ay = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
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
            tkq::scale_pair_fast<TK_ROUND != 0>(ax, __uint_as_float(0x38D1B717u), 448.0f, sfx, invx);
            tkq::scale_pair_fast<TK_ROUND != 0>(ay, __uint_as_float(0x38D1B717u), 448.0f, sfy, invy);
            if (!ok) continue;
            u8* out = reinterpret_cast<u8*>(p.out) + (r * p.h + j0) * 2;    // (8,) bf16 of out
            u8* xg = reinterpret_cast<u8*>(p.xg) + (r * 2 * p.h + j0) * 2;  // (8,) bf16 of x_grad (dX half)
            u8* q = reinterpret_cast<u8*>(p.q) + r * 2 * p.h + j0;          // (8,) e4m3 of x_grad_fp8 (dX half)
            tkq::store8_plain<1, VECIO>(out, o);
            tkq::store8_plain<1, VECIO>(xg, dx);
            tkq::store8_plain<1, VECIO>(xg + p.h * 2, dy);
            tkq::store8_quant<0, VECIO>(q, dx, invx);
            tkq::store8_quant<0, VECIO>(q + p.h, dy, invy);
            if (f % LK == 0) {
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
