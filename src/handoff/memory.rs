//! Sealed memfds and shared mappings (libc), for the pool's blocks.

use crate::error::{Error, Result};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn os_error(what: &str) -> Error {
    Error::handoff_io(what, std::io::Error::last_os_error())
}

/// The page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096).max(1)
}

/// An anonymous file in memory of a fixed size (`memfd_create`, sealed against growing
/// and shrinking so that a consumer's mapping can never lose its pages).
pub(crate) struct Memfd(OwnedFd);

impl Memfd {
    pub(crate) fn new(name: &str, len: usize) -> Result<Self> {
        let cname = CString::new(name)
            .map_err(|_| Error::misuse("memfd_create", "the name has a NUL byte"))?;
        // SAFETY: a valid C string; the flags are defined by libc.
        let fd = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if fd < 0 {
            return Err(os_error("memfd_create"));
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = libc::off_t::try_from(len).map_err(|_| {
            Error::misuse("ftruncate", format!("a memfd of {len} bytes is larger than off_t"))
        })?;
        // SAFETY: a valid fd of ours.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(os_error("ftruncate of a shared block"));
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: a valid fd of ours, F_ADD_SEALS takes an int.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(os_error("sealing a shared block"));
        }
        Ok(Memfd(fd))
    }
}

impl AsRawFd for Memfd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A shared mapping of a file, unmapped when dropped.
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory with no thread affinity; who writes what
// is the pool's business (a block is written by its lease holder only, the control
// block through atomics).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only hands out the pointer.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` bytes of `fd` shared, read-write or read-only.
    pub(crate) fn shared(fd: RawFd, len: usize, write: bool) -> Result<Self> {
        let prot = if write { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: a fresh mapping chosen by the kernel (no address given), of a valid fd
        // at least `len` bytes long (the caller sized it).
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(os_error("mmap of a shared block"));
        }
        Ok(Mapping { ptr: ptr.cast(), len })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `shared`, unmapped once; nothing borrows it any
        // more (borrows are tied to the pool, which owns this).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
