#!/usr/bin/env bash
# The ROS node on the GPU machine, stage side (HERE): everything
# scripts/device/gpu_node_remote.py needs THERE (a machine with CUDA but no ROS), in .device/:
#   ros.tar.xz        the node, the CLI and the ROS 2 run-time libraries they load
#                     (scripts/device/ros_bundle.sh; also the node with the test hooks)
#   gst.tar.xz        Debian 12's GStreamer run-time, which the node links (scripts/device/gst_bundle.sh)
#   node_bags.tar.xz  4 photographs at 1280x720 and 1920x1080 bgr8, 30 Hz (scripts/device/gpu_node_bags.py)
#   bag/              the demo bag (.ros/sample_bag), for the fault scenarios
#
#   scripts/device/gpu_node_stage.sh
#   # then on the GPU machine, from the repository root, carrying those four:
#   PYTHONPATH=python python3 scripts/device/gpu_node_remote.py [scenario ...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source .ros/env.sh
scripts/device/ros_bundle.sh "$ROOT/.device/ros"
scripts/device/gst_bundle.sh "$ROOT/.device/gst"
python3 scripts/device/gpu_node_bags.py "$ROOT/.device"
rm -rf .device/bag && cp -r .ros/sample_bag .device/bag
du -sh .device/ros.tar.xz .device/gst.tar.xz .device/node_bags.tar.xz .device/bag
