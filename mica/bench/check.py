"""Do both sides train the same model? The report's two methods.

Method B, one shared start: initial weights made by PyTorch's side (nanoGPT's init), one recorded
batch order, no dropout, float32. Passes when the step-0 losses agree within 1e-5 (relative) and
every later step within 1%.

With device="cuda" both sides train on the first NVIDIA GPU (Mica's CUDA trainer; PyTorch on
cuda), float32 with TF32 off on both; the verdict's rules are the same. simulate=True runs Mica's
CUDA trainer on the CPU simulator and PyTorch's side on the CPU (tests, where there is no GPU).
"""
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

from ..data import tokens as tok
from ..errors import MicaError
from ..train import checkpoint
from ..train import config as config_mod
from ..train import run as train_run


def _mica_losses(out_dir):
    losses = {}
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if "iter" in m and m.get("loss") is not None:
                losses[m["iter"]] = m["loss"]
    return [losses[i] for i in sorted(losses)]


def _device_settings(device, simulate):
    """Mica's trainer's settings for the device: on cuda float32, TF32 off (method B multiplies in
    plain float32 on both sides)."""
    if device != "cuda":
        return ["--device=cpu"]
    return ["--device=cuda", "--dtype=float32", "--tf32=False"] + (["--simulate=True"] if simulate else [])


def method_b(config=None, overrides=(), iters=100, out_dir="check-b", threads=None, log=print, device="cpu",
             simulate=False):
    """Run both sides from one start on one batch order; returns the verdict (and writes it, with
    the curves, under out_dir)."""
    from . import torch_train

    on_device = _device_settings(device, simulate)
    cfg = config_mod.load(config, [*overrides, "--dropout=0.0", *on_device])
    folder, (train_paths, _) = train_run.data_files(cfg)
    if len(train_paths) != 1:
        raise MicaError(f"method B replays one training file; {folder} holds {len(train_paths)} shards")
    train_path = train_paths[0]
    vocab, _ = train_run.vocab_size(folder, log)
    data = tok.open_tokens(train_path, vocab, cfg["block_size"] + 1, "training data")
    os.makedirs(out_dir, exist_ok=True)
    init = os.path.join(out_dir, "shared_start.safetensors")
    checkpoint.write(init, torch_train.nanogpt_init(cfg, vocab), {"made_by": "PyTorch, nanoGPT's init"})
    rows = cfg["batch_size"] * cfg["gradient_accumulation_steps"] * (iters + 1)
    offsets = np.random.default_rng(cfg["seed"]).integers(0, len(data) - cfg["block_size"], rows)
    order = os.path.join(out_dir, "batch_order.txt")
    np.savetxt(order, offsets, fmt="%d")
    mica_dir = os.path.join(out_dir, "mica")
    metrics = os.path.join(mica_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.unlink(metrics)
    args = [*overrides, "--dropout=0.0", *on_device, f"--out_dir={mica_dir}", f"--init_from={init}",
            f"--batch_order={order}", f"--max_iters={iters}", f"--eval_interval={iters + 1}", "--eval_iters=1",
            "--log_interval=1", "--always_save_checkpoint=False"]
    if threads:
        args.append(f"--threads={threads}")
    cmd = [sys.executable, "-m", "mica.cli", "train", *([config] if config else []), *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise MicaError(f"the Mica side failed: {r.stderr.strip()}")
    mica_losses = _mica_losses(mica_dir)
    torch_device = "cuda" if device == "cuda" and not simulate else "cpu"
    torch_losses = torch_train.train_losses(cfg, vocab, checkpoint_arrays(init), data, offsets, iters, threads,
                                            device=torch_device)
    rel = [abs(a - b) / abs(b) for a, b in zip(mica_losses, torch_losses)]
    verdict = {
        "method": "b", "iters": iters, "mica": mica_losses, "pytorch": torch_losses, "relative_difference": rel,
        "step0_ok": rel[0] < 1e-5, "later_ok": all(r < 0.01 for r in rel[1:]),
    }
    if device == "cuda":
        verdict.update(device="cuda", pytorch_device=torch_device, simulated=bool(simulate), tf32=False)
    verdict["passed"] = bool(len(rel) == iters + 1 and verdict["step0_ok"] and verdict["later_ok"])
    with open(os.path.join(out_dir, "verdict.json"), "w") as f:
        json.dump(verdict, f, indent=1)
    _plot(out_dir, {"Mica": mica_losses, "PyTorch": torch_losses}, "method B: one shared start")
    return verdict


def method_b_speedrun(config, overrides=(), iters=100, out_dir="check-b", threads=None, log=print):
    """Method B for a speedrun config: one start made by PyTorch's side (the seed's init), both
    sides reading the same shards in the seed's order, float32 with float32 Newton-Schulz, the
    schedule over `iters` steps. Compares every step's training loss per token."""
    from . import torch_speedrun

    settings = [*overrides, "--dtype=float32", "--ns_dtype=float32", "--device=cpu", f"--train_steps={iters}",
                f"--val_every={iters}"]
    cfg = config_mod.check_speedrun(config_mod.load(config, settings))
    vocab = train_run.speedrun_vocab(cfg, log)
    os.makedirs(out_dir, exist_ok=True)
    init = os.path.join(out_dir, "shared_start.safetensors")
    weights = torch_speedrun.seed_init(cfg, vocab)
    checkpoint.write(init, weights, {"made_by": "PyTorch, the speedrun seed's init"})
    mica_dir = os.path.join(out_dir, "mica")
    args = [*settings, f"--out_dir={mica_dir}", f"--init_from={init}", f"--vocab_size={vocab}"]
    if threads:
        args.append(f"--threads={threads}")
    r = subprocess.run([sys.executable, "-m", "mica.cli", "train", config, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise MicaError(f"the Mica side failed: {r.stderr.strip()}")
    mica_losses = _mica_losses(mica_dir)
    if threads:
        import torch

        torch.set_num_threads(threads)
    _, torch_losses = torch_speedrun.train({**cfg, "vocab_size": vocab}, weights, dtype="float32",
                                           log=lambda s: None, train_losses=True)
    rel = [abs(a - b) / abs(b) for a, b in zip(mica_losses, torch_losses)]
    verdict = {"method": "b", "recipe": "speedrun", "iters": iters, "mica": mica_losses, "pytorch": torch_losses,
               "relative_difference": rel, "step0_ok": bool(rel) and rel[0] < 1e-5,
               "later_ok": all(x < 0.01 for x in rel[1:])}
    verdict["passed"] = bool(len(rel) == iters and verdict["step0_ok"] and verdict["later_ok"])
    with open(os.path.join(out_dir, "verdict.json"), "w") as f:
        json.dump(verdict, f, indent=1)
    _plot(out_dir, {"Mica": mica_losses, "PyTorch": torch_losses}, "method B: one shared start (speedrun)")
    return verdict


def checkpoint_arrays(path):
    st = checkpoint.SafeTensors(path)
    return {n: st.read(n) for n in st.names}


def _plot(out_dir, curves, title, xs=None, ylabel="training loss"):
    """curves.png: each curve against the iterations `xs` (0, 1, 2, ... where not given)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, ys in curves.items():
        ax.plot(range(len(ys)) if xs is None else xs, ys, label=name, lw=1, marker=None if xs is None else "o")
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    path = os.path.join(out_dir, "curves.png")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _minutes(seconds):
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


STEP = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)", re.M)


def method_a(model="cpu", iters=2000, eval_every=250, eval_batches=200, seeds=range(1337, 1342),
             data_dir="data/shakespeare_char", out_dir="check-a", threads=None, log=print, device="cpu",
             simulate=False, dtype="float32"):
    """Families of runs: each side trains with every seed; at every evaluation after the first
    quarter the two sides' median validation losses must differ by no more than the larger of
    the two families' ranges."""
    from .protocol import MODELS, check_data, mica_train_cmd, torch_runner_cmd

    check_data(model, data_dir)  # (before any run, with the preparation this model's data needs)
    os.makedirs(out_dir, exist_ok=True)
    settings = {**MODELS[model], "max_iters": iters, "eval_interval": eval_every, "eval_iters": eval_batches,
                "log_interval": eval_every, "always_save_checkpoint": False, "device": "cpu", "data_dir": data_dir}
    settings["dtype"] = dtype  # (a half type: both sides under autocast, float16 with loss scaling)
    if device == "cuda":
        settings.update(device="cuda", tf32=False, **({"simulate": True} if simulate else {}))
    torch_device = "cuda" if device == "cuda" and not simulate else "cpu"
    if threads:
        settings["threads"] = threads
    curves = {"mica": {}, "pytorch": {}}
    seeds = list(seeds)
    log(f"method A, model {model}, {dtype}: {len(seeds)} seeds a side, {iters} iterations each, validation loss "
        f"every {eval_every} ({eval_batches} batches); {2 * len(seeds)} training runs, one at a time")
    started = time.monotonic()
    for i, seed in enumerate(seeds):
        t0 = time.monotonic()
        cmd = mica_train_cmd({**settings, "seed": seed, "out_dir": os.path.join(out_dir, f"mica-{seed}")})
        curves["mica"][seed] = _evals(subprocess.run(cmd, capture_output=True, text=True), "Mica", seed)
        t1 = time.monotonic()
        cmd = torch_runner_cmd({**MODELS[model], "seed": seed}, data_dir, "eager", iters, eval_every, eval_every,
                               eval_batches, threads, device=torch_device, dtype=dtype)
        curves["pytorch"][seed] = _evals(subprocess.run(cmd, capture_output=True, text=True), "PyTorch", seed)
        t2 = time.monotonic()
        left = len(seeds) - i - 1
        eta = f"; about {_minutes((t2 - started) / (i + 1) * left)} left" if left else ""
        log(f"seed {seed}: Mica {_minutes(t1 - t0)}, PyTorch {_minutes(t2 - t1)}{eta}")
    steps = sorted(set.intersection(*(set(c) for side in curves.values() for c in side.values())))
    rows = []
    for st in steps:
        m = [curves["mica"][s][st] for s in seeds]
        t = [curves["pytorch"][s][st] for s in seeds]
        med_m, med_t = float(np.median(m)), float(np.median(t))
        spread = max(max(m) - min(m), max(t) - min(t))
        judged = st >= -(-iters // 4)  # (the first step at or past a quarter of the run)
        rows.append({"step": st, "mica_median": med_m, "pytorch_median": med_t, "difference": abs(med_m - med_t),
                     "larger_range": spread, "judged": judged, "ok": (not judged) or abs(med_m - med_t) <= spread})
    # how far training took both families: the smaller relative fall of the median validation loss from
    # the first evaluation to the last (a check of barely trained models says little)
    drop = min(1 - rows[-1][k] / rows[0][k] for k in ("mica_median", "pytorch_median")) if len(rows) > 1 else 0.0
    verdict = {"method": "a", "model": model, "dtype": dtype, "device": device, "iters": iters,
               "eval_every": eval_every, "eval_batches": eval_batches, "judged_from_step": -(-iters // 4),
               "seeds": seeds, "evaluations": rows, "curves": curves, "loss_drop": drop,
               "passed": bool(rows) and any(r["judged"] for r in rows) and all(r["ok"] for r in rows)}
    with open(os.path.join(out_dir, "verdict.json"), "w") as f:
        json.dump(verdict, f, indent=1, default=str)
    _plot(out_dir, {"Mica (median over seeds)": [r["mica_median"] for r in rows],
                    "PyTorch (median over seeds)": [r["pytorch_median"] for r in rows]},
          f"method A: {model}, {dtype}, {len(seeds)} seeds a side", xs=[r["step"] for r in rows],
          ylabel="validation loss")
    return verdict


def _evals(r, side, seed):
    if r.returncode != 0:
        raise MicaError(f"the {side} run with seed {seed} failed: {r.stderr.strip()[-300:]}")
    return {int(m.group(1)): float(m.group(3)) for m in STEP.finditer(r.stdout)}
