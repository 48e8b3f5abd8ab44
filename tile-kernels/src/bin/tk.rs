//! `tk`: the tile-kernels command line.
//!
//! * `tk compile-check [--arch sm_90a] [--arch sm_100a] ...` compiles every registered kernel
//!   specialisation with NVRTC for each architecture (no GPU needed) and prints the resource
//!   usage of each; exits 1 on any failure.
//! * `tk info` prints the NVRTC version, the CUDA include folder, the cache folder and the GPU.

use std::process::ExitCode;
use std::time::Instant;

fn compile_check(archs: &[String]) -> ExitCode {
    let version = match tk_core::kernel::nvrtc_version() {
        Ok((a, b)) => format!("{a}.{b}"),
        Err(e) => {
            eprintln!("compile-check FAILED: {e}");
            return ExitCode::FAILURE;
        }
    };
    let specs = tile_kernels::registered_kernels();
    println!(
        "compile-check: NVRTC {version}, {} specialisations x {} architectures",
        specs.len(),
        archs.len()
    );
    let mut failures = 0;
    for arch in archs {
        for (family, spec) in &specs {
            let t = Instant::now();
            match tk_core::kernel::compile(spec, arch) {
                Ok(c) => println!(
                    "  ok   {arch:<8} {family}/{} [{}]: {} bytes CUBIN in {:.0} ms; {}",
                    spec.source().entry,
                    spec.describe(),
                    c.image.len(),
                    t.elapsed().as_secs_f64() * 1e3,
                    c.resource_usage()
                ),
                Err(e) => {
                    failures += 1;
                    println!(
                        "  FAIL {arch:<8} {family}/{} [{}]: {e}",
                        spec.source().entry,
                        spec.describe()
                    );
                }
            }
        }
    }
    let total = specs.len() * archs.len();
    println!(
        "compile-check: {} of {total} compiled, {failures} failed",
        total - failures
    );
    if failures == 0 && total > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn info() -> ExitCode {
    match tk_core::kernel::nvrtc_version() {
        Ok((a, b)) => println!("NVRTC: {a}.{b}"),
        Err(e) => println!("NVRTC: {e}"),
    }
    let (inc, searched) = tk_core::kernel::cuda_include_dir();
    match inc {
        Some(d) => println!("CUDA headers: {}", d.display()),
        None => println!("CUDA headers: not found (searched {searched})"),
    }
    match tk_core::kernel::DiskCache::from_env() {
        Some(c) => println!("kernel cache: {}", c.dir().display()),
        None => println!("kernel cache: off"),
    }
    match tk_core::Device::new(0) {
        Ok(d) => println!("GPU 0: {:?}", d.props()),
        Err(e) => println!("GPU 0: {e}"),
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("compile-check") => {
            let mut archs = Vec::new();
            let mut it = args[1..].iter();
            while let Some(a) = it.next() {
                match (a.as_str(), it.next()) {
                    ("--arch", Some(v)) => archs.push(v.clone()),
                    _ => {
                        eprintln!("usage: tk compile-check [--arch <sm_XXa>]...");
                        return ExitCode::from(2);
                    }
                }
            }
            if archs.is_empty() {
                archs = vec!["sm_90a".into(), "sm_100a".into()];
            }
            compile_check(&archs)
        }
        Some("info") => info(),
        _ => {
            eprintln!("usage: tk compile-check [--arch <sm_XXa>]... | tk info");
            ExitCode::from(2)
        }
    }
}
