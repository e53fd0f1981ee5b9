"""The node's scenarios on the GPU machine (python/vptools/node_scenarios/, run by
scripts/device/gpu_node_remote.py), without a GPU and without ROS: the scenario table
against the list docs/TESTING.md gives, the command line's refusals (before anything is
unpacked or started), the knobs' checks, the arithmetic of the lines it prints from the
processes' logs, and that it needs nothing beyond the standard library (the GPU
machine's python3 has no rclpy)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vptools import ROOT
from vptools import node_scenarios as ns

CLI = ROOT / "scripts" / "device" / "gpu_node_remote.py"


def documented() -> list[str]:
    """The scenarios docs/TESTING.md lists (*On a GPU machine*)."""
    text = (ROOT / "docs" / "TESTING.md").read_text()
    m = re.search(r"\*\*The node's scenarios\*\*.*?py312 bundle\):\n(.*?) \(`--list`", text, re.S)
    assert m, "docs/TESTING.md: the list of the node's scenarios"
    return [n.strip() for n in m.group(1).replace("\n", " ").split(",")]


def test_every_documented_scenario_has_a_function_and_no_other() -> None:
    names = documented()
    assert names == list(ns.SCENARIOS), (names, list(ns.SCENARIOS))
    assert len(names) == 16 and names[:6] == list(ns.DEFAULT_SCENARIOS)
    for name, fn in ns.SCENARIOS.items():
        assert fn.__name__ == name and len((fn.__doc__ or "").split()) >= 8, f"{name}: say what it runs"


def test_no_scenario_names_the_default_set() -> None:
    names, knobs = ns.plan([], {})
    assert names == ["healthy", "fallback", "retry", "exit", "latency", "startup"]
    assert knobs.backend == knobs.sweep_backend == knobs.handoff_backend == "cuda"
    assert knobs.cudaref_modes == ("check", "bench", "slow", "kill", "sanitizer", "batch", "rust", "ctypes")
    assert knobs.sweep_rates == ("1", "2", "4", "6", "8", "max")
    assert knobs.profile_sides == knobs.sweep_sides == ("batched", "separate")
    assert knobs.players == 3 and knobs.cudaref_slow_s == 20 and knobs.trials is None
    assert list(knobs.n(3)) == [1, 2, 3] and list(knobs.n(2)) == [1, 2]


def test_an_unknown_scenario_is_refused_before_anything_runs(monkeypatch, capsys) -> None:
    def must_not_run(self) -> None:
        raise AssertionError("prepare() ran for a refused command line")

    monkeypatch.setattr(ns.Run, "prepare", must_not_run)
    assert ns.main(["healthy", "nope", "batchmax"]) == 2
    err = capsys.readouterr().err
    assert ("gpu_node_remote: unknown scenario nope (scenarios: healthy fallback retry exit latency startup "
            "handoff") in err
    assert "batchmax)" in err
    with pytest.raises(ns.Refused, match=r"^unknown scenario fault latencies "):
        ns.plan(["fault", "healthy", "latencies"], {})
    monkeypatch.setenv("CUDAREF_MODES", "check rustt")
    assert ns.main(["cudaref"]) == 2
    assert "CUDAREF_MODES: unknown mode rustt (known: check bench slow" in capsys.readouterr().err
    monkeypatch.delenv("CUDAREF_MODES")
    assert ns.main(["--backend", "gpu", "healthy"]) == 2
    assert "--backend gpu: use cuda or cpu" in capsys.readouterr().err
    assert ns.main(["--bin", "/nonexistent", "healthy"]) == 2
    assert "--bin /nonexistent: no vision_preproc_node there" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ns.main(["--peer", "nobody"])


@pytest.mark.parametrize("env,message", [
    ({"CUDAREF_MODES": "check foo bar"}, "CUDAREF_MODES: unknown mode foo bar"),
    ({"SWEEP_SIDES": "batched sideways"},
     "SWEEP_SIDES: unknown side sideways (known: batched batched_own pairs separate)"),
    ({"PROFILE_SIDES": "pair"}, "PROFILE_SIDES: unknown side pair"),
    ({"SWEEP_RATES": "1 fast"}, "SWEEP_RATES: fast is not a multiple of the bag's 30 Hz nor `max`"),
    ({"SWEEP_BACKEND": "gpu"}, "SWEEP_BACKEND: unknown backend gpu"),
    ({"HANDOFF_BACKEND": "CPU"}, "HANDOFF_BACKEND: unknown backend CPU"),
    ({"TRIALS": "0"}, "TRIALS=0: a whole number >= 1"),
    ({"PLAYERS": "two"}, "PLAYERS=two: a whole number >= 1"),
    ({"HANDOFF_SPIN_MS": "-1"}, "HANDOFF_SPIN_MS=-1: a whole number >= 0"),
    ({"LATENCY_SIZES": "640x480"}, "LATENCY_SIZES: no staged bag of 640x480"),
])
def test_a_knob_outside_its_set_is_refused(env: dict, message: str) -> None:
    with pytest.raises(ns.Refused) as e:
        ns.plan(["healthy"], env)
    assert str(e.value).startswith(message), str(e.value)


def test_the_knobs_are_read() -> None:
    k = ns.knobs_from({"SWEEP_RATES": "1 2.5 max", "TRIALS": "1", "PROFILE_SIDES": "batched_own pairs",
                       "CUDAREF_MODES": "prev fault_inflight", "CUDAREF_SLOW_S": "600", "HANDOFF_SPIN_MS": "0",
                       "CUDAREF_BATCH_ARGS": "-p input_participants:=per_input", "CUDAREF_BATCH_PLAY": "--max",
                       "LATENCY_SIZES": "1920x1080", "PLAYERS": "2"}, backend="cpu")
    assert (k.backend, k.sweep_backend, k.handoff_backend) == ("cpu", "cpu", "cpu")
    assert k.sweep_rates == ("1", "2.5", "max") and list(k.n(3)) == [1] and k.players == 2
    assert k.profile_sides == ("batched_own", "pairs") and k.cudaref_modes == ("prev", "fault_inflight")
    assert k.cudaref_slow_s == 600 and k.handoff_spin_ms == "0" and k.latency_sizes == ("1920x1080",)
    assert k.cudaref_batch_args == ("-p", "input_participants:=per_input") and k.cudaref_batch_play == ("--max",)
    # The scenario's own backend knob wins over --backend.
    k = ns.knobs_from({"SWEEP_BACKEND": "cuda", "HANDOFF_BACKEND": "cuda"}, backend="cpu")
    assert (k.backend, k.sweep_backend, k.handoff_backend) == ("cpu", "cuda", "cuda")


def test_the_sweep_line_sums_the_logs(tmp_path: Path) -> None:
    def write(name: str, body: str) -> Path:
        (tmp_path / name).write_text(body)
        return tmp_path / name

    # The lines as `vision_preproc play`, the node and `record --count-only` print them.
    plays = [write(f"play_{k}.log", f"play: {n} images, 0 camera infos published, 0 skipped\n")
             for k, n in enumerate((228, 173))]
    nodes = [write("node_0.log", "[INFO] [1.0] [vision_preproc]: shutting down\n[INFO] [1.1] [vision_preproc]: "
                   "stopped: 462 frames received, 340 published, 122 dropped (queue), 0 rejected (invalid), "
                   "0 failed; 0 sets overlapped\n"),
             write("node_1.log", "[INFO] [2.0] [vision_preproc]: stopped: 10 frames received, 8 published, 1 dropped "
                   "(queue), 0 rejected (invalid), 1 failed; 0 sets overlapped\n")]
    recs = [write("rec_0.log", "record: 340 tensors, 340 timings received (--count-only: nothing written)\n"
                  "latency: stamp -> received p50 3016.54 ms, p99 5190.70 ms, max 5211.92 ms (end-to-end when "
                  "the publisher restamps); "
                  "node-added p50 169.62 ms, p99 314.52 ms; 8.3 tensors/s\n"),
            write("rec_1.log", "record: 0 tensors\n")]
    # 340 + 8 published over the 6 s: 58 frames/s; the second subscriber printed no latency.
    assert ns.sweep_summary("batched", "2", plays, nodes, recs) == (
        "sweep batched 60 Hz: sent 401, received 472, published 348, dropped 123, rejected 0, failed 1; "
        "published 58 frames/s; subscribers 8.3 tensors/s; node-added p50/p99 ms 169.62/314.52 ?")
    assert ns.sweep_summary("separate", "max", plays[:1], [], []).startswith(
        "sweep separate max: sent 228, received 0, published 0, dropped 0")
    assert ns.sent(*plays) == 401 and ns.played(*plays) == ["play: 228 images", "play: 173 images"]


def test_the_rust_consumers_hashes_are_matched_by_stamp(tmp_path: Path) -> None:
    # FNV-1a 64, the hash of examples/tensor_ref_consumer.rs: the published test vectors.
    assert ns.fnv1a64(b"") == 0xcbf29ce484222325
    assert ns.fnv1a64(b"a") == 0xaf63dc4c8601ec8c
    assert ns.fnv1a64(b"foobar") == 0x85944171f73967e8
    refs, tensors = tmp_path / "refs.txt", tmp_path / "tensor.txt"
    refs.write_text("1 00000000000000aa\n2 00000000000000bb\n3 00000000000000cc\n")
    tensors.write_text("1 00000000000000aa\n2 00000000000000bd\n4 00000000000000dd\n")
    assert ns.compare_hashes(refs, tensors).startswith("rust: 1 of 2 frames' hashes matched")
    assert ns.compare_hashes(refs, tensors).endswith("; 1 differ; 3 stamps read from blocks, 3 Tensor messages")


def test_the_driver_needs_only_the_standard_library() -> None:
    # python -S: no site-packages at all, as on a python3 without numpy, rclpy or rosbags.
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    code = ("import sys, vptools.node_scenarios; "
            "print(sorted({n.split('.')[0] for n in sys.modules} & {'numpy', 'rclpy', 'rosbags', 'cv2', 'yaml'}))")
    out = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
    listed = subprocess.run([sys.executable, "-S", str(CLI), "--list"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert re.findall(r"^([a-z_]+)$", listed.stdout, re.M) == list(ns.SCENARIOS)
