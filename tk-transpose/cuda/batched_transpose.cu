// Batched transpose: out[b, j, i] = in[b, i, j], a pure bit copy of 1-, 2- or 4-byte elements.
//
// Compile-time constants (defines):
//   TK_ELEM_BYTES  1, 2 or 4
//   TK_VEC         1: register-transpose path (needs 16-byte aligned rows, X and Y multiples of
//                     V = 16 / TK_ELEM_BYTES); 0: generic shared-memory path, any sizes/strides.
//   TK_LANES_Y, TK_CHUNKS   (vector path) warp shape and chunks per thread, see below.
//
// Vector path: each thread owns TK_CHUNKS V x V chunks. It loads V input rows of 16 bytes per
// chunk, transposes each chunk in registers with byte permutes, and stores V output rows of
// 16 bytes. Every warp access covers whole 32-byte sectors (at least 64 contiguous bytes per
// row). No shared memory; TK_CHUNKS * V independent 16-byte loads in flight per thread.
#include "tk/common.cuh"

#ifndef TK_ELEM_BYTES
#error "TK_ELEM_BYTES must be defined"
#endif
#ifndef TK_VEC
#error "TK_VEC must be defined"
#endif

using tk::u32;
using tk::u64;
typedef tk::uint_of_size<TK_ELEM_BYTES>::type elem_t;

#if TK_VEC
constexpr int V = 16 / TK_ELEM_BYTES;  // elements per 16-byte vector = chunk edge

// Transposes a V x V chunk held as V rows of 4 words each: out row j = column j of `r`.
__device__ __forceinline__ void transpose_chunk(const uint4 (&r)[V], uint4 (&o)[V]) {
    const u32* rw = reinterpret_cast<const u32*>(r);  // (V rows, 4 words)
    u32* ow = reinterpret_cast<u32*>(o);              // (V rows, 4 words)
#if TK_ELEM_BYTES == 4
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) ow[j * 4 + i] = rw[i * 4 + j];
#elif TK_ELEM_BYTES == 2
    // out row j, word w = (r[2w][j], r[2w+1][j]); element j of a row is half j%2 of word j/2.
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int w = 0; w < 4; ++w)
            ow[j * 4 + w] = __byte_perm(rw[(2 * w) * 4 + j / 2], rw[(2 * w + 1) * 4 + j / 2], (j % 2) ? 0x7632 : 0x5410);
#else
    // out row j, word w = bytes (r[4w][j], r[4w+1][j], r[4w+2][j], r[4w+3][j]).
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const u32 b = j % 4;                  // byte within the source word
        const u32 sel = b | ((b + 4) << 4);   // byte b of a -> byte 0, byte b of c -> byte 1
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const u32 lo = __byte_perm(rw[(4 * w + 0) * 4 + j / 4], rw[(4 * w + 1) * 4 + j / 4], sel);
            const u32 hi = __byte_perm(rw[(4 * w + 2) * 4 + j / 4], rw[(4 * w + 3) * 4 + j / 4], sel);
            ow[j * 4 + w] = __byte_perm(lo, hi, 0x5410);
        }
    }
#endif
}

#ifndef TK_LANES_Y
#error "TK_LANES_Y (lanes of a warp along y-chunks) must be defined for the vector path"
#endif
#ifndef TK_CHUNKS
#error "TK_CHUNKS (chunks per thread along x) must be defined for the vector path"
#endif

constexpr u32 LY = TK_LANES_Y, LX = 32 / TK_LANES_Y;  // warp shape: LY lanes along y, LX along x

// out: (B, Y, X) contiguous; in: (B, X, Y) with row stride `ld` and batch stride `bs` (elements).
// Block: 1-D, 32 * warps_y * warps_x threads; the warps form a warps_y x warps_x grid and each
// thread handles TK_CHUNKS chunks along x, so one block tile is
// (TK_CHUNKS * LX * warps_x) x (LY * warps_y) chunks. A load instruction of a warp reads LX
// input rows x LY * 16 contiguous bytes, a store writes LY output rows x LX * 16 bytes.
// Grid: x -> tiles along x (consecutive blocks write adjacent pieces of the same output rows),
// y -> tiles along y, z -> batch; every dimension loops, so any size fits the grid limits.
extern "C" __global__ void __launch_bounds__(256) tk_batched_transpose(elem_t* __restrict__ out,
                                                                       const elem_t* __restrict__ in,
                                                                       u32 batches, u32 X, u32 Y,
                                                                       u64 ld, u64 bs, u32 warps_y) {
    const u32 ncx = X / V, ncy = Y / V;  // chunks along x (input rows) and y (input columns)
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const u32 warps_x = blockDim.x / 32 / warps_y;
    const u32 step_cx = LX * warps_x;                                  // x-chunks per chunk set
    const u32 tile_cy = LY * warps_y, tile_cx = TK_CHUNKS * step_cx;  // tile size in chunks
    const u32 oy = (warp % warps_y) * LY + lane % LY, ox = (warp / warps_y) * LX + lane / LY;  // chunk in tile
    for (u32 b = blockIdx.z; b < batches; b += gridDim.z) {
        const elem_t* src = in + (u64)b * bs;  // (X, Y) stride (ld, 1)
        elem_t* dst = out + (u64)b * X * Y;    // (Y, X) contiguous
        for (u32 ty = blockIdx.y; ty * tile_cy < ncy; ty += gridDim.y) {
            const u32 cy = ty * tile_cy + oy;
            for (u32 tx = blockIdx.x; tx * tile_cx < ncx; tx += gridDim.x) {
                if (cy >= ncy) continue;
                uint4 r[TK_CHUNKS][V];  // per chunk: (V input rows, V elements)
#pragma unroll
                for (int k = 0; k < TK_CHUNKS; ++k) {
                    const u32 cx = tx * tile_cx + k * step_cx + ox;
                    if (cx < ncx) {
#pragma unroll
                        for (int i = 0; i < V; ++i)
                            r[k][i] = __ldg(reinterpret_cast<const uint4*>(src + (u64)(cx * V + i) * ld + (u64)cy * V));
                    }
                }
#pragma unroll
                for (int k = 0; k < TK_CHUNKS; ++k) {
                    const u32 cx = tx * tile_cx + k * step_cx + ox;
                    if (cx < ncx) {
                        uint4 o[V];  // (V output rows, V elements): rows cy*V.., columns cx*V..
                        transpose_chunk(r[k], o);
#pragma unroll
                        for (int j = 0; j < V; ++j)
                            *reinterpret_cast<uint4*>(dst + (u64)(cy * V + j) * X + (u64)cx * V) = o[j];
                    }
                }
            }
        }
    }
}

#else  // generic path

constexpr int T = 32;  // tile edge (elements); 32 x 8 threads, each moves 4 elements per phase

// Same arguments as the vector path; any X, Y, ld, bs and only element alignment.
extern "C" __global__ void __launch_bounds__(256) tk_batched_transpose(elem_t* __restrict__ out,
                                                                       const elem_t* __restrict__ in,
                                                                       u32 batches, u32 X, u32 Y,
                                                                       u64 ld, u64 bs, u32 /*warps_y*/) {
    __shared__ elem_t tile[T][T + 1];  // (x in tile, y in tile), padded against bank conflicts
    const u32 ntx = (X + T - 1) / T, nty = (Y + T - 1) / T;
    for (u32 b = blockIdx.z; b < batches; b += gridDim.z) {
        const elem_t* src = in + (u64)b * bs;  // (X, Y) stride (ld, 1)
        elem_t* dst = out + (u64)b * X * Y;    // (Y, X) contiguous
        for (u32 tx = blockIdx.y; tx < ntx; tx += gridDim.y) {
            for (u32 ty = blockIdx.x; ty < nty; ty += gridDim.x) {
                const u32 x0 = tx * T, y0 = ty * T;
                __syncthreads();  // the previous tile's reads are done
#pragma unroll
                for (int k = 0; k < T; k += 8) {
                    const u32 x = x0 + threadIdx.y + k, y = y0 + threadIdx.x;
                    if (x < X && y < Y) tile[threadIdx.y + k][threadIdx.x] = src[(u64)x * ld + y];
                }
                __syncthreads();
#pragma unroll
                for (int k = 0; k < T; k += 8) {
                    const u32 y = y0 + threadIdx.y + k, x = x0 + threadIdx.x;
                    if (x < X && y < Y) dst[(u64)y * X + x] = tile[threadIdx.x][threadIdx.y + k];
                }
            }
        }
    }
}
#endif
