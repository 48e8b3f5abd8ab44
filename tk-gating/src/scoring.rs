//! Scoring functions of the gating ops (`spec/moe.md` §4.1): [`ScoringFunc`] and the exact fp32
//! formulas behind it.
//!
//! | function | fp32 operation order |
//! |---|---|
//! | [`sigmoid`] | `e = expf(-x); d = 1 + e; s = 1 / d` |
//! | [`softplus`] | `x` if `x > 20` (strict), else `log1pf(expf(x))` |
//! | [`sqrt_softplus`] | `sqrtf(softplus(x))` |
//! | [`softmax_into`] | `m = max_j x_j; e_j = expf(x_j - m); Z = warp_sum(e); p_j = e_j / Z` |
//! | identity | `x` |
//!
//! Every step is one fp32 operation rounded to nearest even: additions, subtractions,
//! divisions and `sqrt` are IEEE-correct (as CUDA's without `--use_fast_math`).
//!
//! **Transcendental functions.** [`expf`] and [`log1pf`] here are the *correctly rounded* fp32
//! values, computed in f64 by the platform's libm and rounded once to fp32. The f64 result is
//! within one f64 ulp of the exact value, so the rounding can only go wrong for an input whose
//! exact result lies within 2⁻²⁹ fp32 ulp of a rounding midpoint — a handful of inputs at most
//! (none is known). CUDA's `expf` (non-fast-math) is accurate to 2 ulp and its `log1pf` to 1
//! ulp, so the GPU kernels do not use them: they evaluate `exp` and `log1p` in double precision
//! and round once to fp32 — the same construction — so GPU scores equal these references bit
//! for bit except where the two double results (each within about one double ulp) straddle an
//! fp32 rounding boundary (probability about 2⁻²⁸ per value). The GPU tests therefore compare
//! indices exactly (on inputs generated with ranking gaps, see `testing` with feature `cpu`)
//! and weights within the spec's tolerance (`torch.allclose`, `rtol = 1e-5`, `atol = 1e-8`),
//! and report the largest ulp distance. Against the exact real functions, the references are
//! within 3 ulp for sigmoid (three roundings) and 2 ulp for softplus and sqrt-softplus; softmax
//! probabilities carry in addition the rounding of `x_j - m` and of the `E`-term sum (the tests
//! check these bounds).
//!
//! **Softmax denominator order.** `Z` is summed as the upstream kernel does (§4.5 "Numerics"),
//! generalised to any row length: see [`warp_sum`].

use std::fmt;
use std::str::FromStr;

use tk_core::{Result, TkError};

/// The scoring function of a gate: upstream's integer enum (`SIGMOID = 0`, `SQRTSOFTPLUS = 1`,
/// `SOFTMAX = 2`, `IDENTITY = 3`).
///
/// Parsing ([`FromStr`], [`ScoringFunc::from_label`]) is case-insensitive on the lower-case
/// names that [`Display`](fmt::Display) prints: `"sigmoid"`, `"sqrtsoftplus"`, `"softmax"`,
/// `"identity"`. `top2_sum_gate` rejects [`ScoringFunc::Identity`] (as upstream's wrapper does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ScoringFunc {
    /// `1 / (1 + exp(-x))`, elementwise.
    Sigmoid = 0,
    /// `sqrt(softplus(x))`, elementwise, with softplus's threshold 20.
    SqrtSoftplus = 1,
    /// Softmax over the whole row (all `E` routed experts).
    Softmax = 2,
    /// The logit itself.
    Identity = 3,
}

impl ScoringFunc {
    /// Every scoring function, in discriminant order.
    pub const ALL: [ScoringFunc; 4] = [
        ScoringFunc::Sigmoid,
        ScoringFunc::SqrtSoftplus,
        ScoringFunc::Softmax,
        ScoringFunc::Identity,
    ];

    /// The lower-case name (upstream's `str()`).
    pub const fn name(self) -> &'static str {
        match self {
            ScoringFunc::Sigmoid => "sigmoid",
            ScoringFunc::SqrtSoftplus => "sqrtsoftplus",
            ScoringFunc::Softmax => "softmax",
            ScoringFunc::Identity => "identity",
        }
    }

    /// Upstream's integer value (0..=3), e.g. for a kernel define.
    pub const fn value(self) -> i32 {
        self as i32
    }

    /// Looks a label up case-insensitively (upstream's `from_str`). An unknown label is a
    /// [`TkError::Param`] naming `scoring_func`.
    pub fn from_label(label: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(label))
            .ok_or_else(|| {
                TkError::param(
                    "scoring_func",
                    format!(
                        "unknown scoring function {label:?}; expected one of sigmoid, \
                         sqrtsoftplus, softmax, identity (any case)"
                    ),
                )
            })
    }

    /// True for the functions that score each logit on its own (all but softmax).
    pub const fn is_elementwise(self) -> bool {
        !matches!(self, ScoringFunc::Softmax)
    }

    /// The score of one logit for an elementwise function ([`sigmoid`], [`sqrt_softplus`],
    /// identity); `None` for softmax, which needs the whole row ([`ScoringFunc::score_row`]).
    pub fn score(self, x: f32) -> Option<f32> {
        match self {
            ScoringFunc::Sigmoid => Some(sigmoid(x)),
            ScoringFunc::SqrtSoftplus => Some(sqrt_softplus(x)),
            ScoringFunc::Identity => Some(x),
            ScoringFunc::Softmax => None,
        }
    }

    /// Scores a whole row of logits into `out` (same length; if the lengths differ only the
    /// common prefix is written, and for softmax nothing). Elementwise functions follow IEEE
    /// propagation (NaN in, NaN out; `sigmoid(-inf) = 0`, `sigmoid(+inf) = 1`); see
    /// [`softmax_into`] for softmax of non-finite rows.
    pub fn score_row(self, logits: &[f32], out: &mut [f32]) {
        match self {
            ScoringFunc::Softmax => softmax_into(logits, out),
            ScoringFunc::Sigmoid => map_into(logits, out, sigmoid),
            ScoringFunc::SqrtSoftplus => map_into(logits, out, sqrt_softplus),
            ScoringFunc::Identity => map_into(logits, out, |x| x),
        }
    }
}

fn map_into(x: &[f32], out: &mut [f32], f: impl Fn(f32) -> f32) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f(v);
    }
}

impl fmt::Display for ScoringFunc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ScoringFunc {
    type Err = TkError;

    fn from_str(s: &str) -> Result<Self> {
        Self::from_label(s)
    }
}

/// `exp(x)` and `log(1 + x)` correctly rounded to fp32 (tk-core's; the GPU's `expf` is within
/// 2 ulp and `log1pf` within 1 ulp of these).
pub use tk_core::math::{expf, log1pf};

/// The softplus threshold: above it (strictly), softplus returns its input.
pub const SOFTPLUS_THRESHOLD: f32 = 20.0;

/// `sigmoid(x) = 1 / (1 + exp(-x))` in fp32: `e = expf(-x)`, `d = 1 + e`, `s = 1 / d`, each
/// step rounded. `sigmoid(-inf) = 0` (`1/inf`), `sigmoid(+inf) = 1`, NaN gives NaN.
pub fn sigmoid(x: f32) -> f32 {
    let e = expf(-x);
    let d = 1.0f32 + e;
    1.0f32 / d
}

/// `softplus(x) = x` if `x > 20.0` (strict), else `log1pf(expf(x))` — `torch.nn.functional.
/// softplus(beta=1, threshold=20)`. Near 20 both branches give the same fp32 value; the
/// threshold keeps large inputs finite (`exp` overflows above 88.7). NaN gives NaN.
pub fn softplus(x: f32) -> f32 {
    if x > SOFTPLUS_THRESHOLD {
        x
    } else {
        log1pf(expf(x))
    }
}

/// `sqrt(softplus(x))` with an IEEE-correct fp32 square root.
pub fn sqrt_softplus(x: f32) -> f32 {
    softplus(x).sqrt()
}

/// Number of lanes of the warp whose summation order [`warp_sum`] reproduces.
pub const WARP_LANES: usize = 32;
/// Consecutive elements a lane owns in one pass (the kernel's vector width).
pub const LANE_VECTOR: usize = 4;

/// `Σ values` in the upstream kernel's order (§4.5 "Numerics"), for any length:
///
/// 1. lane `ℓ = (j / 4) mod 32` owns element `j`, i.e. lane `ℓ` holds
///    `{i·128 + 4ℓ + v : v < 4}` for `i = 0, 1, ...`; each lane adds its elements in
///    increasing `j` to an fp32 accumulator that starts at `+0.0`;
/// 2. the 32 lane sums are combined by an XOR butterfly with offsets 16, 8, 4, 2, 1
///    (`p[ℓ] = p[ℓ] + p[ℓ ^ off]`). Every lane ends with the same value, because fp32 addition
///    is commutative; that value is returned.
///
/// For an empty slice the result is `+0.0`.
pub fn warp_sum(values: &[f32]) -> f32 {
    let mut lanes = [0.0f32; WARP_LANES];
    for (j, &v) in values.iter().enumerate() {
        lanes[(j / LANE_VECTOR) % WARP_LANES] += v;
    }
    let mut off = WARP_LANES / 2;
    while off > 0 {
        let prev = lanes;
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane = prev[l] + prev[l ^ off];
        }
        off /= 2;
    }
    lanes[0]
}

/// Softmax of a row into `out` (same length; nothing is written if the lengths differ):
/// `m = max_j x_j` (exact, order-free), `e_j = expf(x_j - m)` (the subtraction rounded first),
/// `Z = `[`warp_sum`]`(e)`, `p_j = e_j / Z` (IEEE division).
///
/// Rows the gates accept are finite (then `Z >= 1` and nothing overflows). For other rows the
/// result follows IEEE arithmetic: a NaN or `+inf` anywhere makes the whole row NaN, a row of
/// only `-inf` is all NaN, and `-inf` entries of an otherwise finite row get `0`.
pub fn softmax_into(x: &[f32], out: &mut [f32]) {
    if x.len() != out.len() || x.is_empty() {
        return;
    }
    // NaN-propagating max (the row is NaN if any entry is, whatever `max` would pick).
    let m = x.iter().fold(f32::NEG_INFINITY, |m, &v| {
        if v.is_nan() || m.is_nan() {
            f32::NAN
        } else if v > m {
            v
        } else {
            m
        }
    });
    for (o, &v) in out.iter_mut().zip(x) {
        *o = expf(v - m);
    }
    let z = warp_sum(out);
    for o in out.iter_mut() {
        *o /= z;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warp_sum_matches_sequential_for_exact_values() {
        let v: Vec<f32> = (0..300).map(|i| i as f32).collect();
        assert_eq!(warp_sum(&v), (0..300).sum::<i32>() as f32);
        assert_eq!(warp_sum(&[]), 0.0);
        assert_eq!(warp_sum(&[1.5]), 1.5);
    }

    #[test]
    fn warp_sum_order_differs_from_sequential() {
        // Lane 0 holds 2^24 and lane 1 holds four 1.0s: a sequential left-to-right sum of
        // [2^24, 0, 0, 0, 1, 1, 1, 1] loses every 1.0 (2^24 + 1 rounds to 2^24), the warp order
        // first sums the lane (1+1+1+1 = 4) and then 2^24 + 4 is exact.
        let v = [16_777_216.0f32, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        let sequential = v.iter().fold(0.0f32, |a, &b| a + b);
        assert_eq!(sequential, 16_777_216.0);
        assert_eq!(warp_sum(&v), 16_777_220.0);
    }
}
