//! Version 2 of the pool's socket protocol (docs/HANDOFF.md, *The socket protocol*): its
//! frames, the ready signal (each upgraded consumer's bounded outbox of descriptors,
//! written without ever blocking the node) and the consumers' reports (a window of
//! timings per consumer).

use std::collections::{HashMap, VecDeque};
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};

/// The protocol version this module speaks (the hello lists it in `versions`).
pub(crate) const VERSION: u32 = 2;
/// The largest frame either way (its length field: the bytes after it).
pub const MAX_FRAME: usize = 65_536;
/// Frame types.
pub const UPGRADE: u16 = 1;
/// The node's answer to `UPGRADE`.
pub const ACCEPT: u16 = 2;
/// A tensor's descriptor: `i64 sent_ns`, then the `TensorRef`'s CDR.
pub const DESCRIPTOR: u16 = 3;
/// Descriptors a consumer did not get: `u64 dropped`, `u64 dropped_total`.
pub const DROPPED: u16 = 4;
/// A consumer's records.
pub const REPORT: u16 = 5;
/// Messages the node queues for one consumer beyond what its socket takes.
pub(crate) const QUEUE: usize = 16;
/// The send buffer of an upgraded consumer's socket (bytes).
const SNDBUF: libc::c_int = 16 * 1024;
/// Bytes of one record in a `REPORT`, and the most records in one.
pub const RECORD_BYTES: usize = 48;
/// Records in one `REPORT` at most.
pub const MAX_RECORDS: usize = 256;
/// Records kept per consumer (the window of its percentiles).
pub(crate) const WINDOW: usize = 300;
/// Descriptors whose send time the node remembers (to measure their delivery).
const SENT_KEPT: usize = 64;
/// Record flags.
pub const FLAG_SKIPPED: u32 = 1;
/// The tensor was withdrawn or never ready.
pub const FLAG_WITHDRAWN: u32 = 2;
/// The descriptor came on the topic, not the socket.
pub const FLAG_TOPIC: u32 = 4;

/// `CLOCK_REALTIME` in ns since the epoch (0 if the clock is before it).
pub fn realtime_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A frame: `u32 length` (of what follows), `u16 kind`, `u16 0`, `body`.
pub fn frame(kind: u16, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + body.len());
    v.extend_from_slice(&((body.len() + 4) as u32).to_le_bytes());
    v.extend_from_slice(&kind.to_le_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(body);
    v
}

/// Cut the complete frames off the front of `buf`: (kind, body) each; an error (naming
/// what is wrong) for a length outside 4..=MAX_FRAME.
pub fn frames(buf: &mut Vec<u8>) -> Result<Vec<(u16, Vec<u8>)>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while buf.len() - at >= 4 {
        let len = u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
        if !(4..=MAX_FRAME).contains(&len) {
            return Err(format!("a frame of {len} bytes (4 to {MAX_FRAME})"));
        }
        if buf.len() - at < 4 + len {
            break;
        }
        let kind = u16::from_le_bytes([buf[at + 4], buf[at + 5]]);
        out.push((kind, buf[at + 8..at + 4 + len].to_vec()));
        at += 4 + len;
    }
    buf.drain(..at);
    Ok(out)
}

/// One tensor as a consumer handled it (a `REPORT` record; times `CLOCK_REALTIME` ns,
/// 0: never).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Record {
    /// The tensor's generation (its `TensorRef`'s).
    pub generation: u64,
    /// The `TensorRef`'s header stamp.
    pub stamp_ns: i64,
    /// When its descriptor arrived.
    pub received_ns: i64,
    /// When the tensor was usable (held, the node's work on it done).
    pub acquired_ns: i64,
    /// When it was given back.
    pub released_ns: i64,
    /// Its block.
    pub block: u32,
    /// `FLAG_*`.
    pub flags: u32,
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

impl Record {
    /// Its 48 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.generation.to_le_bytes());
        for t in [self.stamp_ns, self.received_ns, self.acquired_ns, self.released_ns] {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&self.block.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Record {
        let i = |at| le_u64(b, at) as i64;
        Record {
            generation: le_u64(b, 0),
            stamp_ns: i(8),
            received_ns: i(16),
            acquired_ns: i(24),
            released_ns: i(32),
            block: le_u32(b, 40),
            flags: le_u32(b, 44),
        }
    }

    /// A `REPORT`'s body for `records` (at most `MAX_RECORDS`).
    pub fn report(records: &[Record]) -> Vec<u8> {
        let mut body = Vec::with_capacity(8 + records.len() * RECORD_BYTES);
        body.extend_from_slice(&(records.len() as u32).to_le_bytes());
        body.extend_from_slice(&[0; 4]);
        for r in records {
            r.encode(&mut body);
        }
        body
    }

    /// The records of a `REPORT`'s body, or what is wrong with it.
    pub fn parse_report(body: &[u8]) -> Result<Vec<Record>, String> {
        if body.len() < 8 {
            return Err(format!("a REPORT of {} bytes", body.len()));
        }
        let count = le_u32(body, 0) as usize;
        if !(1..=MAX_RECORDS).contains(&count) || body.len() != 8 + count * RECORD_BYTES {
            return Err(format!(
                "a REPORT of {count} records in {} bytes (1 to {MAX_RECORDS} records of \
                 {RECORD_BYTES} bytes after 8)",
                body.len()
            ));
        }
        Ok(body[8..].chunks_exact(RECORD_BYTES).map(Record::decode).collect())
    }
}

/// A consumer's message.
#[derive(Debug, PartialEq)]
pub(crate) enum Incoming {
    /// `UPGRADE`: its name.
    Upgrade(String),
    /// `REPORT`: its records.
    Report(Vec<Record>),
}

/// The messages in `frames` from a consumer (upgraded already or not), or why it is a
/// bad client.
pub(crate) fn incoming(
    frames: Vec<(u16, Vec<u8>)>,
    upgraded: bool,
) -> Result<Vec<Incoming>, String> {
    let mut out = Vec::with_capacity(frames.len());
    let mut up = upgraded;
    for (kind, body) in frames {
        match kind {
            UPGRADE if !up => {
                let v: serde_json::Value = serde_json::from_slice(&body)
                    .map_err(|e| format!("UPGRADE is not JSON: {e}"))?;
                if v["version"].as_u64() != Some(u64::from(VERSION)) {
                    return Err(format!("UPGRADE to version {}: the node speaks 2", v["version"]));
                }
                let name: String = v["name"].as_str().unwrap_or("").chars().take(64).collect();
                up = true;
                out.push(Incoming::Upgrade(name));
            }
            REPORT if up => out.push(Incoming::Report(Record::parse_report(&body)?)),
            k => return Err(format!("a frame of type {k} (upgraded: {up})")),
        }
    }
    Ok(out)
}

/// `send` without blocking and without SIGPIPE.
fn send_now(stream: &UnixStream, bytes: &[u8]) -> std::io::Result<usize> {
    // SAFETY: a connected socket of ours; `bytes` is a live buffer of its length.
    let n = unsafe {
        libc::send(
            stream.as_raw_fd(),
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
}

/// What one upgraded consumer has not been sent yet.
#[derive(Default)]
struct OutState {
    queue: VecDeque<Arc<[u8]>>,
    /// Bytes of the queue's first message already sent.
    sent: usize,
    /// Descriptors dropped since the last `DROPPED` notice, and in all.
    dropped: u64,
    dropped_total: u64,
    /// Descriptors queued (sent or to be sent).
    offered: u64,
    /// The socket failed: nothing more is sent (the server's thread closes it).
    broken: bool,
}

/// An upgraded consumer's side of the ready signal: its socket (shared with the server's
/// thread: no second descriptor; it closes when both let go), the first generation it
/// gets, and its bounded queue.
pub(crate) struct Outbox {
    conn: u64,
    stream: Arc<UnixStream>,
    from_generation: u64,
    state: Mutex<OutState>,
}

impl Outbox {
    /// The outbox of connection `conn` on `stream` (its send buffer made `SNDBUF`).
    pub(crate) fn new(conn: u64, stream: Arc<UnixStream>, from_generation: u64) -> Outbox {
        let size = SNDBUF;
        // SAFETY: a socket of ours; the option's value is an int, passed by address with
        // its size.
        unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        Outbox { conn, stream, from_generation, state: Mutex::new(OutState::default()) }
    }

    fn state(&self) -> MutexGuard<'_, OutState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `msg` (a control message: never dropped) and send what the socket takes.
    pub(crate) fn control(&self, msg: Vec<u8>) {
        let mut st = self.state();
        st.queue.push_back(msg.into());
        Self::flush_locked(&self.stream, &mut st);
    }

    /// Queue a descriptor, or drop it (counted) when the queue is full; then send what
    /// the socket takes. A `DROPPED` notice goes ahead of the next one that finds room.
    fn offer(&self, msg: &Arc<[u8]>) {
        let mut st = self.state();
        if st.broken {
            return;
        }
        Self::flush_locked(&self.stream, &mut st);
        if st.dropped > 0 && st.queue.len() < QUEUE {
            let mut body = st.dropped.to_le_bytes().to_vec();
            body.extend_from_slice(&st.dropped_total.to_le_bytes());
            st.queue.push_back(frame(DROPPED, &body).into());
            st.dropped = 0;
        }
        if st.queue.len() < QUEUE {
            st.queue.push_back(Arc::clone(msg));
            st.offered += 1;
        } else {
            st.dropped += 1;
            st.dropped_total += 1;
        }
        Self::flush_locked(&self.stream, &mut st);
    }

    fn flush_locked(stream: &UnixStream, st: &mut OutState) {
        while let Some(front) = st.queue.front() {
            match send_now(stream, &front[st.sent..]) {
                Ok(n) if st.sent + n == front.len() => {
                    st.queue.pop_front();
                    st.sent = 0;
                }
                Ok(n) => {
                    st.sent += n;
                    return;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                    return
                }
                Err(_) => {
                    st.broken = true;
                    st.queue.clear();
                    return;
                }
            }
        }
    }

    /// Send what the socket takes now; true while something is left.
    pub(crate) fn flush(&self) -> bool {
        let mut st = self.state();
        Self::flush_locked(&self.stream, &mut st);
        !st.queue.is_empty()
    }

    /// Messages waiting.
    pub(crate) fn pending(&self) -> bool {
        !self.state().queue.is_empty()
    }
}

/// One consumer's timings, as the node publishes them (ms; `None` without records).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConsumerStats {
    /// Its `UPGRADE`'s name and its process id.
    pub name: String,
    pub pid: i32,
    /// Records in the window, and of those, frames it skipped or that were withdrawn.
    pub frames: usize,
    pub skipped: usize,
    /// Camera stamp -> acquired, p50 and p99.
    pub stamp_to_acquired: Option<(f64, f64)>,
    /// Acquired -> released, p50 and p99.
    pub acquired_to_released: Option<(f64, f64)>,
    /// The node's send -> the consumer had the descriptor, p50 and p99.
    pub delivery: Option<(f64, f64)>,
    /// Descriptors queued for it, and dropped (its queue was full).
    pub sent: u64,
    pub dropped: u64,
}

/// p50 and p99 (nearest rank) of `v` in ms, from ns.
fn percentiles(mut v: Vec<i64>) -> Option<(f64, f64)> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let at = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1] as f64 / 1e6;
    Some((at(0.50), at(0.99)))
}

struct Log {
    name: String,
    pid: i32,
    records: VecDeque<Record>,
}

#[derive(Default)]
struct SignalState {
    boxes: Vec<Arc<Outbox>>,
    logs: HashMap<u64, Log>,
    /// (generation, sent_ns) of the last descriptors.
    sent: VecDeque<(u64, i64)>,
}

/// The pool's upgraded consumers: their outboxes and their reports.
#[derive(Default)]
pub(crate) struct Signals {
    state: Mutex<SignalState>,
}

impl Signals {
    fn state(&self) -> MutexGuard<'_, SignalState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Consumer `outbox` (named `name`, process `pid`) gets descriptors from now on.
    pub(crate) fn add(&self, outbox: Arc<Outbox>, name: String, pid: i32) {
        let mut st = self.state();
        st.logs.insert(outbox.conn, Log { name, pid, records: VecDeque::new() });
        st.boxes.push(outbox);
    }

    /// Connection `conn` is gone.
    pub(crate) fn remove(&self, conn: u64) {
        let mut st = self.state();
        st.boxes.retain(|b| b.conn != conn);
        st.logs.remove(&conn);
    }

    /// Upgraded consumers now.
    pub(crate) fn len(&self) -> usize {
        self.state().boxes.len()
    }

    /// Send the descriptor of the tensor of `generation` (its `TensorRef`'s CDR) to every
    /// upgraded consumer whose `from_generation` it reaches; never blocks.
    pub(crate) fn send(&self, generation: u64, cdr: &[u8]) {
        let boxes = {
            let mut st = self.state();
            if st.boxes.is_empty() {
                return;
            }
            let now = realtime_ns();
            st.sent.push_back((generation, now));
            if st.sent.len() > SENT_KEPT {
                st.sent.pop_front();
            }
            let mut body = now.to_le_bytes().to_vec();
            body.extend_from_slice(cdr);
            let msg: Arc<[u8]> = frame(DESCRIPTOR, &body).into();
            (st.boxes.clone(), msg)
        };
        let (boxes, msg) = boxes;
        for b in boxes.iter().filter(|b| generation >= b.from_generation) {
            b.offer(&msg);
        }
    }

    /// Records from connection `conn`.
    pub(crate) fn report(&self, conn: u64, records: Vec<Record>) {
        if let Some(log) = self.state().logs.get_mut(&conn) {
            log.records.extend(records);
            let extra = log.records.len().saturating_sub(WINDOW);
            log.records.drain(..extra);
        }
    }

    /// Each upgraded consumer's timings over its window.
    pub(crate) fn stats(&self) -> Vec<ConsumerStats> {
        let st = self.state();
        let sent: HashMap<u64, i64> = st.sent.iter().copied().collect();
        st.boxes
            .iter()
            .filter_map(|b| {
                let log = st.logs.get(&b.conn)?;
                let out = b.state();
                Some(stats_of(log, &sent, (out.offered, out.dropped_total)))
            })
            .collect()
    }

    /// Descriptors dropped for all consumers connected now.
    pub(crate) fn dropped(&self) -> u64 {
        self.state().boxes.iter().map(|b| b.state().dropped_total).sum()
    }
}

fn stats_of(log: &Log, sent: &HashMap<u64, i64>, (offered, dropped): (u64, u64)) -> ConsumerStats {
    let used = || log.records.iter().filter(|r| r.acquired_ns > 0);
    ConsumerStats {
        name: log.name.clone(),
        pid: log.pid,
        frames: log.records.len(),
        skipped: log.records.iter().filter(|r| r.acquired_ns == 0).count(),
        stamp_to_acquired: percentiles(used().map(|r| r.acquired_ns - r.stamp_ns).collect()),
        acquired_to_released: percentiles(
            used().filter(|r| r.released_ns > 0).map(|r| r.released_ns - r.acquired_ns).collect(),
        ),
        delivery: percentiles(
            log.records
                .iter()
                .filter(|r| r.received_ns > 0 && r.flags & FLAG_TOPIC == 0)
                .filter_map(|r| sent.get(&r.generation).map(|s| r.received_ns - s))
                .collect(),
        ),
        sent: offered,
        dropped,
    }
}

/// The process id of the peer of `stream` (`SO_PEERCRED`; -1 if unknown).
pub(crate) fn peer_pid(stream: &UnixStream) -> i32 {
    // SAFETY: ucred is plain data.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a socket of ours; `cred` has `len` writable bytes.
    let ok = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    } == 0;
    if ok {
        cred.pid
    } else {
        -1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_cut_where_they_end_and_bad_lengths_refused() {
        let mut buf = frame(UPGRADE, br#"{"version": 2, "name": "det"}"#);
        let records = [Record { generation: 9, stamp_ns: 1, acquired_ns: 5, ..Default::default() }];
        let report = frame(REPORT, &Record::report(&records));
        buf.extend_from_slice(&report[..10]);
        let got = frames(&mut buf).unwrap();
        assert_eq!(got.len(), 1, "the second frame is not complete");
        assert_eq!(buf.len(), 10);
        buf.extend_from_slice(&report[10..]);
        let mut all = got;
        all.extend(frames(&mut buf).unwrap());
        assert!(buf.is_empty());
        let msgs = incoming(all, false).unwrap();
        assert_eq!(msgs, vec![Incoming::Upgrade("det".into()), Incoming::Report(records.to_vec())]);
        let mut bad = vec![0xff, 0xff, 0xff, 0x7f];
        assert!(frames(&mut bad).unwrap_err().contains("a frame of 2147483647 bytes"));
        let report = frames(&mut frame(REPORT, &Record::report(&records))).unwrap();
        assert!(incoming(report, false).unwrap_err().contains("type 5"), "REPORT before UPGRADE");
        let twice = frames(&mut frame(UPGRADE, br#"{"version": 2}"#)).unwrap();
        assert!(incoming(twice, true).is_err(), "a second UPGRADE");
        let v3 = frames(&mut frame(UPGRADE, br#"{"version": 3}"#)).unwrap();
        assert!(incoming(v3, false).unwrap_err().contains("version 3"));
    }

    #[test]
    fn a_consumer_that_never_reads_costs_a_bounded_queue_and_is_told_its_drops() {
        let (node, mut consumer) = UnixStream::pair().unwrap();
        let signals = Signals::default();
        let outbox = Arc::new(Outbox::new(1, Arc::new(node), 5));
        signals.add(Arc::clone(&outbox), "stuck".into(), 42);
        let cdr = vec![7u8; 600];
        signals.send(4, &cdr); // before its first generation: not for it
        for g in 5..2005 {
            signals.send(g, &cdr);
        }
        let s = &signals.stats()[0];
        assert!(s.dropped > 1000 && s.sent + s.dropped == 2000, "{s:?}");
        assert!(outbox.state().queue.len() <= QUEUE, "bounded");
        // It reads now: the first descriptor is generation 5's... and a DROPPED notice
        // comes before the next descriptor that finds room.
        consumer.set_nonblocking(true).unwrap();
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 1 << 16];
        use std::io::Read;
        while let Ok(n) = consumer.read(&mut chunk) {
            buf.extend_from_slice(&chunk[..n]);
        }
        while outbox.flush() {
            while let Ok(n) = consumer.read(&mut chunk) {
                buf.extend_from_slice(&chunk[..n]);
            }
        }
        signals.send(3000, &cdr);
        while let Ok(n) = consumer.read(&mut chunk) {
            buf.extend_from_slice(&chunk[..n]);
        }
        let got = frames(&mut buf).unwrap();
        assert_eq!(got[0].0, DESCRIPTOR);
        assert_eq!(&got[0].1[8..], &cdr[..]);
        let notice = got.iter().find(|(k, _)| *k == DROPPED).expect("told");
        assert_eq!(le_u64(&notice.1, 0), s.dropped);
        assert_eq!(got.last().unwrap().0, DESCRIPTOR, "the next descriptor after the notice");
        assert_eq!(got.iter().filter(|(k, _)| *k == DESCRIPTOR).count() as u64, s.sent + 1);
    }

    #[test]
    fn reports_give_percentiles_over_the_window() {
        let (node, _consumer) = UnixStream::pair().unwrap();
        let signals = Signals::default();
        signals.add(Arc::new(Outbox::new(3, Arc::new(node), 0)), "det".into(), 7);
        let records: Vec<Record> = (1..=100)
            .map(|i| Record {
                generation: i as u64,
                stamp_ns: 1_000_000_000,
                acquired_ns: 1_000_000_000 + i * 1_000_000,
                released_ns: 1_000_000_000 + i * 1_000_000 + 2_000_000,
                ..Default::default()
            })
            .collect();
        for chunk in records.chunks(8) {
            signals.report(3, chunk.to_vec());
        }
        signals.report(99, records.clone()); // not a consumer: ignored
        let s = &signals.stats()[0];
        assert_eq!((s.name.as_str(), s.pid, s.frames), ("det", 7, 100));
        assert_eq!(s.stamp_to_acquired, Some((50.0, 99.0)));
        assert_eq!(s.acquired_to_released, Some((2.0, 2.0)));
        assert_eq!(s.delivery, None, "no received times");
        signals.report(3, records.repeat(4));
        assert_eq!(signals.stats()[0].frames, WINDOW);
        signals.remove(3);
        assert!(signals.stats().is_empty());
    }
}
