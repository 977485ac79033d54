"""Muon, as the speedrun seed writes it: momentum lerp, Nesterov blend, Newton–Schulz
orthogonalization (a configurable list of (a, b, c) coefficients, in a chosen element type),
the aspect-ratio scale, and decoupled weight decay."""
from .. import dtypes, verbs as F
from ..errors import MicaError
from .base import Optimizer, zeros_like_tree

SEED_COEFFICIENTS = ((2.0, -1.5, 0.5),) * 12          # the seed's quintic, twelve times, in bf16
QUINTIC_COEFFICIENTS = ((3.4445, -4.7750, 2.0315),) * 5  # the tuned five-step variant


def zeropower_via_newtonschulz(G, coefficients=SEED_COEFFICIENTS, dtype=dtypes.bfloat16, eps=1e-7):
    """Approximately orthogonalize G (singular values pushed toward 1)."""
    if G.ndim < 2:
        raise MicaError(f"Newton–Schulz needs a matrix, got {G.value.spec!r}")
    X = F.to(G, dtype) if dtype is not None else G
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT
    X = X / (F.norm(X, dim=(-2, -1), keepdim=True) + eps)
    for a, b, c in coefficients:
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if tall:
        X = X.mT
    return X


class Muon(Optimizer):
    defaults = dict(lr=0.02, weight_decay=0.0, mu=0.95, nesterov=True, ns_coefficients=SEED_COEFFICIENTS,
                    ns_dtype=dtypes.bfloat16)

    def _init(self, params):
        for n, p in params.items():
            if p.ndim != 2:
                raise MicaError(f"Muon updates matrices only; parameter {n!r} has shape {list(p.shape)}")
        return {"momentum": zeros_like_tree(params)}

    def _update(self, params, grads, state, groups):
        moms = dict(state["momentum"])
        for hyper, names, lr in groups:
            mu = hyper["mu"]
            for n in names:
                grad, momentum = grads[n], moms[n]
                momentum = F.lerp(momentum, grad, 1 - mu)
                update = F.lerp(grad, momentum, mu) if hyper["nesterov"] else momentum
                update = zeropower_via_newtonschulz(update, hyper["ns_coefficients"], hyper["ns_dtype"])
                update = update * max(1, grad.size(-2) / grad.size(-1)) ** 0.5
                p = params[n]
                if hyper["weight_decay"] != 0:
                    p = p * (1 - lr * hyper["weight_decay"])
                params[n] = F.add(p, update, alpha=-lr)
                moms[n] = momentum
        return {"momentum": moms}


def muon(lr=0.02, weight_decay=0.0, mu=0.95, nesterov=True, ns_coefficients=SEED_COEFFICIENTS,
         ns_dtype=dtypes.bfloat16, param_groups=None):
    return Muon(param_groups, lr=lr, weight_decay=weight_decay, mu=mu, nesterov=nesterov,
                ns_coefficients=tuple(tuple(c) for c in ns_coefficients), ns_dtype=ns_dtype)
