//! Kernel durations from CUPTI's activity API: the device time each kernel ran, without launch
//! gaps or event overhead — the same measure as upstream's harness (`do_bench(backend='cupti')`).
//!
//! Used only by benchmarks. CUPTI (`libcupti.so.13`) ships with the CUDA toolkit
//! (`extras/CUPTI/lib64`) and in PyPI's `nvidia-cuda-cupti`; when it can't be loaded,
//! [`enable`] returns false and the bench falls back to CUDA events.

use std::sync::Mutex;

use cudarc::cupti::sys;

/// What a record was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Kernel,
    Memset,
}

/// `(kind, start ns, end ns)` of every completed activity record not yet drained.
static RECORDS: Mutex<Vec<(Kind, u64, u64)>> = Mutex::new(Vec::new());

const BUFFER_BYTES: usize = 8 << 20;

fn buffer_layout() -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(BUFFER_BYTES, 8).expect("valid constant layout")
}

unsafe extern "C" fn buffer_requested(
    buffer: *mut *mut u8,
    size: *mut usize,
    max_records: *mut usize,
) {
    // SAFETY: CUPTI passes valid out-pointers; the buffer is freed in `buffer_completed`.
    unsafe {
        *buffer = std::alloc::alloc(buffer_layout());
        *size = if (*buffer).is_null() { 0 } else { BUFFER_BYTES };
        *max_records = 0;
    }
}

unsafe extern "C" fn buffer_completed(
    _ctx: cudarc::driver::sys::CUcontext,
    _stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    let mut out = Vec::new();
    let mut record: *mut sys::CUpti_Activity = std::ptr::null_mut();
    // SAFETY: `buffer` holds `valid` bytes of records written by CUPTI; each record starts with
    // its kind, and kernel (version >= 4) and memset (version 4) records both keep `start` and
    // `end` as u64s at byte offsets 16 and 24.
    unsafe {
        while sys::cuptiActivityGetNextRecord(buffer, valid, &mut record)
            == sys::CUptiResult::CUPTI_SUCCESS
        {
            let kind = (*record).kind;
            let kind = match kind {
                sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_KERNEL
                | sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL => Kind::Kernel,
                sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET => Kind::Memset,
                _ => continue,
            };
            let base = record as *const u8;
            let start = std::ptr::read_unaligned(base.add(16) as *const u64);
            let end = std::ptr::read_unaligned(base.add(24) as *const u64);
            out.push((kind, start, end));
        }
        std::alloc::dealloc(buffer, buffer_layout());
    }
    RECORDS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend(out);
}

/// Starts recording kernel and memset activity; false if CUPTI can't be loaded or refuses.
pub(crate) fn enable() -> bool {
    // SAFETY: only probes whether the library can be opened.
    if !unsafe { sys::is_culib_present() } {
        return false;
    }
    // SAFETY: the callbacks have the signatures CUPTI expects and are valid for the program's life.
    unsafe {
        sys::cuptiActivityRegisterCallbacks(Some(buffer_requested), Some(buffer_completed))
            == sys::CUptiResult::CUPTI_SUCCESS
            && sys::cuptiActivityEnable(
                sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
            ) == sys::CUptiResult::CUPTI_SUCCESS
            && sys::cuptiActivityEnable(sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET)
                == sys::CUptiResult::CUPTI_SUCCESS
    }
}

/// Flushes CUPTI's buffers and takes every record completed so far, sorted by start time.
/// Call after synchronising the device.
pub(crate) fn drain() -> Vec<(Kind, u64, u64)> {
    // SAFETY: plain call into a loaded library; flag 1 = CUPTI_ACTIVITY_FLAG_FLUSH_FORCED.
    unsafe {
        sys::cuptiActivityFlushAll(1);
    }
    let mut v = std::mem::take(&mut *RECORDS.lock().unwrap_or_else(|p| p.into_inner()));
    v.sort_by_key(|r| r.1);
    v
}

/// Per-call kernel time (µs) for `calls` calls that each began with one memset (the L2 flush):
/// the kernels between one memset and the next belong to one call. `None` if the records don't
/// have that shape.
pub(crate) fn per_call_us(records: &[(Kind, u64, u64)], calls: usize) -> Option<Vec<f64>> {
    let mut out: Vec<f64> = Vec::with_capacity(calls);
    let mut kernels_in_call = Vec::with_capacity(calls);
    for &(kind, start, end) in records {
        match kind {
            Kind::Memset => {
                out.push(0.0);
                kernels_in_call.push(0usize);
            }
            Kind::Kernel => {
                let (Some(t), Some(n)) = (out.last_mut(), kernels_in_call.last_mut()) else {
                    continue;
                };
                *t += end.saturating_sub(start) as f64 / 1e3;
                *n += 1;
            }
        }
    }
    let last = out.len().checked_sub(calls)?;
    (kernels_in_call[last..].iter().all(|&n| n > 0)).then(|| out.split_off(last))
}
