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

section "the product binaries hold no code of the crates Cargo.toml compiles at opt-level 0"
python3 - <<'EOF'
import glob, re, subprocess, tomllib
packages = tomllib.load(open("Cargo.toml", "rb"))["profile"]["release"].get("package", {})
crates = sorted(n.replace("-", "_") for n, p in packages.items() if str(p.get("opt-level")) == "0")
pattern = re.compile(r"(?<![\w:])(%s)::" % "|".join(crates))
def found(binary):
    nm = subprocess.run(["nm", "-C", binary], capture_output=True, text=True, check=True).stdout
    return sorted({m.group(1) for m in pattern.finditer(nm)})
for b in ["target/release/vision_preproc_node", "target/release/vision_preproc"]:
    assert not found(b), (f"{b} holds code of {found(b)}, which Cargo.toml's [profile.release.package.*] "
                          "compiles at opt-level 0 (as code generators for build scripts only): remove the "
                          "override of a crate the product now uses")
# The check can fail: the build script that runs these generators holds their code.
witness = found(glob.glob("target/release/build/r2r_msg_gen-*/build-script-build")[0])
assert len(witness) >= 3, witness
print(f"{len(crates)} crates at opt-level 0 ({', '.join(crates)}): none in the product binaries; "
      f"r2r_msg_gen's build script holds {', '.join(witness)}")
EOF

section "Rust tests (unit + integration, CPU, with the test hooks; GPU tests report 'no GPU' and are not counted)"
cargo test --release --all-targets --features "$VISION_PREPROC_TEST_FEATURES" 2>&1

section "the example: Config -> backend -> Pipeline::process on a photograph (examples/preprocess_file.rs)"
example="$(cargo run -q --release --features "$VISION_PREPROC_TEST_FEATURES" --example preprocess_file -- test/data/chelsea.png)"
echo "$example"
grep -q "451x300 -> tensor \[1, 3, 320, 320\] float32" <<<"$example" || { echo "the example printed something else"; exit 1; }

scripts/test_hooks_build.sh

section "Python tests (OpenCV oracle, real DDS between processes, colcon install)"
python3 -m pytest -v -rA --durations=15 test/python test/ros
