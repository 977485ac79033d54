"""Seeded initializers. Each parameter draws from its own stream, keyed by the model seed and the
parameter's name, so adding a parameter never changes the others' initial values.

The `*_` forms follow torch.nn.init's names: they set a parameter's initializer (nothing is drawn
until `Module.init(seed)`), so nanoGPT's `_init_weights` ports line by line; a parameter that
already holds values (loaded or trained) also gets new ones drawn at once, as torch's.
"""
import math
import zlib

import numpy as np


class Initializer:
    def sample(self, shape, rng):
        raise NotImplementedError


class Normal(Initializer):
    def __init__(self, mean=0.0, std=1.0):
        self.mean, self.std = float(mean), float(std)

    def sample(self, shape, rng):
        return rng.normal(self.mean, self.std, size=shape)

    def __repr__(self):
        return f"normal(mean={self.mean}, std={self.std})"


class Uniform(Initializer):
    def __init__(self, a=0.0, b=1.0):
        self.a, self.b = float(a), float(b)

    def sample(self, shape, rng):
        return rng.uniform(self.a, self.b, size=shape)

    def __repr__(self):
        return f"uniform({self.a}, {self.b})"


class Constant(Initializer):
    def __init__(self, value):
        self.value = np.asarray(value)

    def sample(self, shape, rng):
        return np.broadcast_to(self.value, shape).copy()

    def __repr__(self):
        return f"constant({self.value if self.value.ndim == 0 else 'array'})"


class RowZeroed(Initializer):
    """Another initializer's values with one row set to 0 (nn.Embedding's padding_idx row)."""

    def __init__(self, inner, row):
        self.inner, self.row = inner, row

    def sample(self, shape, rng):
        values = np.array(self.inner.sample(shape, rng))
        values[self.row] = 0
        return values

    def __repr__(self):
        return f"{self.inner!r} with row {self.row} zeroed"


def _set(param, initializer):
    """param's initializer; and, for a Parameter that holds values (loaded, or trained by a compiled
    step: what eager calls and the next step read), those values drawn from it now, from mica's
    host generator (mica.manual_seed), as torch's in-place init changes the tensor."""
    if type(param).__name__ != "Parameter":  # (a plain tensor: filled now, in place, as torch's)
        if not isinstance(param, np.ndarray) or not param.flags.writeable:
            from ..errors import MicaError
            from ..tensor import user_location

            raise MicaError(f"nn.init fills a Parameter or a host tensor in place, not a {type(param).__name__} (a "
                            "traced tensor's values are computed, not set); make it a Parameter, or fill it outside "
                            "the trace", user_location())
        from ..host import written
        from ..random import default_generator

        written(param)  # (a compiled function that read it as a constant is made again)
        np.copyto(param, np.asarray(initializer.sample(param.shape, default_generator._rng)), casting="unsafe")
        return param
    param.init = initializer
    if getattr(param, "_held", None) is not None:
        from ..random import default_generator
        from .modules import _drawn

        param._held = _drawn(initializer, param, default_generator._rng)
    return param


def normal(mean=0.0, std=1.0):
    return Normal(mean, std)


def uniform(a=0.0, b=1.0):
    return Uniform(a, b)


def zeros():
    return Constant(0.0)


def ones():
    return Constant(1.0)


def constant(value):
    return Constant(value)


def normal_(param, mean=0.0, std=1.0):
    return _set(param, Normal(mean, std))


def uniform_(param, a=0.0, b=1.0):
    return _set(param, Uniform(a, b))


def zeros_(param):
    return _set(param, Constant(0.0))


def ones_(param):
    return _set(param, Constant(1.0))


def constant_(param, value):
    return _set(param, Constant(value))


class TruncatedNormal(Initializer):
    """N(mean, std) redrawn until inside [a, b] (torch.nn.init.trunc_normal_'s absolute bounds)."""

    def __init__(self, mean=0.0, std=1.0, a=-2.0, b=2.0):
        self.mean, self.std, self.a, self.b = float(mean), float(std), float(a), float(b)
        if not self.a < self.b:
            raise ValueError(f"trunc_normal_: a ({a}) must be below b ({b})")

    def sample(self, shape, rng):
        out = rng.normal(self.mean, self.std, size=shape)
        bad = (out < self.a) | (out > self.b)
        for _ in range(1000):
            if not bad.any():
                break
            out[bad] = rng.normal(self.mean, self.std, size=int(bad.sum()))
            bad = (out < self.a) | (out > self.b)
        return np.clip(out, self.a, self.b)

    def __repr__(self):
        return f"TruncatedNormal({self.mean}, {self.std}, [{self.a}, {self.b}])"


def _fans(param, what):
    """torch.nn.init's fan_in and fan_out of a weight [out, in, *receptive field]."""
    shape = param.shape
    if len(shape) < 2:
        from ..errors import MicaError

        raise MicaError(f"{what}: fan in and fan out need a weight of 2 or more dims, got {list(shape)}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _gain(nonlinearity, a):
    if nonlinearity in ("linear", "sigmoid", "conv1d", "conv2d", "conv3d"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        return math.sqrt(2.0 / (1 + (0.01 if a is None else a) ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r}")


def calculate_gain(nonlinearity, param=None):
    """torch's: the gain recommended for a nonlinearity (leaky_relu's slope `param`, 0.01 by default)."""
    try:
        return _gain(nonlinearity, param)
    except ValueError:
        from ..errors import MicaError
        from ..tensor import user_location

        raise MicaError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}; give linear, conv1d, conv2d, "
                        "conv3d, sigmoid, tanh, relu, leaky_relu or selu (as torch's)", user_location()) from None


class Eye(Initializer):
    """torch.nn.init.eye_'s: the identity matrix (2-d)."""

    def sample(self, shape, rng):
        return np.eye(shape[0], shape[1])

    def __repr__(self):
        return "eye"


class Dirac(Initializer):
    """torch.nn.init.dirac_'s: a convolution weight [out, in, *k] that passes each of the first
    min(out / groups, in) channels of every group through unchanged (a 1 at the kernel's centre)."""

    def __init__(self, groups=1):
        self.groups = int(groups)

    def sample(self, shape, rng):
        out = np.zeros(shape)
        per_group = shape[0] // self.groups
        centre = tuple(k // 2 for k in shape[2:])
        for g in range(self.groups):
            for d in range(min(per_group, shape[1])):
                out[(g * per_group + d, d) + centre] = 1
        return out

    def __repr__(self):
        return f"dirac(groups={self.groups})"


def eye_(param):
    if len(param.shape) != 2:
        from ..errors import MicaError
        from ..tensor import user_location

        raise MicaError(f"eye_: only 2-d tensors are supported (as torch's), got {list(param.shape)}", user_location())
    return _set(param, Eye())


def dirac_(param, groups=1):
    if len(param.shape) not in (3, 4, 5) or param.shape[0] % groups:
        from ..errors import MicaError
        from ..tensor import user_location

        raise MicaError(f"dirac_: takes a 3-, 4- or 5-d convolution weight whose first dim divides by groups={groups}, "
                        f"got {list(param.shape)}", user_location())
    return _set(param, Dirac(groups))


def xavier_uniform_(param, gain=1.0):
    fan_in, fan_out = _fans(param, "xavier_uniform_")
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(param, -bound, bound)


def xavier_normal_(param, gain=1.0):
    fan_in, fan_out = _fans(param, "xavier_normal_")
    return normal_(param, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))


def kaiming_uniform_(param, a=0, mode="fan_in", nonlinearity="leaky_relu"):
    fan = _fans(param, "kaiming_uniform_")[0 if mode == "fan_in" else 1]
    bound = _gain(nonlinearity, a) * math.sqrt(3.0 / fan) if fan else 0.0
    return uniform_(param, -bound, bound)


def kaiming_normal_(param, a=0, mode="fan_in", nonlinearity="leaky_relu"):
    fan = _fans(param, "kaiming_normal_")[0 if mode == "fan_in" else 1]
    return normal_(param, 0.0, _gain(nonlinearity, a) / math.sqrt(fan) if fan else 0.0)


def trunc_normal_(param, mean=0.0, std=1.0, a=-2.0, b=2.0):
    return _set(param, TruncatedNormal(mean, std, a, b))


class Orthogonal(Initializer):
    """torch.nn.init.orthogonal_'s draw: the weight flattened to [rows, rest], a normal matrix's QR
    (of its transpose where it is wide), Q's columns signed by R's diagonal, times gain."""

    def __init__(self, gain=1.0):
        self.gain = float(gain)

    def sample(self, shape, rng):
        rows = shape[0]
        cols = math.prod(shape[1:])
        flat = rng.normal(0.0, 1.0, size=(rows, cols))
        if rows < cols:
            flat = flat.T
        q, r = np.linalg.qr(flat)
        q = q * np.sign(np.diag(r))
        if rows < cols:
            q = q.T
        return (self.gain * q).reshape(shape)

    def __repr__(self):
        return f"orthogonal(gain={self.gain})"


def orthogonal_(param, gain=1.0):
    if len(param.shape) < 2:
        from ..errors import MicaError
        from ..tensor import user_location

        raise MicaError(f"orthogonal_: only tensors of 2 or more dims can be made orthogonal, got {list(param.shape)}",
                        user_location())
    return _set(param, Orthogonal(gain))


def fan_in_uniform(fan_in):
    """PyTorch's default for Linear weights and biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return Uniform(-bound, bound)


def stream(seed, name):
    """The generator a parameter draws from: a function of the seed and the parameter's name."""
    # the key as uint64 explicitly: a plain list holding a value >= 2**63 (any negative seed) becomes
    # float64 in numpy, which loses bits and warns "invalid value encountered in cast"
    key = np.array([int(seed) & (2**64 - 1), zlib.crc32(name.encode())], dtype=np.uint64)
    return np.random.Generator(np.random.Philox(key=key))


def __getattr__(name):  # (torch.nn.init's in-place functions: Mica's initializers are objects, above)
    if name.startswith("_"):
        raise AttributeError(name)
    from ..errors import missing_verb

    raise missing_verb("mica.nn.init.", name, "torch.nn.init.")
