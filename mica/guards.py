"""What a function compiled in torch.compile's form reads besides its arrays, fingerprinted at every
call (torch.compile's guards). A traced program holds as constants the Python values the trace
read, so a call whose fingerprint differs from every program's is traced again: a changed global or
closure variable, a module's mode, plain attribute, buffer or Dropout p, another model of the same
shape, or an object argument whose attributes changed never runs a program made for the old ones.

Once a function has been traced, the code its traces ran is known (Reads: the profiler noted each
function called), and plain objects are narrowed to it: their attributes that code never reads (a
trainer's `self.loss` and `self.iter_num`, set by the loop each call) and their classes' methods it
never ran are left out, as torch.compile guards only what it traced; where the user's code reads
attributes by a name in a string (getattr, vars, __dict__, dataclasses.asdict) nothing is narrowed.

The fingerprint covers, to any depth:
- the globals and closure variables the function's code names, and the same for every function of
  the user's it reaches that way (a module's methods among them);
- each Module reached: its class, train/eval mode, which Parameters it holds (their identity and
  requires_grad: their values are the program's inputs), its buffers' contents, its submodules, and
  every other attribute;
- numbers, strings and containers by value (traced tensors kept from earlier traces left out);
  Mica's host tensors (buffers among them) by a count of the writes made through them, as torch's
  version counter, so they are not read whole at every call; numpy arrays and torch tensors by their
  bytes (above 16 MiB by identity, shape and address: reading them at every call would cost more
  than the step); lists, dicts and sets of more than 4096 items by identity and length; other
  objects by their attributes and their classes' plain attributes and methods;
  a module's or class's attribute read by name (`cfg.SCALE`); Mica's optimizers, schedulers and
  scalers by identity (the compiled step reads their settings itself: stateful.py).
A value that cannot be read (a property that raises, a tensor numpy cannot hold) is known by
identity: the fingerprint never stops a call.
"""
import collections
import collections.abc
import dis
import functools
import os
import sysconfig
import types
import zlib

import numpy as np

LARGE = 16 << 20  # (bytes: a numpy array larger is known by identity, shape and address only)
ITEMS = 4096  # (a container longer is known by identity and length)
DEPTH = 12

_LIBRARIES = tuple({os.path.realpath(p) + os.sep for p in (sysconfig.get_paths()["stdlib"],
                                                           sysconfig.get_paths()["purelib"],
                                                           sysconfig.get_paths()["platlib"]) if p})


def world(fn, slots=None, reads=None):
    """((where, fingerprint), ...) of what fn reads outside its arguments (`slots`: {(id(holder),
    key): Slot} of what its compiled step keeps as state there, slots.py: known by their marks;
    `reads`: a Reads of the code its traces ran, which narrows objects to what that code reads)."""
    walk = _Walk(slots, reads)
    walk.function(fn, "", 0)
    return tuple(walk.found)


def value(v, slots=None, reads=None):
    """The fingerprint of one argument that is not an array (a number, a module, an object)."""
    walk = _Walk(slots, reads)
    return walk.value(v, 0), tuple(walk.found)


class Reads:
    """The user's code a function's traces ran (its code objects) and the attribute names that code
    reads (`self.model`, `cfg.lr`): a plain object's or a module's other attributes (a trainer's
    `self.iter_num`, `self.loss`, set by the loop each call) and its class's methods the traces
    never ran are no part of the function's world, as torch.compile guards only what it traced."""

    def __init__(self):
        self.codes, self.names = set(), set()
        self.dynamic = False  # (the user's code reads attributes by a name in a string: nothing is narrowed)

    def add(self, codes):
        """Note the code a trace ran; whether any was new (the world a key read may differ)."""
        new = False
        for code in codes:  # (Mica's own and libraries' code too: Dropout's forward reads its p)
            if code not in self.codes:
                self.codes.add(code)
                self.names |= _attributes(code)
                self.dynamic = self.dynamic or (_users(code) and not code.co_filename.startswith("<frozen") and
                                                bool(_DYNAMIC & _names_loaded(code)))  # (not importlib's own)
                new = True
        return new


# (reading an attribute by a name held in a string, or an object's attributes all at once: the names
# the code loads cannot say which it reads, so the guards read every attribute, as before they knew)
_DYNAMIC = frozenset(("getattr", "hasattr", "vars", "__dict__", "__getattribute__", "attrgetter", "asdict",
                      "astuple", "replace", "fields", "__getstate__", "__reduce__", "__reduce_ex__", "dir"))


def _names_loaded(code):
    """Every global, builtin and attribute name code (and its nested code) loads."""
    found = {ins.argval for ins in dis.get_instructions(code)
             if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_ATTR", "LOAD_METHOD") and isinstance(ins.argval, str)}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            found |= _names_loaded(c)
    return found


_ATTRIBUTES = {}


def _attributes(code):
    """The attribute names code reads (LOAD_ATTR, LOAD_METHOD), nested code's too."""
    known = _ATTRIBUTES.get(code)
    if known is None:
        known = {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_ATTR", "LOAD_METHOD")}
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                known |= _attributes(c)
        known = _ATTRIBUTES[code] = frozenset(known)
    return known


class running:
    """with running() as codes: the code objects of every Python function called inside (a set)."""

    def __enter__(self):
        import sys

        self.codes, self.before = set(), sys.getprofile()
        codes = self.codes

        def note(frame, event, arg):
            if event == "call":
                codes.add(frame.f_code)
        sys.setprofile(note)
        return self.codes

    def __exit__(self, *exc):
        import sys

        sys.setprofile(self.before)
        return False


def holders(fn, leaves):
    """[(holder, owner)] of where fn could rebind a value: its functions' globals dicts and closure
    cells, and the attribute dicts of the plain objects it reaches (owner: the object), each once."""
    walk = _Walk()
    walk.function(fn, "", 0)
    for x in leaves:
        walk.value(x, 0)
    return walk.holders


def random_states(fn, leaves):
    """[(name, generator, its state now)] of the random generators a call of fn could draw from
    while it is traced: numpy's global one, Python's `random`, and the numpy Generators and
    RandomStates fn reads or is given."""
    import random

    walk = _Walk()
    walk.function(fn, "", 0)
    for x in leaves:
        walk.value(x, 0)
    found = [("numpy's global generator (np.random)", np.random.mtrand._rand), ("Python's random module", random)]
    found += [(f"a numpy {type(g).__name__}", g) for g in walk.generators]
    return [(name, g, _state(g)) for name, g in found]


def drawn(states):
    """The names of the generators among random_states()'s whose state has moved since."""
    return list(dict.fromkeys(name for name, g, state in states if _state(g) != state))


def _state(g):
    import pickle

    try:
        return pickle.dumps(g.getstate() if g.__class__ is types.ModuleType else
                            g.bit_generator.state if isinstance(g, np.random.Generator) else g.get_state())
    except Exception:  # (a state that cannot be read: never a reason to stop a call)
        return None


def changed(before, after):
    """The names of what differs between two worlds (for the recompiles warning)."""
    old = set(before)
    return list(dict.fromkeys(where for where, fp in after if (where, fp) not in old))  # (each name once)


_USERS = {}


def _users(code):
    """Whether code is the user's (not Mica's own, not the standard library's or an installed
    package's, whose globals are modules and functions the trace cannot depend on by value)."""
    path = code.co_filename
    known = _USERS.get(path)
    if known is None:
        from .tensor import _is_internal

        real = os.path.realpath(path)  # (python -c, an interactive session, exec'd text: "<...>", the user's)
        known = _USERS[path] = path.startswith("<") or not _is_internal(real) and not real.startswith(_LIBRARIES)
    return known


_LOADS = {}


def _loads(code):
    """The global names code (and the code nested in it) loads, each with the attribute names read
    from it in a row (`cfg.SCALE`, `np.exp`): ((name, (attr, ...)), ...). Read from the bytecode,
    not co_names, which holds every attribute name too (a loop's global `step` is not read by
    `opt.step()`)."""
    known = _LOADS.get(code)
    if known is None:
        found, chain = [], None
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                chain = [ins.argval]
                found.append(chain)
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and chain is not None:
                chain.append(ins.argval)
            elif ins.opname not in ("CACHE", "EXTENDED_ARG", "PRECALL", "NOP"):
                chain = None
        known = {(c[0], tuple(c[1:])) for c in found}
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                known |= set(_loads(c))
        known = _LOADS[code] = tuple(sorted(known))
    return known


class _Walk:
    def __init__(self, slots=None, reads=None):
        self.slots = slots or {}  # {(id(holder), key): Slot} known by their marks (slots.py)
        self.reads = reads if reads is not None and reads.codes and not reads.dynamic else None  # (Reads: objects
        # narrowed to what the traced code reads)
        self.holders = []  # [(holder, owner)]: globals dicts, closure cells, plain objects' attribute dicts
        self.held = set()  # (their ids)
        self.found = []  # (where, fingerprint) of each global and closure variable read
        self.functions = set()  # (ids of functions walked: each once)
        self.open = set()  # (ids of the containers and modules on the path: cycles)
        self.classes = set()  # (module classes whose methods were walked)
        self.generators = []  # (numpy Generators and RandomStates reached: random_states)

    def function(self, fn, where, depth):
        while True:  # (decorators' wrappers, bound methods, partials: to the functions beneath)
            if isinstance(fn, types.MethodType):
                self.found.append((f"{where}.__self__", self.value(fn.__self__, depth + 1)))
                fn = fn.__func__
            elif isinstance(fn, functools.partial):
                self.found.append((f"{where}(partial)", self.value((fn.args, fn.keywords), depth + 1)))
                fn = fn.func
            elif hasattr(fn, "__wrapped__") and isinstance(fn, types.FunctionType):
                self._read(fn)
                fn = fn.__wrapped__
            else:
                break
        if isinstance(fn, types.FunctionType):
            self._read(fn)
        elif callable(fn) and not isinstance(fn, (type, types.BuiltinFunctionType)):  # (an object with __call__)
            self.found.append((where or "the callable", self.value(fn, 0)))

    def _read(self, fn):
        if id(fn) in self.functions or not _users(fn.__code__):  # (each function once: its own cycles end)
            return
        self.functions.add(id(fn))
        name = getattr(fn, "__qualname__", "?")
        g = fn.__globals__
        self._holder(g, None)
        for n, attrs in _loads(fn.__code__):
            if n not in g:
                continue
            v = g[n]
            if (id(g), n) in self.slots:
                self.found.append((n, self.slots[id(g), n].mark(v)))
                continue
            self.found.append((n, self.value(v, 0)))
            for i, a in enumerate(attrs):  # (`cfg.SCALE`, `Settings.k`: a module's or class's attribute,
                if not isinstance(v, (types.ModuleType, type)):  # which their identity does not cover)
                    break
                try:
                    v = getattr(v, a)
                except Exception:  # (a missing attribute, or one whose reading raises: the trace says)
                    break
                self.found.append((".".join((n,) + attrs[:i + 1]), self.value(v, 0)))
        for n, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            if n == "__class__":  # (super()'s cell: the class, whose methods are walked with its modules)
                continue
            self._holder(cell, None)
            try:
                v = cell.cell_contents
            except ValueError:  # (a cell not filled yet)
                continue
            self.found.append((n, self.slots[id(cell), None].mark(v) if (id(cell), None) in self.slots
                               else self.value(v, 0)))
        if fn.__defaults__ or fn.__kwdefaults__:
            self.found.append((f"{name}: defaults", self.value((fn.__defaults__, fn.__kwdefaults__), 0)))

    def _holder(self, holder, owner):
        if id(holder) not in self.held:
            self.held.add(id(holder))
            self.holders.append((holder, owner))

    def value(self, v, depth):
        try:
            return self._value(v, depth)
        except Exception:  # (an object reading which raises, a tensor numpy cannot hold: known by identity)
            return ("id", id(v))

    def _value(self, v, depth):
        t = type(v)
        if v is None or t in (bool, int, str, bytes):
            return v if t is not bool else ("bool", v)
        if t in (float, complex):
            return (t.__name__, repr(v))  # (repr: a NaN equals itself)
        if isinstance(v, np.generic):
            return ("np", v.dtype.str, v.tobytes())
        if isinstance(v, np.ndarray):
            return _array(v)
        from .host import is_torch_tensor
        from .tensor import Tensor

        if isinstance(v, Tensor):  # (a traced tensor kept from an earlier trace: no value a new one reads)
            return ("traced",)
        if is_torch_tensor(v):
            d = v.detach()
            head = ("torch", str(d.dtype), str(d.device), tuple(d.shape), id(v))
            if d.device.type != "cpu" or d.numel() * d.element_size() > LARGE:  # (its own identity and address:
                return head + (d.data_ptr(),)                                  # never a temporary's)
            return head + _array(d.float().numpy() if str(d.dtype) == "torch.bfloat16" else d.numpy())
        if isinstance(v, (types.ModuleType, type, types.BuiltinFunctionType)):
            return ("id", id(v))
        if isinstance(v, (np.random.Generator, np.random.RandomState)):  # (its draws: random_states)
            self.generators.append(v)
            return ("id", id(v))
        if isinstance(v, (types.FunctionType, types.MethodType, functools.partial)):
            self.function(v, getattr(v, "__qualname__", "fn"), depth + 1)
            return ("function", id(v))
        if depth > DEPTH or id(v) in self.open:
            return ("id", id(v))
        from .nn.modules import Module, Parameter

        if isinstance(v, Parameter):
            return ("parameter", id(v), bool(v.requires_grad))
        self.open.add(id(v))
        try:
            if isinstance(v, Module):
                return self._module(v, depth)
            if str(getattr(t, "__module__", "")).split(".")[0] == "mica":  # (optimizers, schedulers, scalers,
                return ("mica", id(v))                                       # autocast, dtypes)
            if isinstance(v, (list, tuple, collections.deque)) or _container(v, collections.abc.Sequence):
                if len(v) > ITEMS:
                    return ("sequence", id(v), len(v))
                return (t.__name__,) + tuple(self.value(x, depth + 1) for x in v if not isinstance(x, Tensor))
            if isinstance(v, dict) or _container(v, collections.abc.Mapping):
                if len(v) > ITEMS:
                    return ("dict", id(v), len(v))
                return ("dict",) + tuple((self.value(k, depth + 1), self.value(x, depth + 1)) for k, x in v.items())
            if isinstance(v, (set, frozenset)) or _container(v, collections.abc.Set):
                return ("set", id(v), len(v)) if len(v) > ITEMS else \
                    ("set", frozenset(self.value(x, depth + 1) for x in v))
            if isinstance(v, (range, slice)):
                return (t.__name__, repr(v))
            self._methods(t)
            fields = getattr(v, "__dict__", None)
            slots = [n for c in t.__mro__ for n in getattr(c, "__slots__", ()) if isinstance(n, str)]
            if isinstance(fields, dict) or slots:  # (its attributes, and its class's plain ones, read again)
                if slots:
                    self._holder(v, "__slots__")
                held = tuple((n, self.slots[id(v), n].mark(getattr(v, n)) if (id(v), n) in self.slots
                              else self.value(getattr(v, n), depth + 1)) for n in slots if hasattr(v, n))
                if isinstance(fields, dict):
                    self._holder(fields, v)
                return ("object", id(t), self._fields(fields, depth + 1) if isinstance(fields, dict) else None, held)
            return ("id", id(v))
        finally:
            self.open.discard(id(v))

    def _fields(self, fields, depth):
        """An object's attributes' fingerprint (a compiled step's state among them by its mark; where
        the code the traces ran is known, only the attributes it reads)."""
        key = id(fields)
        if self.reads is not None:
            fields = {k: x for k, x in fields.items() if k in self.reads.names}
        if not any((key, k) in self.slots for k in fields):
            return self.value(fields, depth)
        return ("dict",) + tuple((k, self.slots[key, k].mark(x) if (key, k) in self.slots
                                  else self.value(x, depth + 1)) for k, x in fields.items())

    def _module(self, m, depth):
        parts = [("module", id(type(m)), bool(m.training))]
        for k, p in m._parameters.items():
            parts.append((k, None if p is None else ("parameter", id(p), bool(p.requires_grad))))
        state = vars(m).get("_mica_state_buffers", ())  # (a compiled step's state: an input, read at each call)
        for k, b in m._buffers.items():
            parts.append((k, None if b is None else ("state", np.asarray(b).dtype.str, np.shape(b)) if k in state
                          else _array(b)))
        for k, sub in m._modules.items():
            parts.append((k, None if sub is None else self.value(sub, depth + 1)))
        assigned = vars(m).get("_mica_assigned", ())  # (what a compiled step assigns: its outputs, stateful.py)
        for k, x in vars(m).items():
            if k not in ("_parameters", "_modules", "_buffers", "_non_persistent", "training", "_mica_assigned",
                         "_mica_state_buffers", "_mica_written") and \
                    not k.startswith("_said") and k not in assigned:  # (every one: Mica's own modules read
                parts.append((k, self.value(x, depth + 1)))            # their settings by name too)
        self._methods(type(m))
        return tuple(parts)

    def _methods(self, cls):
        """A class's methods (forward and what it calls, static and class methods, properties), its
        bases' down to Mica's and Python's own, and its plain attributes (self.k where the instance
        has none)."""
        if cls in self.classes:
            return
        self.classes.add(cls)
        for c in cls.__mro__:
            if c is object or str(getattr(c, "__module__", "")).split(".")[0] in ("mica", "builtins"):
                continue
            for k, f in vars(c).items():
                if isinstance(f, (staticmethod, classmethod)):
                    f = f.__func__
                elif isinstance(f, property):
                    f = f.fget
                if isinstance(f, types.FunctionType):
                    if self.reads is None or f.__code__ in self.reads.codes:  # (one the traces ran)
                        self.function(f, f"{c.__qualname__}.{k}", 0)
                elif not k.startswith("__") and not callable(f) and not isinstance(f, property) and \
                        (self.reads is None or k in self.reads.names):
                    self.found.append((f"{c.__qualname__}.{k}", self.value(f, 0)))


def _container(v, kind):
    """Whether v is a container of that kind with no attributes of its own (a deque, a ChainMap, a
    mappingproxy: by its items, as a list or dict; a user's class that is one is read by its
    attributes, which hold its items)."""
    return isinstance(v, kind) and not hasattr(v, "__dict__") and not isinstance(v, (str, bytes, bytearray))


def _array(a):
    from .host import HostTensor, _WRITES, memory_owner

    if isinstance(a, HostTensor):  # (its writes are counted, as torch's version counter: not read whole)
        owner = memory_owner(a)
        return ("host", a.dtype.str, a.shape, a.strides, id(owner), _WRITES.get(id(owner), 0),
                a.__array_interface__["data"][0])
    a = a if isinstance(a, np.ndarray) else np.asarray(a)
    head = ("array", a.dtype.str, a.shape)
    if a.dtype.hasobject:
        return head + ("objects", id(a))
    if a.nbytes > LARGE:
        return head + ("large", id(a), a.__array_interface__["data"][0])
    b = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return head + (zlib.crc32(b), zlib.adler32(b))

