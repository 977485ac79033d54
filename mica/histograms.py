"""torch.histc and torch.histogram on host tensors (makemore's activation and gradient plots:
`hy, hx = torch.histogram(t, density=True)`). They run outside a compiled step, on values a step
returned or left behind: inside one the sentence says so."""
import numpy as np

from .errors import MicaError


def _values(verb, input):
    from .tensor import Tensor, user_location

    if isinstance(input, Tensor):
        raise MicaError(f"{verb} runs on host tensors, outside a compiled step; return the tensor from the step (or "
                        "keep it on a module) and take its histogram after the call", user_location())
    a = np.asarray(input)
    if a.dtype.kind != "f":
        raise MicaError(f"{verb} takes a floating tensor, got {a.dtype} (as torch's); cast it with .float()",
                        user_location())
    return a


def _edges(a, bins, low, high, widen):
    """bins + 1 evenly spaced edges from low to high (the data's own where both are None or 0), in
    the input's type; equal ends are widened by `widen` each side, as torch's."""
    from .tensor import user_location

    if low is None:
        low, high = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
    if not (np.isfinite(low) and np.isfinite(high)):
        raise MicaError(f"the histogram's range [{low}, {high}] is not finite (the tensor holds an inf or NaN?); "
                        "pass range=(min, max)", user_location())
    if low > high:
        raise MicaError(f"the histogram's range must have min <= max, got [{low}, {high}]", user_location())
    if low == high:
        low, high = low - widen, high + widen
    return _linspace(low, high, int(bins) + 1, a.dtype)


def _linspace(start, end, steps, dtype):
    """torch's linspace in `dtype`: the first half counted up from start, the rest down from end."""
    t = np.dtype(dtype).type
    start, end = t(start), t(end)
    step = (end - start) / t(steps - 1)
    i = np.arange(steps)
    half = steps // 2
    return np.where(i < half, start + i.astype(dtype) * step, end - (steps - 1 - i).astype(dtype) * step).astype(dtype)


def _counts(a, edges, weight=None):
    """Counts (or summed weights) of a's elements in the bins [e0, e1), ..., [e_{n-1}, e_n] (the last
    closed); elements outside, and NaNs, are left out."""
    flat = a.reshape(-1)
    w = None if weight is None else np.asarray(weight, np.float64).reshape(-1)
    keep = (flat >= edges[0]) & (flat <= edges[-1])
    at = np.clip(np.searchsorted(edges, flat[keep], side="right") - 1, 0, len(edges) - 2)
    return np.bincount(at, weights=None if w is None else w[keep], minlength=len(edges) - 1)


def histc(input, bins=100, min=0, max=0):  # noqa: A002  (torch's names)
    """torch.histc: counts in `bins` equal bins over [min, max] (the data's range where both are 0),
    in the input's type."""
    from .host import host

    a = _values("histc", input)
    if int(bins) < 1:
        from .tensor import user_location

        raise MicaError(f"histc: bins must be at least 1, got {bins}", user_location())
    low, high = (None, None) if min == 0 and max == 0 else (float(min), float(max))
    edges = _edges(a, bins, low, high, 1.0)
    return host(_counts(a, edges).astype(a.dtype))


def histogram(input, bins=100, *, range=None, weight=None, density=False):  # noqa: A002
    """torch.histogram: (hist, bin_edges); bins a number (evenly spaced over `range`, else the
    data's) or a 1-d tensor of increasing edges; density divides by the total and the widths."""
    from .host import host
    from .tensor import user_location

    a = _values("histogram", input)
    if isinstance(bins, (int, np.integer)):
        if bins < 1:
            raise MicaError(f"histogram: bins must be at least 1, got {bins}", user_location())
        edges = _edges(a, bins, *(range if range is not None else (None, None)), 0.5)
    else:
        edges = np.asarray(bins).astype(a.dtype).reshape(-1)
        if edges.size < 2 or (np.diff(edges) < 0).any():
            raise MicaError("histogram: bins given as a tensor must hold at least 2 increasing edges",
                            user_location())
    if weight is not None and np.shape(weight) != a.shape:
        raise MicaError(f"histogram: weight must have the input's shape {list(a.shape)}, got "
                        f"{list(np.shape(weight))}", user_location())
    hist = _counts(a, edges, weight).astype(np.float64)
    if density:
        total = hist.sum()
        hist = hist / (total * np.diff(edges.astype(np.float64))) if total else hist * np.nan
    return host(hist.astype(a.dtype)), host(edges)


def bincount(input, weights=None, minlength=0):
    """torch.bincount: the count of each value of a 1-d non-negative int tensor (weights: their sum),
    max(input) + 1 or minlength bins; inside a trace verbs.positions.bincount (minlength bins)."""
    from .tensor import in_trace, user_location

    if in_trace():
        from .verbs.positions import bincount as traced

        return traced(input, weights, minlength)
    from .errors import MicaError
    from .host import host

    x = np.asarray(input)
    if x.ndim != 1 or x.dtype.kind not in "iu" or (x.size and x.min() < 0):
        raise MicaError("bincount: takes a 1-d tensor of non-negative integers (as torch's)", user_location())
    w = None if weights is None else np.asarray(weights)
    counts = np.bincount(x, weights=w, minlength=int(minlength))
    if w is None:
        return host(counts.astype(np.int64))
    return host(counts.astype(w.dtype if w.dtype.kind == "f" else np.float64))

