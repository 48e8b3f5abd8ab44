//! The SwiGLU activation on the CPU, with the spec's exact operation order, and the helpers the
//! SwiGLU references share (see [`crate::swiglu`] for how `expf` is handled).
//!
//! | function | what |
//! |---|---|
//! | [`cpu_expf`] | the documented CPU `expf`: the correctly rounded `exp` |
//! | [`clamp_gate`], [`clamp_value`] | the clamp of `l` (above only) and `v` (both sides), with the flags the counts and the backward need |
//! | [`swiglu_activation`] | `fl(fl(l / fl(1 + expf(−l))) · v)` after the clamp, with a caller-given `expf` |
//! | [`activation_within_tolerance`] | the tolerance between a GPU activation and this one |

use tk_core::convert::{compute_scale, compute_scale_with_eps};

use super::quant_rows;
use crate::scale::{HostScales, ScaleGrid, ScaleLayout};
use crate::types::{row, CastFormat, QuantData};
use tk_core::{HostView, Result};

/// The CPU `expf` of the references: [`tk_core::math::expf`], `e^x` correctly rounded.
///
/// CUDA's `expf` (maximum error 2 ulps, Appendix A.1) returns the same value for about 93% of
/// fp32 inputs and differs in the last bit(s) otherwise; see [`crate::swiglu`].
pub use tk_core::math::expf as cpu_expf;

/// The clamp of the gate: `(C, true)` if `l > C`, else `(l, false)`; no clamp without `C`.
pub fn clamp_gate(l: f32, c: Option<f32>) -> (f32, bool) {
    match c {
        Some(c) if l > c => (c, true),
        _ => (l, false),
    }
}

/// The clamp of the value: `(C, true, false)` if `v > C`, `(−C, false, true)` if `v < −C`,
/// else `(v, false, false)`; no clamp without `C`. The flags are `(above, below)`.
pub fn clamp_value(v: f32, c: Option<f32>) -> (f32, bool, bool) {
    match c {
        Some(c) if v > c => (c, true, false),
        Some(c) if v < -c => (-c, false, true),
        _ => (v, false, false),
    }
}

/// The SwiGLU activation of one pair `(l, v)`: clamp (if `c` is given, [`clamp_gate`],
/// [`clamp_value`]), then `fl(fl(l / fl(1 + expf(−l))) · v)`, each operation rounded on its
/// own, `expf` as given (use [`cpu_expf`], or the GPU's values).
pub fn swiglu_activation(
    l: f32,
    v: f32,
    c: Option<f32>,
    expf: &(impl Fn(f32) -> f32 + ?Sized),
) -> f32 {
    let (l, _) = clamp_gate(l, c);
    let (v, _, _) = clamp_value(v, c);
    let t = 1.0 + expf(-l);
    (l / t) * v
}

/// The relative tolerance of [`activation_within_tolerance`]: `2^-20`.
pub const ACTIVATION_REL_TOL: f32 = 1.0 / (1u32 << 20) as f32;

/// The absolute tolerance of [`activation_within_tolerance`]: `2^-100`.
pub const ACTIVATION_ABS_TOL: f32 = f32::from_bits((127 - 100) << 23);

/// True if a GPU activation `gpu` (computed with CUDA's `expf`) agrees with `cpu` (the same
/// operations with [`cpu_expf`]) within the error `expf` can introduce.
///
/// Bit-equal values (NaN included, by bits) always agree. Otherwise both must be finite and
/// `|gpu − cpu| <= 2^-20 · max(|gpu|, |cpu|) + 2^-100`.
///
/// Derivation: the two `expf` values differ by at most 2.5 ulps (CUDA's 2-ulp bound plus this
/// side's half ulp), i.e. a relative `2.5 · 2^-23`; `t = 1 + e` inherits at most that relative
/// difference; each of the up to four following roundings (`1 + e`, `/`, `· v`, `· w`) adds at
/// most `2^-24` per side. The total, `6.5 · 2^-23`, is below `2^-20 = 8 · 2^-23`. The absolute
/// term covers the overflow boundary of `exp(−l)` (`l ≈ −88.7`), where one side may get `+inf`
/// (`l / t = −0`) and the other a finite `t ≈ 2^128` (`|l / t| < 2^-120`), for `|v · w| <= 2^20`.
pub fn activation_within_tolerance(gpu: f32, cpu: f32) -> bool {
    if gpu.to_bits() == cpu.to_bits() {
        return true;
    }
    if !(gpu.is_finite() && cpu.is_finite()) {
        return false;
    }
    let d = (gpu as f64 - cpu as f64).abs();
    d <= ACTIVATION_REL_TOL as f64 * (gpu.abs().max(cpu.abs()) as f64) + ACTIVATION_ABS_TOL as f64
}

/// `(sf, inv)` of §1.4 with a caller-given `ε` (`sf_clamp_min`), or the format's `ε` when
/// `None`: `c = max(amax, ε)`, then [`compute_scale`]'s arithmetic (`fl(c/Q)`, `fl(Q/c)`, or
/// the powers of two `2^ceil(log2(c/Q))`, `2^-e`). With `eps = None` this is
/// [`compute_scale`] itself.
pub(crate) fn scale_pair(
    amax: f32,
    fmt: CastFormat,
    eps: Option<f32>,
    round_sf: bool,
) -> (f32, f32) {
    match eps {
        None => compute_scale(amax, fmt.quant_format(), round_sf),
        Some(eps) => compute_scale_with_eps(amax, fmt.max_value(), eps, round_sf),
    }
}

/// The parameters of [`cast_rows`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowCast {
    /// Target format.
    pub fmt: CastFormat,
    /// Group width.
    pub npc: usize,
    /// Scale layout.
    pub layout: ScaleLayout,
    /// Power-of-two scales.
    pub round_sf: bool,
    /// `ε` override (`sf_clamp_min`).
    pub eps: Option<f32>,
}

/// A per-token cast of the fp32 matrix `values` (`m × k`, unit column stride, any row
/// stride) with groups of `npc` columns: per group `amax = max |v|` (NaN ignored), `(sf, inv)`
/// by [`scale_pair`], `q = enc(fl(v · inv))`. Rows for which `skip(r)` holds are written as
/// zeros with a zero scale (+0.0, UE8M0 byte 0), whatever `values` holds there.
///
/// Rows are computed in parallel ([`super::par_rows`]; each group's `amax` folds its elements
/// left to right, as a sequential loop would), each row in one pass: its groups' scales, then
/// its codes while the row is still in cache.
pub(crate) fn cast_rows(
    values: &HostView<'_, f32>,
    p: RowCast,
    skip: &(dyn Fn(usize) -> bool + Sync),
) -> Result<(QuantData, HostScales)> {
    let (m, k) = (values.shape()[0], values.shape()[1]);
    let grid = ScaleGrid::for_matrix(m, k, (1, p.npc))?;
    // Each processed row's `sf` per group, `None` for the skipped rows.
    let (data, sfs) = quant_rows(p.fmt, (m, k), |r, codes| {
        if skip(r) {
            codes.fill(0);
            return None;
        }
        let chunks = codes.chunks_mut(p.npc).zip(row(values, r).chunks(p.npc));
        let sf: Vec<f32> = chunks
            .map(|(cs, vs)| {
                let amax = vs.iter().fold(0.0f32, |acc, x| acc.max(x.abs()));
                let (sf, inv) = scale_pair(amax, p.fmt, p.eps, p.round_sf);
                p.fmt.encode_scaled(cs, vs, inv);
                sf
            })
            .collect();
        Some(sf)
    })?;
    let mut sf = HostScales::zeros(p.layout, grid);
    for (r, row_sf) in sfs.iter().enumerate() {
        for (g, &s) in row_sf.iter().flatten().enumerate() {
            sf.set(r, g, s);
        }
    }
    Ok((data, sf))
}
