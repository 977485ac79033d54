"""ZeRO-1: AdamW's state sharded over the ranks of a data-parallel step, whole tensors to a rank.

With N ranks each parameter tensor has one owner. A step then reduce-scatters the summed
gradients (each rank receives its own tensors' sums, in all_reduce's rank order: the bits one
process adds), keeps and updates AdamW's moments of its own tensors only, and all-gathers the
updated parameters, so every rank ends the step holding every parameter one process holds.

Whole tensors, not an even split of the flattened parameters: nanoGPT clips by the norm of the
per-tensor norms, so each tensor's norm must be one reduction over the whole tensor (one rank's, the
same kernel one process runs) for the bits to be one process's; a tensor also keeps its group's
hyperparameters on one rank, and the checkpoint's tensors stay whole. The price is balance: a rank
holds at least the largest tensor (GPT-2's embedding is 31% of its parameters).

Assignment: tensors sorted by size, largest first (ties in the parameters' order, a stable sort),
each to the rank holding the fewest elements so far (ties: the lowest rank) — deterministic, and
the same on every rank. On the wire a rank's tensors are flattened in the parameters' order into
one block, the ranks' blocks of uneven sizes one after another (the collectives' `counts`), so
nothing is padded (a rank that owns nothing among them sends one zero).
"""
import math

from .. import dtypes, verbs as F


class Layout:
    """Which rank owns each tensor of {name: shape} (in the parameters' order) among `world`, and
    where it lies in its owner's block (of counts[owner] elements)."""

    def __init__(self, shapes, world, owner=None):
        self.world = world
        self.shapes = {n: tuple(s) for n, s in shapes.items()}
        sizes = {n: math.prod(s) for n, s in self.shapes.items()}
        load = [0] * world
        if owner is None:
            owner = {}
            for n in sorted(sizes, key=lambda n: sizes[n], reverse=True):  # (stable: ties in the given order)
                owner[n] = min(range(world), key=lambda r: load[r])
                load[owner[n]] += sizes[n]
        else:
            for n in self.shapes:
                load[owner[n]] += sizes[n]
        self.owner = {n: owner[n] for n in self.shapes}
        self.owned = [[n for n in self.shapes if self.owner[n] == r] for r in range(world)]
        self.offset = {}
        for names in self.owned:
            at = 0
            for n in names:
                self.offset[n] = at
                at += sizes[n]
        self.elements = load
        self.counts = tuple(max(e, 1) for e in load)  # (each rank's block on the wire)
        self.starts = tuple(sum(self.counts[:r]) for r in range(world))

    def restricted(self, names):
        """The same owners for some of the tensors only (their blocks laid out afresh)."""
        return Layout({n: self.shapes[n] for n in self.shapes if n in set(names)}, self.world, self.owner)

    def block(self, tensors, rank, kind):
        """Rank `rank`'s tensors of {name: tensor}, flattened into one [counts[rank]] vector of `kind`."""
        parts = [F.reshape(_as(tensors[n], kind), (-1,)) for n in self.owned[rank]]
        if not parts:
            parts.append(F.zeros(1, dtype=kind))
        return F.cat(parts) if len(parts) > 1 else parts[0]

    def blocks(self, tensors, kind):
        """Every rank's block of {name: tensor}, in rank order: [sum(counts)], as reduce_scatter takes."""
        return F.cat([self.block(tensors, r, kind) for r in range(self.world)]) if self.world > 1 else \
            self.block(tensors, 0, kind)

    def unblock(self, flat, rank, at=0):
        """{name: tensor} of rank `rank`'s tensors from its block, which starts at `at` in `flat`."""
        out = {}
        for n in self.owned[rank]:
            start = at + self.offset[n]
            out[n] = F.reshape(flat[start:start + math.prod(self.shapes[n])], self.shapes[n])
        return out


def carrier(tensors):
    """The element type a block of these tensors travels in: float64 where one is float64, else
    float32 (a bfloat16 parameter widens exactly, and narrows back exactly)."""
    return dtypes.float64 if any(t.dtype is dtypes.float64 for t in tensors) else dtypes.float32


def _as(t, kind):
    return t if t.dtype is kind else F.to(t, kind)


def scatter_gradients(layout, rank, micro_grads):
    """{name: summed gradient} of rank `rank`'s tensors: every micro-batch's gradients (this rank's,
    in order) reduce-scattered, so each sum is all_reduce's of the same operands, bit for bit. A
    half-precision gradient (the speedrun's bfloat16 embedding) is all-reduced in its own type
    instead — one process rounds its running sum to that type at every micro-batch, which a float32
    block would not — and kept by its owner only."""
    from .. import distributed

    first = micro_grads[0]
    wide = [n for n in layout.shapes if first[n].dtype in (dtypes.float32, dtypes.float64)]
    out = {}
    if wide:
        part = layout.restricted(wide)
        kind = carrier([grads[n] for grads in micro_grads for n in wide])
        flats = [part.blocks(grads, kind) for grads in micro_grads]
        mine = distributed.reduce_scatter(flats, world=layout.world, counts=part.counts, rank=rank)
        out = {n: _as(g, first[n].dtype) for n, g in part.unblock(mine, rank).items()}
    for n in layout.shapes:  # (a collective: every rank takes part, whoever keeps the sum)
        if n not in wide:
            total = distributed.all_reduce([grads[n] for grads in micro_grads], world=layout.world)
            if layout.owner[n] == rank:
                out[n] = total
    return {n: out[n] for n in layout.owned[rank]}


def gather_parameters(layout, rank, params, updated):
    """Every parameter after a step in which this rank updated its own (`updated`): the ranks'
    updated tensors all-gathered, each rank's own kept as it computed them."""
    from .. import distributed

    kind = carrier(list(params.values()))
    every = distributed.all_gather(layout.block(updated, rank, kind), world=layout.world, counts=layout.counts,
                                   rank=rank)
    out = dict(updated)
    for r in range(layout.world):
        if r != rank:
            for n, t in layout.unblock(every, r, layout.starts[r]).items():
                out[n] = _as(t, params[n].dtype)
    return out


def gather_norms(layout, rank, norms, dtype):
    """{name: norm} of every tensor, in the parameters' order, from this rank's {name: norm} of its
    own (clipping's per-tensor norms, each computed by its tensor's owner), all-gathered."""
    from .. import distributed

    counts = tuple(max(len(names), 1) for names in layout.owned)
    mine = [F.reshape(_as(norms[n], dtype), (1,)) for n in layout.owned[rank]] or [F.zeros(1, dtype=dtype)]
    every = distributed.all_gather(F.cat(mine) if len(mine) > 1 else mine[0], world=layout.world, counts=counts,
                                   rank=rank)
    out = {}
    for n in layout.shapes:
        r = layout.owner[n]
        at = sum(counts[:r]) + layout.owned[r].index(n)
        out[n] = norms[n] if r == rank else F.reshape(every[at:at + 1], ())
    return out
