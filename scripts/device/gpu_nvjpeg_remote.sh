#!/usr/bin/env bash
# nvJPEG on the GPU machine, remote side (THERE, after scripts/device/gpu_nvjpeg_stage.sh
# staged gpu_nvjpeg.tar.xz beside this script):
#   bash <stage>/gpu_nvjpeg_remote.sh [all|test|bench]
# test: test/gpu_nvjpeg.rs over every case (parity with the CPU decoder, batches, damaged
# JPEGs, the CUDA backend on compressed frames against the CPU backend), `info`, a
# gpu_parity sample, then gpu_nvjpeg again under compute-sanitizer memcheck (--quick); bench: `bench-decode` on
# the 1080p q90 frame (1 and 4 cameras, twice: the noise) and the 720p 4:2:2 one. Logs to
# $OUT (or /tmp/vp_out); the sanitizer run last (the slowest). BENCH_RUNS (default 2),
# BENCH_ITERS (100), TEST_TIMEOUT, SANITIZER_TIMEOUT. Never changes GPU clocks or settings.
set -uo pipefail
S="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-/tmp/vp_out}"
MODE="${1:-all}"
D=/tmp/vp_nvjpeg
rm -rf "$D" && mkdir -p "$D" "$OUT" && tar xJf "$S/gpu_nvjpeg.tar.xz" -C "$D" || exit 1
status=0
section() { printf '\n==== %s ====\n' "$*"; }
gpu_state() {
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
        --format=csv,noheader 2>&1
}
section "machine ($(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(cat "$D/COMMIT"))"
gpu_state
ls -l /usr/local/cuda/lib64/libnvjpeg.so* 2>&1 | head -3
command -v compute-sanitizer >/dev/null && compute-sanitizer --version | tail -1
if [[ "$MODE" == all || "$MODE" == test ]]; then
    section "gpu_nvjpeg: every case against the CPU decoder, batches, damaged JPEGs"
    timeout "${TEST_TIMEOUT:-150}" "$D/gpu_nvjpeg" --cases "$D/cases" >"$OUT/gpu_nvjpeg.log" 2>&1
    rc=$?; echo "gpu_nvjpeg exit $rc"; [[ $rc == 0 ]] || status=1
    grep -vE '^(cv2|pil|mosaic|astronaut|chelsea|coffee|rocket|camera)_' "$OUT/gpu_nvjpeg.log" | cut -c1-300
fi
if [[ "$MODE" == all || "$MODE" == test ]]; then
    section "vision_preproc info (which decoder the CUDA backend uses)"
    "$D/vision_preproc" info 2>&1 | grep -vE '^(Fast DDS|GStreamer)' || status=1
    section "gpu_parity every ${PARITY_STRIDE:-9}th case (the raw-frame paths through the changed steps)"
    timeout "${PARITY_TIMEOUT:-90}" "$D/gpu_parity" --stride "${PARITY_STRIDE:-9}" >"$OUT/gpu_parity.log" 2>&1
    rc=$?; echo "gpu_parity exit $rc"; [[ $rc == 0 ]] || status=1
    grep -v '^ok ' "$OUT/gpu_parity.log" | cut -c1-220 | tail -8
    echo "cases ok: $(grep -c '^ok ' "$OUT/gpu_parity.log")"
fi
if [[ "$MODE" == all || "$MODE" == bench ]]; then
    for run in $(seq "${BENCH_RUNS:-2}"); do
        section "bench-decode mosaic_1080p_q90 (1080p, 4:2:0), run $run"
        gpu_state
        timeout 120 "$D/vision_preproc" bench-decode "$D/cases/mosaic_1080p_q90.jpg" --cameras 1,4 \
            --iterations "${BENCH_ITERS:-100}" 2>&1 | tee "$OUT/bench_decode_1080p_$run.log" || status=1
    done
    section "bench-decode mosaic_720p_q80_422 (720p, 4:2:2, an MJPEG camera's kind)"
    timeout 120 "$D/vision_preproc" bench-decode "$D/cases/mosaic_720p_q80_422.jpg" --cameras 1,4 \
        --iterations "${BENCH_ITERS:-100}" 2>&1 | tee "$OUT/bench_decode_720p.log" || status=1
    gpu_state
fi
if [[ "$MODE" == all || "$MODE" == test ]]; then
    section "compute-sanitizer memcheck: gpu_nvjpeg --quick"
    timeout "${SANITIZER_TIMEOUT:-150}" compute-sanitizer --tool memcheck --error-exitcode 3 \
        "$D/gpu_nvjpeg" --cases "$D/cases" --quick >"$OUT/memcheck.log" 2>&1
    rc=$?; echo "memcheck exit $rc (3: errors found, 124: timed out)"; [[ $rc == 0 ]] || status=1
    grep -E '^========= (ERROR SUMMARY|LEAK SUMMARY)|Invalid|out of bounds|gpu_nvjpeg summary' "$OUT/memcheck.log" | sort | uniq -c | head
fi
exit $status
