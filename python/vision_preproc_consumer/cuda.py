"""A pool's CUDA blocks in this process: each block's file descriptor imported with the
CUDA driver API (imported here only, for a pool whose hello says "cuda"), mapped once,
and the tensors handed out as `__cuda_array_interface__` (v3) objects, which PyTorch,
CuPy and Numba take without a copy.

Two bindings of the driver API behind one small interface (`Driver`): cuda-python's
`cuda.bindings.driver` (`CudaPythonDriver`), and ctypes on the driver's own libcuda.so.1
(`CtypesDriver`: nothing to install). `VISION_PREPROC_CUDA_BINDING` chooses: `cuda-python`,
`ctypes`, or unset / `auto` (cuda-python when it can be imported, else ctypes)."""

from __future__ import annotations

import ctypes
import os
import threading
import time
import weakref
from typing import Any, Callable, Protocol

#: Opened IPC events kept per pool (the node has a few, reused); more are closed.
MAX_EVENTS = 64
#: DeviceBlocks.wait_event queries the node's event back to back for this long (a usual
#: wait is 0.1-0.3 ms: a sleep would add its own latency), then sleeps EVENT_POLL_S between
#: queries (Linux's timer slack makes that ~0.1 ms).
EVENT_SPIN_S = 200e-6
EVENT_POLL_S = 50e-6
#: The environment variable that chooses the binding, and its values.
BINDING_ENV = "VISION_PREPROC_CUDA_BINDING"
CUDA_PYTHON = "cuda-python"
CTYPES = "ctypes"
#: The driver library the ctypes binding loads (the NVIDIA driver installs it).
LIBCUDA = "libcuda.so.1"

# The driver API's constants (cuda.h, CUDA 12; the same values in cudarc's bindgen output,
# cudarc/src/driver/sys/mod.rs, which the node uses).
CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
CU_IPC_HANDLE_SIZE = 64


def choose(requested: str | None, cuda_python_importable: bool) -> str:
    """The binding to use: `requested` (VISION_PREPROC_CUDA_BINDING; None, "" or "auto":
    cuda-python when importable, else ctypes). Raises naming the valid values."""
    value = (requested or "auto").strip().lower()
    if value == "auto":
        return CUDA_PYTHON if cuda_python_importable else CTYPES
    if value in (CUDA_PYTHON, CTYPES):
        return value
    raise ValueError(f"{BINDING_ENV}={requested!r}: use {CUDA_PYTHON!r}, {CTYPES!r} or 'auto' (the default: "
                     f"{CUDA_PYTHON} when it can be imported, else {CTYPES})")


def _cuda_python_importable() -> bool:
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        return False
    return True


_DRIVER: Any = None
_DRIVER_LOCK = threading.Lock()


def driver() -> "Driver":
    """The binding this process uses (chosen and loaded on first use)."""
    global _DRIVER
    with _DRIVER_LOCK:
        if _DRIVER is None:
            requested = os.environ.get(BINDING_ENV)
            importable = _cuda_python_importable() if (requested or "auto").strip().lower() != CTYPES else False
            _DRIVER = CudaPythonDriver() if choose(requested, importable) == CUDA_PYTHON else CtypesDriver()
        return _DRIVER


def stream_int(stream: Any) -> int:
    """The CUstream handle, as an int, of an int, an object with `.cuda_stream` (torch) or
    a cuda-python CUstream."""
    handle = getattr(stream, "cuda_stream", stream)
    return handle if isinstance(handle, int) else int(handle)


class Driver(Protocol):
    """The driver calls this module makes, one binding each (`CudaPythonDriver`,
    `CtypesDriver`); each raises RuntimeError naming the call and the driver's error
    (event_query returns False for CUDA_ERROR_NOT_READY: the event's work is not done).
    Handles (device, context, allocation, event) are the binding's own objects; addresses,
    sizes and streams are ints."""

    name: str

    def init(self) -> None: ...
    def device(self, ordinal: int) -> Any: ...
    def device_uuid(self, device: Any) -> bytes: ...
    def primary_context_retain(self, device: Any) -> Any: ...
    def primary_context_release(self, device: Any) -> None: ...
    def set_current(self, context: Any) -> None: ...
    def import_fd(self, fd: int) -> Any: ...
    def granularity(self, handle: Any) -> int: ...
    def reserve(self, size: int) -> int: ...
    def map(self, ptr: int, size: int, handle: Any) -> None: ...
    def set_access(self, ptr: int, size: int, device_id: int) -> None: ...
    def unmap(self, ptr: int, size: int) -> None: ...
    def free(self, ptr: int, size: int) -> None: ...
    def release(self, handle: Any) -> None: ...
    def open_event(self, handle: bytes) -> Any: ...
    def event_query(self, event: Any) -> bool: ...
    def event_destroy(self, event: Any) -> None: ...
    def context_synchronize(self) -> None: ...
    def stream_synchronize(self, stream: int) -> None: ...


class CudaPythonDriver:
    """The driver API through cuda-python (`cuda.bindings.driver`)."""

    name = CUDA_PYTHON

    def __init__(self) -> None:
        try:
            from cuda.bindings import driver as d
        except ImportError as e:
            raise ImportError(f"the pool's blocks are CUDA memory and {BINDING_ENV} asks for cuda-python, which "
                              "cannot be imported: `pip install cuda-python` (module cuda.bindings.driver), or "
                              f"set {BINDING_ENV}=ctypes (the driver's libcuda.so.1, nothing to install)") from e
        self.d = d

    def _call(self, name: str, *args: Any) -> Any:
        """driver.<name>(*args), raising on an error result; returns the result's value(s)."""
        out = getattr(self.d, name)(*args)
        if out[0] != self.d.CUresult.CUDA_SUCCESS:
            raise self._error(name, out[0])
        return out[1] if len(out) == 2 else out[1:] or None

    def _error(self, name: str, err: Any) -> RuntimeError:
        _, text = self.d.cuGetErrorString(err)
        return RuntimeError(f"{name} failed: {getattr(err, 'name', err)}: {text.decode() if text else '?'}")

    def init(self) -> None:
        self._call("cuInit", 0)

    def device(self, ordinal: int) -> Any:
        return self._call("cuDeviceGet", ordinal)

    def device_uuid(self, device: Any) -> bytes:
        raw = self._call("cuDeviceGetUuid", device).bytes
        return raw if isinstance(raw, bytes) else bytes(b & 0xFF for b in raw)

    def primary_context_retain(self, device: Any) -> Any:
        return self._call("cuDevicePrimaryCtxRetain", device)

    def primary_context_release(self, device: Any) -> None:
        self._call("cuDevicePrimaryCtxRelease", device)

    def set_current(self, context: Any) -> None:
        self._call("cuCtxSetCurrent", context)

    def import_fd(self, fd: int) -> Any:
        return self._call("cuMemImportFromShareableHandle", fd,
                          self.d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)

    def granularity(self, handle: Any) -> int:
        d = self.d
        prop = self._call("cuMemGetAllocationPropertiesFromHandle", handle)
        return int(self._call("cuMemGetAllocationGranularity", prop,
                              d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))

    def reserve(self, size: int) -> int:
        return int(self._call("cuMemAddressReserve", size, 0, 0, 0))

    def map(self, ptr: int, size: int, handle: Any) -> None:
        self._call("cuMemMap", ptr, size, 0, handle, 0)

    def set_access(self, ptr: int, size: int, device_id: int) -> None:
        d = self.d
        access = d.CUmemAccessDesc()
        access.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device_id
        access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._call("cuMemSetAccess", ptr, size, [access], 1)

    def unmap(self, ptr: int, size: int) -> None:
        self._call("cuMemUnmap", ptr, size)

    def free(self, ptr: int, size: int) -> None:
        self._call("cuMemAddressFree", ptr, size)

    def release(self, handle: Any) -> None:
        self._call("cuMemRelease", handle)

    def open_event(self, handle: bytes) -> Any:
        h = self.d.CUipcEventHandle()
        h.reserved = handle
        return self._call("cuIpcOpenEventHandle", h)

    def event_query(self, event: Any) -> bool:
        err = self.d.cuEventQuery(event)[0]
        if err == self.d.CUresult.CUDA_ERROR_NOT_READY:
            return False
        if err != self.d.CUresult.CUDA_SUCCESS:
            raise self._error("cuEventQuery", err)
        return True

    def event_destroy(self, event: Any) -> None:
        self._call("cuEventDestroy", event)

    def context_synchronize(self) -> None:
        self._call("cuCtxSynchronize")

    def stream_synchronize(self, stream: int) -> None:
        self._call("cuStreamSynchronize", self.d.CUstream(stream))


# The driver API's types for ctypes (cuda.h; layouts as in cudarc's bindgen output).
_CUresult = ctypes.c_int
_CUdevice = ctypes.c_int
_CUcontext = ctypes.c_void_p
_CUevent = ctypes.c_void_p
_CUstream = ctypes.c_void_p
_CUdeviceptr = ctypes.c_ulonglong
_CUmemGenericAllocationHandle = ctypes.c_ulonglong


class CUuuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_char * 16)]


class CUmemLocation(ctypes.Structure):
    """CUmemLocation: {type, id} (CUDA 13.2 makes `id` a union of the same 4 bytes)."""

    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class CUmemAllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class CUmemAllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", CUmemLocation),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", CUmemAllocFlags)]


class CUmemAccessDesc(ctypes.Structure):
    _fields_ = [("location", CUmemLocation), ("flags", ctypes.c_int)]


class CUipcEventHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * CU_IPC_HANDLE_SIZE)]


_P = ctypes.POINTER
#: Each driver function the ctypes binding calls: its argument types (all return CUresult).
#: Versioned names where cuda.h maps the plain name to a newer symbol (cuEventDestroy ->
#: _v2, cuDevicePrimaryCtxRelease -> _v2); cuDeviceGetUuid is the plain symbol, as the
#: node's (cudarc's) call, so that both report the same UUID.
PROTOTYPES: dict[str, list[Any]] = {
    "cuInit": [ctypes.c_uint],
    "cuDeviceGet": [_P(_CUdevice), ctypes.c_int],
    "cuDeviceGetUuid": [_P(CUuuid), _CUdevice],
    "cuDevicePrimaryCtxRetain": [_P(_CUcontext), _CUdevice],
    "cuDevicePrimaryCtxRelease_v2": [_CUdevice],
    "cuCtxSetCurrent": [_CUcontext],
    "cuCtxSynchronize": [],
    "cuMemImportFromShareableHandle": [_P(_CUmemGenericAllocationHandle), ctypes.c_void_p, ctypes.c_int],
    "cuMemGetAllocationPropertiesFromHandle": [_P(CUmemAllocationProp), _CUmemGenericAllocationHandle],
    "cuMemGetAllocationGranularity": [_P(ctypes.c_size_t), _P(CUmemAllocationProp), ctypes.c_int],
    "cuMemAddressReserve": [_P(_CUdeviceptr), ctypes.c_size_t, ctypes.c_size_t, _CUdeviceptr, ctypes.c_ulonglong],
    "cuMemMap": [_CUdeviceptr, ctypes.c_size_t, ctypes.c_size_t, _CUmemGenericAllocationHandle, ctypes.c_ulonglong],
    "cuMemSetAccess": [_CUdeviceptr, ctypes.c_size_t, _P(CUmemAccessDesc), ctypes.c_size_t],
    "cuMemUnmap": [_CUdeviceptr, ctypes.c_size_t],
    "cuMemAddressFree": [_CUdeviceptr, ctypes.c_size_t],
    "cuMemRelease": [_CUmemGenericAllocationHandle],
    "cuIpcOpenEventHandle": [_P(_CUevent), CUipcEventHandle],
    "cuEventQuery": [_CUevent],
    "cuEventDestroy_v2": [_CUevent],
    "cuStreamSynchronize": [_CUstream],
    "cuGetErrorName": [_CUresult, _P(ctypes.c_char_p)],
    "cuGetErrorString": [_CUresult, _P(ctypes.c_char_p)],
}


class CtypesDriver:
    """The driver API through ctypes on the NVIDIA driver's `library` (libcuda.so.1)."""

    name = CTYPES

    def __init__(self, library: str = LIBCUDA) -> None:
        try:
            lib = ctypes.CDLL(library)
        except OSError as e:
            raise ImportError(f"the pool's blocks are CUDA memory: mapping them needs the NVIDIA driver's {library}, "
                              f"which could not be loaded ({e}): run this consumer on the node's machine (with "
                              "its driver; a container needs the GPU and the driver library passed in), or the "
                              "node with `backend: cpu` (host blocks)") from e
        self.library = library
        self.fns: dict[str, Any] = {}
        for name, argtypes in PROTOTYPES.items():
            try:
                f = getattr(lib, name)
            except AttributeError as e:
                raise ImportError(f"{library} has no {name}: the pool's CUDA blocks need a driver with CUDA 10.2's "
                                  "virtual memory management (update the NVIDIA driver)") from e
            f.argtypes, f.restype = argtypes, _CUresult
            self.fns[name] = f

    def _error(self, name: str, err: int) -> RuntimeError:
        text, code = ctypes.c_char_p(), ctypes.c_char_p()
        self.fns["cuGetErrorName"](err, ctypes.byref(code))
        self.fns["cuGetErrorString"](err, ctypes.byref(text))
        return RuntimeError(f"{name} failed: {code.value.decode() if code.value else err}: "
                            f"{text.value.decode() if text.value else '?'}")

    def _call(self, name: str, *args: Any) -> None:
        err = self.fns[name](*args)
        if err != CUDA_SUCCESS:
            raise self._error(name, err)

    def init(self) -> None:
        self._call("cuInit", 0)

    def device(self, ordinal: int) -> int:
        dev = _CUdevice()
        self._call("cuDeviceGet", ctypes.byref(dev), ordinal)
        return dev.value

    def device_uuid(self, device: int) -> bytes:
        uuid = CUuuid()
        self._call("cuDeviceGetUuid", ctypes.byref(uuid), device)
        return bytes(uuid)  # (the raw 16 bytes: .bytes would stop at a zero byte)

    def primary_context_retain(self, device: int) -> Any:
        ctx = _CUcontext()
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), device)
        return ctx

    def primary_context_release(self, device: int) -> None:
        self._call("cuDevicePrimaryCtxRelease_v2", device)

    def set_current(self, context: Any) -> None:
        self._call("cuCtxSetCurrent", context)

    def import_fd(self, fd: int) -> int:
        handle = _CUmemGenericAllocationHandle()
        # For POSIX fd handles the OS handle is the fd itself, in the pointer's place.
        self._call("cuMemImportFromShareableHandle", ctypes.byref(handle), ctypes.c_void_p(fd),
                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return handle.value

    def granularity(self, handle: int) -> int:
        prop = CUmemAllocationProp()
        self._call("cuMemGetAllocationPropertiesFromHandle", ctypes.byref(prop), handle)
        gran = ctypes.c_size_t()
        self._call("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(prop),
                   CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        return gran.value

    def reserve(self, size: int) -> int:
        ptr = _CUdeviceptr()
        self._call("cuMemAddressReserve", ctypes.byref(ptr), size, 0, 0, 0)
        return ptr.value

    def map(self, ptr: int, size: int, handle: int) -> None:
        self._call("cuMemMap", ptr, size, 0, handle, 0)

    def set_access(self, ptr: int, size: int, device_id: int) -> None:
        access = CUmemAccessDesc(CUmemLocation(CU_MEM_LOCATION_TYPE_DEVICE, device_id),
                                 CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        self._call("cuMemSetAccess", ptr, size, ctypes.byref(access), 1)

    def unmap(self, ptr: int, size: int) -> None:
        self._call("cuMemUnmap", ptr, size)

    def free(self, ptr: int, size: int) -> None:
        self._call("cuMemAddressFree", ptr, size)

    def release(self, handle: int) -> None:
        self._call("cuMemRelease", handle)

    def open_event(self, handle: bytes) -> Any:
        if len(handle) != CU_IPC_HANDLE_SIZE:
            raise ValueError(f"an IPC event handle has {CU_IPC_HANDLE_SIZE} bytes, not {len(handle)}")
        event = _CUevent()
        # (from_buffer_copy: a c_char array set from bytes would stop at the first zero byte)
        self._call("cuIpcOpenEventHandle", ctypes.byref(event), CUipcEventHandle.from_buffer_copy(handle))
        return event

    def event_query(self, event: Any) -> bool:
        err = self.fns["cuEventQuery"](event)
        if err == CUDA_ERROR_NOT_READY:
            return False
        if err != CUDA_SUCCESS:
            raise self._error("cuEventQuery", err)
        return True

    def event_destroy(self, event: Any) -> None:
        self._call("cuEventDestroy_v2", event)

    def context_synchronize(self) -> None:
        self._call("cuCtxSynchronize")

    def stream_synchronize(self, stream: int) -> None:
        self._call("cuStreamSynchronize", stream)


class CudaView:
    """A tensor in a mapped CUDA block, described by `__cuda_array_interface__` v3. It
    keeps the frame's reference and the pool's mapping alive while it is referenced
    (PyTorch and CuPy keep it for the life of the tensor made from it)."""

    def __init__(self, owners: tuple, pointer: int, shape: tuple[int, ...], typestr: str,
                 strides: tuple[int, ...] | None) -> None:
        self._owners = owners
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (pointer, False),
                                         "version": 3, "strides": strides, "stream": None}


def _release_all(d: Driver, device: Any, context: Any, mappings: list[tuple[int, int]], events: dict) -> None:
    """Unmap every block, close the events, release the primary context (best effort: it
    also runs at interpreter exit)."""
    try:
        d.set_current(context)
        for ev in events.values():
            d.event_destroy(ev)
        events.clear()
        for ptr, size in mappings:
            d.unmap(ptr, size)
            d.free(ptr, size)
        mappings.clear()
        d.primary_context_release(device)
    except Exception:  # noqa: BLE001
        pass


class DeviceBlocks:
    """Every block of a CUDA pool imported (cuMemImportFromShareableHandle, POSIX fd),
    mapped at an address of this process (cuMemAddressReserve + cuMemMap) and made
    read-write for device `device_id` (cuMemSetAccess), in that device's primary context
    (the one PyTorch and CuPy use). The descriptors may be closed afterwards. `d`: the
    binding (default: `driver()`)."""

    def __init__(self, fds: list[int], block_size: int, device_id: int, d: Driver | None = None) -> None:
        self.driver = d = d or driver()
        d.init()
        self.device_id = device_id
        self.device = d.device(device_id)
        self.context = d.primary_context_retain(self.device)
        self._mappings: list[tuple[int, int]] = []
        self._events: dict[bytes, Any] = {}
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _release_all, d, self.device, self.context, self._mappings,
                                           self._events)
        try:
            self.make_current()
            for fd in fds:
                self._mappings.append(self._map(fd, block_size))
        except BaseException:
            self._finalizer()
            raise
        self.pointers = [ptr for ptr, _ in self._mappings]
        self.uuid = d.device_uuid(self.device)

    def _map(self, fd: int, block_size: int) -> tuple[int, int]:
        d = self.driver
        handle = d.import_fd(fd)
        try:
            gran = d.granularity(handle)
            size = -(-block_size // gran) * gran
            ptr = d.reserve(size)
            try:
                d.map(ptr, size, handle)
                try:
                    d.set_access(ptr, size, self.device_id)
                except BaseException:
                    d.unmap(ptr, size)
                    raise
            except BaseException:
                d.free(ptr, size)
                raise
        finally:
            d.release(handle)  # the mapping keeps the memory
        return ptr, size

    def make_current(self) -> None:
        """Make the device's primary context this thread's current one."""
        self.driver.set_current(self.context)

    def check_device(self, msg: Any) -> None:
        """Raise ValueError unless the TensorRef's GPU is this pool's device in this process."""
        if int(msg.device_id) != self.device_id:
            raise ValueError(f"TensorRef device {msg.device_id}, the pool's hello says device {self.device_id}")
        uuid = bytes(msg.device_uuid)
        if any(uuid) and uuid != self.uuid:
            raise ValueError(f"TensorRef device {msg.device_id} has UUID {uuid.hex()}, this process's device "
                             f"{self.device_id} is {self.uuid.hex()}: the node and this process number the GPUs "
                             "differently (CUDA_VISIBLE_DEVICES?)")

    def view(self, ref: Any, msg: Any, shape: tuple[int, ...], typestr: str,
             strides: tuple[int, ...] | None) -> CudaView:
        """The TensorRef's tensor as a CudaView. It does not wait for the node's IPC event:
        wait_event() first (Frame.array() does)."""
        self.check_device(msg)
        pointer = self.pointers[int(msg.block_index)] + int(msg.byte_offset)
        return CudaView((ref, self), pointer, shape, typestr, strides)

    def wait_event(self, handle: bytes, still_valid: Callable[[], bool], timeout_s: float) -> bool:
        """Wait on the host for the node's IPC event `handle` (opened once, then cached):
        True once it completed and `still_valid()` holds; False as soon as `still_valid()`
        (the block's generation unchanged, the connection open; called between queries)
        turns False, or after `timeout_s`. Never cuEventSynchronize or cuStreamWaitEvent:
        an IPC event whose producer's context faulted, or whose producer died with the work
        in flight, stays not ready forever (measured on an H200, driver 580), and either
        would wait forever. Raises on a driver error other than "not ready" (unless the set
        was withdrawn meanwhile: then False)."""
        self.make_current()
        event = self._event(handle)
        query = self.driver.event_query
        start = time.monotonic()
        spin_until, deadline = start + EVENT_SPIN_S, start + timeout_s
        while True:
            try:
                if query(event):
                    break
            except RuntimeError:
                if not still_valid():  # (the node withdrew the set and freed its event)
                    return False
                raise
            if not still_valid():
                return False
            now = time.monotonic()
            if now >= deadline:
                return False
            if now >= spin_until:
                time.sleep(EVENT_POLL_S)
        # A set withdrawn as its event completed (its work failed after all) is not to be read.
        return still_valid()

    def _event(self, handle: bytes) -> Any:
        with self._lock:
            if handle not in self._events:
                if len(self._events) >= MAX_EVENTS:
                    for ev in self._events.values():
                        self.driver.event_destroy(ev)
                    self._events.clear()
                self._events[handle] = self.driver.open_event(handle)
            return self._events[handle]

    def synchronize(self, stream: Any = None) -> None:
        """Wait for `stream` (an int handle or an object with `.cuda_stream`), or without
        it for all work of the context."""
        self.make_current()
        if stream is None:
            self.driver.context_synchronize()
        else:
            self.driver.stream_synchronize(stream_int(stream))
