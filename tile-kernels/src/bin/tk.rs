//! `tk`: the tile-kernels command line.
//!
//! * `tk compile-check [--arch sm_90a] [--arch sm_100a] ... [--dump <dir>] [--only <text>]`
//!   compiles every registered kernel specialisation with NVRTC for each architecture (no GPU
//!   needed) and prints the resource usage of each (registers, spills, stack); exits 1 on any
//!   failure. With `--dump`, writes each CUBIN and its PTX to `<dir>` (disassemble the CUBINs
//!   with `cuobjdump --dump-sass` or `nvdisasm` where a CUDA toolkit is installed). With
//!   `--only` (repeatable), compiles only the specialisations whose `family/entry [defines]`
//!   line contains one of the texts (a kernel author's quick check; CI compiles everything).
//! * `tk info` prints the NVRTC version, the CUDA include folder, the cache folder and the GPU.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str =
    "tk compile-check [--arch <sm_XXa>]... [--dump <dir>] [--only <text>]... | tk info";
use std::time::Instant;

/// Writes `<stem>.cubin` and, compiled again for the virtual architecture, `<stem>.ptx`.
fn dump(
    dir: &Path,
    stem: &str,
    spec: &tk_core::KernelSpec,
    arch: &str,
    cubin: &[u8],
) -> tk_core::Result<()> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| tk_core::TkError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let cubin_path = dir.join(format!("{stem}.cubin"));
    std::fs::write(&cubin_path, cubin).map_err(io(&cubin_path))?;
    let ptx = tk_core::kernel::compile(spec, &arch.replacen("sm_", "compute_", 1))?;
    let ptx_path = dir.join(format!("{stem}.ptx"));
    std::fs::write(&ptx_path, &ptx.image).map_err(io(&ptx_path))
}

fn compile_check(archs: &[String], dump_dir: Option<&Path>, only: &[String]) -> ExitCode {
    let version = match tk_core::kernel::nvrtc_version() {
        Ok((a, b)) => format!("{a}.{b}"),
        Err(e) => {
            eprintln!("compile-check FAILED: {e}");
            return ExitCode::FAILURE;
        }
    };
    let specs: Vec<_> = tile_kernels::registered_kernels()
        .into_iter()
        .filter(|(family, spec)| {
            let line = format!("{family}/{} [{}]", spec.source().entry, spec.describe());
            only.is_empty() || only.iter().any(|o| line.contains(o.as_str()))
        })
        .collect();
    println!(
        "compile-check: NVRTC {version}, {} specialisations x {} architectures",
        specs.len(),
        archs.len()
    );
    let mut failures = 0;
    for arch in archs {
        for (family, spec) in &specs {
            let t = Instant::now();
            let compiled = tk_core::kernel::compile(spec, arch).and_then(|c| {
                if let Some(dir) = dump_dir {
                    let defines: String = spec
                        .defines()
                        .iter()
                        .map(|(k, v)| format!("-{k}{v}"))
                        .collect();
                    dump(
                        dir,
                        &format!("{family}-{}{defines}-{arch}", spec.source().entry),
                        spec,
                        arch,
                        &c.image,
                    )?;
                }
                Ok(c)
            });
            match compiled {
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
            let mut dump_dir = None;
            let mut only = Vec::new();
            let mut it = args[1..].iter();
            while let Some(a) = it.next() {
                match (a.as_str(), it.next()) {
                    ("--arch", Some(v)) => archs.push(v.clone()),
                    ("--dump", Some(v)) => dump_dir = Some(PathBuf::from(v)),
                    ("--only", Some(v)) => only.push(v.clone()),
                    _ => {
                        eprintln!("usage: {USAGE}");
                        return ExitCode::from(2);
                    }
                }
            }
            if archs.is_empty() {
                archs = vec!["sm_90a".into(), "sm_100a".into()];
            }
            compile_check(&archs, dump_dir.as_deref(), &only)
        }
        Some("info") => info(),
        _ => {
            eprintln!("usage: {USAGE}");
            ExitCode::from(2)
        }
    }
}
