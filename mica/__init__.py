"""Mica: a compiler for training programs.

Write a model and its training step with PyTorch's verbs, trace it once with static shapes
(`mica.trace`), differentiate it ahead of time (`mica.grad`), and run it on the float64 oracle
(`mica.reference.run`) or — later stages — as compiled native code.
"""
from .amp import autocast
from .dtypes import Spec
from .dtypes import bfloat16, bool_, float16, float32, float64, int32, int64
from .errors import GradError, MicaError, ShapeError, TraceError
from .grad import grad, value_and_grad
from .tensor import Tensor
from .trace import Program, compile, trace  # noqa: A004
from .verbs import (
    abs, add, addcdiv, addcmul, amax, amin, arange, argmax, argmin, as_tensor, cat, chunk, clamp, clip,
    concat, cos, cross_entropy, detach, div, dropout, embedding, eq, erf, eye, exp, expand, flatten, full,
    full_like, ge, gelu, gt, layer_norm, le, lerp, linear, linspace, log, log_softmax, logical_and,
    logical_not, logical_or, lt, masked_fill, matmul, max, maximum, mean, min, minimum, mul, narrow, ne,
    neg, nll_loss, norm, ones, ones_like, outer, permute, pow, relu, repeat, reshape, result_type,
    rms_norm, rsqrt, scaled_dot_product_attention, sigmoid, silu, sin, softmax, split, sqrt, square,
    squeeze, stack, sub, sum, tanh, tensor, to, transpose, tril, triu, unbind, unsqueeze, var, view,
    where, zeros, zeros_like,
)
from . import distributed, nn, optim, reference  # noqa: E402

bool = bool_  # noqa: A001  (mica.bool, like torch.bool)
f32, bf16, f16, f64, i32, i64, b8 = float32, bfloat16, float16, float64, int32, int64, bool_
float, double, half, long, int = float32, float64, float16, int64, int32  # noqa: A001

__version__ = "0.1.0"


def __getattr__(name):  # (a verb torch has and Mica does not: one sentence; submodules still import)
    if name.startswith("_"):
        raise AttributeError(name)
    from .errors import missing_verb

    raise missing_verb("mica.", name, "torch.")
