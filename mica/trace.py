"""mica.trace: run a Python function once on symbolic Tensors and keep the graph it built."""
import functools
import threading

import numpy as np

from . import pytree
from .dtypes import Spec
from .errors import MicaError, TraceError
from .ir import Graph
from .host import is_torch_tensor
from .tensor import _STACK, Tensor, TraceContext, user_location


def _is_spec_leaf(x):
    return isinstance(x, Spec) or (hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, Tensor))


# One trace at a time in the process: a trace's state (the verbs' context, a torch-style step's, the
# autocast regions, a model's bound values) is the process's, so threads take turns to trace, and
# torch.compile-form calls, which may trace and share the values a model holds, take turns too
_TRACE_LOCK = threading.RLock()


def to_spec(x):
    """The Spec of an argument (a Spec as it is), or the sentence for one Mica cannot take."""
    if isinstance(x, Spec):
        return x
    try:
        return Spec.of(np.asarray(x) if not hasattr(x, "shape") else x)
    except (TypeError, KeyError) as e:
        from .tensor import user_location

        raise MicaError(f"an argument of {x.dtype if hasattr(x, 'dtype') else type(x).__name__} values cannot be an "
                        f"input ({e}); pass floats, integers or booleans", user_location()) from None


class Program:
    """A traced program: its graph, and the pytree signature of its inputs and outputs."""

    def __init__(self, graph, in_tree, out_tree, name, static):
        self.graph = graph
        self.in_tree = in_tree      # TreeDef of the argument tuple; leaves are inputs (or statics)
        self.out_tree = out_tree    # TreeDef of the result
        self.name = name
        self._static = static       # per argument leaf: None for an input, else the static value

    @property
    def ir(self):
        """The graph as text, one node per line with the user's file:line beside it."""
        return self.graph.text()

    @property
    def inputs(self):
        """The arguments' structure with a Spec at each traced input (static values as given)."""
        specs = iter(v.spec for v in self.graph.inputs)
        leaves = [next(specs) if s is None else s for s in self._static]
        return pytree.unflatten(self.in_tree, leaves)

    @property
    def outputs(self):
        return pytree.unflatten(self.out_tree, [v.spec for v in self.graph.outputs])

    @property
    def input_names(self):
        return list(self.graph.input_names)

    @property
    def uses_rng(self):
        return self.graph.rng is not None

    def flatten_args(self, args):
        """The input leaves of a call's arguments as numpy arrays, checked against the traced
        signature: its structure here, each leaf's kind, shape and range by inputs.check_input."""
        from .tensor import user_location  # (the call's line, in the user's file)

        leaves, tree = pytree.flatten(tuple(args), is_leaf=_is_spec_leaf)
        if tree != self.in_tree:
            raise TraceError(f"{self.name}: the arguments differ from the traced ones: "
                             f"{pytree.describe_difference(tree, self.in_tree)}", user_location())
        out = [x for x, s in zip(leaves, self._static) if s is None]
        return [self.checked_input(index, x) for index, x in enumerate(out)]

    def checked_input(self, index, array):
        """`array` as input `index` (numpy), or the sentence of inputs.check_input naming it."""
        from .inputs import check_input
        from .tensor import user_location

        import operator

        count, given = len(self.graph.inputs), index
        try:
            index = operator.index(index) if not isinstance(index, bool) else None
        except TypeError:
            index = None
        if index is None or not 0 <= index < count:
            raise MicaError(f"{self.name}: set_input's index is an input's place, 0 to {count - 1}, got {given!r}",
                            user_location())
        return check_input(array, self.graph.inputs[index], index, self.name, self.graph.input_names[index])

    def lower(self, target="cpu", **options):
        """Run the shared pipeline for `target` (a name, e.g. "cpu", or a Target): schedule, memory
        plan and source; `.build()` the result. `remat=True` lets the backward recompute cheap forward
        values instead of keeping them, `memory_budget=BYTES` recomputes as much as the plan needs to
        fit (mica/lower.py). Other options go to the target: for the CPU `opt_level` (0-2),
        `max_threads`, `blas` ('openblas', the default, or 'own': Mica's own product kernel)."""
        from .lower import lower

        return lower(self, target, **options)

    def __repr__(self):
        return f"<mica.Program {self.name}: {len(self.graph.nodes)} nodes>"


def _argument_names(fn, count):
    """The parameter names of fn for `count` positional arguments (args[i] where unknown)."""
    sig = _signature(fn)
    params = [p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)] \
        if sig else []
    names = [p.name for p in params[:count]]
    return names + [f"args[{i}]" for i in range(len(names), count)]


def trace(fn, *specs, name=None):
    """Trace `fn` on symbolic inputs described by `specs` (Specs, arrays or pytrees of them).

    Leaves that are neither Specs nor arrays (ints, strings, ...) are passed to `fn` unchanged as
    static values. Returns a Program. Given a tensor and nothing else, it is torch.trace (the sum of
    a matrix's diagonal), so torch code calling torch.trace(x) runs as written.
    """
    if not specs and name is None and not callable(fn) and (isinstance(fn, (Tensor, np.ndarray)) or
                                                            type(fn).__name__ == "Parameter"):
        from . import verbs as F
        from .host import eager

        return F.matrix_trace(fn) if isinstance(fn, Tensor) else eager(F.matrix_trace)(fn)
    _check_arity(fn, len(specs))
    with _TRACE_LOCK:
        return _trace(fn, specs, name)


def _trace(fn, specs, name):
    graph = Graph()
    ctx = TraceContext(graph)
    leaves, in_tree = pytree.flatten(tuple(specs), is_leaf=_is_spec_leaf)
    names = _argument_names(fn, len(specs))
    paths = [p for name, spec in zip(names, specs) for p in pytree.leaf_paths(spec, is_leaf=_is_spec_leaf, prefix=name)]
    loc = user_location()
    args, static = [], []
    for leaf, path in zip(leaves, paths):
        if _is_spec_leaf(leaf):
            args.append(Tensor(graph.add_input(to_spec(leaf), path, loc), ctx))
            static.append(None)
        else:
            args.append(leaf)
            static.append(leaf)
    call_args = pytree.unflatten(in_tree, args)
    _STACK.append(ctx)
    try:
        result = fn(*call_args)
        from . import verbs as F

        out_leaves, out_tree = pytree.flatten(result, is_leaf=lambda x: isinstance(x, Tensor))
        values, python = [], {}
        for i, x in enumerate(out_leaves):
            if not isinstance(x, Tensor):
                if _PYTHON_OUT[-1] and type(x) in (bool, int, float):  # (torch.compile gives a Python number back:
                    python[i] = x                                      # x.shape[0], a flag, as it is)
                    continue
                if F.is_scalar(x):
                    x = F.as_tensor(x)
                elif hasattr(x, "_mica_complex"):
                    raise TraceError("a traced function returns a complex tensor, which a compiled program cannot "
                                     "hold; return torch.view_as_real of it (its real and imaginary parts in a last "
                                     "dim of 2)", loc)
                else:
                    raise TraceError(f"a traced function must return Tensors (in dicts, lists, tuples); "
                                     f"got {type(x).__name__}", loc)
            values.append(x.value)
        if python:
            out_tree = pytree.with_constants(out_tree, python)
    finally:
        _STACK.pop()
        ctx.open = False
    graph.outputs = values
    return Program(graph, in_tree, out_tree, name or getattr(fn, "__name__", "program"), static)


def compile(fn=None, *specs, target="cpu", name=None, **options):
    """Trace `fn`, lower it for `target` (options as Program.lower) and build it: returns a callable
    Executable. Without specs, as torch.compile: a callable that compiles for the shapes and types
    of the arguments it is first called with (again for others); a Module is returned as it is
    (called outside a trace it runs eagerly; in a traced step it is part of the step)."""
    if fn is None:  # (@mica.compile(target=...) as a decorator with settings)
        return lambda f: compile(f, *specs, target=target, name=name, **options)
    if specs:
        return trace(fn, *specs, name=name).lower(target, **options).build()
    from .nn import Module

    if isinstance(fn, Module):
        return fn
    return _Compiled(fn, target, name, options)


def _signature(fn):
    """fn's signature, or None where Python cannot read one (a builtin)."""
    import inspect

    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _bind(fn, sig, args, kwargs, sentence):
    """Bind the arguments as Python would; where it cannot, `sentence(TypeError's text)` at the user's line."""
    if sig is None:
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        from .tensor import user_location

        raise MicaError(sentence(e), user_location()) from None


def _check_arity(fn, count):
    """A sentence where `count` positional specs cannot be fn's arguments (too few or too many)."""
    sig = _signature(fn)
    takes = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)] \
        if sig else []
    _bind(fn, sig, range(count), {}, lambda e: (
        f"{getattr(fn, '__name__', 'the function')} was given {count} spec{'s' if count != 1 else ''} for its "
        f"arguments ({', '.join(takes) or 'none'}): {e}; give one spec (or pytree of specs) per argument"))


def with_writes(fn):
    """fn, traced, returning {"result": what fn returns, "writes": {i: the final value of its i-th
    argument leaf}} for the arguments it changed in place: torch writes those into the caller's
    tensors, which written_back does after the run."""
    @functools.wraps(fn)  # (its signature: the inputs keep the argument names)
    def called(*args):
        leaves = pytree.flatten(args, is_leaf=_is_argument_leaf)[0]
        before = [x._value if isinstance(x, Tensor) else None for x in leaves]
        result = fn(*args)
        writes = {str(i): x for i, (x, v) in enumerate(zip(leaves, before))
                  if isinstance(x, Tensor) and x._value is not v}
        return {"result": result, "writes": writes}
    return called


def _is_argument_leaf(x):
    return isinstance(x, Tensor) or _is_spec_leaf(x)


def written_back(out, given):
    """The result of a with_writes call, each changed argument's final values written into the
    caller's array or torch tensor (`given`: the argument leaves in the same order) as torch's
    in-place writes are; where torch would refuse the write, or could not make it the same, a
    sentence before anything is written."""
    writes = {int(i): v for i, v in out["writes"].items()}
    arrays = [i for i, x in enumerate(given) if hasattr(x, "shape") and hasattr(x, "dtype")]
    for i in writes:
        what = f"the function changes its input #{arrays.index(i) + 1} (counting the arrays among its arguments) in place"
        why = _unwritable(given[i]) or next((
            "and the same memory is given as another argument: each argument is its own input in the compiled "
            "program, so the writes would not see each other as torch's do; pass it once, or pass a copy"
            for j in arrays if j != i and _overlap(given[i], given[j])), None)
        if why:
            raise MicaError(f"{what}, {why}", user_location())
    for i, values in writes.items():
        _write_into(given[i], np.asarray(values))
    return out["result"]


def _unwritable(x):
    """Why a write into argument `x` cannot be torch's (its own reason where torch refuses it), or None."""
    if is_torch_tensor(x):
        if x.requires_grad and x.is_leaf:
            return ("and the torch tensor given there is a leaf that requires grad, which torch refuses to change in "
                    "place; pass it under torch.no_grad() as x.detach(), or return the new value")
        strides, shape = x.stride(), x.shape
    elif isinstance(x, np.ndarray):
        if not x.flags.writeable:
            return ("and the array given there is read-only, so the change would be lost; pass a writable copy "
                    "(np.array(x)), or return the new value")
        strides, shape = x.strides, x.shape
    else:
        return "and what is given there is not an array it could be written into; return the new value instead"
    if any(st == 0 and n > 1 for st, n in zip(strides, shape)):
        return ("and the array given there is expanded (several of its elements are one place in memory), which a "
                "compiled program cannot write as torch would; pass a .clone() of it")
    return None


def _overlap(a, b):
    """Whether two arguments may share memory: numpy's exact answer where both are CPU arrays, else
    whether their torch storages are one."""
    def numpy_view(x):
        if isinstance(x, np.ndarray):
            return x
        try:
            return x.detach().numpy() if is_torch_tensor(x) else None
        except Exception:  # (bfloat16, or on a card: no numpy view)
            return None
    va, vb = numpy_view(a), numpy_view(b)
    if va is not None and vb is not None:
        return np.shares_memory(va, vb)
    if is_torch_tensor(a) and is_torch_tensor(b):
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    return False


def _write_into(x, values):
    if isinstance(x, np.ndarray):
        np.copyto(x, values, casting="unsafe")
        return
    import torch  # (a torch tensor: written as torch writes it, so its version counter moves as torch's would)

    with torch.no_grad():
        x.copy_(torch.from_numpy(np.ascontiguousarray(values)))


_TORCH_FORM = []  # the torch.compile-form calls compiling now (a step with no Parameter or optimizer)
_PYTHON_OUT = [False]  # (True while the torch.compile form traces: a Python number returned stays one)


def _with_keywords(fn):
    """fn called as fn(*args, **kwargs) from the pair (args, kwargs): a compiled call's keyword
    arguments traced as one more pytree."""
    def called(args, kwargs):
        return fn(*args, **kwargs)
    called.__name__ = getattr(fn, "__name__", "function")
    return called


class _Held:
    """A Parameter (or a host tensor made a leaf in place) given as an argument of a torch.compile-
    form call: not an input of its values but the trainable object, which the step reads as it
    reads one from a global (its gradient, its update); the guards know it by its identity."""
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj


def _trainable(x):
    return type(x).__name__ in ("Parameter", "LeafTensor")


def _parameters_held(args, fn):
    """(args with their Parameters held as static _Held leaves, fn taking them back)."""
    leaves, tree = pytree.flatten(args, is_leaf=_is_spec_leaf)
    held = pytree.unflatten(tree, [_Held(x) if _trainable(x) else x for x in leaves])

    @functools.wraps(fn)
    def called(*given):
        got, shape = pytree.flatten(given, is_leaf=lambda x: isinstance(x, _Held) or _is_spec_leaf(x))
        return fn(*pytree.unflatten(shape, [x.obj if isinstance(x, _Held) else x for x in got]))
    return held, called


def _random(program):
    """Whether a compiled program draws random bits (dropout)."""
    lowered = getattr(program, "lowered", None)
    return lowered is not None and getattr(lowered.graph, "rng", None) is not None


class _Compiled:
    """torch.compile's contract: compile on the first call, for the arguments' shapes and types."""

    _RUN_OPTIONS = ("threads", "seed", "offset")

    def __init__(self, fn, target, name, options):
        self.fn, self.target, self.name, self.options, self.built = fn, target, name, options, {}
        self.calls = 0  # (the dropout key's offset where the caller gives the seed: it moves with every call)
        self._slots = {}  # {(id(holder), key): Slot} its compiled steps keep outside modules (slots.py)
        from .guards import Reads

        self._reads = Reads()  # (the code its traces ran, and the attributes that code reads: guards.py)
        self.__wrapped__ = fn
        self._last = None  # (the program the last call ran: .source, .memory_report, .ir)
        self._signature = _signature(fn)

    def _takes(self, keyword):
        """Whether the function itself takes `keyword` (then it is the function's, not a run option)."""
        sig = self._signature
        return sig is not None and (keyword in sig.parameters or any(
            p.kind is p.VAR_KEYWORD for p in sig.parameters.values()))

    def _checked_call(self, args, kwargs):
        """The arguments bound as Python binds them, or the TypeError's text as a sentence at the user's line."""
        _bind(self.fn, self._signature, args, kwargs, lambda e: f"{getattr(self.fn, '__name__', 'the function')}(): {e}")

    def _program(self):
        if self._last is None:
            from .tensor import user_location

            raise MicaError(f"{getattr(self.fn, '__name__', 'the function')} is compiled at its first call, for "
                            "its arguments' shapes; call it first", user_location())
        return self._last

    @property
    def source(self):
        return self._program().source

    @property
    def memory_report(self):
        return self._program().memory_report

    @property
    def ir(self):
        return self._program().lowered.program.ir

    KEPT = 16  # (programs a compiled function keeps, the oldest dropped first)

    def _say_recompiles(self, key, leaves):
        """Warn once when a Python value among the arguments, or one the function reads besides them
        (a global, a closure's variable, a module's attribute: guards.py), has compiled the function
        a third time (each value a constant of its own program: torch.compile's recompiles, which it
        stops by making a number dynamic; here an np.float32 or np.int64 argument is an input)."""
        tree, specs, read = key
        static = lambda s: isinstance(s, tuple) and s[:1] == ("static",)  # noqa: E731
        same = [k for k in self.built if k[0] == tree and all(static(a) or a == b for a, b in zip(k[1], specs))]
        if len({id(self.built[k]) for k in same}) < 2 or getattr(self, "_said_recompiles", False):
            return  # (programs, not keys: a program is also kept under the key its own trace left)
        import warnings

        from . import guards
        from .tensor import user_location

        self._said_recompiles = True
        moved = [repr(x)[:40] for x, a, b in zip(leaves, same[-1][1], specs) if static(a) and a != b]
        path, line = user_location() or ("<mica>", 0)
        name = getattr(self.fn, '__name__', 'the function')
        if moved:
            said = (f"{name} is compiled a third time, for a new value of a Python number among its arguments "
                    f"({', '.join(moved[:2])}): each value is a constant of its own program; pass it as "
                    "np.float32(...) or np.int64(...), an input, to compile once")
        else:
            said = (f"{name} is compiled a third time, for new values of what it reads besides its arguments "
                    f"({', '.join(guards.changed(same[-1][2], read)[:3]) or 'a global or an attribute'}): each value "
                    "is a constant of its own program; pass a value that changes as an argument (a number as "
                    "np.float32(...)) to compile once")
        warnings.warn_explicit(said, UserWarning, path, line)

    def _say_shapes(self, key):
        """Warn once when the arguments' shapes (or types) have made a third program, the rest of the
        key the same: each shape is a program of its own (torch.compile's dynamic shapes are not
        Mica's: a sequence of each length compiles anew), so a few fixed lengths compile fastest."""
        tree, specs, read = key
        static = lambda s: isinstance(s, tuple) and s[:1] == ("static",)  # noqa: E731
        shapes = {k[1] for k in self.built if k[0] == tree and k[2] == read and len(k[1]) == len(specs) and all(
            a == b for a, b in zip(k[1], specs) if static(a) or static(b))}
        if len(shapes | {specs}) < 3 or getattr(self, "_said_shapes", False):
            return
        import warnings

        from .tensor import user_location

        self._said_shapes = True
        seen = sorted({tuple(getattr(s, "shape", ())) for k in shapes | {specs} for s in k if not static(s)})
        path, line = user_location() or ("<mica>", 0)
        warnings.warn_explicit(
            f"{getattr(self.fn, '__name__', 'the function')} is compiled a third time, for arguments of new shapes "
            f"({', '.join(str(list(s)) for s in seen[:4])}{', ...' if len(seen) > 4 else ''}): each shape is a program "
            "of its own, built once and kept (the latest 16); pad or cut inputs to a few fixed lengths to compile "
            "fewer", UserWarning, path, line)

    def _say_drawn(self, names):
        """Warn once when the function drew from a random generator of numpy's or Python's while it
        was traced: what it drew is a constant of the program, the same numbers at every call."""
        if not names or getattr(self, "_said_drawn", False):
            return
        import warnings

        from .tensor import user_location

        self._said_drawn = True
        path, line = user_location() or ("<mica>", 0)
        warnings.warn_explicit(f"{getattr(self.fn, '__name__', 'the function')} drew from {names[0]} while it was "
                               "traced, so the numbers drawn are constants of its program, the same at every call; "
                               "draw them outside and pass them in as an argument (dropout is the randomness a "
                               "compiled call draws anew)", UserWarning, path, line)

    def __call__(self, *args, **kwargs):
        with _TRACE_LOCK:  # (a call may trace, and reads and writes what the model's Parameters hold)
            _PYTHON_OUT.append(True)
            try:
                return self._call(args, kwargs)
            finally:
                _PYTHON_OUT.pop()

    def _call(self, args, kwargs):
        """One call: keyword arguments the function takes are its own (as torch.compile's), the rest
        of threads/seed/offset are the run's options."""
        run_options = {k: kwargs.pop(k) for k in self._RUN_OPTIONS if k in kwargs and not self._takes(k)}
        fn, given = self.fn, (tuple(args), dict(kwargs))
        if kwargs:  # (traced as one more pytree: its arrays inputs, its Python numbers constants)
            args, fn = given, _with_keywords(self.fn)
        if any(_trainable(x) for x in pytree.flatten(tuple(args), is_leaf=_is_spec_leaf)[0]):
            args, fn = _parameters_held(tuple(args), fn)  # (step(W, x) with W a Parameter: read as one)
        fn = with_writes(fn)  # (an argument changed in place is written back into the caller's array, as torch's)
        leaves, tree = pytree.flatten(tuple(args), is_leaf=_is_spec_leaf)
        from . import guards, stateful

        def key_now():  # (torch.compile's guards: what the function reads besides the arrays, whose change
            specs, read = [], list(guards.world(self.fn, self._slots, self._reads))  # makes another program)
            for x in leaves:
                if _is_spec_leaf(x):
                    specs.append(to_spec(x))
                else:
                    fp, reached = guards.value(x, self._slots, self._reads)
                    specs.append(("static", fp))
                    read += reached
            return tree, tuple(specs), tuple(read)

        key = key_now()
        if isinstance(self.built.get(key), stateful.StatefulStep) and self.built[key].stale():
            del self.built[key]  # (a group was added: the step is found and made again, its state carried over)
        made = key not in self.built
        if made:
            self._checked_call(*given)
            self._say_recompiles(key, leaves)
            self._say_shapes(key)
            randoms = guards.random_states(self.fn, leaves)
            while len(self.built) >= self.KEPT:  # (the oldest program goes: its values live in the model's
                del self.built[next(iter(self.built))]  # Parameters and the optimizers, not in it)
            found = stateful.find(fn, args, self.name)  # (torch's stateful step: the model's and optimizer's values)
            widened = self._reads.add(found.ran)  # (the code its traces ran: what the guards read from now on)
            self._say_drawn(guards.drawn(randoms))  # (right after the trace: a build's time is not the function's)
            if found.params or found.optimizers or found.written or found.assigned or found.slots:
                self.built[key] = stateful.StatefulStep(fn, found, args, dict(target=self.target, name=self.name,
                                                                              **self.options))
                self._slots.update(self.built[key].slot_marks)  # (its state outside modules: known by marks)
            elif found.keeps_nothing():  # (its find trace is its program: the function's Python runs once a trace)
                self.built[key] = found.program.lower(self.target, **self.options).build()
            else:
                _TORCH_FORM.append(self)  # (a loss.backward() there found nothing to train: backward's sentence)
                try:
                    self.built[key] = compile(fn, *args, target=self.target, name=self.name, **self.options)
                finally:
                    _TORCH_FORM.pop()
        built = self.built[key]
        prepared = built.prepare() if isinstance(built, stateful.StatefulStep) else None  # (its program, once a call)
        if made:  # (what tracing itself left, as a forward's `self.last = y`: the same program, not another)
            now = key_now()
            self.built.setdefault(now, built)
            if widened and now != key:  # (a key read before the guards knew the code it runs: never met again)
                self.built.pop(key, None)
        self._last = prepared[0] if prepared else built
        drawn = "seed" not in run_options and _random(self._last)
        if drawn:  # (dropout: a key drawn at each call from mica's host generator, as torch's from its own, so
            from .random import default_generator  # manual_seed repeats it and get/set_rng_state resume it)

            run_options["seed"] = int(default_generator._rng.integers(0, 2 ** 63))
        run_options.setdefault("offset", 0 if drawn else self.calls)  # (a seed given: the call count moves the key)
        self.calls += 1
        out = built(args, run_options, prepared) if prepared else built(*args, **run_options)
        if made and isinstance(built, stateful.StatefulStep) and built.slots and not any(
                s.was_none for s in built.slots):  # (and what its first run left in the places it rebinds: a (1, n)
            self.built.setdefault(key_now(), built)  # running mean where (n,) was; not where None was: its branch)
        from .host import host

        return host(written_back(out, leaves))  # (torch's tensors: host tensors, as a torch-style step's)
