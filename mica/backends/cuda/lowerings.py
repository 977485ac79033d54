"""The CUDA target's lowering of each kernel primitive (platform "cuda"). Its row kernels
(mica_cuda_kernels.h) take the CPU kernels' arguments, so the C target's rule writes the call for
both; what differs is only the routine behind the name (a grid-stride __device__ routine here).
Attention has no CUDA kernel yet (strided-batched cuBLASLt products with a causal-softmax kernel
are the plan): a program that needs it is refused with a sentence.
"""
from ...targets import lowering_of, register_lowering
from ..c import lowerings as _c  # noqa: F401  (registers the C rules)

ROW_KERNELS = ("layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward", "softmax", "softmax_backward",
               "log_softmax", "log_softmax_backward", "cross_entropy", "cross_entropy_backward", "embedding",
               "embedding_backward")

for _op in ROW_KERNELS:
    register_lowering(_op, "cuda", lowering_of(_op, "c").rule)
