"""The CUDA target's lowering of each kernel primitive (platform "cuda"). Its row kernels
(mica_cuda_kernels.h) take the CPU kernels' arguments, so the C target's rule writes the call for
both; what differs is only the routine behind the name (a __device__ routine here, each row on a
group of 8 threads; `threads` sizes its launch).
Attention is a host lowering: its statements run on the host and launch the fused, tiled kernels
of mica_cuda_attention.h (no [L, S] matrix anywhere; the backward's scratch is D, one value per
query row).
"""
import math

from ... import dtypes
from ...errors import MicaError
from ...targets import lowering_of, register_lowering
from ..c import lowerings as _c
from ..cstyle import types as ct

ROW_KERNELS = ("layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward", "softmax", "softmax_backward",
               "log_softmax", "log_softmax_backward", "cross_entropy", "cross_entropy_backward", "embedding",
               "embedding_backward")

for _op in ROW_KERNELS:
    register_lowering(_op, "cuda", lowering_of(_op, "c").rule)

ROW_GROUP = 8  # threads per row (mica_cuda_kernels.h's MICA_ROW_GROUP: one per lane of the canonical sum)


def threads(kernel):
    """The threads a row kernel's launch asks for (grid-stride loops take any rest): a group of
    ROW_GROUP per row, and per column where the norms' weight gradients sum columns; embedding a
    thread per output element, its backward a group per vocabulary row."""
    if kernel.op == "embedding":
        return max(kernel.outputs[0].numel, 1)
    if kernel.op == "embedding_backward":
        return max(ROW_GROUP * kernel.outputs[0].shape[0], 1)
    x = kernel.inputs[1] if kernel.op.endswith("_backward") else kernel.inputs[0]  # the [rows, n] input
    ndims = kernel.attrs.get("ndims", 1)
    rows, n = math.prod(x.shape[:len(x.shape) - ndims]), math.prod(x.shape[len(x.shape) - ndims:])
    columns = n if kernel.op in ("layer_norm_backward", "rms_norm_backward") else 0
    return max(ROW_GROUP * max(rows, columns), 1)


def _attention_scratch(kernel):
    """The backward's D = rowsum(dO * O), B * H * L values (the forward needs none: no [L, S] matrix
    is kept anywhere, mica_cuda_attention.h)."""
    if kernel.op == "attention":
        return 0, 0
    return 0, math.prod(kernel.inputs[1].shape[:-1]) * kernel.inputs[0].dtype.itemsize


@register_lowering("attention", "cuda", scratch=_attention_scratch, host=True)
@register_lowering("attention_backward", "cuda", scratch=_attention_scratch, host=True)
def _attention(e, kernel):
    q = kernel.inputs[0] if kernel.op == "attention" else kernel.inputs[1]
    if q.dtype not in (dtypes.float32, dtypes.float64):
        raise MicaError(f"scaled_dot_product_attention on {q.dtype.name} is not supported by the CUDA backend yet; "
                        "cast q, k and v to float32")
    lines, q, k, v, o = _c.attention_shape(e, kernel)
    p, t = e.ptr, f"{ct.ctype(q.dtype)}, {q.shape[-1]}, {v.shape[-1]}"  # (the head dims pick the kernels' tiles)
    if kernel.op == "attention":
        lines.append(f"if (mica_attention_cuda<{t}>(stream, &shape, {p(q)}, {p(k)}, {p(v)}, {p(o)}, "
                     f"{p(kernel.outputs[1])}) != 0) return 1;")
    else:
        gsb, gsh, gst = _c.attention_grad_strides(kernel)
        dq, dk, dv = kernel.outputs
        lines.append(f"if (mica_attention_backward_cuda<{t}>(stream, &shape, {p(kernel.inputs[0])}, {p(q)}, {p(k)}, "
                     f"{p(v)}, {p(o)}, {p(kernel.inputs[5])}, {p(dq)}, {p(dk)}, {p(dv)}, {gsb}, {gsh}, {gst}, "
                     f"({ct.ctype(q.dtype)} *)scratch) != 0) return 1;")
    return ["{"] + ["    " + x for x in lines] + ["}"]
