//! CPU reference of the generic block-scaled FP8/FP4 cast and its inverse: upstream's
//! `tile_kernels.torch.cast` (`spec/quant.md` §2.1) and `tile_kernels.torch.cast_back` (§2.2).
//!
//! Every per-token (`block = (1, npc)`), per-block (`(bm, bk)`) and per-channel (`(npt, 1)`)
//! cast of the family is this function with a particular block; the GPU kernels must match it
//! bit for bit (data and scales, padding included: zeros).
//!
//! # What [`cast`] computes
//!
//! Input `x`, `(M, K)`, is plain fp32/bf16 or quantized ([`QuantInput`]: e4m3 `(M, K)` or
//! packed e2m1 `(M, K/2)` data with scales for its own block `(ih, iw)`). Block
//! `(bh, bw)`; grid `nbm = ceil(M/bh)`, `nbk = ceil(K/bw)` (partial blocks allowed).
//!
//! 1. Values: plain `v = fp32(x[r, c])` (exact); quantized
//!    `v = fl(dec(data[r, c]) · s_in[r/ih, c/iw])`, UE8M0 input scales decoded as `b << 23`.
//! 2. Per block: `amax = max |v|` over the block's real elements (rows `>= M` and columns
//!    `>= K` do not exist; an all-zero block has `amax = 0`).
//! 3. `(sf, inv) = compute_scale(amax, fmt, round_sf)` (§1.4): `c = max(amax, ε)`;
//!    non-rounded `sf = fl(c/Q)`, `inv = fl(Q/c)`; rounded `sf = 2^ceil(log2(c/Q))`,
//!    `inv = 1/sf` exactly. With precomputed scales, `inv = fl(1/sf)`.
//! 4. `q = enc(fl(v · inv))`: e4m3 RNE saturating to ±448, or e2m1 RNE saturating to ±6 and
//!    packed two per byte (even column in the low nibble). The sign of zero is kept (−0.0 →
//!    `0x80` / nibble 8).
//! 5. Scales stored in the layout the options select ([`ScaleOptions::layout`]): fp32 `sf`
//!    (A, B) or the UE8M0 byte `e + 127` (C), padding zero.
//!
//! # Choices where upstream's kernel and reference differ (documented deviations)
//!
//! * **Requantization order** (§3.1 item 4 Ambiguity): this reference computes
//!   `enc(fl(fl(dec · s_in) · inv))`, the spec's reference order. Upstream's kernel folds the two
//!   scales, `enc(fl(dec · fl(s_in · inv)))`; the two agree whenever `s_in` and `inv` are powers
//!   of two (every upstream test). The GPU kernels of this crate must use the reference order.
//! * **NaN and infinity** (§5 item 6: unsupported inputs; we follow the GPU): `amax` ignores NaN
//!   (CUDA `fmaxf`; PyTorch would propagate it); a NaN encodes to e4m3 `0x7F` / e2m1 `+6`
//!   whatever its sign. An infinite `amax` gives, non-rounded, `sf = +inf`, `inv = 0` (finite
//!   values become ±0, the infinite one NaN → `0x7F`); rounded, `sf = +inf` (UE8M0 byte 255) and
//!   the kernel's wrapped `inv = −inf` (non-zero values, the infinite one included, saturate
//!   to ∓Q; zeros give NaN). Upstream's reference would use `inv = 0` in the rounded case.
//! * **Odd `K` with e2m1 output** is rejected even when `M = 0` (upstream checks it only for
//!   `M > 0`, returning `(0, K // 2)` data otherwise).
//! * **`K = 0`** is rejected ([`TkError::Empty`]); `M = 0` is allowed and returns `(0, K)` /
//!   `(0, K/2)` data and `(0, nbk)` scales (int32 `(0, ceil(nbk/4))` for layout C).
//! * **Input scales** must have exactly the grid's shape; upstream's reference would also crop a
//!   larger tensor.
//! * **Precomputed mode** ([`cast_with_precomputed_sf`]) takes layout-A fp32 scales only (any
//!   row stride); upstream's reference asserts this, and its kernel's column-major variant is
//!   untested and its packed variant unsupported (§3.1). Quantized input is allowed in
//!   precomputed and sf-only modes here, as in upstream's reference; the per-token op (§3.1)
//!   rejects that combination at its own level.
//!
//! [`cast_back`] is exact: `out = convert(fl(dec(data) · S))`, `convert` = identity (fp32) or
//! RNE to bf16 (§2.2, §3.8). It accepts any `K >= 1`; the GPU op will add the kernel's
//! `K % 64 == 0` requirement.

use tk_core::convert::compute_scale;
use tk_core::{HostTensor, HostView, Result, TkError};

use super::{par_rows, quant_rows};
use crate::scale::{HostScales, ScaleGrid, ScaleOptions};
use crate::types::{check_matrix, CastFormat, CastInput, DequantElement, QuantData, QuantInput};

/// The fp32 values `v` of a validated cast input, row-major `(M, K)`, with the output grid.
struct Values {
    m: usize,
    k: usize,
    block: (usize, usize),
    grid: ScaleGrid,
    v: Vec<f32>,
}

impl Values {
    /// Validates `x`, `fmt` against `K` and the block, and computes step 1.
    fn new(x: &CastInput<'_>, fmt: CastFormat, block: (usize, usize)) -> Result<Self> {
        let (m, k, grid) = Self::check(x, fmt, block)?;
        let mut v = vec![0.0f32; m * k];
        par_rows(&mut v, k, k, |first, run| {
            let mut buf = Vec::with_capacity(k);
            for (i, out) in run.chunks_mut(k).enumerate() {
                buf.clear();
                match x {
                    CastInput::Plain(p) => p.push_row(first + i, &mut buf),
                    CastInput::Quantized(q) => q.push_dequantized_row(first + i, &mut buf),
                }
                out.copy_from_slice(&buf);
            }
        });
        Ok(Self {
            m,
            k,
            block,
            grid,
            v,
        })
    }

    /// [`Values::new`] of a contiguous fp32 input, taking its buffer (step 1 is a bit copy).
    fn from_tensor(x: HostTensor<f32>, fmt: CastFormat, block: (usize, usize)) -> Result<Self> {
        let (m, k, grid) = Self::check(&CastInput::from(x.view()), fmt, block)?;
        Ok(Self {
            m,
            k,
            block,
            grid,
            v: x.into_vec(),
        })
    }

    /// The validation of [`Values::new`]: `(M, K)` and the output grid.
    fn check(
        x: &CastInput<'_>,
        fmt: CastFormat,
        block: (usize, usize),
    ) -> Result<(usize, usize, ScaleGrid)> {
        let (m, k) = match x {
            CastInput::Plain(p) => p.validate("x")?,
            CastInput::Quantized(q) => {
                let g = q.validate()?;
                (g.m, g.k)
            }
        };
        if fmt == CastFormat::E2M1 && k % 2 != 0 {
            return Err(TkError::Shape {
                arg: "x",
                expected: "an even number of columns K: e2m1 output packs two values per byte"
                    .into(),
                got: vec![m, k],
            });
        }
        Ok((m, k, ScaleGrid::for_matrix(m, k, block)?))
    }

    /// Row `r` of the values.
    fn row(&self, r: usize) -> &[f32] {
        &self.v[r * self.k..(r + 1) * self.k]
    }

    /// `(sf, inv)` for every block, row-major over the grid: per block `amax = max |v|` over
    /// its real elements (rows `>= M` and columns `>= K` do not exist), then
    /// [`compute_scale`]. NaN is ignored, like CUDA's `fmaxf` (`f32::max` returns the non-NaN
    /// operand).
    ///
    /// Each block's `amax` folds its elements in the order of the block's rows, left to right
    /// in each row (the order of the row-major fold over the block); a row block's `amax` row
    /// is accumulated while streaming its rows, so the column blocks of `bh = 128` blocks do
    /// not walk the matrix by columns. Row blocks are computed in parallel.
    fn scales(&self, fmt: CastFormat, round_sf: bool) -> Vec<(f32, f32)> {
        let (bm, bk) = self.block;
        let nbk = self.grid.nbk();
        let mut out = vec![(0.0f32, 0.0f32); self.grid.nbm() * nbk];
        par_rows(&mut out, nbk, bm * self.k, |first, run| {
            let mut amax = vec![0.0f32; nbk];
            for (i, sc) in run.chunks_mut(nbk).enumerate() {
                let mb = first + i;
                amax.fill(0.0);
                for r in mb * bm..((mb + 1) * bm).min(self.m) {
                    let row = self.row(r);
                    if bk == 1 {
                        for (a, x) in amax.iter_mut().zip(row) {
                            *a = a.max(x.abs());
                        }
                    } else {
                        for (a, chunk) in amax.iter_mut().zip(row.chunks(bk)) {
                            *a = chunk.iter().fold(*a, |acc, x| acc.max(x.abs()));
                        }
                    }
                }
                for (s, &a) in sc.iter_mut().zip(&amax) {
                    *s = compute_scale(a, fmt.quant_format(), round_sf);
                }
            }
        });
        out
    }

    /// Step 4: `enc(fl(v · inv))` with `inv[mb · nbk + kb]` per block, rows in parallel.
    fn quantize(&self, fmt: CastFormat, inv: &[f32]) -> Result<QuantData> {
        let (bm, bk) = self.block;
        let nbk = self.grid.nbk();
        quant_rows(fmt, (self.m, self.k), |r, codes| {
            let inv = &inv[(r / bm) * nbk..(r / bm + 1) * nbk];
            for ((cs, vs), &s) in codes.chunks_mut(bk).zip(self.row(r).chunks(bk)).zip(inv) {
                fmt.encode_scaled(cs, vs, s);
            }
        })
        .map(|(data, _)| data)
    }

    /// Steps 2-5: the data and the scales.
    fn cast(&self, fmt: CastFormat, opts: &ScaleOptions) -> Result<(QuantData, HostScales)> {
        let scales = self.scales(fmt, opts.round_sf);
        let inv: Vec<f32> = scales.iter().map(|&(_, inv)| inv).collect();
        Ok((self.quantize(fmt, &inv)?, self.store(opts, &scales)?))
    }

    /// Step 5: the scales in the selected layout.
    fn store(&self, opts: &ScaleOptions, scales: &[(f32, f32)]) -> Result<HostScales> {
        let mut out = HostScales::zeros(opts.layout()?, self.grid);
        let nbk = self.grid.nbk();
        for (i, &(sf, _)) in scales.iter().enumerate() {
            out.set(i / nbk, i % nbk, sf);
        }
        Ok(out)
    }
}

/// Casts `x` `(M, K)` to `fmt` with one scale per `block_size = (bh, bw)` block (§2.1).
///
/// Returns the data (e4m3 `(M, K)` or packed e2m1 `(M, K/2)`, contiguous) and the scales
/// (grid `(ceil(M/bh), ceil(K/bw))` in the layout `opts` selects). See the [module docs](self)
/// for the exact arithmetic.
///
/// Errors: `opts` ([`ScaleOptions::layout`]: packed without `round_sf` or without
/// column-major), `block_size` (0), `x` (rank, column stride, `K = 0`, odd `K` for e2m1),
/// `x_block_size` and `x.sf` for quantized input (see [`QuantInput::validate`]).
pub fn cast(
    x: &CastInput<'_>,
    fmt: CastFormat,
    block_size: (usize, usize),
    opts: ScaleOptions,
) -> Result<(QuantData, HostScales)> {
    opts.layout()?;
    Values::new(x, fmt, block_size)?.cast(fmt, &opts)
}

/// [`cast`] of a contiguous fp32 `x`, taking its buffer instead of copying it (the
/// per-channel fused reference's gathered rows: up to 49152 x 7168 values per call).
pub(crate) fn cast_owned(
    x: HostTensor<f32>,
    fmt: CastFormat,
    block_size: (usize, usize),
    opts: ScaleOptions,
) -> Result<(QuantData, HostScales)> {
    opts.layout()?;
    Values::from_tensor(x, fmt, block_size)?.cast(fmt, &opts)
}

/// The scales of [`cast`] only (the kernels' "sf-only" mode): identical to the scales
/// [`cast`] returns for the same arguments; no data is produced.
pub fn cast_sf_only(
    x: &CastInput<'_>,
    fmt: CastFormat,
    block_size: (usize, usize),
    opts: ScaleOptions,
) -> Result<HostScales> {
    opts.layout()?;
    let vals = Values::new(x, fmt, block_size)?;
    vals.store(&opts, &vals.scales(fmt, opts.round_sf))
}

/// Casts `x` with caller-given scales (the "precomputed" mode, §2.1 step 4): per block
/// `inv = fl(1/sf)` (correctly rounded), then `q = enc(fl(v · inv))`. Returns the data only.
///
/// `sf` is fp32 layout A: shape exactly `(ceil(M/bh), ceil(K/bw))`, unit column stride, any
/// row stride. Its values are used as given (a zero gives `inv = +inf`). With the power-of-two
/// scales of a rounded cast, the result equals that cast's data bit for bit.
///
/// Errors: as [`cast`], plus `sf` (rank, shape, column stride).
pub fn cast_with_precomputed_sf(
    x: &CastInput<'_>,
    fmt: CastFormat,
    block_size: (usize, usize),
    sf: &HostView<'_, f32>,
) -> Result<QuantData> {
    let vals = Values::new(x, fmt, block_size)?;
    let (rows, cols) = check_matrix("sf", sf.layout())?;
    let (nbm, nbk) = (vals.grid.nbm(), vals.grid.nbk());
    if (rows, cols) != (nbm, nbk) {
        return Err(TkError::Shape {
            arg: "sf",
            expected: format!("({nbm}, {nbk}) = (ceil(M/bh), ceil(K/bw)) fp32, layout A"),
            got: vec![rows, cols],
        });
    }
    let inv: Vec<f32> = (0..nbm * nbk)
        .map(|i| 1.0 / sf.at(&[i / nbk, i % nbk]))
        .collect();
    vals.quantize(fmt, &inv)
}

/// Dequantizes `x` (§2.2): `out[r, c] = O::from_f32(fl(dec(data[r, c]) · S[r/bm, c/bk]))` with
/// `(bm, bk) = x.block`, contiguous `(M, K)` fp32 or bf16 (RNE). Exact; UE8M0 scales decode as
/// `b << 23` (byte 0 → +0.0, 255 → +inf).
///
/// Errors: see [`QuantInput::validate`] (`x`, `x_block_size`, `x.sf`).
pub fn cast_back<O: DequantElement>(x: &QuantInput<'_>) -> Result<HostTensor<O>> {
    let g = x.validate()?;
    let mut out = Vec::with_capacity(g.m * g.k);
    let mut row = Vec::with_capacity(g.k);
    for r in 0..g.m {
        row.clear();
        x.push_dequantized_row(r, &mut row);
        out.extend(row.iter().map(|&v| O::from_f32(v)));
    }
    HostTensor::from_vec(out, &[g.m, g.k])
}
