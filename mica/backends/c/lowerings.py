"""The CPU's lowering of each kernel primitive (registered under platform "c"): the call of its
hand-written kernel in mica_kernels.h, and the scratch it needs; and the products' scratch."""
import math

from ... import dtypes
from ...errors import MicaError
from ...targets import register_lowering
from ..cstyle import types as ct
from . import bf16gemm


def lower(op, scratch=None):
    """@lower(op): this function writes the C statements calling op's kernel."""
    return register_lowering(op, "c", scratch=scratch)

GEMM_THREAD_FLOATS = 384 * 96 + 8 * 32  # MICA_KC * MICA_MC + the largest MR * NR (mica_gemm.h)


def packed_b_floats(K, N):
    """Shared packed copy of a product's right operand: KC x N rounded up to the widest panel."""
    return max(min(K, 384), 1) * (-(-N // 32) * 32)


def attention_slot(dtype, L, S, E, Ev):
    """Per-thread scratch elements of the attention kernels (mica_attention_slot_f32 and _bf16 in C:
    floats; doubles for float64)."""
    if dtype is dtypes.float32:
        return E * S + Ev * S + 2 * L * S
    if dtype is dtypes.float16:  # (the widened heads: mica_attention_slot_f16)
        return E * S + Ev * S + 2 * L * S + 2 * L * E + 2 * S * E + 2 * S * Ev + 2 * L * Ev
    if dtype is dtypes.bfloat16:  # (the widened heads, then the packed operands: mica_attention_tiles_bf16)
        Ep, Evp, Sp, Lp = (-(-x // 32) * 32 for x in (E, Ev, S, L))
        tiles = ((Ep + Evp) * Sp // 2 + 16 * max(Ep, Evp, Sp, Lp) + 1024 + (Sp * (Ep + Evp) + Lp * (Ep + Evp)) // 2
                 + L * S + 8 * 64)
        return E * S + Ev * S + 2 * L * S + 2 * L * E + 2 * S * E + 2 * S * Ev + 2 * L * Ev + tiles
    return 2 * E * S + 2 * Ev * S + 4 * S + E + Ev


def _attn_dims(view):
    """(B, H, T, D, stride_b, stride_h, stride_t) of a [..., T, D] view with unit last stride."""
    shape, strides = list(view.shape), list(view.strides)
    while len(shape) < 4:
        shape.insert(0, 1)
        strides.insert(0, 0)
    if len(shape) > 4:
        raise MicaError("attention over more than two batch dims is not supported by the CPU backend")
    return shape[0], shape[1], shape[2], shape[3], strides[0], strides[1], strides[2]


def gemm_scratch(kernel, blas, bf16_kernel="f32"):
    """(shared bytes, per-thread bytes) of a product: Mica's own kernel packs its operands, and so
    does every bfloat16 kernel (mica_bf16gemm.h)."""
    if kernel.a.dtype in dtypes.HALF:  # (float16: always widened, as the "f32" kernel)
        M, K, N = kernel.a.shape[-2], kernel.a.shape[-1], kernel.b.shape[-1]
        half = bf16_kernel if kernel.a.dtype is dtypes.bfloat16 else "f32"
        return bf16gemm.shared_bytes(half, M, N, K), bf16gemm.thread_bytes(half, K)
    if kernel.out.dtype is dtypes.float32 and blas == "own":
        K, N = kernel.a.shape[-1], kernel.b.shape[-1]
        return packed_b_floats(K, N) * 4, GEMM_THREAD_FLOATS * 4
    return 0, 0


def _per_row(kernel):
    """cross_entropy: one row of the input per thread."""
    return 0, kernel.inputs[0].shape[-1] * kernel.inputs[0].dtype.itemsize


def _attention_scratch(kernel):
    q, k, v = kernel.inputs[:3] if kernel.op == "attention" else kernel.inputs[1:4]
    L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    element = 4 if q.dtype in dtypes.HALF else q.dtype.itemsize  # (half heads: widened)
    return 0, attention_slot(q.dtype, L, S, E, Ev) * element


def _embedding_backward_scratch(kernel):
    count, V = kernel.inputs[1].numel, kernel.attrs["num_embeddings"]
    return (count + V + 1) * 8, 0


def _rows(view, ndims):
    return math.prod(view.shape[:len(view.shape) - ndims]), math.prod(view.shape[len(view.shape) - ndims:])


HALF_KERNELS = ("attention", "attention_backward")  # the kernels that also exist for half-type operands


def _dtype(kernel):
    """The element type the kernel computes in and its kernels' suffix; the CPU kernels exist for
    float32 and float64, and those of HALF_KERNELS for bfloat16 and float16 too."""
    dt = kernel.inputs[0].dtype if kernel.op != "embedding" else kernel.inputs[1].dtype
    if dt in dtypes.HALF and kernel.op in HALF_KERNELS:
        return dt, "bf16" if dt is dtypes.bfloat16 else "f16"
    if dt not in (dtypes.float32, dtypes.float64):
        raise MicaError(f"{kernel.op} on {dt.name} is not supported by the CPU backend yet; cast to float32 first")
    return dt, ct.suffix(dt)


NULL = "NULL"


@lower("layer_norm")
def _layer_norm(e, kernel):
    a, ins, outs, p = kernel.attrs, kernel.inputs, kernel.outputs, e.ptr
    dt, s = _dtype(kernel)
    rows, n = _rows(ins[0], a["ndims"])
    rest = list(ins[1:])
    w = p(rest.pop(0)) if a["has_weight"] else NULL
    b = p(rest.pop(0)) if a["has_bias"] else NULL
    return [f"mica_layer_norm_{s}({p(ins[0])}, {w}, {b}, {p(outs[0])}, {p(outs[1])}, {p(outs[2])}, "
            f"{rows}, {n}, {ct.const(a['eps'], dt)});"]


def _norm_lanes(kernel):
    """A norm backward's shared scratch: its column sums' lanes over one block of rows (dw and db:
    MICA_NORM_BACKWARD_SWEEP in mica_kernels.h)."""
    n = _rows(kernel.inputs[1], kernel.attrs["ndims"])[1]
    return 2 * 8 * n * kernel.inputs[1].dtype.itemsize, 0


@lower("layer_norm_backward", scratch=_norm_lanes)
def _layer_norm_backward(e, kernel):
    a, ins, outs, p = kernel.attrs, kernel.inputs, kernel.outputs, e.ptr
    dt, s = _dtype(kernel)
    rows, n = _rows(ins[1], a["ndims"])
    w = p(ins[2]) if a["has_weight"] else NULL
    rest = list(outs[1:])
    dw = p(rest.pop(0)) if a["has_weight"] else NULL
    db = p(rest.pop(0)) if a["has_bias"] else NULL
    return [f"mica_layer_norm_backward_{s}({p(ins[0])}, {p(ins[1])}, {w}, {p(ins[-2])}, {p(ins[-1])}, "
            f"{p(outs[0])}, {dw}, {db}, {rows}, {n}, ({ct.ctype(dt)} *)work);"]


@lower("rms_norm")
def _rms_norm(e, kernel):
    a, ins, outs, p = kernel.attrs, kernel.inputs, kernel.outputs, e.ptr
    dt, s = _dtype(kernel)
    rows, n = _rows(ins[0], a["ndims"])
    w = p(ins[1]) if a["has_weight"] else NULL
    return [f"mica_rms_norm_{s}({p(ins[0])}, {w}, {p(outs[0])}, {p(outs[1])}, {rows}, {n}, "
            f"{ct.const(a['eps'], dt)});"]


@lower("rms_norm_backward", scratch=_norm_lanes)
def _rms_norm_backward(e, kernel):
    a, ins, outs, p = kernel.attrs, kernel.inputs, kernel.outputs, e.ptr
    dt, s = _dtype(kernel)
    rows, n = _rows(ins[1], a["ndims"])
    w = p(ins[2]) if a["has_weight"] else NULL
    dw = p(outs[1]) if a["has_weight"] else NULL
    return [f"mica_rms_norm_backward_{s}({p(ins[0])}, {p(ins[1])}, {w}, {p(ins[-1])}, {p(outs[0])}, {dw}, "
            f"{rows}, {n}, ({ct.ctype(dt)} *)work);"]


@lower("softmax")
@lower("log_softmax")
def _softmax(e, kernel):
    ins, outs, p = kernel.inputs, kernel.outputs, e.ptr
    _, s = _dtype(kernel)
    rows, n = _rows(ins[0], 1)
    return [f"mica_{kernel.op}_{s}({p(ins[0])}, {p(outs[0])}, {rows}, {n});"]


@lower("softmax_backward")
@lower("log_softmax_backward")
def _softmax_backward(e, kernel):
    ins, outs, p = kernel.inputs, kernel.outputs, e.ptr
    _, s = _dtype(kernel)
    rows, n = _rows(ins[1], 1)
    return [f"mica_{kernel.op}_{s}({p(ins[0])}, {p(ins[1])}, {p(outs[0])}, {rows}, {n});"]


@lower("cross_entropy", scratch=_per_row)
def _cross_entropy(e, kernel):
    a, ins, outs, p = kernel.attrs, kernel.inputs, kernel.outputs, e.ptr
    dt, s = _dtype(kernel)
    rows, n = ins[0].shape
    return [f"mica_cross_entropy_{s}({p(ins[0])}, {p(ins[1])}, {p(outs[0])}, {p(outs[1])}, {rows}, {n}, "
            f"{a['ignore_index']}LL, ({ct.ctype(dt)} *)scratch);"]


@lower("cross_entropy_backward")
def _cross_entropy_backward(e, kernel):
    a, ins, outs, p = kernel.attrs, kernel.inputs, kernel.outputs, e.ptr
    _, s = _dtype(kernel)
    rows, n = ins[1].shape
    return [f"mica_cross_entropy_backward_{s}({p(ins[0])}, {p(ins[1])}, {p(ins[2])}, {p(ins[3])}, "
            f"{p(outs[0])}, {rows}, {n}, {a['ignore_index']}LL);"]


@lower("embedding")
def _embedding(e, kernel):
    ins, outs, p = kernel.inputs, kernel.outputs, e.ptr
    _, s = _dtype(kernel)
    count = ins[0].numel
    V, D = ins[1].shape
    return [f"mica_embedding_{s}({p(ins[0])}, {p(ins[1])}, {p(outs[0])}, {count}, {V}, {D});"]


CHECK_MODES = ("targets", "index", "classes", "positions", "count")  # (mica_kernels.h's mica_check_range modes, in order)


@lower("check_range")
def _check_range(e, kernel):
    t, out, p = kernel.inputs[0], kernel.outputs[0], e.ptr
    return [f"mica_check_range({p(t)}, {p(out)}, {t.numel}, {kernel.attrs['bound']}, "
            f"{kernel.attrs['ignore_index']}LL, {CHECK_MODES.index(kernel.attrs.get('mode', 'targets'))});"]


@lower("embedding_backward", scratch=_embedding_backward_scratch)
def _embedding_backward(e, kernel):
    ins, outs, p = kernel.inputs, kernel.outputs, e.ptr
    _, s = _dtype(kernel)
    count = ins[1].numel
    V, D = outs[0].shape
    return [f"mica_embedding_backward_{s}({p(ins[0])}, {p(ins[1])}, {p(outs[0])}, {count}, {V}, {D}, "
            "(int64_t *)work);"]


HALF_ROUND = {"bfloat16": 1, "float16": 2}  # mica_attn_shape.half_round (fp_half_intermediates)


def attention_shape(e, kernel):
    """(statements declaring `mica_attn_shape shape` for an attention kernel — its sizes, every
    operand's strides, the mask and dropout settings —, q, k, v, o): the record both targets'
    attention kernels take (mica_rows.h)."""
    a = kernel.attrs
    fwd = kernel.op == "attention"
    q, k, v = kernel.inputs[:3] if fwd else kernel.inputs[1:4]
    o = kernel.outputs[0] if fwd else kernel.inputs[4]
    B, H, L, E, qsb, qsh, qst = _attn_dims(q)
    _, _, S, _, ksb, ksh, kst = _attn_dims(k)
    _, _, _, Ev, vsb, vsh, vst = _attn_dims(v)
    _, _, _, _, osb, osh, ost = _attn_dims(o)
    grads = kernel.outputs if not fwd else (q, k, v)  # the forward writes no gradients
    gstrides = " ".join(f"{st[4]}, {st[5]}, {st[6]}," for st in (_attn_dims(x) for x in grads))
    rng = e.rng_pointer() if a["dropout_p"] else "NULL"
    lines = [
        "mica_attn_shape shape = {",
        f"    {B}, {H}, {L}, {S}, {E}, {Ev},",
        f"    {qsb}, {qsh}, {qst}, {ksb}, {ksh}, {kst}, {vsb}, {vsh}, {vst}, {osb}, {osh}, {ost},",
        f"    {gstrides}",
        f"    {int(a['causal'])}, {a['scale']!r}, {a['dropout_p']!r}, {max(a['stream'], 0)}u, {a['threshold']}u, {rng}"
        + f", {HALF_ROUND[a['half_round']] if a.get('half_round') else 0}" + "};",  # (every field: -Wextra)
    ]
    return lines, q, k, v, o


def attention_grad_strides(kernel):
    """(stride_b, stride_h, stride_t) of the backward's incoming gradient."""
    return _attn_dims(kernel.inputs[0])[4:]


@lower("attention", scratch=_attention_scratch)
@lower("attention_backward", scratch=_attention_scratch)
def _attention(e, kernel):
    dt, s = _dtype(kernel)
    p = e.ptr
    lines, q, k, v, o = attention_shape(e, kernel)
    L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    slot = attention_slot(dt, L, S, E, Ev)
    if kernel.op == "attention":
        lines.append(f"mica_attention_{s}(&shape, {p(q)}, {p(k)}, {p(v)}, {p(o)}, {p(kernel.outputs[1])}, "
                     f"({ct.ctype(dt)} *)scratch, {slot});")
    else:
        g = kernel.inputs[0]
        gsb, gsh, gst = attention_grad_strides(kernel)
        dq, dk, dv = kernel.outputs
        lines.append(f"mica_attention_backward_{s}(&shape, {p(g)}, {p(q)}, {p(k)}, {p(v)}, {p(o)}, "
                     f"{p(kernel.inputs[5])}, {p(dq)}, {p(dk)}, {p(dv)}, {gsb}, {gsh}, {gst}, "
                     f"({ct.ctype(dt)} *)scratch, {slot});")
    return ["{"] + ["    " + x for x in lines] + ["}"]
