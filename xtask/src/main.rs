//! `cargo xtask <command>`: developer and CI automation for tile-kernels (std only).
//!
//! Commands:
//! - `test`: fmt check, clippy `-D warnings`, NVRTC setup (pip install on machines
//!   without CUDA), `cargo test --workspace`, and the NVRTC compile check of every
//!   kernel for sm_90a and sm_100a. This is what CI runs.
//! - `test-full`: on a GPU machine with cargo, `TK_REQUIRE_GPU=1 TK_FULL_TEST=1
//!   cargo test --workspace --release`, twice.
//! - `bench [FILTER]`: every `[[bench]]` target, appending JSONL records to
//!   `target/bench/bench.jsonl`.
//! - `gpu-bundle`: release test/bench executables and `tk` in `target/gpu-bundle`,
//!   with a `run.sh` for a GPU machine without cargo.
//! - `kernels [ARGS]`: `tk compile-check ARGS` (default `--arch sm_90a --arch sm_100a`)
//!   with NVRTC set up.
//! - `nvrtc-env`: set NVRTC up and print `export` lines for a shell.

mod bundle;
mod json;
mod nvrtc;
mod util;

use std::path::Path;
use std::process::ExitCode;

use util::Steps;

/// The architectures the compile check covers by default.
const DEFAULT_ARCHS: [&str; 4] = ["--arch", "sm_90a", "--arch", "sm_100a"];

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  test            fmt check, clippy -D warnings, NVRTC setup, cargo test --workspace,
                  tk compile-check --arch sm_90a --arch sm_100a (what CI runs)
  test-full       GPU machine with cargo: TK_REQUIRE_GPU=1 TK_FULL_TEST=1
                  cargo test --workspace --release, run twice
  bench [FILTER]  cargo bench (all [[bench]] targets) -- [FILTER] --jsonl target/bench/bench.jsonl
  gpu-bundle      release tests, benches and tk in target/gpu-bundle, plus run.sh
  kernels [ARGS]  tk compile-check ARGS (default: --arch sm_90a --arch sm_100a)
  nvrtc-env       set NVRTC up (pip install if needed); print export lines

NVRTC: found in TK_NVRTC_LIB_DIR, /usr/local/cuda/lib64 or LD_LIBRARY_PATH
(libnvrtc.so.13), else installed from PyPI into target/cuda-pip. TK_CUDA_INCLUDE,
if set, is used for the headers.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or(&[]);
    let result = match args.first().map(String::as_str) {
        Some("test") => no_args("test", rest).and_then(|_| test()),
        Some("test-full") => no_args("test-full", rest).and_then(|_| test_full()),
        Some("bench") => bench(rest),
        Some("gpu-bundle") => no_args("gpu-bundle", rest).and_then(|_| bundle::gpu_bundle()),
        Some("kernels") => kernels(rest),
        Some("nvrtc-env") => no_args("nvrtc-env", rest).and_then(|_| nvrtc_env()),
        Some("help" | "-h" | "--help") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`\n\n{USAGE}")),
        None => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn no_args(cmd: &str, rest: &[String]) -> Result<(), String> {
    if rest.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "`cargo xtask {cmd}` takes no arguments (got {rest:?})"
        ))
    }
}

/// Sets NVRTC up (see [`nvrtc::ensure`]), printing what was found.
fn setup_nvrtc() -> Result<nvrtc::NvrtcEnv, String> {
    let env = nvrtc::ensure(&util::target_dir()?)?;
    println!("{}", env.describe());
    Ok(env)
}

/// The `tk compile-check` command, run through cargo (debug profile: it shares the
/// dependencies already built by `cargo test`, and NVRTC speed does not depend on it).
fn compile_check_cmd(nv: &nvrtc::NvrtcEnv, args: &[String]) -> std::process::Command {
    let mut cmd = util::cargo();
    cmd.args([
        "run",
        "--package",
        "tile-kernels",
        "--bin",
        "tk",
        "--",
        "compile-check",
    ]);
    if args.is_empty() {
        cmd.args(DEFAULT_ARCHS);
    } else {
        cmd.args(args);
    }
    nv.apply(&mut cmd);
    cmd
}

/// `cargo xtask test`.
fn test() -> Result<(), String> {
    let mut steps = Steps::new(
        "cargo xtask test",
        &["fmt", "clippy", "doc", "nvrtc", "test", "compile-check"],
    );
    steps.run("fmt", "cargo fmt --all -- --check", |_| {
        util::run(util::cargo().args(["fmt", "--all", "--", "--check"]))?;
        Ok(((), String::new()))
    })?;
    steps.run(
        "clippy",
        "cargo clippy --workspace --all-targets -- -D warnings",
        |_| {
            util::run(util::cargo().args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]))?;
            Ok(((), String::new()))
        },
    )?;
    steps.run(
        "doc",
        "RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps",
        |_| {
            util::run(
                util::cargo()
                    .args(["doc", "--workspace", "--no-deps"])
                    .env("RUSTDOCFLAGS", "-D warnings"),
            )?;
            Ok(((), String::new()))
        },
    )?;
    let nv = steps.run(
        "nvrtc",
        "find NVRTC + CUDA headers (pip install if missing)",
        |_| {
            let nv = setup_nvrtc()?;
            let note = format!("{} ({})", short(&nv.lib_dir), nv.origin);
            Ok((nv, note))
        },
    )?;
    steps.run("test", "cargo test --workspace (with NVRTC)", |s| {
        let mut cmd = util::cargo();
        cmd.args(["test", "--workspace", "--no-fail-fast"]);
        nv.apply(&mut cmd);
        let (result, tally) = util::run_tests(&mut cmd);
        s.add_tally(tally);
        result?;
        if tally.harnesses == 0 {
            return Err("cargo test printed no `test result:` line".into());
        }
        Ok(((), tally.line()))
    })?;
    steps.run(
        "compile-check",
        "tk compile-check --arch sm_90a --arch sm_100a",
        |_| {
            util::run(&mut compile_check_cmd(&nv, &[]))?;
            Ok(((), "sm_90a, sm_100a".to_string()))
        },
    )?;
    steps.summary();
    Ok(())
}

/// `cargo xtask test-full`.
fn test_full() -> Result<(), String> {
    let mut steps = Steps::new("cargo xtask test-full", &["nvrtc", "pass 1", "pass 2"]);
    let nv = steps.run("nvrtc", "find NVRTC + CUDA headers", |_| {
        let nv = setup_nvrtc()?;
        let note = format!("{} ({})", short(&nv.lib_dir), nv.origin);
        Ok((nv, note))
    })?;
    for pass in ["pass 1", "pass 2"] {
        steps.run(
            pass,
            "TK_REQUIRE_GPU=1 TK_FULL_TEST=1 cargo test --workspace --release",
            |s| {
                let mut cmd = util::cargo();
                cmd.args(["test", "--workspace", "--release", "--no-fail-fast"])
                    .env("TK_REQUIRE_GPU", "1")
                    .env("TK_FULL_TEST", "1");
                nv.apply(&mut cmd);
                let (result, tally) = util::run_tests(&mut cmd);
                s.add_tally(tally);
                result?;
                Ok(((), tally.line()))
            },
        )?;
    }
    steps.summary();
    Ok(())
}

/// `cargo xtask bench [FILTER...]`.
fn bench(filter: &[String]) -> Result<(), String> {
    let nv = setup_nvrtc()?;
    let dir = util::target_dir()?.join("bench");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // Absolute: cargo runs each bench executable in its package's folder.
    let jsonl = dir.join("bench.jsonl");
    let before = count_lines(&jsonl);
    let mut cmd = util::cargo();
    // `--bench '*'` selects only [[bench]] targets: the default lib/bin libtest
    // harnesses would reject `--jsonl`.
    cmd.args(["bench", "--workspace", "--bench", "*", "--"])
        .args(filter)
        .arg("--jsonl")
        .arg(&jsonl);
    nv.apply(&mut cmd);
    util::run(&mut cmd)?;
    let added = count_lines(&jsonl).saturating_sub(before);
    println!("bench: {added} new records in {}", jsonl.display());
    Ok(())
}

fn count_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().filter(|l| !l.trim().is_empty()).count())
        .unwrap_or(0)
}

/// `cargo xtask kernels [ARGS]`.
fn kernels(args: &[String]) -> Result<(), String> {
    let nv = setup_nvrtc()?;
    util::run(&mut compile_check_cmd(&nv, args))
}

/// `cargo xtask nvrtc-env`: for `eval "$(cargo xtask nvrtc-env)"`.
fn nvrtc_env() -> Result<(), String> {
    let nv = nvrtc::ensure(&util::target_dir()?)?;
    eprintln!("{}", nv.describe());
    println!(
        "export LD_LIBRARY_PATH=\"{}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\"",
        nv.lib_dir.display()
    );
    println!("export TK_CUDA_INCLUDE='{}'", nv.include_dir.display());
    Ok(())
}

/// `path` relative to the workspace root when inside it.
fn short(path: &Path) -> String {
    path.strip_prefix(util::workspace_root())
        .unwrap_or(path)
        .display()
        .to_string()
}
