"""Tolerances of every numeric comparison, read from test/tolerances.json (the one place
they are named, shared with the Rust tests)."""

import json

import numpy as np

from vptools import ROOT

_T = json.loads((ROOT / "test" / "tolerances.json").read_text())

#: float32 outputs from 8-bit inputs: absolute error on normalized values.
FLOAT32_ABS: float = _T["float32_abs"]
#: float16 outputs: one half-precision rounding (2^-10 relative) plus FLOAT16_ABS.
FLOAT16_REL: float = _T["float16_rel"]
FLOAT16_ABS: float = _T["float16_abs"]
#: Preview images (8-bit, de-normalized and rounded): absolute error in levels.
PREVIEW_U8_ABS: int = _T["preview_u8_abs"]
#: FrameTiming.age_us against a /clock that stands still: microseconds.
AGE_US_ABS: float = _T["age_us_abs"]
#: A consumer's camera stamp -> acquired p50 as the node publishes it against its own.
CONSUMER_REPORT_REL: float = _T["consumer_report_rel"]
#: Our JPEG decode (zune-jpeg) against OpenCV's (libjpeg-turbo), 8-bit levels, per class
#: (`colour_420`, `colour_422`, `colour_444`, `grey`): {"max_abs", "share_over_1"}.
JPEG_DECODE: dict[str, dict[str, float]] = _T["jpeg_decode"]
#: nvJPEG's decode (the CUDA backend) against our CPU decoder, the same classes and keys.
JPEG_GPU_DECODE: dict[str, dict[str, float]] = _T["jpeg_gpu_decode"]

#: The NumPy type of each output dtype (`output_dtype`; little-endian, as messages carry it).
NUMPY_DTYPE = {"float32": "<f4", "float16": "<f2"}


def tensor_array(msg) -> np.ndarray:
    """A Tensor's or TensorBatch's values as a NumPy array of its shape: `msg.data`
    (bytes, an array or a NumPy array, from rclpy or rosbags), `msg.dtype`, `msg.shape`."""
    data = msg.data.tobytes() if hasattr(msg.data, "tobytes") else bytes(msg.data)
    return np.frombuffer(data, NUMPY_DTYPE[msg.dtype]).reshape(tuple(int(x) for x in msg.shape))


def assert_preview_close(actual: np.ndarray, expected: np.ndarray, what: str = "") -> None:
    """Assert an 8-bit preview image equals `expected` (rounded 8-bit values) within
    PREVIEW_U8_ABS levels."""
    actual = np.asarray(actual, dtype=np.int64)
    expected = np.asarray(expected, dtype=np.int64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    diff = np.abs(actual - expected)
    if (diff > PREVIEW_U8_ABS).any():
        i = np.unravel_index(np.argmax(diff), diff.shape)
        raise AssertionError(
            f"{what}: {int((diff > PREVIEW_U8_ABS).sum())} of {diff.size} pixels differ by more "
            f"than {PREVIEW_U8_ABS}; max {diff.max()} at {tuple(int(v) for v in i)}: "
            f"actual {actual[i]} expected {expected[i]}"
        )


def assert_close(actual: np.ndarray, expected: np.ndarray, dtype: str, what: str = "") -> None:
    """Assert `actual` (the tensor under test) equals `expected` (float64 or float32
    reference, before any float16 rounding) within the named tolerance for `dtype`.
    The failure message gives the max difference, its index and both values."""
    expected = np.asarray(expected, dtype=np.float64)
    if dtype == "float32":
        tol = np.full(expected.shape, FLOAT32_ABS)
    elif dtype == "float16":
        tol = FLOAT16_REL * np.abs(expected) + FLOAT16_ABS
    else:
        raise ValueError(dtype)
    _check(actual, expected, tol, what, dtype)


def _check(actual, expected: np.ndarray, tol: np.ndarray, what: str, label: str) -> None:
    """Fail with the count, the worst element, its index and both values when any
    |actual - expected| exceeds `tol` (elementwise), or on non-finite values."""
    actual = np.asarray(actual, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert np.isfinite(actual).all(), f"{what}: non-finite values at {np.argwhere(~np.isfinite(actual))[:5].tolist()}"
    diff = np.abs(actual - expected)
    bad = diff > tol
    if bad.any():
        i = np.unravel_index(np.argmax(diff - tol), diff.shape)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {diff.size} elements out of tolerance ({label}); "
            f"max diff {diff.max():.3g} at {tuple(int(v) for v in i)}: "
            f"actual {actual[i]!r} expected {expected[i]!r} tol {tol[i]:.3g}"
        )


#: conv2d outputs: absolute tolerance per unit of the kernel's L1 norm sum(|w|). A
#: correlation multiplies an input error by up to sum(|w|) and its f32 rounding grows
#: with it, so the float32 rule (FLOAT32_ABS on values of gain 1) is scaled by the gain:
#: box and gaussian keep 1e-4, sobel 7 (sum 1280) gets 0.128.
CONV_FLOAT32_ABS_PER_L1: float = _T["conv_float32_abs_per_l1"]


def conv_abs_tolerance(kernel_l1: float) -> float:
    """Absolute tolerance on conv2d outputs of a kernel with sum(|w|) = `kernel_l1`."""
    return CONV_FLOAT32_ABS_PER_L1 * max(1.0, kernel_l1)


def assert_close_conv(
    actual: np.ndarray, expected: np.ndarray, dtype: str, kernel_l1: float, what: str = ""
) -> None:
    """`assert_close` for tensors after conv2d: the absolute part of the tolerance is
    `conv_abs_tolerance(kernel_l1)` (float16 adds FLOAT16_REL * |expected| on top)."""
    expected = np.asarray(expected, dtype=np.float64)
    tol = np.full(expected.shape, conv_abs_tolerance(kernel_l1))
    if dtype == "float16":
        tol += FLOAT16_REL * np.abs(expected)
    elif dtype != "float32":
        raise ValueError(dtype)
    _check(actual, expected, tol, what, f"{dtype}, conv sum|w| {kernel_l1:.6g}")
