//! The GPU casts against the CPU references, bit for bit: data bytes and the scales' full
//! allocation (padding included, which the kernels write as zeros). Outputs are poisoned before
//! every launch; inputs are fresh random normals per case (`spec/quant.md` §4.2).
//!
//! Grids (§3.1, §3.3, §3.5, §3.8; `M = 0` added with TK_FULL_TEST): per-token casts from fp32,
//! bf16, e4m3 and e2m1 input (896 cases, each also in sf-only and precomputed mode where the
//! spec's test runs them, and from a row-strided view where it does), per-block casts (224),
//! per-channel casts (28), cast back per token (224) and by blocks (112). Off-grid: odd and
//! single rows, hidden sizes outside the grid, `npc = 16`, unaligned and padded views (the
//! element-wise kernels), huge whole rows, NaN / ±inf / zero rows / subnormals, bad outputs.
//!
//! Cases run on all host cores (the CPU references dominate), each worker on its own stream.
#![cfg(all(feature = "cuda", feature = "cpu"))]

mod op_common;

use std::sync::atomic::{AtomicUsize, Ordering};

use half::bf16;
use tk_core::dtype::{E5M6Bytes, Ue8m0x4};
use tk_core::testing::{assert_bits_eq, full_test, generate_hidden_sizes, gpu_or_skip, Rng};
use tk_core::{Device, DeviceTensor, HostTensor, Layout, TkError};
use tk_quant::reference;
use tk_quant::{
    CastFormat, CastInput, DeviceCastInput, DevicePlainInput, DeviceQuantData, DeviceQuantDataView,
    DeviceQuantInput, DeviceScaleView, DeviceScales, HostScales, LosslessCastParams,
    LosslessStatus, PerBlockCastParams, PerChannelCastParams, PerTokenCastParams,
    PerTokenE5M6Params, PlainInput, QuantData, QuantInput, ScaleLayout, ScaleOptions,
};

const POISON: u8 = 0xA7;

/// Runs `f` on every case, spread over the host's cores.
fn par_cases<C: Sync>(cases: &[C], f: impl Fn(&C) + Sync) {
    let workers = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(16);
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = cases.get(i) else { break };
                f(c);
            });
        }
    });
}

/// The spec's token counts: {4001, 8001}, plus 0 with TK_FULL_TEST.
fn grid_ms(base: &[usize]) -> Vec<usize> {
    let mut v = base.to_vec();
    if full_test() {
        v.insert(0, 0);
    }
    v
}

/// The two configurations of the spec's grids: (F, T, F) = layout A rounded, (T, T, T) = C.
fn grid_configs() -> [ScaleOptions; 2] {
    [ScaleOptions::row_major(true), ScaleOptions::packed_ue8m0()]
}

/// A plain host input, fp32 or bf16.
enum HostPlain {
    F32(HostTensor<f32>),
    BF16(HostTensor<bf16>),
}

impl HostPlain {
    fn randn(bf: bool, m: usize, k: usize, case: &str) -> Self {
        let mut rng = Rng::for_case(case);
        if bf {
            HostPlain::BF16(rng.randn(&[m, k], bf16::from_f32))
        } else {
            HostPlain::F32(rng.randn(&[m, k], |v| v))
        }
    }

    /// The view `layout` of the buffer as a plain input.
    fn input(&self, layout: &Layout) -> PlainInput<'_> {
        match self {
            HostPlain::F32(t) => PlainInput::F32(t.view().with_layout(layout.clone()).unwrap()),
            HostPlain::BF16(t) => PlainInput::BF16(t.view().with_layout(layout.clone()).unwrap()),
        }
    }

    fn upload(&self, dev: &Device) -> DevPlain {
        match self {
            HostPlain::F32(t) => DevPlain::F32(dev.upload(t).unwrap()),
            HostPlain::BF16(t) => DevPlain::BF16(dev.upload(t).unwrap()),
        }
    }
}

enum DevPlain {
    F32(DeviceTensor<f32>),
    BF16(DeviceTensor<bf16>),
}

impl DevPlain {
    fn input(&self, layout: &Layout) -> DevicePlainInput<'_> {
        match self {
            DevPlain::F32(t) => {
                DevicePlainInput::F32(t.view().with_layout(layout.clone()).unwrap())
            }
            DevPlain::BF16(t) => {
                DevicePlainInput::BF16(t.view().with_layout(layout.clone()).unwrap())
            }
        }
    }
}

/// Device copies of host quantized data and scales.
struct DevQuant {
    data: DevData,
    sf: DevSf,
    layout: ScaleLayout,
    grid: tk_quant::ScaleGrid,
}

enum DevData {
    E4M3(DeviceTensor<float8::F8E4M3>),
    E2M1(DeviceTensor<tk_core::dtype::E2M1x2>),
}

enum DevSf {
    F32(DeviceTensor<f32>),
    Packed(DeviceTensor<Ue8m0x4>),
}

impl DevQuant {
    fn upload(dev: &Device, q: &QuantData, s: &HostScales) -> Self {
        let data = match q {
            QuantData::E4M3(t) => DevData::E4M3(dev.upload(t).unwrap()),
            QuantData::E2M1(t) => DevData::E2M1(dev.upload(t).unwrap()),
        };
        Self {
            data,
            sf: Self::upload_scales(dev, s),
            layout: s.layout(),
            grid: s.grid(),
        }
    }

    /// The scales' full allocation on the device.
    fn upload_scales(dev: &Device, s: &HostScales) -> DevSf {
        match (s.f32_storage(), s.packed_storage()) {
            (Some(f), _) => DevSf::F32(
                dev.upload(&HostTensor::from_vec(f.to_vec(), &[f.len()]).unwrap())
                    .unwrap(),
            ),
            (_, Some(p)) => DevSf::Packed(
                dev.upload(&HostTensor::from_vec(p.to_vec(), &[p.len()]).unwrap())
                    .unwrap(),
            ),
            _ => unreachable!("scales are fp32 or packed"),
        }
    }

    fn input(&self, block: (usize, usize)) -> DeviceQuantInput<'_> {
        let data = match &self.data {
            DevData::E4M3(t) => DeviceQuantDataView::E4M3(t.view()),
            DevData::E2M1(t) => DeviceQuantDataView::E2M1(t.view()),
        };
        let l = self.grid.tensor_layout(self.layout);
        DeviceQuantInput::new(data, self.sf.view_as(l), block)
    }
}

impl DevSf {
    /// The scales as a view with `hs`'s tensor layout.
    fn view(&self, hs: &HostScales) -> DeviceScaleView<'_> {
        self.view_as(hs.grid().tensor_layout(hs.layout()))
    }

    fn view_as(&self, l: Layout) -> DeviceScaleView<'_> {
        match self {
            DevSf::F32(t) => DeviceScaleView::F32(t.view().with_layout(l).unwrap()),
            DevSf::Packed(t) => DeviceScaleView::Packed(t.view().with_layout(l).unwrap()),
        }
    }
}

/// Compares GPU data and scales with the reference's, bit for bit (scales: full allocation).
fn check(
    case: &str,
    data: Option<&DeviceQuantData>,
    sf: Option<&DeviceScales>,
    rd: Option<&QuantData>,
    rs: Option<&HostScales>,
) {
    if let (Some(d), Some(r)) = (data, rd) {
        let got = d.to_host().unwrap();
        assert_eq!(got.shape(), r.shape(), "{case}: data shape");
        assert_bits_eq(&format!("{case}: data"), &got.bytes(), &r.bytes());
    }
    if let (Some(s), Some(r)) = (sf, rs) {
        assert_eq!(
            (s.layout(), s.grid()),
            (r.layout(), r.grid()),
            "{case}: scale layout"
        );
        assert_bits_eq(
            &format!("{case}: scales"),
            &s.storage_bytes().unwrap(),
            &r.storage_bytes(),
        );
    }
}

/// Poisoned output data and scales for a cast.
fn poisoned(
    dev: &Device,
    fmt: CastFormat,
    m: usize,
    k: usize,
    layout: ScaleLayout,
    grid: tk_quant::ScaleGrid,
) -> (DeviceQuantData, DeviceScales) {
    let mut d = DeviceQuantData::alloc(dev, fmt, m, k).unwrap();
    d.fill_bytes(POISON).unwrap();
    let mut s = DeviceScales::alloc(dev, layout, grid).unwrap();
    s.fill_bytes(POISON).unwrap();
    (d, s)
}

/// `per_token_cast` of `dx` (an `m x k` input) into poisoned outputs in the requested scale
/// layout, checked bit for bit against the reference of `hx`; returns the reference scales.
fn check_per_token(
    dev: &Device,
    name: &str,
    hx: &CastInput<'_>,
    dx: &DeviceCastInput<'_>,
    params: &PerTokenCastParams,
    (m, k): (usize, usize),
) -> HostScales {
    let (rd, rs) = reference::per_token_cast(hx, params).unwrap();
    let layout = params.opts.layout().unwrap();
    let (mut d, mut s) = poisoned(dev, params.fmt, m, k, layout, rs.grid());
    tk_quant::per_token_cast_into(dx, params, &mut d.view_mut(), &mut s).unwrap();
    check(name, Some(&d), Some(&s), Some(&rd), Some(&rs));
    rs
}

/// `per_block_cast` of `dx` (an `m x k` input) into poisoned outputs in the requested scale
/// layout, checked bit for bit against the reference of `hx`; returns the reference scales.
fn check_per_block(
    dev: &Device,
    name: &str,
    hx: &PlainInput<'_>,
    dx: &DevicePlainInput<'_>,
    params: &PerBlockCastParams,
    (m, k): (usize, usize),
) -> HostScales {
    let (rd, rs) = reference::per_block_cast(hx, params).unwrap();
    let layout = params.opts.layout().unwrap();
    let (mut d, mut s) = poisoned(dev, params.fmt, m, k, layout, rs.grid());
    tk_quant::per_block_cast_into(dx, params, &mut d.view_mut(), &mut s).unwrap();
    check(name, Some(&d), Some(&s), Some(&rd), Some(&rs));
    rs
}

// ---------------------------------------------------------------------------------------------
// per_token_cast
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum In {
    F32,
    BF16,
    /// Quantized input in `fmt` with block `block` (scales in the output's layout).
    Q(CastFormat, (usize, usize)),
}

#[derive(Debug, Clone)]
struct TokenCase {
    m: usize,
    k: usize,
    input: In,
    npc: usize,
    fmt: CastFormat,
    opts: ScaleOptions,
    /// Row stride of the plain input (`k` = contiguous) and element offset of its first row.
    ld: usize,
    offset: usize,
}

impl TokenCase {
    fn name(&self) -> String {
        format!(
            "per_token_cast M={} K={} in={:?} npc={} fmt={:?} layout={:?} ld={} off={}",
            self.m,
            self.k,
            self.input,
            self.npc,
            self.fmt,
            self.opts.layout().unwrap(),
            self.ld,
            self.offset
        )
    }
}

fn run_token_case(dev: &Device, c: &TokenCase) {
    let name = c.name();
    let params = PerTokenCastParams::new(c.fmt, c.npc, c.opts);
    let layout = c.opts.layout().unwrap();
    match c.input {
        In::F32 | In::BF16 => {
            let rows = c.m + c.offset.div_ceil(c.ld.max(1));
            let buf = HostPlain::randn(matches!(c.input, In::BF16), rows.max(1), c.ld, &name);
            let l = Layout::new(vec![c.m, c.k], vec![c.ld, 1], c.offset).unwrap();
            let hx: CastInput<'_> = buf.input(&l).into();
            let dbuf = buf.upload(dev);
            let dx: DeviceCastInput<'_> = dbuf.input(&l).into();
            let rs = check_per_token(dev, &name, &hx, &dx, &params, (c.m, c.k));
            if c.npc == c.k {
                return;
            }
            // sf-only mode gives the same scales.
            let mut s2 = DeviceScales::alloc(dev, layout, rs.grid()).unwrap();
            s2.fill_bytes(POISON).unwrap();
            tk_quant::per_token_cast_with_sf_only_into(&dx, &params, &mut s2).unwrap();
            check(&format!("{name} sf-only"), None, Some(&s2), None, Some(&rs));
            // Precomputed mode with the scales just produced (layout A only, as the spec's test).
            if layout == ScaleLayout::RowMajorF32 {
                let f = rs.f32_storage().unwrap();
                let sfh =
                    HostTensor::from_vec(f.to_vec(), &[rs.grid().nbm(), rs.grid().nbk()]).unwrap();
                let rp = reference::per_token_cast_with_precomputed_sf(&hx, &params, &sfh.view())
                    .unwrap();
                let sfd = dev.upload(&sfh).unwrap();
                let mut d3 = DeviceQuantData::alloc(dev, c.fmt, c.m, c.k).unwrap();
                d3.fill_bytes(POISON).unwrap();
                tk_quant::per_token_cast_with_precomputed_sf_into(
                    &dx,
                    &params,
                    &sfd.view(),
                    &mut d3.view_mut(),
                )
                .unwrap();
                check(
                    &format!("{name} precomputed"),
                    Some(&d3),
                    None,
                    Some(&rp),
                    None,
                );
            }
        }
        In::Q(in_fmt, block) => {
            let x0 = Rng::for_case(&name).randn(&[c.m, c.k], bf16::from_f32);
            let (q0, s0) = reference::cast(&x0.view().into(), in_fmt, block, c.opts).unwrap();
            let hx: CastInput<'_> = QuantInput::new(q0.view(), s0.view(), block).into();
            let dq = DevQuant::upload(dev, &q0, &s0);
            let dx: DeviceCastInput<'_> = dq.input(block).into();
            check_per_token(dev, &name, &hx, &dx, &params, (c.m, c.k));
        }
    }
}

#[test]
fn gpu_per_token_cast_grid() {
    let Some(dev) = gpu_or_skip("gpu_per_token_cast_grid") else {
        return;
    };
    let mut cases = Vec::new();
    for m in grid_ms(&[4001, 8001]) {
        for k in generate_hidden_sizes(64) {
            for opts in grid_configs() {
                for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
                    for (input, npcs) in [
                        (In::F32, vec![32, 64, 128, k]),
                        (In::BF16, vec![32, 64, 128, k]),
                    ] {
                        for npc in npcs {
                            // The spec's non-contiguous variant: plain, e4m3, not packed.
                            let strided = fmt == CastFormat::E4M3
                                && opts.layout().unwrap() == ScaleLayout::RowMajorF32;
                            let ld = if strided { 2 * k } else { k };
                            cases.push(TokenCase {
                                m,
                                k,
                                input,
                                npc,
                                fmt,
                                opts,
                                ld,
                                offset: 0,
                            });
                        }
                    }
                    for in_fmt in [CastFormat::E4M3, CastFormat::E2M1] {
                        for block in [(128, 128), (32, 32)] {
                            for npc in [32, 128] {
                                cases.push(TokenCase {
                                    m,
                                    k,
                                    input: In::Q(in_fmt, block),
                                    npc,
                                    fmt,
                                    opts,
                                    ld: k,
                                    offset: 0,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases.len(), 896 / 2 * grid_ms(&[4001, 8001]).len());
    par_cases(&cases, |c| {
        run_token_case(&dev.with_new_stream().unwrap(), c)
    });
}

#[test]
fn gpu_per_token_cast_off_grid() {
    let Some(dev) = gpu_or_skip("gpu_per_token_cast_off_grid") else {
        return;
    };
    let mut cases = Vec::new();
    let all = [
        ScaleOptions::row_major(false),
        ScaleOptions::col_major(false),
        ScaleOptions::row_major(true),
        ScaleOptions::col_major(true),
        ScaleOptions::packed_ue8m0(),
    ];
    for (m, k) in [
        (0, 128),
        (1, 64),
        (3, 130),
        (37, 1000),
        (5, 2),
        (129, 4160),
        (7, 4104),
    ] {
        for opts in all {
            for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
                for input in [In::F32, In::BF16] {
                    for npc in [16, 32, 64, 128] {
                        cases.push(TokenCase {
                            m,
                            k,
                            input,
                            npc,
                            fmt,
                            opts,
                            ld: k,
                            offset: 0,
                        });
                        // Padded rows and an unaligned start: the element-wise kernel.
                        cases.push(TokenCase {
                            m,
                            k,
                            input,
                            npc,
                            fmt,
                            opts,
                            ld: k + 3,
                            offset: 1,
                        });
                    }
                    if k % 64 == 0 {
                        cases.push(TokenCase {
                            m,
                            k,
                            input,
                            npc: k,
                            fmt,
                            opts,
                            ld: k,
                            offset: 0,
                        });
                        cases.push(TokenCase {
                            m,
                            k,
                            input,
                            npc: k,
                            fmt,
                            opts,
                            ld: k + 1,
                            offset: 1,
                        });
                    }
                }
                for in_fmt in [CastFormat::E4M3, CastFormat::E2M1] {
                    for block in [(1, 32), (3, 5), (128, 128)] {
                        // npc == K is not allowed with quantized input.
                        for npc in [16, 64] {
                            if k % 2 == 0 && npc != k {
                                cases.push(TokenCase {
                                    m,
                                    k,
                                    input: In::Q(in_fmt, block),
                                    npc,
                                    fmt,
                                    opts,
                                    ld: k,
                                    offset: 0,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    // Odd K with e4m3 output.
    for npc in [16, 128] {
        cases.push(TokenCase {
            m: 9,
            k: 999,
            input: In::BF16,
            npc,
            fmt: CastFormat::E4M3,
            opts: ScaleOptions::col_major(false),
            ld: 999,
            offset: 0,
        });
    }
    // Whole rows far wider than the grid.
    for (k, input) in [(65536, In::BF16), (131072, In::F32), (262144, In::BF16)] {
        cases.push(TokenCase {
            m: 3,
            k,
            input,
            npc: k,
            fmt: CastFormat::E2M1,
            opts: ScaleOptions::packed_ue8m0(),
            ld: k,
            offset: 0,
        });
    }
    par_cases(&cases, |c| {
        run_token_case(&dev.with_new_stream().unwrap(), c)
    });
}

/// NaN, ±inf, all-zero rows and subnormals (§5): the GPU follows the reference's documented
/// choices (amax ignores NaN; an infinite amax per §1.4).
#[test]
fn gpu_cast_special_values() {
    let Some(dev) = gpu_or_skip("gpu_cast_special_values") else {
        return;
    };
    let (m, k) = (64, 512);
    let mut rng = Rng::for_case("special values");
    let mut x = rng.randn(&[m, k], |v| v);
    let xs = x.as_mut_slice();
    xs[..k].iter_mut().for_each(|v| *v = 0.0); // row 0: zeros
    xs[k + 5] = f32::NAN; // row 1: one NaN
    xs[2 * k + 7] = f32::INFINITY; // row 2: +inf
    xs[3 * k + 300] = f32::NEG_INFINITY;
    for (i, v) in xs[4 * k..5 * k].iter_mut().enumerate() {
        *v = f32::from_bits(1 + i as u32 * 977); // row 4: subnormals
    }
    xs[5 * k..6 * k].iter_mut().for_each(|v| *v = -0.0); // row 5: negative zeros
    for v in xs[6 * k..7 * k].iter_mut().step_by(3) {
        *v = f32::NAN; // row 6: many NaNs
    }
    let xb =
        HostTensor::from_vec(xs.iter().map(|&v| bf16::from_f32(v)).collect(), &[m, k]).unwrap();
    let dx = dev.upload(&x).unwrap();
    let dxb = dev.upload(&xb).unwrap();
    for opts in [
        ScaleOptions::row_major(false),
        ScaleOptions::col_major(true),
        ScaleOptions::packed_ue8m0(),
    ] {
        for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
            for npc in [32, 128, k] {
                let params = PerTokenCastParams::new(fmt, npc, opts);
                for bf in [false, true] {
                    let (hx, dxi): (CastInput<'_>, DeviceCastInput<'_>) = if bf {
                        (xb.view().into(), dxb.view().into())
                    } else {
                        (x.view().into(), dx.view().into())
                    };
                    let name = format!("special bf16={bf} npc={npc} fmt={fmt:?} {opts:?}");
                    check_per_token(&dev, &name, &hx, &dxi, &params, (m, k));
                }
            }
            for block in [(32, 32), (128, 128)] {
                let params = PerBlockCastParams::new(fmt, block, opts);
                check_per_block(
                    &dev,
                    &format!("special per_block {block:?} {fmt:?} {opts:?}"),
                    &PlainInput::F32(x.view()),
                    &DevicePlainInput::F32(dx.view()),
                    &params,
                    (m, k),
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// per_block_cast, per_channel_cast
// ---------------------------------------------------------------------------------------------

#[test]
fn gpu_per_block_cast_grid() {
    let Some(dev) = gpu_or_skip("gpu_per_block_cast_grid") else {
        return;
    };
    let mut cases = Vec::new();
    for m in grid_ms(&[4001, 8001]) {
        for k in generate_hidden_sizes(64) {
            for bf in [false, true] {
                for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
                    for opts in grid_configs() {
                        for block in [(128, 128), (32, 32)] {
                            cases.push((m, k, bf, fmt, opts, block, k, 0usize));
                        }
                    }
                }
            }
        }
    }
    // Off grid: a few rows, a partial last row block; odd M in bf16, even M in fp32.
    for (m, k) in [
        (1, 64),
        (3, 192),
        (33, 4160),
        (129, 576),
        (2, 64),
        (34, 4160),
    ] {
        for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
            for opts in [
                ScaleOptions::row_major(false),
                ScaleOptions::col_major(true),
                ScaleOptions::packed_ue8m0(),
            ] {
                for block in [(128, 128), (32, 32), (32, 128), (128, 32)] {
                    cases.push((m, k, m % 2 == 1, fmt, opts, block, k, 0));
                }
            }
        }
    }
    // Row-strided views: padded aligned rows (vector loads from a row pointer) and an odd start
    // (element loads), with the warp-block tiles (32x32) and the shared-memory ones (128x128).
    for (m, k) in [(33, 4160), (34, 576)] {
        for (pad, off) in [(16, 0), (5, 1)] {
            for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
                for opts in [ScaleOptions::row_major(false), ScaleOptions::packed_ue8m0()] {
                    for block in [(32, 32), (128, 128)] {
                        cases.push((m, k, m % 2 == 1, fmt, opts, block, k + pad, off));
                    }
                }
            }
        }
    }
    par_cases(&cases, |&(m, k, bf, fmt, opts, block, ld, off)| {
        let dev = dev.with_new_stream().unwrap();
        let params = PerBlockCastParams::new(fmt, block, opts);
        let name = format!(
            "per_block_cast M={m} K={k} bf16={bf} {fmt:?} {block:?} {:?}{}",
            opts.layout().unwrap(),
            if ld == k && off == 0 {
                String::new()
            } else {
                format!(" ld={ld} off={off}")
            }
        );
        let buf = HostPlain::randn(bf, m + off.div_ceil(ld), ld, &name);
        let l = Layout::new(vec![m, k], vec![ld, 1], off).unwrap();
        let hx = buf.input(&l);
        let dbuf = buf.upload(&dev);
        let dx = dbuf.input(&l);
        let rs = check_per_block(&dev, &name, &hx, &dx, &params, (m, k));
        let s2 = tk_quant::per_block_cast_with_sf_only(&dx, &params).unwrap();
        check(&format!("{name} sf-only"), None, Some(&s2), None, Some(&rs));
        if rs.layout() == ScaleLayout::RowMajorF32 {
            let f = rs.f32_storage().unwrap();
            let sfh =
                HostTensor::from_vec(f.to_vec(), &[rs.grid().nbm(), rs.grid().nbk()]).unwrap();
            let rp =
                reference::per_block_cast_with_precomputed_sf(&hx, &params, &sfh.view()).unwrap();
            let d3 = tk_quant::per_block_cast_with_precomputed_sf(
                &dx,
                &params,
                &dev.upload(&sfh).unwrap().view(),
            )
            .unwrap();
            check(
                &format!("{name} precomputed"),
                Some(&d3),
                None,
                Some(&rp),
                None,
            );
        }
    });
}

#[test]
fn gpu_per_channel_cast_grid() {
    let Some(dev) = gpu_or_skip("gpu_per_channel_cast_grid") else {
        return;
    };
    let mut cases = Vec::new();
    for m in grid_ms(&[4096, 8064]) {
        for k in generate_hidden_sizes(64) {
            for round in [false, true] {
                cases.push((m, k, true, round));
            }
        }
    }
    for (m, k) in [(128, 64), (256, 4160), (384, 576)] {
        for round in [false, true] {
            cases.push((m, k, false, round));
        }
    }
    par_cases(&cases, |&(m, k, bf, round)| {
        let dev = dev.with_new_stream().unwrap();
        let params = PerChannelCastParams::new(128, round);
        let name = format!("per_channel_cast M={m} K={k} bf16={bf} round={round}");
        let buf = HostPlain::randn(bf, m, k, &name);
        let l = Layout::contiguous(&[m, k]);
        let (rd, rs) = reference::per_channel_cast(&buf.input(&l), &params).unwrap();
        let dbuf = buf.upload(&dev);
        let (mut d, mut s) = poisoned(&dev, CastFormat::E4M3, m, k, rs.layout(), rs.grid());
        tk_quant::per_channel_cast_into(&dbuf.input(&l), &params, &mut d.view_mut(), &mut s)
            .unwrap();
        check(&name, Some(&d), Some(&s), Some(&rd), Some(&rs));
    });
}

// ---------------------------------------------------------------------------------------------
// cast_back
// ---------------------------------------------------------------------------------------------

/// Casts `x` on the CPU with `block` / `opts`, then checks the GPU cast back (fp32 and bf16)
/// against the reference, from the data's full view and from a row-strided one.
fn check_cast_back(
    dev: &Device,
    name: &str,
    m: usize,
    k: usize,
    fmt: CastFormat,
    block: (usize, usize),
    opts: ScaleOptions,
) {
    let x = Rng::for_case(name).randn(&[m, k], |v| v);
    check_cast_back_of(dev, name, &x, fmt, block, opts);
}

/// check_cast_back of the `(M, K)` fp32 input `x`.
fn check_cast_back_of(
    dev: &Device,
    name: &str,
    x: &HostTensor<f32>,
    fmt: CastFormat,
    block: (usize, usize),
    opts: ScaleOptions,
) {
    let (m, k) = (x.shape()[0], x.shape()[1]);
    let (q, s) = reference::cast(&x.view().into(), fmt, block, opts).unwrap();
    let hin = QuantInput::new(q.view(), s.view(), block);
    let dq = DevQuant::upload(dev, &q, &s);
    let din = dq.input(block);
    let mut o32 = dev.alloc::<f32>(&[m, k]).unwrap();
    o32.fill_bytes(POISON).unwrap();
    tk_quant::cast_back_into(&din, &mut o32.view_mut()).unwrap();
    check_cast_back_outputs(
        name,
        &o32,
        &reference::cast_back_op::<f32>(&hin).unwrap(),
        &tk_quant::cast_back::<bf16>(&din).unwrap(),
        &reference::cast_back_op::<bf16>(&hin).unwrap(),
    );
}

/// Compares a cast back's fp32 output (written into a poisoned buffer) and bf16 output (from
/// the allocating form) with the references, bit for bit.
fn check_cast_back_outputs(
    name: &str,
    o32: &DeviceTensor<f32>,
    r32: &HostTensor<f32>,
    o16: &DeviceTensor<bf16>,
    r16: &HostTensor<bf16>,
) {
    assert_bits_eq(
        &format!("{name} fp32"),
        o32.to_host().unwrap().as_slice(),
        r32.as_slice(),
    );
    assert_bits_eq(
        &format!("{name} bf16"),
        o16.to_host().unwrap().as_slice(),
        r16.as_slice(),
    );
}

#[test]
fn gpu_cast_back_grid() {
    let Some(dev) = gpu_or_skip("gpu_cast_back_grid") else {
        return;
    };
    let mut cases = Vec::new();
    for m in grid_ms(&[4001, 8001]) {
        for k in generate_hidden_sizes(64) {
            for fmt in [CastFormat::E2M1, CastFormat::E4M3] {
                for opts in grid_configs() {
                    for npc in [128, k] {
                        cases.push((m, k, fmt, (1, npc), opts));
                    }
                }
            }
            for round in [false, true] {
                for block in [(128, 1), (128, 128)] {
                    cases.push((
                        m,
                        k,
                        CastFormat::E4M3,
                        block,
                        ScaleOptions::row_major(round),
                    ));
                }
            }
        }
    }
    for (m, k) in [(1, 64), (3, 192), (37, 4160)] {
        for fmt in [CastFormat::E2M1, CastFormat::E4M3] {
            for block in [(1, 16), (1, 3), (5, 7), (32, 32)] {
                for opts in [ScaleOptions::col_major(false), ScaleOptions::packed_ue8m0()] {
                    cases.push((m, k, fmt, block, opts));
                }
            }
        }
    }
    par_cases(&cases, |&(m, k, fmt, block, opts)| {
        let name = format!(
            "cast_back M={m} K={k} {fmt:?} {block:?} {:?}",
            opts.layout().unwrap()
        );
        check_cast_back(
            &dev.with_new_stream().unwrap(),
            &name,
            m,
            k,
            fmt,
            block,
            opts,
        );
    });
}

/// e2m1 cast back with scales far on both sides of 4 (cast_back.cu's one-multiply bf16 path
/// takes |s| < 4, larger scales the two-multiply one): rows of normals times 2^e, e from -140
/// (subnormal data, clamped scales) to 119, row by row, so that the blocks' scales differ.
#[test]
fn gpu_cast_back_e2m1_scale_range() {
    let Some(dev) = gpu_or_skip("gpu_cast_back_e2m1_scale_range") else {
        return;
    };
    let (m, k) = (300, 1024);
    let mut cases = Vec::new();
    for block in [(1, 128), (1, 32), (128, 128)] {
        for opts in [ScaleOptions::row_major(false), ScaleOptions::packed_ue8m0()] {
            cases.push((block, opts));
        }
    }
    par_cases(&cases, |&(block, opts)| {
        let name = format!(
            "cast_back e2m1 scale range {block:?} {:?}",
            opts.layout().unwrap()
        );
        let mut x = Rng::for_case(&name).randn(&[m, k], |v| v);
        for (r, row) in x.as_mut_slice().chunks_mut(k).enumerate() {
            // 2^e as two normal powers of two (2^-140 itself is subnormal)
            let e = (r as i32 * 37) % 260 - 140;
            let pow2 = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
            let (a, b) = (pow2(e / 2), pow2(e - e / 2));
            row.iter_mut().for_each(|v| *v = *v * a * b);
        }
        check_cast_back_of(
            &dev.with_new_stream().unwrap(),
            &name,
            &x,
            CastFormat::E2M1,
            block,
            opts,
        );
    });
}

// ---------------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------------

#[test]
fn gpu_bad_outputs_are_typed_errors() {
    let Some(dev) = gpu_or_skip("gpu_bad_outputs_are_typed_errors") else {
        return;
    };
    let x = dev.upload(&Rng::new(1).randn(&[4, 128], |v| v)).unwrap();
    let dx: DeviceCastInput<'_> = x.view().into();
    let p = PerTokenCastParams::new(CastFormat::E4M3, 32, ScaleOptions::packed_ue8m0());
    let grid = tk_quant::ScaleGrid::new(4, 4).unwrap();
    // Wrong data format, wrong shape, wrong scale layout / grid.
    let mut d = DeviceQuantData::alloc(&dev, CastFormat::E2M1, 4, 128).unwrap();
    let mut s = DeviceScales::alloc(&dev, ScaleLayout::PackedUe8m0, grid).unwrap();
    let e = tk_quant::per_token_cast_into(&dx, &p, &mut d.view_mut(), &mut s).unwrap_err();
    assert!(matches!(e, TkError::Dtype { arg: "out", .. }), "{e}");
    let mut d = DeviceQuantData::alloc(&dev, CastFormat::E4M3, 4, 64).unwrap();
    let e = tk_quant::per_token_cast_into(&dx, &p, &mut d.view_mut(), &mut s).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "out", .. }), "{e}");
    let mut d = DeviceQuantData::alloc(&dev, CastFormat::E4M3, 4, 128).unwrap();
    let mut s = DeviceScales::alloc(&dev, ScaleLayout::ColMajorF32, grid).unwrap();
    let e = tk_quant::per_token_cast_into(&dx, &p, &mut d.view_mut(), &mut s).unwrap_err();
    assert!(matches!(e, TkError::Param { arg: "out_sf", .. }), "{e}");
    // Validation errors of the op are the CPU side's (here: npc not allowed).
    let e = tk_quant::per_token_cast(
        &dx,
        &PerTokenCastParams::new(CastFormat::E4M3, 48, ScaleOptions::default()),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            TkError::Param {
                arg: "num_per_channels",
                ..
            }
        ),
        "{e}"
    );
    // Precomputed scales of the wrong shape.
    let sf = dev
        .upload(&HostTensor::from_vec(vec![1.0f32; 4 * 3], &[4, 3]).unwrap())
        .unwrap();
    let p = PerTokenCastParams::new(CastFormat::E4M3, 32, ScaleOptions::row_major(true));
    let e = tk_quant::per_token_cast_with_precomputed_sf(&dx, &p, &sf.view()).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "sf", .. }), "{e}");
    // A whole row beyond the kernel's limit.
    let big = dev.alloc::<f32>(&[1, 131072 + 64]).unwrap();
    let p = PerTokenCastParams::new(CastFormat::E4M3, 131072 + 64, ScaleOptions::default());
    let e = tk_quant::per_token_cast(&big.view().into(), &p).unwrap_err();
    assert!(
        matches!(
            e,
            TkError::Param {
                arg: "num_per_channels",
                ..
            }
        ),
        "{e}"
    );
    // Cast back: output of the wrong shape.
    let (q, s) = reference::cast(
        &Rng::new(2).randn(&[4, 128], |v| v).view().into(),
        CastFormat::E4M3,
        (1, 128),
        ScaleOptions::packed_ue8m0(),
    )
    .unwrap();
    let dq = DevQuant::upload(&dev, &q, &s);
    let mut o = dev.alloc::<f32>(&[4, 64]).unwrap();
    let e = tk_quant::cast_back_into(&dq.input((1, 128)), &mut o.view_mut()).unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "out", .. }), "{e}");
}

// ---------------------------------------------------------------------------------------------
// E5M6
// ---------------------------------------------------------------------------------------------

/// E5M6 cast of `x` on the GPU vs the reference (bytes and scales), then the GPU cast back of
/// the GPU's bytes (fp32 and bf16, row blocks `(1, K)` and a 2-D block) vs the reference.
fn check_e5m6(dev: &Device, name: &str, buf: &HostPlain, l: &Layout, opts: ScaleOptions) {
    let (m, k) = (l.shape()[0], l.shape()[1]);
    let params = PerTokenE5M6Params::new(k, opts);
    let (rq, rs) = reference::per_token_cast_to_e5m6(&buf.input(l), &params).unwrap();
    let dbuf = buf.upload(dev);
    let mut q = dev.alloc::<E5M6Bytes>(&[m, k / 2 * 3]).unwrap();
    q.fill_bytes(POISON).unwrap();
    let mut s = DeviceScales::alloc(dev, rs.layout(), rs.grid()).unwrap();
    s.fill_bytes(POISON).unwrap();
    tk_quant::per_token_cast_to_e5m6_into(&dbuf.input(l), &params, &mut q.view_mut(), &mut s)
        .unwrap();
    let gq = q.to_host().unwrap();
    let bytes = |t: &HostTensor<E5M6Bytes>| t.as_slice().iter().map(|b| b.0).collect::<Vec<u8>>();
    assert_bits_eq(&format!("{name}: e5m6 bytes"), &bytes(&gq), &bytes(&rq));
    check(name, None, Some(&s), None, Some(&rs));
    for block in [(1, k), (3, 8)] {
        let hs = if block == (1, k) {
            rs.clone()
        } else {
            let grid = tk_quant::ScaleGrid::new(m.div_ceil(3), k / 8).unwrap();
            HostScales::from_fn(ScaleLayout::ColMajorF32, grid, |mb, kb| {
                (1 + (mb * 7 + kb) % 5) as f32 * 0.375
            })
            .unwrap()
        };
        let dsf = DevQuant::upload_scales(dev, &hs);
        let dview = dsf.view(&hs);
        let mut o32 = dev.alloc::<f32>(&[m, k]).unwrap();
        o32.fill_bytes(POISON).unwrap();
        tk_quant::cast_back_e5m6_into(&q.view(), &dview, block, &mut o32.view_mut()).unwrap();
        check_cast_back_outputs(
            &format!("{name}: cast back {block:?}"),
            &o32,
            &reference::cast_back_e5m6::<f32>(&gq.view(), &hs.view(), block).unwrap(),
            &tk_quant::cast_back_e5m6::<bf16>(&q.view(), &dview, block).unwrap(),
            &reference::cast_back_e5m6::<bf16>(&gq.view(), &hs.view(), block).unwrap(),
        );
    }
}

#[test]
fn gpu_e5m6_grid() {
    let Some(dev) = gpu_or_skip("gpu_e5m6_grid") else {
        return;
    };
    let mut cases = Vec::new();
    for m in grid_ms(&[4001, 8001]) {
        for k in generate_hidden_sizes(64) {
            for opts in grid_configs() {
                for bf in [false, true] {
                    cases.push((m, k, bf, opts, k));
                }
            }
        }
    }
    // Off grid: small K, K not a multiple of 64, padded and unaligned rows, fp32 scales.
    for (m, k) in [(1, 8), (3, 24), (37, 1000), (5, 65536)] {
        for opts in [
            ScaleOptions::row_major(false),
            ScaleOptions::col_major(false),
            ScaleOptions::packed_ue8m0(),
        ] {
            for bf in [false, true] {
                cases.push((m, k, bf, opts, k));
                cases.push((m, k, bf, opts, k + 5));
            }
        }
    }
    par_cases(&cases, |&(m, k, bf, opts, ld)| {
        let name = format!(
            "e5m6 M={m} K={k} ld={ld} bf16={bf} {:?}",
            opts.layout().unwrap()
        );
        let off = usize::from(ld != k);
        let buf = HostPlain::randn(bf, m + 1, ld, &name);
        let l = Layout::new(vec![m, k], vec![ld, 1], off).unwrap();
        check_e5m6(&dev.with_new_stream().unwrap(), &name, &buf, &l, opts);
    });
}

/// Values whose scaled magnitude falls below 2^-14 (the documented quirk of the kernel's
/// encoder), subnormals, zeros, ±inf and NaN, in E5M6.
#[test]
fn gpu_e5m6_special_values() {
    let Some(dev) = gpu_or_skip("gpu_e5m6_special_values") else {
        return;
    };
    let (m, k) = (8, 256);
    let mut x = Rng::for_case("e5m6 specials").randn(&[m, k], |v| v);
    let xs = x.as_mut_slice();
    for (i, v) in xs[..k].iter_mut().enumerate() {
        *v = 10f32.powi(-((i % 40) as i32)) * if i % 2 == 0 { 1.0 } else { -1.0 };
    }
    xs[0] = 1.0e3; // row 0: a wide dynamic range
    xs[k..2 * k].iter_mut().for_each(|v| *v = 0.0);
    for (i, v) in xs[2 * k..3 * k].iter_mut().enumerate() {
        *v = f32::from_bits(1 + 4099 * i as u32);
    }
    xs[3 * k + 3] = f32::INFINITY;
    xs[4 * k + 9] = f32::NAN;
    xs[5 * k + 1] = f32::NEG_INFINITY;
    let buf = HostPlain::F32(x);
    for opts in [
        ScaleOptions::row_major(false),
        ScaleOptions::col_major(true),
    ] {
        check_e5m6(
            &dev,
            "e5m6 specials",
            &buf,
            &Layout::contiguous(&[m, k]),
            opts,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// per_block_cast_lossless
// ---------------------------------------------------------------------------------------------

/// The lossless cast of upstream's test data (`rand_float`, cast to e2m1 with `(1, 32)` blocks
/// and power-of-two scales in `in_opts`) on the GPU vs the reference: data and scales.
fn check_lossless(
    dev: &Device,
    name: &str,
    m: usize,
    k: usize,
    in_opts: ScaleOptions,
    params: &LosslessCastParams,
) {
    let mut rng = Rng::for_case(name);
    let u = rng.below(237) as i32 - 110;
    let x = op_common::rand_float(&mut rng, m, k, u);
    let (q, s) = reference::cast(&x.view().into(), CastFormat::E2M1, (1, 32), in_opts).unwrap();
    let hin = QuantInput::new(q.view(), s.view(), (1, 32));
    let (rd, rs) = reference::per_block_cast_lossless(&hin, params).unwrap();
    let dq = DevQuant::upload(dev, &q, &s);
    let (mut d, mut ds) = poisoned(dev, CastFormat::E4M3, m, k, rs.layout(), rs.grid());
    let status = LosslessStatus::new(dev).unwrap();
    tk_quant::per_block_cast_lossless_into(
        &dq.input((1, 32)),
        params,
        &mut d.view_mut(),
        &mut ds,
        &status,
    )
    .unwrap();
    status.check().unwrap();
    check(name, Some(&d), Some(&ds), Some(&rd), Some(&rs));
}

#[test]
fn gpu_per_block_cast_lossless_grid() {
    let Some(dev) = gpu_or_skip("gpu_per_block_cast_lossless_grid") else {
        return;
    };
    let mut cases = Vec::new();
    for m in grid_ms(&[4001, 8001]) {
        for k in generate_hidden_sizes(64) {
            for in_opts in grid_configs() {
                for out_opts in grid_configs() {
                    for ob in [(1, 128), (32, 32), (128, 128)] {
                        cases.push((m, k, in_opts, out_opts, ob));
                    }
                }
            }
        }
    }
    for (m, k) in [(1, 32), (3, 96), (37, 4160)] {
        for ob in [(1, 32), (2, 64), (3, 32), (64, 256)] {
            cases.push((
                m,
                k,
                ScaleOptions::col_major(true),
                ScaleOptions::col_major(false),
                ob,
            ));
        }
    }
    par_cases(&cases, |&(m, k, in_opts, out_opts, ob)| {
        let name = format!(
            "lossless M={m} K={k} in={:?} out={:?} {ob:?}",
            in_opts.layout().unwrap(),
            out_opts.layout().unwrap()
        );
        check_lossless(
            &dev.with_new_stream().unwrap(),
            &name,
            m,
            k,
            in_opts,
            &LosslessCastParams::new(ob, out_opts),
        );
    });
}

/// Each data-dependent error of the lossless cast is reported by the status (and by the
/// syncing op) exactly when the reference reports it.
#[test]
fn gpu_per_block_cast_lossless_errors() {
    let Some(dev) = gpu_or_skip("gpu_per_block_cast_lossless_errors") else {
        return;
    };
    let (m, k) = (4, 64);
    let x = Rng::new(5).randn(&[m, k], |v| v);
    let params = LosslessCastParams::new((4, 64), ScaleOptions::row_major(true));
    let (q, s) = reference::cast(
        &x.view().into(),
        CastFormat::E2M1,
        (1, 32),
        ScaleOptions::row_major(true),
    )
    .unwrap();
    let grid = s.grid();
    let mut cases: Vec<(&str, HostScales, QuantData)> = Vec::new();
    // 1: a scale that is not a power of two.
    let mut v = s.to_grid();
    v[3] *= 1.5;
    cases.push((
        "non-power-of-two scale",
        HostScales::from_grid(ScaleLayout::RowMajorF32, grid, &v).unwrap(),
        q.clone(),
    ));
    // 2: one input block 2^12 below the others.
    let mut v = s.to_grid();
    v[2] = v.iter().cloned().fold(0.0, f32::max) / 4096.0 / 2.0;
    cases.push((
        "spread",
        HostScales::from_grid(ScaleLayout::RowMajorF32, grid, &v).unwrap(),
        q.clone(),
    ));
    // 3: every scale tiny (E_max <= 6) over nonzero data.
    let v = vec![f32::from_bits(3 << 23); grid.nbm() * grid.nbk()];
    cases.push((
        "zero output scale",
        HostScales::from_grid(ScaleLayout::RowMajorF32, grid, &v).unwrap(),
        q.clone(),
    ));
    for (what, hs, hq) in &cases {
        let hin = QuantInput::new(hq.view(), hs.view(), (1, 32));
        let r = reference::per_block_cast_lossless(&hin, &params);
        assert!(r.is_err(), "{what}: the reference must reject it");
        let dq = DevQuant::upload(&dev, hq, hs);
        let e = tk_quant::per_block_cast_lossless(&dq.input((1, 32)), &params).unwrap_err();
        assert!(
            matches!(e, TkError::Param { arg: "x.sf", .. }),
            "{what}: {e}"
        );
    }
    // And a valid input reports nothing.
    let dq = DevQuant::upload(&dev, &q, &s);
    tk_quant::per_block_cast_lossless(&dq.input((1, 32)), &params).unwrap();
}

/// The lossless cast from row-strided FP4 data: rows 8-byte aligned (pass 2's integer path),
/// 4-byte aligned (its fp32 path with vector accesses) and starting at an odd byte (byte
/// accesses), against the reference of the contiguous data.
#[test]
fn gpu_per_block_cast_lossless_strided() {
    let Some(dev) = gpu_or_skip("gpu_per_block_cast_lossless_strided") else {
        return;
    };
    let mut cases = Vec::new();
    for (m, k) in [(3, 96), (37, 4160)] {
        for ob in [(1, 128), (32, 32)] {
            for (pad, off) in [(16, 0), (4, 0), (5, 1)] {
                cases.push((m, k, ob, pad, off));
            }
        }
    }
    par_cases(&cases, |&(m, k, ob, pad, off)| {
        let dev = dev.with_new_stream().unwrap();
        let name = format!("lossless strided M={m} K={k} {ob:?} pad={pad} off={off}");
        let mut rng = Rng::for_case(&name);
        let u = rng.below(237) as i32 - 110;
        let x = op_common::rand_float(&mut rng, m, k, u);
        let opts = ScaleOptions::packed_ue8m0();
        let (q, s) = reference::cast(&x.view().into(), CastFormat::E2M1, (1, 32), opts).unwrap();
        let hin = QuantInput::new(q.view(), s.view(), (1, 32));
        let params = LosslessCastParams::new(ob, opts);
        let (rd, rs) = reference::per_block_cast_lossless(&hin, &params).unwrap();
        let QuantData::E2M1(t) = &q else {
            unreachable!("an e2m1 cast gives e2m1 data")
        };
        let (d, l) = upload_row_strided(&dev, t, pad, off);
        let sf = DevQuant::upload_scales(&dev, &s);
        let data = DeviceQuantDataView::E2M1(d.view().with_layout(l).unwrap());
        let din = DeviceQuantInput::new(data, sf.view(&s), (1, 32));
        let (mut od, mut os) = poisoned(&dev, CastFormat::E4M3, m, k, rs.layout(), rs.grid());
        let status = LosslessStatus::new(&dev).unwrap();
        tk_quant::per_block_cast_lossless_into(&din, &params, &mut od.view_mut(), &mut os, &status)
            .unwrap();
        status.check().unwrap();
        check(&name, Some(&od), Some(&os), Some(&rd), Some(&rs));
    });
}

/// Per-token tiles of plain input hold two adjacent fragments per lane (16 bf16 / 8 fp32
/// columns) over 16-row tiles: rows ending in the first fragment of a lane (K ≡ 8 mod 16 for
/// bf16, K ≡ 4 mod 8 for fp32), row counts not a multiple of 16, groups of one lane pair
/// (npc = 16), aligned (vector) and unaligned or padded rows; sf-only and precomputed modes
/// come with each case (`run_token_case`).
#[test]
fn gpu_per_token_cast_two_fragment_edges() {
    let Some(dev) = gpu_or_skip("gpu_per_token_cast_two_fragment_edges") else {
        return;
    };
    let mut cases = Vec::new();
    for (m, k, input) in [
        (17, 1016, In::BF16),
        (33, 4104, In::BF16),
        (17, 1004, In::F32),
        (31, 4100, In::F32),
    ] {
        for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
            for npc in [16, 32, 128] {
                for opts in [ScaleOptions::packed_ue8m0(), ScaleOptions::row_major(false)] {
                    for (ld, offset) in [(k, 0), (k + 4, 4)] {
                        cases.push(TokenCase {
                            m,
                            k,
                            input,
                            npc,
                            fmt,
                            opts,
                            ld,
                            offset,
                        });
                    }
                }
            }
        }
    }
    par_cases(&cases, |c| {
        run_token_case(&dev.with_new_stream().unwrap(), c)
    });
}

// ---------------------------------------------------------------------------------------------
// cast_back: row-strided data and per-column scale layouts
// ---------------------------------------------------------------------------------------------

/// `t` `(M, C)` on the device with rows `C + pad` storage elements apart, starting `off`
/// elements in (the padding repeats the first element and is never read), and that layout.
fn upload_row_strided<T: tk_core::Element + Copy>(
    dev: &Device,
    t: &HostTensor<T>,
    pad: usize,
    off: usize,
) -> (DeviceTensor<T>, Layout) {
    let (m, c) = (t.shape()[0], t.shape()[1]);
    let ld = c + pad;
    let fill = t.as_slice()[0];
    let mut v = vec![fill; off + m * ld];
    for (r, row) in t.as_slice().chunks(c).enumerate() {
        v[off + r * ld..off + r * ld + c].copy_from_slice(row);
    }
    let n = v.len();
    let d = dev.upload(&HostTensor::from_vec(v, &[n]).unwrap()).unwrap();
    (d, Layout::new(vec![m, c], vec![ld, 1], off).unwrap())
}

/// Cast back from row-strided data: padded aligned rows (vector loads) and an odd start
/// (element loads and stores), with (bm, 1) blocks in row-major (vector scale loads) and
/// column-major (one scale per value) layouts, other blocks, K not a multiple of a warp task.
#[test]
fn gpu_cast_back_strided() {
    let Some(dev) = gpu_or_skip("gpu_cast_back_strided") else {
        return;
    };
    let mut cases = Vec::new();
    for (m, k) in [(1, 64), (37, 4160)] {
        for fmt in [CastFormat::E2M1, CastFormat::E4M3] {
            for (block, opts) in [
                ((1, 128), ScaleOptions::packed_ue8m0()),
                ((128, 1), ScaleOptions::row_major(false)),
                ((3, 1), ScaleOptions::col_major(false)),
                ((5, 7), ScaleOptions::row_major(false)),
            ] {
                for (pad, off) in [(16, 0), (5, 1)] {
                    cases.push((m, k, fmt, block, opts, pad, off));
                }
            }
        }
    }
    par_cases(&cases, |&(m, k, fmt, block, opts, pad, off)| {
        let dev = dev.with_new_stream().unwrap();
        let name = format!(
            "cast_back strided M={m} K={k} {fmt:?} {block:?} {:?} pad={pad} off={off}",
            opts.layout().unwrap()
        );
        let x = Rng::for_case(&name).randn(&[m, k], |v| v);
        let (q, s) = reference::cast(&x.view().into(), fmt, block, opts).unwrap();
        let hin = QuantInput::new(q.view(), s.view(), block);
        let sf = DevQuant::upload_scales(&dev, &s);
        let (e4m3, e2m1);
        let data = match &q {
            QuantData::E4M3(t) => {
                let (d, l) = upload_row_strided(&dev, t, pad, off);
                e4m3 = d;
                DeviceQuantDataView::E4M3(e4m3.view().with_layout(l).unwrap())
            }
            QuantData::E2M1(t) => {
                let (d, l) = upload_row_strided(&dev, t, pad, off);
                e2m1 = d;
                DeviceQuantDataView::E2M1(e2m1.view().with_layout(l).unwrap())
            }
        };
        let din = DeviceQuantInput::new(data, sf.view(&s), block);
        let mut o32 = dev.alloc::<f32>(&[m, k]).unwrap();
        o32.fill_bytes(POISON).unwrap();
        tk_quant::cast_back_into(&din, &mut o32.view_mut()).unwrap();
        check_cast_back_outputs(
            &name,
            &o32,
            &reference::cast_back_op::<f32>(&hin).unwrap(),
            &tk_quant::cast_back::<bf16>(&din).unwrap(),
            &reference::cast_back_op::<bf16>(&hin).unwrap(),
        );
    });
}

/// bf16 -> e2m1 with power-of-two scales (the packed bf16 encoder of `cuda/cast.cu`) at its
/// edges: rows whose block maximum is 6 * 2^s for s from -140 to 20, so that the inverse scales
/// fall on both sides of the encoder's 2^120 guard (and the eps clamp), values on and one bf16
/// ulp next to every e2m1 rounding tie of the block scale, both signs, -0 and subnormal bf16
/// inputs in every row; per-token (npc 32, 128, K) and per-block (32x32, 128x128) casts, bit
/// exact against the reference.
#[test]
fn gpu_cast_e2m1_bf16_pow2_edges() {
    let Some(dev) = gpu_or_skip("gpu_cast_e2m1_bf16_pow2_edges") else {
        return;
    };
    let exps: Vec<i32> = (-140..=-100).chain([-10, 0, 10, 20]).collect();
    let (m, k) = (exps.len(), 512);
    let ties = [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 3.0];
    let mut rng = Rng::for_case("e2m1 bf16 pow2 edges");
    let noise = rng.randn(&[m, k], |v| v);
    let mut xs = Vec::with_capacity(m * k);
    for (r, &s) in exps.iter().enumerate() {
        let scale = 2f32.powi(s / 2) * 2f32.powi(s - s / 2); // 2^s, also below 2^-126
        for c in 0..k {
            let sign = if (c / 3) % 2 == 0 { 1.0 } else { -1.0 };
            let v = match c % 32 {
                0 => 6.0 * scale, // the block maximum
                1 => -0.0,
                2 => f32::from_bits(1 + (c as u32) * 4099), // an fp32 subnormal (bf16: subnormal or 0)
                3..=20 => {
                    let t = ties[c % ties.len()];
                    let d = [-1.0f32, 0.0, 1.0][(c / 9) % 3] / 128.0;
                    sign * t * (1.0 + d) * scale
                }
                _ => noise.as_slice()[r * k + c].clamp(-5.9, 5.9) * scale,
            };
            xs.push(bf16::from_f32(v));
        }
    }
    let xb = HostTensor::from_vec(xs, &[m, k]).unwrap();
    let dxb = dev.upload(&xb).unwrap();
    let fmt = CastFormat::E2M1;
    for opts in [
        ScaleOptions::row_major(true),
        ScaleOptions::col_major(true),
        ScaleOptions::packed_ue8m0(),
    ] {
        for npc in [32, 128, k] {
            let params = PerTokenCastParams::new(fmt, npc, opts);
            let name = format!("e2m1 bf16 pow2 edges npc={npc} {opts:?}");
            let hx: CastInput<'_> = xb.view().into();
            let dx: DeviceCastInput<'_> = dxb.view().into();
            check_per_token(&dev, &name, &hx, &dx, &params, (m, k));
        }
        for block in [(32, 32), (128, 128)] {
            let params = PerBlockCastParams::new(fmt, block, opts);
            let name = format!("e2m1 bf16 pow2 edges per_block {block:?} {opts:?}");
            check_per_block(
                &dev,
                &name,
                &PlainInput::BF16(xb.view()),
                &DevicePlainInput::BF16(dxb.view()),
                &params,
                (m, k),
            );
        }
        // Per-block tiles whose every block has an inverse scale above 2^120 (the rows with
        // s <= -121 only: block maxima 6 * 2^-121 and below), so that all their rows take the
        // fp32 fallback of the packed encoder (the 2^120 test hoisted out of the tiles' rows);
        // M = 20 is a partial block row.
        let tiny = exps.iter().filter(|&&s| s <= -121).count();
        let xt = HostTensor::from_vec(xb.as_slice()[..tiny * k].to_vec(), &[tiny, k]).unwrap();
        let dxt = dev.upload(&xt).unwrap();
        for block in [(32, 32), (128, 128)] {
            let params = PerBlockCastParams::new(fmt, block, opts);
            let name = format!("e2m1 bf16 pow2 edges per_block tiny {block:?} {opts:?}");
            check_per_block(
                &dev,
                &name,
                &PlainInput::BF16(xt.view()),
                &DevicePlainInput::BF16(dxt.view()),
                &params,
                (tiny, k),
            );
        }
    }
}
