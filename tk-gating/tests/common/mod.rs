//! Naive, independent implementations of the gating ops (written from `spec/moe.md`, sharing no
//! selection code with the crate) and helpers shared by the test files.
#![allow(dead_code)]

use tk_core::TkError;
use tk_gating::scoring::ScoringFunc;

/// True when `(a, ia)` must be selected before `(b, ib)`: NaN above everything, then by value
/// (`-0.0 == +0.0`), then the smaller index.
pub fn better(a: f32, ia: usize, b: f32, ib: usize) -> bool {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => ia < ib,
        (true, false) => true,
        (false, true) => false,
        (false, false) => a > b || (a == b && ia < ib),
    }
}

/// `k` rounds of "take the best remaining entry" (a removal flag, not an overwrite).
pub fn naive_topk(keys: &[f32], k: usize) -> Vec<usize> {
    let mut taken = vec![false; keys.len()];
    let mut out = Vec::new();
    for _ in 0..k {
        let mut best: Option<usize> = None;
        for (i, &v) in keys.iter().enumerate() {
            if taken[i] {
                continue;
            }
            if best.is_none_or(|b| better(v, i, keys[b], b)) {
                best = Some(i);
            }
        }
        let b = best.expect("k <= number of keys");
        taken[b] = true;
        out.push(b);
    }
    out
}

/// The group score of §4.4 by sorting a copy of the group (best first) and adding the first one
/// or two values.
pub fn naive_group_score(group: &[f32], n: usize) -> f32 {
    let order = naive_topk(group, n);
    if n == 1 {
        group[order[0]]
    } else {
        group[order[0]] + group[order[1]]
    }
}

/// §4.4 for one token: `groups[q]` holds the scores of group `q`.
pub fn naive_group_idx(groups: &[Vec<f32>], n: usize, gk: usize) -> Vec<usize> {
    let g: Vec<f32> = groups.iter().map(|q| naive_group_score(q, n)).collect();
    naive_topk(&g, gk)
}

/// Everything `top2_sum_gate` takes, as plain vectors.
#[derive(Debug, Clone)]
pub struct NaiveGate {
    pub logits: Vec<Vec<f32>>,
    pub bias: Vec<f32>,
    pub k: usize,
    pub groups: usize,
    pub topk_groups: usize,
    pub shared: usize,
    pub rsf: f32,
    pub ep_rank: usize,
    pub ep: usize,
    pub tp_rank: usize,
    pub tp: usize,
    pub scoring: ScoringFunc,
    pub mask: Option<Vec<bool>>,
    pub fix: Option<Vec<bool>>,
    /// `(to_physical_map rows, logical_count)`.
    pub map: Option<(Vec<Vec<i32>>, Vec<i32>)>,
    pub unmapped: Option<Vec<Vec<i64>>>,
}

/// `(topk_idx, topk_weights, unmapped_topk_idx)` rows.
pub type NaiveOut = (Vec<Vec<i64>>, Vec<Vec<f32>>, Option<Vec<Vec<i64>>>);

/// A transcription of §4.5 steps 1–9: group restriction by masking the keys of lost groups with
/// `-inf` (as upstream's test does), the replica choice in i128, the closed-form EP/TP rule.
pub fn naive_top2_sum_gate(g: &NaiveGate) -> NaiveOut {
    let e = g.bias.len();
    let p = g.k + g.shared;
    let x = g.map.as_ref().map_or(0, |(m, _)| m[0].len() - 1);
    let r = ((e + x) / g.ep) as i64;
    let mut idx_out = Vec::new();
    let mut w_out = Vec::new();
    let mut unmapped_out = g.unmapped.as_ref().map(|_| Vec::new());
    for (t, logits) in g.logits.iter().enumerate() {
        if g.mask.as_ref().is_some_and(|m| !m[t]) {
            idx_out.push(vec![-1; p]);
            w_out.push(vec![0.0; p]);
            if let Some(u) = unmapped_out.as_mut() {
                u.push(vec![-1; g.k]);
            }
            continue;
        }
        let mut s = vec![0f32; e];
        g.scoring.score_row(logits, &mut s);
        let mut keys: Vec<f32> = (0..e)
            .map(|j| {
                let base = if g.scoring == ScoringFunc::Softmax {
                    logits[j]
                } else {
                    s[j]
                };
                base + g.bias[j]
            })
            .collect();
        let sel: Vec<usize> = if g.fix.as_ref().is_some_and(|f| f[t]) {
            g.unmapped.as_ref().unwrap()[t]
                .iter()
                .map(|&v| v as usize)
                .collect()
        } else {
            if g.groups != g.topk_groups {
                let size = e / g.groups;
                let groups: Vec<Vec<f32>> = keys.chunks(size).map(|c| c.to_vec()).collect();
                let kept = naive_group_idx(&groups, 2, g.topk_groups);
                for q in 0..g.groups {
                    if !kept.contains(&q) {
                        for key in &mut keys[q * size..(q + 1) * size] {
                            *key = f32::NEG_INFINITY;
                        }
                    }
                }
            }
            naive_topk(&keys, g.k)
        };
        if let Some(u) = unmapped_out.as_mut() {
            u.push(sel.iter().map(|&v| v as i64).collect());
        }
        let mut den = 1e-20f32;
        for &j in &sel {
            den += s[j];
        }
        let mut ids = Vec::new();
        let mut ws = Vec::new();
        for slot in 0..p {
            let (logical, w) = if slot < g.k {
                (sel[slot], s[sel[slot]] / den * g.rsf)
            } else {
                (e + slot - g.k, 1.0)
            };
            let mut id = logical as i64;
            if let Some((map, count)) = &g.map {
                let c = (g.ep_rank as i128 + t as i128 * 23_333) % count[logical] as i128;
                id = map[logical][c as usize] as i64;
            }
            let owner = id / r;
            let local = if owner % g.tp as i64 == g.tp_rank as i64 {
                (owner / g.tp as i64) * r + id % r
            } else {
                -1
            };
            ids.push(local);
            ws.push(w);
        }
        idx_out.push(ids);
        w_out.push(ws);
    }
    (idx_out, w_out, unmapped_out)
}

/// `exp`-based scores in f64 (for accuracy checks).
pub fn score_f64(f: ScoringFunc, row: &[f32]) -> Vec<f64> {
    let x: Vec<f64> = row.iter().map(|&v| v as f64).collect();
    match f {
        ScoringFunc::Sigmoid => x.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
        ScoringFunc::SqrtSoftplus => x.iter().map(|&v| softplus_f64(v).sqrt()).collect(),
        ScoringFunc::Identity => x,
        ScoringFunc::Softmax => {
            let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
            let z: f64 = e.iter().sum();
            e.iter().map(|v| v / z).collect()
        }
    }
}

/// The real softplus (no threshold).
pub fn softplus_f64(x: f64) -> f64 {
    if x > 30.0 {
        x + (-x).exp()
    } else {
        x.exp().ln_1p()
    }
}

#[allow(unused_imports)] // not every test file that includes this module uses it
pub use tk_core::testing::assert_param;

/// The argument an error names (`""` for errors about no argument).
pub fn err_arg(err: &TkError) -> &'static str {
    err.arg().unwrap_or("")
}

/// Splits a flat row-major buffer into rows of `n`.
pub fn rows<T: Clone>(flat: &[T], n: usize) -> Vec<Vec<T>> {
    if n == 0 {
        return Vec::new();
    }
    flat.chunks(n).map(|c| c.to_vec()).collect()
}

/// Asserts two f32 slices are bit-identical, naming the first difference.
pub fn assert_f32_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "{what}[{i}]: got {a:e}, expected {b:e}"
        );
    }
}
