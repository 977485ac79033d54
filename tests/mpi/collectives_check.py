"""Run under `mpirun -np N`: each rank runs one compiled program with the three collectives over N
ranks on its own random operands and checks every result bit for bit against numpy's sums in the
order mica_collectives.h defines (rank 0's operands first, added one by one). Prints one line."""
import os
import sys

import numpy as np

import mica


def operands(rank, shape, m, dtype):
    rng = np.random.default_rng(1000 + rank)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(m)]


def main():
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    # more elements than one chain chunk (2**18), so the chunked chain is exercised
    n, m = int(sys.argv[1]) if len(sys.argv) > 1 else 300_001, 3
    for dtype, spec in ((np.float32, mica.f32), (np.float64, mica.f64)):
        counts = tuple(40_000 + 30_001 * r for r in range(world))  # (uneven blocks of rows of 5, across chunks)

        def program(a, b, c, x, s, t, u, v, w):
            d = mica.distributed
            total = d.all_reduce([a, b, c], world=world)
            return total, d.reduce_scatter(x, world=world), d.all_gather(x, world=world), \
                d.reduce_scatter([s, t, u], world=world), d.reduce_scatter([v, w], world=world, counts=counts, rank=rank), \
                d.all_gather(v[:counts[rank]], world=world, counts=counts, rank=rank)

        shape = (n,)
        xs = (world * 7, 5)
        ss = (world * ((n + world - 1) // world),)  # (several operands: a block of the chain's sum)
        vs = (sum(counts), 5)
        prog = mica.trace(program, spec[shape], spec[shape], spec[shape], spec[xs], spec[ss], spec[ss], spec[ss],
                          spec[vs], spec[vs])
        exe = prog.lower("cpu").build()
        mine = operands(rank, shape, m, dtype)
        x = np.random.default_rng(2000 + rank).standard_normal(xs).astype(dtype)
        several = operands(rank + 500, ss, m, dtype)
        vw = operands(rank + 900, vs, 2, dtype)
        total, scattered, gathered, blocks, uneven, gathered_v = (
            np.asarray(r) for r in exe(*mine, x, *several, *vw, threads=1))
        want = None
        for r in range(world):
            for v in operands(r, shape, m, dtype):
                want = v.copy() if want is None else want + v
        every = [np.random.default_rng(2000 + r).standard_normal(xs).astype(dtype) for r in range(world)]
        block = xs[0] // world
        want_rs = every[0][rank * block:(rank + 1) * block].copy()
        for r in range(1, world):
            want_rs = want_rs + every[r][rank * block:(rank + 1) * block]
        want_blocks = None
        for r in range(world):
            for v in operands(r + 500, ss, m, dtype):
                want_blocks = v.copy() if want_blocks is None else want_blocks + v
        k = ss[0] // world
        want_v = None
        for r in range(world):
            for v in operands(r + 900, vs, 2, dtype):
                want_v = v.copy() if want_v is None else want_v + v
        at = sum(counts[:rank])
        every_v = np.concatenate([operands(r + 900, vs, 2, dtype)[0][:counts[r]] for r in range(world)])
        for what, got, exp in (("all_reduce", total, want), ("reduce_scatter", scattered, want_rs),
                               ("all_gather", gathered, np.concatenate(every)),
                               ("reduce_scatter of 3 operands", blocks, want_blocks[rank * k:(rank + 1) * k]),
                               ("uneven reduce_scatter", uneven, want_v[at:at + counts[rank]]),
                               ("uneven all_gather", gathered_v, every_v)):
            if got.dtype != exp.dtype or got.shape != exp.shape or got.tobytes() != exp.tobytes():
                print(f"rank {rank}: {what} {dtype.__name__} differs (max {np.max(np.abs(got - exp))})")
                sys.exit(1)
    print(f"rank {rank}: ok")


if __name__ == "__main__":
    main()
