//! CPU reference of the per-row E5M6 cast and its inverse: upstream's `cast_to_e5m6` /
//! `per_token_cast_to_e5m6` (`spec/quant.md` §3.2) and `cast_back_from_e5m6` /
//! `cast_back_e5m6` (§3.9).
//!
//! # What [`cast_to_e5m6`] computes
//!
//! Input fp32/bf16 `(M, K)`, `K % 8 == 0`, any row stride; one scale per row
//! (`num_per_channels == K`, grid `(M, 1)`). For each row:
//!
//! 1. `amax = max |x|` (NaN ignored, as CUDA's `fmaxf`); `c = max(amax, 1e-4)`, `Q = 65024`.
//! 2. Non-rounded `sf = fl(c/65024)`, `inv = fl(65024/c)`; rounded `sf = 2^e`, `inv = 2^-e`
//!    with `e = ceil(log2(c/Q))` ([`tk_core::convert::compute_scale`]).
//! 3. Codes `enc12(fl(x · inv))` ([`tk_core::convert::e5m6_from_f32`], the kernel's rule: RNE on
//!    the E5M6 grid for `2^-14 <= |v| < 65536`, the documented quirk below `2^-14`), packed 8
//!    per 12 bytes ([`tk_core::convert::pack_e5m6`]): output bytes `(M, 3K/2)`.
//! 4. `sf` stored in layout A, B or C (C: an int32 `(M, 1)` whose byte 0 is `e + 127`, bytes 1–3
//!    zero).
//!
//! Deviations / choices (all in inputs upstream never produces):
//! * Packed scales without `round_sf` are rejected (upstream's kernel stores garbage, its
//!   reference the floor exponent byte), as everywhere in this crate.
//! * A NaN product `x · inv` (a NaN input, or `inf · 0` in a row with an infinite `amax`) is
//!   encoded from the GPU's canonical NaN `0x7FFFFFFF` (code `0x800`), as the kernel does;
//!   likewise a NaN product in the cast back is that NaN.
//! * An infinite `amax` follows the kernel (rounded: `inv = −inf` from the wrapped exponent);
//!   upstream's reference clamps that exponent and uses `inv = 0`. Scaled values never reach
//!   `65536`, where the kernel's and reference's round-toward-zero conversions differ; the
//!   encoder used is the kernel's.
//!
//! [`cast_back_from_e5m6`] is exact: `out = convert(fl(dec12(code) · S[r/bm, c/bk]))`, codes
//! `0x7C0` and above (in magnitude) decoding to ±inf / NaN. Upstream's reference also asserts
//! `K % bk == 0`; a partial last block has a well-defined meaning (the grid uses `ceil`, as in
//! [`crate::reference::cast_back`]) and is accepted here.

use tk_core::convert::{
    compute_scale, e5m6_from_f32, e5m6_to_f32, pack_e5m6, unpack_e5m6, QuantFormat,
};
use tk_core::dtype::E5M6Bytes;
use tk_core::{HostTensor, HostView, Result, TkError};

use crate::scale::{HostScales, ScaleGrid, ScaleOptions, ScaleView};
use crate::types::{check_matrix, gpu_mul, row, DequantElement, PlainInput};

/// Casts `x` `(M, K)` (fp32 or bf16, `K % 8 == 0`) to packed E5M6 with one scale per row
/// (§3.2). Returns the bytes `(M, 3K/2)` (contiguous) and the scales, grid `(M, 1)` in the
/// layout `opts` selects. See the [module docs](self).
///
/// Errors: `opts` ([`ScaleOptions::layout`]), `x` (rank, column stride, `K = 0`,
/// `K % 8 != 0`).
pub fn cast_to_e5m6(
    x: &PlainInput<'_>,
    opts: ScaleOptions,
) -> Result<(HostTensor<E5M6Bytes>, HostScales)> {
    let layout = opts.layout()?;
    let (m, k) = x.validate("x")?;
    if k % 8 != 0 {
        return Err(TkError::Shape {
            arg: "x",
            expected: "K % 8 == 0 columns (E5M6 packs 8 values into 12 bytes)".into(),
            got: vec![m, k],
        });
    }
    let mut scales = HostScales::zeros(layout, ScaleGrid::new(m, 1)?);
    let mut bytes = Vec::with_capacity(m * (3 * k / 2));
    let mut vals = Vec::with_capacity(k);
    for r in 0..m {
        vals.clear();
        x.push_row(r, &mut vals);
        let amax = vals.iter().fold(0.0f32, |acc, v| acc.max(v.abs()));
        let (sf, inv) = compute_scale(amax, QuantFormat::E5M6, opts.round_sf);
        scales.set(r, 0, sf);
        for group in vals.chunks_exact(8) {
            let codes: [u16; 8] = std::array::from_fn(|i| e5m6_from_f32(gpu_mul(group[i], inv)));
            bytes.extend(pack_e5m6(&codes).map(E5M6Bytes));
        }
    }
    Ok((HostTensor::from_vec(bytes, &[m, 3 * k / 2])?, scales))
}

/// Dequantizes packed E5M6 `data` `(M, 3K/2)` (unit column stride, any row stride;
/// `K % 8 == 0`) with scales `sf` for `block = (bm, bk)` (§3.9):
/// `out[r, c] = O::from_f32(fl(dec12(code[r, c]) · S[r/bm, c/bk]))`, contiguous `(M, K)`.
///
/// `sf` is read by the §1.5 rules ([`ScaleView::check`]): fp32 `(ceil(M/bm), ceil(K/bk))` or
/// packed int32 `(ceil(M/bm), ceil(nbk/4))`.
///
/// Errors: `x` (rank, column stride, no columns, byte columns not a multiple of 12),
/// `x_block_size` (0), `x.sf` (dtype, strides, shape).
pub fn cast_back_from_e5m6<O: DequantElement>(
    data: &HostView<'_, E5M6Bytes>,
    sf: &ScaleView<'_>,
    block: (usize, usize),
) -> Result<HostTensor<O>> {
    let (m, p) = check_matrix("x", data.layout())?;
    if p == 0 {
        return Err(TkError::Empty {
            arg: "x",
            shape: data.shape().to_vec(),
        });
    }
    if p % 12 != 0 {
        return Err(TkError::Shape {
            arg: "x",
            expected: "(M, 3K/2) bytes with K % 8 == 0, i.e. a multiple of 12 byte columns".into(),
            got: data.shape().to_vec(),
        });
    }
    let k = p / 3 * 2;
    let grid = ScaleGrid::for_matrix_arg(m, k, block, "x_block_size")?;
    sf.check("x.sf", &grid)?;
    let (bm, bk) = block;
    let mut out = Vec::with_capacity(m * k);
    for r in 0..m {
        for (g, chunk) in row(data, r).chunks_exact(12).enumerate() {
            let bytes: [u8; 12] = std::array::from_fn(|i| chunk[i].0);
            for (i, code) in unpack_e5m6(&bytes).into_iter().enumerate() {
                let c = 8 * g + i;
                // In range by the shape check: r / bm < nbm, c / bk < nbk.
                let s = sf.get(r / bm, c / bk).unwrap_or(f32::NAN);
                out.push(O::from_f32(gpu_mul(e5m6_to_f32(code), s)));
            }
        }
    }
    HostTensor::from_vec(out, &[m, k])
}
