#!/usr/bin/env bash
# The CUDA backend on the GPU machine, stage side (HERE, on the build machine): build the
# CLI (with the benchmark) and the GPU test binaries (gpu_parity, gpu_fault; with the test
# hooks: features `bench`, `fault-injection`) without ROS, run the NVRTC compile test (no
# GPU needed), and stage what the GPU machine needs into a carry folder, with
# scripts/device/gpu_backend_remote.sh, which runs THERE:
#
#   scripts/device/gpu_backend_stage.sh [STAGE_DIR]          # default: <repo>/.device
#   # then on the GPU machine, from the repository root:
#   bash .device/gpu_backend_remote.sh smoke|full|reliability   # prints everything; results under $OUT
#
# The GPU machine needs no Rust and no ROS: the binaries embed the kernels (include_str!)
# and the test photographs, and load libcuda/libnvrtc at run time.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
STAGE="${1:-$ROOT/.device}"
if [[ -f .ros/env.sh ]]; then
    # shellcheck disable=SC1091
    source .ros/env.sh
fi
# Own target dir: a no-ROS build must not overwrite the ROS build in target/release.
# SQLite compiled in (bundled-sqlite): the GPU machine need not have libsqlite3.
FEATURES=(--release --no-default-features --features cuda,bench,fault-injection,bundled-sqlite --target-dir target/gpu)
cargo build "${FEATURES[@]}" --bin vision_preproc
cargo test "${FEATURES[@]}" --test nvrtc_compile
# The GPU test binaries (harness = false) without running them.
# shellcheck source=scripts/device/test_binary.sh
source "$ROOT/scripts/device/test_binary.sh"
PARITY="$(test_binary gpu_parity)"
FAULT="$(test_binary gpu_fault)"
mkdir -p "$STAGE"
cp target/gpu/release/vision_preproc "$STAGE/vision_preproc"
cp "$PARITY" "$STAGE/gpu_parity"
cp "$FAULT" "$STAGE/gpu_fault"
cp scripts/device/gpu_backend_remote.sh "$STAGE/gpu_backend_remote.sh"
strip --strip-debug "$STAGE/vision_preproc" "$STAGE/gpu_parity" "$STAGE/gpu_fault" 2>/dev/null || true
git rev-parse HEAD >"$STAGE/COMMIT"
# The three binaries are ~75 MB, over the device tool's 64 MiB carry: carry this ~10 MB
# archive instead and unpack it there (gpu_backend_remote.sh finds the binaries beside it).
tar cJf "$STAGE/gpu_backend.tar.xz" -C "$STAGE" vision_preproc gpu_parity gpu_fault gpu_backend_remote.sh COMMIT
ls -la "$STAGE"
du -sh "$STAGE" "$STAGE/gpu_backend.tar.xz"
