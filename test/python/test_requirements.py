"""The ROS 2 distributions scripts/setup/setup.sh installs (VP_ROS_DISTRO): each one's pin list
names only its own meta-wheels (whose Requires-Dist pin the plain ros-* wheels: no second,
hand-kept list of plain pins that could drift), the lists differ only where the
distributions do, and the environment file says the truth about the distribution, with
r2r's cargo alone told a name it knows. Also the Python side's answer to "which variable
does this Fast DDS read its profile from"."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from vptools import ROOT
from vptools import fastdds

REQS = ROOT / "scripts" / "setup" / "requirements"
DISTROS = ("jazzy", "kilted")
#: Packages one distribution needs and the other has not (docs/BUILDING.md): Kilted split
#: ament_cmake_ros_core out of ament_cmake_ros; Jazzy's ament_cmake_ros needs gmock, gtest,
#: pytest, and its rosidl_generator_py python_cmake_module.
ONLY_IN = {
    "jazzy": {"ament-cmake-ros", "ament-cmake-gmock", "ament-cmake-gtest", "ament-cmake-pytest",
              "python-cmake-module"},
    "kilted": {"ament-cmake-ros-core"},
}


def pins(distro: str) -> dict[str, str]:
    out = {}
    for line in (REQS / f"ros-{distro}.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            m = re.fullmatch(rf"ros-{distro}-([a-z0-9-]+)==([0-9.]+)", line.strip())
            assert m, f"ros-{distro}.txt: {line!r} is not a pinned ros-{distro}-* meta-wheel"
            out[m[1]] = m[2]
    return out


def test_each_distribution_pins_only_its_own_meta_wheels() -> None:
    lists = {d: pins(d) for d in DISTROS}
    for d, p in lists.items():
        assert "rclpy" in p and "rmw-fastrtps-cpp" in p and "rosidl-default-generators" in p, p
    common = set(lists["jazzy"]) & set(lists["kilted"])
    for d in DISTROS:
        assert set(lists[d]) - common == ONLY_IN[d], (d, set(lists[d]) - common)
    # No ROS wheel in the shared list: everything of ROS comes from one distribution.
    shared = (REQS / "common.txt").read_text()
    assert not re.search(r"^ros-", shared, flags=re.M), "common.txt names a ROS wheel"


def test_setup_accepts_exactly_the_distributions_with_a_pin_list() -> None:
    text = (ROOT / "scripts" / "setup" / "setup.sh").read_text()
    accepted = re.search(r'case "\$DISTRO" in\n\s*([a-z |]+)\)', text)
    assert accepted, "setup.sh's distribution check"
    assert sorted(a.strip() for a in accepted[1].split("|")) == sorted(DISTROS)
    assert sorted(p.stem.removeprefix("ros-") for p in REQS.glob("ros-*.txt")) == sorted(DISTROS)
    assert 'DISTRO="${VP_ROS_DISTRO:-jazzy}"' in text, "Jazzy is the default"
    bad = subprocess.run(["bash", str(ROOT / "scripts" / "setup" / "setup.sh")], env={"VP_ROS_DISTRO": "humble", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "VP_ROS_DISTRO=humble" in bad.stderr and "jazzy" in bad.stderr, bad.stderr


def write_env(tmp_path: Path, distro: str) -> str:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "setup" / "write_env.py"), str(tmp_path), distro],
                          capture_output=True, text=True, check=True, timeout=30).stdout


def test_the_environment_names_the_installed_distribution(tmp_path: Path) -> None:
    jazzy = write_env(tmp_path, "jazzy")
    assert "export ROS_DISTRO=jazzy\n" in jazzy and "export VP_ROS_DISTRO=jazzy\n" in jazzy
    assert f'_vp_front PATH "{tmp_path}/.ros-jazzy/venv/bin"' in jazzy
    assert not (tmp_path / ".ros-jazzy" / "bin" / "cargo").exists()
    # The distribution's own folders, not the .ros link (which follows the last set-up).
    assert f"{tmp_path}/.ros/" not in jazzy

    kilted = write_env(tmp_path, "kilted")
    assert "export ROS_DISTRO=kilted\n" in kilted
    shim = tmp_path / ".ros-kilted" / "bin" / "cargo"
    assert f'_vp_front PATH "{shim.parent}:{tmp_path}/.ros-kilted/venv/bin"' in kilted
    # r2r 0.9.7 rejects "kilted": the shim gives cargo (and only cargo) "jazzy", and finds
    # the real cargo with its own folder taken off PATH.
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "cargo").write_text('#!/bin/sh\necho "ROS_DISTRO=$ROS_DISTRO args=$*"\n')
    (fake / "cargo").chmod(0o755)
    out = subprocess.run([str(shim), "build", "--release"], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{shim.parent}:{fake}:/usr/bin:/bin", "ROS_DISTRO": "kilted"})
    assert out.returncode == 0 and out.stdout.strip() == "ROS_DISTRO=jazzy args=build --release", out


def test_the_profile_variable_follows_the_fast_dds_library(tmp_path: Path) -> None:
    jazzy, kilted, none = (tmp_path / d for d in ("jazzy", "kilted", "none"))
    for d, lib in ((jazzy, "libfastrtps.so.2.14.5"), (kilted, "libfastdds.so.3.2.2"), (none, "libc.so.6")):
        d.mkdir()
        (d / lib).write_bytes(b"")
    assert fastdds.version([str(jazzy)]) == (2, 14, 5)
    assert fastdds.profile_var([str(jazzy)]) == "FASTRTPS_DEFAULT_PROFILES_FILE"
    assert fastdds.version([str(none), str(kilted)]) == (3, 2, 2)
    assert fastdds.profile_var([str(kilted)]) == "FASTDDS_DEFAULT_PROFILES_FILE"
    assert fastdds.version([str(none)]) is None
    # A venv's lib/ holds the file and its links; a bundle (scripts/device/ros_bundle.sh)
    # holds each library under its SONAME only.
    venv, bundle = tmp_path / "venv", tmp_path / "bundle"
    for d, libs in ((venv, ("libfastrtps.so", "libfastrtps.so.2.14", "libfastrtps.so.2.14.5")),
                    (bundle, ("libfastcdr.so.2", "libfastrtps.so.2.14", "librmw_fastrtps_cpp.so"))):
        d.mkdir()
        for lib in libs:
            (d / lib).write_bytes(b"")
    assert fastdds.version([str(venv)]) == (2, 14, 5)
    assert fastdds.version([str(bundle)]) == (2, 14, 0)
    assert fastdds.profile_var([str(bundle)]) == "FASTRTPS_DEFAULT_PROFILES_FILE"
    env = fastdds.with_profile({"A": "1", "FASTDDS_DEFAULT_PROFILES_FILE": "x", "FASTRTPS_DEFAULT_PROFILES_FILE": "y"},
                               None)
    assert env == {"A": "1"}
