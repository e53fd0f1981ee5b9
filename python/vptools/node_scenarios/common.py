"""What the families of the node's scenarios share: where things are, the plan (the
scenarios and their knobs, checked before anything runs), the small readers of the
processes' logs and the table of scenarios (vptools.node_scenarios is the command line)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from vptools import ROOT

if TYPE_CHECKING:
    from vptools.node_scenarios.run import Run

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
                 "fault_inflight", "example", "debug", "rust", "ctypes", "prev", "cpp", "cpp_bench")
CUDAREF_DEFAULT = ("check", "bench", "slow", "kill", "sanitizer", "batch", "rust", "ctypes")
#: The sides of `batch`, `batchmax` and `profile` (SWEEP_SIDES, PROFILE_SIDES).
SIDES = ("batched", "batched_own", "pairs", "separate")
BACKENDS = ("cuda", "cpu")
SWEEP_RATES = ("1", "2", "4", "6", "8", "max")


class Refused(ValueError):
    """A command line or knob this module does not run (exit status 2)."""


# --- The plan: scenarios and knobs, checked before anything runs --------------------------

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
    k.camera_parts = _words(env, "CAMERA_PARTS", k.camera_parts, (*k.camera_parts, "restarts", "signal"), "part")
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


# --- Small readers ------------------------------------------------------------------------

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


# --- The scenarios: each family's module adds its own (@scenario) -------------------------

SCENARIOS: dict[str, Callable[[Run], None]] = {}


def scenario(fn: Callable[[Run], None]) -> Callable[[Run], None]:
    SCENARIOS[fn.__name__] = fn
    return fn
