"""Mica: a compiler for training programs.

Write a model and its training step with PyTorch's verbs, trace it once with static shapes
(`mica.trace`), differentiate it ahead of time (`mica.grad`), and run it on the float64 oracle
(`mica.reference.run`) or — later stages — as compiled native code.
"""
import os as _os

import numpy as _np
import signal as _signal
import sys as _sys

if _sys.argv and _os.path.basename(_sys.argv[0]) == "mica" and \
        _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    def _interrupted_starting(signum, frame):
        """The mica command's Ctrl-C while it imports (cli.main takes over after): its status and
        sentence, not a traceback from the middle of an import."""
        _os.write(2, b"mica: interrupted\n")
        _os._exit(130)

    _signal.signal(_signal.SIGINT, _interrupted_starting)

from .amp import autocast  # noqa: E402
from . import serialization  # noqa: E402  (torch.save's file format)
from .serialization import load, save  # noqa: E402
from .dtypes import Spec  # noqa: E402
from .dtypes import bfloat16, bool_, finfo, float16, float32, float64, iinfo, int32, int64  # noqa: E402
from .errors import GradError, MicaError, ShapeError, TraceError  # noqa: E402
from .errors import install_excepthook as _install_excepthook  # noqa: E402
from .grad import (  # noqa: E402
    enable_grad, grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled, value_and_grad,
)
from .tensor import Tensor as _TracedTensor  # noqa: E402
from .trace import Program, compile, trace  # noqa: A004, E402
from .verbs import (  # noqa: E402
    abs, add, addbmm, addcdiv, addmm, addmv, all, baddbmm, cdist, count_nonzero, dot, logaddexp, logit, mv, nan_to_num,
    nanmean, nansum, reciprocal, rsub, selu, celu, xlogy, empty, empty_like, clone, broadcast_to, get_default_dtype,
    hstack, vstack, meshgrid, tril_indices, triu_indices, diff, logcumsumexp, allclose, any, addcmul, amax, amin, arange, argmax, argmin, argsort, as_tensor, bitwise_and, bitwise_not,
    bitwise_or, bitwise_xor, bitwise_left_shift, bitwise_right_shift, bmm, cat, chunk, clamp, clamp_max, clamp_min, clip,
    ceil, concat, cos, cosine_similarity, cross_entropy, cumprod, cumsum, detach, diag, diagonal, div, dropout, einsum, embedding, eq, equal, erf, exp, expm1, eye, expand, fix, flatten, flip, fliplr, flipud, floor, floor_divide, fmod, frac, full,
    full_like, gather, ge, gelu, gt, index_add, index_copy, index_fill, index_put, index_select, is_floating_point, is_tensor, isclose, isfinite, isinf, isnan, layer_norm, le, lerp, linear, linspace, log, log10, log1p, log2, log_softmax, logical_and,
    logical_not, logical_or, logical_xor, logsumexp, lt, masked_fill, matmul, max, maximum, mean, median, min, minimum, mm, msort,
    moveaxis, movedim, mul, narrow, ne,
    neg, nll_loss, norm, one_hot, ones, ones_like, outer, permute, pow, prod, relu, remainder, repeat, repeat_interleave, reshape, result_type,
    rms_norm, roll, round, rsqrt, scaled_dot_product_attention, scatter, scatter_add, select, sgn, sigmoid, sign, silu, sin, softmax, sort, split, sqrt, square,
    squeeze, stack, std, sub, sum, take_along_dim, tanh, tensor, topk, to, transpose, tril, triu, trunc, unbind, unsqueeze, var, view,
    where, zeros, zeros_like, var_mean, std_mean, tensor_split, diag_embed, tensordot, swapaxes, swapdims,
    instance_norm, pixel_shuffle, pixel_unshuffle,
)
from . import accelerator, autograd, cuda, distributed, distributions, linalg, nn, optim, reference, utils  # noqa: E402
from . import verbs as _verbs  # noqa: E402
from .complex import (  # noqa: E402,A004  (torch's names; each takes host tensors and traced ones)
    cdouble, cfloat, complex, complex64, complex128, imag, is_complex, polar, real, view_as_complex, view_as_real,
)
from .histograms import bincount, histc, histogram  # noqa: E402  (on host tensors: plots; bincount traced too)
from .host import HostTensor, eager as _eager, _add_torch_methods, from_numpy  # noqa: E402
from .host import _Device as device  # noqa: E402  (torch.device: kept, and ignored)
from .random import (  # noqa: E402  (host draws, outside a trace)
    Generator, bernoulli, default_generator, get_rng_state, initial_seed, manual_seed, multinomial, normal, rand,
    rand_like, randint, randn, randn_like, randperm, seed, set_rng_state,
)

# outside a trace the verbs take and give host tensors, torch's eager tensors (mica/host.py)
_add_torch_methods()
for _name in [n for n in dir() if not n.startswith("_") and n != "result_type"]:
    if getattr(globals()[_name], "__module__", "").startswith("mica.verbs") and callable(globals()[_name]):
        globals()[_name] = _eager(globals()[_name])
for _name in [n for n in dir(nn.functional) if not n.startswith("_")]:
    if getattr(getattr(nn.functional, _name), "__module__", "").startswith("mica.verbs"):
        setattr(nn.functional, _name, _eager(getattr(nn.functional, _name)))



class _AnyTensorType(type):
    """isinstance(x, mica.Tensor) as torch.Tensor's: true of a traced tensor, a host tensor and a
    Parameter (a plain numpy array is data, not a tensor)."""

    def __instancecheck__(cls, obj):
        from .nn.modules import Parameter

        return isinstance(obj, (_TracedTensor, HostTensor, Parameter))

    def __subclasscheck__(cls, sub):
        from .nn.modules import Parameter

        return issubclass(sub, (_TracedTensor, HostTensor, Parameter))


class Tensor(_TracedTensor, metaclass=_AnyTensorType):
    """torch.Tensor as a name: its methods (`dir(mica.Tensor)`) are a traced tensor's, and
    `isinstance(x, mica.Tensor)` holds for every tensor a program or a script holds."""

    __slots__ = ()


def is_tensor(obj):
    """torch.is_tensor: whether obj is a tensor (traced, host, or a Parameter), a Python bool."""
    return isinstance(obj, Tensor)


def is_floating_point(input):
    """torch.is_floating_point: whether input's type is a floating one, a Python bool."""
    if isinstance(input, _TracedTensor):
        return _verbs.is_floating_point(input)
    if not isinstance(input, (Tensor, _np.ndarray)):
        raise MicaError(f"is_floating_point takes a tensor, got {type(input).__name__} (as torch's)")
    return _np.asarray(input).dtype.kind == "f"


class memory_format:  # noqa: N801  (torch's name)
    """torch's memory formats (channels_last, contiguous_format, ...): taken where torch takes them
    (x.contiguous(memory_format=...), x.to(memory_format=...), model.to(memory_format=...)) and
    changing nothing: how a program lays out memory is its own plan."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"mica.{self.name}"


channels_last, channels_last_3d = memory_format("channels_last"), memory_format("channels_last_3d")
contiguous_format, preserve_format = memory_format("contiguous_format"), memory_format("preserve_format")

bool = bool_  # noqa: A001  (mica.bool, like torch.bool)
f32, bf16, f16, f64, i32, i64, b8 = float32, bfloat16, float16, float64, int32, int64, bool_
float, double, half, long, int = float32, float64, float16, int64, int32  # noqa: A001

__version__ = "0.1.0"


def __getattr__(name):  # (a verb torch has and Mica does not: one sentence; submodules still import)
    from .errors import MissingVerbError, missing_verb

    if name.startswith("_foreach_"):  # (torch's list forms: an EMA's _foreach_mul_ / _foreach_add_)
        from .foreach import names

        found = names().get(name)
        if found is None:
            raise missing_verb("mica.", name, "torch.")
        return found
    if name.startswith("_"):
        raise AttributeError(name)

    if name in ("set_float32_matmul_precision", "get_float32_matmul_precision"):
        from . import backends

        return getattr(backends, name)
    raise missing_verb("mica.", name, "torch.")


_install_excepthook()  # (an uncaught Mica error ends a script with its sentence: errors.py)
