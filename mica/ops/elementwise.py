"""Elementwise primitives: sources (constants, iota), casts, unary and binary maps, where.

Binary and ternary maps broadcast their operands numpy-style; their operands share one element
type (the verbs insert casts by PyTorch's promotion rule first). VJPs sum gradients back to each
operand's shape.
"""
import math

import numpy as np

from .. import dtypes
from ..errors import ShapeError
from . import F, defop

# ---- shape rules --------------------------------------------------------------------------------


def broadcast_shapes(op, *shapes):
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(ndim):
        size = 1
        for s in shapes:
            d = s[i - ndim + len(s)] if i - ndim + len(s) >= 0 else 1
            if d != 1:
                if size != 1 and size != d:
                    raise ShapeError(f"{op}: shapes " + " and ".join(str(list(s)) for s in shapes)
                                     + f" do not broadcast (dimension {i - ndim}: {size} vs {d})")
                size = d
        out.append(size)
    return tuple(out)


def _same_dtype(op, specs):
    first = specs[0].dtype
    for s in specs[1:]:
        if s.dtype is not first:
            raise ShapeError(f"{op}: operands must share an element type, got "
                             + ", ".join(repr(s) for s in specs))
    return first


def _map_rule(kinds, result=None):
    """Shape rule for an elementwise map whose operands must be of `kinds` ("float", "int", "bool")."""
    def infer(specs, **attrs):
        op = infer.op
        dt = _same_dtype(op, specs)
        if dt.kind not in kinds:
            raise ShapeError(f"{op} takes {' or '.join(kinds)} tensors, got {specs[0]!r}")
        return [(broadcast_shapes(op, *(s.shape for s in specs)), result or dt)]
    return infer


# ---- sources ------------------------------------------------------------------------------------

def _const_infer(specs, value, dtype):
    return [((), dtype)]


def _const_ref(args, attrs, run):
    value, dt = attrs["value"], np.dtype(run.np(attrs["dtype"]))
    if dt.kind == "i" and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        half = 1 << (8 * dt.itemsize - 1)  # (a Python int beyond the type wraps into it, as the C cast and torch's)
        value = (int(value) + half) % (2 * half) - half
    return np.asarray(value, dtype=dt)


defop("const", infer=_const_infer, ref=_const_ref, family="source")


def _literal_infer(specs, data, shape, dtype):
    return [(shape, dtype)]


def _literal_ref(args, attrs, run):
    dt = attrs["dtype"]
    arr = np.frombuffer(attrs["data"], dtype=dt.np_storage).reshape(attrs["shape"])
    return arr.astype(run.np(dt))


defop("literal", infer=_literal_infer, ref=_literal_ref, family="source")


def _iota_infer(specs, n, dtype):
    return [((n,), dtype)]


defop("iota", infer=_iota_infer, ref=lambda a, at, run: np.arange(at["n"]).astype(run.np(at["dtype"])),
      family="source")


def _rng_ref(args, attrs, run):
    return np.asarray(run.rng, dtype=np.int64)


defop("rng_key", infer=lambda specs: [((2,), dtypes.int64)], ref=_rng_ref, family="source")
defop("input", infer=lambda specs, index: [], ref=None, family="source")


# ---- casts --------------------------------------------------------------------------------------

def _cast_infer(specs, dtype):
    return [(specs[0].shape, dtype)]


def _cast_ref(args, attrs, run):
    x, dt = args[0], attrs["dtype"]
    if dt.kind == "int" and x.dtype.kind == "f":
        x = np.trunc(x)
    return x.astype(run.np(dt))


def _cast_vjp(cts, outs, ins, attrs, need):
    x = ins[0]
    if x.dtype.kind != "float":
        return [None]
    return [F.to(cts[0], x.dtype)]


defop("cast", infer=_cast_infer, ref=_cast_ref, vjp=_cast_vjp, family="elementwise")


# ---- unary maps ---------------------------------------------------------------------------------

_erf = np.frompyfunc(math.erf, 1, 1)


def _np_erf(x):
    x = np.asarray(x)  # (frompyfunc gives a Python float for a 0-d array)
    return np.asarray(_erf(x.astype(np.float64)), dtype=np.float64).astype(x.dtype)


def _sigmoid(x):
    # 1/(1+exp(-x)) overflows exp for very negative x; this form stays finite for both signs.
    with np.errstate(over="ignore"):
        return np.where(x >= 0, 1 / (1 + np.exp(-x)), np.exp(x) / (1 + np.exp(x))).astype(x.dtype)


def _unary(name, fn, vjp, c, kinds=("float",)):
    infer = _map_rule(kinds)
    infer.op = name
    defop(name, infer=infer, ref=lambda a, at, run: np.asarray(fn(a[0])), vjp=vjp, family="elementwise", c=c)


def _relu_grad(cts, outs, ins, attrs, need):
    return [F.where(outs[0] > 0, cts[0], 0.0)]


def _abs_grad(cts, outs, ins, attrs, need):
    x = ins[0]
    return [cts[0] * F.where(x > 0, 1.0, F.where(x < 0, -1.0, 0.0)).to(x.dtype)]


_unary("neg", np.negative, lambda c, o, i, a, n: [-c[0]], "(-{0})", kinds=("float", "int"))
_unary("exp", np.exp, lambda c, o, i, a, n: [c[0] * o[0]], "mica_exp_{S}({0})")
_unary("log", np.log, lambda c, o, i, a, n: [c[0] / i[0]], "mica_log_{S}({0})")
_unary("tanh", np.tanh, lambda c, o, i, a, n: [c[0] * (1 - o[0] * o[0])], "mica_tanh_{S}({0})")
_unary("sqrt", np.sqrt, lambda c, o, i, a, n: [c[0] / (2 * o[0])], "mica_sqrt_{S}({0})")
_unary("rsqrt", lambda x: 1 / np.sqrt(x), lambda c, o, i, a, n: [-0.5 * c[0] * o[0] * o[0] * o[0]],
       "(({T})1 / mica_sqrt_{S}({0}))")
_unary("sin", np.sin, lambda c, o, i, a, n: [c[0] * F.cos(i[0])], "mica_sin_{S}({0})")
_unary("cos", np.cos, lambda c, o, i, a, n: [-c[0] * F.sin(i[0])], "mica_cos_{S}({0})")
_unary("erf", _np_erf, lambda c, o, i, a, n: [c[0] * (2 / math.sqrt(math.pi)) * F.exp(-i[0] * i[0])],
       "mica_erf_{S}({0})")
_unary("sigmoid", _sigmoid, lambda c, o, i, a, n: [c[0] * o[0] * (1 - o[0])],
       "(({T})1 / (({T})1 + mica_exp_{S}(-{0})))")
_unary("relu", lambda x: np.maximum(x, np.zeros((), x.dtype)), _relu_grad, "({0} < 0 ? ({T})0 : {0})",
       kinds=("float", "int"))
_unary("abs", np.abs, _abs_grad, "mica_fabs_{S}({0})", kinds=("float", "int"))  # (integers: cstyle/types.py's)
# roundings to an integer value: exact, their gradient zero (as torch's)
for _name, _fn in (("floor", np.floor), ("ceil", np.ceil), ("trunc", np.trunc), ("round", np.rint)):
    _unary(_name, _fn, lambda c, o, i, a, n: [F.zeros_like(c[0])],
           "mica_%s_{S}({0})" % ("rint" if _name == "round" else _name))
_unary("logical_not", np.logical_not, None, "(!{0})", kinds=("bool",))
_unary("bitwise_not", np.invert, None, "(~{0})", kinds=("int",))
_unary("detach", lambda x: x, lambda c, o, i, a, n: [None], "{0}", kinds=("float", "int", "bool"))


# ---- binary maps --------------------------------------------------------------------------------

def _binary(name, fn, vjp, c, kinds=("float", "int"), result=None):
    infer = _map_rule(kinds, result)
    infer.op = name
    defop(name, infer=infer, ref=lambda a, at, run: np.asarray(fn(a[0], a[1])), vjp=vjp, family="elementwise",
          c=c)


def _sum_to(g, x):
    return F.sum_to(g, x.shape)


def _add_vjp(c, o, i, a, n):
    return [_sum_to(c[0], i[0]) if n[0] else None, _sum_to(c[0], i[1]) if n[1] else None]


def _sub_vjp(c, o, i, a, n):
    return [_sum_to(c[0], i[0]) if n[0] else None, _sum_to(-c[0], i[1]) if n[1] else None]


def _mul_vjp(c, o, i, a, n):
    return [_sum_to(c[0] * i[1], i[0]) if n[0] else None, _sum_to(c[0] * i[0], i[1]) if n[1] else None]


def _div_vjp(c, o, i, a, n):
    return [_sum_to(c[0] / i[1], i[0]) if n[0] else None,
            _sum_to(-c[0] * o[0] / i[1], i[1]) if n[1] else None]


def _pow_vjp(c, o, i, a, n):
    x, e = i
    gx = None
    if n[0]:
        gx = c[0] * e * F.pow(x, e - 1)
        node = e.value.node
        if node.op != "const" or node.attrs["value"] == 0:  # torch's: 0 where e == 0 (not 0 * x**-1, NaN at 0)
            gx = F.where(e == 0, 0.0, gx)
        gx = _sum_to(gx, x)
    # d/de x**e = x**e log x; PyTorch defines it as 0 where x == 0 and e >= 0, so do we (at x == 0
    # and e < 0 it is inf * -inf = -inf, as torch's)
    ge = _sum_to(c[0] * F.where(F.logical_and(x == 0, e >= 0), 0.0, o[0] * F.log(x)), e) if n[1] else None
    return [gx, ge]


def _minmax_vjp(pick):
    def vjp(c, o, i, a, n):
        x, y = i
        # Ties share the gradient equally, as PyTorch's maximum/minimum do.
        wx = F.where(pick(x, y), 1.0, F.where(x == y, 0.5, 0.0)).to(c[0].dtype)
        return [_sum_to(c[0] * wx, x) if n[0] else None, _sum_to(c[0] * (1 - wx), y) if n[1] else None]
    return vjp


def _fmod_vjp(c, o, i, a, n):
    x, y = i  # (fmod(x, y) = x - trunc(x / y) * y: torch's gradients, 1 and -trunc(x / y))
    return [_sum_to(c[0], x) if n[0] else None, _sum_to(-c[0] * F.trunc(x / y), y) if n[1] else None]


def _np_pow(x, e):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.power(x, e)


def _np_fmod(x, y):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmod(x, y)


def _np_div(x, y):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(x, y)


_binary("add", np.add, _add_vjp, "({0} + {1})", kinds=("float", "int", "bool"))
_binary("sub", np.subtract, _sub_vjp, "({0} - {1})")
_binary("mul", np.multiply, _mul_vjp, "({0} * {1})", kinds=("float", "int", "bool"))
_binary("div", _np_div, _div_vjp, "({0} / {1})", kinds=("float",))
_binary("pow", _np_pow, _pow_vjp, "mica_pow_{S}({0}, {1})", kinds=("float",))
_binary("fmod", _np_fmod, _fmod_vjp, "mica_fmod_{S}({0}, {1})", kinds=("float",))
_binary("maximum", np.maximum, _minmax_vjp(lambda x, y: x > y), "(({0} > {1} || {0} != {0}) ? {0} : {1})")
_binary("minimum", np.minimum, _minmax_vjp(lambda x, y: x < y), "(({0} < {1} || {0} != {0}) ? {0} : {1})")
for _name, _fn, _c in (("lt", np.less, "<"), ("le", np.less_equal, "<="), ("gt", np.greater, ">"),
                       ("ge", np.greater_equal, ">="), ("eq", np.equal, "=="), ("ne", np.not_equal, "!=")):
    _binary(_name, _fn, None, "({0} %s {1})" % _c, kinds=("float", "int", "bool"), result=dtypes.bool_)
# torch's write to a tensor's data without autograd (an in-place step under no_grad, or through a
# detached alias): the new values, with the gradient of the old ones (the history the tensor keeps)
_binary("data_update", lambda old, new: np.broadcast_to(new, np.broadcast_shapes(np.shape(old), np.shape(new))),
        lambda c, o, i, a, n: [_sum_to(c[0], i[0]) if n[0] else None, None], "{1}",
        kinds=("float", "int", "bool"))
_binary("logical_and", np.logical_and, None, "({0} && {1})", kinds=("bool",))
for _name, _fn, _c in (("bitwise_and", np.bitwise_and, "&"), ("bitwise_or", np.bitwise_or, "|"),
                       ("bitwise_xor", np.bitwise_xor, "^")):  # (integers, bit by bit)
    _binary(_name, _fn, None, "({0} %s {1})" % _c, kinds=("int",))
_binary("logical_or", np.logical_or, None, "({0} || {1})", kinds=("bool",))


# ---- where --------------------------------------------------------------------------------------

def _where_infer(specs):
    c, x, y = specs
    if c.dtype is not dtypes.bool_:
        raise ShapeError(f"where: the condition must be a bool tensor, got {c!r}")
    dt = _same_dtype("where", [x, y])
    return [(broadcast_shapes("where", c.shape, x.shape, y.shape), dt)]


def _where_vjp(c, o, i, a, n):
    cond, x, y = i
    g = c[0]
    zero = F.zeros_like(g)
    return [None, _sum_to(F.where(cond, g, zero), x) if n[1] else None,
            _sum_to(F.where(cond, zero, g), y) if n[2] else None]


defop("where", infer=_where_infer, ref=lambda a, at, run: np.where(a[0], a[1], a[2]),
      vjp=_where_vjp, family="elementwise", c="({0} ? {1} : {2})")


# ---- GELU, and its slope as an op of its own ------------------------------------------------------
# The gradient is g * gelu_slope(x). The slope depends on x alone, so the compiler may compute it in
# the forward, in the same pass as gelu(x) (sharing its exp and CDF), and keep it for the backward
# in place of x (passes/order.py): the backward is then one multiply. In a half type the slope and
# the product are float32 and rounded once, as torch's gelu_backward (a half slope would round twice):
# there the backward computes the slope from the kept x.

_SQRT1_2 = 1 / math.sqrt(2)
_PDF = 1 / math.sqrt(2 * math.pi)        # the normal density's constant
_TANH_BETA = math.sqrt(2 / math.pi)
_TANH_KAPPA = 0.044715


def _gelu_ref(a, at, run):
    x = a[0]
    t = x.dtype.type
    if at["approximate"] == "tanh":
        inner = t(_TANH_BETA) * (x + t(_TANH_KAPPA) * (x * x * x))
        return t(0.5) * x * (1 + np.tanh(inner))
    return x * t(0.5) * (1 + _np_erf(x * t(_SQRT1_2)))


def _gelu_slope_ref(a, at, run):
    x = a[0]
    t = x.dtype.type
    if at["approximate"] == "tanh":
        x2 = x * x
        th = np.tanh(t(_TANH_BETA) * (x + t(_TANH_KAPPA) * (x2 * x)))
        return t(0.5) * (1 + th) + (t(0.5) * x) * (1 - th * th) * t(_TANH_BETA) * (1 + t(3 * _TANH_KAPPA) * x2)
    cdf = t(0.5) * (1 + _np_erf(x * t(_SQRT1_2)))
    return cdf + x * (np.exp(t(-0.5) * x * x) * t(_PDF))


def _gelu_infer(specs, approximate):
    (x,) = specs
    if x.dtype.kind != "float":
        raise ShapeError(f"gelu takes a floating tensor, got {x!r}")
    return [(x.shape, x.dtype)]


def _gelu_vjp(c, o, i, a, n):
    from ..tensor import emit

    x = i[0]
    if x.dtype in dtypes.HALF:  # (torch's gelu_backward: slope and product in float32, rounded once)
        wide = [emit("cast", [v], dtype=dtypes.float32) for v in (c[0], x)]
        return [emit("cast", [emit("mul", [wide[0], emit("gelu_slope", [wide[1]], **a)])], dtype=x.dtype)]
    return [emit("mul", [c[0], emit("gelu_slope", [x], **a)])]


defop("gelu", infer=_gelu_infer, ref=_gelu_ref, vjp=_gelu_vjp, family="elementwise",
      c=lambda at: "mica_gelu_tanh_{S}({0})" if at["approximate"] == "tanh" else "mica_gelu_{S}({0})")
defop("gelu_slope", infer=_gelu_infer, ref=_gelu_slope_ref, family="elementwise",
      c=lambda at: "mica_gelu_tanh_slope_{S}({0})" if at["approximate"] == "tanh" else "mica_gelu_slope_{S}({0})")
