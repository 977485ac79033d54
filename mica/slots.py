"""What a compiled step rebinds outside its modules: a global (makemore's `global bnmean_running;
bnmean_running = 0.999 * bnmean_running + 0.001 * bnmeani`), a closure's variable (`nonlocal`), or
an attribute of a plain Python object (makemore's own layer classes, not nn.Module:
`self.running_mean = ...`, `self.out = ...`).

torch's eager step simply leaves the new tensor there. A traced step would leave a traced tensor
there, dead once its trace ends. So the first ("find") trace notes each such place (a Slot) and puts
its value back, and the compiled step treats it as nn.Module's buffers and attributes are treated
(stateful.py):
- a place that held a tensor of the new value's shape and type (or a number, for a 0-d value) is
  the step's state: its value is an input of every call and its new value an output, which the
  place holds after the call (a host tensor, as torch's);
- any other place (one that held nothing, or something else) is an output only: the place holds
  the value after each call, and a read before the step assigns it is a sentence, as a stale
  constant would be wrong.
The compiled function's guards know these places by their marks (guards.py), so a new value there
does not trace the step again.
"""
import numpy as np

from .errors import MicaError
from .tensor import Tensor, user_location

_ABSENT = object()


class Slot:
    """One place a step rebinds: a key of a dict (a module's globals, a plain object's attributes),
    a closure cell (key None), or an attribute of an object with __slots__ (holder that object,
    `named` True)."""

    def __init__(self, holder, key, owner, where, named=False):
        self.holder, self.key, self.owner, self.where, self.named = holder, key, owner, where, named
        self.spec = None  # (its state's Spec; None: an output only)
        self.was_none = False  # (it held None before the first trace)
        self.name = None  # (its key in the compiled step's dicts)

    def get(self):
        if self.named:
            return getattr(self.holder, self.key, _ABSENT)
        if self.key is None:
            try:
                return self.holder.cell_contents
            except ValueError:
                return _ABSENT
        return self.holder.get(self.key, _ABSENT)

    def set(self, value):
        if self.named:
            if value is _ABSENT:
                if hasattr(self.holder, self.key):
                    object.__delattr__(self.holder, self.key)
            else:
                object.__setattr__(self.holder, self.key, value)
            return
        if self.key is None:
            if value is _ABSENT:
                del self.holder.cell_contents
            else:
                self.holder.cell_contents = value
        elif value is _ABSENT:
            self.holder.pop(self.key, None)
        else:
            self.holder[self.key] = value

    def mark(self, value):
        """Its fingerprint for the guards: the shape and kind of what it holds where it is state (a
        value of another shape makes another step), where the step only writes it whether it holds
        None (`if running is None: running = ...`: the first call's branch is not the next's)."""
        if self.spec is None:
            return ("slot", value is None)
        try:
            a = np.asarray(value)
            return ("slot", a.shape, a.dtype.kind)
        except Exception:
            return ("slot", id(value))

    def outcome(self):
        """(the compiled step's trace, at its end) The traced tensor it holds: the step's output."""
        from .stateful import _Unread

        v = self.get()
        if isinstance(v, _Unread) or not isinstance(v, Tensor):
            raise MicaError(f"the compiled step leaves {self.where} "
                            f"{'unassigned' if isinstance(v, _Unread) else 'holding ' + _said(v)} on this path, where "
                            "its first trace assigned it a tensor; assign it a tensor on every path", user_location())
        if self.spec is not None and (tuple(v.shape) != tuple(self.spec.shape) or v.dtype != self.spec.dtype):
            raise MicaError(f"the compiled step rebinds {self.where}, its state, to {_said(v)} where its first trace "
                            f"kept a {_said_spec(self.spec)} there; keep its shape and type", user_location())
        return v

    def value_now(self):
        """(state) What it holds, as the step's input: its Spec's shape and type, else a sentence."""
        from .verbs.core import in_dtype

        v = self.get()
        a = None if v is _ABSENT or type(v).__name__ == "Parameter" else np.asarray(v) if _plain(v) else None
        if a is not None and a.shape != tuple(self.spec.shape) and _fits(a.shape, tuple(self.spec.shape)):
            a = a.reshape(self.spec.shape)  # (the value the step began from, before its first call made it (1, n))
        if a is None or a.dtype.kind not in "biuf" or a.shape != tuple(self.spec.shape):
            raise MicaError(f"{self.where} holds {_said(v)} where the compiled step keeps a {_said_spec(self.spec)} "
                            "there as its state; give it a tensor of that shape (or make the step again)",
                            user_location())
        return in_dtype(a, self.spec.dtype)


def _boxes_tensors(v):
    """Whether v is a list, tuple or dict holding a traced tensor (at any depth)."""
    if isinstance(v, dict):
        v = list(v.values())
    return isinstance(v, (list, tuple)) and any(isinstance(x, Tensor) or _boxes_tensors(x) for x in v)


def _plain(v):
    return isinstance(v, (np.ndarray, np.generic, int, float, bool))


def _said(v):
    if v is _ABSENT:
        return "nothing"
    if isinstance(v, (Tensor, np.ndarray)):
        return f"a {tuple(v.shape)} {getattr(v.dtype, 'name', v.dtype)} tensor"
    return f"a {type(v).__name__}"


def _said_spec(spec):
    return f"{tuple(spec.shape)} {spec.dtype.name} tensor"


def _where(key, owner):
    return f"the global {key}" if owner is None else f"{type(owner).__name__}.{key}"


class Snapshot:
    """(before the find trace) What each place fn could rebind holds: its globals, closure cells
    and plain objects' attributes (guards.holders)."""

    def __init__(self, fn, leaves):
        from .guards import holders

        self.kept = []
        for holder, owner in holders(fn, leaves):
            if owner == "__slots__":  # (an object's __slots__ attributes)
                names = [n for c in type(holder).__mro__ for n in getattr(c, "__slots__", ()) if isinstance(n, str)]
                self.kept.append((holder, owner, {n: getattr(holder, n, _ABSENT) for n in names}))
            elif isinstance(holder, dict):
                self.kept.append((holder, owner, dict(holder)))
            else:
                try:
                    self.kept.append((holder, owner, holder.cell_contents))
                except ValueError:
                    self.kept.append((holder, owner, _ABSENT))

    def shared(self):
        """[(Slot, the Slot another compiled step keeps there, value)] of the places fn could read that
        another compiled step keeps as its state (KNOWN)."""
        out = []
        for holder, owner, before in self.kept:
            if owner == "__slots__":
                for key, was in before.items():
                    known = _known(holder, key, was)
                    if known is not None:
                        out.append((Slot(holder, key, holder, f"{type(holder).__name__}.{key}", named=True), known, was))
            elif isinstance(holder, dict):
                for key, was in before.items():
                    known = _known(holder, key, was)
                    if known is not None:
                        out.append((Slot(holder, key, owner, _where(key, owner)), known, was))
            else:
                known = _known(holder, None, before)
                if known is not None:
                    out.append((Slot(holder, None, owner, "a closure variable"), known, before))
        return out

    def rebound(self):
        """[(Slot, what it held before)] of the places the trace left a traced tensor in, each put
        back as it was."""
        out, boxed, self.counted = [], [], []
        for holder, owner, before in self.kept:
            if owner == "__slots__":
                for key, was in before.items():
                    now = getattr(holder, key, _ABSENT)
                    if isinstance(now, Tensor) and was is not now:
                        out.append((Slot(holder, key, holder, f"{type(holder).__name__}.{key}", named=True), was))
                    elif now is not was and _boxes_tensors(now):
                        boxed.append((Slot(holder, key, holder, f"{type(holder).__name__}.{key}", named=True), was))
                continue
            if isinstance(holder, dict):
                for key, now in list(holder.items()):
                    if isinstance(now, Tensor) and before.get(key, _ABSENT) is not now:
                        out.append((Slot(holder, key, owner, _where(key, owner)), before.get(key, _ABSENT)))
                    elif now is not before.get(key, _ABSENT) and _boxes_tensors(now):
                        boxed.append((Slot(holder, key, owner, _where(key, owner)), before.get(key, _ABSENT)))
                    elif type(now) in (int, float) and type(before.get(key, _ABSENT)) in (int, float) and \
                            now != before[key]:  # (`count += 1`: Python, run when the step is traced)
                        self.counted.append(_where(key, owner))
            else:
                slot = Slot(holder, None, owner, "a closure variable")
                if isinstance(slot.get(), Tensor) and slot.get() is not before:
                    out.append((slot, before))
        for slot, before in out:
            slot.now = slot.get()  # (the traced tensor the trace left: its Spec)
            slot.set(before)
        self.boxed = []
        for slot, before in boxed:  # (a list, tuple or dict of traced tensors: put back, and said by found())
            self.boxed.append((slot.where, type(slot.get()).__name__))
            slot.set(before)
        return out


# {(id(holder), key): Slot} the state places of every compiled step made (a global, closure variable
# or attribute a step rebinds and reads back at its next call): another compiled function that reads
# one (an evaluation reading the running mean the training step keeps) takes its value as an input at
# each call, not as a constant the training step's next call would make stale
KNOWN = {}


def remember(slots):
    for slot in slots:
        if slot.spec is not None:
            KNOWN[(id(slot.holder), slot.key)] = slot


def _known(holder, key, value):
    """The Slot another step keeps at holder[key] where it still holds a value of its state's shape
    and type, else None."""
    known = KNOWN.get((id(holder), key))
    if known is None or known.holder is not holder or value is _ABSENT:
        return None
    spec = known.spec
    if isinstance(value, np.ndarray):
        fits = value.shape == tuple(spec.shape) and _dtype(value) == spec.dtype
    else:
        fits = _plain(value) and not spec.shape
    return known if fits else None


def reading(fn, places):
    """fn, with each known place (Slot, value) holding its value as a traced tensor while it runs: a
    trace that reads it leaves that tensor there, which Snapshot.rebound() finds as a place the step
    keeps (its state: an input at each call), as if the step had rebound it."""
    import functools

    @functools.wraps(fn)
    def run(*args, **kwargs):
        from .verbs.core import as_tensor

        for slot, known, value in places:
            slot.set(as_tensor(np.asarray(value), dtype=known.spec.dtype))
        return fn(*args, **kwargs)
    return run


def _fits(shape, new):
    """Whether a tensor of `shape` is one of shape `new` but for leading 1s (makemore's running_mean,
    (n,), rebound to a (1, n) mean): the same elements, so its values are the state's first ones."""
    return len(shape) <= len(new) and all(n == 1 for n in new[:len(new) - len(shape)]) and \
        tuple(new[len(new) - len(shape):]) == tuple(shape)


def _dtype(a):
    from .dtypes import as_dtype

    try:
        return as_dtype(a.dtype)
    except Exception:
        return None


def say_counted(counted):
    """Warn once per place that the step changed a Python number there while it was traced (a
    counter: `global count; count += 1`): that ran when the step was traced, not at each call."""
    import warnings

    for where in counted:
        if where in _SAID:
            continue
        _SAID.add(where)
        path, line = user_location() or ("<mica>", 0)
        warnings.warn_explicit(f"the compiled step changes {where}, a Python number, as Python runs it: when the step is "
                               "traced, not at each call (twice for a training step, which is then traced again at "
                               "each call, as the number it read has changed: a data loader's position moves two "
                               "batches a call); do it outside the step (x, y = loader.next_batch(), then step(x, y)), "
                               "or keep the count in a tensor (count = count + 1 with count = torch.zeros(()) is kept "
                               "at each call)", UserWarning, path, line)


_SAID = set()


def found(rebound, boxed=()):
    """The Slots of the find trace's rebound places, each with its Spec where it is state (a
    sentence where a Parameter was rebound, or a place given a list, tuple or dict of tensors)."""
    from .dtypes import Spec

    if boxed:
        where, kind = boxed[0]
        raise MicaError(f"the compiled step rebinds {where} to a {kind} holding tensors, which it cannot keep between "
                        "calls; keep each tensor in a global or attribute of its own (the step keeps those), or "
                        "return them from the step", user_location())

    slots = []
    for slot, before in rebound:
        now = slot.now
        slot.was_none = before is None  # (an output it held None before: `if running is None:` read it)
        if type(before).__name__ == "Parameter":
            raise MicaError(f"the compiled step rebinds {slot.where}, a tensor that requires a gradient, to a new "
                            f"tensor (torch's would stop being a leaf and get no gradient); update it in place "
                            f"under torch.no_grad() ({slot.key or 'p'}.data -= lr * {slot.key or 'p'}.grad, or "
                            f"{slot.key or 'p'}.sub_(...))", now._value.node.loc or user_location())
        if isinstance(before, np.ndarray) and before.ndim:  # (a tensor of the new one's shape and type: state;
            if _fits(before.shape, tuple(now.shape)) and _dtype(before) == now.dtype:  # another: an output only)
                slot.spec = Spec(tuple(now.shape), now.dtype)
        elif _plain(before) and not now.shape and np.asarray(before).dtype.kind in "biuf":
            slot.spec = Spec((), now.dtype)  # (a number, or a 0-d tensor: the running loss)
        slots.append(slot)
    return slots


def name_all(slots, taken):
    """Give each Slot a unique name (its key in the compiled step's dicts), not among `taken`."""
    taken = set(taken)
    for slot in slots:
        name = slot.where.replace("the global ", "").replace("a closure variable", "closure")
        while name in taken:
            name += "_"
        taken.add(name)
        slot.name = name


def named_in(rebound, shared, codes):
    """rebound without the shared places (Snapshot.shared) that the user's code the trace ran
    (`codes`) never names: a global by a name it loads, an attribute by an attribute name it reads."""
    from .guards import _names_loaded, _users

    names = set()
    for code in codes:
        if _users(code):
            names |= _names_loaded(code)
    injected = {(id(slot.holder), slot.key) for slot, _, _ in shared}
    return [(slot, before) for slot, before in rebound
            if (id(slot.holder), slot.key) not in injected or slot.key is None or slot.key in names]
