"""Build generated CUDA source: with nvcc into a fatbin for every supported architecture, or with
g++ against the CPU simulator (mica_cudasim.h). Cached by the hash of the source and the flags."""
import hashlib
import os
import shutil

from ...errors import MicaError
from ..c.build import cache_dir, compile_cached
from ..c.emit import SHARED_DIR, SHARED_HEADERS

HERE = os.path.dirname(os.path.abspath(__file__))
ARCHS = ("80", "86", "89", "90", "120")
HEADERS = tuple(os.path.join(HERE, h) for h in ("mica_cuda.h", "mica_cuda_kernels.h", "mica_cuda_attention.h",
                                                 "mica_cuda_attention_gemm.h", "mica_cuda_attention_tc.h",
                                                 "mica_cuda_sweeps.h", "mica_nccl.h",
                                                 "mica_cudasim.h", "mica_cudasim_nccl.h")) + SHARED_HEADERS


def nvcc():
    path = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if os.path.exists("/usr/local/bin/nvcc") else None)
    if path is None:
        raise MicaError("nvcc is not installed: install the CUDA toolkit (nvcc 13), or build with simulate=True")
    return path


def unusable():
    """None when the NVIDIA driver sees a GPU here, else why not (a few words)."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA driver is installed here (libcuda.so.1 is missing)"
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return "the NVIDIA driver finds no usable GPU here"
    return None


def wheel_dirs(module, missing):
    """(include dir, lib dir) of an NVIDIA wheel's package (`module`, e.g. nvidia.cu13); `missing`:
    the sentence when it is not installed."""
    import importlib

    try:
        package = importlib.import_module(module)
    except ImportError:
        raise MicaError(missing) from None
    root = list(package.__path__)[0]
    return os.path.join(root, "include"), os.path.join(root, "lib")


def cuda_libraries():
    """(include dir, lib dir) of the cuBLAS/cuBLASLt and CUDA runtime wheels (PyPI: nvidia-cublas,
    nvidia-cuda-runtime)."""
    return wheel_dirs("nvidia.cu13", "cuBLASLt is not installed: pip install nvidia-cublas nvidia-cuda-runtime")


def gencode(archs=ARCHS, ptx=True):
    """nvcc's -gencode flags: machine code for each architecture, and (`ptx`) the newest one's PTX,
    which later cards compile when they load it."""
    flags = []
    for a in archs:
        flags += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    return flags + (["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"] if ptx else [])


def nvcc_command(src, out, shared=True, threads_per_block=None, archs=ARCHS, ptx=True):
    """nvcc's command line that builds generated CUDA source `src` as Mica does: a shared library
    linked to cuBLASLt (`shared`) or an object, for the cards' architectures `archs` (numbers: 90 is
    sm_90), float32 as float32 (`--fmad=false`), warnings as errors, the headers Mica's and the wheel's."""
    include, _ = cuda_libraries()
    cmd = [nvcc(), "-O3", "--threads", "0", "--fmad=false", "-std=c++17", "-Werror", "all-warnings", "-I", HERE,
           "-I", SHARED_DIR, "-I", include, *gencode(archs or ARCHS, ptx), "-Xcompiler", "-fPIC"]
    cmd += [f"-DMICA_THREADS={threads_per_block}"] if threads_per_block else []
    if shared:
        cmd += ["-shared", src, "-o", out, *link_flags()]
    else:
        cmd += ["-c", src, "-o", out]
    return cmd


def link_flags():
    """nvcc's flags to link cuBLASLt from the wheel (found at run time by rpath)."""
    _, lib = cuda_libraries()
    return ["-L", lib, "-l:libcublasLt.so.13", "-Xlinker", f"-rpath,{lib}"]


def headers_digest():
    digest = hashlib.sha256()
    for path in HEADERS:
        if os.path.exists(path):
            digest.update(open(path, "rb").read())
    return digest.hexdigest()


def simulator_command(src, out, threads_per_block=None, sanitize=False, shared=True):
    # -g1: line tables for backtraces and the sanitizer's reports; full -g made g++ ~1.6x slower on
    # a GPT step (its debug info for the templated kernels) and changes no instruction
    cmd = ["g++", "-x", "c++", "-std=c++17", "-O1", "-g1", "-ffp-contract=off", "-fno-fast-math", "-fPIC",
           "-DMICA_CUDASIM", "-I", HERE, "-I", SHARED_DIR]
    cmd += ["-shared", src, "-o", out, "-lboost_context", "-lpthread"] if shared else ["-c", src, "-o", out]
    cmd += [f"-DMICA_THREADS={threads_per_block}"] if threads_per_block else []
    cmd += ["-fsanitize=address"] if sanitize else []
    return cmd


def build(source, name="program", simulate=False, threads_per_block=None, archs=ARCHS):
    """Compile to a shared library (cached); returns its path. `archs`: the cards' architectures
    nvcc builds for (every one Mica supports, unless a caller needs fewer)."""
    kind = "sim" if simulate else "nvcc"
    digest = hashlib.sha256()
    # (TF32: the source says, MICA_TF32; nvcc's link flags name the cuBLASLt found by rpath, which a
    # venv made elsewhere moves)
    for part in (source, kind, str(threads_per_block), headers_digest(), *([] if simulate else link_flags()),
                 *([] if tuple(archs) == tuple(ARCHS) else ["archs"] + [str(a) for a in archs])):
        digest.update(part.encode() + b"\0")
    ranks = []  # collectives across ranks: NCCL and Open MPI (the simulator's NCCL: Open MPI alone)
    if '#include "mica_nccl.h"' in source:
        from .collectives import build_flags

        rank_compile, rank_link = build_flags(simulate)
        ranks = rank_compile + rank_link
    digest.update("\0".join(ranks).encode())
    out_dir = os.path.join(cache_dir(), f"cuda-{kind}-" + digest.hexdigest()[:24])
    if simulate:
        return compile_cached(source, out_dir, "program.cu", "g++ (the CUDA simulator)", name,
                              lambda src, out: simulator_command(src, out, threads_per_block) + ranks)
    return compile_cached(source, out_dir, "program.cu", "nvcc", name,
                          lambda src, out: nvcc_command(src, out, threads_per_block=threads_per_block,
                                                        archs=archs) + ranks)
