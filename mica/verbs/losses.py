"""torch.nn.functional's margin, embedding and likelihood losses, each torch's formula written with
the verbs (so their gradients are the verbs'): margin_ranking_loss, hinge_embedding_loss,
soft_margin_loss, cosine_embedding_loss, triplet_margin_loss, gaussian_nll_loss, poisson_nll_loss,
multilabel_soft_margin_loss, multi_margin_loss."""
import math

from .. import amp, dtypes
from ..tensor import fail
from .activations import _reduced, log1p, logsigmoid, pairwise_distance
from .core import add, as_tensor, clamp, detach, eq, exp, le, log, minimum, mul, ne, neg, sqrt, sub, to, where
from .core import sum as _sum, zeros_like
from .shape import expand, reshape, unsqueeze

__all__ = ["margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss", "cosine_embedding_loss",
           "triplet_margin_loss", "gaussian_nll_loss", "poisson_nll_loss", "multilabel_soft_margin_loss",
           "multi_margin_loss"]


def _float(verb, x):
    """x as a floating Tensor (an integer one refused), in float32 where it is half and `verb` is on
    autocast's float32 list (amp.float32)."""
    t = as_tensor(x)
    if t.dtype.kind != "float":
        fail(f"{verb}: takes floating tensors, got {t.value.spec!r}")
    return amp.float32(verb, t)[0]


def margin_ranking_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    """torch's: max(0, -target * (input1 - input2) + margin)."""
    a, b = _float("margin_ranking_loss", input1), _float("margin_ranking_loss", input2)
    y = to(as_tensor(target), a.dtype)
    return _reduced("margin_ranking_loss", clamp(add(mul(neg(y), sub(a, b)), margin), min=0), reduction)


def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction="mean"):
    """torch's: x where the target is 1, max(0, margin - x) where it is -1 (both where neither)."""
    x = _float("hinge_embedding_loss", input)
    y = as_tensor(target)
    kept = where(ne(y, -1), x, zeros_like(x))
    margined = where(ne(y, 1), clamp(sub(margin, x), min=0), zeros_like(x))
    return _reduced("hinge_embedding_loss", add(margined, kept), reduction)


def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """torch's: log(1 + exp(-target * input))."""
    x = _float("soft_margin_loss", input)
    return _reduced("soft_margin_loss", log1p(exp(mul(neg(x), to(as_tensor(target), x.dtype)))), reduction)


def cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    """torch's: 1 - cos(x1, x2) where the target is 1, max(0, cos - margin) where it is -1 (the
    squared norms each + 1e-12, as torch's EPSILON)."""
    a, b = _float("cosine_embedding_loss", input1), _float("cosine_embedding_loss", input2)
    if a.shape != b.shape or a.ndim not in (1, 2):
        fail(f"cosine_embedding_loss: takes two [N, D] (or [D]) inputs of one shape, got {a.value.spec!r} and "
             f"{b.value.spec!r}")
    dim = a.ndim - 1
    eps = 1e-12
    cos = _sum(mul(a, b), dim) / sqrt(mul(add(_sum(mul(a, a), dim), eps), add(_sum(mul(b, b), dim), eps)))
    y = as_tensor(target)
    pos = where(eq(y, 1), sub(1, cos), zeros_like(cos))
    neg_ = where(eq(y, -1), clamp(sub(cos, margin), min=0), zeros_like(cos))
    return _reduced("cosine_embedding_loss", add(pos, neg_), reduction)


def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False, size_average=None,
                        reduce=None, reduction="mean"):
    """torch's: max(0, margin + d(a, p) - d(a, n)), d pairwise_distance (swap: the nearer of
    d(a, n) and d(p, n))."""
    a, pos, neg_ = (_float("triplet_margin_loss", t) for t in (anchor, positive, negative))
    if not (a.ndim == pos.ndim == neg_.ndim):
        fail(f"triplet_margin_loss: anchor, positive and negative must have one number of dims, got "
             f"{a.value.spec!r}, {pos.value.spec!r} and {neg_.value.spec!r}")
    d_pos = pairwise_distance(a, pos, p, eps)
    d_neg = pairwise_distance(a, neg_, p, eps)
    if swap:
        d_neg = minimum(d_neg, pairwise_distance(pos, neg_, p, eps))
    return _reduced("triplet_margin_loss", clamp(sub(add(d_pos, margin), d_neg), min=0), reduction)


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """torch's: 0.5 * (log(var) + (input - target)^2 / var) (+ 0.5 log(2 pi) with full), var clamped
    to eps without changing its gradient (torch clamps a clone under no_grad); var of input's shape,
    or of its shape without the last dim, or with 1 there."""
    x, t = _float("gaussian_nll_loss", input), _float("gaussian_nll_loss", target)
    v = _float("gaussian_nll_loss", var)
    if v.shape != x.shape:
        if tuple(x.shape[:-1]) == tuple(v.shape):
            v = unsqueeze(v, -1)
        elif not (tuple(x.shape[:-1]) == tuple(v.shape[:-1]) and v.shape[-1] == 1):
            fail(f"gaussian_nll_loss: var is of incorrect size: {v.value.spec!r} for input {x.value.spec!r} (give "
                 "input's shape, its shape without the last dim, or with 1 there)")
    if reduction not in ("mean", "sum", "none"):
        fail(f"gaussian_nll_loss: {reduction!r} is not a valid value for reduction")
    v = add(v, detach(sub(clamp(v, min=eps), v)))
    loss = mul(add(log(v), sub(x, t) ** 2 / v), 0.5)
    if full:
        loss = add(loss, 0.5 * math.log(2 * math.pi))
    return _reduced("gaussian_nll_loss", loss, reduction)


def poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None,
                     reduction="mean"):
    """torch's: exp(input) - target * input (log_input), or input - target * log(input + eps); with
    full, Stirling's term where the target is above 1."""
    x = _float("poisson_nll_loss", input)
    t = to(as_tensor(target), x.dtype)
    loss = sub(exp(x), mul(t, x)) if log_input else sub(x, mul(t, log(add(x, eps))))
    if full:  # (the term's log is taken of 2 where the target is at most 1, and the term is 0 there)
        small = le(t, 1)
        safe = where(small, expand(as_tensor(2.0, x.dtype), t.shape), t)
        stirling = add(sub(mul(safe, log(safe)), safe), mul(log(mul(safe, 2 * math.pi)), 0.5))
        loss = add(loss, where(small, zeros_like(stirling), stirling))
    return _reduced("poisson_nll_loss", loss, reduction)


def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """torch's: -(y log sigmoid(x) + (1 - y) log sigmoid(-x)), weighted, averaged over the classes."""
    x = _float("multilabel_soft_margin_loss", input)
    y = to(as_tensor(target), x.dtype)
    loss = neg(add(mul(y, logsigmoid(x)), mul(sub(1, y), logsigmoid(neg(x)))))
    if weight is not None:
        loss = mul(loss, to(as_tensor(weight), x.dtype))
    loss = _sum(loss, x.ndim - 1) / x.shape[-1]
    return _reduced("multilabel_soft_margin_loss", loss, reduction)


def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None, reduction="mean"):
    """torch's: for each sample, the sum over the other classes j of max(0, margin - x[y] + x[j])^p
    (times weight[y]), over the class count."""
    from .positions import gather, index_select

    x = _float("multi_margin_loss", input)
    if p not in (1, 2):
        fail(f"multi_margin_loss: only p == 1 and p == 2 supported (as torch's), got {p!r}")
    x2 = reshape(x, (1, -1)) if x.ndim == 1 else x
    if x2.ndim != 2:
        fail(f"multi_margin_loss: input must be [N, C] or [C], got {x.value.spec!r}")
    y = reshape(to(as_tensor(target), dtypes.int64), (-1, 1))
    picked = gather(x2, 1, y)
    z = clamp(add(sub(margin, picked), x2), min=0)
    if p == 2:
        z = mul(z, z)
    if weight is not None:
        z = mul(z, reshape(index_select(to(as_tensor(weight), x.dtype), 0, reshape(y, (-1,))), (-1, 1)))
    from .core import arange

    others = ne(reshape(arange(x2.shape[1]), (1, -1)), y)
    loss = _sum(where(others, z, zeros_like(z)), 1) / x2.shape[1]
    if x.ndim == 1:
        loss = reshape(loss, ())
    return _reduced("multi_margin_loss", loss, reduction)
