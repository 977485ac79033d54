"""Seeded initializers. Each parameter draws from its own stream, keyed by the model seed and the
parameter's name, so adding a parameter never changes the others' initial values.

The `*_` forms follow torch.nn.init's names: they set a parameter's initializer (nothing is drawn
until `Module.init(seed)`), so nanoGPT's `_init_weights` ports line by line.
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
    param.init = Normal(mean, std)
    return param


def uniform_(param, a=0.0, b=1.0):
    param.init = Uniform(a, b)
    return param


def zeros_(param):
    param.init = Constant(0.0)
    return param


def ones_(param):
    param.init = Constant(1.0)
    return param


def constant_(param, value):
    param.init = Constant(value)
    return param


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
