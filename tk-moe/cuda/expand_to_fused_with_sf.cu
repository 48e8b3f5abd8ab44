// expand_to_fused_with_sf (spec/moe.md 4.13): expand_to_fused for quantized rows; the data row
// and the scale-factor row (4-byte elements: fp32 or packed UE8M0 words) of each token move
// together, and every untargeted row is zero in both.
//
// Defines: TK_VEC (data bytes per access, as in expand_to_fused.cu), TK_K (slots per token),
// TK_SF_COL (1: out_sf is column-major with leading dimension ld_osf = align(M, 4), whose
// storage columns M .. ld_osf are zeroed too; 0: out_sf is row-major (M, hs)).
//
// Launched after tk_expand_mark (expand_to_fused.cu) has recorded a slot of every targeted
// row. One warp per task: tasks [0, Z) zero the untargeted rows 32z .. 32z + 31 (moe.cuh
// warp_zero_untargeted, Z = ceil(R / 32), R = ld_osf for column-major scales, else M): the data
// and scale row when p < M is untargeted, the storage-only scale row when p >= M; tasks
// [Z, Z + T) copy token t = task - Z's data row (read once) and its hs scales to all its rows.
#include "tk/moe.cuh"

#ifndef TK_VEC
#error "TK_VEC must be defined"
#endif
#ifndef TK_K
#error "TK_K must be defined"
#endif
#ifndef TK_SF_COL
#error "TK_SF_COL must be defined"
#endif

// TK_SF_ROWS (column-major scales only; per architecture, 1 on sm_90a): the zero tasks
// become row-group tasks that write EVERY scale of their 32 rows, column by column: lane l finds
// the token of row p0 + l (src and the map, as row_targeted), the warp loads the 32 rows' scale
// rows (one coalesced load per row) into a shared 32 x 33 tile, then stores column j of the 32
// rows as one 128-byte store (out_sf[j, p0 .. p0 + 31] is contiguous). Before, each copy task
// stored its token's hs scales per slot with one 4-byte store per column: hs partial 32-byte
// sectors per fused row (14 per row at H = 7168, npc = 128 packed UE8M0), 8 rows sharing each
// sector at different times; now 4 full sectors per 32 rows and column. The copy tasks then
// write no scale. H200: the per-copy-task stores were 3.4 % slower on average (up to 19 %).
// On sm_100a (not measured) it stays 0: ptxas spilled 16-28 bytes at 64 registers.
#ifndef TK_SF_ROWS
#if __CUDA_ARCH__ >= 1000
#define TK_SF_ROWS 0
#else
#define TK_SF_ROWS 1
#endif
#endif

// Row-major scales (copy tasks): the warp loads a token's hs scales in rounds of SFU = 4 chunks of
// 32 (one 4-byte load per lane and chunk; all loads of a round issued before its stores), the
// first EARLY = 2 chunks before the data row so that their latency overlaps it: 2 rounds per
// token at hs = 224 (H = 7168, npc = 32, fp32 scales). Before, only the first chunk was loaded
// early and every further chunk was a dependent DRAM round after the data scatter (6 serial load
// latencies per token after the data row's 2 at hs = 224). H200 A/B (session 8, meas m3): rounds of
// 4 against 1 made the npc = 32 fp32-row rows 5.9-8.8 % faster (k=8 experts=32 ep=8 H=7168: 123.0
// -> 116.3 µs, 82.5 -> 87.2 % of the copy ceiling), the npc = 128 fp32-row rows 1-1.7 %; 2 early
// chunks against 1: +0.3 % on average (up to 1.3 %). Rounds of 8 chunks, 4 early chunks, or all
// scales held across the data scatter spilled at 64 registers (sm_90a: 44 / 8 / 148-220 bytes).
// Measured and dropped (meas m2): an L2 prefetch of the scale row before the data row (2 % slower
// than loading the first chunk early) and of the data row's second half (4-6 % slower on every row).

using namespace tkm;
typedef tk::uint_of_size<TK_VEC>::type vec_t;
constexpr int WARPS = 8;
constexpr int SFU = 4;    // scale chunks of 32 per load round (row-major scales)
constexpr int EARLY = 2;  // chunks of the first round loaded before the data row
constexpr int KG = (TK_K + 31) / 32;
constexpr bool SF_ROWS = TK_SF_COL && TK_SF_ROWS;

// Offset of scale (p, j) in out_sf's storage.
__device__ __forceinline__ u64 osf_index(u64 p, u64 j, u64 hs, u64 ld_osf) {
    return TK_SF_COL ? j * ld_osf + p : p * hs + j;
}

// out: (M, n) vectors, contiguous; x: (T, n) vectors, row stride ldx (vectors);
// out_sf: storage of the logical (M, hs) scales (see osf_index); sf: (T, hs) row stride ld_sf;
// ttp: (T, K) i32 row stride ld_ttp; src: (M,) u32 from tk_expand_mark.
extern "C" __global__ void __launch_bounds__(256, 4) tk_expand_to_fused_with_sf(
    vec_t* __restrict__ out, const vec_t* __restrict__ x, u64 ldx, u64 n, u32* __restrict__ out_sf,
    const u32* __restrict__ sf, u64 ld_sf, u64 hs, u64 ld_osf, const i32* __restrict__ ttp, u64 ld_ttp,
    const u32* __restrict__ src, u64 T, u64 M) {
    const u32 lane = threadIdx.x % 32;
#if TK_SF_COL && TK_SF_ROWS
    __shared__ u32 tiles[WARPS][32][33];  // (WARPS, 32 rows, 32 columns + 1) per warp: scales
    u32(*const tile)[33] = tiles[threadIdx.x / 32];
#endif
    const u64 zero_rows = TK_SF_COL ? ld_osf : M;
    const u64 Z = (zero_rows + 31) / 32;  // zero tasks
    for (u64 task = (u64)blockIdx.x * WARPS + threadIdx.x / 32; task < Z + T; task += (u64)gridDim.x * WARPS) {
        if (task >= Z) {
            const u64 t = task - Z;
            i64 pos[KG];  // lane j of group g: the row of slot 32g + j
#pragma unroll
            for (int g = 0; g < KG; ++g) {
                const u32 k = g * 32 + lane;
                pos[g] = k < TK_K ? legal_or_minus_one(__ldg(ttp + t * ld_ttp + k), (i64)M) : -1;
            }
            const u32* srow = sf + t * ld_sf;  // (hs,) scales of token t
            u32 first[EARLY];  // (EARLY,) scale 32 u + lane, loaded before the data row
#pragma unroll
            for (int u = 0; u < EARLY; ++u) {
                const u64 j = 32 * u + lane;
                first[u] = !SF_ROWS && j < hs ? __ldg(srow + j) : 0u;
            }
            warp_scatter_row<vec_t, 8, KG>(out, x + t * ldx, n, pos, TK_K, lane);
            if (SF_ROWS) continue;  // the row-group tasks write the scales
            for (u64 j0 = 0; j0 < hs; j0 += 32 * SFU) {  // the whole warp iterates: shuffles need every lane
                const u64 jl = j0 + lane;  // this lane's scale in chunk 0 of the round
                const u32 nv = jl < hs ? (u32)min((u64)SFU, (hs - jl + 31) / 32) : 0u;  // its chunks < hs
                u32 v[SFU];  // (SFU,) scale jl + 32 u
#pragma unroll
                for (int u = 0; u < SFU; ++u)
                    v[u] = j0 == 0 && u < EARLY ? first[u] : u < nv ? __ldg(srow + jl + 32 * u) : 0u;
                const u64 step = TK_SF_COL ? 32 * ld_osf : 32;  // storage distance of scale j and j + 32
#pragma unroll
                for (int g = 0; g < KG; ++g) {
                    const u32 kn = min(32u, TK_K - g * 32);
                    for (u32 s = 0; s < kn; ++s) {
                        const i64 p = __shfl_sync(0xffffffffu, pos[g], s);
                        if (p < 0) continue;
                        u32* o = out_sf + osf_index(p, jl, hs, ld_osf);  // scale (p, jl)
#pragma unroll
                        for (int u = 0; u < SFU; ++u)
                            if (u < nv) o[u * step] = v[u];
                    }
                }
            }
        } else if (SF_ROWS) {
#if TK_SF_COL && TK_SF_ROWS
            const u64 p0 = 32 * task, p = p0 + lane;
            u32 tok = ~0u;  // the token whose row p is (~0: untargeted, or p >= M; T*K <= i32::MAX, checked by mark_rows)
            if (p < M) {
                const u64 i = targeting_slot(src, ttp, ld_ttp, T, TK_K, M, p);
                if (i < T * TK_K) tok = (u32)(i / TK_K);
            }
            for (u32 m = __ballot_sync(0xffffffffu, p < M && tok == ~0u); m != 0; m &= m - 1)
                warp_zero_row(out + (p0 + __ffs(m) - 1) * n, n, lane);
            for (u64 j0 = 0; j0 < hs; j0 += 32) {  // the whole warp iterates: shuffles need every lane
                const u64 j = j0 + lane;
#pragma unroll 8
                for (int r = 0; r < 32; ++r) {  // row p0 + r's scales j0 .. j0 + 31, one lane each
                    const u32 tr = __shfl_sync(0xffffffffu, tok, r);
                    tile[r][lane] = tr != ~0u && j < hs ? __ldg(sf + (u64)tr * ld_sf + j) : 0u;
                }
                __syncwarp();
                const u32 jn = (u32)min((u64)32, hs - j0);
                if (p < zero_rows)
                    for (u32 c = 0; c < jn; ++c) out_sf[(j0 + c) * ld_osf + p] = tile[lane][c];
                __syncwarp();  // the tile is read before the next columns overwrite it
            }
#endif
        } else {
            warp_zero_untargeted(src, ttp, ld_ttp, T, TK_K, M, zero_rows, 32 * task, lane, [&](u64 p) {
                if (p < M) warp_zero_row(out + p * n, n, lane);
                for (u64 j = lane; j < hs; j += 32) out_sf[osf_index(p, j, hs, ld_osf)] = 0u;
            });
        }
    }
}
