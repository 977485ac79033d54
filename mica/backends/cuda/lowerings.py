"""The CUDA target's lowering of each kernel primitive (platform "cuda"). Its row kernels
(mica_cuda_kernels.h) take the CPU kernels' arguments, so the C target's rule writes the call for
both; what differs is only the routine behind the name (a __device__ routine here, each row on a
group of 8 threads; `threads` sizes its launch).
Host lowerings run their statements on the host and launch kernels of their own: attention (on
TF32 tensor cores where the user permits TF32, mica_cuda_attention_tc.h; cuBLASLt's products
around the CPU's rows where a score matrix fits, mica_cuda_attention_gemm.h; else the fused, tiled
kernels of mica_cuda_attention.h: attention_path chooses), and the backward primitives that sum
across rows (the norms' weight gradients, embedding's), which need a second launch to finish a
grid-wide sum (mica_cuda_sweeps.h; the C rule's arguments, passed to its *_cuda_ routine with the
stream).
"""
import math

from ... import dtypes
from ...errors import MicaError
from ...targets import lowering_of, register_lowering
from ..c import lowerings as _c
from ..cstyle import types as ct

ROW_KERNELS = ("layer_norm", "rms_norm", "softmax", "softmax_backward", "log_softmax", "log_softmax_backward",
               "cross_entropy", "cross_entropy_backward", "embedding", "check_range")

for _op in ROW_KERNELS:
    register_lowering(_op, "cuda", lowering_of(_op, "c").rule)

ROW_GROUP = 8  # threads per row (mica_cuda_kernels.h's MICA_ROW_GROUP: one per lane of the canonical sum)


def threads(kernel):
    """The threads a row kernel's launch asks for (grid-stride loops take any rest): a group of
    ROW_GROUP per row; embedding and check_range a thread per output element."""
    if kernel.op in ("embedding", "check_range"):  # (a thread per element: no rows)
        return max(kernel.outputs[0].numel, 1)
    x = kernel.inputs[1] if kernel.op.endswith("_backward") else kernel.inputs[0]  # the [rows, n] input
    ndims = kernel.attrs.get("ndims", 1)
    return max(ROW_GROUP * math.prod(x.shape[:len(x.shape) - ndims]), 1)


SUM_BLOCK = 8192  # mica_math.h's MICA_BLOCK: a canonical sum's blocks of rows


def _norm_parts(kernel):
    """A norm backward's lane partials (mica_cuda_sweeps.h): per block of SUM_BLOCK rows, 8 lanes of
    every column, for dw and for db."""
    rows, n = _c._rows(kernel.inputs[1], kernel.attrs["ndims"])
    blocks = max(1, -(-rows // SUM_BLOCK))
    return 2 * blocks * 8 * n * kernel.inputs[1].dtype.itemsize, 0


def _as_host_call(lines):
    """The C rule's one call `mica_<op>_<S>(args);` as this target's host routine
    `mica_<op>_cuda_<S>(stream, args)`, which launches the kernels (same arguments)."""
    (call,) = lines
    name, args = call.split("(", 1)
    op, suffix = name.rsplit("_", 1)
    assert args.endswith(");"), call
    return [f"if ({op}_cuda_{suffix}(stream, {args[:-1]} != 0) return 1;"]


for _op in ("layer_norm_backward", "rms_norm_backward"):
    register_lowering(_op, "cuda", lambda e, kernel, _rule=lowering_of(_op, "c").rule: _as_host_call(_rule(e, kernel)),
                      scratch=_norm_parts, host=True)


def embedding_chunk(count):
    """Positions per block in embedding_backward's ranking (mica_cuda_sweeps.h): 1024, or more (up
    to 8192, a power of two) so that there are at most 64 chunks: the counts are chunks x V."""
    chunk = 1024
    while chunk < 8192 and -(-count // chunk) > 64:
        chunk *= 2
    return chunk


def _embedding_order(kernel):
    """embedding_backward's integers: counts [chunks, V], rank [count], start [V + 1], order [count]."""
    count, V = kernel.inputs[1].numel, kernel.outputs[0].shape[0]
    chunks = -(-count // embedding_chunk(count))
    return 4 * (chunks * V + 2 * count + V + 1), 0


@register_lowering("embedding_backward", "cuda", scratch=_embedding_order, host=True)
def _embedding_backward(e, kernel):
    ins, outs, p = kernel.inputs, kernel.outputs, e.ptr
    _, s = _c._dtype(kernel)
    count, (V, D) = ins[1].numel, outs[0].shape
    return [f"if (mica_embedding_backward_cuda_{s}(stream, {p(ins[0])}, {p(ins[1])}, {p(outs[0])}, {count}, {V}, {D}, "
            f"{embedding_chunk(count)}, (int32_t *)work) != 0) return 1;"]


SCORES_BOUND = 64 << 20  # bytes: the most one chunk of the products path's [chunk, L, S] scores may take
ATTENTION_PATHS = ("auto", "products", "fused", "tf32")
TC_TILE, TC_SHARED = 64, 99 * 1024  # mica_cuda_attention_tc.h: rows a block; the opt-in limit of sm_86/89/120


def _attention_operands(kernel):
    return (kernel.inputs[0], kernel.inputs[1], kernel.inputs[2]) if kernel.op == "attention" else \
        (kernel.inputs[1], kernel.inputs[2], kernel.inputs[3])


def _tc_fits(kernel):
    """None when the tensor-core kernels (mica_cuda_attention_tc.h) take this attention, else why not:
    float32 without fp_half_intermediates' roundings, head dims multiples of 16, and their shared memory (the dQ and dK/dV kernels': two
    [64, E + 4] and [64, Ev + 4] tiles, two [64, 68] score tiles, two rows of 64) within TC_SHARED."""
    q, _, v = _attention_operands(kernel)
    E, Ev = q.shape[-1], v.shape[-1]
    if q.dtype != dtypes.float32:
        return f"its type is {q.dtype.name}, not float32"
    if kernel.attrs.get("half_round"):
        return "it rounds its weights to a half type (fp_half_intermediates), which these kernels do not"
    if E % 16 or Ev % 16:
        return f"its head dims ({E}, {Ev}) are not multiples of 16"
    shared = (TC_TILE * ((E + 4) + (Ev + 4) + 2 * (TC_TILE + 4)) + 2 * TC_TILE) * 4
    if shared > TC_SHARED:
        return f"its head dims ({E}, {Ev}) need {shared:,} bytes of shared memory a block, past {TC_SHARED:,}"
    return None


def attention_path(kernel, target):
    """Which kernels run this attention (the target's `attention` option; "auto" decides):
    "tf32", the tensor-core kernels, where the user permits TF32 (target.tf32) and they fit
    (_tc_fits); else "products", cuBLASLt's products around the CPU's rows, where one [L, S] score
    matrix fits SCORES_BOUND in float32 or float64 without fp_half_intermediates; else "fused",
    Mica's tiled kernels, which keep no score matrix."""
    path = target.attention
    if path == "tf32":
        why = _tc_fits(kernel) if target.tf32 else "the program is not built with tf32=True"
        if why:
            raise MicaError(f"attention with target option attention='tf32' runs on TF32 tensor cores, but {why}; "
                            f"leave attention='auto'")
        return path
    if path == "auto" and target.tf32 and _tc_fits(kernel) is None:
        return "tf32"
    return "products" if attention_chunk(kernel, path) else "fused"


def attention_chunk(kernel, path="auto"):
    """How many heads (or batch elements: the longer of the two) one pass of the products path
    (mica_cuda_attention_gemm.h) computes at once: as many as fit SCORES_BOUND, 0 for the fused
    kernels (mica_cuda_attention.h), which keep no score matrix. "auto" takes the products where
    one [L, S] fits the bound and the type is float32 or float64 without fp_half_intermediates."""
    q, k, _ = _attention_operands(kernel)
    B, H, L, _, *_ = _c._attn_dims(q)
    S, size = k.shape[-2], q.dtype.itemsize
    fits = q.dtype in (dtypes.float32, dtypes.float64) and not kernel.attrs.get("half_round") and \
        L * S * size <= SCORES_BOUND
    if path in ("fused", "tf32") or (path == "auto" and not fits):
        return 0
    if not fits:
        raise MicaError(f"attention with target option attention='products' needs float32 or float64 scores whose [L, S] "
                        f"= [{L}, {S}] fit {SCORES_BOUND >> 20} MiB; leave attention='auto' for the fused kernels")
    inner = H if H > B else B  # (the index the products batch over; mica_attn_pass)
    return max(1, min(inner, SCORES_BOUND // (L * S * size)))


def attention_scratch(kernel, target):
    """The products path: one chunk's scores (the backward: D, then the chunk's P and dP); the fused
    and tensor-core kernels: the backward's D = rowsum(dO * O), B * H * L values (their forward
    needs none: no [L, S] matrix is kept anywhere)."""
    q, k, _ = _attention_operands(kernel)
    rows, size = math.prod(q.shape[:-1]), q.dtype.itemsize
    chunk = attention_chunk(kernel, attention_path(kernel, target))  # (0 for the fused and tensor-core paths)
    if not chunk:
        return 0, 0 if kernel.op == "attention" else rows * size
    scores = chunk * q.shape[-2] * k.shape[-2] * size
    return (scores, 0) if kernel.op == "attention" else (-(-rows // 64) * 64 * size + 2 * scores, 0)


@register_lowering("attention", "cuda", host=True)
@register_lowering("attention_backward", "cuda", host=True)
def _attention(e, kernel):
    q = kernel.inputs[0] if kernel.op == "attention" else kernel.inputs[1]
    if q.dtype not in (dtypes.float32, dtypes.float64):
        raise MicaError(f"scaled_dot_product_attention on {q.dtype.name} is not supported by the CUDA backend yet; "
                        "cast q, k and v to float32")
    lines, q, k, v, o = _c.attention_shape(e, kernel)
    ctype, path = ct.ctype(q.dtype), attention_path(kernel, e.target)
    chunk = attention_chunk(kernel, path)  # (0 for the fused and tensor-core paths)
    backward = kernel.op != "attention"
    if backward:  # (g, q, k, v, o, lse -> dq, dk, dv, and g's strides)
        views = [kernel.inputs[0], q, k, v, o, kernel.inputs[5], *kernel.outputs]
        args = [*map(e.ptr, views), *map(str, _c.attention_grad_strides(kernel))]
    else:  # (q, k, v -> o, lse)
        args = [e.ptr(x) for x in (q, k, v, o, kernel.outputs[1])]
    if chunk:  # cuBLASLt's products around the CPU's rows (mica_cuda_attention_gemm.h), a chunk's scores in work
        name, template, args = "mica_attention_gemm", ctype, args + [str(chunk), f"({ctype} *)work"]
    elif path == "tf32":  # the tensor-core kernels (mica_cuda_attention_tc.h), for the head dims; the backward's D
        name, template = "mica_attention_tc", f"{q.shape[-1]}, {v.shape[-1]}"
        args += ["(float *)scratch"] if backward else []
    else:  # the fused kernels (mica_cuda_attention.h), their tiles picked by the head dims; the backward's D
        name, template = "mica_attention", f"{ctype}, {q.shape[-1]}, {v.shape[-1]}"
        args += [f"({ctype} *)scratch"] if backward else []
    name += "_backward" if backward else ""
    lines.append(f"if ({name}_cuda<{template}>({', '.join(['stream', '&shape', *args])}) != 0) return 1;")
    return ["{"] + ["    " + x for x in lines] + ["}"]
