//! # tk-core
//!
//! The foundation of tile-kernels: everything a family crate (`tk-transpose`, `tk-quant`, ...)
//! needs to define, compile, launch, test and benchmark a CUDA kernel.
//!
//! * [`device`]: pick a GPU, read its properties (compute capability, SM count, L2 size),
//!   streams and events. Devices below sm_90 are refused with [`TkError::Unsupported`].
//! * [`kernel`]: CUDA C++ sources compiled at run time by NVRTC straight to CUBIN for the device's
//!   exact architecture (`sm_90a`, `sm_100a`), specialised by compile-time defines, cached in
//!   memory and on disk.
//! * [`tensor`]: host and device tensors with shapes and strides, borrowed views, poisoning.
//! * [`dtype`] and [`convert`]: the element types of `spec/quant.md` §1 and bit-exact
//!   conversions between them.
//! * [`error`]: the one error type, [`TkError`]; [`validate`]: layout checks shared by ops.
//! * [`testing`] and [`mod@bench`]: seeded generators, bit-exact comparison, the GPU-or-skip helper,
//!   and CUDA-event timing with L2 flushes against the same-run copy ceiling.
//!
//! Nothing here needs a CUDA toolkit to build: the driver and NVRTC are loaded dynamically, and
//! a missing library is a typed error, not a panic.
//!
//! ```no_run
//! use tk_core::{Device, HostTensor};
//! # fn main() -> tk_core::Result<()> {
//! let dev = Device::new(0)?; // errors (never panics) without a driver or below sm_90
//! let x = HostTensor::<f32>::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 2])?;
//! let d = dev.upload(&x)?;
//! let back = dev.download(&d.view())?;
//! assert_eq!(back.as_slice(), x.as_slice());
//! # Ok(()) }
//! ```

pub mod bench;
pub mod convert;
pub mod device;
pub mod dtype;
pub mod error;
pub mod kernel;
pub mod math;
pub mod tensor;
pub mod testing;
pub mod validate;

pub use device::Device;
pub use dtype::{DType, Element};
pub use error::{Result, TkError};
/// The `float8` crate (FP8 e4m3/e5m2 element types), re-exported likewise.
pub use float8;
/// The `half` crate (bf16, f16 element types), re-exported so users need not depend on it.
pub use half;
pub use kernel::{FuncAttr, KernelSource, KernelSpec};
pub use tensor::{DeviceTensor, DeviceView, DeviceViewMut, HostTensor, HostView, Layout};
