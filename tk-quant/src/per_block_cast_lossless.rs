//! `per_block_cast_lossless` (`spec/quant.md` §3.4): requantizes FP4 e2m1 data with
//! fine-grained power-of-two scales into FP8 e4m3 with coarser power-of-two scales, **without
//! changing any dequantized value**.
//!
//! # What it computes (integer exponent space)
//!
//! Input block `(ih, iw)`, output block `(oh, ow)` with `oh % ih == 0` and `ow % iw == 0`, so
//! every output block is a union of whole input blocks.
//!
//! 1. Each input scale is `2^(E_in − 127)`; `E_in` is its UE8M0 byte (layout C) or the
//!    exponent field `bits(s) >> 23` of an fp32 scale ([`input_exponent`]).
//! 2. For each output block `O`: `E_max` = the largest `E_in` of the input blocks inside `O`
//!    (those of the input grid, i.e. whose first row and column lie in the tensor).
//! 3. `E_out = E_max − 6`, saturating at 0 ([`output_exponent`]).
//! 4. Each element: `d = E_in − E_out` and `out = enc8(fl(dec4(data) · 2^d))`. Whenever the
//!    op succeeds, `d ∈ [−5, 6]` (or `[1, 6]` for all-zero blocks with `E_out = 0`), so every
//!    product is an exact e4m3 value (at most 6·2^6 = 384, smallest nonzero 0.5·2^-5 = 2^-6)
//!    and nothing is rounded.
//! 5. Output scale: the UE8M0 byte `E_out` (layout C) or the fp32 with bits `E_out << 23`
//!    (layouts A, B).
//!
//! So `dec8(out) · 2^(E_out − 127) == dec4(data) · 2^(E_in − 127)` bit for bit, signed zeros
//! included.
//!
//! | argument | dtype | shape | notes |
//! |---|---|---|---|
//! | `x.data` | packed e2m1 | `(M, K/2)`, logical `K % 32 == 0` | unit column stride, any row stride |
//! | `x.sf` | fp32 / packed UE8M0 | grid `(ceil(M/ih), ceil(K/iw))` | layout A, B or C; positive normal powers of two |
//! | `out` | e4m3 | `(M, K)` | contiguous |
//! | `out_sf` | fp32 / packed UE8M0 | grid `(ceil(M/oh), ceil(K/ow))` | layout A, B or C |
//!
//! # Preconditions
//!
//! Static ([`validate`]):
//! * `x.data` is packed FP4 e2m1 (the output is always FP8 e4m3: upstream's `fmt` must be
//!   `'e4m3'`; here there is no format argument), logical `K % 32 == 0`;
//! * `iw` and `ow` are powers of two; `oh % ih == 0` and `ow % iw == 0`;
//! * the scale flags select layout A, B or C ([`ScaleOptions::layout`]). `round_sf` does not
//!   change any value (the scales are powers of two by construction) but layout C still needs
//!   it set, as everywhere in this crate.
//!
//! Data-dependent (checked by the CPU reference while it computes; a GPU launch must report
//! them too), each a [`TkError::Param`] naming `x.sf`:
//! 1. **Every input scale is a positive normal power of two**, `2^-126 ..= 2^127` (UE8M0
//!    bytes 1..=254). Upstream silently uses the floor exponent field of an fp32 scale, so a
//!    non-power-of-two scale (or 0, a subnormal, a negative, inf or NaN) gives output whose
//!    dequantized values differ from the input's.
//! 2. **`E_in + 5 >= E_out`** for every input block, i.e. within one output block the largest
//!    input scale is at most `2^11` times the smallest ([`MAX_EXPONENT_SPREAD`]). Upstream's
//!    kernel traps on a device assertion otherwise. Note that an all-zero FP4 block (scale
//!    `2^-126` from a cast, e.g. zero padding rows) inside an output block of ordinary values
//!    breaks this rule, upstream and here alike.
//! 3. **No output scale of 0.0 under nonzero data**: when `E_max <= 6` the output exponent
//!    saturates to 0 and upstream silently writes the scale 0.0, so every nonzero value of the
//!    block dequantizes to 0. Such a block is an error here; an output block whose data are all
//!    (signed) zeros is lossless with scale 0.0 and gets upstream's result (scale 0.0 / UE8M0
//!    byte 0, data ±0).
//!
//! # Deviations from upstream
//!
//! * The three typed errors above, where upstream traps or silently writes a scale that loses
//!   values. **Spec correction**: §3.4 step 7 and §5 item 12 say the cast is lossless "as long
//!   as `E_max >= 6`"; at `E_max == 6` the output exponent is already 0 (scale 0.0), so the
//!   correct condition is `E_max >= 7`.
//! * **Any row stride** of the FP4 data is accepted (upstream requires it contiguous).
//! * Upstream's kernel tiling adds unstated limits on `oh` (e.g. `32 % oh == 0` below 32);
//!   any `(oh, ow)` meeting the rules above works here.
//! * Packed UE8M0 output without `round_sf` or without `use_tma_aligned_col_major_sf` is
//!   rejected (crate-wide rule; upstream would write layout C correctly without `round_sf`).

use tk_core::{DType, Result, TkError};

use crate::plan::{require_multiple, CastPlan};
use crate::scale::{ScaleLayout, ScaleOptions};
use crate::types::QuantInput;

/// `E_out = E_max − EXPONENT_SHIFT`: the e4m3 output needs 6 more binades above the FP4 range
/// (e2m1's largest value 6 times `2^6` is 384 ≤ 448).
pub const EXPONENT_SHIFT: u32 = 6;

/// The largest allowed `E_max − E_in` within one output block (upstream's device assertion
/// `E_in + 5 >= E_out`): e2m1's smallest nonzero 0.5 times `2^-5` is e4m3's smallest normal.
pub const MAX_EXPONENT_SPREAD: u32 = 11;

/// The parameters of a lossless FP4 → FP8 requantization (upstream's `out_block_size` and the
/// scale flags; `x_block_size` travels with the input, [`QuantInput::block`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LosslessCastParams {
    /// `(oh, ow)`: rows × columns per output scale; `ow` a power of two, `oh` a multiple of
    /// `ih` and `ow` of `iw`.
    pub out_block_size: (usize, usize),
    /// Output scale layout (rounding has no effect on values).
    pub opts: ScaleOptions,
}

impl LosslessCastParams {
    /// Bundles the parameters.
    pub const fn new(out_block_size: (usize, usize), opts: ScaleOptions) -> Self {
        Self {
            out_block_size,
            opts,
        }
    }
}

/// The validated geometry of a lossless requantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LosslessPlan {
    /// The input: block `(ih, iw)`, its scale grid and the detected layout of `x.sf`.
    pub input: CastPlan,
    /// The output: block `(oh, ow)`, its scale grid and the selected layout.
    pub output: CastPlan,
}

/// The exponent `E_in` of an input scale: `Some(bits(s) >> 23)` if `s` is a positive normal
/// power of two (`2^-126 ..= 2^127`, i.e. UE8M0 bytes 1..=254), else `None`.
pub const fn input_exponent(sf: f32) -> Option<u32> {
    let bits = sf.to_bits();
    let e = bits >> 23;
    if bits & 0x807F_FFFF == 0 && e >= 1 && e <= 254 {
        Some(e)
    } else {
        None
    }
}

/// `E_out` from `E_max`: `E_max − 6`, saturating at 0 (upstream's rule; 0 means the scale
/// 0.0, see the [module docs](self)).
pub const fn output_exponent(e_max: u32) -> u32 {
    e_max.saturating_sub(EXPONENT_SHIFT)
}

/// Validates the static preconditions of a lossless requantization of `x` (see the
/// [module docs](self)) and returns its plan.
///
/// Errors: `x` ([`TkError::Dtype`] unless packed e2m1; rank, column stride, `K = 0`,
/// `K % 32 != 0`), `x_block_size` (0, or `iw` not a power of two), `x.sf` (layout, shape),
/// `use_packed_ue8m0` ([`ScaleOptions::layout`]), `out_block_size` ([`TkError::Param`]).
pub fn validate(x: &QuantInput<'_>, params: &LosslessCastParams) -> Result<LosslessPlan> {
    let g = x.validate()?;
    if x.data.dtype() != DType::E2M1x2 {
        return Err(TkError::Dtype {
            arg: "x",
            expected: "packed FP4 e2m1 data (the lossless cast reads FP4 and writes FP8 e4m3)"
                .into(),
            got: x.data.dtype(),
        });
    }
    validate_dims(g.m, g.k, x.block, g.sf_layout, params)
}

/// The device-independent part of [`validate`]: logical size `(m, k)` of e2m1 data, its block
/// and the detected layout of its scales.
pub fn validate_dims(
    m: usize,
    k: usize,
    x_block_size: (usize, usize),
    x_sf_layout: ScaleLayout,
    params: &LosslessCastParams,
) -> Result<LosslessPlan> {
    require_multiple(
        "x",
        &[m, k],
        "K",
        k,
        32,
        "per_block_cast_lossless tiles FP4 columns by 32",
    )?;
    let out_layout = params.opts.layout()?;
    let (ih, iw) = x_block_size;
    let (oh, ow) = params.out_block_size;
    if ih == 0 || iw == 0 {
        return Err(TkError::param(
            "x_block_size",
            format!("block sizes must be at least 1, got ({ih}, {iw})"),
        ));
    }
    if oh == 0 || ow == 0 {
        return Err(TkError::param(
            "out_block_size",
            format!("block sizes must be at least 1, got ({oh}, {ow})"),
        ));
    }
    if !iw.is_power_of_two() {
        return Err(TkError::param(
            "x_block_size",
            format!("the lossless cast needs a power-of-two input block width, got ({ih}, {iw})"),
        ));
    }
    if !ow.is_power_of_two() {
        return Err(TkError::param(
            "out_block_size",
            format!("the lossless cast needs a power-of-two output block width, got ({oh}, {ow})"),
        ));
    }
    if oh % ih != 0 || ow % iw != 0 {
        return Err(TkError::param(
            "out_block_size",
            format!(
                "each output block must be a union of whole input blocks: ({oh}, {ow}) is not \
                 a multiple of x_block_size ({ih}, {iw}) in both dimensions"
            ),
        ));
    }
    Ok(LosslessPlan {
        input: CastPlan::new_arg(m, k, x_block_size, x_sf_layout, "x_block_size")?,
        output: CastPlan::new_arg(m, k, params.out_block_size, out_layout, "out_block_size")?,
    })
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU ops (feature `cuda`): `cuda/per_block_cast_lossless.cu`, two passes (output
/// exponents per block, then the element-wise requantization), bit-exact with
/// [`crate::reference::per_block_cast_lossless`]. The data-dependent errors are recorded on the
/// device in a [`LosslessStatus`] and reported by [`LosslessStatus::check`] (a host sync).
#[cfg(feature = "cuda")]
mod gpu {
    use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
    use tk_core::error::DriverContext;
    use tk_core::{Device, DeviceTensor, KernelSource, KernelSpec, Result, TkError};

    use super::{validate_dims, LosslessCastParams, LosslessPlan, MAX_EXPONENT_SPREAD};
    use crate::cast::{check_out_scales, check_same_device};
    use crate::device::{
        DeviceQuantData, DeviceQuantDataViewMut, DeviceQuantInput, DeviceScaleView, DeviceScales,
    };
    use crate::scale::ScaleLayout;
    use crate::types::CastFormat;

    static SOURCE: KernelSource = KernelSource {
        file: "per_block_cast_lossless.cu",
        entry: "tk_lossless",
        code: include_str!("../cuda/per_block_cast_lossless.cu"),
        headers: &[("tk/quant_io.cuh", include_str!("../cuda/quant_io.cuh"))],
        needs_cuda_headers: true,
    };

    /// The columns of a row one warp of pass 2 handles per task (the kernel's `SEG`).
    const PASS2_TASK_COLUMNS: usize = 1024;

    /// The kernel arguments, field for field `Params` in `cuda/per_block_cast_lossless.cu`.
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    struct LosslessArgs {
        x: u64,
        ldx: u64,
        x_sf: u64,
        xsf_s0: u64,
        xsf_s1: u64,
        out: u64,
        sf: u64,
        flag: u64,
        m: u64,
        k: u64,
        in_nbm: u64,
        in_nbk: u64,
        nbm: u64,
        nbk: u64,
        rows_aligned: u64,
    }

    // SAFETY: `repr(C)` plain old data (15 × u64, no padding), laid out exactly as the
    // kernel's `Params`, which the kernel receives by value.
    unsafe impl DeviceRepr for LosslessArgs {}

    /// The data-dependent error bits a lossless cast records on the device (see
    /// [`LosslessStatus::check`]). Bits accumulate over every call that used the status.
    #[derive(Debug)]
    pub struct LosslessStatus {
        flag: DeviceTensor<i32>,
    }

    impl LosslessStatus {
        /// A cleared status on `dev`.
        pub fn new(dev: &Device) -> Result<Self> {
            Ok(Self {
                flag: dev.zeros::<i32>(&[1])?,
            })
        }

        /// Waits for the stream and returns the first recorded error, each a
        /// [`TkError::Param`] naming `x.sf`, in the order of the module docs: an input scale
        /// that is not a positive normal power of two; an input block more than
        /// 2^[`MAX_EXPONENT_SPREAD`] below its output block's largest input scale; an output
        /// scale of 0.0 over nonzero data. **Synchronises with the host.**
        pub fn check(&self) -> Result<()> {
            let bits = self.flag.to_host()?.as_slice()[0] as u32;
            let msg = if bits & 1 != 0 {
                "an input scale is not a positive normal power of two (2^-126 ..= 2^127, UE8M0 \
                 bytes 1..=254); the lossless cast works on scale exponents only"
                    .to_string()
            } else if bits & 2 != 0 {
                format!(
                    "an input block's scale is more than 2^{MAX_EXPONENT_SPREAD} below the \
                     largest input scale of its output block, which FP8 e4m3 cannot hold \
                     exactly; use a smaller out_block_size"
                )
            } else if bits & 4 != 0 {
                "an output block's largest input scale is 2^-121 or less, so its output scale \
                 saturates to 0.0 and its nonzero values would be lost"
                    .to_string()
            } else {
                return Ok(());
            };
            Err(TkError::param("x.sf", msg))
        }
    }

    /// The specialisation of `pass` (1 or 2) for the blocks, scale kinds and vector access
    /// (`vecio`: 0 byte accesses, 1 FP4 rows 4-byte and FP8 rows 8-byte aligned, 2 FP4 rows
    /// 8-byte and FP8 rows 16-byte aligned: the integer path of pass 2).
    fn kernel_spec(
        pass: u8,
        packed_in: bool,
        in_block: (usize, usize),
        out_block: (usize, usize),
        out_layout: ScaleLayout,
        vecio: u8,
    ) -> KernelSpec {
        KernelSpec::new(&SOURCE)
            .define("TK_PASS", pass)
            .define("TK_IN", 3)
            .define("TK_IN_SF", packed_in as u8)
            .define("TK_IH", in_block.0)
            .define("TK_IW", in_block.1)
            .define("TK_OH", out_block.0)
            .define("TK_OW", out_block.1)
            .define(
                "TK_SF_OUT",
                match out_layout {
                    ScaleLayout::RowMajorF32 => 0,
                    ScaleLayout::ColMajorF32 => 1,
                    ScaleLayout::PackedUe8m0 => 2,
                },
            )
            .define("TK_VECIO", vecio)
    }

    /// The specialisations of the spec's benchmark grid (for compile checks and prewarm).
    pub(crate) fn registered_kernels() -> Vec<KernelSpec> {
        let mut v = Vec::new();
        for (packed, layout) in [
            (true, ScaleLayout::PackedUe8m0),
            (false, ScaleLayout::RowMajorF32),
        ] {
            for out_block in [(1, 128), (32, 32), (128, 128)] {
                for pass in [1, 2] {
                    v.push(kernel_spec(pass, packed, (1, 32), out_block, layout, 2));
                }
            }
        }
        v
    }

    fn plan(x: &DeviceQuantInput<'_>, params: &LosslessCastParams) -> Result<LosslessPlan> {
        let g = x.validate()?;
        if x.data.format() != CastFormat::E2M1 {
            return Err(TkError::Dtype {
                arg: "x",
                expected: "packed FP4 e2m1 data (the lossless cast reads FP4 and writes FP8 e4m3)"
                    .into(),
                got: tk_core::DType::E4M3,
            });
        }
        validate_dims(g.m, g.k, x.block, g.sf_layout, params)
    }

    /// Lossless FP4 → FP8 requantization of `x` (packed e2m1 `(M, K/2)`, `K % 32 == 0`,
    /// scales for `x.block`): e4m3 data `(M, K)` and power-of-two scales of grid
    /// `(ceil(M/oh), ceil(K/ow))` in the layout `params.opts` selects.
    ///
    /// **Synchronises with the host** to report the data-dependent errors (see
    /// [`LosslessStatus::check`]); [`per_block_cast_lossless_into`] does not.
    pub fn per_block_cast_lossless(
        x: &DeviceQuantInput<'_>,
        params: &LosslessCastParams,
    ) -> Result<(DeviceQuantData, DeviceScales)> {
        let plan = plan(x, params)?;
        let dev = x.data.device();
        let (m, k) = (plan.output.m, plan.output.k);
        let mut out = DeviceQuantData::alloc(dev, CastFormat::E4M3, m, k)?;
        let mut sf = DeviceScales::alloc(dev, plan.output.sf_layout, plan.output.grid)?;
        let status = LosslessStatus::new(dev)?;
        per_block_cast_lossless_into(x, params, &mut out.view_mut(), &mut sf, &status)?;
        status.check()?;
        Ok((out, sf))
    }

    /// [`per_block_cast_lossless`] into caller-provided contiguous e4m3 `out` and `out_sf`,
    /// without a host sync: data-dependent errors are OR-ed into `status` (check it with
    /// [`LosslessStatus::check`] before using the outputs).
    pub fn per_block_cast_lossless_into(
        x: &DeviceQuantInput<'_>,
        params: &LosslessCastParams,
        out: &mut DeviceQuantDataViewMut<'_>,
        out_sf: &mut DeviceScales,
        status: &LosslessStatus,
    ) -> Result<()> {
        let plan = plan(x, params)?;
        let (m, k) = (plan.output.m, plan.output.k);
        let dev = x.data.device();
        out.check_output("out", CastFormat::E4M3, m, k)?;
        check_same_device("out", dev, out.device())?;
        check_out_scales(out_sf, &plan.output)?;
        check_same_device("out_sf", dev, out_sf.device())?;
        check_same_device("status", dev, status.flag.device())?;
        if m == 0 {
            return Ok(());
        }
        let (xsf_s0, xsf_s1) = x.sf.strides();
        let args = LosslessArgs {
            x: x.data.address(),
            ldx: x.data.layout().strides()[0] as u64,
            x_sf: x.sf.address(),
            xsf_s0,
            xsf_s1,
            out: out.address(),
            sf: out_sf.address(),
            flag: status.flag.view().address(),
            m: m as u64,
            k: k as u64,
            in_nbm: plan.input.grid.nbm() as u64,
            in_nbk: plan.input.grid.nbk() as u64,
            nbm: plan.output.grid.nbm() as u64,
            nbk: plan.output.grid.nbk() as u64,
            rows_aligned: plan.output.grid.rows_aligned() as u64,
        };
        // Pass 2 loads 8 (or 4) bytes of FP4 and stores 16 (or 8) of FP8 per fragment;
        // K % 32 == 0 keeps the rows aligned when the bases and the row stride are.
        let aligned = |a: u64| args.x % a == 0 && args.ldx % a == 0 && args.out % (2 * a) == 0;
        let vecio = if aligned(8) { 2 } else { aligned(4) as u8 };
        let packed = matches!(x.sf, DeviceScaleView::Packed(_));
        let sms = dev.props().sm_count as usize;
        // Pass 1: one warp per output block of at least 64 input blocks or, with packed
        // input scales, at least 32 input block rows, else one thread (the kernel's TEAM;
        // a mismatch would only change the grid size); pass 2: one warp per task of 1024
        // columns of a row (the kernel's SEG), CTAs of 8 warps looping over the tasks.
        let (oh, ow) = params.out_block_size;
        let (rh, rw) = (oh / x.block.0, ow / x.block.1);
        let team = if rh * rw >= 64 || (packed && rh >= 32) {
            32
        } else {
            1
        };
        let out_blocks = plan.output.grid.nbm() * plan.output.grid.nbk();
        let pass2_tasks = m * k.div_ceil(PASS2_TASK_COLUMNS);
        for (pass, threads) in [(1u8, team * out_blocks), (2, pass2_tasks * 32)] {
            let spec = kernel_spec(
                pass,
                packed,
                x.block,
                params.out_block_size,
                plan.output.sf_layout,
                vecio,
            );
            let f = dev.function(&spec)?;
            // Pass 2: one wave of resident CTAs (each warp loops over its tasks); more CTAs
            // than fit at once left a partial last wave with most SMs idle.
            let max_ctas = if pass == 1 {
                sms * 64
            } else {
                dev.resident_blocks(&f, 256)?.max(sms)
            };
            let cfg = LaunchConfig {
                grid_dim: (threads.div_ceil(256).clamp(1, max_ctas) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut l = dev.stream().launch_builder(&f);
            l.arg(&args);
            // SAFETY: x was validated (e2m1 data rows through their stride, scales of the input
            // grid through their strides), out is contiguous (M, K) e4m3, out_sf has the output
            // grid's full allocation and status one i32, all on x's device; pass 1 reads the
            // input scales inside their grid and writes out_sf inside its allocation, pass 2
            // reads rows r < M and the scales and writes out[r, 0..K]; vector accesses only
            // where `vecio` proved the alignment. Buffers outlive the stream-ordered launches.
            unsafe { l.launch(cfg) }.ctx("launching tk_lossless")?;
        }
        Ok(())
    }
}
