"""The tutorial's batched trainer: a two-block pre-norm transformer with every mechanism in view.

A batch of B sequences of T tokens trains a tiny model: embedding lookup, RMS norm gains, one-head
batched attention with an additive causal mask and dropout on its weights, a tanh-GELU MLP, the
tied output head, cross-entropy, gradient clipping, AdamW and a cosine schedule. Per-token work
runs on one flat [B*T, C] matrix; only the score product sees the [B, T, T] batch shape.

Run it on the oracle with `python -m mica.models.tutorial`.
"""
import math
from dataclasses import dataclass

import numpy as np

import mica
import mica.nn as nn
import mica.nn.functional as F


@dataclass
class TutorialConfig:
    vocab_size: int = 5
    dim: int = 4           # C: 1/sqrt(4) = 0.5 scales the scores exactly
    hidden: int = 16       # the MLP's width
    n_blocks: int = 2
    batch: int = 2         # B sequences ...
    seq: int = 3           # ... of T tokens
    dropout: float = 0.1   # on the attention weights
    lr: float = 0.0625     # peak of the cosine schedule
    steps: int = 3
    weight_decay: float = 0.0625
    max_norm: float = 1.0


def _matrix(rows, cols):
    return nn.Parameter(shape=(rows, cols), init=nn.init.normal(0.0, 0.5))


def _gain(n):
    return nn.Parameter(shape=(n,), init=nn.init.ones())


class TutorialBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, H = cfg.dim, cfg.hidden
        self.g1 = _gain(C)
        self.wq, self.wk, self.wv, self.wo = (_matrix(C, C) for _ in range(4))
        self.g2 = _gain(C)
        self.w1, self.w2 = _matrix(C, H), _matrix(H, C)
        self.cfg = cfg

    def forward(self, x, mask):
        B, T, C = self.cfg.batch, self.cfg.seq, self.cfg.dim
        a = F.rms_norm(x, (C,), self.g1)
        q, k, v = a @ self.wq, a @ self.wk, a @ self.wv
        q3, k3, v3 = q.view(B, T, C), k.view(B, T, C), v.view(B, T, C)  # same cells, batch shape
        sc = q3 @ k3.transpose(1, 2)            # the batched score product, [B, T, T]
        sc = sc * (1 / math.sqrt(C))
        sc = sc + mask                          # -inf above the diagonal, in every batch slice
        at = F.softmax(sc, dim=-1)
        at = F.dropout(at, self.cfg.dropout, training=self.training)
        o = (at @ v3).view(B * T, C)            # back to the flat per-token matrix
        x = x + o @ self.wo
        a = F.rms_norm(x, (C,), self.g2)
        h = F.gelu(a @ self.w1, approximate="tanh")
        return x + h @ self.w2


class TutorialModel(nn.Module):
    def __init__(self, cfg=None):
        super().__init__()
        self.cfg = cfg = cfg or TutorialConfig()
        self.e = _matrix(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList([TutorialBlock(cfg) for _ in range(cfg.n_blocks)])
        self.gf = _gain(cfg.dim)

    def forward(self, tokens, targets):
        B, T, C = self.cfg.batch, self.cfg.seq, self.cfg.dim
        x = F.embedding(tokens, self.e).view(B * T, C)
        causal = mica.tril(mica.ones(T, T)) == 1
        mask = mica.zeros(T, T).masked_fill(~causal, float("-inf"))
        for block in self.blocks:
            x = block(x, mask)
        f = F.rms_norm(x, (C,), self.gf)
        logits = f @ self.e.T                   # the tied head: [B*T, vocab]
        return F.cross_entropy(logits, targets.view(-1))


def make_step(model):
    """One training step: loss and gradients, clipping, the schedule's alpha, AdamW."""
    cfg = model.cfg
    opt = mica.optim.adamw(lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=cfg.weight_decay)

    def step(params, opt_state, tokens, targets):
        loss, grads = mica.value_and_grad(lambda p: nn.functional_call(model, p, tokens, targets))(params)
        norm = mica.optim.clip_grad_norm(grads, cfg.max_norm)
        alpha = mica.optim.cosine(opt_state["step"], cfg.steps, cfg.lr)
        params, opt_state = opt.update(params, grads, opt_state, lr=alpha)
        return params, opt_state, {"loss": loss, "norm": norm, "alpha": alpha}

    return step, opt


def specs(model, opt):
    cfg = model.cfg
    p = model.param_specs()
    batch = mica.i64[cfg.batch, cfg.seq]
    return p, opt.state_specs(p), batch, batch


def main(seed=0):
    model = TutorialModel()
    cfg = model.cfg
    step, opt = make_step(model)
    program = mica.trace(step, *specs(model, opt))
    params = model.init(seed)
    state = opt.init(params)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab_size, (cfg.batch, cfg.seq))
    targets = rng.integers(0, cfg.vocab_size, (cfg.batch, cfg.seq))
    for i in range(cfg.steps):
        params, state, m = mica.reference.run(program, params, state, tokens, targets, precision="float32",
                                              seed=seed, offset=i)
        print(f"step {i + 1}: a = {m['alpha']:.6f} n = {m['norm']:.6f} loss = {m['loss']:.6f}")
    return params


if __name__ == "__main__":
    main()
