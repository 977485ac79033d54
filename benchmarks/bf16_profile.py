"""Where a bfloat16 (or float32) GPT step's time goes, kernel by kernel: the compiled step built with
-DMICA_PROFILE, per-kernel wall time over `steps` steps after warm-up, grouped by family, with the
products' FLOPs and their rate; `top=N` lists the N costliest kernels.

    .venv/bin/python benchmarks/bf16_profile.py [model=shakespeare_char] [dtype=bfloat16] [steps=3] [threads=1] [top=25]
        [half=0]   (half=1: lowered with fp_half_intermediates, the report's published half-type build)
"""
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import mica  # noqa: E402
from mica.bench.step import CONFIGS, _gpt_config, family  # noqa: E402
from mica.models.gpt import GPT, loss_fn  # noqa: E402
from mica.backends.cstyle.expr import ProductLayout  # noqa: E402
from mica.passes.schedule import Gemm  # noqa: E402


def build(cfg, batch, dtype, profile=True, half=False):
    """The compiled GPT step (nanoGPT's AdamW groups, clip 1.0; autocast bf16 when `dtype` says so),
    loaded with seed-1337 weights and one random batch; bf16_step.py times the same executable."""
    model = GPT(cfg)
    params = model.init(1337)
    opt = mica.optim.adamw(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1,
                           param_groups=mica.optim.nanogpt_param_groups(params, 0.1))
    state = opt.init(params)

    def step(p, s, x, y):
        with mica.autocast(dtype=mica.float16 if dtype == "float16" else mica.bfloat16, enabled=dtype != "float32"):
            loss, g = mica.value_and_grad(loss_fn(model))(p, x, y)
        mica.optim.clip_grad_norm(g, 1.0)
        p, s = opt.update(p, g, s)
        return p, s, loss

    specs = model.param_specs()
    tokens = mica.i64[batch, cfg.block_size]
    exe = mica.trace(step, specs, opt.state_specs(specs), tokens, tokens).lower("cpu", fp_half_intermediates=half).build(profile=profile)
    x = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, cfg.block_size))
    exe.load(params, state, x, np.roll(x, -1, axis=1))
    return exe


def main():
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    c = CONFIGS[args.get("model", "shakespeare_char")]
    dtype, steps, threads, top = args.get("dtype", "bfloat16"), int(args.get("steps", 3)), \
        int(args.get("threads", 1)), int(args.get("top", 25))
    half = args.get("half", "0") == "1"
    exe = build(_gpt_config(c), c["batch_size"], dtype, half=half)
    exe.run(threads=threads)
    base = dict(exe.profile())
    w, t = time.perf_counter(), time.process_time()
    for _ in range(steps):
        exe.run(threads=threads)
    wall, cpu = (time.perf_counter() - w) / steps * 1e3, (time.process_time() - t) / steps * 1e3
    kernels, plan = exe.lowered.schedule.kernels, exe.lowered.plan
    rows, fams = [], {}
    for (label, sec), k in zip(exe.profile(), kernels):
        ms = (sec - base[label]) / steps * 1e3
        fam = family(k, plan)
        if fam == "elementwise" and "cast" in label:
            fam = "casts"
        flops = 2 * math.prod(k.a.shape) * k.b.shape[-1] if isinstance(k, Gemm) else 0
        fams.setdefault(fam, [0.0, 0, 0])
        fams[fam][0] += ms
        fams[fam][1] += 1
        fams[fam][2] += flops
        if isinstance(k, Gemm):
            p = ProductLayout(k)
            label += f"  [{p.M}x{p.N}x{p.K} {'T' if p.ta else 'N'}{'T' if p.tb else 'N'} {k.a.dtype.name}->{k.out.dtype.name}]"
        rows.append((ms, label, fam, flops))
    print(f"{args.get('model', 'shakespeare_char')} {dtype}{' fp_half_intermediates' if half else ''}, {threads} thread(s), {steps} steps: "
          f"{wall:.1f} ms wall, {cpu:.1f} ms CPU per step; load {os.getloadavg()[0]:.1f}; {len(kernels)} kernels")
    for fam, (ms, n, fl) in sorted(fams.items(), key=lambda x: -x[1][0]):
        rate = f", {fl / ms / 1e6:.0f} GFLOP/s over {fl / 1e9:.2f} GFLOP" if fl else ""
        print(f"  {fam:12s} {ms:9.1f} ms  ({n} kernels{rate})")
    for ms, label, fam, fl in sorted(rows, reverse=True)[:top]:
        rate = f"  {fl / ms / 1e6:.0f} GF/s" if fl else ""
        print(f"  {ms:8.2f} ms  {label[:130]}{rate}")


if __name__ == "__main__":
    main()
