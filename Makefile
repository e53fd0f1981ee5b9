# The two commands of the README:  make demo  and  make test.
# Both set up everything on a fresh machine first (scripts/setup.sh, idempotent).
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
ENV := source .ros/env.sh

.PHONY: demo test setup build lint colcon clean

demo: build
	$(ENV) && python3 scripts/demo.py

test: build
	scripts/test.sh

setup:
	scripts/setup.sh

build: setup
	$(ENV) && cargo build --release --bins

# The same three clippy runs as scripts/test.sh: the product, with the test hooks, and
# without ROS and CUDA.
lint: setup
	$(ENV) && cargo fmt --check && cargo clippy --release --all-targets -- -D warnings \
	  && cargo clippy --release --all-targets --features fault-injection,bench -- -D warnings \
	  && cargo clippy --release --all-targets --no-default-features -- -D warnings

# Build both packages with colcon into build/ install/ (what a ROS user does).
colcon: setup
	$(ENV) && colcon build --base-paths . msgs --cargo-args --release

clean:
	rm -rf target build install log
