"""The NVIDIA target: CUDA C for nvcc (a fatbin for sm_80, sm_86, sm_89, sm_90 and sm_120 plus
PTX), or the same source compiled by g++ against the CPU simulator (`simulate=True`), so machines
without a GPU run it.

What it answers for the shared pipeline: 256-byte alignment (cuBLASLt wants 16; 256 keeps every
buffer on its own cache lines); one workspace for the one stream the program runs on; products
of every floating type, half ones included (`half_kernel`), carry no epilogue: a bias joins the
elementwise kernel that reads the product anyway (GELU's, the residual add's), so cuBLASLt's BIAS
epilogue would save a pass only where the bias add is that kernel's whole work, and its GELU is
the tanh form, not nanoGPT's erf (docs/design.md, the CUDA backend); kernel primitives are
lowered under platform "cuda" (lowerings.py: the row kernels; attention on TF32 tensor cores where
tf32=True permits it, through cuBLASLt's products where a chunk of its scores fits a bound, else
the fused kernels: `attention` chooses, "auto" by that order).
"""
from ...errors import MicaError
from ...targets import Target
from . import lowerings  # noqa: F401  (registers the CUDA kernels' lowerings)
from . import collectives  # noqa: F401  (and the collectives')


class CudaTarget(Target):
    name = "cuda"
    platform = "cuda"
    align = 256
    unit_name = "stream"
    workspace_units = 1

    def __init__(self, opt_level=2, simulate=False, tf32=None, threads_per_block=None, attention="auto",
                 group_launches=True):
        super().__init__(opt_level)
        if attention not in lowerings.ATTENTION_PATHS:
            raise MicaError(f"attention must be one of {', '.join(map(repr, lowerings.ATTENTION_PATHS))} (cuBLASLt's "
                            f"products, the fused kernels, or the TF32 tensor-core kernels), not {attention!r}")
        self.attention = attention
        if tf32 is None:  # (torch.backends.cuda.matmul.allow_tf32's, False unless the user set it)
            from .. import tf32_allowed

            tf32 = tf32_allowed()
        for key, value in (("simulate", simulate), ("tf32", tf32), ("group_launches", group_launches)):
            if not isinstance(value, bool):
                raise MicaError(f"{key} must be True or False, not {value!r}")
        self.simulate = simulate
        self.tf32 = tf32
        self.group_launches = group_launches  # independent generated kernels share a launch (groups.py)
        if threads_per_block is not None and not (isinstance(threads_per_block, int) and
                                                  8 <= threads_per_block <= 1024 and threads_per_block % 8 == 0):
            raise MicaError(f"threads_per_block must be a multiple of 8 from 8 to 1024 (a row kernel's 8 threads "
                            f"share a warp), not {threads_per_block!r}")
        self.threads_per_block = threads_per_block

    def product_epilogue(self, gemm, loop):
        return False

    def half_kernel(self, op, dtype=None):
        """Products of bfloat16 or float16 go to cuBLASLt as they are (half operands, COMPUTE_32F,
        C rounded once), as the widened product would compute them; kernel primitives widen."""
        return op == "matmul"

    def workspace(self, kernel):
        from ...passes.schedule import Call
        from .render import reduce_scratch

        if isinstance(kernel, Call) and kernel.op in ("attention", "attention_backward"):
            return lowerings.attention_scratch(kernel, self)
        lanes = reduce_scratch(kernel)
        return (0, lanes) if lanes else super().workspace(kernel)

    def render(self, lowered, api="mica_"):
        from .render import CudaRenderer

        return CudaRenderer(lowered.schedule, lowered.plan, lowered.program.name, self).source(
            lowered.memory_report, api)

    def build(self, lowered):
        from ..cstyle.executable import AbiExecutable
        from . import build

        why = None if self.simulate else build.unusable()
        if why:  # (said before nvcc's minutes, not after them by the loaded library)
            raise MicaError(f"a CUDA program built here could not run: it needs an NVIDIA GPU and its driver, and "
                            f"{why}; run it on the simulator (simulate=True), or build it where a card is (its CUDA "
                            "source is the lowering's .source)")
        library = build.build(lowered.source, lowered.program.name, simulate=self.simulate,
                              threads_per_block=self.threads_per_block)
        return AbiExecutable(lowered, library)


TARGET = CudaTarget
