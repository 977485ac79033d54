"""The speedrun seed (`train_gpt_simple.py`) in PyTorch, single process, CPU or CUDA: its data
generator, model, Muon, AdamW groups, schedule and loop as the seed writes them. It is the other
side of Mica's speedrun checks, written independently of mica.models.speedrun.

Two things differ from the seed, both for running it outside an 8-GPU torchrun: there is no
process group (world size 1, rank 0: the all_reduce / all_gather / broadcast calls are the
identity), and `dtype` chooses the precision: "bfloat16" is the seed's (a bf16 embedding, so bf16
activations), "float32" keeps the embedding in float32, "float64" makes every tensor float64 (its
`.float()` cast-ups then keep float64), for exact comparisons.
"""
import glob
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_PRECISE = [torch.float32]  # what the seed's .float() casts up to: float32, or float64 in "float64" mode


def _up(x):
    return x.to(_PRECISE[0]) if x.dtype != torch.float64 else x


########################################
#              Dataloader              #
########################################

def _load_data_shard(file: Path):
    header = torch.from_file(str(file), False, 256, dtype=torch.int32)  # header is 256 int32
    assert header[0] == 20240520, "magic number mismatch in the data .bin file"
    assert header[1] == 1, "unsupported version"
    num_tokens = int(header[2])  # number of tokens (claimed)
    with file.open("rb", buffering=0) as f:
        tokens = torch.empty(num_tokens, dtype=torch.uint16)
        f.seek(256 * 4)
        nbytes = f.readinto(tokens.numpy())  # avoid bytes->array copy
        assert nbytes == 2 * num_tokens, "number of tokens read does not match header"
    return tokens


def distributed_data_generator(filename_pattern: str, batch_size: int, seq_len=1024, device="cpu"):
    """The seed's generator at world size 1 (rank 0). The pattern is a glob, relative or absolute."""
    world_size, rank = 1, 0
    files = sorted(Path(p) for p in glob.glob(filename_pattern))
    assert batch_size % world_size == 0
    local_batch_size = batch_size // world_size
    file_iter = iter(files)
    tokens, pos = _load_data_shard(next(file_iter)), 0
    while True:
        if pos + batch_size + 1 >= len(tokens):
            tokens, pos = _load_data_shard(next(file_iter)), 0
        buf = tokens[pos + rank * local_batch_size:][:local_batch_size + 1]
        inputs = buf[:-1].to(device=device, dtype=torch.int32)
        targets = buf[1:].to(device=device, dtype=torch.int64)
        pos += batch_size
        yield inputs.view(-1, seq_len), targets.view(-1, seq_len)


########################################
#             Architecture             #
########################################

def norm(x: Tensor):
    return F.rms_norm(x, (x.size(-1),))


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.gains = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return (norm(_up(x)) * self.gains).type_as(x)


class Linear(nn.Linear):
    def __init__(self, in_features, out_features):
        super().__init__(in_features, out_features, bias=True)

    def forward(self, x):
        return F.linear(x, self.weight.type_as(x), self.bias.type_as(x))


class Rotary(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        # half-truncate RoPE (w/ base freq tuning); float64 here, rounded to the seed's float32 in forward
        angular_freq = (1 / 1024) ** torch.linspace(0, 1, steps=dim // 4, dtype=torch.float64)
        self.register_buffer("angular_freq", torch.cat([angular_freq, angular_freq.new_zeros(dim // 4)]),
                             persistent=False)

    def forward(self, x_BTHD: Tensor):
        up = torch.float64 if x_BTHD.dtype == torch.float64 else torch.float32
        pos = torch.arange(x_BTHD.size(1), dtype=up, device=x_BTHD.device)
        theta = torch.outer(pos, self.angular_freq.to(up))[None, :, None, :]
        cos, sin = theta.cos(), theta.sin()
        x1, x2 = x_BTHD.to(dtype=up).chunk(2, dim=-1)
        y1 = x1 * cos + x2 * sin
        y2 = x1 * (-sin) + x2 * cos
        return torch.cat((y1, y2), 3).type_as(x_BTHD)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, head_dim=128):
        super().__init__()
        self.num_heads = dim // head_dim
        self.head_dim = head_dim
        hdim = self.num_heads * self.head_dim
        self.q = Linear(dim, hdim)
        self.k = Linear(dim, hdim)
        self.v = Linear(dim, hdim)
        self.proj = Linear(hdim, dim)
        self.rotary = Rotary(head_dim)

    def forward(self, x: Tensor):
        B, T = x.size(0), x.size(1)
        q = self.q(x).view(B, T, self.num_heads, self.head_dim)
        k = self.k(x).view(B, T, self.num_heads, self.head_dim)
        v = self.v(x).view(B, T, self.num_heads, self.head_dim)
        q, k = norm(q), norm(k)
        q, k = self.rotary(q), self.rotary(k)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), scale=0.12, is_causal=True).transpose(1, 2)
        y = y.contiguous().view(B, T, self.num_heads * self.head_dim)
        y = self.proj(y)
        return y


class MLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        hdim = 4 * dim
        self.fc = Linear(dim, hdim)
        self.proj = Linear(hdim, dim)

    def forward(self, x: Tensor):
        x = self.fc(x)
        x = x.relu().square()
        x = self.proj(x)
        return x


class Block(nn.Module):
    def __init__(self, dim: int, head_dim=128):
        super().__init__()
        self.attn = CausalSelfAttention(dim, head_dim)
        self.mlp = MLP(dim)
        self.norm1 = RMSNorm(dim)
        self.norm2 = RMSNorm(dim)

    def forward(self, x: Tensor):
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab_size: int, num_layers: int, model_dim: int, head_dim: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, model_dim).bfloat16()
        self.blocks = nn.ModuleList([Block(model_dim, head_dim) for _ in range(num_layers)])
        self.proj = Linear(model_dim, vocab_size)
        self.norm1 = RMSNorm(model_dim)
        self.norm2 = RMSNorm(model_dim)

    def forward(self, inputs: Tensor, targets: Tensor):
        x = self.norm1(self.embed(inputs))
        for block in self.blocks:
            x = block(x)
        logits = _up(self.proj(self.norm2(x)))
        logits = 15 * logits * (logits.square() + 15**2).rsqrt()
        return F.cross_entropy(logits.view(targets.numel(), -1), targets.view(-1), reduction="sum")

    def load_arrays(self, arrays):
        """Set every parameter from {name: array} (Mica's names are the seed's), keeping its dtype."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(torch.as_tensor(arrays[name]).to(p.dtype))
        return self


########################################
#              Optimizer               #
########################################

def zeropower_via_newtonschulz5(G: Tensor, ns_dtype=torch.bfloat16, steps=12) -> Tensor:
    assert G.ndim >= 2
    X = G.to(ns_dtype)
    if G.size(-2) > G.size(-1):
        X = X.mT

    # Ensure spectral norm is at most 1
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    # Perform the NS iterations, not optimizing for wallclock speed
    a, b, c = 2, -1.5, 0.5
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X

    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def muon_update(grad, momentum, mu=0.95, nesterov=True, ns_dtype=torch.bfloat16):
    momentum.lerp_(grad, 1 - mu)
    update = grad.lerp_(momentum, mu) if nesterov else momentum
    update = zeropower_via_newtonschulz5(update, ns_dtype)
    update *= max(1, grad.size(-2) / grad.size(-1))**0.5
    return update


class Muon(torch.optim.Optimizer):
    """The seed's Muon at world size 1 (each matrix updated by this one rank; no all_gather)."""

    def __init__(self, params, lr=0.02, weight_decay=0, mu=0.95, ns_dtype=torch.bfloat16):
        assert isinstance(params, list) and len(params) >= 1 and isinstance(params[0], torch.nn.Parameter)
        params = sorted(params, key=lambda x: x.size(), reverse=True)
        defaults = dict(lr=lr, weight_decay=weight_decay, mu=mu)
        super().__init__(params, defaults)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if len(state) == 0:
                    state["momentum"] = torch.zeros_like(p)
                update = muon_update(p.grad, state["momentum"], mu=group["mu"], ns_dtype=self.ns_dtype)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"])


########################################
#       Init & Optim Hyperparams       #
########################################

def make_model(vocab_size, num_layers, model_dim, head_dim=128, dtype="bfloat16", device="cpu"):
    """The seed's GPT with its init (PyTorch's defaults, then every "proj" zeroed) in `dtype`."""
    _PRECISE[0] = torch.float64 if dtype == "float64" else torch.float32
    model = GPT(vocab_size=vocab_size, num_layers=num_layers, model_dim=model_dim, head_dim=head_dim)
    if dtype == "float64":
        model = model.double()
    elif dtype == "float32":
        model.embed.float()
    for name, p in model.named_parameters():
        if "proj" in name:
            p.data.zero_()
    return model.to(device)


def make_optimizers(model, embed_lr=0.3, head_lr=1 / 320, scalar_lr=0.01, muon_lr=0.025, muon_weight_decay=0.0125,
                    ns_dtype=torch.bfloat16):
    # the seed's fused=True; on a CPU the float32 comparisons keep the single-tensor path, while a
    # bf16 embedding (the seed's precision) takes the fused kernel, whose bf16 rounding is the seed's
    fused = next(model.parameters()).is_cuda or model.embed.weight.dtype is torch.bfloat16
    optimizer1 = torch.optim.AdamW([dict(params=[model.embed.weight], lr=embed_lr),
                        dict(params=[model.proj.weight], lr=head_lr),
                        dict(params=[p for p in model.parameters() if p.ndim < 2], lr=scalar_lr)],
                       betas=(0.8, 0.95), eps=1e-10, weight_decay=0, fused=fused or None,
                       foreach=False if not fused else None)
    optimizer2 = Muon([p for p in model.blocks.parameters() if p.ndim >= 2],
                      lr=muon_lr, weight_decay=muon_weight_decay, ns_dtype=ns_dtype)
    optimizers = [optimizer1, optimizer2]
    assert set(p for opt in optimizers for group in opt.param_groups
               for p in group["params"]) == set(model.parameters())
    for opt in optimizers:
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    return optimizers


def set_hparams(optimizers, step, train_steps, cooldown_frac=0.7):
    progress = step / train_steps
    assert 0 <= progress < 1
    if progress < 1 - cooldown_frac:
        eta = 1.0
    else:
        eta = (1 - progress) / cooldown_frac
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * eta
    return eta


def train_step(model, optimizers, inputs, targets, mbs, step, train_steps, cooldown_frac=0.7):
    """The seed's training section for one batch; returns the summed loss."""
    assert len(inputs) % mbs == 0
    total = 0.0
    for i in range(len(inputs) // mbs):
        loss = model(inputs[i*mbs:(i+1)*mbs], targets[i*mbs:(i+1)*mbs])
        loss.backward()
        total += loss.item()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
    set_hparams(optimizers, step, train_steps, cooldown_frac)
    for opt in optimizers:
        opt.step()
    model.zero_grad(set_to_none=True)
    return total


def val_loss(model, val_inputs, val_targets, mbs, val_tokens):
    model.eval()
    total = 0
    with torch.no_grad():
        assert len(val_inputs) % mbs == 0
        for i in range(len(val_inputs) // mbs):
            total += model(val_inputs[i*mbs:(i+1)*mbs], val_targets[i*mbs:(i+1)*mbs])
    model.train()
    return float(total) / val_tokens


########################################
#        Training and Validation       #
########################################

def train(cfg, weights=None, device="cpu", dtype=None, log=print, train_losses=False, mode="eager"):
    """The seed's loop with a config's settings (mica.train.config's speedrun keys); weights, when
    given ({name: array}), replace the initialization. Returns [(step, val_loss)]; with
    train_losses=True also each step's training loss per token (the summed loss / batch_size)."""
    dtype = dtype or cfg.get("dtype", "bfloat16")
    ns_dtype = torch.float32 if cfg.get("ns_dtype", "bfloat16") == "float32" else torch.bfloat16
    model = make_model(cfg["vocab_size"], cfg["num_layers"], cfg["model_dim"], cfg["head_dim"], dtype, device)
    if weights is not None:
        model.load_arrays(weights)
    if mode != "eager":  # the seed's model.compile(dynamic=False), in a torch.compile mode
        model.compile(dynamic=False, **({} if mode == "default" else {"mode": mode}))
    optimizers = make_optimizers(model, cfg["embed_lr"], cfg["head_lr"], cfg["scalar_lr"], cfg["muon_lr"],
                                 cfg["muon_weight_decay"], ns_dtype)
    train_steps, mbs, seq_len = cfg["train_steps"], cfg["mbs"], cfg["seq_len"]
    train_loader = distributed_data_generator(cfg["train_files"], cfg["batch_size"], seq_len, device)
    val_inputs, val_targets = next(distributed_data_generator(cfg["val_files"], cfg["val_tokens"], seq_len, device))
    results, losses, training_time, t0 = [], [], 0.0, time.perf_counter()
    for step in range(train_steps + 1):
        if step == train_steps or step % cfg["val_every"] == 0:
            training_time += time.perf_counter() - t0
            v = val_loss(model, val_inputs, val_targets, mbs, cfg["val_tokens"])
            results.append((step, v))
            log(f"step:{step}/{train_steps} val_loss:{v:.5f} train_time:{training_time:.3f}s"
                + f" step_avg:{1000*training_time/max(step, 1):.2f}ms")
            t0 = time.perf_counter()
        if step == train_steps:
            break
        inputs, targets = next(train_loader)
        loss = train_step(model, optimizers, inputs, targets, mbs, step, train_steps, cfg["cooldown_frac"])
        losses.append(loss / cfg["batch_size"])
        if (step + 1) % cfg.get("log_interval", 1) == 0:  # (the loss's .item() waited for the work)
            approx_training_time = training_time + (time.perf_counter() - t0)
            log(f"step:{step+1}/{train_steps} train_time:{approx_training_time:.3f}s"
                + f" step_avg:{1000*approx_training_time/(step + 1):.2f}ms")
    return (results, losses) if train_losses else results


def seed_init(cfg, vocab_size, dtype="float32"):
    """The seed's initial weights from PyTorch's side (its init under torch.manual_seed(cfg seed)),
    as {name: array}."""
    torch.manual_seed(cfg["seed"] % 2**63)
    model = make_model(vocab_size, cfg["num_layers"], cfg["model_dim"], cfg["head_dim"], dtype)
    return {n: p.detach().float().numpy().copy() for n, p in model.named_parameters()}


def main(argv=None):
    """`python -m mica.bench.torch_speedrun --config JSON [--mode eager|default] [--threads N]`: the
    seed's loop for a speedrun config (mica.train.config's keys, vocab_size resolved), float32, its
    lines on stdout (mica bench stamps them)."""
    import argparse
    import json

    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--mode", default="eager", choices=["eager", "default", "reduce-overhead", "max-autotune"])
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = json.loads(a.config)
    torch.manual_seed(cfg["seed"] % 2**63)
    train(cfg, device=a.device, dtype="float32", log=lambda s: print(s, flush=True), mode=a.mode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
