"""Muon, as the speedrun seed writes it: momentum lerp, Nesterov blend, Newton–Schulz
orthogonalization (a configurable list of (a, b, c) coefficients, in a chosen element type),
the aspect-ratio scale, and decoupled weight decay."""
from .. import dtypes, verbs as F
from ..errors import MicaError
from .base import Optimizer, zeros_like_tree

SEED_COEFFICIENTS = ((2.0, -1.5, 0.5),) * 12          # the seed's quintic, twelve times, in bf16
QUINTIC_COEFFICIENTS = ((3.4445, -4.7750, 2.0315),) * 5  # the tuned five-step variant


def zeropower_via_newtonschulz(G, coefficients=SEED_COEFFICIENTS, dtype=dtypes.bfloat16, eps=1e-7):
    """Approximately orthogonalize G (singular values pushed toward 1)."""
    if G.ndim < 2:
        raise MicaError(f"Newton–Schulz needs a matrix, got {G.value.spec!r}")
    X = F.to(G, dtype) if dtype is not None else G
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT
    X = X / (F.norm(X, dim=(-2, -1), keepdim=True) + eps)
    for a, b, c in coefficients:
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if tall:
        X = X.mT
    return X


class Muon(Optimizer):
    defaults = dict(lr=0.02, weight_decay=0.0, mu=0.95, nesterov=True, ns_coefficients=SEED_COEFFICIENTS,
                    ns_dtype=dtypes.bfloat16)

    def _check(self, hyper, where):
        self._require(hyper, where, ("lr", "weight_decay"), "rate")
        self._require(hyper, where, ("mu",), "fraction")

    def _init(self, params):
        for n, p in params.items():
            if p.ndim != 2:
                raise MicaError(f"Muon updates matrices only; parameter {n!r} has shape {list(p.shape)}")
        return {"momentum": zeros_like_tree(params)}

    world, rank = 1, 0

    def shard(self, world, rank):
        """The seed's sharded step on rank `rank` of `world`: each group's matrices sorted by size
        (largest first, as the seed's __init__ sorts them), rank r orthogonalizes matrices r,
        r + world, ..., and the orthogonalized updates are all-gathered; every rank then applies
        every update to its own copy, so every rank holds the parameters one process computes (the
        same arithmetic on each matrix, wherever it runs). Unlike the seed, every rank keeps every
        momentum (its lerp is cheap), so that rank 0's checkpoint is one process's."""
        self.world, self.rank = world, rank
        return self

    @staticmethod
    def _orthogonalized(hyper, grad, momentum):
        update = F.lerp(grad, momentum, hyper["mu"]) if hyper["nesterov"] else momentum
        update = zeropower_via_newtonschulz(update, hyper["ns_coefficients"], hyper["ns_dtype"])
        return update * max(1, grad.size(-2) / grad.size(-1)) ** 0.5

    @staticmethod
    def _apply(hyper, lr, p, update):
        if hyper["weight_decay"] != 0:
            p = p * (1 - lr * hyper["weight_decay"])
        return F.add(p, update, alpha=-lr)

    def _update(self, params, grads, state, groups):
        moms = dict(state["momentum"])
        for hyper, names, lr in groups:
            for n in names:
                moms[n] = F.lerp(moms[n], grads[n], 1 - hyper["mu"])
            updates = self._sharded(hyper, names, params, grads, moms) if self.world > 1 else \
                {n: self._orthogonalized(hyper, grads[n], moms[n]) for n in names}
            for n in names:
                params[n] = self._apply(hyper, lr, params[n], updates[n])
        return {"momentum": moms}

    def _sharded(self, hyper, names, params, grads, moms):
        """{name: its orthogonalized update}, each computed on one rank and all-gathered."""
        from .. import distributed

        world, rank = self.world, self.rank
        order = sorted(names, key=lambda n: tuple(params[n].shape), reverse=True)  # (stable, as the seed's)
        chunks = [order[i:i + world] for i in range(0, len(order), world)]
        widths = [max(params[n].numel() for n in chunk) for chunk in chunks]
        kind = dtypes.float64 if params[order[0]].dtype is dtypes.float64 else dtypes.float32
        pieces, made = [], {}  # this rank's update of each chunk, padded to the chunk's largest matrix
        for chunk, width in zip(chunks, widths):
            if rank < len(chunk):
                n = chunk[rank]
                made[n] = self._orthogonalized(hyper, grads[n], moms[n])
                flat = [F.reshape(F.to(made[n], kind), (-1,))]
                if width > params[n].numel():
                    flat.append(F.zeros(width - params[n].numel(), dtype=kind))
                pieces.append(F.cat(flat) if len(flat) > 1 else flat[0])
            else:  # (the seed's padding: a dummy matrix)
                pieces.append(F.zeros(width, dtype=kind))
        mine = F.cat(pieces) if len(pieces) > 1 else pieces[0]
        every = distributed.all_gather(mine, world=world)
        updates, at, share = {}, 0, sum(widths)
        for chunk, width in zip(chunks, widths):
            for s, n in enumerate(chunk):
                k, start = params[n].numel(), s * share + at
                dtype = made[n].dtype if n in made else _update_dtype(hyper, params[n])
                updates[n] = made[n] if n in made else \
                    F.to(F.reshape(every[start:start + k], tuple(params[n].shape)), dtype)
            at += width
        return updates


def newton_schulz_flops(shape, steps):
    """Multiply-add FLOPs of `steps` Newton–Schulz iterations on a matrix of `shape` (in the wide
    orientation r <= c: A = X X^T, A @ A, B @ X)."""
    r, c = sorted(shape[-2:])
    return steps * (4 * r * r * c + 2 * r ** 3)


def sharding_plan(shapes, world, steps):
    """[(matrices, Newton–Schulz FLOPs, bytes all-gathered)] per rank of the seed's sharding of one
    group of {name: shape} over `world` ranks (each rank's share padded to its chunks' largest
    matrices, in float32)."""
    import math

    order = sorted(shapes, key=lambda n: tuple(shapes[n]), reverse=True)
    chunks = [order[i:i + world] for i in range(0, len(order), world)]
    gathered = 4 * world * sum(max(math.prod(shapes[n]) for n in chunk) for chunk in chunks)
    return [(len(order[r::world]), sum(newton_schulz_flops(shapes[n], steps) for n in order[r::world]), gathered)
            for r in range(world)]


def _update_dtype(hyper, p):
    """The element type Newton–Schulz leaves an update of `p` in (its ns_dtype, or p's)."""
    return hyper["ns_dtype"] if hyper["ns_dtype"] is not None else p.dtype


def muon(lr=0.02, weight_decay=0.0, mu=0.95, nesterov=True, ns_coefficients=SEED_COEFFICIENTS,
         ns_dtype=dtypes.bfloat16, param_groups=None):
    return Muon(param_groups, lr=lr, weight_decay=weight_decay, mu=mu, nesterov=nesterov,
                ns_coefficients=tuple(tuple(c) for c in ns_coefficients), ns_dtype=ns_dtype)
