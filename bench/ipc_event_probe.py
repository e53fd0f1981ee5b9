"""What a consumer sees of a CUDA interprocess event when the producer's work fails: the
probe behind the consumer's rule of docs/HANDOFF.md (*Synchronisation*: poll from the
host, never wait on the GPU). Needs a GPU, CuPy (the producer's kernel) and libcuda.

    python3 bench/ipc_event_probe.py ok fault kill exit

Per case a producer process makes an event (`CU_EVENT_INTERPROCESS | DISABLE_TIMING`),
prints its handle, and records it after a kernel that spins (ok: 0.5 s; fault: then
writes to an illegal address; kill: 2 s, the producer SIGKILLed at ~0.3 s; exit: 2 s,
the producer exits at 0.3 s with the work in flight). A consumer process opens the handle
and prints each change of cuEventQuery's answer for 6 s while a second thread blocks in
cuEventSynchronize, then whether its own context still works. Also printed: the cost of
making the event, of its handle, and of one cuEventRecord. H200 run:
docs/evidence/h200_2026-12-03_ipc_event_probe.log.
"""
import ctypes, os, signal, subprocess, sys, threading, time

cu = ctypes.CDLL("libcuda.so.1")
def chk(name, r):
    if r != 0:
        s = ctypes.c_char_p()
        cu.cuGetErrorName(r, ctypes.byref(s))
        raise RuntimeError(f"{name}: {r} {s.value}")
def errname(r):
    s = ctypes.c_char_p(); cu.cuGetErrorName(r, ctypes.byref(s)); return f"{r}:{s.value.decode() if s.value else '?'}"

class H(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]
cu.cuIpcOpenEventHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), H]
cu.cuIpcGetEventHandle.argtypes = [ctypes.POINTER(H), ctypes.c_void_p]
cu.cuEventQuery.argtypes = [ctypes.c_void_p]
cu.cuEventSynchronize.argtypes = [ctypes.c_void_p]
cu.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
cu.cuEventCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]

def ctx():
    chk("cuInit", cu.cuInit(0))
    dev = ctypes.c_int(); chk("cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), 0))
    c = ctypes.c_void_p(); chk("retain", cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev))
    chk("setcur", cu.cuCtxSetCurrent(c))

def producer(mode):
    import cupy as cp
    cp.cuda.Device(0).use(); cp.zeros(1).sum()  # primary context
    ctx()
    clock = cp.cuda.Device(0).attributes["ClockRate"]  # kHz
    k = cp.RawKernel(r'''
    extern "C" __global__ void spin(long long cycles, int fault, int *out) {
        long long t0 = clock64();
        while (clock64() - t0 < cycles) {}
        if (fault) { int *bad = (int*)0x10; *bad = 1; }
        out[0] = 1;
    }''', "spin")
    s = cp.cuda.Stream(non_blocking=True)
    out = cp.zeros(1, dtype=cp.int32)
    ev = ctypes.c_void_p()
    t = time.perf_counter(); chk("cuEventCreate", cu.cuEventCreate(ctypes.byref(ev), 2 | 4)); t_create = time.perf_counter() - t
    h = H(); t = time.perf_counter(); chk("cuIpcGetEventHandle", cu.cuIpcGetEventHandle(ctypes.byref(h), ev)); t_get = time.perf_counter() - t
    # cost of recording an interprocess event (empty stream), 1000 times
    t = time.perf_counter()
    for _ in range(1000):
        chk("rec", cu.cuEventRecord(ev, ctypes.c_void_p(s.ptr)))
    t_rec = (time.perf_counter() - t) / 1000
    s.synchronize()
    print(f"P create {t_create*1e6:.1f} us, ipc handle {t_get*1e6:.1f} us, record {t_rec*1e6:.2f} us each", flush=True)
    print("HANDLE " + ctypes.string_at(ctypes.addressof(h), 64).hex(), flush=True)
    sys.stdin.readline()  # consumer ready
    secs = {"ok": 0.5, "fault": 0.5, "kill": 2.0, "exit": 2.0}[mode]
    t0 = time.perf_counter()
    with s:
        k((1,), (1,), (cp.int64(int(secs * clock * 1e3)), cp.int32(1 if mode == "fault" else 0), out))
    chk("rec", cu.cuEventRecord(ev, ctypes.c_void_p(s.ptr)))
    print(f"P recorded at {time.perf_counter()-t0:.4f}", flush=True)
    if mode == "exit":
        time.sleep(0.3); print("P exiting at 0.3 s with work in flight", flush=True); os._exit(0)
    try:
        s.synchronize()
        print(f"P stream done at {time.perf_counter()-t0:.4f}", flush=True)
    except Exception as e:
        print(f"P stream error at {time.perf_counter()-t0:.4f}: {e}", flush=True)
    time.sleep(3)
    print(f"P exits at {time.perf_counter()-t0:.4f}", flush=True)

def consumer(hexh):
    ctx()
    h = H(); ctypes.memmove(ctypes.addressof(h), bytes.fromhex(hexh), 64)
    ev = ctypes.c_void_p(); t = time.perf_counter()
    chk("cuIpcOpenEventHandle", cu.cuIpcOpenEventHandle(ctypes.byref(ev), h))
    print(f"C open {1e6*(time.perf_counter()-t):.1f} us, query now {errname(cu.cuEventQuery(ev))}", flush=True)
    done = {}
    def sync():
        t = time.perf_counter(); r = cu.cuEventSynchronize(ev); done["sync"] = (errname(r), time.perf_counter())
    print("READY", flush=True)
    t0 = time.perf_counter()
    th = threading.Thread(target=sync, daemon=True); th.start()
    last = None
    while time.perf_counter() - t0 < 6:
        r = cu.cuEventQuery(ev)
        if r != last:
            print(f"C query {errname(r)} at {time.perf_counter()-t0:.4f}", flush=True); last = r
        if "sync" in done and done.get("printed") is None:
            print(f"C cuEventSynchronize returned {done['sync'][0]} at {done['sync'][1]-t0:.4f}", flush=True); done["printed"] = 1
        time.sleep(0.0002)
    if "sync" not in done:
        print("C cuEventSynchronize still blocked after 6 s", flush=True)
    # own context still usable?
    p = ctypes.c_uint64()
    r1 = cu.cuMemAlloc_v2(ctypes.byref(p), 1024); r2 = cu.cuCtxSynchronize()
    print(f"C own context after: alloc {errname(r1)}, sync {errname(r2)}", flush=True)
    os._exit(0)

def run(mode):
    print(f"=== {mode}", flush=True)
    P = subprocess.Popen([sys.executable, __file__, "producer", mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    hexh = None
    for line in P.stdout:
        print(line, end="", flush=True)
        if line.startswith("HANDLE "):
            hexh = line.split()[1]; break
    C = subprocess.Popen([sys.executable, __file__, "consumer", hexh], stdout=subprocess.PIPE, text=True)
    for line in C.stdout:
        print(line, end="", flush=True)
        if line.startswith("READY"):
            break
    P.stdin.write("go\n"); P.stdin.flush()
    if mode == "kill":
        time.sleep(0.3); P.send_signal(signal.SIGKILL); print("X producer SIGKILLed at ~0.3 s", flush=True)
    def pump(f):
        for line in f:
            print(line, end="", flush=True)
    tp = threading.Thread(target=pump, args=(P.stdout,)); tp.start()
    pump(C.stdout); C.wait(); tp.join(timeout=10); P.wait(timeout=10)
    print(f"=== {mode}: producer rc {P.returncode}, consumer rc {C.returncode}", flush=True)

if __name__ == "__main__":
    if sys.argv[1] == "producer": producer(sys.argv[2])
    elif sys.argv[1] == "consumer": consumer(sys.argv[2])
    else:
        for m in sys.argv[1:]:
            run(m)
