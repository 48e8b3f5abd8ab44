//! `per_token_cast`, `per_token_cast_with_sf_only`, `per_token_cast_with_precomputed_sf`
//! (`spec/quant.md` §3.1) and `per_token_cast(fmt='e5m6')` = `per_token_cast_to_e5m6` (§3.2):
//! per-row scaled casts, one scale per `1 × npc` group of columns.
//!
//! # What it computes
//!
//! For each row `r` and group `g` (columns `[g·npc, min((g+1)·npc, K))`; the last group may be
//! partial, columns `>= K` do not exist):
//!
//! 1. values `v`: plain input `fp32(x[r, j])`; quantized input `fl(dec(data[r, j]) · s_in)`
//!    with `s_in = S_in[r / ih, j / iw]` (UE8M0 bytes decode as `b << 23`);
//! 2. `amax = max |v|` over the group (NaN ignored), `(sf, inv)` per §1.4 (`c = max(amax, ε)`;
//!    `sf = fl(c/Q)`, `inv = fl(Q/c)`, or powers of two with `round_sf`);
//! 3. `out = enc(fl(v · inv))` (e4m3 RNE saturating to ±448, or e2m1 RNE saturating to ±6
//!    packed two per byte), `sf` stored in the selected layout.
//!
//! It is the generic cast ([`reference::cast`](fn@crate::reference::cast)) with block
//! `(1, npc)`; see there for the arithmetic in full.
//!
//! | argument | dtype | shape | notes |
//! |---|---|---|---|
//! | `x` plain | fp32 / bf16 | `(M, K)` | unit column stride, any row stride |
//! | `x` quantized | e4m3 / packed e2m1 + scales | `(M, K)` / `(M, K/2)` | scales in layout A, B or C for `x_block_size = (ih, iw)` |
//! | `out` | e4m3 / packed e2m1 | `(M, K)` / `(M, K/2)` | contiguous; `K` even for e2m1 |
//! | `out_sf` | fp32 / packed UE8M0 | grid `(M, ceil(K/npc))` | layout A, B or C ([`ScaleOptions`]) |
//! | `sf` (precomputed) | fp32 | `(M, ceil(K/npc))` | layout A, any row stride |
//!
//! E5M6 ([`validate_e5m6`]): plain fp32/bf16 `(M, K)` only, `npc == K`, `K % 8 == 0`; output
//! bytes `(M, 3K/2)` and one scale per row (grid `(M, 1)`), see
//! [`reference::cast_to_e5m6`](fn@crate::reference::cast_to_e5m6).
//!
//! # Preconditions ([`validate`])
//!
//! * `num_per_channels` ∈ [`NUM_PER_CHANNELS`] = {16, 32, 64, 128}, or `npc == K` with
//!   `K % 64 == 0` (one scale per row). `K` need not be a multiple of `npc`.
//! * `npc == K` (even when `K` is also in the set, e.g. `K = npc = 128`) may not be combined
//!   with a quantized input, sf-only mode or precomputed mode (upstream's kernel switches to a
//!   whole-row tiling there and asserts this).
//! * A quantized input may not be combined with sf-only or precomputed mode.
//! * The scale flags select layout A, B or C ([`ScaleOptions::layout`]); packed scales without
//!   `round_sf` or without the column-major flag are rejected.
//! * Precomputed mode reads fp32 layout-A scales: the column-major and packed flags are rejected
//!   there; `round_sf` has no effect (`inv = fl(1/sf)`).
//! * e2m1 output needs an even `K`.
//!
//! # Deviations from upstream
//!
//! * **Quantized input, any input block.** Upstream's kernel takes the group max over runs of
//!   `vec` elements (16 for FP8 on SM90, 32 on SM100) scaled by the run's first input scale, so
//!   it needs `npc >= vec` and a tile that divides or is divided by the input block (and, not
//!   asserted, `iw % vec == 0`). Here `amax` is the exact per-element `max |v|` (what upstream
//!   computes whenever its limits hold), so every `(ih, iw)` works.
//! * **Requantization order**: `enc(fl(fl(dec · s_in) · inv))`, the spec's reference order;
//!   upstream's kernel folds `fl(s_in · inv)` first. The two agree whenever `s_in` and `inv`
//!   are powers of two (every upstream test).
//! * **Precomputed scales** must be fp32 layout A (upstream's kernel would bind column-major
//!   scales in their storage orientation, untested, and cannot decode packed ones).
//! * **Rejected instead of miscomputed**: packed UE8M0 without `round_sf` (upstream stores
//!   garbage) or without `use_tma_aligned_col_major_sf` (upstream mis-indexes the buffer).
//! * `K = 0` is rejected; odd `K` with e2m1 output is rejected even when `M = 0`.
//! * NaN / inf inputs follow the GPU (§5 item 6); see [`crate::reference::cast`](mod@crate::reference::cast).
//! * E5M6 is its own entry point ([`validate_e5m6`]) rather than a `fmt` value: upstream's
//!   e5m6 restrictions (no `x_block_size`, no sf-only, no precomputed `sf`) hold by construction.

use tk_core::{Result, TkError};

use crate::plan::{require_even_k_for_e2m1, require_multiple, scale_layout, CastMode, CastPlan};
use crate::scale::ScaleOptions;
use crate::types::{CastFormat, CastInput, PlainInput};

/// The group widths `npc` a per-token cast accepts besides `npc == K` (with `K % 64 == 0`).
pub const NUM_PER_CHANNELS: [usize; 4] = [16, 32, 64, 128];

/// The parameters of a per-token FP8/FP4 cast (upstream's `fmt`, `num_per_channels` and the
/// three scale flags; `x_block_size` travels with a quantized input, [`crate::QuantInput`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PerTokenCastParams {
    /// Target format: e4m3 (`Q = 448`) or e2m1 (`Q = 6`).
    pub fmt: CastFormat,
    /// `npc`, the group width: 16, 32, 64, 128, or `K` (one scale per row, `K % 64 == 0`).
    pub num_per_channels: usize,
    /// Scale rounding and layout.
    pub opts: ScaleOptions,
}

impl PerTokenCastParams {
    /// Bundles the parameters.
    pub const fn new(fmt: CastFormat, num_per_channels: usize, opts: ScaleOptions) -> Self {
        Self {
            fmt,
            num_per_channels,
            opts,
        }
    }
}

/// The parameters of a per-token cast to E5M6 (upstream's `per_token_cast(x, 'e5m6', npc, ...)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PerTokenE5M6Params {
    /// Must equal `K`: E5M6 has exactly one scale per row.
    pub num_per_channels: usize,
    /// Scale rounding and layout (`Q = 65024`, `ε = 1e-4`).
    pub opts: ScaleOptions,
}

impl PerTokenE5M6Params {
    /// Bundles the parameters.
    pub const fn new(num_per_channels: usize, opts: ScaleOptions) -> Self {
        Self {
            num_per_channels,
            opts,
        }
    }
}

/// Validates a per-token FP8/FP4 cast of `x` in `mode` (see the [module docs](self) for every
/// rule) and returns its plan: block `(1, npc)`, grid `(M, ceil(K/npc))`, and the layout of the
/// scales written (or, precomputed, read: layout A).
///
/// Errors, each naming the argument: `x` ([`TkError::Shape`] rank / odd `K` for e2m1,
/// [`TkError::Stride`], [`TkError::Empty`] for `K = 0`; [`TkError::Param`] for a quantized input
/// in sf-only or precomputed mode), `x_block_size` and `x.sf` (quantized input, see
/// [`crate::QuantInput::validate`]), `num_per_channels` ([`TkError::Param`]: not allowed, or
/// `npc == K` in a forbidden combination), `use_packed_ue8m0` / `use_tma_aligned_col_major_sf`
/// ([`TkError::Param`]).
pub fn validate(
    x: &CastInput<'_>,
    params: &PerTokenCastParams,
    mode: CastMode,
) -> Result<CastPlan> {
    let (m, k, quantized) = match x {
        CastInput::Plain(p) => {
            let (m, k) = p.validate("x")?;
            (m, k, false)
        }
        CastInput::Quantized(q) => {
            let g = q.validate()?;
            (g.m, g.k, true)
        }
    };
    validate_dims(m, k, quantized, params, mode)
}

/// The device-independent part of [`validate`]: the rules on the logical size `(m, k)`
/// (already checked as a matrix with `k >= 1`), the kind of input and the parameters.
pub fn validate_dims(
    m: usize,
    k: usize,
    quantized_input: bool,
    params: &PerTokenCastParams,
    mode: CastMode,
) -> Result<CastPlan> {
    let layout = scale_layout(&params.opts, mode)?;
    require_even_k_for_e2m1(params.fmt, &[m, k], k)?;
    let npc = params.num_per_channels;
    let whole_row = npc == k;
    if !(NUM_PER_CHANNELS.contains(&npc) || (whole_row && k % 64 == 0)) {
        let why = if whole_row {
            format!(" (npc == K = {k} needs K % 64 == 0)")
        } else {
            String::new()
        };
        return Err(TkError::param(
            "num_per_channels",
            format!(
                "must be 16, 32, 64 or 128, or equal to K with K % 64 == 0 (one scale per \
                 row); got {npc} with K = {k}{why}"
            ),
        ));
    }
    if whole_row {
        let with = if quantized_input {
            Some("a quantized input")
        } else {
            match mode {
                CastMode::Cast => None,
                CastMode::SfOnly => Some("sf-only mode"),
                CastMode::PrecomputedSf => Some("precomputed scales"),
            }
        };
        if let Some(with) = with {
            return Err(TkError::param(
                "num_per_channels",
                format!(
                    "npc == K = {k} (one scale per row) cannot be combined with {with} \
                     (upstream's whole-row kernel asserts this); use npc in {{16, 32, 64, \
                     128}} below K, or the generic reference::cast* functions"
                ),
            ));
        }
    }
    if quantized_input && mode != CastMode::Cast {
        let what = if mode == CastMode::SfOnly {
            "sf-only mode"
        } else {
            "precomputed scales"
        };
        return Err(TkError::param(
            "x",
            format!(
                "a quantized input (data with x_block_size scales) cannot be cast in {what} \
                 (upstream asserts this); dequantize it first, or use the generic \
                 reference::cast* functions"
            ),
        ));
    }
    CastPlan::new(m, k, (1, npc), layout)
}

/// Validates a per-token cast to E5M6 (§3.2): `x` fp32/bf16 `(M, K)` with any row stride,
/// `num_per_channels == K`, `K % 8 == 0`, scale flags selecting layout A, B or C. Returns the
/// plan: block `(1, K)`, grid `(M, 1)`.
///
/// Errors: `x` (rank, column stride, `K = 0`, `K % 8 != 0`), `num_per_channels`
/// ([`TkError::Param`], `!= K`), `use_packed_ue8m0` ([`ScaleOptions::layout`]).
pub fn validate_e5m6(x: &PlainInput<'_>, params: &PerTokenE5M6Params) -> Result<CastPlan> {
    let (m, k) = x.validate("x")?;
    validate_e5m6_dims(m, k, params)
}

/// The device-independent part of [`validate_e5m6`].
pub fn validate_e5m6_dims(m: usize, k: usize, params: &PerTokenE5M6Params) -> Result<CastPlan> {
    let layout = params.opts.layout()?;
    if params.num_per_channels != k {
        return Err(TkError::param(
            "num_per_channels",
            format!(
                "an E5M6 cast has one scale per row: num_per_channels must equal K = {k}, got \
                 {}",
                params.num_per_channels
            ),
        ));
    }
    require_multiple("x", &[m, k], "K", k, 8, "E5M6 packs 8 values into 12 bytes")?;
    CastPlan::new(m, k, (1, k), layout)
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU ops (feature `cuda`): the same rules as [`validate`], one kernel (`cuda/cast.cu`)
/// with block `(1, npc)`; bit-exact with [`crate::reference::per_token_cast`] and its variants.
#[cfg(feature = "cuda")]
mod gpu {
    use tk_core::dtype::E5M6Bytes;
    use tk_core::{DeviceTensor, DeviceView, DeviceViewMut, Result};

    use super::{validate_dims, validate_e5m6_dims, PerTokenCastParams, PerTokenE5M6Params};
    use crate::cast::{self, CastOutputs};
    use crate::device::{
        DeviceCastInput, DevicePlainInput, DeviceQuantData, DeviceQuantDataViewMut, DeviceScales,
    };
    use crate::plan::{CastMode, CastPlan};

    fn plan(x: &DeviceCastInput<'_>, p: &PerTokenCastParams, mode: CastMode) -> Result<CastPlan> {
        let (m, k, quantized) = x.validate()?;
        validate_dims(m, k, quantized, p, mode)
    }

    /// Per-token cast of `x` (fp32/bf16 `(M, K)`, or e4m3/e2m1 data with its scales) to
    /// `params.fmt`: data `(M, K)` e4m3 / `(M, K/2)` packed e2m1 and scales of grid
    /// `(M, ceil(K/npc))` in the layout the options select. Enqueued on `x`'s stream.
    pub fn per_token_cast(
        x: &DeviceCastInput<'_>,
        params: &PerTokenCastParams,
    ) -> Result<(DeviceQuantData, DeviceScales)> {
        let plan = plan(x, params, CastMode::Cast)?;
        cast::cast_alloc(x, params.fmt, &plan, params.opts.round_sf)
    }

    /// [`per_token_cast`] into caller-provided contiguous `out` and `out_sf` (of the plan's
    /// layout and grid).
    pub fn per_token_cast_into(
        x: &DeviceCastInput<'_>,
        params: &PerTokenCastParams,
        out: &mut DeviceQuantDataViewMut<'_>,
        out_sf: &mut DeviceScales,
    ) -> Result<()> {
        let plan = plan(x, params, CastMode::Cast)?;
        let outs = CastOutputs {
            out: Some(out),
            out_sf: Some(out_sf),
            sf: None,
        };
        cast::launch(
            x,
            params.fmt,
            &plan,
            params.opts.round_sf,
            CastMode::Cast,
            outs,
        )
    }

    /// The scales of [`per_token_cast`] only (`per_token_cast_with_sf_only`).
    pub fn per_token_cast_with_sf_only(
        x: &DeviceCastInput<'_>,
        params: &PerTokenCastParams,
    ) -> Result<DeviceScales> {
        let plan = plan(x, params, CastMode::SfOnly)?;
        cast::sf_only_alloc(x, params.fmt, &plan, params.opts.round_sf)
    }

    /// [`per_token_cast_with_sf_only`] into caller-provided `out_sf`.
    pub fn per_token_cast_with_sf_only_into(
        x: &DeviceCastInput<'_>,
        params: &PerTokenCastParams,
        out_sf: &mut DeviceScales,
    ) -> Result<()> {
        let plan = plan(x, params, CastMode::SfOnly)?;
        let outs = CastOutputs {
            out: None,
            out_sf: Some(out_sf),
            sf: None,
        };
        cast::launch(
            x,
            params.fmt,
            &plan,
            params.opts.round_sf,
            CastMode::SfOnly,
            outs,
        )
    }

    /// The data of a per-token cast with caller-given fp32 layout-A scales `sf`
    /// `(M, ceil(K/npc))` (any row stride): `inv = fl(1/sf)` per group.
    pub fn per_token_cast_with_precomputed_sf(
        x: &DeviceCastInput<'_>,
        params: &PerTokenCastParams,
        sf: &DeviceView<'_, f32>,
    ) -> Result<DeviceQuantData> {
        let plan = plan(x, params, CastMode::PrecomputedSf)?;
        cast::precomputed_alloc(x, params.fmt, &plan, sf)
    }

    /// [`per_token_cast_with_precomputed_sf`] into a caller-provided contiguous `out`.
    pub fn per_token_cast_with_precomputed_sf_into(
        x: &DeviceCastInput<'_>,
        params: &PerTokenCastParams,
        sf: &DeviceView<'_, f32>,
        out: &mut DeviceQuantDataViewMut<'_>,
    ) -> Result<()> {
        let plan = plan(x, params, CastMode::PrecomputedSf)?;
        let outs = CastOutputs {
            out: Some(out),
            out_sf: None,
            sf: Some(sf),
        };
        cast::launch(x, params.fmt, &plan, false, CastMode::PrecomputedSf, outs)
    }

    /// Per-token cast of `x` (fp32/bf16 `(M, K)`, `K % 8 == 0`, any row stride) to packed
    /// E5M6 (`per_token_cast(x, 'e5m6', K)`): bytes `(M, 3K/2)` and one scale per row (grid
    /// `(M, 1)` in the layout the options select). Bit-exact with
    /// [`crate::reference::per_token_cast_to_e5m6`], the quirk below `2^-14` included.
    pub fn per_token_cast_to_e5m6(
        x: &DevicePlainInput<'_>,
        params: &PerTokenE5M6Params,
    ) -> Result<(DeviceTensor<E5M6Bytes>, DeviceScales)> {
        let (m, k) = x.validate("x")?;
        let plan = validate_e5m6_dims(m, k, params)?;
        let mut out = x.device().alloc::<E5M6Bytes>(&[m, k / 2 * 3])?;
        let mut sf = DeviceScales::alloc(x.device(), plan.sf_layout, plan.grid)?;
        cast::launch_e5m6(x, &plan, params.opts.round_sf, &mut out.view_mut(), &mut sf)?;
        Ok((out, sf))
    }

    /// [`per_token_cast_to_e5m6`] into a caller-provided contiguous `out` `(M, 3K/2)` and
    /// `out_sf`.
    pub fn per_token_cast_to_e5m6_into(
        x: &DevicePlainInput<'_>,
        params: &PerTokenE5M6Params,
        out: &mut DeviceViewMut<'_, E5M6Bytes>,
        out_sf: &mut DeviceScales,
    ) -> Result<()> {
        let (m, k) = x.validate("x")?;
        let plan = validate_e5m6_dims(m, k, params)?;
        cast::launch_e5m6(x, &plan, params.opts.round_sf, out, out_sf)
    }
}
