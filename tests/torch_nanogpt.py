"""nanoGPT's train.py in PyTorch, enough of it to write a real ckpt.pt: the project's TorchGPT,
configure_optimizers' two AdamW groups, get_lr, estimate_loss (which returns 0-d tensors, so
best_val_loss is one), and the checkpoint dict train.py saves, written by torch.save after real
training. Batches come from given offsets so that Mica can follow the same ones."""
import math

import numpy as np
import torch

from mica.bench.torch_gpt import TorchGPT
from mica.train.programs import model_config


def get_lr(cfg, it):  # train.py's, verbatim but for the globals
    if not cfg["decay_lr"]:
        return cfg["learning_rate"]
    if it < cfg["warmup_iters"]:
        return cfg["learning_rate"] * (it + 1) / (cfg["warmup_iters"] + 1)
    if it > cfg["lr_decay_iters"]:
        return cfg["min_lr"]
    decay_ratio = (it - cfg["warmup_iters"]) / (cfg["lr_decay_iters"] - cfg["warmup_iters"])
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return cfg["min_lr"] + coeff * (cfg["learning_rate"] - cfg["min_lr"])


class Run:
    """A model, its optimizer and iter_num, trained as train.py's loop trains."""

    def __init__(self, cfg, vocab_size, train, val, mask_buffer=True, seed=1337):
        torch.manual_seed(seed)
        self.cfg, self.iter_num = cfg, 0
        self.model = TorchGPT(model_config(cfg, vocab_size))
        if mask_buffer:  # older nanoGPT (no flash attention) keeps its causal mask as attn.bias
            T = cfg["block_size"]
            for block in self.model.transformer.h:
                block.attn.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        self.optimizer = self.model.nanogpt_optimizer(cfg["weight_decay"], cfg["learning_rate"],
                                                      (cfg["beta1"], cfg["beta2"]))
        self.data = {"train": torch.from_numpy(train.astype(np.int64)), "val": torch.from_numpy(val.astype(np.int64))}
        self.gen = torch.Generator().manual_seed(seed)

    def batch(self, split, offsets=None):
        T, B = self.cfg["block_size"], self.cfg["batch_size"]
        data = self.data[split]
        if offsets is None:
            offsets = torch.randint(len(data) - T, (B,), generator=self.gen).tolist()
        x = torch.stack([data[i:i + T] for i in offsets])
        y = torch.stack([data[i + 1:i + 1 + T] for i in offsets])
        return x, y

    @torch.no_grad()
    def estimate_loss(self):
        out = {}
        self.model.eval()
        for split in ["train", "val"]:
            losses = torch.zeros(self.cfg["eval_iters"])
            for k in range(self.cfg["eval_iters"]):
                _, loss = self.model(*self.batch(split))
                losses[k] = loss.item()
            out[split] = losses.mean()
        self.model.train()
        return out

    def step(self, offsets):
        """One iteration on rows at `offsets` (batch_size of them; one micro-batch); its loss."""
        lr = get_lr(self.cfg, self.iter_num)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        _, loss = self.model(*self.batch("train", offsets))
        loss.backward()
        if self.cfg["grad_clip"] != 0.0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg["grad_clip"])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.iter_num += 1
        return loss.item()

    def save(self, path):
        """train.py's checkpoint, after its estimate_loss; returns it. (train.py's loop sets every
        group's lr to get_lr(iter_num) first: the file holds the lr of the iteration it is saved at.)"""
        for group in self.optimizer.param_groups:
            group["lr"] = get_lr(self.cfg, self.iter_num)
        losses = self.estimate_loss()
        model_args = {k: self.cfg[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "bias", "dropout")}
        model_args["vocab_size"] = self.model.cfg.vocab_size
        checkpoint = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                      "model_args": model_args, "iter_num": self.iter_num, "best_val_loss": losses["val"],
                      "config": dict(self.cfg)}
        torch.save(checkpoint, path)
        return checkpoint
