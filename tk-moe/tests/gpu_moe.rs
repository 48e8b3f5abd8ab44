//! GPU tests: every GPU op against the crate's CPU reference, bit for bit, on fresh random
//! inputs with poisoned outputs (`tk_core::testing::poison`). Without a GPU each test prints
//! SKIPPED (and fails under `TK_REQUIRE_GPU=1`).
//!
//! Grids: the 12 moe12 configurations of the spec (`TK_FULL_TEST`: the full grid, every hidden
//! size) with full-size `topk_idx`, plus off-grid index tensors ([`off_grid`]: 160 / 384
//! experts, top-k 1 and 7, zero tokens, all tokens to one expert, experts with no tokens) and
//! illegal indices (the GPU reads them as `-1`: compared with the CPU reference on
//! `tk_moe::index::sanitize_indices`). The big per-config cases rotate through the hidden sizes
//! (all of them under `TK_FULL_TEST`) to keep the suite's device time small.
//!
//! Cases run on all host cores ([`par_gpu`]: the CPU references, input generation and
//! host/device copies dominate), each worker on its own stream; per-config inputs (`topk_idx`
//! and its mapping) are built once per test and shared by the cases, and every input is
//! uploaded once for all the option combinations that read it.
#![cfg(all(feature = "cuda", feature = "cpu"))]

mod common;

use common::{check_mapping, grid, par_map, topk_idx_for};
use float8::F8E4M3;
use half::bf16;
use tk_core::testing::{
    assert_bits_eq, case_seed, full_test, generate_hidden_sizes, gpu_or_skip, par_random_bits,
    poison, Rng,
};
use tk_core::{Device, DeviceTensor, Element, HostTensor};
use tk_moe::index::sanitize_indices;
use tk_moe::reference::{self, FusedMapping, ReduceFusedInputs};
use tk_moe::testing::MoeParams;
use tk_moe::{
    DeviceReduceFusedInputs, ExpandToFusedWithSfParams, GetFusedMappingParams, ReduceElement,
};

// ----- helpers ---------------------------------------------------------------------------------

fn up<T: Element>(dev: &Device, x: &HostTensor<T>) -> DeviceTensor<T> {
    dev.upload(x).unwrap()
}

/// A poisoned device tensor of `shape`.
fn poisoned<T: Element>(dev: &Device, shape: &[usize]) -> DeviceTensor<T> {
    let mut t = dev.alloc::<T>(shape).unwrap();
    poison(&mut t).unwrap();
    t
}

/// Runs `f` on every case on the host's cores, each case on a new stream of `dev` (the cases
/// of one worker run in order; different workers overlap on the device).
fn par_gpu<C: Sync>(dev: &Device, cases: &[C], f: impl Fn(&Device, &C) + Sync) {
    par_map(cases, |c| f(&dev.with_new_stream().unwrap(), c));
}

/// The hidden sizes of config number `i`: one of the seven (rotating), all under TK_FULL_TEST.
fn hidden_for(i: usize, sizes: &[usize]) -> Vec<usize> {
    if full_test() {
        sizes.to_vec()
    } else {
        vec![sizes[i % sizes.len()]]
    }
}

/// The `(config number, hidden size)` cases of a spec-grid test over `configs` configs.
fn hidden_cases(configs: usize, sizes: &[usize]) -> Vec<(usize, usize)> {
    (0..configs)
        .flat_map(|i| hidden_for(i, sizes).into_iter().map(move |h| (i, h)))
        .collect()
}

/// The grid's `topk_idx` tensors (seeded by `case`), built on all cores.
fn grid_indices(case: &str) -> Vec<(MoeParams, HostTensor<i64>)> {
    par_map(&grid(), |p| (*p, topk_idx_for(case, p)))
}

/// The grid's `topk_idx` tensors and their CPU mappings with alignment `a`, built on all cores.
fn grid_maps(case: &str, a: usize) -> Vec<(MoeParams, HostTensor<i64>, FusedMapping)> {
    par_map(&grid(), |p| {
        let idx = topk_idx_for(case, p);
        let map = cpu_map(&idx, p.num_experts, a);
        (*p, idx, map)
    })
}

/// The CPU mapping (host-sync row count) of `idx` over `e` experts, alignment `a`.
fn cpu_map(idx: &HostTensor<i64>, e: usize, a: usize) -> FusedMapping {
    reference::get_fused_mapping(&idx.view(), &GetFusedMappingParams::host_sync(e, a)).unwrap()
}

/// Off-grid index tensors `(name, topk_idx, E)`: 160 and 384 experts, top-k 1 and 7, zero
/// tokens, all tokens to one expert, experts that get no token.
fn off_grid() -> Vec<(String, HostTensor<i64>, usize)> {
    let mut v = Vec::new();
    for (k, global, ep) in [(7, 160, 1), (1, 384, 1), (7, 384, 2), (1, 160, 8)] {
        let p = MoeParams {
            num_send_tokens: 700,
            num_topk: k,
            num_experts: global / ep,
            num_ep_ranks: ep,
        };
        v.push((p.name(), topk_idx_for("off-grid", &p), p.num_experts));
    }
    let p = MoeParams {
        num_send_tokens: 0,
        num_topk: 6,
        num_experts: 32,
        num_ep_ranks: 8,
    };
    v.push(("zero tokens".into(), topk_idx_for("off-grid", &p), 32));
    let mut rng = Rng::for_case("off-grid one expert");
    let one = HostTensor::from_fn(&[3000, 8], |_| if rng.below(5) == 0 { -1 } else { 3 });
    v.push(("all tokens to expert 3 of 9".into(), one, 9));
    let sparse = HostTensor::from_fn(&[1500, 6], |_| rng.below(9) as i64 * 7 - 1);
    v.push(("ids {-1, 6, 13, ..} of 64 experts".into(), sparse, 64));
    v
}

/// `idx` with about 1 % of its entries replaced by illegal values (-2, -7, E, E + 5, i64::MIN,
/// i64::MAX).
fn with_illegal(idx: &HostTensor<i64>, e: usize, seed: &str) -> HostTensor<i64> {
    let mut rng = Rng::for_case(seed);
    let bad = [-2, -7, e as i64, e as i64 + 5, i64::MIN, i64::MAX];
    HostTensor::from_fn(idx.shape(), |i| {
        if rng.below(100) == 0 {
            bad[rng.below(bad.len() as u64) as usize]
        } else {
            idx.as_slice()[i]
        }
    })
}

// ----- expand_to_fused -------------------------------------------------------------------------

/// GPU expand (both the `_into` form on a poisoned output and the allocating form) against the
/// CPU reference on the same mapping.
fn check_expand<T: Element>(
    dev: &Device,
    what: &str,
    x: &HostTensor<T>,
    ttp: &HostTensor<i32>,
    pte: &HostTensor<i32>,
) {
    let m = pte.shape()[0];
    let expected = reference::expand_to_fused(
        &x.view(),
        &sanitize_indices(&ttp.view(), m).view(),
        &pte.view(),
    )
    .unwrap();
    let (dx, dttp, dpte) = (up(dev, x), up(dev, ttp), up(dev, pte));
    let mut out = poisoned::<T>(dev, expected.shape());
    tk_moe::expand_to_fused_into(&dx.view(), &dttp.view(), &dpte.view(), &mut out.view_mut())
        .unwrap();
    assert_bits_eq(what, out.to_host().unwrap().as_slice(), expected.as_slice());
    if expected.as_slice().len() < 1 << 24 {
        let alloc = tk_moe::expand_to_fused(&dx.view(), &dttp.view(), &dpte.view()).unwrap();
        assert_bits_eq(
            &format!("{what} (allocating)"),
            alloc.to_host().unwrap().as_slice(),
            expected.as_slice(),
        );
    }
}

#[test]
fn gpu_expand_to_fused_spec_grid() {
    let Some(dev) = gpu_or_skip("gpu_expand_to_fused_spec_grid") else {
        return;
    };
    let maps = grid_maps("gpu expand", 16);
    let cases = hidden_cases(maps.len(), &generate_hidden_sizes(64));
    par_gpu(&dev, &cases, |dev, &(i, h)| {
        let (p, idx, map) = &maps[i];
        let what = format!("expand {} H={h}", p.name());
        let x = par_random_bits::<bf16>(&[idx.shape()[0], h], case_seed(&what));
        check_expand(dev, &what, &x, &map.token_topk_to_pos, &map.pos_to_expert);
    });
}

#[test]
fn gpu_expand_to_fused_off_grid() {
    let Some(dev) = gpu_or_skip("gpu_expand_to_fused_off_grid") else {
        return;
    };
    par_gpu(&dev, &off_grid(), |dev, (name, idx, e)| {
        let map = cpu_map(idx, *e, 16);
        let t = idx.shape()[0];
        // Odd byte widths (1-byte accesses), 8-byte rows, fp32 rows.
        let what = format!("expand off-grid {name}");
        check_expand(
            dev,
            &format!("{what} e4m3 H=7"),
            &par_random_bits::<F8E4M3>(&[t, 7], 1),
            &map.token_topk_to_pos,
            &map.pos_to_expert,
        );
        check_expand(
            dev,
            &format!("{what} bf16 H=4"),
            &par_random_bits::<bf16>(&[t, 4], 2),
            &map.token_topk_to_pos,
            &map.pos_to_expert,
        );
        check_expand(
            dev,
            &format!("{what} fp32 H=576"),
            &par_random_bits::<f32>(&[t, 576], 3),
            &map.token_topk_to_pos,
            &map.pos_to_expert,
        );
    });
    // Untargeted rows (pos_to_expert >= 0 and < 0), T == 0 with M > 0, illegal entries (read
    // as -1), a strided x (row stride H + 8).
    let ttp = HostTensor::from_vec(vec![4, -1, 0, 9, 1, -5, i32::MAX, 2], &[4, 2]).unwrap();
    let pte = HostTensor::from_vec(vec![0, 0, 1, 1, 1, -1, 2, 2], &[8]).unwrap();
    let x = par_random_bits::<bf16>(&[4, 2048], 4);
    check_expand(&dev, "expand untargeted and illegal", &x, &ttp, &pte);
    let empty = HostTensor::<i32>::from_vec(vec![], &[0, 3]).unwrap();
    check_expand(
        &dev,
        "expand T=0 M=8",
        &par_random_bits::<bf16>(&[0, 64], 5),
        &empty,
        &pte,
    );
    let wide = par_random_bits::<bf16>(&[4, 2056], 6);
    let expected = reference::expand_to_fused(
        &wide.view().narrow(1, 0, 2048).unwrap(),
        &sanitize_indices(&ttp.view(), 8).view(),
        &pte.view(),
    )
    .unwrap();
    let dw = up(&dev, &wide);
    let (dttp, dpte) = (up(&dev, &ttp), up(&dev, &pte));
    let got = tk_moe::expand_to_fused(
        &dw.view().narrow(1, 0, 2048).unwrap(),
        &dttp.view(),
        &dpte.view(),
    )
    .unwrap();
    assert_bits_eq(
        "expand strided x",
        got.to_host().unwrap().as_slice(),
        expected.as_slice(),
    );
    // Rejections name the argument.
    let mut bad = dev.alloc::<bf16>(&[7, 2048]).unwrap();
    let e = tk_moe::expand_to_fused_into(
        &dw.view().narrow(1, 0, 2048).unwrap(),
        &dttp.view(),
        &dpte.view(),
        &mut bad.view_mut(),
    )
    .unwrap_err();
    assert_eq!(e.arg(), Some("out"), "{e:?}");
}

// ----- reduce_fused ----------------------------------------------------------------------------

/// Random reduce inputs for `idx`: the mapping with alignment 1 over a fused buffer of `T·K`
/// rows (as upstream's test), `x` normal of shape `(T·K, h)`, weights uniform, `x_sf` and `sf`
/// normal.
struct ReduceData<T> {
    x: HostTensor<T>,
    ttp: HostTensor<i32>,
    w: HostTensor<f32>,
    x_sf: HostTensor<f32>,
    sf: HostTensor<f32>,
}

/// [`ReduceData`] on the device (uploaded once for every option combination).
struct DevReduceData<T> {
    x: DeviceTensor<T>,
    ttp: DeviceTensor<i32>,
    w: DeviceTensor<f32>,
    x_sf: DeviceTensor<f32>,
    sf: DeviceTensor<f32>,
}

impl<T: ReduceElement> ReduceData<T> {
    fn upload(&self, dev: &Device) -> DevReduceData<T> {
        DevReduceData {
            x: up(dev, &self.x),
            ttp: up(dev, &self.ttp),
            w: up(dev, &self.w),
            x_sf: up(dev, &self.x_sf),
            sf: up(dev, &self.sf),
        }
    }
}

fn reduce_data<T: ReduceElement>(
    what: &str,
    idx: &HostTensor<i64>,
    e: usize,
    h: usize,
    conv: impl Fn(f32) -> T,
) -> ReduceData<T> {
    let (t, k) = (idx.shape()[0], idx.shape()[1]);
    let m = t * k;
    let map =
        reference::get_fused_mapping(&idx.view(), &GetFusedMappingParams::new(e, 1, m)).unwrap();
    let mut rng = Rng::for_case(what);
    ReduceData {
        x: rng.randn(&[m, h], conv),
        ttp: map.token_topk_to_pos,
        w: HostTensor::from_fn(&[t, k], |_| rng.uniform()),
        x_sf: rng.randn(&[m], |v| v),
        sf: rng.randn(&[1], |v| v),
    }
}

/// One reduce case on `d` (uploaded as `dd`): GPU (poisoned `_into`) against the CPU
/// reference, with or without the weights and `x_sf`, output in the input dtype or e4m3 (with
/// the global sf).
fn check_reduce<T: ReduceElement>(
    what: &str,
    d: &ReduceData<T>,
    dd: &DevReduceData<T>,
    (w, xs, e4m3): (bool, bool, bool),
) {
    let dev = dd.x.device();
    let m = d.x.shape()[0];
    let clean = sanitize_indices(&d.ttp.view(), m);
    let mut cpu = ReduceFusedInputs::new(d.x.view(), clean.view());
    let mut gpu = DeviceReduceFusedInputs::new(dd.x.view(), dd.ttp.view());
    if w {
        cpu = cpu.with_weights(d.w.view());
        gpu = gpu.with_weights(dd.w.view());
    }
    if xs {
        cpu = cpu.with_x_sf(d.x_sf.view());
        gpu = gpu.with_x_sf(dd.x_sf.view());
    }
    let shape = [d.ttp.shape()[0], d.x.shape()[1]];
    if e4m3 {
        let expected = reference::reduce_fused_e4m3(&cpu.with_sf(d.sf.view())).unwrap();
        let mut out = poisoned::<F8E4M3>(dev, &shape);
        tk_moe::reduce_fused_e4m3_into(&gpu.with_sf(dd.sf.view()), &mut out.view_mut()).unwrap();
        assert_bits_eq(what, out.to_host().unwrap().as_slice(), expected.as_slice());
    } else {
        let expected = reference::reduce_fused(&cpu).unwrap();
        let mut out = poisoned::<T>(dev, &shape);
        tk_moe::reduce_fused_into(&gpu, &mut out.view_mut()).unwrap();
        assert_bits_eq(what, out.to_host().unwrap().as_slice(), expected.as_slice());
    }
}

/// Every combination of weights × x_sf × output (input dtype or e4m3) on `d`, uploaded once.
fn reduce_all_options<T: ReduceElement>(dev: &Device, what: &str, d: &ReduceData<T>) {
    let dd = d.upload(dev);
    for w in [false, true] {
        for xs in [false, true] {
            for e4m3 in [false, true] {
                check_reduce(
                    &format!("{what} w={w} x_sf={xs} e4m3={e4m3}"),
                    d,
                    &dd,
                    (w, xs, e4m3),
                );
            }
        }
    }
}

fn reduce_spec_grid<T: ReduceElement>(dev: &Device, name: &str, conv: impl Fn(f32) -> T + Sync) {
    let configs = grid_indices("gpu reduce");
    // Per config: all options on the first 512 tokens at every hidden size of this config
    // (`Some(H)`), and the full token count (`None`: H = 256 keeps the host-side data small)
    // with weights, one option set per config.
    let sizes = generate_hidden_sizes(256);
    let mut cases: Vec<(usize, Option<usize>)> = hidden_cases(configs.len(), &sizes)
        .into_iter()
        .map(|(i, h)| (i, Some(h)))
        .collect();
    cases.extend((0..configs.len()).map(|i| (i, None)));
    par_gpu(dev, &cases, |dev, &(i, h)| {
        let (p, idx) = &configs[i];
        match h {
            Some(h) => {
                let what = format!("reduce {name} {} T=512 H={h}", p.name());
                let head = common::first_rows(idx, 512);
                let d = reduce_data(&what, &head, p.num_experts, h, &conv);
                reduce_all_options(dev, &what, &d);
            }
            None => {
                let what = format!("reduce {name} {} full H=256", p.name());
                let d = reduce_data(&what, idx, p.num_experts, 256, &conv);
                check_reduce(&what, &d, &d.upload(dev), (true, i % 2 == 1, i % 3 == 0));
            }
        }
    });
}

#[test]
fn gpu_reduce_fused_spec_grid_fp32() {
    let Some(dev) = gpu_or_skip("gpu_reduce_fused_spec_grid_fp32") else {
        return;
    };
    reduce_spec_grid::<f32>(&dev, "fp32", |v| v);
}

#[test]
fn gpu_reduce_fused_spec_grid_bf16() {
    let Some(dev) = gpu_or_skip("gpu_reduce_fused_spec_grid_bf16") else {
        return;
    };
    reduce_spec_grid::<bf16>(&dev, "bf16", bf16::from_f32);
}

#[test]
fn gpu_reduce_fused_off_grid() {
    let Some(dev) = gpu_or_skip("gpu_reduce_fused_off_grid") else {
        return;
    };
    par_gpu(&dev, &off_grid(), |dev, (name, idx, e)| {
        let head = common::first_rows(idx, 700);
        // Unaligned hidden sizes take the one-column path; f16 too.
        for h in [256, 100] {
            let what = format!("reduce off-grid {name} H={h}");
            reduce_all_options(
                dev,
                &format!("{what} fp32"),
                &reduce_data(&what, &head, *e, h, |v| v),
            );
            reduce_all_options(
                dev,
                &format!("{what} f16"),
                &reduce_data(&what, &head, *e, h, half::f16::from_f32),
            );
        }
    });
    // Every legal-slot count per token, 0 ..= K (each batch shape of the kernel; K = 40 spans
    // two slot groups), legal slots scattered over the row; a negative global sf (a token
    // without legal slots gives 0 · sf = -0.0).
    for k in [9, 40] {
        let (t, m) = (3 * (k + 1), 500);
        let mut rng = Rng::for_case(&format!("reduce legal counts K={k}"));
        // Slot j of token r is legal when (7j + r) mod K < r mod (K + 1): a permutation of the
        // slots (7 is prime to K), so exactly r mod (K + 1) legal slots.
        let ttp = HostTensor::from_fn(&[t, k], |i| {
            let (r, j) = (i / k, i % k);
            if (7 * j + r) % k < r % (k + 1) {
                rng.below(m as u64) as i32
            } else {
                -1
            }
        });
        for h in [512, 264] {
            let d = ReduceData {
                x: rng.randn(&[m, h], bf16::from_f32),
                ttp: ttp.clone(),
                w: HostTensor::from_fn(&[t, k], |_| rng.uniform()),
                x_sf: rng.randn(&[m], |v| v),
                sf: HostTensor::from_vec(vec![-0.75], &[1]).unwrap(),
            };
            reduce_all_options(&dev, &format!("reduce legal counts K={k} H={h}"), &d);
        }
    }
    // Illegal positions are skipped (read as -1), and e4m3 saturates.
    let idx = topk_idx_for(
        "gpu reduce illegal",
        &MoeParams {
            num_send_tokens: 300,
            num_topk: 6,
            num_experts: 32,
            num_ep_ranks: 8,
        },
    );
    let mut d = reduce_data("reduce illegal", &idx, 32, 512, bf16::from_f32);
    let m = d.x.shape()[0];
    d.ttp = HostTensor::from_fn(d.ttp.shape(), |i| match i % 97 {
        0 => -3,
        1 => m as i32,
        2 => i32::MAX,
        _ => d.ttp.as_slice()[i],
    });
    d.sf = HostTensor::from_vec(vec![600.0], &[1]).unwrap();
    reduce_all_options(&dev, "reduce illegal positions, saturating e4m3", &d);
}

// ----- expand_to_fused_with_sf -----------------------------------------------------------------

/// A mapping's `token_topk_to_pos` and `pos_to_expert` on the device.
struct DevMap {
    ttp: DeviceTensor<i32>,
    pte: DeviceTensor<i32>,
}

impl DevMap {
    fn new(dev: &Device, map: &FusedMapping) -> Self {
        Self {
            ttp: up(dev, &map.token_topk_to_pos),
            pte: up(dev, &map.pos_to_expert),
        }
    }
}

/// GPU expand-with-scales (poisoned outputs) against the CPU reference: data and the whole
/// scale storage (including the zeroed column-major padding). `dd` and `dmap` are `data` and
/// `map` on the device.
fn check_expand_sf<D: Element, S: tk_moe::ScaleElement>(
    what: &str,
    (data, dd): (&HostTensor<D>, &DeviceTensor<D>),
    sf: &HostTensor<S>,
    (map, dmap): (&FusedMapping, &DevMap),
    params: &ExpandToFusedWithSfParams,
) {
    let dev = dd.device();
    let m = map.num_rows();
    let clean = sanitize_indices(&map.token_topk_to_pos.view(), m);
    let expected = reference::expand_to_fused_with_sf(
        &data.view(),
        &sf.view(),
        &clean.view(),
        &map.pos_to_expert.view(),
        params,
    )
    .unwrap();
    let dsf = up(dev, sf);
    let mut out = poisoned::<D>(dev, expected.out.shape());
    let mut storage = poisoned::<S>(dev, expected.out_sf_storage.shape());
    tk_moe::expand_to_fused_with_sf_into(
        &dd.view(),
        &dsf.view(),
        &dmap.ttp.view(),
        &dmap.pte.view(),
        params,
        &mut out.view_mut(),
        &mut storage.view_mut(),
    )
    .unwrap();
    assert_bits_eq(
        &format!("{what} data"),
        out.to_host().unwrap().as_slice(),
        expected.out.as_slice(),
    );
    assert_bits_eq(
        &format!("{what} sf"),
        storage.to_host().unwrap().as_slice(),
        expected.out_sf_storage.as_slice(),
    );
    let alloc = tk_moe::expand_to_fused_with_sf(
        &dd.view(),
        &dsf.view(),
        &dmap.ttp.view(),
        &dmap.pte.view(),
        params,
    )
    .unwrap();
    assert_eq!(
        alloc.out_sf().layout(),
        &expected.out_sf_layout,
        "{what}: out_sf layout"
    );
    assert_bits_eq(
        &format!("{what} sf (allocating)"),
        alloc.out_sf_storage.to_host().unwrap().as_slice(),
        expected.out_sf_storage.as_slice(),
    );
}

/// FP8 rows of `h` values (generated and uploaded once), expanded with both of the spec's
/// scale formats for each `npc` of `npcs`: fp32 row-major, packed UE8M0 (int32) column-major.
fn expand_sf_both_formats(
    dev: &Device,
    what: &str,
    idx_rows: usize,
    map: &FusedMapping,
    h: usize,
    npcs: &[usize],
) {
    let seed = case_seed(what);
    let data = par_random_bits::<F8E4M3>(&[idx_rows, h], seed);
    let (dd, dmap) = (up(dev, &data), DevMap::new(dev, map));
    for &npc in npcs {
        let row = ExpandToFusedWithSfParams::new(npc, false);
        let mut rng = Rng::new(seed ^ npc as u64);
        let sf = HostTensor::from_fn(&[idx_rows, row.sf_columns(h, false)], |_| {
            rng.uniform() + 0.5
        });
        check_expand_sf(
            &format!("{what} npc={npc} fp32 row-major"),
            (&data, &dd),
            &sf,
            (map, &dmap),
            &row,
        );
        let col = ExpandToFusedWithSfParams::new(npc, true);
        let packed = par_random_bits::<i32>(&[idx_rows, col.sf_columns(h, true)], seed ^ 1);
        check_expand_sf(
            &format!("{what} npc={npc} packed col-major"),
            (&data, &dd),
            &packed,
            (map, &dmap),
            &col,
        );
    }
}

#[test]
fn gpu_expand_to_fused_with_sf_spec_grid() {
    let Some(dev) = gpu_or_skip("gpu_expand_to_fused_with_sf_spec_grid") else {
        return;
    };
    let maps = grid_maps("gpu expand sf", 16);
    let cases = hidden_cases(maps.len(), &generate_hidden_sizes(64));
    par_gpu(&dev, &cases, |dev, &(i, h)| {
        let (p, idx, map) = &maps[i];
        expand_sf_both_formats(
            dev,
            &format!("expand_sf {} H={h}", p.name()),
            idx.shape()[0],
            map,
            h,
            &[32, 128],
        );
    });
}

#[test]
fn gpu_expand_to_fused_with_sf_off_grid() {
    let Some(dev) = gpu_or_skip("gpu_expand_to_fused_with_sf_off_grid") else {
        return;
    };
    par_gpu(&dev, &off_grid(), |dev, (name, idx, e)| {
        // Alignment 3: M is not a multiple of 4, so the column-major storage has padding.
        let map = cpu_map(idx, *e, 3);
        let t = idx.shape()[0];
        for h in [576, 100] {
            expand_sf_both_formats(
                dev,
                &format!("expand_sf off-grid {name} H={h}"),
                t,
                &map,
                h,
                &[32],
            );
        }
        // Packed FP4 data: 2 values per byte.
        let data = par_random_bits::<tk_core::dtype::E2M1x2>(&[t, 64], 9);
        let params = ExpandToFusedWithSfParams::new(32, true);
        let sf = par_random_bits::<tk_core::dtype::Ue8m0x4>(&[t, 1], 10);
        check_expand_sf(
            &format!("expand_sf off-grid {name} fp4"),
            (&data, &up(dev, &data)),
            &sf,
            (&map, &DevMap::new(dev, &map)),
            &params,
        );
    });
    // Illegal positions are read as -1.
    let idx = topk_idx_for(
        "gpu expand sf illegal",
        &MoeParams {
            num_send_tokens: 300,
            num_topk: 8,
            num_experts: 32,
            num_ep_ranks: 8,
        },
    );
    let mut map = cpu_map(&idx, 32, 16);
    let m = map.num_rows() as i32;
    map.token_topk_to_pos = HostTensor::from_fn(map.token_topk_to_pos.shape(), |i| match i % 89 {
        0 => -2,
        1 => m,
        _ => map.token_topk_to_pos.as_slice()[i],
    });
    expand_sf_both_formats(
        &dev,
        "expand_sf illegal positions",
        idx.shape()[0],
        &map,
        2048,
        &[128],
    );
}

// ----- get_fused_mapping -----------------------------------------------------------------------

/// GPU mapping of `idx` (graph-safe capacity `m + 37` on poisoned outputs, with one and with two
/// launches, and host sync) against the
/// CPU reference (on the sanitized indices), bit for bit, plus the spec's invariants and our
/// documented order.
fn check_mapping_gpu(dev: &Device, what: &str, idx: &HostTensor<i64>, e: usize, a: usize) {
    let (t, k) = (idx.shape()[0], idx.shape()[1]);
    let clean = sanitize_indices(&idx.view(), e);
    let expected = cpu_map(&clean, e, a);
    let m = expected.num_rows();
    let di = up(dev, idx);
    // Host sync (opt-in).
    let got = tk_moe::get_fused_mapping(&di.view(), &GetFusedMappingParams::host_sync(e, a))
        .unwrap()
        .to_host()
        .unwrap();
    check_mapping(what, &clean.view(), e, a, m, &got);
    assert_eq!(got, expected, "{what}: host sync");
    // Graph-safe, with spare capacity, into poisoned outputs: the one cooperative launch
    // (E <= 256) and the two launches.
    let cap = m + 37;
    let want = reference::get_fused_mapping(&clean.view(), &GetFusedMappingParams::new(e, a, cap))
        .unwrap();
    for launch in [tk_moe::FusedLaunch::Auto, tk_moe::FusedLaunch::TwoLaunches] {
        let mut out = tk_moe::DeviceFusedMapping::alloc(dev, t, k, e, cap).unwrap();
        for x in [
            &mut out.pos_to_expert,
            &mut out.pos_to_token,
            &mut out.pos_to_token_topk,
            &mut out.token_topk_to_pos,
            &mut out.expert_start,
            &mut out.expert_end,
            &mut out.num_tokens_per_expert,
        ] {
            poison(x).unwrap();
        }
        tk_moe::get_fused_mapping_into_with(
            &di.view(),
            &GetFusedMappingParams::new(e, a, cap),
            &mut out,
            launch,
        )
        .unwrap();
        let got = out.to_host().unwrap();
        check_mapping(
            &format!("{what} capacity {launch:?}"),
            &clean.view(),
            e,
            a,
            cap,
            &got,
        );
        assert_eq!(got, want, "{what}: capacity {cap} {launch:?}");
    }
}

#[test]
fn gpu_get_fused_mapping_spec_grid() {
    let Some(dev) = gpu_or_skip("gpu_get_fused_mapping_spec_grid") else {
        return;
    };
    let configs = grid_indices("gpu mapping");
    let cases: Vec<(usize, usize)> = (0..configs.len())
        .flat_map(|i| [(i, 64), (i, 128)])
        .collect();
    par_gpu(&dev, &cases, |dev, &(i, a)| {
        let (p, idx) = &configs[i];
        check_mapping_gpu(
            dev,
            &format!("mapping {} a={a}", p.name()),
            idx,
            p.num_experts,
            a,
        );
    });
}

#[test]
fn gpu_get_fused_mapping_off_grid() {
    let Some(dev) = gpu_or_skip("gpu_get_fused_mapping_off_grid") else {
        return;
    };
    par_gpu(&dev, &off_grid(), |dev, (name, idx, e)| {
        for a in [1, 16, 128] {
            check_mapping_gpu(dev, &format!("mapping off-grid {name} a={a}"), idx, *e, a);
        }
        let bad = with_illegal(idx, *e, name);
        check_mapping_gpu(
            dev,
            &format!("mapping off-grid {name} illegal"),
            &bad,
            *e,
            16,
        );
    });
    // The largest E, a strided topk_idx (row stride K + 3).
    let p = MoeParams {
        num_send_tokens: 500,
        num_topk: 9,
        num_experts: 1024,
        num_ep_ranks: 1,
    };
    check_mapping_gpu(
        &dev,
        "mapping E=1024",
        &topk_idx_for("gpu mapping", &p),
        1024,
        128,
    );
    // Chunks longer than one register round of the scatter (a warp's eighth of a chunk over
    // 256 entries: T·K above ~270k on 132 SMs): 40000 x 8 random ids in -1..32.
    let mut rng = Rng::for_case("gpu mapping long chunks");
    let long = HostTensor::from_fn(&[40_000, 8], |_| rng.below(33) as i64 - 1);
    check_mapping_gpu(&dev, "mapping 40000 x 8", &long, 32, 128);
    let idx = topk_idx_for(
        "gpu mapping strided",
        &MoeParams {
            num_send_tokens: 900,
            num_topk: 6,
            num_experts: 9,
            num_ep_ranks: 8,
        },
    );
    let (buf, layout) = common::padded_rows(&idx, 3, 5);
    let dbuf = up(
        &dev,
        &HostTensor::from_vec(buf.clone(), &[buf.len()]).unwrap(),
    );
    let view = dbuf.view().with_layout(layout).unwrap();
    let got = tk_moe::get_fused_mapping(&view, &GetFusedMappingParams::host_sync(9, 16))
        .unwrap()
        .to_host()
        .unwrap();
    assert_eq!(got, cpu_map(&idx, 9, 16), "mapping strided topk_idx");
    // Capacity too small: no out-of-bounds write; dropped slots read -1, the per-expert outputs
    // keep the full layout.
    let full = cpu_map(&idx, 9, 16);
    let cap = full.num_rows() / 2;
    let di = up(&dev, &idx);
    let got = tk_moe::get_fused_mapping(&di.view(), &GetFusedMappingParams::new(9, 16, cap))
        .unwrap()
        .to_host()
        .unwrap();
    assert_eq!(
        got.expert_end, full.expert_end,
        "capacity too small: layout"
    );
    for (i, &p) in full.token_topk_to_pos.as_slice().iter().enumerate() {
        let want = if (p as usize) < cap { p } else { -1 };
        assert_eq!(
            got.token_topk_to_pos.as_slice()[i],
            want,
            "capacity too small: slot {i}"
        );
    }
    assert_eq!(
        got.pos_to_token_topk.as_slice(),
        &full.pos_to_token_topk.as_slice()[..cap]
    );
}

// ----- the small ops ---------------------------------------------------------------------------

/// Every index tensor of the small-op tests: the moe12 grid (full size), the off-grid ones,
/// and an illegal-entry variant of each off-grid one, as `(name, idx, E)`.
fn index_cases() -> Vec<(String, HostTensor<i64>, usize)> {
    let mut v: Vec<_> = par_map(&grid(), |p| {
        (p.name(), topk_idx_for("gpu small ops", p), p.num_experts)
    });
    for (name, idx, e) in off_grid() {
        let bad = with_illegal(&idx, e, &name);
        v.push((name.clone(), idx, e));
        v.push((format!("{name} illegal"), bad, e));
    }
    v
}

/// `normalize_weight` of fresh uniform weights `(t, k)` (seeded by `name`), stored with `pad`
/// NaN elements after each row (row stride `k + pad`), into poisoned outputs, bit-exact against
/// the CPU reference.
fn check_normalize_weight(dev: &Device, name: &str, t: usize, k: usize, pad: usize) {
    let mut rng = Rng::for_case(name);
    let w = HostTensor::from_fn(&[t, k], |_| rng.uniform());
    let expected = reference::normalize_weight(&w.view()).unwrap();
    let (buf, layout) = common::padded_rows(&w, pad, f32::NAN);
    let dbuf = up(
        dev,
        &HostTensor::from_vec(buf.clone(), &[buf.len()]).unwrap(),
    );
    let view = dbuf.view().with_layout(layout).unwrap();
    let (mut den, mut out) = (poisoned::<f32>(dev, &[t]), poisoned::<f32>(dev, &[t, k]));
    tk_moe::normalize_weight_into(&view, &mut den.view_mut(), &mut out.view_mut()).unwrap();
    assert_bits_eq(
        &format!("{name} den"),
        den.to_host().unwrap().as_slice(),
        expected.denominator.as_slice(),
    );
    assert_bits_eq(
        &format!("{name} w"),
        out.to_host().unwrap().as_slice(),
        expected.normalized_weights.as_slice(),
    );
}

#[test]
fn gpu_normalize_weight_grid() {
    let Some(dev) = gpu_or_skip("gpu_normalize_weight_grid") else {
        return;
    };
    par_gpu(&dev, &index_cases(), |dev, (name, idx, _)| {
        let (t, k) = (idx.shape()[0], idx.shape()[1]);
        check_normalize_weight(dev, &format!("normalize {name}"), t, k, 0);
    });
}

/// `normalize_weight` off the grid: both access paths (16-byte vectors on aligned rows, scalar
/// otherwise): K = 16 and 8 aligned (four and two vectors per row), K = 8 and 4 with padded
/// rows (row stride K + 1: scalar accesses), token counts that end inside a warp; fresh
/// weights, poisoned outputs, bit-exact.
#[test]
fn gpu_normalize_weight_off_grid() {
    let Some(dev) = gpu_or_skip("gpu_normalize_weight_off_grid") else {
        return;
    };
    for (t, k, pad) in [(1001, 16, 0), (37, 8, 0), (999, 8, 1), (513, 4, 1)] {
        check_normalize_weight(&dev, &format!("normalize T={t} K={k} pad={pad}"), t, k, pad);
    }
}

#[test]
fn gpu_group_count_and_aux_fi_grid() {
    let Some(dev) = gpu_or_skip("gpu_group_count_and_aux_fi_grid") else {
        return;
    };
    par_gpu(&dev, &index_cases(), |dev, (name, idx, e)| {
        let e = *e;
        let clean = sanitize_indices(&idx.view(), e);
        let di = up(dev, idx);
        let params = tk_moe::GroupCountParams::new(e);
        let expected = reference::group_count(&clean.view(), &params).unwrap();
        let mut out = poisoned::<i32>(dev, &[e]);
        tk_moe::group_count_into(&di.view(), &params, &mut out.view_mut()).unwrap();
        assert_bits_eq(
            &format!("group_count {name}"),
            out.to_host().unwrap().as_slice(),
            expected.as_slice(),
        );
        for naux in [1, idx.shape()[1].max(1)] {
            let params = tk_moe::AuxFiParams::new(e, naux);
            let expected = reference::aux_fi(&clean.view(), &params).unwrap();
            let mut out = poisoned::<f32>(dev, &[e]);
            tk_moe::aux_fi_into(&di.view(), &params, &mut out.view_mut()).unwrap();
            assert_bits_eq(
                &format!("aux_fi {name} naux={naux}"),
                out.to_host().unwrap().as_slice(),
                expected.as_slice(),
            );
        }
    });
    // Index tensors read one entry at a time: padded rows (row stride K + 3) and contiguous
    // rows starting off a 16-byte boundary (K = 9, from the second row of a buffer).
    let p = MoeParams {
        num_send_tokens: 700,
        num_topk: 9,
        num_experts: 32,
        num_ep_ranks: 8,
    };
    let idx = topk_idx_for("gpu count strided", &p);
    let (t, k) = (idx.shape()[0], idx.shape()[1]);
    let (buf, layout) = common::padded_rows(&idx, 3, 5);
    let padded = up(
        &dev,
        &HostTensor::from_vec(buf.clone(), &[buf.len()]).unwrap(),
    );
    let mut shifted = vec![7i64; k];
    shifted.extend_from_slice(idx.as_slice());
    let shifted = up(&dev, &HostTensor::from_vec(shifted, &[t + 1, k]).unwrap());
    for (what, view) in [
        ("padded rows", padded.view().with_layout(layout).unwrap()),
        ("unaligned start", shifted.view().narrow(0, 1, t).unwrap()),
    ] {
        let params = tk_moe::GroupCountParams::new(32);
        assert_bits_eq(
            &format!("group_count {what}"),
            tk_moe::group_count(&view, &params)
                .unwrap()
                .to_host()
                .unwrap()
                .as_slice(),
            reference::group_count(&idx.view(), &params)
                .unwrap()
                .as_slice(),
        );
        let params = tk_moe::AuxFiParams::new(32, 9);
        assert_bits_eq(
            &format!("aux_fi {what}"),
            tk_moe::aux_fi(&view, &params)
                .unwrap()
                .to_host()
                .unwrap()
                .as_slice(),
            reference::aux_fi(&idx.view(), &params).unwrap().as_slice(),
        );
    }
    // The bin counts around the per-bin arrival finish's limit (moe.cuh ARRIVAL_BINS = 256:
    // every thread of every CTA finishes one bin; 257: the last-CTA ticket), ids uniform over
    // the bins and -1, with illegal entries, several CTAs.
    for e in [256usize, 257] {
        let mut rng = Rng::for_case(&format!("gpu count arrival limit {e}"));
        let idx = HostTensor::from_fn(&[5000, 8], |_| rng.below(e as u64 + 1) as i64 - 1);
        let idx = with_illegal(&idx, e, &format!("arrival limit {e}"));
        let clean = sanitize_indices(&idx.view(), e);
        let di = up(&dev, &idx);
        let params = tk_moe::GroupCountParams::new(e);
        let mut out = poisoned::<i32>(&dev, &[e]);
        tk_moe::group_count_into(&di.view(), &params, &mut out.view_mut()).unwrap();
        assert_bits_eq(
            &format!("group_count {e} bins"),
            out.to_host().unwrap().as_slice(),
            reference::group_count(&clean.view(), &params)
                .unwrap()
                .as_slice(),
        );
        let params = tk_moe::AuxFiParams::new(e, 8);
        let mut out = poisoned::<f32>(&dev, &[e]);
        tk_moe::aux_fi_into(&di.view(), &params, &mut out.view_mut()).unwrap();
        assert_bits_eq(
            &format!("aux_fi {e} experts"),
            out.to_host().unwrap().as_slice(),
            reference::aux_fi(&clean.view(), &params)
                .unwrap()
                .as_slice(),
        );
    }
    // More bins than one shared-memory window holds (the CTAs split the bins in windows).
    let idx = topk_idx_for(
        "gpu count big",
        &MoeParams {
            num_send_tokens: 300,
            num_topk: 8,
            num_experts: 10_000,
            num_ep_ranks: 1,
        },
    );
    let di = up(&dev, &idx);
    let gc = tk_moe::group_count(&di.view(), &tk_moe::GroupCountParams::new(10_000)).unwrap();
    assert_bits_eq(
        "group_count 10000 bins",
        gc.to_host().unwrap().as_slice(),
        reference::group_count(&idx.view(), &tk_moe::GroupCountParams::new(10_000))
            .unwrap()
            .as_slice(),
    );
    let params = tk_moe::AuxFiParams::new(10_000, 8);
    let f = tk_moe::aux_fi(&di.view(), &params).unwrap();
    assert_bits_eq(
        "aux_fi 10000 experts",
        f.to_host().unwrap().as_slice(),
        reference::aux_fi(&idx.view(), &params).unwrap().as_slice(),
    );
}

#[test]
fn gpu_inplace_unique_group_indices_grid() {
    let Some(dev) = gpu_or_skip("gpu_inplace_unique_group_indices_grid") else {
        return;
    };
    par_gpu(&dev, &grid_indices("gpu unique"), |dev, (p, idx)| {
        for g in [8, 16, 72] {
            let global = p.global_experts();
            if global % g != 0 {
                continue;
            }
            // The spec's data: local ids floor-divided by the group size (-1 stays -1), plus a
            // few illegal entries.
            let per = global / g;
            let groups = HostTensor::from_fn(idx.shape(), |i| {
                idx.as_slice()[i].div_euclid(per as i64).max(-1)
            });
            for (what, x) in [
                ("", groups.clone()),
                (" illegal", with_illegal(&groups, g, "unique")),
            ] {
                let mut expected = sanitize_indices(&x.view(), g);
                let params = tk_moe::InplaceUniqueGroupIndicesParams::new(g);
                reference::inplace_unique_group_indices(&mut expected, &params).unwrap();
                let mut d = up(dev, &x);
                tk_moe::inplace_unique_group_indices(&mut d.view_mut(), &params).unwrap();
                assert_bits_eq(
                    &format!("unique {} G={g}{what}", p.name()),
                    d.to_host().unwrap().as_slice(),
                    expected.as_slice(),
                );
            }
        }
    });
    // Dense repeats and G = 128.
    let mut rng = Rng::for_case("unique dense");
    let x = HostTensor::from_fn(&[4000, 9], |_| rng.below(129) as i64 - 1);
    let params = tk_moe::InplaceUniqueGroupIndicesParams::new(128);
    let mut expected = x.clone();
    reference::inplace_unique_group_indices(&mut expected, &params).unwrap();
    let mut d = up(&dev, &x);
    tk_moe::inplace_unique_group_indices(&mut d.view_mut(), &params).unwrap();
    assert_bits_eq(
        "unique dense G=128",
        d.to_host().unwrap().as_slice(),
        expected.as_slice(),
    );
}

#[test]
fn gpu_mask_indices_by_tp_grid() {
    let Some(dev) = gpu_or_skip("gpu_mask_indices_by_tp_grid") else {
        return;
    };
    par_gpu(&dev, &grid_indices("gpu mask"), |dev, (p, idx)| {
        // Ids over all the global experts, so that every rank keeps some.
        let mut rng = Rng::for_case(&format!("gpu mask {}", p.name()));
        let n = p.global_experts();
        let spread = HostTensor::from_fn(idx.shape(), |i| {
            if idx.as_slice()[i] < 0 {
                -1
            } else {
                rng.below(n as u64) as i64
            }
        });
        for tp in [2, 4, 8] {
            if p.num_ep_ranks % tp != 0 {
                continue;
            }
            // The first and last rank (every rank under TK_FULL_TEST).
            let ranks: Vec<usize> = if full_test() {
                (0..tp).collect()
            } else {
                vec![0, tp - 1]
            };
            for rank in ranks {
                let params = tk_moe::MaskIndicesByTpParams {
                    num_experts: n,
                    num_ep_ranks: p.num_ep_ranks,
                    tp_rank: rank,
                    num_tp_ranks: tp,
                };
                for (what, x) in [
                    ("", spread.clone()),
                    (" illegal", with_illegal(&spread, n, "mask")),
                ] {
                    let expected = reference::mask_indices_by_tp(
                        &sanitize_indices(&x.view(), n).view(),
                        &params,
                    )
                    .unwrap();
                    let dx = up(dev, &x);
                    let mut out = poisoned::<i64>(dev, x.shape());
                    tk_moe::mask_indices_by_tp_into(&dx.view(), &params, &mut out.view_mut())
                        .unwrap();
                    assert_bits_eq(
                        &format!("mask {} tp={tp} rank={rank}{what}", p.name()),
                        out.to_host().unwrap().as_slice(),
                        expected.as_slice(),
                    );
                    // int32 indices give the same values.
                    let x32 = HostTensor::from_fn(x.shape(), |i| {
                        x.as_slice()[i].clamp(i32::MIN as i64, i32::MAX as i64) as i32
                    });
                    let got = tk_moe::mask_indices_by_tp(&up(dev, &x32).view(), &params)
                        .unwrap()
                        .to_host()
                        .unwrap();
                    let want: Vec<i32> = expected.as_slice().iter().map(|&v| v as i32).collect();
                    assert_bits_eq(
                        &format!("mask i32 {} tp={tp} rank={rank}{what}", p.name()),
                        got.as_slice(),
                        &want,
                    );
                }
            }
        }
    });
}

// ----- determinism -----------------------------------------------------------------------------

/// `reduce_fused` and `aux_fi` give the same bits over 100 runs (large moe12 inputs).
#[test]
fn gpu_reduce_fused_and_aux_fi_are_deterministic() {
    let Some(dev) = gpu_or_skip("gpu_reduce_fused_and_aux_fi_are_deterministic") else {
        return;
    };
    let p = MoeParams {
        num_send_tokens: 4001,
        num_topk: 8,
        num_experts: 32,
        num_ep_ranks: 8,
    };
    let idx = topk_idx_for("gpu determinism", &p);
    let d = reduce_data("determinism", &idx, 32, 512, bf16::from_f32);
    let (dx, dttp, dw, dxsf) = (
        up(&dev, &d.x),
        up(&dev, &d.ttp),
        up(&dev, &d.w),
        up(&dev, &d.x_sf),
    );
    let inputs = DeviceReduceFusedInputs::new(dx.view(), dttp.view())
        .with_weights(dw.view())
        .with_x_sf(dxsf.view());
    let first = tk_moe::reduce_fused(&inputs).unwrap().to_host().unwrap();
    let di = up(&dev, &idx);
    let params = tk_moe::AuxFiParams::new(32, 8);
    let first_f = tk_moe::aux_fi(&di.view(), &params)
        .unwrap()
        .to_host()
        .unwrap();
    let mut out = dev.alloc::<bf16>(first.shape()).unwrap();
    let mut f = dev.alloc::<f32>(&[32]).unwrap();
    for run in 0..100 {
        poison(&mut out).unwrap();
        poison(&mut f).unwrap();
        tk_moe::reduce_fused_into(&inputs, &mut out.view_mut()).unwrap();
        tk_moe::aux_fi_into(&di.view(), &params, &mut f.view_mut()).unwrap();
        assert_bits_eq(
            &format!("reduce_fused run {run}"),
            out.to_host().unwrap().as_slice(),
            first.as_slice(),
        );
        assert_bits_eq(
            &format!("aux_fi run {run}"),
            f.to_host().unwrap().as_slice(),
            first_f.as_slice(),
        );
    }
}

/// `aux_fi`, `group_count` and `get_fused_mapping` finish in their last CTA with counters in
/// one zeroed workspace per stream, which each launch must leave zero: interleaved on one fresh
/// stream, with the workspace grown in between (10000 bins) and both finishes (per-bin arrival
/// up to 256 bins, the last-CTA ticket above) in turn, every result stays bit-exact.
#[test]
fn gpu_counting_ops_share_the_stream_workspace() {
    let Some(dev) = gpu_or_skip("gpu_counting_ops_share_the_stream_workspace") else {
        return;
    };
    let dev = dev.with_new_stream().unwrap();
    let p = MoeParams {
        num_send_tokens: 700,
        num_topk: 8,
        num_experts: 32,
        num_ep_ranks: 8,
    };
    let idx = topk_idx_for("gpu workspace", &p);
    let di = up(&dev, &idx);
    for (round, e) in [32usize, 10_000, 32, 256, 257, 32].into_iter().enumerate() {
        let clean = sanitize_indices(&idx.view(), e);
        let params = tk_moe::GroupCountParams::new(e);
        assert_bits_eq(
            &format!("group_count round {round} ({e} bins)"),
            tk_moe::group_count(&di.view(), &params)
                .unwrap()
                .to_host()
                .unwrap()
                .as_slice(),
            reference::group_count(&clean.view(), &params)
                .unwrap()
                .as_slice(),
        );
        check_mapping_gpu(&dev, &format!("workspace round {round}"), &idx, 32, 128);
        let params = tk_moe::AuxFiParams::new(e, 8);
        assert_bits_eq(
            &format!("aux_fi round {round} ({e} experts)"),
            tk_moe::aux_fi(&di.view(), &params)
                .unwrap()
                .to_host()
                .unwrap()
                .as_slice(),
            reference::aux_fi(&clean.view(), &params)
                .unwrap()
                .as_slice(),
        );
    }
}
