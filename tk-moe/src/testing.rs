//! Test support for the routing ops (feature `cpu`): the spec's MoE parameter grid and its
//! `topk_idx` generator (`spec/moe.md` §3.2), seeded.
//!
//! **Generator rule** ([`generate_topk_idx`]): for each of `num_send_tokens · num_ep_ranks`
//! rows, draw `K` distinct global experts uniformly out of `G = num_experts · num_ep_ranks`
//! (in draw order), replace every id `>= num_experts` (another rank's) by `-1`, and drop the
//! rows that are all `-1`. Entries are in `[-1, num_experts)`, the non-negative entries of a
//! row are distinct, the row count `T'` is random with expectation
//! `num_send_tokens · ep · (1 - C(G - E, K) / C(G, K))`, and the expected number of valid
//! entries is `num_send_tokens · K`.
//!
//! Upstream draws bf16 uniform scores and takes `torch.topk(sorted=False)` indices: a uniform
//! random `K`-subset up to bf16 ties (broken by torch's unspecified rule) in an unspecified
//! order. Ours draws the uniform `K`-subset directly, in a random order, from [`Rng`] — the same
//! distribution without the tie artefacts, and reproducible from the seed alone.

use tk_core::testing::{full_test, Rng};
use tk_core::{HostTensor, Result, TkError};

/// One entry of the spec's MoE grid (`generate_moe_params`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeParams {
    /// Tokens each EP rank sends (4001 on the grid, 0 for the zero-token case).
    pub num_send_tokens: usize,
    /// `K`.
    pub num_topk: usize,
    /// `E`: **local** experts (`global / num_ep_ranks`).
    pub num_experts: usize,
    /// EP ranks.
    pub num_ep_ranks: usize,
}

impl MoeParams {
    /// `G = num_experts · num_ep_ranks`: the global expert count.
    pub const fn global_experts(&self) -> usize {
        self.num_experts * self.num_ep_ranks
    }

    /// A short name for messages and case seeds.
    pub fn name(&self) -> String {
        format!(
            "send={} k={} experts={} ep={}",
            self.num_send_tokens, self.num_topk, self.num_experts, self.num_ep_ranks
        )
    }
}

/// The spec's `generate_moe_params(is_benchmark)` with the full grid on or off: under `full`
/// (and not for a benchmark) the zero-token case `{0, 1, 1, 1}` first; then, nesting in this
/// order, `K ∈ {2, 6, 8, 9}` (+ `{1, 7}` full), global `∈ {72, 256}` (+ `{288, 384}` full),
/// `ep ∈ {8, 64}` (+ `{1, 72, 256}` full), kept when `global % ep == 0`. Default: the 12
/// "moe12" configurations. (The extra full values apply to benchmarks too, as upstream.)
pub fn generate_moe_params_with(is_benchmark: bool, full: bool) -> Vec<MoeParams> {
    let mut out = Vec::new();
    if full && !is_benchmark {
        out.push(MoeParams {
            num_send_tokens: 0,
            num_topk: 1,
            num_experts: 1,
            num_ep_ranks: 1,
        });
    }
    let mut topks = vec![2, 6, 8, 9];
    let mut globals = vec![72, 256];
    let mut eps = vec![8, 64];
    if full {
        topks.extend([1, 7]);
        globals.extend([288, 384]);
        eps.extend([1, 72, 256]);
    }
    for &k in &topks {
        for &g in &globals {
            for &ep in &eps {
                if g % ep == 0 {
                    out.push(MoeParams {
                        num_send_tokens: 4001,
                        num_topk: k,
                        num_experts: g / ep,
                        num_ep_ranks: ep,
                    });
                }
            }
        }
    }
    out
}

/// [`generate_moe_params_with`] with `full` from `TK_FULL_TEST`.
pub fn generate_moe_params(is_benchmark: bool) -> Vec<MoeParams> {
    generate_moe_params_with(is_benchmark, full_test())
}

/// The spec's `generate_topk_idx(params)`: an `(T', K)` i64 index tensor over the local experts
/// (module docs for the rule). `num_send_tokens == 0` gives `(0, K)`.
///
/// Errors: [`TkError::Param`] naming `params` when `K` exceeds the global expert count.
pub fn generate_topk_idx(rng: &mut Rng, params: &MoeParams) -> Result<HostTensor<i64>> {
    let (k, e) = (params.num_topk, params.num_experts);
    let g = params.global_experts();
    if k > g {
        return Err(TkError::param(
            "params",
            format!("num_topk = {k} exceeds the {g} global experts"),
        ));
    }
    let rows = params.num_send_tokens * params.num_ep_ranks;
    let mut out = Vec::new();
    let mut draw = Vec::with_capacity(k);
    for _ in 0..rows {
        draw.clear();
        while draw.len() < k {
            let v = rng.below(g as u64) as i64;
            if !draw.contains(&v) {
                draw.push(v);
            }
        }
        if draw.iter().any(|&v| (v as usize) < e) {
            out.extend(draw.iter().map(|&v| if (v as usize) < e { v } else { -1 }));
        }
    }
    let t = out.len() / k.max(1);
    HostTensor::from_vec(out, &[t, k])
}

/// Uniform `[0, 1)` fp32 weights of shape `(T, K)` (the spec's `torch.rand`).
pub fn random_weights(rng: &mut Rng, num_tokens: usize, num_topk: usize) -> HostTensor<f32> {
    HostTensor::from_fn(&[num_tokens, num_topk], |_| rng.uniform())
}
