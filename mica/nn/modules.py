"""Modules as PyTorch writes them, over a functional core.

A Module declares Parameters (shape, element type, initializer) and submodules; it holds no
values. `model.init(seed)` draws initial values (a dict in `named_parameters` order), and inside a
trace `mica.nn.functional_call(model, params, *args)` (or `with model.bind(params):`) makes every
`self.weight` read the traced Tensor for that parameter. Names follow PyTorch's `state_dict()`.
"""
import collections
import collections.abc
import contextlib
import fnmatch
import math

import numpy as np

from .. import dtypes, verbs as F
from ..dtypes import Spec, as_dtype
from ..errors import MicaError
from ..grad import set_grad_enabled
from ..tensor import Tensor, user_location
from ..verbs.core import in_dtype
from . import init as initializers

_BOUND = [{}]  # id(Parameter) -> Tensor, for the innermost bind()
_EAGER = []    # the _Effects of the eager module call being traced (module(x) outside a trace)


def _sizes(shape):
    """A parameter's shape as whole, nonnegative numbers, or torch's refusal as one sentence at the
    user's line (nn.Linear(d, 4 * d * 2 / 3) is a float: torch refuses it, int() would truncate it)."""
    for s in shape:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) or s < 0:
            raise MicaError(f"a parameter's sizes must be whole numbers >= 0, got {s!r} in {tuple(shape)!r} "
                            "(torch refuses it too); compute the size with // or int(...)", user_location())
    return tuple(int(s) for s in shape)


class Parameter:
    """A trainable tensor's declaration: shape, element type and initializer (values live outside)."""

    def __init__(self, data=None, requires_grad=True, *, shape=None, dtype=None, init=None):
        if data is not None:
            arr = np.asarray(data)
            shape = arr.shape
            dtype = dtype or _default_float(arr)
            init = init or initializers.Constant(arr)
        if shape is None:
            raise MicaError("a Parameter needs initial data or a shape")
        self.shape = _sizes(shape)
        self.dtype = as_dtype(dtype or dtypes.float32)
        self.init = init or initializers.zeros()
        self.requires_grad = bool(requires_grad)  # (torch's flag: a torch-style step keeps a frozen one as it is)
        self._names = set()  # (every name named_parameters() gave it: Module.named_parameters)
        from ..random import init_key

        self._init_key = init_key()  # (its initial values' key where nothing else gives them: mica.manual_seed's)

    # torch's `p.data.normal_(...)` in an _init_weights: here it sets the initializer (nothing is drawn
    # until Module.init), as mica.nn.init's functions do. In a torch-style compiled step (mica/stateful.py)
    # a Parameter is its current value: `p.data -= lr * p.grad`, `p.zero_()`, `p * 2` compute on it.
    @property
    def data(self):  # (in a compiled step torch's detached alias of its value, which a write goes through)
        live = self._live()
        return self if live is None else live.detach()

    @data.setter
    def data(self, value):
        if value is self:
            return
        if not F.in_trace():  # (outside a trace: the values it holds from now on)
            self._held = _as_values("p.data = value", "the new data", value, self.shape, self.dtype)
            return
        live = self._live("p.data = value")
        if value is live or getattr(value, "_base", None) is live:  # (p.data += x: written through already)
            return
        with set_grad_enabled(False):  # (torch: new data, the history kept)
            live._rebind(F.as_tensor(value, live.dtype))

    def _live(self, what=None, write=False):
        """Its current Tensor in a torch-style compiled step; for an operator (`what`) outside any
        trace, the values it holds (a host tensor: loaded, trained by such a step, or initial; to
        `write` them, its own copy from then on); in another trace, a sentence."""
        from .. import stateful

        if stateful.active() is not None and F.in_trace():
            return stateful.read(self)
        if what is None:
            return None
        if not F.in_trace():
            from ..host import host

            if write and getattr(self, "_held", None) is None:  # (the initial values, which views given out share)
                self._held = self.initial_value()
            return host(_held(self, min(self._names, default="")))
        raise MicaError(f"{what}: a Parameter is read in a traced function through the params bound to it "
                        "(functional_call, model.bind), or in a torch-style step under @mica.compile")

    def __array__(self, dtype=None, copy=None):  # (np.asarray(W) outside a trace: the values it holds;
        values = np.asarray(self._live("np.asarray"))  # np.array(W) and np.copy(W) a copy, which training
        if dtype is not None:                         # does not change)
            return values.astype(dtype, copy=bool(copy))
        return values.copy() if copy else values

    # Outside a trace these set its initializer, and the values it holds where it holds some (loaded
    # or trained): drawn now from mica's host generator (mica.manual_seed), as torch draws them.
    def normal_(self, mean=0.0, std=1.0):
        if self._live() is not None:
            raise MicaError("normal_ in a compiled step would draw random numbers there; set initial values "
                            "outside it (its initializer, or model.load_state_dict)")
        return initializers.normal_(self, mean, std)

    def uniform_(self, a=0.0, b=1.0):
        if self._live() is not None:
            raise MicaError("uniform_ in a compiled step would draw random numbers there; set initial values "
                            "outside it (its initializer, or model.load_state_dict)")
        return initializers.uniform_(self, a, b)

    def zero_(self):
        live = self._live()
        return initializers.zeros_(self) if live is None else live.zero_()

    def fill_(self, value):
        live = self._live()
        return initializers.constant_(self, value) if live is None else live.fill_(value)

    def __getattr__(self, name):  # (torch.Tensor's methods, on its current value: in a compiled step, or held)
        if name.startswith("_") or F.in_trace() and self._live() is None:
            raise AttributeError(f"'Parameter' object has no attribute {name!r}")
        return getattr(self._live(name, write=name.endswith("_")), name)  # (add_, clamp_: on its own values)

    def __setitem__(self, index, value):  # (p[0] = 1 under no_grad: its values, in a step or held)
        if isinstance(value, Parameter):
            value = value._live("p[...] = Parameter")
        self._live("p[...] = value", write=True)[index] = value

    is_leaf = True  # (torch's: a Parameter is a leaf)

    @property
    def grad(self):
        """In a torch-style compiled step (mica/stateful.py), the gradient backward() accumulated;
        else None (Mica's gradients are values a step returns)."""
        from .. import stateful

        step = stateful.active()
        if step is not None and step.mode == "find":  # (a stand-in of its shape: that trace is never run)
            step.stood_in = True
            step.grads.used(id(self))
            return F.zeros(self.shape, dtype=self.dtype)
        if step is None:  # (outside: the one the last compiled step left, as torch keeps p.grad)
            from ..host import host

            held = getattr(self, "_held_grad", None)
            return None if held is None or F.in_trace() else host(held)
        return step.grads.get(id(self))

    @grad.setter
    def grad(self, value):  # (p.grad = None: makemore's zeroing; outside a step, the gradient it keeps)
        from .. import stateful

        step = stateful.active()
        if step is not None:
            if value is None:
                step.grads.pop(id(self), None)
            else:
                step.grads[id(self)] = value
        elif not F.in_trace():
            self._held_grad = None if value is None else _as_values("p.grad = value", "the gradient", value,
                                                                    self.shape, self.dtype)

    def requires_grad_(self, requires_grad=True):
        self.requires_grad = bool(requires_grad)
        return self

    def __getitem__(self, index):
        """Its current value indexed, as its operators read it (_live): in a compiled step the
        step's, outside a trace the values it holds: nanoGPT's crop_block_size makes a smaller
        Parameter of `wpe.weight[:block_size]` (values held elsewhere, as a params dict, are cropped
        there)."""
        return self._live("indexing")[index]

    def initial_value(self, name=None):
        """Its initial values by its initializer, from its own key (random.init_key: mica.manual_seed's
        seed and its place among the Parameters made since), drawn once per initializer: what an
        eager call and a torch-style step read where no value is bound or loaded. (Module.init(seed)
        draws a functional step's by seed and name instead.)"""
        cached = getattr(self, "_initial", None)
        if cached is None or cached[0] is not self.init:
            key = getattr(self, "_init_key", 0)
            self._initial = (self.init, _drawn(self.init, self, initializers.stream(key, "")))
        return self._initial[1]

    @property
    def ndim(self):
        return len(self.shape)

    def dim(self):
        return self.ndim

    def numel(self):
        return math.prod(self.shape)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    @property
    def spec(self):
        return Spec(self.shape, self.dtype)

    def __repr__(self):  # (outside a trace torch's text of the values it holds; in one, what it is)
        if F.in_trace():
            return f"Parameter({self.spec!r}, init={self.init!r})"
        from ..host import torch_text

        return "Parameter containing:\n" + torch_text(np.asarray(self), ", requires_grad=True" * self.requires_grad)


def _operator(name):
    """A Parameter's operator: its current value's, in a torch-style compiled step."""
    def op(self, *args):
        return getattr(self._live(f"a Parameter's {name}"), name)(*args)
    op.__name__ = name
    return op


def _in_place(dunder, method):
    def op(self, other):  # (p -= lr * p.grad: the value is rebound, the name stays the Parameter)
        if isinstance(other, Parameter):
            other = other._live(f"a Parameter's {dunder}")
        getattr(self._live(f"a Parameter's {dunder}", write=True), method)(other)
        return self
    op.__name__ = dunder
    return op


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__matmul__", "__rmatmul__", "__pow__", "__neg__", "__lt__", "__le__", "__gt__", "__ge__",
              "__float__", "__int__", "__abs__", "__bool__", "__rpow__", "__floordiv__", "__rfloordiv__", "__mod__",
              "__rmod__"):  # (float(p), bool(p) of a one-element Parameter: its value's, as torch's)
    setattr(Parameter, _name, _operator(_name))
for _dunder, _method in (("__iadd__", "add_"), ("__isub__", "sub_"), ("__imul__", "mul_"), ("__itruediv__", "div_")):
    setattr(Parameter, _dunder, _in_place(_dunder, _method))


def _default_float(arr):
    """The element type data becomes: numpy's float64 (its default: np.zeros, Python floats) is the
    default float32, as torch.tensor makes Python floats; float32 and the half types stay."""
    if arr.dtype.kind == "f" and arr.dtype != np.float64:
        return as_dtype(arr.dtype)
    return dtypes.float32


_HOOKS = ("a hook would run once, when the step is traced, not at each call; call the code in forward, or "
          "return the activation from the compiled step")
_TORCH_MODULE_METHODS = {  # torch.nn.Module's methods Mica's lacks, with what to do instead
    **{h: _HOOKS for h in ("register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
                           "register_full_backward_pre_hook", "register_backward_hook")},
    **{h: "Mica's state_dict and load_state_dict take no hooks; convert the dict before or after the call"
       for h in ("register_state_dict_pre_hook", "register_state_dict_post_hook",
                 "register_load_state_dict_pre_hook", "register_load_state_dict_post_hook")},
    "share_memory": "a model's values are numpy arrays a compiled program copies in; nothing is shared",
    "to_empty": "parameters hold no storage until drawn or loaded; drop the line",
    "type": "use .to(dtype), .float(), .half(), .bfloat16() or .double()",
    "compile": "compile the training step with @mica.compile (mica.compile(model) returns the model)",
    "xpu": "Mica's targets are the CPU and NVIDIA cards (mica.compile(..., target='cuda'))",
    "ipu": "Mica's targets are the CPU and NVIDIA cards (mica.compile(..., target='cuda'))",
    "mtia": "Mica's targets are the CPU and NVIDIA cards (mica.compile(..., target='cuda'))",
    "get_extra_state": "Mica's state_dict holds parameters and buffers only",
    "set_extra_state": "Mica's state_dict holds parameters and buffers only",
}


class Module:
    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "training", True)

    # ---- attribute registry, as torch.nn.Module keeps it -------------------------------------------
    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise MicaError(f"{type(self).__name__}.__init__ must call super().__init__() before "
                            "assigning attributes")
        if F.in_trace() and name not in self._parameters and name not in self._modules and _tensor_leaves(value) \
                and (name not in self._buffers or isinstance(value, Tensor)):
            if _EAGER:  # (a forward run eagerly keeps what it assigns: after the run)
                _EAGER[-1].assigned(self, name, value)
                return
            from .. import stateful

            step = stateful.active()
            if step is not None and name in self._buffers and isinstance(value, Tensor):
                step.assign_buffer(self, name, value)  # (a compiled step's buffer: its state, kept after each call)
                return
            if step is not None and name not in self._buffers:  # (a compiled step's: an output, kept after each call)
                step.assign(self, name, value)
                return
        if name in self._parameters and isinstance(value, Tensor) and self._parameters[name] is not None and \
                value is self._parameters[name]._live():  # (m.w -= lr * m.w.grad in a step: written in place,
            return                                         # the name stays the Parameter, as torch's)
        if name in self._parameters and not isinstance(value, Parameter) and value is not None:
            raise MicaError(f"cannot assign a {type(value).__name__} as parameter {name!r} of {type(self).__name__} "
                            "(a mica.nn.Parameter or None expected, as torch's); its values come from init() or "
                            "your params dict")
        if name in self._modules and not isinstance(value, (Module, Parameter)) and value is not None:
            raise MicaError(f"cannot assign a {type(value).__name__} as child module {name!r} of "
                            f"{type(self).__name__} (a mica.nn.Module, a Parameter or None expected, as torch's)")
        if name in self._buffers and not isinstance(value, (Parameter, Module)):
            if value is not None and not hasattr(value, "shape"):
                raise MicaError(f"cannot assign a {type(value).__name__} as buffer {name!r} of {type(self).__name__} "
                                "(an array or tensor, or None, expected, as torch's)")
            self._buffers[name] = None if value is None else _buffer_array(value)  # (still a buffer, as torch's)
            return
        if isinstance(value, Parameter):
            self._forget(name, self._parameters)
            self._parameters[name] = value  # (in its place where it was one: torch's order)
        elif isinstance(value, Module):
            self._forget(name, self._modules)
            self._modules[name] = value
        elif value is None and name in self._parameters:
            self._parameters[name] = None
        elif value is None and name in self._modules:
            self._modules[name] = None
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        if F.in_trace():
            from .. import stateful  # (a torch-style step notes the modules it looks into: their contents key it)

            stateful.touch(self)
        if "_parameters" in d and name in d["_parameters"]:
            p = d["_parameters"][name]
            if p is None:
                return None
            bound = _BOUND[-1].get(id(p))
            if bound is not None:
                if isinstance(bound, np.ndarray) and F.in_trace():  # (held values: a constant of its own type;
                    if _EAGER:                                      # in an eager call, one the forward may write)
                        return _EAGER[-1].parameter(p, bound)
                    return F.tensor(bound, dtype=p.dtype)
                return bound
            from .. import stateful  # (a torch-style step under mica.compile: the step's current value)

            return stateful.read(p, self) if F.in_trace() else p
        if "_modules" in d and name in d["_modules"]:
            return d["_modules"][name]
        if "_buffers" in d and name in d["_buffers"]:
            buf = d["_buffers"][name]
            if not F.in_trace() or buf is None:
                return buf
            if np.iscomplexobj(buf):  # (precomputed rotations, torch.polar's: a constant pair of parts)
                from ..complex import lift

                return lift(buf)
            float_type = d.get("_buffer_float") if np.asarray(buf).dtype.kind == "f" else None
            if _EAGER:  # (an eager call's forward may write it: torch's KV cache; kept after the run)
                return _EAGER[-1].buffer(self, name, lambda: F.tensor(buf, dtype=float_type))
            from .. import stateful

            step = stateful.active()
            if step is not None:  # (a compiled step's: one it writes is its state, an input and an output)
                return step.buffer(self, name, lambda: F.tensor(buf, dtype=float_type))
            constant = F.tensor(buf, dtype=float_type)  # (floats: the default float, or the type .to() gave)
            constant._buffer = f"{type(self).__name__}.{name}"
            return constant
        if name in _TORCH_MODULE_METHODS:  # (torch.nn.Module has it, Mica's does not: a sentence)
            from ..errors import MissingVerbError

            raise MissingVerbError(f"Mica has no nn.Module.{name} (torch.nn.Module.{name}): "
                                   f"{_TORCH_MODULE_METHODS[name]}", user_location())
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __delattr__(self, name):  # (torch's: `del m.fc` removes a submodule, Parameter or buffer)
        for table in (self._parameters, self._modules, self._buffers):
            if name in table:
                del table[name]
                self._non_persistent.discard(name)
                return
        object.__delattr__(self, name)

    def _forget(self, name, keep):
        """The name's other meanings gone before it is given one in table `keep` (a Parameter, a
        module, a buffer: where it was one already it keeps its place, as torch's), as torch's: a plain
        attribute first set to None (Linear's bias=False) must not shadow it."""
        for table in (self.__dict__, self._parameters, self._modules, self._buffers):
            if table is not keep:
                table.pop(name, None)
        if keep is not self._buffers:
            self._non_persistent.discard(name)

    def _new_name(self, verb, name, table):
        """torch's checks of a name given to register_buffer/register_parameter/add_module."""
        if not isinstance(name, str) or not name or "." in name:
            raise MicaError(f"{verb}: the name must be a non-empty string without '.', got {name!r} (torch's rule: "
                            "a dotted name could not be told from a submodule's)", user_location())
        for other, kind in ((self._parameters, "a parameter"), (self._modules, "a submodule"),
                            (self._buffers, "a buffer")):
            if other is not table and name in other:
                raise MicaError(f"{verb}: {type(self).__name__} already has {kind} named {name!r}; delete it first "
                                f"(del module.{name}), as torch requires", user_location())
        taken = self.__dict__.get(name, None) is not None or (name not in self.__dict__ and hasattr(type(self), name))
        if name not in table and taken:  # (an attribute set to None first is the one torch idiom it may replace)
            raise MicaError(f"{verb}: {type(self).__name__} already has an attribute {name!r} (training, forward, a "
                            "value set in __init__); choose another name, as torch requires", user_location())

    def register_buffer(self, name, array, persistent=True):
        """A constant the module reads (numpy values, which a trace reads as mica.tensor does: floats
        as the default float32); a non-persistent one stays out of state_dict(), as torch's."""
        self._new_name("register_buffer", name, self._buffers)
        if F.in_trace() and isinstance(array, Tensor):  # (in a forward, HF's causal mask grown to a longer input:
            if name not in self._buffers:                # a buffer the forward assigns, kept as its writes are)
                self._forget(name, self._buffers)
                self._buffers[name] = np.zeros(array.shape, array.dtype.np_storage)
            setattr(self, name, array)
        else:
            if array is not None and not hasattr(array, "shape"):
                raise MicaError(f"register_buffer: buffer {name!r} must be an array or tensor (or None), got a "
                                f"{type(array).__name__}", user_location())
            self._forget(name, self._buffers)
            self._buffers[name] = None if array is None else _buffer_array(array)
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)

    def register_parameter(self, name, param):
        self._new_name("register_parameter", name, self._parameters)
        if param is None:  # (torch's: a parameter slot that holds None, as Linear's bias=False)
            self._forget(name, self._parameters)
            self._parameters[name] = None
        elif not isinstance(param, Parameter):
            raise MicaError(f"register_parameter: {name!r} must be a mica.nn.Parameter or None, got a "
                            f"{type(param).__name__}", user_location())
        else:
            setattr(self, name, param)

    def add_module(self, name, module):
        self._new_name("add_module", name, self._modules)
        if module is not None and not isinstance(module, Module):
            raise MicaError(f"add_module: {name!r} must be a mica.nn.Module or None, got a {type(module).__name__}",
                            user_location())
        self._forget(name, self._modules)
        self._modules[name] = module

    register_module = add_module

    def get_submodule(self, target):
        """torch's: the submodule at a dotted path ("" is this module), or a sentence."""
        m = self
        for part in target.split(".") if target else []:
            nxt = m._modules.get(part) if isinstance(m, Module) else None
            if nxt is None:
                raise MicaError(f"get_submodule: {type(m).__name__} has no submodule {part!r} (of {target!r})",
                                user_location())
            m = nxt
        return m

    def get_parameter(self, target):
        module, _, name = target.rpartition(".")
        owner = self.get_submodule(module)
        if owner._parameters.get(name) is None:
            raise MicaError(f"get_parameter: {type(owner).__name__} has no parameter {name!r} (of {target!r})",
                            user_location())
        return owner._parameters[name]

    def get_buffer(self, target):
        module, _, name = target.rpartition(".")
        owner = self.get_submodule(module)
        if name not in owner._buffers:
            raise MicaError(f"get_buffer: {type(owner).__name__} has no buffer {name!r} (of {target!r})",
                            user_location())
        return getattr(owner, name)

    # ---- traversal -------------------------------------------------------------------------------
    def named_modules(self, prefix="", memo=None):
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self):
        return (m for _, m in self.named_modules())

    def named_children(self):
        """(name, module) of the direct submodules, each once (a module under two names: the first)."""
        seen = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self):
        return (m for _, m in self.named_children())

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """(name, Parameter) in PyTorch's order; a shared (tied) parameter appears once, under its
        first name, unless remove_duplicate=False; recurse=False: this module's own."""
        seen = set()
        owners = self.named_modules(prefix, memo=None if remove_duplicate else _NoMemo()) if recurse else \
            [(prefix, self)]
        for mprefix, m in owners:
            for name, p in m._parameters.items():
                if p is None or (remove_duplicate and id(p) in seen):
                    continue
                seen.add(id(p))
                full = f"{mprefix}.{name}" if mprefix else name
                p._names.add(full)  # (an optimizer group of Parameter objects finds each by these)
                yield full, p

    def parameters(self, recurse=True):
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        seen = set()
        for mprefix, m in self.named_modules(prefix) if recurse else [(prefix, self)]:
            for name, b in m._buffers.items():
                if b is not None and not (remove_duplicate and id(b) in seen):
                    seen.add(id(b))  # (in a trace, as m.name reads it: a compiled step's state is its input)
                    yield (f"{mprefix}.{name}" if mprefix else name), getattr(m, name) if F.in_trace() else b

    def buffers(self, recurse=True):
        return (b for _, b in self.named_buffers(recurse=recurse))

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        """(Mica's gradients are values a step returns; in a torch-style compiled step, mica/stateful.py,
        the gradients backward() accumulated are dropped.)"""
        from .. import stateful

        if stateful.active() is not None:
            stateful.zero_grad(self.parameters(), set_to_none)
        else:
            stateful.zero_held_grads(self.parameters(), set_to_none)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """torch's: the values (arrays, host tensors, torch tensors) under state_dict()'s keys become
        what the model holds for eager calls outside a trace (a compiled step takes its params as
        arguments: model.state_dict(params)'s values are those)."""
        where = type(self).__name__ + ".load_state_dict"
        given = dict(state_dict)
        prefix = "_orig_mod."  # (a torch.compile'd model's keys: its OptimizedModule holds the model as _orig_mod;
        if given and all(isinstance(k, str) and k.startswith(prefix) for k in given) and \
                not any(k.startswith(prefix) for k, _ in self.named_parameters()):  # mica.compile(model) is the
            # model itself)
            given = {k[len(prefix):]: v for k, v in given.items()}
        expected, used = [], set()
        for mprefix, m in self.named_modules(memo=_NoMemo()):
            for name, p in m._parameters.items():
                key = f"{mprefix}.{name}" if mprefix else name
                if p is None:
                    continue
                expected.append(key)
                if key in given:
                    p._held = _as_values(where, key, given[key], p.shape, p.dtype)
                    used.add(key)
            for name, b in m._buffers.items():
                key = f"{mprefix}.{name}" if mprefix else name
                if b is None or name in m._non_persistent:
                    continue
                expected.append(key)
                if key in given:
                    value = _as_values(where, key, given[key], np.shape(b), None)
                    floating = m.__dict__.get("_buffer_float") if np.asarray(b).dtype.kind == "f" else None
                    value = in_dtype(value, floating) if floating is not None else \
                        value.astype(np.asarray(b).dtype)  # (torch's copy_: the buffer keeps its type, floats cut)
                    m._buffers[name] = _into(b, np.asarray(value, dtype=np.asarray(b).dtype))  # (in its memory)
                    used.add(key)
        missing = [k for k in dict.fromkeys(expected) if k not in used]  # (torch's order, a tie once)
        unexpected = [k for k in given if k not in set(expected)]
        if strict and (missing or unexpected):
            raise MicaError(f"{where}: " + "; ".join(
                part for part in (f"missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}" if missing
                                  else "", f"unexpected {', '.join(unexpected[:4])}"
                                           f"{' ...' if len(unexpected) > 4 else ''}" if unexpected else "") if part)
                + " (torch's keys, model.state_dict()'s); pass strict=False to load what matches", user_location())
        return _IncompatibleKeys(missing, unexpected)

    def apply(self, fn):
        """Call fn on every submodule, then on this module (torch.nn.Module.apply)."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def train(self, mode=True):
        """torch's: this module's flag, then each child's own train(mode) (a child that overrides
        train(), as a frozen sub-network's that stays in eval, is asked, not set)."""
        if not isinstance(mode, bool):
            raise MicaError(f"train(mode): mode is True or False, got {mode!r}", user_location())
        object.__setattr__(self, "training", mode)
        for m in self.children():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def cuda(self, device=None):  # (a device, as .to("cuda"): where a program runs is its target's)
        return self

    def cpu(self):
        return self

    def to(self, dtype=None, *args, **kwargs):
        """torch's Module.to(dtype): floating parameters and buffers take the type, the values they
        hold (loaded, trained or initial) rounded to it; a device (a string) changes nothing."""
        for a in (dtype, *args, kwargs.get("dtype")):
            if a is None or isinstance(a, str) or type(a).__name__ == "device":
                continue
            d = as_dtype(a)
            if d.kind != "float":
                raise MicaError(f"Module.to takes a floating type, as torch's, got {d.name}", user_location())
            for p in self.parameters():
                if p.dtype.kind == "float":
                    p.dtype = d
                    if getattr(p, "_held", None) is not None:
                        p._held = in_dtype(p._held, d)
                    if getattr(p, "_initial", None) is not None and p._initial[0] is p.init:
                        p._initial = (p.init, in_dtype(p._initial[1], d))
            for m in self.modules():
                object.__setattr__(m, "_buffer_float", d)
                for name, b in m._buffers.items():
                    if b is not None and np.asarray(b).dtype.kind == "f":
                        m._buffers[name] = in_dtype(b, d)
        return self

    def float(self):
        return self.to(dtypes.float32)

    def bfloat16(self):
        return self.to(dtypes.bfloat16)

    def half(self):
        return self.to(dtypes.float16)

    def double(self):
        return self.to(dtypes.float64)

    # ---- values ----------------------------------------------------------------------------------
    def param_specs(self):
        """{name: Spec} for every parameter (tied ones once): the parameter pytree's signature."""
        return {n: p.spec for n, p in self.named_parameters()}

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())

    def init(self, seed=0, overrides=None):
        """Initial values {name: array}, drawn by each parameter's initializer from a stream keyed by
        (seed, name). `overrides` maps a name or glob pattern to an initializer."""
        overrides = overrides or {}
        out = {}
        for name, p in self.named_parameters():
            init = p.init
            for pattern, o in overrides.items():
                if name == pattern or fnmatch.fnmatchcase(name, pattern):
                    init = o
            out[name] = _drawn(init, p, initializers.stream(seed, name))
        return out

    def state_dict(self, params=None, *, prefix="", keep_vars=False, destination=None):
        """Every state_dict() key PyTorch would give this module tree (tied parameters under each
        of their names), with values from `params`; without them, the values the model holds for
        eager calls (loaded by load_state_dict, else its initial ones); torch's `prefix` before
        every key, `keep_vars`: the Parameter objects, `destination`: the dict it fills."""
        out = self._state_dict(params, keep_vars)
        out = {prefix + k: v for k, v in out.items()} if prefix else out
        if destination is not None:
            destination.update(out)
            return destination
        return out

    def _state_dict(self, params, keep_vars):
        by_id = {id(p): n for n, p in self.named_parameters()}
        held = params is None
        if held and F.in_trace() and all(p._live() is not None for _, p in self.named_parameters()):
            # (inside a torch-style compiled step: each parameter's current value, detached and sharing it, so
            # an EMA's `ema_v.copy_(...)` through its state_dict() writes the parameter, as torch's)
            params = {n: F.detach(p._live()) for n, p in self.named_parameters()}
            held = False
        elif held:  # (host tensors over the values it holds, as torch's state_dict shares its tensors' memory)
            from ..host import host

            params = {n: host(_held(p, n)) for n, p in self.named_parameters()}
        out = {}
        for mprefix, m in self.named_modules(memo=_NoMemo()):
            for name, p in m._parameters.items():
                if p is not None:
                    out[f"{mprefix}.{name}" if mprefix else name] = p if keep_vars else params[by_id[id(p)]]
            for name, b in m._buffers.items():
                if b is not None and name not in m._non_persistent:
                    out[f"{mprefix}.{name}" if mprefix else name] = getattr(m, name) if F.in_trace() else \
                        host(b) if held else b
        return out

    @contextlib.contextmanager
    def bind(self, params):
        """Make each parameter attribute read params[name]: inside a trace a Tensor; outside one
        (an eager call) the values it runs with."""
        if not isinstance(params, collections.abc.Mapping):
            raise MicaError(f"bind: params must be a dict of the model's parameters by name (as model.param_specs() "
                            f"names them), got {type(params).__name__}; are the trace's specs in the function's "
                            f"argument order?", user_location())
        table = dict(_BOUND[-1])
        for name, p in self.named_parameters():
            if name not in params:
                raise MicaError(f"bind: no value given for parameter {name!r}; give every name model.param_specs() "
                                f"has", user_location())
            table[id(p)] = params[name]
        _BOUND.append(table)
        try:
            yield self
        finally:
            _BOUND.pop()

    def __call__(self, *args, **kwargs):
        if not F.in_trace():  # (torch's eager call, as nanoGPT's generate() makes it: host tensors out)
            return _eager_call(self, args, kwargs)
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise MicaError(f"{type(self).__name__} defines no forward(); define forward(self, ...) as a torch module "
                        "does", user_location())

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            lines.append(f"  ({name}): " + repr(m).replace("\n", "\n  "))
        return "\n".join(lines) + (")" if len(lines) == 1 else "\n)")

    def __dir__(self):  # (torch's: the registered parameters, submodules and buffers too)
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._modules) | set(self._buffers))


def _eager_call(module, args, kwargs):
    """module(*args) outside a trace: the forward traced once and run on the oracle at float32
    precision (host.run), each parameter the value bound to it (bind, functional_call) or else its
    initial value, drawn once (as a torch module holds its initial weights until trained)."""
    from ..host import run

    table, initial = dict(_BOUND[-1]), []
    for name, p in module.named_parameters():
        if id(p) not in table:
            if getattr(p, "_held", None) is None and not isinstance(p.init, initializers.Constant):
                initial.append(name)  # (not one made from data, as crop_block_size's wpe[:n]: it holds those)
            table[id(p)] = _held(p, name)
    if initial and not getattr(module, "_said_initial", False):
        import warnings

        module._said_initial = True  # (once per module: a sampling loop calls it for every token)
        path, line = user_location() or ("<mica>", 0)
        warnings.warn_explicit(
            f"{type(module).__name__} is called outside a trace with no values for {initial[0]}"
            f"{f' and {len(initial) - 1} more' if len(initial) > 1 else ''}: it runs with their initial values "
            "(drawn when it was made, from mica.manual_seed's seed); to run trained ones, call it inside "
            "`with model.bind(params):` or load them "
            "with model.load_state_dict(model.state_dict(params))", UserWarning, path, line)

    for _ in range(64):  # (a write into a plain attribute found while tracing: traced again, it made a Tensor first)
        effects = _Effects(module, user_bound=dict(_BOUND[-1]))

        def call(*a, **k):
            _BOUND.append(table)
            _EAGER.append(effects)
            try:
                effects.begin()
                result = module.forward(*a, **k)
                return {"result": result, "effects": effects.changed()}
            finally:
                _EAGER.pop()
                _BOUND.pop()
        call.__name__ = type(module).__name__
        try:
            out = run(call, args, kwargs)
        except _Again:
            effects.undo()
            continue
        except BaseException:
            effects.undo()
            raise
        effects.keep(out["effects"])
        return out["result"]
    raise MicaError(f"{type(module).__name__}'s forward, called outside a trace, writes into host tensors its modules "
                    "hold in a way Mica cannot follow (in a container it cannot make Tensors of?); keep them as "
                    "buffers (register_buffer) or plain tensor attributes", user_location())


class _Again(BaseException):
    """(an eager call's forward wrote into a plain attribute it reads as a host tensor: traced again
    with that attribute a Tensor from the start, so every read of it, through any name, sees the write)"""


def eager_attribute(x):
    """(host.py, a write of a traced value into the host tensor x) where x is a plain attribute of a
    module the eager call being traced runs, the call is traced again with it a Tensor (_Again);
    else None."""
    if _EAGER:
        _EAGER[-1].attribute(x)
    return None


def _tensor_leaves(value):
    """{position: traced Tensor} of value's leaves (value a Tensor, or a list, tuple or dict holding
    some among other values: `self.stats = {"loss": loss, "n": 3}`); empty where it holds none."""
    return {str(i): x for i, x in enumerate(_leaves(value)) if isinstance(x, Tensor)}


def _with_leaves(value, new):
    """value with the leaves at new's positions replaced by new's values (_tensor_leaves' inverse)."""
    from .. import pytree

    if not isinstance(value, (list, tuple, dict)):
        return new["0"]
    leaves, tree = pytree.flatten(value)
    return pytree.unflatten(tree, [new.get(str(i), x) for i, x in enumerate(leaves)])


def _leaves(value):
    """value's leaves: its own where it is a list, tuple or dict, else [value]."""
    from .. import pytree

    return pytree.flatten(value)[0] if isinstance(value, (list, tuple, dict)) else [value]


def _put_back(m, name, had, before):
    """m.name as it was before a trace assigned it: `before`, or no attribute (had it: whether it was one)."""
    if had:
        object.__setattr__(m, name, before)
    else:
        m.__dict__.pop(name, None)


def _items(container):
    """A copy of a list's or dict's items, which _refill gives back."""
    return list(container) if isinstance(container, list) else dict(container)


def _refill(container, items):
    """A list or dict given back the items _items copied (a trace put Tensors into it)."""
    if isinstance(container, list):
        container[:] = items
    else:
        container.clear()
        container.update(items)


def _plain_attributes(m):
    return [(k, v) for k, v in list(m.__dict__.items()) if not k.startswith("_") and k != "training"]


class _Effects:
    """What a module's forward, traced for an eager call, changes beyond its result, as torch's eager
    forward leaves it: a Parameter or buffer written in place (a KV cache), a plain attribute
    written in place, reassigned, or holding a list or dict whose items the forward replaces
    (Meta's `self.cache_k[:, a:b] = k`, llama2.c's `self.last_loss`, `self.kv[0] = k`). Each
    Parameter and buffer is one Tensor for the whole forward, so a write is seen by later reads;
    a plain attribute the module's forward writes in place is a Tensor from the forward's start
    (found by the first call: traced again). The final values are outputs of the run, written
    after it into the arrays the module holds where they fit (references taken earlier see them,
    as torch's), else in their place; a run that fails leaves the module as it was (undo)."""

    def __init__(self, root, user_bound):
        self.root = root              # the module called
        self.user_bound = user_bound  # id(Parameter) -> the array bind() gave
        self.params = {}     # (id(p), id(values)) -> (p, its Tensor, its first value, the array it was made from)
        self.buffers = {}    # (id(module), name) -> (module, name, its Tensor, its first value or None)
        self.attrs = {}      # (id(module), name) -> (module, name, what it held before: (had it, value))
        self.converted = set()  # (id(module), name) of the plain attributes made Tensors at the forward's start
        self.containers = {}  # (id(module), name) -> (module, name, the list or dict, a copy of its items)

    def begin(self):
        """(in the trace, before forward) Tensors for the plain attributes the modules' forwards write
        in place (_mica_written, found by an earlier call), and copies of the lists and dicts they hold."""
        from .. import pytree
        from ..host import HostTensor, memory_owner

        modules = list(self.root.modules())
        owners = set()  # (the memory of the host tensors some forward writes: every attribute holding one is a Tensor)
        for m in modules:
            written = m.__dict__.get("_mica_written", ())
            for name, v in _plain_attributes(m):
                if isinstance(v, (list, dict)):
                    self.containers[(id(m), name)] = (m, name, v, _items(v))
                if name in written:
                    owners.update(id(memory_owner(x)) for x in _leaves(v) if isinstance(x, HostTensor))
        made = {}  # id(host tensor) -> its Tensor, one for every attribute holding it (a cache two blocks share)
        shapes = {}  # id(its memory) -> the host tensor made a Tensor over it

        def traced(x):
            if id(x) not in made:
                first = shapes.setdefault(id(memory_owner(x)), x)
                if first is not x and (first.shape != x.shape or first.__array_interface__["data"][0] !=
                                       x.__array_interface__["data"][0]):
                    raise MicaError("a forward called outside a trace writes a host tensor that two of its modules' "
                                    "attributes hold as different views of one array; hold the array once (and index "
                                    "it in the forward), or keep it as a buffer", user_location())
                made[id(x)] = F.tensor(np.asarray(x), dtype=as_dtype(np.asarray(x).dtype))
            return made[id(x)]
        for m in modules if owners else ():
            for name, v in _plain_attributes(m):
                leaves = _leaves(v)
                if any(isinstance(x, HostTensor) and id(memory_owner(x)) in owners for x in leaves):
                    # (its host tensors Tensors, its other leaves as they are: {"k": cache, "n": 0})
                    tensors = [traced(x) if isinstance(x, HostTensor) else x for x in leaves]
                    self.assigned(m, name, pytree.unflatten(pytree.flatten(v)[1], tensors)
                                  if isinstance(v, (list, tuple, dict)) else tensors[0])
                    self.converted.add((id(m), name))

    def parameter(self, p, values):
        key = (id(p), id(values))  # (one Tensor per binding: functional_call(m, other) inside reads other's)
        if key not in self.params:
            t = F.tensor(values, dtype=p.dtype)
            self.params[key] = (p, t, t._value, values)
        return self.params[key][1]

    def buffer(self, module, name, make):
        key = (id(module), name)
        if key not in self.buffers:
            t = make()
            self.buffers[key] = (module, name, t, t._value)
        return self.buffers[key][2]

    def assigned(self, module, name, value):
        """module.name = value, traced: a buffer's Tensor is value from now on; an attribute holds it
        (its earlier value remembered for undo)."""
        key = (id(module), name)
        if name in module._buffers:
            self.buffers[key] = (module, name, value, None)
            return
        if key not in self.attrs:
            self.attrs[key] = (module, name, (name in module.__dict__, module.__dict__.get(name)))
        object.__setattr__(module, name, value)

    def attribute(self, x):
        """A write of a traced value into host tensor x: where a module called here holds x (or a list
        or dict of them holding x) as a plain attribute, it is noted as one its forward writes, and the
        call is traced again (_Again)."""
        from .. import pytree
        from ..host import memory_owner

        owner = memory_owner(x)  # (a view of the attribute too: row = self.c[:, pos]; row[:] = x)
        for m in self.root.modules():
            for name, v in _plain_attributes(m):
                leaves = pytree.flatten(v)[0] if isinstance(v, (list, tuple, dict)) else [v]
                if any(isinstance(y, np.ndarray) and memory_owner(y) is owner for y in leaves):
                    for same in self.root.modules():  # (every layer of its kind: Meta's 32 blocks' cache_k at once)
                        if type(same) is type(m) and name in same.__dict__:
                            same.__dict__.setdefault("_mica_written", set()).add(name)
                    raise _Again()

    def changed(self):
        """The run's extra outputs: the Parameters and buffers written, the attributes assigned or
        written, and the Tensors the forward put into the lists and dicts the modules hold."""
        from ..tensor import Tensor

        out = {}
        for i, (p, t, first, _) in enumerate(self.params.values()):
            if t._value is not first:
                out[f"p{i}"] = t
        for i, (m, name, t, first) in enumerate(self.buffers.values()):
            if t._value is not first:
                out[f"b{i}"] = t
        for i, (m, name, _) in enumerate(self.attrs.values()):
            leaves = _tensor_leaves(m.__dict__.get(name))
            if leaves:
                out[f"a{i}"] = leaves
        for i, (m, name, v, _) in enumerate(self.containers.values()):
            items = v.items() if isinstance(v, dict) else enumerate(v)
            put = {str(k): x for k, x in items if isinstance(x, Tensor)}
            if put and m.__dict__.get(name) is v:
                out[f"c{i}"] = put
        return out

    def keep(self, values):
        for i, (p, _, _, read) in enumerate(self.params.values()):
            if f"p{i}" in values:
                new = np.asarray(values[f"p{i}"])
                mine = read is getattr(p, "_held", None) or read is self.user_bound.get(id(p))
                if mine and isinstance(read, np.ndarray) and read.flags.writeable and read.shape == new.shape:
                    np.copyto(read, new, casting="unsafe")  # (the array it read: held or bound, in place as torch's)
                else:
                    p._held = in_dtype(new.astype(np.float64), p.dtype)
        for i, (m, name, _, first) in enumerate(self.buffers.values()):
            if f"b{i}" in values:
                new, old = np.asarray(values[f"b{i}"]), m._buffers.get(name)
                if old is not None and first is not None:  # (written in place: in its memory, its type, as torch's)
                    m._buffers[name] = _into(old, new.astype(np.asarray(old).dtype, copy=False))
                else:  # (reassigned: a new tensor, as torch's; one held before keeps its values)
                    m._buffers[name] = _buffer_array(new)
                m.__dict__.setdefault("_mica_state_buffers", set()).add(name)  # (moved by a forward: an input of a
                # compiled step that reads it, never a constant)
        for i, (m, name, (had, before)) in enumerate(self.attrs.values()):
            key = (id(m), name)
            if f"a{i}" in values:
                now = _with_leaves(m.__dict__.get(name), values[f"a{i}"])
                written_in_place = key in self.converted  # (a reassignment is a new object, as torch's)
                object.__setattr__(m, name, _into_tree(before if had else None, now) if written_in_place else now)
            elif key in self.converted:  # (not written: as it was)
                _put_back(m, name, had, before)
        for i, (m, name, v, _) in enumerate(self.containers.values()):
            for k, x in values.get(f"c{i}", {}).items():
                v[int(k) if isinstance(v, list) else next(j for j in v if str(j) == k)] = x

    def undo(self):
        for m, name, (had, before) in self.attrs.values():
            _put_back(m, name, had, before)
        for _, _, v, items in self.containers.values():
            _refill(v, items)


def _into(old, new):
    """new's values in old's memory where old is a writable host tensor of its shape (references to
    it see them, as torch's in-place writes; its write count moves, so a compiled function that read
    it as a constant is made again), else new as a host tensor."""
    from ..host import HostTensor, written

    if isinstance(old, HostTensor) and old.shape == new.shape and old.flags.writeable:
        written(old)
        np.copyto(old, new, casting="unsafe")
        return old
    return _buffer_array(new)


def _into_tree(old, new):
    """_into over matching lists, tuples and dicts (an attribute's earlier host tensors reused)."""
    from .. import pytree

    from ..host import HostTensor

    if isinstance(old, HostTensor) and isinstance(new, np.ndarray) and old.dtype == new.dtype:
        return _into(old, new)
    if not isinstance(old, (list, tuple, dict)) or not isinstance(new, (list, tuple, dict)):
        return new
    old_leaves, old_tree = pytree.flatten(old)
    new_leaves, new_tree = pytree.flatten(new)
    if len(old_leaves) != len(new_leaves) or repr(old_tree) != repr(new_tree):
        return new
    kept = [_into(o, n) if isinstance(o, HostTensor) and isinstance(n, np.ndarray) and o.dtype == n.dtype else n
            for o, n in zip(old_leaves, new_leaves)]
    if all(k is o or (type(k) in (int, float, str, bool) and type(k) is type(o) and k == o)
           for k, o in zip(kept, old_leaves)):
        return old
    return pytree.unflatten(new_tree, kept)


def _drawn(init, p, stream):
    """An initializer's values for p, in p's element type (bfloat16 ones held in float32, rounded:
    the values the program holds)."""
    return in_dtype(np.asarray(init.sample(p.shape, stream), dtype=np.float64), p.dtype)


def _held(p, name):
    """The values p holds for eager calls: loaded (load_state_dict), else its initial ones."""
    held = getattr(p, "_held", None)
    return held if held is not None else p.initial_value(name)


def _from_torch(value):
    """A torch tensor as numpy (bfloat16 widened to float32, which numpy holds); anything else as given."""
    if type(value).__module__.startswith("torch") and hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu()
        return (value.float() if str(value.dtype) == "torch.bfloat16" else value).numpy()
    return value


def _as_values(where, key, value, shape, dtype):
    arr = np.asarray(_from_torch(value))
    if tuple(arr.shape) != tuple(shape):
        raise MicaError(f"{where}: {key} has shape {list(arr.shape)}, the model's is {list(shape)}", user_location())
    if dtype is None:
        return arr
    return in_dtype(arr, dtype) if dtype.kind == "float" else arr.astype(dtype.np_storage)


_IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def _buffer_array(value):
    from ..host import host

    return host(np.asarray(value))  # (as given: a trace reads a float buffer as the default float, F.tensor)


def _device(device):
    """torch's device= argument: accepted where it names the CPU or a card (Mica places tensors
    itself), else the sentence mica.to gives."""
    if device is not None:
        from ..verbs.core import _device_name

        _device_name(str(device))


class _NoMemo(set):
    """A memo that remembers nothing: walks shared submodules under every name (state_dict)."""

    def add(self, item):
        pass


def functional_call(module, params, *args, **kwargs):
    """Call `module` with its parameters read from `params` ({name: Tensor}, or a tuple of such
    dicts as torch.func's): `functional_call(model, params, x, y)`, or torch.func's form with the
    arguments as one tuple and an optional dict of keyword arguments,
    `functional_call(model, params, (x, y), {"mask": m})`."""
    if isinstance(params, (tuple, list)) and all(isinstance(d, dict) for d in params):
        params = {k: v for d in params for k, v in d.items()}
    if len(args) in (1, 2) and type(args[0]) is tuple and (len(args) == 1 or isinstance(args[1], dict)):
        args, kwargs = args[0], {**(args[1] if len(args) == 2 else {}), **kwargs}  # (torch.func's form)
    with module.bind(params):
        return module(*args, **kwargs)


# ---- the layers ---------------------------------------------------------------------------------------

class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        _device(device)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(shape=(out_features, in_features), dtype=dtype,
                                init=initializers.fan_in_uniform(in_features))
        self.bias = Parameter(shape=(out_features,), dtype=dtype,
                              init=initializers.fan_in_uniform(in_features)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """torch.nn.Embedding: rows drawn from N(0, 1); padding_idx's row starts at 0 and takes no
    gradient. max_norm and scale_grad_by_freq are a sentence (as F.embedding's); sparse gradients
    are torch's storage choice, and sparse=True a sentence."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, _weight=None, _freeze=False, device=None, dtype=None):
        super().__init__()
        _device(device)
        if max_norm is not None or scale_grad_by_freq or sparse:
            raise MicaError("Embedding: max_norm, scale_grad_by_freq and sparse=True are not supported; leave them "
                            "at torch's defaults", user_location())
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise MicaError(f"Embedding: padding_idx {padding_idx} is not a row of {num_embeddings}",
                                user_location())
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        init = initializers.normal() if padding_idx is None else initializers.RowZeroed(initializers.normal(),
                                                                                          padding_idx)
        if _weight is not None:
            init = initializers.Constant(np.asarray(_weight, np.float32))
        self.weight = Parameter(shape=(num_embeddings, embedding_dim), dtype=dtype, init=init)
        if _freeze:
            self.weight.requires_grad_(False)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None, norm_type=2.0,
                        scale_grad_by_freq=False, sparse=False):
        """torch's: an Embedding holding `embeddings` (rows, dim), frozen unless freeze=False."""
        values = np.asarray(embeddings)
        if values.ndim != 2:
            raise MicaError(f"Embedding.from_pretrained takes a 2-d table of rows, got shape {list(values.shape)}",
                            user_location())
        return cls(values.shape[0], values.shape[1], padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                   _weight=values, _freeze=freeze)

    def forward(self, idx):
        return F.embedding(idx, self.weight, self.padding_idx)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}" + (
            f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")


class EmbeddingBag(Module):
    """torch.nn.EmbeddingBag: an Embedding's table (N(0, 1), padding_idx's row zero) whose rows are
    summed, averaged or maxed per bag (F.embedding_bag): bags are a 2-d input's rows, or a 1-d input's
    runs started by offsets, as the torchtext classification tutorial's model gives them."""

    def __init__(self, num_embeddings, embedding_dim, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                 mode="mean", sparse=False, _weight=None, include_last_offset=False, padding_idx=None, device=None,
                 dtype=None):
        super().__init__()
        _device(device)
        if max_norm is not None or scale_grad_by_freq or sparse:
            raise MicaError("EmbeddingBag: max_norm, scale_grad_by_freq and sparse=True are not supported; leave them "
                            "at torch's defaults", user_location())
        if mode not in ("sum", "mean", "max"):
            raise MicaError(f"EmbeddingBag: mode must be 'sum', 'mean' or 'max', got {mode!r}", user_location())
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise MicaError(f"EmbeddingBag: padding_idx {padding_idx} is not a row of {num_embeddings}",
                                user_location())
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.mode = num_embeddings, embedding_dim, mode
        self.include_last_offset, self.padding_idx = include_last_offset, padding_idx
        init = initializers.normal() if padding_idx is None else initializers.RowZeroed(initializers.normal(),
                                                                                          padding_idx)
        if _weight is not None:
            init = initializers.Constant(np.asarray(_weight, np.float32))
        self.weight = Parameter(shape=(num_embeddings, embedding_dim), dtype=dtype, init=init)

    def forward(self, input, offsets=None, per_sample_weights=None):
        return F.embedding_bag(input, self.weight, offsets, mode=self.mode, per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset, padding_idx=self.padding_idx)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}" + (
            f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")


def _shape(normalized_shape):
    return _sizes(tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else (normalized_shape,))


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
        super().__init__()
        _device(device)
        self.normalized_shape, self.eps = _shape(normalized_shape), eps
        self.weight = Parameter(shape=self.normalized_shape, dtype=dtype, init=initializers.ones()) \
            if elementwise_affine else None
        self.bias = Parameter(shape=self.normalized_shape, dtype=dtype, init=initializers.zeros()) \
            if elementwise_affine and bias else None

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}, " \
            f"bias={self.bias is not None}"


class GroupNorm(Module):
    """torch.nn.GroupNorm(num_groups, num_channels, eps, affine, bias=): weight ones and bias zeros,
    one per channel; no running statistics (torch keeps none either)."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None, dtype=None, *, bias=True):
        super().__init__()
        _device(device)
        if num_groups < 1 or num_channels % num_groups:
            raise MicaError(f"GroupNorm: num_channels ({num_channels}) must divide into num_groups ({num_groups})",
                            user_location())
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.weight = Parameter(shape=(num_channels,), dtype=dtype, init=initializers.ones()) if affine else None
        self.bias = Parameter(shape=(num_channels,), dtype=dtype, init=initializers.zeros()) \
            if affine and bias else None

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.bias is not None}")


class RMSNorm(Module):
    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
        super().__init__()
        _device(device)
        self.normalized_shape, self.eps = _shape(normalized_shape), eps
        self.weight = Parameter(shape=self.normalized_shape, dtype=dtype, init=initializers.ones()) \
            if elementwise_affine else None

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class _BatchNorm(Module):
    """torch.nn.BatchNorm1d/2d/3d: weight ones and bias zeros per channel; running_mean (zeros),
    running_var (ones) and num_batches_tracked as buffers, which training moves (F.batch_norm): in a
    compiled step they are its state, kept after each call; momentum=None averages them
    cumulatively, as torch's."""

    ndims, name = (2, 3), "BatchNorm1d"

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None,
                 dtype=None, *, bias=True):
        super().__init__()
        _device(device)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(shape=(num_features,), dtype=dtype, init=initializers.ones()) if affine else None
        self.bias = Parameter(shape=(num_features,), dtype=dtype, init=initializers.zeros()) \
            if affine and bias else None
        if track_running_stats:
            self.register_buffer("running_mean", np.zeros(num_features, np.float32))
            self.register_buffer("running_var", np.ones(num_features, np.float32))
            self.register_buffer("num_batches_tracked", np.zeros((), np.int64))
        else:
            for buffer in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(buffer, None)

    def forward(self, x):
        x = F.as_tensor(x)
        if x.ndim not in self.ndims:
            raise MicaError(f"{self.name}: expected a {' or '.join(f'{d}-d' for d in self.ndims)} input, got "
                            f"{x.value.spec!r}", user_location())
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # (a cumulative average: torch's 1 / num_batches_tracked)
                factor = 1.0 / F.to(self.num_batches_tracked, dtypes.float64)
        training = self.training or (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        return F.batch_norm(x, self.running_mean if keep else None, self.running_var if keep else None, self.weight,
                            self.bias, training, factor, self.eps)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")

    def reset_running_stats(self):
        """torch's: running_mean zeros, running_var ones, num_batches_tracked 0, in place."""
        if self.track_running_stats:
            for name, value in (("running_mean", 0), ("running_var", 1), ("num_batches_tracked", 0)):
                self._buffers[name] = _into(self._buffers[name], np.full_like(np.asarray(self._buffers[name]), value))

    def reset_parameters(self):
        """torch's: the running statistics reset, the weight ones and the bias zeros."""
        self.reset_running_stats()
        if self.affine:
            initializers.ones_(self.weight)
            if self.bias is not None:
                initializers.zeros_(self.bias)


class BatchNorm1d(_BatchNorm):
    pass


class BatchNorm2d(_BatchNorm):
    ndims, name = (4,), "BatchNorm2d"


class BatchNorm3d(_BatchNorm):
    ndims, name = (5,), "BatchNorm3d"


class _InstanceNorm(_BatchNorm):
    """torch.nn.InstanceNorm1d/2d/3d: each sample's channel normalized over its positions
    (F.instance_norm); affine=False and track_running_stats=False by default, as torch's; with
    running statistics, training moves them and evaluation normalizes by them. An input without
    its batch dim is taken as one sample."""

    ndims, name = (3,), "InstanceNorm1d"

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False, track_running_stats=False, device=None,
                 dtype=None, *, bias=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)

    def forward(self, x):
        x = F.as_tensor(x)
        if x.ndim == self.ndims[0] - 1:  # (no batch dim: one sample, as torch's)
            return F.squeeze(self.forward(F.unsqueeze(x, 0)), 0)
        if x.ndim not in self.ndims:
            raise MicaError(f"{self.name}: expected a {self.ndims[0] - 1}-d or {self.ndims[0]}-d input, got "
                            f"{x.value.spec!r}", user_location())
        return F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                               self.training or not self.track_running_stats,
                               0.0 if self.momentum is None else self.momentum, self.eps)


class InstanceNorm1d(_InstanceNorm):
    pass


class InstanceNorm2d(_InstanceNorm):
    ndims, name = (4,), "InstanceNorm2d"


class InstanceNorm3d(_InstanceNorm):
    ndims, name = (5,), "InstanceNorm3d"


class DataParallel(Module):
    """torch.nn.DataParallel: the model under `module` (its state_dict keys `module.`-prefixed, as
    torch's), called as it is: Mica's step runs on this machine's cores (or, across processes,
    `mpirun -np N mica train`), so there are no device replicas to scatter to, as torch's
    DataParallel on a machine without GPUs."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        super().__init__()
        self.module, self.dim = module, dim

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)


class Dropout(Module):
    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        self.p, self.inplace = p, inplace

    def forward(self, x):
        return F.dropout(x, self.p, self.training, self.inplace)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(Dropout):
    """torch.nn.Dropout1d: whole channels of [N, C, L] (or [C, L]) zeroed, F.dropout1d."""

    def forward(self, x):
        return F.dropout1d(x, self.p, self.training, self.inplace)


class Dropout2d(Dropout):
    def forward(self, x):
        return F.dropout2d(x, self.p, self.training, self.inplace)


class Dropout3d(Dropout):
    def forward(self, x):
        return F.dropout3d(x, self.p, self.training, self.inplace)


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class ReLU(Module):
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, x):
        return F.relu(x, self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class PReLU(Module):
    """torch.nn.PReLU: a learned slope below 0, one (num_parameters=1) or one per channel."""

    def __init__(self, num_parameters=1, init=0.25, device=None, dtype=None):
        super().__init__()
        _device(device)
        self.num_parameters = num_parameters
        self.weight = Parameter(shape=(num_parameters,), dtype=dtype, init=initializers.constant(init))

    def forward(self, x):
        return F.prelu(x, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"


class Identity(Module):
    def forward(self, x):
        return x


class ModuleList(Module):
    """Modules held in order under the names "0", "1", ... (renumbered as torch's on insert and
    delete); a slice is a ModuleList of the same modules."""

    def __init__(self, modules=()):
        super().__init__()
        self.extend(modules)

    def _renumber(self, modules):
        self._modules.clear()
        for k, m in enumerate(modules):
            self._modules[str(k)] = _module(m, type(self).__name__)

    def append(self, module):
        self._modules[str(len(self._modules))] = _module(module, type(self).__name__)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._renumber(modules)

    def __getitem__(self, i):
        """An index's module; a slice, as torch's: a ModuleList (or its subclass) of those modules
        numbered afresh, a Sequential of them under their own names."""
        if isinstance(i, slice):
            if isinstance(self, Sequential):
                return type(self)(collections.OrderedDict(list(self._modules.items())[i]))
            return type(self)(list(self._modules.values())[i])
        return list(self._modules.values())[i]

    def __setitem__(self, i, module):  # (torch's: the module under the name the place had)
        self._modules[list(self._modules)[i]] = _module(module, type(self).__name__)

    def __delitem__(self, i):
        modules = list(self._modules.values())
        del modules[i]
        self._renumber(modules)

    def pop(self, i=-1):
        module = self[i]
        del self[i]
        return module

    def __iadd__(self, modules):
        return self.extend(modules)

    def __add__(self, other):  # (torch's: a new container of both, numbered afresh)
        both = ModuleList() if not isinstance(self, Sequential) else Sequential()
        return both.extend(list(self) + list(other))

    def __rmul__(self, times):
        return self.__mul__(times)

    def __mul__(self, times):  # (Sequential * n: the same modules n times, as torch's)
        if not isinstance(self, Sequential) or not isinstance(times, int) or times < 1:
            raise MicaError(f"{type(self).__name__} * {times!r}: a Sequential repeats by a positive int, as torch's",
                            user_location())
        return Sequential().extend(list(self) * times)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __repr__(self):
        """torch's: runs of modules that print alike collapse to `(0-2): 3 x Block(...)`."""
        if isinstance(self, Sequential):
            return super().__repr__()
        texts = [repr(m).replace("\n", "\n  ") for m in self._modules.values()]
        lines, k = [], 0
        while k < len(texts):
            j = k
            while j + 1 < len(texts) and texts[j + 1] == texts[k]:
                j += 1
            lines.append(f"  ({k}): {texts[k]}" if j == k else f"  ({k}-{j}): {j - k + 1} x {texts[k]}")
            k = j + 1
        return f"{type(self).__name__}(" + ("\n" + "\n".join(lines) + "\n)" if lines else ")")


class ModuleDict(Module):
    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self._modules[key] = _module(module, "ModuleDict")

    def __delitem__(self, key):
        del self._modules[key]

    def __contains__(self, key):
        return key in self._modules

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def update(self, modules):
        for k, m in (modules.items() if hasattr(modules, "items") else modules):
            self[k] = m

    def pop(self, key):
        return self._modules.pop(key)

    def clear(self):
        self._modules.clear()

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()


def _as_parameter(value, where):
    if isinstance(value, Parameter):
        return value
    if hasattr(value, "shape"):  # (torch wraps a tensor given to its containers as a Parameter)
        return Parameter(np.asarray(value))
    raise MicaError(f"{where} holds Parameters (or tensors, made Parameters), got a {type(value).__name__}",
                    user_location())


def _held_parameters(container):
    """A parameter container's lines for its repr, as torch prints them."""
    return "\n".join(f"({k}): Parameter containing: [{p.dtype.name} of size {tuple(p.shape)}]"
                     for k, p in container._parameters.items())


class ParameterList(Module):
    """torch.nn.ParameterList: Parameters held in order under the names "0", "1", ..."""

    def __init__(self, values=None):
        super().__init__()
        for v in values or ():
            self.append(v)

    def append(self, value):
        self.register_parameter(str(len(self._parameters)), _as_parameter(value, "ParameterList"))
        return self

    def extend(self, values):
        for v in values:
            self.append(v)
        return self

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ParameterList(list(self._parameters.values())[i])
        return list(self._parameters.values())[i]

    def __setitem__(self, i, value):
        self._parameters[list(self._parameters)[i]] = _as_parameter(value, "ParameterList")

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters.values())

    def __iadd__(self, values):
        return self.extend(values)

    def extra_repr(self):
        return _held_parameters(self)


class ParameterDict(Module):
    """torch.nn.ParameterDict: Parameters held under string keys, in insertion order."""

    def __init__(self, parameters=None):
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key):
        return self._parameters[key]

    def __setitem__(self, key, value):
        value = _as_parameter(value, "ParameterDict")
        if key in self._parameters:
            self._parameters[key] = value
        else:
            self.register_parameter(key, value)

    def __delitem__(self, key):
        del self._parameters[key]

    def __contains__(self, key):
        return key in self._parameters

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters)

    def update(self, parameters):
        for k, v in (parameters.items() if hasattr(parameters, "items") else parameters):
            self[k] = v

    def keys(self):
        return self._parameters.keys()

    def items(self):
        return self._parameters.items()

    def values(self):
        return self._parameters.values()

    def pop(self, key):
        return self._parameters.pop(key)

    def get(self, key, default=None):
        return self._parameters.get(key, default)

    def extra_repr(self):
        return _held_parameters(self)


class Sequential(ModuleList):
    """Modules called in order; Sequential(OrderedDict(name=module, ...)) names them, as torch's."""

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and hasattr(modules[0], "items"):
            for name, m in modules[0].items():
                self._modules[str(name)] = _module(m, "Sequential")
        else:
            self.extend(modules)

    def forward(self, x):
        for m in self:
            x = m(x)
        return x


def _module(m, container):
    if not isinstance(m, Module):
        raise MicaError(f"{container} holds mica.nn.Module objects, got a {type(m).__name__} {m!r:.40}; give it "
                        "modules (nn.ReLU(), not 'relu')", user_location())
    return m
