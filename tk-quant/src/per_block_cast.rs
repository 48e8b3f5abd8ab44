//! `per_block_cast`, `per_block_cast_with_sf_only`, `per_block_cast_with_precomputed_sf`
//! (`spec/quant.md` §3.3): 2-D block-scaled casts to FP8 e4m3 or FP4 e2m1, one scale per
//! `bm × bk` block.
//!
//! # What it computes
//!
//! For each block (rows `[mb·bm, (mb+1)·bm)` × columns `[kb·bk, (kb+1)·bk)`, clipped to the
//! tensor: `M` need not be a multiple of `bm`, nor `K` of `bk`):
//!
//! 1. `amax = max |x|` over the block's real elements (NaN ignored);
//! 2. `(sf, inv)` per §1.4, `sf` stored in the selected layout;
//! 3. `out = enc(fl(fp32(x) · inv))`.
//!
//! It is the generic cast ([`reference::cast`](fn@crate::reference::cast)) with block
//! `(bm, bk)`. sf-only mode returns the same scales; precomputed mode quantizes with
//! caller-given fp32 layout-A scales, `inv = fl(1/sf)`.
//!
//! | argument | dtype | shape | notes |
//! |---|---|---|---|
//! | `x` | fp32 / bf16 | `(M, K)`, `K % 64 == 0` | unit column stride, any row stride |
//! | `out` | e4m3 / packed e2m1 | `(M, K)` / `(M, K/2)` | contiguous |
//! | `out_sf` | fp32 / packed UE8M0 | grid `(ceil(M/bm), ceil(K/bk))` | layout A, B or C |
//! | `sf` (precomputed) | fp32 | `(ceil(M/bm), ceil(K/bk))` | layout A, any row stride |
//!
//! # Preconditions ([`validate`])
//!
//! * `K % 64 == 0`.
//! * `block_size = (bm, bk)` with `bm ∈ {32, 128}` and `bk ∈ {32, 128}` ([`BLOCK_SIZES`]).
//! * The scale flags select layout A, B or C ([`ScaleOptions::layout`]).
//! * Precomputed mode: neither the column-major nor the packed flag (`round_sf` has no effect).
//!
//! # Deviations from upstream
//!
//! * **Any row stride** is accepted (upstream requires a contiguous `x`); results equal those
//!   of a contiguous copy.
//! * **Rejected instead of miscomputed**: packed UE8M0 without `round_sf` or without
//!   `use_tma_aligned_col_major_sf` (§1.5 Ambiguity).
//! * NaN / inf inputs follow the GPU (§5 item 6), as in the generic reference.

use tk_core::{Result, TkError};

use crate::plan::{require_multiple, scale_layout, CastMode, CastPlan};
use crate::scale::ScaleOptions;
use crate::types::{CastFormat, PlainInput};

/// The block sides a per-block cast accepts, for both `bm` and `bk`.
pub const BLOCK_SIZES: [usize; 2] = [32, 128];

/// The parameters of a per-block cast (upstream's `fmt`, `block_size` and the scale flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PerBlockCastParams {
    /// Target format: e4m3 or e2m1.
    pub fmt: CastFormat,
    /// `(bm, bk)`: rows × columns per scale, each 32 or 128.
    pub block_size: (usize, usize),
    /// Scale rounding and layout.
    pub opts: ScaleOptions,
}

impl PerBlockCastParams {
    /// Bundles the parameters.
    pub const fn new(fmt: CastFormat, block_size: (usize, usize), opts: ScaleOptions) -> Self {
        Self {
            fmt,
            block_size,
            opts,
        }
    }
}

/// Validates a per-block cast of `x` in `mode` (see the [module docs](self)) and returns its
/// plan: block `(bm, bk)`, grid `(ceil(M/bm), ceil(K/bk))`, and the layout of the scales
/// written (precomputed: read, layout A).
///
/// Errors: `x` (rank, column stride, `K = 0`, `K % 64 != 0`), `block_size`
/// ([`TkError::Param`]), `use_packed_ue8m0` / `use_tma_aligned_col_major_sf`
/// ([`TkError::Param`]).
pub fn validate(
    x: &PlainInput<'_>,
    params: &PerBlockCastParams,
    mode: CastMode,
) -> Result<CastPlan> {
    let (m, k) = x.validate("x")?;
    validate_dims(m, k, params, mode)
}

/// The device-independent part of [`validate`], on the logical size `(m, k)`.
pub fn validate_dims(
    m: usize,
    k: usize,
    params: &PerBlockCastParams,
    mode: CastMode,
) -> Result<CastPlan> {
    require_multiple(
        "x",
        &[m, k],
        "K",
        k,
        64,
        "per_block_cast tiles columns by 64",
    )?;
    let (bm, bk) = params.block_size;
    if !BLOCK_SIZES.contains(&bm) || !BLOCK_SIZES.contains(&bk) {
        return Err(TkError::param(
            "block_size",
            format!(
                "per_block_cast supports blocks (bm, bk) with bm and bk each 32 or 128; got \
                 ({bm}, {bk}) (the generic reference::cast accepts any block)"
            ),
        ));
    }
    let layout = scale_layout(&params.opts, mode)?;
    CastPlan::new(m, k, (bm, bk), layout)
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU ops (feature `cuda`): the same rules as [`validate`], one kernel (`cuda/cast.cu`)
/// with block `(bm, bk)`; bit-exact with [`crate::reference::per_block_cast`] and its variants.
#[cfg(feature = "cuda")]
mod gpu {
    use tk_core::{DeviceView, Result};

    use super::{validate_dims, PerBlockCastParams};
    use crate::cast::{self, CastOutputs};
    use crate::device::{
        DeviceCastInput, DevicePlainInput, DeviceQuantData, DeviceQuantDataViewMut, DeviceScales,
    };
    use crate::plan::{CastMode, CastPlan};

    fn plan(x: &DevicePlainInput<'_>, p: &PerBlockCastParams, mode: CastMode) -> Result<CastPlan> {
        let (m, k) = x.validate("x")?;
        validate_dims(m, k, p, mode)
    }

    /// Per-block cast of `x` (fp32/bf16 `(M, K)`, `K % 64 == 0`) to `params.fmt`: data
    /// `(M, K)` e4m3 / `(M, K/2)` packed e2m1 and scales of grid `(ceil(M/bm), K/bk)`.
    pub fn per_block_cast(
        x: &DevicePlainInput<'_>,
        params: &PerBlockCastParams,
    ) -> Result<(DeviceQuantData, DeviceScales)> {
        let plan = plan(x, params, CastMode::Cast)?;
        cast::cast_alloc(
            &DeviceCastInput::Plain(x.clone()),
            params.fmt,
            &plan,
            params.opts.round_sf,
        )
    }

    /// [`per_block_cast`] into caller-provided contiguous `out` and `out_sf`.
    pub fn per_block_cast_into(
        x: &DevicePlainInput<'_>,
        params: &PerBlockCastParams,
        out: &mut DeviceQuantDataViewMut<'_>,
        out_sf: &mut DeviceScales,
    ) -> Result<()> {
        let plan = plan(x, params, CastMode::Cast)?;
        let outs = CastOutputs {
            out: Some(out),
            out_sf: Some(out_sf),
            sf: None,
        };
        let x = DeviceCastInput::Plain(x.clone());
        cast::launch(
            &x,
            params.fmt,
            &plan,
            params.opts.round_sf,
            CastMode::Cast,
            outs,
        )
    }

    /// The scales of [`per_block_cast`] only (`per_block_cast_with_sf_only`).
    pub fn per_block_cast_with_sf_only(
        x: &DevicePlainInput<'_>,
        params: &PerBlockCastParams,
    ) -> Result<DeviceScales> {
        let plan = plan(x, params, CastMode::SfOnly)?;
        cast::sf_only_alloc(
            &DeviceCastInput::Plain(x.clone()),
            params.fmt,
            &plan,
            params.opts.round_sf,
        )
    }

    /// The data of a per-block cast with caller-given fp32 layout-A scales `sf`
    /// `(ceil(M/bm), K/bk)` (any row stride): `inv = fl(1/sf)` per block.
    pub fn per_block_cast_with_precomputed_sf(
        x: &DevicePlainInput<'_>,
        params: &PerBlockCastParams,
        sf: &DeviceView<'_, f32>,
    ) -> Result<DeviceQuantData> {
        let plan = plan(x, params, CastMode::PrecomputedSf)?;
        cast::precomputed_alloc(&DeviceCastInput::Plain(x.clone()), params.fmt, &plan, sf)
    }
}
