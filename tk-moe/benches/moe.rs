//! MoE routing benchmarks at the spec's shapes (`spec/moe.md` §6): the moe12 configurations
//! (`generate_moe_params(is_benchmark = true)`, 4001 sent tokens per rank; `TK_FULL_TEST` adds
//! the full grid's values) with the seeded generator of `tk_moe::testing`.
//!
//! | op | extra axes | bytes |
//! |---|---|---|
//! | `aux_fi` | num_aux_topk ∈ {1, K} | `8TK` |
//! | `group_count` | | `8TK` |
//! | `mask_indices_by_tp` | tp ∈ {2, 4, 8}, seeded random rank | `16TK` |
//! | `inplace_unique_group_indices` | groups ∈ {8, 16, 72} dividing the global experts (time includes a copy of the input, as upstream's clone) | `8TK + 4·#changed` |
//! | `normalize_weight` | | `8TK + 4T` |
//! | `get_fused_mapping` | alignment 128; host-sync (as upstream), graph-safe capacity (one cooperative launch) and capacity with two launches (A/B) | `8TK + 12M + 4TK + 12E` |
//! | `expand_to_fused` | bf16, H ∈ the 7 hidden sizes, alignment 16 | `2TH + 4TK + 4M + 2MH` |
//! | `expand_to_fused_with_sf` | e4m3, 7 H × npc {32, 128} × {fp32 row-major, packed UE8M0 col-major} | `TH + 4T·Hs + 4TK + 4M + MH + 4M·Hs` |
//! | `reduce_fused` | K = 6 configs, H ∈ {2048 .. 7168}, in {fp32, bf16} × out {in, e4m3} × x_sf, weights on, `T·K` fused rows | `4TK + [4TK] + T·H·out_b + nvalid·H·in_b + 4TK` |
//!
//! Where `bench/upstream-h200.md` has a row for the case, its time is printed beside ours.
//! Large data buffers are filled with a constant byte (0x3C: small finite values in every
//! float format), since the ops' time does not depend on the values.
//!
//! Run: `cargo xtask bench moe` (or the gpu-bundle); args: `[filter] [--jsonl <path>]`.

use float8::F8E4M3;
use half::bf16;
use tk_core::bench::Bench;
use tk_core::error::DriverContext;
use tk_core::testing::{generate_hidden_sizes, Rng};
use tk_core::{DeviceTensor, Element, HostTensor, Layout, Result};
use tk_moe::reference::{self, FusedMapping};
use tk_moe::testing::{generate_moe_params, generate_topk_idx, random_weights, MoeParams};
use tk_moe::*;

/// Upstream's measured µs on our H200 (`bench/upstream-h200.md`): (op, params prefix, µs).
const UPSTREAM: &[(&str, &str, f64)] = &[
    ("aux_fi", "k=8 experts=32 ep=8 aux=8", 3.8),
    ("group_count", "k=8 experts=32 ep=8", 3.7),
    ("mask_indices_by_tp", "k=8 experts=32 ep=8 tp=2", 2.7),
    (
        "inplace_unique_group_indices",
        "k=8 experts=32 ep=8 groups=8",
        6.6,
    ),
    ("normalize_weight", "k=8 experts=32 ep=8", 2.0),
    (
        "get_fused_mapping",
        "k=8 experts=32 ep=8 a=128 host-sync",
        10.9,
    ),
    ("expand_to_fused", "k=8 experts=32 ep=8 H=7168 bf16", 210.9),
    (
        "expand_to_fused_with_sf",
        "k=8 experts=32 ep=8 H=7168 npc=128 ue8m0-col",
        115.5,
    ),
    (
        "reduce_fused",
        "k=6 experts=32 ep=8 H=7168 bf16->bf16 w",
        157.4,
    ),
];

/// One moe12 configuration with its generated `topk_idx`.
struct Case {
    p: MoeParams,
    idx: HostTensor<i64>,
}

impl Case {
    fn name(&self) -> String {
        format!(
            "k={} experts={} ep={}",
            self.p.num_topk, self.p.num_experts, self.p.num_ep_ranks
        )
    }
    fn t(&self) -> usize {
        self.idx.shape()[0]
    }
    fn k(&self) -> usize {
        self.idx.shape()[1]
    }
    fn map(&self, alignment: usize) -> Result<FusedMapping> {
        reference::get_fused_mapping(
            &self.idx.view(),
            &GetFusedMappingParams::host_sync(self.p.num_experts, alignment),
        )
    }
}

/// A device tensor of `shape` filled with the byte 0x3C.
fn filled<T: Element>(b: &Bench, shape: &[usize]) -> Result<DeviceTensor<T>> {
    let mut t = b.device().alloc::<T>(shape)?;
    t.fill_bytes(0x3C)?;
    Ok(t)
}

fn bench_small_ops(b: &mut Bench, c: &Case) -> Result<()> {
    let dev = b.device().clone();
    let (t, k, e) = (c.t(), c.k(), c.p.num_experts);
    let n = c.name();
    let di = dev.upload(&c.idx)?;
    let idx_bytes = 8 * t * k;
    for naux in [1, k] {
        let params = AuxFiParams::new(e, naux);
        let mut out = dev.alloc::<f32>(&[e])?;
        b.run("aux_fi", &format!("{n} aux={naux}"), idx_bytes, || {
            aux_fi_into(&di.view(), &params, &mut out.view_mut())
        })?;
    }
    let mut counts = dev.alloc::<i32>(&[e])?;
    let params = GroupCountParams::new(e);
    b.run("group_count", &n, idx_bytes, || {
        group_count_into(&di.view(), &params, &mut counts.view_mut())
    })?;
    let mut rng = Rng::new(0x7e57);
    for tp in [2, 4, 8] {
        let params = MaskIndicesByTpParams {
            num_experts: e * c.p.num_ep_ranks,
            num_ep_ranks: c.p.num_ep_ranks,
            tp_rank: rng.below(tp as u64) as usize,
            num_tp_ranks: tp,
        };
        let mut out = dev.alloc::<i64>(&[t, k])?;
        let p = format!("{n} tp={tp} rank={}", params.tp_rank);
        b.run("mask_indices_by_tp", &p, 2 * idx_bytes, || {
            mask_indices_by_tp_into(&di.view(), &params, &mut out.view_mut())
        })?;
    }
    let global = c.p.global_experts();
    for g in [8, 16, 72] {
        if global % g != 0 {
            continue;
        }
        let per = (global / g) as i64;
        let groups = HostTensor::from_fn(c.idx.shape(), |i| {
            c.idx.as_slice()[i].div_euclid(per).max(-1)
        });
        let mut dedup = groups.clone();
        let params = InplaceUniqueGroupIndicesParams::new(g);
        let changed = reference::inplace_unique_group_indices(&mut dedup, &params)?;
        let src = dev.upload(&groups)?;
        let mut work = dev.alloc::<i64>(&[t, k])?;
        let stream = dev.stream().clone();
        b.run(
            "inplace_unique_group_indices",
            &format!("{n} groups={g}"),
            idx_bytes + 4 * changed,
            || {
                if t * k > 0 {
                    stream
                        .memcpy_dtod(
                            &src.buffer().slice(0..t * k),
                            &mut work.buffer_mut().slice_mut(0..t * k),
                        )
                        .ctx("copying the input (upstream's clone)")?;
                }
                inplace_unique_group_indices(&mut work.view_mut(), &params)
            },
        )?;
    }
    let w = dev.upload(&random_weights(&mut rng, t, k))?;
    let (mut den, mut out) = (dev.alloc::<f32>(&[t])?, dev.alloc::<f32>(&[t, k])?);
    b.run("normalize_weight", &n, 8 * t * k + 4 * t, || {
        normalize_weight_into(&w.view(), &mut den.view_mut(), &mut out.view_mut())
    })?;
    // get_fused_mapping, alignment 128: host sync (upstream's timed call) and graph-safe.
    let m = c.map(128)?.num_rows();
    let bytes = 8 * t * k + 12 * m + 4 * t * k + 12 * e;
    b.run(
        "get_fused_mapping",
        &format!("{n} a=128 host-sync"),
        bytes,
        || get_fused_mapping(&di.view(), &GetFusedMappingParams::host_sync(e, 128)).map(|_| ()),
    )?;
    let cap = max_fused_rows(t, k, e, 128).unwrap_or(m);
    let mut maps = DeviceFusedMapping::alloc(&dev, t, k, e, cap)?;
    // Capacity: one cooperative launch (the default for E <= 256), and the two launches (A/B).
    for (tag, launch) in [
        ("capacity", FusedLaunch::Auto),
        ("capacity two-launch", FusedLaunch::TwoLaunches),
    ] {
        b.run(
            "get_fused_mapping",
            &format!("{n} a=128 {tag}"),
            bytes,
            || {
                get_fused_mapping_into_with(
                    &di.view(),
                    &GetFusedMappingParams::new(e, 128, cap),
                    &mut maps,
                    launch,
                )
            },
        )?;
    }
    Ok(())
}

fn bench_expand(b: &mut Bench, c: &Case) -> Result<()> {
    let n = c.name();
    let hs = generate_hidden_sizes(64);
    let hmax = *hs.iter().max().unwrap_or(&0);
    let any = hs.iter().any(|h| {
        b.enabled("expand_to_fused", &format!("{n} H={h}"))
            || b.enabled("expand_to_fused_with_sf", &format!("{n} H={h}"))
    });
    if !any {
        return Ok(());
    }
    let dev = b.device().clone();
    let (t, k) = (c.t(), c.k());
    let map = c.map(16)?;
    let m = map.num_rows();
    let (ttp, pte) = (
        dev.upload(&map.token_topk_to_pos)?,
        dev.upload(&map.pos_to_expert)?,
    );
    let fixed = 4 * t * k + 4 * m;
    {
        let x = filled::<bf16>(b, &[t * hmax])?;
        let mut out = dev.alloc::<bf16>(&[m * hmax])?;
        for &h in &hs {
            let xv = x.view().with_layout(Layout::contiguous(&[t, h]))?;
            b.run(
                "expand_to_fused",
                &format!("{n} H={h} bf16"),
                2 * t * h + fixed + 2 * m * h,
                || {
                    let mut o = out.view_mut().with_layout(Layout::contiguous(&[m, h]))?;
                    expand_to_fused_into(&xv, &ttp.view(), &pte.view(), &mut o)
                },
            )?;
        }
    }
    let data = filled::<F8E4M3>(b, &[t * hmax])?;
    let mut out = dev.alloc::<F8E4M3>(&[m * hmax])?;
    let sf32 = filled::<f32>(b, &[t * hmax.div_ceil(32)])?;
    let sfpk = filled::<i32>(b, &[t * hmax.div_ceil(128)])?;
    let mut osf32 = dev.alloc::<f32>(&[m * hmax.div_ceil(32)])?;
    let mut osfpk = dev.alloc::<i32>(&[m.div_ceil(4) * 4 * hmax.div_ceil(128)])?;
    for &h in &hs {
        let dv = data.view().with_layout(Layout::contiguous(&[t, h]))?;
        for npc in [32, 128] {
            for col in [false, true] {
                let params = ExpandToFusedWithSfParams::new(npc, col);
                let s = params.sf_columns(h, col);
                let bytes = t * h + 4 * t * s + fixed + m * h + 4 * m * s;
                let what = format!(
                    "{n} H={h} npc={npc} {}",
                    if col { "ue8m0-col" } else { "fp32-row" }
                );
                let len = params.out_sf_storage_len(m, s);
                let mut run = |b: &mut Bench| -> Result<()> {
                    if col {
                        let sv = sfpk.view().with_layout(Layout::contiguous(&[t, s]))?;
                        b.run("expand_to_fused_with_sf", &what, bytes, || {
                            let mut o = out.view_mut().with_layout(Layout::contiguous(&[m, h]))?;
                            let mut os =
                                osfpk.view_mut().with_layout(Layout::contiguous(&[len]))?;
                            expand_to_fused_with_sf_into(
                                &dv,
                                &sv,
                                &ttp.view(),
                                &pte.view(),
                                &params,
                                &mut o,
                                &mut os,
                            )
                        })
                    } else {
                        let sv = sf32.view().with_layout(Layout::contiguous(&[t, s]))?;
                        b.run("expand_to_fused_with_sf", &what, bytes, || {
                            let mut o = out.view_mut().with_layout(Layout::contiguous(&[m, h]))?;
                            let mut os =
                                osf32.view_mut().with_layout(Layout::contiguous(&[len]))?;
                            expand_to_fused_with_sf_into(
                                &dv,
                                &sv,
                                &ttp.view(),
                                &pte.view(),
                                &params,
                                &mut o,
                                &mut os,
                            )
                        })
                    }
                };
                run(b)?;
            }
        }
    }
    Ok(())
}

fn bench_reduce_dtype<T: ReduceElement>(b: &mut Bench, c: &Case, dtype: &str) -> Result<()> {
    let n = c.name();
    let hs = generate_hidden_sizes(256);
    // The set-up below is skipped only when no case of this group is selected: the check uses
    // the cases' full `params` (a filter naming a whole case, e.g. `.. bf16->bf16 w`, is not a
    // substring of a shorter prefix).
    let selected = |h: &usize| {
        [dtype, "e4m3"].iter().any(|o| {
            [" w", " w x_sf"]
                .iter()
                .any(|tag| b.enabled("reduce_fused", &format!("{n} H={h} {dtype}->{o}{tag}")))
        })
    };
    if !hs.iter().any(selected) {
        return Ok(());
    }
    let dev = b.device().clone();
    let (t, k, e) = (c.t(), c.k(), c.p.num_experts);
    let map =
        reference::get_fused_mapping(&c.idx.view(), &GetFusedMappingParams::new(e, 1, t * k))?;
    let nvalid = map
        .token_topk_to_pos
        .as_slice()
        .iter()
        .filter(|&&p| p >= 0)
        .count();
    let hmax = *hs.iter().max().unwrap_or(&0);
    let x = filled::<T>(b, &[t * k * hmax])?;
    let x_sf = filled::<f32>(b, &[t * k])?;
    let ttp = dev.upload(&map.token_topk_to_pos)?;
    let w = dev.upload(&random_weights(&mut Rng::new(6), t, k))?;
    let sf = dev.upload(&HostTensor::from_vec(vec![0.75f32], &[1])?)?;
    let mut out = dev.alloc::<T>(&[t * hmax])?;
    let mut out8 = dev.alloc::<F8E4M3>(&[t * hmax])?;
    let in_b = std::mem::size_of::<T>();
    for &h in &hs {
        let xv = x.view().with_layout(Layout::contiguous(&[t * k, h]))?;
        for with_xsf in [false, true] {
            let mut inputs =
                DeviceReduceFusedInputs::new(xv.clone(), ttp.view()).with_weights(w.view());
            if with_xsf {
                inputs = inputs.with_x_sf(x_sf.view());
            }
            let base =
                4 * t * k + if with_xsf { 4 * t * k } else { 0 } + nvalid * h * in_b + 4 * t * k;
            let tag = if with_xsf { " w x_sf" } else { " w" };
            b.run(
                "reduce_fused",
                &format!("{n} H={h} {dtype}->{dtype}{tag}"),
                base + t * h * in_b,
                || {
                    let mut o = out.view_mut().with_layout(Layout::contiguous(&[t, h]))?;
                    reduce_fused_into(&inputs, &mut o)
                },
            )?;
            let inputs8 = inputs.clone().with_sf(sf.view());
            b.run(
                "reduce_fused",
                &format!("{n} H={h} {dtype}->e4m3{tag}"),
                base + t * h,
                || {
                    let mut o = out8.view_mut().with_layout(Layout::contiguous(&[t, h]))?;
                    reduce_fused_e4m3_into(&inputs8, &mut o)
                },
            )?;
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let Some(mut b) = Bench::from_args()? else {
        return Ok(());
    };
    b.report_compile_times(&reduce_fused::kernel_spec(
        tk_core::DType::BF16,
        ReduceOut::Input,
        8,
        6,
        reduce_fused::ReduceOptions {
            weights: true,
            x_sf: false,
            sf: false,
        },
    ))?;
    for p in generate_moe_params(true) {
        let mut rng = Rng::for_case(&format!("bench {}", p.name()));
        let c = Case {
            p,
            idx: generate_topk_idx(&mut rng, &p)?,
        };
        bench_small_ops(&mut b, &c)?;
        bench_expand(&mut b, &c)?;
        if p.num_topk == 6 {
            bench_reduce_dtype::<f32>(&mut b, &c, "fp32")?;
            bench_reduce_dtype::<bf16>(&mut b, &c, "bf16")?;
        }
    }
    let records = b.finish()?;
    println!("\n| op | params | ours µs | upstream µs | ours / upstream | % of copy ceiling |\n|---|---|---:|---:|---:|---:|");
    for (op, p, up) in UPSTREAM {
        for r in records
            .iter()
            .filter(|r| r.op == *op && r.params.starts_with(p))
        {
            println!(
                "| {op} | {} | {:.2} | {up:.1} | {:.2} | {:.1} % |",
                r.params,
                r.median_us,
                r.median_us / up,
                r.pct_of_ceiling
            );
        }
    }
    Ok(())
}
