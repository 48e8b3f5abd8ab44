//! `top2_sum_gate` (§4.5).

use tk_core::{HostTensor, HostView, Result, TkError};

use super::run;
use super::topk_group::group_score;
use crate::ranking::{select_best, stable_topk_indices};
use crate::scoring::ScoringFunc;
use crate::top2_sum_gate::{
    mask_ep_tp, replica_column, Top2SumGateLayouts, Top2SumGateParams, Top2SumGateShape,
    WEIGHT_DENOMINATOR_EPS,
};

/// The logical → physical expert map: `to_physical_map (E + S, D)` i32 and `logical_count
/// (E + S,)` i32, given together.
#[derive(Debug, Clone)]
pub struct PhysicalMap<'a> {
    /// Replica `c` of logical expert `l` is physical expert `to_physical_map[l, c]`.
    pub to_physical_map: HostView<'a, i32>,
    /// Logical expert `l` has `logical_count[l]` valid replicas (columns `0..count`).
    pub logical_count: HostView<'a, i32>,
}

/// The tensor arguments of the CPU [`top2_sum_gate`] (shapes and rules in
/// [`crate::top2_sum_gate`](mod@crate::top2_sum_gate)). Booleans are bytes: `0` = false, anything else = true.
#[derive(Debug, Clone)]
pub struct Top2SumGateInputs<'a> {
    /// `logits (T, E)` fp32.
    pub logits: HostView<'a, f32>,
    /// `bias (E,)` fp32.
    pub bias: HostView<'a, f32>,
    /// `mask (T,)`: `0` = padding token.
    pub mask: Option<HostView<'a, u8>>,
    /// `fix_routing_mask (T,)`: non-zero = use `unmapped_topk_idx[t, :]` as the routed experts.
    pub fix_routing_mask: Option<HostView<'a, u8>>,
    /// The logical → physical map.
    pub physical_map: Option<PhysicalMap<'a>>,
    /// `unmapped_topk_idx (T, K)` i64, the input side of upstream's in/out tensor: read for
    /// fix-routing tokens. When it is given, the output's
    /// [`Top2SumGateOutput::unmapped_topk_idx`] holds what upstream writes back into it.
    pub unmapped_topk_idx: Option<HostView<'a, i64>>,
}

impl<'a> Top2SumGateInputs<'a> {
    /// Just `logits` and `bias`.
    pub fn new(logits: HostView<'a, f32>, bias: HostView<'a, f32>) -> Self {
        Self {
            logits,
            bias,
            mask: None,
            fix_routing_mask: None,
            physical_map: None,
            unmapped_topk_idx: None,
        }
    }

    /// Adds the token mask.
    pub fn with_mask(mut self, mask: HostView<'a, u8>) -> Self {
        self.mask = Some(mask);
        self
    }

    /// Adds fix routing: the mask and the experts of the fix-routing tokens.
    pub fn with_fix_routing(
        mut self,
        fix_routing_mask: HostView<'a, u8>,
        unmapped_topk_idx: HostView<'a, i64>,
    ) -> Self {
        self.fix_routing_mask = Some(fix_routing_mask);
        self.unmapped_topk_idx = Some(unmapped_topk_idx);
        self
    }

    /// Adds `unmapped_topk_idx` (so that the output reports the logical routed ids).
    pub fn with_unmapped_topk_idx(mut self, unmapped_topk_idx: HostView<'a, i64>) -> Self {
        self.unmapped_topk_idx = Some(unmapped_topk_idx);
        self
    }

    /// Adds the logical → physical map.
    pub fn with_physical_map(
        mut self,
        to_physical_map: HostView<'a, i32>,
        logical_count: HostView<'a, i32>,
    ) -> Self {
        self.physical_map = Some(PhysicalMap {
            to_physical_map,
            logical_count,
        });
        self
    }

    /// The layouts, for [`Top2SumGateParams::validate`].
    pub fn layouts(&self) -> Top2SumGateLayouts<'_> {
        Top2SumGateLayouts {
            logits: self.logits.layout(),
            bias: self.bias.layout(),
            mask: self.mask.as_ref().map(|m| m.layout()),
            fix_routing_mask: self.fix_routing_mask.as_ref().map(|m| m.layout()),
            physical_map: self
                .physical_map
                .as_ref()
                .map(|p| (p.to_physical_map.layout(), p.logical_count.layout())),
            unmapped_topk_idx: self.unmapped_topk_idx.as_ref().map(|u| u.layout()),
        }
    }
}

/// The results of [`top2_sum_gate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Top2SumGateOutput {
    /// `(T, K + S)` i64: physical, EP/TP-masked expert ids (`-1` = not on this TP rank, or a
    /// masked token).
    pub topk_idx: HostTensor<i64>,
    /// `(T, K + S)` fp32: routed weights, then `1.0` for shared slots (`0.0` for masked tokens).
    pub topk_weights: HostTensor<f32>,
    /// `(T, K)` i64, present when `unmapped_topk_idx` was given: the logical routed ids (`-1`
    /// for masked tokens) — upstream's in-place write-back.
    pub unmapped_topk_idx: Option<HostTensor<i64>>,
}

/// CPU `top2_sum_gate` (§4.5). See [`crate::top2_sum_gate`](mod@crate::top2_sum_gate) for the arguments, semantics, tie
/// rule, NaN / inf behaviour and limits.
///
/// Errors: those of [`Top2SumGateParams::validate`], then the data rules (each a
/// [`TkError::Param`] naming `logits`, `bias`, `logical_count`, `to_physical_map` or
/// `unmapped_topk_idx`, with the offending position), all checked before anything is computed.
pub fn top2_sum_gate(
    inputs: &Top2SumGateInputs<'_>,
    params: &Top2SumGateParams,
) -> Result<Top2SumGateOutput> {
    let shape = params.validate(&inputs.layouts())?;
    check_data(inputs, &shape)?;

    let (t_count, e, k, p) = (
        shape.num_tokens,
        shape.num_experts,
        shape.num_topk,
        shape.width(),
    );
    let mut topk_idx = vec![0i64; t_count * p];
    let mut topk_weights = vec![0f32; t_count * p];
    let mut unmapped = inputs
        .unmapped_topk_idx
        .as_ref()
        .map(|_| vec![0i64; t_count * k]);

    let mut scores = vec![0f32; e];
    let mut keys = vec![0f32; e];
    for t in 0..t_count {
        let (idx_row, w_row) = (
            &mut topk_idx[t * p..(t + 1) * p],
            &mut topk_weights[t * p..(t + 1) * p],
        );
        if !routed(inputs, t) {
            idx_row.fill(-1);
            w_row.fill(0.0);
            if let Some(u) = unmapped.as_mut() {
                u[t * k..(t + 1) * k].fill(-1);
            }
            continue;
        }

        // Scores and ranking keys.
        let logits = run(&inputs.logits, &[t, 0], e);
        params.scoring_func.score_row(logits, &mut scores);
        for j in 0..e {
            let base = if params.scoring_func == ScoringFunc::Softmax {
                logits[j]
            } else {
                scores[j]
            };
            keys[j] = base + inputs.bias.at(&[j]);
        }

        // Selection (logical routed ids).
        let sel: Vec<usize> = if fix_routing(inputs, t) {
            let fixed = inputs
                .unmapped_topk_idx
                .as_ref()
                .map(|u| run(u, &[t, 0], k))
                .unwrap_or(&[]);
            // Range-checked by check_data.
            fixed.iter().map(|&id| id as usize).collect()
        } else {
            select(&keys, &shape)
        };
        if let Some(u) = unmapped.as_mut() {
            for (o, &id) in u[t * k..(t + 1) * k].iter_mut().zip(&sel) {
                *o = id as i64;
            }
        }

        // Weights: den = 1e-20 + s[sel[0]] + s[sel[1]] + ... (fp32, slot order).
        let den = sel
            .iter()
            .fold(WEIGHT_DENOMINATOR_EPS, |acc, &id| acc + scores[id]);
        for slot in 0..p {
            let (logical, w) = if slot < k {
                let s = scores[sel[slot]];
                (sel[slot], s / den * params.routed_scaling_factor)
            } else {
                (e + (slot - k), 1.0f32)
            };
            idx_row[slot] = physical_masked(inputs, params, &shape, t, logical);
            w_row[slot] = w;
        }
    }

    Ok(Top2SumGateOutput {
        topk_idx: HostTensor::from_vec(topk_idx, &[t_count, p])?,
        topk_weights: HostTensor::from_vec(topk_weights, &[t_count, p])?,
        unmapped_topk_idx: match unmapped {
            Some(u) => Some(HostTensor::from_vec(u, &[t_count, k])?),
            None => None,
        },
    })
}

/// True unless the token is masked out.
fn routed(inputs: &Top2SumGateInputs<'_>, t: usize) -> bool {
    inputs.mask.as_ref().is_none_or(|m| m.at(&[t]) != 0)
}

/// True for a fix-routing token (only meaningful for a routed one).
fn fix_routing(inputs: &Top2SumGateInputs<'_>, t: usize) -> bool {
    inputs
        .fix_routing_mask
        .as_ref()
        .is_some_and(|m| m.at(&[t]) != 0)
}

/// The `K` best experts by `keys` (best first), restricted to the `Gk` best groups when grouping
/// is active.
fn select(keys: &[f32], shape: &Top2SumGateShape) -> Vec<usize> {
    match shape.grouping {
        None => stable_topk_indices(keys, shape.num_topk),
        Some(g) => {
            let size = g.group_size;
            let group_scores: Vec<f32> = keys.chunks(size).map(|c| group_score(c, 2)).collect();
            let candidates: Vec<usize> = stable_topk_indices(&group_scores, g.num_topk_groups)
                .into_iter()
                .flat_map(|q| q * size..(q + 1) * size)
                .collect();
            select_best(candidates, shape.num_topk, |j| keys[j])
        }
    }
}

/// The physical, EP/TP-masked id of logical expert `logical` in token `t`'s slot.
fn physical_masked(
    inputs: &Top2SumGateInputs<'_>,
    params: &Top2SumGateParams,
    shape: &Top2SumGateShape,
    t: usize,
    logical: usize,
) -> i64 {
    let id = match &inputs.physical_map {
        None => logical as i64,
        Some(map) => {
            // check_data proved 1 <= count <= D and the validation that the product fits u64.
            let count = map.logical_count.at(&[logical]) as u64;
            let col = replica_column(params.ep_rank, t, count).unwrap_or(0) as usize;
            map.to_physical_map.at(&[logical, col]) as i64
        }
    };
    mask_ep_tp(
        id,
        shape.experts_per_rank as i64,
        params.tp_rank as i64,
        params.num_tp_ranks as i64,
    )
}

/// The data rules of the module docs, checked up front.
fn check_data(inputs: &Top2SumGateInputs<'_>, shape: &Top2SumGateShape) -> Result<()> {
    let e = shape.num_experts;
    for j in 0..e {
        let b = inputs.bias.at(&[j]);
        if !b.is_finite() {
            return Err(TkError::param(
                "bias",
                format!("must be finite; bias[{j}] = {b}"),
            ));
        }
    }
    if let (Some(map), Some(d)) = (&inputs.physical_map, shape.num_replicas) {
        let physical = shape.num_physical_experts() as i64;
        for l in 0..shape.num_logical_experts() {
            let count = map.logical_count.at(&[l]);
            if count < 1 || count as usize > d {
                return Err(TkError::param(
                    "logical_count",
                    format!("logical_count[{l}] = {count} must lie in 1..=D = {d}"),
                ));
            }
            for c in 0..count as usize {
                let id = map.to_physical_map.at(&[l, c]) as i64;
                if !(0..physical).contains(&id) {
                    return Err(TkError::param(
                        "to_physical_map",
                        format!(
                            "to_physical_map[{l}, {c}] = {id} (a valid replica, c < \
                             logical_count[{l}]) must lie in 0..E + X = {physical}"
                        ),
                    ));
                }
            }
        }
    }
    for t in 0..shape.num_tokens {
        if !routed(inputs, t) {
            continue;
        }
        let row = run(&inputs.logits, &[t, 0], e);
        if let Some(j) = row.iter().position(|v| !v.is_finite()) {
            return Err(TkError::param(
                "logits",
                format!(
                    "must be finite for every routed token; logits[{t}, {j}] = {}",
                    row[j]
                ),
            ));
        }
        if fix_routing(inputs, t) {
            if let Some(u) = &inputs.unmapped_topk_idx {
                let ids = run(u, &[t, 0], shape.num_topk);
                if let Some(k) = ids.iter().position(|&id| id < 0 || id as usize >= e) {
                    return Err(TkError::param(
                        "unmapped_topk_idx",
                        format!(
                            "fix-routing token {t}: unmapped_topk_idx[{t}, {k}] = {} must lie \
                             in 0..E = {e}",
                            ids[k]
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}
