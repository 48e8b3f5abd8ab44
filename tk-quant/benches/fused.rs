//! Benchmarks of the fused tk-quant ops at the spec's shapes (`spec/quant.md` §6): SwiGLU
//! forward + per-token cast (§3.10), SwiGLU backward + per-token cast (§3.11), SwiGLU forward +
//! per-channel cast (+ transpose) (§3.12), per-channel cast + transpose (§3.7) and
//! `per_channel_cast_fused` (§3.6), with upstream's µs from `bench/upstream-h200.md` beside
//! ours where it has a row.
//!
//! Bytes counted as upstream's `count_bytes` (§6): every input read once and every output
//! written once (scale tensors by their logical elements, 4 bytes each; layout C counts its
//! int32 words). MoE-driven row counts come from the spec's generator (4001 tokens per rank),
//! so they differ slightly from upstream's run (printed in the params as `N=`; the upstream
//! join ignores it). Inputs are standard normals (random bit patterns would hit the slow
//! paths of `expf` and the division on NaN / inf / subnormal values).
//!
//! Run: `cargo xtask bench quant` (or the gpu-bundle); args: `[filter] [--jsonl <path>]`.

use half::bf16;
use tk_core::bench::Bench;
use tk_core::testing::{generate_hidden_sizes, par_randn, Rng};
use tk_core::{Device, DeviceTensor, HostTensor, Result};
use tk_moe::get_fused_mapping::{FusedRows, GetFusedMappingParams};
use tk_moe::reference::{get_fused_mapping, FusedMapping};
use tk_moe::testing::{generate_moe_params_with, generate_topk_idx, MoeParams};
use tk_quant::{
    CastFormat, DeviceCastInput, DeviceFusedInput, DevicePlainInput, DeviceQuantData, DeviceScales,
    DeviceSwigluBackwardInputs, DeviceSwigluBackwardOutputsMut, DeviceSwigluForwardInputs,
    DeviceSwigluOutMut, DeviceTopkWeights, PerChannelCastAndTransposeParams,
    PerChannelCastFusedParams, PerTokenCastParams, ScaleOptions, SwigluBackwardParams,
    SwigluForwardParams, SwigluOutFormat, SwigluPerChannelParams,
};

/// Upstream's measured µs on our H200 (`bench/upstream-h200.md`): (op, params without `N=`, µs).
const UPSTREAM: &[(&str, &str, f64)] = &[
    (
        "swiglu_forward_and_per_token_cast",
        "K=8 256/EP8 H=3584 e4m3 npc=128 C clamp=0.5 pte",
        426.2,
    ),
    (
        "swiglu_forward_and_per_token_cast",
        "K=8 256/EP8 H=3584 e4m3 npc=128 C clamp=0.5",
        407.0,
    ),
    (
        "swiglu_forward_and_per_token_cast",
        "K=8 256/EP8 H=2048 e4m3 npc=128 C clamp=0.5 pte",
        134.1,
    ),
    // 2.1.0 rows (its "psum layout" row order and a routed scaling factor of 2.5 with the
    // weights; the same bytes and arithmetic per element otherwise).
    (
        "swiglu_forward_and_per_token_cast",
        "K=6 256/EP8 H=3584 fp32 weights",
        189.6,
    ),
    (
        "swiglu_forward_and_per_token_cast",
        "K=6 256/EP8 H=3584 fp32 clamp=0.5",
        185.2,
    ),
    (
        "swiglu_forward_and_per_token_cast",
        "K=6 256/EP8 H=3584 bf16 clamp=0.5",
        155.1,
    ),
    (
        "swiglu_forward_and_per_token_cast",
        "K=6 256/EP8 H=3584 e4m3 npc=128 C clamp=0.5",
        153.9,
    ),
    (
        "swiglu_forward_and_per_token_cast",
        "K=6 256/EP8 H=3584 bf16 weights",
        147.7,
    ),
    (
        "swiglu_forward_and_per_token_cast",
        "K=6 256/EP8 H=3584 e4m3 npc=128 C weights",
        132.0,
    ),
    (
        "swiglu_backward_and_per_token_cast",
        "K=8 256/EP8 H=7168 npc=128 round clamp=None",
        1065.9,
    ),
    (
        "swiglu_forward_and_per_channel_cast_and_transpose",
        "8064x7168 npt=128 transposed round clamp=None",
        106.6,
    ),
    (
        "swiglu_forward_and_per_channel_cast_and_transpose",
        "4096x2048 npt=128 transposed round clamp=None",
        22.0,
    ),
    (
        "per_channel_cast_and_transpose",
        "8064x7168 npt=128 round",
        47.7,
    ),
    ("per_channel_cast_fused", "plain K=7168 bf16 round", 25.1),
];

/// A device buffer of `rows × cols` bf16 normals, with `(r, c)` views of its first rows.
struct Normals {
    t: DeviceTensor<bf16>,
}

impl Normals {
    fn new(dev: &Device, len: usize, seed: u64) -> Result<Self> {
        let h = par_randn(&[len], seed, bf16::from_f32);
        Ok(Self { t: dev.upload(&h)? })
    }

    /// The first `r · c` elements as a contiguous `(r, c)` matrix.
    fn matrix(&self, r: usize, c: usize) -> Result<tk_core::DeviceView<'_, bf16>> {
        self.t
            .view()
            .with_layout(tk_core::Layout::contiguous(&[r, c]))
    }
}

/// One MoE routing at the spec's sizes (4001 tokens per rank) with `alignment`.
struct Moe {
    name: String,
    t: usize,
    k: usize,
    map: FusedMapping,
}

impl Moe {
    fn new(p: &MoeParams, alignment: usize) -> Result<Self> {
        let mut rng = Rng::for_case(&format!("bench {} a={alignment}", p.name()));
        let idx = generate_topk_idx(&mut rng, p)?;
        let map = get_fused_mapping(
            &idx.view(),
            &GetFusedMappingParams {
                num_experts: p.num_experts,
                alignment,
                rows: FusedRows::HostSync,
            },
        )?;
        Ok(Self {
            name: format!(
                "K={} {}/EP{}",
                p.num_topk,
                p.global_experts(),
                p.num_ep_ranks
            ),
            t: idx.shape()[0],
            k: p.num_topk,
            map,
        })
    }

    fn n(&self) -> usize {
        self.map.num_rows()
    }
}

/// Bytes of a scale tensor as upstream counts them (its logical elements, 4 bytes each).
fn sf_bytes(s: &DeviceScales) -> usize {
    let [r, c] = s.grid().shape(s.layout());
    4 * r * c
}

/// Adds the `N=` of a MoE case to its params (the upstream join strips it again).
fn with_n(p: &str, n: usize) -> String {
    format!("{p} N={n}")
}

fn bench_swiglu_forward(b: &mut Bench, x: &Normals) -> Result<()> {
    let dev = b.device().clone();
    for moe in generate_moe_params_with(true, false) {
        let m = Moe::new(&moe, 16)?;
        let n = m.n();
        let pte = dev.upload(&m.map.pos_to_expert)?;
        for h in [1024, 1280, 1536, 2048, 3072, 3584] {
            for with_pte in [true, false] {
                for clamp in [None, Some(0.5f32)] {
                    let mut params = SwigluForwardParams::cast(
                        CastFormat::E4M3,
                        128,
                        ScaleOptions::packed_ue8m0(),
                    );
                    params.swiglu_clamp_value = clamp;
                    let base = format!(
                        "{} H={h} e4m3 npc=128 C clamp={}{}",
                        m.name,
                        clamp.map_or("None".into(), |c| c.to_string()),
                        if with_pte { " pte" } else { "" }
                    );
                    let p = with_n(&base, n);
                    if !b.enabled("swiglu_forward_and_per_token_cast", &p) {
                        continue;
                    }
                    let inputs = DeviceSwigluForwardInputs {
                        x: DevicePlainInput::BF16(x.matrix(n, 2 * h)?),
                        topk: None,
                        pos_to_expert: with_pte.then(|| pte.view()),
                    };
                    let out = tk_quant::swiglu_forward_and_per_token_cast(&inputs, &params)?;
                    let tk_quant::DeviceSwigluOut::Quantized(mut d, mut s) = out.out else {
                        unreachable!("e4m3 output")
                    };
                    let bytes = n * 2 * h * 2 + n * h + sf_bytes(&s);
                    b.run("swiglu_forward_and_per_token_cast", &p, bytes, || {
                        let mut o = DeviceSwigluOutMut::Quantized(d.view_mut(), &mut s);
                        tk_quant::swiglu_forward_and_per_token_cast_into(
                            &inputs, &params, &mut o, None,
                        )
                    })?;
                }
            }
        }
    }
    Ok(())
}

/// The formats and weights upstream 2.1.0 benchmarks: K=6, 256 experts / EP8, H=3584, fp32 /
/// bf16 / e4m3 output, with the clamp 0.5 or with routing weights; e4m3 with the clamp is the
/// spec grid's case of the same name ([`bench_swiglu_forward`]), measured there only.
fn bench_swiglu_forward_formats(b: &mut Bench, x: &Normals) -> Result<()> {
    let dev = b.device().clone();
    let moe = MoeParams {
        num_send_tokens: 4001,
        num_topk: 6,
        num_experts: 32,
        num_ep_ranks: 8,
    };
    let m = Moe::new(&moe, 16)?;
    let (n, h) = (m.n(), 3584);
    let ptt = dev.upload(&m.map.pos_to_token_topk)?;
    let mut rng = Rng::for_case("bench fwd weights");
    let w = dev.upload(&HostTensor::from_fn(&[m.t, m.k], |_| rng.normal()))?;
    for weights in [false, true] {
        for fmt in ["fp32", "bf16", "e4m3"] {
            if fmt == "e4m3" && !weights {
                continue;
            }
            let mut params = match fmt {
                "fp32" => SwigluForwardParams::plain(SwigluOutFormat::F32),
                "bf16" => SwigluForwardParams::plain(SwigluOutFormat::BF16),
                _ => SwigluForwardParams::cast(CastFormat::E4M3, 128, ScaleOptions::packed_ue8m0()),
            };
            if !weights {
                params.swiglu_clamp_value = Some(0.5);
            }
            let npc = if fmt == "e4m3" { " npc=128 C" } else { "" };
            let what = if weights { "weights" } else { "clamp=0.5" };
            let p = with_n(&format!("{} H={h} {fmt}{npc} {what}", m.name), n);
            if !b.enabled("swiglu_forward_and_per_token_cast", &p) {
                continue;
            }
            let inputs = DeviceSwigluForwardInputs {
                x: DevicePlainInput::BF16(x.matrix(n, 2 * h)?),
                topk: weights.then(|| DeviceTopkWeights {
                    pos_to_token_topk: ptt.view(),
                    topk_weights: w.view(),
                }),
                pos_to_expert: None,
            };
            let mut out = tk_quant::swiglu_forward_and_per_token_cast(&inputs, &params)?.out;
            let out_bytes = match &out {
                tk_quant::DeviceSwigluOut::F32(_) => 4 * n * h,
                tk_quant::DeviceSwigluOut::BF16(_) => 2 * n * h,
                tk_quant::DeviceSwigluOut::Quantized(_, s) => n * h + sf_bytes(s),
            };
            // The spec's count: x, out, out_sf (the weights are not counted).
            let bytes = n * 2 * h * 2 + out_bytes;
            b.run("swiglu_forward_and_per_token_cast", &p, bytes, || {
                let mut o = match &mut out {
                    tk_quant::DeviceSwigluOut::F32(t) => DeviceSwigluOutMut::F32(t.view_mut()),
                    tk_quant::DeviceSwigluOut::BF16(t) => DeviceSwigluOutMut::BF16(t.view_mut()),
                    tk_quant::DeviceSwigluOut::Quantized(d, s) => {
                        DeviceSwigluOutMut::Quantized(d.view_mut(), s)
                    }
                };
                tk_quant::swiglu_forward_and_per_token_cast_into(&inputs, &params, &mut o, None)
            })?;
        }
    }
    Ok(())
}

fn bench_swiglu_backward(b: &mut Bench, x: &Normals) -> Result<()> {
    let dev = b.device().clone();
    for moe in generate_moe_params_with(true, false) {
        for npc in [32, 128] {
            let m = Moe::new(&moe, npc)?;
            let (n, t, k) = (m.n(), m.t, m.k);
            let ptt = dev.upload(&m.map.pos_to_token_topk)?;
            let ttp = dev.upload(&m.map.token_topk_to_pos)?;
            let mut rng = Rng::for_case(&format!("bench bwd weights {}", m.name));
            let weight = dev.upload(&HostTensor::from_fn(&[t, k], |_| rng.uniform()))?;
            for h in generate_hidden_sizes(128) {
                let ps: Vec<(Option<f32>, String)> = [None, Some(0.5f32)]
                    .into_iter()
                    .map(|c| {
                        let base = format!(
                            "{} H={h} npc={npc} round clamp={}",
                            m.name,
                            c.map_or("None".into(), |c| c.to_string())
                        );
                        (c, with_n(&base, n))
                    })
                    .filter(|(_, p)| b.enabled("swiglu_backward_and_per_token_cast", p))
                    .collect();
                if ps.is_empty() {
                    continue;
                }
                // x: the per-token e4m3 cast (fp32 scales) of normals, as the spec's test.
                let cast =
                    PerTokenCastParams::new(CastFormat::E4M3, npc, ScaleOptions::row_major(false));
                let xin = DeviceCastInput::Plain(DevicePlainInput::BF16(x.matrix(n, 2 * h)?));
                let (q, qs) = tk_quant::per_token_cast(&xin, &cast)?;
                let (DeviceQuantData::E4M3(q), tk_quant::DeviceScaleView::F32(qsv)) =
                    (&q, qs.view()?)
                else {
                    unreachable!("e4m3 data with fp32 scales")
                };
                let grad = x.matrix(n, h)?;
                let inputs = DeviceSwigluBackwardInputs {
                    x: q.view(),
                    x_sf: qsv,
                    grad_out: grad,
                    weight: weight.view(),
                    pos_to_token_topk: ptt.view(),
                    token_topk_to_pos: ttp.view(),
                };
                for (clamp, p) in ps {
                    let params = SwigluBackwardParams::new(npc, true, clamp);
                    let mut o = tk_quant::swiglu_backward_and_per_token_cast(&inputs, &params)?;
                    let sfb = 4 * n * (2 * h / npc);
                    let bytes = (n * 2 * h + sfb)
                        + n * h * 2
                        + 4 * t * k
                        + 4 * n
                        + 4 * t * k
                        + n * h * 2
                        + (n * 2 * h + sfb)
                        + n * 2 * h * 2
                        + 4 * t * k;
                    b.run("swiglu_backward_and_per_token_cast", &p, bytes, || {
                        let DeviceQuantData::E4M3(xq) = &mut o.x_grad_fp8 else {
                            unreachable!("e4m3 data")
                        };
                        let mut outs = DeviceSwigluBackwardOutputsMut {
                            out: o.out.view_mut(),
                            x_grad_fp8: xq.view_mut(),
                            x_grad_fp8_sf: &mut o.x_grad_fp8_sf,
                            x_grad: o.x_grad.view_mut(),
                            weight_grad: o.weight_grad.view_mut(),
                        };
                        tk_quant::swiglu_backward_and_per_token_cast_into(
                            &inputs, &params, &mut outs,
                        )
                    })?;
                }
            }
        }
    }
    Ok(())
}

fn bench_swiglu_per_channel(b: &mut Bench, x: &Normals) -> Result<()> {
    for m in [4096, 8064] {
        for h in [576, 2048, 2560, 3072, 4096, 6144, 7168] {
            for npt in [32, 128] {
                for without_transpose in [true, false] {
                    for round in [true, false] {
                        for clamp in [None, Some(0.5f32)] {
                            let p = format!(
                                "{m}x{h} npt={npt} {}{} clamp={}",
                                if without_transpose {
                                    "plain"
                                } else {
                                    "transposed"
                                },
                                if round { " round" } else { "" },
                                clamp.map_or("None".into(), |c| c.to_string())
                            );
                            let op = "swiglu_forward_and_per_channel_cast_and_transpose";
                            if !b.enabled(op, &p) {
                                continue;
                            }
                            let params = SwigluPerChannelParams {
                                num_per_tokens: npt,
                                round_sf: round,
                                without_transpose,
                                swiglu_clamp_value: clamp,
                            };
                            let xv = x.matrix(m, 2 * h)?;
                            let (mut d, mut s) =
                                tk_quant::swiglu_forward_and_per_channel_cast_and_transpose(
                                    &xv, &params,
                                )?;
                            let bytes = m * 2 * h * 2 + m * h + sf_bytes(&s);
                            b.run(op, &p, bytes, || {
                                tk_quant::swiglu_forward_and_per_channel_cast_and_transpose_into(
                                    &xv,
                                    &params,
                                    &mut d.view_mut(),
                                    &mut s,
                                )
                            })?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn bench_per_channel_transpose(b: &mut Bench, x: &Normals) -> Result<()> {
    for m in [4096, 8064] {
        for k in generate_hidden_sizes(64) {
            for round in [true, false] {
                for npt in [32, 128] {
                    let p = format!("{m}x{k} npt={npt}{}", if round { " round" } else { "" });
                    if !b.enabled("per_channel_cast_and_transpose", &p) {
                        continue;
                    }
                    let params = PerChannelCastAndTransposeParams::new(npt, round);
                    let xv = x.matrix(m, k)?;
                    let (mut d, mut s) = tk_quant::per_channel_cast_and_transpose(&xv, &params)?;
                    let bytes = m * k * 2 + m * k + sf_bytes(&s);
                    b.run("per_channel_cast_and_transpose", &p, bytes, || {
                        tk_quant::per_channel_cast_and_transpose_into(
                            &xv,
                            &params,
                            &mut d.view_mut(),
                            &mut s,
                        )
                    })?;
                }
            }
        }
    }
    Ok(())
}

fn bench_per_channel_fused(b: &mut Bench, x: &Normals) -> Result<()> {
    let dev = b.device().clone();
    // The spec's sources: the plain 4096-token case and the MoE cases with top-k 6.
    let mut sources: Vec<Option<Moe>> = vec![None];
    for moe in generate_moe_params_with(true, false) {
        if moe.num_topk == 6 {
            sources.push(Some(Moe::new(&moe, 128)?));
        }
    }
    for src in &sources {
        let (n_in, name) = match src {
            None => (4096, "plain".to_string()),
            Some(m) => (m.n(), m.name.clone()),
        };
        let map = src
            .as_ref()
            .map(|m| dev.upload(&m.map.pos_to_token))
            .transpose()?;
        for k in generate_hidden_sizes(128) {
            for fused in [false, true] {
                for round in [false, true] {
                    let base = format!(
                        "{name} K={k} {}{}",
                        if fused { "e4m3+sf" } else { "bf16" },
                        if round { " round" } else { "" }
                    );
                    let p = if src.is_some() {
                        with_n(&base, n_in)
                    } else {
                        base
                    };
                    if !b.enabled("per_channel_cast_fused", &p) {
                        continue;
                    }
                    let xv = x.matrix(n_in, k)?;
                    let cast = PerTokenCastParams::new(
                        CastFormat::E4M3,
                        128,
                        ScaleOptions::row_major(false),
                    );
                    let q = if fused {
                        Some(tk_quant::per_token_cast(
                            &DeviceCastInput::Plain(DevicePlainInput::BF16(xv.clone())),
                            &cast,
                        )?)
                    } else {
                        None
                    };
                    let (din, in_bytes) = match &q {
                        Some((DeviceQuantData::E4M3(d), s)) => {
                            let tk_quant::DeviceScaleView::F32(sv) = s.view()? else {
                                unreachable!("fp32 scales")
                            };
                            (
                                DeviceFusedInput::Quantized {
                                    data: d.view(),
                                    sf: sv,
                                },
                                n_in * k + 4 * n_in * (k / 128),
                            )
                        }
                        Some(_) => unreachable!("e4m3 data"),
                        None => (
                            DeviceFusedInput::Plain(DevicePlainInput::BF16(xv)),
                            2 * n_in * k,
                        ),
                    };
                    let params = if fused {
                        PerChannelCastFusedParams::fused(round)
                    } else {
                        PerChannelCastFusedParams::plain(round)
                    };
                    let mv = map.as_ref().map(|m| m.view());
                    let (mut d, mut s) =
                        tk_quant::per_channel_cast_fused(&din, mv.as_ref(), &params)?;
                    let n_out = mv.as_ref().map_or(n_in, |m| m.shape()[0]);
                    let bytes = in_bytes
                        + 4 * mv.as_ref().map_or(0, |m| m.shape()[0])
                        + n_out * k
                        + sf_bytes(&s);
                    b.run("per_channel_cast_fused", &p, bytes, || {
                        tk_quant::per_channel_cast_fused_into(
                            &din,
                            mv.as_ref(),
                            &params,
                            &mut d.view_mut(),
                            &mut s,
                        )
                    })?;
                }
            }
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let Some(mut b) = Bench::from_args()? else {
        return Ok(());
    };
    // Enough normals for the largest input: ~36k MoE rows x 2 x 7168 bf16.
    let x = Normals::new(b.device(), 40_000 * 2 * 7168, 0x5EED)?;
    bench_swiglu_forward(&mut b, &x)?;
    bench_swiglu_forward_formats(&mut b, &x)?;
    bench_swiglu_backward(&mut b, &x)?;
    bench_swiglu_per_channel(&mut b, &x)?;
    bench_per_channel_transpose(&mut b, &x)?;
    bench_per_channel_fused(&mut b, &x)?;
    let records = b.finish()?;
    println!(
        "\n| op | params | ours µs | upstream µs | ours / upstream |\n|---|---|---:|---:|---:|"
    );
    for (op, p, up) in UPSTREAM {
        let hit = records.iter().find(|r| {
            r.op == *op
                && (r.params == *p
                    || r.params
                        .strip_prefix(*p)
                        .is_some_and(|s| s.starts_with(" N=")))
        });
        if let Some(r) = hit {
            println!(
                "| {op} | {} | {:.2} | {up:.1} | {:.2} |",
                r.params,
                r.median_us,
                r.median_us / up
            );
        }
    }
    Ok(())
}
