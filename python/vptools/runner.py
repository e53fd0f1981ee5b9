"""Run the `vision_preproc` CLI on a frame and compare its tensor with the oracle."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from vptools import BIN_DIR, HOOKS_BIN_DIR, oracle
from vptools.sources import Frame
from vptools.tolerances import assert_close

CLI = Path(os.environ.get("VISION_PREPROC_CLI", BIN_DIR / "vision_preproc"))


def cli(*args: str, check: bool = True, hooks: bool = False) -> subprocess.CompletedProcess:
    """`vision_preproc *args`: the product CLI, or with `hooks` the one built with the test
    hooks and the benchmarks (`bench-cpu`, `conv-file`: scripts/test_hooks_build.sh)."""
    cli = HOOKS_BIN_DIR / "vision_preproc" if hooks else CLI
    build = "scripts/test_hooks_build.sh" if hooks else "`cargo build --release --bins`"
    assert cli.exists(), f"{cli} is missing: build it with {build}"
    p = subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"vision_preproc {' '.join(map(str, args))} failed "
                             f"({p.returncode}):\n{p.stderr}")
    return p


def run_frame(frame: Frame, config: dict, preview: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """The tensor (and the preview image) `run-file --raw` writes for `frame`."""
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "frame.raw").write_bytes(frame.data)
        # The CPU backend explicitly (`auto` would take a GPU where there is one).
        (d / "config.yaml").write_text(json.dumps({"backend": "cpu", **config}))  # JSON is YAML
        extra = ["--preview", d / "preview.png"] if preview else []
        cli("run-file", "--config", d / "config.yaml", *frame.cli_args(), d / "frame.raw",
            "-o", d / "out.npy", *extra)
        tensor = np.load(d / "out.npy")
        img = None
        if preview:
            import cv2

            img = cv2.imread(str(d / "preview.png"), cv2.IMREAD_UNCHANGED)
        return tensor, img


def expected(frame: Frame, config: dict) -> np.ndarray:
    return oracle.preprocess(frame.data, frame.encoding, frame.width, frame.height,
                             frame.step, frame.big_endian, config)


def check(frame: Frame, config: dict, what: str = "") -> np.ndarray:
    """Assert the CLI's tensor equals the oracle's within the named tolerance; return it."""
    actual, _ = run_frame(frame, config)
    want = expected(frame, config)
    dtype = config.get("output_dtype", "float32")
    assert actual.dtype == np.dtype(dtype), f"{what}: dtype {actual.dtype} != {dtype}"
    assert_close(actual, want, dtype, what or f"{frame.encoding} {config}")
    return actual
