//! Kernel durations from CUPTI's activity API: the device time each kernel ran, without launch
//! gaps or event overhead — the same measure as upstream's harness (`do_bench(backend='cupti')`).
//!
//! Used only by benchmarks. CUPTI (`libcupti.so.13`) ships with the CUDA toolkit
//! (`extras/CUPTI/lib64`) and in PyPI's `nvidia-cuda-cupti`; when it can't be loaded,
//! [`enable`] returns false and the bench falls back to CUDA events.

use std::ffi::{c_char, CStr};
use std::sync::Mutex;

use cudarc::cupti::sys;

/// What a record was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Kernel,
    /// The L2 flush before a call: a memset, or the bench's flush kernel (`cuda/fill.cu`, which
    /// no op launches).
    Flush,
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
    // `end` as u64s at byte offsets 16 and 24; kernel records keep their `name` (a C string
    // that CUPTI owns for the callback's duration, or null) at byte offset 104 (the test below
    // checks these offsets).
    unsafe {
        while sys::cuptiActivityGetNextRecord(buffer, valid, &mut record)
            == sys::CUptiResult::CUPTI_SUCCESS
        {
            let kind = (*record).kind;
            let base = record as *const u8;
            let kind = match kind {
                sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_KERNEL
                | sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL => {
                    let name = std::ptr::read_unaligned(base.add(104) as *const *const c_char);
                    if !name.is_null()
                        && CStr::from_ptr(name).to_bytes() == super::FILL_SRC.entry.as_bytes()
                    {
                        Kind::Flush
                    } else {
                        Kind::Kernel
                    }
                }
                sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET => Kind::Flush,
                _ => continue,
            };
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

/// Per-call kernel time (µs) for `calls` calls that each began with one L2 flush (a
/// [`Kind::Flush`] record): the kernels between one flush and the next belong to one call.
/// `None` if the records don't have that shape.
pub(crate) fn per_call_us(records: &[(Kind, u64, u64)], calls: usize) -> Option<Vec<f64>> {
    let mut out: Vec<f64> = Vec::with_capacity(calls);
    let mut kernels_in_call = Vec::with_capacity(calls);
    for &(kind, start, end) in records {
        match kind {
            Kind::Flush => {
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

#[cfg(test)]
mod tests {
    use super::{per_call_us, sys, Kind};
    use std::mem::offset_of;

    #[test]
    fn calls_are_the_kernels_between_flushes() {
        let (f, k) = (Kind::Flush, Kind::Kernel);
        // An untimed call, then two timed calls of one and of two kernels.
        let r = [
            (f, 0, 90),
            (k, 100, 2_100),
            (f, 3_000, 90_000),
            (k, 90_500, 93_500),
            (f, 95_000, 180_000),
            (k, 180_500, 181_500),
            (k, 182_000, 182_250),
        ];
        assert_eq!(per_call_us(&r, 2), Some(vec![3.0, 1.25]));
        // A call whose kernel record is missing is not a match.
        assert_eq!(per_call_us(&r[..5], 2), None);
        assert_eq!(per_call_us(&r, 4), None);
    }

    #[test]
    fn record_field_offsets_match_the_ones_read() {
        assert_eq!(offset_of!(sys::CUpti_ActivityKernel9, start), 16);
        assert_eq!(offset_of!(sys::CUpti_ActivityKernel9, end), 24);
        assert_eq!(offset_of!(sys::CUpti_ActivityKernel9, name), 104);
        assert_eq!(offset_of!(sys::CUpti_ActivityKernel4, name), 104);
        assert_eq!(offset_of!(sys::CUpti_ActivityMemset4, start), 16);
        assert_eq!(offset_of!(sys::CUpti_ActivityMemset4, end), 24);
    }
}
