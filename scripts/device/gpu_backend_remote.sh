#!/usr/bin/env bash
# The CUDA backend on the GPU machine, remote side (THERE, from the repository root, after
# scripts/device/gpu_backend_stage.sh staged the binaries and this script into .device/):
#   bash .device/gpu_backend_remote.sh smoke   # context, both memory modes, start-up with the
#                                      # embedded cubin / PTX / NVRTC side by side, parity
#                                      # samples under each, tool presence
#   bash .device/gpu_backend_remote.sh full    # full parity, compute-sanitizer memcheck and
#                                      # racecheck, the benchmark (results.json); NO_STARTUP=1,
#                                      # NO_BENCH=1 leave parts out, FAULT=1 adds the fault drill
#   bash .device/gpu_backend_remote.sh reliability   # GPU fault drill (gpu_failure_policy with a
#                                      # real injected fault), the edge cases (parity,
#                                      # memcheck, initcheck), memcheck over the matrix
#   bash .device/gpu_backend_remote.sh nvtx    # Nsight Compute's NVTX filter on the frame
#                                      # and stage ranges (src/nvtx.rs): "preprocess/" must
#                                      # profile exactly the fused kernels, "conv/" the
#                                      # conv2d ones, a range that does not exist none
#   bash .device/gpu_backend_remote.sh compare # the previous release's CLI ($D/prev_vision_preproc,
#                                      # PREV_COMMIT) against this one, alternated, twice: the
#                                      # 4K kernel figures (bench --cases 2, no conv sizes)
#                                      # and bench-batch (4 x 1080p: batch kernels / one
#                                      # frame's, rates with 1 and 2 in flight)
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
        echo "$policy: whole process (start, context, kernels, one frame, 100 frames, exit) $(python3 -c "import sys; print(round(float(sys.argv[1]) - float(sys.argv[2]), 2))" "$(date +%s.%N)" "$t0") s"
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

if [[ "$MODE" == nvtx ]]; then
    # ncu sets NVTX_INJECTION64_PATH itself; the binary loads the NVTX library only then.
    # This machine has no CUDA 12 libnvToolsExt.so.1 of its own for certain: take whichever
    # NVTX v2 library is here (the toolkit's, or a wheel's under torch/cupy).
    if [[ -z "${VISION_PREPROC_NVTX_LIBRARY:-}" ]]; then
        roots=(/usr/local/cuda*/ /usr/lib/ /opt/ $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null))
        VISION_PREPROC_NVTX_LIBRARY="$(find "${roots[@]}" \( -name 'libnvToolsExt.so.1' -o -name 'libnvtx3interop.so.1' \) 2>/dev/null | head -1)"
    fi
    export VISION_PREPROC_NVTX_LIBRARY
    section "NVTX library: ${VISION_PREPROC_NVTX_LIBRARY:-none found}"
    [[ -n "$VISION_PREPROC_NVTX_LIBRARY" ]] || { echo "no libnvToolsExt.so.1 / libnvtx3interop.so.1 on this machine"; exit 1; }
    command -v ncu >/dev/null || { echo "ncu not found"; exit 1; }
    ncu --version | tail -1
    IMG="$D/../test/data/chelsea.png"
    # One frame through the CUDA backend with conv2d: frame 1 = resize_normalize_rgb8 + conv2d.
    APP=("$D/vision_preproc" run-file "$IMG" -o /tmp/vp_nvtx.npy --set backend=cuda --set conv.kernel=gaussian)
    # profiled NAME FILTER EXPECT: the kernels ncu profiles under --nvtx-include FILTER (one
    # name a line, from its CSV; logs $OUT/ncu_nvtx_NAME.log), and a check that there is at
    # least one and every one matches the regex EXPECT (none at all when EXPECT is empty).
    profiled() {
        local name="$1" filter="$2" expect="$3" log="$OUT/ncu_nvtx_$1.log"
        section "ncu --nvtx --nvtx-include \"$filter\" (expect: ${expect:-no kernel})"
        ncu --nvtx --nvtx-include "$filter" --metrics gpu__time_duration.sum --csv \
            --log-file "$log" "${APP[@]}" >"$OUT/app_nvtx_$name.log" 2>&1
        echo "ncu exit $?"
        python3 - "$log" "$expect" <<'PY' || status=1
import csv, re, sys
lines = open(sys.argv[1]).read().splitlines()
start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
rows = list(csv.DictReader(lines[start:])) if start is not None else []
kernels = sorted({(r["ID"], r["Kernel Name"]) for r in rows}, key=lambda k: int(k[0]))
for k in kernels:
    print("profiled:", k[1])
print(f"{len(kernels)} kernel(s) profiled")
for l in lines:
    if l.startswith("==WARNING==") or l.startswith("==ERROR=="):
        print(l)
expect = sys.argv[2]
bad = [k for k in kernels if not expect or not re.search(expect, k[1])]
if bad or (expect and not kernels):
    sys.exit(f"FAIL: expected only kernels matching {expect!r}, got {[k[1] for k in kernels]}")
print("ok")
PY
    }
    profiled preprocess "preprocess/" '^resize_normalize_'
    profiled conv "conv/" '^conv2d_'
    profiled frame1 "frame 1/" '^(resize_normalize_|conv2d_)'
    profiled none "no-such-range/" ''
    section "every kernel with the NVTX ranges ncu saw around it (no filter)"
    ncu --nvtx --metrics gpu__time_duration.sum --log-file "$OUT/ncu_nvtx_all.log" "${APP[@]}" >/dev/null 2>&1
    grep -E '^  [a-z_0-9]+\(|Push/Pop|<[0-9]+,|RangeName' "$OUT/ncu_nvtx_all.log" | head -40
    gpu_state
    exit $status
fi

if [[ "$MODE" == compare ]]; then
    [[ -x "$D/prev_vision_preproc" ]] || { echo "no $D/prev_vision_preproc"; exit 1; }
    for run in 1 2; do
        for rel in prev new; do
            bin="$D/vision_preproc"; [[ $rel == prev ]] && bin="$D/prev_vision_preproc"
            section "$rel ($([[ $rel == prev ]] && echo "${PREV_COMMIT:-?}" || cat "$D/COMMIT")), run $run: bench --cases 2 --conv-sizes 0 --iterations ${BENCH_ITERS:-500}"
            gpu_state | tail -1
            "$bin" bench --cases 2 --conv-sizes 0 --iterations "${BENCH_ITERS:-500}" --warmup 50 \
                --out "$OUT/results_${rel}_$run.json" >"$OUT/bench_${rel}_$run.log" 2>&1 || status=1
            grep -E "roof|4K|clock" "$OUT/bench_${rel}_$run.log" | cut -c1-220
            section "$rel, run $run: bench-batch --backend cuda --cameras 4"
            "$bin" bench-batch --backend cuda --cameras 4 >"$OUT/bench_batch_${rel}_$run.log" 2>&1 || status=1
            cut -c1-220 "$OUT/bench_batch_${rel}_$run.log" | tail -25
        done
    done
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

# full's parts can be left out (a shorter device call): NO_STARTUP=1, NO_BENCH=1; FAULT=1
# adds the GPU fault drill of `reliability` first.
if [[ -n "${FAULT:-}" ]]; then
    section "GPU fault drill: gpu_failure_policy with a real injected fault (test/gpu_fault.rs)"
    timeout "${FAULT_TIMEOUT:-90}" "$D/gpu_fault" >"$OUT/gpu_fault.log" 2>&1
    rc=$?; echo "gpu_fault exit $rc"; [[ $rc == 0 ]] || status=1
    grep -vE '^\s*$' "$OUT/gpu_fault.log" | cut -c1-200 | tail -14
fi
if [[ -z "${NO_STARTUP:-}" ]]; then
section "start-up: cold (empty cache), then warm (cached), separate processes"
rm -rf /tmp/vp_startup
for i in 1 2 3; do "$D/vision_preproc" bench --startup /tmp/vp_startup 2>&1 | tee -a "$OUT/startup.log" || status=1; done
fi

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

[[ -n "${NO_BENCH:-}" ]] && { gpu_state; exit $status; }
section "benchmark (1000 timed iterations per figure, variants)"
gpu_state
timeout "${BENCH_TIMEOUT:-170}" "$D/vision_preproc" bench --variants --out "$OUT/results.json" >"$OUT/bench.log" 2>&1 || status=1
cat "$OUT/bench.log"
gpu_state
exit $status
