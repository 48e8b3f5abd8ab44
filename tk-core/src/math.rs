//! fp32 elementary functions for the CPU references, correctly rounded: each is evaluated in
//! f64 and rounded once to f32 (exact except for inputs closer to a rounding boundary than
//! about 2^-29 f32 ulps). CUDA's versions are within a few ulps of these (`expf` 2 ulps,
//! `log1pf` 1 ulp; spec/quant.md Appendix A), so references built on them say where a GPU
//! result may differ in the last bits.

/// `e^x` correctly rounded to fp32. Overflow gives `+inf` (for `x > ~88.72`), underflow goes
/// through the subnormals to `+0`; NaN gives NaN.
pub fn expf(x: f32) -> f32 {
    (x as f64).exp() as f32
}

/// `log(1 + x)` correctly rounded to fp32.
pub fn log1pf(x: f32) -> f32 {
    (x as f64).ln_1p() as f32
}
