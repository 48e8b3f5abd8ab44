//! `transpose` and `batched_transpose` (`spec/quant.md` §3.13): `out[b, j, i] = x[b, i, j]`.
//!
//! A pure bit copy: no arithmetic, so results are bit-exact for every element type of 1, 2 or
//! 4 bytes (fp32, bf16, f16, FP8 e4m3/e5m2, i32, u8, UE8M0 bytes).
//!
//! | argument | shape | dtype | layout |
//! |---|---|---|---|
//! | `x` (`batched_transpose`) | `(B, X, Y)` | 1, 2 or 4 bytes, not packed | last stride 1; any row and batch stride |
//! | `x` (`transpose`) | `(X, Y)` | same | last stride 1; any row stride |
//! | `out` | `(B, Y, X)` / `(Y, X)` | same as `x` | contiguous |
//!
//! **Deviations from upstream** (all relax upstream's limits; none changes a result):
//! * any sizes: upstream needs `X % 64 == 0` and `Y % 64 == 0`; here any `X, Y ≥ 0` work;
//! * any row stride: upstream needs `stride(-2) % 4 == 0`;
//! * any batch stride: upstream silently assumes batches packed back to back (`X · stride(-2)`)
//!   and reads the wrong rows otherwise; here the view's batch stride is honoured.
//!
//! Empty inputs (any dimension 0) are allowed: nothing is launched and the output is empty.
//! Packed types (FP4 pairs, E5M6 bytes, packed UE8M0 words) and 8-byte types are rejected with
//! [`TkError::Dtype`], because transposing their storage units is not a logical transpose.
//!
//! Kernels: when the rows are 16-byte aligned and `X`, `Y` are multiples of `16 / size`, a block
//! stages a tile of (32, 64 or 128 bytes of x) × (128, 256 or 512 bytes of y) in swizzled shared
//! memory with 16-byte loads and writes it back with 16-byte stores (the tile height is picked
//! from the shape so that small problems still give every SM several blocks, and large launches
//! keep 4 blocks per SM resident instead of 6, which moves their bytes faster; e4m3 launches of
//! at least 4 tiles per SM issue a tile's loads without branches); otherwise a 32 × 32
//! shared-memory tile kernel handles any shape. `transpose_into_tiled` and
//! `batched_transpose_into_tiled` take the staged kernel's tiling explicitly (benchmarks, tuning).
//! The ops never synchronise with the host and are safe to capture in a CUDA graph (after
//! [`prewarm`]).

use tk_core::{DType, Layout, Result, TkError};

/// Validated geometry of one batched transpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub batches: usize,
    pub x: usize,
    pub y: usize,
    /// Input row stride (elements).
    pub ld: usize,
    /// Input batch stride (elements).
    pub bs: usize,
}

impl Geometry {
    pub(crate) fn is_empty(&self) -> bool {
        self.batches == 0 || self.x == 0 || self.y == 0
    }
}

/// Checks the element type: 1, 2 or 4 bytes and not packed.
pub(crate) fn check_dtype(dt: DType) -> Result<()> {
    if dt.is_packed() || !matches!(dt.size_bytes(), 1 | 2 | 4) {
        return Err(TkError::Dtype { arg: "x", expected: "an unpacked element type of 1, 2 or 4 bytes (fp32, bf16, fp16, e4m3, e5m2, i32, u8, ue8m0)".into(), got: dt });
    }
    Ok(())
}

/// Validates `x` (rank `rank`: 2 for `transpose`, 3 for `batched_transpose`) and returns its
/// geometry as a batch of matrices.
pub(crate) fn geometry(dt: DType, layout: &Layout, rank: usize) -> Result<Geometry> {
    check_dtype(dt)?;
    if layout.rank() != rank {
        let expected = if rank == 2 {
            "rank 2 (X, Y)"
        } else {
            "rank 3 (B, X, Y)"
        };
        return Err(TkError::Shape {
            arg: "x",
            expected: expected.into(),
            got: layout.shape().to_vec(),
        });
    }
    let (shape, strides) = (layout.shape(), layout.strides());
    let (b, x, y) = if rank == 2 {
        (1, shape[0], shape[1])
    } else {
        (shape[0], shape[1], shape[2])
    };
    if y > 1 && strides[rank - 1] != 1 {
        return Err(TkError::Stride {
            arg: "x",
            expected: "the last dimension must be contiguous (stride 1)".into(),
            got: strides.to_vec(),
        });
    }
    for (name, v) in [
        ("x.shape[batch]", b),
        ("x.shape[-2]", x),
        ("x.shape[-1]", y),
    ] {
        if v > u32::MAX as usize {
            return Err(TkError::param(
                name,
                format!("{v} exceeds the supported maximum {}", u32::MAX),
            ));
        }
    }
    let ld = strides[rank - 2];
    let bs = if rank == 3 { strides[0] } else { 0 };
    Ok(Geometry {
        batches: b,
        x,
        y,
        ld,
        bs,
    })
}

#[cfg(feature = "cuda")]
pub use gpu::*;

/// The GPU ops (feature `cuda`).
#[cfg(feature = "cuda")]
mod gpu {
    use super::{geometry, Geometry};
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    use tk_core::device::DeviceProps;
    use tk_core::error::DriverContext;
    use tk_core::{
        Device, DeviceTensor, DeviceView, DeviceViewMut, Element, FuncAttr, KernelSource,
        KernelSpec, Layout, Result, TkError,
    };

    static SOURCE: KernelSource = KernelSource {
        file: "batched_transpose.cu",
        entry: "tk_batched_transpose",
        code: include_str!("../cuda/batched_transpose.cu"),
        headers: &[],
        needs_cuda_headers: false,
    };

    /// Checks that `out` has shape `expected` and is contiguous.
    pub(crate) fn check_out(layout: &Layout, expected: &[usize]) -> Result<()> {
        if layout.shape() != expected {
            return Err(TkError::Shape {
                arg: "out",
                expected: format!("{expected:?} (x's shape with the last two dimensions swapped)"),
                got: layout.shape().to_vec(),
            });
        }
        if !layout.is_contiguous() {
            return Err(TkError::Stride {
                arg: "out",
                expected: "a contiguous (row-major) output".into(),
                got: layout.strides().to_vec(),
            });
        }
        Ok(())
    }

    fn out_shape(layout: &Layout) -> Vec<usize> {
        let mut s = layout.shape().to_vec();
        let r = s.len();
        s.swap(r - 1, r - 2);
        s
    }

    /// Tiling of the staged-tile kernel (`TK_VEC=1`): a tile is `rows` input rows (x) ×
    /// `bands` × 128 bytes (y); a block has `2 · rows · size` threads.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Tiling {
        /// Input rows per tile (elements along x): 32, 64 or 128 bytes' worth.
        pub rows: usize,
        /// 128-byte column bands per tile (y).
        pub bands: usize,
    }

    impl Tiling {
        /// Tile heights in bytes of x the kernel supports (one output row piece per tile).
        pub const ROW_BYTES: [usize; 3] = [128, 64, 32];

        /// Largest tile (bytes of shared memory per block) a supported tiling may have: 6
        /// blocks of it still fit in an SM's 228 KB.
        pub const MAX_TILE_BYTES: usize = 32 << 10;

        /// The tiling for `elem_bytes`-byte elements with `row_bytes` bytes of x per tile:
        /// `elem_bytes` bands, so every thread loads and stores 64 bytes per tile whatever the
        /// element size (4 16-byte vectors in flight per thread in both steps).
        pub fn new(elem_bytes: usize, row_bytes: usize) -> Self {
            Tiling {
                rows: row_bytes / elem_bytes,
                bands: elem_bytes,
            }
        }

        /// Every tiling the staged kernel supports for `elem_bytes`-byte elements: the heights of
        /// [`Self::ROW_BYTES`] × 1, 2 or 4 bands, at most [`Self::MAX_TILE_BYTES`] per tile.
        pub fn supported(elem_bytes: usize) -> impl Iterator<Item = Tiling> {
            Self::ROW_BYTES.into_iter().flat_map(move |rb| {
                [1, 2, 4]
                    .into_iter()
                    .map(move |bands| Tiling {
                        rows: rb / elem_bytes,
                        bands,
                    })
                    .filter(move |t| t.tile_bytes() <= Self::MAX_TILE_BYTES)
            })
        }

        /// Shared memory of one tile (bytes).
        pub fn tile_bytes(&self) -> usize {
            self.rows * self.bands * 128
        }

        /// Threads per block: one per (word column, output vector) of a band.
        pub fn threads(&self, elem_bytes: usize) -> usize {
            2 * self.rows * elem_bytes
        }

        /// Elements along y of one tile.
        pub fn cols(&self, elem_bytes: usize) -> usize {
            self.bands * 128 / elem_bytes
        }
    }

    /// Code forms of the staged-tile path, chosen per launch (both off: the plain form).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Form {
        /// The tile's loads issued without branches and no barrier before a block's first tile
        /// (`TK_LEAN`; chosen by the private `lean_loads` rule).
        pub lean: bool,
        /// The L2 prefetch ahead compiled in (`TK_PREFETCH`; the `prefetch_ahead` rule). Only the
        /// launches that use it get it: the code alone, never run, made 4032x576 bf16 1.5-2 %
        /// slower (H200, session 20: 4.13 -> 4.19-4.22 µs).
        pub prefetch: bool,
    }

    /// The kernel specialisation for element size `elem_bytes`: the staged-tile path with
    /// `tiling` in code form `form`, or the generic path for `None` (`form` ignored).
    pub fn kernel_spec(elem_bytes: usize, tiling: Option<Tiling>, form: Form) -> KernelSpec {
        let spec = KernelSpec::new(&SOURCE)
            .define("TK_ELEM_BYTES", elem_bytes)
            .define("TK_VEC", tiling.is_some() as u8);
        match tiling {
            Some(t) => spec
                .define("TK_TILE_X", t.rows)
                .define("TK_BANDS", t.bands)
                .define("TK_LEAN", form.lean as u8)
                .define("TK_PREFETCH", form.prefetch as u8),
            None => spec,
        }
    }

    /// Every `(element bytes, tiling, form)` this crate can launch.
    fn registered_combinations() -> impl Iterator<Item = (usize, Option<Tiling>, Form)> {
        [1, 2, 4].into_iter().flat_map(|e| {
            Tiling::supported(e)
                .flat_map(move |t| {
                    // The branch-free loads are launched for e4m3 only (lean_loads); the
                    // prefetch for 2-byte elements in tiles that residency_pad can pad
                    // (prefetch_ahead).
                    let both: &'static [bool] = &[false, true];
                    let leans = if e == 1 { both } else { &both[..1] };
                    let big = e == 2 && t.tile_bytes() >= BIG_TILE;
                    let prefetches = if big { both } else { &both[..1] };
                    leans.iter().flat_map(move |&lean| {
                        prefetches
                            .iter()
                            .map(move |&prefetch| (e, Some(t), Form { lean, prefetch }))
                    })
                })
                .chain([(e, None, Form::default())])
        })
    }

    /// Every specialisation this crate can launch (for compile checks; [`prewarm`] loads them
    /// with their function attributes).
    pub fn registered_kernels() -> Vec<KernelSpec> {
        registered_combinations()
            .map(|(e, t, f)| kernel_spec(e, t, f))
            .collect()
    }

    /// The launched form of [`kernel_spec`] on a device with properties `p`: staged tilings get
    /// the largest shared-memory carveout (up to 6 blocks × (16 or 32 KB + 1 KB reserved) need
    /// up to the 228 KB configuration, and the kernel keeps nothing in L1) and, for tiles of at
    /// least 16 KB, the dynamic shared memory of [`residency_pad`] as their limit. Both are set
    /// once, when the function is loaded; they depend on the device and the tile only, so every
    /// launch of the specialisation agrees with them.
    fn launch_spec(
        p: &DeviceProps,
        elem_bytes: usize,
        tiling: Option<Tiling>,
        form: Form,
    ) -> KernelSpec {
        let spec = kernel_spec(elem_bytes, tiling, form);
        let Some(t) = tiling else { return spec };
        let spec = spec.attribute(FuncAttr::SharedCarveout(100));
        match pad_bytes(p, &t) {
            0 => spec,
            pad => spec.attribute(FuncAttr::MaxDynamicShared(pad as u32)),
        }
    }

    /// Compiles (or loads from the disk cache) every transpose kernel on `dev`, with the
    /// function attributes its launches use, e.g. before capturing a CUDA graph.
    pub fn prewarm(dev: &Device) -> Result<()> {
        let specs: Vec<KernelSpec> = registered_combinations()
            .map(|(e, t, f)| launch_spec(dev.props(), e, t, f))
            .collect();
        dev.prewarm(&specs)
    }

    /// Transposes the last two dimensions of `x` `(B, X, Y)` into a new contiguous `(B, Y, X)`.
    ///
    /// See the module docs for the accepted layouts. Enqueued on `x`'s device stream; no host sync.
    pub fn batched_transpose<T: Element>(x: &DeviceView<'_, T>) -> Result<DeviceTensor<T>> {
        alloc_and_launch(x, 3)
    }

    /// [`batched_transpose`] into a caller-provided contiguous `out` of shape `(B, Y, X)`.
    pub fn batched_transpose_into<T: Element>(
        x: &DeviceView<'_, T>,
        out: &mut DeviceViewMut<'_, T>,
    ) -> Result<()> {
        launch(x, out, 3, None)
    }

    /// Transposes a 2-D `x` `(X, Y)` into a new contiguous `(Y, X)`.
    pub fn transpose<T: Element>(x: &DeviceView<'_, T>) -> Result<DeviceTensor<T>> {
        alloc_and_launch(x, 2)
    }

    /// [`transpose`] into a caller-provided contiguous `out` of shape `(Y, X)`.
    pub fn transpose_into<T: Element>(
        x: &DeviceView<'_, T>,
        out: &mut DeviceViewMut<'_, T>,
    ) -> Result<()> {
        launch(x, out, 2, None)
    }

    /// [`transpose_into`] with an explicit tiling of the staged-tile kernel instead of the one
    /// picked from the shape: for benchmarks and tuning (`benches/transpose.rs` compares them).
    /// Errors: [`TkError::Param`] naming `tiling` if it is not one of [`Tiling::supported`] for
    /// `T`, or if `x` and `out` do not qualify for the staged kernel (16-byte aligned rows, `X`
    /// and `Y` multiples of `16 / size_of::<T>()`); otherwise as [`transpose_into`].
    pub fn transpose_into_tiled<T: Element>(
        x: &DeviceView<'_, T>,
        out: &mut DeviceViewMut<'_, T>,
        tiling: Tiling,
    ) -> Result<()> {
        launch(x, out, 2, Some(tiling))
    }

    /// [`batched_transpose_into`] with an explicit tiling; see [`transpose_into_tiled`].
    pub fn batched_transpose_into_tiled<T: Element>(
        x: &DeviceView<'_, T>,
        out: &mut DeviceViewMut<'_, T>,
        tiling: Tiling,
    ) -> Result<()> {
        launch(x, out, 3, Some(tiling))
    }

    /// Validates `x` (before allocating), allocates the contiguous output and launches.
    fn alloc_and_launch<T: Element>(x: &DeviceView<'_, T>, rank: usize) -> Result<DeviceTensor<T>> {
        geometry(T::DTYPE, x.layout(), rank)?;
        let mut out = x.device().alloc::<T>(&out_shape(x.layout()))?;
        launch(x, &mut out.view_mut(), rank, None)?;
        Ok(out)
    }

    /// Launches on validated arguments: the staged kernel where `x` and `out` allow it, with
    /// `forced` or else the tiling picked from the shape; else the generic kernel.
    fn launch<T: Element>(
        x: &DeviceView<'_, T>,
        out: &mut DeviceViewMut<'_, T>,
        rank: usize,
        forced: Option<Tiling>,
    ) -> Result<()> {
        let g = geometry(T::DTYPE, x.layout(), rank)?;
        check_out(out.layout(), &out_shape(x.layout()))?;
        let dev = x.device();
        if !dev.same_device(out.device()) {
            return Err(TkError::Placement {
                arg: "out",
                msg: "must be on the same device as x".into(),
            });
        }
        if g.is_empty() {
            return Ok(());
        }
        let e = std::mem::size_of::<T>();
        let v = 16 / e; // elements per 16-byte vector
        let (x_addr, out_addr) = (x.address(), out.address());
        let vec = x_addr % 16 == 0
            && out_addr % 16 == 0
            && g.x % v == 0
            && g.y % v == 0
            && g.ld % v == 0
            && (g.batches == 1 || g.bs % v == 0);
        if let Some(t) = forced {
            if !Tiling::supported(e).any(|s| s == t) {
                return Err(TkError::param(
                    "tiling",
                    format!("{t:?} is not supported for {e}-byte elements"),
                ));
            }
            if !vec {
                return Err(TkError::param(
                    "tiling",
                    "x and out do not qualify for the staged-tile kernel (16-byte aligned rows, \
                     X and Y multiples of 16 bytes)",
                ));
            }
        }
        let (mut cfg, tiling) = if vec {
            let t = forced.unwrap_or_else(|| pick_tiling(&g, e, dev.props().sm_count as usize));
            (tile_config(&g, e, t), Some(t))
        } else {
            (generic_config(&g), None)
        };
        // Tiles of a staged launch (0 for the generic path).
        let tiles = tiling.map_or(0, |t| {
            let (nx, ny) = tile_counts(&g, e, &t);
            nx * ny * g.batches
        });
        let sms = dev.props().sm_count as usize;
        // Staged launches: the residency pad and the prefetch distance (0 and 0 otherwise).
        let (pad, ahead) = tiling.map_or((0, 0), |t| {
            let pad = residency_pad(dev.props(), &t, tiles);
            (
                pad,
                prefetch_ahead(e, g.batches, tile_counts(&g, e, &t).1, pad, sms),
            )
        });
        cfg.shared_mem_bytes = pad as u32;
        let form = Form {
            lean: tiling.is_some() && lean_loads(e, tiles, sms),
            prefetch: ahead > 0,
        };
        // The carveout and the dynamic shared-memory limit come with the function (launch_spec).
        let f = dev.function(&launch_spec(dev.props(), e, tiling, form))?;
        let (batches, xs, ys, ld, bs) = (
            g.batches as u32,
            g.x as u32,
            g.y as u32,
            g.ld as u64,
            g.bs as u64,
        );
        let mut l = dev.stream().launch_builder(&f);
        l.arg(&out_addr)
            .arg(&x_addr)
            .arg(&batches)
            .arg(&xs)
            .arg(&ys)
            .arg(&ld)
            .arg(&bs)
            .arg(&ahead);
        // SAFETY: geometry() and check_out() proved that every element the kernel touches lies in
        // x's and out's buffers (views are bounds-checked at creation; the kernel reads
        // b*bs + i*ld + j and writes b*X*Y + j*X + i for in-range b, i, j only, the staged path's
        // bounds checks relying on its grid x being exactly its tile count along x, as
        // tile_config() sets it), the staged path is taken only with 16-byte aligned rows, and
        // both buffers outlive the stream-ordered launch.
        unsafe { l.launch(cfg) }.ctx("launching tk_batched_transpose")?;
        Ok(())
    }

    /// The staged-tile path's tiling for `e`-byte elements on a device with `sms` SMs, a rule
    /// fitted to the H200 measurements of every tiling at upstream's shapes (tk-transpose
    /// PERF.md): large problems (at least 16 blocks per SM) keep 128-byte output row pieces with
    /// `e` bands (every thread moves 64 bytes), 2 for a single e4m3 matrix; mid-sized ones take
    /// 4 bands of the tallest piece (at most 128 bytes) that keeps the tile within [`Tiling::MAX_TILE_BYTES`] (e4m3: 64-byte
    /// pieces, bf16: 128, fp32: 128) while that still gives every SM a block, except where they
    /// give fewer than 2 blocks per SM and pad the last tile along y more than the large tiling
    /// (576-wide rows: bf16 1152 -> 1536 bytes with 4 bands, 1280 with 2; e4m3 576 -> 1024 with
    /// 4 bands, 640 with 1): those keep the large tiling (H200, session 11: 4032x576 bf16, 189
    /// wide blocks, 4.37 -> 4.22 µs; 8064x576 e4m3, 252, 4.62 -> 4.45 µs; but 8064x576 bf16,
    /// 378 wide blocks, 6.53 -> 6.74 µs, so it stays wide); smaller ones 64-byte pieces in one
    /// band.
    fn pick_tiling(g: &Geometry, e: usize, sms: usize) -> Tiling {
        let blocks = |t: &Tiling| {
            let (nx, ny) = tile_counts(g, e, t);
            nx * ny * g.batches
        };
        let large = Tiling::new(e, Tiling::ROW_BYTES[0]);
        // 4 bands of 128 bytes: MAX_TILE_BYTES / 512 rows at most.
        let wide = Tiling {
            rows: (Tiling::MAX_TILE_BYTES / (4 * 128)).min(Tiling::ROW_BYTES[0] / e),
            bands: 4,
        };
        // Elements along y that the tiles of `t` cover (the last one padded).
        let padded = |t: &Tiling| g.y.div_ceil(t.cols(e)) * t.cols(e);
        if blocks(&large) >= 16 * sms {
            // One e4m3 matrix: 2 bands (32 KB tiles; H200, session 14, 4 interleaved rounds:
            // 8064x7168 31.09-31.28 -> 30.80-30.99 µs, 8064x6144 27.02-27.22 -> 26.67-26.82);
            // batched e4m3 keeps 1 band (8x8064x7168 228.4 -> 230.7 µs with 2).
            if e == 1 && g.batches == 1 {
                Tiling { bands: 2, ..large }
            } else {
                large
            }
        } else if blocks(&wide) >= sms {
            if blocks(&wide) < 2 * sms && padded(&wide) > padded(&large) {
                large
            } else {
                wide
            }
        } else {
            Tiling {
                rows: Tiling::ROW_BYTES[1] / e,
                bands: 1,
            }
        }
    }

    /// Whether a staged launch of `tiles` tiles of `e`-byte elements issues its loads without
    /// branches (`TK_LEAN`): e4m3 launches of at least 4 tiles per SM. The branch-free form
    /// issues a tile's loads in about half the instructions (sm_90a: the 8 loads of a 128-row
    /// 2-band e4m3 tile end at instruction ~230 instead of ~370). H200, session 18
    /// (tk-transpose PERF.md; D4, this rule against main, 3 interleaved rounds): 8064x2560 e4m3
    /// 12.22-12.26 -> 11.82-11.95 µs, 4032x6144 14.32-14.40 -> 14.02-14.06, 8064x3072 / 8064x4096
    /// / 4032x7168 2 % faster, 8x8064x576 1.8 %, 8064x7168 30.78-30.82 -> 30.62-30.80; bf16 and
    /// smaller launches keep the branches, as the branch-free form measured slower there (D2,
    /// D3: 4032x2560 / 4032x3072 e4m3, 315 and 378 tiles, 5-6 %; 4032x576 bf16 2 %).
    fn lean_loads(e: usize, tiles: usize, sms: usize) -> bool {
        e == 1 && tiles >= 4 * sms
    }

    /// The staged kernel's L2 prefetch distance in blocks (its `ahead` argument; 0: none) for a
    /// launch of `e`-byte elements, `batches` matrices, `ny` tiles along y and `pad` bytes of
    /// [`residency_pad`] on `sms` SMs. Large one-matrix bf16 launches (held to
    /// [`LARGE_RESIDENT`] blocks per SM) prefetch the tile of the block half a resident wave
    /// further in launch order: each block has L2 fetch that tile's input rows while its own
    /// copies are in flight. H200, session 20 (tk-transpose/PERF.md; 4 interleaved rounds in
    /// each of two runs): 4032x7168 bf16 30.70-30.83 -> 30.37-30.48 µs, 8064x2560 23.01-23.07 ->
    /// 22.67-22.75, 8064x3072 26.80-26.85 -> 26.53-26.57, 8064x6144 50.85-51.15 -> 50.41-50.91,
    /// 8064x7168 59.26-59.41 -> 59.04-59.12; a quarter wave or three quarters gained less, a
    /// whole wave or two were 3 % / 19-29 % slower. e4m3 launches (32 KB tiles) got slower with
    /// any distance (8064x7168 30.6-30.7 µs -> 31.0-31.3 at 66 blocks, 32.4-32.6 at half a wave),
    /// so they, the batched launches (97 % of the ceiling without it) and the unmeasured 2-D
    /// fp32 launches take none; nor do launches whose grid y loops (the kernel maps blocks to
    /// tiles through the grid).
    fn prefetch_ahead(e: usize, batches: usize, ny: usize, pad: usize, sms: usize) -> u32 {
        if e == 2 && batches == 1 && pad > 0 && ny <= 65535 {
            (LARGE_RESIDENT / 2 * sms) as u32
        } else {
            0
        }
    }

    /// Resident blocks per SM that [`residency_pad`] holds large launches to.
    const LARGE_RESIDENT: usize = 4;

    /// Unused dynamic shared memory per block (bytes) that holds a staged launch of `tiles`
    /// tiles of `t` to [`LARGE_RESIDENT`] blocks per SM, or 0 for no limit. The limit applies
    /// to large launches (the bytes of at least 16 large tiles per SM, the large tiling's
    /// threshold in [`pick_tiling`]) of tiles of at least 16 KB, of which 6 would otherwise be
    /// resident (the kernel's launch bounds; 16 KB tiles could fit 13 by their shared memory).
    /// Fewer tiles in flight per SM move the same bytes faster at these sizes (as the 1:1
    /// streams of tk-core's `ceilings` bench: fewer bytes in flight per SM, faster). H200,
    /// session 16 (tk-transpose/PERF.md; this form, 4 interleaved rounds against main):
    /// 8x8064x7168 e4m3 228.3-228.5 -> 225.7-226.0 µs, bf16 453.5-453.9 -> 448.8-448.9 (upstream
    /// 451.5), fp32 905.2-905.6 -> 895.9-896.3, 78 of the 84 batched rows 0.3-1.4 % faster;
    /// 8064x7168 e4m3 30.93-31.01 -> 30.70-30.85, bf16 58.96-59.78 -> 59.25-59.41 (D2, the
    /// same limit by tile count, 3 rounds: 59.66-59.71 -> 59.07-59.33); slower: batched
    /// 8064x576 e4m3 0.4-1.4 %, 2-D bf16 8064x2560 / 8064x3072 / 4032x6144 0.4-0.7 %. 3 and 5
    /// blocks per SM (session 16, D1) were slower than 4 at the large shapes, and 4 blocks of
    /// smaller tiles slower than no limit (8 KB 4-11 %, 2-4 KB 31-89 %: too few bytes in
    /// flight), as was the mid-sized 4032x2048 bf16 launch with 4 (1 %).
    fn residency_pad(p: &DeviceProps, t: &Tiling, tiles: usize) -> usize {
        if tiles * t.tile_bytes() < 16 * p.sm_count as usize * BIG_TILE {
            return 0;
        }
        pad_bytes(p, t)
    }

    /// The large tiling's tile bytes.
    const BIG_TILE: usize = 16 << 10;

    /// The unused dynamic shared memory per block that leaves [`LARGE_RESIDENT`] blocks of `t`
    /// per SM, for tiles of at least 16 KB (0 for smaller ones): 1 KB below the SM's share per
    /// block, so the allocation granularity cannot round a block past its share, and one block
    /// more does not fit (5 × (share - 1 KB) > SM).
    fn pad_bytes(p: &DeviceProps, t: &Tiling) -> usize {
        if t.tile_bytes() < BIG_TILE {
            return 0;
        }
        (p.smem_per_sm / LARGE_RESIDENT)
            .saturating_sub(p.reserved_smem_per_block + t.tile_bytes() + 1024)
    }

    /// Tiles along x and y.
    fn tile_counts(g: &Geometry, e: usize, t: &Tiling) -> (usize, usize) {
        (g.x.div_ceil(t.rows), g.y.div_ceil(t.cols(e)))
    }

    /// Launch shape of the staged-tile path. Blocks walk along x first (grid x: exactly one block
    /// per tile along x, which the kernel relies on; at most 2^29 since `X < 2^32` and a tile has
    /// at least 8 rows), then the tiles along y, then the batch (both loop in the kernel beyond
    /// the grid limits).
    fn tile_config(g: &Geometry, e: usize, t: Tiling) -> LaunchConfig {
        let (nx, ny) = tile_counts(g, e, &t);
        LaunchConfig {
            grid_dim: (nx as u32, ny.min(65535) as u32, g.batches.min(65535) as u32),
            block_dim: (t.threads(e) as u32, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Launch shape of the shared-memory path: one 32 × 32 tile per block of 32 × 8 threads.
    fn generic_config(g: &Geometry) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (
                g.y.div_ceil(32).min(i32::MAX as usize) as u32,
                g.x.div_ceil(32).min(65535) as u32,
                g.batches.min(65535) as u32,
            ),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn out_must_have_swapped_shape_and_be_contiguous() {
            let x = Layout::contiguous(&[2, 3, 5]);
            let out_shape = out_shape(&x);
            assert_eq!(out_shape, vec![2, 5, 3]);
            assert!(check_out(&Layout::contiguous(&out_shape), &out_shape).is_ok());
            assert!(matches!(
                check_out(&Layout::contiguous(&[2, 3, 5]), &out_shape),
                Err(TkError::Shape { arg: "out", .. })
            ));
            let strided = Layout::new(vec![2, 5, 3], vec![15, 1, 5], 0).unwrap();
            assert!(matches!(
                check_out(&strided, &out_shape),
                Err(TkError::Stride { arg: "out", .. })
            ));
        }

        #[test]
        fn tiling_covers_every_tile() {
            for e in [1usize, 2, 4] {
                let v = 16 / e;
                for (x, y, b) in [
                    (v, v, 1),
                    (64 * v, 3 * v, 2),
                    (4032, 576, 1),
                    (8064, 7168, 8),
                    (2_200_000, 4, 1),
                    (16, 70_000 * 16, 1),
                ] {
                    if x % v != 0 || y % v != 0 {
                        continue;
                    }
                    let g = Geometry {
                        batches: b,
                        x,
                        y,
                        ld: y,
                        bs: x * y,
                    };
                    let picked = pick_tiling(&g, e, 132);
                    assert!(Tiling::supported(e).any(|s| s == picked));
                    for t in Tiling::supported(e) {
                        let cfg = tile_config(&g, e, t);
                        // The kernel's constants: LX = rows / V output vectors per tile row,
                        // 32 · LX threads, 4 / E loads per thread and band.
                        assert_eq!(t.rows % v, 0);
                        assert_eq!(cfg.block_dim, (32 * (t.rows / v) as u32, 1, 1));
                        assert_eq!(t.threads(e), 32 * t.rows / v);
                        assert_eq!(t.bands * 128 / e, t.cols(e));
                        // Grid loops cover what one grid cannot: at least one block per axis.
                        assert!(cfg.grid_dim.1 >= 1 && cfg.grid_dim.2 >= 1);
                        assert_eq!(cfg.grid_dim.0 as usize, x.div_ceil(t.rows));
                        assert_eq!(cfg.grid_dim.1 as usize, y.div_ceil(t.cols(e)).min(65535));
                    }
                }
            }
        }

        #[test]
        fn supported_tilings() {
            for (e, n) in [(1, 8), (2, 9), (4, 9)] {
                assert_eq!(Tiling::supported(e).count(), n);
                for rb in Tiling::ROW_BYTES {
                    assert!(Tiling::supported(e).any(|t| t == Tiling::new(e, rb)));
                }
                assert!(Tiling::supported(e).all(|t| t.tile_bytes() <= Tiling::MAX_TILE_BYTES));
            }
        }

        #[test]
        fn tiling_rule_fills_the_device() {
            let g = |x: usize, y: usize| Geometry {
                batches: 1,
                x,
                y,
                ld: 2 * y,
                bs: 0,
            };
            let wide = |e: usize| Tiling {
                rows: (64 * e).min(128) / e,
                bands: 4,
            };
            let narrow = |e: usize| Tiling {
                rows: 64 / e,
                bands: 1,
            };
            // Large problems: 128-byte output row pieces (one e4m3 matrix: 2 bands; batched
            // e4m3: 1).
            let two_bands = Tiling {
                rows: 128,
                bands: 2,
            };
            assert_eq!(pick_tiling(&g(8064, 7168), 1, 132), two_bands);
            assert_eq!(pick_tiling(&g(8064, 6144), 1, 132), two_bands);
            let batched = Geometry {
                batches: 8,
                bs: 8064 * 14336,
                ..g(8064, 7168)
            };
            assert_eq!(pick_tiling(&batched, 1, 132), Tiling::new(1, 128));
            assert_eq!(pick_tiling(&g(8064, 7168), 2, 132), Tiling::new(2, 128));
            // 8064 x 4096 e4m3: 2016 large tiles, under 16 per SM: mid-sized.
            assert_ne!(pick_tiling(&g(8064, 4096), 1, 132), two_bands);
            // Mid-sized: 4 bands of 64-byte (e4m3) or 128-byte (bf16) pieces.
            assert_eq!(pick_tiling(&g(4032, 2048), 1, 132), wide(1));
            assert_eq!(pick_tiling(&g(4032, 3072), 1, 132), wide(1));
            // ... unless 4 bands pad the last tile more with < 2 blocks per SM (576-wide rows).
            assert_eq!(pick_tiling(&g(4032, 576), 2, 132), Tiling::new(2, 128));
            assert_eq!(pick_tiling(&g(8064, 576), 1, 132), Tiling::new(1, 128));
            assert_eq!(pick_tiling(&g(8064, 576), 2, 132), wide(2));
            assert_eq!(pick_tiling(&g(4032, 2560), 2, 132), wide(2));
            // 4032 x 576 e4m3 has 126 wide tiles for 132 SMs: one band.
            assert_eq!(pick_tiling(&g(4032, 576), 1, 132), narrow(1));
            assert_eq!(pick_tiling(&g(16, 16), 4, 132), narrow(4));
        }

        #[test]
        fn residency_pad_holds_large_launches_of_big_tiles_to_4_blocks_per_sm() {
            // The H200's numbers: 228 KB per SM, 1 KB reserved per block.
            let h200 = DeviceProps {
                ordinal: 0,
                name: "H200".into(),
                compute_capability: (9, 0),
                sm_count: 132,
                l2_bytes: 60 << 20,
                max_smem_per_block_optin: 227 << 10,
                smem_per_sm: 228 << 10,
                reserved_smem_per_block: 1 << 10,
                arch: "sm_90a".into(),
            };
            let large = 16 * 132;
            let resident =
                |t: &Tiling, pad: usize| (228 << 10) / (t.tile_bytes() + pad + (1 << 10));
            for t in [
                Tiling::new(1, 128),
                Tiling::new(2, 128),
                Tiling::new(4, 128),
            ] {
                assert_eq!(t.tile_bytes(), 16 << 10);
                let pad = residency_pad(&h200, &t, large);
                assert_eq!(resident(&t, pad), 4, "{t:?}");
            }
            let two_bands = Tiling {
                rows: 128,
                bands: 2,
            };
            let pad = residency_pad(&h200, &two_bands, large);
            assert_eq!(resident(&two_bands, pad), 4);
            assert!(two_bands.tile_bytes() + pad <= h200.max_smem_per_block_optin);
            // 8064x7168 e4m3 in 32 KB tiles: 1764 tiles, as many bytes as 3528 large tiles.
            assert!(residency_pad(&h200, &two_bands, 1764) > 0);
            // Smaller launches and smaller tiles: no limit.
            assert_eq!(residency_pad(&h200, &two_bands, large / 2 - 1), 0);
            assert_eq!(residency_pad(&h200, &Tiling::new(2, 128), large - 1), 0);
            let small = Tiling { rows: 64, bands: 1 };
            assert_eq!(residency_pad(&h200, &small, 8 * large), 0);
        }

        #[test]
        fn prefetch_ahead_for_large_one_matrix_bf16_launches() {
            // Half of the 4 resident blocks per SM of a padded launch on 132 SMs.
            assert_eq!(prefetch_ahead(2, 1, 112, 24 << 10, 132), 264);
            assert_eq!(prefetch_ahead(2, 1, 65535, 1, 132), 264);
            // Not for e4m3 or 4-byte elements, batches, unpadded launches or a looping grid y.
            assert_eq!(prefetch_ahead(1, 1, 28, 24 << 10, 132), 0);
            assert_eq!(prefetch_ahead(4, 1, 112, 24 << 10, 132), 0);
            assert_eq!(prefetch_ahead(2, 8, 112, 24 << 10, 132), 0);
            assert_eq!(prefetch_ahead(2, 1, 112, 0, 132), 0);
            assert_eq!(prefetch_ahead(2, 1, 65536, 24 << 10, 132), 0);
        }

        #[test]
        fn lean_loads_for_e4m3_launches_of_4_tiles_per_sm() {
            // 8064x2560 e4m3 in 64-row x 4-band tiles: 630 tiles on 132 SMs; 4032x3072: 378.
            assert!(lean_loads(1, 630, 132));
            assert!(lean_loads(1, 528, 132));
            assert!(!lean_loads(1, 527, 132));
            assert!(!lean_loads(1, 378, 132));
            for e in [2, 4] {
                assert!(!lean_loads(e, 1 << 20, 132));
            }
            // Every launchable (tiling, form) is registered: both lean forms for e4m3, both
            // prefetch forms for bf16 tiles of at least 16 KB.
            let specs = registered_kernels();
            let staged = |e: usize| Tiling::supported(e).count();
            let big_bf16 = Tiling::supported(2)
                .filter(|t| t.tile_bytes() >= BIG_TILE)
                .count();
            assert!(big_bf16 > 0);
            assert_eq!(
                specs.len(),
                2 * staged(1) + staged(2) + big_bf16 + staged(4) + 3
            );
        }
    }
}
