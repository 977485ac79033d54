"""Which bfloat16 product kernel (mica_bf16gemm.h) a CPU program is built with, and its scratch.

Chosen when the target is made, from the building machine's processor flags (/proc/cpuinfo), the
fastest that the processor has (measured: BENCHMARKS.md section 8.1): "amx" (AMX-BF16 tiles),
"avx512bf16" (vdpbf16ps), or "f32" (the operands widened to float32, any processor).
`MICA_BF16_GEMM=amx|avx512bf16|f32` (or CTarget(bf16_gemm=...)) forces one, e.g. to test the
fallback. The choice is written into the generated C (`#define MICA_BF16_GEMM`, with a comment
naming it), so it is part of the program's source, its build key and its memory report.
"""
import os

from ...errors import MicaError

KERNELS = {"f32": 0, "avx512bf16": 1, "amx": 2}
NEEDS = {"f32": (), "avx512bf16": ("avx512_bf16",), "amx": ("amx_bf16", "amx_tile", "avx512_bf16")}
PREFERENCE = ("amx", "avx512bf16", "f32")

MB, KSTEP = 32, 32           # MICA_BF16_MB, MICA_BF16_KSTEP
KC, NR = 384, 32             # MICA_KC, MICA_NR of mica_gemm.h (AVX-512 build)
GEMM_THREAD_FLOATS = 384 * 96 + 8 * 32


def machine_flags(path="/proc/cpuinfo"):
    """The processor's feature flags (an empty set where the file does not say)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def choose(requested=None, flags=None):
    """The kernel's name: `requested` (or $MICA_BF16_GEMM) when the processor has what it needs,
    else the fastest that it has."""
    flags = machine_flags() if flags is None else flags
    requested = requested or os.environ.get("MICA_BF16_GEMM") or None
    if requested is not None:
        if requested not in KERNELS:
            raise MicaError(f"unknown bfloat16 product kernel {requested!r} (MICA_BF16_GEMM); use one of "
                            f"{', '.join(PREFERENCE)}")
        missing = [f for f in NEEDS[requested] if f not in flags]
        if missing:
            raise MicaError(f"this processor lacks {', '.join(missing)}, which the {requested} bfloat16 product "
                            f"kernel needs; use MICA_BF16_GEMM=f32 (or leave it unset to choose)")
        return requested
    return next(k for k in PREFERENCE if all(f in flags for f in NEEDS[k]))


def _pad(n, to):
    return -(-n // to) * to


def shared_bytes(kernel, M, N, K):
    """mica_bf16gemm_shared_bytes: scratch shared by the threads."""
    if kernel == "f32":
        kc = max(min(K, KC), 1)
        return 4 * (M * K + K * N + M * N + kc * _pad(N, NR)) + 256
    return 2 * _pad(K, KSTEP) * _pad(N, MB) + 64


def thread_bytes(kernel, K):
    """mica_bf16gemm_thread_bytes: scratch of each thread."""
    if kernel == "f32":
        return 4 * GEMM_THREAD_FLOATS + 64
    return _pad(2 * MB * _pad(K, KSTEP) + 4 * MB * MB, 64) + 64
