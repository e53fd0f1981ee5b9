#!/usr/bin/env python3
"""Build an ament prefix of pure-Python ROS 2 packages from source checkouts, by copying:
nothing is compiled and pip is not used.

    python3 scripts/rostools/ros_tools_prefix.py PREFIX PKG_DIR [PKG_DIR ...]

For each package folder (one with a package.xml), what colcon's `setup.py install` (or
ament_cmake_python) would install:

- a package with a setup.py: its setup() call is run with a stand-in `setuptools.setup`
  that records the keyword arguments; the Python packages it names (`packages`,
  `package_dir`) are copied to PREFIX/lib/python3.11/site-packages/, its `data_files` to
  PREFIX/<dir>/ (package.xml, plugin.xml, resource/, the ament index marker, launch/...),
  and a `<name>-<version>.dist-info` with its `entry_points.txt` is written (ros2cli's
  verbs and launch's frontends are found through entry points); each `console_scripts`
  entry becomes an executable in PREFIX/bin/.
- a package with a CMakeLists.txt (python_qt_binding, qt_gui, qt_gui_py_common,
  rqt_py_common: ament_cmake_python; a setup.py beside it is catkin's, unused): the Python packages under
  `src/` (or the package folder), package.xml, plugin.xml and resource/ into
  share/<pkg>/, and the ament index marker.

Used by scripts/rostools/ros_tools_setup.sh (rqt, ros2cli, launch for scripts/rostools/rqt_check.sh and
scripts/rostools/launch_check.sh); nothing in `make test` uses the prefix.
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from unittest import mock

PY = f"python{sys.version_info.major}.{sys.version_info.minor}"


def setup_kwargs(pkg: Path) -> dict:
    """The keyword arguments of the setup() call in pkg/setup.py."""
    captured: dict = {}

    def fake_setup(**kwargs):
        captured.update(kwargs)

    import setuptools

    cwd = os.getcwd()
    os.chdir(pkg)
    try:
        with mock.patch.object(setuptools, "setup", fake_setup), \
                mock.patch.object(sys, "argv", ["setup.py", "--name"]):
            runpy.run_path(str(pkg / "setup.py"), run_name="__main__")
    finally:
        os.chdir(cwd)
    return captured


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def install_setup_py(pkg: Path, prefix: Path, site: Path) -> str:
    kw = setup_kwargs(pkg)
    name = kw.get("name") or pkg.name
    package_dir = kw.get("package_dir", {})
    base = pkg / package_dir.get("", "")
    for p in kw.get("packages", []):
        parts = p.split(".")
        src = pkg / package_dir[p] if p in package_dir else base.joinpath(*parts)
        dst = site.joinpath(*parts)
        dst.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():  # this package's files; its subpackages are listed on their own
            if f.is_file() and f.suffix != ".pyc":
                shutil.copy2(f, dst / f.name)
        for pattern in kw.get("package_data", {}).get(p, []):
            for f in src.glob(pattern):
                if f.is_file():
                    (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, dst / f.relative_to(src))
    for m in kw.get("py_modules", []):
        shutil.copy2(base / f"{m}.py", site / f"{m}.py")
    for target, files in kw.get("data_files", []):
        (prefix / target).mkdir(parents=True, exist_ok=True)
        for f in files:
            src = pkg / f
            if src.is_dir():
                copy_tree(src, prefix / target / src.name)
            else:
                shutil.copy2(src, prefix / target / src.name)
    version = kw.get("version", "0.0.0")
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (dist / "INSTALLER").write_text("scripts/rostools/ros_tools_prefix.py\n")
    eps = kw.get("entry_points", {})
    if eps:
        lines = []
        for group, entries in eps.items():
            lines.append(f"[{group}]")
            lines += [e.replace(" ", "") if "=" in e else e for e in entries]
            lines.append("")
        (dist / "entry_points.txt").write_text("\n".join(lines))
    for script in eps.get("console_scripts", []):
        exe, target = (s.strip() for s in script.split("=", 1))
        module, func = target.split(":")
        path = prefix / "bin" / exe
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/usr/bin/env python3\nimport sys\nfrom {module} import {func}\n"
                        f"sys.exit({func}())\n")
        path.chmod(0o755)
    return name


def install_cmake_only(pkg: Path, prefix: Path, site: Path) -> str:
    name = ET.parse(pkg / "package.xml").getroot().findtext("name")
    roots = [pkg / "src"] if (pkg / "src").is_dir() else [pkg]
    for root in roots:
        for d in root.iterdir():
            if d.is_dir() and (d / "__init__.py").exists() and d.name not in ("test", "tests"):
                copy_tree(d, site / d.name)
    share = prefix / "share" / name
    share.mkdir(parents=True, exist_ok=True)
    for f in ("package.xml", "plugin.xml"):
        if (pkg / f).exists():
            shutil.copy2(pkg / f, share / f)
    if (pkg / "resource").is_dir():
        copy_tree(pkg / "resource", share / "resource")
    return name


def main() -> int:
    prefix = Path(sys.argv[1]).resolve()
    site = prefix / "lib" / PY / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    index = prefix / "share" / "ament_index" / "resource_index" / "packages"
    index.mkdir(parents=True, exist_ok=True)
    for arg in sys.argv[2:]:
        pkg = Path(arg).resolve()
        # An ament_cmake package's setup.py, if any, is a leftover of catkin (distutils).
        name = install_cmake_only(pkg, prefix, site) if (pkg / "CMakeLists.txt").exists() else \
            install_setup_py(pkg, prefix, site)
        marker = index / name
        if not marker.exists():
            marker.write_text("")
        print(f"  {name}: {pkg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
