//! Test support shared by every family crate: seeded generators shaped like the spec's
//! (`spec/quant.md` §4.2), output poisoning, bit-exact comparison with a report of the first
//! mismatches, the spec's `calc_diff`, and the GPU-or-skip helper.
//!
//! Environment:
//! * `TK_REQUIRE_GPU=1`: a GPU test that cannot find a usable GPU fails instead of skipping.
//! * `TK_FULL_TEST=1` (or `true`/`True`): the full parameter grid ([`full_test`]).
//! * `TK_SEED=<u64>`: base seed mixed into every case's seed (default 0).
//! * `TK_TEST_SHARD=<i>/<n>`: grid tests that honour it run only their cases `i, i + n, ...`
//!   ([`test_shard`]), so n processes (`0/n` .. `n-1/n`) split a long grid between them.

use crate::device::Device;
use crate::dtype::Element;
use crate::error::{Result, TkError};
use crate::tensor::{DeviceTensor, HostTensor};

static CONVERT_CHECK: crate::KernelSource = crate::KernelSource {
    file: "convert_check.cu",
    entry: "tk_convert_check",
    code: include_str!("../cuda/convert_check.cu"),
    headers: &[],
    needs_cuda_headers: true,
};

/// A test kernel that converts fp32 bit patterns with CUDA's own intrinsics (e4m3, e5m2, e2m1,
/// bf16, f16, E5M6), for comparing [`crate::convert`] with the hardware. It includes CUDA's
/// `cuda_fp16.h`/`cuda_bf16.h`/`cuda_fp8.h`/`cuda_fp4.h`, so compiling it also proves the CUDA
/// headers were found.
pub fn convert_check_kernel_spec() -> crate::KernelSpec {
    crate::KernelSpec::new(&CONVERT_CHECK)
}

/// True when `TK_FULL_TEST` is `1`, `true` or `True` (the spec's full grid).
pub fn full_test() -> bool {
    matches!(
        std::env::var("TK_FULL_TEST").as_deref(),
        Ok("1") | Ok("true") | Ok("True")
    )
}

/// One process's share of a grid test's cases (`TK_TEST_SHARD=<index>/<count>`): the cases
/// whose position in the test's list is `index` modulo `count`. Without the variable, every
/// case (`0/1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// This process's share, `0 <= index < count`.
    pub index: usize,
    /// The number of shares.
    pub count: usize,
}

impl Shard {
    /// Parses `<index>/<count>` (`count >= 1`, `index < count`).
    pub fn parse(s: &str) -> Option<Shard> {
        let (i, n) = s.split_once('/')?;
        let (index, count) = (i.trim().parse().ok()?, n.trim().parse().ok()?);
        (count >= 1 && index < count).then_some(Shard { index, count })
    }

    /// Whether the case at position `i` of the test's list is this share's.
    pub fn keeps(&self, i: usize) -> bool {
        i % self.count == self.index
    }
}

/// The shard of the grid tests this process runs, from `TK_TEST_SHARD` (default: all cases).
///
/// # Panics
/// When `TK_TEST_SHARD` is set but not `<index>/<count>` with `index < count` (a typo must not
/// turn into a silently shorter test run).
pub fn test_shard() -> Shard {
    match std::env::var("TK_TEST_SHARD") {
        Err(_) => Shard { index: 0, count: 1 },
        Ok(s) => Shard::parse(&s).unwrap_or_else(|| {
            panic!("TK_TEST_SHARD={s:?}: expected <index>/<count>, index < count")
        }),
    }
}

/// True when `TK_REQUIRE_GPU=1`.
pub fn gpu_required() -> bool {
    std::env::var("TK_REQUIRE_GPU").as_deref() == Ok("1")
}

/// GPU 0 for a GPU test, or `None` with a printed reason when there is none.
///
/// With `TK_REQUIRE_GPU=1`, a missing or unusable GPU panics (the test fails) instead.
pub fn gpu_or_skip(test: &str) -> Option<Device> {
    match Device::new(0) {
        Ok(dev) => Some(dev),
        Err(e) if gpu_required() => panic!("{test}: TK_REQUIRE_GPU=1 but no usable GPU: {e}"),
        Err(e) => {
            report_skip(test, format_args!("no usable GPU ({e})"));
            None
        }
    }
}

/// Prints `SKIPPED <test>: <why>` for a test that skips at run time.
///
/// The line goes to the process's stderr directly, so the test harness's output capture can't
/// hide it (a skip must always be visible; `cargo xtask test` counts these lines and reports
/// the tests as skipped, not passed). It is written with one `write` call, so it reaches a
/// pipe shared with the harness's stdout in one piece. The harness's own lines can still end
/// just before it without a newline (`test a ... okSKIPPED b: ...`): readers must look for
/// `SKIPPED ` anywhere in a line.
pub fn report_skip(test: &str, why: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let line = format!("SKIPPED {test}: {why}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// The spec's seed rule: base seed (`TK_SEED`, default 0) plus a hash of the case name.
pub fn case_seed(case: &str) -> u64 {
    let base: u64 = std::env::var("TK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let h = case.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    base.wrapping_add(h)
}

/// A small, fast, seeded generator (SplitMix64 stream) with the distributions the spec uses.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A generator for a named test case ([`case_seed`]).
    pub fn for_case(case: &str) -> Self {
        Self::new(case_seed(case))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 24 random bits.
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform integer in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Standard normal (Box–Muller), like `torch.randn`.
    pub fn normal(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }

    /// A host tensor of standard normals converted with `conv` (`torch.randn(shape).to(dtype)`).
    pub fn randn<T: Element>(&mut self, shape: &[usize], conv: impl Fn(f32) -> T) -> HostTensor<T> {
        HostTensor::from_fn(shape, |_| conv(self.normal()))
    }

    /// A host tensor of uniformly random bit patterns (every element bit pattern equally likely).
    pub fn random_bits<T: Element>(&mut self, shape: &[usize]) -> HostTensor<T> {
        HostTensor::from_fn(shape, |_| T::from_bits_u64(self.next_u64()))
    }
}

/// A host tensor of uniformly random bit patterns, generated on all cores (chunk `k` of 1 Mi
/// elements uses the stream seeded `seed + k`, so the result depends only on `seed`). For
/// large bit-copy tests, where every bit pattern is a valid input.
pub fn par_random_bits<T: Element>(shape: &[usize], seed: u64) -> HostTensor<T> {
    par_fill(shape, seed, |rng| T::from_bits_u64(rng.next_u64()))
}

/// A host tensor of standard normals converted with `conv` (`torch.randn(shape).to(dtype)`, the
/// spec's benchmark data), generated on all cores like [`par_random_bits`].
pub fn par_randn<T: Element>(
    shape: &[usize],
    seed: u64,
    conv: impl Fn(f32) -> T + Sync,
) -> HostTensor<T> {
    par_fill(shape, seed, |rng| conv(rng.normal()))
}

/// A host tensor whose elements are `gen` of a per-chunk stream: chunk `k` of 1 Mi elements
/// uses the stream seeded `seed + k`, so the result depends only on `seed`.
fn par_fill<T: Element>(
    shape: &[usize],
    seed: u64,
    gen: impl Fn(&mut Rng) -> T + Sync,
) -> HostTensor<T> {
    const CHUNK: usize = 1 << 20;
    let n: usize = shape.iter().product();
    let mut data = vec![T::default(); n];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let per_thread = n.div_ceil(CHUNK).div_ceil(threads).max(1) * CHUNK;
    let gen = &gen;
    std::thread::scope(|s| {
        for (t, part) in data.chunks_mut(per_thread).enumerate() {
            s.spawn(move || {
                for (k, chunk) in part.chunks_mut(CHUNK).enumerate() {
                    let mut rng = Rng::new(seed.wrapping_add((t * per_thread / CHUNK + k) as u64));
                    chunk.iter_mut().for_each(|e| *e = gen(&mut rng));
                }
            });
        }
    });
    HostTensor::from_vec(data, shape).expect("length matches shape by construction")
}

/// The byte every test fills outputs with before a launch: in every float format of the library
/// an all-ones pattern is a NaN (or, for e2m1, −6 twice), which random inputs never produce.
pub const POISON_BYTE: u8 = 0xFF;

/// Fills `t`'s whole buffer with [`POISON_BYTE`].
pub fn poison<T: Element>(t: &mut DeviceTensor<T>) -> Result<()> {
    t.fill_bytes(POISON_BYTE)
}

/// Panics with the first mismatches (up to 8) unless `actual` and `expected` are bit-identical.
pub fn assert_bits_eq<T: Element>(what: &str, actual: &[T], expected: &[T]) {
    assert_eq!(
        actual.len(),
        expected.len(),
        "{what}: length {} != expected {}",
        actual.len(),
        expected.len()
    );
    // Count mismatches on all cores (GPU tests compare billions of elements), keeping the
    // first few indices of each chunk for the report.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = actual.len().div_ceil(threads).max(1 << 16);
    let per_chunk: Vec<(usize, Vec<usize>)> = std::thread::scope(|s| {
        let handles: Vec<_> = actual
            .chunks(chunk)
            .zip(expected.chunks(chunk))
            .enumerate()
            .map(|(c, (a, e))| {
                s.spawn(move || {
                    let mut first = Vec::new();
                    let mut n = 0;
                    for (i, (x, y)) in a.iter().zip(e).enumerate() {
                        if x.to_bits_u64() != y.to_bits_u64() {
                            n += 1;
                            if first.len() < 8 {
                                first.push(c * chunk + i);
                            }
                        }
                    }
                    (n, first)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("compare thread"))
            .collect()
    });
    let n_bad: usize = per_chunk.iter().map(|(n, _)| n).sum();
    let bad: Vec<usize> = per_chunk.into_iter().flat_map(|(_, f)| f).collect();
    if !bad.is_empty() {
        let shown: Vec<String> = bad
            .iter()
            .take(8)
            .map(|&i| {
                format!(
                    "[{i}] got {:?} (bits {:#x}) expected {:?} (bits {:#x})",
                    actual[i],
                    actual[i].to_bits_u64(),
                    expected[i],
                    expected[i].to_bits_u64()
                )
            })
            .collect();
        panic!(
            "{what}: {n_bad} of {} elements differ; first: {}",
            actual.len(),
            shown.join(", ")
        );
    }
}

/// The spec's `calc_diff`: in f64, `1 − 2·Σxy / Σ(x² + y²)`, or 0 when the denominator is 0.
pub fn calc_diff(x: &[f64], y: &[f64]) -> f64 {
    let (num, den) = x.iter().zip(y).fold((0.0, 0.0), |(n, d), (&a, &b)| {
        (n + a * b, d + a * a + b * b)
    });
    if den == 0.0 {
        0.0
    } else {
        1.0 - 2.0 * num / den
    }
}

/// `align(n, a)`: `n` rounded up to a multiple of `a`.
pub fn align(n: usize, a: usize) -> usize {
    n.div_ceil(a) * a
}

/// The spec's `generate_num_tokens(alignment)`: {4001, 8001} aligned, plus 0 in full mode
/// (not for benchmarks).
pub fn generate_num_tokens(alignment: usize, is_benchmark: bool) -> Vec<usize> {
    let mut base = vec![4001, 8001];
    if full_test() && !is_benchmark {
        base.insert(0, 0);
    }
    base.into_iter().map(|n| align(n, alignment)).collect()
}

/// The spec's hidden sizes divisible by `align`: from {576, 2048, 2560, 3072, 4096, 6144, 7168}.
pub fn generate_hidden_sizes(align: usize) -> Vec<usize> {
    [576, 2048, 2560, 3072, 4096, 6144, 7168]
        .into_iter()
        .filter(|h| h % align == 0)
        .collect()
}

/// Panics unless `err` is a [`TkError::Param`] naming `arg` whose message contains every word
/// of `words`.
pub fn assert_param(err: TkError, arg: &str, words: &[&str]) {
    match err {
        TkError::Param { arg: a, ref msg } if a == arg => {
            for w in words {
                assert!(msg.contains(w), "message {msg:?} lacks {w:?}");
            }
        }
        e => panic!("expected a Param error naming {arg:?}, got {e:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::Shard;

    #[test]
    fn shard_parses_and_partitions_the_cases() {
        assert_eq!(Shard::parse("1/3"), Some(Shard { index: 1, count: 3 }));
        assert_eq!(Shard::parse("0/1"), Some(Shard { index: 0, count: 1 }));
        for bad in ["3/3", "0/0", "1", "a/2", "-1/2", ""] {
            assert_eq!(Shard::parse(bad), None, "{bad:?}");
        }
        // Every case belongs to exactly one of the n shares.
        for n in 1..5 {
            for i in 0..20 {
                let owners = (0..n)
                    .filter(|&k| Shard { index: k, count: n }.keeps(i))
                    .count();
                assert_eq!(owners, 1);
            }
        }
    }
}
