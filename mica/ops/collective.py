"""Collectives over the ranks of a data-parallel run: all_reduce, reduce_scatter, all_gather.

Every program of an N-rank run is the same program on every rank (SPMD); a collective's `world`
attribute is the N it was compiled for, and its result on each rank depends on every rank's
operands. The sums have one fixed order, never a library's implementation-defined one:

- all_reduce(x_0, ..., x_{m-1}): every rank contributes its m operands, in order; the result, on
  every rank, is the left-to-right sum over rank 0's operands, then rank 1's, ... — ((c0 + c1) +
  c2) + ... —, the same bits as one process adding the same values one by one. (A data-parallel
  step passes each micro-batch's gradient, so N ranks reproduce one process's accumulation.)
- reduce_scatter(x_0, ..., x_{m-1}): each x_j is [world * n, ...]; rank r gets block r of the same
  rank-ordered sum as all_reduce's (rank 0's operands one by one, then rank 1's, ...), so a rank's
  block holds the bits all_reduce would give it there (ZeRO-1's gradients: mica/optim/zero.py).
- all_gather(x): every rank's x, concatenated along axis 0 in rank order.

Both take uneven blocks too: `counts` (each rank's rows along axis 0) with `rank` (which rank this
program is; every rank's program is then its own): reduce_scatter's x holds sum(counts) rows and
rank r gets its counts[r]; all_gather's x is this rank's counts[rank] rows (ZeRO-1's whole tensors
per rank, mica/optim/zero.py, move without padding).

At world size 1 each is the identity (all_reduce and reduce_scatter: their operands' left-to-right
sum). The oracle
runs one process, so it computes world size 1 only. VJPs follow from each output's value being
the same function on every rank (JAX's psum rule): all_reduce's transpose is all_reduce of the
cotangent, reduce_scatter's is all_gather, all_gather's is reduce_scatter.
Backends lower them as kernel primitives: MPI on the CPU (backends/c/collectives.py), NCCL on
CUDA (backends/cuda/collectives.py).
"""
import numpy as np

from ..errors import MicaError, ShapeError
from . import KernelABI, defop


def emit(*args, **kwargs):
    from ..tensor import emit as _emit

    return _emit(*args, **kwargs)

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


def _world(op, world):
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ShapeError(f"{op}: world must be a positive count of ranks, got {world!r}")


def _float(op, x):
    if x.dtype.kind != "float":
        raise ShapeError(f"{op}: collectives move floating-point values, not {x!r}")


def _operands(op, specs, world):
    _world(op, world)
    if not specs:
        raise ShapeError(f"{op}: give at least one operand")
    for s in specs:
        _float(op, s)
        if s.shape != specs[0].shape or s.dtype is not specs[0].dtype:
            raise ShapeError(f"{op}: every operand must be {specs[0]!r}, got {s!r}")
    return specs[0]


def _all_reduce_infer(specs, world):
    x = _operands("all_reduce", specs, world)
    return [(x.shape, x.dtype)]


def _one_process(op, world):
    if world != 1:
        raise MicaError(f"{op} over {world} ranks runs only in a data-parallel trainer (mpirun -np {world}); the "
                        "oracle runs one process: trace it with world=1")


def _summed(op):
    def ref(args, at, run):
        _one_process(op, at["world"])
        acc = args[0].copy()
        for x in args[1:]:
            acc = acc + x
        return acc
    return ref


def _all_reduce_vjp(c, o, i, a, n):
    g = emit("all_reduce", [c[0]], world=a["world"])
    return [g for _ in i]


def _leading(op, x, what):
    if not x.shape:
        raise ShapeError(f"{op}: {what} needs at least one dim, got {x!r}")


def _shares(op, world, counts, rank):
    """Uneven blocks (`counts`: each rank's rows along axis 0, this being rank `rank`), or None."""
    if counts is None:
        if rank is not None:
            raise ShapeError(f"{op}: rank= goes with counts= (each rank's rows), not alone")
        return None
    if (not isinstance(counts, tuple) or len(counts) != world or
            any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in counts)):
        raise ShapeError(f"{op}: counts must be a tuple of {world} positive row counts, one per rank, got {counts!r}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world:
        raise ShapeError(f"{op}: with counts, rank must say which of the {world} ranks this program is, got {rank!r}")
    return counts


def _reduce_scatter_infer(specs, world, counts=None, rank=None):
    x = _operands("reduce_scatter", specs, world)
    _leading("reduce_scatter", x, "the scattered axis 0")
    if _shares("reduce_scatter", world, counts, rank) is not None:
        if x.shape[0] != sum(counts):
            raise ShapeError(f"reduce_scatter: axis 0 of {x!r} must hold the ranks' {sum(counts)} rows (counts)")
        return [((counts[rank], *x.shape[1:]), x.dtype)]
    if x.shape[0] % world:
        raise ShapeError(f"reduce_scatter: axis 0 of {x!r} must divide among {world} ranks")
    return [((x.shape[0] // world, *x.shape[1:]), x.dtype)]


def _all_gather_infer(specs, world, counts=None, rank=None):
    _world("all_gather", world)
    (x,) = specs
    _float("all_gather", x)
    _leading("all_gather", x, "the gathered axis 0")
    if _shares("all_gather", world, counts, rank) is not None:
        if x.shape[0] != counts[rank]:
            raise ShapeError(f"all_gather: axis 0 of {x!r} must be rank {rank}'s {counts[rank]} rows (counts)")
        return [((sum(counts), *x.shape[1:]), x.dtype)]
    return [((x.shape[0] * world, *x.shape[1:]), x.dtype)]


def _identity(op):
    def ref(args, at, run):
        _one_process(op, at["world"])
        return np.array(args[0], copy=True)
    return ref


def _same_blocks(a):
    return {k: a[k] for k in ("world", "counts", "rank") if a.get(k) is not None}


def _reduce_scatter_vjp(c, o, i, a, n):
    g = emit("all_gather", [c[0]], **_same_blocks(a))
    return [g for _ in i]


_ABI = KernelABI(may_fail=True)  # (a peer that stopped, a world of another size)

defop("all_reduce", infer=_all_reduce_infer, ref=_summed("all_reduce"), vjp=_all_reduce_vjp, family="kernel", kernel=_ABI)
defop("reduce_scatter", infer=_reduce_scatter_infer, ref=_summed("reduce_scatter"), vjp=_reduce_scatter_vjp,
      family="kernel", kernel=_ABI)
defop("all_gather", infer=_all_gather_infer, ref=_identity("all_gather"), family="kernel", kernel=_ABI,
      vjp=lambda c, o, i, a, n: [emit("reduce_scatter", [c[0]], **_same_blocks(a))])
