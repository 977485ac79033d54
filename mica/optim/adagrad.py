"""Adagrad as torch.optim.Adagrad's single-tensor path computes it (dense gradients): a running sum
of squared gradients, a learning rate decayed by the step count, L2 weight decay added to the gradient."""
import numpy as np

from .. import verbs as F
from .base import Optimizer, step_counts


class Adagrad(Optimizer):
    defaults = dict(lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10)

    def _check(self, hyper, where):
        self._require(hyper, where, ("lr", "lr_decay", "weight_decay"), "rate")
        self._require(hyper, where, ("initial_accumulator_value", "eps"), "nonnegative")

    eager_state = True  # (torch's Adagrad makes its state when it is made: its state_dict has every parameter's)

    def _init(self, params):
        # (the optimizer's initial_accumulator_value for every group, as torch's: a group's own is kept
        # in its settings but starts nothing, there and in add_param_group)
        start = self.hyper["initial_accumulator_value"]
        return {"step": np.zeros((), np.int64),
                "sum": {n: np.full(np.shape(p), start, np.asarray(p).dtype) for n, p in params.items()}}

    def _update(self, params, grads, state, groups):
        step, count = step_counts(state)
        sums = dict(state["sum"])
        for hyper, names, lr in groups:
            wd, eps, decay = hyper["weight_decay"], hyper["eps"], hyper["lr_decay"]
            for n in names:
                p, g = params[n], grads[n]
                if wd != 0:
                    g = F.add(g, p, alpha=wd)
                clr = lr / (1 + (count(n) - 1) * decay)
                sums[n] = F.addcmul(sums[n], g, g, value=1)
                params[n] = F.addcdiv(p, g, F.sqrt(sums[n]) + eps, value=-clr)
        return {"step": step, "sum": sums}
