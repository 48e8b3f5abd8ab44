//! `expand_to_fused_with_sf` (§4.13).

use tk_core::{Element, HostTensor, HostView, Layout, Result};

use super::expand_to_fused::{row_sources, scatter_rows};
use super::row;
use crate::expand_to_fused_with_sf::{ExpandToFusedWithSfParams, ScaleElement};

/// The outputs of [`expand_to_fused_with_sf`].
#[derive(Debug, Clone, PartialEq)]
pub struct FusedWithSf<D, S> {
    /// `out (M, C)`: the expanded data, contiguous.
    pub out: HostTensor<D>,
    /// The storage of `out_sf`: `Hs · align(M, 4)` elements (column-major) or `M · Hs`
    /// (row-major), as a 1-D tensor; padding is zero.
    pub out_sf_storage: HostTensor<S>,
    /// The logical `(M, Hs)` layout of `out_sf` in [`Self::out_sf_storage`]
    /// ([`ExpandToFusedWithSfParams::out_sf_layout`]).
    pub out_sf_layout: Layout,
}

impl<D: Element, S: Element> FusedWithSf<D, S> {
    /// `out_sf` as a strided `(M, Hs)` view of its storage.
    pub fn out_sf(&self) -> HostView<'_, S> {
        HostView::new(self.out_sf_storage.as_slice(), self.out_sf_layout.clone())
            .expect("the layout was built for this storage")
    }
}

/// CPU `expand_to_fused_with_sf(data (T, C), sf (T, Hs), token_topk_to_pos (T, K),
/// pos_to_expert (M,), params) -> (out (M, C), out_sf (M, Hs))` (§4.13): both tensors
/// permuted together (bit copies), every other row zero in both, `out_sf` in the layout the
/// params select.
///
/// Errors: those of [`ExpandToFusedWithSfParams::validate`], and [`tk_core::TkError::Param`]
/// naming `token_topk_to_pos` as in [`super::expand_to_fused`].
pub fn expand_to_fused_with_sf<D: Element, S: ScaleElement>(
    data: &HostView<'_, D>,
    sf: &HostView<'_, S>,
    token_topk_to_pos: &HostView<'_, i32>,
    pos_to_expert: &HostView<'_, i32>,
    params: &ExpandToFusedWithSfParams,
) -> Result<FusedWithSf<D, S>> {
    let shape = params.validate(
        data.layout(),
        D::DTYPE,
        sf.layout(),
        S::PACKED,
        token_topk_to_pos.layout(),
        pos_to_expert.layout(),
    )?;
    let (m, hs) = (shape.data.num_rows, shape.sf_columns);
    let src = row_sources(
        token_topk_to_pos,
        pos_to_expert,
        shape.data.num_tokens,
        shape.data.num_topk,
        m,
    )?;
    let out = scatter_rows(data, &src, shape.data.columns)?;

    let layout = params.out_sf_layout(m, hs);
    let len = params.out_sf_storage_len(m, hs);
    let mut storage = vec![S::from_bits_u64(0); len];
    for (p, s) in src.iter().enumerate() {
        if let Some(t) = *s {
            for (j, &v) in row(sf, t, hs).iter().enumerate() {
                storage[layout.index(&[p, j])] = v;
            }
        }
    }
    Ok(FusedWithSf {
        out,
        out_sf_storage: HostTensor::from_vec(storage, &[len])?,
        out_sf_layout: layout,
    })
}
