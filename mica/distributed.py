"""Collectives over the ranks of a data-parallel run, as verbs (mica/ops/collective.py defines
them). `world` is the number of ranks the program is compiled for; every rank runs the same program.

    total = mica.distributed.all_reduce([g0, g1], world=2)   # ((rank0.g0 + rank0.g1) + rank1.g0) + rank1.g1
    mine = mica.distributed.reduce_scatter(x, world=2)       # x: [2n, ...] -> [n, ...]
    mine = mica.distributed.reduce_scatter([x0, x1], world=2)  # block r of all_reduce([x0, x1])
    every = mica.distributed.all_gather(x, world=2)          # [n, ...] -> [2n, ...], rank order
"""
from . import dtypes
from .tensor import Tensor, current, emit


def _tensors(xs, verb):
    xs = [xs] if isinstance(xs, Tensor) else list(xs)
    current(verb)
    return xs


def all_reduce(tensors, world):
    """The sum, on every rank, of every rank's tensors: rank 0's in order, then rank 1's, ... For
    bfloat16 and float16 tensors the sum is one process's adding them in turn, each add rounded to
    the half type (as `a + b` of half tensors is, and as a training loop's running gradient is): the
    operands are all-gathered and added on every rank, since the collective primitive sums in
    float32 and rounds once (mica/passes/widen.py)."""
    xs = _tensors(tensors, "distributed.all_reduce")
    if xs and xs[0].dtype in dtypes.HALF:
        return _added_in_turn(xs, world)
    return emit("all_reduce", xs, world=world)


def _added_in_turn(xs, world):
    from .verbs.shape import stack

    every = emit("all_gather", [stack(xs)], world=world)  # (rank 0's operands, then rank 1's, ...)
    total = every[0]
    for i in range(1, world * len(xs)):
        total = total + every[i]
    return total


def _blocks(counts, rank):
    return {} if counts is None else {"counts": tuple(counts), "rank": rank}


def reduce_scatter(tensors, world, counts=None, rank=None):
    """Rank r's block r (along axis 0) of the rank-ordered sum of every rank's tensors: all_reduce's
    sum, in all_reduce's order, of which each rank keeps its own block. Uneven blocks: `counts`
    gives each rank's rows and `rank` this program's rank."""
    return emit("reduce_scatter", _tensors(tensors, "distributed.reduce_scatter"), world=world,
                **_blocks(counts, rank))


def all_gather(tensor, world, counts=None, rank=None):
    """Every rank's tensor, concatenated along axis 0 in rank order (uneven ones: each rank's rows
    in `counts`, this program being rank `rank`)."""
    current("distributed.all_gather")
    return emit("all_gather", [tensor], world=world, **_blocks(counts, rank))
