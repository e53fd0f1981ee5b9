"""Fixtures of the ROS tests."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from vptools.rosharness import ROOT

#: The colcon workspace of the tests (build/, install/, log/): under target/, so that it
#: never touches the build/ and install/ a user's own `colcon build` writes at the
#: repository root, and `make clean` / `cargo clean` remove it.
COLCON_WS = ROOT / "target" / "colcon"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "alone: runs with no other test beside it (scripts/test.sh runs these "
                                       "after the others, in one process: they load the machine on purpose)")


#: The files that take longest, first: pytest-xdist's `--dist loadfile` hands the files to
#: its workers in collection order, so the longest one collected last (test_transport.py,
#: alphabetically) ran alone at the end (the 3 workers: 100 s where the files' sum is
#: 218 s). Seconds measured on the 2-core machine, 2026-12-03: launch 56 on a fresh clone
#: (it built the colcon workspace, 41 s; since 2026-12-06 ~5 s: the interface package is not
#: built again), handoff 51 (with its 20-s slow consumer),
#: transport 50, node 36, batch 25; every other file under 18.
LONG_FILES_FIRST = ("test_launch.py", "test_handoff.py", "test_transport.py", "test_node.py", "test_batch.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FILES_FIRST)}
    # stable: each file's tests keep their order
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def colcon_build(*args: str) -> None:
    """`colcon build ARGS` from the repository root into COLCON_WS."""
    cmd = ["colcon", "--log-base", str(COLCON_WS / "log"), "build", "--build-base", str(COLCON_WS / "build"),
           "--install-base", str(COLCON_WS / "install"), "--event-handlers", "console_cohesion-", *args]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"


def seed_cargo_target() -> Path:
    """Make colcon's cargo target directory (COLCON_WS/build/vision_preproc, what
    colcon-cargo passes as --target-dir) a fresh copy of target/release, which `make test`
    has just built in the same environment (.ros/env.sh): cargo then finds every unit up
    to date, r2r and this crate included, and compiles nothing.

    Why the copy cannot hit r2r's stale-cache trap (README, "After changing a message"):
    r2r's build script keeps its generated bindings in OUT_DIR/<hash of AMENT_PREFIX_PATH,
    CMAKE_PREFIX_PATH, IDL_PACKAGE_FILTER, ...>/ with a `done` marker, and prints its
    `cfg` flags (the sim-time API among them) only when it generates them. Cargo reruns
    that script only when one of those variables changed since its last run. Here they
    are the ones target/release was built with, so the script does not rerun and cargo
    replays its recorded output, flags included. Should they differ (pytest started from
    another shell), the script reruns; the `done` markers are deleted from the copy
    (forget_cached_bindings), so it then generates the bindings again, flags included,
    instead of reusing a directory another environment left. target/ itself is never
    written to."""
    dest = COLCON_WS / "build" / "vision_preproc" / "release"
    src = ROOT / "target" / "release"
    tmp = dest.with_name("release.seeding")
    subprocess.run(["rm", "-rf", str(dest), str(tmp)], check=True, timeout=600)
    if (src / "deps").is_dir():
        tmp.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", str(src), str(tmp)], check=True, timeout=600)
        forget_cached_bindings(tmp)
        tmp.rename(dest)
    return dest


def forget_cached_bindings(release: Path) -> list[Path]:
    """Delete the `done` markers of the bindings r2r's crates cached in their OUT_DIRs
    under `release`: a rerun of their build scripts then generates the bindings (and
    r2r's cfg flags) instead of reusing them. Returns the markers deleted."""
    markers = sorted(release.glob("build/r2r*-*/out/*/done"))
    for m in markers:
        m.unlink()
    return markers


def r2r_runs_without_cfg_flags(release: Path) -> list[Path]:
    """The recorded outputs of r2r's build script under `release` that lack the cfg flags
    (what the stale-cache trap leaves: r2r then compiles without `get_time_source`)."""
    outputs = [p for p in release.glob("build/r2r-*/output")
               if "cargo:rerun-if-env-changed=IDL_PACKAGE_FILTER" in p.read_text()]
    return [p for p in outputs if "cargo:rustc-cfg=r2r__rosgraph_msgs__msg__Clock" not in p.read_text()]


@pytest.fixture
def run_dir():
    """A private XDG_RUNTIME_DIR for a node's pool socket (`<dir>/vision_preproc/*.sock`):
    short, because a socket's path must fit sockaddr_un's 108 bytes and pytest's tmp_path
    grows with its run counter (/tmp/pytest-of-root/pytest-60/popen-gw1/<test name>...);
    mode 0700 as the node requires; removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="vp-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def colcon_install() -> Path:
    """The colcon workspace, built once per test run: with pytest-xdist (scripts/test.sh)
    each worker that needs it runs this fixture, so the first one builds (under a lock on
    the workspace) and the others find its build of this run (PYTEST_XDIST_TESTRUNUID,
    the same in every worker of one run) and use it."""
    COLCON_WS.mkdir(parents=True, exist_ok=True)
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid {os.getpid()}"
    built = COLCON_WS / "built_by_run"
    with open(COLCON_WS / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built.exists() and built.read_text() == run:
            return COLCON_WS / "install"
        built.unlink(missing_ok=True)
        install = build_colcon_workspace()
        built.write_text(run)
        return install


#: colcon's own package selection for `--base-paths . msgs --packages-up-to vision_preproc`
#: (the packages and their order, as `colcon build` would take them; this colcon has no
#: `list` verb).
COLCON_SELECTION = """
import argparse, sys
from colcon_core.package_selection import add_arguments, get_packages
parser = argparse.ArgumentParser()
add_arguments(parser)
args = parser.parse_args(["--base-paths", ".", "msgs", "--packages-up-to", "vision_preproc"])
print(" ".join(d.descriptor.name for d in get_packages(args) if d.selected))
"""


def build_colcon_workspace() -> Path:
    """Build the workspace with colcon as the README says, into COLCON_WS, and return the
    install base. What the README's `colcon build --base-paths . msgs --cargo-args
    --release` does, in two steps:

    1. colcon's package selection of `--base-paths . msgs --packages-up-to vision_preproc`
       (colcon_core, as `colcon build` runs it, COLCON_SELECTION): colcon finds both
       packages from the README's base paths, vision_preproc depends on
       vision_preproc_msgs (up-to selects it) and the interface package comes first. The
       interface package itself is built with colcon from the same msgs/ by
       scripts/setup/setup.sh (into .ros/install, every test's environment); building it a
       second time here cost ~45 s of the 2-core machine in the middle of the DDS tests.
    2. `--cargo-args --release` (base path `.`): the node package with colcon-ros-cargo
       (cargo-ament-build), against that interface package (.ros/install); it installs the
       binaries under lib/vision_preproc/ and launch/, config/ under share/vision_preproc/.

    Built in the environment target/release was built in, step 2 reuses all of
    target/release (seed_cargo_target) and compiles nothing. (The README's single command
    compiles the node against its own fresh copy of the interface package, whose prefix
    then starts AMENT_PREFIX_PATH and CMAKE_PREFIX_PATH: cargo rebuilds r2r and this crate,
    about 3 minutes on 2 cores.)"""
    release = seed_cargo_target()
    r = subprocess.run([sys.executable, "-c", COLCON_SELECTION], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"colcon's package selection failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert r.stdout.split() == ["vision_preproc_msgs", "vision_preproc"], \
        f"colcon does not select vision_preproc_msgs before vision_preproc: {r.stdout!r} {r.stderr[-1000:]}"
    install = COLCON_WS / "install"
    try:
        colcon_build("--base-paths", ".", "--cargo-args", "--release")
    except AssertionError as e:
        trapped = r2r_runs_without_cfg_flags(release)
        raise AssertionError(f"{e}\nr2r build outputs without cfg flags (stale cached bindings): {trapped}"
                             if trapped else str(e)) from None
    return install
