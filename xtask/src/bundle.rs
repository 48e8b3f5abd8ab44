//! `cargo xtask gpu-bundle`: release test and bench executables plus the `tk` binary,
//! copied into `target/gpu-bundle` with a `run.sh` for a GPU machine that has no cargo.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::json::Json;
use crate::util::{self, Steps};

/// The largest bundle we accept (what can be carried to the GPU machine).
pub const MAX_BUNDLE_BYTES: u64 = 64 * 1024 * 1024;

/// One executable produced by cargo.
#[derive(Debug, Clone, PartialEq)]
pub struct Artifact {
    /// Package name (from `package_id`/`manifest_path`, best effort).
    pub package: String,
    /// Cargo target name (`transpose`, `tk_core`, `tk`).
    pub target: String,
    /// Target kinds (`lib`, `bin`, `test`, `bench`, ...).
    pub kinds: Vec<String>,
    /// Whether it was built as a test/bench harness (`profile.test`).
    pub test_harness: bool,
    /// Path of the executable.
    pub executable: PathBuf,
}

impl Artifact {
    /// Whether one of the target kinds is `kind`.
    pub fn has_kind(&self, kind: &str) -> bool {
        self.kinds.iter().any(|k| k == kind)
    }
}

/// The runnable artifacts (`"executable"` not null) in cargo JSON messages.
pub fn executables(messages: &[Json]) -> Vec<Artifact> {
    messages
        .iter()
        .filter(|m| m.get("reason").and_then(Json::as_str) == Some("compiler-artifact"))
        .filter_map(|m| {
            let executable = PathBuf::from(m.get("executable")?.as_str()?);
            let target = m.pointer(&["target", "name"])?.as_str()?.to_string();
            let kinds = m
                .pointer(&["target", "kind"])
                .and_then(Json::as_array)
                .unwrap_or(&[])
                .iter()
                .filter_map(Json::as_str)
                .map(str::to_string)
                .collect();
            let test_harness = m
                .pointer(&["profile", "test"])
                .and_then(Json::as_bool)
                .unwrap_or(false);
            let package = m
                .get("manifest_path")
                .and_then(Json::as_str)
                .and_then(|p| Path::new(p).parent()?.file_name()?.to_str())
                .unwrap_or("?")
                .to_string();
            Some(Artifact {
                package,
                target,
                kinds,
                test_harness,
                executable,
            })
        })
        .collect()
}

/// `transpose-0123456789abcdef` -> `transpose` (cargo's metadata hash suffix removed).
pub fn strip_hash(file_name: &str) -> &str {
    match file_name.rsplit_once('-') {
        Some((stem, hash))
            if !stem.is_empty()
                && hash.len() >= 8
                && hash.chars().all(|c| c.is_ascii_hexdigit()) =>
        {
            stem
        }
        _ => file_name,
    }
}

/// A name for `artifact` in the bundle: the executable's file name without the hash,
/// made unique among `taken`.
fn bundle_name(artifact: &Artifact, taken: &mut HashSet<String>) -> String {
    let file = artifact
        .executable
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| artifact.target.clone());
    let base = strip_hash(&file).to_string();
    let mut name = base.clone();
    let mut n = 2;
    while !taken.insert(name.clone()) {
        name = format!("{base}-{n}");
        n += 1;
    }
    name
}

fn copy_exe(from: &Path, to: &Path) -> Result<(), String> {
    fs::copy(from, to).map_err(|e| format!("copy {} -> {}: {e}", from.display(), to.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(to, fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", to.display()))?;
    }
    Ok(())
}

fn git_line(args: &[&str]) -> String {
    Command::new("git")
        .args(args)
        .current_dir(util::workspace_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// `cargo xtask gpu-bundle`.
pub fn gpu_bundle() -> Result<(), String> {
    let mut steps = Steps::new(
        "cargo xtask gpu-bundle",
        &["tests", "benches", "tk", "assemble"],
    );
    let target = util::target_dir()?;
    let bundle = target.join("gpu-bundle");

    let tests = steps.run("tests", "release test executables", |_| {
        let mut cmd = util::cargo();
        cmd.args([
            "test",
            "--workspace",
            "--exclude",
            "xtask",
            "--release",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ]);
        let found: Vec<Artifact> = executables(&util::run_json(&mut cmd)?)
            .into_iter()
            .filter(|a| a.test_harness && !a.has_kind("bench"))
            .collect();
        if found.is_empty() {
            return Err("cargo built no test executables".into());
        }
        let note = format!("{} executables", found.len());
        Ok((found, note))
    })?;

    let benches = steps.run("benches", "release bench executables", |_| {
        let mut cmd = util::cargo();
        cmd.args([
            "bench",
            "--workspace",
            "--exclude",
            "xtask",
            "--bench",
            "*",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ]);
        let found: Vec<Artifact> = executables(&util::run_json(&mut cmd)?)
            .into_iter()
            .filter(|a| a.has_kind("bench"))
            .collect();
        let note = format!("{} executables", found.len());
        Ok((found, note))
    })?;

    let tk = steps.run("tk", "release `tk` binary", |_| {
        let mut cmd = util::cargo();
        cmd.args([
            "build",
            "--release",
            "--package",
            "tile-kernels",
            "--bin",
            "tk",
            "--message-format=json-render-diagnostics",
        ]);
        let exe = executables(&util::run_json(&mut cmd)?)
            .into_iter()
            .find(|a| a.target == "tk" && a.has_kind("bin") && !a.test_harness)
            .ok_or("cargo reported no `tk` executable")?;
        let note = exe.executable.display().to_string();
        Ok((exe, note))
    })?;

    steps.run(
        "assemble",
        &format!("copy into {}", bundle.display()),
        |_| {
            if bundle.exists() {
                fs::remove_dir_all(&bundle)
                    .map_err(|e| format!("cannot clear {}: {e}", bundle.display()))?;
            }
            for sub in ["tests", "benches", "bin"] {
                fs::create_dir_all(bundle.join(sub))
                    .map_err(|e| format!("cannot create {}: {e}", bundle.join(sub).display()))?;
            }
            let mut manifest = String::new();
            let rev = git_line(&["rev-parse", "--short", "HEAD"]);
            let dirty = !git_line(&["status", "--porcelain"]).is_empty();
            manifest.push_str(&format!(
                "tile-kernels GPU bundle, git {}{}\n",
                if rev.is_empty() { "(no commit)" } else { &rev },
                if dirty { " + uncommitted changes" } else { "" }
            ));
            for (dir, list) in [("tests", &tests), ("benches", &benches)] {
                let mut taken = HashSet::new();
                for a in list.iter() {
                    let name = bundle_name(a, &mut taken);
                    copy_exe(&a.executable, &bundle.join(dir).join(&name))?;
                    manifest.push_str(&format!(
                        "{dir}/{name}\tpackage {} target {} ({})\n",
                        a.package,
                        a.target,
                        a.kinds.join(",")
                    ));
                }
            }
            copy_exe(&tk.executable, &bundle.join("bin").join("tk"))?;
            manifest.push_str("bin/tk\tpackage tile-kernels bin tk\n");
            fs::write(bundle.join("bundle.txt"), &manifest)
                .map_err(|e| format!("cannot write bundle.txt: {e}"))?;

            let script = bundle.join("run.sh");
            fs::write(&script, RUN_SH).map_err(|e| format!("cannot write run.sh: {e}"))?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                fs::set_permissions(&script, fs::Permissions::from_mode(0o755))
                    .map_err(|e| format!("chmod run.sh: {e}"))?;
            }
            print!("{manifest}");

            let size = util::dir_size(&bundle);
            let mib = size as f64 / (1024.0 * 1024.0);
            println!(
                "bundle size: {mib:.1} MiB ({size} bytes) in {}",
                bundle.display()
            );
            if size > MAX_BUNDLE_BYTES {
                return Err(format!(
                    "bundle is {mib:.1} MiB, over the {} MiB limit",
                    MAX_BUNDLE_BYTES / (1024 * 1024)
                ));
            }
            Ok(((), format!("{mib:.1} MiB")))
        },
    )?;
    steps.summary();
    println!(
        "\nOn the GPU machine: bash {}/run.sh [--no-check] [--no-test] [--no-bench] [BENCH_FILTER]",
        bundle
            .strip_prefix(util::workspace_root())
            .unwrap_or(&bundle)
            .display()
    );
    println!("(report.txt, bench.jsonl and logs go to $OUT, or ./bundle-out when OUT is unset)");
    Ok(())
}

/// The script written to `target/gpu-bundle/run.sh`.
pub const RUN_SH: &str = r#"#!/usr/bin/env bash
# tile-kernels GPU bundle runner (generated by `cargo xtask gpu-bundle`).
#
# Usage: run.sh [--no-check] [--no-test] [--no-bench] [BENCH_FILTER ...]
#   1. nvidia-smi -L
#   2. bin/tk compile-check --arch sm_90a --arch sm_100a            (skip: --no-check)
#   3. every tests/* executable, twice, TK_REQUIRE_GPU=1 TK_FULL_TEST=1 (skip: --no-test)
#   4. every benches/* executable: [BENCH_FILTER] --jsonl $LOG_DIR/bench.jsonl (skip: --no-bench)
#   5. report (bench tables, one result line per test run) in $LOG_DIR/report.txt;
#      exits non-zero if anything failed.
# LOG_DIR=${OUT:-$PWD/bundle-out}; logs: compile-check.log, tests-<name>-<pass>.log,
# bench-<name>.log. With TK_BUNDLE_PACK=1 (the default when $OUT is set) they are
# packed into logs.tar.gz, leaving LOG_DIR with report.txt, bench.jsonl, logs.tar.gz.
# Optional: TK_BUNDLE_TESTS="a b" runs only test executables whose name contains a or b;
# TK_BUNDLE_PASSES=N (default 2); TK_BUNDLE_TIMEOUT=<seconds> caps each run (`timeout`).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_DIR="${OUT:-$PWD/bundle-out}"
mkdir -p "$LOG_DIR"
LOG_DIR="$(cd "$LOG_DIR" && pwd)"
if [ -n "${OUT:-}" ]; then PACK="${TK_BUNDLE_PACK:-1}"; else PACK="${TK_BUNDLE_PACK:-0}"; fi
PASSES="${TK_BUNDLE_PASSES:-2}"

do_test=1; do_bench=1; do_check=1
filter=()
for arg in "$@"; do
  case "$arg" in
    --no-test) do_test=0 ;;
    --no-bench) do_bench=0 ;;
    --no-check) do_check=0 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) filter+=("$arg") ;;
  esac
done

failures=()
results=()
logs=()
log() { echo "[run.sh $(date +%H:%M:%S)] $*"; }

# run_logged LOG CMD...: runs CMD in the bundle folder, stdout+stderr to LOG; sets RC, SECS.
run_logged() {
  local out="$1"; shift
  local start=$SECONDS
  logs+=("$(basename "$out")")
  if [ -n "${TK_BUNDLE_TIMEOUT:-}" ] && command -v timeout >/dev/null 2>&1; then
    (cd "$HERE" && timeout -k 10 "$TK_BUNDLE_TIMEOUT" "$@") >"$out" 2>&1
  else
    (cd "$HERE" && "$@") >"$out" 2>&1
  fi
  RC=$?
  SECS=$((SECONDS - start))
}

# ---- environment -----------------------------------------------------------
ld_dirs=()
[ -d /usr/local/cuda/lib64 ] && ld_dirs+=(/usr/local/cuda/lib64)
py_dirs="$(python3 -c 'import os, nvidia
for p in nvidia.__path__:
    d = os.path.join(p, "cu13", "lib")
    if os.path.isdir(d): print(d)' 2>/dev/null)" || py_dirs=""
while IFS= read -r d; do
  [ -n "$d" ] && ld_dirs+=("$d")
done <<< "$py_dirs"
if [ ${#ld_dirs[@]} -gt 0 ]; then
  LD_LIBRARY_PATH="$(IFS=:; echo "${ld_dirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
fi
if [ -z "${TK_CUDA_INCLUDE:-}" ]; then
  if [ -d /usr/local/cuda/include ]; then
    export TK_CUDA_INCLUDE=/usr/local/cuda/include
  else
    while IFS= read -r d; do
      if [ -n "$d" ] && [ -f "${d%/lib}/include/cuda_fp16.h" ]; then
        export TK_CUDA_INCLUDE="${d%/lib}/include"; break
      fi
    done <<< "$py_dirs"
  fi
fi
TK_CACHE_DIR="$(mktemp -d "${TMPDIR:-/tmp}/tk-cache.XXXXXX")"
export TK_CACHE_DIR

log "bundle: $HERE"
[ -f "$HERE/bundle.txt" ] && head -n 1 "$HERE/bundle.txt"
log "LOG_DIR=$LOG_DIR"
log "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
log "TK_CUDA_INCLUDE=${TK_CUDA_INCLUDE:-<unset>}  TK_CACHE_DIR=$TK_CACHE_DIR"
log "nvidia-smi -L"
gpus="$(nvidia-smi -L 2>&1)" || gpus="WARNING: nvidia-smi failed (tests with TK_REQUIRE_GPU=1 will fail): $gpus"
echo "$gpus"

# ---- compile check ---------------------------------------------------------
if [ "$do_check" = 1 ]; then
  log "bin/tk compile-check --arch sm_90a --arch sm_100a"
  run_logged "$LOG_DIR/compile-check.log" "$HERE/bin/tk" compile-check --arch sm_90a --arch sm_100a
  tail -n 5 "$LOG_DIR/compile-check.log"
  if [ "$RC" = 0 ]; then
    results+=("compile-check: ok (${SECS}s, $(wc -l < "$LOG_DIR/compile-check.log") lines of output)")
  else
    results+=("compile-check: FAILED (exit $RC, ${SECS}s): $(tail -n 1 "$LOG_DIR/compile-check.log")")
    failures+=("compile-check")
  fi
  log "compile-check exit $RC (${SECS}s)"
fi

# ---- tests -----------------------------------------------------------------
total_passed=0; total_failed=0; total_ignored=0
selected() {
  [ -z "${TK_BUNDLE_TESTS:-}" ] && return 0
  local want
  for want in $TK_BUNDLE_TESTS; do
    case "$1" in *"$want"*) return 0 ;; esac
  done
  return 1
}
if [ "$do_test" = 1 ]; then
  for exe in "$HERE"/tests/*; do
    [ -f "$exe" ] && [ -x "$exe" ] || continue
    name="$(basename "$exe")"
    selected "$name" || continue
    for pass in $(seq 1 "$PASSES"); do
      out="$LOG_DIR/tests-$name-$pass.log"
      log "tests $name pass $pass"
      run_logged "$out" env TK_REQUIRE_GPU=1 TK_FULL_TEST=1 "$exe"
      result="$(grep -a '^test result:' "$out" | tail -n 1)"
      [ -n "$result" ] || result="(no 'test result:' line; last line: $(tail -n 1 "$out"))"
      counts="$(echo "$result" | sed -n 's/.* \([0-9][0-9]*\) passed; \([0-9][0-9]*\) failed; \([0-9][0-9]*\) ignored.*/\1 \2 \3/p')"
      if [ -n "$counts" ]; then
        read -r p f i <<< "$counts"
        total_passed=$((total_passed + p)); total_failed=$((total_failed + f)); total_ignored=$((total_ignored + i))
      fi
      if [ "$RC" = 0 ]; then
        line="tests $name pass $pass (${SECS}s): $result"
      else
        line="tests $name pass $pass (${SECS}s): FAILED (exit $RC): $result"
        failures+=("tests $name pass $pass")
      fi
      results+=("$line")
      log "$line"
    done
  done
fi

# ---- benches ---------------------------------------------------------------
bench_logs=()
if [ "$do_bench" = 1 ]; then
  for exe in "$HERE"/benches/*; do
    [ -f "$exe" ] && [ -x "$exe" ] || continue
    name="$(basename "$exe")"
    out="$LOG_DIR/bench-$name.log"
    log "bench $name ${filter[*]:-}"
    # Same argument order as `cargo bench -- FILTER --jsonl PATH` (cargo appends --bench).
    run_logged "$out" env TK_REQUIRE_GPU=1 "$exe" ${filter[@]+"${filter[@]}"} --jsonl "$LOG_DIR/bench.jsonl" --bench
    bench_logs+=("$out")
    if [ "$RC" = 0 ]; then
      results+=("bench $name: ok (${SECS}s)")
    else
      results+=("bench $name: FAILED (exit $RC, ${SECS}s; see bench-$name.log)")
      failures+=("bench $name")
    fi
    log "bench $name exit $RC (${SECS}s)"
  done
fi
rm -rf "$TK_CACHE_DIR"

# ---- report ----------------------------------------------------------------
{
  echo
  echo "================================ bench tables ================================"
  for out in ${bench_logs[@]+"${bench_logs[@]}"}; do
    echo "---- $(basename "$out" .log)"
    cat "$out"
  done
  if [ -f "$LOG_DIR/bench.jsonl" ]; then
    echo "bench.jsonl: $(wc -l < "$LOG_DIR/bench.jsonl") records"
  fi
  echo
  echo "================================== summary ==================================="
  [ -f "$HERE/bundle.txt" ] && head -n 1 "$HERE/bundle.txt"
  echo "$gpus"
  for line in ${results[@]+"${results[@]}"}; do echo "$line"; done
  if [ "$do_test" = 1 ]; then
    echo "tests: $total_passed passed, $total_failed failed, $total_ignored skipped"
  fi
  if [ ${#failures[@]} -gt 0 ]; then
    echo "run.sh: FAILED: $(IFS=,; echo "${failures[*]}")"
  else
    echo "run.sh: all OK"
  fi
} > "$LOG_DIR/report.txt"
if [ "$PACK" = 1 ] && [ ${#logs[@]} -gt 0 ]; then
  if tar -czf "$LOG_DIR/logs.tar.gz" -C "$LOG_DIR" "${logs[@]}"; then
    (cd "$LOG_DIR" && rm -f "${logs[@]}")
    echo "logs packed into $LOG_DIR/logs.tar.gz" >> "$LOG_DIR/report.txt"
  fi
fi
cat "$LOG_DIR/report.txt"
[ ${#failures[@]} -eq 0 ]
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_sh_is_valid_bash() {
        let path = std::env::temp_dir().join(format!("xtask-run-sh-{}.sh", std::process::id()));
        fs::write(&path, RUN_SH).unwrap();
        let status = Command::new("bash").arg("-n").arg(&path).status();
        let _ = fs::remove_file(&path);
        if let Ok(status) = status {
            assert!(status.success(), "bash -n rejected run.sh");
        }
    }

    #[test]
    fn strips_cargo_hashes() {
        assert_eq!(strip_hash("transpose-1a2b3c4d5e6f7a8b"), "transpose");
        assert_eq!(strip_hash("tk_core-0123456789abcdef"), "tk_core");
        assert_eq!(strip_hash("my-bench-0123456789abcdef"), "my-bench");
        assert_eq!(strip_hash("tk"), "tk");
        assert_eq!(strip_hash("fp8-cast"), "fp8-cast");
        assert_eq!(strip_hash("-0123456789abcdef"), "-0123456789abcdef");
    }

    #[test]
    fn bundle_names_are_unique() {
        let a = Artifact {
            package: "p".into(),
            target: "t".into(),
            kinds: vec!["test".into()],
            test_harness: true,
            executable: PathBuf::from("/x/deps/t-0123456789abcdef"),
        };
        let mut b = a.clone();
        b.executable = PathBuf::from("/x/deps/t-fedcba9876543210");
        let mut taken = HashSet::new();
        assert_eq!(bundle_name(&a, &mut taken), "t");
        assert_eq!(bundle_name(&b, &mut taken), "t-2");
    }

    #[test]
    fn selects_executables() {
        let lines = [
            r#"{"reason":"compiler-artifact","manifest_path":"/w/tk-core/Cargo.toml","target":{"kind":["lib"],"name":"tk_core"},"profile":{"test":false},"executable":null}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/w/tk-core/Cargo.toml","target":{"kind":["lib"],"name":"tk_core"},"profile":{"test":true},"executable":"/w/target/release/deps/tk_core-0123456789abcdef"}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/w/tk-transpose/Cargo.toml","target":{"kind":["bench"],"name":"transpose"},"profile":{"test":true},"executable":"/w/target/release/deps/transpose-0123456789abcdee"}"#,
            r#"{"reason":"build-script-executed","package_id":"x"}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ];
        let msgs: Vec<Json> = lines.iter().map(|l| Json::parse(l).unwrap()).collect();
        let exes = executables(&msgs);
        assert_eq!(exes.len(), 2);
        assert_eq!(exes[0].target, "tk_core");
        assert_eq!(exes[0].package, "tk-core");
        assert!(exes[0].test_harness && exes[0].has_kind("lib"));
        assert!(exes[1].has_kind("bench"));
    }
}
