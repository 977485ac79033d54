"""The tutorial's two-block model and its training step in PyTorch (the other side of its checks
and benchmark), reading Mica's parameter names."""
import math

import torch
import torch.nn.functional as F


def tutorial_loss(p, tokens, targets, cfg, training=False):
    B, T, C = cfg.batch, cfg.seq, cfg.dim
    x = p["e"][tokens].reshape(B * T, C)
    mask = torch.zeros(T, T, dtype=x.dtype).masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), -math.inf)
    for i in range(cfg.n_blocks):
        g = lambda k: p[f"blocks.{i}.{k}"]  # noqa: E731
        a = F.rms_norm(x, (C,), g("g1"))
        q, k, v = (a @ g(w) for w in ("wq", "wk", "wv"))
        sc = q.view(B, T, C) @ k.view(B, T, C).transpose(1, 2) * (1 / math.sqrt(C)) + mask
        at = F.dropout(torch.softmax(sc, -1), cfg.dropout, training=training)
        x = x + (at @ v.view(B, T, C)).view(B * T, C) @ g("wo")
        h = F.gelu(F.rms_norm(x, (C,), g("g2")) @ g("w1"), approximate="tanh")
        x = x + h @ g("w2")
    logits = F.rms_norm(x, (C,), p["gf"]) @ p["e"].T
    return F.cross_entropy(logits, targets.view(-1))


def tutorial_step(cfg, params, tokens, targets, compile_mode="eager"):
    """A callable running one training step (loss, clipping, cosine-scheduled AdamW) in PyTorch;
    with a torch.compile mode ("default", "reduce-overhead", "max-autotune") the loss is compiled,
    as nanoGPT compiles its model."""
    p = {n: torch.tensor(a, requires_grad=True) for n, a in params.items()}
    loss_fn = tutorial_loss if compile_mode == "eager" else torch.compile(
        tutorial_loss, mode=None if compile_mode == "default" else compile_mode)
    opt = torch.optim.AdamW(list(p.values()), lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=cfg.weight_decay)
    tok, tgt = torch.as_tensor(tokens), torch.as_tensor(targets)
    state = {"it": 0}

    def run():
        it = state["it"]
        for group in opt.param_groups:
            group["lr"] = 0.5 * (1 + math.cos(math.pi * it / cfg.steps)) * cfg.lr
        loss = loss_fn(p, tok, tgt, cfg, training=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), cfg.max_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["it"] = it + 1
        return loss.item()

    return run
