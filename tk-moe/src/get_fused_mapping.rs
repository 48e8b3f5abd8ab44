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
//!   never writes out of bounds: every slot whose row would be `>= M` gets
//!   `token_topk_to_pos = -1` and no row, while `expert_start`, `expert_end` and
//!   `num_tokens_per_expert` still report the full layout, so `expert_end[E-1] > M` tells the
//!   caller (at its next sync) that the capacity was too small.
//! * [`FusedRows::HostSync`] (opt-in convenience): `M = Σ_e A_e` exactly. On the GPU this is
//!   upstream's `num_expanded_tokens = 0` path (upstream runs on a buffer of [`max_fused_rows`]
//!   rows, reads the counts back and trims). Ours reads `expert_end[E-1]` back after counting
//!   (**a device → host synchronisation**) and then places the rows into maps of exactly `M`
//!   rows. Not graph-capturable.
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

/// The seven mapping tensors of `get_fused_mapping`, in upstream's order (all int32,
/// contiguous; meanings in the module docs), generic over the tensor kind: the CPU's
/// [`FusedMapping`](crate::reference::FusedMapping) (host tensors) and the GPU's
/// `DeviceFusedMapping` (device tensors).
#[derive(Debug, Clone, PartialEq)]
pub struct FusedMaps<Tn> {
    /// `(M,)`: expert of each fused row, `-1` for padding.
    pub pos_to_expert: Tn,
    /// `(M,)`: token of each fused row, `-1` for padding.
    pub pos_to_token: Tn,
    /// `(M,)`: flat slot `t·K + k` of each fused row, `-1` for padding.
    pub pos_to_token_topk: Tn,
    /// `(T, K)`: fused row of each slot, `-1` for `-1` slots.
    pub token_topk_to_pos: Tn,
    /// `(E,)`: first row of each expert's segment.
    pub expert_start: Tn,
    /// `(E,)`: one past the last row of each expert's segment.
    pub expert_end: Tn,
    /// `(E,)`: padded segment lengths `align(c_e, a)`.
    pub num_tokens_per_expert: Tn,
}

impl<Tn> FusedMaps<Tn> {
    /// The seven tensors with their argument names, in order.
    pub fn named(&self) -> [(&'static str, &Tn); 7] {
        [
            ("pos_to_expert", &self.pos_to_expert),
            ("pos_to_token", &self.pos_to_token),
            ("pos_to_token_topk", &self.pos_to_token_topk),
            ("token_topk_to_pos", &self.token_topk_to_pos),
            ("expert_start", &self.expert_start),
            ("expert_end", &self.expert_end),
            ("num_tokens_per_expert", &self.num_tokens_per_expert),
        ]
    }

    /// Applies `f` to each tensor (e.g. a download), keeping the order.
    pub fn try_map<U, E>(&self, mut f: impl FnMut(&Tn) -> Result<U, E>) -> Result<FusedMaps<U>, E> {
        Ok(FusedMaps {
            pos_to_expert: f(&self.pos_to_expert)?,
            pos_to_token: f(&self.pos_to_token)?,
            pos_to_token_topk: f(&self.pos_to_token_topk)?,
            token_topk_to_pos: f(&self.token_topk_to_pos)?,
            expert_start: f(&self.expert_start)?,
            expert_end: f(&self.expert_end)?,
            num_tokens_per_expert: f(&self.num_tokens_per_expert)?,
        })
    }
}

impl<T: tk_core::Element> FusedMaps<tk_core::HostTensor<T>> {
    /// `M`: rows of the fused buffer.
    pub fn num_rows(&self) -> usize {
        self.pos_to_expert.shape()[0]
    }
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

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU op (feature `cuda`).
///
/// **Kernels** (`cuda/get_fused_mapping.cu`), deterministic (positions come from prefix sums of
/// exact counts, never from the order of atomics). With [`FusedRows::Capacity`] and `E <= 256`
/// ([`FusedLaunch::Auto`]): **one cooperative launch** (`tk_fused_one`) of about one block per
/// SM, all co-resident (checked with the occupancy API; else the two launches below): each block
/// counts its chunk per warp (walk 1 of the scatter, entries kept in registers), publishes its
/// per-expert counts, waits at a grid barrier (a ticket in the per-stream workspace, zeroed
/// again by the last block to leave), then reads all blocks' counts and computes the totals,
/// `A_e`, the segment starts and its own chunk offsets itself, and places its entries as the
/// scatter below does (bit-identical maps). Stream capture records a cooperative launch as a
/// kernel node with the cooperative attribute (`CU_LAUNCH_ATTRIBUTE_COOPERATIVE`, valid for graph
/// nodes), so the op stays graph-capturable (not exercised by a test here). Otherwise two
/// launches on the op's stream:
/// 1. count and scan: the flat range `0..T·K` is cut into `B` chunks (about one per SM); each
///    block of 1024 threads counts its chunk per expert (shared-memory histogram), and the last
///    block to finish (a ticket in the per-stream zeroed workspace, reset by that block) scans:
///    per-expert totals and chunk prefixes, `A_e = align(c_e, a)`, a block scan for
///    `expert_start`; it writes the per-expert outputs and each chunk's first row per expert;
/// 2. scatter: each block walks its chunk in order, 256 entries at a time, ranking equal experts
///    with `__match_any_sync` and per-warp counts, and writes all four maps (and `-1` to the
///    padding rows).
///
/// The result is bit-identical to the CPU reference (ascending flat order inside a segment).
/// **Graph-safe** with [`FusedRows::Capacity`]: no host synchronisation; a capacity smaller
/// than `Σ_e A_e` drops the slots whose row would be `>= M` (their `token_topk_to_pos` is `-1`)
/// while the per-expert outputs report the full layout (see the module docs). Before capturing
/// it in a CUDA graph, call [`crate::prewarm`] (or the op once) on the stream: the first call on
/// a stream allocates and zero-fills the stream's small workspace (its ticket counter), which
/// is not capturable.
/// [`FusedRows::HostSync`] (opt-in; **a host synchronisation**): with `E <= 256` the one
/// cooperative launch into row maps of [`max_fused_rows`] rows (the upper bound of `Σ_e A_e`),
/// then `expert_end[E-1]` is read back and the three row maps are trimmed in place to exactly
/// `Σ_e A_e` rows (no copy; their buffers keep the upper bound's size). Otherwise it reads
/// `expert_end[E-1]` back after the first of the two launches and scatters into maps of
/// exactly `Σ_e A_e` rows.
///
/// **Index contract on the GPU**: an entry that is not `-1` or in `0..E` is read as `-1` (not
/// counted, `token_topk_to_pos = -1`); nothing is read or written out of bounds. Values of the
/// int32 outputs that would exceed `i32::MAX` (only possible with huge alignments) saturate.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu {
    use cudarc::driver::PushKernelArg;
    use tk_core::error::DriverContext;
    use tk_core::{Device, DeviceTensor, DeviceView, KernelSource, KernelSpec, Result, TkError};

    use super::{max_fused_rows, FusedMappingShape, FusedMaps, FusedRows, GetFusedMappingParams};
    use crate::gpu::{check_device, check_out, config, flat_entries, row_stride, HEADERS, THREADS};
    use crate::workspace::zeroed_words;

    const CODE: &str = include_str!("../cuda/get_fused_mapping.cu");

    macro_rules! source {
        ($entry:literal) => {
            KernelSource {
                file: "get_fused_mapping.cu",
                entry: $entry,
                code: CODE,
                headers: HEADERS,
                needs_cuda_headers: false,
            }
        };
    }

    static COUNT_SCAN: KernelSource = source!("tk_fused_count_scan");
    static SCATTER: KernelSource = source!("tk_fused_scatter");
    static ONE: KernelSource = source!("tk_fused_one");

    /// The largest `E` of the one-launch kernel (one expert per thread in its scan).
    const ONE_LAUNCH_MAX_E: usize = THREADS as usize;

    /// How the graph-safe GPU op ([`FusedRows::Capacity`]) launches its kernels.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum FusedLaunch {
        /// One cooperative launch when `E <= 256` and the grid fits the GPU at once, else
        /// [`FusedLaunch::TwoLaunches`]. Measured on the H200 at the 12 moe12 configurations
        /// (tk-moe PERF.md): 9-40 % faster than two launches in 11, 8 % slower at k = 9 with 4
        /// local experts.
        #[default]
        Auto,
        /// Count-and-scan, then scatter (the host-sync mode always launches these two).
        TwoLaunches,
    }

    /// Threads per block of `tk_fused_count_scan` (the kernel's `SCAN_THREADS`).
    const SCAN_THREADS: u32 = 1024;

    /// The two kernels (count and scan, scatter) for `num_topk` slots and `num_experts` experts.
    pub fn kernel_specs(num_topk: usize, num_experts: usize) -> [KernelSpec; 2] {
        [&COUNT_SCAN, &SCATTER].map(|s| {
            KernelSpec::new(s)
                .define("TK_K", num_topk)
                .define("TK_E", num_experts)
        })
    }

    /// The one-launch kernel for `num_topk` slots and `num_experts <= 256` experts (`None` above).
    pub fn one_launch_spec(num_topk: usize, num_experts: usize) -> Option<KernelSpec> {
        (num_experts <= ONE_LAUNCH_MAX_E).then(|| {
            KernelSpec::new(&ONE)
                .define("TK_K", num_topk)
                .define("TK_E", num_experts)
        })
    }

    /// Representative specialisations (the moe12 top-k and local expert counts, and the
    /// largest `E`), for compile checks and [`crate::prewarm`].
    pub fn registered_kernels() -> Vec<KernelSpec> {
        let mut v = Vec::new();
        for k in [2, 6, 8, 9] {
            for e in [4, 9, 32] {
                v.extend(kernel_specs(k, e));
                v.extend(one_launch_spec(k, e));
            }
        }
        v.extend(one_launch_spec(8, ONE_LAUNCH_MAX_E));
        v.extend(kernel_specs(8, super::MAX_EXPERTS));
        v
    }

    /// The seven mapping tensors on the device ([`FusedMaps`] of device tensors).
    pub type DeviceFusedMapping = FusedMaps<DeviceTensor<i32>>;

    impl FusedMaps<DeviceTensor<i32>> {
        /// Allocates (uninitialised) outputs for `T` tokens, `K` slots, `E` experts and `M` rows.
        pub fn alloc(dev: &Device, t: usize, k: usize, e: usize, m: usize) -> Result<Self> {
            Ok(Self {
                pos_to_expert: dev.alloc(&[m])?,
                pos_to_token: dev.alloc(&[m])?,
                pos_to_token_topk: dev.alloc(&[m])?,
                token_topk_to_pos: dev.alloc(&[t, k])?,
                expert_start: dev.alloc(&[e])?,
                expert_end: dev.alloc(&[e])?,
                num_tokens_per_expert: dev.alloc(&[e])?,
            })
        }

        /// `M`: rows of the fused buffer.
        pub fn num_rows(&self) -> usize {
            self.pos_to_expert.shape()[0]
        }

        /// Copies the seven tensors to the host (synchronises the stream).
        pub fn to_host(&self) -> Result<FusedMaps<tk_core::HostTensor<i32>>> {
            self.try_map(|x| x.to_host())
        }
    }

    /// GPU `get_fused_mapping(topk_idx (T, K) i64, params)` into new tensors. With
    /// [`FusedRows::Capacity`] it never synchronises with the host (graph-safe); with
    /// [`FusedRows::HostSync`] it synchronises once, after the counting, to size the row maps
    /// (see the module docs).
    ///
    /// Errors: those of [`GetFusedMappingParams::validate`].
    pub fn get_fused_mapping(
        topk_idx: &DeviceView<'_, i64>,
        params: &GetFusedMappingParams,
    ) -> Result<DeviceFusedMapping> {
        let shape = params.validate(topk_idx.layout())?;
        let dev = topk_idx.device();
        let (t, k, e) = (shape.num_tokens, shape.num_topk, shape.num_experts);
        let rows = match shape.rows {
            FusedRows::Capacity(m) => Some(m),
            FusedRows::HostSync => None,
        };
        // Rows of the one cooperative launch: the capacity, or for the host sync the upper bound
        // of `Σ_e A_e` (the maps are trimmed to the layout's end afterwards, without a copy).
        let one_rows = rows.or_else(|| {
            max_fused_rows(t, k, e, shape.alignment).filter(|&c| c < i32::MAX as usize)
        });
        let mut out = DeviceFusedMapping::alloc(dev, t, k, e, one_rows.unwrap_or(0))?;
        if let Some(cap) = one_rows {
            if one_launch(topk_idx, &shape, cap, &mut out)? {
                if rows.is_none() {
                    // The opt-in host sync: read the layout's end (<= cap), trim the row maps.
                    let end = out.expert_end.view().narrow(0, e - 1, 1)?;
                    let m = dev.download(&end)?.as_slice()[0].clamp(0, cap as i32) as usize;
                    for x in [
                        &mut out.pos_to_expert,
                        &mut out.pos_to_token,
                        &mut out.pos_to_token_topk,
                    ] {
                        x.truncate(m)?;
                    }
                }
                return Ok(out);
            }
        }
        let scratch = count_and_scan(topk_idx, &shape, &mut out)?;
        let m = match rows {
            Some(m) => m,
            None => {
                // The opt-in host sync: read the layout's end, size the row maps exactly.
                let end = out.expert_end.view().narrow(0, e - 1, 1)?;
                let m = dev.download(&end)?.as_slice()[0].max(0) as usize;
                if m >= i32::MAX as usize {
                    return Err(TkError::param(
                        "num_expanded_tokens",
                        "the segments need more rows than int32 positions can address",
                    ));
                }
                for x in [
                    &mut out.pos_to_expert,
                    &mut out.pos_to_token,
                    &mut out.pos_to_token_topk,
                ] {
                    *x = dev.alloc(&[m])?;
                }
                m
            }
        };
        scatter(topk_idx, &shape, m, &scratch, &mut out)?;
        Ok(out)
    }

    /// Graph-safe `get_fused_mapping` into caller-provided outputs of `M = out.num_rows()` rows;
    /// `params.rows` must be [`FusedRows::Capacity`]`(M)`. Never synchronises with the host.
    ///
    /// Errors: those of [`GetFusedMappingParams::validate`]; [`TkError::Param`] naming
    /// `num_expanded_tokens` for [`FusedRows::HostSync`] or a capacity other than `M`;
    /// [`TkError::Shape`] / [`TkError::Stride`] / [`TkError::Placement`] naming an output.
    pub fn get_fused_mapping_into(
        topk_idx: &DeviceView<'_, i64>,
        params: &GetFusedMappingParams,
        out: &mut DeviceFusedMapping,
    ) -> Result<()> {
        get_fused_mapping_into_with(topk_idx, params, out, FusedLaunch::Auto)
    }

    /// [`get_fused_mapping_into`] with a choice of kernels (`launch`); the maps are the same
    /// whichever runs.
    ///
    /// Errors: those of [`get_fused_mapping_into`].
    pub fn get_fused_mapping_into_with(
        topk_idx: &DeviceView<'_, i64>,
        params: &GetFusedMappingParams,
        out: &mut DeviceFusedMapping,
        launch: FusedLaunch,
    ) -> Result<()> {
        let shape = params.validate(topk_idx.layout())?;
        let m = out.num_rows();
        if shape.rows != FusedRows::Capacity(m) {
            return Err(TkError::param(
                "num_expanded_tokens",
                format!(
                    "the _into form needs FusedRows::Capacity({m}) (the outputs' row count), got {:?}",
                    shape.rows
                ),
            ));
        }
        check_outputs(topk_idx.device(), &shape, m, out)?;
        if launch == FusedLaunch::Auto && one_launch(topk_idx, &shape, m, out)? {
            return Ok(());
        }
        let scratch = count_and_scan(topk_idx, &shape, out)?;
        scatter(topk_idx, &shape, m, &scratch, out)
    }

    /// Checks the seven outputs' devices, shapes and contiguity.
    fn check_outputs(
        dev: &Device,
        shape: &FusedMappingShape,
        m: usize,
        out: &DeviceFusedMapping,
    ) -> Result<()> {
        for (arg, tensor) in out.named() {
            check_device(arg, dev, tensor.device())?;
            let want: Vec<usize> = match arg {
                "pos_to_expert" | "pos_to_token" | "pos_to_token_topk" => vec![m],
                "token_topk_to_pos" => vec![shape.num_tokens, shape.num_topk],
                _ => vec![shape.num_experts],
            };
            check_out(arg, tensor.layout(), &want)?;
        }
        Ok(())
    }

    /// The chunking of the flat range: `(entries per block, blocks)`, about one block per SM,
    /// whole tiles of 256 entries.
    fn chunking(dev: &Device, flat: usize) -> (usize, usize) {
        let sms = dev.props().sm_count.max(1) as usize;
        let chunk = flat.div_ceil(sms).div_ceil(THREADS as usize).max(1) * THREADS as usize;
        (chunk, flat.div_ceil(chunk).max(1))
    }

    /// The one cooperative launch into row maps of `m` rows, when `E <= 256` and its grid is
    /// co-resident (else `Ok(false)`, nothing launched).
    fn one_launch(
        topk_idx: &DeviceView<'_, i64>,
        shape: &FusedMappingShape,
        m: usize,
        out: &mut DeviceFusedMapping,
    ) -> Result<bool> {
        let (t, k, e) = (shape.num_tokens, shape.num_topk, shape.num_experts);
        let Some(spec) = one_launch_spec(k, e) else {
            return Ok(false);
        };
        let dev = topk_idx.device();
        let (chunk, nb) = chunking(dev, t * k);
        let f = dev.function(&spec)?;
        if dev.resident_blocks(&f, THREADS)? < nb {
            return Ok(false);
        }
        let mut cnt = dev.alloc::<i32>(&[e, nb.next_multiple_of(4)])?;
        let ws = zeroed_words(dev, 2)?;
        let (idx, ld) = (topk_idx.address(), row_stride(topk_idx.layout()));
        let (t64, l64, a64, m64) = (t as u64, chunk as u64, shape.alignment as i64, m as u64);
        let cnt_addr = cnt.view_mut().address();
        let addr = |x: &mut DeviceTensor<i32>| x.view_mut().address();
        let (ttp, pte, ptt, pttk) = (
            addr(&mut out.token_topk_to_pos),
            addr(&mut out.pos_to_expert),
            addr(&mut out.pos_to_token),
            addr(&mut out.pos_to_token_topk),
        );
        let (es, ee, ntpe) = (
            addr(&mut out.expert_start),
            addr(&mut out.expert_end),
            addr(&mut out.num_tokens_per_expert),
        );
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&cnt_addr)
            .arg(&ws)
            .arg(&idx)
            .arg(&ld)
            .arg(&t64)
            .arg(&l64)
            .arg(&a64)
            .arg(&m64)
            .arg(&ttp)
            .arg(&pte)
            .arg(&ptt)
            .arg(&pttk)
            .arg(&es)
            .arg(&ee)
            .arg(&ntpe);
        // SAFETY: block b reads its chunk of topk_idx (flat indices < T·K inside the validated
        // view), writes column b of the (E, B rounded up to 4) scratch and reads all of it after the grid
        // barrier; the barrier cannot deadlock: the launch is cooperative (the driver refuses it
        // unless all B blocks are resident at once; B <= occupancy × SMs was checked). It writes
        // token_topk_to_pos at its flat indices (the checked contiguous (T, K) output), the
        // three (M,) maps only at rows < M (bounded in the kernel) and, in block 0, the three
        // checked (E,) outputs at e < E. Words 0 and 1 of the stream's workspace are left zero;
        // launches on this stream are ordered, so no other kernel uses them meanwhile. The
        // scratch is freed in stream order.
        unsafe { l.launch_cooperative(config(nb as u32, THREADS)) }
            .ctx("launching tk_fused_one")?;
        Ok(true)
    }

    /// Launches the count-and-scan kernel; returns the `(B + 1, E)` scratch of chunk bases and
    /// raw counts (the per-expert outputs are written).
    fn count_and_scan(
        topk_idx: &DeviceView<'_, i64>,
        shape: &FusedMappingShape,
        out: &mut DeviceFusedMapping,
    ) -> Result<DeviceTensor<i32>> {
        let dev = topk_idx.device();
        let (t, k, e) = (shape.num_tokens, shape.num_topk, shape.num_experts);
        let (chunk, nb) = chunking(dev, t * k);
        let mut cnt = dev.alloc::<i32>(&[nb + 1, e])?;
        let [count_scan, _] = kernel_specs(k, e);
        let count_scan = dev.function(&count_scan)?;
        let ws = zeroed_words(dev, 1)?;
        let (idx, ld) = (topk_idx.address(), row_stride(topk_idx.layout()));
        let (t64, l64, a64) = (t as u64, chunk as u64, shape.alignment as i64);
        let cnt_addr = cnt.view_mut().address();
        let (es, ee, ntpe) = (
            out.expert_start.view_mut().address(),
            out.expert_end.view_mut().address(),
            out.num_tokens_per_expert.view_mut().address(),
        );
        let mut l = dev.stream().launch_builder(&count_scan);
        let flat = flat_entries(topk_idx);
        l.arg(&cnt_addr)
            .arg(&ws)
            .arg(&idx)
            .arg(&ld)
            .arg(&t64)
            .arg(&l64)
            .arg(&flat)
            .arg(&a64)
            .arg(&es)
            .arg(&ee)
            .arg(&ntpe);
        // SAFETY: block b reads topk_idx entries of flat index < T·K inside the validated view
        // (pairs with one 16-byte load only when `flat` says the entries are one aligned run)
        // and writes cnt[b, 0..E] of the (B + 1, E) scratch; the last block reads and writes
        // cnt[0..=B, 0..E] and writes the three checked (E,) outputs at e < E (<= 1024,
        // validated). The ticket (word 0 of the stream's workspace) is left zero; launches on
        // this stream are ordered, so no other kernel uses it meanwhile. The scratch is freed
        // in stream order.
        unsafe { l.launch(config(nb as u32, SCAN_THREADS)) }
            .ctx("launching tk_fused_count_scan")?;
        Ok(cnt)
    }

    /// Launches the scatter kernel into row maps of `m` rows.
    fn scatter(
        topk_idx: &DeviceView<'_, i64>,
        shape: &FusedMappingShape,
        m: usize,
        cnt: &DeviceTensor<i32>,
        out: &mut DeviceFusedMapping,
    ) -> Result<()> {
        let dev = topk_idx.device();
        let (t, k, e) = (shape.num_tokens, shape.num_topk, shape.num_experts);
        let (chunk, nb) = chunking(dev, t * k);
        let f = dev.function(&kernel_specs(k, e)[1])?;
        let (idx, ld) = (topk_idx.address(), row_stride(topk_idx.layout()));
        let (t64, l64, m64) = (t as u64, chunk as u64, m as u64);
        let cnt_addr = cnt.view().address();
        let addr = |x: &mut DeviceTensor<i32>| x.view_mut().address();
        let (ttp, pte, ptt, pttk) = (
            addr(&mut out.token_topk_to_pos),
            addr(&mut out.pos_to_expert),
            addr(&mut out.pos_to_token),
            addr(&mut out.pos_to_token_topk),
        );
        let (es, ee) = (
            out.expert_start.view().address(),
            out.expert_end.view().address(),
        );
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&cnt_addr)
            .arg(&idx)
            .arg(&ld)
            .arg(&t64)
            .arg(&l64)
            .arg(&m64)
            .arg(&ttp)
            .arg(&pte)
            .arg(&ptt)
            .arg(&pttk)
            .arg(&es)
            .arg(&ee);
        // SAFETY: block b reads cnt[b, 0..E] and cnt[B, 0..E], its chunk of topk_idx and the
        // (E,) starts and ends; it writes token_topk_to_pos at its flat indices (< T·K, the
        // checked contiguous output) and the three (M,) maps only at rows p < M (bounded in the
        // kernel); all buffers outlive the stream-ordered launch.
        unsafe { l.launch(config(nb as u32, THREADS)) }.ctx("launching tk_fused_scatter")?;
        Ok(())
    }
}
