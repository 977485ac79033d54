"""Which bfloat16 product kernel (mica_bf16gemm.h) a CPU program is built with, and its scratch.

Chosen when the target is made, from the building machine's processor flags (/proc/cpuinfo), by
measurement (BENCHMARKS.md section 8.1): "amx" (AMX-BF16 tiles) where the processor has AMX, else
"f32" (the operands widened to float32, then OpenBLAS or Mica's float32 kernel: any processor).
"avx512bf16" (vdpbf16ps) is slower than OpenBLAS's float32 product on the measured machine (one
vdpbf16ps per cycle does what two float32 FMAs do), so it is only taken when asked for, and by an
AMX build whose operating system refuses the tile state (it reads the same packed operands;
MICA_NO_AMX=1 in a program's environment stands in for a refusal).
`MICA_BF16_GEMM=amx|avx512bf16|f32` (or CTarget(bf16_gemm=...)) forces one, e.g. to test the
fallback. The choice is written into the generated C (`#define MICA_BF16_GEMM`, with a comment
naming it in the file's header), so it is part of the program's source and its build key.
"""
import os

from ...errors import MicaError

KERNELS = {"f32": 0, "avx512bf16": 1, "amx": 2}
NEEDS = {"f32": (), "avx512bf16": ("avx512_bf16",), "amx": ("amx_bf16", "amx_tile", "avx512_bf16")}
PREFERENCE = ("amx", "f32")  # what choose() takes unasked, first that the processor has

MB, KSTEP = 32, 32           # MICA_BF16_MB, MICA_BF16_KSTEP
KC, NR = 384, 32             # MICA_KC, MICA_NR of mica_gemm.h (AVX-512 build)
GEMM_THREAD_FLOATS = 384 * 96 + 8 * 32
L2_BUDGET, CHUNK_BYTES = 3 << 19, 1 << 20  # MICA_BF16_L2; a k chunk of packed B at most this


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
    else the first of PREFERENCE that it has."""
    flags = machine_flags() if flags is None else flags
    requested = requested or os.environ.get("MICA_BF16_GEMM") or None
    if requested is not None:
        if requested not in KERNELS:
            raise MicaError(f"unknown bfloat16 product kernel {requested!r} (MICA_BF16_GEMM); use one of "
                            f"{', '.join(KERNELS)}")
        missing = [f for f in NEEDS[requested] if f not in flags]
        if missing:
            raise MicaError(f"this processor lacks {', '.join(missing)}, which the {requested} bfloat16 product "
                            f"kernel needs; use MICA_BF16_GEMM=f32 (or leave it unset to choose)")
        return requested
    return next(k for k in PREFERENCE if all(f in flags for f in NEEDS[k]))


def _pad(n, to):
    return -(-n // to) * to


def k_chunk(Kp, Np):
    """mica_bf16_kchunk: the packed kernels' k chunk (all of k while packed B fits the L2 budget)."""
    if 2 * Kp * Np <= L2_BUDGET or Np == 0:
        return Kp
    return max(CHUNK_BYTES // (2 * Np) // KSTEP * KSTEP, KSTEP)


def shared_bytes(kernel, M, N, K):
    """mica_bf16gemm_shared_bytes: scratch shared by the threads (packed B, and the float32 sums
    of every output block between k chunks when there are several)."""
    if kernel == "f32":
        kc = max(min(K, KC), 1)
        return 4 * (M * K + K * N + M * N + kc * _pad(N, NR)) + 256
    Kp, Np = _pad(K, KSTEP), _pad(N, MB)
    kc = k_chunk(Kp, Np)
    sums = 4 * _pad(M, MB) * Np + 64 if kc and kc < Kp else 0
    return 2 * Kp * Np + 64 + sums


def thread_bytes(kernel, K):
    """mica_bf16gemm_thread_bytes: scratch of each thread."""
    if kernel == "f32":
        return 4 * GEMM_THREAD_FLOATS + 64
    return _pad(2 * MB * _pad(K, KSTEP) + 4 * MB * MB, 64) + 64
