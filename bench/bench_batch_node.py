#!/usr/bin/env python3
"""Multi-camera batching through real DDS: ONE node with N `inputs` (one
`TensorBatch` per batch) against N single-camera nodes, in the same run, same cameras.

Per side: N camera processes (`vision_preproc play --loop --restamp` of a bag of real
photographs scaled to the size, bgr8, at the recorded 30 Hz or --max; one per camera,
their phases not aligned, as real cameras), the node(s) under test, and an rclpy
subscriber in this process for the tensors and FrameTiming. The Fast DDS profile
config/fastdds_large_frames.xml in every process (as bench/bench_node.py); input QoS best
effort, outputs reliable.

Figures per side: node-added latency p50/p99 (FrameTiming.total_us: batched = from the
batch's forming to its publication; separate = receive -> publish), age at publish per
camera frame (the node's publish time - the frame's stamp = its publish time by the
camera: BatchItem.age_us of every valid, not repeated item, so the wait for the other
cameras is included; separate: FrameTiming.age_us), end-to-end per camera frame (stamp ->
its tensor received here, including this rclpy subscriber's deserialization: a batch of N
is N tensors in one message), tensors
(batches) per second, frames sent / published (batched: valid, not repeated items) /
dropped, the nodes' CPU % (sum) and RSS (sum). Prints one JSON line per run and writes
the JSON to --out.

Usage: python3 bench/bench_batch_node.py [--cameras 2] [--size 1280x720] [--rate 30|max]
       [--seconds 20] [--runs 2] [--backend cpu|cuda] [--network 640x640] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("ROS_DOMAIN_ID", str(random.randint(150, 230)))
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"

import bench_node  # noqa: E402  (this script's folder: its profile, bags, /proc sampling, percentiles)
from bench_node import bag_for, interrupt, pct, proc_sample, save  # noqa: E402

BIN = ROOT / "target" / "release"


def cameras(bag: Path, topics: list[str], rate: str, seconds: float) -> list[subprocess.Popen]:
    procs = []
    for t in topics:
        cmd = [str(BIN / "vision_preproc"), "play", str(bag), "--loop", "--restamp", "--image-topic", t,
               "--camera-info-topic", t.rsplit("/", 1)[0] + "/camera_info", "--wait-subscribers", "1",
               "--duration", str(seconds)]
        cmd += ["--max"] if rate == "max" else ["--rate", "1"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def run_side(side: str, n: int, w: int, h: int, rate: str, seconds: float, backend: str, net: tuple[int, int],
             cache: Path, idx: int) -> dict:
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from vision_preproc_msgs.msg import FrameTiming, Tensor, TensorBatch

    nw, nh = net
    base = ["--params-file", str(ROOT / "config" / "default.yaml"), "-p", f"backend:={backend}",
            "-p", f"network_image_width:={nw}", "-p", f"network_image_height:={nh}", "-p", "resize_mode:=letterbox"]
    if side == "batched":
        namespaces = [f"/bb{idx}"]
        topics = [f"/bb{idx}/cam{i}/image" for i in range(n)]
        node_args = [base + ["-p", f"inputs:=[{', '.join(f'cam{i}/image' for i in range(n))}]"]]
    else:
        namespaces = [f"/bs{idx}_{i}" for i in range(n)]
        topics = [f"{ns}/image" for ns in namespaces]
        node_args = [base] * n
    nodes = []
    logs: list[list[str]] = []
    for ns, args in zip(namespaces, node_args):
        cmd = [str(BIN / "vision_preproc_node"), "--ros-args", "-r", f"__ns:={ns}", *args]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log: list[str] = []
        threading.Thread(target=lambda p=p, log=log: log.extend(p.stdout), daemon=True).start()
        nodes.append(p)
        logs.append(log)
    rclpy.init()
    peer = rclpy.create_node(f"bench_batch_peer_{idx}_{side}")
    reliable = QoSProfile(depth=20, reliability=ReliabilityPolicy.RELIABLE)
    e2e: list[float] = []
    ages: list[float] = []  # publish time - the frame's stamp, in the node (no DDS out)
    added: list[float] = []
    t_recv: list[float] = []
    published = [0]
    node_dropped = [0]

    def stamp_ns(hd) -> int:
        return hd.stamp.sec * 10**9 + hd.stamp.nanosec

    def on_batch(b: TensorBatch) -> None:
        now = time.time_ns()
        t_recv.append(time.monotonic())
        for it in b.items:
            if it.valid and not it.repeated:
                e2e.append((now - stamp_ns(it.header)) / 1e6)
                ages.append(it.age_us / 1e3)
                published[0] += 1

    def on_tensor(t: Tensor) -> None:
        now = time.time_ns()
        t_recv.append(time.monotonic())
        e2e.append((now - stamp_ns(t.header)) / 1e6)
        published[0] += 1

    def on_timing(m: FrameTiming) -> None:
        added.append(m.total_us / 1e3)
        if side == "separate":
            ages.append(m.age_us / 1e3)
        node_dropped[0] += m.dropped_since_last

    for ns in namespaces:
        if side == "batched":
            peer.create_subscription(TensorBatch, f"{ns}/tensor", on_batch, reliable)
        else:
            peer.create_subscription(Tensor, f"{ns}/tensor", on_tensor, reliable)
        peer.create_subscription(FrameTiming, f"{ns}/timing", on_timing, reliable)
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: [rclpy.spin_once(peer, timeout_sec=0.05)
                                               for _ in iter(stop.is_set, True)])
    spinner.start()
    load0 = os.getloadavg()
    players = cameras(bag_for(w, h, cache), topics, rate, seconds)
    samples: list[tuple[float, float, float]] = []
    while any(p.poll() is None for p in players):
        got = [proc_sample(p.pid) for p in nodes]
        if all(got):
            samples.append((time.monotonic(), sum(g[0] for g in got), sum(g[1]["VmRSS"] for g in got)))
        time.sleep(0.5)
    outs = [p.communicate() for p in players]
    time.sleep(1.5)  # tensors still in flight
    stop.set()
    spinner.join()
    for p in nodes:
        interrupt(p)
    peer.destroy_node()
    rclpy.shutdown()
    sent = sum(int(o.split("play: ")[1].split(" images")[0]) if "play: " in o else 0 for o, _ in outs)
    warm = [s for s in samples if s[0] >= samples[0][0] + 2.0] if samples else []
    cpu_pct = 100 * (warm[-1][1] - warm[0][1]) / (warm[-1][0] - warm[0][0]) if len(warm) >= 2 else float("nan")
    span = (t_recv[-1] - t_recv[0]) if len(t_recv) >= 2 else 0.0
    return {
        "side": side, "cameras": n, "size": f"{w}x{h}", "rate": rate, "seconds": seconds, "backend": backend,
        "network": f"{nw}x{nh}", "load_before": load0, "load_after": os.getloadavg(),
        "sent": sent, "published_frames": published[0], "dropped": sent - published[0],
        "dropped_by_node": node_dropped[0], "messages": len(t_recv),
        "messages_per_s": (len(t_recv) - 1) / span if span else 0.0,
        "frames_per_s": published[0] / span if span else 0.0,
        "added_ms_p50": pct(added, 50), "added_ms_p99": pct(added, 99),
        "e2e_ms_p50": pct(e2e, 50), "e2e_ms_p99": pct(e2e, 99),
        "age_at_publish_ms_p50": pct(ages, 50), "age_at_publish_ms_p99": pct(ages, 99),
        "nodes_cpu_pct": cpu_pct, "nodes_rss_mb_max": max((s[2] for s in samples), default=float("nan")),
        "node_stopped": [next((ln.split("stopped: ")[1].strip() for ln in log if "stopped: " in ln), "")
                         for log in logs],
        "camera_errors": [e.strip()[-200:] for _, e in outs if e.strip()][:3],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cameras", type=int, default=2)
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--rate", default="30", help="30 (the bag's recorded rate) or max")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--network", default="640x640")
    ap.add_argument("--out", default=str(ROOT / "docs" / "evidence" / "batch_node.json"))
    a = ap.parse_args()
    profile = bench_node.use_profile(None)
    w, h = (int(v) for v in a.size.split("x"))
    net = tuple(int(v) for v in a.network.split("x"))
    cache = ROOT / "bench" / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    results = []
    idx = 0
    for run in range(a.runs):
        # Interleaved, the order alternating, so drift in the machine's load hits both.
        for side in (["batched", "separate"] if run % 2 == 0 else ["separate", "batched"]):
            r = run_side(side, a.cameras, w, h, a.rate, a.seconds, a.backend, net, cache, idx)
            r["run"] = run + 1
            idx += 1
            results.append(r)
            print(json.dumps(r), flush=True)
    save(a.out, {"profile": profile, "args": vars(a)}, results)
    for side in ("batched", "separate"):
        rs = [r for r in results if r["side"] == side]
        print(f"{side}: " + "; ".join(
            f"run {r['run']}: added p50 {r['added_ms_p50']:.2f} p99 {r['added_ms_p99']:.2f} ms, age at publish "
            f"p50 {r['age_at_publish_ms_p50']:.2f} p99 {r['age_at_publish_ms_p99']:.2f} ms, e2e p50 "
            f"{r['e2e_ms_p50']:.2f} p99 {r['e2e_ms_p99']:.2f} ms, {r['frames_per_s']:.1f} frames/s, "
            f"sent {r['sent']} published {r['published_frames']} dropped {r['dropped']}, cpu "
            f"{r['nodes_cpu_pct']:.0f}%, rss {r['nodes_rss_mb_max']:.0f} MB" for r in rs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
