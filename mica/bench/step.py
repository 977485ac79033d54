"""One training step, side by side: Mica's compiled step against PyTorch eager and torch.compile.

Every configuration is warmed up, then the rounds alternate (the order rotating each round) so
drift and neighbours touch all configurations alike; each round times a window of steps and
reports the time per step. Results: medians, ranges, the ratio to PyTorch's fastest mode, and the
step's product FLOPs against the machine's measured sgemm ceiling.
"""
import math
import os
import statistics
import time

import numpy as np

import mica
from ..models.gpt import GPT, GPTConfig, loss_fn
from ..passes.schedule import Call, Gemm

CONFIGS = {
    # nanoGPT's CPU line from its README
    "cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, vocab_size=65),
    # config/train_shakespeare_char.py
    "shakespeare_char": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, vocab_size=65),
}


def step_flops(schedule):
    """Multiply-add FLOPs of every product the compiled step runs (attention's included)."""
    total = 0
    for k in schedule.kernels:
        if isinstance(k, Gemm):
            total += 2 * math.prod(k.a.shape) * k.b.shape[-1]
        elif isinstance(k, Call) and k.op in ("attention", "attention_backward"):
            q = k.inputs[0] if k.op == "attention" else k.inputs[1]
            kk = k.inputs[1] if k.op == "attention" else k.inputs[2]
            bh, L, E = math.prod(q.shape[:-2]), q.shape[-2], q.shape[-1]
            S = kk.shape[-2]
            total += (2 if k.op == "attention" else 5) * 2 * bh * L * S * E
    return total


def mica_step(cfg, batch_size, lr=1e-3, weight_decay=0.1, grad_clip=1.0, opt_level=2, profile=False,
              memory_budget=None):
    """A compiled nanoGPT step (forward, backward, clipping, AdamW) with its state resident (planned
    within `memory_budget` bytes where given)."""
    model = GPT(cfg)
    params = model.init(1337)
    opt = mica.optim.adamw(lr=lr, betas=(0.9, 0.99), weight_decay=weight_decay,
                           param_groups=mica.optim.nanogpt_param_groups(params, weight_decay))
    state = opt.init(params)

    def step(p, s, x, y):
        loss, g = mica.value_and_grad(loss_fn(model))(p, x, y)
        mica.optim.clip_grad_norm(g, grad_clip)
        p, s = opt.update(p, g, s)
        return p, s, loss

    specs = model.param_specs()
    batch = mica.i64[batch_size, cfg.block_size]
    program = mica.trace(step, specs, opt.state_specs(specs), batch, batch)
    lowered = program.lower("cpu", opt_level=opt_level, memory_budget=memory_budget)
    exe = lowered.build(profile=profile)
    rng = np.random.default_rng(0)
    x = rng.integers(0, cfg.vocab_size, (batch_size, cfg.block_size))
    exe.load(params, state, x, np.roll(x, -1, axis=1))
    return exe


def torch_step(cfg, batch_size, mode, lr=1e-3, weight_decay=0.1, grad_clip=1.0):
    import torch

    from .torch_gpt import TorchGPT

    torch.manual_seed(1337)
    model = TorchGPT(cfg)
    opt = model.nanogpt_optimizer(weight_decay, lr, (0.9, 0.99))
    fwd = torch.compile(model) if mode == "compile" else model
    x = torch.randint(0, cfg.vocab_size, (batch_size, cfg.block_size))
    y = torch.roll(x, -1, dims=1)

    def run():
        _, loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return run


def _gpt_config(c):
    """The model of a CONFIGS entry, dropout off and no biases (both sides do the same work)."""
    return GPTConfig(block_size=c["block_size"], vocab_size=c["vocab_size"], n_layer=c["n_layer"],
                     n_head=c["n_head"], n_embd=c["n_embd"], dropout=0.0, bias=False)


def sgemm_ceiling(threads, n=1024, reps=10):
    """GFLOP/s of the best of numpy/torch's BLAS on an n x n x n product: the machine's ceiling."""
    best = 0.0
    try:
        import torch

        torch.set_num_threads(threads)
        a, b = torch.randn(n, n), torch.randn(n, n)
        for _ in range(3):
            a @ b
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(reps):
                a @ b
            best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - t) / 1e9)
    except ImportError:
        pass
    return best


def tutorial_runners(modes, threads):
    """The tutorial model's step (mica.models.tutorial) on both sides, for run()."""
    import torch

    from ..models.tutorial import TutorialModel, make_step, specs
    from .torch_tutorial import tutorial_step

    model = TutorialModel()
    cfg = model.cfg
    params = model.init(0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (cfg.batch, cfg.seq))
    targets = rng.integers(0, cfg.vocab_size, (cfg.batch, cfg.seq))
    runners, exe = {}, None
    for mode in modes:
        if mode == "mica":
            step, opt = make_step(model)
            exe = mica.trace(step, *specs(model, opt)).lower("cpu").build()
            exe.load(params, opt.init(params), tokens, targets)
            runners[mode] = lambda: exe.run(threads=threads)
        else:
            step = tutorial_step(cfg, params, tokens, targets)
            runners[mode] = torch.compile(step) if mode == "compile" else step
    return runners, exe


def run(config="cpu", rounds=5, steps=20, warmup=10, threads=2, modes=("mica", "eager", "compile"), log=print):
    import torch

    torch.set_num_threads(threads)
    if config == "tutorial":
        runners, exe = tutorial_runners(modes, threads)
        return _measure(config, runners, exe, modes, rounds, steps, warmup, threads, log)
    c = CONFIGS[config]
    cfg = _gpt_config(c)
    B = c["batch_size"]
    runners = {}
    exe = None
    for mode in modes:
        t0 = time.perf_counter()
        if mode == "mica":
            exe = mica_step(cfg, B)
            runners[mode] = lambda: exe.run(threads=threads)
        else:
            runners[mode] = torch_step(cfg, B, mode)
        for _ in range(warmup):
            runners[mode]()
        log(f"{mode}: ready in {time.perf_counter() - t0:.1f} s (build/compile and {warmup} warm-up steps)")
    return _measure(config, runners, exe, modes, rounds, steps, 0, threads, log)


def _measure(config, runners, exe, modes, rounds, steps, warmup, threads, log):
    for mode in modes:
        for _ in range(warmup):
            runners[mode]()
    times = {m: [] for m in modes}
    for r in range(rounds):
        order = list(modes[r % len(modes):]) + list(modes[:r % len(modes)])
        for mode in order:
            fn = runners[mode]
            t = time.perf_counter()
            for _ in range(steps):
                fn()
            times[mode].append((time.perf_counter() - t) / steps * 1000)
        log(f"round {r + 1}: " + ", ".join(f"{m} {times[m][-1]:.1f} ms" for m in modes))
    result = {"config": config, "threads": threads, "rounds": rounds, "steps": steps, "times_ms": times}
    med = {m: statistics.median(v) for m, v in times.items()}
    result["median_ms"] = med
    torch_modes = [m for m in modes if m != "mica"]
    if "mica" in modes and torch_modes:
        fastest = min(torch_modes, key=lambda m: med[m])
        result["fastest_torch"] = fastest
        result["ratio"] = med["mica"] / med[fastest]
    if exe is not None:
        flops = step_flops(exe.lowered.schedule)
        result["product_gflop_per_step"] = flops / 1e9
        result["mica_gflops"] = flops / (med["mica"] / 1000) / 1e9
        result["sgemm_ceiling_gflops"] = sgemm_ceiling(threads)
    return result


def table(result):
    lines = [f"config {result['config']}, {result['threads']} threads, {result['rounds']} rounds x "
             f"{result['steps']} steps", "", "| configuration | median ms/step | range |", "|---|---|---|"]
    for m, v in result["times_ms"].items():
        lines.append(f"| {m} | {statistics.median(v):.3g} | {min(v):.3g} – {max(v):.3g} |")
    if "ratio" in result:
        lines.append("")
        lines.append(f"Mica / PyTorch {result['fastest_torch']} (fastest): {result['ratio']:.2f}x")
    if "mica_gflops" in result:
        lines.append(f"Mica products: {result['product_gflop_per_step']:.2f} GFLOP/step at "
                     f"{result['mica_gflops']:.0f} GFLOP/s; measured sgemm ceiling "
                     f"{result['sgemm_ceiling_gflops']:.0f} GFLOP/s "
                     f"({100 * result['mica_gflops'] / max(result['sgemm_ceiling_gflops'], 1e-9):.0f}%)")
    return "\n".join(lines)


FAMILIES = (("products", ("matmul",)), ("attention", ("attention",)), ("norms", ("layer_norm", "rms_norm")),
            ("loss", ("cross_entropy", "softmax")), ("embedding", ("embedding",)))


def family(kernel, plan):
    """The family a kernel's time is reported under (`plan`: the program's MemoryPlan, which knows
    the buffer each store lands in)."""
    from ..passes.schedule import Copy, Gemm, Loop, Reduce

    if isinstance(kernel, Gemm):
        return "products"
    if isinstance(kernel, Call):
        for fam, ops in FAMILIES:
            if any(kernel.op.startswith(o) for o in ops):
                return fam
        return "other"
    if isinstance(kernel, Loop) and any(plan.root(v.src).cls in ("parameters", "optimizer state")
                                         for v, _ in kernel.stores):
        return "optimizer"
    if isinstance(kernel, (Loop, Reduce)):
        return "elementwise"
    if isinstance(kernel, Copy):
        return "layout"
    return "other"


def profile(config="cpu", steps=20, threads=2):
    """Per-family wall time of one profiled Mica step (ms), and the same by kernel."""
    c = CONFIGS[config]
    cfg = _gpt_config(c)
    exe = mica_step(cfg, c["batch_size"], profile=True)
    for _ in range(3):
        exe.run(threads=threads)
    base = dict(exe.profile())
    for _ in range(steps):
        exe.run(threads=threads)
    fams = {}
    plan = exe.lowered.plan
    for (label, t), k in zip(exe.profile(), exe.lowered.schedule.kernels):
        ms = (t - base[label]) / steps * 1000
        fams[family(k, plan)] = fams.get(family(k, plan), 0.0) + ms
    return fams


if __name__ == "__main__":
    import json
    import sys

    args = dict(a.split("=", 1) for a in sys.argv[2:])
    res = run(config=sys.argv[1] if len(sys.argv) > 1 else "cpu", rounds=int(args.get("rounds", 5)),
              steps=int(args.get("steps", 20)), warmup=int(args.get("warmup", 10)))
    print(table(res))
    if "json" in args:
        with open(args["json"], "w") as f:
            json.dump(res, f, indent=1)


TORCH_FAMILIES = (("products", ("mm", "addmm", "bmm", "matmul", "linear")),
                  ("attention", ("scaled_dot_product", "flash_attention", "_efficient_attention", "softmax")),
                  ("norms", ("layer_norm", "rms_norm")),
                  ("loss", ("cross_entropy", "nll_loss", "log_softmax")),
                  ("embedding", ("embedding",)),
                  ("optimizer", ("_foreach", "adam", "lerp", "addcdiv", "addcmul", "sqrt_", "norm", "clip")),
                  ("elementwise", ("gelu", "add", "mul", "div", "sub", "copy", "fill", "zero", "where", "sum")))


def torch_profile(config="cpu", threads=2, mode="eager"):
    """Per-family self CPU time (ms) of one profiled PyTorch step, grouped like Mica's."""
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile

    torch.set_num_threads(threads)
    c = CONFIGS[config]
    cfg = _gpt_config(c)
    step = torch_step(cfg, c["batch_size"], mode)
    for _ in range(5):
        step()
    with tprofile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step()
    fams = {}
    for e in prof.key_averages():
        name = e.key.lower()
        fam = next((f for f, keys in TORCH_FAMILIES if any(k in name for k in keys)), "other")
        fams[fam] = fams.get(fam, 0.0) + e.self_cpu_time_total / 1000 / 3
    return fams
