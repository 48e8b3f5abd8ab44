//! Device context: one GPU, one stream, its properties and its kernel cache.
//!
//! A [`Device`] is a cheap handle (clone it freely). Every op enqueues its work on the handle's
//! stream and returns without waiting; [`Device::synchronize`] waits. Handles made by
//! [`Device::with_new_stream`] share the context and the in-memory kernel cache but enqueue on
//! their own stream; order work between streams with [`Device::record_event`] and
//! [`Device::wait_event`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUdevice_attribute as Attr, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaStream, DevicePtr, DevicePtrMut};

use crate::dtype::Element;
use crate::error::{DriverContext, Result, TkError};
use crate::kernel::{self, FuncAttr, KernelSpec};
use crate::tensor::{DeviceTensor, DeviceView, DeviceViewMut, HostTensor, HostView, Layout};

/// Static properties of a device, read once when the [`Device`] is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceProps {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Compute capability `(major, minor)`.
    pub compute_capability: (i32, i32),
    /// Number of streaming multiprocessors.
    pub sm_count: u32,
    /// L2 cache size in bytes.
    pub l2_bytes: usize,
    /// Largest dynamic shared memory a block can opt in to, in bytes.
    pub max_smem_per_block_optin: usize,
    /// Shared memory of one SM, in bytes (the most its resident blocks can use together).
    pub smem_per_sm: usize,
    /// Shared memory the driver reserves for each resident block, in bytes.
    pub reserved_smem_per_block: usize,
    /// The NVRTC target for this device, e.g. `sm_90a`.
    pub arch: String,
}

struct Shared {
    ctx: Arc<CudaContext>,
    props: DeviceProps,
    /// In-memory kernel cache: specialisation (source by address, defines) -> loaded function.
    /// A launch's lookup hashes a few define strings, not the source text.
    functions: Mutex<HashMap<KernelSpec, CudaFunction>>,
}

/// A GPU with a stream to enqueue work on. See the module docs.
#[derive(Clone)]
pub struct Device {
    shared: Arc<Shared>,
    stream: Arc<CudaStream>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("props", &self.shared.props)
            .finish()
    }
}

/// The NVRTC architecture for a compute capability, or `None` if tile-kernels can't target it.
///
/// sm_90 and sm_100-class parts get their arch-specific (`a`) targets, which enable Hopper and
/// Blackwell-only instructions; later parts get the plain target.
pub fn arch_for(cc: (i32, i32)) -> Option<String> {
    match cc {
        (9, 0) => Some("sm_90a".into()),
        (10, minor) => Some(format!("sm_10{minor}a")),
        (major, minor) if major > 10 => Some(format!("sm_{major}{minor}")),
        _ => None,
    }
}

/// Returns an error unless the CUDA driver library can be loaded (cudarc panics otherwise).
pub fn check_driver_loadable() -> Result<()> {
    // SAFETY: only tries to dlopen the library by its candidate names; no symbol is called.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(TkError::LibraryNotFound {
            lib: "libcuda (NVIDIA driver)",
            hint: "no NVIDIA driver found: running kernels needs an NVIDIA GPU (sm_90 or newer) with a driver \
                   for CUDA >= 13.0; the CPU references work without one"
                .into(),
        })
    }
}

impl Device {
    /// Opens GPU `ordinal` on its primary context with a new stream.
    ///
    /// Errors: [`TkError::LibraryNotFound`] without a driver, [`TkError::Param`] for an ordinal
    /// past the device count, [`TkError::Unsupported`] below compute capability 9.0.
    pub fn new(ordinal: usize) -> Result<Self> {
        check_driver_loadable()?;
        let count = CudaContext::device_count().ctx("cuDeviceGetCount")?;
        if ordinal >= count.max(0) as usize {
            return Err(TkError::param(
                "ordinal",
                format!("device {ordinal} requested but {count} CUDA device(s) found"),
            ));
        }
        let ctx = CudaContext::new(ordinal).ctx("creating the CUDA context")?;
        // tile-kernels orders work itself (one stream per handle, explicit events), so cudarc's
        // per-allocation event tracking would only add overhead and break CUDA-graph capture.
        // SAFETY: called before any allocation or stream exists on this context by this handle;
        // tile-kernels never shares a buffer between streams without an explicit event.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name().ctx("cuDeviceGetName")?;
        let cc = ctx
            .compute_capability()
            .ctx("reading the compute capability")?;
        let attr =
            |a: Attr, what: &'static str| ctx.attribute(a).ctx(what).map(|v| v.max(0) as usize);
        let sm_count = attr(
            Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "reading the SM count",
        )? as u32;
        let l2_bytes = attr(
            Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
            "reading the L2 size",
        )?;
        let max_smem_per_block_optin = attr(
            Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            "reading the shared-memory limit",
        )?;
        let smem_per_sm = attr(
            Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            "reading the shared memory per SM",
        )?;
        let reserved_smem_per_block = attr(
            Attr::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
            "reading the shared memory reserved per block",
        )?;
        let arch = match arch_for(cc) {
            Some(a) => a,
            None => return Err(TkError::Unsupported {
                device: format!(
                    "{name} (ordinal {ordinal}, compute capability {}.{})",
                    cc.0, cc.1
                ),
                needed:
                    "tile-kernels needs compute capability 9.0 (Hopper, sm_90a) or newer (sm_100a)"
                        .into(),
            }),
        };
        let stream = ctx.new_stream().ctx("creating a stream")?;
        let props = DeviceProps {
            ordinal,
            name,
            compute_capability: cc,
            sm_count,
            l2_bytes,
            max_smem_per_block_optin,
            smem_per_sm,
            reserved_smem_per_block,
            arch,
        };
        Ok(Self {
            shared: Arc::new(Shared {
                ctx,
                props,
                functions: Mutex::new(HashMap::new()),
            }),
            stream,
        })
    }

    /// A handle on the same device and kernel cache that enqueues on a new stream.
    pub fn with_new_stream(&self) -> Result<Self> {
        let stream = self.shared.ctx.new_stream().ctx("creating a stream")?;
        Ok(Self {
            shared: self.shared.clone(),
            stream,
        })
    }

    /// The device's properties.
    pub fn props(&self) -> &DeviceProps {
        &self.shared.props
    }

    /// The stream this handle enqueues on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.shared.ctx
    }

    /// Blocks the host until all work enqueued on this handle's stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().ctx("synchronising the stream")
    }

    /// Records an event on this handle's stream (timing enabled when `timing`).
    pub fn record_event(&self, timing: bool) -> Result<CudaEvent> {
        let flags = if timing {
            cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        self.stream
            .record_event(Some(flags))
            .ctx("recording an event")
    }

    /// Makes this handle's stream wait (on the device, not the host) for `event`.
    pub fn wait_event(&self, event: &CudaEvent) -> Result<()> {
        self.stream.wait(event).ctx("waiting for an event")
    }

    /// True if `other` is a handle on the same CUDA context.
    pub fn same_device(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    // ----- memory -----------------------------------------------------------------------------

    /// Allocates a contiguous device tensor whose contents are unspecified (stream-ordered).
    ///
    /// Use it for outputs that an op overwrites completely; see [`crate::testing::poison`] for tests.
    pub fn alloc<T: Element>(&self, shape: &[usize]) -> Result<DeviceTensor<T>> {
        let layout = Layout::contiguous(shape);
        // SAFETY: the memory is uninitialised but `T: Element` is valid for every bit pattern,
        // so reading it before a write yields arbitrary values, never UB.
        let buf = unsafe { self.stream.alloc::<T>(layout.numel().max(1)) }
            .ctx("allocating device memory")?;
        Ok(DeviceTensor::from_parts(buf, layout, self.clone()))
    }

    /// Allocates a zero-filled contiguous device tensor.
    pub fn zeros<T: Element>(&self, shape: &[usize]) -> Result<DeviceTensor<T>> {
        let layout = Layout::contiguous(shape);
        let buf = self
            .stream
            .alloc_zeros::<T>(layout.numel().max(1))
            .ctx("allocating device memory")?;
        Ok(DeviceTensor::from_parts(buf, layout, self.clone()))
    }

    /// Copies a host tensor to a new device tensor (waits for the copy to finish).
    pub fn upload<T: Element>(&self, x: &HostTensor<T>) -> Result<DeviceTensor<T>> {
        self.upload_view(&x.view())
    }

    /// Copies a host view (made contiguous) to a new device tensor (waits for the copy).
    pub fn upload_view<T: Element>(&self, x: &HostView<'_, T>) -> Result<DeviceTensor<T>> {
        let owned;
        let data = match x.contiguous_slice() {
            Some(s) => s,
            None => {
                owned = x.to_contiguous_vec();
                &owned[..]
            }
        };
        let mut t = self.alloc::<T>(x.layout().shape())?;
        if !data.is_empty() {
            self.stream
                .memcpy_htod(data, &mut t.buffer_mut().slice_mut(..data.len()))
                .ctx("copying host to device")?;
            // The copy reads `data` asynchronously from pageable memory; wait before it can be freed.
            self.synchronize()?;
        }
        Ok(t)
    }

    /// Copies a device view to a new contiguous host tensor. Synchronises this handle's stream.
    pub fn download<T: Element>(&self, x: &DeviceView<'_, T>) -> Result<HostTensor<T>> {
        let layout = x.layout();
        let (lo, hi) = layout.span();
        let mut raw = vec![T::default(); hi - lo];
        if hi > lo {
            let src = x.buffer().slice(lo..hi);
            self.stream
                .memcpy_dtoh(&src, &mut raw)
                .ctx("copying device to host")?;
        }
        self.synchronize()?;
        if layout.is_contiguous() && raw.len() == layout.numel() {
            return HostTensor::from_vec(raw, layout.shape());
        }
        let rebased = Layout::new(
            layout.shape().to_vec(),
            layout.strides().to_vec(),
            layout.offset() - lo,
        )?;
        let host = HostView::new(&raw, rebased)?;
        HostTensor::from_vec(host.to_contiguous_vec(), layout.shape())
    }

    /// Fills every byte of `x`'s whole backing buffer with `byte` (stream-ordered memset).
    pub fn fill_bytes<T: Element>(&self, x: &mut DeviceViewMut<'_, T>, byte: u8) -> Result<()> {
        let buf = x.buffer_mut();
        let bytes = std::mem::size_of_val(&T::default()) * buf.len();
        let (ptr, _guard) = buf.device_ptr_mut(&self.stream);
        // SAFETY: `ptr` addresses `bytes` bytes owned by `buf`, which outlives the enqueued memset
        // because frees are stream-ordered on the same stream.
        unsafe {
            cudarc::driver::result::memset_d8_async(ptr, byte, bytes, self.stream.cu_stream())
        }
        .ctx("cuMemsetD8Async")
    }

    /// Raw device address of element `elem_offset` of a buffer (for kernel arguments).
    pub fn device_address<T>(&self, buf: &cudarc::driver::CudaSlice<T>, elem_offset: usize) -> u64 {
        let (ptr, _guard) = buf.device_ptr(&self.stream);
        ptr + (elem_offset * std::mem::size_of::<T>()) as u64
    }

    // ----- kernels ----------------------------------------------------------------------------

    /// Blocks of `threads` threads (no dynamic shared memory) of `f` resident on the whole
    /// device at once: SMs × the driver's occupancy for `f` (0 when none fits). Launch shapes
    /// sized to one resident wave, or cutting a grid's last partial wave, start from it.
    pub fn resident_blocks(&self, f: &CudaFunction, threads: u32) -> Result<usize> {
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
            .ctx("querying a kernel's occupancy")?;
        Ok(per_sm as usize * self.shared.props.sm_count as usize)
    }

    /// The loaded function for a kernel specialisation: from the in-memory cache, else the disk
    /// cache, else compiled by NVRTC for this device's architecture (and then cached in both).
    /// The spec's function attributes ([`KernelSpec::attribute`]) are set once, when the
    /// function is loaded, before it enters the in-memory cache.
    ///
    /// Every op calls this on every launch. The in-memory lookup costs a hash of the spec's
    /// defines (well under a microsecond); only a miss computes the disk-cache key (a hash of
    /// the full source and headers, the include path and the NVRTC version).
    pub fn function(&self, spec: &KernelSpec) -> Result<CudaFunction> {
        if let Some(f) = self
            .shared
            .functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(spec)
        {
            return Ok(f.clone());
        }
        let key = spec.cache_key(&self.shared.props.arch)?;
        let cubin = kernel::cubin_cached(spec, &self.shared.props.arch, &key)?;
        let module = self
            .shared
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .ctx("loading a compiled kernel module")?;
        let f = module
            .load_function(spec.source().entry)
            .ctx("looking up the kernel entry point")?;
        for a in spec.attributes() {
            let (attr, value, what) = match *a {
                FuncAttr::SharedCarveout(pct) => (
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                    i32::from(pct),
                    "setting a kernel's shared-memory carveout",
                ),
                FuncAttr::MaxDynamicShared(bytes) => (
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    i32::try_from(bytes).map_err(|_| {
                        TkError::param(
                            "attribute",
                            format!("{bytes} bytes of dynamic shared memory"),
                        )
                    })?,
                    "setting a kernel's dynamic shared-memory limit",
                ),
            };
            f.set_attribute(attr, value).ctx(what)?;
        }
        self.shared
            .functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(spec.clone(), f.clone());
        Ok(f)
    }

    /// Compiles (or loads from the disk cache) every specialisation in `specs`, so that later
    /// launches, e.g. inside CUDA graph capture, never compile.
    pub fn prewarm(&self, specs: &[KernelSpec]) -> Result<()> {
        specs.iter().try_for_each(|s| self.function(s).map(|_| ()))
    }
}
