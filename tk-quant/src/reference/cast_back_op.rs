//! CPU cast back ops (`spec/quant.md` §3.8, §3.9): the op's validation
//! ([`crate::cast_back::validate`], [`crate::cast_back::validate_e5m6`]) followed by the
//! generic references [`cast_back`](fn@super::cast_back) and
//! [`cast_back_from_e5m6`](fn@super::cast_back_from_e5m6).
//!
//! The module is `cast_back_op` because [`reference::cast_back`](fn@super::cast_back) already
//! names the generic reference (any `K`); [`cast_back_op`](fn@cast_back_op) is upstream's
//! `cast_back` op with its `K % 64 == 0` precondition. Where both accept an input, they return
//! the same bits.
//!
//! See [`crate::cast_back`](mod@crate::cast_back) for shapes, dtypes, preconditions and the deviations from
//! upstream.

use tk_core::dtype::E5M6Bytes;
use tk_core::{HostTensor, HostView, Result};

use crate::cast_back::{validate, validate_e5m6};
use crate::scale::ScaleView;
use crate::types::{DequantElement, QuantDataView, QuantInput};

/// `cast_back(x, fmt, x_block_size)` for FP8/FP4 data: `out[r, c] = O::from_f32(fl(dec(data)
/// · S[r/bm, c/bk]))`, contiguous `(M, K)` fp32 or bf16. `x.block` is `x_block_size`.
///
/// Errors: see [`crate::cast_back::validate`].
pub fn cast_back_op<O: DequantElement>(x: &QuantInput<'_>) -> Result<HostTensor<O>> {
    validate(x)?;
    super::cast_back(x)
}

/// `per_token_cast_back(x, fmt, npc)`: [`cast_back_op`] with block `(1, npc)`.
///
/// Errors: see [`crate::cast_back::validate`] (a zero `num_per_channels` is reported as
/// `x_block_size`).
pub fn per_token_cast_back<O: DequantElement>(
    data: QuantDataView<'_>,
    sf: ScaleView<'_>,
    num_per_channels: usize,
) -> Result<HostTensor<O>> {
    cast_back_op(&QuantInput::new(data, sf, (1, num_per_channels)))
}

/// `cast_back(x, fmt, x_block_size, x_special_fmt='e5m6')`: packed E5M6 `data` `(M, 3K/2)`
/// with scales `sf` for `block` to contiguous `(M, K)` fp32 or bf16.
///
/// Errors: see [`crate::cast_back::validate_e5m6`].
pub fn cast_back_e5m6<O: DequantElement>(
    data: &HostView<'_, E5M6Bytes>,
    sf: &ScaleView<'_>,
    block: (usize, usize),
) -> Result<HostTensor<O>> {
    validate_e5m6(data, sf, block)?;
    super::cast_back_from_e5m6(data, sf, block)
}

/// `per_token_cast_back(x, fmt, npc, x_special_fmt='e5m6')`: [`cast_back_e5m6`] with block
/// `(1, npc)` (`npc = K` for the output of an E5M6 cast).
pub fn per_token_cast_back_e5m6<O: DequantElement>(
    data: &HostView<'_, E5M6Bytes>,
    sf: &ScaleView<'_>,
    num_per_channels: usize,
) -> Result<HostTensor<O>> {
    cast_back_e5m6(data, sf, (1, num_per_channels))
}
