"""Collectives over the ranks of a data-parallel run, as verbs (mica/ops/collective.py defines
them). `world` is the number of ranks the program is compiled for; every rank runs the same program.

    total = mica.distributed.all_reduce([g0, g1], world=2)   # ((rank0.g0 + rank0.g1) + rank1.g0) + rank1.g1
    mine = mica.distributed.reduce_scatter(x, world=2)       # x: [2n, ...] -> [n, ...]
    mine = mica.distributed.reduce_scatter([x0, x1], world=2)  # block r of all_reduce([x0, x1])
    every = mica.distributed.all_gather(x, world=2)          # [n, ...] -> [2n, ...], rank order
"""
from .tensor import Tensor, current, emit


def _tensors(xs, verb):
    xs = [xs] if isinstance(xs, Tensor) else list(xs)
    current(verb)
    return xs


def all_reduce(tensors, world):
    """The sum, on every rank, of every rank's tensors: rank 0's in order, then rank 1's, ..."""
    return emit("all_reduce", _tensors(tensors, "distributed.all_reduce"), world=world)


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
