//! `swiglu_backward_and_per_token_cast` (`spec/quant.md` §3.11): the SwiGLU backward from an
//! FP8 input, with the forward output, the input gradient in bf16 and as a per-token FP8 cast,
//! and the routing weight's gradient.
//!
//! # What it computes
//!
//! For each row `i`, with `p = pos_to_token_topk[i]` and `w = weight.flat[p]` if `p >= 0`,
//! else `w = 0`; for each `j < H`:
//!
//! 1. `X = fl(dec8(xq[i, j]) · xs[i, j/npc])`, `Y = fl(dec8(xq[i, H+j]) · xs[i, (H+j)/npc])`;
//! 2. clamp (if `C`): `cx = X > C` (then `X = C`); `Y = C` if `Y > C`, `−C` if `Y < −C`,
//!    `cy` = either;
//! 3. `g = fp32(grad_out[i, j])`;
//! 4. `t = fl(1 + expf(−X))`, `s = fl(1 / t)`;
//! 5. `act = fl(fl(X / t) · Y)`;
//! 6. `gws = fl(fl(g · w) · s)`;
//! 7. `dX = +0` if `cx`, else `fl(fl(gws · Y) · fma(X, fl(1 − s), 1))`: **one fused
//!    multiply-add** (a single rounding); nothing else is contracted (Appendix A.2);
//! 8. `dY = +0` if `cy`, else `fl(gws · X)`;
//! 9. `out[i, j] = bf16(fl(act · w))`, `x_grad[i, j] = bf16(dX)`, `x_grad[i, H+j] = bf16(dY)`.
//!
//! Then `x_grad_fp8` is the per-token e4m3 cast (`ε = 1e-4`, `round_sf` as given) of the fp32
//! row `[dX_0 .. dX_{H−1}, dY_0 .. dY_{H−1}]` in groups of `npc` (groups never straddle the
//! halves since `H % npc == 0`), scales fp32 layout A; and
//! `weight_grad.flat[p] = Σ_j g_j · act_j` for each row with `p >= 0`, every other entry 0.
//!
//! | argument | dtype | shape | notes |
//! |---|---|---|---|
//! | `x` (data) | e4m3 | `(N, 2H)`, `H % npc == 0` | unit column stride, any row stride |
//! | `x_sf` | fp32 | `(N, 2H/npc)` | dequantization multipliers of `(1, npc)` groups; unit column stride |
//! | `grad_out` | bf16 | `(N, H)` | unit column stride |
//! | `weight` | fp32 | `(T, k)` | |
//! | `pos_to_token_topk` | int32 | `(N,)` | `p >= 0`: row of routing slot `p` (`< T·k`); negative: padding (`w = 0`) |
//! | `token_topk_to_pos` | int32 | `(T, k)` | the inverse map: a row `< N`, or `−1` |
//! | `out` | bf16 | `(N, H)` | |
//! | `x_grad_fp8`, `x_grad_fp8_sf` | e4m3, fp32 | `(N, 2H)`, `(N, 2H/npc)` | layout A |
//! | `x_grad` | bf16 | `(N, 2H)` | |
//! | `weight_grad` | fp32 | `(T, k)` | |
//!
//! # Preconditions ([`validate`])
//!
//! * `num_per_channels` ∈ {32, 128}; `2H % (2·npc) == 0`, i.e. `H % npc == 0`.
//! * `x` e4m3 `(N, 2H)`; `x_sf` `(N, 2H/npc)`; `grad_out` `(N, H)`; `weight` and
//!   `token_topk_to_pos` the same `(T, k)`; `pos_to_token_topk` `(N,)`.
//! * The two maps are consistent inverses: every `p = pos_to_token_topk[i] >= 0` has
//!   `p < T·k` and `token_topk_to_pos.flat[p] == i`; every `token_topk_to_pos` entry is `−1`
//!   or a row `r < N` with `pos_to_token_topk[r]` pointing back at it. (Upstream assumes this;
//!   it makes `weight_grad` well defined: no two rows write one entry, and the entries no row
//!   writes are exactly the `−1` ones, which upstream zeroes.)
//! * `swiglu_clamp_value` finite and `>= 0`.
//!
//! # Deviations from upstream (documented choices)
//!
//! * **`weight_grad` is fully defined**: thanks to the consistency check every entry is either
//!   written or a `−1` entry (zeroed, as upstream does). The sum `Σ g·act` is evaluated here
//!   in f64 (each product exact) and rounded once; upstream's order is unspecified (per-thread FMAs and a
//!   tree), so it is compared with the spec's tolerance (`atol = rtol = 1e-4`), the only
//!   output not compared bit for bit.
//! * The maps are validated (upstream trusts them); `x`, `x_sf`, `grad_out` may have any row
//!   stride (upstream: contiguous).
//! * NaN / inf inputs are unsupported (§5 item 6).

use tk_core::{HostView, Layout, Result, TkError};

use crate::plan::{require_multiple, CastPlan};
use crate::scale::ScaleLayout;
use crate::swiglu::{check_clamp_value, check_vector};
use crate::types::{check_matrix, QuantDataView};
use half::bf16;

/// The group widths `npc` the backward accepts.
pub const NUM_PER_CHANNELS: [usize; 2] = [32, 128];

/// The tensor arguments of the op.
#[derive(Debug, Clone)]
pub struct SwigluBackwardInputs<'a> {
    /// The FP8 input data `(N, 2H)`, e4m3.
    pub x: QuantDataView<'a>,
    /// Its fp32 scales `(N, 2H/npc)` (dequantization multipliers, row-major).
    pub x_sf: HostView<'a, f32>,
    /// `(N, H)` bf16.
    pub grad_out: HostView<'a, bf16>,
    /// `(T, k)` fp32 routing weights.
    pub weight: HostView<'a, f32>,
    /// `(N,)` int32: the routing slot of each row, negative for padding rows.
    pub pos_to_token_topk: HostView<'a, i32>,
    /// `(T, k)` int32: the row of each routing slot, or −1.
    pub token_topk_to_pos: HostView<'a, i32>,
}

/// The scalar parameters of the op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwigluBackwardParams {
    /// `npc`: 32 or 128; both the input scales and `x_grad_fp8`'s scales cover `(1, npc)`.
    pub num_per_channels: usize,
    /// Power-of-two scales for `x_grad_fp8`.
    pub round_sf: bool,
    /// Optional clamp `C` (must match the forward's).
    pub swiglu_clamp_value: Option<f32>,
}

impl SwigluBackwardParams {
    /// Bundles the parameters.
    pub const fn new(
        num_per_channels: usize,
        round_sf: bool,
        swiglu_clamp_value: Option<f32>,
    ) -> Self {
        Self {
            num_per_channels,
            round_sf,
            swiglu_clamp_value,
        }
    }
}

/// The validated geometry of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwigluBackwardPlan {
    /// Rows `N`.
    pub n: usize,
    /// `H` (the input has `2H` columns).
    pub h: usize,
    /// `(T, k)` of the routing tensors.
    pub topk_shape: (usize, usize),
    /// The cast of the `(N, 2H)` gradient: block `(1, npc)`, layout A (also the input scales'
    /// geometry).
    pub cast: CastPlan,
}

/// Validates a call (see the [module docs](self) for every rule).
///
/// Errors, naming the argument: `x` ([`TkError::Dtype`]: not e4m3; [`TkError::Shape`]: rank,
/// `2H % (2·npc) != 0`; [`TkError::Stride`]; [`TkError::Empty`]), `x_sf`, `grad_out`,
/// `weight`, `token_topk_to_pos`, `pos_to_token_topk` ([`TkError::Shape`]; the maps also
/// [`TkError::Param`] for out-of-range or inconsistent entries), `num_per_channels`,
/// `swiglu_clamp_value` ([`TkError::Param`]).
pub fn validate(
    inputs: &SwigluBackwardInputs<'_>,
    params: &SwigluBackwardParams,
) -> Result<SwigluBackwardPlan> {
    if !matches!(inputs.x, QuantDataView::E4M3(_)) {
        return Err(TkError::Dtype {
            arg: "x",
            expected: "e4m3 (the SwiGLU backward reads FP8 input)".into(),
            got: inputs.x.dtype(),
        });
    }
    let (n, two_h) = inputs.x.validate("x")?;
    let plan = validate_dims(n, two_h, params)?;
    let (t, k) = check_shapes(
        &plan,
        inputs.x_sf.layout(),
        inputs.grad_out.layout(),
        inputs.weight.layout(),
        inputs.token_topk_to_pos.layout(),
    )?;
    check_vector("pos_to_token_topk", &inputs.pos_to_token_topk, n)?;
    check_maps(&inputs.pos_to_token_topk, &inputs.token_topk_to_pos, n, k)?;
    Ok(SwigluBackwardPlan {
        topk_shape: (t, k),
        ..plan
    })
}

/// Checks the shapes of `x_sf` (`(N, 2H/npc)`, unit column stride), `grad_out` (`(N, H)`,
/// unit column stride), `weight` (2-D `(T, k)`) and `token_topk_to_pos` (`(T, k)`) against
/// `plan`; returns `(T, k)`.
pub(crate) fn check_shapes(
    plan: &SwigluBackwardPlan,
    x_sf: &Layout,
    grad_out: &Layout,
    weight: &Layout,
    token_topk_to_pos: &Layout,
) -> Result<(usize, usize)> {
    let (n, h, nbk) = (plan.n, plan.h, plan.cast.grid.nbk());
    let (sr, sc) = check_matrix("x_sf", x_sf)?;
    if (sr, sc) != (n, nbk) {
        return Err(TkError::Shape {
            arg: "x_sf",
            expected: format!("(N, 2H/npc) = ({n}, {nbk}) fp32"),
            got: vec![sr, sc],
        });
    }
    let (gr, gc) = check_matrix("grad_out", grad_out)?;
    if (gr, gc) != (n, h) {
        return Err(TkError::Shape {
            arg: "grad_out",
            expected: format!("(N, H) = ({n}, {h}) bf16"),
            got: vec![gr, gc],
        });
    }
    let [t, k] = *weight.shape() else {
        return Err(TkError::Shape {
            arg: "weight",
            expected: "rank 2 (T, k) fp32".into(),
            got: weight.shape().to_vec(),
        });
    };
    if token_topk_to_pos.shape() != [t, k] {
        return Err(TkError::Shape {
            arg: "token_topk_to_pos",
            expected: format!("(T, k) = ({t}, {k}), the shape of weight"),
            got: token_topk_to_pos.shape().to_vec(),
        });
    }
    Ok((t, k))
}

/// The consistency of the two routing maps (see the module docs).
fn check_maps(
    pos_to_token_topk: &HostView<'_, i32>,
    token_topk_to_pos: &HostView<'_, i32>,
    n: usize,
    k: usize,
) -> Result<()> {
    let slots = token_topk_to_pos.shape()[0] * k;
    let slot = |p: usize| token_topk_to_pos.at(&[p / k, p % k]);
    for i in 0..n {
        let p = pos_to_token_topk.at(&[i]);
        if p < 0 {
            continue;
        }
        if p as usize >= slots {
            return Err(TkError::param(
                "pos_to_token_topk",
                format!("entry {i} is {p}, out of range for T·k = {slots} routing slots"),
            ));
        }
        if slot(p as usize) != i as i32 {
            return Err(TkError::param(
                "token_topk_to_pos",
                format!(
                    "row {i} has routing slot {p}, but token_topk_to_pos.flat[{p}] = {} (the \
                     maps must be inverses)",
                    slot(p as usize)
                ),
            ));
        }
    }
    for p in 0..slots {
        let r = slot(p);
        if r == -1 {
            continue;
        }
        if r < 0 || r as usize >= n || pos_to_token_topk.at(&[r as usize]) != p as i32 {
            return Err(TkError::param(
                "token_topk_to_pos",
                format!(
                    "entry {p} (flat) is {r}: must be -1 or a row < N = {n} whose \
                     pos_to_token_topk points back at {p}"
                ),
            ));
        }
    }
    Ok(())
}

/// The device-independent part of [`validate`], on `N` and the input width `2H`.
pub fn validate_dims(
    n: usize,
    two_h: usize,
    params: &SwigluBackwardParams,
) -> Result<SwigluBackwardPlan> {
    let npc = params.num_per_channels;
    if !NUM_PER_CHANNELS.contains(&npc) {
        return Err(TkError::param(
            "num_per_channels",
            format!("must be 32 or 128, got {npc}"),
        ));
    }
    require_multiple(
        "x",
        &[n, two_h],
        "2H",
        two_h,
        2 * npc,
        "H must be a multiple of num_per_channels so that no group straddles gate and value",
    )?;
    check_clamp_value(params.swiglu_clamp_value)?;
    Ok(SwigluBackwardPlan {
        n,
        h: two_h / 2,
        topk_shape: (0, 0),
        cast: CastPlan::new_arg(
            n,
            two_h,
            (1, npc),
            ScaleLayout::RowMajorF32,
            "num_per_channels",
        )?,
    })
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU op (feature `cuda`): `cuda/swiglu_backward_and_per_token_cast.cu`, bit-exact with
/// [`reference::swiglu_backward_and_per_token_cast_with_expf`](fn@crate::reference::swiglu_backward_and_per_token_cast_with_expf)
/// given CUDA's `expf` for `out`, `x_grad`, `x_grad_fp8` and its scales; `weight_grad` is an
/// fp32 sum in the kernel's order (per-thread FMA accumulation, then a tree), within the
/// spec's `atol = rtol = 1e-4`.
///
/// Kernel: one CTA of 1–4 warps per row (the most of 4, 3, 2, 1 whose lanes tile the row's
/// `H / 16` lane units exactly); each thread takes 16 columns of the gate and value halves
/// (16-byte e4m3 and bf16 loads) per chunk, so a group of `npc` columns is `npc / 16` adjacent
/// lanes (amax by warp shuffles); the row's
/// `Σ g·act` is reduced across the CTA. The next chunk's loads are issued before a chunk is
/// processed, and the two divisions run inline when the fragment's gates allow (the exact fast
/// path of CUDA's division, see `cuda/fused_io.cuh`). Every CTA also zeroes its share of the
/// `weight_grad` slots whose `token_topk_to_pos` is −1. No host synchronisation.
///
/// Device-side differences from [`validate`]: the maps' values are not checked (that needs a
/// host synchronisation). The kernel reads only in-range entries (`0 <= p < T·k`; an
/// out-of-range `p` gives `w = 0` and writes no `weight_grad`); with inconsistent maps,
/// `weight_grad` entries that no row writes and whose `token_topk_to_pos` is not −1 stay
/// unwritten.
#[cfg(feature = "cuda")]
mod gpu {
    use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
    use float8::F8E4M3;
    use half::bf16;
    use tk_core::error::DriverContext;
    use tk_core::{
        Device, DeviceTensor, DeviceView, DeviceViewMut, KernelSource, KernelSpec, Result,
    };

    use super::{check_shapes, validate_dims, SwigluBackwardParams, NUM_PER_CHANNELS};
    use crate::cast::{check_out_scales, check_same_device};
    use crate::device::{check_contiguous, DeviceQuantData, DeviceScales};
    use crate::swiglu::{all_aligned16, check_device_vector};
    use crate::types::{check_matrix, check_nonempty_k};

    static SOURCE: KernelSource = KernelSource {
        file: "swiglu_backward_and_per_token_cast.cu",
        entry: "tk_swiglu_backward_and_per_token_cast",
        code: include_str!("../cuda/swiglu_backward_and_per_token_cast.cu"),
        headers: &[
            (
                "tk/quant_scale.cuh",
                include_str!("../cuda/quant_scale.cuh"),
            ),
            ("tk/fused_io.cuh", include_str!("../cuda/fused_io.cuh")),
        ],
        needs_cuda_headers: true,
    };

    /// The tensor arguments of the GPU op ([`super::SwigluBackwardInputs`] on the device).
    #[derive(Debug, Clone)]
    pub struct DeviceSwigluBackwardInputs<'a> {
        /// e4m3 `(N, 2H)`, unit column stride, any row stride.
        pub x: DeviceView<'a, F8E4M3>,
        /// fp32 `(N, 2H/npc)` dequantization multipliers, unit column stride.
        pub x_sf: DeviceView<'a, f32>,
        /// bf16 `(N, H)`, unit column stride.
        pub grad_out: DeviceView<'a, bf16>,
        /// fp32 `(T, k)`, any strides.
        pub weight: DeviceView<'a, f32>,
        /// int32 `(N,)`: each row's routing slot, negative for padding rows.
        pub pos_to_token_topk: DeviceView<'a, i32>,
        /// int32 `(T, k)`: each slot's row, or −1.
        pub token_topk_to_pos: DeviceView<'a, i32>,
    }

    /// Where [`swiglu_backward_and_per_token_cast_into`] writes (all contiguous).
    #[derive(Debug)]
    pub struct DeviceSwigluBackwardOutputsMut<'a> {
        /// bf16 `(N, H)`.
        pub out: DeviceViewMut<'a, bf16>,
        /// e4m3 `(N, 2H)`.
        pub x_grad_fp8: DeviceViewMut<'a, F8E4M3>,
        /// fp32 layout-A scales of grid `(N, 2H/npc)`.
        pub x_grad_fp8_sf: &'a mut DeviceScales,
        /// bf16 `(N, 2H)`.
        pub x_grad: DeviceViewMut<'a, bf16>,
        /// fp32 `(T, k)`.
        pub weight_grad: DeviceViewMut<'a, f32>,
    }

    /// What the allocating GPU op returns (see [`super`] for the meanings).
    #[derive(Debug)]
    pub struct DeviceSwigluBackwardOutput {
        /// bf16 `(N, H)`.
        pub out: DeviceTensor<bf16>,
        /// e4m3 `(N, 2H)`.
        pub x_grad_fp8: DeviceQuantData,
        /// fp32 layout-A scales `(N, 2H/npc)`.
        pub x_grad_fp8_sf: DeviceScales,
        /// bf16 `(N, 2H)`.
        pub x_grad: DeviceTensor<bf16>,
        /// fp32 `(T, k)`.
        pub weight_grad: DeviceTensor<f32>,
    }

    /// The kernel arguments, field for field `Params` in the kernel.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    struct BwdArgs {
        x: u64,
        ldx: u64,
        xs: u64,
        xs_ld: u64,
        g: u64,
        ldg: u64,
        w: u64,
        w_s0: u64,
        w_s1: u64,
        k: u64,
        tk: u64,
        ptt: u64,
        ptt_s: u64,
        ttp: u64,
        ttp_s0: u64,
        ttp_s1: u64,
        out: u64,
        q: u64,
        qsf: u64,
        xg: u64,
        wg: u64,
        n: u64,
        h: u64,
        has_clamp: u32,
        clamp: f32,
    }

    // SAFETY: `BwdArgs` is `repr(C)` plain old data (23 × u64 then 2 × 4 bytes, no padding),
    // laid out exactly as the kernel's `Params`, which the kernel receives by value.
    unsafe impl DeviceRepr for BwdArgs {}

    /// The kernel specialisation for `npc`, `round_sf` and vector accesses.
    fn kernel_spec(npc: usize, round_sf: bool, vecio: bool, warps: u32) -> KernelSpec {
        KernelSpec::new(&SOURCE)
            .define("TK_NPC", npc)
            .define("TK_ROUND", round_sf as u8)
            .define("TK_VECIO", vecio as u8)
            .define("TK_WARPS", warps)
    }

    /// Columns per lane and chunk (the kernel's `COLS`).
    const COLS: usize = 16;

    /// Warps per CTA (one row per CTA): of 4, 3, 2, 1 the one that leaves the fewest idle lanes
    /// over the row's `H / 16` lane units, then one that gives the row at least two chunks (the
    /// next chunk's loads overlap this one's math), then the most warps. H = 2560 (160 units)
    /// takes 1 warp and 5 full chunks where 4 warps would leave 3 of 4 lanes idle in the second
    /// chunk (measured 26-28 % faster); 2048 takes 2, 3072 takes 3, 4096 and 6144 take 4, 7168
    /// takes 2.
    fn warps_for(h: usize) -> u32 {
        let units = h / COLS;
        let lanes = |w: u32| 32 * w as usize;
        let idle = |w: u32| units.div_ceil(lanes(w)) * lanes(w) - units;
        [4, 3, 2, 1]
            .into_iter()
            .min_by_key(|&w| (idle(w), units <= lanes(w)))
            .unwrap_or(4)
    }

    /// The specialisations the tests and benchmarks launch.
    pub(crate) fn registered_kernels() -> Vec<KernelSpec> {
        let mut v = Vec::new();
        for npc in NUM_PER_CHANNELS {
            for round in [false, true] {
                for warps in 1..=4 {
                    v.push(kernel_spec(npc, round, true, warps));
                }
            }
        }
        v
    }

    /// `swiglu_backward_and_per_token_cast` on the GPU into caller-provided outputs.
    ///
    /// Errors: those of [`super::validate`] on the shapes (not the maps' values, see the
    /// module docs), each output's shape and contiguity, `x_grad_fp8_sf`'s layout (A) and grid,
    /// and [`tk_core::TkError::Placement`] for tensors on another device.
    pub fn swiglu_backward_and_per_token_cast_into(
        inputs: &DeviceSwigluBackwardInputs<'_>,
        params: &SwigluBackwardParams,
        outs: &mut DeviceSwigluBackwardOutputsMut<'_>,
    ) -> Result<()> {
        let dev: &Device = inputs.x.device();
        let (n, two_h) = check_matrix("x", inputs.x.layout())?;
        check_nonempty_k("x", inputs.x.layout(), two_h)?;
        let plan = validate_dims(n, two_h, params)?;
        let (h, npc) = (plan.h, params.num_per_channels);
        let mut a = BwdArgs {
            x: inputs.x.address(),
            ldx: inputs.x.strides()[0] as u64,
            n: n as u64,
            h: h as u64,
            ..BwdArgs::default()
        };
        let (t, k) = check_shapes(
            &plan,
            inputs.x_sf.layout(),
            inputs.grad_out.layout(),
            inputs.weight.layout(),
            inputs.token_topk_to_pos.layout(),
        )?;
        for (arg, d) in [
            ("x_sf", inputs.x_sf.device()),
            ("grad_out", inputs.grad_out.device()),
            ("weight", inputs.weight.device()),
            ("token_topk_to_pos", inputs.token_topk_to_pos.device()),
        ] {
            check_same_device(arg, dev, d)?;
        }
        (a.xs, a.xs_ld) = (inputs.x_sf.address(), inputs.x_sf.strides()[0] as u64);
        (a.g, a.ldg) = (
            inputs.grad_out.address(),
            inputs.grad_out.strides()[0] as u64,
        );
        let ws = inputs.weight.strides();
        (a.w, a.w_s0, a.w_s1) = (inputs.weight.address(), ws[0] as u64, ws[1] as u64);
        let ts = inputs.token_topk_to_pos.strides();
        (a.ttp, a.ttp_s0, a.ttp_s1) = (
            inputs.token_topk_to_pos.address(),
            ts[0] as u64,
            ts[1] as u64,
        );
        a.ptt_s = check_device_vector("pos_to_token_topk", &inputs.pos_to_token_topk, n, dev)?;
        a.ptt = inputs.pos_to_token_topk.address();
        (a.k, a.tk) = (k.max(1) as u64, (t * k) as u64);
        if let Some(c) = params.swiglu_clamp_value {
            (a.has_clamp, a.clamp) = (1, c);
        }
        check_contiguous("out", outs.out.layout(), &[n, h])?;
        check_same_device("out", dev, outs.out.device())?;
        a.out = outs.out.address();
        check_contiguous("x_grad_fp8", outs.x_grad_fp8.layout(), &[n, two_h])?;
        check_same_device("x_grad_fp8", dev, outs.x_grad_fp8.device())?;
        a.q = outs.x_grad_fp8.address();
        check_out_scales(outs.x_grad_fp8_sf, &plan.cast)?;
        check_same_device("x_grad_fp8_sf", dev, outs.x_grad_fp8_sf.device())?;
        a.qsf = outs.x_grad_fp8_sf.address();
        check_contiguous("x_grad", outs.x_grad.layout(), &[n, two_h])?;
        check_same_device("x_grad", dev, outs.x_grad.device())?;
        a.xg = outs.x_grad.address();
        check_contiguous("weight_grad", outs.weight_grad.layout(), &[t, k])?;
        check_same_device("weight_grad", dev, outs.weight_grad.device())?;
        a.wg = outs.weight_grad.address();
        let vecio = all_aligned16(&[a.x, a.ldx, a.g, a.ldg * 2, a.out, a.q, a.xg]);
        let slots = t * k;
        let warps = warps_for(plan.h);
        let threads = 32 * warps;
        let ctas = n
            .max(slots.div_ceil(threads as usize))
            .min(i32::MAX as usize);
        if ctas == 0 {
            return Ok(());
        }
        let f = dev.function(&kernel_spec(npc, params.round_sf, vecio, warps))?;
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&a);
        // SAFETY: x (N, 2H), x_sf (N, 2H/npc), grad_out (N, H) were validated with unit column
        // stride and their row strides passed; weight and token_topk_to_pos as (T, k) with
        // strides, pos_to_token_topk as (N,); map entries are bounds-checked in the kernel
        // (only 0 <= p < T·k is read or written); every output was checked contiguous with its
        // exact shape (scales: layout A of the planned grid), all on x's device. Vector
        // accesses only when every row start is 16-byte aligned. Buffers outlive the launch.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (ctas as u32, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .ctx("launching tk_swiglu_backward_and_per_token_cast")?;
        Ok(())
    }

    /// `swiglu_backward_and_per_token_cast` on the GPU, allocating the outputs.
    ///
    /// Errors: see [`swiglu_backward_and_per_token_cast_into`].
    pub fn swiglu_backward_and_per_token_cast(
        inputs: &DeviceSwigluBackwardInputs<'_>,
        params: &SwigluBackwardParams,
    ) -> Result<DeviceSwigluBackwardOutput> {
        let dev = inputs.x.device();
        let (n, two_h) = check_matrix("x", inputs.x.layout())?;
        let plan = validate_dims(n, two_h, params)?;
        let (t, k) = match *inputs.weight.shape() {
            [t, k] => (t, k),
            _ => (0, 0),
        };
        let mut out = dev.alloc::<bf16>(&[n, plan.h])?;
        let mut q = dev.alloc::<F8E4M3>(&[n, two_h])?;
        let mut sf = DeviceScales::alloc(dev, plan.cast.sf_layout, plan.cast.grid)?;
        let mut xg = dev.alloc::<bf16>(&[n, two_h])?;
        let mut wg = dev.alloc::<f32>(&[t, k])?;
        let mut outs = DeviceSwigluBackwardOutputsMut {
            out: out.view_mut(),
            x_grad_fp8: q.view_mut(),
            x_grad_fp8_sf: &mut sf,
            x_grad: xg.view_mut(),
            weight_grad: wg.view_mut(),
        };
        swiglu_backward_and_per_token_cast_into(inputs, params, &mut outs)?;
        drop(outs);
        Ok(DeviceSwigluBackwardOutput {
            out,
            x_grad_fp8: DeviceQuantData::E4M3(q),
            x_grad_fp8_sf: sf,
            x_grad: xg,
            weight_grad: wg,
        })
    }
}
