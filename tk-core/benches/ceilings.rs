//! Streaming ceilings: the bandwidth of a pure data stream whose read : write byte ratio is that
//! of an op (casts narrow 2:1 .. 8:1, casts back widen 1:2 .. 1:8, transposes copy 1:1), at the
//! op's byte counts, measured like every op (CUPTI kernel time, L2 flushed, median) beside the
//! same run's 1 GiB copy ceiling. Every op's `% of copy ceiling` is against the 1:1 copy; these
//! rows say how much of that a stream of the op's own shape can reach. On the H200 the launch
//! shape matters most for write-heavy streams: a 1:4 stream of 287 MB reached 81 % with 8
//! long-lived CTAs per SM and 91.5 % with 32 short ones (tk-quant PERF.md, session 6).
//!
//! Kernel: `tk-core/cuda/stream.cu` (items of R 16-byte vectors in, W out, every store waiting
//! for its loads), 256-thread blocks, 8, 32 or 128 blocks per SM, plain or streaming (`.cs`)
//! stores.
//!
//! Run: `cargo xtask bench ceilings` (or the gpu-bundle); args: `[filter] [--jsonl <path>]`.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use tk_core::bench::{stream_kernel_spec, Bench};
use tk_core::error::DriverContext;
use tk_core::Result;

/// (shape the stream stands for, input bytes, vectors read, vectors written per item).
const CASES: &[(&str, usize, u32, u32)] = &[
    ("transpose 4032x576 e4m3", 4032 * 576, 1, 1),
    ("transpose 4032x576 bf16", 4032 * 576 * 2, 1, 1),
    ("transpose 8064x7168 e4m3", 8064 * 7168, 1, 1),
    ("transpose 8064x7168 bf16", 8064 * 7168 * 2, 1, 1),
    ("cast 8001x7168 bf16->e4m3", 8001 * 7168 * 2, 2, 1),
    ("cast 8001x7168 bf16->e2m1", 8001 * 7168 * 2, 4, 1),
    ("cast 8001x7168 fp32->e4m3", 8001 * 7168 * 4, 4, 1),
    ("cast 8001x7168 fp32->e2m1", 8001 * 7168 * 4, 8, 1),
    ("cast_back 8001x7168 e4m3->bf16", 8001 * 7168, 1, 2),
    ("cast_back 8001x7168 e4m3->fp32", 8001 * 7168, 1, 4),
    ("cast_back 8001x7168 e2m1->bf16", 8001 * 7168 / 2, 1, 4),
    ("cast_back 8001x7168 e2m1->fp32", 8001 * 7168 / 2, 1, 8),
];

fn main() -> Result<()> {
    let Some(mut b) = Bench::from_args()? else {
        return Ok(());
    };
    let dev = b.device().clone();
    let max_in = CASES.iter().map(|c| c.1).max().unwrap_or(0);
    let max_out = CASES
        .iter()
        .map(|c| c.1 / c.2 as usize * c.3 as usize)
        .max()
        .unwrap_or(0);
    let src = dev.alloc::<u8>(&[max_in])?;
    let mut dst = dev.alloc::<u8>(&[max_out])?;
    let (src_addr, dst_addr) = (src.view().address(), dst.view_mut().address());
    let sms = dev.props().sm_count;
    for &(shape, in_bytes, r, w) in CASES {
        let items = (in_bytes / (16 * r as usize)) as u64;
        let bytes = 16 * items as usize * (r + w) as usize;
        for cs in [false, true] {
            let f = dev.function(&stream_kernel_spec(r, w, cs))?;
            for per_sm in [8u32, 32, 128] {
                let params = format!(
                    "{r}:{w} as {shape}, {per_sm}/SM{}",
                    if cs { ", .cs stores" } else { "" }
                );
                let cfg = LaunchConfig {
                    grid_dim: (sms * per_sm, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                b.run("stream", &params, bytes, || {
                    let mut l = dev.stream().launch_builder(&f);
                    l.arg(&dst_addr).arg(&src_addr).arg(&items);
                    // SAFETY: src holds r * items and dst w * items 16-byte vectors (at most
                    // max_in / max_out bytes), both live until the stream-ordered frees.
                    unsafe { l.launch(cfg) }
                        .map(|_| ())
                        .ctx("launching the stream probe")
                })?;
            }
        }
    }
    b.finish()?;
    Ok(())
}
