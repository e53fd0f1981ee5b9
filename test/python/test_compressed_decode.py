"""The compressed-image decoder (src/compressed.rs) against OpenCV's decode.

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
import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from vptools import DATA, HOOKS_BIN_DIR
from vptools.tolerances import JPEG_DECODE

try:
    from PIL import Image
except ImportError:  # Pillow is optional: its cases are skipped without it.
    Image = None

#: `decode-file` is in the CLI built with the `bench` feature (scripts/test_hooks_build.sh).
BIN = HOOKS_BIN_DIR / "vision_preproc"
COLOUR = ["chelsea.png", "astronaut.png", "rocket.jpg"]
SAMPLING = {
    "420": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
    "422": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
    "444": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
}
QUALITIES = [50, 80, 95]


def photo(name: str, grey: bool = False) -> np.ndarray:
    img = cv2.imread(str(DATA / name), cv2.IMREAD_GRAYSCALE if grey else cv2.IMREAD_COLOR)
    assert img is not None, name
    return img


def cv_jpeg(bgr_or_grey: np.ndarray, quality: int, sampling: str, progressive: bool) -> bytes:
    params = [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)]
    if bgr_or_grey.ndim == 3:
        params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, SAMPLING[sampling]]
    ok, buf = cv2.imencode(".jpg", bgr_or_grey, params)
    assert ok
    return buf.tobytes()


def pil_jpeg(name: str, quality: int, subsampling: int, progressive: bool, mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.open(DATA / name).convert(mode).save(
        out, "JPEG", quality=quality, subsampling=subsampling, progressive=progressive)
    return out.getvalue()


def without_huffman_tables(jpeg: bytes) -> bytes:
    """The JPEG without its DHT segments (before the first scan), as MJPEG cameras send."""
    out, pos = bytearray(jpeg[:2]), 2
    while jpeg[pos + 1] != 0xDA:
        length = int.from_bytes(jpeg[pos + 2:pos + 4], "big")
        if jpeg[pos + 1] != 0xC4:
            out += jpeg[pos:pos + 2 + length]
        pos += 2 + length
    assert len(out) < pos, "no DHT segment removed"
    return bytes(out + jpeg[pos:])


def reference(payload: bytes) -> np.ndarray:
    """OpenCV's decode, as RGB (colour) or 2-D (grey), 16-bit kept."""
    img = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_UNCHANGED)
    assert img is not None
    if img.ndim == 3:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2RGBA if img.shape[2] == 4 else cv2.COLOR_BGR2RGB)
    return img


def run_decoder(binary: Path, tmp: Path, fmt: str, payload: bytes) -> tuple[int, dict, bytes]:
    src, dst = tmp / "in.bin", tmp / "out.raw"
    src.write_bytes(payload)
    dst.unlink(missing_ok=True)
    proc = subprocess.run([str(binary), "decode-file", "--format", fmt, str(src), str(dst)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 2), f"decode-file crashed ({proc.returncode}): {proc.stderr}"
    head = json.loads(proc.stdout.strip().splitlines()[-1])
    return proc.returncode, head, dst.read_bytes() if proc.returncode == 0 else b""


CHANNELS = {"rgb8": (3, np.uint8), "rgba8": (4, np.uint8), "mono8": (1, np.uint8),
            "mono16": (1, "<u2"), "rgb16": (3, "<u2")}


def decoded(binary: Path, tmp: Path, fmt: str, payload: bytes) -> tuple[str, np.ndarray]:
    rc, head, raw = run_decoder(binary, tmp, fmt, payload)
    assert rc == 0, f"{fmt}: {head}"
    channels, dtype = CHANNELS[head["encoding"]]
    arr = np.frombuffer(raw, dtype).reshape(head["height"], head["width"], channels)
    assert head["step"] == head["width"] * channels * arr.itemsize
    return head["encoding"], arr[..., 0] if channels == 1 else arr


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


def with_declared_size(payload: bytes, width: int, height: int) -> bytes:
    b = bytearray(payload)
    if b.startswith(b"\x89PNG"):
        b[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    else:
        sof = b.find(b"\xff\xc0")
        assert sof > 0
        b[sof + 5:sof + 9] = min(height, 65535).to_bytes(2, "big") + min(width, 65535).to_bytes(2, "big")
    return bytes(b)


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
