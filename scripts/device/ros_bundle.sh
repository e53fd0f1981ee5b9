#!/usr/bin/env bash
# Bundle the node and the CLI with the ROS 2 run-time libraries they load, to run them
# on a machine without ROS (the GPU machine, which has CUDA but no ROS and cannot
# download anything). The libraries are found by running the three processes here for a
# few seconds (node + `record` + `play` on the demo bag, CPU backend) and reading
# /proc/PID/maps, which also catches the ones rcl and rosidl load with dlopen; each is
# copied under its SONAME so that LD_LIBRARY_PATH finds it. Binaries are stripped. The
# product node is bin/vision_preproc_node (and the managed node
# bin/vision_preproc_lifecycle_node, the same libraries); the GPU-fault scenarios of gpu_node_remote.py
# run bin/vision_preproc_node_fault_injection, the node with the test hooks (cargo
# feature `fault-injection`, scripts/test_hooks_build.sh).
#
#   scripts/device/ros_bundle.sh [DIR]    # default .device/ros (git-excluded); also writes DIR.tar.xz
#   # there: scripts/device/gpu_node_remote.py unpacks .device/ros.tar.xz and sets LD_LIBRARY_PATH
#   # (scripts/device/gpu_node_stage.sh calls this script with the default DIR)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DIR="${1:-$ROOT/.device/ros}"
# shellcheck disable=SC1091
source .ros/env.sh
scripts/test_hooks_build.sh   # target/fault-injection/; target/release keeps the product
rm -rf "$DIR" && mkdir -p "$DIR/bin" "$DIR/lib"
TMP="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$((150 + RANDOM % 60))}"
target/release/vision_preproc_node --ros-args -p backend:=cpu >"$TMP/node.log" 2>&1 &
node=$!
target/release/vision_preproc record "$TMP/rec" --duration 8 >"$TMP/rec.log" 2>&1 &
rec=$!
target/release/vision_preproc play .ros/sample_bag --loop --duration 6 --wait-subscribers 1 >"$TMP/play.log" 2>&1 &
play=$!
sleep 4
# The ROS libraries of .ros/, and the system's SQLite (rusqlite links it; the GPU machine
# need not have it).
cat "/proc/$node/maps" "/proc/$rec/maps" "/proc/$play/maps" | awk '{print $6}' \
    | grep -E "^$ROOT/\.ros(-[a-z]+)?/.*\.so|/libsqlite3\.so" | sort -u >"$TMP/libs"
wait "$play" "$rec" || { cat "$TMP"/*.log; exit 1; }
kill -TERM "$node"; wait "$node" || true
grep -q ' [1-9][0-9]* tensors' "$TMP/rec.log" || { echo "the live run recorded no tensor:"; cat "$TMP"/*.log; exit 1; }
while read -r lib; do
    soname="$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
    cp -L "$lib" "$DIR/lib/${soname:-$(basename "$lib")}"
done <"$TMP/libs"
strip -o "$DIR/bin/vision_preproc_node" target/release/vision_preproc_node
strip -o "$DIR/bin/vision_preproc" target/release/vision_preproc
strip -o "$DIR/bin/vision_preproc_lifecycle_node" target/release/vision_preproc_lifecycle_node
strip -o "$DIR/bin/vision_preproc_node_fault_injection" target/fault-injection/vision_preproc_node
# The r2r consumer of tensor_ref (the same ROS libraries as the node's).
cargo build --release --example tensor_ref_consumer
strip -o "$DIR/bin/tensor_ref_consumer" target/release/examples/tensor_ref_consumer
git rev-parse HEAD >"$DIR/COMMIT"
tar cJf "$DIR.tar.xz" -C "$DIR" .
echo "bundle: $(wc -l <"$TMP/libs") libraries, $(du -sh "$DIR" | cut -f1) in $DIR, $(du -sh "$DIR.tar.xz" | cut -f1) as $DIR.tar.xz"
