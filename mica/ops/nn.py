"""Row-wise primitives that deserve their own kernels, each with an explicit backward primitive:
softmax, log-softmax, layer and RMS norm, cross-entropy, causal attention, embedding, dropout.

"Row-wise" means over the trailing axis (or trailing `ndims` axes for the norms); every leading
axis is a row index. Backward primitives have no VJP of their own: second derivatives of these
are not supported.
"""
import numpy as np

from .. import dtypes
from ..errors import GradError, MicaError, ShapeError
from . import KernelABI, defop
from .philox import keep_mask, uniform


def emit(*args, **kwargs):
    from ..tensor import emit as _emit

    return _emit(*args, **kwargs)


def acc(dt):
    """Type in which a row's statistics are kept."""
    return dtypes.float64 if dt is dtypes.float64 else dtypes.float32


def _float_input(op, x):
    if x.dtype.kind != "float":
        raise ShapeError(f"{op} takes a floating tensor, got {x!r}")


def _no_second(op, cts):
    if any(c is not None for c in cts[1:]):
        raise GradError(f"{op}: its saved statistics are not differentiable")


def _row_axes(x, k):
    return tuple(range(x.ndim - k, x.ndim))


# ---- softmax / log_softmax over the last axis ------------------------------------------------------

def _rowwise_infer(op):
    def infer(specs):
        _float_input(op, specs[0])
        if not specs[0].shape:
            raise ShapeError(f"{op} needs at least one dim, got {specs[0]!r}")
        return [(specs[0].shape, specs[0].dtype)]
    return infer


def _softmax_ref(a, at, run):
    x = a[0]
    if x.size == 0:  # (a row of no elements, or no rows: nothing to normalize)
        return np.empty_like(x)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _log_softmax_ref(a, at, run):
    x = a[0]
    if x.size == 0:
        return np.empty_like(x)
    s = x - x.max(-1, keepdims=True)
    return s - np.log(np.exp(s).sum(-1, keepdims=True))


def _pair_infer(op):
    def infer(specs):
        g, y = specs
        if g.shape != y.shape or g.dtype is not y.dtype:
            raise ShapeError(f"{op}: gradient {g!r} does not match {y!r}")
        return [(y.shape, y.dtype)]
    return infer


defop("softmax", remat="recompute", infer=_rowwise_infer("softmax"), ref=_softmax_ref, family="kernel",
      vjp=lambda c, o, i, a, n: [emit("softmax_backward", [c[0], o[0]])])
defop("softmax_backward", infer=_pair_infer("softmax_backward"), family="kernel",
      ref=lambda a, at, run: a[1] * (a[0] - (a[0] * a[1]).sum(-1, keepdims=True)))
defop("log_softmax", remat="recompute", infer=_rowwise_infer("log_softmax"), ref=_log_softmax_ref, family="kernel",
      vjp=lambda c, o, i, a, n: [emit("log_softmax_backward", [c[0], o[0]])])
defop("log_softmax_backward", infer=_pair_infer("log_softmax_backward"), family="kernel",
      ref=lambda a, at, run: a[0] - np.exp(a[1]) * a[0].sum(-1, keepdims=True))


# ---- layer norm and RMS norm ------------------------------------------------------------------------

def _norm_params(op, x, params, ndims):
    norm_shape = x.shape[len(x.shape) - ndims:]
    for p in params:
        if p.shape != norm_shape or p.dtype is not x.dtype:
            raise ShapeError(f"{op}: weight/bias {p!r} must be {x.dtype.short}{list(norm_shape)} "
                             f"to match the normalized shape of {x!r}")


def _layer_norm_infer(specs, eps, ndims, has_weight, has_bias):
    x, params = specs[0], specs[1:]
    _float_input("layer_norm", x)
    if not 1 <= ndims <= len(x.shape):
        raise ShapeError(f"layer_norm: cannot normalize the last {ndims} dims of {x!r}")
    _norm_params("layer_norm", x, params, ndims)
    rows = x.shape[:len(x.shape) - ndims]
    return [(x.shape, x.dtype), (rows, acc(x.dtype)), (rows, acc(x.dtype))]


def _split_params(args, has_weight, has_bias):
    rest = list(args)
    w = rest.pop(0) if has_weight else None
    b = rest.pop(0) if has_bias else None
    return w, b


def _layer_norm_ref(a, at, run):
    x = a[0]
    axes = _row_axes(x, at["ndims"])
    w, b = _split_params(a[1:], at["has_weight"], at["has_bias"])
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    rstd = 1 / np.sqrt(var + x.dtype.type(at["eps"]))
    y = (x - mean) * rstd
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y, mean.reshape(mean.shape[:x.ndim - len(axes)]), rstd.reshape(rstd.shape[:x.ndim - len(axes)])


def _layer_norm_vjp(c, o, i, a, n):
    _no_second("layer_norm", c)
    if c[0] is None:
        return [None] * len(i)
    x, params = i[0], list(i[1:])
    outs = emit("layer_norm_backward", [c[0], x, *params[:1 if a["has_weight"] else 0], o[1], o[2]], **a)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return list(outs)


def _layer_norm_bwd_infer(specs, eps, ndims, has_weight, has_bias):
    g, x = specs[0], specs[1]
    if g.shape != x.shape or g.dtype is not x.dtype:
        raise ShapeError(f"layer_norm_backward: gradient {g!r} does not match {x!r}")
    norm_shape = x.shape[len(x.shape) - ndims:]
    out = [(x.shape, x.dtype)]
    out += [(norm_shape, x.dtype)] * (int(has_weight) + int(has_bias))
    return out


def _layer_norm_bwd_ref(a, at, run):
    g, x = a[0], a[1]
    w = a[2] if at["has_weight"] else None
    mean, rstd = a[-2], a[-1]
    axes = _row_axes(x, at["ndims"])
    bshape = mean.shape + (1,) * len(axes)
    xhat = (x - mean.reshape(bshape)) * rstd.reshape(bshape)
    gx = g * w if w is not None else g
    dx = rstd.reshape(bshape) * (gx - gx.mean(axis=axes, keepdims=True)
                                 - xhat * (gx * xhat).mean(axis=axes, keepdims=True))
    lead = tuple(range(x.ndim - len(axes)))
    outs = [dx]
    if at["has_weight"]:
        outs.append((g * xhat).sum(axis=lead))
    if at["has_bias"]:
        outs.append(g.sum(axis=lead))
    return tuple(outs)


def _norm_from_statistics(centered):
    """Output 0 of a norm over the last dim from its input and saved statistics, by the steps of its
    row kernel (mica_rows.h), in their order: ((x - mean) * rstd) * w + b, or (x * rstd) * w."""
    def rebuild(emit, ins, attrs):
        x, rest = ins[0], list(ins[1:])
        w = rest.pop(0) if attrs["has_weight"] else None
        b = rest.pop(0) if attrs.get("has_bias") else None
        stats = rest
        shape = x.shape
        row, col = shape[:-1] + (1,), (1,) * (len(shape) - 1) + shape[-1:]

        def spread(v, keep):
            return emit("expand", [emit("reshape", [v], {"shape": keep}, keep)], {"shape": shape}, shape)

        if centered:
            v = emit("mul", [emit("sub", [x, spread(stats[0], row)], {}, shape), spread(stats[1], row)], {}, shape)
        else:
            v = emit("mul", [x, spread(stats[0], row)], {}, shape)
        if w is not None:
            v = emit("mul", [v, spread(w, col)], {}, shape)
        if b is not None:
            v = emit("add", [v, spread(b, col)], {}, shape)
        return v
    return rebuild


defop("layer_norm", infer=_layer_norm_infer, ref=_layer_norm_ref, vjp=_layer_norm_vjp, family="kernel",
      remat="recompute", from_statistics=_norm_from_statistics(True))
defop("layer_norm_backward", infer=_layer_norm_bwd_infer, ref=_layer_norm_bwd_ref, family="kernel")


def _rms_norm_infer(specs, eps, ndims, has_weight):
    x, params = specs[0], specs[1:]
    _float_input("rms_norm", x)
    if not 1 <= ndims <= len(x.shape):
        raise ShapeError(f"rms_norm: cannot normalize the last {ndims} dims of {x!r}")
    _norm_params("rms_norm", x, params, ndims)
    return [(x.shape, x.dtype), (x.shape[:len(x.shape) - ndims], acc(x.dtype))]


def _rms_norm_ref(a, at, run):
    x = a[0]
    axes = _row_axes(x, at["ndims"])
    rstd = 1 / np.sqrt((x * x).mean(axis=axes, keepdims=True) + x.dtype.type(at["eps"]))
    y = x * rstd
    if at["has_weight"]:
        y = y * a[1]
    return y, rstd.reshape(rstd.shape[:x.ndim - len(axes)])


def _rms_norm_vjp(c, o, i, a, n):
    _no_second("rms_norm", c)
    if c[0] is None:
        return [None] * len(i)
    outs = emit("rms_norm_backward", [c[0], *i, o[1]], **a)
    return list(outs) if isinstance(outs, tuple) else [outs]


def _rms_norm_bwd_infer(specs, eps, ndims, has_weight):
    g, x = specs[0], specs[1]
    if g.shape != x.shape or g.dtype is not x.dtype:
        raise ShapeError(f"rms_norm_backward: gradient {g!r} does not match {x!r}")
    out = [(x.shape, x.dtype)]
    if has_weight:
        out.append((x.shape[len(x.shape) - ndims:], x.dtype))
    return out


def _rms_norm_bwd_ref(a, at, run):
    g, x, rstd = a[0], a[1], a[-1]
    axes = _row_axes(x, at["ndims"])
    r = rstd.reshape(rstd.shape + (1,) * len(axes))
    xhat = x * r
    gx = g * a[2] if at["has_weight"] else g
    dx = r * (gx - xhat * (gx * xhat).mean(axis=axes, keepdims=True))
    if at["has_weight"]:
        return dx, (g * xhat).sum(axis=tuple(range(x.ndim - len(axes))))
    return dx


defop("rms_norm", infer=_rms_norm_infer, ref=_rms_norm_ref, vjp=_rms_norm_vjp, family="kernel",
      remat="recompute", from_statistics=_norm_from_statistics(False))
defop("rms_norm_backward", infer=_rms_norm_bwd_infer, ref=_rms_norm_bwd_ref, family="kernel")


# ---- cross-entropy over rows of logits ----------------------------------------------------------------

def _ce_infer(specs, ignore_index):
    x, t = specs
    _float_input("cross_entropy", x)
    if len(x.shape) != 2 or t.shape != x.shape[:1] or t.dtype.kind != "int":
        raise ShapeError(f"cross_entropy: expects logits [N, C] and integer targets [N], got {x!r} and {t!r}")
    return [(x.shape[:1], x.dtype), (x.shape[:1], acc(x.dtype))]


def _check_targets(t, classes, ignore_index):
    valid = t != ignore_index
    bad = valid & ((t < 0) | (t >= classes))
    if bad.any():
        raise MicaError(f"cross_entropy: target {int(t[bad][0])} is out of range for {classes} classes; give targets "
                        "below the class count, or ignore_index")  # (mica_rows.h's sentence, every target's)
    return valid, np.where(valid, t, 0)


def _ce_ref(a, at, run):
    x, t = a
    valid, tt = _check_targets(t, x.shape[1], at["ignore_index"])
    m = x.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[:, 0]
    picked = x[np.arange(x.shape[0]), tt]
    return np.where(valid, lse - picked, 0), lse


def _ce_vjp(c, o, i, a, n):
    _no_second("cross_entropy", c)
    if c[0] is None:
        return [None, None]
    return [emit("cross_entropy_backward", [c[0], i[0], i[1], o[1]], **a), None]


def _ce_bwd_infer(specs, ignore_index):
    g, x, t, lse = specs
    if g.shape != x.shape[:1] or g.dtype is not x.dtype:
        raise ShapeError(f"cross_entropy_backward: gradient {g!r} does not match logits {x!r}")
    return [(x.shape, x.dtype)]


def _ce_bwd_ref(a, at, run):
    g, x, t, lse = a
    valid, tt = _check_targets(t, x.shape[1], at["ignore_index"])
    p = np.exp(x - lse[:, None])
    p[np.arange(x.shape[0]), tt] -= 1
    return p * np.where(valid, g, 0)[:, None]


# a target id out of range (and not ignore_index) stops the program with a sentence
defop("cross_entropy", infer=_ce_infer, ref=_ce_ref, vjp=_ce_vjp, family="kernel", kernel=KernelABI(may_fail=True))
defop("cross_entropy_backward", infer=_ce_bwd_infer, ref=_ce_bwd_ref, family="kernel",
      kernel=KernelABI(may_fail=True, inplace=[(0, 1)]))  # (the gradient over the logits: GPT-2's 2.5 GB)


# ---- scaled dot-product attention ---------------------------------------------------------------------

def _attn_check(q, k, v):
    for x in (q, k, v):
        _float_input("scaled_dot_product_attention", x)
    if (len(q.shape) < 2 or len({len(q.shape), len(k.shape), len(v.shape)}) != 1
            or not q.shape[:-2] == k.shape[:-2] == v.shape[:-2] or q.shape[-1] != k.shape[-1]
            or k.shape[-2] != v.shape[-2] or not q.dtype is k.dtype is v.dtype):
        raise ShapeError(f"scaled_dot_product_attention: q {q!r}, k {k!r}, v {v!r} must be "
                         "[..., L, E], [..., S, E], [..., S, Ev] of one type")


def _attention_infer(specs, causal, scale, dropout_p, stream, threshold, half_round=None):
    q, k, v = specs[:3]
    _attn_check(q, k, v)
    return [(q.shape[:-1] + (v.shape[-1],), q.dtype), (q.shape[:-1], acc(q.dtype))]


def _attn_scores(q, k, at):
    s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(at["scale"])
    if at["causal"]:
        L, S = s.shape[-2:]
        s = np.where(np.tril(np.ones((L, S), dtype=bool)), s, -np.inf)
    return s


def _attn_probs(q, k, lse, at):
    s = _attn_scores(q, k, at)
    if lse is None:
        m = s.max(-1, keepdims=True)
        lse = (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]
    return np.exp(s - lse[..., None]), lse


def _attn_keep(shape, at, run):
    if not at["dropout_p"]:
        return None
    return keep_mask(int(np.prod(shape)), run.rng[0], run.rng[1], at["stream"],
                     at["threshold"]).reshape(shape)


def _attn_round(x, at, run):
    """x rounded to the half type `half_round` names (fp_half_intermediates; x when it names none)."""
    half = at.get("half_round")
    return x if half is None else run.round_half(x, half)


def _attention_ref(a, at, run):
    q, k, v = a[:3]
    total = None
    if at.get("half_round") is None:
        p, lse = _attn_probs(q, k, None, at)
    else:  # exp(s - max) rounded to the half type; the product with V divided by the float sum (mica_rows.h)
        s = _attn_scores(q, k, at)
        m = s.max(-1, keepdims=True)
        e = np.exp(s - m)
        total = e.sum(-1, keepdims=True)
        lse = (m + np.log(total))[..., 0]
        p = _attn_round(e, at, run)
    keep = _attn_keep(p.shape, at, run)
    if keep is not None:
        p = np.where(keep, p * p.dtype.type(1 / (1 - at["dropout_p"])), 0)
    return (p @ v if total is None else (p @ v) / total), lse


def _attention_vjp(c, o, i, a, n):
    _no_second("scaled_dot_product_attention", c)
    if c[0] is None:
        return [None] * len(i)
    grads = emit("attention_backward", [c[0], *i[:3], o[0], o[1], *i[3:]], **a)
    return list(grads) + [None] * (len(i) - 3)


def _attention_bwd_infer(specs, causal, scale, dropout_p, stream, threshold, half_round=None):
    g, q, k, v, o, lse = specs[:6]
    _attn_check(q, k, v)
    if g.shape != o.shape:
        raise ShapeError(f"attention_backward: gradient {g!r} does not match output {o!r}")
    return [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype)]


def _attention_bwd_ref(a, at, run):
    g, q, k, v, o, lse = a[:6]
    p, _ = _attn_probs(q, k, lse, at)
    keep = _attn_keep(p.shape, at, run)
    scale_d = p.dtype.type(1 / (1 - at["dropout_p"])) if keep is not None else None
    pd = np.where(keep, p * scale_d, 0) if keep is not None else p
    dv = np.swapaxes(_attn_round(pd, at, run), -1, -2) @ g
    dpd = g @ np.swapaxes(v, -1, -2)
    dp = np.where(keep, dpd * scale_d, 0) if keep is not None else dpd
    d = (g * o).sum(-1, keepdims=True)
    ds = _attn_round(p * (dp - d), at, run) * q.dtype.type(at["scale"])
    return ds @ k, np.swapaxes(ds, -1, -2) @ q, dv


# q, k, v (and the backward's g, q, k, v, o, lse) are read through strides, so the heads need no
# copy out of the fused qkv product; the output (and dq, dk, dv) are written in their reader's layout
def _attention_flops(node):
    q, k, v = node.inputs[:3]
    heads = q.numel // (q.shape[-1] * q.shape[-2])
    pairs = q.shape[-2] * k.shape[-2] // (2 if node.attrs.get("causal") else 1)
    return heads * pairs * 2 * (q.shape[-1] + v.shape[-1])


defop("attention", infer=_attention_infer, ref=_attention_ref, vjp=_attention_vjp, family="kernel",
      kernel=KernelABI(strided_inputs=3, strided_outputs=1, rng_attr="dropout_p", half_round_attr="half_round"),
      remat="asked",
      flops=_attention_flops)
defop("attention_backward", infer=_attention_bwd_infer, ref=_attention_bwd_ref, family="kernel",
      kernel=KernelABI(strided_inputs=6, strided_outputs=3, rng_attr="dropout_p", half_round_attr="half_round"))


# ---- embedding --------------------------------------------------------------------------------------

def _embedding_infer(specs):
    idx, w = specs
    if idx.dtype is not dtypes.int64 or len(w.shape) != 2:  # (the verb casts int32 indices)
        raise ShapeError(f"embedding: expects int64 indices and a [num_embeddings, dim] weight, "
                         f"got {idx!r} and {w!r}")
    return [(idx.shape + w.shape[1:], w.dtype)]


def _check_index(idx, n):
    bad = (idx < 0) | (idx >= n)
    if bad.any():
        raise MicaError(f"embedding: index {int(idx[bad][0])} is out of range for {n} embeddings; give indices below "
                        "the table's row count (a data id beyond the vocabulary?)")


def _embedding_ref(a, at, run):
    idx, w = a
    _check_index(idx, w.shape[0])
    return w[idx]


def _embedding_vjp(c, o, i, a, n):
    return [None, emit("embedding_backward", [c[0], i[0]], num_embeddings=i[1].shape[0])]


def _embedding_bwd_infer(specs, num_embeddings):
    g, idx = specs
    if g.shape[:-1] != idx.shape:
        raise ShapeError(f"embedding_backward: gradient {g!r} does not match indices {idx!r}")
    return [((num_embeddings, g.shape[-1]), g.dtype)]


def _embedding_bwd_ref(a, at, run):
    g, idx = a
    _check_index(idx, at["num_embeddings"])
    out = np.zeros((at["num_embeddings"], g.shape[-1]), dtype=g.dtype)
    np.add.at(out, idx.reshape(-1), g.reshape(idx.size, g.shape[-1]))
    return out


# an index out of range stops the program with a sentence; a gather (one row copied per index,
# no arithmetic) is as cheap to repeat in the backward as to read back, so remat may recompute it
defop("embedding", infer=_embedding_infer, ref=_embedding_ref, vjp=_embedding_vjp, family="kernel",
      kernel=KernelABI(may_fail=True), remat="recompute", flops=lambda node: 0)
# its own gradient is a gather (scatter_add's, index_put's gradient of the values they write)
defop("embedding_backward", infer=_embedding_bwd_infer, ref=_embedding_bwd_ref, family="kernel",
      vjp=lambda c, o, i, a, n: [emit("embedding", [i[1], c[0]]), None], kernel=KernelABI(may_fail=True))


# ---- check_range: class indices a composed verb reads (nll_loss), checked ----------------------------

def _check_range_infer(specs, bound, ignore_index, mode="targets"):
    (t,) = specs
    if t.dtype is not dtypes.int64:
        raise ShapeError(f"check_range: expects int64 class indices, got {t!r}")
    return [(t.shape, t.dtype)]


def _check_range_ref(a, at, run):
    (t,) = a
    n, mode = at["bound"], at.get("mode", "targets")
    if mode == "count":
        bad = t != n
        if bad.any():  # (MICA_MASK_COUNT_TEXT)
            raise MicaError(f"x[mask] = values: the mask selects {int(t[bad][0])} elements and values holds {n}; give "
                            "one value per True element (torch refuses the shape mismatch too)")
        return t.copy()
    if mode == "index":
        bad = (t < -n) | (t >= n)
        if bad.any():  # (mica_rows.h's MICA_INDEX_RANGE_TEXT)
            raise MicaError(f"an index tensor holds {int(t[bad][0])}, out of range for a dim of {n} elements; give "
                            "indices from -size to size - 1")
        return np.where(t < 0, t + n, t)
    if mode in ("classes", "positions"):
        bad = (t < 0) | (t >= n)
        if bad.any() and mode == "classes":  # (MICA_CLASS_RANGE_TEXT)
            raise MicaError(f"one_hot: class {int(t[bad][0])} is out of range for {n} classes; give classes from 0 "
                            "to num_classes - 1")
        if bad.any():  # (MICA_POSITION_RANGE_TEXT)
            raise MicaError(f"an index tensor holds {int(t[bad][0])}, out of range for a dim of {n} elements; give "
                            "indices from 0 to size - 1")
        return t.copy()
    bad = (t != at["ignore_index"]) & ((t < 0) | (t >= at["bound"]))
    if bad.any():
        raise MicaError(f"nll_loss: target {int(t[bad][0])} is out of range for {at['bound']} classes; give targets "
                        "below the class count, or ignore_index")  # (mica_rows.h's sentence, every target's)
    return t.copy()


# the indices, copied, or the program stops with a sentence (as torch raises): nll_loss picks its
# log-probabilities with a where over the classes, which an index out of range would miss silently.
# mode "index": a tensor index of a dim of `bound` elements (gather, index_select, x[t]), from
# -bound up, the negative ones wrapped (the flat row several make could be in range when one is
# not); mode "positions": the same from 0 (gather's, index_select's); mode "classes": one_hot's
# classes, from 0 (no ignore_index)
defop("check_range", infer=_check_range_infer, ref=_check_range_ref, family="kernel",
      kernel=KernelABI(may_fail=True), flops=lambda node: 0)


# ---- dropout ----------------------------------------------------------------------------------------

def _dropout_infer(specs, p, stream, threshold):
    x, key = specs
    _float_input("dropout", x)
    return [(x.shape, x.dtype)]


def _dropout_ref(a, at, run):
    x = a[0]
    keep = keep_mask(x.size, run.rng[0], run.rng[1], at["stream"], at["threshold"]).reshape(x.shape)
    return np.where(keep, x * x.dtype.type(1 / (1 - at["p"])), 0)


def _dropout_vjp(c, o, i, a, n):
    return [emit("dropout", [c[0], i[1]], **a), None]


defop("dropout", infer=_dropout_infer, ref=_dropout_ref, vjp=_dropout_vjp, family="elementwise")


# ---- rand: uniform draws in [0, 1) of x's shape and type (x's values unread), keyed as dropout's ---------

def _rand_infer(specs, stream):
    x, key = specs
    _float_input("rand", x)
    return [(x.shape, x.dtype)]


def _rand_ref(a, at, run):
    x = a[0]
    return uniform(x.size, run.rng[0], run.rng[1], at["stream"]).reshape(x.shape).astype(x.dtype)


defop("rand", infer=_rand_infer, ref=_rand_ref, vjp=lambda c, o, i, a, n: [None, None], family="elementwise")

RANDOM = ("dropout", "rand")  # (the primitives that draw: their kernel reads the run's key and its own index)
