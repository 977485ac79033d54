"""NAdam and RAdam as torch.optim.NAdam's and torch.optim.RAdam's single-tensor paths (the ones torch
takes on a CPU) compute them: Adam's two moments with Nesterov's momentum schedule (NAdam) or the
variance rectification (RAdam), L2 weight decay added to the gradient or, with
`decoupled_weight_decay`, AdamW's. Python's double-precision scalars stay float64 here (traced from
the step count), and each is rounded to float32 where torch's kernel takes it (a scalar operand)."""
import numpy as np

from .. import dtypes, verbs as F
from .adamw import check_adam_like
from .base import Optimizer, step_counts, zeros_like_tree


def _decayed(p, g, hyper, lr):
    """(parameter, gradient) after weight decay: AdamW's on the parameter, or L2 on the gradient."""
    wd = hyper["weight_decay"]
    if wd == 0:
        return p, g
    if hyper["decoupled_weight_decay"]:
        return p * (1 - lr * wd), g
    return p, F.add(g, p, alpha=wd)


class NAdam(Optimizer):
    defaults = dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, momentum_decay=4e-3,
                    decoupled_weight_decay=False)
    live = ("betas",)  # (beta1: an input of a torch-form step, as AdamW's, for OneCycleLR and CyclicLR)

    def _check(self, hyper, where):
        check_adam_like(self, hyper, where, ("lr", "weight_decay", "momentum_decay"))

    def _init(self, params):
        return {"step": np.zeros((), np.int64), "mu_product": {n: np.ones((), np.float32) for n in params},
                "exp_avg": zeros_like_tree(params), "exp_avg_sq": zeros_like_tree(params)}

    def _update(self, params, grads, state, groups):
        step, count = step_counts(state)
        new = {part: dict(state[part]) for part in ("mu_product", "exp_avg", "exp_avg_sq")}
        for hyper, names, lr in groups:
            (beta1, beta2), eps, decay = hyper["betas"], hyper["eps"], hyper["momentum_decay"]
            for n in names:
                t = count(n)
                p, g = _decayed(params[n], grads[n], hyper, lr)
                bias_correction2 = 1 - beta2 ** t
                mu = beta1 * (1.0 - 0.5 * (0.96 ** (t * decay)))
                mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((t + 1) * decay)))
                # (torch's mu_product is a float32 tensor: times the Python float mu, rounded to float32)
                mu_product = new["mu_product"][n] * F.to(mu, new["mu_product"][n].dtype)
                m = F.lerp(new["exp_avg"][n], g, 1 - beta1)
                v = F.addcmul(new["exp_avg_sq"][n] * beta2, g, g, value=1 - beta2)
                denom = F.sqrt(v / bias_correction2) + eps
                product = F.to(mu_product, dtypes.float64)  # (torch's mu_product.item())
                p = F.addcdiv(p, g, denom, value=-lr * (1.0 - mu) / (1.0 - product))
                params[n] = F.addcdiv(p, m, denom, value=(-lr * mu_next) / (1.0 - product * mu_next))
                new["mu_product"][n], new["exp_avg"][n], new["exp_avg_sq"][n] = mu_product, m, v
        return {"step": step, **new}


class RAdam(Optimizer):
    defaults = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False)
    live = ("betas",)  # (beta1: an input of a torch-form step, as AdamW's, for OneCycleLR and CyclicLR)

    def _check(self, hyper, where):
        check_adam_like(self, hyper, where)

    def _init(self, params):
        return {"step": np.zeros((), np.int64), "exp_avg": zeros_like_tree(params),
                "exp_avg_sq": zeros_like_tree(params)}

    def _update(self, params, grads, state, groups):
        step, count = step_counts(state)
        new = {part: dict(state[part]) for part in ("exp_avg", "exp_avg_sq")}
        for hyper, names, lr in groups:
            (beta1, beta2), eps = hyper["betas"], hyper["eps"]
            rho_inf = 2 / (1 - beta2) - 1
            for n in names:
                t = count(n)
                p, g = _decayed(params[n], grads[n], hyper, lr)
                m = F.lerp(new["exp_avg"][n], g, 1 - beta1)
                v = F.addcmul(new["exp_avg_sq"][n] * beta2, g, g, value=1 - beta2)
                bias_correction1, bias_correction2 = 1 - beta1 ** t, 1 - beta2 ** t
                corrected = (m / bias_correction1) * lr
                rho_t = rho_inf - 2 * t * (beta2 ** t) / bias_correction2
                rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
                # (torch's float / tensor is tensor.reciprocal() * float)
                adaptive = F.reciprocal(F.sqrt(v) + eps) * (bias_correction2 ** 0.5)
                # (torch's `if rho_t > 5.0` on the step's Python float: both branches, one kept; the
                # other's rect may be NaN early on, which where() does not carry)
                params[n] = p - F.where(rho_t > 5.0, corrected * adaptive * rect, corrected)
                new["exp_avg"][n], new["exp_avg_sq"][n] = m, v
        return {"step": step, **new}
