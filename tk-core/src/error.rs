//! The one error type of the library.
//!
//! Every public function validates its arguments up front and returns a [`TkError`] that names
//! the offending argument and says what was expected, so a caller never sees a panic, an
//! out-of-bounds access or silently wrong output for bad input.

use crate::dtype::DType;

/// Result alias used throughout tile-kernels.
pub type Result<T, E = TkError> = std::result::Result<T, E>;

/// Every error tile-kernels returns.
#[derive(Debug, thiserror::Error)]
pub enum TkError {
    /// A tensor argument has the wrong rank or shape.
    #[error("argument `{arg}`: expected shape {expected}, got {got:?}")]
    Shape {
        /// The argument's name.
        arg: &'static str,
        /// What was expected, in words (e.g. "rank 2", "(Y, X) = (64, 32)").
        expected: String,
        /// The shape that was passed.
        got: Vec<usize>,
    },
    /// A tensor argument has an unsupported element type.
    #[error("argument `{arg}`: expected dtype {expected}, got {got}")]
    Dtype {
        /// The argument's name.
        arg: &'static str,
        /// The accepted dtypes, in words.
        expected: String,
        /// The dtype that was passed.
        got: DType,
    },
    /// A tensor argument has strides the op cannot handle.
    #[error("argument `{arg}`: unsupported strides {got:?} (in elements): {expected}")]
    Stride {
        /// The argument's name.
        arg: &'static str,
        /// What the op needs, in words.
        expected: String,
        /// The strides that were passed.
        got: Vec<usize>,
    },
    /// A tensor argument's address, offset or row pitch is not aligned as the op needs.
    #[error("argument `{arg}`: misaligned: {expected}")]
    Alignment {
        /// The argument's name.
        arg: &'static str,
        /// What alignment is needed and what was seen.
        expected: String,
    },
    /// A tensor argument is empty where the op needs elements.
    #[error("argument `{arg}`: must not be empty (shape {shape:?})")]
    Empty {
        /// The argument's name.
        arg: &'static str,
        /// The shape that was passed.
        shape: Vec<usize>,
    },
    /// A scalar argument is out of its allowed range, or arguments contradict each other.
    #[error("argument `{arg}`: {msg}")]
    Param {
        /// The argument's name.
        arg: &'static str,
        /// What is wrong and what is allowed.
        msg: String,
    },
    /// Two arguments live on different devices, or a device tensor was given where a host
    /// tensor is needed (or the other way round).
    #[error("argument `{arg}`: {msg}")]
    Placement {
        /// The argument's name.
        arg: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// The device cannot run tile-kernels.
    #[error("unsupported device {device}: {needed}")]
    Unsupported {
        /// The device's name and compute capability.
        device: String,
        /// What tile-kernels needs.
        needed: String,
    },
    /// A shared library (the CUDA driver or NVRTC) could not be loaded.
    #[error("cannot load {lib}: {hint}")]
    LibraryNotFound {
        /// Which library.
        lib: &'static str,
        /// How to fix it.
        hint: String,
    },
    /// The CUDA headers (`cuda_fp16.h`, ...) that a kernel needs were not found.
    #[error("CUDA headers not found (searched: {searched}); set TK_CUDA_INCLUDE to a folder holding cuda_fp16.h, cuda_bf16.h, cuda_fp8.h and cuda_fp4.h, e.g. `pip install nvidia-cuda-runtime==13.0.*` and point it at <site-packages>/nvidia/cu13/include")]
    CudaHeadersNotFound {
        /// The folders that were searched.
        searched: String,
    },
    /// NVRTC rejected a kernel.
    #[error("NVRTC failed to compile kernel `{kernel}` for {arch} ({defines}):\n{log}")]
    Compile {
        /// The kernel's entry point.
        kernel: String,
        /// The target architecture (e.g. `sm_90a`).
        arch: String,
        /// The specialisation's defines.
        defines: String,
        /// The compiler log.
        log: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver error in {context}: {source}")]
    Driver {
        /// What tile-kernels was doing.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// An I/O error (kernel cache, bench output).
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or folder involved.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl TkError {
    /// The argument the error names, for the errors about an argument (`None` for device,
    /// library, compile and I/O errors).
    pub fn arg(&self) -> Option<&'static str> {
        match self {
            TkError::Shape { arg, .. }
            | TkError::Dtype { arg, .. }
            | TkError::Stride { arg, .. }
            | TkError::Alignment { arg, .. }
            | TkError::Empty { arg, .. }
            | TkError::Param { arg, .. }
            | TkError::Placement { arg, .. } => Some(arg),
            _ => None,
        }
    }

    /// Shorthand for a [`TkError::Param`].
    pub fn param(arg: &'static str, msg: impl Into<String>) -> Self {
        Self::Param {
            arg,
            msg: msg.into(),
        }
    }
}

/// Attaches a context string to a CUDA driver result (used by the family crates).
pub trait DriverContext<T> {
    /// Maps a driver error to [`TkError::Driver`] with `context`.
    fn ctx(self, context: &'static str) -> Result<T>;
}

impl<T> DriverContext<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn ctx(self, context: &'static str) -> Result<T> {
        self.map_err(|source| TkError::Driver { context, source })
    }
}
