#!/usr/bin/env bash
# The launch files under the real `ros2 launch` (launch, launch_ros, ros2launch from their
# repositories' sources: scripts/rostools/ros_tools_setup.sh), as docs/NODE.md records them.
#
#   scripts/rostools/launch_check.sh [TRANSCRIPT]      # default .ros/tools/run/launch_transcript.txt
#   PARTS="2 4" scripts/rostools/launch_check.sh       # only some of the parts below
#
# The package as colcon installs it (share/vision_preproc/{package.xml,launch,config},
# lib/vision_preproc/ with copies of target/release's binaries, the ament index marker)
# is made by copying into .ros/tools/run/pkg: nothing is compiled. Then, each on its own
# ROS_DOMAIN_ID (loopback only), with what the real tools show:
# 1. preprocess.launch.py --show-args;
# 2. preprocess.launch.py and preprocess.launch.xml with every argument given, respawn
#    included: the node's name, parameters and remaps, then SIGKILL and the respawn;
# 3. four_cameras.launch.py with every argument;
# 4. examples/robot_bringup.launch.py with the sample bag played with --clock: the node's
#    name, its parameters from the shared file, sim time, a tensor, SIGKILL and respawn.
# 5. lifecycle.launch.py (the managed node as launch_ros' LifecycleNode, brought to active
#    by its event handlers) and `ros2 lifecycle nodes/get/list/set` against it: the full
#    cycle, a refused transition, tensors only while active (the sample bag played), and
#    autostart:=false (unconfigured until `ros2 lifecycle set`).
# Each `ros2 launch` is stopped with SIGINT (Ctrl-C) at the end, as a user does.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
scripts/rostools/ros_tools_setup.sh >/dev/null
# shellcheck disable=SC1091
source .ros/env.sh
# shellcheck disable=SC1091
source .ros/tools/env.sh
RUN="$ROOT/.ros/tools/run"
OUT="${1:-$RUN/launch_transcript.txt}"
PKG="$RUN/pkg"
rm -rf "$PKG"
mkdir -p "$PKG/share/vision_preproc" "$PKG/lib/vision_preproc" "$PKG/share/ament_index/resource_index/packages" \
  "$RUN/home"
cp -r package.xml launch config "$PKG/share/vision_preproc/"
cp target/release/vision_preproc target/release/vision_preproc_node target/release/vision_preproc_lifecycle_node \
  "$PKG/lib/vision_preproc/"
touch "$PKG/share/ament_index/resource_index/packages/vision_preproc"
export AMENT_PREFIX_PATH="$PKG:$AMENT_PREFIX_PATH"
export HOME="$RUN/home" ROS_LOG_DIR="$RUN/log" ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
SHARE="$PKG/share/vision_preproc"
BAG="$ROOT/.ros/sample_bag"
: >"$OUT"

say() { echo "$*" | tee -a "$OUT"; }
# run CMD...: echoed as typed (paths shortened), its output into the transcript.
run() {
  say "\$ $(echo "$*" | sed "s|$SHARE|<share>|g; s|$ROOT/||g")"
  "$@" 2>&1 | sed "s|$SHARE|<share>|g; s|$PKG|<prefix>|g; s|$ROOT/||g" | tee -a "$OUT" || true
}
# param VERB NODE NAME...: `ros2 param`, retried while discovery has not seen the node.
param() {
  local out
  for _ in 1 2 3 4 5; do
    out="$(ros2 param "$@" --no-daemon 2>&1)" || true
    grep -q "Node not found" <<<"$out" || break
    sleep 1
  done
  say "\$ ros2 param $*"; say "$out"
}
LAUNCH_PID=""
# launch ARGS...: `ros2 launch ARGS` in the background, its output into the transcript.
launch() {
  say "\$ ros2 launch $(echo "$*" | sed "s|$SHARE|<share>|g; s|$ROOT/||g") &"
  # Job control on: a background job of a script otherwise starts with SIGINT ignored,
  # and Ctrl-C (SIGINT) is what stops ros2 launch here.
  set -m
  ros2 launch "$@" >"$RUN/launch.log" 2>&1 &
  LAUNCH_PID=$!
  set +m
}
NODE_EXE=vision_preproc_node  # the executable the launch file starts
node_pid() {  # the node process started by our ros2 launch
  pgrep -P "$LAUNCH_PID" -f "lib/vision_preproc/$NODE_EXE( |$)" || true
}
wait_node() {  # wait until our launch has a node process (up to 20 s)
  for _ in $(seq 40); do [ -n "$(node_pid)" ] && return 0; sleep 0.5; done
  say "(no $NODE_EXE under ros2 launch $LAUNCH_PID)"; return 1
}
# lifecycle VERB ARGS...: `ros2 lifecycle`, retried while discovery has not seen the node.
lifecycle() {
  local out
  for _ in 1 2 3 4 5; do
    out="$(ros2 lifecycle "$@" 2>&1)" || true
    grep -q "Node not found" <<<"$out" || break
    sleep 1
  done
  say "\$ ros2 lifecycle $*"; say "$out"
}
wait_state() {  # wait_state NODE LABEL: poll `ros2 lifecycle get` (up to 20 s)
  for _ in $(seq 20); do
    ros2 lifecycle get "$1" 2>/dev/null | grep -q "^$2 " && return 0
    sleep 1
  done
  say "(NOT $2 after 20 s)"; return 1
}
stop_launch() {
  say "\$ kill -INT <ros2 launch>   # Ctrl-C"
  kill -INT "$LAUNCH_PID" 2>/dev/null || true
  for _ in $(seq 40); do kill -0 "$LAUNCH_PID" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$LAUNCH_PID" 2>/dev/null && { kill -TERM "$LAUNCH_PID"; say "(ros2 launch still running after 20 s: SIGTERM)"; }
  local rc=0
  wait "$LAUNCH_PID" 2>/dev/null || rc=$?
  say "(ros2 launch exited with $rc; its output:)"
  sed "s|$SHARE|<share>|g; s|$PKG|<prefix>|g; s|$ROOT/||g; s|$RUN/||g; s|^|    |" "$RUN/launch.log" | tee -a "$OUT"
  LAUNCH_PID=""
}
respawn_check() {  # SIGKILL the node, expect a new process
  local old new
  old="$(node_pid)"
  say "\$ kill -KILL <vision_preproc_node pid>"
  kill -KILL "$old"
  for _ in $(seq 40); do new="$(node_pid)"; [ -n "$new" ] && [ "$new" != "$old" ] && break; sleep 0.5; done
  if [ -n "$new" ] && [ "$new" != "$old" ]; then say "(respawned: a new vision_preproc_node process)"; else say "(NOT respawned)"; return 1; fi
}
trap '[ -z "$LAUNCH_PID" ] || { kill -INT "$LAUNCH_PID"; sleep 3; kill -TERM "$LAUNCH_PID"; } 2>/dev/null; ros2 daemon stop >/dev/null 2>&1 || true' EXIT
# Each part on its own domain; `ros2 node list` and `ros2 topic list` ask the ros2 daemon
# of that domain (started on first use; stopped at the end of the part).
domain() {
  [ -z "${ROS_DOMAIN_ID:-}" ] || ros2 daemon stop >/dev/null 2>&1 || true
  export ROS_DOMAIN_ID=$((110 + RANDOM % 80))
  ros2 daemon start >/dev/null 2>&1 || true
}

say "# ros2 launch, for real ($(date -u +%F), launch/launch_ros from .ros/tools/sources.txt)"
PARTS=" ${PARTS:-1 2 3 4 5} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
if part 1; then
say ""
say "## 1. the arguments"
run ros2 launch vision_preproc preprocess.launch.py --show-args
fi

for file in preprocess.launch.py preprocess.launch.xml; do
  part 2 || continue
  domain
  say ""
  say "## 2. $file with every argument"
  launch vision_preproc "$file" namespace:=front config:="$SHARE/config/yolo_640_letterbox.yaml" \
    image:=/front_camera/image_raw camera_info:=/front_camera/camera_info backend:=cpu use_sim_time:=false \
    log_level:=info respawn:=true respawn_delay:=1.0
  wait_node; sleep 3
  param get /front/vision_preproc tensor_name
  param get /front/vision_preproc backend
  run ros2 node list
  run ros2 topic list -t
  respawn_check; sleep 3
  param get /front/vision_preproc network_image_width
  stop_launch
done

if part 3; then
domain
say ""
say "## 3. four_cameras.launch.py with every argument"
launch vision_preproc four_cameras.launch.py namespace:=rig config:="$SHARE/config/four_cameras_640.yaml" \
  front:=/cams/front/image_raw left:=/cams/left/image_raw right:=/cams/right/image_raw rear:=/cams/rear/image_raw \
  log_level:=info
wait_node; sleep 3
param get /rig/vision_preproc inputs
run ros2 topic list
stop_launch
fi

if part 4; then
domain
say ""
say "## 4. a robot's bringup: examples/robot_bringup.launch.py, a bag played with --clock"
run ros2 launch vision_preproc robot_bringup.launch.py --show-args
launch vision_preproc robot_bringup.launch.py bag:="$BAG" use_sim_time:=true
wait_node; sleep 4
param get /robot1/perception/vision_preproc use_sim_time
param get /robot1/perception/vision_preproc tensor_name
param get /robot1/perception/vision_preproc network_image_height
param get /robot1/perception/vision_preproc gpu_failure_policy
run ros2 node list
run ros2 topic list
run timeout 10 ros2 topic echo --once /clock
run timeout 15 ros2 topic echo --once --field header /robot1/perception/timing
run timeout 15 ros2 topic echo --once --field age_us /robot1/perception/timing
respawn_check; sleep 4
run timeout 15 ros2 topic echo --once --field sequence /robot1/perception/timing
stop_launch
fi
if part 5; then
domain
NODE_EXE=vision_preproc_lifecycle_node
N=/front/vision_preproc
say ""
say "## 5. the managed node: lifecycle.launch.py (launch_ros LifecycleNode) and ros2 lifecycle"
run ros2 launch vision_preproc lifecycle.launch.py --show-args
launch vision_preproc lifecycle.launch.py namespace:=front config:="$SHARE/config/yolo_640_letterbox.yaml" \
  image:=/camera/image_raw camera_info:=/camera/camera_info
wait_node; wait_state "$N" active
lifecycle nodes
lifecycle get "$N"
lifecycle list "$N"
say "\$ vision_preproc play <sample bag> --loop --image-topic /camera/image_raw --camera-info-topic /camera/camera_info &"
set -m
"$PKG/lib/vision_preproc/vision_preproc" play "$BAG" --loop --image-topic /camera/image_raw \
  --camera-info-topic /camera/camera_info >"$RUN/bag.log" 2>&1 &
BAG_PID=$!
set +m
run timeout 15 ros2 topic echo --once --field sequence /front/timing
say "\$ ros2 topic echo --field goal_state $N/transition_event &"
set -m
ros2 topic echo --field goal_state "$N/transition_event" >"$RUN/events.log" 2>&1 &
ECHO_PID=$!
set +m
sleep 3
lifecycle set "$N" deactivate
lifecycle get "$N"
run timeout 5 ros2 topic echo --once --field sequence /front/timing
say "(no tensor while inactive: the echo above timed out)"
lifecycle set "$N" activate
run timeout 15 ros2 topic echo --once --field sequence /front/timing
lifecycle set "$N" configure
say "(refused by ros2 lifecycle itself: it asks ~/get_available_transitions first)"
lifecycle set "$N" deactivate
lifecycle set "$N" cleanup
lifecycle get "$N"
lifecycle list "$N" --all
lifecycle set "$N" configure
lifecycle get "$N"
lifecycle set "$N" activate
lifecycle get "$N"
sleep 2
kill -INT "$ECHO_PID" "$BAG_PID" 2>/dev/null || true
wait "$ECHO_PID" "$BAG_PID" 2>/dev/null || true
say "(the transition events' goal states, as the echo above printed them:)"
sed 's/^/    /' "$RUN/events.log" | tee -a "$OUT"
stop_launch
domain
say ""
say "## 5b. lifecycle.launch.py autostart:=false: unconfigured until told"
launch vision_preproc lifecycle.launch.py autostart:=false
wait_node; sleep 3
lifecycle get /vision_preproc
lifecycle set /vision_preproc configure
lifecycle set /vision_preproc activate
lifecycle get /vision_preproc
lifecycle set /vision_preproc shutdown
say "(shutdown finalizes the node and its process exits 0, as on SIGINT:)"
lifecycle get /vision_preproc
stop_launch
fi
say ""
say "# done"
