#!/usr/bin/env bash
# The lint step, one list for `make lint` and `make test` (scripts/test.sh runs it first):
# cargo fmt --check, cargo clippy -D warnings in four feature configurations, cargo doc
# -D warnings. Each configuration compiles code the others do not:
#   - the product (the default features ros, cuda, gstreamer) alone reports what only the
#     test hooks use (dead code, unused imports in the product);
#   - with the test hooks (VISION_PREPROC_TEST_FEATURES, as the Rust tests build), the
#     hooks themselves;
#   - without the default features, the library, the CLI and the stubs (ros_stub.rs,
#     backend/cuda_stub.rs: `#[cfg(not(feature = "ros"/"cuda"))]`) build without ROS,
#     CUDA and GStreamer (docs/ARCHITECTURE.md): the crate's build without default
#     features, every target, checked on every run;
#   - ROS and CUDA without GStreamer, the library and the binaries: the node's code for a
#     build without cameras (`#[cfg(feature = "gstreamer")]` in src/ros/node/), which no
#     other configuration compiles (a few seconds: only this crate is checked again).
# Then the library's documentation: every intra-doc link resolves, and public docs link
# no private item (rustdoc; a few seconds after clippy).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
[ -n "${AMENT_PREFIX_PATH:-}" ] || source .ros/env.sh
FEATURES="${VISION_PREPROC_TEST_FEATURES:-fault-injection,bench,gstreamer}"

cargo fmt --check
cargo clippy --release --all-targets -- -D warnings
cargo clippy --release --all-targets --features "$FEATURES" -- -D warnings
cargo clippy --release --all-targets --no-default-features -- -D warnings
cargo clippy --release --lib --bins --no-default-features --features ros,cuda -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --release --no-deps --lib --features "$FEATURES"
