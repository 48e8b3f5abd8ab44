//! GPU tests of the gating ops against the CPU references (`spec/moe.md` §4.3–§4.5), on fresh
//! random inputs with the outputs poisoned before each launch:
//!
//! * `topk_gate`, `topk_sum_and_topk_group_idx`: bit-exact, on rows mixing normal values,
//!   planted ties (values from a tiny set), `-inf`, `+inf` and NaN.
//! * `top2_sum_gate`: indices and `unmapped_topk_idx` bit-exact, weights within the spec's
//!   tolerance (`allclose`, `rtol = 1e-5`, `atol = 1e-8`; the largest ulp distance is printed —
//!   the kernel's double-precision `exp`/`log1p` make it 0 in practice), on the spec's
//!   gap-respecting inputs (`tk_gating::testing::gated_inputs`), plus planted ties and the spec's
//!   stability check (exact ties, where both sides compute identical scores).
//!
//! Grids: the spec's (§4.3, §4.4, §4.5 with every option loop; `T ∈ {4001, 8001}`, plus 0 under
//! `TK_FULL_TEST`), off-grid shapes (160 and 384 experts, top-k 4 and 7, 1 / 3 / 37 / 100 000
//! tokens, long rows, strided and unaligned rows, every lifted upstream limit), the replica
//! choice beyond upstream's int32 overflow (100 000 tokens), DeepSeek-V3 and V4 at 1, 16, 64,
//! 256 and 8001 tokens.

use tk_core::testing::{assert_bits_eq, generate_num_tokens, gpu_or_skip, poison, Rng};
use tk_core::{Device, DeviceTensor, Element, HostTensor, HostView, Layout, TkError};
use tk_gating::reference::{self, Top2SumGateInputs, Top2SumGateOutput};
use tk_gating::scoring::ScoringFunc::{self, Sigmoid, Softmax, SqrtSoftplus};
use tk_gating::testing::{allclose, gated_inputs, ulp_distance};
use tk_gating::{
    Top2SumGateDeviceInputs, Top2SumGateParams, TopkGateParams, TopkSumAndTopkGroupIdxParams,
};

const SCORINGS: [ScoringFunc; 3] = [Sigmoid, SqrtSoftplus, Softmax];

/// A host buffer and the (possibly strided, offset) layout of the tensor inside it.
struct Strided<T> {
    buf: HostTensor<T>,
    layout: Layout,
}

impl<T: Element> Strided<T> {
    fn contiguous(buf: HostTensor<T>) -> Self {
        let layout = Layout::contiguous(buf.shape());
        Self { buf, layout }
    }

    /// `rows x cols` stored at column `start` of a buffer `cols + pad` wide.
    fn padded(
        rows: usize,
        cols: usize,
        pad: usize,
        start: usize,
        f: impl FnMut(usize) -> T,
    ) -> Self {
        let buf = HostTensor::from_fn(&[rows, cols + pad], f);
        let layout = Layout::new(vec![rows, cols], vec![cols + pad, 1], start).unwrap();
        Self { buf, layout }
    }

    fn view(&self) -> HostView<'_, T> {
        self.buf.view().with_layout(self.layout.clone()).unwrap()
    }

    fn upload(&self, dev: &Device) -> DeviceTensor<T> {
        dev.upload(&self.buf).unwrap()
    }
}

/// A score for `topk_gate` / group tests: row kind `row % 4` = normal, planted ties (a tiny value
/// set), normal with `-inf`s, or a mix of NaN / `±inf` / ties.
fn mixed_value(rng: &mut Rng, row: usize) -> f32 {
    match row % 4 {
        0 => rng.normal(),
        1 => rng.below(4) as f32 * 0.5,
        2 => {
            if rng.below(3) == 0 {
                f32::NEG_INFINITY
            } else {
                rng.normal()
            }
        }
        _ => match rng.below(10) {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            _ => rng.below(3) as f32 - 1.0,
        },
    }
}

/// A `(rows, cols)` matrix of [`mixed_value`]s in a buffer `pad` columns wider, from column `start`.
fn mixed_matrix(case: &str, rows: usize, cols: usize, pad: usize, start: usize) -> Strided<f32> {
    let mut rng = Rng::for_case(case);
    let mut data = Vec::with_capacity(rows * (cols + pad));
    for r in 0..rows {
        for _ in 0..cols + pad {
            data.push(mixed_value(&mut rng, r));
        }
    }
    let buf = HostTensor::from_vec(data, &[rows, cols + pad]).unwrap();
    let layout = Layout::new(vec![rows, cols], vec![cols + pad, 1], start).unwrap();
    Strided { buf, layout }
}

// ----- topk_gate ----------------------------------------------------------------------------

fn check_topk_gate(dev: &Device, case: &str, x: &Strided<f32>, k: usize) {
    let params = TopkGateParams::new(k);
    let expected = reference::topk_gate(&x.view(), &params).unwrap();
    let d = x.upload(dev);
    let dv = d.view().with_layout(x.layout.clone()).unwrap();
    let mut out = dev.alloc::<i64>(expected.shape()).unwrap();
    poison(&mut out).unwrap();
    tk_gating::topk_gate_into(&dv, &params, &mut out.view_mut()).unwrap();
    assert_bits_eq(case, out.to_host().unwrap().as_slice(), expected.as_slice());
    if expected.as_slice().len() < 1 << 20 {
        let alloc = tk_gating::topk_gate(&dv, &params).unwrap();
        assert_bits_eq(
            case,
            alloc.to_host().unwrap().as_slice(),
            expected.as_slice(),
        );
    }
}

#[test]
fn gpu_topk_gate_spec_grid() {
    let Some(dev) = gpu_or_skip("gpu_topk_gate_spec_grid") else {
        return;
    };
    for t in generate_num_tokens(1, false) {
        for (e, k) in tk_gating::topk_gate::SPEC_CONFIGS {
            let case = format!("topk_gate T={t} E={e} K={k}");
            check_topk_gate(&dev, &case, &mixed_matrix(&case, t, e, 0, 0), k);
        }
    }
}

#[test]
fn gpu_topk_gate_off_grid() {
    let Some(dev) = gpu_or_skip("gpu_topk_gate_off_grid") else {
        return;
    };
    // (T, E, k, row padding, first column): 160 / 384 experts, k 4 / 7, 1 / 3 / 37 tokens;
    // k = E; one expert; k > 32; long (streamed) rows; strided and unaligned rows.
    let cases = [
        (1, 160, 4, 0, 0),
        (3, 160, 7, 0, 0),
        (37, 160, 4, 0, 0),
        (1, 384, 7, 0, 0),
        (3, 384, 4, 0, 0),
        (37, 384, 7, 0, 0),
        (100_000, 160, 4, 0, 0),
        (37, 384, 40, 0, 0),
        (37, 7, 7, 0, 0),
        (37, 1, 1, 0, 0),
        (37, 33, 1, 0, 0),
        (37, 37, 5, 0, 0),
        (5, 1000, 64, 0, 0),
        (37, 3000, 9, 0, 0),
        (37, 1024, 32, 0, 0),
        (37, 1025, 33, 0, 0),
        (37, 256, 8, 3, 1),
        (37, 160, 7, 4, 1),
        (37, 128, 6, 4, 4),
    ];
    for (t, e, k, pad, start) in cases {
        let case = format!("topk_gate off-grid T={t} E={e} K={k} pad={pad} start={start}");
        check_topk_gate(&dev, &case, &mixed_matrix(&case, t, e, pad, start), k);
    }
    // T = 0: nothing launched, empty output.
    let empty = dev.alloc::<f32>(&[0, 16]).unwrap();
    let out = tk_gating::topk_gate(&empty.view(), &TopkGateParams::new(3)).unwrap();
    assert_eq!(out.shape(), &[0, 3]);
}

#[test]
fn gpu_topk_gate_rejects_bad_input() {
    let Some(dev) = gpu_or_skip("gpu_topk_gate_rejects_bad_input") else {
        return;
    };
    let x = dev
        .upload(&HostTensor::<f32>::from_fn(&[4, 8], |i| i as f32))
        .unwrap();
    let e = tk_gating::topk_gate(&x.view(), &TopkGateParams::new(9)).unwrap_err();
    assert!(
        matches!(
            e,
            TkError::Param {
                arg: "num_topk",
                ..
            }
        ),
        "{e:?}"
    );
    let mut wrong = dev.alloc::<i64>(&[4, 3]).unwrap();
    let e = tk_gating::topk_gate_into(&x.view(), &TopkGateParams::new(2), &mut wrong.view_mut())
        .unwrap_err();
    assert!(matches!(e, TkError::Shape { arg: "out", .. }), "{e:?}");
    let mut wide = dev.alloc::<i64>(&[4, 4]).unwrap();
    let mut strided = wide.view_mut().narrow(1, 0, 2).unwrap();
    let e =
        tk_gating::topk_gate_into(&x.view(), &TopkGateParams::new(2), &mut strided).unwrap_err();
    assert!(matches!(e, TkError::Stride { arg: "out", .. }), "{e:?}");
    let cols = x
        .view()
        .with_layout(Layout::new(vec![8, 4], vec![1, 8], 0).unwrap())
        .unwrap();
    let e = tk_gating::topk_gate(&cols, &TopkGateParams::new(2)).unwrap_err();
    assert!(matches!(e, TkError::Stride { arg: "scores", .. }), "{e:?}");
}

// ----- topk_sum_and_topk_group_idx ---------------------------------------------------------------

fn check_group_idx(dev: &Device, case: &str, x: &Strided<f32>, n: usize, gk: usize) {
    let params = TopkSumAndTopkGroupIdxParams::new(n, gk);
    let expected = reference::topk_sum_and_topk_group_idx(&x.view(), &params).unwrap();
    let d = x.upload(dev);
    let dv = d.view().with_layout(x.layout.clone()).unwrap();
    let mut out = dev.alloc::<i64>(expected.shape()).unwrap();
    poison(&mut out).unwrap();
    tk_gating::topk_sum_and_topk_group_idx_into(&dv, &params, &mut out.view_mut()).unwrap();
    assert_bits_eq(case, out.to_host().unwrap().as_slice(), expected.as_slice());
    let alloc = tk_gating::topk_sum_and_topk_group_idx(&dv, &params).unwrap();
    assert_bits_eq(
        case,
        alloc.to_host().unwrap().as_slice(),
        expected.as_slice(),
    );
}

/// `(T, G, P)` scores from [`mixed_matrix`] (each token one row of `G·P`), groups `gpad` apart
/// beyond `P` when `gpad > 0`.
fn group_scores(case: &str, t: usize, g: usize, p: usize, gpad: usize) -> Strided<f32> {
    let m = mixed_matrix(case, t, g * (p + gpad), 0, 0);
    let layout = Layout::new(vec![t, g, p], vec![g * (p + gpad), p + gpad, 1], 0).unwrap();
    Strided { buf: m.buf, layout }
}

#[test]
fn gpu_topk_sum_and_topk_group_idx_spec_grid() {
    let Some(dev) = gpu_or_skip("gpu_topk_sum_and_topk_group_idx_spec_grid") else {
        return;
    };
    for t in generate_num_tokens(1, false) {
        for e in [72, 256] {
            for g in [4, 8, 12, 16] {
                if e % g != 0 {
                    continue;
                }
                for n in [1, 2] {
                    for gk in [2, 4] {
                        let case = format!("topk_group T={t} E={e} G={g} n={n} Gk={gk}");
                        check_group_idx(&dev, &case, &group_scores(&case, t, g, e / g, 0), n, gk);
                    }
                }
            }
        }
    }
}

#[test]
fn gpu_topk_sum_and_topk_group_idx_off_grid() {
    let Some(dev) = gpu_or_skip("gpu_topk_sum_and_topk_group_idx_off_grid") else {
        return;
    };
    // (T, G, P, n, Gk, group padding): 1 / 3 / 37 tokens, 160 / 384 experts, G > 32, P > 32,
    // P = 1, Gk = G, strided groups, rows too long for shared memory, 100 000 tokens.
    let cases = [
        (1, 8, 20, 2, 4, 0),
        (3, 16, 10, 1, 7, 0),
        (37, 12, 32, 2, 4, 0),
        (37, 64, 6, 2, 7, 0),
        (37, 40, 64, 2, 5, 0),
        (37, 5, 1, 1, 5, 0),
        (37, 3, 5, 2, 3, 2),
        (37, 33, 3, 1, 33, 1),
        (37, 1, 9, 2, 1, 0),
        (37, 1024, 2, 2, 40, 0),
        (100_000, 8, 32, 2, 4, 0),
    ];
    for (t, g, p, n, gk, gpad) in cases {
        let case = format!("topk_group off-grid T={t} G={g} P={p} n={n} Gk={gk} gpad={gpad}");
        check_group_idx(&dev, &case, &group_scores(&case, t, g, p, gpad), n, gk);
    }
    let x = dev.alloc::<f32>(&[2, 1025, 2]).unwrap();
    let e =
        tk_gating::topk_sum_and_topk_group_idx(&x.view(), &TopkSumAndTopkGroupIdxParams::new(2, 4))
            .unwrap_err();
    assert!(matches!(e, TkError::Param { arg: "scores", .. }), "{e:?}");
    let empty = dev.alloc::<f32>(&[0, 4, 8]).unwrap();
    let out = tk_gating::topk_sum_and_topk_group_idx(
        &empty.view(),
        &TopkSumAndTopkGroupIdxParams::new(2, 2),
    )
    .unwrap();
    assert_eq!(out.shape(), &[0, 2]);
}

// ----- top2_sum_gate ------------------------------------------------------------------------

/// Everything one `top2_sum_gate` call takes, on the host.
struct GateCase {
    params: Top2SumGateParams,
    logits: Strided<f32>,
    bias: HostTensor<f32>,
    mask: Option<HostTensor<u8>>,
    fix: Option<HostTensor<u8>>,
    map: Option<(HostTensor<i32>, HostTensor<i32>)>,
    unmapped: Option<Strided<i64>>,
}

/// The CPU reference on rows `rows` of `c`.
fn reference_rows(c: &GateCase, rows: std::ops::Range<usize>) -> Top2SumGateOutput {
    let (a, n) = (rows.start, rows.len());
    let mut cpu_in =
        Top2SumGateInputs::new(c.logits.view().narrow(0, a, n).unwrap(), c.bias.view());
    if let Some(m) = &c.mask {
        cpu_in = cpu_in.with_mask(m.view().narrow(0, a, n).unwrap());
    }
    if let Some(u) = &c.unmapped {
        cpu_in = cpu_in.with_unmapped_topk_idx(u.view().narrow(0, a, n).unwrap());
    }
    if let Some(f) = &c.fix {
        cpu_in.fix_routing_mask = Some(f.view().narrow(0, a, n).unwrap());
    }
    if let Some((m, cnt)) = &c.map {
        cpu_in = cpu_in.with_physical_map(m.view(), cnt.view());
    }
    reference::top2_sum_gate(&cpu_in, &c.params).unwrap_or_else(|e| panic!("reference: {e}"))
}

/// The CPU reference of `c`, its rows split over the host's cores when no result depends on
/// the row index (no physical map, or one replica per expert: the replica choice is the only
/// place the row index enters).
fn reference_gate(c: &GateCase) -> Top2SumGateOutput {
    let t = c.logits.layout.shape()[0];
    let row_free = c
        .map
        .as_ref()
        .is_none_or(|(_, cnt)| cnt.as_slice().iter().all(|&n| n == 1));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if !row_free || t < 1024 || threads == 1 {
        return reference_rows(c, 0..t);
    }
    let chunk = t.div_ceil(threads);
    let parts: Vec<Top2SumGateOutput> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..t)
            .step_by(chunk)
            .map(|a| s.spawn(move || reference_rows(c, a..(a + chunk).min(t))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let cat = |f: &dyn Fn(&Top2SumGateOutput) -> Vec<i64>| -> Vec<i64> {
        parts.iter().flat_map(f).collect()
    };
    let p = parts[0].topk_idx.shape()[1];
    let k = c.params.num_topk;
    Top2SumGateOutput {
        topk_idx: HostTensor::from_vec(cat(&|o| o.topk_idx.as_slice().to_vec()), &[t, p]).unwrap(),
        topk_weights: HostTensor::from_vec(
            parts
                .iter()
                .flat_map(|o| o.topk_weights.as_slice().to_vec())
                .collect(),
            &[t, p],
        )
        .unwrap(),
        unmapped_topk_idx: c.unmapped.as_ref().map(|_| {
            HostTensor::from_vec(
                cat(&|o| o.unmapped_topk_idx.as_ref().unwrap().as_slice().to_vec()),
                &[t, k],
            )
            .unwrap()
        }),
    }
}

/// Runs the GPU op (poisoned outputs) and the CPU reference on `c` and compares them; returns
/// the largest weight distance in ulp.
fn check_gate(dev: &Device, case: &str, c: &GateCase) -> u64 {
    let expected = reference_gate(c);

    let logits = c.logits.upload(dev);
    let bias = dev.upload(&c.bias).unwrap();
    let mask = c.mask.as_ref().map(|m| dev.upload(m).unwrap());
    let fix = c.fix.as_ref().map(|m| dev.upload(m).unwrap());
    let map = c
        .map
        .as_ref()
        .map(|(m, n)| (dev.upload(m).unwrap(), dev.upload(n).unwrap()));
    let mut unmapped = c.unmapped.as_ref().map(|u| u.upload(dev));
    let mut inputs = Top2SumGateDeviceInputs::new(
        logits.view().with_layout(c.logits.layout.clone()).unwrap(),
        bias.view(),
    );
    if let Some(m) = &mask {
        inputs = inputs.with_mask(m.view());
    }
    if let Some(f) = &fix {
        inputs = inputs.with_fix_routing_mask(f.view());
    }
    if let Some((m, n)) = &map {
        inputs = inputs.with_physical_map(m.view(), n.view());
    }
    let shape = expected.topk_idx.shape().to_vec();
    let mut idx = dev.alloc::<i64>(&shape).unwrap();
    let mut w = dev.alloc::<f32>(&shape).unwrap();
    poison(&mut idx).unwrap();
    poison(&mut w).unwrap();
    let u_layout = c.unmapped.as_ref().map(|u| u.layout.clone());
    let mut u_view = unmapped
        .as_mut()
        .map(|u| u.view_mut().with_layout(u_layout.clone().unwrap()).unwrap());
    tk_gating::top2_sum_gate_into(
        &inputs,
        u_view.as_mut(),
        &c.params,
        &mut idx.view_mut(),
        &mut w.view_mut(),
    )
    .unwrap_or_else(|e| panic!("{case}: {e}"));

    assert_bits_eq(
        &format!("{case}: topk_idx"),
        idx.to_host().unwrap().as_slice(),
        expected.topk_idx.as_slice(),
    );
    if let (Some(u), Some(want)) = (&u_view, &expected.unmapped_topk_idx) {
        let got = dev.download(&u.as_view()).unwrap();
        assert_bits_eq(
            &format!("{case}: unmapped_topk_idx"),
            got.as_slice(),
            want.as_slice(),
        );
    }
    let got_w = w.to_host().unwrap();
    if expected.topk_idx.as_slice().len() < 1 << 16 {
        // The allocating form, run again on the written-back unmapped_topk_idx (fix-routing
        // rows hold the same ids; the others are outputs only): the same bits.
        let (idx2, w2) = tk_gating::top2_sum_gate(&inputs, u_view.as_mut(), &c.params).unwrap();
        assert_bits_eq(
            &format!("{case}: topk_idx (allocating)"),
            idx2.to_host().unwrap().as_slice(),
            expected.topk_idx.as_slice(),
        );
        assert_bits_eq(
            &format!("{case}: topk_weights (allocating)"),
            w2.to_host().unwrap().as_slice(),
            got_w.as_slice(),
        );
    }
    let mut worst = 0;
    for (i, (&a, &b)) in got_w
        .as_slice()
        .iter()
        .zip(expected.topk_weights.as_slice())
        .enumerate()
    {
        assert!(
            allclose(a, b),
            "{case}: topk_weights[{i}] = {a:e}, reference {b:e}"
        );
        worst = worst.max(ulp_distance(a, b));
    }
    worst
}

/// Identity map `(E + S, D)` with `logical_count = 1` (the spec's test map).
fn identity_map(logical: usize, d: usize) -> (HostTensor<i32>, HostTensor<i32>) {
    (
        HostTensor::from_fn(&[logical, d], |i| (i / d) as i32),
        HostTensor::from_vec(vec![1; logical], &[logical]).unwrap(),
    )
}

/// A random map `(E + S, D)`: every logical expert has `1..=D` replicas among the `E + D - 1`
/// physical ids.
fn random_map(
    rng: &mut Rng,
    logical: usize,
    e: usize,
    d: usize,
) -> (HostTensor<i32>, HostTensor<i32>) {
    let physical = (e + d - 1) as u64;
    (
        HostTensor::from_fn(&[logical, d], |_| rng.below(physical) as i32),
        HostTensor::from_fn(&[logical], |_| 1 + rng.below(d as u64) as i32),
    )
}

/// Random fix-routing ids `(T, K)` in `0..E`, stored with row stride `K + 2`.
fn random_ids(rng: &mut Rng, t: usize, k: usize, e: usize) -> Strided<i64> {
    Strided::padded(t, k, 2, 0, |_| rng.below(e as u64) as i64)
}

/// The spec's config table `(G, Gk, E, S, K)` (§4.5).
use tk_gating::top2_sum_gate::SPEC_CONFIGS;

/// The spec's loops (§4.5): per config, scoring and token count one gap-respecting input of
/// `T + 10` rows; then pad {0, 10} × tp_rank {0, 1} × shared (when valid) × fix routing, with
/// ep_rank 0 of 4, 2 TP ranks, rsf 1.5, the identity map `(E + S, 33)` when shared.
#[test]
fn gpu_top2_sum_gate_spec_grid() {
    let Some(dev) = gpu_or_skip("gpu_top2_sum_gate_spec_grid") else {
        return;
    };
    let mut worst = 0;
    let mut n = 0;
    for (groups, topk_groups, e, s, k) in SPEC_CONFIGS {
        let shared_ok = k % s == 0 && e % (k / s) == 0;
        for scoring in SCORINGS {
            for t in generate_num_tokens(1, false) {
                let case = format!("top2 ({groups},{topk_groups},{e},{s},{k}) {scoring} T={t}");
                let mut rng = Rng::for_case(&case);
                let base = Top2SumGateParams::new(k, scoring)
                    .with_groups(groups, topk_groups)
                    .with_routed_scaling_factor(1.5)
                    .with_ep(0, 4);
                let (logits, bias) = gated_inputs(&mut rng, t + 10, e, &base, 10_000).unwrap();
                let ids = random_ids(&mut rng, t + 10, k, e);
                for pad in [0usize, 10] {
                    let rows = t + pad;
                    for tp_rank in [0, 1] {
                        for shared in [false, true] {
                            if shared && !shared_ok {
                                continue;
                            }
                            for fix in [false, true] {
                                let mut params = base.with_tp(tp_rank, 2);
                                if shared {
                                    params = params.with_shared_as_routed(s);
                                }
                                let unmapped = if fix {
                                    Strided {
                                        buf: ids.buf.clone(),
                                        layout: ids.layout.narrow(0, 0, rows).unwrap(),
                                    }
                                } else {
                                    Strided::padded(rows, k, 2, 0, |_| 0)
                                };
                                let c = GateCase {
                                    params,
                                    logits: Strided {
                                        buf: logits.clone(),
                                        layout: Layout::contiguous(&[rows, e]),
                                    },
                                    bias: bias.clone(),
                                    mask: (pad > 0)
                                        .then(|| HostTensor::from_fn(&[rows], |i| (i < t) as u8)),
                                    fix: fix.then(|| {
                                        HostTensor::from_vec(vec![1; rows], &[rows]).unwrap()
                                    }),
                                    map: shared.then(|| identity_map(e + s, 33)),
                                    unmapped: Some(unmapped),
                                };
                                let what = format!(
                                    "{case} pad={pad} tp={tp_rank} shared={shared} fix={fix}"
                                );
                                worst = worst.max(check_gate(&dev, &what, &c));
                                n += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    println!("top2_sum_gate spec grid: {n} cases; worst weight distance {worst} ulp");
}

/// One configuration with every option: mask (every 5th token padding), fix routing (every
/// 3rd token), a random physical map with `S + 3` columns, `unmapped_topk_idx` with a row
/// stride, EP rank 1 of 2 and TP rank 1 of 2, rsf 2.5; `pad`/`start` store the logits strided.
#[allow(clippy::too_many_arguments)]
fn gate_with_everything(
    case: &str,
    t: usize,
    e: usize,
    k: usize,
    groups: (usize, usize),
    shared: usize,
    scoring: ScoringFunc,
    pad: usize,
    start: usize,
) -> GateCase {
    let mut rng = Rng::for_case(case);
    let params = Top2SumGateParams::new(k, scoring)
        .with_groups(groups.0, groups.1)
        .with_shared_as_routed(shared)
        .with_routed_scaling_factor(2.5)
        .with_ep(1, 2)
        .with_tp(1, 2);
    let (logits, bias) = gated_inputs(&mut rng, t, e, &params, 10_000).unwrap();
    let mut it = logits.as_slice().iter();
    let logits = Strided::padded(t, e, pad, 0, |_| 0.0);
    let mut buf = logits.buf.into_vec();
    for row in buf.chunks_mut(e + pad) {
        for v in &mut row[start..start + e] {
            *v = *it.next().unwrap();
        }
    }
    let logits = Strided {
        buf: HostTensor::from_vec(buf, &[t, e + pad]).unwrap(),
        layout: Layout::new(vec![t, e], vec![e + pad, 1], start).unwrap(),
    };
    GateCase {
        params,
        logits,
        bias,
        mask: Some(HostTensor::from_fn(&[t], |i| {
            (i % 5 != 4) as u8 * (1 + (i % 2) as u8)
        })),
        fix: Some(HostTensor::from_fn(&[t], |i| (i % 3 == 1) as u8)),
        map: Some(random_map(&mut rng, e + shared, e, shared + 3)),
        unmapped: Some(random_ids(&mut rng, t, k, e)),
    }
}

/// `gate_with_everything` and the same inputs without any option (plain routing).
#[allow(clippy::too_many_arguments)]
fn check_everything_and_plain(
    dev: &Device,
    case: &str,
    t: usize,
    e: usize,
    k: usize,
    groups: (usize, usize),
    shared: usize,
    scoring: ScoringFunc,
) -> u64 {
    let mut c = gate_with_everything(case, t, e, k, groups, shared, scoring, 0, 0);
    let mut worst = check_gate(dev, case, &c);
    if shared == 0 {
        c.params = c.params.with_ep(0, 1).with_tp(0, 1);
        c.mask = None;
        c.fix = None;
        c.map = None;
        c.unmapped = None;
        worst = worst.max(check_gate(dev, &format!("{case} plain"), &c));
    }
    worst
}

/// `(T, E, K, (G, Gk), S, scoring)`.
type GateConfig = (usize, usize, usize, (usize, usize), usize, ScoringFunc);

#[test]
fn gpu_top2_sum_gate_off_grid_and_lifted_limits() {
    let Some(dev) = gpu_or_skip("gpu_top2_sum_gate_off_grid_and_lifted_limits") else {
        return;
    };
    // (T, E, K, groups, S, scoring): 160 / 384 experts, top-k 4 / 7, 1 / 3 / 37 tokens, and each
    // lifted upstream limit (E % 4 != 0, K > 32, K + S > 32, G > 32, E / G > 32).
    let cases: [GateConfig; 17] = [
        (1, 160, 4, (0, 0), 0, Sigmoid),
        (3, 160, 7, (8, 3), 0, SqrtSoftplus),
        (37, 160, 4, (20, 5), 2, Softmax),
        (37, 384, 7, (12, 4), 0, Sigmoid),
        (3, 160, 4, (0, 0), 1, Sigmoid),
        (3, 384, 4, (0, 0), 2, Softmax),
        (1, 384, 7, (6, 2), 0, SqrtSoftplus),
        (37, 384, 4, (0, 0), 0, Softmax),
        (37, 6, 2, (0, 0), 0, Sigmoid),
        (37, 35, 5, (0, 0), 1, Softmax),
        (37, 37, 5, (0, 0), 0, Softmax),
        (37, 10, 3, (5, 2), 0, SqrtSoftplus),
        (9, 384, 40, (0, 0), 0, Sigmoid),
        (9, 384, 32, (0, 0), 2, SqrtSoftplus),
        (9, 384, 7, (64, 5), 0, Softmax),
        (9, 384, 8, (4, 2), 0, Sigmoid),
        (9, 1024, 64, (64, 20), 2, Sigmoid),
    ];
    let mut worst = 0;
    for (t, e, k, groups, shared, scoring) in cases {
        let case = format!("top2 off-grid T={t} E={e} K={k} G={groups:?} S={shared} {scoring}");
        worst = worst.max(check_everything_and_plain(
            &dev, &case, t, e, k, groups, shared, scoring,
        ));
    }
    // Strided and unaligned logits rows (the scalar-load path).
    for (pad, start) in [(3, 1), (4, 2), (5, 0)] {
        let case = format!("top2 strided logits pad={pad} start={start}");
        let c = gate_with_everything(&case, 37, 256, 8, (8, 4), 0, Softmax, pad, start);
        worst = worst.max(check_gate(&dev, &case, &c));
    }
    println!("top2_sum_gate off-grid: worst weight distance {worst} ulp");
}

#[test]
fn gpu_top2_sum_gate_deepseek() {
    let Some(dev) = gpu_or_skip("gpu_top2_sum_gate_deepseek") else {
        return;
    };
    let mut worst = 0;
    for t in [1, 16, 64, 256, 8001] {
        let (e, k, g, gk, f) = tk_gating::DEEPSEEK_V3;
        let case = format!("deepseek-v3 T={t}");
        worst = worst.max(check_everything_and_plain(
            &dev,
            &case,
            t,
            e,
            k,
            (g, gk),
            0,
            f,
        ));
        let (e, k, g, gk, f) = tk_gating::DEEPSEEK_V4;
        let case = format!("deepseek-v4 T={t}");
        worst = worst.max(check_everything_and_plain(
            &dev,
            &case,
            t,
            e,
            k,
            (g, gk),
            0,
            f,
        ));
    }
    println!("top2_sum_gate DeepSeek-V3 / V4: worst weight distance {worst} ulp");
}

/// Planted ties (logits and bias from tiny value sets, so many keys are exactly equal — both
/// sides compute identical scores for these few values) and the spec's stability check
/// (all-zero logits and bias select experts 0, 1, 2, ... in order).
#[test]
fn gpu_top2_sum_gate_planted_ties_and_stability() {
    let Some(dev) = gpu_or_skip("gpu_top2_sum_gate_planted_ties_and_stability") else {
        return;
    };
    for scoring in SCORINGS {
        for (e, k, groups) in [(24, 5, (6, 3)), (256, 8, (8, 4)), (160, 7, (0, 0))] {
            let case = format!("top2 ties E={e} K={k} {scoring}");
            let mut rng = Rng::for_case(&case);
            let t = 37;
            let logits = HostTensor::from_fn(&[t, e], |_| rng.below(3) as f32 * 0.5);
            let bias = HostTensor::from_fn(&[e], |_| rng.below(2) as f32 * 0.25);
            let c = GateCase {
                params: Top2SumGateParams::new(k, scoring).with_groups(groups.0, groups.1),
                logits: Strided::contiguous(logits),
                bias,
                mask: None,
                fix: None,
                map: None,
                unmapped: Some(Strided::padded(t, k, 2, 0, |_| 0)),
            };
            check_gate(&dev, &case, &c);
        }
    }
    for (groups, topk_groups, e, s, k) in SPEC_CONFIGS {
        let shared_ok = k % s == 0 && e % (k / s) == 0;
        let t = 3;
        let mut params = Top2SumGateParams::new(k, Sigmoid)
            .with_groups(groups, topk_groups)
            .with_ep(0, 4)
            .with_tp(0, 2);
        if shared_ok {
            params = params.with_shared_as_routed(s);
        }
        let c = GateCase {
            params,
            logits: Strided::contiguous(HostTensor::from_vec(vec![0.0; t * e], &[t, e]).unwrap()),
            bias: HostTensor::from_vec(vec![0.0; e], &[e]).unwrap(),
            mask: None,
            fix: None,
            map: shared_ok.then(|| identity_map(e + s, 33)),
            unmapped: None,
        };
        check_gate(
            &dev,
            &format!("stability {e} {k} {groups} {topk_groups}"),
            &c,
        );
    }
}

/// The replica choice `(ep_rank + t·23333) mod logical_count` in 64-bit beyond upstream's int32
/// overflow (token 92 037; with ep_rank 7700 the int32 sum already overflows at 92 036), on
/// 100 000 tokens with random logits.
#[test]
fn gpu_top2_sum_gate_replica_choice_beyond_int32() {
    let Some(dev) = gpu_or_skip("gpu_top2_sum_gate_replica_choice_beyond_int32") else {
        return;
    };
    let t = 100_000;
    assert!(t > tk_gating::top2_sum_gate::UPSTREAM_REPLICA_OVERFLOW_TOKEN);
    for (ep_rank, ep, d) in [(0usize, 1usize, 3usize), (7700, 7701, 7700)] {
        let e = 2;
        let case = format!("replica choice ep_rank={ep_rank} ep={ep} D={d}");
        let mut rng = Rng::for_case(&case);
        let mut map = vec![0i32; e * d];
        map[..3].copy_from_slice(&[1, 2, 3]);
        map[d..d + 2].copy_from_slice(&[0, 3]);
        let c = GateCase {
            params: Top2SumGateParams::new(1, Sigmoid).with_ep(ep_rank, ep),
            logits: Strided::contiguous(rng.randn(&[t, e], |x| x)),
            bias: rng.randn(&[e], |x| x),
            mask: None,
            fix: None,
            map: Some((
                HostTensor::from_vec(map, &[e, d]).unwrap(),
                HostTensor::from_vec(vec![3, 2], &[e]).unwrap(),
            )),
            unmapped: Some(Strided::padded(t, 1, 2, 0, |_| 0)),
        };
        check_gate(&dev, &case, &c);
    }
}

#[test]
fn gpu_top2_sum_gate_rejects_bad_input() {
    let Some(dev) = gpu_or_skip("gpu_top2_sum_gate_rejects_bad_input") else {
        return;
    };
    let logits = dev.alloc::<f32>(&[4, 1100]).unwrap();
    let bias = dev.alloc::<f32>(&[1100]).unwrap();
    let inputs = Top2SumGateDeviceInputs::new(logits.view(), bias.view());
    let e =
        tk_gating::top2_sum_gate(&inputs, None, &Top2SumGateParams::new(8, Sigmoid)).unwrap_err();
    assert!(matches!(e, TkError::Param { arg: "logits", .. }), "{e:?}");
    let logits = dev.alloc::<f32>(&[4, 16]).unwrap();
    let bias = dev.alloc::<f32>(&[16]).unwrap();
    let inputs = Top2SumGateDeviceInputs::new(logits.view(), bias.view());
    let params = Top2SumGateParams::new(4, Sigmoid);
    let mut idx = dev.alloc::<i64>(&[4, 5]).unwrap();
    let mut w = dev.alloc::<f32>(&[4, 4]).unwrap();
    let e = tk_gating::top2_sum_gate_into(
        &inputs,
        None,
        &params,
        &mut idx.view_mut(),
        &mut w.view_mut(),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            TkError::Shape {
                arg: "topk_idx",
                ..
            }
        ),
        "{e:?}"
    );
    let fix = dev.alloc::<u8>(&[4]).unwrap();
    let e = tk_gating::top2_sum_gate(&inputs.with_fix_routing_mask(fix.view()), None, &params)
        .unwrap_err();
    assert!(
        matches!(
            e,
            TkError::Param {
                arg: "fix_routing_mask",
                ..
            }
        ),
        "{e:?}"
    );
    let inputs = Top2SumGateDeviceInputs::new(logits.view(), bias.view());
    let e = tk_gating::top2_sum_gate(
        &inputs,
        None,
        &Top2SumGateParams::new(4, ScoringFunc::Identity),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            TkError::Param {
                arg: "scoring_func",
                ..
            }
        ),
        "{e:?}"
    );
    // T = 0: empty outputs, nothing launched.
    let logits = dev.alloc::<f32>(&[0, 16]).unwrap();
    let inputs = Top2SumGateDeviceInputs::new(logits.view(), bias.view());
    let (i, w) = tk_gating::top2_sum_gate(&inputs, None, &params).unwrap();
    assert_eq!((i.shape(), w.shape()), (&[0usize, 4][..], &[0usize, 4][..]));
}
