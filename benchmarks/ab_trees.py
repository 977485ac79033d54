"""Did a change move the step's speed? The same compiled GPT step (bf16_profile.build: nanoGPT's
AdamW, clipping, float32 or autocast bfloat16/float16) built from two source trees, each in a
process of its own, timed in alternating rounds (the order rotating); the median of each side's
per-round mean step time, its range, and the ratio.

    .venv/bin/python benchmarks/ab_trees.py BEFORE_TREE AFTER_TREE [model=cpu] [dtype=bfloat16]
        [rounds=9] [steps=30] [threads=2] [bias=0]

(bias=1: the model with nanoGPT's `bias=True`, its linears and layer norms with biases.)

(e.g. a clone at the commit before, and this checkout: `git worktree add /tmp/before HEAD~3`)
"""
import os
import statistics
import subprocess
import sys
import time


def worker(tree, model, dtype, threads, bias):
    sys.path[:0] = [tree, os.path.join(tree, "benchmarks")]
    from bf16_profile import build
    from mica.bench.step import CONFIGS, _gpt_config

    c = CONFIGS[model]
    cfg = _gpt_config(c)
    cfg.bias = bias
    exe = build(cfg, c["batch_size"], dtype, profile=False)
    for _ in range(3):
        exe.run(threads=threads)
    print("ready", flush=True)
    for line in sys.stdin:
        n = int(line)
        t0 = time.perf_counter()
        for _ in range(n):
            exe.run(threads=threads)
        print((time.perf_counter() - t0) / n * 1e3, flush=True)


def main():
    if sys.argv[1] == "--worker":
        return worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6] == "1")
    trees = {"before": os.path.abspath(sys.argv[1]), "after": os.path.abspath(sys.argv[2])}
    args = dict(a.split("=", 1) for a in sys.argv[3:])
    model, dtype = args.get("model", "cpu"), args.get("dtype", "bfloat16")
    rounds, steps, threads = int(args.get("rounds", 9)), int(args.get("steps", 30)), args.get("threads", "2")
    bias = args.get("bias", "0")
    procs = {}
    for name, tree in trees.items():  # (each its own build cache: the two trees' sources differ)
        env = dict(os.environ, MICA_CACHE=os.path.join(os.environ.get("TMPDIR", "/tmp"), f"mica-ab-{name}"))
        procs[name] = subprocess.Popen([sys.executable, __file__, "--worker", tree, model, dtype, threads, bias],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        if procs[name].stdout.readline().strip() != "ready":
            sys.exit(f"ab_trees: the {name} tree ({tree}) did not build its step")
    times = {k: [] for k in procs}
    names = list(procs)
    for r in range(rounds):
        for k in names[r % 2:] + names[:r % 2]:
            procs[k].stdin.write(f"{steps}\n")
            procs[k].stdin.flush()
            times[k].append(float(procs[k].stdout.readline()))
    for p in procs.values():
        p.stdin.close()
        p.wait()
    print(f"{model}{', bias=True' if bias == '1' else ''}, {dtype}, {threads} threads, {rounds} rounds of {steps} steps")
    for k, v in times.items():
        print(f"{k:6s} {trees[k]}: median {statistics.median(v):.2f} ms/step ({min(v):.2f} - {max(v):.2f})")
    print(f"after / before: {statistics.median(times['after']) / statistics.median(times['before']):.3f}")


if __name__ == "__main__":
    main()
