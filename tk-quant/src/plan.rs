//! What the ops' `validate` functions share: the entry point of a cast ([`CastMode`]) and the
//! validated geometry of one call ([`CastPlan`]), plus the checks several ops repeat.
//!
//! Every op validates in two layers. The tensor arguments are checked by their types
//! ([`crate::PlainInput::validate`], [`crate::QuantInput::validate`]: rank, unit column stride,
//! `K >= 1`, the input scales' layout and shape). The op's own `validate` then checks what the
//! spec's section for the op requires (group and block sizes, divisibility of `K` or `M`,
//! forbidden combinations of flags and modes) and returns a [`CastPlan`]. The same plan is what
//! a GPU launch needs; the CPU references in [`crate::reference`] run it through the generic
//! reference with [`CastPlan::block`].

use tk_core::{Result, TkError};

use crate::scale::{ScaleGrid, ScaleLayout, ScaleOptions};

/// Which of upstream's three entry points of a scaled cast is meant (`*_cast`,
/// `*_cast_with_sf_only`, `*_cast_with_precomputed_sf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CastMode {
    /// Data and scales (`per_token_cast`, `per_block_cast`).
    #[default]
    Cast,
    /// The scales only, identical to those of [`CastMode::Cast`] (`*_with_sf_only`).
    SfOnly,
    /// The data only, quantized with caller-given scales (`*_with_precomputed_sf`): fp32,
    /// layout A, `inv = fl(1/sf)` per group.
    PrecomputedSf,
}

/// The validated geometry of one op call.
///
/// For a cast, `grid` and `sf_layout` describe the scales it writes (or, in
/// [`CastMode::PrecomputedSf`], the fp32 layout-A scales it reads); for a cast back, the scales
/// it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CastPlan {
    /// Rows `M` (may be 0).
    pub m: usize,
    /// Logical columns `K` (at least 1).
    pub k: usize,
    /// The scale block `(rows, columns)` one scale covers: `(1, npc)` per token, `(bm, bk)`
    /// per block, `(npt, 1)` per channel.
    pub block: (usize, usize),
    /// The scale grid `(ceil(M / block.0), ceil(K / block.1))`.
    pub grid: ScaleGrid,
    /// The layout of those scales.
    pub sf_layout: ScaleLayout,
}

impl CastPlan {
    /// Builds the plan of an `(m, k)` call with scale block `block` in `sf_layout`; a zero
    /// block side is an error naming `block_size`.
    pub(crate) fn new(
        m: usize,
        k: usize,
        block: (usize, usize),
        sf_layout: ScaleLayout,
    ) -> Result<Self> {
        Self::new_arg(m, k, block, sf_layout, "block_size")
    }

    /// [`CastPlan::new`] with the block argument's name for errors.
    pub(crate) fn new_arg(
        m: usize,
        k: usize,
        block: (usize, usize),
        sf_layout: ScaleLayout,
        arg: &'static str,
    ) -> Result<Self> {
        Ok(Self {
            m,
            k,
            block,
            grid: ScaleGrid::for_matrix_arg(m, k, block, arg)?,
            sf_layout,
        })
    }
}

/// The scale layout of a cast in `mode`: the layout the flags select ([`ScaleOptions::layout`])
/// for [`CastMode::Cast`] and [`CastMode::SfOnly`]; for [`CastMode::PrecomputedSf`], layout A,
/// with the column-major and packed flags rejected (upstream's reference asserts neither is set;
/// its kernel would read column-major scales in their storage orientation, untested, and would
/// compute `1/byte` from packed ones). `round_sf` has no effect on a precomputed cast.
pub(crate) fn scale_layout(opts: &ScaleOptions, mode: CastMode) -> Result<ScaleLayout> {
    if mode != CastMode::PrecomputedSf {
        return opts.layout();
    }
    if opts.use_packed_ue8m0 {
        return Err(TkError::param(
            "use_packed_ue8m0",
            "a cast with precomputed scales reads fp32 scales in layout A (row-major); packed \
             UE8M0 scales are not supported there: clear use_packed_ue8m0 and pass the scales \
             as fp32",
        ));
    }
    if opts.use_tma_aligned_col_major_sf {
        return Err(TkError::param(
            "use_tma_aligned_col_major_sf",
            "a cast with precomputed scales reads fp32 scales in layout A (row-major): clear \
             use_tma_aligned_col_major_sf and pass the scales row-major",
        ));
    }
    Ok(ScaleLayout::RowMajorF32)
}

/// Requires `n % divisor == 0` for the dimension `dim` (`"K"` or `"M"`) of `arg`, whose shape
/// as passed is `got`; `why` says who needs it.
pub(crate) fn require_multiple(
    arg: &'static str,
    got: &[usize],
    dim: &str,
    n: usize,
    divisor: usize,
    why: &str,
) -> Result<()> {
    if n % divisor != 0 {
        return Err(TkError::Shape {
            arg,
            expected: format!("{dim} % {divisor} == 0 ({why}); {dim} = {n}"),
            got: got.to_vec(),
        });
    }
    Ok(())
}

/// Requires an even `K` for FP4 e2m1 output (two values per byte).
pub(crate) fn require_even_k_for_e2m1(
    fmt: crate::CastFormat,
    got: &[usize],
    k: usize,
) -> Result<()> {
    if fmt == crate::CastFormat::E2M1 {
        require_multiple("x", got, "K", k, 2, "e2m1 output packs two values per byte")?;
    }
    Ok(())
}
