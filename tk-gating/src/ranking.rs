//! The one selection order of every gating op (`spec/moe.md` §2 "Stable descending top-k",
//! §5.1): **higher key first, then lower index**, made total for non-finite keys.
//!
//! * Finite keys and `±inf` compare by value; `-0.0 == +0.0` (a tie, broken by index).
//! * **NaN ranks above every number, `+inf` included**; NaNs of any sign or payload are equal
//!   to each other (ties broken by index). This is the order of `torch.sort(descending=True,
//!   stable=True)`, i.e. of upstream's reference `stable_topk`. (Upstream's kernels never select
//!   a NaN through their `>` comparisons and return garbage indices instead.)
//! * `-inf` is an ordinary key: selecting it removes it from the candidates, so a selection
//!   never returns an index twice. (Upstream's `topk_gate` kernel removes entries by overwriting
//!   them with `-inf` and can return duplicates when it has to select `-inf` inputs, §4.3.)
//!
//! A selection of `k` entries is therefore the first `k` entries of a stable descending sort,
//! best first: [`stable_topk_indices`].

use std::cmp::Ordering;

/// Compares two keys in the selection order: [`Ordering::Greater`] when `a` ranks *higher*
/// (is selected earlier) than `b`, [`Ordering::Equal`] for a tie (`-0.0` vs `+0.0`, NaN vs
/// NaN, equal values).
pub fn cmp_keys(a: f32, b: f32) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// True when entry `(a, ia)` is selected before entry `(b, ib)`: a higher key, or an equal key
/// and a smaller index.
pub fn ranks_before(a: f32, ia: usize, b: f32, ib: usize) -> bool {
    match cmp_keys(a, b) {
        Ordering::Greater => true,
        Ordering::Less => false,
        Ordering::Equal => ia < ib,
    }
}

/// The indices of the `k` best entries of `keys`, best first (`k` is clamped to `keys.len()`).
pub fn stable_topk_indices(keys: &[f32], k: usize) -> Vec<usize> {
    select_best((0..keys.len()).collect(), k, |i| keys[i])
}

/// The `k` best of `candidates` (indices into whatever `key` reads), best first, ties to the
/// smaller index whatever the order of `candidates` (`k` is clamped to `candidates.len()`).
pub fn select_best(mut candidates: Vec<usize>, k: usize, key: impl Fn(usize) -> f32) -> Vec<usize> {
    candidates.sort_by(|&i, &j| cmp_keys(key(j), key(i)).then(i.cmp(&j)));
    candidates.truncate(k);
    candidates
}

/// The two largest keys of a group *as a multiset* in the selection order: a duplicated maximum
/// counts twice (`[5, 5, 1]` gives `(5, 5)`), NaN is the largest. `None` for fewer than two
/// keys.
///
/// For NaN-free keys this equals the kernel's strict scan from `top1 = top2 = -inf`
/// (`if v > top1 { top2 = top1; top1 = v } else if v > top2 { top2 = v }`).
pub fn top2(keys: impl IntoIterator<Item = f32>) -> Option<(f32, f32)> {
    let mut it = keys.into_iter();
    let a = it.next()?;
    let b = it.next()?;
    let (mut t1, mut t2) = if cmp_keys(b, a) == Ordering::Greater {
        (b, a)
    } else {
        (a, b)
    };
    for v in it {
        if cmp_keys(v, t1) == Ordering::Greater {
            t2 = t1;
            t1 = v;
        } else if cmp_keys(v, t2) == Ordering::Greater {
            t2 = v;
        }
    }
    Some((t1, t2))
}

/// The largest key in the selection order (NaN if any key is NaN); `None` when empty.
pub fn top1(keys: impl IntoIterator<Item = f32>) -> Option<f32> {
    keys.into_iter().reduce(|m, v| {
        if cmp_keys(v, m) == Ordering::Greater {
            v
        } else {
            m
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_total_with_nan_first() {
        let keys = [
            1.0,
            f32::NAN,
            f32::INFINITY,
            -0.0,
            0.0,
            f32::NEG_INFINITY,
            -f32::NAN,
        ];
        assert_eq!(stable_topk_indices(&keys, 7), vec![1, 6, 2, 0, 3, 4, 5]);
        assert_eq!(stable_topk_indices(&keys, 0), Vec::<usize>::new());
        assert_eq!(stable_topk_indices(&keys, 99).len(), 7);
    }

    #[test]
    fn ranks_before_is_higher_key_then_lower_index() {
        assert!(ranks_before(2.0, 5, 1.0, 0));
        assert!(!ranks_before(1.0, 0, 2.0, 5));
        assert!(ranks_before(1.0, 0, 1.0, 1));
        assert!(!ranks_before(1.0, 1, 1.0, 0));
        assert!(ranks_before(-0.0, 0, 0.0, 1) && ranks_before(0.0, 0, -0.0, 1));
        assert!(ranks_before(f32::NAN, 9, f32::INFINITY, 0));
        assert!(ranks_before(f32::NAN, 0, -f32::NAN, 1) && !ranks_before(f32::NAN, 1, f32::NAN, 0));
        assert!(!ranks_before(f32::NEG_INFINITY, 0, -f32::MAX, 1));
    }

    #[test]
    fn select_best_breaks_ties_by_index_whatever_the_candidate_order() {
        let keys = [2.0, 1.0, 2.0, 2.0];
        assert_eq!(select_best(vec![3, 1, 2, 0], 3, |i| keys[i]), vec![0, 2, 3]);
    }

    #[test]
    fn top2_counts_duplicates_twice() {
        assert_eq!(top2([5.0, 1.0, 5.0]), Some((5.0, 5.0)));
        assert_eq!(top2([1.0, 3.0, 2.0]), Some((3.0, 2.0)));
        assert_eq!(
            top2([f32::NEG_INFINITY; 2]),
            Some((f32::NEG_INFINITY, f32::NEG_INFINITY))
        );
        assert_eq!(top2([1.0]), None);
        let (a, b) = top2([1.0, f32::NAN, 3.0]).unwrap();
        assert!(a.is_nan() && b == 3.0);
        assert!(top1([1.0, f32::NAN]).unwrap().is_nan());
        assert_eq!(top1([1.0, 4.0, -2.0]), Some(4.0));
    }
}
