#!/usr/bin/env python3
"""Is the shipped fused kernel's code unchanged? Compiles kernels/resize_normalize.cu (with
its common.cuh and nvrtc_options.txt) of a git revision and of the working tree as the
product does (build.rs and src/backend/cuda/kernels.rs: --std=c++17, --generate-line-info,
the -D options of kernels/nvrtc_options.txt; CUBIN for sm_87 and sm_90, PTX for
compute_87; the staged variant with -DRN_STAGED=1), and compares:
  - without line info: the PTX and the CUBIN of sm_87 and sm_90, byte for byte;
  - the product's own builds (with line info): the PTX without its .loc/.file directives,
    comments and .debug_* sections, and every CUBIN section but the line-info ones
    (.debug_*, .nv_debug_*, their relocations), byte for byte. Line info names the
    source's lines and inlined functions, so a comment or a renamed helper changes it.
Exit status 0 when every comparison is equal. No GPU needed (NVRTC only: `source
.ros/env.sh`).
usage: bench/klab/klab_same_code.py [--base REV (HEAD)] [--variant LABEL=-DA=1,-DB=2 ...]
"""

import argparse
import os
import re
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import klab_nvrtc  # noqa: E402

FILES = ("resize_normalize.cu", "common.cuh", "nvrtc_options.txt")
# (target, line info): the product's builds, then the ones compared byte for byte.
BUILDS = [("sm_87", True), ("sm_90", True), ("compute_87", True), ("sm_87", False), ("sm_90", False)]


def kernel_files(rev):
    """The three files of kernels/ at `rev` (None: the working tree)."""
    if rev is None:
        return [open(os.path.join(REPO, "kernels", f)).read() for f in FILES]
    return [subprocess.run(["git", "-C", REPO, "show", f"{rev}:kernels/{f}"], check=True,
                           capture_output=True, text=True).stdout for f in FILES]


def build(rev, extra, target, line_info):
    source, header, options = kernel_files(rev)
    defines = [l for l in options.splitlines() if l and not l.startswith("#")]
    opts = [f"--gpu-architecture={target}", "--std=c++17"] + (["--generate-line-info"] if line_info else [])
    ptx, cubin, log = klab_nvrtc.compile_program(source, header, opts + defines + extra)
    return ptx, cubin, log


def code_of_ptx(ptx):
    """The PTX without its line info and comments."""
    ptx = ptx.split(b"\n\t.section\t.debug", 1)[0]
    ptx = re.sub(rb"^\s*\.(loc|file)\b.*\n", b"", ptx, flags=re.M)
    ptx = re.sub(rb"//.*", b"", ptx)
    return re.sub(rb"^\s*\n", b"", ptx, flags=re.M)


def code_of_cubin(cubin):
    """{section name: bytes} of an ELF64 CUBIN, without the line-info sections."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = heads[shstrndx][4]
    out = {}
    for name_off, kind, _, _, off, size, *_ in heads:
        name = cubin[names + name_off: cubin.index(b"\0", names + name_off)].decode()
        if "debug" not in name:
            out[name] = cubin[off: off + size] if kind != 8 else b""  # 8: SHT_NOBITS
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="HEAD")
    ap.add_argument("--variant", action="append", default=[],
                    help="LABEL=-DA=1,-DB=2: also compare this variant (default: product, staged)")
    args = ap.parse_args()
    variants = {"product": [], "staged": ["-DRN_STAGED=1"]}
    for v in args.variant:
        label, _, defs = v.partition("=")
        variants[label] = [d for d in defs.split(",") if d]
    print(f"NVRTC {'%d.%d' % klab_nvrtc.version()} ({klab_nvrtc.lib()._path}); {args.base} against the working tree")
    different = 0
    for label, extra in variants.items():
        for target, line_info in BUILDS:
            (p0, c0, _), (p1, c1, log) = build(args.base, extra, target, line_info), build(None, extra, target, line_info)
            if line_info:
                same_ptx = code_of_ptx(p0) == code_of_ptx(p1)
                same_cubin = not c0 or code_of_cubin(c0) == code_of_cubin(c1)
                how = "without line info"
            else:
                same_ptx, same_cubin, how = p0 == p1, c0 == c1, "byte for byte"
            cub = f", CUBIN {'same' if same_cubin else 'DIFFERENT'} ({len(c0)} / {len(c1)} B)" if c0 else ""
            print(f"{label:8s} {target:10s} {'line info' if line_info else 'no line info':12s} {how:17s}: "
                  f"PTX {'same' if same_ptx else 'DIFFERENT'} ({len(p0)} / {len(p1)} B){cub}"
                  + (f"; NVRTC log: {log}" if log else ""), flush=True)
            different += (not same_ptx) + (not same_cubin)
    print("the same code" if different == 0 else f"{different} DIFFERENT")
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
