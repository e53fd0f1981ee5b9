"""tensor vs tensor_ref, and a camera process vs a camera inside the node, side by side in
one run (docs/HANDOFF.md, docs/CAMERAS.md, docs/BENCHMARKS.md).

One node (CPU backend unless --backend), one camera, and a consumer process subscribed to
ONE of the two topics at a time, alternating phases of --seconds each (--rounds times),
for each of --paths:

- s: the camera is a process (`vision_preproc play --loop --restamp`: the stamp is the
  publish time) whose `sensor_msgs/Image` crosses DDS into the node; consumer on `tensor`;
- a: the same camera; consumer on `tensor_ref`;
- c: the same camera's frames as JPEG (quality 90, `sensor_msgs/CompressedImage` from
  `play` of a bag of them: `<image>/compressed`) into a node with `image_transport:
  compressed`, which decodes them (the CPU backend on the CPU, CUDA with nvJPEG where it
  can: docs/COMPRESSED.md); consumer on `tensor_ref`. Against (a): raw vs compressed
  frames over DDS;
- b: the camera inside the node, a live GStreamer source of the same size and rate
  (`gst:videotestsrc is-live=true ...`: the stamp is its capture time); consumer on
  `tensor_ref`, taking each tensor from the pool's socket (the ready signal, protocol 2:
  docs/HANDOFF.md), as TensorRefSubscription does by itself on the node's machine. The
  node's `Input frame copies` (/diagnostics) is the ledger of its host copies;
- t: as b, the consumer on the `TensorRef` topic's messages (`fast_path=False`), as (a)
  and (c) are;
- v: the camera process publishes an H.264 stream (a photograph panned across, x264enc
  veryfast, no B-frames, a key frame a second: `foxglove_msgs/CompressedVideo` from `play`
  of a bag of it, on `<image>/foxglove`) into a node with `image_transport: foxglove`,
  which decodes it (docs/VIDEO.md: the CPU's avdec_h264 here, NVDEC on an NVIDIA GPU);
  consumer on `tensor_ref`;
- f: what users run today: the same stream decoded by a decoder process (PyAV's libavcodec,
  slice threads, into bgr24 by swscale, in an rclpy process, as ffmpeg_image_transport's
  subscriber does) and published as a bgr8 `sensor_msgs/Image` with the packet's stamp
  into the node; consumer on `tensor_ref`. Against (v): decoding in the node against a
  decoder process and a raw image over DDS. The CPU time of the node and of the decoder
  process is kept per phase (`cpu_node_pct`, `cpu_decoder_pct`: % of one core).

The consumers:

- `tensor`: rclpy's typed `Tensor`, the data as a numpy array (`np.frombuffer`), what a
  Python inference process does with the tensor topic;
- `tensor_ref`: `vision_preproc_consumer.TensorRefSubscription`, `frame.array()` (a numpy
  view of the shared block), released after use; on the socket (`tensor_ref`) or on the
  topic (`tensor_ref_topic`). With the socket, the node's own report of the consumer
  (`consumer_timing`: camera stamp -> acquired p50) is kept beside the consumer's own
  measure of the same (camera stamp -> its callback, p50 over the same last 300 frames).

Per phase: camera stamp -> array usable in the consumer, p50/p99 (ms), split at the
node's publication (FrameTiming.age_us: stamp -> published; the rest: published -> array,
what the hand-off changes); node-added
latency (FrameTiming.total_us) p50/p99; FrameTiming.outputs; memory (max, MB): RSS of
node and consumer, and their PSS summed (shared pages counted once); frames the consumer
got. Each phase has its own node and camera.

  python3 bench/bench_handoff.py --seconds 15 --rounds 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def consumer(topic: str, ns: str, seconds: float, out: Path, use_torch: bool = False, hold_ms: float = 0.0,
             batch: bool = False, executor_kind: str = "single") -> None:
    """The consumer process: subscribe to `topic` (tensor, tensor_ref, or both: each
    block's tensor compared with the Tensor of the same stamp), record per frame (stamp ->
    tensor usable) and FrameTiming, then write JSON. `use_torch`: the tensor as a CUDA
    torch tensor (tensor: `torch.from_numpy(array).cuda()`, synchronized; tensor_ref:
    `torch.as_tensor(frame.array(), device="cuda")`, which must be the block itself:
    `data_ptr()` == the mapped address). `hold_ms`: hold each frame that long (a slow
    consumer) and check that its tensor did not change meanwhile. `batch`: the node has
    several inputs (`TensorBatch` on tensor); a set's age is its oldest valid item's.
    `executor_kind`: rclpy's SingleThreadedExecutor (`single`) or its EventsExecutor
    (`events`, rclpy.experimental: the executor in C++)."""
    import rclpy
    import rclpy.executors
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from vision_preproc_msgs.msg import FrameTiming, Tensor, TensorBatch

    fast_path = topic != "tensor_ref_topic"
    topic = "tensor_ref" if topic == "tensor_ref_topic" else topic

    from vision_preproc_consumer import TensorRefSubscription
    torch = None
    if use_torch:
        import torch
    rclpy.init()
    node = rclpy.create_node("bench_handoff_consumer", namespace=ns)
    t0 = time.time()
    ages: dict[int, float] = {}  # stamp (ns) -> stamp -> tensor usable, ms
    # stamp -> after the TensorRef went out: received, GPU work done, tensor usable (ms)
    splits: dict[int, tuple[float, float, float]] = {}
    entries: dict[int, float] = {}  # stamp -> camera stamp -> the callback began (ms)
    node_reports: list[dict] = []  # this consumer's status on consumer_timing
    # stamp -> (node-added ms, outputs, age at publish ms, upload stage ms: the host staging too)
    timings: dict[int, tuple[float, int, float, float]] = {}
    checksum = 0.0
    checks = {"data_ptr_equal": 0, "data_ptr_differ": 0, "held_stable": 0, "held_changed": 0,
              "same_bytes": 0, "different_bytes": 0, "memory_kinds": []}
    tensors: dict[int, bytes] = {}  # both: stamp -> Tensor bytes (or block bytes), whichever came first
    refs: dict[int, bytes] = {}

    def stamp_s(h) -> float:
        return h.stamp.sec + h.stamp.nanosec * 1e-9

    def key(h) -> int:
        return h.stamp.sec * 1_000_000_000 + h.stamp.nanosec

    def age_ms(msg) -> float:
        """Now minus the camera stamp (a batch: its oldest valid item's), ms."""
        stamps = [stamp_s(i.header) for i in getattr(msg, "items", []) if i.valid] or [stamp_s(msg.header)]
        return (time.time() - min(stamps)) * 1e3

    def compare(k: int) -> None:
        if k in tensors and k in refs:
            checks["same_bytes" if tensors.pop(k) == refs.pop(k) else "different_bytes"] += 1

    def on_tensor(msg) -> None:
        nonlocal checksum
        a = np.frombuffer(msg.data, dtype=np.float32).reshape(tuple(msg.shape))
        if torch is not None:
            t = torch.from_numpy(a).cuda()
            torch.cuda.synchronize()
        if topic == "both":
            tensors[key(msg.header)] = a.tobytes()
            compare(key(msg.header))
            return
        ages[key(msg.header)] = age_ms(msg)
        checksum += float(t[0, 0, 0, 0]) if torch is not None else float(a[0, 0, 0, 0])

    def value(frame):
        """The frame's tensor as the consumer uses it, and its address."""
        v = frame.array()
        if torch is None:
            return v, v.__array_interface__["data"][0]
        t = torch.as_tensor(v, device="cuda") if hasattr(v, "__cuda_array_interface__") else torch.from_numpy(v)
        address = v.__cuda_array_interface__["data"][0] if hasattr(v, "__cuda_array_interface__") else \
            v.__array_interface__["data"][0]
        return t, address

    def on_frame(frame) -> None:
        nonlocal checksum
        ready = time.time()
        with frame:
            t, address = value(frame)
            k = key(frame.msg.header)
            if topic != "both":
                ages[k] = age_ms(frame.msg)
                entries[k] = (ready - stamp_s(frame.msg.header)) * 1e3
                # After the TensorRef went out (its item's age then): received (the socket's
                # descriptor, or the topic's message in the callback: DDS, the executor), GPU
                # work done (the event), tensor usable (ms).
                items = [i for i in frame.msg.items if i.valid]
                got = frame.received_ns / 1e9 if frame.sent_ns else received.get(k)
                if len(items) == 1 and got is not None:
                    out_at = stamp_s(frame.msg.header) + items[0].age_us * 1e-6
                    splits[k] = ((got - out_at) * 1e3, (ready - out_at) * 1e3,
                                 (time.time() - out_at) * 1e3)
            if frame.msg.memory_kind not in checks["memory_kinds"]:
                checks["memory_kinds"].append(int(frame.msg.memory_kind))
            if torch is not None:
                checks["data_ptr_equal" if t.data_ptr() == address else "data_ptr_differ"] += 1
            if hold_ms > 0:
                before = float(t.double().sum()) if torch is not None else float(t.astype(np.float64).sum())
                time.sleep(hold_ms / 1e3)
                after = float(t.double().sum()) if torch is not None else float(t.astype(np.float64).sum())
                checks["held_stable" if before == after else "held_changed"] += 1
            if topic == "both":
                refs[k] = t.cpu().numpy().tobytes() if torch is not None else t.tobytes()
                compare(k)
            else:
                checksum += float(t[0, 0, 0, 0])

    qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)
    sub = None
    if topic in ("tensor", "both"):
        node.create_subscription(TensorBatch if batch else Tensor, "tensor", on_tensor,
                                 qos if topic == "tensor" else 10)
    received: dict[int, float] = {}  # stamp -> when the TensorRef's callback began (time.time())

    class TimedSubscription(TensorRefSubscription):
        """Notes when each TensorRef reached the consumer's callback (before its wait)."""
        def _on_message(self, msg) -> None:
            received[key(msg.header)] = time.time()
            super()._on_message(msg)

    if topic in ("tensor_ref", "both"):
        sub = TimedSubscription(node, "tensor_ref", on_frame, qos if topic == "tensor_ref" else 10,
                                fast_path=fast_path)

    def on_consumer_timing(msg) -> None:
        mine = f"consumer {node.get_name()} (pid {os.getpid()})"
        for st in msg.status:
            if st.name.endswith(mine):
                node_reports.append({kv.key: kv.value for kv in st.values}
                                    | {"_frames_seen": len(entries), "_t": time.time() - t0})
    node.create_subscription(
        FrameTiming, "timing",
        lambda t: timings.__setitem__(key(t.header), (t.total_us / 1e3, t.outputs, t.age_us / 1e3,
                                                      t.upload_us / 1e3)), 10)
    shared: list[tuple[float, dict]] = []  # (seconds since start, the node's "Shared ..." diagnostics)
    copies: list[str] = []  # the node's "Input frame copies" (a camera inside the node)

    # The node's own status (another node in the domain may have a camera too).
    status_name = f"{ns.strip('/')}/vision_preproc".lstrip("/")

    def on_diagnostics(msg) -> None:
        for st in msg.status:
            if st.name != status_name:
                continue
            values = {kv.key: kv.value for kv in st.values if kv.key.startswith("Shared")}
            if values:
                shared.append((time.time() - t0, values))
            copies.extend(kv.value for kv in st.values if kv.key == "Input frame copies")

    from diagnostic_msgs.msg import DiagnosticArray
    node.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, 10)
    node.create_subscription(DiagnosticArray, "consumer_timing", on_consumer_timing, 10)
    # One executor for the whole run (rclpy.spin_once would add and remove the node, and
    # rebuild its wait set, at every call: milliseconds of the latency measured here).
    if executor_kind == "events":
        from rclpy.experimental import EventsExecutor
        executor = EventsExecutor()
    else:
        executor = rclpy.executors.SingleThreadedExecutor()
    executor.add_node(node)
    while time.time() - t0 < seconds:
        executor.spin_once(timeout_sec=0.05)
    skipped = sub.skipped if sub else 0
    counts = {k: getattr(sub, k) for k in ("received", "delivered", "skipped", "withdrawn", "reconnects", "errors",
                                           "via_socket", "via_topic", "dropped")} if sub else {}
    if sub:
        counts["path"] = sorted(set(sub.path.values()))
    # The node's last report of this consumer against its own measure of the same frames
    # (the last 300 it had when the report came, as the node's window).
    own = [entries[k] for k in sorted(entries)]
    report = node_reports[-1] if node_reports else None
    if report:
        window = own[:report["_frames_seen"]][-300:]
        report["_own_stamp_to_callback_p50_ms"] = float(np.percentile(window, 50)) if window else None
    out.write_text(json.dumps({"ages_ms": [ages[k] for k in sorted(ages)],
                               "timings": [timings[k] for k in sorted(timings)],
                               "after_publish_ms": [ages[k] - timings[k][2] for k in sorted(ages) if k in timings],
                               "announced_splits_ms": [splits[k] for k in sorted(splits)],
                               "skipped": skipped, "counts": counts, "checksum": checksum, "checks": checks,
                               "shared_diagnostics": shared, "frame_copies": copies[-1:],
                               "node_report": report}))
    node.destroy_node()
    rclpy.shutdown()


def decoder(ns: str, seconds: float) -> None:
    """Path f's decoder process: `<ns>/h264/foxglove` (CompressedVideo, H.264) decoded by
    PyAV into bgr24 and published as a bgr8 Image on `<ns>/image` with the packet's stamp."""
    import av
    import rclpy
    from foxglove_msgs.msg import CompressedVideo
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    rclpy.init()
    node = rclpy.create_node("h264_decoder", namespace=ns)
    ctx = av.CodecContext.create("h264", "r")
    ctx.thread_type, ctx.thread_count = "SLICE", os.cpu_count() or 1
    # As `play` publishes the other paths' images (best effort).
    pub = node.create_publisher(Image, f"{ns}/image", qos_profile_sensor_data)

    def on_packet(m) -> None:
        try:
            frames = ctx.decode(av.Packet(bytes(m.data)))
        except av.error.FFmpegError:
            return  # joined mid-stream: nothing until the next key frame, as a subscriber's decoder
        for f in frames:
            bgr = f.to_ndarray(format="bgr24")
            img = Image(height=f.height, width=f.width, encoding="bgr8", step=f.width * 3)
            img.header.stamp, img.header.frame_id = m.timestamp, m.frame_id
            img.data = bgr.tobytes()
            pub.publish(img)

    node.create_subscription(CompressedVideo, f"{ns}/h264/foxglove", on_packet, qos_profile_sensor_data)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.1)
    node.destroy_node()
    rclpy.shutdown()


def cpu_s(pid: int) -> float:
    """CPU time (user + system) of `pid` so far, in seconds (NaN once it is gone)."""
    from vptools.procs import cpu_s as cpu
    s = cpu(pid)
    return float("nan") if s is None else s


def make_video_bag(path: Path, w: int, h: int, rate: float) -> Path:
    """Paths v and f's camera: 60 frames of a photograph panned across, H.264 (x264enc
    veryfast, no B-frames, a key frame every `rate` frames), CompressedVideo in a bag."""
    from vptools.video import encode, pan_frames, write_video_bag
    packets = encode(pan_frames("chelsea.png", w, h, 60), "h264", path.parent, gop=int(rate), fps=int(rate))
    write_video_bag(path, "foxglove", "h264", packets)
    return path


def vm_rss_mb(pid: int) -> float:
    """VmRSS of `pid` (NaN once it is gone)."""
    from vptools.soak import rss_mb  # (the parent only: it sets the test run's ROS domain)
    r = rss_mb(pid)
    return r["VmRSS"] if r else float("nan")


def phase(a: argparse.Namespace, ns: str, path: str, r: int, node_pid: int, work: Path,
          decoder_pid: int | None = None) -> dict:
    """One consumer process on path `path`'s topic for --seconds, memory sampled every
    0.5 s; the CPU time of the node (and of path f's decoder process) over the phase."""
    time.sleep(1.0)
    topic = PATHS[path][0]
    out = work / f"{path}_{r}.json"
    cpu0 = (time.monotonic(), cpu_s(node_pid), cpu_s(decoder_pid) if decoder_pid else float("nan"))
    c = subprocess.Popen([sys.executable, __file__, "--consumer", topic, "--seconds", str(a.seconds),
                          "--out", str(out), "--ns", ns, *(["--torch"] if a.torch else [])])
    node_rss, cons_rss, pss = [], [], []
    while c.poll() is None:
        node_rss.append(vm_rss_mb(node_pid))
        cons_rss.append(vm_rss_mb(c.pid))
        pss.append(pss_mb(node_pid) + pss_mb(c.pid))
        time.sleep(0.5)
    wall = time.monotonic() - cpu0[0]
    cpu_node = 100 * (cpu_s(node_pid) - cpu0[1]) / wall
    cpu_decoder = 100 * (cpu_s(decoder_pid) - cpu0[2]) / wall if decoder_pid else None
    return {**summary(json.loads(out.read_text()), path, r),
            "node_rss_max_mb": max(node_rss, default=float("nan")),
            "consumer_rss_max_mb": max(cons_rss, default=float("nan")),
            "pss_sum_max_mb": max(pss, default=float("nan")),
            "cpu_node_pct": cpu_node, "cpu_decoder_pct": cpu_decoder}


def summary(d: dict, path: str, r: int) -> dict:
    """A consumer's JSON as a phase of `path` (s, a, b; or a topic, for older files):
    latency percentiles without the first fifth (discovery, warm-up), outputs, the
    consumer's checks, the node's frame copies."""
    from vptools.soak import pct
    def steady(xs: list) -> list:
        return xs[len(xs) // 5:]
    ages, tim, after = steady(d["ages_ms"]), steady(d["timings"]), steady(d["after_publish_ms"])
    splits = steady(d.get("announced_splits_ms", []))  # (older files have none)
    return {
        "round": r, "path": path, "topic": PATHS[path][0] if path in PATHS else path,
        "frame_copies": d.get("frame_copies", []),
        "frames": len(d["ages_ms"]), "timings": len(d["timings"]),
        "skipped": d["skipped"], "subscription": d["counts"], "checks": d.get("checks", {}),
        "age_p50_ms": pct(ages, 50), "age_p99_ms": pct(ages, 99),
        "published_p50_ms": pct([t[2] for t in tim], 50),
        "after_publish_p50_ms": pct(after, 50), "after_publish_p99_ms": pct(after, 99),
        "node_added_p50_ms": pct([t[0] for t in tim], 50),
        "node_added_p99_ms": pct([t[0] for t in tim], 99),
        "outputs": sorted({t[1] for t in tim}),
        # (older files have no upload stage)
        "upload_p50_ms": pct([t[3] for t in tim], 50) if tim and len(tim[0]) > 3 else None,
        # After the TensorRef went out: received by the callback, GPU done, usable (p50)
        "announced_p50_ms": [pct([x[j] for x in splits], 50) for j in range(3)] if splits else None,
        "node_report": d.get("node_report"),
    }


def phase_line(p: dict) -> str:
    label = PATHS[p["path"]][1] if p.get("path") in PATHS else p["topic"]
    line = (f"round {p['round']} {label}: {p['frames']:4d} frames ({p['skipped']} skipped); stamp -> "
            f"tensor p50 {p['age_p50_ms']:.2f} ms, p99 {p['age_p99_ms']:.2f} ms (stamp -> published "
            f"p50 {p['published_p50_ms']:.2f} ms, published -> tensor p50 {p['after_publish_p50_ms']:.2f} ms, "
            f"p99 {p['after_publish_p99_ms']:.2f} ms); node-added p50 "
            f"{p['node_added_p50_ms']:.2f} ms, p99 {p['node_added_p99_ms']:.2f} ms; outputs {p['outputs']}")
    if p.get("announced_p50_ms"):
        r, g, u = p["announced_p50_ms"]
        line += (f"; after the TensorRef went out (p50): in the consumer's callback {r:.2f} ms, GPU work "
                 f"done {g:.2f} ms, tensor usable {u:.2f} ms")
    if p.get("upload_p50_ms") is not None:
        line += f"; upload stage (host staging + copy to the GPU) p50 {p['upload_p50_ms']:.3f} ms"
    if p.get("cpu_node_pct") is not None:
        line += f"; CPU node {p['cpu_node_pct']:.0f} %"
        if p.get("cpu_decoder_pct") is not None:
            line += f", decoder process {p['cpu_decoder_pct']:.0f} %"
    if "node_rss_max_mb" in p:
        line += (f"; memory (max) node RSS {p['node_rss_max_mb']:.0f} MB, consumer RSS "
                 f"{p['consumer_rss_max_mb']:.0f} MB, node + consumer PSS {p['pss_sum_max_mb']:.0f} MB")
    checks = {k: v for k, v in p.get("checks", {}).items() if v}
    if p.get("frame_copies"):
        line += f"; ledger (Input frame copies): {p['frame_copies'][-1]}"
    sub = p.get("subscription", {})
    if sub.get("path"):
        line += f"; path {sub['path']} (socket {sub.get('via_socket')}, topic {sub.get('via_topic')}, " \
                f"dropped {sub.get('dropped')})"
    rep = p.get("node_report")
    if rep and rep.get("_own_stamp_to_callback_p50_ms"):
        node_p50, own = float(rep["Camera stamp -> acquired p50 (ms)"]), rep["_own_stamp_to_callback_p50_ms"]
        line += (f"; node's report: camera stamp -> acquired p50 {node_p50:.3f} ms, the consumer's own "
                 f"{own:.3f} ms ({100 * (node_p50 - own) / own:+.1f} %), acquired -> released p50 "
                 f"{rep['Acquired -> released p50 (ms)']} ms, descriptor delivery p50 "
                 f"{rep['Descriptor delivery p50 (ms)']} ms")
    return line + (f"; checks {checks}" if checks else "")


def print_ratio(phases: list[dict]) -> dict:
    """The ratios of the medians over rounds: s / a (stamp -> tensor and published -> tensor)
    and, with path b, s / b and a / b (stamp -> tensor)."""
    def med(path: str, key: str) -> float:
        return statistics.median(p[key] for p in phases if p["path"] == path)
    ratios = {}
    if any(p.get("path") == "c" for p in phases):
        ratios["a_over_c_p50"] = med("a", "age_p50_ms") / med("c", "age_p50_ms")
        print(f"camera stamp -> tensor usable p50: raw over DDS (a) / compressed over DDS (c) "
              f"{ratios['a_over_c_p50']:.2f}x")
    if any(p.get("path") == "t" for p in phases) and any(p.get("path") == "b" for p in phases):
        ratios["t_over_b_p50"] = med("t", "age_p50_ms") / med("b", "age_p50_ms")
        print(f"camera stamp -> tensor usable p50: (b) on the topic / (b) on the socket "
              f"{ratios['t_over_b_p50']:.2f}x")
    if any(p.get("path") == "v" for p in phases) and any(p.get("path") == "f" for p in phases):
        for other in ("f", "a"):
            ratios[f"{other}_over_v_p50"] = med(other, "age_p50_ms") / med("v", "age_p50_ms")
        print(f"camera stamp -> tensor usable p50: decoder process (f) / decoded in the node (v) "
              f"{ratios['f_over_v_p50']:.2f}x, raw over DDS (a) / (v) {ratios['a_over_v_p50']:.2f}x")
    if any(p.get("path") == "b" for p in phases):
        ratios["s_over_b_p50"] = med("s", "age_p50_ms") / med("b", "age_p50_ms")
        ratios["a_over_b_p50"] = med("a", "age_p50_ms") / med("b", "age_p50_ms")
        print(f"camera stamp -> tensor usable p50: (s) / (b) {ratios['s_over_b_p50']:.2f}x, "
              f"(a) / (b) {ratios['a_over_b_p50']:.2f}x")
    ratios["ratio_p50"] = med("s", "age_p50_ms") / med("a", "age_p50_ms")
    ratios["ratio_after_publish_p50"] = med("s", "after_publish_p50_ms") / med("a", "after_publish_p50_ms")
    print(f"stamp -> tensor p50, tensor / tensor_ref: {ratios['ratio_p50']:.2f}x; published -> tensor p50: "
          f"{ratios['ratio_after_publish_p50']:.2f}x")
    return ratios


# path -> (the consumer's topic, its label in the report)
PATHS = {
    "s": ("tensor", "(s) camera process -> tensor    "),
    "a": ("tensor_ref_topic", "(a) camera process -> tensor_ref"),
    "b": ("tensor_ref", "(b) in-node camera -> socket    "),
    "t": ("tensor_ref_topic", "(b) in-node camera -> tensor_ref"),
    "c": ("tensor_ref_topic", "(c) JPEG camera -> tensor_ref   "),
    "v": ("tensor_ref_topic", "(v) H.264 camera -> node decodes"),
    "f": ("tensor_ref_topic", "(f) H.264 -> decoder -> bgr8    "),
}


# The GPU machine's names of the paths' JSON files (python/vptools/node_scenarios.py).
REPORT_NAMES = {"tensor": "s", "tensor_ref": "a", "tensor_ref_topic": "a", "gst_ref": "b", "gst_topic": "t",
                "jpeg_ref": "c"}


def gst_camera(width: int, height: int, rate: float) -> str:
    """Path b's camera: a live source of the camera process's size and rate (BGR)."""
    from vptools.node_scenarios import gst_source
    return gst_source("BGR", width, height, f"{int(rate)}/1")


def pss_mb(pid: int) -> float:
    """Proportional set size: shared pages divided among the processes that map them."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--consumer", choices=["tensor", "tensor_ref", "tensor_ref_topic", "both"],
                    help="run only the consumer process, on this topic (both: block bytes == Tensor bytes), "
                         "writing --out (the GPU machine's scenario starts node and camera itself)")
    ap.add_argument("--decoder", action="store_true", help="run only path f's decoder process")
    ap.add_argument("--torch", action="store_true", help="the consumer makes CUDA torch tensors")
    ap.add_argument("--paths", default="s,a", help="which of s, a, b, t, c, v, f to run (comma-separated; module docstring)")
    ap.add_argument("--hold-ms", type=float, default=0.0, help="the consumer holds each frame this long")
    ap.add_argument("--batch", action="store_true", help="the consumer's node has several inputs (TensorBatch)")
    ap.add_argument("--executor", choices=["single", "events"], default="single",
                    help="the consumer's rclpy executor: SingleThreadedExecutor or rclpy.experimental's "
                         "EventsExecutor")
    ap.add_argument("--report", type=Path, nargs="+", help="print the phases of consumer JSON files "
                    "(named <topic>_<round>.json) and their ratio")
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--ns", default="/bench_handoff", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--rate", type=float, default=30.0)
    ap.add_argument("--network", type=int, default=640, help="network width = height")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.consumer:
        consumer(a.consumer, a.ns, a.seconds, a.out, a.torch, a.hold_ms, a.batch, a.executor)
        return
    if a.decoder:
        decoder(a.ns, a.seconds)
        return
    if a.report:
        # <path or topic>_<round>.json ("batch_tensor_ref_2": the tensor_ref phase of round 2
        # of a batch run; "events_gst_ref_1": a consumer with the EventsExecutor; the GPU
        # machine's cudaref/camera scenarios name paths s, a, b tensor, tensor_ref, gst_ref)
        def path_of(f: Path) -> str:
            name = f.stem.rsplit("_", 1)[0].removeprefix("batch_").removeprefix("events_")
            return REPORT_NAMES.get(name, name)
        phases = [summary(json.loads(f.read_text()), path_of(f), int(f.stem.rsplit("_", 1)[1])) for f in a.report]
        for p in phases:
            print(phase_line(p))
        print_ratio(phases)
        return
    from vptools.rosharness import NodeProcess
    from vptools.soak import make_bag, make_jpeg_bag
    work = Path(tempfile.mkdtemp(prefix="bench_handoff_"))
    bag = make_bag(work / "bag", a.width, a.height, a.rate)
    jpeg_bag = make_jpeg_bag(work / "jpeg_bag", a.width, a.height, a.rate)
    paths = [p for p in a.paths.split(",") if p]
    video_bag = make_video_bag(work / "video_bag", a.width, a.height, a.rate) if {"v", "f"} & set(paths) else None
    ns = "/bench_handoff"
    params = ["-r", f"__ns:={ns}", "-p", f"backend:={a.backend}", "-p", f"network_image_width:={a.network}",
              "-p", f"network_image_height:={a.network}"]
    assert set(paths) <= set(PATHS) and "s" in paths and "a" in paths, f"--paths {a.paths}: s and a, and b, t, c, v, f"
    phases = []
    for r in range(a.rounds):
        for path in paths:
            # A node and a camera per phase: each phase's memory is its own.
            gst = ["-p", f'inputs:=["{gst_camera(a.width, a.height, a.rate)}"]']
            camera = {"b": gst, "t": gst, "c": ["-p", "image_transport:=compressed"],
                      "v": ["-p", "image_transport:=foxglove"]}.get(path, [])
            played = {"c": jpeg_bag, "v": video_bag, "f": video_bag}.get(path, bag)
            with NodeProcess(params + camera, log=work / f"node_{path}_{r}.log") as node:
                dec = subprocess.Popen([sys.executable, __file__, "--decoder", "--ns", ns, "--seconds",
                                        str(a.seconds + 10)]) if path == "f" else None
                play = None if path in ("b", "t") else subprocess.Popen(
                    [str(ROOT / "target" / "release" / "vision_preproc"), "play", str(played), "--loop", "--restamp",
                     "--image-topic", f"{ns}/h264" if path == "f" else f"{ns}/image"], stdout=subprocess.DEVNULL)
                try:
                    phases.append(phase(a, ns, path, r, node.proc.pid, work, dec.pid if dec else None))
                finally:
                    for proc in (play, dec):
                        if proc:
                            proc.terminate()
                            proc.wait(timeout=10)
            print(phase_line(phases[-1]), flush=True)
    ratios = print_ratio(phases)
    if a.json:
        a.json.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "machine": platform.node(),
            "cpus": os.cpu_count(), "args": {k: str(v) for k, v in vars(a).items()}, "phases": phases,
            **ratios}, indent=1))


if __name__ == "__main__":
    main()
