//! Tests of `tk_core::kernel`: the on-disk CUBIN cache ([`DiskCache`]), kernel specialisations
//! ([`KernelSpec`]) and NVRTC compilation. No GPU is needed.
//!
//! Tests that call NVRTC skip (printing `SKIPPED <test>: <reason>` to stderr) when it can't be
//! loaded, unless `TK_REQUIRE_NVRTC=1`, in which case they fail. `cargo xtask test` puts NVRTC
//! on `LD_LIBRARY_PATH`, so CI runs them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{RwLock, RwLockReadGuard};

use tk_core::kernel::{
    check_nvrtc_loadable, compile, cubin_with_cache, cuda_include_dir, nvrtc_version, CacheOutcome,
    DiskCache,
};
use tk_core::{KernelSource, KernelSpec, TkError};

// ---------------------------------------------------------------------------------------------
// Test kernels
// ---------------------------------------------------------------------------------------------

/// A tiny kernel specialised by `TK_N`, using the core header.
static SRC: KernelSource = KernelSource {
    file: "tk_test_fill.cu",
    entry: "tk_test_fill",
    code: r#"
#include "tk/common.cuh"
#ifndef TK_N
#error "TK_N must be defined"
#endif
extern "C" __global__ void tk_test_fill(tk::u32* out) {
    tk::u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < tk::ceil_div<tk::u32>(TK_N, 1u)) {
        out[i] = i * 3u + TK_N;
    }
}
"#,
    headers: &[],
    needs_cuda_headers: false,
};

/// Same entry point and define as [`SRC`], different code and an extra header.
static SRC_OTHER: KernelSource = KernelSource {
    file: "tk_test_fill.cu",
    entry: "tk_test_fill",
    code: r#"
#include "tk/common.cuh"
#include "tk_test/extra.cuh"
extern "C" __global__ void tk_test_fill(tk::u32* out) {
    tk::u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < TK_N) out[i] = tk_test::twice(i);
}
"#,
    headers: &[(
        "tk_test/extra.cuh",
        "#pragma once\nnamespace tk_test { __device__ inline unsigned twice(unsigned x) { return 2u * x; } }\n",
    )],
    needs_cuda_headers: false,
};

/// A kernel with a syntax error (missing `;`).
static SRC_BAD: KernelSource = KernelSource {
    file: "tk_test_bad.cu",
    entry: "tk_test_bad",
    code: r#"
#include "tk/common.cuh"
extern "C" __global__ void tk_test_bad(tk::u32* out) {
    tk::u32 i = threadIdx.x
    if (i < TK_N) out[i] = i;
}
"#,
    headers: &[],
    needs_cuda_headers: false,
};

/// A kernel that needs CUDA's own headers.
static SRC_BF16: KernelSource = KernelSource {
    file: "tk_test_bf16.cu",
    entry: "tk_test_bf16",
    code: r#"
#include <cuda_bf16.h>
#include "tk/common.cuh"
extern "C" __global__ void tk_test_bf16(const float* in, __nv_bfloat16* out) {
    tk::u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < TK_N) out[i] = __float2bfloat16_rn(in[i]);
}
"#,
    headers: &[],
    needs_cuda_headers: true,
};

fn spec(n: u32) -> KernelSpec {
    KernelSpec::new(&SRC).define("TK_N", n)
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Serialises environment changes against everything that may read the environment from C
/// (NVRTC): NVRTC tests hold it shared, the one test that sets variables holds it exclusively.
static ENV_LOCK: RwLock<()> = RwLock::new(());

fn env_shared() -> RwLockReadGuard<'static, ()> {
    ENV_LOCK.read().unwrap_or_else(|p| p.into_inner())
}

/// True when NVRTC can be loaded. Otherwise prints `SKIPPED <test>: <reason>` (straight to
/// stderr, which the test harness doesn't capture) and returns false, or panics when
/// `TK_REQUIRE_NVRTC=1`.
fn nvrtc_or_skip(test: &str) -> bool {
    match check_nvrtc_loadable() {
        Ok(()) => true,
        Err(e) if std::env::var("TK_REQUIRE_NVRTC").as_deref() == Ok("1") => {
            panic!("{test}: TK_REQUIRE_NVRTC=1 but NVRTC cannot be loaded: {e}")
        }
        Err(e) => {
            tk_core::testing::report_skip(test, format_args!("{e}"));
            false
        }
    }
}

/// A fresh, uniquely named folder under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "tk-core-kernel-cache-{tag}-{}-{nanos}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        assert!(!dir.exists(), "{} already exists", dir.display());
        std::fs::create_dir_all(&dir).expect("creating the temp dir");
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Names of the files in `dir`.
fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("reading the cache dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// Leftover temporary files (`.*.tmp`) in `dir`.
fn temp_files(dir: &Path) -> Vec<String> {
    file_names(dir)
        .into_iter()
        .filter(|n| n.starts_with('.') && n.ends_with(".tmp"))
        .collect()
}

/// Independent FNV-1a 64 (the cache format's checksum).
fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn payload(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";

// ---------------------------------------------------------------------------------------------
// DiskCache (no NVRTC)
// ---------------------------------------------------------------------------------------------

#[test]
fn disk_cache_store_then_load() {
    let tmp = TempDir::new("roundtrip");
    // The cache folder doesn't exist yet: store creates it.
    let cache = DiskCache::new(tmp.path().join("nested").join("cache"));
    assert_eq!(cache.dir(), tmp.path().join("nested").join("cache"));
    let key = "0123456789abcdef0123456789abcdef";
    assert_eq!(cache.path(key), cache.dir().join(format!("{key}.cubin")));
    let data = payload(10_000, 1);
    cache.store(key, &data).unwrap();
    assert_eq!(cache.load(key), Ok(Some(data.clone())));
    // Loads are repeatable and other keys are unaffected.
    assert_eq!(cache.load(key), Ok(Some(data.clone())));
    assert_eq!(cache.load("another"), Ok(None));
    // An empty payload round-trips too.
    cache.store("empty", &[]).unwrap();
    assert_eq!(cache.load("empty"), Ok(Some(Vec::new())));
    // A second handle on the same folder sees the entries.
    assert_eq!(DiskCache::new(cache.dir()).load(key), Ok(Some(data)));
}

#[test]
fn disk_cache_file_format() {
    let tmp = TempDir::new("format");
    let cache = DiskCache::new(tmp.path());
    let data = payload(1000, 7);
    cache.store("k", &data).unwrap();
    let bytes = std::fs::read(cache.path("k")).unwrap();
    // Magic, payload length (u64 LE), FNV-1a 64 of the payload (u64 LE), payload.
    assert_eq!(&bytes[..8], b"TKCUBIN1");
    assert_eq!(bytes[8..16], (data.len() as u64).to_le_bytes());
    assert_eq!(bytes[16..24], fnv1a64(&data).to_le_bytes());
    assert_eq!(&bytes[24..], &data[..]);
    // A file written by hand in that format loads.
    let other = payload(77, 9);
    let mut file = b"TKCUBIN1".to_vec();
    file.extend_from_slice(&(other.len() as u64).to_le_bytes());
    file.extend_from_slice(&fnv1a64(&other).to_le_bytes());
    file.extend_from_slice(&other);
    std::fs::write(cache.path("hand"), file).unwrap();
    assert_eq!(cache.load("hand"), Ok(Some(other)));
}

#[test]
fn disk_cache_absent_key_is_none() {
    let tmp = TempDir::new("absent");
    let cache = DiskCache::new(tmp.path());
    assert_eq!(cache.load("nothing-here"), Ok(None));
    // Also when the folder doesn't exist at all.
    let missing = DiskCache::new(tmp.path().join("does-not-exist"));
    assert_eq!(missing.load("nothing-here"), Ok(None));
    assert!(!missing.dir().exists(), "load must not create the folder");
}

#[test]
fn disk_cache_detects_corrupt_entries() {
    let tmp = TempDir::new("corrupt");
    let cache = DiskCache::new(tmp.path());
    let data = payload(4096, 3);
    cache.store("good", &data).unwrap();
    let good = std::fs::read(cache.path("good")).unwrap();
    assert_eq!(good.len(), 24 + data.len());

    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        b
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated payload", good[..good.len() - 1].to_vec()),
        ("truncated to half", good[..good.len() / 2].to_vec()),
        ("truncated header", good[..20].to_vec()),
        ("header only", good[..24].to_vec()),
        ("empty file", Vec::new()),
        ("payload byte flipped", with(&|b| b[24 + 1234] ^= 0x01)),
        (
            "last payload byte flipped",
            with(&|b| *b.last_mut().unwrap() ^= 0x80),
        ),
        ("bad magic", with(&|b| b[..8].copy_from_slice(b"TKCUBIN0"))),
        ("checksum changed", with(&|b| b[16] ^= 0xFF)),
        (
            "length field too small",
            with(&|b| b[8..16].copy_from_slice(&((data.len() - 1) as u64).to_le_bytes())),
        ),
        (
            "length field huge",
            with(&|b| b[8..16].copy_from_slice(&u64::MAX.to_le_bytes())),
        ),
        ("trailing byte", with(&|b| b.push(0))),
    ];
    // Sanity of the case list itself: every case differs from the good file.
    assert!(cases.iter().all(|(_, b)| b != &good));

    for (what, bytes) in cases {
        std::fs::write(cache.path("entry"), &bytes).unwrap();
        assert_eq!(cache.load("entry"), Err(()), "{what}: not detected");
    }
    // Storing over a corrupt entry repairs it.
    cache.store("entry", &data).unwrap();
    assert_eq!(cache.load("entry"), Ok(Some(data)));
}

#[test]
fn disk_cache_store_overwrites_and_leaves_no_temp_files() {
    let tmp = TempDir::new("overwrite");
    let cache = DiskCache::new(tmp.path());
    let (a, b) = (payload(5000, 1), payload(300, 2));
    cache.store("k", &a).unwrap();
    assert!(
        temp_files(tmp.path()).is_empty(),
        "{:?}",
        file_names(tmp.path())
    );
    // A shorter payload fully replaces a longer one (no stale tail).
    cache.store("k", &b).unwrap();
    assert_eq!(cache.load("k"), Ok(Some(b.clone())));
    cache.store("k", &a).unwrap();
    assert_eq!(cache.load("k"), Ok(Some(a)));
    for i in 0..20 {
        cache
            .store(&format!("key{i}"), &payload(i * 10, i as u8))
            .unwrap();
    }
    assert!(
        temp_files(tmp.path()).is_empty(),
        "{:?}",
        file_names(tmp.path())
    );
    let names = file_names(tmp.path());
    assert_eq!(names.len(), 21, "{names:?}");
    assert!(names.iter().all(|n| n.ends_with(".cubin")), "{names:?}");
}

/// While one thread keeps replacing an entry, readers only ever see a complete old or new entry.
#[test]
fn disk_cache_store_is_atomic_for_readers() {
    let tmp = TempDir::new("atomic");
    let cache = DiskCache::new(tmp.path());
    let (a, b) = (payload(200_000, 1), payload(120_000, 2));
    cache.store("k", &a).unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..3)
            .map(|_| {
                s.spawn(|| {
                    let mut loads = 0usize;
                    while !done.load(Ordering::Acquire) || loads == 0 {
                        match cache.load("k") {
                            Ok(Some(p)) if p == a || p == b => {}
                            Ok(Some(p)) => panic!("unexpected payload of {} bytes", p.len()),
                            other => panic!("reader saw {:?}", other.map(|o| o.map(|p| p.len()))),
                        }
                        loads += 1;
                    }
                    loads
                })
            })
            .collect();
        for i in 0..100 {
            let p = if i % 2 == 0 { &b } else { &a };
            cache.store("k", p).unwrap();
        }
        done.store(true, Ordering::Release);
        for r in readers {
            assert!(r.join().expect("reader panicked") > 0);
        }
    });
    assert_eq!(cache.load("k"), Ok(Some(a)));
    assert!(
        temp_files(tmp.path()).is_empty(),
        "{:?}",
        file_names(tmp.path())
    );
}

#[test]
fn disk_cache_store_error_is_io() {
    let tmp = TempDir::new("io-error");
    // The cache "folder" is a regular file, so it can't be created.
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let cache = DiskCache::new(&file);
    match cache.store("k", b"payload") {
        Err(TkError::Io { path, .. }) => assert!(path.contains("a-file"), "{path}"),
        other => panic!("expected TkError::Io, got {other:?}"),
    }
    assert_eq!(cache.load("k"), Ok(None));
}

/// Every environment change of this test binary happens here, under the exclusive lock, and is
/// undone on exit (also on failure).
#[test]
fn disk_cache_from_env() {
    struct Restore(Vec<(&'static str, Option<OsString>)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            for (k, v) in &self.0 {
                match v {
                    Some(v) => std::env::set_var(k, v),
                    None => std::env::remove_var(k),
                }
            }
        }
    }
    let _lock = ENV_LOCK.write().unwrap_or_else(|p| p.into_inner());
    let vars = ["TK_CACHE_DIR", "XDG_CACHE_HOME", "HOME"];
    let _restore = Restore(vars.iter().map(|&k| (k, std::env::var_os(k))).collect());
    let dir_of = || DiskCache::from_env().map(|c| c.dir().to_path_buf());

    std::env::set_var("HOME", "/tk-test/home");
    std::env::set_var("XDG_CACHE_HOME", "/tk-test/xdg");

    std::env::set_var("TK_CACHE_DIR", "/tk-test/explicit cache");
    assert_eq!(dir_of(), Some(PathBuf::from("/tk-test/explicit cache")));
    let c = DiskCache::from_env().unwrap();
    assert_eq!(
        c.path("abc"),
        PathBuf::from("/tk-test/explicit cache/abc.cubin")
    );

    std::env::set_var("TK_CACHE_DIR", "off");
    assert_eq!(dir_of(), None, "TK_CACHE_DIR=off must disable the cache");

    // Empty or unset TK_CACHE_DIR: $XDG_CACHE_HOME/tile-kernels.
    std::env::set_var("TK_CACHE_DIR", "");
    assert_eq!(dir_of(), Some(PathBuf::from("/tk-test/xdg/tile-kernels")));
    std::env::remove_var("TK_CACHE_DIR");
    assert_eq!(dir_of(), Some(PathBuf::from("/tk-test/xdg/tile-kernels")));

    // Then $HOME/.cache/tile-kernels.
    std::env::remove_var("XDG_CACHE_HOME");
    assert_eq!(
        dir_of(),
        Some(PathBuf::from("/tk-test/home/.cache/tile-kernels"))
    );

    // No folder can be determined.
    std::env::remove_var("HOME");
    assert_eq!(dir_of(), None);

    // An explicit folder wins over everything.
    std::env::set_var("TK_CACHE_DIR", "/tk-test/again");
    assert_eq!(dir_of(), Some(PathBuf::from("/tk-test/again")));
}

// ---------------------------------------------------------------------------------------------
// KernelSpec (no NVRTC)
// ---------------------------------------------------------------------------------------------

#[test]
fn kernel_spec_describe_and_defines() {
    let empty = KernelSpec::new(&SRC);
    assert_eq!(empty.describe(), "");
    assert!(empty.defines().is_empty());
    assert!(std::ptr::eq(empty.source(), &SRC));

    let s = KernelSpec::new(&SRC)
        .define("TK_N", 256)
        .define("B", "x")
        .define("A", 2.5)
        .define("TK_N", 7u8);
    // In the order given, duplicates kept, values formatted with Display.
    let names: Vec<(&str, &str)> = s
        .defines()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        names,
        vec![("TK_N", "256"), ("B", "x"), ("A", "2.5"), ("TK_N", "7")]
    );
    assert_eq!(s.describe(), "TK_N=256 B=x A=2.5 TK_N=7");
    assert_eq!(s.source().entry, "tk_test_fill");
    // Clones are independent.
    let t = s.clone().define("C", -1);
    assert_eq!(s.defines().len(), 4);
    assert_eq!(t.describe(), "TK_N=256 B=x A=2.5 TK_N=7 C=-1");
}

/// Without NVRTC everything that needs it returns a typed error instead of panicking; with it,
/// the version is sane.
#[test]
fn nvrtc_absence_is_a_typed_error() {
    let _env = env_shared();
    match check_nvrtc_loadable() {
        Ok(()) => {
            let (major, minor) = nvrtc_version().unwrap();
            assert!(major >= 12, "NVRTC {major}.{minor}");
        }
        Err(e) => {
            assert!(
                matches!(e, TkError::LibraryNotFound { .. }),
                "check_nvrtc_loadable: {e:?}"
            );
            assert!(matches!(
                nvrtc_version(),
                Err(TkError::LibraryNotFound { .. })
            ));
            assert!(matches!(
                compile(&spec(4), "sm_90a"),
                Err(TkError::LibraryNotFound { .. })
            ));
            assert!(matches!(
                spec(4).cache_key("sm_90a"),
                Err(TkError::LibraryNotFound { .. })
            ));
            let tmp = TempDir::new("no-nvrtc");
            let cache = DiskCache::new(tmp.path());
            assert!(matches!(
                cubin_with_cache(&spec(4), "sm_90a", &"0".repeat(32), Some(&cache)),
                Err(TkError::LibraryNotFound { .. })
            ));
            // A kernel that needs the CUDA headers reports them first when they are missing.
            if cuda_include_dir().0.is_none() {
                let bf16 = KernelSpec::new(&SRC_BF16).define("TK_N", 4);
                assert!(matches!(
                    bf16.cache_key("sm_90a"),
                    Err(TkError::CudaHeadersNotFound { .. })
                ));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// With NVRTC (skipped without it)
// ---------------------------------------------------------------------------------------------

#[test]
fn kernel_spec_cache_key() {
    let _env = env_shared();
    if !nvrtc_or_skip("kernel_spec_cache_key") {
        return;
    }
    let k = spec(64).cache_key("sm_90a").unwrap();
    assert_eq!(k.len(), 32, "{k}");
    assert!(
        k.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)),
        "{k}"
    );
    // Stable across calls and clones.
    assert_eq!(spec(64).cache_key("sm_90a").unwrap(), k);
    assert_eq!(spec(64).clone().cache_key("sm_90a").unwrap(), k);
    // Anything that changes the code changes the key.
    let others = [
        ("define value", spec(65).cache_key("sm_90a").unwrap()),
        (
            "extra define",
            spec(64).define("TK_M", 1).cache_key("sm_90a").unwrap(),
        ),
        (
            "define name",
            KernelSpec::new(&SRC)
                .define("TK_M", 64)
                .cache_key("sm_90a")
                .unwrap(),
        ),
        ("arch", spec(64).cache_key("sm_100a").unwrap()),
        (
            "source",
            KernelSpec::new(&SRC_OTHER)
                .define("TK_N", 64)
                .cache_key("sm_90a")
                .unwrap(),
        ),
    ];
    for (what, other) in &others {
        assert_ne!(other, &k, "key unchanged by {what}");
    }
    for (i, (wi, ki)) in others.iter().enumerate() {
        for (wj, kj) in &others[i + 1..] {
            assert_ne!(ki, kj, "{wi} and {wj} collide");
        }
    }
}

#[test]
fn kernel_spec_attributes_are_identity_but_not_code() {
    use std::collections::hash_map::DefaultHasher;
    use std::hash::{Hash, Hasher};
    use tk_core::FuncAttr;
    let hash = |s: &KernelSpec| {
        let mut h = DefaultHasher::new();
        s.hash(&mut h);
        h.finish()
    };
    let plain = spec(64);
    let carve = spec(64).attribute(FuncAttr::SharedCarveout(100));
    let both = carve
        .clone()
        .attribute(FuncAttr::MaxDynamicShared(24 << 10));
    assert_eq!(
        both.attributes(),
        &[
            FuncAttr::SharedCarveout(100),
            FuncAttr::MaxDynamicShared(24 << 10)
        ]
    );
    // A spec with other attributes is another function of the in-memory cache...
    assert_ne!(plain, carve);
    assert_ne!(carve, both);
    assert_ne!(carve, spec(64).attribute(FuncAttr::SharedCarveout(50)));
    assert_eq!(both, both.clone());
    assert_eq!(hash(&both), hash(&both.clone()));
    assert_ne!(hash(&plain), hash(&carve));
    // ... but the same compiled code: the disk-cache key ignores attributes.
    if !nvrtc_or_skip("kernel_spec_attributes_are_identity_but_not_code") {
        return;
    }
    let k = plain.cache_key("sm_90a").unwrap();
    assert_eq!(both.cache_key("sm_90a").unwrap(), k);
}

#[test]
fn compile_sm90a_gives_cubin() {
    let _env = env_shared();
    if !nvrtc_or_skip("compile_sm90a_gives_cubin") {
        return;
    }
    let c = compile(&spec(256), "sm_90a").unwrap();
    assert!(c.image.len() > 64, "{} bytes", c.image.len());
    assert_eq!(&c.image[..4], ELF_MAGIC);
    assert_eq!(c.image[4], 2, "not a 64-bit ELF");
    // e_machine = EM_CUDA (190).
    assert_eq!(u16::from_le_bytes([c.image[18], c.image[19]]), 190);
    // The entry point is a symbol of the image.
    assert!(c
        .image
        .windows(SRC.entry.len())
        .any(|w| w == SRC.entry.as_bytes()));
    // ptxas reports resources only when it runs: on a machine whose NVRTC serves repeated
    // compiles from a cache (seen on the H200: empty log from the second run on), only a
    // never-seen source shows it, so compile one with a unique constant.
    // The constant is baked into the code, so the PTX differs too.
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let fresh = compile(&spec(1000 + (nonce % 1_000_000_000) as u32), "sm_90a").unwrap();
    let usage = fresh.resource_usage();
    assert!(
        !usage.is_empty(),
        "no resource usage in log {:?}",
        fresh.log
    );
    assert!(usage.contains("registers"), "{usage}");
    // Compiling again gives the same bytes (the disk cache relies on it being a pure function).
    assert_eq!(compile(&spec(256), "sm_90a").unwrap().image, c.image);
    // A different specialisation gives different code.
    assert_ne!(compile(&spec(257), "sm_90a").unwrap().image, c.image);
}

#[test]
fn compile_sm100a_gives_cubin() {
    let _env = env_shared();
    if !nvrtc_or_skip("compile_sm100a_gives_cubin") {
        return;
    }
    let c = compile(&spec(256), "sm_100a").unwrap();
    assert_eq!(&c.image[..4], ELF_MAGIC);
    assert_ne!(c.image, compile(&spec(256), "sm_90a").unwrap().image);
}

#[test]
fn compile_extra_headers() {
    let _env = env_shared();
    if !nvrtc_or_skip("compile_extra_headers") {
        return;
    }
    let c = compile(&KernelSpec::new(&SRC_OTHER).define("TK_N", 8), "sm_90a").unwrap();
    assert_eq!(&c.image[..4], ELF_MAGIC);
}

#[test]
fn compile_compute90a_gives_ptx() {
    let _env = env_shared();
    if !nvrtc_or_skip("compile_compute90a_gives_ptx") {
        return;
    }
    let c = compile(&spec(12345), "compute_90a").unwrap();
    assert!(!c.image.contains(&0), "PTX holds a NUL byte");
    let ptx = String::from_utf8(c.image).expect("PTX is text");
    assert!(ptx.contains(".entry tk_test_fill"), "{ptx}");
    assert!(ptx.contains(".target sm_90a"), "{ptx}");
    // The define reached the compiler.
    assert!(ptx.contains("12345"), "{ptx}");
    // PTX compilation has no ptxas step, hence no resource usage.
    assert_eq!(
        tk_core::kernel::Compiled {
            image: Vec::new(),
            log: c.log
        }
        .resource_usage(),
        ""
    );
}

#[test]
fn compile_without_required_define_fails() {
    let _env = env_shared();
    if !nvrtc_or_skip("compile_without_required_define_fails") {
        return;
    }
    match compile(&KernelSpec::new(&SRC), "sm_90a") {
        Err(TkError::Compile { kernel, log, .. }) => {
            assert_eq!(kernel, "tk_test_fill");
            assert!(log.contains("TK_N must be defined"), "{log}");
        }
        other => panic!("expected TkError::Compile, got {other:?}"),
    }
}

#[test]
fn compile_syntax_error_is_a_compile_error() {
    let _env = env_shared();
    if !nvrtc_or_skip("compile_syntax_error_is_a_compile_error") {
        return;
    }
    let s = KernelSpec::new(&SRC_BAD).define("TK_N", 4);
    let e = compile(&s, "sm_90a").unwrap_err();
    let msg = e.to_string();
    match e {
        TkError::Compile {
            kernel,
            arch,
            defines,
            log,
        } => {
            assert_eq!(kernel, "tk_test_bad");
            assert_eq!(arch, "sm_90a");
            assert_eq!(defines, "TK_N=4");
            // NVRTC's own diagnostic, with the file name and the complaint.
            assert!(log.contains("error"), "{log}");
            assert!(log.contains("tk_test_bad.cu"), "{log}");
            assert!(log.contains("expected a \";\""), "{log}");
            // The message carries the entry name and the compiler's text.
            assert!(msg.contains("tk_test_bad"), "{msg}");
            assert!(msg.contains("sm_90a"), "{msg}");
            assert!(msg.contains(&log), "{msg}");
        }
        other => panic!("expected TkError::Compile, got {other:?}"),
    }
}

#[test]
fn compile_with_cuda_headers() {
    let _env = env_shared();
    if !nvrtc_or_skip("compile_with_cuda_headers") {
        return;
    }
    let s = KernelSpec::new(&SRC_BF16).define("TK_N", 32);
    let (found, searched) = cuda_include_dir();
    match found {
        Some(dir) => {
            assert!(dir.join("cuda_bf16.h").is_file(), "{}", dir.display());
            let c = compile(&s, "sm_90a").unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&c.image[..4], ELF_MAGIC);
            assert_eq!(s.cache_key("sm_90a").unwrap().len(), 32);
        }
        None => {
            assert!(
                matches!(
                    compile(&s, "sm_90a"),
                    Err(TkError::CudaHeadersNotFound { .. })
                ),
                "a kernel needing missing headers must report them"
            );
            if std::env::var("TK_REQUIRE_NVRTC").as_deref() == Ok("1") {
                panic!("compile_with_cuda_headers: TK_REQUIRE_NVRTC=1 but no CUDA headers found (searched {searched})");
            }
            tk_core::testing::report_skip(
                "compile_with_cuda_headers",
                format_args!("CUDA headers not found (searched {searched})"),
            );
        }
    }
}

#[test]
fn cubin_with_cache_miss_hit_replaced_hit() {
    let _env = env_shared();
    if !nvrtc_or_skip("cubin_with_cache_miss_hit_replaced_hit") {
        return;
    }
    let tmp = TempDir::new("cubin");
    let cache = DiskCache::new(tmp.path().join("cache"));
    let s = spec(128);
    let key = s.cache_key("sm_90a").unwrap();

    let (first, o) = cubin_with_cache(&s, "sm_90a", &key, Some(&cache)).unwrap();
    assert_eq!(o, CacheOutcome::Miss);
    assert_eq!(&first[..4], ELF_MAGIC);
    assert_eq!(cache.load(&key), Ok(Some(first.clone())));

    let (second, o) = cubin_with_cache(&s, "sm_90a", &key, Some(&cache)).unwrap();
    assert_eq!(o, CacheOutcome::Hit);
    assert_eq!(second, first);

    // Corrupt the entry: flip one payload byte.
    let path = cache.path(&key);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = 24 + (bytes.len() - 24) / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(cache.load(&key), Err(()));

    let (third, o) = cubin_with_cache(&s, "sm_90a", &key, Some(&cache)).unwrap();
    assert_eq!(o, CacheOutcome::Replaced);
    assert_eq!(third, first);
    assert_eq!(
        cache.load(&key),
        Ok(Some(first.clone())),
        "entry not repaired"
    );

    let (fourth, o) = cubin_with_cache(&s, "sm_90a", &key, Some(&cache)).unwrap();
    assert_eq!(o, CacheOutcome::Hit);
    assert_eq!(fourth, first);

    // A truncated entry is replaced too.
    std::fs::write(&path, &bytes[..bytes.len() / 3]).unwrap();
    let (fifth, o) = cubin_with_cache(&s, "sm_90a", &key, Some(&cache)).unwrap();
    assert_eq!((o, fifth == first), (CacheOutcome::Replaced, true));

    assert!(
        temp_files(cache.dir()).is_empty(),
        "{:?}",
        file_names(cache.dir())
    );
    assert_eq!(file_names(cache.dir()), vec![format!("{key}.cubin")]);
}

#[test]
fn cubin_with_cache_without_or_with_broken_cache() {
    let _env = env_shared();
    if !nvrtc_or_skip("cubin_with_cache_without_or_with_broken_cache") {
        return;
    }
    let s = spec(96);
    let key = s.cache_key("sm_90a").unwrap();
    // No cache: always compiled.
    let (a, o) = cubin_with_cache(&s, "sm_90a", &key, None).unwrap();
    assert_eq!(o, CacheOutcome::Miss);
    let (b, o) = cubin_with_cache(&s, "sm_90a", &key, None).unwrap();
    assert_eq!((o, &b), (CacheOutcome::Miss, &a));
    // A cache that can't be written must not fail the compilation.
    let tmp = TempDir::new("unwritable");
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let broken = DiskCache::new(&file);
    let (c, o) = cubin_with_cache(&s, "sm_90a", &key, Some(&broken)).unwrap();
    assert_eq!((o, &c), (CacheOutcome::Miss, &a));
    // The same spec under another arch is a different entry.
    let cache_dir = TempDir::new("arch");
    let cache = DiskCache::new(cache_dir.path());
    let key100 = s.cache_key("sm_100a").unwrap();
    let (d, o) = cubin_with_cache(&s, "sm_100a", &key100, Some(&cache)).unwrap();
    assert_eq!(o, CacheOutcome::Miss);
    assert_ne!(d, a);
    assert_eq!(cache.load(&key), Ok(None));
}

/// `cubin_with_cache` is public and takes any key; a short key must not panic.
///
#[test]
fn cubin_with_cache_short_key() {
    let _env = env_shared();
    if !nvrtc_or_skip("cubin_with_cache_short_key") {
        return;
    }
    let tmp = TempDir::new("short-key");
    let cache = DiskCache::new(tmp.path());
    let r = std::panic::catch_unwind(|| cubin_with_cache(&spec(8), "sm_90a", "k", Some(&cache)));
    let (cubin, o) = r.expect("panicked").unwrap();
    assert_eq!((o, &cubin[..4]), (CacheOutcome::Miss, &ELF_MAGIC[..]));
}
