"""Adamax and Adadelta as torch.optim.Adamax's and torch.optim.Adadelta's single-tensor paths (the
ones torch takes on a CPU) compute them, L2 weight decay added to the gradient: Adamax's infinity
norm of past gradients, Adadelta's running averages of squared gradients and squared updates."""
import numpy as np

from .. import verbs as F
from .adamw import check_adam_like
from .base import Optimizer, step_counts, zeros_like_tree


class Adamax(Optimizer):
    defaults = dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    live = ("betas",)  # (beta1: an input of a torch-form step, as AdamW's, for OneCycleLR and CyclicLR)

    def _check(self, hyper, where):
        check_adam_like(self, hyper, where)

    def _init(self, params):
        return {"step": np.zeros((), np.int64), "exp_avg": zeros_like_tree(params), "exp_inf": zeros_like_tree(params)}

    def _update(self, params, grads, state, groups):
        step, count = step_counts(state)
        new = {part: dict(state[part]) for part in ("exp_avg", "exp_inf")}
        for hyper, names, lr in groups:
            (beta1, beta2), eps, wd = hyper["betas"], hyper["eps"], hyper["weight_decay"]
            for n in names:
                p, g = params[n], grads[n]
                if wd != 0:
                    g = F.add(g, p, alpha=wd)
                m = F.lerp(new["exp_avg"][n], g, 1 - beta1)
                u = F.maximum(new["exp_inf"][n] * beta2, F.abs(g) + eps)
                params[n] = F.addcdiv(p, m, u, value=-(lr / (1 - beta1 ** count(n))))
                new["exp_avg"][n], new["exp_inf"][n] = m, u
        return {"step": step, **new}


class Adadelta(Optimizer):
    defaults = dict(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0)

    def _check(self, hyper, where):
        self._require(hyper, where, ("lr", "weight_decay"), "rate")
        self._require(hyper, where, ("eps",), "nonnegative")
        self._require(hyper, where, ("rho",), "unit")

    def _init(self, params):
        return {"step": np.zeros((), np.int64), "square_avg": zeros_like_tree(params),
                "acc_delta": zeros_like_tree(params)}

    def _update(self, params, grads, state, groups):
        step, _ = step_counts(state)
        new = {part: dict(state[part]) for part in ("square_avg", "acc_delta")}
        for hyper, names, lr in groups:
            rho, eps, wd = hyper["rho"], hyper["eps"], hyper["weight_decay"]
            for n in names:
                p, g = params[n], grads[n]
                if wd != 0:
                    g = F.add(g, p, alpha=wd)
                square_avg = F.addcmul(new["square_avg"][n] * rho, g, g, value=1 - rho)
                delta = F.sqrt(new["acc_delta"][n] + eps) / F.sqrt(square_avg + eps) * g
                new["acc_delta"][n] = F.addcmul(new["acc_delta"][n] * rho, delta, delta, value=1 - rho)
                new["square_avg"][n] = square_avg
                params[n] = F.add(p, delta, alpha=-lr)
        return {"step": step, **new}

