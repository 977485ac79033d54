"""Two builds of the same compiled GPT step that differ in one compiler flag, side by side in one
process: alternating rounds (the order flips every round), per-step wall and CPU time, each side's
median and range and the paired ratio B/A. The step is bf16_profile.py's (nanoGPT's AdamW, clip
1.0, autocast bf16 when asked), without the per-kernel timers.

    .venv/bin/python benchmarks/ab_flags.py model=shakespeare_char dtype=bfloat16 rounds=8 threads=1 steps=1 \
        a=-mprefer-vector-width=256 b=-mprefer-vector-width=512

Each flag replaces the build's flag of the same name before `=` (backends/c/build.py BASE_FLAGS), or
is added when the build has none.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mica.backends.c import build as build_mod  # noqa: E402
from mica.bench.step import CONFIGS, _gpt_config  # noqa: E402
from bf16_profile import build  # noqa: E402


def with_flag(flags, flag):
    name = flag.split("=", 1)[0]
    kept = [f for f in flags if f.split("=", 1)[0] != name]
    return kept + [flag]


def main():
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    c = CONFIGS[args.get("model", "shakespeare_char")]
    cfg, dtype = _gpt_config(c), args.get("dtype", "bfloat16")
    rounds, threads, steps = int(args.get("rounds", 8)), int(args.get("threads", 1)), int(args.get("steps", 1))
    base = list(build_mod.BASE_FLAGS)
    exes = {}
    for side in ("a", "b"):
        build_mod.BASE_FLAGS[:] = with_flag(base, args[side])
        exes[side] = build(cfg, c["batch_size"], dtype, profile=False)
    build_mod.BASE_FLAGS[:] = base
    for e in exes.values():  # warm-up
        e.run(threads=threads)
    wall, cpu = {s: [] for s in exes}, {s: [] for s in exes}
    for r in range(rounds):
        for s in ("a", "b") if r % 2 == 0 else ("b", "a"):
            w, t = time.perf_counter(), time.process_time()
            for _ in range(steps):
                exes[s].run(threads=threads)
            wall[s].append((time.perf_counter() - w) / steps * 1e3)
            cpu[s].append((time.process_time() - t) / steps * 1e3)
    print(f"{args.get('model', 'shakespeare_char')} {dtype}, {threads} thread(s), {rounds} rounds of {steps} "
          f"step(s), load average {os.getloadavg()[0]:.1f}")
    for s in exes:
        print(f"  {s} {args[s]}: wall median {statistics.median(wall[s]):.1f} ms "
              f"({min(wall[s]):.1f} - {max(wall[s]):.1f}), CPU median {statistics.median(cpu[s]):.1f} ms")
    for name, d in (("wall", wall), ("CPU", cpu)):
        r = sorted(b / a for a, b in zip(d["a"], d["b"]))
        print(f"  paired {name} ratio b/a: median {statistics.median(r):.3f}, range {r[0]:.3f} - {r[-1]:.3f}")


if __name__ == "__main__":
    main()
