"""Tolerances of every numeric comparison, read from test/tolerances.json (the one place
they are named, shared with the Rust tests)."""

import json
from pathlib import Path

import numpy as np

_T = json.loads((Path(__file__).resolve().parents[1] / "tolerances.json").read_text())

#: float32 outputs from 8-bit inputs: absolute error on normalized values.
FLOAT32_ABS: float = _T["float32_abs"]
#: float16 outputs: one half-precision rounding (2^-10 relative) plus FLOAT16_ABS.
FLOAT16_REL: float = _T["float16_rel"]
FLOAT16_ABS: float = _T["float16_abs"]
#: Preview images (8-bit, de-normalized and rounded): absolute error in levels.
PREVIEW_U8_ABS: int = _T["preview_u8_abs"]


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
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert np.isfinite(actual).all(), f"{what}: non-finite values at {np.argwhere(~np.isfinite(actual))[:5].tolist()}"
    if dtype == "float32":
        tol = np.full(expected.shape, FLOAT32_ABS)
    elif dtype == "float16":
        tol = FLOAT16_REL * np.abs(expected) + FLOAT16_ABS
    else:
        raise ValueError(dtype)
    diff = np.abs(actual - expected)
    bad = diff > tol
    if bad.any():
        i = np.unravel_index(np.argmax(diff - tol), diff.shape)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {diff.size} elements out of tolerance ({dtype}); "
            f"max diff {diff.max():.3g} at {tuple(int(v) for v in i)}: "
            f"actual {actual[i]!r} expected {expected[i]!r} tol {tol[i]:.3g}"
        )
