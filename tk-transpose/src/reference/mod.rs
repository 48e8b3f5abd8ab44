//! CPU references (also the CPU backend): the same validation and the same results as the GPU
//! ops, written for clarity. Large inputs are split over threads by output rows.

use tk_core::{Element, HostTensor, HostView, Result};

use crate::batched_transpose::{geometry, Geometry};

/// CPU `batched_transpose`: `x` `(B, X, Y)` (last stride 1) → contiguous `(B, Y, X)`.
pub fn batched_transpose<T: Element>(x: &HostView<'_, T>) -> Result<HostTensor<T>> {
    transpose_impl(x, 3)
}

/// CPU `transpose`: `x` `(X, Y)` (last stride 1) → contiguous `(Y, X)`.
pub fn transpose<T: Element>(x: &HostView<'_, T>) -> Result<HostTensor<T>> {
    transpose_impl(x, 2)
}

fn transpose_impl<T: Element>(x: &HostView<'_, T>, rank: usize) -> Result<HostTensor<T>> {
    let g = geometry(T::DTYPE, x.layout(), rank)?;
    let mut shape = x.shape().to_vec();
    shape.swap(rank - 1, rank - 2);
    let mut out = vec![T::default(); g.batches * g.x * g.y];
    if !g.is_empty() {
        // Output rows (b, j) are independent: hand contiguous runs of them to threads.
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(out.len().div_ceil(1 << 20))
            .max(1);
        let rows_per_thread = (g.batches * g.y).div_ceil(threads);
        let data = x.raw_data();
        std::thread::scope(|s| {
            for (t, chunk) in out.chunks_mut(rows_per_thread * g.x).enumerate() {
                s.spawn(move || {
                    fill_rows(data, x.layout().offset(), &g, t * rows_per_thread, chunk)
                });
            }
        });
    }
    HostTensor::from_vec(out, &shape)
}

/// Writes output rows `first_row..` (row r = batch r / Y, column j = r % Y) into `chunk`.
fn fill_rows<T: Element>(
    data: &[T],
    offset: usize,
    g: &Geometry,
    first_row: usize,
    chunk: &mut [T],
) {
    for (k, row) in chunk.chunks_mut(g.x).enumerate() {
        let (b, j) = ((first_row + k) / g.y, (first_row + k) % g.y);
        for (i, o) in row.iter_mut().enumerate() {
            *o = data[offset + b * g.bs + i * g.ld + j];
        }
    }
}
