#!/usr/bin/env python3
"""The managed node with `backend: cuda` on the GPU machine (docs/NODE.md, "The managed
node"): what cleanup gives back, and whether configure/cleanup cycles leak.

    scripts/device/gpu_lifecycle_stage.sh STAGE       # here: the bundles and this script into STAGE
    # there (the node's bundles are unpacked into /tmp/vp_lc):
    mkdir -p /tmp/vp_lc && tar xJf STAGE/py312.tar.xz -C /tmp/vp_lc && source /tmp/vp_lc/py312/env.sh \
      && python3 STAGE/gpu_lifecycle_remote.py STAGE [CYCLES]

Runs vision_preproc_lifecycle_node (the Jazzy bundle, scripts/device/ros_bundle.sh) with
`backend: cuda` and drives it from rclpy (the cp312 bundle, scripts/device/py312_bundle.sh)
through `~/change_state`, as `ros2 lifecycle set` does. It prints, unconfigured, configured
and after cleanup: the process's entry in `nvidia-smi --query-compute-apps` (its CUDA
context), the device's used memory and the process's RSS; then CYCLES (default 50) cycles
configure -> activate -> frames -> deactivate -> cleanup, with the same figures after each
cleanup, and the drift between the first and the last cycles. Exits 1 if a transition fails
or no tensor comes while active.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

WORK = Path("/tmp/vp_lc")
W, H = 640, 640


def unpack(stage: Path) -> dict:
    """The bundles into WORK; returns the node's environment (its ROS and GStreamer
    libraries, not the driver's)."""
    for name in ("ros", "gst"):
        with tarfile.open(stage / f"{name}.tar.xz") as t:
            t.extractall(WORK / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GST_", "PYTHON", "AMENT", "LD_LIBRARY"))}
    env["LD_LIBRARY_PATH"] = f"{WORK}/ros/lib:{WORK}/gst/lib"
    env["GST_PLUGIN_SYSTEM_PATH"] = f"{WORK}/gst/lib/gstreamer-1.0"
    env["GST_PLUGIN_SCANNER"] = f"{WORK}/gst/libexec/gst-plugin-scanner"
    env["GST_REGISTRY"] = f"{WORK}/gst_registry.bin"
    env["XDG_RUNTIME_DIR"] = str(WORK)
    return env


def smi_apps() -> dict[int, int]:
    """pid -> used MiB of every process with a CUDA context (nvidia-smi)."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return {int(p): int(m) for p, m in (line.split(",") for line in out.splitlines() if line.strip())}


def device_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def rss(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def nvidia_fds(pid: int) -> int:
    """Open files of /dev/nvidia* (libcuda keeps its driver handles after cuInit)."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/nvidia")
        except OSError:
            pass
    return n


def figures(pid: int) -> str:
    apps = smi_apps()
    r = rss(pid)
    ctx = f"context {apps[pid]} MiB" if pid in apps else "no context"
    return (f"nvidia-smi: {ctx} (apps {sorted(apps.items())}); device used {device_used_mib()} MiB; "
            f"RSS {r['VmRSS']:.1f} MB (anon {r['RssAnon']:.1f}, file {r['RssFile']:.1f}, shmem {r['RssShmem']:.1f}); "
            f"/dev/nvidia fds {nvidia_fds(pid)}")


class Driver:
    """rclpy: ~/change_state, images in, tensors counted."""

    def __init__(self, node: str) -> None:
        import rclpy
        from lifecycle_msgs.msg import Transition
        from lifecycle_msgs.srv import ChangeState
        from rclpy.qos import qos_profile_sensor_data
        from sensor_msgs.msg import Image
        from vision_preproc_msgs.msg import Tensor

        rclpy.init()
        self.rclpy, self.ChangeState, self.Transition = rclpy, ChangeState, Transition
        self.node = rclpy.create_node("lc_driver")
        self.client = self.node.create_client(ChangeState, f"{node}/change_state")
        self.pub = self.node.create_publisher(Image, "/lc/image", qos_profile_sensor_data)
        self.tensors = 0
        self.node.create_subscription(Tensor, "/lc/tensor", lambda _m: self._count(), qos_profile_sensor_data)
        self.img = Image(height=480, width=640, encoding="bgr8", step=640 * 3)
        self.img.data = bytes((i * 7) % 251 for i in range(640 * 480 * 3))
        assert self.client.wait_for_service(timeout_sec=20), "no ~/change_state"

    def _count(self) -> None:
        self.tensors += 1

    def change(self, tid: int) -> bool:
        fut = self.client.call_async(self.ChangeState.Request(transition=self.Transition(id=tid)))
        self.rclpy.spin_until_future_complete(self.node, fut, timeout_sec=30)
        return bool(fut.result() and fut.result().success)

    def frames(self, n: int, timeout: float = 10.0) -> int:
        """Publish until n tensors came (or timeout); returns how many came."""
        start, end = self.tensors, time.monotonic() + timeout
        while self.tensors - start < n and time.monotonic() < end:
            self.img.header.stamp.nanosec = (self.img.header.stamp.nanosec + 1_000_000) % 1_000_000_000
            self.pub.publish(self.img)
            self.rclpy.spin_once(self.node, timeout_sec=0.03)
        return self.tensors - start


def main() -> int:
    stage = Path(sys.argv[1])
    cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    os.environ["ROS_DOMAIN_ID"] = "37"  # the node's and the driver's
    env = unpack(stage)
    subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    print("commit", (WORK / "ros" / "COMMIT").read_text().strip(), flush=True)
    log = open(WORK / "node.log", "w")
    node = subprocess.Popen([str(WORK / "ros" / "bin" / "vision_preproc_lifecycle_node"), "--ros-args",
                             "-r", "__ns:=/lc", "-p", f"backend:={os.environ.get('VP_LC_BACKEND', 'cuda')}", "-p", f"network_image_width:={W}",
                             "-p", f"network_image_height:={H}"], env=env, stdout=log, stderr=subprocess.STDOUT)
    pid, failed = node.pid, False
    try:
        d = Driver("/lc/vision_preproc")
        time.sleep(1.0)
        print("unconfigured:", figures(pid), flush=True)
        rss0 = rss1 = rss(pid)
        series: list[tuple[float, int, bool]] = []  # after each cleanup: RSS MB, device MiB, context
        for k in range(1, cycles + 1):
            ok = d.change(1)
            if k == 1:
                print("configured (inactive):", figures(pid), flush=True)
            ok = ok and d.change(3)
            got = d.frames(3)
            ok = ok and d.change(4) and d.change(2)
            if not ok or got < 3:
                print(f"cycle {k}: FAILED (transitions ok {ok}, tensors {got})", flush=True)
                failed = True
                break
            if k <= 3 or k % 10 == 0 or k == cycles:
                print(f"cycle {k} ({got} tensors while active), after cleanup:", figures(pid), flush=True)
            if k == 1:
                rss1 = rss(pid)
            series.append((rss(pid)["VmRSS"], device_used_mib(), pid in smi_apps()))
        rssn = rss(pid)
        print(f"RSS after cycle 1 - unconfigured: {rss1['VmRSS'] - rss0['VmRSS']:+.1f} MB; "
              f"after the last - after cycle 1: {rssn['VmRSS'] - rss1['VmRSS']:+.1f} MB "
              f"(anon {rssn['RssAnon'] - rss1['RssAnon']:+.1f})", flush=True)
        print("after each cleanup, RSS MB:", " ".join(f"{r:.0f}" for r, _, _ in series), flush=True)
        print("after each cleanup, device used MiB:", " ".join(str(m) for _, m, _ in series), flush=True)
        print("cycles whose cleanup left a CUDA context:", sum(c for _, _, c in series), "of", len(series), flush=True)
        print("shutdown:", d.change(5), flush=True)
        rc = node.wait(timeout=20)
        print("node exit code", rc, flush=True)
        failed = failed or rc != 0
    finally:
        if node.poll() is None:
            node.kill()
        log.close()
        print("--- node log (first and last 15 lines) ---")
        lines = (WORK / "node.log").read_text().splitlines()
        print("\n".join(lines[:15] + ["..."] + lines[-15:]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
