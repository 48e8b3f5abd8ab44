//! `expand_to_fused` (`spec/moe.md` §4.12, §5.14, §5.17): copy every token's row to each of its
//! fused rows (token-major → expert-major).
//!
//! | argument | shape | dtype | notes |
//! |---|---|---|---|
//! | `x` | `(T, H)` | any element type (bit copy; tests use bf16) | unit last stride, any row stride |
//! | `token_topk_to_pos` | `(T, K)`, `K >= 1` | i32 | unit last stride; entries `-1` or in `0..M`, no two equal |
//! | `pos_to_expert` | `(M,)` | i32 | any stride; `< 0` marks a padding row |
//! | output `out` | `(M, H)` | as `x` | contiguous |
//!
//! **Semantics.** `out[p, :] = x[t, :]` (a bit copy) for every slot with
//! `p = token_topk_to_pos[t, k] >= 0`, and **every other row is zero** (all-zero bits). This is
//! upstream's reference. Upstream's kernel zero-fills only the rows with `pos_to_expert < 0`,
//! leaves a row with `pos_to_expert >= 0` that no slot targets uninitialised, and is not launched
//! at all for `T == 0` (so an `M > 0` output is entirely uninitialised): **we always zero-fill**
//! (§5.17), so the output is fully defined whatever the mapping. With mappings from
//! `get_fused_mapping` both agree.
//!
//! **Contract** (checked in full on the CPU before anything is written, each a
//! [`TkError::Param`] naming `token_topk_to_pos`):
//! * entries are `-1` or in `0..M` ([`crate::index`]; the GPU reads illegal entries as `-1`);
//! * no two slots target the same row (upstream: "positions must not collide"; on the GPU a
//!   collision leaves one of the colliding rows, unspecified which, never anything else);
//! * a targeted row must not be a padding row (`pos_to_expert[p] >= 0`): upstream's kernel
//!   would zero it and copy into it concurrently. (On the GPU the copy wins.)
//!
//! `pos_to_expert`'s values are otherwise unused: its length is `M`.

use tk_core::{Layout, Result, TkError};

use crate::checks::{check_matrix, check_rank};

/// The parameters of `expand_to_fused` (there are none besides the tensors).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpandToFusedParams;

/// The validated geometry of one `expand_to_fused` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpandShape {
    /// `T`.
    pub num_tokens: usize,
    /// `K`.
    pub num_topk: usize,
    /// Stored columns of `x` (`H`, or `H/2` bytes for packed FP4).
    pub columns: usize,
    /// `M`: rows of the fused buffer.
    pub num_rows: usize,
}

impl ExpandShape {
    /// The output shape `(M, columns)`.
    pub fn out_shape(&self) -> [usize; 2] {
        [self.num_rows, self.columns]
    }
}

/// Validates the three layouts shared by both expand ops.
pub(crate) fn validate_expand(
    x_arg: &'static str,
    x: &Layout,
    token_topk_to_pos: &Layout,
    pos_to_expert: &Layout,
) -> Result<ExpandShape> {
    let (t, h) = check_matrix(x_arg, x, "rank 2 (T, H)")?;
    let (t2, k) = check_matrix("token_topk_to_pos", token_topk_to_pos, "rank 2 (T, K)")?;
    if t2 != t {
        return Err(TkError::Shape {
            arg: "token_topk_to_pos",
            expected: format!("(T, K) with T = {t} ({x_arg}'s row count)"),
            got: token_topk_to_pos.shape().to_vec(),
        });
    }
    if k == 0 {
        return Err(TkError::Empty {
            arg: "token_topk_to_pos",
            shape: token_topk_to_pos.shape().to_vec(),
        });
    }
    check_rank("pos_to_expert", pos_to_expert, 1, "rank 1 (M,)")?;
    let m = pos_to_expert.shape()[0];
    if m > i32::MAX as usize {
        return Err(TkError::Shape {
            arg: "pos_to_expert",
            expected: format!("(M,) with M <= {} (positions are int32)", i32::MAX),
            got: vec![m],
        });
    }
    Ok(ExpandShape {
        num_tokens: t,
        num_topk: k,
        columns: h,
        num_rows: m,
    })
}

impl ExpandToFusedParams {
    /// Validates the layouts: `x (T, H)` and `token_topk_to_pos (T, K)` with unit last strides
    /// and the same `T`, `K >= 1`, `pos_to_expert (M,)` with `M <= i32::MAX`. The entries are
    /// checked by the op (module docs).
    ///
    /// Errors: [`TkError::Shape`] / [`TkError::Stride`] / [`TkError::Empty`] naming the tensor.
    pub fn validate(
        &self,
        x: &Layout,
        token_topk_to_pos: &Layout,
        pos_to_expert: &Layout,
    ) -> Result<ExpandShape> {
        validate_expand("x", x, token_topk_to_pos, pos_to_expert)
    }
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU op (feature `cuda`).
///
/// **Kernels** (`cuda/expand_to_fused.cu`): a one-thread-per-slot kernel records, for every
/// targeted row, one slot that targets it in an `(M,)` scratch (not initialised: each entry is
/// verified against `token_topk_to_pos` when read); then one warp per task either copies a
/// token's row to all its fused rows (read once, written `K` times, 16-byte accesses when the
/// rows allow) or (the first tasks, 32 rows each: their index latency overlaps the copies)
/// zeroes the rows that no slot targets. Every output row is written
/// exactly once (copied or zeroed), whatever the mapping, also when `T == 0`.
///
/// **Index contract on the GPU**: an entry of `token_topk_to_pos` that is not `-1` or in `0..M`
/// is read as `-1` (skipped); nothing is read or written out of bounds. Colliding slots leave one
/// of the copies (unspecified which); a targeted padding row holds the copy. No host sync.
/// GPU limit beyond the validation: `T·K <= i32::MAX` ([`tk_core::TkError::Shape`] naming
/// `token_topk_to_pos`).
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu {
    use cudarc::driver::PushKernelArg;
    use tk_core::error::DriverContext;
    use tk_core::{
        DeviceTensor, DeviceView, DeviceViewMut, Element, KernelSource, KernelSpec, Result,
    };

    use super::{ExpandShape, ExpandToFusedParams};
    use crate::checks::check_flat_fits_i32;
    use crate::gpu::{
        access_bytes, blocks, check_device, check_out, config, row_stride, HEADERS, THREADS,
    };

    const CODE: &str = include_str!("../cuda/expand_to_fused.cu");

    static SOURCE: KernelSource = KernelSource {
        file: "expand_to_fused.cu",
        entry: "tk_expand_to_fused",
        code: CODE,
        headers: HEADERS,
        needs_cuda_headers: false,
    };

    static MARK: KernelSource = KernelSource {
        file: "expand_to_fused.cu",
        entry: "tk_expand_mark",
        code: CODE,
        headers: HEADERS,
        needs_cuda_headers: false,
    };

    /// The copy kernel for `access` bytes per access (16, 8, 4, 2 or 1) and `num_topk` slots.
    pub fn kernel_spec(access: usize, num_topk: usize) -> KernelSpec {
        KernelSpec::new(&SOURCE)
            .define("TK_VEC", access)
            .define("TK_K", num_topk)
    }

    /// The kernel recording one targeting slot per fused row, for `num_topk` slots (shared with
    /// `expand_to_fused_with_sf`).
    pub fn mark_kernel_spec(num_topk: usize) -> KernelSpec {
        KernelSpec::new(&MARK)
            .define("TK_VEC", 1)
            .define("TK_K", num_topk)
    }

    /// Representative specialisations (the spec's top-k values, 16-byte rows), for compile
    /// checks and [`crate::prewarm`].
    pub fn registered_kernels() -> Vec<KernelSpec> {
        [2, 6, 8, 9]
            .into_iter()
            .flat_map(|k| [kernel_spec(16, k), mark_kernel_spec(k)])
            .collect()
    }

    /// Enqueues the slot map of the targeted rows: a new `(M,)` u32 tensor (as i32) in which
    /// every row that a legal slot targets holds the flat index `t·K + k` of one such slot; the
    /// other entries are left uninitialised (the kernels verify each entry against
    /// `token_topk_to_pos`, so no zero fill is needed).
    pub(crate) fn mark_rows(
        token_topk_to_pos: &DeviceView<'_, i32>,
        shape: &ExpandShape,
    ) -> Result<DeviceTensor<i32>> {
        check_flat_fits_i32("token_topk_to_pos", shape.num_tokens, shape.num_topk)?;
        let dev = token_topk_to_pos.device();
        let mut src = dev.alloc::<i32>(&[shape.num_rows])?;
        let slots = shape.num_tokens * shape.num_topk;
        if slots == 0 {
            return Ok(src);
        }
        let f = dev.function(&mark_kernel_spec(shape.num_topk))?;
        let src_addr = src.view_mut().address();
        let (ttp, ld) = (
            token_topk_to_pos.address(),
            row_stride(token_topk_to_pos.layout()),
        );
        let (t, m) = (shape.num_tokens as u64, shape.num_rows as u64);
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&src_addr).arg(&ttp).arg(&ld).arg(&t).arg(&m);
        // SAFETY: the kernel reads token_topk_to_pos[t, k] for t < T, k < K (the validated view)
        // and writes src[p] only for 0 <= p < M (the (M,) buffer just allocated).
        unsafe { l.launch(config(blocks(slots, THREADS as usize), THREADS)) }
            .ctx("launching tk_expand_mark")?;
        Ok(src)
    }

    /// GPU `expand_to_fused(x (T, H), token_topk_to_pos (T, K) i32, pos_to_expert (M,) i32)`
    /// into a new contiguous `(M, H)` tensor (see the [module docs](mod@crate::expand_to_fused)).
    ///
    /// Errors: those of [`ExpandToFusedParams::validate`]; [`tk_core::TkError::Placement`]
    /// when the tensors are on different devices.
    pub fn expand_to_fused<T: Element>(
        x: &DeviceView<'_, T>,
        token_topk_to_pos: &DeviceView<'_, i32>,
        pos_to_expert: &DeviceView<'_, i32>,
    ) -> Result<DeviceTensor<T>> {
        let shape = ExpandToFusedParams.validate(
            x.layout(),
            token_topk_to_pos.layout(),
            pos_to_expert.layout(),
        )?;
        let mut out = x.device().alloc::<T>(&shape.out_shape())?;
        expand_to_fused_into(x, token_topk_to_pos, pos_to_expert, &mut out.view_mut())?;
        Ok(out)
    }

    /// [`expand_to_fused`] into a caller-provided contiguous `out (M, H)`.
    ///
    /// Errors: as [`expand_to_fused`], and [`tk_core::TkError::Shape`] /
    /// [`tk_core::TkError::Stride`] naming `out`.
    pub fn expand_to_fused_into<T: Element>(
        x: &DeviceView<'_, T>,
        token_topk_to_pos: &DeviceView<'_, i32>,
        pos_to_expert: &DeviceView<'_, i32>,
        out: &mut DeviceViewMut<'_, T>,
    ) -> Result<()> {
        let shape = ExpandToFusedParams.validate(
            x.layout(),
            token_topk_to_pos.layout(),
            pos_to_expert.layout(),
        )?;
        let dev = x.device();
        check_device("token_topk_to_pos", dev, token_topk_to_pos.device())?;
        check_device("pos_to_expert", dev, pos_to_expert.device())?;
        check_device("out", dev, out.device())?;
        check_out("out", out.layout(), &shape.out_shape())?;
        let size = std::mem::size_of::<T>() as u64;
        let row_bytes = shape.columns as u64 * size;
        if shape.num_rows == 0 || row_bytes == 0 {
            return Ok(());
        }
        let src = mark_rows(token_topk_to_pos, &shape)?;
        let (x_addr, out_addr) = (x.address(), out.address());
        let ldx_bytes = row_stride(x.layout()) * size;
        let access = access_bytes(&[x_addr, out_addr, ldx_bytes, row_bytes]);
        let f = dev.function(&kernel_spec(access, shape.num_topk))?;
        let (ldx, n) = (ldx_bytes / access as u64, row_bytes / access as u64);
        let (ttp, ld_ttp) = (
            token_topk_to_pos.address(),
            row_stride(token_topk_to_pos.layout()),
        );
        let src_addr = src.view().address();
        let (t, m) = (shape.num_tokens as u64, shape.num_rows as u64);
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&out_addr)
            .arg(&x_addr)
            .arg(&ldx)
            .arg(&ttp)
            .arg(&ld_ttp)
            .arg(&src_addr)
            .arg(&t)
            .arg(&m)
            .arg(&n);
        // SAFETY: the validated views bound every access: x rows t < T of n accesses at pitch
        // ldx, token_topk_to_pos (T, K) (also at the slots named by src, checked < T·K in the
        // kernel), src (M,), and out rows p < M only (entries outside
        // 0..M are skipped by the kernel); the access width divides every address, pitch and row
        // length; all buffers outlive the stream-ordered launch (src is freed in stream order).
        unsafe {
            l.launch(config(
                blocks(shape.num_tokens + shape.num_rows.div_ceil(32), 8),
                THREADS,
            ))
        }
        .ctx("launching tk_expand_to_fused")?;
        Ok(())
    }
}
