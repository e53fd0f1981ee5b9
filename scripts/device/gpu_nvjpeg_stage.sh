#!/usr/bin/env bash
# nvJPEG on the GPU machine, stage side (HERE, on the build machine): build the CLI (with
# `bench-decode`) and the test binaries gpu_nvjpeg and gpu_parity (with the test hooks:
# poisoned outputs) without ROS, write the JPEG cases
# (scripts/device/make_jpeg_cases.py: OpenCV and Pillow encodes of test/data's
# photographs, and the 1080p frame of the benchmark), and pack them with
# scripts/device/gpu_nvjpeg_remote.sh, which runs THERE:
#
#   scripts/device/gpu_nvjpeg_stage.sh [STAGE_DIR]      # default: <repo>/.device/nvjpeg
#   # then on the GPU machine, from the repository root (STAGE_DIR carried):
#   bash STAGE_DIR/gpu_nvjpeg_remote.sh                 # prints everything; logs under $OUT
#
# The GPU machine needs no Rust, no ROS and no CUDA toolkit for this: libnvjpeg is loaded
# at run time (there: /usr/local/cuda's libnvjpeg.so.13).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
STAGE="${1:-$ROOT/.device/nvjpeg}"
if [[ -f .ros/env.sh ]]; then
    # shellcheck disable=SC1091
    source .ros/env.sh
fi
# Own target dir: a no-ROS build must not overwrite the ROS build in target/release.
FEATURES=(--release --no-default-features --features cuda,bench,fault-injection,bundled-sqlite --target-dir "${GPU_TARGET_DIR:-target/gpu}")
cargo build "${FEATURES[@]}" --bin vision_preproc
# shellcheck source=scripts/device/test_binary.sh
source "$ROOT/scripts/device/test_binary.sh"
TEST="$(test_binary gpu_nvjpeg)"
PARITY="$(test_binary gpu_parity)"
rm -rf "$STAGE" && mkdir -p "$STAGE/pack/cases"
cp "${GPU_TARGET_DIR:-target/gpu}/release/vision_preproc" "$STAGE/pack/vision_preproc"
cp "$TEST" "$STAGE/pack/gpu_nvjpeg"
cp "$PARITY" "$STAGE/pack/gpu_parity"
strip --strip-debug "$STAGE/pack/vision_preproc" "$STAGE/pack/gpu_nvjpeg" "$STAGE/pack/gpu_parity" 2>/dev/null || true
PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" python3 scripts/device/make_jpeg_cases.py "$STAGE/pack/cases"
cp scripts/device/gpu_nvjpeg_remote.sh "$STAGE/pack/"
git rev-parse HEAD >"$STAGE/pack/COMMIT"
tar cJf "$STAGE/gpu_nvjpeg.tar.xz" -C "$STAGE/pack" .
cp scripts/device/gpu_nvjpeg_remote.sh "$STAGE/"
rm -rf "$STAGE/pack"
du -sh "$STAGE" "$STAGE/gpu_nvjpeg.tar.xz"
