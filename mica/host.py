"""torch's eager tensors, outside a trace: what torch code computes while a model is built (a
causal mask, rotary frequencies) before anything is traced.

Outside a trace Mica's verbs give a HostTensor: a numpy array (so numpy and every Mica entry point
take it as one) whose torch.Tensor methods mean what torch's do, where numpy has the same name with
another meaning (`repeat`, `view`, `size`, `sum(dim, keepdim)`, `transpose`, `flatten`) and where
numpy has none (`float`, `unsqueeze`, `masked_fill`, ...). A verb or method on host tensors runs
as a one-verb program on the oracle at float32 precision (its result rounded to float32 as a
compiled program's is; inside the verb in float64), so it computes what it computes in a trace, to
rounding. torch's views (view, t, split, select, diagonal, ...) are numpy views, sharing memory;
arithmetic takes torch's result types, and what numpy refuses is the verb's sentence. Inside a
trace a HostTensor is a constant, as a torch tensor made in __init__ is to torch's forward.
"""
import functools
import operator
import sys

import numpy as np

from .errors import MicaError


class _Size(int):
    """numpy's `size` (the element count, an int) that is also torch's `size()` / `size(dim)`."""

    def __new__(cls, n, shape):
        self = super().__new__(cls, n)
        self.shape = shape
        return self

    def __call__(self, dim=None):
        if dim is None:
            return self.shape
        return self.shape[dim]


_WRITES = {}  # id of an array that owns its memory -> writes through host tensors into it (guards.py)


def memory_owner(a):
    """The array that owns a's memory (a itself, or its views' base)."""
    while isinstance(getattr(a, "base", None), np.ndarray):
        a = a.base
    return a


def written(a):
    """Count a write into host tensor a's memory: torch's version counter, which lets a compiled
    function's guards know a buffer changed in place without reading it (guards.py)."""
    if isinstance(a, np.ndarray):
        owner = id(memory_owner(a))
        _WRITES[owner] = _WRITES.get(owner, 0) + 1


class HostTensor(np.ndarray):
    """A numpy array with torch.Tensor's methods (module docstring)."""

    __array_priority__ = 2000  # (below a traced Tensor's: x * host inside a trace is the Tensor's; above torch's
    # tensors' 1000: host == torch_tensor, labels from torch's DataLoader, is Mica's operator, as torch's would be)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """numpy's arithmetic, with torch's result types (a dimensioned tensor's type outranks a 0-d
        tensor's and a number's within a category; int / int is the default float) and, where numpy
        refuses, the verb's sentence (shapes that do not fit, a type torch refuses too)."""
        from .tensor import Tensor

        if any(isinstance(x, Tensor) for x in inputs):
            return NotImplemented  # (the traced Tensor's operator: this array is its constant)
        # (a Parameter on the right, x @ W: the values it holds, as its own operators read them)
        inputs = tuple(x._live("an operator") if type(x).__name__ == "Parameter" else
                       _values_of_torch(x).view(HostTensor) if is_torch_tensor(x) else x for x in inputs)
        plain = [np.asarray(x) if isinstance(x, HostTensor) else x for x in inputs]
        out_to = kwargs.get("out")
        if out_to is not None:  # (x += y: numpy writes into x; torch's rules for what may be written there)
            for o in out_to:
                written(o)
            kwargs["out"] = tuple(np.asarray(o) if isinstance(o, HostTensor) else o for o in out_to)
        verb = _OPERATORS.get(ufunc) if method == "__call__" and len(inputs) == 2 else \
            _UNARY.get(ufunc) if method == "__call__" and len(inputs) == 1 else None
        if ufunc is np.matmul and method == "__call__" and len({np.result_type(x) for x in plain}) > 1:
            run(verb, inputs, {})  # (int @ float, half @ float: torch refuses, so does the verb)
        if ufunc is np.matmul and method == "__call__" and not kwargs:
            from .amp import active

            if active() is not None:  # (in a mica.autocast region: the verb's product, in the half type)
                return run(verb, inputs, {})
        if ufunc is np.subtract and any(isinstance(x, HostTensor) and x.dtype == np.bool_ for x in inputs):
            run(verb, inputs, {})  # (a bool tensor less a number: torch refuses, so does the verb)
        if verb is not None and method == "__call__" and ufunc is not np.matmul:
            plain = _in_torchs_type(plain, inputs, ufunc)
        if ufunc is np.true_divide and method == "__call__" and not kwargs and type(plain[0]) in (int, float) \
                and isinstance(plain[1], np.ndarray) and plain[1].dtype == np.float16:  # (torch's s / x in float16:
            with np.errstate(divide="ignore", over="ignore", invalid="ignore"):  # s times x's float16 reciprocal)
                inverse = (1 / plain[1].astype(np.float32)).astype(np.float16).astype(np.float32)
                return np.asarray(np.float32(plain[0]) * inverse).astype(np.float16).view(HostTensor)
        try:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # (torch warns of none of these)
                out = getattr(ufunc, method)(*plain, **kwargs)
        except (ValueError, TypeError, OverflowError):  # (numpy's refusal: the verb's sentence, or its result
            # where torch computes what numpy refuses: an int32 and a Python int beyond it wrap, as torch's)
            if verb is not None and not any(k != "out" for k in kwargs):
                result = run(verb, inputs, {})  # (operands that do not fit: the verb's sentence)
                if out_to is not None:  # (x += y where x cannot take the result: torch's in-place refusal)
                    _write(out_to[0], result, ufunc.__name__)
                    return out_to[0]
                return result  # (what numpy refuses and torch computes: an integer to negative powers)
            raise

        typed = method == "__call__" and ufunc.nout == 1 and "dtype" not in kwargs  # (np.add.reduce, dtype=: numpy's)

        def wrap(r):
            if not isinstance(r, np.ndarray) and not isinstance(r, np.generic):
                return r
            return np.asarray(_torch_typed(r, inputs, ufunc) if typed else r).view(HostTensor)
        return tuple(wrap(r) for r in out) if isinstance(out, tuple) else wrap(out)

    def __pow__(self, other):  # (numpy's x ** 2 is its square, whose type for a bool is bool: torch's is int64;
        if self.dtype.kind == "f" and type(other) in (int, float) and other in (0.5, -0.5, 3, -1):  # these powers
            return _method("pow", self, other)  # are torch's own forms, the verb's: sqrt(-inf) is NaN, pow's 0)
        return np.power(self, other)

    def __repr__(self):  # (print(x): torch's text, not numpy's)
        return torch_text(np.asarray(self))

    __str__ = __repr__

    # ---- names numpy gives another meaning ------------------------------------------------------
    @property
    def size(self):
        return _Size(int(np.prod(self.shape, dtype=np.int64)), tuple(self.shape))

    def view(self, *shape, **kwargs):
        if kwargs or _called_by_numpy():  # (numpy's own code, or numpy's keywords: numpy's view)
            return np.ndarray.view(self, *shape, **kwargs)
        if len(shape) == 1 and (isinstance(shape[0], (np.dtype, type, str)) or shape[0] is None):
            return np.ndarray.view(self, shape[0])  # (numpy's view as another dtype)
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        try:
            np.broadcast_to(np.empty((), np.bool_), self.shape).reshape(shape)  # (the sizes alone, no data)
        except (ValueError, TypeError):
            return _method("view", np.ascontiguousarray(self).view(HostTensor), *shape)  # (its sentence)
        if not self.flags.c_contiguous:
            from .tensor import user_location

            raise MicaError(f"view: a tensor laid out as this one (a transpose, a strided slice) cannot be viewed as "
                            f"{list(shape)}, as in torch; use .reshape(...)", user_location())
        return np.ndarray.view(self, np.ndarray).reshape(shape).view(HostTensor)

    def reshape(self, *shape, **kwargs):
        if kwargs or _called_by_numpy():
            return np.ndarray.reshape(self, *shape, **kwargs)
        try:
            return np.ndarray.reshape(self, *shape)
        except (ValueError, TypeError):
            return _method("reshape", self, *shape)  # (the verb's sentence for sizes that do not fit)

    def repeat(self, *sizes, **kwargs):
        if "axis" in kwargs or _called_by_numpy():  # (np.repeat(h, 2): numpy's)
            return np.ndarray.repeat(np.asarray(self), *sizes, **kwargs).view(HostTensor)
        return _method("repeat", self, *sizes, **kwargs)

    def transpose(self, *dims, **named):
        if _called_by_numpy():
            return np.ndarray.transpose(self, *dims)
        if named and set(named) <= {"dim0", "dim1"}:  # (torch's keywords: transpose(x, dim0=0, dim1=1))
            dims = dims + tuple(named[k] for k in ("dim0", "dim1") if k in named)
        elif named:
            return _method("transpose", self, *dims, **named)  # (its sentence)
        if len(dims) == 2 and all(isinstance(d, (int, np.integer)) for d in dims):
            from .verbs.core import canon_dim

            a, b = (canon_dim(d, self.ndim, "transpose") for d in dims)
            return np.swapaxes(self, a, b) if self.ndim >= 2 else self[...]
        return np.ndarray.transpose(np.asarray(self), *dims).view(HostTensor)  # (numpy's np.transpose)

    def flatten(self, *args, **kwargs):
        if args and isinstance(args[0], str) or "order" in kwargs or _called_by_numpy():
            return np.ndarray.flatten(np.asarray(self), *args, **kwargs).view(HostTensor)
        return _viewed(self, "flatten", lambda start_dim=0, end_dim=-1: self._flat_shape(start_dim, end_dim),
                       args, kwargs, lambda shape: np.ndarray.reshape(self, shape))

    def _flat_shape(self, start_dim, end_dim):
        from .verbs.core import canon_dim

        a, b = canon_dim(start_dim, self.ndim, "flatten"), canon_dim(end_dim, self.ndim, "flatten")
        if a > b:
            raise ValueError("flatten")  # (the verb's sentence)
        return (1,) if self.ndim == 0 else self.shape[:a] + (int(np.prod(self.shape[a:b + 1])),) + self.shape[b + 1:]

    # ---- torch's views: the result shares this tensor's memory (numpy's view where numpy makes one) ----
    def t(self):
        if self.ndim > 2:
            return _method("t", self)  # (its sentence: torch's t() takes at most 2 dims)
        return np.swapaxes(self, 0, 1) if self.ndim == 2 else self[...]

    def expand(self, *sizes):
        sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
        return _viewed(self, "expand", lambda *s: self._expanded(s), sizes, {}, self._broadcast)

    def _broadcast(self, shape):
        """A view of `shape` over this tensor's memory, a stride of 0 where it repeats (writable, as
        torch's expand: a fill writes each element once per place it appears)."""
        lead = len(shape) - self.ndim
        strides = [0] * lead + [0 if n == 1 and m != 1 else st for n, m, st in
                                zip(self.shape, shape[lead:], self.strides)]
        return np.lib.stride_tricks.as_strided(self, shape, strides, subok=True, writeable=self.flags.writeable)

    def _expanded(self, sizes):
        lead = len(sizes) - self.ndim
        if lead < 0 or any(not isinstance(n, (int, np.integer)) or isinstance(n, bool) for n in sizes) or \
                any(n == -1 for n in sizes[:lead]):
            raise ValueError("expand")
        shape = tuple(self.shape[i - lead] if n == -1 else int(n) for i, n in enumerate(sizes))
        if np.broadcast_shapes(self.shape, shape) != shape:  # (a dim of more than 1 that would change)
            raise ValueError("expand")
        return shape

    def is_complex(self):
        return self.dtype.kind == "c"

    def unfold(self, dimension, size, step):  # (torch's: a view of the windows, numpy's strides over the same memory)
        from .verbs.core import canon_dim
        from .verbs.positions import unfold_layout

        if self.ndim == 0 or not all(isinstance(v, (int, np.integer)) for v in (dimension, size, step)):
            return _method("unfold", self, dimension, size, step)
        d = canon_dim(dimension, self.ndim, "unfold")
        if size < 0 or step < 1 or size > self.shape[d]:
            return _method("unfold", self, dimension, size, step)  # (its sentence)
        shape, strides = unfold_layout(self.shape, self.strides, d, size, step)
        return np.lib.stride_tricks.as_strided(self, shape, strides, writeable=self.flags.writeable).view(HostTensor)

    def expand_as(self, other):
        return self.expand(*np.shape(other))

    def view_as(self, other):
        return self.view(*np.shape(other))

    def type_as(self, other):
        return self if np.asarray(other).dtype == self.dtype else _method("type_as", self, other)

    def select(self, dim, index):
        from .verbs.shape import selected

        d, i = selected(self, dim, index)
        return self[(slice(None),) * d + (i, Ellipsis)]  # (... keeps a 0-d result a view, as torch's)

    def split(self, split_size_or_sections, dim=0):
        from .verbs.shape import split_sizes

        d, sizes = split_sizes(self, split_size_or_sections, dim)
        starts = np.cumsum([0] + list(sizes))
        return tuple(self[(slice(None),) * d + (slice(int(a), int(a) + n),)] for a, n in zip(starts, sizes))

    def tensor_split(self, indices_or_sections=None, dim=0, **given):
        from .verbs.shape import tensor_split_bounds, tensor_split_cut

        d, bounds = tensor_split_bounds(self, tensor_split_cut(indices_or_sections, given), dim)
        return tuple(self[(slice(None),) * d + (slice(a, b),)] for a, b in bounds)

    def chunk(self, chunks, dim=0):
        from .verbs.shape import chunk_size

        d, size = chunk_size(self, chunks, dim)
        return self.split(size, d) if size else (self[(slice(None),) * d + (slice(0, 0),)],) * int(chunks)

    def unbind(self, dim=0):
        from .verbs.core import canon_dim, needs_a_dim

        needs_a_dim(self, "unbind")
        d = canon_dim(dim, self.ndim, "unbind")
        return tuple(self.select(d, i) for i in range(self.shape[d]))

    def movedim(self, source, destination):
        from .verbs.shape import movedim_order

        order = movedim_order(self, source, destination)
        return np.transpose(self, order) if self.ndim else self[...]

    moveaxis = movedim

    def swapdims(self, dim0, dim1):
        return self.transpose(dim0, dim1)

    def diagonal(self, offset=0, dim1=0, dim2=1, **numpy_names):
        from .verbs.core import canon_dim

        if numpy_names or _called_by_numpy():  # (np.diagonal(h, axis1=...), np.trace: numpy's)
            return np.ndarray.diagonal(self, offset, numpy_names.get("axis1", dim1), numpy_names.get("axis2", dim2))

        if self.ndim < 2 or canon_dim(dim1, self.ndim, "diagonal") == canon_dim(dim2, self.ndim, "diagonal"):
            return _method("diagonal", self, offset, dim1, dim2)  # (its sentence)
        view = np.ndarray.diagonal(self, offset, dim1, dim2)
        view.flags.writeable = self.flags.writeable  # (numpy's is read-only; torch's writes through)
        return view

    def stride(self, dim=None):  # (torch's, in elements: numpy's byte strides over the element size)
        st = tuple(s // self.itemsize for s in self.strides)
        if dim is None:
            return st
        from .verbs.core import canon_dim

        return st[canon_dim(dim, self.ndim, "stride")]

    def is_contiguous(self, memory_format=None):
        from .tensor import contiguous

        return contiguous(self.shape, self.stride())

    def element_size(self):
        return self.itemsize

    def trace(self, *args, **numpy_names):  # (torch's: a 0-d tensor of the diagonal's sum; numpy's calls, numpy's)
        if args or numpy_names or _called_by_numpy():
            return np.ndarray.trace(self, *args, **numpy_names)
        return _method("trace", self)

    def to(self, *args, **kwargs):
        from .dtypes import DType, as_dtype

        given = list(args) + ([kwargs["dtype"]] if "dtype" in kwargs else [])
        devices = all(a is None or isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda", "mps") for a in given)
        own = [a for a in given if isinstance(a, DType) or str(a).startswith("torch.")]
        same = len(own) == len(given) == 1 and as_dtype(own[0]).name != "bfloat16" and \
            as_dtype(own[0]).np_storage == self.dtype
        if (devices or same) and not kwargs.get("copy") and set(kwargs) <= {"dtype", "device", "non_blocking"}:
            return self  # (a device, or this tensor's own type: torch's to() is the tensor itself)
        return _method("to", self, *args, **kwargs)

    def __getitem__(self, index):
        if _holds_traced((index,)):  # (Xtr[ix] in a trace, ix traced: a gather from the trace's constant)
            from .verbs.core import as_tensor

            return as_tensor(self)[index]
        try:
            out = np.ndarray.__getitem__(self, index)
        except IndexError as e:
            raise _out_of_range(e) from None
        except TypeError:
            return run(operator.getitem, (self, index), {})  # (the traced index's sentence: x[:, :2.5])
        return np.asarray(out).view(HostTensor) if isinstance(out, np.generic) else out  # (h[1, 2]: 0-d, as torch's)

    # torch's views share their tensor's memory, as numpy's views do: an in-place step reaches both
    def squeeze(self, dim=None, **kwargs):
        from .verbs.core import canon_dim

        dim = kwargs.pop("axis", dim)
        given = range(self.ndim) if dim is None else \
            [canon_dim(d, self.ndim, "squeeze") for d in (dim if isinstance(dim, (tuple, list)) else (dim,))]
        dims = tuple(d for d in given if self.ndim and self.shape[d] == 1)  # (a 0-d tensor's dim 0: nothing)
        return np.ndarray.squeeze(self, axis=dims) if dims else self[...]

    def unsqueeze(self, dim):
        from .verbs.core import canon_dim

        return np.expand_dims(self, canon_dim(dim, self.ndim + 1, "unsqueeze"))

    def permute(self, *dims):
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        try:
            return np.transpose(self, dims)
        except (ValueError, TypeError):
            return _method("permute", self, *dims)  # (the verb's sentence for dims that do not fit)

    @property
    def mT(self):
        if self.ndim < 2:
            from .tensor import fail

            fail(f"mT: a tensor of {self.ndim} dims has no last two to swap; give one of at least 2 dims")
        return np.swapaxes(self, -2, -1)

    def narrow(self, dim, start, length):
        from .verbs.shape import narrowed

        d, start, length = narrowed(self, dim, start, length)
        index = [slice(None)] * self.ndim
        index[d] = slice(start, start + length)
        return self[tuple(index)]

    def unflatten(self, dim, sizes):
        from .verbs.core import canon_dim, needs_a_dim

        needs_a_dim(self, "unflatten")
        d = canon_dim(dim, self.ndim, "unflatten")
        shape = (*self.shape[:d], *sizes, *self.shape[d + 1:])
        if self.flags.c_contiguous:
            return self.view(*shape)
        try:  # (splitting one dim is a view of any layout, as torch's: numpy's reshape views it)
            np.broadcast_to(np.empty((), np.bool_), self.shape).reshape(shape)
        except (ValueError, TypeError):
            return _method("unflatten", np.ascontiguousarray(self).view(HostTensor), dim, sizes)  # (its sentence)
        return np.ndarray.reshape(self, shape).view(HostTensor)

    def detach(self):
        return self[...]

    def backward(self, *args, **kwargs):
        from .tensor import BACKWARD_SENTENCE, user_location

        raise MicaError(BACKWARD_SENTENCE, user_location())

    @property
    def requires_grad(self):
        return False

    @property
    def is_leaf(self):  # (torch's: a tensor no operation recorded made)
        return True

    @property
    def grad(self):
        """torch's .grad: None, but for the value of a tensor retain_grad() was called on in a
        compiled step (makemore's `layer.out.grad`): the gradient its backward() kept."""
        return self.__dict__.get("_mica_grad")

    @grad.setter
    def grad(self, value):
        self.__dict__["_mica_grad"] = value

    @requires_grad.setter
    def requires_grad(self, value):  # (makemore's `for p in parameters: p.requires_grad = True`: a leaf now)
        if value:
            from .tensor import in_trace, user_location

            if in_trace() or self.dtype.kind != "f" or not self.flags.writeable:
                raise MicaError("this host tensor cannot become a leaf in place here (" + (
                    "inside a traced step" if in_trace() else "not a floating tensor" if self.dtype.kind != "f"
                    else "its memory is read-only") + "); make it one where it is made: "
                    "W = mica.nn.Parameter(mica.randn(...)), or mica.randn(..., requires_grad=True)",
                    user_location())
            _make_leaf(self)

    def requires_grad_(self, requires_grad=True):
        self.requires_grad = requires_grad
        return self

    @property
    def data(self):  # (torch's: the tensor itself, without history; numpy's memoryview is np.asarray(h).data)
        return self

    @property
    def device(self):
        return _Device("cpu")

    __hash__ = object.__hash__  # (torch's tensors are hashable by identity: dict keys, sets)

    def __eq__(self, other):
        return False if other is None else np.ndarray.__eq__(self, other)  # (x == None: torch's False)

    def __ne__(self, other):
        return True if other is None else np.ndarray.__ne__(self, other)

    def is_floating_point(self):
        return self.dtype.kind == "f"

    # a one-element tensor is a Python number, whatever its dims (numpy takes 0-d arrays alone)
    def __int__(self):
        return int(self._one("int()"))

    def __float__(self):
        return float(self._one("float()"))

    def __bool__(self):
        return bool(self._one("bool()"))

    def item(self, *args):
        return np.ndarray.item(self, *args) if args else self._one(".item()")

    def _one(self, what):
        if self.ndim and np.ndarray.size.__get__(self) != 1:
            from .tensor import user_location

            raise MicaError(f"{what} takes a tensor of one element, this one has {self.numel():,} ({list(self.shape)}); "
                            "reduce it first (.sum(), .any(), .all()) or pick one element", user_location())
        return np.ndarray.item(self)

    def __setitem__(self, index, value):
        from .tensor import Tensor, user_location

        if isinstance(value, Tensor):
            from .nn.modules import eager_attribute

            kept = eager_attribute(self)  # (a module's attribute, in a forward run eagerly: kept after the run)
            if kept is None:
                raise MicaError(IN_PLACE_FROM_A_TRACE.format(what="x[index] = value"), user_location())
            kept[index] = value
            return
        written(self)
        try:
            np.ndarray.__setitem__(self, index, np.asarray(value) if isinstance(value, HostTensor) else value)
        except IndexError as e:
            raise _out_of_range(e) from None
        except ValueError as e:
            if "broadcast" not in str(e):
                raise
            raise MicaError(f"x[index] = value: {e} (the value must broadcast to the indexed elements' shape)",
                            user_location()) from None

    def nonzero(self, *, as_tuple=False):
        """torch's: the [count, ndim] positions of the nonzero elements (numpy's tuple with
        as_tuple=True, and for numpy's own functions, which call this method: np.nonzero,
        np.flatnonzero, np.argwhere)."""
        found = np.nonzero(np.asarray(self))
        if as_tuple or _called_by_numpy():
            return tuple(host(i.astype(np.int64)) for i in found)
        return host(np.stack(found, axis=1).astype(np.int64) if found else np.zeros((1, 0), np.int64))

    def __getattr__(self, name):  # (a torch.Tensor method Mica lacks: its sentence, not numpy's AttributeError)
        if name.startswith("_"):
            raise AttributeError(name)
        from .errors import missing_verb

        raise missing_verb("Tensor.", name, "torch.Tensor.")

    def contiguous(self, memory_format=None):
        return self if self.flags.c_contiguous else self.copy()


def _dim(kwargs):
    """numpy's keyword names (axis, keepdims, ddof; out=None) as torch's (dim, keepdim, correction)."""
    kwargs = dict(kwargs)
    for numpy_name, torch_name in (("axis", "dim"), ("keepdims", "keepdim"), ("ddof", "correction")):
        if numpy_name in kwargs:
            kwargs[torch_name] = kwargs.pop(numpy_name)
    for unset in ("out", "dtype"):
        if unset in kwargs and kwargs[unset] is None:
            kwargs.pop(unset)
    return kwargs


def _numpy_style(kwargs):
    """Keywords only numpy's methods take (torch's take axis= and keepdims= too, with torch's meaning:
    x.std(axis=0) is unbiased, as torch's)."""
    return any(k in kwargs for k in ("out", "ddof", "kind", "order"))


def _called_by_numpy(depth=2):
    """Whether numpy's own code calls this method (np.unique calls ar.sort(), np.nonzero
    ar.nonzero()): numpy's meaning then, whatever the keywords."""
    return sys._getframe(depth).f_globals.get("__name__", "").startswith("numpy")


def _reduction(name):
    def reduce(self, *args, **kwargs):
        if _numpy_style(kwargs) or _called_by_numpy():  # (numpy's np.max / np.sort / np.unique: numpy's meaning)
            return host(getattr(np.ndarray, name)(np.asarray(self), *args, **kwargs))
        return _method(name, self, *args, **_dim(kwargs))
    reduce.__name__ = name
    return reduce


# (numpy's own functions call these methods with numpy's keywords: np.sort(h) is h.sort(axis=...))
for _name in ("sum", "mean", "max", "min", "std", "var", "argmax", "argmin", "sort", "argsort", "cumsum", "cumprod",
              "round", "any", "all", "prod"):
    setattr(HostTensor, _name, _reduction(_name))


def _torch_method(name):
    def method(self, *args, **kwargs):
        from . import pytree
        from .tensor import Tensor, in_trace

        if in_trace() and any(isinstance(x, Tensor) for x in pytree.flatten((args, kwargs))[0]):
            from .dtypes import as_dtype  # (a traced operand: the host tensor is a constant of that trace)
            from .verbs.core import tensor

            return getattr(tensor(np.asarray(self), dtype=as_dtype(np.asarray(self).dtype)), name)(*args, **kwargs)
        return _method(name, self, *args, **kwargs)
    method.__name__ = name
    return method


def _add_torch_methods():
    """Every torch.Tensor method a traced Tensor has and numpy lacks, as a HostTensor method."""
    from .tensor import Tensor, legacy_type_name

    for name in dir(Tensor):
        if name.startswith("_") or hasattr(np.ndarray, name) or name in vars(HostTensor):
            continue
        if callable(getattr(Tensor, name, None)):
            setattr(HostTensor, name, _in_place(name) if name.endswith("_") else _torch_method(name))
    HostTensor.dim = lambda self: self.ndim
    HostTensor.numel = HostTensor.nelement = lambda self: int(np.prod(self.shape, dtype=np.int64))
    HostTensor.clone = lambda self, *a, **k: self.copy()
    HostTensor.cpu = lambda self, *a, **k: self
    HostTensor.cuda = lambda self, *a, **k: self  # (a device, as .to("cuda"): the program's target decides)
    HostTensor.pin_memory = lambda self, *a, **k: self  # (nanoGPT's get_batch: nothing to pin here)
    HostTensor.type = lambda self, dtype=None, **k: (  # (torch's legacy name without a type)
        legacy_type_name(np.asarray(self).dtype.name) if dtype is None else _method("type", self, dtype, **k))
    HostTensor.is_cuda = property(lambda self: False)  # (as its device says)
    HostTensor.numpy = lambda self: np.asarray(self)
    from . import random

    HostTensor.multinomial = lambda self, *a, **k: random.multinomial(self, *a, **k)
    HostTensor.bernoulli = lambda self, *a, **k: random.bernoulli(self, *a, **k)
    from . import histograms

    HostTensor.histc = lambda self, *a, **k: histograms.histc(self, *a, **k)
    HostTensor.histogram = lambda self, *a, **k: histograms.histogram(self, *a, **k)
    HostTensor.normal_ = lambda self, mean=0.0, std=1.0, generator=None: _drawn(
        self, random.normal(mean, std, self.shape, generator=generator))
    HostTensor.uniform_ = lambda self, a=0.0, b=1.0, generator=None: _drawn(
        self, a + (b - a) * random.rand(*self.shape, generator=generator, dtype="float64"))


def _out_of_range(error):
    """numpy's IndexError as Mica's sentence at the user's line (an IndexError too, as torch's)."""
    from .errors import IndexOutOfRange
    from .tensor import user_location

    return IndexOutOfRange(f"indexing: {error}", user_location())


def _same_type_or(name, np_type):
    """torch's conversion `name` (x.float(), ...): the tensor itself where it has that type already."""
    def convert(self):
        return self if self.dtype == np_type else _method(name, self)
    convert.__name__ = name
    return convert


for _name, _np_type in (("float", np.float32), ("double", np.float64), ("half", np.float16), ("long", np.int64),
                        ("int", np.int32), ("bool", np.bool_)):
    setattr(HostTensor, _name, _same_type_or(_name, _np_type))


class _Device(str):
    """torch.device (mica.device): a device's name, `x.device.type`, `.index`, `str(x.device)`. Mica
    keeps it and ignores it (a program's target is lower()'s), as Tensor.to's device."""

    def __new__(cls, type, index=None):  # noqa: A002  (torch's names)
        if isinstance(type, int) and not isinstance(type, bool) and index is None:  # (torch.device(0): cuda:0)
            type, index = "cuda", type
        text = str(type) if index is None else f"{type}:{index}"
        from .tensor import user_location
        from .verbs.core import _DEVICE

        if isinstance(index, bool) or index is not None and (not isinstance(index, int) or index < 0) or \
                not _DEVICE.fullmatch(text):
            raise MicaError(f"device: {text!r} is not a device torch knows; give one such as 'cpu', 'cuda' or "
                            "'cuda:0' (Mica keeps it and ignores it: the target picks the machine)", user_location())
        return super().__new__(cls, text)

    @property
    def type(self):
        return str(self).split(":")[0]

    @property
    def index(self):
        _, _, i = str(self).partition(":")
        return int(i) if i else None

    def __repr__(self):
        return f"device(type='{self.type}'" + (f", index={self.index})" if self.index is not None else ")")

    def __enter__(self):  # (torch's `with torch.device("cuda"):` default device: the target decides here)
        return self

    def __exit__(self, *exc):
        return False


def _viewed(self, name, shape_of, args, kwargs, make):
    """torch's view `name` of a host tensor: numpy's view `make(shape_of(*args, **kwargs))`, or,
    where the arguments do not fit, the verb's own sentence (run traced, which raises it)."""
    try:
        return make(shape_of(*args, **kwargs))
    except (ValueError, TypeError, IndexError):
        return _method(name, self, *args, **kwargs)


def _drawn(self, values):
    written(self)  # (normal_/uniform_: a compiled function that read it as a constant is made again)
    np.copyto(self, np.asarray(values), casting="unsafe")
    return self


IN_PLACE_FROM_A_TRACE = (
    "{what}: a tensor made outside the traced code (a module's attribute, a global) cannot take a traced value "
    "in place, which would not be kept; pass it to the function or forward as an argument (a write into an "
    "argument reaches the caller's tensor), hold running values in a buffer, self.register_buffer(name, tensor) "
    "(a compiled step keeps the buffers it writes, as a KV cache), or return the new value")


def _in_place(name):
    """torch's in-place method: the result written into this array's memory (and so into every
    numpy view of it, as torch's views see it)."""
    def method(self, *args, **kwargs):
        from .tensor import Tensor, user_location

        if any(isinstance(a, Tensor) for a in list(args) + list(kwargs.values())):
            from .nn.modules import eager_attribute

            kept = eager_attribute(self)  # (as x[index] = value above)
            if kept is None:
                raise MicaError(IN_PLACE_FROM_A_TRACE.format(what=name), user_location())
            return getattr(kept, name)(*args, **kwargs)
        _write(self, np.asarray(_method(name, self, *args, **kwargs)), name)
        return self
    method.__name__ = name
    return method


_FILLS = ("fill_", "zero_", "copy_")  # (in-place writes that read nothing of the tensor: an expanded view takes them)


def _write(self, result, name):
    """An in-place result written into `self` as torch writes one: of self's shape (a broadcast may not
    grow it), of a type self can hold (no float into an integer tensor, no number into a bool one),
    into memory that is not an expanded view; else torch's refusal as one sentence."""
    from .dtypes import as_dtype, category
    from .tensor import user_location

    result = np.asarray(result)
    if np.broadcast_shapes(result.shape, self.shape) != self.shape:
        raise MicaError(f"{name}: the result's shape {list(result.shape)} does not fit the tensor's {list(self.shape)} "
                        "it is written into (torch's rule for in-place operations); compute it out of place",
                        user_location())
    if category(as_dtype(result.dtype)) > category(as_dtype(self.dtype)):
        raise MicaError(f"{name}: the result is {result.dtype} and cannot be written into this {self.dtype} tensor "
                        f"(torch's rule); compute it out of place, or convert the tensor first (.float())",
                        user_location())
    if name not in _FILLS and any(st == 0 and n > 1 for st, n in zip(self.strides, self.shape)):
        raise MicaError(f"{name}: more than one element of this tensor (an expanded view) is one place in memory "
                        "(torch refuses it too); write into a .clone() of it", user_location())
    written(self)
    np.copyto(self, result, casting="unsafe")


def _in_torchs_type(plain, inputs, ufunc):
    """The arrays of a binary operator cast to the floating type torch computes it in, where numpy
    would compute in another: an integer beside a float32 (numpy: float64; torch rounds the integers
    to float32 first), a float16 beside a 0-d float32 or float64 tensor in a comparison, a sum or a
    difference (torch rounds the 0-d one to float16 first; a product or quotient keeps it in
    float32, as numpy does). A float16 tensor times a number (or over one) is computed in float32
    with the number in float32, as torch's kernel does (numpy rounds the number to float16 first:
    2**31 overflowed). Numbers stay as they are, and powers are numpy's (an exponent kept wide)."""
    half = any(isinstance(x, np.ndarray) and x.dtype == np.float16 for x in plain)
    if ufunc in (np.multiply, np.true_divide) and len(plain) == 2 and half and \
            any(type(x) in (int, float) for x in (plain if ufunc is np.multiply else plain[1:])):
        try:
            with np.errstate(over="ignore"):  # (a number beyond float32: inf, as torch's)
                return [x.astype(np.float32) if isinstance(x, np.ndarray) else np.float32(float(x)) for x in plain]
        except OverflowError:  # (a number beyond any float: numpy's own refusal, below)
            return plain
    arrays = [x for x in plain if isinstance(x, np.ndarray)]
    if ufunc is np.power or not arrays or len({a.dtype for a in arrays}) == 1 and len(arrays) == len(plain):
        return plain
    want = _promoted(inputs)
    if want is None or want.kind != "f" or want == np.float16 and ufunc not in _LOGICAL and ufunc not in (np.add, np.subtract):
        return plain
    with np.errstate(over="ignore"):  # (a 0-d float32 beyond float16: inf, as torch's)
        return [x.astype(want) if isinstance(x, np.ndarray) and x.dtype != want else x for x in plain]


def _promoted(inputs):
    """The numpy storage type of torch's promotion of an operator's operands (arrays by their
    dims, numbers by their kind), or None for operands torch's types do not cover."""
    from .dtypes import as_dtype
    from .verbs.core import is_scalar, promotion, scalar_dtype

    try:
        return promotion([(None, scalar_dtype(x)) if is_scalar(x) and not isinstance(x, np.ndarray) else
                          (np.ndim(x), as_dtype(np.asarray(x).dtype)) for x in inputs]).np_storage
    except (TypeError, KeyError):
        return None


def _torch_typed(result, inputs, ufunc):
    """numpy's result in torch's type for these operands (a comparison's bool as it is)."""
    r = np.asarray(result)
    if r.dtype.kind not in "biuf" or ufunc in _LOGICAL:
        return result
    arrays = [x for x in inputs if isinstance(x, np.ndarray)]
    if all(a.dtype == r.dtype for a in arrays):
        return result  # (the common case, every tensor of the result's type: torch's type too)
    want = _promoted(inputs)
    if want is None:
        return result
    if r.dtype.kind == "f" and want.kind != "f":
        want = np.dtype(np.float32)  # (int / int, int ** -1.0: the default float)
    with np.errstate(over="ignore"):  # (a float32 result beyond float16's range: inf, as torch's)
        return r if r.dtype == want else r.astype(want)


def torch_text(values, extra=""):
    """How torch prints a tensor: `tensor([[ 0.1257, -0.1321]])`, four decimals (none for whole
    numbers), the element type named where it is not float32, int64 or bool."""
    if values.dtype.kind not in "biufc":  # (text: numpy's own text)
        return np.ndarray.__repr__(values)
    name = values.dtype.name
    shown = values.astype(np.float32) if name == "float16" else values
    parts = np.concatenate([shown.real.ravel(), shown.imag.ravel()]) if shown.dtype.kind == "c" else shown
    whole = shown.dtype.kind not in "fc" or bool(np.all(np.mod(parts[np.isfinite(parts)], 1) == 0))
    body = np.array2string(shown, precision=4, separator=", ", prefix="tensor(", threshold=1000, edgeitems=3,
                           floatmode="maxprec" if whole else "fixed")
    kind = "" if name in ("float32", "int64", "bool", "complex64") and (values.size or name == "float32") \
        else f", dtype=torch.{name}"  # (an empty tensor names any type but the default float's, as torch's)
    size = f", size={tuple(values.shape)}" if values.size == 0 and values.ndim > 1 else ""
    return f"tensor({body}{size}{kind}{extra})"


def host(a):
    """`a` (an array, or a pytree of them) as HostTensors."""
    if isinstance(a, np.ndarray):
        return a.view(HostTensor) if not isinstance(a, HostTensor) else a
    if isinstance(a, np.generic):
        return np.asarray(a).view(HostTensor)
    return _rebuilt(a, host)


_FACTORIES = frozenset(("arange", "linspace", "logspace", "eye", "zeros", "ones", "full", "empty", "tril_indices",
                        "triu_indices"))  # (their first argument is a number: a 0-d host tensor there is one)
_PYTHON_BOOLS = ("allclose", "equal")  # (verbs whose eager result torch gives as a Python bool)


def _method(name, self, *args, **kwargs):
    """torch.Tensor's method `name` on a host tensor: the traced Tensor's method, run eagerly."""
    if isinstance(self, np.ndarray) and self.dtype.kind == "c":
        return _complex_method(name, self, args, kwargs)
    out = run(None, (self,) + args, kwargs, method=name)
    return bool(out) if name in _PYTHON_BOOLS else out


def _complex_method(name, c, args, kwargs):
    """A complex host tensor's method, computed by numpy where Mica's complex tensors have it (the
    traced verbs take real tensors only)."""
    import inspect

    from .tensor import user_location

    forms = {"sum": lambda dim=None, keepdim=False: np.sum(c, axis=dim, keepdims=keepdim),
             "mean": lambda dim=None, keepdim=False: np.mean(c, axis=dim, keepdims=keepdim),
             "cumsum": lambda dim: np.cumsum(c, axis=dim), "exp": lambda: np.exp(c), "conj": lambda: np.conj(c),
             "abs": lambda: np.abs(c), "angle": lambda: np.angle(c)}
    if name not in forms:
        raise MicaError(f"{name} of a complex host tensor is not in Mica: its complex tensors take + - * /, whole "
                        "powers, conj, abs, exp, sum, mean, cumsum, .real, .imag and the shape methods; compute the "
                        "rest on torch.view_as_real(c), its real pairs", user_location())
    try:
        inspect.signature(forms[name]).bind(*args, **kwargs)
    except TypeError as e:
        raise MicaError(f"{name} of a complex tensor: {e}", user_location()) from None
    out = np.asarray(forms[name](*args, **kwargs))
    real = np.float32 if c.dtype == np.complex64 else np.float64
    return host(out.astype(real if out.dtype.kind == "f" else c.dtype))


def run(fn, args, kwargs, method=None):
    """`fn(*args, **kwargs)` (a verb; or with `method`, that method of the first argument) with its
    arrays as inputs of a one-verb program, run on the oracle at float32 precision."""
    from .dtypes import Spec, as_dtype
    from .tensor import user_location

    arrays, given = [], []

    def slot(a):
        if type(a).__name__ == "Parameter":  # (outside a trace: the values it holds, as its operators read it)
            a = a._live("a verb")
        if isinstance(a, np.ndarray) and a.dtype.kind == "c":
            return a  # (complex numbers, rotary frequencies: a constant, lifted where they meet traced values)
        if isinstance(a, np.ndarray) or is_torch_tensor(a):
            given.append(a)  # (where a write into it inside goes: torch's in-place write into an argument)
            arrays.append(_values_of_torch(a) if is_torch_tensor(a) else np.array(a, order="C"))  # (a copy that
            return _Slot(len(arrays) - 1)                                                          # keeps 0-d 0-d)
        return _rebuilt(a, slot)  # (arrays in lists, tuples and dicts too: a KV cache's list of (k, v))

    args, kwargs = [slot(a) for a in args], {k: slot(v) for k, v in kwargs.items()}

    def body(*ts):
        def put(a):
            return ts[a.i] if isinstance(a, _Slot) else _rebuilt(a, put)
        a, k = [put(x) for x in args], {n: put(v) for n, v in kwargs.items()}
        if method is None:
            from .trace import with_writes

            return with_writes(lambda *ts: fn(*a, **k))(*ts)
        attr = getattr(a[0], method)  # (a method, or a property such as mT)
        return attr(*a[1:], **k) if callable(attr) else attr

    specs = []
    for a in arrays:
        try:
            specs.append(Spec(a.shape, as_dtype(a.dtype)))
        except Exception:
            raise MicaError(f"{method or getattr(fn, '__name__', 'a verb')} cannot take an array of {a.dtype}; give "
                            "numbers, bools or floats", user_location()) from None
    try:
        out = _run_eagerly(body, arrays, specs, method or getattr(fn, "__name__", "verb"))
    except MicaError as e:  # (one raised where the oracle runs, an index out of range: at the user's line)
        e.locate(user_location())
        raise
    if method is not None:
        return out
    from .trace import written_back

    return written_back(out, given)


def _rebuilt(a, each):
    """A list, tuple (named too) or dict with `each` applied to its items; anything else as it is."""
    if isinstance(a, dict):
        items = {k: each(v) for k, v in a.items()}
        try:  # (an OrderedDict stays one; a dict type that cannot be made from its items, a plain dict)
            return items if type(a) is dict else type(a)(items)
        except TypeError:
            return items
    if isinstance(a, tuple) and hasattr(a, "_fields"):
        return type(a)(*(each(x) for x in a))
    if isinstance(a, (list, tuple)):
        return type(a)(each(x) for x in a)
    return a


def _run_eagerly(body, arrays, specs, name):
    from . import pytree, reference
    from .trace import trace

    program = trace(body, *specs, name=name)
    seed = 0
    if any(n.op == "rng_key" for n in program.graph.nodes):  # (dropout, as torch's eager: new bits each call)
        from .random import default_generator

        seed = int(default_generator._rng.integers(0, 2 ** 63))
    got = reference.run(program, *arrays, precision="float32", seed=seed)
    leaves, tree = pytree.flatten(got)
    specs = pytree.flatten(program.outputs)[0]
    typed = [np.asarray(a).astype(s.dtype.np_storage, copy=False) if isinstance(a, np.ndarray) and hasattr(s, "dtype")
             else a for a, s in zip(leaves, specs)]  # (each result in its own type: float16 too, as torch's)
    return host(pytree.unflatten(tree, typed))


# numpy's ufunc -> Python's operator, whose traced form says why operands do not fit
_OPERATORS = {np.add: operator.add, np.subtract: operator.sub, np.multiply: operator.mul,
              np.true_divide: operator.truediv, np.floor_divide: operator.floordiv, np.remainder: operator.mod,
              np.power: operator.pow, np.matmul: operator.matmul, np.equal: operator.eq, np.not_equal: operator.ne,
              np.less: operator.lt, np.less_equal: operator.le, np.greater: operator.gt,
              np.greater_equal: operator.ge, np.bitwise_and: operator.and_, np.bitwise_or: operator.or_,
              np.bitwise_xor: operator.xor, np.left_shift: operator.lshift, np.right_shift: operator.rshift}
_UNARY = {np.negative: operator.neg, np.positive: operator.pos, np.invert: operator.invert, np.absolute: abs}
_LOGICAL = {np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal, np.logical_and,
            np.logical_or, np.logical_xor, np.logical_not, np.isnan, np.isinf, np.isfinite, np.signbit}


class _Slot:
    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


def eager(verb):
    """A public verb that, outside a trace, takes host tensors (and numpy arrays) as torch takes
    eager tensors, and gives host tensors."""
    from .tensor import in_trace

    if verb.__name__ in ("tensor", "as_tensor"):  # (data in, a host tensor out: nothing to run)
        from .verbs.core import tensor

        @functools.wraps(verb)
        def make(data, dtype=None, **kwargs):
            if kwargs.pop("requires_grad", False) and not in_trace():  # (torch's leaf tensor: a Parameter)
                return _leaf_parameter(make(data, dtype=dtype, **kwargs))
            if in_trace():
                return verb(data, dtype=dtype, **kwargs)
            if isinstance(data, HostTensor) and dtype is None:
                return data if verb.__name__ == "as_tensor" else data.copy()
            # (torch's as_tensor of an array of its type shares its memory; tensor() copies)
            return host(tensor(data, dtype=dtype, _copy=verb.__name__ != "as_tensor"))
        return make

    @functools.wraps(verb)
    def call(*args, **kwargs):
        if kwargs.get("requires_grad") and not in_trace():  # (torch's leaf tensor: a Parameter, as torch's optimizers
            kwargs.pop("requires_grad")                       # and a compiled step take it)
            return _leaf_parameter(call(*args, **kwargs))
        kwargs.pop("requires_grad", None)
        if verb.__name__ == "one_hot" and not in_trace() and kwargs.get("num_classes", args[1] if len(args) > 1 else -1) \
                == -1 and args and isinstance(args[0], np.ndarray):  # (eager: the classes the data holds, as torch's)
            kwargs["num_classes"] = int(np.max(args[0])) + 1 if np.size(args[0]) else 0
            args = args[:1]
        if in_trace():
            if args and isinstance(args[0], HostTensor) and verb.__name__ not in _FACTORIES and \
                    not _holds_traced(args) and not _holds_traced(kwargs.values()):  # (a host tensor given first, no
                from .verbs.core import as_tensor  # traced one: the trace's constant, as beside one)

                args = (as_tensor(args[0]),) + args[1:]
            return verb(*args, **kwargs)
        if verb.__name__ in _VIEWS and args and isinstance(args[0], HostTensor):  # (views of its memory, as torch's)
            return getattr(args[0], verb.__name__)(*args[1:], **kwargs)
        if _holds_array(args) or _holds_array(kwargs.values()):
            out = run(verb, args, kwargs)
            if verb.__name__ in _PYTHON_BOOLS:  # (torch's allclose and equal: a Python bool)
                return bool(out)
            return args[0] if _asks_inplace(verb, args, kwargs) else out  # (torch's: the input, written)
        return host(verb(*args, **kwargs))
    return call


def _asks_inplace(verb, args, kwargs):
    """Whether this call of an activation or dropout asks inplace=True of a host tensor."""
    import inspect

    if not args or not isinstance(args[0], HostTensor):
        return False
    try:
        bound = inspect.signature(verb).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return False
    return bool(bound.arguments.get("inplace", False))


_VIEWS = ("split", "tensor_split", "chunk", "unbind", "narrow", "select", "diagonal", "movedim", "moveaxis",
          "swapdims", "swapaxes", "transpose", "permute", "squeeze", "unsqueeze", "unflatten",
          "view")  # (the verbs whose host tensor methods give numpy views, as torch's function forms give views)


def from_numpy(ndarray):
    """torch.from_numpy: a host tensor over the array's own memory (a write through either shows in
    both)."""
    if not isinstance(ndarray, np.ndarray):
        from .tensor import user_location

        raise MicaError(f"from_numpy takes a numpy array, got {type(ndarray).__name__}; mica.tensor(data) copies "
                        "other data", user_location())
    return host(ndarray)


def _make_leaf(h):
    """A host tensor made a leaf in place (requires_grad = True): a LeafTensor from now on, whose
    values are a Parameter's (the same memory, which a compiled step writes)."""
    from .dtypes import as_dtype
    from .nn import Parameter

    p = Parameter(np.asarray(h), dtype=as_dtype(h.dtype))
    p._held = np.asarray(h)  # (its memory: a compiled step's new values are written into it in place)
    h.__class__ = LeafTensor
    h.__dict__["_mica_leaf"] = p


_LEAF_OWN = frozenset(("dtype", "shape", "ndim", "size", "flags", "base", "strides", "nbytes", "itemsize",
                       "ctypes", "numpy", "tolist", "item", "dim", "numel", "nelement", "device", "is_cuda",
                       "cpu", "cuda", "pin_memory"))


def _live_of(h):
    """A LeafTensor's Parameter's current Tensor in a torch-style compiled step, else None."""
    return object.__getattribute__(h, "__dict__")["_mica_leaf"]._live()


class LeafTensor(HostTensor):
    """A host tensor that requires a gradient, made so in place (makemore's `for p in parameters:
    p.requires_grad = True`): its values are a Parameter's, in the same memory. Outside a trace it
    is a host tensor whose .grad is the gradient the last compiled step kept; in a torch-style
    compiled step it is the Parameter's current value, for its methods, operators and indexing
    (`p.data += -lr * p.grad` updates it as a Parameter's update does)."""

    def __getattribute__(self, name):
        if name[:1] != "_" and name not in _LEAF_OWN:
            p = object.__getattribute__(self, "__dict__")["_mica_leaf"]
            if name in ("grad", "requires_grad", "is_leaf"):
                return True if name == "is_leaf" else getattr(p, name)
            live = p._live()
            if live is not None:  # (in a compiled step: the Parameter's current Tensor)
                return getattr(live, name) if name != "data" else p.data
        return super().__getattribute__(name)

    def __setattr__(self, name, value):
        if name in ("grad", "requires_grad"):
            return setattr(self.__dict__["_mica_leaf"], name, value)
        if name == "data":
            p = self.__dict__["_mica_leaf"]
            if p._live() is not None:
                p.data = value
            elif value is not self:
                np.copyto(np.asarray(self), np.asarray(value, self.dtype))  # (its memory: the Parameter's too)
            return None
        return super().__setattr__(name, value)

    def __array_finalize__(self, obj):  # (what numpy makes from it, a view or a result: a plain host tensor)
        if "_mica_leaf" not in self.__dict__:
            self.__class__ = HostTensor

    @property
    def _mica_tensor(self):  # (verbs' operands: core._live_parameter reads it)
        live = _live_of(self)
        if live is None:
            raise AttributeError("_mica_tensor")
        return live

    def requires_grad_(self, requires_grad=True):
        self.__dict__["_mica_leaf"].requires_grad = bool(requires_grad)
        return self

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        live = _live_of(self)
        if live is not None and not kwargs.get("out"):
            from .tensor import Tensor

            ops = {np.add: "__add__", np.subtract: "__sub__", np.multiply: "__mul__", np.true_divide: "__truediv__",
                   np.matmul: "__matmul__", np.power: "__pow__"}
            a, b = (_live_of(x) if isinstance(x, LeafTensor) else x for x in inputs) if len(inputs) == 2 else (None,
                                                                                                                None)
            if ufunc in ops and method == "__call__" and isinstance(a, Tensor):
                return getattr(a, ops[ufunc])(b)
        return super().__array_ufunc__(ufunc, method, *inputs, **kwargs)


def _leaf_operator(name):
    def operator(self, *args):
        live = _live_of(self)
        if live is not None:  # (in a compiled step: the Parameter's current Tensor's operator; W -= lr * W.grad
            out = getattr(live, name)(*args)  # written into it, the name staying this leaf, as torch's)
            return self if name.startswith("__i") and out is live else out
        return getattr(HostTensor, name)(self, *args)
    operator.__name__ = name
    return operator


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__pow__", "__rpow__", "__matmul__", "__rmatmul__",
              "__neg__", "__pos__", "__abs__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__",
              "__getitem__", "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__"):
    setattr(LeafTensor, _name, _leaf_operator(_name))
LeafTensor.__hash__ = HostTensor.__hash__


def _leaf_parameter(values):
    """torch's leaf tensor (requires_grad=True): a Parameter of these values, in their own type."""
    from .dtypes import as_dtype
    from .nn import Parameter

    arr = np.asarray(values)
    if arr.dtype.kind != "f":
        raise MicaError(f"only floating tensors can require gradients (torch's rule), got {arr.dtype}")
    return Parameter(arr, dtype=as_dtype(arr.dtype))


def _holds_traced(values):
    """Whether the arguments hold a traced Tensor."""
    from .tensor import Tensor

    return any(isinstance(v, Tensor) or (isinstance(v, (list, tuple)) and _holds_traced(v))
               or (isinstance(v, dict) and _holds_traced(v.values())) for v in values)


def _holds_array(values):
    """Whether the arguments hold values (arrays, torch tensors, or Parameters: the values they hold)."""
    return any(isinstance(v, np.ndarray) or type(v).__name__ == "Parameter" or is_torch_tensor(v)
               or (isinstance(v, (list, tuple)) and _holds_array(v)) or (isinstance(v, dict) and _holds_array(v.values()))
               for v in values)


def is_torch_tensor(x):
    """Whether x is a torch tensor (a caller's argument; torch itself is not imported for it)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "untyped_storage")


def _values_of_torch(t):
    """A torch tensor's values as a numpy array of its own (bfloat16's held as float32, as Mica's)."""
    t = t.detach().cpu()
    return np.array((t.float() if str(t.dtype) == "torch.bfloat16" else t).numpy(), order="C")
