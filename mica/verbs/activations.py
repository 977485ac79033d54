"""torch.nn.functional's other activations and losses, written with Mica's verbs (torch's formulas,
so torch's values and gradients, corners included): softplus, logsigmoid, leaky_relu, elu,
hardtanh, relu6, softsign, glu, normalize, cosine_similarity; mse, l1, smooth-L1, Huber, binary
cross-entropy (on probabilities and on logits), KL divergence; log1p and expm1.
"""
import math

import numpy as np

from .. import amp, dtypes
from ..tensor import fail
from .core import (_floating_input, abs, add, as_tensor, clamp, detach, div, eq, exp, ge, gt, le, log, logical_and, logical_or, lt,
                   maximum, mean, mul, ne, neg, norm, result_type, rounded_once, sigmoid, sub, tanh, to, where,
                   written)
from .core import sum as _sum
from .shape import expand, narrow, reshape


# torch's kernels for these take floating tensors only (an integer one is refused, not widened)
_FLOATING_ONLY = frozenset(("softplus", "logsigmoid", "mish", "hardswish", "hardsigmoid", "selu", "elu", "celu",
                            "softshrink", "prelu", "normalize", "cdist", "cosine_similarity", "glu", "leaky_relu",
                            "hardshrink"))


def _floating_only(verb, x):
    """x as a Tensor, refused where it is an integer one and torch's kernel takes floats only."""
    return _floating_input(verb, x) if verb in _FLOATING_ONLY else as_tensor(x)


def _float(verb, x):
    """x as a floating Tensor: an integer one as the default float (refused where torch's kernel
    refuses it); a half one in float32 where `verb` is on autocast's float32 list (the losses; on
    CUDA also softplus, expm1, log1p, ...)."""
    x = _floating_only(verb, x)
    if x.dtype.kind != "float":
        x = to(x, dtypes.DEFAULT_FLOAT)
    (x,) = amp.float32(verb, x)
    return x


def log1p(input):
    """log(1 + x), accurate for small x: log(u) * x / (u - 1) with u = 1 + x rounded (Goldberg's)."""
    def body(x):
        u = add(x, 1.0)
        plain = logical_or(le(u, 0.0), eq(u, math.inf))  # (-1 and below, inf: log(1 + x) itself, its slope 1 / (1 + x))
        xs = where(plain, 0.0, x)
        us = add(xs, 1.0)
        d = sub(us, 1.0)
        exact = eq(d, 0.0)
        return where(plain, log(u), where(exact, xs, mul(log(us), div(xs, where(exact, 1.0, d)))))
    return rounded_once(_float("log1p", input), body)


def log2(input):
    """log(x) / log(2): torch's log2 to within an ulp (the division rounds once more)."""
    return rounded_once(_float("log2", input), lambda x: div(log(x), math.log(2.0)))


def log10(input):
    """log(x) / log(10): torch's log10 to within an ulp (the division rounds once more)."""
    return rounded_once(_float("log10", input), lambda x: div(log(x), math.log(10.0)))


def expm1(input):
    """exp(x) - 1, accurate for small x: (u - 1) * x / log(u) with u = exp(x) (Kahan's)."""
    return rounded_once(_float("expm1", input), _expm1)


def _expm1(x):
    u = exp(x)
    um1 = sub(u, 1.0)
    # (x tiny, very negative, inf or NaN: u - 1 itself; the other branch computes on safe values then,
    # so no 0 * inf reaches its gradient)
    plain = logical_or(logical_or(eq(u, 1.0), eq(um1, -1.0)), logical_or(ne(um1, um1), eq(u, math.inf)))
    lu = log(where(plain, 1.0, u))
    xs = where(plain, 0.0, x)
    return where(eq(u, 1.0), x, where(plain, sub(u, 1.0), mul(sub(u, 1.0), div(xs, where(plain, 1.0, lu)))))


def softplus(input, beta=1.0, threshold=20.0):
    def body(x):
        bx = mul(x, beta)
        return where(gt(bx, threshold), x, div(log1p(exp(where(gt(bx, threshold), 0.0, bx))), beta))
    return rounded_once(_float("softplus", input), body)


def logsigmoid(input):
    """x - log1p(exp(x)) below 0, -log1p(exp(-x)) from 0 (each exp's argument kept at most 0, and
    the slope at 0 torch's 1/2)."""
    def body(x):
        neg_side = lt(x, 0.0)
        xn, xp = where(neg_side, x, 0.0), where(neg_side, 0.0, x)
        return where(neg_side, sub(xn, log1p(exp(xn))), neg(log1p(exp(neg(xp)))))
    return rounded_once(_float("logsigmoid", input), body)


def mish(input, inplace=False):
    """x tanh(softplus(x)), rounded once in a half type."""
    return written(input, rounded_once(_float("mish", input), lambda x: mul(x, tanh(softplus(x)))), inplace)


def hardswish(input, inplace=False):
    """x relu6(x + 3) / 6, with torch's slope x / 3 + 1/2 strictly inside (-3, 3), 0 at and below -3
    and 1 at and above 3 (x 0 below: -inf gives NaN, as torch's)."""
    def body(x):
        low, high = le(x, -3.0), ge(x, 3.0)
        xs = where(logical_or(low, high), 0.0, x)  # (the middle's formula on safe values: no inf * 0 slope)
        return where(low, mul(x, 0.0), where(high, x, div(mul(xs, add(xs, 3.0)), 6.0)))
    return written(input, rounded_once(_float("hardswish", input), body), inplace)


def hardsigmoid(input, inplace=False):
    """relu6(x + 3) / 6, with torch's slope 1/6 strictly inside (-3, 3), 0 elsewhere."""
    def body(x):
        return where(le(x, -3.0), 0.0, where(ge(x, 3.0), 1.0, add(div(x, 6.0), 0.5)))
    return written(input, rounded_once(_float("hardsigmoid", input), body), inplace)


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def selu(input, inplace=False):
    y = rounded_once(_float("selu", input), lambda x: mul(_elu(x, _SELU_ALPHA), _SELU_SCALE))
    return written(input, y, inplace)


def celu(input, alpha=1.0, inplace=False):
    """x above 0, alpha (exp(x / alpha) - 1) below."""
    if alpha == 0:
        fail("celu: alpha must not be 0 (it divides x), as torch's")
    y = rounded_once(_float("celu", input), lambda x: where(gt(x, 0.0), x, mul(
        _expm1(div(where(gt(x, 0.0), 0.0, x), alpha)), alpha)))
    return written(input, y, inplace)


def prelu(input, weight):
    """torch.nn.functional.prelu: x above 0, weight x below; weight has one element or one per
    channel (dim 1; of a 1-d input, dim 0)."""
    x, w = amp.lower("prelu", _float("prelu", input), as_tensor(weight))
    if w.ndim > 1 or (w.numel() != 1 and (x.ndim == 0 or w.numel() != x.shape[1 if x.ndim > 1 else 0])):
        fail(f"prelu: the weight {w.value.spec!r} must have one element or one per channel (dim 1 of "
             f"{x.value.spec!r})")
    if w.numel() != 1 and x.ndim > 1:
        w = reshape(w, (w.numel(),) + (1,) * (x.ndim - 2))
    elif w.numel() == 1 and x.ndim == 0:
        w = reshape(w, ())
    return where(gt(x, 0.0), x, mul(w, x))


def threshold(input, threshold, value, inplace=False):
    """value where x <= threshold, else x (NaN stays NaN, as torch's)."""
    x = as_tensor(input)
    return written(input, where(le(x, threshold), as_tensor(value, x.dtype), x), inplace)


def tanhshrink(input):
    return rounded_once(_float("tanhshrink", input), lambda x: sub(x, tanh(x)))


def softshrink(input, lambd=0.5):
    """x - lambd above lambd, x + lambd below -lambd, 0 between."""
    if lambd < 0:
        fail(f"softshrink: lambd must be at least 0, got {lambd}")
    x = _float("softshrink", input)  # (between: x * 0, so NaN stays NaN, as torch's)
    return where(gt(x, lambd), sub(x, lambd), where(lt(x, -lambd), add(x, lambd), mul(x, 0.0)))


def hardshrink(input, lambd=0.5):
    """x outside [-lambd, lambd], 0 within."""
    x = _floating_only("hardshrink", input)  # (torch's: 0 within [-lambd, lambd], x elsewhere, NaN too)
    return where(logical_and(ge(x, -lambd), le(x, lambd)), 0.0, x)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    x = _floating_only("leaky_relu", input)
    return written(input, where(gt(x, 0), x, mul(x, negative_slope)), inplace)


def elu(input, alpha=1.0, inplace=False):
    return written(input, rounded_once(_float("elu", input), lambda x: _elu(x, alpha)), inplace)


def _elu(x, alpha):
    return where(gt(x, 0.0), x, mul(_expm1(where(gt(x, 0.0), 0.0, x)), alpha))


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    x = as_tensor(input)  # (torch's gradient: 0 at and beyond the bounds)
    y = where(le(x, min_val), as_tensor(min_val, x.dtype), where(le(as_tensor(max_val, x.dtype), x),
                                                                 as_tensor(max_val, x.dtype), x))
    return written(input, y, inplace)


def relu6(input, inplace=False):
    return hardtanh(input, 0.0, 6.0, inplace)


def softsign(input):
    x = _float("softsign", input)
    return div(x, add(abs(x), 1.0))


def glu(input, dim=-1):
    x = _float("glu", input)
    if x.ndim == 0 or x.shape[dim] % 2:
        fail(f"glu: dim {dim} of {x.value.spec!r} must have an even size, halved into values and gates")
    h = x.shape[dim] // 2
    return rounded_once(x, lambda v: mul(narrow(v, dim, 0, h), sigmoid(narrow(v, dim, h, h))))


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    x = _float("normalize", input)
    n = clamp(norm(x, p, dim, keepdim=True), min=eps)
    return div(x, expand(n, x.shape))


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """torch's: each vector divided by its norm (at least eps), then their dot product."""
    a, b = _float("cosine_similarity", x1), _float("cosine_similarity", x2)
    from ..ops.elementwise import broadcast_shapes

    shape = broadcast_shapes("cosine_similarity", a.shape, b.shape)  # (torch's: broadcast first)
    a, b = expand(a, shape) if a.shape != shape else a, expand(b, shape) if b.shape != shape else b
    na = clamp(norm(a, 2, dim, keepdim=True), min=eps)
    nb = clamp(norm(b, 2, dim, keepdim=True), min=eps)
    return _sum(mul(div(a, na), div(b, nb)), dim)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """torch's: the p-norm of x1 - x2 + eps over the last dim."""
    a, b = _float("pairwise_distance", x1), _float("pairwise_distance", x2)
    d = add(sub(a, b), eps)
    return norm(d, p, -1 if d.ndim else None, keepdim)


def cdist(x1, x2, p=2.0):
    """torch.cdist: the p-norm distance of each row of x1 [..., P, M] to each row of x2 [..., R, M],
    [..., P, R], computed row by row (torch's own for small sizes; its matmul form for large ones
    rounds differently)."""
    a, b = _float("cdist", x1), _float("cdist", x2)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-1]:
        fail(f"cdist: needs x1 [..., P, M] and x2 [..., R, M] with one M, got {a.value.spec!r} and {b.value.spec!r}")
    if not p >= 0:
        fail(f"cdist: p must be at least 0, got {p}")
    return norm(sub(reshape(a, a.shape[:-1] + (1, a.shape[-1])), reshape(b, b.shape[:-2] + (1,) + b.shape[-2:])),
                p, -1)


# ---- losses -----------------------------------------------------------------------------------------

def _reduced(verb, losses, reduction):
    if reduction == "mean":
        return mean(losses)
    if reduction == "sum":
        return _sum(losses)
    if reduction == "none":
        return losses
    fail(f"{verb}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _pair(verb, input, target, typed="promoted"):
    """(input, target) in the loss's type, as torch's kernels give it for mixed types: `promoted`
    (the operands' common type: mse, l1, kl_div), `input` (huber's), `target` (binary cross-entropy
    with logits: its in-place product is in the target's), `same` (binary_cross_entropy refuses
    two float types). Under autocast both are float32 first (the losses are on its float32 list)."""
    x, t = _float(verb, input), as_tensor(target)
    if t.dtype.kind == "float":
        (t,) = amp.float32(verb, t)
        if typed == "same" and t.dtype is not x.dtype:
            fail(f"{verb}: input {x.value.spec!r} and target {t.value.spec!r} differ in type (torch refuses it too); "
                 f"give the target with .to(input.dtype)")
    if t.dtype.kind != "float":
        t = to(t, x.dtype)
    if typed != "own":  # (own: each in its own type, for a loss that rounds as torch's does step by step)
        dt = x.dtype if typed == "input" else t.dtype if typed == "target" else result_type(x, t)
        x, t = (a if a.dtype is dt else to(a, dt) for a in (x, t))
    if x.shape != t.shape:  # (torch broadcasts with a warning that it is likely a mistake; so do not guess)
        fail(f"{verb}: input {x.value.spec!r} and target {t.value.spec!r} differ in shape; give them the same shape")
    return x, t


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    x, t = _pair("mse_loss", input, target)
    d = sub(x, t)
    return _reduced("mse_loss", mul(d, d), reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    x, t = _pair("l1_loss", input, target)
    return _reduced("l1_loss", abs(sub(x, t)), reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    x, t = _pair("smooth_l1_loss", input, target)
    return rounded_once(x, lambda x: _smooth_l1(x, to(t, x.dtype), beta, reduction))


def _smooth_l1(x, t, beta, reduction):
    d = abs(sub(x, t))
    if beta == 0:
        return _reduced("smooth_l1_loss", d, reduction)
    return _reduced("smooth_l1_loss", where(lt(d, beta), div(mul(mul(d, d), 0.5), beta), sub(d, 0.5 * beta)),
                    reduction)


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    x, t = _pair("huber_loss", input, target, "input")
    return rounded_once(x, lambda x: _huber(x, to(t, x.dtype), delta, reduction))


def _huber(x, t, delta, reduction):
    d = abs(sub(x, t))
    return _reduced("huber_loss", where(lt(d, delta), mul(mul(d, d), 0.5), mul(sub(d, 0.5 * delta), delta)),
                    reduction)


_BCE_EPS = float(np.float32(1e-12))  # (torch's EPSILON, a float even in a float64 loss)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """On probabilities, as torch's: each log clamped at -100 (so a 0 or 1 gives a finite loss)."""
    if (amp.active() or ("",))[0] == "cuda":  # (torch's CUDA autocast refuses it too)
        fail("binary_cross_entropy is unsafe under autocast('cuda') (its probabilities would be rounded to the half "
             "type); give the logits to binary_cross_entropy_with_logits instead, or compute it outside the region")
    x, t = _pair("binary_cross_entropy", input, target, "same")
    return rounded_once(x, lambda x: _bce(x, to(t, x.dtype), weight, reduction))  # (a half type's in float32:
                                                                                   # its 1e-12 is not 0)


def _bce(x, t, weight, reduction):
    xd, td = detach(x), detach(t)
    lx = maximum(log(xd), as_tensor(-100.0, x.dtype))
    l1x = maximum(log(sub(1.0, xd)), as_tensor(-100.0, x.dtype))
    # torch's gradient in x, (x - t) / max(x (1 - x), 1e-12), finite at 0 and 1 where the logs are not
    slope = div(sub(xd, td), maximum(mul(xd, sub(1.0, xd)), as_tensor(_BCE_EPS, x.dtype)))
    loss = add(neg(add(mul(t, lx), mul(sub(1.0, t), l1x))), mul(sub(x, xd), slope))
    if weight is not None:
        loss = mul(loss, weight)
    return _reduced("binary_cross_entropy", loss, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                                     pos_weight=None):
    """torch's: (1 - t) x - (1 + (pw - 1) t) logsigmoid(x), rounded where torch's in-place steps
    round: into the target's type, logsigmoid in the input's."""
    x, t = _pair("binary_cross_entropy_with_logits", input, target, "own")
    dt = t.dtype
    ls = logsigmoid(x)
    if pos_weight is not None:
        ls = mul(add(mul(sub(pos_weight, 1.0), t), 1.0), ls)
    loss = sub(to(mul(sub(1.0, t), x), dt), ls)
    loss = loss if loss.dtype is dt else to(loss, dt)
    if weight is not None:
        loss = mul(loss, weight)
    return _reduced("binary_cross_entropy_with_logits", loss, reduction)


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    x, t = _pair("kl_div", input, target, "own")  # (each term in its own type, then their common one: torch's)
    if log_target:
        loss = mul(exp(t), sub(t, x))
    else:  # (torch's xlogy(t, t) - t x: 0 where the target is 0, NaN where it is below)
        zero = eq(t, 0.0)
        loss = sub(where(zero, 0.0, mul(t, log(where(zero, 1.0, t)))), mul(t, x))
    if reduction == "batchmean":
        return div(_sum(loss), x.shape[0] if x.ndim else 1)
    return _reduced("kl_div", loss, reduction)

