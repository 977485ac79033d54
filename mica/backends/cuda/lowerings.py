"""The CUDA target's lowering of each kernel primitive (platform "cuda"). Its row kernels
(mica_cuda_kernels.h) take the CPU kernels' arguments, so the C target's rule writes the call for
both; what differs is only the routine behind the name (a __device__ routine here, each row on a
group of 8 threads; `threads` sizes its launch).
Attention is a host lowering: its statements run on the host and launch products and row kernels
(mica_cuda_attention.h), with the [B, H, L, S] scores as scratch.
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


def _scores(kernel):
    """The [B, H, L, S] scores attention keeps in scratch (twice for the backward: P and dP)."""
    q, k = kernel.inputs[:2] if kernel.op == "attention" else kernel.inputs[1:3]
    return math.prod(q.shape[:-1]) * k.shape[-2]


def _attention_scratch(kernel):
    copies = 1 if kernel.op == "attention" else 2
    return 0, copies * _scores(kernel) * kernel.inputs[0].dtype.itemsize


@register_lowering("attention", "cuda", scratch=_attention_scratch, host=True)
@register_lowering("attention_backward", "cuda", scratch=_attention_scratch, host=True)
def _attention(e, kernel):
    q = kernel.inputs[0] if kernel.op == "attention" else kernel.inputs[1]
    if q.dtype not in (dtypes.float32, dtypes.float64):
        raise MicaError(f"scaled_dot_product_attention on {q.dtype.name} is not supported by the CUDA backend yet; "
                        "cast q, k and v to float32")
    p, s, t = e.ptr, ct.suffix(q.dtype), ct.ctype(q.dtype)
    lines, q, k, v, o = _c.attention_shape(e, kernel)
    if kernel.op == "attention":
        lines.append(f"if (mica_attention_cuda_{s}(stream, &shape, {p(q)}, {p(k)}, {p(v)}, {p(o)}, "
                     f"{p(kernel.outputs[1])}, ({t} *)scratch) != 0) return 1;")
    else:
        gsb, gsh, gst = _c.attention_grad_strides(kernel)
        dq, dk, dv = kernel.outputs
        lines.append(f"if (mica_attention_backward_cuda_{s}(stream, &shape, {p(kernel.inputs[0])}, {p(q)}, {p(k)}, "
                     f"{p(v)}, {p(o)}, {p(kernel.inputs[5])}, {p(dq)}, {p(dk)}, {p(dv)}, {gsb}, {gsh}, {gst}, "
                     f"({t} *)scratch) != 0) return 1;")
    return ["{"] + ["    " + x for x in lines] + ["}"]
