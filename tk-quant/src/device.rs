//! Device-side argument and result types of the GPU ops (feature `cuda`): the device
//! counterparts of [`crate::types`] and [`crate::scale`], validated by the same functions.
//!
//! | type | what | dtype / shape |
//! |---|---|---|
//! | [`DevicePlainInput`] | unquantized input | fp32 or bf16 `(M, K)`, unit column stride, any row stride |
//! | [`DeviceQuantDataView`] / [`DeviceQuantData`] | FP8 / FP4 data | e4m3 `(M, K)` or packed e2m1 `(M, K/2)` |
//! | [`DeviceScaleView`] / [`DeviceScales`] | scales | fp32 (layouts A, B) or packed UE8M0 int32 (layout C) |
//! | [`DeviceQuantInput`] | data + scales + block | as [`crate::QuantInput`] |
//! | [`DeviceCastInput`] | what the GPU casts accept | either of the above |
//!
//! Every borrowed type carries a [`DeviceView`]; its `layout()` is checked by the same rules as
//! the host types ([`crate::types::check_matrix`], [`crate::scale::detect_scale_layout`]).

use float8::F8E4M3;
use half::bf16;
use tk_core::dtype::{E2M1x2, Ue8m0x4};
use tk_core::{DType, Device, DeviceTensor, DeviceView, DeviceViewMut, Layout, Result, TkError};

pub(crate) use tk_core::validate::check_contiguous;

use crate::scale::{detect_scale_layout, HostScales, ScaleGrid, ScaleLayout};
use crate::types::{check_matrix, check_nonempty_k, CastFormat, QuantData, QuantGeometry};

/// An unquantized device input `(M, K)`: fp32 or bf16, unit column stride, any row stride.
#[derive(Debug, Clone)]
pub enum DevicePlainInput<'a> {
    /// fp32 `(M, K)`.
    F32(DeviceView<'a, f32>),
    /// bf16 `(M, K)`.
    BF16(DeviceView<'a, bf16>),
}

impl<'a> From<DeviceView<'a, f32>> for DevicePlainInput<'a> {
    fn from(v: DeviceView<'a, f32>) -> Self {
        DevicePlainInput::F32(v)
    }
}

impl<'a> From<DeviceView<'a, bf16>> for DevicePlainInput<'a> {
    fn from(v: DeviceView<'a, bf16>) -> Self {
        DevicePlainInput::BF16(v)
    }
}

impl DevicePlainInput<'_> {
    /// [`DType::F32`] or [`DType::BF16`].
    pub fn dtype(&self) -> DType {
        match self {
            DevicePlainInput::F32(_) => DType::F32,
            DevicePlainInput::BF16(_) => DType::BF16,
        }
    }

    /// The view's layout.
    pub fn layout(&self) -> &Layout {
        match self {
            DevicePlainInput::F32(v) => v.layout(),
            DevicePlainInput::BF16(v) => v.layout(),
        }
    }

    /// The device the view lives on.
    pub fn device(&self) -> &Device {
        match self {
            DevicePlainInput::F32(v) => v.device(),
            DevicePlainInput::BF16(v) => v.device(),
        }
    }

    /// Device address of element `[0, 0]`.
    pub(crate) fn address(&self) -> u64 {
        match self {
            DevicePlainInput::F32(v) => v.address(),
            DevicePlainInput::BF16(v) => v.address(),
        }
    }

    /// Validates the input (unit column stride, `K >= 1`) and returns `(M, K)`. Errors name
    /// `arg`.
    pub fn validate(&self, arg: &'static str) -> Result<(usize, usize)> {
        let (m, k) = check_matrix(arg, self.layout())?;
        check_nonempty_k(arg, self.layout(), k)?;
        Ok((m, k))
    }
}

/// Borrowed device FP8 / FP4 data: e4m3 `(M, K)` or packed e2m1 `(M, K/2)` (even column in the
/// low nibble), unit column stride, any row stride.
#[derive(Debug, Clone)]
pub enum DeviceQuantDataView<'a> {
    /// FP8 e4m3fn `(M, K)`.
    E4M3(DeviceView<'a, F8E4M3>),
    /// FP4 e2m1 `(M, K/2)`.
    E2M1(DeviceView<'a, E2M1x2>),
}

impl DeviceQuantDataView<'_> {
    /// The data's format.
    pub fn format(&self) -> CastFormat {
        match self {
            DeviceQuantDataView::E4M3(_) => CastFormat::E4M3,
            DeviceQuantDataView::E2M1(_) => CastFormat::E2M1,
        }
    }

    /// The view's (physical) layout.
    pub fn layout(&self) -> &Layout {
        match self {
            DeviceQuantDataView::E4M3(v) => v.layout(),
            DeviceQuantDataView::E2M1(v) => v.layout(),
        }
    }

    /// The device the view lives on.
    pub fn device(&self) -> &Device {
        match self {
            DeviceQuantDataView::E4M3(v) => v.device(),
            DeviceQuantDataView::E2M1(v) => v.device(),
        }
    }

    /// Device address of byte `[0, 0]`.
    pub(crate) fn address(&self) -> u64 {
        match self {
            DeviceQuantDataView::E4M3(v) => v.address(),
            DeviceQuantDataView::E2M1(v) => v.address(),
        }
    }

    /// Validates the data and returns the logical `(M, K)`. Errors name `arg`.
    pub fn validate(&self, arg: &'static str) -> Result<(usize, usize)> {
        let (m, cols) = check_matrix(arg, self.layout())?;
        let k = cols * self.format().values_per_byte();
        check_nonempty_k(arg, self.layout(), k)?;
        Ok((m, k))
    }
}

/// Owned, contiguous device FP8 / FP4 data: e4m3 `(M, K)` or packed e2m1 `(M, K/2)`.
#[derive(Debug)]
pub enum DeviceQuantData {
    /// FP8 e4m3fn `(M, K)`.
    E4M3(DeviceTensor<F8E4M3>),
    /// FP4 e2m1 `(M, K/2)`.
    E2M1(DeviceTensor<E2M1x2>),
}

impl DeviceQuantData {
    /// Allocates (uninitialised) contiguous data of logical shape `(m, k)` in `fmt` (`k` even
    /// for e2m1).
    pub fn alloc(dev: &Device, fmt: CastFormat, m: usize, k: usize) -> Result<Self> {
        Ok(match fmt {
            CastFormat::E4M3 => DeviceQuantData::E4M3(dev.alloc(&[m, k])?),
            CastFormat::E2M1 => DeviceQuantData::E2M1(dev.alloc(&[m, k / 2])?),
        })
    }

    /// The data's format.
    pub fn format(&self) -> CastFormat {
        match self {
            DeviceQuantData::E4M3(_) => CastFormat::E4M3,
            DeviceQuantData::E2M1(_) => CastFormat::E2M1,
        }
    }

    /// A borrowed view of the whole tensor.
    pub fn view(&self) -> DeviceQuantDataView<'_> {
        match self {
            DeviceQuantData::E4M3(t) => DeviceQuantDataView::E4M3(t.view()),
            DeviceQuantData::E2M1(t) => DeviceQuantDataView::E2M1(t.view()),
        }
    }

    /// A mutable view of the whole tensor.
    pub fn view_mut(&mut self) -> DeviceQuantDataViewMut<'_> {
        match self {
            DeviceQuantData::E4M3(t) => DeviceQuantDataViewMut::E4M3(t.view_mut()),
            DeviceQuantData::E2M1(t) => DeviceQuantDataViewMut::E2M1(t.view_mut()),
        }
    }

    /// Fills every byte with `byte` (tests poison outputs with it).
    pub fn fill_bytes(&mut self, byte: u8) -> Result<()> {
        match self {
            DeviceQuantData::E4M3(t) => t.fill_bytes(byte),
            DeviceQuantData::E2M1(t) => t.fill_bytes(byte),
        }
    }

    /// Copies the data to the host (synchronises the stream).
    pub fn to_host(&self) -> Result<QuantData> {
        Ok(match self {
            DeviceQuantData::E4M3(t) => QuantData::E4M3(t.to_host()?),
            DeviceQuantData::E2M1(t) => QuantData::E2M1(t.to_host()?),
        })
    }
}

/// A mutable device FP8 / FP4 output: e4m3 `(M, K)` or packed e2m1 `(M, K/2)`, contiguous.
#[derive(Debug)]
pub enum DeviceQuantDataViewMut<'a> {
    /// FP8 e4m3fn `(M, K)`.
    E4M3(DeviceViewMut<'a, F8E4M3>),
    /// FP4 e2m1 `(M, K/2)`.
    E2M1(DeviceViewMut<'a, E2M1x2>),
}

impl DeviceQuantDataViewMut<'_> {
    /// The data's format.
    pub fn format(&self) -> CastFormat {
        match self {
            DeviceQuantDataViewMut::E4M3(_) => CastFormat::E4M3,
            DeviceQuantDataViewMut::E2M1(_) => CastFormat::E2M1,
        }
    }

    /// The view's (physical) layout.
    pub fn layout(&self) -> &Layout {
        match self {
            DeviceQuantDataViewMut::E4M3(v) => v.layout(),
            DeviceQuantDataViewMut::E2M1(v) => v.layout(),
        }
    }

    /// The device the view lives on.
    pub fn device(&self) -> &Device {
        match self {
            DeviceQuantDataViewMut::E4M3(v) => v.device(),
            DeviceQuantDataViewMut::E2M1(v) => v.device(),
        }
    }

    /// Device address of byte `[0, 0]`.
    pub(crate) fn address(&mut self) -> u64 {
        match self {
            DeviceQuantDataViewMut::E4M3(v) => v.address(),
            DeviceQuantDataViewMut::E2M1(v) => v.address(),
        }
    }

    /// Checks that this is contiguous `fmt` data of logical shape `(m, k)`; errors name `arg`.
    pub(crate) fn check_output(
        &self,
        arg: &'static str,
        fmt: CastFormat,
        m: usize,
        k: usize,
    ) -> Result<()> {
        if self.format() != fmt {
            let (got, expected) = match fmt {
                CastFormat::E4M3 => (DType::E2M1x2, "e4m3 data (the cast's format)"),
                CastFormat::E2M1 => (DType::E4M3, "packed e2m1 data (the cast's format)"),
            };
            return Err(TkError::Dtype {
                arg,
                expected: expected.into(),
                got,
            });
        }
        check_contiguous(arg, self.layout(), &[m, k / fmt.values_per_byte()])
    }
}

/// A borrowed device scale tensor: fp32 (layouts A, B) or packed UE8M0 int32 (layout C), with
/// any strides [`detect_scale_layout`] accepts.
#[derive(Debug, Clone)]
pub enum DeviceScaleView<'a> {
    /// fp32 scales `(nbm, nbk)`.
    F32(DeviceView<'a, f32>),
    /// Packed UE8M0 scales, int32 `(nbm, ceil(nbk/4))`, column-major.
    Packed(DeviceView<'a, Ue8m0x4>),
}

impl DeviceScaleView<'_> {
    /// [`DType::F32`] or [`DType::UE8M0x4`].
    pub fn dtype(&self) -> DType {
        match self {
            DeviceScaleView::F32(_) => DType::F32,
            DeviceScaleView::Packed(_) => DType::UE8M0x4,
        }
    }

    /// The view's layout.
    pub fn layout(&self) -> &Layout {
        match self {
            DeviceScaleView::F32(v) => v.layout(),
            DeviceScaleView::Packed(v) => v.layout(),
        }
    }

    /// The device the view lives on.
    pub fn device(&self) -> &Device {
        match self {
            DeviceScaleView::F32(v) => v.device(),
            DeviceScaleView::Packed(v) => v.device(),
        }
    }

    /// Device address of element `[0, 0]`.
    pub(crate) fn address(&self) -> u64 {
        match self {
            DeviceScaleView::F32(v) => v.address(),
            DeviceScaleView::Packed(v) => v.address(),
        }
    }

    /// Detects the layout ([`detect_scale_layout`]) and checks the shape against `grid`, as
    /// [`crate::ScaleView::check`] does. Errors name `arg`.
    pub fn check(&self, arg: &'static str, grid: &ScaleGrid) -> Result<ScaleLayout> {
        let layout = detect_scale_layout(arg, self.dtype(), self.layout())?;
        let expected = grid.shape(layout);
        if self.layout().shape() != expected {
            return Err(TkError::Shape {
                arg,
                expected: format!(
                    "{expected:?} for the scale grid (nbm, nbk) = ({}, {})",
                    grid.nbm(),
                    grid.nbk()
                ),
                got: self.layout().shape().to_vec(),
            });
        }
        Ok(layout)
    }

    /// The element strides `(s0, s1)` (1 for a dimension of size at most 1).
    pub(crate) fn strides(&self) -> (u64, u64) {
        let s = self.layout().strides();
        (s[0] as u64, s[1] as u64)
    }
}

/// An owned device scale tensor in layout A, B or C with its full allocation (padding included;
/// the kernels of this crate write the padding as zeros).
#[derive(Debug)]
pub struct DeviceScales {
    layout: ScaleLayout,
    grid: ScaleGrid,
    storage: ScaleStorage,
}

#[derive(Debug)]
enum ScaleStorage {
    F32(DeviceTensor<f32>),
    Packed(DeviceTensor<Ue8m0x4>),
}

impl DeviceScales {
    /// Allocates (uninitialised) scales of `grid` in `layout`.
    pub fn alloc(dev: &Device, layout: ScaleLayout, grid: ScaleGrid) -> Result<Self> {
        let n = grid.storage_len(layout);
        let storage = match layout {
            ScaleLayout::PackedUe8m0 => ScaleStorage::Packed(dev.alloc(&[n])?),
            _ => ScaleStorage::F32(dev.alloc(&[n])?),
        };
        Ok(Self {
            layout,
            grid,
            storage,
        })
    }

    /// The layout.
    pub fn layout(&self) -> ScaleLayout {
        self.layout
    }

    /// The logical grid.
    pub fn grid(&self) -> ScaleGrid {
        self.grid
    }

    /// A view with the tensor's logical shape and strides ([`ScaleGrid::tensor_layout`]), e.g.
    /// to pass these scales to a cast back.
    pub fn view(&self) -> Result<DeviceScaleView<'_>> {
        let l = self.grid.tensor_layout(self.layout);
        Ok(match &self.storage {
            ScaleStorage::F32(t) => DeviceScaleView::F32(t.view().with_layout(l)?),
            ScaleStorage::Packed(t) => DeviceScaleView::Packed(t.view().with_layout(l)?),
        })
    }

    /// Fills every byte of the allocation with `byte` (tests poison outputs with it).
    pub fn fill_bytes(&mut self, byte: u8) -> Result<()> {
        match &mut self.storage {
            ScaleStorage::F32(t) => t.fill_bytes(byte),
            ScaleStorage::Packed(t) => t.fill_bytes(byte),
        }
    }

    /// Device address of the allocation's first byte.
    pub(crate) fn address(&mut self) -> u64 {
        match &mut self.storage {
            ScaleStorage::F32(t) => t.view_mut().address(),
            ScaleStorage::Packed(t) => t.view_mut().address(),
        }
    }

    /// The device the scales live on.
    pub fn device(&self) -> &Device {
        match &self.storage {
            ScaleStorage::F32(t) => t.device(),
            ScaleStorage::Packed(t) => t.device(),
        }
    }

    /// The allocation's bytes, padding included (synchronises the stream).
    pub fn storage_bytes(&self) -> Result<Vec<u8>> {
        Ok(match &self.storage {
            ScaleStorage::F32(t) => t
                .to_host()?
                .as_slice()
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            ScaleStorage::Packed(t) => t
                .to_host()?
                .as_slice()
                .iter()
                .flat_map(|v| v.0.to_le_bytes())
                .collect(),
        })
    }

    /// Copies the scales to the host (synchronises the stream). The padding is copied as
    /// stored; compare [`DeviceScales::storage_bytes`] to check it.
    pub fn to_host(&self) -> Result<HostScales> {
        match &self.storage {
            ScaleStorage::F32(t) => {
                HostScales::from_f32_storage(self.layout, self.grid, t.to_host()?.into_vec())
            }
            ScaleStorage::Packed(t) => {
                HostScales::from_packed_storage(self.grid, t.to_host()?.into_vec())
            }
        }
    }
}

/// A quantized device tensor with its scales and their block (the device [`crate::QuantInput`]).
#[derive(Debug, Clone)]
pub struct DeviceQuantInput<'a> {
    /// The data (argument name `x`).
    pub data: DeviceQuantDataView<'a>,
    /// Its scales (argument name `x.sf`).
    pub sf: DeviceScaleView<'a>,
    /// The scale block `(bm, bk)` (argument name `x_block_size`).
    pub block: (usize, usize),
}

impl<'a> DeviceQuantInput<'a> {
    /// Bundles data, scales and block.
    pub fn new(
        data: DeviceQuantDataView<'a>,
        sf: DeviceScaleView<'a>,
        block: (usize, usize),
    ) -> Self {
        Self { data, sf, block }
    }

    /// Validates data, block and scales exactly as [`crate::QuantInput::validate`] does.
    pub fn validate(&self) -> Result<QuantGeometry> {
        let (m, k) = self.data.validate("x")?;
        let grid = ScaleGrid::for_matrix_arg(m, k, self.block, "x_block_size")?;
        let sf_layout = self.sf.check("x.sf", &grid)?;
        Ok(QuantGeometry {
            m,
            k,
            grid,
            sf_layout,
        })
    }
}

/// The input of the GPU casts: plain values, or quantized data with its scales.
#[derive(Debug, Clone)]
pub enum DeviceCastInput<'a> {
    /// fp32 / bf16 values.
    Plain(DevicePlainInput<'a>),
    /// FP8 / FP4 data with scales.
    Quantized(DeviceQuantInput<'a>),
}

impl<'a> From<DevicePlainInput<'a>> for DeviceCastInput<'a> {
    fn from(x: DevicePlainInput<'a>) -> Self {
        DeviceCastInput::Plain(x)
    }
}

impl<'a> From<DeviceQuantInput<'a>> for DeviceCastInput<'a> {
    fn from(x: DeviceQuantInput<'a>) -> Self {
        DeviceCastInput::Quantized(x)
    }
}

impl<'a> From<DeviceView<'a, f32>> for DeviceCastInput<'a> {
    fn from(v: DeviceView<'a, f32>) -> Self {
        DeviceCastInput::Plain(v.into())
    }
}

impl<'a> From<DeviceView<'a, bf16>> for DeviceCastInput<'a> {
    fn from(v: DeviceView<'a, bf16>) -> Self {
        DeviceCastInput::Plain(v.into())
    }
}

impl DeviceCastInput<'_> {
    /// The device the input lives on.
    pub fn device(&self) -> &Device {
        match self {
            DeviceCastInput::Plain(p) => p.device(),
            DeviceCastInput::Quantized(q) => q.data.device(),
        }
    }

    /// Validates the input and returns `(M, K, quantized)`.
    pub fn validate(&self) -> Result<(usize, usize, bool)> {
        Ok(match self {
            DeviceCastInput::Plain(p) => {
                let (m, k) = p.validate("x")?;
                (m, k, false)
            }
            DeviceCastInput::Quantized(q) => {
                let g = q.validate()?;
                (g.m, g.k, true)
            }
        })
    }
}
