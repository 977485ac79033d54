"""The CPU target: C with OpenMP, products through OpenBLAS (or Mica's own kernel).

What it answers for the shared pipeline: 64-byte alignment; scratch per thread (up to
`max_threads` of them); a product carries any elementwise loop on its output tiles (the tile loop
inlines it: float32 products through OpenBLAS, bfloat16 ones on each 32-row block of the packed
kernels or on the float32 fallback's OpenBLAS tiles); bfloat16 products are its own
(mica_bf16gemm.h, the kernel chosen from the processor: bf16gemm.py), and so is bfloat16 attention
(mica_kernels.h); float16 products are widened inside the product (mica_f16gemm: no float16
product instructions are used), and float16 attention inside the kernel (mica_attention_f16); the
other half-type kernels are widened to float32 around them (passes/widen.py); the kernels' lowerings are registered under platform "c" (lowerings.py).
"""
import os

from ... import dtypes
from ...targets import Target
from . import build as _build
from . import bf16gemm
from .lowerings import HALF_KERNELS, gemm_scratch
from . import collectives as _collectives  # noqa: F401  (registers the collectives' lowerings)


def default_max_threads():
    return max(8, os.cpu_count() or 1)


class CTarget(Target):
    name = "cpu"
    platform = "c"
    align = 64
    unit_name = "thread"

    def __init__(self, opt_level=2, max_threads=None, blas=None, bf16_gemm=None):
        super().__init__(opt_level)
        self.blas = blas or os.environ.get("MICA_BLAS", "openblas")
        _build.blas_flags(self.blas)  # a missing library is an error now, not after the build
        self.max_threads = max_threads or default_max_threads()
        self.bf16_asked, self._bf16_gemm = bf16_gemm, None

    @property
    def bf16_gemm(self):
        """The bfloat16 product kernel (bf16gemm.choose), settled when a program first needs it: a
        float32 program never asks, so a MICA_BF16_GEMM this processor cannot run stops only the
        programs with bfloat16 products."""
        if self._bf16_gemm is None:
            self._bf16_gemm = bf16gemm.choose(self.bf16_asked)
        return self._bf16_gemm

    def half_kernel(self, op, dtype):
        # (float16 products widened inside the product, mica_f16gemm; its attention widened inside the kernel)
        return dtype in dtypes.HALF and (op == "matmul" or op in HALF_KERNELS)

    @property
    def workspace_units(self):
        return self.max_threads

    def workspace(self, kernel):
        from ...passes.schedule import Gemm

        if isinstance(kernel, Gemm):
            return gemm_scratch(kernel, self.blas, self.bf16_gemm if kernel.a.dtype is dtypes.bfloat16 else "f32")
        return super().workspace(kernel)

    def product_epilogue(self, gemm, loop):
        if gemm.a.dtype is dtypes.bfloat16:  # the packed kernels run it on each 32-row block, the float32
            return self.bf16_gemm != "f32" or self.blas == "openblas"  # fallback on OpenBLAS's tiles
        if gemm.a.dtype is dtypes.float16:  # widened, on OpenBLAS's tiles
            return self.blas == "openblas"
        return gemm.out.dtype is dtypes.float32 and gemm.a.dtype is dtypes.float32

    def product_keeps_sums(self, gemm):
        # the packed bfloat16 kernels hand each 32 x 32 block of float32 sums to the epilogue
        # (mica_bf16gemm_stored); the float32 fallback and OpenBLAS store whole tiles first
        return (gemm.a.dtype is dtypes.bfloat16 and gemm.out.dtype is dtypes.float32 and self.bf16_gemm != "f32"
                and len(gemm.out.shape) == 2)

    def render(self, lowered, api="mica_"):
        from .emit import Emitter

        return Emitter(lowered.schedule, lowered.plan, lowered.program.name, self).source(
            lowered.memory_report, api)

    def build(self, lowered, profile=False):
        from .executable import Executable

        library = _build.build(lowered.source, self.opt_level, lowered.program.name, profile, self.blas)
        return Executable(lowered, library)


TARGET = CTarget
