//! Test support for the gating ops (feature `cpu`): the spec's tolerances (§4.5 test), an ulp
//! distance, and the input generator of upstream's `top2_sum_gate` test (`construct_input`),
//! which draws logits whose rankings have gaps, so that the last-bit differences between the
//! GPU's and the CPU's `expf` cannot change an index.
//!
//! **Generator rule** ([`gated_inputs`]): `bias = randn(E)` once; every row `logits[t] =
//! randn(E)`, redrawn (that row only) until
//! * with grouping active: the `Gk`-th and `(Gk+1)`-th largest group top-2 sums differ by more
//!   than [`GROUP_GAP`] (`1e-6`);
//! * the `K + 1` best candidate keys (after the group restriction) have consecutive gaps larger
//!   than [`EXPERT_GAP`] (`2e-6`).
//!
//! Both use the keys the op ranks by (`s + bias`, or `logit + bias` for softmax). Two
//! deviations from upstream's test, both stricter or more pertinent: the gap between the `K`-th
//! and `(K+1)`-th key is checked too (upstream checks only the gaps inside the top `K`, so a
//! near-tie at the selection boundary can flip the selected set), and softmax's expert gaps are
//! checked on `logit + bias`, which the op ranks by (upstream checks `probability + bias`, which
//! guards nothing). Upstream redraws the whole tensor; redrawing one row is equivalent in
//! distribution and faster.

use tk_core::testing::Rng;
use tk_core::{HostTensor, Result, TkError};

use crate::ranking::{cmp_keys, stable_topk_indices};
use crate::reference::topk_group_score;
use crate::scoring::ScoringFunc;
use crate::top2_sum_gate::Top2SumGateParams;

/// `torch.allclose`'s default relative tolerance, the spec's check of `topk_weights`.
pub const WEIGHT_RTOL: f32 = 1e-5;
/// `torch.allclose`'s default absolute tolerance.
pub const WEIGHT_ATOL: f32 = 1e-8;
/// Minimum gap between the `Gk`-th and `(Gk+1)`-th group score of a generated row.
pub const GROUP_GAP: f32 = 1e-6;
/// Minimum gap between consecutive keys among the `K + 1` best of a generated row.
pub const EXPERT_GAP: f32 = 2e-6;

/// `torch.allclose(actual, expected)` for one pair: `|a - e| <= atol + rtol·|e|`, computed in
/// f64; NaN is never close (equal values, infinities included, are).
pub fn allclose(actual: f32, expected: f32) -> bool {
    if actual == expected {
        return true;
    }
    let (a, e) = (actual as f64, expected as f64);
    (a - e).abs() <= WEIGHT_ATOL as f64 + WEIGHT_RTOL as f64 * e.abs()
}

/// The number of fp32 values between `a` and `b` (0 when equal, `+0.0` and `-0.0` are 1 apart;
/// `u64::MAX` when either is NaN).
pub fn ulp_distance(a: f32, b: f32) -> u64 {
    if a.is_nan() || b.is_nan() {
        return u64::MAX;
    }
    // Map the bit patterns onto a monotonic integer line (-0.0 just below +0.0).
    let line = |x: f32| {
        let bits = x.to_bits() as i64;
        if bits & 0x8000_0000 != 0 {
            -(bits & 0x7fff_ffff) - 1
        } else {
            bits
        }
    };
    line(a).abs_diff(line(b))
}

/// The ranking keys of one row: `s_j + bias_j`, or `logit_j + bias_j` for softmax.
pub fn ranking_keys(logits: &[f32], bias: &[f32], scoring_func: ScoringFunc) -> Vec<f32> {
    let mut s = vec![0f32; logits.len()];
    scoring_func.score_row(logits, &mut s);
    let base: &[f32] = if scoring_func == ScoringFunc::Softmax {
        logits
    } else {
        &s
    };
    base.iter().zip(bias).map(|(&b, &x)| b + x).collect()
}

/// True when a row's keys satisfy the generator rule (module docs) for `params`
/// (`num_groups` must divide the key count when grouping is active).
pub fn has_ranking_gaps(keys: &[f32], params: &Top2SumGateParams) -> bool {
    let e = keys.len();
    let candidates: Vec<usize> = if params.grouping_active() && params.num_groups > 0 {
        let (g, gk) = (params.num_groups, params.num_topk_groups);
        let size = e / g;
        let scores: Vec<f32> = keys.chunks(size).map(|c| topk_group_score(c, 2)).collect();
        let order = stable_topk_indices(&scores, g);
        if gk < g && !gap_ok(scores[order[gk - 1]], scores[order[gk]], GROUP_GAP) {
            return false;
        }
        order[..gk]
            .iter()
            .flat_map(|&q| q * size..(q + 1) * size)
            .collect()
    } else {
        (0..e).collect()
    };
    let mut vals: Vec<f32> = candidates.iter().map(|&j| keys[j]).collect();
    vals.sort_by(|a, b| cmp_keys(*b, *a));
    let n = (params.num_topk + 1).min(vals.len());
    vals[..n].windows(2).all(|w| gap_ok(w[0], w[1], EXPERT_GAP))
}

fn gap_ok(hi: f32, lo: f32, gap: f32) -> bool {
    (hi as f64 - lo as f64) > gap as f64
}

/// `(logits (T, E), bias (E,))` for `top2_sum_gate` tests, every row satisfying the generator
/// rule for `params` (module docs). Errors ([`TkError::Param`] naming `params`) if a row needs
/// more than `max_draws` draws (an impossible configuration, e.g. `E` too small for the gaps).
pub fn gated_inputs(
    rng: &mut Rng,
    num_tokens: usize,
    num_experts: usize,
    params: &Top2SumGateParams,
    max_draws: usize,
) -> Result<(HostTensor<f32>, HostTensor<f32>)> {
    let bias: Vec<f32> = (0..num_experts).map(|_| rng.normal()).collect();
    let mut logits = Vec::with_capacity(num_tokens * num_experts);
    'rows: for t in 0..num_tokens {
        for _ in 0..max_draws {
            let row: Vec<f32> = (0..num_experts).map(|_| rng.normal()).collect();
            if has_ranking_gaps(&ranking_keys(&row, &bias, params.scoring_func), params) {
                logits.extend(row);
                continue 'rows;
            }
        }
        return Err(TkError::param(
            "params",
            format!("row {t}: no draw out of {max_draws} has the ranking gaps"),
        ));
    }
    Ok((
        HostTensor::from_vec(logits, &[num_tokens, num_experts])?,
        HostTensor::from_vec(bias, &[num_experts])?,
    ))
}
