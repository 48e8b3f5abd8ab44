//! `normalize_weight` (`spec/moe.md` §4.10, §5.5): divide each token's top-k weights by their
//! sum.
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `topk_weights` | `(T, K)` | fp32 | unit last stride, any row stride; `K = 0` allowed |
//! | output `denominator` | `(T,)` | fp32 | contiguous |
//! | output `normalized_weights` | `(T, K)` | fp32 | contiguous |
//!
//! **Semantics (bit-exact).** `den_t = ((fp32(1e-20) + w[t,0]) + w[t,1]) + … + w[t,K-1]`:
//! sequential fp32 additions in slot order starting from `fp32(1e-20)` ([`DENOMINATOR_EPS`],
//! the convention of `top2_sum_gate`), then `normalized[t,k] = w[t,k] / den_t`, one correctly
//! rounded fp32 division. Weights are not checked (negative, infinite or NaN weights propagate
//! by IEEE rules). Identical to upstream's kernel and reference.

use tk_core::{Layout, Result};

use crate::checks::check_matrix;

/// `1e-20` as fp32: the first term of every denominator.
pub const DENOMINATOR_EPS: f32 = 1e-20;

/// The parameters of `normalize_weight` (there are none besides the tensor).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NormalizeWeightParams;

impl NormalizeWeightParams {
    /// Validates `topk_weights` (rank 2 `(T, K)`, unit last stride) and returns `(T, K)`.
    ///
    /// Errors: [`tk_core::TkError::Shape`] / [`tk_core::TkError::Stride`] naming `topk_weights`.
    pub fn validate(&self, topk_weights: &Layout) -> Result<(usize, usize)> {
        check_matrix("topk_weights", topk_weights, "rank 2 (T, K)")
    }
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU op (feature `cuda`). **Kernel** (`cuda/normalize_weight.cu`): `K` a compile-time
/// constant; one thread per token, or, when the rows are 16-byte aligned and `K` is a multiple
/// of `4·TOKEN_LANES`, `TOKEN_LANES` adjacent lanes per token (each reads and writes its share
/// of the row as 16-byte vectors; the denominator passes from lane to lane by shuffles, in slot
/// order). `__fadd_rn` in slot order and `__fdiv_rn`, so the bits equal the CPU reference's.
/// No host sync; nothing is launched for `T == 0`.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu {
    use cudarc::driver::PushKernelArg;
    use tk_core::error::DriverContext;
    use tk_core::{DeviceTensor, DeviceView, DeviceViewMut, KernelSource, KernelSpec, Result};

    use super::NormalizeWeightParams;
    use crate::gpu::{
        access_bytes, blocks, check_device, check_out, config, row_stride, HEADERS, ROW_THREADS,
    };

    /// Knob (A/B): lanes per token of the 16-byte row path (a power of two <= 32; 1 = one
    /// thread per token, the previous kernel). Adjacent lanes read adjacent 16-byte vectors, so
    /// a warp's accesses are whole rows, and `T·TOKEN_LANES` threads spread the tokens over
    /// more CTAs (339 instead of 170 of 128 threads at T = 21671 on 132 SMs).
    const TOKEN_LANES: usize = 2;

    /// Lanes per token of the kernel for `k` slots (`vec`: 16-byte aligned rows).
    fn lanes(k: usize, vec: bool) -> usize {
        if vec && k > 0 && k % (4 * TOKEN_LANES) == 0 {
            TOKEN_LANES
        } else {
            1
        }
    }

    static SOURCE: KernelSource = KernelSource {
        file: "normalize_weight.cu",
        entry: "tk_normalize_weight",
        code: include_str!("../cuda/normalize_weight.cu"),
        headers: HEADERS,
        needs_cuda_headers: false,
    };

    /// The kernel for `num_topk` slots; `vec`: the rows of the input and output are 16-byte
    /// aligned (the 16-byte path, with lanes per token where `num_topk` allows).
    pub fn kernel_spec(num_topk: usize, vec: bool) -> KernelSpec {
        KernelSpec::new(&SOURCE)
            .define("TK_K", num_topk)
            .define("TK_LANES", lanes(num_topk, vec))
    }

    /// Representative specialisations (the spec's top-k values, aligned rows; `K = 8` also
    /// unaligned), for compile checks and [`crate::prewarm`].
    pub fn registered_kernels() -> Vec<KernelSpec> {
        let mut v: Vec<_> = [2, 6, 8, 9].map(|k| kernel_spec(k, true)).to_vec();
        v.push(kernel_spec(8, false));
        v
    }

    /// GPU `normalize_weight(topk_weights (T, K) fp32) -> (denominator (T,), normalized (T, K))`
    /// into new tensors (see the [module docs](mod@crate::normalize_weight)).
    ///
    /// Errors: those of [`NormalizeWeightParams::validate`].
    pub fn normalize_weight(
        topk_weights: &DeviceView<'_, f32>,
    ) -> Result<(DeviceTensor<f32>, DeviceTensor<f32>)> {
        let (t, k) = NormalizeWeightParams.validate(topk_weights.layout())?;
        let dev = topk_weights.device();
        let (mut den, mut out) = (dev.alloc::<f32>(&[t])?, dev.alloc::<f32>(&[t, k])?);
        normalize_weight_into(topk_weights, &mut den.view_mut(), &mut out.view_mut())?;
        Ok((den, out))
    }

    /// [`normalize_weight`] into caller-provided contiguous `denominator (T,)` and
    /// `normalized (T, K)`. With `K == 0` every denominator is `1e-20` (the kernel still runs).
    ///
    /// Errors: as [`normalize_weight`], and [`tk_core::TkError::Shape`] /
    /// [`tk_core::TkError::Stride`] / [`tk_core::TkError::Placement`] naming an output.
    pub fn normalize_weight_into(
        topk_weights: &DeviceView<'_, f32>,
        denominator: &mut DeviceViewMut<'_, f32>,
        normalized: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let (t, k) = NormalizeWeightParams.validate(topk_weights.layout())?;
        let dev = topk_weights.device();
        check_device("denominator", dev, denominator.device())?;
        check_device("normalized", dev, normalized.device())?;
        check_out("denominator", denominator.layout(), &[t])?;
        check_out("normalized", normalized.layout(), &[t, k])?;
        if t == 0 {
            return Ok(());
        }
        let (den, out) = (denominator.address(), normalized.address());
        let (w, ld, t64) = (
            topk_weights.address(),
            row_stride(topk_weights.layout()),
            t as u64,
        );
        // 16-byte row accesses when every row of w and of out starts on a 16-byte boundary.
        let aligned = k % 4 == 0 && access_bytes(&[w, ld * 4, out]) == 16;
        let f = dev.function(&kernel_spec(k, aligned))?;
        let vec = aligned as u32;
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&den).arg(&out).arg(&w).arg(&ld).arg(&t64).arg(&vec);
        let threads = t * lanes(k, aligned);
        // SAFETY: token t < T is read (w[t, 0..K], the validated view; 16-byte vectors only
        // when `vec` says every row is aligned and K % 4 == 0, which the lanes-per-token
        // kernel also requires) and written (den[t], out[t, 0..K]: checked contiguous outputs)
        // by its thread or its group of lanes; the buffers outlive the launch.
        unsafe { l.launch(config(blocks(threads, ROW_THREADS as usize), ROW_THREADS)) }
            .ctx("launching tk_normalize_weight")?;
        Ok(())
    }

    /// A CPU model of the lanes-per-token kernel's index math (`normalize_lanes`): every
    /// 16-byte vector of every token is read and written by exactly one lane, the lanes of a
    /// token lie in one warp and hold its vectors in slot order by lane, one lane stores the
    /// denominator, and a warp's iterations are uniform (it never leaves a lane behind).
    #[cfg(test)]
    mod tests {
        use super::{lanes, ROW_THREADS};

        #[test]
        fn lanes_per_token_cover_every_vector_once() {
            for (k, l) in [(8, 2), (16, 2), (40, 2), (16, 4), (32, 8)] {
                let kv = k / 4;
                let kvl = kv / l;
                for (t, grid) in [(1, 1), (37, 1), (1001, 3), (1000, 16), (4096, 64)] {
                    let block = ROW_THREADS as usize;
                    let stride = grid * block;
                    let mut seen = vec![0u32; t * kv];
                    let mut den = vec![0u32; t];
                    for b in 0..grid {
                        for warp in 0..block / 32 {
                            let mut g0 = b * block + warp * 32;
                            while g0 < t * l {
                                for lane in 0..32 {
                                    let (h, first) = (lane % l, lane - lane % l);
                                    let tok = (g0 + lane) / l;
                                    assert_eq!(
                                        (g0 + first) / l,
                                        tok,
                                        "a token's lanes share a warp"
                                    );
                                    if tok >= t {
                                        continue;
                                    }
                                    if h == 0 {
                                        den[tok] += 1;
                                    }
                                    for j in 0..kvl {
                                        seen[tok * kv + h * kvl + j] += 1;
                                    }
                                }
                                g0 += stride;
                            }
                        }
                    }
                    assert!(
                        seen.iter().all(|&c| c == 1),
                        "K={k} L={l} T={t} grid={grid}"
                    );
                    assert!(den.iter().all(|&c| c == 1), "K={k} L={l} T={t} grid={grid}");
                }
            }
            assert_eq!(lanes(8, false), 1);
            assert_eq!(lanes(6, true), 1);
            assert_eq!(lanes(0, true), 1);
        }
    }
}
