#!/usr/bin/env bash
# The aarch64 stage (`make aarch64`; `VP_AARCH64=1 make test` runs it after the other
# tests): the Jetson's CPU, cross-compiled here and run under qemu-user.
#
# 1. Installs what it needs from Debian 12's packages (idempotent: nothing to do in a
#    second run): the arm64 architecture, Debian's Rust 1.96 (rustc-web, cargo-web,
#    rust-web-clippy) with its aarch64 standard library (libstd-rust-web-dev:arm64), the
#    aarch64 GNU linker and C library (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross), and
#    qemu-user. The rustup toolchain stays first on PATH; only this script uses /usr/bin's.
# 2. clippy -D warnings for aarch64 (every target, the CUDA backend compiled in, no ROS).
# 3. Builds the library and the `vision_preproc` CLI for aarch64-unknown-linux-gnu
#    (CUDA compiled in, loaded at run time; no ROS) into target/aarch64/, and the same CLI
#    for x86-64 into target/aarch64-x86/ (the rustup toolchain, like `make build`).
# 4. Runs under qemu the CPU specification tests (test/cpu_spec.rs, test/errors.rs,
#    test/fuzz_corpus.rs and the library's unit tests): the fast pass (NEON and scalar)
#    against the per-element definition, bit for bit.
# 5. The CLI parity check: the aarch64 CLI against the x86-64 CLI, bit for bit, over every
#    encoding, resize mode, layout and dtype, conv2d kernels and photographs
#    (scripts/aarch64/aarch64_parity.py), once with NEON and once with the scalar loops forced;
#    `vision_preproc info` under qemu must say NEON.
# 6. Type-checks the ROS node for aarch64 if a ROS installation for aarch64 exists
#    (docs/JETSON.md: there is none here, so it says so and skips).
#
# Profile `aarch64` (Cargo.toml): release without debug info, dependencies at opt-level 1.
# Usage: scripts/aarch64/aarch64.sh      (a fresh clone: about 12-20 minutes on 2 cores, docs/JETSON.md)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# The kernels for the Orin (sm_87) are compiled by build.rs on this (host) machine when
# NVRTC is there: the set-up's PyPI NVRTC, if `make build` has run (else the aarch64 CLI
# compiles them at start-up, and cargo says so).
NVRTC_LIB="$ROOT/.ros/venv/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib"
if [ -z "${VISION_PREPROC_NVRTC_DIR:-}" ] && [ -d "$NVRTC_LIB" ]; then
    export VISION_PREPROC_NVRTC_DIR="$NVRTC_LIB"
fi
TARGET=aarch64-unknown-linux-gnu
ARM_DIR="$ROOT/target/aarch64"
X86_DIR="$ROOT/target/aarch64-x86"
SYSROOT=/usr/aarch64-linux-gnu
# qemu-user runs the aarch64 binaries with the C library of the cross toolchain, loader
# AND libc.so.6 from $SYSROOT. Not `-L $SYSROOT` alone: its loader (glibc 2.36-8cross1)
# then reads the host's /etc/ld.so.cache and loads /lib/aarch64-linux-gnu/libc.so.6 of
# libc6:arm64 (2.36-9+deb12u14, which libstd-rust-web-dev:arm64 pulls in), whose
# private view of the loader's `_rtld_global` (4520 bytes there, 4512 in the cross
# loader) differs: the first pthread_create walks a stack-cache list at the wrong offset
# and never returns (the `run-file` hang of issue 23; docs/JETSON.md). On a Jetson the
# loader and libc come from one package, so they always match.
QEMU="${VP_QEMU:-qemu-aarch64} -L $SYSROOT -E LD_LIBRARY_PATH=$SYSROOT/lib"
log() { printf '[aarch64] %s\n' "$*"; }
T0=$SECONDS
STEP_T0=$SECONDS
TIMES=()
step() { TIMES+=("$(printf '%5d s  %s' $((SECONDS - STEP_T0)) "$1")"); STEP_T0=$SECONDS; }
trap 'printf "\n==== aarch64 stage: wall time per step ====\n"; printf "%s\n" "${TIMES[@]}"; printf "%5d s  total\n" $((SECONDS - T0))' EXIT

# 1. Packages.
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
PACKAGES=(rustc-web cargo-web rust-web-clippy libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu
          libc6-dev-arm64-cross qemu-user)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        log "dpkg: adding the arm64 architecture"
        $SUDO dpkg --add-architecture arm64
    fi
    log "apt: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
else
    log "apt: ${PACKAGES[*]} present"
fi
step "packages"

# Debian's toolchain (its rustc has the aarch64 standard library), for this script only.
# The runner makes `cargo test` run the aarch64 test binaries under qemu.
xcargo() {
    env PATH="/usr/bin:$PATH" RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$QEMU" \
        CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
        AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
        CARGO_TARGET_DIR="$ARM_DIR" \
        /usr/bin/cargo "$@"
}
# SQLite from its sources (bundled-sqlite): the cross sysroot has no arm64 libsqlite3.
# `bench`: the CLI's bench-cpu, which aarch64_insn_count.py runs under qemu.
ARM_ARGS=(--profile aarch64 --target "$TARGET" --no-default-features --features cuda,bench,bundled-sqlite)
log "toolchain: $(/usr/bin/rustc --version), $(${VP_QEMU:-qemu-aarch64} --version | head -1)"

# 2. Lint for aarch64: what only this target compiles (the NEON path; the AVX2 path out).
xcargo clippy "${ARM_ARGS[@]}" --all-targets -- -D warnings
step "clippy -D warnings (aarch64)"

# 3. The CLI for both architectures.
xcargo build "${ARM_ARGS[@]}" --bin vision_preproc
ARM_CLI="$ARM_DIR/$TARGET/aarch64/vision_preproc"
kind="$(file "$ARM_CLI")"
echo "$kind"
grep -q "ARM aarch64" <<<"$kind" || { log "$ARM_CLI is not an aarch64 binary"; exit 1; }
step "build the aarch64 CLI"
CARGO_TARGET_DIR="$X86_DIR" cargo build --profile aarch64 --no-default-features --features cuda,bench \
    --bin vision_preproc
X86_CLI="$X86_DIR/aarch64/vision_preproc"
step "build the x86-64 CLI"

# 4. The specification tests under qemu (the runner above).
xcargo test "${ARM_ARGS[@]}" --lib --test cpu_spec --test errors --test fuzz_corpus
step "spec tests under qemu"

# 5. NEON is taken, and the CLI parity (NEON, then the scalar loops).
info="$($QEMU "$ARM_CLI" info)"
echo "$info"
grep -q "Neon" <<<"$info" || { log "vision_preproc info under qemu does not report NEON"; exit 1; }
python3 scripts/aarch64/aarch64_parity.py --x86 "$X86_CLI" --arm "$QEMU $ARM_CLI" \
    --work "$ARM_DIR/parity-neon"
step "CLI parity x86-64 = aarch64 NEON"
python3 scripts/aarch64/aarch64_parity.py --x86 "$X86_CLI" --arm "$QEMU $ARM_CLI" \
    --arm-extra=--cpu-simd=baseline --work "$ARM_DIR/parity-scalar"
step "CLI parity x86-64 = aarch64 scalar"

# 6. The ROS node: r2r's build script runs bindgen on the ROS headers and links the ROS
# libraries, so a check needs a ROS 2 installation for aarch64 (a sysroot with
# /opt/ros/<distro> for arm64), and the default feature `gstreamer` the arm64 GStreamer
# development packages in that sysroot (libgstreamer1.0-dev:arm64,
# libgstreamer-plugins-base1.0-dev:arm64; found through pkg-config). There is none on PyPI
# (the wheels are x86-64 only).
if [ -n "${VP_AARCH64_ROS_PREFIX:-}" ]; then
    log "type-checking the node for aarch64 against $VP_AARCH64_ROS_PREFIX"
    # shellcheck disable=SC1091
    (source "$VP_AARCH64_ROS_PREFIX/setup.bash" && xcargo check --profile aarch64 --target "$TARGET" --features bundled-sqlite --bins)
    step "ROS node type-check (aarch64)"
else
    log "ROS node for aarch64: not checked (no ROS 2 for aarch64 here; set VP_AARCH64_ROS_PREFIX)"
fi
log "passed"
