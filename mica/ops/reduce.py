"""Reductions over a set of axes: sum, max, argmax."""
import numpy as np

from .. import dtypes
from ..errors import ShapeError
from . import F, defop


def _reduced_shape(shape, axes, keepdim):
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _check_axes(op, spec, axes):
    for a in axes:
        if not 0 <= a < len(spec.shape):
            raise ShapeError(f"{op}: axis {a} is out of range for {spec!r}")


def _reduce_infer(specs, axes, keepdim):
    (x,) = specs
    _check_axes("sum", x, axes)
    return [(_reduced_shape(x.shape, axes, keepdim), x.dtype)]


def _sum_vjp(c, o, i, a, n):
    x = i[0]
    g = F.reshape(c[0], _reduced_shape(x.shape, a["axes"], True))
    return [F.expand(g, x.shape)]


def _sum_ref(args, at, run):
    return np.sum(args[0], axis=at["axes"], keepdims=at["keepdim"], dtype=args[0].dtype)


defop("sum", infer=_reduce_infer, ref=_sum_ref, vjp=_sum_vjp, family="reduce")


def _max_infer(specs, axes, keepdim):
    (x,) = specs
    _check_axes("max", x, axes)
    if 0 in [x.shape[a] for a in axes]:
        raise ShapeError(f"max: cannot reduce an empty axis of {x!r}")
    return [(_reduced_shape(x.shape, axes, keepdim), x.dtype)]


def _max_vjp(c, o, i, a, n):
    # Every maximal element shares the gradient equally (PyTorch's amax rule).
    x = i[0]
    kshape = _reduced_shape(x.shape, a["axes"], True)
    mask = (x == F.reshape(o[0], kshape)).to(x.dtype)
    count = F.sum(mask, a["axes"], keepdim=True)
    return [mask * (F.reshape(c[0], kshape) / count)]


defop("max", infer=_max_infer,
      ref=lambda args, at, run: np.max(args[0], axis=at["axes"], keepdims=at["keepdim"]),
      vjp=_max_vjp, family="reduce")


def _argmax_infer(specs, axis, keepdim):
    (x,) = specs
    _check_axes("argmax", x, (axis,))
    return [(_reduced_shape(x.shape, (axis,), keepdim), dtypes.int64)]


def _argmax_ref(args, at, run):
    r = np.argmax(args[0], axis=at["axis"])
    if at["keepdim"]:
        r = np.expand_dims(r, at["axis"])
    return r.astype(np.int64)


defop("argmax", infer=_argmax_infer, ref=_argmax_ref, family="reduce")
