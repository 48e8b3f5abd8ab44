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

using namespace tkm;
typedef tk::uint_of_size<TK_VEC>::type vec_t;
constexpr int WARPS = 8;
constexpr int KG = (TK_K + 31) / 32;

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
            // The first 32 scales are loaded before the data row, so their latency overlaps it.
            const u32 first = lane < hs ? __ldg(srow + lane) : 0u;
            warp_scatter_row<vec_t, 8, KG>(out, x + t * ldx, n, pos, TK_K, lane);
            for (u64 j0 = 0; j0 < hs; j0 += 32) {  // the whole warp iterates: shuffles need every lane
                const u64 j = j0 + lane;
                const u32 v = j0 == 0 ? first : j < hs ? __ldg(srow + j) : 0u;
#pragma unroll
                for (int g = 0; g < KG; ++g) {
                    const u32 kn = min(32u, TK_K - g * 32);
                    for (u32 s = 0; s < kn; ++s) {
                        const i64 p = __shfl_sync(0xffffffffu, pos[g], s);
                        if (p >= 0 && j < hs) out_sf[osf_index(p, j, hs, ld_osf)] = v;
                    }
                }
            }
        } else {
            warp_zero_untargeted(src, ttp, ld_ttp, T, TK_K, M, zero_rows, 32 * task, lane, [&](u64 p) {
                if (p < M) warp_zero_row(out + p * n, n, lane);
                for (u64 j = lane; j < hs; j += 32) out_sf[osf_index(p, j, hs, ld_osf)] = 0u;
            });
        }
    }
}
