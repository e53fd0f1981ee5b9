"""A pool's CUDA blocks in this process: each block's file descriptor imported with the
CUDA driver API (cuda-python's `cuda.bindings.driver`, imported here only, for a pool
whose hello says "cuda"), mapped once, and the tensors handed out as
`__cuda_array_interface__` (v3) objects, which PyTorch, CuPy and Numba take without a copy."""

from __future__ import annotations

import threading
import weakref
from typing import Any

_DRIVER: Any = None
#: Opened IPC events kept per pool (the node has a few, reused); more are closed.
MAX_EVENTS = 64


def driver() -> Any:
    """cuda.bindings.driver, imported on first use."""
    global _DRIVER
    if _DRIVER is None:
        try:
            from cuda.bindings import driver as d
        except ImportError as e:
            raise ImportError("the pool's blocks are CUDA memory: mapping them needs cuda-python "
                              "(`pip install cuda-python`, module cuda.bindings.driver)") from e
        _DRIVER = d
    return _DRIVER


def call(name: str, *args: Any) -> Any:
    """driver.<name>(*args), raising on an error result; returns the result's value(s)."""
    d = driver()
    out = getattr(d, name)(*args)
    err = out[0]
    if err != d.CUresult.CUDA_SUCCESS:
        _, text = d.cuGetErrorString(err)
        raise RuntimeError(f"{name} failed: {getattr(err, 'name', err)}: {text.decode() if text else '?'}")
    return out[1] if len(out) == 2 else out[1:] or None


def stream_handle(stream: Any) -> Any:
    """A CUstream from an int handle, an object with `.cuda_stream` (torch) or a CUstream."""
    handle = getattr(stream, "cuda_stream", stream)
    return driver().CUstream(handle) if isinstance(handle, int) else handle


class CudaView:
    """A tensor in a mapped CUDA block, described by `__cuda_array_interface__` v3. It
    keeps the frame's reference and the pool's mapping alive while it is referenced
    (PyTorch and CuPy keep it for the life of the tensor made from it)."""

    def __init__(self, owners: tuple, pointer: int, shape: tuple[int, ...], typestr: str,
                 strides: tuple[int, ...] | None) -> None:
        self._owners = owners
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (pointer, False),
                                         "version": 3, "strides": strides, "stream": None}


def _release_all(device: Any, context: Any, mappings: list[tuple[int, int]], events: dict) -> None:
    """Unmap every block, close the events, release the primary context (best effort: it
    also runs at interpreter exit)."""
    try:
        call("cuCtxSetCurrent", context)
        for ev in events.values():
            call("cuEventDestroy", ev)
        events.clear()
        for ptr, size in mappings:
            call("cuMemUnmap", ptr, size)
            call("cuMemAddressFree", ptr, size)
        mappings.clear()
        call("cuDevicePrimaryCtxRelease", device)
    except Exception:  # noqa: BLE001
        pass


class DeviceBlocks:
    """Every block of a CUDA pool imported (cuMemImportFromShareableHandle, POSIX fd),
    mapped at an address of this process (cuMemAddressReserve + cuMemMap) and made
    read-write for device `device_id` (cuMemSetAccess), in that device's primary context
    (the one PyTorch and CuPy use). The descriptors may be closed afterwards."""

    def __init__(self, fds: list[int], block_size: int, device_id: int) -> None:
        d = driver()
        call("cuInit", 0)
        self.device_id = device_id
        self.device = call("cuDeviceGet", device_id)
        self.context = call("cuDevicePrimaryCtxRetain", self.device)
        self._mappings: list[tuple[int, int]] = []
        self._events: dict[bytes, Any] = {}
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _release_all, self.device, self.context, self._mappings,
                                           self._events)
        try:
            self.make_current()
            for fd in fds:
                self._mappings.append(self._map(d, fd, block_size))
        except BaseException:
            self._finalizer()
            raise
        self.pointers = [ptr for ptr, _ in self._mappings]
        raw = call("cuDeviceGetUuid", self.device).bytes
        self.uuid = raw if isinstance(raw, bytes) else bytes(b & 0xFF for b in raw)

    def _map(self, d: Any, fd: int, block_size: int) -> tuple[int, int]:
        handle = call("cuMemImportFromShareableHandle", fd,
                      d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        try:
            prop = call("cuMemGetAllocationPropertiesFromHandle", handle)
            gran = int(call("cuMemGetAllocationGranularity", prop,
                            d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
            size = -(-block_size // gran) * gran
            ptr = int(call("cuMemAddressReserve", size, 0, 0, 0))
            try:
                call("cuMemMap", ptr, size, 0, handle, 0)
                access = d.CUmemAccessDesc()
                access.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
                access.location.id = self.device_id
                access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                try:
                    call("cuMemSetAccess", ptr, size, [access], 1)
                except BaseException:
                    call("cuMemUnmap", ptr, size)
                    raise
            except BaseException:
                call("cuMemAddressFree", ptr, size)
                raise
        finally:
            call("cuMemRelease", handle)  # the mapping keeps the memory
        return ptr, size

    def make_current(self) -> None:
        """Make the device's primary context this thread's current one."""
        call("cuCtxSetCurrent", self.context)

    def view(self, ref: Any, msg: Any, shape: tuple[int, ...], typestr: str, strides: tuple[int, ...] | None,
             stream: Any = None) -> CudaView:
        """The TensorRef's tensor as a CudaView, after the node's IPC event if it sent one
        (`stream` waits for it on the GPU; without `stream` this call waits)."""
        if int(msg.device_id) != self.device_id:
            raise ValueError(f"TensorRef device {msg.device_id}, the pool's hello says device {self.device_id}")
        uuid = bytes(msg.device_uuid)
        if any(uuid) and uuid != self.uuid:
            raise ValueError(f"TensorRef device {msg.device_id} has UUID {uuid.hex()}, this process's device "
                             f"{self.device_id} is {self.uuid.hex()}: the node and this process number the GPUs "
                             "differently (CUDA_VISIBLE_DEVICES?)")
        self.make_current()
        handle = bytes(msg.ipc_event_handle)
        if handle:
            event = self._event(handle)
            if stream is None:
                call("cuEventSynchronize", event)
            else:
                call("cuStreamWaitEvent", stream_handle(stream), event, 0)
        pointer = self.pointers[int(msg.block_index)] + int(msg.byte_offset)
        return CudaView((ref, self), pointer, shape, typestr, strides)

    def _event(self, handle: bytes) -> Any:
        d = driver()
        with self._lock:
            if handle not in self._events:
                if len(self._events) >= MAX_EVENTS:
                    for ev in self._events.values():
                        call("cuEventDestroy", ev)
                    self._events.clear()
                h = d.CUipcEventHandle()
                h.reserved = handle
                self._events[handle] = call("cuIpcOpenEventHandle", h)
            return self._events[handle]

    def synchronize(self, stream: Any = None) -> None:
        """Wait for `stream` (an int handle or an object with `.cuda_stream`), or without
        it for all work of the context."""
        self.make_current()
        if stream is None:
            call("cuCtxSynchronize")
        else:
            call("cuStreamSynchronize", stream_handle(stream))

