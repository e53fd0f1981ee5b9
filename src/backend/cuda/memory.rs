//! Staging memory: page-locked host buffers (write-combined for upload, cached for
//! anything the CPU reads, optionally mapped into the device address space) and device
//! buffers that grow only when a frame needs more.

use super::driver::drv_err as drv;
use crate::error::{CudaError, Error, Result};
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use std::ptr::NonNull;
use std::sync::Arc;

/// Round staging sizes up to this many bytes.
pub(crate) const STAGING_ALIGN: usize = 64;
/// Bytes every frame buffer carries after the frame: the fused kernel reads whole aligned
/// 8-byte vectors (span path: up to 7 bytes past the last byte it needs) and 32-bit words
/// (staged path: up to 3). Buffers are zeroed when allocated.
pub const SRC_SLACK: usize = 16;

/// How a pinned buffer is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinnedKind {
    /// The CPU writes, the copy engine reads: write-combined (fast CPU writes; very slow
    /// CPU reads, which never happen).
    Upload,
    /// The GPU writes (copy engine), the CPU reads: cached, not write-combined.
    Download,
    /// Mapped into the device address space (`DEVICEMAP`): kernels read or write it in
    /// place, and the CPU also reads it, so it is not write-combined.
    Mapped,
}

/// Page-locked host memory from `cuMemHostAlloc`, freed on drop.
///
/// The owner must make sure no GPU work that uses the buffer is pending when it reads,
/// writes or drops it (the backend synchronizes each ring slot's last event first).
pub struct PinnedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    device_ptr: Option<CUdeviceptr>,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer is plain host memory owned by this value; the raw pointer is not
// shared with other Rust values, so moving it to another thread is sound (the CUDA
// context it belongs to is itself Send + Sync).
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocate at least `len` bytes (rounded up to `STAGING_ALIGN`), zeroed.
    pub fn new(ctx: &Arc<CudaContext>, len: usize, kind: PinnedKind) -> Result<Self, CudaError> {
        let len = len.max(1).next_multiple_of(STAGING_ALIGN);
        let flags = match kind {
            PinnedKind::Upload => sys::CU_MEMHOSTALLOC_WRITECOMBINED,
            PinnedKind::Download => 0,
            PinnedKind::Mapped => sys::CU_MEMHOSTALLOC_DEVICEMAP,
        };
        let what = || format!("cuMemHostAlloc({len} bytes, {kind:?})");
        ctx.bind_to_thread().map_err(|e| drv(what(), e))?;
        // SAFETY: a plain allocation call; the pointer is checked for null below and
        // owned by the returned value, which frees it exactly once.
        let raw = unsafe { cudarc::driver::result::malloc_host(len, flags) }
            .map_err(|e| drv(what(), e))?;
        // Success with a null pointer: the driver broke its own contract.
        let ptr = NonNull::new(raw as *mut u8)
            .ok_or_else(|| CudaError::driver(what(), "returned success and a null pointer"))?;
        let mut buf = PinnedBuffer { ptr, len, device_ptr: None, ctx: ctx.clone() };
        // SAFETY: ptr points to `len` freshly allocated bytes nobody else uses yet.
        unsafe { std::ptr::write_bytes(buf.ptr.as_ptr(), 0, len) };
        if kind == PinnedKind::Mapped {
            let mut d: CUdeviceptr = 0;
            // SAFETY: ptr was allocated with DEVICEMAP in the current context; d is a
            // valid out pointer; flags must be 0.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, raw, 0) }
                .result()
                .map_err(|e| drv("cuMemHostGetDevicePointer", e))?;
            buf.device_ptr = Some(d);
        }
        Ok(buf)
    }

    /// Usable length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a buffer holds at least `STAGING_ALIGN` bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of a [`PinnedKind::Mapped`] buffer.
    pub fn device_ptr(&self) -> Option<CUdeviceptr> {
        self.device_ptr
    }

    /// The host address, for copies issued on a stream.
    pub fn host_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes, for the CPU to write.
    ///
    /// # Safety
    /// No GPU work that reads or writes this buffer may be pending.
    pub unsafe fn host_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live cuMemHostAlloc allocation of `len` bytes owned by self
        // (type invariant), borrowed mutably through `&mut self`; the caller guarantees
        // no GPU access is pending.
        std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len)
    }

    /// The bytes, for the CPU to read.
    ///
    /// # Safety
    /// No GPU work that writes this buffer may be pending.
    pub unsafe fn host(&self) -> &[u8] {
        // SAFETY: as in `host_mut`, for a shared borrow; the caller guarantees no GPU
        // write is pending.
        std::slice::from_raw_parts(self.ptr.as_ptr(), self.len)
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: ptr came from cuMemHostAlloc and is freed only here; the owner
        // synchronized every use before dropping (type invariant).
        let r = unsafe { cudarc::driver::result::free_host(self.ptr.as_ptr() as *mut _) };
        self.ctx.record_err(r);
    }
}

/// A pinned buffer handed out by `Backend::alloc_host`.
pub(super) struct PinnedHost(pub PinnedBuffer);

impl crate::backend::HostMemory for PinnedHost {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the backend uses a buffer it handed out only inside `process_into` and
        // `process_batch_into`, which wait for all GPU work on it before returning (also
        // on errors); so whenever the owner can call this, nothing on the GPU writes it.
        unsafe { self.0.host() }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`: no GPU work on this buffer is pending outside
        // `process_into` and `process_batch_into`.
        unsafe { self.0.host_mut() }
    }
}

/// A device buffer reused across frames: reallocated (zeroed, stream-ordered) only
/// when a frame needs more bytes than it has.
#[derive(Default)]
pub(crate) struct DeviceBuffer {
    slice: Option<CudaSlice<u8>>,
}

impl DeviceBuffer {
    /// At least `len` bytes (rounded up to [`STAGING_ALIGN`]); returns the device address.
    /// `what` names the buffer in errors.
    pub(crate) fn ensure(
        &mut self,
        stream: &Arc<CudaStream>,
        len: usize,
        what: &str,
    ) -> Result<CUdeviceptr> {
        let len = len.max(1).next_multiple_of(STAGING_ALIGN);
        let big_enough = self.slice.as_ref().is_some_and(|s| s.len() >= len);
        if !big_enough {
            // Free the old one first (stream-ordered, after the work already queued).
            self.slice = None;
            let s = stream.alloc_zeros::<u8>(len).map_err(|e| {
                drv(format!("allocating {len} bytes of device memory for {what}"), e)
            })?;
            self.slice = Some(s);
        }
        self.ptr(stream).ok_or_else(|| Error::misuse(what, "buffer missing after allocation"))
    }

    /// The device address, if allocated.
    pub(crate) fn ptr(&self, stream: &CudaStream) -> Option<CUdeviceptr> {
        self.slice.as_ref().map(|s| {
            let (p, _no_tracking) = s.device_ptr(stream);
            p
        })
    }
}
