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

/// A tensor view that knows its layout (host and device views alike).
pub trait ViewLayout {
    /// The view's layout.
    fn view_layout(&self) -> &Layout;
}

impl<T: Element> ViewLayout for tk_core::HostView<'_, T> {
    fn view_layout(&self) -> &Layout {
        self.layout()
    }
}

impl<T: Element> ViewLayout for tk_core::DeviceView<'_, T> {
    fn view_layout(&self) -> &Layout {
        self.layout()
    }
}

/// The tensor arguments of one `reduce_fused` call (shapes and rules in the module docs),
/// generic over the kind of view: `X` for `x (M, H)`, `F` for the fp32 tensors, `I` for the
/// int32 map. The CPU uses [`ReduceFusedInputs`](crate::reference::ReduceFusedInputs) (host
/// views), the GPU `DeviceReduceFusedInputs` (device views).
#[derive(Debug, Clone)]
pub struct ReduceFusedTensors<X, F, I> {
    /// `x (M, H)`: the fused buffer.
    pub x: X,
    /// `x_sf (M,)` fp32: one scale per fused row, applied to the slot's weight.
    pub x_sf: Option<F>,
    /// `topk_weights (T, K)` fp32; absent = weight `1.0`.
    pub topk_weights: Option<F>,
    /// `token_topk_to_pos (T, K)` i32.
    pub token_topk_to_pos: I,
    /// `sf (1,)` fp32: global output multiplier (e4m3 output only).
    pub sf: Option<F>,
}

impl<X: ViewLayout, F: ViewLayout, I: ViewLayout> ReduceFusedTensors<X, F, I> {
    /// Just `x (M, H)` and the map `(T, K)` (unit weights, no scales).
    pub fn new(x: X, token_topk_to_pos: I) -> Self {
        Self {
            x,
            x_sf: None,
            topk_weights: None,
            token_topk_to_pos,
            sf: None,
        }
    }

    /// Adds the per-slot weights `(T, K)` fp32.
    pub fn with_weights(mut self, topk_weights: F) -> Self {
        self.topk_weights = Some(topk_weights);
        self
    }

    /// Adds the per-row input scales `(M,)` fp32.
    pub fn with_x_sf(mut self, x_sf: F) -> Self {
        self.x_sf = Some(x_sf);
        self
    }

    /// Adds the global output scale `(1,)` fp32 (e4m3 output only).
    pub fn with_sf(mut self, sf: F) -> Self {
        self.sf = Some(sf);
        self
    }

    /// The layouts, for [`ReduceFusedParams::validate`].
    pub fn layouts(&self) -> ReduceFusedLayouts<'_> {
        ReduceFusedLayouts {
            x: self.x.view_layout(),
            x_sf: self.x_sf.as_ref().map(|v| v.view_layout()),
            topk_weights: self.topk_weights.as_ref().map(|v| v.view_layout()),
            token_topk_to_pos: self.token_topk_to_pos.view_layout(),
            sf: self.sf.as_ref().map(|v| v.view_layout()),
        }
    }
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

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU op (feature `cuda`).
///
/// **Kernel** (`cuda/reduce_fused.cu`): one warp per token (the last `24 · sm_count` tokens:
/// one warp per quarter row, so the kernel ends on short tasks), one per block (a block's SM
/// slot is freed as soon as its token is done, whatever its neighbours' legal slots); lane `j` first computes slot `j`'s
/// row and scalar `s = w·x_sf[p]`, the legal slots are compacted in slot order, then the warp
/// sweeps the columns in batches of 8-14 16-byte loads per lane in flight whatever the
/// number of legal slots (one legal slot: 14 column vectors; eight: one vector of each),
/// accumulating with `__fmaf_rn` in slot order and storing its converted outputs. Bit-exact with the CPU reference (explicit `__fmaf_rn` /
/// `__fmul_rn`; `cvt.rn` to bf16/f16, `cvt.rn.satfinite` to e4m3). Each warp also prefetches
/// into L2 the positions and weights of the token `4 · sm_count` tokens ahead, so that the
/// warp's first (index) round is an L2 hit rather than a DRAM miss with no row data in flight.
///
/// **Index contract on the GPU**: an entry of `token_topk_to_pos` that is not `-1` or in `0..M`
/// is read as `-1` (the slot is skipped; its `x_sf` is not read, its weight is read — it is in
/// the validated `(T, K)` tensor — but unused). No host sync.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu {
    use cudarc::driver::PushKernelArg;
    use float8::F8E4M3;
    use tk_core::error::DriverContext;
    use tk_core::{
        DType, DeviceTensor, DeviceView, DeviceViewMut, Element, KernelSource, KernelSpec, Result,
    };

    use super::{ReduceElement, ReduceFusedParams, ReduceFusedTensors, ReduceOut};
    use crate::gpu::{access_bytes, blocks, check_device, check_out, config, row_stride, HEADERS};

    static SOURCE: KernelSource = KernelSource {
        file: "reduce_fused.cu",
        entry: "tk_reduce_fused",
        code: include_str!("../cuda/reduce_fused.cu"),
        headers: HEADERS,
        needs_cuda_headers: true,
    };

    /// Tokens per block of `tk_reduce_fused` (one warp each; the kernel's `TK_TPB`, a divisor of
    /// 20). 1: a block's SM slot is freed as soon as its token is done (tokens differ in legal
    /// slots, hence in time); 4 is the earlier layout, kept as an A/B knob.
    const TOKENS_PER_BLOCK: usize = 1;
    /// The L2 prefetch distance in tokens per SM (about one 4-token block per SM ahead).
    const PREFETCH_TOKENS_PER_SM: usize = 4;
    /// Tail tokens per SM (0 would make every token one task, the earlier kernel; that measured
    /// 1.8 % slower on average on the H200, up to 11 %): the
    /// last `TAIL_TOKENS_PER_SM · sm_count` tokens are split into [`TAIL_SPLIT`] column chunks,
    /// one warp each, so that the kernel ends on short tasks instead of a few multi-slot tokens
    /// finishing alone on otherwise idle SMs (`cuda/reduce_fused.cu`). 24 per SM: about the
    /// work an SM does while a 3-slot token started under full load finishes.
    const TAIL_TOKENS_PER_SM: usize = 24;
    /// Column chunks per tail token (the kernel's `TK_SPLIT`; 1 = no split).
    const TAIL_SPLIT: usize = 4;

    /// The device tensor arguments of `reduce_fused`: [`ReduceFusedTensors`] of device views.
    pub type DeviceReduceFusedInputs<'a, T> =
        ReduceFusedTensors<DeviceView<'a, T>, DeviceView<'a, f32>, DeviceView<'a, i32>>;

    /// Which optional inputs a specialisation reads.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct ReduceOptions {
        /// `topk_weights` given.
        pub weights: bool,
        /// `x_sf` given.
        pub x_sf: bool,
        /// `sf` given.
        pub sf: bool,
    }

    /// The kernel for input dtype `in_dtype` (fp32, bf16, f16), output `out`, `cols` columns
    /// per lane access (`16 / size`, or 1 for unaligned rows), `num_topk` slots and the options.
    pub fn kernel_spec(
        in_dtype: DType,
        out: ReduceOut,
        cols: usize,
        num_topk: usize,
        o: ReduceOptions,
    ) -> KernelSpec {
        let tk_in = match in_dtype {
            DType::BF16 => 1,
            DType::F16 => 2,
            _ => 0,
        };
        KernelSpec::new(&SOURCE)
            .define("TK_IN", tk_in)
            .define("TK_E4M3", (out == ReduceOut::E4m3) as u8)
            .define("TK_W", cols)
            .define("TK_K", num_topk)
            .define("TK_WEIGHTS", o.weights as u8)
            .define("TK_XSF", o.x_sf as u8)
            .define("TK_SF", o.sf as u8)
            .define("TK_TPB", TOKENS_PER_BLOCK)
            .define("TK_SPLIT", TAIL_SPLIT)
    }

    /// Representative specialisations (the spec's benchmark: K = 6 with weights, fp32 / bf16
    /// in, same or e4m3 out, with and without `x_sf`), for compile checks and [`crate::prewarm`].
    pub fn registered_kernels() -> Vec<KernelSpec> {
        let mut v = Vec::new();
        for (dt, cols) in [(DType::F32, 4), (DType::BF16, 8)] {
            for out in [ReduceOut::Input, ReduceOut::E4m3] {
                for x_sf in [false, true] {
                    let sf = out == ReduceOut::E4m3;
                    v.push(kernel_spec(
                        dt,
                        out,
                        cols,
                        6,
                        ReduceOptions {
                            weights: true,
                            x_sf,
                            sf,
                        },
                    ));
                }
            }
        }
        v.push(kernel_spec(
            DType::F16,
            ReduceOut::Input,
            1,
            9,
            ReduceOptions {
                weights: false,
                x_sf: false,
                sf: false,
            },
        ));
        v
    }

    /// GPU `reduce_fused` with output in `x`'s dtype (`fp8_format = ''`): a new contiguous
    /// `(T, H)` tensor (see the [module docs](mod@crate::reduce_fused)).
    ///
    /// Errors: those of [`ReduceFusedParams::validate`] (`sf` is an error here);
    /// [`tk_core::TkError::Placement`] when the tensors are on different devices.
    pub fn reduce_fused<T: ReduceElement>(
        inputs: &DeviceReduceFusedInputs<'_, T>,
    ) -> Result<DeviceTensor<T>> {
        let shape =
            ReduceFusedParams::new(ReduceOut::Input).validate(&inputs.layouts(), T::DTYPE)?;
        let mut out = inputs.x.device().alloc::<T>(&shape.out_shape())?;
        reduce_fused_into(inputs, &mut out.view_mut())?;
        Ok(out)
    }

    /// [`reduce_fused`] into a caller-provided contiguous `out (T, H)`.
    ///
    /// Errors: as [`reduce_fused`], and [`tk_core::TkError::Shape`] / [`tk_core::TkError::Stride`]
    /// naming `out`.
    pub fn reduce_fused_into<T: ReduceElement>(
        inputs: &DeviceReduceFusedInputs<'_, T>,
        out: &mut DeviceViewMut<'_, T>,
    ) -> Result<()> {
        launch(inputs, ReduceOut::Input, out)
    }

    /// GPU `reduce_fused` with FP8 e4m3fn output (`fp8_format = 'e4m3'`), saturating: a new
    /// contiguous `(T, H)` tensor.
    ///
    /// Errors: as [`reduce_fused`] (`sf` is allowed).
    pub fn reduce_fused_e4m3<T: ReduceElement>(
        inputs: &DeviceReduceFusedInputs<'_, T>,
    ) -> Result<DeviceTensor<F8E4M3>> {
        let shape =
            ReduceFusedParams::new(ReduceOut::E4m3).validate(&inputs.layouts(), T::DTYPE)?;
        let mut out = inputs.x.device().alloc::<F8E4M3>(&shape.out_shape())?;
        reduce_fused_e4m3_into(inputs, &mut out.view_mut())?;
        Ok(out)
    }

    /// [`reduce_fused_e4m3`] into a caller-provided contiguous `out (T, H)` e4m3fn.
    ///
    /// Errors: as [`reduce_fused_into`].
    pub fn reduce_fused_e4m3_into<T: ReduceElement>(
        inputs: &DeviceReduceFusedInputs<'_, T>,
        out: &mut DeviceViewMut<'_, F8E4M3>,
    ) -> Result<()> {
        launch(inputs, ReduceOut::E4m3, out)
    }

    fn launch<T: ReduceElement, O: Element>(
        inputs: &DeviceReduceFusedInputs<'_, T>,
        fmt: ReduceOut,
        out: &mut DeviceViewMut<'_, O>,
    ) -> Result<()> {
        let shape = ReduceFusedParams::new(fmt).validate(&inputs.layouts(), T::DTYPE)?;
        let dev = inputs.x.device();
        check_device("token_topk_to_pos", dev, inputs.token_topk_to_pos.device())?;
        for (arg, v) in [
            ("x_sf", &inputs.x_sf),
            ("topk_weights", &inputs.topk_weights),
            ("sf", &inputs.sf),
        ] {
            if let Some(v) = v {
                check_device(arg, dev, v.device())?;
            }
        }
        check_device("out", dev, out.device())?;
        check_out("out", out.layout(), &shape.out_shape())?;
        if shape.num_tokens == 0 || shape.hidden == 0 {
            return Ok(());
        }
        let (in_size, out_size) = (
            std::mem::size_of::<T>() as u64,
            std::mem::size_of::<O>() as u64,
        );
        let x_addr = inputs.x.address();
        let out_addr = out.address();
        let ldx_bytes = row_stride(inputs.x.layout()) * in_size;
        let h = shape.hidden as u64;
        // 16-byte input accesses when every row allows them (and the outputs align), else one
        // column per access.
        let wide = 16 / in_size;
        let cols = if access_bytes(&[x_addr, ldx_bytes, h * in_size]) == 16
            && h % wide == 0
            && out_addr % (wide * out_size) == 0
        {
            wide
        } else {
            1
        };
        let opts = ReduceOptions {
            weights: inputs.topk_weights.is_some(),
            x_sf: inputs.x_sf.is_some(),
            sf: inputs.sf.is_some(),
        };
        let f = dev.function(&kernel_spec(
            T::DTYPE,
            fmt,
            cols as usize,
            shape.num_topk,
            opts,
        ))?;
        let ldx = ldx_bytes / (cols * in_size);
        let n = h / cols;
        let addr_or_null =
            |v: &Option<DeviceView<'_, f32>>| v.as_ref().map_or(0u64, |v| v.address());
        let (xsf_addr, w_addr, sf_addr) = (
            addr_or_null(&inputs.x_sf),
            addr_or_null(&inputs.topk_weights),
            addr_or_null(&inputs.sf),
        );
        let ld_xsf = inputs.x_sf.as_ref().map_or(0u64, |v| v.strides()[0] as u64);
        let ld_w = inputs
            .topk_weights
            .as_ref()
            .map_or(0u64, |v| row_stride(v.layout()));
        let ttp = inputs.token_topk_to_pos.address();
        let ld_ttp = row_stride(inputs.token_topk_to_pos.layout());
        let (t, m) = (shape.num_tokens as u64, shape.num_rows as u64);
        // The L2 prefetch distance: a few tokens per SM ahead (cuda/reduce_fused.cu).
        let sm_count = dev.props().sm_count as usize;
        let ahead = (sm_count * PREFETCH_TOKENS_PER_SM) as u64;
        // Tokens [0, head) are whole tasks, the rest TAIL_SPLIT chunks of `chunk = n /
        // TAIL_SPLIT` vectors each (no split unless TAIL_SPLIT divides n: the kernel's tail
        // tasks take the chunk length from the constant bank).
        let split = n % TAIL_SPLIT as u64 == 0;
        let tail = if split {
            shape.num_tokens.min(TAIL_TOKENS_PER_SM * sm_count)
        } else {
            0
        };
        let head = (shape.num_tokens - tail) as u64;
        let chunk = n / TAIL_SPLIT as u64;
        let tasks = shape.num_tokens - tail + TAIL_SPLIT * tail;
        // One warp per task, at most 2^30 blocks per launch (the kernel has no grid-stride loop).
        let per_launch = (1usize << 30) * TOKENS_PER_BLOCK;
        for task0 in (0..tasks).step_by(per_launch) {
            let task0_arg = task0 as u64;
            let mut l = dev.stream().launch_builder(&f);
            l.arg(&out_addr)
                .arg(&x_addr)
                .arg(&ldx)
                .arg(&xsf_addr)
                .arg(&ld_xsf)
                .arg(&w_addr)
                .arg(&ld_w)
                .arg(&ttp)
                .arg(&ld_ttp)
                .arg(&sf_addr)
                .arg(&t)
                .arg(&m)
                .arg(&n)
                .arg(&ahead)
                .arg(&head)
                .arg(&chunk)
                .arg(&task0_arg);
            // SAFETY: validation bounds every access (the L2 prefetches too: token rows < T; a
            // task's token is < T and its columns lie in [0, n): TAIL_SPLIT · chunk = n when
            // head < T): x rows p < M only (other
            // entries are skipped by the kernel), x_sf[p] for the same p, weights and the map
            // (T, K), sf[0], out (T, H) contiguous; absent tensors (null) are never read (their
            // specialisation flag is 0); the access width divides every address, pitch and row
            // length; the buffers outlive the stream-ordered launch.
            unsafe {
                l.launch(config(
                    blocks((tasks - task0).min(per_launch), TOKENS_PER_BLOCK),
                    32 * TOKENS_PER_BLOCK as u32,
                ))
            }
            .ctx("launching tk_reduce_fused")?;
        }
        Ok(())
    }
}
