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

/// Why a lent frame is not read in place (it is copied into the staging buffer): counted
/// by [`NotInPlace::kind`] in `/diagnostics` (the input's host copies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NotInPlace {
    /// The device cannot register host memory (`HOST_REGISTER_SUPPORTED`): a missing
    /// capability.
    Unsupported,
    /// The frame's bytes do not lie in the memory its source lent.
    OutsideLent,
    /// [`MAX_REGISTERED`] other buffers are registered already.
    TooMany,
    /// The memory overlaps another registered buffer.
    Overlaps,
    /// The driver refused to register (or map) the memory: its error.
    Refused(String),
}

impl NotInPlace {
    /// A short, stable name of the reason (`/diagnostics` counts frames by it).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            NotInPlace::Unsupported => "unsupported",
            NotInPlace::OutsideLent => "outside_lent",
            NotInPlace::TooMany => "too_many",
            NotInPlace::Overlaps => "overlaps",
            NotInPlace::Refused(_) => "refused",
        }
    }
}

impl std::fmt::Display for NotInPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotInPlace::Unsupported => f.write_str("this device cannot register host memory"),
            NotInPlace::OutsideLent => f.write_str("the frame does not lie in its lent memory"),
            NotInPlace::TooMany => write!(
                f,
                "{MAX_REGISTERED} buffers are registered already (the source's buffers are not \
                 from a fixed pool)"
            ),
            NotInPlace::Overlaps => f.write_str("it overlaps another registered buffer"),
            NotInPlace::Refused(why) => f.write_str(why),
        }
    }
}

struct Registered {
    memory: Arc<LentMemory>,
    base: usize,
    len: usize,
    /// Why the driver refused it (not tried again while the memory lives), or its device
    /// address (0 unless `mapped`).
    device: Result<CUdeviceptr, NotInPlace>,
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
    ) -> Result<InPlace, NotInPlace> {
        if !self.supported {
            return Err(NotInPlace::Unsupported);
        }
        let at = lent.offset_of(data, 0).ok_or(NotInPlace::OutsideLent)?;
        let (base, len) = self.range(lent, slack);
        let device = match self.entries.iter().find(|r| Arc::ptr_eq(&r.memory, lent.memory())) {
            Some(r) => r.device.clone(),
            None if self.entries.len() >= MAX_REGISTERED => return Err(NotInPlace::TooMany),
            None => {
                let end = base + len;
                let overlaps = |r: &Registered| r.base < end && base < r.base + r.len;
                let device = match self.entries.iter().find(|r| r.device.is_ok() && overlaps(r)) {
                    Some(_) => Err(NotInPlace::Overlaps),
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
    fn register(&self, base: usize, len: usize) -> Result<CUdeviceptr, NotInPlace> {
        let flags = if self.mapped { sys::CU_MEMHOSTREGISTER_DEVICEMAP } else { 0 };
        // SAFETY: `base` is `len` bytes of host memory its source lent (allocated until it
        // says freed, when `forget_freed` unregisters it); the context is current on this
        // thread (the backend binds it before a submission).
        unsafe { sys::cuMemHostRegister_v2(base as *mut _, len, flags) }
            .result()
            .map_err(|e| refused(format!("cuMemHostRegister ({len} bytes)"), e))?;
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
            return Err(refused("cuMemHostGetDevicePointer", e));
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

/// The driver's refusal of `call`.
fn refused(call: impl Into<String>, e: cudarc::driver::DriverError) -> NotInPlace {
    NotInPlace::Refused(drv_err(call, e).to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_has_a_stable_name_and_says_why() {
        let reasons = [
            (NotInPlace::Unsupported, "unsupported", "this device cannot register host memory"),
            (NotInPlace::OutsideLent, "outside_lent", "the frame does not lie in its lent memory"),
            (NotInPlace::TooMany, "too_many", "32 buffers are registered already"),
            (NotInPlace::Overlaps, "overlaps", "it overlaps another registered buffer"),
            (NotInPlace::Refused("cuMemHostRegister: x".into()), "refused", "cuMemHostRegister"),
        ];
        for (reason, kind, says) in reasons {
            assert_eq!(reason.kind(), kind);
            assert!(reason.to_string().starts_with(says), "{reason}");
        }
    }
}
