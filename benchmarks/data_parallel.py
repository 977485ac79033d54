"""Data-parallel step time and the share spent in collectives (BENCHMARKS.md section 9).

    python benchmarks/data_parallel.py [--key=value ...]                 # one process
    mpirun -np 2 --oversubscribe python benchmarks/data_parallel.py ...  # two ranks

Builds `mica train`'s train program for this rank (nanoGPT's GPT, the given overrides on the
shakespeare_char config, vocabulary 65) with per-kernel timing, runs WARMUP + STEPS steps on random
tokens at --threads=1 and prints (rank 0) the median step time and the median share of it spent in
the collectives' kernels (which includes waiting for the slower rank), and the compile-time
arena bytes of this rank's train program. --zero_stage=1 measures ZeRO-1's step."""
import os
import statistics
import sys
import time

import numpy as np

from mica.train import config as config_mod
from mica.train import distributed, programs

WARMUP, STEPS = 3, int(os.environ.get("STEPS", "15"))
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


def main(overrides):
    cfg = config_mod.check_supported(config_mod.load("shakespeare_char", overrides), lambda *a: None)
    world, rank = distributed.ranks(cfg)
    model, opt, progs = programs.build(cfg, 65, world, rank)
    lowered = progs["train"].lower("cpu", opt_level=cfg["opt_level"])
    exe = lowered.build(profile=True)
    params = model.init(cfg["seed"])
    state = opt.init(params)
    rng = np.random.default_rng(rank)
    local, B, T = cfg["gradient_accumulation_steps"] // world, cfg["batch_size"], cfg["block_size"]
    x, y = rng.integers(0, 65, (2, local, B, T))
    exe.load(params, state, x, y, np.int64(0))
    walls, shares, before = [], [], 0.0
    for step in range(WARMUP + STEPS):
        t = time.perf_counter()
        exe.run(threads=1)
        wall = time.perf_counter() - t
        comm = sum(s for label, s in exe.profile() if any(c in label for c in COLLECTIVES))
        if step >= WARMUP:
            walls.append(wall)
            shares.append((comm - before) / wall)
        before = comm
    if rank == 0:
        print(f"world {world}: step {statistics.median(walls) * 1e3:.1f} ms (min {min(walls) * 1e3:.1f}), "
              f"collectives {statistics.median(shares) * 100:.1f}% of it, train arena {lowered.plan.total:,} bytes, "
              f"{len(lowered.schedule.kernels)} kernels")


main(sys.argv[1:])
