"""The NanoGPT speedrun's modern GPT (the annotated `train_gpt_simple.py` seed), written with
Mica's verbs line by line as the seed writes it, so the two read side by side.

What differs from the seed is only what a compiler needs said explicitly:

- the seed's `.float()` casts up to float32 for the delicate arithmetic; here `_up(x)` casts up to
  float32, and leaves a float64 tensor in float64 (so the float64 oracle checks every line exactly);
- the seed zeroes every "proj" parameter after building the model (`p.data.zero_()`); in Mica a
  parameter holds its initializer, so `zero_projections(model)` replaces those initializers;
- the optimizers are functions compiled into the step: `optimizers(model)` gives the seed's AdamW
  groups and Muon as one optimizer, `set_hparams` its stable-then-decay multiplier.

Parameter names equal the seed's `named_parameters()`; at vocab 50304, 12 layers and dim 768 the
model has 162,354,816 parameters.
"""
import numpy as np

import mica
import mica.nn as nn
import mica.nn.functional as F
from mica import dtypes

Tensor = mica.Tensor


def _up(x):
    """The seed's cast-up `x.float()`: float32 for a narrower tensor, float64 kept as it is."""
    return x if x.dtype is dtypes.float64 else x.float()


########################################
#             Architecture             #
########################################

def norm(x: Tensor):
    return F.rms_norm(x, (x.size(-1),))


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.gains = nn.Parameter(mica.ones(dim))

    def forward(self, x):
        return (norm(_up(x)) * self.gains).type_as(x)


class Linear(nn.Linear):
    def __init__(self, in_features, out_features):
        super().__init__(in_features, out_features, bias=True)

    def forward(self, x):
        return F.linear(x, self.weight.type_as(x), self.bias.type_as(x))


def rotary_frequencies(dim):
    """The seed's buffer: (1/1024) ** linspace(0, 1, dim//4) then dim//4 zeros (half-truncated
    RoPE), computed in float64; the seed's float32 buffer is this rounded to float32."""
    angular_freq = (1 / 1024) ** np.linspace(0, 1, num=dim // 4, dtype=np.float64)
    return np.concatenate([angular_freq, np.zeros(dim // 4)])


class Rotary(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        # half-truncate RoPE (w/ base freq tuning)
        self.register_buffer("angular_freq", rotary_frequencies(dim))

    def forward(self, x_BTHD: Tensor):
        up = dtypes.float64 if x_BTHD.dtype is dtypes.float64 else dtypes.float32
        pos = mica.arange(x_BTHD.size(1), dtype=up)
        # (a buffer reads as a float32 literal; the float64 values are taken here in `up`)
        theta = mica.outer(pos, mica.tensor(self._buffers["angular_freq"], dtype=up))[None, :, None, :]
        cos, sin = theta.cos(), theta.sin()
        x1, x2 = x_BTHD.to(dtype=up).chunk(2, dim=-1)
        y1 = x1 * cos + x2 * sin
        y2 = x1 * (-sin) + x2 * cos
        return mica.cat((y1, y2), 3).type_as(x_BTHD)


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
    """`head_dim` is the seed's 128 (CausalSelfAttention's default); smaller models for tests and
    the CPU may choose a smaller one."""

    def __init__(self, vocab_size: int, num_layers: int, model_dim: int, head_dim: int = 128):
        super().__init__()
        if model_dim % head_dim or head_dim % 4:
            raise mica.MicaError(f"model_dim ({model_dim}) must be a multiple of head_dim ({head_dim}), and "
                                 "head_dim a multiple of 4 (the rotary embedding's quarters)")
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

    def logits(self, inputs: Tensor):
        """Every position's soft-capped logits (for sampling): the forward without the loss."""
        x = self.norm1(self.embed(inputs))
        for block in self.blocks:
            x = block(x)
        logits = _up(self.proj(self.norm2(x)))
        return 15 * logits * (logits.square() + 15**2).rsqrt()


########################################
#       Init & Optim Hyperparams       #
########################################

def zero_projections(model):
    """The seed's `for name, p in model.named_parameters(): if "proj" in name: p.data.zero_()`."""
    for name, p in model.named_parameters():
        if "proj" in name:
            nn.init.zeros_(p)
    return model


SEED_LRS = dict(embed_lr=0.3, head_lr=1 / 320, scalar_lr=0.01, muon_lr=0.025, muon_weight_decay=0.0125)


def optimizers(model, embed_lr=0.3, head_lr=1 / 320, scalar_lr=0.01, muon_lr=0.025, muon_weight_decay=0.0125,
               mu=0.95, ns_coefficients=mica.optim.SEED_COEFFICIENTS, ns_dtype=dtypes.bfloat16):
    """The seed's optimizer1 (AdamW over the embedding, the head and every ndim < 2 parameter) and
    optimizer2 (Muon over the blocks' matrices), as one optimizer over the model's parameters."""
    names = dict(model.named_parameters())
    optimizer1 = mica.optim.adamw(param_groups=[dict(params=["embed.weight"], lr=embed_lr),
                                                dict(params=["proj.weight"], lr=head_lr),
                                                dict(params=[n for n, p in names.items() if p.ndim < 2], lr=scalar_lr)],
                                  betas=(0.8, 0.95), eps=1e-10, weight_decay=0, fused=True)  # (the seed's)
    optimizer2 = mica.optim.muon(lr=muon_lr, weight_decay=muon_weight_decay, mu=mu, ns_coefficients=ns_coefficients,
                                 ns_dtype=ns_dtype,
                                 param_groups=[dict(params=[n for n, p in names.items()
                                                            if n.startswith("blocks.") and p.ndim >= 2])])
    opt = mica.optim.Optimizers(optimizer1=optimizer1, optimizer2=optimizer2)
    covered = sorted(opt.managed(list(names)))
    if covered != sorted(names):
        raise mica.MicaError("the speedrun's optimizers must cover every parameter exactly once")
    return opt


def set_hparams(step, train_steps, cooldown_frac=0.7):
    """The seed's learning-rate multiplier eta: stable, then a linear decay to zero."""
    return mica.optim.stable_then_decay(step, train_steps, cooldown_frac)


def loss_fn(model):
    """(params, inputs, targets) -> the summed cross-entropy, for mica.value_and_grad."""
    def loss(params, inputs, targets):
        return nn.functional_call(model, params, inputs, targets)
    return loss


def train_step(model, opt, train_steps, cooldown_frac=0.7, accumulate=None):
    """The seed's training section as one traced function: the micro-batches' summed-loss backward
    passes accumulate (gradients added), then set_hparams(step) and both optimizers step.
    (params, opt_state, inputs [accum, mbs, T], targets [accum, mbs, T], step) ->
    (params, opt_state, {"loss": summed loss over the batch, "lr": eta}). `accumulate(micro_grad,
    count)` -> (gradients, total loss) replaces the sum of the `count` micro-batches' (loss,
    gradients) (a data-parallel rank's share: mica/train/programs.py)."""
    forward = loss_fn(model)

    def summed(micro_grad, count):
        grads, total = None, None
        for i in range(count):
            loss, g = micro_grad(i)
            grads = g if grads is None else {n: grads[n] + g[n] for n in grads}
            total = loss if total is None else total + loss
        return grads, total

    def step_fn(params, opt_state, inputs, targets, step):
        micro_grad = lambda i: mica.value_and_grad(forward)(params, inputs[i], targets[i])  # noqa: E731
        grads, total = (accumulate or summed)(micro_grad, inputs.size(0))
        eta = set_hparams(step, train_steps, cooldown_frac)
        params, opt_state = opt.update(params, grads, opt_state, lr_scale=eta)
        return params, opt_state, {"loss": total, "lr": eta}

    return step_fn


def build(vocab_size=50304, num_layers=12, model_dim=768, head_dim=128):
    """The seed's model with its initialization: PyTorch's defaults, then every "proj" zeroed."""
    return zero_projections(GPT(vocab_size=vocab_size, num_layers=num_layers, model_dim=model_dim, head_dim=head_dim))
