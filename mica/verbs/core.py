"""Verbs for values and arithmetic, with PyTorch's names, defaults, promotion and broadcasting.

Every verb checks its operands and emits primitives (mica.ops). Python scalars are welcome
wherever PyTorch takes them; they become constants of the promoted type.
"""
import builtins
import collections
import math
import numbers
import re
import sys

import numpy as np

from .. import amp, dtypes
from ..dtypes import DType, as_dtype, category, promote
from ..errors import ShapeError, TraceError
from ..ops.elementwise import broadcast_shapes
from ..tensor import Tensor, copies, current, emit, fail, in_trace, link_view, strides_of, takes_axis, user_location

# ---- operands -----------------------------------------------------------------------------------


def is_scalar(x):
    return isinstance(x, (bool, numbers.Number, np.number, np.bool_)) and not isinstance(x, complex)


def scalar_dtype(x):
    if isinstance(x, (bool, np.bool_)):
        return dtypes.bool_
    if isinstance(x, (numbers.Integral, np.integer)):
        return dtypes.int64
    return dtypes.float32


def const(value, dtype):
    """A 0-d constant of `dtype`."""
    dtype = as_dtype(dtype)
    if dtype.kind == "float":
        value = float(value)
    elif dtype.kind == "int":
        value = int(value)
    else:
        value = bool(value)
    return emit("const", [], value=value, dtype=dtype)


def known_int(x, verb, what):
    """An integer argument torch also takes as a 0-d tensor (narrow's start): a Python or numpy int,
    a 0-d integer host tensor, or a traced constant; a computed tensor has no value while tracing."""
    if isinstance(x, (bool, np.bool_)):
        return fail(f"{verb}: {what} must be an int, got {x!r}")
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype.kind in "iu":
        return int(x)
    if isinstance(x, Tensor) and x.ndim == 0 and x.dtype.kind == "int":
        node = x.value.node
        if node.op == "const":
            return int(node.attrs["value"])
        if node.op == "literal":
            return int(np.frombuffer(node.attrs["data"], x.dtype.np_storage)[0])
        return fail(f"{verb}: {what} is a tensor computed in the trace, whose value is not known while tracing "
                    "(shapes are static); give a Python int")
    return fail(f"{verb}: {what} must be an int or a 0-d integer tensor, got {x!r:.60}")


def _calling_verb():
    """'mica.<name>' of the public verb that is running (for messages)."""
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_name.startswith("_") or f.f_code.co_name in (
            "as_tensor", "<lambda>", "<listcomp>", "<genexpr>", "<dictcomp>")):
        f = f.f_back
    return f"mica.{f.f_code.co_name}" if f is not None else "mica"


def _live_parameter(x):
    """A Parameter in a torch-style compiled step is its current value (mica/stateful.py), and so is
    an optimizer's live setting (stateful.Live: a number carrying its traced value)."""
    if type(x).__name__ == "Parameter":
        live = x._live()
        if live is not None:
            return live
    if type(x).__name__ == "Deferred":  # (x.item() inside a trace, met by a verb: its number, no gradient)
        return detach(x.tensor)
    return getattr(x, "_mica_tensor", x)


def as_tensor(x, dtype=None, verb=None):
    """A Tensor from a Tensor, a Python scalar or a numpy array (a literal constant)."""
    x = _live_parameter(x)
    if isinstance(x, Tensor):
        return x if dtype is None or x.dtype is as_dtype(dtype) else to(x, dtype)
    verb = verb or _calling_verb()
    current(verb)
    if is_scalar(x):
        return const(x, dtype or scalar_dtype(x))
    if isinstance(x, np.ndarray) and x.dtype.kind == "c" or hasattr(x, "_mica_complex"):
        raise TraceError(f"{verb} takes real tensors, and this one is complex; a complex tensor takes + - * /, "
                         "conj, abs, exp, sum, mean, .real, .imag and the shape methods, and torch.view_as_real(c) "
                         "gives its real pairs for the rest", user_location())
    if isinstance(x, (np.ndarray, list, tuple)):
        return tensor(x, dtype=dtype)
    raise _not_an_operand(verb, x)


def _not_an_operand(verb, x):
    """The sentence for a value a verb cannot take, with what to do for the usual ones."""
    kind, hint = type(x).__name__, ""
    if kind == "Parameter":  # (a module called on its own, its parameters never bound)
        hint = (" (a module's Parameter: call the model through mica.nn.functional_call(model, params, ...), or "
                "inside `with model.bind(params):`, in the trace)")
    elif type(x).__module__.startswith("torch"):
        kind, hint = f"torch.{kind}", " (pass it in as an input, or as a constant: mica.tensor(t.numpy()))"
    elif hasattr(x, "__array__"):
        hint = " (a numpy array becomes a constant Tensor with mica.tensor(array))"
    return TraceError(f"{verb} cannot take a {kind} ({_short_repr(x)}); pass a traced Tensor or a number{hint}",
                      user_location())


def canon_dim(dim, ndim, verb):
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TraceError(f"{verb}: dim must be an int, got {dim!r}", user_location())
    n = builtins.max(ndim, 1)
    if not -n <= dim < n:
        fail(f"{verb}: dim {dim} is out of range; give one in [{-n}, {n - 1}]")
    return int(dim) % n


def check_dims(dim, ndim, verb):
    """Each dim of `dim` (None, an int, or a tuple of ints) in range, or canon_dim's sentence: for
    the verbs that return a 0-d tensor as it is, which torch still asks for a dim in [-1, 0]."""
    for d in () if dim is None else dim if isinstance(dim, (tuple, list)) else (dim,):
        canon_dim(d, ndim, verb)


def needs_a_dim(x, verb):
    """torch's refusal of a 0-d tensor where a verb cuts one of its dims (narrow, split, chunk, unbind)."""
    if x.ndim == 0:
        fail(f"{verb}: a 0-d tensor has no dim to cut; give a tensor of at least one dim (x.reshape(1), say)")


def result_type(*operands):
    """PyTorch's promotion: dimensioned tensors outrank 0-d tensors, which outrank Python numbers,
    except that a higher category (bool < int < float) always wins."""
    return promotion([(x.ndim, x.dtype) if isinstance(x, Tensor) else (None, scalar_dtype(x))
                      for x in operands if isinstance(x, Tensor) or is_scalar(x)])


def promotion(operands):
    """result_type over [(ndim, dtype)], ndim None for a Python number (an eager array's too)."""
    dim_t = zero_t = wrapped_t = None

    def merge(cur, dt):
        return dt if cur is None else promote(cur, dt)

    for ndim, dtype in operands:
        if ndim is None:
            wrapped_t = merge(wrapped_t, dtype)
        elif ndim:
            dim_t = merge(dim_t, dtype)
        else:
            zero_t = merge(zero_t, dtype)

    def combine(higher, lower):
        if higher is None:
            return lower
        if lower is None or higher.kind == "float":
            return higher
        if higher is dtypes.bool_ or lower.kind == "float":
            return promote(higher, lower)
        return higher

    return combine(dim_t, combine(zero_t, wrapped_t))


def _short_repr(x, most=60):
    """repr(x) whole, or cut at `most` characters with an ellipsis (never an unclosed bracket alone)."""
    text = " ".join(repr(x).split())
    return text if len(text) <= most else text[:most - 1] + "…"


def _binary(op, a, b, compute=None, out_kinds=None):
    verb = op
    a, b = _live_parameter(a), _live_parameter(b)
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        current(verb)
        raise TraceError(f"{verb} needs at least one Tensor operand", user_location())
    from ..host import HostTensor

    for x in (a, b):
        if not isinstance(x, (Tensor, HostTensor)) and not is_scalar(x):
            raise _not_an_operand(verb, x)
    dt = compute or result_type(a, b)
    if dt in dtypes.HALF and (op in ("mul", "div") and _scalar_operand(b) or op == "mul" and is_scalar(a)):
        wide = dtypes.float32  # (x * s, x / s and s * x beside a half tensor: s kept in float32, the result
        return to(emit(op, [as_tensor(a, wide), as_tensor(b, wide)]), dt)  # rounded once, as torch's opmath)
    return emit(op, [as_tensor(a, dt), as_tensor(b, dt)])  # (x + s, s - x, t * x: s rounded to x's type first)


def _scalar_operand(x):
    """A Python number or a 0-d tensor: the second operand torch's CPU mul and div kernels read as
    a scalar in their opmath type (float32 for a half tensor: bf16 x * lr with a traced lr is not lr
    rounded to bf16 first). Measured against torch 2.13: add and sub round any scalar to the half
    type first, and so does mul with a 0-d tensor as its first operand; s * x with a Python s is
    x * s."""
    return is_scalar(x) or (isinstance(x, (Tensor, np.ndarray)) and x.ndim == 0)


def _floating(dt):
    return dt if dt.kind == "float" else dtypes.DEFAULT_FLOAT


# ---- arithmetic -----------------------------------------------------------------------------------

def _integral_alpha(verb, input, other, alpha):
    """torch's refusal of a float alpha where add/sub's result is an integer or bool one."""
    if isinstance(alpha, (float, np.floating)) and result_type(input, other).kind != "float":
        fail(f"{verb}: alpha={alpha!r} is a float but the result is {result_type(input, other).name}; an integer or bool "
             "sum takes an integer alpha (as torch's), or convert a tensor with .float() first")


def _scaled(input, other, alpha):
    """alpha * other in the promoted type of (input, other), as PyTorch's add/sub(alpha=) compute it."""
    if is_scalar(alpha) and alpha == 1:
        return other
    dt = result_type(input, other)
    if dt is dtypes.bool_ and is_scalar(alpha):  # (in bool, as torch's: other and alpha)
        return as_tensor(other, dt) if alpha else zeros_like(as_tensor(other, dt))
    return mul(as_tensor(other, dt), alpha)


def _alpha_once(verb, input, other, alpha):
    """input +- alpha * other for a half result with alpha not 1: alpha in the half type, the rest in
    float32, rounded once (torch's kernel)."""
    dt = result_type(input, other)
    wide = dtypes.float32
    alpha = to(as_tensor(alpha, dt), wide) if is_scalar(alpha) else as_tensor(alpha, wide)
    # (a number, or a float32 or float64 0-d tensor beside a half one, is rounded to the half type first, as torch's)
    input, other = (to(as_tensor(t, dt), wide) for t in (input, other))
    return to(verb(input, mul(other, alpha)), dt)


def _fused_alpha(input, other, alpha):
    """input + alpha * other for float32 tensors with alpha not 1: one fused multiply-add, as torch's
    vectorized add kernel (a plain product and sum was 1 ulp off in 9% of elements; Adam's L2 decay
    and SGD's momentum read it); else None."""
    if is_scalar(alpha) and alpha == 1 or not isinstance(input, Tensor) or not isinstance(other, Tensor) \
            or result_type(input, other) is not dtypes.float32:
        return None
    return fma32(other, as_tensor(alpha, dtypes.float32), input)


def add(input, other, alpha=1):
    _integral_alpha("add", input, other, alpha)
    if not (is_scalar(alpha) and alpha == 1) and result_type(input, other) in dtypes.HALF:
        return _alpha_once(add, input, other, alpha)
    fused = _fused_alpha(input, other, alpha)
    if fused is not None:
        return fused
    other = _scaled(input, other, alpha)
    if isinstance(input, (Tensor, bool)) and result_type(input, other) is dtypes.bool_:  # (torch's: either true,
        return logical_or(input, other)                                                 # a bool of 0 or 1)
    return _binary("add", input, other)


def sub(input, other, alpha=1):
    _integral_alpha("sub", input, other, alpha)
    if not (is_scalar(alpha) and alpha == 1) and result_type(input, other) in dtypes.HALF:
        return _alpha_once(sub, input, other, alpha)
    if builtins.any(isinstance(t, Tensor) and t.dtype is dtypes.bool_ for t in (input, other)):
        fail("sub: subtraction with a bool tensor is not defined (torch refuses it too); use logical_xor, "
             "logical_not (~) for 1 - mask, or convert it first (.float(), .long())")
    fused = _fused_alpha(input, other, -alpha if is_scalar(alpha) else neg(as_tensor(alpha)))
    if fused is not None:
        return fused
    other = _scaled(input, other, alpha)
    return _binary("sub", input, other)


def mul(input, other):
    return _binary("mul", input, other)


def div(input, other, rounding_mode=None):
    if rounding_mode is not None:
        return _div_rounded(input, other, rounding_mode)
    return _binary("div", input, other, compute=_floating(result_type(input, other)))


true_divide = divide = div
multiply = mul
subtract = sub


def pow(input, exponent):
    input, exponent = amp.float32("pow", input, exponent)
    dt = result_type(input, exponent)
    if isinstance(input, Tensor) and is_scalar(exponent) and exponent == 2 and dt is input.dtype:
        return mul(input, input)  # (not an integer tensor ** 2.0: torch's result is a float)
    if isinstance(input, Tensor) and is_scalar(exponent) and dt.kind == "float" and dt is input.dtype and \
            exponent in (0.5, -0.5, 3, -1) and not isinstance(exponent, bool):  # (torch's own forms of these
        x = input                                                      # powers: sqrt(-inf) is NaN, pow's inf)
        return {0.5: lambda: sqrt(x), -0.5: lambda: rsqrt(x), 3: lambda: mul(mul(x, x), x),
                -1: lambda: div(1.0, x)}[exponent]()
    if dt is dtypes.bool_ and is_scalar(exponent):  # (torch's: x ** True is x, x ** False is True)
        return logical_or(input, not exponent)
    if dt.kind == "int":  # (torch's: an integer result, by products; the pow primitive is float's)
        if not is_scalar(exponent):
            return _integer_powers(as_tensor(input, dt), as_tensor(exponent, dt), dt)
        if exponent < 0:
            fail(f"pow: integers cannot be raised to a negative integer power ({exponent}), as in torch; cast the "
                 "base with .float() first")
        return _integer_power(as_tensor(input, dt), int(exponent))
    return _binary("pow", input, exponent, compute=_floating(dt))


def _integer_powers(x, n, dt):
    """x ** n for integer tensors n (x broadcast with them): repeated squaring over n's bits,
    wrapping as torch's; a negative power is 1 for x == 1, -1 or 1 for x == -1 (n odd or even) and
    0 for any other x, as torch's integer pow gives."""
    x, n = where(ge(n, 0), x, x), where(ge(x, 0), n, n)  # (both of the broadcast shape)
    result, base = full_like(x, 1), x
    for b in range(8 * dt.itemsize - 1):  # (the bits a power >= 0 can set)
        result = where(ne(bitwise_and(n, 1 << b), 0), mul(result, base), result)
        base = mul(base, base)
    odd = ne(bitwise_and(n, 1), 0)
    negative = where(eq(x, 1), const(1, dt), where(eq(x, -1), where(odd, const(-1, dt), const(1, dt)), const(0, dt)))
    return where(lt(n, 0), negative, result)


def _integer_power(x, n):
    """x ** n for integers by repeated squaring (wrapping on overflow, as torch's does)."""
    if n == 0:
        return full_like(x, 1)
    result = None
    while n:
        if n & 1:
            result = x if result is None else mul(result, x)
        n >>= 1
        if n:
            x = mul(x, x)
    return result


def maximum(input, other):
    if result_type(input, other) is dtypes.bool_:  # (torch's on bools: either one true)
        return logical_or(input, other)
    return _binary("maximum", input, other)


def minimum(input, other):
    if result_type(input, other) is dtypes.bool_:  # (torch's on bools: both true)
        return logical_and(input, other)
    return _binary("minimum", input, other)


def square(input):
    x = as_tensor(input)
    return mul(x, x) if x.dtype is not dtypes.bool_ else pow(x, 2)  # (torch's: a bool's square is int64)


def _compare(op):
    def verb(input, other):
        return _binary(op, input, other)
    verb.__name__ = op
    return verb


lt, le, gt, ge, eq, ne = (_compare(o) for o in ("lt", "le", "gt", "ge", "eq", "ne"))
less, less_equal, greater, greater_equal, equal, not_equal = lt, le, gt, ge, eq, ne


def logical_and(input, other):
    return _binary("logical_and", input, other, compute=dtypes.bool_)


def logical_or(input, other):
    return _binary("logical_or", input, other, compute=dtypes.bool_)


def logical_not(input):
    return emit("logical_not", [to(as_tensor(input), dtypes.bool_)])


def logical_xor(input, other):
    return ne(to(as_tensor(input), dtypes.bool_), to(as_tensor(other), dtypes.bool_))


def _bitwise(verb, op, logical, *operands):
    """torch's ~, &, | and ^: logical on bool tensors, bit by bit on integers (bools and Python ints
    beside them promoted as torch's); floats are refused, as torch refuses them."""
    if builtins.all(isinstance(x, Tensor) and x.dtype is dtypes.bool_ or isinstance(x, (bool, np.bool_)) for x in operands):
        return logical(*(as_tensor(x) for x in operands))
    if not builtins.any(isinstance(x, Tensor) for x in operands):
        current(verb)
        raise TraceError(f"{verb} needs at least one Tensor operand", user_location())
    dt = result_type(*operands)
    if dt.kind != "int":
        fail(f"{verb} works on integer and bool tensors, got {dt.name}; floats have no bitwise operations in torch")
    return emit(op, [as_tensor(x, dt) for x in operands])


def bitwise_not(input):
    return _bitwise("bitwise_not (~)", "bitwise_not", logical_not, input)


def bitwise_and(input, other):
    return _bitwise("bitwise_and (&)", "bitwise_and", logical_and, input, other)


def bitwise_or(input, other):
    return _bitwise("bitwise_or (|)", "bitwise_or", logical_or, input, other)


def bitwise_xor(input, other):
    return _bitwise("bitwise_xor (^)", "bitwise_xor", logical_xor, input, other)


def _shift_operands(verb, input, other):
    """A shift's operands in their promoted integer type, as torch's: a bool beside a Python int is an
    int64; floats (and two bools) have no shifts."""
    if not builtins.any(isinstance(x, Tensor) for x in (input, other)):
        current(verb)
        raise TraceError(f"{verb} needs at least one Tensor operand", user_location())
    dt = result_type(input, other)
    if dt.kind != "int":
        fail(f"{verb} works on integer tensors, got {dt.name}; cast with .long() first (torch refuses it too)")
    if is_scalar(other):  # (a Python int wraps into the type first, as torch casts it)
        other = int(np.array(int(other)).astype(np.int64).astype(dt.np_storage))
    return as_tensor(input, dt), other, dt, 8 * dt.itemsize


def _wrapped_power(n, dt):
    """2 ** n as dt holds it (2 ** 63 wraps to int64's least value, as x * 2 ** 63 wraps)."""
    return int(np.array(1 << n, dtype=np.uint64).astype(dt.np_storage))


def _power_of_two(s, dt, bits):
    """2 ** s for shift counts s (a tensor, each in [0, bits - 1]) in dt's wrapping arithmetic: the
    product of 2 ** (2 ** b) over s's set bits b."""
    p = full_like(s, 1)
    for b in range(bits.bit_length() - 1):
        p = where(ne(bitwise_and(s, 1 << b), 0), mul(p, const(_wrapped_power(1 << b, dt), dt)), p)
    return p


def bitwise_left_shift(input, other):
    """torch's <<: x * 2 ** n wrapping in the integer type; a count below 0 or at least the type's
    bits gives 0, as torch's does."""
    x, n, dt, bits = _shift_operands("bitwise_left_shift (<<)", input, other)
    if is_scalar(n):
        return zeros_like(x) if n < 0 or n >= bits else mul(x, const(_wrapped_power(n, dt), dt))
    n = as_tensor(n, dt)
    shifted = mul(x, _power_of_two(clamp(n, 0, bits - 1), dt, bits))
    return where(logical_or(lt(n, 0), ge(n, bits)), const(0, dt), shifted)


def bitwise_right_shift(input, other):
    """torch's >>: arithmetic (x // 2 ** n, rounding down); a count below 0 or at least the type's
    bits less one fills with the sign, as torch's does."""
    x, n, dt, bits = _shift_operands("bitwise_right_shift (>>)", input, other)
    if is_scalar(n) and 0 <= n < bits - 1:
        return x if n == 0 else _int_quotient(x, const(1 << n, dt), "floor")
    sign = where(lt(x, 0), const(-1, dt), const(0, dt))
    if is_scalar(n):
        return sign
    n = as_tensor(n, dt)
    quotient = _int_quotient(x, _power_of_two(clamp(n, 0, bits - 2), dt, bits), "floor")
    return where(logical_or(lt(n, 0), ge(n, bits - 1)), sign, quotient)


def _unary(op, floating=True):
    def verb(input):
        x = _operand(op, input)
        if floating and x.dtype.kind != "float":
            x = to(x, dtypes.DEFAULT_FLOAT)
        (x,) = amp.float32(op, x)
        return emit(op, [x])
    verb.__name__ = op
    return verb


def _operand(verb, x):
    """A unary verb's input: a traced Tensor, or a host tensor (a constant of the trace, as a global
    running mean read in a compiled step); torch takes no number there."""
    if isinstance(x, Tensor) or type(x).__name__ == "HostTensor":
        return as_tensor(x, verb=verb)
    _need_tensor(verb, x)


def _need_tensor(verb, x):
    current(verb)
    raise TraceError(f"{verb} takes a Tensor, got {type(x).__name__} ({x!r:.60})", user_location())


exp, log, tanh, sqrt, rsqrt, sin, cos, erf, sigmoid = (
    _unary(o) for o in ("exp", "log", "tanh", "sqrt", "rsqrt", "sin", "cos", "erf", "sigmoid"))
neg = _unary("neg", floating=False)
abs = _unary("abs", floating=False)
negative = neg


def _rounding(op):
    def verb(input, **named):
        x = _operand(op, input)
        if x.dtype.kind != "float":  # (an integer is its own floor, as torch's)
            return emit("add", [x, const(0, x.dtype)]) if x.dtype.kind == "int" else fail(
                f"{op} takes a number tensor, got {x.value.spec!r}")
        return emit(op, [x])
    verb.__name__ = op
    return verb


floor, ceil, trunc = (_rounding(o) for o in ("floor", "ceil", "trunc"))
fix = trunc
_round_half_even = _rounding("round")


def round(input, decimals=0):  # noqa: A001  (torch.round: half to even; decimals as torch's, x * 10**d rounded)
    if not isinstance(decimals, (int, np.integer)) or isinstance(decimals, bool):
        fail(f"round: decimals must be an int, got {decimals!r}")
    if type(input).__name__ == "HostTensor":  # (a host tensor in a trace: its constant)
        input = as_tensor(input, verb="round")
    if isinstance(input, Tensor) and input.dtype.kind != "float" and decimals != 0:
        fail("round: decimals is for floating tensors (torch does not round integers to decimals); cast with .float()")
    if decimals == 0 or not (isinstance(input, Tensor) and input.dtype.kind == "float"):
        return _round_half_even(input)
    scale = 10.0 ** builtins.abs(int(decimals))
    if decimals > 0:
        return div(_round_half_even(mul(input, scale)), scale)
    return mul(_round_half_even(div(input, scale)), scale)


def frac(input):
    return sub(input, trunc(input))


def sign(input):
    x = as_tensor(input)
    if x.dtype is dtypes.bool_:
        return x
    one = const(1, x.dtype)
    return where(gt(x, 0), one, where(lt(x, 0), neg(one), const(0, x.dtype)))  # (NaN's: 0, as torch's)


def sgn(input):
    return sign(input)


# ---- tests of values --------------------------------------------------------------------------------

def isnan(input):
    x = as_tensor(input)
    return ne(x, x) if x.dtype.kind == "float" else full_like(x, False, dtype=dtypes.bool_)


def isinf(input):
    x = as_tensor(input)
    return eq(abs(x), math.inf) if x.dtype.kind == "float" else full_like(x, False, dtype=dtypes.bool_)


def isfinite(input):
    x = as_tensor(input)
    return logical_and(eq(x, x), ne(abs(x), math.inf)) if x.dtype.kind == "float" else \
        full_like(x, True, dtype=dtypes.bool_)


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    a, b = as_tensor(input), as_tensor(other)
    dt = result_type(a, b)
    a, b = to(a, dt), to(b, dt)
    if dt.kind != "float":
        return eq(a, b)
    finite = logical_and(isfinite(a), isfinite(b))  # (an infinity is close to itself only, as torch's)
    close = logical_or(eq(a, b), logical_and(finite, le(abs(sub(a, b)), add(mul(abs(b), rtol), atol))))
    return logical_or(close, logical_and(isnan(a), isnan(b))) if equal_nan else close


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """Whether every element is close, as torch's: a 0-d bool tensor (a Python bool's truth)."""
    return all(isclose(input, other, rtol, atol, equal_nan))


def equal(input, other):
    a, b = as_tensor(input), as_tensor(other)
    if a.shape != b.shape:
        return const(False, dtypes.bool_)
    return all(eq(a, b))


def is_tensor(obj):
    from ..host import HostTensor

    return isinstance(obj, (Tensor, HostTensor))


def is_floating_point(input):
    return as_tensor(input).dtype.kind == "float"


# ---- division with rounding, and remainders (torch's formulas, element by element) ----------------

def _int_quotient(a, b, mode):
    """a / b rounded toward zero or down, for integers: through float64, which is exact while
    |a| < 2**53; beyond, the quotient is off by up to |a| / 2**52, so the remainder it leaves (small
    beside a) is divided again, in float64, to correct it; then corrected by one where the remainder
    says so, so the result is exact for every int64. A zero divisor gives 0 (torch raises)."""
    dt = a.dtype
    safe_b = where(eq(b, 0), const(1, dt), b)
    wide_b = to(safe_b, dtypes.float64)
    q = to(trunc(div(to(a, dtypes.float64), wide_b)), dt)
    if dt.itemsize * 8 > 53:  # (int32 is exact in float64 already)
        q = add(q, to(trunc(div(to(sub(a, mul(q, safe_b)), dtypes.float64), wide_b)), dt))
    r = sub(a, mul(q, safe_b))
    # truncation: the remainder has a's sign and |r| < |b|
    too_far = logical_and(ne(r, 0), ne(lt(r, 0), lt(a, 0)))  # (q one too large in magnitude)
    q = where(too_far, where(eq(lt(a, 0), lt(safe_b, 0)), sub(q, 1), add(q, 1)), q)
    r = sub(a, mul(q, safe_b))
    # (q one too small in magnitude: |r| >= |b|, as -|r| <= -|b|, which holds the type's least value)
    short = le(where(lt(r, 0), r, neg(r)), where(lt(safe_b, 0), safe_b, neg(safe_b)))
    q = where(short, where(eq(lt(a, 0), lt(safe_b, 0)), add(q, 1), sub(q, 1)), q)
    if mode == "floor":
        r = sub(a, mul(q, safe_b))
        q = where(logical_and(ne(r, 0), ne(lt(r, 0), lt(safe_b, 0))), sub(q, 1), q)
    return where(eq(b, 0), const(0, dt), q)


def _operands(verb, a, b):
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        current(verb)
        raise TraceError(f"{verb} needs at least one Tensor operand", user_location())
    dt = result_type(a, b)
    if dt is dtypes.bool_:
        fail(f"{verb}: bool tensors have no division; cast them with .long() or .float() first")
    return as_tensor(a, dt), as_tensor(b, dt)


def _floor_quotient(a, b):
    """torch's floor division of floats: (a - fmod(a, b)) / b, corrected down by one where the
    remainder's sign is not b's, then the nearest integer; a / b where b is 0."""
    mod = emit("fmod", [a, b])
    q = (a - mod) / b
    q = where(logical_and(ne(mod, 0), ne(lt(b, 0), lt(mod, 0))), q - 1, q)
    fq = floor(q)
    q = where(ne(q, 0), fq + where(gt(q - fq, 0.5), 1.0, 0.0).to(q.dtype), mul(const(0.0, q.dtype), a / b))
    return where(eq(b, 0), a / b, q)


def _div_rounded(input, other, rounding_mode):
    if rounding_mode not in ("trunc", "floor"):
        fail(f"div: rounding_mode is None, 'trunc' or 'floor', got {rounding_mode!r}")
    a, b = _operands("div", input, other)
    if a.dtype.kind == "int":
        return _int_quotient(a, b, rounding_mode)
    a, b = amp.float32("div", detach(a), detach(b))  # (a rounded quotient's gradient is 0, as torch's)
    return trunc(a / b) if rounding_mode == "trunc" else _floor_quotient(a, b)


def floor_divide(input, other):
    return _div_rounded(input, other, "floor")


def fmod(input, other):
    a, b = _operands("fmod", input, other)
    if a.dtype.kind == "int":  # (a zero divisor: 0, as its quotient's)
        return where(eq(b, 0), const(0, a.dtype), sub(a, mul(_int_quotient(a, b, "trunc"), b)))
    a, b = amp.float32("fmod", a, b)
    return emit("fmod", [a, b])


def remainder(input, other):
    """torch's: the remainder with the divisor's sign (Python's %)."""
    a, b = _operands("remainder", input, other)
    if a.dtype.kind == "int":  # (a zero divisor: 0, as its quotient's)
        return where(eq(b, 0), const(0, a.dtype), sub(a, mul(_int_quotient(a, b, "floor"), b)))
    a, b = amp.float32("remainder", a, b)
    mod = emit("fmod", [a, b])
    return where(logical_and(ne(mod, 0), ne(lt(b, 0), lt(mod, 0))), mod + b, mod)


def rounded_once(x, body):
    """body(x) for a floating x; for a half-type x computed in float32 and rounded once to x's type,
    as torch's kernels compute the half types (in float32, their opmath type): a verb made of several
    primitives would otherwise round after each (silu's sigmoid, then its product)."""
    if x.dtype in dtypes.HALF:
        return to(body(to(x, dtypes.float32)), x.dtype)
    return body(x)


def _floating_input(verb, input):
    """A floating tensor, or the sentence torch's kernel (float types only) gives an integer one."""
    x = as_tensor(input)
    if x.dtype.kind != "float":
        fail(f"{verb} takes a floating tensor, got {x.dtype.name} (as torch's); convert it with .float() first")
    return x


def written(input, result, inplace):
    """inplace=True of torch's activations and dropouts: the result is written into the input,
    which is what torch returns (a caller reading the input afterwards sees the new values)."""
    return input._into(result) if inplace and isinstance(input, Tensor) else result


def relu(input, inplace=False):
    return written(input, emit("relu", [as_tensor(input)]), inplace)


def silu(input, inplace=False):
    x = _floating_input("silu", input)
    return written(input, rounded_once(x, lambda v: v * sigmoid(v)), inplace)


def gelu(input, approximate="none"):
    """GELU with the exact erf form (default) or the tanh approximation, as torch.nn.functional.gelu."""
    if approximate not in ("none", "tanh"):
        raise TraceError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}", user_location())
    x = _floating_input("gelu", input)
    return emit("gelu", [x], approximate=approximate)


def fits(verb, value, dtype):
    """A Python integer given as a value of an integer type (a fill, a bound, where's other) that
    the type cannot hold is a sentence, as torch refuses it (its arithmetic wraps such a number;
    its fills do not)."""
    if dtype.kind == "int" and isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        info = np.iinfo(dtype.np_storage)
        if not info.min <= int(value) <= info.max:
            from ..errors import MicaError

            raise MicaError(f"{verb}: {value} does not fit {dtype.name} (from {info.min} to {info.max}), as torch "
                            "refuses; give a value in that range, or cast the tensor with .long() first",
                            user_location())
    return value


def clamp(input, min=None, max=None):
    x = as_tensor(input)
    if min is None and max is None:
        fail("clamp: give at least one of min and max")
    dt = result_type(x, *(b for b in (min, max) if b is not None))  # (an integer tensor and 2.5: float, as torch's)
    x = x if dt is x.dtype else to(x, dt)
    for bound in (min, max):
        fits("clamp", bound, x.dtype)
    out = x
    for bound, past in ((min, lt), (max, gt)):  # (a NaN in a tensor bound gives NaN, as torch's)
        if bound is None:
            continue
        if isinstance(bound, (float, np.floating)) and np.isnan(bound):  # (a NaN bound: NaN everywhere, as torch's)
            out = full_like(out, bound)
            continue
        if is_scalar(bound):
            out = where(past(out, bound), as_tensor(bound, x.dtype), out)
        else:
            out = where(logical_or(past(out, bound), isnan(bound)) if x.dtype.kind == "float" else past(out, bound),
                        bound, out)
    return out


clip = clamp


def clamp_min(input, min):
    return clamp(input, min=min)


def clamp_max(input, max):
    return clamp(input, max=max)


def fma32(a, b, c):
    """float32 a * b + c rounded once, as a CPU kernel's vector fmadd: the float32 product is exact
    in float64, so only the sum rounds (and then to float32; the double rounding this adds changes
    a result about once in 2**29)."""
    f64 = dtypes.float64
    return to(add(mul(to(as_tensor(a), f64), to(as_tensor(b), f64)), to(as_tensor(c), f64)), dtypes.float32)


def lerp(input, end, weight):
    """start + weight * (end - start), evaluated as PyTorch does for accuracy near weight = 1 (in a
    half type computed in float32 and rounded once, as torch's kernel); in float32 (and a half
    type's float32) with the fused multiply-add torch's vectorized kernel uses: start + w d for
    |w| < 0.5, else end + (w - 1) d, each rounded once."""
    dt = result_type(input, end)
    if dt in dtypes.HALF:
        wide = dtypes.float32
        return to(lerp(as_tensor(input, wide), as_tensor(end, wide),
                       weight if is_scalar(weight) else as_tensor(weight, wide)), dt)
    if dt is dtypes.float32:
        input, end = as_tensor(input, dt), as_tensor(end, dt)
        diff = sub(end, input)
        if is_scalar(weight):
            w = np.float32(weight)
            return fma32(const(w, dt), diff, input) if builtins.abs(w) < 0.5 else \
                fma32(const(w - np.float32(1), dt), diff, end)
        w = as_tensor(weight, dt)
        return where(lt(abs(w), 0.5), fma32(w, diff, input), fma32(sub(w, 1.0), diff, end))
    diff = sub(end, input)
    if is_scalar(weight):
        if builtins.abs(weight) < 0.5:
            return add(input, mul(weight, diff))
        return sub(end, mul(diff, 1 - weight))
    return where(lt(abs(weight), 0.5), add(input, mul(weight, diff)), sub(end, mul(diff, sub(1, weight))))


def _addc(combine, input, tensor1, tensor2, value):
    """input + value * combine(tensor1, tensor2) in the operands' common type (a float32 input with
    half operands: float32 throughout), a half type's computed in float32 and rounded once, as
    torch's kernels."""
    dt = result_type(input, tensor1, tensor2)
    if dt.kind == "float" and dt in dtypes.HALF:
        wide = dtypes.float32
        return to(_addc(combine, *(as_tensor(t, wide) for t in (input, tensor1, tensor2)), value), dt)
    if combine is div and dt.kind != "float":
        fail(f"addcdiv: integer division is not supported (torch refuses it too); give floating tensors (.float()) or "
             f"write input + value * torch.div(tensor1, tensor2, rounding_mode='trunc')")
    if dt is dtypes.bool_:
        fail("addcmul of bool tensors is not defined (torch refuses it too); convert them first (.long(), .float())")
    if dt.kind == "int" and is_scalar(value):  # (in the integer type: a float value truncated, as torch's)
        value = int(value)
    input, tensor1, tensor2 = (as_tensor(t, dt) for t in (input, tensor1, tensor2))  # (a bool and an int32: int32)
    if combine is mul and dt is dtypes.float32:  # (torch's vectorized addcmul: fmadd(value * t1, t2, input))
        return fma32(mul(value, tensor1), tensor2, input)
    return add(input, combine(mul(value, tensor1), tensor2))


def addcmul(input, tensor1, tensor2, value=1):
    return _addc(mul, input, tensor1, tensor2, value)


def addcdiv(input, tensor1, tensor2, value=1):
    return _addc(div, input, tensor1, tensor2, value)


def where(condition, input=None, other=None):
    if input is None and other is None:
        fail("where(condition) with one argument is torch.nonzero, whose shape depends on the data; Mica's shapes "
             "are static: write where(condition, input, other)")
    if input is None or other is None:
        fail("where: give both input and other, where(condition, input, other)")
    c = as_tensor(condition)
    if c.dtype is not dtypes.bool_:
        fail(f"where: the condition must be a bool tensor, got {c.dtype.name}")
    dt = result_type(input, other)
    for value in (input, other):
        fits("where", value, dt)
    return emit("where", [c, as_tensor(input, dt), as_tensor(other, dt)])


def masked_fill(input, mask, value):
    m = as_tensor(mask)
    if m.dtype is not dtypes.bool_:
        fail(f"masked_fill: the mask must be a bool tensor, got {m.dtype.name} (make one with != 0 or .bool())")
    x = as_tensor(input)
    try:
        np.broadcast_shapes(m.shape, x.shape)
    except ValueError:
        fail(f"masked_fill: the mask's shape {list(m.shape)} does not broadcast to the tensor's {list(x.shape)}")
    shape = () if is_scalar(value) else tuple(value.shape) if hasattr(value, "shape") else np.shape(value)
    if shape:  # (torch's: a number or a 0-d tensor)
        fail(f"masked_fill: the value must be a number or a 0-d tensor, got one of shape {list(shape)}; "
             "to fill from a tensor, use where(mask, values, input)")
    fits("masked_fill", value, x.dtype)
    return where(mask, as_tensor(value, input.dtype) if is_scalar(value) else to(value, input.dtype), input)


def detach(input):
    x = as_tensor(input)
    out = emit("detach", [x])  # (torch's detach shares the tensor's memory: an in-place step reaches both,
    return link_view(x, out, detach, lambda v, b: emit("data_update", [b, v]),  # the tensor keeping its history)
                     strides_of(x))


_DEVICE = re.compile(r"(cpu|cuda|mps|xpu|meta|hip|xla|hpu|mtia|privateuseone)(:\d+)?")


def _device_name(name):
    """`name`, a device's as Tensor.to takes it (which Mica ignores: the target is lower()'s), or a sentence."""
    if _DEVICE.fullmatch(name):
        return
    try:
        meant = as_dtype(name)
    except Exception:
        meant = None
    if meant is not None:
        raise TraceError(f"to: a string is a device in Tensor.to, as in PyTorch, not an element type; write "
                         f".to(mica.{meant.name}) or .to(dtype=mica.{meant.name})", user_location())
    raise TraceError(f"to: {name!r} is not a device PyTorch knows (a device is ignored by Mica: the target is "
                     "lower()'s); pass an element type such as mica.float32", user_location())


def to(input, *args, dtype=None, **kwargs):
    """Cast to an element type; device names and copy/non_blocking flags are accepted and ignored."""
    for a in args:
        if isinstance(a, Tensor):
            dtype = a.dtype
        elif isinstance(a, (DType, np.dtype)) or (a is not None and str(a).startswith("torch.")) or (
                isinstance(a, type) and issubclass(a, np.generic)):  # (an eager tensor's dtype is numpy's)
            dtype = a
        elif isinstance(a, str):
            _device_name(a)
        elif not isinstance(a, bool):
            raise TraceError(f"to: cannot interpret {a!r}; pass an element type such as mica.float32",
                             user_location())
    if dtype is None:
        return input
    dtype = as_dtype(dtype)
    x = as_tensor(input)
    if x.dtype is dtype:
        return x
    return emit("cast", [x], dtype=dtype)


# ---- reductions -------------------------------------------------------------------------------------

def _axes(x, dim, verb):
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):  # (torch's: no dims, every dim)
        return tuple(range(x.ndim))
    dims = [canon_dim(d, x.ndim, verb) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))]
    if len(set(dims)) != len(dims):
        fail(f"{verb}: dims {list(dim)} name a dim twice; name each once")
    if x.ndim == 0:
        return ()
    return tuple(sorted(dims))


def sum(input, dim=None, keepdim=False, dtype=None):
    x = as_tensor(input)
    if dtype is not None:
        x = to(x, dtype)
    elif x.dtype.kind != "float":
        x = to(x, dtypes.int64)
    else:
        (x,) = amp.float32("sum", x)
    axes = _axes(x, dim, "sum")
    if not axes:
        return Tensor(x.value, x._ctx)  # (a handle of its own, as torch's result is a new tensor)
    return emit("sum", [x], axes=axes, keepdim=bool(keepdim))


def _floating_operand(verb, input, dtype):
    """A mean's operand: in `dtype` where given; an integer one is a sentence, as torch's."""
    x = as_tensor(input)
    if dtype is not None:
        x = to(x, dtype)
    if x.dtype.kind != "float":
        fail(f"{verb}: needs a floating tensor, got {x.dtype.name}; cast with .float() first")
    return x


def mean(input, dim=None, keepdim=False, dtype=None):
    x = _floating_operand("mean", input, dtype)
    axes = _axes(x, dim, "mean")
    count = math.prod(x.shape[a] for a in axes)
    if not axes:
        return Tensor(x.value, x._ctx)
    with amp.autocast(enabled=False):  # (mean is not on autocast's float32 list, though sum is)
        return rounded_once(x, lambda v: sum(v, axes, keepdim) / count)  # (a half type's: rounded once, as torch's)


MaxResult = collections.namedtuple("max", ["values", "indices"])
MinResult = collections.namedtuple("min", ["values", "indices"])


def amax(input, dim=(), keepdim=False):
    x = as_tensor(input)
    axes = _axes(x, dim, "amax")
    if not axes:
        return Tensor(x.value, x._ctx)
    return emit("max", [x], axes=axes, keepdim=bool(keepdim))


def amin(input, dim=(), keepdim=False):
    x = as_tensor(input)
    if x.dtype is dtypes.bool_:
        return logical_not(amax(logical_not(x), dim, keepdim))
    return neg(amax(neg(x), dim, keepdim))


def any(input, dim=None, keepdim=False):  # noqa: A001
    """Whether any element (along dim) is nonzero: bool, as torch's."""
    x = as_tensor(input)
    b = x if x.dtype is dtypes.bool_ else ne(x, 0)
    if not b.ndim:
        check_dims(dim, 0, "any")
        return b
    return gt(sum(to(b, dtypes.int64), dim, keepdim), 0)  # (a count: an empty one is 0, False, as torch's)


def all(input, dim=None, keepdim=False):  # noqa: A001
    x = as_tensor(input)
    b = x if x.dtype is dtypes.bool_ else ne(x, 0)
    return logical_not(any(logical_not(b), dim, keepdim))


@copies
def prod(input, dim=None, keepdim=False, dtype=None):
    """The product of the elements (along dim): running products, then the last (its gradient
    right where an element is 0, as torch's)."""
    x = as_tensor(input)
    if dtype is not None:
        x = to(x, dtype)
    elif x.dtype.kind != "float":
        x = to(x, dtypes.int64)
    else:
        (x,) = amp.float32("prod", x)
    from .positions import cumprod
    from .shape import narrow, reshape

    if dim is None:
        flat = reshape(x, (-1,))
        n = flat.shape[0]
        return reshape(narrow(cumprod(flat, 0, dtype=x.dtype), 0, n - 1, 1), ()) if n else const(1, x.dtype)
    d = canon_dim(dim, x.ndim, "prod")
    if x.ndim == 0:
        return x
    n = x.shape[d]
    if n:
        out = narrow(cumprod(x, d, dtype=x.dtype), d, n - 1, 1)
    else:
        out = full(x.shape[:d] + (1,) + x.shape[d + 1:], 1, dtype=x.dtype)
    return out if keepdim else squeeze(out, d)


def max(input, dim=None, keepdim=False):
    """max(x) is the largest element; max(x, dim) gives (values, indices), as in PyTorch.
    max(x, y) with a Tensor second argument is the elementwise maximum."""
    if isinstance(dim, Tensor):
        return maximum(input, dim)
    x = as_tensor(input)
    if dim is None:
        return amax(x)
    d = canon_dim(dim, x.ndim, "max")
    if x.dtype is dtypes.bool_:  # (torch's: bool values, the first True's index)
        r = max(to(x, dtypes.int64), d, keepdim)
        return MaxResult(to(r.values, dtypes.bool_), r.indices)
    if x.ndim == 0:  # (torch's: dim 0 or -1 of a 0-d tensor is the tensor, at index 0)
        return MaxResult(x + 0, argmax(x, d))
    index = argmax(x, d, keepdim=True)  # (the value is the element it names, which alone gets the gradient)
    return MaxResult(_taken_along(x, index, d, keepdim), index if keepdim else index.squeeze(d))


def min(input, dim=None, keepdim=False):
    if isinstance(dim, Tensor):
        return minimum(input, dim)
    x = as_tensor(input)
    if dim is None:
        return amin(x)
    d = canon_dim(dim, x.ndim, "min")
    if x.dtype is dtypes.bool_:
        r = min(to(x, dtypes.int64), d, keepdim)
        return MinResult(to(r.values, dtypes.bool_), r.indices)
    if x.ndim == 0:
        return MinResult(x + 0, argmax(x, d))
    index = argmax(neg(x), d, keepdim=True)
    return MinResult(_taken_along(x, index, d, keepdim), index if keepdim else index.squeeze(d))


def _taken_along(x, index, d, keepdim=False):
    """x's element at `index` (integers, of x's shape but 1 along dim d) of each line along dim d:
    the sum of a where over that line, so the gradient goes to that element alone (max(x, d)'s and
    min(x, d)'s values, as torch's, where amax shares a tie's gradient; nll_loss's log-probability).
    An index outside the dim takes 0."""
    positions = emit("iota", [], n=x.shape[d], dtype=dtypes.int64).reshape(*(-1 if a == d else 1
                                                                             for a in range(x.ndim)))
    picked = where(index == positions, x, 0)  # (an integer line's element keeps its type: not sum's int64)
    return sum(picked, d, keepdim, dtype=x.dtype) if x.dtype.kind == "int" else sum(picked, d, keepdim)


def argmax(input, dim=None, keepdim=False):
    x = as_tensor(input)
    if x.dtype is dtypes.bool_:
        fail("argmax/argmin: torch takes no bool tensor here; cast it with .int() first")
    if x.numel() == 0 and (dim is None or x.ndim == 0 or x.shape[canon_dim(dim, x.ndim, "argmax")] == 0):
        fail(f"argmax/argmin: {x.value.spec!r} has no element along the dim to pick from, as torch refuses")
    if dim is None:  # (the flat index; keepdim keeps every dim, each of size 1, as torch's)
        flat = emit("argmax", [x.reshape(-1)], axis=0, keepdim=False)
        return flat.reshape((1,) * x.ndim) if keepdim else flat
    d = canon_dim(dim, x.ndim, "argmax")
    if x.ndim == 0:  # (torch's: dim 0 or -1 of a 0-d tensor, index 0)
        return emit("argmax", [x.reshape(1)], axis=0, keepdim=False)
    return emit("argmax", [x], axis=d, keepdim=bool(keepdim))


def argmin(input, dim=None, keepdim=False):
    return argmax(neg(input), dim, keepdim)


def var(input, dim=None, unbiased=True, keepdim=False, correction=None):
    x = as_tensor(input)
    if x.dtype.kind != "float":
        fail(f"std and var take a floating tensor, got {x.dtype.name} (as torch's); convert it with .float() first")
    if correction is None:
        correction = 1 if unbiased else 0
    elif isinstance(correction, bool) or not isinstance(correction, (numbers.Real, np.integer, np.floating)):
        fail(f"var/std: correction must be a number (1 for Bessel's, 0 for none), got {correction!r}")
    axes = _axes(x, dim, "var")
    n = math.prod(x.shape[a] for a in axes)

    def spread(v):
        d = v - mean(v, axes, keepdim=True)
        return sum(d * d, axes, keepdim) / builtins.max(n - correction, 0)
    return rounded_once(x, spread)


def std(input, dim=None, unbiased=True, keepdim=False, correction=None):
    """The square root of var, with torch's gradient where the spread is 0: 0, not 0/0."""
    (x,) = amp.float32("std", as_tensor(input))
    root = lambda v: _root_of_sum(var(v, dim, unbiased, keepdim, correction), sqrt)  # noqa: E731
    return rounded_once(x, root)  # (an integer x: var's refusal)


def var_mean(input, dim=None, unbiased=True, keepdim=False, *, correction=None):
    """torch.var_mean: (var, mean) over dim, each as var and mean compute it."""
    return var(input, dim, unbiased, keepdim, correction), mean(input, dim, keepdim=keepdim)


def std_mean(input, dim=None, unbiased=True, keepdim=False, *, correction=None):
    """torch.std_mean: (std, mean) over dim, each as std and mean compute it."""
    return std(input, dim, unbiased, keepdim, correction), mean(input, dim, keepdim=keepdim)


def logsumexp(input, dim, keepdim=False):
    """log(sum(exp(x))) over dim, shifted by the largest element (held constant: the gradient is
    softmax's) so large inputs do not overflow; a line of -inf gives -inf, as torch's."""
    (x,) = amp.float32("logsumexp", as_tensor(input))
    if x.dtype.kind != "float":
        x = to(x, dtypes.DEFAULT_FLOAT)
    axes = _axes(x, dim, "logsumexp")
    if not axes:  # (each element its own sum: itself, as torch's shifted sum gives it, -1000 and inf included)
        return add(x, 0.0)
    if builtins.any(x.shape[a] == 0 for a in axes):  # (an empty sum: log 0, as torch's)
        return log(sum(x, axes, keepdim))
    m = detach(amax(x, axes, keepdim=True))
    m = where(eq(abs(m), float("inf")), 0.0, m)
    out = log(sum(exp(x - m), axes, keepdim=True)) + m
    return out if keepdim else squeeze(out, axes)


def norm(input, p="fro", dim=None, keepdim=False):
    (x,) = amp.float32("norm", as_tensor(input))
    if x.dtype.kind != "float":
        fail(f"norm takes a floating tensor, got {x.dtype.name} (as torch's vector_norm); convert it with .float() "
             "first")
    return rounded_once(x, lambda v: _norm(v, p, dim, keepdim))  # (a half type's: in float32, rounded once)


def _norm(x, p, dim, keepdim):
    if p in ("fro", 2, 2.0):
        return _root_of_sum(sum(x * x, dim, keepdim), sqrt)
    if isinstance(p, str) and p not in ("inf", "-inf"):
        fail(f"norm: p={p!r} is not supported; Mica's norms are vector norms: p='fro' (the default), a number, "
             "inf or -inf")
    if p in (float("inf"), "inf"):
        return amax(abs(x), dim if dim is not None else (), keepdim)
    if p in (float("-inf"), "-inf"):  # (torch's: the smallest magnitude)
        return amin(abs(x), dim if dim is not None else (), keepdim)
    if p == 1:
        return sum(abs(x), dim, keepdim)
    if p == 0:  # (torch's: the count of nonzero elements)
        return sum(to(ne(x, 0), x.dtype), dim, keepdim)
    return _root_of_sum(sum(pow(abs(x), p), dim, keepdim), lambda s: pow(s, 1.0 / p))


def reciprocal(input):
    """1 / x (an integer tensor's in the default float, as torch's)."""
    (x,) = amp.float32("reciprocal", as_tensor(input))
    return div(1.0, x if x.dtype.kind == "float" else to(x, dtypes.DEFAULT_FLOAT))


def rsub(input, other, alpha=1):
    """torch.rsub: other - alpha * input."""
    return sub(other, input, alpha=alpha)


def xlogy(input, other):
    """x log y: 0 where x is 0 (y 0 too), NaN where y is NaN, as torch's."""
    x, y = as_tensor(input) if isinstance(input, Tensor) else input, as_tensor(other) if isinstance(other, Tensor) \
        else other
    dt = _floating(result_type(x, y))
    x, y = as_tensor(x, dt), as_tensor(y, dt)
    zero = logical_and(eq(x, 0.0), logical_not(isnan(y)))
    finite = logical_and(gt(y, 0.0), logical_not(isinf(y)))  # (where x is 0: 0, with torch's slope log y in x
    slope = where(finite, log(where(finite, y, 1.0)), 0.0)    # (0 for y <= 0; an infinite one left out: no inf * 0)
    at_zero = add(mul(where(zero, x, 0.0), slope), 0.0)       # (+ 0.0: 0 * a negative log is -0, torch's is 0)
    return where(zero, at_zero, mul(where(zero, 1.0, x), log(where(zero, 1.0, y))))


def logaddexp(input, other):
    """log(exp(a) + exp(b)) without overflow: the larger plus log1p(exp(-|a - b|)); two equal
    infinities give that infinity, as torch's."""
    from .activations import log1p

    dt = _floating(result_type(input, other))
    if dt in dtypes.HALF:  # (computed in float32, rounded once, as torch's kernel)
        return to(logaddexp(as_tensor(input, dtypes.float32), as_tensor(other, dtypes.float32)), dt)
    a, b = as_tensor(input, dt), as_tensor(other, dt)
    same_inf = logical_and(isinf(a), eq(a, b))
    safe_a, safe_b = where(same_inf, 0.0, a), where(same_inf, 0.0, b)
    out = add(maximum(safe_a, safe_b), log1p(exp(neg(abs(sub(safe_a, safe_b))))))
    return where(same_inf, a, out)


def logit(input, eps=None):
    """log(x / (1 - x)), x first clamped to [eps, 1 - eps] where eps is given."""
    x = as_tensor(input)
    x = x if x.dtype.kind == "float" else to(x, dtypes.DEFAULT_FLOAT)
    if eps is not None:
        x = clamp(x, eps, 1.0 - eps)
    return log(div(x, sub(1.0, x)))


@copies
def nan_to_num(input, nan=0.0, posinf=None, neginf=None):
    """NaN, inf and -inf replaced: by 0 and the type's largest and least finite values unless given."""
    x = as_tensor(input)
    if x.dtype.kind != "float":
        return x
    info = np.finfo(np.float32 if x.dtype is dtypes.bfloat16 else x.dtype.np_storage)
    top = float(info.max) if x.dtype is not dtypes.bfloat16 else 3.3895313892515355e38
    posinf = top if posinf is None else posinf
    neginf = -top if neginf is None else neginf
    return where(isnan(x), as_tensor(nan, x.dtype), where(eq(x, math.inf), as_tensor(posinf, x.dtype),
                                                           where(eq(x, -math.inf), as_tensor(neginf, x.dtype), x)))


def count_nonzero(input, dim=None):
    """The count of nonzero elements (over dim), an int64."""
    return sum(ne(as_tensor(input), 0), dim)


def nansum(input, dim=None, keepdim=False, dtype=None):
    """sum with NaNs counted as 0."""
    x = as_tensor(input)
    return sum(where(isnan(x), 0.0, x) if x.dtype.kind == "float" else x, dim, keepdim, dtype=dtype)


def nanmean(input, dim=None, keepdim=False, dtype=None):
    """The mean of the elements that are not NaN (NaN where there are none)."""
    x = _floating_operand("nanmean", input, dtype)
    kept = logical_not(isnan(x))
    return div(sum(where(kept, x, 0.0), dim, keepdim), sum(to(kept, x.dtype), dim, keepdim))


def _root_of_sum(s, root):
    """root(s) with torch's norm gradient at a zero vector: 0, where the root's slope (infinite at 0)
    times the sum's (0) would be NaN. The same values: root(0) is 0."""
    zero = eq(s, 0)
    return where(zero, 0.0, root(where(zero, 1.0, s)))


# ---- constants ------------------------------------------------------------------------------------

def _size(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    for s in size:
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 0:
            raise ShapeError(f"a size must be non-negative ints, got {tuple(size)!r}", user_location())
    return tuple(int(s) for s in size)


def full(size, fill_value, dtype=None, **_device):
    """A constant tensor. Outside a trace it returns a numpy array (for initial values)."""
    size = _size((size,) if isinstance(size, (int, np.integer)) else tuple(size))
    if not isinstance(fill_value, (numbers.Number, np.number, np.bool_)) or isinstance(fill_value, complex):
        fail(f"full: fill_value must be a number or a bool, got {fill_value!r}")
    dtype = as_dtype(dtype) if dtype is not None else scalar_dtype(fill_value)
    fits("full", fill_value, dtype)
    if not in_trace():
        return in_dtype(np.full(size, fill_value, dtype=dtype.np_storage), dtype, copy=False)
    out = expand(const(fill_value, dtype), size)
    return Tensor(out.value, out._ctx)  # (a tensor of its own, not a view of the one value: in-place on it)


def _sized(size, given):
    """The sizes given as *size or as torch's size= keyword (the device's keywords ignored)."""
    if "size" in given:
        if size:
            fail("give the sizes once: as arguments or as size=, not both")
        return _size((given["size"],) if isinstance(given["size"], (int, np.integer)) else tuple(given["size"]))
    return _size(size)


def zeros(*size, dtype=None, **_device):
    return full(_sized(size, _device), 0, dtype or dtypes.DEFAULT_FLOAT)


def ones(*size, dtype=None, **_device):
    return full(_sized(size, _device), 1, dtype or dtypes.DEFAULT_FLOAT)


def full_like(input, fill_value, dtype=None):
    return full(input.shape, fill_value, dtype or input.dtype)


def empty(*size, dtype=None, **_device):
    """torch.empty: its values are unspecified; here zeros (a program's memory holds no garbage)."""
    return full(_sized(size, _device), 0, dtype or dtypes.DEFAULT_FLOAT)


def empty_like(input, dtype=None, **_device):
    return full(input.shape, 0, dtype or input.dtype)


def clone(input, memory_format=None):
    """torch.clone: a tensor of its own with input's values."""
    x = as_tensor(input)
    return Tensor(x.value, x._ctx)


def get_default_dtype():
    """torch.get_default_dtype: Mica's default float, float32."""
    return dtypes.DEFAULT_FLOAT


def zeros_like(input, dtype=None):
    return full(input.shape, 0, dtype or input.dtype)


def ones_like(input, dtype=None):
    return full(input.shape, 1, dtype or input.dtype)


def arange(start, end=None, step=1, dtype=None, **_device):
    """PyTorch's arange: int64 for integer bounds, float32 otherwise; values start + i*step."""
    if end is None:
        start, end = 0, start
    if step == 0:
        fail("arange: step must be non-zero")
    n = builtins.max(0, math.ceil((end - start) / step))
    floats = builtins.any(isinstance(v, float) for v in (start, end, step))
    dtype = as_dtype(dtype) if dtype is not None else (dtypes.DEFAULT_FLOAT if floats else dtypes.int64)
    if not in_trace():
        return in_dtype(start + np.arange(n, dtype=np.float64 if dtype.kind == "float" else np.int64) * step, dtype)
    if dtype.kind == "float":
        # Like PyTorch on the CPU, values are formed in double and rounded once.
        i = emit("iota", [], n=n, dtype=dtypes.float64)
        return to(i * float(step) + float(start), dtype)
    i = emit("iota", [], n=n, dtype=dtypes.int64)
    if step != 1:
        i = i * int(step)
    if start != 0:
        i = i + int(start)
    return to(i, dtype)


def linspace(start, end, steps, dtype=None, **_device):
    """PyTorch's linspace: the first half stepped from start, the second half back from end, in the
    element type's own arithmetic."""
    if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool) or steps < 0:
        fail(f"linspace: steps must be an int, 0 or more, got {steps!r}")
    dtype = as_dtype(dtype) if dtype is not None else dtypes.DEFAULT_FLOAT
    t = np.float64 if dtype is dtypes.float64 else np.float32
    step = (t(end) - t(start)) / t(steps - 1) if steps > 1 else t(0)
    i = np.arange(steps).astype(t)
    vals = np.where(i < steps // 2, t(start) + step * i, t(end) - step * (t(steps - 1) - i))
    if steps == 1:  # (torch's: [start])
        vals = np.array([start], t)
    return tensor(vals, dtype=dtype)


def in_dtype(values, dtype, copy=True):
    """Values in `dtype`'s storage outside a trace, as torch's cast makes them: bfloat16's, which
    numpy lacks, rounded to it and held as float32 (docs/api.md)."""
    with np.errstate(over="ignore"):  # (beyond float16's range: inf, as torch's cast, without numpy's warning)
        values = np.asarray(values).astype(dtype.np_storage, copy=copy)
    if dtype is not dtypes.bfloat16:
        return values
    from ..backends.reference import round_bf16

    return round_bf16(values)


def tensor(data, dtype=None, *, _copy=True, **_device):
    """A literal constant from numpy data, stored in the program (outside a trace, with `_copy` False,
    the data itself where it has the type already: as_tensor's)."""
    if in_trace() and isinstance(data, (list, tuple)) and _holds_traced(data):
        return _stacked(data, dtype)  # (torch.tensor([R]), R a traced value: a copy of its value, detached)
    try:
        arr = np.asarray(data)
    except ValueError:  # (ragged nested lists: numpy's inhomogeneous shape)
        fail("tensor: the nested lists are of different lengths; give rows of one length (torch refuses them too)")
    wanted = str(dtype).rpartition(".")[2] if dtype is not None else None
    if arr.dtype.kind == "c" or wanted in dtypes.COMPLEX_NAMES:
        return _complex_data(data, arr, wanted)
    dt = as_dtype(dtype) if dtype is not None else (
        dtypes.DEFAULT_FLOAT if arr.dtype.kind == "f" else as_dtype(arr.dtype))
    if not in_trace():
        return in_dtype(arr, dt, copy=_copy)
    shape = tuple(arr.shape)  # (before ascontiguousarray, which makes a 0-d array 1-d)
    arr = np.ascontiguousarray(in_dtype(arr, dt))  # (bfloat16's values rounded to it, held as float32)
    return emit("literal", [], data=arr.tobytes(), shape=shape, dtype=dt)


def _holds_traced(data):
    return builtins.any(isinstance(x, Tensor) or type(x).__name__ == "Deferred" or
               (isinstance(x, (list, tuple)) and _holds_traced(x)) for x in data)


def _stacked(data, dtype):
    """torch.tensor of nested lists holding traced values (0-d tensors, x.item()s) and numbers: the
    values stacked into one tensor, detached (torch's tensor() copies data, with no history), in
    dtype or the type torch's inference gives (a float among them: the default float; else an int
    among them: int64; else bool)."""
    from .shape import stack

    leaves = []

    def walk(x):
        for v in x:
            walk(v) if isinstance(v, (list, tuple)) else leaves.append(v)
    walk(data)
    traced = [as_tensor(v) for v in leaves if isinstance(v, Tensor) or type(v).__name__ == "Deferred"]
    numbers = [v for v in leaves if not (isinstance(v, Tensor) or type(v).__name__ == "Deferred")]
    if dtype is not None:
        dt = as_dtype(dtype)
    elif builtins.any(t.dtype.kind == "float" for t in traced) or builtins.any(isinstance(v, float) for v in numbers):
        dt = dtypes.DEFAULT_FLOAT
    elif builtins.all(t.dtype is dtypes.bool_ for t in traced) and builtins.all(isinstance(v, bool) for v in numbers):
        dt = dtypes.bool_
    else:
        dt = dtypes.DEFAULT_INT

    def build(x):
        if isinstance(x, (list, tuple)):
            if not x:
                fail("tensor: an empty list among traced values has no shape to stack; give values")
            return stack([build(v) for v in x], 0)
        t = as_tensor(x, dt)
        if t.ndim:
            fail(f"tensor: takes numbers and 0-d tensors (one element each), got a {t.value.spec!r} tensor; use "
                 "torch.stack or torch.cat to join tensors")
        return t
    return detach(build(data))


def _complex_data(data, arr, wanted):
    """torch.tensor of complex numbers: complex64 (torch's default complex type) unless numpy data or
    dtype= says complex128; outside a trace a numpy complex host tensor, in one a constant
    ComplexTensor (mica/complex.py)."""
    from ..complex import lift

    if wanted is not None and wanted not in dtypes.COMPLEX_NAMES:
        fail(f"tensor: complex numbers cannot be held as {wanted} (torch refuses them too); give dtype=mica.complex64, "
             "or take their .real")
    double = wanted in ("complex128", "cdouble") or (wanted is None and isinstance(data, np.ndarray)
                                                     and arr.dtype == np.complex128)
    out = arr.astype(np.complex128 if double else np.complex64)
    return lift(out) if in_trace() else out


from .shape import expand, squeeze  # noqa: E402  (shape verbs build on these)

sum, mean, max, min, amax, amin, argmax, argmin, var, std, norm, logsumexp = (  # noqa: A001
    takes_axis(v) for v in (sum, mean, max, min, amax, amin, argmax, argmin, var, std, norm, logsumexp))
