//! The GPU fused ops against the CPU references: the SwiGLU ops (§3.10–§3.12), the per-channel
//! cast and transpose (§3.7) and `per_channel_cast_fused` (§3.6). Outputs are poisoned before
//! every launch; inputs are fresh random normals per case (§4.2); scales are compared over
//! their full allocation (padding included).
//!
//! **Exactness** (the method of [`tk_quant::swiglu`]): CUDA's `expf` is not reproducible on a
//! CPU, so the references run with the GPU's own `expf` values, obtained from
//! [`tk_quant::swiglu::device_expf`] (the same non-fast-math `expf` the kernels use): a table
//! over every bf16 value (plus any other argument the case needs) for the forward ops, and a
//! replay of the backward's arguments in the reference's evaluation order (each argument is
//! checked). With those, **every output is compared bit for bit** except the backward's
//! `weight_grad` (an fp32 sum in an unspecified order: `atol = rtol = 1e-4`, the spec's
//! tolerance). In addition the forward activation (the `F32` format) is checked within
//! [`activation_within_tolerance`] of the reference with the correctly rounded CPU `expf`, and
//! the quantized forward outputs are checked against the downstream reference fed with the
//! GPU's activation.
//!
//! Grids: the spec's option grids (§3.10: 2160 cases, §3.11: 864, §3.12: 336, §3.7: 56, §3.6:
//! 312) over its hidden sizes and its 12 MoE configurations, with **256 tokens per rank**
//! instead of 4001 by default (the CPU references of 4001-token cases take minutes);
//! `TK_FULL_TEST` adds the 12 configurations at the spec's 4001 tokens and the full MoE grid
//! (with the zero-token case) at 256 tokens, and `M = 0` for the per-channel ops. Off-grid:
//! token counts and hidden sizes outside the grid, fp32 input, bf16 / e2m1 outputs, every
//! scale layout, `sf_clamp_min`, all-padding expert blocks, out-of-range weights, zero
//! tokens, row-strided (unaligned) inputs, partial last blocks of gathered rows.
//!
//! Cost (the CPU references dominate): the grids start their largest cases first (by
//! tokens x top-k x width); the references split their rows between all cores (see
//! `tk_quant::reference`) and the random inputs are generated on all cores (`par_randn`, bit
//! for bit `Rng::randn`); a forward cast's downstream reference is computed once per distinct
//! (format, npc, rounding, eps) and re-laid out for the other scale layouts
//! (`DownstreamCache`, its premise checked on the CPU); the CPU `expf` of the tolerance check
//! is memoised over bf16 arguments; the backward's clamp that changes no gate reuses the
//! previous `expf` replay. Under `TK_FULL_TEST` the SwiGLU forward grid is about 6.0e9
//! (fused row x H) elements and the per-channel fused grid about 2.9e10 (fused row x K: its
//! 128-row expert alignment pads the 256-token, 384-expert sources to 48896 rows), about
//! 2700 core-seconds each (measured on one AMD EPYC core: 55 s for the largest forward case,
//! 24 s for the largest fused case). The backward grid under `TK_FULL_TEST` is about 8.6e10
//! (row x 2H) elements, about 48 ns of one core each: on the H200 host (16 cores) it passed in
//! 8 shards (`TK_TEST_SHARD=i/8`) of 204-466 s each, two or three shards at a time.
#![cfg(all(feature = "cuda", feature = "cpu"))]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use float8::F8E4M3;
use half::bf16;
use tk_core::convert::e4m3_to_f32;
use tk_core::testing::{
    assert_bits_eq, full_test, generate_hidden_sizes, gpu_or_skip, test_shard, Rng,
};
use tk_core::{Device, DeviceTensor, HostTensor, Layout};
use tk_moe::get_fused_mapping::{FusedRows, GetFusedMappingParams};
use tk_moe::reference::{expand_to_fused, get_fused_mapping, FusedMapping};
use tk_moe::testing::{generate_moe_params_with, generate_topk_idx, MoeParams};
use tk_quant::reference::swiglu::{activation_within_tolerance, clamp_gate, cpu_expf};
use tk_quant::reference::{self, SwigluOut};
use tk_quant::swiglu::device_expf;
use tk_quant::swiglu_forward_and_per_token_cast::validate_dims;
use tk_quant::testing::scale_check_kernel_spec;
use tk_quant::{
    CastFormat, CastInput, DeviceFusedInput, DevicePlainInput, DeviceQuantData, DeviceScales,
    DeviceSwigluBackwardInputs, DeviceSwigluBackwardOutputsMut, DeviceSwigluForwardInputs,
    DeviceSwigluOutMut, DeviceTopkWeights, FusedInput, HostScales,
    PerChannelCastAndTransposeParams, PerChannelCastFusedParams, PerTokenCastParams, PlainInput,
    QuantData, ScaleLayout, ScaleOptions, SwigluBackwardInputs, SwigluBackwardParams,
    SwigluForwardInputs, SwigluForwardParams, SwigluOutFormat, SwigluPerChannelParams, TopkWeights,
};

const POISON: u8 = 0xA7;

/// Tokens per rank of the default MoE sources (the spec's 4001 under TK_FULL_TEST).
const SMALL_TOKENS: usize = 256;

/// Runs `f` on this process's share of the cases (`TK_TEST_SHARD`, default all: see
/// `tk_core::testing::test_shard`), spread over at most `max_workers` host threads (the CPU
/// references dominate; the big cases hold gigabytes each). Returns the number of cases run.
/// Cases that take more than [`SLOW_CASE_S`] are reported on stderr with their time (the
/// evidence of where a long grid spends it).
fn par_cases<C: Sync + std::fmt::Debug>(
    cases: &[C],
    max_workers: usize,
    f: impl Fn(&C) + Sync,
) -> usize {
    let shard = test_shard();
    let mine: Vec<&C> = (0..cases.len())
        .filter(|&i| shard.keeps(i))
        .map(|i| &cases[i])
        .collect();
    let workers = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(max_workers);
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = mine.get(i) else { break };
                let start = Instant::now();
                f(c);
                let t = start.elapsed().as_secs_f64();
                if t > SLOW_CASE_S {
                    eprintln!("par_cases: case {i} of {} took {t:.1} s: {c:?}", mine.len());
                }
            });
        }
    });
    eprintln!(
        "par_cases: ran {} of {} cases (shard {shard:?})",
        mine.len(),
        cases.len()
    );
    mine.len()
}

/// [`par_cases`] reports the cases slower than this many seconds.
const SLOW_CASE_S: f64 = 20.0;

/// `rng.randn(shape, conv)`, bit for bit, generated on all cores, and `rng` left where
/// `randn` leaves it. `Rng` is a SplitMix64 stream (state `s`, advanced by [`SPLITMIX_GAMMA`]
/// per draw, two draws per normal), so element `e` is the normal drawn from state
/// `s + 2e · γ`: each thread starts its own generator there. The state is recovered from
/// the next output by inverting SplitMix64's output mix (`rng_state`); the CPU test
/// `par_randn_is_randn` checks the whole premise against `Rng::randn`. The data of the
/// 4001-token MoE cases (up to 34087 x 7168 normals) took 5-14 s per case on one core.
fn par_randn<T: tk_core::Element>(
    rng: &mut Rng,
    shape: &[usize],
    conv: impl Fn(f32) -> T + Sync,
) -> HostTensor<T> {
    const MIN_PER_THREAD: usize = 1 << 18;
    let n: usize = shape.iter().product();
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(n / MIN_PER_THREAD)
        .max(1);
    if threads == 1 {
        return rng.randn(shape, conv);
    }
    let s = rng_state(rng);
    let mut data = vec![T::from_bits_u64(0); n];
    let per = n.div_ceil(threads);
    std::thread::scope(|sc| {
        for (i, part) in data.chunks_mut(per).enumerate() {
            let conv = &conv;
            sc.spawn(move || {
                let first = (i * per) as u64;
                let mut r =
                    Rng::new(s.wrapping_add(first.wrapping_mul(SPLITMIX_GAMMA.wrapping_mul(2))));
                for e in part {
                    *e = conv(r.normal());
                }
            });
        }
    });
    *rng = Rng::new(s.wrapping_add((n as u64).wrapping_mul(SPLITMIX_GAMMA.wrapping_mul(2))));
    HostTensor::from_vec(data, shape).unwrap()
}

/// The increment of `Rng`'s SplitMix64 state per 64-bit draw.
const SPLITMIX_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// The current SplitMix64 state of `rng` (the seed of an `Rng::new` that continues it): its
/// next output with SplitMix64's output mix undone, less one increment.
fn rng_state(rng: &Rng) -> u64 {
    /// `x` from `x ^ (x >> s)`.
    fn unshift(y: u64, s: u32) -> u64 {
        let mut x = y;
        for _ in 0..64 / s {
            x = y ^ (x >> s);
        }
        x
    }
    /// The inverse of an odd `a` modulo 2^64 (Newton's iteration, 6 doublings of the
    /// correct low bits from 3).
    fn inverse(a: u64) -> u64 {
        let mut x = a;
        for _ in 0..6 {
            x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
        }
        x
    }
    let z = unshift(rng.clone().next_u64(), 31);
    let z = unshift(z.wrapping_mul(inverse(0x94d0_49bb_1331_11eb)), 27);
    let z = unshift(z.wrapping_mul(inverse(0xbf58_476d_1ce4_e5b9)), 30);
    z.wrapping_sub(SPLITMIX_GAMMA)
}

/// [`par_randn`]'s premise: the same tensor as `Rng::randn` and the same stream afterwards,
/// for sizes on both sides of its threading threshold and uneven splits.
#[test]
fn par_randn_is_randn() {
    for (case, shape) in [
        ("a", vec![3, 5]),
        ("b", vec![1 << 19]),
        ("c", vec![1237, 1031]),
    ] {
        let mut a = Rng::for_case(case);
        let _ = a.next_u64();
        let mut b = a.clone();
        let x = a.randn(&shape, bf16::from_f32);
        let y = par_randn(&mut b, &shape, bf16::from_f32);
        assert_bits_eq(case, y.as_slice(), x.as_slice());
        assert_eq!(a.next_u64(), b.next_u64(), "{case}: the stream afterwards");
    }
}

/// Orders `cases` by decreasing `cost` (stable), so that the largest start first and the
/// last workers are not left with a few big cases.
fn biggest_first<C>(cases: &mut [C], cost: impl Fn(&C) -> usize) {
    cases.sort_by_key(|c| std::cmp::Reverse(cost(c)));
}

/// Workers for the MoE grids: 16, or 4 under TK_FULL_TEST (its 4001-token cases hold several
/// gigabytes each).
fn moe_workers() -> usize {
    if full_test() {
        4
    } else {
        16
    }
}

/// The MoE sources: the spec's 12 configurations at [`SMALL_TOKENS`] tokens per rank; under
/// TK_FULL_TEST also the full MoE grid (with its zero-token case) at [`SMALL_TOKENS`] and the
/// 12 at the spec's 4001.
fn moe_sources() -> Vec<MoeParams> {
    let small = |p: MoeParams| MoeParams {
        num_send_tokens: p.num_send_tokens.min(SMALL_TOKENS),
        ..p
    };
    if !full_test() {
        return generate_moe_params_with(false, false)
            .into_iter()
            .map(small)
            .collect();
    }
    let mut v: Vec<MoeParams> = generate_moe_params_with(false, true)
        .into_iter()
        .map(small)
        .collect();
    v.extend(generate_moe_params_with(false, false));
    v
}

/// Routing of one MoE source: `topk_idx` `(T, k)` and its fused mapping with `alignment`.
struct Routing {
    t: usize,
    k: usize,
    map: FusedMapping,
}

impl Routing {
    fn new(moe: &MoeParams, alignment: usize, rng: &mut Rng) -> Self {
        let idx = generate_topk_idx(rng, moe).unwrap();
        let params = GetFusedMappingParams {
            num_experts: moe.num_experts,
            alignment,
            rows: FusedRows::HostSync,
        };
        let map = get_fused_mapping(&idx.view(), &params).unwrap();
        Self {
            t: idx.shape()[0],
            k: moe.num_topk,
            map,
        }
    }

    fn n(&self) -> usize {
        self.map.num_rows()
    }

    /// `x` `(T, w)` expanded to the fused rows `(N, w)` (padding rows zero).
    fn expand<T: tk_core::Element>(&self, x: &HostTensor<T>) -> HostTensor<T> {
        expand_to_fused(
            &x.view(),
            &self.map.token_topk_to_pos.view(),
            &self.map.pos_to_expert.view(),
        )
        .unwrap()
    }
}

/// CUDA's `expf` for every bf16 value (the table is indexed by the top 16 bits) and for any
/// other argument given.
struct ExpfTable {
    bf16: Vec<f32>,
    extra: HashMap<u32, f32>,
}

impl ExpfTable {
    fn new(dev: &Device, extra_args: &[f32]) -> Self {
        let mut args: Vec<f32> = (0..=0xFFFFu32).map(|b| f32::from_bits(b << 16)).collect();
        let mut extra: Vec<u32> = extra_args
            .iter()
            .map(|v| v.to_bits())
            .filter(|b| b & 0xFFFF != 0)
            .collect();
        extra.sort_unstable();
        extra.dedup();
        args.extend(extra.iter().map(|&b| f32::from_bits(b)));
        let vals = gpu_expf(dev, &args);
        Self {
            bf16: vals[..0x10000].to_vec(),
            extra: extra
                .into_iter()
                .zip(vals[0x10000..].iter().copied())
                .collect(),
        }
    }

    fn get(&self, x: f32) -> f32 {
        let b = x.to_bits();
        if b & 0xFFFF == 0 {
            return self.bf16[(b >> 16) as usize];
        }
        *self
            .extra
            .get(&b)
            .unwrap_or_else(|| panic!("expf({x:e}) is not in the GPU table"))
    }
}

/// [`cpu_expf`], memoised for the bf16 arguments (low 16 bits zero: every gate of a bf16
/// input and the grid's clamp values), which the tolerance checks ask for millions of times.
fn cpu_expf_memo(x: f32) -> f32 {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    let b = x.to_bits();
    if b & 0xFFFF != 0 {
        return cpu_expf(x);
    }
    TABLE.get_or_init(|| {
        (0..=0xFFFFu32)
            .map(|b| cpu_expf(f32::from_bits(b << 16)))
            .collect()
    })[(b >> 16) as usize]
}

/// CUDA's `expf` of every element of `args`.
fn gpu_expf(dev: &Device, args: &[f32]) -> Vec<f32> {
    let d = dev
        .upload(&HostTensor::from_vec(args.to_vec(), &[args.len()]).unwrap())
        .unwrap();
    device_expf(&d.view())
        .unwrap()
        .to_host()
        .unwrap()
        .into_vec()
}

/// The GPU's `expf` of each element's argument, replayed by element index (the backward
/// reference asks for element `e = i · H + j` from any thread): every argument is checked
/// against the recorded one, so a reference that asks another element's `expf` fails loudly.
struct Replay {
    args: Vec<f32>,
    vals: Vec<f32>,
}

impl Replay {
    fn new(dev: &Device, args: Vec<f32>) -> Self {
        let vals = gpu_expf(dev, &args);
        Self { args, vals }
    }

    fn expf(&self, e: usize, x: f32) -> f32 {
        assert!(
            e < self.args.len() && self.args[e].to_bits() == x.to_bits(),
            "the reference asked expf({x:e}) for element {e}, the test replays {:?}",
            self.args.get(e)
        );
        self.vals[e]
    }
}

/// Whether two fp32 slices are bitwise equal.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Bit-exact comparison of GPU data and scales (full allocation) with the reference's.
fn check_quant(case: &str, d: &DeviceQuantData, s: &DeviceScales, rd: &QuantData, rs: &HostScales) {
    let got = d.to_host().unwrap();
    assert_eq!(got.shape(), rd.shape(), "{case}: data shape");
    let what = format!("{case}: data");
    match (&got, rd) {
        (QuantData::E4M3(g), QuantData::E4M3(r)) => {
            assert_bits_eq(&what, g.as_slice(), r.as_slice())
        }
        (QuantData::E2M1(g), QuantData::E2M1(r)) => {
            assert_bits_eq(&what, g.as_slice(), r.as_slice())
        }
        _ => panic!(
            "{case}: data format {:?}, expected {:?}",
            got.format(),
            rd.format()
        ),
    }
    assert_eq!(
        (s.layout(), s.grid()),
        (rs.layout(), rs.grid()),
        "{case}: scale layout"
    );
    assert_bits_eq(
        &format!("{case}: scales"),
        &s.storage_bytes().unwrap(),
        &rs.storage_bytes(),
    );
}

/// Poisoned data `(m, k)` (logical) and scales.
fn poisoned(
    dev: &Device,
    fmt: CastFormat,
    (m, k): (usize, usize),
    layout: ScaleLayout,
    grid: tk_quant::ScaleGrid,
) -> (DeviceQuantData, DeviceScales) {
    let mut d = DeviceQuantData::alloc(dev, fmt, m, k).unwrap();
    d.fill_bytes(POISON).unwrap();
    let mut s = DeviceScales::alloc(dev, layout, grid).unwrap();
    s.fill_bytes(POISON).unwrap();
    (d, s)
}

fn poisoned_tensor<T: tk_core::Element>(dev: &Device, shape: &[usize]) -> DeviceTensor<T> {
    let mut t = dev.alloc::<T>(shape).unwrap();
    t.fill_bytes(POISON).unwrap();
    t
}

// ---------------------------------------------------------------------------------------------
// swiglu_forward_and_per_token_cast
// ---------------------------------------------------------------------------------------------

/// Host and device copies of a forward input: `x` (plain, any layout), optional weights (any
/// layout) and `pos_to_expert`.
struct FwdData {
    x: Plain,
    layout: Layout,
    ptt: HostTensor<i32>,
    weights: HostTensor<f32>,
    /// The `(T, k)` view of the weights' storage.
    wlayout: Layout,
    pte: HostTensor<i32>,
    dx: DevPlain,
    dptt: DeviceTensor<i32>,
    dweights: DeviceTensor<f32>,
    dpte: DeviceTensor<i32>,
}

enum Plain {
    F32(HostTensor<f32>),
    BF16(HostTensor<bf16>),
}

enum DevPlain {
    F32(DeviceTensor<f32>),
    BF16(DeviceTensor<bf16>),
}

impl FwdData {
    fn new(
        dev: &Device,
        x: Plain,
        layout: Layout,
        ptt: HostTensor<i32>,
        weights: HostTensor<f32>,
        pte: HostTensor<i32>,
    ) -> Self {
        let dx = match &x {
            Plain::F32(t) => DevPlain::F32(dev.upload(t).unwrap()),
            Plain::BF16(t) => DevPlain::BF16(dev.upload(t).unwrap()),
        };
        Self {
            dptt: dev.upload(&ptt).unwrap(),
            dweights: dev.upload(&weights).unwrap(),
            wlayout: Layout::contiguous(weights.shape()),
            dpte: dev.upload(&pte).unwrap(),
            x,
            layout,
            ptt,
            weights,
            pte,
            dx,
        }
    }

    /// The same data with the weights `(T, k)` read through `wlayout` from `storage`.
    fn with_weights(mut self, dev: &Device, storage: HostTensor<f32>, wlayout: Layout) -> Self {
        self.dweights = dev.upload(&storage).unwrap();
        self.weights = storage;
        self.wlayout = wlayout;
        self
    }

    fn n(&self) -> usize {
        self.layout.shape()[0]
    }

    fn h(&self) -> usize {
        self.layout.shape()[1] / 2
    }

    fn host(&self, weights: bool, pte: bool) -> SwigluForwardInputs<'_> {
        let x = match &self.x {
            Plain::F32(t) => PlainInput::F32(t.view().with_layout(self.layout.clone()).unwrap()),
            Plain::BF16(t) => PlainInput::BF16(t.view().with_layout(self.layout.clone()).unwrap()),
        };
        SwigluForwardInputs {
            x,
            topk: weights.then(|| TopkWeights {
                pos_to_token_topk: self.ptt.view(),
                topk_weights: self
                    .weights
                    .view()
                    .with_layout(self.wlayout.clone())
                    .unwrap(),
            }),
            pos_to_expert: pte.then(|| self.pte.view()),
        }
    }

    fn device(&self, weights: bool, pte: bool) -> DeviceSwigluForwardInputs<'_> {
        let x = match &self.dx {
            DevPlain::F32(t) => {
                DevicePlainInput::F32(t.view().with_layout(self.layout.clone()).unwrap())
            }
            DevPlain::BF16(t) => {
                DevicePlainInput::BF16(t.view().with_layout(self.layout.clone()).unwrap())
            }
        };
        DeviceSwigluForwardInputs {
            x,
            topk: weights.then(|| DeviceTopkWeights {
                pos_to_token_topk: self.dptt.view(),
                topk_weights: self
                    .dweights
                    .view()
                    .with_layout(self.wlayout.clone())
                    .unwrap(),
            }),
            pos_to_expert: pte.then(|| self.dpte.view()),
        }
    }

    /// Every `expf` argument of the activation with clamp `c` (processed or not).
    fn expf_args(&self, c: Option<f32>) -> Vec<f32> {
        let (n, h) = (self.n(), self.h());
        let mut v = Vec::with_capacity(n * h);
        for i in 0..n {
            for j in 0..h {
                let l = match &self.x {
                    Plain::F32(t) => t
                        .view()
                        .with_layout(self.layout.clone())
                        .unwrap()
                        .at(&[i, j]),
                    Plain::BF16(t) => t
                        .view()
                        .with_layout(self.layout.clone())
                        .unwrap()
                        .at(&[i, j])
                        .to_f32(),
                };
                v.push(-clamp_gate(l, c).0);
            }
        }
        v
    }
}

/// Runs the GPU forward in `params` (outputs poisoned; counts from zero) and returns the
/// activation (`F32`) or the quantized data and scales, plus the counts.
enum FwdGot {
    F32(HostTensor<f32>),
    BF16(HostTensor<bf16>),
    Quant(Box<(DeviceQuantData, DeviceScales)>),
}

fn run_forward(
    dev: &Device,
    inputs: &DeviceSwigluForwardInputs<'_>,
    params: &SwigluForwardParams,
    n: usize,
    h: usize,
) -> (FwdGot, Option<[i64; 3]>) {
    let mut counts = params
        .count_clamped
        .then(|| dev.zeros::<i64>(&[3]).unwrap());
    let mut cv = counts.as_mut().map(|c| c.view_mut());
    let got = match params.out_format {
        SwigluOutFormat::F32 => {
            let mut t = poisoned_tensor::<f32>(dev, &[n, h]);
            let mut o = DeviceSwigluOutMut::F32(t.view_mut());
            tk_quant::swiglu_forward_and_per_token_cast_into(inputs, params, &mut o, cv.as_mut())
                .unwrap();
            FwdGot::F32(t.to_host().unwrap())
        }
        SwigluOutFormat::BF16 => {
            let mut t = poisoned_tensor::<bf16>(dev, &[n, h]);
            let mut o = DeviceSwigluOutMut::BF16(t.view_mut());
            tk_quant::swiglu_forward_and_per_token_cast_into(inputs, params, &mut o, cv.as_mut())
                .unwrap();
            FwdGot::BF16(t.to_host().unwrap())
        }
        f => {
            let cast = validate_dims(n, 2 * h, params).unwrap().cast.unwrap();
            let (mut d, mut s) = poisoned(
                dev,
                f.cast_format().unwrap(),
                (n, h),
                cast.sf_layout,
                cast.grid,
            );
            let mut o = DeviceSwigluOutMut::Quantized(d.view_mut(), &mut s);
            tk_quant::swiglu_forward_and_per_token_cast_into(inputs, params, &mut o, cv.as_mut())
                .unwrap();
            drop(o);
            FwdGot::Quant(Box::new((d, s)))
        }
    };
    drop(cv);
    let counts = counts.map(|c| {
        let v = c.to_host().unwrap().into_vec();
        [v[0], v[1], v[2]]
    });
    (got, counts)
}

/// The routing and clamp options of one forward check.
#[derive(Debug, Clone, Copy)]
struct FwdConfig {
    weights: bool,
    pte: bool,
    clamp: Option<f32>,
    /// Also check the activation against the CPU `expf` reference within the tolerance.
    tolerance: bool,
}

/// Checks one forward configuration: the GPU activation bit for bit against the reference
/// with the GPU's `expf` (and, with `tolerance`, within the tolerance of the CPU `expf`
/// reference), then every format in `formats` bit for bit against the downstream reference
/// fed with the GPU's activation, and the clamp counts.
fn check_forward(
    dev: &Device,
    name: &str,
    data: &FwdData,
    cfg: FwdConfig,
    table: &ExpfTable,
    casts: &[SwigluForwardParams],
) {
    let FwdConfig {
        weights,
        pte,
        clamp,
        tolerance,
    } = cfg;
    let (n, h) = (data.n(), data.h());
    let hin = data.host(weights, pte);
    let din = data.device(weights, pte);
    let mut act_params = SwigluForwardParams::plain(SwigluOutFormat::F32);
    act_params.swiglu_clamp_value = clamp;
    act_params.count_clamped = clamp.is_some();
    let (ref_act, ref_counts) =
        reference::swiglu_forward_activation(&hin, &act_params, &|x| table.get(x)).unwrap();
    let (got, counts) = run_forward(dev, &din, &act_params, n, h);
    let FwdGot::F32(act) = got else {
        unreachable!()
    };
    assert_bits_eq(
        &format!("{name}: activation"),
        act.as_slice(),
        ref_act.as_slice(),
    );
    assert_eq!(counts, ref_counts, "{name}: clamp counts");
    if tolerance {
        let (cpu_act, _) =
            reference::swiglu_forward_activation(&hin, &act_params, &cpu_expf_memo).unwrap();
        let bad = act
            .as_slice()
            .iter()
            .zip(cpu_act.as_slice())
            .position(|(&g, &c)| !activation_within_tolerance(g, c));
        assert!(
            bad.is_none(),
            "{name}: activation outside the expf tolerance at {bad:?}"
        );
    }
    let mut shared = DownstreamCache::default();
    for p in casts {
        let mut p = *p;
        p.swiglu_clamp_value = clamp;
        let case = format!(
            "{name} {:?} npc={} {:?} count={}",
            p.out_format,
            p.num_per_channels,
            p.opts.layout().unwrap(),
            p.count_clamped
        );
        let (got, counts) = run_forward(dev, &din, &p, n, h);
        let expected = shared.downstream(&act.view(), pte.then(|| data.pte.view()).as_ref(), &p);
        match (got, expected) {
            (FwdGot::BF16(g), SwigluOut::BF16(r)) => {
                assert_bits_eq(&format!("{case}: bf16"), g.as_slice(), r.as_slice())
            }
            (FwdGot::Quant(q), SwigluOut::Quantized(rd, rs)) => {
                check_quant(&case, &q.0, &q.1, &rd, &rs)
            }
            _ => panic!("{case}: unexpected output kind"),
        }
        if p.count_clamped {
            assert_eq!(counts, ref_counts, "{case}: clamp counts");
        }
    }
}

/// The downstream references of one activation, computed once per distinct cast: the data
/// and scale values of a cast depend on its format, `npc`, rounding and `sf_clamp_min`, not on
/// the scale layout, so a cast differing from an earlier one only in its layout gets the
/// earlier reference with the scales re-laid out ([`HostScales::to_layout`]; checked against
/// the direct reference by `downstream_reference_is_layout_independent`).
#[derive(Default)]
struct DownstreamCache {
    done: Vec<(DownstreamKey, QuantData, HostScales)>,
}

/// What a quantized downstream reference depends on besides the activation and padding.
type DownstreamKey = (SwigluOutFormat, usize, bool, Option<u32>);

fn downstream_key(p: &SwigluForwardParams) -> DownstreamKey {
    (
        p.out_format,
        p.num_per_channels,
        p.opts.round_sf || p.opts.use_packed_ue8m0,
        p.sf_clamp_min.map(f32::to_bits),
    )
}

impl DownstreamCache {
    /// `reference::swiglu_forward_downstream(act, pte, p)`, reusing an earlier cast's.
    fn downstream(
        &mut self,
        act: &tk_core::HostView<'_, f32>,
        pte: Option<&tk_core::HostView<'_, i32>>,
        p: &SwigluForwardParams,
    ) -> SwigluOut {
        let key = downstream_key(p);
        let layout = p.opts.layout().unwrap();
        if p.out_format.cast_format().is_some() {
            if let Some((_, d, s)) = self.done.iter().find(|(k, _, _)| *k == key) {
                if let Ok(s) = s.to_layout(layout) {
                    return SwigluOut::Quantized(d.clone(), s);
                }
            }
        }
        let r = reference::swiglu_forward_downstream(act, pte, p).unwrap();
        if let SwigluOut::Quantized(d, s) = &r {
            self.done.push((key, d.clone(), s.clone()));
        }
        r
    }
}

/// [`DownstreamCache`]'s premise, on the CPU: for every cast of the grids, the reference in
/// each scale layout equals the first same-key cast's reference re-laid out.
#[test]
fn downstream_reference_is_layout_independent() {
    let (n, h) = (37, 384);
    let mut rng = Rng::for_case("downstream layouts");
    let act = rng.randn(&[n, h], |v| 2.0 * v);
    let pte = HostTensor::from_vec((0..n as i32).map(|i| i % 5 - 1).collect(), &[n]).unwrap();
    let layouts = [
        ScaleOptions::row_major(false),
        ScaleOptions::col_major(false),
        ScaleOptions::row_major(true),
        ScaleOptions::col_major(true),
        ScaleOptions::packed_ue8m0(),
    ];
    for pte in [None, Some(pte.view())] {
        for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
            for npc in [128, h] {
                for eps in [None, Some(0.5)] {
                    let mut cache = DownstreamCache::default();
                    for opts in layouts {
                        if npc == h && opts.use_tma_aligned_col_major_sf {
                            continue;
                        }
                        let mut p = SwigluForwardParams::cast(fmt, npc, opts);
                        p.sf_clamp_min = eps;
                        let case = format!("{fmt:?} npc={npc} {:?} eps={eps:?}", opts.layout());
                        let direct =
                            reference::swiglu_forward_downstream(&act.view(), pte.as_ref(), &p)
                                .unwrap();
                        let shared = cache.downstream(&act.view(), pte.as_ref(), &p);
                        let (SwigluOut::Quantized(d0, s0), SwigluOut::Quantized(d1, s1)) =
                            (direct, shared)
                        else {
                            panic!("{case}: not quantized")
                        };
                        assert_bits_eq(&format!("{case}: data"), &d1.bytes(), &d0.bytes());
                        assert_eq!((s1.layout(), s1.grid()), (s0.layout(), s0.grid()), "{case}");
                        assert_bits_eq(
                            &format!("{case}: scales"),
                            &s1.storage_bytes(),
                            &s0.storage_bytes(),
                        );
                    }
                }
            }
        }
    }
}

/// A MoE forward source: `x = expand_to_fused(randn (T, 2H) bf16)`, weights `randn (T, k)`,
/// the mapping with alignment 16.
fn moe_forward_data(dev: &Device, moe: &MoeParams, h: usize, name: &str) -> FwdData {
    let mut rng = Rng::for_case(name);
    let r = Routing::new(moe, 16, &mut rng);
    let weights = rng.randn(&[r.t, r.k], |v| v);
    let x = r.expand(&par_randn(&mut rng, &[r.t, 2 * h], bf16::from_f32));
    let layout = Layout::contiguous(&[r.n(), 2 * h]);
    FwdData::new(
        dev,
        Plain::BF16(x),
        layout,
        r.map.pos_to_token_topk.clone(),
        weights,
        r.map.pos_to_expert.clone(),
    )
}

#[test]
fn gpu_swiglu_forward_grid() {
    let Some(dev) = gpu_or_skip("gpu_swiglu_forward_grid") else {
        return;
    };
    let table = ExpfTable::new(&dev, &[]);
    let hs: Vec<usize> = [1024, 1280, 1536, 2048, 3072, 3584].into();
    let mut sources: Vec<(MoeParams, usize)> = moe_sources()
        .into_iter()
        .flat_map(|m| hs.iter().map(move |&h| (m, h)))
        .collect();
    biggest_first(&mut sources, |(m, h)| m.num_send_tokens * m.num_topk * h);
    let done = AtomicUsize::new(0);
    let ran = par_cases(&sources, moe_workers(), |(moe, h)| {
        let dev = dev.with_new_stream().unwrap();
        let name = format!("swiglu_fwd {} H={h}", moe.name());
        let data = moe_forward_data(&dev, moe, *h, &name);
        for clamp in [None, Some(10.0), Some(0.5)] {
            for pte in [true, false] {
                for weights in [true, false] {
                    let mut casts = Vec::new();
                    for npc in [128, *h] {
                        for opts in [ScaleOptions::row_major(true), ScaleOptions::packed_ue8m0()] {
                            if (opts.use_packed_ue8m0 && weights)
                                || (opts.use_tma_aligned_col_major_sf && npc == *h)
                            {
                                continue;
                            }
                            let mut p = SwigluForwardParams::cast(CastFormat::E4M3, npc, opts);
                            p.count_clamped = clamp.is_some() && npc != *h;
                            casts.push(p);
                        }
                    }
                    done.fetch_add(casts.len(), Ordering::Relaxed);
                    let name = format!("{name} clamp={clamp:?} pte={pte} weights={weights}");
                    let cfg = FwdConfig {
                        weights,
                        pte,
                        clamp,
                        tolerance: !weights && !pte,
                    };
                    check_forward(&dev, &name, &data, cfg, &table, &casts);
                }
            }
        }
    });
    assert_eq!(
        done.load(Ordering::Relaxed),
        30 * ran,
        "spec §3.10: 2160 cases per 12 MoE sources"
    );
}

#[test]
fn gpu_swiglu_forward_off_grid() {
    let Some(dev) = gpu_or_skip("gpu_swiglu_forward_off_grid") else {
        return;
    };
    let all_layouts = [
        ScaleOptions::row_major(false),
        ScaleOptions::col_major(false),
        ScaleOptions::row_major(true),
        ScaleOptions::col_major(true),
        ScaleOptions::packed_ue8m0(),
    ];
    // (N, H, fp32 input, row stride - 2H): odd row counts, hidden sizes off the grid, a whole
    // row of 8192 (one CTA of 1024 threads), unaligned (bytewise) rows; the padded shapes also
    // take weights that are not row-contiguous.
    let shapes = [
        (0, 128, false, 0),
        (1, 128, false, 0),
        (17, 384, true, 0),
        (100, 640, false, 3),
        (33, 8192, false, 0),
        (64, 256, true, 5),
        (130, 1152, false, 8),
    ];
    let cases: Vec<_> = shapes
        .iter()
        .flat_map(|&s| [None, Some(0.75)].map(move |c| (s, c)))
        .collect();
    par_cases(&cases, 8, |&((n, h, fp32, pad), clamp)| {
        let dev = dev.with_new_stream().unwrap();
        let name = format!("swiglu_fwd off-grid N={n} H={h} fp32={fp32} pad={pad} clamp={clamp:?}");
        let mut rng = Rng::for_case(&name);
        let ld = 2 * h + pad;
        let rows = n.max(1);
        let x = if fp32 {
            Plain::F32(rng.randn(&[rows, ld], |v| 3.0 * v))
        } else {
            Plain::BF16(rng.randn(&[rows, ld], |v| bf16::from_f32(3.0 * v)))
        };
        let layout = Layout::new(vec![n, 2 * h], vec![ld, 1], 0).unwrap();
        let (t, k) = (5, 3);
        let weights = rng.randn(&[t, k], |v| v);
        // Weights: some negative and out-of-range-free slots; pos_to_expert: an all-padding
        // block of 16 rows, scattered padding rows.
        let ptt: Vec<i32> = (0..n)
            .map(|i| {
                if i % 7 == 3 {
                    -1
                } else {
                    ((i * 5) % (t * k)) as i32
                }
            })
            .collect();
        let pte: Vec<i32> = (0..n)
            .map(|i| {
                if (16..32).contains(&i) || i % 5 == 4 {
                    -1
                } else {
                    (i % 4) as i32
                }
            })
            .collect();
        let data = FwdData::new(
            &dev,
            x,
            layout,
            HostTensor::from_vec(ptt, &[n]).unwrap(),
            weights,
            HostTensor::from_vec(pte, &[n]).unwrap(),
        );
        // Weights that are not row-contiguous (the kernel's general index path): column-major
        // for odd pads, a padded row stride for pad 8.
        let data = match pad {
            3 | 5 => data.with_weights(
                &dev,
                rng.randn(&[k, t], |v| v),
                Layout::new(vec![t, k], vec![1, t], 0).unwrap(),
            ),
            8 => data.with_weights(
                &dev,
                rng.randn(&[t, 2 * k + 1], |v| v),
                Layout::new(vec![t, k], vec![2 * k + 1, 1], 0).unwrap(),
            ),
            _ => data,
        };
        let table = ExpfTable::new(&dev, &data.expf_args(clamp));
        for (weights, pte) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut casts = vec![SwigluForwardParams::plain(SwigluOutFormat::BF16)];
            for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
                for opts in all_layouts {
                    for npc in [128, h] {
                        if npc == h && opts.use_tma_aligned_col_major_sf {
                            continue;
                        }
                        let mut p = SwigluForwardParams::cast(fmt, npc, opts);
                        p.count_clamped = clamp.is_some();
                        casts.push(p);
                    }
                }
                let mut p = SwigluForwardParams::cast(fmt, 128, ScaleOptions::row_major(false));
                p.sf_clamp_min = Some(0.5);
                casts.push(p);
            }
            let name = format!("{name} weights={weights} pte={pte}");
            let cfg = FwdConfig {
                weights,
                pte,
                clamp,
                tolerance: true,
            };
            check_forward(&dev, &name, &data, cfg, &table, &casts);
        }
    });
}

#[test]
fn gpu_swiglu_forward_allocating_form_and_counter_accumulates() {
    let Some(dev) = gpu_or_skip("gpu_swiglu_forward_allocating_form_and_counter_accumulates")
    else {
        return;
    };
    let name = "swiglu_fwd allocating";
    let data = moe_forward_data(
        &dev,
        &MoeParams {
            num_send_tokens: 64,
            num_topk: 6,
            num_experts: 32,
            num_ep_ranks: 8,
        },
        256,
        name,
    );
    let (n, h) = (data.n(), data.h());
    let mut p = SwigluForwardParams::cast(CastFormat::E4M3, 128, ScaleOptions::packed_ue8m0())
        .with_clamp(0.5);
    p.count_clamped = true;
    let din = data.device(false, true);
    let out = tk_quant::swiglu_forward_and_per_token_cast(&din, &p).unwrap();
    let (gq, gc) = run_forward(&dev, &din, &p, n, h);
    let (tk_quant::DeviceSwigluOut::Quantized(d, s), FwdGot::Quant(q2)) = (out.out, gq) else {
        panic!("quantized output")
    };
    let (d2, s2) = *q2;
    assert_bits_eq(
        "allocating data",
        &d.to_host().unwrap().bytes(),
        &d2.to_host().unwrap().bytes(),
    );
    assert_bits_eq(
        "allocating scales",
        &s.storage_bytes().unwrap(),
        &s2.storage_bytes().unwrap(),
    );
    let c1 = out.clamped_count.unwrap();
    assert_eq!(
        c1.to_host().unwrap().into_vec(),
        gc.unwrap().to_vec(),
        "counts"
    );
    // `_into` adds to the counter.
    let mut c = c1;
    let mut t = dev.alloc::<F8E4M3>(&[n, h]).unwrap();
    let mut o = DeviceSwigluOutMut::Quantized(
        tk_quant::DeviceQuantDataViewMut::E4M3(t.view_mut()),
        &mut DeviceScales::alloc(&dev, ScaleLayout::PackedUe8m0, s.grid()).unwrap(),
    );
    tk_quant::swiglu_forward_and_per_token_cast_into(&din, &p, &mut o, Some(&mut c.view_mut()))
        .unwrap();
    let twice: Vec<i64> = gc.unwrap().iter().map(|v| 2 * v).collect();
    assert_eq!(
        c.to_host().unwrap().into_vec(),
        twice,
        "counter accumulates"
    );
}

/// The clamp without counting: `C` with a clear sign bit takes the kernels' min / max clamp (on
/// the bf16 pairs for 0.5 and 0, in fp32 for 0.3, which bf16 cannot hold), `C = -0.0` the
/// select clamp (the two order the zeros differently), in the tiled paths (e4m3
/// in layouts A and C, e2m1, bf16) and the whole-row path; every cast bit for bit against the
/// downstream reference of the checked activation, and the fp32 output bit for bit that
/// activation (the counting kernel's, checked against the reference by `check_forward`).
#[test]
fn gpu_swiglu_forward_clamp_without_counts() {
    let Some(dev) = gpu_or_skip("gpu_swiglu_forward_clamp_without_counts") else {
        return;
    };
    // expf(-0.3): the clamped gate 0.3 is not a bf16 value.
    let table = ExpfTable::new(&dev, &[-0.3]);
    let moe = MoeParams {
        num_send_tokens: 96,
        num_topk: 6,
        num_experts: 32,
        num_ep_ranks: 8,
    };
    for h in [1280, 2048] {
        let name = format!("swiglu_fwd clamp without counts H={h}");
        let data = moe_forward_data(&dev, &moe, h, &name);
        let (n, h) = (data.n(), data.h());
        for c in [0.5f32, 0.3, 0.0, -0.0] {
            for (weights, pte) in [(false, false), (true, true)] {
                let mut casts = vec![SwigluForwardParams::plain(SwigluOutFormat::BF16)];
                for (fmt, npc, opts) in [
                    (CastFormat::E4M3, 128, ScaleOptions::row_major(true)),
                    (CastFormat::E4M3, 128, ScaleOptions::packed_ue8m0()),
                    (CastFormat::E4M3, h, ScaleOptions::row_major(true)),
                    (CastFormat::E2M1, 128, ScaleOptions::row_major(true)),
                ] {
                    if !(opts.use_packed_ue8m0 && weights) {
                        casts.push(SwigluForwardParams::cast(fmt, npc, opts));
                    }
                }
                let name = format!("{name} C={c:?} weights={weights} pte={pte}");
                let cfg = FwdConfig {
                    weights,
                    pte,
                    clamp: Some(c),
                    tolerance: false,
                };
                check_forward(&dev, &name, &data, cfg, &table, &casts);
                let din = data.device(weights, pte);
                let mut p = SwigluForwardParams::plain(SwigluOutFormat::F32).with_clamp(c);
                let FwdGot::F32(plain) = run_forward(&dev, &din, &p, n, h).0 else {
                    unreachable!()
                };
                p.count_clamped = true;
                let FwdGot::F32(counted) = run_forward(&dev, &din, &p, n, h).0 else {
                    unreachable!()
                };
                assert_bits_eq(
                    &format!("{name}: fp32 without counts"),
                    plain.as_slice(),
                    counted.as_slice(),
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// swiglu_backward_and_per_token_cast
// ---------------------------------------------------------------------------------------------

/// Host and device copies of a backward input.
struct BwdData {
    npc: usize,
    q: HostTensor<F8E4M3>,
    q_layout: Layout,
    sf: HostTensor<f32>,
    grad: HostTensor<bf16>,
    weight: HostTensor<f32>,
    ptt: HostTensor<i32>,
    ttp: HostTensor<i32>,
    dq: DeviceTensor<F8E4M3>,
    dsf: DeviceTensor<f32>,
    dgrad: DeviceTensor<bf16>,
    dweight: DeviceTensor<f32>,
    dptt: DeviceTensor<i32>,
    dttp: DeviceTensor<i32>,
}

impl BwdData {
    /// `x_expand` `(N, 2H)` is cast per token (non-rounded fp32 scales, as the spec's test);
    /// the quantized data is laid out with row stride `2H + pad`.
    fn new(
        dev: &Device,
        npc: usize,
        x_expand: &HostTensor<bf16>,
        pad: usize,
        grad: HostTensor<bf16>,
        (weight, ptt, ttp): (HostTensor<f32>, HostTensor<i32>, HostTensor<i32>),
    ) -> Self {
        let (n, two_h) = (x_expand.shape()[0], x_expand.shape()[1]);
        let params = PerTokenCastParams::new(CastFormat::E4M3, npc, ScaleOptions::row_major(false));
        let (q0, s0) =
            reference::per_token_cast(&CastInput::from(x_expand.view()), &params).unwrap();
        let q0 = q0.as_e4m3().unwrap().as_slice().to_vec();
        let ld = two_h + pad;
        let mut qbuf = vec![F8E4M3::from_bits(0x55); n.max(1) * ld];
        for i in 0..n {
            qbuf[i * ld..i * ld + two_h].copy_from_slice(&q0[i * two_h..(i + 1) * two_h]);
        }
        let q = HostTensor::from_vec(qbuf, &[n.max(1), ld]).unwrap();
        let q_layout = Layout::new(vec![n, two_h], vec![ld, 1], 0).unwrap();
        let sf =
            HostTensor::from_vec(s0.f32_storage().unwrap().to_vec(), &[n, two_h / npc]).unwrap();
        Self {
            npc,
            dq: dev.upload(&q).unwrap(),
            dsf: dev.upload(&sf).unwrap(),
            dgrad: dev.upload(&grad).unwrap(),
            dweight: dev.upload(&weight).unwrap(),
            dptt: dev.upload(&ptt).unwrap(),
            dttp: dev.upload(&ttp).unwrap(),
            q,
            q_layout,
            sf,
            grad,
            weight,
            ptt,
            ttp,
        }
    }

    fn host(&self) -> SwigluBackwardInputs<'_> {
        SwigluBackwardInputs {
            x: tk_quant::QuantDataView::E4M3(
                self.q.view().with_layout(self.q_layout.clone()).unwrap(),
            ),
            x_sf: self.sf.view(),
            grad_out: self.grad.view(),
            weight: self.weight.view(),
            pos_to_token_topk: self.ptt.view(),
            token_topk_to_pos: self.ttp.view(),
        }
    }

    fn device(&self) -> DeviceSwigluBackwardInputs<'_> {
        DeviceSwigluBackwardInputs {
            x: self.dq.view().with_layout(self.q_layout.clone()).unwrap(),
            x_sf: self.dsf.view(),
            grad_out: self.dgrad.view(),
            weight: self.dweight.view(),
            pos_to_token_topk: self.dptt.view(),
            token_topk_to_pos: self.dttp.view(),
        }
    }

    /// The dequantized input `fl(dec(q[i, col]) · sf[i, col / npc])`, decoded through a
    /// table (these passes read every element of up to 49024 x 14336).
    fn dequant(&self) -> impl Fn(usize, usize) -> f32 + Sync + '_ {
        let dec: [f32; 256] = std::array::from_fn(|b| e4m3_to_f32(b as u8)); // (codes,) values
        let (ld, npc) = (self.q_layout.strides()[0], self.npc);
        let nbk = self.q_layout.shape()[1] / npc;
        let (q, sf) = (self.q.as_slice(), self.sf.as_slice());
        move |i, col| dec[q[i * ld + col].to_bits() as usize] * sf[i * nbk + col / npc]
    }

    /// The reference's `expf` arguments by element `i · H + j`: `−X` (clamped) for each row
    /// `i`, gate column `j` (rows in parallel).
    fn expf_args(&self, c: Option<f32>) -> Vec<f32> {
        let (n, h) = (self.q_layout.shape()[0], self.q_layout.shape()[1] / 2);
        let deq = &self.dequant();
        let mut v = vec![0.0f32; n * h];
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
        let rows_per = n.div_ceil(threads).max(1);
        std::thread::scope(|s| {
            for (part, chunk) in v.chunks_mut((rows_per * h).max(1)).enumerate() {
                s.spawn(move || {
                    for (e, a) in chunk.iter_mut().enumerate() {
                        let (i, j) = (part * rows_per + e / h, e % h);
                        *a = -clamp_gate(deq(i, j), c).0;
                    }
                });
            }
        });
        v
    }

    /// Whether clamp `c` leaves every input as it is (gate `X <= c`, value `|Y| <= c`; a NaN
    /// counts as clamped), so that the clamped op's results are the unclamped ones (rows in
    /// parallel).
    fn clamps_nothing(&self, c: f32) -> bool {
        let (n, two_h) = (self.q_layout.shape()[0], self.q_layout.shape()[1]);
        let h = two_h / 2;
        let deq = &self.dequant();
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
        let rows_per = n.div_ceil(threads).max(1);
        std::thread::scope(|s| {
            let parts: Vec<_> = (0..n)
                .step_by(rows_per)
                .map(|r0| {
                    s.spawn(move || {
                        (r0..(r0 + rows_per).min(n)).all(|i| {
                            (0..two_h).all(|col| {
                                let v = deq(i, col);
                                if col < h {
                                    v <= c
                                } else {
                                    v.abs() <= c
                                }
                            })
                        })
                    })
                })
                .collect();
            parts.into_iter().all(|p| p.join().unwrap())
        })
    }
}

/// The reference of one backward source and clamp given the GPU's `expf` (replayed): the
/// gradient before the cast, its bf16 `x_grad`, and its cast for each rounding of the scales
/// (made on first use).
struct BwdRef {
    g: reference::SwigluBackwardGrad,
    x_grad: HostTensor<bf16>,
    casts: [OnceLock<(QuantData, HostScales)>; 2],
}

impl BwdRef {
    fn new(data: &BwdData, clamp: Option<f32>, replay: &Replay) -> Self {
        let p = SwigluBackwardParams::new(data.npc, false, clamp);
        let g =
            reference::swiglu_backward_grad_with_expf(&data.host(), &p, &|e, x| replay.expf(e, x))
                .unwrap();
        let x_grad = g.x_grad().unwrap();
        Self {
            g,
            x_grad,
            casts: [OnceLock::new(), OnceLock::new()],
        }
    }

    /// `x_grad_fp8` and its scales for `npc` and `round_sf`.
    fn cast(&self, npc: usize, round_sf: bool) -> &(QuantData, HostScales) {
        self.casts[round_sf as usize].get_or_init(|| self.g.cast(npc, round_sf).unwrap())
    }
}

/// Runs the GPU backward (outputs poisoned) and compares with the reference `r` of its data
/// and clamp (`params`' rounding picks the cast of `r`'s gradient).
fn check_backward(
    dev: &Device,
    name: &str,
    data: &BwdData,
    params: &SwigluBackwardParams,
    r: &BwdRef,
) {
    let (n, two_h) = (data.q_layout.shape()[0], data.q_layout.shape()[1]);
    let (t, k) = (data.weight.shape()[0], data.weight.shape()[1]);
    let mut out = poisoned_tensor::<bf16>(dev, &[n, two_h / 2]);
    let mut q = poisoned_tensor::<F8E4M3>(dev, &[n, two_h]);
    let grid = tk_quant::ScaleGrid::for_matrix(n, two_h, (1, params.num_per_channels)).unwrap();
    let mut sf = DeviceScales::alloc(dev, ScaleLayout::RowMajorF32, grid).unwrap();
    sf.fill_bytes(POISON).unwrap();
    let mut xg = poisoned_tensor::<bf16>(dev, &[n, two_h]);
    let mut wg = poisoned_tensor::<f32>(dev, &[t, k]);
    let mut outs = DeviceSwigluBackwardOutputsMut {
        out: out.view_mut(),
        x_grad_fp8: q.view_mut(),
        x_grad_fp8_sf: &mut sf,
        x_grad: xg.view_mut(),
        weight_grad: wg.view_mut(),
    };
    tk_quant::swiglu_backward_and_per_token_cast_into(&data.device(), params, &mut outs).unwrap();
    drop(outs);
    assert_bits_eq(
        &format!("{name}: out"),
        out.to_host().unwrap().as_slice(),
        r.g.out.as_slice(),
    );
    assert_bits_eq(
        &format!("{name}: x_grad"),
        xg.to_host().unwrap().as_slice(),
        r.x_grad.as_slice(),
    );
    let (rq, rsf) = r.cast(params.num_per_channels, params.round_sf);
    check_quant(name, &DeviceQuantData::E4M3(q), &sf, rq, rsf);
    let got = wg.to_host().unwrap();
    for (i, (&g, &e)) in got
        .as_slice()
        .iter()
        .zip(r.g.weight_grad.as_slice())
        .enumerate()
    {
        assert!(
            (g - e).abs() <= 1e-4 + 1e-4 * e.abs(),
            "{name}: weight_grad[{i}] = {g:e}, reference {e:e} (atol = rtol = 1e-4)"
        );
    }
}

/// A MoE backward source (§3.11's test): mapping with alignment `npc`, weights `rand (T, k)`,
/// `x = per_token_cast(expand_to_fused(randn (T, 2H) bf16))`, `grad = randn (N, H) bf16`.
fn moe_backward_data(dev: &Device, moe: &MoeParams, h: usize, npc: usize, name: &str) -> BwdData {
    let mut rng = Rng::for_case(name);
    let r = Routing::new(moe, npc, &mut rng);
    let weight = HostTensor::from_fn(&[r.t, r.k], |_| rng.uniform());
    let x = r.expand(&par_randn(&mut rng, &[r.t, 2 * h], bf16::from_f32));
    let grad = par_randn(&mut rng, &[r.n(), h], bf16::from_f32);
    BwdData::new(
        dev,
        npc,
        &x,
        0,
        grad,
        (
            weight,
            r.map.pos_to_token_topk.clone(),
            r.map.token_topk_to_pos.clone(),
        ),
    )
}

#[test]
fn gpu_swiglu_backward_grid() {
    let Some(dev) = gpu_or_skip("gpu_swiglu_backward_grid") else {
        return;
    };
    let mut sources = Vec::new();
    for moe in moe_sources() {
        for h in generate_hidden_sizes(128) {
            for npc in [32, 128] {
                sources.push((moe, h, npc));
            }
        }
    }
    biggest_first(&mut sources, |(m, h, _)| m.num_send_tokens * m.num_topk * h);
    let done = AtomicUsize::new(0);
    let ran = par_cases(&sources, moe_workers(), |&(moe, h, npc)| {
        let dev = dev.with_new_stream().unwrap();
        let name = format!("swiglu_bwd {} H={h} npc={npc}", moe.name());
        let data = moe_backward_data(&dev, &moe, h, npc, &name);
        let mut replay: Option<Replay> = None;
        let mut unclamped: Option<BwdRef> = None;
        for clamp in [None, Some(10.0), Some(0.5)] {
            // A clamp that no input reaches gives the unclamped results: the same reference
            // (a wrong reuse could only make the GPU's clamped results mismatch).
            let reuse = unclamped.is_some() && clamp.is_some_and(|c| data.clamps_nothing(c));
            let fresh = (!reuse).then(|| {
                // A clamp that changes no gate asks for the same expf arguments: one GPU table.
                let args = data.expf_args(clamp);
                if replay.as_ref().is_none_or(|r| !same_bits(&r.args, &args)) {
                    replay = Some(Replay::new(&dev, args));
                }
                BwdRef::new(&data, clamp, replay.as_ref().unwrap())
            });
            // One reference gradient per clamp; each rounding casts it.
            let r = fresh.as_ref().or(unclamped.as_ref()).unwrap();
            for round in [false, true] {
                let p = SwigluBackwardParams::new(npc, round, clamp);
                check_backward(
                    &dev,
                    &format!("{name} round={round} clamp={clamp:?}"),
                    &data,
                    &p,
                    r,
                );
                done.fetch_add(1, Ordering::Relaxed);
            }
            // Kept for the next clamp only (a 4001-token source's reference holds gigabytes).
            unclamped = if clamp.is_none() { fresh } else { None };
        }
    });
    assert_eq!(
        done.load(Ordering::Relaxed),
        6 * ran,
        "spec §3.11: 864 cases per 12 MoE sources"
    );
}

#[test]
fn gpu_swiglu_backward_off_grid() {
    let Some(dev) = gpu_or_skip("gpu_swiglu_backward_off_grid") else {
        return;
    };
    // (N, H, npc, row padding of x): hidden sizes off the grid, odd rows, unaligned rows,
    // zero rows with routing slots to zero.
    let shapes = [
        (0, 64, 32, 0),
        (1, 32, 32, 0),
        (19, 96, 32, 3),
        (40, 384, 128, 0),
        (7, 1152, 128, 8),
        (33, 160, 32, 16),
    ];
    let cases: Vec<_> = shapes
        .iter()
        .flat_map(|&s| [None, Some(1.5)].map(move |c| (s, c)))
        .collect();
    par_cases(&cases, 8, |&((n, h, npc, pad), clamp)| {
        let dev = dev.with_new_stream().unwrap();
        let name = format!("swiglu_bwd off-grid N={n} H={h} npc={npc} pad={pad} clamp={clamp:?}");
        let mut rng = Rng::for_case(&name);
        // T = n + 3 tokens, k = 2: row i is slot 2i + 1 (every third row padding); the other
        // slots are -1, so weight_grad is zero there (and entirely for N = 0).
        let (t, k) = (n + 3, 2);
        let ptt: Vec<i32> = (0..n)
            .map(|i| if i % 3 == 2 { -1 } else { (2 * i + 1) as i32 })
            .collect();
        let mut ttp = vec![-1i32; t * k];
        for (i, &p) in ptt.iter().enumerate() {
            if p >= 0 {
                ttp[p as usize] = i as i32;
            }
        }
        let x = rng.randn(&[n, 2 * h], |v| bf16::from_f32(2.0 * v));
        let grad = rng.randn(&[n, h], bf16::from_f32);
        let weight = HostTensor::from_fn(&[t, k], |_| rng.uniform());
        let data = BwdData::new(
            &dev,
            npc,
            &x,
            pad,
            grad,
            (
                weight,
                HostTensor::from_vec(ptt, &[n]).unwrap(),
                HostTensor::from_vec(ttp, &[t, k]).unwrap(),
            ),
        );
        let replay = Replay::new(&dev, data.expf_args(clamp));
        let r = BwdRef::new(&data, clamp, &replay);
        for round in [false, true] {
            check_backward(
                &dev,
                &format!("{name} round={round}"),
                &data,
                &SwigluBackwardParams::new(npc, round, clamp),
                &r,
            );
        }
        // The allocating form gives the same bits.
        let p = SwigluBackwardParams::new(npc, true, clamp);
        let a = tk_quant::swiglu_backward_and_per_token_cast(&data.device(), &p).unwrap();
        let r =
            reference::swiglu_backward_and_per_token_cast_with_expf(&data.host(), &p, &|e, x| {
                replay.expf(e, x)
            })
            .unwrap();
        check_quant(
            &format!("{name} allocating"),
            &a.x_grad_fp8,
            &a.x_grad_fp8_sf,
            &r.x_grad_fp8,
            &r.x_grad_fp8_sf,
        );
        assert_bits_eq(
            &format!("{name} allocating: x_grad"),
            a.x_grad.to_host().unwrap().as_slice(),
            r.x_grad.as_slice(),
        );
    });
}

// ---------------------------------------------------------------------------------------------
// per_channel_cast_and_transpose, swiglu_forward_and_per_channel_cast_and_transpose
// ---------------------------------------------------------------------------------------------

/// The spec's per-channel token counts {4096, 8064}, plus 0 with TK_FULL_TEST.
fn per_channel_ms() -> Vec<usize> {
    let mut v = vec![4096, 8064];
    if full_test() {
        v.insert(0, 0);
    }
    v
}

/// A bf16 `(m, k)` input with row stride `k + pad` on the host and the device.
fn bf16_input(
    dev: &Device,
    m: usize,
    k: usize,
    pad: usize,
    name: &str,
) -> (HostTensor<bf16>, DeviceTensor<bf16>, Layout) {
    let x = par_randn(
        &mut Rng::for_case(name),
        &[m.max(1), k + pad],
        bf16::from_f32,
    );
    let d = dev.upload(&x).unwrap();
    (x, d, Layout::new(vec![m, k], vec![k + pad, 1], 0).unwrap())
}

fn check_per_channel_transpose(
    dev: &Device,
    m: usize,
    k: usize,
    pad: usize,
    npt: usize,
    round: bool,
) {
    let name =
        format!("per_channel_cast_and_transpose M={m} K={k} pad={pad} npt={npt} round={round}");
    let (x, dx, l) = bf16_input(dev, m, k, pad, &name);
    let params = PerChannelCastAndTransposeParams::new(npt, round);
    let (rd, rs) = reference::per_channel_cast_and_transpose(
        &x.view().with_layout(l.clone()).unwrap(),
        &params,
    )
    .unwrap();
    let (mut d, mut s) = poisoned(dev, CastFormat::E4M3, (k, m), rs.layout(), rs.grid());
    tk_quant::per_channel_cast_and_transpose_into(
        &dx.view().with_layout(l).unwrap(),
        &params,
        &mut d.view_mut(),
        &mut s,
    )
    .unwrap();
    check_quant(&name, &d, &s, &rd, &rs);
}

#[test]
fn gpu_per_channel_cast_and_transpose_grid() {
    let Some(dev) = gpu_or_skip("gpu_per_channel_cast_and_transpose_grid") else {
        return;
    };
    let mut cases = Vec::new();
    for m in per_channel_ms() {
        for k in generate_hidden_sizes(64) {
            for round in [true, false] {
                for npt in [32, 128] {
                    cases.push((m, k, npt, round));
                }
            }
        }
    }
    biggest_first(&mut cases, |(m, k, _, _)| m * k);
    par_cases(&cases, 16, |&(m, k, npt, round)| {
        check_per_channel_transpose(&dev.with_new_stream().unwrap(), m, k, 0, npt, round)
    });
}

#[test]
fn gpu_per_channel_cast_and_transpose_off_grid() {
    let Some(dev) = gpu_or_skip("gpu_per_channel_cast_and_transpose_off_grid") else {
        return;
    };
    let cases = [
        (128, 64, 0),
        (256, 192, 3),
        (384, 640, 8),
        (0, 64, 0),
        (1152, 128, 1),
        // The pipelined persistent grid on a 132-SM H200 (660 CTAs, tiles dealt round-robin):
        // 17 x 64 tiles (CTAs looping onto another row and column tile), 16-byte-aligned
        // padded rows; 2 x 704 tiles, unaligned rows (scalar loads).
        (2176, 4096, 8),
        (256, 45056, 1),
    ];
    par_cases(&cases, 8, |&(m, k, pad)| {
        let dev = dev.with_new_stream().unwrap();
        for npt in [32, 128] {
            for round in [false, true] {
                check_per_channel_transpose(&dev, m, k, pad, npt, round);
            }
        }
    });
}

/// Gates outside the kernel's inline-division range (|l| > 40, zero, tiny, `expf(-l)` = inf),
/// written into the gate half of `x` (bf16 `(rows, 2H + pad)`) at rows `r % 37 == 5` and
/// columns `j % 13 == 3`: the tiles holding them take the IEEE-division fallback, the others
/// (of the same CTAs) the inline path.
fn poke_slow_gates(x: &mut HostTensor<bf16>, h: usize) {
    const SPECIAL: [f32; 8] = [0.0, -0.0, 1e-30, -1e-30, 45.0, -45.0, -95.0, -200.0];
    let width = x.shape()[1];
    for (r, row) in x.as_mut_slice().chunks_mut(width).enumerate() {
        if r % 37 == 5 {
            for j in (3..h).step_by(13) {
                row[j] = bf16::from_f32(SPECIAL[(r / 37 + j / 13) % SPECIAL.len()]);
            }
        }
    }
}

/// Checks the SwiGLU per-channel op for every `npt`, `without_transpose`, `round_sf` against the
/// downstream reference of the activation computed with the GPU's `expf`; `slow`: with the
/// gates of [`poke_slow_gates`].
fn check_swiglu_per_channel(
    dev: &Device,
    (m, h, pad): (usize, usize, usize),
    clamp: Option<f32>,
    slow: bool,
    table: &ExpfTable,
) -> usize {
    let name = format!("swiglu_per_channel M={m} H={h} pad={pad} clamp={clamp:?} slow={slow}");
    let (mut x, mut dx, l) = bf16_input(dev, m, 2 * h, pad, &name);
    if slow {
        poke_slow_gates(&mut x, h);
        dx = dev.upload(&x).unwrap();
    }
    let hx = x.view().with_layout(l.clone()).unwrap();
    let dxv = dx.view().with_layout(l).unwrap();
    let mut base = SwigluPerChannelParams::new(32, false);
    base.swiglu_clamp_value = clamp;
    let act = reference::swiglu_per_channel_activation(&hx, &base, &|v| table.get(v)).unwrap();
    let mut n = 0;
    for npt in [32, 128] {
        for without_transpose in [true, false] {
            for round in [true, false] {
                let p = SwigluPerChannelParams {
                    num_per_tokens: npt,
                    round_sf: round,
                    without_transpose,
                    swiglu_clamp_value: clamp,
                };
                let case =
                    format!("{name} npt={npt} without_transpose={without_transpose} round={round}");
                let (rd, rs) = reference::swiglu_per_channel_downstream(&act.view(), &p).unwrap();
                let shape = if without_transpose { (m, h) } else { (h, m) };
                let (mut d, mut s) = poisoned(dev, CastFormat::E4M3, shape, rs.layout(), rs.grid());
                tk_quant::swiglu_forward_and_per_channel_cast_and_transpose_into(
                    &dxv,
                    &p,
                    &mut d.view_mut(),
                    &mut s,
                )
                .unwrap();
                check_quant(&case, &d, &s, &rd, &rs);
                n += 1;
            }
        }
    }
    n
}

#[test]
fn gpu_swiglu_per_channel_grid() {
    let Some(dev) = gpu_or_skip("gpu_swiglu_per_channel_grid") else {
        return;
    };
    let table = ExpfTable::new(&dev, &[]);
    let mut cases = Vec::new();
    for m in per_channel_ms() {
        for h in [576, 2048, 2560, 3072, 4096, 6144, 7168] {
            for clamp in [None, Some(10.0), Some(0.5)] {
                cases.push((m, h, clamp));
            }
        }
    }
    biggest_first(&mut cases, |(m, h, _)| m * h);
    let done = AtomicUsize::new(0);
    let ran = par_cases(&cases, moe_workers(), |&(m, h, clamp)| {
        done.fetch_add(
            check_swiglu_per_channel(
                &dev.with_new_stream().unwrap(),
                (m, h, 0),
                clamp,
                false,
                &table,
            ),
            Ordering::Relaxed,
        );
    });
    assert_eq!(
        done.load(Ordering::Relaxed),
        8 * ran,
        "spec §3.12: 336 cases"
    );
}

#[test]
fn gpu_swiglu_per_channel_off_grid() {
    let Some(dev) = gpu_or_skip("gpu_swiglu_per_channel_off_grid") else {
        return;
    };
    // H = 64 (the smallest), odd multiples of 64, unaligned rows; a clamp that is not a bf16
    // value (clamped in fp32); M = 0.
    let clamp = 0.3f32;
    let table = ExpfTable::new(&dev, &[-clamp]);
    let cases = [
        (128, 64, 0, None),
        (256, 192, 3, Some(clamp)),
        (384, 320, 8, Some(2.0)),
        (0, 64, 0, None),
    ];
    par_cases(&cases, 8, |&(m, h, pad, c)| {
        check_swiglu_per_channel(
            &dev.with_new_stream().unwrap(),
            (m, h, pad),
            c,
            false,
            &table,
        );
    });
}

#[test]
fn gpu_swiglu_per_channel_slow_division() {
    let Some(dev) = gpu_or_skip("gpu_swiglu_per_channel_slow_division") else {
        return;
    };
    // Gates out of the inline division's range in some tiles (poke_slow_gates), the others
    // inline (16 x 32 tiles, one CTA each: tiles of both kinds in the same wave); unaligned
    // rows (scalar loads); a clamp that pulls 45 into range.
    let table = ExpfTable::new(&dev, &[]);
    let cases = [
        (2048, 2048, 0, None),
        (384, 320, 8, Some(10.0)),
        (256, 192, 3, None),
    ];
    par_cases(&cases, 8, |&(m, h, pad, c)| {
        check_swiglu_per_channel(
            &dev.with_new_stream().unwrap(),
            (m, h, pad),
            c,
            true,
            &table,
        );
    });
}

// ---------------------------------------------------------------------------------------------
// per_channel_cast_fused
// ---------------------------------------------------------------------------------------------

/// One fused source: the (expanded) bf16 input `(N_in, K)` and the optional map.
fn check_fused(
    dev: &Device,
    name: &str,
    x: &HostTensor<bf16>,
    fp32: bool,
    map: Option<&HostTensor<i32>>,
) -> usize {
    let dmap = map.map(|m| dev.upload(m).unwrap());
    let k = x.shape()[1];
    let mut n = 0;
    for fused in [false, true] {
        // Host / device inputs: plain (bf16, or its fp32 widening), or per-token e4m3 + scales.
        let xf = fp32.then(|| {
            HostTensor::from_vec(x.as_slice().iter().map(|v| v.to_f32()).collect(), x.shape())
                .unwrap()
        });
        let q = fused.then(|| {
            let p = PerTokenCastParams::new(CastFormat::E4M3, 128, ScaleOptions::row_major(false));
            let (q, s) = reference::per_token_cast(&CastInput::from(x.view()), &p).unwrap();
            let sf =
                HostTensor::from_vec(s.f32_storage().unwrap().to_vec(), &[x.shape()[0], k / 128])
                    .unwrap();
            (q.as_e4m3().unwrap().clone(), sf)
        });
        let hin: FusedInput<'_> = match (&q, &xf) {
            (Some((d, s)), _) => FusedInput::Quantized {
                data: d.view(),
                sf: s.view(),
            },
            (None, Some(f)) => PlainInput::F32(f.view()).into(),
            (None, None) => PlainInput::BF16(x.view()).into(),
        };
        let dbf = dev.upload(x).unwrap();
        let dxf = xf.as_ref().map(|f| dev.upload(f).unwrap());
        let dq = q
            .as_ref()
            .map(|(d, s)| (dev.upload(d).unwrap(), dev.upload(s).unwrap()));
        let din: DeviceFusedInput<'_> = match (&dq, &dxf) {
            (Some((d, s)), _) => DeviceFusedInput::Quantized {
                data: d.view(),
                sf: s.view(),
            },
            (None, Some(f)) => DevicePlainInput::F32(f.view()).into(),
            (None, None) => DevicePlainInput::BF16(dbf.view()).into(),
        };
        for round in [false, true] {
            let p = if fused {
                PerChannelCastFusedParams::fused(round)
            } else {
                PerChannelCastFusedParams::plain(round)
            };
            let case = format!("{name} fused={fused} fp32={fp32} round={round}");
            let hmap = map.map(|m| m.view());
            let (rd, rs) = reference::per_channel_cast_fused(&hin, hmap.as_ref(), &p).unwrap();
            let n_out = rd.shape()[0];
            let (mut d, mut s) =
                poisoned(dev, CastFormat::E4M3, (n_out, k), rs.layout(), rs.grid());
            let dm = dmap.as_ref().map(|m| m.view());
            tk_quant::per_channel_cast_fused_into(&din, dm.as_ref(), &p, &mut d.view_mut(), &mut s)
                .unwrap();
            check_quant(&case, &d, &s, &rd, &rs);
            n += 1;
        }
    }
    n
}

#[test]
fn gpu_per_channel_cast_fused_grid() {
    let Some(dev) = gpu_or_skip("gpu_per_channel_cast_fused_grid") else {
        return;
    };
    // None: the spec's fixed no-MoE source (4096 tokens, no map).
    let mut sources: Vec<Option<MoeParams>> = vec![None];
    sources.extend(moe_sources().into_iter().map(Some));
    let mut cases: Vec<_> = sources
        .iter()
        .flat_map(|s| generate_hidden_sizes(128).into_iter().map(move |k| (*s, k)))
        .collect();
    biggest_first(&mut cases, |(s, k)| {
        s.map_or(4096, |m| m.num_send_tokens * m.num_topk) * k
    });
    let done = AtomicUsize::new(0);
    let ran = par_cases(&cases, moe_workers(), |&(moe, k)| {
        let dev = dev.with_new_stream().unwrap();
        let name = format!(
            "per_channel_cast_fused {} K={k}",
            moe.map_or("fixed".into(), |m| m.name())
        );
        let mut rng = Rng::for_case(&name);
        let n = match moe {
            None => check_fused(
                &dev,
                &name,
                &par_randn(&mut rng, &[4096, k], bf16::from_f32),
                false,
                None,
            ),
            Some(moe) => {
                let r = Routing::new(&moe, 128, &mut rng);
                let x = r.expand(&par_randn(&mut rng, &[r.t, k], bf16::from_f32));
                check_fused(&dev, &name, &x, false, Some(&r.map.pos_to_token))
            }
        };
        done.fetch_add(n, Ordering::Relaxed);
    });
    assert_eq!(
        done.load(Ordering::Relaxed),
        4 * ran,
        "spec §3.6: 312 cases"
    );
}

#[test]
fn gpu_per_channel_cast_fused_off_grid() {
    let Some(dev) = gpu_or_skip("gpu_per_channel_cast_fused_off_grid") else {
        return;
    };
    // (N_in, N_out, K, fp32): maps with N_out % 128 != 0 (partial last block), all-padding
    // blocks, repeated sources; no map with N = 0; fp32 input; K = 128 (one input group);
    // no map with N = 4096, K = 4224 (528 runs of 4 tiles: on a 132-SM H200 exactly the
    // resident CTAs, the smallest plain e4m3 grid that takes the staged pipeline; K = 4096,
    // 512 runs, in the grid keeps the register prefetch). Gathered e4m3 runs of 4 that are not
    // whole (`TK_PC_WHOLE` 0: K / 64 not a multiple of 4): K = 128, 384, 640, 4224; whole:
    // K = 256 (and the spec grid's K).
    let cases = [
        (4096, 48, 4224, false),
        (40, 48, 128, false),
        (300, 144, 256, true),
        (16, 256, 384, false),
        (0, 16, 128, false),
        (5, 16, 640, true),
    ];
    par_cases(&cases, 8, |&(n_in, n_out, k, fp32)| {
        let dev = dev.with_new_stream().unwrap();
        let name =
            format!("per_channel_cast_fused off-grid N_in={n_in} N_out={n_out} K={k} fp32={fp32}");
        let mut rng = Rng::for_case(&name);
        let x = rng.randn(&[n_in, k], bf16::from_f32);
        let map: Vec<i32> = (0..n_out)
            .map(|i| {
                if n_in == 0 || (128..256).contains(&i) || i % 9 == 4 {
                    -1
                } else {
                    rng.below(n_in as u64) as i32
                }
            })
            .collect();
        check_fused(
            &dev,
            &name,
            &x,
            fp32,
            Some(&HostTensor::from_vec(map, &[n_out]).unwrap()),
        );
        if n_in % 128 == 0 {
            check_fused(&dev, &format!("{name} no map"), &x, fp32, None);
        }
    });
    // No map, no rows.
    check_fused(
        &dev,
        "per_channel_cast_fused M=0",
        &HostTensor::from_vec(vec![], &[0, 256]).unwrap(),
        false,
        None,
    );
}

/// The non-rounded e4m3 scales of the staged `per_channel_cast_fused` pipeline
/// (`TK_PC_FAST_SCALES`: `scale_pair_e4m3_fast`, no division call) are the divisions'
/// `(sf, inv)` bit for bit for every fp32 `c = max(amax, 1e-4)` in `[1e-4, inf]`, about 1.2e9
/// values (`tk_quant::testing::scale_check_kernel_spec`).
#[test]
fn gpu_scale_pair_e4m3_fast_is_the_division() {
    let Some(dev) = gpu_or_skip("gpu_scale_pair_e4m3_fast_is_the_division") else {
        return;
    };
    let f = dev.function(&scale_check_kernel_spec()).unwrap();
    let (lo, hi) = (0x38D1_B717u32, 0x7F80_0000u32); // 1e-4 ..= inf
    let mut out = dev
        .upload(&HostTensor::from_vec(vec![0i32, -1, 0], &[3]).unwrap())
        .unwrap();
    let addr = out.view_mut().address();
    let mut l = dev.stream().launch_builder(&f);
    l.arg(&lo).arg(&hi).arg(&addr);
    let cfg = LaunchConfig {
        grid_dim: (4096, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: out holds the kernel's 3 counters (u32 bits in i32 elements) and outlives the
    // stream-ordered launch, which to_host waits for.
    unsafe { l.launch(cfg) }.unwrap();
    let got: Vec<u32> = out
        .to_host()
        .unwrap()
        .as_slice()
        .iter()
        .map(|&v| v as u32)
        .collect();
    assert_eq!(got[2], hi - lo + 1, "values compared");
    assert_eq!(
        (got[0], got[1]),
        (0, u32::MAX),
        "mismatches and the first mismatching c: {:e}",
        f32::from_bits(got[1])
    );
}
