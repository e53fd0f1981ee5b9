#!/usr/bin/env bash
# Every test of vision_preproc, in order of cost. Called by `make test` (after set-up and
# build) and nothing else calls it: CI runs `make test`.
#
# The Rust tests run with the test hooks compiled in (cargo features `fault-injection`
# and `bench`, which the product does not contain); the Python tests run the product
# binaries of target/release/, except the fault-injection tests, which run the node with
# the hooks from target/fault-injection/ (scripts/test_hooks_build.sh). Both builds stay
# cached side by side, so `make demo` afterwards compiles nothing. The colcon test builds
# from a copy of target/release (test/ros/conftest.py) and compiles nothing either.
#
# Each stage's wall time is printed at the end (the machine is 2 cores: compare stages).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source .ros/env.sh
export VISION_PREPROC_TEST_FEATURES="fault-injection,bench,gstreamer"

STAGE="" STAGE_T0=$SECONDS NVRTC_PID=""
TIMES=()
stage_done() { [ -z "$STAGE" ] || TIMES+=("$(printf '%5d s  %s' $((SECONDS - STAGE_T0)) "$STAGE")"); }
# section NAME DESCRIPTION: starts the stage NAME of the time summary.
section() { stage_done; STAGE="$1" STAGE_T0=$SECONDS; printf '\n==== %s ====\n' "$2"; }
summary() { stage_done; STAGE=""; printf '\n==== wall time per stage (uptime: %s) ====\n' "$(uptime | sed 's/.*load/load/')"; printf '%s\n' "${TIMES[@]}"; }
trap summary EXIT

section lint "lint: cargo fmt --check, cargo clippy -D warnings (the product, with the test hooks, without ROS, CUDA and GStreamer, without GStreamer), cargo doc -D warnings"
# The one lint step of `make lint` too: the configurations and why each is there.
scripts/lint.sh

section profile "the product binaries hold no code of the crates Cargo.toml compiles at opt-level 0"
python3 scripts/check_release_profile.py

section rust "Rust tests (unit + integration, CPU, with the test hooks; GPU tests report 'no GPU' and are not counted)"
# `--tests` (every target whose `test` is on: the library, the CLI, the integration
# tests; not the node binary, `test = false`) rather than `--all-targets`, whose `--bins`
# builds a harness for every binary.
cargo test --release --tests --examples --benches --features "$VISION_PREPROC_TEST_FEATURES" --no-run 2>&1
# test/nvrtc_compile.rs checks the kernels build.rs embedded and compiles one file with
# NVRTC (a few seconds; it compiled every kernel, about a minute, before they were
# embedded): it runs in the background beside the other Rust tests, the example and the
# Python tests without ROS (none of which measures time), and is waited for before the
# ROS tests.
NVRTC_LOG=target/nvrtc_compile.log
cargo test --release --features "$VISION_PREPROC_TEST_FEATURES" --test nvrtc_compile >"$NVRTC_LOG" 2>&1 &
NVRTC_PID=$!
# If this script stops early: stop that cargo and the test binary it runs.
trap '[ -z "$NVRTC_PID" ] || { pkill -P "$NVRTC_PID" || true; kill "$NVRTC_PID" || true; } 2>/dev/null; summary' EXIT
# Every other target built above: the binaries with unit tests and the integration tests,
# named from Cargo.toml.
mapfile -t other_tests < <(cargo metadata --no-deps --format-version 1 | python3 scripts/test_targets.py nvrtc_compile)
cargo test --release --lib --examples --benches "${other_tests[@]}" --features "$VISION_PREPROC_TEST_FEATURES" 2>&1

section example "the example: Config -> backend -> Pipeline::process on a photograph (examples/preprocess_file.rs)"
example="$(cargo run -q --release --features "$VISION_PREPROC_TEST_FEATURES" --example preprocess_file -- test/data/chelsea.png)"
echo "$example"
grep -q "451x300 -> tensor \[1, 3, 320, 320\] float32" <<<"$example" || { echo "the example printed something else"; exit 1; }

section hooks "the binaries with the test hooks (target/fault-injection/)"
scripts/test_hooks_build.sh

section consumer_c "the C/C++ consumer (consumer_c/): CMake build into target/consumer_c, its unit tests (its test against the node is in test/ros)"
# -Werror on the library, the example and the tests; ctest runs consumer_c_unit (no node).
cmake -S consumer_c -B target/consumer_c -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build target/consumer_c -j 2
ctest --test-dir target/consumer_c --output-on-failure

section python "Python tests without ROS (OpenCV oracle, the CLI, replay, layering, docs)"
# In 2 workers (pytest-xdist, each file's tests in one worker): they measure no time and
# each works in its own tmp_path, so the 2 cores halve the stage (~36 -> ~19 s).
python3 -m pytest -v -rA --durations=10 -n 2 --dist loadfile test/python

section nvrtc "test/nvrtc_compile.rs (NVRTC, started in the background after the Rust build)"
nvrtc_status=0
wait "$NVRTC_PID" || nvrtc_status=$?
NVRTC_PID=""
cat "$NVRTC_LOG"
[ "$nvrtc_status" -eq 0 ] || { echo "test/nvrtc_compile.rs failed (exit $nvrtc_status)"; exit 1; }

section ros "ROS tests (real DDS between processes, colcon install)"
# In 3 workers (pytest-xdist; each its own ROS domain, python/vptools/rosharness.py; each
# file's tests in one worker; the colcon workspace built once, under a lock,
# test/ros/conftest.py): the tests mostly wait on cameras' rates, so 3 workers take ~1/3 of
# the time on 2 cores. Then the tests marked `alone` (the 60-s overload soak, which loads
# the machine on purpose), with nothing beside them.
python3 -m pytest -v -rA --durations=15 -n 3 --dist loadfile -m "not alone" test/ros
python3 -m pytest -v -rA --durations=5 -m alone test/ros

# The aarch64 stage (docs/JETSON.md): a second toolchain and an aarch64 build (clippy,
# the CLI, the test binaries), over 10 minutes on the 2-core machine from a fresh clone,
# which would put `make test` over its budget; so only when asked.
if [ "${VP_AARCH64:-0}" = 1 ]; then
    section aarch64 "aarch64: cross build, clippy, the CPU spec and capture tests and the CLI parity under qemu (VP_AARCH64=1)"
    # The parity's x86-64 side: the CLI `make test` built (not a second x86-64 build).
    VP_AARCH64_X86_CLI="$ROOT/target/release/vision_preproc" scripts/aarch64/aarch64.sh
fi
