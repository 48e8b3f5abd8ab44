//! Transpose benchmarks at the spec's shapes (`spec/quant.md` §6):
//! * `transpose`: `(M, K)` with row stride `2K`, M ∈ {4032, 8064}, K ∈ the 7 hidden sizes,
//!   dtype ∈ {e4m3, bf16};
//! * `batched_transpose`: `(B, M, K)` contiguous, B ∈ {8, 32}, same M and K, dtype ∈ {e4m3,
//!   bf16, fp32};
//! * `transpose_tiling`: the 2-D shapes upstream reports under every tiling of the staged-tile
//!   kernel (e4m3, bf16), to check the rule that picks the tiling from the shape.
//!
//! Bytes counted as upstream does: the logical elements of `x` plus those of `out`. Where
//! `bench/upstream-h200.md` has a row for the case, its time is printed beside ours.
//!
//! Run: `cargo xtask bench transpose` (or the gpu-bundle); args: `[filter] [--jsonl <path>]`.

use float8::F8E4M3;
use half::bf16;
use tk_core::bench::Bench;
use tk_core::testing::{generate_hidden_sizes, generate_num_tokens, par_random_bits};
use tk_core::{Element, Layout, Result};
use tk_transpose::Tiling;

/// Upstream's measured µs on our H200 (`bench/upstream-h200.md`): (op, params, µs).
const UPSTREAM: &[(&str, &str, f64)] = &[
    ("transpose", "8064x7168 bf16", 59.1),
    ("transpose", "8064x7168 e4m3", 31.7),
    ("transpose", "4032x2560 bf16", 12.6),
    ("transpose", "4032x2048 bf16", 11.0),
    ("transpose", "4032x3072 e4m3", 8.6),
    ("transpose", "4032x2560 e4m3", 7.7),
    ("transpose", "4032x2048 e4m3", 6.6),
    ("transpose", "4032x576 bf16", 4.1),
    ("transpose", "4032x576 e4m3", 3.2),
    ("batched_transpose", "8x8064x7168 bf16", 451.5),
    ("batched_transpose", "8x8064x7168 e4m3", 237.3),
];

/// Benchmarks every spec case of one dtype, using one random device buffer for all of them.
fn bench_dtype<T: Element>(b: &mut Bench, dtype: &str, batched: bool) -> Result<()> {
    let ms = generate_num_tokens(64, true);
    let ks = generate_hidden_sizes(64);
    let bs: &[usize] = if batched { &[8, 32] } else { &[1] };
    let (op, row_factor) = if batched {
        ("batched_transpose", 1)
    } else {
        ("transpose", 2)
    };
    let max_elems = bs.iter().max().unwrap_or(&1)
        * ms.iter().max().unwrap_or(&0)
        * ks.iter().max().unwrap_or(&0)
        * row_factor;
    let any = ms.iter().any(|m| {
        ks.iter().any(|k| {
            bs.iter()
                .any(|bb| b.enabled(op, &params(*bb, *m, *k, dtype)))
        })
    });
    if !any {
        return Ok(());
    }
    let dev = b.device().clone();
    let data = dev.upload(&par_random_bits::<T>(&[max_elems], 0x7e57))?;
    let mut out = dev.alloc::<T>(&[max_elems / row_factor])?;
    for &m in &ms {
        for &k in &ks {
            for &bb in bs {
                let p = params(bb, m, k, dtype);
                let (x_layout, out_layout) = if batched {
                    (
                        Layout::contiguous(&[bb, m, k]),
                        Layout::contiguous(&[bb, k, m]),
                    )
                } else {
                    (
                        Layout::new(vec![m, k], vec![2 * k, 1], 0)?,
                        Layout::contiguous(&[k, m]),
                    )
                };
                let x = data.view().with_layout(x_layout)?;
                let bytes = 2 * bb * m * k * std::mem::size_of::<T>();
                b.run(op, &p, bytes, || {
                    let mut o = out.view_mut().with_layout(out_layout.clone())?;
                    if batched {
                        tk_transpose::batched_transpose_into(&x, &mut o)
                    } else {
                        tk_transpose::transpose_into(&x, &mut o)
                    }
                })?;
            }
        }
    }
    Ok(())
}

/// Shapes `(M, K)` of the 2-D tiling comparison: those upstream reports.
const TILING_SHAPES: &[(usize, usize)] = &[
    (8064, 7168),
    (4032, 576),
    (4032, 2048),
    (4032, 2560),
    (4032, 3072),
];

/// Op `transpose_tiling`: the 2-D spec cases of [`TILING_SHAPES`] under every tiling of the
/// staged-tile kernel (`tk_transpose::Tiling::supported`), to check the rule that picks one
/// from the shape (`transpose` rows use the picked tiling). Params: `MxK dtype rows=R bands=B`.
fn bench_tilings<T: Element>(b: &mut Bench, dtype: &str) -> Result<()> {
    let e = std::mem::size_of::<T>();
    let p = |m: usize, k: usize, t: &Tiling| {
        format!("{m}x{k} {dtype} rows={} bands={}", t.rows, t.bands)
    };
    let any = TILING_SHAPES
        .iter()
        .any(|&(m, k)| Tiling::supported(e).any(|t| b.enabled("transpose_tiling", &p(m, k, &t))));
    if !any {
        return Ok(());
    }
    let max_elems = TILING_SHAPES
        .iter()
        .map(|&(m, k)| 2 * m * k)
        .max()
        .unwrap_or(0);
    let dev = b.device().clone();
    let data = dev.upload(&par_random_bits::<T>(&[max_elems], 0x7e58))?;
    let mut out = dev.alloc::<T>(&[max_elems / 2])?;
    for &(m, k) in TILING_SHAPES {
        let x = data
            .view()
            .with_layout(Layout::new(vec![m, k], vec![2 * k, 1], 0)?)?;
        let out_layout = Layout::contiguous(&[k, m]);
        for t in Tiling::supported(e) {
            b.run("transpose_tiling", &p(m, k, &t), 2 * m * k * e, || {
                let mut o = out.view_mut().with_layout(out_layout.clone())?;
                tk_transpose::transpose_into_tiled(&x, &mut o, t)
            })?;
        }
    }
    Ok(())
}

fn params(b: usize, m: usize, k: usize, dtype: &str) -> String {
    if b == 1 {
        format!("{m}x{k} {dtype}")
    } else {
        format!("{b}x{m}x{k} {dtype}")
    }
}

fn main() -> Result<()> {
    let Some(mut b) = Bench::from_args()? else {
        return Ok(());
    };
    b.report_compile_times(&tk_transpose::batched_transpose::kernel_spec(
        2,
        Some(Tiling::new(2, 128)),
        Default::default(),
    ))?;
    bench_dtype::<F8E4M3>(&mut b, "e4m3", false)?;
    bench_dtype::<bf16>(&mut b, "bf16", false)?;
    bench_dtype::<F8E4M3>(&mut b, "e4m3", true)?;
    bench_dtype::<bf16>(&mut b, "bf16", true)?;
    bench_dtype::<f32>(&mut b, "fp32", true)?;
    bench_tilings::<F8E4M3>(&mut b, "e4m3")?;
    bench_tilings::<bf16>(&mut b, "bf16")?;
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
