"""torch.nn.functional.interpolate (and F.upsample*): resampling the spatial dims of [N, C, *spatial].

Every mode is written with Mica's verbs, one spatial dim at a time, the last first: each output
position reads a fixed set of input positions (its taps) with fixed weights, so a dim's result is
`index_select(x, d, taps[0]) * weights[0] + ...` — the positions and weights computed here, when
the program is traced, by torch's CPU kernel's formulas in its arithmetic (float32 for the float32
and half types, float64 for float64). The gradient is index_select's (each output's share summed
into the input positions it read, in position order): what torch's backward kernels compute.

nearest / nearest-exact: one tap, src = min(floor(dst * scale), in - 1) (with dst + 0.5 for
nearest-exact); linear / bilinear / trilinear: two taps with weights 1 - l and l; bicubic: four
taps, Keys' cubic with A = -0.75, positions clamped to the edge; area: the adaptive average pool.
Half inputs are computed in float32 and rounded once, as torch's kernels do. antialias is not
supported (a sentence says so).
"""
import math

import numpy as np

from .. import amp, dtypes
from ..tensor import fail
from .conv import _adaptive
from .core import add, as_tensor, fma32, mul, tensor, to
from .positions import index_select
from .shape import reshape

__all__ = ["interpolate", "upsample", "upsample_nearest", "upsample_bilinear"]

_MODES = {"nearest": None, "nearest-exact": None, "area": None, "linear": 1, "bilinear": 2, "trilinear": 3,
          "bicubic": 2}
_INTERPOLATING = ("linear", "bilinear", "bicubic", "trilinear")


def _per_dim(verb, name, value, nd, spatial):
    values = list(value) if isinstance(value, (tuple, list)) else [value] * nd
    if len(values) != nd:
        fail(f"{verb}: the input has {nd} spatial dims {list(spatial)} but {name} has {len(values)} ({value!r}); give "
             f"one {name} per spatial dim of an [N, C, d1, ..., dK] input")
    return values


def _sizes(verb, x, size, scale_factor, recompute_scale_factor):
    """(output sizes, the scales torch's kernel is given or Nones) for the spatial dims."""
    nd, spatial = x.ndim - 2, x.shape[2:]
    if size is not None and scale_factor is not None:
        fail(f"{verb}: give size or scale_factor, not both")
    if size is None and scale_factor is None:
        fail(f"{verb}: give size or scale_factor (the output's spatial sizes, or the factors that make them)")
    if size is not None:
        if recompute_scale_factor:
            fail(f"{verb}: recompute_scale_factor=True has no meaning with an explicit size; leave it None")
        sizes = [int(s) if isinstance(s, np.integer) else s for s in _per_dim(verb, "size", size, nd, spatial)]
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in sizes):
            fail(f"{verb}: size must be an int or {nd} ints, got {size!r}")
        scales = [None] * nd
    else:
        factors = _per_dim(verb, "scale_factor", scale_factor, nd, spatial)
        if not all(isinstance(s, (int, float, np.number)) and not isinstance(s, bool) for s in factors):
            fail(f"{verb}: scale_factor must be a number or {nd} numbers, got {scale_factor!r}")
        factors = [float(s) for s in factors]
        if not all(math.isfinite(s) for s in factors):
            fail(f"{verb}: scale_factor must be finite, got {scale_factor!r}")
        sizes = [math.floor(n * s) for n, s in zip(spatial, factors)]
        scales = [None] * nd if recompute_scale_factor else factors
    if min(sizes) <= 0 or min(spatial) <= 0:
        fail(f"{verb}: input and output sizes must be greater than 0, but the input's spatial sizes are "
             f"{list(spatial)} and the output's would be {sizes}")
    return sizes, scales


def _scale(n_in, n_out, scale, align_corners, real):
    """torch's area_pixel_compute_scale: the input distance between two output positions."""
    if align_corners:
        return real((n_in - 1) / (n_out - 1)) if n_out > 1 else real(0)
    return real(1.0 / scale) if scale is not None and scale > 0 else real(n_in) / real(n_out)


def _taps(mode, n_in, n_out, scale, align_corners, real):
    """[(input positions [n_out] int64, weights [n_out] or None)] of one spatial dim, by torch's
    formulas in `real` (np.float32 or np.float64) arithmetic."""
    dst = np.arange(n_out)
    if mode in ("nearest", "nearest-exact"):
        s = _scale(n_in, n_out, scale, False, real)
        at = dst.astype(real) + (real(0.5) if mode == "nearest-exact" else real(0))
        return [(np.minimum(np.floor(at * s).astype(np.int64), n_in - 1), None)]
    s = _scale(n_in, n_out, scale, align_corners, real)
    if align_corners:
        src = s * dst.astype(real)
    else:  # (torch's kernel fuses this multiply-add: its product is exact in float64, so this is that)
        src = (np.float64(s) * (dst.astype(real) + real(0.5)).astype(np.float64) - 0.5).astype(real)
    if mode != "bicubic":
        if n_in == n_out:  # (torch's: a copy)
            return [(dst, None)]
        src = np.maximum(src, real(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    t = np.clip(src - i0.astype(real), real(0), real(1)).astype(real)
    if mode != "bicubic":
        i1 = i0 + (i0 < n_in - 1)
        return [(i0, real(1) - t), (i1, t)]
    a = real(-0.75)

    def near(v):  # (|v| <= 1)
        return ((a + real(2)) * v - (a + real(3))) * v * v + real(1)

    def far(v):  # (1 < |v| < 2)
        return ((a * v - real(5) * a) * v + real(8) * a) * v - real(4) * a

    u = real(1) - t
    weights = [far(t + real(1)), near(t), near(u), far(u + real(1))]
    return [(np.clip(i0 - 1 + k, 0, n_in - 1), w.astype(real)) for k, w in enumerate(weights)]


def _resampled(x, d, taps, kept):
    """x resampled along dim d: the sum of each tap's rows times its weights, kept by torch's
    kernel in the input's type `kept` (a half type's weights rounded to it; x is float32 then); two
    taps in float32 as that kernel computes them, t0 * w0 + t1 * w1 with one fused multiply-add."""
    rows, weights = [], []
    for positions, w in taps:
        same = w is None and np.array_equal(positions, np.arange(x.shape[d]))
        rows.append(x if same else index_select(x, d, tensor(positions, dtype=dtypes.int64)))
        shape = [1] * x.ndim
        shape[d] = x.shape[d] if w is None else len(w)
        weights.append(None if w is None else reshape(to(tensor(w, dtype=kept), x.dtype), tuple(shape)))
    if len(rows) == 1:
        return rows[0]
    if len(rows) == 2 and x.dtype is dtypes.float32:
        return fma32(rows[0], weights[0], mul(rows[1], weights[1]))
    out = mul(rows[0], weights[0])
    for r, w in zip(rows[1:], weights[1:]):
        out = add(out, mul(r, w))
    return out


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None,
                antialias=False):
    """torch.nn.functional.interpolate: [N, C, *spatial] resampled to `size` (or the spatial sizes
    times `scale_factor`, floored) by `mode`; see the module's notes."""
    verb = "interpolate"
    x = as_tensor(input)
    if not isinstance(mode, str) or mode not in _MODES:
        fail(f"{verb}: mode must be one of {', '.join(repr(m) for m in _MODES)}, got {mode!r}")
    if not 3 <= x.ndim <= 5:
        fail(f"{verb}: the input must be [N, C, d1], [N, C, d1, d2] or [N, C, d1, d2, d3] (3 to 5 dims), got "
             f"{x.value.spec!r}")
    need = _MODES[mode]
    if need is not None and x.ndim != need + 2:
        fail(f"{verb}: mode={mode!r} takes a {need + 2}-d input [N, C, {', '.join('dhw'[3 - need:])}], got "
             f"{x.value.spec!r}")
    if align_corners is not None and mode not in _INTERPOLATING:
        fail(f"{verb}: align_corners is only for the interpolating modes ({', '.join(_INTERPOLATING)}); leave it None "
             f"with mode={mode!r}")
    if antialias:
        fail(f"{verb}: antialias=True is not supported; leave it False")
    if x.dtype.kind != "float":
        fail(f"{verb}: the input must be a floating tensor, got {x.value.spec!r}; convert it with .float() (torch also "
             f"resizes uint8 images, a type Mica does not have)")
    sizes, scales = _sizes(verb, x, size, scale_factor, recompute_scale_factor)
    if mode == "area":  # (torch's: the adaptive average pool, on its own autocast lists)
        return _adaptive(f"adaptive_avg_pool{x.ndim - 2}d", x.ndim - 2, x, sizes)
    (x,) = amp.float32(verb, x)
    dt = x.dtype
    widen = dt in dtypes.HALF and mode in _INTERPOLATING  # (nearest copies: no arithmetic to widen)
    y = to(x, dtypes.float32) if widen else x
    real = np.float64 if dt is dtypes.float64 else np.float32
    for d in reversed(range(2, x.ndim)):
        n_in, n_out = x.shape[d], sizes[d - 2]
        kept = dt if mode == "bicubic" else y.dtype  # (torch's bicubic keeps its weights in the input's type)
        y = _resampled(y, d, _taps(mode, n_in, n_out, scales[d - 2], bool(align_corners), real), kept)
    return to(y, dt) if widen else y


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """torch.nn.functional.upsample (deprecated there): interpolate."""
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input, size=None, scale_factor=None):
    """torch.nn.functional.upsample_nearest (deprecated there): interpolate, nearest."""
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    """torch.nn.functional.upsample_bilinear (deprecated there): interpolate, bilinear with aligned corners."""
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)
