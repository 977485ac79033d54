"""`with mica.autocast(dtype=mica.bfloat16):` — mixed precision as torch.autocast gives it.

Inside the region, while a function is traced, a verb on PyTorch's lower-precision list casts its
floating operands (float32, or the other half type; never float64) to the region's half type, and
a verb on the float32 list casts half operands to float32; every other verb runs in its inputs'
types (so a residual `x + y` of float32 and bfloat16 is float32, by promotion). The casts are
ordinary `cast` nodes with the user's line, visible in `program.ir`; their gradients cast back, so
float32 weights get float32 gradients. The lists are PyTorch's for the device type (CPU: the
products and attention in the half type, the losses in float32; CUDA adds softmax, log-softmax,
layer norm, sums, exp, log, rsqrt and powers to the float32 list), restricted to Mica's verbs.

What the half type means for the work itself (every target): a product reads half operands and
accumulates in float32; a kernel (norms, softmax, attention, cross-entropy) computes in float32 and
rounds its half outputs once; elementwise operations on half values compute in float32 and round
each result; sums accumulate in float32 (passes/widen.py, backends/cstyle/expr.py).
"""
import functools

from . import dtypes
from .errors import MicaError

LOWER = frozenset({"matmul", "linear", "scaled_dot_product_attention"})
FLOAT32 = {
    "cpu": frozenset({"cross_entropy", "nll_loss"}),
    "cuda": frozenset({"cross_entropy", "nll_loss", "softmax", "log_softmax", "layer_norm", "norm", "sum", "exp",
                       "log", "rsqrt", "pow"}),
}
_DEFAULT_DTYPE = {"cpu": dtypes.bfloat16, "cuda": dtypes.float16}  # torch.get_autocast_dtype's defaults

_REGIONS = []  # (device_type, dtype or None when disabled), innermost last


class autocast:  # noqa: N801  (PyTorch's name)
    """torch.autocast's signature: autocast(device_type="cpu", dtype=None, enabled=True,
    cache_enabled=None); a context manager or a decorator."""

    def __init__(self, device_type="cpu", dtype=None, enabled=True, cache_enabled=None):
        if device_type not in FLOAT32:
            raise MicaError(f"autocast: device_type must be 'cpu' or 'cuda', got {device_type!r}")
        dtype = _DEFAULT_DTYPE[device_type] if dtype is None else dtypes.as_dtype(dtype)
        if dtype not in (dtypes.bfloat16, dtypes.float16):
            raise MicaError(f"autocast: dtype must be mica.bfloat16 or mica.float16, got {dtype.name}")
        self.device_type, self.dtype, self.enabled = device_type, dtype, bool(enabled)

    def __enter__(self):
        _REGIONS.append((self.device_type, self.dtype if self.enabled else None))
        return self

    def __exit__(self, *exc):
        _REGIONS.pop()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with autocast(self.device_type, self.dtype, self.enabled):
                return fn(*args, **kwargs)

        return wrapped


def active():
    """(device_type, half dtype) of the innermost enabled region, or None."""
    return _REGIONS[-1] if _REGIONS and _REGIONS[-1][1] is not None else None


def lower(verb, *tensors):
    """The operands of a lower-precision verb, cast to the region's half type."""
    region = active()
    if region is None or verb not in LOWER:
        return tensors
    from .verbs.core import to

    half = region[1]
    return tuple(to(t, half) if _castable(t) and t.dtype is not half and t.dtype is not dtypes.float64 else t
                 for t in tensors)


def float32(verb, *tensors):
    """The operands of a float32-list verb, half ones cast to float32."""
    region = active()
    if region is None or verb not in FLOAT32[region[0]]:
        return tensors
    from .verbs.core import to

    return tuple(to(t, dtypes.float32) if _castable(t) and t.dtype in (dtypes.bfloat16, dtypes.float16) else t
                 for t in tensors)


def _castable(t):
    from .tensor import Tensor

    return isinstance(t, Tensor) and t.dtype.kind == "float"
