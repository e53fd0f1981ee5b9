"""NVRTC through ctypes, as the crate compiles its kernels (src/backend/cuda/kernels.rs):
the source with `common.cuh` as an in-memory header, the options of
kernels/nvrtc_options.txt plus --gpu-architecture, --std=c++17, --generate-line-info.
Returns the CUBIN. Works without a GPU (NVRTC is a plain library)."""

import ctypes
import glob
import os

_LIB = None


def _candidates():
    env = os.environ.get("KLAB_NVRTC")
    if env:
        yield env
    for d in [os.environ.get("VISION_PREPROC_NVRTC_DIR", ""), "/usr/local/cuda/targets/x86_64-linux/lib",
              "/usr/local/cuda/lib64"]:
        if d:
            for name in sorted(glob.glob(os.path.join(d, "libnvrtc.so*")), reverse=True):
                if "builtins" not in name and "alt" not in name:
                    yield name
    # pip wheels (cupy's environment on the device machine ships nvidia-cuda-nvrtc)
    try:
        import nvidia  # noqa: F401
        for base in nvidia.__path__:
            for name in sorted(glob.glob(os.path.join(base, "*", "lib", "libnvrtc.so*")), reverse=True):
                if "builtins" not in name and "alt" not in name:
                    yield name
    except ImportError:
        pass
    yield "libnvrtc.so"


def lib():
    global _LIB
    if _LIB is None:
        err = []
        for c in _candidates():
            try:
                _LIB = ctypes.CDLL(c)
                _LIB._path = c
                break
            except OSError as e:
                err.append(f"{c}: {e}")
        if _LIB is None:
            raise RuntimeError("no libnvrtc: " + "; ".join(err))
    return _LIB


def version():
    l = lib()
    a, b = ctypes.c_int(), ctypes.c_int()
    l.nvrtcVersion(ctypes.byref(a), ctypes.byref(b))
    return a.value, b.value


def read_options(path):
    """The -D options of kernels/nvrtc_options.txt (one per line, '#' comments)."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line and not line.startswith("#"):
                out.append(line)
    return out


def compile_cubin(source, header, options, name="resize_normalize.cu"):
    """(cubin bytes, log). Raises on a compile error with the log."""
    _, cub, log = compile_program(source, header, options, name)
    return cub, log


def compile_program(source, header, options, name="resize_normalize.cu"):
    """(PTX text as bytes, CUBIN bytes or b"" for a compute_XX target, log). Raises on a
    compile error with the log."""
    l = lib()
    prog = ctypes.c_void_p()
    hdr = ctypes.c_char_p(header.encode())
    hdr_name = ctypes.c_char_p(b"common.cuh")
    headers = (ctypes.c_char_p * 1)(hdr)
    names = (ctypes.c_char_p * 1)(hdr_name)
    r = l.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 1, headers, names)
    if r != 0:
        raise RuntimeError(f"nvrtcCreateProgram: {r}")
    opts = [o.encode() for o in options]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    r = l.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    l.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    l.nvrtcGetProgramLog(prog, buf)
    log = buf.value.decode(errors="replace").strip()
    if r != 0:
        l.nvrtcDestroyProgram(ctypes.byref(prog))
        raise RuntimeError(f"compile failed ({r}):\n{log}")
    l.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    l.nvrtcGetPTX(prog, ptx)
    cub = b""
    if any(o.startswith("--gpu-architecture=sm_") for o in options):
        l.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        c = ctypes.create_string_buffer(size.value)
        l.nvrtcGetCUBIN(prog, c)
        cub = c.raw
    l.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value, cub, log


def base_options(repo, arch="sm_90"):
    return ([f"--gpu-architecture={arch}", "--std=c++17", "--generate-line-info"]
            + read_options(os.path.join(repo, "kernels", "nvrtc_options.txt")))
