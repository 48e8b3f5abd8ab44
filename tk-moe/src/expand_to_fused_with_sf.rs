//! `expand_to_fused_with_sf` (`spec/moe.md` §4.13, §5.14): [`expand_to_fused`](mod@crate::expand_to_fused)
//! for quantized rows: the data (FP8 / FP4 / any element type) and its per-token scale factors
//! are permuted together.
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `data` | `(T, C)` | any element type; `H = C`, or `H = 2C` for packed FP4 ([`tk_core::dtype::E2M1x2`]) | unit last stride; E5M6 bytes, UE8M0 and packed UE8M0 are rejected as data |
//! | `sf` | `(T, Hs)` | [`ScaleElement`]: fp32, or packed UE8M0 as int32 / [`Ue8m0x4`] | unit last stride (upstream: contiguous row-major) |
//! | `num_per_channels` (`npc`) | `32` or `128` | | |
//! | `use_tma_aligned_col_major_sf` | bool | | output sf layout; **must be true for packed sf** |
//! | `token_topk_to_pos`, `pos_to_expert` | as in [`expand_to_fused`](mod@crate::expand_to_fused) | i32 | |
//! | output `out` | `(M, C)` | as `data` | contiguous |
//! | output `out_sf` | logical `(M, Hs)` | as `sf` | below |
//!
//! `Hs = ceil(H / npc)` for fp32 scales and `ceil(ceil(H / npc) / 4)` for packed UE8M0 (four
//! exponent bytes per int32); `sf`'s shape must be exactly `(T, Hs)`.
//!
//! **Output sf layout** ([`ExpandToFusedWithSfParams::out_sf_layout`]):
//! * row-major: storage `(M, Hs)`, strides `(Hs, 1)`;
//! * column-major (`use_tma_aligned_col_major_sf`): storage `(Hs, align(M, 4))`, logical view
//!   `(M, Hs)` with strides `(1, align(M, 4))` (upstream's TMA-aligned layout; `(1, 1)` when
//!   `M == 0`). The storage columns `M .. align(M, 4)` are **zero** here (upstream never writes
//!   them).
//!
//! **Semantics.** As `expand_to_fused`, applied to both tensors: for every slot with
//! `p = token_topk_to_pos[t, k] >= 0`, `out[p, :] = data[t, :]` and `out_sf[p, :] = sf[t, :]`
//! (bit copies: fp32 values or packed words verbatim). **Every other row is zero in both**
//! (upstream zero-fills only `pos_to_expert < 0` rows, and nothing at all when `T == 0`). The
//! index contract and the collision / padding-row rules are those of `expand_to_fused`.

use tk_core::dtype::Ue8m0x4;
use tk_core::{DType, Element, Layout, Result, TkError};

use crate::checks::check_shape;
use crate::expand_to_fused::{validate_expand, ExpandShape};

/// A scale-factor element: fp32 (one scale per value) or packed UE8M0 (`i32` or [`Ue8m0x4`],
/// four exponent bytes per element).
pub trait ScaleElement: Element {
    /// True for the packed UE8M0 types.
    const PACKED: bool;
}

impl ScaleElement for f32 {
    const PACKED: bool = false;
}

impl ScaleElement for i32 {
    const PACKED: bool = true;
}

impl ScaleElement for Ue8m0x4 {
    const PACKED: bool = true;
}

/// The parameters of `expand_to_fused_with_sf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpandToFusedWithSfParams {
    /// Values per scale along a row: 32 or 128.
    pub num_per_channels: usize,
    /// Column-major TMA-aligned output scales (required for packed scales).
    pub use_tma_aligned_col_major_sf: bool,
}

/// The validated geometry of one `expand_to_fused_with_sf` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpandWithSfShape {
    /// The data part (`columns` = stored columns of `data`).
    pub data: ExpandShape,
    /// `H`: logical values per row.
    pub hidden: usize,
    /// `Hs`: scale elements per row.
    pub sf_columns: usize,
}

/// Logical values per stored element of a data dtype, or `None` for dtypes not accepted as data.
pub fn values_per_element(dtype: DType) -> Option<usize> {
    match dtype {
        DType::E2M1x2 => Some(2),
        DType::E5M6Bytes | DType::UE8M0 | DType::UE8M0x4 => None,
        _ => Some(1),
    }
}

impl ExpandToFusedWithSfParams {
    /// Parameters with `num_per_channels` and the given output scale layout.
    pub const fn new(num_per_channels: usize, use_tma_aligned_col_major_sf: bool) -> Self {
        Self {
            num_per_channels,
            use_tma_aligned_col_major_sf,
        }
    }

    /// `Hs` for `hidden` values per row.
    pub fn sf_columns(&self, hidden: usize, packed: bool) -> usize {
        let per_row = hidden.div_ceil(self.num_per_channels.max(1));
        if packed {
            per_row.div_ceil(4)
        } else {
            per_row
        }
    }

    /// The logical `(M, Hs)` layout of `out_sf` inside its storage (module docs). The storage
    /// holds `Hs · align(M, 4)` elements (column-major) or `M · Hs` (row-major).
    pub fn out_sf_layout(&self, num_rows: usize, sf_columns: usize) -> Layout {
        if self.use_tma_aligned_col_major_sf {
            let ld = num_rows.div_ceil(4) * 4;
            Layout::new(vec![num_rows, sf_columns], vec![1, ld.max(1)], 0)
                .expect("two strides for two dimensions")
        } else {
            Layout::contiguous(&[num_rows, sf_columns])
        }
    }

    /// Storage elements of `out_sf` (see [`Self::out_sf_layout`]).
    pub fn out_sf_storage_len(&self, num_rows: usize, sf_columns: usize) -> usize {
        if self.use_tma_aligned_col_major_sf {
            num_rows.div_ceil(4) * 4 * sf_columns
        } else {
            num_rows * sf_columns
        }
    }

    /// Validates the layouts and dtypes: those of
    /// [`ExpandToFusedParams::validate`](crate::ExpandToFusedParams::validate) (with `data` for
    /// `x`), a data dtype with a logical width ([`values_per_element`]), `npc ∈ {32, 128}`,
    /// packed scales only with the column-major flag, and `sf` of shape `(T, Hs)` with a unit
    /// last stride.
    ///
    /// Errors: [`TkError::Shape`] / [`TkError::Stride`] / [`TkError::Empty`] naming the tensor,
    /// [`TkError::Dtype`] naming `data`, [`TkError::Param`] naming `num_per_channels` or
    /// `use_tma_aligned_col_major_sf`.
    pub fn validate(
        &self,
        data: &Layout,
        data_dtype: DType,
        sf: &Layout,
        sf_packed: bool,
        token_topk_to_pos: &Layout,
        pos_to_expert: &Layout,
    ) -> Result<ExpandWithSfShape> {
        let shape = validate_expand("data", data, token_topk_to_pos, pos_to_expert)?;
        let Some(per) = values_per_element(data_dtype) else {
            return Err(TkError::Dtype {
                arg: "data",
                expected: "an element type with a whole number of values per element \
                           (not E5M6 bytes or UE8M0 scales)"
                    .into(),
                got: data_dtype,
            });
        };
        if self.num_per_channels != 32 && self.num_per_channels != 128 {
            return Err(TkError::param(
                "num_per_channels",
                format!("must be 32 or 128, got {}", self.num_per_channels),
            ));
        }
        if sf_packed && !self.use_tma_aligned_col_major_sf {
            return Err(TkError::param(
                "use_tma_aligned_col_major_sf",
                "packed UE8M0 (int32) scales need the column-major output layout",
            ));
        }
        let hidden = shape.columns * per;
        let hs = self.sf_columns(hidden, sf_packed);
        crate::checks::check_unit_last_stride("sf", sf)?;
        check_shape(
            "sf",
            sf,
            &[shape.num_tokens, hs],
            &format!(
                "(T, Hs) = ({}, {hs}) for H = {hidden}, npc = {}{}",
                shape.num_tokens,
                self.num_per_channels,
                if sf_packed { ", packed" } else { "" }
            ),
        )?;
        Ok(ExpandWithSfShape {
            data: shape,
            hidden,
            sf_columns: hs,
        })
    }
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU op (feature `cuda`).
///
/// **Kernels** (`cuda/expand_to_fused_with_sf.cu`): a slot of every targeted row is recorded as
/// in [`expand_to_fused`](crate::expand_to_fused()), then one warp per task copies a token's
/// data row (16-byte accesses when the rows allow) and its `Hs` scale words to all its fused
/// rows, or (the first tasks, 32 rows each) zeroes the rows that no slot targets in both
/// tensors (and, column-major, the storage columns `M .. align(M, 4)`). Every element of `out` and of `out_sf`'s storage is written exactly once.
///
/// **Index contract on the GPU**: as `expand_to_fused` (illegal entries read as `-1`, never an
/// out-of-bounds access; `T·K <= i32::MAX`). No host sync.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu {
    use cudarc::driver::PushKernelArg;
    use tk_core::error::DriverContext;
    use tk_core::{
        DeviceTensor, DeviceView, DeviceViewMut, Element, KernelSource, KernelSpec, Layout, Result,
    };

    use super::{ExpandToFusedWithSfParams, ScaleElement};
    use crate::expand_to_fused::mark_rows;
    use crate::gpu::{
        access_bytes, blocks, check_device, check_out, config, row_stride, HEADERS, THREADS,
    };

    static SOURCE: KernelSource = KernelSource {
        file: "expand_to_fused_with_sf.cu",
        entry: "tk_expand_to_fused_with_sf",
        code: include_str!("../cuda/expand_to_fused_with_sf.cu"),
        headers: HEADERS,
        needs_cuda_headers: false,
    };

    /// The kernel for `access` data bytes per access, `num_topk` slots and the output scale
    /// layout (`col_major`: TMA-aligned column-major).
    pub fn kernel_spec(access: usize, num_topk: usize, col_major: bool) -> KernelSpec {
        KernelSpec::new(&SOURCE)
            .define("TK_VEC", access)
            .define("TK_K", num_topk)
            .define("TK_SF_COL", col_major as u8)
    }

    /// Representative specialisations (the spec's top-k values, both scale layouts), for
    /// compile checks and [`crate::prewarm`].
    pub fn registered_kernels() -> Vec<KernelSpec> {
        [2, 6, 8, 9]
            .into_iter()
            .flat_map(|k| [kernel_spec(16, k, false), kernel_spec(16, k, true)])
            .collect()
    }

    /// The outputs of [`expand_to_fused_with_sf`] on the device.
    #[derive(Debug)]
    pub struct DeviceFusedWithSf<D, S> {
        /// `out (M, C)`: the expanded data, contiguous.
        pub out: DeviceTensor<D>,
        /// The storage of `out_sf` (1-D): `Hs · align(M, 4)` elements (column-major) or
        /// `M · Hs` (row-major); padding is zero.
        pub out_sf_storage: DeviceTensor<S>,
        /// The logical `(M, Hs)` layout of `out_sf` in [`Self::out_sf_storage`].
        pub out_sf_layout: Layout,
    }

    impl<D: Element, S: Element> DeviceFusedWithSf<D, S> {
        /// `out_sf` as a strided `(M, Hs)` view of its storage.
        pub fn out_sf(&self) -> DeviceView<'_, S> {
            self.out_sf_storage
                .view()
                .with_layout(self.out_sf_layout.clone())
                .expect("the layout was built for this storage")
        }
    }

    /// GPU `expand_to_fused_with_sf(data (T, C), sf (T, Hs), token_topk_to_pos (T, K),
    /// pos_to_expert (M,), params)` into new tensors (see the
    /// [module docs](mod@crate::expand_to_fused_with_sf)).
    ///
    /// Errors: those of [`ExpandToFusedWithSfParams::validate`];
    /// [`tk_core::TkError::Placement`] when the tensors are on different devices.
    pub fn expand_to_fused_with_sf<D: Element, S: ScaleElement>(
        data: &DeviceView<'_, D>,
        sf: &DeviceView<'_, S>,
        token_topk_to_pos: &DeviceView<'_, i32>,
        pos_to_expert: &DeviceView<'_, i32>,
        params: &ExpandToFusedWithSfParams,
    ) -> Result<DeviceFusedWithSf<D, S>> {
        let shape = params.validate(
            data.layout(),
            D::DTYPE,
            sf.layout(),
            S::PACKED,
            token_topk_to_pos.layout(),
            pos_to_expert.layout(),
        )?;
        let (m, hs) = (shape.data.num_rows, shape.sf_columns);
        let dev = data.device();
        let mut out = dev.alloc::<D>(&shape.data.out_shape())?;
        let mut storage = dev.alloc::<S>(&[params.out_sf_storage_len(m, hs)])?;
        expand_to_fused_with_sf_into(
            data,
            sf,
            token_topk_to_pos,
            pos_to_expert,
            params,
            &mut out.view_mut(),
            &mut storage.view_mut(),
        )?;
        Ok(DeviceFusedWithSf {
            out,
            out_sf_storage: storage,
            out_sf_layout: params.out_sf_layout(m, hs),
        })
    }

    /// [`expand_to_fused_with_sf`] into caller-provided outputs: `out (M, C)` contiguous and
    /// `out_sf_storage`, a contiguous 1-D tensor of
    /// [`ExpandToFusedWithSfParams::out_sf_storage_len`] elements (its logical `(M, Hs)` view is
    /// [`ExpandToFusedWithSfParams::out_sf_layout`]).
    ///
    /// Errors: as [`expand_to_fused_with_sf`], and [`tk_core::TkError::Shape`] /
    /// [`tk_core::TkError::Stride`] naming `out` or `out_sf_storage`.
    pub fn expand_to_fused_with_sf_into<D: Element, S: ScaleElement>(
        data: &DeviceView<'_, D>,
        sf: &DeviceView<'_, S>,
        token_topk_to_pos: &DeviceView<'_, i32>,
        pos_to_expert: &DeviceView<'_, i32>,
        params: &ExpandToFusedWithSfParams,
        out: &mut DeviceViewMut<'_, D>,
        out_sf_storage: &mut DeviceViewMut<'_, S>,
    ) -> Result<()> {
        let shape = params.validate(
            data.layout(),
            D::DTYPE,
            sf.layout(),
            S::PACKED,
            token_topk_to_pos.layout(),
            pos_to_expert.layout(),
        )?;
        let dev = data.device();
        for (arg, other) in [
            ("sf", sf.device()),
            ("token_topk_to_pos", token_topk_to_pos.device()),
            ("pos_to_expert", pos_to_expert.device()),
            ("out", out.device()),
            ("out_sf_storage", out_sf_storage.device()),
        ] {
            check_device(arg, dev, other)?;
        }
        let (m, hs) = (shape.data.num_rows, shape.sf_columns);
        check_out("out", out.layout(), &shape.data.out_shape())?;
        let storage_len = params.out_sf_storage_len(m, hs);
        check_out("out_sf_storage", out_sf_storage.layout(), &[storage_len])?;
        if storage_len == 0 && (m == 0 || shape.data.columns == 0) {
            return Ok(());
        }
        let src = mark_rows(token_topk_to_pos, &shape.data)?;
        let size = std::mem::size_of::<D>() as u64;
        let row_bytes = shape.data.columns as u64 * size;
        let (x_addr, out_addr) = (data.address(), out.address());
        let ldx_bytes = row_stride(data.layout()) * size;
        let access = access_bytes(&[x_addr, out_addr, ldx_bytes, row_bytes]);
        let col = params.use_tma_aligned_col_major_sf;
        let f = dev.function(&kernel_spec(access, shape.data.num_topk, col))?;
        let (ldx, n) = (ldx_bytes / access as u64, row_bytes / access as u64);
        let (osf, sf_addr, ld_sf) = (
            out_sf_storage.address(),
            sf.address(),
            row_stride(sf.layout()),
        );
        let hs64 = hs as u64;
        let ld_osf = m.div_ceil(4) as u64 * 4;
        let (ttp, ld_ttp) = (
            token_topk_to_pos.address(),
            row_stride(token_topk_to_pos.layout()),
        );
        let src_addr = src.view().address();
        let (t, m64) = (shape.data.num_tokens as u64, m as u64);
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&out_addr)
            .arg(&x_addr)
            .arg(&ldx)
            .arg(&n)
            .arg(&osf)
            .arg(&sf_addr)
            .arg(&ld_sf)
            .arg(&hs64)
            .arg(&ld_osf)
            .arg(&ttp)
            .arg(&ld_ttp)
            .arg(&src_addr)
            .arg(&t)
            .arg(&m64);
        let zero_rows = if col { ld_osf as usize } else { m };
        // SAFETY: the validated views bound every access: data rows t < T (n accesses at pitch
        // ldx), sf (T, Hs) at pitch ld_sf, token_topk_to_pos (T, K) (also at the slots named by src, checked < T·K in the kernel),
        // src (M,); out rows p < M
        // and out_sf storage offsets p·Hs + j (row-major, p < M) or j·align(M, 4) + p
        // (column-major, p < align(M, 4)), all inside the checked storage length; entries outside
        // 0..M are skipped by the kernel; the access width divides every address, pitch and row
        // length; all buffers outlive the stream-ordered launch.
        unsafe {
            l.launch(config(
                blocks(shape.data.num_tokens + zero_rows.div_ceil(32), 8),
                THREADS,
            ))
        }
        .ctx("launching tk_expand_to_fused_with_sf")?;
        Ok(())
    }
}
