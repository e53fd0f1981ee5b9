#!/usr/bin/env python3
"""The node through real DDS, side by side with a Python reference node.

For each node (vision_preproc_node on the CPU backend; bench/reference_node.py: rclpy +
OpenCV + NumPy), each camera size (1280x720, 1920x1080 bgr8) and each rate (30 Hz, max),
a camera publisher sends the frames, the node preprocesses them to 640x480 letterbox NCHW
float32, and an rclpy subscriber in this process records every tensor and FrameTiming.
The publisher is bench/rclpy_publisher.py (an rclpy camera driver: a new Image per frame,
stamped at publish) by default; with `--publisher rust` it is `vision_preproc play --loop
--restamp` (less CPU per frame, so more left to the nodes on a 2-core machine). Every
process uses the Fast DDS profile config/fastdds_large_frames.xml (or --segment-mb N: a
copy of it with an N MB shared-memory segment); input QoS best effort (sensor data),
outputs reliable.

Per run: end-to-end latency p50/p99 (header stamp = publish time -> tensor received here,
including this Python subscriber's deserialization of the 3.7 MB tensor), node-added
latency p50/p99 (FrameTiming.total_us: receive -> publish inside the node), achieved fps
(tensors received, first to last), drops = frames published - tensors received, split
into: lost before the node (best-effort DDS input, or the reference node's rclpy queue),
dropped by the node (vision_preproc keeps only the newest frame while busy:
FrameTiming.dropped_since_last) and lost after it (tensors the node published that did not
reach the subscriber: FrameTiming.sequence counts them); node CPU % and RSS (VmRSS and its
parts RssAnon = heap, RssShmem = shared memory, i.e. Fast DDS segments) sampled from /proc
every 0.5 s; the load average before and after. --runs N repeats everything N times
(interleaved). Writes JSON (every run) and prints a Markdown table (median over runs,
min-max in brackets).

Comparisons: `--old-bin DIR` adds the node kind `vision_preproc_old` (the previous
release, built into another target dir; same frames, same peers, same run); `--network WxH`
sets the network size of every node (default 640x480; the message-path figures use 640x640);
`--delivery` runs the delivery cases instead (a stock camera = no Fast DDS profile in the
camera process: reliable, best effort; and a best-effort camera with the profile), each
node with its defaults and no profile of its own (neither profile variable set in the
node's process), recording frames sent, received, published, tensors and the
/diagnostics levels the node reported.

Usage: python3 bench/bench_node.py [--runs 3] [--seconds 20] [--out docs/evidence/node.json]
       [--only "vision_preproc 1920x1080 30"] [--publisher rclpy|rust] [--segment-mb 64]
       [--nodes vision_preproc,reference] [--sizes 1280x720,1920x1080] [--rates 30,max]
       [--old-bin DIR] [--network 640x640] [--delivery]
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

from vptools.fastdds import profile_var, with_profile
from vptools.procs import cpu_s

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("ROS_DOMAIN_ID", str(random.randint(150, 230)))
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
PROFILE = ROOT / "config" / "fastdds_large_frames.xml"
#: The profile's variable for the installed Fast DDS (Jazzy's 2.14 reads only the old name).
PROFILE_VAR = profile_var()


def use_profile(segment_mb: int | None) -> str:
    """Point the Fast DDS profile variable at the profile (a copy with another segment size
    for --segment-mb) before rclpy is imported; returns a description."""
    if segment_mb is None:
        os.environ.setdefault(PROFILE_VAR, str(PROFILE))
        path = Path(os.environ[PROFILE_VAR])
    else:
        text = PROFILE.read_text()
        a = text.index("<segment_size>") + len("<segment_size>")
        b = text.index("</segment_size>")
        path = ROOT / "bench" / ".cache" / f"fastdds_shm_{segment_mb}mb.xml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text[:a] + str(segment_mb * 1024 * 1024) + text[b:])
        os.environ[PROFILE_VAR] = str(path)
    seg = path.read_text().split("<segment_size>")[1].split("</segment_size>")[0]
    return f"{path.name} (SHM segment {int(seg) / 2**20:.0f} MB)"


import numpy as np  # noqa: E402

BIN = ROOT / "target" / "release"
OLD_BIN: Path | None = None  # --old-bin
NETWORK = (640, 480)  # --network


def bag_for(w: int, h: int, cache: Path) -> Path:
    """8 frames of real photographs (test/data) scaled to w x h (INTER_CUBIC), bgr8, 30 Hz."""
    from vptools.bags import write_bag
    from vptools.sources import camera_frames_bgr8
    path = cache / f"bgr8_{w}x{h}"
    if not (path / "metadata.yaml").exists():
        write_bag(path, camera_frames_bgr8(w, h, 8), storage="mcap", with_camera_info=False)
    return path


def proc_sample(pid: int) -> tuple[float, dict] | None:
    """(utime + stime in seconds, {VmRSS, RssAnon, RssFile, RssShmem, Pss, Pss_Anon, Pss_Shmem}
    in MB) of a process."""
    cpu = cpu_s(pid)
    if cpu is None:
        return None
    try:
        rss = {}
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                rss[key] = int(line.split()[1]) / 1024
        # Proportional set size: shared pages divided among the processes that map them
        # (the Fast DDS segments are mapped by every participant that talks to this one).
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key = line.split(":")[0]
            if key in ("Pss", "Pss_Anon", "Pss_Shmem"):
                rss[key] = int(line.split()[1]) / 1024
        return (cpu, rss) if "VmRSS" in rss else None
    except (OSError, IndexError, ValueError):
        return None


def interrupt(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGINT `proc`, wait up to `timeout` s for it to exit, else kill it."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def save(out: str, meta: dict, results: list[dict]) -> dict:
    """Write {"meta": the run's date, CPU count and commit + `meta`, "results"} to `out`;
    returns the whole meta."""
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cpus": os.cpu_count(),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                     text=True).stdout.strip(), **meta}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return meta


def keep(results: list[dict], r: dict, run: int) -> None:
    """Append `r` (of repeat `run`, from 0) to `results` and print it as one JSON line."""
    r["run"] = run + 1
    results.append(r)
    print(json.dumps({k: v for k, v in r.items() if not k.startswith("publisher_")}), flush=True)


def pct(v: list[float], q: float) -> float:
    return float(np.percentile(v, q)) if v else float("nan")


def run_one(kind: str, w: int, h: int, rate: str, seconds: float, cache: Path, idx: int,
            publisher: str = "rclpy", node_params: list[str] | None = None, case: str = "") -> dict:
    """One run. `case` (--delivery): "stock-reliable", "stock-best-effort" or
    "profile-best-effort": the camera's QoS and profile; the node then runs with its
    defaults and without a profile of its own."""
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from vision_preproc_msgs.msg import FrameTiming, Tensor

    ns = f"/bench{idx}"
    load0 = os.getloadavg()
    nw, nh = NETWORK
    node_env = with_profile(dict(os.environ), None) if case else dict(os.environ)
    if kind in ("vision_preproc", "vision_preproc_old"):
        binary = (OLD_BIN if kind == "vision_preproc_old" else BIN) / "vision_preproc_node"
        cmd = [str(binary), "--ros-args", "-r", f"__ns:={ns}", "--params-file", str(ROOT / "config" / "default.yaml"),
               "-p", "backend:=cpu", "-p", f"network_image_width:={nw}", "-p", f"network_image_height:={nh}"]
        if kind == "vision_preproc_old":
            # This config/default.yaml says auto, which the old release does not know; its
            # own default was sensor_data: each node gets its own release's default.
            cmd += ["-p", "input_qos:=sensor_data"]
        for p in node_params or []:
            cmd += ["-p", p]
    else:
        cmd = [sys.executable, str(ROOT / "bench" / "reference_node.py"), "--width", str(nw), "--height", str(nh),
               "--ros-args", "-r", f"__ns:={ns}"]
    node = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=node_env, text=True)
    node_log: list[str] = []
    log_reader = threading.Thread(target=lambda: node_log.extend(node.stdout), daemon=True)
    log_reader.start()
    rclpy.init()
    peer = rclpy.create_node(f"bench_peer_{idx}", namespace=ns)
    reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    e2e: list[float] = []
    added: list[float] = []
    work: list[float] = []  # FrameTiming.preprocess_us: the preprocessing alone
    t_recv: list[float] = []
    seqs: list[int] = []
    node_dropped = [0]

    def on_tensor(t: Tensor) -> None:
        now = time.time_ns()
        e2e.append((now - (t.header.stamp.sec * 10**9 + t.header.stamp.nanosec)) / 1e6)
        t_recv.append(time.monotonic())

    def on_timing(m: FrameTiming) -> None:
        added.append(m.total_us / 1e3)
        work.append(m.preprocess_us / 1e3)
        seqs.append(m.sequence)
        node_dropped[0] += m.dropped_since_last

    peer.create_subscription(Tensor, "tensor", on_tensor, reliable)
    peer.create_subscription(FrameTiming, "timing", on_timing, reliable)
    diag: list[tuple[int, str, dict]] = []  # (level, message, values) of the node's statuses

    def on_diag(a: DiagnosticArray) -> None:
        for st in a.status:
            if st.name.startswith(ns.strip("/")):
                diag.append((st.level[0] if isinstance(st.level, bytes) else int(st.level), st.message,
                             {v.key: v.value for v in st.values}))

    peer.create_subscription(DiagnosticArray, "/diagnostics", on_diag, reliable)
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: [rclpy.spin_once(peer, timeout_sec=0.05) for _ in iter(stop.is_set, True)])
    spinner.start()
    if publisher == "rust":
        play_cmd = [str(BIN / "vision_preproc"), "play", str(bag_for(w, h, cache)), "--loop", "--restamp",
                    "--image-topic", f"{ns}/image", "--camera-info-topic", f"{ns}/camera_info",
                    "--wait-subscribers", "1", "--duration", str(seconds)]
        play_cmd += ["--max"] if rate == "max" else ["--rate", "1"]
        if case == "stock-reliable":
            play_cmd += ["--reliable"]
    else:
        play_cmd = [sys.executable, str(ROOT / "bench" / "rclpy_publisher.py"), "--width", str(w), "--height",
                    str(h), "--rate", "0" if rate == "max" else rate, "--seconds", str(seconds),
                    "--topic", f"{ns}/image", "--wait-subscribers", "1"]
        if case == "stock-reliable":
            play_cmd += ["--reliable"]
    camera_env = with_profile(dict(os.environ), None) if case.startswith("stock") else dict(os.environ)
    if case == "profile-best-effort":
        camera_env[PROFILE_VAR] = str(PROFILE)
    samples = []
    player = subprocess.Popen(play_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=camera_env)
    while player.poll() is None:
        s = proc_sample(node.pid)
        if s:
            samples.append((time.monotonic(), *s))
        time.sleep(0.5)
    out, err = player.communicate()
    time.sleep(1.5)  # tensors still in flight
    stop.set()
    spinner.join()
    interrupt(node)
    log_reader.join(timeout=2)
    stopped = next((line.split("stopped: ")[1].strip() for line in node_log if "stopped: " in line), "")
    peer.destroy_node()
    rclpy.shutdown()
    sent = int(out.split("play: ")[1].split(" images")[0]) if "play: " in out else -1
    tensors = len(e2e)
    processed = max(seqs) + 1 if seqs else 0
    warm = [s for s in samples if s[0] >= samples[0][0] + 2.0] if samples else []
    cpu_pct = 100 * (warm[-1][1] - warm[0][1]) / (warm[-1][0] - warm[0][0]) if len(warm) >= 2 else float("nan")
    rss = {f"{k}_max": max((s[2].get(k, float("nan")) for s in samples), default=float("nan"))
           for k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "Pss", "Pss_Shmem")}
    fps = (len(t_recv) - 1) / (t_recv[-1] - t_recv[0]) if len(t_recv) >= 2 else 0.0
    received = int(stopped.split(" frames received")[0]) if stopped else None
    return {
        "node": kind, "publisher": publisher, "size": f"{w}x{h}", "rate": rate, "seconds": seconds,
        "case": case, "network": f"{nw}x{nh}", "node_stopped": stopped, "node_received": received,
        "diag_max_level": max((d[0] for d in diag), default=None),
        "diag_warn_messages": sorted({d[1] for d in diag if d[0] == 1}),
        "diag_last_values": diag[-1][2] if diag else {},
        "node_log_warnings": [line.strip()[:400] for line in node_log if "WARN" in line][:5],
        "domain": int(os.environ["ROS_DOMAIN_ID"]), "load_before": load0, "load_after": os.getloadavg(),
        "sent": sent, "tensors": tensors, "dropped": sent - tensors if sent >= 0 else None,
        "lost_before_node": sent - processed - node_dropped[0] if sent >= 0 and seqs else None,
        "dropped_by_node": node_dropped[0], "lost_after_node": processed - tensors if seqs else None,
        "fps": fps,
        "e2e_ms_p50": pct(e2e, 50), "e2e_ms_p99": pct(e2e, 99),
        "added_ms_p50": pct(added, 50), "added_ms_p99": pct(added, 99),
        "preprocess_ms_p50": pct(work, 50), "preprocess_ms_p99": pct(work, 99),
        "added_minus_preprocess_ms_p50": pct([a - b for a, b in zip(added, work)], 50),
        "added_minus_preprocess_ms_p99": pct([a - b for a, b in zip(added, work)], 99),
        "node_cpu_pct": cpu_pct, "node_rss_mb_max": rss["VmRSS_max"], **{f"node_{k}_mb": v for k, v in rss.items()},
        "publisher_out": out.strip()[-300:], "publisher_stderr": err.strip()[-300:],
    }


def med(v: list[float]) -> float:
    v = [x for x in v if x is not None and x == x]
    return float(np.median(v)) if v else float("nan")


def table(results: list[dict]) -> list[str]:
    """Markdown rows: one per (node, publisher, size, rate), median over runs [min-max]."""
    groups: dict = {}
    for r in results:
        groups.setdefault((r["node"], r["publisher"], r["size"], r["rate"]), []).append(r)

    def cell(rs, key, fmt):
        v = [r[key] for r in rs if r[key] is not None and r[key] == r[key]]
        if not v:
            return "-"
        return f"{fmt.format(med(v))} [{fmt.format(min(v))}-{fmt.format(max(v))}]" if len(v) > 1 else fmt.format(v[0])

    rows = ["| node | publisher | size | rate | runs | fps | drops (sent) | before / in / after node | "
            "e2e p50 ms | e2e p99 ms | node-added p50 ms | node-added p99 ms | of which preprocessing p50 / p99 ms | "
            "node CPU % | RSS MB (anon + shmem) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (node, pub, size, rate), rs in groups.items():
        drops = "/".join(str(r["dropped"]) for r in rs)
        sent = "/".join(str(r["sent"]) for r in rs)
        split = "; ".join(f"{r['lost_before_node']}/{r['dropped_by_node']}/{r['lost_after_node']}" for r in rs)
        rss = f"{med([r['node_VmRSS_max_mb'] for r in rs]):.0f} ({med([r['node_RssAnon_max_mb'] for r in rs]):.0f} + " \
              f"{med([r['node_RssShmem_max_mb'] for r in rs]):.0f})"
        rows.append(f"| {node} | {pub} | {size} | {rate} | {len(rs)} | {cell(rs, 'fps', '{:.1f}')} | {drops} ({sent}) | "
                    f"{split} | {cell(rs, 'e2e_ms_p50', '{:.1f}')} | {cell(rs, 'e2e_ms_p99', '{:.1f}')} | "
                    f"{cell(rs, 'added_ms_p50', '{:.1f}')} | {cell(rs, 'added_ms_p99', '{:.1f}')} | "
                    f"{med([r.get('preprocess_ms_p50') for r in rs]):.1f} / {med([r.get('preprocess_ms_p99') for r in rs]):.1f} | "
                    f"{cell(rs, 'node_cpu_pct', '{:.0f}')} | {rss} |")
    return rows


def delivery(args) -> int:
    """The delivery cases, each node kind, one run each (interleaved), JSON + a table."""
    cache = ROOT / "bench" / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    results = []
    idx = 500
    cases = ["stock-reliable", "stock-best-effort", "profile-best-effort"]
    for run in range(args.runs):
        for case in cases:
            for size in args.sizes.split(","):
                w, h = map(int, size.split("x"))
                for kind in args.nodes.split(","):
                    idx += 1
                    if args.only and args.only not in f"{kind} {case} {w}x{h}":
                        continue
                    keep(results, run_one(kind, w, h, "30", args.seconds, cache, idx, args.publisher, [],
                                          case=case), run)
    meta = save(args.out, {"old_bin": str(OLD_BIN), "network": args.network, "seconds": args.seconds,
                           "runs": args.runs}, results)
    print(f"\n{meta}\n")
    print("| node | camera | publisher | size | sent | received by the node | tensors | delivered % | max diag level | "
          "WARN message | node RSS MB (anon + shmem) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        pct_ = 100 * r["tensors"] / r["sent"] if r["sent"] and r["sent"] > 0 else float("nan")
        print(f"| {r['node']} | {r['case']} | {r['publisher']} | {r['size']} | {r['sent']} | {r['node_received']} | {r['tensors']} | "
              f"{pct_:.1f} | {r['diag_max_level']} | {'; '.join(r['diag_warn_messages'])[:80]} | "
              f"{r['node_VmRSS_max_mb']:.0f} ({r['node_RssAnon_max_mb']:.0f} + {r['node_RssShmem_max_mb']:.0f}) |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "docs" / "evidence" / "node.json"))
    ap.add_argument("--only", default="", help="substring filter on 'node size rate'")
    ap.add_argument("--publisher", choices=["rclpy", "rust"], default="rclpy")
    ap.add_argument("--nodes", default="vision_preproc,reference")
    ap.add_argument("--sizes", default="1280x720,1920x1080")
    ap.add_argument("--rates", default="30,max")
    ap.add_argument("--node-params", default="", help="extra vision_preproc_node parameters, name:=value,...")
    ap.add_argument("--segment-mb", type=int, help="use a copy of the profile with this SHM segment size")
    ap.add_argument("--old-bin", help="target/release of the previous release: adds node kind vision_preproc_old")
    ap.add_argument("--network", default="640x480", help="network size WxH of every node")
    ap.add_argument("--delivery", action="store_true",
                    help="the delivery cases (stock reliable / stock best-effort / profile best-effort camera)")
    args = ap.parse_args()
    global OLD_BIN, NETWORK
    OLD_BIN = Path(args.old_bin) if args.old_bin else None
    NETWORK = tuple(int(x) for x in args.network.split("x"))
    if args.delivery:
        return delivery(args)
    transport = use_profile(args.segment_mb)
    cache = ROOT / "bench" / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    results = []
    idx = 0
    for run in range(args.runs):
        for size in args.sizes.split(","):
            w, h = map(int, size.split("x"))
            for rate in args.rates.split(","):
                for kind in args.nodes.split(","):
                    idx += 1
                    if args.only and args.only not in f"{kind} {w}x{h} {rate}":
                        continue
                    keep(results, run_one(kind, w, h, rate, args.seconds, cache, idx, args.publisher,
                                          [p for p in args.node_params.split(",") if p]), run)
    meta = save(args.out, {"transport": f"Fast DDS, {transport}, best-effort input, reliable output",
                           "publisher": args.publisher, "runs": args.runs, "seconds": args.seconds}, results)
    loads = [r["load_before"][0] for r in results] + [r["load_after"][0] for r in results]
    print(f"\n{meta}; load avg {min(loads):.1f}-{max(loads):.1f}\n")
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
