#!/usr/bin/env bash
# The message path on the GPU machine, remote side (THERE, from the repository root; the
# machine has CUDA but no Rust and no ROS): this build's node against a previous release's
# in one run, with parity, memcheck and the fault drill of the same binaries. Here first:
# scripts/device/gpu_transport_stage.sh
# (stages everything into .device/transport). There:
#   bash .device/transport/gpu_transport_remote.sh [what ...]    (default: all)
#   parity   gpu_parity, the whole matrix through the three CUDA backends (upload/direct,
#            mapped/direct, upload/staged); a third of the cases write the tensor into
#            pinned memory from alloc_host 64-byte aligned (the direct path: the download,
#            in mapped mode the kernel, writes it there), a third 4 bytes off
#   memcheck compute-sanitizer memcheck over every 8th case
#   fault    gpu_fault: gpu_failure_policy with real faults (the pipeline drops its pinned
#            message buffer before the backend is replaced)
#   rates    bench/memcpy_rate.py --pinned: memcpy rates of this host for the ledger
#   node-quick  one trial of the new node at 1080p, with and without a profile
#   node     node-added latency, previous release (91daae3) vs this one, in one run, same
#            bags, same peers: `vision_preproc play --loop --restamp` (1280x720 or
#            1920x1080 bgr8, 30 Hz) -> node (default.yaml of each release, backend cuda,
#            640x640 letterbox float32) -> `vision_preproc record --json`; 3 trials of 8 s
#            per size and release, interleaved; RSS and GPU memory at 6 s. Every process
#            with config/fastdds_large_frames.xml (as before), plus one trial per size of
#            the new node without a profile (its own sized segment): RSS; and one at
#            1080p with an 8 MB maximum message size (no DATA_FRAG fragmentation): ledger.
# Logs and JSON go to a work folder, packed at the end into $OUT/transport_results.tgz
# (the device tool returns at most 8 files), with the printed summary as $OUT/summary.log.
set -uo pipefail
D="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FINAL="${OUT:-/tmp/vp_out}"; mkdir -p "$FINAL"
OUT=/tmp/vp_transport_work; rm -rf "$OUT"; mkdir -p "$OUT"
exec > >(tee "$FINAL/summary.log") 2>&1
WHAT=("$@"); [[ ${#WHAT[@]} -gt 0 ]] || WHAT=(parity memcheck fault rates node)
export VISION_PREPROC_KERNEL_CACHE=/tmp/vp_kernel_cache
status=0
gpu_state() { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv,noheader; }
echo "machine: $(gpu_state); $(nproc) CPUs; $(date -u '+%F %T') UTC; commit $(cat "$D/COMMIT")"
for w in "${WHAT[@]}"; do
case "$w" in
parity)
    timeout 120 "$D/gpu_parity" >"$OUT/parity.log" 2>&1; rc=$?
    echo "parity exit $rc"; [[ $rc == 0 ]] || status=1
    grep -E 'FAIL|straight into pinned|summary|^\[' "$OUT/parity.log" | cut -c1-220 | tail -14 ;;
memcheck)
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 "$D/gpu_parity" --stride 8 >"$OUT/memcheck.log" 2>&1; rc=$?
    echo "memcheck exit $rc (3: errors, 124: timed out)"; [[ $rc == 0 ]] || status=1
    grep -E '^========= ERROR SUMMARY|summary' "$OUT/memcheck.log" | cut -c1-220 | tail -3 ;;
fault)
    timeout 120 "$D/gpu_fault" >"$OUT/fault.log" 2>&1; rc=$?
    echo "gpu_fault exit $rc"; [[ $rc == 0 ]] || status=1
    grep -iE 'FAIL|ok|summary|passed' "$OUT/fault.log" | cut -c1-200 | tail -8 ;;
rates)
    python3 "$D/memcpy_rate.py" --repeats 100 --pinned | tee "$OUT/memcpy_rate.json" ;;
node|node-quick)
    R=/tmp/vp_ros; rm -rf "$R"; mkdir -p "$R/bags" && tar xJf "$D/ros.tar.xz" -C "$R" && tar xJf "$D/node_bags.tar.xz" -C "$R/bags" || exit 1
    export LD_LIBRARY_PATH="$R/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export RMW_IMPLEMENTATION=rmw_fastrtps_cpp ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST ROS_DOMAIN_ID=23
    export ROS_LOG_DIR=/tmp/vp_roslog HOME="${HOME:-/tmp}"
    PROFILE="$D/fastdds_large_frames.xml"
    # The name the bundle's Fast DDS reads its profile from (2.x, Jazzy: only the old one).
    PV=FASTDDS_DEFAULT_PROFILES_FILE
    compgen -G "$R/lib/libfastrtps.so.2*" >/dev/null && PV=FASTRTPS_DEFAULT_PROFILES_FILE
    # For the ledger only: the node's transports with an 8 MB maximum message size (no
    # 64 KB DATA_FRAG fragments, even through shared memory; remote readers over UDP
    # would then get nothing, so it is not the node's default).
    NOFRAG=/tmp/vp_nofrag.xml
    sed -e 's|<type>SHM</type>|<type>SHM</type><maxMessageSize>8388608</maxMessageSize>|' \
        -e 's|<type>UDPv4</type>|<type>UDPv4</type><maxMessageSize>8388608</maxMessageSize>|' "$PROFILE" >"$NOFRAG"
    run() {  # release size trial profile(yes|no)
        local rel=$1 size=$2 i=$3 prof=$4 tag="${1}_${2}_${3}_${4}" node_bin yaml
        if [[ $rel == new ]]; then node_bin="$R/bin/vision_preproc_node"; yaml="$D/default.yaml"
        else node_bin="$R/bin/old/vision_preproc_node"; yaml="$D/default_old.yaml"; fi
        local env_node=(env "$PV=$PROFILE")
        [[ $prof == no ]] && env_node=(env -u FASTDDS_DEFAULT_PROFILES_FILE -u FASTRTPS_DEFAULT_PROFILES_FILE)
        [[ $prof == nofrag ]] && env_node=(env "$PV=$NOFRAG")
        rm -rf "/tmp/rec_$tag"
        "${env_node[@]}" "$node_bin" --ros-args --params-file "$yaml" -p backend:=cuda \
            -p network_image_width:=640 -p network_image_height:=640 >"$OUT/node_$tag.log" 2>&1 &
        local node=$!
        env "$PV=$PROFILE" "$R/bin/vision_preproc" record "/tmp/rec_$tag" --duration 11 --json "$OUT/$tag.json" >"/tmp/rec_$tag.log" 2>&1 &
        local rec=$!
        env "$PV=$PROFILE" "$R/bin/vision_preproc" play "$R/bags/bgr8_$size" --loop --restamp --duration 8 --wait-subscribers 1 >"/tmp/play_$tag.log" 2>&1 &
        local play=$!
        sleep 6
        local rss gpu; rss=$(awk '/VmRSS/ {printf "%.0f", $2/1024}' "/proc/$node/status" 2>/dev/null)
        local shm; shm=$(awk '/RssShmem/ {printf "%.0f", $2/1024}' "/proc/$node/status" 2>/dev/null)
        gpu=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p="$node" '$1==p {print $2}')
        wait "$play" "$rec"; kill -TERM "$node"; wait "$node"
        echo "$tag: $(head -1 "/tmp/play_$tag.log"); $(grep -h '^latency' "/tmp/rec_$tag.log"); rss_mb ${rss:-?} shmem_mb ${shm:-?} gpu_mib ${gpu:-?}; $(grep -o 'stopped:.*' "$OUT/node_$tag.log")"
        rm -rf "/tmp/rec_$tag"
    }
    if [[ $w == node-quick ]]; then
        { run new 1920x1080 1 yes; run new 1920x1080 1 no; } 2>&1 | tee "$OUT/node.log"
    else
    {
    for size in 1280x720 1920x1080; do
        for i in 1 2 3; do run old "$size" "$i" yes; run new "$size" "$i" yes; done
        run new "$size" 1 no
    done
    run new 1920x1080 1 nofrag
    } 2>&1 | tee "$OUT/node.log"
    fi
    python3 - "$OUT" <<'PY'
import json, glob, os, statistics, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "*_*_*_*.json"))):
    rel, size, trial, prof = os.path.basename(f)[:-5].split("_")
    d = json.load(open(f))
    rows.setdefault((size, rel, prof), []).append(d)
print("| size | release | profile | trials | tensors | node-added p50 ms | p99 ms | e2e p50 ms | upload / preprocess / download p50 ms |")
print("|---|---|---|---|---|---|---|---|---|")
for (size, rel, prof), ds in sorted(rows.items()):
    med = lambda k: statistics.median(d[k] for d in ds if d.get(k) is not None)
    st = lambda k: statistics.median(d["stages_ms_p50"][k] for d in ds if d.get("stages_ms_p50") and d["stages_ms_p50"][k] is not None) if any(d.get("stages_ms_p50") for d in ds) else float("nan")
    p50s = ", ".join(f"{d['added_ms_p50']:.2f}" for d in ds)
    print(f"| {size} | {rel} | {prof} | {len(ds)} | {'/'.join(str(d['tensors']) for d in ds)} | {med('added_ms_p50'):.2f} ({p50s}) | "
          f"{med('added_ms_p99'):.2f} | {med('e2e_ms_p50'):.2f} | {st('upload'):.3f} / {st('preprocess'):.3f} / {st('download'):.3f} |")
PY
    ;;
*) echo "unknown: $w"; exit 2 ;;
esac
done
echo "machine after: $(gpu_state)"
tar czf "$FINAL/transport_results.tgz" -C "$OUT" .
exit $status
