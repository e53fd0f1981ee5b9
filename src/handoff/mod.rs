//! Shared output blocks: the zero-copy hand-off of tensors to consumer processes
//! (`tensor_ref`, docs/HANDOFF.md).
//!
//! A [`Pool`] owns `n` blocks of memory that consumer processes map (host memory:
//! sealed `memfd`s), one control block that they map read-write (each block's
//! generation, each consumer's holds), and a Unix socket (`server`) that hands the
//! blocks' file descriptors to consumers with `SCM_RIGHTS`. The pipeline writes a set's
//! tensors straight into a [`Lease`]d block; the node publishes a `TensorRef` naming it.
//! Nothing here knows ROS.
//!
//! Reuse without blocking: a block is leased only when no live consumer holds it, the
//! node is not writing or publishing it, and it was published at least `GRACE` ago.
//! The node stores the block's new generation before it reads the holds once more; a
//! consumer adds its hold before it reads the generation (both sequentially
//! consistent), so either the consumer sees the new generation (and lets go) or the
//! node sees the hold (and leaves the block).

pub(crate) mod memory;
pub(crate) mod server;
pub mod signal;

use crate::error::{Error, Result};
use memory::{Mapping, Memfd};
pub use signal::ConsumerStats;
use signal::{Outbox, Signals};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Consumers connected at once at most; more are refused (the hello says why).
pub(crate) const MAX_CONSUMERS: usize = 64;
/// Rows of holds in the control block: live consumers, plus the rows of consumers that
/// were disconnected while they might still write to theirs (never given out again).
pub(crate) const ROWS: usize = 256;
/// A published block is not reused sooner (consumers take it in this time).
pub(crate) const GRACE: Duration = Duration::from_millis(5);
/// A retired row is given out again after this long (its consumer saw its connection
/// shut down and stopped using it long before).
pub(crate) const QUARANTINE: Duration = Duration::from_secs(10);
/// The control block's first 8 bytes.
pub(crate) const CONTROL_MAGIC: &[u8; 8] = b"VPCTRL01";
/// Where block records start in the control block, and their stride (a cache line each).
pub(crate) const RECORDS_OFFSET: usize = 64;
pub(crate) const RECORD_STRIDE: usize = 64;
/// The hello's `magic` and `version`.
pub(crate) const HELLO_MAGIC: &str = "vision_preproc/pool";
pub(crate) const PROTOCOL_VERSION: u32 = 1;

/// Where the blocks live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Host memory (`memfd`): the CPU backend, and the fallback of a GPU without the
    /// memory it needs (docs/HANDOFF.md).
    Host,
    /// Device memory of a GPU ([`DeviceBlocks`]: CUDA virtual memory exported as file
    /// descriptors).
    Cuda,
}

impl MemoryKind {
    /// `TensorRef.memory_kind`.
    pub fn code(self) -> u8 {
        match self {
            MemoryKind::Host => 0,
            MemoryKind::Cuda => 1,
        }
    }

    /// The hello's `memory`.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Host => "host",
            MemoryKind::Cuda => "cuda",
        }
    }
}

/// Blocks of device memory that a backend made shareable with other processes (the CUDA
/// backend: `backend::cuda::vmm`), each with a file descriptor a consumer imports. They
/// live until dropped or `Pool::release_device`.
pub trait DeviceBlocks: Send + Sync {
    /// Number of blocks.
    fn len(&self) -> usize;
    /// No blocks.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes of each block (a multiple of the allocation granularity).
    fn block_size(&self) -> usize;
    /// Block i's file descriptor (owned by `self`).
    fn fd(&self, i: usize) -> RawFd;
    /// Block i's address on the device, in the node's process.
    fn address(&self, i: usize) -> u64;
    /// The device's ordinal, as `TensorRef.device_id` says it.
    fn device_id(&self) -> i32;
    /// The device's UUID (`TensorRef.device_uuid`).
    fn uuid(&self) -> [u8; 16];
    /// Copy the first `out.len()` bytes of block i into `out` (waits for the copy), for
    /// the node's own look at a tensor (`debug_image`). No GPU work may be writing the
    /// block.
    fn read(&self, i: usize, out: &mut [u8]) -> Result<()>;
    /// Block i's interprocess event, if the device has them (`None`: the node finishes a
    /// set's work before its `TensorRef` goes out).
    fn ready_event(&self, _i: usize) -> Option<BlockEvent> {
        None
    }
    /// Why the blocks have no interprocess events, if they have none.
    fn events_missing(&self) -> Option<String> {
        Some("these device blocks have none".into())
    }
}

/// Bytes of an interprocess event handle (CUDA's `CU_IPC_HANDLE_SIZE`).
pub(crate) const EVENT_HANDLE_BYTES: usize = 64;

/// A block's interprocess event (CUDA: made with `CU_EVENT_INTERPROCESS`): the backend
/// records it after its last write into the block, so that the block's `TensorRef` can go
/// out before that work ends, carrying `handle` for consumers to wait on.
#[derive(Debug, Clone, Copy)]
pub struct BlockEvent {
    /// The event in the node's process (a `CUevent`), for the backend to record.
    pub raw: usize,
    /// What a consumer opens (`cuIpcOpenEventHandle`): `TensorRef.ipc_event_handle`.
    pub handle: [u8; EVENT_HANDLE_BYTES],
}

/// A pool's blocks.
enum Blocks {
    /// Sealed memfds, mapped in the node.
    Host(Vec<(Memfd, Mapping)>),
    /// Device memory; `None` once released (its backend was replaced).
    Device(Mutex<Option<Box<dyn DeviceBlocks>>>),
}

impl Blocks {
    /// The device blocks (`None` inside once released); `None` for host memory.
    fn device(&self) -> Option<MutexGuard<'_, Option<Box<dyn DeviceBlocks>>>> {
        match self {
            Blocks::Device(d) => Some(d.lock().unwrap_or_else(|p| p.into_inner())),
            Blocks::Host(_) => None,
        }
    }
}

/// Where a leased block is written.
pub enum BlockMemory<'a> {
    /// Host memory: its bytes.
    Host(&'a mut [u8]),
    /// Device memory: its address and size, and its interprocess event if any.
    Device(u64, usize, Option<BlockEvent>),
}

impl BlockMemory<'_> {
    /// Bytes of the block.
    pub fn len(&self) -> usize {
        match self {
            BlockMemory::Host(b) => b.len(),
            BlockMemory::Device(_, size, _) => *size,
        }
    }

    /// Never true (a block is never empty).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A consumer's row of holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Row {
    /// Zeroed, free to give out.
    Free,
    /// A connected consumer's: the server's connection id and its socket (shut down
    /// at once when the consumer is evicted).
    Live(u64, RawFd),
    /// Of a consumer disconnected while it might still write to it (evicted, or it sent
    /// bytes): ignored until [`QUARANTINE`] has passed, then zeroed and given out again.
    Retired(Instant),
}

/// Consumers connected now.
fn live(rows: &[Row]) -> usize {
    rows.iter().filter(|r| matches!(r, Row::Live(..))).count()
}

/// A block as the node sees it.
#[derive(Debug, Clone, Copy)]
struct BlockState {
    /// Leased (being written or published).
    leased: bool,
    /// When it was last published (`None`: never, or given back unpublished).
    published: Option<Instant>,
}

/// Counters of the pool, for `/diagnostics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolCounts {
    /// Sets that found no free block.
    pub no_free_block: u64,
    /// Consumers disconnected because they held a block longer than the lease.
    pub reclaims: u64,
    /// Connections refused (too many consumers).
    pub refused: u64,
    /// Connections dropped for sending bytes (consumers send nothing).
    pub bad_clients: u64,
    /// Consumers served since the start.
    pub served: u64,
    /// Sets whose `TensorRef` went out before their GPU work ended and whose work then
    /// failed (or whose device was replaced): their blocks got a new generation, so that
    /// consumers drop them.
    pub withdrawn: u64,
}

struct State {
    rows: Vec<Row>,
    blocks: Vec<BlockState>,
    next_generation: u64,
    /// Connections to close (their consumer held a block past the lease).
    evict: Vec<u64>,
    counts: PoolCounts,
}

/// The shared blocks, the control block and what the socket serves.
pub struct Pool {
    /// The pool id as `TensorRef.pool_id` spells it (16 hex digits), and the socket's
    /// path as `TensorRef.socket_path` does: made once, sent with every descriptor.
    id: String,
    socket_str: String,
    memory: MemoryKind,
    block_size: usize,
    count: usize,
    blocks: Blocks,
    /// Device blocks: the device's ordinal and UUID (host: -1 and zeros).
    device_id: i32,
    uuid: [u8; 16],
    control: (Memfd, Mapping),
    holds_offset: usize,
    row_stride: usize,
    lease: Duration,
    socket_path: PathBuf,
    state: Mutex<State>,
    /// The consumers that asked for the ready signal (protocol version 2).
    signals: Signals,
}

/// A random pool id (the clock and the pid through the process's hasher seed).
fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

impl Pool {
    /// `count` host blocks of at least `bytes` each (rounded up to the page), their
    /// socket in `dir` (see `server::socket_dir`). `lease`: how long a consumer may hold
    /// a block.
    pub fn host(count: usize, bytes: usize, lease: Duration, dir: &Path) -> Result<Arc<Pool>> {
        if count == 0 || bytes == 0 {
            return Err(Error::misuse(
                "creating the tensor_ref pool",
                "a shared pool needs at least one non-empty block (shared_pool_size >= 1)",
            ));
        }
        let block_size = bytes.next_multiple_of(memory::page_size());
        let id = random_id();
        let mut blocks = Vec::with_capacity(count);
        for i in 0..count {
            let fd = Memfd::new(&format!("vision_preproc-{id:016x}-{i}"), block_size)?;
            let map = Mapping::shared(fd.as_raw_fd(), block_size, true)?;
            blocks.push((fd, map));
        }
        Pool::new(id, count, block_size, Blocks::Host(blocks), lease, dir)
    }

    /// A pool of a backend's device `blocks` (see [`DeviceBlocks`]), their socket in
    /// `dir`.
    pub fn device(blocks: Box<dyn DeviceBlocks>, lease: Duration, dir: &Path) -> Result<Arc<Pool>> {
        let (count, block_size) = (blocks.len(), blocks.block_size());
        if count == 0 || block_size == 0 {
            return Err(Error::misuse(
                "creating the tensor_ref pool",
                "a shared pool needs at least one non-empty block (shared_pool_size >= 1)",
            ));
        }
        let blocks = Blocks::Device(Mutex::new(Some(blocks)));
        Pool::new(random_id(), count, block_size, blocks, lease, dir)
    }

    /// The control block and the pool around `blocks`.
    fn new(
        id: u64,
        count: usize,
        block_size: usize,
        blocks: Blocks,
        lease: Duration,
        dir: &Path,
    ) -> Result<Arc<Pool>> {
        let page = memory::page_size();
        let row_stride = (4 * count).next_multiple_of(64);
        let holds_offset = (RECORDS_OFFSET + count * RECORD_STRIDE).next_multiple_of(64);
        let control_size = (holds_offset + ROWS * row_stride).next_multiple_of(page);
        let cfd = Memfd::new(&format!("vision_preproc-{id:016x}-control"), control_size)?;
        let cmap = Mapping::shared(cfd.as_raw_fd(), control_size, true)?;
        // SAFETY: the mapping is `control_size` >= 8 writable bytes, fresh (zeroed) and
        // not shared with anyone yet.
        unsafe { std::ptr::copy_nonoverlapping(CONTROL_MAGIC.as_ptr(), cmap.ptr(), 8) };
        let socket_path = dir.join(format!("{id:016x}.sock"));
        let (memory, device_id, uuid) = match blocks.device().as_deref() {
            Some(Some(d)) => (MemoryKind::Cuda, d.device_id(), d.uuid()),
            Some(None) => (MemoryKind::Cuda, -1, [0; 16]),
            None => (MemoryKind::Host, -1, [0; 16]),
        };
        Ok(Arc::new(Pool {
            id: format!("{id:016x}"),
            socket_str: socket_path.to_string_lossy().into_owned(),
            memory,
            block_size,
            count,
            blocks,
            device_id,
            uuid,
            control: (cfd, cmap),
            holds_offset,
            row_stride,
            lease,
            socket_path,
            state: Mutex::new(State {
                rows: vec![Row::Free; ROWS],
                blocks: vec![BlockState { leased: false, published: None }; count],
                next_generation: 1,
                evict: Vec::new(),
                counts: PoolCounts::default(),
            }),
            signals: Signals::default(),
        }))
    }

    /// Free the device blocks now (their backend is being replaced: its context must not
    /// be kept alive by them). The pool then leases nothing and serves no consumer;
    /// consumers keep what they imported. Nothing for a host pool.
    pub(crate) fn release_device(&self) {
        if let Some(mut d) = self.blocks.device() {
            drop(d.take());
        }
    }

    /// The device blocks were released ([`Pool::release_device`]).
    pub(crate) fn released(&self) -> bool {
        self.blocks.device().is_some_and(|d| d.is_none())
    }

    /// Why a device pool's blocks have no interprocess events (`None`: they have, or the
    /// pool is host memory, which needs none).
    pub fn events_missing(&self) -> Option<String> {
        match self.blocks.device().as_deref() {
            Some(Some(d)) => d.events_missing(),
            Some(None) => Some("the pool was released".into()),
            None => None,
        }
    }

    /// The device's ordinal and UUID (`TensorRef.device_id`, `device_uuid`; -1 and zeros
    /// for host memory).
    pub(crate) fn device_info(&self) -> (i32, [u8; 16]) {
        (self.device_id, self.uuid)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool id (random per pool), as `TensorRef.pool_id` spells it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Where consumers connect.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// The socket's path as `TensorRef.socket_path` spells it.
    pub(crate) fn socket_str(&self) -> &str {
        &self.socket_str
    }

    /// Bytes of each block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Never true (a pool has at least one block).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Where the blocks live.
    pub fn memory(&self) -> MemoryKind {
        self.memory
    }

    /// Block b's generation in the control block.
    fn generation(&self, b: usize) -> &AtomicU64 {
        let off = RECORDS_OFFSET + b * RECORD_STRIDE;
        // SAFETY: `off + 8 <= holds_offset <= control size`, 8-aligned (the mapping is
        // page-aligned, `off` a multiple of 64); the control mapping lives as long as
        // `self`; other processes access it only atomically (docs/HANDOFF.md).
        unsafe { AtomicU64::from_ptr(self.control.1.ptr().add(off).cast()) }
    }

    /// Row r's hold count of block b.
    fn hold(&self, r: usize, b: usize) -> &AtomicU32 {
        let off = self.holds_offset + r * self.row_stride + 4 * b;
        // SAFETY: r < ROWS and b < blocks, so `off + 4` is inside the control mapping
        // (sized for ROWS rows), 4-aligned; as for `generation`.
        unsafe { AtomicU32::from_ptr(self.control.1.ptr().add(off).cast()) }
    }

    /// Holds of block b by live consumers.
    fn holds(&self, st: &State, b: usize) -> u64 {
        st.rows
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Row::Live(..)))
            .map(|(r, _)| u64::from(self.hold(r, b).load(Ordering::SeqCst)))
            .sum()
    }

    /// A block to write the next set's tensors into, or `None` (counted) when every block
    /// is held, leased or published less than `GRACE` ago. A consumer that held the
    /// block it would take for longer than the lease is disconnected (counted; the
    /// second value says how many).
    pub fn lease(self: &Arc<Self>) -> (Option<Lease>, usize) {
        if self.released() {
            return (None, 0);
        }
        let now = Instant::now();
        let mut st = self.state();
        let mut reclaimed = 0;
        // Oldest published first (never published: first of all).
        let mut order: Vec<usize> = (0..self.count).filter(|&b| !st.blocks[b].leased).collect();
        order.sort_by_key(|&b| st.blocks[b].published);
        for b in order {
            if st.blocks[b].published.is_some_and(|t| now.duration_since(t) < GRACE) {
                continue;
            }
            if self.holds(&st, b) > 0 {
                let expired =
                    st.blocks[b].published.is_some_and(|t| now.duration_since(t) > self.lease);
                if !expired {
                    continue;
                }
                reclaimed += self.reclaim(&mut st, b);
            }
            let generation = st.next_generation;
            st.next_generation += 1;
            self.generation(b).store(generation, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.holds(&st, b) > 0 {
                continue; // taken just now, for the old generation: leave it
            }
            st.blocks[b].leased = true;
            return (
                Some(Lease {
                    pool: Arc::clone(self),
                    index: b,
                    generation,
                    announced: false,
                    published: false,
                }),
                reclaimed,
            );
        }
        st.counts.no_free_block += 1;
        (None, reclaimed)
    }

    /// Disconnect every live consumer holding block b (they held it past the lease):
    /// their rows are retired. Returns how many.
    fn reclaim(&self, st: &mut State, b: usize) -> usize {
        let mut n = 0;
        for r in 0..st.rows.len() {
            if let Row::Live(conn, fd) = st.rows[r] {
                if self.hold(r, b).load(Ordering::SeqCst) > 0 {
                    // Shut down now, not at the server's next poll: the consumer sees
                    // its connection end before the block is written again. The fd is
                    // open: the server closes a connection's socket only after its row
                    // left `Live` (under this lock).
                    // SAFETY: shutdown on an open socket of ours; no memory involved.
                    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
                    st.rows[r] = Row::Retired(Instant::now());
                    st.evict.push(conn);
                    n += 1;
                }
            }
        }
        st.counts.reclaims += n as u64;
        n
    }

    /// Each consumer on the ready signal: its timings and descriptors.
    pub fn consumer_stats(&self) -> Vec<ConsumerStats> {
        self.signals.stats()
    }

    /// Consumers on the ready signal now, and the descriptors dropped for them.
    pub fn signal_counts(&self) -> (usize, u64) {
        (self.signals.len(), self.signals.dropped())
    }

    /// Counters, and (blocks leased or held, consumers connected).
    pub fn counts(&self) -> (PoolCounts, usize, usize) {
        let st = self.state();
        let in_use =
            (0..self.count).filter(|&b| st.blocks[b].leased || self.holds(&st, b) > 0).count();
        let live = live(&st.rows);
        (st.counts, in_use, live)
    }
}

/// The server's side of the pool ([`server`]: the node's, and the tests').
impl Pool {
    /// A row for connection `conn` (its socket `fd`), or why not.
    fn attach(&self, conn: u64, fd: RawFd) -> std::result::Result<usize, String> {
        let mut st = self.state();
        let now = Instant::now();
        for r in 0..st.rows.len() {
            if matches!(st.rows[r], Row::Retired(t) if now.duration_since(t) >= QUARANTINE) {
                for b in 0..self.count {
                    self.hold(r, b).store(0, Ordering::SeqCst);
                }
                st.rows[r] = Row::Free;
            }
        }
        let live = live(&st.rows);
        let free = st.rows.iter().position(|r| *r == Row::Free);
        match free {
            Some(r) if live < MAX_CONSUMERS => {
                st.rows[r] = Row::Live(conn, fd);
                st.counts.served += 1;
                Ok(r)
            }
            _ => {
                st.counts.refused += 1;
                Err(format!("too many consumers (at most {MAX_CONSUMERS} at once)"))
            }
        }
    }

    /// Connection `conn` closed by its consumer: its holds are released (zeroed) and its
    /// row is free again. `clean: false` (the node dropped it for sending bytes, or it
    /// was evicted): the consumer may still write to its row, which is retired.
    fn detach(&self, conn: u64, row: usize, clean: bool) {
        let mut st = self.state();
        if !matches!(st.rows[row], Row::Live(c, _) if c == conn) {
            return; // retired already (evicted)
        }
        if clean {
            for b in 0..self.count {
                self.hold(row, b).store(0, Ordering::SeqCst);
            }
            st.rows[row] = Row::Free;
        } else {
            st.rows[row] = Row::Retired(Instant::now());
            st.counts.bad_clients += 1;
        }
    }

    /// Connection `conn` (its socket `stream`, its consumer `name`) asked for the ready
    /// signal: its outbox, which gets every tensor leased from now on. Registered under
    /// the pool's lock, so that no set leased after the `ACCEPT`'s generation is
    /// announced before the outbox is there.
    fn upgrade(
        &self,
        conn: u64,
        stream: &Arc<std::os::unix::net::UnixStream>,
        name: String,
    ) -> Arc<Outbox> {
        let st = self.state();
        let pid = signal::peer_pid(stream);
        let outbox = Arc::new(Outbox::new(conn, Arc::clone(stream), st.next_generation));
        let accept = serde_json::json!({
            "version": signal::VERSION,
            "from_generation": st.next_generation,
            "queue": signal::QUEUE,
        });
        outbox.control(signal::frame(signal::ACCEPT, accept.to_string().as_bytes()));
        self.signals.add(Arc::clone(&outbox), name, pid);
        outbox
    }

    /// Connections to close now (their consumers were evicted).
    fn take_evicted(&self) -> Vec<u64> {
        std::mem::take(&mut self.state().evict)
    }

    /// The hello for a consumer given row `row` (docs/HANDOFF.md).
    fn hello(&self, row: usize) -> String {
        serde_json::json!({
            "magic": HELLO_MAGIC,
            "version": PROTOCOL_VERSION,
            "pool_id": self.id(),
            "memory": self.memory.name(),
            "device_id": self.device_id,
            "blocks": self.count,
            "block_size": self.block_size,
            "control_size": self.control.1.len(),
            "row": row,
            "rows": ROWS,
            "records_offset": RECORDS_OFFSET,
            "record_stride": RECORD_STRIDE,
            "holds_offset": self.holds_offset,
            "row_stride": self.row_stride,
            "versions": [1, signal::VERSION],
        })
        .to_string()
    }

    /// The fds a consumer gets: the control block's, then each block's (`None`: the
    /// device blocks were released).
    fn fds(&self) -> Option<Vec<RawFd>> {
        let mut fds = vec![self.control.0.as_raw_fd()];
        match &self.blocks {
            Blocks::Host(b) => fds.extend(b.iter().map(|(fd, _)| fd.as_raw_fd())),
            Blocks::Device(_) => {
                let d = self.blocks.device()?;
                let d = d.as_deref()?;
                fds.extend((0..d.len()).map(|i| d.fd(i)));
            }
        }
        Some(fds)
    }
}

/// A block leased to write one set's tensors into. Publishing it ([`Lease::published`])
/// starts its grace; dropping it without publishing gives it back at once (its
/// generation changed when it was leased, so no consumer takes the old contents; if its
/// `TensorRef` was announced, the generation changes again, withdrawing it).
pub struct Lease {
    pool: Arc<Pool>,
    index: usize,
    generation: u64,
    /// Its `TensorRef` went out before the set's work was finished ([`Lease::announce`]).
    announced: bool,
    published: bool,
}

impl Lease {
    /// Where to write the tensors: the block's bytes (`block_size`) in host memory, or
    /// its device address (valid until the pool's `Pool::release_device`; `None`
    /// after it).
    pub fn memory(&mut self) -> Option<BlockMemory<'_>> {
        match &self.pool.blocks {
            Blocks::Host(b) => {
                let map = &b[self.index].1;
                // SAFETY: the mapping is `block_size` writable bytes alive as long as the
                // pool (kept by `self.pool`); the node writes a block only while it holds
                // its one lease (`leased` in the pool's state), and consumers only read it.
                Some(BlockMemory::Host(unsafe {
                    std::slice::from_raw_parts_mut(map.ptr(), map.len())
                }))
            }
            Blocks::Device(_) => {
                let d = self.pool.blocks.device()?;
                let d = d.as_deref()?;
                let event = d.ready_event(self.index);
                Some(BlockMemory::Device(d.address(self.index), d.block_size(), event))
            }
        }
    }

    /// The block's bytes when it is host memory (empty for device memory).
    pub fn bytes(&self) -> &[u8] {
        match &self.pool.blocks {
            Blocks::Host(b) => {
                let map = &b[self.index].1;
                // SAFETY: as in `memory`, read only.
                unsafe { std::slice::from_raw_parts(map.ptr(), map.len()) }
            }
            Blocks::Device(_) => &[],
        }
    }

    /// Copy the first `out.len()` bytes of a device block into `out` (see
    /// [`DeviceBlocks::read`]; an error for host memory or a released pool).
    pub fn read_device(&self, out: &mut [u8]) -> Result<()> {
        match self.pool.blocks.device().as_deref() {
            Some(Some(d)) => d.read(self.index, out),
            Some(None) => Err(Error::misuse("read_device", "the shared block's pool was released")),
            None => Err(Error::misuse("read_device", "a host block has no device copy: map it")),
        }
    }

    /// The block is device memory.
    pub(crate) fn is_device(&self) -> bool {
        matches!(self.pool.blocks, Blocks::Device(_))
    }

    /// Block index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The generation consumers must see to take it.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Its `TensorRef` went out before the set's work ended (it carries the block's
    /// interprocess event): if the lease is dropped without [`Lease::published`] (the
    /// work failed), the block's generation changes, withdrawing that `TensorRef` from
    /// consumers that wait for its event (docs/HANDOFF.md).
    pub fn announce(&mut self) {
        self.announced = true;
    }

    /// [`Lease::announce`] was called.
    pub fn announced(&self) -> bool {
        self.announced
    }

    /// Its `TensorRef` (`cdr`) went out on the topic: send its descriptor to the
    /// consumers on the ready signal (docs/HANDOFF.md, *The socket protocol*). Never
    /// blocks.
    pub fn signal(&self, cdr: &[u8]) {
        self.pool.signals.send(self.generation, cdr);
    }

    /// Its `TensorRef` was published (and the set's work is done): the block goes back
    /// to the pool, reusable once no consumer holds it and `GRACE` has passed.
    pub fn published(mut self) {
        self.published = true;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut st = self.pool.state();
        if self.announced && !self.published {
            let generation = st.next_generation;
            st.next_generation += 1;
            self.pool.generation(self.index).store(generation, Ordering::SeqCst);
            st.counts.withdrawn += 1;
        }
        let b = &mut st.blocks[self.index];
        b.leased = false;
        b.published = if self.published { Some(Instant::now()) } else { None };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> Arc<Pool> {
        Pool::host(n, 1000, Duration::from_millis(50), Path::new("/tmp")).unwrap()
    }

    #[test]
    fn blocks_are_page_sized_and_leased_oldest_first() {
        let p = pool(2);
        assert_eq!(p.block_size() % memory::page_size(), 0);
        let (a, _) = p.lease();
        let a = a.unwrap();
        let (b, _) = p.lease();
        let b = b.unwrap();
        assert_ne!(a.index(), b.index());
        assert!(b.generation() > a.generation());
        assert!(p.lease().0.is_none(), "both leased");
        assert_eq!(p.counts().0.no_free_block, 1);
        a.published();
        assert!(p.lease().0.is_none(), "within the grace");
        std::thread::sleep(GRACE * 2);
        let c = p.lease().0.unwrap();
        assert_eq!(c.index(), 0);
        assert_eq!(p.generation(0).load(Ordering::SeqCst), c.generation());
    }

    #[test]
    fn an_announced_set_dropped_unpublished_is_withdrawn_from_its_holders() {
        let p = pool(2);
        let row = p.attach(7, -1).unwrap();
        // Announced, then published (its work done): the generation consumers took stays.
        let mut a = p.lease().0.unwrap();
        let (ga, ia) = (a.generation(), a.index());
        a.announce();
        assert!(a.announced());
        a.published();
        assert_eq!(p.generation(ia).load(Ordering::SeqCst), ga);
        // Announced, taken by a consumer, and its work failed: a new generation tells the
        // holder to let go; the block stays held (not reused) until it does.
        let mut b = p.lease().0.unwrap();
        let (gb, ib) = (b.generation(), b.index());
        b.announce();
        p.hold(row, ib).fetch_add(1, Ordering::SeqCst);
        drop(b);
        let now = p.generation(ib).load(Ordering::SeqCst);
        assert_ne!(now, gb, "withdrawn");
        assert!(now > gb, "a generation never published before");
        assert_eq!(p.counts().0.withdrawn, 1);
        std::thread::sleep(GRACE * 2);
        let c = p.lease().0.unwrap();
        assert_eq!(c.index(), ia, "the withdrawn block is still held: the other one is leased");
        p.hold(row, ib).fetch_sub(1, Ordering::SeqCst);
        // Not announced, dropped unpublished: nothing withdrawn.
        drop(c);
        assert_eq!(p.counts().0.withdrawn, 1);
    }

    #[test]
    fn a_held_block_is_not_reused_until_released_or_the_lease_ends() {
        let p = pool(1);
        let row = p.attach(7, -1).unwrap();
        let mut a = p.lease().0.unwrap();
        let g = a.generation();
        let Some(BlockMemory::Host(bytes)) = a.memory() else { panic!("a host block") };
        bytes[0] = 42;
        a.published();
        // The consumer takes it (add, then check the generation).
        p.hold(row, 0).fetch_add(1, Ordering::SeqCst);
        assert_eq!(p.generation(0).load(Ordering::SeqCst), g);
        std::thread::sleep(GRACE * 2);
        assert!(p.lease().0.is_none(), "held");
        assert_eq!(p.counts().1, 1);
        p.hold(row, 0).fetch_sub(1, Ordering::SeqCst);
        let b = p.lease().0.unwrap();
        assert_ne!(b.generation(), g, "a new generation: late takers of g let go");
        b.published();
        // Held past the lease: the consumer is evicted, its row retired.
        p.hold(row, 0).fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(60));
        let (c, reclaimed) = p.lease();
        assert!(c.is_some());
        assert_eq!(reclaimed, 1);
        assert_eq!(p.take_evicted(), vec![7]);
        assert_eq!(p.counts().0.reclaims, 1);
        p.detach(7, row, true); // the eviction retired the row already: no effect
        assert!(matches!(p.state().rows[row], Row::Retired(_)));
    }

    #[test]
    fn a_consumer_that_closes_releases_its_holds() {
        let p = pool(1);
        let row = p.attach(1, -1).unwrap();
        let a = p.lease().0.unwrap();
        a.published();
        p.hold(row, 0).fetch_add(2, Ordering::SeqCst);
        std::thread::sleep(GRACE * 2);
        assert!(p.lease().0.is_none());
        p.detach(1, row, true);
        assert_eq!(p.hold(row, 0).load(Ordering::SeqCst), 0);
        assert!(p.lease().0.is_some());
        assert_eq!(p.attach(2, -1).unwrap(), row, "the row is free again");
    }

    /// Device blocks as a backend would hand them over: fds (memfds here) and addresses.
    struct FakeDevice(Vec<Memfd>);

    impl DeviceBlocks for FakeDevice {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn block_size(&self) -> usize {
            2 << 20
        }
        fn fd(&self, i: usize) -> RawFd {
            self.0[i].as_raw_fd()
        }
        fn address(&self, i: usize) -> u64 {
            0x7000_0000_0000 + (i as u64) * (2 << 20)
        }
        fn device_id(&self) -> i32 {
            3
        }
        fn uuid(&self) -> [u8; 16] {
            [7; 16]
        }
        fn read(&self, i: usize, out: &mut [u8]) -> Result<()> {
            out.fill(i as u8 + 1);
            Ok(())
        }
    }

    #[test]
    fn a_device_pool_leases_addresses_until_released() {
        let fds = (0..2).map(|i| Memfd::new(&format!("fake-{i}"), 4096).unwrap()).collect();
        let p = Pool::device(Box::new(FakeDevice(fds)), Duration::from_secs(1), Path::new("/tmp"))
            .unwrap();
        assert_eq!((p.memory(), p.len(), p.block_size()), (MemoryKind::Cuda, 2, 2 << 20));
        assert_eq!(p.device_info(), (3, [7; 16]));
        let hello: serde_json::Value = serde_json::from_str(&p.hello(0)).unwrap();
        assert_eq!(
            (hello["memory"].as_str(), hello["device_id"].as_i64()),
            (Some("cuda"), Some(3))
        );
        assert_eq!(p.fds().unwrap().len(), 3, "control + 2 blocks");
        let mut a = p.lease().0.unwrap();
        assert!(a.is_device() && a.bytes().is_empty());
        let Some(BlockMemory::Device(addr, size, None)) = a.memory() else {
            panic!("a device block")
        };
        assert_eq!((addr, size), (0x7000_0000_0000 + (a.index() as u64) * (2 << 20), 2 << 20));
        let mut copy = [0u8; 4];
        a.read_device(&mut copy).unwrap();
        assert_eq!(copy, [a.index() as u8 + 1; 4], "the block's own read");
        p.release_device();
        assert!(p.released() && a.memory().is_none(), "released: no address any more");
        assert!(a.read_device(&mut copy).is_err());
        assert!(p.fds().is_none() && p.lease().0.is_none(), "nothing served, nothing leased");
    }

    #[test]
    fn consumers_beyond_the_limit_are_refused() {
        let p = pool(1);
        for c in 0..MAX_CONSUMERS as u64 {
            p.attach(c, -1).unwrap();
        }
        assert!(p.attach(999, -1).unwrap_err().contains("too many consumers"));
        assert_eq!(p.counts().0.refused, 1);
        assert_eq!(p.counts().2, MAX_CONSUMERS);
    }
}
