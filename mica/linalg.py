"""torch.linalg's vector functions, under its names: vector_norm, norm and matrix_norm (the
Frobenius and vector norms Mica's norm computes), vecdot."""
from . import verbs as F
from .errors import missing_verb
from .host import eager
from .tensor import fail


def _vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    x = F.as_tensor(x)
    if dtype is not None:
        x = F.to(x, dtype)
    if isinstance(ord, str):
        fail(f"linalg.vector_norm: ord must be a number (inf and -inf too), got {ord!r}")
    if dim is None and x.ndim > 1:  # (every element: one vector)
        out = F.norm(F.reshape(x, (-1,)), ord, None, False)
        return F.reshape(out, (1,) * x.ndim) if keepdim else out
    return F.norm(x, ord, dim, keepdim)


def _norm(x, ord=None, dim=None, keepdim=False, *, dtype=None):
    """torch.linalg.norm: the 2-norm of every element by default; a vector norm for a number ord;
    the Frobenius norm for 'fro'. Matrix norms other than 'fro' are a sentence."""
    x = F.as_tensor(x)
    if ord in (None, "fro"):
        if ord == "fro" and (x.ndim != 2 and (dim is None or len(tuple(dim)) != 2)):
            fail("linalg.norm: ord='fro' takes a matrix (or dim of two dims)")
        if dtype is not None:
            x = F.to(x, dtype)
        return F.norm(x, "fro", dim, keepdim) if dim is not None else _vector_norm(x, 2, None, keepdim)
    if isinstance(ord, str):
        fail(f"linalg.norm: ord={ord!r} (a matrix norm by singular values) is not supported; Mica's norms are 'fro' "
             "and vector norms")
    if x.ndim == 2 and dim is None or (dim is not None and not isinstance(dim, int) and len(tuple(dim)) == 2):
        fail(f"linalg.norm: ord={ord!r} of a matrix is a matrix norm, which Mica does not have; flatten it for the "
             "vector norm, or give one dim")
    return _vector_norm(x, ord, dim, keepdim, dtype=dtype)


def _matrix_norm(x, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None):
    if ord != "fro":
        fail(f"linalg.matrix_norm: ord={ord!r} is not supported; Mica's matrix norm is 'fro'")
    x = F.as_tensor(x)
    if dtype is not None:
        x = F.to(x, dtype)
    return F.norm(x, "fro", tuple(dim), keepdim)


def _vecdot(x, y, *, dim=-1):
    """torch.linalg.vecdot: the dot product of x and y (broadcast) over dim."""
    return F.sum(F.mul(x, y), dim)


_vector_norm.__name__, _norm.__name__, _matrix_norm.__name__, _vecdot.__name__ = (
    "vector_norm", "norm", "matrix_norm", "vecdot")
vector_norm, norm, matrix_norm, vecdot = (eager(f) for f in (_vector_norm, _norm, _matrix_norm, _vecdot))


def __getattr__(name):
    if name.startswith("_"):
        raise AttributeError(name)
    raise missing_verb("mica.linalg.", name, "torch.linalg.")
