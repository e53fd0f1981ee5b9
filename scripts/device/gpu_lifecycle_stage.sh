#!/usr/bin/env bash
# The managed node on the GPU machine, stage side (HERE): into STAGE what
# scripts/device/gpu_lifecycle_remote.py needs THERE: the node's Jazzy bundle (ros.tar.xz,
# scripts/device/ros_bundle.sh, with bin/vision_preproc_lifecycle_node), GStreamer's
# run-time (gst.tar.xz, scripts/device/gst_bundle.sh; the node links it), rclpy for
# CPython 3.12 (py312.tar.xz, scripts/device/py312_bundle.sh; the driver) and the script.
#
#   scripts/device/gpu_lifecycle_stage.sh [STAGE]     # default .device/lc (git-ignored)
#   # then run there what gpu_lifecycle_remote.py's docstring says, carrying STAGE
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
STAGE="${1:-$ROOT/.device/lc}"
# shellcheck disable=SC1091
source .ros/env.sh
mkdir -p "$STAGE"
scripts/device/ros_bundle.sh "$STAGE/ros"
scripts/device/gst_bundle.sh "$STAGE/gst"
scripts/device/py312_bundle.sh
cp .device/py312.tar.xz "$STAGE/"
rm -rf "$STAGE/ros" "$STAGE/gst"
cp scripts/device/gpu_lifecycle_remote.py "$STAGE/"
du -sh "$STAGE"/*
