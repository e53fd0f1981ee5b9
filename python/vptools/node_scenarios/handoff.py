"""tensor_ref: `handoff` (host blocks, the r2r consumer) and `cudaref` (blocks of CUDA
memory, PyTorch consumers), with cudaref's runs (also the bench parts of `camera` and
`compressed`) and the rclpy peers they start."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from vptools import ROOT
from vptools.node_scenarios.common import (CONFIG, INPUTS4, JPEG_BAG, MEMCHECK, PREV_DIR, ROS_DIR, WORK,
                                           gst_source, grep, lines_of, nl, scenario, text)
from vptools.node_scenarios.run import Run
from vptools.procs import INJECT_FAULT_ENV, children


@scenario
def handoff(run: Run) -> None:
    """tensor_ref with host blocks (HANDOFF_BACKEND, the node's by default): the r2r
    consumer's bytes equal the recorded tensors' (64x48, both at once); then `record
    --count-only` of tensor vs the r2r consumer of tensor_ref alone, 1080p -> 640x480
    (config/default.yaml), alternating (2 x 10 s, TRIALS). HANDOFF_SPIN_MS=N: a second
    consumer beside the first in the ref phases, waiting at most N ms for messages."""
    with run.tee("handoff"):
        run.warm_up()
        handoff_run(run, "same", 1)
        for i in run.k.n(2):
            handoff_run(run, "tensor", i)
            handoff_run(run, "ref", i)


def handoff_run(run: Run, mode: str, i: int) -> None:
    """One phase of `handoff`, 1080p bgr8 at 30 Hz restamped, 10 s. same: 64x48, `record` of
    tensor (its bag kept) and the r2r consumer of tensor_ref (FNV-1a of each tensor it read,
    by stamp) at once; tensor / ref: config/default.yaml, one consumer, `record
    --count-only` or the r2r consumer."""
    tag = f"handoff_{mode}_{i}"
    args = ["--params-file", CONFIG, "-p", f"backend:={run.k.handoff_backend}"]
    if mode == "same":
        args += ["-p", "network_image_width:=64", "-p", "network_image_height:=48"]
    rec_dir = WORK / f"rec_{tag}"
    shutil.rmtree(rec_dir, ignore_errors=True)
    node = run.node(args, WORK / f"node_{tag}.log")
    waits = []
    if mode == "same":
        waits.append(run.spawn([run.cli, "record", rec_dir, "--duration", 13], WORK / f"rec_{tag}.log"))
    elif mode == "tensor":
        waits.append(run.spawn([run.cli, "record", "--count-only", "--duration", 13, "--json", run.out / f"{tag}.json"],
                               WORK / f"rec_{tag}.log"))
    if mode != "tensor":
        waits.append(run.spawn([run.consumer_bin, "/tensor_ref", 13, WORK / f"refs_{tag}.txt"],
                               WORK / f"con_{tag}.log"))
        if mode == "ref" and run.k.handoff_spin_ms:
            env = dict(os.environ, VP_SPIN_MS=run.k.handoff_spin_ms, ROS_NAMESPACE="")
            waits.append(run.spawn([run.consumer_bin, "/tensor_ref", 13], WORK / f"con1_{tag}.log", env=env))
    waits.append(run.player(run.bags / "bgr8_1920x1080", tag, "--loop", "--restamp", "--duration", 10,
                            "--wait-subscribers", 1))
    time.sleep(6)
    mem = run.mem(node)
    run.wait(*waits)
    run.stop_node(node)
    con = lines_of(WORK / f"con_{tag}.log")[-2:]
    print(f"{tag}: {nl(lines_of(WORK / f'play_{tag}.log')[:1])}; {nl(grep('^latency', WORK / f'rec_{tag}.log'))}; "
          f"consumer: {''.join(c + ' ' for c in con)}; node {mem}; "
          f"{nl(grep('stopped:.*', WORK / f'node_{tag}.log', only=True))}")
    if (WORK / f"con1_{tag}.log").exists():
        print(f"{tag}, second consumer (VP_SPIN_MS={run.k.handoff_spin_ms}): "
              f"{nl(lines_of(WORK / f'con1_{tag}.log')[-1:])}")
    for line in grep("tensor_ref", WORK / f"node_{tag}.log"):
        print(line[:220])
    if mode == "same":
        if (WORK / f"refs_{tag}.txt").exists():
            shutil.copy(WORK / f"refs_{tag}.txt", run.out)
        subprocess.run(["tar", "cf", str(run.out / f"{tag}_bag.tar"), "-C", str(WORK), f"rec_{tag}"], check=False)
    shutil.rmtree(rec_dir, ignore_errors=True)


@scenario
def cudaref(run: Run) -> None:
    """tensor_ref with blocks of CUDA memory (VMM, exported fds), consumers in PyTorch
    (bench/bench_handoff.py --consumer, rclpy from .device/py312.tar.xz). CUDAREF_MODES (a
    subset, in order; default check bench slow kill sanitizer batch rust ctypes):
      check: 64x48 + conv2d, each block's tensor (a CUDA torch tensor whose data_ptr must be
        the mapped block) equal to the Tensor of the same stamp; the tensors recorded
        (compare with a CPU replay here)
      bench: 1080p -> 640x640 float32, tensor (+ torch .cuda()) vs tensor_ref, alternating, 2 x 10 s
      slow: a consumer holding each frame 500 ms for 20 s (CUDAREF_SLOW_S; its tensor must
        not change while held)
      kill: a holder SIGKILLed beside a second consumer that records the node's Shared diagnostics
      sanitizer: the node under compute-sanitizer memcheck with a consumer
      batch: 4 cameras 1080p (phases not aligned) -> one node with 4 inputs, TensorBatch
        4x3x640x640 vs tensor_ref, alternating, 2 x 10 s (CUDAREF_BATCH_ARGS: more node
        arguments, e.g. -p input_participants:=per_input; CUDAREF_BATCH_PLAY: more player
        arguments, e.g. --max)
      fault_retry / fault_fallback: a device fault at frame 200 (~7 s in, the consumer
        connected) under a consumer (transient: the backend rebuilt, a new CUDA pool;
        sticky: the CPU backend, a host pool)
      fault_inflight: the fault inside set 200's own GPU work, after its TensorRef went out
        (policy retry): the set withdrawn
      example: examples/tensor_ref_torch.py (a small conv net on each block)
      debug: debug_image watched beside a tensor_ref consumer (the preview read back from the CUDA block)
      rust: the r2r consumer (examples/tensor_ref_consumer.rs) importing the CUDA blocks, its
        FNV-1a of each tensor (copied to the host) against those of the Tensor messages of
        the same stamps (a recorder beside it), 64x48 + conv2d
      ctypes: the check consumer with VISION_PREPROC_CUDA_BINDING=ctypes (the blocks
        imported through ctypes on libcuda.so.1, not cuda-python)
      cpp / cpp_bench: the C++ consumer (examples/tensor_ref_consumer.cpp, consumer_c built
        there with its CMake) on the socket's ready signal, the CUDA blocks imported by
        consumer_c, cublasSasum on each block in place; a Python consumer on tensor_ref beside
        it (the node writes blocks only while the topic has a subscriber). cpp: 64x48 +
        conv2d, its FNV-1a of each tensor against the Tensor messages'; cpp_bench: 1080p ->
        640x640, its camera stamp -> usable p50/p99
      prev: the bench's tensor_ref consumer with the previous release's node
        (.device/prev.tar.xz, as for `single`) and with this one, alternating, 2 x 10 s"""
    # ROS_DIR/py312 (scripts/device/py312_bundle.sh)
    if not run.untar(run.stage / "py312.tar.xz", ROS_DIR):
        raise SystemExit(f"gpu_node_remote: cannot unpack {run.stage / 'py312.tar.xz'} (cudaref's consumers)")
    with run.tee("cudaref"):
        run.warm_up()
        for m in run.k.cudaref_modes:
            if m == "bench":
                for i in run.k.n(2):
                    cudaref_run(run, "tensor", i)
                    cudaref_run(run, "tensor_ref", i)
            elif m == "batch":
                for i in run.k.n(2):
                    cudaref_run(run, "batch_tensor", i)
                    cudaref_run(run, "batch_tensor_ref", i)
            elif m == "prev":
                if not run.unpack_prev():
                    continue
                print(f"prev: commit {text(PREV_DIR / 'COMMIT').strip()}; this: commit {run.commit}")
                for i in run.k.n(2):
                    cudaref_run(run, "prev_ref", i)
                    cudaref_run(run, "tensor_ref", i)
            else:
                cudaref_run(run, m)


def cudaref_run(run: Run, mode: str, trial: int = 1) -> None:
    """One run of cudaref's `mode` (its modes: cudaref's function)."""
    k = run.k
    tag = f"cudaref_{mode}_{trial}"
    bag, stamps, play_s = run.bags / "bgr8_1920x1080", ["--restamp"], 10
    args = ["--params-file", CONFIG, "-p", f"backend:={k.backend}", "-p", "network_image_width:=640",
            "-p", "network_image_height:=640"]
    if mode in ("check", "rust", "ctypes", "cpp"):
        args = run.small()
    prefix = MEMCHECK if mode == "sanitizer" else ()
    if mode.startswith("batch_"):
        args += ["-r", "__ns:=/bb", "-p", INPUTS4, *k.cudaref_batch_args]
    if mode in ("gst_ref", "gst_topic"):
        # bench_handoff.py's path (b): the camera inside the node, live, 1080p at 30 Hz.
        args += ["-p", f'inputs:=["{gst_source("BGR", 1920, 1080, "30/1")}"]']
    if mode == "jpeg_ref":
        # bench_handoff.py's path (c): the same frames as JPEG q90 over DDS.
        bag = run.bags / JPEG_BAG
        args += ["-p", "image_transport:=compressed"]
    binary, fault = run.node_bin, ""
    if mode == "prev_ref":
        binary = PREV_DIR / "bin" / "vision_preproc_node"
    elif mode == "fault_retry":
        binary, fault = run.node_fi, "200:transient"
        args += ["-p", "gpu_failure_policy:=retry"]
    elif mode == "fault_fallback":
        binary, fault = run.node_fi, "200"
        args += ["-p", "gpu_failure_policy:=fallback"]
    elif mode == "fault_inflight":
        binary, fault = run.node_fi, "200:in_flight"
        args += ["-p", "gpu_failure_policy:=retry"]
    nlog = WORK / f"node_{tag}.log"
    node = run.node(args, nlog, binary=binary, env={INJECT_FAULT_ENV: fault} if fault else None, prefix=prefix)
    waits: list = []
    killer = None
    rec_dir = WORK / f"rec_{tag}"
    if mode == "check":
        # The demo bag as recorded (its stamps repeat per loop: compare_bags.py matches them).
        bag, stamps = run.demo_bag, []
        shutil.rmtree(rec_dir, ignore_errors=True)
        waits.append(run.spawn([run.cli, "record", rec_dir, "--duration", 13], WORK / f"rec_{tag}.log"))
        waits.append(run.consumer(tag, "both", 13))
    elif mode == "ctypes":
        # As check, the blocks imported through ctypes on libcuda.so.1 (not cuda-python).
        bag, stamps = run.demo_bag, []
        probe = subprocess.run(["python3", "-c", "from vision_preproc_consumer import cuda\n"
                                "d = cuda.driver(); print('VISION_PREPROC_CUDA_BINDING=ctypes: binding', d.name, "
                                "getattr(d, 'library', ''))"],
                               env=run.py312_env(VISION_PREPROC_CUDA_BINDING="ctypes"), capture_output=True,
                               text=True)
        print((probe.stdout + probe.stderr).rstrip())
        waits.append(run.consumer(tag, "both", 13, binding="ctypes"))
    elif mode == "rust":
        # The r2r consumer (CUDA blocks imported in Rust) and a recorder of tensor: stamp ->
        # FNV-1a 64 of the Tensor bytes (the example's hash), compared below.
        waits.append(run.spawn([run.consumer_bin, "/tensor_ref", 13, run.out / f"{tag}_refs.txt"],
                               run.out / f"{tag}.consumer.log"))
        waits.append(run.peer("tensor_hashes", run.out / f"{tag}_tensor.txt", 13,
                              log=run.out / f"{tag}_tensor.log"))
    elif mode in ("cpp", "cpp_bench"):
        # The C++ consumer on the socket, a Python one on the topic, and (cpp) a recorder of
        # tensor: stamp -> FNV-1a 64 of the Tensor bytes, compared below.
        waits.append(run.spawn([consumer_c(), "auto", 13, run.out / f"{tag}_refs.txt"],
                               run.out / f"{tag}.consumer.log"))
        waits.append(run.consumer(f"{tag}_py", "tensor_ref", 13))
        if mode == "cpp":
            waits.append(run.peer("tensor_hashes", run.out / f"{tag}_tensor.txt", 13,
                                  log=run.out / f"{tag}_tensor.log"))
    elif mode.startswith("fault_"):
        waits.append(run.consumer(tag, "tensor_ref", 13))
    elif mode == "debug":
        # debug_image beside a tensor_ref consumer: previews read back from the CUDA block.
        waits.append(run.consumer(tag, "tensor_ref", 13))
        waits.append(run.peer("debug_watch", 13, log=run.out / f"{tag}_debug.log"))
    elif mode == "example":
        waits.append(run.spawn(["python3", ROOT / "examples" / "tensor_ref_torch.py", "/tensor_ref", 13],
                               run.out / f"{tag}.consumer.log", env=run.py312_env()))
    elif mode in ("tensor", "tensor_ref", "tensor_ref_topic"):
        waits.append(run.consumer(f"{mode}_{trial}", mode, 13))
    elif mode in ("gst_ref", "jpeg_ref"):
        waits.append(run.consumer(f"{mode}_{trial}", "tensor_ref", 13))
    elif mode == "gst_topic":
        # Path (b), the consumer on the TensorRef topic's messages (not the socket's signal).
        waits.append(run.consumer(f"{mode}_{trial}", "tensor_ref_topic", 13))
    elif mode == "prev_ref":
        waits.append(run.consumer(f"{mode}_{trial}", "tensor_ref", 13))
    elif mode.startswith("batch_"):
        waits.append(run.consumer(f"{mode}_{trial}", mode[len("batch_"):], 13, "--ns", "/bb", "--batch"))
    elif mode == "slow":
        play_s = k.cudaref_slow_s
        waits.append(run.consumer(tag, "tensor_ref", play_s + 3, "--hold-ms", "500"))
    elif mode == "kill":
        # The holder takes a frame every 1.5 s (within the 2-s lease) and is killed while holding one.
        holder = run.consumer(f"{tag}_holder", "tensor_ref", 30, "--hold-ms", "1500")
        waits.append(run.consumer(tag, "tensor_ref", 13))

        def kill_holder() -> None:
            holder.kill()
            (run.out / f"{tag}_kill.txt").write_text(f"holder SIGKILLed at {time.time():.9f}\n")

        killer = threading.Timer(5.7, kill_holder)
        killer.start()
    elif mode == "sanitizer":
        play_s = 20
        waits.append(run.consumer(tag, "tensor_ref", 25))
    if mode.startswith("batch_"):
        waits += run.play_cameras("batched", "b", tag, "--duration", play_s, *k.cudaref_batch_play)
    elif mode in ("gst_ref", "gst_topic"):
        pass  # the camera is in the node
    else:
        waits.append(run.player(bag, tag, "--loop", *stamps, "--duration", play_s, "--wait-subscribers", 1))
    time.sleep(6)
    mem = run.mem(node)
    run.wait(*waits)
    if killer:
        killer.join()
    if mode == "sanitizer":
        # compute-sanitizer passes nothing on: the node is its child.
        for pid in children(node.proc.pid):
            os.kill(pid, signal.SIGTERM)
        rc = run.wait(node)[0]
    else:
        rc = run.stop_node(node)
    firsts = [lines_of(p)[0] for p in sorted(WORK.glob(f"play_{tag}*.log")) if lines_of(p)]
    print(f"{tag}: {''.join(f + ' ' for f in firsts)}; node {mem}, exit {rc}; "
          f"{nl(grep('stopped:.*', nlog, only=True))}")
    for line in grep(r"tensor_ref|ERROR SUMMARY|WARN|ERROR|gpu_failure|backend", nlog)[:12]:
        print(line[:300])
    if mode == "check":
        subprocess.run(["tar", "cf", str(run.out / f"{tag}_bag.tar"), "-C", str(WORK), f"rec_{tag}"], check=False)
        shutil.rmtree(rec_dir, ignore_errors=True)
    if mode == "sanitizer" or mode.startswith("fault_"):
        shutil.copy(nlog, run.out)
    if mode == "example":
        print(nl(lines_of(run.out / f"{tag}.consumer.log")[-3:]))
    if mode in ("check", "ctypes"):
        try:
            d = json.loads(text(run.out / f"{tag}.json"))
            print("consumer checks", d["checks"], "counts", d["counts"])
        except (ValueError, KeyError) as e:
            print(f"consumer checks: no result in {run.out / f'{tag}.json'} ({e!r})")
    if mode == "rust":
        con = run.out / f"{tag}.consumer.log"
        print(nl(grep("device address", con)[:1]))
        print(nl(lines_of(con)[-1:]))
        print(text(run.out / f"{tag}_tensor.log").rstrip())
        print(compare_hashes(run.out / f"{tag}_refs.txt", run.out / f"{tag}_tensor.txt"))
    if mode in ("cpp", "cpp_bench"):
        print(nl(lines_of(run.out / f"{tag}.consumer.log")[-4:]))
    if mode == "cpp":
        print(text(run.out / f"{tag}_tensor.log").rstrip())
        print(compare_hashes(run.out / f"{tag}_refs.txt", run.out / f"{tag}_tensor.txt", "C++"))
    if mode == "debug":
        print(nl(lines_of(run.out / f"{tag}_debug.log")[-3:]))


def consumer_c() -> Path:
    """cudaref `cpp`: consumer_c and its example built here (the machine's cmake and g++)."""
    build = WORK / "consumer_c"
    for cmd in (["cmake", "-S", ROOT / "consumer_c", "-B", build, "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", build, "-j", "8"]):
        subprocess.run([str(c) for c in cmd], check=True, stdout=subprocess.DEVNULL)
    return build / "tensor_ref_consumer_cpp"


def compare_hashes(refs: Path, tensors: Path, who: str = "Rust") -> str:
    """cudaref `rust`, `cpp`: stamp -> FNV-1a 64 of the tensor the consumer copied from its
    imported CUDA block against that of the Tensor message of the same stamp."""
    def read(path: Path) -> dict[int, set[str]]:
        out: dict[int, set[str]] = {}
        for line in text(path).splitlines():
            if line.strip():
                stamp, fnv = line.split()[:2]
                out.setdefault(int(stamp), set()).add(fnv)
        return out

    r, t = read(refs), read(tensors)
    both = sorted(set(r) & set(t))
    equal = sum(r[s] == t[s] for s in both)
    return (f"{who.lower()}: {equal} of {len(both)} frames' hashes matched (FNV-1a 64 of the tensor the {who} consumer copied "
            f"from its imported CUDA block vs of the Tensor message of the same stamp); {len(both) - equal} differ; "
            f"{len(r)} stamps read from blocks, {len(t)} Tensor messages")


def fnv1a64(data: bytes) -> int:
    h = 0xcbf29ce484222325
    for x in data:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


# --- rclpy peers (run with the py312 bundle's environment) --------------------------------

def peer_tensor_hashes(path: str, seconds: str) -> int:
    """cudaref `rust`: stamp -> FNV-1a 64 of the bytes of every /tensor for `seconds`, into `path`."""
    import rclpy
    from vision_preproc_msgs.msg import Tensor

    rclpy.init()
    n = rclpy.create_node("tensor_hashes")
    got = []
    n.create_subscription(Tensor, "/tensor", lambda m: got.append(
        (m.header.stamp.sec * 10**9 + m.header.stamp.nanosec, bytes(m.data))), 50)
    t0 = time.time()
    while time.time() - t0 < float(seconds):
        rclpy.spin_once(n, timeout_sec=0.1)
    with open(path, "w") as f:
        for stamp, data in got:
            f.write(f"{stamp} {fnv1a64(data):016x}\n")
    print(f"tensor: {len(got)} messages")
    return 0


def peer_debug_watch(seconds: str) -> int:
    """cudaref `debug`: the /debug_image previews for `seconds`: count, size, mean pixel."""
    import numpy as np
    import rclpy
    from sensor_msgs.msg import Image

    rclpy.init()
    n = rclpy.create_node("debug_watch")
    got = []
    n.create_subscription(Image, "/debug_image", got.append, 10)
    t0 = time.time()
    while time.time() - t0 < float(seconds):
        rclpy.spin_once(n, timeout_sec=0.1)
    means = [float(np.frombuffer(bytes(m.data), np.uint8).mean()) for m in got]
    print(f"debug_image: {len(got)} images", (got[-1].width, got[-1].height, got[-1].encoding) if got else "",
          "mean pixel", [round(x, 1) for x in means[-5:]])
    return 0


PEERS: dict[str, Callable[..., int]] = {"tensor_hashes": peer_tensor_hashes, "debug_watch": peer_debug_watch}
