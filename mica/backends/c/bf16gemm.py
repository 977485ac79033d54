"""Which bfloat16 product kernel (mica_bf16gemm.h) a CPU program is built with, and its scratch.

Chosen when the target is made, from the building machine's processor (/proc/cpuinfo: its flags
and vendor), by measurement (BENCHMARKS.md sections 8.1 and 8.6):
- "amx" (AMX-BF16 tiles) where the processor has AMX;
- "avx512bf16" (vdpbf16ps) on an AMD processor with AVX512-BF16: on a Zen 5 it measured 3.6x
  OpenBLAS's float32 product (~850 against ~210 GFLOP/s on two cores); Zen 4 is taken alike (its
  vdpbf16ps, too, does twice the products of a float32 FMA at the same rate);
- else "f32" (the operands widened to float32, then OpenBLAS or Mica's float32 kernel: any
  processor). On Intel's cores vdpbf16ps does what two float32 FMAs do and measured slower than
  OpenBLAS's float32 product (a Sapphire Rapids), so there it is taken only when asked for, and by
  an AMX build whose operating system refuses the tile state (it reads the same packed operands;
  MICA_NO_AMX=1 in a program's environment stands in for a refusal).
`MICA_BF16_GEMM=amx|avx512bf16|f32` (or CTarget(bf16_gemm=...)) forces one, e.g. to test the
fallback. The choice is written into the generated C (`#define MICA_BF16_GEMM`, with a comment
naming it in the file's header), so it is part of the program's source and its build key.
"""
import os

from ...errors import MicaError

KERNELS = {"f32": 0, "avx512bf16": 1, "amx": 2}
NEEDS = {"f32": (), "avx512bf16": ("avx512_bf16",), "amx": ("amx_bf16", "amx_tile", "avx512_bf16")}
PREFERENCE = {"AuthenticAMD": ("amx", "avx512bf16", "f32")}  # what choose() takes unasked, by vendor:
DEFAULT_PREFERENCE = ("amx", "f32")                            # the first one the processor has

MB, KSTEP = 32, 32           # MICA_BF16_MB, MICA_BF16_KSTEP
KC, NR = 384, 32             # MICA_KC, MICA_NR of mica_gemm.h (AVX-512 build)
GEMM_THREAD_FLOATS = 384 * 96 + 8 * 32
L2_BUDGET, CHUNK_BYTES = 3 << 19, 1 << 20  # MICA_BF16_L2; a k chunk of packed B at most this


def _cpuinfo_field(name, path):
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return ""


def machine_flags(path="/proc/cpuinfo"):
    """The processor's feature flags (an empty set where the file does not say)."""
    return set(_cpuinfo_field("flags", path).split())


def machine_model(path="/proc/cpuinfo"):
    """The processor's model name (empty where the file does not say)."""
    return _cpuinfo_field("model name", path)


def machine_vendor(path="/proc/cpuinfo"):
    """The processor's vendor ("GenuineIntel", "AuthenticAMD"; empty where the file does not say)."""
    return _cpuinfo_field("vendor_id", path)


def choose(requested=None, flags=None, vendor=None):
    """The kernel's name: `requested` (or $MICA_BF16_GEMM) when the processor has what it needs,
    else the first of its vendor's PREFERENCE that it has."""
    flags = machine_flags() if flags is None else flags
    vendor = machine_vendor() if vendor is None else vendor
    requested = requested or os.environ.get("MICA_BF16_GEMM") or None
    if requested is not None:
        if requested not in KERNELS:
            raise MicaError(f"unknown bfloat16 product kernel {requested!r} (MICA_BF16_GEMM); use one of "
                            f"{', '.join(KERNELS)}")
        missing = [f for f in NEEDS[requested] if f not in flags]
        if missing:
            raise MicaError(f"this processor lacks {', '.join(missing)}, which the {requested} bfloat16 product "
                            f"kernel needs; use MICA_BF16_GEMM={' or '.join(available(flags))} (or leave it unset "
                            f"to choose)")
        return requested
    has = available(flags)
    return next(k for k in PREFERENCE.get(vendor, DEFAULT_PREFERENCE) if k in has)


def available(flags=None):
    """The kernels this processor can run, fastest first (the f32 fallback always)."""
    flags = machine_flags() if flags is None else flags
    return [k for k in ("amx", "avx512bf16", "f32") if all(f in flags for f in NEEDS[k])]


WHAT = {"amx": "AMX-BF16 tiles", "avx512bf16": "AVX512-BF16's vdpbf16ps", "f32": "operands widened to float32"}


def how_chosen(requested=None):
    """Why a program got its kernel: asked for (CTarget's bf16_gemm or $MICA_BF16_GEMM), or chosen."""
    if requested:
        return "as the target was asked"
    if os.environ.get("MICA_BF16_GEMM"):
        return f"as MICA_BF16_GEMM={os.environ['MICA_BF16_GEMM']} asks"
    return "chosen for the processor that built it"


def describe(kernel, requested=None, flags=None):
    """The line `mica train` prints for a program with bfloat16 products on the CPU."""
    others = [k for k in available(flags) if k != kernel]
    line = f"bfloat16 products: the {kernel} kernel ({WHAT[kernel]}), {how_chosen(requested)}"
    if others and not (requested or os.environ.get("MICA_BF16_GEMM")):
        line += f"; MICA_BF16_GEMM={' or '.join(others)} picks another"
    elif not others and kernel == "f32":
        line += " (this processor has no bfloat16 product instructions)"
    return line


def _pad(n, to):
    return -(-n // to) * to


def k_chunk(Kp, Np):
    """mica_bf16_kchunk: the packed kernels' k chunk (all of k while packed B fits the L2 budget)."""
    if 2 * Kp * Np <= L2_BUDGET or Np == 0:
        return Kp
    return max(CHUNK_BYTES // (2 * Np) // KSTEP * KSTEP, KSTEP)


def shared_bytes(kernel, M, N, K):
    """mica_bf16gemm_shared_bytes: scratch shared by the threads (one k chunk of packed B, and the
    float32 sums of every output block between k chunks when there are several)."""
    if kernel == "f32":
        kc = max(min(K, KC), 1)
        return 4 * (M * K + K * N + M * N + kc * _pad(N, NR)) + 256
    Kp, Np = _pad(K, KSTEP), _pad(N, MB)
    kc = k_chunk(Kp, Np)
    sums = 4 * _pad(M, MB) * Np + 64 if kc and kc < Kp else 0
    return 2 * kc * Np + 64 + sums  # one k chunk of packed B (all of k when unchunked)


def thread_bytes(kernel, K):
    """mica_bf16gemm_thread_bytes: scratch of each thread."""
    if kernel == "f32":
        return 4 * GEMM_THREAD_FLOATS + 64
    return _pad(2 * MB * _pad(K, KSTEP) + 4 * MB * MB, 64) + 64
