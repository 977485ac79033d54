"""The matrix product, batched over equal leading dims: [..., M, K] @ [..., K, N] -> [..., M, N].

Its result has the operands' type, or with `dtype=float32` a product of half-type operands is
kept in float32 (the sums' float32 accumulator, not rounded to the half type): torch's addmm and
linear add their bias to that and round once (verbs/nn.py)."""
import numpy as np

from .. import dtypes
from ..errors import ShapeError
from . import F, defop


def _matmul_infer(specs, dtype=None):
    a, b = specs
    if len(a.shape) < 2 or len(a.shape) != len(b.shape) or a.shape[:-2] != b.shape[:-2]:
        raise ShapeError(f"matmul: operands {a!r} and {b!r} need rank >= 2 and equal batch dims")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: cannot multiply {a!r} by {b!r}: inner sizes {a.shape[-1]} and "
                         f"{b.shape[-2]} differ")
    if a.dtype is not b.dtype or a.dtype.kind != "float":
        raise ShapeError(f"matmul: operands must be floating and of one type, got {a!r} and {b!r}")
    if dtype is not None and dtype is not a.dtype and not (dtype is dtypes.float32 and a.dtype in dtypes.HALF):
        raise ShapeError(f"matmul: a product of {a.dtype.name} operands is kept in their type, or in float32 when "
                         f"they are bfloat16 or float16, not in {getattr(dtype, 'name', dtype)}")
    return [(a.shape[:-1] + (b.shape[-1],), dtype or a.dtype)]


def _matmul_vjp(c, o, i, a, n):
    x, w = i
    g = c[0]
    if g.dtype is not x.dtype:  # (a float32 result of half operands: its gradient's products in their type)
        g = F.to(g, x.dtype)
    return [F.matmul(g, w.mT) if n[0] else None, F.matmul(x.mT, g) if n[1] else None]


defop("matmul", infer=_matmul_infer, ref=lambda a, at, run: np.matmul(a[0], a[1]),
      vjp=_matmul_vjp, family="matmul")
