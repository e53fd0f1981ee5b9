#!/usr/bin/env bash
# Hardware-decoded video on the GPU machine, stage side (HERE, on the build machine): build
# the test binary gpu_video (test/gpu_video.rs) and the CLI without ROS (features cuda,
# gstreamer), make the clips and their oracle (scripts/device/make_video_clips.py: x264enc /
# x265enc here, PyAV's decoded frames hashed), bundle Debian's GStreamer with the nvcodec
# and videoparsersbad plugins (scripts/device/gst_bundle.sh, GST_BUNDLE_NVCODEC=1), and pack
# them with scripts/device/gpu_video_remote.sh, which runs THERE:
#
#   VIDEO_PYTHON=/path/to/python-with-av scripts/device/gpu_video_stage.sh [STAGE_DIR]
#   #   default STAGE_DIR <repo>/.device/video; VIDEO_PYTHON default python3 (needs `av`, numpy)
#   # then on the GPU machine, from the repository root (STAGE_DIR carried):
#   bash STAGE_DIR/gpu_video_remote.sh            # prints everything; logs under $OUT
#
# The GPU machine needs no Rust, no ROS, no GStreamer and no CUDA toolkit for this: the
# bundle carries GStreamer; nvcodec loads the driver's libcuda and libnvcuvid.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
STAGE="${1:-$ROOT/.device/video}"
if [[ -f .ros/env.sh ]]; then
    # shellcheck disable=SC1091
    source .ros/env.sh
fi
TARGET="${GPU_TARGET_DIR:-target/gpu-video}"
FEATURES=(--release --no-default-features --features cuda,gstreamer,bundled-sqlite --target-dir "$TARGET")
cargo build "${FEATURES[@]}" --bin vision_preproc
# shellcheck source=scripts/device/test_binary.sh
source "$ROOT/scripts/device/test_binary.sh"
TEST="$(test_binary gpu_video)"
[[ -x "$TEST" ]] || { echo "gpu_video_stage: the test binary gpu_video was not built"; exit 1; }
rm -rf "$STAGE" && mkdir -p "$STAGE/pack/clips"
cp "$TARGET/release/vision_preproc" "$STAGE/pack/vision_preproc"
cp "$TEST" "$STAGE/pack/gpu_video"
strip --strip-debug "$STAGE/pack/vision_preproc" "$STAGE/pack/gpu_video" 2>/dev/null || true
"${VIDEO_PYTHON:-python3}" scripts/device/make_video_clips.py "$STAGE/pack/clips"
GST_BUNDLE_NVCODEC=1 GST_BUNDLE_BINS="$STAGE/pack/gpu_video $STAGE/pack/vision_preproc" \
    scripts/device/gst_bundle.sh "$STAGE/gst"
mv "$STAGE/gst.tar.xz" "$STAGE/pack/gst.tar.xz" && rm -rf "$STAGE/gst"
cp scripts/device/gpu_video_remote.sh "$STAGE/pack/"
git rev-parse HEAD >"$STAGE/pack/COMMIT"
tar cJf "$STAGE/gpu_video.tar.xz" -C "$STAGE/pack" .
cp scripts/device/gpu_video_remote.sh "$STAGE/"
rm -rf "$STAGE/pack"
du -sh "$STAGE" "$STAGE/gpu_video.tar.xz"
