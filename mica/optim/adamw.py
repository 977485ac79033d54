"""AdamW exactly as torch.optim.AdamW's single-tensor path computes it (decoupled decay, bias
correction from the step count in double precision, eps added after the square-root correction)."""
import numpy as np

from .. import dtypes, verbs as F
from .base import Optimizer, zeros_like_tree


class AdamW(Optimizer):
    defaults = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)

    def _init(self, params):
        return {"step": np.zeros((), np.int64), "exp_avg": zeros_like_tree(params),
                "exp_avg_sq": zeros_like_tree(params)}

    def _update(self, params, grads, state, groups):
        step = state["step"] + 1
        step_f = F.to(step, dtypes.float64)
        exp_avg, exp_avg_sq = dict(state["exp_avg"]), dict(state["exp_avg_sq"])
        for hyper, names, lr in groups:
            beta1, beta2 = hyper["betas"]
            wd, eps = hyper["weight_decay"], hyper["eps"]
            bias_correction1 = 1 - beta1 ** step_f
            bias_correction2 = 1 - beta2 ** step_f
            step_size = lr / bias_correction1
            bias_correction2_sqrt = bias_correction2 ** 0.5
            for n in names:
                p, g, m, v = params[n], grads[n], exp_avg[n], exp_avg_sq[n]
                if wd != 0:
                    p = p * (1 - lr * wd)
                m = F.lerp(m, g, 1 - beta1)
                v = F.addcmul(v * beta2, g, g, value=1 - beta2)
                denom = F.sqrt(v) / bias_correction2_sqrt + eps
                params[n] = F.addcdiv(p, m, denom, value=-step_size)
                exp_avg[n], exp_avg_sq[n] = m, v
        return {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}


def adamw(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, param_groups=None):
    return AdamW(param_groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)


def nanogpt_param_groups(params, weight_decay):
    """nanoGPT's configure_optimizers groups: tensors of 2+ dims decay, the rest (biases, norms) not."""
    names = list(params)
    ndim = {n: (len(params[n].shape)) for n in names}
    return [{"params": [n for n in names if ndim[n] >= 2], "weight_decay": weight_decay},
            {"params": [n for n in names if ndim[n] < 2], "weight_decay": 0.0}]
