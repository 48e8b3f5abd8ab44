//! `get_fused_mapping` (`spec/moe.md` §4.11, §5.13): the token → expert-major ("fused") layout
//! of one rank's routed tokens, and every map between the two.
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `topk_idx` | `(T, K)`, `T >= 0`, `K >= 1`, `T·K <= i32::MAX` | i64 | unit last stride, any row stride; entries `-1` or in `0..E` ([`crate::index`]) |
//! | `num_experts` (`E`) | `1 <= E <=` [`MAX_EXPERTS`] | | |
//! | `alignment` (`a`) | `1 <= a <= i32::MAX` | | per-expert segment alignment |
//! | `rows` | [`FusedRows`] | | the fused buffer's row count `M` (graph-safe capacity, or host sync) |
//!
//! Outputs (the [`FusedMapping`](crate::reference::FusedMapping) of the CPU reference, upstream's
//! order), every one int32 and contiguous:
//!
//! | output | shape | meaning |
//! |---|---|---|
//! | `pos_to_expert` | `(M,)` | expert of fused row `p`, `-1` for a padding row |
//! | `pos_to_token` | `(M,)` | token `t` whose copy row `p` holds, `-1` for padding |
//! | `pos_to_token_topk` | `(M,)` | flat slot `t·K + k` whose copy row `p` holds, `-1` for padding |
//! | `token_topk_to_pos` | `(T, K)` | fused row of slot `(t, k)`, `-1` when `topk_idx[t, k] == -1` (the inverse map) |
//! | `expert_start` | `(E,)` | first row of expert `e`'s segment |
//! | `expert_end` | `(E,)` | one past its last row |
//! | `num_tokens_per_expert` | `(E,)` | the **padded** count `A_e = align(c_e, a)` (not the raw count) |
//!
//! **Semantics.** `c_e` = number of entries equal to `e`; `A_e = align(c_e, a)`; segments are
//! back to back in expert order from row 0: `expert_start[e] = Σ_{e' < e} A_e'`,
//! `expert_end[e] = expert_start[e] + A_e`. The first `c_e` rows of a segment are real rows;
//! the rest of the segment, and every row `>= expert_end[E-1]`, are padding rows (`-1` in all
//! three `pos_to_*` maps).
//!
//! **Row order inside a segment (ours, documented, deterministic): ascending flat index**
//! `i = t·K + k`, i.e. ascending token order, and slot order within a token (a token that lists
//! an expert twice gets two rows, in slot order). It depends on nothing but `topk_idx`.
//! Upstream's order differs: it depends on the SM count (per-warp sub-ranges in warp order, each
//! in *reverse* flat order, spec §4.11). Upstream's test accepts any order and no downstream op
//! depends on it; ours is the spec's recommended one. GPU kernels must reproduce ours bit for
//! bit.
//!
//! **Row count `M`** ([`FusedRows`]):
//! * [`FusedRows::Capacity`] (graph-safe, the default of [`GetFusedMappingParams::new`]): the
//!   caller gives `M`; the op never synchronises with the host, so it can be captured in a CUDA
//!   graph. `M` must be `>= Σ_e A_e`; [`max_fused_rows`] is a bound that always suffices
//!   (`((T·K + (a-1)·E) / a)·a`). Rows `Σ A_e .. M` are padding. `Capacity(0)` with no valid
//!   entry is upstream's `force_no_sync` case. **Capacity too small**: the CPU returns
//!   [`TkError::Param`] naming `num_expanded_tokens` (nothing is written); the GPU kernel
//!   (pending) must not write out of bounds: every slot whose row would be `>= M` gets
//!   `token_topk_to_pos = -1` and no row, while `expert_start`, `expert_end` and
//!   `num_tokens_per_expert` still report the full layout, so `expert_end[E-1] > M` tells the
//!   caller (at its next sync) that the capacity was too small.
//! * [`FusedRows::HostSync`] (opt-in convenience): `M = Σ_e A_e` exactly. On the GPU this is
//!   upstream's `num_expanded_tokens = 0` path: the kernel runs on a buffer of
//!   [`max_fused_rows`] rows, then the host reads the counts (**a device → host
//!   synchronisation**) and trims. Not graph-capturable.
//!
//! **Index contract** ([`crate::index`]): entries must be `-1` or in `0..E`; anything else is an
//! error on the CPU and is read as `-1` on the GPU. Upstream skips only `-1`, so another negative
//! value corrupts its counts.
//!
//! **`T == 0`**: counts, starts, ends all 0, `token_topk_to_pos` is `(0, K)`, and the `pos_to_*`
//! maps have `M` rows of `-1` (`M = 0` with host sync).

use tk_core::{Layout, Result, TkError};

use crate::checks::{check_flat_fits_i32, check_matrix};

/// The largest expert count (upstream's limit: one block of at most 1024 threads).
pub const MAX_EXPERTS: usize = 1024;

/// How the fused buffer's row count `M` is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusedRows {
    /// Graph-safe: exactly this many rows (`num_expanded_tokens`), never a host sync. Must be
    /// `>= Σ_e align(c_e, a)` (checked on the CPU; see the module docs for the GPU).
    Capacity(usize),
    /// Host sync (opt-in): `M = Σ_e align(c_e, a)`, known only after the counts are read back.
    HostSync,
}

/// The parameters of `get_fused_mapping`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetFusedMappingParams {
    /// `E`: experts indexed by `topk_idx`, `1..=`[`MAX_EXPERTS`].
    pub num_experts: usize,
    /// `a`: segment alignment, `>= 1`.
    pub alignment: usize,
    /// The row count rule.
    pub rows: FusedRows,
}

/// The validated geometry of one `get_fused_mapping` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedMappingShape {
    /// `T`.
    pub num_tokens: usize,
    /// `K`.
    pub num_topk: usize,
    /// `E`.
    pub num_experts: usize,
    /// `a`.
    pub alignment: usize,
    /// The row count rule.
    pub rows: FusedRows,
}

impl FusedMappingShape {
    /// [`max_fused_rows`] for this call (the GPU's buffer size under [`FusedRows::HostSync`]).
    pub fn max_rows(&self) -> usize {
        max_fused_rows(
            self.num_tokens,
            self.num_topk,
            self.num_experts,
            self.alignment,
        )
        .expect("validated shapes cannot overflow")
    }
}

/// `align(count, alignment)`: the length of a segment holding `count` rows.
pub const fn segment_len(count: usize, alignment: usize) -> usize {
    count.div_ceil(alignment) * alignment
}

/// `((T·K + (a-1)·E) / a)·a`: an upper bound of `Σ_e align(c_e, a)` for every `(T, K)` index
/// tensor over `E` experts (upstream's estimate). `None` on overflow or `alignment == 0`.
pub fn max_fused_rows(
    num_tokens: usize,
    num_topk: usize,
    num_experts: usize,
    alignment: usize,
) -> Option<usize> {
    if alignment == 0 {
        return None;
    }
    let n = num_tokens
        .checked_mul(num_topk)?
        .checked_add((alignment - 1).checked_mul(num_experts)?)?;
    (n / alignment).checked_mul(alignment)
}

impl GetFusedMappingParams {
    /// Graph-safe parameters: `E` experts, alignment `a`, a fused buffer of exactly
    /// `num_expanded_tokens` rows.
    pub const fn new(num_experts: usize, alignment: usize, num_expanded_tokens: usize) -> Self {
        Self {
            num_experts,
            alignment,
            rows: FusedRows::Capacity(num_expanded_tokens),
        }
    }

    /// Host-sync parameters (opt-in): `M = Σ_e align(c_e, a)`; on the GPU this synchronises
    /// with the host.
    pub const fn host_sync(num_experts: usize, alignment: usize) -> Self {
        Self {
            num_experts,
            alignment,
            rows: FusedRows::HostSync,
        }
    }

    /// Validates `topk_idx`'s layout (rank 2 `(T, K)`, `K >= 1`, unit last stride,
    /// `T·K <= i32::MAX`) and the parameters (`1 <= E <= 1024`, `1 <= a <= i32::MAX`,
    /// capacity `<= i32::MAX`). The entries and the capacity's sufficiency are data-dependent
    /// and checked by the op.
    ///
    /// Errors: [`TkError::Shape`] / [`TkError::Empty`] / [`TkError::Stride`] naming `topk_idx`;
    /// [`TkError::Param`] naming `num_experts`, `alignment` or `num_expanded_tokens`.
    pub fn validate(&self, topk_idx: &Layout) -> Result<FusedMappingShape> {
        let (t, k) = check_matrix("topk_idx", topk_idx, "rank 2 (T, K)")?;
        if k == 0 {
            return Err(TkError::Empty {
                arg: "topk_idx",
                shape: topk_idx.shape().to_vec(),
            });
        }
        check_flat_fits_i32("topk_idx", t, k)?;
        if self.num_experts == 0 || self.num_experts > MAX_EXPERTS {
            return Err(TkError::param(
                "num_experts",
                format!(
                    "must satisfy 1 <= num_experts <= {MAX_EXPERTS}, got {}",
                    self.num_experts
                ),
            ));
        }
        if self.alignment == 0 || self.alignment > i32::MAX as usize {
            return Err(TkError::param(
                "alignment",
                format!(
                    "must satisfy 1 <= alignment <= {}, got {}",
                    i32::MAX,
                    self.alignment
                ),
            ));
        }
        if let FusedRows::Capacity(m) = self.rows {
            if m > i32::MAX as usize {
                return Err(TkError::param(
                    "num_expanded_tokens",
                    format!("must be <= {} (rows are int32), got {m}", i32::MAX),
                ));
            }
        }
        // Overflow of the bound is impossible here (T·K < 2^31, a < 2^31, E <= 1024), but keep
        // the shape's `max_rows` infallible by checking once.
        if max_fused_rows(t, k, self.num_experts, self.alignment).is_none() {
            return Err(TkError::param("alignment", "the row bound overflows usize"));
        }
        Ok(FusedMappingShape {
            num_tokens: t,
            num_topk: k,
            num_experts: self.num_experts,
            alignment: self.alignment,
            rows: self.rows,
        })
    }
}
