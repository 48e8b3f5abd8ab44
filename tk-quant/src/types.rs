//! Argument and result types of the casts (`spec/quant.md` §1, §2): target formats, plain and
//! quantized inputs (upstream's `QuantTensor`), quantized outputs, and the element types a cast
//! back can produce. Their validation is shared by the CPU references and the GPU ops.
//!
//! | type | what | dtype / shape |
//! |---|---|---|
//! | [`PlainInput`] | unquantized input | fp32 or bf16 `(M, K)`, unit column stride, any row stride |
//! | [`QuantDataView`] / [`QuantData`] | FP8 / FP4 data | e4m3 `(M, K)` or packed e2m1 `(M, K/2)` (even column in the low nibble) |
//! | [`QuantInput`] | data + its scales + its block | scales in layout A, B or C for the block `(bm, bk)` |
//! | [`CastInput`] | what the casts (`reference::cast`) accept | either of the above |
//!
//! `M` may be 0. `K` (the logical column count) must be at least 1: an op on zero columns is
//! rejected with [`TkError::Empty`] (upstream never produces one).

use float8::F8E4M3;
use half::bf16;
use tk_core::convert::{
    bf16_from_f32, e2m1_from_f32, e2m1_to_f32, e4m3_from_f32, e4m3_to_f32, QuantFormat,
};
use tk_core::dtype::E2M1x2;
use tk_core::{DType, Element, HostTensor, HostView, Layout, Result, TkError};

use crate::scale::{ScaleGrid, ScaleLayout, ScaleView};

// ---------------------------------------------------------------------------------------------
// Formats
// ---------------------------------------------------------------------------------------------

/// The target format of an FP8/FP4 cast (upstream's `fmt` string `'e4m3'` / `'e2m1'`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CastFormat {
    /// FP8 e4m3fn, one byte per value: `Q = 448`, `ε = 1e-4` (§1.1).
    E4M3,
    /// FP4 e2m1, two values per byte: `Q = 6`, `ε = 6 · 2^-126` (§1.2). `K` must be even.
    E2M1,
}

impl CastFormat {
    /// The matching [`QuantFormat`] (for [`tk_core::convert::compute_scale`]).
    pub const fn quant_format(self) -> QuantFormat {
        match self {
            CastFormat::E4M3 => QuantFormat::E4M3,
            CastFormat::E2M1 => QuantFormat::E2M1,
        }
    }

    /// `Q`: 448 or 6.
    pub const fn max_value(self) -> f32 {
        self.quant_format().max_value()
    }

    /// Logical values per stored byte: 1 (e4m3) or 2 (e2m1).
    pub const fn values_per_byte(self) -> usize {
        match self {
            CastFormat::E4M3 => 1,
            CastFormat::E2M1 => 2,
        }
    }

    /// Encodes one value with the kernels' conversion: an e4m3 byte
    /// ([`tk_core::convert::e4m3_from_f32`], RNE, saturating, NaN → `0x7F`) or an e2m1 nibble
    /// ([`tk_core::convert::e2m1_from_f32`], RNE, saturating, NaN → 7).
    pub fn encode(self, v: f32) -> u8 {
        match self {
            CastFormat::E4M3 => e4m3_from_f32(v),
            CastFormat::E2M1 => e2m1_from_f32(v),
        }
    }

    /// `codes[i] = encode(fl(values[i] · inv))` over the shorter of the two slices: the step
    /// of every cast reference, with the format chosen once for the group (a `match` per
    /// element kept the references' inner loop from being inlined: 2.5x slower).
    pub(crate) fn encode_scaled(self, codes: &mut [u8], values: &[f32], inv: f32) {
        fn each(codes: &mut [u8], values: &[f32], inv: f32, enc: impl Fn(f32) -> u8) {
            for (c, &v) in codes.iter_mut().zip(values) {
                *c = enc(v * inv);
            }
        }
        match self {
            CastFormat::E4M3 => each(codes, values, inv, e4m3_from_f32),
            CastFormat::E2M1 => each(codes, values, inv, e2m1_from_f32),
        }
    }

    /// Decodes one e4m3 byte or e2m1 nibble exactly.
    pub fn decode(self, code: u8) -> f32 {
        match self {
            CastFormat::E4M3 => e4m3_to_f32(code),
            CastFormat::E2M1 => e2m1_to_f32(code),
        }
    }
}

/// An element type a cast back can produce: `f32` (identity) or `bf16` (round to nearest
/// even, [`tk_core::convert::bf16_from_f32`]). Sealed.
pub trait DequantElement: Element + sealed::Sealed {
    /// Converts the fp32 product `fl(dec(q) · sf)` to this type.
    fn from_f32(v: f32) -> Self;
}

impl DequantElement for f32 {
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl DequantElement for bf16 {
    fn from_f32(v: f32) -> Self {
        bf16_from_f32(v)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
}

// ---------------------------------------------------------------------------------------------
// Matrix validation
// ---------------------------------------------------------------------------------------------

/// Checks that `layout` is a 2-D matrix with unit column stride (any row stride) and returns
/// its `(rows, cols)`. The column stride is not checked when there is at most one column or no
/// row. Errors name `arg`.
pub fn check_matrix(arg: &'static str, layout: &Layout) -> Result<(usize, usize)> {
    if layout.rank() != 2 {
        return Err(TkError::Shape {
            arg,
            expected: "rank 2 (rows, columns)".into(),
            got: layout.shape().to_vec(),
        });
    }
    let (rows, cols) = (layout.shape()[0], layout.shape()[1]);
    if rows > 0 && cols > 1 && layout.strides()[1] != 1 {
        return Err(TkError::Stride {
            arg,
            expected: "unit column stride (stride(1) == 1); any row stride is accepted".into(),
            got: layout.strides().to_vec(),
        });
    }
    Ok((rows, cols))
}

/// Rejects zero logical columns.
pub(crate) fn check_nonempty_k(arg: &'static str, layout: &Layout, k: usize) -> Result<()> {
    if k == 0 {
        return Err(TkError::Empty {
            arg,
            shape: layout.shape().to_vec(),
        });
    }
    Ok(())
}

/// `fl(a · b)` as the GPU computes it: a NaN result is the GPU's canonical NaN `0x7FFFFFFF`
/// (a CPU keeps an input NaN's payload, or makes `0xFFC00000` of `inf · 0`). The references use
/// it wherever a product's NaN bits reach the output: the fp32 results of the casts back, and
/// the E5M6 encoder, which reads the product's low 17 bits.
#[cfg(feature = "cpu")]
pub(crate) fn gpu_mul(a: f32, b: f32) -> f32 {
    let p = a * b;
    if p.is_nan() {
        f32::from_bits(0x7FFF_FFFF)
    } else {
        p
    }
}

/// Row `r` of a view validated by [`check_matrix`] (`r < rows`), as a slice.
#[cfg(feature = "cpu")]
pub(crate) fn row<'v, T: Element>(view: &HostView<'v, T>, r: usize) -> &'v [T] {
    let cols = view.shape()[1];
    if cols == 0 {
        return &[];
    }
    // The view lies inside its buffer and its columns are adjacent (or there is one column).
    let start = view.layout().index(&[r, 0]);
    &view.raw_data()[start..start + cols]
}

// ---------------------------------------------------------------------------------------------
// Plain input
// ---------------------------------------------------------------------------------------------

/// An unquantized input `(M, K)`: fp32 or bf16, unit column stride, any row stride. Values are
/// widened to fp32 exactly.
#[derive(Debug, Clone)]
pub enum PlainInput<'a> {
    /// fp32 `(M, K)`.
    F32(HostView<'a, f32>),
    /// bf16 `(M, K)`.
    BF16(HostView<'a, bf16>),
}

impl<'a> From<HostView<'a, f32>> for PlainInput<'a> {
    fn from(v: HostView<'a, f32>) -> Self {
        PlainInput::F32(v)
    }
}

impl<'a> From<HostView<'a, bf16>> for PlainInput<'a> {
    fn from(v: HostView<'a, bf16>) -> Self {
        PlainInput::BF16(v)
    }
}

impl PlainInput<'_> {
    /// [`DType::F32`] or [`DType::BF16`].
    pub fn dtype(&self) -> DType {
        match self {
            PlainInput::F32(_) => DType::F32,
            PlainInput::BF16(_) => DType::BF16,
        }
    }

    /// The view's layout.
    pub fn layout(&self) -> &Layout {
        match self {
            PlainInput::F32(v) => v.layout(),
            PlainInput::BF16(v) => v.layout(),
        }
    }

    /// Validates the input ([`check_matrix`], `K >= 1`) and returns `(M, K)`. Errors name
    /// `arg`.
    pub fn validate(&self, arg: &'static str) -> Result<(usize, usize)> {
        let (m, k) = check_matrix(arg, self.layout())?;
        check_nonempty_k(arg, self.layout(), k)?;
        Ok((m, k))
    }

    /// Appends row `r` widened to fp32 to `out` (after [`PlainInput::validate`], `r < M`).
    #[cfg(feature = "cpu")]
    pub(crate) fn push_row(&self, r: usize, out: &mut Vec<f32>) {
        match self {
            PlainInput::F32(v) => out.extend_from_slice(row(v, r)),
            PlainInput::BF16(v) => out.extend(row(v, r).iter().map(|x| x.to_f32())),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Quantized data
// ---------------------------------------------------------------------------------------------

/// Borrowed quantized data: FP8 e4m3 `(M, K)` or packed FP4 e2m1 `(M, K/2)`, unit column
/// stride, any row stride.
#[derive(Debug, Clone)]
pub enum QuantDataView<'a> {
    /// FP8 e4m3fn `(M, K)`.
    E4M3(HostView<'a, F8E4M3>),
    /// FP4 e2m1 `(M, K/2)`: byte `j` holds logical column `2j` (low nibble) and `2j+1` (high).
    E2M1(HostView<'a, E2M1x2>),
}

impl QuantDataView<'_> {
    /// The data's format.
    pub fn format(&self) -> CastFormat {
        match self {
            QuantDataView::E4M3(_) => CastFormat::E4M3,
            QuantDataView::E2M1(_) => CastFormat::E2M1,
        }
    }

    /// [`DType::E4M3`] or [`DType::E2M1x2`].
    pub fn dtype(&self) -> DType {
        match self {
            QuantDataView::E4M3(_) => DType::E4M3,
            QuantDataView::E2M1(_) => DType::E2M1x2,
        }
    }

    /// The view's (physical) layout.
    pub fn layout(&self) -> &Layout {
        match self {
            QuantDataView::E4M3(v) => v.layout(),
            QuantDataView::E2M1(v) => v.layout(),
        }
    }

    /// Validates the data ([`check_matrix`], `K >= 1`) and returns the logical `(M, K)`
    /// (`K` = 2 × byte columns for e2m1). Errors name `arg`.
    pub fn validate(&self, arg: &'static str) -> Result<(usize, usize)> {
        let (m, cols) = check_matrix(arg, self.layout())?;
        let k = cols * self.format().values_per_byte();
        check_nonempty_k(arg, self.layout(), k)?;
        Ok((m, k))
    }

    /// Appends the decoded logical row `r` (exact fp32) to `out` (after validation, `r < M`).
    #[cfg(feature = "cpu")]
    pub(crate) fn push_decoded_row(&self, r: usize, out: &mut Vec<f32>) {
        match self {
            QuantDataView::E4M3(v) => {
                out.extend(row(v, r).iter().map(|b| e4m3_to_f32(b.to_bits())))
            }
            QuantDataView::E2M1(v) => {
                for b in row(v, r) {
                    let (lo, hi) = tk_core::convert::unpack_e2m1(b.0);
                    out.push(e2m1_to_f32(lo));
                    out.push(e2m1_to_f32(hi));
                }
            }
        }
    }
}

/// Owned, contiguous quantized data: FP8 e4m3 `(M, K)` or packed FP4 e2m1 `(M, K/2)`.
///
/// Equality is bitwise (same format, shape and bytes), unlike `float8::F8E4M3`'s own
/// floating-point `==` (under which NaN ≠ NaN and +0 == −0).
#[derive(Debug, Clone)]
pub enum QuantData {
    /// FP8 e4m3fn `(M, K)`.
    E4M3(HostTensor<F8E4M3>),
    /// FP4 e2m1 `(M, K/2)`, even logical column in the low nibble.
    E2M1(HostTensor<E2M1x2>),
}

impl PartialEq for QuantData {
    fn eq(&self, other: &Self) -> bool {
        self.format() == other.format()
            && self.shape() == other.shape()
            && self.bytes() == other.bytes()
    }
}

impl Eq for QuantData {}

impl QuantData {
    /// Builds the data from one code per logical element (`codes.len() == m · k`, row-major;
    /// e4m3 bytes, or e2m1 nibbles packed in pairs; `k` even for e2m1).
    #[cfg(feature = "cpu")]
    pub(crate) fn from_codes(fmt: CastFormat, m: usize, k: usize, codes: &[u8]) -> Result<Self> {
        Ok(match fmt {
            CastFormat::E4M3 => QuantData::E4M3(HostTensor::from_vec(
                codes.iter().map(|&c| F8E4M3::from_bits(c)).collect(),
                &[m, k],
            )?),
            CastFormat::E2M1 => QuantData::E2M1(HostTensor::from_vec(
                codes
                    .chunks_exact(2)
                    .map(|p| E2M1x2(tk_core::convert::pack_e2m1(p[0], p[1])))
                    .collect(),
                &[m, k / 2],
            )?),
        })
    }

    /// The data's format.
    pub fn format(&self) -> CastFormat {
        match self {
            QuantData::E4M3(_) => CastFormat::E4M3,
            QuantData::E2M1(_) => CastFormat::E2M1,
        }
    }

    /// The stored shape: `(M, K)` for e4m3, `(M, K/2)` for e2m1.
    pub fn shape(&self) -> &[usize] {
        match self {
            QuantData::E4M3(t) => t.shape(),
            QuantData::E2M1(t) => t.shape(),
        }
    }

    /// The logical shape `(M, K)`.
    pub fn logical_shape(&self) -> (usize, usize) {
        let s = self.shape();
        (s[0], s[1] * self.format().values_per_byte())
    }

    /// The stored bytes, row-major.
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            QuantData::E4M3(t) => t.as_slice().iter().map(|b| b.to_bits()).collect(),
            QuantData::E2M1(t) => t.as_slice().iter().map(|b| b.0).collect(),
        }
    }

    /// A borrowed view of the whole tensor.
    pub fn view(&self) -> QuantDataView<'_> {
        match self {
            QuantData::E4M3(t) => QuantDataView::E4M3(t.view()),
            QuantData::E2M1(t) => QuantDataView::E2M1(t.view()),
        }
    }

    /// The e4m3 tensor, if this is e4m3 data.
    pub fn as_e4m3(&self) -> Option<&HostTensor<F8E4M3>> {
        match self {
            QuantData::E4M3(t) => Some(t),
            QuantData::E2M1(_) => None,
        }
    }

    /// The packed e2m1 tensor, if this is e2m1 data.
    pub fn as_e2m1(&self) -> Option<&HostTensor<E2M1x2>> {
        match self {
            QuantData::E2M1(t) => Some(t),
            QuantData::E4M3(_) => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Quantized input (upstream's `QuantTensor` with its block size)
// ---------------------------------------------------------------------------------------------

/// A quantized tensor `(data, sf)` with the block `(bm, bk)` its scales cover: the input of a
/// cast back, or of a requantizing cast. Each logical element dequantizes to
/// `fl(dec(data[r, c]) · S[r / bm, c / bk])` (§2.1 step 1, §2.2).
#[derive(Debug, Clone)]
pub struct QuantInput<'a> {
    /// The data (argument name `x`).
    pub data: QuantDataView<'a>,
    /// Its scales (argument name `x.sf`), in any layout [`crate::scale::detect_scale_layout`]
    /// accepts, of shape `(ceil(M/bm), ceil(K/bk))` (fp32) or `(ceil(M/bm), ceil(nbk/4))`
    /// (packed).
    pub sf: ScaleView<'a>,
    /// The scale block `(bm, bk)` (argument name `x_block_size`), both at least 1.
    pub block: (usize, usize),
}

/// The validated geometry of a [`QuantInput`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantGeometry {
    /// Rows.
    pub m: usize,
    /// Logical columns.
    pub k: usize,
    /// The input scale grid.
    pub grid: ScaleGrid,
    /// The detected layout of the input scales.
    pub sf_layout: ScaleLayout,
}

impl<'a> QuantInput<'a> {
    /// Bundles data, scales and block.
    pub fn new(data: QuantDataView<'a>, sf: ScaleView<'a>, block: (usize, usize)) -> Self {
        Self { data, sf, block }
    }

    /// Validates data (`x`), block (`x_block_size`) and scales (`x.sf`: layout detection per
    /// §1.5 and shape against the grid).
    pub fn validate(&self) -> Result<QuantGeometry> {
        let (m, k) = self.data.validate("x")?;
        let grid = ScaleGrid::for_matrix_arg(m, k, self.block, "x_block_size")?;
        let sf_layout = self.sf.check("x.sf", &grid)?;
        Ok(QuantGeometry {
            m,
            k,
            grid,
            sf_layout,
        })
    }

    /// Appends the dequantized logical row `r`, `fl(dec(data) · S)` per element, to `out`
    /// (after [`QuantInput::validate`], `r < M`).
    #[cfg(feature = "cpu")]
    pub(crate) fn push_dequantized_row(&self, r: usize, out: &mut Vec<f32>) {
        let start = out.len();
        self.data.push_decoded_row(r, out);
        let (bm, bk) = self.block;
        for (c, v) in out[start..].iter_mut().enumerate() {
            // In range by validation: r / bm < nbm and c / bk < nbk.
            let s = self.sf.get(r / bm, c / bk).unwrap_or(f32::NAN);
            *v = gpu_mul(*v, s);
        }
    }
}

/// The input of the casts (`reference::cast`): plain values, or quantized data with its scales
/// (a requantization).
#[derive(Debug, Clone)]
pub enum CastInput<'a> {
    /// fp32 / bf16 values.
    Plain(PlainInput<'a>),
    /// FP8 / FP4 data with scales for `block`.
    Quantized(QuantInput<'a>),
}

impl<'a> From<PlainInput<'a>> for CastInput<'a> {
    fn from(x: PlainInput<'a>) -> Self {
        CastInput::Plain(x)
    }
}

impl<'a> From<QuantInput<'a>> for CastInput<'a> {
    fn from(x: QuantInput<'a>) -> Self {
        CastInput::Quantized(x)
    }
}

impl<'a> From<HostView<'a, f32>> for CastInput<'a> {
    fn from(v: HostView<'a, f32>) -> Self {
        CastInput::Plain(PlainInput::F32(v))
    }
}

impl<'a> From<HostView<'a, bf16>> for CastInput<'a> {
    fn from(v: HostView<'a, bf16>) -> Self {
        CastInput::Plain(PlainInput::BF16(v))
    }
}
