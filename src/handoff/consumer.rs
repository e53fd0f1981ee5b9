//! The consumer's side in Rust (Python: `vision_preproc_consumer`): connect to a node's
//! socket, map its blocks once, and read a `TensorRef`'s tensor in place while holding
//! it. docs/HANDOFF.md; `examples/tensor_ref_consumer.rs` with r2r.

use super::memory::Mapping;
use super::{CONTROL_MAGIC, HELLO_MAGIC, PROTOCOL_VERSION};
use crate::error::{Error, Result};
use serde::Deserialize;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// File descriptors a hello may carry at most (the control block and 64 blocks).
const MAX_FDS: usize = 65;

/// The hello's fields (docs/HANDOFF.md).
#[derive(Debug, Clone, Deserialize)]
pub struct Hello {
    pub magic: String,
    pub version: u32,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub pool_id: String,
    #[serde(default)]
    pub memory: String,
    #[serde(default)]
    pub blocks: usize,
    #[serde(default)]
    pub block_size: usize,
    #[serde(default)]
    pub control_size: usize,
    #[serde(default)]
    pub row: usize,
    #[serde(default)]
    pub records_offset: usize,
    #[serde(default)]
    pub record_stride: usize,
    #[serde(default)]
    pub holds_offset: usize,
    #[serde(default)]
    pub row_stride: usize,
}

fn protocol(what: impl std::fmt::Display) -> Error {
    Error::Operation(format!("tensor_ref hand-off: {what}"))
}

/// Read `buf.len()` bytes, the fds of the first `recvmsg` into `fds`.
fn recv_with_fds(stream: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<usize> {
    use std::os::fd::AsRawFd;
    let payload = (MAX_FDS * std::mem::size_of::<RawFd>()) as u32;
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: a connected socket; `msg` points at live buffers of the sizes given.
    let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    let n = usize::try_from(n).map_err(|_| protocol(std::io::Error::last_os_error()))?;
    // SAFETY: the kernel filled `msg_controllen` bytes of `control` with cmsg headers;
    // CMSG_FIRSTHDR/NXTHDR walk them within that length, and each SCM_RIGHTS payload
    // holds (cmsg_len - CMSG_LEN(0)) / 4 fds that are now ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(n)
}

/// A connection to one node's pool (one `pool_id`), with its blocks mapped read-only.
/// Dropping it closes the connection: the node releases whatever it still held.
pub struct Consumer {
    hello: Hello,
    control: Mapping,
    blocks: Vec<Mapping>,
    stream: UnixStream,
}

impl Consumer {
    /// Connect to the socket a `TensorRef` names (`socket_path`) and map the blocks.
    pub fn connect(socket_path: &Path) -> Result<Consumer> {
        let stream = UnixStream::connect(socket_path)
            .map_err(|e| protocol(format!("connecting to {}: {e}", socket_path.display())))?;
        let mut fds = Vec::new();
        let mut len = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            let n = recv_with_fds(&stream, &mut len[got..], &mut fds)?;
            if n == 0 {
                return Err(protocol("the node closed the connection before its hello"));
            }
            got += n;
        }
        let mut json = vec![0u8; u32::from_le_bytes(len) as usize];
        (&stream).read_exact(&mut json).map_err(protocol)?;
        let hello: Hello = serde_json::from_slice(&json).map_err(protocol)?;
        if hello.magic != HELLO_MAGIC || hello.version != PROTOCOL_VERSION {
            return Err(protocol(format!("not a vision_preproc pool (hello {json:?})")));
        }
        if let Some(why) = &hello.error {
            return Err(protocol(format!("refused: {why}")));
        }
        if hello.memory != "host" {
            return Err(protocol(format!(
                "memory {:?}: this consumer maps host memory only",
                hello.memory
            )));
        }
        if fds.len() != hello.blocks + 1 {
            return Err(protocol(format!(
                "{} file descriptors for {} blocks",
                fds.len(),
                hello.blocks
            )));
        }
        use std::os::fd::AsRawFd;
        let control = Mapping::shared(fds[0].as_raw_fd(), hello.control_size, true)?;
        // SAFETY: the control mapping is at least 8 bytes (checked by the size the node
        // gave; a smaller one fails the comparison).
        let magic = unsafe { std::slice::from_raw_parts(control.ptr(), 8.min(control.len())) };
        if magic != CONTROL_MAGIC {
            return Err(protocol("the control block has no VPCTRL01"));
        }
        let blocks = fds[1..]
            .iter()
            .map(|fd| Mapping::shared(fd.as_raw_fd(), hello.block_size, false))
            .collect::<Result<Vec<_>>>()?;
        // The fds close here: the mappings keep the memory.
        Ok(Consumer { hello, control, blocks, stream })
    }

    /// The pool id (as `TensorRef.pool_id`).
    pub fn pool_id(&self) -> &str {
        &self.hello.pool_id
    }

    /// False once the node closed the connection (it stopped, or disconnected this
    /// consumer for holding a block past its lease): connect again.
    pub fn connected(&self) -> bool {
        let mut b = [0u8; 1];
        if self.stream.set_nonblocking(true).is_err() {
            return false;
        }
        let alive = matches!((&self.stream).read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        let _ = self.stream.set_nonblocking(false);
        alive
    }

    fn generation(&self, b: usize) -> &AtomicU64 {
        let off = self.hello.records_offset + b * self.hello.record_stride;
        // SAFETY: inside the control mapping (the node laid it out for `blocks` records),
        // 8-aligned; shared memory accessed only atomically.
        unsafe { AtomicU64::from_ptr(self.control.ptr().add(off).cast()) }
    }

    fn hold(&self, b: usize) -> &AtomicU32 {
        let off = self.hello.holds_offset + self.hello.row * self.hello.row_stride + 4 * b;
        // SAFETY: this consumer's row, inside the control mapping, 4-aligned; atomics only.
        unsafe { AtomicU32::from_ptr(self.control.ptr().add(off).cast()) }
    }

    /// Hold block `block` if it still has `generation` (the `TensorRef`'s): `None` when
    /// the node reused it meanwhile (skip the frame).
    pub fn take(&self, block: u32, generation: u64) -> Option<Held<'_>> {
        let b = block as usize;
        if b >= self.blocks.len() {
            return None;
        }
        self.hold(b).fetch_add(1, Ordering::SeqCst);
        if self.generation(b).load(Ordering::SeqCst) != generation {
            self.hold(b).fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Held { consumer: self, block: b })
    }
}

/// A block held: its bytes stay as they are until this is dropped.
pub struct Held<'a> {
    consumer: &'a Consumer,
    block: usize,
}

impl Held<'_> {
    /// The whole block (the tensor is `byte_offset .. byte_offset + byte_size` of it).
    pub fn bytes(&self) -> &[u8] {
        let m = &self.consumer.blocks[self.block];
        // SAFETY: a read-only mapping alive as long as the consumer; the node does not
        // write the block while this hold is counted.
        unsafe { std::slice::from_raw_parts(m.ptr(), m.len()) }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.consumer.hold(self.block).fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::super::server::Server;
    use super::super::Pool;
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_consumer_reads_what_the_node_wrote_and_the_node_waits_for_its_hold() {
        let dir = std::env::temp_dir().join(format!("vp_consumer_test_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pool = Pool::host(1, 100, Duration::from_secs(5), &dir).unwrap();
        let server = Server::start(Arc::clone(&pool)).unwrap();
        let c = Consumer::connect(server.path()).unwrap();
        assert_eq!(c.pool_id(), pool.id());
        assert!(c.connected());
        let mut lease = pool.lease().0.unwrap();
        let Some(crate::handoff::BlockMemory::Host(bytes)) = lease.memory() else {
            panic!("a host block")
        };
        bytes[..4].copy_from_slice(&[1, 2, 3, 4]);
        let generation = lease.generation();
        lease.published();
        let held = c.take(0, generation).expect("the generation published");
        assert_eq!(&held.bytes()[..4], &[1, 2, 3, 4]);
        assert!(c.take(0, generation + 1).is_none(), "another generation");
        std::thread::sleep(super::super::GRACE * 2);
        assert!(pool.lease().0.is_none(), "held: not reused");
        drop(held);
        let next = pool.lease().0.expect("released: reusable");
        assert!(c.take(0, generation).is_none(), "reused: the old generation is gone");
        drop(next);
        drop(server);
        assert!(!c.connected(), "the node went away");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
