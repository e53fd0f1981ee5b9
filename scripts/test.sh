#!/usr/bin/env bash
# Every test of vision_preproc, in order of cost. Called by `make test` (after set-up and
# build) and nothing else calls it: CI runs `make test`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source .ros/env.sh

section() { printf '\n==== %s ====\n' "$*"; }

section "lint: cargo fmt --check, cargo clippy -D warnings"
cargo fmt --check
cargo clippy --release --all-targets -- -D warnings

section "Rust tests (unit + integration, CPU; GPU tests report 'no GPU' and are not counted)"
cargo test --release --all-targets 2>&1

section "Python tests (OpenCV oracle, real DDS between processes, colcon install)"
python3 -m pytest -v -rA test/python test/ros
