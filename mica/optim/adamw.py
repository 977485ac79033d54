"""AdamW exactly as torch.optim.AdamW's single-tensor path computes it (decoupled decay, bias
correction from the step count in double precision, eps added after the square-root correction).

A bfloat16 parameter keeps bfloat16 moments, as torch's. By default (torch's on a CPU) each step of
the arithmetic rounds to bfloat16, as the single-tensor path's in-place ops do; with `fused=True`
(the speedrun seed's) it is updated as torch's fused AdamW updates one: float32 arithmetic
("opmath") with the kernel's fused multiply-adds, the parameter and both moments rounded to bfloat16
once, at the end (the square root and the step read the unrounded float32 moments). In float32 the
two are the same step."""
import numpy as np

from .. import dtypes, verbs as F
from ..errors import MicaError
from ..tensor import user_location
from .base import Optimizer, step_counts, zeros_like_tree


class AdamW(Optimizer):
    defaults = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False)
    live = ("betas",)
    optional_state = ("max_exp_avg_sq",)  # (amsgrad's running maximum of exp_avg_sq, per group as torch's)

    def __init__(self, param_groups=None, *args, **hyper):
        hyper = self._positional(args, hyper)
        self.fused = bool(hyper.get("fused"))  # (torch's fused kernel: another rounding of a half parameter)
        super().__init__(param_groups, **hyper)

    def _fused(self, hyper):
        """Whether a group steps as torch's fused kernel: its own setting, else the optimizer's."""
        return self.fused if hyper.get("fused") is None else bool(hyper["fused"])

    def state_specs(self, param_specs):
        """As Optimizer's, with a bfloat16 parameter's moments in bfloat16 (fused AdamW's state)."""
        from ..dtypes import Spec

        specs = super().state_specs(param_specs)
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            for n, spec in specs.get(key, {}).items():
                if param_specs[n].dtype is dtypes.bfloat16:
                    specs[key][n] = Spec(spec.shape, dtypes.bfloat16)
        return specs

    layout, rank = None, 0

    def _check(self, hyper, where):
        check_adam_like(self, hyper, where)

    def shard(self, layout, rank):
        """ZeRO-1 on rank `rank` of `layout.world` (mica/optim/zero.py): the state holds the moments
        of this rank's tensors only, `grads` only their (reduce-scattered) gradients, and the
        updated tensors are all-gathered, so every rank ends the step with every parameter one
        process computes (AdamW is elementwise: the same arithmetic wherever a tensor is updated)."""
        self.layout, self.rank = layout, rank
        return self

    def _mine(self, names):
        return [n for n in names if self.layout is None or self.layout.owner[n] == self.rank]

    def _init(self, params):
        mine = {n: params[n] for n in self._mine(params)}
        state = {"step": np.zeros((), np.int64), "exp_avg": zeros_like_tree(mine), "exp_avg_sq": zeros_like_tree(mine)}
        maxed = self._amsgrad(mine)
        if maxed:
            state["max_exp_avg_sq"] = zeros_like_tree({n: mine[n] for n in maxed})
        return state

    def _amsgrad(self, names):
        """The names among `names` whose group sets amsgrad=True."""
        if not any(g.get("amsgrad") for g in self.param_groups or [self.hyper]):
            return []
        return [n for hyper, ns in self.groups(list(names)) if hyper.get("amsgrad") for n in ns if n in names]

    def _update(self, params, grads, state, groups):
        before = dict(params)
        step, count = step_counts(state)
        each = isinstance(step, dict)
        exp_avg, exp_avg_sq = dict(state["exp_avg"]), dict(state["exp_avg_sq"])
        maxima = dict(state.get("max_exp_avg_sq", {}))
        for hyper, names, lr in groups:
            beta1, beta2 = hyper["betas"]
            wd, eps = hyper["weight_decay"], hyper["eps"]
            fused = self._fused(hyper)

            def corrections(step_f):
                return lr / (1 - beta1 ** step_f), (1 - beta2 ** step_f) ** 0.5

            if not each:
                step_size, bias_correction2_sqrt = corrections(count(None))
            for n in self._mine(names):
                if each:
                    step_size, bias_correction2_sqrt = corrections(count(n))
                p, g, m, v = params[n], grads[n], exp_avg[n], exp_avg_sq[n]
                amsgrad = bool(hyper.get("amsgrad"))
                if amsgrad and n not in maxima:
                    raise MicaError(f"{type(self).__name__}: amsgrad=True in a group whose state holds no "
                                    "max_exp_avg_sq; set it when the optimizer is made", user_location())
                if p.dtype in dtypes.HALF and fused:
                    params[n], exp_avg[n], exp_avg_sq[n], top = _fused_half(
                        p, g, m, v, lr, beta1, beta2, wd, eps, step_size, bias_correction2_sqrt,
                        maxima[n] if amsgrad else None)
                    if amsgrad:
                        maxima[n] = top
                    continue
                if wd != 0:
                    p = p * (1 - lr * wd)
                m = F.lerp(m, g, 1 - beta1)
                v = F.addcmul(v * beta2, g, g, value=1 - beta2)
                if amsgrad:  # (torch's: the running maximum of exp_avg_sq is what the step divides by)
                    maxima[n] = F.maximum(maxima[n], v)
                denom = F.sqrt(maxima[n] if amsgrad else v) / bias_correction2_sqrt + eps
                params[n] = F.addcdiv(p, m, denom, value=-step_size)
                exp_avg[n], exp_avg_sq[n] = m, v
        if self.layout is not None:
            from .zero import gather_parameters

            mine = {n: params[n] for n in self._mine(self.layout.shapes)}
            params.update(gather_parameters(self.layout, self.rank, {n: before[n] for n in self.layout.shapes}, mine))
        out = {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
        if "max_exp_avg_sq" in state:
            out["max_exp_avg_sq"] = maxima
        return out


class Adam(AdamW):
    """torch.optim.Adam: AdamW's arithmetic with weight decay as an L2 term added to the gradient
    (for a bfloat16 parameter: rounded to bfloat16 by default, in float32 with fused=True, as the
    fused kernel's opmath) instead of decoupled."""

    defaults = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False)

    def _update(self, params, grads, state, groups):
        grads, coupled = dict(grads), []
        for hyper, names, lr in groups:
            wd = hyper["weight_decay"]
            for n in self._mine(names) if wd != 0 else ():
                g, p = grads[n], params[n]
                if p.dtype in dtypes.HALF and self._fused(hyper):
                    g, p = F.to(g, dtypes.float32), F.to(p, dtypes.float32)
                grads[n] = F.add(g, p, alpha=wd)
            coupled.append(({**hyper, "weight_decay": 0.0}, names, lr))
        return super()._update(params, grads, state, coupled)


def check_adam_like(opt, hyper, where, rates=("lr", "weight_decay")):
    """torch's refusals for Adam's family: `rates` finite and >= 0, eps >= 0, two betas in [0, 1)."""
    opt._require(hyper, where, rates, "rate")
    opt._require(hyper, where, ("eps",), "nonnegative")
    betas = hyper["betas"]
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        opt._refuse(where, "betas", betas, "two numbers in [0, 1)")
    opt._require({"betas[0]": betas[0], "betas[1]": betas[1]}, where, ("betas[0]", "betas[1]"), "fraction")


def _fused_half(p, g, m, v, lr, beta1, beta2, wd, eps, step_size, bias_correction2_sqrt, top=None):
    """torch's CPU fused AdamW step (_fused_adamw_) on a bfloat16 or float16 p (g, m, v of its
    type): (p, m, v, amsgrad's maximum or None) rounded once to their types. The scalars are
    computed in float64 and taken as float32, as the kernel's opmath_t(...) casts."""
    f32 = dtypes.float32
    types = (p.dtype, m.dtype, v.dtype)

    def scalar(x):
        return F.to(x, f32) if hasattr(x, "dtype") else np.float32(x)

    p, g, m, v = (F.to(t, f32) for t in (p, g, m, v))
    if wd != 0:
        p = p * scalar(1 - lr * wd)
    w = 1 - beta1  # exp_avg.lerp_(grad, w): from the nearer end, as the kernel's blendv (a live beta1's end:
    near = abs(1 - float(beta1)) < 0.5  # the one its program was built for, stateful.py's pattern)
    m = F.fma32(scalar(w), g - m, m) if near else F.fma32(scalar(w - 1), g - m, g)
    v = F.fma32(g * np.float32(1 - beta2), g, v * np.float32(beta2))
    kept = None
    if top is not None:  # (amsgrad: the maximum in float32, rounded to its type once)
        kept_type, top = top.dtype, F.maximum(F.to(top, f32), v)
        kept = F.to(top, kept_type)
    denom = F.sqrt(v if top is None else top) / scalar(bias_correction2_sqrt) + np.float32(eps)
    p = p + (scalar(-step_size) * m) / denom
    return tuple(F.to(t, dt) for t, dt in zip((p, m, v), types)) + (kept,)


def adamw(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, param_groups=None, fused=None):
    return AdamW(param_groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, fused=fused)


def nanogpt_param_groups(params, weight_decay):
    """nanoGPT's configure_optimizers groups: tensors of 2+ dims decay, the rest (biases, norms) not."""
    names = list(params)
    ndim = {n: (len(params[n].shape)) for n in names}
    return [{"params": [n for n in names if ndim[n] >= 2], "weight_decay": weight_decay},
            {"params": [n for n in names if ndim[n] < 2], "weight_decay": 0.0}]
