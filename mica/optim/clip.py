"""Global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_ computes it."""
from .. import pytree, verbs as F
from ..errors import MicaError
from ..host import is_torch_tensor
from ..tensor import Tensor, user_location


def clip_grad_norm(grads, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None, gather=None):
    """Scale every gradient in the pytree `grads` in place (the handles are rebound) so the global
    norm is at most max_norm; returns the norm measured before clipping. Under ZeRO-1
    (mica/optim/zero.py) `grads` is {name: gradient} of this rank's tensors and gather({name: norm})
    gives every tensor's norm, in the parameters' order, so the global norm is one process's."""
    leaves = [g for g in pytree.flatten(grads, is_leaf=lambda x: isinstance(x, Tensor))[0]]
    p = norm_type
    if isinstance(p, str) and p != "inf":
        raise MicaError(f"clip_grad_norm: norm_type must be a number or inf, got {p!r}", user_location())
    if p == "inf":
        p = float("inf")
    if error_if_nonfinite:
        raise MicaError("clip_grad_norm: error_if_nonfinite=True would stop a step by its values, which a compiled "
                        "step does not do; leave it False (torch's default) and read the returned norm", user_location())
    if gather is not None:
        norms = F.stack(list(gather({n: F.norm(g, p) for n, g in grads.items()}).values()))
    else:
        norms = F.stack([F.norm(g, p) for g in leaves])
    total = F.norm(norms, p)  # (torch's: the norm of the tensors' norms; inf: the largest)
    if isinstance(max_norm, Tensor):  # (torch takes a 0-d tensor)
        max_norm = F.reshape(max_norm, ())
    elif is_torch_tensor(max_norm):
        max_norm = float(max_norm)
    coef = F.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in leaves:
        g.mul_(coef)
    return total
