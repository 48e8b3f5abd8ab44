//! Layout checks shared by the ops' validation (host and device layouts alike). Each returns a
//! [`TkError`] naming the argument.

use crate::error::{Result, TkError};
use crate::tensor::Layout;

/// Checks that `layout` has `rank` dimensions (`what` describes them, e.g. "rank 2 (T, E)").
pub fn check_rank(arg: &'static str, layout: &Layout, rank: usize, what: &str) -> Result<()> {
    if layout.rank() != rank {
        return Err(TkError::Shape {
            arg,
            expected: what.into(),
            got: layout.shape().to_vec(),
        });
    }
    Ok(())
}

/// Checks that the last dimension has stride 1 (not checked when the tensor is empty or the
/// last dimension has at most one element). Other strides are free.
pub fn check_unit_last_stride(arg: &'static str, layout: &Layout) -> Result<()> {
    let r = layout.rank();
    if r > 0 && layout.numel() > 0 && layout.shape()[r - 1] > 1 && layout.strides()[r - 1] != 1 {
        return Err(TkError::Stride {
            arg,
            expected: "unit stride along the last dimension; the other strides are free".into(),
            got: layout.strides().to_vec(),
        });
    }
    Ok(())
}

/// Checks a rank-2 matrix with a unit last stride and returns its `(rows, cols)`.
pub fn check_matrix(arg: &'static str, layout: &Layout, what: &str) -> Result<(usize, usize)> {
    check_rank(arg, layout, 2, what)?;
    check_unit_last_stride(arg, layout)?;
    Ok((layout.shape()[0], layout.shape()[1]))
}

/// Checks that `layout` has exactly `shape` (`what` names it, e.g. "(T, K) = (3, 2)").
pub fn check_shape(arg: &'static str, layout: &Layout, shape: &[usize], what: &str) -> Result<()> {
    if layout.shape() != shape {
        return Err(TkError::Shape {
            arg,
            expected: what.into(),
            got: layout.shape().to_vec(),
        });
    }
    Ok(())
}

/// Checks that a rank-1 `layout` has length `n` (`what` names the length, e.g. "(E,) = (72,)").
pub fn check_vector(arg: &'static str, layout: &Layout, n: usize, what: &str) -> Result<()> {
    if layout.rank() != 1 || layout.shape()[0] != n {
        return Err(TkError::Shape {
            arg,
            expected: format!("rank 1 {what}"),
            got: layout.shape().to_vec(),
        });
    }
    Ok(())
}

/// Checks that the output `arg` has exactly `shape` and is contiguous (row-major).
///
/// Errors: [`TkError::Shape`] or [`TkError::Stride`] naming `arg`.
pub fn check_contiguous(arg: &'static str, layout: &Layout, shape: &[usize]) -> Result<()> {
    if layout.shape() != shape {
        return Err(TkError::Shape {
            arg,
            expected: format!("{shape:?}"),
            got: layout.shape().to_vec(),
        });
    }
    if !layout.is_contiguous() {
        return Err(TkError::Stride {
            arg,
            expected: "a contiguous (row-major) tensor".into(),
            got: layout.strides().to_vec(),
        });
    }
    Ok(())
}

/// Checks that `other` (the tensor `arg`) lives on the same device as `dev`, the op's first
/// input. Errors: [`TkError::Placement`] naming `arg`.
pub fn check_same_device(
    arg: &'static str,
    dev: &crate::Device,
    other: &crate::Device,
) -> Result<()> {
    if dev.same_device(other) {
        Ok(())
    } else {
        Err(TkError::Placement {
            arg,
            msg: "must be on the same device as the op's first input".into(),
        })
    }
}
