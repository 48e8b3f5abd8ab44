//! Quick start: a batched transpose `(B, X, Y) -> (B, Y, X)` of random bf16 data.
//!
//! On a usable GPU (sm_90 or newer, NVRTC 13 loadable) it runs the CUDA kernel and reports the
//! first-call time (which includes the NVRTC compile or the kernel disk-cache load) and the
//! steady-state time per call, then checks the result bit for bit against the CPU reference.
//! Without a GPU, or if the GPU path returns an error (e.g. NVRTC not found), it prints why and
//! runs the CPU backend alone. Exit status 1 only on a GPU/CPU mismatch or a CPU error.
//!
//! Run: `cargo run --release -p tile-kernels --example quickstart`

use std::process::ExitCode;
use std::time::Instant;

use tile_kernels::core::{convert::bf16_from_f32, testing::Rng};
use tile_kernels::transpose::{batched_transpose, batched_transpose_into, reference};
use tile_kernels::{Device, Element, HostTensor, Result};

const SHAPE: [usize; 3] = [8, 4032, 2048]; // (B, X, Y)
const STEADY_CALLS: u32 = 20;

fn main() -> ExitCode {
    // `bf16_from_f32` returns `half::bf16`: the tensor is bf16 without naming the `half` crate.
    let x = Rng::new(42).randn(&SHAPE, bf16_from_f32);
    run(&x).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        ExitCode::FAILURE
    })
}

fn run<T: Element>(x: &HostTensor<T>) -> Result<ExitCode> {
    println!(
        "batched transpose: x {:?} {} (B, X, Y) -> (B, Y, X)",
        x.shape(),
        T::DTYPE
    );
    // Typed errors, never panics: no driver, no GPU, a pre-Hopper GPU, NVRTC missing, ...
    let gpu_out = match Device::new(0).and_then(|dev| on_gpu(&dev, x)) {
        Ok(out) => Some(out),
        Err(e) => {
            println!("no GPU run: {e}\n-> using the CPU backend");
            None
        }
    };
    let t = Instant::now();
    let cpu = reference::batched_transpose(&x.view())?; // the CPU backend
    let cpu_ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "CPU (tk_transpose::reference): out {:?}, {cpu_ms:.1} ms wall time",
        cpu.shape()
    );
    let Some(gpu) = gpu_out else {
        return Ok(ExitCode::SUCCESS);
    };
    let same = |(a, b): (&T, &T)| a.to_bits_u64() == b.to_bits_u64(); // NaN-safe, unlike `==`
    if gpu.shape() == cpu.shape() && gpu.as_slice().iter().zip(cpu.as_slice()).all(same) {
        println!("GPU output verified bit-exact against the CPU reference");
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("MISMATCH: the GPU output differs from the CPU reference");
        Ok(ExitCode::FAILURE)
    }
}

/// Runs the transpose on `dev` and returns the result on the host.
fn on_gpu<T: Element>(dev: &Device, x: &HostTensor<T>) -> Result<HostTensor<T>> {
    let p = dev.props();
    println!("GPU 0: {} ({}, {} SMs)", p.name, p.arch, p.sm_count);
    let dx = dev.upload(x)?;

    // First call: NVRTC compile (or kernel disk-cache load) + launch. Ops are enqueued on the
    // device's stream and return at once, so synchronise before reading the clock.
    let t = Instant::now();
    let mut out = batched_transpose(&dx.view())?;
    dev.synchronize()?;
    println!(
        "first call (incl. compile or cache load): {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );

    // Steady state: kernel cached in memory, output buffer reused, one sync at the end.
    let t = Instant::now();
    for _ in 0..STEADY_CALLS {
        batched_transpose_into(&dx.view(), &mut out.view_mut())?;
    }
    dev.synchronize()?;
    let secs = t.elapsed().as_secs_f64() / f64::from(STEADY_CALLS);
    let gbs = (2 * x.as_slice().len() * size_of::<T>()) as f64 / secs / 1e9; // read x + write out
    println!(
        "steady state: {:.1} µs/call (mean of {STEADY_CALLS}), {gbs:.0} GB/s",
        secs * 1e6
    );
    out.to_host()
}
