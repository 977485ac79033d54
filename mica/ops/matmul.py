"""The matrix product, batched over equal leading dims: [..., M, K] @ [..., K, N] -> [..., M, N]."""
import numpy as np

from ..errors import ShapeError
from . import F, defop


def _matmul_infer(specs):
    a, b = specs
    if len(a.shape) < 2 or len(a.shape) != len(b.shape) or a.shape[:-2] != b.shape[:-2]:
        raise ShapeError(f"matmul: operands {a!r} and {b!r} need rank >= 2 and equal batch dims")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: cannot multiply {a!r} by {b!r}: inner sizes {a.shape[-1]} and "
                         f"{b.shape[-2]} differ")
    if a.dtype is not b.dtype or a.dtype.kind != "float":
        raise ShapeError(f"matmul: operands must be floating and of one type, got {a!r} and {b!r}")
    return [(a.shape[:-1] + (b.shape[-1],), a.dtype)]


def _matmul_vjp(c, o, i, a, n):
    x, w = i
    g = c[0]
    return [F.matmul(g, w.mT) if n[0] else None, F.matmul(x.mT, g) if n[1] else None]


defop("matmul", infer=_matmul_infer, ref=lambda a, at, run: np.matmul(a[0], a[1]),
      vjp=_matmul_vjp, family="matmul")
