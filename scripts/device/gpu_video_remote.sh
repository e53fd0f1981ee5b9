#!/usr/bin/env bash
# Hardware-decoded video on the GPU machine, remote side (THERE, after
# scripts/device/gpu_video_stage.sh staged gpu_video.tar.xz beside this script):
#   bash <stage>/gpu_video_remote.sh [all|test|memcheck]
# test: which decoders GStreamer registers (gst-inspect-1.0 nvcodec), `vision_preproc info`,
# then test/gpu_video.rs over every clip in both memory modes (decoded NV12 equal to PyAV's,
# tensors equal to the CPU backend's, the ledger); memcheck: gpu_video --quick under
# compute-sanitizer memcheck. Logs to $OUT (or /tmp/vp_out). TEST_TIMEOUT,
# SANITIZER_TIMEOUT. Never changes GPU clocks or settings.
set -uo pipefail
S="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-/tmp/vp_out}"
MODE="${1:-all}"
D=/tmp/vp_video
rm -rf "$D" && mkdir -p "$D/gst" "$OUT" && tar xJf "$S/gpu_video.tar.xz" -C "$D" \
    && tar xJf "$D/gst.tar.xz" -C "$D/gst" || exit 1
# shellcheck disable=SC1091
source "$D/gst/env.sh"
export XDG_RUNTIME_DIR=/tmp  # GStreamer's GL library warns without it (harmless)
status=0
section() { printf '\n==== %s ====\n' "$*"; }
section "machine ($(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(cat "$D/COMMIT"))"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1
ls /usr/local/nvidia/lib64/libnvcuvid.so* /usr/lib/x86_64-linux-gnu/libnvcuvid.so* 2>/dev/null | head -2
command -v compute-sanitizer >/dev/null && compute-sanitizer --version | tail -1
section "GStreamer's nvcodec elements here (the registry is built once, before the sanitizer)"
gst-inspect-1.0 nvcodec 2>&1 | grep -E '^ +[a-z0-9]+:|elements|Version' | head -20
if [[ "$MODE" == all || "$MODE" == test ]]; then
    section "vision_preproc info"
    "$D/vision_preproc" info 2>&1 | grep -E '^(GStreamer|backend|GPU|cuda)' || status=1
    section "gpu_video: every clip, both memory modes"
    timeout "${TEST_TIMEOUT:-240}" "$D/gpu_video" --clips "$D/clips" >"$OUT/gpu_video.log" 2>&1
    rc=$?; echo "gpu_video exit $rc"; [[ $rc == 0 ]] || status=1
    cut -c1-300 "$OUT/gpu_video.log" | tail -40
fi
if [[ "$MODE" == all || "$MODE" == memcheck ]]; then
    section "compute-sanitizer memcheck: gpu_video --quick"
    timeout "${SANITIZER_TIMEOUT:-240}" compute-sanitizer --tool memcheck --error-exitcode 3 \
        "$D/gpu_video" --clips "$D/clips" --quick >"$OUT/memcheck.log" 2>&1
    rc=$?; echo "memcheck exit $rc (3: errors found, 124: timed out)"; [[ $rc == 0 ]] || status=1
    grep -E '^========= (ERROR SUMMARY|LEAK SUMMARY)|Invalid|out of bounds|gpu_video summary|FAIL' \
        "$OUT/memcheck.log" | sort | uniq -c | head -20
fi
exit $status
