//! `top2_sum_gate` (`spec/moe.md` §4.5, §5): hand-computed examples for every option (bias,
//! softmax ranking, routed scaling, groups, shared experts, physical map with logical_count,
//! EP/TP masking, mask, fix routing, unmapped_topk_idx), planted ties and the spec's stability
//! check, NaN / inf rules, every rejection path, the 64-bit replica choice beyond upstream's
//! int32 overflow, the DeepSeek-V3 / V4 configurations, the spec's test grid, configurations
//! beyond upstream's kernel limits, and agreement with a naive transcription of the spec
//! (bit-exact) and with an f64 pipeline (indices exact, weights within tolerance).
#![cfg(feature = "cpu")]

mod common;

use common::{
    assert_f32_bits, assert_param, err_arg, naive_top2_sum_gate, rows, score_f64, NaiveGate,
    NaiveOut,
};
use test_case::test_case;
use tk_core::testing::Rng;
use tk_core::{HostTensor, TkError};
use tk_gating::reference::{top2_sum_gate, Top2SumGateInputs, Top2SumGateOutput};
use tk_gating::scoring::{sigmoid, ScoringFunc};
use tk_gating::testing::{allclose, gated_inputs, ulp_distance};
use tk_gating::top2_sum_gate::UPSTREAM_REPLICA_OVERFLOW_TOKEN;
use tk_gating::Top2SumGateParams;

use ScoringFunc::{Sigmoid, Softmax, SqrtSoftplus};

const SCORINGS: [ScoringFunc; 3] = [Sigmoid, SqrtSoftplus, Softmax];

// ---------------------------------------------------------------------------------------------
// Plumbing: one description (NaiveGate) → crate call and naive call.
// ---------------------------------------------------------------------------------------------

fn gate(e: usize, k: usize, scoring: ScoringFunc) -> NaiveGate {
    NaiveGate {
        logits: Vec::new(),
        bias: vec![0.0; e],
        k,
        groups: 0,
        topk_groups: 0,
        shared: 0,
        rsf: 1.0,
        ep_rank: 0,
        ep: 1,
        tp_rank: 0,
        tp: 1,
        scoring,
        mask: None,
        fix: None,
        map: None,
        unmapped: None,
    }
}

fn params_of(g: &NaiveGate) -> Top2SumGateParams {
    Top2SumGateParams::new(g.k, g.scoring)
        .with_groups(g.groups, g.topk_groups)
        .with_shared_as_routed(g.shared)
        .with_routed_scaling_factor(g.rsf)
        .with_ep(g.ep_rank, g.ep)
        .with_tp(g.tp_rank, g.tp)
}

/// Runs the crate on `g`, with `logits` and `unmapped_topk_idx` stored with a row stride larger
/// than their width (extra columns of garbage), and `true` mask bytes of value 2 on odd rows.
fn run_crate(g: &NaiveGate) -> Result<Top2SumGateOutput, TkError> {
    let t = g.logits.len();
    let e = g.bias.len();
    const PAD: usize = 3;
    let wide_logits = HostTensor::from_vec(
        g.logits
            .iter()
            .flat_map(|r| r.iter().copied().chain([f32::NAN; PAD]))
            .collect(),
        &[t, e + PAD],
    )
    .unwrap();
    let bias = HostTensor::from_vec(g.bias.clone(), &[e]).unwrap();
    let bytes = |v: &Vec<bool>| -> HostTensor<u8> {
        let b: Vec<u8> = v
            .iter()
            .enumerate()
            .map(|(i, &x)| if x { 1 + (i % 2) as u8 } else { 0 })
            .collect();
        HostTensor::from_vec(b, &[v.len()]).unwrap()
    };
    let mask = g.mask.as_ref().map(bytes);
    let fix = g.fix.as_ref().map(bytes);
    let map = g.map.as_ref().map(|(m, c)| {
        let d = m[0].len();
        (
            HostTensor::from_vec(m.iter().flatten().copied().collect(), &[m.len(), d]).unwrap(),
            HostTensor::from_vec(c.clone(), &[c.len()]).unwrap(),
        )
    });
    let unmapped = g.unmapped.as_ref().map(|u| {
        HostTensor::from_vec(
            u.iter()
                .flat_map(|r| r.iter().copied().chain([i64::MIN; PAD]))
                .collect(),
            &[t, g.k + PAD],
        )
        .unwrap()
    });

    let lv = wide_logits.view().narrow(1, 0, e).unwrap();
    let mut inputs = Top2SumGateInputs::new(lv, bias.view());
    if let Some(m) = &mask {
        inputs = inputs.with_mask(m.view());
    }
    if let Some(u) = &unmapped {
        inputs = inputs.with_unmapped_topk_idx(u.view().narrow(1, 0, g.k).unwrap());
    }
    if let Some(f) = &fix {
        inputs.fix_routing_mask = Some(f.view());
    }
    if let Some((m, c)) = &map {
        inputs = inputs.with_physical_map(m.view(), c.view());
    }
    top2_sum_gate(&inputs, &params_of(g))
}

fn to_rows(out: &Top2SumGateOutput, p: usize, k: usize) -> NaiveOut {
    (
        rows(out.topk_idx.as_slice(), p),
        rows(out.topk_weights.as_slice(), p),
        out.unmapped_topk_idx
            .as_ref()
            .map(|u| rows(u.as_slice(), k)),
    )
}

/// The crate and the naive transcription agree bit for bit.
fn assert_matches_naive(what: &str, g: &NaiveGate) {
    let p = g.k + g.shared;
    let out = run_crate(g).unwrap_or_else(|e| panic!("{what}: {e}"));
    let t = g.logits.len();
    assert_eq!(out.topk_idx.shape(), &[t, p], "{what}");
    assert_eq!(out.topk_weights.shape(), &[t, p], "{what}");
    let (idx, w, u) = to_rows(&out, p, g.k);
    let (nidx, nw, nu) = naive_top2_sum_gate(g);
    assert_eq!(idx, nidx, "{what}: topk_idx");
    for (r, (a, b)) in w.iter().zip(&nw).enumerate() {
        assert_f32_bits(&format!("{what}: topk_weights row {r}"), a, b);
    }
    assert_eq!(u, nu, "{what}: unmapped_topk_idx");
}

/// Identity map `(E + S, D)` with `logical_count = 1` (the spec's test map).
fn identity_map(logical: usize, d: usize) -> (Vec<Vec<i32>>, Vec<i32>) {
    (
        (0..logical).map(|l| vec![l as i32; d]).collect(),
        vec![1; logical],
    )
}

fn randn_rows(rng: &mut Rng, t: usize, e: usize) -> Vec<Vec<f32>> {
    (0..t)
        .map(|_| (0..e).map(|_| rng.normal()).collect())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Hand-computed examples, one per option.
// ---------------------------------------------------------------------------------------------

#[test]
fn bias_ranks_but_never_weights() {
    // sigmoid(0) = 0.5 for every expert: the bias alone decides, the weights ignore it.
    let mut g = gate(4, 2, Sigmoid);
    g.logits = vec![vec![0.0; 4]];
    g.bias = vec![0.0, 1.0, 0.0, 2.0];
    let out = run_crate(&g).unwrap();
    assert_eq!(out.topk_idx.as_slice(), &[3, 1]);
    // den = (1e-20 + 0.5) + 0.5 = 1.0 exactly.
    assert_eq!(out.topk_weights.as_slice(), &[0.5, 0.5]);

    // Different scores: weights are s / (1e-20 + s_a + s_b) with the un-biased scores.
    g.logits = vec![vec![1.0, 0.0, -1.0, 2.0]];
    g.bias = vec![0.0, 0.0, 3.0, 0.0]; // expert 2 has the lowest score but the best key
    let out = run_crate(&g).unwrap();
    assert_eq!(out.topk_idx.as_slice(), &[2, 3]);
    let (s2, s3) = (sigmoid(-1.0), sigmoid(2.0));
    let den = (1e-20f32 + s2) + s3;
    assert_eq!(out.topk_weights.as_slice(), &[s2 / den, s3 / den]);
    // The real values: 0.2689 / (0.2689 + 0.8808) and 0.8808 / (...), to 2 ulp.
    let (r2, r3) = (1.0 / (1.0 + 1f64.exp()), 1.0 / (1.0 + (-2f64).exp()));
    assert!(ulp_distance(out.topk_weights.as_slice()[0], (r2 / (r2 + r3)) as f32) <= 3);
    assert!(ulp_distance(out.topk_weights.as_slice()[1], (r3 / (r2 + r3)) as f32) <= 3);
}

#[test]
fn softmax_ranks_by_logit_plus_bias() {
    // logits (2, 0), bias (0, 1.5): logit + bias = (2, 1.5) picks expert 0, whereas
    // probability + bias = (0.88, 1.62) would pick expert 1 (and sigmoid does).
    let mut g = gate(2, 1, Softmax);
    g.logits = vec![vec![2.0, 0.0]];
    g.bias = vec![0.0, 1.5];
    g.rsf = 2.0;
    let out = run_crate(&g).unwrap();
    assert_eq!(out.topk_idx.as_slice(), &[0]);
    // One slot: p0 / (1e-20 + p0) = 1 exactly, times 2.
    assert_eq!(out.topk_weights.as_slice(), &[2.0]);
    g.scoring = Sigmoid;
    assert_eq!(run_crate(&g).unwrap().topk_idx.as_slice(), &[1]);
    g.scoring = SqrtSoftplus;
    assert_eq!(run_crate(&g).unwrap().topk_idx.as_slice(), &[1]);

    // Weights are the probabilities over all E experts, renormalised over the selected K:
    // logits (1, 0, 0), bias (0, 0, 5): keys (1, 0, 5) select (2, 0); weights 1/(1+e), e/(1+e).
    let mut g = gate(3, 2, Softmax);
    g.logits = vec![vec![1.0, 0.0, 0.0]];
    g.bias = vec![0.0, 0.0, 5.0];
    let out = run_crate(&g).unwrap();
    assert_eq!(out.topk_idx.as_slice(), &[2, 0]);
    let e1 = 1f64.exp();
    let w = out.topk_weights.as_slice();
    assert!(ulp_distance(w[0], (1.0 / (1.0 + e1)) as f32) <= 4, "{w:?}");
    assert!(ulp_distance(w[1], (e1 / (1.0 + e1)) as f32) <= 4, "{w:?}");
}

#[test]
fn routed_scaling_factor_scales_routed_slots_only() {
    let mut g = gate(4, 2, Sigmoid);
    g.logits = vec![vec![0.0; 4]];
    g.bias = vec![0.0, 1.0, 0.0, 2.0];
    g.rsf = 2.5;
    g.shared = 2;
    g.map = Some(identity_map(6, 3));
    let out = run_crate(&g).unwrap();
    assert_eq!(out.topk_idx.as_slice(), &[3, 1, 4, 5]);
    assert_eq!(out.topk_weights.as_slice(), &[1.25, 1.25, 1.0, 1.0]);
    // The order is (s / den) * rsf: compare with the naive transcription on values where the
    // other orders round differently.
    let mut rng = Rng::for_case("routed_scaling_factor order");
    let mut g = gate(16, 5, Sigmoid);
    g.logits = randn_rows(&mut rng, 64, 16);
    g.rsf = 2.345_678_9;
    assert_matches_naive("rsf order", &g);
    let out = run_crate(&g).unwrap();
    let s = |t: usize, j: usize| sigmoid(g.logits[t][j]);
    let mut differs = false;
    for t in 0..64 {
        // No map and one EP/TP rank: topk_idx holds the logical ids.
        let sel = &out.topk_idx.as_slice()[t * 5..t * 5 + 5];
        let den = sel.iter().fold(1e-20f32, |a, &j| a + s(t, j as usize));
        for (k, &j) in sel.iter().enumerate() {
            let other = s(t, j as usize) * (g.rsf / den);
            differs |= other.to_bits() != out.topk_weights.as_slice()[t * 5 + k].to_bits();
        }
    }
    assert!(
        differs,
        "the test data cannot tell the operation orders apart"
    );
}

#[test]
fn weight_epsilon_is_added_first_not_clamped() {
    // sigmoid(-46) = 1.05e-20: den = 1e-20 + 1.05e-20, so the single weight is about 0.51 —
    // upstream's reference clamp(sum, min=1e-20) would give 1.0.
    let mut g = gate(2, 1, Sigmoid);
    g.logits = vec![vec![-46.0, -50.0]];
    let out = run_crate(&g).unwrap();
    let s = sigmoid(-46.0);
    assert_eq!(out.topk_idx.as_slice(), &[0]);
    assert_eq!(out.topk_weights.as_slice(), &[s / (1e-20f32 + s)]);
    let w = out.topk_weights.as_slice()[0];
    assert!((0.5..0.52).contains(&w), "{w}");
    // The sum runs in slot order from 1e-20: ((1e-20 + s_a) + s_b), with s_a >> s_b here.
    let mut g = gate(2, 2, Sigmoid);
    g.logits = vec![vec![0.0, -46.0]];
    let out = run_crate(&g).unwrap();
    let (a, b) = (sigmoid(0.0), sigmoid(-46.0));
    let den = (1e-20f32 + a) + b;
    assert_eq!(out.topk_weights.as_slice(), &[a / den, b / den]);
}

#[test]
fn grouped_routing_uses_top2_sums() {
    // 8 experts in 4 groups of 2, keep 2 groups (the crate doc example).
    let mut g = gate(8, 2, Sigmoid);
    g.logits = vec![vec![0.0; 8]];
    g.bias = vec![0.0, 0.25, 1.0, 0.0, 0.5, 0.5, 0.0, 0.75];
    g.groups = 4;
    g.topk_groups = 2;
    let out = run_crate(&g).unwrap();
    // Group sums 1.25, 2.0, 2.0, 1.75: groups 1 and 2; expert 7 (1.25) loses with group 3.
    assert_eq!(out.topk_idx.as_slice(), &[2, 4]);
    // Without groups expert 7 would be second.
    g.groups = 0;
    g.topk_groups = 0;
    assert_eq!(run_crate(&g).unwrap().topk_idx.as_slice(), &[2, 7]);
    // G == Gk != 0: grouping inactive, same as no groups.
    g.groups = 4;
    g.topk_groups = 4;
    assert_eq!(run_crate(&g).unwrap().topk_idx.as_slice(), &[2, 7]);

    // A duplicated maximum counts twice: group 0 = (1, 1) → 2 beats group 1 = (1.75, 0) → 1.75.
    let mut g = gate(4, 1, Sigmoid);
    g.logits = vec![vec![0.0; 4]];
    g.bias = vec![0.5, 0.5, 1.25, -0.5];
    g.groups = 2;
    g.topk_groups = 1;
    assert_eq!(run_crate(&g).unwrap().topk_idx.as_slice(), &[0]);

    // Softmax groups rank by logit + bias too.
    let mut g = gate(4, 2, Softmax);
    g.logits = vec![vec![3.0, 3.0, 0.0, 0.0]];
    g.bias = vec![0.0, 0.0, 2.0, 2.0];
    g.groups = 2;
    g.topk_groups = 1;
    // Group 0: 3 + 3 = 6; group 1: 2 + 2 = 4 → experts 0, 1 (probability + bias would choose 1).
    assert_eq!(run_crate(&g).unwrap().topk_idx.as_slice(), &[0, 1]);
}

#[test]
fn shared_experts_become_routed_slots() {
    for s in [1usize, 2] {
        let mut g = gate(4, 2, Sigmoid);
        g.logits = vec![vec![0.0, 1.0, 2.0, 3.0]; 2];
        g.shared = s;
        g.rsf = 3.0;
        g.map = Some(identity_map(4 + s, s + 1));
        let out = run_crate(&g).unwrap();
        let p = 2 + s;
        assert_eq!(out.topk_idx.shape(), &[2, p]);
        let mut want_idx = vec![3i64, 2];
        want_idx.extend((0..s).map(|i| 4 + i as i64));
        let (s3, s2) = (sigmoid(3.0), sigmoid(2.0));
        let den = (1e-20f32 + s3) + s2;
        let mut want_w = vec![s3 / den * 3.0, s2 / den * 3.0];
        want_w.extend(std::iter::repeat_n(1.0f32, s));
        for t in 0..2 {
            assert_eq!(&out.topk_idx.as_slice()[t * p..(t + 1) * p], &want_idx[..]);
            assert_eq!(
                &out.topk_weights.as_slice()[t * p..(t + 1) * p],
                &want_w[..]
            );
        }
        assert_matches_naive(&format!("shared {s}"), &g);
    }
}

#[test]
fn physical_map_picks_the_replica_of_each_token() {
    // 4 experts, D = 3 (X = 2 extra, physical ids 0..6). Logical 0 has replicas (0, 4, 5).
    // Columns beyond logical_count are never read (garbage here).
    let mut g = gate(4, 1, Sigmoid);
    g.logits = vec![vec![0.0; 4]; 4];
    g.bias = vec![1.0, 0.0, 0.0, 0.0];
    g.ep_rank = 1;
    g.ep = 2; // R = (4 + 2) / 2 = 3; one TP rank keeps every id unchanged
    g.map = Some((
        vec![
            vec![0, 4, 5],
            vec![1, -7, 99],
            vec![2, 3, -7],
            vec![3, 99, 99],
        ],
        vec![3, 1, 2, 1],
    ));
    g.unmapped = Some(vec![vec![0]; 4]);
    let out = run_crate(&g).unwrap();
    // c = (1 + t·23333) mod 3 = 1, 0, 2, 1 for t = 0..3.
    assert_eq!(out.topk_idx.as_slice(), &[4, 0, 5, 4]);
    // unmapped_topk_idx holds the logical id.
    assert_eq!(out.unmapped_topk_idx.unwrap().as_slice(), &[0, 0, 0, 0]);
    assert_matches_naive("physical map", &g);

    // ep_rank changes the choice: ep_rank 0 gives c = 0, 23333 % 3 = 2, 46666 % 3 = 1, 0.
    g.ep_rank = 0;
    assert_eq!(run_crate(&g).unwrap().topk_idx.as_slice(), &[0, 5, 4, 0]);
}

#[test]
fn ep_tp_masking_keeps_the_ranks_experts_and_their_weights() {
    // 8 experts, all selected in id order; 4 EP ranks of R = 2, 2 TP ranks.
    let mut g = gate(8, 8, Sigmoid);
    g.logits = vec![vec![0.0; 8]];
    g.bias = (0..8).map(|j| -(j as f32) * 0.125).collect();
    g.ep = 4;
    g.tp = 2;
    for (tp_rank, want) in [
        (0, [0, 1, -1, -1, 2, 3, -1, -1]),
        (1, [-1, -1, 0, 1, -1, -1, 2, 3]),
    ] {
        g.tp_rank = tp_rank;
        let out = run_crate(&g).unwrap();
        assert_eq!(out.topk_idx.as_slice(), &want);
        // Every slot keeps its weight, masked or not: 0.5 / (1e-20 + 8 · 0.5) = 0.125.
        assert_eq!(out.topk_weights.as_slice(), &[0.125; 8]);
        assert_matches_naive(&format!("tp_rank {tp_rank}"), &g);
    }
    // With the physical map, R comes from E + X: X = 4 extra → R = 12 / 4 = 3.
    g.map = Some(identity_map(8, 5));
    g.tp_rank = 1;
    let out = run_crate(&g).unwrap();
    // Owners id / 3: 0,0,0,1,1,1,2,2 → TP index 1 keeps owner 1 (ids 3, 4, 5 → 0, 1, 2).
    assert_eq!(out.topk_idx.as_slice(), &[-1, -1, -1, 0, 1, 2, -1, -1]);
}

#[test]
fn masked_tokens_are_not_routed_and_not_read() {
    let mut g = gate(4, 2, Sigmoid);
    g.logits = vec![
        vec![0.0, 1.0, 2.0, 3.0],
        vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0], // masked: never read
        vec![3.0, 2.0, 1.0, 0.0],
    ];
    g.mask = Some(vec![true, false, true]);
    g.shared = 2;
    g.map = Some(identity_map(6, 3));
    g.unmapped = Some(vec![vec![7, 7]; 3]);
    let out = run_crate(&g).unwrap();
    assert_eq!(&out.topk_idx.as_slice()[4..8], &[-1; 4]);
    assert_eq!(&out.topk_weights.as_slice()[4..8], &[0.0; 4]);
    assert_eq!(
        out.unmapped_topk_idx.as_ref().unwrap().as_slice(),
        &[3, 2, -1, -1, 0, 1]
    );
    assert_eq!(&out.topk_idx.as_slice()[..4], &[3, 2, 4, 5]);
    assert_matches_naive("mask", &g);
    // A masked fix-routing token is masked (its ids are not even checked).
    g.fix = Some(vec![false, true, false]);
    g.unmapped = Some(vec![vec![0, 0], vec![-5, 99], vec![0, 0]]);
    let out = run_crate(&g).unwrap();
    assert_eq!(&out.topk_idx.as_slice()[4..8], &[-1; 4]);
    assert_eq!(
        out.unmapped_topk_idx.unwrap().as_slice(),
        &[3, 2, -1, -1, 0, 1]
    );
}

#[test]
fn fix_routing_takes_the_given_experts() {
    let mut g = gate(4, 2, Sigmoid);
    g.logits = vec![vec![0.0, 1.0, 2.0, 3.0]; 3];
    g.fix = Some(vec![false, true, true]);
    g.unmapped = Some(vec![vec![0, 0], vec![1, 1], vec![0, 2]]);
    g.rsf = 2.0;
    let out = run_crate(&g).unwrap();
    // Row 0 selects; rows 1 and 2 use the given ids (duplicates too) in the given order.
    assert_eq!(out.topk_idx.as_slice(), &[3, 2, 1, 1, 0, 2]);
    assert_eq!(
        out.unmapped_topk_idx.as_ref().unwrap().as_slice(),
        &[3, 2, 1, 1, 0, 2]
    );
    // Duplicates count twice in the denominator: s1 / (1e-20 + s1 + s1) · 2.
    let s1 = sigmoid(1.0);
    let w = s1 / ((1e-20f32 + s1) + s1) * 2.0;
    assert_eq!(&out.topk_weights.as_slice()[2..4], &[w, w]);
    let (s0, s2) = (sigmoid(0.0), sigmoid(2.0));
    let den = (1e-20f32 + s0) + s2;
    assert_eq!(
        &out.topk_weights.as_slice()[4..6],
        &[s0 / den * 2.0, s2 / den * 2.0]
    );
    assert_matches_naive("fix routing", &g);
    // Fix-routing ids still go through shared slots, the map and EP/TP masking.
    g.shared = 2;
    g.map = Some(identity_map(6, 3));
    g.ep = 3; // R = (4 + 2) / 3 = 2
    g.tp = 3;
    g.tp_rank = 0; // keeps owner 0: ids 0, 1
    let out = run_crate(&g).unwrap();
    assert_eq!(
        out.topk_idx.as_slice(),
        &[-1, -1, -1, -1, 1, 1, -1, -1, 0, -1, -1, -1]
    );
    assert_matches_naive("fix routing + map + masking", &g);
}

#[test]
fn unmapped_topk_idx_with_a_row_stride() {
    // run_crate stores unmapped_topk_idx with row stride K + 3; the output is contiguous.
    let mut rng = Rng::for_case("unmapped stride");
    let mut g = gate(12, 3, SqrtSoftplus);
    g.logits = randn_rows(&mut rng, 5, 12);
    g.unmapped = Some(vec![vec![0; 3]; 5]);
    g.fix = Some(vec![false, true, false, true, false]);
    g.unmapped.as_mut().unwrap()[1] = vec![11, 0, 5];
    g.unmapped.as_mut().unwrap()[3] = vec![2, 2, 2];
    let out = run_crate(&g).unwrap();
    let u = out.unmapped_topk_idx.as_ref().unwrap();
    assert_eq!(u.shape(), &[5, 3]);
    assert_eq!(&u.as_slice()[3..6], &[11, 0, 5]);
    assert_eq!(&u.as_slice()[9..12], &[2, 2, 2]);
    assert_matches_naive("unmapped stride", &g);
    // Without unmapped_topk_idx there is no such output.
    g.fix = None;
    g.unmapped = None;
    assert!(run_crate(&g).unwrap().unmapped_topk_idx.is_none());
}

#[test]
fn zero_tokens() {
    let mut g = gate(8, 4, Softmax);
    g.shared = 1;
    g.map = Some(identity_map(9, 2));
    g.unmapped = Some(Vec::new());
    g.mask = Some(Vec::new());
    g.ep = 2;
    let out = run_crate(&g).unwrap();
    assert_eq!(out.topk_idx.shape(), &[0, 5]);
    assert_eq!(out.topk_weights.shape(), &[0, 5]);
    assert_eq!(out.unmapped_topk_idx.unwrap().shape(), &[0, 4]);
}

// ---------------------------------------------------------------------------------------------
// Ties, stability, NaN / inf.
// ---------------------------------------------------------------------------------------------

/// The spec's stability check for every config: all-zero logits and bias select experts
/// 0, 1, 2, ... in that order (groups by lower index too).
#[test]
fn all_equal_keys_select_the_lowest_ids_in_order() {
    for (groups, topk_groups, e, s, k) in SPEC_CONFIGS {
        let shared_ok = k % s == 0 && e % (k / s) == 0;
        let mut g = gate(e, k, Sigmoid);
        g.logits = vec![vec![0.0; e]; 3];
        g.groups = groups;
        g.topk_groups = topk_groups;
        g.ep = 4;
        g.tp = 2;
        g.unmapped = Some(vec![vec![0; k]; 3]);
        if shared_ok {
            g.shared = s;
            g.map = Some(identity_map(e + s, 33));
        }
        let out = run_crate(&g).unwrap();
        let p = k + g.shared;
        let on_rank = (e / 4).min(k);
        for t in 0..3 {
            let row = &out.topk_idx.as_slice()[t * p..(t + 1) * p];
            let want: Vec<i64> = (0..on_rank as i64).collect();
            assert_eq!(
                &row[..on_rank],
                &want[..],
                "config {e} {k} {groups} {topk_groups}"
            );
            let u = &out.unmapped_topk_idx.as_ref().unwrap().as_slice()[t * k..(t + 1) * k];
            let want: Vec<i64> = (0..k as i64).collect();
            assert_eq!(u, &want[..]);
        }
    }
}

#[test]
fn planted_ties_between_groups_and_experts() {
    // 3 groups of 3; groups 0 and 2 tie on their top-2 sum (higher index loses), group 1 wins.
    let mut g = gate(9, 4, Sigmoid);
    g.logits = vec![vec![0.0; 9]];
    g.bias = vec![1.0, 0.0, 1.0, 1.5, 1.5, 1.5, 2.0, 0.0, 0.0];
    g.groups = 3;
    g.topk_groups = 2;
    // Sums: g0 = 1.5 + 1.5 = 3, g1 = 2 + 2 = 4, g2 = 2.5 + 0.5 = 3 → groups 1, 0.
    let out = run_crate(&g).unwrap();
    assert_eq!(out.topk_idx.as_slice(), &[3, 4, 5, 0]);
    assert_matches_naive("planted ties", &g);
    // Random rows from a tiny value set: many ties everywhere.
    let mut rng = Rng::for_case("planted ties random");
    for scoring in SCORINGS {
        let mut g = gate(24, 5, scoring);
        g.logits = (0..40)
            .map(|_| (0..24).map(|_| rng.below(3) as f32 * 0.5).collect())
            .collect();
        g.bias = (0..24).map(|_| rng.below(2) as f32 * 0.25).collect();
        g.groups = 6;
        g.topk_groups = 3;
        assert_matches_naive(&format!("ties {scoring}"), &g);
    }
}

#[test]
fn overflowing_softmax_keys_follow_the_total_order() {
    // logit + bias overflows to +inf / -inf (finite inputs): keys are ordered with inf as a
    // value, and a group whose top-2 is (+inf, -inf) sums to NaN and ranks first.
    let big = f32::MAX;
    let mut g = gate(4, 2, Softmax);
    g.logits = vec![vec![big, big, -big, 0.0]];
    g.bias = vec![big, big, -big, 0.0];
    let out = run_crate(&g).unwrap();
    assert_eq!(out.topk_idx.as_slice(), &[0, 1]);
    // Groups (0,1) = inf + inf, (2,3) = 0 + -inf.
    g.groups = 2;
    g.topk_groups = 1;
    assert_eq!(run_crate(&g).unwrap().topk_idx.as_slice(), &[0, 1]);
    g.logits = vec![vec![big, -big, 1.0, 1.0]];
    g.bias = vec![big, -big, 0.0, 0.0];
    // Group 0 = inf + (-inf) = NaN ranks first; then expert 0 (inf), expert 1 (-inf).
    assert_eq!(run_crate(&g).unwrap().topk_idx.as_slice(), &[0, 1]);
    assert_matches_naive("overflowing keys", &g);
}

#[test]
fn non_finite_inputs_are_typed_errors() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut g = gate(4, 2, Sigmoid);
        g.logits = vec![vec![0.0; 4], vec![0.0, 0.0, bad, 0.0]];
        assert_param(run_crate(&g).unwrap_err(), "logits", &["logits[1, 2]"]);
        // Also for fix-routing tokens (their scores are needed).
        g.fix = Some(vec![false, true]);
        g.unmapped = Some(vec![vec![0, 1]; 2]);
        assert_param(run_crate(&g).unwrap_err(), "logits", &["logits[1, 2]"]);
        let mut g = gate(4, 2, Softmax);
        g.logits = vec![vec![0.0; 4]];
        g.bias[3] = bad;
        assert_param(run_crate(&g).unwrap_err(), "bias", &["bias[3]"]);
    }
}

// ---------------------------------------------------------------------------------------------
// Rejections.
// ---------------------------------------------------------------------------------------------

#[test]
fn parameter_rejections_name_the_argument() {
    let base = || {
        let mut g = gate(8, 2, Sigmoid);
        g.logits = vec![vec![0.0; 8]; 2];
        g
    };
    type Edit = Box<dyn Fn(&mut NaiveGate)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "identity",
            Box::new(|g| g.scoring = ScoringFunc::Identity),
            "scoring_func",
        ),
        ("k = 0", Box::new(|g| g.k = 0), "num_topk"),
        ("k > E", Box::new(|g| g.k = 9), "num_topk"),
        (
            "G without Gk",
            Box::new(|g| g.groups = 4),
            "num_topk_groups",
        ),
        (
            "Gk without G",
            Box::new(|g| g.topk_groups = 2),
            "num_topk_groups",
        ),
        (
            "Gk > G",
            Box::new(|g| {
                g.groups = 2;
                g.topk_groups = 4;
            }),
            "num_topk_groups",
        ),
        (
            "E % G",
            Box::new(|g| {
                g.groups = 3;
                g.topk_groups = 1;
            }),
            "num_groups",
        ),
        (
            "E % G, inactive",
            Box::new(|g| {
                g.groups = 3;
                g.topk_groups = 3;
            }),
            "num_groups",
        ),
        (
            "E / G = 1",
            Box::new(|g| {
                g.groups = 8;
                g.topk_groups = 4;
            }),
            "num_groups",
        ),
        (
            "K > Gk E / G",
            Box::new(|g| {
                g.groups = 4;
                g.topk_groups = 1;
                g.k = 3;
            }),
            "num_topk",
        ),
        (
            "S = 3",
            Box::new(|g| {
                g.shared = 3;
                g.map = Some(identity_map(11, 4));
            }),
            "num_shared_experts",
        ),
        (
            "K % S",
            Box::new(|g| {
                g.k = 3;
                g.shared = 2;
                g.map = Some(identity_map(10, 3));
            }),
            "num_shared_experts",
        ),
        (
            "E % (K / S)",
            Box::new(|g| {
                g.k = 3;
                g.shared = 1;
                g.map = Some(identity_map(9, 2));
            }),
            "num_shared_experts",
        ),
        (
            "S without map",
            Box::new(|g| g.shared = 1),
            "num_shared_experts",
        ),
        (
            "S > X",
            Box::new(|g| {
                g.shared = 2;
                g.map = Some(identity_map(10, 2));
            }),
            "num_shared_experts",
        ),
        (
            "rsf NaN",
            Box::new(|g| g.rsf = f32::NAN),
            "routed_scaling_factor",
        ),
        (
            "rsf inf",
            Box::new(|g| g.rsf = f32::INFINITY),
            "routed_scaling_factor",
        ),
        ("ep = 0", Box::new(|g| g.ep = 0), "ep_rank"),
        (
            "ep_rank >= ep",
            Box::new(|g| {
                g.ep = 2;
                g.ep_rank = 2;
            }),
            "ep_rank",
        ),
        (
            "R = 0",
            Box::new(|g| {
                g.ep = 9;
                g.ep_rank = 1;
            }),
            "num_ep_ranks",
        ),
        ("tp = 0", Box::new(|g| g.tp = 0), "tp_rank"),
        (
            "tp_rank >= tp",
            Box::new(|g| {
                g.tp = 2;
                g.tp_rank = 2;
            }),
            "tp_rank",
        ),
        (
            "fix without unmapped",
            Box::new(|g| g.fix = Some(vec![true; 2])),
            "fix_routing_mask",
        ),
    ];
    for (what, edit, arg) in cases {
        let mut g = base();
        edit(&mut g);
        let err = match run_crate(&g) {
            Err(e) => e,
            Ok(_) => panic!("{what}: accepted"),
        };
        assert!(matches!(err, TkError::Param { .. }), "{what}: {err:?}");
        assert_eq!(err_arg(&err), arg, "{what}: {err}");
    }
}

#[test]
fn data_rejections_name_the_tensor_and_position() {
    let base = || {
        let mut g = gate(4, 2, Sigmoid);
        g.logits = vec![vec![0.0; 4]; 3];
        g
    };
    let mut g = base();
    g.fix = Some(vec![false, false, true]);
    g.unmapped = Some(vec![vec![0, 0], vec![9, 9], vec![1, 4]]);
    assert_param(
        run_crate(&g).unwrap_err(),
        "unmapped_topk_idx",
        &["[2, 1] = 4"],
    );
    g.unmapped = Some(vec![vec![0, 0], vec![9, 9], vec![-1, 0]]);
    assert_param(
        run_crate(&g).unwrap_err(),
        "unmapped_topk_idx",
        &["[2, 0] = -1"],
    );
    // Rows that are not fix-routing may hold anything (row 1 above).
    g.unmapped = Some(vec![vec![0, 0], vec![9, 9], vec![3, 0]]);
    assert!(run_crate(&g).is_ok());

    let mut g = base();
    g.map = Some((vec![vec![0, 1]; 4], vec![1, 0, 1, 1]));
    assert_param(
        run_crate(&g).unwrap_err(),
        "logical_count",
        &["logical_count[1] = 0"],
    );
    g.map = Some((vec![vec![0, 1]; 4], vec![1, 1, 3, 1]));
    assert_param(
        run_crate(&g).unwrap_err(),
        "logical_count",
        &["logical_count[2] = 3"],
    );
    // Physical ids must lie in 0..E + X = 0..5 (for valid columns only).
    g.map = Some((
        vec![vec![0, 1], vec![5, 1], vec![2, 2], vec![3, 3]],
        vec![1; 4],
    ));
    assert_param(
        run_crate(&g).unwrap_err(),
        "to_physical_map",
        &["[1, 0] = 5"],
    );
    g.map = Some((
        vec![vec![0, -1], vec![1, 1], vec![2, 2], vec![3, 3]],
        vec![2, 1, 1, 1],
    ));
    assert_param(
        run_crate(&g).unwrap_err(),
        "to_physical_map",
        &["[0, 1] = -1"],
    );
    g.map = Some((
        vec![vec![0, -1], vec![4, 1], vec![2, 2], vec![3, 3]],
        vec![1; 4],
    ));
    assert!(run_crate(&g).is_ok());
}

#[test]
fn layout_rejections_name_the_tensor() {
    let logits = HostTensor::<f32>::from_vec(vec![0.0; 16], &[2, 8]).unwrap();
    let bias = HostTensor::<f32>::from_vec(vec![0.0; 8], &[8]).unwrap();
    let p = Top2SumGateParams::new(2, Sigmoid);
    let call = |inputs: Top2SumGateInputs<'_>, p: &Top2SumGateParams| {
        top2_sum_gate(&inputs, p).unwrap_err()
    };
    let short_bias = HostTensor::<f32>::from_vec(vec![0.0; 7], &[7]).unwrap();
    let e = call(Top2SumGateInputs::new(logits.view(), short_bias.view()), &p);
    assert!(matches!(e, TkError::Shape { arg: "bias", .. }), "{e:?}");
    let flat = HostTensor::<f32>::from_vec(vec![0.0; 16], &[16]).unwrap();
    let e = call(Top2SumGateInputs::new(flat.view(), bias.view()), &p);
    assert!(matches!(e, TkError::Shape { arg: "logits", .. }), "{e:?}");
    let empty = HostTensor::<f32>::from_vec(vec![], &[2, 0]).unwrap();
    let no_bias = HostTensor::<f32>::from_vec(vec![], &[0]).unwrap();
    let e = call(Top2SumGateInputs::new(empty.view(), no_bias.view()), &p);
    assert!(matches!(e, TkError::Empty { arg: "logits", .. }), "{e:?}");
    let cols = logits
        .view()
        .with_layout(tk_core::Layout::new(vec![2, 8], vec![1, 2], 0).unwrap())
        .unwrap();
    let e = call(Top2SumGateInputs::new(cols, bias.view()), &p);
    assert!(matches!(e, TkError::Stride { arg: "logits", .. }), "{e:?}");
    let mask3 = HostTensor::<u8>::from_vec(vec![1; 3], &[3]).unwrap();
    let e = call(
        Top2SumGateInputs::new(logits.view(), bias.view()).with_mask(mask3.view()),
        &p,
    );
    assert!(matches!(e, TkError::Shape { arg: "mask", .. }), "{e:?}");
    let u = HostTensor::<i64>::from_vec(vec![0; 6], &[2, 3]).unwrap();
    let e = call(
        Top2SumGateInputs::new(logits.view(), bias.view()).with_unmapped_topk_idx(u.view()),
        &p,
    );
    assert!(
        matches!(
            e,
            TkError::Shape {
                arg: "unmapped_topk_idx",
                ..
            }
        ),
        "{e:?}"
    );
    let u = HostTensor::<i64>::from_vec(vec![0; 4], &[2, 2]).unwrap();
    let ut = u
        .view()
        .with_layout(tk_core::Layout::new(vec![2, 2], vec![1, 2], 0).unwrap())
        .unwrap();
    let e = call(
        Top2SumGateInputs::new(logits.view(), bias.view()).with_unmapped_topk_idx(ut),
        &p,
    );
    assert!(
        matches!(
            e,
            TkError::Stride {
                arg: "unmapped_topk_idx",
                ..
            }
        ),
        "{e:?}"
    );
    let fix3 = HostTensor::<u8>::from_vec(vec![1; 3], &[3]).unwrap();
    let e = call(
        Top2SumGateInputs::new(logits.view(), bias.view()).with_fix_routing(fix3.view(), u.view()),
        &p,
    );
    assert!(
        matches!(
            e,
            TkError::Shape {
                arg: "fix_routing_mask",
                ..
            }
        ),
        "{e:?}"
    );
    let map = HostTensor::<i32>::from_vec(vec![0; 18], &[9, 2]).unwrap();
    let count = HostTensor::<i32>::from_vec(vec![1; 8], &[8]).unwrap();
    let e = call(
        Top2SumGateInputs::new(logits.view(), bias.view())
            .with_physical_map(map.view(), count.view()),
        &p,
    );
    assert!(
        matches!(
            e,
            TkError::Shape {
                arg: "to_physical_map",
                ..
            }
        ),
        "{e:?}"
    );
    let map0 = HostTensor::<i32>::from_vec(vec![], &[8, 0]).unwrap();
    let e = call(
        Top2SumGateInputs::new(logits.view(), bias.view())
            .with_physical_map(map0.view(), count.view()),
        &p,
    );
    assert!(
        matches!(
            e,
            TkError::Shape {
                arg: "to_physical_map",
                ..
            }
        ),
        "{e:?}"
    );
    let map = HostTensor::<i32>::from_vec(vec![0; 16], &[8, 2]).unwrap();
    let count9 = HostTensor::<i32>::from_vec(vec![1; 9], &[9]).unwrap();
    let e = call(
        Top2SumGateInputs::new(logits.view(), bias.view())
            .with_physical_map(map.view(), count9.view()),
        &p,
    );
    assert!(
        matches!(
            e,
            TkError::Shape {
                arg: "logical_count",
                ..
            }
        ),
        "{e:?}"
    );
    // The upstream constructor maps use_shared_as_routed = false to S = 0 and parses the label.
    let up = Top2SumGateParams::upstream(8, 4, 8, false, 2, 2.5, 0, 4, 1, 2, "SIGMOID").unwrap();
    assert_eq!(up.num_shared_experts, 0);
    assert_eq!((up.num_groups, up.num_topk_groups, up.tp_rank), (8, 4, 1));
    assert_eq!(up.scoring_func, Sigmoid);
    assert_param(
        Top2SumGateParams::upstream(8, 4, 8, true, 2, 2.5, 0, 4, 1, 2, "tanh").unwrap_err(),
        "scoring_func",
        &["tanh"],
    );
}

// ---------------------------------------------------------------------------------------------
// The 64-bit replica choice beyond upstream's int32 overflow.
// ---------------------------------------------------------------------------------------------

#[test]
fn replica_choice_is_64_bit_beyond_92037_tokens() {
    // E = 2, K = 1: every token selects logical expert 0 (all-zero logits, tie → 0), whose
    // replicas are physical 1, 2, 3 (count 3). ep_rank 7700 also overflows the int32 *sum* at
    // t = 92036 (7700 + 2 147 475 988 > 2^31 - 1), so it needs >= 7701 EP ranks: R = (E + X) /
    // 7701 >= 1 needs X >= 7699, i.e. D = 7700 columns.
    let t_count = UPSTREAM_REPLICA_OVERFLOW_TOKEN + 64;
    for (ep_rank, ep, d) in [(0usize, 1usize, 3usize), (7700, 7701, 7700)] {
        let e = 2;
        let logits = HostTensor::<f32>::from_vec(vec![0.0; t_count * e], &[t_count, e]).unwrap();
        let bias = HostTensor::<f32>::from_vec(vec![0.0; e], &[e]).unwrap();
        let mut map = vec![0i32; e * d];
        map[..3].copy_from_slice(&[1, 2, 3]);
        let map = HostTensor::from_vec(map, &[e, d]).unwrap();
        let count = HostTensor::from_vec(vec![3, 1], &[e]).unwrap();
        let inputs = Top2SumGateInputs::new(logits.view(), bias.view())
            .with_physical_map(map.view(), count.view());
        let params = Top2SumGateParams::new(1, Sigmoid).with_ep(ep_rank, ep);
        let out = top2_sum_gate(&inputs, &params).unwrap();
        let r = (e + d - 1) / ep; // experts per rank; one TP rank keeps ids as owner·R + id mod R
        let mut upstream_negative = 0;
        for t in 0..t_count {
            let c = ((ep_rank as u128 + t as u128 * 23_333) % 3) as usize;
            let id = [1i64, 2, 3][c];
            assert_eq!(
                out.topk_idx.as_slice()[t],
                id,
                "token {t}, ep_rank {ep_rank}, R {r}"
            );
            // Upstream's int32 arithmetic: a negative column from the overflow point on.
            let sum = (ep_rank as i32).wrapping_add((t as i32).wrapping_mul(23_333));
            if sum < 0 {
                upstream_negative += 1;
                assert!(sum % 3 <= 0, "C's % of a negative number is not positive");
            }
            if t < 92_036 {
                assert!(sum >= 0);
            }
        }
        assert!(
            upstream_negative >= 64,
            "the test must reach the int32 overflow"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Configurations: DeepSeek-V3 / V4, the spec's grid, beyond upstream's limits.
// ---------------------------------------------------------------------------------------------

/// The spec's test configs `(G, Gk, E, S, K)` (§4.5).
use tk_gating::top2_sum_gate::SPEC_CONFIGS;

/// The spec's loops (§4.5) with few tokens: pad {0, 10} × tp_rank {0, 1} × shared (when valid)
/// × scoring × fix routing, ep_rank 0 of 4, 2 TP ranks, rsf 1.5, identity map (E + S, 33).
#[test]
fn spec_grid_matches_naive() {
    let mut rng = Rng::for_case("top2_sum_gate spec grid");
    for (groups, topk_groups, e, s, k) in SPEC_CONFIGS {
        let shared_ok = k % s == 0 && e % (k / s) == 0;
        for pad in [0usize, 10] {
            for tp_rank in [0, 1] {
                for shared in [false, true] {
                    if shared && !shared_ok {
                        continue;
                    }
                    for scoring in SCORINGS {
                        for fix in [false, true] {
                            let t = 3 + pad;
                            let mut g = gate(e, k, scoring);
                            g.logits = randn_rows(&mut rng, t, e);
                            g.bias = (0..e).map(|_| rng.normal()).collect();
                            g.groups = groups;
                            g.topk_groups = topk_groups;
                            g.rsf = 1.5;
                            g.ep = 4;
                            g.tp = 2;
                            g.tp_rank = tp_rank;
                            if pad > 0 {
                                g.mask = Some((0..t).map(|i| i < 3).collect());
                            }
                            g.unmapped = Some(vec![vec![0; k]; t]);
                            if shared {
                                g.shared = s;
                                g.map = Some(identity_map(e + s, 33));
                            }
                            if fix {
                                g.fix = Some(vec![true; t]);
                                g.unmapped = Some(
                                    (0..t)
                                        .map(|_| {
                                            (0..k).map(|_| rng.below(e as u64) as i64).collect()
                                        })
                                        .collect(),
                                );
                            }
                            let what = format!(
                                "({groups},{topk_groups},{e},{s},{k}) pad {pad} tp {tp_rank} \
                                 shared {shared} {scoring} fix {fix}"
                            );
                            assert_matches_naive(&what, &g);
                        }
                    }
                }
            }
        }
    }
}

/// Random everything (mask, fix routing on some rows, a random physical map with several
/// replicas, ep_rank > 0) for one configuration, against the naive transcription.
#[allow(clippy::too_many_arguments)]
fn check_config(
    case: &str,
    t: usize,
    e: usize,
    k: usize,
    groups: (usize, usize),
    shared: usize,
    scoring: ScoringFunc,
    ranks: (usize, usize, usize, usize),
) {
    let mut rng = Rng::for_case(case);
    let mut g = gate(e, k, scoring);
    g.logits = randn_rows(&mut rng, t, e);
    g.bias = (0..e).map(|_| rng.normal()).collect();
    (g.groups, g.topk_groups) = groups;
    (g.ep_rank, g.ep, g.tp_rank, g.tp) = ranks;
    g.rsf = 2.5;
    g.shared = shared;
    g.mask = Some((0..t).map(|i| i % 5 != 4).collect());
    g.fix = Some((0..t).map(|i| i % 3 == 1).collect());
    g.unmapped = Some(
        (0..t)
            .map(|_| (0..k).map(|_| rng.below(e as u64) as i64).collect())
            .collect(),
    );
    // D = S + 3 replicas; every logical expert has 1..=D of them, physical ids in 0..E + X.
    let d = shared + 3;
    let x = d - 1;
    let logical = e + shared;
    let map: Vec<Vec<i32>> = (0..logical)
        .map(|_| (0..d).map(|_| rng.below((e + x) as u64) as i32).collect())
        .collect();
    let count: Vec<i32> = (0..logical)
        .map(|_| 1 + rng.below(d as u64) as i32)
        .collect();
    g.map = Some((map, count));
    assert_matches_naive(case, &g);
    // And the same without map, mask, fix routing and unmapped_topk_idx when S = 0.
    if shared == 0 {
        g.map = None;
        g.mask = None;
        g.fix = None;
        g.unmapped = None;
        assert_matches_naive(&format!("{case} plain"), &g);
    }
}

#[test]
fn deepseek_v3_configuration() {
    // 256 routed experts, 8 groups, top-4 groups, top-8, sigmoid with bias, scaling 2.5.
    for (t, ranks) in [(37, (0, 1, 0, 1)), (37, (5, 8, 1, 2)), (3, (0, 4, 0, 2))] {
        check_config("deepseek-v3", t, 256, 8, (8, 4), 0, Sigmoid, ranks);
    }
    check_config(
        "deepseek-v3 shared",
        37,
        256,
        8,
        (8, 4),
        1,
        Sigmoid,
        (3, 4, 1, 2),
    );
}

#[test]
fn deepseek_v4_configuration() {
    // 256 routed experts, top-6, sqrt-softplus, no groups.
    for (t, ranks) in [(37, (0, 1, 0, 1)), (37, (2, 4, 1, 2)), (1, (0, 1, 0, 1))] {
        check_config("deepseek-v4", t, 256, 6, (0, 0), 0, SqrtSoftplus, ranks);
    }
    // (Shared-as-routed is invalid here: neither 256 % 6 nor 256 % 3 is 0.)
    check_config(
        "deepseek-v4 ep",
        37,
        256,
        6,
        (0, 0),
        0,
        SqrtSoftplus,
        (1, 4, 0, 2),
    );
}

// Off-grid: 160 and 384 experts, top-k 4 and 7, 1 / 3 / 37 tokens; and every lifted upstream
// kernel limit: E % 4 != 0, K > 32, K + S > 32, G > 32, E / G > 32.
#[test_case(1, 160, 4, (0, 0), 0, Sigmoid; "E160 K4 T1")]
#[test_case(3, 160, 7, (8, 3), 0, SqrtSoftplus; "E160 K7 grouped T3")]
#[test_case(37, 160, 4, (20, 5), 2, Softmax; "E160 K4 shared2 T37")]
#[test_case(37, 384, 7, (12, 4), 0, Sigmoid; "E384 K7 grouped T37")]
#[test_case(3, 160, 4, (0, 0), 1, Sigmoid; "E160 K4 shared1 T3")]
#[test_case(3, 384, 4, (0, 0), 2, Softmax; "E384 K4 shared2 T3")]
#[test_case(1, 384, 7, (6, 2), 0, SqrtSoftplus; "E384 K7 T1")]
#[test_case(37, 6, 2, (0, 0), 0, Sigmoid; "E6 not a multiple of 4")]
#[test_case(37, 35, 5, (0, 0), 1, Softmax; "E35 odd shared")]
#[test_case(37, 37, 5, (0, 0), 0, Softmax; "E37 prime")]
#[test_case(37, 10, 3, (5, 2), 0, SqrtSoftplus; "E10 groups of 2")]
#[test_case(9, 384, 40, (0, 0), 0, Sigmoid; "K40 above the warp")]
#[test_case(9, 384, 32, (0, 0), 2, SqrtSoftplus; "K32 plus S2 above the warp")]
#[test_case(9, 384, 7, (64, 5), 0, Softmax; "G64 above the warp")]
#[test_case(9, 384, 8, (4, 2), 0, Sigmoid; "E over G 96 above the warp")]
#[test_case(9, 384, 96, (48, 20), 2, Sigmoid; "K96 shared2 G48")]
fn off_grid_and_lifted_limits_match_naive(
    t: usize,
    e: usize,
    k: usize,
    groups: (usize, usize),
    shared: usize,
    scoring: ScoringFunc,
) {
    let case = format!("off-grid {t} {e} {k} {groups:?} {shared} {scoring}");
    check_config(&case, t, e, k, groups, shared, scoring, (1, 2, 1, 2));
}

// ---------------------------------------------------------------------------------------------
// Against an f64 pipeline: what a GPU test will check (indices exact, weights in tolerance).
// ---------------------------------------------------------------------------------------------

/// With the gap-respecting generator, an f64 pipeline (scores, keys and weights in f64) selects
/// the same experts, and the fp32 weights are within the spec's `allclose` and within
/// `WEIGHT_ULPS` ulp of the f64 weights.
#[test]
fn f64_pipeline_agrees_on_gapped_inputs() {
    // Weight error budget (units of 2^-24, relative): scores <= 6 (sigmoid 3 ulp) or, for
    // softmax, |x - m| + 2 <= 12 (the shared Z cancels); the K-term sum <= K/2; the division
    // and the scaling 1 each. Doubled for ulps: <= 2 * (12 + 12 / 2 + 2) = 40 for K <= 12.
    const WEIGHT_ULPS: u64 = 40;
    let mut worst = 0;
    for (name, e, k, groups, scoring) in [
        ("v3", 256, 8, (8, 4), Sigmoid),
        ("v4", 256, 6, (0, 0), SqrtSoftplus),
        ("softmax", 144, 6, (0, 0), Softmax),
        ("softmax grouped", 96, 12, (8, 3), Softmax),
        ("sqrt grouped", 72, 6, (4, 2), SqrtSoftplus),
    ] {
        let params = Top2SumGateParams::new(k, scoring)
            .with_groups(groups.0, groups.1)
            .with_routed_scaling_factor(2.5);
        let mut rng = Rng::for_case(&format!("f64 pipeline {name}"));
        let (logits, bias) = gated_inputs(&mut rng, 64, e, &params, 10_000).unwrap();
        let out =
            top2_sum_gate(&Top2SumGateInputs::new(logits.view(), bias.view()), &params).unwrap();
        for t in 0..64 {
            let row = &logits.as_slice()[t * e..(t + 1) * e];
            let s = score_f64(scoring, row);
            let keys: Vec<f64> = (0..e)
                .map(|j| {
                    let base = if scoring == Softmax {
                        row[j] as f64
                    } else {
                        s[j]
                    };
                    base + bias.as_slice()[j] as f64
                })
                .collect();
            let mut cand: Vec<usize> = (0..e).collect();
            if groups.0 != groups.1 {
                let size = e / groups.0;
                let mut gs: Vec<(f64, usize)> = (0..groups.0)
                    .map(|q| {
                        let mut v = keys[q * size..(q + 1) * size].to_vec();
                        v.sort_by(|a, b| b.total_cmp(a));
                        (v[0] + v[1], q)
                    })
                    .collect();
                gs.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                let kept: Vec<usize> = gs[..groups.1].iter().map(|g| g.1).collect();
                cand.retain(|j| kept.contains(&(j / size)));
            }
            cand.sort_by(|&a, &b| keys[b].total_cmp(&keys[a]).then(a.cmp(&b)));
            cand.truncate(k);
            let got: Vec<usize> = out.topk_idx.as_slice()[t * k..(t + 1) * k]
                .iter()
                .map(|&i| i as usize)
                .collect();
            assert_eq!(got, cand, "{name}: row {t}");
            let den: f64 = cand.iter().map(|&j| s[j]).sum();
            for (slot, &j) in cand.iter().enumerate() {
                let w64 = s[j] / den * 2.5;
                let w = out.topk_weights.as_slice()[t * k + slot];
                assert!(
                    allclose(w, w64 as f32),
                    "{name}: row {t} slot {slot}: {w} vs {w64}"
                );
                let d = ulp_distance(w, w64 as f32);
                worst = worst.max(d);
                assert!(d <= WEIGHT_ULPS, "{name}: row {t} slot {slot}: {d} ulp");
            }
        }
    }
    // The comparison is not vacuous: fp32 rounding is visible.
    assert!(worst >= 1);
}

#[test]
fn generator_enforces_the_gaps() {
    use tk_gating::testing::{has_ranking_gaps, ranking_keys};
    let params = Top2SumGateParams::new(8, Sigmoid).with_groups(8, 4);
    let mut rng = Rng::for_case("generator gaps");
    let (logits, bias) = gated_inputs(&mut rng, 16, 256, &params, 10_000).unwrap();
    for t in 0..16 {
        let keys = ranking_keys(
            &logits.as_slice()[t * 256..(t + 1) * 256],
            bias.as_slice(),
            Sigmoid,
        );
        assert!(has_ranking_gaps(&keys, &params));
    }
    // A row of equal keys has no gaps; an impossible request is a typed error.
    assert!(!has_ranking_gaps(
        &[1.0; 16],
        &Top2SumGateParams::new(2, Sigmoid)
    ));
    let tiny = Top2SumGateParams::new(2, Sigmoid);
    assert!(has_ranking_gaps(&[3.0, 2.0, 1.0], &tiny));
    assert!(!has_ranking_gaps(&[3.0, 2.0, 2.0000005], &tiny));
    let err = gated_inputs(&mut rng, 1, 1, &Top2SumGateParams::new(1, Sigmoid), 0).unwrap_err();
    assert_param(err, "params", &["draw"]);
}
