//! The GPU launch shared by the block-scaled casts (feature `cuda`): `per_token_cast` (block
//! `(1, npc)`), `per_block_cast` (`(bm, bk)`) and `per_channel_cast` (`(npt, 1)`) are one
//! kernel, `cuda/cast.cu`, specialised on the input kind, the scale block, the format, the
//! scale layout, `round_sf` and the mode. It computes exactly
//! [`reference::cast`](fn@crate::reference::cast) (data and scales bit for bit, scale padding
//! written as zeros).
//!
//! Two paths:
//! * **tiled** (per-token blocks `(1, bk)`, and blocks `(bm, bk)` with `bm` a multiple of 8
//!   up to 128; `bk` = 1 or `VEC · 2^j`, `VEC` = 4 for fp32 input, 8 otherwise): a CTA of 8
//!   warps owns a tile of `bm` (32 / `FK` when `bm = 1`) rows × `LX · VEC · FK` columns held
//!   in registers, each warp `32/LX` row groups × `LX` lanes along K (`LX` = 32 for per-token
//!   blocks, 16–32 for taller ones so that a thread holds 4 to 16 rows), a lane `FK` adjacent
//!   fragments of a row (`FK` = 2 for per-token casts of plain input, else 1); block maxima
//!   come from warp shuffles and, across warps, shared memory. Warp blocks (`TK_WB`, per-block
//!   casts whose block fits a warp, e.g. 32×32): the 8 warps sit side by side along K instead,
//!   each holding whole blocks, and the maxima need no shared memory;
//! * **whole row** (one scale per row, `npc == K`): one CTA per row, the row held in
//!   registers (up to 32 fragments per thread: `K ≤ 131072` for fp32, `262144` for bf16).
//!
//! Accesses are 16-byte vectors (fp32, bf16 input; 8 / 4 bytes for e4m3 / e2m1 input) when the
//! rows are aligned and `K % VEC == 0`, element-wise otherwise. No host synchronisation.

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use tk_core::dtype::E5M6Bytes;
use tk_core::error::DriverContext;
use tk_core::{Device, DeviceView, DeviceViewMut, KernelSource, KernelSpec, Result, TkError};

pub(crate) use tk_core::validate::check_same_device;

use crate::device::{
    check_contiguous, DeviceCastInput, DevicePlainInput, DeviceQuantData, DeviceQuantDataViewMut,
    DeviceScaleView, DeviceScales,
};
use crate::plan::{CastMode, CastPlan};
use crate::scale::{ScaleGrid, ScaleLayout};
use crate::types::CastFormat;

static SOURCE: KernelSource = KernelSource {
    file: "cast.cu",
    entry: "tk_cast",
    code: include_str!("../cuda/cast.cu"),
    headers: &[
        ("tk/quant_io.cuh", include_str!("../cuda/quant_io.cuh")),
        (
            "tk/quant_scale.cuh",
            include_str!("../cuda/quant_scale.cuh"),
        ),
    ],
    needs_cuda_headers: true,
};

/// The kernel arguments, field for field `Params` in `cuda/cast.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct CastArgs {
    x: u64,
    ldx: u64,
    x_sf: u64,
    xsf_s0: u64,
    xsf_s1: u64,
    out: u64,
    sf: u64,
    sf_ld: u64,
    m: u64,
    k: u64,
    nbm: u64,
    nbk: u64,
    rows_aligned: u64,
}

// SAFETY: `CastArgs` is `repr(C)` plain old data (13 × u64, no padding), laid out exactly as
// the kernel's `Params`, which the kernel receives by value.
unsafe impl DeviceRepr for CastArgs {}

/// What a cast reads: the kernel's `TK_IN` (+ input scale kind and block for quantized input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum InputKind {
    /// fp32 values.
    F32,
    /// bf16 values.
    BF16,
    /// Quantized data with scales (`packed`: UE8M0 int32, else fp32) for `block`.
    Quantized {
        fmt: CastFormat,
        packed_sf: bool,
        block: (usize, usize),
    },
}

impl InputKind {
    fn of(x: &DeviceCastInput<'_>) -> Self {
        match x {
            DeviceCastInput::Plain(p) => match p.dtype() {
                tk_core::DType::F32 => InputKind::F32,
                _ => InputKind::BF16,
            },
            DeviceCastInput::Quantized(q) => InputKind::Quantized {
                fmt: q.data.format(),
                packed_sf: matches!(q.sf, DeviceScaleView::Packed(_)),
                block: q.block,
            },
        }
    }

    /// The kernel's `TK_IN`.
    fn code(self) -> u8 {
        match self {
            InputKind::F32 => 0,
            InputKind::BF16 => 1,
            InputKind::Quantized {
                fmt: CastFormat::E4M3,
                ..
            } => 2,
            InputKind::Quantized { .. } => 3,
        }
    }

    /// Logical elements per thread fragment.
    fn vec(self) -> usize {
        if self == InputKind::F32 {
            4
        } else {
            8
        }
    }

    /// Bits per logical element of the input storage.
    fn bits(self) -> usize {
        match self.code() {
            0 => 32,
            1 => 16,
            2 => 8,
            _ => 4,
        }
    }
}

/// The target format of a cast: FP8 / FP4 (`TK_FMT` 0, 1) or packed E5M6 (2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Target {
    /// e4m3 or e2m1 with the given block.
    Fp(CastFormat),
    /// E5M6, one scale per row (whole-row path).
    E5M6,
}

impl Target {
    fn code(self) -> u8 {
        match self {
            Target::Fp(CastFormat::E4M3) => 0,
            Target::Fp(CastFormat::E2M1) => 1,
            Target::E5M6 => 2,
        }
    }
}

/// One specialisation of `cuda/cast.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CastKernel {
    pub input: InputKind,
    /// The output scale block; `bk == 0` selects the whole-row path.
    pub block: (usize, usize),
    pub target: Target,
    pub sf_layout: ScaleLayout,
    pub round_sf: bool,
    pub mode: CastMode,
    pub vecio: bool,
    /// Whole-row path: `(threads, fragments per thread)`.
    pub whole_row: Option<(usize, usize)>,
    /// `TK_IDX32`: every row, column, row stride and scale-grid extent of the call is below
    /// 2^31, so the kernel may index in 32 bits ([`fits_idx32`]).
    pub idx32: bool,
    /// `TK_WB`: a warp holds this many whole scale blocks side by side along K, 0 for none
    /// ([`CastKernel::with_warp_blocks`]).
    pub warp_blocks: usize,
}

impl CastKernel {
    /// `self` with `TK_IDX32` (32-bit row and column indexing) when the call's extents `fit`
    /// in 32 bits and it measured faster for this kernel on the H200 (tk-quant PERF.md, A/B in
    /// one run): quantized input (e4m3(128x128) -> e4m3 per token 47.0 -> 43.9 µs) and tiled
    /// e2m1 outputs (bf16 8001x7168 npc=128 45.6 -> 44.6 µs, fp32 83.7 -> 79.7 µs). e4m3 outputs
    /// and whole-row casts keep 64-bit indices (bf16 -> e4m3 npc=128 47.3 vs 48.4 µs, bf16 ->
    /// e2m1 npc=K 41.2 vs 44.9 µs).
    fn with_idx32(self, fit: bool) -> Self {
        let pays = matches!(self.input, InputKind::Quantized { .. })
            || (self.target == Target::Fp(CastFormat::E2M1) && self.whole_row.is_none());
        CastKernel {
            idx32: fit && pays,
            ..self
        }
    }

    /// `self` with `TK_WB` (whole blocks per warp) where `n` blocks side by side fit a warp:
    /// plain input cast to e2m1 ([`WARP_BLOCK_MAX_RPT`] says why e2m1 and not e4m3), `bm > 1`,
    /// `n · bk = lanes · vec` with a power-of-two number of lanes, and `bm` a multiple of the
    /// `32 / lanes` row groups with at most [`WARP_BLOCK_MAX_RPT`] rows per thread. `n` is 2
    /// where a block's row of codes is under a 32-byte sector and two blocks fit, else 1.
    ///
    /// Two blocks side by side (bf16 32x32: 8 lanes x 4 row groups x 8 rows instead of
    /// 4 x 8 x 4): with one 32x32 block a warp's store of a row was 4 lanes x 4 bytes, half a
    /// sector whose other half came from the next warp: the H200 profile (bf16 -> e2m1 32x32,
    /// 8001x7168) counted 2 L2 store sectors per output sector (16 % excess sectors), L2
    /// throughput 83 % at 60 % DRAM, and 44 % of the cycles with no eligible warp (4 rows of 16
    /// bytes in flight per thread). Two blocks make every store a whole sector and every load
    /// 128 contiguous bytes per row, with twice the bytes in flight per thread (8 rows; 32 raw
    /// words, [`PB_E2M1_MIN_BLOCKS`] caps them at 64 registers). H200 A/B (meas31): one block
    /// instead was 1.7 % slower over the per-block rows, 16.4 % on bf16 -> e2m1 32x32
    /// 8001x7168. fp32 32x32 (16 rows per thread) keeps one block.
    fn with_warp_blocks(self) -> Self {
        let (bm, bk) = self.block;
        let vec = self.vec();
        let e2m1 = self.target == Target::Fp(CastFormat::E2M1);
        let plain = matches!(self.input, InputKind::F32 | InputKind::BF16);
        let fits = |n: usize| {
            let lanes = n * bk / vec;
            bm > 1
                && bk > 1
                && bk % vec == 0
                && lanes.is_power_of_two()
                && lanes <= 32
                && bm % (32 / lanes) == 0
                && bm / (32 / lanes) <= WARP_BLOCK_MAX_RPT
        };
        // Bytes of one block row of e2m1 codes.
        let row_bytes = bk / 2;
        let n = if !(e2m1 && plain && self.whole_row.is_none()) {
            0
        } else if row_bytes < 32 && fits(2) {
            2
        } else if fits(1) {
            1
        } else {
            0
        };
        CastKernel {
            warp_blocks: n,
            ..self
        }
    }
}

/// The most rows per thread a warp-block tile (`TK_WB`) may take: 8 admits fp32 32x32 (8 rows
/// of 4 words) and bf16 32x32 (two blocks per warp: 8 rows of 4 words) and keeps 128x128 on the shared-memory tile.
///
/// A warp holds whole `(bm, bk)` blocks (`bk / vec` lanes along K, `bm / (32 / lanes)` rows per
/// thread) and the CTA's 8 warps sit side by side along K, so the block maximum is a shuffle
/// butterfly inside the warp and each lane computes the scale: no shared memory and no
/// `__syncthreads`. The shared-memory tile (8 warps stacked along M) meets behind two barriers
/// with 8 threads computing the scales while the CTA waits, and the e2m1 encode (ALU bound, ncu:
/// ALU pipe 70 %, 36 % of cycles with no eligible warp) of all 8 warps then runs in the same
/// phase. H200 A/B (8001x7168, meas20): the shared-memory tile instead is 3.2 % slower for bf16
/// -> e2m1 32x32 and 9.5 % for fp32 -> e2m1 32x32; a limit of 4 rows (fp32 32x32 on the
/// shared-memory tile) 9.4 % slower for fp32. e4m3 casts keep the shared-memory tile: warp
/// blocks were 5.5 % slower for bf16 -> e4m3 32x32 (13 % at 4001x2048) and only 2 % faster for
/// fp32 -> e4m3 32x32.
const WARP_BLOCK_MAX_RPT: usize = 8;

/// `TK_MINB` of per-block tiles of bf16 input to e2m1 with power-of-two scales holding 17..32
/// raw words per thread (128x128: 8 rows of 4 words): 4 caps them at 64 registers (ptxas
/// sm_90a: 64, no spills), 32 resident warps per SM instead of 24 at 3 (at most 80 registers):
/// the e2m1 encode is ALU-bound and the CTAs alternate between load waits and encode bursts, so
/// more resident CTAs give the scheduler more warps to overlap the bursts with (same bytes in
/// flight per warp). H200 A/B (8001x7168, meas20): 3 is 6.2 % slower for bf16 -> e2m1 128x128.
/// fp32 32x32 warp blocks (8 rows of 4 words) spill 8 bytes at 64 registers and keep 3.
const PB_E2M1_MIN_BLOCKS: usize = 4;

/// Whether the call's `M`, `K`, input row stride and scale grid (with its padded rows) all lie
/// below 2^31: then the kernel's row and column indices, tile indices and their sums fit in 32
/// bits (`TK_IDX32`; address products stay 64-bit).
fn fits_idx32(a: &CastArgs) -> bool {
    [a.m, a.k, a.ldx, a.nbm, a.nbk, a.rows_aligned]
        .iter()
        .all(|&v| v < 1 << 31)
}

/// `TK_MINB` of the tiled path for quantized input (A/B knob: 2 is the previous value). The
/// H200 profile of e2m1(32x32) -> e4m3 per token (ncu, 65.6 us) showed a latency-bound kernel:
/// 88 registers under the 128 that 2 CTAs allow, 25 % theoretical occupancy, 1.0 eligible warp
/// per scheduler, DRAM 30 %; a thread holds only 4 rows x 4-8 input bytes, so the bytes in
/// flight per SM are set by the resident warps. 4 CTAs (at most 64 registers)
/// would double the resident warps but spill (ptxas: 8-192 bytes); 3 CTAs (at most 80
/// registers, no spills up to 4 rows per thread) give 1.5 times the resident warps and loads in
/// flight.
const QUANT_MIN_BLOCKS: usize = 3;

/// Row tiles each CTA of a per-token tiled cast of quantized input walks (plain input: one). A
/// per-token tile is only 4 fragments per thread, and the kernel spent about as many
/// instructions on the tile's setup (block and thread indices, 64-bit column offsets, the masks,
/// the layout-C scale column address) as on a row's amax, scale and cast (SASS sm_90a, bf16 ->
/// e4m3 npc=128: ~150 of ~330 issued per tile before the first row's data); the column tile is
/// the kernel's outer loop, so the row loop keeps that work hoisted. On the H200 (2026-12-01,
/// meas16) 4 tiles per CTA made the casts of quantized input 3.7 % faster, but the plain-input
/// casts 3 % slower on average (bf16 npc=128 up to 16 %: 8001x7168 -> e4m3 48.9 vs 44.6 us),
/// which gain more from the scheduler's balancing of one-tile CTAs.
const QUANT_ROW_TILES: usize = 4;

/// Whole-row casts (one scale per row) pick a CTA width that divides the row's fragments
/// exactly when one gives 2..=8 fragments per thread (else the width for about 4 per thread,
/// the last fragment masked for some warps). At K = 7168 bf16 (896 fragments of 8) the old
/// width, 256 threads x 4, left the 4th fragment to half the warps: its registers held for
/// nothing (fewer resident CTAs) and its masks and addresses issued by every warp; 128 x 7 has
/// no masked fragment (H200, 2026-12-01: E5M6 bf16 and npc = K casts 1.6-1.8 % faster on
/// average, up to 13 %). Returns (threads per CTA, fragments per thread) of the whole-row path for a row of `frags`
/// fragments: the exact width where there is one, see above.
fn whole_row_shape(frags: usize) -> (usize, usize) {
    let exact = (5..=10)
        .map(|j| 1usize << j)
        .filter(|t| frags % t == 0 && (2..=8).contains(&(frags / t)))
        .min_by_key(|t| (frags / t).abs_diff(4) * 2 + usize::from(frags / t < 4));
    match exact {
        Some(t) => (t, frags / t),
        None => {
            let t = frags.div_ceil(4).next_power_of_two().clamp(32, 1024);
            (t, frags.div_ceil(t))
        }
    }
}

/// `TK_MINB` of per-token tiles of plain input with power-of-two scales: these kernels need
/// 47-56 registers at a cap of 64 (4-5 resident CTAs per SM); capped at 40 (6 CTAs, 48 warps)
/// ptxas fits every variant without spills (sm_90a: bf16 -> e4m3 / e2m1 and fp32 -> e4m3 /
/// e2m1 at npc 16..128, all modes; +1..5 static instructions), and the H200 measured them 1 %
/// faster on average than at 4 CTAs, 3-6 % on the e2m1 casts (2026-12-01). Unrounded scales
/// (IEEE divisions) keep the rule below: bf16 -> e2m1 with layout B spilled 8 bytes at 40.
const PT_MIN_BLOCKS: usize = 6;

/// Lanes of a warp along K on the tiled path for block `(bm, bk)` with `vec` elements per
/// fragment: 32 for per-token blocks; for taller blocks, as many as give each thread 4 to 8
/// rows (`bm / (8 warps · 32/LX)`), but at least a column block's worth (`bk / vec`).
fn lanes_k(bm: usize, bk: usize, vec: usize) -> usize {
    if bm == 1 {
        return 32;
    }
    let lk = if bk == 1 { 1 } else { bk / vec };
    let ly = (bm / 64).clamp(1, 32);
    (32 / ly).max(lk).min(32)
}

/// Logical elements per thread fragment for `input` cast to `target`.
fn vec_of(input: InputKind, target: Target) -> usize {
    if target == Target::E5M6 {
        8
    } else {
        input.vec()
    }
}

impl CastKernel {
    /// The kernel's defines.
    pub fn spec(&self) -> KernelSpec {
        let s = KernelSpec::new(&SOURCE)
            .define("TK_IN", self.input.code())
            .define("TK_BM", self.block.0)
            .define("TK_BK", self.block.1)
            .define("TK_FMT", self.target.code())
            .define(
                "TK_SF_OUT",
                match self.sf_layout {
                    ScaleLayout::RowMajorF32 => 0,
                    ScaleLayout::ColMajorF32 => 1,
                    ScaleLayout::PackedUe8m0 => 2,
                },
            )
            .define("TK_ROUND", self.round_sf as u8)
            .define(
                "TK_MODE",
                match self.mode {
                    CastMode::Cast => 0,
                    CastMode::SfOnly => 1,
                    CastMode::PrecomputedSf => 2,
                },
            )
            .define("TK_VECIO", self.vecio as u8)
            .define("TK_IDX32", self.idx32 as u8)
            .define("TK_WB", self.warp_blocks);
        let s = match self.input {
            InputKind::Quantized {
                packed_sf, block, ..
            } => s
                .define("TK_IN_SF", packed_sf as u8)
                .define("TK_IH", block.0)
                .define("TK_IW", block.1),
            _ => s,
        };
        match self.whole_row {
            Some((threads, nf)) => s.define("TK_THREADS", threads).define("TK_NF", nf),
            None => s
                .define("TK_LX", self.lx())
                .define("TK_FK", self.fk())
                .define("TK_MINB", self.min_blocks()),
        }
    }

    /// Row tiles a per-token CTA walks: [`QUANT_ROW_TILES`] for quantized input, else 1.
    fn row_tiles(&self) -> usize {
        if matches!(self.input, InputKind::Quantized { .. }) {
            QUANT_ROW_TILES
        } else {
            1
        }
    }

    /// The tiled path's minimum resident CTAs per SM (`TK_MINB`: 4 → at most 64 registers,
    /// 3 → 80, 2 → 128), from the raw input words a thread holds across its rows (ptxas,
    /// sm_90a: no spills with these). Plain input: at most 16 words (per-token tiles, 32×32
    /// blocks) → 4 (measured: 4 beats 3 per token; per-token tiles with power-of-two scales:
    /// [`PT_MIN_BLOCKS`]); the per-channel tile (32 words, but one
    /// scale computation per thread) → 4; up to 32 words → 3 (bf16 to e2m1 with power-of-two
    /// scales: [`PB_E2M1_MIN_BLOCKS`]); more → 2.
    /// Quantized input: [`QUANT_MIN_BLOCKS`] up to 4 rows per thread, else 2 (8 rows of e2m1
    /// input spill at 80 registers).
    fn min_blocks(&self) -> usize {
        let (bm, bk) = self.block;
        // Per-token tiles: 4 fragments (4 / FK rows of FK fragments).
        let rows = if bm == 1 { 4 } else { self.rows_per_thread() };
        if matches!(self.input, InputKind::Quantized { .. }) {
            return if rows <= 4 { QUANT_MIN_BLOCKS } else { 2 };
        }
        if bm == 1 && self.round_sf {
            return PT_MIN_BLOCKS;
        }
        let words = rows * self.vec() * self.input.bits() / 32;
        if words <= 16 || bk == 1 {
            4
        } else if words <= 32 {
            if self.input == InputKind::BF16
                && self.target == Target::Fp(CastFormat::E2M1)
                && self.round_sf
            {
                PB_E2M1_MIN_BLOCKS
            } else {
                3
            }
        } else {
            2
        }
    }

    /// Logical elements per thread fragment: 8 for an E5M6 cast (one packed group), else the
    /// input's.
    fn vec(&self) -> usize {
        vec_of(self.input, self.target)
    }

    /// Lanes along K on the tiled path (warp blocks: `warp_blocks` block columns per warp).
    fn lx(&self) -> usize {
        if self.warp_blocks > 0 {
            self.warp_blocks * self.block.1 / self.vec()
        } else {
            lanes_k(self.block.0, self.block.1, self.vec())
        }
    }

    /// Warps of the CTA along K on the tiled path: 8 for warp blocks, else 1 (warps along M).
    fn warps_k(&self) -> usize {
        if self.warp_blocks > 0 {
            8
        } else {
            1
        }
    }

    /// Rows per thread of a tile of taller blocks (`bm > 1`): `bm` over the row groups of the
    /// warps along M (`RPT` in the kernel).
    fn rows_per_thread(&self) -> usize {
        self.block.0 / ((8 / self.warps_k()) * (32 / self.lx()))
    }

    /// Adjacent fragments per thread along K on the tiled path (`TK_FK`): 2 for per-token
    /// casts of plain input whose group holds at least two fragments (half the per-row
    /// shuffles, scale computations and scale stores per value; half the rows per thread),
    /// else 1. Measured on the H200 (8001x7168 and 8001x16384): 2 makes bf16 -> e2m1 ~8 %
    /// faster and fp32 -> e4m3 reach 90.7 % of the copy ceiling, but bf16 -> e4m3 4-10 %
    /// slower, so bf16 -> e4m3 keeps 1.
    fn fk(&self) -> usize {
        let (bm, bk) = self.block;
        let eligible = match self.input {
            InputKind::F32 => true,
            InputKind::BF16 => self.target != Target::Fp(CastFormat::E4M3),
            InputKind::Quantized { .. } => false,
        };
        if bm == 1 && bk % (2 * self.vec()) == 0 && eligible && self.mode != CastMode::PrecomputedSf
        {
            2
        } else {
            1
        }
    }

    /// Chooses the path for `plan` (tiled if the block fits it, else whole row).
    fn choose(
        input: InputKind,
        plan: &CastPlan,
        target: Target,
        round_sf: bool,
        mode: CastMode,
        vecio: bool,
    ) -> Result<Self> {
        let vec = vec_of(input, target);
        let (bm, bk) = plan.block;
        let lx = lanes_k(bm, bk, vec);
        let tiled_bm = bm == 1 || (bm % (8 * (32 / lx)) == 0 && bm / (8 * (32 / lx)) <= 16);
        let tiled_bk = bk == 1 || (bk % vec == 0 && (lx * vec) % bk == 0);
        let mut kernel = Self {
            input,
            block: (bm, bk),
            target,
            sf_layout: plan.sf_layout,
            round_sf,
            mode,
            vecio,
            whole_row: None,
            idx32: false,
            warp_blocks: 0,
        }
        .with_warp_blocks();
        if kernel.warp_blocks > 0 {
            return Ok(kernel);
        }
        if tiled_bm && tiled_bk && !(bm == 1 && bk == 1) && target != Target::E5M6 {
            return Ok(kernel);
        }
        let plain = !matches!(input, InputKind::Quantized { .. });
        if bm == 1 && bk >= plan.k && plain && mode == CastMode::Cast {
            let (threads, nf) = whole_row_shape(plan.k.div_ceil(vec));
            if nf <= 32 {
                kernel.block = (1, 0);
                kernel.whole_row = Some((threads, nf));
                return Ok(kernel);
            }
            return Err(TkError::param(
                "num_per_channels",
                format!(
                    "a one-scale-per-row cast of K = {} columns exceeds the GPU kernel's limit \
                     of {} columns for this input type; use a group size of 128 or less",
                    plan.k,
                    32 * 1024 * vec
                ),
            ));
        }
        Err(TkError::param(
            "block_size",
            format!(
                "the GPU cast has no kernel for scale block ({bm}, {bk}) with this input and mode"
            ),
        ))
    }

    /// The launch shape for `plan`.
    fn config(&self, plan: &CastPlan) -> LaunchConfig {
        let big = i32::MAX as usize;
        match self.whole_row {
            Some((threads, _)) => LaunchConfig {
                grid_dim: (plan.m.min(big) as u32, 1, 1),
                block_dim: (threads as u32, 1, 1),
                shared_mem_bytes: 0,
            },
            None => {
                let tm = if self.block.0 == 1 {
                    32 / self.fk()
                } else {
                    self.block.0
                };
                let tk = self.warps_k() * self.lx() * self.vec() * self.fk();
                LaunchConfig {
                    // Per-token: x along column tiles, y along row tiles (a CTA walks up to
                    // QUANT_ROW_TILES of them with quantized input, else one); else the reverse.
                    grid_dim: if self.block.0 == 1 {
                        (
                            plan.k.div_ceil(tk).min(big) as u32,
                            plan.m.div_ceil(tm).div_ceil(self.row_tiles()).min(65535) as u32,
                            1,
                        )
                    } else {
                        (
                            plan.m.div_ceil(tm).min(big) as u32,
                            plan.k.div_ceil(tk).min(65535) as u32,
                            1,
                        )
                    },
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                }
            }
        }
    }
}

/// The specialisations the tests and benchmarks of this crate launch (for compile checks and
/// [`crate::prewarm`]): every input kind with the per-token, per-block and per-channel blocks
/// of the spec's grids in layout C (and A for per-channel), and the whole-row path.
pub(crate) fn registered_kernels() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    let inputs = [
        InputKind::F32,
        InputKind::BF16,
        InputKind::Quantized {
            fmt: CastFormat::E4M3,
            packed_sf: true,
            block: (128, 128),
        },
        InputKind::Quantized {
            fmt: CastFormat::E2M1,
            packed_sf: false,
            block: (1, 32),
        },
    ];
    for input in inputs {
        for fmt in [CastFormat::E4M3, CastFormat::E2M1] {
            for block in [(1, 32), (1, 128), (32, 32), (128, 128), (128, 1)] {
                // Per-channel blocks take plain input only (per_channel_cast).
                if block.1 == 1 && matches!(input, InputKind::Quantized { .. }) {
                    continue;
                }
                let (layout, round) = if block.1 == 1 {
                    (ScaleLayout::RowMajorF32, true)
                } else {
                    (ScaleLayout::PackedUe8m0, true)
                };
                v.push(
                    CastKernel {
                        input,
                        block,
                        target: Target::Fp(fmt),
                        sf_layout: layout,
                        round_sf: round,
                        mode: CastMode::Cast,
                        vecio: true,
                        whole_row: None,
                        idx32: false,
                        warp_blocks: 0,
                    }
                    .with_warp_blocks()
                    .with_idx32(true)
                    .spec(),
                );
            }
        }
    }
    for input in [InputKind::F32, InputKind::BF16] {
        for target in [Target::Fp(CastFormat::E4M3), Target::E5M6] {
            v.push(
                CastKernel {
                    input,
                    block: (1, 0),
                    target,
                    sf_layout: ScaleLayout::ColMajorF32,
                    round_sf: false,
                    mode: CastMode::Cast,
                    vecio: true,
                    // The benchmark's hidden size.
                    whole_row: Some(whole_row_shape(7168 / vec_of(input, target))),
                    idx32: false,
                    warp_blocks: 0,
                }
                .with_idx32(true)
                .spec(),
            );
        }
    }
    v
}

/// Where a cast writes: data and/or scales per mode, and the precomputed scales it reads.
pub(crate) struct CastOutputs<'o, 'a, 'b> {
    /// The data (modes cast and precomputed).
    pub out: Option<&'o mut DeviceQuantDataViewMut<'a>>,
    /// The scales (modes cast and sf-only).
    pub out_sf: Option<&'o mut DeviceScales>,
    /// The precomputed fp32 layout-A scales (mode precomputed).
    pub sf: Option<&'o DeviceView<'b, f32>>,
}

/// Checks caller-provided output scales against the plan; errors name `out_sf`.
pub(crate) fn check_out_scales(s: &DeviceScales, plan: &CastPlan) -> Result<()> {
    if s.layout() != plan.sf_layout || s.grid() != plan.grid {
        return Err(TkError::param(
            "out_sf",
            format!(
                "expected {:?} scales of grid ({}, {}), got {:?} of grid ({}, {})",
                plan.sf_layout,
                plan.grid.nbm(),
                plan.grid.nbk(),
                s.layout(),
                s.grid().nbm(),
                s.grid().nbk()
            ),
        ));
    }
    Ok(())
}

/// Checks precomputed scales: fp32 `(nbm, nbk)`, unit column stride; errors name `sf`.
fn check_precomputed(sf: &DeviceView<'_, f32>, grid: &ScaleGrid) -> Result<u64> {
    let expected = [grid.nbm(), grid.nbk()];
    if sf.shape() != expected {
        return Err(TkError::Shape {
            arg: "sf",
            expected: format!("{expected:?}: fp32 (nbm, nbk) in layout A"),
            got: sf.shape().to_vec(),
        });
    }
    let st = sf.strides();
    if grid.nbk() > 1 && grid.nbm() > 0 && st[1] != 1 {
        return Err(TkError::Stride {
            arg: "sf",
            expected: "layout A: unit column stride (any row stride)".into(),
            got: st.to_vec(),
        });
    }
    Ok(st[0] as u64)
}

/// Fills the input fields of `args` from `x` and returns whether its rows allow the vector
/// loads of `vec`-element fragments.
fn input_args(x: &DeviceCastInput<'_>, vec: usize, plan: &CastPlan, args: &mut CastArgs) -> bool {
    let input = InputKind::of(x);
    match x {
        DeviceCastInput::Plain(p) => {
            args.x = p.address();
            args.ldx = p.layout().strides()[0] as u64;
        }
        DeviceCastInput::Quantized(q) => {
            args.x = q.data.address();
            args.ldx = q.data.layout().strides()[0] as u64;
            args.x_sf = q.sf.address();
            (args.xsf_s0, args.xsf_s1) = q.sf.strides();
        }
    }
    // Fragment loads are min(fragment bytes, 16)-byte vectors.
    let load = ((vec * input.bits() / 8) as u64).min(16);
    let storage_bytes = (input.bits() / 8).max(1) as u64;
    plan.k % vec == 0 && args.x % load == 0 && (args.ldx * storage_bytes) % load == 0
}

/// The output-independent kernel arguments of `plan`.
fn plan_args(plan: &CastPlan) -> CastArgs {
    CastArgs {
        m: plan.m as u64,
        k: plan.k as u64,
        nbm: plan.grid.nbm() as u64,
        nbk: plan.grid.nbk() as u64,
        rows_aligned: plan.grid.rows_aligned() as u64,
        ..CastArgs::default()
    }
}

/// Checks the output scales and stores their address in `args`.
fn scale_args(
    dev: &Device,
    s: &mut DeviceScales,
    plan: &CastPlan,
    args: &mut CastArgs,
) -> Result<()> {
    check_out_scales(s, plan)?;
    check_same_device("out_sf", dev, s.device())?;
    args.sf = s.address();
    Ok(())
}

/// Validates the outputs against `plan` and `mode` and launches the cast of `x` (validated by
/// the op into `plan`).
pub(crate) fn launch(
    x: &DeviceCastInput<'_>,
    fmt: CastFormat,
    plan: &CastPlan,
    round_sf: bool,
    mode: CastMode,
    outs: CastOutputs<'_, '_, '_>,
) -> Result<()> {
    let dev = x.device();
    let mut args = plan_args(plan);
    let input = InputKind::of(x);
    let target = Target::Fp(fmt);
    let vec = vec_of(input, target);
    let mut aligned = input_args(x, vec, plan, &mut args);
    if mode != CastMode::SfOnly {
        let out = outs
            .out
            .ok_or_else(|| TkError::param("out", "missing data output"))?;
        out.check_output("out", fmt, plan.m, plan.k)?;
        check_same_device("out", dev, out.device())?;
        args.out = out.address();
        aligned &= args.out % (vec / fmt.values_per_byte()) as u64 == 0;
    }
    if mode == CastMode::PrecomputedSf {
        let sf = outs
            .sf
            .ok_or_else(|| TkError::param("sf", "missing precomputed scales"))?;
        args.sf_ld = check_precomputed(sf, &plan.grid)?;
        check_same_device("sf", dev, sf.device())?;
        args.sf = sf.address();
    } else {
        let s = outs
            .out_sf
            .ok_or_else(|| TkError::param("out_sf", "missing scale output"))?;
        scale_args(dev, s, plan, &mut args)?;
    }
    let kernel = CastKernel::choose(input, plan, target, round_sf, mode, aligned)?;
    enqueue(dev, &kernel, plan, &args)
}

/// Validates the outputs and launches the E5M6 cast of plain `x` (validated into `plan`, one
/// scale per row): packed bytes `(M, 3K/2)` into `out`, scales into `out_sf`.
pub(crate) fn launch_e5m6(
    x: &DevicePlainInput<'_>,
    plan: &CastPlan,
    round_sf: bool,
    out: &mut DeviceViewMut<'_, E5M6Bytes>,
    out_sf: &mut DeviceScales,
) -> Result<()> {
    let x = DeviceCastInput::Plain(x.clone());
    let dev = x.device();
    let mut args = plan_args(plan);
    let input = InputKind::of(&x);
    let mut aligned = input_args(&x, 8, plan, &mut args);
    check_contiguous("out", out.layout(), &[plan.m, plan.k / 2 * 3])?;
    check_same_device("out", dev, out.device())?;
    args.out = out.address();
    aligned &= args.out % 4 == 0;
    scale_args(dev, out_sf, plan, &mut args)?;
    let kernel = CastKernel::choose(input, plan, Target::E5M6, round_sf, CastMode::Cast, aligned)?;
    enqueue(dev, &kernel, plan, &args)
}

/// Launches `kernel` with `args` (validated by the callers) on `dev`'s stream.
fn enqueue(dev: &Device, kernel: &CastKernel, plan: &CastPlan, args: &CastArgs) -> Result<()> {
    if plan.m == 0 {
        return Ok(());
    }
    let kernel = &kernel.with_idx32(fits_idx32(args));
    let f = dev.function(&kernel.spec())?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(args);
    // SAFETY: the op validated x (shape, strides, scales against their grid) and `launch` /
    // `launch_e5m6` validated every output (contiguous, exact shape, scale layout and grid)
    // and the precomputed scales (shape, unit column stride), all on x's device; the kernel
    // reads x[r, c] for r < M, c < K through the row stride, the input scales inside their
    // grid through their strides, writes the output rows inside (M, K) (or (M, 3K/2) bytes)
    // and the scale storage inside its allocation (storage_len), and vector accesses are used
    // only when `vecio` proved the alignment. All buffers outlive the stream-ordered launch.
    unsafe { l.launch(kernel.config(plan)) }.ctx("launching tk_cast")?;
    Ok(())
}

/// Allocates data and scales for `plan` and launches a cast (mode [`CastMode::Cast`]).
pub(crate) fn cast_alloc(
    x: &DeviceCastInput<'_>,
    fmt: CastFormat,
    plan: &CastPlan,
    round_sf: bool,
) -> Result<(DeviceQuantData, DeviceScales)> {
    let dev = x.device();
    let mut data = DeviceQuantData::alloc(dev, fmt, plan.m, plan.k)?;
    let mut sf = DeviceScales::alloc(dev, plan.sf_layout, plan.grid)?;
    let outs = CastOutputs {
        out: Some(&mut data.view_mut()),
        out_sf: Some(&mut sf),
        sf: None,
    };
    launch(x, fmt, plan, round_sf, CastMode::Cast, outs)?;
    Ok((data, sf))
}

/// Allocates the scales for `plan` and launches a scales-only cast.
pub(crate) fn sf_only_alloc(
    x: &DeviceCastInput<'_>,
    fmt: CastFormat,
    plan: &CastPlan,
    round_sf: bool,
) -> Result<DeviceScales> {
    let mut sf = DeviceScales::alloc(x.device(), plan.sf_layout, plan.grid)?;
    let outs = CastOutputs {
        out: None,
        out_sf: Some(&mut sf),
        sf: None,
    };
    launch(x, fmt, plan, round_sf, CastMode::SfOnly, outs)?;
    Ok(sf)
}

/// Allocates the data for `plan` and launches a cast with precomputed scales `sf`.
pub(crate) fn precomputed_alloc(
    x: &DeviceCastInput<'_>,
    fmt: CastFormat,
    plan: &CastPlan,
    sf: &DeviceView<'_, f32>,
) -> Result<DeviceQuantData> {
    let mut data = DeviceQuantData::alloc(x.device(), fmt, plan.m, plan.k)?;
    let outs = CastOutputs {
        out: Some(&mut data.view_mut()),
        out_sf: None,
        sf: Some(sf),
    };
    launch(x, fmt, plan, false, CastMode::PrecomputedSf, outs)?;
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU model of the tiled kernel's thread-to-element map for warp blocks (`TK_WB`): the
    /// 256 threads of a CTA own every element of the `bm x (8 n bk)` tile exactly once (`n`
    /// blocks per warp), the elements of warp `w` are exactly block columns `n w .. n w + n` of
    /// the tile, the kernel's butterflies (lane offsets 1..LK within a block's lanes, then
    /// LX..32 across the row groups) reach exactly the lanes of the block, a block's lanes hold
    /// exactly its elements and its first lane (row group 0, `lx % LK == 0`, the scale store)
    /// holds its first column; a warp's row store covers a whole 32-byte sector with two
    /// blocks; the host's launch tile and `TK_MINB` rows agree.
    #[test]
    fn warp_block_tiles_cover_each_block_with_one_warp() {
        for (input, vec) in [(InputKind::BF16, 8), (InputKind::F32, 4)] {
            for fmt in [CastFormat::E2M1, CastFormat::E4M3] {
                let kernel = CastKernel {
                    input,
                    block: (32, 32),
                    target: Target::Fp(fmt),
                    sf_layout: ScaleLayout::PackedUe8m0,
                    round_sf: true,
                    mode: CastMode::Cast,
                    vecio: true,
                    whole_row: None,
                    idx32: false,
                    warp_blocks: 0,
                }
                .with_warp_blocks();
                // 32x32: n 32 / vec lanes along K, 32 / lanes row groups, rows per thread.
                let rpt_ok = |n: usize| 32 / (32 / (n * 32 / vec)) <= WARP_BLOCK_MAX_RPT;
                let n = if fmt != CastFormat::E2M1 {
                    0
                } else if rpt_ok(2) {
                    2
                } else if rpt_ok(1) {
                    1
                } else {
                    0
                };
                assert_eq!(kernel.warp_blocks, n, "{input:?} {fmt:?}");
                // bf16 takes two blocks (8 rows per thread), fp32 one (two would be 16 rows).
                if fmt == CastFormat::E2M1 {
                    let two = input == InputKind::BF16;
                    assert_eq!(n, if two { 2 } else { 1 }, "{input:?}");
                }
                if n == 0 {
                    continue;
                }
                let (lx, ly) = (kernel.lx(), 32 / kernel.lx());
                let lk = 32 / vec; // lanes per block column (LK)
                let rpt = kernel.rows_per_thread();
                let (tm, tkc) = (ly * rpt, 8 * lx * vec);
                assert_eq!((lx * vec, tm), (32 * n, 32), "a warp spans n blocks");
                assert_eq!(
                    kernel.min_blocks(),
                    if rpt == 8 && vec == 8 { 4 } else { 3 }
                );
                let cfg = kernel.config(&CastPlan {
                    m: 8001,
                    k: 7168,
                    block: (32, 32),
                    grid: ScaleGrid::for_matrix_arg(8001, 7168, (32, 32), "block_size").unwrap(),
                    sf_layout: ScaleLayout::PackedUe8m0,
                });
                assert_eq!(
                    cfg.grid_dim,
                    (8001usize.div_ceil(tm) as u32, (7168 / tkc) as u32, 1)
                );
                let mut owner = vec![usize::MAX; tm * tkc];
                for t in 0..256 {
                    let (warp, lane) = (t / 32, t % 32);
                    let (l_x, l_y) = (lane % lx, lane / lx);
                    let (kl, ml) = (warp * lx + l_x, l_y);
                    let block = kl * vec / 32;
                    assert_eq!(block, warp * n + l_x / lk, "lane {lane} of warp {warp}");
                    if l_y == 0 && l_x % lk == 0 {
                        assert_eq!(kl * vec, 32 * block, "the scale lane holds column 0");
                    }
                    for i in 0..rpt {
                        for j in 0..vec {
                            let (r, c) = (ml * rpt + i, kl * vec + j);
                            assert_eq!(owner[r * tkc + c], usize::MAX, "element owned twice");
                            owner[r * tkc + c] = t;
                            assert_eq!((r / 32, c / 32), (0, block), "lane leaves its block");
                        }
                    }
                    // Codes of row i: this lane's vec / 2 bytes at (kl vec) / 2 of the row; the
                    // lanes of row group l_y form a store of lx vec / 2 contiguous bytes.
                    let store = lx * vec / 2;
                    assert_eq!(store, if n == 2 { 32 } else { 16 });
                }
                assert!(owner.iter().all(|&t| t != usize::MAX), "element not owned");
                // The butterflies' lane offsets 1, 2, .. LK / 2, then LX, 2 LX, .. 16: from any
                // lane they reach exactly the lanes of its block (same lx / LK).
                let offs: Vec<usize> = (0..5)
                    .map(|b| 1usize << b)
                    .filter(|&o| o < lk || o >= lx)
                    .collect();
                for start in 0..32usize {
                    let mut reach = 1u32 << start;
                    for &o in &offs {
                        reach |= (0..32)
                            .filter(|l| reach >> l & 1 == 1)
                            .fold(0, |a, l| a | 1 << (l ^ o));
                    }
                    let same: u32 = (0..32)
                        .filter(|l| (l % lx) / lk == (start % lx) / lk)
                        .fold(0, |a, l| a | 1 << l);
                    assert_eq!(reach, same, "lane {start}");
                }
            }
        }
    }

    /// A CPU model of one bf16 lane of `tkq::e2m1_pack_bf16_pow2_abs` (cuda/quant_scale.cuh),
    /// the packed-pair bf16 arithmetic rounded exactly (RNE, subnormals kept or, with `ftz`,
    /// flushed to signed zero as a multiply might): the e2m1 nibble (code | sign << 3) of
    /// `x * inv` for bf16 bits `x` and a power-of-two `inv` = 2^k with |x * inv| <= 6 or NaN
    /// (the encoder's precondition: it does not clamp |min(y, 6)| again).
    fn packed_e2m1_lane(x: u16, k: i32, ftz: bool) -> u8 {
        /// RNE of an f64 onto bf16 (8 significant bits, subnormal spacing 2^-133), +-inf
        /// above the largest finite bf16; NaN, +-inf and +-0 stay.
        fn to_bf16(v: f64, ftz: bool) -> f64 {
            if !v.is_finite() || v == 0.0 {
                return v;
            }
            let a = v.abs();
            if ftz && a < f64::powi(2.0, -126) {
                return 0.0f64.copysign(v);
            }
            let ex = (a.log2().floor() as i32).max(-126);
            let ulp = f64::powi(2.0, ex - 7);
            let r = (a / ulp).round_ties_even() * ulp;
            let r = if r >= f64::powi(2.0, 128) {
                f64::INFINITY
            } else {
                r
            };
            r.copysign(v)
        }
        fn val(b: u16) -> f64 {
            f64::from(f32::from_bits(u32::from(b) << 16))
        }
        fn bits(v: f64) -> u16 {
            // v is a bf16 value (or NaN): its 16 bits (NaN: the canonical 0x7FFF).
            if v.is_nan() {
                0x7FFF
            } else {
                ((v as f32).to_bits() >> 16) as u16
            }
        }
        // min / max ignoring a NaN operand (PTX min / max.bf16x2).
        let min = |a: f64, b: f64| {
            if a.is_nan() {
                b
            } else if b.is_nan() {
                a
            } else {
                a.min(b)
            }
        };
        let max = |a: f64, b: f64| {
            if a.is_nan() {
                b
            } else if b.is_nan() {
                a
            } else {
                a.max(b)
            }
        };
        let y = to_bf16(val(x) * f64::powi(2.0, k), ftz); // exact product, one rounding
        let c = min(y, 6.0); // signs; NaN -> 6
        let a = c.abs(); // <= 6 by the precondition
        let b = val(bits(max(a, 1.0)) & 0x7F80); // B = 2^e
        let u = b * 3.0 + 49.0;
        let m = b * u + 20.0;
        assert_eq!(to_bf16(u, false), u, "inner fma exact");
        assert_eq!(to_bf16(m, false), m, "outer fma exact");
        // a + m: a >= 0 below 2^-30 cannot move m (ulp >= 0.5); otherwise the f64 sum is exact.
        let t = if a < f64::powi(2.0, -30) {
            m
        } else {
            to_bf16(a + m, false)
        };
        let sign = (bits(c) >> 15) as u8;
        (bits(t) as u8 & 7) | sign << 3
    }

    /// The packed bf16 e2m1 encoder's magnitude and sign lane against the reference e2m1 code
    /// of the fp32 product, for every bf16 `x` and every power-of-two inverse 2^k the kernels
    /// send it (k in [-126, 120]; larger inverses take the fp32 path), with and without a
    /// flushing multiply, wherever the kernels use it: products with |x * inv| <= 6 (or NaN),
    /// which `bounded_products_of_block_inverses` shows holds for every element of a block under
    /// the block's own inverse.
    #[test]
    fn packed_e2m1_encoder_is_exact() {
        let mut checked = 0u64;
        for k in -126..=120 {
            let inv = f32::from_bits(((127 + k) as u32) << 23);
            for x in 0..=u16::MAX {
                let xf = f32::from_bits(u32::from(x) << 16);
                if !(xf.is_nan() || (xf * inv).abs() <= 6.0) {
                    continue;
                }
                let want = tk_core::convert::e2m1_from_f32(xf * inv);
                for ftz in [false, true] {
                    assert_eq!(
                        packed_e2m1_lane(x, k, ftz),
                        want,
                        "x {x:#06x} k {k} ftz {ftz}"
                    );
                }
                checked += 1;
            }
        }
        // All the (x, k) pairs in the precondition: 8441342 of the 247 * 65536.
        assert_eq!(checked, 8_441_342);
    }

    /// `tkq::scale_pair_pow2` (cuda/quant_scale.cuh), ported: the exponent e of the rounded
    /// scale `2^e` of `c = max(amax, eps)` from the bits of `c` and `q` (the exponent difference
    /// plus the mantissa carry), without a division; `c = inf` gives 128.
    fn pow2_exponent(c: f32, q: f32) -> i32 {
        let (cb, qb) = (c.to_bits(), q.to_bits());
        if cb >= 0x7F80_0000 {
            return 128;
        }
        ((cb + (0x7F_FFFF - (qb & 0x7F_FFFF))) >> 23) as i32 - (qb >> 23) as i32
    }

    /// `scale_pair_pow2` gives the rounded scales of the spec's division form
    /// (`compute_scale_with_eps`, the kernels' `scale_pair<true>`) for every fp32
    /// `c = max(amax, eps)` in `[eps, inf]` of e4m3 (q 448, eps 1e-4): the per-channel kernels
    /// that take it (`TK_PC_FAST_SCALES`) store the same scales and inverses bit for bit.
    #[test]
    fn pow2_scales_equal_the_division_form_for_e4m3() {
        use tk_core::convert::{compute_scale_with_eps, QuantFormat};
        let fmt = QuantFormat::E4M3;
        let (q, eps) = (fmt.max_value(), fmt.eps());
        let (lo, hi) = (eps.to_bits(), 0x7F80_0000u32);
        let mid = lo + (hi - lo) / 2;
        // Two halves of the ~1.2e9 values on two threads (about 20 s each unoptimised).
        std::thread::scope(|s| {
            for (a, b) in [(lo, mid), (mid + 1, hi)] {
                s.spawn(move || {
                    for cb in a..=b {
                        let c = f32::from_bits(cb);
                        let e = pow2_exponent(c, q);
                        let (sf, inv) = compute_scale_with_eps(c, q, eps, true);
                        let want = (
                            (127i32.wrapping_add(e) as u32) << 23,
                            (127i32.wrapping_sub(e) as u32) << 23,
                        );
                        assert_eq!((sf.to_bits(), inv.to_bits()), want, "c {c:e}");
                    }
                });
            }
        });
    }

    /// The encoder's precondition: for every bf16 block maximum (and the eps clamp), the
    /// power-of-two inverse of `scale_pair_pow2` ([`pow2_exponent`]) keeps amax * inv <= 6, so
    /// every non-NaN element of the block has |x * inv| <= 6.
    #[test]
    fn bounded_products_of_block_inverses() {
        let (q, eps) = (6.0f32, f32::from_bits(0x01C0_0000));
        for a in 0..0x7F80u32 {
            let amax = f32::from_bits(a << 16);
            let e = pow2_exponent(amax.max(eps), q);
            let inv = f64::powi(2.0, -e);
            assert!(f64::from(amax) * inv <= 6.0, "amax {amax:e}");
            assert!(
                f64::from(amax.max(eps)) * inv > 3.0,
                "the scale is the least power of two"
            );
        }
    }

    /// The encoder's nibble gather: bytes in the order (x1, x0, x3, x2), `q * 0x1001`, bytes 1
    /// and 3, gives the packed word of its definition, nibble j = (code bits 0..2 of t's half j)
    /// | (sign bit 15 of c's half j) << 3, for any t and c words (the other bits arbitrary).
    #[test]
    fn packed_e2m1_nibble_gather_packs_codes_and_signs() {
        fn prmt(a: u32, b: u32, sel: u32) -> u32 {
            let src = u64::from(a) | u64::from(b) << 32;
            (0..4).fold(0, |r, i| {
                let n = sel >> (4 * i) & 0xF;
                let byte = (src >> (8 * (n & 7)) & 0xFF) as u32;
                let byte = if n & 8 != 0 {
                    if byte & 0x80 != 0 {
                        0xFF
                    } else {
                        0
                    }
                } else {
                    byte
                };
                r | byte << (8 * i)
            })
        }
        let pack = |t: [u32; 4], c: [u32; 4]| -> u32 {
            let n: Vec<u32> = (0..2)
                .map(|h| {
                    let b = prmt(t[2 * h], t[2 * h + 1], 0x4602);
                    let s = prmt(c[2 * h], c[2 * h + 1], 0xDF9B);
                    let q = (b & 0x0707_0707) | (s & 0x0808_0808);
                    q.wrapping_mul(0x1001)
                })
                .collect();
            prmt(n[0], n[1], 0x7531)
        };
        let want = |t: [u32; 4], c: [u32; 4]| -> u32 {
            (0..8).fold(0, |r, j| {
                let sh = 16 * (j % 2);
                let code = t[j / 2] >> sh & 7;
                let sign = c[j / 2] >> (sh + 15) & 1;
                r | (code | sign << 3) << (4 * j)
            })
        };
        let mut st = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            st as u32
        };
        for i in 0..1_000_000 {
            let t = [rnd(), rnd(), rnd(), rnd()];
            let c = [rnd(), rnd(), rnd(), rnd()];
            assert_eq!(pack(t, c), want(t, c), "case {i}");
        }
        // Every code and sign in every one of the 8 positions, the others zero.
        for pos in 0..8 {
            for v in 0..16u32 {
                let (mut t, mut c) = ([0u32; 4], [0u32; 4]);
                t[pos / 2] = (v & 7) << (16 * (pos % 2));
                c[pos / 2] = (v >> 3) << (15 + 16 * (pos % 2));
                assert_eq!(pack(t, c), v << (4 * pos));
                assert_eq!(want(t, c), v << (4 * pos));
            }
        }
    }
}
