"""SGD with momentum, dampening, Nesterov and weight decay, as torch.optim.SGD computes it."""
import numpy as np

from .. import verbs as F
from ..errors import MicaError
from .base import Optimizer, zeros_like_tree


class SGD(Optimizer):
    defaults = dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False)
    live = ("momentum",)

    def __init__(self, param_groups=None, *args, **hyper):
        super().__init__(param_groups, *args, **hyper)
        if self.hyper["nesterov"] and (self.hyper["momentum"] <= 0 or self.hyper["dampening"] != 0):
            from ..tensor import user_location

            raise MicaError("SGD: Nesterov momentum needs momentum > 0 and zero dampening", user_location())

    def _check(self, hyper, where):
        self._require(hyper, where, ("lr", "momentum", "weight_decay"), "rate")

    def _init(self, params):
        return {"step": np.zeros((), np.int64), "momentum_buffer": zeros_like_tree(params)}

    def _update(self, params, grads, state, groups):
        steps = state["step"]
        each = isinstance(steps, dict)  # (a count per parameter, as torch's: mica/stateful.py's state)
        bufs = dict(state["momentum_buffer"])
        for hyper, names, lr in groups:
            mom, damp, wd = hyper["momentum"], hyper["dampening"], hyper["weight_decay"]
            for n in names:
                first = (steps[n] if each else steps) == 0
                p, d_p = params[n], grads[n]
                if wd != 0:
                    d_p = F.add(d_p, p, alpha=wd)
                if mom != 0:
                    # The first step seeds the buffer with the gradient itself, as PyTorch does.
                    buf = F.where(first, d_p, F.add(bufs[n] * mom, d_p, alpha=1 - damp))
                    bufs[n] = buf
                    d_p = F.add(d_p, buf, alpha=mom) if hyper["nesterov"] else buf
                params[n] = F.add(p, d_p, alpha=-lr)
        return {"step": {n: s + 1 for n, s in steps.items()} if each else steps + 1, "momentum_buffer": bufs}


    def _torch_entry(self, entry, group):
        """torch's SGD keeps no count, and a momentum buffer only with momentum."""
        entry = super()._torch_entry(entry, group)
        entry.pop("step", None)
        if not group.get("momentum", self.hyper["momentum"]):
            entry.pop("momentum_buffer", None)
        return entry


def sgd(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, param_groups=None):
    return SGD(param_groups, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
               nesterov=nesterov)
