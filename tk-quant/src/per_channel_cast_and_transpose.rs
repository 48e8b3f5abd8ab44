//! `per_channel_cast_and_transpose` (`spec/quant.md` §3.7): FP8 e4m3 cast with one scale per
//! column per block of `npt` rows, the data written transposed.
//!
//! # What it computes
//!
//! For each column `c` and row block `b` (rows `[npt·b, npt·b + npt)`):
//!
//! 1. `amax = max |x[r, c]|` over the block (NaN ignored);
//! 2. `(sf, inv)` per §1.4 for e4m3 (`ε = 1e-4`, `Q = 448`; powers of two with `round_sf`),
//!    `out_sf[b, c] = sf`;
//! 3. `out[c, r] = enc8(fl(x[r, c] · inv))`: the **data** is transposed, the scales are not.
//!
//! It is the generic cast ([`reference::cast`](fn@crate::reference::cast)) with block
//! `(npt, 1)`, layout A, followed by a transpose of the data, as upstream's reference says.
//!
//! | argument | dtype | shape | notes |
//! |---|---|---|---|
//! | `x` | bf16 | `(M, K)`, `M % 128 == 0`, `K % 64 == 0` | unit column stride, any row stride |
//! | `out` | e4m3 | `(K, M)` | contiguous |
//! | `out_sf` | fp32 | `(M/npt, K)` | layout A (row-major), never transposed |
//!
//! # Preconditions ([`validate`])
//!
//! * `x` bf16 (by type: [`tk_core::HostView`]`<bf16>`), `M % 128 == 0` (`M = 0` allowed),
//!   `K % 64 == 0`, `K >= 1`.
//! * `num_per_tokens` ∈ {32, 128} ([`NUM_PER_TOKENS`]). The format is e4m3.
//!
//! # Deviations from upstream
//!
//! * Any row stride is accepted (upstream: contiguous).
//! * NaN / inf inputs follow the GPU (§5 item 6), as in the generic reference.

use half::bf16;
use tk_core::{HostView, Result, TkError};

use crate::plan::{require_multiple, CastPlan};
use crate::scale::ScaleLayout;
use crate::types::PlainInput;

/// The row-block heights `npt` the op accepts.
pub const NUM_PER_TOKENS: [usize; 2] = [32, 128];

/// The parameters of the op (upstream's `num_per_tokens` and `round_sf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PerChannelCastAndTransposeParams {
    /// `npt`, rows per scale: 32 or 128.
    pub num_per_tokens: usize,
    /// Round each scale up to a power of two (§1.4).
    pub round_sf: bool,
}

impl PerChannelCastAndTransposeParams {
    /// Bundles the parameters.
    pub const fn new(num_per_tokens: usize, round_sf: bool) -> Self {
        Self {
            num_per_tokens,
            round_sf,
        }
    }
}

/// Validates a call and returns its plan: block `(npt, 1)`, grid `(M/npt, K)`, layout A.
///
/// Errors: `x` ([`TkError::Shape`]: rank, `M % 128 != 0`, `K % 64 != 0`; [`TkError::Stride`];
/// [`TkError::Empty`] for `K = 0`), `num_per_tokens` ([`TkError::Param`]).
pub fn validate(
    x: &HostView<'_, bf16>,
    params: &PerChannelCastAndTransposeParams,
) -> Result<CastPlan> {
    let (m, k) = PlainInput::BF16(x.clone()).validate("x")?;
    validate_dims(m, k, params)
}

/// The device-independent part of [`validate`], on `(M, K)`.
pub fn validate_dims(
    m: usize,
    k: usize,
    params: &PerChannelCastAndTransposeParams,
) -> Result<CastPlan> {
    require_multiple("x", &[m, k], "M", m, 128, "the kernel tiles rows by 128")?;
    require_multiple("x", &[m, k], "K", k, 64, "the kernel tiles columns by 64")?;
    let npt = params.num_per_tokens;
    if !NUM_PER_TOKENS.contains(&npt) {
        return Err(TkError::param(
            "num_per_tokens",
            format!("must be 32 or 128, got {npt}"),
        ));
    }
    CastPlan::new_arg(m, k, (npt, 1), ScaleLayout::RowMajorF32, "num_per_tokens")
}
