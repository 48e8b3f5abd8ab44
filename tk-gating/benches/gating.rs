//! Gating benchmarks at the spec's shapes (`spec/moe.md` §6), plus the DeepSeek-V3 grouped gate
//! at decode and prefill sizes:
//! * `topk_gate`: `scores (T, E)` fp32, `T ∈ {4001, 8001}` × the 10 `(E, K)` pairs;
//!   bytes `4TE + 8TK`;
//! * `topk_sum_and_topk_group_idx`: `scores (T, G, E/G)`, `T ∈ {4001, 8001}` × (E, G) ∈
//!   {(72,4), (72,8), (72,12), (256,4), (256,8), (256,16)} × sum {1, 2} × Gk {2, 4}; bytes
//!   `4TE + 8T·Gk`;
//! * `top2_sum_gate`: `logits (36, E)` (32 routed + 4 masked tokens), the 11 `(G, Gk, E, S, K)`
//!   configurations × {sigmoid, sqrtsoftplus, softmax}; tp_rank 1 of 2, ep_rank 0 of 4, rsf 1.5,
//!   shared-as-routed when valid (identity map `(E + S, 33)`), `unmapped_topk_idx` passed;
//!   bytes `4·36·E + 4E` (logits + bias, the spec's count);
//! * `deepseek_v3_gate`: `top2_sum_gate` with 256 experts, 8 groups, top-4 groups, top-8,
//!   sigmoid, bias, rsf 2.5 at `T ∈ {1, 16, 64, 256, 8001}`; bytes `4TE + 4E`.
//!
//! Where `bench/upstream-h200.md` has a row for the case, its time is printed beside ours.
//!
//! Run: `cargo xtask bench gating` (or the gpu-bundle); args: `[filter] [--jsonl <path>]`.

use tk_core::bench::Bench;
use tk_core::testing::{generate_num_tokens, Rng};
use tk_core::{Device, DeviceTensor, HostTensor, Result};
use tk_gating::scoring::ScoringFunc::{self, Sigmoid, Softmax, SqrtSoftplus};
use tk_gating::{
    Top2SumGateDeviceInputs, Top2SumGateParams, TopkGateParams, TopkSumAndTopkGroupIdxParams,
};

/// Upstream's measured µs on our H200 (`bench/upstream-h200.md`): (op, params, µs, note).
const UPSTREAM: &[(&str, &str, f64, &str)] = &[
    ("topk_gate", "T=8001 E=256 K=8", 11.0, ""),
    ("topk_gate", "T=8001 E=72 K=6", 7.3, ""),
    ("topk_gate", "T=8001 E=128 K=6", 7.6, "2.1.0"),
    ("topk_gate", "T=8001 E=32 K=6", 7.2, "2.1.0"),
    (
        "topk_sum_and_topk_group_idx",
        "T=8001 E=256 G=8 sum=2 Gk=4",
        7.6,
        "",
    ),
    ("top2_sum_gate", "T=36 (8,4,256,2,8) sigmoid", 7.0, ""),
    (
        "deepseek_v3_gate",
        "T=8001",
        14.3,
        "2.1.0 moe_topk_gate_forward, 256+2 shared, K=8, more options",
    ),
];

fn randn(dev: &Device, seed: &str, shape: &[usize]) -> Result<DeviceTensor<f32>> {
    dev.upload(&Rng::for_case(seed).randn(shape, |x| x))
}

fn bench_topk_gate(b: &mut Bench) -> Result<()> {
    let dev = b.device().clone();
    for t in generate_num_tokens(1, true) {
        for (e, k) in tk_gating::topk_gate::SPEC_CONFIGS {
            let p = format!("T={t} E={e} K={k}");
            if !b.enabled("topk_gate", &p) {
                continue;
            }
            let x = randn(&dev, &p, &[t, e])?;
            let mut out = dev.alloc::<i64>(&[t, k])?;
            let params = TopkGateParams::new(k);
            b.run("topk_gate", &p, 4 * t * e + 8 * t * k, || {
                tk_gating::topk_gate_into(&x.view(), &params, &mut out.view_mut())
            })?;
        }
    }
    Ok(())
}

fn bench_topk_group(b: &mut Bench) -> Result<()> {
    let dev = b.device().clone();
    for t in generate_num_tokens(1, true) {
        for (e, g) in tk_gating::topk_sum_and_topk_group_idx::SPEC_CONFIGS {
            for n in [1, 2] {
                for gk in [2, 4] {
                    let p = format!("T={t} E={e} G={g} sum={n} Gk={gk}");
                    if !b.enabled("topk_sum_and_topk_group_idx", &p) {
                        continue;
                    }
                    let x = randn(&dev, &p, &[t, g, e / g])?;
                    let mut out = dev.alloc::<i64>(&[t, gk])?;
                    let params = TopkSumAndTopkGroupIdxParams::new(n, gk);
                    b.run(
                        "topk_sum_and_topk_group_idx",
                        &p,
                        4 * t * e + 8 * t * gk,
                        || {
                            tk_gating::topk_sum_and_topk_group_idx_into(
                                &x.view(),
                                &params,
                                &mut out.view_mut(),
                            )
                        },
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// One `top2_sum_gate` case: `t` rows of which the last `masked` are padding; with `shared`
/// slots, the identity map `(E + S, 33)`.
#[allow(clippy::too_many_arguments)]
fn bench_gate(
    b: &mut Bench,
    op: &str,
    p: &str,
    t: usize,
    masked: usize,
    e: usize,
    params: Top2SumGateParams,
    unmapped: bool,
) -> Result<()> {
    if !b.enabled(op, p) {
        return Ok(());
    }
    let dev = b.device().clone();
    let logits = randn(&dev, p, &[t, e])?;
    let bias = randn(&dev, &format!("{p} bias"), &[e])?;
    let mask = dev.upload(&HostTensor::from_fn(&[t], |i| (i < t - masked) as u8))?;
    let s = params.num_shared_experts;
    let map = dev.upload(&HostTensor::from_fn(&[e + s, 33], |i| (i / 33) as i32))?;
    let count = dev.upload(&HostTensor::from_vec(vec![1i32; e + s], &[e + s])?)?;
    let mut inputs = Top2SumGateDeviceInputs::new(logits.view(), bias.view());
    if masked > 0 {
        inputs = inputs.with_mask(mask.view());
    }
    if s > 0 {
        inputs = inputs.with_physical_map(map.view(), count.view());
    }
    let k = params.num_topk;
    let mut u = dev.zeros::<i64>(&[t, k])?;
    let mut idx = dev.alloc::<i64>(&[t, k + s])?;
    let mut w = dev.alloc::<f32>(&[t, k + s])?;
    b.run(op, p, 4 * t * e + 4 * e, || {
        let mut uv = u.view_mut();
        tk_gating::top2_sum_gate_into(
            &inputs,
            unmapped.then_some(&mut uv),
            &params,
            &mut idx.view_mut(),
            &mut w.view_mut(),
        )
    })
}

fn bench_top2(b: &mut Bench) -> Result<()> {
    let scorings: [ScoringFunc; 3] = [Sigmoid, SqrtSoftplus, Softmax];
    for (g, gk, e, s, k) in tk_gating::top2_sum_gate::SPEC_CONFIGS {
        let shared = k % s == 0 && e % (k / s) == 0;
        for f in scorings {
            let mut params = Top2SumGateParams::new(k, f)
                .with_groups(g, gk)
                .with_routed_scaling_factor(1.5)
                .with_ep(0, 4)
                .with_tp(1, 2);
            if shared {
                params = params.with_shared_as_routed(s);
            }
            let p = format!("T=36 ({g},{gk},{e},{s},{k}) {f}");
            bench_gate(b, "top2_sum_gate", &p, 36, 4, e, params, true)?;
        }
    }
    let (e, k, g, gk, f) = tk_gating::DEEPSEEK_V3;
    for t in [1, 16, 64, 256, 8001] {
        let params = Top2SumGateParams::new(k, f)
            .with_groups(g, gk)
            .with_routed_scaling_factor(2.5);
        bench_gate(
            b,
            "deepseek_v3_gate",
            &format!("T={t}"),
            t,
            0,
            e,
            params,
            false,
        )?;
    }
    Ok(())
}

fn main() -> Result<()> {
    let Some(mut b) = Bench::from_args()? else {
        return Ok(());
    };
    let (e, k, g, gk, f) = tk_gating::DEEPSEEK_V3;
    b.report_compile_times(&tk_gating::top2_sum_gate::kernel_spec(e, k, g, gk, f))?;
    bench_topk_gate(&mut b)?;
    bench_topk_group(&mut b)?;
    bench_top2(&mut b)?;
    let records = b.finish()?;
    println!(
        "\n| op | params | ours µs | upstream µs | ours / upstream | upstream row |\n|---|---|---:|---:|---:|---|"
    );
    for (op, p, up, note) in UPSTREAM {
        if let Some(r) = records.iter().find(|r| r.op == *op && r.params == *p) {
            println!(
                "| {op} | {p} | {:.2} | {up:.1} | {:.2} | {note} |",
                r.median_us,
                r.median_us / up
            );
        }
    }
    Ok(())
}
