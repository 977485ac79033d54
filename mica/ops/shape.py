"""Shape primitives: reshape, permute, expand, slice, pad (slice's adjoint) and concat.

Values are always dense and row-major; a backend may realize reshape as a view and fold the
others into the loops that read them.
"""
import math

import numpy as np

from ..errors import ShapeError
from . import F, defop


def _reshape_infer(specs, shape):
    (x,) = specs
    if math.prod(shape) != math.prod(x.shape):
        raise ShapeError(f"view/reshape: cannot view {x!r} ({math.prod(x.shape)} elements) as shape "
                         f"{list(shape)} ({math.prod(shape)} elements)")
    return [(shape, x.dtype)]


def _custom_grad_infer(specs, key, count):
    return [(specs[-1].shape, specs[-1].dtype)]


def _custom_grad_vjp(cts, outs, ins, attrs, need):
    from ..autograd import custom_vjp

    return custom_vjp(attrs["key"], cts[0], outs[0], ins, need)


# a torch.autograd.Function's output: its value (the last input, the forward's result detached), its
# gradient the user's backward() for the Function's tensor arguments (the other inputs); an identity
# that simplify removes once the gradients are taken, so no target lowers it
defop("custom_grad", infer=_custom_grad_infer, ref=lambda a, at, run: a[-1], vjp=_custom_grad_vjp, family="shape")


defop("reshape", infer=_reshape_infer, ref=lambda a, at, run: a[0].reshape(at["shape"]),
      vjp=lambda c, o, i, a, n: [F.reshape(c[0], i[0].shape)], family="shape")


def _permute_infer(specs, perm):
    (x,) = specs
    if sorted(perm) != list(range(len(x.shape))):
        raise ShapeError(f"permute: {list(perm)} is not a permutation of the {len(x.shape)} dims of {x!r}")
    return [(tuple(x.shape[p] for p in perm), x.dtype)]


def _permute_vjp(c, o, i, a, n):
    inv = [0] * len(a["perm"])
    for k, p in enumerate(a["perm"]):
        inv[p] = k
    return [F.permute(c[0], *inv)]


defop("permute", infer=_permute_infer, ref=lambda a, at, run: np.transpose(a[0], at["perm"]),
      vjp=_permute_vjp, family="shape")


def _expand_infer(specs, shape):
    (x,) = specs
    if len(shape) != len(x.shape) or any(s != d and s != 1 for s, d in zip(x.shape, shape)):
        raise ShapeError(f"expand: cannot expand {x!r} to {list(shape)}; only size-1 dims can grow")
    return [(shape, x.dtype)]


def _expand_vjp(c, o, i, a, n):
    return [F.sum_to(c[0], i[0].shape)]


defop("expand", infer=_expand_infer, ref=lambda a, at, run: np.broadcast_to(a[0], at["shape"]).copy(),
      vjp=_expand_vjp, family="shape")


def _slice_len(start, stop, step):
    return max(0, (stop - start + step - 1) // step)


def _slice_infer(specs, starts, stops, steps):
    (x,) = specs
    out = []
    for d, (s, b, e, st) in enumerate(zip(x.shape, starts, stops, steps)):
        if not (0 <= b <= e <= s) or st < 1:
            raise ShapeError(f"slice: range {b}:{e}:{st} does not fit dim {d} of {x!r}")
        out.append(_slice_len(b, e, st))
    return [(tuple(out), x.dtype)]


def _slice_ref(args, at, run):
    return args[0][tuple(slice(b, e, s) for b, e, s in zip(at["starts"], at["stops"], at["steps"]))].copy()


def _slice_vjp(c, o, i, a, n):
    return [F.pad_into(c[0], i[0].shape, a["starts"], a["steps"])]


defop("slice", infer=_slice_infer, ref=_slice_ref, vjp=_slice_vjp, family="shape")


def _pad_infer(specs, shape, starts, steps):
    (x,) = specs
    for d, (n, s, b, st) in enumerate(zip(x.shape, shape, starts, steps)):
        if n and b + (n - 1) * st >= s:
            raise ShapeError(f"pad: {x!r} placed at {b} step {st} does not fit dim {d} of size {s}")
    return [(tuple(shape), x.dtype)]


def _pad_ref(args, at, run):
    x = args[0]
    out = np.zeros(at["shape"], dtype=x.dtype)
    out[tuple(slice(b, b + n * s, s) for b, n, s in zip(at["starts"], x.shape, at["steps"]))] = x
    return out


def _pad_vjp(c, o, i, a, n):
    x = i[0]
    stops = tuple(b + (k - 1) * s + 1 if k else b for b, k, s in zip(a["starts"], x.shape, a["steps"]))
    return [F.slice_(c[0], a["starts"], stops, a["steps"])]


defop("pad", infer=_pad_infer, ref=_pad_ref, vjp=_pad_vjp, family="shape")


def _concat_infer(specs, axis):
    first = specs[0]
    for s in specs[1:]:
        if s.dtype is not first.dtype or len(s.shape) != len(first.shape) or any(
                a != b for d, (a, b) in enumerate(zip(s.shape, first.shape)) if d != axis):
            raise ShapeError("cat: tensors must match in every dim but the one joined (dim "
                             f"{axis}) and in type; got " + ", ".join(repr(x) for x in specs))
    shape = list(first.shape)
    shape[axis] = sum(s.shape[axis] for s in specs)
    return [(tuple(shape), first.dtype)]


def _concat_vjp(c, o, i, a, n):
    axis, grads, start = a["axis"], [], 0
    for x, need in zip(i, n):
        size = x.shape[axis]
        if need:
            starts = [0] * x.ndim
            stops = list(c[0].shape)
            starts[axis], stops[axis] = start, start + size
            grads.append(F.slice_(c[0], tuple(starts), tuple(stops), (1,) * x.ndim))
        else:
            grads.append(None)
        start += size
    return grads


defop("concat", infer=_concat_infer, ref=lambda a, at, run: np.concatenate(a, axis=at["axis"]),
      vjp=_concat_vjp, family="shape")
