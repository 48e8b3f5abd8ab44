//! Scale factors: options, layouts, grid geometry, a host scale tensor and the reader rules of
//! `spec/quant.md` §1.4–§1.5, shared by every cast and cast back.
//!
//! A cast with block `(bm, bk)` over an `(M, K)` input has one scale per block: the logical
//! grid `S[mb, kb]`, `mb < nbm = ceil(M/bm)`, `kb < nbk = ceil(K/bk)` ([`ScaleGrid`]). Each
//! stored value is the **dequantization multiplier** `sf` (`x ≈ dec(q) · sf`). Three physical
//! layouts exist ([`ScaleLayout`]), chosen by three flags ([`ScaleOptions`]):
//!
//! | layout | flags `(round_sf, col, packed)` | dtype / shape | strides (elements) | storage |
//! |---|---|---|---|---|
//! | A [`ScaleLayout::RowMajorF32`] | `(_, false, false)` | fp32 `(nbm, nbk)` | `(nbk, 1)` | `nbm · nbk` floats |
//! | B [`ScaleLayout::ColMajorF32`] | `(_, true, false)` | fp32 `(nbm, nbk)` | `(1, align(nbm,4))` | `nbk` columns of `align(nbm,4)` floats |
//! | C [`ScaleLayout::PackedUe8m0`] | `(true, true, true)` | int32 `(nbm, ceil(nbk/4))` | `(1, align(nbm,4))` | `ceil(nbk/4)` columns of `align(nbm,4)` int32 |
//!
//! In layout C the int32 at `[mb, j]` holds four UE8M0 bytes, byte `b` (least significant
//! first, which is also the memory order) being the exponent byte `e + 127` of `S[mb, 4j + b]`;
//! the byte address of `S[mb, kb]` is `4·((kb/4)·align(nbm,4) + mb) + kb%4`
//! ([`ScaleGrid::packed_byte_offset`]). A UE8M0 byte `b` decodes to the fp32 with bits `b << 23`
//! (so `0` is +0.0 and `255` is +inf; [`tk_core::convert::ue8m0_to_f32`]).
//!
//! **Padding is defined: zeros.** Rows `nbm..align(nbm,4)` of layouts B and C, and the bytes of
//! layout C with `4j + b >= nbk`, are padding. Upstream's kernels leave them uninitialised and
//! its reference writes 0 (its tests zero them with `clear_unused_sf` before comparing).
//! [`HostScales`] always holds +0.0 / 0x00 there, which is compatible with both; the GPU
//! kernels of this crate must write zeros there too.
//!
//! **Rejected combinations.** Packed scales without `round_sf` (a non-power-of-two scale has no
//! UE8M0 byte) and packed scales without the column-major flag (upstream's kernel mis-indexes
//! that buffer and its reference silently ignores the flag) are errors here (§1.5 Ambiguity),
//! everywhere in this crate.
//!
//! **Empty grids.** For `nbm == 0` the column-major layouts report strides `(1, 1)` (what
//! PyTorch gives the transposed empty tensor upstream returns); strides of empty tensors carry
//! no meaning and are never checked.

use tk_core::convert::{pack_ue8m0x4, ue8m0_from_pow2, ue8m0_to_f32, unpack_ue8m0x4};
use tk_core::dtype::Ue8m0x4;
use tk_core::{DType, HostView, Layout, Result, TkError};

// ---------------------------------------------------------------------------------------------
// Options and layouts
// ---------------------------------------------------------------------------------------------

/// The three scale flags of every upstream cast (`round_sf`, `use_tma_aligned_col_major_sf`,
/// `use_packed_ue8m0`), all `false` by default.
///
/// Validate them with [`ScaleOptions::layout`]; `round_sf` additionally selects power-of-two
/// ("UE8M0") scales in every layout (§1.4 step 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ScaleOptions {
    /// Round each scale up to a power of two (`sf = 2^ceil(log2(c/Q))`, §1.4).
    pub round_sf: bool,
    /// Store the scales column-major with the row count padded to a multiple of 4 (layout B, or
    /// C together with `use_packed_ue8m0`).
    pub use_tma_aligned_col_major_sf: bool,
    /// Store the scales as packed UE8M0 bytes, four per int32 (layout C). Requires both other
    /// flags.
    pub use_packed_ue8m0: bool,
}

impl ScaleOptions {
    /// Layout A (row-major fp32) with the given rounding.
    pub const fn row_major(round_sf: bool) -> Self {
        Self {
            round_sf,
            use_tma_aligned_col_major_sf: false,
            use_packed_ue8m0: false,
        }
    }

    /// Layout B (TMA-aligned column-major fp32) with the given rounding.
    pub const fn col_major(round_sf: bool) -> Self {
        Self {
            round_sf,
            use_tma_aligned_col_major_sf: true,
            use_packed_ue8m0: false,
        }
    }

    /// Layout C (packed UE8M0, column-major); implies `round_sf`.
    pub const fn packed_ue8m0() -> Self {
        Self {
            round_sf: true,
            use_tma_aligned_col_major_sf: true,
            use_packed_ue8m0: true,
        }
    }

    /// Validates the flags and returns the layout they select.
    ///
    /// Errors ([`TkError::Param`] naming `use_packed_ue8m0`) for `use_packed_ue8m0` without
    /// `round_sf`, or without `use_tma_aligned_col_major_sf` (§1.5 Ambiguity; upstream accepts
    /// both and produces garbage or silently ignores the flag).
    pub fn layout(&self) -> Result<ScaleLayout> {
        match (
            self.round_sf,
            self.use_tma_aligned_col_major_sf,
            self.use_packed_ue8m0,
        ) {
            (_, false, false) => Ok(ScaleLayout::RowMajorF32),
            (_, true, false) => Ok(ScaleLayout::ColMajorF32),
            (true, true, true) => Ok(ScaleLayout::PackedUe8m0),
            (false, false, true) => Err(TkError::param(
                "use_packed_ue8m0",
                "packed UE8M0 scales need round_sf = true and use_tma_aligned_col_major_sf = \
                 true (layout C); set both, or clear use_packed_ue8m0",
            )),
            (false, true, true) => Err(TkError::param(
                "use_packed_ue8m0",
                "packed UE8M0 scales need round_sf = true (a scale that is not a power of two \
                 has no UE8M0 byte); set round_sf = true, or clear use_packed_ue8m0",
            )),
            (true, false, true) => Err(TkError::param(
                "use_packed_ue8m0",
                "packed UE8M0 scales exist only column-major (layout C); set \
                 use_tma_aligned_col_major_sf = true, or clear use_packed_ue8m0",
            )),
        }
    }
}

/// The physical layout of a scale tensor (§1.5). See the [module docs](self) for the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleLayout {
    /// Layout A: fp32 `(nbm, nbk)`, row-major, contiguous.
    RowMajorF32,
    /// Layout B: fp32 `(nbm, nbk)`, strides `(1, align(nbm,4))`, zero padding rows.
    ColMajorF32,
    /// Layout C: int32 `(nbm, ceil(nbk/4))` of packed UE8M0 bytes, strides `(1, align(nbm,4))`,
    /// zero padding bytes.
    PackedUe8m0,
}

impl ScaleLayout {
    /// The element type of the tensor: [`DType::F32`] for A and B, [`DType::UE8M0x4`] (an
    /// int32) for C.
    pub const fn dtype(self) -> DType {
        match self {
            ScaleLayout::RowMajorF32 | ScaleLayout::ColMajorF32 => DType::F32,
            ScaleLayout::PackedUe8m0 => DType::UE8M0x4,
        }
    }

    /// True for the column-major layouts B and C.
    pub const fn is_col_major(self) -> bool {
        !matches!(self, ScaleLayout::RowMajorF32)
    }

    /// True for layout C.
    pub const fn is_packed(self) -> bool {
        matches!(self, ScaleLayout::PackedUe8m0)
    }
}

// ---------------------------------------------------------------------------------------------
// Grid geometry
// ---------------------------------------------------------------------------------------------

/// `align(n, 4)`, `None` on overflow.
fn align4(n: usize) -> Option<usize> {
    n.checked_next_multiple_of(4)
}

/// The logical scale grid `(nbm, nbk)` and its storage geometry in each layout (§1.5
/// "Allocation and trimming").
///
/// | layout | tensor shape | strides | storage (allocation) shape, row-major |
/// |---|---|---|---|
/// | A | `(nbm, nbk)` | `(nbk, 1)` | `(nbm, nbk)` fp32 |
/// | B | `(nbm, nbk)` | `(1, align(nbm,4))` | `(nbk, align(nbm,4))` fp32 |
/// | C | `(nbm, ceil(nbk/4))` | `(1, align(nbm,4))` | `(ceil(nbk/4), align(nbm,4))` int32 = uint8 `(ceil(nbk/4), align(4·nbm,16))` |
///
/// The tensor is the transpose of the storage's first `nbm` columns, exactly as upstream's
/// `alloc_scaling_factors` / `cast_epilogue` build it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScaleGrid {
    nbm: usize,
    nbk: usize,
    /// `align(nbm, 4)`.
    rows_aligned: usize,
}

impl ScaleGrid {
    /// The grid of a cast of an `(m, k)` input with scale block `block = (bm, bk)`:
    /// `(ceil(m/bm), ceil(k/bk))`.
    ///
    /// Errors: [`TkError::Param`] naming `block_size` if `bm` or `bk` is 0; see
    /// [`ScaleGrid::new`] for size limits.
    pub fn for_matrix(m: usize, k: usize, block: (usize, usize)) -> Result<Self> {
        Self::for_matrix_arg(m, k, block, "block_size")
    }

    /// [`ScaleGrid::for_matrix`] with the block argument's name for errors.
    pub(crate) fn for_matrix_arg(
        m: usize,
        k: usize,
        block: (usize, usize),
        arg: &'static str,
    ) -> Result<Self> {
        let (bm, bk) = block;
        if bm == 0 || bk == 0 {
            return Err(TkError::param(
                arg,
                format!("block sizes must be at least 1, got ({bm}, {bk})"),
            ));
        }
        Self::new(m.div_ceil(bm), k.div_ceil(bk))
    }

    /// A grid of `nbm × nbk` scales.
    ///
    /// Errors ([`TkError::Param`] naming `scale grid`) if the storage of any layout would
    /// overflow `usize` elements.
    pub fn new(nbm: usize, nbk: usize) -> Result<Self> {
        let too_big = || {
            TkError::param(
                "scale grid",
                format!("({nbm}, {nbk}) scales overflow the addressable size"),
            )
        };
        let rows_aligned = align4(nbm).ok_or_else(too_big)?;
        rows_aligned
            .checked_mul(nbk)
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(too_big)?;
        Ok(Self {
            nbm,
            nbk,
            rows_aligned,
        })
    }

    /// `nbm`, the number of scale rows (row blocks).
    pub const fn nbm(&self) -> usize {
        self.nbm
    }

    /// `nbk`, the number of scale columns (column blocks).
    pub const fn nbk(&self) -> usize {
        self.nbk
    }

    /// `align(nbm, 4)`: the padded row count of the column-major layouts.
    pub const fn rows_aligned(&self) -> usize {
        self.rows_aligned
    }

    /// `ceil(nbk / 4)`: the number of int32 columns of layout C.
    pub const fn packed_cols(&self) -> usize {
        self.nbk.div_ceil(4)
    }

    /// The tensor's shape: `[nbm, nbk]` (A, B) or `[nbm, ceil(nbk/4)]` (C).
    pub const fn shape(&self, layout: ScaleLayout) -> [usize; 2] {
        match layout {
            ScaleLayout::RowMajorF32 | ScaleLayout::ColMajorF32 => [self.nbm, self.nbk],
            ScaleLayout::PackedUe8m0 => [self.nbm, self.packed_cols()],
        }
    }

    /// The tensor's strides in elements: `[nbk, 1]` (A) or `[1, align(nbm,4)]` (B, C), the
    /// latter `[1, 1]` when `nbm == 0`.
    pub fn strides(&self, layout: ScaleLayout) -> [usize; 2] {
        match layout {
            ScaleLayout::RowMajorF32 => [self.nbk, 1],
            ScaleLayout::ColMajorF32 | ScaleLayout::PackedUe8m0 => [1, self.rows_aligned.max(1)],
        }
    }

    /// The row-major shape of the allocation, in elements of the layout's dtype:
    /// `[nbm, nbk]` (A), `[nbk, align(nbm,4)]` (B), `[ceil(nbk/4), align(nbm,4)]` (C).
    pub const fn storage_shape(&self, layout: ScaleLayout) -> [usize; 2] {
        match layout {
            ScaleLayout::RowMajorF32 => [self.nbm, self.nbk],
            ScaleLayout::ColMajorF32 => [self.nbk, self.rows_aligned],
            ScaleLayout::PackedUe8m0 => [self.packed_cols(), self.rows_aligned],
        }
    }

    /// The number of elements (fp32 for A and B, int32 for C) of the allocation.
    pub const fn storage_len(&self, layout: ScaleLayout) -> usize {
        let [r, c] = self.storage_shape(layout);
        r * c
    }

    /// The storage element holding `S[mb, kb]`: the fp32 (A, B) or the int32 whose byte
    /// `kb % 4` it is (C). No bounds check.
    pub const fn storage_index(&self, layout: ScaleLayout, mb: usize, kb: usize) -> usize {
        match layout {
            ScaleLayout::RowMajorF32 => mb * self.nbk + kb,
            ScaleLayout::ColMajorF32 => kb * self.rows_aligned + mb,
            ScaleLayout::PackedUe8m0 => (kb / 4) * self.rows_aligned + mb,
        }
    }

    /// Layout C: the byte address of `S[mb, kb]` from the start of the allocation,
    /// `4·((kb/4)·align(nbm,4) + mb) + kb%4`. No bounds check.
    pub const fn packed_byte_offset(&self, mb: usize, kb: usize) -> usize {
        4 * ((kb / 4) * self.rows_aligned + mb) + kb % 4
    }

    /// The tensor's [`Layout`] (shape, strides, offset 0) over the allocation.
    pub fn tensor_layout(&self, layout: ScaleLayout) -> Layout {
        Layout::new(
            self.shape(layout).to_vec(),
            self.strides(layout).to_vec(),
            0,
        )
        .expect("shape and strides both have two entries")
    }
}

// ---------------------------------------------------------------------------------------------
// Reading an input scale tensor
// ---------------------------------------------------------------------------------------------

/// True for the dtypes upstream calls "int32" packed scales.
const fn is_int32(dtype: DType) -> bool {
    matches!(dtype, DType::UE8M0x4 | DType::I32)
}

/// Detects the layout of an input scale tensor from its dtype and strides, with upstream's
/// rules (`get_cast_input_and_config`, §1.5 "Reading an input scale tensor"):
///
/// 1. rank 2 is required;
/// 2. `stride(0) == 1`: column-major, i.e. layout C if the dtype is int32
///    ([`DType::UE8M0x4`] or [`DType::I32`]), else layout B, which needs fp32;
/// 3. otherwise `stride(1)` must be 1 (not checked for empty tensors) and the dtype fp32:
///    layout A.
///
/// So an `(n, 1)` fp32 tensor with strides `(1, 1)` reads as layout B; A and B give the same
/// element values, so this never changes a result. Row-major int32 scales are rejected.
///
/// Only the classification happens here: the shape is checked against the expected grid by
/// [`ScaleView::check`]. Errors name `arg`: [`TkError::Shape`] (rank), [`TkError::Dtype`],
/// [`TkError::Stride`].
pub fn detect_scale_layout(
    arg: &'static str,
    dtype: DType,
    layout: &Layout,
) -> Result<ScaleLayout> {
    if layout.rank() != 2 {
        return Err(TkError::Shape {
            arg,
            expected: "rank 2 (scale rows, scale columns)".into(),
            got: layout.shape().to_vec(),
        });
    }
    let strides = layout.strides();
    if strides[0] == 1 {
        return match dtype {
            DType::F32 => Ok(ScaleLayout::ColMajorF32),
            d if is_int32(d) => Ok(ScaleLayout::PackedUe8m0),
            got => Err(TkError::Dtype {
                arg,
                expected: "fp32 (layout B) or int32 packed UE8M0 (layout C) for column-major \
                           scales"
                    .into(),
                got,
            }),
        };
    }
    if layout.numel() != 0 && strides[1] != 1 {
        return Err(TkError::Stride {
            arg,
            expected: "row-major fp32 scales (stride(1) == 1, layout A) or column-major scales \
                       (stride(0) == 1, layouts B and C)"
                .into(),
            got: strides.to_vec(),
        });
    }
    match dtype {
        DType::F32 => Ok(ScaleLayout::RowMajorF32),
        got if is_int32(got) => Err(TkError::Dtype {
            arg,
            expected: "fp32 for row-major scales (packed int32 UE8M0 scales must be \
                       column-major, stride(0) == 1)"
                .into(),
            got,
        }),
        got => Err(TkError::Dtype {
            arg,
            expected: "fp32 (layouts A, B) or int32 packed UE8M0 (layout C)".into(),
            got,
        }),
    }
}

/// A borrowed input scale tensor: fp32 (layouts A, B) or packed UE8M0 int32 (layout C), with
/// any strides allowed by [`detect_scale_layout`].
#[derive(Debug, Clone)]
pub enum ScaleView<'a> {
    /// fp32 scales `(nbm, nbk)`, layout A or B (or any layout the reader rules accept).
    F32(HostView<'a, f32>),
    /// Packed UE8M0 scales, int32 `(nbm, ceil(nbk/4))`, column-major (layout C).
    Packed(HostView<'a, Ue8m0x4>),
}

impl ScaleView<'_> {
    /// The element type: [`DType::F32`] or [`DType::UE8M0x4`].
    pub fn dtype(&self) -> DType {
        match self {
            ScaleView::F32(_) => DType::F32,
            ScaleView::Packed(_) => DType::UE8M0x4,
        }
    }

    /// The view's layout.
    pub fn layout(&self) -> &Layout {
        match self {
            ScaleView::F32(v) => v.layout(),
            ScaleView::Packed(v) => v.layout(),
        }
    }

    /// The layout per [`detect_scale_layout`]; errors name `arg`.
    pub fn detect(&self, arg: &'static str) -> Result<ScaleLayout> {
        detect_scale_layout(arg, self.dtype(), self.layout())
    }

    /// Detects the layout and checks the shape against `grid`: `(nbm, nbk)` for fp32,
    /// `(nbm, ceil(nbk/4))` for packed scales. Errors name `arg`.
    pub fn check(&self, arg: &'static str, grid: &ScaleGrid) -> Result<ScaleLayout> {
        let layout = self.detect(arg)?;
        let expected = grid.shape(layout);
        if self.layout().shape() != expected {
            let what = if layout.is_packed() {
                "(nbm, ceil(nbk/4)) int32"
            } else {
                "(nbm, nbk) fp32"
            };
            return Err(TkError::Shape {
                arg,
                expected: format!(
                    "{what} = {expected:?} for the scale grid (nbm, nbk) = ({}, {})",
                    grid.nbm(),
                    grid.nbk()
                ),
                got: self.layout().shape().to_vec(),
            });
        }
        Ok(layout)
    }

    /// The decoded scale `S[mb, kb]`, or `None` outside the tensor.
    ///
    /// fp32 scales are returned as stored. A packed scale is byte `kb % 4` of the int32 at
    /// `[mb, kb / 4]`, decoded as the fp32 with bits `b << 23` (byte 0 is +0.0, 255 is +inf);
    /// padding bytes (`kb >= nbk`) are readable too, as upstream's `transform_sf` returns them.
    pub fn get(&self, mb: usize, kb: usize) -> Option<f32> {
        let shape = self.layout().shape();
        if shape.len() != 2 || mb >= shape[0] {
            return None;
        }
        match self {
            ScaleView::F32(v) => (kb < shape[1]).then(|| v.at(&[mb, kb])),
            ScaleView::Packed(v) => (kb / 4 < shape[1])
                .then(|| ue8m0_to_f32(unpack_ue8m0x4(v.at(&[mb, kb / 4]).0)[kb % 4])),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Host scale tensor
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Storage {
    F32(Vec<f32>),
    Packed(Vec<Ue8m0x4>),
}

/// An owned host scale tensor in one of the layouts A, B, C, with its full allocation (padding
/// included, always zero). What every cast of this crate returns.
///
/// Equality is bitwise: same layout, same grid, same allocation bytes (padding included).
#[derive(Debug, Clone)]
pub struct HostScales {
    layout: ScaleLayout,
    grid: ScaleGrid,
    storage: Storage,
}

impl PartialEq for HostScales {
    fn eq(&self, other: &Self) -> bool {
        self.layout == other.layout
            && self.grid == other.grid
            && self.storage_bytes() == other.storage_bytes()
    }
}

impl Eq for HostScales {}

/// True if `v` is exactly the decoding of some UE8M0 byte (`+0.0`, `2^-126 ..= 2^127`, `+inf`).
const fn is_ue8m0_value(v: f32) -> bool {
    v.to_bits() & 0x807F_FFFF == 0
}

impl HostScales {
    /// A scale tensor of `grid` in `layout`, every scale (and all padding) zero.
    pub fn zeros(layout: ScaleLayout, grid: ScaleGrid) -> Self {
        let n = grid.storage_len(layout);
        let storage = match layout {
            ScaleLayout::PackedUe8m0 => Storage::Packed(vec![Ue8m0x4(0); n]),
            _ => Storage::F32(vec![0.0; n]),
        };
        Self {
            layout,
            grid,
            storage,
        }
    }

    /// A scale tensor from the logical grid `values` (row-major, `nbm · nbk` entries, value of
    /// `S[mb, kb]` at `mb · nbk + kb`).
    ///
    /// Layout C stores UE8M0 bytes, so there every value must be exactly `b << 23` for some
    /// byte `b` (+0.0, a power of two in `2^-126 ..= 2^127`, or +inf); anything else is a
    /// [`TkError::Param`] naming `values` (upstream's reference would silently keep the floor
    /// exponent). Wrong length: [`TkError::Shape`].
    pub fn from_grid(layout: ScaleLayout, grid: ScaleGrid, values: &[f32]) -> Result<Self> {
        let n = grid.nbm() * grid.nbk();
        if values.len() != n {
            return Err(TkError::Shape {
                arg: "values",
                expected: format!(
                    "{n} = nbm · nbk = {} · {} values (row-major)",
                    grid.nbm(),
                    grid.nbk()
                ),
                got: vec![values.len()],
            });
        }
        if layout.is_packed() {
            if let Some(i) = values.iter().position(|&v| !is_ue8m0_value(v)) {
                return Err(TkError::param(
                    "values",
                    format!(
                        "S[{}, {}] = {:e} (bits {:#010x}) is not a UE8M0 value (+0.0, a power \
                         of two, or +inf); packed scales can only hold those",
                        i / grid.nbk(),
                        i % grid.nbk(),
                        values[i],
                        values[i].to_bits()
                    ),
                ));
            }
        }
        let mut s = Self::zeros(layout, grid);
        for (i, &v) in values.iter().enumerate() {
            s.set(i / grid.nbk(), i % grid.nbk(), v);
        }
        Ok(s)
    }

    /// [`HostScales::from_grid`] with `S[mb, kb] = f(mb, kb)`.
    pub fn from_fn(
        layout: ScaleLayout,
        grid: ScaleGrid,
        mut f: impl FnMut(usize, usize) -> f32,
    ) -> Result<Self> {
        let values: Vec<f32> = (0..grid.nbm())
            .flat_map(|mb| (0..grid.nbk()).map(move |kb| (mb, kb)))
            .map(|(mb, kb)| f(mb, kb))
            .collect();
        Self::from_grid(layout, grid, &values)
    }

    /// Wraps a full fp32 allocation (layout A or B, [`ScaleGrid::storage_len`] elements, e.g.
    /// downloaded from a kernel's output) and sets its padding to +0.0, like upstream's
    /// `clear_unused_sf`. Errors: [`TkError::Param`] naming `layout` for layout C,
    /// [`TkError::Shape`] naming `storage` for a wrong length.
    pub fn from_f32_storage(
        layout: ScaleLayout,
        grid: ScaleGrid,
        mut storage: Vec<f32>,
    ) -> Result<Self> {
        if layout.is_packed() {
            return Err(TkError::param(
                "layout",
                "fp32 storage holds layout A or B; use from_packed_storage for layout C",
            ));
        }
        check_storage_len(grid, layout, storage.len())?;
        if layout == ScaleLayout::ColMajorF32 {
            for col in storage.chunks_mut(grid.rows_aligned().max(1)) {
                col.iter_mut().skip(grid.nbm()).for_each(|v| *v = 0.0);
            }
        }
        Ok(Self {
            layout,
            grid,
            storage: Storage::F32(storage),
        })
    }

    /// Wraps a full layout-C allocation (`ceil(nbk/4) · align(nbm,4)` int32) and zeroes its
    /// padding bytes (rows `>= nbm`, bytes `4j + b >= nbk`), like upstream's
    /// `clear_unused_sf`. Wrong length: [`TkError::Shape`] naming `storage`.
    pub fn from_packed_storage(grid: ScaleGrid, mut storage: Vec<Ue8m0x4>) -> Result<Self> {
        let layout = ScaleLayout::PackedUe8m0;
        check_storage_len(grid, layout, storage.len())?;
        for (j, col) in storage.chunks_mut(grid.rows_aligned().max(1)).enumerate() {
            for (mb, word) in col.iter_mut().enumerate() {
                let mut bytes = unpack_ue8m0x4(word.0);
                for (b, byte) in bytes.iter_mut().enumerate() {
                    if mb >= grid.nbm() || 4 * j + b >= grid.nbk() {
                        *byte = 0;
                    }
                }
                *word = Ue8m0x4(pack_ue8m0x4(bytes));
            }
        }
        Ok(Self {
            layout,
            grid,
            storage: Storage::Packed(storage),
        })
    }

    /// The same scales in another layout (to layout C only if every value is a UE8M0 value,
    /// see [`HostScales::from_grid`]).
    pub fn to_layout(&self, layout: ScaleLayout) -> Result<Self> {
        Self::from_grid(layout, self.grid, &self.to_grid())
    }

    /// The layout.
    pub const fn layout(&self) -> ScaleLayout {
        self.layout
    }

    /// The logical grid.
    pub const fn grid(&self) -> ScaleGrid {
        self.grid
    }

    /// The tensor's shape ([`ScaleGrid::shape`]).
    pub const fn shape(&self) -> [usize; 2] {
        self.grid.shape(self.layout)
    }

    /// The tensor's strides in elements ([`ScaleGrid::strides`]).
    pub fn strides(&self) -> [usize; 2] {
        self.grid.strides(self.layout)
    }

    /// The decoded scale `S[mb, kb]` (UE8M0 bytes decoded as `b << 23`), or `None` outside the
    /// `nbm × nbk` grid.
    pub fn get(&self, mb: usize, kb: usize) -> Option<f32> {
        if mb >= self.grid.nbm() || kb >= self.grid.nbk() {
            return None;
        }
        let i = self.grid.storage_index(self.layout, mb, kb);
        Some(match &self.storage {
            Storage::F32(v) => v[i],
            Storage::Packed(v) => ue8m0_to_f32(unpack_ue8m0x4(v[i].0)[kb % 4]),
        })
    }

    /// Layout C: the UE8M0 byte of `S[mb, kb]`; `None` for other layouts or outside the grid.
    pub fn ue8m0_byte(&self, mb: usize, kb: usize) -> Option<u8> {
        match &self.storage {
            Storage::Packed(v) if mb < self.grid.nbm() && kb < self.grid.nbk() => {
                let i = self.grid.storage_index(self.layout, mb, kb);
                Some(unpack_ue8m0x4(v[i].0)[kb % 4])
            }
            _ => None,
        }
    }

    /// The decoded logical grid, row-major (`nbm · nbk` values).
    pub fn to_grid(&self) -> Vec<f32> {
        let (nbm, nbk) = (self.grid.nbm(), self.grid.nbk());
        (0..nbm * nbk)
            .map(|i| self.get(i / nbk, i % nbk).unwrap_or(0.0))
            .collect()
    }

    /// The fp32 allocation (layouts A, B), padding included.
    pub fn f32_storage(&self) -> Option<&[f32]> {
        match &self.storage {
            Storage::F32(v) => Some(v),
            Storage::Packed(_) => None,
        }
    }

    /// The int32 allocation (layout C), padding included.
    pub fn packed_storage(&self) -> Option<&[Ue8m0x4]> {
        match &self.storage {
            Storage::Packed(v) => Some(v),
            Storage::F32(_) => None,
        }
    }

    /// The allocation as bytes in memory order (little-endian elements), padding included.
    pub fn storage_bytes(&self) -> Vec<u8> {
        match &self.storage {
            Storage::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Storage::Packed(v) => v.iter().flat_map(|x| x.0.to_le_bytes()).collect(),
        }
    }

    /// A borrowed view with the tensor's shape and strides (for use as an input scale tensor).
    pub fn view(&self) -> ScaleView<'_> {
        let layout = self.grid.tensor_layout(self.layout);
        match &self.storage {
            Storage::F32(v) => ScaleView::F32(
                HostView::new(v, layout).expect("the tensor layout lies inside its allocation"),
            ),
            Storage::Packed(v) => ScaleView::Packed(
                HostView::new(v, layout).expect("the tensor layout lies inside its allocation"),
            ),
        }
    }

    /// Stores `sf` as `S[mb, kb]`: as is for fp32 layouts, as the UE8M0 byte
    /// `(bits(sf) >> 23) & 0xFF` for layout C (exact for the power-of-two scales of a rounded
    /// cast). `mb < nbm`, `kb < nbk`.
    pub(crate) fn set(&mut self, mb: usize, kb: usize, sf: f32) {
        let i = self.grid.storage_index(self.layout, mb, kb);
        match &mut self.storage {
            Storage::F32(v) => v[i] = sf,
            Storage::Packed(v) => {
                let mut bytes = unpack_ue8m0x4(v[i].0);
                bytes[kb % 4] = ue8m0_from_pow2(sf);
                v[i] = Ue8m0x4(pack_ue8m0x4(bytes));
            }
        }
    }
}

fn check_storage_len(grid: ScaleGrid, layout: ScaleLayout, len: usize) -> Result<()> {
    let n = grid.storage_len(layout);
    if len != n {
        let [r, c] = grid.storage_shape(layout);
        return Err(TkError::Shape {
            arg: "storage",
            expected: format!("{n} = {r} · {c} elements (the allocation of {layout:?})"),
            got: vec![len],
        });
    }
    Ok(())
}
