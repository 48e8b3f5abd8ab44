//! Helpers shared by the op test files (per_token_cast, per_block_cast, per_channel_cast,
//! per_block_cast_lossless, cast_back).
#![allow(dead_code)]

use float8::F8E4M3;
use half::bf16;
use tk_core::testing::Rng;
use tk_core::{HostTensor, HostView, TkError};
use tk_quant::{QuantData, ScaleOptions};

/// Every valid option set: A and B non-rounded and rounded, C.
pub fn all_configs() -> [ScaleOptions; 5] {
    [
        ScaleOptions::row_major(false),
        ScaleOptions::col_major(false),
        ScaleOptions::row_major(true),
        ScaleOptions::col_major(true),
        ScaleOptions::packed_ue8m0(),
    ]
}

/// The three layouts with power-of-two scales (upstream's test configurations plus B).
pub fn rounded_configs() -> [ScaleOptions; 3] {
    [
        ScaleOptions::row_major(true),
        ScaleOptions::col_major(true),
        ScaleOptions::packed_ue8m0(),
    ]
}

/// Packed without `round_sf`, and packed without column-major: rejected everywhere.
pub fn bad_packed_configs() -> [ScaleOptions; 2] {
    [
        ScaleOptions {
            round_sf: false,
            use_tma_aligned_col_major_sf: true,
            use_packed_ue8m0: true,
        },
        ScaleOptions {
            round_sf: true,
            use_tma_aligned_col_major_sf: false,
            use_packed_ue8m0: true,
        },
    ]
}

/// An fp32 `(m, k)` tensor.
pub fn f32s(m: usize, k: usize, v: &[f32]) -> HostTensor<f32> {
    HostTensor::from_vec(v.to_vec(), &[m, k]).unwrap()
}

/// The bf16 rounding of `x` (values chosen to be bf16-exact stay exact).
pub fn to_bf16(x: &HostTensor<f32>) -> HostTensor<bf16> {
    HostTensor::from_vec(
        x.as_slice().iter().map(|&v| bf16::from_f32(v)).collect(),
        x.shape(),
    )
    .unwrap()
}

/// The fp32 widening of a bf16 tensor.
pub fn widen(x: &HostTensor<bf16>) -> HostTensor<f32> {
    HostTensor::from_vec(x.as_slice().iter().map(|v| v.to_f32()).collect(), x.shape()).unwrap()
}

/// e4m3 data `(m, k)` from raw bytes.
pub fn e4m3_data(m: usize, k: usize, bytes: &[u8]) -> HostTensor<F8E4M3> {
    HostTensor::from_vec(
        bytes.iter().map(|&b| F8E4M3::from_bits(b)).collect(),
        &[m, k],
    )
    .unwrap()
}

/// The bit patterns of `v`.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A `(m, k)` copy of `x` laid out as the first `k` columns of an `(m, 2k + 3)` buffer whose
/// other columns hold `fill` (a row-strided input).
pub fn strided_buffer<T: tk_core::Element>(x: &HostTensor<T>, fill: T) -> HostTensor<T> {
    let (m, k) = (x.shape()[0], x.shape()[1]);
    let w = 2 * k + 3;
    let mut buf = vec![fill; m * w];
    for r in 0..m {
        buf[r * w..r * w + k].copy_from_slice(&x.as_slice()[r * k..(r + 1) * k]);
    }
    HostTensor::from_vec(buf, &[m, w]).unwrap()
}

/// The `(m, k)` window of a buffer made by [`strided_buffer`].
pub fn window<T: tk_core::Element>(buf: &HostTensor<T>, k: usize) -> HostView<'_, T> {
    buf.view().narrow(1, 0, k).unwrap()
}

/// The logical codes of quantized data: e4m3 bytes, or e2m1 nibbles in column order.
pub fn codes(q: &QuantData) -> Vec<u8> {
    match q {
        QuantData::E4M3(_) => q.bytes(),
        QuantData::E2M1(_) => q.bytes().iter().flat_map(|b| [b & 0xF, b >> 4]).collect(),
    }
}

/// Asserts an error of the given kind naming `arg`.
pub fn assert_err(err: TkError, kind: &str, arg: &str) {
    let (k, a) = match &err {
        TkError::Shape { arg, .. } => ("Shape", *arg),
        TkError::Dtype { arg, .. } => ("Dtype", *arg),
        TkError::Stride { arg, .. } => ("Stride", *arg),
        TkError::Empty { arg, .. } => ("Empty", *arg),
        TkError::Param { arg, .. } => ("Param", *arg),
        e => panic!("unexpected error {e:?}"),
    };
    assert_eq!((k, a), (kind, arg), "{err}");
}

/// Upstream's test data: randn · 2^u, clamped to ±FLT_MAX/8, then every |x| below
/// max|x| / 512 raised to it (keeping the sign).
pub fn rand_float(rng: &mut Rng, m: usize, k: usize, u: i32) -> HostTensor<f32> {
    let lim = f32::MAX / 8.0;
    let x: Vec<f32> = (0..m * k)
        .map(|_| ((rng.normal() as f64) * 2f64.powi(u)).clamp(-lim as f64, lim as f64) as f32)
        .collect();
    let floor = x.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 512.0;
    let x = x
        .into_iter()
        .map(|v| {
            if v.abs() < floor {
                floor.copysign(v)
            } else {
                v
            }
        })
        .collect();
    HostTensor::from_vec(x, &[m, k]).unwrap()
}
