// Test kernel: the fast scale pairs of tk/quant_scale.cuh against the division forms they
// replace, bit for bit, over a range of fp32 bit patterns (tk_quant::testing).
#include "tk/quant_scale.cuh"

using tk::u32;

// c = every fp32 with bits lo .. hi (inclusive; hi - lo + the grid's threads < 2^32, so the
// strided index cannot wrap); out[0]: how many c give a different (sf, inv) from
// scale_pair_e4m3_fast than from scale_pair<false>(c, 1e-4, 448); out[1]: the bits of the
// smallest such c (0xFFFFFFFF: none); out[2]: how many c were compared.
extern "C" __global__ void tk_scale_check(u32 lo, u32 hi, u32* __restrict__ out) {
    const u32 n = hi - lo + 1;
    u32 seen = 0;  // c compared by this thread
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x, ++seen) {
        const float c = __uint_as_float(lo + i);
        float sf, inv, sf2, inv2;
        tkq::scale_pair<false>(c, __uint_as_float(0x38D1B717u), 448.0f, sf, inv);
        tkq::scale_pair_e4m3_fast(c, sf2, inv2);
        if (__float_as_uint(sf) != __float_as_uint(sf2) || __float_as_uint(inv) != __float_as_uint(inv2)) {
            atomicAdd(&out[0], 1u);
            atomicMin(&out[1], lo + i);
        }
    }
    atomicAdd(&out[2], seen);
}
