//! Run-time kernel compilation: CUDA C++ → NVRTC → CUBIN, with a two-level cache.
//!
//! A kernel is a [`KernelSource`] (one `.cu` file embedded with `include_str!`, its `extern "C"`
//! entry point and any extra headers) plus compile-time constants given as preprocessor defines:
//! a [`KernelSpec`]. Each distinct spec is one specialised kernel; there are no fixed dispatch
//! tables, so any shape the spec allows gets its own compiled code on first use.
//!
//! Compilation targets the device's exact architecture (`sm_90a`, `sm_100a`) and produces CUBIN
//! directly (`nvrtcGetCUBIN`), so no PTX JIT happens at load time.
//!
//! Caches:
//! 1. in memory, per [`crate::Device`] (loaded functions), looked up by the spec itself (its
//!    source's address and its defines: a launch hashes a few short strings, well under a
//!    microsecond); the disk key below is computed only on a miss;
//! 2. on disk under `$TK_CACHE_DIR` (default `$XDG_CACHE_HOME/tile-kernels` or
//!    `~/.cache/tile-kernels`; `TK_CACHE_DIR=off` disables it). The key hashes the entry name,
//!    the full source and headers, the options (defines, include path), the NVRTC version and the
//!    architecture. Entries are written to a temporary file and renamed atomically; every entry
//!    carries a length and checksum, and a corrupt or truncated entry is recompiled and replaced.
//!
//! Inspection knobs: `TK_DUMP_SOURCE=<dir>` writes each compiled source (with its defines) to
//! `<dir>`, `TK_DUMP_PTX=<dir>` also writes the PTX for the virtual architecture
//! (`compute_90a`, ...), and `TK_CUDA_INCLUDE` overrides where the CUDA headers are found.

use std::ffi::{c_char, c_int, CString};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::sys;

use crate::error::{Result, TkError};

/// Headers shared by every kernel, available as `#include "tk/<name>"`.
pub const CORE_HEADERS: &[(&str, &str)] = &[("tk/common.cuh", include_str!("../cuda/common.cuh"))];

/// One CUDA C++ source file and its entry point.
#[derive(Debug)]
pub struct KernelSource {
    /// File name, for messages and dumps (e.g. `batched_transpose.cu`).
    pub file: &'static str,
    /// The `extern "C" __global__` entry point.
    pub entry: &'static str,
    /// The source text.
    pub code: &'static str,
    /// Extra headers beyond [`CORE_HEADERS`]: `(include name, contents)`.
    pub headers: &'static [(&'static str, &'static str)],
    /// True if the source includes CUDA's own headers (`cuda_fp16.h`, `cuda_bf16.h`,
    /// `cuda_fp8.h`, `cuda_fp4.h`), which NVRTC 13 does not carry built in.
    pub needs_cuda_headers: bool,
}

/// A function attribute of a kernel specialisation, set once when the function is loaded
/// ([`crate::Device::function`]), not on every launch. It does not change the compiled code
/// (no part of the disk-cache key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FuncAttr {
    /// Preferred shared-memory carveout in percent of the largest configuration (0-100): a
    /// hint the driver follows when it picks the SM's shared-memory / L1 split for a launch.
    SharedCarveout(u8),
    /// The most dynamic shared memory (bytes) a launch may ask for; launches above the 48 KB
    /// default need it.
    MaxDynamicShared(u32),
}

/// A kernel specialisation: a source plus its compile-time constants (and the function
/// attributes its loaded function gets).
///
/// Two specs are equal (and hash alike) when they name the same `static` [`KernelSource`] (by
/// address), the same defines in the same order and the same attributes: the in-memory kernel
/// cache ([`crate::Device::function`]) looks a launch's function up by this identity, without
/// hashing the source text.
#[derive(Debug, Clone)]
pub struct KernelSpec {
    source: &'static KernelSource,
    defines: Vec<(String, String)>,
    attributes: Vec<FuncAttr>,
}

impl PartialEq for KernelSpec {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.source, other.source)
            && self.defines == other.defines
            && self.attributes == other.attributes
    }
}

impl Eq for KernelSpec {}

impl std::hash::Hash for KernelSpec {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        std::ptr::hash(self.source, h);
        self.defines.hash(h);
        self.attributes.hash(h);
    }
}

impl KernelSpec {
    /// A specialisation of `source` with no defines yet.
    pub fn new(source: &'static KernelSource) -> Self {
        Self {
            source,
            defines: Vec::new(),
            attributes: Vec::new(),
        }
    }

    /// Adds the compile-time constant `-D<name>=<value>`.
    pub fn define(mut self, name: &str, value: impl std::fmt::Display) -> Self {
        self.defines.push((name.to_string(), value.to_string()));
        self
    }

    /// Adds a function attribute, set once when the function is loaded (in the order given).
    pub fn attribute(mut self, a: FuncAttr) -> Self {
        self.attributes.push(a);
        self
    }

    /// The function attributes, in the order given.
    pub fn attributes(&self) -> &[FuncAttr] {
        &self.attributes
    }

    /// The source.
    pub fn source(&self) -> &'static KernelSource {
        self.source
    }

    /// The defines, in the order given.
    pub fn defines(&self) -> &[(String, String)] {
        &self.defines
    }

    /// The defines as `A=1 B=2`, for messages.
    pub fn describe(&self) -> String {
        let d: Vec<String> = self
            .defines
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        d.join(" ")
    }

    fn options(&self, target: &str, include: Option<&Path>) -> Vec<String> {
        let mut o = vec![
            format!("--gpu-architecture={target}"),
            "-std=c++17".to_string(),
        ];
        if target.starts_with("sm_") {
            o.push("--ptxas-options=-v".into());
        }
        if let Some(dir) = include {
            o.push(format!("-I{}", dir.display()));
        }
        o.extend(self.defines.iter().map(|(k, v)| format!("-D{k}={v}")));
        o
    }

    /// The cache key for this spec on `arch`: a 128-bit hash (hex) of everything that can
    /// change the compiled code. Errors if NVRTC can't be loaded or needed headers are missing.
    pub fn cache_key(&self, arch: &str) -> Result<String> {
        let include = self.include_dir()?;
        let (major, minor) = nvrtc_version()?;
        let mut h = Hasher128::new();
        h.write_str("tile-kernels cubin v1");
        h.write_str(self.source.entry);
        h.write_str(self.source.file);
        h.write_str(self.source.code);
        for (name, text) in CORE_HEADERS.iter().chain(self.source.headers) {
            h.write_str(name);
            h.write_str(text);
        }
        for o in self.options(arch, include.as_deref()) {
            h.write_str(&o);
        }
        h.write_str(&format!("nvrtc {major}.{minor}"));
        h.write_str(arch);
        Ok(h.hex())
    }

    fn include_dir(&self) -> Result<Option<PathBuf>> {
        let (found, searched) = cuda_include_dir();
        match found {
            Some(d) => Ok(Some(d)),
            None if self.source.needs_cuda_headers => {
                Err(TkError::CudaHeadersNotFound { searched })
            }
            None => Ok(None),
        }
    }
}

/// The output of one NVRTC compilation.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// CUBIN for a real architecture (`sm_*`), or NUL-free PTX text bytes for a virtual one.
    pub image: Vec<u8>,
    /// The compiler log (warnings and, for `sm_*` targets, ptxas resource usage).
    pub log: String,
}

impl Compiled {
    /// The ptxas resource summary (`Used N registers, ...` and spill lines) from the log.
    /// Informational only, and empty when ptxas did not run: on the H200 machines NVRTC serves
    /// a source it compiled before from a cache, with an empty log.
    pub fn resource_usage(&self) -> String {
        let lines: Vec<&str> = self
            .log
            .lines()
            .filter(|l| l.contains("Used ") || l.contains("spill") || l.contains("stack frame"))
            // Drop ptxas's "ptxas info    :" / "ptxas         ." prefixes.
            .map(|l| {
                let start = [l.find("Used"), l.find(|c: char| c.is_ascii_digit())];
                l[start.into_iter().flatten().min().unwrap_or(0)..].trim()
            })
            .collect();
        lines.join("; ")
    }
}

/// Returns an error unless NVRTC can be loaded (cudarc panics otherwise).
pub fn check_nvrtc_loadable() -> Result<()> {
    // Probed once per process: the dynamic loader's search path does not change after start-up,
    // and each probe dlopens every candidate name (hundreds of µs).
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the library by its candidate names; no symbol is called.
    if *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() }) {
        Ok(())
    } else {
        Err(TkError::LibraryNotFound {
            lib: "libnvrtc (CUDA 13 NVRTC)",
            hint: "install it with `python3 -m pip install nvidia-cuda-nvrtc==13.0.*` and add \
                   <site-packages>/nvidia/cu13/lib to LD_LIBRARY_PATH, or install the CUDA 13 toolkit \
                   and add its lib64 folder to LD_LIBRARY_PATH (`cargo xtask test` does this itself)"
                .into(),
        })
    }
}

/// The NVRTC version `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    static VERSION: OnceLock<(i32, i32)> = OnceLock::new();
    if let Some(v) = VERSION.get() {
        return Ok(*v);
    }
    check_nvrtc_loadable()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: NVRTC is loadable (checked above); both pointers are valid for writes.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    nvrtc_ok(r, "nvrtcVersion")?;
    Ok(*VERSION.get_or_init(|| (major, minor)))
}

fn nvrtc_ok(r: sys::nvrtcResult, what: &str) -> Result<()> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(TkError::Compile {
            kernel: what.into(),
            arch: String::new(),
            defines: String::new(),
            log: format!("{r:?}"),
        })
    }
}

/// The CUDA headers a folder must hold to be used as the include path.
pub const CUDA_HEADERS: &[&str] = &["cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cuda_fp4.h"];

/// Folders searched for the CUDA headers, in order, and the first that holds all of
/// [`CUDA_HEADERS`].
///
/// Order: `$TK_CUDA_INCLUDE`, `$CUDA_HOME/include`, `$CUDA_PATH/include`,
/// `/usr/local/cuda/include`, then for each `$LD_LIBRARY_PATH` entry `<entry>/../include` (this
/// finds pip's `site-packages/nvidia/cu13/include` next to the NVRTC that is being used).
pub fn cuda_include_dir() -> (Option<PathBuf>, String) {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("TK_CUDA_INCLUDE") {
        candidates.push(PathBuf::from(d));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(d) = std::env::var_os(var) {
            candidates.push(PathBuf::from(d).join("include"));
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
        candidates.extend(
            std::env::split_paths(&paths)
                .filter(|p| !p.as_os_str().is_empty())
                .map(|p| p.join("../include")),
        );
    }
    let found = candidates
        .iter()
        .find(|d| CUDA_HEADERS.iter().all(|h| d.join(h).is_file()))
        .cloned();
    let searched = candidates
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    (found, searched)
}

/// Compiles `spec` with NVRTC for `target`: a real architecture (`sm_90a`, `sm_100a`) gives
/// CUBIN, a virtual one (`compute_90a`) gives PTX. No GPU is needed.
pub fn compile(spec: &KernelSpec, target: &str) -> Result<Compiled> {
    check_nvrtc_loadable()?;
    let include = spec.include_dir()?;
    let src = spec.source();
    let err = |log: String| TkError::Compile {
        kernel: src.entry.into(),
        arch: target.into(),
        defines: spec.describe(),
        log,
    };
    let cstr = |s: &str| CString::new(s).map_err(|_| err(format!("NUL byte in {s:?}")));
    let code = cstr(src.code)?;
    let file = cstr(src.file)?;
    let headers: Vec<(CString, CString)> = CORE_HEADERS
        .iter()
        .chain(src.headers)
        .map(|(n, t)| Ok((cstr(t)?, cstr(n)?)))
        .collect::<Result<_>>()?;
    let header_texts: Vec<*const c_char> = headers.iter().map(|(t, _)| t.as_ptr()).collect();
    let header_names: Vec<*const c_char> = headers.iter().map(|(_, n)| n.as_ptr()).collect();
    let options: Vec<CString> = spec
        .options(target, include.as_deref())
        .iter()
        .map(|o| cstr(o))
        .collect::<Result<_>>()?;
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();

    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: all strings are NUL-terminated and outlive the program; the header arrays have
    // `headers.len()` entries each.
    let r = unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            code.as_ptr(),
            file.as_ptr(),
            headers.len() as c_int,
            header_texts.as_ptr(),
            header_names.as_ptr(),
        )
    };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(err(format!("nvrtcCreateProgram: {r:?}")));
    }
    let program = Program(prog);
    // SAFETY: `program` is a live program; the option array has `option_ptrs.len()` entries.
    let compiled = unsafe {
        sys::nvrtcCompileProgram(program.0, option_ptrs.len() as c_int, option_ptrs.as_ptr())
    };
    let log = program.log();
    if compiled != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(err(log));
    }
    let image = if target.starts_with("sm_") {
        program.output(sys::nvrtcGetCUBINSize, sys::nvrtcGetCUBIN)
    } else {
        program
            .output(sys::nvrtcGetPTXSize, sys::nvrtcGetPTX)
            .map(|mut p| {
                while p.last() == Some(&0) {
                    p.pop();
                }
                p
            })
    }
    .map_err(|r| err(format!("reading the compiled image: {r:?}")))?;
    Ok(Compiled { image, log })
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

type SizeFn = unsafe fn(sys::nvrtcProgram, *mut usize) -> sys::nvrtcResult;
type DataFn = unsafe fn(sys::nvrtcProgram, *mut c_char) -> sys::nvrtcResult;

impl Program {
    fn output(&self, size: SizeFn, data: DataFn) -> std::result::Result<Vec<u8>, sys::nvrtcResult> {
        let mut n = 0usize;
        // SAFETY: the program is live and `n` is valid for writes.
        let r = unsafe { size(self.0, &mut n) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(r);
        }
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` has the `n` bytes NVRTC asked for.
        let r = unsafe { data(self.0, buf.as_mut_ptr().cast()) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(r);
        }
        Ok(buf)
    }

    fn log(&self) -> String {
        self.output(sys::nvrtcGetProgramLogSize, sys::nvrtcGetProgramLog)
            .map(|b| {
                String::from_utf8_lossy(&b)
                    .trim_end_matches('\0')
                    .trim()
                    .to_string()
            })
            .unwrap_or_default()
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed exactly once.
        unsafe {
            sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

// ----- disk cache ---------------------------------------------------------------------------------

/// Where a cubin came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from a valid disk-cache entry.
    Hit,
    /// Not cached (or caching is off): compiled, then stored.
    Miss,
    /// A corrupt or truncated entry was found: compiled again and the entry replaced.
    Replaced,
}

/// The on-disk CUBIN cache: one file per key, `<dir>/<key>.cubin`.
///
/// File format: magic `TKCUBIN1`, payload length (u64 LE), FNV-1a 64 checksum of the payload
/// (u64 LE), payload.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
}

const MAGIC: &[u8; 8] = b"TKCUBIN1";

impl DiskCache {
    /// A cache in `dir` (created on first store).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The cache configured by the environment: `$TK_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/tile-kernels`, else `$HOME/.cache/tile-kernels`; `None` when
    /// `TK_CACHE_DIR=off` or no folder can be determined.
    pub fn from_env() -> Option<Self> {
        match std::env::var_os("TK_CACHE_DIR") {
            Some(v) if v == "off" => None,
            Some(v) if !v.is_empty() => Some(Self::new(v)),
            _ => std::env::var_os("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|d| Self::new(d.join("tile-kernels"))),
        }
    }

    /// The cache folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file for `key`.
    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.cubin"))
    }

    /// The entry for `key`: `Ok(None)` if absent (or the key is not a valid file name),
    /// `Err(())` if present but corrupt or truncated.
    #[allow(clippy::result_unit_err)]
    pub fn load(&self, key: &str) -> std::result::Result<Option<Vec<u8>>, ()> {
        if !valid_key(key) {
            return Ok(None);
        }
        let Ok(bytes) = std::fs::read(self.path(key)) else {
            return Ok(None);
        };
        if bytes.len() < 24 || &bytes[..8] != MAGIC {
            return Err(());
        }
        let len = u64::from_le_bytes(bytes[8..16].try_into().map_err(|_| ())?) as usize;
        let sum = u64::from_le_bytes(bytes[16..24].try_into().map_err(|_| ())?);
        let payload = &bytes[24..];
        if payload.len() != len || fnv1a64(payload, FNV_OFFSET) != sum {
            return Err(());
        }
        Ok(Some(payload.to_vec()))
    }

    /// Stores `payload` under `key` atomically (temporary file, then rename).
    pub fn store(&self, key: &str, payload: &[u8]) -> Result<()> {
        if !valid_key(key) {
            return Err(TkError::param(
                "key",
                "cache keys are non-empty [0-9A-Za-z_-] strings",
            ));
        }
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| TkError::Io { path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let tmp = self.dir.join(format!(
            ".{key}.{}.{nanos}.{}.tmp",
            std::process::id(),
            next_seq()
        ));
        let mut data = Vec::with_capacity(payload.len() + 24);
        data.extend_from_slice(MAGIC);
        data.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        data.extend_from_slice(&fnv1a64(payload, FNV_OFFSET).to_le_bytes());
        data.extend_from_slice(payload);
        std::fs::write(&tmp, &data).map_err(io(&tmp))?;
        let dst = self.path(key);
        std::fs::rename(&tmp, &dst).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(&dst)(e)
        })
    }
}

/// Keys name files in the cache folder: no separators, no `..`.
fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A process-wide sequence number, so temp files of concurrent stores never share a name.
fn next_seq() -> u64 {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The CUBIN for `spec` on `arch` through `cache` (compiling on a miss or a corrupt entry).
pub fn cubin_with_cache(
    spec: &KernelSpec,
    arch: &str,
    key: &str,
    cache: Option<&DiskCache>,
) -> Result<(Vec<u8>, CacheOutcome)> {
    let mut outcome = CacheOutcome::Miss;
    if let Some(c) = cache {
        match c.load(key) {
            Ok(Some(cubin)) => return Ok((cubin, CacheOutcome::Hit)),
            Ok(None) => {}
            Err(()) => outcome = CacheOutcome::Replaced,
        }
    }
    let compiled = compile(spec, arch)?;
    dump(spec, arch, key)?;
    if let Some(c) = cache {
        // A cache that can't be written (read-only home, full disk) must not fail the op.
        if let Err(e) = c.store(key, &compiled.image) {
            warn_once(&format!(
                "tile-kernels: kernel disk cache disabled for this entry: {e}"
            ));
        }
    }
    Ok((compiled.image, outcome))
}

pub(crate) fn cubin_cached(spec: &KernelSpec, arch: &str, key: &str) -> Result<Vec<u8>> {
    cubin_with_cache(spec, arch, key, DiskCache::from_env().as_ref()).map(|(c, _)| c)
}

fn warn_once(msg: &str) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| eprintln!("{msg}"));
}

/// Honours `TK_DUMP_SOURCE` and `TK_DUMP_PTX` (see the module docs).
fn dump(spec: &KernelSpec, arch: &str, key: &str) -> Result<()> {
    let stem = format!(
        "{}-{arch}-{}",
        spec.source().entry,
        key.get(..12).unwrap_or(key)
    );
    let io = |path: PathBuf| {
        move |source| TkError::Io {
            path: path.display().to_string(),
            source,
        }
    };
    if let Some(dir) = std::env::var_os("TK_DUMP_SOURCE").map(PathBuf::from) {
        std::fs::create_dir_all(&dir).map_err(io(dir.clone()))?;
        let mut text = String::new();
        for (k, v) in spec.defines() {
            let _ = writeln!(text, "#define {k} {v}");
        }
        text.push_str(spec.source().code);
        let path = dir.join(format!("{stem}.cu"));
        std::fs::write(&path, text).map_err(io(path.clone()))?;
        // The headers too, so that `nvcc -I<dir> <stem>.cu` compiles the dump on its own.
        for (name, body) in CORE_HEADERS.iter().chain(spec.source().headers) {
            let path = dir.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(io(parent.to_path_buf()))?;
            }
            std::fs::write(&path, body).map_err(io(path.clone()))?;
        }
    }
    if let Some(dir) = std::env::var_os("TK_DUMP_PTX").map(PathBuf::from) {
        std::fs::create_dir_all(&dir).map_err(io(dir.clone()))?;
        let virt = arch.replacen("sm_", "compute_", 1);
        let ptx = compile(spec, &virt)?;
        let path = dir.join(format!("{stem}.ptx"));
        std::fs::write(&path, &ptx.image).map_err(io(path.clone()))?;
    }
    Ok(())
}

// ----- hashing --------------------------------------------------------------------------------

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a64(data: &[u8], seed: u64) -> u64 {
    data.iter()
        .fold(seed, |h, &b| (h ^ b as u64).wrapping_mul(FNV_PRIME))
}

/// Two independent FNV-1a 64 streams; fields are length-prefixed so concatenations can't collide.
struct Hasher128(u64, u64);

impl Hasher128 {
    fn new() -> Self {
        Self(FNV_OFFSET, FNV_OFFSET ^ 0x9e37_79b9_7f4a_7c15)
    }
    fn write_str(&mut self, s: &str) {
        let len = (s.len() as u64).to_le_bytes();
        self.0 = fnv1a64(s.as_bytes(), fnv1a64(&len, self.0));
        self.1 = fnv1a64(s.as_bytes(), fnv1a64(&len, self.1.rotate_left(17)));
    }
    fn hex(&self) -> String {
        format!("{:016x}{:016x}", self.0, self.1)
    }
}
