"""RMSprop as torch.optim.RMSprop's single-tensor path computes it (the one torch takes on a CPU):
an average of squared gradients, optionally centered by an average of the gradients, optional
momentum and L2 weight decay added to the gradient."""
import numpy as np

from .. import verbs as F
from .base import Optimizer, step_counts, zeros_like_tree


class RMSprop(Optimizer):
    defaults = dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False)
    live = ("momentum",)

    def _check(self, hyper, where):
        self._require(hyper, where, ("lr", "weight_decay", "momentum", "alpha"), "rate")
        self._require(hyper, where, ("eps",), "nonnegative")

    def _uses(self, setting):
        """Whether any group sets `setting` (torch keeps the state it needs only where it is set)."""
        return any(hyper[setting] for hyper in [self.hyper] + [self._hyper_of(g) for g in self.param_groups or ()])

    def _torch_entry(self, entry, group):
        """torch's RMSprop keeps a momentum buffer only with momentum, an average gradient only centered."""
        entry = super()._torch_entry(entry, group)
        if not group.get("momentum", self.hyper["momentum"]):
            entry.pop("momentum_buffer", None)
        if not group.get("centered", self.hyper["centered"]):
            entry.pop("grad_avg", None)
        return entry

    def _init(self, params):
        state = {"step": np.zeros((), np.int64), "square_avg": zeros_like_tree(params)}
        if self._uses("momentum"):
            state["momentum_buffer"] = zeros_like_tree(params)
        if self._uses("centered"):
            state["grad_avg"] = zeros_like_tree(params)
        return state

    def _update(self, params, grads, state, groups):
        new = {part: dict(value) for part, value in state.items() if part != "step"}
        for hyper, names, lr in groups:
            alpha, eps, wd, mom = hyper["alpha"], hyper["eps"], hyper["weight_decay"], hyper["momentum"]
            for n in names:
                p, g = params[n], grads[n]
                if wd != 0:
                    g = F.add(g, p, alpha=wd)
                square_avg = F.addcmul(new["square_avg"][n] * alpha, g, g, value=1 - alpha)
                new["square_avg"][n] = square_avg
                if hyper["centered"]:
                    grad_avg = F.lerp(new["grad_avg"][n], g, 1 - alpha)
                    new["grad_avg"][n] = grad_avg
                    avg = F.sqrt(F.addcmul(square_avg, grad_avg, grad_avg, value=-1))
                else:
                    avg = F.sqrt(square_avg)
                avg = avg + eps
                if mom > 0:
                    buf = F.addcdiv(new["momentum_buffer"][n] * mom, g, avg)
                    new["momentum_buffer"][n] = buf
                    params[n] = F.add(p, buf, alpha=-lr)
                else:
                    params[n] = F.addcdiv(p, g, avg, value=-lr)
        return {"step": step_counts(state)[0], **new}
