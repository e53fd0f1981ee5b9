"""Detections back to source pixels in Python and C++ against the Rust results.

`vision_preproc geometry-cases` (the CLI with the `bench` feature) resolves 10,000 seeded
random geometries with the node's own `Geometry` (source sizes, network sizes, the three
resize modes, both letterbox anchors, both interpolations, rois), checks them in Rust
(network -> source -> network, source points through the node's geometry, the kernel's
sampling tables; `src/boxes/cases.rs`, within `boxes_source_px`) and prints per case a
points line, an xyxy and an xywh line with Rust's `to_source` and `to_network` of them.
Here `vision_preproc_consumer.boxes` and `consumer_c`'s `boxes.hpp` (compiled with g++)
map the same inputs; all three must agree within `boxes_cross_language_rel`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from vision_preproc_consumer import boxes
from vptools import HOOKS_BIN_DIR

ROOT = Path(__file__).resolve().parents[2]
BIN = HOOKS_BIN_DIR / "vision_preproc"
_T = json.loads((ROOT / "test" / "tolerances.json").read_text())
SOURCE_PX = _T["boxes_source_px"]
CROSS_REL = _T["boxes_cross_language_rel"]
COUNT = 10_000


def parse(line: str) -> tuple[str, tuple[float, ...], np.ndarray, np.ndarray, np.ndarray]:
    """(format, geometry, inputs, Rust's to_source, Rust's to_network) of one line."""
    f = line.split()
    k = int(f[5])
    v = np.array(f[6:], dtype=np.float64)
    assert v.size == 3 * k, line
    return f[0], tuple(float(x) for x in f[1:5]), v[:k], v[k:2 * k], v[2 * k:]


@pytest.fixture(scope="module")
def cases() -> list[str]:
    if not BIN.exists():
        pytest.fail(f"{BIN} is missing: run scripts/test_hooks_build.sh (make test does)")
    proc = subprocess.run([str(BIN), "geometry-cases", "--count", str(COUNT), "--seed", "46", "--tolerance",
                           str(SOURCE_PX)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    print(proc.stderr.strip())
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 * COUNT
    return lines


def assert_same(actual: list[np.ndarray], expected: list[np.ndarray], lines: list[str], what: str) -> None:
    """Every value within CROSS_REL (relative to max(1, |value|)); the first line off is named."""
    a, e = np.concatenate(actual), np.concatenate(expected)
    err = np.abs(a - e) / np.maximum(1.0, np.abs(e))
    if err.max() > CROSS_REL:
        line = np.searchsorted(np.cumsum([x.size for x in expected]), int(err.argmax()), side="right")
        raise AssertionError(f"{what}: relative difference {err.max()} on the line {lines[line]!r}: "
                             f"{actual[line]} against Rust's {expected[line]}")


def test_python_maps_like_rust(cases: list[str]) -> None:
    got_source, got_network, want_source, want_network, round_trip = [], [], [], [], []
    for line in cases:
        fmt, g, values, source, network = parse(line)
        n = boxes.ARITY[fmt]
        s = boxes.to_source(values.reshape(-1, n), g, fmt)
        got_source.append(s.ravel())
        got_network.append(boxes.to_network(values.reshape(-1, n), g, fmt).ravel())
        want_source.append(source)
        want_network.append(network)
        # network -> source -> network, the difference in source pixels (sizes too, in xywh).
        back = boxes.to_network(s, g, fmt).ravel()
        round_trip.append(np.abs(back - values) / np.resize(np.array(g[:2]), values.size))
    assert_same(got_source, want_source, cases, "to_source")
    assert_same(got_network, want_network, cases, "to_network")
    worst = float(np.concatenate(round_trip).max())
    assert worst <= SOURCE_PX, worst


def test_cpp_maps_like_rust(cases: list[str], tmp_path: Path) -> None:
    gxx = shutil.which("g++")
    assert gxx, "g++ is missing (build-essential)"
    exe = tmp_path / "boxes_check"
    include = ROOT / "consumer_c" / "include"
    subprocess.run([gxx, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{include}",
                    str(ROOT / "consumer_c" / "test" / "boxes_check.cpp"), "-o", str(exe)], check=True, timeout=120)
    proc = subprocess.run([str(exe)], input="\n".join(cases) + "\n", capture_output=True, text=True, timeout=60,
                          check=True)
    out = proc.stdout.splitlines()
    assert len(out) == len(cases)
    got, want = [], []
    for line, result in zip(cases, out):
        _, _, _, source, network = parse(line)
        got.append(np.array(result.split(), dtype=np.float64))
        want.append(np.concatenate([source, network]))
    assert_same(got, want, cases, "vp::to_source, vp::to_network")


def test_items_of_every_message_kind() -> None:
    # 1920x1080 -> 640x640 letterbox: scale 1/3, offset (0, 140); a box in the padding
    # maps outside the image (clipping is the caller's choice).
    item = SimpleNamespace(topic="/cam", valid=True, scale_x=1 / 3, scale_y=1 / 3, offset_x=0.0, offset_y=140.0)
    want = np.array([[30.0, 30.0, 1920.0, 1080.0], [0.0, -420.0, 3.0, -417.0]])
    net = [[10, 150, 640, 500], [0, 0, 1, 1]]
    for holder in (item, SimpleNamespace(items=[item]), SimpleNamespace(msg=SimpleNamespace(items=[item])),
                   {"scale_x": 1 / 3, "scale_y": 1 / 3, "offset_x": 0.0, "offset_y": 140.0}, (1 / 3, 1 / 3, 0, 140)):
        np.testing.assert_allclose(boxes.to_source(net, holder, "xyxy"), want, atol=1e-9)
    centre = boxes.to_source([[320, 320, 64, 32]], item, "xywh")
    np.testing.assert_allclose(centre, [[960.0, 540.0, 192.0, 96.0]], atol=1e-9)
    np.testing.assert_allclose(boxes.to_network(centre, item, "xywh"), [[320, 320, 64, 32]], atol=1e-9)
    np.testing.assert_allclose(boxes.to_source([1, 2], item, "points"), [3.0, -414.0], atol=1e-9)


@pytest.mark.parametrize("item, message", [
    (SimpleNamespace(items=[1, 2]), "pass msg.items[i]"),
    (SimpleNamespace(topic="/b", valid=False, scale_x=0.0, scale_y=0.0, offset_x=0.0, offset_y=0.0), "valid: false"),
    ((0.0, 1.0, 0.0, 0.0), "scales must be positive"),
    ((1.0, 2.0), "expected (scale_x"),
])
def test_refuses_items_without_geometry(item: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        boxes.to_source([[0, 0, 1, 1]], item)


def test_refuses_partial_detections() -> None:
    with pytest.raises(ValueError, match="last dimension of 4"):
        boxes.to_source([1, 2, 3], (1, 1, 0, 0), "xyxy")
    with pytest.raises(ValueError, match="format 'cxcy'"):
        boxes.to_source([1, 2], (1, 1, 0, 0), "cxcy")
