#!/usr/bin/env bash
# On the device machine, from the staged folder (bench/klab/klab_stage.sh): the lab run,
# then Nsight Compute on the kernels named in $KLAB_NCU (LABEL:CASE ...). Output in $OUT.
#   KLAB_ITERS (300), KLAB_SWEEP (150), KLAB_VARIANTS (all staged), KLAB_NCU ("v0:4k default:4k")
set -uo pipefail
out=${OUT:-/tmp/klab_out}
mkdir -p "$out" cubins
tar -C cubins -xJf cubins.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,driver_version --format=csv | tee "$out/nvidia_smi.txt"
export PYTHONUNBUFFERED=1
python3 kernel_lab.py --kernels kernels --cubins cubins --out "$out" --iters "${KLAB_ITERS:-300}" \
    --sweep "${KLAB_SWEEP:-150}" ${KLAB_VARIANTS:+--variants "$KLAB_VARIANTS"} ${KLAB_SKIP:+--skip "$KLAB_SKIP"} 2>&1 | tail -n 400 > "$out/lab_stdout.txt"
cat "$out/lab_stdout.txt" | tail -n 60
sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section ComputeWorkloadAnalysis"
metrics="gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
for spec in ${KLAB_NCU:-v0:4k default:4k}; do
    echo "===== ncu $spec =====" >> "$out/ncu.txt"
    timeout 120 ncu --clock-control none $sections --metrics "$metrics" -k regex:resize_normalize --launch-skip 3 --launch-count 1 \
        python3 kernel_lab.py --kernels kernels --cubins cubins --profile "$spec" >> "$out/ncu.txt" 2>&1 || {
        echo "ncu $spec failed: $?; again without --metrics" >> "$out/ncu.txt"
        timeout 120 ncu --clock-control none $sections -k regex:resize_normalize --launch-skip 3 --launch-count 1 \
            python3 kernel_lab.py --kernels kernels --cubins cubins --profile "$spec" >> "$out/ncu.txt" 2>&1; }
done
grep -E "=====|Duration|DRAM Throughput|L1/TEX Hit|L2 Hit|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Issue Slots Busy|Executed Ipc A|No Eligible|Warp Cycles Per Issued|gpu__time|inst_executed|dram__bytes|sectors_pipe|requests_pipe|wavefronts" "$out/ncu.txt" | head -n 150
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm --format=csv >> "$out/nvidia_smi.txt"
