#!/usr/bin/env bash
# The binaries with the test hooks (cargo features `fault-injection` and `bench`, and
# `gstreamer` (src/capture/, not in the product yet), which
# the product built by `make build` does not contain) into target/fault-injection/, for
# the tests that inject faults (test/ros/test_gpu_failure.py, through
# python/vptools/rosharness.py); target/release/ keeps the product binaries.
#
# Both builds stay in cargo's cache (target/release/deps holds one per feature set), so
# after `cargo test --features fault-injection,bench` (scripts/test.sh) this compiles
# nothing: cargo only links the right build into target/release/ again.
#
# Usage: scripts/test_hooks_build.sh      (after `source .ros/env.sh`, or it sources it)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
[ -n "${AMENT_PREFIX_PATH:-}" ] || source .ros/env.sh
FEATURES="${VISION_PREPROC_TEST_FEATURES:-fault-injection,bench,gstreamer}"

cargo build --release --bins --features "$FEATURES"
mkdir -p target/fault-injection
cp -f target/release/vision_preproc_node target/release/vision_preproc_lifecycle_node target/release/vision_preproc \
  target/fault-injection/
# The product again in target/release/ (cached: no compilation after `make build`).
cargo build --release --bins
