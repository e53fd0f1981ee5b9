#!/usr/bin/env bash
# The aarch64 stage (`make aarch64`; `VP_AARCH64=1 make test` runs it after the other
# tests): the Jetson's CPU, cross-compiled here and run under qemu-user.
#
# 1. Installs what it needs from Debian 12's packages (idempotent: nothing to do in a
#    second run): the arm64 architecture, Debian's Rust 1.96 (rustc-web, cargo-web,
#    rust-web-clippy) with its aarch64 standard library (libstd-rust-web-dev:arm64), the
#    aarch64 GNU linker and C library (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross),
#    qemu-user, and Debian's arm64 GStreamer through multiarch (libgstreamer1.0-dev:arm64,
#    the base libraries and the base and good plugins; libgstreamer-plugins-base1.0-dev's
#    two .pc files made from the host's, below: on a Jetson the CSI and USB cameras are
#    GStreamer sources) beside the x86-64 gst-launch-1.0 that test/gst_capture.rs takes
#    as its oracle. The rustup toolchain stays first on PATH;
#    only this script uses /usr/bin's.
# 2. clippy -D warnings for aarch64 (every target, the CUDA backend and the GStreamer
#    capture compiled in, no ROS).
# 3. Builds the library and the `vision_preproc` CLI for aarch64-unknown-linux-gnu
#    (CUDA compiled in, loaded at run time; GStreamer; no ROS) into target/aarch64/, and
#    the same CLI for x86-64 into target/aarch64-x86/ (the rustup toolchain, like `make
#    build`), unless VP_AARCH64_X86_CLI names one already built (`make test` passes its
#    target/release/vision_preproc: the tensors do not depend on the profile, docs/JETSON.md).
# 4. Runs under qemu the CPU specification tests (test/cpu_spec.rs, test/errors.rs,
#    test/fuzz_corpus.rs and the library's unit tests): the fast pass (NEON and scalar)
#    against the per-element definition, bit for bit; and the capture tests
#    (test/gst_capture.rs: videotestsrc, pngdec, ... through the arm64 GStreamer, each
#    frame against the x86-64 gst-launch-1.0's bytes), but for the two that qemu-user
#    cannot run (named below, with why).
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
# The packages of both architectures are named with theirs (`dpkg -s` refuses an
# unqualified name that is installed for two).
HOST_ARCH="$(dpkg --print-architecture)"
PACKAGES=(rustc-web cargo-web rust-web-clippy libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu
          libc6-dev-arm64-cross qemu-user
          libgstreamer1.0-dev:arm64 libgstreamer-plugins-base1.0-0:arm64 liborc-0.4-dev:arm64
          gstreamer1.0-plugins-base:arm64 gstreamer1.0-plugins-good:arm64
          gstreamer1.0-tools "gstreamer1.0-plugins-base:$HOST_ARCH" "gstreamer1.0-plugins-good:$HOST_ARCH"
          libgstreamer-plugins-base1.0-dev)
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
# libgstreamer-plugins-base1.0-dev is not co-installable for two architectures in Debian
# 12 (not Multi-Arch: same): its arm64 build would remove the host's, which every x86-64
# build of the crate needs (it did on 2026-12-07: apt removed it for the others on this
# machine). So it is not installed for arm64; of its files, the crate links through two
# (gstreamer-app-1.0 and gstreamer-video-1.0: the .pc and the library's link name), made
# here from the host's .pc (the same version: the runtime libraries of both
# architectures are) and pointed at the arm64 runtime libraries.
ARM_MULTIARCH=/usr/lib/aarch64-linux-gnu
GST_DEV="$ARM_DIR/gst-plugins-base-dev"
mkdir -p "$GST_DEV/pkgconfig" "$GST_DEV/lib"
for lib in app video; do
    sed "s|^libdir=.*|libdir=$GST_DEV/lib|" "/usr/lib/x86_64-linux-gnu/pkgconfig/gstreamer-$lib-1.0.pc" \
        >"$GST_DEV/pkgconfig/gstreamer-$lib-1.0.pc"
    ln -sfn "$ARM_MULTIARCH/libgst$lib-1.0.so.0" "$GST_DEV/lib/libgst$lib-1.0.so"
done
step "packages"

# Debian's toolchain (its rustc has the aarch64 standard library), for this script only.
# The runner makes `cargo test` run the aarch64 test binaries under qemu.
# GStreamer for the target: pkg-config reads the arm64 .pc files of multiarch (the
# variables scoped to the target, so that build scripts for the host still see the
# host's); the linker resolves the libraries GStreamer itself needs (glib, ...) there too.
# Under qemu, GST_REGISTRY_FORK=no: GStreamer scans its plugins in the process instead of
# starting its aarch64 gst-plugin-scanner, which qemu-user cannot exec (no binfmt_misc
# here); the registry is the aarch64 one (registry.aarch64.bin, beside the host's).
xcargo() {
    env PATH="/usr/bin:$PATH" RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$QEMU" \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C link-arg=-Wl,-rpath-link,$ARM_MULTIARCH" \
        CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
        AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
        PKG_CONFIG_ALLOW_CROSS_aarch64_unknown_linux_gnu=1 \
        PKG_CONFIG_LIBDIR_aarch64_unknown_linux_gnu="$GST_DEV/pkgconfig:$ARM_MULTIARCH/pkgconfig:/usr/share/pkgconfig" \
        GST_REGISTRY_FORK=no \
        CARGO_TARGET_DIR="$ARM_DIR" \
        /usr/bin/cargo "$@"
}
# SQLite from its sources (bundled-sqlite): the cross sysroot has no arm64 libsqlite3.
# `bench`: the CLI's bench-cpu, which aarch64_insn_count.py runs under qemu. `gstreamer`:
# the cameras (a Jetson's CSI and USB cameras are GStreamer sources).
ARM_ARGS=(--profile aarch64 --target "$TARGET" --no-default-features
          --features cuda,bench,bundled-sqlite,gstreamer)
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
if [ -n "${VP_AARCH64_X86_CLI:-}" ]; then
    X86_CLI="$VP_AARCH64_X86_CLI"
    log "x86-64 CLI: $X86_CLI (VP_AARCH64_X86_CLI; not built again)"
else
    CARGO_TARGET_DIR="$X86_DIR" cargo build --profile aarch64 --no-default-features --features cuda,bench \
        --bin vision_preproc
    X86_CLI="$X86_DIR/aarch64/vision_preproc"
    step "build the x86-64 CLI"
fi

# 4. The specification and capture tests under qemu (the runner above). Skipped, as qemu
# cannot run them (they run natively on a Jetson and on x86-64 in `make test`):
# - restarting_100_times_leaks_no_fd_or_thread starts its own test binary again as a
#   child, which qemu-user cannot exec (an aarch64 ELF, no binfmt_misc here);
# - every_bayer_order_equals_gst_launch_byte_for_byte needs rgb2bayer, of
#   gstreamer1.0-plugins-bad, whose arm64 build would pull in 147 more packages.
QEMU_SKIPS=(restarting_100_times_leaks_no_fd_or_thread every_bayer_order_equals_gst_launch_byte_for_byte)
log "skipped under qemu: ${QEMU_SKIPS[*]}"
xcargo test "${ARM_ARGS[@]}" --lib --test cpu_spec --test errors --test fuzz_corpus --test gst_capture \
    -- "${QEMU_SKIPS[@]/#/--skip=}"
step "spec and capture tests under qemu"

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
# /opt/ros/<distro> for arm64; the default feature `gstreamer` finds the arm64 GStreamer
# of step 1 through xcargo's pkg-config). There is none on PyPI (the wheels are x86-64
# only).
if [ -n "${VP_AARCH64_ROS_PREFIX:-}" ]; then
    log "type-checking the node for aarch64 against $VP_AARCH64_ROS_PREFIX"
    # shellcheck disable=SC1091
    (source "$VP_AARCH64_ROS_PREFIX/setup.bash" && xcargo check --profile aarch64 --target "$TARGET" --features bundled-sqlite --bins)
    step "ROS node type-check (aarch64)"
else
    log "ROS node for aarch64: not checked (no ROS 2 for aarch64 here; set VP_AARCH64_ROS_PREFIX)"
fi
log "passed"
