//! tk-quant benchmarks at the spec's shapes (`spec/quant.md` §6), the large ones the issue
//! names and every row of `bench/upstream-h200.md` we have a kernel for.
//!
//! Bytes counted as upstream's `count_bytes`: input data (+ its scales), output data and output
//! scales (the scale tensor's logical elements; layout C counts its int32 words).
//!
//! Run: `cargo xtask bench quant` (or the gpu-bundle); args: `[filter] [--jsonl <path>]`.

use half::bf16;
use tk_core::bench::Bench;
use tk_core::testing::{par_randn, par_random_bits};
use tk_core::{Device, DeviceTensor, Result};
use tk_quant::{
    CastFormat, DeviceCastInput, DevicePlainInput, DeviceQuantInput, DeviceScales,
    LosslessCastParams, LosslessStatus, PerBlockCastParams, PerChannelCastParams,
    PerTokenCastParams, PerTokenE5M6Params, ScaleLayout, ScaleOptions,
};

/// Upstream's measured µs on our H200 (`bench/upstream-h200.md`): (op, params, µs).
const UPSTREAM: &[(&str, &str, f64)] = &[
    ("per_token_cast", "8001x7168 bf16->e2m1 npc=128 C", 163.4),
    ("per_token_cast", "8001x7168 bf16->e4m3 npc=128 C", 45.2),
    ("per_token_cast", "4001x2048 bf16->e2m1 npc=128 C", 29.1),
    ("per_token_cast", "4001x2048 bf16->e4m3 npc=128 C", 8.8),
    ("per_token_cast", "8001x65536 bf16->e2m1 npc=128 C", 1543.7),
    ("per_token_cast", "8001x65536 bf16->e2m1 npc=32 C", 1520.7),
    ("per_token_cast", "8001x16384 bf16->e2m1 npc=128 C", 396.7),
    ("per_token_cast", "8001x16384 bf16->e2m1 npc=32 C", 389.8),
    ("per_token_cast", "8001x65536 bf16->e4m3 npc=32 C", 374.0),
    ("per_token_cast", "8001x65536 bf16->e4m3 npc=128 C", 365.9),
    ("per_token_cast", "8001x16384 bf16->e4m3 npc=32 C", 97.4),
    ("per_token_cast", "8001x16384 bf16->e4m3 npc=128 C", 95.8),
    ("per_block_cast", "8001x7168 bf16->e2m1 32x32 C", 160.7),
    ("per_block_cast", "8001x7168 bf16->e4m3 128x128 C", 48.2),
    (
        "per_channel_cast",
        "8064x7168 bf16->e4m3 npt=128 round",
        46.3,
    ),
    ("cast_back", "8001x7168 e4m3 128x128 A->bf16", 75.2),
    ("per_token_cast_to_e5m6", "8001x7168 fp32 A round", 77.0),
    ("per_token_cast_to_e5m6", "8001x7168 fp32 C", 76.9),
    ("per_token_cast_to_e5m6", "8001x7168 bf16 A round", 54.5),
    ("per_token_cast_to_e5m6", "8001x7168 bf16 C", 54.2),
    ("per_token_cast_to_e5m6", "4001x2048 bf16 A round", 10.2),
    ("cast_back_e5m6", "8001x7168 A round->fp32", 119.0),
    (
        "per_block_cast_lossless",
        "8001x7168 e2m1 1x32 C->e4m3 128x128 C",
        90.5,
    ),
    (
        "per_block_cast_lossless",
        "8001x7168 e2m1 1x32 A->e4m3 1x128 A",
        88.8,
    ),
    (
        "per_token_cast_back",
        "8001x7168 e4m3 npc=128 C->bf16",
        44.0,
    ),
];

fn layout_name(l: ScaleLayout) -> &'static str {
    match l {
        ScaleLayout::RowMajorF32 => "A",
        ScaleLayout::ColMajorF32 => "B",
        ScaleLayout::PackedUe8m0 => "C",
    }
}

/// Bytes of a scale tensor as upstream counts them (its logical elements, 4 bytes each).
fn sf_bytes(s: &DeviceScales) -> usize {
    let [r, c] = s.grid().shape(s.layout());
    4 * r * c
}

/// Bytes of `fmt` data of logical shape `(m, k)`.
fn data_bytes(fmt: CastFormat, m: usize, k: usize) -> usize {
    m * k / fmt.values_per_byte()
}

/// A random bf16 or fp32 `(m, k)` input: standard normals, the spec's benchmark data
/// (`torch.randn`). Not random bit patterns: those hold ±inf in about 39 % of the 128x128
/// blocks (2 of the 65536 bf16 patterns), and an infinite block maximum sends the e2m1 tiles to
/// their fp32 fallback (`cuda/cast.cu`), a case upstream's benchmark never times.
enum Plain {
    F32(DeviceTensor<f32>),
    BF16(DeviceTensor<bf16>),
}

impl Plain {
    fn new(dev: &Device, bf: bool, m: usize, k: usize) -> Result<Self> {
        Ok(if bf {
            Plain::BF16(dev.upload(&par_randn(&[m, k], 0xB16, bf16::from_f32))?)
        } else {
            Plain::F32(dev.upload(&par_randn(&[m, k], 0xF32, |v| v))?)
        })
    }

    fn input(&self) -> DevicePlainInput<'_> {
        match self {
            Plain::F32(t) => t.view().into(),
            Plain::BF16(t) => t.view().into(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Plain::F32(t) => 4 * t.shape().iter().product::<usize>(),
            Plain::BF16(t) => 2 * t.shape().iter().product::<usize>(),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Plain::F32(_) => "fp32",
            Plain::BF16(_) => "bf16",
        }
    }
}

fn fmt_name(f: CastFormat) -> &'static str {
    match f {
        CastFormat::E4M3 => "e4m3",
        CastFormat::E2M1 => "e2m1",
    }
}

fn bench_per_token(b: &mut Bench) -> Result<()> {
    let dev = b.device().clone();
    let mut shapes = vec![(4001, 2048), (4001, 7168), (8001, 2048), (8001, 7168)];
    shapes.extend([(8001, 16384), (8001, 65536)]);
    for (m, k) in shapes {
        for bf in [true, false] {
            if k > 7168 && !bf {
                continue;
            }
            let mut x: Option<Plain> = None;
            for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
                let npcs: Vec<usize> = if k > 7168 {
                    vec![32, 128]
                } else {
                    vec![128, k]
                };
                for npc in npcs {
                    let params = PerTokenCastParams::new(fmt, npc, ScaleOptions::packed_ue8m0());
                    let dtype = if bf { "bf16" } else { "fp32" };
                    let npc_s = if npc == k {
                        "K".to_string()
                    } else {
                        npc.to_string()
                    };
                    let p = format!("{m}x{k} {dtype}->{} npc={npc_s} C", fmt_name(fmt));
                    if !b.enabled("per_token_cast", &p) {
                        continue;
                    }
                    if x.is_none() {
                        x = Some(Plain::new(&dev, bf, m, k)?);
                    }
                    let Some(xr) = x.as_ref() else { continue };
                    let xin = DeviceCastInput::Plain(xr.input());
                    let (mut out, mut sf) = tk_quant::per_token_cast(&xin, &params)?;
                    let bytes = xr.bytes() + data_bytes(fmt, m, k) + sf_bytes(&sf);
                    b.run("per_token_cast", &p, bytes, || {
                        tk_quant::per_token_cast_into(&xin, &params, &mut out.view_mut(), &mut sf)
                    })?;
                }
            }
        }
    }
    // From quantized input (requantization).
    let (m, k) = (8001, 7168);
    for (in_fmt, in_block, npc) in [
        (CastFormat::E4M3, (128, 128), 128),
        (CastFormat::E2M1, (32, 32), 32),
    ] {
        let p = format!(
            "{m}x{k} {}({}x{}) C->e4m3 npc={npc} C",
            fmt_name(in_fmt),
            in_block.0,
            in_block.1
        );
        if !b.enabled("per_token_cast", &p) {
            continue;
        }
        let x = Plain::new(&dev, true, m, k)?;
        let (q, s) = tk_quant::per_block_cast(
            &x.input(),
            &PerBlockCastParams::new(in_fmt, in_block, ScaleOptions::packed_ue8m0()),
        )?;
        let xin = DeviceCastInput::Quantized(DeviceQuantInput::new(q.view(), s.view()?, in_block));
        let params = PerTokenCastParams::new(CastFormat::E4M3, npc, ScaleOptions::packed_ue8m0());
        let (mut out, mut sf) = tk_quant::per_token_cast(&xin, &params)?;
        let bytes = data_bytes(in_fmt, m, k) + sf_bytes(&s) + m * k + sf_bytes(&sf);
        b.run("per_token_cast", &p, bytes, || {
            tk_quant::per_token_cast_into(&xin, &params, &mut out.view_mut(), &mut sf)
        })?;
    }
    Ok(())
}

fn bench_per_block(b: &mut Bench) -> Result<()> {
    let dev = b.device().clone();
    for (m, k) in [(4001, 2048), (8001, 7168)] {
        for bf in [true, false] {
            for (fmt, block) in [
                (CastFormat::E4M3, (128, 128)),
                (CastFormat::E2M1, (32, 32)),
                (CastFormat::E4M3, (32, 32)),
                (CastFormat::E2M1, (128, 128)),
            ] {
                let dtype = if bf { "bf16" } else { "fp32" };
                let p = format!(
                    "{m}x{k} {dtype}->{} {}x{} C",
                    fmt_name(fmt),
                    block.0,
                    block.1
                );
                if !b.enabled("per_block_cast", &p) {
                    continue;
                }
                let x = Plain::new(&dev, bf, m, k)?;
                let params = PerBlockCastParams::new(fmt, block, ScaleOptions::packed_ue8m0());
                let (mut out, mut sf) = tk_quant::per_block_cast(&x.input(), &params)?;
                let bytes = x.bytes() + data_bytes(fmt, m, k) + sf_bytes(&sf);
                b.run("per_block_cast", &p, bytes, || {
                    tk_quant::per_block_cast_into(&x.input(), &params, &mut out.view_mut(), &mut sf)
                })?;
            }
        }
    }
    Ok(())
}

fn bench_per_channel(b: &mut Bench) -> Result<()> {
    let dev = b.device().clone();
    for (m, k) in [(4096, 2048), (8064, 7168)] {
        for bf in [true, false] {
            for round in [true, false] {
                let x = Plain::new(&dev, bf, m, k)?;
                let p = format!(
                    "{m}x{k} {}->e4m3 npt=128{}",
                    x.name(),
                    if round { " round" } else { "" }
                );
                if !b.enabled("per_channel_cast", &p) {
                    continue;
                }
                let params = PerChannelCastParams::new(128, round);
                let (mut out, mut sf) = tk_quant::per_channel_cast(&x.input(), &params)?;
                let bytes = x.bytes() + m * k + sf_bytes(&sf);
                b.run("per_channel_cast", &p, bytes, || {
                    tk_quant::per_channel_cast_into(
                        &x.input(),
                        &params,
                        &mut out.view_mut(),
                        &mut sf,
                    )
                })?;
            }
        }
    }
    Ok(())
}

fn bench_cast_back(b: &mut Bench) -> Result<()> {
    let dev = b.device().clone();
    let (m, k) = (8001, 7168);
    let x = Plain::new(&dev, true, m, k)?;
    let cases = [
        (
            "cast_back",
            CastFormat::E4M3,
            (128, 128),
            ScaleOptions::row_major(false),
        ),
        (
            "per_token_cast_back",
            CastFormat::E4M3,
            (1, 128),
            ScaleOptions::packed_ue8m0(),
        ),
        (
            "per_token_cast_back",
            CastFormat::E2M1,
            (1, 128),
            ScaleOptions::packed_ue8m0(),
        ),
        (
            "per_token_cast_back",
            CastFormat::E4M3,
            (1, 7168),
            ScaleOptions::col_major(true),
        ),
    ];
    for (op, fmt, block, opts) in cases {
        // The data: a GPU cast of x with the same block.
        let (q, s) = if block.0 == 1 {
            let params = PerTokenCastParams::new(fmt, block.1, opts);
            tk_quant::per_token_cast(&DeviceCastInput::Plain(x.input()), &params)?
        } else {
            tk_quant::per_block_cast(&x.input(), &PerBlockCastParams::new(fmt, block, opts))?
        };
        let din = DeviceQuantInput::new(q.view(), s.view()?, block);
        for out in ["bf16", "fp32"] {
            let blk = if block.0 == 1 {
                format!("npc={}", block.1)
            } else {
                format!("{}x{}", block.0, block.1)
            };
            let p = format!(
                "{m}x{k} {} {blk} {}->{out}",
                fmt_name(fmt),
                layout_name(s.layout())
            );
            if !b.enabled(op, &p) {
                continue;
            }
            let out_bytes = if out == "bf16" { 2 } else { 4 } * m * k;
            let bytes = out_bytes + data_bytes(fmt, m, k) + sf_bytes(&s);
            if out == "bf16" {
                let mut o = dev.alloc::<bf16>(&[m, k])?;
                b.run(op, &p, bytes, || {
                    tk_quant::cast_back_into(&din, &mut o.view_mut())
                })?;
            } else {
                let mut o = dev.alloc::<f32>(&[m, k])?;
                b.run(op, &p, bytes, || {
                    tk_quant::cast_back_into(&din, &mut o.view_mut())
                })?;
            }
        }
    }
    // Per-channel scales (128, 1) on 8064 rows.
    let (m, k) = (8064, 7168);
    let x = Plain::new(&dev, true, m, k)?;
    let (q, s) = tk_quant::per_channel_cast(&x.input(), &PerChannelCastParams::new(128, true))?;
    let din = DeviceQuantInput::new(q.view(), s.view()?, (128, 1));
    let p = format!("{m}x{k} e4m3 128x1 A->bf16");
    if b.enabled("cast_back", &p) {
        let mut o = dev.alloc::<bf16>(&[m, k])?;
        let bytes = 2 * m * k + m * k + sf_bytes(&s);
        b.run("cast_back", &p, bytes, || {
            tk_quant::cast_back_into(&din, &mut o.view_mut())
        })?;
    }
    Ok(())
}

fn bench_e5m6(b: &mut Bench) -> Result<()> {
    let dev = b.device().clone();
    for (m, k) in [(4001, 2048), (8001, 7168)] {
        for bf in [true, false] {
            let x = Plain::new(&dev, bf, m, k)?;
            for (opts, cfg) in [
                (ScaleOptions::row_major(true), "A round"),
                (ScaleOptions::packed_ue8m0(), "C"),
            ] {
                let p = format!("{m}x{k} {} {cfg}", x.name());
                let params = PerTokenE5M6Params::new(k, opts);
                let (mut q, mut sf) = tk_quant::per_token_cast_to_e5m6(&x.input(), &params)?;
                let out_bytes = m * k / 2 * 3;
                if b.enabled("per_token_cast_to_e5m6", &p) {
                    let bytes = x.bytes() + out_bytes + sf_bytes(&sf);
                    b.run("per_token_cast_to_e5m6", &p, bytes, || {
                        tk_quant::per_token_cast_to_e5m6_into(
                            &x.input(),
                            &params,
                            &mut q.view_mut(),
                            &mut sf,
                        )
                    })?;
                }
                for out in ["fp32", "bf16"] {
                    let p = format!("{m}x{k} {cfg}->{out}");
                    if !b.enabled("cast_back_e5m6", &p) {
                        continue;
                    }
                    let (qv, sv) = (q.view(), sf.view()?);
                    let bytes =
                        out_bytes + sf_bytes(&sf) + m * k * if out == "fp32" { 4 } else { 2 };
                    if out == "fp32" {
                        let mut o = dev.alloc::<f32>(&[m, k])?;
                        b.run("cast_back_e5m6", &p, bytes, || {
                            tk_quant::cast_back_e5m6_into(&qv, &sv, (1, k), &mut o.view_mut())
                        })?;
                    } else {
                        let mut o = dev.alloc::<bf16>(&[m, k])?;
                        b.run("cast_back_e5m6", &p, bytes, || {
                            tk_quant::cast_back_e5m6_into(&qv, &sv, (1, k), &mut o.view_mut())
                        })?;
                    }
                }
            }
        }
    }
    Ok(())
}

fn bench_lossless(b: &mut Bench) -> Result<()> {
    let dev = b.device().clone();
    let (m, k) = (8001, 7168);
    // Finite values within 2^8 of each other, so that every output block is lossless (random
    // bit patterns would hold inf / NaN and exponent spreads the op rejects).
    let mut h = par_random_bits::<bf16>(&[m, k], 0x1055);
    for v in h.as_mut_slice() {
        let b = v.to_bits();
        *v = bf16::from_bits((b & 0x807F) | ((120 + ((b >> 7) & 7)) << 7));
    }
    let x = Plain::BF16(dev.upload(&h)?);
    for (opts, cfg) in [
        (ScaleOptions::packed_ue8m0(), "C"),
        (ScaleOptions::row_major(true), "A"),
    ] {
        let (q, s) = tk_quant::per_token_cast(
            &DeviceCastInput::Plain(x.input()),
            &PerTokenCastParams::new(CastFormat::E2M1, 32, opts),
        )?;
        let din = DeviceQuantInput::new(q.view(), s.view()?, (1, 32));
        for ob in [(128, 128), (1, 128), (32, 32)] {
            let p = format!("{m}x{k} e2m1 1x32 {cfg}->e4m3 {}x{} {cfg}", ob.0, ob.1);
            if !b.enabled("per_block_cast_lossless", &p) {
                continue;
            }
            let params = LosslessCastParams::new(ob, opts);
            let (mut out, mut sf) = tk_quant::per_block_cast_lossless(&din, &params)?;
            let status = LosslessStatus::new(&dev)?;
            let bytes = m * k / 2 + sf_bytes(&s) + m * k + sf_bytes(&sf);
            b.run("per_block_cast_lossless", &p, bytes, || {
                tk_quant::per_block_cast_lossless_into(
                    &din,
                    &params,
                    &mut out.view_mut(),
                    &mut sf,
                    &status,
                )
            })?;
            status.check()?;
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let Some(mut b) = Bench::from_args()? else {
        return Ok(());
    };
    bench_per_token(&mut b)?;
    bench_per_block(&mut b)?;
    bench_per_channel(&mut b)?;
    bench_cast_back(&mut b)?;
    bench_e5m6(&mut b)?;
    bench_lossless(&mut b)?;
    let records = b.finish()?;
    println!(
        "\n| op | params | ours µs | upstream µs | ours / upstream |\n|---|---|---:|---:|---:|"
    );
    for (op, p, up) in UPSTREAM {
        if let Some(r) = records.iter().find(|r| r.op == *op && r.params == *p) {
            println!(
                "| {op} | {p} | {:.2} | {up:.1} | {:.2} |",
                r.median_us,
                r.median_us / up
            );
        }
    }
    Ok(())
}
