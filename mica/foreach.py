"""torch._foreach_*: one tensor operation over a list of tensors (EMA updates in diffusion repos:
`torch._foreach_mul_(ema_params, decay)`, `torch._foreach_add_(ema_params, params, alpha=1 - decay)`),
each element's the method torch.Tensor has, so the lists may hold Parameters, host tensors and
traced tensors, inside a compiled step or outside it."""
from .errors import MicaError

_OPS = ("add", "sub", "mul", "div", "lerp", "copy", "zero", "maximum", "minimum", "pow", "addcmul", "addcdiv",
        "neg", "abs", "sqrt", "exp", "clamp_min", "clamp_max", "sign", "reciprocal")


def _others(name, tensors, other):
    """`other` per tensor: a list of the same length, or one value (number or tensor) for all."""
    from .tensor import user_location

    if isinstance(other, (list, tuple)):
        if len(other) != len(tensors):
            raise MicaError(f"torch._foreach_{name}: the lists hold {len(tensors)} and {len(other)} tensors; give lists "
                            "of one length (as torch's)", user_location())
        return list(other)
    return [other] * len(tensors)


def _foreach(name, inplace):
    method = name + "_" if inplace else name
    verb = {"copy": "copy_"}.get(name, method)

    def each(self, *args, **kwargs):
        tensors = list(self)
        spread = [_others(name, tensors, a) for a in args]
        out = [getattr(t, verb)(*(s[i] for s in spread), **kwargs) for i, t in enumerate(tensors)]
        return None if inplace else out
    each.__name__ = f"_foreach_{method}"
    return each


def names():
    """{torch's name: the function} for every _foreach_ form here, in place and not."""
    out = {}
    for op in _OPS:
        out[f"_foreach_{op}_"] = _foreach(op, True)
        if op not in ("copy", "zero"):
            out[f"_foreach_{op}"] = _foreach(op, False)
    return out
