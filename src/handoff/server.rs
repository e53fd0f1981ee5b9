//! The pool's Unix socket: each consumer that connects gets one hello (JSON) with every
//! block's file descriptor (`SCM_RIGHTS`) and a row of holds; its connection's end
//! releases them. A consumer may then upgrade to protocol version 2 ([`super::signal`]:
//! descriptors, reports). One thread polls the listener and the connections, reads the
//! consumers' messages and sends what their outboxes hold; it never blocks the node.

use super::signal::{self, Incoming, Outbox};
use super::{Pool, HELLO_MAGIC, PROTOCOL_VERSION};
use crate::error::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the thread looks at the stop flag and at evicted consumers.
const POLL_MS: i32 = 50;

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// The directory of the node's sockets: `$XDG_RUNTIME_DIR/vision_preproc` when
/// `XDG_RUNTIME_DIR` is set, else `/tmp/vision_preproc-<uid>`; created with mode 0700,
/// refused when it is someone else's or open to others.
pub(crate) fn socket_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if Path::new(&d).is_dir() => PathBuf::from(d).join("vision_preproc"),
        _ => PathBuf::from(format!("/tmp/vision_preproc-{}", euid())),
    };
    if let Err(e) = std::fs::create_dir(&dir) {
        if e.kind() != ErrorKind::AlreadyExists {
            return Err(Error::handoff_io(format!("creating {}", dir.display()), e));
        }
    } else {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::handoff_io(format!("chmod 0700 {}", dir.display()), e))?;
    }
    let meta = std::fs::symlink_metadata(&dir)
        .map_err(|e| Error::handoff_io(dir.display().to_string(), e))?;
    if !meta.is_dir() || meta.uid() != euid() || meta.mode() & 0o077 != 0 {
        return Err(Error::Handoff(format!(
            "{} must be a directory of user {} with mode 0700 (it is uid {}, mode {:o}): \
             remove it, or set XDG_RUNTIME_DIR to a private directory",
            dir.display(),
            euid(),
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Ok(dir)
}

/// Remove the socket files in `dir` that are this user's and refuse connections (left
/// by a node that crashed). Returns how many.
pub(crate) fn remove_stale(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for e in entries.flatten() {
        let path = e.path();
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.uid() == euid());
        if !ours || path.extension().is_none_or(|x| x != "sock") {
            continue;
        }
        let refused = matches!(UnixStream::connect(&path), Err(e) if e.kind() == ErrorKind::ConnectionRefused);
        if refused && std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Send `bytes` on `stream`, with `fds` on the first `sendmsg`.
fn send_with_fds(stream: &mut UnixStream, bytes: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let payload = std::mem::size_of_val(fds);
    let payload_u32 = u32::try_from(payload).map_err(|_| std::io::Error::other("too many fds"))?;
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE(payload_u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)]; // cmsghdr-aligned
    let mut iov =
        libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg_control` points at `space` zeroed, aligned bytes, room for one
        // header with `payload` bytes of data (CMSG_SPACE); CMSG_FIRSTHDR is non-null
        // for it, CMSG_DATA points inside it, and the fds are copied within bounds.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload_u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                payload,
            );
        }
    }
    // SAFETY: a connected socket of ours; `msg` points at live buffers.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    let sent = usize::try_from(sent).map_err(|_| std::io::Error::last_os_error())?;
    stream.write_all(&bytes[sent..])
}

/// The hello as sent: a 4-byte little-endian length, then the JSON.
fn framed(json: &str) -> Vec<u8> {
    let mut v = (json.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    v
}

struct Conn {
    id: u64,
    /// Shared with its outbox once upgraded.
    stream: Arc<UnixStream>,
    row: usize,
    /// Bytes read and not yet a whole frame.
    inbox: Vec<u8>,
    /// Upgraded to version 2: its outbox of descriptors.
    outbox: Option<Arc<Outbox>>,
}

/// Bytes of a consumer's frames kept unread at most (a frame's longest, and its header).
const INBOX_MAX: usize = signal::MAX_FRAME + 4;

/// The socket's thread; stops (and removes the socket file) when dropped.
pub(crate) struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl Server {
    /// Listen at the pool's socket path (owner-only) and serve consumers on a thread.
    /// A file already there that is this user's is replaced.
    pub(crate) fn start(pool: Arc<Pool>) -> Result<Server> {
        let path = pool.socket_path().to_path_buf();
        if let Ok(m) = std::fs::symlink_metadata(&path) {
            if m.uid() != euid() {
                return Err(Error::Handoff(format!(
                    "{} exists and is not ours (uid {}): remove it",
                    path.display(),
                    m.uid()
                )));
            }
            let _ = std::fs::remove_file(&path);
        }
        let listener = UnixListener::bind(&path)
            .map_err(|e| Error::handoff_io(format!("binding {}", path.display()), e))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::handoff_io(format!("chmod 0600 {}", path.display()), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::handoff_io(path.display().to_string(), e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("handoff".into())
            .spawn(move || serve(&pool, &listener, &flag))
            .map_err(|e| Error::handoff_io("starting the hand-off thread", e))?;
        Ok(Server { stop, thread: Some(thread), path })
    }

    /// The socket file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Accept new consumers: each gets a row and the hello with the fds, or a refusal.
fn accept(pool: &Pool, listener: &UnixListener, conns: &mut Vec<Conn>, next_id: &mut u64) {
    loop {
        let mut stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return, // WouldBlock: none waiting (other errors: next round)
        };
        *next_id += 1;
        let id = *next_id;
        let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
        let fds = pool.fds();
        match fds
            .ok_or_else(|| "the pool was closed (a new one follows)".to_string())
            .and_then(|fds| pool.attach(id, stream.as_raw_fd()).map(|row| (row, fds)))
        {
            Ok((row, fds)) => {
                let sent = send_with_fds(&mut stream, &framed(&pool.hello(row)), &fds);
                if sent.is_err() || stream.set_nonblocking(true).is_err() {
                    pool.detach(id, row, true);
                    continue;
                }
                conns.push(Conn {
                    id,
                    stream: Arc::new(stream),
                    row,
                    inbox: Vec::new(),
                    outbox: None,
                });
            }
            Err(why) => {
                let refusal = serde_json::json!({
                    "magic": HELLO_MAGIC, "version": PROTOCOL_VERSION, "error": why,
                })
                .to_string();
                let _ = stream.write_all(&framed(&refusal));
            }
        }
    }
}

/// Read what connection `c` sent: false when it is gone (closed: `Some(true)` in `gone`)
/// or a bad client (`Some(false)`).
fn read(pool: &Pool, c: &mut Conn, buf: &mut [u8]) -> Option<bool> {
    loop {
        match (&*c.stream).read(buf) {
            Ok(0) => return Some(true), // closed by the consumer
            Ok(n) => {
                c.inbox.extend_from_slice(&buf[..n]);
                if c.inbox.len() > INBOX_MAX {
                    return Some(false);
                }
                if !handle(pool, c) {
                    return Some(false);
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
            Err(_) => return Some(true),
        }
    }
}

/// The whole frames in `c`'s inbox: an upgrade, reports; false for a bad client.
fn handle(pool: &Pool, c: &mut Conn) -> bool {
    let msgs = signal::frames(&mut c.inbox)
        .and_then(|frames| signal::incoming(frames, c.outbox.is_some()));
    let Ok(msgs) = msgs else { return false };
    for m in msgs {
        match m {
            Incoming::Upgrade(name) => c.outbox = Some(pool.upgrade(c.id, &c.stream, name)),
            Incoming::Report(records) => pool.signals.report(c.id, records),
        }
    }
    true
}

/// Connection `c` leaves: the ready signal first, then its row (before its socket
/// closes, see Pool::reclaim).
fn remove(pool: &Pool, c: Conn, clean: bool) {
    pool.signals.remove(c.id);
    pool.detach(c.id, c.row, clean);
    drop(c);
}

fn serve(pool: &Pool, listener: &UnixListener, stop: &AtomicBool) {
    let mut conns: Vec<Conn> = Vec::new();
    let mut next_id = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    while !stop.load(Ordering::Relaxed) {
        let mut fds: Vec<libc::pollfd> =
            std::iter::once((listener.as_raw_fd(), false))
                .chain(conns.iter().map(|c| {
                    (c.stream.as_raw_fd(), c.outbox.as_ref().is_some_and(|o| o.pending()))
                }))
                .map(|(fd, out)| libc::pollfd {
                    fd,
                    events: libc::POLLIN | if out { libc::POLLOUT } else { 0 },
                    revents: 0,
                })
                .collect();
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, POLL_MS) };
        if n > 0 {
            // Connections first (their indices are those of `fds[1..]`), then new ones.
            let mut gone = Vec::new();
            for (i, c) in conns.iter_mut().enumerate() {
                let revents = fds[i + 1].revents;
                if revents & libc::POLLOUT != 0 {
                    if let Some(o) = &c.outbox {
                        o.flush();
                    }
                }
                if revents & !libc::POLLOUT == 0 {
                    continue;
                }
                if let Some(clean) = read(pool, c, &mut buf) {
                    gone.push((i, clean));
                }
            }
            for (i, clean) in gone.into_iter().rev() {
                remove(pool, conns.swap_remove(i), clean);
            }
            if fds[0].revents != 0 {
                accept(pool, listener, &mut conns, &mut next_id);
            }
        }
        let evicted = pool.take_evicted();
        if !evicted.is_empty() {
            for c in conns.iter().filter(|c| evicted.contains(&c.id)) {
                pool.signals.remove(c.id);
            }
            conns.retain(|c| !evicted.contains(&c.id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Pool;
    use super::*;
    use std::os::unix::net::UnixStream;

    fn read_hello(s: &mut UnixStream) -> serde_json::Value {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut json = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut json).unwrap();
        serde_json::from_slice(&json).unwrap()
    }

    #[test]
    fn a_consumer_gets_the_hello_and_its_release_on_close() {
        let dir = std::env::temp_dir().join(format!("vp_handoff_test_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pool = Pool::host(2, 4096, Duration::from_secs(1), &dir).unwrap();
        let server = Server::start(Arc::clone(&pool)).unwrap();
        let mode = std::fs::metadata(server.path()).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let mut s = UnixStream::connect(server.path()).unwrap();
        let hello = read_hello(&mut s);
        assert_eq!(hello["magic"], HELLO_MAGIC);
        assert_eq!(hello["blocks"], 2);
        assert_eq!(hello["pool_id"], pool.id());
        let row = hello["row"].as_u64().unwrap() as usize;
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(pool.counts().2, 1, "one consumer");
        pool.hold(row, 1).fetch_add(1, Ordering::SeqCst);
        drop(s);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(pool.counts().2, 0, "its connection's end released it");
        assert_eq!(pool.hold(row, 1).load(Ordering::SeqCst), 0);
        // A client that sends bytes is dropped (and its row retired).
        let mut bad = UnixStream::connect(server.path()).unwrap();
        read_hello(&mut bad);
        bad.write_all(b"garbage").unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(pool.counts().0.bad_clients, 1);
        let path = server.path().to_path_buf();
        drop(server);
        assert!(!path.exists(), "the socket file goes with the server");
        // A stale socket (bound, nobody listening) is removed; a live one is kept.
        let stale = dir.join("0000000000000001.sock");
        drop(UnixListener::bind(&stale).unwrap());
        let live_pool = Pool::host(1, 4096, Duration::from_secs(1), &dir).unwrap();
        let live = Server::start(live_pool).unwrap();
        assert_eq!(remove_stale(&dir), 1);
        assert!(!stale.exists() && live.path().exists());
        drop(live);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
