//! `reduce_fused` (`spec/moe.md` §4.14, §5.15): the weighted gather-reduce from the fused
//! (expert-major) buffer back to tokens, optionally quantized to FP8 e4m3 with a global scale.
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `x` | `(M, H)` | [`ReduceElement`]: fp32, bf16 or f16 (`in_dtype`) | unit last stride, any row stride; any `H` (upstream asserts `H % 256 == 0`) |
//! | `x_sf` (optional) | `(M,)` | fp32 | one scale per fused row, any stride |
//! | `topk_weights` (optional) | `(T, K)` | fp32 | unit last stride; absent = every weight `1.0` |
//! | `token_topk_to_pos` | `(T, K)`, `K >= 1` | i32 | unit last stride; entries `-1` or in `0..M` |
//! | `sf` (optional) | `(1,)` | fp32 | global output multiplier; **FP8 output only** |
//! | output | `(T, H)` | `in_dtype` ([`ReduceOut::Input`]) or e4m3fn ([`ReduceOut::E4m3`]) | contiguous |
//!
//! **Semantics (bit-exact).** Per token `t` and column `h`, in fp32:
//!
//! ```text
//! acc = +0.0
//! for k in 0..K (in slot order):
//!     p = token_topk_to_pos[t, k];  if p == -1: skip
//!     s = topk_weights[t, k]  (or 1.0 without weights)
//!     if x_sf: s = s * x_sf[p]                      (one fp32 multiply, before the FMA)
//!     acc = fma(f32(x[p, h]), s, acc)               (fused: one rounding)
//! r = acc * sf[0] if sf else acc                    (one fp32 multiply)
//! out[t, h] = convert(r)                            (RNE)
//! ```
//!
//! `convert` is the identity for fp32, round-to-nearest-even for bf16 / f16, and for e4m3 the
//! **saturating** RNE conversion of [`tk_core::convert::e4m3_from_f32`]: magnitudes above 448
//! (and ±inf) become ±448, NaN becomes `0x7F`. This is the GPU's `cvt.rn.satfinite` and
//! upstream's kernel; upstream's PyTorch reference would give NaN above 464 (spec §4.14
//! Ambiguity) — the two agree on the spec's test data. A token whose slots are all `-1` gives
//! `+0.0` (`0·sf`, i.e. `-0.0`, when `sf < 0`). The same row may be read by several slots.
//!
//! **Index contract** ([`crate::index`]): `token_topk_to_pos` entries are `-1` or in `0..M`; the
//! CPU rejects anything else ([`TkError::Param`] naming `token_topk_to_pos`), the GPU reads it
//! as `-1` (upstream reads out of bounds).

use tk_core::{DType, Element, Layout, Result, TkError};

use crate::checks::{check_matrix, check_rank, check_shape};

/// An fp32-convertible input/output element of `reduce_fused`: fp32, bf16 or f16.
pub trait ReduceElement: Element {
    /// The exact fp32 value.
    fn to_f32(self) -> f32;
    /// Round to nearest even from fp32 (identity for fp32).
    fn from_f32_rne(v: f32) -> Self;
}

impl ReduceElement for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32_rne(v: f32) -> Self {
        v
    }
}

impl ReduceElement for half::bf16 {
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn from_f32_rne(v: f32) -> Self {
        tk_core::convert::bf16_from_f32(v)
    }
}

impl ReduceElement for half::f16 {
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32_rne(v: f32) -> Self {
        tk_core::convert::f16_from_f32(v)
    }
}

/// The output format (upstream's `fp8_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReduceOut {
    /// Same dtype as `x` (`fp8_format = ''`).
    #[default]
    Input,
    /// FP8 e4m3fn, saturating (`fp8_format = 'e4m3'`); the only format that takes `sf`.
    E4m3,
}

/// The parameters of `reduce_fused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReduceFusedParams {
    /// The output format.
    pub out: ReduceOut,
}

/// The layouts of one `reduce_fused` call (`None` = the optional tensor is absent).
#[derive(Debug, Clone, Copy)]
pub struct ReduceFusedLayouts<'a> {
    /// `x (M, H)`.
    pub x: &'a Layout,
    /// `x_sf (M,)`.
    pub x_sf: Option<&'a Layout>,
    /// `topk_weights (T, K)`.
    pub topk_weights: Option<&'a Layout>,
    /// `token_topk_to_pos (T, K)`.
    pub token_topk_to_pos: &'a Layout,
    /// `sf (1,)`.
    pub sf: Option<&'a Layout>,
}

/// The validated geometry of one `reduce_fused` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReduceFusedShape {
    /// `T`.
    pub num_tokens: usize,
    /// `K`.
    pub num_topk: usize,
    /// `M`: rows of `x`.
    pub num_rows: usize,
    /// `H`.
    pub hidden: usize,
}

impl ReduceFusedShape {
    /// The output shape `(T, H)`.
    pub fn out_shape(&self) -> [usize; 2] {
        [self.num_tokens, self.hidden]
    }
}

impl ReduceFusedParams {
    /// Parameters for the output format `out`.
    pub const fn new(out: ReduceOut) -> Self {
        Self { out }
    }

    /// Validates the layouts and `in_dtype` (fp32, bf16 or f16): `x (M, H)`,
    /// `token_topk_to_pos (T, K)` with `K >= 1` and `M <= i32::MAX`, `topk_weights` of the same
    /// shape, `x_sf (M,)`, `sf (1,)` only with [`ReduceOut::E4m3`].
    ///
    /// Errors: [`TkError::Shape`] / [`TkError::Stride`] / [`TkError::Empty`] naming the tensor,
    /// [`TkError::Dtype`] naming `x`, [`TkError::Param`] naming `sf`.
    pub fn validate(
        &self,
        layouts: &ReduceFusedLayouts<'_>,
        in_dtype: DType,
    ) -> Result<ReduceFusedShape> {
        if !matches!(in_dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(TkError::Dtype {
                arg: "x",
                expected: "fp32, bf16 or f16".into(),
                got: in_dtype,
            });
        }
        let (m, h) = check_matrix("x", layouts.x, "rank 2 (M, H)")?;
        if m > i32::MAX as usize {
            return Err(TkError::Shape {
                arg: "x",
                expected: format!("(M, H) with M <= {} (positions are int32)", i32::MAX),
                got: layouts.x.shape().to_vec(),
            });
        }
        let (t, k) = check_matrix(
            "token_topk_to_pos",
            layouts.token_topk_to_pos,
            "rank 2 (T, K)",
        )?;
        if k == 0 {
            return Err(TkError::Empty {
                arg: "token_topk_to_pos",
                shape: vec![t, k],
            });
        }
        if let Some(w) = layouts.topk_weights {
            check_matrix("topk_weights", w, "rank 2 (T, K)")?;
            check_shape(
                "topk_weights",
                w,
                &[t, k],
                &format!("(T, K) = ({t}, {k}), token_topk_to_pos' shape"),
            )?;
        }
        if let Some(s) = layouts.x_sf {
            check_rank("x_sf", s, 1, "rank 1 (M,)")?;
            check_shape("x_sf", s, &[m], &format!("(M,) = ({m},), x's row count"))?;
        }
        if let Some(s) = layouts.sf {
            if self.out != ReduceOut::E4m3 {
                return Err(TkError::param(
                    "sf",
                    "only FP8 (e4m3) output supports the global scale sf",
                ));
            }
            check_shape("sf", s, &[1], "(1,)")?;
        }
        Ok(ReduceFusedShape {
            num_tokens: t,
            num_topk: k,
            num_rows: m,
            hidden: h,
        })
    }
}
