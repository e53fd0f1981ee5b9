"""Processes of the project's tools, with the standard library alone (the GPU machine's
python3 runs vptools.node_scenarios with neither rclpy nor numpy): the node as a process,
and what /proc says of a process (its memory, its children).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from vptools import BIN_DIR, HOOKS_BIN_DIR

NODE_BIN = BIN_DIR / "vision_preproc_node"
#: The managed (lifecycle) node (docs/NODE.md, "The managed node").
LIFECYCLE_NODE_BIN = BIN_DIR / "vision_preproc_lifecycle_node"
#: The node built with the test hooks (cargo feature `fault-injection`), which the product
#: does not contain: scripts/test.sh puts it there (scripts/test_hooks_build.sh).
FAULT_INJECTION_NODE = HOOKS_BIN_DIR / "vision_preproc_node"
#: The product's node binaries and their builds with the test hooks.
HOOKED = {NODE_BIN: FAULT_INJECTION_NODE, LIFECYCLE_NODE_BIN: HOOKS_BIN_DIR / "vision_preproc_lifecycle_node"}
#: The variable of the fault injection (src/pipeline/fault.rs).
INJECT_FAULT_ENV = "VISION_PREPROC_INJECT_CUDA_FAULT"
#: The variable of the deferred CPU backend (src/pipeline/deferred.rs): the CPU backend
#: behind the CUDA backend's pipelined interface (two sets in flight), a test hook.
DEFERRED_CPU_ENV = "VISION_PREPROC_TEST_DEFERRED_CPU"
#: The test hooks' variables: a node given one of them runs the fault-injection build.
TEST_HOOK_ENVS = (INJECT_FAULT_ENV, DEFERRED_CPU_ENV)


class NodeProcess:
    """`vision_preproc_node` in its own process, with ROS arguments; stopped with SIGINT.
    With a test hook's variable in `env` (TEST_HOOK_ENVS), the node with the test hooks runs
    instead of the product. `prefix`: a command the node runs under (compute-sanitizer)."""

    def __init__(self, ros_args: list[str], binary: Path = NODE_BIN, env: dict | None = None, log: Path | None = None,
                 unset: tuple[str, ...] = (), prefix: tuple[str, ...] = ()):
        if set(TEST_HOOK_ENVS) & set(env or {}) and binary in HOOKED:
            binary = HOOKED[binary]
            assert binary.exists() and DEFERRED_CPU_ENV.encode() in binary.read_bytes(), (
                f"{binary}: no node with the fault-injection feature; build it with "
                "scripts/test_hooks_build.sh (scripts/test.sh does)")
        self.binary = binary
        self.cmd = [*prefix, str(binary), "--ros-args", *ros_args]
        self.env = {k: v for k, v in dict(os.environ, **(env or {})).items() if k not in unset}
        self.log_path = log
        self.proc: subprocess.Popen | None = None

    def start(self) -> "NodeProcess":
        assert self.binary.exists(), f"{self.binary} missing: run `make build` first"
        self._log = open(self.log_path, "w+") if self.log_path else subprocess.PIPE
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, text=True)
        return self

    def __enter__(self) -> "NodeProcess":
        return self.start()

    def output(self) -> str:
        if self.log_path:
            return Path(self.log_path).read_text()
        return ""

    def stop(self, sig: int = signal.SIGINT, timeout: float = 5.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
            raise AssertionError(f"node did not exit within {timeout} s of signal {sig}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.stop()


def cpu_s(pid: int) -> float | None:
    """The process's CPU time so far (user + system), s; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def rss_mb(pid: int) -> dict | None:
    """VmRSS and its parts (RssAnon: heap; RssShmem: shared memory, e.g. the Fast DDS
    segments, counted as their pages are touched), MB."""
    try:
        kv = {}
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                kv[key] = int(line.split()[1]) / 1024
        return kv if "VmRSS" in kv else None
    except OSError:
        return None


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (what `pkill -P` signals)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            out.append(int(entry))
    return out


def shell_status(returncode: int) -> int:
    """A Popen return code as a shell reports it: 128 + N for a process ended by signal N."""
    return returncode if returncode >= 0 else 128 - returncode
