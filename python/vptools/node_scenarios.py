"""The ROS node on the GPU machine: its scenarios, one function each
(scripts/device/gpu_node_remote.py is the command line).

Here first: scripts/device/gpu_node_stage.sh (the node, the CLI and their ROS 2 libraries
-> .device/ros.tar.xz; the GStreamer the node links -> .device/gst.tar.xz; input bags ->
.device/node_bags.tar.xz; the demo bag -> .device/bag; for `cudaref`,
scripts/device/py312_bundle.sh -> .device/py312.tar.xz). Then there (CUDA, no ROS), from
the repository root, carrying .device:

    PYTHONPATH=python python3 scripts/device/gpu_node_remote.py [scenario ...]
    (default: healthy fallback retry exit latency startup; --list: every scenario)

The driver runs on the machine's python3 with the standard library alone; the consumers
that need rclpy run on the same python3 with the py312 bundle's environment. Real DDS
(Fast DDS, loopback, ROS_DOMAIN_ID 21 unless set) between processes: `vision_preproc
play` (camera), the node, `vision_preproc record` (subscriber; prints /diagnostics changes
and latency). Each scenario's function says what it runs.

Knobs (environment): OUT (the results folder, /tmp/vp_out), TRIALS (the trials of each
repeated measurement; default the scenario's own, 2 or 3), LATENCY_SIZES ("1280x720
1920x1080"), HANDOFF_BACKEND, HANDOFF_SPIN_MS, CUDAREF_MODES, CUDAREF_SLOW_S,
CUDAREF_BATCH_ARGS, CUDAREF_BATCH_PLAY, PLAYERS (3), PROFILE_SIDES, SWEEP_RATES,
SWEEP_SIDES, SWEEP_BACKEND (their meanings: the functions that read them). A value
outside its set is refused before anything runs.

Without a GPU (a dry run here): `--backend cpu` (or BACKEND=cpu) gives every node the CPU backend
(HANDOFF_BACKEND and SWEEP_BACKEND default to it); `--bin DIR` runs the binaries in DIR
(target/release, or an unpacked bundle's bin/) with the ROS 2 of the calling shell
(`source .ros/env.sh`) instead of unpacking ros.tar.xz; `--stage DIR` reads the staged
files from DIR instead of .device.

Outputs: $OUT/<scenario>.log; the recorded bags of healthy, fallback, retry (and of
handoff's and cudaref's byte checks) as $OUT/<name>_bag.tar (compare with an offline CPU
replay here: scripts/device/compare_bags.py); JSON per run. Exit status 1 when a check
failed, 2 when the command line is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from vptools import ROOT, fastdds
from vptools.procs import INJECT_FAULT_ENV, NodeProcess, children, rss_mb, shell_status

#: Where the bundle is unpacked (bin/, lib/, COMMIT; bags/, py312/ and gst/ beside them).
ROS_DIR = Path("/tmp/vp_ros")
#: GStreamer for the nodes' `gst:` inputs (scripts/device/gst_bundle.sh), when staged.
GST_DIR = ROS_DIR / "gst"
#: What the GStreamer bundle's env.sh unsets: GStreamer reads the *_1_0 names first.
GST_UNSET = ("GST_PLUGIN_PATH", "GST_PLUGIN_PATH_1_0", "GST_PLUGIN_SYSTEM_PATH_1_0", "GST_PLUGIN_SCANNER_1_0",
             "GST_REGISTRY_1_0")
#: The previous release's bundle (`single`, cudaref's `prev`).
PREV_DIR = Path("/tmp/vp_prev")
#: The processes' logs and the recorded bags (bags of the batch scenario in /dev/shm).
WORK = Path("/tmp/vp_work")
SHM = Path("/dev/shm")
KERNEL_CACHE = Path("/tmp/vp_kernel_cache")
CONFIG = ROOT / "config" / "default.yaml"
PROFILE = ROOT / "config" / "fastdds_large_frames.xml"
THREAD_CPU = ROOT / "scripts" / "device" / "thread_cpu.py"
DOMAIN = "21"
INPUTS4 = "inputs:=[cam0/image, cam1/image, cam2/image, cam3/image]"
#: The node under compute-sanitizer memcheck (the sanitizer parts' prefix).
MEMCHECK = ("compute-sanitizer", "--tool", "memcheck", "--print-limit", "20")
INPUTS2 = "inputs:=[cam0/image, cam1/image]"
#: `camera`'s parity: one node per group, one live 1920x1080 pipeline per format (5 Hz).
GST_GROUPS = (("BGR", "RGB", "BGRx", "BGRA", "RGBx", "RGBA", "GRAY8", "GRAY16_LE", "GRAY16_BE"),
              ("YUY2", "UYVY", "NV12", "NV21", "rggb", "bggr", "gbrg", "grbg"))
#: `camera`'s backends: (label, node parameters).
#: `compressed`'s bag in node_bags.tar.xz: bgr8_1920x1080's frames as JPEG q90 4:2:0
#: (sensor_msgs/CompressedImage, scripts/device/gpu_node_bags.py).
JPEG_BAG = "jpeg90_1920x1080"
GST_MODES = (("cuda_upload", ("-p", "backend:=cuda", "-p", "memory_mode:=upload")),
             ("cuda_mapped", ("-p", "backend:=cuda", "-p", "memory_mode:=mapped")),
             ("cpu", ("-p", "backend:=cpu")))


def gst_source(fmt: str, w: int, h: int, rate: str = "5/1", live: bool = True, num_buffers: int = -1) -> str:
    """A `gst:` input: videotestsrc's 75 % colour bars (`smpte75`: the same picture in every
    frame, unlike `smpte`, whose corner is noise) in `fmt` (a Bayer order through
    rgb2bayer); `rate` "" for a source that is not live and runs as fast as it is taken;
    `num_buffers` -1: no end. The one description of the test camera for the GPU
    scenarios, bench/bench_handoff.py and test/ros/test_camera.py."""
    src = f"videotestsrc is-live={str(live).lower()} num-buffers={num_buffers} pattern=smpte75"
    caps = f"width={w},height={h}" + (f",framerate={rate}" if rate else "")
    if fmt in ("rggb", "bggr", "gbrg", "grbg"):
        return f"gst:{src} ! video/x-raw,format=ARGB,{caps} ! rgb2bayer ! video/x-bayer,format={fmt}"
    return f"gst:{src} ! video/x-raw,format={fmt},{caps}"


DEFAULT_SCENARIOS = ("healthy", "fallback", "retry", "exit", "latency", "startup")
#: Every mode of `cudaref` (CUDAREF_MODES), and those it runs by default.
CUDAREF_MODES = ("check", "bench", "slow", "kill", "sanitizer", "batch", "fault_retry", "fault_fallback",
                 "fault_inflight", "example", "debug", "rust", "ctypes", "prev")
CUDAREF_DEFAULT = ("check", "bench", "slow", "kill", "sanitizer", "batch", "rust", "ctypes")
#: The sides of `batch`, `batchmax` and `profile` (SWEEP_SIDES, PROFILE_SIDES).
SIDES = ("batched", "batched_own", "pairs", "separate")
BACKENDS = ("cuda", "cpu")
SWEEP_RATES = ("1", "2", "4", "6", "8", "max")


class Refused(ValueError):
    """A command line or knob this module does not run (exit status 2)."""


# --- The plan: scenarios and knobs, checked before anything runs ----------------------

@dataclass
class Knobs:
    backend: str = "cuda"
    sweep_backend: str = "cuda"
    handoff_backend: str = "cuda"
    handoff_spin_ms: str = ""
    trials: int | None = None
    latency_sizes: tuple[str, ...] = ("1280x720", "1920x1080")
    cudaref_modes: tuple[str, ...] = CUDAREF_DEFAULT
    camera_parts: tuple[str, ...] = ("parity", "sanitizer", "bench", "max")
    compressed_parts: tuple[str, ...] = ("parity", "sanitizer", "bench", "batch")
    cudaref_slow_s: int = 20
    cudaref_batch_args: tuple[str, ...] = ()
    cudaref_batch_play: tuple[str, ...] = ()
    players: int = 3
    profile_sides: tuple[str, ...] = ("batched", "separate")
    sweep_sides: tuple[str, ...] = ("batched", "separate")
    sweep_rates: tuple[str, ...] = SWEEP_RATES

    def n(self, default: int) -> range:
        """Trial numbers 1..TRIALS (the scenario's `default` when TRIALS is not set)."""
        return range(1, (self.trials or default) + 1)


def _words(env: Mapping[str, str], name: str, default: tuple[str, ...], allowed: tuple[str, ...] | None,
           what: str) -> tuple[str, ...]:
    words = tuple(env[name].split()) if env.get(name, "").strip() else default
    bad = [w for w in words if allowed is not None and w not in allowed]
    if bad:
        raise Refused(f"{name}: unknown {what} {' '.join(bad)} (known: {' '.join(allowed)})")
    return words


def _int(env: Mapping[str, str], name: str, default: int | None, low: int = 1) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < low:
        raise Refused(f"{name}={raw}: a whole number >= {low}")
    return int(raw)


def knobs_from(env: Mapping[str, str], backend: str = "cuda") -> Knobs:
    """The knobs of `env` (the environment variables above), checked."""
    if backend not in BACKENDS:
        raise Refused(f"--backend {backend}: use {' or '.join(BACKENDS)}")
    k = Knobs(backend=backend)
    k.sweep_backend = _words(env, "SWEEP_BACKEND", (backend,), BACKENDS, "backend")[0]
    k.handoff_backend = _words(env, "HANDOFF_BACKEND", (backend,), BACKENDS, "backend")[0]
    spin = _int(env, "HANDOFF_SPIN_MS", None, low=0)
    k.handoff_spin_ms = "" if spin is None else str(spin)
    k.trials = _int(env, "TRIALS", None)
    sizes = _words(env, "LATENCY_SIZES", k.latency_sizes, None, "size")
    bad = [s for s in sizes if s not in ("1280x720", "1920x1080")]
    if bad:
        raise Refused(f"LATENCY_SIZES: no staged bag of {' '.join(bad)} "
                      "(node_bags.tar.xz holds 1280x720 and 1920x1080)")
    k.latency_sizes = sizes
    k.cudaref_modes = _words(env, "CUDAREF_MODES", CUDAREF_DEFAULT, CUDAREF_MODES, "mode")
    k.camera_parts = _words(env, "CAMERA_PARTS", k.camera_parts, (*k.camera_parts, "restarts"), "part")
    k.compressed_parts = _words(env, "COMPRESSED_PARTS", k.compressed_parts, k.compressed_parts, "part")
    k.cudaref_slow_s = _int(env, "CUDAREF_SLOW_S", 20)
    k.cudaref_batch_args = tuple(shlex.split(env.get("CUDAREF_BATCH_ARGS", "")))
    k.cudaref_batch_play = tuple(shlex.split(env.get("CUDAREF_BATCH_PLAY", "")))
    k.players = _int(env, "PLAYERS", 3)
    k.profile_sides = _words(env, "PROFILE_SIDES", k.profile_sides, SIDES, "side")
    k.sweep_sides = _words(env, "SWEEP_SIDES", k.sweep_sides, SIDES, "side")
    rates = _words(env, "SWEEP_RATES", SWEEP_RATES, None, "rate")
    bad = [r for r in rates if r != "max" and not re.fullmatch(r"\d+(\.\d+)?", r)]
    if bad:
        raise Refused(f"SWEEP_RATES: {' '.join(bad)} is not a multiple of the bag's 30 Hz nor `max`")
    k.sweep_rates = rates
    return k


def plan(names: list[str], env: Mapping[str, str], backend: str = "cuda") -> tuple[list[str], Knobs]:
    """The scenarios to run, in order (the default set for none), and the knobs; Refused
    for an unknown scenario or a knob outside its set."""
    names = list(names) or list(DEFAULT_SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise Refused(f"unknown scenario {' '.join(unknown)} (scenarios: {' '.join(SCENARIOS)})")
    return names, knobs_from(env, backend)


# --- Small readers --------------------------------------------------------------------

def text(path: Path) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def lines_of(*paths: Path) -> list[str]:
    return [line for p in paths for line in text(p).splitlines()]


def grep(pattern: str, *paths: Path, only: bool = False) -> list[str]:
    """The lines of `paths` matching `pattern` (only: the matched parts, as `grep -o`)."""
    rx = re.compile(pattern)
    if only:
        return [m.group(0) for line in lines_of(*paths) for m in rx.finditer(line)]
    return [line for line in lines_of(*paths) if rx.search(line)]


def nl(items: list[str]) -> str:
    return "\n".join(items)


def played(*paths: Path) -> list[str]:
    """`play: N images` of each player's log."""
    return grep(r"play: [0-9]* images", *paths, only=True)


def sent(*paths: Path) -> int:
    return sum(int(x.split()[1]) for x in played(*paths))


def tag_logs(prefix: str, tag: str) -> list[Path]:
    """WORK/<prefix>_<tag>.log and the per-process WORK/<prefix>_<tag>_<k>.log, in order."""
    own = WORK / f"{prefix}_{tag}.log"
    return ([own] if own.exists() else []) + sorted(WORK.glob(f"{prefix}_{tag}_[0-9].log"))


def sweep_summary(side: str, rate: str, plays: list[Path], nodes: list[Path], recs: list[Path]) -> str:
    """One line of `batchmax`: frames sent / received / published / dropped per side and
    rate, published frames/s over the 6 s, the subscribers' tensors/s and node-added p50/p99."""
    sent_n = sum(int(m) for f in plays for m in re.findall(r"play: (\d+) images", text(f)))
    tot = {"received": 0, "published": 0, "dropped": 0, "rejected": 0, "failed": 0}
    for f in nodes:
        m = re.search(r"stopped: (\d+) frames received, (\d+) published, (\d+) dropped.*?(\d+) rejected.*?(\d+) failed",
                      text(f))
        for k, v in zip(tot, m.groups() if m else [0] * 5):
            tot[k] += int(v)
    rx = re.compile(r"node-added p50 ([\d.na]+) ms, p99 ([\d.na]+) ms; ([\d.]+) tensors/s", re.I)
    lat = [rx.search(text(f)) for f in recs]
    added = " ".join(f"{m.group(1)}/{m.group(2)}" if m else "?" for m in lat)
    tps = sum(float(m.group(3)) for m in lat if m)
    hz = "max" if rate == "max" else f"{30 * float(rate):g} Hz"
    return (f"sweep {side} {hz}: sent {sent_n}, received {tot['received']}, published {tot['published']}, "
            f"dropped {tot['dropped']}, rejected {tot['rejected']}, failed {tot['failed']}; "
            f"published {tot['published'] / 6:.0f} frames/s; subscribers {tps:.1f} tensors/s; "
            f"node-added p50/p99 ms {added}")


def compare_hashes(refs: Path, tensors: Path) -> str:
    """cudaref `rust`: stamp -> FNV-1a 64 of the tensor the Rust consumer copied from its
    imported CUDA block against that of the Tensor message of the same stamp."""
    def read(path: Path) -> dict[int, set[str]]:
        out: dict[int, set[str]] = {}
        for line in text(path).splitlines():
            if line.strip():
                stamp, fnv = line.split()
                out.setdefault(int(stamp), set()).add(fnv)
        return out

    r, t = read(refs), read(tensors)
    both = sorted(set(r) & set(t))
    equal = sum(r[s] == t[s] for s in both)
    return (f"rust: {equal} of {len(both)} frames' hashes matched (FNV-1a 64 of the tensor the Rust consumer copied "
            f"from its imported CUDA block vs of the Tensor message of the same stamp); {len(both) - equal} differ; "
            f"{len(r)} stamps read from blocks, {len(t)} Tensor messages")


def fnv1a64(data: bytes) -> int:
    h = 0xcbf29ce484222325
    for x in data:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


class _Tee:
    """stdout to the terminal and a scenario's log (what `| tee $OUT/<scenario>.log` did)."""

    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, s: str) -> int:
        for st in self.streams:
            st.write(s)
            st.flush()
        return len(s)

    def flush(self) -> None:
        for st in self.streams:
            st.flush()


# --- One invocation: where things are, the processes, the failures ---------------------

class Run:
    def __init__(self, knobs: Knobs, out: Path, stage: Path, bin_dir: Path | None = None) -> None:
        self.k = knobs
        self.out = out
        self.stage = stage
        self.bin_dir = bin_dir
        self.failures: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.warmed = False
        # The rclpy executor of bench_handoff.py's consumers: single | events.
        self.executor = "single"
        self._py312: dict | None = None
        self.gst = False

    # Set-up ---------------------------------------------------------------------------
    def prepare(self) -> None:
        """Unpack the bundle and the bags, and set the environment every process inherits."""
        self.out.mkdir(parents=True, exist_ok=True)
        for d in (ROS_DIR, WORK):
            shutil.rmtree(d, ignore_errors=True)
        (ROS_DIR / "bags").mkdir(parents=True)
        WORK.mkdir(parents=True)
        env = os.environ
        if self.bin_dir is None:
            self.untar(self.stage / "ros.tar.xz", ROS_DIR, required=True)
            bins = ROS_DIR / "bin"
            self.commit = text(ROS_DIR / "COMMIT").strip() or "?"
            env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(ROS_DIR / "lib"), env.get("LD_LIBRARY_PATH")]))
            # The GPU machine's own NVRTC, not the path of the machine that staged.
            env.pop("VISION_PREPROC_NVRTC_DIR", None)
        else:
            bins = self.bin_dir.resolve()
            self.commit = f"{bins} (local)"
        if (self.stage / "node_bags.tar.xz").exists():
            self.untar(self.stage / "node_bags.tar.xz", ROS_DIR / "bags")
        # The node links GStreamer, which the GPU machine lacks (the ROS bundle carries only
        # the libraries of .ros/); only the nodes get it (node()), the other processes keep
        # the machine's glib-free environment.
        if (self.stage / "gst.tar.xz").exists():
            self.gst = self.untar(self.stage / "gst.tar.xz", GST_DIR, required=True)
        self.bags = ROS_DIR / "bags"
        self.demo_bag = self.stage / "bag"
        if not self.demo_bag.exists() and self.bin_dir is not None:
            self.demo_bag = ROOT / ".ros" / "sample_bag"
        self.node_bin = bins / "vision_preproc_node"
        self.cli = bins / "vision_preproc"
        # The node with the test hooks: the bundle's name, or cargo's folder beside release/.
        self.node_fi = next((p for p in (bins / "vision_preproc_node_fault_injection",
                                         bins.parent / "fault-injection" / "vision_preproc_node") if p.exists()),
                            bins / "vision_preproc_node_fault_injection")
        self.consumer_bin = next((p for p in (bins / "tensor_ref_consumer", bins / "examples" / "tensor_ref_consumer")
                                  if p.exists()), bins / "tensor_ref_consumer")
        env["RMW_IMPLEMENTATION"] = "rmw_fastrtps_cpp"
        env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
        env.setdefault("ROS_DOMAIN_ID", DOMAIN)
        env["ROS_LOG_DIR"] = "/tmp/vp_roslog"
        env.setdefault("HOME", "/tmp")
        # The profile under the name the loaded Fast DDS reads (2.x, Jazzy: only the old name).
        profiled = fastdds.with_profile(dict(env), PROFILE)
        env.clear()
        env.update(profiled)
        env["VISION_PREPROC_KERNEL_CACHE"] = str(KERNEL_CACHE)

    def gst_env(self) -> dict:
        """The variables of the GStreamer bundle's env.sh but PATH (a node runs no GStreamer
        tool): its libraries first, its plugins alone, its scanner, a registry of its own."""
        return {"LD_LIBRARY_PATH": ":".join(filter(None, [str(GST_DIR / "lib"), os.environ.get("LD_LIBRARY_PATH")])),
                "GST_PLUGIN_SYSTEM_PATH": str(GST_DIR / "lib" / "gstreamer-1.0"),
                "GST_PLUGIN_SCANNER": str(GST_DIR / "libexec" / "gst-plugin-scanner"),
                "GST_REGISTRY": "/tmp/vp_gst_registry.bin"}

    def untar(self, tarball: Path, into: Path, required: bool = False) -> bool:
        into.mkdir(parents=True, exist_ok=True)
        p = subprocess.run(["tar", "xJf", str(tarball), "-C", str(into)], capture_output=True, text=True)
        if p.returncode != 0 and required:
            raise SystemExit(f"gpu_node_remote: cannot unpack {tarball}: {p.stderr.strip()}")
        return p.returncode == 0

    # Results --------------------------------------------------------------------------
    def fail(self, message: str) -> None:
        print(message)
        self.failures.append(message)

    @contextlib.contextmanager
    def tee(self, name: str):
        with open(self.out / f"{name}.log", "w") as f, contextlib.redirect_stdout(_Tee(sys.stdout, f)):
            yield

    # Processes ------------------------------------------------------------------------
    def spawn(self, cmd: list, log: Path | None, env: dict | None = None,
              limit: float | None = None) -> subprocess.Popen:
        """A process in the background, its output in `log`; `limit`: seconds after which a
        wait for it stops it (what `timeout 60` did)."""
        if self.gst and str(cmd[0]).startswith(str(ROS_DIR / "bin")):
            # The bundle's binaries link GStreamer (the CLI's `info` names its version).
            env = {k: v for k, v in {**os.environ, **self.gst_env(), **(env or {})}.items() if k not in GST_UNSET}
        with open(log, "w") if log else open(os.devnull, "w") as out:
            p = subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, env=env)
        p.deadline = time.monotonic() + limit if limit else None  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def node(self, args: list, log: Path, binary: Path | None = None, env: dict | None = None,
             prefix: tuple[str, ...] = ()) -> NodeProcess:
        if self.gst:
            env = {**self.gst_env(), **(env or {})}
        n = NodeProcess([str(a) for a in args], binary=binary or self.node_bin, env=env, log=log,
                        unset=GST_UNSET if self.gst else (), prefix=prefix).start()
        self.procs.append(n.proc)
        return n

    def player(self, bag: Path, tag: str, *args, log: Path | None = None,
               limit: float | None = None) -> subprocess.Popen:
        return self.spawn([self.cli, "play", bag, *args], log or WORK / f"play_{tag}.log", limit=limit)

    @staticmethod
    def popen(p) -> subprocess.Popen:
        return p.proc if isinstance(p, NodeProcess) else p

    def wait(self, *procs) -> list[int]:
        """Each to its end (`wait`); a process with a limit is stopped there (SIGTERM)."""
        codes = []
        for p in map(self.popen, procs):
            deadline = getattr(p, "deadline", None)
            try:
                p.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.terminate()
                p.wait()
            codes.append(shell_status(p.returncode))
        return codes

    def term(self, *procs) -> None:
        for p in map(self.popen, procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def stop_or_kill(self, what: str, *procs) -> None:
        """Wait up to 15 s for each (SIGTERM already sent), then SIGKILL: a failure."""
        for p in map(self.popen, procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                self.fail(f"  {what} {p.pid} did not exit 15 s after SIGTERM: killed")

    def stop_side(self, plays, nodes, recs) -> None:
        """A side's run is over: its players end, then its nodes and its subscribers stop
        (SIGTERM, then SIGKILL after 15 s, a failure). The subscribers stop after the nodes:
        their --duration is only a bound (the first node on a freshly started GPU machine
        spends ~18 s opening its backend)."""
        self.wait(*plays)
        time.sleep(1)
        self.term(*nodes)
        self.stop_or_kill("node", *nodes)
        self.term(*recs)
        self.stop_or_kill("subscriber", *recs)

    def stop_node(self, node: NodeProcess) -> int:
        """SIGTERM if it still runs, then its exit status."""
        self.term(node)
        return self.wait(node)[0]

    def reap(self) -> None:
        """After a scenario: nothing of it may run into the next (SIGKILL what is left)."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.procs.clear()

    def mem(self, p) -> str:
        """`rss_mb R gpu_mb G` of a process (G from nvidia-smi; ? where unknown)."""
        pid = self.popen(p).pid
        r = rss_mb(pid)
        gpu = "?"
        try:
            q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=30).stdout
            gpu = next((line.split(", ")[1] for line in q.splitlines() if line.split(", ")[0] == str(pid)), "?")
        except (OSError, subprocess.TimeoutExpired, IndexError):
            pass
        return f"rss_mb {r['VmRSS']:.1f} gpu_mb {gpu}" if r else f"rss_mb ? gpu_mb {gpu}"

    def threads(self, seconds: float, label: str, *procs) -> None:
        """Each thread's share of a core over the next `seconds` (scripts/device/thread_cpu.py)."""
        pids = [str(self.popen(p).pid) for p in procs]
        r = subprocess.run([sys.executable, str(THREAD_CPU), str(seconds), *pids], capture_output=True, text=True)
        for line in (r.stdout + r.stderr).splitlines():
            print(f"  {label} {line}")

    def warm_up(self) -> None:
        """Once: the first node on a fresh machine spends ~18 s opening the backend (NVRTC's
        first use on the VM), which would eat into the first trial."""
        if self.warmed:
            return
        self.warmed = True
        log = WORK / "node_warmup.log"
        node = self.node(["-r", "__ns:=/warmup", "-p", f"backend:={self.k.sweep_backend}"], log)
        t = 0
        for t in range(1, 601):
            if f"backend {self.k.sweep_backend}" in text(log):
                break
            time.sleep(0.1)
        print(f"warm-up: node backend open after ~{t // 10} s")
        self.stop_node(node)

    def py312_env(self, **extra: str) -> dict:
        """The environment of a consumer: this one plus the py312 bundle's env.sh (the node
        keeps ROS_DIR/lib alone)."""
        if self._py312 is None:
            out = subprocess.run(["bash", "-c", f'source "{ROS_DIR}/py312/env.sh" && env -0'],
                                 capture_output=True, check=True).stdout.decode()
            self._py312 = dict(kv.split("=", 1) for kv in out.split("\0") if "=" in kv)
        return {**self._py312, "ROS_DOMAIN_ID": os.environ["ROS_DOMAIN_ID"], **extra}

    def consumer(self, tag: str, topic: str, seconds: int, *args: str, binding: str = "") -> subprocess.Popen:
        """bench/bench_handoff.py's PyTorch consumer of `topic` (tensor, tensor_ref, both)
        in the background; `binding`: its VISION_PREPROC_CUDA_BINDING (ctypes|cuda-python)."""
        env = self.py312_env(**({"VISION_PREPROC_CUDA_BINDING": binding} if binding else {}))
        if self.executor != "single":  # (its files: <executor>_<tag>)
            tag, args = f"{self.executor}_{tag}", (*args, "--executor", self.executor)
        return self.spawn(["python3", ROOT / "bench" / "bench_handoff.py", "--consumer", topic, "--torch", "--seconds",
                           seconds, "--ns", "/", "--out", self.out / f"{tag}.json", *args],
                          self.out / f"{tag}.consumer.log", env=env)

    def peer(self, name: str, *args, log: Path) -> subprocess.Popen:
        """One of this module's rclpy peers (PEERS) with the py312 bundle's rclpy."""
        env = self.py312_env()
        env["PYTHONPATH"] = f"{env.get('PYTHONPATH', '')}:{ROOT / 'python'}".lstrip(":")
        return self.spawn(["python3", "-m", "vptools.node_scenarios", "--peer", name, *args], log, env=env)

    def small(self) -> list[str]:
        """64x48 and a 5x5 gaussian conv2d: the byte checks' network."""
        return ["-p", f"backend:={self.k.backend}", "-p", "network_image_width:=64", "-p", "network_image_height:=48",
                "-p", "conv.kernel:=gaussian", "-p", "conv.size:=5", "-p", "output_qos_depth:=50"]

    def nvidia_smi(self, query: str) -> None:
        try:
            r = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv"], capture_output=True, text=True,
                               timeout=60)
            print((r.stdout + r.stderr).rstrip())
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"nvidia-smi: {e}")

    # Pieces shared by scenarios ---------------------------------------------------------
    def fault_run(self, sc: str, fault: str, policy: str) -> None:
        """The small network on the demo bag (as recorded, looped 4 s) with a recorder of
        tensors and /diagnostics; `fault`: the node with the test hooks and that injection.
        The node's exit status must be 0 (1 for `exit`); the bag goes to $OUT."""
        log = self.out / f"{sc}.log"
        rec_dir = WORK / f"rec_{sc}"
        shutil.rmtree(rec_dir, ignore_errors=True)
        head = (f"==== {sc}: {f'{INJECT_FAULT_ENV}={fault}' if fault else 'no fault'}, gpu_failure_policy {policy} "
                f"({time.strftime('%H:%M:%S', time.gmtime())} UTC, commit {self.commit})")
        rec = self.spawn([self.cli, "record", rec_dir, "--duration", 9, "--diagnostics"], WORK / f"rec_{sc}.log")
        time.sleep(1)
        node = self.node([*self.small(), "-p", f"gpu_failure_policy:={policy}"], WORK / f"node_{sc}.log",
                         binary=self.node_fi if fault else self.node_bin,
                         env={INJECT_FAULT_ENV: fault} if fault else None)
        self.wait(self.player(self.demo_bag, sc, "--loop", "--duration", 4, "--wait-subscribers", 1))
        self.wait(rec)
        rc = self.stop_node(node)
        body = [head, *lines_of(WORK / f"node_{sc}.log", WORK / f"play_{sc}.log", WORK / f"rec_{sc}.log"),
                f"node exit code {rc}"]
        log.write_text(nl(body) + "\n")
        for line in body:
            print(line[:400])
        expected = 1 if sc == "exit" else 0
        if rc != expected:
            self.fail(f"UNEXPECTED exit code {rc} (expected {expected})")
        if sc != "exit":
            subprocess.run(["tar", "cf", str(self.out / f"{sc}_bag.tar"), "-C", str(WORK), f"rec_{sc}"], check=False)

    def start_side(self, side: str, letter: str, tag: str,
                   mode: str) -> tuple[list[NodeProcess], list[subprocess.Popen]]:
        """One node with 4 inputs (namespace /<letter>b; batched_own: input_participants
        per_input), two with 2 inputs each (pairs, /<letter>p0..1) or 4 single-camera nodes
        (separate, /<letter>s0..3), 640x640 letterbox, and a `record` per tensor topic (a bag
        in /dev/shm for mode `bag`, else --count-only)."""
        net = ["-p", f"backend:={self.k.sweep_backend}", "-p", "network_image_width:=640",
               "-p", "network_image_height:=640"]
        nodes, recs = [], []

        def record(name: str, ns: str, json_path: Path, *batch: str) -> None:
            out = [SHM / f"rec_{name}"] if mode == "bag" else ["--count-only"]
            recs.append(self.spawn([self.cli, "record", *out, *batch, "--tensor-topic", f"{ns}/tensor",
                                    "--timing-topic", f"{ns}/timing", "--duration", 60, "--json", json_path],
                                   WORK / f"rec_{name}.log"))

        if side in ("batched", "batched_own"):
            own = ["-p", "input_participants:=per_input"] if side == "batched_own" else []
            nodes.append(self.node(["-r", f"__ns:=/{letter}b", "--params-file", CONFIG, *net, *own, "-p", INPUTS4],
                                   WORK / f"node_{tag}.log"))
            record(tag, f"/{letter}b", self.out / f"{tag}.json", "--batch")
        elif side == "pairs":
            for k in range(2):
                nodes.append(self.node(["-r", f"__ns:=/{letter}p{k}", "--params-file", CONFIG, *net, "-p", INPUTS2],
                                       WORK / f"node_{tag}_{k}.log"))
                record(f"{tag}_{k}", f"/{letter}p{k}", self.out / f"{tag}_{k}.json", "--batch")
        else:
            for k in range(4):
                nodes.append(self.node(["-r", f"__ns:=/{letter}s{k}", "--params-file", CONFIG, *net],
                                       WORK / f"node_{tag}_{k}.log"))
                record(f"{tag}_{k}", f"/{letter}s{k}", self.out / f"{tag}_{k}.json")
        return nodes, recs

    def play_cameras(self, side: str, letter: str, tag: str, *args) -> list[subprocess.Popen]:
        """The 4 cameras of start_side's side (1080p bgr8, restamped), started 0-80 ms apart
        (phases not aligned, as real cameras), each stopped at 60 s at the latest."""
        plays = []
        for k in range(4):
            topic = f"/{letter}b/cam{k}/image"
            if side == "separate":
                topic = f"/{letter}s{k}/image"
            elif side == "pairs":
                topic = f"/{letter}p{k // 2}/cam{k % 2}/image"
            info = topic[:-len("image")] + "camera_info"
            plays.append(self.player(self.bags / "bgr8_1920x1080", f"{tag}_{k}", "--loop", "--restamp", *args,
                                     "--image-topic", topic, "--camera-info-topic", info, "--wait-subscribers", 1,
                                     limit=60))
            time.sleep(random.randrange(9) / 100)
        return plays

    def single_max(self, rel: str, bins: Path, trial: int, *node_args: str) -> None:
        """PLAYERS players `--max` into one single-camera node (1080p -> 640x640) for 6 s:
        published frames/s, each thread's CPU, the subscriber's node-added latency."""
        tag, ns = f"single_{rel}_{trial}", f"/s{trial}{rel}"
        node = self.max_node(tag, ns, *node_args, binary=bins / "vision_preproc_node")
        plays = [self.player(self.bags / "bgr8_1920x1080", f"{tag}_{k}", "--loop", "--restamp", "--max",
                             "--duration", 6, "--image-topic", f"{ns}/image", "--camera-info-topic",
                             f"{ns}/camera_info", "--wait-subscribers", 1, limit=60)
                 for k in range(1, self.k.players + 1)]
        nlog, rate = self.max_window(tag, ns, node, f"{rel} node", plays)
        print(f"single {rel} trial {trial} (--max, {self.k.players} players): sent "
              f"{sent(*tag_logs('play', tag))}; {nl(grep('stopped:.*', nlog, only=True))}; published/s {rate}")
        for line in grep("node-added", WORK / f"rec_{tag}.log"):
            print(f"  {rel} {line}")

    def gst_max(self, trial: int) -> None:
        """The camera inside the node at its highest rate: a 1920x1080 BGR source that is not
        live (frames as fast as the node takes them) into one single-camera node (-> 640x640)
        for 6 s: published frames/s, each thread's CPU, node-added latency."""
        tag, ns = f"gstmax_{trial}", f"/gm{trial}"
        node = self.max_node(tag, ns, "-p", f'inputs:=["{gst_source("BGR", 1920, 1080, "", live=False)}"]')
        nlog, rate = self.max_window(tag, ns, node, "gst node", [])
        started = grep(r"GStreamer pipeline", nlog)
        print(f"gst max trial {trial} (not live, 1080p BGR): {nl(grep('stopped:.*', nlog, only=True))}; "
              f"published/s ~{rate}; {nl(started[:1])[:200]}")
        for line in grep("node-added", WORK / f"rec_{tag}.log"):
            print(f"  gst {line}")

    def max_node(self, tag: str, ns: str, *node_args: str, binary: Path | None = None) -> NodeProcess:
        """The node of a highest-rate run: 1080p -> 640x640 (config/default.yaml) in `ns`."""
        return self.node(["-r", f"__ns:={ns}", "--params-file", CONFIG, "-p", f"backend:={self.k.backend}",
                          "-p", "network_image_width:=640", "-p", "network_image_height:=640", *node_args],
                         WORK / f"node_{tag}.log", binary=binary)

    def max_window(self, tag: str, ns: str, node: NodeProcess, label: str, plays: list) -> tuple[Path, str]:
        """A `record --count-only` subscriber beside `node` for 6 s (the players' run, or 6 s
        without players), each thread's CPU over seconds 3-6; then both stopped. The node's
        log and its published frames per second."""
        rec = self.spawn([self.cli, "record", "--count-only", "--tensor-topic", f"{ns}/tensor", "--timing-topic",
                          f"{ns}/timing", "--duration", 60], WORK / f"rec_{tag}.log")
        # The window: about seconds 2-5 of the 6 (the node is up within a second).
        time.sleep(3)
        self.threads(3, label, node)
        if plays:
            self.wait(*plays)
            time.sleep(1)
        self.term(node)
        self.stop_or_kill("node", node)
        self.term(rec)
        self.stop_or_kill("subscriber", rec)
        nlog = WORK / f"node_{tag}.log"
        pub = grep(r"stopped: [0-9]* frames received, [0-9]*", nlog, only=True)
        return nlog, f"{int(pub[0].split()[4]) / 6:.0f}" if pub else ""

    def single_30(self, rel: str, bins: Path, trial: int) -> None:
        """One player at 30 Hz for 10 s into one single-camera node: node-added latency."""
        tag, ns = f"single30_{rel}_{trial}", f"/t{trial}{rel}"
        node = self.node(["-r", f"__ns:={ns}", "--params-file", CONFIG, "-p", f"backend:={self.k.backend}",
                          "-p", "network_image_width:=640", "-p", "network_image_height:=640"],
                         WORK / f"node_{tag}.log", binary=bins / "vision_preproc_node")
        rec = self.spawn([self.cli, "record", "--count-only", "--tensor-topic", f"{ns}/tensor", "--timing-topic",
                          f"{ns}/timing", "--duration", 60], WORK / f"rec_{tag}.log")
        self.wait(self.player(self.bags / "bgr8_1920x1080", tag, "--loop", "--restamp", "--duration", 10,
                              "--image-topic", f"{ns}/image", "--camera-info-topic", f"{ns}/camera_info",
                              "--wait-subscribers", 1, limit=60))
        time.sleep(1)
        self.term(node)
        self.stop_or_kill("node", node)
        self.term(rec)
        self.stop_or_kill("subscriber", rec)
        print(f"single {rel} trial {trial} (30 Hz): {nl(played(WORK / f'play_{tag}.log'))}; "
              f"{nl(grep('stopped:.*', WORK / f'node_{tag}.log', only=True))}")
        for line in grep("node-added", WORK / f"rec_{tag}.log"):
            print(f"  {rel} {line}")

    def unpack_prev(self) -> bool:
        """The previous release's bundle (.device/prev.tar.xz, bundled as ros.tar.xz)."""
        shutil.rmtree(PREV_DIR, ignore_errors=True)
        if not self.untar(self.stage / "prev.tar.xz", PREV_DIR):
            self.fail(f"no {self.stage / 'prev.tar.xz'}")
            return False
        return True

    def cudaref_run(self, mode: str, trial: int = 1) -> None:
        """One run of cudaref's `mode` (its modes: cudaref's function)."""
        k = self.k
        tag = f"cudaref_{mode}_{trial}"
        bag, stamps, play_s = self.bags / "bgr8_1920x1080", ["--restamp"], 10
        args = ["--params-file", CONFIG, "-p", f"backend:={k.backend}", "-p", "network_image_width:=640",
                "-p", "network_image_height:=640"]
        if mode in ("check", "rust", "ctypes"):
            args = self.small()
        prefix = MEMCHECK if mode == "sanitizer" else ()
        if mode.startswith("batch_"):
            args += ["-r", "__ns:=/bb", "-p", INPUTS4, *k.cudaref_batch_args]
        if mode == "gst_ref":
            # bench_handoff.py's path (b): the camera inside the node, live, 1080p at 30 Hz.
            args += ["-p", f'inputs:=["{gst_source("BGR", 1920, 1080, "30/1")}"]']
        if mode == "jpeg_ref":
            # bench_handoff.py's path (c): the same frames as JPEG q90 over DDS.
            bag = self.bags / JPEG_BAG
            args += ["-p", "image_transport:=compressed"]
        binary, fault = self.node_bin, ""
        if mode == "prev_ref":
            binary = PREV_DIR / "bin" / "vision_preproc_node"
        elif mode == "fault_retry":
            binary, fault = self.node_fi, "200:transient"
            args += ["-p", "gpu_failure_policy:=retry"]
        elif mode == "fault_fallback":
            binary, fault = self.node_fi, "200"
            args += ["-p", "gpu_failure_policy:=fallback"]
        elif mode == "fault_inflight":
            binary, fault = self.node_fi, "200:in_flight"
            args += ["-p", "gpu_failure_policy:=retry"]
        nlog = WORK / f"node_{tag}.log"
        node = self.node(args, nlog, binary=binary, env={INJECT_FAULT_ENV: fault} if fault else None, prefix=prefix)
        waits: list = []
        killer = None
        rec_dir = WORK / f"rec_{tag}"
        if mode == "check":
            # The demo bag as recorded (its stamps repeat per loop: compare_bags.py matches them).
            bag, stamps = self.demo_bag, []
            shutil.rmtree(rec_dir, ignore_errors=True)
            waits.append(self.spawn([self.cli, "record", rec_dir, "--duration", 13], WORK / f"rec_{tag}.log"))
            waits.append(self.consumer(tag, "both", 13))
        elif mode == "ctypes":
            # As check, the blocks imported through ctypes on libcuda.so.1 (not cuda-python).
            bag, stamps = self.demo_bag, []
            probe = subprocess.run(["python3", "-c", "from vision_preproc_consumer import cuda\n"
                                    "d = cuda.driver(); print('VISION_PREPROC_CUDA_BINDING=ctypes: binding', d.name, "
                                    "getattr(d, 'library', ''))"],
                                   env=self.py312_env(VISION_PREPROC_CUDA_BINDING="ctypes"), capture_output=True,
                                   text=True)
            print((probe.stdout + probe.stderr).rstrip())
            waits.append(self.consumer(tag, "both", 13, binding="ctypes"))
        elif mode == "rust":
            # The r2r consumer (CUDA blocks imported in Rust) and a recorder of tensor: stamp ->
            # FNV-1a 64 of the Tensor bytes (the example's hash), compared below.
            waits.append(self.spawn([self.consumer_bin, "/tensor_ref", 13, self.out / f"{tag}_refs.txt"],
                                    self.out / f"{tag}.consumer.log"))
            waits.append(self.peer("tensor_hashes", self.out / f"{tag}_tensor.txt", 13,
                                   log=self.out / f"{tag}_tensor.log"))
        elif mode.startswith("fault_"):
            waits.append(self.consumer(tag, "tensor_ref", 13))
        elif mode == "debug":
            # debug_image beside a tensor_ref consumer: previews read back from the CUDA block.
            waits.append(self.consumer(tag, "tensor_ref", 13))
            waits.append(self.peer("debug_watch", 13, log=self.out / f"{tag}_debug.log"))
        elif mode == "example":
            waits.append(self.spawn(["python3", ROOT / "examples" / "tensor_ref_torch.py", "/tensor_ref", 13],
                                    self.out / f"{tag}.consumer.log", env=self.py312_env()))
        elif mode in ("tensor", "tensor_ref"):
            waits.append(self.consumer(f"{mode}_{trial}", mode, 13))
        elif mode in ("gst_ref", "jpeg_ref"):
            waits.append(self.consumer(f"{mode}_{trial}", "tensor_ref", 13))
        elif mode == "prev_ref":
            waits.append(self.consumer(f"{mode}_{trial}", "tensor_ref", 13))
        elif mode.startswith("batch_"):
            waits.append(self.consumer(f"{mode}_{trial}", mode[len("batch_"):], 13, "--ns", "/bb", "--batch"))
        elif mode == "slow":
            play_s = k.cudaref_slow_s
            waits.append(self.consumer(tag, "tensor_ref", play_s + 3, "--hold-ms", "500"))
        elif mode == "kill":
            # The holder takes a frame every 1.5 s (within the 2-s lease) and is killed while holding one.
            holder = self.consumer(f"{tag}_holder", "tensor_ref", 30, "--hold-ms", "1500")
            waits.append(self.consumer(tag, "tensor_ref", 13))

            def kill_holder() -> None:
                holder.kill()
                (self.out / f"{tag}_kill.txt").write_text(f"holder SIGKILLed at {time.time():.9f}\n")

            killer = threading.Timer(5.7, kill_holder)
            killer.start()
        elif mode == "sanitizer":
            play_s = 20
            waits.append(self.consumer(tag, "tensor_ref", 25))
        if mode.startswith("batch_"):
            waits += self.play_cameras("batched", "b", tag, "--duration", play_s, *k.cudaref_batch_play)
        elif mode == "gst_ref":
            pass  # the camera is in the node
        else:
            waits.append(self.player(bag, tag, "--loop", *stamps, "--duration", play_s, "--wait-subscribers", 1))
        time.sleep(6)
        mem = self.mem(node)
        self.wait(*waits)
        if killer:
            killer.join()
        if mode == "sanitizer":
            # compute-sanitizer passes nothing on: the node is its child.
            for pid in children(node.proc.pid):
                os.kill(pid, signal.SIGTERM)
            rc = self.wait(node)[0]
        else:
            rc = self.stop_node(node)
        firsts = [lines_of(p)[0] for p in sorted(WORK.glob(f"play_{tag}*.log")) if lines_of(p)]
        print(f"{tag}: {''.join(f + ' ' for f in firsts)}; node {mem}, exit {rc}; "
              f"{nl(grep('stopped:.*', nlog, only=True))}")
        for line in grep(r"tensor_ref|ERROR SUMMARY|WARN|ERROR|gpu_failure|backend", nlog)[:12]:
            print(line[:300])
        if mode == "check":
            subprocess.run(["tar", "cf", str(self.out / f"{tag}_bag.tar"), "-C", str(WORK), f"rec_{tag}"], check=False)
            shutil.rmtree(rec_dir, ignore_errors=True)
        if mode == "sanitizer" or mode.startswith("fault_"):
            shutil.copy(nlog, self.out)
        if mode == "example":
            print(nl(lines_of(self.out / f"{tag}.consumer.log")[-3:]))
        if mode in ("check", "ctypes"):
            try:
                d = json.loads(text(self.out / f"{tag}.json"))
                print("consumer checks", d["checks"], "counts", d["counts"])
            except (ValueError, KeyError) as e:
                print(f"consumer checks: no result in {self.out / f'{tag}.json'} ({e!r})")
        if mode == "rust":
            con = self.out / f"{tag}.consumer.log"
            print(nl(grep("device address", con)[:1]))
            print(nl(lines_of(con)[-1:]))
            print(text(self.out / f"{tag}_tensor.log").rstrip())
            print(compare_hashes(self.out / f"{tag}_refs.txt", self.out / f"{tag}_tensor.txt"))
        if mode == "debug":
            print(nl(lines_of(self.out / f"{tag}_debug.log")[-3:]))


# --- The scenarios ----------------------------------------------------------------------

SCENARIOS: dict[str, Callable[[Run], None]] = {}


def scenario(fn: Callable[[Run], None]) -> Callable[[Run], None]:
    SCENARIOS[fn.__name__] = fn
    return fn


@scenario
def healthy(run: Run) -> None:
    """The small network (64x48 + 5x5 gaussian conv2d) on the demo bag, no fault: the node
    must exit 0; its tensors recorded ($OUT/healthy_bag.tar)."""
    run.fault_run("healthy", "", "retry")


@scenario
def fallback(run: Run) -> None:
    """As healthy, the node with the test hooks: VISION_PREPROC_INJECT_CUDA_FAULT=40 (sticky:
    illegal address), gpu_failure_policy fallback; the node must exit 0."""
    run.fault_run("fallback", "40", "fallback")


@scenario
def retry(run: Run) -> None:
    """As healthy, the node with the test hooks: VISION_PREPROC_INJECT_CUDA_FAULT=40:transient
    (out of memory), gpu_failure_policy retry; the node must exit 0."""
    run.fault_run("retry", "40:transient", "retry")


@scenario
def exit(run: Run) -> None:  # noqa: A001 (the scenario's name)
    """As healthy, the node with the test hooks: VISION_PREPROC_INJECT_CUDA_FAULT=40 (sticky),
    gpu_failure_policy exit; the node must exit 1."""
    run.fault_run("exit", "40", "exit")


@scenario
def latency(run: Run) -> None:
    """config/default.yaml, 1280x720 and 1920x1080 bgr8 at 30 Hz restamped (LATENCY_SIZES):
    end-to-end and node-added latency, fps, drops, RSS and GPU memory (3 x 10 s each, TRIALS)."""
    with run.tee("latency"):
        for size in run.k.latency_sizes:
            for i in run.k.n(3):
                tag = f"lat_{size}_{i}"
                rec_dir = WORK / f"rec_{tag}"
                shutil.rmtree(rec_dir, ignore_errors=True)
                node = run.node(["--params-file", CONFIG, "-p", f"backend:={run.k.backend}"], WORK / f"node_{tag}.log")
                rec = run.spawn([run.cli, "record", rec_dir, "--duration", 13, "--json", run.out / f"{tag}.json"],
                                WORK / f"rec_{tag}.log")
                play = run.player(run.bags / f"bgr8_{size}", tag, "--loop", "--restamp", "--duration", 10,
                                  "--wait-subscribers", 1)
                time.sleep(6)
                mem = run.mem(node)
                run.wait(play, rec)
                run.stop_node(node)
                print(f"{size} trial {i}: {nl(lines_of(WORK / f'play_{tag}.log')[:1])}; "
                      f"{nl(grep('^latency', WORK / f'rec_{tag}.log'))}; node {mem}; "
                      f"{nl(grep('stopped:.*', WORK / f'node_{tag}.log', only=True))}")
                shutil.rmtree(rec_dir, ignore_errors=True)


@scenario
def startup(run: Run) -> None:
    """Process start -> first 1080p tensor received, with an empty kernel cache, then cached (3 x, TRIALS)."""
    with run.tee("startup"):
        for i in run.k.n(3):
            shutil.rmtree(KERNEL_CACHE, ignore_errors=True)
            for label in (f"cold{i}", f"warm{i}"):
                tag = f"start_{label}"
                rec_dir, js = WORK / f"rec_{tag}", WORK / f"{tag}.json"
                shutil.rmtree(rec_dir, ignore_errors=True)
                rec = run.spawn([run.cli, "record", rec_dir, "--duration", 12, "--json", js], None)
                play = run.spawn([run.cli, "play", run.bags / "bgr8_1920x1080", "--loop", "--duration", 12], None)
                time.sleep(2)
                t0 = time.time_ns()
                node = run.node(["--params-file", CONFIG, "-p", f"backend:={run.k.backend}"], WORK / f"node_{tag}.log")
                time.sleep(8)
                mem = run.mem(node)
                run.stop_node(node)
                run.wait(play, rec)
                try:
                    first = json.loads(text(js)).get("first_tensor_ns")
                except ValueError:
                    first = None
                ms = (first - t0) / 1e6 if first else float("nan")
                print(f"startup {label}: process start -> first 1080p tensor received {ms:.0f} ms; node {mem}")
                shutil.rmtree(rec_dir, ignore_errors=True)


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
                    run.cudaref_run("tensor", i)
                    run.cudaref_run("tensor_ref", i)
            elif m == "batch":
                for i in run.k.n(2):
                    run.cudaref_run("batch_tensor", i)
                    run.cudaref_run("batch_tensor_ref", i)
            elif m == "prev":
                if not run.unpack_prev():
                    continue
                print(f"prev: commit {text(PREV_DIR / 'COMMIT').strip()}; this: commit {run.commit}")
                for i in run.k.n(2):
                    run.cudaref_run("prev_ref", i)
                    run.cudaref_run("tensor_ref", i)
            else:
                run.cudaref_run(m)


@scenario
def camera(run: Run) -> None:
    """Cameras inside the node (`gst:` inputs, GStreamer from .device/gst.tar.xz), in one call:
      parity: every format of GST_GROUPS from live 1920x1080 pipelines, one node per group
        and backend (CUDA upload, CUDA mapped, CPU), 64x48 + gaussian 5 conv2d, 4 batches
        recorded each (OUT/camera_<mode>_<group>: compare them here, test/ros/test_camera.py's
        formats; the picture is the same in every frame)
      sanitizer: the YUV/Bayer group's node under compute-sanitizer memcheck, 25 s per CUDA
        memory mode (its start-up under the tool takes most of the first 10)
      bench: bench_handoff.py's three paths with the PyTorch consumer, 2 rounds: (s) camera
        process -> tensor + .cuda(), (a) -> tensor_ref, (b) the camera in the node -> tensor_ref;
        each round twice, the consumer on rclpy's SingleThreadedExecutor, then on its
        EventsExecutor (files events_<path>_<round>.json)
      max: the highest single-camera rate, a source that is not live (frames as fast as they
        are taken) against PLAYERS `play --max` into the node through DDS, 6 s each, 2 trials
      restarts: a live 1080p pipeline that ends every 20 frames (restarted by the node each
        time: GStreamer frees the old pool's buffers, the new pool's are registered), under
        compute-sanitizer memcheck per CUDA memory mode, 30 s each: the restarts and the
        ledger (every frame read in place), not in the default parts
    CAMERA_PARTS: a subset of those, in that order."""
    if not run.gst:
        raise SystemExit("gpu_node_remote: camera needs .device/gst.tar.xz (scripts/device/gst_bundle.sh)")
    parts = run.k.camera_parts
    if not run.untar(run.stage / "py312.tar.xz", ROS_DIR):
        raise SystemExit(f"gpu_node_remote: cannot unpack {run.stage / 'py312.tar.xz'} (the consumers)")
    with run.tee("camera"):
        run.warm_up()
        for label, mode_args in GST_MODES if "parity" in parts else ():
            for g, group in enumerate(GST_GROUPS):
                tag, ns = f"camera_{label}_{g}", f"/gc{g}{label[:4]}{label[-1]}"
                inputs = "inputs:=[" + ",".join(f'"{gst_source(f, 1920, 1080)}"' for f in group) + "]"
                node = run.node(["-r", f"__ns:={ns}", *run.small(), *mode_args, "-p", inputs,
                                 "-p", "batch_timeout_ms:=400"], WORK / f"node_{tag}.log")
                rec = run.spawn([run.cli, "record", run.out / tag, "--batch", "--tensor-topic", f"{ns}/tensor",
                                 "--timing-topic", f"{ns}/timing", "--count", 4, "--duration", 40],
                                WORK / f"rec_{tag}.log")
                run.wait(rec)
                stop_recorded(run, tag, node, 1, r"WARN|ERROR|FATAL|backend|frames read|frame copies")
        if "sanitizer" in parts:
            camera_sanitizer(run)
        if "bench" in parts:
            for i in run.k.n(2):
                for run.executor in ("single", "events"):
                    run.cudaref_run("tensor", i)
                    run.cudaref_run("tensor_ref", i)
                    run.cudaref_run("gst_ref", i)
            run.executor = "single"
        new = run.node_bin.parent
        for i in run.k.n(2) if "max" in parts else ():
            run.single_max("new", new, i)
            run.gst_max(i)
        if "restarts" in parts:
            camera_restarts(run)


@scenario
def compressed(run: Run) -> None:
    """Compressed inputs (`image_transport: compressed`; node_bags.tar.xz's JPEG_BAG, the
    1080p photographs as JPEG q90 4:2:0, from `play`), in one call:
      parity: one node per mode of GST_MODES (CUDA upload and CUDA mapped: nvJPEG; CPU: the
        CPU decoder), 64x48 + gaussian 5 conv2d, the bag's 8 frames played once and every
        tensor recorded (OUT/compressed_<mode>: compare them here,
        scripts/device/compare_compressed.py, within jpeg_gpu_decode)
      sanitizer: the CUDA node under compute-sanitizer memcheck, the bag looped 20 s
      bench: bench_handoff.py's (s), (a), (b) and (c) with the PyTorch consumer, 2 rounds:
        raw over DDS -> tensor + .cuda(), -> tensor_ref, the camera inside the node (the
        in-process source) -> tensor_ref, JPEG over DDS -> tensor_ref
      batch: four JPEG cameras (30 Hz each, phases not aligned) batched in one node with
        `inputs` of 4, 1080p -> 640x640, 10 s, then 15 s under compute-sanitizer memcheck
        (CUDA): the books, the batches' decode stage, the warm-up's start-up line
    COMPRESSED_PARTS: a subset of those four, in that order."""
    parts = run.k.compressed_parts
    if "bench" in parts and not run.untar(run.stage / "py312.tar.xz", ROS_DIR):
        raise SystemExit(f"gpu_node_remote: cannot unpack {run.stage / 'py312.tar.xz'} (the consumers)")
    bag = run.bags / JPEG_BAG
    with run.tee("compressed"):
        run.warm_up()
        for label, mode_args in GST_MODES if "parity" in parts else ():
            tag, ns = f"compressed_{label}", f"/jc{label[:4]}{label[-1]}"
            node = run.node(["-r", f"__ns:={ns}", *run.small(), *mode_args, "-p", "image_transport:=compressed"],
                            WORK / f"node_{tag}.log")
            rec = run.spawn([run.cli, "record", run.out / tag, "--tensor-topic", f"{ns}/tensor",
                             "--timing-topic", f"{ns}/timing", "--count", 8, "--duration", 40],
                            WORK / f"rec_{tag}.log")
            time.sleep(3)  # the recorder matched to the node's tensor before the first frame
            run.wait(run.player(bag, tag, "--image-topic", f"{ns}/image", "--wait-subscribers", 1))
            run.wait(rec)
            stop_recorded(run, tag, node, 2, r"WARN|ERROR|FATAL|backend|JPEG|rejected")
        if "sanitizer" in parts:
            tag = "compressed_sanitizer"
            node = run.node(["-r", "__ns:=/jcs", "-p", "backend:=cuda", *run.small(),
                             "-p", "image_transport:=compressed"], WORK / f"node_{tag}.log",
                            prefix=MEMCHECK)
            play = run.player(bag, tag, "--image-topic", "/jcs/image", "--loop", "--duration", 20,
                              "--wait-subscribers", 1)
            run.wait(play)
            stop_by_namespace("__ns:=/jcs")
            rc = run.wait(node)[0]
            nlog = WORK / f"node_{tag}.log"
            print(f"{tag}: exit {rc}; {nl(grep('stopped:.*', nlog, only=True))}; "
                  f"{nl(grep('ERROR SUMMARY.*', nlog))}")
            shutil.copy(nlog, run.out)
        if "bench" in parts:
            for i in run.k.n(2):
                run.cudaref_run("tensor", i)
                run.cudaref_run("tensor_ref", i)
                run.cudaref_run("gst_ref", i)
                run.cudaref_run("jpeg_ref", i)
        if "batch" in parts:
            compressed_batch(run, bag)


def compressed_batch(run: Run, bag: Path) -> None:
    """compressed's batch part: 4 players of `bag` into one node of 4 compressed inputs, a
    `record --batch --count-only` of its TensorBatch; plain, then under memcheck (CUDA)."""
    runs = [("batch", (), 10)] + ([("batch_sanitizer", MEMCHECK, 15)] if run.k.backend != "cpu" else [])
    for label, prefix, secs in runs:
        tag, ns = f"compressed_{label}", "/jb"
        nlog = WORK / f"node_{tag}.log"
        node = run.node(["-r", f"__ns:={ns}", "--params-file", CONFIG, "-p", f"backend:={run.k.backend}",
                         "-p", "network_image_width:=640", "-p", "network_image_height:=640", "-p", INPUTS4,
                         "-p", "image_transport:=compressed"], nlog, prefix=prefix)
        rec = run.spawn([run.cli, "record", "--count-only", "--batch", "--tensor-topic", f"{ns}/tensor",
                         "--timing-topic", f"{ns}/timing", "--duration", secs + 25], WORK / f"rec_{tag}.log")
        plays = []
        for k in range(4):
            plays.append(run.player(bag, f"{tag}_{k}", "--loop", "--restamp", "--duration", secs,
                                    "--image-topic", f"{ns}/cam{k}/image", "--camera-info-topic",
                                    f"{ns}/cam{k}/camera_info", "--wait-subscribers", 1, limit=90))
            time.sleep(random.randrange(9) / 100)
        run.wait(*plays)
        time.sleep(2)
        if prefix:
            stop_by_namespace(f"__ns:={ns}")
            rc = run.wait(node)[0]
        else:
            rc = run.stop_node(node)
        run.term(rec)
        run.wait(rec)
        sent_ = [lines_of(p)[0] for p in sorted(WORK.glob(f"play_{tag}_*.log")) if lines_of(p)]
        print(f"{tag}: players {' / '.join(sent_)}; node exit {rc}; {nl(grep('stopped:.*', nlog, only=True))}; "
              f"{nl(grep('ERROR SUMMARY.*', nlog))}")
        for line in grep(r"JPEG: |WARN|ERROR|undecodable", nlog)[:6]:
            print(f"  {line[:300]}")
        for line in lines_of(WORK / f"rec_{tag}.log")[-4:]:
            print(f"  record: {line[:300]}")
        shutil.copy(nlog, run.out)


def stop_recorded(run: Run, tag: str, node, rec_lines: int, pattern: str) -> None:
    """Stop a parity node whose recorder finished, print the recorder's last `rec_lines`
    lines, the node's exit and books and its log lines matching `pattern`; keep its log."""
    rc = run.stop_node(node)
    nlog = WORK / f"node_{tag}.log"
    print(f"{tag}: {nl(lines_of(WORK / f'rec_{tag}.log')[-rec_lines:])}; node exit {rc}; "
          f"{nl(grep('stopped:.*', nlog, only=True))}")
    shutil.copy(nlog, run.out)
    for line in grep(pattern, nlog)[:6]:
        print(f"  {line[:260]}")


def stop_by_namespace(ns_arg: str) -> None:
    """SIGTERM the node started with `-r <ns_arg>`, wherever compute-sanitizer put it in
    its process tree (its direct children are not always the node)."""
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if ns_arg.encode() in cmdline and cmdline[0].endswith(b"vision_preproc_node"):
            os.kill(int(pid), signal.SIGTERM)


def camera_sanitizer(run: Run) -> None:
    """camera's sanitizer part: the YUV/Bayer group's node."""
    inputs = "inputs:=[" + ",".join(f'"{gst_source(f, 1920, 1080)}"' for f in GST_GROUPS[1]) + "]"
    camera_memcheck(run, "sanitizer", inputs, "/gcs", 25)


def camera_restarts(run: Run) -> None:
    """camera's restarts part: a live 1080p pipeline that ends every 20 frames."""
    inputs = f'inputs:=["{gst_source("BGR", 1920, 1080, "30/1", num_buffers=20)}"]'
    camera_memcheck(run, "restarts", inputs, "/gcr", 30)


def camera_memcheck(run: Run, part: str, inputs: str, ns: str, seconds: int) -> None:
    """A node of `inputs` (its `-p inputs:=` argument) under compute-sanitizer memcheck for
    `seconds`, once per CUDA memory mode of GST_MODES (upload: the upload reads GStreamer's
    registered buffers; mapped: the kernels do); prints its restarts (log lines, rate
    limited), each input's ledger, its books and the tool's summary."""
    for label, mode_args in GST_MODES[:2]:
        tag = f"camera_{part}_{label}"
        node = run.node(["-r", f"__ns:={ns}", *mode_args, *run.small(), "-p", inputs],
                        WORK / f"node_{tag}.log", prefix=MEMCHECK)
        time.sleep(seconds)
        stop_by_namespace(f"__ns:={ns}")
        rc = run.wait(node)[0]
        nlog = WORK / f"node_{tag}.log"
        restarts = len(grep("pipeline restarted", nlog))
        print(f"{tag}: exit {rc}; {restarts} restart log lines; {nl(grep('frame copies.*', nlog, only=True))}; "
              f"{nl(grep('stopped:.*', nlog, only=True))}; {nl(grep('ERROR SUMMARY.*', nlog))}")
        shutil.copy(nlog, run.out)


@scenario
def single(run: Run) -> None:
    """One single-camera node, 1920x1080 bgr8 -> 640x640 float32 (config/default.yaml), the
    previous release (.device/prev.tar.xz) against this one, interleaved, 2 trials each
    (TRIALS): the highest sustained rate (PLAYERS=3 `play --max` on the node's one topic,
    6 s: published frames/s, received / dropped, each thread's CPU) and the node-added
    latency at 30 Hz (one player, 10 s, `record` p50 / p99)."""
    with run.tee("single"):
        run.warm_up()
        if not run.unpack_prev():
            return
        new = run.node_bin.parent
        print(f"prev: commit {text(PREV_DIR / 'COMMIT').strip()}; new: commit {run.commit}")
        for i in run.k.n(2):
            run.single_max("prev", PREV_DIR / "bin", i)
            run.single_max("new", new, i)
        for i in run.k.n(2):
            run.single_30("prev", PREV_DIR / "bin", i)
            run.single_30("new", new, i)


@scenario
def single_own(run: Run) -> None:
    """The single-camera node's highest rate (as `single`, this release only) with
    input_participants one vs per_input, interleaved, 2 trials (TRIALS)."""
    with run.tee("single_own"):
        run.warm_up()
        for i in run.k.n(2):
            run.single_max("one", run.node_bin.parent, i)
            run.single_max("own", run.node_bin.parent, i, "-p", "input_participants:=per_input")


@scenario
def profile(run: Run) -> None:
    """Where a node's time goes at --max, per thread (scripts/device/thread_cpu.py), for each
    side of PROFILE_SIDES (batched separate; also batched_own: the batched node with
    input_participants per_input; pairs: two nodes with 2 inputs each), with its players
    and subscribers."""
    with run.tee("profile"):
        run.warm_up()
        for side in run.k.profile_sides:
            tag = f"profile_{side}"
            nodes, recs = run.start_side(side, "p", tag, "count")
            plays = run.play_cameras(side, "p", tag, "--duration", 8, "--max")
            time.sleep(3)
            run.threads(3, side, *nodes, *plays, *recs)
            run.stop_side(plays, nodes, recs)
            stopped = grep(r"stopped: [0-9]* frames received, [0-9]* published, [0-9]* dropped",
                           *tag_logs("node", tag), only=True)
            print(f"profile {side}: sent {sent(*sorted(WORK.glob(f'play_{tag}_[0-9].log')))}; {' '.join(stopped)}")


@scenario
def batch(run: Run) -> None:
    """4 cameras 1920x1080 bgr8 at 30 Hz (4 players, phases not aligned) -> one node with 4
    inputs (TensorBatch 4x3x640x640) vs 4 single-camera nodes; node-added and end-to-end
    latency per side (2 x 10 s, interleaved, TRIALS)."""
    with run.tee("batch"):
        run.warm_up()
        for i in run.k.n(2):
            for side in ("batched", "separate"):
                tag = f"batch_{side}_{i}"
                nodes, recs = run.start_side(side, "b", tag, "bag")
                plays = run.play_cameras(side, "b", tag, "--duration", 10)
                time.sleep(6)
                mem = "".join(f" [{run.mem(n)}]" for n in nodes)
                run.wait(*plays)
                time.sleep(1)
                run.term(*recs)
                run.wait(*recs)
                run.term(*nodes)
                run.wait(*nodes)
                print(f"{side} trial {i}: {' '.join(played(*sorted(WORK.glob(f'play_{tag}_[0-9].log'))))} ")
                for line in grep("^latency", *tag_logs("rec", tag)):
                    print(f"  {side}: {line}")
                for line in grep("stopped:.*", *tag_logs("node", tag), only=True):
                    print(f"  {side} node {line}")
                print(f"  {side} nodes:{mem}")
                for d in SHM.glob(f"rec_{tag}*"):
                    shutil.rmtree(d, ignore_errors=True)


@scenario
def batchfault(run: Run) -> None:
    """A batched node (2 cameras 1080p at 60 Hz) with a real device fault at batch 40 (the
    node with the test hooks), gpu_failure_policy retry, then fallback: the policy acts
    while the publishing thread may hold the previous batch's buffer; the node must exit 0
    within 15 s of SIGTERM."""
    with run.tee("batchfault"):
        run.warm_up()
        for pol in ("retry", "fallback"):
            tag, log = f"bfault_{pol}", run.out / f"bfault_{pol}.log"
            node = run.node(["-r", "__ns:=/bf", "-p", f"backend:={run.k.sweep_backend}",
                             "-p", f"gpu_failure_policy:={pol}", "-p", "network_image_width:=640",
                             "-p", "network_image_height:=640", "-p", INPUTS2],
                            log, binary=run.node_fi, env={INJECT_FAULT_ENV: "40"})
            rec = run.spawn([run.cli, "record", "--count-only", "--batch", "--tensor-topic", "/bf/tensor",
                             "--timing-topic", "/bf/timing", "--duration", 60], WORK / f"rec_{tag}.log")
            plays = [run.player(run.bags / "bgr8_1920x1080", f"{tag}_{k}", "--loop", "--restamp", "--duration", 5,
                                "--rate", 2, "--image-topic", f"/bf/cam{k}/image", "--camera-info-topic",
                                f"/bf/cam{k}/camera_info", "--wait-subscribers", 1, limit=60) for k in range(2)]
            run.wait(*plays)
            time.sleep(1)
            run.term(rec)
            run.stop_or_kill("subscriber", rec)
            run.term(node)
            try:
                node.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                run.fail("  node did not exit: killed")
                node.proc.kill()
            rc = run.wait(node)[0]
            print(f"batch fault, policy {pol}: node exit code {rc}; "
                  f"{' '.join(played(*sorted(WORK.glob(f'play_{tag}_[0-9].log'))))} ")
            for line in grep(r"GPU failure|gpu_failure_policy|still being published|stopped:|panicked", log):
                print(f"  {line[:300]}")
            for line in grep("^record:", WORK / f"rec_{tag}.log"):
                print(f"  {line}")
            if rc != 0:
                run.fail(f"  batch fault, policy {pol}: node exit code {rc} (expected 0)")


@scenario
def batchmax(run: Run) -> None:
    """The sides of `batch` (SWEEP_SIDES) with the cameras at 30, 60, 120, 180, 240 Hz and
    as fast as they can (play --max), 6 s each (SWEEP_RATES="1 2": fewer rates, multiples of
    30 Hz): frames sent / received / published / dropped per side and rate (the highest rate
    without drops), and published frames/s at --max (the highest sustained rate); `record
    --count-only` as the subscribers. SWEEP_BACKEND=cpu: a dry run without a GPU."""
    with run.tee("batchmax"):
        run.warm_up()
        for rate in run.k.sweep_rates:
            for side in run.k.sweep_sides:
                tag = f"sweep_{side}_{rate}"
                pace = ["--max"] if rate == "max" else ["--rate", rate]
                nodes, recs = run.start_side(side, "w", tag, "count")
                plays = run.play_cameras(side, "w", tag, "--duration", 6, *pace)
                run.stop_side(plays, nodes, recs)
                play_logs = sorted(WORK.glob(f"play_{tag}_[0-9].log"))
                node_logs, rec_logs = tag_logs("node", tag), tag_logs("rec", tag)
                for f in (*node_logs, *rec_logs, *play_logs):
                    shutil.copy(f, run.out)
                print(sweep_summary(side, rate, play_logs, node_logs, rec_logs))


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


# --- Command line -------------------------------------------------------------------------

def listing(full: bool = False) -> str:
    """Each scenario and what it runs (its docstring; the first 160 characters unless `full`)."""
    out = []
    for name, fn in SCENARIOS.items():
        doc = (fn.__doc__ or "").strip()
        if full:
            out.append(f"{name}\n    {doc}\n")
        else:
            doc = " ".join(doc.split())
            out.append(f"  {name:<11} {doc[:160] + ('...' if len(doc) > 160 else '')}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_node_remote.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="scenarios:\n" + listing())
    ap.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="default: " + " ".join(DEFAULT_SCENARIOS))
    ap.add_argument("--list", action="store_true", help="print the scenarios and exit")
    ap.add_argument("--stage", type=Path, default=ROOT / ".device", help="the staged files (default .device)")
    ap.add_argument("--bin", type=Path, help="run the binaries in BIN with this shell's ROS 2, not the bundle's")
    ap.add_argument("--backend", default=os.environ.get("BACKEND", "cuda"),
                    help="every node's backend: cuda (default) or cpu")
    ap.add_argument("--peer", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.peer:
        if a.peer[0] not in PEERS:
            ap.error(f"unknown peer {a.peer[0]}")
        return PEERS[a.peer[0]](*a.peer[1:])
    if a.list:
        print(listing(full=True))
        return 0
    try:
        names, knobs = plan(a.scenarios, os.environ, a.backend)
    except Refused as e:
        print(f"gpu_node_remote: {e}", file=sys.stderr)
        return 2
    if a.bin is not None and not (a.bin / "vision_preproc_node").exists():
        print(f"gpu_node_remote: --bin {a.bin}: no vision_preproc_node there", file=sys.stderr)
        return 2
    sys.stdout.reconfigure(line_buffering=True)
    run = Run(knobs, Path(os.environ.get("OUT", "/tmp/vp_out")), a.stage, a.bin)
    run.prepare()
    run.nvidia_smi("name,driver_version,clocks.sm,clocks.max.sm,clocks.mem")
    for name in names:
        try:
            SCENARIOS[name](run)
        except SystemExit:
            raise
        except Exception as e:  # one scenario's breakage is reported; the others still run
            run.fail(f"{name}: {type(e).__name__}: {e}")
        finally:
            run.reap()
    run.nvidia_smi("clocks.sm,clocks.mem")
    if run.failures:
        print(f"gpu_node_remote: {len(run.failures)} check(s) failed:\n  "
              + "\n  ".join(f.strip() for f in run.failures))
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
