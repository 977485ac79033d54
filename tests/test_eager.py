"""Outside a trace, as torch's eager mode: a module called on host tensors (nanoGPT's generate()),
torch's random draws, and torch.Tensor's methods where numpy has the same name. Each model and loop
is written once, as a function of the library it runs on (`mica` or `torch`): the same line means
the same thing in both."""
import inspect
import math

import numpy as np
import pytest
import torch

import mica
from helpers import rel_err, load_values


def _tiny_gpt(lib):
    """A GPT as nanoGPT's model.py writes it (its attention, MLP, blocks and generate)."""
    nn, F = lib.nn, lib.nn.functional

    class Attention(nn.Module):
        def __init__(self, n_embd, n_head, block_size):
            super().__init__()
            self.c_attn, self.c_proj, self.n_head = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd), n_head
            self.register_buffer("bias", lib.tril(lib.ones(block_size, block_size)).view(1, 1, block_size, block_size))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class Block(nn.Module):
        def __init__(self, n_embd, n_head, block_size):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(n_embd), Attention(n_embd, n_head, block_size)
            self.ln_2 = nn.LayerNorm(n_embd)
            self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self, vocab_size=11, block_size=6, n_embd=16, n_head=2, n_layer=2):
            super().__init__()
            self.block_size = block_size
            self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
            self.h = nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)])
            self.ln_f, self.lm_head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab_size, bias=False)

        def forward(self, idx, targets=None):
            b, t = idx.size()
            pos = lib.arange(0, t, dtype=lib.long)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
            return logits, loss

        @lib.no_grad()
        def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, sample=None):
            for _ in range(max_new_tokens):
                idx_cond = idx if idx.size(1) <= self.block_size else idx[:, -self.block_size:]
                logits, _ = self(idx_cond)
                logits = logits[:, -1, :] / temperature
                if top_k is not None:
                    v, _ = lib.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("Inf")
                probs = F.softmax(logits, dim=-1)
                idx_next = lib.multinomial(probs, num_samples=1) if sample else lib.argmax(probs, -1, keepdim=True)
                idx = lib.cat((idx, idx_next), dim=1)
            return idx

    return GPT()


def test_a_model_runs_eagerly_on_host_tensors_and_generates_torchs_tokens():
    """nanoGPT's generate() calls the model outside any trace: each call is the forward traced once
    and run on the oracle (float32), with bound weights or, unbound, its initial ones; top-k's
    masking with topk and a bool-mask assignment, then the same greedy tokens as torch's."""
    model, tmodel = _tiny_gpt(mica), _tiny_gpt(torch)
    params = model.init(5)
    tmodel.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict(params).items()})
    idx = np.array([[1, 2, 3], [4, 0, 9]])
    with model.bind({k: mica.tensor(v) for k, v in params.items()}):
        logits, loss = model(mica.tensor(idx), mica.tensor(idx[:, ::-1].copy()))
        tokens = model.generate(mica.tensor(idx), 5, temperature=0.8, top_k=4)
    tlogits, tloss = tmodel(torch.from_numpy(idx), torch.from_numpy(idx[:, ::-1].copy()))
    assert isinstance(logits, mica.HostTensor) and logits.dtype == np.float32
    assert rel_err(logits, tlogits.detach().numpy()) < 1e-5 and abs(float(loss) - tloss.item()) < 1e-5
    assert tokens.tolist() == tmodel.generate(torch.from_numpy(idx), 5, temperature=0.8, top_k=4).tolist()

    # unbound: the initial weights (drawn once, as a torch module holds them until trained), said once
    with pytest.warns(UserWarning, match="called outside a trace with no values"):
        first, _ = model(mica.tensor(idx))
    again, _ = model(mica.tensor(idx))
    with model.bind({k: mica.tensor(np.array(v)) for k, v in model.state_dict().items() if k in model.init(0)}):
        bound, _ = model(mica.tensor(idx))  # (the initial values it holds, bound: the same)
    assert np.array_equal(first, again) and np.array_equal(first, bound)

    # sampled: every token drawn from the top 3 of its step, the same tokens under the same seed
    with model.bind({k: mica.tensor(v) for k, v in params.items()}):
        mica.manual_seed(7)
        drawn = model.generate(mica.tensor(idx), 4, top_k=3, sample=True)
        mica.manual_seed(7)
        assert np.array_equal(model.generate(mica.tensor(idx), 4, top_k=3, sample=True), drawn)
        for t in range(3, 7):
            logits, _ = model(drawn[:, max(0, t - 6):t])
            top3 = np.argsort(-np.asarray(logits[:, -1]), axis=-1)[:, :3]
            assert all(drawn[b, t] in top3[b] for b in range(2))


def test_random_draws_repeat_under_a_seed_and_follow_torchs_signatures():
    mica.manual_seed(3)
    a = (mica.randn(2, 3), mica.rand((4,)), mica.randint(5, (3, 2)), mica.randint(2, 9, size=(50,)), mica.randperm(6))
    mica.manual_seed(3)
    b = (mica.randn(2, 3), mica.rand((4,)), mica.randint(5, (3, 2)), mica.randint(2, 9, size=(50,)), mica.randperm(6))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert a[0].dtype == np.float32 and a[2].dtype == np.int64 and a[0].shape == (2, 3)
    assert a[3].min() >= 2 and a[3].max() < 9 and sorted(a[4].tolist()) == list(range(6))
    g1, g2 = mica.Generator().manual_seed(11), mica.Generator().manual_seed(11)
    mica.randn(5)  # (the default stream moves; a generator's own does not)
    assert np.array_equal(mica.randn(4, generator=g1), mica.randn(4, generator=g2))

    drop, ones = mica.nn.Dropout(0.5), mica.ones(4, 16)  # (eager dropout: new bits each call, as torch's)
    mica.manual_seed(1)
    first, second = drop(ones), drop(ones)
    mica.manual_seed(1)
    assert np.array_equal(drop(ones), first) and not np.array_equal(first, second)
    assert np.unique(first).tolist() == [0.0, 2.0] and np.array_equal(drop.eval()(ones), ones)

    weights = mica.tensor([[0.0, 1.0, 3.0, 0.0], [2.0, 0.0, 0.0, 2.0]])
    picks = mica.multinomial(weights, 2)
    assert picks.dtype == np.int64 and sorted(picks[0].tolist()) == [1, 2] and sorted(picks[1].tolist()) == [0, 3]
    many = mica.multinomial(weights[0], 20000, replacement=True)
    counts = np.bincount(many, minlength=4)
    assert counts[0] == counts[3] == 0 and abs(counts[2] / 20000 - 0.75) < 0.02
    with pytest.raises(mica.MicaError, match="without replacement from 4 categories"):
        mica.multinomial(weights, 5)
    with pytest.raises(mica.MicaError, match="finite and non-negative"):
        mica.multinomial(mica.tensor([0.5, -0.1]), 1)
    with pytest.raises(mica.TraceError, match=r"mica.randperm draws random numbers on the host, outside a traced "
                                              r"step; inside one, randomness is the program's"):
        mica.trace(lambda x: x + mica.randperm(3), mica.f32[3])  # (randn there: tests/test_draws.py)


def test_host_tensors_mean_torchs_methods_and_numpy_functions_keep_numpys():
    """np.sort(h) calls h.sort(axis=...) and np.flatnonzero(h) h.nonzero(): numpy's meaning there;
    h.sort(), h.argsort(dim=...), h.cumsum(dim=...), h.nonzero(), h.data are torch's."""
    h = mica.tensor([[3.0, 1.0, 2.0], [0.0, 5.0, -1.0]])
    t = torch.tensor(np.asarray(h))
    values, indices = h.sort(dim=1, descending=True)
    tv, ti = t.sort(dim=1, descending=True)
    assert np.array_equal(values, tv.numpy()) and np.array_equal(indices, ti.numpy())
    assert h.tolist() == t.tolist()  # (not sorted in place, as numpy's ndarray.sort would)
    assert np.array_equal(h.argsort(dim=0), t.argsort(dim=0).numpy())
    assert np.allclose(h.cumsum(dim=1), t.cumsum(dim=1).numpy()) and np.array_equal(np.sort(h), np.sort(t.numpy()))
    assert np.array_equal(h.nonzero(), t.nonzero().numpy()) and np.array_equal(np.flatnonzero(h), [0, 1, 2, 4, 5])
    assert np.array_equal(h.any(dim=0), t.any(dim=0).numpy()) and bool(np.any(h)) and h.data is h
    assert np.array_equal(h.topk(2).values, t.topk(2).values.numpy())
    hn = np.asarray(h)  # (numpy's functions that call these methods inside: numpy's results)
    for f in (np.unique, lambda a: np.repeat(a, 2), lambda a: np.tile(a, 2), np.median, np.transpose, np.ravel,
              lambda a: np.argwhere(a > 1)):
        assert np.array_equal(f(h), f(hn))
    assert np.array_equal(h.repeat(2, 1), t.repeat(2, 1).numpy())
    assert np.array_equal((h.long() // 2) % 3, ((t.long() // 2) % 3).numpy())
    with pytest.raises(mica.MicaError, match=r"^Mica has no Tensor.stft \(torch.Tensor.stft\)"):
        h.stft(4)


def test_configure_optimizers_as_nanogpt_writes_it():
    """nanoGPT's configure_optimizers: groups of Parameter objects (each found by the name
    named_parameters() gave it), the `fused` check by inspect.signature, build-nanogpt's
    fused=False: the same step as groups of names."""
    model = _tiny_gpt(mica)
    param_dict = {pn: p for pn, p in model.named_parameters() if p.requires_grad}
    groups = [{"params": [p for n, p in param_dict.items() if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for n, p in param_dict.items() if p.dim() < 2], "weight_decay": 0.0}]
    extra = dict(fused=True) if "fused" in inspect.signature(mica.optim.AdamW).parameters else dict()
    by_objects = mica.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), fused=False, **extra)
    by_names = mica.optim.AdamW([{"params": [n for n, p in param_dict.items() if p.dim() >= 2], "weight_decay": 0.1},
                                 {"params": [n for n, p in param_dict.items() if p.dim() < 2], "weight_decay": 0.0}],
                                lr=1e-2, betas=(0.9, 0.95))
    params = model.init(1)
    grads = {k: np.random.default_rng(2).standard_normal(v.shape).astype(np.float32) for k, v in params.items()}
    specs = model.param_specs()
    out = []
    for opt in (by_objects, by_names):
        state = opt.init(params)
        step = mica.trace(lambda p, g, s: opt.update(p, g, s), specs, specs, opt.state_specs(specs))
        out.append(mica.reference.run(step, params, grads, state)[0])
    assert all(np.array_equal(out[0][k], out[1][k]) for k in params)
    assert not np.array_equal(out[0]["lm_head.weight"], params["lm_head.weight"])
    # crop_block_size: a smaller Parameter of the first rows of another's (initial) values
    before = np.array(model.wpe.weight)
    model.wpe.weight = mica.nn.Parameter(model.wpe.weight[:4])
    assert model.param_specs()["wpe.weight"].shape == (4, 16)
    assert np.array_equal(model.init(0)["wpe.weight"], before[:4])
    stranger = mica.nn.Linear(2, 2).weight
    with pytest.raises(mica.MicaError, match="group 0 holds a Parameter that is not among the model's parameters"):
        mica.optim.AdamW([{"params": [stranger]}]).init(params)
    with pytest.raises(mica.MicaError, match=r"^AdamW: maximize=True is torch's option Mica does not have"):
        mica.optim.AdamW(lr=1e-3, maximize=True)


def test_compile_without_specs_is_torch_compile():
    """torch.compile(fn): compiled at the first call for its arguments' shapes and types, again for
    others; torch.compile(model) keeps the model (nanoGPT's `model = torch.compile(model)`)."""
    @mica.compile
    def step(x, w, scale):
        return (x @ w).relu().sum() * scale

    x, w = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)[:, :, :3], np.eye(3, dtype=np.float32)
    got = step(x[0], w, 2.0)
    assert abs(float(got) - float(np.maximum(x[0] @ w, 0).sum()) * 2) < 1e-5
    step(x[1], w, 2.0)
    assert len(step.built) == 1  # (the same shapes: built once)
    step(x[0][:2], w, 2.0)
    assert len(step.built) == 2
    model = mica.nn.Linear(3, 2)
    assert mica.compile(model) is model
    assert mica.compile(opt_level=1)(lambda a: a + 1)(np.zeros(2, np.float32)).tolist() == [1.0, 1.0]


def test_a_model_holds_loaded_values_for_eager_calls_and_says_when_it_has_none():
    """load_state_dict (numpy arrays, host or torch tensors, torch's keys) gives the values eager
    calls run with; without any, a call runs with the initial values and says so once, at the
    user's line; the torch habits a functional step replaces are sentences."""
    mica.manual_seed(4)
    model, tmodel = _tiny_gpt(mica), _tiny_gpt(torch)
    idx = np.array([[1, 2, 3]])
    with pytest.warns(UserWarning, match=r"^GPT is called outside a trace with no values for wte.weight and \d+ more: "
                                         r"it runs with their initial values \(drawn when it was made, from "
                                         r"mica.manual_seed's seed\)"):
        first, _ = model(mica.tensor(idx))
    mica.manual_seed(4)  # (the same seed, the same initial values, whatever names were asked for meanwhile)
    again = _tiny_gpt(mica)
    assert all(np.array_equal(v, again.state_dict()[k]) for k, v in model.state_dict().items())
    result = model.load_state_dict(tmodel.state_dict())  # (torch tensors, torch's keys, the buffers among them)
    assert result.missing_keys == [] and result.unexpected_keys == []
    got, _ = model(mica.tensor(idx))
    want, _ = tmodel(torch.from_numpy(idx))
    assert rel_err(got, want.detach().numpy()) < 1e-5 and not np.array_equal(got, first)
    assert np.array_equal(model.state_dict()["wte.weight"], tmodel.state_dict()["wte.weight"].numpy())
    with pytest.raises(mica.MicaError, match=r"^GPT.load_state_dict: missing wpe.weight; unexpected extra \(torch's "
                                             r"keys.*pass strict=False"):
        model.load_state_dict({**{k: v for k, v in tmodel.state_dict().items() if k != "wpe.weight"}, "extra": 1})
    with pytest.raises(mica.MicaError, match=r"^GPT.load_state_dict: wte.weight has shape \[2, 2\], the model's is "):
        model.load_state_dict({"wte.weight": np.zeros((2, 2))}, strict=False)

    opt = mica.optim.AdamW(model.parameters(), lr=1e-3)
    assert opt.zero_grad() is None
    with pytest.raises(mica.MicaError, match=r"^AdamW.step\(\) updates parameters in a compiled step: put the step in "
                                             r"a function under @mica.compile, or write params, state = "
                                             r"optimizer.update\(params, grads, state\)"):
        opt.step()
    with pytest.raises(mica.MicaError, match=r"^AdamW.init takes the parameters' values, \{name: array\}"):
        opt.init(dict(model.named_parameters()))
    with pytest.raises(mica.MicaError, match=r"^Mica computes gradients in a compiled step: put the step \(forward, "
                                             r"backward\(\), optimizer.step\(\)\) in a function under @mica.compile"):
        mica.trace(lambda x: (x * 2).sum().backward(), mica.f32[3])
    with pytest.raises(mica.MicaError, match=r"^Mica computes gradients in a compiled step.*test_eager.py:\d+"):
        mica.tensor([1.0, 2.0]).sum().backward()


def test_a_torch_training_loop_compiles_as_written_and_trains_torchs_model():
    """torch's loop body under @mica.compile: the model's parameters read unbound, zero_grad,
    backward, clip_grad_norm_ and step; a learning rate set in param_groups between calls; the
    model keeps the trained values (eager calls read them), and the same losses as torch's. torch's
    initial weights from a seed of their own: drawn from whatever torch's generator was left at by
    the tests before (another file's torch.nn.Linear), one such start put a layer norm's bias at
    1.06e-5 after four Adam steps, where a dozen seeded starts give at most 2.2e-6."""
    torch.manual_seed(0)
    model, tmodel = _tiny_gpt(mica), _tiny_gpt(torch)
    model.load_state_dict(tmodel.state_dict())
    opt = mica.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    topt = torch.optim.AdamW(tmodel.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)

    @mica.compile
    def train_step(xb, yb):
        logits, loss = model(xb, yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = mica.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss, norm, model.lm_head.weight.grad.sum()

    rng = np.random.default_rng(4)
    for it in range(4):
        xb, yb = rng.integers(0, 11, (2, 6)), rng.integers(0, 11, (2, 6))
        loss, norm, gsum = train_step(xb, yb)
        _, tloss = tmodel(torch.from_numpy(xb), torch.from_numpy(yb))
        topt.zero_grad(set_to_none=True)
        tloss.backward()
        tnorm = torch.nn.utils.clip_grad_norm_(tmodel.parameters(), 1.0)
        tgsum = tmodel.lm_head.weight.grad.sum()
        topt.step()
        assert abs(float(loss) - tloss.item()) < 2e-6 * abs(tloss.item()) and abs(float(norm) - tnorm.item()) < 1e-5
        assert abs(float(gsum) - tgsum.item()) < 1e-5
        for g, tg in zip(opt.param_groups, topt.param_groups):
            g["lr"] *= 0.5
            tg["lr"] *= 0.5
    assert len(train_step.built) == 1
    for name, tp in tmodel.named_parameters():  # (c_attn's bias: the keys' part has a gradient of rounding noise,
        if not name.endswith("c_attn.bias"):    # which Adam scales up to whole steps, in torch as here)
            assert rel_err(model.state_dict()[name], tp.detach().numpy()) < 1e-5, name
    idx = np.array([[1, 2, 3]])
    logits, _ = model(mica.tensor(idx))  # (outside a trace: the trained values, no warning)
    assert rel_err(logits, tmodel(torch.from_numpy(idx))[0].detach().numpy()) < 1e-5


def test_a_compiled_torch_step_follows_the_models_train_and_eval_modes():
    """The step's dropout follows model.train()/eval() at each call (a program per mode), as torch's."""
    class Net(mica.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.drop = mica.nn.Linear(4, 4), mica.nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(self.fc(x)).square().mean()

    net = Net()
    opt = mica.optim.SGD(net.parameters(), lr=0.0)  # (no change: the same loss but for dropout)

    @mica.compile
    def step(x):
        loss = net(x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    x = np.random.default_rng(2).standard_normal((8, 4)).astype(np.float32)
    with pytest.warns(UserWarning):
        plain = float(net.eval()(x))
    net.train()
    a, b = float(step(x)), float(step(x))
    assert a != b and a != plain  # (a new mask each call)
    net.eval()
    assert abs(float(step(x)) - plain) < 1e-6


def test_a_manual_update_loop_of_loose_parameters_compiles_as_torchs():
    """makemore's loop: Parameters outside any module, p.grad = None, loss.backward(), then
    p.data += -lr * p.grad: the same losses as torch's; a changing learning rate passed as a
    numpy scalar is an input (one program)."""
    rng = np.random.default_rng(0)
    X, Y = rng.integers(0, 27, (32, 3)), rng.integers(0, 27, (32,))
    start = [rng.standard_normal((27, 10)).astype(np.float32), (rng.standard_normal((30, 27)) * 0.1).astype(np.float32),
             np.zeros(27, np.float32)]

    def losses(lib):
        C, W, b = (mica.nn.Parameter(a.copy()) if lib is mica else torch.tensor(a.copy(), requires_grad=True)
                   for a in start)
        parameters = [C, W, b]

        def step(xb, yb, lr):
            emb = C[xb]
            loss = lib.nn.functional.cross_entropy(emb.view(emb.shape[0], -1) @ W + b, yb)
            for p in parameters:
                p.grad = None
            loss.backward()
            for p in parameters:
                p.data += -lr * p.grad
            return loss

        step = mica.compile(step) if lib is mica else step
        out = []
        for i in range(5):
            xb, yb = X[i * 4:i * 4 + 12], Y[i * 4:i * 4 + 12]
            lr = np.float32(0.1 / (i + 1))
            out.append(float(step(xb, yb, lr)) if lib is mica else step(torch.tensor(xb), torch.tensor(yb), lr).item())
        return out, step

    got, step = losses(mica)
    want, _ = losses(torch)
    assert np.allclose(got, want, rtol=2e-6) and len(step.built) == 1
    assert (mica.nn.Parameter(np.ones(2, np.float32)) * 2).tolist() == [2.0, 2.0]  # (outside: its values)
    one = mica.nn.Parameter(np.array(-1.5, np.float32))
    assert (float(one), int(one), float(abs(one))) == (-1.5, -1, 1.5)  # (torch's float(p) of one element)
    with pytest.raises(mica.MicaError, match=r"^a Parameter's __mul__: a Parameter is read in a traced function "
                                             r"through the params bound to it"):
        mica.trace(lambda x: mica.nn.Parameter(np.ones(2, np.float32)) * x, mica.f32[2])


def test_a_torch_step_keeps_gradients_between_calls_and_follows_every_setting_as_torchs():
    """torch keeps p.grad between calls until zero_grad (accumulation over calls), re-reads every
    group setting, takes zero_grad(set_to_none=False)'s zeros as gradients (AdamW still decays),
    and lets p.grad be set; each as torch's, from the same weights."""
    x = np.ones((2, 3), np.float32)

    def pair(make, tmake):
        m, t = mica.nn.Linear(3, 1), torch.nn.Linear(3, 1)
        m.load_state_dict(t.state_dict())
        return m, t, make(m.parameters()), tmake(t.parameters())

    def same(m, t):
        return all(np.allclose(m.state_dict()[k], v.detach().numpy(), rtol=1e-6, atol=1e-7)
                   for k, v in t.state_dict().items())

    def loop_body(model, opt, zero_first):  # (the same lines for torch and, compiled, for Mica)
        def step(x):
            if zero_first:
                opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            opt.step()
            return loss
        return step

    def steps(zero_first, count, between=lambda groups: None):
        m, t, mo, to = pair(lambda ps: mica.optim.SGD(ps, lr=0.1), lambda ps: torch.optim.SGD(ps, lr=0.1))
        mine, theirs = mica.compile(loop_body(m, mo, zero_first)), loop_body(t, to, zero_first)
        for _ in range(count):
            mine(x), theirs(torch.tensor(x))
            between(mo.param_groups + to.param_groups)
        return m, t, mo, to

    assert same(*steps(False, 2)[:2])  # (no zero_grad: gradients add up over calls)

    def settings(groups):  # (a group's other settings, set between calls)
        for g in groups:
            g["weight_decay"], g["momentum"] = 5.0, 0.5

    assert same(*steps(True, 3, settings)[:2])

    m, t, mo, to = pair(lambda ps: mica.optim.SGD(ps, lr=0.1), lambda ps: torch.optim.SGD(ps, lr=0.1))
    micro = mica.compile(lambda x: m(x).sum().backward())  # (accumulated over two calls, applied by a third)
    apply = mica.compile(lambda: (mo.step(), mo.zero_grad(), m.bias.sum())[-1])
    micro(x), micro(x), apply()
    for _ in range(2):
        t(torch.tensor(x)).sum().backward()
    to.step()
    to.zero_grad()
    assert same(m, t)

    m, t, mo, to = pair(lambda ps: mica.optim.AdamW(ps, lr=0.1, weight_decay=0.5),
                        lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.5))

    @mica.compile
    def zeros_kept(x):
        loss = m(x).sum()
        loss.backward()
        mo.zero_grad(set_to_none=False)
        m.bias.grad = None  # (dropped: the bias is skipped, the weight decays)
        mo.step()
        return loss

    zeros_kept(x)
    t(torch.tensor(x)).sum().backward()
    to.zero_grad(set_to_none=False)
    t.bias.grad = None
    to.step()
    assert same(m, t)
    with pytest.raises(mica.MicaError, match=r"^AdamW was given another library's Parameters"):
        mica.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    assert mo.state_dict()["param_groups"][0]["weight_decay"] == 0.5


def test_makemores_bigram_network_trains_as_written_with_its_loop_body_compiled():
    """makemore part 1: W = torch.randn(..., requires_grad=True) (a Parameter here), one_hot,
    counts.sum(1, keepdims=True), -probs[arange, ys].log().mean(), W.grad = None, backward(),
    W.data += -50 * W.grad; and W computes eagerly with its trained values after."""
    xs, ys = np.array([0, 5, 13, 13, 1, 0, 15]), np.array([5, 13, 13, 1, 0, 15, 12])
    W0 = np.random.default_rng(0).standard_normal((27, 27)).astype(np.float32)

    def train(lib):
        F = lib.nn.functional
        X, Y = lib.tensor(xs), lib.tensor(ys)
        W = lib.tensor(W0, requires_grad=True)

        def body(X, Y):
            xenc = F.one_hot(X, num_classes=27).float()
            counts = (xenc @ W).exp()
            probs = counts / counts.sum(1, keepdims=True)
            loss = -probs[lib.arange(len(xs)), Y].log().mean() + 0.01 * (W ** 2).mean()
            W.grad = None
            loss.backward()
            W.data += -50 * W.grad
            return loss

        step = mica.compile(body) if lib is mica else body
        losses = [step(X, Y).item() for _ in range(4)]
        return losses, np.asarray(W.detach() if lib is torch else W)

    (got, w), (want, tw) = train(mica), train(torch)
    assert np.allclose(got, want, rtol=1e-5) and np.allclose(w, tw, rtol=1e-4, atol=1e-5)  # (lr 50: float32's
                                                                                             # roundings grow)
    leaf = mica.randn(3)
    leaf.requires_grad = True  # (a leaf in place now, as torch's: test_a_host_tensor_made_a_leaf_in_place_...)
    assert leaf.requires_grad and leaf.grad is None
    assert int(mica.tensor([5, -5, 0]).__mod__(0).sum()) == 0 and mica.remainder(mica.tensor([5, -5]), 0).tolist() == [0, 0]


def test_a_torch_loop_laid_out_as_users_lay_it_out_trains_torchs_model():
    """From an outside tester's ports, each against torch from the same weights: zero_grad() and
    `p.grad = None` outside the step, a checkpoint's state_dict() taken between calls (names added
    to the parameters), a parameter frozen after two calls, a group added (progressive unfreezing:
    fresh state), a branch that gets no gradient in some calls (Adam's step count per parameter),
    a group's params a generator, and an lr the step computes from its argument."""
    x = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)

    def nets(lib):
        class Net(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.body, self.head, self.side = lib.nn.Linear(3, 3), lib.nn.Linear(3, 1), lib.nn.Linear(3, 1)

            def forward(self, x, use_side=True):
                y = self.head(lib.tanh(self.body(x))).sum()
                return y + self.side(x).pow(2).sum() if use_side else y
        return Net()

    def pair():
        torch.manual_seed(1)
        t, m = nets(torch), nets(mica)
        m.load_state_dict(t.state_dict())
        return m, t

    def same(m, t, tol=2e-6):
        return max(float(np.abs(m.state_dict()[k] - v.detach().numpy()).max()) for k, v in t.state_dict().items()) < tol

    def body(model, opt):
        def step(x, use_side=True):
            loss = model(x, use_side)
            loss.backward()
            opt.step()
            return loss
        return step

    m, t = pair()
    mo = mica.optim.Adam([{"params": m.head.parameters(), "lr": 0.05}], lr=0.1)  # (a generator, read once)
    to = torch.optim.Adam([{"params": t.head.parameters(), "lr": 0.05}], lr=0.1)
    mine, theirs = mica.compile(body(m, mo)), body(t, to)
    for i in range(6):
        mo.zero_grad(), to.zero_grad()  # (outside the step)
        if i == 1:
            m.state_dict(), t.state_dict()  # (a checkpoint: the head's parameters get their full names)
        if i == 2:
            mo.add_param_group({"params": list(m.body.parameters()) + list(m.side.parameters()), "lr": 0.02})
            to.add_param_group({"params": list(t.body.parameters()) + list(t.side.parameters()), "lr": 0.02})
        if i == 4:
            m.body.weight.requires_grad_(False), t.body.weight.requires_grad_(False)
        mine(x, i % 2 == 0), theirs(torch.tensor(x), i % 2 == 0)  # (the side branch: a gradient every other call)
        assert same(m, t), i
    assert mo.state_dict()["state"][5]["step"] == to.state_dict()["state"][5]["step"] == 2
    m.side.bias.grad, t.side.bias.grad = None, None
    m.body.bias.grad = np.full(3, 0.5, np.float32)
    t.body.bias.grad = torch.full((3,), 0.5)
    mica.compile(lambda: (mo.step(), m.head.bias.sum())[-1])()
    to.step()
    assert same(m, t)

    m, t = pair()
    mo, to = mica.optim.SGD(m.parameters(), lr=0.0, momentum=0.9), torch.optim.SGD(t.parameters(), lr=0.0, momentum=0.9)

    @mica.compile
    def scheduled(x, it):  # (the lr computed in the step from an argument: each call's, and the group holds it)
        for g in mo.param_groups:
            g["lr"] = 0.1 / (1 + it)
        mo.zero_grad()
        m(x).backward()
        mo.step()

    for i in range(3):
        scheduled(x, np.float32(i))
        for g in to.param_groups:
            g["lr"] = 0.1 / (1 + i)
        to.zero_grad(), t(torch.tensor(x)).backward(), to.step()
        assert same(m, t) and abs(mo.param_groups[0]["lr"] - 0.1 / (1 + i)) < 1e-8


def test_parameters_outside_a_step_hold_values_torchs_in_place_edits_change():
    """Outside a trace a Parameter is the values it holds: torch's in-place edits (fill_, zero_,
    nn.init, p.data =, p[i] = v, an EMA's mul_/add_/lerp_ with another Parameter) change them
    where it holds loaded or trained values, and verbs take Parameters as torch's take tensors."""
    t, m = torch.nn.Linear(3, 2), mica.nn.Linear(3, 2)
    m.load_state_dict(t.state_dict())
    e, te = mica.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    e.load_state_dict(te.state_dict())
    for lib, lin, ema in ((mica, m, e), (torch, t, te)):
        with lib.no_grad():
            lin.weight[0, 1] = 7.0
            lin.weight[1] = 0.5
            lin.bias.data.zero_()
            ema.weight.mul_(0.9).add_(lin.weight, alpha=0.1)
            ema.bias.lerp_(lin.bias + 1, 0.25)
    got = {k: np.asarray(v) for k, v in e.state_dict().items()}
    assert all(np.allclose(got[k], v.detach().numpy(), rtol=1e-6) for k, v in te.state_dict().items())
    assert np.array_equal(m.state_dict()["bias"], [0, 0]) and m.state_dict()["weight"][0, 1] == 7.0
    mica.nn.init.zeros_(m.weight)
    assert not np.asarray(m(mica.ones(1, 3))).any()
    assert np.asarray(mica.cat([m.bias, e.bias])).shape == (4,)
    assert np.allclose(np.asarray(mica.nn.functional.linear(mica.ones(1, 3), e.weight, e.bias)),
                       te(torch.ones(1, 3)).detach().numpy(), rtol=1e-6)
    m.weight.data = np.ones((2, 3), np.float32)
    assert np.asarray(m(mica.ones(1, 3))).tolist() == [[3.0, 3.0]]


def test_a_compiled_steps_dropout_follows_manual_seed_and_backward_says_what_torch_refuses():
    def masks(seed):
        mica.manual_seed(seed)
        net = mica.nn.Sequential(mica.nn.Linear(16, 16), mica.nn.Dropout(0.5))
        opt = mica.optim.SGD(net.parameters(), lr=0.0)

        @mica.compile
        def step(x):
            opt.zero_grad()
            out = net(x)
            out.sum().backward()
            opt.step()
            return out != 0

        return [np.asarray(step(np.ones((1, 16), np.float32))) for _ in range(2)]

    a, b, c = masks(1), masks(2), masks(1)
    assert all(np.array_equal(p, q) for p, q in zip(a, c)) and not np.array_equal(a[0], b[0])
    assert not np.array_equal(a[0], a[1])  # (new bits each call)

    m = mica.nn.Linear(3, 1)
    opt = mica.optim.SGD(m.parameters(), lr=0.1)
    x = np.ones((2, 3), np.float32)
    for bad, text in ((lambda loss: loss.detach().backward(), "no parameter requiring a gradient reaches"),
                      (lambda loss: (loss.backward(), loss.backward()), "called twice on the same loss")):
        step = mica.compile(lambda x, bad=bad: (opt.zero_grad(), bad(m(x).sum()), opt.step()) and None)
        with pytest.raises(mica.MicaError, match=text):
            step(x)

    def twice(x):  # (allowed with retain_graph=True first, as torch's: the gradient counted twice)
        opt.zero_grad()
        loss = m(x).sum()
        loss.backward(retain_graph=True)
        loss.backward()
        opt.step()

    before = np.array(m.state_dict()["bias"])
    mica.compile(twice)(x)
    assert np.allclose(m.state_dict()["bias"], before - 0.1 * 4, rtol=1e-6)
    with pytest.raises(mica.MicaError, match=r"^Mica has no mica.nn.utils.vector_to_parameters"):
        mica.nn.utils.vector_to_parameters(m.parameters(), 1.0)
    with pytest.raises(mica.MicaError, match=r"^SGD: lr must be a finite number >= 0, got -1 \(.*test_eager.py:\d+\)$"):
        mica.optim.SGD(m.parameters(), lr=-1)
    assert mica.optim.SGD(m.parameters(), lr=torch.tensor(0.5)).param_groups[0]["lr"] == 0.5


def test_manual_seed_keys_a_models_initial_weights_and_rng_state_resumes_dropout():
    """torch.manual_seed(s) before a model is made fixes its initial weights (another seed, others;
    a second model after it, others again); a compiled step's dropout key comes from the same
    generator, so get_rng_state/set_rng_state resume its masks in a fresh compiled function (a
    resumed process) exactly."""
    def weights(seed):
        mica.manual_seed(seed)
        a, b = mica.nn.Linear(4, 4), mica.nn.Linear(4, 4)
        mica.nn.init.normal_(a.weight, std=0.02)
        return a.state_dict()["weight"], b.state_dict()["weight"]

    (a1, b1), (a2, _), (a1_again, b1_again) = weights(1), weights(2), weights(1)
    assert np.array_equal(a1, a1_again) and np.array_equal(b1, b1_again)
    assert not np.array_equal(a1, a2) and not np.array_equal(a1 * 50, b1) and abs(float(np.std(a1)) - 0.02) < 0.01

    lin = mica.nn.Linear(8, 8)
    opt = mica.optim.SGD(lin.parameters(), lr=0.0)

    def body(x):
        y = mica.nn.functional.dropout(lin(x), 0.5)
        y.sum().backward()
        opt.step()
        opt.zero_grad()
        return y != 0

    x = np.ones((1, 64 // 8, 8), np.float32)
    mica.manual_seed(0)
    step = mica.compile(body)
    step(x)
    state = mica.get_rng_state()
    want = np.asarray(step(x))
    resumed = mica.compile(body)
    mica.set_rng_state(state)
    assert np.array_equal(np.asarray(resumed(x)), want)


def _scaled_loop(lib, model, opt, scaler, factor=1.0):
    """nanoGPT's loop body with its GradScaler calls (an unused extra argument: an iteration count)."""
    def step(x, *iteration):
        loss = model(x).pow(2).mean() * factor
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        lib.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss
    return step


def test_torch_lines_a_ported_train_py_holds_run_or_say_what_to_do(recwarn):
    """Lines nanoGPT's train.py and similar scripts hold: torch.cuda's questions, from_numpy,
    torch.backends' TF32 switches (a sentence: Mica's is per program), GradScaler(enabled=False)
    in torch's form (no-ops around optimizer.step()), state_dict() values with torch's methods, an
    int iteration counter that compiles the step again (a warning at the third program)."""
    a = np.arange(6.0).reshape(2, 3)
    t = mica.from_numpy(a)
    a[0, 0] = 9.0
    assert t[0, 0] == 9.0 and t.numel() == 6
    assert mica.cuda.is_available() in (True, False) and mica.cuda.device_count() in (0, 1)
    # nanoGPT's TF32 lines: torch's switches, the CUDA target's default tf32 (cuDNN's change nothing)
    from mica.targets import get_target

    assert (mica.backends.cuda.matmul.allow_tf32, mica.get_float32_matmul_precision()) == (False, "highest")
    try:
        mica.backends.cuda.matmul.allow_tf32 = True
        mica.backends.cudnn.allow_tf32 = True
        assert get_target("cuda").tf32 and not get_target("cuda", tf32=False).tf32
        assert mica.get_float32_matmul_precision() == "high"
        mica.set_float32_matmul_precision("highest")
        assert not get_target("cuda").tf32
        mica.set_float32_matmul_precision("medium")
        assert get_target("cuda").tf32
    finally:
        mica.backends.cuda.matmul.allow_tf32 = False
    with pytest.raises(mica.MicaError, match=r"^Mica has no mica.backends.cuda.matmul.allow_fp16_reduced_precision_"
                                             r"reduction .*drop the line \(.*test_eager"):
        mica.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = True
    with pytest.raises(mica.MicaError, match=r"allow_tf32 is True or False, not 1 \(.*test_eager"):
        mica.backends.cuda.matmul.allow_tf32 = 1
    assert not mica.backends.mps.is_available()  # (a device line's question: no, as on a machine without one)
    with pytest.raises(mica.MicaError, match=r"^Mica has no mica.backends.mkldnn"):
        mica.backends.mkldnn.enabled = False

    torch.manual_seed(0)
    tm = torch.nn.Linear(8, 1)
    m = mica.nn.Linear(8, 1)
    m.load_state_dict(tm.state_dict())
    assert sum(v.numel() for v in m.state_dict().values()) == 9
    assert [v.detach().cpu().numpy().shape for v in m.state_dict().values()] == [(1, 8), (1,)]
    opt, topt = mica.optim.AdamW(m.parameters(), lr=0.1), torch.optim.AdamW(tm.parameters(), lr=0.1)
    scaler, tscaler = mica.cuda.amp.GradScaler(enabled=False), torch.amp.GradScaler("cpu", enabled=False)

    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    mine, theirs = mica.compile(_scaled_loop(mica, m, opt, scaler)), _scaled_loop(torch, tm, topt, tscaler)
    for it in range(3):
        mine(x, it), theirs(torch.from_numpy(x), it)
    assert np.allclose(m.state_dict()["weight"], tm.weight.detach().numpy(), rtol=1e-5, atol=1e-7)
    said = [str(w.message) for w in recwarn if "compiled a third time" in str(w.message)]
    assert len(said) == 1 and "np.float32(...) or np.int64(...)" in said[0]


def test_an_enabled_grad_scaler_in_torchs_form_makes_torchs_decisions():
    """GradScaler(enabled=True) held by a torch-style step (nanoGPT's float16 loop: scale(loss).
    backward(), unscale_, clip, step(opt), update()): from a scale that overflows the gradients,
    the same skipped steps, backoffs and growths as torch's GradScaler on the same numbers, the
    optimizer's step count not advanced by a skipped step, torch's weights; its state_dict is
    torch's and loads torch's; what torch refuses (update() with no step, unscale_ twice) and calls
    outside a compiled step are sentences."""
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    m = mica.nn.Sequential(mica.nn.Linear(8, 16), mica.nn.GELU(), mica.nn.Linear(16, 1))
    m.load_state_dict(tm.state_dict())
    opt, topt = mica.optim.AdamW(m.parameters(), lr=0.01), torch.optim.AdamW(tm.parameters(), lr=0.01)
    settings = dict(init_scale=2.0 ** 118, growth_interval=3)  # (overflows the float32 gradients at first)
    scaler, tscaler = mica.amp.GradScaler("cpu", **settings), torch.amp.GradScaler("cpu", **settings)

    mine, theirs = mica.compile(_scaled_loop(mica, m, opt, scaler, 1e4)), _scaled_loop(torch, tm, topt, tscaler, 1e4)
    rng = np.random.default_rng(0)
    scales = []
    for _ in range(12):
        x = rng.standard_normal((4, 8)).astype(np.float32)
        mine(x), theirs(torch.from_numpy(x))
        assert scaler.state_dict() == tscaler.state_dict()
        scales.append(scaler.get_scale())
    assert len(set(scales)) > 1 and scales[0] < 2.0 ** 118  # (backed off, then grown: both paths taken)
    assert opt.state_dict()["state"][0]["step"] == topt.state_dict()["state"][0]["step"].item() < 12
    for (k, v), tv in zip(m.state_dict().items(), tm.state_dict().values()):
        assert rel_err(np.asarray(v), tv.numpy()) < 1e-5, k

    other = mica.amp.GradScaler("cpu")
    other.load_state_dict(tscaler.state_dict())
    assert other.state_dict() == tscaler.state_dict()
    with pytest.raises(mica.MicaError, match="state dict is empty"):
        other.load_state_dict({})
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(mica.MicaError, match=r"^GradScaler.scale in torch's form .* runs inside a compiled step"):
        scaler.scale(m(x).sum())

    def no_step(x):
        scaler.scale(m(x).sum()).backward()
        scaler.update()

    def twice(x):
        scaler.scale(m(x).sum()).backward()
        scaler.unscale_(opt)
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()

    with pytest.raises(mica.MicaError, match=r"^GradScaler.update\(\) found no step to judge"):
        mica.compile(no_step)(x)
    with pytest.raises(mica.MicaError, match=r"^GradScaler.unscale_\(\) was called on this optimizer already"):
        mica.compile(twice)(x)

    def made_inside(x):
        fresh = mica.amp.GradScaler("cpu")
        fresh.scale(m(x).sum()).backward()
        fresh.step(opt)
        fresh.update()

    with pytest.raises(mica.MicaError, match=r"^this GradScaler was made inside the compiled step"):
        mica.compile(made_inside)(x)

    def stepped_twice(x):
        scaler.scale(m(x).sum()).backward()
        scaler.step(opt)
        scaler.step(opt)
        scaler.update()

    def never_updated(x):
        scaler.scale(m(x).sum()).backward()
        scaler.step(opt)

    with pytest.raises(mica.MicaError, match=r"^GradScaler.step\(optimizer\) was called twice on this optimizer"):
        mica.compile(stepped_twice)(x)
    with pytest.raises(mica.MicaError, match=r"calls GradScaler.step\(optimizer\) and not scaler.update\(\) after"):
        mica.compile(never_updated)(x)

    def optimizer_inside(x):
        fresh = mica.optim.AdamW(m.parameters(), lr=0.1)
        m(x).sum().backward()
        fresh.step()

    with pytest.raises(mica.MicaError, match=r"^this AdamW was made inside the compiled step"):
        mica.compile(optimizer_inside)(x)

    def module_inside(x):
        return mica.nn.Linear(8, 1)(x).sum()

    with pytest.raises(mica.MicaError, match=r"module or Parameter made inside the compiled step is a new one"):
        mica.compile(module_inside)(x)


def test_torch_cuda_amps_names_keep_its_signatures_and_scale_takes_torchs_lists(recwarn):
    """mica.cuda.amp is torch.cuda.amp: autocast() is float16 on the card's op lists (it was the CPU's
    bfloat16 ones), autocast(False) is off, GradScaler(1024.0) takes init_scale first (it was refused)
    and `from mica.cuda.amp import ...` imports; scale() takes a list or tuple of outputs, as torch's,
    and scales each (a list was a sentence about mul); two scaled losses train torch's weights."""
    from mica.cuda.amp import GradScaler, autocast

    def kinds(ctx):
        def f(a, b):
            with ctx:
                return a @ b, (a @ b).softmax(-1)
        return [t.dtype for t in mica.trace(f, mica.f32[2, 2], mica.f32[2, 2]).outputs]

    assert kinds(autocast()) == [mica.float16, mica.float32]  # (softmax on the card's float32 list)
    assert kinds(autocast(dtype=mica.bfloat16)) == [mica.bfloat16, mica.float32]
    assert kinds(autocast(False)) == [mica.float32, mica.float32]
    assert kinds(mica.autocast("cpu", dtype=mica.float16)) == [mica.float16, mica.float16]
    assert GradScaler(1024.0, 3.0, 0.25, 7).state_dict() == torch.amp.GradScaler(
        "cpu", 1024.0, 3.0, 0.25, 7).state_dict()

    torch.manual_seed(1)
    tm = torch.nn.Linear(6, 3)
    m = mica.nn.Linear(6, 3)
    m.load_state_dict(tm.state_dict())
    opt, topt = mica.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(tm.parameters(), lr=0.1)
    scaler, tscaler = GradScaler(init_scale=256.0), torch.amp.GradScaler("cpu", init_scale=256.0)

    def step(lib, model, o, sc, x):
        y = model(x)
        first, (second,) = sc.scale([y.square().mean(), (y.sum(),)])
        (first + second).backward()
        sc.step(o)
        sc.update()
        o.zero_grad()
        return first

    mine = mica.compile(lambda x: step(mica, m, opt, scaler, x))
    x = np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32)
    for _ in range(3):
        got, want = mine(x), step(torch, tm, topt, tscaler, torch.from_numpy(x))
        assert rel_err(np.asarray(got), want.detach().numpy()) < 1e-5
    for v, tv in zip(m.state_dict().values(), tm.state_dict().values()):
        assert rel_err(np.asarray(v), tv.numpy()) < 1e-5

    def number(x):
        scaler.scale(m(x).sum() + scaler.scale(3.0)).backward()
        scaler.step(opt)
        scaler.update()

    with pytest.raises(mica.MicaError, match=r"^GradScaler.scale: outputs must be a Tensor or a list or tuple"):
        mica.compile(number)(x)


def test_an_optimizers_state_dict_is_torchs_layout_and_resumes_from_either_side():
    """optimizer.state_dict() keys each parameter's state by its place in the groups, as torch's,
    so a resume in fresh objects finds it whatever names the parameters were given meanwhile, and
    torch's own optimizer state loads: training goes on as torch's does."""
    x = np.random.default_rng(5).standard_normal((4, 3)).astype(np.float32)
    torch.manual_seed(2)
    t = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    to = torch.optim.AdamW([{"params": t[0].parameters()}, {"params": t[2].parameters(), "lr": 0.02}], lr=0.05)

    def step_of(model, opt):
        def step(x):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
        return step

    def fresh():
        m = mica.nn.Sequential(mica.nn.Linear(3, 4), mica.nn.Tanh(), mica.nn.Linear(4, 1))
        return m, mica.optim.AdamW([{"params": m[0].parameters()}, {"params": m[2].parameters(), "lr": 0.02}],
                                   lr=0.05)

    m, mo = fresh()
    m.load_state_dict(t.state_dict())
    mine, theirs = mica.compile(step_of(m, mo)), step_of(t, to)
    for _ in range(2):
        mine(x), theirs(torch.from_numpy(x))
    saved, model_saved = mo.state_dict(), {k: np.array(v) for k, v in m.state_dict().items()}
    assert sorted(saved["state"]) == [0, 1, 2, 3] and saved["param_groups"][1]["params"] == [2, 3]
    assert int(saved["state"][3]["step"]) == 2 and saved["state"][3]["exp_avg"].shape == (1,)
    for source in (saved, to.state_dict()):  # (Mica's own, and torch's: tensors, its float step counts)
        m2, mo2 = fresh()
        sum(p.numel() for p in m2.parameters())  # (names given before the first call: keys change, places do not)
        m2.load_state_dict(model_saved if source is saved else t.state_dict())
        mo2.load_state_dict(source)
        mica.compile(step_of(m2, mo2))(x)
        want = copy_of_torch_after_one_step(t, to, x, step_of) if source is saved else None
        if want is None:
            theirs(torch.from_numpy(x))
            want = {k: v.detach().numpy() for k, v in t.state_dict().items()}
        assert all(np.allclose(m2.state_dict()[k], v, rtol=1e-5, atol=1e-7) for k, v in want.items())
    for momentum in (0.0, 0.9):  # (torch's SGD keeps no step count, and a momentum_buffer of None without momentum)
        ts, ms = torch.nn.Linear(3, 1), mica.nn.Linear(3, 1)
        tso, mso = torch.optim.SGD(ts.parameters(), lr=0.1, momentum=momentum), \
            mica.optim.SGD(ms.parameters(), lr=0.1, momentum=momentum)
        step_of(ts, tso)(torch.from_numpy(x))
        ms.load_state_dict(ts.state_dict())
        mso.load_state_dict(tso.state_dict())
        mica.compile(step_of(ms, mso))(x)
        step_of(ts, tso)(torch.from_numpy(x))
        assert all(np.allclose(ms.state_dict()[k], v.detach().numpy(), rtol=1e-6) for k, v in ts.state_dict().items())
    with pytest.raises(mica.MicaError, match=r"^SGD.load_state_dict: the state holds 'exp_avg', which SGD does not keep"):
        mica.optim.SGD([{"params": m[0].parameters()}, {"params": m[2].parameters()}]).load_state_dict(saved)
    with pytest.raises(mica.MicaError, match=r"groups of \[2, 2\] parameters, this optimizer groups of \[4\]"):
        mica.optim.AdamW(m.parameters()).load_state_dict(saved)


def copy_of_torch_after_one_step(t, to, x, step_of):
    """torch's weights after one more step, from copies (the originals stay where they are)."""
    import copy

    t2 = copy.deepcopy(t)
    to2 = type(to)([{"params": t2[0].parameters()}, {"params": t2[2].parameters()}])
    to2.load_state_dict(copy.deepcopy(to.state_dict()))
    step_of(t2, to2)(torch.from_numpy(x))
    return {k: v.detach().numpy() for k, v in t2.state_dict().items()}


def test_a_compiled_step_follows_a_model_changed_between_calls_and_its_optimizers_settings():
    """A head replaced or an adapter added between calls makes the step again (torch recompiles;
    the old step trained the old head), a state_dict() taken before a step shows its values after
    it (torch's share memory), and the optimizer's checks are torch's: its defaults the settings
    given, a parameter in two groups, an empty list and a bad learning rate set between calls are
    sentences at the user's line."""
    class Net(mica.nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = mica.nn.Linear(4, 8), mica.nn.Linear(8, 3)

        def forward(self, x):
            y = self.head(mica.relu(self.body(x)))
            return y + self.lora(x) if hasattr(self, "lora") else y

    net = Net()
    opt = mica.optim.SGD(net.parameters(), lr=0.1)

    @mica.compile
    def step(x):
        opt.zero_grad()
        out = net(x)
        out.pow(2).mean().backward()
        opt.step()
        return out

    x = np.ones((2, 4), np.float32)
    sd = net.state_dict()
    step(x), step(x)
    assert np.array_equal(sd["body.weight"], net.state_dict()["body.weight"])  # (the step's values, in place)
    net.head = mica.nn.Linear(8, 5)
    assert np.asarray(step(x)).shape == (2, 5)
    net.lora = mica.nn.Linear(4, 5, bias=False)
    mica.nn.init.zeros_(net.lora.weight)
    before = np.asarray(step(x))
    net.lora.weight.data = np.ones((5, 4), np.float32)
    assert np.abs(np.asarray(step(x)) - before).max() > 1.0

    w = net.body.weight
    assert mica.optim.AdamW([w], lr=0.5, betas=(0.8, 0.9)).defaults["betas"] == (0.8, 0.9)
    for make, says in ((lambda: mica.optim.SGD([{"params": [w]}, {"params": [w]}], lr=0.1),
                        r"^SGD: some parameters appear in more than one parameter group \(groups 0 and 1\)"),
                       (lambda: opt.add_param_group({"params": [w]}), r"more than one parameter group"),
                       (lambda: mica.optim.Adam([], lr=0.1), r"^Adam got an empty parameter list")):
        with pytest.raises(mica.MicaError, match=says + r".*test_eager.py:\d+\)$"):
            make()
    opt.param_groups[0]["lr"] = None
    with pytest.raises(mica.MicaError, match=r"^SGD: param_groups\[0\]\['lr'\] must be a finite number >= 0, got None"):
        step(x)


@pytest.mark.parametrize("make", [
    lambda s, o: s.LambdaLR(o, [lambda e: 0.9 ** e, lambda e: 1.0 / (1 + e)]),
    lambda s, o: s.StepLR(o, 4, 0.5), lambda s, o: s.MultiStepLR(o, [3, 9], 0.3),
    lambda s, o: s.ExponentialLR(o, 0.95), lambda s, o: s.CosineAnnealingLR(o, 10, 0.001),
    lambda s, o: s.LinearLR(o, 0.2, 1.0, 7), lambda s, o: s.ConstantLR(o, 0.25, 6),
    lambda s, o: s.MultiplicativeLR(o, lambda e: 0.97)],
    ids=["lambda", "step", "multistep", "exponential", "cosine", "linear", "constant", "multiplicative"])
def test_torchs_lr_schedulers_set_the_learning_rates_torchs_set(make):
    m, t = mica.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    mo = mica.optim.SGD([{"params": [m.weight]}, {"params": [m.bias], "lr": 0.5}], lr=0.1)
    to = torch.optim.SGD([{"params": [t.weight]}, {"params": [t.bias], "lr": 0.5}], lr=0.1)
    mine, theirs = make(mica.optim.lr_scheduler, mo), make(torch.optim.lr_scheduler, to)
    for _ in range(25):
        np.testing.assert_allclose(mine.get_last_lr(), theirs.get_last_lr(), rtol=1e-13)
        assert [g["lr"] for g in mo.param_groups] == mine.get_last_lr()
        to.step()
        mine.step(), theirs.step()
    assert mine.state_dict()["last_epoch"] == theirs.state_dict()["last_epoch"] == 25


def test_a_gradient_penalty_through_autograd_grad_trains_torchs_critic():
    """WGAN-GP's line, torch.autograd.grad(out.sum(), x, create_graph=True), in a torch-style step."""
    torch.manual_seed(0)
    t = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    m = mica.nn.Sequential(mica.nn.Linear(3, 8), mica.nn.Tanh(), mica.nn.Linear(8, 1))
    m.load_state_dict(t.state_dict())
    mo, to = mica.optim.Adam(m.parameters(), lr=0.01), torch.optim.Adam(t.parameters(), lr=0.01)

    def body(lib, model, opt):
        def step(x):
            opt.zero_grad()
            x = x.clone().requires_grad_(True) if lib is torch else x
            out = model(x)
            g, = lib.autograd.grad(out.sum(), x, create_graph=True)
            loss = out.mean() + ((g.norm(2, dim=1) - 1) ** 2).mean()
            loss.backward()
            opt.step()
            return loss
        return step

    x = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    mine, theirs = mica.compile(body(mica, m, mo)), body(torch, t, to)
    for _ in range(3):
        assert abs(float(mine(x)) - theirs(torch.from_numpy(x)).item()) < 1e-6
    assert all(np.allclose(m.state_dict()[k], v.detach().numpy(), atol=1e-6) for k, v in t.state_dict().items())
    with pytest.raises(mica.MicaError, match=r"^Mica has no mica.autograd.functional"):
        mica.autograd.functional
    with pytest.raises(mica.MicaError, match=r"^Mica has no mica.optim.lr_scheduler.WarmupLR .* set param_groups"):
        mica.optim.lr_scheduler.WarmupLR


def test_squeeze_unsqueeze_and_dim_reductions_of_0d_tensors_are_torchs_eagerly_and_traced():
    """squeeze(dim) on an eager tensor recursed without end (numpy's squeeze calls the method back);
    a 0-d tensor's dim 0 / -1 is taken by squeeze, max/min/argmax/argmin as torch takes it; a dim
    out of range is a sentence naming the range."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 1, 3, 1)).astype(np.float32)
    s = np.float32(rng.standard_normal())
    cases = [(a, lambda t: t.squeeze(1)), (a, lambda t: t.squeeze(-1)), (a, lambda t: t.squeeze((1, 3))),
             (a, lambda t: t.squeeze(0)), (a, lambda t: t.squeeze()), (a, lambda t: t.unsqueeze(-1)),
             (a, lambda t: t.unsqueeze(4)), (a, lambda t: t.unsqueeze(-5)),
             (s, lambda t: t.squeeze(0)), (s, lambda t: t.squeeze(-1)), (s, lambda t: t.unsqueeze(-1)),
             (s, lambda t: t.max(0)[0]), (s, lambda t: t.max(-1)[1]), (s, lambda t: t.min(0)[0]),
             (s, lambda t: t.min(0)[1]), (s, lambda t: t.argmax(0)), (s, lambda t: t.argmin(-1))]
    for i, (x, f) in enumerate(cases):
        want = f(torch.tensor(x)).numpy()
        eager = np.asarray(f(mica.tensor(x)))
        traced = mica.reference.run(mica.trace(f, mica.Spec(np.shape(x), mica.float32)), x)
        for got in (eager, np.asarray(traced)):
            assert got.shape == want.shape and np.array_equal(got, want), (i, got, want)
    for f in (lambda t: t.squeeze(4), lambda t: t.unsqueeze(5), lambda t: t.max(4)):
        with pytest.raises(mica.MicaError, match=r"dim -?\d is out of range; give one in \[-\d, \d\]"):
            f(mica.tensor(a))
    g = mica.reference.run(mica.trace(lambda t: mica.grad(t.max(0)[0] * 3, t), mica.f32[()]), s)
    assert float(g) == 3.0


def _either(t, mine, theirs):
    return theirs if isinstance(t, torch.Tensor) else mine


_DIM_VERBS = {
    "squeeze": lambda t, d: t.squeeze(d), "unsqueeze": lambda t, d: t.unsqueeze(d), "sum": lambda t, d: t.sum(d),
    "sum_keepdim": lambda t, d: t.sum(d, keepdim=True), "mean": lambda t, d: t.mean(d), "amax": lambda t, d: t.amax(d),
    "max": lambda t, d: t.max(d)[0], "argmax": lambda t, d: t.argmax(d),
    "argmin_keepdim": lambda t, d: t.argmin(d, keepdim=True), "softmax": lambda t, d: t.softmax(d),
    "log_softmax": lambda t, d: t.log_softmax(d), "cumsum": lambda t, d: t.cumsum(d),
    "cumprod": lambda t, d: t.cumprod(d), "flip": lambda t, d: t.flip(d), "transpose": lambda t, d: t.transpose(d, 0),
    "narrow": lambda t, d: t.narrow(d, 0, 1), "select": lambda t, d: t.select(d, 0),
    "unbind": lambda t, d: t.unbind(d)[0], "chunk": lambda t, d: t.chunk(2, d)[0], "split": lambda t, d: t.split(1, d)[0],
    "std": lambda t, d: t.std(d, correction=0), "logsumexp": lambda t, d: t.logsumexp(d),
    "norm": lambda t, d: t.norm(dim=d), "prod": lambda t, d: t.prod(d), "all": lambda t, d: (t > 0).all(d),
    "any": lambda t, d: (t > 0).any(d), "roll": lambda t, d: t.roll(1, d),
    "repeat_interleave": lambda t, d: t.repeat_interleave(2, d), "movedim": lambda t, d: t.movedim(d, 0),
    "unflatten": lambda t, d: t.unflatten(d, (1, -1)), "flatten": lambda t, d: t.flatten(d),
    "cat": lambda t, d: _either(t, mica, torch).cat([t, t], d), "stack": lambda t, d: _either(t, mica, torch).stack([t, t], d),
    "sort": lambda t, d: t.sort(d)[0], "topk": lambda t, d: t.topk(1, d)[0], "median": lambda t, d: t.median(d)[0],
    "moveaxis_tuple": lambda t, d: t.moveaxis((d, -1), (0, 1)) if t.ndim > 1 else t.moveaxis(d, 0),
    "gather": lambda t, d: t.gather(d, _either(t, mica, torch).zeros_like(t, dtype=_either(t, mica, torch).int64)),
    "index_select": lambda t, d: t.index_select(d, _either(t, mica, torch).tensor([0])),
}


@pytest.mark.parametrize("verb", sorted(_DIM_VERBS))
def test_every_dim_of_every_rank_is_taken_or_refused_as_torch_does(verb):
    """Each verb that takes a dim, on 0-d to 4-d tensors with every dim from two below the range
    to two above it, eagerly and traced (the oracle): torch's shape and values where torch takes
    it, a Mica sentence where torch refuses it (a 0-d tensor's dim 0 and -1 are taken by the
    reductions and refused by the verbs that cut a dim), never another Python exception."""
    f = _DIM_VERBS[verb]
    rng = np.random.default_rng(sorted(_DIM_VERBS).index(verb))
    for shape in [(), (3,), (2, 1, 3), (1, 4, 1, 2)]:
        x = rng.standard_normal(shape).astype(np.float32)
        for d in range(-len(shape) - 2, len(shape) + 2):
            try:
                want = np.asarray(f(torch.tensor(x), d))
            except (IndexError, RuntimeError, ValueError):
                want = None
            for mode in ("eager", "traced"):
                try:
                    got = np.asarray(f(mica.tensor(x), d)) if mode == "eager" else np.asarray(
                        mica.reference.run(mica.trace(lambda t: f(t, d), mica.Spec(shape, mica.float32)), x))
                except mica.MicaError as e:
                    assert want is None, f"{verb}{shape} dim {d} {mode}: torch takes it, Mica said {e}"
                    continue
                assert want is not None, f"{verb}{shape} dim {d} {mode}: torch refuses it, Mica gave {got.shape}"
                assert got.shape == want.shape and np.allclose(got.astype(np.float64), want.astype(np.float64),
                                                               rtol=1e-5, atol=1e-6), (verb, shape, d, mode)


def test_a_parameter_made_from_loaded_values_is_not_said_to_run_its_initial_ones(recwarn):
    """nanoGPT's crop_block_size: wpe.weight = nn.Parameter(wpe.weight[:n]) after loading a
    checkpoint. An eager call ran the cropped, loaded values (right) but warned that it ran initial
    random ones; a parameter made from data holds that data, so nothing is said."""
    torch.manual_seed(0)
    t = torch.nn.Embedding(8, 3)
    m = mica.nn.Embedding(8, 3)
    m.load_state_dict(t.state_dict())
    m.weight = mica.nn.Parameter(m.weight[:5])
    t.weight = torch.nn.Parameter(t.weight[:5].detach())
    idx = np.array([0, 4, 2])
    assert np.allclose(np.asarray(m(mica.tensor(idx))), t(torch.tensor(idx)).detach().numpy(), atol=0)
    assert not [w for w in recwarn if "initial values" in str(w.message)]
    mica.nn.Embedding(8, 3)(mica.tensor(idx))  # (one never given values: still said)
    assert [w for w in recwarn if "initial values" in str(w.message)]


def test_a_torch_style_steps_inputs_carry_its_argument_names():
    """The IR and the errors of a torch-style compiled step name its arguments (xb, yb), as a plain
    trace does, not the wrapper's user_args[0]."""
    m = mica.nn.Linear(4, 2)
    opt = mica.optim.SGD(m.parameters(), lr=0.1)

    @mica.compile
    def train_step(xb, yb):
        loss = ((m(xb) - yb) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    train_step(np.ones((3, 4), np.float32), np.ones((3, 2), np.float32))
    inputs = [line.split("= input ")[1].split()[0] for line in train_step.ir.splitlines() if "= input " in line]
    assert inputs[:3] == ["xb", "yb", "params['weight']"], inputs


_VIEW_WRITES = {
    "t": lambda x: x.t().__setitem__((0, 1), 100.0),
    "mT": lambda x: x.mT.__setitem__((2, 1), 100.0),
    "flatten": lambda x: x.flatten().__setitem__(4, 100.0),
    "split": lambda x: x.split([1, 2], dim=1)[1].zero_(),
    "chunk": lambda x: x.chunk(2, dim=1)[1].mul_(3),
    "unbind": lambda x: x.unbind(1)[2].add_(10),
    "select": lambda x: x.select(1, 2).add_(10),
    "movedim": lambda x: x.movedim(0, 1).__setitem__((2, 1), 7.0),
    "diagonal": lambda x: x.diagonal().fill_(0),
    "float": lambda x: x.float().add_(1),
    "to": lambda x: x.to(torch.float32 if isinstance(x, torch.Tensor) else mica.float32).add_(1),
    "view": lambda x: x.view(6).__setitem__(5, -1.0),
    "narrow": lambda x: x.narrow(1, 1, 2).zero_(),
    "view_as": lambda x: x.view_as(x.new_zeros(3, 2)).__setitem__((2, 1), 5.0),
    "type_as": lambda x: x.type_as(x).add_(1),
}


@pytest.mark.parametrize("name", sorted(_VIEW_WRITES))
def test_an_eager_view_shares_its_tensors_memory_as_torchs_does(name):
    """A write through an eager view reaches the tensor it views, as in torch (t, flatten, split,
    chunk, unbind, select, mT, movedim and diagonal were copies, so the write was lost silently)."""
    rng = np.random.default_rng(sorted(_VIEW_WRITES).index(name))
    a = rng.standard_normal((2, 3)).astype(np.float32)
    t, m = torch.tensor(a), mica.tensor(a)
    _VIEW_WRITES[name](t)
    _VIEW_WRITES[name](m)
    assert np.array_equal(np.asarray(m), t.numpy()), (np.asarray(m), t.numpy())
    x = mica.arange(3.0)
    e = x.expand(2, 3)
    x.add_(1)
    assert np.asarray(e).tolist() == [[1.0, 2.0, 3.0]] * 2


_PROMOTIONS = [
    lambda l: l.ones(2, 3).half() + l.tensor(2.0),
    lambda l: l.ones(2, 3).half() + np.float64(1.5),
    lambda l: l.ones(2, 3).half() + l.ones(2, 3, dtype=l.long),
    lambda l: l.ones(2, 3) * l.tensor(0.5, dtype=l.float64),
    lambda l: l.ones(3, dtype=l.int32) + l.tensor(5),
    lambda l: l.arange(3) / 2,
    lambda l: l.arange(3) * 0.5,
    lambda l: l.arange(3) // 2,
    lambda l: l.ones(3, dtype=l.int32) * 2.5,
    lambda l: l.ones(3) < 2,
]


def test_eager_arithmetic_takes_torchs_result_types():
    """A 0-d tensor or a number does not widen a dimensioned tensor of its category (half + 0-d float
    is half, int32 + 0-d int64 is int32), int / int is the default float, as torch's."""
    for i, f in enumerate(_PROMOTIONS):
        want, got = f(torch), f(mica)
        assert str(want.dtype).replace("torch.", "") == str(np.asarray(got).dtype), i
        assert np.allclose(np.asarray(got, np.float64), want.double().numpy()), i


def test_in_place_results_torch_refuses_are_sentences():
    """x.add_(1.5) on an integer tensor truncated silently, x += y with a y that grows x and x /= 2
    on integers were numpy's errors: each is torch's refusal as one sentence at the user's line."""
    def grow():
        x = mica.ones(3)
        x *= mica.ones(2, 3)

    def divide():
        x = mica.arange(3)
        x /= 2

    for mistake, sentence in [(lambda: mica.arange(6).view(2, 3).add_(1.5), r"result is float32 and cannot be written"),
                              (lambda: mica.arange(6).clamp_(-2, 2.5), r"result is float32 and cannot be written"),
                              (grow, r"the result's shape \[2, 3\] does not fit the tensor's \[3\]"),
                              (divide, r"the result is float32 and cannot be written into this int64 tensor"),
                              (lambda: mica.arange(3.0).expand(2, 3).add_(1), r"an expanded view"),
                              (lambda: mica.ones(3).item(), r"takes a tensor of one element, this one has 3"),
                              (lambda: -mica.ones(3, dtype=mica.bool_), r"neg takes float or int tensors")]:
        with pytest.raises(mica.MicaError, match=sentence) as e:
            mistake()
        assert e.value.loc and e.value.loc[0] == __file__, e.value
    x = mica.ones(2, 3)
    x += 1
    x *= mica.tensor(2.0)
    assert np.asarray(x).tolist() == [[4.0] * 3] * 2 and np.asarray(x).dtype == np.float32
    assert int(mica.tensor([[7]])) == 7 and float(mica.tensor([2.5])) == 2.5 and mica.ones(2).device.type == "cpu"
    assert mica.ones(2).is_floating_point() is True


def test_as_tensor_shares_an_arrays_memory_and_bool_max_min_are_bools():
    """torch.as_tensor(an array of its own type) shares the array's memory (Mica's copied); max/min
    along a dim of a bool tensor give bools and the first index, as torch's (min was refused, max
    gave integers)."""
    a = np.zeros(3, np.float32)
    h = mica.as_tensor(a)
    a[0] = 5
    assert np.asarray(h).tolist() == [5.0, 0.0, 0.0]
    b = np.array([[True, False, True], [False, False, False]])
    for f in (lambda t: t.max(1), lambda t: t.min(1), lambda t: t.min(0), lambda t: t.max(0, keepdim=True)):
        want, got = f(torch.tensor(b)), f(mica.tensor(b))
        assert np.asarray(got.values).dtype == np.bool_
        assert np.array_equal(np.asarray(got.values), want.values.numpy())
        assert np.array_equal(np.asarray(got.indices), want.indices.numpy())


def test_numpys_own_calls_on_host_tensors_keep_numpys_meaning_and_expanded_views_take_fills():
    """A reviewer's findings on the eager changes: numpy's reductions and dtype= keep numpy's result
    types (np.add.reduce of int32 is int64, not an overflowed int32), x.to(np.float16) converts,
    fill_/zero_/x[i] = v write through an expanded view as torch's do (add_ is refused, as torch
    refuses it), a NaN into an int tensor stays numpy's ValueError, an empty dim chunks into as
    many empty pieces as asked, as torch's."""
    i32 = mica.tensor([2 ** 30] * 3, dtype=mica.int32)
    assert int(np.add.reduce(i32)) == 3 * 2 ** 30
    assert float(np.add.reduce(mica.ones(70000).half(), dtype=np.float32)) == 70000.0
    assert np.frexp(mica.tensor([1.5, 2.5]))[1].dtype == np.int32
    assert mica.arange(3).to(dtype=np.float16).dtype == np.float16
    x = mica.arange(3)
    assert x.to("cpu") is x and x.to(mica.int64) is x
    b, t = mica.ones(3), torch.ones(3)
    for f in (lambda v: v.expand(2, 3).fill_(2), lambda v: v.expand(2, 3)[0].__setitem__(1, 7)):
        f(b), f(t)
        assert np.asarray(b).tolist() == t.tolist()
    with pytest.raises(mica.MicaError, match=r"an expanded view\) is one place in memory"):
        b.expand(2, 3).add_(1)
    with pytest.raises(ValueError, match="cannot convert float NaN to integer"):
        x[0] = float("nan")
    assert [t.shape for t in mica.zeros(2, 0, 4).chunk(3, 1)] == [tuple(t.shape) for t in torch.zeros(2, 0, 4).chunk(3, 1)]


def test_numpys_keyword_names_keep_torchs_meaning_and_a_buffer_changed_in_a_step_is_a_sentence():
    """x.std(axis=0, keepdims=True) (torch takes numpy's names) took numpy's biased formula,
    silently; np.std(h) stays numpy's. A buffer is a host tensor (buffer.add_ under no_grad works,
    as torch's), and one changed in place inside a compiled step, where a buffer is a constant and
    the change was lost silently, is the step's state (test_batch_norm.py compares it with torch's)."""
    a = np.array([[3.0, -1.0, 2.0], [0.0, 5.0, -4.0]], np.float32)
    for f in (lambda t: t.std(0, keepdims=True), lambda t: t.std(axis=0), lambda t: t.var(axis=(0, 1)),
              lambda t: t.var(axis=0, unbiased=False), lambda t: t.mean(axis=0, keepdims=True)):
        want, got = f(torch.tensor(a)), np.asarray(f(mica.tensor(a)))
        assert got.shape == tuple(want.shape) and np.allclose(got, want.numpy())
    assert np.isclose(np.std(mica.tensor(a)), np.std(a))

    class Running(mica.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = mica.nn.Linear(3, 3)
            self.register_buffer("run", mica.zeros(1, 3))

        def forward(self, x):
            h = self.lin(x)
            with mica.no_grad():
                self.run.mul_(0.5).add_(0.5 * h.mean(0, keepdim=True))
            return h.square().mean()

    m = Running()
    with mica.no_grad():
        m.run.add_(1)
    assert np.asarray(m.run).tolist() == [[1.0, 1.0, 1.0]] and m.state_dict()["run"].tolist() == [[1.0] * 3]
    opt = mica.optim.SGD(m.parameters(), lr=0.1)

    @mica.compile
    def step(x):
        loss = m(x)
        loss.backward()
        opt.step()
        return loss

    t = torch.nn.Linear(3, 3)
    with torch.no_grad():
        t.weight.copy_(torch.tensor(np.asarray(m.state_dict()["lin.weight"])))
        t.bias.copy_(torch.tensor(np.asarray(m.state_dict()["lin.bias"])))
    run, topt = torch.ones(1, 3), torch.optim.SGD(t.parameters(), lr=0.1)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    for _ in range(2):  # (a buffer the step changes in place is its state, kept after each call, as torch's)
        step(x)
        h = t(torch.tensor(x))
        with torch.no_grad():
            run.mul_(0.5).add_(0.5 * h.mean(0, keepdim=True))
        h.square().mean().backward()
        topt.step()
    assert np.allclose(np.asarray(m.run), run.numpy(), rtol=1e-6, atol=1e-7)
    assert len({id(p) for p in step.built.values()}) == 1


def test_log2_log10_and_nelement_are_torchs():
    """makemore's loss.log10() and p.nelement(): log2/log10 to within an ulp or two of torch's
    float32 (their division rounds once more), compiled and eager, with their gradients."""
    x = (np.abs(np.random.default_rng(0).standard_normal(500)) * 100 + 1e-3).astype(np.float32)
    for name in ("log2", "log10"):
        want = getattr(torch.tensor(x, dtype=torch.float64), name)().numpy()
        eager = np.asarray(getattr(mica.tensor(x), name)())
        compiled = mica.compile(lambda t: getattr(t, name)(), mica.f32[500])(x)
        for got in (eager, compiled):
            assert np.abs((got - want) / want).max() < 3e-7, name
        g = mica.reference.run(mica.trace(lambda t: mica.grad(getattr(t, name)().sum(), t), mica.f32[500]), x)
        assert np.allclose(g, 1 / (x.astype(np.float64) * np.log(2.0 if name == "log2" else 10.0)), rtol=1e-12)
    assert mica.ones(2, 3).nelement() == 6


def test_host_tensors_hash_by_identity_compare_to_none_as_torchs_and_refuse_a_traced_in_place_value():
    """{x: 1} and `x == None` as torch's (an unhashable array; an elementwise comparison), and a
    global host tensor given a traced value in place inside a compiled step (makemore's running
    batchnorm statistics) is a sentence saying what keeps it, not 'a Tensor of a finished trace'."""
    x = mica.ones(2, 3)
    assert {x: 1}[x] == 1 and (x == None) is False and (x != None) is True  # noqa: E711
    assert np.asarray(x == 1).all()
    running = mica.zeros(3)

    @mica.compile
    def step(a):
        running.add_(0.1 * a.mean(0))
        return a.sum()

    with pytest.raises(mica.MicaError, match=r"^add_: a tensor made outside the traced code \(a module's attribute, "
                                             r"a global\) cannot take a traced value in place.*as an argument.*"
                                             r"register_buffer.*test_eager"):
        step(np.ones((2, 3), np.float32))


def test_a_write_into_an_argument_reaches_the_callers_tensor_as_torchs():
    """A KV cache written in place inside a module's forward or a torch.compile-form function: torch
    writes the caller's tensor; Mica's call worked on a copy, and the write was lost (cached
    generation went wrong without a word). Flat, in a list of (k, v) tuples, by keyword; the same
    values as torch's."""
    import torch

    rng = np.random.default_rng(5)
    W = rng.standard_normal((4, 4)).astype(np.float32)

    def make(lib):
        class Layer(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = lib.nn.Linear(4, 4, bias=False)

            def forward(self, x, caches, pos):
                k, v = caches[0]
                k[:, pos] = self.lin(x)
                v[:, pos] += 2 * x
                return (k[:, :pos + 1] * v[:, :pos + 1]).sum(1)
        m = Layer()
        m.load_state_dict({"lin.weight": W if lib is mica else torch.tensor(W)})
        return m

    outs = {}
    for lib in (mica, torch):
        m, caches = make(lib), [(lib.zeros(2, 5, 4), lib.ones(2, 5, 4))]
        with lib.no_grad():
            got = [np.asarray(m(lib.tensor(rng_x), caches=caches, pos=p)) for p, rng_x in
                   enumerate(np.random.default_rng(1).standard_normal((3, 2, 4)).astype(np.float32))]
        outs[lib.__name__] = got + [np.asarray(t) for t in caches[0]]
    for a, b in zip(outs["mica"], outs["torch"]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert np.abs(outs["mica"][-2][:, :3]).min() > 0  # (the writes are there)

    @mica.compile
    def write(cache, k, pos):
        cache[:, pos] = k
        return cache.sum()

    cache, host_cache = np.zeros((2, 4), np.float32), mica.zeros(2, 4)
    assert float(write(cache, np.ones(2, np.float32), 1)) == 2.0 and cache[:, 1].tolist() == [1.0, 1.0]
    write(host_cache, np.full(2, 3.0, np.float32), 2)
    assert np.asarray(host_cache).tolist() == [[0, 0, 3, 0], [0, 0, 3, 0]]
    assert cache.sum() == 2.0  # (another argument's write does not reach it)
    t = torch.zeros(2, 4)  # (a torch tensor given: its memory, as torch writes it)
    write(t, np.full(2, 5.0, np.float32), 0)
    assert t[:, 0].tolist() == [5.0, 5.0]

    @mica.compile
    def two(x, y):
        x.add_(1)
        y.add_(1)
        return x.sum()

    a, frozen = np.zeros(3, np.float32), np.zeros((2, 4), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(mica.MicaError, match=r"^the function changes its input #1 .* the same memory is given as "
                                             r"another argument.*test_eager"):
        two(a, a)
    with pytest.raises(mica.MicaError, match=r"^the function changes its input #1 .* is read-only"):
        write(frozen, np.ones(2, np.float32), 1)
    assert a.tolist() == [0, 0, 0] and frozen.sum() == 0  # (nothing half-written)
    # torch tensors: written as torch writes them (bfloat16 too; the version counter moves, so autograd
    # sees the change), a leaf that requires grad refused as torch refuses it, an expanded one refused
    half = torch.zeros(2, 4, dtype=torch.bfloat16)
    write(half, np.full(2, 0.1, np.float32), 3)
    assert half[:, 3].tolist() == [torch.tensor(0.1, dtype=torch.bfloat16).item()] * 2 and half._version == 1
    with pytest.raises(mica.MicaError, match="leaf that requires grad"):
        write(torch.zeros(2, 4, requires_grad=True), np.ones(2, np.float32), 0)

    @mica.compile
    def put(n, c, k):
        c[:, 0] = k * n
        return c.sum()

    with pytest.raises(mica.MicaError, match=r"^the function changes its input #1 .* expanded"):  # (#1: the
        put(3, torch.zeros(4, 1).expand(4, 2), np.ones(4, np.float32))                            # number is none)
    # eager calls take torch tensors as compiled ones do (nanoGPT's sample.py: torch.tensor(ids)[None])
    lin = mica.nn.Linear(3, 2)
    np.testing.assert_allclose(np.asarray(lin(torch.ones(1, 3))), np.asarray(lin(np.ones((1, 3), np.float32))))
    assert np.allclose(mica.tanh(torch.ones(2)), np.tanh(1.0)) and mica.zeros(2).copy_(torch.ones(2)).tolist() == [1, 1]


def test_devices_are_torchs_names_kept_and_ignored():
    """torch.device and a traced tensor's .device (the string 'mica', which .to refused and whose
    .type raised AttributeError), is_cuda, pin_memory: torch's faces, changing nothing."""
    import torch

    assert str(mica.device(0)) == "cuda:0"  # (torch's: the first accelerator, which a CPU torch refuses to name)
    for args in (("cpu",), ("cuda",), ("cuda", 1), ("cuda:0",)):
        assert repr(mica.device(*args)) == repr(torch.device(*args)) and str(mica.device(*args)) == str(torch.device(*args))
        assert mica.device(*args).index == torch.device(*args).index and mica.device(*args).type == torch.device(*args).type
    with pytest.raises(mica.MicaError, match="'gpu' is not a device torch knows"):
        mica.device("gpu")

    @mica.compile
    def f(a):
        with mica.autocast(device_type=a.device.type, enabled=False):
            return a.to(a.device).pin_memory() * (1 + a.is_cuda)

    assert np.asarray(f(np.ones(2, np.float32))).tolist() == [1.0, 1.0]
    for dtype in ("float32", "int64", "float16", "bool", "int32", "float64"):  # (x.type(): torch's legacy names)
        assert mica.ones(2, dtype=getattr(mica, dtype)).type() == torch.ones(2, dtype=getattr(torch, dtype)).type()
    assert mica.ones(2).type(mica.int64).dtype == np.int64
    with mica.device("cuda"):
        x = mica.ones(2)
    assert isinstance(x.device, mica.device) and x.device.type == "cpu" and not x.is_cuda and x.pin_memory() is x


def test_host_tensors_and_parameters_print_as_torchs():
    """print(x) of a host tensor read as numpy's (bfloat16 values with eight decimals); torch's text."""
    import torch

    for values, dtype in (([[0.12573022, -0.13210486, 0.64042264], [0.1, -2.5, 3.0]], "float32"), ([1.0, 2.0], "float32"),
                          (3.5, "float32"), ([True, False], "bool"), ([0, 1, 5], "int64"), ([[1, 2]], "int32"),
                          ([1.0, 0.5], "float16"), ([1.00390625, 2.5], "bfloat16")):
        got = mica.tensor(values, dtype=getattr(mica, dtype))
        want = torch.tensor(values, dtype=getattr(torch, dtype))
        if dtype == "bfloat16":  # (held as float32, docs/api.md: bfloat16's values, float32's text)
            want = want.float()
        assert repr(got) == repr(want) == str(got), (repr(got), repr(want))
    for values in (np.array([1, 2], np.uint8), np.zeros((2, 0), np.float32), np.array([3], np.int16)):
        assert repr(mica.from_numpy(values)) == repr(torch.from_numpy(values))
    assert repr(mica.from_numpy(np.array([1 + 2j])))  # (a type Mica lacks: numpy's text, no error)
    w = mica.nn.Parameter(np.array([[0.5, -1.25]], np.float32))
    assert repr(w) == repr(torch.nn.Parameter(torch.tensor([[0.5, -1.25]])))


def test_eager_bfloat16_values_are_rounded_as_torchs():
    """numpy has no bfloat16: an eager one is held as float32, but its values are bfloat16's
    (tensor, full, as_tensor and .to round them as torch does; they were kept unrounded)."""
    import torch

    v = [1.00390625, 65504.0, 3.4e38, -1.5e-40, 0.1]
    want = torch.tensor(v, dtype=torch.bfloat16).float().tolist()
    for got in (mica.tensor(v, dtype=mica.bfloat16), mica.as_tensor(np.array(v, np.float32), dtype=mica.bfloat16),
                mica.tensor(v).to(mica.bfloat16), mica.tensor(v).bfloat16()):
        assert np.asarray(got).tolist() == want
    assert np.asarray(mica.full((2,), 1.00390625, dtype=mica.bfloat16)).tolist() == [1.0, 1.0]
    assert np.asarray(mica.arange(250, 262, dtype=mica.bfloat16)).tolist() == \
        torch.arange(250, 262, dtype=torch.bfloat16).float().tolist()


def test_a_parameter_on_the_right_of_a_host_tensors_operator_is_its_values():
    """x @ W, x + W, x * W with x a host tensor and W a Parameter (CLIP's feats @ self.proj) are
    torch's results from the values W holds, not a numpy error about converting a Parameter."""
    rng = np.random.default_rng(3)
    w, x = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    W, V = mica.nn.Parameter(w.copy()), mica.nn.Parameter(w.T.copy())
    tw, tx = torch.tensor(w), torch.tensor(x)
    got = mica.tensor(x) @ W
    assert tuple(got.shape) == (2, 4) and np.allclose(np.asarray(got), (tx @ tw).numpy(), rtol=1e-6, atol=1e-7)
    assert np.array_equal(np.asarray(mica.tensor(x).softmax(-1) @ W), np.asarray(mica.tensor(x).softmax(-1)) @ w)
    assert np.array_equal(np.asarray(mica.tensor(w) + W), w + w)
    assert np.array_equal(np.asarray(mica.tensor(w.T) * V), w.T * w.T)
    assert tuple((V @ W).shape) == (4, 4)


class _Cached:
    """A module whose forward, as inference code writes it, keeps state on itself: a KV cache as a
    buffer, as a frozen Parameter and as a plain attribute (Meta's llama: reassigned with .to(),
    then written by slices), and llama2.c's `self.last_loss`."""

    @staticmethod
    def make(lib, w):
        nn = lib.nn

        class Attn(nn.Module):
            def __init__(self):
                super().__init__()
                self.wk = nn.Linear(4, 4, bias=False)
                self.register_buffer("cache_v", lib.zeros(1, 8, 4), persistent=False)
                self.cache_p = nn.Parameter(lib.zeros(1, 8, 4), requires_grad=False)
                self.cache_k = lib.zeros((1, 8, 4))
                self.plain = lib.zeros(8)
                self.last_loss = None

            def forward(self, x, pos):
                k = self.wk(x)
                n = x.shape[1]
                self.cache_k = self.cache_k.to(x)
                self.cache_k[:, pos:pos + n] = k
                self.cache_v[:, pos:pos + n] = 2 * k
                self.cache_p[:, pos:pos + n] = k - 1
                self.plain[pos:pos + n] = self.plain[pos:pos + n] + k[0, :, 0]
                out = self.cache_k[:, :pos + n].sum(1) + self.cache_v[:, :pos + n].sum(1) * self.cache_p[:, :pos + n].mean(1)
                self.last_loss = out.square().mean()
                return out

        m = Attn()
        load_values(lib, m, {"wk.weight": w})
        return m


def test_a_module_called_eagerly_keeps_what_its_forward_writes_on_itself_as_torchs():
    """Outside a trace a module's forward runs traced, once per call; what it writes on itself is
    kept after the call as torch's eager forward keeps it (it was lost, or left a traced Tensor
    that .item() refused): buffers and frozen Parameters written in place, a plain attribute
    reassigned or written by slices, an attribute assigned a tensor. A later read in the same
    forward sees the write (a frozen Parameter read twice was two constants)."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((4, 4)).astype(np.float32)
    xs = [rng.standard_normal((1, n, 4)).astype(np.float32) for n in (3, 2)]
    models = {lib: _Cached.make(lib, w) for lib in (mica, torch)}
    with torch.no_grad():
        for pos, x in zip((0, 3), xs):
            got, want = models[mica](mica.tensor(x), pos), models[torch](torch.tensor(x), pos)
            assert np.allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-6)
            assert abs(models[mica].last_loss.item() - models[torch].last_loss.item()) <= 1e-5 * models[torch].last_loss.item()
    m, t = models[mica], models[torch]
    for name in ("cache_k", "cache_v", "plain"):
        assert np.allclose(np.asarray(getattr(m, name)), getattr(t, name).numpy(), rtol=1e-6, atol=1e-6), name
    assert np.allclose(np.asarray(m.cache_p), t.cache_p.detach().numpy(), rtol=1e-6, atol=1e-6)
    assert np.count_nonzero(np.asarray(m.cache_v).any(-1)) == 5 and type(m.last_loss).__name__ == "HostTensor"
    assert np.asarray(m.cache_v).dtype == np.float32 and "cache_v" not in m.state_dict()


def test_an_eager_forward_that_fails_leaves_the_module_as_it_was():
    """A forward that assigns an attribute and then fails (a shape error at the user's line) leaves
    the attribute, buffers and Parameters as they were before the call, not traced Tensors."""
    class M(mica.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", mica.zeros(2))
            self.note = "before"

        def forward(self, x):
            self.note = x * 2
            self.count[0] = x.sum()
            return x @ mica.ones(5, 5)  # (x is [2, 3]: the shapes do not fit)

    m = M()
    with pytest.raises(mica.MicaError, match=r"test_eager.py:\d+"):
        m(mica.ones(2, 3))
    assert m.note == "before" and np.asarray(m.count).tolist() == [0.0, 0.0]


def test_gradients_kept_between_compiled_steps_clip_outside_them_as_torchs():
    """A loop whose compiled forward-and-backward and compiled optimizer step are two functions
    clips between them, outside any trace, as torch's loop clips p.grad: clip_grad_norm_ returns
    torch's norm and scales the kept gradients in place, clip_grad_value_ clamps them; the weights
    after three steps are torch's. With no gradient kept, clip_grad_norm_ gives 0, as torch's."""
    def run(lib):
        m = lib.nn.Linear(4, 3)
        w = np.arange(12, dtype=np.float32).reshape(3, 4) / 7 - 0.5
        load_values(lib, m, {"weight": w, "bias": np.zeros(3, np.float32)})
        opt = lib.optim.SGD(m.parameters(), lr=0.1)

        def forward_backward(x, y):
            loss = ((m(x) - y) ** 2).sum()
            loss.backward()
            return loss

        def step():
            opt.step()
            opt.zero_grad()
        if lib is mica:
            forward_backward, step = mica.compile(forward_backward), mica.compile(step)
        norms, rng = [], np.random.default_rng(1)
        for _ in range(3):
            forward_backward(*(lib.tensor(rng.standard_normal(s).astype(np.float32)) for s in ((5, 4), (5, 3))))
            norms.append(float(lib.nn.utils.clip_grad_norm_(m.parameters(), 0.5)))
            lib.nn.utils.clip_grad_value_(m.parameters(), 0.05)
            step()
        return norms, np.asarray(m.weight.detach() if lib is torch else m.weight)

    (got, gw), (want, tw) = run(mica), run(torch)
    assert np.allclose(got, want, rtol=1e-6) and np.allclose(gw, tw, rtol=1e-6, atol=1e-7)
    assert float(mica.nn.utils.clip_grad_norm_(mica.nn.Linear(2, 2).parameters(), 1.0)) == 0.0


def test_an_attribute_a_compiled_step_assigns_holds_its_last_value_after_each_call():
    """llama2.c's forward sets self.last_loss and its loop reads it: in a compiled step the
    attribute is one of the step's outputs, a host tensor with this call's value afterwards (it was
    left a traced Tensor that .item() refused), and its new values compile nothing new."""
    def run(lib):
        class M(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = lib.nn.Linear(4, 3)
                self.last_loss = None

            def forward(self, x, y):
                logits = self.fc(x)
                self.last_loss = lib.nn.functional.cross_entropy(logits, y)
                return logits

        m = M()
        w = np.arange(12, dtype=np.float32).reshape(3, 4) / 7 - 0.5
        load_values(lib, m, {"fc.weight": w, "fc.bias": np.zeros(3, np.float32)})
        opt = lib.optim.AdamW(m.parameters(), lr=0.1)

        def step(x, y):
            m(x, y)
            loss = m.last_loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        if lib is mica:
            step = mica.compile(step)
        rng, out = np.random.default_rng(0), []
        for _ in range(3):
            x, y = rng.standard_normal((5, 4)).astype(np.float32), rng.integers(0, 3, 5)
            loss = step(lib.tensor(x), lib.tensor(y))
            out.append((float(loss), m.last_loss.item()))
        return out, step

    (got, step), (want, _) = run(mica), run(torch)
    assert np.allclose(got, want, rtol=1e-6) and len({id(p) for p in step.built.values()}) == 1


def test_an_eager_forward_writes_caches_as_torchs_through_every_name_and_view():
    """A forward run eagerly that writes a host tensor it holds as a plain attribute: through a local
    alias, through a view, a cache two blocks share, a list of caches whose items it replaces, and a
    dict mixing tensors and numbers; references taken before the call see the writes (the arrays
    are written in place), as torch's. It was wrong values, a refusal, or traced Tensors left behind."""
    def build(lib):
        class Block(lib.nn.Module):
            def __init__(self, cache):
                super().__init__()
                self.cache = cache

            def forward(self, x, pos):
                self.cache[pos] = x.sum()
                return x

        class Net(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = lib.nn.Linear(2, 2, bias=False)
                self.register_buffer("kv", lib.zeros(4))
                self.shared = lib.zeros(3)
                self.rows = lib.zeros(3, 2)
                self.kvs = [lib.zeros(2), lib.zeros(2)]
                self.a, self.b = Block(self.shared), Block(self.shared)
                self.stats = None

            def forward(self, x, pos):
                y = self.lin(x)
                alias = self.rows
                alias[pos] = y
                view = self.rows[pos]
                view[0] = view[0] + 1
                self.kv[:2] = y
                self.a(y, pos)
                self.shared[2] = y.sum() * 2
                self.b(y * 3, pos + 1)
                self.kvs[1] = self.kvs[1] + y
                self.stats = {"loss": y.square().sum(), "n": pos}
                return alias[:pos + 1].sum(0)

        net = Net()
        w = np.array([[1.0, 2.0], [-1.0, 0.5]], np.float32)
        load_values(lib, net, {"lin.weight": w})
        return net

    out = {}
    for lib in (mica, torch):
        net = build(lib)
        held, shared = net.kv, net.shared
        with torch.no_grad():
            got = [np.asarray(net(lib.tensor(np.array([1.0, 2.0], np.float32) * (i + 1)), i)) for i in range(2)]
        out[lib] = (got, np.asarray(held), np.asarray(shared), np.asarray(net.rows), np.asarray(net.kvs[1]),
                    float(net.stats["loss"]), net.stats["n"], net.a.cache is net.shared is net.b.cache is shared)
    for g, w in zip(out[mica], out[torch]):
        if isinstance(w, list):
            assert all(np.allclose(a, b, atol=1e-6) for a, b in zip(g, w))
        else:
            assert np.allclose(g, w, atol=1e-6) if isinstance(w, (np.ndarray, float)) else g == w, (g, w)


def test_an_eager_forward_reads_each_binding_of_a_parameter_apart():
    """functional_call(self.net, other) inside a forward run eagerly reads `other`, after self.net(x)
    read the held weight (one cached Tensor per Parameter gave the held one twice)."""
    class Wrap(mica.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mica.nn.Linear(2, 2, bias=False)

        def forward(self, x):
            return self.net(x), mica.nn.functional_call(self.net, {"weight": 3 * np.eye(2, dtype=np.float32)}, (x,))

    m = Wrap()
    m.load_state_dict({"net.weight": np.eye(2, dtype=np.float32)})
    own, other = m(mica.ones(2))
    assert np.asarray(own).tolist() == [1.0, 1.0] and np.asarray(other).tolist() == [3.0, 3.0]


def test_a_compiled_step_keeps_what_it_assigns_and_refuses_what_it_cannot_keep():
    """Under mica.compile: a module without parameters keeps an attribute its forward assigns (it was
    None after the call), a dict mixing tensors and numbers comes back with host tensors; a step
    that reads an attribute before assigning it (an EMA on self) and one that puts a tensor into a
    list the module holds are sentences (they froze at a stale value, or left traced Tensors)."""
    class Crit(mica.nn.Module):
        def __init__(self):
            super().__init__()
            self.last = None

        def forward(self, x):
            out = (x * x).mean()
            self.last = {"loss": out, "n": 3}
            return out

    c = Crit()
    f = mica.compile(lambda x: c(x) * 2)
    for k in (1.0, 2.0):
        assert float(f(mica.ones(3) * k)) == 2 * k * k and float(c.last["loss"]) == k * k and c.last["n"] == 3

    class Ema(mica.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.ema, self.kv = mica.nn.Linear(2, 1), None, [mica.zeros(1)]

        def forward(self, x):
            y = self.fc(x).square().mean()
            self.ema = y if self.ema is None else 0.5 * self.ema + 0.5 * y
            return y

    m = Ema()
    opt = mica.optim.SGD(m.parameters(), lr=0.1)

    @mica.compile
    def step(x):
        loss = m(x)
        loss.backward()
        opt.step()
        return loss
    with pytest.raises(mica.MicaError, match=r"^the compiled step reads Ema.ema before assigning it.*register_buffer"):
        step(mica.ones(3, 2))
    assert m.ema is None

    class Listed(mica.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.kv = mica.nn.Linear(2, 1), [mica.zeros(1)]

        def forward(self, x):
            y = self.fc(x)
            self.kv[0] = y.mean(0)
            return y.square().mean()

    m2 = Listed()
    opt2 = mica.optim.SGD(m2.parameters(), lr=0.1)

    @mica.compile
    def step2(x):
        loss = m2(x)
        loss.backward()
        opt2.step()
        return loss
    with pytest.raises(mica.MicaError, match=r"^the compiled step puts a tensor into Listed.kv, a list the module"):
        step2(mica.ones(3, 2))
    assert type(m2.kv[0]).__name__ == "HostTensor"  # (given back its items)


def test_torch_style_odds_and_ends_of_parameters_splits_and_init():
    """bool(), **, //, % of one-element Parameters with numbers on the left; tensor_split's keywords
    and a host tensor of indices, its function form giving views; nn.init on a plain host tensor
    fills it; clip_grad_norm_(error_if_nonfinite=True) outside a step checks the kept gradients."""
    w = mica.nn.Parameter(np.array([[1.5, 0.0]], np.float32))
    zero = mica.nn.Parameter(np.array([0.0], np.float32))
    tw = torch.tensor([[1.5, 0.0]])
    assert bool(zero) is False and bool(mica.nn.Parameter(np.array([2.0], np.float32))) is True
    for f in (lambda a: 2.0 ** a, lambda a: 7.0 // (a + 1), lambda a: 7.0 % (a + 1)):
        assert np.allclose(np.asarray(f(w)), f(tw).numpy())
    b = mica.tensor(np.arange(12, dtype=np.float32).reshape(2, 6))
    assert [p.shape for p in mica.tensor_split(b, sections=3, dim=1)] == [(2, 2)] * 3
    assert [p.shape for p in b.tensor_split(indices=mica.tensor([1, 3]), dim=1)] == [(2, 1), (2, 2), (2, 3)]
    mica.tensor_split(b, 3, dim=1)[0][:] = -1
    assert np.asarray(b)[:, :2].tolist() == [[-1.0, -1.0], [-1.0, -1.0]]
    plain = mica.zeros(4, 3)
    mica.nn.init.orthogonal_(plain)
    assert np.allclose(np.asarray(plain).T @ np.asarray(plain), np.eye(3), atol=1e-5)
    lin = mica.nn.Linear(2, 1)
    opt = mica.optim.SGD(lin.parameters(), lr=0.1)

    @mica.compile
    def grads(x):
        lin(x).sum().backward()
    grads(mica.tensor(np.array([[np.inf, 1.0]], np.float32)))
    with pytest.raises(mica.MicaError, match=r"^clip_grad_norm_: the total norm of order 2.0 of the gradients is "
                                             r"non-finite"):
        mica.nn.utils.clip_grad_norm_(lin.parameters(), 1.0, error_if_nonfinite=True)
    assert opt is not None


def test_dropout_inplace_writes_the_input_and_tensordot_takes_torchs_dims_only():
    """F.dropout/dropout2d(..., inplace=True) outside a trace change the tensor given, as torch's (the
    flag was ignored); tensordot refuses dims=(1, 0), two ints, as torch does (it took them)."""
    for verb in ("dropout", "dropout2d"):
        a = mica.ones(2, 8, 4, 4)
        out = getattr(mica.nn.functional, verb)(a, 0.5, True, inplace=True)
        assert not np.array_equal(np.asarray(a), np.ones((2, 8, 4, 4)))
        assert np.array_equal(np.asarray(a), np.asarray(out)) and set(np.unique(np.asarray(a))) <= {0.0, 2.0}
    with pytest.raises(mica.MicaError, match=r"^tensordot: dims is an int or a pair of dim lists"):
        mica.tensordot(mica.ones(2, 3), mica.ones(3, 4), (1, 0))
    assert mica.tensordot(mica.ones(2, 3), mica.ones(3, 4), ([1], [0])).shape == (2, 4)


def test_an_eager_forward_of_many_blocks_each_writing_its_own_caches_runs_as_torchs():
    """Meta's llama: every attention block holds cache_k and cache_v as plain attributes and writes
    them; 32 blocks' 64 caches are found at once per kind of module (one write found per trace
    would have needed 65 traces of the first call), and the values are torch's."""
    out = {}
    for lib in (mica, torch):
        class Attn(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.wk = lib.nn.Linear(4, 4, bias=False)
                self.cache_k, self.cache_v = lib.zeros(1, 8, 4), lib.zeros(1, 8, 4)

            def forward(self, x, pos):
                k, n = self.wk(x), x.shape[1]
                self.cache_k[:, pos:pos + n] = k
                self.cache_v[:, pos:pos + n] = 2 * k
                return x + 0.01 * (self.cache_k[:, :pos + n].sum(1, keepdim=True) + self.cache_v[:, :pos + n].mean(1, keepdim=True))

        class Net(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = lib.nn.ModuleList([Attn() for _ in range(32)])

            def forward(self, x, pos):
                for layer in self.layers:
                    x = layer(x, pos)
                return x

        net = Net()
        layers = net.layers
        for layer in layers:
            load_values(lib, layer.wk, {"weight": np.eye(4, dtype=np.float32) * 0.5})
        with torch.no_grad():
            for pos in (0, 2):
                x = net(lib.ones(1, 2, 4), pos)  # (one eager call of the whole model: all 64 caches in it)
        out[lib] = (np.asarray(x), np.asarray(layers[31].cache_v))
    assert all(np.allclose(a, b, rtol=1e-6) for a, b in zip(out[mica], out[torch]))


def test_reassigning_state_in_an_eager_forward_makes_new_objects_as_torchs():
    """`self.last_loss = ...` and a buffer reassigned in an eager forward are new objects after each
    call, as torch's: values collected from earlier calls keep theirs (they were all overwritten
    with the last call's); a dict assigned to a buffer's name is torch's refusal, as a sentence."""
    out = {}
    for lib in (mica, torch):
        class M(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("last", lib.zeros(2))
                self.last_loss = None

            def forward(self, x):
                self.last_loss = x.sum()
                self.last = x * 1.0
                return x

        m, losses, lasts = M(), [], []
        for k in (1.0, 2.0, 3.0):
            m(lib.ones(2) * k)
            losses.append(m.last_loss)
            lasts.append(m.last)
        out[lib] = ([float(v) for v in losses], [np.asarray(v).tolist() for v in lasts])
    assert out[mica] == out[torch] == ([2.0, 4.0, 6.0], [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])

    class Bad(mica.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buf", mica.zeros(2))

        def forward(self, x):
            self.buf = {"a": x, "n": 1}
            return x
    with pytest.raises(mica.MicaError, match=r"^cannot assign a dict as buffer 'buf'"):
        Bad()(mica.ones(2))


def test_a_compiled_function_reads_state_buffers_through_named_buffers_and_state_dict():
    """A compiled evaluation that reads the running statistics through named_buffers() or
    state_dict() takes them as inputs as m.running_mean does (it baked them in, stale); a helper
    module holding only a list is covered by the step's check of what it puts into lists."""
    bn = mica.nn.BatchNorm1d(2)
    lin = mica.nn.Linear(2, 2)
    opt = mica.optim.SGD(lin.parameters(), lr=0.05)

    @mica.compile
    def train(x):
        bn.train()
        bn(lin(x)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    @mica.compile
    def via_named(x):
        return dict(bn.named_buffers())["running_mean"] + lin(x).sum() * 0

    @mica.compile
    def via_state(x):
        return bn.state_dict()["running_var"] + lin(x).sum() * 0
    rng = np.random.default_rng(0)
    for _ in range(3):
        train(mica.tensor((rng.standard_normal((4, 2)) + 2).astype(np.float32)))
        assert np.allclose(np.asarray(via_named(mica.ones(1, 2))), np.asarray(bn.running_mean), atol=1e-7)
        assert np.allclose(np.asarray(via_state(mica.ones(1, 2))), np.asarray(bn.running_var), atol=1e-7)

    class Store(mica.nn.Module):
        def __init__(self):
            super().__init__()
            self.items = []

    class M(mica.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.store = mica.nn.Linear(2, 1), Store()

        def forward(self, x):
            h = self.fc(x)
            self.store.items.append(h)
            return h.sum()
    m = M()

    @mica.compile
    def step(x):
        m(x).backward()
    with pytest.raises(mica.MicaError, match=r"^the compiled step puts a tensor into Store.items"):
        step(mica.ones(3, 2))
    assert m.store.items == []


def test_inplace_activations_write_their_input_as_torchs():
    """inplace=True of the activations (functional, positional in the modules' constructors as
    LeakyReLU(0.2, True), and in Sequential) writes the input, which a forward may then read instead
    of the result: a compiled training step and an eager call give torch's values and gradients (the
    flag was ignored, so a forward reading its input got the values before the activation)."""
    rng = np.random.default_rng(5)
    w1, w2 = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((3, 6)).astype(np.float32)
    xv = rng.standard_normal((5, 4)).astype(np.float32)
    acts = [lambda lib, h: lib.nn.Sequential(lib.nn.LeakyReLU(0.2, True))(h),
            lambda lib, h: lib.nn.functional.silu(h, inplace=True),
            lambda lib, h: lib.nn.functional.hardtanh(h, -0.8, 0.9, True),
            lambda lib, h: lib.nn.ELU(0.5, True)(h),
            lambda lib, h: lib.nn.functional.dropout(h, 0.0, True, True)]
    for act in acts:
        got = {}
        for lib in (mica, torch):
            nn = lib.nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc1, self.fc2 = nn.Linear(4, 6, bias=False), nn.Linear(6, 3, bias=False)

                def forward(self, x):
                    h = self.fc1(x)
                    act(lib, h)  # (the result unused: h is what was written)
                    return self.fc2(h)

            net = Net()
            load_values(lib, net, {"fc1.weight": w1, "fc2.weight": w2})
            x = lib.tensor(xv)

            def step(x):
                loss = (net(x) ** 2).mean()
                loss.backward()
                return loss
            if lib is mica:
                step = mica.compile(step)
            loss = float(step(x))
            eager = np.asarray(net(x).detach() if lib is torch else net(x))
            got[lib.__name__] = (loss, np.asarray(net.fc1.weight.grad).copy(), eager)
        (ml, mg, me), (tl, tg, te) = got["mica"], got["torch"]
        assert abs(ml - tl) <= 1e-5 * abs(tl) and rel_err(mg, tg) < 1e-5 and rel_err(me, te) < 1e-5
    for lib in (mica, torch):
        r = lib.tensor(np.array([-1.0, 2.0], np.float32))
        assert lib.nn.functional.leaky_relu(r, 0.5, True) is r and np.asarray(r).tolist() == [-0.5, 2.0]
        assert repr(lib.nn.LeakyReLU(0.2, True)) == "LeakyReLU(negative_slope=0.2, inplace=True)"
        assert repr(lib.nn.Hardswish(True)) == "Hardswish()" and repr(lib.nn.ReLU(inplace=True)) == "ReLU(inplace=True)"
        with pytest.raises(TypeError):
            lib.nn.Tanh(inplace=True)  # (torch's Tanh takes no inplace)


def test_the_view_verbs_function_forms_are_views_outside_a_trace():
    """torch.narrow(h, ...), torch.diagonal(h), torch.transpose(h, ...) and the other view verbs in
    their function form share h's memory, as their method forms do (they gave copies, so a write
    through them was lost); narrow takes a 0-d tensor as its start there too."""
    got = []
    for lib in (mica, torch):
        h = lib.arange(12.0).view(3, 4)
        lib.narrow(h, 0, lib.tensor(1), 1).mul_(-1)
        lib.diagonal(h).add_(100)
        lib.select(h, 1, 3).zero_()
        lib.transpose(h, 0, 1)[0].add_(1000)
        lib.permute(h, (1, 0))[1].add_(0.5)
        lib.squeeze(lib.unsqueeze(h, 0), 0)[2].mul_(2)
        lib.movedim(h, 0, 1)[2].sub_(3)
        got.append(np.asarray(h).tolist())
    assert got[0] == got[1]


def test_a_buffer_registered_again_in_forward_is_kept_as_torchs():
    """Hugging Face's LLaMA grows its causal mask in forward with register_buffer when an input is
    longer than it: eagerly and in a compiled step the buffer is the new tensor afterwards (it was
    refused, speaking of numpy reading a traced Tensor); transpose's keywords outside a trace."""
    for compiled in (False, True):
        got = []
        for lib in (mica, torch):
            class M(lib.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.w = lib.nn.Parameter(lib.ones(6))
                    self.register_buffer("mask", lib.triu(lib.full((4, 4), fill_value=1.0), diagonal=1),
                                         persistent=False)

                def forward(self, x):
                    if x.shape[-1] > self.mask.shape[-1]:
                        m = lib.full((8, 8), fill_value=1.0)
                        self.register_buffer("mask", lib.triu(m, diagonal=1), persistent=False)
                    return (x * self.w * self.mask[: x.shape[-1], : x.shape[-1]].sum()).sum()
            m = M()
            opt = lib.optim.SGD(m.parameters(), lr=0.1)

            def step(x):
                loss = m(x)
                loss.backward()
                opt.step()
                opt.zero_grad()
                return loss
            if compiled and lib is mica:
                step = mica.compile(step)
            losses = [float(step(lib.ones(6))) for _ in range(2)] if compiled else [float(m(lib.ones(6)))]
            got.append((losses, tuple(m.mask.shape), "mask" in m.state_dict()))
        assert got[0] == got[1], (compiled, got)
    for lib in (mica, torch):
        assert tuple(lib.transpose(lib.ones(2, 3), dim0=0, dim1=1).shape) == (3, 2)


def test_isinstance_tensor_and_eager_autocast_products_as_torchs():
    """isinstance(x, mica.Tensor) holds for host tensors and Parameters as torch's (pytorch/examples'
    repackage_hidden recursed into a tensor and crashed), is_tensor and is_floating_point give
    Python bools, and a host tensor's @ inside mica.autocast is the half product (it was float32's)."""
    x, w = mica.zeros(3), mica.nn.Linear(2, 2).weight
    assert all(isinstance(t, mica.Tensor) for t in (x, w, w.new_zeros(2)))
    assert not isinstance(np.zeros(2), mica.Tensor) and not isinstance(3.0, mica.Tensor)
    assert mica.is_tensor(x) is True and mica.is_tensor(w) is True and mica.is_tensor(np.zeros(2)) is False
    assert mica.is_floating_point(x) is True and mica.is_floating_point(mica.tensor([1])) is False

    def traced(a):
        assert isinstance(a, mica.Tensor) and mica.is_tensor(a) and mica.is_floating_point(a) is True
        return a * 2
    np.testing.assert_array_equal(np.asarray(mica.compile(traced)(np.ones(2, np.float32))), [2.0, 2.0])
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 64)).astype(np.float32), rng.standard_normal((64, 3)).astype(np.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = (torch.tensor(a) @ torch.tensor(b)).float().numpy()
    with mica.autocast(dtype=mica.bfloat16):
        got = np.asarray(mica.tensor(a) @ mica.tensor(b))
    np.testing.assert_array_equal(got, want)


def test_a_host_tensor_given_first_to_a_verb_inside_a_trace_is_a_constant_as_torchs_tensor():
    """makemore's evaluation: `torch.sqrt(self.running_var + eps)` on a host tensor inside a compiled
    function said 'sqrt takes a Tensor'; pow/maximum of two host tensors had no Tensor operand, and
    round(decimals=) dropped its decimals. Each is the trace's constant now, torch's values."""
    import torch

    rng = np.random.default_rng(11)
    a, b = (rng.random(5).astype(np.float32) + 0.5 for _ in range(2))
    h, k = mica.tensor(a), mica.tensor(b)
    cases = [(lambda m, u, v: m.sqrt(u)), (lambda m, u, v: m.tanh(u)), (lambda m, u, v: m.floor(u * 4)),
             (lambda m, u, v: m.pow(u, v)), (lambda m, u, v: m.maximum(u, v)), (lambda m, u, v: m.round(u, decimals=1)),
             (lambda m, u, v: m.nn.functional.relu(u - 1)), (lambda m, u, v: m.exp(u))]
    step = mica.compile(lambda x: [x + f(mica, h, k) for f in cases])
    got = step(np.zeros(5, np.float32))
    for f, g in zip(cases, got):
        np.testing.assert_allclose(np.asarray(g), f(torch, torch.tensor(a), torch.tensor(b)).numpy(), rtol=1e-6)
    with pytest.raises(mica.MicaError, match=r"^sqrt takes a Tensor, got float"):
        mica.compile(lambda x: x + mica.sqrt(2.0))(np.zeros(5, np.float32))  # (torch takes no number there either)
    n, one = mica.tensor(5), mica.tensor(1.0)  # (a factory's 0-d host tensor is its number, as before)
    got = mica.compile(lambda x: x + mica.arange(n).float() + mica.linspace(one * 0, one, 5))(np.zeros(5, np.float32))
    np.testing.assert_allclose(np.asarray(got), np.arange(5) + np.linspace(0, 1, 5), rtol=1e-6)


def test_a_host_tensor_indexed_by_traced_positions_inside_a_trace_is_a_gather_from_its_constant():
    """`Xtr[ix]` inside a compiled step, the data a host tensor and ix the step's input, asked numpy
    to read the traced ix (a sentence); it gathers from the trace's constant, as torch's."""
    import torch

    rng = np.random.default_rng(12)
    data, labels = rng.standard_normal((20, 3)).astype(np.float32), rng.integers(0, 4, 20)
    X, Y = mica.tensor(data), mica.tensor(labels)
    step = mica.compile(lambda ix: (X[ix] * 2, Y[ix, None], X[ix[:2], 1:]))
    for _ in range(2):
        ix = rng.integers(0, 20, 6)
        got = step(mica.tensor(ix))
        want = (torch.tensor(data)[ix] * 2, torch.tensor(labels)[ix, None], torch.tensor(data)[ix[:2], 1:])
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), w.numpy())


def test_a_host_tensor_made_a_leaf_in_place_trains_as_torchs_with_a_hand_update_or_an_optimizer():
    """makemore part 2's `for p in parameters: p.requires_grad = True` on plain tensors was a
    sentence ('cannot become a parameter in place'); such a tensor is now a leaf whose values a
    compiled step trains in place, with .grad held after the call, as torch's. Its views and eager
    results are plain tensors again."""
    import torch

    rng = np.random.default_rng(8)
    w0, b0 = rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    xs = [rng.standard_normal((4, 6)).astype(np.float32) for _ in range(3)]

    def run(lib, compiled, optimizer):
        W, b = lib.tensor(w0) * 0.5, lib.tensor(b0) * 1.0  # (results of operations: plain tensors)
        for p in (W, b):
            p.requires_grad = True
        opt = lib.optim.SGD([W, b], lr=0.1, momentum=0.9) if optimizer else None

        def step(x):
            loss = (lib.tanh(x @ W + b) ** 2).mean() + 0.01 * (W ** 2).sum() + b.abs().sum() * 0.001
            if opt:
                opt.zero_grad()
                loss.backward()
                opt.step()
            else:
                for p in (W, b):
                    p.grad = None
                loss.backward()
                with lib.no_grad():
                    for p in (W, b):
                        p.data += -0.1 * p.grad
            return loss

        step = compiled(step) if compiled else step
        losses = [float(step(lib.tensor(x))) for x in xs]
        return losses, [_np(W), _np(b), _np(W.grad), _np(b.grad)], (W, b)

    for optimizer in (False, True):
        got, held, (W, b) = run(mica, mica.compile, optimizer)
        want, theirs, _ = run(torch, None, optimizer)
        np.testing.assert_allclose(got, want, rtol=1e-5)
        for a, t in zip(held, theirs):
            np.testing.assert_allclose(a, t, rtol=1e-5, atol=1e-7)
        assert W.requires_grad and W.is_leaf and type(W[0]).__name__ == "HostTensor" and not W[0].requires_grad
        assert type(W * 2).__name__ == "HostTensor"
    with pytest.raises(mica.MicaError, match=r"^this host tensor cannot become a leaf in place here \(not a floating"):
        mica.tensor([1, 2]).requires_grad = True


def _np(t):
    return t.detach().numpy() if type(t).__module__.startswith("torch") else np.asarray(t)


@pytest.mark.parametrize("loop", ["zero_grad first", "p.grad = None first", "accumulating"])
def test_a_step_that_drops_gradients_first_builds_one_program_and_one_that_adds_to_them_two(loop):
    """torch's tutorials zero the gradients at the top of the step: the gradients the first call
    left made the second call build the step again (as long as the first: an outside tester's
    minGPT and DCGAN ports). Where the step drops or replaces them before reading them they are no
    input; where backward() adds to what a call holds they are, as torch's values need."""
    import torch

    rng = np.random.default_rng(9)
    w0 = rng.standard_normal((5, 2)).astype(np.float32)
    xs = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(4)]

    def run(lib, compiled):
        lin = lib.nn.Linear(5, 2)
        with lib.no_grad():
            lin.weight.copy_(lib.tensor(w0.T.copy()))
            lin.bias.zero_()
        opt = lib.optim.AdamW(lin.parameters(), lr=0.01)

        def step(x):
            loss = lin(x).square().mean()
            if loop == "zero_grad first":
                opt.zero_grad()
            elif loop == "p.grad = None first":
                for p in lin.parameters():
                    p.grad = None
            loss.backward()
            opt.step()
            return loss

        step = compiled(step) if compiled else step
        return [float(step(lib.tensor(x))) for x in xs], step

    got, step = run(mica, mica.compile)
    want, _ = run(torch, None)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    programs = sum(len(s.programs) for s in {id(s): s for s in step.built.values()}.values())
    assert programs == (2 if loop == "accumulating" else 1)


@pytest.mark.parametrize("made", ["Parameter", "requires_grad in place"])
def test_a_parameter_given_as_an_argument_of_a_compiled_step_is_trained_as_torchs(made):
    """step(W, x) with W a trainable tensor: its values were an input and backward() said to make
    it a Parameter, which it was; it is the trainable object now, as a global one is."""
    import torch

    rng = np.random.default_rng(10)
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    xs = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(3)]

    def run(lib, compiled):
        if lib is torch:
            W = torch.tensor(w0, requires_grad=True)
        elif made == "Parameter":
            W = mica.nn.Parameter(mica.tensor(w0))
        else:
            W = mica.tensor(w0)
            W.requires_grad = True

        def step(W, x, scale):
            loss = (x @ W).tanh().sum() * scale
            loss.backward()
            with lib.no_grad():
                W.data -= 0.1 * W.grad
            W.grad = None
            return loss

        step = compiled(step) if compiled else step
        return [float(step(W, lib.tensor(x), 0.5)) for x in xs], _np(W)

    (got, w), (want, tw) = run(mica, mica.compile), run(torch, None)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(w, tw, rtol=1e-5, atol=1e-7)


def test_a_gan_step_whose_d_loss_reaches_no_g_parameter_builds_one_program():
    """D's loss on fake.detach() does not reach G, so its backward() does not read G's gradients:
    the ones the first call left made the second call build the step again (an outside tester's
    DCGAN: 40 s, then 33 s), and parameters of one shape shared one stand-in in the first trace."""
    import torch

    def run(lib, compiled):
        torch.manual_seed(1)
        tg, td = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        G, D = (tg, td) if lib is torch else (mica.nn.Linear(4, 4), mica.nn.Linear(4, 1))
        if lib is mica:
            for mine, theirs in ((G, tg), (D, td)):
                mine.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
        og, od = lib.optim.Adam(G.parameters(), lr=1e-2), lib.optim.Adam(D.parameters(), lr=1e-2)

        def step(real, z):
            fake = G(z)
            od.zero_grad()
            loss_d = D(real).mean() - D(fake.detach()).mean()
            loss_d.backward()
            od.step()
            og.zero_grad()
            loss_g = -D(fake).mean()
            loss_g.backward()
            og.step()
            return loss_d, loss_g

        step = compiled(step) if compiled else step
        rng = np.random.default_rng(3)
        out = [[float(v) for v in step(lib.tensor(rng.standard_normal((2, 4)).astype(np.float32)),
                                      lib.tensor(rng.standard_normal((2, 4)).astype(np.float32)))] for _ in range(3)]
        return out, step

    got, step = run(mica, mica.compile)
    want, _ = run(torch, None)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert sum(len(s.programs) for s in {id(s): s for s in step.built.values()}.values()) == 1


def test_the_tutorials_device_lines_and_a_comparison_with_torchs_labels_run_as_torchs_on_a_cpu():
    """The Quickstart's `torch.accelerator` line and the DQN tutorial's `torch.backends.mps` one were
    sentences; a host tensor compared with a torch tensor (labels from torch's DataLoader) gave a
    torch tensor, on which `.type(mica.float)` failed. Each is what torch on a CPU-only machine gives."""
    import torch

    device = mica.accelerator.current_accelerator().type if mica.accelerator.is_available() else "cpu"
    assert device == "cpu" and mica.accelerator.device_count() == 0
    assert str(mica.device("cuda" if mica.cuda.is_available() else "mps" if mica.backends.mps.is_available()
                           else "cpu")) == "cpu"
    pred = mica.tensor(np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]], np.float32))
    y = torch.tensor([1, 1, 1])
    same = pred.argmax(1) == y
    assert isinstance(same, mica.Tensor) and same.type(mica.float).sum().item() == 2.0
    np.testing.assert_array_equal(np.asarray(pred + torch.ones(2)), pred.numpy() + 1)
    assert isinstance(pred * torch.tensor(2.0), mica.Tensor)


def test_data_of_a_computed_tensor_in_a_compiled_step_is_torchs_detached_alias():
    """The char-RNN tutorial's `p.data.add_(p.grad.data, alpha=-lr)` and old code's
    `p.grad.data.clamp_(-1, 1)` and `return loss.data` said 'Mica has no Tensor.data' in a compiled
    step: .data is the tensor detached, a write through it reaching the tensor, as torch's."""
    import torch

    rng = np.random.default_rng(13)
    x = rng.standard_normal((5, 3)).astype(np.float32) * 4
    nets = []
    for lib in (torch, mica):
        lib.manual_seed(0)
        nets.append(lib.nn.Linear(3, 2))
    nets[1].load_state_dict(nets[0].state_dict())

    def body(lib, net, x):
        net.zero_grad()
        loss = (net(x) ** 3).mean()
        loss.backward()
        for p in net.parameters():
            p.grad.data.clamp_(-0.5, 0.5)
            p.data.add_(p.grad.data, alpha=-0.1)
        return loss.data * 2

    step = mica.compile(lambda x: body(mica, nets[1], x))
    for _ in range(3):
        np.testing.assert_allclose(float(step(mica.tensor(x))), float(body(torch, nets[0], torch.tensor(x))), rtol=1e-5)
    for (k, v), w in zip(nets[1].state_dict().items(), nets[0].state_dict().values()):
        np.testing.assert_allclose(np.asarray(v), w.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(np.asarray(nets[1].weight.grad), nets[0].weight.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert float(np.abs(np.asarray(nets[1].weight.grad)).max()) <= 0.5
