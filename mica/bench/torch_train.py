"""nanoGPT's training loop in PyTorch over the project's TorchGPT: the other side of the checks.

It follows train.py: the learning rate from get_lr(iter_num) (or constant), micro-batches with the
loss divided by the accumulation steps, clipping, AdamW over nanoGPT's two groups. Batches come
from given offsets, so both sides can read one recorded batch order.
"""
import numpy as np
import torch

from ..optim.schedules import cosine_with_warmup
from ..train.programs import model_config
from .torch_gpt import TorchGPT


def nanogpt_init(cfg, vocab_size, seed=None):
    """Initial weights from PyTorch's side (nanoGPT's init under torch.manual_seed), as
    {name: float32 array} with the tied matrix once, under transformer.wte.weight."""
    torch.manual_seed(cfg["seed"] if seed is None else seed)
    model = TorchGPT(model_config(cfg, vocab_size))
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def get_lr(cfg, it):
    if not cfg["decay_lr"]:
        return cfg["learning_rate"]
    return cosine_with_warmup(it, cfg["learning_rate"], cfg["warmup_iters"], cfg["lr_decay_iters"], cfg["min_lr"])


def train_losses(cfg, vocab_size, weights, tokens, offsets, iters, threads=None, device="cpu"):
    """Losses of iterations 0..iters (nanoGPT logs iterations 0..max_iters) on batches whose rows
    start at `offsets` (consumed in order, batch_size * accumulation per iteration). On
    device="cuda": on the first GPU, float32 with TF32 off."""
    if threads:
        torch.set_num_threads(threads)
    model = TorchGPT(model_config(cfg, vocab_size)).load_arrays(weights)
    if device != "cpu":
        from .torch_runner import precision

        precision(torch, False)
        model = model.to(device)
    model.train()
    opt = model.nanogpt_optimizer(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]))
    B, T, accum = cfg["batch_size"], cfg["block_size"], cfg["gradient_accumulation_steps"]
    data = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    offsets = list(offsets)
    losses = []
    for it in range(iters + 1):
        for g in opt.param_groups:
            g["lr"] = get_lr(cfg, it)
        for micro in range(accum):
            rows = [offsets.pop(0) for _ in range(B)]
            x = torch.stack([data[o:o + T] for o in rows])
            y = torch.stack([data[o + 1:o + 1 + T] for o in rows])
            _, loss = model(x.to(device), y.to(device))
            loss = loss / accum
            loss.backward()
        if cfg["grad_clip"] != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item() * accum)
    return losses
