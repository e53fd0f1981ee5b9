#!/usr/bin/env bash
# The message path on the GPU machine, stage side (HERE): this build's node against a
# previous release's, in one run. Stages everything scripts/device/gpu_transport_remote.sh needs
# into one carry folder: the CLI and the GPU test binaries without ROS
# (scripts/device/gpu_backend_stage.sh), the ROS bundle of this release (scripts/device/ros_bundle.sh) with the
# previous release's node and CLI added under bin/old/, the input bags
# (scripts/device/gpu_node_bags.py), both releases' default.yaml, the camera profile, the script.
#
#   OLD_TARGET=/path/to/91daae3/target/release scripts/device/gpu_transport_stage.sh [STAGE]
#   # STAGE defaults to .device/transport; then there: bash STAGE/gpu_transport_remote.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source .ros/env.sh  # python3 with the vptools package (scripts/device/gpu_node_bags.py)
STAGE="$(realpath -m "${1:-$ROOT/.device/transport}")"
OLD="${OLD_TARGET:?set OLD_TARGET to the target/release folder of a build of the previous release (91daae3)}"
OLD_COMMIT="${OLD_COMMIT:-91daae3}"
mkdir -p "$STAGE"
bash scripts/device/gpu_backend_stage.sh "$STAGE"
scripts/device/ros_bundle.sh "$STAGE/ros"
mkdir -p "$STAGE/ros/bin/old"
strip -o "$STAGE/ros/bin/old/vision_preproc_node" "$OLD/vision_preproc_node"
strip -o "$STAGE/ros/bin/old/vision_preproc" "$OLD/vision_preproc"
tar cJf "$STAGE/ros.tar.xz" -C "$STAGE/ros" .
rm -rf "$STAGE/ros"
python3 scripts/device/gpu_node_bags.py "$STAGE"
rm -f "$STAGE/vision_preproc" "$STAGE/gpu_backend_remote.sh"  # not used there (the bundle has the CLI)
cp config/default.yaml "$STAGE/default.yaml"
git show "$OLD_COMMIT:config/default.yaml" >"$STAGE/default_old.yaml"
cp config/fastdds_large_frames.xml scripts/device/gpu_transport_remote.sh bench/memcpy_rate.py "$STAGE/"
du -sh "$STAGE"; ls -la "$STAGE"
