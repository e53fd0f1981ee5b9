"""Fixtures of the ROS tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vptools.rosharness import ROOT


@pytest.fixture(scope="session")
def colcon_install() -> Path:
    """Build the workspace with colcon exactly as the README says (both packages; the
    nested interface package named with --base-paths), into build/ and install/ at the
    repository root, and return the install base. Incremental after the first build."""
    cmd = ["colcon", "build", "--base-paths", ".", "msgs", "--cargo-args", "--release"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return ROOT / "install"
