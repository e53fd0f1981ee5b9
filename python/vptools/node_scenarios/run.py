"""One invocation of the scenarios: where things are, the processes, the failures."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from vptools import ROOT, fastdds
from vptools.node_scenarios.common import (CONFIG, DOMAIN, GST_DIR, GST_UNSET, KERNEL_CACHE, PREV_DIR, PROFILE,
                                           ROS_DIR, THREAD_CPU, WORK, Knobs, grep, nl, sent, tag_logs, text)
from vptools.procs import NodeProcess, rss_mb, shell_status


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

    # Pieces shared by scenarios of several families -----------------------------------
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

    def unpack_prev(self) -> bool:
        """The previous release's bundle (.device/prev.tar.xz, bundled as ros.tar.xz)."""
        shutil.rmtree(PREV_DIR, ignore_errors=True)
        if not self.untar(self.stage / "prev.tar.xz", PREV_DIR):
            self.fail(f"no {self.stage / 'prev.tar.xz'}")
            return False
        return True
