#!/usr/bin/env python3
"""Start-up and memory of vision_preproc_node (CPU backend) at 1080p.

A Rust camera publisher (`vision_preproc play --loop --restamp`) sends 1920x1080 bgr8
frames at 30 Hz the whole time; an rclpy subscriber in this process listens on the
node's tensor topic. Each trial starts the node (default parameters: 640x480 letterbox
NCHW float32, backend cpu) and measures:

  start -> first tensor   process start (just before exec) -> the first tensor received
                          here (the goal: < 1 s cold, < 0.3 s warm)
  split into              start -> the node's "backend ..." log line (process load, rcl
                          init, DDS participant, backend), -> the first frame's publish
                          stamp (subscriptions, DDS discovery and matching, plus the wait
                          for the next frame: up to 33 ms at 30 Hz), -> tensor received
                          (preprocessing + tensor delivery). The first FrameTiming's
                          sequence tells whether the node had already published tensors
                          before this subscriber matched it (sequence > 0).
  RSS                     VmRSS, RssAnon (heap), RssFile, RssShmem (Fast DDS shared-memory
                          segments) of the node, sampled every 0.2 s for --hold seconds
                          while it processes the 30 Hz stream

Side by side: `--node LABEL=PATH` (repeatable) runs each binary in turn, alternated
trial by trial (cold, then warm, for each binary), against the same camera and subscriber:
on a loaded machine only ratios within one run mean anything. Each trial also reads the
node's log lines (rcutils wall-clock stamps, relative to the exec): `no publisher yet`
(participant up, input_qos auto waiting for the camera's publisher), `(subscribed)` (the
publisher seen, the subscription made), so that discovery of the camera, the subscription
and delivery can be told apart.

Cold vs warm: the CPU backend has no kernel cache, so "cold" means the node's files are
not in the page cache: before a cold trial, every file the node maps (its executable and
the shared libraries from /proc/<pid>/maps of an earlier trial) is dropped with
posix_fadvise(DONTNEED) (`fincore` before/after is recorded). Pages that another process
maps (the ROS libraries mapped by this script's rclpy, as on a robot where other ROS
nodes run) stay cached: that is what a node starting on a running ROS system sees. With
--drop-caches the whole page cache is dropped instead (root; it slows down everything
else on the machine for a moment). Each repeat is: cold trial, then --warm warm trials.

Usage: python3 bench/bench_startup.py [--repeats 5] [--warm 2] [--hold 5]
       [--out docs/evidence/startup.json] [--drop-caches] [--node LABEL=PATH ...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from vptools.fastdds import profile_var

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("ROS_DOMAIN_ID", str(random.randint(150, 230)))
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
os.environ.setdefault(profile_var(), str(ROOT / "config" / "fastdds_large_frames.xml"))

import numpy as np  # noqa: E402
import rclpy  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from vision_preproc_msgs.msg import FrameTiming, Tensor  # noqa: E402

from bench_node import bag_for, interrupt, proc_sample, save  # noqa: E402  (this script's folder)

BIN = ROOT / "target" / "release"
NODE = BIN / "vision_preproc_node"
LOG_TIME = re.compile(r"\[INFO\] \[(\d+\.\d+)\] \[[^\]]*\]: backend ")
#: The node's log lines that split its start-up (the first of each counts): name -> pattern.
MILESTONES = {
    "to_no_publisher_s": re.compile(r"\[INFO\] \[(\d+\.\d+)\] \[[^\]]*\]: input_qos auto: \S*/image: no publisher"),
    "to_subscribed_s": re.compile(r"\[INFO\] \[(\d+\.\d+)\] \[[^\]]*\]: input_qos auto: \S*/image .*\(subscribed\)"),
}


def milestones(log_lines: list[str], wall0_ns: int) -> dict[str, float]:
    """Seconds from the exec to each of [`MILESTONES`] (NaN when the log has no such line)."""
    out = {}
    for key, pattern in MILESTONES.items():
        hit = next((m for m in map(pattern.search, log_lines) if m), None)
        out[key] = float(hit.group(1)) - wall0_ns / 1e9 if hit else float("nan")
    return out


def mapped_files(pid: int) -> set[str]:
    out = set()
    try:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            f = line.split(maxsplit=5)
            if len(f) == 6 and f[5].startswith("/") and not f[5].startswith("/dev/") and " (deleted)" not in f[5]:
                out.add(f[5])
    except OSError:
        pass
    return out


def resident_mb(files: list[str]) -> float:
    """Page-cache MB of the files (fincore)."""
    p = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *files],
                       capture_output=True, text=True)
    return sum(int(x) for x in p.stdout.split() if x.isdigit()) / 2**20


def evict(files: list[str], drop_all: bool) -> None:
    if drop_all:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def table(results: list[dict]) -> list[str]:
    """Markdown rows: cold and warm trials of each binary, median [min-max]. "node-side"
    estimates when the node published its first tensor: the first FrameTiming this
    subscriber received has sequence k, so the node had published k tensors, one per 33 ms
    frame, before it."""
    for r in results:
        seq = r.get("first_timing_sequence")
        r["node_side_s"] = (r["first_tensor_s"] - seq / 30.0) if seq is not None else float("nan")
    rows = ["| binary | trials | n | start -> first tensor received s | node-side (est.) s | -> backend log s | "
            "-> no publisher yet s | -> subscribed s | first tensor's sequence | VmRSS MB | RssAnon MB | "
            "RssFile MB | RssShmem MB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    labels = list(dict.fromkeys(r.get("label", "node") for r in results))
    for label, kind in ((lb, k) for lb in labels for k in ("cold", "warm")):
        rs = [r for r in results if r["kind"] == kind and r.get("label", "node") == label]
        if not rs:
            continue

        def c(key, f="{:.2f}", sub=None):
            v = [(r[key][sub] if sub else r[key]) for r in rs]
            v = [x for x in v if x is not None and x == x]
            return f"{f.format(np.median(v))} [{f.format(min(v))}-{f.format(max(v))}]" if v else "-"

        seqs = ", ".join(str(r.get("first_timing_sequence")) for r in rs)
        rows.append(f"| {label} | {kind} | {len(rs)} | {c('first_tensor_s')} | {c('node_side_s')} | "
                    f"{c('to_backend_log_s')} | {c('to_no_publisher_s')} | {c('to_subscribed_s')} | {seqs} | "
                    f"{c('rss_mb_max', '{:.0f}', 'VmRSS')} | {c('rss_mb_max', '{:.0f}', 'RssAnon')} | "
                    f"{c('rss_mb_max', '{:.0f}', 'RssFile')} | {c('rss_mb_max', '{:.0f}', 'RssShmem')} |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warm", type=int, default=2, help="warm trials after each cold one")
    ap.add_argument("--hold", type=float, default=5.0, help="seconds the node runs after its first tensor")
    ap.add_argument("--drop-caches", action="store_true", help="drop the whole page cache before cold trials")
    ap.add_argument("--size", default="1920x1080", help="camera frames WxH (bgr8)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "evidence" / "startup.json"))
    ap.add_argument("--node", action="append", default=[], metavar="LABEL=PATH",
                    help="a node binary to run (repeat to compare binaries, alternated trial by trial); "
                         f"default: node={NODE}")
    args = ap.parse_args()
    nodes = [tuple(n.split("=", 1)) if "=" in n else (Path(n).name, n) for n in args.node] or [("node", str(NODE))]
    for _, path in nodes:
        if not Path(path).exists():
            raise SystemExit(f"{path} is missing: cargo build --release --bins")
    ns = "/startup"
    rclpy.init()
    peer = rclpy.create_node("bench_startup_peer", namespace=ns)
    first: list[tuple[float, int]] = []  # (monotonic receive time, wall-clock stamp ns)

    def on_tensor(t: Tensor) -> None:
        if not first:
            first.append((time.monotonic(), t.header.stamp.sec * 10**9 + t.header.stamp.nanosec))

    first_timing: list[tuple[int, int]] = []  # (sequence, stamp ns) of the first FrameTiming received

    def on_timing(m: FrameTiming) -> None:
        if not first_timing:
            first_timing.append((m.sequence, m.header.stamp.sec * 10**9 + m.header.stamp.nanosec))

    peer.create_subscription(Tensor, "tensor", on_tensor, QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE))
    peer.create_subscription(FrameTiming, "timing", on_timing, QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE))
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: [rclpy.spin_once(peer, timeout_sec=0.02) for _ in iter(stop.is_set, True)])
    spinner.start()
    trials = (args.repeats * (1 + args.warm) + 1) * len(nodes)
    player = subprocess.Popen([str(BIN / "vision_preproc"), "play", str(bag_for(*map(int, args.size.split("x")), ROOT / "bench" / ".cache")),
                               "--loop", "--restamp", "--image-topic", f"{ns}/image", "--camera-info-topic",
                               f"{ns}/camera_info", "--duration", str(trials * (args.hold + 15))],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    files = {path for _, path in nodes}
    results = []
    try:
        time.sleep(2.0)
        # Each binary primed, then per repeat its cold and warm trials, the binaries in
        # turn (the first of each repeat alternating).
        plan = [("prime", n) for n in nodes]
        for rep in range(args.repeats):
            order = nodes[rep % len(nodes):] + nodes[:rep % len(nodes)]
            plan += [(kind, n) for kind in ["cold"] + ["warm"] * args.warm for n in order]
        for i, (kind, (label, path)) in enumerate(plan):
            before = after = None
            if kind == "cold":
                flist = sorted(files)
                before = resident_mb(flist)
                evict(flist, args.drop_caches)
                after = resident_mb(flist)
            load = os.getloadavg()
            first.clear()
            first_timing.clear()
            wall0 = time.time_ns()
            t0 = time.monotonic()
            node = subprocess.Popen([path, "--ros-args", "-r", f"__ns:={ns}", "-p", "backend:=cpu"],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            log_lines: list[str] = []
            reader = threading.Thread(target=lambda: log_lines.extend(iter(node.stdout.readline, "")))
            reader.start()
            while not first and time.monotonic() - t0 < 15 and node.poll() is None:
                time.sleep(0.001)
            t_first = first[0][0] - t0 if first else float("nan")
            stamp_s = (first[0][1] - wall0) / 1e9 if first else float("nan")
            rss = []
            t_hold = time.monotonic()
            while time.monotonic() - t_hold < args.hold and node.poll() is None:
                s = proc_sample(node.pid)
                if s:
                    rss.append(s[1])
                time.sleep(0.2)
            files |= mapped_files(node.pid)
            interrupt(node)
            reader.join(timeout=5)
            log_s = float("nan")
            for line in log_lines:
                m = LOG_TIME.search(line)
                if m:
                    log_s = float(m.group(1)) - wall0 / 1e9
                    break
            r = {"trial": i, "label": label, "binary": path, "kind": kind, "load": load, "first_tensor_s": t_first, "to_backend_log_s": log_s,
                 "to_first_frame_stamp_s": stamp_s, "frame_to_tensor_s": t_first - stamp_s if first else float("nan"),
                 "first_timing_sequence": first_timing[0][0] if first_timing else None,
                 "first_timing_stamp_s": (first_timing[0][1] - wall0) / 1e9 if first_timing else None,
                 "cache_mb_before_evict": before, "cache_mb_after_evict": after,
                 "rss_mb_max": {k: max((x.get(k, float("nan")) for x in rss), default=float("nan"))
                                for k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "Pss", "Pss_Shmem")},
                 "rss_mb_end": rss[-1] if rss else {}, **milestones(log_lines, wall0)}
            results.append(r)
            print(json.dumps(r), flush=True)
            time.sleep(1.0)
    finally:
        interrupt(player)
        stop.set()
        spinner.join()
        peer.destroy_node()
        rclpy.shutdown()
    meta = save(args.out, {
        "eviction": "drop_caches" if args.drop_caches else "posix_fadvise DONTNEED of the node's mapped files",
        "files_evicted": sorted(files), "source": f"{args.size} bgr8 at 30 Hz (Rust player)",
        "transport": os.environ[profile_var()]}, results)
    print(f"\n{ {k: v for k, v in meta.items() if k != 'files_evicted'} }\n")
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
