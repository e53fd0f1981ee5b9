#!/usr/bin/env bash
# The CUDA backend on the GPU machine, remote side (THERE, from the repository root, after
# scripts/gpu_backend_stage.sh staged the binaries and this script into .device/):
#   bash .device/gpu_backend_remote.sh smoke   # context, both memory modes, start-up with the
#                                      # embedded cubin / PTX / NVRTC side by side, parity
#                                      # samples under each, tool presence
#   bash .device/gpu_backend_remote.sh full    # full parity, compute-sanitizer memcheck and
#                                      # racecheck, the benchmark (results.json)
#   bash .device/gpu_backend_remote.sh reliability   # GPU fault drill (gpu_failure_policy with a
#                                      # real injected fault), the edge cases (parity,
#                                      # memcheck, initcheck), memcheck over the matrix
# Logs and results go to $OUT (or /tmp/vp_out). Never changes GPU clocks or settings.
set -uo pipefail
D="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-/tmp/vp_out}"
mkdir -p "$OUT"
MODE="${1:-smoke}"
RACE_STRIDE="${RACE_STRIDE:-6}"
export VISION_PREPROC_KERNEL_CACHE=/tmp/vp_kernel_cache
status=0
section() { printf '\n==== %s ====\n' "$*"; }
gpu_state() {
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu \
        --format=csv 2>&1
}
section "machine ($(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(cat "$D/COMMIT" 2>/dev/null))"
gpu_state
command -v compute-sanitizer && compute-sanitizer --version | tail -1

if [[ "$MODE" == smoke ]]; then
    {
    section "info (backend auto)"
    "$D/vision_preproc" info || status=1
    section "start-up, side by side, each in a fresh process with an empty kernel cache:"
    echo "embedded cubin (default) | embedded PTX (driver JIT) | NVRTC at start-up (VISION_PREPROC_KERNELS=nvrtc: what every earlier release did)"
    for i in 1 2 3; do
        for policy in auto ptx nvrtc; do
            rm -rf /tmp/vp_startup
            echo "-- $policy, run $i"
            VISION_PREPROC_KERNELS=$policy "$D/vision_preproc" bench --startup /tmp/vp_startup --hold-ms 1 \
                | python3 -c 'import json, sys
for line in sys.stdin:
    if line.startswith("startup-json: "):
        r = json.loads(line[len("startup-json: "):])
        print("kernels:", [(k["file"], k["origin"], round(k["compile_ms"], 1)) for k in r["kernels"]])
    else:
        print(line, end="")' || status=1
        done
    done
    section "start-up: process start -> backend ready, timed from outside (empty cache)"
    for policy in auto nvrtc; do
        rm -rf /tmp/vp_startup
        t0=$(date +%s.%N)
        VISION_PREPROC_KERNELS=$policy "$D/vision_preproc" bench --startup /tmp/vp_startup >/dev/null || status=1
        echo "$policy: whole process (start, context, kernels, one frame, 100 frames, exit) $(echo "$(date +%s.%N) - $t0" | bc) s"
    done
    } 2>&1 | tee "$OUT/smoke.log"
    section "parity sample with the embedded PTX (every ${SMOKE_STRIDE:-9}th case)"
    VISION_PREPROC_KERNELS=ptx "$D/gpu_parity" --stride "${SMOKE_STRIDE:-9}" >"$OUT/parity_ptx.log" 2>&1 || status=1
    grep -v '^ok ' "$OUT/parity_ptx.log" | cut -c1-200 | tail -5
    section "parity sample with NVRTC at start-up (every ${SMOKE_STRIDE:-9}th case)"
    VISION_PREPROC_KERNELS=nvrtc "$D/gpu_parity" --stride "${SMOKE_STRIDE:-9}" >"$OUT/parity_nvrtc.log" 2>&1 || status=1
    grep -v '^ok ' "$OUT/parity_nvrtc.log" | cut -c1-200 | tail -5
    section "parity sample (every ${SMOKE_STRIDE:-9}th case, both memory modes)"
    "$D/gpu_parity" --stride "${SMOKE_STRIDE:-9}" >"$OUT/parity_smoke.log" 2>&1 || status=1
    grep -v '^ok ' "$OUT/parity_smoke.log" | cut -c1-200 | tail -25
    section "short benchmark (${BENCH_ITERS:-200} iterations, with variants)"
    "$D/vision_preproc" bench --iterations "${BENCH_ITERS:-200}" --warmup 20 --variants --out "$OUT/results_smoke.json" >"$OUT/bench_smoke.log" 2>&1 || status=1
    cut -c1-60,90-200 "$OUT/bench_smoke.log"
    gpu_state
    exit $status
fi

if [[ "$MODE" == reliability ]]; then
    section "GPU fault drill: gpu_failure_policy with a real injected fault (test/gpu_fault.rs)"
    timeout "${FAULT_TIMEOUT:-90}" "$D/gpu_fault" 2>&1 | tee "$OUT/gpu_fault.log"
    rc=${PIPESTATUS[0]}; echo "gpu_fault exit $rc"; [[ $rc == 0 ]] || status=1
    section "parity: edge cases (minimum sizes, ROI on the last pixel, conv2d 15x15 on tiny images)"
    timeout "${PARITY_TIMEOUT:-60}" "$D/gpu_parity" --filter edge >"$OUT/parity_edge.log" 2>&1
    rc=$?; echo "parity exit $rc"; [[ $rc == 0 ]] || status=1
    grep -v '^ok ' "$OUT/parity_edge.log" | cut -c1-240 | tail -12
    echo "cases ok: $(grep -c '^ok ' "$OUT/parity_edge.log")"
    for tool in memcheck initcheck; do
        section "compute-sanitizer $tool: edge cases"
        timeout "${SANITIZER_TIMEOUT:-120}" compute-sanitizer --tool "$tool" --error-exitcode 3 \
            "$D/gpu_parity" --filter edge >"$OUT/${tool}_edge.log" 2>&1
        rc=$?; echo "$tool exit $rc (3: errors found, 124: timed out)"; [[ $rc == 0 ]] || status=1
        grep -E '^========= (ERROR SUMMARY|LEAK SUMMARY)|Invalid|out of bounds|Uninitialized' "$OUT/${tool}_edge.log" | sort | uniq -c | head
        grep 'gpu_parity summary' "$OUT/${tool}_edge.log"
        echo "cases checked: $(grep -c '^ok ' "$OUT/${tool}_edge.log")"
    done
    section "compute-sanitizer memcheck: the whole matrix, every ${MEMCHECK_STRIDE:-1} case(s)"
    timeout "${MEMCHECK_TIMEOUT:-150}" compute-sanitizer --tool memcheck --error-exitcode 3 \
        "$D/gpu_parity" --stride "${MEMCHECK_STRIDE:-1}" >"$OUT/memcheck_all.log" 2>&1
    rc=$?; echo "memcheck exit $rc (3: errors found, 124: timed out)"; [[ $rc == 0 ]] || status=1
    grep -E '^========= (ERROR SUMMARY|LEAK SUMMARY)|Invalid|out of bounds' "$OUT/memcheck_all.log" | sort | uniq -c | head
    grep 'gpu_parity summary' "$OUT/memcheck_all.log"
    echo "cases checked: $(grep -c '^ok ' "$OUT/memcheck_all.log")"
    gpu_state
    exit $status
fi

section "start-up: cold (empty cache), then warm (cached), separate processes"
rm -rf /tmp/vp_startup
for i in 1 2 3; do "$D/vision_preproc" bench --startup /tmp/vp_startup 2>&1 | tee -a "$OUT/startup.log" || status=1; done

section "parity: full matrix (3 backends: upload/direct, mapped/direct, upload/staged)"
timeout "${PARITY_TIMEOUT:-150}" "$D/gpu_parity" >"$OUT/parity.log" 2>&1
echo "parity exit $?"
grep -v '^ok ' "$OUT/parity.log" | cut -c1-240 | tail -30
echo "cases ok: $(grep -c '^ok ' "$OUT/parity.log")"

section "compute-sanitizer memcheck: every ${MEMCHECK_STRIDE:-4}th case"
timeout "${MEMCHECK_TIMEOUT:-150}" compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$D/gpu_parity" --stride "${MEMCHECK_STRIDE:-4}" >"$OUT/memcheck.log" 2>&1
echo "memcheck exit $? (3: errors found, 124: timed out)"
grep -E '^========= (ERROR SUMMARY|LEAK SUMMARY)|Invalid|out of bounds' "$OUT/memcheck.log" | sort | uniq -c | head
grep 'gpu_parity summary' "$OUT/memcheck.log"
echo "cases checked: $(grep -c '^ok ' "$OUT/memcheck.log")"

section "compute-sanitizer racecheck: every ${RACE_STRIDE}th case"
timeout "${RACE_TIMEOUT:-110}" compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 3 \
    "$D/gpu_parity" --stride "$RACE_STRIDE" >"$OUT/racecheck.log" 2>&1
echo "racecheck exit $? (3: hazards found, 124: timed out)"
grep -E '^========= (RACECHECK SUMMARY|ERROR SUMMARY)|Error|Warning' "$OUT/racecheck.log" | sort | uniq -c | head
grep 'gpu_parity summary' "$OUT/racecheck.log"
echo "cases checked: $(grep -c '^ok ' "$OUT/racecheck.log") (staged: $(grep -c 'Staged\].*staged$' "$OUT/racecheck.log"), conv: $(grep -c '^ok .*conv' "$OUT/racecheck.log"))"

section "benchmark (1000 timed iterations per figure, variants)"
gpu_state
timeout "${BENCH_TIMEOUT:-170}" "$D/vision_preproc" bench --variants --out "$OUT/results.json" >"$OUT/bench.log" 2>&1 || status=1
cat "$OUT/bench.log"
gpu_state
exit $status
