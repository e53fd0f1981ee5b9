# The two commands of the README:  make demo  and  make test.
# Both set up everything on a fresh machine first (scripts/setup/setup.sh, idempotent).
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
ENV := source .ros/env.sh

.PHONY: demo test setup build lint colcon aarch64 clean

demo: build
	$(ENV) && python3 scripts/demo.py

test: build
	scripts/test.sh

setup:
	scripts/setup/setup.sh

build: setup
	$(ENV) && cargo build --release --bins

# The same three clippy runs as scripts/test.sh: the product, with the test hooks (and the
# GStreamer capture, feature gstreamer), and without ROS and CUDA.
lint: setup
	$(ENV) && cargo fmt --check && cargo clippy --release --all-targets -- -D warnings \
	  && cargo clippy --release --all-targets --features fault-injection,bench,gstreamer -- -D warnings \
	  && cargo clippy --release --all-targets --no-default-features -- -D warnings \
	  && RUSTDOCFLAGS="-D warnings" cargo doc --release --no-deps --lib --features fault-injection,bench,gstreamer

# The Jetson's CPU: cross build for aarch64, clippy for aarch64, the CPU specification
# tests and a bit-exact CLI parity check under qemu (docs/JETSON.md). Needs no ROS set-up.
aarch64:
	scripts/aarch64/aarch64.sh

# Build both packages with colcon into build/ install/ (what a ROS user does).
colcon: setup
	$(ENV) && colcon build --base-paths . msgs --cargo-args --release

clean:
	rm -rf target target-* build install log
