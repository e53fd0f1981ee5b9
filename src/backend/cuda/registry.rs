//! Host memory lent by a frame's source ([`crate::image::Lent`]: a GStreamer pool's
//! buffers), registered with the driver the first time a frame lies in it
//! (`cuMemHostRegister`; in `mapped` mode also mapped into the device) and kept registered
//! until the source frees it: the upload then reads the frame where it is (no copy into
//! the staging buffer), and in `mapped` mode the kernels read it in place. A pool's
//! buffers come back again and again, so each is registered once.
//!
//! A frame is copied into the staging buffer as before when its memory cannot be read in
//! place: the device cannot register host memory (`HOST_REGISTER_SUPPORTED`), the driver
//! refused this memory (kept as refused: not tried again), [`MAX_REGISTERED`] others are
//! registered already (a source whose buffers are not from a fixed pool), or it overlaps
//! another registration. In `mapped` mode a registration takes the kernels' read-ahead
//! ([`SRC_SLACK`](super::memory::SRC_SLACK)) after the memory too.

use super::driver::drv_err;
use crate::image::{Lent, LentMemory};
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::CudaContext;
use std::sync::Arc;

/// Registrations kept at most (a pool has a few buffers per source; several sources
/// share the backend).
pub(crate) const MAX_REGISTERED: usize = 32;

/// Where a frame is read in place: its host address (the upload's source) and, in
/// `mapped` mode, its device address (the kernels' source).
#[derive(Debug, Clone, Copy)]
pub(crate) struct InPlace {
    pub host: usize,
    pub device: Option<CUdeviceptr>,
}

struct Registered {
    memory: Arc<LentMemory>,
    base: usize,
    len: usize,
    /// Why the driver refused it (not tried again while the memory lives), or its device
    /// address (0 unless `mapped`).
    device: Result<CUdeviceptr, String>,
}

/// The registrations of one context.
pub(crate) struct Registry {
    ctx: Arc<CudaContext>,
    /// The device can register host memory.
    supported: bool,
    /// `mapped` mode: registrations are mapped into the device and read by the kernels.
    mapped: bool,
    entries: Vec<Registered>,
}

impl Registry {
    pub(crate) fn new(ctx: Arc<CudaContext>, supported: bool, mapped: bool) -> Registry {
        Registry { ctx, supported, mapped, entries: Vec::new() }
    }

    /// Where `data` (a frame's bytes, inside `lent`) is read in place, registering its
    /// memory the first time; else why not (copy it into the staging buffer). In `mapped`
    /// mode the registration covers `slack` bytes after the memory (the kernels read ahead).
    pub(crate) fn in_place(
        &mut self,
        data: &[u8],
        lent: &Lent,
        slack: usize,
    ) -> Result<InPlace, String> {
        if !self.supported {
            return Err("this device cannot register host memory".into());
        }
        let at = lent.offset_of(data, 0).ok_or("the frame does not lie in its lent memory")?;
        let (base, len) = self.range(lent, slack);
        let device = match self.entries.iter().find(|r| Arc::ptr_eq(&r.memory, lent.memory())) {
            Some(r) => r.device.clone(),
            None if self.entries.len() >= MAX_REGISTERED => {
                return Err(format!(
                    "{MAX_REGISTERED} buffers are registered already (the source's buffers \
                     are not from a fixed pool)"
                ))
            }
            None => {
                let end = base + len;
                let overlaps = |r: &Registered| r.base < end && base < r.base + r.len;
                let device = match self.entries.iter().find(|r| r.device.is_ok() && overlaps(r)) {
                    Some(_) => Err("it overlaps another registered buffer".to_string()),
                    None => self.register(base, len),
                };
                let memory = lent.memory().clone();
                self.entries.push(Registered { memory, base, len, device: device.clone() });
                device
            }
        }?;
        Ok(InPlace {
            host: data.as_ptr() as usize,
            device: self.mapped.then_some(device + at as CUdeviceptr),
        })
    }

    /// The range registered for `lent`: its allocation, and in `mapped` mode `slack` bytes
    /// more, so that the kernels' read-ahead past a frame at its end stays in registered
    /// memory (a GStreamer buffer's block has none to spare: those bytes are the next
    /// allocation's, only read; the driver refuses the range if they are not mapped, and
    /// the frame is then copied). Whole pages would overlap a neighbour's registration (a
    /// heap allocation shares pages): the driver refuses that.
    fn range(&self, lent: &Lent, slack: usize) -> (usize, usize) {
        let (base, len) = lent.range();
        (base as usize, if self.mapped { len + slack } else { len })
    }

    /// Whether the device can register host memory (else every frame is copied).
    pub(crate) fn supported(&self) -> bool {
        self.supported
    }

    /// Register `len` bytes at `base`: its device address (0 unless `mapped`).
    fn register(&self, base: usize, len: usize) -> Result<CUdeviceptr, String> {
        let flags = if self.mapped { sys::CU_MEMHOSTREGISTER_DEVICEMAP } else { 0 };
        // SAFETY: `base` is `len` bytes of host memory its source lent (allocated until it
        // says freed, when `forget_freed` unregisters it); the context is current on this
        // thread (the backend binds it before a submission).
        unsafe { sys::cuMemHostRegister_v2(base as *mut _, len, flags) }
            .result()
            .map_err(|e| drv_err(format!("cuMemHostRegister ({len} bytes)"), e).to_string())?;
        if !self.mapped {
            return Ok(0);
        }
        let mut device: CUdeviceptr = 0;
        // SAFETY: `base` was registered with DEVICEMAP just now; `device` is a valid out
        // pointer.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, base as *mut _, 0) };
        if let Err(e) = r.result() {
            // SAFETY: registered just now, by this context, used by no work yet.
            let _ = unsafe { sys::cuMemHostUnregister(base as *mut _) };
            return Err(drv_err("cuMemHostGetDevicePointer", e).to_string());
        }
        Ok(device)
    }

    /// Unregister the memories their sources freed (a freed block's pages stay pinned
    /// until then, and its address may come back as another block's): before every
    /// submission's staging. A freed memory is read by no work in flight: a set's frames
    /// (which hold their memory) live until the set is finished.
    pub(crate) fn forget_freed(&mut self) {
        self.entries.retain(|r| {
            if !r.memory.freed() {
                return true;
            }
            if r.device.is_ok() {
                // SAFETY: registered by this context (current); no work reads it (above).
                // An error leaves nothing to do: the pages stay pinned until the process
                // ends.
                let _ = unsafe { sys::cuMemHostUnregister(r.base as *mut _) };
            }
            false
        });
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // The backend waited for its streams before its fields are dropped: nothing reads
        // these memories any more.
        let _ = self.ctx.bind_to_thread();
        for r in self.entries.iter().filter(|r| r.device.is_ok()) {
            // SAFETY: registered by this context, read by no work (above).
            let _ = unsafe { sys::cuMemHostUnregister(r.base as *mut _) };
        }
    }
}
