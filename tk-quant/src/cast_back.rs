//! `cast_back` / `per_token_cast_back` (`spec/quant.md` §3.8) and their E5M6 variant
//! `cast_back(..., x_special_fmt='e5m6')` = `cast_back_e5m6` (§3.9): dequantization to fp32 or
//! bf16.
//!
//! # What it computes
//!
//! `out[r, c] = convert(fl(dec(data[r, c]) · S[r / bm, c / bk]))`, exactly:
//! * `dec` is exact: e4m3, e2m1 (even column in the low nibble), or E5M6 (the binary16
//!   pattern `code << 4`; codes `0x7C0` and above in magnitude are ±inf / NaN);
//! * scales are read in layout A, B or C by the reader rules of §1.5
//!   ([`crate::scale::detect_scale_layout`]); a UE8M0 byte `b` is the fp32 with bits `b << 23`
//!   (byte 0 is +0.0, 255 is +inf);
//! * `convert` is the identity for fp32 and round-to-nearest-even for bf16
//!   ([`crate::DequantElement`]).
//!
//! `per_token_cast_back(x, npc)` is `cast_back` with block `(1, npc)`.
//!
//! | argument | dtype | shape | notes |
//! |---|---|---|---|
//! | `x.data` | e4m3 / packed e2m1 | `(M, K)` / `(M, K/2)`, logical `K % 64 == 0` | unit column stride, any row stride |
//! | `x.data` (E5M6) | packed E5M6 bytes | `(M, 3K/2)`, `K % 8 == 0` | unit column stride, any row stride |
//! | `x.sf` | fp32 / packed UE8M0 int32 | grid `(ceil(M/bm), ceil(K/bk))` | layout A, B or C |
//! | `out` | fp32 / bf16 | `(M, K)` | contiguous |
//!
//! # Preconditions
//!
//! * FP8/FP4 ([`validate`]): logical `K % 64 == 0`; any block `(bm, bk)` with both sides at
//!   least 1 (partial blocks allowed).
//! * E5M6 ([`validate_e5m6`]): `K % 8 == 0` (byte columns a multiple of 12); any block.
//! * The output dtype (upstream's `fmt` ∈ {`'bf16'`, `'fp32'`}) is the type parameter of the
//!   CPU functions, so no other value can be asked for.
//!
//! # Deviations from upstream
//!
//! * **Any row stride** of the data is accepted (upstream requires it contiguous).
//! * **E5M6 with a partial last column block** (`K % bk != 0`) is accepted: the grid uses
//!   `ceil` as everywhere else (upstream's reference asserts `K % bk == 0`, its kernel does
//!   not).
//! * Input scales must have exactly the grid's shape (upstream's reference would also crop a
//!   larger tensor).

use tk_core::dtype::E5M6Bytes;
use tk_core::{HostView, Result, TkError};

use crate::plan::{require_multiple, CastPlan};
use crate::scale::{ScaleGrid, ScaleLayout, ScaleView};
use crate::types::{check_matrix, QuantInput};

/// Validates a cast back of FP8/FP4 `x` (see the [module docs](self)) and returns its plan:
/// block `x.block`, the input scale grid and the detected layout of `x.sf`.
///
/// Errors: `x` (rank, column stride, `K = 0`, logical `K % 64 != 0`), `x_block_size` (0),
/// `x.sf` (dtype, strides, shape; see [`QuantInput::validate`]).
pub fn validate(x: &QuantInput<'_>) -> Result<CastPlan> {
    let g = x.validate()?;
    validate_dims(g.m, g.k, x.block, g.sf_layout)
}

/// The device-independent part of [`validate`]: logical size `(m, k)`, block and the detected
/// layout of the input scales.
pub fn validate_dims(
    m: usize,
    k: usize,
    block: (usize, usize),
    sf_layout: ScaleLayout,
) -> Result<CastPlan> {
    require_multiple(
        "x",
        &[m, k],
        "K",
        k,
        64,
        "cast_back tiles logical columns by 64",
    )?;
    CastPlan::new_arg(m, k, block, sf_layout, "x_block_size")
}

/// Validates a cast back of packed E5M6 `data` `(M, 3K/2)` with scales `sf` for `block` and
/// returns its plan.
///
/// Errors: `x` (rank, column stride, no columns, byte columns not a multiple of 12, i.e.
/// `K % 8 != 0`), `x_block_size` (0), `x.sf` (dtype, strides, shape).
pub fn validate_e5m6(
    data: &HostView<'_, E5M6Bytes>,
    sf: &ScaleView<'_>,
    block: (usize, usize),
) -> Result<CastPlan> {
    let (m, p) = check_matrix("x", data.layout())?;
    if p == 0 {
        return Err(TkError::Empty {
            arg: "x",
            shape: data.shape().to_vec(),
        });
    }
    require_multiple(
        "x",
        data.shape(),
        "3K/2 (byte columns)",
        p,
        12,
        "E5M6 packs 8 values into 12 bytes, so K % 8 == 0",
    )?;
    let k = p / 3 * 2;
    let grid = ScaleGrid::for_matrix_arg(m, k, block, "x_block_size")?;
    let layout = sf.check("x.sf", &grid)?;
    CastPlan::new_arg(m, k, block, layout, "x_block_size")
}
