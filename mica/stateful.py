"""torch's stateful training loop, compiled: a step written as torch writes it, with the model's
parameters, `loss.backward()`, `optimizer.zero_grad()` and `optimizer.step()`, under
`mica.compile` (torch.compile's contract: compiled at the first call).

Mica's steps are functional (values in, values out); this is the same thing with the state kept
for the user. The first call traces the step once to find what it reads: the Parameters read
unbound and the optimizers stepped. Then the step is traced again as a function of (its arguments,
those parameters' values, the optimizers' states, each group's learning rate and live settings:
momentum, Adam's beta1, which OneCycleLR moves), returning its
result and the new parameters and states, and compiled. Each call runs it on the values the model
and the optimizers hold, and keeps the new ones: the model's (Parameter._held, which eager calls
outside a trace also read) and the optimizer's. In the trace, backward() adds mica.grad(loss,
parameters) to each parameter's gradient, zero_grad() drops them, step() is the optimizer's
update on the parameters' current values (later reads in the step see the new ones).
"""
import numpy as np

from .errors import MicaError
from .tensor import user_location

_ACTIVE = []  # the step being traced (one at a time)
_WARNED = set()  # the lines setting an lr to a Python number in a step, warned about


class Live(float):
    """An optimizer setting the compiled step takes as an input at each call (Optimizer.live:
    momentum, Adam's beta1, which OneCycleLR moves at every step): the number it was when the
    program was built, for the optimizer's Python decisions (`if momentum != 0`, which the program's
    pattern keys), whose arithmetic is its traced float64 value, as a Python float's would be (a
    float32 tensor times it rounds it to float32 once, as a constant)."""

    def __new__(cls, value, tensor):
        live = float.__new__(cls, value)
        live._mica_tensor = tensor
        return live

    def __add__(self, o):
        return self._mica_tensor + o

    def __radd__(self, o):
        return o + self._mica_tensor

    def __sub__(self, o):
        return self._mica_tensor - o

    def __rsub__(self, o):
        return o - self._mica_tensor

    def __mul__(self, o):
        return self._mica_tensor * o

    def __rmul__(self, o):
        return o * self._mica_tensor

    def __truediv__(self, o):
        return self._mica_tensor / o

    def __rtruediv__(self, o):
        return o / self._mica_tensor

    def __pow__(self, o):
        return self._mica_tensor ** o

    def __rpow__(self, o):
        return o ** self._mica_tensor

    def __neg__(self):
        return -self._mica_tensor


def _live_values(opt, group):
    """A group's live settings for one call, as float64 numbers (Optimizer.live's order)."""
    out = []
    for key in opt.live:
        if key in group:
            out.append(np.float64(group[key][0] if key == "betas" else group[key]))
    return out


def _with_live(opt, settings, tensors):
    """The group's settings with its live ones as Live numbers over their traced values."""
    settings, tensors = dict(settings), list(tensors)
    for key in opt.live:
        if key in settings:
            if key == "betas":
                settings[key] = (Live(settings[key][0], tensors.pop(0)), *tuple(settings[key])[1:])
            else:
                settings[key] = Live(settings[key], tensors.pop(0))
    return settings


def _live_class(opt, key, value):
    """What of a live setting's value the program is built on (the optimizers' decisions on it)."""
    if key == "betas":
        b = tuple(value)
        return (("live", abs(1 - float(b[0])) < 0.5),) + b[1:]
    return ("live", float(value) != 0)


class StepTrace:
    """What a traced stateful step reads and keeps: mode "find" (the first trace: note what is
    read) or "trace" (the compiled one: parameters are inputs)."""

    def __init__(self, mode):
        self.mode = mode
        self.params = []      # Parameters read or stepped, in first-use order
        self.optimizers = []  # optimizers stepped, in first-use order
        self.bound = {}       # id(Parameter) -> its current Tensor
        self.grads = _GradUses() if mode == "find" else {}  # id(Parameter) -> its accumulated gradient Tensor
        self.states = {}      # id(optimizer) -> its state (a pytree of Tensors)
        self.lrs = {}         # id(optimizer) -> [each group's learning rate, a traced scalar]
        self.lives = {}       # id(optimizer) -> [each group's live settings (Optimizer.live), traced scalars]
        self.modules = []     # the modules whose parameters were read (their train/eval mode keys the step)
        self.names = {}       # id(Parameter) -> its key in the compiled step's dicts (fixed when the step is made)
        self.backwarded = []  # (loss Tensor, retain_graph) of each backward() call (a second call needs retain_graph=True)
        self.set_lrs = {}     # id(param group) -> (the group, its lr before the step set it): set_lr()
        self.touched = []     # the modules whose attributes the first trace looked up (their contents key it)
        self.scalers = []     # torch-form GradScalers (enabled) used, in first-use order
        self.scaler_states = {}  # id(scaler) -> {"scale", "growth_tracker"} Tensors
        self.unscaled = {}    # id(scaler) -> {id(optimizer): its found_inf flag} since the scaler's last update()
        self.scaler_stepped = {}  # id(scaler) -> {id(optimizer)} stepped since its last update()
        self.assigned = {}    # (id(module), name) -> (module, name, (had it, value before)): `self.last_loss = loss`
        self.buffers = {}     # (id(module), name) -> [module, name, its Tensor now]: the buffers read, one Tensor each
        self.written = []     # (find) [(module, name)] of the buffers the step writes, in first-write order
        self.containers = []  # (find) [(module, name, list or dict, a copy of its items)] of the modules looked into
        self.state = {}       # (trace) (id(module), name) -> its input Tensor: the buffers that are the step's state
        self.stood_in = False  # (find: a parameter's gradient was given as a stand-in of zeros)
        self.program = None   # (find: the Program its trace made, which is the step's own when it keeps nothing)
        self.slots = []       # (find) [Slot] of the globals, closure variables and plain objects' attributes it rebinds
        self.retained = []    # the traced tensors retain_grad() was called on (non-leaves whose gradient is kept)
        self.retained_grads = {}  # id(Tensor) -> its gradient after backward()

    def keeps_nothing(self):
        """(find) Whether the function read no Parameter, stepped no optimizer or scaler and called no
        backward(): then the find trace is the function's program as it is, traced once."""
        return not (self.params or self.optimizers or self.scalers or self.backwarded or self.set_lrs
                    or self.stood_in or self.written or self.assigned or self.slots)

    def assign(self, module, name, value):
        """module.name = value (a traced Tensor, or a list, tuple or dict of them) in the traced step:
        the module holds it for the rest of the trace, then its value before (restore); in the
        compiled step it is an output, which the module holds after each call (llama2.c's
        `self.last_loss`), as torch's forward leaves it."""
        key = (id(module), name)
        if key not in self.assigned:
            self.assigned[key] = (module, name, (name in module.__dict__, module.__dict__.get(name)))
        object.__setattr__(module, name, value)

    def buffer(self, module, name, make):
        """module.name, a buffer, read in the traced step: one Tensor for the whole trace, so a write
        is seen by later reads. In the find trace it notes a write; in the compiled one a buffer the
        step writes is its input (and its final Tensor an output), one it only reads a constant."""
        key = (id(module), name)
        if key not in self.buffers:
            if self.mode == "find" and name in module.__dict__.get("_mica_state_buffers", ()):
                self.wrote(module, name)  # (one a compiled step writes: an input here too, never a stale constant)
            if self.mode == "trace" and key in self.state:
                t = self.state[key]
            else:
                t = make()
                t._buffer = _StepBuffer(self, module, name) if self.mode == "find" else f"{type(module).__name__}.{name}"
            self.buffers[key] = [module, name, t]
        return self.buffers[key][2]

    def assign_buffer(self, module, name, value):
        """module.name = value for a buffer in the traced step: its Tensor from now on (a write)."""
        key = (id(module), name)
        if self.mode == "find":
            self.wrote(module, name)
        elif key not in self.state:
            raise MicaError(f"the buffer {type(module).__name__}.{name} is assigned in the compiled step where its first "
                            "trace did not assign it; assign it on every path", user_location())
        self.buffers[key] = [module, name, value]

    def wrote(self, module, name):
        if all(m is not module or n != name for m, n in self.written):
            self.written.append((module, name))

    def buffers_now(self, keys):
        """The state buffers' final Tensors, in `keys`' order."""
        return [self.buffers[k][2] if k in self.buffers else self.state[k] for k in keys]

    def assigned_now(self):
        """[(module, name, what it holds)] of the attributes assigned that hold traced values at the
        trace's end (a Tensor, or a list, tuple or dict holding some)."""
        from .nn.modules import _tensor_leaves

        return [(m, name, m.__dict__.get(name)) for m, name, _ in self.assigned.values()
                if _tensor_leaves(m.__dict__.get(name))]

    def restore(self):
        from .nn.modules import _put_back

        for m, name, (had, before) in self.assigned.values():
            _put_back(m, name, had, before)

    def set_grad_of(self, t, value):
        """t.grad = value for the parameter whose current Tensor t is (None drops it)."""
        p = self.parameter_of(t)
        if p is None:
            raise MicaError("only a parameter's gradient can be set in a compiled step", user_location())
        if value is None:
            self.grads.pop(id(p), None)
        else:
            self.grads[id(p)] = value

    def parameter_of(self, t):
        """The Parameter whose current Tensor t is, or None."""
        return next((p for p in self.params if self.bound.get(id(p)) is t), None)

    def retain(self, t):
        if self.parameter_of(t) is None and all(r is not t for r in self.retained):
            self.retained.append(t)

    def grad_of(self, t):
        """The gradient of the parameter whose current Tensor t is, or of a tensor retain_grad()
        was called on (None: neither, or none yet)."""
        p = self.parameter_of(t)
        if p is None:
            if self.mode == "find" and any(r is t for r in self.retained):
                from . import verbs as F

                return F.zeros_like(t)  # (a stand-in: this trace is never run)
            return self.retained_grads.get(id(t))
        if self.mode == "find":  # (a stand-in of the gradient's shape: this trace is never run)
            from . import verbs as F

            self.grads.used(id(p))
            self.stood_in = True
            return F.zeros_like(t)
        return self.grads.get(id(p))

    def note(self, p):
        if all(q is not p for q in self.params):
            self.params.append(p)


class _GradUses(dict):
    """(find) The step's table of gradients, noting what the step first does with each parameter's:
    drops or replaces it ("drop": zero_grad() first, or p.grad = None; the gradient it holds from
    earlier calls cannot matter, so holding one makes no other program) or reads it ("use":
    backward() adds to it, an optimizer or clipping reads it, zero_grad(set_to_none=False)
    zeroes only one that is there)."""

    def __init__(self):
        super().__init__()
        self.first = {}

    def used(self, key):
        self.first.setdefault(key, "use")

    def dropped(self):
        return {k for k, first in self.first.items() if first == "drop"}

    def __getitem__(self, key):
        self.used(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.used(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.used(key)
        return super().__contains__(key)

    def pop(self, key, *default):
        self.first.setdefault(key, "drop")
        return super().pop(key, *default)

    def __setitem__(self, key, value):
        self.first.setdefault(key, "drop")
        super().__setitem__(key, value)


class _StepBuffer(str):
    """A buffer's name on the Tensor the find trace reads for it (Tensor._buffer): a write into that
    Tensor notes the buffer as the step's state (tensor.py's _rebind calls written)."""

    def __new__(cls, step, module, name):
        text = str.__new__(cls, f"{type(module).__name__}.{name}")
        text.step, text.module, text.name = step, module, name
        return text

    def written(self):
        self.step.wrote(self.module, self.name)


def active():
    return _ACTIVE[-1] if _ACTIVE else None


def touch(module):
    """A module's attribute looked up in the finding trace (and the lists and dicts it holds copied:
    one the step puts a Tensor into is refused after the trace, and given back its items)."""
    step = active()
    if step is not None and step.mode == "find" and all(m is not module for m in step.touched):
        step.touched.append(module)
        from .nn.modules import _items

        seen = {id(v) for _, _, v, _ in step.containers}
        for m in module.modules():  # (its submodules' too: a helper module holding only a list)
            for name, v in list(m.__dict__.items()):
                if not name.startswith("_") and isinstance(v, (list, dict)) and id(v) not in seen:
                    seen.add(id(v))
                    step.containers.append((m, name, v, _items(v)))


def _give_back(s):
    from .nn.modules import _refill

    for _, _, v, items in s.containers:
        _refill(v, items)


def _check_containers(s):
    """(after the finding trace) A list or dict a module holds that the step put a traced Tensor into
    (`self.kv[0] = k`) is given back its items, and refused: the step cannot keep it between calls."""
    from .tensor import Tensor

    for m, name, v, items in s.containers:
        held = v.values() if isinstance(v, dict) else v
        if any(isinstance(x, Tensor) for x in held):
            _give_back(s)
            raise MicaError(f"the compiled step puts a tensor into {type(m).__name__}.{name}, a "
                            f"{type(v).__name__} the module holds, which the step cannot keep between calls; assign "
                            f"the attribute itself (self.{name} = [...]: the module holds the new value after each "
                            "call), or keep the values in buffers", user_location())


class _Unread:
    """What an attribute the compiled step assigns holds while the step is traced for its program:
    the value an earlier call left there would be a constant of the program (its new values are
    outputs, not inputs), so a read before the step assigns it is a sentence, not a stale value."""

    def __init__(self, where):
        object.__setattr__(self, "_where", where)

    def _refuse(self, *args, **kwargs):
        raise MicaError(f"the compiled step reads {object.__getattribute__(self, '_where')} before assigning it, so the "
                        "value an earlier call left there would be a constant of its program; keep a running value "
                        "in a buffer (register_buffer, updated in place: self.ema.mul_(0.9).add_(...)) or a "
                        "Parameter(requires_grad=False), which the step keeps as its state", user_location())

    __getattr__ = _refuse


for _dunder in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
                "__matmul__", "__rmatmul__", "__pow__", "__rpow__", "__neg__", "__lt__", "__le__", "__gt__", "__ge__",
                "__bool__", "__float__", "__int__", "__index__", "__len__", "__iter__", "__getitem__", "__setitem__",
                "__array__", "__call__", "__abs__"):
    setattr(_Unread, _dunder, _Unread._refuse)


def _structure(modules):
    """What the step found in the modules it looked into: a submodule or Parameter replaced or
    added (a new head, an adapter) makes it another step."""
    return [(tuple((k, id(v)) for k, v in m.__dict__.get("_modules", {}).items()),
             tuple((k, id(v)) for k, v in m.__dict__.get("_parameters", {}).items()),
             tuple(m.__dict__.get("_buffers", {}))) for m in modules]


def read(p, module=None):
    """An unbound Parameter read in a stateful step (by `module`): its current Tensor."""
    step = active()
    if step is None:
        return p
    if step.mode == "find":
        step.note(p)
        if module is not None and all(m is not module for m in step.modules):
            step.modules.append(module)
        if id(p) not in step.bound:
            from . import verbs as F

            # (a stand-in: this trace is never run; one value per parameter, not zeros all hash-consed into
            # one, so backward() below tells which parameters a loss reaches: a GAN's D step, not G's)
            step.bound[id(p)] = F.full(p.shape, len(step.bound) + 1, dtype=p.dtype)
        return step.bound[id(p)]
    if id(p) not in step.bound:
        raise MicaError("a Parameter the step's first trace did not read is read now: a module or Parameter made "
                        "inside the compiled step is a new one each time the step runs, so make it once before the "
                        "loop (or one reached some other way than through a module's attributes: give it to the "
                        "step as an argument)", user_location())
    return step.bound[id(p)]


def keys(params):
    """A name per Parameter: the fullest one named_parameters() gave it (model.state_dict()'s
    "head.weight" over head.parameters()' "weight"), unique among them."""
    out, taken = {}, set()
    for i, p in enumerate(params):
        name = min(getattr(p, "_names", ()) or {f"param{i}"}, key=lambda n: (-n.count("."), n))
        while name in taken:
            name = f"{name}.{i}"
        taken.add(name)
        out[id(p)] = name
    return out


def backward(loss, retain_graph=None):
    step = active()
    from . import verbs as F
    from .grad import grad

    if loss.numel() != 1:
        raise MicaError(f"backward() of a {loss.value.spec!r} tensor needs a gradient for it; call it on a scalar loss",
                        user_location())
    params = [p for p in step.params if p.requires_grad and p.dtype.kind == "float"]
    # (said in the first trace too when nothing read requires a gradient: makemore's learners forget
    # requires_grad, and their next line, p.data += -lr * p.grad, would fail on None before the real trace)
    if not step.params:
        from .tensor import NOTHING_TO_DIFFERENTIATE

        raise MicaError(NOTHING_TO_DIFFERENTIATE, user_location())
    if not params or step.mode == "trace" and not _reaches(loss, [step.bound[id(p)] for p in params]):
        raise MicaError("backward() was called on a loss that no parameter requiring a gradient reaches (it was "
                        "computed under no_grad, detached, or from frozen parameters only), so there is nothing to "
                        "differentiate; call it on the loss the model computed", user_location())
    retained = [kept for t, kept in step.backwarded if t is loss]
    if retained and not retained[-1]:
        raise MicaError("backward() was called twice on the same loss; as torch, the second call needs "
                        "loss.backward(retain_graph=True) on the first (or compute the loss again)", user_location())
    step.backwarded.append((loss, bool(retain_graph)))
    if step.mode == "find":  # (its parameters' stand-ins are not inputs: the real trace checks the paths)
        reached = _reached(loss)
        for p in params:  # (backward() adds to the gradient of each parameter the loss reaches)
            if step.bound[id(p)].value.id in reached:
                step.grads.used(id(p))
        return None
    from .optim.base import has_gradient

    kept = [t for t in step.retained if t.dtype.kind == "float"]
    grads = grad(F.reshape(loss, ()), [step.bound[id(p)] for p in params] + kept)
    for p, g in zip(params, grads):
        if has_gradient(g):  # (one the loss does not reach keeps no gradient: torch's p.grad None)
            step.grads[id(p)] = g if id(p) not in step.grads else step.grads[id(p)] + g
    for t, g in zip(kept, grads[len(params):]):  # (retain_grad: a non-leaf's gradient, kept as torch's)
        if has_gradient(g):
            step.retained_grads[id(t)] = g if id(t) not in step.retained_grads else step.retained_grads[id(t)] + g
    return None


def _reached(loss):
    """The ids of the values the loss is computed from along paths gradients flow through."""
    todo, seen = [loss.value], set()
    while todo:
        v = todo.pop()
        if v.id in seen or v.node.op == "detach":
            continue
        seen.add(v.id)
        todo.extend(v.node.inputs)
    return seen


def _reaches(loss, tensors):
    """Whether the loss is computed from any of `tensors` along a path gradients flow through (not
    through a detach: what no_grad computes is detached): torch's loss.requires_grad."""
    targets = {t.value.id for t in tensors}
    todo, seen = [loss.value], set()
    while todo:
        v = todo.pop()
        if v.id in targets:
            return True
        if v.id in seen or v.node.op == "detach":
            continue
        seen.add(v.id)
        todo.extend(v.node.inputs)
    return False


def zero_grad(params, set_to_none=True):
    """Drop the parameters' gradients (torch's default), or make them zeros: a gradient of zeros
    that an optimizer still takes (torch's zero_grad(set_to_none=False): weight decay and momentum
    move), so not one the optimizers skip as zero by construction (optim/base.py, has_gradient)."""
    from . import verbs as F
    from .tensor import emit

    step = active()
    for p in params:
        if not set_to_none and step.mode == "find":
            step.grads.used(id(p))  # (only a gradient there is made zeros: whether one is held matters)
        if set_to_none or step.mode == "find":
            step.grads.pop(id(p), None)
        elif id(p) in step.grads:  # (as torch's: only a gradient there is made zeros; a None stays None)
            step.grads[id(p)] = emit("relu", [F.zeros(p.shape, dtype=p.dtype)])  # (zeros, not known zeros)


def zero_held_grads(params, set_to_none=True):
    """zero_grad() outside a step (and outside any trace): the gradients the parameters keep
    between calls dropped, or made zeros (torch's set_to_none=False: ones an optimizer still takes)."""
    from .tensor import in_trace

    if in_trace():
        return
    for p in params:
        held = getattr(p, "_held_grad", None)
        p._held_grad = None if set_to_none or held is None else np.zeros_like(held)


def _groups_of(opt, step):
    """The optimizer's groups as [(settings, [Parameter])]: Parameter objects, or names matched to
    the step's parameters by the names named_parameters() gave them."""
    if not opt.param_groups:
        raise MicaError(f"{type(opt).__name__}.step() in a compiled step needs the parameters it updates: make it "
                        f"with them, {type(opt).__name__}(model.parameters(), lr=...)", user_location())
    by_name = {}
    for p in step.params:
        for n in getattr(p, "_names", ()):
            by_name.setdefault(n, p)
    out = []
    for g in opt.param_groups:
        ps = []
        for item in g["params"]:
            if type(item).__name__ == "Parameter":
                ps.append(item)
            elif isinstance(item, str) and item in by_name:
                ps.append(by_name[item])
            else:
                raise MicaError(f"{type(opt).__name__}: a group names {item!r}, which the step does not read; give "
                                "the Parameter objects (model.parameters())", user_location())
        out.append(({k: v for k, v in g.items() if k != "params"}, ps))
    return out


def step(opt):
    """optimizer.step(): its update on the current values and gradients of its parameters."""
    s = active()
    groups = _groups_of(opt, s)
    if s.mode == "find":
        for _, ps in groups:
            for p in ps:
                s.note(p)
                read(p)
                s.grads.used(id(p))
        if all(o is not opt for o in s.optimizers):
            s.optimizers.append(opt)
        return None
    from .grad import no_gradient

    if id(opt) not in s.lrs:  # (one made in the body: a new object each time the body runs)
        raise MicaError(f"this {type(opt).__name__} was made inside the compiled step, so its state would start "
                        "afresh at every call; make it once before the loop (torch's training scripts do)",
                        user_location())
    name = s.names
    lrs = [_lr_in_step(s, g, lr) for g, lr in zip(opt.param_groups, s.lrs[id(opt)])]
    lives = s.lives.get(id(opt)) or [[] for _ in groups]
    keyed = [{**_with_live(opt, settings, live), "params": [name[id(p)] for p in ps], "lr": lr}
             for (settings, ps), lr, live in zip(groups, lrs, lives)]
    members = [p for _, ps in groups for p in ps]
    params = {name[id(p)]: s.bound[id(p)] for p in members}
    grads = {name[id(p)]: s.grads[id(p)] if id(p) in s.grads else no_gradient(s.bound[id(p)]) for p in members}
    saved = opt.param_groups
    opt.param_groups = keyed
    try:
        new_params, s.states[id(opt)] = opt.update(params, grads, s.states[id(opt)])
    finally:
        opt.param_groups = saved
    for p in members:
        s.bound[id(p)] = new_params[name[id(p)]]
    return None


def note_scaler(sc):
    """A torch-form GradScaler the step uses (its scale and growth tracker kept between calls); in
    the compiled trace its state Tensors, else None."""
    s = active()
    if s.mode == "find":
        if all(x is not sc for x in s.scalers):
            s.scalers.append(sc)
        return None
    if id(sc) not in s.scaler_states:  # (one made in the body: a new object each time the body runs)
        raise MicaError("this GradScaler was made inside the compiled step, so it would start afresh at every call; "
                        "make it once before the loop, as nanoGPT does", user_location())
    return s.scaler_states[id(sc)]


def scaler_unscale(sc, opt):
    """scaler.unscale_(optimizer): the gradients of the optimizer's parameters divided by the scale,
    and whether any was inf or NaN (kept for step and update), once per optimizer between updates."""
    from . import verbs as F

    state, s = note_scaler(sc), active()
    done = s.unscaled.setdefault(id(sc), {})
    if id(opt) in done:
        raise MicaError("GradScaler.unscale_() was called on this optimizer already since the last update(); as "
                        "torch, unscale each optimizer's gradients once a step", user_location())
    if state is None:
        done[id(opt)] = None
        return
    members = [p for _, ps in _groups_of(opt, s) for p in ps if id(p) in s.grads]
    if not members:  # (torch's: nothing to check, nothing found)
        done[id(opt)] = F.as_tensor(False)
        return
    grads, done[id(opt)] = sc.unscale([s.grads[id(p)] for p in members], state)
    for p, g in zip(members, grads):
        s.grads[id(p)] = g


def scaler_step(sc, opt):
    """scaler.step(optimizer): unscale_ first where the step has not, then the optimizer's step,
    kept only where no gradient was inf or NaN (else the parameters and its state keep their
    values, as torch skips optimizer.step())."""
    s = active()
    stepped = s.scaler_stepped.setdefault(id(sc), set())
    if id(opt) in stepped:
        raise MicaError("GradScaler.step(optimizer) was called twice on this optimizer since the last update(); as "
                        "torch requires, call scaler.update() after each step", user_location())
    stepped.add(id(opt))
    if id(opt) not in s.unscaled.get(id(sc), {}):
        scaler_unscale(sc, opt)
    found = s.unscaled[id(sc)][id(opt)]
    if s.mode == "find":
        return step(opt)
    members = [p for _, ps in _groups_of(opt, s) for p in ps]
    old = ([s.bound[id(p)] for p in members], s.states[id(opt)])
    step(opt)
    new = ([s.bound[id(p)] for p in members], s.states[id(opt)])
    values, s.states[id(opt)] = sc.step(found, old, new)
    for p, v in zip(members, values):
        s.bound[id(p)] = v
    return None


def scaler_update(sc):
    """scaler.update(): the scale backed off where any optimizer's gradients held an inf or NaN,
    grown after growth_interval clean steps (the functional update, on every flag since the last)."""
    from . import verbs as F

    state, s = note_scaler(sc), active()
    found = s.unscaled.pop(id(sc), {})
    s.scaler_stepped.pop(id(sc), None)
    if not found:
        raise MicaError("GradScaler.update() found no step to judge: call scaler.step(optimizer) (or unscale_) "
                        "before it, as torch requires", user_location())
    if state is None:
        return
    flags = list(found.values())
    s.scaler_states[id(sc)] = sc.update(state, flags[0] if len(flags) == 1 else F.any(F.stack(flags)))


def set_lr(group, value):
    """param_group["lr"] = value in a step being traced: noted with the value it had, which the
    group gets back after the trace when the new one is computed in the step (the program's output
    sets it after each call)."""
    s = active()
    if s is not None and id(group) not in s.set_lrs:
        s.set_lrs[id(group)] = (group, group.get("lr"), user_location())


def _lr_in_step(s, group, given):
    """A group's learning rate in the step: the one the call gives (an input), or the one the step
    set: computed from its arguments (a Tensor: each call's), or a Python number (a constant)."""
    from .tensor import Tensor

    if id(group) not in s.set_lrs:
        return given
    value = group.get("lr")
    return value if isinstance(value, Tensor) else float(value)


def _restore_lrs(s):
    """After a trace: the groups whose lr the step set to a Tensor hold their earlier value again
    (the call's result sets it); Python numbers set there stay, as torch's. Returns [group] of both."""
    from .tensor import Tensor

    computed, constant = [], []
    for group, before, where in s.set_lrs.values():
        if isinstance(group.get("lr"), Tensor):
            computed.append((group, group["lr"]))
            dict.__setitem__(group, "lr", before)
        else:
            constant.append(where)
    return computed, constant


class StatefulStep:
    """The compiled step and the values it keeps between calls (mica.compile's, for a step that
    reads unbound parameters or steps an optimizer): the parameters' values and gradients (torch
    keeps p.grad between calls until zero_grad), the optimizers' states. One program per pattern of
    what a call starts from: the modules' train/eval modes, which parameters hold a gradient and
    which require one, and the groups' settings other than lr (lr is an input). The parameters'
    keys in the program's dicts are fixed when the step is made (names that model.named_parameters()
    adds later change nothing); an optimizer's state is kept with the Parameters its entries belong
    to, so a step made again (a group added) carries it over. Adam's and SGD's step counts are per
    parameter, as torch's: one that had no gradient in a call is not counted (optim/base.py)."""

    def __init__(self, fn, found, args, compile_options):
        self.fn, self.args, self.options = fn, tuple(args), compile_options
        self.found = found
        self.params, self.optimizers = list(found.params), list(found.optimizers)
        # (the parameters whose gradient the step drops or replaces before reading it: zero_grad() first, as
        # torch's tutorials' loops do; the one a call holds then is no input, and no reason for another program)
        self.fresh = found.grads.dropped() if isinstance(found.grads, _GradUses) else set()
        self.scalers = list(found.scalers)
        self.buffers = list(found.written)  # [(module, name)] of the buffers the step writes: its state
        self.buffer_keys = [(id(m), name) for m, name in self.buffers]
        self.buffer_names = _buffer_names(self.buffers, found.touched + found.modules)  # ("bn.running_mean")
        self.assigns = [(m, name) for m, name, _ in found.assigned.values()]  # (attributes it assigns: _Unread)
        from . import slots as slots_module
        from .slots import name_all

        self.slots = list(found.slots)  # (the globals, closure variables and plain objects' attributes it rebinds)
        name_all(self.slots, self.buffer_names)
        self.slot_marks = {(id(s.holder), s.key): s for s in self.slots}  # (the guards know them by their marks)
        slots_module.remember(self.slots)  # (another compiled function reading one takes it as an input)
        for m, name in self.buffers:  # (their values are inputs, not constants of the step: not in its key)
            m.__dict__.setdefault("_mica_state_buffers", set()).add(name)
        self.modules = [m for owner in found.modules for m in owner.modules()]  # (and what they hold: Dropout)
        self.name = keys(self.params)
        self.groups = {id(o): _groups_of(o, found) for o in self.optimizers}
        self.membership = self._membership()
        self.structure = _structure(found.touched)
        self.programs = {}

    def _membership(self):
        return [[tuple(id(p) for p in ps) for _, ps in _groups_of(o, self.found)] for o in self.optimizers]

    def stale(self):
        """True when an optimizer's groups hold other parameters than when the step was made
        (add_param_group), or a module it looked into holds other submodules or Parameters (a head
        replaced, an adapter added): the step is found and made again."""
        return self._membership() != self.membership or _structure(self.found.touched) != self.structure

    def _pattern(self):
        from .optim.base import switched_on

        for o in self.optimizers:  # (set in a group between calls: refused as the optimizer's maker refuses it)
            taken = switched_on(o.param_groups, o)
            if taken:
                raise MicaError(f"{type(o).__name__}: a param group sets {taken}=True, torch's option Mica does "
                                "not have; set it back to False", user_location())
        modes = tuple(bool(m.training) for m in self.modules)
        graded = tuple(getattr(p, "_held_grad", None) is not None and id(p) not in self.fresh for p in self.params)
        frozen = tuple(not p.requires_grad for p in self.params)
        settings = repr(self._settings_now() + [sc._settings() for sc in self.scalers])
        return modes, graded, frozen, settings

    def _build(self, graded):
        from .dtypes import Spec, float32, float64
        import re

        from .trace import _argument_names, trace

        param_specs = {self.name[id(p)]: p.spec for p in self.params}
        grad_specs = {self.name[id(p)]: p.spec for p, g in zip(self.params, graded) if g}
        state_specs = [self._per_parameter(o, self._keyed(o, lambda o=o: o.state_specs(self._mine(o, param_specs))))
                       for o in self.optimizers]
        self.parts = {id(o): {part: set(v) if isinstance(v, dict) else None for part, v in spec.items()}
                      for o, spec in zip(self.optimizers, state_specs)}  # (a part's parameters: amsgrad's some)
        lr_specs = [[Spec((), float32) for _ in o.param_groups] for o in self.optimizers]
        live_specs = [[[Spec((), float64) for _ in _live_values(o, g)] for g in o.param_groups]
                      for o in self.optimizers]
        scaler_specs = [sc.state_specs() for sc in self.scalers]
        buffer_specs = {key: _buffer_spec(m, name) for key, (m, name) in zip(self.buffer_names, self.buffers)}
        slot_specs = {slot.name: slot.spec for slot in self.slots if slot.spec is not None}
        from . import slots as slots_module
        from .nn.modules import _put_back, _tensor_leaves

        computed = []  # [(group, its lr computed in the step)] of the last trace
        attrs = []  # [(module, name)] the last trace assigned traced values to

        def body(user_args, params, grads, states, lrs, lives, scalers, buffers, slots):
            s = StepTrace("trace")
            s.state = {bk: buffers[key] for bk, key in zip(self.buffer_keys, self.buffer_names)}
            s.params, s.names = list(self.params), self.name
            s.bound = {id(p): params[self.name[id(p)]] for p in self.params}
            s.grads = {id(p): grads[self.name[id(p)]] for p in self.params if self.name[id(p)] in grads}
            s.states = {id(o): st for o, st in zip(self.optimizers, states)}
            s.lrs = {id(o): lr for o, lr in zip(self.optimizers, lrs)}
            s.lives = {id(o): live for o, live in zip(self.optimizers, lives)}
            s.scalers = list(self.scalers)
            s.scaler_states = {id(sc): st for sc, st in zip(self.scalers, scalers)}
            held = [(m, name, name in m.__dict__, m.__dict__.get(name)) for m, name in self.assigns]
            for m, name in self.assigns:  # (a read before the step assigns it: a sentence, not a stale constant)
                object.__setattr__(m, name, _Unread(f"{type(m).__name__}.{name}"))
            kept = [(slot, slot.get()) for slot in self.slots]
            for slot, value in kept:  # (state: its input; an output only: read before it is assigned, a sentence,
                if slot.spec is not None:  # but None, or nothing, as it is: `if running is None:`)
                    slot.set(slots[slot.name])
                elif value is not None and value is not slots_module._ABSENT:
                    slot.set(_Unread(slot.where))
            _ACTIVE.append(s)
            try:
                result = self.fn(*user_args)
                attrs[:] = s.assigned_now()
                attr_values = [_tensor_leaves(held_now) for _, _, held_now in attrs]
                buffer_values = dict(zip(self.buffer_names, s.buffers_now(self.buffer_keys)))
                slot_values = {slot.name: slot.outcome() for slot in self.slots}
                slot_values = {n: v for n, v in slot_values.items() if v is not slots.get(n)}  # (one it only reads
                # keeps its value: no output, nothing written back)
                slot_grads = {n: s.retained_grads[id(v)] for n, v in slot_values.items() if id(v) in s.retained_grads}
            finally:
                _ACTIVE.pop()
                got, constant = _restore_lrs(s)
                s.restore()
                for m, name, had, value in held:
                    _put_back(m, name, had, value)
                for slot, value in kept:
                    slot.set(value)
            computed[:] = got
            if constant and constant[0] not in _WARNED:
                import warnings

                _WARNED.add(constant[0])  # (once per line that sets it)
                path, line = constant[0] or ("<mica>", 0)
                warnings.warn_explicit("the compiled step sets a learning rate to a Python number: the step's Python "
                                       "runs when it is compiled, not at every call, so calls that compile nothing "
                                       "new keep that value; set param_groups[i]['lr'] before each call (as "
                                       "nanoGPT's loop does), or compute it in the step from an np.float32 "
                                       "argument", UserWarning, path, line)
            return (result, {self.name[id(p)]: s.bound[id(p)] for p in self.params},
                    {self.name[id(p)]: s.grads[id(p)] for p in self.params if id(p) in s.grads},
                    [s.states[id(o)] for o in self.optimizers], [lr for _, lr in computed],
                    [s.scaler_states[id(sc)] for sc in self.scalers], attr_values, buffer_values,
                    (slot_values, slot_grads))

        body.__name__ = getattr(self.fn, "__name__", "step")
        options = dict(self.options)
        target, name = options.pop("target", "cpu"), options.pop("name", None)
        traced = trace(body, self.args, param_specs, grad_specs, state_specs, lr_specs, live_specs, scaler_specs,
                       buffer_specs, slot_specs, name=name)
        names = _argument_names(self.fn, len(self.args))  # (the step's own argument names, not body's user_args)
        traced.graph.input_names = [re.sub(r"^user_args\[(\d+)\]", lambda m: names[int(m.group(1))], n)
                                    for n in traced.graph.input_names]
        for m, attr, _ in attrs:  # (its value after a call is the step's output, not what it reads: not in its key)
            m.__dict__.setdefault("_mica_assigned", set()).add(attr)
        return traced.lower(target, **options).build(), [group for group, _ in computed], list(attrs)

    def _mine(self, opt, table):
        """The entries of {key: ...} for the optimizer's parameters."""
        return {self.name[id(p)]: table[self.name[id(p)]] for _, ps in self.groups[id(opt)] for p in ps}

    def _keyed(self, opt, call):
        """call() with the optimizer's groups naming its parameters by this step's keys."""
        saved = opt.param_groups
        opt.param_groups = [{**settings, "params": [self.name[id(p)] for p in ps]}
                            for settings, ps in self.groups[id(opt)]]
        try:
            return call()
        finally:
            opt.param_groups = saved

    def _per_parameter(self, opt, state):
        """The state with its step count per parameter (torch's state[p]["step"])."""
        if isinstance(state, dict) and "step" in state and not isinstance(state["step"], dict):
            state = {**state, "step": {self.name[id(p)]: state["step"] for _, ps in self.groups[id(opt)] for p in ps}}
        return state

    def _state(self, opt, values):
        """The optimizer's state for this call under this step's keys: the one it holds (entries
        found by their Parameters), fresh entries for parameters it holds none of (a group added:
        torch's empty state)."""
        mine = {self.name[id(p)]: p for _, ps in self.groups[id(opt)] for p in ps}
        fresh = lambda: self._per_parameter(opt, self._keyed(opt, lambda: opt.init(self._mine(opt, values))))  # noqa
        held = getattr(opt, "_held_state", None)
        if held is None:
            return fresh()
        held = self._per_parameter(opt, held) if getattr(opt, "_held_keys", None) is None else held
        old = {id(p): n for n, p in (getattr(opt, "_held_keys", None) or mine).items()}
        out, made = {}, None
        for part, names in self.parts[id(opt)].items():  # (the parts the program takes: one a loaded state
            value = held.get(part)                           # lacks is fresh)
            if value is not None and not isinstance(value, dict):
                out[part] = value
                continue
            out[part] = {}
            for n, p in mine.items():
                if names is not None and n not in names:
                    continue
                if isinstance(value, dict) and old.get(id(p)) in value:
                    out[part][n] = value[old[id(p)]]
                else:
                    made = made or fresh()
                    out[part][n] = made[part][n]
        return out

    def prepare(self):
        """(the program for this call's pattern, [groups whose lr it computes]), built if new."""
        pattern = self._pattern()
        if pattern not in self.programs:
            self._say_settings(pattern)
            for o in self.optimizers:  # (the settings the program is built with: each group's own)
                self.groups[id(o)] = [({k: v for k, v in g.items() if k != "params"}, ps)
                                      for g, (_, ps) in zip(o.param_groups, self.groups[id(o)])]
            self.programs[pattern] = self._build(pattern[1])
        return self.programs[pattern]

    def _say_settings(self, pattern):
        """Warn once when new values of optimizer settings that are constants of the program (not
        the lr and the live ones, which are inputs) compile the step a third time, naming them."""
        same = [p for p in self.programs if p[:3] == pattern[:3]]
        mine = self._settings_now()
        self._settings_seen = getattr(self, "_settings_seen", {})
        self._settings_seen[pattern] = mine
        if len(same) < 2 or getattr(self, "_said_settings", False):
            return
        import warnings

        self._said_settings = True
        last = self._settings_seen.get(same[-1], [])
        moved = sorted({k for a, b in zip(last, mine) for ga, gb in zip(a, b) for k in set(ga) | set(gb)
                        if ga.get(k) != gb.get(k)})
        path, line = user_location() or ("<mica>", 0)
        warnings.warn_explicit(
            f"{getattr(self.fn, '__name__', 'the step')} is compiled a third time, for new values of optimizer "
            f"settings ({', '.join(moved) or 'a param group setting'}): each value is a constant of its own program; "
            "keep them fixed between calls (the learning rate, momentum and Adam's beta1 are inputs, and may change "
            "at every call)", UserWarning, path, line)

    def _settings_now(self):
        return [[{k: _live_class(o, k, v) if k in o.live else v for k, v in g.items() if k not in ("params", "lr")}
                 for g in o.param_groups] for o in self.optimizers]

    def __call__(self, args, run_options, prepared=None):
        from .host import host
        from .nn.modules import _held, _with_leaves

        program, computed, attrs = prepared or self.prepare()
        values = {self.name[id(p)]: _held(p, self.name[id(p)]) for p in self.params}
        grads = {self.name[id(p)]: p._held_grad for p in self.params
                 if getattr(p, "_held_grad", None) is not None and id(p) not in self.fresh}
        states = [self._state(o, values) for o in self.optimizers]
        lrs = [[_lr(o, i, g) for i, g in enumerate(o.param_groups)] for o in self.optimizers]
        lives = [[_live_values(o, g) for g in o.param_groups] for o in self.optimizers]
        scalers = [sc._held() for sc in self.scalers]
        buffers = {key: _buffer_value(m, name) for key, (m, name) in zip(self.buffer_names, self.buffers)}
        slots = {slot.name: slot.value_now() for slot in self.slots if slot.spec is not None}
        result, new_params, new_grads, new_states, new_lrs, new_scalers, new_attrs, new_buffers, (new_slots, kept) = \
            program(tuple(args), values, grads, states, lrs, lives, scalers, buffers, slots, **run_options)
        for slot in self.slots:  # (what it rebinds outside its modules: the new values there, as torch's eager step,
            if slot.name not in new_slots:  # (one it only read: as it was)
                continue
            value = host(np.asarray(new_slots[slot.name]))  # with the gradient retain_grad() kept: layer.out.grad)
            if slot.name in kept:
                value.__dict__["_mica_grad"] = host(np.asarray(kept[slot.name]))
            slot.set(value)
        for key, (m, name) in zip(self.buffer_names, self.buffers):  # (its state: written into the module's buffer)
            _keep_buffer(m, name, np.asarray(new_buffers[key]))
        for (m, name, made), value in zip(attrs, new_attrs):  # (what the step assigned on its modules: torch's last
            object.__setattr__(m, name, _with_leaves(made, {k: host(v) for k, v in value.items()}))  # values)
        for p in self.params:
            new, held = new_params[self.name[id(p)]], getattr(p, "_held", None)
            if held is None and getattr(p, "_initial", (None,))[0] is p.init:
                held = p._initial[1]  # (the initial values a state_dict() may have given out)
            if isinstance(held, np.ndarray) and held.shape == new.shape and held.dtype == new.dtype and \
                    held.flags.writeable:
                np.copyto(held, new)  # (in place: a state_dict() taken earlier sees it, as torch's tensors)
                p._held = held
            else:
                p._held = new
            p._held_grad = new_grads.get(self.name[id(p)])
        for o, st in zip(self.optimizers, new_states):
            o._held_state = st
            o._held_keys = {self.name[id(p)]: p for _, ps in self.groups[id(o)] for p in ps}
        for sc, st in zip(self.scalers, new_scalers):
            sc._held_state = st
        for group, lr in zip(computed, new_lrs):  # (an lr the step computed: the group holds it after the call)
            dict.__setitem__(group, "lr", float(lr))
        return host(result)


def _buffer_names(buffers, owners):
    """A name per state buffer, as the outermost module the step looked into names it in its
    state_dict() ("layers.0.bn.running_mean"), else by its module's class ("BatchNorm2d.running_mean")."""
    paths = {}
    for owner in sorted(owners, key=lambda o: -len(list(o.named_modules()))):  # (the outermost first: full paths)
        for path, sub in owner.named_modules():
            paths.setdefault(id(sub), path)
    out, taken = [], set()
    for m, name in buffers:
        key = ".".join(p for p in (paths.get(id(m), type(m).__name__), name) if p)
        while key in taken:
            key += "_"
        taken.add(key)
        out.append(key)
    return out


def _buffer_spec(m, name):
    """The Spec a buffer is read as in a trace (modules.py's __getattr__): a float one in the default
    float or the type .to() gave the module, others in their own type."""
    from .dtypes import Spec, as_dtype, DEFAULT_FLOAT

    buf = np.asarray(m._buffers[name])
    if buf.dtype.kind == "f":
        return Spec(buf.shape, m.__dict__.get("_buffer_float") or DEFAULT_FLOAT)
    return Spec(buf.shape, as_dtype(buf.dtype))


def _buffer_value(m, name):
    """A state buffer's values as the step takes them (its Spec's type)."""
    from .verbs.core import in_dtype

    spec, buf = _buffer_spec(m, name), np.asarray(m._buffers[name])
    return in_dtype(buf, spec.dtype) if spec.dtype.kind == "float" else buf.astype(spec.dtype.np_storage, copy=False)


def _keep_buffer(m, name, new):
    """The step's new values of a buffer, in the buffer's own type: written into its memory where it
    has the same shape (a state_dict() taken earlier sees them, as torch's buffers), else in its place."""
    from .nn.modules import _buffer_array

    from .nn.modules import _into

    old = m._buffers.get(name)
    m._buffers[name] = _into(old, new if old is None else new.astype(np.asarray(old).dtype, copy=False))


def _lr(opt, i, group):
    """A group's learning rate for this call (a number, numpy scalar or one-element tensor), or a
    sentence."""
    from .optim.base import _number, _number_of

    value = _number_of(group.get("lr", opt.hyper["lr"]))
    if not _number(value) or not 0 <= value < float("inf"):
        raise MicaError(f"{type(opt).__name__}: param_groups[{i}]['lr'] must be a finite number >= 0, got {value!r}",
                        user_location())
    return np.float32(value)


def find(fn, args, name=None):
    """Trace fn once to find the parameters it reads unbound and the optimizers it steps, and the
    places outside its modules it rebinds (slots.py) (its Program kept: where the function keeps
    nothing, it is the one to lower)."""
    from . import guards, pytree, slots
    from .trace import trace

    s = StepTrace("find")
    objects = [x for x in pytree.flatten(tuple(args))[0] if not isinstance(x, np.ndarray) and not hasattr(x, "dtype")]
    snapshot = slots.Snapshot(fn, objects)
    shared = snapshot.shared()  # (places another compiled step keeps: read as inputs, never stale constants)
    _ACTIVE.append(s)
    try:
        with guards.running() as s.ran:  # (the code it runs: its guards read what that code reads)
            s.program = trace(slots.reading(fn, shared) if shared else fn, *args, name=name)
    except BaseException:
        _give_back(s)  # (a failed trace leaves no Tensor in the lists its modules hold)
        raise
    finally:
        _ACTIVE.pop()
        _restore_lrs(s)
        s.restore()
        rebound = snapshot.rebound()  # (each put back as it was: no traced tensor outlives the trace)
    if shared:  # (a shared place the code it ran never names is none of its state)
        rebound = slots.named_in(rebound, shared, s.ran)
    s.slots = slots.found(rebound, snapshot.boxed)
    slots.say_counted(snapshot.counted)
    _check_containers(s)
    if any(s.scaler_stepped.values()):  # (torch refuses the next step until update(): say it now)
        raise MicaError("the compiled step calls GradScaler.step(optimizer) and not scaler.update() after it, so the "
                        "scale would never move (torch refuses the next step); call scaler.update() in the step",
                        user_location())
    return s
