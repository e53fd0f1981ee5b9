//! Device memory other processes can map: the blocks of the zero-copy hand-off
//! (`tensor_ref`, docs/HANDOFF.md) as CUDA virtual memory (`cuMemCreate` with POSIX file
//! descriptor handles, reserved, mapped and made read-write here, exported once as an
//! fd that the pool's socket hands to consumers with `SCM_RIGHTS`): [`VmmBlocks`], the
//! node's side; [`ImportedBlocks`], a consumer process's (the fds imported and mapped
//! there, `crate::consumer`). Legacy CUDA IPC (`cuIpcGetMemHandle`) does not work on
//! this memory and is not used.

use super::device::DeviceInfo;
use super::driver::drv_err;
use crate::error::{CudaError, Result};
use crate::handoff::{BlockEvent, DeviceBlocks, EVENT_HANDLE_BYTES};
use cudarc::driver::sys::{self, CUdeviceptr, CUmemGenericAllocationHandle};
use cudarc::driver::CudaContext;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

/// One block: its allocation, its mapping in this process and its exported fd.
struct Block {
    handle: CUmemGenericAllocationHandle,
    ptr: CUdeviceptr,
    fd: OwnedFd,
}

/// `count` blocks of device memory of one size (a multiple of the allocation
/// granularity), mapped read-write for the device and exported as fds, each with an
/// interprocess event where the device has them. They keep the context alive; dropped,
/// every block is unmapped and released (consumers that imported a block keep its memory
/// until they unmap it).
pub(crate) struct VmmBlocks {
    ctx: Arc<CudaContext>,
    blocks: Vec<Block>,
    size: usize,
    device_id: i32,
    uuid: [u8; 16],
    /// One per block, or none, with why not in `events_missing`.
    events: Vec<BlockEvent>,
    events_missing: Option<String>,
}

fn check(call: &str, r: sys::CUresult) -> std::result::Result<(), CudaError> {
    r.result().map_err(|e| drv_err(call, e))
}

/// The allocation properties of pinned device memory of `device` exportable as a POSIX
/// file descriptor.
fn properties(device: i32) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct; all-zero is its documented default (no flags, no
    // compression, no Win32 metadata).
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop
}

/// `bytes` (at least 1) rounded up to the allocation granularity of blocks with `prop`.
fn rounded(bytes: usize, prop: &sys::CUmemAllocationProp) -> std::result::Result<usize, CudaError> {
    let mut granularity = 0usize;
    // SAFETY: valid out pointer and properties.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut granularity,
            prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    Ok(bytes.max(1).next_multiple_of(granularity.max(1)))
}

/// The UUID of the context's device (`cuDeviceGetUuid`), as bytes.
fn device_uuid(ctx: &CudaContext) -> std::result::Result<[u8; 16], CudaError> {
    let uuid = ctx.uuid().map_err(|e| drv_err("cuDeviceGetUuid", e))?;
    // c_char: i8 on x86-64, u8 on aarch64.
    Ok(bytemuck::cast(uuid.bytes))
}

/// Why the device cannot share its memory as file descriptors, if it cannot: the device
/// attributes for virtual memory management and POSIX fd handles.
pub(crate) fn unsupported(ctx: &CudaContext) -> Option<String> {
    use sys::CUdevice_attribute as A;
    let attr = |a| ctx.attribute(a).unwrap_or(0);
    if attr(A::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED) != 1 {
        return Some("the device has no virtual memory management (CUDA attribute 102)".into());
    }
    if attr(A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) != 1 {
        return Some(
            "the device cannot export memory as file descriptors (CUDA attribute 103)".into(),
        );
    }
    None
}

impl VmmBlocks {
    /// `count` blocks of at least `bytes` on the context's device. Refused (with the
    /// reason) where the device does not support it; any failure of the driver
    /// (allocation, mapping, export) undoes what was made.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        device: &DeviceInfo,
        count: usize,
        bytes: usize,
    ) -> Result<VmmBlocks> {
        ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        if let Some(why) = unsupported(ctx) {
            let feature = "shared device blocks".into();
            return Err(CudaError::Unsupported { feature, why }.into());
        }
        let device_id = i32::try_from(device.ordinal).unwrap_or(i32::MAX);
        let prop = properties(device_id);
        let size = rounded(bytes, &prop)?;
        let uuid = device_uuid(ctx)?;
        let mut blocks = VmmBlocks {
            ctx: Arc::clone(ctx),
            blocks: Vec::with_capacity(count),
            size,
            device_id,
            uuid,
            events: Vec::new(),
            events_missing: None,
        };
        for _ in 0..count {
            let block = blocks.make_one(&prop)?;
            blocks.blocks.push(block);
        }
        match blocks.make_events(count) {
            Ok(events) => blocks.events = events,
            Err(why) => blocks.events_missing = Some(why),
        }
        Ok(blocks)
    }

    /// `count` interprocess events (`CU_EVENT_INTERPROCESS`, without timing, as CUDA
    /// requires) with their handles, or why the device cannot have them (attribute 125,
    /// or the driver's refusal: nothing is left made).
    fn make_events(&self, count: usize) -> std::result::Result<Vec<BlockEvent>, String> {
        use sys::CUevent_flags as F;
        let supported = self
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED)
            .unwrap_or(0);
        if supported != 1 {
            return Err("the device has no interprocess events (CUDA attribute 125)".into());
        }
        let flags = F::CU_EVENT_INTERPROCESS as u32 | F::CU_EVENT_DISABLE_TIMING as u32;
        let mut events = Vec::with_capacity(count);
        let made = (0..count).try_for_each(|_| {
            let mut event: sys::CUevent = std::ptr::null_mut();
            // SAFETY: valid out pointer; the context is current (`new`).
            check("cuEventCreate(interprocess)", unsafe { sys::cuEventCreate(&mut event, flags) })?;
            let mut h = sys::CUipcEventHandle { reserved: [0; EVENT_HANDLE_BYTES] };
            // SAFETY: an interprocess event just made; valid out pointer.
            let got =
                check("cuIpcGetEventHandle", unsafe { sys::cuIpcGetEventHandle(&mut h, event) });
            if let Err(e) = got {
                // SAFETY: the event made above, destroyed once.
                unsafe { sys::cuEventDestroy_v2(event) };
                return Err(e);
            }
            // c_char: i8 on x86-64, u8 on aarch64.
            events.push(BlockEvent { raw: event as usize, handle: bytemuck::cast(h.reserved) });
            Ok(())
        });
        match made {
            Ok(()) => Ok(events),
            Err(e) => {
                for e in events {
                    // SAFETY: each event made above, destroyed once.
                    unsafe { sys::cuEventDestroy_v2(e.raw as sys::CUevent) };
                }
                Err(format!("interprocess events: {e}"))
            }
        }
    }

    /// Create, map, open for read-write and export one block (undone on failure).
    fn make_one(&self, prop: &sys::CUmemAllocationProp) -> Result<Block> {
        let size = self.size;
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out pointer and properties; `size` is a multiple of the
        // granularity.
        check("cuMemCreate", unsafe { sys::cuMemCreate(&mut handle, size, prop, 0) })?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: valid out pointer; a fresh reservation anywhere.
        let reserved = check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut ptr, size, 0, 0, 0)
        });
        if let Err(e) = reserved {
            // SAFETY: the handle just created, released once.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e.into());
        }
        let mapped = (|| {
            // SAFETY: the reservation and the allocation are both `size` bytes.
            check("cuMemMap", unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) })?;
            let access = sys::CUmemAccessDesc {
                location: prop.location,
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: the mapped range; one access descriptor.
            let access =
                check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(ptr, size, &access, 1) });
            if access.is_err() {
                // SAFETY: the range mapped just above.
                unsafe { sys::cuMemUnmap(ptr, size) };
            }
            access
        })();
        let exported = mapped.and_then(|()| {
            let mut fd: libc::c_int = -1;
            // SAFETY: for POSIX fd handles the shareable handle is an int written at the
            // pointer; the allocation was created with that handle type.
            let r = check("cuMemExportToShareableHandle", unsafe {
                sys::cuMemExportToShareableHandle(
                    (&mut fd as *mut libc::c_int).cast(),
                    handle,
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0,
                )
            })
            .and_then(|()| match fd {
                // The driver broke its own contract (success, no descriptor): a driver failure.
                fd if fd < 0 => Err(CudaError::driver(
                    "cuMemExportToShareableHandle",
                    "returned success but no file descriptor",
                )),
                fd => Ok(fd),
            });
            let fd = match r {
                Ok(fd) => fd,
                Err(e) => {
                    // SAFETY: the range mapped above, unmapped once.
                    unsafe { sys::cuMemUnmap(ptr, size) };
                    return Err(e);
                }
            };
            // SAFETY: the driver made this fd for us; nobody else owns it. Close it on
            // exec, as every fd of ours.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: fcntl on a valid fd.
            unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
            Ok(fd)
        });
        match exported {
            Ok(fd) => Ok(Block { handle, ptr, fd }),
            Err(e) => {
                // SAFETY: the reservation and the handle made above (every failure after
                // the map unmapped it already), each freed once.
                unsafe {
                    sys::cuMemAddressFree(ptr, size);
                    sys::cuMemRelease(handle);
                }
                Err(e.into())
            }
        }
    }
}

impl DeviceBlocks for VmmBlocks {
    fn len(&self) -> usize {
        self.blocks.len()
    }

    fn block_size(&self) -> usize {
        self.size
    }

    fn fd(&self, i: usize) -> RawFd {
        self.blocks[i].fd.as_raw_fd()
    }

    fn address(&self, i: usize) -> u64 {
        self.blocks[i].ptr
    }

    fn device_id(&self) -> i32 {
        self.device_id
    }

    fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    fn ready_event(&self, i: usize) -> Option<BlockEvent> {
        self.events.get(i).copied()
    }

    fn events_missing(&self) -> Option<String> {
        self.events_missing.clone()
    }

    fn read(&self, i: usize, out: &mut [u8]) -> Result<()> {
        if out.len() > self.size {
            return Err(crate::Error::misuse(
                "DeviceBlocks::read",
                format!("reading {} bytes of a {}-byte block", out.len(), self.size),
            ));
        }
        self.ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        // SAFETY: block i holds `size` >= `out.len()` bytes on the device; `out` is that
        // many writable bytes; the synchronous copy completes before this returns.
        let r =
            unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.blocks[i].ptr, out.len()) };
        Ok(check("cuMemcpyDtoH (a shared block)", r)?)
    }
}

impl Drop for VmmBlocks {
    fn drop(&mut self) {
        // Errors are ignored: after a device fault the context may refuse, and the
        // memory goes with it.
        let _ = self.ctx.bind_to_thread();
        for e in self.events.drain(..) {
            // SAFETY: each event made in `make_events`, destroyed once; no work of ours
            // records it any more (as for the blocks, below). A consumer that opened it
            // keeps its own reference.
            unsafe { sys::cuEventDestroy_v2(e.raw as sys::CUevent) };
        }
        for b in self.blocks.drain(..) {
            // SAFETY: each block's mapping, reservation and handle, made in `make_one`
            // and freed once here; nothing of ours uses them any more (the pool is
            // dropped, or released after its backend waited for all its work).
            unsafe {
                sys::cuMemUnmap(b.ptr, self.size);
                sys::cuMemAddressFree(b.ptr, self.size);
                sys::cuMemRelease(b.handle);
            }
        }
    }
}

/// Interprocess events a consumer keeps open per pool (the node has a few, reused); when
/// more arrive, all are closed and opened again as needed.
pub(crate) const MAX_IPC_EVENTS: usize = 64;

/// How long a consumer polls the node's interprocess event without sleeping, and how
/// long it sleeps between polls after that (as the Python consumer,
/// `vision_preproc_consumer.cuda`).
const EVENT_SPIN: std::time::Duration = std::time::Duration::from_micros(200);
const EVENT_POLL: std::time::Duration = std::time::Duration::from_micros(50);

/// An event opened from another process's handle (`cuIpcOpenEventHandle`).
struct IpcEvent(sys::CUevent);

// SAFETY: a CUevent is a handle of the driver, usable from any thread with its context
// current (every use binds the context first); `ImportedBlocks` serialises its uses
// through the mutex that owns it.
unsafe impl Send for IpcEvent {}

/// A pool's device blocks in a consumer process: each block's fd imported
/// (`cuMemImportFromShareableHandle`), mapped at an address of this process
/// (`cuMemAddressReserve`, `cuMemMap`) and made read-write for the device the hello names
/// (`cuMemSetAccess`), in that device's primary context (the one cudarc's
/// `CudaContext::new`, PyTorch and CuPy use). The fds may be closed once this is made.
/// Dropped: every block is unmapped and its range freed, the context released (the node
/// keeps its memory).
pub(crate) struct ImportedBlocks {
    ctx: Arc<CudaContext>,
    /// Each block's address in this process.
    blocks: Vec<CUdeviceptr>,
    /// Bytes mapped per block: the hello's block size rounded up to the granularity.
    size: usize,
    device_id: i32,
    uuid: [u8; 16],
    events: Mutex<Vec<([u8; EVENT_HANDLE_BYTES], IpcEvent)>>,
}

/// "no usable GPU" for a consumer, with the fix.
fn unavailable(why: impl std::fmt::Display) -> CudaError {
    CudaError::Unavailable(format!(
        "{why}; the pool's blocks are CUDA memory: run this consumer where the node's GPU and \
         driver are, or the node with `backend: cpu` (host blocks)"
    ))
}

impl ImportedBlocks {
    /// Import the blocks of `fds` (each `block_size` bytes, exported by the node as POSIX
    /// fds) on device `device_id` (the hello's ordinal). Fails with
    /// [`CudaError::Unavailable`] (and the fix) where this process has no NVIDIA driver or
    /// no such device; any failure of the driver undoes what was made.
    pub(crate) fn import(
        fds: &[RawFd],
        block_size: usize,
        device_id: i32,
    ) -> Result<ImportedBlocks> {
        // SAFETY: only tries to dlopen libcuda; no symbol is called.
        if !unsafe { sys::is_culib_present() } {
            return Err(
                unavailable("libcuda.so could not be loaded (no NVIDIA driver here)").into()
            );
        }
        cudarc::driver::result::init().map_err(|e| unavailable(format!("cuInit: {e:?}")))?;
        let count = cudarc::driver::result::device::get_count()
            .map_err(|e| unavailable(format!("cuDeviceGetCount: {e:?}")))?;
        let Some(ordinal) = usize::try_from(device_id).ok().filter(|_| device_id < count) else {
            return Err(unavailable(format!(
                "the pool's device {device_id} is not one of this process's {count} CUDA \
                 device(s) (CUDA_VISIBLE_DEVICES must show the node's GPU here too)"
            ))
            .into());
        };
        let ctx = CudaContext::new(ordinal).map_err(|e| {
            drv_err(format!("retaining the primary context of device {device_id}"), e)
        })?;
        let uuid = device_uuid(&ctx)?;
        let mut imported = ImportedBlocks {
            ctx,
            blocks: Vec::with_capacity(fds.len()),
            size: 0,
            device_id,
            uuid,
            events: Mutex::new(Vec::new()),
        };
        for &fd in fds {
            let ptr = imported.map_one(fd, block_size)?;
            imported.blocks.push(ptr);
        }
        Ok(imported)
    }

    /// Import, map and open for read-write the block of `fd` (undone on failure); the
    /// first block sets the mapped size, the others must have the same.
    fn map_one(&mut self, fd: RawFd, block_size: usize) -> Result<CUdeviceptr> {
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out pointer; for POSIX fd handles the OS handle is the fd itself,
        // passed in the pointer's place (the driver duplicates what it needs; the fd stays
        // ours).
        check("cuMemImportFromShareableHandle (a block of the pool)", unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd as usize as *mut std::ffi::c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        let mapped = self.map_handle(handle, block_size);
        // SAFETY: the handle imported above, released once; a mapping made from it keeps
        // the memory until it is unmapped.
        unsafe { sys::cuMemRelease(handle) };
        mapped
    }

    /// Reserve, map and open for read-write a range for `handle`.
    fn map_handle(
        &mut self,
        handle: CUmemGenericAllocationHandle,
        block_size: usize,
    ) -> Result<CUdeviceptr> {
        // SAFETY: a plain C struct, filled in by the driver below.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        // SAFETY: valid out pointer; a live handle.
        check("cuMemGetAllocationPropertiesFromHandle", unsafe {
            sys::cuMemGetAllocationPropertiesFromHandle(&mut prop, handle)
        })?;
        let size = rounded(block_size, &prop)?;
        if self.size == 0 {
            self.size = size;
        } else if size != self.size {
            return Err(crate::Error::Handoff(format!(
                "tensor_ref hand-off: a block of {size} bytes among blocks of {}",
                self.size
            )));
        }
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: valid out pointer; a fresh reservation anywhere.
        check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut ptr, size, 0, 0, 0) })?;
        let mapped = (|| {
            // SAFETY: the reservation is `size` bytes; the allocation is at least that
            // (the node made it `block_size` rounded up to the same granularity).
            check("cuMemMap", unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) })?;
            let mut location: sys::CUmemLocation = prop.location;
            location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            location.id = self.device_id;
            let access = sys::CUmemAccessDesc {
                location,
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: the range mapped just above; one access descriptor.
            let r = check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(ptr, size, &access, 1) });
            if r.is_err() {
                // SAFETY: the range mapped just above, unmapped once.
                unsafe { sys::cuMemUnmap(ptr, size) };
            }
            r
        })();
        if let Err(e) = mapped {
            // SAFETY: the reservation made above (unmapped already), freed once.
            unsafe { sys::cuMemAddressFree(ptr, size) };
            return Err(e.into());
        }
        Ok(ptr)
    }

    /// Number of blocks.
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Bytes mapped per block (the hello's block size rounded up to the granularity).
    pub(crate) fn block_size(&self) -> usize {
        self.size
    }

    /// Block i's address in this process (device `device_id`'s primary context).
    pub(crate) fn address(&self, i: usize) -> u64 {
        self.blocks[i]
    }

    /// The device's ordinal in this process.
    pub(crate) fn device_id(&self) -> i32 {
        self.device_id
    }

    /// The device's UUID (to compare with `TensorRef.device_uuid`).
    pub(crate) fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    /// Copy `out.len()` bytes of block i from byte `offset` into `out` (waits for the
    /// copy).
    pub(crate) fn copy_to_host(&self, i: usize, offset: usize, out: &mut [u8]) -> Result<()> {
        if offset.checked_add(out.len()).is_none_or(|end| end > self.size) {
            return Err(crate::Error::misuse(
                "copy_to_host",
                format!(
                    "reading bytes {offset}..{} of a {}-byte block",
                    offset.saturating_add(out.len()),
                    self.size
                ),
            ));
        }
        self.ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        // SAFETY: block i is `size` >= `offset + out.len()` mapped bytes on the device;
        // `out` is that many writable bytes; the synchronous copy completes before this
        // returns.
        let r = unsafe {
            sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.blocks[i] + offset as u64, out.len())
        };
        Ok(check("cuMemcpyDtoH (a shared block)", r)?)
    }

    /// Wait until the node's work named by an interprocess event handle (`TensorRef`'s
    /// `ipc_event_handle`, 64 bytes; empty: nothing to wait for) is done: `Ok(true)`.
    /// `Ok(false)` as soon as `still_valid` says no (the node withdrew the set: its work
    /// failed) or after `timeout`. The wait polls the event from the host: when the
    /// node's context faults or the node dies, its event never completes (measured on
    /// the H200, docs/HANDOFF.md), so a blocking or GPU-side wait could last forever.
    pub(crate) fn wait_ipc_event(
        &self,
        handle: &[u8],
        still_valid: &dyn Fn() -> bool,
        timeout: std::time::Duration,
    ) -> Result<bool> {
        if handle.is_empty() {
            return Ok(true);
        }
        let Ok(key) = <[u8; EVENT_HANDLE_BYTES]>::try_from(handle) else {
            return Err(crate::Error::Handoff(format!(
                "TensorRef.ipc_event_handle has {} bytes; a CUDA IPC event handle has {EVENT_HANDLE_BYTES}",
                handle.len()
            )));
        };
        self.ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        // Held for the wait: no other thread closes the event meanwhile.
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let event = match events.iter().find(|(k, _)| *k == key) {
            Some((_, e)) => e.0,
            None => {
                if events.len() >= MAX_IPC_EVENTS {
                    for (_, e) in events.drain(..) {
                        // SAFETY: an event opened below, destroyed once (it leaves the list).
                        unsafe { sys::cuEventDestroy_v2(e.0) };
                    }
                }
                // c_char: i8 on x86-64, u8 on aarch64.
                let h = sys::CUipcEventHandle { reserved: bytemuck::cast(key) };
                let mut event: sys::CUevent = std::ptr::null_mut();
                // SAFETY: valid out pointer; the handle is 64 bytes as the driver made them.
                check("cuIpcOpenEventHandle (TensorRef.ipc_event_handle)", unsafe {
                    sys::cuIpcOpenEventHandle(&mut event, h)
                })?;
                events.push((key, IpcEvent(event)));
                event
            }
        };
        let start = std::time::Instant::now();
        loop {
            // SAFETY: an event opened in this context and not destroyed (the lock is held).
            match unsafe { sys::cuEventQuery(event) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(still_valid()),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                // (The node withdrew the set and freed its event.)
                _ if !still_valid() => return Ok(false),
                r => check("cuEventQuery (the node's IPC event)", r)?,
            }
            let waited = start.elapsed();
            if !still_valid() || waited > timeout {
                return Ok(false);
            }
            // The node's work takes ~0.1-0.3 ms: spin for most of that, then poll gently.
            if waited > EVENT_SPIN {
                std::thread::sleep(EVENT_POLL);
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Wait for all work of this process in the device's primary context (the work that
    /// read a block must be done before the block is given back).
    pub(crate) fn synchronize(&self) -> Result<()> {
        Ok(self.ctx.synchronize().map_err(|e| drv_err("cuCtxSynchronize", e))?)
    }
}

impl Drop for ImportedBlocks {
    fn drop(&mut self) {
        // Errors are ignored: after a device fault the context may refuse, and the
        // mappings go with it.
        let _ = self.ctx.bind_to_thread();
        let events = self.events.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, e) in events.drain(..) {
            // SAFETY: each event opened in `wait_ipc_event`, destroyed once.
            unsafe { sys::cuEventDestroy_v2(e.0) };
        }
        for ptr in self.blocks.drain(..) {
            // SAFETY: each block's mapping and reservation, made in `map_handle` and freed
            // once here; no `Held` borrows the blocks any more (they borrow the consumer
            // that owns this).
            unsafe {
                sys::cuMemUnmap(ptr, self.size);
                sys::cuMemAddressFree(ptr, self.size);
            }
        }
    }
}
