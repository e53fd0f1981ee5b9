"""Independent oracle of conv2d (docs/SPEC_conv2d.md): OpenCV and NumPy only, nothing from
vision_preproc. Each kernel is applied by the OpenCV function whose semantics conv2d
promises, in float64:

    box        cv2.boxFilter(normalize=True)
    gaussian   cv2.sepFilter2D with cv2.getGaussianKernel(size, sigma) in both axes
    sharpen    cv2.filter2D with 2*delta - outer(g, g), g = cv2.getGaussianKernel(size, sigma)
    sobel_x/y  cv2.Sobel(dx, dy, ksize=size)   (kernels: cv2.getDerivKernels)
    laplacian  cv2.Laplacian(ksize=size)
    custom     cv2.filter2D (correlation: no flip)

`conv` is a dict with the keys of the `conv.*` parameters: kernel, size, sigma, weights,
border (missing keys take the node's defaults).
"""

from __future__ import annotations

import cv2
import numpy as np

BORDERS = {
    "replicate": cv2.BORDER_REPLICATE,
    "constant": cv2.BORDER_CONSTANT,
    "reflect101": cv2.BORDER_REFLECT_101,
}
KERNELS = ("none", "box", "gaussian", "sharpen", "sobel_x", "sobel_y", "laplacian", "custom")
DEFAULTS = {"kernel": "none", "size": 3, "sigma": 0.0, "weights": [], "border": "replicate"}


def _params(conv: dict) -> tuple[str, int, float, list, int]:
    c = {**DEFAULTS, **conv}
    if c["kernel"] not in KERNELS:
        raise ValueError(f"conv.kernel {c['kernel']!r}")
    return c["kernel"], int(c["size"]), float(c["sigma"]), list(c["weights"]), BORDERS[c["border"]]


def _gaussian(size: int, sigma: float) -> np.ndarray:
    return cv2.getGaussianKernel(size, sigma, ktype=cv2.CV_64F).ravel()


def _impulse_response(fn, n: int) -> np.ndarray:
    """The correlation kernel an OpenCV filter applies, read off its response to an
    impulse (the response of a correlation to an impulse is the kernel flipped)."""
    img = np.zeros((2 * n + 1, 2 * n + 1))
    img[n, n] = 1.0
    out = fn(img)
    r = n // 2
    return out[n - r : n + r + 1, n - r : n + r + 1][::-1, ::-1].copy()


def kernel_2d(conv: dict) -> np.ndarray:
    """The 2-D correlation kernel (float64, odd side) that `apply_conv` applies: from
    OpenCV's kernel getters, or for laplacian from cv2.Laplacian's impulse response.
    sobel and laplacian with size 1 are 3x3 (what OpenCV applies for ksize=1)."""
    kernel, size, sigma, weights, _ = _params(conv)
    if kernel == "none":
        return np.ones((1, 1))
    if kernel == "box":
        return np.full((size, size), 1.0 / (size * size))
    if kernel == "gaussian":
        g = _gaussian(size, sigma)
        return np.outer(g, g)
    if kernel == "sharpen":
        g = _gaussian(size, sigma)
        k = -np.outer(g, g)
        k[size // 2, size // 2] += 2.0
        return k
    if kernel in ("sobel_x", "sobel_y"):
        dx, dy = (1, 0) if kernel == "sobel_x" else (0, 1)
        kx, ky = cv2.getDerivKernels(dx, dy, size, normalize=False, ktype=cv2.CV_64F)
        kx, ky = kx.ravel(), ky.ravel()
        n = max(len(kx), len(ky))  # ksize=1: one factor has 3 taps, the other 1
        kx = np.pad(kx, (n - len(kx)) // 2)
        ky = np.pad(ky, (n - len(ky)) // 2)
        return np.outer(ky, kx)
    if kernel == "laplacian":
        n = max(size, 3)
        return _impulse_response(
            lambda img: cv2.Laplacian(img, cv2.CV_64F, ksize=size, borderType=cv2.BORDER_CONSTANT), n
        )
    if len(weights) != size * size:
        raise ValueError(f"custom needs {size * size} weights, got {len(weights)}")
    return np.asarray(weights, dtype=np.float64).reshape(size, size)


def separable_factors(conv: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(kx, ky) float64 for the kernels conv2d applies in two 1-D passes, else None."""
    kernel, size, sigma, _, _ = _params(conv)
    if kernel == "box":
        return np.full(size, 1.0 / size), np.full(size, 1.0 / size)
    if kernel == "gaussian":
        g = _gaussian(size, sigma)
        return g, g.copy()
    if kernel in ("sobel_x", "sobel_y"):
        k = kernel_2d(conv)
        n = k.shape[0]
        dx, dy = (1, 0) if kernel == "sobel_x" else (0, 1)
        kx, ky = cv2.getDerivKernels(dx, dy, size, normalize=False, ktype=cv2.CV_64F)
        kx, ky = kx.ravel(), ky.ravel()
        return np.pad(kx, (n - len(kx)) // 2), np.pad(ky, (n - len(ky)) // 2)
    return None


def kernel_l1(conv: dict) -> float:
    """sum(|w|) of the 2-D kernel: the conv tolerance scales with it (tolerances.py)."""
    return float(np.abs(kernel_2d(conv)).sum())


def _apply_plane(p: np.ndarray, conv: dict) -> np.ndarray:
    kernel, size, sigma, weights, border = _params(conv)
    if kernel == "none":
        return p.copy()
    if kernel == "box":
        return cv2.boxFilter(p, cv2.CV_64F, (size, size), normalize=True, borderType=border)
    if kernel == "gaussian":
        g = _gaussian(size, sigma)
        return cv2.sepFilter2D(p, cv2.CV_64F, g, g, borderType=border)
    if kernel in ("sobel_x", "sobel_y"):
        dx, dy = (1, 0) if kernel == "sobel_x" else (0, 1)
        return cv2.Sobel(p, cv2.CV_64F, dx, dy, ksize=size, borderType=border)
    if kernel == "laplacian":
        return cv2.Laplacian(p, cv2.CV_64F, ksize=size, borderType=border)
    # sharpen, custom: cv2.filter2D (correlation, anchor at the centre).
    return cv2.filter2D(p, cv2.CV_64F, kernel_2d(conv), borderType=border)


def apply_conv(planes_chw: np.ndarray, conv: dict) -> np.ndarray:
    """conv2d of each plane of `planes_chw` ((C, H, W), float32 or float64), as float64."""
    planes = np.asarray(planes_chw, dtype=np.float64)
    if planes.ndim != 3:
        raise ValueError(f"planes_chw must be (C, H, W), got shape {planes.shape}")
    return np.stack([_apply_plane(np.ascontiguousarray(p), conv) for p in planes])
