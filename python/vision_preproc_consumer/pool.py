"""One connection to a node's shared pool (docs/HANDOFF.md): the hello, the mapped blocks
and this consumer's row of reference counts in the control block."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
import mmap
import os
import select
import socket
import struct
import sys
import threading
import time
import weakref
from dataclasses import dataclass, fields
from typing import Any

#: The hello's "magic" and its layout's version (what every node's hello says).
MAGIC = "vision_preproc/pool"
VERSION = 1
#: The protocol version of the ready signal and the reports (docs/HANDOFF.md, *The socket
#: protocol*): used when the hello lists it in `versions`.
SIGNAL_VERSION = 2
#: Frame types of version 2.
UPGRADE, ACCEPT, DESCRIPTOR, DROPPED, REPORT = 1, 2, 3, 4, 5
#: The largest frame (its length field: the bytes after it).
MAX_FRAME = 65536
#: A REPORT record: generation, stamp, received, acquired, released (ns), block, flags.
RECORD = struct.Struct("<QqqqqII")
#: Record flags.
FLAG_SKIPPED, FLAG_WITHDRAWN, FLAG_TOPIC = 1, 2, 4
#: A REPORT goes out with this many records, or when its oldest is this old.
REPORT_EVERY, REPORT_AFTER_S = 8, 0.1
#: How long upgrade() waits for the node's ACCEPT.
UPGRADE_TIMEOUT_S = 1.0
#: Bytes 0-7 of the control block.
CONTROL_MAGIC = b"VPCTRL01"
#: The most file descriptors one sendmsg can carry (Linux's SCM_MAX_FD): control + 252 blocks.
MAX_FDS = 253
#: A hello longer than this is not a hello.
MAX_HELLO_BYTES = 1 << 20
#: How long connect() and the hello may take.
HELLO_TIMEOUT_S = 5.0
#: __ATOMIC_SEQ_CST, the memory order of every operation on the control block.
_SEQ_CST = 5


class PoolError(RuntimeError):
    """The pool cannot be used: refused by the node, a malformed hello, or the connection
    is gone (then make a new PoolClient)."""


@dataclass(frozen=True)
class Hello:
    """The node's hello: where this consumer's row and every block's record are."""

    pool_id: str
    memory: str  # "host" or "cuda"
    device_id: int
    blocks: int
    block_size: int
    control_size: int
    row: int
    rows: int
    records_offset: int
    record_stride: int
    holds_offset: int
    row_stride: int
    #: The protocol versions the node speaks (absent from a version 1 node's hello: (1,)).
    versions: tuple = (1,)

    @classmethod
    def parse(cls, raw: bytes) -> "Hello":
        """Check and read the hello's JSON; raise PoolError naming what is wrong."""
        try:
            d = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PoolError(f"the hello is not JSON: {e}") from None
        if not isinstance(d, dict) or d.get("magic") != MAGIC:
            raise PoolError(f"not a vision_preproc pool: magic {d.get('magic') if isinstance(d, dict) else d!r}, "
                            f"expected {MAGIC!r}")
        if d.get("version") != VERSION:
            raise PoolError(f"pool protocol version {d.get('version')!r}; this consumer speaks version {VERSION}")
        if "error" in d:
            raise PoolError(f"the node refused the connection: {d['error']}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "versions":
                v = d.get("versions", [1])
                if not isinstance(v, list) or not all(isinstance(x, int) for x in v):
                    raise PoolError(f"hello field 'versions' is {v!r}, expected a list of int")
                values["versions"] = tuple(v)
                continue
            v = d.get(f.name)
            kind = str if f.type == "str" else int
            if not isinstance(v, kind) or isinstance(v, bool):
                raise PoolError(f"hello field {f.name!r} is {v!r}, expected {kind.__name__}")
            values[f.name] = v
        h = cls(**values)
        h._check_layout()
        return h

    def _check_layout(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise PoolError(f"hello: {what} ({self})")

        need(self.memory in ("host", "cuda"), f"memory {self.memory!r} is neither 'host' nor 'cuda'")
        need(self.blocks >= 1 and self.block_size >= 1, "no blocks")
        need(0 <= self.row < self.rows, f"row {self.row} outside 0..{self.rows - 1}")
        need(self.records_offset >= len(CONTROL_MAGIC) and self.records_offset % 8 == 0
             and self.record_stride >= 8 and self.record_stride % 8 == 0,
             "records must be 8-byte aligned, after the magic, at least 8 bytes apart")
        need(self.records_offset + self.blocks * self.record_stride <= self.control_size,
             "the records end past the control block")
        need(self.holds_offset % 4 == 0 and self.row_stride % 4 == 0 and self.row_stride >= 4 * self.blocks,
             "rows must be 4-byte aligned with room for one u32 per block")
        need(self.holds_offset + self.rows * self.row_stride <= self.control_size,
             "the rows end past the control block")


class _Atomics:
    """libatomic's sequentially consistent operations on a raw address (the same
    instructions the node's Rust atomics compile to). Called without letting go of the
    interpreter (ctypes.PyDLL): each is a few instructions, and a thread that let go of it
    could wait for another thread's Python code (the socket's reader behind the executor)."""

    def __init__(self) -> None:
        lib = ctypes.PyDLL(ctypes.util.find_library("atomic") or "libatomic.so.1")
        self.fetch_add = getattr(lib, "__atomic_fetch_add_4")
        self.fetch_sub = getattr(lib, "__atomic_fetch_sub_4")
        for f in (self.fetch_add, self.fetch_sub):
            f.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int]
            f.restype = ctypes.c_uint32
        self.load_8 = getattr(lib, "__atomic_load_8")
        self.load_8.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.load_8.restype = ctypes.c_uint64


@functools.lru_cache(maxsize=None)
def _atomics() -> _Atomics:
    return _Atomics()


def _read_hello(sock: socket.socket) -> tuple[bytes, list[int]]:
    """The hello's JSON bytes and the descriptors that came with it. Reads exactly the
    hello (4-byte length, then the JSON), in as many recv calls as it takes."""
    fds: list[int] = []
    buf = b""
    length: int | None = None
    try:
        while length is None or len(buf) < 4 + length:
            want = 4 - len(buf) if length is None else 4 + length - len(buf)
            data, got, flags, _ = socket.recv_fds(sock, want, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
            fds += got
            if flags & socket.MSG_CTRUNC:
                raise PoolError(f"the hello's file descriptors were cut off (more than {MAX_FDS}, or this "
                                "process is at its open-file limit: ulimit -n)")
            if not data:
                raise PoolError(f"the node closed the connection after {len(buf)} bytes of the hello")
            buf += data
            if length is None and len(buf) >= 4:
                length = struct.unpack("<I", buf[:4])[0]
                if length > MAX_HELLO_BYTES:
                    raise PoolError(f"hello length {length} > {MAX_HELLO_BYTES}: not a vision_preproc pool")
    except socket.timeout:
        for fd in fds:
            os.close(fd)
        raise PoolError(f"no complete hello within {sock.gettimeout()} s ({len(buf)} bytes)") from None
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return buf[4:], fds


def frame(kind: int, body: bytes) -> bytes:
    """A version 2 frame: u32 length (of what follows), u16 kind, u16 0, body."""
    return struct.pack("<IHH", len(body) + 4, kind, 0) + body


def cut_frames(buf: bytearray) -> list[tuple[int, bytes]]:
    """The whole frames at the front of `buf` (removed from it); PoolError for a length
    outside 4..MAX_FRAME."""
    out, at = [], 0
    while len(buf) - at >= 4:
        (length,) = struct.unpack_from("<I", buf, at)
        if not 4 <= length <= MAX_FRAME:
            raise PoolError(f"a frame of {length} bytes from the node (4 to {MAX_FRAME})")
        if len(buf) - at < 4 + length:
            break
        (kind,) = struct.unpack_from("<H", buf, at + 4)
        out.append((kind, bytes(buf[at + 8:at + 4 + length])))
        at += 4 + length
    del buf[:at]
    return out


_MAP_FAILED = ctypes.c_void_p(-1).value


@functools.lru_cache(maxsize=None)
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mmap.restype = ctypes.c_void_p
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.munmap.restype = ctypes.c_int
    return libc


class Mapping:
    """`size` bytes of a file descriptor mapped shared (libc mmap: unlike Python's mmap
    module it keeps no duplicate of the descriptor), unmapped when this object is garbage.
    Views of the memory hold it, so a mapping outlives its PoolClient while they exist."""

    def __init__(self, fd: int, size: int, writable: bool, what: str) -> None:
        have = os.fstat(fd).st_size
        if have < size:
            raise PoolError(f"{what} is {have} bytes, the hello says {size}")
        libc = _libc()
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        address = libc.mmap(None, size, prot, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            e = ctypes.get_errno()
            raise OSError(e, f"mmap of {what} ({size} bytes): {os.strerror(e)}")
        self.address, self.size = int(address), size
        weakref.finalize(self, libc.munmap, self.address, size)


class PoolClient:
    """A connection to the node's Unix socket `socket_path`, with the control block mapped
    read-write and every block mapped (host memory: read-only) or imported (CUDA memory).

    The connection is this consumer's liveness: the node gives back every reference of
    the row when it closes, so keep the client open while frames are held, and make a new
    one when `connected` turns False. Send nothing on it but what upgrade() and report()
    send (version 2, when the node speaks it). `pool_id`, when given, must be the hello's
    (a TensorRef's pool_id).
    """

    def __init__(self, socket_path: str, pool_id: str | None = None, timeout: float = HELLO_TIMEOUT_S) -> None:
        if sys.byteorder != "little":
            raise PoolError("the control block is little-endian; this host is not")
        self.socket_path = socket_path
        self._lock = threading.RLock()  # one writer per row; re-entrant for Frame.__del__
        self._closed = False
        self._gone = False
        self._ctrl: Mapping | None = None
        self._blocks: list[Mapping] = []
        self.device: Any = None  # cuda.DeviceBlocks for CUDA memory
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(socket_path)
            raw, fds = _read_hello(self._sock)
            try:
                self.hello = Hello.parse(raw)
                if pool_id is not None and self.hello.pool_id != pool_id:
                    raise PoolError(f"{socket_path} serves pool {self.hello.pool_id}, not {pool_id}")
                if len(fds) != 1 + self.hello.blocks:
                    raise PoolError(f"{len(fds)} file descriptors with the hello, expected 1 + {self.hello.blocks}")
                self._map_all(fds)
            finally:
                for fd in fds:
                    os.close(fd)
            self._sock.setblocking(False)
        except BaseException:
            self._closed = True
            self._sock.close()
            self._unmap()
            raise
        self._held = [0] * self.hello.blocks
        #: Version 2 (upgrade()): descriptors come on this socket from this generation on.
        self.signal = False
        self.from_generation = 0
        #: Descriptors the node did not send us (its queue for us was full): DROPPED notices.
        self.dropped = 0
        self._inbox = bytearray()
        self._records: list[bytes] = []
        self._records_since = 0.0
        self._outbox = b""
        self._send_lock = threading.Lock()

    def _map_all(self, fds: list[int]) -> None:
        h = self.hello
        self._ctrl = Mapping(fds[0], h.control_size, True, "the control block")
        self._base = self._ctrl.address
        magic = ctypes.string_at(self._base, len(CONTROL_MAGIC))
        if magic != CONTROL_MAGIC:
            raise PoolError(f"control block starts with {magic!r}, expected {CONTROL_MAGIC!r}")
        if h.memory == "host":
            self._blocks = [Mapping(fd, h.block_size, False, f"block {b}") for b, fd in enumerate(fds[1:])]
        else:
            from vision_preproc_consumer import cuda  # the CUDA driver only for CUDA pools

            self.device = cuda.DeviceBlocks(fds[1:], h.block_size, h.device_id)

    # --- references -----------------------------------------------------------------

    def acquire(self, block: int, generation: int) -> bool:
        """Take a reference on `block` if it still holds `generation` (a TensorRef's
        block_index and generation); False when the block was already reused (nothing is
        held then). Raises PoolError when the client is closed or disconnected."""
        with self._lock:
            self._usable(block)
            a = _atomics()
            hold = self._hold_address(block)
            a.fetch_add(hold, 1, _SEQ_CST)
            if a.load_8(self._record_address(block), _SEQ_CST) != generation:
                a.fetch_sub(hold, 1, _SEQ_CST)
                return False
            self._held[block] += 1
            return True

    def release(self, block: int) -> bool:
        """Give back one reference on `block`. False when there was nothing left to give
        back: the connection is closed or gone, and the node already took back every
        reference of this client (its row may belong to another consumer by now, so it is
        not written)."""
        with self._lock:
            if not 0 <= block < len(self._held) or self._held[block] == 0:
                raise ValueError(f"block {block} is not held by this client")
            self._held[block] -= 1
            if not self.connected:
                return False
            _atomics().fetch_sub(self._hold_address(block), 1, _SEQ_CST)
            return True

    def held(self, block: int) -> int:
        """References this client holds on `block`."""
        return self._held[block]

    def generation(self, block: int) -> int:
        """The generation in `block`'s record now (the read acquire() makes): a held frame
        whose TensorRef has another one was withdrawn by the node (its GPU work failed, or
        its device was replaced). Raises PoolError once the client is closed (the control
        block is unmapped then); unlike acquire() it makes no syscall."""
        with self._lock:
            if self._closed:
                raise PoolError(f"{self.socket_path}: closed; make a new PoolClient")
            if not 0 <= block < self.hello.blocks:
                raise PoolError(f"block {block} outside the pool's 0..{self.hello.blocks - 1}")
            return int(_atomics().load_8(self._record_address(block), _SEQ_CST))

    def _record_address(self, block: int) -> int:
        return self._base + self.hello.records_offset + block * self.hello.record_stride

    def _hold_address(self, block: int) -> int:
        return self._base + self.hello.holds_offset + self.hello.row * self.hello.row_stride + 4 * block

    def _usable(self, block: int) -> None:
        if not self.connected:
            raise PoolError(f"{self.socket_path}: {'closed' if self._closed else 'the node closed the connection'}; "
                            "make a new PoolClient")
        if not 0 <= block < self.hello.blocks:
            raise PoolError(f"block {block} outside the pool's 0..{self.hello.blocks - 1}")

    # --- memory ---------------------------------------------------------------------

    def block(self, block: int) -> Mapping:
        """A host block's mapping (read-only); a view of it must hold it."""
        return self._blocks[block]

    # --- version 2: the ready signal and the reports ---------------------------------

    def upgrade(self, name: str, timeout: float = UPGRADE_TIMEOUT_S) -> bool:
        """Ask the node for the ready signal (protocol version 2): True once it accepted
        (then `from_generation` is the first generation whose descriptor comes on this
        socket; read them with `messages()`), False when the node speaks version 1 only
        or did not answer within `timeout` (stay on the topic then)."""
        if SIGNAL_VERSION not in self.hello.versions or self.signal:
            return self.signal
        body = json.dumps({"version": SIGNAL_VERSION, "name": name[:64]}).encode()
        self._send(frame(UPGRADE, body))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for kind, body in self.messages(max(0.0, deadline - time.monotonic())):
                if kind == ACCEPT:
                    accept = json.loads(body.decode())
                    if "error" in accept:
                        return False
                    self.from_generation = int(accept["from_generation"])
                    self.signal = True
                    return True
        return False

    def messages(self, timeout: float) -> list[tuple[int, bytes]]:
        """The node's frames that arrived, waiting up to `timeout` s for the first: (kind,
        body) each; DROPPED notices are counted in `dropped` and returned too. [] on a
        timeout; PoolError once the node closed the connection."""
        if self._closed or self._gone:
            raise PoolError(f"{self.socket_path}: {'closed' if self._closed else 'the node closed the connection'}")
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready:
            return []
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self._gone = True
                break
            self._inbox += data
        out = cut_frames(self._inbox)
        for kind, body in out:
            if kind == DROPPED and len(body) >= 16:
                self.dropped += struct.unpack_from("<Q", body)[0]
        if not out and self._gone:
            raise PoolError(f"{self.socket_path}: the node closed the connection")
        return out

    def report(self, generation: int, stamp_ns: int, received_ns: int, acquired_ns: int, released_ns: int,
               block: int, flags: int) -> None:
        """One tensor as this consumer handled it (times: time.time_ns(), 0 for never);
        sent batched (REPORT_EVERY records, or REPORT_AFTER_S after the oldest). Nothing
        without the upgrade."""
        if not self.signal:
            return
        with self._send_lock:
            if not self._records:
                self._records_since = time.monotonic()
            self._records.append(RECORD.pack(generation, stamp_ns, received_ns, acquired_ns, released_ns,
                                             block, flags))
        self.flush_reports(force=False)

    def flush_reports(self, force: bool = True) -> None:
        """Send the records waiting (`force=False`: only when REPORT_EVERY of them wait or
        the oldest is REPORT_AFTER_S old); never blocks."""
        with self._send_lock:
            due = self._records and (force or len(self._records) >= REPORT_EVERY
                                     or time.monotonic() - self._records_since >= REPORT_AFTER_S)
            if due:
                records, self._records = self._records[:256], self._records[256:]
                self._outbox += frame(REPORT, struct.pack("<II", len(records), 0) + b"".join(records))
            self._flush_outbox()

    def _send(self, data: bytes) -> None:
        with self._send_lock:
            self._outbox += data
            self._flush_outbox()

    def _flush_outbox(self) -> None:
        if not self._outbox or self._closed or self._gone:
            return
        try:
            sent = self._sock.send(self._outbox)
        except BlockingIOError:
            return
        except OSError:
            self._gone = True
            return
        self._outbox = self._outbox[sent:]

    # --- connection -----------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """False once this client is closed or the node closed the connection (the node
        stopped, or disconnected this consumer: a block held past shared_lease_ms). The row
        is gone then: make a new PoolClient."""
        if self._closed or self._gone:
            return False
        try:
            data = self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            self._gone = True
            return False
        if not data:
            self._gone = True
            return False
        return True  # (version 1: the node sends nothing after the hello; version 2: frames)

    def close(self) -> None:
        """Close the connection (the node gives back this client's references) and unmap.
        A block that a NumPy array or a CUDA view still uses stays mapped until the last
        of them is gone."""
        with self._lock:
            if self._closed:
                return
            self.flush_reports()
            self._closed = True
            self._sock.close()
            self._unmap()

    def _unmap(self) -> None:
        # Each mapping is unmapped when nothing holds it: the control block now, a block
        # or the CUDA blocks once no view of theirs is left.
        self._ctrl = None
        self._blocks = []
        self.device = None  # (its blocks are unmapped once no CudaView is left: DeviceBlocks' finalizer)

    def __enter__(self) -> "PoolClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        h = getattr(self, "hello", None)
        state = "connected" if self.connected else "closed" if self._closed else "disconnected"
        return f"PoolClient({self.socket_path!r}, pool {h.pool_id if h else '?'}, row {h.row if h else '?'}, {state})"
