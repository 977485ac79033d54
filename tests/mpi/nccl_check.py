"""Run under `mpirun -np N`: the CUDA lowering of the collectives (mica_nccl.h), in the CUDA simulator
(whose NCCL is mica_cudasim_nccl.h, over MPI): each rank runs one program with the three collectives
on its own random operands and checks every result bit for bit against numpy's sums in the order
mica_nccl.h defines (rank 0's operands first, added one by one). Prints one line."""
import os
import sys

import numpy as np

import mica
from collectives_check import operands  # (this folder: the CPU lowering's check, whose operands these are)


def main():
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    # more elements than one step of the all_reduce chain (MICA_NCCL_CHUNK, 2**20): the chain is chunked
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_100_001
    for dtype, spec in ((np.float32, mica.f32), (np.float64, mica.f64)):
        def program(a, b, c, x):
            d = mica.distributed
            return d.all_reduce([a, b, c], world=world), d.reduce_scatter(x, world=world), d.all_gather(x, world=world)

        xs = (world * 7, 5)
        exe = mica.compile(program, spec[n], spec[n], spec[n], spec[xs], target="cuda", simulate=True)
        x = np.random.default_rng(2000 + rank).standard_normal(xs).astype(dtype)
        total, scattered, gathered = (np.asarray(r) for r in exe(*operands(rank, (n,), 3, dtype), x))
        want = None
        for r in range(world):
            for v in operands(r, (n,), 3, dtype):
                want = v.copy() if want is None else want + v
        every = [np.random.default_rng(2000 + r).standard_normal(xs).astype(dtype) for r in range(world)]
        block = xs[0] // world
        want_rs = every[0][rank * block:(rank + 1) * block].copy()
        for r in range(1, world):
            want_rs = want_rs + every[r][rank * block:(rank + 1) * block]
        for what, got, exp in (("all_reduce", total, want), ("reduce_scatter", scattered, want_rs),
                               ("all_gather", gathered, np.concatenate(every))):
            if got.dtype != exp.dtype or got.shape != exp.shape or got.tobytes() != exp.tobytes():
                print(f"rank {rank}: {what} {dtype.__name__} differs (max {np.max(np.abs(got - exp))})")
                sys.exit(1)
    print(f"rank {rank}: ok")


main()
