//! Element types, exactly as `spec/quant.md` §1 defines them.
//!
//! | [`DType`] | Rust storage type | bytes | meaning |
//! |---|---|---|---|
//! | `F32` | `f32` | 4 | IEEE binary32 |
//! | `BF16` | [`half::bf16`] | 2 | bfloat16 |
//! | `F16` | [`half::f16`] | 2 | IEEE binary16 |
//! | `E4M3` | [`float8::F8E4M3`] | 1 | FP8 e4m3fn (no inf, NaN = 0x7F/0xFF, max 448) |
//! | `E5M2` | [`float8::F8E5M2`] | 1 | FP8 e5m2 |
//! | `E2M1x2` | [`E2M1x2`] | 1 | two FP4 e2m1 codes; even column in the low nibble |
//! | `E5M6Bytes` | [`E5M6Bytes`] | 1 | one byte of packed E5M6 (8 codes per 12 bytes) |
//! | `UE8M0` | [`Ue8m0`] | 1 | power-of-two scale, value `2^(b-127)`; `0` decodes to +0.0, `255` to +inf |
//! | `UE8M0x4` | [`Ue8m0x4`] | 4 | four UE8M0 bytes packed in an int32, byte 0 least significant |
//! | `I32` / `I64` / `U8` | `i32` / `i64` / `u8` | 4 / 8 / 1 | integers (indices, raw bytes) |
//!
//! Bit-level conversions between these formats live in [`crate::convert`].

use std::fmt;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16.
    BF16,
    /// IEEE binary16.
    F16,
    /// FP8 e4m3fn.
    E4M3,
    /// FP8 e5m2.
    E5M2,
    /// Two FP4 e2m1 codes per byte (even logical column in the low nibble).
    E2M1x2,
    /// Packed E5M6 storage: 8 12-bit codes per 12 bytes (§1.3 of the quant spec).
    E5M6Bytes,
    /// One UE8M0 scale byte.
    UE8M0,
    /// Four UE8M0 scale bytes packed into one int32.
    UE8M0x4,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// Raw byte.
    U8,
}

impl DType {
    /// Size of one stored element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::UE8M0x4 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::E4M3
            | DType::E5M2
            | DType::E2M1x2
            | DType::E5M6Bytes
            | DType::UE8M0
            | DType::U8 => 1,
            DType::I64 => 8,
        }
    }

    /// True for types whose stored element holds more than one logical value, or a fraction of
    /// one (FP4 pairs, E5M6 bytes, packed UE8M0): a plain element-wise reshuffle such as a
    /// transpose is not meaningful on them.
    pub const fn is_packed(self) -> bool {
        matches!(self, DType::E2M1x2 | DType::E5M6Bytes | DType::UE8M0x4)
    }

    /// Short name as used in benchmark records (`fp32`, `bf16`, `e4m3`, `e2m1`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "fp32",
            DType::BF16 => "bf16",
            DType::F16 => "fp16",
            DType::E4M3 => "e4m3",
            DType::E5M2 => "e5m2",
            DType::E2M1x2 => "e2m1",
            DType::E5M6Bytes => "e5m6",
            DType::UE8M0 => "ue8m0",
            DType::UE8M0x4 => "ue8m0x4",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be stored in a tile-kernels tensor.
///
/// # Safety
/// Implementors must be plain old data of exactly [`DType::size_bytes`] bytes, valid for every
/// bit pattern, with the layout the CUDA kernels expect.
pub unsafe trait Element:
    cudarc::driver::DeviceRepr
    + cudarc::driver::ValidAsZeroBits
    + Copy
    + Default
    + PartialEq
    + fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// The element's dtype tag.
    const DTYPE: DType;
    /// The raw bits of the element, zero-extended (for bit-exact comparison and poisoning).
    fn to_bits_u64(self) -> u64;
    /// Builds an element from raw bits (the low [`DType::size_bytes`] bytes are used).
    fn from_bits_u64(bits: u64) -> Self;
}

macro_rules! newtype_storage {
    ($(#[$m:meta])* $name:ident($inner:ty)) => {
        $(#[$m])*
        #[repr(transparent)]
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
        pub struct $name(pub $inner);
        // SAFETY: a transparent wrapper of a plain integer, valid for every bit pattern.
        unsafe impl cudarc::driver::DeviceRepr for $name {}
        // SAFETY: all-zero bits are a valid integer.
        unsafe impl cudarc::driver::ValidAsZeroBits for $name {}
    };
}

newtype_storage!(
    /// Two FP4 e2m1 codes: the even logical column in bits 3..0, the odd one in bits 7..4.
    E2M1x2(u8)
);
newtype_storage!(
    /// One byte of a packed E5M6 row (8 codes per 12 bytes, see [`crate::convert::pack_e5m6`]).
    E5M6Bytes(u8)
);
newtype_storage!(
    /// A UE8M0 scale: value `2^(b - 127)`, `0` → +0.0, `255` → +inf.
    Ue8m0(u8)
);
newtype_storage!(
    /// Four UE8M0 scale bytes in one int32; byte 0 (least significant) is the first scale.
    Ue8m0x4(i32)
);

macro_rules! impl_element {
    ($t:ty, $dt:expr, |$v:ident| $to:expr, |$b:ident| $from:expr) => {
        // SAFETY: plain data of the dtype's size, valid for every bit pattern.
        unsafe impl Element for $t {
            const DTYPE: DType = $dt;
            fn to_bits_u64(self) -> u64 {
                let $v = self;
                $to
            }
            fn from_bits_u64($b: u64) -> Self {
                $from
            }
        }
    };
}

impl_element!(f32, DType::F32, |v| v.to_bits() as u64, |b| f32::from_bits(
    b as u32
));
impl_element!(half::bf16, DType::BF16, |v| v.to_bits() as u64, |b| {
    half::bf16::from_bits(b as u16)
});
impl_element!(half::f16, DType::F16, |v| v.to_bits() as u64, |b| {
    half::f16::from_bits(b as u16)
});
impl_element!(float8::F8E4M3, DType::E4M3, |v| v.to_bits() as u64, |b| {
    float8::F8E4M3::from_bits(b as u8)
});
impl_element!(float8::F8E5M2, DType::E5M2, |v| v.to_bits() as u64, |b| {
    float8::F8E5M2::from_bits(b as u8)
});
impl_element!(E2M1x2, DType::E2M1x2, |v| v.0 as u64, |b| E2M1x2(b as u8));
impl_element!(E5M6Bytes, DType::E5M6Bytes, |v| v.0 as u64, |b| E5M6Bytes(
    b as u8
));
impl_element!(Ue8m0, DType::UE8M0, |v| v.0 as u64, |b| Ue8m0(b as u8));
impl_element!(Ue8m0x4, DType::UE8M0x4, |v| v.0 as u32 as u64, |b| Ue8m0x4(
    b as u32 as i32
));
impl_element!(i32, DType::I32, |v| v as u32 as u64, |b| b as u32 as i32);
impl_element!(i64, DType::I64, |v| v as u64, |b| b as i64);
impl_element!(u8, DType::U8, |v| v as u64, |b| b as u8);
