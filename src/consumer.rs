//! The consumer's side in Rust (Python: `vision_preproc_consumer`): connect to a node's
//! socket, map its blocks once (host memory: `mmap`; CUDA memory: imported on the
//! device, feature `cuda`), and read a `TensorRef`'s tensor in place while holding it.
//! docs/HANDOFF.md; `examples/tensor_ref_consumer.rs` with r2r.
//!
//! A layer above both the hand-off's pool ([`crate::handoff`], its protocol) and the
//! backends (the CUDA import of `backend::cuda::vmm`), as its Python twin sits above the
//! node: `handoff/` never imports `backend/` (`test/python/test_layering.py`).
//!
//! Detections back to source pixels: [`to_source`] with the item's [`SourceMapping`]
//! (re-exported from [`crate::boxes`]).

pub use crate::boxes::{to_network, to_source, BoxFormat, Coordinate, SourceMapping};

use crate::backend::cuda::vmm::ImportedBlocks;
use crate::error::{Error, Result};
use crate::handoff::memory::Mapping;
use crate::handoff::signal::{self, realtime_ns, Record};
use crate::handoff::{MemoryKind, CONTROL_MAGIC, HELLO_MAGIC, PROTOCOL_VERSION};
use serde::Deserialize;
use std::collections::VecDeque;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// File descriptors a hello may carry at most (the control block and 64 blocks).
const MAX_FDS: usize = 65;

/// How long [`Held::ready`] waits for the node's work on a block at most.
pub(crate) const EVENT_TIMEOUT: Duration = Duration::from_secs(1);

/// How often [`Held::ready`] checks that the node is still connected while it waits.
const CONNECTION_CHECK: Duration = Duration::from_millis(10);

/// The hello's fields (docs/HANDOFF.md).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Hello {
    pub magic: String,
    pub version: u32,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub pool_id: String,
    #[serde(default)]
    pub memory: String,
    /// CUDA memory: the device's ordinal (-1 for host memory).
    #[serde(default = "no_device")]
    pub device_id: i32,
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
    /// The protocol versions the node speaks (a version 1 node's hello has none).
    #[serde(default)]
    pub versions: Vec<u32>,
}

fn no_device() -> i32 {
    -1
}

impl Hello {
    /// Read and check a hello's JSON: a vision_preproc pool of this protocol version that
    /// accepted the connection, with memory this consumer knows; the error names what is
    /// wrong.
    pub(crate) fn parse(json: &[u8]) -> Result<Hello> {
        let hello: Hello = serde_json::from_slice(json).map_err(protocol)?;
        if hello.magic != HELLO_MAGIC || hello.version != PROTOCOL_VERSION {
            let json = String::from_utf8_lossy(json);
            return Err(protocol(format!(
                "not a vision_preproc pool of protocol version {PROTOCOL_VERSION} (hello {json})"
            )));
        }
        if let Some(why) = &hello.error {
            return Err(protocol(format!("refused: {why}")));
        }
        match hello.memory() {
            Some(MemoryKind::Cuda) if hello.device_id < 0 => Err(protocol(format!(
                "pool {}: memory \"cuda\" on device {}: not a CUDA ordinal",
                hello.pool_id, hello.device_id
            ))),
            Some(_) => Ok(hello),
            None => Err(protocol(format!(
                "pool {}: memory {:?} is neither \"host\" nor \"cuda\"",
                hello.pool_id, hello.memory
            ))),
        }
    }

    /// Where the blocks live (`None`: a kind this consumer does not know).
    pub(crate) fn memory(&self) -> Option<MemoryKind> {
        [MemoryKind::Host, MemoryKind::Cuda].into_iter().find(|m| m.name() == self.memory)
    }
}

fn protocol(what: impl std::fmt::Display) -> Error {
    Error::Handoff(format!("tensor_ref hand-off: {what}"))
}

/// The pool's blocks as this process sees them.
enum Blocks {
    /// Host memory, mapped read-only.
    Host(Vec<Mapping>),
    /// CUDA memory, imported and mapped on the hello's device.
    Cuda(ImportedBlocks),
}

impl Blocks {
    fn len(&self) -> usize {
        match self {
            Blocks::Host(b) => b.len(),
            Blocks::Cuda(d) => d.len(),
        }
    }
}

/// Import a CUDA pool's blocks (`fds`, the hello's `block_size`, on its device).
fn import(fds: &[OwnedFd], hello: &Hello) -> Result<ImportedBlocks> {
    use std::os::fd::AsRawFd;
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    ImportedBlocks::import(&raw, hello.block_size, hello.device_id).map_err(|e| match e {
        Error::CudaNotCompiled => protocol(format!(
            "pool {}: its blocks are CUDA memory (device {}) and this consumer was built \
             without the `cuda` feature: rebuild it with `--features cuda` (a default \
             feature), or run the node with `backend: cpu` (host blocks)",
            hello.pool_id, hello.device_id
        )),
        e => e,
    })
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
    let n = usize::try_from(n).map_err(|_| {
        Error::handoff_io("tensor_ref hand-off: recvmsg", std::io::Error::last_os_error())
    })?;
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

/// A connection to one node's pool (one `pool_id`), with its blocks mapped: host memory
/// read-only; CUDA memory imported in this process, on the device the hello names, in
/// its primary context (needs the `cuda` feature and the NVIDIA driver; the error says
/// so). Dropping it closes the connection: the node releases whatever it still held.
pub struct Consumer {
    hello: Hello,
    control: Mapping,
    blocks: Blocks,
    stream: UnixStream,
    /// Protocol version 2: the ready signal and the reports ([`Consumer::upgrade`]).
    signal: Mutex<Signal>,
}

impl Consumer {
    /// Connect to the socket a `TensorRef` names (`socket_path`) and map the blocks.
    pub fn connect(socket_path: &Path) -> Result<Consumer> {
        let stream = UnixStream::connect(socket_path).map_err(|e| {
            let to = socket_path.display();
            Error::handoff_io(format!("tensor_ref hand-off: connecting to {to}"), e)
        })?;
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
        let hello = Hello::parse(&json)?;
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
        let blocks = match hello.memory() {
            Some(MemoryKind::Cuda) => Blocks::Cuda(import(&fds[1..], &hello)?),
            _ => Blocks::Host(
                fds[1..]
                    .iter()
                    .map(|fd| Mapping::shared(fd.as_raw_fd(), hello.block_size, false))
                    .collect::<Result<Vec<_>>>()?,
            ),
        };
        // The fds close here: the mappings keep the memory.
        Ok(Consumer { hello, control, blocks, stream, signal: Mutex::default() })
    }

    /// The pool id (as `TensorRef.pool_id`).
    pub fn pool_id(&self) -> &str {
        &self.hello.pool_id
    }

    /// Where the blocks live.
    pub fn memory(&self) -> MemoryKind {
        match self.blocks {
            Blocks::Host(_) => MemoryKind::Host,
            Blocks::Cuda(_) => MemoryKind::Cuda,
        }
    }

    /// False once the node closed the connection (it stopped, or disconnected this
    /// consumer for holding a block past its lease): connect again.
    pub fn connected(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut b = [0u8; 1];
        // SAFETY: a connected socket of ours; one byte of `b`, only peeked at (protocol 2
        // frames stay for `next_descriptor`).
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => false,
            n if n > 0 => true,
            _ => std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock,
        }
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
        Some(Held {
            consumer: self,
            block: b,
            generation,
            on_device: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            report: Mutex::new(None),
        })
    }
}

/// A block held: its bytes stay as they are until this is dropped. Host memory:
/// [`Held::bytes`]; CUDA memory: [`Held::ready`], then [`Held::device`] (the device
/// address, or a copy to the host).
pub struct Held<'a> {
    consumer: &'a Consumer,
    block: usize,
    /// The generation it was taken with (the `TensorRef`'s).
    generation: u64,
    /// [`Held::device`] handed out the block's address: the drop waits for the GPU work.
    on_device: AtomicBool,
    /// [`Held::ready`] said yes.
    ready: AtomicBool,
    /// Its record for the node ([`Held::usable`]), sent when it is dropped.
    report: Mutex<Option<Record>>,
}

impl Held<'_> {
    /// The whole block in host memory (the tensor is `byte_offset .. byte_offset +
    /// byte_size` of it); empty for CUDA memory (see [`Held::device`]).
    pub fn bytes(&self) -> &[u8] {
        let Blocks::Host(blocks) = &self.consumer.blocks else { return &[] };
        let m = &blocks[self.block];
        // SAFETY: a read-only mapping alive as long as the consumer; the node does not
        // write the block while this hold is counted.
        unsafe { std::slice::from_raw_parts(m.ptr(), m.len()) }
    }

    /// Wait for the node's work on a CUDA block, named by the `TensorRef`'s
    /// `ipc_event_handle` (empty, or host memory: nothing to wait for): true once the
    /// block may be read; false when the node withdrew the set (its GPU work failed: the
    /// block got a new generation), the node went away, or the work did not end within
    /// `EVENT_TIMEOUT`: drop the `Held` and skip the frame. The wait polls from the
    /// host (docs/HANDOFF.md says why it never waits on the GPU).
    pub fn ready(&self, ipc_event_handle: &[u8]) -> Result<bool> {
        let Blocks::Cuda(blocks) = &self.consumer.blocks else { return Ok(true) };
        if self.ready.load(Ordering::Relaxed) {
            return Ok(true);
        }
        let checked = std::cell::Cell::new(Instant::now());
        let still_valid = || {
            if self.consumer.generation(self.block).load(Ordering::SeqCst) != self.generation {
                return false;
            }
            if checked.get().elapsed() < CONNECTION_CHECK {
                return true;
            }
            checked.set(Instant::now());
            self.consumer.connected()
        };
        let ready = blocks.wait_ipc_event(ipc_event_handle, &still_valid, EVENT_TIMEOUT)?;
        self.ready.store(ready, Ordering::Relaxed);
        Ok(ready)
    }

    /// The block on the device for CUDA memory (`None` for host memory), once it may be
    /// read: the `TensorRef`'s device (`device_id`, `device_uuid`) must be the pool's,
    /// and the node's work named by `ipc_event_handle` done ([`Held::ready`]: an error
    /// if it says no). Work this process queues on the address must be done before the
    /// `Held` is dropped: the drop waits for all work of the device's primary context
    /// (queue it there, e.g. on a stream of cudarc's `CudaContext::new(device_id)`).
    pub fn device(
        &self,
        device_id: i32,
        device_uuid: &[u8],
        ipc_event_handle: &[u8],
    ) -> Result<Option<DeviceBlock<'_>>> {
        let Blocks::Cuda(blocks) = &self.consumer.blocks else { return Ok(None) };
        if device_id != blocks.device_id() {
            return Err(protocol(format!(
                "TensorRef device {device_id}, the pool's hello says device {}",
                blocks.device_id()
            )));
        }
        let own = blocks.uuid();
        if device_uuid.iter().any(|&b| b != 0) && device_uuid != own {
            return Err(protocol(format!(
                "TensorRef device {device_id} has UUID {}, this process's device {} is {}: \
                 the node and this process number the GPUs differently (CUDA_VISIBLE_DEVICES?)",
                hex(device_uuid),
                blocks.device_id(),
                hex(&own)
            )));
        }
        if !self.ready(ipc_event_handle)? {
            return Err(protocol(format!(
                "block {}: the node withdrew this set (its GPU work failed) or its work did not \
                 end within {} ms; check Held::ready first and skip the frame when it says no",
                self.block,
                EVENT_TIMEOUT.as_millis()
            )));
        }
        self.on_device.store(true, Ordering::Relaxed);
        Ok(Some(DeviceBlock { blocks, index: self.block }))
    }
}

impl Held<'_> {
    /// The tensor is usable now (held, and [`Held::ready`]): on a connection upgraded to
    /// protocol 2, the node gets this consumer's record of it (camera stamp `stamp_ns`,
    /// its descriptor `received_ns`, now, and when this `Held` is dropped).
    pub fn usable(&self, stamp_ns: i64, received_ns: i64, via_topic: bool) {
        let flags = if via_topic { signal::FLAG_TOPIC } else { 0 };
        let record = Record {
            generation: self.generation,
            stamp_ns,
            received_ns,
            acquired_ns: realtime_ns(),
            released_ns: 0,
            block: self.block as u32,
            flags,
        };
        if let Ok(mut r) = self.report.lock() {
            *r = Some(record);
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Blocks::Cuda(blocks) = &self.consumer.blocks {
            if self.on_device.load(Ordering::Relaxed) {
                // The block goes back to the node even if the wait fails (a faulted
                // context has no work left that could read it).
                let _ = blocks.synchronize();
            }
        }
        self.consumer.hold(self.block).fetch_sub(1, Ordering::SeqCst);
        let record = self.report.lock().ok().and_then(|mut r| r.take());
        if let Some(record) = record {
            let _ = self.consumer.report(Record { released_ns: realtime_ns(), ..record });
        }
    }
}

/// A held block of CUDA memory ([`Held::device`]): its address on the device in this
/// process and its size, valid while the `Held` is.
pub struct DeviceBlock<'h> {
    blocks: &'h ImportedBlocks,
    index: usize,
}

impl DeviceBlock<'_> {
    /// The block's device address (the tensor starts `byte_offset` bytes after it), in
    /// the primary context of device [`DeviceBlock::device_id`].
    pub fn ptr(&self) -> u64 {
        self.blocks.address(self.index)
    }

    /// Bytes mapped (the hello's `block_size` rounded up to the allocation granularity).
    pub fn len(&self) -> usize {
        self.blocks.block_size()
    }

    /// Never true (a block is never empty).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device's ordinal.
    pub fn device_id(&self) -> i32 {
        self.blocks.device_id()
    }

    /// Copy `out.len()` bytes from byte `offset` of the block into `out` (waits for the
    /// copy): a tensor is `out` of `byte_size` bytes from `byte_offset`.
    pub fn copy_to_host(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.blocks.copy_to_host(self.index, offset, out)
    }
}

/// A tensor's descriptor from the node's socket (protocol 2): the `TensorRef` as the
/// topic carries it (`cdr`, with its encapsulation header: r2r's
/// `TensorRef::from_serialized_bytes`), when the node sent it and when it arrived
/// (`CLOCK_REALTIME` ns).
#[derive(Debug, Clone)]
pub struct Descriptor {
    pub cdr: Vec<u8>,
    pub sent_ns: i64,
    pub received_ns: i64,
}

/// A connection's protocol 2 state.
#[derive(Default)]
struct Signal {
    /// The `ACCEPT`'s first generation (`None`: not upgraded).
    from_generation: Option<u64>,
    inbox: Vec<u8>,
    descriptors: VecDeque<Descriptor>,
    /// Descriptors the node did not send (`DROPPED` notices).
    dropped: u64,
    records: Vec<Record>,
    oldest: Option<Instant>,
    outbox: Vec<u8>,
}

/// A `REPORT` goes out with this many records, or when its oldest is this old.
const REPORT_EVERY: usize = 8;
const REPORT_AFTER: Duration = Duration::from_millis(100);

/// The ready signal and the reports (docs/HANDOFF.md, *The socket protocol*).
impl Consumer {
    fn signal_state(&self) -> std::sync::MutexGuard<'_, Signal> {
        self.signal.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ask the node for the ready signal (`name`: how its `/diagnostics` names this
    /// consumer): true once accepted, then [`Consumer::next_descriptor`] gives every
    /// tensor from [`Consumer::from_generation`] on; false when the node speaks version 1
    /// only, or did not answer within a second (take the frames from the topic then).
    pub fn upgrade(&self, name: &str) -> Result<bool> {
        if !self.hello.versions.contains(&signal::VERSION) {
            return Ok(false);
        }
        if self.from_generation().is_some() {
            return Ok(true);
        }
        let name: String = name.chars().take(64).collect();
        let body = serde_json::json!({"version": signal::VERSION, "name": name}).to_string();
        use std::io::Write;
        (&self.stream)
            .write_all(&signal::frame(signal::UPGRADE, body.as_bytes()))
            .map_err(protocol)?;
        let deadline = Instant::now() + Duration::from_secs(1);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            for (kind, body) in self.read_frames(left)? {
                if kind == signal::ACCEPT {
                    let accept: serde_json::Value =
                        serde_json::from_slice(&body).map_err(protocol)?;
                    let from = accept["from_generation"].as_u64();
                    self.signal_state().from_generation = from;
                    return Ok(from.is_some());
                }
            }
        }
        Ok(false)
    }

    /// Upgraded: the first generation whose descriptor comes on the socket (the topic's
    /// messages of that generation or later are to be ignored).
    pub fn from_generation(&self) -> Option<u64> {
        self.signal_state().from_generation
    }

    /// Descriptors the node did not send this consumer (it fell behind; the node said so).
    pub fn dropped(&self) -> u64 {
        self.signal_state().dropped
    }

    /// The next descriptor, waiting up to `timeout` for it (`None`: none came); an error
    /// once the node closed the connection. Sends the reports that are due.
    pub fn next_descriptor(&self, timeout: Duration) -> Result<Option<Descriptor>> {
        self.flush_reports(false);
        if let Some(d) = self.signal_state().descriptors.pop_front() {
            return Ok(Some(d));
        }
        for (kind, body) in self.read_frames(timeout)? {
            if kind == signal::DESCRIPTOR && body.len() >= 8 {
                let mut sent = [0u8; 8];
                sent.copy_from_slice(&body[..8]);
                let d = Descriptor {
                    cdr: body[8..].to_vec(),
                    sent_ns: i64::from_le_bytes(sent),
                    received_ns: realtime_ns(),
                };
                self.signal_state().descriptors.push_back(d);
            }
        }
        Ok(self.signal_state().descriptors.pop_front())
    }

    /// The node's frames that arrived within `timeout` (`DROPPED` counted here).
    fn read_frames(&self, timeout: Duration) -> Result<Vec<(u16, Vec<u8>)>> {
        use std::os::fd::AsRawFd;
        let fd = self.stream.as_raw_fd();
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one live pollfd.
        if unsafe { libc::poll(&mut pfd, 1, ms) } <= 0 {
            return Ok(Vec::new());
        }
        let mut st = self.signal_state();
        let mut buf = vec![0u8; 1 << 16];
        let closed = loop {
            // SAFETY: a socket of ours; `buf` has `buf.len()` writable bytes.
            let n =
                unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            match usize::try_from(n) {
                Ok(0) => break true,
                Ok(n) => st.inbox.extend_from_slice(&buf[..n]),
                Err(_) => {
                    break std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock
                }
            }
        };
        let frames = signal::frames(&mut st.inbox).map_err(protocol)?;
        for (kind, body) in &frames {
            if *kind == signal::DROPPED && body.len() >= 8 {
                let mut n = [0u8; 8];
                n.copy_from_slice(&body[..8]);
                st.dropped += u64::from_le_bytes(n);
            }
        }
        if closed && frames.is_empty() {
            return Err(protocol("the node closed the connection"));
        }
        Ok(frames)
    }

    /// Report one tensor to the node (upgraded connections only; batched).
    fn report(&self, record: Record) -> Result<()> {
        let mut st = self.signal_state();
        if st.from_generation.is_none() {
            return Ok(());
        }
        st.oldest.get_or_insert_with(Instant::now);
        st.records.push(record);
        drop(st);
        self.flush_reports(false);
        Ok(())
    }

    /// Send the records waiting (`force`, or when due); never blocks.
    fn flush_reports(&self, force: bool) {
        use std::os::fd::AsRawFd;
        let mut st = self.signal_state();
        let due = st.records.len() >= REPORT_EVERY
            || st.oldest.is_some_and(|t| t.elapsed() >= REPORT_AFTER);
        if !st.records.is_empty() && (force || due) {
            let n = st.records.len().min(signal::MAX_RECORDS);
            let records: Vec<Record> = st.records.drain(..n).collect();
            st.oldest = (!st.records.is_empty()).then(Instant::now);
            let frame = signal::frame(signal::REPORT, &Record::report(&records));
            st.outbox.extend_from_slice(&frame);
        }
        if st.outbox.is_empty() {
            return;
        }
        // SAFETY: a socket of ours; the outbox is a live buffer of its length.
        let n = unsafe {
            libc::send(
                self.stream.as_raw_fd(),
                st.outbox.as_ptr().cast(),
                st.outbox.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if let Ok(n) = usize::try_from(n) {
            st.outbox.drain(..n);
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.flush_reports(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::server::Server;
    use crate::handoff::Pool;
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
        std::thread::sleep(crate::handoff::GRACE * 2);
        assert!(pool.lease().0.is_none(), "held: not reused");
        drop(held);
        let next = pool.lease().0.expect("released: reusable");
        assert!(c.take(0, generation).is_none(), "reused: the old generation is gone");
        drop(next);
        drop(server);
        assert!(!c.connected(), "the node went away");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_upgraded_consumer_gets_each_descriptor_and_the_node_its_report() {
        let dir = std::env::temp_dir().join(format!("vp_consumer_signal_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pool = Pool::host(2, 100, Duration::from_secs(5), &dir).unwrap();
        let server = Server::start(Arc::clone(&pool)).unwrap();
        let early = pool.lease().0.unwrap(); // leased before the upgrade: topic only
        let c = Consumer::connect(server.path()).unwrap();
        assert!(c.next_descriptor(Duration::ZERO).unwrap().is_none(), "version 1 until upgraded");
        assert!(c.upgrade("rust-test").unwrap());
        let from = c.from_generation().unwrap();
        assert!(from > early.generation());
        early.signal(b"early");
        drop(early);
        let lease = pool.lease().0.unwrap();
        assert!(lease.generation() >= from);
        lease.signal(b"\x00\x01\x00\x00cdr");
        let d = c.next_descriptor(Duration::from_secs(2)).unwrap().expect("its descriptor");
        assert_eq!(d.cdr, b"\x00\x01\x00\x00cdr");
        assert!(d.sent_ns > 0 && d.received_ns >= d.sent_ns, "{d:?}");
        let generation = lease.generation();
        let index = lease.index() as u32;
        lease.published();
        let held = c.take(index, generation).unwrap();
        held.usable(d.sent_ns - 1_000_000, d.received_ns, false);
        drop(held);
        drop(c); // sends the report that waits
        let mut stats = Vec::new();
        for _ in 0..100 {
            stats = pool.consumer_stats();
            if stats.first().is_some_and(|s| s.frames == 1) || stats.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // (The report arrives before the connection's end, which removes the consumer.)
        assert!(stats.is_empty() || stats[0].frames == 1, "{stats:?}");
        drop(server);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn hello(fields: &str) -> Result<Hello> {
        let json = format!(
            r#"{{"magic": "{HELLO_MAGIC}", "version": {PROTOCOL_VERSION}, "pool_id": "00ab", {fields}}}"#
        );
        Hello::parse(json.as_bytes())
    }

    fn message(r: Result<Hello>) -> String {
        r.expect_err("refused").to_string()
    }

    #[test]
    fn a_hello_is_checked_and_its_errors_name_what_is_wrong() {
        let h = hello(r#""memory": "cuda", "device_id": 2, "blocks": 4"#).unwrap();
        assert_eq!((h.memory(), h.device_id, h.blocks), (Some(MemoryKind::Cuda), 2, 4));
        let h = hello(r#""memory": "host", "blocks": 1"#).unwrap();
        assert_eq!((h.memory(), h.device_id), (Some(MemoryKind::Host), -1), "no device_id: -1");
        assert!(message(hello(r#""error": "too many consumers (at most 64 at once)""#))
            .contains("refused: too many consumers"));
        let e = message(hello(r#""memory": "gpu""#));
        assert!(e.contains(r#"memory "gpu" is neither "host" nor "cuda""#), "{e}");
        let e = message(hello(r#""memory": "cuda", "device_id": -1"#));
        assert!(e.contains("device -1: not a CUDA ordinal"), "{e}");
        let e = message(Hello::parse(br#"{"magic": "other", "version": 1}"#));
        assert!(e.contains("not a vision_preproc pool of protocol version 1"), "{e}");
        let e = message(Hello::parse(
            format!(r#"{{"magic": "{HELLO_MAGIC}", "version": 2, "memory": "host"}}"#).as_bytes(),
        ));
        assert!(e.contains("not a vision_preproc pool of protocol version 1"), "{e}");
        assert!(Hello::parse(b"not json").is_err());
    }

    /// Device blocks as the CUDA backend hands them to the pool, with memfds for fds
    /// (what a machine without a GPU can make).
    struct MemfdDevice(Vec<crate::handoff::memory::Memfd>);

    impl crate::handoff::DeviceBlocks for MemfdDevice {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn block_size(&self) -> usize {
            4096
        }
        fn fd(&self, i: usize) -> RawFd {
            use std::os::fd::AsRawFd;
            self.0[i].as_raw_fd()
        }
        fn address(&self, _: usize) -> u64 {
            0
        }
        fn device_id(&self) -> i32 {
            0
        }
        fn uuid(&self) -> [u8; 16] {
            [0; 16]
        }
        fn read(&self, _: usize, _: &mut [u8]) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_cuda_pool_that_cannot_be_imported_is_refused_with_the_fix() {
        let dir = std::env::temp_dir().join(format!("vp_consumer_cuda_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fds =
            (0..2).map(|i| crate::handoff::memory::Memfd::new(&format!("b{i}"), 4096).unwrap());
        let device = Box::new(MemfdDevice(fds.collect()));
        let pool = Pool::device(device, Duration::from_secs(5), &dir).unwrap();
        let server = Server::start(Arc::clone(&pool)).unwrap();
        let e = Consumer::connect(server.path()).err().expect("memfds are no CUDA memory");
        let e = e.to_string();
        // Without the feature: the rebuild; without a driver (this machine): where to run
        // it; with a GPU: the driver refuses a memfd.
        let fix = if cfg!(feature = "cuda") { "backend: cpu" } else { "--features cuda" };
        assert!(e.contains(fix) || e.contains("cuMemImportFromShareableHandle"), "{e}");
        assert!(pool.counts().0.served >= 1, "the node served the hello");
        drop(server);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
