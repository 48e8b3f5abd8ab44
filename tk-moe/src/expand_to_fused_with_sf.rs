//! `expand_to_fused_with_sf` (`spec/moe.md` §4.13, §5.14): [`expand_to_fused`](crate::expand_to_fused)
//! for quantized rows: the data (FP8 / FP4 / any element type) and its per-token scale factors
//! are permuted together.
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `data` | `(T, C)` | any element type; `H = C`, or `H = 2C` for packed FP4 ([`tk_core::dtype::E2M1x2`]) | unit last stride; E5M6 bytes, UE8M0 and packed UE8M0 are rejected as data |
//! | `sf` | `(T, Hs)` | [`ScaleElement`]: fp32, or packed UE8M0 as int32 / [`Ue8m0x4`] | unit last stride (upstream: contiguous row-major) |
//! | `num_per_channels` (`npc`) | `32` or `128` | | |
//! | `use_tma_aligned_col_major_sf` | bool | | output sf layout; **must be true for packed sf** |
//! | `token_topk_to_pos`, `pos_to_expert` | as in [`expand_to_fused`](crate::expand_to_fused) | i32 | |
//! | output `out` | `(M, C)` | as `data` | contiguous |
//! | output `out_sf` | logical `(M, Hs)` | as `sf` | below |
//!
//! `Hs = ceil(H / npc)` for fp32 scales and `ceil(ceil(H / npc) / 4)` for packed UE8M0 (four
//! exponent bytes per int32); `sf`'s shape must be exactly `(T, Hs)`.
//!
//! **Output sf layout** ([`ExpandToFusedWithSfParams::out_sf_layout`]):
//! * row-major: storage `(M, Hs)`, strides `(Hs, 1)`;
//! * column-major (`use_tma_aligned_col_major_sf`): storage `(Hs, align(M, 4))`, logical view
//!   `(M, Hs)` with strides `(1, align(M, 4))` (upstream's TMA-aligned layout; `(1, 1)` when
//!   `M == 0`). The storage columns `M .. align(M, 4)` are **zero** here (upstream never writes
//!   them).
//!
//! **Semantics.** As `expand_to_fused`, applied to both tensors: for every slot with
//! `p = token_topk_to_pos[t, k] >= 0`, `out[p, :] = data[t, :]` and `out_sf[p, :] = sf[t, :]`
//! (bit copies: fp32 values or packed words verbatim). **Every other row is zero in both**
//! (upstream zero-fills only `pos_to_expert < 0` rows, and nothing at all when `T == 0`). The
//! index contract and the collision / padding-row rules are those of `expand_to_fused`.

use tk_core::dtype::Ue8m0x4;
use tk_core::{DType, Element, Layout, Result, TkError};

use crate::checks::check_shape;
use crate::expand_to_fused::{validate_expand, ExpandShape};

/// A scale-factor element: fp32 (one scale per value) or packed UE8M0 (`i32` or [`Ue8m0x4`],
/// four exponent bytes per element).
pub trait ScaleElement: Element {
    /// True for the packed UE8M0 types.
    const PACKED: bool;
}

impl ScaleElement for f32 {
    const PACKED: bool = false;
}

impl ScaleElement for i32 {
    const PACKED: bool = true;
}

impl ScaleElement for Ue8m0x4 {
    const PACKED: bool = true;
}

/// The parameters of `expand_to_fused_with_sf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpandToFusedWithSfParams {
    /// Values per scale along a row: 32 or 128.
    pub num_per_channels: usize,
    /// Column-major TMA-aligned output scales (required for packed scales).
    pub use_tma_aligned_col_major_sf: bool,
}

/// The validated geometry of one `expand_to_fused_with_sf` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpandWithSfShape {
    /// The data part (`columns` = stored columns of `data`).
    pub data: ExpandShape,
    /// `H`: logical values per row.
    pub hidden: usize,
    /// `Hs`: scale elements per row.
    pub sf_columns: usize,
}

/// Logical values per stored element of a data dtype, or `None` for dtypes not accepted as data.
pub fn values_per_element(dtype: DType) -> Option<usize> {
    match dtype {
        DType::E2M1x2 => Some(2),
        DType::E5M6Bytes | DType::UE8M0 | DType::UE8M0x4 => None,
        _ => Some(1),
    }
}

impl ExpandToFusedWithSfParams {
    /// Parameters with `num_per_channels` and the given output scale layout.
    pub const fn new(num_per_channels: usize, use_tma_aligned_col_major_sf: bool) -> Self {
        Self {
            num_per_channels,
            use_tma_aligned_col_major_sf,
        }
    }

    /// `Hs` for `hidden` values per row.
    pub fn sf_columns(&self, hidden: usize, packed: bool) -> usize {
        let per_row = hidden.div_ceil(self.num_per_channels.max(1));
        if packed {
            per_row.div_ceil(4)
        } else {
            per_row
        }
    }

    /// The logical `(M, Hs)` layout of `out_sf` inside its storage (module docs). The storage
    /// holds `Hs · align(M, 4)` elements (column-major) or `M · Hs` (row-major).
    pub fn out_sf_layout(&self, num_rows: usize, sf_columns: usize) -> Layout {
        if self.use_tma_aligned_col_major_sf {
            let ld = num_rows.div_ceil(4) * 4;
            Layout::new(vec![num_rows, sf_columns], vec![1, ld.max(1)], 0)
                .expect("two strides for two dimensions")
        } else {
            Layout::contiguous(&[num_rows, sf_columns])
        }
    }

    /// Storage elements of `out_sf` (see [`Self::out_sf_layout`]).
    pub fn out_sf_storage_len(&self, num_rows: usize, sf_columns: usize) -> usize {
        if self.use_tma_aligned_col_major_sf {
            num_rows.div_ceil(4) * 4 * sf_columns
        } else {
            num_rows * sf_columns
        }
    }

    /// Validates the layouts and dtypes: those of
    /// [`ExpandToFusedParams::validate`](crate::ExpandToFusedParams::validate) (with `data` for
    /// `x`), a data dtype with a logical width ([`values_per_element`]), `npc ∈ {32, 128}`,
    /// packed scales only with the column-major flag, and `sf` of shape `(T, Hs)` with a unit
    /// last stride.
    ///
    /// Errors: [`TkError::Shape`] / [`TkError::Stride`] / [`TkError::Empty`] naming the tensor,
    /// [`TkError::Dtype`] naming `data`, [`TkError::Param`] naming `num_per_channels` or
    /// `use_tma_aligned_col_major_sf`.
    pub fn validate(
        &self,
        data: &Layout,
        data_dtype: DType,
        sf: &Layout,
        sf_packed: bool,
        token_topk_to_pos: &Layout,
        pos_to_expert: &Layout,
    ) -> Result<ExpandWithSfShape> {
        let shape = validate_expand("data", data, token_topk_to_pos, pos_to_expert)?;
        let Some(per) = values_per_element(data_dtype) else {
            return Err(TkError::Dtype {
                arg: "data",
                expected: "an element type with a whole number of values per element \
                           (not E5M6 bytes or UE8M0 scales)"
                    .into(),
                got: data_dtype,
            });
        };
        if self.num_per_channels != 32 && self.num_per_channels != 128 {
            return Err(TkError::param(
                "num_per_channels",
                format!("must be 32 or 128, got {}", self.num_per_channels),
            ));
        }
        if sf_packed && !self.use_tma_aligned_col_major_sf {
            return Err(TkError::param(
                "use_tma_aligned_col_major_sf",
                "packed UE8M0 (int32) scales need the column-major output layout",
            ));
        }
        let hidden = shape.columns * per;
        let hs = self.sf_columns(hidden, sf_packed);
        crate::checks::check_unit_last_stride("sf", sf)?;
        check_shape(
            "sf",
            sf,
            &[shape.num_tokens, hs],
            &format!(
                "(T, Hs) = ({}, {hs}) for H = {hidden}, npc = {}{}",
                shape.num_tokens,
                self.num_per_channels,
                if sf_packed { ", packed" } else { "" }
            ),
        )?;
        Ok(ExpandWithSfShape {
            data: shape,
            hidden,
            sf_columns: hs,
        })
    }
}
