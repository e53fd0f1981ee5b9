#!/usr/bin/env python3
"""The node through real DDS, side by side with a Python reference node (issue 7, item 3).

For each node (vision_preproc_node on the CPU backend; bench/reference_node.py: rclpy +
OpenCV + NumPy), each camera size (1280x720, 1920x1080 bgr8) and each rate (30 Hz, max):
`vision_preproc play --loop --restamp` publishes the frames from Rust (an rclpy publisher
needs ~50 ms to publish one 6 MB image, which would cap the rate it measures), the node
preprocesses to 640x480 letterbox NCHW float32, and an rclpy subscriber in this process
records every tensor and FrameTiming. Both publishers and the nodes use the Fast DDS
profile config/fastdds_large_frames.xml; input QoS best effort (sensor data), outputs
reliable.

Per run: end-to-end latency p50/p99 (header stamp = publish time -> tensor received here,
including this Python subscriber's deserialization of the 3.7 MB tensor), node-added
latency p50/p99 (FrameTiming.total_us: receive -> publish inside the node), achieved fps,
frames published by the player vs tensors received (drops), node CPU % and RSS (sampled
from /proc). Writes JSON and prints a Markdown table.

Usage: python3 bench/bench_node.py [--seconds 20] [--out bench/results/node.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test" / "python"))
os.environ.setdefault("ROS_DOMAIN_ID", str(random.randint(150, 230)))
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
os.environ.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", str(ROOT / "config" / "fastdds_large_frames.xml"))

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import rclpy  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from vision_preproc_msgs.msg import FrameTiming, Tensor  # noqa: E402

from bags import write_bag  # noqa: E402
from sources import Frame, photo_rgb  # noqa: E402

BIN = ROOT / "target" / "release"
PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg")


def bag_for(w: int, h: int, cache: Path) -> Path:
    """8 frames of real photographs (test/data) scaled to w x h (INTER_CUBIC), bgr8, 30 Hz."""
    path = cache / f"bgr8_{w}x{h}"
    if not (path / "metadata.yaml").exists():
        frames = []
        for i in range(8):
            rgb = cv2.resize(photo_rgb(PHOTOS[i % len(PHOTOS)]), (w, h), interpolation=cv2.INTER_CUBIC)
            bgr = np.ascontiguousarray(rgb[..., ::-1])
            frames.append(Frame(bgr.tobytes(), "bgr8", w, h, w * 3))
        write_bag(path, frames, storage="mcap", with_camera_info=False)
    return path


def proc_sample(pid: int) -> tuple[float, float] | None:
    """(utime + stime in seconds, RSS in MB) of a process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = (int(stat[11]) + int(stat[12])) / ticks
        rss_kb = next(int(l.split()[1]) for l in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if l.startswith("VmRSS:"))
        return cpu, rss_kb / 1024
    except (OSError, StopIteration, IndexError, ValueError):
        return None


def pct(v: list[float], q: float) -> float:
    return float(np.percentile(v, q)) if v else float("nan")


def run_one(kind: str, w: int, h: int, rate: str, seconds: float, cache: Path, idx: int) -> dict:
    ns = f"/bench{idx}"
    if kind == "vision_preproc":
        cmd = [str(BIN / "vision_preproc_node"), "--ros-args", "-r", f"__ns:={ns}", "-p", "backend:=cpu",
               "--params-file", str(ROOT / "config" / "default.yaml")]
    else:
        cmd = [sys.executable, str(ROOT / "bench" / "reference_node.py"), "--ros-args", "-r", f"__ns:={ns}"]
    node = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rclpy.init()
    peer = rclpy.create_node(f"bench_peer_{idx}", namespace=ns)
    reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    e2e: list[float] = []
    added: list[float] = []
    n_tensors = [0]

    def on_tensor(t: Tensor) -> None:
        now = time.time_ns()
        e2e.append((now - (t.header.stamp.sec * 10**9 + t.header.stamp.nanosec)) / 1e6)
        n_tensors[0] += 1

    peer.create_subscription(Tensor, "tensor", on_tensor, reliable)
    peer.create_subscription(FrameTiming, "timing", lambda m: added.append(m.total_us / 1e3), reliable)
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: [rclpy.spin_once(peer, timeout_sec=0.05) for _ in iter(stop.is_set, True)])
    spinner.start()
    play_cmd = [str(BIN / "vision_preproc"), "play", str(bag_for(w, h, cache)), "--loop", "--restamp",
                "--image-topic", f"{ns}/image", "--camera-info-topic", f"{ns}/camera_info",
                "--wait-subscribers", "1", "--duration", str(seconds)]
    play_cmd += ["--max"] if rate == "max" else ["--rate", "1"]
    samples = []
    player = subprocess.Popen(play_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t_start = None
    while player.poll() is None:
        s = proc_sample(node.pid)
        if s:
            samples.append((time.monotonic(), *s))
        if t_start is None and n_tensors[0] > 0:
            t_start = time.monotonic()
        time.sleep(0.5)
    out, err = player.communicate()
    time.sleep(1.0)  # tensors still in flight
    stop.set()
    spinner.join()
    node.send_signal(signal.SIGINT)
    try:
        node.wait(timeout=10)
    except subprocess.TimeoutExpired:
        node.kill()
    peer.destroy_node()
    rclpy.shutdown()
    sent = int(out.split("play: ")[1].split(" images")[0]) if "play: " in out else -1
    warm = [s for s in samples if s[0] >= samples[0][0] + 2.0] if samples else []
    cpu_pct = 100 * (warm[-1][1] - warm[0][1]) / (warm[-1][0] - warm[0][0]) if len(warm) >= 2 else float("nan")
    return {
        "node": kind, "size": f"{w}x{h}", "rate": rate, "seconds": seconds,
        "sent": sent, "tensors": n_tensors[0], "dropped": sent - n_tensors[0] if sent >= 0 else None,
        "fps": n_tensors[0] / seconds,
        "e2e_ms_p50": pct(e2e, 50), "e2e_ms_p99": pct(e2e, 99),
        "added_ms_p50": pct(added, 50), "added_ms_p99": pct(added, 99),
        "node_cpu_pct": cpu_pct, "node_rss_mb_max": max((s[2] for s in samples), default=float("nan")),
        "player_stderr": err.strip()[-300:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "node.json"))
    ap.add_argument("--only", default="", help="substring filter on 'node size rate'")
    args = ap.parse_args()
    cache = ROOT / "bench" / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    results = []
    idx = 0
    for w, h in [(1280, 720), (1920, 1080)]:
        for rate in ["30", "max"]:
            for kind in ["vision_preproc", "reference"]:
                idx += 1
                if args.only and args.only not in f"{kind} {w}x{h} {rate}":
                    continue
                r = run_one(kind, w, h, rate, args.seconds, cache, idx)
                results.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "player_stderr"}), flush=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cpus": os.cpu_count(),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                     text=True).stdout.strip(),
            "transport": "Fast DDS, config/fastdds_large_frames.xml (SHM 128 MB), best-effort input, reliable output"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"\n{meta}\n")
    print("| node | size | rate | fps | sent / received | e2e p50 / p99 ms | node-added p50 / p99 ms | node CPU % | RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['node']} | {r['size']} | {r['rate']} | {r['fps']:.1f} | {r['sent']} / {r['tensors']} | "
              f"{r['e2e_ms_p50']:.1f} / {r['e2e_ms_p99']:.1f} | {r['added_ms_p50']:.2f} / {r['added_ms_p99']:.2f} | "
              f"{r['node_cpu_pct']:.0f} | {r['node_rss_mb_max']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
