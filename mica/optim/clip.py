"""Global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_ computes it."""
from .. import pytree, verbs as F
from ..tensor import Tensor


def clip_grad_norm(grads, max_norm, norm_type=2.0, gather=None):
    """Scale every gradient in the pytree `grads` in place (the handles are rebound) so the global
    norm is at most max_norm; returns the norm measured before clipping. Under ZeRO-1
    (mica/optim/zero.py) `grads` is {name: gradient} of this rank's tensors and gather({name: norm})
    gives every tensor's norm, in the parameters' order, so the global norm is one process's."""
    leaves = [g for g in pytree.flatten(grads, is_leaf=lambda x: isinstance(x, Tensor))[0]]
    if norm_type not in (2, 2.0):
        raise ValueError("clip_grad_norm: only the 2-norm is supported")
    if gather is not None:
        norms = F.stack(list(gather({n: F.norm(g) for n, g in grads.items()}).values()))
    else:
        norms = F.stack([F.norm(g) for g in leaves])
    total = F.norm(norms)
    coef = F.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in leaves:
        g.mul_(coef)
    return total
