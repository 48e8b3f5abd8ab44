//! Finding NVRTC (and the CUDA headers that kernels include), or installing both
//! from PyPI into `target/cuda-pip` on machines without a CUDA toolkit.
//!
//! The library loads `libnvrtc` with `dlopen` (cudarc `dynamic-loading`), so child
//! processes only need `LD_LIBRARY_PATH` to contain the library's folder, and
//! `TK_CUDA_INCLUDE` to point at the headers.

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pip requirements that provide `libnvrtc.so.13` (nvrtc) and the CUDA headers
/// (`cuda_fp16.h`, `cuda_bf16.h`, `cuda_fp8.h`, `cuda_fp4.h`, ... from the runtime wheel).
pub const PIP_REQUIREMENTS: [&str; 2] =
    ["nvidia-cuda-nvrtc==13.0.*", "nvidia-cuda-runtime==13.0.*"];

/// Headers that must be present in the include folder.
pub const REQUIRED_HEADERS: [&str; 4] = ["cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cuda_fp4.h"];

/// The file name prefix of an NVRTC matching the CUDA 13 ABI that cudarc is built for.
const NVRTC_PREFIX: &str = "libnvrtc.so.13";

/// Marker written after a complete pip install; holds the requirement list.
const MARKER: &str = ".tk-installed";

/// Where NVRTC and the CUDA headers are, and how they were found.
#[derive(Debug, Clone)]
pub struct NvrtcEnv {
    /// Folder holding `libnvrtc.so.13` (and `libnvrtc-builtins`).
    pub lib_dir: PathBuf,
    /// Folder holding the CUDA headers (becomes `TK_CUDA_INCLUDE`).
    pub include_dir: PathBuf,
    /// Human-readable origin, e.g. "CUDA toolkit" or "pip, already installed".
    pub origin: String,
}

impl NvrtcEnv {
    /// `LD_LIBRARY_PATH` with [`NvrtcEnv::lib_dir`] in front of the current value.
    pub fn ld_library_path(&self) -> OsString {
        let mut dirs = vec![self.lib_dir.clone()];
        if let Some(old) = env::var_os("LD_LIBRARY_PATH") {
            dirs.extend(
                env::split_paths(&old).filter(|d| !d.as_os_str().is_empty() && *d != self.lib_dir),
            );
        }
        env::join_paths(dirs).unwrap_or_else(|_| self.lib_dir.clone().into_os_string())
    }

    /// Sets `LD_LIBRARY_PATH` and `TK_CUDA_INCLUDE` on a child command, and
    /// `TK_REQUIRE_NVRTC=1` so that tests needing NVRTC fail rather than skip.
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("LD_LIBRARY_PATH", self.ld_library_path());
        cmd.env("TK_CUDA_INCLUDE", &self.include_dir);
        cmd.env("TK_REQUIRE_NVRTC", "1");
    }

    /// One line describing the setup.
    pub fn describe(&self) -> String {
        format!(
            "NVRTC in {} ; headers in {} ({})",
            self.lib_dir.display(),
            self.include_dir.display(),
            self.origin
        )
    }
}

/// True if `dir` holds a CUDA 13 `libnvrtc.so.13*`.
fn has_nvrtc(dir: &Path) -> bool {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(NVRTC_PREFIX))
        })
        .unwrap_or(false)
}

/// True if `dir` holds every header in [`REQUIRED_HEADERS`].
pub fn has_headers(dir: &Path) -> bool {
    REQUIRED_HEADERS.iter().all(|h| dir.join(h).is_file())
}

/// A header folder that belongs to the NVRTC in `lib_dir`, if one can be found.
fn headers_near(lib_dir: &Path) -> Option<PathBuf> {
    let up1 = lib_dir.parent();
    let up2 = up1.and_then(Path::parent);
    [up1, up2]
        .into_iter()
        .flatten()
        .map(|d| d.join("include"))
        .chain([PathBuf::from("/usr/local/cuda/include")])
        .find(|d| has_headers(d))
}

/// `TK_CUDA_INCLUDE` from the environment, checked, if the user set one.
fn user_include() -> Result<Option<PathBuf>, String> {
    match env::var_os("TK_CUDA_INCLUDE").filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => {
            let dir = PathBuf::from(v);
            if has_headers(&dir) {
                Ok(Some(dir))
            } else {
                Err(format!(
                    "TK_CUDA_INCLUDE={} lacks one of {REQUIRED_HEADERS:?}; unset it or point it at a CUDA >= 12.8 include folder",
                    dir.display()
                ))
            }
        }
    }
}

/// Finds NVRTC + headers, installing them with pip into `<target_dir>/cuda-pip` if
/// the machine has neither a CUDA toolkit nor an NVRTC in `LD_LIBRARY_PATH`.
///
/// Search order: `TK_NVRTC_LIB_DIR` (explicit, must hold `libnvrtc.so.13`),
/// `/usr/local/cuda/lib64`, the folders of `LD_LIBRARY_PATH`, then pip.
/// `TK_CUDA_INCLUDE`, when set, always wins for the headers.
pub fn ensure(target_dir: &Path) -> Result<NvrtcEnv, String> {
    let user_inc = user_include()?;

    if let Some(dir) = env::var_os("TK_NVRTC_LIB_DIR").filter(|v| !v.is_empty()) {
        let lib_dir = PathBuf::from(dir);
        if !has_nvrtc(&lib_dir) {
            return Err(format!(
                "TK_NVRTC_LIB_DIR={} holds no {NVRTC_PREFIX}*",
                lib_dir.display()
            ));
        }
        let include_dir = user_inc.or_else(|| headers_near(&lib_dir)).ok_or_else(|| {
            format!(
                "no CUDA headers found near TK_NVRTC_LIB_DIR={}; set TK_CUDA_INCLUDE",
                lib_dir.display()
            )
        })?;
        return Ok(NvrtcEnv {
            lib_dir,
            include_dir,
            origin: "TK_NVRTC_LIB_DIR".into(),
        });
    }

    let mut candidates = vec![PathBuf::from("/usr/local/cuda/lib64")];
    if let Some(old) = env::var_os("LD_LIBRARY_PATH") {
        candidates.extend(env::split_paths(&old).filter(|d| !d.as_os_str().is_empty()));
    }
    for lib_dir in candidates {
        if !has_nvrtc(&lib_dir) {
            continue;
        }
        match user_inc.clone().or_else(|| headers_near(&lib_dir)) {
            Some(include_dir) => {
                return Ok(NvrtcEnv {
                    lib_dir,
                    include_dir,
                    origin: "found on this machine".into(),
                })
            }
            None => println!(
                "note: {} has {NVRTC_PREFIX} but no CUDA headers next to it; using the pip install instead",
                lib_dir.display()
            ),
        }
    }

    let root = target_dir.join("cuda-pip");
    let fresh = install_pip(&root)?;
    let (lib_dir, pip_inc) = pip_layout(&root);
    Ok(NvrtcEnv {
        lib_dir,
        include_dir: user_inc.unwrap_or(pip_inc),
        origin: if fresh {
            "pip, installed now".into()
        } else {
            "pip, already installed".into()
        },
    })
}

/// `(lib, include)` folders of a pip `--target` install of the CUDA 13 wheels.
pub fn pip_layout(root: &Path) -> (PathBuf, PathBuf) {
    let cu = root.join("nvidia").join("cu13");
    (cu.join("lib"), cu.join("include"))
}

/// True if `root` holds a complete install of [`PIP_REQUIREMENTS`].
fn pip_install_complete(root: &Path) -> bool {
    let (lib, inc) = pip_layout(root);
    let stamp = PIP_REQUIREMENTS.join(" ");
    fs::read_to_string(root.join(MARKER)).is_ok_and(|m| m.trim() == stamp)
        && lib.join(NVRTC_PREFIX).is_file()
        && has_headers(&inc)
}

/// Installs [`PIP_REQUIREMENTS`] into `root` unless already done (marker file).
/// Returns whether an install happened.
pub fn install_pip(root: &Path) -> Result<bool, String> {
    if pip_install_complete(root) {
        return Ok(false);
    }
    println!(
        "NVRTC not found on this machine: installing {} from PyPI into {}",
        PIP_REQUIREMENTS.join(" "),
        root.display()
    );
    if root.exists() {
        fs::remove_dir_all(root).map_err(|e| format!("cannot clear {}: {e}", root.display()))?;
    }
    let python = env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    let mut cmd = Command::new(&python);
    cmd.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--no-compile",
        "--progress-bar",
        "off",
        "--target",
    ])
    .arg(root)
    .args(PIP_REQUIREMENTS)
    // Harmless on old pips, needed on PEP 668 ("externally managed") systems.
    .env("PIP_BREAK_SYSTEM_PACKAGES", "1")
    .env("PIP_ROOT_USER_ACTION", "ignore");
    crate::util::run(&mut cmd).map_err(|e| {
        format!(
            "{e}\n  (needs `{} -m pip` and access to PyPI; on Debian: apt-get install python3-pip)",
            python.to_string_lossy()
        )
    })?;

    let (lib, inc) = pip_layout(root);
    if !lib.join(NVRTC_PREFIX).is_file() {
        return Err(format!(
            "pip install finished but {} is missing (wheel layout changed?)",
            lib.join(NVRTC_PREFIX).display()
        ));
    }
    if !has_headers(&inc) {
        return Err(format!(
            "pip install finished but {} lacks one of {REQUIRED_HEADERS:?}",
            inc.display()
        ));
    }
    // cudarc tries the unversioned name first; make it resolve to this NVRTC rather
    // than to some other libnvrtc.so on the default search path.
    #[cfg(unix)]
    {
        let link = lib.join("libnvrtc.so");
        if fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(NVRTC_PREFIX, &link)
                .map_err(|e| format!("cannot create {}: {e}", link.display()))?;
        }
    }
    fs::write(root.join(MARKER), PIP_REQUIREMENTS.join(" ") + "\n")
        .map_err(|e| format!("cannot write marker in {}: {e}", root.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pip_layout_paths() {
        let (lib, inc) = pip_layout(Path::new("/t/cuda-pip"));
        assert_eq!(lib, Path::new("/t/cuda-pip/nvidia/cu13/lib"));
        assert_eq!(inc, Path::new("/t/cuda-pip/nvidia/cu13/include"));
    }

    #[test]
    fn ld_library_path_prepends_once() {
        let e = NvrtcEnv {
            lib_dir: PathBuf::from("/x/lib"),
            include_dir: PathBuf::from("/x/include"),
            origin: String::new(),
        };
        let p = e.ld_library_path();
        let first = env::split_paths(&p).next().unwrap();
        assert_eq!(first, Path::new("/x/lib"));
        assert_eq!(
            env::split_paths(&p)
                .filter(|d| d == Path::new("/x/lib"))
                .count(),
            1
        );
    }

    #[test]
    fn incomplete_install_is_not_complete() {
        let dir = env::temp_dir().join(format!("xtask-nvrtc-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        assert!(!pip_install_complete(&dir));
        fs::write(dir.join(MARKER), PIP_REQUIREMENTS.join(" ")).unwrap();
        assert!(!pip_install_complete(&dir), "marker alone is not enough");
        let _ = fs::remove_dir_all(&dir);
    }
}
