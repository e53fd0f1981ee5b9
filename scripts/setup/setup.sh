#!/usr/bin/env bash
# Installs everything vision_preproc needs on a fresh Debian 12 / Ubuntu x86-64 machine
# with no ROS packages: apt packages (libclang, SQLite, GStreamer), a Python 3.11 venv
# holding ROS 2 from PyPI wheels, colcon, the test tools, NVRTC and NVTX, the three wheel
# fix-ups, the project's Python helpers (python/vptools) on the venv's path, the interface
# packages (vision_preproc_msgs; copies of foxglove_msgs and ffmpeg_image_transport_msgs), the environment file, and the demo's sample bag.
#
# One ROS 2 distribution at a time, chosen by VP_ROS_DISTRO: jazzy (the default: the LTS
# robot stacks run, supported to May 2029) or kilted (support ends 2026-12-31). Each has its
# own folders, side by side, never shared (r2r caches the message bindings it generates
# from the installation, and the binaries embed its library paths):
#   .ros-<distro>/     venv, interface package, env.sh, sample bag, logs
#   target-<distro>/   cargo's build outputs
# and .ros and target are links to the distribution set up last, so every path in the
# docs and scripts (.ros/env.sh, target/release/...) names the one in use. Switching is
# `VP_ROS_DISTRO=kilted make test`; a plain `make ...` switches back to the default (unless
# VP_ROS_DISTRO is in the environment: each env.sh exports its own). Two
# distributions' builds or tests cannot run at the same time in one checkout.
#
# Idempotent: each step is skipped when its inputs have not changed (stamp files in
# .ros-<distro>/), so a second run finishes in about a second.
#
# Usage: [VP_ROS_DISTRO=jazzy|kilted] scripts/setup/setup.sh      then: source .ros/env.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DISTRO="${VP_ROS_DISTRO:-jazzy}"
case "$DISTRO" in
    jazzy | kilted) ;;
    *)
        echo "setup: VP_ROS_DISTRO=$DISTRO is not a distribution set up here: use jazzy (the default) or kilted" >&2
        exit 1
        ;;
esac
ROS_DIR="$ROOT/.ros-$DISTRO"
VENV="$ROS_DIR/venv"
PREFIX="$ROS_DIR/install"
PYTHON="${PYTHON:-python3.11}"

log() { printf '[setup] %s\n' "$*"; }
hash_of() { cat "$@" | sha256sum | cut -c1-16; }
stamp_ok() { [ -f "$ROS_DIR/$1.stamp" ] && [ "$(cat "$ROS_DIR/$1.stamp")" = "$2" ]; }
stamp_set() { echo "$2" >"$ROS_DIR/$1.stamp"; }

# The links .ros and target name this distribution's folders. A real folder in their
# place is the layout before distributions were chosen (Kilted, one folder each): its
# build outputs become target-kilted (cargo rebuilds what the move invalidates), its .ros
# (a venv cannot move) is removed and set up again when Kilted is chosen.
link_to() {  # NAME FOLDER
    local name="$ROOT/$1"
    if [ -d "$name" ] && [ ! -L "$name" ]; then
        if [ "$1" = target ] && [ ! -e "$ROOT/target-kilted" ]; then
            log "moving the single-distribution target/ (Kilted) to target-kilted/"
            mv "$name" "$ROOT/target-kilted"
        else
            log "removing the single-distribution $1/ (Kilted; now $1-<distro>/)"
            rm -rf "$name"
        fi
    fi
    mkdir -p "$ROOT/$2"
    ln -sfn "$2" "$name"
}
link_to .ros ".ros-$DISTRO"
link_to target "target-$DISTRO"
log "ROS 2 $DISTRO (VP_ROS_DISTRO): .ros -> .ros-$DISTRO, target -> target-$DISTRO"

# 1. System packages: r2r runs bindgen at build time (libclang); bags in sqlite3 storage
# are read through the system's SQLite; the cargo feature `gstreamer` (src/capture/) links
# Debian 12's GStreamer 1.22 and its tests run videotestsrc, pngdec, rgb2bayer and
# gst-launch-1.0 (plugins base, good, bad; the tools); video inputs decode with libav's
# decoders (gstreamer1.0-libav) and their tests encode with x264enc (plugins ugly); the
# RTSP camera of test/ros/test_rtsp.py is GStreamer's rtsp-server run by the system's
# python3 (python3-gi, gir1.2-gst-rtsp-server-1.0: the venv's Python cannot load them);
# cmake builds the C/C++ consumer (consumer_c/, with the base image's g++).
APT_PACKAGES=(libclang-dev clang libsqlite3-dev cmake
    libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev gstreamer1.0-plugins-base
    gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-tools
    gstreamer1.0-libav gstreamer1.0-plugins-ugly python3-gi gir1.2-gst-rtsp-server-1.0)
missing=()
# Named with the machine's architecture: `dpkg -s` refuses a bare name that is installed
# for two (after `make aarch64`, which adds arm64's GStreamer), and would install again.
HOST_ARCH="$(dpkg --print-architecture)"
for p in "${APT_PACKAGES[@]}"; do
    dpkg -s "$p:$HOST_ARCH" >/dev/null 2>&1 || dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
    log "apt: installing ${missing[*]} (GStreamer's: about a minute)"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    log "apt: ${APT_PACKAGES[*]} present"
fi

# The Rust dependencies that need no ROS environment (image, clap, tokio, cudarc, mcap,
# ...: about half of a cold build's CPU time), compiled in the background while the steps
# below install the venv and build the interface package, which keep about one of a
# 2-core machine's cores busy: `make build` then finds them compiled (the same units: same
# profile, features and environment). r2r's crates are left to the build: their build
# scripts read the ROS environment written below. A failure here only costs time: the
# build reports it. VP_PREBUILD=0 skips it.
prebuild_pid=""
if [ "${VP_PREBUILD:-1}" = 1 ] && command -v cargo >/dev/null; then
    mkdir -p "$ROOT/target"
    log "cargo: compiling the dependencies that need no ROS in the background (target/prebuild.log)"
    (
        cd "$ROOT"
        t0=$SECONDS
        specs="$(cargo metadata --format-version 1 2>/dev/null | python3 -c '
import json, sys
m = json.load(sys.stdin)
pkg = {p["id"]: p for p in m["packages"]}
root = next(n for n in m["resolve"]["nodes"] if pkg[n["id"]]["name"] == "vision_preproc")
for d in root["deps"]:
    p = pkg[d["pkg"]]
    if any(k["kind"] is None for k in d["dep_kinds"]) and not p["name"].startswith("r2r"):
        print("--package=%s@%s" % (p["name"], p["version"]))')"
        # Without the list (cargo metadata failed) nothing is compiled here: a plain
        # `cargo build` would run r2r's build scripts without the ROS environment.
        [ -n "$specs" ] || { echo "prebuild: no dependency list (cargo metadata failed)"; exit 1; }
        # shellcheck disable=SC2086
        cargo build --release $specs && echo "prebuild: done in $((SECONDS - t0)) s"
    ) >"$ROOT/target/prebuild.log" 2>&1 &
    prebuild_pid=$!
    trap '[ -z "$prebuild_pid" ] || { pkill -TERM -P "$prebuild_pid"; kill "$prebuild_pid"; } 2>/dev/null || true' EXIT
fi

# 2. The venv with this distribution's pinned ROS 2 wheels, colcon, test tools, NVRTC, NVTX.
command -v "$PYTHON" >/dev/null || { echo "setup: $PYTHON not found (Python 3.11 is required by the ROS 2 wheels)" >&2; exit 1; }
REQS=("$ROOT/scripts/setup/requirements/ros-$DISTRO.txt" "$ROOT/scripts/setup/requirements/common.txt")
req_hash="$(hash_of "${REQS[@]}")-$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')-$ROOT"
if [ -x "$VENV/bin/python" ] && stamp_ok venv "$req_hash"; then
    log "venv: up to date ($VENV)"
else
    log "venv: installing pinned wheels into $VENV (about 30 s with a warm pip cache)"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "${REQS[0]}" -r "${REQS[1]}"
    rm -f "$ROS_DIR"/*.stamp
    stamp_set venv "$req_hash"
fi

# 3. The three fix-ups (idempotent, cheap: always run).
"$VENV/bin/python" "$ROOT/scripts/setup/ros_fixups.py" "$VENV"

# 3b. The project's Python helpers (python/vptools: test/, bench/ and scripts/ import them)
# on the venv's path, by a .pth file (cheap: always run).
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$ROOT/python" >"$site/vision_preproc_vptools.pth"

# 4. The environment file.
"$VENV/bin/python" "$ROOT/scripts/setup/write_env.py" "$ROOT" "$DISTRO" >"$ROS_DIR/env.sh.tmp"
mv "$ROS_DIR/env.sh.tmp" "$ROS_DIR/env.sh"

# 5. The interface packages, built with colcon into .ros/install: vision_preproc_msgs, and
# our copies of the video inputs' messages (foxglove_msgs' CompressedVideo,
# ffmpeg_image_transport_msgs' FFMPEGPacket: no PyPI wheels; docs/VIDEO.md).
msgs_hash="$(hash_of $(find "$ROOT/msgs" -type f | sort) "$ROS_DIR/venv.stamp")"
msgs_built=true
for m in "$ROOT"/msgs/*/package.xml; do
    [ -f "$PREFIX/share/$(basename "$(dirname "$m")")/package.xml" ] || msgs_built=false
done
if stamp_ok msgs "$msgs_hash" && $msgs_built; then
    log "interface packages: up to date ($PREFIX)"
else
    log "interface packages: building with colcon (about a minute)"
    (
        # shellcheck disable=SC1091
        source "$ROS_DIR/env.sh"
        cd "$ROS_DIR"
        colcon --log-base "$ROS_DIR/log/colcon" build \
            --base-paths "$ROOT/msgs" \
            --build-base "$ROS_DIR/build" --install-base "$PREFIX" --merge-install \
            --event-handlers console_cohesion- summary+ \
            --cmake-args -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$VENV/bin/python"
    )
    # r2r caches its generated message bindings by environment only: a changed message
    # of ours would keep the old bindings (an unknown type at run time). Rebuild r2r.
    if ls -d "$ROOT"/target/release/build/r2r-* >/dev/null 2>&1; then
        log "interface packages changed: r2r's bindings are regenerated at the next build"
        (source "$ROS_DIR/env.sh" && cd "$ROOT" && cargo clean --release -p r2r -p r2r_msg_gen -q)
    fi
    stamp_set msgs "$msgs_hash"
fi

# 6. The demo's sample bag (real photographs, written with rosbags).
bag_hash="$(hash_of "$ROOT/scripts/setup/make_sample_bag.py" "$ROOT/python/vptools/bags.py" "$ROOT/python/vptools/sources.py" "$ROOT"/test/data/*.png "$ROOT"/test/data/*.jpg "$ROS_DIR/venv.stamp")"
if stamp_ok sample_bag "$bag_hash" && [ -f "$ROS_DIR/sample_bag/metadata.yaml" ]; then
    log "sample bag: up to date ($ROS_DIR/sample_bag)"
else
    (source "$ROS_DIR/env.sh" && python3 "$ROOT/scripts/setup/make_sample_bag.py" "$ROS_DIR/sample_bag")
    stamp_set sample_bag "$bag_hash"
fi

if [ -n "$prebuild_pid" ]; then
    if wait "$prebuild_pid"; then
        log "cargo: $(tail -n 1 "$ROOT/target/prebuild.log")"
    else
        log "cargo: compiling the dependencies in the background failed (target/prebuild.log); the build will say why"
    fi
    prebuild_pid=""
fi

log "done. Use it with: source $ROS_DIR/env.sh"
