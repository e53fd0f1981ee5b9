"""Parity of the CPU backend (through the `vision_preproc run-file` CLI) with the
independent OpenCV + NumPy oracle (oracle.py), on the real photographs of test/data
converted to every encoding, for every resize mode, anchor, layout, dtype,
interpolation, channel count and order, with roi, padded row strides, big-endian 16-bit
samples, and awkward sizes. Tolerances: tolerances.assert_close only."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import cv2
import numpy as np
import pytest

from vptools import oracle, runner, sources
from vptools.sources import ALL_ENCODINGS, photo_frame
from vptools.tolerances import assert_close, assert_preview_close

ALIASES = ("yuv422_yuy2", "yuv422")
SIXTEEN = ("mono16", "rgb16", "bgr16")

# Four configurations that together cover every option at least once for every encoding.
VARIANTS = {
    # odd network size, centred letterbox, bilinear downscale, planar float32
    "letterbox-nchw-f32": dict(network_image_width=97, network_image_height=61),
    # grey output, nearest, stretch, interleaved float16, ImageNet-like grey stats
    "grey-nearest-stretch-nhwc-f16": dict(
        network_image_width=97, network_image_height=61, output_channels=1,
        image_mean=[0.449], image_stddev=[0.226], interpolation="nearest",
        resize_mode="stretch", output_layout="NHWC", output_dtype="float16"),
    # roi at odd offsets, centre crop, 3x upscale, BGR order, NHWC float32
    "roi-centercrop-upscale-bgr-nhwc": dict(
        network_image_width=320, network_image_height=320, roi=[13, 7, 101, 75],
        resize_mode="center_crop", channel_order="bgr", output_layout="NHWC"),
    # ~20x downscale into a top-left letterbox with a coloured pad, per-channel stats in
    # output order (ImageNet), float16 NCHW
    "downscale-topleft-pad-f16": dict(
        network_image_width=29, network_image_height=23, letterbox_anchor="top_left",
        pad_value=[114, 30, 250], image_mean=[0.485, 0.456, 0.406],
        image_stddev=[0.229, 0.224, 0.225], output_dtype="float16"),
}


def encoding_cases() -> list:
    return [pytest.param(enc, be, id=f"{enc}{'-be' if be else ''}")
            for enc in ALL_ENCODINGS + ALIASES
            for be in ((False, True) if enc in SIXTEEN else (False,))]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("encoding,big_endian", encoding_cases())
def test_every_encoding(encoding: str, big_endian: bool, variant: str) -> None:
    # chelsea.png is 451x300: odd width (made even for 4:2:2 and 4:2:0), rows padded
    # by 3 bytes so step != width * bytes per pixel.
    photo = "coffee.png" if variant.startswith("downscale") else "chelsea.png"
    frame = photo_frame(encoding, photo, pad=3, big_endian=big_endian)
    runner.check(frame, VARIANTS[variant], f"{encoding} {variant}")


GEOMETRY_SIZES = [(1, 1), (1, 37), (37, 1), (300, 1), (7, 5), (97, 61), (640, 640)]
MODES = [("stretch", "center"), ("letterbox", "center"), ("letterbox", "top_left"),
         ("center_crop", "center")]


@pytest.mark.parametrize("interpolation", ["linear", "nearest"])
@pytest.mark.parametrize("mode,anchor", MODES, ids=[f"{m}-{a}" for m, a in MODES])
@pytest.mark.parametrize("size", GEOMETRY_SIZES, ids=[f"{w}x{h}" for w, h in GEOMETRY_SIZES])
def test_geometry(size, mode: str, anchor: str, interpolation: str) -> None:
    # coffee.png 600x400 (no padding): 1x1 is a 400x downscale, 640x640 an upscale.
    frame = photo_frame("rgb8", "coffee.png")
    w, h = size
    cfg = dict(network_image_width=w, network_image_height=h, resize_mode=mode,
               letterbox_anchor=anchor, interpolation=interpolation, pad_value=[10, 200, 30])
    runner.check(frame, cfg)


SMALL_SOURCES = [
    ("rgb8", (1, 1)), ("rgb8", (1, 37)), ("rgb8", (37, 1)), ("bgra8", (5, 3)),
    ("mono16", (1, 9)), ("rgb16", (9, 1)),
    ("yuyv", (2, 1)), ("uyvy", (6, 5)), ("nv12", (2, 2)), ("nv21", (6, 4)),
    ("bayer_rggb8", (1, 1)), ("bayer_bggr8", (2, 7)), ("bayer_gbrg8", (7, 2)),
    ("bayer_grbg8", (3, 3)), ("bayer_rggb8", (5, 4)),
]


@pytest.mark.parametrize("encoding,size", SMALL_SOURCES,
                         ids=[f"{e}-{w}x{h}" for e, (w, h) in SMALL_SOURCES])
@pytest.mark.parametrize("mode", ["stretch", "letterbox", "center_crop"])
def test_tiny_sources(encoding: str, size, mode: str) -> None:
    # Tiny sources upscaled: every output sample comes from the clamped edges (and, for
    # Bayer, from OpenCV's border copies or its all-zero output below 3x3).
    w, h = size
    frame = photo_frame(encoding, "astronaut.png", crop=(200, 100, w, h), pad=1)
    cfg = dict(network_image_width=23, network_image_height=17, resize_mode=mode)
    runner.check(frame, cfg)


ROI_CASES = ["yuyv", "uyvy", "nv12", "nv21", "bayer_gbrg8", "rgba8", "mono16"]


@pytest.mark.parametrize("encoding", ROI_CASES)
def test_roi_at_odd_offsets_inside_subsampled_chroma(encoding: str) -> None:
    # The roi starts in the middle of a 4:2:2 pair / 4:2:0 block / Bayer tile; samples
    # still decode from the whole image (chroma of the pair, Bayer neighbours outside the
    # roi), as cv2.cvtColor of the whole image then slicing does.
    frame = photo_frame(encoding, "rocket.jpg", pad=5)
    for roi, (w, h), mode in [([101, 33, 251, 173], (64, 48), "letterbox"),
                              ([1, 1, 5, 3], (40, 30), "stretch"),
                              ([frame.width - 3, frame.height - 5, 3, 5], (9, 9), "letterbox")]:
        cfg = dict(network_image_width=w, network_image_height=h, roi=roi, resize_mode=mode)
        runner.check(frame, cfg, f"{encoding} roi {roi}")


NORMALIZATIONS = {
    "raw-pixels": dict(pixel_scale=1.0, image_mean=[0.0], image_stddev=[1.0]),
    "imagenet-bgr": dict(channel_order="bgr", image_mean=[0.406, 0.456, 0.485],
                         image_stddev=[0.225, 0.224, 0.229], pad_value=[255, 0, 0]),
    "one-pad-value": dict(pad_value=[114], image_mean=[0.0], image_stddev=[1.0]),
    "negative-scale": dict(pixel_scale=-2.0 / 255.0, image_mean=[1.0, 0.0, -1.0],
                           image_stddev=[2.0, 0.5, 4.0], pad_value=[0.5, 254.5, 128]),
    "grey-coloured-pad": dict(output_channels=1, image_mean=[0.5], image_stddev=[0.25],
                              pad_value=[0, 255, 0]),
}


@pytest.mark.parametrize("name", NORMALIZATIONS)
@pytest.mark.parametrize("encoding", ["rgb8", "bgr16", "mono8"])
def test_normalization_and_padding(encoding: str, name: str) -> None:
    frame = photo_frame(encoding, "astronaut.png", size=(211, 97))
    cfg = dict(network_image_width=64, network_image_height=64, **NORMALIZATIONS[name])
    for layout in ("NCHW", "NHWC"):
        runner.check(frame, {**cfg, "output_layout": layout}, f"{encoding} {name} {layout}")


def test_grey_photograph_to_three_channels() -> None:
    # camera.png is a grey photograph: mono8 and mono16 are replicated to 3 channels.
    for enc in ("mono8", "mono16"):
        frame = photo_frame(enc, "camera.png", pad=2)
        runner.check(frame, dict(network_image_width=200, network_image_height=150,
                                 resize_mode="letterbox"), enc)
        runner.check(frame, dict(network_image_width=61, network_image_height=47,
                                 output_channels=1, image_mean=[0.5], image_stddev=[0.5]), enc)


def test_sixteen_bit_full_range_is_255() -> None:
    # 65535 -> 255.0 exactly: with pixel_scale 1/255, mean 0, std 1 the output is 1.0.
    data = np.full((4, 4), 65535, ">u2").tobytes()
    frame = sources.Frame(data, "mono16", 4, 4, 8, big_endian=True)
    cfg = dict(network_image_width=3, network_image_height=2, image_mean=[0.0],
               image_stddev=[1.0], resize_mode="stretch")
    out = runner.check(frame, cfg)
    assert (out == np.float32(1.0)).all()


def test_preview_is_the_denormalized_network_image() -> None:
    frame = photo_frame("bgr8", "coffee.png", pad=1)
    cfg = dict(network_image_width=120, network_image_height=120, channel_order="bgr",
               pad_value=[114, 30, 250], image_mean=[0.4, 0.5, 0.6],
               image_stddev=[0.2, 0.3, 0.4], output_dtype="float16")
    tensor, preview = runner.run_frame(frame, cfg, preview=True)
    assert preview.shape == (120, 120, 3)
    # The oracle's network image in 8-bit RGB: normalized values back to pixels.
    raw = oracle.preprocess(frame.data, frame.encoding, frame.width, frame.height,
                            frame.step, False, {**cfg, "pixel_scale": 1.0,
                                                "image_mean": [0.0], "image_stddev": [1.0],
                                                "channel_order": "rgb", "output_layout": "NHWC"})[0]
    want_rgb = np.clip(np.round(raw), 0, 255)
    assert_preview_close(cv2.cvtColor(preview, cv2.COLOR_BGR2RGB), want_rgb, "preview")
    # Letterbox rows show the pad colour.
    assert tuple(cv2.cvtColor(preview, cv2.COLOR_BGR2RGB)[0, 0]) == (114, 30, 250)


@pytest.fixture(scope="module")
def tmp() -> Path:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def _config_file(tmp: Path, cfg: dict) -> Path:
    path = tmp / "cfg.yaml"
    path.write_text(json.dumps({"backend": "cpu", **cfg}))
    return path


@pytest.mark.parametrize("kind", ["rgb8", "rgba8", "mono8", "mono16", "rgb16"])
def test_png_files_decode_like_opencv(tmp: Path, kind: str) -> None:
    # PNG is lossless: the `image` crate and cv2.imread see the same pixels.
    rgb = sources.photo_rgb("chelsea.png")[:101, :133]
    grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    noise = np.random.default_rng(3).integers(0, 256, rgb.shape[:2], dtype=np.uint16)
    img, frame = {
        "rgb8": lambda: (rgb[..., ::-1], sources.make_frame("rgb8", rgb)),
        "rgba8": lambda: (np.dstack([rgb[..., ::-1], noise.astype(np.uint8)]),
                          None),
        "mono8": lambda: (grey, sources.make_frame("mono8", rgb, grey=grey)),
        "mono16": lambda: ((grey.astype(np.uint16) * 257 + noise // 2), None),
        "rgb16": lambda: ((rgb[..., ::-1].astype(np.uint16) * 257 + noise[..., None] // 3),
                          None),
    }[kind]()
    path = tmp / f"{kind}.png"
    assert cv2.imwrite(str(path), img)
    cfg = dict(network_image_width=50, network_image_height=40)
    out = tmp / f"{kind}.npy"
    runner.cli("run-file", "--config", _config_file(tmp, cfg), path, "-o", out)
    # What the file holds, as the oracle reads it: cv2.imread, then the raw encoding.
    back = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    h, w = back.shape[:2]
    if back.ndim == 2:
        enc = "mono16" if back.dtype == np.uint16 else "mono8"
        arr = back.astype("<u2") if back.dtype == np.uint16 else back
    else:
        rgb_back = cv2.cvtColor(back, cv2.COLOR_BGRA2RGBA if back.shape[2] == 4 else cv2.COLOR_BGR2RGB)
        if back.dtype == np.uint16:
            enc, arr = "rgb16", rgb_back.astype("<u2")
        else:
            enc, arr = ("rgba8" if back.shape[2] == 4 else "rgb8"), rgb_back
    data = np.ascontiguousarray(arr).view(np.uint8).reshape(h, -1)
    want = oracle.preprocess(data.tobytes(), enc, w, h, data.shape[1], False, cfg)
    assert_close(np.load(out), want, "float32", f"png {kind}")
    if frame is not None:
        # ... and the same tensor as feeding the raw bytes.
        raw, _ = runner.run_frame(frame, cfg)
        assert_close(np.load(out), raw, "float32", f"png {kind} vs raw")


def test_jpeg_file_runs(tmp: Path) -> None:
    # JPEG decoders differ by a level here and there (IDCT rounding), so this is not a
    # parity test: the tensor has the right shape, and its mean over the image matches
    # OpenCV's decode within 1 level of 255 in normalized units.
    path = sources.DATA / "rocket.jpg"
    cfg = dict(network_image_width=64, network_image_height=64, output_layout="NHWC")
    out = tmp / "rocket.npy"
    prev = tmp / "rocket.png"
    runner.cli("run-file", "--config", _config_file(tmp, cfg), path, "-o", out, "--preview", prev)
    t = np.load(out)
    assert t.shape == (1, 64, 64, 3) and t.dtype == np.float32
    bgr = cv2.imread(str(path))
    f = sources.make_frame("bgr8", bgr[..., ::-1].copy())
    want = runner.expected(f, cfg)
    content = slice(11, 53)  # 640x427 -> 64x43 centred: rows 10..52
    assert abs(float(t[0, content].mean()) - float(want[0, content].mean())) < 2.0 / 255 / 0.5
    assert cv2.imread(str(prev)).shape == (64, 64, 3)


CONV_CASES = [dict(kernel="gaussian", size=5, sigma=1.2, border="reflect101"),
              dict(kernel="sobel_x", size=3, border="replicate"),
              dict(kernel="custom", size=3, weights=[0, -1, 0, -1, 5, -1, 0, -1, 0],
                   border="constant")]


@pytest.mark.parametrize("conv", CONV_CASES, ids=[c["kernel"] for c in CONV_CASES])
def test_conv_after_preprocessing(conv: dict) -> None:
    # The oracle applies conv2d with the conv2d engineer's oracle_conv.py; without it
    # (a branch without conv2d) these cases are skipped.
    oracle_conv = pytest.importorskip("vptools.oracle_conv")
    from vptools import tolerances

    if not hasattr(tolerances, "assert_close_conv"):
        pytest.skip("conv2d tolerances (tolerances.assert_close_conv) not in this branch")
    frame = photo_frame("yuyv", "chelsea.png", pad=2)
    cfg = dict(network_image_width=96, network_image_height=64, conv=conv)
    actual, _ = runner.run_frame(frame, cfg)
    tolerances.assert_close_conv(actual, runner.expected(frame, cfg), "float32",
                                 oracle_conv.kernel_l1(conv), f"conv {conv['kernel']}")


@pytest.mark.parametrize("encoding", ["bgr8", "yuyv", "mono16"])
def test_large_source_coordinates(encoding: str) -> None:
    # A 4000-pixel-wide frame (rocket.jpg upscaled): at coordinates near 4000 a float
    # coordinate is off by up to 2.4e-4 pixel; the weights must be the double fraction,
    # rounded once, as cv2.resize computes them (AxisMap).
    frame = photo_frame(encoding, "rocket.jpg", size=(4000, 2668), pad=4)
    for w, h, mode in [(333, 222, "letterbox"), (29, 31, "stretch"), (1001, 9, "center_crop")]:
        cfg = dict(network_image_width=w, network_image_height=h, resize_mode=mode,
                   image_mean=[0.485, 0.456, 0.406], image_stddev=[0.229, 0.224, 0.225])
        runner.check(frame, cfg, f"{encoding} 4000x2668 -> {w}x{h} {mode}")


CLI_ERRORS = [
    # (arguments after `run-file`, text the error must contain)
    (["--raw", "--encoding", "rgb9", "--width", "4", "--height", "2", "{raw24}"],
     "encoding `rgb9` is not supported; use one of: rgb8"),
    (["--raw", "--encoding", "rgb8", "--width", "4", "--height", "2", "--step", "11", "{raw24}"],
     "step 11 < width*3 (12) for encoding rgb8"),
    (["--raw", "--encoding", "rgb8", "--width", "4", "--height", "3", "{raw24}"],
     "data is 24 bytes but step*height = 36 for encoding rgb8"),
    (["--raw", "--encoding", "yuyv", "--width", "3", "--height", "4", "{raw24}"],
     "width 3 is odd; yuyv packs 2 pixels per 4 bytes"),
    (["--raw", "--encoding", "nv12", "--width", "4", "--height", "3", "{raw24}"],
     "width 4 x height 3: nv12 subsamples chroma 2x2"),
    (["--raw", "--encoding", "mono8", "--width", "0", "--height", "3", "{raw24}"],
     "width 0 x height 3: both must be at least 1"),
    (["--raw", "--encoding", "rgb8", "--width", "4", "--height", "2", "--set", "roi=[2,0,3,2]",
      "{raw24}"], "roi [x 2, y 0, width 3, height 2] is not inside the 4x2 image"),
    (["--raw", "--width", "4", "--height", "2", "{raw24}"],
     "--raw needs --encoding, --width and --height"),
    (["--set", "resize_mode=fit", "{png}"], "parameter `resize_mode`: unknown variant `fit`"),
    (["--set", "output_channels=2", "{png}"], "output_channels must be in [1, 3] with step 2 (got 2)"),
    (["--set", "image_stddev=[0.5, 0]", "{png}"], "parameter `image_stddev`: [0.5, 0.0] is invalid"),
    (["--set", "pad_value", "{png}"], "--set \"pad_value\": write KEY=VALUE"),
    (["{missing}"], "opening"),
    (["{raw24}"], "decoding"),
]


@pytest.mark.parametrize("args,message", CLI_ERRORS, ids=[m[:40] for _, m in CLI_ERRORS])
def test_cli_errors_are_clear_and_never_panics(tmp: Path, args: list, message: str) -> None:
    raw = tmp / "raw24.bin"
    raw.write_bytes(bytes(range(24)))
    png = tmp / "tiny.png"
    cv2.imwrite(str(png), np.zeros((2, 4, 3), np.uint8))
    subst = {"{raw24}": str(raw), "{png}": str(png), "{missing}": str(tmp / "nope.png")}
    argv = ["run-file", *[subst.get(a, a) for a in args], "-o", str(tmp / "o.npy")]
    p = runner.cli(*argv, check=False)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "panicked" not in p.stderr and "backtrace" not in p.stderr.lower(), p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, p.stderr
    assert last.count(message) == 1, f"message repeated: {last}"


def test_unknown_parameters_are_warned_about_and_ignored(tmp: Path) -> None:
    """As the node does with its parameters: a name vision_preproc does not have (a typo,
    a key for another node in a shared file) is a warning naming the closest parameter;
    the run goes on with the rest, whose values stay strictly checked."""
    png = tmp / "tiny.png"
    cv2.imwrite(str(png), np.zeros((2, 4, 3), np.uint8))
    shared = tmp / "shared.yaml"
    shared.write_text("/**:\n  ros__parameters:\n    use_sim_time: true\n    robot_frame: base\n"
                      "other_node:\n  ros__parameters:\n    exposure: 3\n"
                      "vision_preproc:\n  ros__parameters:\n    network_image_width: 8\n    conv.kernel: box\n")
    p = runner.cli("run-file", "--config", str(shared), "--set", "network_width=3", "--set", "network_image_height=6",
                   str(png), "-o", str(tmp / "o.npy"))
    warnings = [line for line in p.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: {shared}: `robot_frame` is not a parameter of vision_preproc (ignored)",
        "warning: --set: `network_width` is not a parameter of vision_preproc (ignored); did you mean "
        "`network_image_width`?",
    ], p.stderr
    assert np.load(tmp / "o.npy").shape == (1, 3, 6, 8)
    p = runner.cli("check-config", str(shared), check=False)
    assert p.returncode == 0 and "robot_frame" in p.stderr and "conv:\n  kernel: box" in p.stdout, p.stderr


def test_bench_cpu_reports_percentiles(tmp: Path) -> None:
    # The benchmark command itself (docs/BENCHMARKS.md): a few frames, JSON out.
    frame = photo_frame("yuyv", "chelsea.png")
    raw = tmp / "bench.raw"
    raw.write_bytes(frame.data)
    p = runner.cli("bench-cpu", *frame.cli_args(), raw, "--frames", "5", "--warmup", "1",
                   "--json", "--set", "network_image_width=64", "--no-avx2", hooks=True)
    # The product CLI has no benchmark (cargo feature `bench`): clap names no such command.
    product = runner.cli("bench-cpu", check=False)
    assert product.returncode != 0 and "unrecognized subcommand 'bench-cpu'" in product.stderr, product.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["frames"] == 5 and len(r["samples_ms"]) == 5 and r["simd"] == "Baseline"
    s = sorted(r["samples_ms"])
    assert r["p50_ms"] == pytest.approx(s[2], abs=1e-3) and r["p99_ms"] == pytest.approx(s[4], abs=1e-3)
    assert 0 < r["min_ms"] <= r["p50_ms"] <= r["p99_ms"]
