"""Element types, shape specs (`mica.f32[4, 8]`) and PyTorch's type-promotion rule."""
import numpy as np

from .errors import ShapeError


class DType:
    """An element type. Indexing it with a shape gives a Spec: `f32[4, 8]`."""

    __slots__ = ("name", "short", "itemsize", "kind", "rank", "np_storage")

    def __init__(self, name, short, itemsize, kind, rank, np_storage):
        self.name = name            # PyTorch's name: float32, bfloat16, ...
        self.short = short          # IR name: f32, bf16, ...
        self.itemsize = itemsize
        self.kind = kind            # "bool" | "int" | "float"
        self.rank = rank            # order of promotion within a kind
        self.np_storage = np_storage  # numpy dtype used to hold values outside the compiled program

    @property
    def is_floating_point(self):
        return self.kind == "float"

    @property
    def dtype(self):
        """numpy's reading of this type (np.dtype(mica.float32), and a host tensor's dtype == mica.float32,
        as torch compares them); bfloat16, which numpy lacks, is two bytes numpy reads as no number."""
        return np.dtype((np.void, 2)) if self.name == "bfloat16" else self.np_storage

    def __getitem__(self, shape):
        if isinstance(shape, list):
            shape = tuple(shape)
        if not isinstance(shape, tuple):
            shape = (shape,)
        return Spec(shape, self)

    def __repr__(self):
        return f"mica.{self.name}"

    def __reduce__(self):
        return (by_name, (self.name,))


bool_ = DType("bool", "b8", 1, "bool", 0, np.dtype(np.bool_))
int32 = DType("int32", "i32", 4, "int", 2, np.dtype(np.int32))
int64 = DType("int64", "i64", 8, "int", 3, np.dtype(np.int64))
float16 = DType("float16", "f16", 2, "float", 1, np.dtype(np.float16))
bfloat16 = DType("bfloat16", "bf16", 2, "float", 1, np.dtype(np.float32))  # numpy has no bf16: held widened
float32 = DType("float32", "f32", 4, "float", 2, np.dtype(np.float32))
float64 = DType("float64", "f64", 8, "float", 3, np.dtype(np.float64))

ALL = (bool_, int32, int64, float16, bfloat16, float32, float64)
HALF = (bfloat16, float16)  # the half types: computed in float32 and rounded to their own type
COMPLEX_NAMES = ("complex64", "complex128", "cfloat", "cdouble")  # (torch's; mica/complex.py's types)
_BY_NAME = {d.name: d for d in ALL} | {d.short: d for d in ALL} | {
    "bool": bool_, "long": int64, "int": int32, "float": float32, "half": float16, "double": float64}
DEFAULT_FLOAT = float32
DEFAULT_INT = int64


def by_name(name):
    return _BY_NAME[name]


def as_dtype(x):
    """A DType from a DType, a name, a numpy dtype or a torch dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    text = str(x)
    if text.startswith("torch."):
        return _BY_NAME[text[6:]]
    try:
        npd = np.dtype(x)
    except TypeError:
        raise TypeError(f"{x!r} is not an element type Mica knows; use one of "
                        + ", ".join(d.name for d in ALL)) from None
    for d in (bool_, int32, int64, float16, float32, float64):
        if d.np_storage == npd:
            return d
    if npd.kind == "i" or npd.kind == "u":
        return int64
    raise TypeError(f"numpy dtype {npd} has no Mica element type")


class finfo:  # noqa: N801  (torch's name)
    """torch.finfo: a floating type's limits (bits, eps, max, min, tiny = smallest_normal,
    resolution), for a Mica, numpy or torch dtype; the default float without one."""

    _BITS = {"float16": (10, 15), "bfloat16": (7, 127), "float32": (23, 127), "float64": (52, 1023)}

    def __init__(self, type=None):  # noqa: A002
        from .tensor import user_location
        from .errors import MicaError

        try:
            d = DEFAULT_FLOAT if type is None else as_dtype(type)
        except (TypeError, KeyError):
            d = None
        if d is None or d.kind != "float":
            raise MicaError(f"finfo takes a floating type (mica.float32, mica.bfloat16, ...), got {type!r}; "
                            "iinfo gives an integer type's limits", user_location())
        mantissa, bias = self._BITS[d.name]
        self.dtype, self.bits = d.name, 8 * d.itemsize
        self.eps = 2.0 ** -mantissa
        self.max = (2.0 - 2.0 ** -mantissa) * 2.0 ** bias
        self.min = -self.max
        self.tiny = self.smallest_normal = 2.0 ** (1 - bias)
        self.resolution = 10.0 ** -int(mantissa * np.log10(2))

    def __repr__(self):
        return (f"finfo(resolution={self.resolution:g}, min={self.min:g}, max={self.max:g}, eps={self.eps:g}, "
                f"smallest_normal={self.tiny:g}, tiny={self.tiny:g}, dtype={self.dtype})")


class iinfo:  # noqa: N801  (torch's name)
    """torch.iinfo: an integer type's limits (bits, min, max)."""

    def __init__(self, type):  # noqa: A002
        from .tensor import user_location
        from .errors import MicaError

        try:
            d = as_dtype(type)
        except (TypeError, KeyError):
            d = None
        if d is None or d.kind != "int":
            raise MicaError(f"iinfo takes an integer type (mica.int32, mica.int64), got {type!r}; finfo gives a "
                            "floating type's limits", user_location())
        info = np.iinfo(d.np_storage)
        self.dtype, self.bits, self.min, self.max = d.name, info.bits, int(info.min), int(info.max)

    def __repr__(self):
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype})"


class Spec:
    """The static type of one program input or output: a shape and an element type."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        shape = tuple(shape)
        for s in shape:
            if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 0:
                from .tensor import user_location

                raise ShapeError(f"a shape holds whole numbers >= 0; got {shape!r}", user_location())
        self.shape = tuple(int(s) for s in shape)
        self.dtype = as_dtype(dtype)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self):
        return self.numel * self.dtype.itemsize

    def __eq__(self, other):
        return isinstance(other, Spec) and other.shape == self.shape and other.dtype is self.dtype

    def __hash__(self):
        return hash((self.shape, self.dtype.name))

    def __repr__(self):
        return f"{self.dtype.short}[{', '.join(map(str, self.shape))}]"

    @classmethod
    def of(cls, array):
        """The Spec of a numpy array (or anything with .shape and .dtype)."""
        return cls(array.shape, as_dtype(array.dtype))


def promote(a, b):
    """The common type of two element types, as torch.promote_types gives it."""
    if a is b:
        return a
    order = {"bool": 0, "int": 1, "float": 2}
    if order[a.kind] != order[b.kind]:
        return a if order[a.kind] > order[b.kind] else b
    if {a, b} == {float16, bfloat16}:
        return float32
    return a if a.rank >= b.rank else b


def category(dtype):
    return {"bool": 0, "int": 1, "float": 2}[dtype.kind]
