#!/usr/bin/env bash
# Stage the kernel lab for the device machine: compile every variant here (NVRTC through
# ctypes, the crate's options), pack the CUBINs, and copy the harness into DEST (a folder
# of the checkout that the device tool sends, ignored by git: e.g. <repo>/.klab, carried
# with carry [".klab"]).
#   bench/klab/klab_stage.sh DEST [VARIANTS]      (VARIANTS: comma list, default all)
# On the device:  cd .klab && bash run.sh          (writes to $OUT)
# The baseline "v0" is the kernel of `git show ${KLAB_BASE:-main}:kernels/resize_normalize.cu`.
# Needs numpy and libnvrtc here: `source .ros/env.sh` (NVRTC 12.9 of the venv, what the
# crate embeds), PYTHON=.ros/venv/bin/python.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
dest=${1:?usage: klab_stage.sh DEST [VARIANTS]}
variants=${2:-}
mkdir -p "$dest/kernels"
cp "$repo/kernels/resize_normalize.cu" "$repo/kernels/common.cuh" "$repo/kernels/nvrtc_options.txt" "$dest/kernels/"
git -C "$repo" show "${KLAB_BASE:-main}:kernels/resize_normalize.cu" > "$dest/kernels/resize_normalize_v0.cu"
cp "$here/kernel_lab.py" "$here/klab_nvrtc.py" "$here/klab_variants.py" "$here/klab_variants.cu" "$dest/"
[ -f "$here/klab_run.sh" ] && cp "$here/klab_run.sh" "$dest/run.sh"
cub=$(mktemp -d)
"${PYTHON:-python3}" "$here/kernel_lab.py" --compile --kernels "$dest/kernels" --cubins "$cub" ${variants:+--variants "$variants"}
tar -C "$cub" -cf - . | xz -T2 -6 > "$dest/cubins.tar.xz"
rm -rf "$cub"
ls -la "$dest"
