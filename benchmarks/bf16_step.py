"""One GPT training step in process, Mica against PyTorch eager, float32 and bfloat16 (autocast on
both sides), alternating rounds; per configuration the median over rounds of the mean step's wall
time and of its CPU time (all threads; on a loaded machine the CPU time is the steadier measure of
the work). Not `mica bench` (that is the protocol: separate processes, nanoGPT's loop); this is for
the ratios on a noisy machine.

    .venv/bin/python benchmarks/bf16_step.py [model=cpu] [rounds=5] [steps=20] [threads=2] [warmup=3]
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mica.bench.step import CONFIGS, _gpt_config  # noqa: E402
from mica.bench.torch_gpt import TorchGPT  # noqa: E402
from bf16_profile import build  # noqa: E402  (the compiled step, as the profile builds it)


def mica_step(cfg, batch, dtype, threads):
    exe = build(cfg, batch, dtype, profile=False)
    return lambda: exe.run(threads=threads)


def torch_step(cfg, batch, dtype, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(1337)
    model = TorchGPT(cfg)
    opt = model.nanogpt_optimizer(0.1, 1e-3, (0.9, 0.99))
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size))
    y = torch.roll(x, -1, dims=1)

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return run


def main():
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    c = CONFIGS[args.get("model", "cpu")]
    rounds, steps, threads = int(args.get("rounds", 5)), int(args.get("steps", 20)), int(args.get("threads", 2))
    cfg = _gpt_config(c)
    runs = {(side, dt): make(cfg, c["batch_size"], dt, threads)
            for side, make in (("mica", mica_step), ("pytorch eager", torch_step))
            for dt in ("float32", "bfloat16")}
    for run in runs.values():  # warm-up
        for _ in range(int(args.get("warmup", 3))):
            run()
    wall, cpu = {k: [] for k in runs}, {k: [] for k in runs}
    keys = list(runs)
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            w, t = time.perf_counter(), time.process_time()
            for _ in range(steps):
                runs[k]()
            wall[k].append((time.perf_counter() - w) / steps * 1e3)
            cpu[k].append((time.process_time() - t) / steps * 1e3)
    print(f"model {args.get('model', 'cpu')}, {threads} threads, {rounds} rounds of {steps} steps, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| configuration | median wall ms/step | range | median CPU ms/step |")
    print("|---|---|---|---|")
    for k in keys:
        print(f"| {k[0]} {k[1]} | {statistics.median(wall[k]):.1f} | {min(wall[k]):.1f} – {max(wall[k]):.1f} | "
              f"{statistics.median(cpu[k]):.1f} |")
    m = {k: statistics.median(wall[k]) for k in keys}
    mc = {k: statistics.median(cpu[k]) for k in keys}
    for name, d in (("wall", m), ("CPU", mc)):
        print(f"{name}: Mica bf16 / PyTorch eager bf16 = {d[('mica', 'bfloat16')] / d[('pytorch eager', 'bfloat16')]:.2f}x, "
              f"Mica bf16 / Mica f32 = {d[('mica', 'bfloat16')] / d[('mica', 'float32')]:.2f}x, "
              f"PyTorch bf16 / PyTorch f32 = {d[('pytorch eager', 'bfloat16')] / d[('pytorch eager', 'float32')]:.2f}x")


if __name__ == "__main__":
    main()
