#!/usr/bin/env bash
# The ROS 2 tools that PyPI does not carry, brought next to this checkout's ROS 2 (the
# Kilted wheels of .ros/venv): rqt and its plugins, ros2cli (`ros2 topic/param/node/lifecycle`),
# launch, launch_ros and ros2launch (`ros2 launch`). Used by scripts/rostools/rqt_check.sh and
# scripts/rostools/launch_check.sh; `make test` uses none of it.
#
#   scripts/rostools/ros_tools_setup.sh          # idempotent; a second run takes a few seconds
#   source .ros/tools/env.sh            # after .ros/env.sh: ros2, rqt on PATH
#
# What it does (docs/WATCHING.md, "How the screens were taken"):
# 1. apt: xvfb and the xcb libraries PyQt5's xcb platform plugin needs on Debian 12.
# 2. pip --target .ros/tools/pylib --no-deps: PyQt5 (Qt 5.15) and the small Python modules
#    the tools import (psutil, rospkg, distro, osrf_pycommon); the project venv is not
#    touched.
# 3. Sources: each repository of REPOS below at its branch, into $ROS_TOOLS_SRC
#    (default .ros/tools/src/<owner>+<name>): cloned from github.com when it can be
#    reached, else from a mirror folder $ROS_TOOLS_MIRROR/<owner>+<name>/repo (a bare git
#    directory; default /work/.mirror). An existing checkout is left as it is.
# 4. An ament prefix .ros/tools/prefix made by copying the Python packages
#    (scripts/rostools/ros_tools_prefix.py): nothing is compiled.
# 5. composition_interfaces (launch_ros imports it at start; it has no wheel): generated
#    with rosidl like msgs/, its C parts compiled once (colcon, ~1 min on 2 cores).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
TOOLS="$ROOT/.ros/tools"
SRC="${ROS_TOOLS_SRC:-$TOOLS/src}"
MIRROR="${ROS_TOOLS_MIRROR:-/work/.mirror}"
PREFIX="$TOOLS/prefix"
PYLIB="$TOOLS/pylib"

# repository  branch  package folders (relative to the repository; . = its root)
REPOS=(
  "ros-visualization/python_qt_binding  rolling  ."
  "ros-visualization/qt_gui_core        rolling  qt_gui qt_gui_py_common"
  "ros-visualization/rqt                rolling  rqt_gui rqt_gui_py rqt_py_common"
  "ros-visualization/rqt_topic          rolling  ."
  "ros-visualization/rqt_plot           rolling  ."
  "ros-visualization/rqt_console        rolling  ."
  "ros-visualization/rqt_runtime_monitor rolling ."
  "ros-visualization/rqt_robot_monitor  ros2     ."
  "ros-visualization/rqt_reconfigure    rolling  ."
  "ros2/rosidl_runtime_py               rolling  ."
  "ros2/ros2cli                         rolling  ros2cli ros2topic ros2node ros2param ros2pkg ros2run ros2service ros2lifecycle"
  "ros2/launch                          rolling  launch launch_xml launch_yaml"
  "ros2/launch_ros                      rolling  launch_ros ros2launch"
  "ros2/rcl_interfaces                  rolling  composition_interfaces"
  "ros/diagnostics                      ros2     diagnostic_aggregator"
)
PIP_PACKAGES=(PyQt5==5.15.11 PyQt5-Qt5==5.15.19 PyQt5-sip==12.20.0 psutil==7.2.2 rospkg==1.6.3 distro==1.9.0
              osrf-pycommon==2.0.2)
APT_PACKAGES=(xvfb x11-utils libxcb-icccm4 libxcb-keysyms1 libxcb-xinerama0 libxcb-image0 libxcb-randr0
              libxcb-render-util0 libxcb-shape0 libxcb-xkb1 libxkbcommon-x11-0 tango-icon-theme fonts-dejavu-core)

# shellcheck disable=SC1091
source .ros/env.sh
mkdir -p "$TOOLS" "$SRC"

missing=()
for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "ros_tools: apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

stamp="$TOOLS/pylib.stamp"
if [ "$(cat "$stamp" 2>/dev/null)" != "${PIP_PACKAGES[*]}" ]; then
  echo "ros_tools: pip install --target $PYLIB ${PIP_PACKAGES[*]}"
  rm -rf "$PYLIB"
  python3 -m pip install -q --no-deps --target "$PYLIB" "${PIP_PACKAGES[@]}"
  echo "${PIP_PACKAGES[*]}" >"$stamp"
fi

github_ok=""
timeout 8 git ls-remote https://github.com/ros2/launch HEAD >/dev/null 2>&1 && github_ok=1
pkg_dirs=()
cmake_pkgs=()
for line in "${REPOS[@]}"; do
  read -r repo branch folders <<<"$line"
  dest="$SRC/${repo/\//+}"
  if [ ! -d "$dest/.git" ]; then
    if [ -n "$github_ok" ]; then url="https://github.com/$repo"; else url="$MIRROR/${repo/\//+}/repo"; fi
    echo "ros_tools: git clone $url ($branch)"
    git clone -q --depth 1 --branch "$branch" "${github_ok:+}$( [ -n "$github_ok" ] || echo file://)$url" "$dest"
  fi
  for f in $folders; do
    case "$f" in
      composition_interfaces) cmake_pkgs+=("$dest/$f") ;;
      diagnostic_aggregator) ;;  # C++ (rclcpp, pluginlib): source only, see docs/WATCHING.md
      *) pkg_dirs+=("$dest/$f") ;;
    esac
  done
done
{ for line in "${REPOS[@]}"; do read -r repo _ <<<"$line"; git -C "$SRC/${repo/\//+}" log -1 --format="$repo %H"; done; } \
  >"$TOOLS/sources.txt"

if [ "$(cat "$TOOLS/prefix.stamp" 2>/dev/null)" != "$(cat "$TOOLS/sources.txt" "$ROOT/scripts/rostools/ros_tools_prefix.py" | sha1sum)" ]; then
  echo "ros_tools: ament prefix $PREFIX (copying ${#pkg_dirs[@]} packages)"
  rm -rf "$PREFIX"
  PYTHONPATH="$PYLIB:$PYTHONPATH" python3 scripts/rostools/ros_tools_prefix.py "$PREFIX" "${pkg_dirs[@]}"
  cat "$TOOLS/sources.txt" "$ROOT/scripts/rostools/ros_tools_prefix.py" | sha1sum >"$TOOLS/prefix.stamp"
fi

# composition_interfaces: a real interface package (three services), built with colcon
# as setup.sh builds msgs/, into its own install base.
if [ ! -f "$TOOLS/interfaces/share/composition_interfaces/package.xml" ]; then
  echo "ros_tools: colcon build composition_interfaces"
  colcon --log-base "$TOOLS/log" build --base-paths "${cmake_pkgs[@]}" --build-base "$TOOLS/build" \
    --install-base "$TOOLS/interfaces" --merge-install --event-handlers console_cohesion- \
    --cmake-args -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$(command -v python3)" >"$TOOLS/colcon.log" 2>&1 \
    || { tail -30 "$TOOLS/colcon.log"; exit 1; }
fi

cat >"$TOOLS/env.sh" <<EOF
# Generated by scripts/rostools/ros_tools_setup.sh. Source after .ros/env.sh: ros2 (launch, topic,
# param, node, pkg, run, service) and rqt from .ros/tools.
export PATH="$PREFIX/bin\${PATH:+:\$PATH}"
export PYTHONPATH="$PREFIX/lib/$(python3 -c 'import sys; print(f"python{sys.version_info.major}.{sys.version_info.minor}")')/site-packages:$TOOLS/interfaces/lib/python3.11/site-packages:$PYLIB\${PYTHONPATH:+:\$PYTHONPATH}"
export AMENT_PREFIX_PATH="$PREFIX:$TOOLS/interfaces\${AMENT_PREFIX_PATH:+:\$AMENT_PREFIX_PATH}"
export LD_LIBRARY_PATH="$TOOLS/interfaces/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
EOF
echo "ros_tools: ready (source .ros/env.sh && source .ros/tools/env.sh)"
