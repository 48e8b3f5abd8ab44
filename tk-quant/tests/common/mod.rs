//! Helpers shared by the tk-quant test files.
#![allow(dead_code)]

use tk_core::testing::calc_diff;
use tk_core::TkError;

/// `fl(a / b)` computed independently of f32 division: the f64 quotient of two f32 values
/// rounded once to f32 (double rounding is innocuous for a quotient of 24-bit significands).
pub fn div_f32(a: f32, b: f32) -> f32 {
    (a as f64 / b as f64) as f32
}

/// The smallest power of two `>= x` (x a positive normal f32), by doubling/halving in f64.
pub fn pow2_ceil(x: f32) -> f32 {
    let x = x as f64;
    let mut p = 1.0f64;
    while p < x {
        p *= 2.0;
    }
    while p / 2.0 >= x {
        p /= 2.0;
    }
    p as f32
}

/// The spec's `calc_diff` on f32 data.
pub fn calc_diff_f32(x: &[f32], y: &[f32]) -> f64 {
    let a: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let b: Vec<f64> = y.iter().map(|&v| v as f64).collect();
    calc_diff(&a, &b)
}

/// The spec's `check_bias(x, ref)` (§4.3): no systematic rounding direction.
pub fn check_bias(what: &str, x: &[f32], reference: &[f32]) {
    assert_eq!(x.len(), reference.len());
    if x.is_empty() {
        return;
    }
    let less = x.iter().zip(reference).filter(|(a, b)| a < b).count() as f64;
    let equal = x.iter().zip(reference).filter(|(a, b)| a == b).count() as f64;
    let n = x.len() as f64;
    let ratio = (less + equal / 2.0) / n;
    assert!(
        (ratio - 0.5).abs() < 10.0 / n.sqrt(),
        "{what}: biased rounding, ratio {ratio}"
    );
}

#[allow(unused_imports)] // not every test file that includes this module uses it
pub use tk_core::testing::assert_param;

/// The argument an error names (`""` for errors about no argument).
pub fn err_arg(err: &TkError) -> &'static str {
    err.arg().unwrap_or("")
}

/// Every finite non-negative e4m3 value, by code (0x00..=0x7E), from the format definition.
pub fn e4m3_grid() -> Vec<(u8, f64)> {
    (0u8..=0x7E)
        .map(|c| {
            let e = (c >> 3) as i32;
            let m = (c & 7) as f64;
            let v = if e == 0 {
                m / 8.0 * 2f64.powi(-6)
            } else {
                (1.0 + m / 8.0) * 2f64.powi(e - 7)
            };
            (c, v)
        })
        .collect()
}

/// Every non-negative e2m1 value, by code (0..=7).
pub fn e2m1_grid() -> Vec<(u8, f64)> {
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
        .iter()
        .enumerate()
        .map(|(c, &v)| (c as u8, v))
        .collect()
}

/// Checks that magnitude code `code` is a correct round-to-nearest-even (saturating) encoding
/// of `y` on `grid` (ascending values; finite `y`): a nearest grid value, the even code on a
/// tie, the largest value at or above the top of the range.
pub fn assert_nearest(what: &str, y: f32, code: u8, grid: &[(u8, f64)]) {
    let a = (y as f64).abs();
    let got = grid
        .iter()
        .find(|&&(c, _)| c == code)
        .unwrap_or_else(|| panic!("{what}: code {code:#x} not on the grid"))
        .1;
    let top = grid.last().unwrap().1;
    if a >= top {
        assert_eq!(got, top, "{what}: {y} must saturate");
        return;
    }
    // The grid values around a: lo <= a < hi.
    let i = grid.partition_point(|&(_, g)| g <= a);
    let (lo, hi) = (grid[i - 1], grid[i]);
    let (dlo, dhi) = (a - lo.1, hi.1 - a);
    let want = if dlo < dhi {
        lo
    } else if dhi < dlo {
        hi
    } else if lo.0 % 2 == 0 {
        lo // tie: the even code
    } else {
        hi
    };
    assert_eq!(
        (code, got),
        want,
        "{what}: {y} encoded as {got}, nearest-even is {}",
        want.1
    );
}
