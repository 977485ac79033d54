"""torch.autograd.grad's form of mica.grad (WGAN-GP's gradient penalty, a Hessian-vector product):
inside a traced step, the gradients of outputs with respect to inputs, as a tuple."""
from .errors import MicaError


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=None,
         is_grads_batched=False, materialize_grads=False):
    """torch.autograd.grad: Mica's gradients are always differentiable again (create_graph is what
    a trace does), and an input the outputs do not reach gets zeros (torch's None unless
    allow_unused, then None: here zeros, which mica.grad gives)."""
    from . import verbs as F
    from .grad import grad as mica_grad
    from .tensor import Tensor, user_location

    if is_grads_batched:
        raise MicaError("autograd.grad: is_grads_batched is torch's option Mica does not have; loop over the "
                        "batch of grad_outputs", user_location())
    single = not isinstance(inputs, (list, tuple))
    wrt = [p._live("autograd.grad") if type(p).__name__ == "Parameter" else p for p in ([inputs] if single else inputs)]
    outs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    cots = list(grad_outputs) if isinstance(grad_outputs, (list, tuple)) else [grad_outputs] * len(outs)
    if len(cots) != len(outs) or not all(isinstance(o, Tensor) for o in outs):
        raise MicaError("autograd.grad takes traced output Tensors and, if given, one grad_output per output",
                        user_location())
    if len(outs) == 1:
        return tuple(mica_grad(outs[0], wrt, grad_output=cots[0]))
    total = None
    for o, c in zip(outs, cots):
        part = F.sum(o) if c is None else F.sum(o * c)
        total = part if total is None else total + part
    return tuple(mica_grad(total, wrt))


class FunctionCtx:
    """torch's ctx: save_for_backward / saved_tensors, needs_input_grad, mark_non_differentiable,
    set_materialize_grads, and any attribute the forward sets (ctx.scale = 2.0)."""

    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad
        self.saved_tensors = ()
        self.materialize_grads = True
        self.non_differentiable = ()

    def save_for_backward(self, *tensors):
        self.saved_tensors = tuple(tensors)

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable = tuple(tensors)

    def mark_dirty(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        self.materialize_grads = bool(value)


_FUNCTIONS = {}  # key -> (the Function class, its ctx, the positions of its tensor arguments, argument count)


class Function:
    """torch.autograd.Function: `MyFn.apply(*args)` runs the static forward(ctx, *args) (or forward(*args)
    with setup_context(ctx, inputs, output), torch 2's form); in a trace its result's gradient is the
    static backward(ctx, *grad_outputs), one gradient (or None) per argument, as torch's (a gradient
    reversal layer, a straight-through estimator). Outside a trace it computes the forward (Mica has
    no eager autograd). One output per Function."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("a Function subclass defines forward")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("a Function subclass defines backward")

    @classmethod
    def apply(cls, *args):
        from . import verbs as F
        from .tensor import Tensor, emit, in_trace, user_location

        tensors = [i for i, a in enumerate(args) if isinstance(a, Tensor) and a.dtype.kind == "float"]
        ctx = FunctionCtx(tuple(i in tensors for i in range(len(args))))
        takes_ctx = "setup_context" not in vars(cls) and not any(
            "setup_context" in vars(c) for c in cls.__mro__[1:] if c is not Function)
        if takes_ctx:
            out = cls.forward(ctx, *args)
        else:
            out = cls.forward(*args)
            cls.setup_context(ctx, args, out)
        if not in_trace() or not tensors:
            return out
        if not isinstance(out, Tensor):
            raise MicaError(f"{cls.__name__}.apply: Mica's autograd.Function gives one traced Tensor from forward, got "
                            f"{type(out).__name__}; split a Function of several outputs into one per output",
                            user_location())
        if out.dtype.kind != "float" or any(o is out for o in ctx.non_differentiable):
            return F.detach(out)
        key = len(_FUNCTIONS)
        _FUNCTIONS[key] = (cls, ctx, tensors, len(args))
        return emit("custom_grad", [args[i] for i in tensors] + [F.detach(out)], key=key, count=len(tensors))


def custom_vjp(key, cotangent, output, inputs, need):
    """(grad.py, through the custom_grad primitive) The Function's backward for this cotangent: the
    gradients of its tensor arguments, checked against their shapes."""
    import numpy as np

    from . import verbs as F
    from .errors import GradError

    cls, ctx, positions, count = _FUNCTIONS[key]
    if cotangent is None:
        cotangent = F.zeros_like(output) if ctx.materialize_grads else None
    grads = cls.backward(ctx, cotangent)
    grads = tuple(grads) if isinstance(grads, (tuple, list)) else (grads,)
    if len(grads) > count:
        raise GradError(f"{cls.__name__}.backward returned {len(grads)} gradients for {count} arguments; return one "
                        "per argument of forward (None for those without one), as torch's")
    out = []
    for j, pos in enumerate(positions):
        g = grads[pos] if pos < len(grads) else None
        if g is None:
            out.append(None)
            continue
        g = F.as_tensor(g, inputs[j].dtype)
        if tuple(g.shape) != tuple(inputs[j].shape):  # (torch's: a gradient the argument broadcasts to is summed
            try:                                        # down to it; any other shape is refused)
                fits = np.broadcast_shapes(tuple(inputs[j].shape), tuple(g.shape)) == tuple(g.shape)
            except ValueError:
                fits = False
            if not fits:
                raise GradError(f"{cls.__name__}.backward returned a gradient of shape {list(g.shape)} for an "
                                f"argument of shape {list(inputs[j].shape)}; return one of the argument's shape")
            g = F.sum_to(g, tuple(inputs[j].shape))
        out.append(g)
    return out + [None]


def __getattr__(name):  # (another torch.autograd function: Mica's sentence)
    if name.startswith("_"):
        raise AttributeError(name)
    from .errors import MissingVerbError
    from .tensor import user_location

    raise MissingVerbError(f"Mica has no mica.autograd.{name} (torch.autograd.{name}); gradients are mica.grad(loss, "
                           "wrt) and mica.value_and_grad inside a traced step, or loss.backward() in a torch-style "
                           "one", user_location())
