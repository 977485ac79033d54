"""The PyTorch side of `mica bench`, run as its own process: nanoGPT's loop over the project's
TorchGPT in one mode (eager, or torch.compile's default / reduce-overhead / max-autotune), on the
same data files as Mica. Every `every` iterations it reads the loss (which waits for the work)
and prints nanoGPT's line, so an outside clock can stamp it.

On --device cuda the model trains on the first GPU (batches drawn on the CPU, from the same
generator, and copied over as nanoGPT does), in float32 with TF32 off unless --tf32; at the end it
prints PyTorch's own peak (max_memory_reserved: what its caching allocator held from the driver;
max_memory_allocated: what tensors used). Running out of the GPU's memory is one line on stderr
starting "CUDA out of memory" and exit status 3, so the protocol records it (amendment 5).

    python -m mica.bench.torch_runner --data DIR --mode eager --iters 120 --every 10 [--device cuda [--tf32]]
"""
import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--mode", default="eager", choices=["eager", "default", "reduce-overhead", "max-autotune"])
    p.add_argument("--iters", type=int, default=120)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--config", default="{}", help="JSON of nanoGPT settings")
    p.add_argument("--eval_every", type=int, default=0, help="estimate_loss every this many steps (0: never)")
    p.add_argument("--eval_batches", type=int, default=20)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--tf32", action="store_true", help="with --device cuda: let products use TF32")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="a half type: the forward under torch.autocast (float16 with a GradScaler), on any device")
    a = p.parse_args(argv)
    import torch

    if a.device == "cuda":
        try:
            return train(a, torch)
        except Exception as e:  # (torch.OutOfMemoryError, or wrapped by torch.compile's backends)
            if "out of memory" not in str(e).lower():
                raise
            print(f"CUDA out of memory in mode {a.mode}: {oom_reason(e)}", file=sys.stderr, flush=True)
            return 3
    return train(a, torch)


def oom_reason(e):
    """The line of an out-of-memory error that says so (PyTorch's first; a wrapper's may come later)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return next((line for line in lines if "out of memory" in line.lower()), lines[0] if lines else type(e).__name__)


def precision(torch, tf32):
    """TF32 on both sides only together: allowed with --tf32, else float32 throughout."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def train(a, torch):
    from ..train import config as config_mod
    from ..train.programs import model_config
    from .torch_train import get_lr
    from .torch_gpt import TorchGPT

    cfg = {**config_mod.DEFAULTS, **json.loads(a.config)}
    if a.threads:
        torch.set_num_threads(a.threads)
    from ..train.run import vocab_size

    vocab, _ = vocab_size(a.data, log=lambda *args: None)  # as `mica train` reads it (no meta: GPT-2's 50304)
    splits = {s: np.memmap(os.path.join(a.data, f"{s}.bin"), dtype=np.uint16, mode="r") for s in ("train", "val")}
    data = splits["train"]
    torch.manual_seed(cfg["seed"])
    model = TorchGPT(model_config(cfg, vocab))
    if a.device == "cuda":
        precision(torch, a.tf32)
        model = model.to("cuda")
    opt = model.nanogpt_optimizer(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]))
    fwd = model if a.mode == "eager" else torch.compile(model, mode=None if a.mode == "default" else a.mode)
    B, T, accum = cfg["batch_size"], cfg["block_size"], cfg["gradient_accumulation_steps"]
    gen = torch.Generator().manual_seed(cfg["seed"])

    def get_batch(split="train"):
        d = splits[split]
        ix = torch.randint(len(d) - T, (B,), generator=gen)
        x = torch.stack([torch.from_numpy(d[i:i + T].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(d[i + 1:i + 1 + T].astype(np.int64)) for i in ix])
        if a.device == "cuda":
            return x.pin_memory().to("cuda", non_blocking=True), y.pin_memory().to("cuda", non_blocking=True)
        return x, y

    @torch.no_grad()
    def estimate_loss():
        model.eval()
        out = {}
        for split in ("train", "val"):
            with ctx:
                out[split] = float(np.mean([model(*get_batch(split))[1].item() for _ in range(a.eval_batches)]))
        model.train()
        return out

    half = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(a.dtype)
    ctx = torch.autocast(device_type=a.device, dtype=half) if half is not None else contextlib.nullcontext()
    scaler = torch.amp.GradScaler(a.device, enabled=a.dtype == "float16")

    X, Y = get_batch()
    t0 = time.time()
    for it in range(a.iters + 1):
        if a.eval_every and it % a.eval_every == 0:
            losses = estimate_loss()
            print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", flush=True)
        for g in opt.param_groups:
            g["lr"] = get_lr(cfg, it)
        for _ in range(accum):
            with ctx:
                _, loss = fwd(X, Y)
                loss = loss / accum
            X, Y = get_batch()
            scaler.scale(loss).backward()
        if cfg["grad_clip"] != 0.0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        if it % a.every == 0:
            lossf = loss.item() * accum  # waits for the work
            t1 = time.time()
            print(f"iter {it}: loss {lossf:.4f}, time {(t1 - t0) * 1000:.2f}ms", flush=True)
            t0 = t1
    if a.device == "cuda":
        print(f"cuda memory: max_memory_reserved {torch.cuda.max_memory_reserved()} bytes, max_memory_allocated "
              f"{torch.cuda.max_memory_allocated()} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
