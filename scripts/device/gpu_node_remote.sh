#!/usr/bin/env bash
# The ROS node on the GPU machine, remote side (THERE, from the repository root; the
# machine has CUDA but no ROS). Here first:  scripts/device/gpu_node_stage.sh  (the node, the CLI
# and their ROS 2 libraries -> .device/ros.tar.xz; input bags -> .device/node_bags.tar.xz;
# the demo bag -> .device/bag). Then there:
#   bash scripts/device/gpu_node_remote.sh [scenario ...]      (default: all of them)
# Real DDS (Fast DDS, loopback) between three processes: `vision_preproc play` (camera),
# the node, `vision_preproc record` (subscriber; prints /diagnostics changes and latency).
#   healthy   backend cuda, no fault (bag of the demo)
#   fallback  VISION_PREPROC_INJECT_CUDA_FAULT=40 (sticky: illegal address), policy fallback
#   retry     VISION_PREPROC_INJECT_CUDA_FAULT=40:transient (out of memory), policy retry
#   exit      VISION_PREPROC_INJECT_CUDA_FAULT=40, policy exit (exit code 1 expected)
#   latency   config/default.yaml on cuda, 1280x720 and 1920x1080 bgr8 at 30 Hz, restamped:
#             end-to-end and node-added latency, fps, drops, RSS and GPU memory (3 x 10 s)
#   startup   process start -> first tensor received, empty kernel cache then cached (3 x)
#   handoff   tensor_ref on the CUDA node (host blocks): the r2r consumer's bytes equal the
#             recorded tensors' (64x48, both at once); then `record --count-only` of tensor
#             vs the r2r consumer of tensor_ref alone, 1080p -> 640x480, alternating (2 x 10 s)
#             (HANDOFF_BACKEND=cpu: the same with the CPU backend; HANDOFF_SPIN_MS=N: a second
#             consumer beside the first in the ref phases, waiting at most N ms for messages)
#   cudaref   tensor_ref with blocks of CUDA memory (VMM, exported fds), consumers in
#             PyTorch (bench/bench_handoff.py --consumer, rclpy from .device/py312.tar.xz,
#             scripts/device/py312_bundle.sh): "check" 64x48 + conv2d, each block's tensor (a CUDA
#             torch tensor whose data_ptr must be the mapped block) equal to the Tensor of
#             the same stamp, the tensors recorded (compare with a CPU replay here); "bench"
#             1080p -> 640x640 float32, tensor (+ torch .cuda()) vs tensor_ref, alternating,
#             2 x 10 s; "slow" a consumer holding each frame 500 ms for 20 s (CUDAREF_SLOW_S; its tensor must
#             not change while held); "kill" a holder SIGKILLed beside a second consumer
#             that records the node's Shared diagnostics; "sanitizer" the node under
#             compute-sanitizer memcheck with a consumer; "batch" 4 cameras 1080p (phases not
#             aligned) -> one node with 4 inputs, TensorBatch 4x3x640x640 vs tensor_ref,
#             alternating, 2 x 10 s; "fault_retry" / "fault_fallback" a device fault at frame
#             200 (~7 s in, the consumer connected) (transient: the backend rebuilt, a new CUDA pool; sticky: the CPU backend, a
#             host pool) under a consumer; "fault_inflight" the fault inside set 200's own GPU
#             work, after its TensorRef went out (policy retry): the set withdrawn; "example" examples/tensor_ref_torch.py (a small conv
#             net on each block); "debug" debug_image watched beside a tensor_ref consumer
#             (the preview read back from the CUDA block); "rust" the r2r consumer
#             (examples/tensor_ref_consumer.rs, bin/tensor_ref_consumer) importing the CUDA
#             blocks, its FNV-1a of each tensor (copied to the host) against those of the
#             Tensor messages of the same stamps (a recorder beside it), 64x48 + conv2d;
#             "ctypes" the "check" consumer with VISION_PREPROC_CUDA_BINDING=ctypes (the blocks
#             imported through ctypes on libcuda.so.1, not cuda-python); "prev" the bench's
#             tensor_ref consumer with the previous release's node (.device/prev.tar.xz, as
#             for `single`) and with this one, alternating, 2 x 10 s
#             (CUDAREF_MODES: a subset of these modes)
#   single    one single-camera node, 1920x1080 bgr8 -> 640x640 float32 (config/default.yaml),
#             the previous release (.device/prev.tar.xz, bundled the same way) against this
#             one, interleaved, 2 trials each: the highest sustained rate (PLAYERS=3
#             `play --max` on the node's one topic, 6 s: published frames/s, with
#             received / dropped and each thread's CPU, scripts/device/thread_cpu.py) and the
#             node-added latency at 30 Hz (one player, 10 s, `record` p50 / p99)
#   single_own  the single-camera node's highest rate (as `single`, this release only) with
#             input_participants one vs per_input, interleaved, 2 trials
#   profile   where a node's time goes at --max, per thread (scripts/device/thread_cpu.py): the
#             batched node (4 inputs) and the four single-camera nodes of `batchmax`, and
#             their players and subscribers (PROFILE_SIDES: a subset or order of batched,
#             batched_own (the batched node with input_participants per_input), pairs (two
#             nodes with 2 inputs each: two DDS participants), separate)
#   batch     4 cameras 1920x1080 bgr8 at 30 Hz (4 players, phases not aligned) -> one node
#             with 4 inputs (TensorBatch 4x3x640x640) vs 4 single-camera nodes, cuda;
#             node-added and end-to-end latency per side (2 x 10 s, interleaved)
#   batchfault  a batched node (2 cameras 1080p, 60 Hz) with a real device fault at batch 40
#             (fault-injection node), gpu_failure_policy retry, then fallback: the policy
#             acts while the publishing thread may hold the previous batch's buffer
#   batchmax  the same two sides, the cameras at 30, 60, 120, 180, 240 Hz and as fast as
#             they can (play --max), 6 s each: frames sent / received / published / dropped
#             per side and rate (the highest rate without drops), and published frames/s at
#             --max (the highest sustained rate); `record --count-only` as the subscribers
#             (SWEEP_RATES="1 2": fewer rates; SWEEP_SIDES: sides as PROFILE_SIDES; SWEEP_BACKEND=cpu: a dry run of the script
#             on a machine without a GPU)
# Logs: $OUT/<scenario>.log; recorded bags of the first three as $OUT/<scenario>_bag.tar
# (compare with an offline CPU replay here: scripts/device/compare_bags.py); JSON per run.
set -uo pipefail
SCENARIOS=("$@")
[[ ${#SCENARIOS[@]} -gt 0 ]] || SCENARIOS=(healthy fallback retry exit latency startup)
OUT="${OUT:-/tmp/vp_out}"; mkdir -p "$OUT"
R=/tmp/vp_ros; rm -rf "$R"; mkdir -p "$R/bags" && tar xJf .device/ros.tar.xz -C "$R" || exit 1
[[ -f .device/node_bags.tar.xz ]] && tar xJf .device/node_bags.tar.xz -C "$R/bags"
export LD_LIBRARY_PATH="$R/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export RMW_IMPLEMENTATION=rmw_fastrtps_cpp ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST ROS_DOMAIN_ID=21
export ROS_LOG_DIR=/tmp/vp_roslog HOME="${HOME:-/tmp}"
# The profile under the name the bundle's Fast DDS reads (2.x, Jazzy: only the old name).
PROFILE_VAR=FASTDDS_DEFAULT_PROFILES_FILE
compgen -G "$R/lib/libfastrtps.so.2*" >/dev/null && PROFILE_VAR=FASTRTPS_DEFAULT_PROFILES_FILE
export "$PROFILE_VAR=$PWD/config/fastdds_large_frames.xml"
export VISION_PREPROC_KERNEL_CACHE=/tmp/vp_kernel_cache
unset VISION_PREPROC_NVRTC_DIR
NODE="$R/bin/vision_preproc_node"; CLI="$R/bin/vision_preproc"
# The node with the test hooks (fault injection), for the fault scenarios only.
NODE_FI="$R/bin/vision_preproc_node_fault_injection"
SMALL=(-p backend:=cuda -p network_image_width:=64 -p network_image_height:=48 -p conv.kernel:=gaussian -p conv.size:=5 -p output_qos_depth:=50)
status=0
rss_gpu() {  # "RSS MB, GPU MB" of a pid
    local rss gpu
    rss=$(awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$1/status" 2>/dev/null)
    gpu=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null | awk -F', ' -v p="$1" '$1==p {print $2}')
    echo "rss_mb ${rss:-?} gpu_mb ${gpu:-?}"
}
fault_run() {  # scenario env policy
    local sc=$1 env=$2 pol=$3 log="$OUT/$1.log" rc expected=0
    rm -rf "/tmp/rec_$sc"
    echo "==== $sc: ${env:-no fault}, gpu_failure_policy $pol ($(date -u +%H:%M:%S) UTC, commit $(cat "$R/COMMIT"))" >"$log"
    "$CLI" record "/tmp/rec_$sc" --duration 9 --diagnostics >"/tmp/rec_$sc.log" 2>&1 &
    local rec=$!
    sleep 1
    local node_bin="$NODE"; [[ -n $env ]] && node_bin="$NODE_FI"
    env $env "$node_bin" --ros-args "${SMALL[@]}" -p gpu_failure_policy:="$pol" >>"$log" 2>&1 &
    local node=$!
    "$CLI" play .device/bag --loop --duration 4 --wait-subscribers 1 >"/tmp/play_$sc.log" 2>&1
    wait "$rec"
    if kill -0 "$node" 2>/dev/null; then kill -TERM "$node"; fi
    wait "$node"; rc=$?
    cat "/tmp/play_$sc.log" "/tmp/rec_$sc.log" >>"$log"
    echo "node exit code $rc" >>"$log"
    cut -c1-400 "$log"
    [[ $sc == exit ]] && expected=1
    [[ $rc == "$expected" ]] || { echo "UNEXPECTED exit code $rc (expected $expected)"; status=1; }
    [[ $sc == exit ]] || (cd /tmp && tar cf "$OUT/${sc}_bag.tar" "rec_$sc")
}
latency_run() {  # size trial
    local size=$1 i=$2 tag="lat_${1}_$2"
    rm -rf "/tmp/rec_$tag"
    "$NODE" --ros-args --params-file config/default.yaml -p backend:=cuda >"/tmp/node_$tag.log" 2>&1 &
    local node=$!
    "$CLI" record "/tmp/rec_$tag" --duration 13 --json "$OUT/$tag.json" >"/tmp/rec_$tag.log" 2>&1 &
    local rec=$!
    "$CLI" play "$R/bags/bgr8_$size" --loop --restamp --duration 10 --wait-subscribers 1 >"/tmp/play_$tag.log" 2>&1 &
    local play=$!
    sleep 6; local mem; mem=$(rss_gpu "$node")
    wait "$play" "$rec"
    kill -TERM "$node"; wait "$node"
    echo "$size trial $i: $(cat "/tmp/play_$tag.log" | head -1); $(grep -h '^latency' "/tmp/rec_$tag.log"); node $mem; $(grep -o 'stopped:.*' "/tmp/node_$tag.log")"
    rm -rf "/tmp/rec_$tag"
}
handoff_run() {  # mode trial: tensor_ref on the CUDA node (host blocks), 1920x1080 bgr8 at 30 Hz
    # restamped, 10 s. "same": 64x48 output, `record` of tensor (its bag kept) and the r2r
    # consumer of tensor_ref (FNV-1a of each tensor it read, by stamp) at once: the two
    # must hold the same bytes. "tensor" / "ref": config/default.yaml (3x640x640 float32),
    # one consumer: `record --count-only` (stamp -> tensor received) or the r2r consumer
    # (stamp -> tensor readable in place).
    local mode=$1 i=$2 tag="handoff_${1}_$2" args=(--params-file config/default.yaml -p backend:="${HANDOFF_BACKEND:-cuda}")
    [[ $mode == same ]] && args+=(-p network_image_width:=64 -p network_image_height:=48)
    rm -rf "/tmp/rec_$tag"
    "$NODE" --ros-args "${args[@]}" >"/tmp/node_$tag.log" 2>&1 &
    local node=$! waits=()
    if [[ $mode == same ]]; then
        "$CLI" record "/tmp/rec_$tag" --duration 13 >"/tmp/rec_$tag.log" 2>&1 & waits+=($!)
    elif [[ $mode == tensor ]]; then
        "$CLI" record --count-only --duration 13 --json "$OUT/$tag.json" >"/tmp/rec_$tag.log" 2>&1 & waits+=($!)
    fi
    if [[ $mode != tensor ]]; then
        "$R/bin/tensor_ref_consumer" /tensor_ref 13 "/tmp/refs_$tag.txt" >"/tmp/con_$tag.log" 2>&1 & waits+=($!)
        [[ $mode == ref ]] && [[ -n ${HANDOFF_SPIN_MS:-} ]] && {  # the same consumer waiting at most 1 ms at a time
            VP_SPIN_MS=$HANDOFF_SPIN_MS ROS_NAMESPACE= "$R/bin/tensor_ref_consumer" /tensor_ref 13 >"/tmp/con1_$tag.log" 2>&1 & waits+=($!); }
    fi
    "$CLI" play "$R/bags/bgr8_1920x1080" --loop --restamp --duration 10 --wait-subscribers 1 >"/tmp/play_$tag.log" 2>&1 &
    waits+=($!)
    sleep 6; local mem; mem=$(rss_gpu "$node")
    wait "${waits[@]}"
    kill -TERM "$node"; wait "$node"
    echo "$tag: $(head -1 "/tmp/play_$tag.log"); $(grep -h '^latency' "/tmp/rec_$tag.log" 2>/dev/null); consumer: $(tail -2 "/tmp/con_$tag.log" 2>/dev/null | tr '\n' ' '); node $mem; $(grep -o 'stopped:.*' "/tmp/node_$tag.log")"
    [[ -f /tmp/con1_$tag.log ]] && echo "$tag, second consumer (VP_SPIN_MS=${HANDOFF_SPIN_MS:-}): $(tail -1 "/tmp/con1_$tag.log")"
    grep -h "tensor_ref" "/tmp/node_$tag.log" | cut -c1-220
    if [[ $mode == same ]]; then
        cp "/tmp/refs_$tag.txt" "$OUT/" && tar cf "$OUT/${tag}_bag.tar" -C /tmp "rec_$tag"
    fi
    rm -rf "/tmp/rec_$tag"
}
cudaref_consumer() {  # tag topic seconds [args]: a torch consumer in the background, pid in CPID
    # (CUDA_BINDING=ctypes|cuda-python: its VISION_PREPROC_CUDA_BINDING)
    local tag=$1 topic=$2 secs=$3; shift 3
    # The bundle's environment in the consumer's shell only (the node keeps $R/lib).
    # shellcheck disable=SC1091
    (source "$R/py312/env.sh" && export ROS_DOMAIN_ID=21 \
        && { [[ -z ${CUDA_BINDING:-} ]] || export VISION_PREPROC_CUDA_BINDING=$CUDA_BINDING; } \
        && exec python3 bench/bench_handoff.py --consumer "$topic" \
        --torch --seconds "$secs" --ns / --out "$OUT/$tag.json" "$@") >"$OUT/$tag.consumer.log" 2>&1 &
    CPID=$!
}
cudaref_run() {  # mode [trial]: see the scenario's description
    local mode=$1 i=${2:-1} tag="cudaref_${1}_${2:-1}" waits=() pre=() bag="$R/bags/bgr8_1920x1080" stamps=(--restamp)
    local args=(--params-file config/default.yaml -p backend:=cuda -p network_image_width:=640 -p network_image_height:=640)
    [[ $mode == check || $mode == rust || $mode == ctypes ]] && args=("${SMALL[@]}")
    [[ $mode == sanitizer ]] && pre=(compute-sanitizer --tool memcheck --print-limit 20)
    # (CUDAREF_BATCH_ARGS: more node arguments for the batch modes, e.g. -p input_participants:=per_input;
    # CUDAREF_BATCH_PLAY: more player arguments for them, e.g. --max.)
    # shellcheck disable=SC2206
    [[ $mode == batch_* ]] && args+=(-r __ns:=/bb -p "inputs:=[cam0/image, cam1/image, cam2/image, cam3/image]" ${CUDAREF_BATCH_ARGS:-})
    local node_bin=$NODE fault=()
    case $mode in
        prev_ref) node_bin=/tmp/vp_prev/bin/vision_preproc_node ;;
        fault_retry) node_bin=$NODE_FI; fault=(VISION_PREPROC_INJECT_CUDA_FAULT=200:transient); args+=(-p gpu_failure_policy:=retry) ;;
        fault_fallback) node_bin=$NODE_FI; fault=(VISION_PREPROC_INJECT_CUDA_FAULT=200); args+=(-p gpu_failure_policy:=fallback) ;;
        fault_inflight) node_bin=$NODE_FI; fault=(VISION_PREPROC_INJECT_CUDA_FAULT=200:in_flight); args+=(-p gpu_failure_policy:=retry) ;;
    esac
    env "${fault[@]}" "${pre[@]}" "$node_bin" --ros-args "${args[@]}" >"/tmp/node_$tag.log" 2>&1 &
    local node=$! play=10
    case $mode in
        check) # the demo bag as recorded (its stamps repeat per loop: compare_bags.py matches them)
               bag=.device/bag; stamps=()
               rm -rf "/tmp/rec_$tag"; "$CLI" record "/tmp/rec_$tag" --duration 13 >"/tmp/rec_$tag.log" 2>&1 & waits+=($!)
               cudaref_consumer "$tag" both 13; waits+=("$CPID") ;;
        ctypes) # as check, the blocks imported through ctypes on libcuda.so.1 (not cuda-python)
               bag=.device/bag; stamps=()
               # shellcheck disable=SC1091
               (source "$R/py312/env.sh" && VISION_PREPROC_CUDA_BINDING=ctypes exec python3 -c '
from vision_preproc_consumer import cuda
d = cuda.driver(); print("VISION_PREPROC_CUDA_BINDING=ctypes: binding", d.name, getattr(d, "library", ""))') 2>&1
               CUDA_BINDING=ctypes cudaref_consumer "$tag" both 13; waits+=("$CPID") ;;
        rust)  # the r2r consumer (CUDA blocks imported in Rust) with DUMP, and a recorder of
               # tensor: stamp -> FNV-1a 64 of the Tensor bytes (the example's hash), compared below
               "$R/bin/tensor_ref_consumer" /tensor_ref 13 "$OUT/${tag}_refs.txt" >"$OUT/$tag.consumer.log" 2>&1 & waits+=($!)
               # shellcheck disable=SC1091
               (source "$R/py312/env.sh" && export ROS_DOMAIN_ID=21 && exec python3 -c '
import sys, time, rclpy
from vision_preproc_msgs.msg import Tensor
rclpy.init(); n = rclpy.create_node("tensor_hashes"); got = []
n.create_subscription(Tensor, "/tensor", lambda m: got.append((m.header.stamp.sec * 10**9 + m.header.stamp.nanosec, bytes(m.data))), 50)
t0 = time.time()
while time.time() - t0 < 13: rclpy.spin_once(n, timeout_sec=0.1)
def fnv(b):
    h = 0xcbf29ce484222325
    for x in b: h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h
with open(sys.argv[1], "w") as f:
    for stamp, data in got: f.write(f"{stamp} {fnv(data):016x}\n")
print(f"tensor: {len(got)} messages")
' "$OUT/${tag}_tensor.txt") >"$OUT/${tag}_tensor.log" 2>&1 & waits+=($!) ;;
        fault_*) cudaref_consumer "$tag" tensor_ref 13; waits+=("$CPID") ;;
        debug) # debug_image beside a tensor_ref consumer: previews read back from the CUDA block
               cudaref_consumer "$tag" tensor_ref 13; waits+=("$CPID")
               # shellcheck disable=SC1091
               (source "$R/py312/env.sh" && export ROS_DOMAIN_ID=21 && exec python3 -c '
import time, numpy as np, rclpy
from sensor_msgs.msg import Image
rclpy.init(); n = rclpy.create_node("debug_watch"); got = []
n.create_subscription(Image, "/debug_image", got.append, 10)
t0 = time.time()
while time.time() - t0 < 13: rclpy.spin_once(n, timeout_sec=0.1)
means = [float(np.frombuffer(bytes(m.data), np.uint8).mean()) for m in got]
print(f"debug_image: {len(got)} images", (got[-1].width, got[-1].height, got[-1].encoding) if got else "", "mean pixel", [round(x, 1) for x in means[-5:]])
') >"$OUT/${tag}_debug.log" 2>&1 & waits+=($!) ;;
        example) # shellcheck disable=SC1091
                 (source "$R/py312/env.sh" && export ROS_DOMAIN_ID=21 && exec python3 examples/tensor_ref_torch.py /tensor_ref 13) \
                     >"$OUT/$tag.consumer.log" 2>&1 & waits+=($!) ;;
        tensor|tensor_ref) cudaref_consumer "${mode}_$i" "$mode" 13; waits+=("$CPID") ;;
        prev_ref) cudaref_consumer "${mode}_$i" tensor_ref 13; waits+=("$CPID") ;;
        batch_*) cudaref_consumer "${mode}_$i" "${mode#batch_}" 13 --ns /bb --batch; waits+=("$CPID") ;;
        slow)  # (CUDAREF_SLOW_S: its seconds, 20 by default; 600 for the soak)
               play=${CUDAREF_SLOW_S:-20}; cudaref_consumer "$tag" tensor_ref $((play + 3)) --hold-ms 500; waits+=("$CPID") ;;
        kill)  # the holder takes a frame every 1.5 s (within the 2-s lease) and is killed while holding one
               cudaref_consumer "${tag}_holder" tensor_ref 30 --hold-ms 1500; local holder=$CPID
               cudaref_consumer "$tag" tensor_ref 13; waits+=("$CPID")
               (sleep 5.7; kill -KILL "$holder"; echo "holder SIGKILLed at $(date +%s.%N)" >"$OUT/${tag}_kill.txt") & waits+=($!) ;;
        sanitizer) play=20; cudaref_consumer "$tag" tensor_ref 25; waits+=("$CPID") ;;
    esac
    if [[ $mode == batch_* ]]; then
        # shellcheck disable=SC2086
        play_cameras batched b "$tag" --duration "$play" ${CUDAREF_BATCH_PLAY:-}; waits+=("${PLAYS[@]}")
    else
        "$CLI" play "$bag" --loop "${stamps[@]}" --duration "$play" --wait-subscribers 1 >"/tmp/play_$tag.log" 2>&1 &
        waits+=($!)
    fi
    sleep 6; local mem; mem=$(rss_gpu "$node")
    wait "${waits[@]}"
    if [[ $mode == sanitizer ]]; then pkill -TERM -P "$node"; else kill -TERM "$node"; fi
    wait "$node"; local rc=$?
    echo "$tag: $(head -1 /tmp/play_"$tag"*.log | grep -v '==' | tr '\n' ' '); node $mem, exit $rc; $(grep -o 'stopped:.*' "/tmp/node_$tag.log")"
    grep -h "tensor_ref\|ERROR SUMMARY\|WARN\|ERROR\|gpu_failure\|backend" "/tmp/node_$tag.log" | cut -c1-300 | head -12
    if [[ $mode == check ]]; then tar cf "$OUT/${tag}_bag.tar" -C /tmp "rec_$tag"; rm -rf "/tmp/rec_$tag"; fi
    [[ $mode == sanitizer || $mode == fault_* ]] && cp "/tmp/node_$tag.log" "$OUT/"
    [[ $mode == example ]] && tail -3 "$OUT/$tag.consumer.log"
    if [[ $mode == check || $mode == ctypes ]]; then
        python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print("consumer checks", d["checks"], "counts", d["counts"])' "$OUT/$tag.json"
    fi
    if [[ $mode == rust ]]; then
        grep -m1 "device address" "$OUT/$tag.consumer.log"; tail -1 "$OUT/$tag.consumer.log"; cat "$OUT/${tag}_tensor.log"
        python3 - "$OUT/${tag}_refs.txt" "$OUT/${tag}_tensor.txt" <<'PY'
import sys
def read(path):
    out = {}
    for line in open(path):
        stamp, fnv = line.split()
        out.setdefault(int(stamp), set()).add(fnv)
    return out
refs, tensors = read(sys.argv[1]), read(sys.argv[2])
both = sorted(set(refs) & set(tensors))
equal = sum(refs[s] == tensors[s] for s in both)
print(f"rust: {equal} of {len(both)} frames' hashes matched (FNV-1a 64 of the tensor the Rust consumer copied from its "
      f"imported CUDA block vs of the Tensor message of the same stamp); {len(both) - equal} differ; "
      f"{len(refs)} stamps read from blocks, {len(tensors)} Tensor messages")
PY
    fi
    [[ $mode == debug ]] && tail -3 "$OUT/${tag}_debug.log"
}
start_side() {  # side letter tag bag|count: one node with 4 inputs (namespace /<letter>b)
    # or 4 single-camera nodes (/<letter>s0..3), 640x640 letterbox on cuda, and a
    # `record` per tensor topic (a bag in /dev/shm, or --count-only); pids in PIDS, RECS
    local side=$1 l=$2 tag=$3 mode=$4 k
    local net=(-p backend:="${SWEEP_BACKEND:-cuda}" -p network_image_width:=640 -p network_image_height:=640)
    PIDS=(); RECS=()
    record_side() {  # name ns json [--batch]
        local out=(--count-only); [[ $mode == bag ]] && out=("/dev/shm/rec_$1")
        "$CLI" record "${out[@]}" "${@:4}" --tensor-topic "$2/tensor" --timing-topic "$2/timing" \
            --duration 60 --json "$3" >"/tmp/rec_$1.log" 2>&1 &
        RECS+=($!)
    }
    if [[ $side == batched || $side == batched_own ]]; then
        local own=(); [[ $side == batched_own ]] && own=(-p input_participants:=per_input)
        "$NODE" --ros-args -r __ns:=/${l}b --params-file config/default.yaml "${net[@]}" "${own[@]}" \
            -p "inputs:=[cam0/image, cam1/image, cam2/image, cam3/image]" >"/tmp/node_$tag.log" 2>&1 &
        PIDS+=($!)
        record_side "$tag" "/${l}b" "$OUT/${tag}.json" --batch
    elif [[ $side == pairs ]]; then  # two nodes (two DDS participants) with 2 inputs each
        for k in 0 1; do
            "$NODE" --ros-args -r __ns:=/${l}p$k --params-file config/default.yaml "${net[@]}" \
                -p "inputs:=[cam0/image, cam1/image]" >"/tmp/node_${tag}_$k.log" 2>&1 &
            PIDS+=($!)
            record_side "${tag}_$k" "/${l}p$k" "$OUT/${tag}_$k.json" --batch
        done
    else
        for k in 0 1 2 3; do
            "$NODE" --ros-args -r __ns:=/${l}s$k --params-file config/default.yaml "${net[@]}" >"/tmp/node_${tag}_$k.log" 2>&1 &
            PIDS+=($!)
            record_side "${tag}_$k" "/${l}s$k" "$OUT/${tag}_$k.json"
        done
    fi
}
play_cameras() {  # side letter tag play-args...: the 4 cameras of start_side's side, started
    # 0-80 ms apart (phases not aligned, as real cameras); pids in PLAYS
    local side=$1 l=$2 tag=$3 k topic; shift 3
    PLAYS=()
    for k in 0 1 2 3; do
        topic=/${l}b/cam$k/image; [[ $side == separate ]] && topic=/${l}s$k/image
        [[ $side == pairs ]] && topic=/${l}p$((k / 2))/cam$((k % 2))/image
        timeout 60 "$CLI" play "$R/bags/bgr8_1920x1080" --loop --restamp "$@" --image-topic "$topic" \
            --camera-info-topic "${topic%/image}/camera_info" --wait-subscribers 1 >"/tmp/play_${tag}_$k.log" 2>&1 &
        PLAYS+=($!)
        sleep 0.0$((RANDOM % 9))
    done
}
batch_run() {  # side trial: one batched node, or 4 single-camera nodes, 4 cameras
    local side=$1 i=$2 tag="batch_${1}_$2" k
    start_side "$side" b "$tag" bag
    play_cameras "$side" b "$tag" --duration 10
    sleep 6; local mem=""; for k in "${PIDS[@]}"; do mem="$mem [$(rss_gpu "$k")]"; done
    wait "${PLAYS[@]}"; sleep 1; kill -TERM "${RECS[@]}" 2>/dev/null; wait "${RECS[@]}"
    kill -TERM "${PIDS[@]}"; wait "${PIDS[@]}"
    echo "$side trial $i: $(cat /tmp/play_${tag}_*.log | grep -o 'play: [0-9]* images' | tr '\n' ' ')"
    grep -h '^latency' /tmp/rec_${tag}*.log | sed "s/^/  $side: /"
    grep -ho 'stopped:.*' /tmp/node_${tag}*.log | sed "s/^/  $side node /"
    echo "  $side nodes:$mem"
    rm -rf /dev/shm/rec_${tag}*
}
batch_fault_run() {  # policy: a batched node (2 cameras, 1080p) whose 40th batch meets a
    # real device fault (sticky: the context is lost) while the previous batch may still
    # be publishing on the other thread; the policy must act and batches go on
    local pol=$1 tag="bfault_$1" log="$OUT/bfault_$1.log" plays=() k rc
    VISION_PREPROC_INJECT_CUDA_FAULT=40 "$NODE_FI" --ros-args -r __ns:=/bf \
        -p backend:="${SWEEP_BACKEND:-cuda}" -p gpu_failure_policy:="$pol" -p network_image_width:=640 -p network_image_height:=640 \
        -p "inputs:=[cam0/image, cam1/image]" >"$log" 2>&1 &
    local node=$!
    "$CLI" record --count-only --batch --tensor-topic /bf/tensor --timing-topic /bf/timing --duration 60 \
        >"/tmp/rec_$tag.log" 2>&1 &
    local rec=$!
    for k in 0 1; do
        timeout 60 "$CLI" play "$R/bags/bgr8_1920x1080" --loop --restamp --duration 5 --rate 2 --image-topic /bf/cam$k/image \
            --camera-info-topic /bf/cam$k/camera_info --wait-subscribers 1 >"/tmp/play_${tag}_$k.log" 2>&1 &
        plays+=($!)
    done
    wait "${plays[@]}"; sleep 1
    kill -TERM "$rec"; stop_or_kill subscriber "$rec"
    kill -TERM "$node"; for k in $(seq 150); do kill -0 "$node" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$node" 2>/dev/null && { echo "  node did not exit: killed"; kill -KILL "$node"; status=1; }
    wait "$node"; rc=$?
    echo "batch fault, policy $pol: node exit code $rc; $(cat /tmp/play_${tag}_*.log | grep -o 'play: [0-9]* images' | tr '\n' ' ')"
    grep -E "GPU failure|gpu_failure_policy|still being published|stopped:|panicked" "$log" | cut -c1-300 | sed 's/^/  /'
    grep -h "^record:" "/tmp/rec_$tag.log" | sed 's/^/  /'
    [[ $rc == 0 ]] || status=1
}
warm_up() {  # once: the first node on a fresh machine spends ~18 s opening the backend
    # (NVRTC's first use on the VM), which would eat into the first trial
    [[ -n ${WARMED:-} ]] && return; WARMED=1
    "$NODE" --ros-args -r __ns:=/warmup -p backend:="${SWEEP_BACKEND:-cuda}" >/tmp/node_warmup.log 2>&1 &
    local pid=$! t
    for t in $(seq 600); do grep -q "backend ${SWEEP_BACKEND:-cuda}" /tmp/node_warmup.log && break; sleep 0.1; done
    echo "warm-up: node backend open after ~$((t / 10)) s"
    kill -TERM "$pid"; wait "$pid"
}
stop_or_kill() {  # what pid...: wait up to 15 s for each (already sent SIGTERM), then SIGKILL
    local what=$1 pid t; shift
    for pid in "$@"; do
        for t in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "  $what $pid did not exit 15 s after SIGTERM: killed"; kill -KILL "$pid"; status=1
        fi
        wait "$pid"
    done
}
sweep_run() {  # side rate (multiple of the bag's 30 Hz, or max): one 6 s trial
    local side=$1 rate=$2 tag="sweep_${1}_$2"
    local pace=(--rate "$rate"); [[ $rate == max ]] && pace=(--max)
    start_side "$side" w "$tag" count
    play_cameras "$side" w "$tag" --duration 6 "${pace[@]}"
    # The subscribers stop after the players and the nodes (their --duration is only a
    # bound: the first node on a freshly started GPU machine spends ~18 s opening its backend).
    wait "${PLAYS[@]}"; sleep 1
    kill -TERM "${PIDS[@]}"; stop_or_kill node "${PIDS[@]}"
    kill -TERM "${RECS[@]}" 2>/dev/null; stop_or_kill subscriber "${RECS[@]}"
    cp /tmp/node_${tag}*.log /tmp/rec_${tag}*.log /tmp/play_${tag}_*.log "$OUT/" 2>/dev/null
    python3 - "$side" "$rate" /tmp/play_${tag}_*.log -- /tmp/node_${tag}*.log -- /tmp/rec_${tag}*.log <<'PY'
import re, sys
side, rate, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
i = rest.index("--"); j = rest.index("--", i + 1)
plays, nodes, recs = rest[:i], rest[i + 1:j], rest[j + 1:]
sent = sum(int(m) for f in plays for m in re.findall(r"play: (\d+) images", open(f).read()))
tot = {"received": 0, "published": 0, "dropped": 0, "rejected": 0, "failed": 0}
for f in nodes:
    m = re.search(r"stopped: (\d+) frames received, (\d+) published, (\d+) dropped.*?(\d+) rejected.*?(\d+) failed", open(f).read())
    for k, v in zip(tot, m.groups() if m else [0] * 5):
        tot[k] += int(v)
lat = [re.search(r"node-added p50 ([\d.na]+) ms, p99 ([\d.na]+) ms; ([\d.]+) tensors/s", open(f).read(), re.I) for f in recs]
added = " ".join(f"{m.group(1)}/{m.group(2)}" if m else "?" for m in lat)
tps = sum(float(m.group(3)) for m in lat if m)
hz = "max" if rate == "max" else f"{30 * float(rate):g} Hz"
print(f"sweep {side} {hz}: sent {sent}, received {tot['received']}, published {tot['published']}, "
      f"dropped {tot['dropped']}, rejected {tot['rejected']}, failed {tot['failed']}; "
      f"published {tot['published'] / 6:.0f} frames/s; subscribers {tps:.1f} tensors/s; node-added p50/p99 ms {added}")
PY
}
startup_run() {  # label
    local tag="start_$1"
    rm -rf "/tmp/rec_$tag"
    "$CLI" record "/tmp/rec_$tag" --duration 12 --json "/tmp/$tag.json" >/dev/null 2>&1 &
    local rec=$!
    "$CLI" play "$R/bags/bgr8_1920x1080" --loop --duration 12 >/dev/null 2>&1 &
    local play=$!
    sleep 2
    local t0; t0=$(date +%s%N)
    "$NODE" --ros-args --params-file config/default.yaml -p backend:=cuda >"/tmp/node_$tag.log" 2>&1 &
    local node=$!
    sleep 8; local mem; mem=$(rss_gpu "$node")
    kill -TERM "$node"; wait "$node"; wait "$play" "$rec"
    python3 - "$t0" "/tmp/$tag.json" "$1" "$mem" <<'PY'
import json, sys
t0, path, label, mem = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
first = json.load(open(path)).get("first_tensor_ns")
print(f"startup {label}: process start -> first 1080p tensor received {((first - t0) / 1e6) if first else float('nan'):.0f} ms; node {mem}")
PY
    rm -rf "/tmp/rec_$tag"
}
threads() {  # seconds label pid...: each thread's share of a core over the window
    python3 scripts/device/thread_cpu.py "$1" "${@:3}" | sed "s/^/  $2 /"
}
single_max() {  # label bin-dir trial [node args...]: PLAYERS players --max into one node, 6 s
    local rel=$1 bin=$2 tag="single_${1}_$3" k plays=()
    "$bin/vision_preproc_node" --ros-args -r __ns:=/s$3$rel --params-file config/default.yaml -p backend:=cuda \
        -p network_image_width:=640 -p network_image_height:=640 "${@:4}" >"/tmp/node_$tag.log" 2>&1 &
    local node=$!
    "$CLI" record --count-only --tensor-topic /s$3$rel/tensor --timing-topic /s$3$rel/timing --duration 60 \
        >"/tmp/rec_$tag.log" 2>&1 &
    local rec=$!
    for k in $(seq "${PLAYERS:-3}"); do
        timeout 60 "$CLI" play "$R/bags/bgr8_1920x1080" --loop --restamp --max --duration 6 --image-topic /s$3$rel/image \
            --camera-info-topic /s$3$rel/camera_info --wait-subscribers 1 >"/tmp/play_${tag}_$k.log" 2>&1 &
        plays+=($!)
    done
    # The window: about seconds 2-5 of the players' 6 (the node is up within a second).
    sleep 3; threads 3 "$rel node" "$node"
    wait "${plays[@]}"; sleep 1
    kill -TERM "$node"; stop_or_kill node "$node"
    kill -TERM "$rec" 2>/dev/null; stop_or_kill subscriber "$rec"
    local sent; sent=$(cat /tmp/play_${tag}_*.log | grep -o 'play: [0-9]* images' | awk '{s += $2} END {print s}')
    echo "single $rel trial $3 (--max, ${PLAYERS:-3} players): sent $sent; $(grep -o 'stopped:.*' "/tmp/node_$tag.log"); published/s $(grep -o 'stopped: [0-9]* frames received, [0-9]*' "/tmp/node_$tag.log" | awk '{printf "%.0f", $5 / 6}')"
    grep -h "node-added" "/tmp/rec_$tag.log" | sed "s/^/  $rel /"
}
single_30() {  # release bin-dir trial: one player at 30 Hz, 10 s: node-added latency
    local rel=$1 bin=$2 tag="single30_${1}_$3"
    "$bin/vision_preproc_node" --ros-args -r __ns:=/t$3$rel --params-file config/default.yaml -p backend:=cuda \
        -p network_image_width:=640 -p network_image_height:=640 >"/tmp/node_$tag.log" 2>&1 &
    local node=$!
    "$CLI" record --count-only --tensor-topic /t$3$rel/tensor --timing-topic /t$3$rel/timing --duration 60 \
        >"/tmp/rec_$tag.log" 2>&1 &
    local rec=$!
    timeout 60 "$CLI" play "$R/bags/bgr8_1920x1080" --loop --restamp --duration 10 --image-topic /t$3$rel/image \
        --camera-info-topic /t$3$rel/camera_info --wait-subscribers 1 >"/tmp/play_$tag.log" 2>&1
    sleep 1
    kill -TERM "$node"; stop_or_kill node "$node"
    kill -TERM "$rec" 2>/dev/null; stop_or_kill subscriber "$rec"
    echo "single $rel trial $3 (30 Hz): $(grep -o 'play: [0-9]* images' "/tmp/play_$tag.log"); $(grep -o 'stopped:.*' "/tmp/node_$tag.log")"
    grep -h "node-added" "/tmp/rec_$tag.log" | sed "s/^/  $rel /"
}
profile_run() {  # side: --max into one batched node or four nodes, threads of everything
    local side=$1 tag="profile_$1"
    start_side "$side" p "$tag" count
    play_cameras "$side" p "$tag" --duration 8 --max
    sleep 3
    threads 3 "$side" "${PIDS[@]}" "${PLAYS[@]}" "${RECS[@]}"
    wait "${PLAYS[@]}"; sleep 1
    kill -TERM "${PIDS[@]}"; stop_or_kill node "${PIDS[@]}"
    kill -TERM "${RECS[@]}" 2>/dev/null; stop_or_kill subscriber "${RECS[@]}"
    # (The side's own logs only: `profile_batched_*` would also match batched_own's.)
    echo "profile $side: sent $(cat /tmp/play_${tag}_[0-9].log | grep -o 'play: [0-9]* images' | awk '{s += $2} END {print s}'); $(grep -ho 'stopped: [0-9]* frames received, [0-9]* published, [0-9]* dropped' /tmp/node_${tag}.log /tmp/node_${tag}_[0-9].log 2>/dev/null | tr '\n' ' ')"
}
single_all() {
    local P=/tmp/vp_prev; rm -rf "$P"; mkdir -p "$P"; tar xJf .device/prev.tar.xz -C "$P" || { echo "no .device/prev.tar.xz"; status=1; return; }
    echo "prev: commit $(cat "$P/COMMIT"); new: commit $(cat "$R/COMMIT")"
    local i
    for i in 1 2; do
        single_max prev "$P/bin" "$i"; single_max new "$R/bin" "$i"
    done
    for i in 1 2; do
        single_30 prev "$P/bin" "$i"; single_30 new "$R/bin" "$i"
    done
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
for sc in "${SCENARIOS[@]}"; do
    case "$sc" in
        healthy)  fault_run healthy "" retry ;;
        fallback) fault_run fallback VISION_PREPROC_INJECT_CUDA_FAULT=40 fallback ;;
        retry)    fault_run retry VISION_PREPROC_INJECT_CUDA_FAULT=40:transient retry ;;
        exit)     fault_run exit VISION_PREPROC_INJECT_CUDA_FAULT=40 exit ;;
        latency)  for size in 1280x720 1920x1080; do for i in 1 2 3; do latency_run "$size" "$i"; done; done 2>&1 | tee "$OUT/latency.log" ;;
        batch)    warm_up; for i in 1 2; do batch_run batched "$i"; batch_run separate "$i"; done 2>&1 | tee "$OUT/batch.log" ;;
        batchfault) warm_up; for pol in retry fallback; do batch_fault_run "$pol"; done 2>&1 | tee "$OUT/batchfault.log" ;;
        batchmax) warm_up; for rate in ${SWEEP_RATES:-1 2 4 6 8 max}; do for side in ${SWEEP_SIDES:-batched separate}; do sweep_run "$side" "$rate"; done; done 2>&1 | tee "$OUT/batchmax.log" ;;
        single)   warm_up; single_all 2>&1 | tee "$OUT/single.log" ;;
        single_own) warm_up; for i in 1 2; do single_max one "$R/bin" "$i"; single_max own "$R/bin" "$i" -p input_participants:=per_input; done 2>&1 | tee "$OUT/single_own.log" ;;
        profile)  warm_up; for side in ${PROFILE_SIDES:-batched separate}; do profile_run "$side"; done 2>&1 | tee "$OUT/profile.log" ;;
        cudaref)  tar xJf .device/py312.tar.xz -C "$R" || exit 1  # $R/py312 (scripts/device/py312_bundle.sh)
                  warm_up
                  { for m in ${CUDAREF_MODES:-check bench slow kill sanitizer batch rust ctypes}; do
                        if [[ $m == bench ]]; then for i in 1 2; do cudaref_run tensor "$i"; cudaref_run tensor_ref "$i"; done
                        elif [[ $m == batch ]]; then for i in 1 2; do cudaref_run batch_tensor "$i"; cudaref_run batch_tensor_ref "$i"; done
                        elif [[ $m == prev ]]; then
                            rm -rf /tmp/vp_prev && mkdir -p /tmp/vp_prev && tar xJf .device/prev.tar.xz -C /tmp/vp_prev || { echo "no .device/prev.tar.xz"; status=1; continue; }
                            echo "prev: commit $(cat /tmp/vp_prev/COMMIT); this: commit $(cat "$R/COMMIT")"
                            for i in 1 2; do cudaref_run prev_ref "$i"; cudaref_run tensor_ref "$i"; done
                        else cudaref_run "$m"; fi
                    done; } 2>&1 | tee "$OUT/cudaref.log" ;;
        handoff)  warm_up; { handoff_run same 1; for i in 1 2; do handoff_run tensor "$i"; handoff_run ref "$i"; done; } 2>&1 | tee "$OUT/handoff.log" ;;
        startup)  { for i in 1 2 3; do rm -rf "$VISION_PREPROC_KERNEL_CACHE"; startup_run "cold$i"; startup_run "warm$i"; done; } 2>&1 | tee "$OUT/startup.log" ;;
        *) echo "unknown scenario $sc"; exit 2 ;;
    esac
done
nvidia-smi --query-gpu=clocks.sm,clocks.mem --format=csv
exit $status
