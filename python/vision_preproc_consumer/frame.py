"""A taken TensorRef: the tensor viewed in place, and the reference given back once."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from vision_preproc_consumer.pool import PoolClient

#: TensorRef.memory_kind values (TensorRef.msg).
MEMORY_HOST = 0
MEMORY_CUDA = 1

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
    (`torch.as_tensor(frame.array(), device="cuda")`, `cupy.asarray(...)`). Give the block
    back with `release()` or `with frame:` as soon as the work on it is done; the node
    reuses it for a later tensor then, so nothing made by `array()` may be read after.
    A Frame dropped unreleased is released once it and every view of it are garbage.
    """

    def __init__(self, client: PoolClient, msg: Any) -> None:
        """`msg`: a TensorRef on which `client.acquire(msg.block_index, msg.generation)`
        returned True; the Frame owns that reference."""
        self.msg = msg
        self._client = client
        self._ref = _Reference(client, int(msg.block_index))
        self._view: Any = None

    @property
    def released(self) -> bool:
        return self._ref.released

    def array(self, stream: Any = None) -> Any:
        """The tensor, in place: NumPy for host memory, a `__cuda_array_interface__` object
        for CUDA memory. CUDA: when the node left work in flight (an IPC event with the
        message), `stream` (an int handle, or an object with `.cuda_stream`) is made to
        wait for it, or, without `stream`, this call waits. Raises after release()."""
        if self._ref.released:
            raise RuntimeError(f"frame of block {self._ref.block} was released: the node may have reused the block")
        if self._view is None:
            m = self.msg
            dt, shape, strides = layout(m, self._client.hello.block_size)
            if m.memory_kind == MEMORY_HOST:
                if self._client.hello.memory != "host":
                    raise ValueError("TensorRef says host memory, the pool's hello says CUDA memory")
                block = self._client.block(self._ref.block)
                self._view = np.asarray(_HostView(self._ref, block, block.address + int(m.byte_offset), shape,
                                                  dt.str, strides))
            elif m.memory_kind == MEMORY_CUDA:
                if self._client.device is None:
                    raise ValueError("TensorRef says CUDA memory, the pool's hello says host memory")
                self._view = self._client.device.view(self._ref, m, shape, dt.str, strides, stream)
            else:
                raise ValueError(f"TensorRef memory_kind {m.memory_kind} is neither host (0) nor CUDA (1)")
        return self._view

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

    def __enter__(self) -> "Frame":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        m = self.msg
        return (f"Frame({m.name!r} {m.dtype}{list(m.shape)}, pool {m.pool_id} block {m.block_index} "
                f"generation {m.generation}{', released' if self.released else ''})")
