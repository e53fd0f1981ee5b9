#!/usr/bin/env bash
# Every test of vision_preproc, in order of cost. Called by `make test` (after set-up and
# build) and nothing else calls it: CI runs `make test`.
#
# The Rust tests run with the test hooks compiled in (cargo features `fault-injection`
# and `bench`, which the product does not contain); the Python tests run the product
# binaries of target/release/, except the fault-injection tests, which run the node with
# the hooks from target/fault-injection/ (scripts/test_hooks_build.sh). Both builds stay
# cached side by side, so `make demo` afterwards compiles nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source .ros/env.sh
export VISION_PREPROC_TEST_FEATURES="fault-injection,bench"

section() { printf '\n==== %s ====\n' "$*"; }

section "lint: cargo fmt --check, cargo clippy -D warnings (the product, with the test hooks, without ROS and CUDA)"
cargo fmt --check
cargo clippy --release --all-targets -- -D warnings
cargo clippy --release --all-targets --features "$VISION_PREPROC_TEST_FEATURES" -- -D warnings
# The library, the CLI and the stubs (ros_stub.rs, backend/cuda_stub.rs) build without
# ROS and without CUDA (docs/ARCHITECTURE.md).
cargo clippy --release --all-targets --no-default-features -- -D warnings

section "Rust tests (unit + integration, CPU, with the test hooks; GPU tests report 'no GPU' and are not counted)"
cargo test --release --all-targets --features "$VISION_PREPROC_TEST_FEATURES" 2>&1

section "the example: Config -> backend -> Pipeline::process on a photograph (examples/preprocess_file.rs)"
example="$(cargo run -q --release --features "$VISION_PREPROC_TEST_FEATURES" --example preprocess_file -- test/data/chelsea.png)"
echo "$example"
grep -q "451x300 -> tensor \[1, 3, 320, 320\] float32" <<<"$example" || { echo "the example printed something else"; exit 1; }

scripts/test_hooks_build.sh

section "Python tests (OpenCV oracle, real DDS between processes, colcon install)"
python3 -m pytest -v -rA --durations=15 test/python test/ros
