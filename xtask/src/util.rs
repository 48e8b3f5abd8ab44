//! Process helpers, cargo-test result counting and the step runner with its summary.

use std::env;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Instant;

use crate::json::Json;

/// The workspace root (the parent of xtask's own manifest folder).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| manifest.to_path_buf())
}

/// A `cargo` command (the same cargo that runs xtask) in the workspace root.
pub fn cargo() -> Command {
    let program = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(program);
    cmd.current_dir(workspace_root());
    cmd
}

fn quote(s: &OsStr) -> String {
    let s = s.to_string_lossy();
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A shell-like rendering of `cmd`, with the `TK_*` variables it sets in front.
pub fn show(cmd: &Command) -> String {
    let mut parts: Vec<String> = cmd
        .get_envs()
        .filter(|(k, _)| k.to_string_lossy().starts_with("TK_"))
        .filter_map(|(k, v)| v.map(|v| format!("{}={}", k.to_string_lossy(), quote(v))))
        .collect();
    let program = Path::new(cmd.get_program());
    let name = if program.file_stem() == Some(OsStr::new("cargo")) {
        OsStr::new("cargo")
    } else {
        cmd.get_program()
    };
    parts.push(quote(name));
    parts.extend(cmd.get_args().map(quote));
    parts.join(" ")
}

fn describe_status(status: ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exit code {code}"),
        None => format!("{status}"),
    }
}

fn spawn_error(cmd: &Command, e: std::io::Error) -> String {
    format!(
        "cannot start `{}`: {e}",
        cmd.get_program().to_string_lossy()
    )
}

/// Runs `cmd` with inherited stdio, echoing it first; `Err` unless it exits 0.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    println!("$ {}", show(cmd));
    let status = cmd.status().map_err(|e| spawn_error(cmd, e))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{}: `{}`", describe_status(status), show(cmd)))
    }
}

/// Runs a cargo command with `--message-format=json*`: stderr is inherited (human
/// diagnostics and progress), stdout is parsed as one JSON message per line.
pub fn run_json(cmd: &mut Command) -> Result<Vec<Json>, String> {
    println!("$ {}", show(cmd));
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| spawn_error(cmd, e))?;
    let mut messages = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line.map_err(|e| format!("reading cargo output: {e}"))?;
            if line.starts_with('{') {
                if let Ok(v) = Json::parse(&line) {
                    messages.push(v);
                }
            } else if !line.trim().is_empty() {
                println!("{line}");
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for cargo: {e}"))?;
    if status.success() {
        Ok(messages)
    } else {
        Err(format!("{}: `{}`", describe_status(status), show(cmd)))
    }
}

/// Passed/failed/ignored counts summed over libtest `test result:` lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TestTally {
    /// Tests libtest reported as passed (GPU tests that skipped at run time included).
    pub passed: u64,
    /// GPU tests that skipped at run time (their `SKIPPED <test>: <reason>` lines); libtest
    /// counts them as passed, the summary moves them to "skipped".
    pub skipped_at_run_time: u64,
    /// Tests that failed.
    pub failed: u64,
    /// Tests marked `#[ignore]`.
    pub ignored: u64,
    /// Number of `test result:` lines seen (test harnesses run).
    pub harnesses: u64,
}

impl TestTally {
    /// Adds the `SKIPPED ` markers of one line of test output and the counts of a libtest
    /// `test result:` line; returns whether the line held a `test result:`.
    ///
    /// A skip line goes straight to stderr, which shares the pipe with the harness's stdout,
    /// so it can follow a stdout line that has not ended yet (`test a ... okSKIPPED b: ...`):
    /// both markers are looked for anywhere in the line.
    pub fn add_line(&mut self, line: &str) -> bool {
        self.skipped_at_run_time += line.matches("SKIPPED ").count() as u64;
        let Some(at) = line.find("test result:") else {
            return false;
        };
        let rest = &line[at + "test result:".len()..];
        let mut found = false;
        for part in rest.split([';', '.']) {
            let mut words = part.split_whitespace();
            let (Some(n), Some(what)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => continue,
            }
            found = true;
        }
        if found {
            self.harnesses += 1;
        }
        found
    }

    /// Adds another tally.
    pub fn merge(&mut self, other: TestTally) {
        self.passed += other.passed;
        self.skipped_at_run_time += other.skipped_at_run_time;
        self.failed += other.failed;
        self.ignored += other.ignored;
        self.harnesses += other.harnesses;
    }

    /// `N passed, M failed, K skipped` (ignored tests and GPU tests that skipped at run time
    /// are reported as skipped, not passed).
    pub fn line(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped",
            self.passed.saturating_sub(self.skipped_at_run_time),
            self.failed,
            self.ignored + self.skipped_at_run_time
        )
    }
}

/// Runs a `cargo test` command with its stdout and stderr merged into one pipe (so
/// the order of cargo's and the tests' lines is kept), echoing every line while
/// counting `test result:` lines. Returns the tally, and `Err` if the command failed.
pub fn run_tests(cmd: &mut Command) -> (Result<(), String>, TestTally) {
    println!("$ {}", show(cmd));
    let mut tally = TestTally::default();
    let spawned = std::io::pipe().and_then(|(reader, writer)| {
        cmd.stdout(writer.try_clone()?).stderr(writer);
        let child = cmd.spawn();
        // Drop the parent's copies of the write end, or the reader never sees EOF.
        cmd.stdout(Stdio::inherit()).stderr(Stdio::inherit());
        Ok((reader, child?))
    });
    let (reader, mut child) = match spawned {
        Ok(pair) => pair,
        Err(e) => return (Err(spawn_error(cmd, e)), tally),
    };
    let stdout = std::io::stdout();
    for line in BufReader::new(reader).split(b'\n') {
        let Ok(line) = line else { break };
        let line = String::from_utf8_lossy(&line);
        let mut lock = stdout.lock();
        let _ = writeln!(lock, "{line}");
        tally.add_line(&line);
    }
    let result = match child.wait() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!(
            "{} ({}): `{}`",
            tally.line(),
            describe_status(status),
            show(cmd)
        )),
        Err(e) => Err(format!("waiting for cargo: {e}")),
    };
    (result, tally)
}

/// The cargo target directory (`cargo metadata`, so `CARGO_TARGET_DIR` and
/// `build.target-dir` are honoured).
pub fn target_dir() -> Result<PathBuf, String> {
    let out = cargo()
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed ({})",
            describe_status(out.status)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let meta = Json::parse(text.trim())?;
    meta.get("target_directory")
        .and_then(Json::as_str)
        .map(PathBuf::from)
        .ok_or_else(|| "cargo metadata: no target_directory".to_string())
}

/// Prints a step header.
pub fn header(text: &str) {
    println!();
    println!("==> {text}");
    let _ = std::io::stdout().flush();
}

struct StepRecord {
    name: &'static str,
    ok: bool,
    secs: f64,
    note: String,
}

/// Runs named steps in order, stopping at the first failure, and prints a summary.
pub struct Steps {
    title: String,
    planned: Vec<&'static str>,
    done: Vec<StepRecord>,
    tally: Option<TestTally>,
}

impl Steps {
    /// A runner for `planned` steps, titled e.g. "cargo xtask test".
    pub fn new(title: &str, planned: &[&'static str]) -> Self {
        Steps {
            title: title.to_string(),
            planned: planned.to_vec(),
            done: Vec::new(),
            tally: None,
        }
    }

    /// Records test counts to print as the summary's last line.
    pub fn add_tally(&mut self, tally: TestTally) {
        self.tally
            .get_or_insert_with(TestTally::default)
            .merge(tally);
    }

    /// Runs one step. `f` returns a value and a note for the summary. On failure the
    /// summary is printed and the error names the step.
    pub fn run<T>(
        &mut self,
        name: &'static str,
        what: &str,
        f: impl FnOnce(&mut Self) -> Result<(T, String), String>,
    ) -> Result<T, String> {
        let index = self
            .planned
            .iter()
            .position(|p| *p == name)
            .map_or(0, |i| i + 1);
        header(&format!("[{index}/{}] {name}: {what}", self.planned.len()));
        let start = Instant::now();
        let result = f(self);
        let secs = start.elapsed().as_secs_f64();
        match result {
            Ok((value, note)) => {
                self.done.push(StepRecord {
                    name,
                    ok: true,
                    secs,
                    note,
                });
                Ok(value)
            }
            Err(e) => {
                eprintln!("error: step `{name}` failed: {e}");
                self.done.push(StepRecord {
                    name,
                    ok: false,
                    secs,
                    note: first_line(&e),
                });
                self.summary();
                Err(format!("{}: step `{name}` FAILED", self.title))
            }
        }
    }

    /// Prints the summary table (done, failed and not-run steps).
    pub fn summary(&self) {
        header(&format!("summary: {}", self.title));
        for name in &self.planned {
            match self.done.iter().find(|r| r.name == *name) {
                Some(r) => println!(
                    "  {:<14} {:<7} {:>7.1}s  {}",
                    r.name,
                    if r.ok { "ok" } else { "FAILED" },
                    r.secs,
                    r.note
                ),
                None => println!("  {name:<14} {:<7}", "not run"),
            }
        }
        let all_ok = self.done.len() == self.planned.len() && self.done.iter().all(|r| r.ok);
        let total: f64 = self.done.iter().map(|r| r.secs).sum();
        if all_ok {
            println!(
                "{}: all {} steps passed in {total:.0}s",
                self.title,
                self.planned.len()
            );
        } else if let Some(failed) = self.done.iter().find(|r| !r.ok) {
            println!("{}: FAILED at step `{}`", self.title, failed.name);
        }
        if let Some(t) = self.tally {
            println!("tests: {}", t.line());
        }
        let _ = std::io::stdout().flush();
    }
}

fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    if line.chars().count() > 100 {
        let cut: String = line.chars().take(97).collect();
        format!("{cut}...")
    } else {
        line.to_string()
    }
}

/// Total size in bytes of the files under `dir`.
pub fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_parses_libtest_lines() {
        let mut t = TestTally::default();
        assert!(t.add_line(
            "test result: ok. 12 passed; 0 failed; 3 ignored; 0 measured; 0 filtered out; finished in 0.52s"
        ));
        assert!(t.add_line(
            "test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 5 filtered out; finished in 1.00s"
        ));
        assert!(!t.add_line("running 3 tests"));
        assert!(!t.add_line("test foo ... ok"));
        assert!(!t.add_line("SKIPPED gpu_test: no usable GPU (no driver)"));
        // A skip line after a stdout line that had not ended (seen in CI, session 14).
        assert!(!t.add_line("test gpu_a ... okSKIPPED gpu_b: no usable GPU (no driver)"));
        assert_eq!(
            t,
            TestTally {
                passed: 13,
                skipped_at_run_time: 2,
                failed: 2,
                ignored: 3,
                harnesses: 2
            }
        );
        assert_eq!(t.line(), "11 passed, 2 failed, 5 skipped");
    }

    #[test]
    fn show_quotes_and_lists_tk_env() {
        let mut c = Command::new("cargo");
        c.args(["bench", "--bench", "*", "--", "a b"])
            .env("TK_FULL_TEST", "1");
        assert_eq!(show(&c), "TK_FULL_TEST=1 cargo bench --bench '*' -- 'a b'");
    }

    #[test]
    fn first_line_is_short() {
        assert_eq!(first_line("a\nb"), "a");
        assert_eq!(first_line(&"x".repeat(200)).chars().count(), 100);
    }
}
