"""torch.distributions' common families, written with Mica's verbs, so the same code runs on host
tensors (an episode's actions sampled eagerly) and inside a compiled step (the log-probabilities
and entropies a policy-gradient or VAE loss differentiates): Categorical, Normal, Bernoulli,
Uniform, Independent, and kl_divergence between two of a kind.

Each formula is torch's (its parametrisation, clamps and broadcasting), so log_prob, entropy,
mean, variance, cdf and the KL divergences are torch's values to float32 rounding. Samples come
from Mica's generator (repeatable from mica.manual_seed; not torch's numbers); rsample is the
reparametrised draw (`loc + scale * eps`), whose gradient reaches the parameters in a trace.
"""
import math

import numpy as np

from .errors import MicaError


def _m():
    import mica

    return mica


def _say(text):
    from .tensor import user_location

    return MicaError(text, user_location())


def _tensor(x):
    """A parameter as a tensor: a number as a float32 0-d tensor, as torch's broadcast_all."""
    m = _m()
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return m.tensor(float(x))
    if isinstance(x, (list, tuple)) or isinstance(x, np.ndarray) and not isinstance(x, m.Tensor):
        return m.tensor(x)
    return x


def _shape(x):
    return tuple(int(n) for n in x.shape)


def _broadcast(*xs):
    """torch's broadcast_all: the parameters as tensors of their broadcast shape."""
    xs = [_tensor(x) for x in xs]
    shape = np.broadcast_shapes(*(_shape(x) for x in xs))
    return [x if _shape(x) == shape else x.expand(*shape) for x in xs]


def _size(sample_shape):
    if isinstance(sample_shape, int):
        return (sample_shape,)
    return tuple(int(n) for n in sample_shape)


def clamp_probs(probs):
    """torch's: probabilities kept inside [eps, 1 - eps] of their type."""
    eps = _m().finfo(probs.dtype if hasattr(probs, "dtype") else None).eps
    return probs.clamp(min=eps, max=1 - eps)


def probs_to_logits(probs, is_binary=False):
    ps = clamp_probs(probs)
    m = _m()
    return m.log(ps) - m.log1p(-ps) if is_binary else m.log(ps)


def logits_to_probs(logits, is_binary=False):
    m = _m()
    return m.sigmoid(logits) if is_binary else m.nn.functional.softmax(logits, dim=-1)


class Distribution:
    """torch's base: batch_shape, event_shape, sample/rsample/log_prob/entropy."""

    has_rsample = False
    _validate_args = False

    def __init__(self, batch_shape=(), event_shape=(), validate_args=None):
        self._batch_shape, self._event_shape = tuple(batch_shape), tuple(event_shape)

    @staticmethod
    def set_default_validate_args(value):
        Distribution._validate_args = bool(value)

    @property
    def batch_shape(self):
        return self._batch_shape

    @property
    def event_shape(self):
        return self._event_shape

    def _extended_shape(self, sample_shape=()):
        return _size(sample_shape) + self._batch_shape + self._event_shape

    def sample(self, sample_shape=()):
        with _m().no_grad():
            return self.rsample(sample_shape).detach()

    def rsample(self, sample_shape=()):
        raise _say(f"{type(self).__name__} has no reparametrised sample (rsample); use sample(), whose values carry no "
                   "gradient (torch's has_rsample is False for it)")

    def sample_n(self, n):
        return self.sample((n,))

    @property
    def stddev(self):
        return self.variance.sqrt()

    def perplexity(self):
        return _m().exp(self.entropy())

    def __repr__(self):
        return f"{type(self).__name__}()"


class Categorical(Distribution):
    """torch's: over the last dim of probs (normalized) or logits (normalized by logsumexp)."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        if (probs is None) == (logits is None):
            raise _say("Categorical takes either probs or logits, not both (as torch's)")
        if probs is not None:
            probs = _tensor(probs)
            if not probs.ndim:
                raise _say("Categorical's probs must be at least one-dimensional")
            self.probs = probs / probs.sum(-1, keepdim=True)
            self.logits = probs_to_logits(self.probs)
        else:
            logits = _tensor(logits)
            if not logits.ndim:
                raise _say("Categorical's logits must be at least one-dimensional")
            self.logits = logits - logits.logsumexp(dim=-1, keepdim=True)
            self.probs = logits_to_probs(self.logits)
        self._param = self.probs if probs is not None else self.logits
        self._num_events = _shape(self._param)[-1]
        super().__init__(_shape(self._param)[:-1])

    @property
    def param_shape(self):
        return _shape(self._param)

    @property
    def mean(self):
        return _m().full(self._extended_shape(), float("nan"))

    @property
    def mode(self):
        return self.probs.argmax(dim=-1)

    @property
    def variance(self):
        return _m().full(self._extended_shape(), float("nan"))

    def sample(self, sample_shape=()):
        m = _m()
        shape = _size(sample_shape)
        n = int(np.prod(shape)) if shape else 1
        with m.no_grad():
            probs = self.probs.detach().reshape(-1, self._num_events)
            if _traced(probs):  # (in a trace: the inverse of the cdf at a uniform draw)
                u = m.rand(n, probs.shape[0], 1)
                cdf = probs.cumsum(-1) / probs.sum(-1, keepdim=True)
                drawn = (cdf < u).long().sum(-1).clamp(max=self._num_events - 1)
            else:
                drawn = m.multinomial(probs, n, True).t()
            return m.reshape(drawn, shape + self._batch_shape)

    def log_prob(self, value):
        m = _m()
        value = _tensor(value).long().unsqueeze(-1)
        shape = np.broadcast_shapes(_shape(value), _shape(self.logits))
        value = value.expand(*shape)[..., :1]
        return self.logits.expand(*shape).gather(-1, value).squeeze(-1)

    def entropy(self):
        m = _m()
        logits = self.logits.clamp(min=m.finfo(self.logits.dtype).min)
        return -(logits * self.probs).sum(-1)

    def enumerate_support(self, expand=True):
        m = _m()
        values = m.arange(self._num_events).reshape((-1,) + (1,) * len(self._batch_shape))
        return values.expand(self._num_events, *self._batch_shape) if expand else values


class OneHotCategorical(Distribution):
    """torch's: a Categorical whose samples and values are one-hot vectors."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        self._categorical = Categorical(probs, logits)
        super().__init__(self._categorical.batch_shape, self._categorical.param_shape[-1:])

    probs = property(lambda self: self._categorical.probs)
    logits = property(lambda self: self._categorical.logits)
    mean = property(lambda self: self._categorical.probs)
    variance = property(lambda self: self._categorical.probs * (1 - self._categorical.probs))

    def sample(self, sample_shape=()):
        m = _m()
        index = self._categorical.sample(sample_shape)
        return m.nn.functional.one_hot(index, self._categorical._num_events).to(self.probs.dtype)

    def log_prob(self, value):
        return self._categorical.log_prob(_tensor(value).argmax(-1))

    def entropy(self):
        return self._categorical.entropy()


def _traced(x):
    from .tensor import Tensor

    return isinstance(x, Tensor)


class Normal(Distribution):
    """torch's: loc and scale, broadcast together."""

    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        self.loc, self.scale = _broadcast(loc, scale)
        super().__init__(_shape(self.loc))

    mean = property(lambda self: self.loc)
    mode = property(lambda self: self.loc)
    stddev = property(lambda self: self.scale)
    variance = property(lambda self: self.scale.pow(2))

    def rsample(self, sample_shape=()):
        m = _m()
        shape = self._extended_shape(sample_shape)
        eps = m.randn(*shape) if shape else m.randn(())
        return self.loc + eps * self.scale

    def sample(self, sample_shape=()):
        with _m().no_grad():
            return self.rsample(sample_shape).detach()

    def log_prob(self, value):
        m = _m()
        value = _tensor(value)
        var = self.scale ** 2
        return -((value - self.loc) ** 2) / (2 * var) - m.log(self.scale) - math.log(math.sqrt(2 * math.pi))

    def entropy(self):
        return 0.5 + 0.5 * math.log(2 * math.pi) + _m().log(self.scale)

    def cdf(self, value):
        return 0.5 * (1 + _m().erf((_tensor(value) - self.loc) * self.scale.reciprocal() / math.sqrt(2)))

    def icdf(self, value):
        raise _say("Normal.icdf needs erfinv, which Mica does not have yet; compute the quantile another way")


class Bernoulli(Distribution):
    """torch's: probs or logits."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        if (probs is None) == (logits is None):
            raise _say("Bernoulli takes either probs or logits, not both (as torch's)")
        if probs is not None:
            (self.probs,) = _broadcast(probs)
            self.logits = probs_to_logits(self.probs, is_binary=True)
        else:
            (self.logits,) = _broadcast(logits)
            self.probs = logits_to_probs(self.logits, is_binary=True)
        super().__init__(_shape(self.probs))

    mean = property(lambda self: self.probs)
    variance = property(lambda self: self.probs * (1 - self.probs))

    @property
    def mode(self):
        m = _m()
        return (self.probs >= 0.5).to(self.probs.dtype)

    def sample(self, sample_shape=()):
        m = _m()
        with m.no_grad():
            return m.bernoulli(self.probs.detach().expand(*self._extended_shape(sample_shape)))

    def log_prob(self, value):
        m = _m()
        logits, value = _broadcast(self.logits, value)
        return -m.nn.functional.binary_cross_entropy_with_logits(logits, value.to(logits.dtype), reduction="none")

    def entropy(self):
        m = _m()
        return m.nn.functional.binary_cross_entropy_with_logits(self.logits, self.probs, reduction="none")


class Uniform(Distribution):
    """torch's: [low, high)."""

    has_rsample = True

    def __init__(self, low, high, validate_args=None):
        self.low, self.high = _broadcast(low, high)
        super().__init__(_shape(self.low))

    mean = property(lambda self: (self.high + self.low) / 2)
    stddev = property(lambda self: (self.high - self.low) / 12 ** 0.5)
    variance = property(lambda self: (self.high - self.low).pow(2) / 12)

    def rsample(self, sample_shape=()):
        m = _m()
        shape = self._extended_shape(sample_shape)
        u = m.rand(*shape) if shape else m.rand(())
        return self.low + u * (self.high - self.low)

    def log_prob(self, value):
        m = _m()
        value = _tensor(value)
        lb = (self.low <= value).to(self.low.dtype)
        ub = (self.high > value).to(self.low.dtype)
        return m.log(lb * ub) - m.log(self.high - self.low)

    def cdf(self, value):
        return ((_tensor(value) - self.low) / (self.high - self.low)).clamp(min=0, max=1)

    def icdf(self, value):
        return _tensor(value) * (self.high - self.low) + self.low

    def entropy(self):
        return _m().log(self.high - self.low)


class Independent(Distribution):
    """torch's: the last reinterpreted_batch_ndims batch dims of a distribution read as its event."""

    def __init__(self, base_distribution, reinterpreted_batch_ndims, validate_args=None):
        n = int(reinterpreted_batch_ndims)
        shape = base_distribution.batch_shape + base_distribution.event_shape
        if n > len(base_distribution.batch_shape):
            raise _say(f"Independent: reinterpreted_batch_ndims ({n}) must be at most the base distribution's batch "
                       f"dims ({len(base_distribution.batch_shape)})")
        self.base_dist, self.reinterpreted_batch_ndims = base_distribution, n
        cut = len(shape) - len(base_distribution.event_shape) - n
        super().__init__(shape[:cut], shape[cut:])
        self.has_rsample = base_distribution.has_rsample

    mean = property(lambda self: self.base_dist.mean)
    mode = property(lambda self: self.base_dist.mode)
    variance = property(lambda self: self.base_dist.variance)

    def sample(self, sample_shape=()):
        return self.base_dist.sample(sample_shape)

    def rsample(self, sample_shape=()):
        return self.base_dist.rsample(sample_shape)

    def _sum(self, x):
        return x.sum(tuple(range(-self.reinterpreted_batch_ndims, 0))) if self.reinterpreted_batch_ndims else x

    def log_prob(self, value):
        return self._sum(self.base_dist.log_prob(value))

    def entropy(self):
        return self._sum(self.base_dist.entropy())


def kl_divergence(p, q):
    """torch's KL(p || q) for two distributions of one family (Normal, Categorical, OneHotCategorical,
    Bernoulli, Uniform, Independent of those)."""
    m = _m()
    if isinstance(p, Independent) and isinstance(q, Independent):
        if p.reinterpreted_batch_ndims != q.reinterpreted_batch_ndims:
            raise _say("kl_divergence: two Independent distributions of different reinterpreted_batch_ndims")
        return p._sum(kl_divergence(p.base_dist, q.base_dist))
    if isinstance(p, Normal) and isinstance(q, Normal):
        var_ratio = (p.scale / q.scale).pow(2)
        t1 = ((p.loc - q.loc) / q.scale).pow(2)
        return 0.5 * (var_ratio + t1 - 1 - var_ratio.log())
    if isinstance(p, OneHotCategorical) and isinstance(q, OneHotCategorical):
        return kl_divergence(p._categorical, q._categorical)
    if isinstance(p, Categorical) and isinstance(q, Categorical):
        t = p.probs * (p.logits - q.logits)
        t = m.where((q.probs == 0).expand_as(t), m.full_like(t, float("inf")), t)
        t = m.where((p.probs == 0).expand_as(t), m.zeros_like(t), t)
        return t.sum(-1)
    if isinstance(p, Bernoulli) and isinstance(q, Bernoulli):
        softplus = m.nn.functional.softplus
        t1 = p.probs * (softplus(-q.logits) - softplus(-p.logits))
        t1 = m.where(q.probs == 0, m.full_like(t1, float("inf")), t1)
        t1 = m.where(p.probs == 0, m.zeros_like(t1), t1)
        t2 = (1 - p.probs) * (softplus(q.logits) - softplus(p.logits))
        t2 = m.where(q.probs == 1, m.full_like(t2, float("inf")), t2)
        t2 = m.where(p.probs == 1, m.zeros_like(t2), t2)
        return t1 + t2
    if isinstance(p, Uniform) and isinstance(q, Uniform):
        result = m.log((q.high - q.low) / (p.high - p.low))
        outside = (q.low > p.low) | (q.high < p.high)
        return m.where(outside, m.full_like(result, float("inf")), result)
    raise _say(f"kl_divergence between {type(p).__name__} and {type(q).__name__} is not one Mica has (it has Normal, "
               "Categorical, OneHotCategorical, Bernoulli, Uniform and Independent of those, each with its own kind)")


def _submodules():
    """torch's module paths (torch.distributions.normal.Normal, torch.distributions.kl.kl_divergence)."""
    import sys
    import types

    for path, names in {"normal": ("Normal",), "categorical": ("Categorical",), "bernoulli": ("Bernoulli",),
                        "uniform": ("Uniform",), "independent": ("Independent",), "kl": ("kl_divergence",),
                        "one_hot_categorical": ("OneHotCategorical",), "distribution": ("Distribution",),
                        "utils": ("clamp_probs", "probs_to_logits", "logits_to_probs")}.items():
        module = types.ModuleType(f"{__name__}.{path}")
        for name in names:
            setattr(module, name, globals()[name])
        sys.modules[module.__name__] = module
        globals()[path] = module


_submodules()


def __getattr__(name):  # (another of torch.distributions' families: one sentence)
    if name.startswith("_"):
        raise AttributeError(name)
    from .errors import missing_verb

    raise missing_verb("mica.distributions.", name, "torch.distributions.")
