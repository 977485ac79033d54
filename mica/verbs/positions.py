"""Verbs that pick elements by position: by index tensors (gather, index_select, take_along_dim,
x[t]), by order (topk, sort, argsort, median), along a dim (cumsum, cumprod, flip, roll, unfold),
one_hot; and that write by position (x[t] = v, index_put, index_add/copy/fill, scatter, scatter_add).

Static shapes hold every result here: an index tensor's values are only known when the program
runs, so each is checked there (the program stops with a sentence on one out of range, as torch
raises) and rows are copied by the embedding kernel, whose gradient (rows summed in position
order, without atomics) is also what writes and adds rows. Orders
are computed with comparisons and first-true picks, so ties and NaNs come out as torch's sorted
CPU results do: the earlier position first, NaN as the largest value.
"""
import builtins
import collections
import math

import numpy as np

from .. import amp, dtypes
from ..tensor import Tensor, copies, emit, fail, strides_of
from .core import (add, amax, amin, argmax, as_tensor, canon_dim, div, eq, floor_divide, full, gt, logical_and,
                   logical_not, logical_or, lt, mul, ne, rounded_once, sub, tensor, to, where)
from .core import sum as _sum
from .shape import _a_view, cat, expand, flatten, narrow, pad, permute, reshape, unsqueeze

# ---- rows of a table by index ----------------------------------------------------------------------


def _checked(index, bound, negative=True):
    """An index tensor's values as int64, each checked against a dim of `bound` elements when the
    program runs: from -bound, the negative ones wrapped (x[t], take_along_dim), or from 0 (gather,
    index_select), as torch's."""
    i = as_tensor(index)
    if i.dtype.kind != "int":
        fail(f"indices must be an integer tensor (int64 or int32), got {i.value.spec!r}")
    return emit("check_range", [to(i, dtypes.int64)], bound=int(bound), ignore_index=0,
                mode="index" if negative else "positions")


_TWO32 = 2 ** 32


def _in_any_type(values, run):
    """run(v), a row kernel (the embedding or its gradient, which exist for float32 and float64), on
    values of any element type, exactly: half types through float32; integers and bools through
    float64, which holds them (an int64 as two 32-bit halves, each sum of them exact too)."""
    dt = values.dtype
    if dt in (dtypes.float32, dtypes.float64):
        return run(values)
    if dt.kind == "float":
        return to(run(to(values, dtypes.float32)), dt)
    if dt is not dtypes.int64:
        out = run(to(values, dtypes.float64))
        return ne(out, 0.0) if dt is dtypes.bool_ else to(out, dt)
    hi = floor_divide(values, _TWO32)
    lo = sub(values, mul(hi, _TWO32))
    hi, lo = (to(run(to(h, dtypes.float64)), dtypes.int64) for h in (hi, lo))
    return add(mul(hi, _TWO32), lo)


def _take(table, rows):
    """table[rows] for a 2-d table and int64 row indices in range (checked already): the embedding
    kernel (its gradient, a sum per row)."""
    return _in_any_type(table, lambda t: emit("embedding", [rows, t]))


def _positions(shape, dims, indices):
    """The flat row-major position, in the block of a tensor of `shape` that the dims `dims` make
    (in that order), of each element of the index tensors (broadcast together): sum of index *
    stride."""
    flat = None
    for k, i in enumerate(indices):
        stride = math.prod(shape[e] for e in dims[k + 1:])
        term = mul(i, stride) if stride != 1 else i
        flat = term if flat is None else add(flat, term)
    return flat


def _iota(n, ndim, at):
    """0..n-1 laid along dim `at` of `ndim` dims (size 1 elsewhere), int64."""
    shape = [1] * ndim
    shape[at] = n
    return reshape(emit("iota", [], n=n, dtype=dtypes.int64), tuple(shape))


def gather(input, dim, index, *, sparse_grad=False):
    """out[i][j][k] = input[i][index[i][j][k]][k] for dim 1 (torch's): index has input's number of
    dims, and no larger a size than input's in the other dims; its values from 0."""
    return _gather(input, dim, index, negative=False)


def _along(verb, x, d, index, negative):
    """The flat position in x of each element of `index` (x's number of dims, no larger in the
    others), which names a position along dim d, its own position in the others: gather's and
    scatter's, in index's shape."""
    if index.ndim != x.ndim:
        fail(f"{verb}: index {index.value.spec!r} needs as many dims as the input {x.value.spec!r}")
    if x.ndim == 0:
        return _checked(index, 1, negative)
    for e in range(x.ndim):
        if e != d and index.shape[e] > x.shape[e]:
            fail(f"{verb}: index {index.value.spec!r} is larger than the input {x.value.spec!r} in dim {e}; "
                 "its sizes may not exceed the input's except along dim")
    coords = [_checked(index, x.shape[d], negative) if e == d else _iota(index.shape[e], x.ndim, e) for e in range(x.ndim)]
    return expand(_positions(x.shape, tuple(range(x.ndim)), coords), index.shape)


def _gather(input, dim, index, negative):
    x, index = as_tensor(input), as_tensor(index)
    flat = _along("gather", x, canon_dim(dim, x.ndim, "gather"), index, negative)
    return reshape(_take(reshape(x, (-1, 1)), reshape(flat, (-1,))), index.shape)


def take_along_dim(input, indices, dim=None):
    x, indices = as_tensor(input), as_tensor(indices)
    if dim is None:  # (torch's: the flattened input gathered, indices from 0)
        return _gather(flatten(x), 0, flatten(indices), negative=False)
    d = canon_dim(dim, x.ndim, "take_along_dim")
    if indices.ndim != x.ndim:
        fail(f"take_along_dim: indices {indices.value.spec!r} need as many dims as the input {x.value.spec!r}")
    from ..ops.elementwise import broadcast_shapes

    shape = list(broadcast_shapes("take_along_dim", tuple(s if e != d else 1 for e, s in enumerate(x.shape)),
                                  tuple(s if e != d else 1 for e, s in enumerate(indices.shape))))
    xs, is_ = list(shape), list(shape)
    xs[d], is_[d] = x.shape[d], indices.shape[d]
    return _gather(expand(x, tuple(xs)), d, expand(indices, tuple(is_)), negative=True)


def index_select(input, dim, index):
    """input's slices along dim at the positions `index` (1-d, or 0-d) names, in its order."""
    x, index = as_tensor(input), as_tensor(index)
    if index.ndim > 1:
        fail(f"index_select: the index must be 1-d, got {index.value.spec!r}")
    d = canon_dim(dim, x.ndim, "index_select")
    if x.ndim == 0:  # (torch's: a 0-d input takes one index, the result 0-d)
        _one_index("index_select", index)
        return reshape(_select_dims(reshape(x, (1,)), (0,), [reshape(index, (-1,))], True, False), ())
    return _select_dims(x, (d,), [reshape(index, (-1,))], keep_place=True, negative=False)


def _one_index(verb, index):
    if index.numel() != 1:
        fail(f"{verb}: a 0-d input has one element, so the index holds one position, got {index.value.spec!r}")


def _rows(y, dims, indices, negative):
    """y as a table of rows, the dims the index tensors name first and flattened ((n, R)), and the
    row each element of the index tensors (broadcast to a shape S) names: (table, rows, S, the other
    dims)."""
    from ..ops.elementwise import broadcast_shapes

    checked = [_checked(i, y.shape[d], negative) for d, i in zip(dims, indices)]
    S = tuple(broadcast_shapes("index", *(i.shape for i in checked)))
    rest = [e for e in range(y.ndim) if e not in dims]
    moved = permute(y, *dims, *rest) if list(dims) + rest != list(range(y.ndim)) else y
    table = reshape(moved, (math.prod(y.shape[d] for d in dims), math.prod(y.shape[e] for e in rest)))
    return table, reshape(expand(_positions(y.shape, tuple(dims), checked), S), (-1,)), S, rest


def _select_dims(y, dims, indices, keep_place, negative=True):
    """y indexed by the index tensors `indices` (broadcast together to a shape S) along `dims`
    (in that order): S in place of those dims when `keep_place` (they were adjacent), else first."""
    table, flat, S, rest = _rows(y, dims, indices, negative)
    got = reshape(_take(table, flat), S + tuple(y.shape[e] for e in rest))
    if not keep_place or dims[0] == 0:
        return got
    k, at = len(S), dims[0]
    order = list(range(k, k + at)) + list(range(k)) + list(range(k + at, got.ndim))
    return permute(got, *order)


def tensor_index(x, index):
    """x[index] where the index holds integer Tensors (torch's advanced indexing): ints, slices,
    None and ... first, as torch's; then the Tensors, broadcast together, pick along their dims."""
    from .shape import getitem

    basic, dims, tensors, adjacent = _tensor_index_parts(x, index)
    return _select_dims(getitem(x, basic), dims, tensors, keep_place=adjacent)


# ---- order -----------------------------------------------------------------------------------------

def _isnan(x):
    return ne(x, x) if x.dtype.kind == "float" else None


def _extreme(dtype, largest):
    """The value every element is at least as large as (largest) or at most: a mask's filler."""
    if dtype.kind == "float":
        return -math.inf if largest else math.inf
    info = np.iinfo(dtype.np_storage) if dtype.kind == "int" else None
    if info is None:
        return False if largest else True
    return int(info.min) if largest else int(info.max)


def _first_true(mask, d):
    """The first position along d where mask is true, keeping the dim (int64)."""
    return argmax(to(mask, dtypes.int32), d, keepdim=True)


def topk(input, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    """The k largest (or smallest) elements along dim and their positions, largest first (NaN
    counts as the largest, as torch's); equal values in their order. Found one at a time: k rounds
    over the dim, so k is best kept small (sampling's top-k)."""
    source = as_tensor(input)
    x = to(source, dtypes.int64) if source.dtype is dtypes.bool_ else source
    if x.ndim == 0:
        x, source = reshape(x, (1,)), reshape(source, (1,))
    d = canon_dim(dim, x.ndim, "topk")
    n = x.shape[d]
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 0 <= k <= n:
        fail(f"topk: k must be an int from 0 to the dim's size {n}, got {k!r}")
    if k > 1024:
        fail(f"topk: k = {k} is more than the 1024 Mica picks (one per round); use sort for a whole order")
    nan = _isnan(x)
    positions = _iota(n, x.ndim, d)
    plain = None if nan is None else logical_not(nan)
    taken, picks = None, []
    for _ in range(int(k)):
        free = None if taken is None else logical_not(taken)
        usable = plain if free is None else (free if plain is None else logical_and(free, plain))
        keyed = x if usable is None else where(usable, x, _extreme(x.dtype, largest))
        cand = eq(x, (amax if largest else amin)(keyed, d, keepdim=True))
        cand = cand if usable is None else logical_and(cand, usable)
        if nan is not None:  # (NaNs first when largest, last when smallest)
            nans = nan if free is None else logical_and(nan, free)
            if largest:
                cand = where(_any(nans, d), nans, cand)
            else:
                cand = where(_any(cand, d), cand, nans)
        pick = _first_true(cand, d)
        picks.append(pick)
        hit = eq(positions, pick)
        taken = hit if taken is None else logical_or(taken, hit)
    if not picks:
        shape = list(x.shape)
        shape[d] = 0
        return TopkResult(full(tuple(shape), 0, dtype=source.dtype), full(tuple(shape), 0, dtype=dtypes.int64))
    indices = cat(picks, d) if len(picks) > 1 else picks[0]
    values = gather(source, d, indices)
    if as_tensor(input).ndim == 0:
        values, indices = reshape(values, ()), reshape(indices, ())
    return TopkResult(values, indices)


def _any(mask, d):
    return gt(amax(to(mask, dtypes.int32), d, keepdim=True), 0)


TopkResult = collections.namedtuple("topk", ["values", "indices"])  # (torch.return_types' names)
SortResult = collections.namedtuple("sort", ["values", "indices"])


_SORT_MOST = 2048


def argsort(input, dim=-1, descending=False, stable=False):
    """The positions that sort input along dim (equal values in their order; NaN last ascending,
    first descending, as torch's): each element's rank is counted against every other element of
    its row, so the dim is limited to 2048 elements."""
    x = as_tensor(input)
    if x.ndim == 0:
        canon_dim(dim, 0, "argsort")
        return full((), 0, dtype=dtypes.int64)
    if x.dtype is dtypes.bool_:
        x = to(x, dtypes.int64)
    d = canon_dim(dim, x.ndim, "argsort")
    n = x.shape[d]
    if n > _SORT_MOST:
        fail(f"sort: a dim of {n} elements is more than the {_SORT_MOST} Mica sorts (by counting ranks); use "
             "topk for the few largest")
    xi = unsqueeze(x, d + 1)        # element i along d
    xj = unsqueeze(x, d)            # element j along d + 1
    if x.dtype.kind == "float":
        ni, nj = ne(xi, xi), ne(xj, xj)
        before = logical_or(gt(xj, xi), logical_and(nj, logical_not(ni))) if descending else \
            logical_or(lt(xj, xi), logical_and(ni, logical_not(nj)))
        same = logical_or(eq(xj, xi), logical_and(ni, nj))
    else:
        before = gt(xj, xi) if descending else lt(xj, xi)
        same = eq(xj, xi)
    i_at = _iota(n, x.ndim + 1, d)
    j_at = _iota(n, x.ndim + 1, d + 1)
    ahead = logical_or(before, logical_and(same, lt(j_at, i_at)))
    rank = _sum(to(ahead, dtypes.int64), d + 1)  # (the place of element i in the order)
    # the element whose rank is r, for each place r
    at_place = eq(unsqueeze(rank, d + 1), _iota(n, x.ndim + 1, d + 1))  # [.., i, r, ..]
    return _sum(mul(to(at_place, dtypes.int64), i_at), d)


def sort(input, dim=-1, descending=False, stable=False):
    x = as_tensor(input)
    order = argsort(x, dim, descending)
    if x.ndim == 0:
        canon_dim(dim, 0, "sort")
        return SortResult(x, order)
    d = canon_dim(dim, x.ndim, "sort")
    return SortResult(gather(x, d, order), order)


def msort(input):
    return sort(input, 0).values


# ---- along a dim -----------------------------------------------------------------------------------

def _scan(x, d, step, fill):
    """x's running results along d (Hillis and Steele's doubling: log2 n rounds, each combining
    every element with the one `shift` places before it)."""
    n, shift = x.shape[d], 1
    while shift < n:
        widths = [0, 0] * (x.ndim - 1 - d) + [shift, 0]
        before = pad(narrow(x, d, 0, n - shift), widths, value=fill)
        x = step(x, before)
        shift *= 2
    return x


def _scan_operand(verb, input, dim, dtype):
    x = as_tensor(input)
    if dtype is not None:
        x = to(x, dtype)
    elif x.dtype.kind != "float":
        x = to(x, dtypes.int64)  # (torch's: integer and bool running sums are int64)
    else:
        (x,) = amp.float32(verb, x)
    if x.ndim == 0:
        canon_dim(dim, 0, verb)
        return x, None
    return x, canon_dim(dim, x.ndim, verb)


@copies
def cumsum(input, dim, *, dtype=None):
    x, d = _scan_operand("cumsum", input, dim, dtype)  # (a half type's running sum in float32, as torch's)
    return x if d is None else rounded_once(x, lambda v: _scan(v, d, add, 0)) if x.dtype.kind == "float" else \
        _scan(x, d, add, 0)


@copies
def cumprod(input, dim, *, dtype=None):
    x, d = _scan_operand("cumprod", input, dim, dtype)
    return x if d is None else rounded_once(x, lambda v: _scan(v, d, mul, 1)) if x.dtype.kind == "float" else \
        _scan(x, d, mul, 1)


@copies
def flip(input, dims):
    x = as_tensor(input)
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    if x.ndim == 0:  # (torch's: a 0-d tensor flips to itself along dim 0 or -1)
        [canon_dim(e, 0, "flip") for e in dims]
        return reshape(x, ())
    ds = [canon_dim(e, x.ndim, "flip") for e in dims]
    if len(set(ds)) != len(ds):
        fail(f"flip: dims {list(dims)} name a dim twice; name each once")
    for d in ds:
        n = x.shape[d]
        if n > 1:
            x = index_select(x, d, tensor(np.arange(n - 1, -1, -1), dtype=dtypes.int64))
    return x if ds else reshape(x, x.shape)


def fliplr(input):
    x = as_tensor(input)
    if x.ndim < 2:
        fail(f"fliplr needs at least 2 dims, got {x.value.spec!r}")
    return flip(x, 1)


def flipud(input):
    x = as_tensor(input)
    if x.ndim < 1:
        fail(f"flipud needs at least 1 dim, got {x.value.spec!r}")
    return flip(x, 0)


@copies
def roll(input, shifts, dims=None):
    x = as_tensor(input)
    if dims is None:
        if not isinstance(shifts, (int, np.integer)):
            fail(f"roll: without dims, shifts is one int, got {shifts!r}")
        return reshape(roll(flatten(x), shifts, 0), x.shape)
    shifts = (shifts,) if isinstance(shifts, (int, np.integer)) else tuple(shifts)
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    if len(shifts) != len(dims):
        fail(f"roll: shifts {list(shifts)} and dims {list(dims)} must be as many")
    from .core import needs_a_dim

    needs_a_dim(x, "roll")
    for s, dim in zip(shifts, dims):
        d = canon_dim(dim, x.ndim, "roll")
        n = x.shape[d]
        s = int(s) % n if n else 0
        if s:
            x = cat([narrow(x, d, n - s, s), narrow(x, d, 0, n - s)], d)
    return x


def one_hot(input, num_classes=-1):
    t = as_tensor(input)
    if t.dtype.kind != "int":
        fail(f"one_hot: the classes must be an integer tensor, got {t.value.spec!r}")
    if not isinstance(num_classes, (int, np.integer)) or num_classes < 0:
        fail("one_hot needs num_classes in a traced program (the largest class is known only when it runs); "
             "pass num_classes=C")
    t = emit("check_range", [to(t, dtypes.int64)], bound=int(num_classes), ignore_index=0, mode="classes")
    classes = reshape(emit("iota", [], n=int(num_classes), dtype=dtypes.int64), (1,) * t.ndim + (int(num_classes),))
    return to(eq(unsqueeze(t, -1), classes), dtypes.int64)


# ---- writing by index tensors ------------------------------------------------------------------------

def _spread(rows, values, n):
    """A table of n rows, row r the sum of the rows of `values` whose index in `rows` is r (0 where
    none), summed in position order: the embedding gradient's kernel (no atomics)."""
    return _in_any_type(values, lambda v: emit("embedding_backward", [v, rows], num_embeddings=int(n)))


def _put_rows(table, flat, values, accumulate):
    """table (n, R) with the rows `flat` (k positions, checked) given `values` ((k, R), or (1, R)
    when every position takes the same row): added (accumulate), or written. A position written
    twice with different rows takes their mean (torch leaves which one unspecified)."""
    n = table.shape[0]
    k = flat.shape[0]
    if accumulate:
        return add(table, _spread(flat, expand(values, (k, table.shape[1])), n))
    counts = _spread(flat, full((k, 1), 1.0, dtype=dtypes.float32), n)
    hit = gt(counts, 0.0)
    if values.shape[0] == 1 and k != 1:
        return where(hit, expand(values, table.shape), table)
    summed = _spread(flat, values, n)
    if summed.dtype.kind == "float":
        summed = div(summed, to(where(hit, counts, 1.0), summed.dtype))
    elif summed.dtype.kind == "int":  # (equal values written twice: the value itself)
        summed = floor_divide(summed, to(where(hit, counts, 1.0), summed.dtype))
    else:  # (bools: written twice, true once; a sum of two would be a bool of 2)
        summed = ne(summed, False)
    return where(hit, summed, table)


def _put_dims(y, dims, indices, value, keep_place, accumulate, negative=True):
    """y with the elements the index tensors pick along `dims` (as _select_dims) given `value`
    (broadcast to what they pick)."""
    from .shape import _value_for

    table, flat, S, rest = _rows(y, dims, indices, negative)
    rest_shape = tuple(y.shape[e] for e in rest)
    k, at = len(S), (dims[0] if keep_place else 0)
    placed = rest_shape[:at] + S + rest_shape[at:]  # (the shape y[index] has)
    v = _value_for(value, y, len(placed))
    if v.ndim > len(placed):
        fail(f"x[index] = value: a value of shape {list(v.shape)} does not fit the {list(placed)} elements indexed")
    aligned = (1,) * (len(placed) - v.ndim) + tuple(v.shape)
    v = reshape(v, aligned)
    uniform = all(s == 1 for s in aligned[at:at + k])
    if at:  # (S first, as the table's rows are)
        v = permute(v, *range(at, at + k), *range(at), *range(at + k, len(placed)))
    n_rest = math.prod(rest_shape)
    if uniform:
        rows = reshape(expand(v, (1,) * k + rest_shape), (1, n_rest))
    else:
        rows = reshape(expand(v, S + rest_shape), (math.prod(S), n_rest))
    new = reshape(_put_rows(table, flat, to(rows, y.dtype), accumulate), tuple(y.shape[d] for d in dims) + rest_shape)
    back = [0] * y.ndim
    for pos, d in enumerate(list(dims) + rest):
        back[d] = pos
    return permute(new, *back) if back != list(range(y.ndim)) else new


def _listed(it):
    """A list (or array) of integer positions beside a Tensor in an index is a Tensor of them, as
    torch reads it (`logprobs[range(n), Yb]`, `x[[0, 2], idx]`)."""
    if isinstance(it, np.ndarray) and it.dtype.kind in "iu" or isinstance(it, list) and it and builtins.all(
            isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in it):
        return as_tensor(np.asarray(it, np.int64), dtypes.int64)
    return it


def _tensor_index_parts(x, index):
    """(the basic index, the dims of y = x[basic] the Tensors index, the Tensors, whether their
    results stay in place): torch's advanced indexing, read."""
    if not isinstance(index, tuple):
        index = (index,)
    index = tuple(_listed(it) for it in index)
    for it in index:
        if isinstance(it, Tensor) and it.dtype.kind == "float":
            fail(f"tensors used as indices must be integer or bool tensors, got {it.dtype.name} (as torch says); "
                 "cast the index with .long()")
        if isinstance(it, Tensor) and it.dtype.kind != "int":
            what = "a bool Tensor (a mask)" if it.dtype is dtypes.bool_ else f"a {it.dtype.name} Tensor"
            fail(f"indexing with {what} picks a number of elements known only when the program runs, which a "
                 "static shape cannot hold; use mica.where(mask, x, 0), masked_fill, or x[mask] = value")
        if isinstance(it, list):
            fail("an index mixing a list with a Tensor is not supported; make the list a Tensor (mica.tensor(...))")
    basic, tensor_dims, tensors, out_dim = [], [], [], 0
    for it in index:
        if isinstance(it, Tensor):
            basic.append(slice(None))
            tensor_dims.append(out_dim)
            tensors.append(it)
            out_dim += 1
        elif it is Ellipsis:
            used = builtins.sum(1 for t in index if not (t is None or t is Ellipsis or isinstance(t, (bool, np.bool_))))
            basic.append(it)
            out_dim += x.ndim - used
        elif it is None or isinstance(it, (bool, np.bool_, slice)):
            basic.append(it)
            out_dim += 1
        else:
            basic.append(it)  # (an int: its dim goes)
    adjacent = tensor_dims == list(range(tensor_dims[0], tensor_dims[0] + len(tensor_dims)))
    return tuple(basic), tuple(tensor_dims), tensors, adjacent


def tensor_index_put(x, index, value, accumulate=False):
    """x[index] = value (or +=, accumulate) where the index holds integer Tensors: torch's
    index_put_, written into x and every tensor sharing its elements."""
    from .shape import getitem

    basic, dims, tensors, adjacent = _tensor_index_parts(x, index)
    y = getitem(x, basic)
    new = _put_dims(y, dims, tensors, value, adjacent, accumulate)
    return x._rebind(new) if y is x else y._rebind(new)


def index_put(input, indices, values, accumulate=False):
    """torch.index_put: a copy of input with input[indices] = values (indices a tuple of Tensors)."""
    from .shape import getitem

    x = as_tensor(input)
    basic, dims, tensors, adjacent = _tensor_index_parts(x, tuple(indices))
    y = getitem(x, basic)
    return _put_dims(y, dims, tensors, values, adjacent, accumulate)


def index_add(input, dim, index, source, *, alpha=1):
    x, index, src = as_tensor(input), as_tensor(index), as_tensor(source)
    d = canon_dim(dim, x.ndim, "index_add") if x.ndim else 0
    if index.ndim > 1:
        fail(f"index_add: the index must be 1-d, got {index.value.spec!r}")
    if not x.ndim:
        _one_index("index_add", index)
    x1 = x if x.ndim else reshape(x, (1,))
    src = src if src.ndim else reshape(src, (1,))
    want = x1.shape[:d] + (index.numel(),) + x1.shape[d + 1:]
    if src.shape != want:  # (torch's rule: source is input's shape with dim's size the index's length)
        fail(f"index_add: source must be {list(want)} (the input's shape, dim {dim} the index's length), got "
             f"{list(src.shape)}")
    if alpha != 1:
        src = mul(src, alpha)
    out = _put_dims(x1, (d,), [reshape(index, (-1,))], src, True, True, negative=False)
    return out if x.ndim else reshape(out, ())


def bincount(input, weights=None, minlength=0):
    """torch.bincount: how often each value of a 1-d non-negative int tensor occurs (weights: their
    sum). In a trace the count's length is static: minlength, which every value must stay below
    (checked when the program runs, a sentence, as an index out of range; an MoE's tokens per
    expert: bincount(indices, minlength=E))."""
    from .core import full, zeros

    x = as_tensor(input)
    if x.ndim != 1 or x.dtype.kind != "int":
        fail(f"bincount: takes a 1-d tensor of non-negative integers, got {x.value.spec!r}")
    if not isinstance(minlength, (int, np.integer)) or isinstance(minlength, bool) or minlength <= 0:
        fail(f"bincount inside a trace counts into minlength bins, which must be a positive int, got {minlength!r} "
             "(the largest value is not known when the step is traced)")
    dt = dtypes.int64 if weights is None else (as_tensor(weights).dtype if as_tensor(weights).dtype.kind == "float"
                                               else dtypes.float64)
    source = full((x.shape[0],), 1, dtype=dtypes.int64) if weights is None else to(as_tensor(weights), dt)
    return index_add(zeros((int(minlength),), dtype=dt), 0, _checked(x, minlength, negative=False), source)


def _write_along(verb, input, dim, index, values):
    x, index = as_tensor(input), as_tensor(index)
    if index.ndim > 1:
        fail(f"{verb}: the index must be 1-d, got {index.value.spec!r}")
    if x.ndim == 0:
        _one_index(verb, index)
        values = reshape(values, (1,)) if isinstance(values, Tensor) and values.ndim == 0 else values
        return reshape(_put_dims(reshape(x, (1,)), (0,), [reshape(index, (-1,))], values, True, False, False), ())
    d = canon_dim(dim, x.ndim, verb)
    return _put_dims(x, (d,), [reshape(index, (-1,))], values, True, False, negative=False)


def index_copy(input, dim, index, source):
    return _write_along("index_copy", input, dim, index, as_tensor(source))


def index_fill(input, dim, index, value):
    """torch's: index may count from the end (-size to size - 1), unlike index_copy's and index_add's."""
    x, index = as_tensor(input), as_tensor(index)
    if x.ndim and index.dtype.kind == "int":
        size = x.shape[canon_dim(dim, x.ndim, "index_fill")]
        index = where(logical_and(lt(index, 0), gt(index, -size - 1)), add(index, size), index)
    return _write_along("index_fill", x, dim, index, value)


def _scatter_plan(verb, x, dim, index, src):
    """(flat positions in x of index's elements, src's values at index's positions, as rows)."""
    index = as_tensor(index)
    flat = reshape(_along(verb, x, canon_dim(dim, x.ndim, verb) if x.ndim else 0, index, False), (-1,))
    if isinstance(src, Tensor):
        if src.ndim != x.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
            fail(f"{verb}: src {src.value.spec!r} must have index's number of dims and at least its sizes "
                 f"({index.value.spec!r})")
        src = _narrowed_to(src, index.shape)
        rows = reshape(to(src, x.dtype), (-1, 1))
    else:
        rows = reshape(as_tensor(src, x.dtype), (1, 1))
    return flat, rows


def _narrowed_to(t, shape):
    for e, n in enumerate(shape):
        if t.shape[e] != n:
            t = narrow(t, e, 0, n)
    return t


def scatter(input, dim, index, src=None, value=None, *, reduce=None):
    """torch.scatter: input with input[i][index[i][j]] = src[i][j] along dim (or one value); a
    position named twice takes the mean of its values (torch leaves which one unspecified).
    reduce='add' is scatter_add."""
    x = as_tensor(input)
    if (src is None) == (value is None):
        fail("scatter: give one of src (a Tensor, or a number) and value")
    given = src if src is not None else value
    if reduce not in (None, "add"):
        fail(f"scatter: reduce={reduce!r} is not supported; Mica scatters plain values or reduce='add'")
    flat, rows = _scatter_plan("scatter", x, dim, index, given)
    out = _put_rows(reshape(x, (-1, 1)), flat, rows, accumulate=reduce == "add")
    return reshape(out, x.shape)


def scatter_add(input, dim, index, src):
    x = as_tensor(input)
    flat, rows = _scatter_plan("scatter_add", x, dim, index, as_tensor(src))
    return reshape(_put_rows(reshape(x, (-1, 1)), flat, rows, accumulate=True), x.shape)


MedianResult = collections.namedtuple("median", ["values", "indices"])


def median(input, dim=None, keepdim=False):
    """torch's: the lower of the two middle values (no mean); with dim, (values, indices)."""
    x = as_tensor(input)
    if dim is None:
        flat = reshape(x, (-1,))
        if flat.shape[0] == 0:
            fail("median of an empty tensor has no value; torch gives NaN")
        value = reshape(median(flat, 0).values, ())
        if flat.dtype.kind != "float":
            return value
        # torch's gradient of the median of all elements: shared evenly by the elements equal to it
        # (as max()'s); the value itself unchanged (v + 0 / count)
        from .core import detach

        v = detach(value)
        ties = eq(flat, v)
        count = _sum(to(ties, flat.dtype))
        shared = add(v, div(_sum(where(ties, sub(flat, v), 0.0)), where(gt(count, 0), count, 1.0)))
        return where(_isnan(v), value, shared)
    d = canon_dim(dim, x.ndim, "median")
    if x.ndim == 0:
        return MedianResult(x, full((), 0, dtype=dtypes.int64))
    n = x.shape[d]
    indices = narrow(argsort(x, d), d, (n - 1) // 2, 1)
    nan = _isnan(x)
    if nan is not None:  # (a line holding NaN has median NaN, its first NaN, as torch's)
        indices = where(_any(nan, d), _first_true(nan, d), indices)
    values = gather(x, d, indices)
    if not keepdim:
        from .shape import squeeze

        values, indices = squeeze(values, d), squeeze(indices, d)
    return MedianResult(values, indices)


def _unfolded_back(v, b, k, dimension, size, step):
    """b with the windows' elements replaced by v's. Where windows overlap (step < size), one element
    of b is in several windows, and which of them a write changed is not in the values (a write may
    leave a value as it was, and its gradient must still flow): refused, with what to do."""
    if b.ndim == 0:
        return reshape(v, ())
    d = canon_dim(dimension, b.ndim, "unfold")
    windows = v.shape[d]
    if step < size and windows > 1:
        fail(f"an in-place step through unfold({dimension}, {size}, {step})'s windows, which overlap (step {step} < "
             f"size {size}), is not traced: one element is in several windows; write into the tensor itself (its "
             "slices), or into a .clone() of the windows")
    back = reshape(permute(v, *range(d + 1), v.ndim - 1, *range(d + 1, v.ndim - 1)),
                   b.shape[:d] + (windows * size,) + b.shape[d + 1:])
    at = np.add.outer(np.arange(windows) * step, np.arange(size)).reshape(-1)
    return index_copy(b, d, tensor(at, dtype=dtypes.int64), back)


def unfold_layout(shape, strides, d, size, step):
    """The shape and strides of unfold(d, size, step)'s windows over a tensor of this shape and
    these strides (in elements, or numpy's bytes): the windows along d, each one's elements last."""
    n = shape[d]
    return (tuple(shape[:d]) + ((n - size) // step + 1,) + tuple(shape[d + 1:]) + (size,),
            tuple(strides[:d]) + (strides[d] * step,) + tuple(strides[d + 1:]) + (strides[d],))


def _unfolded_strides(b, t, k, dimension, size, step):
    if b.ndim == 0:
        return (1,)
    return unfold_layout(b.shape, strides_of(b), canon_dim(dimension, b.ndim, "unfold"), size, step)[1]


@_a_view(_unfolded_back, _unfolded_strides)
def unfold(input, dimension, size, step):
    """torch.Tensor.unfold: the windows of `size` elements every `step` along dimension, as a new
    last dim (a view, as torch's: an in-place step on windows that do not overlap writes the input)."""
    x = as_tensor(input)
    if x.ndim == 0:  # (torch's: a 0-d tensor is one window of one element)
        canon_dim(dimension, 0, "unfold")
        if size != 1 or not isinstance(step, int) or step < 1:
            fail(f"unfold: a 0-d tensor has one window of size 1, got size {size!r} and step {step!r}")
        return reshape(x, (1,))
    d = canon_dim(dimension, x.ndim, "unfold")
    n = x.shape[d]
    if not (isinstance(size, int) and isinstance(step, int)) or size < 0 or step < 1 or size > n:
        fail(f"unfold: size {size!r} must be at most the dim's {n} elements and step {step!r} at least 1")
    windows = (n - size) // step + 1
    at = np.add.outer(np.arange(windows) * step, np.arange(size)).reshape(-1)
    picked = index_select(x, d, tensor(at, dtype=dtypes.int64))
    shape = picked.shape[:d] + (windows, size) + picked.shape[d + 1:]
    out = reshape(picked, shape)
    return permute(out, *range(d + 1), *range(d + 2, out.ndim), d + 1)



def matrix_trace(input):
    """torch.trace (torch.Tensor.trace): the sum of a matrix's diagonal, an integer one's an int64.
    (mica.trace is Mica's tracer; given a tensor, it is this.)"""
    x = as_tensor(input)
    if x.ndim != 2:
        fail(f"trace: takes a matrix (a 2-d tensor), got {x.value.spec!r}")
    return _sum(_diagonal(x, 0, 0, 1))


def _diagonal_back(v, x, k, offset=0, dim1=0, dim2=1):
    """x with its diagonal's elements replaced by v's."""
    rest, d1, d2, flat, at = _diagonal_positions(x, offset, dim1, dim2)
    written = reshape(index_copy(flat, -1, at, v), tuple(x.shape[j] for j in rest) + (x.shape[d1], x.shape[d2]))
    return permute(written, *np.argsort([*rest, d1, d2]).tolist())


def _diagonal_strides(x, t, k, offset=0, dim1=0, dim2=1):
    st = strides_of(x)
    d1, d2 = canon_dim(dim1, x.ndim, "diagonal"), canon_dim(dim2, x.ndim, "diagonal")
    return tuple(st[j] for j in range(x.ndim) if j not in (d1, d2)) + (st[d1] + st[d2],)


@_a_view(_diagonal_back, _diagonal_strides)
def diagonal(input, offset=0, dim1=0, dim2=1):
    """torch.diagonal: the elements (i, i + offset) of the dims dim1 and dim2, as the last dim (the
    others kept in order); a view, as torch's (an in-place step on it writes the input)."""
    return _diagonal(as_tensor(input), offset, dim1, dim2)


def _diagonal_positions(x, offset, dim1, dim2):
    """The dims kept, dim1 and dim2, x as (kept dims..., dim1 * dim2) and the diagonal's positions in
    that last dim."""
    if x.ndim < 2:
        fail(f"diagonal: needs at least 2 dims, got {x.value.spec!r}")
    d1, d2 = canon_dim(dim1, x.ndim, "diagonal"), canon_dim(dim2, x.ndim, "diagonal")
    if d1 == d2:
        fail(f"diagonal: dim1 and dim2 name the same dim ({dim1} and {dim2}); give two different dims")
    offset = int(offset)
    a, b = x.shape[d1], x.shape[d2]
    n = builtins.max(0, builtins.min(a, b - offset) if offset >= 0 else builtins.min(a + offset, b))
    rest = [k for k in range(x.ndim) if k not in (d1, d2)]
    flat = reshape(permute(x, [*rest, d1, d2]), tuple(x.shape[k] for k in rest) + (a * b,))
    start = offset if offset >= 0 else -offset * b  # (element (i, i + offset) of an a x b block is i (b + 1) + offset)
    return rest, d1, d2, flat, as_tensor(np.arange(n, dtype=np.int64) * (b + 1) + start)


def _diagonal(x, offset, dim1, dim2):
    _, _, _, flat, at = _diagonal_positions(x, offset, dim1, dim2)
    return index_select(flat, -1, at)


def diag(input, diagonal=0):
    """torch.diag: a 1-d input as the square matrix with it on diagonal `diagonal` (0 the main one,
    above it positive); a 2-d input's diagonal `diagonal` as 1-d."""
    from .shape import eye

    x, k = as_tensor(input), int(diagonal)
    if x.ndim == 2:
        return _diagonal(x, k, 0, 1)
    if x.ndim != 1:
        fail(f"diag: takes a 1-d or 2-d input, got {x.value.spec!r}")
    from .core import where, zeros_like

    row = expand(unsqueeze(x, 0), (x.shape[0], x.shape[0]))  # (chosen, not multiplied: an inf stays off the rest)
    square = where(eye(x.shape[0], dtype=dtypes.bool_), row, zeros_like(row))
    return square if k == 0 else pad(square, (k, 0, 0, k) if k > 0 else (0, -k, -k, 0))


def _triangle_indices(verb, row, col, offset, lower, dtype=None):
    import numpy as _np

    for name, v in (("row", row), ("col", col)):
        if not isinstance(v, (int, _np.integer)) or v < 0:
            fail(f"{verb}: {name} must be an int, 0 or more, got {v!r}")
    r, c = _np.tril_indices(row, offset, col) if lower else _np.triu_indices(row, offset, col)
    return tensor(_np.stack([r, c]).astype(_np.int64), dtype=dtype or dtypes.int64)


def tril_indices(row, col, offset=0, *, dtype=None, **_device):
    """torch.tril_indices: the (2, N) row and column indices of a row x col matrix's lower triangle."""
    return _triangle_indices("tril_indices", row, col, offset, True, dtype)


def triu_indices(row, col, offset=0, *, dtype=None, **_device):
    return _triangle_indices("triu_indices", row, col, offset, False, dtype)


def diff(input, n=1, dim=-1, prepend=None, append=None):
    """torch.diff: x[i + 1] - x[i] along dim, n times (bools: !=), prepend and append joined first."""
    x = as_tensor(input)
    d = canon_dim(dim, x.ndim, "diff")
    x = cat([t for t in (prepend, x, append) if t is not None], d) if prepend is not None or append is not None else x
    for _ in range(n):
        m = x.shape[d]
        if m == 0:
            break
        a, b = narrow(x, d, 1, m - 1), narrow(x, d, 0, m - 1)
        x = ne(a, b) if x.dtype is dtypes.bool_ else sub(a, b)
    return x


def logcumsumexp(input, dim):
    """torch.logcumsumexp: log of the running sum of exp along dim, by running logaddexp (no
    overflow)."""
    from .core import logaddexp

    x = as_tensor(input)
    if x.dtype.kind != "float":
        x = to(x, dtypes.DEFAULT_FLOAT)
    if x.ndim == 0:
        canon_dim(dim, 0, "logcumsumexp")
        return Tensor(x.value, x._ctx)
    return rounded_once(x, lambda v: _scan(v, canon_dim(dim, v.ndim, "logcumsumexp"), logaddexp, float("-inf")))
