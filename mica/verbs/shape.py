"""Verbs that move data without arithmetic: views, permutations, indexing, splitting, joining."""
import builtins
import functools
import math

import numpy as np

from .. import dtypes
from ..tensor import Tensor, copies, emit, fail, link_view, strides_of, takes_axis, view_strides
from .core import as_tensor, canon_dim, known_int, needs_a_dim, result_type, to, where


def _a_view(inverse, strides=None):
    """A verb whose result views its input's memory in torch, so an in-place step on one reaches the
    other (tensor.py's _rebind): `inverse(v, base, k, *arguments)` is the base with its k-th view's
    elements replaced by v's (k: which of a tuple of views, else 0); `strides(base, view, k,
    *arguments)` the view's strides, or None where torch copies instead (a reshape of a transpose)."""
    def decorate(verb):
        first = verb.__code__.co_varnames[0]

        @functools.wraps(verb)
        def view_verb(*args, **kwargs):
            out = verb(*args, **kwargs)
            if args:
                base, rest = args[0], args[1:]
            else:
                base, rest = kwargs.pop(first, None), ()
            detached = set()
            if isinstance(base, Tensor) and not base._ctx.grad_enabled and base.dtype.kind == "float":
                from .core import detach  # (under no_grad a view that changed nothing is still detached, as torch's;

                def fresh(t):  # detach links it to the base itself)
                    if t is not base:
                        return t
                    t = detach(base)
                    detached.add(id(t))
                    return t
                out = tuple(fresh(t) for t in out) if isinstance(out, tuple) else fresh(out)
            for k, t in enumerate(out if isinstance(out, tuple) else (out,)):
                if id(t) in detached or not isinstance(base, Tensor) or not isinstance(t, Tensor) or t is base:
                    continue
                st = (strides or _same_strides)(base, t, k, *rest, **kwargs)
                if st is None:
                    continue  # (torch copies here: the result shares nothing)
                link_view(base, t, lambda b, k=k: _kth(verb(b, *rest, **kwargs), k),
                          lambda v, b, k=k: inverse(v, b, k, *rest, **kwargs), st)
            return out
        return view_verb
    return decorate


def _same_strides(b, t, k, *_, **__):
    return strides_of(b)


def _reshaped_strides(b, t, k, *_, **__):
    return view_strides(b.shape, strides_of(b), t.shape)


def _permuted_strides(b, t, k, *dims):
    st = strides_of(b)
    return tuple(st[canon_dim(d, b.ndim, "permute")] for d in _shape_args(dims, "permute"))


def _transposed_strides(b, t, k, dim0, dim1):
    st = list(strides_of(b))
    a, c = canon_dim(dim0, b.ndim, "transpose"), canon_dim(dim1, b.ndim, "transpose")
    st[a], st[c] = st[c], st[a]
    return tuple(st)


def _expanded_strides(b, t, k, *_):
    lead, st = t.ndim - b.ndim, strides_of(b)
    return (0,) * lead + tuple(0 if o == 1 and n != 1 else s for s, o, n in zip(st, b.shape, t.shape[lead:]))


def _unbound_strides(b, t, k, dim=0):
    d = canon_dim(dim, b.ndim, "unbind")
    return tuple(s for i, s in enumerate(strides_of(b)) if i != d)


def _kth(out, k):
    return out[k] if isinstance(out, tuple) else out


def _splice(b, piece, starts, steps):
    """b with the elements at starts + i * steps replaced by piece's (piece: that region's shape)."""
    from .core import full

    piece = to(piece, b.dtype)
    inside = pad_into(full(piece.shape, True, dtype=dtypes.bool_), b.shape, starts, steps)
    return where(inside, pad_into(piece, b.shape, starts, steps), b)


def _along(b, d, offset):
    """starts and steps of a region at `offset` along dim d of b (the whole of every other dim)."""
    starts = [0] * b.ndim
    starts[d] = offset
    return starts, [1] * b.ndim


def _reshaped_back(v, b, k, *_, **__):
    return reshape(v, b.shape)


def _permuted_back(v, b, k, *dims):
    perm = [canon_dim(d, b.ndim, "permute") for d in _shape_args(dims, "permute")]
    return permute(v, *np.argsort(perm).tolist())


def _transposed_back(v, b, k, dim0, dim1):
    return transpose(v, dim0, dim1)


def _expanded_back(v, b, k, *_):
    lead = v.ndim - b.ndim
    if any(n > 1 for n in v.shape[:lead]) or any(o == 1 and n > 1 for o, n in zip(b.shape, v.shape[lead:])):
        fail("an in-place step on an expanded tensor would write one element of its input many times, which torch "
             "refuses; take .clone() of the expanded tensor first")
    return reshape(v, b.shape)  # (an expand that repeats nothing, such as to (1, *shape), is a view torch writes)


def _narrowed_back(v, b, k, dim, start, length):
    d, start, _ = narrowed(b, dim, start, length)
    return _splice(b, v, *_along(b, d, start))


def _split_back(v, b, k, split_size_or_sections, dim=0):
    d = canon_dim(dim, b.ndim, "split")
    if isinstance(split_size_or_sections, (int, np.integer)):
        offset = k * int(split_size_or_sections)
    else:
        offset = builtins.sum(int(s) for s in list(split_size_or_sections)[:k])
    return _splice(b, v, *_along(b, d, offset))


def _chunk_back(v, b, k, chunks, dim=0):
    d = canon_dim(dim, b.ndim, "chunk")
    return _splice(b, v, *_along(b, d, min(k * max(1, -(-b.shape[d] // chunks)), b.shape[d])))


def _unbound_back(v, b, k, dim=0):
    d = canon_dim(dim, b.ndim, "unbind")
    return _splice(b, unsqueeze(v, d), *_along(b, d, k))



def _shape_args(shape, verb):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    for s in shape:
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool):
            fail(f"{verb}: sizes must be ints, got {tuple(shape)!r}")
    return tuple(int(s) for s in shape)


@_a_view(_reshaped_back, _reshaped_strides)
def reshape(input, *shape):
    x = as_tensor(input)
    shape = _resolved_shape(x, shape)
    if shape == x.shape:
        return x
    return emit("reshape", [x], shape=shape)


def _resolved_shape(x, shape):
    """The shape reshape(x, *shape) gives: sizes as ints, a -1 inferred (or a sentence)."""
    shape = _shape_args(shape, "view")
    if any(s < -1 for s in shape):
        fail(f"view: a shape's sizes are 0 or more, or one -1 for the size inferred, got {list(shape)}")
    if shape.count(-1) > 1:
        fail(f"view: at most one -1 may stand in a shape, got {list(shape)}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or x.numel() % known:
            fail(f"view: cannot view {x.value.spec!r} as shape {list(shape)}: its {x.numel()} elements are not a "
                 f"whole number of {known}s, so no size fills the -1")
        shape = tuple(x.numel() // known if s == -1 else s for s in shape)
    return shape


view = reshape


@_a_view(_permuted_back, _permuted_strides)
def permute(input, *dims):
    x = as_tensor(input)
    dims = _shape_args(dims, "permute")
    if len(dims) != x.ndim:
        fail(f"permute: {list(dims)} names {len(dims)} dims but the tensor has {x.ndim}")
    perm = tuple(canon_dim(d, x.ndim, "permute") for d in dims)
    if perm == tuple(range(x.ndim)):
        return x
    return emit("permute", [x], perm=perm)


def movedim(input, source, destination):
    """torch's: the dims `source` (an int or a sequence) moved to the places `destination`, the
    others keeping their order (a permute)."""
    x = as_tensor(input)
    perm = movedim_order(x, source, destination)
    return reshape(x, ()) if x.ndim == 0 else permute(x, *perm)


def movedim_order(x, source, destination):
    """movedim's permutation of x's dims (x a Tensor or an eager array), checked as torch checks it."""
    src = list(source) if isinstance(source, (tuple, list)) else [source]
    dst = list(destination) if isinstance(destination, (tuple, list)) else [destination]
    if len(src) != len(dst):
        fail(f"movedim: source {src} and destination {dst} must name as many dims")
    src = [canon_dim(d, x.ndim, "movedim") for d in src]
    dst = [canon_dim(d, x.ndim, "movedim") for d in dst]
    for what, ds in (("source", src), ("destination", dst)):
        if len(set(ds)) != len(ds):
            fail(f"movedim: the {what} dims {ds} name a dim twice; name each once")
    rest = iter(d for d in range(x.ndim) if d not in src)
    placed = dict(zip(dst, src))
    return [placed[i] if i in placed else next(rest) for i in range(x.ndim)]


moveaxis = movedim


def select(input, dim, index):
    """torch's: the slice at `index` along `dim`, that dim removed (x.select(1, 0) is x[:, 0])."""
    x = as_tensor(input)
    d, i = selected(x, dim, index)
    return squeeze(narrow(x, d, i, 1), d)


def selected(x, dim, index):
    """select's (dim, index) for x (a Tensor or an eager array), checked as torch checks them."""
    if x.ndim == 0:
        fail("select: a 0-d tensor has no dim to select from; give a tensor of at least one dim")
    d = canon_dim(dim, x.ndim, "select")
    n = x.shape[d]
    if not isinstance(index, (int, np.integer)) or isinstance(index, bool) or not -n <= index < n:
        fail(f"select: index {index!r} is out of range for dim {dim} of size {n}; give one in [{-n}, {n - 1}]")
    return d, int(index) % n


@_a_view(_transposed_back, _transposed_strides)
def transpose(input, dim0, dim1):
    x = as_tensor(input)
    if x.ndim < 2:  # (torch's: a 0-d or 1-d tensor is itself, its dims still in range)
        canon_dim(dim0, x.ndim, "transpose"), canon_dim(dim1, x.ndim, "transpose")
        return x
    perm = list(range(x.ndim))
    a, b = canon_dim(dim0, x.ndim, "transpose"), canon_dim(dim1, x.ndim, "transpose")
    perm[a], perm[b] = perm[b], perm[a]
    return permute(x, *perm)


swapaxes = swapdims = transpose


@_a_view(_expanded_back, _expanded_strides)
def expand(input, *sizes):
    x = as_tensor(input)
    sizes = _shape_args(sizes, "expand")
    if len(sizes) < x.ndim:
        fail(f"expand: {list(sizes)} has fewer dims than {x.value.spec!r}")
    lead = len(sizes) - x.ndim
    shape = []
    for i, s in enumerate(sizes):
        if s == -1:
            if i < lead:
                fail(f"expand: -1 cannot stand for a new leading dim in {list(sizes)}")
            s = x.shape[i - lead]
        shape.append(s)
    shape = tuple(shape)
    if shape == x.shape:
        return x
    src = reshape(x, (1,) * lead + x.shape) if lead else x
    return emit("expand", [src], shape=shape)


broadcast_to = expand


def sum_to(g, shape):
    """Sum a broadcast gradient back to `shape` (the adjoint of broadcasting)."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1)
    from .core import sum as _sum

    return reshape(_sum(g, axes, keepdim=True), shape) if axes else reshape(g, shape)


def slice_(x, starts, stops, steps):
    if tuple(starts) == (0,) * x.ndim and tuple(stops) == x.shape and tuple(steps) == (1,) * x.ndim:
        return x
    return emit("slice", [x], starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))


def pixel_shuffle(input, upscale_factor):
    """torch's: [*, C * r * r, H, W] to [*, C, H * r, W * r], each channel's r * r planes interleaved."""
    x = as_tensor(input)
    r = int(upscale_factor)
    if x.ndim < 3 or r < 1 or x.shape[-3] % (r * r):
        fail(f"pixel_shuffle: input must be [*, C * {r}^2, H, W] with channels divisible by upscale_factor squared, got "
             f"{x.value.spec!r}")
    *lead, c, h, w = x.shape
    y = reshape(x, tuple(lead) + (c // (r * r), r, r, h, w))
    k = len(lead)
    y = permute(y, tuple(range(k)) + (k, k + 3, k + 1, k + 4, k + 2))
    return reshape(y, tuple(lead) + (c // (r * r), h * r, w * r))


def pixel_unshuffle(input, downscale_factor):
    """torch's: [*, C, H * r, W * r] to [*, C * r * r, H, W], pixel_shuffle undone."""
    x = as_tensor(input)
    r = int(downscale_factor)
    if x.ndim < 3 or r < 1 or x.shape[-2] % r or x.shape[-1] % r:
        fail(f"pixel_unshuffle: input must be [*, C, H, W] with H and W divisible by downscale_factor {r}, got "
             f"{x.value.spec!r}")
    *lead, c, h, w = x.shape
    k = len(lead)
    y = reshape(x, tuple(lead) + (c, h // r, r, w // r, r))
    y = permute(y, tuple(range(k)) + (k, k + 2, k + 4, k + 1, k + 3))
    return reshape(y, tuple(lead) + (c * r * r, h // r, w // r))


def _pad_from_edges(x, pad, mode, value):
    """F.pad's reflect, replicate and circular modes: each padded dim, last first, gains the slices
    its mode copies (mirrored without the edge, the edge repeated, or the other end), so the
    corners of several dims come out as torch's."""
    from .positions import flip

    if value is not None and value != 0:
        fail(f'pad: padding mode "{mode}" doesn\'t take in value argument (as torch\'s); drop value=')
    k = len(pad) // 2
    if len(pad) % 2 or not 1 <= k <= 3 or x.ndim not in (k + 1, k + 2):
        fail(f"pad: mode {mode!r} pads the last 1 to 3 dims of an (N, C, ...) or (C, ...) tensor, two counts a dim; "
             f"got {len(pad)} counts for a {x.ndim}-d tensor")
    for j in range(k):
        d, b, a = x.ndim - 1 - j, pad[2 * j], pad[2 * j + 1]
        n = x.shape[d]
        if b < 0 or a < 0:
            fail(f"pad: mode {mode!r} takes counts >= 0, got {pad}")
        limit = n - 1 if mode == "reflect" else n if mode == "circular" else None
        if limit is not None and (b > limit or a > limit):
            fail(f"pad: {mode} padding of {max(b, a)} on a dim of size {n} must be at most "
                 f"{'the size less one' if mode == 'reflect' else 'the size'} (as torch's)")
        if mode == "replicate" and n == 0:
            fail("pad: replicate padding of an empty dim has no edge to repeat")
        parts = []
        if b:
            parts.append(flip(narrow(x, d, 1, b), [d]) if mode == "reflect" else
                         narrow(x, d, n - b, b) if mode == "circular" else
                         expand(narrow(x, d, 0, 1), x.shape[:d] + (b,) + x.shape[d + 1:]))
        parts.append(x)
        if a:
            parts.append(flip(narrow(x, d, n - 1 - a, a), [d]) if mode == "reflect" else
                         narrow(x, d, 0, a) if mode == "circular" else
                         expand(narrow(x, d, n - 1, 1), x.shape[:d] + (a,) + x.shape[d + 1:]))
        x = cat(parts, d) if len(parts) > 1 else x
    return x


def pad_into(x, shape, starts, steps):
    return emit("pad", [x], shape=tuple(shape), starts=tuple(starts), steps=tuple(steps))


def narrowed(x, dim, start, length):
    """narrow's (dim, start, length) for x (a Tensor or an eager array), checked as torch checks them
    (start and length ints or 0-d tensors of known value)."""
    needs_a_dim(x, "narrow")
    d = canon_dim(dim, x.ndim, "narrow")
    start, length = known_int(start, "narrow", "start"), known_int(length, "narrow", "length")
    if start < 0:
        start += x.shape[d]
    if not 0 <= start <= start + length <= x.shape[d]:
        fail(f"narrow: {start}+{length} does not fit dim {dim} of size {x.shape[d]}")
    return d, start, length


@_a_view(_narrowed_back)
def narrow(input, dim, start, length):
    x = as_tensor(input)
    d, start, length = narrowed(x, dim, start, length)
    starts, stops = [0] * x.ndim, list(x.shape)
    starts[d], stops[d] = start, start + length
    return slice_(x, starts, stops, [1] * x.ndim)


@takes_axis
@_a_view(_reshaped_back, _reshaped_strides)
def unsqueeze(input, dim):
    x = as_tensor(input)
    d = canon_dim(dim, x.ndim + 1, "unsqueeze")
    return reshape(x, x.shape[:d] + (1,) + x.shape[d:])


@takes_axis
@_a_view(_reshaped_back, _reshaped_strides)
def squeeze(input, dim=None):
    x = as_tensor(input)
    if dim is None:
        dims = {i for i, s in enumerate(x.shape) if s == 1}
    else:
        dims = {canon_dim(d, x.ndim, "squeeze") for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
        dims = {d for d in dims if x.ndim and x.shape[d] == 1}  # (a 0-d tensor's dim 0 or -1: nothing to drop)
    return reshape(x, tuple(s for i, s in enumerate(x.shape) if i not in dims))


@_a_view(_reshaped_back, _reshaped_strides)
def flatten(input, start_dim=0, end_dim=-1):
    x = as_tensor(input)
    if x.ndim == 0:
        canon_dim(start_dim, 0, "flatten"), canon_dim(end_dim, 0, "flatten")
        return reshape(x, (1,))
    a, b = canon_dim(start_dim, x.ndim, "flatten"), canon_dim(end_dim, x.ndim, "flatten")
    if a > b:
        fail(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    return reshape(x, x.shape[:a] + (math.prod(x.shape[a:b + 1]),) + x.shape[b + 1:])


@_a_view(_reshaped_back, _reshaped_strides)
def unflatten(input, dim, sizes):
    x = as_tensor(input)
    needs_a_dim(x, "unflatten")
    d = canon_dim(dim, x.ndim, "unflatten")
    sizes = tuple(sizes)
    if -1 not in sizes and math.prod(sizes) != x.shape[d]:
        fail(f"unflatten: sizes {list(sizes)} must multiply to dim {dim}'s size {x.shape[d]}, got {math.prod(sizes)}")
    return reshape(x, x.shape[:d] + _shape_args(tuple(sizes), "unflatten") + x.shape[d + 1:]) if -1 not in sizes \
        else reshape(x, x.shape[:d] + tuple(sizes) + x.shape[d + 1:])


@_a_view(_split_back)
def split(tensor, split_size_or_sections, dim=0):
    x = as_tensor(tensor)
    d, sizes = split_sizes(x, split_size_or_sections, dim)
    out, start = [], 0
    for s in sizes:
        out.append(narrow(x, d, start, s))
        start += s
    return tuple(out)


def split_sizes(x, split_size_or_sections, dim):
    """split's (dim, [size of each piece]) for x (a Tensor or an eager array), checked as torch's."""
    needs_a_dim(x, "split")
    d = canon_dim(dim, x.ndim, "split")
    n = x.shape[d]
    if isinstance(split_size_or_sections, (int, np.integer)):
        size = int(split_size_or_sections)
        if size <= 0:
            fail(f"split: split_size must be positive, got {size}")
        sizes = [size] * (n // size) + ([n % size] if n % size else [])
    elif isinstance(split_size_or_sections, (list, tuple)) and all(
            isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in split_size_or_sections):
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != n:
            fail(f"split: sections {sizes} add up to {sum(sizes)}, not the {n} of dim {dim}")
    else:
        fail(f"split: split_size_or_sections is a whole number or a list of them, got {split_size_or_sections!r}")
    return d, sizes


@_a_view(_chunk_back)
def chunk(input, chunks, dim=0):
    x = as_tensor(input)
    d, size = chunk_size(x, chunks, dim)
    if size == 0:  # (torch's: as many empty chunks as asked for)
        return tuple(narrow(x, d, 0, 0) for _ in range(chunks))
    return split(x, size, d)


def chunk_size(x, chunks, dim):
    """chunk's (dim, size of each chunk but the last; 0 for an empty dim, which torch cuts into
    `chunks` empty chunks) for x, checked as torch's."""
    needs_a_dim(x, "chunk")
    d = canon_dim(dim, x.ndim, "chunk")
    if not isinstance(chunks, (int, np.integer)) or isinstance(chunks, bool) or chunks <= 0:
        fail(f"chunk: chunks must be a positive whole number, got {chunks!r}")
    return d, (max(1, -(-x.shape[d] // chunks)) if x.shape[d] else 0)


@_a_view(_unbound_back, _unbound_strides)
def unbind(input, dim=0):
    x = as_tensor(input)
    needs_a_dim(x, "unbind")
    d = canon_dim(dim, x.ndim, "unbind")
    return tuple(squeeze(t, d) for t in split(x, 1, d))


@takes_axis
def cat(tensors, dim=0):
    if isinstance(tensors, Tensor) or isinstance(dim, Tensor):
        fail(f"cat takes its tensors as one list or tuple: cat([a, b], dim), as torch's")
    ts = [as_tensor(t) for t in tensors]
    if not ts:
        fail("cat: needs at least one tensor")
    if any(t.ndim == 0 for t in ts):
        fail("cat: zero-dimensional tensors cannot be concatenated; use mica.stack, or unsqueeze them first")
    dt = result_type(*ts)
    ts = [to(t, dt) for t in ts]
    d = canon_dim(dim, ts[0].ndim, "cat")
    ts = [t for t in ts if t.shape[d] or len(ts) == 1] or ts[:1]
    if len(ts) == 1:
        return Tensor(ts[0].value, ts[0]._ctx)  # (a handle of its own: torch's cat is a new tensor)
    return emit("concat", ts, axis=d)


concat = concatenate = cat


def pad(input, pad, mode="constant", value=None):
    """torch.nn.functional.pad: `pad` gives (before, after) counts from the last dim backwards; in
    constant mode a negative count cuts instead; reflect, replicate and circular pad the last one to
    three dims of an (N, C, ...) or (C, ...) tensor, as torch's."""
    x = as_tensor(input)
    if mode not in ("constant", "reflect", "replicate", "circular"):
        fail(f"pad: mode {mode!r} is not one of torch's; use 'constant', 'reflect', 'replicate' or 'circular'")
    pad = [int(p) for p in pad]
    if mode != "constant":
        return _pad_from_edges(x, pad, mode, value)
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        fail(f"pad: {len(pad)} counts do not pair up over at most the tensor's {x.ndim} dims")
    before, after = [0] * x.ndim, [0] * x.ndim
    for k in range(len(pad) // 2):
        before[x.ndim - 1 - k], after[x.ndim - 1 - k] = pad[2 * k], pad[2 * k + 1]
    for d in range(x.ndim):  # (negative counts: torch cuts)
        cut_lo, cut_hi = max(0, -before[d]), max(0, -after[d])
        if cut_lo or cut_hi:
            if cut_lo + cut_hi > x.shape[d]:
                fail(f"pad: cutting {cut_lo + cut_hi} from dim {d} of size {x.shape[d]}")
            x = narrow(x, d, cut_lo, x.shape[d] - cut_lo - cut_hi)
    before, after = [max(0, b) for b in before], [max(0, a) for a in after]
    if not any(before) and not any(after):
        return Tensor(x.value, x._ctx)
    shape = tuple(n + b + a for n, b, a in zip(x.shape, before, after))
    out = pad_into(x, shape, before, [1] * x.ndim)
    if value:
        from .core import full

        inside = pad_into(full(x.shape, True, dtype=dtypes.bool_), shape, before, [1] * x.ndim)
        out = where(inside, out, as_tensor(value, x.dtype))
    return out


@copies
def repeat_interleave(input, repeats, dim=None):
    """Each element repeated `repeats` times in place along dim (the flattened tensor without one),
    as torch's: an int count, or one count per element given as ints."""
    x = as_tensor(input)
    if dim is None:
        x, dim = reshape(x, (-1,)), 0
    d = canon_dim(dim, x.ndim, "repeat_interleave")
    if isinstance(repeats, Tensor):
        fail("repeat_interleave: counts as a Tensor make a shape from data; give an int or a list of ints")
    if isinstance(repeats, (int, np.integer)) and not isinstance(repeats, bool):
        r = int(repeats)
        if r < 0:
            fail(f"repeat_interleave: repeats must be 0 or more, got {r}")
        y = unsqueeze(x, d + 1)
        y = expand(y, x.shape[:d + 1] + (r,) + x.shape[d + 1:])
        return reshape(y, x.shape[:d] + (x.shape[d] * r,) + x.shape[d + 1:])
    counts = [int(c) for c in repeats]
    if len(counts) != x.shape[d] or min(counts, default=0) < 0:
        fail(f"repeat_interleave: {len(counts)} counts for dim {d} of size {x.shape[d]}; give one count (0 or "
             "more) per element")
    return cat([narrow(x, d, i, 1) for i, c in enumerate(counts) for _ in range(c)] or [narrow(x, d, 0, 0)], d)


@takes_axis
def stack(tensors, dim=0):
    if isinstance(tensors, Tensor) or isinstance(dim, Tensor):
        fail(f"stack takes its tensors as one list or tuple: stack([a, b], dim), as torch's")
    ts = [as_tensor(t) for t in tensors]
    if not ts:
        fail("stack: needs at least one tensor")
    if len({t.shape for t in ts}) != 1:
        fail("stack: tensors must have one shape, got " + ", ".join(repr(t.value.spec) for t in ts))
    d = canon_dim(dim, ts[0].ndim + 1, "stack")
    return cat([unsqueeze(t, d) for t in ts], d)


@copies
def repeat(input, *sizes):
    x = as_tensor(input)
    sizes = _shape_args(sizes, "repeat")
    if any(s < 0 for s in sizes):
        fail(f"repeat: the counts {list(sizes)} must be 0 or more")
    if len(sizes) < x.ndim:
        fail(f"repeat: {list(sizes)} has fewer dims than the tensor's {x.ndim}")
    x = reshape(x, (1,) * (len(sizes) - x.ndim) + x.shape)
    inter = reshape(x, tuple(v for s in x.shape for v in (1, s)))
    big = expand(inter, tuple(v for r, s in zip(sizes, x.shape) for v in (r, s)))
    return reshape(big, tuple(r * s for r, s in zip(sizes, x.shape)))


def tensor_split(input, indices_or_sections=None, dim=0, **given):
    """torch.tensor_split: n pieces whose sizes differ by at most one (the first size % n a row
    longer), or the pieces between the given indices (views, as split's); torch's keywords
    sections=, indices= and tensor_indices_or_sections= too."""
    x = as_tensor(input)
    d, bounds = tensor_split_bounds(x, tensor_split_cut(indices_or_sections, given), dim)
    return tuple(narrow(x, d, a, b - a) for a, b in bounds)


def tensor_split_cut(indices_or_sections, given):
    """The cut torch's tensor_split overloads name: positionally, or as sections=, indices= or
    tensor_indices_or_sections= (one of them)."""
    names = ("sections", "indices", "tensor_indices_or_sections")
    unknown = [k for k in given if k not in names]
    if unknown:
        fail(f"tensor_split() got an unexpected keyword argument {unknown[0]!r}; it takes indices_or_sections (or "
             "torch's sections=, indices=, tensor_indices_or_sections=) and dim")
    cuts = ([] if indices_or_sections is None else [indices_or_sections]) + [given[k] for k in names if k in given]
    if len(cuts) != 1:
        fail("tensor_split: give the sections or the indices once (positionally, or as sections= or indices=)")
    return cuts[0]


def tensor_split_bounds(x, indices_or_sections, dim):
    """tensor_split's (dim, [(start, stop) of each piece]) for x (a Tensor or an eager array)."""
    needs_a_dim(x, "tensor_split")
    d = canon_dim(dim, x.ndim, "tensor_split")
    size, cut = x.shape[d], indices_or_sections
    if isinstance(cut, np.ndarray) and cut.dtype.kind in "iu" and cut.ndim <= 1:  # (a host tensor of ints: torch's too)
        cut = int(cut) if cut.ndim == 0 else [int(i) for i in cut]
    if isinstance(cut, Tensor):
        fail("tensor_split: indices_or_sections as a traced Tensor would make shapes from data; give an int or a "
             "list of ints")
    if isinstance(cut, (int, np.integer)) and not isinstance(cut, bool):
        if cut <= 0:
            fail(f"tensor_split: the number of sections must be positive, got {int(cut)}")
        n = int(cut)
        sizes = [size // n + (1 if i < size % n else 0) for i in range(n)]
        bounds = [(builtins.sum(sizes[:i]), builtins.sum(sizes[:i + 1])) for i in range(n)]
    elif isinstance(cut, (list, tuple)) and builtins.all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in cut):
        at = [0] + [builtins.min(builtins.max(int(i) + size if i < 0 else int(i), 0), size) for i in cut] + [size]
        bounds = list(zip(at, at[1:]))  # (x[a:b] as Python slices them: an index below the one before gives 0)
    else:
        fail(f"tensor_split: indices_or_sections is an int or a list of ints, got {cut!r}")
    return d, [(a, builtins.max(a, b)) for a, b in bounds]


def diag_embed(input, offset=0, dim1=-2, dim2=-1):
    """torch.diag_embed: each last-dim vector of input on a diagonal (`offset` above the main one)
    of a new square matrix whose two dims are dim1 and dim2 of the result; 0 elsewhere."""
    x = as_tensor(input)
    needs_a_dim(x, "diag_embed")
    for what, v in (("offset", offset), ("dim1", dim1), ("dim2", dim2)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            fail(f"diag_embed: {what} must be an int, got {v!r}")
    d1, d2 = canon_dim(dim1, x.ndim + 1, "diag_embed"), canon_dim(dim2, x.ndim + 1, "diag_embed")
    if d1 == d2:
        fail(f"diag_embed: dim1 and dim2 name one dim ({d1}); give two different dims")
    k = abs(int(offset))
    m = x.shape[-1] + k
    r = reshape(emit("iota", [], n=m, dtype=dtypes.int64), (m, 1))
    c = reshape(emit("iota", [], n=m, dtype=dtypes.int64), (1, m))
    on = (c - r) == int(offset)
    vals = pad(x, (0, k)) if k else x  # (a row's value for offset >= 0, a column's below)
    vals = unsqueeze(vals, -1) if offset >= 0 else unsqueeze(vals, -2)
    out = where(on, vals, False if x.dtype is dtypes.bool_ else 0)
    return movedim(out, (-2, -1), (d1, d2))


def tensordot(a, b, dims=2):
    """torch.tensordot: the sum over the last `dims` dims of a against the first `dims` of b, or
    over the dims paired by dims = (a's dims, b's dims); a's other dims then b's."""
    from .nn import matmul

    a, b = as_tensor(a), as_tensor(b)
    if isinstance(dims, (int, np.integer)) and not isinstance(dims, bool):
        if not 0 <= dims <= builtins.min(a.ndim, b.ndim):
            fail(f"tensordot: dims must be 0 to {builtins.min(a.ndim, b.ndim)} for {a.value.spec!r} and "
                 f"{b.value.spec!r}, got {int(dims)}")
        da, db = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    elif isinstance(dims, (list, tuple)) and len(dims) == 2 and all(isinstance(d, (list, tuple)) for d in dims):
        da, db = (list(d) for d in dims)
        if len(da) != len(db):
            fail(f"tensordot: dims pairs {len(da)} dims of a with {len(db)} of b; give as many of each")
        da = [canon_dim(d, a.ndim, "tensordot") for d in da]
        db = [canon_dim(d, b.ndim, "tensordot") for d in db]
        if len(set(da)) != len(da) or len(set(db)) != len(db):
            fail(f"tensordot: dims {dims!r} names a dim twice; name each dim of a and of b once")
    else:
        fail(f"tensordot: dims is an int or a pair of dim lists ([a's dims], [b's dims]), got {dims!r}")
    for i, j in zip(da, db):
        if a.shape[i] != b.shape[j]:
            fail(f"tensordot: a's dim {i} ({a.shape[i]}) and b's dim {j} ({b.shape[j]}) are paired but differ")
    keep_a = [i for i in range(a.ndim) if i not in da]
    keep_b = [j for j in range(b.ndim) if j not in db]
    n = math.prod(a.shape[i] for i in da)
    left = reshape(permute(a, *(keep_a + da)), (math.prod(a.shape[i] for i in keep_a), n))
    right = reshape(permute(b, *(db + keep_b)), (n, math.prod(b.shape[j] for j in keep_b)))
    return reshape(matmul(left, right), tuple(a.shape[i] for i in keep_a) + tuple(b.shape[j] for j in keep_b))


def _triangle(x, diagonal, lower):
    x = as_tensor(x)
    if x.ndim < 2:
        fail(f"{'tril' if lower else 'triu'}: needs at least 2 dims, got {x.value.spec!r}")
    rows, cols = x.shape[-2:]
    r = reshape(emit("iota", [], n=rows, dtype=dtypes.int64), (rows, 1))
    c = reshape(emit("iota", [], n=cols, dtype=dtypes.int64), (1, cols))
    keep = (c - r <= diagonal) if lower else (c - r >= diagonal)
    return where(keep, x, False if x.dtype is dtypes.bool_ else 0)  # the input's dtype, as torch keeps it


def tril(input, diagonal=0):
    return _triangle(input, diagonal, True)


def triu(input, diagonal=0):
    return _triangle(input, diagonal, False)


def eye(n, m=None, dtype=None, **_device):
    """Identity matrix [n, m]; outside a trace a numpy array."""
    from .core import in_trace

    m = n if m is None else m
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0 for v in (n, m)):
        fail(f"eye: n and m are sizes, 0 or more, got {n!r} and {m!r}")
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.DEFAULT_FLOAT
    if not in_trace():
        return np.eye(n, m, dtype=dt.np_storage)
    r = reshape(emit("iota", [], n=n, dtype=dtypes.int64), (n, 1))
    c = reshape(emit("iota", [], n=m, dtype=dtypes.int64), (1, m))
    return to(r == c, dt)


def outer(input, vec2):
    a, b = as_tensor(input), as_tensor(vec2)
    if a.ndim != 1 or b.ndim != 1:
        fail(f"outer: needs two 1-d tensors, got {a.value.spec!r} and {b.value.spec!r}")
    return reshape(a, (-1, 1)) * reshape(b, (1, -1))


ger = outer


# ---- indexing ------------------------------------------------------------------------------------

def getitem(x, index):
    """Basic indexing (ints, slices with positive steps, None, True/False, ...), which views x as
    torch's does, and one list of ints or of bools (a mask along one dim), or integer Tensors
    (verbs/positions.py), which copy."""
    index = _ranges_as_lists(index)
    if any(isinstance(it, Tensor) for it in (index if isinstance(index, tuple) else (index,))):
        from .positions import tensor_index

        return tensor_index(x, index)
    plan = _index_plan(x, index)
    y = _basic(x, plan)
    if plan.pick is None:
        return link_view(x, y, lambda b: getitem(b, index), lambda v, b: _indexed_back(v, b, index),
                         _indexed_strides(x, plan) if isinstance(x, Tensor) else None)
    axis, idx = plan.pick
    return cat([narrow(y, axis, i, 1) for i in idx], axis) if idx else narrow(y, axis, 0, 0)


def setitem(x, index, value):
    """x[index] = value, as torch's: value (broadcast to the indexed shape, cast to x's type) is
    written into x's elements, and so into every tensor sharing them. A bool Tensor of x's shape as
    the index is masked_fill's mask."""
    index = _ranges_as_lists(index)
    if isinstance(index, Tensor) and index.dtype.kind == "int" or isinstance(index, tuple) and any(
            isinstance(it, Tensor) for it in index):
        from .positions import tensor_index_put

        return tensor_index_put(x, index, value)
    if isinstance(index, Tensor):
        if index.dtype is not dtypes.bool_ or tuple(index.shape) != tuple(x.shape[:index.ndim]) or not index.ndim:
            fail(f"x[index] = value takes a Tensor index as integer positions, or as a bool mask of x's shape "
                 f"{list(x.shape)} or of its leading dims (torch's), got {index.value.spec!r}; for other masks use "
                 "mica.where")
        from .core import masked_fill

        value = as_tensor(value, x.dtype) if not isinstance(value, Tensor) else value
        if value.numel() == 1 and index.shape == x.shape:
            return x._rebind(masked_fill(x, index, reshape(value, ())))
        return x._rebind(_masked_put(x, index, value))
    plan = _index_plan(x, index)
    if plan.empty:
        return x  # (an index with False selects nothing)
    if plan.pick is None:
        view = getitem(x, index)
        new = expand(_value_for(value, x, view.ndim), view.shape)
        return x._rebind(new) if view is x else view._rebind(new)
    axis, idx = plan.pick
    whole = tuple(slice(None) if k == plan.list_at else it for k, it in enumerate(plan.index))
    view = getitem(x, whole)
    shape = list(view.shape)
    shape[axis] = len(idx)
    values = expand(_value_for(value, x, len(shape)), tuple(shape))
    last = {p: k for k, p in enumerate(idx)}  # (a position given twice takes its last value, as torch's CPU)
    new = cat([narrow(values, axis, last[p], 1) if p in last else narrow(view, axis, p, 1)
               for p in range(view.shape[axis])], axis)
    return x._rebind(new) if view is x else view._rebind(new)


def _masked_put(x, mask, value):
    """x[mask] = value for a bool mask of x's leading dims: value broadcast to one selected row (a
    number, a row), or the selected rows in order, [count, *row] (the DQN tutorial's
    `next_state_values[non_final_mask] = target_net(next_states).max(1).values`): the k-th True
    element takes row k. Its count is static where the mask's is not, so the program checks the
    mask's count when it runs (check_range's "count" mode: a sentence, as torch's shape mismatch)."""
    from ..errors import MicaError
    from .positions import cumsum, index_select

    row = tuple(x.shape[mask.ndim:])
    value = to(value, x.dtype)
    keep = reshape(mask, tuple(mask.shape) + (1,) * len(row))
    if value.ndim == len(row) + 1 and tuple(value.shape[1:]) == row and value.shape[0] >= 1:
        order = cumsum(reshape(to(mask, dtypes.int64), (-1,)), 0)
        count = emit("check_range", [narrow(order, 0, order.shape[0] - 1, 1)], bound=int(value.shape[0]),
                     ignore_index=-1, mode="count")  # (a mask of another count stops the program, as torch refuses)
        n = order.shape[0]  # (the last running count is the checked one: the check runs ahead of the gather)
        order = cat([narrow(order, 0, 0, n - 1), count], 0) if n > 1 else count
        order = (order - 1).clamp(0, value.shape[0] - 1)
        rows = reshape(index_select(value, 0, order), tuple(mask.shape) + row)
        return where(keep, rows, x)
    try:
        return where(keep, expand(_value_for(value, x, len(row)), row) if row else reshape(value, ()), x)
    except MicaError:
        if not row:
            fail(f"x[mask] = value takes one value for the masked elements, or one per selected element (a 1-d "
                 f"tensor of their count), got {value.value.spec!r}; use mica.where(mask, values, x) for a tensor of "
                 "x's shape")
        fail(f"x[mask] = value: the mask selects rows of shape {list(row)}; give one value, a row of that shape, or "
             f"one row per selected element ([count, *row]), got {value.value.spec!r}")


def _ranges_as_lists(index):
    """A range in an index is the list of its positions, as torch reads it (makemore's
    `logprobs[range(n), Yb]`)."""
    if isinstance(index, range):
        return list(index)
    if isinstance(index, tuple) and any(isinstance(it, range) for it in index):
        return tuple(list(it) if isinstance(it, range) else it for it in index)
    return index


def _value_for(value, x, ndim):
    """An assigned value in x's type, its leading dims of 1 beyond `ndim` dropped (as torch's)."""
    v = to(as_tensor(value), x.dtype)
    while v.ndim > ndim and v.shape[0] == 1:
        v = reshape(v, v.shape[1:])
    return v


class _IndexPlan:
    __slots__ = ("index", "starts", "stops", "steps", "out_shape", "pick", "list_at", "empty")


def _index_plan(x, index):
    """An index written as torch's, normalized (every dim named, ... expanded) and read: the slice
    it takes (starts, stops, steps), the result's shape, the dims False makes empty, and a list's
    (result dim, positions) with its place in the index."""
    if not isinstance(index, tuple):
        index = (index,)
    index = tuple(it.tolist() if isinstance(it, np.ndarray) else it for it in index)
    for it in index:
        if isinstance(it, Tensor):
            fail("indexing with a Tensor is not supported; use mica.where, masked_fill or embedding")
        if not (it is None or it is Ellipsis or isinstance(it, (int, np.integer, np.bool_, slice, list))):
            fail(f"cannot index with {type(it).__name__} {it!r}")
    new_dims = (bool, np.bool_)  # (None, True and False add a dim of 1, 1 and 0, as torch's)
    used = builtins.sum(1 for it in index if not (it is None or it is Ellipsis or isinstance(it, new_dims)))
    if used > x.ndim:
        fail(f"too many indices ({used}) for a tensor of {x.ndim} dims")
    if builtins.sum(1 for it in index if it is Ellipsis) > 1:
        fail("an index may hold at most one Ellipsis (...)")
    if any(it is Ellipsis for it in index):
        k = next(k for k, it in enumerate(index) if it is Ellipsis)
        index = index[:k] + (slice(None),) * (x.ndim - used) + index[k + 1:]
    else:
        index = index + (slice(None),) * (x.ndim - used)
    if builtins.sum(1 for it in index if isinstance(it, list)) > 1:
        fail("only one list index at a time is supported")

    plan = _IndexPlan()
    plan.index, plan.starts, plan.stops, plan.steps, plan.out_shape = index, [], [], [], []
    plan.pick = plan.list_at = None
    plan.empty = []
    d = 0
    for at, it in enumerate(index):
        if it is None or isinstance(it, new_dims):
            if it is not None and not it:
                plan.empty.append(len(plan.out_shape))
            plan.out_shape.append(1)
            continue
        size = x.shape[d]
        if isinstance(it, slice):
            if not all(v is None or (isinstance(v, (int, np.integer)) and not isinstance(v, bool))
                       for v in (it.start, it.stop, it.step)):
                fail(f"slice indices must be whole numbers or None, got {it.start!r}:{it.stop!r}"
                     f"{'' if it.step is None else ':' + repr(it.step)}; compute them with // or int(...)")
            b, e, s = it.indices(size)
            if s <= 0:
                fail(f"slices need a positive step, got {s}")
            e = max(e, b)
            plan.starts.append(b), plan.stops.append(e), plan.steps.append(s)
            plan.out_shape.append(len(range(b, e, s)))
        elif isinstance(it, list):
            plan.pick, plan.list_at = (len(plan.out_shape), _list_index(it, d, size)), at
            plan.starts.append(0), plan.stops.append(size), plan.steps.append(1)
            plan.out_shape.append(size)
        else:
            i = int(it)
            if not -size <= i < size:
                fail(f"index {i} is out of range for dim {d} of size {size}")
            i %= size
            plan.starts.append(i), plan.stops.append(i + 1), plan.steps.append(1)
        d += 1
    return plan


def _indexed_strides(x, plan):
    """The strides of a basic index's view: an int drops its dim, a slice's step multiplies its
    stride, None and True/False add a dim."""
    st, out, d = strides_of(x), [], 0
    for it in plan.index:
        if it is None or isinstance(it, (bool, np.bool_)):
            out.append(0)
            continue
        if isinstance(it, slice):
            out.append(st[d] * plan.steps[d])
        d += 1
    return tuple(out)


def _basic(x, plan):
    """The slice a plan takes, in the result's shape (before a list's pick)."""
    y = reshape(slice_(x, plan.starts, plan.stops, plan.steps), tuple(plan.out_shape))
    for axis in plan.empty:
        y = narrow(y, axis, 0, 0)
    return y


def _indexed_back(v, b, index):
    plan = _index_plan(b, index)
    if plan.empty:
        return b
    counts = [len(range(st, sp, stp)) for st, sp, stp in zip(plan.starts, plan.stops, plan.steps)]
    return _splice(b, reshape(v, tuple(counts)), plan.starts, plan.steps)


def _list_index(it, d, size):
    """The positions a list index picks along dim d of the given size: ints, or bools as a mask."""
    try:
        a = np.array(it)
    except ValueError:
        a = None
    if a is not None and a.ndim > 1:  # (torch 2 reads x[[[0, 1], [2, 0]]] as x[[0, 1], [2, 0]], and warns that
        fail("a list of lists as an index is read one way by torch 2 and another by later versions; "  # it will not)
             "index one dim at a time, with one list of ints or bools")
    if a is None or a.dtype == object or (a.size and a.dtype.kind not in "biu"):
        fail(f"a list index holds ints, or bools as a mask; got {it!r}")
    if a.dtype == bool:
        if a.ndim != 1 or len(a) != size:
            fail(f"a mask of {list(a.shape)} bools cannot index dim {d} of size {size}; it needs one bool per "
                 "position of that dim")
        return [int(i) for i in np.flatnonzero(a)]
    idx = [int(i) for i in a]
    for i in idx:
        if not -size <= i < size:
            fail(f"index {i} is out of range for dim {d} of size {size}")
    return [i % size for i in idx]


def broadcast_to(input, size):
    """torch.broadcast_to: expand's view to `size` (-1 keeps a dim)."""
    return expand(input, *size) if isinstance(size, (tuple, list)) else expand(input, size)


def _at_least(x, n):
    x = as_tensor(x)
    return reshape(x, (1,) * (n - x.ndim) + tuple(x.shape)) if x.ndim < n else x


def vstack(tensors):
    """torch.vstack: rows stacked, 1-d tensors as one row each."""
    return cat([_at_least(t, 2) for t in tensors], 0)


def hstack(tensors):
    """torch.hstack: concatenated along dim 1 (dim 0 for 1-d tensors)."""
    ts = [_at_least(t, 1) for t in tensors]
    return cat(ts, 0 if ts and ts[0].ndim == 1 else 1)


def meshgrid(*tensors, indexing="ij"):
    """torch.meshgrid: each 1-d tensor expanded along its own dim of the grid ('ij', torch's
    default; 'xy' swaps the first two)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"):
        fail(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    ts = [as_tensor(t) for t in tensors]
    for t in ts:
        if t.ndim > 1:
            fail(f"meshgrid: takes 0-d or 1-d tensors, got {t.value.spec!r}")
    ts = [reshape(t, (-1,)) for t in ts]
    order = list(range(len(ts)))
    if indexing == "xy" and len(ts) >= 2:
        order[0], order[1] = 1, 0
    shape = tuple(ts[i].shape[0] for i in order)
    out = []
    for k, t in enumerate(ts):
        where_ = order.index(k)
        view = reshape(t, tuple(-1 if d == where_ else 1 for d in range(len(ts))))
        out.append(expand(view, *shape))
    return tuple(out)
