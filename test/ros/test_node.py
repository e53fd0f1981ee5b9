"""The node's ROS interface through real DDS: parameters (file, command line, run time via
the parameter services `ros2 param` uses), /diagnostics keys and levels with invalid
frames mixed in, camera_info scaling, frame accounting, clean shutdown on SIGINT and
SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import DescribeParameters, GetParameters, ListParameters, SetParameters
from sensor_msgs.msg import CameraInfo

from vptools.rosharness import (DEFERRED_CPU_ENV, RELIABLE, NodeProcess, Peer, call, image_msg, param, stamp_ns,
                                tensor_array)
from vptools.tolerances import assert_close
from vision_preproc_msgs.msg import Tensor

from vptools import soak
from vptools.oracle import expected_stretch
from vptools.soak import HEAVY
from vptools.sources import photo_bgr

CHELSEA = photo_bgr("chelsea.png")  # 451x300


def test_parameters_from_file_command_line_and_run_time(tmp_path: Path) -> None:
    ns = "/params"
    params_file = tmp_path / "p.yaml"
    params_file.write_text(
        "vision_preproc:\n  ros__parameters:\n    network_image_width: 100\n    network_image_height: 60\n"
        "    resize_mode: stretch\n    image_mean: [0.1, 0.2, 0.3]\n    image_stddev: [0.5, 0.5, 0.5]\n"
        "    backend: cpu\n"
    )
    # The command line overrides the file.
    args = ["-r", f"__ns:={ns}", "--params-file", str(params_file), "-p", "network_image_width:=90"]
    with NodeProcess(args, log=tmp_path / "node.log") as node:
        peer = Peer(ns)
        try:
            peer.wait_connected()
            t = peer.send_until_received(image_msg(CHELSEA, "bgr8", 1_000_000_001, "cam"))
            assert list(t.shape) == [1, 3, 60, 90]
            assert_close(tensor_array(t), expected_stretch(CHELSEA, 90, 60, [0.1, 0.2, 0.3], [0.5] * 3), "float32", "file+cli")

            srv = f"{ns}/vision_preproc"
            names = call(peer, ListParameters, f"{srv}/list_parameters", ListParameters.Request()).result.names
            for n in ["network_image_width", "conv.kernel", "image_mean", "roi", "backend", "output_qos_depth"]:
                assert n in names, f"{n} not listed: {names}"
            got = call(peer, GetParameters, f"{srv}/get_parameters",
                       GetParameters.Request(names=["network_image_width", "image_mean", "resize_mode"])).values
            assert got[0].integer_value == 90
            assert list(got[1].double_array_value) == [0.1, 0.2, 0.3]
            assert got[2].string_value == "stretch"
            desc = call(peer, DescribeParameters, f"{srv}/describe_parameters",
                        DescribeParameters.Request(names=["network_image_width"])).descriptors
            assert (desc[0].integer_range[0].from_value, desc[0].integer_range[0].to_value) == (1, 8192)

            # A valid run-time change applies to the next tensor.
            res = call(peer, SetParameters, f"{srv}/set_parameters",
                       SetParameters.Request(parameters=[param("image_mean", [0.4, 0.5, 0.6])])).results
            assert res[0].successful, res[0].reason
            t = peer.send_until_received(image_msg(CHELSEA, "bgr8", 1_000_000_002, "cam"))
            assert_close(tensor_array(t), expected_stretch(CHELSEA, 90, 60, [0.4, 0.5, 0.6], [0.5] * 3), "float32", "run-time mean")
            # A size change reallocates cleanly.
            res = call(peer, SetParameters, f"{srv}/set_parameters",
                       SetParameters.Request(parameters=[param("network_image_width", 45)])).results
            assert res[0].successful, res[0].reason
            t = peer.send_until_received(image_msg(CHELSEA, "bgr8", 1_000_000_003, "cam"))
            assert list(t.shape) == [1, 3, 60, 45]
            assert_close(tensor_array(t), expected_stretch(CHELSEA, 45, 60, [0.4, 0.5, 0.6], [0.5] * 3), "float32", "run-time size")
            # Invalid values are refused with the reason; start-up-only ones too.
            res = call(peer, SetParameters, f"{srv}/set_parameters",
                       SetParameters.Request(parameters=[param("network_image_width", 0),
                                                         param("backend", "cuda")])).results
            assert not res[0].successful and res[0].reason == "network_image_width must be in [1, 8192] (got 0)", res[0].reason
            assert not res[1].successful and "start-up" in res[1].reason, res[1].reason
            got = call(peer, GetParameters, f"{srv}/get_parameters",
                       GetParameters.Request(names=["network_image_width"])).values
            assert got[0].integer_value == 45
        finally:
            peer.close()
        assert node.stop() == 0, node.output()


def test_invalid_parameters_stop_the_node_with_the_name(tmp_path: Path) -> None:
    with NodeProcess(["-p", "output_dtype:=float64"], log=tmp_path / "node.log") as node:
        rc = node.proc.wait(timeout=20)
    out = node.output()
    assert rc == 1, out
    assert "output_dtype" in out and "float64" in out and "float32" in out, out
    # Through rcutils like every log line: severity, time stamp, logger name.
    assert re.search(r"^\[FATAL\] \[\d+\.\d+\] \[vision_preproc\]: .*output_dtype", out, re.M), out


def test_diagnostics_and_frame_accounting_with_invalid_frames(tmp_path: Path) -> None:
    ns = "/diag"
    args = ["-r", f"__ns:={ns}", "-p", "backend:=cpu", "-p", "network_image_width:=64", "-p", "network_image_height:=48"]
    with NodeProcess(args, log=tmp_path / "node.log") as node:
        peer = Peer(ns)
        statuses: list[DiagnosticStatus] = []
        peer.node.create_subscription(
            DiagnosticArray, "/diagnostics",
            lambda m: statuses.extend(s for s in m.status if s.name == "diag/vision_preproc"), RELIABLE)
        try:
            peer.wait_connected()
            peer.send_until_received(image_msg(CHELSEA, "bgr8", 2_000_000_001, "cam"))
            # Invalid frames: step too small, unknown encoding. Sent a few times (best effort).
            bad = image_msg(CHELSEA, "bgr8", 2_000_000_002, "cam")
            bad.step = 10
            unknown = image_msg(CHELSEA, "bgr8", 2_000_000_003, "cam")
            unknown.encoding = "8UC3"
            for m in [bad, unknown]:
                peer.pub.publish(m)
                for _ in range(4):
                    peer.executor.spin_once(timeout_sec=0.05)
            # The next valid frame is processed normally.
            t = peer.send_until_received(image_msg(CHELSEA, "bgr8", 2_000_000_004, "cam"))
            assert list(t.shape) == [1, 3, 48, 64]
            peer.spin_until(lambda: any(s.level == DiagnosticStatus.ERROR for s in statuses), 5.0,
                            "an ERROR diagnostics status after invalid frames")
            err = next(s for s in statuses if s.level == DiagnosticStatus.ERROR)
            kv = {v.key: v.value for v in err.values}
            for key in ["Actual frequency (Hz)", "Frames received", "Frames published", "Frames dropped (queue)",
                        "Frames rejected (invalid)", "Last rejection reason", "Latency p50 (ms)",
                        "Latency p99 (ms)", "Backend", "Device"]:
                assert key in kv, f"missing diagnostics key {key!r}: {sorted(kv)}"
            assert kv["Backend"] == "cpu"
            assert int(kv["Frames rejected (invalid)"]) >= 1
            assert ("step 10 < width*3" in kv["Last rejection reason"]
                    or "encoding `8UC3` is not supported" in kv["Last rejection reason"]), kv
            # Later windows without bad frames go back to OK, and the books balance.
            n_before = len(statuses)
            peer.spin_until(lambda: len(statuses) >= n_before + 2, 5.0, "two more diagnostics")
            last = statuses[-1]
            assert last.level == DiagnosticStatus.OK, last
            kv = {v.key: int(v.value) for v in last.values if v.key.startswith("Frames")}
            assert kv["Frames received"] == kv["Frames published"] + kv["Frames dropped (queue)"] \
                + kv["Frames rejected (invalid)"] + kv["Frames failed (error)"], kv
            # Every published tensor reached this reliable subscriber.
            assert kv["Frames published"] == len(peer.tensors), (kv, len(peer.tensors))
        finally:
            peer.close()
        assert node.stop() == 0


def test_camera_info_is_scaled_like_the_image(tmp_path: Path) -> None:
    ns = "/caminfo"
    args = ["-r", f"__ns:={ns}", "-p", "backend:=cpu", "-p", "network_image_width:=320",
            "-p", "network_image_height:=320", "-p", "resize_mode:=letterbox"]
    with NodeProcess(args, log=tmp_path / "node.log") as node:
        peer = Peer(ns)
        infos: list[CameraInfo] = []
        peer.node.create_subscription(CameraInfo, "tensor/camera_info", infos.append, RELIABLE)
        info_pub = peer.node.create_publisher(CameraInfo, "camera_info", RELIABLE)
        try:
            peer.wait_connected()
            # Without camera_info, tensors still flow (never waited for).
            peer.send_until_received(image_msg(CHELSEA, "bgr8", 3_000_000_001, "cam"))
            assert infos == []
            ci = CameraInfo()
            ci.header.frame_id = "cam_optical"
            ci.width, ci.height = 451, 300
            ci.k = [400.0, 0.0, 225.0, 0.0, 410.0, 150.0, 0.0, 0.0, 1.0]
            ci.p = [400.0, 0.0, 225.0, -20.0, 0.0, 410.0, 150.0, 0.0, 0.0, 0.0, 1.0, 0.0]
            ci.d = [0.1, -0.05, 0.0, 0.0, 0.0]
            ci.distortion_model = "plumb_bob"
            peer.spin_until(lambda: info_pub.get_subscription_count() >= 1, 10, "camera_info subscriber")
            info_pub.publish(ci)
            time.sleep(0.3)
            peer.send_until_received(image_msg(CHELSEA, "bgr8", 3_000_000_002, "cam"))
            peer.spin_until(lambda: any(stamp_ns(i.header) == 3_000_000_002 for i in infos), 5, "tensor/camera_info")
            out = next(i for i in infos if stamp_ns(i.header) == 3_000_000_002)
            # Letterbox 451x300 -> 320x320: s = 320/451, content 320 x round(300*s)=213,
            # top = (320-213)//2 = 53. x' = s*x + ox with half-pixel term: cx' = s*cx + ox + (s-1)/2.
            sx, sy = 320 / 451, 213 / 300
            ox, oy = 0.0, 53.0
            assert (out.width, out.height) == (320, 320)
            assert out.header.frame_id == "cam_optical"
            assert out.k[0] == pytest.approx(400 * sx) and out.k[4] == pytest.approx(410 * sy)
            assert out.k[2] == pytest.approx(225 * sx + ox + (sx - 1) / 2)
            assert out.k[5] == pytest.approx(150 * sy + oy + (sy - 1) / 2)
            assert out.p[0] == pytest.approx(400 * sx) and out.p[3] == pytest.approx(-20 * sx)
            assert out.p[2] == pytest.approx(out.k[2]) and out.p[6] == pytest.approx(out.k[5])
            assert list(out.d) == pytest.approx(ci.d) and out.distortion_model == "plumb_bob"
        finally:
            peer.close()
        assert node.stop() == 0


def shm_files() -> set[str]:
    return set(os.listdir("/dev/shm"))


def shm_held_by(pid: int, maps: bool = True) -> set[str]:
    """/dev/shm files a process has open (Fast DDS keeps an fd on the `<name>_el` lock file
    of every segment it owns and every port it listens on) or, with `maps`, mapped (its
    own segments, and those of the participants it reads from or writes to)."""
    names = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("/dev/shm/"):
                names.add(target[len("/dev/shm/"):])
        if maps:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                f = line.split()
                if len(f) >= 6 and f[5].startswith("/dev/shm/"):
                    names.add(f[5][len("/dev/shm/"):])
    except OSError:
        pass
    return names


def shm_in_use() -> set[str]:
    """/dev/shm files some live process holds open or mapped."""
    used = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            used |= shm_held_by(int(d.name))
    return used


def node_files_left(held: set[str], before: set[str]) -> tuple[set[str], set[str], set[str]]:
    """The node's files (from the lock files it held: each `<name>_el`, its `<name>` and,
    for a port, `sem.<name>_mutex`; minus files that existed before it started, such as
    the discovery ports every participant of the domain shares) that are still in
    /dev/shm with no live process using them (nor their segment/port): what the node
    left behind. Returns (left, the node's files, those still present and in use)."""
    ours = set()
    for name in held:
        if name.endswith("_el"):
            base = name[: -len("_el")]
            ours |= {name, base}
            if base.startswith("fastdds_port"):
                ours.add(f"sem.{base}_mutex")
    ours -= before
    assert any(not n.startswith(("fastdds_port", "sem.")) for n in ours), f"none of the node's segments in {held}"
    deadline = time.monotonic() + 1.0
    while ours & shm_files() and time.monotonic() < deadline:
        time.sleep(0.05)
    used = shm_in_use()
    left, in_use = set(), set()
    for name in ours & shm_files():
        base = name.removeprefix("sem.").removesuffix("_mutex").removesuffix("_el")
        (in_use if {name, base, f"{base}_el"} & used else left).add(name)
    return left, ours, in_use


def play_under_load(bag: Path, ns: str) -> subprocess.Popen:
    """The Rust player looping `bag` (restamped) into the node of namespace `ns` for 8 s, once
    the node subscribes."""
    return subprocess.Popen(
        [str(soak.CLI), "play", str(bag), "--loop", "--restamp", "--image-topic", f"{ns}/image",
         "--camera-info-topic", f"{ns}/camera_info", "--wait-subscribers", "1", "--duration", "8"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stopped_counts(out: str) -> tuple[str, dict[str, int]]:
    """The node's final `stopped:` line in its output, and its counts (received, published,
    dropped, rejected, failed, overlapped); the line must be there and balance."""
    m = re.search(r"stopped: (\d+) frames received, (\d+) published, (\d+) dropped \(queue\), "
                  r"(\d+) rejected \(invalid\), (\d+) failed; (\d+) sets overlapped", out)
    assert m, out[-2000:]
    c = dict(zip(("received", "published", "dropped", "rejected", "failed", "overlapped"), map(int, m.groups())))
    assert c["received"] == c["published"] + c["dropped"] + c["rejected"] + c["failed"], m.group(0)
    return m.group(0), c


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signals_stop_the_node_cleanly_under_load(tmp_path: Path, sig: int) -> None:
    """SIGINT/SIGTERM while frames are being processed (1280x720 bgr8 at 30 Hz from the Rust
    player into a node that needs ~110 ms a frame, so one is always in flight): exit 0
    within 2 s; the final "stopped:" line balances (received = published + dropped +
    rejected + failed); every published tensor reached the reliable peer, including one
    finished after the signal (the frame in flight); the node's shared-memory files are
    gone. "The node's files": the /dev/shm files it holds open just before the
    signal: the `_el` lock files Fast DDS keeps open for the segments it owns and the ports
    it listens on, with the segment/port each belongs to and the port's `sem.*_mutex`,
    minus files that existed before the node started (ports shared by every participant
    of the domain, e.g. the discovery port, belong to no one process). None may remain
    unused by every live process after the node exits (see node_files_left)."""
    ns = f"/sig{int(sig)}"
    bag = soak.make_bag(tmp_path / "bag", 1280, 720, 30.0)
    before = shm_files()
    args = ["-r", f"__ns:={ns}", "-p", "backend:=cpu", "-p", "output_qos_depth:=20"]
    for p in HEAVY:
        args += ["-p", p]
    got: list[float] = []
    with NodeProcess(args, env={"RAYON_NUM_THREADS": "1"}, log=tmp_path / "node.log") as node:
        peer = Peer(ns)
        peer.node.create_subscription(Tensor, "tensor", lambda _raw: got.append(time.monotonic()), soak.DEEP, raw=True)
        player = None
        try:
            peer.wait_connected()
            player = play_under_load(bag, ns)
            peer.spin_until(lambda: len(got) >= 8, 30, "8 tensors under load")
            held = shm_held_by(node.proc.pid, maps=False)
            t_sig = time.monotonic()
            node.proc.send_signal(sig)
            while node.proc.poll() is None and time.monotonic() - t_sig < 2.0:
                peer.executor.spin_once(timeout_sec=0.01)
            elapsed = time.monotonic() - t_sig
            rc = node.proc.poll()
            assert rc == 0 and elapsed < 2.0, f"exit code {rc} after {elapsed:.2f} s\n{node.output()}"
            t_end = time.monotonic() + 0.5
            while time.monotonic() < t_end:
                peer.executor.spin_once(timeout_sec=0.01)
            shm_check = node_files_left(held, before)
        finally:
            if player is not None:
                # Done with the player: the rest of its --duration would only be waited out.
                player.terminate()
                player.communicate(timeout=30)
            peer.close()
    line, c = stopped_counts(node.output())
    assert (c["rejected"], c["failed"]) == (0, 0) and c["dropped"] > 0, line
    # The CPU backend computes a set when it is submitted: nothing may be submitted before
    # the previous set is handed over (it would wait for that set's work).
    assert c["overlapped"] == 0, line
    assert c["published"] == len(got), f"{line}, but the reliable peer received {len(got)} tensors"
    after_signal = [t for t in got if t > t_sig]
    assert after_signal, "no tensor was published after the signal: the frame in flight was not finished"
    print(f"{signal.Signals(sig).name}: exit 0 after {elapsed:.2f} s; {line}; "
          f"{len(after_signal)} tensor(s) finished after the signal")
    left, ours, in_use = shm_check
    assert not left, f"shared-memory files of the node left behind: {sorted(left)} (the node's: {sorted(ours)})"
    print(f"/dev/shm: the node's {len(ours)} files {sorted(ours)}: {len(ours) - len(in_use)} removed, "
          f"{len(in_use)} still used by a live participant {sorted(in_use)}, 0 left behind")


def test_debug_image_only_while_subscribed_and_rate_limited(tmp_path: Path) -> None:
    ns = "/dbg"
    args = ["-r", f"__ns:={ns}", "-p", "backend:=cpu", "-p", "network_image_width:=80", "-p",
            "network_image_height:=60", "-p", "resize_mode:=stretch", "-p", "debug_image_rate:=2.0",
            "-p", "channel_order:=bgr"]
    with NodeProcess(args, log=tmp_path / "node.log") as node:
        peer = Peer(ns)
        try:
            peer.wait_connected()
            peer.send_until_received(image_msg(CHELSEA, "bgr8", 6_000_000_001, "cam"))
            from sensor_msgs.msg import Image as RosImage
            debug: list = []
            sub = peer.node.create_subscription(RosImage, "debug_image", debug.append, RELIABLE)
            peer.spin_until(lambda: peer.node.count_publishers(f"{ns}/debug_image") >= 1, 10, "debug_image publisher")
            time.sleep(0.5)
            # 3 s of frames at ~20 Hz: at most 2 Hz of debug images (+1 for the window edge).
            t_end = time.monotonic() + 3.0
            k = 0
            while time.monotonic() < t_end:
                peer.pub.publish(image_msg(CHELSEA, "bgr8", 6_000_000_100 + k, "cam"))
                k += 1
                for _ in range(5):
                    peer.executor.spin_once(timeout_sec=0.01)
            peer.spin_until(lambda: len(debug) >= 1, 5, "a debug_image")
            assert 1 <= len(debug) <= 7, len(debug)
            d = debug[-1]
            assert (d.encoding, d.width, d.height, d.step) == ("rgb8", 80, 60, 240)
            # What the network sees, de-normalized: the stretched photo in RGB order
            # (channel_order bgr is undone), within one 8-bit level of OpenCV's resize.
            got = np.frombuffer(bytes(d.data), np.uint8).reshape(60, 80, 3).astype(int)
            want = cv2.resize(cv2.cvtColor(CHELSEA, cv2.COLOR_BGR2RGB).astype(np.float32), (80, 60),
                              interpolation=cv2.INTER_LINEAR)
            assert np.abs(got - want).max() <= 1, np.abs(got - want).max()
            # Nobody subscribed: no debug images are made.
            peer.node.destroy_subscription(sub)
            time.sleep(1.0)
            n = len(debug)
            for k in range(10):
                peer.pub.publish(image_msg(CHELSEA, "bgr8", 6_000_001_000 + k, "cam"))
                for _ in range(10):
                    peer.executor.spin_once(timeout_sec=0.02)
            assert len(debug) == n
        finally:
            peer.close()
        assert node.stop() == 0


def test_the_overlapped_node_keeps_its_books_order_and_tensors_under_load(tmp_path: Path) -> None:
    """The processing loop the CUDA node runs (a set already waiting is submitted before
    the previous one is finished: two sets in flight), on this machine without a GPU: the
    node with the test hooks, whose CPU backend then stages each set at submission and
    computes it at its finish (DEFERRED_CPU_ENV, src/pipeline/deferred.rs). 1280x720 bgr8
    at 30 Hz into ~110 ms of work a frame (overloaded 3x), stopped by SIGINT: the final
    "stopped:" line balances (received = published + dropped + rejected + failed) and
    counts overlapped sets; every tensor reached the reliable peer, in stamp order, and
    each equals the offline replay's tensor of its frame (a tensor written into the wrong
    message buffer, or published before its set finished, would not)."""
    ns = "/overlap"
    bag = soak.make_bag(tmp_path / "bag", 1280, 720, 30.0)
    args = ["-r", f"__ns:={ns}", "-p", "backend:=cpu", "-p", "output_qos_depth:=50"]
    for p in HEAVY:
        args += ["-p", p]
    # The tensor of each of the bag's frames, offline (CPU, synchronous), by stamp order.
    sets = [a for p in HEAVY for a in ("--set", p.replace(":=", "=", 1))]
    subprocess.run([str(soak.CLI), "replay", str(bag), "-o", str(tmp_path / "offline"), "--backend", "cpu", *sets],
                   check=True, capture_output=True, env=dict(os.environ, RAYON_NUM_THREADS="2"))
    from vptools.bags import read_outputs  # noqa: PLC0415 (only this test reads bags here)
    expected = {bytes(t.data) for t in read_outputs(tmp_path / "offline")[0]}
    assert len(expected) >= 4, f"{len(expected)} distinct offline tensors"
    got: list[Tensor] = []
    with NodeProcess(args, env={"RAYON_NUM_THREADS": "1", DEFERRED_CPU_ENV: "1"}, log=tmp_path / "node.log") as node:
        peer = Peer(ns)
        peer.node.create_subscription(Tensor, "tensor", got.append, soak.DEEP)
        player = None
        try:
            peer.wait_connected()
            player = play_under_load(bag, ns)
            peer.spin_until(lambda: len(got) >= 20, 40, "20 tensors under load")
            node.proc.send_signal(signal.SIGINT)
            t_sig = time.monotonic()
            while node.proc.poll() is None and time.monotonic() - t_sig < 3.0:
                peer.executor.spin_once(timeout_sec=0.01)
            assert node.proc.poll() == 0, f"exit code {node.proc.poll()}\n{node.output()}"
            t_end = time.monotonic() + 0.5
            while time.monotonic() < t_end:
                peer.executor.spin_once(timeout_sec=0.01)
        finally:
            if player is not None:
                player.terminate()
                player.communicate(timeout=30)
            peer.close()
    out = node.output()
    assert "test hook: work deferred" in out, out[-2000:]
    line, c = stopped_counts(out)
    assert (c["rejected"], c["failed"]) == (0, 0) and c["dropped"] > 0 and c["overlapped"] > 0, line
    assert c["published"] == len(got), f"{line}, but the reliable peer received {len(got)} tensors"
    stamps = [stamp_ns(t.header) for t in got]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps), "tensors out of stamp order"
    wrong = [i for i, t in enumerate(got) if bytes(t.data) not in expected]
    assert not wrong, f"{len(wrong)} of {len(got)} tensors are not the offline tensor of any frame: {wrong[:10]}"
    print(f"{line}; {len(got)} tensors in order, each equal to its frame's offline tensor")
