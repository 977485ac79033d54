"""Reverse-mode differentiation of the graph being traced: Graph -> Graph.

`grad(loss, wrt)` walks the nodes that lie between `wrt` and `loss` in reverse, applies each
primitive's VJP rule (written with verbs, so the backward nodes are ordinary, shape-checked,
hash-consed nodes carrying the forward node's source line), and sums the cotangents of values
with several uses — a tied embedding gets both of its roads.
"""
from . import pytree
from .errors import GradError, TraceError
from .ops import OPS
from .tensor import Tensor, current, user_location


def _is_tensor(x):
    return isinstance(x, Tensor)


_NO_WRT = object()


def grad(loss, wrt=_NO_WRT, grad_output=None):
    """Gradients of `loss` with respect to every Tensor in the pytree `wrt`, in the same structure."""
    if callable(loss) and not isinstance(loss, Tensor):
        raise TraceError("mica.grad(loss, wrt) differentiates a traced loss Tensor with respect to `wrt`; for a "
                         "function, mica.value_and_grad(fn)(*args) gives its value and gradients", user_location())
    if wrt is _NO_WRT:
        raise TraceError("mica.grad(loss, wrt) needs `wrt`: the Tensors (or a pytree of them) to differentiate by",
                         user_location())
    ctx = current("mica.grad")
    if not isinstance(loss, Tensor):
        hint = ("; a function returning (loss, extra) goes to mica.value_and_grad(fn, has_aux=True)"
                if isinstance(loss, (tuple, list)) else "")
        raise TraceError(f"mica.grad: the loss must be a traced Tensor, got {type(loss).__name__}{hint}",
                         user_location())
    if loss.dtype.kind != "float":
        raise GradError(f"mica.grad: the loss must be floating, got {loss.value.spec!r}", user_location())
    leaves, treedef = pytree.flatten(wrt, is_leaf=_is_tensor)
    # (a Parameter, torch's leaf made with requires_grad=True: the Tensor it is bound to, as autograd.grad's)
    leaves = [x._live("mica.grad") if type(x).__name__ == "Parameter" else x for x in leaves]
    for x in leaves:
        if not isinstance(x, Tensor):
            raise TraceError(f"mica.grad: wrt must hold traced Tensors, found {type(x).__name__}",
                             user_location())
        if x.dtype.kind != "float":
            raise GradError(f"mica.grad: wrt holds {x.value.spec!r}, which has no gradient (only floating Tensors "
                            "do); leave it out of wrt", user_location())
    from . import verbs as F

    if grad_output is None:
        if loss.numel() != 1:
            raise GradError(f"mica.grad: the loss {loss.value.spec!r} is not a scalar; pass grad_output",
                            user_location())
        seed = F.ones_like(loss)
    else:
        seed = F.as_tensor(grad_output, loss.dtype)
        if seed.shape != loss.shape:
            raise GradError(f"mica.grad: grad_output {seed.value.spec!r} must match the loss "
                            f"{loss.value.spec!r}", user_location())

    graph = ctx.graph
    loss_v = loss.value
    end = graph.nodes.index(loss_v.node) + 1
    nodes = graph.nodes[:end]
    targets = {x.value.id for x in leaves}

    # Values that depend on some target, then those of them the loss depends on.
    depends = set(targets)
    for n in nodes:
        if any(v.id in depends for v in n.inputs):
            depends.update(o.id for o in n.outputs if o.dtype.kind == "float")
    relevant = {loss_v.id} & depends
    for n in reversed(nodes):
        if any(o.id in relevant for o in n.outputs):
            relevant.update(v.id for v in n.inputs if v.id in depends)

    cts = {loss_v.id: seed}
    saved_loc = ctx.loc_override
    first_id = graph._next_id
    try:
        for n in reversed(nodes):
            outs_ct = [cts.get(o.id) for o in n.outputs]
            if all(c is None for c in outs_ct):
                continue
            need = [v.id in relevant for v in n.inputs]
            if not any(need):
                continue
            opdef = OPS[n.op]
            if opdef.vjp is None:
                raise GradError(f"mica.grad: {n.op} has no derivative here (a second derivative of a "
                                "row-wise kernel, or a non-differentiable op on the path)", n.loc)
            ctx.loc_override = n.loc
            ins = [Tensor(v, ctx) for v in n.inputs]
            outs = [Tensor(v, ctx) for v in n.outputs]
            grads = opdef.vjp(outs_ct, outs, ins, n.attrs, need)
            for v, g, nd in zip(n.inputs, grads, need):
                if not nd or g is None:
                    continue
                assert g.shape == v.shape, (n.op, g.shape, v.shape)
                if g.dtype is not v.dtype:
                    g = F.to(g, v.dtype)
                prev = cts.get(v.id)
                cts[v.id] = g if prev is None else prev + g
    finally:
        ctx.loc_override = saved_loc
    # what this call's backward defined (the rematerialization pass, passes/remat.py, reads it)
    graph.backward.append(frozenset(range(first_id, graph._next_id)))

    out = []
    for x in leaves:
        g = cts.get(x.value.id)
        # (a tensor of its own, as torch's .grad, never a view of the backward's: an in-place step on it,
        # as clipping's, writes it alone)
        g = Tensor((g if g is not None else no_gradient(x)).value, ctx)
        out.append(g)
        mark_role(graph, g, "gradient")
        if x.value.node.op == "input":
            mark_role(graph, x, "parameter")
    return pytree.unflatten(treedef, out)


def no_gradient(like):
    """Zeros for a tensor that has no gradient (one the loss does not reach, a frozen parameter:
    torch's None), marked in the graph so the optimizers skip it (optim/base.py, has_gradient),
    where a gradient of zeros the loss reaches is one they decay and count."""
    from . import verbs as F

    g = F.zeros_like(like)
    like._ctx.graph.unreached.add(g.value.id)
    return g


def mark_role(graph, tensor, role):
    """Record what a value is (for the memory plan's classes); the first role given stands."""
    graph.roles.setdefault(tensor.value.id, role)


def value_and_grad(fn, argnums=0, has_aux=False):
    """fn -> a function returning (fn(*args), gradients of it with respect to args[argnums])."""
    from .errors import MicaError
    from .tensor import user_location

    many = isinstance(argnums, (tuple, list))
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in (argnums if many else [argnums])):
        raise MicaError(f"value_and_grad: argnums is an argument's index or a tuple of them, got {argnums!r}",
                        user_location())

    def wrapped(*args, **kwargs):
        for i in argnums if many else [argnums]:
            if not -len(args) <= i < len(args):
                raise MicaError(f"value_and_grad: argnums names argument {i}, and the function was given "
                                f"{len(args)} positional argument{'s' if len(args) != 1 else ''}", user_location())
        result = fn(*args, **kwargs)
        if has_aux and not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise MicaError("value_and_grad(has_aux=True): the function must return a pair (loss, aux); it returned "
                            + (f"a {len(result)}-tuple" if isinstance(result, (tuple, list)) else
                               f"a {type(result).__name__}"), user_location())
        loss = result[0] if has_aux else result
        wrt = tuple(args[i] for i in argnums) if many else args[argnums]
        return result, grad(loss, wrt)
    return wrapped


def _context():
    """The trace being built, or None."""
    from .tensor import _STACK

    return _STACK[-1] if _STACK else None


class set_grad_enabled:
    """torch.set_grad_enabled, and below it no_grad, enable_grad and inference_mode: a context
    manager or a decorator. Inside a trace, what is computed while gradients are off is detached
    (mica.grad sends nothing through it), as torch's; outside a trace it changes nothing."""

    def __init__(self, mode=True):
        self.mode = bool(mode)
        self._saved = []
        self._applied = None  # (torch's set_grad_enabled(False) called alone sets the mode at once;
        if type(self) is set_grad_enabled:  # a `with` around it restores the one before, a decorator undoes it)
            ctx = _context()
            if ctx is not None:
                self._applied = (ctx, ctx.grad_enabled)
                ctx.grad_enabled = self.mode

    def __enter__(self):
        if self._applied is not None:  # (the call set it already: the exit restores what was before)
            self._saved.append(self._applied)
            self._applied = None
            return self
        ctx = _context()
        self._saved.append((ctx, ctx.grad_enabled if ctx is not None else None))
        if ctx is not None:
            ctx.grad_enabled = self.mode
        else:
            _OUTSIDE.append(self.mode)
        return self

    def __exit__(self, *exc):
        ctx, was = self._saved.pop()
        if ctx is not None:
            ctx.grad_enabled = was
        elif len(_OUTSIDE) > 1:
            _OUTSIDE.pop()
        return False

    def __call__(self, fn):
        import functools

        if self._applied is not None:  # (as a decorator: the mode is the decorated function's alone)
            ctx, was = self._applied
            ctx.grad_enabled, self._applied = was, None

        @functools.wraps(fn)
        def with_mode(*args, **kwargs):
            with set_grad_enabled(self.mode):
                return fn(*args, **kwargs)
        return with_mode


_OUTSIDE = [True]  # (the mode set outside a trace: eager host tensors keep no history, but code asks)


def is_grad_enabled():
    """torch.is_grad_enabled: in a trace, whether what is computed now records gradients; outside
    one, the mode the innermost no_grad/enable_grad/set_grad_enabled set (True by default)."""
    ctx = _context()
    return _OUTSIDE[-1] if ctx is None else bool(ctx.grad_enabled)


class _Bare:
    """torch's bare decorator form, @no_grad without parentheses: the class called on the function."""

    def __new__(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], bool):
            return cls()(args[0])
        return super().__new__(cls)


class no_grad(_Bare, set_grad_enabled):
    def __init__(self):
        super().__init__(False)


class enable_grad(_Bare, set_grad_enabled):
    def __init__(self):
        super().__init__(True)


class inference_mode(_Bare, set_grad_enabled):
    def __init__(self, mode=True):
        super().__init__(not mode)
