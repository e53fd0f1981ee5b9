#!/usr/bin/env bash
# Every CPU-machine benchmark of docs/BENCHMARKS.md that runs from one checkout: the node
# through DDS against the Python reference node, the CPU backend against OpenCV + NumPy,
# start-up and RSS, the Fast DDS segment size, then the plots and the tables. One command,
# from the repository root, on an otherwise quiet machine (each step records the load
# average):   bash bench/run_cpu_machine.sh      (~30 min on 2 cores)
# Results: docs/evidence/*.json (the files docs/BENCHMARKS.md cites; docs/evidence/README.md
# says what each shows); plots: docs/img/*.png; tables: out/bench_tables.md (not kept).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source .ros/env.sh
cargo build --release --bins
# bench-cpu (bench_cpu.py): the CLI with the `bench` feature, in target/fault-injection/.
scripts/test_hooks_build.sh
R=docs/evidence
mkdir -p "$R"
# The node through DDS vs the Python reference node (rclpy camera publisher), 3 runs.
python3 bench/bench_node.py --runs 3 --seconds 15 --out "$R/node.json"
# CPU backend vs OpenCV + NumPy, 3 sizes x 3 encodings, 3 runs.
python3 bench/bench_cpu.py --runs 3 --rounds 3 --frames 100 --out "$R/cpu.json" --markdown
# Start-up (cold / warm) and RSS at 1080p.
python3 bench/bench_startup.py --repeats 5 --warm 2 --hold 3 --out "$R/startup.json"
# Memory: the Fast DDS shared-memory segment size (in every participant) vs the node's RSS
# and delivery at 1920x1080 bgr8 30 Hz.
for mb in 16 32 128; do
    python3 bench/bench_node.py --runs 3 --seconds 12 --nodes vision_preproc --sizes 1920x1080 --rates 30 \
        --segment-mb "$mb" --out "$R/shm_${mb}mb.json"
done
# Heap: the same with glibc's mmap threshold fixed at 1 MB (freed frame buffers go back to the OS).
MALLOC_MMAP_THRESHOLD_=1048576 python3 bench/bench_node.py --runs 3 --seconds 12 --nodes vision_preproc \
    --sizes 1920x1080 --rates 30 --out "$R/malloc_mmap_threshold.json"
# The same DDS runs at 30 Hz with the Rust player as the camera (less CPU for the publisher).
python3 bench/bench_node.py --runs 3 --seconds 15 --publisher rust --rates 30 --out "$R/node_rust_player.json"
python3 bench/plot.py
mkdir -p out && python3 bench/tables.py > out/bench_tables.md
