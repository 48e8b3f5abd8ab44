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

use tk_core::{HostView, Result, TkError};

use crate::plan::{require_multiple, CastPlan};
use crate::scale::ScaleLayout;
use crate::swiglu::{check_clamp_value, check_rank2, check_vector};
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
    let h = plan.h;
    let (sr, sc) = check_matrix("x_sf", inputs.x_sf.layout())?;
    let nbk = plan.cast.grid.nbk();
    if (sr, sc) != (n, nbk) {
        return Err(TkError::Shape {
            arg: "x_sf",
            expected: format!("(N, 2H/npc) = ({n}, {nbk}) fp32"),
            got: vec![sr, sc],
        });
    }
    let (gr, gc) = check_matrix("grad_out", inputs.grad_out.layout())?;
    if (gr, gc) != (n, h) {
        return Err(TkError::Shape {
            arg: "grad_out",
            expected: format!("(N, H) = ({n}, {h}) bf16"),
            got: vec![gr, gc],
        });
    }
    let (t, k) = check_rank2("weight", &inputs.weight, "(T, k) fp32")?;
    if inputs.token_topk_to_pos.shape() != [t, k] {
        return Err(TkError::Shape {
            arg: "token_topk_to_pos",
            expected: format!("(T, k) = ({t}, {k}), the shape of weight"),
            got: inputs.token_topk_to_pos.shape().to_vec(),
        });
    }
    check_vector("pos_to_token_topk", &inputs.pos_to_token_topk, n)?;
    check_maps(&inputs.pos_to_token_topk, &inputs.token_topk_to_pos, n, k)?;
    Ok(SwigluBackwardPlan {
        topk_shape: (t, k),
        ..plan
    })
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
