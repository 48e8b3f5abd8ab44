//! `get_fused_mapping` (§4.11).

use tk_core::{HostTensor, HostView, Result, TkError};

use super::row;
use crate::get_fused_mapping::{segment_len, FusedMaps, FusedRows, GetFusedMappingParams};
use crate::index::check_indices;

/// The seven mapping tensors of `get_fused_mapping` on the host ([`FusedMaps`] of host
/// tensors).
pub type FusedMapping = FusedMaps<HostTensor<i32>>;

impl FusedMapping {
    /// `Σ_e align(c_e, a)` = `expert_end[E-1]`: the rows the segments occupy (upstream's
    /// `num_tokens_per_expert_list` summed); `<= num_rows()`.
    pub fn used_rows(&self) -> usize {
        self.expert_end.as_slice().last().map_or(0, |&v| v as usize)
    }
}

/// CPU `get_fused_mapping(topk_idx (T, K) i64, params) -> FusedMapping` (§4.11). Rows inside a
/// segment are in ascending flat index `t·K + k` (see [`crate::get_fused_mapping`](mod@crate::get_fused_mapping) for every
/// rule).
///
/// Errors: those of [`GetFusedMappingParams::validate`]; [`TkError::Param`] naming `topk_idx`
/// for an entry other than `-1` or `0..E`; [`TkError::Param`] naming `num_expanded_tokens`
/// when a [`FusedRows::Capacity`] is smaller than `Σ_e align(c_e, a)` (or, with
/// [`FusedRows::HostSync`], when that sum exceeds `i32::MAX`).
pub fn get_fused_mapping(
    topk_idx: &HostView<'_, i64>,
    params: &GetFusedMappingParams,
) -> Result<FusedMapping> {
    let shape = params.validate(topk_idx.layout())?;
    let (t, k, e, a) = (
        shape.num_tokens,
        shape.num_topk,
        shape.num_experts,
        shape.alignment,
    );
    check_indices(
        "topk_idx",
        topk_idx,
        e,
        &format!("an expert id in 0..E = {e}"),
    )?;

    // Counting pass.
    let mut counts = vec![0usize; e];
    for r in 0..t {
        for &v in row(topk_idx, r, k) {
            if v >= 0 {
                counts[v as usize] += 1;
            }
        }
    }
    let mut start = Vec::with_capacity(e);
    let mut total = 0usize;
    for &c in &counts {
        start.push(total);
        // Cannot overflow: c <= T·K < 2^31, a < 2^31, e <= 1024.
        total += segment_len(c, a);
    }
    let limit = match shape.rows {
        FusedRows::Capacity(m) => m,
        FusedRows::HostSync => i32::MAX as usize,
    };
    if total > limit {
        let msg = match shape.rows {
            FusedRows::Capacity(m) => format!(
                "capacity {m} is too small: the segments need Σ align(c_e, {a}) = {total} rows \
                 (max_fused_rows gives a bound that always suffices)"
            ),
            FusedRows::HostSync => {
                format!("the segments need {total} rows, more than int32 positions can address")
            }
        };
        return Err(TkError::param("num_expanded_tokens", msg));
    }
    let m = match shape.rows {
        FusedRows::Capacity(m) => m,
        FusedRows::HostSync => total,
    };

    // Placement pass: ascending flat index within each segment.
    let mut pos_to_expert = vec![-1i32; m];
    let mut pos_to_token = vec![-1i32; m];
    let mut pos_to_token_topk = vec![-1i32; m];
    let mut token_topk_to_pos = vec![-1i32; t * k];
    let mut cursor = start.clone();
    for r in 0..t {
        for (slot, &v) in row(topk_idx, r, k).iter().enumerate() {
            if v < 0 {
                continue;
            }
            let ex = v as usize;
            let p = cursor[ex];
            cursor[ex] += 1;
            let flat = r * k + slot;
            pos_to_expert[p] = ex as i32;
            pos_to_token[p] = r as i32;
            pos_to_token_topk[p] = flat as i32;
            token_topk_to_pos[flat] = p as i32;
        }
    }

    let to_i32 = |v: Vec<usize>| -> HostTensor<i32> {
        let n = v.len();
        HostTensor::from_vec(v.into_iter().map(|x| x as i32).collect(), &[n])
            .expect("length matches")
    };
    let padded: Vec<usize> = counts.iter().map(|&c| segment_len(c, a)).collect();
    let end: Vec<usize> = start.iter().zip(&padded).map(|(s, l)| s + l).collect();
    Ok(FusedMapping {
        pos_to_expert: HostTensor::from_vec(pos_to_expert, &[m])?,
        pos_to_token: HostTensor::from_vec(pos_to_token, &[m])?,
        pos_to_token_topk: HostTensor::from_vec(pos_to_token_topk, &[m])?,
        token_topk_to_pos: HostTensor::from_vec(token_topk_to_pos, &[t, k])?,
        expert_start: to_i32(start),
        expert_end: to_i32(end),
        num_tokens_per_expert: to_i32(padded),
    })
}
