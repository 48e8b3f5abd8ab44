// Batched transpose: out[b, j, i] = in[b, i, j], a pure bit copy of 1-, 2- or 4-byte elements.
//
// Compile-time constants (defines):
//   TK_ELEM_BYTES  1, 2 or 4 (E below)
//   TK_VEC         1: staged-tile path (needs 16-byte aligned rows, X and Y multiples of
//                     V = 16 / E); 0: generic shared-memory path, any sizes and strides.
//   TK_TILE_X      (staged path) input rows per tile; TK_TILE_X * E is 32, 64 or 128 bytes.
//   TK_BANDS       (staged path) 128-byte column bands per tile (1, 2 or 4).
//   TK_LEAN        (staged path) 1: the tile's loads issued without branches (out-of-range vectors
//                     zero-filled, the hint a predicate) and no barrier before a block's first
//                     tile; 0: a branch around each load and its hint.
//   TK_PREFETCH    (staged path) 1: the L2 prefetch of the tile `ahead` blocks further (below).
//
// Staged path: a block of NT = 2 * TK_TILE_X * E threads moves one tile of TK_TILE_X input rows
// x TK_BANDS * 128 bytes through shared memory in two steps:
//   1. load: each thread copies 4 / E 16-byte vectors per band straight from global to shared
//      memory (cp.async, no registers); a warp reads 4 input rows x 128 contiguous bytes per
//      instruction (TK_LEAN: vectors outside the matrix zero-filled, read by no task);
//   2. store: each thread owns one task per band: W = 4 / E output rows x one 16-byte output
//      vector (V consecutive x). It reads V 4-byte words (one per input row, same column),
//      transposes the V x W elements with byte permutes and writes W 16-byte vectors; a warp
//      writes 32 / LX output rows x LX * 16 contiguous bytes per instruction.
// The 16-byte units of each shared row are XOR-swizzled (`swz`) so that the 16-byte writes of
// step 1 and the 4-byte reads of step 2 are both free of bank conflicts. At most 40 registers
// where threads limit residency (48 warps per SM, e.g. 6 blocks of 256 threads); more where
// shared memory limits it first (MIN_BLOCKS).
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
#ifndef TK_LEAN
#error "TK_LEAN must be defined for the staged path"
#endif
#ifndef TK_PREFETCH
#error "TK_PREFETCH must be defined for the staged path"
#endif
#ifndef TK_TILE_X
#error "TK_TILE_X (input rows per tile) must be defined for the staged path"
#endif
#ifndef TK_BANDS
#error "TK_BANDS (128-byte column bands per tile) must be defined for the staged path"
#endif

constexpr u32 E = TK_ELEM_BYTES;
constexpr u32 V = 16 / E;           // elements per 16-byte vector
constexpr u32 W = 4 / E;            // elements per 4-byte word = output rows per task
constexpr u32 TX = TK_TILE_X;       // tile rows (x)
constexpr u32 BANDS = TK_BANDS;     // 128-byte column bands per tile
constexpr u32 BY = 128 / E;         // band width (elements along y)
constexpr u32 LX = TX / V;          // output vectors per tile row = lanes of a warp along x
constexpr u32 NT = 32 * LX;         // threads per block = tasks per band (32 words x LX vectors)
constexpr u32 LOADS = 8 * TX / NT;  // 16-byte input vectors per thread and band (= 4 / E)
// Resident blocks per SM the register budget must allow: 1536 threads, or fewer where the tile
// (plus the 1 KB the driver reserves per block) fills the 228 KB of shared memory of an sm_90 /
// sm_100 SM first (e4m3 4-band tiles: 6 or 13 blocks instead of 12 or 24).
constexpr u32 TILE_BYTES = BANDS * TX * 128;
constexpr u32 MIN_BLOCKS = 1536 / NT < 233472 / (TILE_BYTES + 1024) ? 1536 / NT : 233472 / (TILE_BYTES + 1024);
static_assert(TX * E == 32 || TX * E == 64 || TX * E == 128, "tile rows must be 32, 64 or 128 bytes");
static_assert(LOADS * NT == 8 * TX, "the load step covers a band exactly");
// TK_PREFETCH 1: the L2 prefetch ahead (kernel argument `ahead`) compiled in; the host sets it
// for the launches it gives a distance (`prefetch_ahead` in src/batched_transpose.rs: large
// one-matrix bf16 launches), as the code alone slowed a small bf16 launch.
constexpr bool PREFETCH = TK_PREFETCH;

// Swizzle of the 16-byte units of shared row r: unit u is stored at u ^ swz(r). The V rows of
// an output vector (r / V) share a value; the LX output vectors of a tile get distinct multiples
// of 8 / LX, which with the 8 / LX units that one warp's 32 / LX word columns span give 8
// distinct units (x 4 words = 32 banks) for every 4-byte read of step 2. Step 1 writes the 8
// units of a row with 8 consecutive lanes: a permutation of the 8 units, also conflict-free.
__device__ __forceinline__ u32 swz(u32 r) { return (r / V) * (8 / LX); }

// Copies 16 bytes from global to shared memory without passing through registers (cp.async,
// L1 bypassed); complete for the issuing thread after `cp.async.wait_all`. With `wide`,
// `.L2::256B` has L2 fetch the whole 256-byte block around the 128 bytes a warp row reads: with
// 128-byte bands the other half is the next band, which a block launched soon after reads
// (H200: 8064 x 7168 e4m3 31.7 -> 31.1 us in the tiling sweep of branch next-tr).
__device__ __forceinline__ void copy16_async(uint4* smem, const elem_t* gmem, bool wide) {
    const u32 s = (u32)__cvta_generic_to_shared(smem);
    if (wide)
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
    else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

// The branch-free form (TK_LEAN): `n` source bytes, 16 or 0 (nothing read, the 16 bytes of
// shared memory zero-filled), and the hint chosen by a predicate instead of a branch.
__device__ __forceinline__ void copy16_async_n(uint4* smem, const elem_t* gmem, u32 n, bool wide) {
    const u32 s = (u32)__cvta_generic_to_shared(smem);
    asm volatile("{\n .reg .pred h;\n setp.ne.b32 h, %3, 0;\n"
                 " @h cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n"
                 " @!h cp.async.cg.shared.global [%0], [%1], 16, %2;\n}\n" ::"r"(s), "l"(gmem), "r"(n), "r"((u32)wide)
                 : "memory");
}

// Whether the load at `gmem` (`before` elements of its row before it, `after` from it to the
// row's end) may take the `.L2::256B` hint: whether the aligned 256-byte block around it lies
// inside the row. At a row end the other half of the block is data no block reads (a wider
// buffer's other columns or padding: at 4032 x 576 e4m3 with row stride 1152, a third more DRAM
// reads) or the previous row's end. The test applies to padded rows only: with `dense` rows (row
// stride = Y) the bytes past a row end are the next row's start, which the same tile reads, so
// every load keeps the hint. Counts clamped to 256 elements (>= 256 bytes, more than the offset
// in a block) so the byte counts fit 32 bits.
__device__ __forceinline__ bool load_hint(bool dense, const elem_t* gmem, u32 before, u32 after) {
    const u32 a = (u32)reinterpret_cast<u64>(gmem) & 255;  // offset of gmem in its 256-byte block
    if (TK_LEAN)  // both tests evaluated: a select, no branch
        return dense | ((a <= min(before, 256u) * E) & (256 - a <= min(after, 256u) * E));
    return dense || (a <= min(before, 256u) * E && 256 - a <= min(after, 256u) * E);
}

// One 16-byte global store. Spelled out because NVVM splits a plain uint4 store of values it
// can trace to shared-memory loads into four 4-byte stores (seen for 2- and 4-byte elements).
// `out` is never read by this kernel, so no memory clobber is needed.
__device__ __forceinline__ void store16(elem_t* gmem, uint4 v) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(gmem), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}

// Output row j (0 <= j < W) of a task from its V words (word i: input row i of the task, W
// elements along y): element i of the result is element j of word i.
__device__ __forceinline__ uint4 transpose_words(const u32 (&w)[V], u32 j) {
#if TK_ELEM_BYTES == 4
    return make_uint4(w[0], w[1], w[2], w[3]);
#elif TK_ELEM_BYTES == 2
    const u32 sel = j ? 0x7632 : 0x5410;  // high or low halves of (a, b)
    return make_uint4(__byte_perm(w[0], w[1], sel), __byte_perm(w[2], w[3], sel),
                      __byte_perm(w[4], w[5], sel), __byte_perm(w[6], w[7], sel));
#else
    // Word m of the result = byte j of words 4m .. 4m+3, by a 4 x 4 byte transpose in two
    // rounds: interleave bytes j & 2 and (j & 2) + 1 of (a, b) and of (c, d), then take the low
    // or high half of each (j & 1). The first round is shared by j and j ^ 1 once unrolled.
    const u32 s1 = (j & 2) ? 0x7362 : 0x5140, s2 = (j & 1) ? 0x7632 : 0x5410;
    u32 o[4];
#pragma unroll
    for (int m = 0; m < 4; ++m)
        o[m] = __byte_perm(__byte_perm(w[4 * m], w[4 * m + 1], s1), __byte_perm(w[4 * m + 2], w[4 * m + 3], s1), s2);
    return make_uint4(o[0], o[1], o[2], o[3]);
#endif
}

// out: (B, Y, X) contiguous; in: (B, X, Y) with row stride `ld` and batch stride `bs` (elements).
// Grid: x -> tiles along x, exactly ceil(X / TX) of them (consecutive blocks write adjacent
// pieces of the same output rows); y -> tiles along y and z -> batch, both looping, so any size
// fits the grid limits. `ahead`: 0, or (one matrix whose grid y covers every tile along y) the
// distance in blocks of the L2 prefetch below.
extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS) tk_batched_transpose(elem_t* __restrict__ out,
                                                                                const elem_t* __restrict__ in,
                                                                                u32 batches, u32 X, u32 Y,
                                                                                u64 ld, u64 bs, u32 ahead) {
    __shared__ uint4 tile[BANDS][TX][8];  // (band, tile row, swizzled 16-byte unit along y)
    const u32 t = threadIdx.x;
    const u32 lr = t / 8, lu = t % 8;    // step 1: first tile row and the unit of this thread
    const u32 vx = t % LX, wy = t / LX;  // step 2: output vector and word column (0..31) of the task
    const u32 su = (wy / 4) ^ (vx * (8 / LX)), sw = wy % 4;  // step 2: swizzled unit, word in it
    const u32 x0 = blockIdx.x * TX;                         // tile origin along x (< X)
    // Tiles along y; X - x0 and Y - y0 bound the offsets below, so nothing overflows for any
    // X, Y < 2^32.
    const u32 nty = Y / (BANDS * BY) + (Y % (BANDS * BY) != 0);
    bool first = true;  // no tile staged yet
    for (u32 b = blockIdx.z; b < batches; b += gridDim.z) {
        const elem_t* src = in + (u64)b * bs;  // (X, Y) stride (ld, 1)
        elem_t* dst = out + (u64)b * X * Y;    // (Y, X) contiguous
        const bool dense = ld == Y;            // rows back to back
        for (u32 ty = blockIdx.y; ty < nty; ty += gridDim.y) {
            const u32 y0 = ty * BANDS * BY;  // tile origin along y
            // The previous tile's reads of shared memory are done (lean: none before the first).
            if (!TK_LEAN || !first) __syncthreads();
            first = false;
            // This thread's first vector; the others are NT / 8 rows and whole bands further on.
            const elem_t* p = src + (u64)(x0 + lr) * ld + y0 + lu * V;
            const auto at = [&](u32 k, u32 c) { return p + k * (NT / 8) * ld + c * BY; };  // element (x0 + r, y0 + u)
#pragma unroll
            for (u32 c = 0; c < BANDS; ++c) {
#pragma unroll
                for (u32 k = 0; k < LOADS; ++k) {
                    const u32 r = lr + k * (NT / 8), u = c * BY + lu * V;  // row, element offset in the tile
                    const bool ok = r < X - x0 && u < Y - y0;
                    if (TK_LEAN) {  // g is not read unless ok
                        const elem_t* g = at(k, c);
                        copy16_async_n(&tile[c][r][lu ^ swz(r)], ok ? g : src, ok ? 16 : 0, load_hint(dense, g, y0 + u, Y - y0 - u));
                    } else if (ok) {
                        const elem_t* g = at(k, c);
                        copy16_async(&tile[c][r][lu ^ swz(r)], g, load_hint(dense, g, y0 + u, Y - y0 - u));
                    }
                }
            }
            // L2 prefetch (PREFETCH, `ahead` > 0: one matrix, grid y not looping): while its own
            // copies are in flight, the block has L2 fetch the tile of the block `ahead` blocks
            // further in launch order, thread t < TX that tile's input row t (its bands' bytes,
            // clipped at X and Y), so that block's copies find its rows in L2.
            if (PREFETCH && ahead && b == 0 && ty == blockIdx.y && t < TX) {
                const u64 gx = gridDim.x, nb = gx * gridDim.y, b2 = blockIdx.y * gx + blockIdx.x + ahead;  // block b2 of nb
                const u64 px = b2 % gx * TX + t;                  // input row of the prefetched tile
                const u32 py = (u32)(b2 / gx) * (BANDS * BY);     // its first column (b2 / gx < gridDim.y)
                if (b2 < nb && px < X && py < Y) {
                    const u32 n = min(BANDS * BY, Y - py) * E;  // bytes of the row's piece (a multiple of 16)
                    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src + px * ld + py), "r"(n)
                                 : "memory");
                }
            }
            asm volatile("cp.async.wait_all;\n" ::: "memory");  // this thread's copies have landed
            __syncthreads();                                     // and every other thread's
            // Every word a task reads was written in step 1: X and Y are multiples of V, so the V
            // rows of an in-range output vector, and the unit holding an in-range word, are in range.
            // One band's task at a time for 1-byte elements: its 16 words and 16 output words
            // already fill the register budget, and interleaving two bands' tasks spills.
#pragma unroll(E == 1 ? 1 : BANDS)
            for (u32 c = 0; c < BANDS; ++c) {
                if (vx * V < X - x0 && c * BY + wy * W < Y - y0) {
                    // First element of the task: output row y0 + c * BY + wy * W, column x0 + vx * V.
                    elem_t* q = dst + (u64)(y0 + c * BY + wy * W) * X + x0 + vx * V;
                    u32 w[V];  // (V input rows, W elements along y)
#pragma unroll
                    for (u32 i = 0; i < V; ++i) w[i] = reinterpret_cast<const u32*>(&tile[c][vx * V + i][su])[sw];
#pragma unroll
                    for (u32 j = 0; j < W; ++j) store16(q + j * (u64)X, transpose_words(w, j));
                }
            }
        }
    }
}

#else  // generic path

constexpr int T = 32;  // tile edge (elements); 32 x 8 threads, each moves 4 elements per phase

// Same arguments as the staged path; any X, Y, ld, bs and only element alignment.
extern "C" __global__ void __launch_bounds__(256) tk_batched_transpose(elem_t* __restrict__ out,
                                                                       const elem_t* __restrict__ in,
                                                                       u32 batches, u32 X, u32 Y,
                                                                       u64 ld, u64 bs, u32 /* ahead: unused */) {
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
