//! The index contract of every op in this crate (`spec/moe.md` §2, §5.11).
//!
//! Index tensors (`topk_idx`, group indices, `token_topk_to_pos`, ...) hold either a legal id
//! in `0..upper` or exactly **`-1`** ("no expert / no position"), which every op skips. Nothing
//! else is legal: **`-1` is the only legal negative value**, and ids `>= upper` are out of range.
//!
//! * **CPU path** (the references): every index input is checked in full before any output is
//!   written (in-place ops leave their tensor untouched on error); the first illegal entry is a
//!   [`TkError::Param`] naming the argument, the entry's multi-index and its value
//!   ([`check_indices`]).
//! * **GPU path**: a kernel cannot return an error without a host sync, so the
//!   contract is a defined reading instead: **every illegal entry is read as `-1`** (skipped;
//!   written back as `-1` by the ops that write indices). No kernel reads or writes out of bounds
//!   on any input. [`sanitize_indices`] is that reading on the host: a GPU test compares the
//!   kernel on raw indices with the CPU reference on sanitized ones, bit for bit.
//!
//! Upstream device-asserts (`aux_fi`, `group_count`, `inplace_unique_group_indices`), silently
//! mis-counts (`get_fused_mapping` skips only `-1`, so `-2` corrupts its counts) or reads out of
//! bounds (`expand_to_fused`, `reduce_fused`) instead; `mask_indices_by_tp` upstream maps every
//! negative value to `-1`, which the GPU reading above reproduces.

use tk_core::{Element, HostTensor, HostView, Result, TkError};

/// An integer element that can hold indices: `i32` or `i64`.
pub trait IndexElement: Element + Ord {
    /// The value, widened.
    fn to_i64(self) -> i64;
    /// A value known to fit (`-1` or a checked id).
    fn from_i64_lossy(v: i64) -> Self;
}

impl IndexElement for i32 {
    fn to_i64(self) -> i64 {
        self as i64
    }
    fn from_i64_lossy(v: i64) -> Self {
        v as i32
    }
}

impl IndexElement for i64 {
    fn to_i64(self) -> i64 {
        self
    }
    fn from_i64_lossy(v: i64) -> Self {
        v
    }
}

/// True when `v` is `-1` or in `0..upper`.
pub fn is_legal(v: i64, upper: usize) -> bool {
    v == -1 || (v >= 0 && (v as u64) < upper as u64)
}

/// Checks every entry of `view` (any rank, any strides) against the contract: `-1` or in
/// `0..upper`. `what` names the range in the message (e.g. "an expert id in 0..E = 9").
///
/// Errors: [`TkError::Param`] naming `arg`, with the first illegal entry in row-major order,
/// its multi-index and its value.
pub fn check_indices<I: IndexElement>(
    arg: &'static str,
    view: &HostView<'_, I>,
    upper: usize,
    what: &str,
) -> Result<()> {
    let data = view.raw_data();
    let mut flat = 0usize;
    let mut bad: Option<(usize, i64)> = None;
    view.layout().for_each_index(|i| {
        if bad.is_none() {
            let v = data[i].to_i64();
            if !is_legal(v, upper) {
                bad = Some((flat, v));
            }
        }
        flat += 1;
    });
    match bad {
        None => Ok(()),
        Some((flat, v)) => {
            let idx = unravel(flat, view.shape());
            let why = if v < 0 {
                "-1 is the only legal negative index"
            } else {
                "out of range"
            };
            Err(TkError::param(
                arg,
                format!("entry {idx:?} = {v}: must be -1 or {what} ({why})"),
            ))
        }
    }
}

/// The GPU path's reading of an index tensor: a contiguous copy of `view` in which every
/// illegal entry (a negative value other than `-1`, or a value `>= upper`) is `-1`.
pub fn sanitize_indices<I: IndexElement>(view: &HostView<'_, I>, upper: usize) -> HostTensor<I> {
    let v: Vec<I> = view
        .to_contiguous_vec()
        .into_iter()
        .map(|x| {
            if is_legal(x.to_i64(), upper) {
                x
            } else {
                I::from_i64_lossy(-1)
            }
        })
        .collect();
    HostTensor::from_vec(v, view.shape()).expect("same element count as the view")
}

/// The multi-index of row-major flat index `flat` in `shape`.
pub(crate) fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        let n = shape[d].max(1);
        idx[d] = flat % n;
        flat /= n;
    }
    idx
}
