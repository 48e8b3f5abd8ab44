//! CPU references (also the CPU backend): the exact semantics of `spec/quant.md`, written for
//! clarity rather than speed. The GPU kernels of this crate are tested against them bit for
//! bit.
//!
//! Generic references (any block, any `K >= 1`):
//!
//! | function | spec | what |
//! |---|---|---|
//! | [`cast`](fn@cast), [`cast_sf_only`], [`cast_with_precomputed_sf`] | §2.1, §3.1, §3.3 | block-scaled cast to FP8 e4m3 / FP4 e2m1 |
//! | [`cast_back`](fn@cast_back) | §2.2, §3.8 | FP8 / FP4 → fp32 / bf16 |
//! | [`cast_to_e5m6`] | §3.2 | per-row cast to packed E5M6 |
//! | [`cast_back_from_e5m6`] | §3.9 | E5M6 → fp32 / bf16 |
//!
//! The ops, on the CPU: each op's validation (with upstream's preconditions, see the op's host
//! module) followed by the generic reference with the op's block, or, for the lossless cast,
//! its own algorithm:
//!
//! | function | op module | spec | block |
//! |---|---|---|---|
//! | [`per_token_cast`](fn@per_token_cast), [`per_token_cast_with_sf_only`], [`per_token_cast_with_precomputed_sf`] | [`crate::per_token_cast`](mod@crate::per_token_cast) | §3.1 | `(1, npc)` |
//! | [`per_token_cast_to_e5m6`] | [`crate::per_token_cast`](mod@crate::per_token_cast) | §3.2 | `(1, K)` |
//! | [`per_block_cast`](fn@per_block_cast), [`per_block_cast_with_sf_only`], [`per_block_cast_with_precomputed_sf`] | [`crate::per_block_cast`](mod@crate::per_block_cast) | §3.3 | `(bm, bk)` |
//! | [`per_block_cast_lossless`](fn@per_block_cast_lossless) | [`crate::per_block_cast_lossless`](mod@crate::per_block_cast_lossless) | §3.4 | `(ih, iw)` → `(oh, ow)` |
//! | [`per_channel_cast`](fn@per_channel_cast) | [`crate::per_channel_cast`](mod@crate::per_channel_cast) | §3.5 | `(128, 1)` |
//! | [`cast_back_op`](fn@cast_back_op), [`per_token_cast_back`] | [`crate::cast_back`](mod@crate::cast_back) | §3.8 | `x_block_size`, `(1, npc)` |
//! | [`cast_back_e5m6`], [`per_token_cast_back_e5m6`] | [`crate::cast_back`](mod@crate::cast_back) | §3.9 | `x_block_size`, `(1, npc)` |
//! | [`per_channel_cast_fused`](fn@per_channel_cast_fused) | [`crate::per_channel_cast_fused`](mod@crate::per_channel_cast_fused) | §3.6 | `(128, 1)` after gather / dequantization |
//! | [`per_channel_cast_and_transpose`](fn@per_channel_cast_and_transpose) | [`crate::per_channel_cast_and_transpose`](mod@crate::per_channel_cast_and_transpose) | §3.7 | `(npt, 1)`, data transposed |
//! | [`swiglu_forward_and_per_token_cast`](fn@swiglu_forward_and_per_token_cast) (+ `_with_expf`, [`swiglu_forward_activation`], [`swiglu_forward_downstream`]) | [`crate::swiglu_forward_and_per_token_cast`](mod@crate::swiglu_forward_and_per_token_cast) | §3.10 | `(1, npc)` of the activation |
//! | [`swiglu_backward_and_per_token_cast`](fn@swiglu_backward_and_per_token_cast) (+ `_with_expf`, [`swiglu_backward_element`]) | [`crate::swiglu_backward_and_per_token_cast`](mod@crate::swiglu_backward_and_per_token_cast) | §3.11 | `(1, npc)` of the gradient |
//! | [`swiglu_forward_and_per_channel_cast_and_transpose`](fn@swiglu_forward_and_per_channel_cast_and_transpose) (+ `_with_expf`, [`swiglu_per_channel_activation`], [`swiglu_per_channel_downstream`]) | [`crate::swiglu_forward_and_per_channel_cast_and_transpose`](mod@crate::swiglu_forward_and_per_channel_cast_and_transpose) | §3.12 | `(npt, 1)` of the bf16 activation |
//!
//! The SwiGLU references take the `expf` they use as a parameter (default [`swiglu::cpu_expf`],
//! the correctly rounded `exp`), so that everything but `expf` is bit-exact against the GPU;
//! see [`crate::swiglu`] and [`swiglu`](mod@swiglu).
//!
//! **Threads.** The large references (the generic cast, the per-token cast of the SwiGLU
//! forward, the forward activations, the fused gather) split their rows between threads
//! (`par_rows`): every row (or row block) is computed by one thread with exactly the
//! sequential arithmetic, so the result does not depend on the split. The GPU tests'
//! `TK_FULL_TEST` grids run them on billions of elements (a 4001-token SwiGLU forward case
//! spent about 160 s on one core in these references). A caller-given `expf` must therefore
//! be `Sync`.

use std::sync::OnceLock;

use float8::F8E4M3;
use tk_core::dtype::E2M1x2;
use tk_core::HostTensor;

use crate::types::{CastFormat, QuantData};

pub mod cast;
pub mod cast_back_op;
pub mod e5m6;
pub mod per_block_cast;
pub mod per_block_cast_lossless;
pub mod per_channel_cast;
pub mod per_channel_cast_and_transpose;
pub mod per_channel_cast_fused;
pub mod per_token_cast;
pub mod swiglu;
pub mod swiglu_backward_and_per_token_cast;
pub mod swiglu_forward_and_per_channel_cast_and_transpose;
pub mod swiglu_forward_and_per_token_cast;

pub use cast::{cast, cast_back, cast_sf_only, cast_with_precomputed_sf};
pub use cast_back_op::{
    cast_back_e5m6, cast_back_op, per_token_cast_back, per_token_cast_back_e5m6,
};
pub use e5m6::{cast_back_from_e5m6, cast_to_e5m6};
pub use per_block_cast::{
    per_block_cast, per_block_cast_with_precomputed_sf, per_block_cast_with_sf_only,
};
pub use per_block_cast_lossless::per_block_cast_lossless;
pub use per_channel_cast::per_channel_cast;
pub use per_channel_cast_and_transpose::per_channel_cast_and_transpose;
pub use per_channel_cast_fused::per_channel_cast_fused;
pub use per_token_cast::{
    per_token_cast, per_token_cast_to_e5m6, per_token_cast_with_precomputed_sf,
    per_token_cast_with_sf_only,
};
pub use swiglu_backward_and_per_token_cast::{
    swiglu_backward_and_per_token_cast, swiglu_backward_and_per_token_cast_with_expf,
    swiglu_backward_element, swiglu_backward_grad_with_expf, BackwardElement, SwigluBackwardGrad,
    SwigluBackwardOutput,
};
pub use swiglu_forward_and_per_channel_cast_and_transpose::{
    swiglu_forward_and_per_channel_cast_and_transpose,
    swiglu_forward_and_per_channel_cast_and_transpose_with_expf, swiglu_per_channel_activation,
    swiglu_per_channel_downstream,
};
pub use swiglu_forward_and_per_token_cast::{
    swiglu_forward_activation, swiglu_forward_and_per_token_cast,
    swiglu_forward_and_per_token_cast_with_expf, swiglu_forward_downstream, SwigluForwardOutput,
    SwigluOut,
};

/// Below this much work (elements touched) a reference stays on the calling thread: thread
/// start-up (tens of microseconds) would dominate the small cases of the unit tests.
const PAR_MIN_WORK: usize = 1 << 18;

/// The threads [`par_rows`] may use: the machine's available parallelism.
fn max_threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Splits `out` into runs of consecutive whole rows (`row_len` elements each) and calls
/// `f(first_row, run)` on each, on up to all cores (one run per thread; a single call on the
/// calling thread when the work, `rows · work_per_row` elements, is small). Returns the
/// calls' results in row order. Every row belongs to exactly one run, so a per-row
/// computation gives the same result as the sequential loop. No rows (`out` empty or
/// `row_len = 0`): no call.
pub(crate) fn par_rows<T: Send, R: Send>(
    out: &mut [T],
    row_len: usize,
    work_per_row: usize,
    f: impl Fn(usize, &mut [T]) -> R + Sync,
) -> Vec<R> {
    let rows = out.len().checked_div(row_len).unwrap_or(0);
    if rows == 0 {
        return Vec::new();
    }
    let threads = max_threads()
        .min(rows)
        .min(rows.saturating_mul(work_per_row) / PAR_MIN_WORK)
        .max(1);
    if threads == 1 {
        return vec![f(0, out)];
    }
    let per_run = rows.div_ceil(threads);
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = out
            .chunks_mut(per_run * row_len)
            .enumerate()
            .map(|(i, run)| s.spawn(move || f(i * per_run, run)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a reference thread panicked"))
            .collect()
    })
}

/// `(M, K)` data in `fmt` (e4m3 `(M, K)`, packed e2m1 `(M, K/2)`; `K` even for e2m1) whose
/// row `r` has the codes `codes(r, buf)` writes into `buf` (`K` codes, one per logical
/// column), rows computed in parallel ([`par_rows`]), and what `codes` returned for each row,
/// in row order (e.g. the row's scales, computed in the same pass).
pub(crate) fn quant_rows<R: Send>(
    fmt: CastFormat,
    (m, k): (usize, usize),
    codes: impl Fn(usize, &mut [u8]) -> R + Sync,
) -> tk_core::Result<(QuantData, Vec<R>)> {
    // Each run of rows: its rows' codes through `buf` into `out` (`w` elements per row),
    // `store` turning the `K` codes of a row into its `w` elements.
    fn rows<T, R>(
        (first, run, w, k): (usize, &mut [T], usize, usize),
        codes: &impl Fn(usize, &mut [u8]) -> R,
        store: impl Fn(&mut [T], &[u8]),
    ) -> Vec<R> {
        let mut buf = vec![0u8; k];
        run.chunks_mut(w)
            .enumerate()
            .map(|(i, out)| {
                let r = codes(first + i, &mut buf);
                store(out, &buf);
                r
            })
            .collect()
    }
    let (data, parts) = match fmt {
        CastFormat::E4M3 => {
            let mut data = vec![F8E4M3::from_bits(0); m * k];
            let parts = par_rows(&mut data, k, k, |first, run| {
                rows((first, run, k, k), &codes, |out, buf| {
                    for (o, &c) in out.iter_mut().zip(buf) {
                        *o = F8E4M3::from_bits(c);
                    }
                })
            });
            (QuantData::E4M3(HostTensor::from_vec(data, &[m, k])?), parts)
        }
        CastFormat::E2M1 => {
            assert!(
                k % 2 == 0,
                "e2m1 data needs an even K (checked by the callers)"
            );
            let w = k / 2;
            let mut data = vec![E2M1x2(0); m * w];
            let parts = par_rows(&mut data, w, k, |first, run| {
                rows((first, run, w, k), &codes, |out, buf| {
                    for (o, p) in out.iter_mut().zip(buf.chunks_exact(2)) {
                        *o = E2M1x2(tk_core::convert::pack_e2m1(p[0], p[1]));
                    }
                })
            });
            (QuantData::E2M1(HostTensor::from_vec(data, &[m, w])?), parts)
        }
    };
    Ok((data, parts.into_iter().flatten().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale::ScaleOptions;
    use crate::types::CastInput;

    /// The threaded path (a matrix above [`PAR_MIN_WORK`]) gives the bits of the inline one
    /// (the same matrix cast in 128-row slabs, each below it), specials included.
    #[test]
    fn threaded_cast_equals_slabs() {
        let (m, k) = (512, 1024);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let special = [f32::NAN, f32::INFINITY, -0.0, 1e-40, -1e30, 0.0];
        let v: Vec<f32> = (0..m * k)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                if i % 1009 == 0 {
                    special[(state % 6) as usize]
                } else {
                    (state >> 40) as f32 / (1u64 << 20) as f32 - 8.0
                }
            })
            .collect();
        let x = HostTensor::from_vec(v.clone(), &[m, k]).unwrap();
        for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
            for block in [(1, 128), (128, 1), (128, 32)] {
                let opts = ScaleOptions::row_major(false);
                let (d, s) = cast(&CastInput::from(x.view()), fmt, block, opts).unwrap();
                let (mut bytes, mut sf) = (Vec::new(), Vec::new());
                for slab in v.chunks(128 * k) {
                    let t = HostTensor::from_vec(slab.to_vec(), &[128, k]).unwrap();
                    let (d, s) = cast(&CastInput::from(t.view()), fmt, block, opts).unwrap();
                    bytes.extend(d.bytes());
                    sf.extend(s.storage_bytes());
                }
                assert_eq!(d.bytes(), bytes, "{fmt:?} {block:?}: data");
                assert_eq!(s.storage_bytes(), sf, "{fmt:?} {block:?}: scales");
            }
        }
    }
}
