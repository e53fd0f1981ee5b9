"""`vision_preproc replay` of compressed topics (`sensor_msgs/CompressedImage`, as robot
datasets record `<camera>/image_raw/compressed`): bags written by the `rosbags` library
with photographs encoded by OpenCV and Pillow (JPEG q50/q90, 4:2:0/4:2:2/4:4:4,
progressive, grey; PNG rgb8 and 16-bit grey as `16UC1; png compressed`; an MJPEG frame
without Huffman tables as `jpeg`), replayed on the CPU backend: each tensor equals the
OpenCV oracle fed OUR decoder's pixels (`decode-file`: the decoder itself is compared with
OpenCV's in test_compressed_decode.py). Damaged payloads between good ones are counted by
cause, never a crash; a batch mixes a raw and a compressed camera."""

from __future__ import annotations

import functools
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from vptools import oracle
from vptools.bags import TS, CompressedImage, compressed_of, read_outputs, tensor_array, write_bag, write_cameras
from vptools.compressed import (BIN, Image, Payload, cv_jpeg, cv_png, decoded, photo, pil_jpeg, run_decoder,
                                with_declared_size, without_huffman_tables)
from vptools.runner import CLI
from vptools.sources import photo_frame
from vptools.tolerances import assert_close

CONFIG = {"network_image_width": 96, "network_image_height": 64, "resize_mode": "letterbox",
          "image_mean": [0.485, 0.456, 0.406], "image_stddev": [0.229, 0.224, 0.225]}
TOPIC = "/camera/image_raw/compressed"


def grey16() -> np.ndarray:
    """A 16-bit depth-like image: camera.png * 257 + noise (so v / 257 is not an integer)."""
    grey = photo("camera.png", grey=True)
    noise = np.random.default_rng(7).integers(0, 256, grey.shape)
    return (grey.astype(np.uint16) * 257 + noise).astype(np.uint16)


def payloads() -> list[tuple[str, Payload]]:
    """(id, payload) of the photographs, as publishers write them."""
    cases = [
        ("cv-q50-420", Payload("bgr8; jpeg compressed bgr8", cv_jpeg(photo("chelsea.png"), 50, "420", False))),
        ("cv-q90-422", Payload("rgb8; jpeg compressed bgr8", cv_jpeg(photo("astronaut.png"), 90, "422", False))),
        ("cv-q90-444-prog", Payload("bgr8; jpeg compressed bgr8", cv_jpeg(photo("rocket.jpg"), 90, "444", True))),
        ("cv-q90-420-prog", Payload("bgr8; jpeg compressed bgr8", cv_jpeg(photo("coffee.png"), 90, "420", True))),
        ("cv-grey-q90", Payload("mono8; jpeg compressed mono8",
                                cv_jpeg(photo("camera.png", grey=True), 90, "444", False))),
        ("mjpeg-no-dht", Payload("jpeg", without_huffman_tables(cv_jpeg(photo("coffee.png"), 80, "420", False)))),
        ("png-rgb8", Payload("bgr8; png compressed bgr8", cv_png(photo("chelsea.png")))),
        ("png-16UC1", Payload("16UC1; png compressed", cv_png(grey16()))),
    ]
    if Image is not None:
        cases += [
            ("pil-q50-420", Payload("jpeg", pil_jpeg("astronaut.png", 50, 2, False))),
            ("pil-q90-444-prog", Payload("jpeg", pil_jpeg("chelsea.png", 90, 0, True))),
            ("pil-grey-q90", Payload("jpeg", pil_jpeg("camera.png", 90, 0, False, "L"))),
        ]
    return cases


@pytest.fixture(scope="module")
def decoder() -> Path:
    if not BIN.exists():
        pytest.fail(f"{BIN} is missing: run scripts/test_hooks_build.sh (make test does)")
    return BIN


@functools.lru_cache(maxsize=None)
def expected(fmt: str, data: bytes) -> tuple[int, int, np.ndarray]:
    """(width, height, tensor): the oracle on our decoder's pixels of the payload."""
    with tempfile.TemporaryDirectory() as tmp:
        encoding, arr = decoded(BIN, Path(tmp), fmt, data)
    h, w = arr.shape[:2]
    raw = np.ascontiguousarray(arr).tobytes()
    return w, h, oracle.preprocess(raw, encoding, w, h, len(raw) // h, False, CONFIG)


def replay(inp: Path, out: Path, *extra: str, check: bool = True) -> tuple[subprocess.CompletedProcess, dict]:
    cfg = out.parent / f"{out.name}.yaml"
    cfg.write_text("vision_preproc:\n  ros__parameters:\n" + "".join(
        f"    {k}: {v}\n" for k, v in CONFIG.items()))
    assert CLI.exists(), f"{CLI} missing: `cargo build --release --bins` builds it"
    summary = out.parent / f"{out.name}.json"
    p = subprocess.run([str(CLI), "replay", str(inp), "-o", str(out), "--config", str(cfg), "--backend", "cpu",
                        "--json", str(summary), *extra], capture_output=True, text=True, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr + p.stdout
    return p, json.loads(summary.read_text()) if summary.exists() else {}


def check_tensor(t, tm, payload: Payload, what: str) -> None:
    w, h, want = expected(payload.format, payload.data)
    assert_close(tensor_array(t), want, "float32", what)
    # The tensor says what arrived: the compressed format, as the node publishes it.
    assert (t.source_width, t.source_height, t.source_encoding) == (w, h, payload.format), what
    assert tm.header.stamp == t.header.stamp and tm.decode_us > 0, (what, tm.decode_us)


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_replay_of_compressed_photographs_matches_the_oracle(tmp_path: Path, storage: str, decoder: Path) -> None:
    cases = payloads()
    stamps = write_bag(tmp_path / "in", [p for _, p in cases], storage=storage, topic=TOPIC)
    p, summary = replay(tmp_path / "in", tmp_path / "out")
    n = len(cases)
    assert f"topic {TOPIC} (compressed)" in p.stdout and f"frames {n}: published {n}, rejected 0, skipped 0" \
        in p.stdout, p.stdout
    assert any(line.split()[:1] == ["decode"] for line in p.stdout.splitlines()), p.stdout
    assert summary["published"] == n and summary["undecodable"] == {} and summary["stages_us"]["decode"]["p50"] > 0
    tensors, timings = read_outputs(tmp_path / "out")
    assert len(tensors) == len(timings) == n
    for (name, payload), stamp, t, tm in zip(cases, stamps, tensors, timings):
        assert t.header.stamp.sec * 10**9 + t.header.stamp.nanosec == stamp
        check_tensor(t, tm, payload, f"replay {storage} {name}")


def flipped(data: bytes, at: float, seed: int, count: int = 3) -> bytes:
    """`count` bytes of the payload's second half changed (inside the coded data)."""
    rng = np.random.default_rng(seed)
    b = bytearray(data)
    for i in rng.integers(int(len(b) * at), len(b) - 16, count):
        b[i] ^= int(rng.integers(1, 256))
    return bytes(b)


def test_damaged_messages_are_counted_by_cause_and_the_rest_replayed(tmp_path: Path, decoder: Path) -> None:
    """Truncated, flipped and bomb payloads between good ones (sqlite3): each counted by the
    cause our decoder gives it alone (a PNG whose data fails its checksum is refused when it
    is decoded, the others when their headers are read), a message that is not CDR skipped;
    every good frame equals the oracle."""
    jpeg = cv_jpeg(photo("chelsea.png"), 80, "420", False)
    png = cv_png(photo("coffee.png"))
    good = [Payload("bgr8; jpeg compressed bgr8", jpeg), Payload("png", png),
            Payload("jpeg", cv_jpeg(photo("astronaut.png"), 90, "444", True))]
    damaged = [
        Payload("bgr8; jpeg compressed bgr8", jpeg[: len(jpeg) * 6 // 10]),  # truncated
        Payload("png", flipped(png, 0.5, 1)),  # IDAT's checksum: corrupt, when decoded
        Payload("jpeg", with_declared_size(jpeg, 100000, 100000)),  # a decompression bomb
        Payload("bgr8; jpeg compressed bgr8", flipped(jpeg, 0.5, 2, count=8)),
        Payload("png", png[: len(png) // 2]),
    ]
    items = [good[0], damaged[0], good[1], damaged[1], damaged[2], good[2], damaged[3], good[0], damaged[4], good[1]]
    # What our decoder says of each damaged payload alone.
    want: dict[str, int] = {}
    for d in damaged:
        rc, head, _ = run_decoder(decoder, tmp_path, d.format, d.data)
        if rc == 2:
            want[head["error"]] = want.get(head["error"], 0) + 1
    assert {"truncated", "corrupt", "too_large"} <= set(want), want
    cut = TS.serialize_cdr(compressed_of(good[0], 7), CompressedImage.__msgtype__)
    stamps = write_bag(tmp_path / "in", items, storage="sqlite3", topic=TOPIC, with_camera_info=False,
                       extra=[(TOPIC, CompressedImage.__msgtype__, bytes(cut[: len(cut) // 2]))])
    p, summary = replay(tmp_path / "in", tmp_path / "out")
    assert summary["undecodable"] == want, (summary, p.stdout)
    bad = sum(want.values())
    assert summary["frames"] == len(items) + 1 and summary["published"] == len(items) - bad, summary
    assert f"rejected {bad}, skipped 1" in p.stdout and "corrupt CDR at field `data`" in p.stdout, p.stdout
    for kind, n in want.items():
        assert f"rejected x{n}: undecodable compressed image ({kind}); the first: " in p.stdout, p.stdout
    assert sum(summary["rejected"].values()) == bad
    tensors, timings = read_outputs(tmp_path / "out")
    by_stamp = {t.header.stamp.sec * 10**9 + t.header.stamp.nanosec: (t, tm) for t, tm in zip(tensors, timings)}
    for item, stamp in zip(items, stamps):
        rc, _, _ = run_decoder(decoder, tmp_path, item.format, item.data)
        assert (stamp in by_stamp) == (rc == 0), (stamp, rc)
        if rc == 0:
            check_tensor(*by_stamp[stamp], item, f"good frame at {stamp}")


def test_a_batch_of_a_raw_and_a_compressed_camera(tmp_path: Path, decoder: Path) -> None:
    """A node's configuration with two inputs, the second `compressed`: replay reads
    `/cam1/image_raw/compressed` for it and batches it with the raw camera; each item
    equals the oracle. Without inputs the bag has two image topics: the error lists both
    with their types, and `--topic` picks the compressed one alone, as does a configuration
    with that one input and `image_transport: compressed`."""
    raw = photo_frame("bgr8", "chelsea.png", size=(151, 100))
    jpeg = Payload("rgb8; jpeg compressed bgr8", cv_jpeg(photo("astronaut.png"), 90, "420", False))
    t0 = 1_700_000_000_000_000_000
    s0 = [t0 + k * 50_000_000 for k in range(4)]
    s1 = [t + 5_000_000 for t in s0]
    write_cameras(tmp_path / "in", [("/cam0/image_raw", raw, s0), ("/cam1/image_raw/compressed", jpeg, s1)])
    p, summary = replay(tmp_path / "in", tmp_path / "a", "--set", "inputs=[cam0/image_raw, cam1/image_raw]",
                        "--set", 'input_transports=["", compressed]', "--set", "batch_policy=latest",
                        "--set", "batch_timeout_ms=30")
    assert "/cam1/image_raw/compressed (compressed): received 4, batched 4" in p.stdout, p.stdout
    assert summary["published"] == 4 and summary["stages_us"]["decode"]["p50"] > 0, summary
    batches, timings = read_outputs(tmp_path / "a")
    assert len(batches) == len(timings) == 4 and all(tm.decode_us > 0 for tm in timings)
    w, h, want_jpeg = expected(jpeg.format, jpeg.data)
    want_raw = oracle.preprocess(raw.data, raw.encoding, raw.width, raw.height, raw.step, raw.big_endian, CONFIG)
    for k, msg in enumerate(batches):
        assert [it.valid for it in msg.items] == [True, True], k
        assert [it.header.stamp.sec * 10**9 + it.header.stamp.nanosec for it in msg.items] == [s0[k], s1[k]]
        assert (msg.items[1].source_encoding, msg.items[1].source_width) == (jpeg.format, w)
        data = tensor_array(msg)
        assert_close(data[0], want_raw[0], "float32", f"batch {k} raw item")
        assert_close(data[1], want_jpeg[0], "float32", f"batch {k} compressed item")
    p, _ = replay(tmp_path / "in", tmp_path / "b", check=False)
    assert p.returncode == 1 and "several image topics" in p.stderr, p.stderr
    assert "/cam1/image_raw/compressed (sensor_msgs/msg/CompressedImage)" in p.stderr, p.stderr
    assert "/cam0/image_raw (sensor_msgs/msg/Image)" in p.stderr, p.stderr
    p, summary = replay(tmp_path / "in", tmp_path / "c", "--topic", "/cam1/image_raw/compressed")
    assert summary["published"] == 4, p.stdout
    # One configured camera: the bag's topic of that input with its transport.
    for inp, transport, topic in [("cam1/image_raw", "compressed", "/cam1/image_raw/compressed (compressed)"),
                                  ("/cam0/image_raw", "raw", "/cam0/image_raw, backend")]:
        p, summary = replay(tmp_path / "in", tmp_path / f"d{transport}", "--set", f"inputs=[{inp}]",
                            "--set", f"image_transport={transport}")
        assert f"topic {topic}" in p.stdout and summary["published"] == 4, p.stdout
