//! What the three SwiGLU ops share (`spec/quant.md` §3.10–§3.12, Appendix A): the activation,
//! its clamp, and how the CPU references deal with CUDA's `expf`.
//!
//! # The activation
//!
//! A SwiGLU input row has `2H` columns: the left half is the gate `l`, the right half the
//! value `v`. For each `j < H`, with `l = fp32(x[r, j])` and `v = fp32(x[r, H + j])`:
//!
//! 1. optional clamp `C` ([`check_clamp_value`]): `l = C` if `l > C` (above only);
//!    `v = C` if `v > C`, `v = −C` if `v < −C`. Comparisons in fp32, so a NaN passes unchanged
//!    (NaN inputs are unsupported, §5 item 6);
//! 2. `a = fl(fl(l / fl(1 + expf(−l))) · v)`: three separately rounded operations, in this
//!    order, with no contraction into an FMA (Appendix A.2);
//! 3. then, op by op: `· w` as its own rounding (§3.10), or `bf16(a)` (§3.12).
//!
//! # `expf` and exactness
//!
//! Upstream's SwiGLU ops are bit-exact only because their reference also runs on the GPU: CUDA's
//! (non-fast-math) `expf` is not correctly rounded (it differs from the correctly rounded `exp`
//! for about 7% of fp32 inputs, Appendix A.1) and its exact algorithm ends in the hardware
//! approximation `ex2.approx`, which a CPU cannot reproduce bit for bit.
//!
//! The CPU references of this crate are therefore **parameterised by the `expf` they use**
//! (`&dyn Fn(f32) -> f32`): everything except that one function is reproduced exactly,
//! operation by operation, so given the GPU's `expf` values every output is bit-exact. The
//! plain entry points use [`reference::swiglu::cpu_expf`](fn@crate::reference::swiglu::cpu_expf),
//! the correctly rounded `exp` (through f64), documented as differing from CUDA's in the last
//! bit(s) for some inputs. The GPU tests check, in this order:
//!
//! 1. **the activation itself**, within a tight tolerance derived from `expf`'s 2-ulp error
//!    bound ([`reference::swiglu::activation_within_tolerance`](fn@crate::reference::swiglu::activation_within_tolerance)):
//!    the forward op's fp32 output format
//!    ([`SwigluOutFormat::F32`](crate::swiglu_forward_and_per_token_cast::SwigluOutFormat::F32))
//!    *is* the activation after the weight;
//! 2. **everything downstream, bit for bit**, either by feeding the GPU's activations to the
//!    op's downstream reference (e.g.
//!    [`reference::swiglu_forward_downstream`](fn@crate::reference::swiglu_forward_downstream)),
//!    or by running the whole reference with a table of the GPU's own `expf` values
//!    (e.g. [`reference::swiglu_backward_and_per_token_cast_with_expf`](fn@crate::reference::swiglu_backward_and_per_token_cast_with_expf)).
//!
//! No check is loosened: only the activation (or, in the backward, only `expf`) is compared
//! with a tolerance.

use tk_core::{HostView, Result, TkError};

/// Whether a clamp value `c` is exactly a bf16 value (a finite fp32 is exact in bf16 iff its
/// low 16 bits are zero): then the SwiGLU kernels with bf16 input can clamp the raw bf16 gate
/// and value words before widening them, with the same results.
pub(crate) fn is_bf16_value(c: f32) -> bool {
    c.to_bits() & 0xFFFF == 0
}

/// Validates an optional SwiGLU clamp value `C` (argument `swiglu_clamp_value`): finite and
/// not negative. Upstream does not check it; a NaN or negative `C` would make the clamp
/// meaningless (`v` would be forced to `C` whatever its value), so both are rejected here.
pub fn check_clamp_value(c: Option<f32>) -> Result<()> {
    match c {
        Some(c) if !(c.is_finite() && c >= 0.0) => Err(TkError::param(
            "swiglu_clamp_value",
            format!("must be finite and >= 0 (l is clamped to <= C, v to [-C, C]); got {c}"),
        )),
        _ => Ok(()),
    }
}

/// Checks that `view` (argument `arg`) is a 1-D int32 vector of length `n` (any stride).
pub(crate) fn check_vector(arg: &'static str, view: &HostView<'_, i32>, n: usize) -> Result<()> {
    if view.shape() != [n] {
        return Err(TkError::Shape {
            arg,
            expected: format!("({n},): one int32 entry per row of x"),
            got: view.shape().to_vec(),
        });
    }
    Ok(())
}

/// Checks that `view` (argument `arg`) is 2-D, and returns its `(rows, cols)`.
pub(crate) fn check_rank2<T: tk_core::Element>(
    arg: &'static str,
    view: &HostView<'_, T>,
    what: &str,
) -> Result<(usize, usize)> {
    match *view.shape() {
        [r, c] => Ok((r, c)),
        _ => Err(TkError::Shape {
            arg,
            expected: format!("rank 2 {what}"),
            got: view.shape().to_vec(),
        }),
    }
}

#[cfg(feature = "cuda")]
pub use gpu::device_expf;
#[cfg(feature = "cuda")]
pub(crate) use gpu::registered_kernels;
#[cfg(feature = "cuda")]
pub(crate) use gpu::{all_aligned16, check_device_rank2, check_device_vector};

/// Device-side checks the GPU SwiGLU ops (and the per-channel casts) share, and CUDA's `expf`
/// on the device for exact references ([`device_expf`]).
#[cfg(feature = "cuda")]
mod gpu {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    use tk_core::error::DriverContext;
    use tk_core::{Device, DeviceTensor, DeviceView, KernelSource, KernelSpec, Result, TkError};

    use crate::cast::check_same_device;
    use crate::device::check_contiguous;

    static SOURCE: KernelSource = KernelSource {
        file: "swiglu.cu",
        entry: "tk_swiglu_expf",
        code: include_str!("../cuda/swiglu.cu"),
        headers: &[],
        needs_cuda_headers: false,
    };

    /// The `expf` kernel (for compile checks and [`crate::prewarm`]).
    pub(crate) fn registered_kernels() -> Vec<KernelSpec> {
        vec![KernelSpec::new(&SOURCE)]
    }

    /// CUDA's `expf` of every element of the contiguous fp32 vector `x` `(n,)`, exactly as the
    /// SwiGLU kernels evaluate it (non-fast-math, no flush to zero). The SwiGLU tests give
    /// these values to the CPU references (parameterised by `expf`, see the
    /// [module docs](crate::swiglu)) so that every output can be checked bit for bit.
    ///
    /// Errors: `x` ([`TkError::Shape`] / [`TkError::Stride`]: not a contiguous `(n,)` vector).
    pub fn device_expf(x: &DeviceView<'_, f32>) -> Result<DeviceTensor<f32>> {
        let n = x.shape().first().copied().unwrap_or(0);
        check_contiguous("x", x.layout(), &[n])?;
        let dev = x.device();
        let mut out = dev.alloc::<f32>(&[n])?;
        if n == 0 {
            return Ok(out);
        }
        let f = dev.function(&KernelSpec::new(&SOURCE))?;
        let (xa, oa, n64) = (x.address(), out.view_mut().address(), n as u64);
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&xa).arg(&oa).arg(&n64);
        // SAFETY: x and out are contiguous (n,) fp32 on the same device (out allocated there);
        // the kernel reads x[i] and writes out[i] for i < n only. Both outlive the launch.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (n.div_ceil(256).min(65535) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .ctx("launching tk_swiglu_expf")?;
        Ok(out)
    }

    /// Checks that the device vector `view` (argument `arg`) is `(n,)` int32 on `dev` and
    /// returns its element stride.
    pub(crate) fn check_device_vector(
        arg: &'static str,
        view: &DeviceView<'_, i32>,
        n: usize,
        dev: &Device,
    ) -> Result<u64> {
        if view.shape() != [n] {
            return Err(TkError::Shape {
                arg,
                expected: format!("({n},): one int32 entry per row"),
                got: view.shape().to_vec(),
            });
        }
        check_same_device(arg, dev, view.device())?;
        Ok(view.strides()[0] as u64)
    }

    /// Checks that the device matrix `view` (argument `arg`) is 2-D on `dev` and returns its
    /// `(rows, cols)` and element strides.
    pub(crate) fn check_device_rank2<T: tk_core::Element>(
        arg: &'static str,
        view: &DeviceView<'_, T>,
        what: &str,
        dev: &Device,
    ) -> Result<((usize, usize), (u64, u64))> {
        let [r, c] = *view.shape() else {
            return Err(TkError::Shape {
                arg,
                expected: format!("rank 2 {what}"),
                got: view.shape().to_vec(),
            });
        };
        check_same_device(arg, dev, view.device())?;
        let s = view.strides();
        Ok(((r, c), (s[0] as u64, s[1] as u64)))
    }

    /// True if every value (device addresses and row pitches in bytes) is a multiple of 16,
    /// which lets a kernel use 16-byte vector accesses.
    pub(crate) fn all_aligned16(values: &[u64]) -> bool {
        values.iter().all(|v| v % 16 == 0)
    }
}
