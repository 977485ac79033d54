"""The tutorial model's side of `mica bench --model tutorial`, run as its own process: the tutorial's
training step (mica.models.tutorial: forward, backward, clipping, cosine-scheduled AdamW) repeated
on one seeded batch, by Mica's compiled program or by PyTorch in one mode. Every `every` steps it
reads the loss (which waits for the work) and prints a line with its own clock's time since the
previous line, so the outside clock can stamp it and check the inside one.

The tutorial has no native trainer of its own: Mica's side is the compiled step driven from Python
through its C API (`exe.run`), the way a user runs what `mica.compile` builds.

    python -m mica.bench.tutorial_runner --side mica --opt_level 2 --iters 1200 --every 10
    python -m mica.bench.tutorial_runner --side torch --mode eager --iters 1200 --every 10
"""
import argparse
import dataclasses
import sys
import time

import numpy as np


def _mica_step(cfg, params, tokens, targets, opt_level, threads):
    import mica
    from ..models.tutorial import TutorialModel, make_step, specs

    model = TutorialModel(cfg)
    step, opt = make_step(model)
    exe = mica.trace(step, *specs(model, opt)).lower("cpu", opt_level=opt_level).build()
    exe.load(params, opt.init(params), tokens, targets)

    def run(it):
        exe.run(threads=threads, offset=it)  # dropout draws fresh bits each step

    return run, lambda: float(exe.results()[2]["loss"])


def _torch_step(cfg, params, tokens, targets, mode, threads):
    import torch

    from .torch_tutorial import tutorial_step

    if threads:
        torch.set_num_threads(threads)
    step = tutorial_step(cfg, params, tokens, targets, compile_mode=mode)
    last = {}

    def run(it):
        last["loss"] = step()

    return run, lambda: last["loss"]


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--side", required=True, choices=["mica", "torch"])
    p.add_argument("--mode", default="eager", choices=["eager", "default", "reduce-overhead", "max-autotune"])
    p.add_argument("--opt_level", type=int, default=2)
    p.add_argument("--iters", type=int, default=120)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from ..models.tutorial import TutorialConfig, TutorialModel

    cfg = dataclasses.replace(TutorialConfig(), steps=a.iters + 1)  # the cosine spans the whole run
    params = TutorialModel(cfg).init(a.seed)
    rng = np.random.default_rng(a.seed)
    tokens = rng.integers(0, cfg.vocab_size, (cfg.batch, cfg.seq))
    targets = rng.integers(0, cfg.vocab_size, (cfg.batch, cfg.seq))
    if a.side == "mica":
        step, loss = _mica_step(cfg, params, tokens, targets, a.opt_level, a.threads or None)
    else:
        step, loss = _torch_step(cfg, params, tokens, targets, a.mode, a.threads)
    t0 = time.perf_counter()
    for it in range(a.iters + 1):
        step(it)
        if it % a.every == 0:
            lossf = loss()  # a Python float on both sides: the work is done
            t1 = time.perf_counter()
            print(f"iter {it}: loss {lossf:.4f}, time {(t1 - t0) * 1000:.3f}ms", flush=True)
            t0 = t1
    return 0


if __name__ == "__main__":
    sys.exit(main())
