"""The compressed-image decoder (src/compressed/) against OpenCV's decode.

The Rust side is `vision_preproc decode-file` (`compressed::decode` alone: a payload in, raw
pixels and a JSON line out); the reference is `cv2.imdecode` (libjpeg-turbo, libpng),
converted to RGB. Payloads: the photographs of test/data/ encoded by OpenCV (JPEG quality
50/80/95, 4:2:0/4:2:2/4:4:4, baseline and progressive, grey; PNG 8-bit colour, RGBA, grey,
16-bit grey and colour) and by Pillow (JPEG, another libjpeg's encoder). PNG must be
bit-exact; JPEG within `tolerances.JPEG_DECODE` (measured: run this file as a script,
`python3 test/python/test_compressed_decode.py`, to print the figures per case). Damaged
payloads (truncated, flipped bytes, a declared 100000x100000, CMYK) must return their named
error (exit code 2 and the cause's `kind`), never crash.

Not covered: 12-bit JPEG (neither OpenCV's nor Pillow's encoder writes one; the Rust unit
tests patch the precision byte of a frame header instead), arithmetic-coded and lossless
JPEG (likewise).
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from vptools import DATA
from vptools.compressed import (BIN, SAMPLING, Image, cv_jpeg, decoded, photo, pil_jpeg, reference,
                                run_decoder, with_declared_size, without_huffman_tables)
from vptools.tolerances import JPEG_DECODE

COLOUR = ["chelsea.png", "astronaut.png", "rocket.jpg"]
QUALITIES = [50, 80, 95]

def jpeg_cases():
    """(id, tolerance class, format, payload) of every JPEG compared with OpenCV."""
    for name in COLOUR:
        bgr = photo(name)
        for q in QUALITIES:
            for s in SAMPLING:
                for prog in (False, True):
                    yield (f"cv-{name}-q{q}-{s}-{'prog' if prog else 'base'}", f"colour_{s}",
                           "bgr8; jpeg compressed bgr8", cv_jpeg(bgr, q, s, prog))
    # An MJPEG camera's frame (usb_cam's pass-through): no Huffman tables, the standard
    # ones implied (OpenCV's encoder writes exactly those unless told to optimize).
    yield ("cv-chelsea.png-q80-420-mjpeg-no-dht", "colour_420", "jpeg",
           without_huffman_tables(cv_jpeg(photo("chelsea.png"), 80, "420", False)))
    grey = photo("camera.png", grey=True)
    for q in QUALITIES:
        for prog in (False, True):
            yield (f"cv-camera-q{q}-grey-{'prog' if prog else 'base'}", "grey",
                   "mono8; jpeg compressed mono8", cv_jpeg(grey, q, "444", prog))
    if Image is not None:
        for sub, s in [(2, "420"), (1, "422"), (0, "444")]:
            for prog in (False, True):
                yield (f"pil-chelsea-q85-{s}-{'prog' if prog else 'base'}", f"colour_{s}", "jpeg",
                       pil_jpeg("chelsea.png", 85, sub, prog))
        yield "pil-camera-q85-grey", "grey", "jpeg", pil_jpeg("camera.png", 85, 0, False, "L")


def differences(ours: np.ndarray, ref: np.ndarray) -> tuple[int, float]:
    """Max absolute difference and the share of samples differing by more than 1."""
    diff = np.abs(ours.astype(np.int32) - ref.astype(np.int32))
    return int(diff.max()), float((diff > 1).mean())


@pytest.fixture(scope="session")
def binary() -> Path:
    if not BIN.exists():
        pytest.fail(f"{BIN} is missing: run scripts/test_hooks_build.sh (make test does)")
    return BIN


JPEG_CASES = list(jpeg_cases())


@pytest.mark.parametrize("case", JPEG_CASES, ids=[c[0] for c in JPEG_CASES])
def test_jpeg_matches_opencv_within_the_measured_tolerance(binary, tmp_path, case):
    name, cls, fmt, payload = case
    encoding, ours = decoded(binary, tmp_path, fmt, payload)
    ref = reference(payload)
    assert encoding == ("mono8" if cls == "grey" else "rgb8"), name
    assert ours.shape == ref.shape, f"{name}: {ours.shape} != {ref.shape}"
    max_abs, share = differences(ours, ref)
    tol = JPEG_DECODE[cls]
    assert max_abs <= tol["max_abs"] and share <= tol["share_over_1"], (
        f"{name}: max |ours - OpenCV| {max_abs} (tolerance {tol['max_abs']}), "
        f"{share:.4%} of samples differ by more than 1 (tolerance {tol['share_over_1']:.4%})")


def png_cases():
    """(id, format, payload, expected encoding) of PNGs, which must decode bit-exact."""
    bgr, grey = photo("chelsea.png"), photo("camera.png", grey=True)
    rng = np.random.default_rng(7)
    grey16 = (grey.astype(np.uint16) * 257 + rng.integers(0, 256, grey.shape)).astype(np.uint16)
    bgr16 = (bgr.astype(np.uint16) * 257 + rng.integers(0, 256, bgr.shape)).astype(np.uint16)
    bgra = cv2.cvtColor(bgr, cv2.COLOR_BGR2BGRA)
    bgra[..., 3] = rng.integers(0, 256, bgra.shape[:2])
    enc = lambda img: cv2.imencode(".png", img)[1].tobytes()  # noqa: E731
    yield "rgb8", "bgr8; png compressed bgr8", enc(bgr), "rgb8"
    yield "rgba8", "bgra8; png compressed bgra8", enc(bgra), "rgba8"
    yield "mono8", "mono8; png compressed mono8", enc(grey), "mono8"
    yield "mono16", "16UC1; png compressed", enc(grey16), "mono16"
    yield "mono16-named", "mono16; png compressed mono16", enc(grey16), "mono16"
    yield "rgb16", "bgr16; png compressed bgr16", enc(bgr16), "rgb16"
    yield "usb_cam-raw", "png", enc(bgr), "rgb8"
    if Image is not None:
        out = io.BytesIO()
        Image.open(DATA / "chelsea.png").convert("P").save(out, "PNG")
        yield "palette", "png", out.getvalue(), "rgb8"


PNG_CASES = list(png_cases())


@pytest.mark.parametrize("case", PNG_CASES, ids=[c[0] for c in PNG_CASES])
def test_png_is_bit_exact(binary, tmp_path, case):
    name, fmt, payload, want = case
    encoding, ours = decoded(binary, tmp_path, fmt, payload)
    ref = reference(payload)
    assert encoding == want, name
    assert ours.dtype == ref.dtype and ours.shape == ref.shape, f"{name}: {ours.shape} {ref.shape}"
    assert np.array_equal(ours, ref), f"{name}: max difference {np.abs(ours.astype(int) - ref).max()}"


def damaged_cases():
    """(id, format, payload, the accepted kinds)."""
    jpeg = cv_jpeg(photo("chelsea.png"), 80, "420", False)
    prog = cv_jpeg(photo("chelsea.png"), 80, "420", True)
    png = cv2.imencode(".png", photo("chelsea.png"))[1].tobytes()
    for label, data, fmt in [("jpeg", jpeg, "jpeg"), ("prog", prog, "jpeg"), ("png", png, "png")]:
        for frac in (0.0, 0.001, 0.01, 0.1, 0.5, 0.9, 0.999):
            cut = int(len(data) * frac)
            kinds = {"truncated"} if cut > 40 else {"truncated", "signature", "corrupt"}
            yield f"{label}-cut-{frac}", fmt, data[:cut], kinds
    yield "jpeg-100000x100000", "jpeg", with_declared_size(jpeg, 100000, 100000), {"too_large"}
    yield "png-100000x100000", "png", with_declared_size(png, 100000, 100000), {"too_large"}
    yield "png-0x300", "png", with_declared_size(png, 0, 300), {"zero_size"}
    yield "png-as-jpeg", "jpeg", png, {"signature"}
    yield "unknown-format", "16UC1; compressedDepth png", png, {"unknown_format"}
    if Image is not None:
        yield "cmyk", "jpeg", pil_jpeg("chelsea.png", 85, 0, False, "CMYK"), {"cmyk_jpeg"}


DAMAGED = list(damaged_cases())


@pytest.mark.parametrize("case", DAMAGED, ids=[c[0] for c in DAMAGED])
def test_damaged_payloads_return_their_named_error(binary, tmp_path, case):
    name, fmt, payload, kinds = case
    rc, head, _ = run_decoder(binary, tmp_path, fmt, payload)
    assert rc == 2 and head.get("error") in kinds, f"{name}: {head}"
    assert head["message"], name


@pytest.mark.parametrize("label", ["jpeg", "png"])
def test_flipped_bytes_decode_or_fail_by_name_never_crash(binary, tmp_path, label):
    if label == "jpeg":
        data, fmt = cv_jpeg(photo("chelsea.png"), 80, "420", True), "jpeg"
    else:
        data, fmt = cv2.imencode(".png", photo("chelsea.png"))[1].tobytes(), "png"
    rng = np.random.default_rng(3)
    outcomes = set()
    for trial in range(40):
        b = bytearray(data)
        for at in rng.integers(0, len(b), 1 + trial % 4):
            b[at] ^= int(rng.integers(1, 256))
        rc, head, _ = run_decoder(binary, tmp_path, fmt, bytes(b))
        outcomes.add("ok" if rc == 0 else head["error"])
    assert outcomes <= {"ok", "corrupt", "truncated", "signature", "too_large", "zero_size",
                        "jpeg_precision", "jpeg_process", "jpeg_components", "cmyk_jpeg"}, outcomes


def measure(binary: Path) -> None:
    """Print max |ours - OpenCV| and the share of samples off by more than 1, per JPEG case
    and per tolerance class (how test/tolerances.json's `jpeg_decode` was measured)."""
    import tempfile
    worst: dict[str, tuple[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cls, fmt, payload in JPEG_CASES:
            _, ours = decoded(binary, Path(tmp), fmt, payload)
            max_abs, share = differences(ours, reference(payload))
            print(f"{name:40s} {cls:12s} max_abs {max_abs:3d}  share>1 {share:.4%}")
            m, s = worst.get(cls, (0, 0.0))
            worst[cls] = (max(m, max_abs), max(s, share))
    for cls, (m, s) in sorted(worst.items()):
        print(f"worst {cls:12s} max_abs {m:3d}  share>1 {s:.4%}")


if __name__ == "__main__":
    measure(Path(sys.argv[1]) if len(sys.argv) > 1 else BIN)


def test_info_names_each_backends_decoder() -> None:
    """`vision_preproc info` (the product) says where each backend decodes compressed
    frames: the CPU backend with the CPU decoders; the CUDA backend with nvJPEG when its
    library loads here, else on the host (this machine has no libnvjpeg of its own)."""
    from vptools import ROOT
    out = subprocess.run([str(ROOT / "target" / "release" / "vision_preproc"), "info"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = next((x for x in out.stdout.splitlines() if x.startswith("compressed frames:")), "")
    assert "cpu backend: on the CPU (zune-jpeg for JPEG, png for PNG)" in line, out.stdout
    cuda = line.split("cuda backend: ", 1)[-1]
    assert cuda.startswith("nvJPEG ") or cuda.startswith("on the host (zune-jpeg"), line
