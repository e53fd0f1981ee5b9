#!/usr/bin/env bash
# The node watched in rqt, for real, headless: the screenshots of docs/WATCHING.md.
#
#   scripts/rostools/rqt_check.sh                    # every screen: topic plot reconfigure console monitor
#   scripts/rostools/rqt_check.sh monitor            # only some (e.g. retake the monitor screen)
#   RQT_STOCK_CAMERA=0 scripts/rostools/rqt_check.sh monitor   # the monitor without the stock camera
#
# 1. scripts/rostools/ros_tools_setup.sh (idempotent): Xvfb, PyQt5, rqt and its plugins from their
#    repositories' sources, ros2cli; nothing of it is used by `make test`.
# 2. An Xvfb server, and on a ROS_DOMAIN_ID of its own (loopback only):
#    - /vision_preproc: the CPU backend, config/yolo_640_letterbox.yaml (a 640x640 float32
#      tensor, 4.9 MB) with a 3x3 Gaussian conv, fed by `vision_preproc play` of the demo's
#      sample bag (.ros/sample_bag: photographs in five encodings) looped at 30 Hz,
#      restamped (so ages and rqt_plot's time axis read as live);
#    - for the monitor screen, /batch/vision_preproc: config/four_cameras_640.yaml (four
#      cameras batched) fed by four players at 10 Hz, the rear one stopped after a few
#      seconds: a stale camera, the node's WARN;
#    - for the monitor screen (unless RQT_STOCK_CAMERA=0), /stock/vision_preproc (default
#      parameters, CPU) fed by a stock camera in its own process (bench/rclpy_publisher.py:
#      rclpy, 1920x1080 bgr8 at 30 Hz, reliable, no Fast DDS profile: the frames go as UDP
#      fragments): the node's WARN that the camera's transport is too slow; the monitor
#      selects that node's status.
# 3. scripts/rostools/rqt_screens.py per screen: rqt's plugin standalone, driven as a user would,
#    screenshots into docs/img/rqt_*.png (8-bit PNG), what each step saw into
#    .ros/tools/run/shots/rqt_<screen>.json; then `ros2 param get` of what rqt_reconfigure
#    set. The binaries used are copies of target/release/ (a rebuild meanwhile is harmless).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
SCREENS=("$@")
[ ${#SCREENS[@]} -gt 0 ] || SCREENS=(topic plot reconfigure console monitor)

scripts/rostools/ros_tools_setup.sh
# shellcheck disable=SC1091
source .ros/env.sh
# shellcheck disable=SC1091
source .ros/tools/env.sh
RUN="$ROOT/.ros/tools/run"
rm -rf "$RUN/shots" "$RUN/bin"
mkdir -p "$RUN/bin" "$RUN/shots" "$RUN/home"
cp target/release/vision_preproc target/release/vision_preproc_node "$RUN/bin/"
export HOME="$RUN/home" ROS_LOG_DIR="$RUN/log" XDG_RUNTIME_DIR="$RUN/home"
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$((110 + RANDOM % 80))}" ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
BAG="$ROOT/.ros/sample_bag"

PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
start() {  # start LOG CMD...: in the background, its PID kept for cleanup
  local log="$1"; shift
  "$@" >"$RUN/$log" 2>&1 &
  PIDS+=($!)
  LAST_PID=$!
}

display=$((50 + RANDOM % 40))
start xvfb.log Xvfb ":$display" -screen 0 1280x1000x24 -nolisten tcp
export DISPLAY=":$display"
sleep 1

start node.log "$RUN/bin/vision_preproc_node" --ros-args --params-file config/yolo_640_letterbox.yaml \
  -p backend:=cpu -p conv.kernel:=gaussian -p conv.size:=3
start play.log "$RUN/bin/vision_preproc" play "$BAG" --loop --restamp --wait-subscribers 1
echo "rqt_check: ROS_DOMAIN_ID=$ROS_DOMAIN_ID DISPLAY=$DISPLAY, /vision_preproc (cpu) fed by the sample bag at 30 Hz"
sleep 3

BATCH=""
start_batch() {  # the four-camera node and its players; the rear camera stops after 6 s
  [ -z "$BATCH" ] || return 0
  BATCH=1
  start batch_node.log "$RUN/bin/vision_preproc_node" --ros-args --params-file config/four_cameras_640.yaml \
    -p backend:=cpu -r __ns:=/batch
  for cam in front left right rear; do
    start "play_$cam.log" "$RUN/bin/vision_preproc" play "$BAG" --loop --restamp --rate 0.33 \
      --image-topic "/batch/$cam/image_raw" --camera-info-topic "/batch/$cam/camera_info" --wait-subscribers 1
  done
  local rear=$LAST_PID
  sleep 6
  kill "$rear"
  echo "rqt_check: /batch/vision_preproc batching four cameras; the rear camera's player stopped"
}
param() {  # ros2 param VERB /vision_preproc ARGS...: echoed as typed, with its answer
  local out
  for _ in 1 2 3; do  # --no-daemon discovers afresh each time and can miss the node
    out="$(ros2 param "$@" --no-daemon 2>&1)" || true
    grep -q "Node not found" <<<"$out" || break
    sleep 1
  done
  echo "\$ ros2 param $*"; echo "$out"
}

SELECT=/batch/vision_preproc
start_stock() {  # a stock 1080p camera (rclpy, reliable, no profile) into /stock/vision_preproc
  [ "${RQT_STOCK_CAMERA:-1}" != 0 ] || return 0
  start stock_node.log "$RUN/bin/vision_preproc_node" --ros-args -p backend:=cpu -r __ns:=/stock
  start stock_camera.log env -u FASTDDS_DEFAULT_PROFILES_FILE -u FASTRTPS_DEFAULT_PROFILES_FILE python3 bench/rclpy_publisher.py --topic /stock/image \
    --width 1920 --height 1080 --rate 30 --reliable --seconds 600 --wait-reliable-subscriber
  SELECT=/stock/vision_preproc
  sleep 8  # the node judges the last 5 s of arrivals
}

status=0
for screen in "${SCREENS[@]}"; do
  [ "$screen" != monitor ] || { start_batch; start_stock; sleep 2; }
  echo "rqt_check: screen $screen"
  timeout 180 python3 scripts/rostools/rqt_screens.py "$screen" "$RUN/shots" --batch-node "$SELECT" >"$RUN/rqt_$screen.log" 2>&1 &
  rqt=$!
  if [ "$screen" = console ]; then
    # Records while the console listens: a node starting (its rear camera going stale),
    # then a refused and an accepted parameter change (newest on top).
    sleep 5
    start_batch
    sleep 2
    param set /vision_preproc conv.size 4
    param set /vision_preproc pad_value "[114.0, 114.0, 114.0]"
  fi
  if ! wait "$rqt"; then
    echo "rqt_check: screen $screen FAILED; $RUN/rqt_$screen.log:"; tail -20 "$RUN/rqt_$screen.log"
    status=1
  fi
  grep '^rqt_screens' "$RUN/rqt_$screen.log" | cut -c1-400 || true
  if [ "$screen" = reconfigure ]; then
    echo "rqt_check: what the node has after rqt_reconfigure:"
    param get /vision_preproc pad_value
    param get /vision_preproc conv.size
    grep -h "refused\|parameter" "$RUN/node.log" | tail -4 || true
  fi
done
cp "$RUN"/shots/*.png docs/img/ 2>/dev/null || true
# What every screen saw, in one file (docs/evidence/ keeps the run docs/WATCHING.md cites).
python3 - "$RUN" <<'PY'
import glob, json, os, subprocess, sys, time
run = sys.argv[1]
screens = [json.load(open(f)) for f in sorted(glob.glob(f"{run}/shots/rqt_*.json"))]
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
sources = open(f"{os.path.dirname(run)}/sources.txt").read().split("\n")
json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
           "loadavg": os.getloadavg(), "sources": [s for s in sources if s], "screens": screens},
          open(f"{run}/rqt_check.json", "w"), indent=1)
print(f"rqt_check: {run}/rqt_check.json")
PY
ls -l docs/img/rqt_*.png
exit $status
