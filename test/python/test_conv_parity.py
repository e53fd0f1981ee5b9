"""Parity of the CPU conv2d with OpenCV (docs/SPEC_conv2d.md).

The Rust side is `vision_preproc conv-file` (the CPU backend's conv2d alone on float32
(C, H, W) planes); the reference is `oracle_conv.apply_conv` (OpenCV in float64). Inputs:
crops of the photographs in test/data/, normalized as the pipeline does
((rgb / 255 - 0.5) / 0.5), plus random planes. Every kernel x border x size 1..15 (as
OpenCV takes them) on image sizes that are odd, 1xN, Nx1, 2x2 and smaller than the
kernel. Tolerance: `tolerances.conv_abs_tolerance` (float32_abs scaled by sum|w|).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest

from vptools import HOOKS_BIN_DIR
from vptools.oracle_conv import BORDERS, apply_conv, kernel_2d, kernel_l1, separable_factors
from vptools.tolerances import assert_close_conv, conv_abs_tolerance

ROOT = Path(__file__).resolve().parents[2]
#: `conv-file` is in the CLI built with the `bench` feature (scripts/test_hooks_build.sh).
BIN = HOOKS_BIN_DIR / "vision_preproc"
PHOTOS = ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "camera.png"]

SIZES = [1, 3, 5, 7, 9, 15]
# (kernel, sigma): gaussian and sharpen also with an explicit sigma (no fixed table).
KERNELS = [
    ("box", 0.0),
    ("gaussian", 0.0),
    ("gaussian", 1.3),
    ("sharpen", 0.0),
    ("sharpen", 0.8),
    ("sobel_x", 0.0),
    ("sobel_y", 0.0),
    ("laplacian", 0.0),
    ("custom", 0.0),
]
# (height, width): 1x1, 1xN, Nx1, 2x2, smaller than most kernels, odd, and a larger crop.
SHAPES = [(1, 1), (1, 23), (23, 1), (2, 2), (3, 3), (4, 5), (7, 7), (13, 29), (61, 47)]


@pytest.fixture(scope="session")
def binary() -> Path:
    if not BIN.exists():
        pytest.fail(f"{BIN} is missing: run scripts/test_hooks_build.sh (make test does)")
    return BIN


@pytest.fixture(scope="session")
def photos() -> list[np.ndarray]:
    out = []
    for name in PHOTOS:
        bgr = cv2.imread(str(ROOT / "test" / "data" / name), cv2.IMREAD_COLOR)
        assert bgr is not None, name
        out.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    return out


def planes_for(photos: list[np.ndarray], h: int, w: int, seed: int) -> np.ndarray:
    """(5, h, w) float32: the three normalized RGB planes of a crop of a photograph, a
    random plane in [-1, 1] (the normalized range) and one in [-2.5, 2.5] (ImageNet
    mean/std give values up to about 2.6)."""
    rng = np.random.default_rng(seed)
    photo = photos[seed % len(photos)]
    y = int(rng.integers(0, photo.shape[0] - h + 1))
    x = int(rng.integers(0, photo.shape[1] - w + 1))
    rgb = photo[y : y + h, x : x + w].astype(np.float64)
    norm = (rgb / 255.0 - 0.5) / 0.5
    planes = [norm[..., c] for c in range(3)]
    planes.append(rng.uniform(-1.0, 1.0, (h, w)))
    planes.append(rng.uniform(-2.5, 2.5, (h, w)))
    return np.stack(planes).astype(np.float32)


def conv_dict(kernel: str, size: int, sigma: float, border: str) -> dict:
    weights: list[float] = []
    if kernel == "custom":
        # Fixed pseudo-random weights, asymmetric, so a flip or transpose shows.
        weights = np.random.default_rng(size).uniform(-1.0, 1.0, size * size).tolist()
    return {"kernel": kernel, "size": size, "sigma": sigma, "weights": weights, "border": border}


def sets(conv: dict) -> list[str]:
    args = []
    for key in ("kernel", "size", "sigma", "border"):
        args += ["--set", f"conv.{key}={conv[key]}"]
    if conv["kernel"] == "custom":
        args += ["--set", "conv.weights=[" + ", ".join(repr(w) for w in conv["weights"]) + "]"]
    return args


def run_conv(binary: Path, tmp: Path, inputs: list[np.ndarray], conv: dict, *extra: str) -> list[np.ndarray]:
    """conv-file on several (C, H, W) arrays in one process."""
    args = []
    for i, planes in enumerate(inputs):
        np.save(tmp / f"in{i}.npy", planes)
        args += [str(tmp / f"in{i}.npy"), "-o", str(tmp / f"out{i}.npy")]
    proc = subprocess.run(
        [str(binary), "conv-file", *args, *sets(conv), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"conv-file {conv}: {proc.stderr}"
    outs = [np.load(tmp / f"out{i}.npy") for i in range(len(inputs))]
    for planes, out in zip(inputs, outs):
        assert out.dtype == np.float32 and out.shape == planes.shape, (out.dtype, out.shape)
    return outs


def f32_exact(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    expected = np.asarray(expected, dtype=np.float64).astype(np.float32)
    assert actual.shape == expected.shape, f"{what}: {actual.shape} != {expected.shape}"
    bad = np.argwhere(actual != expected)
    assert bad.size == 0, (
        f"{what}: {len(bad)} weights differ, first at {bad[0].tolist()}: "
        f"{actual[tuple(bad[0])]!r} != OpenCV's {expected[tuple(bad[0])]!r}"
    )


@pytest.mark.parametrize("border", list(BORDERS))
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kernel,sigma", KERNELS, ids=[f"{k}-s{s}" for k, s in KERNELS])
def test_conv_matches_opencv(binary, photos, tmp_path, kernel, sigma, size, border):
    conv = conv_dict(kernel, size, sigma, border)
    l1 = kernel_l1(conv)
    inputs = [planes_for(photos, h, w, seed=i * 31 + size) for i, (h, w) in enumerate(SHAPES)]
    extra = ["--dump-kernel", str(tmp_path / "k.npy")]
    factors = separable_factors(conv)
    if factors is not None:
        extra += ["--dump-factors", str(tmp_path / "f.npy")]
    outs = run_conv(binary, tmp_path, inputs, conv, *extra)
    for planes, got in zip(inputs, outs):
        h, w = planes.shape[1:]
        want = apply_conv(planes, conv)
        assert_close_conv(got, want, "float32", l1, f"{kernel} sigma {sigma} size {size} {border} on {h}x{w}")
    # The weights are OpenCV's, rounded to f32 once: exactly equal.
    f32_exact(np.load(tmp_path / "k.npy"), kernel_2d(conv), f"{kernel} {size} weights")
    if factors is not None:
        f32_exact(np.load(tmp_path / "f.npy"), np.stack(factors), f"{kernel} {size} factors")


@pytest.mark.parametrize("size", [1, 3, 5, 7, 9, 11, 13, 15])
def test_gaussian_weights_equal_opencv_for_any_sigma(binary, tmp_path, size):
    """cv2.getGaussianKernel: fixed tables for sigma <= 0 and size <= 9, the formula
    otherwise; our f64 exp may differ from OpenCV's soft-float exp in the last bit, the
    f32 weights may not."""
    one = np.zeros((1, 1, 1), dtype=np.float32)
    for sigma in [-1.0, 0.0, 0.1, 0.35, 0.8, 1.0, 1.37, 2.0, 3.3, 7.5, 40.0]:
        conv = conv_dict("gaussian", size, sigma, "replicate")
        run_conv(binary, tmp_path, [one], conv, "--dump-factors", str(tmp_path / "f.npy"))
        f32_exact(np.load(tmp_path / "f.npy"), np.stack(separable_factors(conv)), f"size {size} sigma {sigma}")


def _border_model(p: np.ndarray, k: np.ndarray, border: str) -> np.ndarray:
    """Correlation with NumPy's padding, independent of OpenCV: 'edge' = replicate,
    'constant' = 0, 'reflect' = reflect101 (repeated for pads wider than the image;
    a 1-pixel axis repeats the pixel)."""
    r = k.shape[0] // 2
    mode = {"replicate": "edge", "constant": "constant", "reflect101": "reflect"}[border]
    padded = np.pad(p, r, mode=mode)
    out = np.zeros(p.shape)
    for ky in range(k.shape[0]):
        for kx in range(k.shape[1]):
            out += k[ky, kx] * padded[ky : ky + p.shape[0], kx : kx + p.shape[1]]
    return out


@pytest.mark.parametrize("border", list(BORDERS))
def test_oracle_borders_and_sharpen_mean_what_the_spec_says(border):
    """The oracle (OpenCV) against a plain NumPy model, on the degenerate sizes: kernels
    wider than the image reflect repeatedly, reflect101 on a 1-pixel axis repeats the pixel
    (OpenCV's borderInterpolate returns 0 for len 1). And sharpen = 2x - GaussianBlur(x)."""
    rng = np.random.default_rng(5)
    for h, w in [(1, 1), (1, 6), (6, 1), (2, 2), (3, 3), (4, 9)]:
        planes = rng.uniform(-1, 1, (1, h, w))
        for kernel, size in [("gaussian", 15), ("custom", 15), ("custom", 5), ("sobel_x", 7), ("laplacian", 9)]:
            conv = conv_dict(kernel, size, 0.0, border)
            want = _border_model(planes[0], kernel_2d(conv), border)
            assert_close_conv(apply_conv(planes, conv)[0], want, "float32", kernel_l1(conv), f"{kernel} {size} {h}x{w}")
    x = rng.uniform(-1, 1, (1, 17, 12))
    for size, sigma in [(3, 0.0), (7, 1.6)]:
        blur = cv2.GaussianBlur(x[0], (size, size), sigma, borderType=BORDERS[border])
        conv = conv_dict("sharpen", size, sigma, border)
        assert_close_conv(apply_conv(x, conv)[0], 2 * x[0] - blur, "float32", kernel_l1(conv), "sharpen")
        conv = conv_dict("gaussian", size, sigma, border)
        assert_close_conv(apply_conv(x, conv)[0], blur, "float32", 1.0, "gaussian")


def test_conv_tolerance_scales_with_the_kernel_gain():
    # tolerances.json: conv_float32_abs_per_l1 = 1e-4; sobel 7 has sum|w| = 20 * 64 = 1280.
    assert kernel_l1(conv_dict("sobel_x", 7, 0.0, "replicate")) == 1280.0
    assert conv_abs_tolerance(1280.0) == pytest.approx(0.128)
    assert conv_abs_tolerance(kernel_l1(conv_dict("gaussian", 5, 0.0, "replicate"))) == pytest.approx(1e-4)


@pytest.mark.parametrize(
    "set_args,message",
    [
        (["conv.kernel=gaussian", "conv.size=4"], "conv.size must be in [1, 15] with step 2 (got 4)"),
        (["conv.kernel=box", "conv.size=17"], "conv.size must be in [1, 15] with step 2 (got 17)"),
        (
            ["conv.kernel=custom", "conv.size=3", "conv.weights=[1, 2]"],
            "parameter `conv.weights`: 2 values is invalid; conv.kernel custom with conv.size 3 needs "
            "conv.size*conv.size = 9 values, row-major",
        ),
        (["conv.kernel=gaussian", "conv.sigma=.nan"], "parameter `conv.sigma`: NaN is invalid; use a finite sigma"),
        (["conv.kernel=ridge"], "parameter `conv.kernel`: unknown variant `ridge`"),
    ],
)
def test_conv_file_reports_bad_parameters(binary, tmp_path, set_args, message):
    np.save(tmp_path / "in.npy", np.zeros((1, 2, 2), dtype=np.float32))
    args = [a for s in set_args for a in ("--set", s)]
    proc = subprocess.run(
        [str(binary), "conv-file", str(tmp_path / "in.npy"), "-o", str(tmp_path / "o.npy"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert not (tmp_path / "o.npy").exists()
