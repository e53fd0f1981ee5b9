//! Device memory other processes can map: the blocks of the zero-copy hand-off
//! (`tensor_ref`, docs/HANDOFF.md) as CUDA virtual memory (`cuMemCreate` with POSIX file
//! descriptor handles, reserved, mapped and made read-write here, exported once as an
//! fd that the pool's socket hands to consumers with `SCM_RIGHTS`). Legacy CUDA IPC
//! (`cuIpcGetMemHandle`) does not work on this memory and is not used.

use super::{drv_err, DeviceInfo};
use crate::error::{CudaError, Result};
use crate::handoff::DeviceBlocks;
use cudarc::driver::sys::{self, CUdeviceptr, CUmemGenericAllocationHandle};
use cudarc::driver::CudaContext;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// One block: its allocation, its mapping in this process and its exported fd.
struct Block {
    handle: CUmemGenericAllocationHandle,
    ptr: CUdeviceptr,
    fd: OwnedFd,
}

/// `count` blocks of device memory of one size (a multiple of the allocation
/// granularity), mapped read-write for the device and exported as fds. They keep the
/// context alive; dropped, every block is unmapped and released (consumers that imported
/// a block keep its memory until they unmap it).
pub struct VmmBlocks {
    ctx: Arc<CudaContext>,
    blocks: Vec<Block>,
    size: usize,
    device_id: i32,
    uuid: [u8; 16],
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

/// Why the device cannot share its memory as file descriptors, if it cannot: the device
/// attributes for virtual memory management and POSIX fd handles.
pub fn unsupported(ctx: &CudaContext) -> Option<String> {
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
    pub fn new(
        ctx: &Arc<CudaContext>,
        device: &DeviceInfo,
        count: usize,
        bytes: usize,
    ) -> Result<VmmBlocks> {
        ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        if let Some(why) = unsupported(ctx) {
            return Err(
                CudaError::Driver { call: "shared device blocks".into(), message: why }.into()
            );
        }
        let device_id = i32::try_from(device.ordinal).unwrap_or(i32::MAX);
        let prop = properties(device_id);
        let mut granularity = 0usize;
        // SAFETY: valid out pointer and properties.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        let size = bytes.max(1).next_multiple_of(granularity.max(1));
        let mut uuid = sys::CUuuid { bytes: [0; 16] };
        // SAFETY: valid out pointer; the context's device.
        check("cuDeviceGetUuid", unsafe { sys::cuDeviceGetUuid(&mut uuid, ctx.cu_device()) })?;
        let mut blocks = VmmBlocks {
            ctx: Arc::clone(ctx),
            blocks: Vec::with_capacity(count),
            size,
            device_id,
            uuid: uuid.bytes.map(|b| b as u8),
        };
        for _ in 0..count {
            let block = blocks.make_one(&prop)?;
            blocks.blocks.push(block);
        }
        Ok(blocks)
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
                fd if fd < 0 => Err(drv_err("cuMemExportToShareableHandle", "no file descriptor")),
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

    fn read(&self, i: usize, out: &mut [u8]) -> Result<()> {
        if out.len() > self.size {
            return Err(crate::Error::Operation(format!(
                "reading {} bytes of a {}-byte block",
                out.len(),
                self.size
            )));
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
