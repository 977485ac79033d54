"""Verbs of torch.nn.functional: products, normalizations, softmax, losses, attention, dropout."""
import math
import numbers

import numpy as np

from .. import amp, dtypes
from ..errors import TraceError
from ..ops.elementwise import broadcast_shapes
from ..ops.philox import threshold
from ..tensor import Tensor, current, emit, fail, takes_axis, user_location
from .core import (  # noqa: F401
    _taken_along, add, as_tensor, gelu, is_scalar, mul, relu, result_type, sigmoid, silu, tanh, to, where, written,
)
from .core import sum as _sum
from .shape import expand, reshape, transpose, unsqueeze, squeeze


def matmul(input, other):
    """PyTorch's matmul: 1-d operands are promoted and squeezed, batch dims broadcast."""
    a, b = amp.lower("matmul", as_tensor(input), as_tensor(other))
    return _matmul_nd("matmul", a, b)


def _matmul_nd(verb, a, b, wide=False):
    """matmul of tensors as they are (autocast done); `wide`: a product of half operands kept in
    float32, its sums unrounded, for a verb that adds to it and rounds once (linear's bias)."""
    if a.ndim == 0 or b.ndim == 0:
        fail(f"{verb}: both operands need at least 1 dim, got {a.value.spec!r} and {b.value.spec!r}")
    if a.dtype is not b.dtype:
        fail(f"{verb}: operands must have one element type, got {a.value.spec!r} and {b.value.spec!r}")
    if a.ndim == 1 and b.ndim == 1:
        if a.shape != b.shape:
            fail(f"{verb}: vectors {a.value.spec!r} and {b.value.spec!r} differ in length")
        return reshape(_matmul(reshape(a, (1, -1)), reshape(b, (-1, 1)), wide), ())
    inner = a.shape[-1], b.shape[-2] if b.ndim > 1 else b.shape[0]
    if inner[0] != inner[1]:  # (the operands as given, before a 1-d one is promoted)
        fail(f"{verb}: cannot multiply {a.value.spec!r} by {b.value.spec!r}: inner sizes {inner[0]} and {inner[1]} "
             "differ")
    if a.ndim == 1:
        return squeeze(_matmul_nd(verb, unsqueeze(a, 0), b, wide), -2)
    if b.ndim == 1:
        return squeeze(_matmul_nd(verb, a, unsqueeze(b, -1), wide), -1)
    if b.ndim == 2 and a.ndim > 2:
        # [..., M, K] @ [K, N]: fold the batch into rows, as PyTorch does, so it stays one product.
        out = _matmul(reshape(a, (-1, a.shape[-1])), b, wide)
        return reshape(out, a.shape[:-1] + (b.shape[-1],))
    batch = broadcast_shapes(verb, a.shape[:-2], b.shape[:-2])
    a = expand(a, batch + a.shape[-2:])
    b = expand(b, batch + b.shape[-2:])
    return _matmul(a, b, wide)


def _matmul(a, b, wide=False):
    """The product primitive of two operands of one type (`wide`: half operands' product kept in
    float32); an integer product (which the kernels do not take) as torch computes it, exactly and
    wrapping: the products summed over the shared dim."""
    if a.dtype.kind == "int":
        return _sum(mul(unsqueeze(a, -1), unsqueeze(b, -3)), -2, dtype=a.dtype)
    if wide and a.dtype in dtypes.HALF:
        return emit("matmul", [a, b], dtype=dtypes.float32)
    return emit("matmul", [a, b])


def einsum(equation, *operands):
    """torch.einsum: each operand's dims named by letters (`...` for the leading rest); the output's
    letters given after `->`, else every letter named once, in alphabetical order. Operands are taken
    left to right, two at a time, as one batched matmul each where a letter is summed, else a product
    (as torch's: autocast casts the matmuls only; a letter in one operand only, and not kept, is
    summed first). A letter repeated within an operand takes its diagonal first."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str) or not operands:
        fail("einsum: give an equation such as 'ij,jk->ik' and its operands")
    ts = [as_tensor(t) for t in operands]
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ts):
        fail(f"einsum: {equation!r} names {len(terms)} operands, {len(ts)} were given")
    ell = max((t.ndim - (len(term) - 3) for term, t in zip(terms, ts) if "..." in term), default=0)
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq][:ell]
    named, written = [], ""  # (the operands' letters after any diagonal; every letter as written)
    for term, t in zip(terms, ts):
        if term.count("...") > 1 or not all(c.isalpha() for c in term.replace("...", "")):
            fail(f"einsum: cannot read the operand {term!r} of {equation!r}: letters and one '...'")
        if "..." in term:
            k = t.ndim - (len(term) - 3)
            term = term.replace("...", "".join(spare[ell - k:]) if k > 0 else "")
        if len(term) != t.ndim:
            fail(f"einsum: operand {term!r} names {len(term)} dims, the tensor {t.value.spec!r} has {t.ndim}")
        written += term
        while len(set(term)) != len(term):  # (a letter twice in one operand: its diagonal, as torch's)
            c = next(c for c in term if term.count(c) > 1)
            p, q = term.index(c), term.index(c, term.index(c) + 1)
            if t.shape[p] != t.shape[q]:
                fail(f"einsum: letter {c!r} stands for sizes {t.shape[p]} and {t.shape[q]} in one operand of "
                     f"{equation!r}; a diagonal needs them equal")
            from .positions import diagonal

            t = diagonal(t, 0, p, q)
            term = "".join(x for k, x in enumerate(term) if k not in (p, q)) + c
        ts[len(named)] = t
        named.append(term)
    if arrow:
        out = out.replace("...", "".join(spare))
        if not all(c.isalpha() for c in out) or len(set(out)) != len(out) or any(c not in "".join(named) for c in out):
            fail(f"einsum: cannot read the output {out!r} of {equation!r}: letters of the operands, each once")
    else:
        counts = {c: written.count(c) for c in set(written)}  # (torch's: the letters written once, "ii" a trace)
        out = "".join(spare) + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in spare))
    sizes = {}
    for term, t in zip(named, ts):
        for c, n in zip(term, t.shape):
            if sizes.setdefault(c, n) != n and n != 1 and sizes[c] != 1:
                fail(f"einsum: letter {c!r} stands for sizes {sizes[c]} and {n} in {equation!r}")
            sizes[c] = max(sizes[c], n)
    x, xs = ts[0], named[0]
    for i in range(1, len(ts)):
        later = out + "".join(named[i + 1:])
        x, xs = _contract(x, xs, ts[i], named[i], later, sizes)
    gone = [k for k, c in enumerate(xs) if c not in out]
    if gone:
        x = _sum(x, gone)
        xs = "".join(c for c in xs if c in out)
    return x.permute(*[xs.index(c) for c in out]) if xs != out else x


def _contract(a, sa, b, sb, later, sizes):
    """a (letters sa) with b (letters sb), keeping the letters `later` needs: a batched matmul."""
    own_a = [k for k, c in enumerate(sa) if c not in sb and c not in later]
    if own_a:
        a, sa = _sum(a, own_a), "".join(c for c in sa if c in sb or c in later)
    own_b = [k for k, c in enumerate(sb) if c not in sa and c not in later]
    if own_b:
        b, sb = _sum(b, own_b), "".join(c for c in sb if c in sa or c in later)
    batch = [c for c in sa if c in sb and c in later]
    summed = [c for c in sa if c in sb and c not in later]
    left = [c for c in sa if c not in sb]
    right = [c for c in sb if c not in sa]
    a = a.permute(*[sa.index(c) for c in batch + left + summed])
    b = b.permute(*[sb.index(c) for c in batch + summed + right])
    n = lambda cs: math.prod(sizes[c] for c in cs)  # noqa: E731
    a = expand(a, tuple(sizes[c] for c in batch + left + summed))  # (a letter of size 1 broadcasts)
    b = expand(b, tuple(sizes[c] for c in batch + summed + right))
    if summed:
        y = matmul(reshape(a, (n(batch), n(left), n(summed))), reshape(b, (n(batch), n(summed), n(right))))
    else:  # (nothing summed: torch's einsum multiplies, so autocast leaves it in its type, as torch's)
        y = reshape(a, (n(batch), n(left), 1)) * reshape(b, (n(batch), 1, n(right)))
    return reshape(y, tuple(sizes[c] for c in batch + left + right)), "".join(batch + left + right)


def mm(input, mat2):
    """torch.mm: a [n, m] by [m, p] product, 2-d only (matmul broadcasts)."""
    a, b = as_tensor(input), as_tensor(mat2)
    if a.ndim != 2 or b.ndim != 2:
        fail(f"mm: both operands must be 2-d, got {a.value.spec!r} and {b.value.spec!r}; matmul takes other ranks")
    return matmul(a, b)


def bmm(input, mat2):
    """torch.bmm: [b, n, m] by [b, m, p], 3-d with one batch size (matmul broadcasts)."""
    return _bmm(input, mat2)


def _bmm(input, mat2, wide=False):
    a, b = as_tensor(input), as_tensor(mat2)
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0]:
        fail(f"bmm: the operands must be 3-d with one batch size, got {a.value.spec!r} and {b.value.spec!r}; "
             "matmul broadcasts batches")
    return _matmul_nd("bmm", *amp.lower("matmul", a, b), wide)


def _plus_scaled(verb, input, product, beta, alpha, half=None):
    """torch's addmm family: beta * input + alpha * product, input broadcast to the product's shape;
    beta 0 ignores input (its NaN and inf too), as torch's. With `half`, input and product (of half
    operands: `_matmul(..., wide=True)`) come in float32: the sum is rounded once to `half`, as torch's
    half kernels store a GEMM's beta * C + alpha * AB."""
    if half is not None:
        return to(_plus_scaled(verb, input, product, beta, alpha), half)
    x = as_tensor(input)
    if is_scalar(alpha) and alpha == 0:  # (torch's: the product is not read, its inf and NaN neither)
        from .core import zeros_like

        product = zeros_like(product)
    out = product if is_scalar(alpha) and alpha in (0, 1) else mul(product, alpha)
    if broadcast_shapes(verb, x.shape, out.shape) != out.shape:
        fail(f"{verb}: input {x.value.spec!r} does not broadcast to the product's shape {list(out.shape)}")
    if is_scalar(beta) and beta == 0:
        return out
    return add(out, x if is_scalar(beta) and beta == 1 else mul(x, beta))


def _widened(input, operand):
    """(input, None), or for `input` and a product `operand` of one half type (as torch's addmm takes
    them) (input in float32, the half type): the product is then kept in float32 and the sum rounded
    once. (The input is cast first: the product's epilogue can then read it.)"""
    x = as_tensor(input)
    if operand.dtype in dtypes.HALF and x.dtype is operand.dtype:
        return to(x, dtypes.float32), x.dtype
    return x, None


def _need_ranks(verb, *pairs):
    for name, t, n in pairs:
        if t.ndim != n:
            fail(f"{verb}: {name} must be {n}-d, got {t.value.spec!r}")


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """torch.addmm: beta * input + alpha * (mat1 @ mat2) for 2-d mat1 and mat2 (under autocast
    all three in the half type, as torch's)."""
    input, mat1, mat2 = amp.lower("addmm", as_tensor(input), as_tensor(mat1), as_tensor(mat2))
    _need_ranks("addmm", ("mat1", mat1, 2), ("mat2", mat2, 2))
    x, half = _widened(input, mat1)
    return _plus_scaled("addmm", x, _matmul_nd("addmm", mat1, mat2, half is not None), beta, alpha, half)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """torch.baddbmm: beta * input + alpha * bmm(batch1, batch2)."""
    input, batch1, batch2 = amp.lower("baddbmm", as_tensor(input), as_tensor(batch1), as_tensor(batch2))
    x, half = _widened(input, batch1)
    return _plus_scaled("baddbmm", x, _bmm(batch1, batch2, half is not None), beta, alpha, half)


def addbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """torch.addbmm: beta * input + alpha * the sum over the batch of bmm(batch1, batch2)."""
    input, batch1, batch2 = amp.lower("addbmm", as_tensor(input), as_tensor(batch1), as_tensor(batch2))
    if input.dtype in dtypes.HALF and batch1.dtype is input.dtype and batch1.ndim == 3 and batch1.shape[0]:
        # torch's in a half type: an addmm per batch, each rounded once, beta on the first alone
        if batch2.ndim != 3 or batch2.shape[0] != batch1.shape[0]:
            fail(f"addbmm: batch1 {batch1.value.spec!r} and batch2 {batch2.value.spec!r} must be 3-d with one "
                 "batch size")
        out = input
        for b in range(batch1.shape[0]):
            out = addmm(out, batch1[b], batch2[b], beta=beta if b == 0 else 1, alpha=alpha)
        return out
    return _plus_scaled("addbmm", input, _sum(bmm(batch1, batch2), 0), beta, alpha)


def _product(verb, a, b, wide=False):
    """a @ b for the products torch does not autocast (dot, mv): the operands of one type (`wide`:
    half operands' sums kept in float32)."""
    a, b = as_tensor(a), as_tensor(b)
    if a.dtype is not b.dtype:
        fail(f"{verb}: operands must have one element type, got {a.value.spec!r} and {b.value.spec!r}")
    return _matmul(a, b, wide)


def dot(input, tensor):
    """torch.dot: two 1-d tensors of one length and one type, their inner product."""
    a, b = as_tensor(input), as_tensor(tensor)
    _need_ranks("dot", ("input", a, 1), ("tensor", b, 1))
    if a.shape != b.shape:
        fail(f"dot: the vectors {a.value.spec!r} and {b.value.spec!r} differ in length")
    return reshape(_product("dot", reshape(a, (1, -1)), reshape(b, (-1, 1))), ())


def mv(input, vec):
    """torch.mv: a [n, m] matrix by an [m] vector."""
    return _mv(input, vec)


def _mv(input, vec, wide=False):
    a, v = as_tensor(input), as_tensor(vec)
    _need_ranks("mv", ("input", a, 2), ("vec", v, 1))
    if a.shape[1] != v.shape[0]:
        fail(f"mv: cannot multiply {a.value.spec!r} by {v.value.spec!r}: inner sizes {a.shape[1]} and {v.shape[0]} "
             "differ")
    return reshape(_product("mv", a, reshape(v, (-1, 1)), wide), (a.shape[0],))


def addmv(input, mat, vec, *, beta=1, alpha=1):
    """torch.addmv: beta * input + alpha * mv(mat, vec) (in a half type rounded once, as torch's)."""
    x, half = _widened(input, as_tensor(mat))
    return _plus_scaled("addmv", x, _mv(mat, vec, half is not None), beta, alpha, half)


def linear(input, weight, bias=None):
    """y = x @ weight.T + bias, with weight [out_features, in_features]."""
    input, weight = amp.lower("linear", as_tensor(input), as_tensor(weight))
    if bias is not None:
        (bias,) = amp.lower("linear", as_tensor(bias))
    if weight.ndim not in (1, 2):
        fail(f"linear: the weight must be [out_features, in_features] (or 1-d), got {weight.value.spec!r}")
    if input.ndim == 0 or input.shape[-1] != weight.shape[-1]:
        fail(f"linear: input {input.value.spec!r} needs {weight.shape[-1]} features in its last dim, as weight "
             f"{weight.value.spec!r} takes (in_features {weight.shape[-1]})")
    # (a half bias joins the product's float32 sums and is rounded once, as torch's addmm)
    b, half = _widened(bias, input) if bias is not None else (None, None)
    y = _matmul_nd("linear", input, transpose(weight, -1, -2) if weight.ndim == 2 else weight, half is not None)
    if half is not None:
        return to(add(y, b), half)
    return y if bias is None else add(y, bias)


def _floating_input(x, verb):
    x = as_tensor(x, verb=verb)
    if x.dtype.kind != "float":
        fail(f"{verb}: needs a floating tensor, got {x.value.spec!r}; cast with .float() first")
    return x


def _rowwise(op, input, dim, dtype):
    x = as_tensor(input)
    if dtype is not None:
        x = to(x, dtype)
    else:  # (a verb given an explicit dtype is not autocast, as in PyTorch)
        (x,) = amp.float32(op, x)
    x = _floating_input(x, op)
    if dim is None:
        raise TraceError(f"{op}: give the dim to normalize over (PyTorch's implicit dim is deprecated)",
                         user_location())
    from .core import canon_dim

    if x.ndim == 0:
        canon_dim(dim, 0, op)
        return emit(op, [reshape(x, (1,))]).reshape(())

    d = canon_dim(dim, x.ndim, op)
    if d == x.ndim - 1:
        return emit(op, [x])
    return transpose(emit(op, [transpose(x, d, -1)]), d, -1)


@takes_axis
def softmax(input, dim=None, dtype=None):
    return _rowwise("softmax", input, dim, dtype)


@takes_axis
def softmin(input, dim=None, dtype=None):
    """softmax of -input, as torch's."""
    from .core import neg

    return _rowwise("softmax", neg(as_tensor(input)), dim, dtype)


@takes_axis
def log_softmax(input, dim=None, dtype=None):
    return _rowwise("log_softmax", input, dim, dtype)


def _normalized(x, normalized_shape, verb):
    if isinstance(normalized_shape, numbers.Integral):
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(int(s) for s in normalized_shape)
    k = len(normalized_shape)
    if k == 0 or k > x.ndim or x.shape[x.ndim - k:] != normalized_shape:
        fail(f"{verb}: normalized_shape {list(normalized_shape)} does not match the trailing dims "
             f"of {x.value.spec!r}")
    return k


def _mixed_params(x, params):
    """PyTorch's mixed-type norms: a half-type input with float32 weights (a norm after a product
    under autocast, or a bfloat16 model's float32 norm weights) is normalized in float32 and the
    result rounded once to the input's type. (x widened, the norm, y rounded), where it applies."""
    given = [as_tensor(p) for p in params if p is not None]
    if x.dtype in dtypes.HALF and given and all(p.dtype is dtypes.float32 for p in given):
        return to(x, dtypes.float32), x.dtype
    return x, None


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    x = _floating_input(input, "layer_norm")
    x, weight, bias = amp.float32("layer_norm", x, weight, bias)
    k = _normalized(x, normalized_shape, "layer_norm")
    x, back = _mixed_params(x, (weight, bias))
    params = [as_tensor(p) for p in (weight, bias) if p is not None]
    y, _mean, _rstd = emit("layer_norm", [x, *params], eps=float(eps), ndims=k,
                           has_weight=weight is not None, has_bias=bias is not None)
    return to(y, back) if back is not None else y


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.group_norm: input [N, C, *] normalized over each group of C / num_groups
    channels (and every position), then each channel's weight and bias; a half input computes in
    float32 and is rounded once, as torch's kernel (its opmath)."""
    x = _floating_input(input, "group_norm")
    x, weight, bias = amp.float32("group_norm", x, weight, bias)
    if x.ndim < 2:
        fail(f"group_norm: input must be [N, C, *], got {x.value.spec!r}")
    N, C = x.shape[0], x.shape[1]
    if not isinstance(num_groups, int) or isinstance(num_groups, bool) or num_groups < 1 or C % num_groups:
        fail(f"group_norm: {C} channels do not divide into num_groups={num_groups!r} groups; give a divisor of {C}")
    _per_channel("group_norm", C, (("weight", weight), ("bias", bias)))
    back = x.dtype if x.dtype in dtypes.HALF else None
    y = to(x, dtypes.float32) if back else x
    y = reshape(layer_norm(reshape(y, (N, num_groups, -1)), (math.prod(x.shape[1:]) // num_groups,), eps=eps),
                x.shape)
    y = _channel_affine(y, weight, bias)
    return to(y, back) if back else y


def _per_channel(verb, C, named):
    """Each (name, tensor or None) of `named` a [C] vector, one value per channel, or verb's sentence."""
    for name, p in named:
        if p is not None and (as_tensor(p).ndim != 1 or as_tensor(p).shape[0] != C):
            fail(f"{verb}: {name} must be [{C}] (one per channel), got {as_tensor(p).value.spec!r}")


def _channel_affine(y, weight, bias):
    """y [N, C, *] times each channel's weight, plus its bias (either None: left out), in y's type."""
    at = (y.shape[1],) + (1,) * (y.ndim - 2)
    if weight is not None:
        y = mul(y, reshape(to(as_tensor(weight), y.dtype), at))
    if bias is not None:
        y = add(y, reshape(to(as_tensor(bias), y.dtype), at))
    return y


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """torch.nn.functional.batch_norm: input [N, C, *] normalized per channel over the batch and
    every position: in training with the batch's statistics, moving running_mean and running_var in
    place by `momentum` (the variance unbiased, as torch's: momentum * new + (1 - momentum) * old);
    otherwise with the running ones. A half input computes in float32 and is rounded once."""
    from .core import detach, mean as _mean, rsqrt, square

    x = _floating_input(input, "batch_norm")
    if x.ndim < 2:
        fail(f"batch_norm: input must be [N, C, *], got {x.value.spec!r}")
    C = x.shape[1]
    stats = [as_tensor(t) if t is not None else None for t in (running_mean, running_var)]
    _per_channel("batch_norm", C, (("running_mean", stats[0]), ("running_var", stats[1]), ("weight", weight),
                                   ("bias", bias)))
    if not training and (stats[0] is None or stats[1] is None):
        fail("batch_norm: with training=False it normalizes by running_mean and running_var, and one is None; give "
             "both, or training=True")
    back = x.dtype if x.dtype in dtypes.HALF else None
    y = to(x, dtypes.float32) if back else x
    dims = (0,) + tuple(range(2, x.ndim))
    at = (1, C) + (1,) * (x.ndim - 2)
    if training:
        n = math.prod(x.shape) // C
        if n <= 1:
            fail(f"batch_norm: training needs more than 1 value per channel, got input {x.value.spec!r} (torch "
                 "refuses it too); give a batch of 2 or more, or call model.eval()")
        mu = _mean(y, dims)
        spread = _sum(square(y - reshape(mu, at)), dims)
        var = spread / n
        for kept, new in ((stats[0], mu), (stats[1], spread / (n - 1))):  # (the running ones, in place: torch's)
            if kept is not None:
                kept.copy_(momentum * to(detach(new), kept.dtype) + (1 - momentum) * kept)
    else:
        mu, var = (to(t, y.dtype) for t in stats)
    y = _channel_affine((y - reshape(mu, at)) * reshape(rsqrt(var + eps), at), weight, bias)
    return to(y, back) if back else y


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    """torch.nn.functional.instance_norm: input [N, C, *] normalized per sample and channel over its
    positions (group_norm with a group per channel), then each channel's weight and bias; given
    running statistics, use_input_stats moves them in place by the batch's mean of the instances'
    (variance unbiased, as torch's), and use_input_stats=False normalizes by them instead."""
    from .core import detach, mean as _mean, rsqrt, square

    x = _floating_input(input, "instance_norm")
    if x.ndim < 3:
        fail(f"instance_norm: input must be [N, C, *] with at least one dim of positions, got {x.value.spec!r}")
    C, n = x.shape[1], math.prod(x.shape[2:])
    stats = [as_tensor(t) if t is not None else None for t in (running_mean, running_var)]
    _per_channel("instance_norm", C, (("running_mean", stats[0]), ("running_var", stats[1]), ("weight", weight),
                                      ("bias", bias)))
    at = (1, C) + (1,) * (x.ndim - 2)
    if not use_input_stats:
        if stats[0] is None or stats[1] is None:
            fail("instance_norm: with use_input_stats=False it normalizes by running_mean and running_var, and one is "
                 "None; give both")
        mu, var = (to(t, x.dtype) for t in stats)
        return _channel_affine((x - reshape(mu, at)) * reshape(rsqrt(var + eps), at), weight, bias)
    if n <= 1:
        fail(f"instance_norm: expected more than 1 spatial element when training, got input {x.value.spec!r} (torch "
             "refuses it too)")
    if stats[0] is not None or stats[1] is not None:  # (the running ones, in place: torch's)
        y = to(x, dtypes.float32) if x.dtype in dtypes.HALF else x
        dims = tuple(range(2, x.ndim))
        mu = _mean(y, dims)
        spread = _sum(square(y - reshape(mu, mu.shape + (1,) * len(dims))), dims)
        for kept, new in ((stats[0], mu), (stats[1], spread / (n - 1))):
            if kept is not None:
                kept.copy_(momentum * to(_mean(detach(new), 0), kept.dtype) + (1 - momentum) * kept)
    return group_norm(x, C, weight, bias, eps)


# eps=None: the machine epsilon of the type the norm computes in (PyTorch's opmath type: float32
# for the half types too)
_FINFO_EPS = {"float32": 2.0 ** -23, "float64": 2.0 ** -52, "bfloat16": 2.0 ** -23, "float16": 2.0 ** -23}


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """RMS norm; eps=None means the machine epsilon of the type it computes in, as in PyTorch
    (float32's for float32 and the half types, which compute in float32)."""
    x = _floating_input(input, "rms_norm")
    x, weight = amp.float32("rms_norm", x, weight)
    k = _normalized(x, normalized_shape, "rms_norm")
    if eps is None:
        eps = _FINFO_EPS[x.dtype.name]
    x, back = _mixed_params(x, (weight,))
    params = [as_tensor(weight)] if weight is not None else []
    y, _rstd = emit("rms_norm", [x, *params], eps=float(eps), ndims=k, has_weight=weight is not None)
    return to(y, back) if back is not None else y


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise TraceError("embedding: max_norm, scale_grad_by_freq and sparse=True are not supported",
                         user_location())
    idx = as_tensor(input)
    if idx.dtype.kind != "int":
        fail(f"embedding: indices must be integers, got {idx.value.spec!r}")
    if idx.dtype is not dtypes.int64:  # (the kernels read int64 indices; PyTorch takes int32 ones too)
        idx = to(idx, dtypes.int64)
    w = as_tensor(weight)
    if padding_idx is None:
        return emit("embedding", [idx, w])
    rows = w.shape[0] if w.ndim else 0  # (torch's: that row's gradient is 0; its values are read as any other's)
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, (int, np.integer)) or \
            not -rows <= padding_idx < rows:
        fail(f"embedding: padding_idx {padding_idx!r} is not a row of the weight {w.value.spec!r}")
    from .core import detach, eq

    out = emit("embedding", [idx, w])  # (the lookups of that row pass no gradient: the table is not copied)
    return where(unsqueeze(eq(idx, int(padding_idx) % rows), -1), detach(out), out)


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False, mode="mean",
                  sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """torch.nn.functional.embedding_bag: each bag's rows of `weight` summed, averaged or maxed (the
    torchtext classification tutorial's). Bags are input's rows (2-d input), or the runs of a 1-d input
    that `offsets` start (a traced input: each position's bag found by comparing with the offsets, its
    rows added into the bag's). padding_idx's rows count in no bag; an empty bag gives zeros, as
    torch's; per_sample_weights (mode "sum") weight each row."""
    from .core import amax, arange, clamp, div, eq, full, le, ne, zeros
    from .core import sum as _total
    from .positions import index_add

    if max_norm is not None or scale_grad_by_freq or sparse:
        raise TraceError("embedding_bag: max_norm, scale_grad_by_freq and sparse=True are not supported",
                         user_location())
    if mode not in ("sum", "mean", "max"):
        fail(f"embedding_bag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
    idx, w = as_tensor(input), as_tensor(weight)
    if per_sample_weights is not None and mode != "sum":
        fail(f"embedding_bag: per_sample_weights is only supported for mode='sum' (got mode={mode!r}), as torch's")
    rows = embedding(idx, w)
    keep = ne(idx, int(padding_idx) % w.shape[0]) if padding_idx is not None else None
    scale = None if per_sample_weights is None else to(as_tensor(per_sample_weights), rows.dtype)
    if keep is not None:
        kept = to(keep, rows.dtype)
        scale = kept if scale is None else mul(scale, kept)
    if idx.ndim == 2:
        if offsets is not None:
            fail("embedding_bag: with a 2-d input each row is a bag; offsets must be None (as torch's)")
        if mode == "max":
            if keep is not None:
                rows = where(unsqueeze(keep, -1), rows, full(rows.shape, float("-inf"), dtype=rows.dtype))
            top = amax(rows, 1)
            return where(eq(top, float("-inf")), zeros(top.shape, dtype=top.dtype), top) if keep is not None else top
        summed = _total(rows if scale is None else mul(rows, unsqueeze(scale, -1)), 1)
        if mode == "sum":
            return summed
        count = _total(scale, 1) if keep is not None else full((idx.shape[0],), float(idx.shape[1]), dtype=rows.dtype)
        return div(summed, unsqueeze(clamp(count, min=1.0), -1))
    if idx.ndim != 1 or offsets is None:
        fail(f"embedding_bag: takes a 2-d input of bags, or a 1-d input with offsets, got {idx.value.spec!r}")
    if mode == "max":
        fail("embedding_bag: mode='max' with offsets is not one Mica has; give a 2-d input of equal bags, or mode "
             "'sum' or 'mean'")
    starts = to(as_tensor(offsets), dtypes.int64)
    if starts.ndim != 1:
        fail(f"embedding_bag: offsets must be 1-d, got {starts.value.spec!r}")
    if include_last_offset:
        starts = starts[:-1]
    bags = starts.shape[0]
    n = idx.shape[0]
    bag = _total(to(le(reshape(starts, (1, bags)), reshape(arange(n), (n, 1))), dtypes.int64), 1) - 1
    bag = clamp(bag, min=0)
    weighted = rows if scale is None else mul(rows, unsqueeze(scale, -1))
    summed = index_add(zeros((bags, w.shape[1]), dtype=rows.dtype), 0, bag, weighted)
    if mode == "sum":
        return summed
    ones_ = full((n,), 1.0, dtype=rows.dtype) if scale is None else scale
    count = index_add(zeros((bags,), dtype=rows.dtype), 0, bag, ones_)
    return div(summed, unsqueeze(clamp(count, min=1.0), -1))


def _class_rows(verb, x, t, reduction):
    """Logits or log-probabilities `x` of shape (N, C), (C,) or (N, C, d1, ...) and class indices `t`
    of shape (N,), () or (N, d1, ...), as torch takes them: returned as rows (M, C) and targets (M,),
    with the shape a reduction='none' result has."""
    if t.dtype.kind != "int":
        fail(f"{verb}: targets must be class indices (integers), got {t.value.spec!r}")
    if reduction not in ("mean", "sum", "none"):
        fail(f"{verb}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if x.ndim == 0:
        fail(f"{verb}: the input needs a class dim, (C,), (N, C) or (N, C, d1, ...), got {x.value.spec!r}")
    if x.ndim == 1:
        if t.ndim != 0:
            fail(f"{verb}: input {x.value.spec!r} needs a 0-d target, got {t.value.spec!r}")
        return reshape(x, (1, -1)), reshape(t, (1,)), ()
    t_shape = (x.shape[0],) + x.shape[2:]
    if t.shape != t_shape:
        fail(f"{verb}: input {x.value.spec!r} needs targets of shape {list(t_shape)}, got {t.value.spec!r}")
    if x.ndim > 2:
        perm = (0,) + tuple(range(2, x.ndim)) + (1,)
        x = reshape(x.permute(*perm), (-1, x.shape[1]))
    return x, reshape(t, (-1,)), t_shape


def _class_index(verb, ignore_index):
    """ignore_index as an int; a float or anything else is refused, as torch's argument must be an int."""
    if not isinstance(ignore_index, (numbers.Integral, np.integer)):
        fail(f"{verb}: ignore_index must be an int (a class index, or -100 for none), got {ignore_index!r}")
    return int(ignore_index)


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    """Cross-entropy from logits and class indices: input (N, C), (C,) or (N, C, d1, ...);
    label_smoothing mixes in the mean over classes of -log p, as torch's does."""
    (x,) = amp.float32("cross_entropy", _floating_input(input, "cross_entropy"))
    t = as_tensor(target)
    if weight is not None or size_average is not None or reduce is not None:
        raise TraceError("cross_entropy: class weights and the legacy size_average/reduce flags are not supported",
                         user_location())
    label_smoothing = _probability("cross_entropy", "label_smoothing", label_smoothing)
    if t.dtype.kind == "float":
        if ignore_index != -100:
            fail("cross_entropy: ignore_index applies to class indices, not to a float target of class probabilities")
        return _cross_entropy_with_probabilities(x, t, reduction, label_smoothing)
    x, t, t_shape = _class_rows("cross_entropy", x, t, reduction)
    losses, _lse = emit("cross_entropy", [x, to(t, dtypes.int64)], ignore_index=_class_index("cross_entropy",
                                                                                           ignore_index))
    kept = t != ignore_index
    valid = to(kept, x.dtype)
    if label_smoothing:  # torch's: (1 - e) * nll + e / C * (-sum over classes of log p), ignored rows 0
        # (a where, not a product with 0: an ignored row's -inf logit, or the mean's 1/0 when every
        # row is ignored, gives that row 0 and its gradient 0, as torch's, not NaN)
        smooth = where(kept, -_sum(log_softmax(x, 1), 1), 0.0)
        losses = losses * (1.0 - label_smoothing) + smooth * (label_smoothing / x.shape[1])
    return _reduce_rows(losses, valid, t_shape, reduction)


def _cross_entropy_with_probabilities(x, p, reduction, label_smoothing):
    """torch's cross_entropy with a float target: class probabilities of the input's shape, the
    loss -sum over classes of p log softmax(x); the mean is over every position but the class dim."""
    if p.shape != x.shape:
        fail(f"cross_entropy: a float target holds class probabilities of the input's shape {x.value.spec!r}, got "
             f"{p.value.spec!r}; class indices are integers")
    if reduction not in ("mean", "sum", "none"):
        fail(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    dim = 1 if x.ndim > 1 else 0
    if p.dtype.kind != "float":
        p = to(p, x.dtype)  # (half logits and float32 probabilities: log_softmax in the half type, the rest
                            # float32, as torch's -(log_softmax(x) * p).sum())
    if label_smoothing:
        p = p * (1.0 - label_smoothing) + label_smoothing / x.shape[dim]
    losses = -_sum(log_softmax(x, dim) * p, dim)
    if reduction == "none":
        return losses
    total = _sum(losses)
    return total if reduction == "sum" else total / max(losses.numel(), 1)


def _reduce_rows(losses, valid, t_shape, reduction):
    if reduction == "none":
        return reshape(losses, t_shape)
    total = _sum(losses)
    return total if reduction == "sum" else total / _sum(valid)


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    """Negative log-likelihood of class indices from log-probabilities: input (N, C), (C,) or
    (N, C, d1, ...), as torch's. A target outside [0, C) that is not ignore_index stops the program
    with a sentence, as torch raises."""
    (x,) = amp.float32("nll_loss", _floating_input(input, "nll_loss"))
    t = as_tensor(target)
    if weight is not None or size_average is not None or reduce is not None:
        raise TraceError("nll_loss: class weights and the legacy size_average/reduce flags are not supported",
                         user_location())
    x, t, t_shape = _class_rows("nll_loss", x, t, reduction)
    t = emit("check_range", [to(t, dtypes.int64)], bound=x.shape[1], ignore_index=_class_index("nll_loss",
                                                                                               ignore_index))
    picked = -_taken_along(x, unsqueeze(t, 1), 1)  # (a where: -inf log-probabilities of other classes stay out)
    valid = t != ignore_index
    losses = where(valid, picked, 0.0)
    return _reduce_rows(losses, to(valid, x.dtype), t_shape, reduction)


def _probability(verb, name, p):
    """A dropout probability as a float, or the sentence torch's refusal says."""
    if isinstance(p, Tensor) or not isinstance(p, (numbers.Real, np.floating, np.integer)) or not 0.0 <= p <= 1.0:
        fail(f"{verb}: {name} must be a number in [0, 1], got {p!r}")
    return float(p)


def dropout(input, p=0.5, training=True, inplace=False):
    """Inverted dropout with a counter-based mask: keyed by the program's seed and offset, this
    call site's stream, and the element index (the same on every thread count and backend)."""
    x = _floating_input(input, "dropout")
    p = _probability("dropout", "probability", p)
    if not training or p == 0.0:
        return x
    if p == 1.0:
        y = x * 0.0
    else:
        ctx = current("dropout")
        y = emit("dropout", [x, ctx.rng()], p=float(p), stream=ctx.next_stream(), threshold=threshold(p))
    return written(x, y, inplace)


def uniform_draw(shape, dtype, verb):
    """Draws in [0, 1) of `shape` inside a trace (torch.rand's): the rand primitive, one stream per
    call site, keyed as dropout is by the run's seed and offset and the element's index (the same
    on every thread count and backend); 24 random bits each, made in float32 and rounded once to
    `dtype`."""
    from .core import zeros

    ctx = current(verb)
    return emit("rand", [zeros(shape, dtype=dtype), ctx.rng()], stream=ctx.next_stream())


def normal_draw(shape, dtype, verb):
    """Standard normal draws of `shape` inside a trace (torch.randn's), by Box and Muller's
    transform of two uniform draws: sqrt(-2 log(1 - u1)) cos(2 pi u2), in float32, rounded once."""
    from .core import cos, log, mul, rsub, sqrt, to

    u1, u2 = uniform_draw(shape, dtypes.float32, verb), uniform_draw(shape, dtypes.float32, verb)
    z = mul(sqrt(mul(log(rsub(u1, 1.0)), -2.0)), cos(mul(u2, 2 * math.pi)))
    return z if dtype is dtypes.float32 else to(z, dtype)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    """softmax(q @ k^T * scale [+ mask]) @ v, with PyTorch's signature and its top-left causal mask."""
    q, k, v = (_floating_input(t, "scaled_dot_product_attention") for t in (query, key, value))
    dropout_p = _probability("scaled_dot_product_attention", "dropout_p", dropout_p)
    q, k, v = amp.lower("scaled_dot_product_attention", q, k, v)
    if attn_mask is not None:
        (attn_mask,) = amp.lower("scaled_dot_product_attention", as_tensor(attn_mask))
    if enable_gqa:  # (grouped-query attention: each key/value head serves a run of consecutive query heads)
        from .shape import repeat_interleave

        if q.ndim < 3 or k.ndim < 3 or v.ndim < 3:
            fail("scaled_dot_product_attention: enable_gqa needs q, k and v of at least 3 dims ([..., heads, L, E])")
        if q.shape[-3] % k.shape[-3] or q.shape[-3] % v.shape[-3]:
            fail(f"scaled_dot_product_attention: enable_gqa: the {k.shape[-3]} key and {v.shape[-3]} value heads must "
                 f"each divide the {q.shape[-3]} query heads")
        k = repeat_interleave(k, q.shape[-3] // k.shape[-3], -3)
        v = repeat_interleave(v, q.shape[-3] // v.shape[-3], -3)
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        fail("scaled_dot_product_attention: q, k and v need at least 2 dims")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        fail(f"scaled_dot_product_attention: q {q.value.spec!r}, k {k.value.spec!r} and v {v.value.spec!r} "
             "must be [..., L, E], [..., S, E] and [..., S, Ev]")
    if attn_mask is not None and not (attn_mask.dtype is dtypes.bool_ or attn_mask.dtype.is_floating_point):
        fail(f"scaled_dot_product_attention: attn_mask must be bool (True keeps a score) or a floating type "
             f"(added to the scores), got {attn_mask.dtype.name}; for a mask of 0s and 1s write mask.bool()")
    if attn_mask is not None and is_causal and not (
            q.ndim == k.ndim == v.ndim == 4 and q.shape[:2] == k.shape[:2] == v.shape[:2]
            and v.shape[-1] == q.shape[-1] and not dropout_p):
        fail("scaled_dot_product_attention: attn_mask with is_causal=True is taken, as torch's CPU kernel takes it, "
             "only for 4-d q, k and v of one batch and head count, v's head dim q's, and no dropout; put the causal "
             "mask into attn_mask instead (mask & torch.ones(L, S, dtype=torch.bool).tril())")
    if attn_mask is not None:
        scores = broadcast_shapes("scaled_dot_product_attention", q.shape[:-2], k.shape[:-2]) + \
            (q.shape[-2], k.shape[-2])
        try:
            fits = np.broadcast_shapes(attn_mask.shape, scores) == scores
        except ValueError:
            fits = False
        if not fits:
            fail(f"scaled_dot_product_attention: attn_mask {attn_mask.value.spec!r} does not broadcast to the scores' "
                 f"shape {list(scores)} ([..., L, S]: L queries, S keys)")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    batch = broadcast_shapes("scaled_dot_product_attention", q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = (expand(t, batch + t.shape[-2:]) for t in (q, k, v))
    if attn_mask is not None:
        from .core import masked_fill

        scores = matmul(q, transpose(k, -2, -1)) * scale
        mask = as_tensor(attn_mask)
        scores = masked_fill(scores, ~mask, float("-inf")) if mask.dtype is dtypes.bool_ else scores + mask
        if is_causal:  # (both: torch's CPU kernel applies the mask and then the top-left causal one)
            from .core import ones
            from .shape import tril

            scores = masked_fill(scores, ~tril(ones(q.shape[-2], k.shape[-2], dtype=dtypes.bool_)), float("-inf"))
        # a query the mask leaves no key (a padding row) attends to nothing: its output and every
        # gradient through it are 0, as torch's (its safe softmax), not 0/0 spreading NaN to v
        from .core import amax

        nothing = amax(scores, -1, keepdim=True) == float("-inf")
        probs = where(nothing, 0.0, softmax(where(nothing, 0.0, scores), -1))
        return matmul(dropout(probs, dropout_p) if dropout_p else probs, v)
    attrs = dict(causal=bool(is_causal), scale=scale, dropout_p=float(dropout_p), stream=-1,
                 threshold=threshold(dropout_p))
    if len(batch) > 2:  # (the kernels take [B, H, T, D]: the leading batch dims as one)
        q, k, v = (reshape(t, (-1,) + t.shape[-3:]) for t in (q, k, v))
    inputs = [q, k, v]
    if dropout_p:
        ctx = current("scaled_dot_product_attention")
        attrs["stream"] = ctx.next_stream()
        inputs.append(ctx.rng())
    out, _lse = emit("attention", inputs, **attrs)
    return reshape(out, batch + out.shape[-2:])
