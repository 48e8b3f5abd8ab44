//! Host and device tensors: shape, strides (in elements, non-negative) and an element offset
//! over a flat buffer.
//!
//! * [`HostTensor`] owns a contiguous `Vec<T>`; [`HostView`] borrows any strided window of one.
//! * [`DeviceTensor`] owns a device buffer; [`DeviceView`] / [`DeviceViewMut`] borrow strided
//!   windows of one. Ops take views and write into caller-provided outputs (`*_into`), with
//!   allocating conveniences on top.
//!
//! Every way of building a view checks that all its elements lie inside the buffer, so a view
//! can never address memory it doesn't own.

use cudarc::driver::CudaSlice;

use crate::device::Device;
use crate::dtype::Element;
use crate::error::{Result, TkError};

/// Shape, strides and offset of a tensor, all in elements.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

impl Layout {
    /// A row-major contiguous layout.
    pub fn contiguous(shape: &[usize]) -> Self {
        let mut strides = vec![1usize; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1].max(1);
        }
        Self {
            shape: shape.to_vec(),
            strides,
            offset: 0,
        }
    }

    /// An arbitrary layout (checked against a buffer only when a view is made of it).
    pub fn new(shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> Result<Self> {
        if shape.len() != strides.len() {
            return Err(TkError::Stride {
                arg: "strides",
                expected: format!("one stride per dimension of shape {shape:?}"),
                got: strides,
            });
        }
        Ok(Self {
            shape,
            strides,
            offset,
        })
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The strides, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The offset of element `[0, ..., 0]`, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |a, &n| a.saturating_mul(n))
    }

    /// True if the elements are dense in row-major order (size-1 dimensions may have any stride;
    /// an empty layout is contiguous).
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1usize;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n != 1 && s != expected {
                return false;
            }
            expected *= n;
        }
        true
    }

    /// The half-open range of buffer elements the layout can touch: `(offset, offset)` when
    /// empty, else `(offset, offset + max index + 1)`. Exact for every layout a view holds
    /// (views are validated); saturates for layouts whose extent overflows `usize`.
    pub fn span(&self) -> (usize, usize) {
        if self.numel() == 0 {
            return (self.offset, self.offset);
        }
        let last: usize = self
            .shape
            .iter()
            .zip(&self.strides)
            .fold(0usize, |acc, (&n, &s)| {
                acc.saturating_add((n - 1).saturating_mul(s))
            });
        (
            self.offset,
            self.offset.saturating_add(last).saturating_add(1),
        )
    }

    /// The buffer index of a multi-index (no bounds check).
    pub fn index(&self, idx: &[usize]) -> usize {
        self.offset
            + idx
                .iter()
                .zip(&self.strides)
                .map(|(&i, &s)| i * s)
                .sum::<usize>()
    }

    /// Restricts dimension `dim` to `start..start + len`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Self> {
        if dim >= self.rank() {
            return Err(TkError::param(
                "dim",
                format!("dimension {dim} out of range for rank {}", self.rank()),
            ));
        }
        if start
            .checked_add(len)
            .is_none_or(|end| end > self.shape[dim])
        {
            return Err(TkError::param(
                "start/len",
                format!(
                    "{start}..{start}+{len} exceeds size {} of dimension {dim}",
                    self.shape[dim]
                ),
            ));
        }
        let mut out = self.clone();
        out.offset = start
            .checked_mul(self.strides[dim])
            .and_then(|d| d.checked_add(self.offset))
            .ok_or_else(|| TkError::param("start", "the narrowed view's offset overflows usize"))?;
        out.shape[dim] = len;
        Ok(out)
    }

    /// Inserts a dimension of size 1 at `dim` (its stride is the next dimension's extent).
    pub fn unsqueeze(&self, dim: usize) -> Result<Self> {
        if dim > self.rank() {
            return Err(TkError::param(
                "dim",
                format!("cannot insert dimension {dim} into rank {}", self.rank()),
            ));
        }
        let stride = if dim < self.rank() {
            self.strides[dim] * self.shape[dim]
        } else {
            1
        };
        let mut out = self.clone();
        out.shape.insert(dim, 1);
        out.strides.insert(dim, stride);
        Ok(out)
    }

    /// Calls `f(buffer_index)` for every element, in row-major order of the logical index.
    pub fn for_each_index(&self, mut f: impl FnMut(usize)) {
        if self.numel() == 0 {
            return;
        }
        let rank = self.rank();
        let mut idx = vec![0usize; rank];
        let mut pos = self.offset;
        loop {
            f(pos);
            let mut d = rank;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                pos += self.strides[d];
                if idx[d] < self.shape[d] {
                    break;
                }
                pos -= self.strides[d] * idx[d];
                idx[d] = 0;
            }
        }
    }

    /// One past the last buffer element the layout touches, or `None` if that (or the element
    /// count) overflows `usize`.
    fn checked_end(&self) -> Option<usize> {
        let numel = self
            .shape
            .iter()
            .try_fold(1usize, |a, &n| a.checked_mul(n))?;
        if numel == 0 {
            return Some(self.offset);
        }
        self.shape
            .iter()
            .zip(&self.strides)
            .try_fold(self.offset, |acc, (&n, &s)| {
                acc.checked_add((n - 1).checked_mul(s)?)
            })?
            .checked_add(1)
    }

    fn check_within(&self, arg: &'static str, len: usize) -> Result<()> {
        let Some(hi) = self.checked_end() else {
            return Err(TkError::Shape {
                arg,
                expected: format!(
                    "a layout whose extent fits in usize (strides {:?}, offset {})",
                    self.strides, self.offset
                ),
                got: self.shape.clone(),
            });
        };
        if hi > len {
            return Err(TkError::Shape {
                arg,
                expected: format!("a layout inside a buffer of {len} elements (strides {:?}, offset {} reach element {})", self.strides, self.offset, hi - 1),
                got: self.shape.clone(),
            });
        }
        Ok(())
    }
}

// ----- host ---------------------------------------------------------------------------------------

/// An owned, contiguous host tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor<T> {
    data: Vec<T>,
    layout: Layout,
}

impl<T: Element> HostTensor<T> {
    /// Wraps `data` as a contiguous tensor of `shape`.
    pub fn from_vec(data: Vec<T>, shape: &[usize]) -> Result<Self> {
        let layout = Layout::contiguous(shape);
        if data.len() != layout.numel() {
            return Err(TkError::Shape {
                arg: "data",
                expected: format!("{} elements for shape {shape:?}", layout.numel()),
                got: vec![data.len()],
            });
        }
        Ok(Self { data, layout })
    }

    /// A tensor of `shape` filled with `f(flat_index)`.
    pub fn from_fn(shape: &[usize], f: impl FnMut(usize) -> T) -> Self {
        let layout = Layout::contiguous(shape);
        Self {
            data: (0..layout.numel()).map(f).collect(),
            layout,
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// The elements in row-major order.
    pub fn as_slice(&self) -> &[T] {
        &self.data
    }

    /// The elements in row-major order, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.data
    }

    /// The elements.
    pub fn into_vec(self) -> Vec<T> {
        self.data
    }

    /// A view of the whole tensor.
    pub fn view(&self) -> HostView<'_, T> {
        HostView {
            data: &self.data,
            layout: self.layout.clone(),
        }
    }
}

/// A borrowed, possibly strided host tensor.
#[derive(Debug, Clone)]
pub struct HostView<'a, T> {
    data: &'a [T],
    layout: Layout,
}

impl<'a, T: Element> HostView<'a, T> {
    /// A view of `data` with `layout`; errors if the layout reaches outside `data`.
    pub fn new(data: &'a [T], layout: Layout) -> Result<Self> {
        layout.check_within("layout", data.len())?;
        Ok(Self { data, layout })
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// The element at a multi-index. Panics if out of bounds (test/reference convenience).
    pub fn at(&self, idx: &[usize]) -> T {
        assert!(
            idx.len() == self.layout.rank() && idx.iter().zip(self.shape()).all(|(i, n)| i < n),
            "index {idx:?} out of bounds for {:?}",
            self.shape()
        );
        self.data[self.layout.index(idx)]
    }

    /// The elements as one slice when the view is contiguous.
    pub fn contiguous_slice(&self) -> Option<&'a [T]> {
        let (lo, hi) = self.layout.span();
        (self.layout.is_contiguous() && hi - lo == self.layout.numel()).then(|| &self.data[lo..hi])
    }

    /// The whole underlying buffer (index it with [`Layout::index`]).
    pub fn raw_data(&self) -> &'a [T] {
        self.data
    }

    /// The same data with another layout (validated).
    pub fn with_layout(&self, layout: Layout) -> Result<Self> {
        Self::new(self.data, layout)
    }

    /// Restricts dimension `dim` to `start..start + len`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Self> {
        Ok(Self {
            data: self.data,
            layout: self.layout.narrow(dim, start, len)?,
        })
    }

    /// The elements in row-major order of the logical index.
    pub fn to_contiguous_vec(&self) -> Vec<T> {
        if let Some(s) = self.contiguous_slice() {
            return s.to_vec();
        }
        let mut out = Vec::with_capacity(self.layout.numel());
        self.layout.for_each_index(|i| out.push(self.data[i]));
        out
    }

    /// A contiguous copy.
    pub fn to_tensor(&self) -> HostTensor<T> {
        HostTensor {
            data: self.to_contiguous_vec(),
            layout: Layout::contiguous(self.shape()),
        }
    }
}

// ----- device -------------------------------------------------------------------------------------

/// An owned device tensor (contiguous when allocated; see [`DeviceTensor::view`]).
///
/// Dropping it frees the memory in stream order on the stream of the handle it was allocated
/// through. Work enqueued on that stream before the drop is safe; if a handle on another stream
/// (see [`Device::with_new_stream`]) still uses the tensor, make the allocating stream wait for
/// it first ([`Device::record_event`] + [`Device::wait_event`]).
pub struct DeviceTensor<T> {
    buf: CudaSlice<T>,
    layout: Layout,
    dev: Device,
}

impl<T> std::fmt::Debug for DeviceTensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTensor")
            .field("layout", &self.layout)
            .field("buffer_len", &self.buf.len())
            .finish()
    }
}

impl<T: Element> DeviceTensor<T> {
    pub(crate) fn from_parts(buf: CudaSlice<T>, layout: Layout, dev: Device) -> Self {
        Self { buf, layout, dev }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The device handle this tensor was allocated through.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The backing buffer.
    pub fn buffer(&self) -> &CudaSlice<T> {
        &self.buf
    }

    /// The backing buffer, mutable.
    pub fn buffer_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.buf
    }

    /// A view of the whole tensor.
    pub fn view(&self) -> DeviceView<'_, T> {
        DeviceView {
            buf: &self.buf,
            layout: self.layout.clone(),
            dev: &self.dev,
        }
    }

    /// A mutable view of the whole tensor.
    pub fn view_mut(&mut self) -> DeviceViewMut<'_, T> {
        DeviceViewMut {
            buf: &mut self.buf,
            layout: self.layout.clone(),
            dev: &self.dev,
        }
    }

    /// Shrinks dimension 0 to its first `len` entries in place: no copy, the buffer keeps its
    /// size (ops that size an output only after a kernel ran allocate an upper bound, then trim
    /// it). The tensor stays contiguous.
    ///
    /// Errors: [`TkError::Param`] naming `len` for a 0-D tensor or `len` above dimension 0.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        let mut shape = self.layout.shape().to_vec();
        match shape.first_mut() {
            Some(d0) if len <= *d0 => *d0 = len,
            _ => {
                return Err(TkError::param(
                    "len",
                    format!("cannot truncate dimension 0 of shape {shape:?} to {len}"),
                ))
            }
        }
        self.layout = Layout::contiguous(&shape);
        Ok(())
    }

    /// Fills every byte of the backing buffer with `byte` (tests poison outputs with it).
    pub fn fill_bytes(&mut self, byte: u8) -> Result<()> {
        let dev = self.dev.clone();
        dev.fill_bytes(&mut self.view_mut(), byte)
    }

    /// Copies the tensor to the host (synchronises the stream).
    pub fn to_host(&self) -> Result<HostTensor<T>> {
        self.dev.download(&self.view())
    }
}

/// Accessors shared by [`DeviceView`] and [`DeviceViewMut`].
macro_rules! view_accessors {
    () => {
        /// The layout.
        pub fn layout(&self) -> &Layout {
            &self.layout
        }

        /// The shape.
        pub fn shape(&self) -> &[usize] {
            self.layout.shape()
        }

        /// The strides, in elements.
        pub fn strides(&self) -> &[usize] {
            self.layout.strides()
        }

        /// The device handle (ops enqueue on its stream).
        pub fn device(&self) -> &'a Device {
            self.dev
        }
    };
}

/// A borrowed, possibly strided device tensor.
#[derive(Clone)]
pub struct DeviceView<'a, T> {
    buf: &'a CudaSlice<T>,
    layout: Layout,
    dev: &'a Device,
}

impl<T> std::fmt::Debug for DeviceView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceView")
            .field("layout", &self.layout)
            .finish()
    }
}

impl<'a, T: Element> DeviceView<'a, T> {
    view_accessors!();

    /// The backing buffer.
    pub fn buffer(&self) -> &'a CudaSlice<T> {
        self.buf
    }

    /// The same buffer with another layout (validated against the buffer).
    pub fn with_layout(&self, layout: Layout) -> Result<Self> {
        layout.check_within("layout", self.buf.len())?;
        Ok(Self {
            buf: self.buf,
            layout,
            dev: self.dev,
        })
    }

    /// Restricts dimension `dim` to `start..start + len`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Self> {
        self.with_layout(self.layout.narrow(dim, start, len)?)
    }

    /// Device address of element `[0, ..., 0]` (for kernel arguments).
    pub fn address(&self) -> u64 {
        self.dev.device_address(self.buf, self.layout.offset())
    }
}

/// A mutable borrowed, possibly strided device tensor.
pub struct DeviceViewMut<'a, T> {
    buf: &'a mut CudaSlice<T>,
    layout: Layout,
    dev: &'a Device,
}

impl<T> std::fmt::Debug for DeviceViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceViewMut")
            .field("layout", &self.layout)
            .finish()
    }
}

impl<'a, T: Element> DeviceViewMut<'a, T> {
    view_accessors!();

    /// The backing buffer, mutable.
    pub fn buffer_mut(&mut self) -> &mut CudaSlice<T> {
        self.buf
    }

    /// The same buffer with another layout (validated against the buffer).
    pub fn with_layout(self, layout: Layout) -> Result<Self> {
        layout.check_within("layout", self.buf.len())?;
        Ok(Self {
            buf: self.buf,
            layout,
            dev: self.dev,
        })
    }

    /// Restricts dimension `dim` to `start..start + len`.
    pub fn narrow(self, dim: usize, start: usize, len: usize) -> Result<Self> {
        let l = self.layout.narrow(dim, start, len)?;
        self.with_layout(l)
    }

    /// Device address of element `[0, ..., 0]` (for kernel arguments).
    pub fn address(&mut self) -> u64 {
        use cudarc::driver::DevicePtrMut;
        let (ptr, _guard) = self.buf.device_ptr_mut(self.dev.stream());
        ptr + (self.layout.offset() * std::mem::size_of::<T>()) as u64
    }

    /// Read-only view of the same elements.
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView {
            buf: self.buf,
            layout: self.layout.clone(),
            dev: self.dev,
        }
    }
}
