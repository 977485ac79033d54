"""C spellings of Mica's element types and constants, shared by the C-style targets (C, CUDA C)."""
import math

import numpy as np

from ... import dtypes
from ...backends.reference import round_bf16

COMPUTE = {"float32": "float", "float64": "double", "bfloat16": "float", "float16": "float",
           "int32": "int32_t", "int64": "int64_t", "bool": "mica_bool"}
STORAGE = {**COMPUTE, "bfloat16": "mica_bf16", "float16": "mica_f16"}


def ctype(dtype):
    """The C type arithmetic on `dtype` values is done in."""
    return COMPUTE[dtype.name]


def stype(dtype):
    """The C type `dtype` values are stored as."""
    return STORAGE[dtype.name]


def suffix(dtype):
    """f64 for double math, f32 for everything else floating."""
    return "f64" if dtype is dtypes.float64 else "f32"


def load(dtype, ref):
    if dtype is dtypes.bfloat16:
        return f"mica_bf16_load({ref})"
    if dtype is dtypes.float16:
        return f"mica_f16_load({ref})"
    return ref


def store(dtype, value):
    if dtype is dtypes.bfloat16:
        return f"mica_bf16_store({value})"
    if dtype is dtypes.float16:
        return f"mica_f16_store({value})"
    return value


def copied(src, dst, ref):
    """Element `ref` of a `src` buffer as a `dst` element: its bits where the types are the same (a
    copy is bit for bit), else converted through the compute type."""
    return ref if src is dst else store(dst, load(src, ref))


def store_expr(expr, dtype, value):
    """The stored form of loop expression `expr` (held in C variable `value`) in a buffer of
    `dtype`: a bfloat16 expression is a bfloat16 value already (rounded where it was made), so its
    bits are taken as they are; anything else goes through store()."""
    from ...passes.schedule import Iota

    made_exact = expr.dtype is dtypes.bfloat16 and not (expr.kind == "load" and isinstance(expr.view.src, Iota))
    if dtype is dtypes.bfloat16 and made_exact:
        return f"mica_bf16_exact({value})"
    return store(dtype, value)


def rounded(dtype, expr):
    """Values of a half type are rounded to it after every operation, as the oracle does."""
    if dtype is dtypes.bfloat16:
        return f"mica_round_bf16({expr})"
    if dtype is dtypes.float16:
        return f"mica_round_f16({expr})"
    return expr


def _float_literal(x, single):
    """The shortest decimal that reads back as exactly this float (or double)."""
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    if single:
        text = np.format_float_positional(np.float32(x), unique=True, trim="0") if 1e-4 <= abs(x) < 1e7 or x == 0 \
            else np.format_float_scientific(np.float32(x), unique=True, trim="0")
        return f"{text}f" if x >= 0 else f"({text}f)"
    text = repr(float(x))
    return text if x >= 0 else f"({text})"


def const(value, dtype):
    """An exact C literal for `value` as an element of `dtype`."""
    if dtype.kind == "bool":
        return "1" if value else "0"
    if dtype.kind == "int":  # (the least value as least + 1 - 1: its literal's digits do not fit the type)
        bits, v = 8 * dtype.itemsize, int(value)
        digits = f"({v + 1}{'LL' if bits == 64 else ''} - 1)" if v == -(1 << (bits - 1)) else \
            f"{v}{'LL' if bits == 64 else ''}"
        return f"(({ctype(dtype)}){digits})"
    if dtype is dtypes.float64:
        return _float_literal(float(value), False)
    v = np.float32(value)
    if dtype is dtypes.bfloat16:
        v = round_bf16(v)
    elif dtype is dtypes.float16:
        v = np.float32(np.float16(v))
    return _float_literal(float(v), True)


_SIGN = {"add": "+", "sub": "-", "mul": "*"}


def integer_arithmetic(op, dtype, args):
    """add, sub, mul, neg or abs of integers as torch's wrap on overflow: in the unsigned type of the
    same width, whose arithmetic is modular in C and CUDA (the signed type's overflow is undefined,
    and a compiler folds constants on that premise: INT64_MAX << 1 was INT64_MAX); None for other
    ops."""
    t, u = ctype(dtype), "uint64_t" if dtype.itemsize == 8 else "uint32_t"
    if op in _SIGN:
        return f"(({t})(({u})({args[0]}) {_SIGN[op]} ({u})({args[1]})))"
    if op == "neg":
        return f"(({t})(({u})0 - ({u})({args[0]})))"
    if op == "abs":
        return f"(({args[0]}) < 0 ? ({t})(({u})0 - ({u})({args[0]})) : ({args[0]}))"
    return None
