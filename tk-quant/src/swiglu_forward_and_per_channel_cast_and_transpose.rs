//! `swiglu_forward_and_per_channel_cast_and_transpose` (`spec/quant.md` §3.12): the SwiGLU
//! activation, rounded to bf16, then an FP8 e4m3 cast with one scale per column per `npt` rows,
//! the data written transposed (or not).
//!
//! # What it computes
//!
//! Input `x` is bf16 `(M, 2H)`: gate `l = x[r, j]`, value `v = x[r, H + j]`, `j < H`.
//!
//! 1. For each `(r, j)`: clamp (if `C`: `l = C` if `l > C`, `v` into `[−C, C]`, in fp32),
//!    `a = fl(fl(l / fl(1 + expf(−l))) · v)`, then **`A[r, j] = bf16(a)`** (RNE);
//! 2. for each column `j` and row block `b` of `npt` rows: `amax = max |A|`, `(sf, inv)` per
//!    §1.4 (e4m3, `ε = 1e-4`; powers of two with `round_sf`), `out_sf[b, j] = sf`;
//! 3. `enc8(fl(A[r, j] · inv))` written to `out[j, r]`, or `out[r, j]` with
//!    `without_transpose`.
//!
//! Steps 2–3 are exactly [`per_channel_cast_and_transpose`](fn@crate::reference::per_channel_cast_and_transpose)
//! of `A` (or its untransposed form), i.e. the generic cast with block `(npt, 1)`.
//!
//! | argument | dtype | shape | notes |
//! |---|---|---|---|
//! | `x` | bf16 | `(M, 2H)`, `M % 128 == 0`, `2H % 128 == 0` | unit column stride, any row stride |
//! | `out` | e4m3 | `(H, M)`, or `(M, H)` with `without_transpose` | contiguous |
//! | `out_sf` | fp32 | `(M/npt, H)` | layout A, never transposed |
//!
//! # Preconditions ([`validate`])
//!
//! * `x` bf16 (by type), `M % 128 == 0` (`M = 0` allowed), `2H % 128 == 0` (so `H % 64 == 0`,
//!   `H >= 64`).
//! * `num_per_tokens` ∈ {32, 128}; the format is e4m3.
//! * `swiglu_clamp_value` finite and `>= 0` ([`crate::swiglu::check_clamp_value`]).
//!
//! # Deviations from upstream (documented choices)
//!
//! * **The clamp is in fp32** (upstream's reference). Upstream's kernel compares the bf16
//!   input with `bf16(C)`; the two agree whenever `C` is exactly representable in bf16 (the
//!   tested 10.0 and 0.5). The GPU kernels of this crate must clamp in fp32, so any `C` works.
//! * Any row stride is accepted (upstream: contiguous).
//! * NaN / inf inputs are unsupported (§5 item 6).

use half::bf16;
use tk_core::{HostView, Result, TkError};

use crate::plan::{require_multiple, CastPlan};
use crate::scale::ScaleLayout;
use crate::swiglu::check_clamp_value;
use crate::types::PlainInput;

/// The row-block heights `npt` the op accepts.
pub const NUM_PER_TOKENS: [usize; 2] = [32, 128];

/// The scalar parameters of the op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwigluPerChannelParams {
    /// `npt`, rows per scale: 32 or 128.
    pub num_per_tokens: usize,
    /// Round each scale up to a power of two (§1.4).
    pub round_sf: bool,
    /// Write the data `(M, H)` instead of `(H, M)`.
    pub without_transpose: bool,
    /// Optional clamp `C` (a compile-time constant of upstream's kernel).
    pub swiglu_clamp_value: Option<f32>,
}

impl SwigluPerChannelParams {
    /// Bundles the parameters (transposed output, no clamp).
    pub const fn new(num_per_tokens: usize, round_sf: bool) -> Self {
        Self {
            num_per_tokens,
            round_sf,
            without_transpose: false,
            swiglu_clamp_value: None,
        }
    }
}

/// Validates a call and returns the plan of the cast of the `(M, H)` activation: block
/// `(npt, 1)`, grid `(M/npt, H)`, layout A.
///
/// Errors: `x` ([`TkError::Shape`]: rank, `M % 128 != 0`, `2H % 128 != 0`;
/// [`TkError::Stride`]; [`TkError::Empty`]), `num_per_tokens`, `swiglu_clamp_value`
/// ([`TkError::Param`]).
pub fn validate(x: &HostView<'_, bf16>, params: &SwigluPerChannelParams) -> Result<CastPlan> {
    let (m, two_h) = PlainInput::BF16(x.clone()).validate("x")?;
    validate_dims(m, two_h, params)
}

/// The device-independent part of [`validate`], on `M` and the input width `2H`.
pub fn validate_dims(m: usize, two_h: usize, params: &SwigluPerChannelParams) -> Result<CastPlan> {
    require_multiple(
        "x",
        &[m, two_h],
        "M",
        m,
        128,
        "the kernel tiles rows by 128",
    )?;
    require_multiple(
        "x",
        &[m, two_h],
        "2H",
        two_h,
        128,
        "the SwiGLU input is gate | value, each H wide with H % 64 == 0",
    )?;
    let npt = params.num_per_tokens;
    if !NUM_PER_TOKENS.contains(&npt) {
        return Err(TkError::param(
            "num_per_tokens",
            format!("must be 32 or 128, got {npt}"),
        ));
    }
    check_clamp_value(params.swiglu_clamp_value)?;
    CastPlan::new_arg(
        m,
        two_h / 2,
        (npt, 1),
        ScaleLayout::RowMajorF32,
        "num_per_tokens",
    )
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU op (feature `cuda`): `cuda/swiglu_forward_and_per_channel_cast_and_transpose.cu`,
/// the per-channel tile of [`crate::per_channel_cast_and_transpose`] in its bf16 form
/// (`pc::tile_kernel_bf16`: packed column maxima, skewed staging, the 2D grid of per-tile CTAs)
/// whose values are the bf16 activation, computed in registers from 16-byte loads of the gate
/// and value halves (clamp in fp32, CUDA's `expf`) and handed over as bf16 words; bit-exact
/// with
/// [`reference::swiglu_forward_and_per_channel_cast_and_transpose_with_expf`](fn@crate::reference::swiglu_forward_and_per_channel_cast_and_transpose_with_expf)
/// given CUDA's `expf`. One CTA per tile, its gate and value words loaded at the top of the
/// tile (the software pipeline of [`crate::per_channel_cast_and_transpose`] measured 10-25 %
/// slower here: it needs 80 registers, 3 CTAs per SM). No host synchronisation.
///
/// H200 (session 10): 8064x7168 plain 74.07-77.90 µs (89.2-92.1 % of the copy ceiling),
/// transposed 75.74-79.15 µs (87.8-90.1 %), 4096x2048 transposed 15.14-15.22 µs
/// (`tk-quant/PERF.md`).
#[cfg(feature = "cuda")]
mod gpu {
    use half::bf16;
    use tk_core::{DeviceView, KernelSource, KernelSpec, Result};

    use super::{validate_dims, SwigluPerChannelParams, NUM_PER_TOKENS};
    use crate::device::{DeviceQuantData, DeviceQuantDataViewMut, DeviceScales};
    use crate::per_channel_cast_and_transpose::{
        launch_per_channel, per_channel_spec, PerChannelArgs, PerChannelGrid, PER_CHANNEL_HEADERS,
    };
    use crate::plan::CastPlan;
    use crate::types::{check_matrix, check_nonempty_k, CastFormat};

    static SOURCE: KernelSource = KernelSource {
        file: "swiglu_forward_and_per_channel_cast_and_transpose.cu",
        entry: "tk_swiglu_forward_and_per_channel_cast_and_transpose",
        code: include_str!("../cuda/swiglu_forward_and_per_channel_cast_and_transpose.cu"),
        headers: PER_CHANNEL_HEADERS,
        needs_cuda_headers: true,
    };

    /// CTAs per SM for the launch bounds: 64 registers.
    const MIN_BLOCKS: usize = 4;

    /// This op's kernel specialisation (`vecio`: 16-byte accesses). The grid must stay
    /// `PerChannelGrid::Tiles`: the kernel's tile loop (`pc::tile_kernel_bf16`) reads its column
    /// tile off `blockIdx.x` and steps its row tiles by `gridDim.y` (the generic division and
    /// carry stepping of `pc::tile_kernel` measured 2.2-4.4 % slower on the H200, session 10).
    fn spec(npt: usize, round_sf: bool, transpose: bool, vecio: bool) -> KernelSpec {
        per_channel_spec(
            &SOURCE,
            npt,
            round_sf,
            transpose,
            vecio,
            MIN_BLOCKS,
            PerChannelGrid::Tiles,
        )
    }

    /// The specialisations the tests and benchmarks launch.
    pub(crate) fn registered_kernels() -> Vec<KernelSpec> {
        let mut v = Vec::new();
        for npt in NUM_PER_TOKENS {
            for round in [false, true] {
                for transpose in [false, true] {
                    v.push(spec(npt, round, transpose, true));
                }
            }
        }
        v
    }

    fn prepare(
        x: &DeviceView<'_, bf16>,
        params: &SwigluPerChannelParams,
    ) -> Result<(CastPlan, PerChannelArgs)> {
        let (m, two_h) = check_matrix("x", x.layout())?;
        check_nonempty_k("x", x.layout(), two_h)?;
        let plan = validate_dims(m, two_h, params)?;
        let mut args = PerChannelArgs {
            x: x.address(),
            ldx: x.strides()[0] as u64,
            n_in: m as u64,
            h: plan.k as u64,
            ..PerChannelArgs::default()
        };
        if let Some(c) = params.swiglu_clamp_value {
            // 2: a clamp C > 0 as 3 NaN-propagating min / max per pair (`tkq::swiglu_clamp_minmax`, exact
            // for C > 0) instead of 3 compares and 3 selects (1); 3: the same on the raw bf16 words
            // when C is a bf16 value (two elements per `min` / `max.NaN.bf16x2`, 1.5 HMNMX2 per
            // element instead of 3 FMNMX.NAN; the same clamped values, see the kernel): 48 fewer
            // ALU instructions per thread and 128x64 tile (~1190); H200 A/B (session 9, D2,
            // against mode 2): the clamp=0.5 rows 1.7-3.7 % faster (8064x7168 npt=128 transposed
            // 85.70 -> 82.62 µs), the unclamped rows unchanged.
            let mode = match c {
                c if c > 0.0 && crate::swiglu::is_bf16_value(c) => 3,
                c if c > 0.0 => 2,
                _ => 1,
            };
            (args.has_clamp, args.clamp) = (mode, c);
        }
        Ok((plan, args))
    }

    /// `swiglu_forward_and_per_channel_cast_and_transpose` on the GPU into caller-provided
    /// contiguous `out` (e4m3 `(H, M)`, or `(M, H)` with `without_transpose`) and `out_sf`
    /// (fp32 layout A `(M/npt, H)`); `x` is bf16 `(M, 2H)` with unit column stride.
    ///
    /// Errors: those of [`super::validate`], `out` / `out_sf` (format, shape, contiguity,
    /// layout, grid), [`tk_core::TkError::Placement`].
    pub fn swiglu_forward_and_per_channel_cast_and_transpose_into(
        x: &DeviceView<'_, bf16>,
        params: &SwigluPerChannelParams,
        out: &mut DeviceQuantDataViewMut<'_>,
        out_sf: &mut DeviceScales,
    ) -> Result<()> {
        let (plan, args) = prepare(x, params)?;
        let transpose = !params.without_transpose;
        launch_per_channel(
            x.device(),
            &plan,
            transpose,
            PerChannelGrid::Tiles,
            args,
            &[args.x, args.ldx * 2],
            (out, out_sf),
            |vec| spec(params.num_per_tokens, params.round_sf, transpose, vec),
        )
    }

    /// `swiglu_forward_and_per_channel_cast_and_transpose` on the GPU, allocating the outputs.
    ///
    /// Errors: see [`swiglu_forward_and_per_channel_cast_and_transpose_into`].
    pub fn swiglu_forward_and_per_channel_cast_and_transpose(
        x: &DeviceView<'_, bf16>,
        params: &SwigluPerChannelParams,
    ) -> Result<(DeviceQuantData, DeviceScales)> {
        let (plan, _) = prepare(x, params)?;
        let dev = x.device();
        let (rows, cols) = if params.without_transpose {
            (plan.m, plan.k)
        } else {
            (plan.k, plan.m)
        };
        let mut d = DeviceQuantData::alloc(dev, CastFormat::E4M3, rows, cols)?;
        let mut s = DeviceScales::alloc(dev, plan.sf_layout, plan.grid)?;
        swiglu_forward_and_per_channel_cast_and_transpose_into(
            x,
            params,
            &mut d.view_mut(),
            &mut s,
        )?;
        Ok((d, s))
    }
}

/// CPU model of the kernel's range check on raw gate words (`gates_in_range`).
#[cfg(test)]
mod raw_check_model {
    use half::bf16;

    /// `tkq::fast_div_ok` on the fp32 widening of a gate.
    fn fast_div_ok(l: f32) -> bool {
        l.abs() >= 2f32.powi(-40) && l.abs() <= 40.0
    }

    #[test]
    fn raw_range_check_is_fast_div_ok_for_every_bf16() {
        for bits in 0..=u16::MAX {
            let a = bits & 0x7FFF;
            let raw = (0x2B80..=0x4220).contains(&a);
            assert_eq!(
                raw,
                fast_div_ok(bf16::from_bits(bits).to_f32()),
                "bf16 bits {bits:#06x}"
            );
        }
    }
}

/// CPU models of the kernel's SwiGLU arithmetic shortcuts (`tk/fused_io.cuh` `one_plus_expf`,
/// the raw bf16 clamp of `has_clamp` 3).
#[cfg(test)]
mod activation_model {
    use half::bf16;

    /// `fma.rm.f32(a, b, c)` for products and sums exact in f64 (here: t in [0.25, 0.75],
    /// b = 252, c = 2^23 + 2^22 + 1, so a * b + c spans fewer than 53 bits).
    fn fma_rm(a: f32, b: f32, c: f32) -> f32 {
        let v = a as f64 * b as f64 + c as f64;
        let r = v as f32; // round to nearest
        if r as f64 > v {
            f32::from_bits(r.to_bits() - 1) // positive: the next float down
        } else {
            r
        }
    }

    /// The parts of CUDA's `expf(x)` before its `ex2.approx`: (f, bits of s = 2^n), s * ex2(f)
    /// being the result (`tkq::one_plus_expf`).
    fn expf_parts(x: f32) -> (f32, u32) {
        let t = x.mul_add(f32::from_bits(0x3BBB_989D), 0.5).clamp(0.0, 1.0);
        let j = fma_rm(t, f32::from_bits(0x437C_0000), f32::from_bits(0x4B40_0001));
        let f = j + f32::from_bits(0xCB40_007F);
        let f = x.mul_add(f32::from_bits(0x3FB8_AA3B), -f);
        let f = x.mul_add(f32::from_bits(0x32A5_7060), f);
        (f, j.to_bits() << 23)
    }

    /// One x: |f| < 2 (so ex2(f) is a normal float in [1/4, 4]) and s = 2^n with n in
    /// [-124, 125] (so s * ex2(f) is exact: no underflow, no overflow), and s * 2^f is expf(x).
    fn check(x: f32) {
        let (f, sb) = expf_parts(x);
        let s = f32::from_bits(sb);
        let e = (sb >> 23) as i32;
        assert!(f.abs() < 2.0, "x {x:e}: f {f}");
        assert!(
            sb >> 31 == 0 && (3..=252).contains(&e),
            "x {x:e}: s bits {sb:#x}"
        );
        let approx = s as f64 * (f as f64).exp2();
        let exact = (x as f64).exp();
        assert!(
            (approx / exact - 1.0).abs() < 1e-6,
            "x {x:e}: {approx} vs {exact}"
        );
    }

    #[test]
    fn one_plus_expf_model() {
        // Every bf16 gate in fast_div_ok's range, as x = -l.
        for bits in 0..=u16::MAX {
            let l = bf16::from_bits(bits).to_f32();
            if l.abs() >= 2f32.powi(-40) && l.abs() <= 40.0 {
                check(-l);
            }
        }
        // A clamped gate is any fp32 C in range: every 61st fp32 of [-40, 40] and the ends.
        let hi = 40f32.to_bits();
        for b in (0..=hi).step_by(61).chain([hi, 2f32.powi(-40).to_bits()]) {
            check(f32::from_bits(b));
            check(-f32::from_bits(b));
        }
    }

    /// min.NaN / max.NaN (bf16x2 or f32): NaN if either operand is NaN.
    fn min_nan(a: f32, b: f32) -> f32 {
        if a.is_nan() || b.is_nan() {
            f32::NAN
        } else {
            a.min(b)
        }
    }
    fn max_nan(a: f32, b: f32) -> f32 {
        if a.is_nan() || b.is_nan() {
            f32::NAN
        } else {
            a.max(b)
        }
    }

    /// has_clamp 3 (min / max on the raw bf16 words, then widened) gives the fp32 clamp of the
    /// spec (l = C if l > C; v = C if v > C, -C if v < -C; NaN stays NaN) for every bf16 input
    /// and every 9th positive finite bf16 C (plus 0.5, 7 and 10).
    #[test]
    fn raw_bf16_clamp_model() {
        let cs = (0x0001..0x7F80u16)
            .step_by(9)
            .map(|b| bf16::from_bits(b).to_f32())
            .chain([0.5, 7.0, 10.0]);
        for c in cs {
            let cb = bf16::from_f32(c).to_f32();
            assert_eq!(cb.to_bits(), c.to_bits());
            for bits in 0..=u16::MAX {
                let x = bf16::from_bits(bits).to_f32();
                let raw_l = bf16::from_f32(min_nan(x, cb)).to_f32();
                let raw_v = bf16::from_f32(min_nan(max_nan(x, -cb), cb)).to_f32();
                let spec_l = if x > c { c } else { x };
                let spec_v = if x > c {
                    c
                } else if x < -c {
                    -c
                } else {
                    x
                };
                for (raw, spec) in [(raw_l, spec_l), (raw_v, spec_v)] {
                    assert!(
                        raw.to_bits() == spec.to_bits() || (raw.is_nan() && spec.is_nan()),
                        "C {c:e} bits {bits:#06x}: {raw:e} vs {spec:e}"
                    );
                }
            }
        }
    }
}

/// CPU models of `pc::tile_kernel_bf16` (tk-quant/cuda/per_channel.cuh), the per-channel cast
/// tile of this op's kernel.
#[cfg(test)]
mod tile_bf16_model {
    use half::bf16;

    /// `SK_PITCH`, `SK_GROUP`: the skewed staging of the transposed output.
    const PITCH: usize = 144;
    const GROUP: usize = 8 * PITCH + 16;

    /// The staged byte of (column, row) of a 64-column x 128-row tile.
    fn staged(col: usize, row: usize) -> usize {
        col / 8 * GROUP + col % 8 * PITCH + row
    }

    /// The writers (lane (lx, ly) of warp w stores the word of rows 4 rg .. 4 rg + 3 of column
    /// 8 lx + s at step s, rg = 4 w + ly) and the readers (thread t, chunk ch = t + 256 h: 16
    /// bytes of column ch / 8 from row 16 (ch % 8), one LDS.128) agree with one layout inside
    /// the array, the writers' banks are distinct across each warp and step, and each reader
    /// chunk is 16-byte aligned with 8 consecutive threads reading 128 contiguous bytes.
    #[test]
    fn skewed_staging() {
        let size = 8 * GROUP;
        let mut owner = vec![None; size];
        for col in 0..64 {
            for row in 0..128 {
                let a = staged(col, row);
                assert!(a < size && owner[a].is_none(), "col {col} row {row}");
                owner[a] = Some((col, row));
            }
        }
        for w in 0..8 {
            for s in 0..8 {
                let mut banks = [false; 32];
                for lane in 0..32 {
                    let (lx, ly) = (lane % 8, lane / 8);
                    let rg = 4 * w + ly;
                    let a = lx * GROUP + 4 * rg + s * PITCH; // the kernel's st + s * SK_PITCH
                    assert_eq!(a, staged(8 * lx + s, 4 * rg));
                    assert_eq!(a % 4, 0);
                    let bank = a / 4 % 32;
                    assert!(!banks[bank], "warp {w} step {s}: bank {bank} twice");
                    banks[bank] = true;
                }
            }
        }
        for ch in 0..512 {
            let (col, part) = (ch / 8, ch % 8);
            let a = col / 8 * GROUP + col % 8 * PITCH + part * 16;
            assert_eq!(a % 16, 0);
            for u in 0..16 {
                assert_eq!(owner[a + u], Some((col, 16 * part + u)));
            }
            if part > 0 {
                assert_eq!(a, col / 8 * GROUP + col % 8 * PITCH + (part - 1) * 16 + 16);
            }
        }
    }

    /// max.bf16x2 lane: the other operand when one is NaN (a NaN when both are).
    fn max_bf16(a: bf16, b: bf16) -> bf16 {
        match (a.is_nan(), b.is_nan()) {
            (true, _) => b,
            (_, true) => a,
            _ => {
                if b.to_f32() > a.to_f32() {
                    b
                } else {
                    a
                }
            }
        }
    }

    /// The packed maxima (|x| of bf16 words folded from +0 by max.bf16x2, a NaN lane's |x| any
    /// NaN) widened are fmaxf's fold from +0 of the widened |x|, for groups of 16 values (a
    /// lane's column over a warp) drawn from every bf16 class (zeros of both signs, subnormals,
    /// normals, infinities, NaN).
    #[test]
    fn packed_maxima() {
        let special = [
            0x0000u16, 0x8000, 0x0001, 0x807F, 0x0080, 0x3F80, 0xBF80, 0x7F7F, 0x7F80, 0xFF80,
            0x7FC0, 0xFFC1,
        ];
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for g in 0..20_000 {
            let xs: Vec<bf16> = (0..16)
                .map(|_| {
                    let r = next();
                    let bits = if r % 3 == 0 {
                        special[(r >> 8) as usize % special.len()]
                    } else {
                        (r >> 16) as u16
                    };
                    bf16::from_bits(bits)
                })
                .collect();
            // All-NaN groups too.
            let xs: Vec<bf16> = if g % 97 == 0 {
                vec![bf16::from_bits(0x7FC0); 16]
            } else {
                xs
            };
            let packed = xs.iter().fold(bf16::ZERO, |m, x| {
                let abs = if x.is_nan() {
                    bf16::from_bits(0x7FFF)
                } else {
                    bf16::from_bits(x.to_bits() & 0x7FFF)
                };
                max_bf16(m, abs)
            });
            let packed = max_bf16(bf16::ZERO, packed).to_f32(); // the scale thread's fold from +0
            let fmax = xs.iter().fold(0.0f32, |m, x| {
                let a = x.to_f32().abs();
                if a.is_nan() {
                    m
                } else {
                    m.max(a)
                }
            });
            assert_eq!(packed.to_bits(), fmax.to_bits(), "group {g}: {xs:?}");
        }
    }
}
