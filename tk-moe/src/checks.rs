//! Layout checks shared by the ops' validation: tk-core's, plus this crate's int32 limit.

pub(crate) use tk_core::validate::{check_matrix, check_rank, check_shape, check_unit_last_stride};
use tk_core::{Result, TkError};

/// Checks that `T·K` (the flat index range of a `(T, K)` index tensor) fits in int32, as every
/// int32 mapping tensor of this crate needs.
pub(crate) fn check_flat_fits_i32(arg: &'static str, t: usize, k: usize) -> Result<()> {
    match t.checked_mul(k) {
        Some(n) if n <= i32::MAX as usize => Ok(()),
        _ => Err(TkError::Shape {
            arg,
            expected: format!("T·K <= {} (flat indices are int32)", i32::MAX),
            got: vec![t, k],
        }),
    }
}
