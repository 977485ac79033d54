"""The symbolic Tensor users hold while a function is traced, and the trace context behind it.

A Tensor is a handle to one Value of the graph being built. Verbs called on Tensors append nodes;
in-place methods (`add_`, `mul_`, `x[i] = v`, ...) point the handle at a new Value, so code written
in PyTorch's in-place style stays functional underneath. A view remembers the tensor it views
(link_view), so an in-place step on either points the other, and every other view, at its new
Value as well: torch's shared memory, as values.
"""
import contextlib
import functools
import math
import os
import sys
import weakref

import numpy as np

from . import dtypes
from .errors import MicaError, ShapeError, TraceError
from .ops import OPS

_PKG = os.path.dirname(os.path.abspath(__file__)) + os.sep
_USER_DIRS = (os.path.join(_PKG, "models") + os.sep,)


_PASSED_THROUGH = (os.path.abspath(contextlib.__file__),)  # (`with model.bind(p):` enters Mica through these)


def _is_own(path):
    """Whether path is Mica's own code (not the user's model files under mica/models)."""
    return path.startswith(_PKG) and not path.startswith(_USER_DIRS)


def _is_internal(path):
    """Whether a frame at path is passed over when the user's line is looked for: Mica's own, or
    the standard library's contextlib that `with model.bind(p):` enters Mica through."""
    return _is_own(path) or path in _PASSED_THROUGH


def user_location():
    """(path, line) of the innermost frame that belongs to the user, not to Mica's own verbs."""
    f = sys._getframe(1)
    while f is not None:
        path = f.f_code.co_filename
        if not path.startswith("<") and not _is_internal(os.path.abspath(path)):
            return (path, f.f_lineno)
        f = f.f_back
    return None


class TraceContext:
    """State of one running trace: the graph, the random-stream counter, a location override."""

    def __init__(self, graph):
        self.graph = graph
        self.random_streams = 0
        self.loc_override = None
        self.open = True
        self.grad_enabled = True  # (False under mica.no_grad: what is computed there is detached)

    def loc(self):
        return self.loc_override if self.loc_override is not None else user_location()

    def rng(self):
        """The program's random key input (seed, offset), created on first use."""
        g = self.graph
        if g.rng is None:
            node = g.add("rng_key", (), {}, [((2,), dtypes.int64)], None, cse=False)
            g.rng = node.out
        return Tensor(g.rng, self)

    def next_stream(self):
        self.random_streams += 1
        return self.random_streams - 1


_STACK = []


def current(verb):
    if not _STACK:
        verb = verb if verb.startswith("mica.") else f"mica.{verb}"
        raise TraceError(f"{verb} works on traced Tensors and was called outside a trace; "
                         "call it inside a function given to mica.trace or mica.compile",
                         user_location())
    return _STACK[-1]


def in_trace():
    return bool(_STACK)


def emit(op, inputs, **attrs):
    """Append primitive `op` to the active graph; returns a Tensor, or a tuple for several outputs."""
    ctx = current(op)
    opdef = OPS[op]
    vals = []
    for t in inputs:
        if not isinstance(t, Tensor):
            raise TraceError(f"{op} expects Tensors, got {type(t).__name__}", ctx.loc())
        vals.append(t.value)
    try:
        out_types = opdef.infer([v.spec for v in vals], **attrs)
    except ShapeError as e:
        if e.loc is None:
            raise ShapeError(e.sentence, ctx.loc()) from None
        raise
    node = ctx.graph.add(op, vals, attrs, out_types, ctx.loc())
    outs = tuple(Tensor(v, ctx) for v in node.outputs)
    if not ctx.grad_enabled and op != "detach":  # (torch.no_grad: no gradient flows through what is made here)
        outs = tuple(emit("detach", [o]) if o.dtype.kind == "float" else o for o in outs)
    return outs[0] if len(outs) == 1 else outs


def fail(message):
    """Raise a ShapeError at the user's line."""
    raise ShapeError(message, _STACK[-1].loc() if _STACK else user_location())


def copies(verb):
    """A verb torch always copies for (repeat, flip, roll, cumsum, prod, ...): where the result is
    built from views of an operand (a dim of size 1 reshaped, a 0-d tensor returned as it is), it
    is given as a tensor of its own, so a later in-place step on the operand does not reach it."""
    @functools.wraps(verb)
    def own(*args, **kwargs):
        out = verb(*args, **kwargs)
        if isinstance(out, Tensor) and (out._base is not None or any(out is a for a in (*args, *kwargs.values()))):
            return Tensor(out.value, out._ctx)
        return out
    return own


def takes_axis(verb):
    """torch's `axis=` spelling of a verb's `dim=` (numpy's name, which torch accepts everywhere)."""
    @functools.wraps(verb)
    def with_axis(*args, **kwargs):
        for numpy_name, name in (("axis", "dim"), ("keepdims", "keepdim")):  # (torch takes numpy's names too)
            if numpy_name in kwargs:
                if name in kwargs:
                    fail(f"{verb.__name__}: give {name} or {numpy_name}, not both")
                kwargs[name] = kwargs.pop(numpy_name)
        return verb(*args, **kwargs)
    return with_axis


_QUIET = [0]  # (while views are brought up to date, the verbs that do it record no views of their own)


def row_major(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def strides_of(t):
    """The strides torch would give t over its memory (a view's, from the tensor it views; a
    tensor of its own is row-major): they decide whether a reshape views or copies."""
    return t._strides if t._strides is not None else row_major(t.shape)


def canon_dim_of(t, dim, verb):
    from .verbs.core import canon_dim

    return canon_dim(dim, t.ndim, verb)


def is_contiguous(t):
    return contiguous(t.shape, strides_of(t))


def contiguous(shape, strides):
    """torch's is_contiguous for these element strides: row-major, a dim of size 1 aside."""
    return any(n == 0 for n in shape) or all(a == b for a, b, n in zip(strides, row_major(shape), shape) if n != 1)


def view_strides(old_shape, old_strides, new_shape):
    """torch's computeStride: the strides of `old` viewed as new_shape, or None where its memory
    cannot be read as that shape (torch's view refuses, its reshape copies)."""
    if math.prod(old_shape) == 0 or not old_shape:
        return row_major(new_shape) if math.prod(old_shape) == math.prod(new_shape) else None
    new = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = old_strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[d]
        if d == 0 or (old_shape[d - 1] != 1 and old_strides[d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new[view_d] = view_numel * chunk_base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base = old_strides[d - 1]
                tensor_numel = view_numel = 1
    return tuple(new) if view_d == -1 else None


def _is_complex(o):
    """A complex operand beside a traced Tensor: a traced ComplexTensor, a numpy complex array (a host
    tensor of torch.polar's rotations), a Python complex number."""
    return hasattr(o, "_mica_complex") or isinstance(o, (complex, np.complexfloating)) or \
        (isinstance(o, np.ndarray) and o.dtype.kind == "c")


def _complex(o):
    from .complex import lift

    return lift(o)


def link_view(base, out, forward, inverse, strides=None):
    """Record that `out` views `base`'s memory as torch's view verbs do: `forward(b)` is the view of
    a base b, `inverse(v, b)` the base b with the view's elements replaced by v's, `strides` the
    view's (None: row-major). An in-place step on either then reaches the other (Tensor._rebind)."""
    if isinstance(base, Tensor) and isinstance(out, Tensor) and out is not base and not _QUIET[0]:
        out._base, out._forward, out._inverse, out._strides = base, forward, inverse, strides
        if base._views is None:
            base._views = []
        base._views.append(weakref.ref(out))  # (a view nobody holds any more needs no update)
    return out


def legacy_type_name(name):
    """torch's x.type() for an element type's name: 'torch.FloatTensor', 'torch.LongTensor', ..."""
    return "torch." + {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
                       "int64": "Long", "int32": "Int", "bool": "Bool"}.get(name, name.capitalize()) + "Tensor"


def _trained_parameter(t):
    """The name of the Parameter whose value `t` is in a torch-style compiled step, where that
    Parameter requires a gradient now (torch's leaf that requires grad); else None."""
    from . import stateful

    step = stateful.active()
    p = step.parameter_of(t) if step is not None and step.mode == "trace" else None
    return step.names[id(p)] if p is not None and p.requires_grad and p.dtype.kind == "float" else None


def _through_detach(t):
    """Whether `t` reaches the memory it views through a detach() (torch's .data): a write there
    is not one the gradients record."""
    while t._base is not None:
        if t._forward is F.detach:
            return True
        t = t._base
    return False


def _live_views(t):
    views = [v for v in (r() for r in t._views or ()) if v is not None]
    t._views = [weakref.ref(v) for v in views] or None
    return views


class Tensor:
    """A traced value: static shape and element type, no data until the program runs."""

    # _base: the Tensor this one views in torch (a slice, view, transpose, ...), else None, with
    # _forward and _inverse (link_view); _views: weak references to the views taken of this one
    __slots__ = ("_value", "_ctx", "_base", "_forward", "_inverse", "_views", "_strides", "_buffer", "__weakref__")
    __array_priority__ = 100000  # numpy scalars (and host tensors) on the left defer to Tensor's reflected operators

    def __init__(self, value, ctx):
        self._value = value
        self._ctx = ctx
        self._base = self._forward = self._inverse = self._views = self._strides = None
        self._buffer = None  # (a module buffer's name, read in a trace: a constant, which an in-place op cannot keep)

    @property
    def value(self):
        if not self._ctx.open or not _STACK or _STACK[-1] is not self._ctx:
            raise TraceError("this Tensor belongs to a trace that has finished (or to another trace); "
                             "Tensors cannot be kept between traces — return values instead",
                             user_location())
        return self._value

    def _into(self, result):
        """An in-place arithmetic result written into this tensor: torch refuses one of a higher
        category (a float into an integer tensor, a number into a bool one) where a copy casts."""
        from .dtypes import category

        if category(result.dtype) > category(self.dtype):
            fail(f"an in-place operation's result is {result.dtype.name} and cannot be written into this "
                 f"{self.dtype.name} tensor (torch: result type can't be cast to the desired output type); compute "
                 "it out of place, or convert the tensor first (.float())")
        return self._rebind(result)

    def _rebind(self, other):
        """In-place update: this handle now names `other`'s value (same shape; cast to this type).
        As in torch, the write reaches every handle on the same memory: the tensors this one views
        (each with the view's elements replaced) and every view of them (taken again)."""
        root = self
        while root._base is not None:
            root = root._base
        if root._buffer is not None and hasattr(root._buffer, "written"):
            root._buffer.written()  # (a compiled step's buffer: its state, stateful.py)
        elif root._buffer is not None:
            fail(f"the buffer {root._buffer} is changed in place in a traced function, where a buffer is a "
                 "constant and the change would be lost; compile the torch-style step that calls the model "
                 "(@mica.compile over forward, backward and optimizer.step: the buffers it changes are its state), "
                 "or return the new value")
        leaf = _trained_parameter(root) if self._ctx.grad_enabled and not _through_detach(self) else None
        if leaf is not None:
            fail(f"the parameter {leaf} requires a gradient and is changed in place where gradients are recorded "
                 "(torch: a leaf Variable that requires grad is being used in an in-place operation); change it under "
                 "torch.no_grad(), or compute a new tensor out of place")
        if other.shape != self.shape:
            fail(f"in-place update of a {self._value.spec!r} tensor with a result of shape "
                 f"{list(other.shape)}; in-place results must keep the shape")
        if other.dtype is not self.dtype:
            other = other.to(self.dtype)
        ctx, grad_enabled = self._ctx, self._ctx.grad_enabled
        ctx.grad_enabled = True  # (what follows joins values: it is not the user's computation)
        try:
            keep_history = not grad_enabled and self.dtype.kind == "float"  # (torch.no_grad: the data changes,
            if self._base is None and not self._views:                     # the tensor keeps its own history)
                self._value = (emit("data_update", [self, other]) if keep_history else other).value
                return self
            if not keep_history:
                self._propagate(other)
                return self
            # the memory's owner keeps its history (a view taken under no_grad has none of its own):
            # its new values are a data_update of its old ones, and every view is taken again from them
            root = self
            while root._base is not None:
                root = root._base
            old_root = Tensor(root.value, ctx)
            self._propagate(other)
            root._propagate(emit("data_update", [old_root, Tensor(root.value, ctx)]))
        finally:
            ctx.grad_enabled = grad_enabled
        return self

    def _propagate(self, other):
        """Point this handle at `other`, the tensors it views at theirs with its elements replaced,
        and every other view of them at its view of their new values."""
        _QUIET[0] += 1
        try:
            self._value = other.value
            path, t = {id(self)}, self
            while t._base is not None:  # up: each base takes its view's new elements
                base = t._base
                base._value = t._inverse(t, base).value
                path.add(id(base))
                t = base
            todo = [t]
            while todo:  # down: every other view of the root is taken again from its new base
                u = todo.pop()
                for v in _live_views(u):
                    if id(v) not in path:
                        v._value = v._forward(u).value
                    todo.append(v)
        finally:
            _QUIET[0] -= 1

    # ---- static facts -------------------------------------------------------------------------
    @property
    def shape(self):
        return self._value.shape

    @property
    def dtype(self):
        return self._value.dtype

    @property
    def ndim(self):
        return len(self._value.shape)

    def dim(self):
        return self.ndim

    def size(self, dim=None):
        if dim is None:
            return self.shape
        return self.shape[F.canon_dim(dim, self.ndim, "size")]

    def numel(self):
        return self._value.numel

    def nelement(self):
        return self._value.numel

    def is_complex(self):
        return False  # (a complex tensor in a trace is a mica.complex.ComplexTensor)

    @property
    def real(self):
        return self  # (a real tensor's real part: itself, as torch's)

    def is_floating_point(self):
        return self.dtype.kind == "float"

    @property
    def device(self):  # (torch.device's face, as a host tensor's: the target, not the trace, picks the card)
        from .host import _Device

        return _Device("cpu")

    def __repr__(self):
        return f"Tensor({self._value.spec!r}, %{self._value.id})"

    def __hash__(self):
        return id(self)

    def __len__(self):
        if not self.shape:
            raise TraceError("len() of a 0-d tensor", user_location())
        return self.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TraceError("iteration over a 0-d tensor, as torch refuses it; index a 1-d view (x.reshape(1))",
                             user_location())
        return iter(F.unbind(self, 0))

    def __bool__(self):
        raise TraceError("a traced Tensor has no value while tracing, so it cannot decide an `if` or "
                         "`while`; use mica.where(condition, a, b) to choose between values",
                         user_location())

    def __float__(self):
        raise TraceError("a traced Tensor has no value while tracing, so float()/int()/.item()/.tolist()/.numpy() "
                         "cannot read it; return it from the traced function to see its value", user_location())

    __int__ = __index__ = tolist = numpy = __float__

    def item(self):
        """torch's x.item(): inside a trace, a number the program gives back. Returned from the
        traced function (the char-RNN tutorial's `return output, loss.item()`), it is the call's
        Python number; read while tracing (an `if`, arithmetic with Python numbers), a sentence."""
        if self.numel() != 1:
            raise TraceError(f"a Tensor with {self.numel()} elements cannot be converted to a number (.item() takes "
                             "one element, as torch's)", user_location())
        return Deferred(F.reshape(self, ()))

    @property
    def grad(self):
        """A parameter's gradient in a torch-style compiled step (mica/stateful.py), else None."""
        from . import stateful

        step = stateful.active()
        return None if step is None else step.grad_of(self)

    @grad.setter
    def grad(self, value):  # (p.grad = None in a torch-style step: the gradient dropped)
        from . import stateful

        step = stateful.active()
        if step is None:
            fail("a traced Tensor keeps no gradient; gradients are values a step returns (mica.grad)")
        step.set_grad_of(self, value)

    def retain_grad(self):
        """torch's: this non-leaf tensor's gradient is kept by the next backward() (t.grad in a
        torch-style compiled step; a plain object's attribute or a global holding it keeps it after
        the call, makemore's `layer.out.grad`); elsewhere there is no backward() to keep it."""
        from . import stateful

        step = stateful.active()
        if step is not None:
            step.retain(self)

    @property
    def retains_grad(self):
        from . import stateful

        step = stateful.active()
        return step is not None and any(t is self for t in step.retained)

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        from . import stateful

        if stateful.active() is None:
            from .trace import _TORCH_FORM

            raise TraceError(NOTHING_TO_DIFFERENTIATE if _TORCH_FORM else BACKWARD_SENTENCE, user_location())
        if gradient is not None or create_graph or inputs is not None:
            fail("backward() in a compiled step takes a scalar loss alone (no gradient=, create_graph=, inputs=)")
        return stateful.backward(self, retain_graph)

    # torch's in-place draws, inside a trace the program's own (the rand primitive, keyed as dropout's):
    # timm's drop_path, `x.new_empty(shape).bernoulli_(keep_prob)`
    def bernoulli(self, p=None, generator=None):
        from .random import bernoulli

        return bernoulli(self, p, generator)

    def bernoulli_(self, p=0.5, generator=None):
        from .random import bernoulli

        probs = F.as_tensor(p, self.dtype) if isinstance(p, Tensor) else F.full(self.shape, float(p), dtype=self.dtype)
        if probs.shape != self.shape:
            probs = F.expand(probs, self.shape)
        return self.copy_(bernoulli(probs, None, generator))

    def uniform_(self, a=0.0, b=1.0, generator=None):
        from .random import _traced
        from .verbs.nn import uniform_draw

        _traced("Tensor.uniform_", generator)
        return self.copy_(uniform_draw(self.shape, self.dtype, "uniform_") * (b - a) + a)

    def normal_(self, mean=0.0, std=1.0, generator=None):
        from .random import _traced
        from .verbs.nn import normal_draw

        _traced("Tensor.normal_", generator)
        return self.copy_(normal_draw(self.shape, self.dtype, "normal_") * std + mean)

    def __getattr__(self, name):  # (only for names Tensor lacks: a method torch.Tensor has and Mica does not)
        if name.startswith("_"):
            raise AttributeError(name)
        if name in ("random_", "exponential_", "multinomial"):
            from .random import _rng

            _rng(f"Tensor.{name}", None)  # (a random draw in a traced step: its sentence)
        from .errors import missing_verb

        raise missing_verb("Tensor.", name, "torch.Tensor.")

    # numpy on a traced Tensor: one sentence, not a silent trace of every element (or a value it has not)
    def __array__(self, *args, **kwargs):
        raise TraceError("a traced Tensor has no value while tracing, so numpy cannot read it; use mica's verbs "
                         "on it (mica.exp, x.sum(), ...), or return it from the traced function", user_location())

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        name = getattr(ufunc, "__name__", "ufunc")
        verb = _OPERATOR_UFUNCS.get(name)
        if verb in ("add", "sub", "mul", "div") and method == "__call__" and not kwargs and len(inputs) == 2 and \
                any(_is_complex(x) for x in inputs):  # (a complex host tensor beside a Tensor: complex)
            import operator

            a, b = (_complex(x) if _is_complex(x) else x for x in inputs)
            return getattr(operator, {"div": "truediv"}.get(verb, verb))(a, b)
        if verb and method == "__call__" and not kwargs:  # a numpy scalar beside a Tensor: its operator
            from .host import HostTensor  # (a host tensor beside a traced one: a constant, as torch's)

            scalar = (lambda x: isinstance(x, np.generic) or (isinstance(x, np.ndarray) and x.ndim == 0
                                                               and not isinstance(x, HostTensor)))
            return getattr(F, verb)(*(x.item() if scalar(x) else x for x in inputs))
        raise _numpy_refused(name)

    def __array_function__(self, func, types, args, kwargs):
        raise _numpy_refused(getattr(func, "__name__", "function"))

    def __setitem__(self, index, value):  # (x[i] = v, and x[i] += v, which Python ends with an assignment)
        F.setitem(self, index, value)

    # x += y is in place, as torch's: a tensor other names hold (an alias, a view) sees it
    def __iadd__(self, o): return self.add_(o)
    def __isub__(self, o): return self.sub_(o)
    def __imul__(self, o): return self.mul_(o)
    def __itruediv__(self, o): return self.div_(o)

    # x // y and x % y are torch's floor_divide and remainder (Python's rounding, on every element)
    def __floordiv__(self, o): return F.floor_divide(self, o)
    def __rfloordiv__(self, o): return F.floor_divide(o, self)
    def __mod__(self, o): return F.remainder(self, o)
    def __rmod__(self, o): return F.remainder(o, self)
    def __divmod__(self, o): return F.floor_divide(self, o), F.remainder(self, o)
    def __rdivmod__(self, o): return F.floor_divide(o, self), F.remainder(o, self)
    def __ifloordiv__(self, o): return self._into(F.floor_divide(self, o))
    def __imod__(self, o): return self._into(F.remainder(self, o))

    # ---- arithmetic ---------------------------------------------------------------------------
    def __add__(self, o): return _complex(o).__radd__(self) if _is_complex(o) else F.add(self, o)
    def __radd__(self, o): return _complex(o).__add__(self) if _is_complex(o) else F.add(o, self)
    def __sub__(self, o): return _complex(o).__rsub__(self) if _is_complex(o) else F.sub(self, o)
    def __rsub__(self, o): return _complex(o).__sub__(self) if _is_complex(o) else F.sub(o, self)
    def __mul__(self, o): return _complex(o).__rmul__(self) if _is_complex(o) else F.mul(self, o)
    def __rmul__(self, o): return _complex(o).__mul__(self) if _is_complex(o) else F.mul(o, self)
    def __truediv__(self, o): return _complex(o).__rtruediv__(self) if _is_complex(o) else F.div(self, o)
    def __rtruediv__(self, o):  # (torch's s / x for a number s: x.reciprocal() * s, as its Tensor.__rdiv__)
        if _is_complex(o):
            return _complex(o).__truediv__(self)
        return F.mul(F.reciprocal(self), o) if F.is_scalar(o) else F.div(o, self)
    def __pow__(self, o): return F.pow(self, o)
    def __rpow__(self, o): return F.pow(o, self)
    def __matmul__(self, o): return F.matmul(self, o)
    def __rmatmul__(self, o): return F.matmul(o, self)
    def __neg__(self): return F.neg(self)
    def __pos__(self): return self
    def __abs__(self): return F.abs(self)
    def __lt__(self, o): return F.lt(self, o)
    def __le__(self, o): return F.le(self, o)
    def __gt__(self, o): return F.gt(self, o)
    def __ge__(self, o): return F.ge(self, o)
    def __eq__(self, o): return F.eq(self, o)
    def __ne__(self, o): return F.ne(self, o)
    def __invert__(self): return F.bitwise_not(self)
    def __and__(self, o): return F.bitwise_and(self, o)
    def __rand__(self, o): return F.bitwise_and(o, self)
    def __or__(self, o): return F.bitwise_or(self, o)
    def __ror__(self, o): return F.bitwise_or(o, self)
    def __xor__(self, o): return F.bitwise_xor(self, o)
    def __rxor__(self, o): return F.bitwise_xor(o, self)
    def __lshift__(self, o): return F.bitwise_left_shift(self, o)
    def __rlshift__(self, o): return F.bitwise_left_shift(o, self)
    def __rshift__(self, o): return F.bitwise_right_shift(self, o)
    def __rrshift__(self, o): return F.bitwise_right_shift(o, self)
    def bitwise_not(self): return F.bitwise_not(self)
    def bitwise_and(self, o): return F.bitwise_and(self, o)
    def bitwise_or(self, o): return F.bitwise_or(self, o)
    def bitwise_xor(self, o): return F.bitwise_xor(self, o)
    def bitwise_left_shift(self, o): return F.bitwise_left_shift(self, o)
    def bitwise_right_shift(self, o): return F.bitwise_right_shift(self, o)
    def __getitem__(self, index): return F.getitem(self, index)

    # ---- in-place forms, as PyTorch's optimizers write them ------------------------------------
    def add_(self, other, alpha=1): return self._into(F.add(self, other, alpha=alpha))
    def sub_(self, other, alpha=1): return self._into(F.sub(self, other, alpha=alpha))
    def mul_(self, other): return self._into(F.mul(self, other))
    def div_(self, other, rounding_mode=None): return self._into(F.div(self, other, rounding_mode=rounding_mode))
    def lerp_(self, end, weight): return self._into(F.lerp(self, end, weight))
    def addcmul_(self, t1, t2, value=1): return self._into(F.addcmul(self, t1, t2, value=value))
    def addcdiv_(self, t1, t2, value=1): return self._into(F.addcdiv(self, t1, t2, value=value))
    def clamp_(self, min=None, max=None): return self._into(F.clamp(self, min, max))
    def zero_(self): return self._rebind(F.zeros_like(self))
    def fill_(self, v):  # (v a number, or a 0-d Tensor as torch takes)
        return self._rebind(F.expand(F.reshape(v, ()), self.shape) if isinstance(v, Tensor) else F.full_like(self, v))
    def copy_(self, src): return self._rebind(F.expand(F.as_tensor(src), self.shape))
    def masked_fill_(self, mask, value): return self._rebind(F.masked_fill(self, mask, value))
    def pow_(self, e): return self._into(F.pow(self, e))
    def clamp_min_(self, min): return self._into(F.clamp(self, min=min))
    def clamp_max_(self, max): return self._into(F.clamp(self, max=max))
    def neg_(self): return self._into(F.neg(self))
    def abs_(self): return self._into(F.abs(self))
    def exp_(self): return self._into(F.exp(self))
    def log_(self): return self._into(F.log(self))
    def sqrt_(self): return self._into(F.sqrt(self))
    def rsqrt_(self): return self._into(F.rsqrt(self))
    def tanh_(self): return self._into(F.tanh(self))
    def sigmoid_(self): return self._into(F.sigmoid(self))
    def relu_(self): return self._into(F.relu(self))
    def square_(self): return self._into(F.square(self))
    def floor_(self): return self._into(F.floor(self))
    def ceil_(self): return self._into(F.ceil(self))
    def trunc_(self): return self._into(F.trunc(self))
    def round_(self, decimals=0): return self._into(F.round(self, decimals=decimals))
    def frac_(self): return self._into(F.frac(self))
    def fmod_(self, o): return self._into(F.fmod(self, o))
    def remainder_(self, o): return self._into(F.remainder(self, o))
    def floor_divide_(self, o): return self._into(F.floor_divide(self, o))

    # ---- methods named as torch.Tensor's ------------------------------------------------------
    def add(self, other, alpha=1): return F.add(self, other, alpha=alpha)
    def sub(self, other, alpha=1): return F.sub(self, other, alpha=alpha)
    def mul(self, other): return F.mul(self, other)
    def div(self, other, rounding_mode=None): return F.div(self, other, rounding_mode=rounding_mode)
    def narrow(self, dim, start, length): return F.narrow(self, dim, start, length)
    def select(self, dim, index): return F.select(self, dim, index)
    def movedim(self, source, destination): return F.movedim(self, source, destination)
    def moveaxis(self, source, destination): return F.movedim(self, source, destination)
    def amin(self, dim=(), keepdim=False): return F.amin(self, dim, keepdim)
    def argmin(self, dim=None, keepdim=False): return F.argmin(self, dim, keepdim)
    def eq(self, o): return F.eq(self, o)
    def ne(self, o): return F.ne(self, o)
    def lt(self, o): return F.lt(self, o)
    def le(self, o): return F.le(self, o)
    def gt(self, o): return F.gt(self, o)
    def ge(self, o): return F.ge(self, o)
    def logical_and(self, o): return F.logical_and(self, o)
    def logical_or(self, o): return F.logical_or(self, o)
    def logical_not(self): return F.logical_not(self)
    def logical_xor(self, o): return F.logical_xor(self, o)
    def where(self, condition, other): return F.where(condition, self, other)
    def outer(self, vec2): return F.outer(self, vec2)
    def pow(self, e): return F.pow(self, e)
    def matmul(self, o): return F.matmul(self, o)
    def lerp(self, end, weight): return F.lerp(self, end, weight)
    def addcmul(self, t1, t2, value=1): return F.addcmul(self, t1, t2, value=value)
    def addcdiv(self, t1, t2, value=1): return F.addcdiv(self, t1, t2, value=value)
    def neg(self): return F.neg(self)
    def exp(self): return F.exp(self)
    def log(self): return F.log(self)
    def tanh(self): return F.tanh(self)
    def sqrt(self): return F.sqrt(self)
    def rsqrt(self): return F.rsqrt(self)
    def sin(self): return F.sin(self)
    def cos(self): return F.cos(self)
    def erf(self): return F.erf(self)
    def sigmoid(self): return F.sigmoid(self)
    def relu(self): return F.relu(self)
    def abs(self): return F.abs(self)
    def square(self): return F.square(self)
    def floor(self): return F.floor(self)
    def ceil(self): return F.ceil(self)
    def trunc(self): return F.trunc(self)
    fix = trunc
    def round(self, decimals=0): return F.round(self, decimals=decimals)
    def frac(self): return F.frac(self)
    def fmod(self, o): return F.fmod(self, o)
    def remainder(self, o): return F.remainder(self, o)
    def floor_divide(self, o): return F.floor_divide(self, o)
    def gather(self, dim, index): return F.gather(self, dim, index)
    def take_along_dim(self, indices, dim=None): return F.take_along_dim(self, indices, dim)
    def index_select(self, dim, index): return F.index_select(self, dim, index)
    def topk(self, k, dim=-1, largest=True, sorted=True): return F.topk(self, k, dim, largest, sorted)
    def sort(self, dim=-1, descending=False, stable=False): return F.sort(self, dim, descending, stable)
    def argsort(self, dim=-1, descending=False, stable=False): return F.argsort(self, dim, descending, stable)
    def msort(self): return F.msort(self)
    def cumsum(self, dim, dtype=None): return F.cumsum(self, dim, dtype=dtype)
    def cumprod(self, dim, dtype=None): return F.cumprod(self, dim, dtype=dtype)
    def cumsum_(self, dim, dtype=None): return self._rebind(F.cumsum(self, dim, dtype=dtype))
    def flip(self, *dims): return F.flip(self, dims[0] if len(dims) == 1 and not isinstance(dims[0], int) else dims)
    def fliplr(self): return F.fliplr(self)
    def flipud(self): return F.flipud(self)
    def roll(self, shifts, dims=None): return F.roll(self, shifts, dims)
    def sign(self): return F.sign(self)
    def multinomial(self, *args, **kwargs):
        from .random import _rng

        return _rng("multinomial", None)
    def median(self, dim=None, keepdim=False): return F.median(self, dim, keepdim)
    def unfold(self, dimension, size, step): return F.unfold(self, dimension, size, step)
    def new_tensor(self, data, dtype=None): return F.tensor(data, dtype=dtype or self.dtype)
    def index_put(self, indices, values, accumulate=False): return F.index_put(self, indices, values, accumulate)
    def index_put_(self, indices, values, accumulate=False):
        return F.tensor_index_put(self, tuple(indices), values, accumulate)
    def index_add(self, dim, index, source, alpha=1): return F.index_add(self, dim, index, source, alpha=alpha)
    def index_add_(self, dim, index, source, alpha=1):
        return self._rebind(F.index_add(self, dim, index, source, alpha=alpha))
    def index_copy(self, dim, index, source): return F.index_copy(self, dim, index, source)
    def index_copy_(self, dim, index, source): return self._rebind(F.index_copy(self, dim, index, source))
    def index_fill(self, dim, index, value): return F.index_fill(self, dim, index, value)
    def index_fill_(self, dim, index, value): return self._rebind(F.index_fill(self, dim, index, value))
    def scatter(self, dim, index, src=None, value=None, reduce=None):
        return F.scatter(self, dim, index, src, value, reduce=reduce)
    def scatter_(self, dim, index, src=None, value=None, reduce=None):
        return self._rebind(F.scatter(self, dim, index, src, value, reduce=reduce))
    def scatter_add(self, dim, index, src): return F.scatter_add(self, dim, index, src)
    def scatter_add_(self, dim, index, src): return self._rebind(F.scatter_add(self, dim, index, src))
    def sgn(self): return F.sign(self)
    def isnan(self): return F.isnan(self)
    def isinf(self): return F.isinf(self)
    def isfinite(self): return F.isfinite(self)
    def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False): return F.isclose(self, other, rtol, atol, equal_nan)
    def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        return F.allclose(self, other, rtol, atol, equal_nan)
    def equal(self, other): return F.equal(self, other)
    def any(self, dim=None, keepdim=False): return F.any(self, dim, keepdim)
    def all(self, dim=None, keepdim=False): return F.all(self, dim, keepdim)
    def prod(self, dim=None, keepdim=False, dtype=None): return F.prod(self, dim, keepdim, dtype=dtype)
    def log1p(self): return F.log1p(self)
    def log2(self): return F.log2(self)
    def log10(self): return F.log10(self)
    def expm1(self): return F.expm1(self)
    def sign_(self): return self._into(F.sign(self))
    def log1p_(self): return self._into(F.log1p(self))
    def clamp(self, min=None, max=None): return F.clamp(self, min, max)
    clip = clamp
    def clamp_min(self, min): return F.clamp(self, min=min)
    def clamp_max(self, max): return F.clamp(self, max=max)
    def std(self, dim=None, unbiased=True, keepdim=False, correction=None):
        return F.std(self, dim, unbiased=unbiased, keepdim=keepdim, correction=correction)
    def logsumexp(self, dim, keepdim=False): return F.logsumexp(self, dim, keepdim)
    def mm(self, mat2): return F.mm(self, mat2)
    def bmm(self, mat2): return F.bmm(self, mat2)
    def maximum(self, o): return F.maximum(self, o)
    def minimum(self, o): return F.minimum(self, o)
    def softmax(self, dim): return F.softmax(self, dim)
    def log_softmax(self, dim): return F.log_softmax(self, dim)
    def masked_fill(self, mask, value): return F.masked_fill(self, mask, value)
    def sum(self, dim=None, keepdim=False, dtype=None): return F.sum(self, dim, keepdim, dtype=dtype)
    def mean(self, dim=None, keepdim=False, dtype=None): return F.mean(self, dim, keepdim, dtype=dtype)
    def max(self, dim=None, keepdim=False): return F.max(self, dim, keepdim)
    def min(self, dim=None, keepdim=False): return F.min(self, dim, keepdim)
    def amax(self, dim=(), keepdim=False): return F.amax(self, dim, keepdim)
    def argmax(self, dim=None, keepdim=False): return F.argmax(self, dim, keepdim)
    def var(self, dim=None, unbiased=True, keepdim=False, correction=None):
        return F.var(self, dim, unbiased=unbiased, keepdim=keepdim, correction=correction)
    def norm(self, p="fro", dim=None, keepdim=False): return F.norm(self, p, dim, keepdim)
    def view(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], dtypes.DType):
            raise TraceError("view(dtype) reinterprets bits, which Mica does not do; use .to(dtype)",
                             user_location())
        if not is_contiguous(self):  # (torch's view reads the memory as it lies, or refuses)
            from .verbs.shape import _resolved_shape

            target = _resolved_shape(self, shape)
            if view_strides(self.shape, strides_of(self), target) is None:
                fail(f"view: this tensor's elements ({self._value.spec!r}, a transpose or a strided slice of another) "
                     f"cannot be read as shape {list(target)} without a copy, as in torch; use .reshape(...)")
        return F.reshape(self, *shape)
    def reshape(self, *shape, **named):  # (torch's keyword: x.reshape(shape=(2, 3)))
        if named and (shape or set(named) != {"shape"}):
            fail(f"reshape takes the new shape, as reshape(2, 3), reshape((2, 3)) or reshape(shape=(2, 3)); got "
                 f"{', '.join(named)}")
        return F.reshape(self, *(shape or (named["shape"],)))
    def view_as(self, other): return F.reshape(self, other.shape)
    def reshape_as(self, other): return F.reshape(self, other.shape)
    def flatten(self, start_dim=0, end_dim=-1): return F.flatten(self, start_dim, end_dim)
    def unflatten(self, dim, sizes): return F.unflatten(self, dim, sizes)
    def transpose(self, dim0, dim1): return F.transpose(self, dim0, dim1)
    def swapaxes(self, axis0, axis1): return F.transpose(self, axis0, axis1)
    def swapdims(self, dim0, dim1): return F.transpose(self, dim0, dim1)
    def tensor_split(self, indices_or_sections=None, dim=0, **given):
        return F.tensor_split(self, indices_or_sections, dim, **given)
    def diag_embed(self, offset=0, dim1=-2, dim2=-1): return F.diag_embed(self, offset, dim1, dim2)
    def permute(self, *dims): return F.permute(self, *dims)
    def t(self):
        if self.ndim > 2:
            fail(f"t() takes a tensor of at most 2 dims, got {self.value.spec!r}; use .transpose(dim0, dim1) or .mT")
        return F.transpose(self, 0, 1) if self.ndim == 2 else self
    @property
    def T(self): return F.permute(self, *reversed(range(self.ndim)))
    @property
    def mT(self): return F.transpose(self, -2, -1)
    def contiguous(self, memory_format=None):  # (torch's: itself where its memory is in order, else a copy)
        return self if is_contiguous(self) else Tensor(self.value, self._ctx)
    def clone(self, memory_format=None): return Tensor(self.value, self._ctx)  # (a handle of its own: in-place on it)
    def detach(self): return F.detach(self)

    @property
    def data(self):
        """torch's .data: the tensor detached, sharing its memory (a write through it, old code's
        `p.grad.data.clamp_(-1, 1)`, reaches the tensor and is not one the gradients record)."""
        return F.detach(self)
    def unsqueeze(self, dim): return F.unsqueeze(self, dim)
    def squeeze(self, dim=None): return F.squeeze(self, dim)
    def expand(self, *sizes): return F.expand(self, *sizes)
    def expand_as(self, other): return F.expand(self, other.shape)
    def repeat(self, *sizes): return F.repeat(self, *sizes)
    def repeat_interleave(self, repeats, dim=None): return F.repeat_interleave(self, repeats, dim)
    def split(self, split_size, dim=0): return F.split(self, split_size, dim)
    def chunk(self, chunks, dim=0): return F.chunk(self, chunks, dim)
    def unbind(self, dim=0): return F.unbind(self, dim)
    def to(self, *args, dtype=None, **kwargs): return F.to(self, *args, dtype=dtype, **kwargs)
    def cuda(self, device=None, non_blocking=False): return self  # (a device, as .to("cuda"): the target decides)
    def cpu(self): return self
    def pin_memory(self): return self  # (nanoGPT's get_batch: nothing to pin)
    is_cuda = property(lambda self: False)  # (as its device says: the target, not the trace, picks the card)
    def type(self, dtype=None):  # (torch's: without a type, its legacy name, as 'torch.FloatTensor')
        return legacy_type_name(self.dtype.name) if dtype is None else F.to(self, dtype)
    def type_as(self, other): return F.to(self, other.dtype)
    def float(self): return F.to(self, dtypes.float32)
    def double(self): return F.to(self, dtypes.float64)
    def half(self): return F.to(self, dtypes.float16)
    def bfloat16(self): return F.to(self, dtypes.bfloat16)
    def long(self): return F.to(self, dtypes.int64)
    def int(self): return F.to(self, dtypes.int32)
    def bool(self): return F.to(self, dtypes.bool_)
    def new_zeros(self, *size, dtype=None): return F.zeros(*size, dtype=dtype or self.dtype)
    def new_empty(self, *size, dtype=None): return F.zeros(*size, dtype=dtype or self.dtype)
    def is_contiguous(self, memory_format=None): return is_contiguous(self)
    def stride(self, dim=None):  # (torch's strides over its memory, in elements: a view's those of what it views)
        st = tuple(strides_of(self))
        return st if dim is None else st[canon_dim_of(self, dim, "stride")]
    def element_size(self): return self.dtype.itemsize
    itemsize = property(lambda self: self.dtype.itemsize)
    nbytes = property(lambda self: self.numel() * self.dtype.itemsize)
    def diff(self, n=1, dim=-1, prepend=None, append=None): return F.diff(self, n, dim, prepend, append)
    def logcumsumexp(self, dim): return F.logcumsumexp(self, dim)
    def tril_(self, diagonal=0): return self._into(F.tril(self, diagonal))
    def triu_(self, diagonal=0): return self._into(F.triu(self, diagonal))
    def addmm_(self, mat1, mat2, *, beta=1, alpha=1):
        return self._into(F.addmm(self, mat1, mat2, beta=beta, alpha=alpha))
    def new_ones(self, *size, dtype=None): return F.ones(*size, dtype=dtype or self.dtype)
    def new_full(self, size, value, dtype=None): return F.full(size, value, dtype=dtype or self.dtype)
    def tril(self, diagonal=0): return F.tril(self, diagonal)
    def diagonal(self, offset=0, dim1=0, dim2=1): return F.diagonal(self, offset, dim1, dim2)
    def trace(self): return F.matrix_trace(self)
    def addmm(self, mat1, mat2, *, beta=1, alpha=1): return F.addmm(self, mat1, mat2, beta=beta, alpha=alpha)
    def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
        return F.baddbmm(self, batch1, batch2, beta=beta, alpha=alpha)
    def addbmm(self, batch1, batch2, *, beta=1, alpha=1): return F.addbmm(self, batch1, batch2, beta=beta, alpha=alpha)
    def addmv(self, mat, vec, *, beta=1, alpha=1): return F.addmv(self, mat, vec, beta=beta, alpha=alpha)
    def dot(self, other): return F.dot(self, other)
    def mv(self, vec): return F.mv(self, vec)
    def reciprocal(self): return F.reciprocal(self)
    def xlogy(self, other): return F.xlogy(self, other)
    def logaddexp(self, other): return F.logaddexp(self, other)
    def logit(self, eps=None): return F.logit(self, eps)
    def nan_to_num(self, nan=0.0, posinf=None, neginf=None): return F.nan_to_num(self, nan, posinf, neginf)
    def count_nonzero(self, dim=None): return F.count_nonzero(self, dim)
    def nansum(self, dim=None, keepdim=False, dtype=None): return F.nansum(self, dim, keepdim, dtype)
    def nanmean(self, dim=None, keepdim=False, dtype=None): return F.nanmean(self, dim, keepdim, dtype)
    def hardshrink(self, lambd=0.5): return F.hardshrink(self, lambd)
    def diag(self, diagonal=0): return F.diag(self, diagonal)
    def triu(self, diagonal=0): return F.triu(self, diagonal)


from . import verbs as F  # noqa: E402  (verbs build on Tensor; Tensor's methods call them)

for _name in ("sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin", "var", "std", "norm", "logsumexp",
              "softmax", "log_softmax", "squeeze", "unsqueeze", "any", "all", "prod", "cumsum", "cumprod", "median"):
    setattr(Tensor, _name, takes_axis(getattr(Tensor, _name)))

BACKWARD_SENTENCE = ("Mica computes gradients in a compiled step: put the step (forward, backward(), "
                     "optimizer.step()) in a function under @mica.compile, or write loss, grads = "
                     "mica.value_and_grad(loss_fn)(params, ...) and optimizer.update(params, grads, state) "
                     "(docs/api.md, Optimizers)")


NOTHING_TO_DIFFERENTIATE = (
    "backward(): no tensor this loss is computed from requires a gradient (torch: 'element 0 of tensors does not "
    "require grad'), so the compiled step found nothing to train; make what you train an nn.Parameter or a tensor "
    "made outside the step with requires_grad=True, or take gradients with mica.grad(loss, x)")


def _numpy_refused(name):
    """The sentence for numpy's `name` given a traced Tensor: Mica's verb of that name, if it has one."""
    use = f"mica.{name}" if hasattr(F, name) else "mica's verbs"
    return TraceError(f"numpy's {name} cannot take a traced Tensor; use {use} instead", user_location())


# numpy's ufuncs that are Python operators on a Tensor (np.float32(2) * x arrives as multiply)
_OPERATOR_UFUNCS = {"add": "add", "subtract": "sub", "multiply": "mul", "true_divide": "div", "divide": "div",
                    "power": "pow", "matmul": "matmul", "floor_divide": "floor_divide", "remainder": "remainder",
                    "fmod": "fmod", "negative": "neg", "absolute": "abs", "less": "lt",
                    "less_equal": "le", "greater": "gt", "greater_equal": "ge", "equal": "eq", "not_equal": "ne"}

__all__ = ["Tensor", "TraceContext", "emit", "current", "user_location", "fail", "MicaError"]


class Deferred:
    """x.item() of a traced tensor: its value is known when the program runs, so it may only be
    returned (pytree.py gives the call's Python number in its place); any other use is a sentence."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    def _refuse(self, *args, **kwargs):
        raise TraceError("x.item() inside a traced step has no value while tracing, so Python cannot compute with it, "
                         "compare it or print it there; return it from the step (its value comes back as a Python "
                         "number), or keep computing with the tensor x", user_location())

    __float__ = __int__ = __index__ = __bool__ = __format__ = __add__ = __radd__ = __sub__ = __rsub__ = _refuse
    __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __lt__ = __le__ = __gt__ = __ge__ = __neg__ = _refuse
    __pow__ = __rpow__ = __floordiv__ = __rfloordiv__ = __mod__ = __abs__ = __round__ = _refuse

    def __repr__(self):
        return f"<the number {self.tensor.dtype.name} x.item() gives when the program runs>"
