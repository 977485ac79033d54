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


def __getattr__(name):  # (another torch.autograd function: Mica's sentence)
    if name.startswith("_"):
        raise AttributeError(name)
    from .errors import MissingVerbError
    from .tensor import user_location

    raise MissingVerbError(f"Mica has no mica.autograd.{name} (torch.autograd.{name}); gradients are mica.grad(loss, "
                           "wrt) and mica.value_and_grad inside a traced step, or loss.backward() in a torch-style "
                           "one", user_location())
