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

# The lint step of `make test` (scripts/lint.sh: cargo fmt, clippy -D warnings in the
# feature configurations that compile different code, cargo doc -D warnings).
lint: setup
	scripts/lint.sh

# The Jetson's CPU: cross build for aarch64 (with the GStreamer cameras), clippy for
# aarch64, the CPU specification and capture tests and a bit-exact CLI parity check under
# qemu (docs/JETSON.md). Needs no ROS set-up.
aarch64:
	scripts/aarch64/aarch64.sh

# Build both packages with colcon into build/ install/ (what a ROS user does).
colcon: setup
	$(ENV) && colcon build --base-paths . msgs --cargo-args --release

clean:
	rm -rf target target-* build install log
