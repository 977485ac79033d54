"""Before/after, side by side in one run: the compiled CPU step of two checkouts of Mica (each its
own process: PYTHONPATH=<checkout>), rounds alternating and the order rotating, median and range
of the time per step, the ratio of medians and the paired ratio (each round's NEW over its OLD).

    python benchmarks/ab_step.py OLD_CHECKOUT NEW_CHECKOUT [--config cpu] [--rounds 9] [--steps 20]
                                 [--threads N] [--clock wall|cpu] [--new_memory_budget BYTES]
                                 [--dtype float32|bfloat16|float16]

`--dtype bfloat16` (or float16) times the step under `mica.autocast(dtype=...)` (the products in
bfloat16, on the kernel the building machine takes: MICA_BF16_GEMM chooses another).

`--new_memory_budget` lowers NEW's step under that budget (its plan and rematerialization printed):
a plan that recomputes, timed against OLD's step as it was.

`--clock cpu` times the process's CPU time (with --threads 1): on a machine other work shares,
that moves far less than the wall clock.
"""
import argparse
import os
import statistics
import subprocess
import sys

SERVER = r"""
import sys, time
from mica.bench.step import CONFIGS, _gpt_config, mica_step
c = CONFIGS[sys.argv[1]]
dtype = sys.argv[4]
budget = int(sys.argv[5]) if len(sys.argv) > 5 else None
import mica
if dtype == "float32":
    exe = mica_step(_gpt_config(c), c["batch_size"], **({"memory_budget": budget} if budget else {}))
else:  # mica_step's program under autocast
    import numpy as np
    from mica.models.gpt import GPT, loss_fn
    cfg = _gpt_config(c)
    model = GPT(cfg)
    params = model.init(1337)
    opt = mica.optim.adamw(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1,
                           param_groups=mica.optim.nanogpt_param_groups(params, 0.1))
    state = opt.init(params)

    def step(p, s, x, y):
        with mica.autocast(dtype=getattr(mica, dtype)):
            loss, g = mica.value_and_grad(loss_fn(model))(p, x, y)
        mica.optim.clip_grad_norm(g, 1.0)
        p, s = opt.update(p, g, s)
        return p, s, loss

    specs = model.param_specs()
    batch = mica.i64[c["batch_size"], cfg.block_size]
    program = mica.trace(step, specs, opt.state_specs(specs), batch, batch)
    exe = program.lower("cpu", **({"memory_budget": budget} if budget else {})).build()
    x = np.random.default_rng(0).integers(0, cfg.vocab_size, (c["batch_size"], cfg.block_size))
    exe.load(params, state, x, np.roll(x, -1, axis=1))
remat = getattr(exe.lowered, "remat", None)  # (checkouts before the pass have none)
print(mica.__file__, "plan", f"{exe.lowered.plan.total:,} bytes;", remat.summary() if remat else "no remat pass",
      file=sys.stderr, flush=True)
threads = int(sys.argv[2])
clock = time.process_time if sys.argv[3] == "cpu" else time.perf_counter
for _ in range(5):
    exe.run(threads=threads)
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    t = clock()
    for _ in range(n):
        exe.run(threads=threads)
    print((clock() - t) / n, flush=True)
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--config", default="cpu")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    p.add_argument("--new_memory_budget", type=int, default=None)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    a = p.parse_args()
    sides = {}
    for name, path in (("old", a.old), ("new", a.new)):
        env = dict(os.environ, PYTHONPATH=os.path.abspath(path))
        budget = [str(a.new_memory_budget)] if name == "new" and a.new_memory_budget else []
        # run in the checkout: `python -c` puts the working folder first on sys.path, so started
        # from another checkout it would import that one's mica, whatever PYTHONPATH says
        proc = subprocess.Popen([sys.executable, "-c", SERVER, a.config, str(a.threads), a.clock, a.dtype, *budget], env=env,
                                cwd=os.path.abspath(path), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        sides[name] = proc
    times = {name: [] for name in sides}
    order = list(sides)
    for r in range(a.rounds):
        for name in order[r % 2:] + order[:r % 2]:
            proc = sides[name]
            proc.stdin.write(f"{a.steps}\n")
            proc.stdin.flush()
            times[name].append(float(proc.stdout.readline()) * 1000)
    for proc in sides.values():
        proc.stdin.close()
        proc.wait()
    med = {n: statistics.median(t) for n, t in times.items()}
    for n, t in times.items():
        print(f"{n}: median {med[n]:.2f} ms per step ({a.clock} clock, {a.threads} threads) (range {min(t):.2f}-{max(t):.2f}, {len(t)} rounds of {a.steps})")
    print(f"new / old = {med['new'] / med['old']:.3f}")
    # each round's two sides ran next to each other: their ratios cancel the drift between rounds
    paired = sorted(n / o for n, o in zip(times["new"], times["old"]))
    if len(paired) >= 4:
        q = statistics.quantiles(paired, n=4)
        print(f"paired (new / old of each round): median {statistics.median(paired):.3f}, quartiles "
              f"{q[0]:.3f}-{q[2]:.3f}, range {paired[0]:.3f}-{paired[-1]:.3f}")


if __name__ == "__main__":
    main()
