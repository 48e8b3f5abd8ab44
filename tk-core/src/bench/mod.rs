//! Benchmark support, following upstream's method (`spec/quant.md` §4.4) so numbers compare
//! row by row with `bench/upstream-h200.md`:
//!
//! * device time per call: the summed CUPTI kernel durations of the call (upstream's measure:
//!   no launch gaps, no event overhead), or, where CUPTI can't be loaded, CUDA events recorded
//!   right around the call (which add a fixed overhead, printed as the "timing floor"); every
//!   record also carries the event time;
//! * the host time per call: the median CPU time of enqueuing one call (the op's checks, its
//!   kernel lookup and the driver's launch calls; with CUPTI on, its launch callback too), which
//!   a CPU-bound caller pays per op outside CUDA graphs;
//! * the L2 cache flushed before every timed call, so small shapes are measured cold, as
//!   upstream's CUPTI harness does: a zero-fill kernel over max(256 MiB, 2 × L2) with 16-byte
//!   stores, the form of upstream's flush (`torch.zero_()` of a 256 MB int32 buffer, an
//!   elementwise kernel); `TK_BENCH_FLUSH=memset` flushes with `cuMemsetD8Async` instead, the
//!   method of the sessions before 19 (small shapes measure 0.5-3 % slower after it: the
//!   flush's write-back is still draining when the timed kernel starts);
//! * warm-up calls first (they also compile), then the **median** of [`TIMED_CALLS`] calls;
//! * bytes moved = each input read once + each output written once (the op's own count);
//! * the device copy ceiling measured in the same run: a 16-byte-vectorised device-to-device
//!   copy of 1 GiB, counting bytes read plus bytes written, best of several grid sizes.
//!
//! Results print as a table and, with `--jsonl <path>`, append one JSON object per line.
//! A bench executable takes optional positional filters (also comma-separated): only cases
//! whose `op/params` key contains one of them run.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};

mod cupti;

use crate::device::Device;
use crate::error::{DriverContext, Result, TkError};
use crate::kernel::{self, DiskCache, KernelSource, KernelSpec};
use crate::tensor::DeviceTensor;

/// Timed calls per case (the median is reported).
pub const TIMED_CALLS: usize = 50;
/// Untimed warm-up calls per case.
pub const WARMUP_CALLS: usize = 3;

static COPY_SRC: KernelSource = KernelSource {
    file: "copy.cu",
    entry: "tk_copy16",
    code: include_str!("../../cuda/copy.cu"),
    headers: &[],
    needs_cuda_headers: false,
};

/// The copy-ceiling kernel (registered for compile checks).
pub fn copy_kernel_spec() -> KernelSpec {
    KernelSpec::new(&COPY_SRC)
}

static STREAM_SRC: KernelSource = KernelSource {
    file: "stream.cu",
    entry: "tk_stream",
    code: include_str!("../../cuda/stream.cu"),
    headers: &[],
    needs_cuda_headers: false,
};

static FILL_SRC: KernelSource = KernelSource {
    file: "fill.cu",
    entry: "tk_fill16",
    code: include_str!("../../cuda/fill.cu"),
    headers: &[],
    needs_cuda_headers: false,
};

/// The bench's L2 flush kernel (registered for compile checks): arguments `dst` (`n16`
/// 16-byte vectors), `n16: u64`; 128-thread blocks, each zeroing 512 vectors.
pub fn fill_kernel_spec() -> KernelSpec {
    KernelSpec::new(&FILL_SRC)
}

/// Read and write widths (16-byte vectors per item) of the streaming probe.
pub const STREAM_WIDTHS: [u32; 4] = [1, 2, 4, 8];

/// The streaming-probe kernel (`cuda/stream.cu`, launched by the `ceilings` bench): each item
/// reads `reads` and writes `writes` 16-byte vectors (each of [`STREAM_WIDTHS`]), with
/// `st.global.cs` stores when `streaming_stores`. Arguments: `dst` (`writes` × items vectors),
/// `src` (`reads` × items vectors), `items: u64`; 256-thread blocks, any grid.
pub fn stream_kernel_spec(reads: u32, writes: u32, streaming_stores: bool) -> KernelSpec {
    KernelSpec::new(&STREAM_SRC)
        .define("TK_R", reads)
        .define("TK_W", writes)
        .define("TK_CS", streaming_stores as u8)
}

/// Every specialisation of the streaming probe (for compile checks): one side 1 vector wide.
pub fn stream_kernel_specs() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for w in STREAM_WIDTHS {
        for cs in [false, true] {
            v.push(stream_kernel_spec(1, w, cs));
            if w > 1 {
                v.push(stream_kernel_spec(w, 1, cs));
            }
        }
    }
    v
}

/// One benchmark result.
#[derive(Debug, Clone)]
pub struct Record {
    /// Op name, e.g. `transpose`.
    pub op: String,
    /// Parameters, e.g. `8064x7168 bf16`.
    pub params: String,
    /// Median device time per call, µs.
    pub median_us: f64,
    /// Fastest call, µs.
    pub min_us: f64,
    /// Bytes the call must move.
    pub bytes: usize,
    /// `bytes / median` in GB/s (1e9 B/s).
    pub gbs: f64,
    /// `gbs` as a percentage of the same-run copy ceiling.
    pub pct_of_ceiling: f64,
    /// Median CUDA-event time per call (includes launch overhead), µs.
    pub event_us: f64,
    /// Median host (CPU) time to enqueue one call, µs: argument checks, the kernel lookup and
    /// the driver's launch calls, with the GPU busy on earlier work.
    pub host_us: f64,
    /// How `median_us` was measured: `cupti` (kernel time) or `events`.
    pub method: &'static str,
}

/// A benchmark session on one device. See the module docs.
pub struct Bench {
    dev: Device,
    flush: DeviceTensor<u8>,
    ceiling_gbs: f64,
    filters: Vec<String>,
    jsonl: Option<PathBuf>,
    records: Vec<Record>,
    cupti: bool,
    /// The flush kernel, or `None` with `TK_BENCH_FLUSH=memset` (a memset).
    fill: Option<cudarc::driver::CudaFunction>,
}

impl Bench {
    /// Parses the bench executable's arguments (`[filter...] [--jsonl <path>]`; cargo's `--bench`
    /// is ignored), opens GPU 0 and measures the copy ceiling. Returns `Ok(None)` with a printed
    /// reason when there is no usable GPU (an error with `TK_REQUIRE_GPU=1`).
    pub fn from_args() -> Result<Option<Self>> {
        let mut filters: Vec<String> = Vec::new();
        let mut jsonl = None;
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            match a.as_str() {
                "--jsonl" => jsonl = args.next().map(PathBuf::from),
                s if s.starts_with("--") => {}
                s => filters.extend(s.split(',').map(str::to_string)),
            }
        }
        let dev = match Device::new(0) {
            Ok(d) => d,
            Err(e) if crate::testing::gpu_required() => return Err(e),
            Err(e) => {
                println!("bench skipped: no usable GPU ({e})");
                return Ok(None);
            }
        };
        let flush_bytes = (256usize << 20).max(2 * dev.props().l2_bytes);
        let flush = dev.alloc::<u8>(&[flush_bytes])?;
        let mut b = Self {
            dev,
            flush,
            ceiling_gbs: 0.0,
            filters,
            jsonl,
            records: Vec::new(),
            cupti: false,
            fill: None,
        };
        if std::env::var("TK_BENCH_FLUSH").map_or(true, |v| v != "memset") {
            b.fill = Some(b.dev.function(&fill_kernel_spec())?);
        }
        b.ceiling_gbs = b.measure_copy_ceiling()?;
        let floor = b.timing_floor_us()?;
        b.cupti = cupti::enable();
        println!(
            "timing: {}",
            if b.cupti {
                "CUPTI kernel time per call (upstream's method), L2 flushed before each call"
            } else {
                "CUDA events (CUPTI not loadable: add its lib folder to LD_LIBRARY_PATH for kernel-only times)"
            }
        );
        let p = b.dev.props();
        println!(
            "device: {} ({}, {} SMs, {} MiB L2); copy ceiling {:.0} GB/s (1 GiB D2D copy, read+write, best of \
             16-byte kernel and cuMemcpyDtoD); timing floor {floor:.2} µs (empty kernel, L2 flushed, median)",
            p.name,
            p.arch,
            p.sm_count,
            p.l2_bytes >> 20,
            b.ceiling_gbs
        );
        Ok(Some(b))
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The copy ceiling of this run in GB/s.
    pub fn ceiling_gbs(&self) -> f64 {
        self.ceiling_gbs
    }

    /// True if the case `op/params` contains one of the filters (or there are none).
    pub fn enabled(&self, op: &str, params: &str) -> bool {
        let key = format!("{op}/{params}");
        self.filters.is_empty() || self.filters.iter().any(|f| key.contains(f.as_str()))
    }

    fn measure_copy_ceiling(&self) -> Result<f64> {
        const BYTES: usize = 1 << 30;
        let src = self.dev.alloc::<u8>(&[BYTES])?;
        let mut dst = self.dev.alloc::<u8>(&[BYTES])?;
        let dst_addr = dst.view_mut().address();
        let f = self.dev.function(&copy_kernel_spec())?;
        let n16 = (BYTES / 16) as u64;
        let src_addr = src.view().address();
        let sms = self.dev.props().sm_count;
        let mut best = 0f64;
        for blocks_per_sm in [4u32, 8, 16, 32] {
            let cfg = LaunchConfig {
                grid_dim: (sms * blocks_per_sm, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let times = self.time_calls(10, false, || {
                let mut l = self.dev.stream().launch_builder(&f);
                l.arg(&dst_addr).arg(&src_addr).arg(&n16);
                // SAFETY: both buffers hold n16 16-byte elements and outlive the launch (stream-ordered frees).
                unsafe { l.launch(cfg) }
                    .map(|_| ())
                    .ctx("launching the copy kernel")
            })?;
            best = best.max(2.0 * BYTES as f64 / median(&event_us(&times)) / 1e3);
        }
        // The driver's own device-to-device copy, in case it beats the kernel on this device.
        let times = self.time_calls(10, false, || {
            let (s, d) = (src.buffer(), dst.buffer_mut());
            self.dev.stream().memcpy_dtod(s, d).ctx("cuMemcpyDtoDAsync")
        })?;
        Ok(best.max(2.0 * BYTES as f64 / median(&event_us(&times)) / 1e3))
    }

    /// The median time of an empty launch measured like an op: what the timing method itself adds.
    fn timing_floor_us(&self) -> Result<f64> {
        let f = self.dev.function(&copy_kernel_spec())?;
        let (zero, null) = (0u64, 0u64);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let times = self.time_calls(TIMED_CALLS, true, || {
            let mut l = self.dev.stream().launch_builder(&f);
            l.arg(&null).arg(&null).arg(&zero);
            // SAFETY: with n16 = 0 the kernel touches no memory.
            unsafe { l.launch(cfg) }
                .map(|_| ())
                .ctx("launching an empty copy")
        })?;
        Ok(median(&event_us(&times)))
    }

    /// Enqueues the L2 flush: a memset of the flush buffer at `ptr`, or the fill kernel.
    fn flush_l2(&self, ptr: u64) -> Result<()> {
        let bytes = self.flush.buffer().len();
        match &self.fill {
            Some(f) => {
                let n16 = (bytes / 16) as u64;
                let cfg = LaunchConfig {
                    grid_dim: (n16.div_ceil(128 * 4) as u32, 1, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut l = self.dev.stream().launch_builder(f);
                l.arg(&ptr).arg(&n16);
                // SAFETY: the flush buffer is live and holds n16 16-byte vectors (its size is a
                // multiple of 16); the kernel writes only those.
                unsafe { l.launch(cfg) }
                    .map(|_| ())
                    .ctx("flushing L2 (fill kernel)")
            }
            // SAFETY: the flush buffer is live and holds `bytes` bytes.
            None => unsafe {
                cudarc::driver::result::memset_d8_async(
                    ptr,
                    0,
                    bytes,
                    self.dev.stream().cu_stream(),
                )
            }
            .ctx("flushing L2"),
        }
    }

    /// Times `calls` calls of `f` with events, optionally flushing L2 before each: per call, the
    /// event time and the host time to enqueue it, µs.
    fn time_calls(
        &self,
        calls: usize,
        flush: bool,
        mut f: impl FnMut() -> Result<()>,
    ) -> Result<Vec<CallTime>> {
        for _ in 0..WARMUP_CALLS {
            f()?;
        }
        let mut events = Vec::with_capacity(calls);
        let flush_view = self.flush.view();
        for _ in 0..calls {
            if flush {
                self.flush_l2(flush_view.address())?;
            }
            let start = self.dev.record_event(true)?;
            let t = Instant::now();
            f()?;
            let host_us = t.elapsed().as_secs_f64() * 1e6;
            events.push((start, self.dev.record_event(true)?, host_us));
        }
        self.dev.synchronize()?;
        events
            .iter()
            .map(|(a, b, host_us)| {
                a.elapsed_ms(b)
                    .ctx("reading event times")
                    .map(|ms| CallTime {
                        event_us: ms as f64 * 1e3,
                        host_us: *host_us,
                    })
            })
            .collect()
    }

    /// Benchmarks one case: `f` enqueues one call of the op; `bytes` is what one call must move.
    /// Skipped (no-op) when the filter excludes `op/params`.
    pub fn run(
        &mut self,
        op: &str,
        params: &str,
        bytes: usize,
        f: impl FnMut() -> Result<()>,
    ) -> Result<()> {
        if !self.enabled(op, params) {
            return Ok(());
        }
        if self.cupti {
            self.dev.synchronize()?;
            cupti::drain();
        }
        let calls = self.time_calls(TIMED_CALLS, true, f)?;
        let event_times = event_us(&calls);
        let kernel_times = if self.cupti {
            cupti::per_call_us(&cupti::drain(), TIMED_CALLS)
        } else {
            None
        };
        if self.cupti && kernel_times.is_none() {
            println!("warning: CUPTI records for {op}/{params} did not match {TIMED_CALLS} calls; using event times");
        }
        let (times, method) = match &kernel_times {
            Some(t) => (t, "cupti"),
            None => (&event_times, "events"),
        };
        let med = median(times);
        let min = times.iter().cloned().fold(f64::INFINITY, f64::min);
        let gbs = bytes as f64 / med / 1e3;
        let r = Record {
            op: op.into(),
            params: params.into(),
            median_us: med,
            min_us: min,
            bytes,
            gbs,
            pct_of_ceiling: 100.0 * gbs / self.ceiling_gbs,
            event_us: median(&event_times),
            host_us: median(&calls.iter().map(|c| c.host_us).collect::<Vec<_>>()),
            method,
        };
        println!(
            "{:<22} {:<34} {:>9.2} µs {:>7.0} GB/s {:>5.1} %  (events {:.2} µs, host {:.2} µs)",
            r.op, r.params, r.median_us, r.gbs, r.pct_of_ceiling, r.event_us, r.host_us
        );
        self.records.push(r);
        Ok(())
    }

    /// Measures and prints (a) a cold NVRTC compile of `spec` and (b) a load of it from a fresh
    /// disk cache (read + validate + module load), both in ms.
    pub fn report_compile_times(&mut self, spec: &KernelSpec) -> Result<()> {
        let arch = self.dev.props().arch.clone();
        let t = Instant::now();
        let compiled = kernel::compile(spec, &arch)?;
        let cold_ms = t.elapsed().as_secs_f64() * 1e3;
        let dir = std::env::temp_dir().join(format!("tk-bench-cache-{}", std::process::id()));
        let cache = DiskCache::new(&dir);
        let key = spec.cache_key(&arch)?;
        cache.store(&key, &compiled.image)?;
        let t = Instant::now();
        let (cubin, outcome) = kernel::cubin_with_cache(spec, &arch, &key, Some(&cache))?;
        let module = self
            .dev
            .context()
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .ctx("loading a cached module")?;
        let _f = module
            .load_function(spec.source().entry)
            .ctx("looking up the kernel entry point")?;
        let load_ms = t.elapsed().as_secs_f64() * 1e3;
        let _ = std::fs::remove_dir_all(&dir);
        if outcome != kernel::CacheOutcome::Hit {
            return Err(TkError::param(
                "cache",
                "disk-cache entry just written was not read back",
            ));
        }
        println!(
            "compile {} [{}] for {arch}: cold NVRTC compile {cold_ms:.1} ms; load from disk cache {load_ms:.2} ms",
            spec.source().entry,
            spec.describe()
        );
        self.write_jsonl(&format!(
            "{{\"kind\":\"compile\",\"kernel\":\"{}\",\"arch\":\"{arch}\",\"cold_compile_ms\":{cold_ms:.3},\"disk_cache_load_ms\":{load_ms:.3}}}",
            json_escape(spec.source().entry)
        ))
    }

    fn write_jsonl(&self, line: &str) -> Result<()> {
        let Some(path) = &self.jsonl else {
            return Ok(());
        };
        let io = |source| TkError::Io {
            path: path.display().to_string(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        writeln!(f, "{line}").map_err(io)
    }

    /// Prints the summary table and appends the records to the JSONL file.
    pub fn finish(self) -> Result<Vec<Record>> {
        let p = self.dev.props();
        println!(
            "\n| op | params | µs (median) | GB/s | % of copy ceiling ({:.0} GB/s) | event µs | host µs |\n|---|---|---:|---:|---:|---:|---:|",
            self.ceiling_gbs
        );
        for r in &self.records {
            println!(
                "| {} | {} | {:.2} | {:.0} | {:.1} % | {:.2} | {:.2} |",
                r.op, r.params, r.median_us, r.gbs, r.pct_of_ceiling, r.event_us, r.host_us
            );
            self.write_jsonl(&format!(
                "{{\"kind\":\"bench\",\"op\":\"{}\",\"params\":\"{}\",\"median_us\":{:.3},\"min_us\":{:.3},\"event_us\":{:.3},\"host_us\":{:.3},\"method\":\"{}\",\"bytes\":{},\"gbs\":{:.1},\"pct_of_ceiling\":{:.2},\"ceiling_gbs\":{:.1},\"device\":\"{}\"}}",
                json_escape(&r.op),
                json_escape(&r.params),
                r.median_us,
                r.min_us,
                r.event_us,
                r.host_us,
                r.method,
                r.bytes,
                r.gbs,
                r.pct_of_ceiling,
                self.ceiling_gbs,
                json_escape(&p.name)
            ))?;
        }
        Ok(self.records)
    }
}

/// One timed call: its CUDA-event time and the host time to enqueue it, µs.
struct CallTime {
    event_us: f64,
    host_us: f64,
}

fn event_us(calls: &[CallTime]) -> Vec<f64> {
    calls.iter().map(|c| c.event_us).collect()
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => 0.5 * (s[n / 2 - 1] + s[n / 2]),
    }
}

fn json_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '"' => vec!['\\', '"'],
            '\\' => vec!['\\', '\\'],
            c if (c as u32) < 0x20 => format!("\\u{:04x}", c as u32).chars().collect(),
            c => vec![c],
        })
        .collect()
}
