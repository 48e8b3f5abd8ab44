//! `cast_back` / `per_token_cast_back` (`spec/quant.md` §3.8) and their E5M6 variant
//! `cast_back(..., x_special_fmt='e5m6')` = `cast_back_e5m6` (§3.9): dequantization to fp32 or
//! bf16.
//!
//! # What it computes
//!
//! `out[r, c] = convert(fl(dec(data[r, c]) · S[r / bm, c / bk]))`, exactly:
//! * `dec` is exact: e4m3, e2m1 (even column in the low nibble), or E5M6 (the binary16
//!   pattern `code << 4`; codes `0x7C0` and above in magnitude are ±inf / NaN);
//! * scales are read in layout A, B or C by the reader rules of §1.5
//!   ([`crate::scale::detect_scale_layout`]); a UE8M0 byte `b` is the fp32 with bits `b << 23`
//!   (byte 0 is +0.0, 255 is +inf);
//! * `convert` is the identity for fp32 and round-to-nearest-even for bf16
//!   ([`crate::DequantElement`]).
//!
//! `per_token_cast_back(x, npc)` is `cast_back` with block `(1, npc)`.
//!
//! | argument | dtype | shape | notes |
//! |---|---|---|---|
//! | `x.data` | e4m3 / packed e2m1 | `(M, K)` / `(M, K/2)`, logical `K % 64 == 0` | unit column stride, any row stride |
//! | `x.data` (E5M6) | packed E5M6 bytes | `(M, 3K/2)`, `K % 8 == 0` | unit column stride, any row stride |
//! | `x.sf` | fp32 / packed UE8M0 int32 | grid `(ceil(M/bm), ceil(K/bk))` | layout A, B or C |
//! | `out` | fp32 / bf16 | `(M, K)` | contiguous |
//!
//! # Preconditions
//!
//! * FP8/FP4 ([`validate`]): logical `K % 64 == 0`; any block `(bm, bk)` with both sides at
//!   least 1 (partial blocks allowed).
//! * E5M6 ([`validate_e5m6`]): `K % 8 == 0` (byte columns a multiple of 12); any block.
//! * The output dtype (upstream's `fmt` ∈ {`'bf16'`, `'fp32'`}) is the type parameter of the
//!   CPU functions, so no other value can be asked for.
//!
//! # Deviations from upstream
//!
//! * **Any row stride** of the data is accepted (upstream requires it contiguous).
//! * **E5M6 with a partial last column block** (`K % bk != 0`) is accepted: the grid uses
//!   `ceil` as everywhere else (upstream's reference asserts `K % bk == 0`, its kernel does
//!   not).
//! * Input scales must have exactly the grid's shape (upstream's reference would also crop a
//!   larger tensor).

use tk_core::dtype::E5M6Bytes;
use tk_core::{HostView, Result, TkError};

use crate::plan::{require_multiple, CastPlan};
use crate::scale::{ScaleGrid, ScaleLayout, ScaleView};
use crate::types::{check_matrix, QuantInput};

/// Validates a cast back of FP8/FP4 `x` (see the [module docs](self)) and returns its plan:
/// block `x.block`, the input scale grid and the detected layout of `x.sf`.
///
/// Errors: `x` (rank, column stride, `K = 0`, logical `K % 64 != 0`), `x_block_size` (0),
/// `x.sf` (dtype, strides, shape; see [`QuantInput::validate`]).
pub fn validate(x: &QuantInput<'_>) -> Result<CastPlan> {
    let g = x.validate()?;
    validate_dims(g.m, g.k, x.block, g.sf_layout)
}

/// The device-independent part of [`validate`]: logical size `(m, k)`, block and the detected
/// layout of the input scales.
pub fn validate_dims(
    m: usize,
    k: usize,
    block: (usize, usize),
    sf_layout: ScaleLayout,
) -> Result<CastPlan> {
    require_multiple(
        "x",
        &[m, k],
        "K",
        k,
        64,
        "cast_back tiles logical columns by 64",
    )?;
    CastPlan::new_arg(m, k, block, sf_layout, "x_block_size")
}

/// Validates a cast back of packed E5M6 `data` `(M, 3K/2)` with scales `sf` for `block` and
/// returns its plan.
///
/// Errors: `x` (rank, column stride, no columns, byte columns not a multiple of 12, i.e.
/// `K % 8 != 0`), `x_block_size` (0), `x.sf` (dtype, strides, shape).
pub fn validate_e5m6(
    data: &HostView<'_, E5M6Bytes>,
    sf: &ScaleView<'_>,
    block: (usize, usize),
) -> Result<CastPlan> {
    let (m, k) = e5m6_dims(data.layout())?;
    let grid = ScaleGrid::for_matrix_arg(m, k, block, "x_block_size")?;
    let layout = sf.check("x.sf", &grid)?;
    CastPlan::new_arg(m, k, block, layout, "x_block_size")
}

/// The logical `(M, K)` of packed E5M6 bytes of layout `data` `(M, 3K/2)`: unit column
/// stride, at least one column, byte columns a multiple of 12. Errors name `x`.
pub(crate) fn e5m6_dims(data: &tk_core::Layout) -> Result<(usize, usize)> {
    let (m, p) = check_matrix("x", data)?;
    if p == 0 {
        return Err(TkError::Empty {
            arg: "x",
            shape: data.shape().to_vec(),
        });
    }
    require_multiple(
        "x",
        data.shape(),
        "3K/2 (byte columns)",
        p,
        12,
        "E5M6 packs 8 values into 12 bytes, so K % 8 == 0",
    )?;
    Ok((m, p / 3 * 2))
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU ops (feature `cuda`): `cuda/cast_back.cu`, a warp per task of consecutive columns of
/// one row, every store instruction 512 contiguous bytes; bit-exact with
/// [`crate::reference::cast_back_op`].
#[cfg(feature = "cuda")]
mod gpu {
    use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
    use tk_core::dtype::E5M6Bytes;
    use tk_core::error::DriverContext;
    use tk_core::{
        DType, DeviceTensor, DeviceView, DeviceViewMut, KernelSource, KernelSpec, Result,
    };

    use super::{e5m6_dims, validate_dims};
    use crate::cast::check_same_device;
    use crate::device::{check_contiguous, DeviceQuantDataView, DeviceQuantInput, DeviceScaleView};
    use crate::plan::CastPlan;
    use crate::scale::ScaleGrid;
    use crate::types::{CastFormat, DequantElement};

    static SOURCE: KernelSource = KernelSource {
        file: "cast_back.cu",
        entry: "tk_cast_back",
        code: include_str!("../cuda/cast_back.cu"),
        headers: &[
            ("tk/quant_io.cuh", include_str!("../cuda/quant_io.cuh")),
            (
                "tk/quant_scale.cuh",
                include_str!("../cuda/quant_scale.cuh"),
            ),
        ],
        needs_cuda_headers: true,
    };

    /// The kernel arguments, field for field `Params` in `cuda/cast_back.cu`.
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    struct CastBackArgs {
        x: u64,
        ldx: u64,
        x_sf: u64,
        xsf_s0: u64,
        xsf_s1: u64,
        out: u64,
        m: u64,
        k: u64,
    }

    // SAFETY: `repr(C)` plain old data (8 × u64, no padding), laid out exactly as the
    // kernel's `Params`, which the kernel receives by value.
    unsafe impl DeviceRepr for CastBackArgs {}

    /// Columns of one warp task of FP8 / FP4 data with scale blocks wider than one column: 2
    /// fragments per lane of 8 values, 4 of 4 (e4m3 -> fp32). H200 (meas26, medians of 3 runs
    /// at 8001x7168, against 4 fragments per lane everywhere): e2m1 -> fp32 npc=128 68.19 ->
    /// 66.27 µs (89.0 -> 91.5 %), e4m3 -> bf16 npc=128 43.66 -> 43.07, npc=7168 43.84 -> 42.96;
    /// e2m1 -> bf16 within 0.5 %. 512 columns also keep a task's packed npc=128 scales whole
    /// words (`TASK_WORDS`): e4m3 -> fp32 with 2 fragments (256 columns) lost them and was 4.5 %
    /// slower, so it keeps 4.
    const TASK_COLUMNS: usize = 512;

    /// Fragments per lane of the other tasks: E5M6 data (1024 columns, meas22: 92.5-94.2 % of
    /// the copy ceiling) and per-column scales (`bk == 1`, one scale per value: with 2
    /// fragments e4m3 128x1 -> bf16 at 8064x7168 took 48.6-48.8 µs against 45.15 with 4, meas27).
    const FRAGS_PER_LANE: usize = 4;

    /// Fragments each lane loads per warp task (`TK_J`), all in flight before the first store.
    fn frags_per_lane(fmt: Option<CastFormat>, bk: usize, out: DType) -> usize {
        match fmt {
            Some(_) if bk > 1 => TASK_COLUMNS / (32 * fragment_values(fmt, out)),
            _ => FRAGS_PER_LANE,
        }
    }

    /// The threads of a CTA (8 warps, `WARPS` in the kernel).
    const CTA_THREADS: u32 = 256;

    /// The values of one fragment (`VEC` in the kernel): an e4m3 fragment is one 16-byte store
    /// wide (4 values for fp32 output, 8 for bf16), e2m1 and E5M6 fragments 8 values.
    fn fragment_values(fmt: Option<CastFormat>, out: DType) -> usize {
        match fmt {
            Some(CastFormat::E4M3) => 16 / out.size_bytes(),
            _ => 8,
        }
    }

    /// The columns of one warp task (`SEG` in the kernel).
    fn task_columns(fmt: Option<CastFormat>, bk: usize, out: DType) -> usize {
        frags_per_lane(fmt, bk, out) * 32 * fragment_values(fmt, out)
    }

    /// The specialisation for data `fmt`, packed or fp32 scales, `block`, output `out`, vector
    /// data accesses and vector fp32 scale loads (`block.1 == 1`, unit column stride).
    pub(crate) fn kernel_spec(
        fmt: Option<CastFormat>,
        packed_sf: bool,
        block: (usize, usize),
        out: DType,
        vecio: bool,
        sf_vec: bool,
    ) -> KernelSpec {
        KernelSpec::new(&SOURCE)
            .define(
                "TK_IN",
                match fmt {
                    Some(CastFormat::E4M3) => 2,
                    Some(CastFormat::E2M1) => 3,
                    None => 4,
                },
            )
            .define("TK_IN_SF", packed_sf as u8)
            .define("TK_BM", block.0)
            .define("TK_BK", block.1)
            .define("TK_OUT", (out == DType::BF16) as u8)
            .define("TK_VECIO", vecio as u8)
            .define("TK_SF_VEC", sf_vec as u8)
            .define("TK_J", frags_per_lane(fmt, block.1, out))
    }

    /// The specialisations of the spec's grids (for compile checks and prewarm).
    pub(crate) fn registered_kernels() -> Vec<KernelSpec> {
        let mut v = Vec::new();
        for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
            for (packed, block) in [(true, (1, 128)), (false, (128, 128)), (false, (128, 1))] {
                for out in [DType::F32, DType::BF16] {
                    v.push(kernel_spec(
                        Some(fmt),
                        packed,
                        block,
                        out,
                        true,
                        block.1 == 1,
                    ));
                }
            }
        }
        for out in [DType::F32, DType::BF16] {
            v.push(kernel_spec(None, false, (1, 7168), out, true, false));
        }
        v
    }

    /// Dequantizes `x` (e4m3 `(M, K)` or packed e2m1 `(M, K/2)` with scales for `x.block`,
    /// logical `K % 64 == 0`) to a new contiguous `(M, K)` fp32 or bf16 tensor. Enqueued on the
    /// data's stream; no host sync.
    pub fn cast_back<O: DequantElement>(x: &DeviceQuantInput<'_>) -> Result<DeviceTensor<O>> {
        let g = x.validate()?;
        validate_dims(g.m, g.k, x.block, g.sf_layout)?;
        let mut out = x.data.device().alloc::<O>(&[g.m, g.k])?;
        cast_back_into(x, &mut out.view_mut())?;
        Ok(out)
    }

    /// [`cast_back`] into a caller-provided contiguous `(M, K)` `out`.
    pub fn cast_back_into<O: DequantElement>(
        x: &DeviceQuantInput<'_>,
        out: &mut DeviceViewMut<'_, O>,
    ) -> Result<()> {
        let g = x.validate()?;
        let plan = validate_dims(g.m, g.k, x.block, g.sf_layout)?;
        let fmt = x.data.format();
        let src = Source {
            fmt: Some(fmt),
            address: x.data.address(),
            ld: x.data.layout().strides()[0] as u64,
            device: x.data.device(),
            load_bytes: (fragment_values(Some(fmt), O::DTYPE) / fmt.values_per_byte()) as u64,
        };
        launch(&src, &x.sf, x.block, &plan, out)
    }

    /// Dequantizes packed E5M6 `data` `(M, 3K/2)` (`K % 8 == 0`, any row stride) with scales
    /// `sf` for `block` (`cast_back(..., x_special_fmt='e5m6')`) to a new contiguous `(M, K)`
    /// fp32 or bf16 tensor; bit-exact with [`crate::reference::cast_back_e5m6`].
    pub fn cast_back_e5m6<O: DequantElement>(
        data: &DeviceView<'_, E5M6Bytes>,
        sf: &DeviceScaleView<'_>,
        block: (usize, usize),
    ) -> Result<DeviceTensor<O>> {
        let (m, k) = e5m6_dims(data.layout())?;
        let mut out = data.device().alloc::<O>(&[m, k])?;
        cast_back_e5m6_into(data, sf, block, &mut out.view_mut())?;
        Ok(out)
    }

    /// [`cast_back_e5m6`] into a caller-provided contiguous `(M, K)` `out`.
    pub fn cast_back_e5m6_into<O: DequantElement>(
        data: &DeviceView<'_, E5M6Bytes>,
        sf: &DeviceScaleView<'_>,
        block: (usize, usize),
        out: &mut DeviceViewMut<'_, O>,
    ) -> Result<()> {
        let (m, k) = e5m6_dims(data.layout())?;
        let grid = ScaleGrid::for_matrix_arg(m, k, block, "x_block_size")?;
        let layout = sf.check("x.sf", &grid)?;
        let plan = CastPlan::new_arg(m, k, block, layout, "x_block_size")?;
        let src = Source {
            fmt: None,
            address: data.address(),
            ld: data.layout().strides()[0] as u64,
            device: data.device(),
            load_bytes: 4,
        };
        launch(&src, sf, block, &plan, out)
    }

    /// The data side of a cast back: format (`None`: E5M6), address, row stride in bytes or
    /// elements of one byte, device, and the alignment its vector loads need.
    struct Source<'d> {
        fmt: Option<CastFormat>,
        address: u64,
        ld: u64,
        device: &'d tk_core::Device,
        load_bytes: u64,
    }

    /// Checks `out` and launches the cast back of `src` with scales `sf` for `block`.
    fn launch<O: DequantElement>(
        src: &Source<'_>,
        sf: &DeviceScaleView<'_>,
        block: (usize, usize),
        plan: &CastPlan,
        out: &mut DeviceViewMut<'_, O>,
    ) -> Result<()> {
        check_contiguous("out", out.layout(), &[plan.m, plan.k])?;
        let dev = src.device;
        check_same_device("out", dev, out.device())?;
        check_same_device("x.sf", dev, sf.device())?;
        if plan.m == 0 {
            return Ok(());
        }
        let (xsf_s0, xsf_s1) = sf.strides();
        let args = CastBackArgs {
            x: src.address,
            ldx: src.ld,
            x_sf: sf.address(),
            xsf_s0,
            xsf_s1,
            out: out.address(),
            m: plan.m as u64,
            k: plan.k as u64,
        };
        // `K % 64 == 0` (or, E5M6, `K % 8 == 0` with 12-byte groups) keeps every row start
        // aligned when the base and the row stride are.
        let vecio =
            args.x % src.load_bytes == 0 && args.ldx % src.load_bytes == 0 && args.out % 16 == 0;
        let packed = matches!(sf, DeviceScaleView::Packed(_));
        // fp32 scales of one column each, contiguous along K in 16-byte aligned rows: a store's
        // 4 or 8 scales are read as float4.
        let sf_vec =
            !packed && block.1 == 1 && xsf_s1 == 1 && args.x_sf % 16 == 0 && (xsf_s0 * 4) % 16 == 0;
        let spec = kernel_spec(src.fmt, packed, block, O::DTYPE, vecio, sf_vec);
        let f = dev.function(&spec)?;
        // One warp per task of `task_columns` columns of a row: one task per warp (grid x up
        // to 2^31 - 1 CTAs; beyond that the warps loop over the remaining tasks). H200, the
        // 8001 x 7168 rows: 3.8-4.6 % faster (per_token_cast_back e2m1 -> bf16 38.85 -> 37.18
        // us, e4m3 -> fp32 77.31 -> 71.97 us) than at most 16 CTAs per SM looping over their
        // tasks in ~2 waves. A pure write-heavy stream behaves the same way (tk-core's
        // ceilings bench: a 1:4 stream reaches 91.5 % of the copy ceiling with 32 short CTAs
        // per SM, 81.1 % with 8 long ones).
        let tasks = plan.m * plan.k.div_ceil(task_columns(src.fmt, block.1, O::DTYPE));
        let warps_per_cta = CTA_THREADS as usize / 32;
        let cfg = LaunchConfig {
            grid_dim: (
                tasks.div_ceil(warps_per_cta).clamp(1, i32::MAX as usize) as u32,
                1,
                1,
            ),
            block_dim: (CTA_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&args);
        // SAFETY: the data and scales were validated (shape, row stride, scales of the grid's
        // shape through their strides) and out is contiguous (M, K) on the same device; the
        // kernel reads the data rows r < M (K logical columns) and the scales inside their
        // grid and writes out[r, 0..K] for r < M only, with vector accesses only where
        // `vecio` (data, output) and `sf_vec` (scale rows of K unit-stride fp32) proved the
        // alignment. The buffers outlive the stream-ordered launch.
        unsafe { l.launch(cfg) }.ctx("launching tk_cast_back")?;
        Ok(())
    }

    /// `per_token_cast_back`: [`cast_back`] with block `(1, npc)`.
    pub fn per_token_cast_back<O: DequantElement>(
        data: DeviceQuantDataView<'_>,
        sf: DeviceScaleView<'_>,
        num_per_channels: usize,
    ) -> Result<DeviceTensor<O>> {
        cast_back(&DeviceQuantInput::new(data, sf, (1, num_per_channels)))
    }
}
