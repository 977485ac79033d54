"""Complex tensors as transformer code uses them: rotary position embeddings written as Meta's
LLaMA writes them (torch.polar for the rotations, torch.view_as_complex over pairs of features, a
complex product, torch.view_as_real back).

The IR has real element types only. Outside a trace a complex tensor is a numpy complex host
tensor (made by polar, or view_as_complex of a host tensor). In a trace it is a ComplexTensor: a
real Tensor whose last dim of 2 holds the real and imaginary parts, with complex arithmetic written
in real verbs; gradients, fusion and every backend come from those verbs. A complex host tensor a
trace reads (a module's precomputed rotations) becomes such a pair of constants."""
import builtins
import numbers

import numpy as np

from . import dtypes
from . import verbs as F
from .errors import TraceError
from .tensor import Tensor, in_trace, user_location

complex64 = dtypes.DType("complex64", "c64", 8, "complex", 2, np.dtype(np.complex64))
complex128 = dtypes.DType("complex128", "c128", 16, "complex", 3, np.dtype(np.complex128))
cfloat, cdouble = complex64, complex128


def _fail(text):
    raise TraceError(text, user_location())


def _host(x):
    from .host import HostTensor

    return isinstance(x, np.ndarray) and not isinstance(x, Tensor) or isinstance(x, HostTensor)


class ComplexTensor:
    """A complex tensor in a trace: `pairs` is a real Tensor of shape self.shape + (2,)."""

    _mica_complex = True
    __array_ufunc__ = None  # (numpy's operators on a host tensor beside one defer to this class's)

    def __init__(self, pairs):
        self.pairs = pairs

    # ---- what it is ---------------------------------------------------------------------------
    @property
    def shape(self):
        return self.pairs.shape[:-1]

    @property
    def dtype(self):
        return complex128 if self.pairs.dtype is dtypes.float64 else complex64

    @property
    def ndim(self):
        return len(self.shape)

    def dim(self):
        return self.ndim

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[F.canon_dim(dim, self.ndim, "size")]

    def numel(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def is_complex(self):
        return True

    @property
    def is_cuda(self):
        return False

    @property
    def device(self):
        return self.pairs.device

    @property
    def real(self):
        return self.pairs[..., 0]

    @property
    def imag(self):
        return self.pairs[..., 1]

    def __repr__(self):
        return f"ComplexTensor({list(self.shape)}, {self.dtype.name})"

    def __len__(self):
        if not self.shape:
            _fail("len() of a 0-d complex tensor, as torch refuses")
        return self.shape[0]

    # ---- arithmetic ---------------------------------------------------------------------------
    def __mul__(self, o):
        o = lift(o, self)
        if isinstance(o, ComplexTensor):
            a, b, c, d = self.real, self.imag, o.real, o.imag
            return _pair(a * c - b * d, a * d + b * c)
        return ComplexTensor(self.pairs * _each_part(o))

    __rmul__ = __mul__

    def __add__(self, o):
        o = lift(o, self)
        if isinstance(o, ComplexTensor):
            return _pair(self.real + o.real, self.imag + o.imag)
        return _pair(self.real + o, self.imag + F.zeros_like(o) if isinstance(o, Tensor) else self.imag)

    __radd__ = __add__

    def __neg__(self):
        return ComplexTensor(-self.pairs)

    def __pos__(self):
        return self

    def __sub__(self, o):
        return self + -lift(o, self)

    def __rsub__(self, o):
        return -self + o

    def __truediv__(self, o):
        o = lift(o, self)
        if isinstance(o, ComplexTensor):
            return self * o.conj() / (o.real * o.real + o.imag * o.imag)
        return ComplexTensor(self.pairs / _each_part(o))

    def __rtruediv__(self, o):
        o = lift(o, self)
        if isinstance(o, ComplexTensor):
            return o / self
        square = self.real * self.real + self.imag * self.imag  # (a real o: o conj(self) / |self|^2)
        return _pair(o * self.real / square, -o * self.imag / square)

    def __pow__(self, n):
        """Whole powers (c ** 2 as c * c), as torch computes them up to rounding."""
        if isinstance(n, (int, np.integer)) and not isinstance(n, bool) and -64 <= n <= 64:
            out = None
            for _ in range(abs(int(n))):
                out = self if out is None else out * self
            if out is None:
                return _pair(F.ones_like(self.real), F.zeros_like(self.imag))
            return 1.0 / out if n < 0 else out
        _fail(f"a complex tensor's power {n!r}: Mica's complex tensors take whole powers from -64 to 64; write "
              "others from polar form (abs, angle)")

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        _fail(f"a complex tensor in Mica has no .{name}: it takes + - * / and whole powers, conj, abs, exp, sum, "
              "mean, .real, .imag and the shape methods; for the rest compute on torch.view_as_real(c), its real pairs")

    def __matmul__(self, o):
        _fail("a matrix product of complex tensors is not in Mica (its complex numbers are for elementwise "
              "rotations); write it from the real and imaginary parts (.real, .imag) and real products")

    __rmatmul__ = __matmul__

    def sum(self, dim=None, keepdim=False, **kwargs):
        return _pair(self.real.sum(dim, keepdim=keepdim, **kwargs), self.imag.sum(dim, keepdim=keepdim, **kwargs))

    def mean(self, dim=None, keepdim=False, **kwargs):
        return _pair(self.real.mean(dim, keepdim=keepdim, **kwargs), self.imag.mean(dim, keepdim=keepdim, **kwargs))

    def exp(self):
        scale = F.exp(self.real)
        return _pair(scale * F.cos(self.imag), scale * F.sin(self.imag))

    def conj(self):
        return _pair(self.real, -self.imag)

    def abs(self):
        return F.sqrt(self.real * self.real + self.imag * self.imag)

    __abs__ = abs

    # ---- shapes: the pairs' dim stays last ----------------------------------------------------
    def _dim(self, d, extra=0):
        return F.canon_dim(d, self.ndim + extra, "complex tensor")

    def view(self, *shape):
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return ComplexTensor(self.pairs.reshape(*shape, 2))

    reshape = view

    def view_as(self, other):
        return self.view(*other.shape)

    reshape_as = view_as

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        if any(isinstance(i, (Tensor, np.ndarray, list)) for i in index):
            _fail("a complex tensor takes slices, ints, None and ... as indices; select from its real pairs "
                  "(torch.view_as_real) for other indexing")
        if Ellipsis not in index:
            index = index + (Ellipsis,)
        return ComplexTensor(self.pairs[index + (slice(None),)])

    def unsqueeze(self, dim):
        return ComplexTensor(self.pairs.unsqueeze(self._dim(dim, 1)))

    def squeeze(self, dim=None):
        if dim is None:
            return ComplexTensor(self.pairs.reshape(*[s for s in self.shape if s != 1], 2))
        d = self._dim(dim)
        return ComplexTensor(self.pairs.squeeze(d)) if self.shape[d] == 1 else self

    def transpose(self, dim0, dim1):
        return ComplexTensor(self.pairs.transpose(self._dim(dim0), self._dim(dim1)))

    def permute(self, *dims):
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        return ComplexTensor(self.pairs.permute(*[self._dim(d) for d in dims], self.ndim))

    def flatten(self, start_dim=0, end_dim=-1):
        if self.ndim == 0:
            return self.view(1)
        return ComplexTensor(self.pairs.flatten(self._dim(start_dim), self._dim(end_dim)))

    def expand(self, *sizes):
        sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
        return ComplexTensor(self.pairs.expand(*sizes, 2))

    def contiguous(self, *args, **kwargs):
        return self

    def clone(self, *args, **kwargs):
        return ComplexTensor(self.pairs.clone())

    def detach(self):
        return ComplexTensor(self.pairs.detach())

    def to(self, *args, **kwargs):
        """A device (kept), or a complex type: complex64 or complex128."""
        given = list(args) + [v for k, v in kwargs.items() if k in ("dtype", "device")]
        for a in given:
            if isinstance(a, dtypes.DType) or str(a).startswith("torch."):
                name = str(a).replace("torch.", "").replace("mica.", "")
                if name not in dtypes.COMPLEX_NAMES:
                    _fail(f"a complex tensor converted to {name} would drop its imaginary part; take .real "
                          "(or torch.view_as_real) instead")
                return ComplexTensor(self.pairs.to(dtypes.float64 if name in ("complex128", "cdouble")
                                                   else dtypes.float32))
        return self

    def __bool__(self):
        _fail("a traced complex tensor has no value while tracing, so it cannot decide an if")


def _pair(re, im):
    return ComplexTensor(F.stack([re, im], -1))


def _each_part(o):
    """A real operand applied to both parts: its last dim lined up with the complex shape's."""
    return o.unsqueeze(-1) if isinstance(o, Tensor) and o.ndim else o


def lift(o, like=None):
    """A ComplexTensor (or a real operand as it is) from what may meet one: a complex host tensor or
    numpy array (its parts as constants), a Python complex number, a real Tensor or number."""
    if isinstance(o, ComplexTensor):
        return o
    if isinstance(o, (builtins.complex, np.complexfloating)) and not isinstance(o, numbers.Real):
        dt = like.pairs.dtype if like is not None else dtypes.float32
        return ComplexTensor(F.as_tensor(np.array([o.real, o.imag], dt.np_storage)))
    if _host(o) and np.iscomplexobj(o):
        a = np.asarray(o)
        real = np.float64 if a.dtype == np.complex128 else np.float32
        return ComplexTensor(F.as_tensor(np.stack([a.real, a.imag], -1).astype(real)))
    if _host(o):
        return F.as_tensor(np.asarray(o))
    return o


# ---- the verbs (torch's names), taking host tensors outside a trace and traced ones in it ------
def _from_two_reals(verb, a, b, names, host_parts, traced_parts):
    """A complex tensor from two real ones of one type (float32 or float64): host_parts(a, b) gives
    the (real, imag) parts of numpy arrays outside a trace, traced_parts of Tensors in one."""
    if not in_trace() and _host(a) and _host(b):
        x, y = np.asarray(a), np.asarray(b)
        if x.dtype != y.dtype or x.dtype not in (np.float32, np.float64):
            _fail(f"{verb} takes {names} of one type, float32 or float64, got {x.dtype} and {y.dtype}")
        out = np.empty(np.broadcast_shapes(x.shape, y.shape), np.complex64 if x.dtype == np.float32 else np.complex128)
        out.real, out.imag = host_parts(x, y)  # (each part set: r + 1j i would make an infinite i's real part NaN)
        return _host_tensor(out)
    x, y = F.as_tensor(lift(a)), F.as_tensor(lift(b))
    if x.dtype is not y.dtype or x.dtype not in (dtypes.float32, dtypes.float64):
        _fail(f"{verb} takes {names} of one type, float32 or float64, got {x.dtype.name} and {y.dtype.name}")
    return _pair(*traced_parts(x, y))


def polar(abs, angle):
    """abs * (cos(angle) + i sin(angle)), as torch.polar."""
    return _from_two_reals("polar", abs, angle, "abs and angle", lambda a, t: (a * np.cos(t), a * np.sin(t)),
                           lambda a, t: (a * F.cos(t), a * F.sin(t)))


def complex(real, imag):
    """real + i imag, as torch.complex (each broadcast to the other's shape)."""
    return _from_two_reals("complex", real, imag, "real and imag", lambda r, i: (r, i),
                           lambda r, i: (r + F.zeros_like(i), i + F.zeros_like(r)))


def view_as_complex(input):
    """A complex tensor over the last dim's pairs (size 2) of a float32/float64 tensor."""
    if isinstance(input, ComplexTensor) or (_host(input) and np.iscomplexobj(input)):
        _fail("view_as_complex takes a real tensor whose last dim is 2; this one is complex already")
    shape, dt = tuple(input.shape), getattr(input, "dtype", None)
    if not shape or shape[-1] != 2:
        _fail(f"view_as_complex needs a last dim of size 2 (the real and imaginary parts), got shape {list(shape)}; "
              "reshape it as x.reshape(*x.shape[:-1], -1, 2)")
    if not in_trace() or _host(input):
        a = np.asarray(input)
        if a.dtype not in (np.float32, np.float64):
            _fail(f"view_as_complex takes float32 or float64, got {a.dtype} (convert with .float())")
        out = np.ascontiguousarray(a).view(np.complex64 if a.dtype == np.float32 else np.complex128)[..., 0]
        return _host_tensor(out) if not in_trace() else lift(out)
    x = F.as_tensor(input)
    if x.dtype not in (dtypes.float32, dtypes.float64):
        _fail(f"view_as_complex takes float32 or float64, got {dt.name} (convert with .float(), as torch's LLaMA does)")
    return ComplexTensor(x)


def view_as_real(input):
    """The real tensor of a complex one's parts: its shape + (2,)."""
    if isinstance(input, ComplexTensor):
        return input.pairs
    if _host(input) and np.iscomplexobj(input):
        a = np.asarray(input)
        real = np.float32 if a.dtype == np.complex64 else np.float64
        return _host_tensor(np.ascontiguousarray(a).view(real).reshape(a.shape + (2,)))
    _fail("view_as_real takes a complex tensor (torch.polar, torch.view_as_complex), got a real one")


def real(input):
    return view_as_real(input)[..., 0]


def imag(input):
    return view_as_real(input)[..., 1]


def is_complex(input):
    return isinstance(input, ComplexTensor) or (_host(input) and np.iscomplexobj(input))


def _host_tensor(a):
    from .host import HostTensor

    return np.asarray(a).view(HostTensor)
