"""gpu_failure_policy in the running node, through real DDS, on a machine without a GPU.

The test-only VISION_PREPROC_INJECT_CUDA_FAULT=N makes the N-th frame's backend call fail.
On the CUDA backend that is a real device fault (test/gpu_fault.rs runs it on the H200);
the CPU backend, which has no device, returns a simulated CUDA error instead, so the
node's side of the policy (the pipeline's recovery, the log, /diagnostics, the exit code)
is exercised here with `backend: cpu`. Tensors before and after the failure are checked
by value against OpenCV/NumPy.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus

from vptools.oracle import expected_stretch
from vptools.rosharness import RELIABLE, NodeProcess, Peer, image_msg, tensor_array
from vptools.sources import photo_bgr
from vptools.tolerances import assert_close

CHELSEA = photo_bgr("chelsea.png")  # 451x300

W, H = 64, 48
MEAN, STD = [0.5] * 3, [0.5] * 3


def start(ns: str, policy: str, fault: str, tmp_path: Path) -> NodeProcess:
    args = ["-r", f"__ns:={ns}", "-p", "backend:=cpu", "-p", f"gpu_failure_policy:={policy}",
            "-p", f"network_image_width:={W}", "-p", f"network_image_height:={H}", "-p", "resize_mode:=stretch"]
    return NodeProcess(args, env={"VISION_PREPROC_INJECT_CUDA_FAULT": fault}, log=tmp_path / "node.log")


def statuses_of(peer: Peer, name: str) -> list[DiagnosticStatus]:
    seen: list[DiagnosticStatus] = []
    peer.node.create_subscription(
        DiagnosticArray, "/diagnostics", lambda m: seen.extend(s for s in m.status if s.name == name), RELIABLE)
    return seen


@pytest.mark.parametrize("policy, action", [
    ("fallback", "gpu_failure_policy fallback: switched to the cpu backend"),
    ("retry", "gpu_failure_policy retry: rebuilt the cpu backend (attempt 1 of 3)"),
])
def test_the_node_recovers_and_keeps_publishing_correct_tensors(tmp_path: Path, policy: str, action: str) -> None:
    ns = f"/gpufail_{policy}"
    with start(ns, policy, "3", tmp_path) as node:
        peer = Peer(ns)
        statuses = statuses_of(peer, f"{ns.strip('/')}/vision_preproc")
        try:
            peer.wait_connected()
            want = expected_stretch(CHELSEA, W, H, MEAN, STD)
            for k in range(1, 7):
                t = peer.send_until_received(image_msg(CHELSEA, "bgr8", 8_000_000_000 + k, "cam"))
                assert_close(tensor_array(t), want, "float32", f"{policy}: frame {k}")
            peer.spin_until(lambda: any(v.key == "Last GPU failure" for s in statuses for v in s.values), 5,
                            "a /diagnostics status with the GPU failure")
            warn = next(s for s in statuses if any(v.key == "Last GPU failure" for v in s.values))
            kv = {v.key: v.value for v in warn.values}
            assert warn.level == DiagnosticStatus.WARN, warn
            assert "simulated on the cpu backend" in kv["Last GPU failure"], kv
            assert kv["GPU failure action"] == action, kv
            assert kv["GPU failures"] == "1" and kv["Backend"] == "cpu", kv
            assert action in warn.message, warn.message
            # The books balance: the failed frame was run again and published.
            peer.spin_until(lambda: len(statuses) >= 2, 5, "another /diagnostics status")
            kv = {v.key: v.value for v in statuses[-1].values}
            assert int(kv["Frames received"]) == int(kv["Frames published"]) + int(kv["Frames dropped (queue)"]), kv
            assert int(kv["Frames failed (error)"]) == 0, kv
        finally:
            peer.close()
        assert node.stop() == 0
    out = node.output()
    assert re.search(r"\[ERROR\].*GPU failure: CUDA: injected Sticky fault", out), out
    assert re.search(rf"\[WARN\].*{re.escape(action)}", out), out


def test_exit_policy_stops_the_node_with_the_reason(tmp_path: Path) -> None:
    ns = "/gpufail_exit"
    with start(ns, "exit", "2", tmp_path) as node:
        peer = Peer(ns)
        statuses = statuses_of(peer, f"{ns.strip('/')}/vision_preproc")
        try:
            peer.wait_connected()
            t = peer.send_until_received(image_msg(CHELSEA, "bgr8", 9_000_000_001, "cam"))
            assert_close(tensor_array(t), expected_stretch(CHELSEA, W, H, MEAN, STD), "float32", "before the fault")
            peer.pub.publish(image_msg(CHELSEA, "bgr8", 9_000_000_002, "cam"))
            peer.spin_until(lambda: node.proc.poll() is not None, 10, "the node to exit")
            peer.spin_until(lambda: any(s.message.startswith("exiting:") for s in statuses), 3,
                            "the last /diagnostics status")
        finally:
            peer.close()
        rc = node.proc.wait(timeout=5)
    out = node.output()
    assert rc == 1, out
    last = next(s for s in statuses if s.message.startswith("exiting:"))
    assert last.level == DiagnosticStatus.ERROR and "gpu_failure_policy exit" in last.message, last
    assert "[FATAL]" in out and "GPU failure, gpu_failure_policy exit: CUDA: injected Sticky fault" in out, out
    m = re.search(r"stopped: (\d+) frames received, (\d+) published, (\d+) dropped \(queue\), (\d+) rejected "
                  r"\(invalid\), (\d+) failed", out)
    assert m, out
    received, published, dropped, rejected, failed = map(int, m.groups())
    assert (published, failed) == (1, 1) and received == published + dropped + rejected + failed, m.group(0)


def test_a_bad_injection_value_stops_the_node_with_the_variable_named(tmp_path: Path) -> None:
    with start("/gpufail_bad", "retry", "soon", tmp_path) as node:
        rc = node.proc.wait(timeout=20)
    out = node.output()
    assert rc == 1 and "VISION_PREPROC_INJECT_CUDA_FAULT" in out and '"soon"' in out, out
