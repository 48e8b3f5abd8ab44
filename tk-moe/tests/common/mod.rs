//! Helpers shared by the test files: builders, error matchers, the spec's grid (with the
//! subsampling the debug-build time budget needs), and independent checkers written from
//! `spec/moe.md` (sharing no code with the crate's references).
#![allow(dead_code)]

use tk_core::testing::Rng;
use tk_core::{Element, HostTensor, HostView, Layout, TkError};
use tk_moe::reference::FusedMapping;
use tk_moe::testing::{generate_moe_params_with, generate_topk_idx, MoeParams};

/// [`tk_core::testing::assert_param`]: a [`TkError::Param`] naming `arg` with every word.
pub fn assert_param(err: TkError, arg: &str, words: &[&str]) {
    tk_core::testing::assert_param(err, arg, words)
}

/// A contiguous `(rows, cols)` tensor from rows.
pub fn mat<T: Element>(rows: &[&[T]]) -> HostTensor<T> {
    let cols = rows.first().map_or(0, |r| r.len());
    let flat: Vec<T> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    HostTensor::from_vec(flat, &[rows.len(), cols]).unwrap()
}

/// A 1-D tensor.
pub fn vec1<T: Element>(v: &[T]) -> HostTensor<T> {
    HostTensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
}

/// The same logical `(T, K)` matrix stored with row stride `K + pad` (pad columns hold
/// `fill`), as a buffer and a layout.
pub fn padded_rows<T: Element>(m: &HostTensor<T>, pad: usize, fill: T) -> (Vec<T>, Layout) {
    let (t, k) = (m.shape()[0], m.shape()[1]);
    let mut buf = Vec::with_capacity(t * (k + pad));
    for r in m.as_slice().chunks(k.max(1)).take(t) {
        buf.extend_from_slice(r);
        buf.extend(std::iter::repeat_n(fill, pad));
    }
    (buf, Layout::new(vec![t, k], vec![k + pad, 1], 0).unwrap())
}

/// The argument an error names (panics for errors without one).
pub fn err_arg(e: &TkError) -> &'static str {
    e.arg()
        .unwrap_or_else(|| panic!("error without an argument: {e:?}"))
}

/// Asserts a [`TkError::Shape`] naming `arg`.
pub fn assert_shape_err(e: TkError, arg: &str) {
    assert!(
        matches!(e, TkError::Shape { arg: a, .. } if a == arg),
        "expected a Shape error naming {arg:?}, got {e:?}"
    );
}

/// The moe12 grid (`generate_moe_params(False)` without `TK_FULL_TEST`), or the full grid under
/// `TK_FULL_TEST`.
pub fn grid() -> Vec<MoeParams> {
    generate_moe_params_with(false, tk_core::testing::full_test())
}

/// `generate_topk_idx` for `p`, seeded by `case` and the config's name.
pub fn topk_idx_for(case: &str, p: &MoeParams) -> HostTensor<i64> {
    let mut rng = Rng::for_case(&format!("{case} {}", p.name()));
    generate_topk_idx(&mut rng, p).unwrap()
}

/// A subsample of the grid config `p` for the ops whose debug-build cost is `O(T·K·H)` or
/// that are not `get_fused_mapping`: `generate_topk_idx` with `num_send_tokens = 600` instead
/// of 4001 (the same distribution per row, 6.7× fewer rows to draw), then the first `rows` rows.
pub fn topk_idx_sub(case: &str, p: &MoeParams, rows: usize) -> HostTensor<i64> {
    let small = MoeParams {
        num_send_tokens: p.num_send_tokens.min(600),
        ..*p
    };
    first_rows(&topk_idx_for(case, &small), rows)
}

/// `f` of every item, computed on the host's cores (at most 16 workers pulling item indices
/// from a shared counter), in item order.
pub fn par_map<C: Sync, R: Send>(items: &[C], f: impl Fn(&C) -> R + Sync) -> Vec<R> {
    let workers = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .clamp(1, 16);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        mine.push((i, f(item)));
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// The first `rows` rows of `m` (all when it has fewer).
pub fn first_rows<T: Element>(m: &HostTensor<T>, rows: usize) -> HostTensor<T> {
    let (t, k) = (m.shape()[0], m.shape()[1]);
    let n = rows.min(t);
    HostTensor::from_vec(m.as_slice()[..n * k].to_vec(), &[n, k]).unwrap()
}

/// The spec's invariants of `get_fused_mapping` (§4.11 test) plus the ones upstream's test
/// omits (`token_topk_to_pos == -1` for invalid slots, padding at the segment tail, padding
/// after the last segment, the raw counts) plus **our documented order**: inside a segment the
/// real rows are in ascending flat index `t·K + k`. `m` is the expected row count.
pub fn check_mapping(
    what: &str,
    topk_idx: &HostView<'_, i64>,
    e: usize,
    a: usize,
    m: usize,
    map: &FusedMapping,
) {
    let (t, k) = (topk_idx.shape()[0], topk_idx.shape()[1]);
    let idx: Vec<i64> = topk_idx.to_contiguous_vec();
    let pe = map.pos_to_expert.as_slice();
    let pt = map.pos_to_token.as_slice();
    let ptk = map.pos_to_token_topk.as_slice();
    let ttp = map.token_topk_to_pos.as_slice();
    assert_eq!(
        map.pos_to_expert.shape(),
        &[m],
        "{what}: pos_to_expert shape"
    );
    assert_eq!(map.pos_to_token.shape(), &[m], "{what}: pos_to_token shape");
    assert_eq!(
        map.pos_to_token_topk.shape(),
        &[m],
        "{what}: pos_to_token_topk shape"
    );
    assert_eq!(
        map.token_topk_to_pos.shape(),
        &[t, k],
        "{what}: token_topk_to_pos shape"
    );
    for out in [
        &map.expert_start,
        &map.expert_end,
        &map.num_tokens_per_expert,
    ] {
        assert_eq!(out.shape(), &[e], "{what}: per-expert shape");
    }
    // Raw counts, independently.
    let mut raw = vec![0usize; e];
    for &v in &idx {
        if v >= 0 {
            raw[v as usize] += 1;
        }
    }
    let list = map.num_tokens_per_expert.as_slice();
    let mut running = 0i64;
    for ex in 0..e {
        assert_eq!(
            list[ex] as usize,
            raw[ex].div_ceil(a) * a,
            "{what}: padded count of expert {ex}"
        );
        assert_eq!(
            map.expert_start.as_slice()[ex] as i64,
            running,
            "{what}: start {ex}"
        );
        running += list[ex] as i64;
        assert_eq!(
            map.expert_end.as_slice()[ex] as i64,
            running,
            "{what}: end {ex}"
        );
        // Segment: entries equal to ex, count = raw count, every entry ex or -1, real rows
        // first, and (our order) ascending flat index.
        let s = map.expert_start.as_slice()[ex] as usize;
        let seg = &pe[s..s + list[ex] as usize];
        assert_eq!(
            seg.iter().filter(|&&v| v == ex as i32).count(),
            raw[ex],
            "{what}: count {ex}"
        );
        assert!(
            seg.iter().all(|&v| v == ex as i32 || v == -1),
            "{what}: foreign row in {ex}"
        );
        assert!(
            seg[..raw[ex]].iter().all(|&v| v == ex as i32),
            "{what}: padding not at the tail of {ex}"
        );
        let flats = &ptk[s..s + raw[ex]];
        assert!(
            flats.windows(2).all(|w| w[0] < w[1]),
            "{what}: expert {ex} rows not in ascending flat order"
        );
    }
    assert!(running as usize <= m, "{what}: segments exceed M");
    assert!(
        pe[running as usize..].iter().all(|&v| v == -1),
        "{what}: rows after the last segment"
    );
    // Consistency of the three maps and the inverse.
    for p in 0..m {
        let neg = [pe[p] < 0, pt[p] < 0, ptk[p] < 0];
        assert!(
            neg[0] == neg[1] && neg[1] == neg[2],
            "{what}: row {p} half padding"
        );
        if neg[0] {
            assert!(
                pe[p] == -1 && pt[p] == -1 && ptk[p] == -1,
                "{what}: padding row {p} not -1"
            );
            continue;
        }
        let flat = ptk[p] as usize;
        assert_eq!(ttp[flat], p as i32, "{what}: inverse of row {p}");
        assert_eq!(idx[flat], pe[p] as i64, "{what}: expert of row {p}");
        assert_eq!(pt[p] as usize, flat / k, "{what}: token of row {p}");
    }
    for (flat, &v) in idx.iter().enumerate() {
        if v < 0 {
            assert_eq!(ttp[flat], -1, "{what}: invalid slot {flat} has a row");
        } else {
            let p = ttp[flat];
            assert!(p >= 0 && (p as usize) < m, "{what}: slot {flat} row {p}");
            assert_eq!(
                ptk[p as usize] as usize, flat,
                "{what}: slot {flat} round trip"
            );
        }
    }
}

/// `reduce_fused` written from the spec's pseudo-code with `f32::mul_add`, on plain vectors:
/// `x` is `(M, H)` as fp32 values, the result fp32 before the output conversion.
pub fn naive_reduce(
    x: &[f32],
    h: usize,
    x_sf: Option<&[f32]>,
    weights: Option<&[f32]>,
    pos: &[i32],
    k: usize,
    sf: Option<f32>,
) -> Vec<f32> {
    let t = pos.len() / k;
    let mut out = Vec::with_capacity(t * h);
    for tok in 0..t {
        for col in 0..h {
            let mut acc = 0.0f32;
            for slot in 0..k {
                let p = pos[tok * k + slot];
                if p == -1 {
                    continue;
                }
                let mut s = match weights {
                    Some(w) => w[tok * k + slot],
                    None => 1.0,
                };
                if let Some(xs) = x_sf {
                    s *= xs[p as usize];
                }
                acc = f32::mul_add(x[p as usize * h + col], s, acc);
            }
            out.push(match sf {
                Some(g) => acc * g,
                None => acc,
            });
        }
    }
    out
}
