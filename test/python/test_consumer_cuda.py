"""vision_preproc_consumer's CUDA import without a GPU: which driver binding is chosen
(VISION_PREPROC_CUDA_BINDING), the errors that name the fix when none can be loaded, and
the ctypes binding end to end against a fake libcuda built here from C (below): every
prototype resolves, a pool's CUDA blocks (memfds standing in for the exported fds) are
imported, mapped and read through PoolClient and Frame, the node's IPC event is polled
from the host (never cuEventSynchronize or cuStreamWaitEvent) until it completes, the
node withdraws the set, the connection closes or the wait times out, and every import,
reservation, mapping, event and context is given back.

The fake maps each "imported" fd into the reserved range (mmap MAP_FIXED), so that the
pointer Frame.array() hands out reads the block's bytes on the host; it checks what the
real driver would refuse (no current context, a wrong access descriptor, a handle type
other than POSIX fd) and fails with the driver's error codes. What it cannot check, a
real GPU run does: scripts/device/gpu_node_remote.py cudaref, mode `ctypes`."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from vision_preproc_consumer import Frame, PoolClient, TensorRefSubscription, cuda

FAKE_LIBCUDA_C = r"""
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef unsigned long long u64;
typedef struct { int type; int id; } Loc;
typedef struct { int type; int handle_types; Loc location; void *win32; unsigned char flags[8]; } Prop;
typedef struct { Loc location; int flags; } Access;
typedef struct { char reserved[64]; } Ipc;

enum { OK = 0, INVALID_VALUE = 1, INVALID_DEVICE = 101, INVALID_CONTEXT = 201, INVALID_HANDLE = 400,
       NOT_READY = 600 };
enum { INITS, RETAINS, RELEASES, IMPORTS, MEM_RELEASES, RESERVES, FREES, MAPS, UNMAPS, ACCESSES,
       EVENTS_OPENED, EVENTS_DESTROYED, EVENT_QUERIES, EVENT_SYNCS, STREAM_WAITS, CTX_SYNCS, STREAM_SYNCS, N };
static long counts[N];
static void *current;
static void *last_stream;
static char last_ipc[64];
static volatile int pending;  /* queries still answered NOT_READY; -1: forever (a faulted producer) */
#define TAG 0xC0DE00000000ULL
#define DEVICE0 100  /* device handles are not ordinals */

void fake_counts(long *out) { memcpy(out, counts, sizeof counts); }
void fake_last_ipc(char *out) { memcpy(out, last_ipc, 64); }
void *fake_last_stream(void) { return last_stream; }
void fake_set_event_pending(int n) { pending = n; }

int cuInit(unsigned flags) { counts[INITS]++; return flags ? INVALID_VALUE : OK; }
int cuDeviceGet(int *dev, int ordinal) {
    if (ordinal < 0 || ordinal > 1) return INVALID_DEVICE;
    *dev = DEVICE0 + ordinal; return OK;
}
int cuDeviceGetUuid(unsigned char *uuid, int dev) {  /* byte 0 is 0 on device 0 */
    if (dev < DEVICE0) return INVALID_DEVICE;
    for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)(i * 16 + dev - DEVICE0);
    return OK;
}
int cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    if (dev < DEVICE0) return INVALID_DEVICE;
    *ctx = (void *)(uintptr_t)(0x1000 + dev); counts[RETAINS]++; return OK;
}
int cuDevicePrimaryCtxRelease_v2(int dev) { counts[RELEASES]++; return dev < DEVICE0 ? INVALID_DEVICE : OK; }
int cuCtxSetCurrent(void *ctx) { current = ctx; return OK; }
int cuCtxSynchronize(void) { if (!current) return INVALID_CONTEXT; counts[CTX_SYNCS]++; return OK; }
int cuMemImportFromShareableHandle(u64 *h, void *os_handle, int type) {
    if (!current) return INVALID_CONTEXT;
    if (type != 1) return INVALID_VALUE;
    int fd = dup((int)(intptr_t)os_handle);
    if (fd < 0) return INVALID_VALUE;
    *h = TAG | (u64)fd; counts[IMPORTS]++; return OK;
}
int cuMemGetAllocationPropertiesFromHandle(Prop *p, u64 h) {
    if ((h & ~0xFFFFFFFFULL) != TAG) return INVALID_HANDLE;
    memset(p, 0, sizeof *p); p->type = 1; p->handle_types = 1; p->location.type = 1; return OK;
}
int cuMemGetAllocationGranularity(size_t *g, const Prop *p, int option) {
    if (p->type != 1 || p->location.type != 1 || option != 0) return INVALID_VALUE;
    *g = 8192; return OK;
}
int cuMemAddressReserve(u64 *ptr, size_t size, size_t align, u64 addr, u64 flags) {
    if (align || addr || flags || size % 8192) return INVALID_VALUE;
    void *p = mmap(0, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return INVALID_VALUE;
    *ptr = (u64)(uintptr_t)p; counts[RESERVES]++; return OK;
}
int cuMemMap(u64 ptr, size_t size, size_t offset, u64 h, u64 flags) {
    if (offset || flags || (h & ~0xFFFFFFFFULL) != TAG) return INVALID_VALUE;
    void *p = mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, (int)(h & 0xFFFFFFFF), 0);
    if (p == MAP_FAILED) return INVALID_VALUE;
    counts[MAPS]++; return OK;
}
int cuMemSetAccess(u64 ptr, size_t size, const Access *desc, size_t count) {
    (void)ptr; (void)size;
    if (count != 1 || desc->location.type != 1 || desc->location.id < 0 || desc->location.id > 1 || desc->flags != 3)
        return INVALID_VALUE;
    counts[ACCESSES]++; return OK;
}
int cuMemUnmap(u64 ptr, size_t size) {
    mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    counts[UNMAPS]++; return OK;
}
int cuMemAddressFree(u64 ptr, size_t size) { munmap((void *)(uintptr_t)ptr, size); counts[FREES]++; return OK; }
int cuMemRelease(u64 h) {
    if ((h & ~0xFFFFFFFFULL) != TAG) return INVALID_HANDLE;
    close((int)(h & 0xFFFFFFFF)); counts[MEM_RELEASES]++; return OK;
}
int cuIpcOpenEventHandle(void **ev, Ipc h) {
    memcpy(last_ipc, h.reserved, 64); *ev = (void *)0xE0E0; counts[EVENTS_OPENED]++; return OK;
}
int cuEventQuery(void *ev) {
    if (ev != (void *)0xE0E0) return INVALID_HANDLE;
    counts[EVENT_QUERIES]++;
    if (pending == 0) return OK;
    if (pending > 0) pending--;
    return NOT_READY;
}
/* Never called by the consumer (they would wait forever on a faulted producer's event): counted to check. */
int cuEventSynchronize(void *ev) { if (ev != (void *)0xE0E0) return INVALID_HANDLE; counts[EVENT_SYNCS]++; return OK; }
int cuStreamWaitEvent(void *s, void *ev, unsigned flags) {
    if (ev != (void *)0xE0E0 || flags) return INVALID_HANDLE;
    last_stream = s; counts[STREAM_WAITS]++; return OK;
}
int cuEventDestroy_v2(void *ev) { counts[EVENTS_DESTROYED]++; return ev == (void *)0xE0E0 ? OK : INVALID_HANDLE; }
int cuStreamSynchronize(void *s) { last_stream = s; counts[STREAM_SYNCS]++; return OK; }
static const char *name(int e) {
    return e == INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE" : e == INVALID_DEVICE ? "CUDA_ERROR_INVALID_DEVICE"
         : e == INVALID_CONTEXT ? "CUDA_ERROR_INVALID_CONTEXT" : "CUDA_ERROR_INVALID_HANDLE";
}
int cuGetErrorName(int e, const char **s) { *s = name(e); return OK; }
int cuGetErrorString(int e, const char **s) { *s = e == INVALID_DEVICE ? "invalid device ordinal" : "fake error"; return OK; }
"""
COUNTERS = ("inits retains releases imports mem_releases reserves frees maps unmaps accesses events_opened "
            "events_destroyed event_queries event_syncs stream_waits ctx_syncs stream_syncs").split()


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler for the fake libcuda")
    d = tmp_path_factory.mktemp("fake_libcuda")
    (d / "fake_libcuda.c").write_text(FAKE_LIBCUDA_C)
    lib = d / "libcuda.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(lib), str(d / "fake_libcuda.c")],
                   check=True)
    return lib


def counts(lib: Path) -> dict[str, int]:
    out = (ctypes.c_long * len(COUNTERS))()
    ctypes.CDLL(str(lib)).fake_counts(out)
    return dict(zip(COUNTERS, out))


def since(lib: Path, before: dict[str, int]) -> dict[str, int]:
    now = counts(lib)
    return {k: now[k] - before[k] for k in COUNTERS}


def event_pending(lib: Path, n: int) -> None:
    """The fake's event answers NOT_READY to the next `n` queries (-1: to all), then SUCCESS."""
    ctypes.CDLL(str(lib)).fake_set_event_pending(n)


@pytest.fixture
def no_driver_yet(monkeypatch):
    """The binding is chosen again in this test (the module caches it per process)."""
    monkeypatch.setattr(cuda, "_DRIVER", None)
    return monkeypatch


# --- which binding ----------------------------------------------------------------


@pytest.mark.parametrize("requested,importable,chosen", [
    (None, True, "cuda-python"), (None, False, "ctypes"), ("", False, "ctypes"), ("auto", True, "cuda-python"),
    ("ctypes", True, "ctypes"), (" CTYPES ", True, "ctypes"), ("cuda-python", False, "cuda-python"),
])
def test_the_binding_is_cuda_python_when_importable_unless_the_variable_says(requested, importable, chosen) -> None:
    assert cuda.choose(requested, importable) == chosen


def test_an_unknown_binding_is_refused_naming_the_values() -> None:
    with pytest.raises(ValueError, match=r"VISION_PREPROC_CUDA_BINDING='cupy': use 'cuda-python', 'ctypes' or 'auto'"):
        cuda.choose("cupy", True)


def test_without_libcuda_the_ctypes_binding_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ImportError) as e:
        cuda.CtypesDriver(str(tmp_path / "libcuda.so.1"))
    text = str(e.value)
    assert "the pool's blocks are CUDA memory" in text and "NVIDIA driver" in text
    assert "backend: cpu" in text, text


def test_a_libcuda_without_the_vmm_calls_names_the_fix(tmp_path: Path, fake_libcuda: Path) -> None:
    old = tmp_path / "libcuda_old.so"
    src = tmp_path / "old.c"
    src.write_text("int cuInit(unsigned f) { return (int)f; }\n")
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", "-o", str(old), str(src)], check=True)
    with pytest.raises(ImportError, match=r"has no cuDeviceGet: .*\(update the NVIDIA driver\)"):
        cuda.CtypesDriver(str(old))


def test_the_variable_forces_each_binding(no_driver_yet) -> None:
    no_driver_yet.setenv(cuda.BINDING_ENV, "ctypes")
    try:
        assert cuda.driver().name == "ctypes"  # (a machine with the NVIDIA driver)
    except ImportError as e:
        assert "libcuda.so.1" in str(e)
    cuda._DRIVER = None
    no_driver_yet.setenv(cuda.BINDING_ENV, "cuda-python")
    try:
        assert cuda.driver().name == "cuda-python"  # (cuda-python installed)
    except ImportError as e:
        assert "pip install cuda-python" in str(e) and "VISION_PREPROC_CUDA_BINDING=ctypes" in str(e)
    cuda._DRIVER = None
    no_driver_yet.setenv(cuda.BINDING_ENV, "numba")
    with pytest.raises(ValueError, match="VISION_PREPROC_CUDA_BINDING='numba'"):
        cuda.driver()


def test_the_ctypes_structures_have_cuda_h_layouts() -> None:
    # cuda.h (CUDA 12; cudarc's bindgen output for cuda-12020): CUmemAllocationProp is
    # {int type, int requestedHandleTypes, CUmemLocation {int type, int id}, void *win32,
    # struct {u8, u8, u16, u8[4]} allocFlags}; CUmemAccessDesc {CUmemLocation, int flags}.
    P = cuda.CUmemAllocationProp
    assert (ctypes.sizeof(P), P.location.offset, P.win32HandleMetaData.offset, P.allocFlags.offset) == (32, 8, 16, 24)
    assert ctypes.sizeof(cuda.CUmemAccessDesc) == 12 and cuda.CUmemAccessDesc.flags.offset == 8
    assert (ctypes.sizeof(cuda.CUipcEventHandle), ctypes.sizeof(cuda.CUuuid)) == (64, 16)


# --- the ctypes binding against the fake driver -----------------------------------


def test_every_prototype_resolves_and_errors_name_the_call(fake_libcuda: Path) -> None:
    d = cuda.CtypesDriver(str(fake_libcuda))
    assert set(d.fns) == set(cuda.PROTOTYPES)
    with pytest.raises(RuntimeError, match=r"cuDeviceGet failed: CUDA_ERROR_INVALID_DEVICE: invalid device ordinal"):
        d.device(7)
    assert d.device_uuid(d.device(0)) == bytes(i * 16 for i in range(16)), "all 16 bytes, the leading zero too"


def test_event_query_says_not_ready_then_done_and_raises_on_other_errors(fake_libcuda: Path) -> None:
    d = cuda.CtypesDriver(str(fake_libcuda))
    event = d.open_event(bytes(64))
    event_pending(fake_libcuda, 2)
    assert [d.event_query(event) for _ in range(3)] == [False, False, True]
    with pytest.raises(RuntimeError, match=r"cuEventQuery failed: CUDA_ERROR_INVALID_HANDLE"):
        d.event_query(ctypes.c_void_p(0x1234))
    d.event_destroy(event)


def memfd(name: str, data: bytes, size: int) -> int:
    fd = os.memfd_create(name)
    os.ftruncate(fd, size)
    os.pwrite(fd, data, 0)
    return fd


def test_a_failed_mapping_gives_back_what_it_made(fake_libcuda: Path) -> None:
    d = cuda.CtypesDriver(str(fake_libcuda))
    before = counts(fake_libcuda)
    fd = memfd("block", b"x", 8192)
    try:
        with pytest.raises(RuntimeError, match=r"cuMemSetAccess failed: CUDA_ERROR_INVALID_VALUE"):
            cuda.DeviceBlocks([fd], 8192, 1, d=FailingAccess(d))
    finally:
        os.close(fd)
    after = counts(fake_libcuda)
    delta = {k: after[k] - before[k] for k in COUNTERS}
    assert delta["imports"] == delta["mem_releases"] == 1
    assert delta["reserves"] == delta["frees"] == 1 and delta["maps"] == delta["unmaps"] == 1
    assert delta["retains"] == delta["releases"] == 1


class FailingAccess:
    """The ctypes binding with an access descriptor for a device the fake refuses."""

    def __init__(self, d: cuda.CtypesDriver) -> None:
        self._d = d

    def __getattr__(self, name: str):
        return getattr(self._d, name)

    def set_access(self, ptr: int, size: int, device_id: int) -> None:
        self._d.set_access(ptr, size, 5)


class FakeNode:
    """A node's socket serving one CUDA pool: the hello (memory "cuda", device 1) with a
    control block and `blocks` memfds whose bytes stand for the device blocks."""

    BLOCK = 5000  # rounded up to the fake's 8192-byte granularity when mapped

    def __init__(self, path: Path, contents: list[bytes]) -> None:
        n = len(contents)
        holds_offset, row_stride, rows = 64 + 64 * n, 64, 4
        control_size = 16384
        self.control = memfd("control", b"VPCTRL01", control_size)
        for b in range(n):  # block b has generation 10 + b
            os.pwrite(self.control, struct.pack("<Q", 10 + b), 64 + 64 * b)
        self.blocks = [memfd(f"block{b}", c, 8192) for b, c in enumerate(contents)]
        self.hello = {"magic": "vision_preproc/pool", "version": 1, "pool_id": "00000000000000aa", "memory": "cuda",
                      "device_id": 1, "blocks": n, "block_size": self.BLOCK, "control_size": control_size, "row": 0,
                      "rows": rows, "records_offset": 64, "record_stride": 64, "holds_offset": holds_offset,
                      "row_stride": row_stride}
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        self.conns.append(conn)
        raw = json.dumps(self.hello).encode()
        socket.send_fds(conn, [struct.pack("<I", len(raw)) + raw], [self.control, *self.blocks])

    def hold(self, b: int) -> int:
        return struct.unpack("<I", os.pread(self.control, 4, self.hello["holds_offset"] + 4 * b))[0]

    def withdraw(self, b: int, generation: int) -> None:
        """What the node does to a set whose GPU work failed: a new generation in the record."""
        record = self.hello["records_offset"] + self.hello["record_stride"] * b
        os.pwrite(self.control, struct.pack("<Q", generation), record)

    def close(self) -> None:
        for s in (*self.conns, self.listener):
            s.close()
        for fd in (self.control, *self.blocks):
            os.close(fd)


def tensor_ref(block: int, generation: int, nbytes: int, **kw) -> SimpleNamespace:
    fields = dict(name="tensor", pool_id="00000000000000aa", block_index=block, generation=generation,
                  memory_kind=1, device_id=1, device_uuid=bytes(i * 16 + 1 for i in range(16)), byte_offset=4,
                  byte_size=nbytes, shape=[nbytes // 4], strides=[1], dtype="float32", dtype_code=2,
                  dtype_bits=32, dtype_lanes=1, ipc_event_handle=b"")
    fields.update(kw)
    return SimpleNamespace(**fields)


def test_a_cuda_pool_through_the_ctypes_binding(tmp_path: Path, fake_libcuda: Path, no_driver_yet) -> None:
    no_driver_yet.setattr(cuda, "_DRIVER", cuda.CtypesDriver(str(fake_libcuda)))
    before = counts(fake_libcuda)
    contents = [bytes(range(b, b + 64)) for b in range(2)]
    node = FakeNode(tmp_path / "pool.sock", contents)
    try:
        client = PoolClient(str(tmp_path / "pool.sock"), pool_id="00000000000000aa")
        assert client.device.driver.name == "ctypes" and client.device.uuid == bytes(i * 16 + 1 for i in range(16))
        assert client.acquire(1, 11) and node.hold(1) == 1
        assert not client.acquire(0, 99), "another generation: not taken"
        assert client.generation(1) == 11
        event = bytes(range(64))
        frame = Frame(client, tensor_ref(1, 11, 32, ipc_event_handle=event))
        event_pending(fake_libcuda, 5)  # the node's work ends at the 6th query
        view = frame.array()
        assert since(fake_libcuda, before)["event_queries"] == 6, "polled until the event completed"
        assert frame.wait_ready(), "remembered: no more queries"
        assert since(fake_libcuda, before)["event_queries"] == 6
        cai = view.__cuda_array_interface__
        assert cai["shape"] == (8,) and cai["typestr"] == "<f4"
        pointer = cai["data"][0]
        assert pointer == client.device.pointers[1] + 4
        assert ctypes.string_at(pointer, 32) == contents[1][4:36], "the pointer is block 1, at byte_offset"
        last = ctypes.create_string_buffer(64)
        ctypes.CDLL(str(fake_libcuda)).fake_last_ipc(last)
        assert last.raw == event, "the handle's 64 bytes reached cuIpcOpenEventHandle by value"
        frame.release(SimpleNamespace(cuda_stream=0x5151))  # torch.cuda.Stream-like
        assert node.hold(1) == 0
        lib = ctypes.CDLL(str(fake_libcuda))
        lib.fake_last_stream.restype = ctypes.c_void_p
        assert lib.fake_last_stream() == 0x5151
        assert client.acquire(1, 11)
        other_gpu = Frame(client, tensor_ref(1, 11, 32, device_uuid=bytes(16 * [9]), ipc_event_handle=event))
        with pytest.raises(ValueError, match="number the GPUs differently"):
            other_gpu.array()  # (refused before its event is opened or queried)
        other_gpu.release()
        assert since(fake_libcuda, before)["event_queries"] == 6
        second = Frame(client, tensor_ref(1, 11, 32, ipc_event_handle=event)) if client.acquire(1, 11) else None
        assert second is not None
        second.array(stream=0x77)  # accepted, but no stream is made to wait (the event was opened once, cached)
        second.release()  # no stream: the whole context
        client.close()
        del frame, view, second, client
        gc.collect()
    finally:
        node.close()
    delta = since(fake_libcuda, before)
    assert delta["imports"] == delta["mem_releases"] == 2, delta
    assert delta["reserves"] == delta["frees"] == 2 and delta["maps"] == delta["unmaps"] == 2, delta
    assert delta["accesses"] == 2 and delta["retains"] == delta["releases"] == 1, delta
    assert delta["events_opened"] == delta["events_destroyed"] == 1, delta
    assert (delta["event_queries"], delta["event_syncs"], delta["stream_waits"]) == (7, 0, 0), delta
    assert (delta["stream_syncs"], delta["ctx_syncs"]) == (1, 1), delta


class After(threading.Timer):
    """Runs `action` after `seconds` and keeps the monotonic time it ran at (`at`).

    A wait that should end because of the action is timed against `at`, not against a clock
    started after the timer: that one starts late, and a wait ended on time can read a few
    microseconds short of `seconds` (CI saw 0.019999 s for 0.02 s)."""

    def __init__(self, seconds: float, action) -> None:
        self.at: float | None = None

        def run() -> None:
            self.at = time.monotonic()
            action()

        super().__init__(seconds, run)
        self.start()

    def ended_after(self, end: float) -> float:
        """Seconds from the action to `end`; negative if the wait ended before the action."""
        self.join()
        assert self.at is not None
        return end - self.at


def timed_wait(frame: Frame, timeout_s: float) -> tuple[bool, float, float]:
    """(ready, seconds waited, the monotonic time the wait returned)."""
    t0 = time.monotonic()
    ready = frame.wait_ready(timeout_s)
    end = time.monotonic()
    return ready, end - t0, end


@pytest.fixture
def cuda_pool(tmp_path: Path, fake_libcuda: Path, no_driver_yet):
    """A FakeNode of 2 blocks and a PoolClient of it, through the ctypes binding."""
    no_driver_yet.setattr(cuda, "_DRIVER", cuda.CtypesDriver(str(fake_libcuda)))
    node = FakeNode(tmp_path / "pool.sock", [bytes(64), bytes(64)])
    client = PoolClient(str(tmp_path / "pool.sock"))
    yield node, client
    client.close()
    node.close()


def test_a_set_the_node_withdraws_is_not_waited_for(cuda_pool, fake_libcuda: Path) -> None:
    node, client = cuda_pool
    before = counts(fake_libcuda)
    event_pending(fake_libcuda, -1)  # the node's context faulted: its event never completes
    assert client.acquire(1, 11)
    frame = Frame(client, tensor_ref(1, 11, 32, ipc_event_handle=bytes(range(64))))
    timer = After(0.02, lambda: node.withdraw(1, 12))
    ready, _, end = timed_wait(frame, 2.0)
    late = timer.ended_after(end)
    assert not ready and 0 <= late < 0.5, f"withdrawn, the wait said {ready} {late:+.3f} s after the withdrawal"
    assert since(fake_libcuda, before)["event_queries"] > 1
    with pytest.raises(RuntimeError, match=r"block 1, generation 11: withdrawn by the node .* skip the frame"):
        frame.array()
    frame.release()
    assert node.hold(1) == 0


def test_a_wait_ends_when_the_node_closes_the_connection(cuda_pool, fake_libcuda: Path) -> None:
    node, client = cuda_pool
    event_pending(fake_libcuda, -1)  # the node was killed with the work in flight
    assert client.acquire(0, 10)
    frame = Frame(client, tensor_ref(0, 10, 32, ipc_event_handle=bytes(range(64))))
    timer = After(0.02, node.conns[0].close)
    ready, _, end = timed_wait(frame, 2.0)
    late = timer.ended_after(end)
    assert not ready and 0 <= late < 0.5, f"closed, the wait said {ready} {late:+.3f} s after the close"
    with pytest.raises(RuntimeError, match="the connection to the node is closed"):
        frame.array()
    frame.release()


def test_a_wait_times_out(cuda_pool, fake_libcuda: Path) -> None:
    node, client = cuda_pool
    before = counts(fake_libcuda)
    event_pending(fake_libcuda, -1)
    assert client.acquire(0, 10)
    frame = Frame(client, tensor_ref(0, 10, 32, ipc_event_handle=bytes(range(64))))
    ready, took, _ = timed_wait(frame, 0.05)
    assert not ready and 0.05 <= took < 0.5, f"timeout 0.05 s, the wait said {ready} after {took:.3f} s"
    queries = since(fake_libcuda, before)["event_queries"]
    # Spinning 0.2 ms, then a query every ~0.1 ms (a 50-us sleep and the timer slack):
    # some hundreds in 50 ms, not the millions of a busy loop.
    assert 10 < queries < 5000, queries
    frame.release()
    assert node.hold(0) == 0


def test_the_subscription_calls_back_with_ready_frames_only(tmp_path: Path, fake_libcuda: Path,
                                                            no_driver_yet) -> None:
    """TensorRefSubscription against a fake rclpy node (its message callback called as
    rclpy would): a frame whose event completes is delivered ready; a withdrawn set is
    given back, counted in `withdrawn`, and never reaches the callback."""
    no_driver_yet.setattr(cuda, "_DRIVER", cuda.CtypesDriver(str(fake_libcuda)))
    msgs = types.ModuleType("vision_preproc_msgs.msg")
    msgs.TensorRef = object  # (no ROS needed: the type only goes to create_subscription)
    no_driver_yet.setitem(sys.modules, "vision_preproc_msgs", types.ModuleType("vision_preproc_msgs"))
    no_driver_yet.setitem(sys.modules, "vision_preproc_msgs.msg", msgs)
    subscribed = {}
    ros_node = SimpleNamespace(
        create_subscription=lambda kind, topic, callback, qos: subscribed.setdefault("on_message", callback),
        destroy_subscription=lambda s: None, get_logger=lambda: SimpleNamespace(warning=print, info=print),
        get_name=lambda: "fake")
    node = FakeNode(tmp_path / "pool.sock", [bytes(range(64)), bytes(64)])
    got: list[Frame] = []
    sub = TensorRefSubscription(ros_node, "tensor_ref", got.append)
    try:
        ref = dict(socket_path=str(tmp_path / "pool.sock"), block_size=FakeNode.BLOCK,
                   ipc_event_handle=bytes(range(64)))
        before = counts(fake_libcuda)
        event_pending(fake_libcuda, 3)
        subscribed["on_message"](tensor_ref(0, 10, 32, **ref))
        assert (sub.delivered, sub.withdrawn) == (1, 0) and len(got) == 1
        assert since(fake_libcuda, before)["event_queries"] == 4, "waited before the callback"
        view = got[0].array()
        assert since(fake_libcuda, before)["event_queries"] == 4, "the callback's array() waits no more"
        assert ctypes.string_at(view.__cuda_array_interface__["data"][0], 4) == bytes(range(4, 8))
        got.pop().release()
        assert node.hold(0) == 0

        event_pending(fake_libcuda, -1)
        timer = After(0.02, lambda: node.withdraw(1, 12))
        subscribed["on_message"](tensor_ref(1, 11, 32, **ref))
        late = timer.ended_after(time.monotonic())
        assert (sub.received, sub.delivered, sub.withdrawn, sub.skipped, sub.errors) == (2, 1, 1, 0, 0)
        assert got == [] and node.hold(1) == 0, "given back, never delivered"
        assert 0 <= late < 0.5, f"{late:+.3f} s after the withdrawal: the withdrawal ended the wait, not the timeout"
    finally:
        sub.close()
        node.close()
