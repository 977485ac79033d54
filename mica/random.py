"""torch's random draws, outside a trace: host tensors for the code around a model (sampling the
next token, a random batch, a random permutation), from one seeded generator (numpy's PCG64).

The numbers are not torch's (another generator), but a seed gives the same numbers on every run
and machine. Inside a traced step there are no host draws: rand, randn, rand_like, randn_like,
bernoulli, normal and randint are the program's own draws there (verbs/nn.py's uniform_draw, normal_draw:
dropout's counter-based stream, a function of the call's seed and offset), and the others a
sentence that says so.
"""
import numpy as np

from .errors import MicaError, TraceError
from .host import host

_DEFAULT_SEED = 67280421310721  # (torch's initial seed: a program that never seeds still repeats)


class Generator:
    """torch.Generator: its own stream, seeded with manual_seed."""

    def __init__(self, device="cpu"):
        self.manual_seed(_DEFAULT_SEED)

    def manual_seed(self, seed):
        seed = int(seed)
        self._seed = seed
        self._rng = np.random.Generator(np.random.PCG64(seed % 2 ** 64))
        return self

    def seed(self):
        """torch's: a seed from the operating system's randomness, set and returned."""
        import os

        s = int.from_bytes(os.urandom(8), "little") >> 1
        self.manual_seed(s)
        return s

    def initial_seed(self):
        return self._seed

    def get_state(self):
        return host(np.frombuffer(repr(self._rng.bit_generator.state).encode(), dtype=np.uint8).copy())

    def set_state(self, state):
        import ast

        self._rng.bit_generator.state = ast.literal_eval(bytes(np.asarray(state, dtype=np.uint8)).decode())
        return self


default_generator = Generator()


_INIT = {"seed": _DEFAULT_SEED, "made": 0}  # (mica.manual_seed's seed, and how many Parameters were made since)


def manual_seed(seed):
    _INIT.update(seed=int(seed), made=0)
    return default_generator.manual_seed(seed)


def seed():
    s = default_generator.seed()
    _INIT.update(seed=s, made=0)
    return s


def init_key():
    """The key a Parameter made now draws its initial values with (where no model.init(seed) or
    loaded values give them): one of mica.manual_seed's seed (torch's default one before any) and
    how many Parameters were made since, so a model made after manual_seed(s) starts the same on
    every run, another seed starts it elsewhere, as torch's initial weights, and nothing about the
    names its parameters are later given changes them."""
    _INIT["made"] += 1
    return ((_INIT["seed"] & (2 ** 64 - 1)) * 0x9E3779B97F4A7C15 + _INIT["made"]) & (2 ** 64 - 1) or 1


def initial_seed():
    return default_generator.initial_seed()


def get_rng_state():
    return default_generator.get_state()


def set_rng_state(state):
    default_generator.set_state(state)


def _rng(verb, generator):
    from .tensor import in_trace, user_location

    if in_trace():
        raise TraceError(f"mica.{verb} draws random numbers on the host, outside a traced step; inside one, "
                         "randomness is the program's, as dropout's (rand, randn, rand_like, randn_like, bernoulli, "
                         "normal, randint and a tensor's bernoulli_, uniform_ and normal_ draw there; draw the rest "
                         "outside and pass them in as an input)",
                         user_location())
    return (generator or default_generator)._rng


def _traced(verb, generator):
    """Whether a draw is made inside a trace: the program's own (verbs/nn.py's uniform and normal,
    keyed as dropout is by the run's seed and offset: mica.manual_seed repeats a compiled call's
    draws); a generator there is a sentence (its state lives on the host)."""
    from .tensor import in_trace, user_location

    if not in_trace():
        return False
    if generator is not None:
        raise TraceError(f"mica.{verb}(generator=...) inside a traced step: the step's draws are the program's, keyed "
                         "by mica.manual_seed at each call; leave generator out there (or draw outside and pass the "
                         "numbers in)", user_location())
    return True


def _where():
    from .tensor import user_location

    return user_location()


def _size(verb, size):
    size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
    if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0 for s in size):
        raise MicaError(f"mica.{verb}: a size is non-negative ints, got {list(size)}")
    return tuple(int(s) for s in size)


def _float(dtype):
    from .dtypes import DEFAULT_FLOAT, as_dtype

    dt = as_dtype(dtype) if dtype is not None else DEFAULT_FLOAT
    if dt.kind != "float":
        raise MicaError(f"a random draw of floats cannot be of {dt.name}; give a float type")
    return dt


def _leaf(draw):
    """requires_grad=True: torch's leaf tensor, here a Parameter of the values drawn (what a
    compiled step and the optimizers take)."""
    import functools

    @functools.wraps(draw)
    def made(*args, requires_grad=False, **kwargs):
        values = draw(*args, **kwargs)
        if requires_grad:
            from .host import _leaf_parameter

            return _leaf_parameter(values)
        return values
    return made


@_leaf
def rand(*size, generator=None, dtype=None, **_device):
    dt = _float(dtype)
    if _traced("rand", generator):
        from .verbs.nn import uniform_draw

        return uniform_draw(_size("rand", size), dt, "rand")
    return host(_rng("rand", generator).random(_size("rand", size)).astype(dt.np_storage))


@_leaf
def randn(*size, generator=None, dtype=None, **_device):
    dt = _float(dtype)
    if _traced("randn", generator):
        from .verbs.nn import normal_draw

        return normal_draw(_size("randn", size), dt, "randn")
    return host(_rng("randn", generator).standard_normal(_size("randn", size)).astype(dt.np_storage))


@_leaf
def rand_like(input, dtype=None, **_device):
    if _traced("rand_like", None):
        from .verbs.nn import uniform_draw

        return uniform_draw(tuple(input.shape), _float(dtype or input.dtype), "rand_like")
    _rng("rand_like", None)
    return rand(*np.shape(input), dtype=dtype or _like_float(input))


@_leaf
def randn_like(input, dtype=None, **_device):
    if _traced("randn_like", None):
        from .verbs.nn import normal_draw

        return normal_draw(tuple(input.shape), _float(dtype or input.dtype), "randn_like")
    _rng("randn_like", None)
    return randn(*np.shape(input), dtype=dtype or _like_float(input))


def _like_float(input):
    dt = getattr(input, "dtype", None)
    return dt if dt is not None and np.dtype(dt).kind == "f" else None


def randint(*args, size=None, generator=None, dtype=None, **_device):
    """randint(high, size) or randint(low, high, size): ints in [low, high), int64."""
    from . import dtypes
    from .dtypes import as_dtype, int64

    if size is not None:
        args = args + (size,)
    if len(args) == 2:
        low, (high, size) = 0, args
    elif len(args) == 3:
        low, high, size = args
    else:
        raise MicaError("mica.randint takes (high, size) or (low, high, size)")
    if not int(low) < int(high):
        raise MicaError(f"mica.randint: low ({low}) must be below high ({high})")
    dt = as_dtype(dtype) if dtype is not None else int64
    if _traced("randint", generator):  # (a diffusion model's timesteps: floor(u * n) + low, u's 24 bits in float64)
        from .verbs import add, clamp, floor, mul, to
        from .verbs.nn import uniform_draw

        n = int(high) - int(low)
        if n > 1 << 24:
            raise TraceError(f"mica.randint inside a traced step draws from 2**24 values at most (its 24 random bits); "
                             f"[{low}, {high}) holds {n}: draw it outside and pass it in", _where())
        u = uniform_draw(_size("randint", (size,)), dtypes.float64, "randint")
        picks = clamp(to(floor(mul(u, float(n))), dt), 0, n - 1)
        return add(picks, int(low)) if int(low) else picks
    draws = _rng("randint", generator).integers(int(low), int(high), _size("randint", (size,)), dtype=np.int64)
    return host(draws.astype(dt.np_storage))


def randperm(n, generator=None, dtype=None, **_device):
    from .dtypes import as_dtype, int64

    dt = as_dtype(dtype) if dtype is not None else int64
    return host(_rng("randperm", generator).permutation(int(n)).astype(dt.np_storage))


@_leaf
def normal(mean=0.0, std=1.0, size=None, generator=None, **_device):
    if _traced("normal", generator):
        from .verbs import as_tensor
        from .verbs.nn import normal_draw

        floats = [as_tensor(a) for a in (mean, std) if not isinstance(a, (int, float))]
        shape = _size("normal", (size,)) if size is not None else np.broadcast_shapes(
            *(tuple(a.shape) for a in floats)) if floats else ()
        dt = floats[0].dtype if floats and floats[0].dtype.kind == "float" else _float(None)
        return normal_draw(shape, dt, "normal") * std + mean
    rng = _rng("normal", generator)
    shape = _size("normal", (size,)) if size is not None else np.broadcast_shapes(np.shape(mean), np.shape(std))
    out = np.asarray(mean) + np.asarray(std) * rng.standard_normal(shape)
    floats = [a for a in (mean, std) if isinstance(a, np.ndarray)]
    return host(out.astype(floats[0].dtype if floats and floats[0].dtype.kind == "f" else np.float32))


def bernoulli(input, p=None, generator=None):
    if _traced("bernoulli", generator):
        from .verbs import as_tensor, lt, to
        from .verbs.nn import uniform_draw

        probs = as_tensor(input)
        if probs.dtype.kind != "float":
            raise TraceError("mica.bernoulli takes floating probabilities (as torch's)", _where())
        u = uniform_draw(tuple(probs.shape), probs.dtype, "bernoulli")
        return to(lt(u, probs if p is None else float(p)), probs.dtype)
    _rng("bernoulli", generator)
    probs = np.asarray(input if p is None else np.full(np.shape(input), p))
    return host((_rng("bernoulli", generator).random(probs.shape) < probs).astype(
        probs.dtype if probs.dtype.kind == "f" else np.float32))


def multinomial(input, num_samples, replacement=False, generator=None):
    """Indices drawn from each row's weights (non-negative, not all zero; not normalized), as
    torch's: with replacement independent draws, without it each index at most once."""
    rng = _rng("multinomial", generator)
    w = np.asarray(input, dtype=np.float64)
    if w.ndim not in (1, 2):
        raise MicaError(f"mica.multinomial takes a 1-d or 2-d tensor of weights, got shape {list(w.shape)}", _where())
    rows = w.reshape(-1, w.shape[-1])
    if not np.isfinite(rows).all() or (rows < 0).any():
        raise MicaError("mica.multinomial: weights must be finite and non-negative (a NaN or inf in the "
                        "probabilities?)", _where())
    n = rows.shape[1]
    if not replacement and num_samples > n:
        raise MicaError(f"mica.multinomial: cannot draw {num_samples} samples without replacement from {n} "
                        "categories; pass replacement=True", _where())
    out = np.empty((rows.shape[0], int(num_samples)), dtype=np.int64)
    for r, row in enumerate(rows):
        if row.sum() <= 0:
            raise MicaError("mica.multinomial: a row of weights sums to zero; every row needs a positive weight", _where())
        live = row.copy()
        for s in range(int(num_samples)):
            total = live.sum()
            if total <= 0:
                raise MicaError("mica.multinomial: fewer categories with a positive weight than samples asked "
                                "without replacement", _where())
            pick = int(np.searchsorted(np.cumsum(live), rng.random() * total, side="right"))
            pick = min(pick, n - 1)
            while live[pick] == 0:  # (a draw at an edge of a zero-weight category: the next with weight)
                pick = (pick + 1) % n
            out[r, s] = pick
            if not replacement:
                live[pick] = 0.0
    return host(out.reshape(w.shape[:-1] + (int(num_samples),)))
