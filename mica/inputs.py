"""A call's arguments read as a traced program's inputs: one check, the same sentences, for the
compiled programs (every target) and the float64 oracle."""
import numpy as np

from .dtypes import HALF, float16
from .errors import MicaError
from .tensor import user_location

# the magnitude from which a value rounds to infinity in each float type (half its last step above the
# largest finite value), and that largest value
_FINITE_BELOW = {"float16": (65520.0, "65504"), "bfloat16": (2.0 ** 128 * (1 - 2.0 ** -9), "3.39e38"),
                 "float32": (2.0 ** 128 * (1 - 2.0 ** -25), "3.40e38")}


def check_input(array, value, index, name, label=None):
    """`array` as numpy, or one sentence when it cannot be input `index` (`value`: its dtype and
    shape; `label`: the argument's name, e.g. params['wte']) of program `name` without losing its
    meaning: a shape other than the traced one, or values of another kind (floats where the program
    reads integers, complex numbers, text), or beyond the input type's range. Integers and booleans
    for a float input, float64 for float32, and integers for a boolean mask convert as torch's and
    numpy's assignments do."""
    spec = f"{value.dtype.short}[{', '.join(map(str, value.shape))}]"
    what = f"{name}: input {index}" + (f" ({label})" if label else "")
    from .nn.modules import _from_torch

    try:
        a = np.asarray(_from_torch(array))  # (a torch tensor that requires grad: its values, detached)
    except (TypeError, ValueError, RuntimeError) as e:
        raise MicaError(f"{what} ({spec}) got a value numpy cannot read as an array ({e})", user_location()) from None
    want = np.dtype(np.float32) if value.dtype in HALF else np.dtype(value.dtype.np_storage)
    fits = np.can_cast(a.dtype, want, casting="same_kind") or (want.kind == "b" and a.dtype.kind in "iu")
    if a.dtype.kind not in "biuf" or not fits:  # (0/1 integers are a mask's booleans, as numpy takes them)
        kind = {"b": "booleans", "i": "integers", "u": "integers"}.get(want.kind, "real numbers")
        raise MicaError(f"{what} is {spec} and got {a.dtype} values; pass an array of {kind} "
                        f"(e.g. np.asarray(x, np.{want}))", user_location())
    if a.shape != tuple(value.shape):
        raise MicaError(f"{what} is {spec} and got shape {a.shape}; pass an array of shape {tuple(value.shape)}",
                        user_location())
    if want.kind == "i" and a.dtype.kind in "iu" and a.size:  # (numpy's cast would wrap it)
        info = np.iinfo(want)
        low, high = a.min(), a.max()
        if low < info.min or high > info.max:
            raise MicaError(f"{what} is {spec} and got {high if high > info.max else low}, outside {want}'s range; "
                            f"pass values from {info.min} to {info.max}", user_location())
    # (numpy's cast would make it inf: floats of a wider type, or integers for float16, whose range is small)
    narrower = a.dtype.itemsize > value.dtype.itemsize if a.dtype.kind == "f" else value.dtype is float16
    if want.kind == "f" and a.dtype.kind in "iuf" and a.size and narrower:
        limit, largest = _FINITE_BELOW.get(value.dtype.name, _FINITE_BELOW["float32"])
        with np.errstate(invalid="ignore"):
            beyond = np.abs(a.astype(np.float64) if a.dtype.kind != "f" else a) >= limit
        if beyond.any():
            v = a.reshape(-1)[np.flatnonzero(beyond.reshape(-1) & np.isfinite(a.reshape(-1)))]
            if v.size:
                raise MicaError(f"{what} is {spec} and got {v[0]}, beyond {value.dtype.name}'s largest value "
                                f"({largest}); scale the values, or trace the input as a wider type", user_location())
    return a
