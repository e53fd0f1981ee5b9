"""A taken TensorRef: the tensor viewed in place, and the reference given back once."""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable

import numpy as np

from vision_preproc_consumer.pool import PoolClient, PoolError

#: TensorRef.memory_kind values (TensorRef.msg).
MEMORY_HOST = 0
MEMORY_CUDA = 1

#: How long Frame.wait_ready() waits for the node's GPU work on a block by default (it
#: usually takes 0.1-0.3 ms). The block is held meanwhile: the wait counts against the
#: node's shared_lease_ms (2 s by default).
EVENT_TIMEOUT_S = 1.0
#: How often that wait checks that the node is still connected (a syscall; the block's
#: generation, a load from the control block, is checked between every two queries).
CONNECTION_CHECK_S = 0.01

#: The NumPy type of each `dtype` name (little-endian, as the node writes it).
NAMED_DTYPES = {"float32": "<f4", "float16": "<f2"}
#: DLPack type codes (TensorRef.dtype_code) -> NumPy kind.
DLPACK_KINDS = {0: "i", 1: "u", 2: "f"}


def numpy_dtype(msg: Any) -> np.dtype:
    """The element type of a TensorRef: from `dtype` ("float32", "float16"), else from
    DLPack's `dtype_code` and `dtype_bits`; checked against `dtype_bits` and `dtype_lanes`."""
    if msg.dtype in NAMED_DTYPES:
        dt = np.dtype(NAMED_DTYPES[msg.dtype])
    else:
        kind, bits = DLPACK_KINDS.get(msg.dtype_code), int(msg.dtype_bits)
        if kind is None or bits not in (8, 16, 32, 64) or (kind == "f" and bits == 8):
            raise ValueError(f"TensorRef dtype {msg.dtype!r} (DLPack code {msg.dtype_code}, {bits} bits) "
                             "has no NumPy type")
        dt = np.dtype(f"<{kind}{bits // 8}")
    if msg.dtype_bits not in (0, dt.itemsize * 8):
        raise ValueError(f"TensorRef dtype {msg.dtype!r} but dtype_bits {msg.dtype_bits}")
    if msg.dtype_lanes not in (0, 1):
        raise ValueError(f"TensorRef dtype_lanes {msg.dtype_lanes}: vector types are not supported")
    return dt


def layout(msg: Any, block_size: int) -> tuple[np.dtype, tuple[int, ...], tuple[int, ...] | None]:
    """(dtype, shape, strides in bytes or None for dense C order) of a TensorRef, checked
    to lie inside its block: byte_offset + byte_size <= block_size, and every element the
    shape and strides reach inside [byte_offset, byte_offset + byte_size)."""
    dt = numpy_dtype(msg)
    shape = tuple(int(d) for d in msg.shape)
    strides = tuple(int(s) * dt.itemsize for s in msg.strides) or None
    if strides is not None and len(strides) != len(shape):
        raise ValueError(f"TensorRef has {len(strides)} strides for {len(shape)} dimensions")
    if strides is not None and min(strides, default=0) < 0:
        raise ValueError(f"TensorRef strides {list(msg.strides)}: negative strides are not supported")
    offset, size = int(msg.byte_offset), int(msg.byte_size)
    if offset + size > block_size:
        raise ValueError(f"TensorRef bytes [{offset}, {offset + size}) end past the block ({block_size} bytes)")
    if math.prod(shape) == 0:
        return dt, shape, strides
    if strides is None:
        extent = math.prod(shape) * dt.itemsize
    else:
        extent = sum((d - 1) * s for d, s in zip(shape, strides)) + dt.itemsize
    if extent > size:
        raise ValueError(f"TensorRef shape {shape} x {dt} reaches {extent} bytes, byte_size is {size}")
    return dt, shape, strides


#: Makes giving a reference back a one-time event across threads (re-entrant: a garbage
#: collection may release another frame while it is held).
_RELEASING = threading.RLock()


class _Reference:
    """One reference on a block, given back once: by Frame.release(), or when neither the
    Frame nor any view made from it is left (garbage collection)."""

    __slots__ = ("client", "block", "released")

    def __init__(self, client: PoolClient, block: int) -> None:
        self.client, self.block, self.released = client, block, False

    def release(self) -> None:
        with _RELEASING:
            if self.released:
                return
            self.released = True
        self.client.release(self.block)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 (interpreter shutdown, closed client)
            pass


class _HostView:
    """What np.asarray() turns into the frame's array; as the array's base it keeps the
    reference and the mapping alive while the array (or a view of it) is."""

    def __init__(self, ref: _Reference, keepalive: object, address: int, shape: tuple[int, ...], typestr: str,
                 strides: tuple[int, ...] | None) -> None:
        self._ref, self._keepalive = ref, keepalive
        self.__array_interface__ = {"shape": shape, "typestr": typestr, "data": (address, True),
                                    "strides": strides, "version": 3}


class Frame:
    """A TensorRef whose block this consumer holds a reference on.

    `msg` is the TensorRef; `array()` the tensor in place (no copy): a read-only NumPy
    array for host memory, an object with `__cuda_array_interface__` (v3) for CUDA memory
    (`torch.as_tensor(frame.array(), device="cuda")`, `cupy.asarray(...)`). CUDA memory:
    the node may publish before its GPU work on the block is done; `wait_ready()` waits
    for it (array() calls it). Give the block back with `release()` or `with frame:` as
    soon as the work on it is done; the node reuses it for a later tensor then, so nothing
    made by `array()` may be read after. A Frame dropped unreleased is released once it
    and every view of it are garbage.
    """

    def __init__(self, client: PoolClient, msg: Any) -> None:
        """`msg`: a TensorRef on which `client.acquire(msg.block_index, msg.generation)`
        returned True; the Frame owns that reference."""
        self.msg = msg
        self._client = client
        self._ref = _Reference(client, int(msg.block_index))
        self._view: Any = None
        self._ready = False
        self._not_ready = ""  # why the last wait_ready() said no
        #: (received_ns, acquired_ns, flags) for the node's report, set by the
        #: subscription on a version 2 connection; reported by release().
        self.report: tuple[int, int, int] | None = None
        #: When this consumer had its descriptor (time.time_ns()), and when the node sent
        #: it on the socket (0: it came on the topic).
        self.received_ns = 0
        self.sent_ns = 0

    @property
    def released(self) -> bool:
        return self._ref.released

    def wait_ready(self, timeout_s: float = EVENT_TIMEOUT_S) -> bool:
        """Whether the tensor may be read: True at once for host memory or a TensorRef
        without `ipc_event_handle`; else True once the node's IPC event completed (polled
        from the host: see array() for why never on the GPU). False when the node withdrew
        the set (a new generation in the block's record: its GPU work failed, or its device
        was replaced), the node closed the connection, or `timeout_s` passed: release the
        frame and skip it. A True result is kept (the wait is done once). Raises after
        release(), for a TensorRef of another GPU, and on a driver error."""
        self._check_held()
        if self._ready:
            return True
        m = self.msg
        handle = bytes(m.ipc_event_handle)
        if m.memory_kind != MEMORY_CUDA or not handle:
            self._ready = True
            return True
        device = self._device()
        device.check_device(m)
        self._ready = device.wait_event(handle, self._still_valid(), timeout_s)
        if not self._ready:
            self._not_ready = self._why_not_ready(timeout_s)
        return self._ready

    def _still_valid(self) -> Callable[[], bool]:
        """For DeviceBlocks.wait_event: the block still holds the message's generation and
        the node is still connected (checked every CONNECTION_CHECK_S)."""
        client, block, generation = self._client, self._ref.block, int(self.msg.generation)
        next_check = 0.0

        def still_valid() -> bool:
            nonlocal next_check
            now = time.monotonic()
            if now >= next_check:
                if not client.connected:
                    return False
                next_check = now + CONNECTION_CHECK_S
            try:
                return client.generation(block) == generation
            except PoolError:  # (closed meanwhile: the node took the reference back)
                return False

        return still_valid

    def _why_not_ready(self, timeout_s: float) -> str:
        if not self._client.connected:
            return "the connection to the node is closed (the node took this client's references back)"
        if self._client.generation(self._ref.block) != int(self.msg.generation):
            return "withdrawn by the node (its GPU work on the block failed, or its device was replaced)"
        return f"the node's GPU work on it did not end within {timeout_s} s (timed out)"

    def array(self, stream: Any = None) -> Any:
        """The tensor, in place: NumPy for host memory, a `__cuda_array_interface__` object
        for CUDA memory. CUDA: first waits for the node's GPU work (wait_ready(), unless it
        already said True), raising RuntimeError naming why when it says no (withdrawn by
        the node, disconnected, timed out). `stream` is accepted for compatibility and
        ignored: it used to be made to wait for the node's event on the GPU
        (cuStreamWaitEvent), but an IPC event whose producer's context faulted or whose
        producer died stays not ready forever (measured on an H200, driver 580), and the
        stream would never run again. Raises after release()."""
        self._check_held()
        if self._view is None:
            if not self.wait_ready():
                raise RuntimeError(f"frame of block {self._ref.block}, generation {self.msg.generation}: "
                                   f"{self._not_ready}; release it and skip the frame")
            m = self.msg
            dt, shape, strides = layout(m, self._client.hello.block_size)
            if m.memory_kind == MEMORY_HOST:
                if self._client.hello.memory != "host":
                    raise ValueError("TensorRef says host memory, the pool's hello says CUDA memory")
                block = self._client.block(self._ref.block)
                self._view = np.asarray(_HostView(self._ref, block, block.address + int(m.byte_offset), shape,
                                                  dt.str, strides))
            elif m.memory_kind == MEMORY_CUDA:
                self._view = self._device().view(self._ref, m, shape, dt.str, strides)
            else:
                raise ValueError(f"TensorRef memory_kind {m.memory_kind} is neither host (0) nor CUDA (1)")
        return self._view

    def _check_held(self) -> None:
        if self._ref.released:
            raise RuntimeError(f"frame of block {self._ref.block} was released: the node may have reused the block")

    def _device(self) -> Any:
        """The pool's cuda.DeviceBlocks, for a TensorRef of CUDA memory."""
        if self._client.device is None:
            raise ValueError("TensorRef says CUDA memory, the pool's hello says host memory")
        return self._client.device

    def release(self, stream: Any = None) -> None:
        """Give the block back (again: nothing). CUDA memory: first waits for the work
        that reads it: `stream` (an int handle, or an object with `.cuda_stream`, e.g. a
        torch.cuda.Stream), or, without it, everything in the context (cuCtxSynchronize)."""
        if self._ref.released:
            return
        if self._view is not None and self.msg.memory_kind == MEMORY_CUDA and self._client.device is not None:
            self._client.device.synchronize(stream)
        self._view = None
        self._ref.release()
        if self.report is not None:
            received_ns, acquired_ns, flags = self.report
            self.report = None
            stamp = self.msg.header.stamp
            self._client.report(int(self.msg.generation), stamp.sec * 1_000_000_000 + stamp.nanosec, received_ns,
                                acquired_ns, time.time_ns(), int(self.msg.block_index), flags)

    def __enter__(self) -> "Frame":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        m = self.msg
        return (f"Frame({m.name!r} {m.dtype}{list(m.shape)}, pool {m.pool_id} block {m.block_index} "
                f"generation {m.generation}{', released' if self.released else ''})")
