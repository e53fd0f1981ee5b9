"""Fixtures of the ROS tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vptools.rosharness import ROOT


def seed_cargo_cache() -> None:
    """Before the first colcon build of a checkout: start colcon's cargo target directory
    (build/vision_preproc, what colcon-cargo passes as --target-dir) as a copy of
    target/release, which `make test` has just built, mtimes kept. Cargo then reuses the
    dependencies that do not depend on the environment (about 250 crates: 7 of the 10
    minutes of a first colcon build on 2 cores) and rebuilds r2r and this crate, whose
    build scripts watch AMENT_PREFIX_PATH / CMAKE_PREFIX_PATH, which colcon changes (the
    interface package of install/ in front), exactly as from scratch: r2r's bindings go
    to a new directory named by the hash of those variables, so r2r's stale-cache trap
    (shared notes) cannot fire. The colcon command itself is unchanged."""
    dest = ROOT / "build" / "vision_preproc" / "release"
    src = ROOT / "target" / "release"
    if dest.exists() or not (src / "deps").is_dir():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name("release.seeding")
    subprocess.run(["rm", "-rf", str(tmp)], check=True)
    subprocess.run(["cp", "-a", str(src), str(tmp)], check=True, timeout=600)
    tmp.rename(dest)


@pytest.fixture(scope="session")
def colcon_install() -> Path:
    """Build the workspace with colcon exactly as the README says (both packages; the
    nested interface package named with --base-paths), into build/ and install/ at the
    repository root, and return the install base. Incremental after the first build;
    the first starts from a copy of target/release's compiled dependencies
    (seed_cargo_cache)."""
    seed_cargo_cache()
    cmd = ["colcon", "build", "--base-paths", ".", "msgs", "--cargo-args", "--release"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return ROOT / "install"
