"""`vision_preproc replay`: bags written by the `rosbags` library (MCAP and sqlite3,
several encodings and sizes, a camera_info topic) -> replay -> the output bag read back
with `rosbags` -> tensors equal to the OpenCV oracle, one timing per tensor. Damaged bags
replay what can be replayed and say why the rest could not."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from vptools import HOOKS_BIN_DIR, ROOT, oracle
from vptools.bags import TS, Image, image_of, read_outputs, tensor_array, write_bag, write_cameras
from vptools.runner import CLI
from vptools.sources import photo_frame
from vptools.tolerances import assert_close

CONFIG = {"network_image_width": 96, "network_image_height": 64, "resize_mode": "letterbox",
          "image_mean": [0.485, 0.456, 0.406], "image_stddev": [0.229, 0.224, 0.225]}


def frames():
    return [
        photo_frame("bgr8", "chelsea.png", size=(151, 100)),
        photo_frame("yuyv", "coffee.png", size=(120, 80), pad=4),
        photo_frame("nv12", "astronaut.png", size=(64, 64)),
        photo_frame("bayer_rggb8", "rocket.jpg", size=(90, 60)),
        photo_frame("mono16", "camera.png", size=(50, 70), big_endian=True),
        photo_frame("rgb8", "coffee.png", size=(33, 17), pad=3),
    ]


#: The CLI with the test hooks (scripts/test_hooks_build.sh, run by scripts/test.sh) and the
#: variable that makes its CPU backend defer each set's work to the set's finish, with two
#: sets in flight: the overlapped path the CUDA backend takes (src/pipeline/deferred.rs).
HOOKS_CLI = HOOKS_BIN_DIR / "vision_preproc"
DEFERRED = {"VISION_PREPROC_TEST_DEFERRED_CPU": "1"}


def replay(inp: Path, out: Path, *extra: str, check: bool = True, deferred: bool = False) -> subprocess.CompletedProcess:
    cfg = out.parent / "cfg.yaml"
    cfg.write_text("vision_preproc:\n  ros__parameters:\n" + "".join(
        f"    {k}: {v}\n" for k, v in CONFIG.items()))
    cli = HOOKS_CLI if deferred else CLI
    assert cli.exists(), f"{cli} missing: scripts/test_hooks_build.sh builds it"
    p = subprocess.run([str(cli), "replay", str(inp), "-o", str(out), "--config", str(cfg), "--backend", "cpu", *extra],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, **(DEFERRED if deferred else {})))
    if check:
        assert p.returncode == 0, p.stderr + p.stdout
    return p


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_replay_matches_the_oracle(tmp_path: Path, storage: str) -> None:
    fs = frames()
    stamps = write_bag(tmp_path / "in", fs, storage=storage)
    p = replay(tmp_path / "in", tmp_path / "out")
    assert f"frames {len(fs)}: published {len(fs)}, rejected 0, skipped 0" in p.stdout, p.stdout
    tensors, timings = read_outputs(tmp_path / "out")
    assert len(tensors) == len(timings) == len(fs)
    for f, stamp, t, tm in zip(fs, stamps, tensors, timings):
        got = tensor_array(t)
        want = oracle.preprocess(f.data, f.encoding, f.width, f.height, f.step, f.big_endian, CONFIG)
        assert_close(got, want, "float32", f"replay {storage} {f.encoding} {f.width}x{f.height}")
        assert t.header.stamp.sec * 10**9 + t.header.stamp.nanosec == stamp
        assert (t.source_width, t.source_height, t.source_encoding) == (f.width, f.height, f.encoding)
        assert (t.layout, t.dtype, list(t.shape)) == ("NCHW", "float32", [1, 3, 64, 96])
        assert tm.header.stamp == t.header.stamp and tm.backend == "cpu"
        assert tm.preprocess_us > 0 and tm.total_us >= tm.preprocess_us
    assert [tm.sequence for tm in timings] == list(range(len(fs)))


def test_bare_files_and_determinism(tmp_path: Path) -> None:
    write_bag(tmp_path / "in", frames()[:3], storage="mcap")
    mcap = next((tmp_path / "in").glob("*.mcap"))
    replay(mcap, tmp_path / "a")
    replay(mcap, tmp_path / "b")
    # On the CPU backend the tensors are bit-identical from run to run.
    ta, _ = read_outputs(tmp_path / "a")
    tb, _ = read_outputs(tmp_path / "b")
    assert [t.data.tobytes() for t in ta] == [t.data.tobytes() for t in tb]
    assert len(ta) == 3
    write_bag(tmp_path / "db", frames()[:2], storage="sqlite3")
    db3 = next((tmp_path / "db").glob("*.db3"))
    replay(db3, tmp_path / "c")
    assert len(read_outputs(tmp_path / "c")[0]) == 2


def test_damaged_bags_replay_the_rest(tmp_path: Path) -> None:
    fs = frames()[:4]
    # One corrupt message (data cut short), one message of the wrong type on the image
    # topic, one invalid image (step too small) - each skipped or rejected with a reason.
    good = TS.serialize_cdr(image_of(fs[0], 5), Image.__msgtype__)
    corrupt = bytes(good[: len(good) // 2])
    bad_step = image_of(fs[1], 6)
    bad_step.step = 3
    string_msg = TS.serialize_cdr(TS.types["std_msgs/msg/String"](data="not an image"), "std_msgs/msg/String")
    write_bag(tmp_path / "in", fs, storage="mcap", with_camera_info=False, extra=[
        ("/camera/image_raw", Image.__msgtype__, corrupt),
        ("/camera/image_raw", Image.__msgtype__, string_msg),
        ("/camera/image_raw", Image.__msgtype__, TS.serialize_cdr(bad_step, Image.__msgtype__)),
    ])
    p = replay(tmp_path / "in", tmp_path / "out")
    assert "frames 7: published 4, rejected 1, skipped 2" in p.stdout, p.stdout
    assert "corrupt CDR at field `data`" in p.stdout, p.stdout
    assert "step 3 < width*" in p.stdout, p.stdout
    assert len(read_outputs(tmp_path / "out")[0]) == 4

    # A truncated file (six equal frames, cut in the middle): the messages before the cut
    # are replayed, the damage is reported.
    same = [photo_frame("bgr8", "coffee.png", size=(120, 80))] * 6
    write_bag(tmp_path / "six", same, storage="mcap", with_camera_info=False)
    mcap = next((tmp_path / "six").glob("*.mcap"))
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(mcap.read_bytes()[: mcap.stat().st_size // 2])
    p = replay(cut, tmp_path / "out_cut")
    assert "bag damaged" in p.stdout and "stopped reading" in p.stdout, p.stdout
    tensors, _ = read_outputs(tmp_path / "out_cut")
    assert 2 <= len(tensors) <= 3, len(tensors)
    for f, t in zip(same, tensors):
        want = oracle.preprocess(f.data, f.encoding, f.width, f.height, f.step, f.big_endian, CONFIG)
        assert_close(tensor_array(t), want, "float32", "truncated bag")

    # Not a bag at all, and a missing one: clear errors, no panic.
    junk = tmp_path / "junk.mcap"
    junk.write_bytes(b"hello")
    for path, msg in [(junk, "not an MCAP file"), (tmp_path / "missing", "missing")]:
        p = replay(path, tmp_path / f"o_{path.name}", check=False)
        assert p.returncode == 1 and msg in p.stderr and "panicked" not in p.stderr, p.stderr


def test_topic_choice(tmp_path: Path) -> None:
    fs = frames()[:2]
    write_bag(tmp_path / "in", fs, storage="mcap", with_camera_info=False,
              extra=[("/other/image", Image.__msgtype__, TS.serialize_cdr(image_of(fs[0], 9), Image.__msgtype__))])
    p = replay(tmp_path / "in", tmp_path / "o1", check=False)
    assert p.returncode == 1 and "several image topics" in p.stderr and "/other/image" in p.stderr, p.stderr
    p = replay(tmp_path / "in", tmp_path / "o2", "--topic", "/other/image")
    assert "frames 1: published 1" in p.stdout
    p = replay(tmp_path / "in", tmp_path / "o3", "--topic", "/nope", check=False)
    assert p.returncode == 1 and "--topic /nope" in p.stderr


def test_replay_of_several_cameras_batches_them(tmp_path: Path) -> None:
    """Two image topics of one bag -> TensorBatch: approximate_time pairs each camera-1
    frame with the camera-0 frame 7 ms before it; latest pads the camera that stopped
    (stale) and repeats none; each item equals the oracle; two runs give the same bytes."""
    a = photo_frame("bgr8", "chelsea.png", size=(151, 100))
    b = photo_frame("nv12", "astronaut.png", size=(64, 64))
    t0 = 1_700_000_000_000_000_000
    s0 = [t0 + k * 50_000_000 for k in range(10)]
    s1 = [t0 + k * 100_000_000 + 7_000_000 for k in range(3)]  # camera 1 stops after 3 frames
    write_cameras(tmp_path / "in", [("/cam0/image", a, s0), ("/cam1/image", b, s1)])
    sources = {"/cam0/image": a, "/cam1/image": b}
    approx = ("--topic", "/cam0/image", "--topic", "/cam1/image", "--set", "batch_policy=approximate_time",
              "--set", "max_interval_ms=20", "--set", "stale_after_ms=120")
    p = replay(tmp_path / "in", tmp_path / "a", *approx)
    # Pairs (0, 7), (100, 107), (200, 207) ms; 50 and 150 have no partner within 20 ms
    # (dropped); camera 1 is stale from 120 ms after its last frame, so 250 ... 450 go
    # out alone with camera 1's slot padded.
    assert "frames 13: 8 batches, 5 padded (stale) slots, rejected 0" in p.stdout, p.stdout
    assert "/cam0/image: received 10, batched 8, dropped 2" in p.stdout, p.stdout
    batches, timings = read_outputs(tmp_path / "a")
    assert len(batches) == len(timings) == 8
    for k, msg in enumerate(batches):
        stamps = [it.header.stamp.sec * 10**9 + it.header.stamp.nanosec for it in msg.items]
        assert list(msg.shape) == [2, 3, 64, 96] and [it.topic for it in msg.items] == list(sources)
        if k < 3:
            assert stamps == [s0[2 * k], s1[k]], (k, stamps)
        else:
            assert stamps[0] == s0[k + 2] and not msg.items[1].valid, (k, stamps)
        data = tensor_array(msg)
        for i, it in enumerate(msg.items):
            if not it.valid:
                continue
            f = sources[it.topic]
            assert (it.source_width, it.source_encoding) == (f.width, f.encoding)
            want = oracle.preprocess(f.data, f.encoding, f.width, f.height, f.step, f.big_endian, CONFIG)[0]
            assert_close(data[i], want, "float32", f"replay batch {k} item {i}")
    replay(tmp_path / "in", tmp_path / "b", *approx)
    assert [m.data.tobytes() for m in read_outputs(tmp_path / "b")[0]] == [m.data.tobytes() for m in batches]
    # latest: a batch when both have a new frame or 60 ms after the first new one;
    # camera 1 goes stale 120 ms after its last frame and its slot is padded.
    p = replay(tmp_path / "in", tmp_path / "c", "--topic", "/cam0/image", "--topic", "/cam1/image",
               "--set", "batch_policy=latest", "--set", "batch_timeout_ms=60", "--set", "stale_after_ms=120")
    batches, _ = read_outputs(tmp_path / "c")
    assert batches and not batches[-1].items[1].valid and batches[-1].items[0].valid, p.stdout
    pad = (0 / 255 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    np.testing.assert_allclose(tensor_array(batches[-1])[1], np.broadcast_to(pad[:, None, None], (3, 64, 96)),
                               rtol=1e-6)
    cam0 = [m.items[0].header.stamp.sec * 10**9 + m.items[0].header.stamp.nanosec for m in batches]
    assert cam0 == sorted(cam0) and cam0[-1] == s0[-1]
    for m in batches:
        assert m.items[0].valid and not (m.items[1].valid and m.items[1].repeated and m.items[0].repeated)


def test_replay_with_two_sets_in_flight_writes_the_same_bag(tmp_path: Path) -> None:
    """Replay keeps the backend's sets in flight (two on CUDA: set k+1 submitted before set k
    is finished and written). The overlapped path, on the CPU with the test hook that
    defers each set's work to its finish: the same tensors bit for bit, the same stamps and
    sequence, for one camera whose frames change size and encoding from set to set and for
    a two-camera batch."""
    write_bag(tmp_path / "in", frames(), storage="mcap")
    plain = replay(tmp_path / "in", tmp_path / "a")
    overlapped = replay(tmp_path / "in", tmp_path / "b", deferred=True)
    assert "work deferred" in overlapped.stderr, overlapped.stderr
    a_t, a_tm = read_outputs(tmp_path / "a")
    b_t, b_tm = read_outputs(tmp_path / "b")
    assert len(a_t) == len(b_t) == len(frames()), (plain.stdout, overlapped.stdout)
    assert [t.data.tobytes() for t in a_t] == [t.data.tobytes() for t in b_t]
    assert [t.header.stamp for t in a_t] == [t.header.stamp for t in b_t]
    assert [tm.sequence for tm in b_tm] == list(range(len(b_t))) == [tm.sequence for tm in a_tm]
    a = photo_frame("bgr8", "chelsea.png", size=(151, 100))
    b = photo_frame("nv12", "astronaut.png", size=(64, 64))
    t0 = 1_700_000_000_000_000_000
    write_cameras(tmp_path / "cams", [("/cam0/image", a, [t0 + k * 50_000_000 for k in range(10)]),
                                      ("/cam1/image", b, [t0 + k * 100_000_000 + 7_000_000 for k in range(3)])])
    two = ("--topic", "/cam0/image", "--topic", "/cam1/image", "--set", "batch_policy=latest",
           "--set", "batch_timeout_ms=60", "--set", "stale_after_ms=120")
    replay(tmp_path / "cams", tmp_path / "c", *two)
    replay(tmp_path / "cams", tmp_path / "d", *two, deferred=True)
    c_t, d_t = read_outputs(tmp_path / "c")[0], read_outputs(tmp_path / "d")[0]
    assert len(c_t) == len(d_t) >= 5
    assert [m.data.tobytes() for m in c_t] == [m.data.tobytes() for m in d_t]
    assert [[it.valid for it in m.items] for m in c_t] == [[it.valid for it in m.items] for m in d_t]
