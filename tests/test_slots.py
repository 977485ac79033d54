"""What a compiled step rebinds outside its modules (mica/slots.py), against torch's eager step on
the same script: makemore's global running statistics (part 3, `global bnmean_running`), its own
layer classes (plain Python objects whose `self.running_mean` and `self.out` are rebound), a running
loss kept in a global number, a closure's `nonlocal` total. Each script is run twice, as written,
once with `torch` and once with `mica` bound to the name torch (the user's module globals are its
own: exec of the text), from the same initial values."""
import numpy as np
import pytest

import mica

torch = pytest.importorskip("torch")

N_EMBD, N_HIDDEN, BLOCK, VOCAB, BATCH = 6, 16, 3, 11, 8

COMMON = '''
def P(a):
    return torch.tensor(a).requires_grad_() if torch.__name__ == "torch" else torch.nn.Parameter(torch.tensor(a))
compiled = (lambda f: f) if torch.__name__ == "torch" else torch.compile
F = torch.nn.functional
'''

PART3_GLOBALS = COMMON + '''
C, W1, W2, b2 = P(init["C"]), P(init["W1"]), P(init["W2"]), P(init["b2"])
bngain, bnbias = P(np.ones((1, N_HIDDEN), np.float32)), P(np.zeros((1, N_HIDDEN), np.float32))
bnmean_running = torch.zeros((1, N_HIDDEN))
bnstd_running = torch.ones((1, N_HIDDEN))
parameters = [C, W1, W2, b2, bngain, bnbias]

@compiled
def step(Xb, Yb, lr):
    global bnmean_running, bnstd_running
    emb = C[Xb]
    hpreact = emb.view(emb.shape[0], -1) @ W1
    bnmeani = hpreact.mean(0, keepdim=True)
    bnstdi = hpreact.std(0, keepdim=True)
    hpreact = bngain * (hpreact - bnmeani) / bnstdi + bnbias
    with torch.no_grad():
        bnmean_running = 0.999 * bnmean_running + 0.001 * bnmeani
        bnstd_running = 0.999 * bnstd_running + 0.001 * bnstdi
    logits = torch.tanh(hpreact) @ W2 + b2
    loss = F.cross_entropy(logits, Yb)
    for p in parameters:
        p.grad = None
    loss.backward()
    for p in parameters:
        p.data += -lr * p.grad
    return loss

@compiled
def split_loss(Xb, Yb):
    emb = C[Xb]
    hpreact = emb.view(emb.shape[0], -1) @ W1
    hpreact = bngain * (hpreact - bnmean_running) / bnstd_running + bnbias
    return F.cross_entropy(torch.tanh(hpreact) @ W2 + b2, Yb)
'''

PART3_CLASSES = COMMON + '''
class Linear:
    def __init__(self, w):
        self.weight = P(w)
        self.bias = None
    def __call__(self, x):
        self.out = x @ self.weight
        if self.bias is not None:
            self.out += self.bias
        return self.out
    def parameters(self):
        return [self.weight]

class BatchNorm1d:
    def __init__(self, dim, eps=1e-5, momentum=0.1):
        self.eps, self.momentum, self.training = eps, momentum, True
        self.gamma = P(np.ones(dim, np.float32))
        self.beta = P(np.zeros(dim, np.float32))
        self.running_mean = torch.zeros(dim)
        self.running_var = torch.ones(dim)
    def __call__(self, x):
        if self.training:
            xmean = x.mean(0, keepdim=True)
            xvar = x.var(0, keepdim=True)
        else:
            xmean, xvar = self.running_mean, self.running_var
        xhat = (x - xmean) / torch.sqrt(xvar + self.eps)
        self.out = self.gamma * xhat + self.beta
        if self.training:
            with torch.no_grad():
                self.running_mean = (1 - self.momentum) * self.running_mean + self.momentum * xmean
                self.running_var = (1 - self.momentum) * self.running_var + self.momentum * xvar
        return self.out
    def parameters(self):
        return [self.gamma, self.beta]

class Tanh:
    def __call__(self, x):
        self.out = torch.tanh(x)
        return self.out
    def parameters(self):
        return []

C = P(init["C"])
layers = [Linear(init["W1"]), BatchNorm1d(N_HIDDEN), Tanh(), Linear(init["W2"]), BatchNorm1d(VOCAB)]
parameters = [C] + [p for layer in layers for p in layer.parameters()]

def forward(Xb):
    emb = C[Xb]
    x = emb.view(emb.shape[0], -1)
    for layer in layers:
        x = layer(x)
    return x

@compiled
def step(Xb, Yb, lr):
    loss = F.cross_entropy(forward(Xb), Yb)
    for layer in layers:
        layer.out.retain_grad()  # (makemore's: each layer's output gradient, plotted after training)
    for p in parameters:
        p.grad = None
    loss.backward()
    with torch.no_grad():
        for p in parameters:
            p.data += -lr * p.grad
    return loss

@compiled
def split_loss(Xb, Yb):
    return F.cross_entropy(forward(Xb), Yb)
'''


def _init():
    rng = np.random.default_rng(7)
    return {"C": rng.standard_normal((VOCAB, N_EMBD)).astype(np.float32),
            "W1": (rng.standard_normal((N_EMBD * BLOCK, N_HIDDEN)) / (N_EMBD * BLOCK) ** 0.5).astype(np.float32),
            "W2": (rng.standard_normal((N_HIDDEN, VOCAB)) * 0.1).astype(np.float32),
            "b2": np.zeros(VOCAB, np.float32)}


def _script(text, lib):
    g = {"torch": lib, "np": np, "init": _init(), "N_HIDDEN": N_HIDDEN, "VOCAB": VOCAB, "__name__": "makemore"}
    exec(compile(text, "makemore_part3.py", "exec"), g)
    return g


def _batches(n):
    rng = np.random.default_rng(3)
    return [(rng.integers(0, VOCAB, (BATCH, BLOCK)), rng.integers(0, VOCAB, (BATCH,))) for _ in range(n)]


def _programs(fn):
    return len({id(p) for p in fn.built.values()})


def _arr(t):
    return t.detach().numpy() if hasattr(t, "detach") and type(t).__module__.startswith("torch") else np.asarray(t)


def test_makemores_global_running_statistics_are_the_compiled_steps_state_as_torchs_eager_globals():
    """`global bnmean_running; bnmean_running = 0.999 * bnmean_running + ...` in a compiled step left
    a traced tensor in the global, dead at the next call; it is now the step's state: an input at
    each call, the global holding the new host tensor after it, compiled once."""
    ours, theirs = _script(PART3_GLOBALS, mica), _script(PART3_GLOBALS, torch)
    for i, (x, y) in enumerate(_batches(5)):
        a = ours["step"](mica.tensor(x), mica.tensor(y), 0.1)
        b = theirs["step"](torch.tensor(x), torch.tensor(y), 0.1)
        np.testing.assert_allclose(float(a), float(b), rtol=2e-5)
        for name in ("bnmean_running", "bnstd_running"):
            assert isinstance(ours[name], mica.Tensor) and tuple(ours[name].shape) == (1, N_HIDDEN)
            np.testing.assert_allclose(_arr(ours[name]), _arr(theirs[name]), rtol=1e-4, atol=1e-6)
    assert _programs(ours["step"]) == 1  # (the new values are inputs: no program per call)
    x, y = _batches(6)[-1]
    with torch.no_grad():  # (the evaluation reads the globals the training left, as torch's)
        np.testing.assert_allclose(float(ours["split_loss"](mica.tensor(x), mica.tensor(y))),
                                   float(theirs["split_loss"](torch.tensor(x), torch.tensor(y))), rtol=2e-5)
    ours["bnmean_running"] = mica.zeros((1, N_HIDDEN))  # (a value set between calls is the one the next call reads)
    theirs["bnmean_running"] = torch.zeros((1, N_HIDDEN))
    ours["step"](mica.tensor(x), mica.tensor(y), 0.1)
    theirs["step"](torch.tensor(x), torch.tensor(y), 0.1)
    np.testing.assert_allclose(_arr(ours["bnmean_running"]), _arr(theirs["bnmean_running"]), rtol=1e-4, atol=1e-7)
    assert _programs(ours["step"]) == 1


def test_an_evaluation_reading_the_globals_the_training_step_keeps_takes_them_as_inputs_compiled_once():
    """makemore's loop evaluates between training steps: the compiled evaluation reads the running
    statistics the compiled training step rebinds at each call. It takes them as inputs (they are
    another compiled step's state), so it is compiled once and reads each new value, as torch's, and
    leaves the globals it only reads as they were."""
    ours, theirs = _script(PART3_GLOBALS, mica), _script(PART3_GLOBALS, torch)
    batches = _batches(6)
    for i, (x, y) in enumerate(batches[:5]):
        ours["step"](mica.tensor(x), mica.tensor(y), 0.1)
        theirs["step"](torch.tensor(x), torch.tensor(y), 0.1)
        held = ours["bnmean_running"]
        ex, ey = batches[5 - i]
        with torch.no_grad():
            np.testing.assert_allclose(float(ours["split_loss"](mica.tensor(ex), mica.tensor(ey))),
                                       float(theirs["split_loss"](torch.tensor(ex), torch.tensor(ey))), rtol=2e-5)
        assert ours["bnmean_running"] is held  # (read, not rebound: the same tensor)
    assert _programs(ours["step"]) == 1 and _programs(ours["split_loss"]) == 1
    ours["bnstd_running"] = mica.full((1, N_HIDDEN), 2.0)  # (a value set by hand is read too)
    theirs["bnstd_running"] = torch.full((1, N_HIDDEN), 2.0)
    with torch.no_grad():
        np.testing.assert_allclose(float(ours["split_loss"](mica.tensor(x), mica.tensor(y))),
                                   float(theirs["split_loss"](torch.tensor(x), torch.tensor(y))), rtol=2e-5)
    assert _programs(ours["split_loss"]) == 1


def _leaves(text):
    """The script as makemore writes it: plain tensors, then `for p in parameters: p.requires_grad = True`."""
    text = text.replace('return torch.tensor(a).requires_grad_() if torch.__name__ == "torch" else '
                        'torch.nn.Parameter(torch.tensor(a))', "return torch.tensor(a)")
    return text.replace("parameters = [C] + [p for layer in layers for p in layer.parameters()]\n",
                        "parameters = [C] + [p for layer in layers for p in layer.parameters()]\n"
                        "for p in parameters:\n    p.requires_grad = True\n")


@pytest.mark.parametrize("made", ["parameters", "requires_grad in place"])
def test_makemores_own_layer_classes_keep_their_running_statistics_and_outputs_as_torchs(made):
    """makemore's Linear/BatchNorm1d/Tanh are plain classes (not nn.Module): `self.running_mean = ...`
    (a (n,) tensor rebound to a (1, n) one, as torch's broadcast makes it) and `self.out = ...` are
    the step's state and outputs, `layer.out.retain_grad()` keeps `layer.out.grad` after the call;
    switching the layers to evaluation reads the running values."""
    text = PART3_CLASSES if made == "parameters" else _leaves(PART3_CLASSES)
    assert made == "parameters" or "p.requires_grad = True" in text and "nn.Parameter" not in text
    ours, theirs = _script(text, mica), _script(text, torch)
    for x, y in _batches(4):
        a = ours["step"](mica.tensor(x), mica.tensor(y), 0.1)
        b = theirs["step"](torch.tensor(x), torch.tensor(y), 0.1)
        np.testing.assert_allclose(float(a), float(b), rtol=2e-5)
        for k in (1, 4):
            for name in ("running_mean", "running_var"):
                got, want = getattr(ours["layers"][k], name), getattr(theirs["layers"][k], name)
                assert tuple(got.shape) == tuple(want.shape)
                np.testing.assert_allclose(_arr(got), _arr(want), rtol=1e-4, atol=1e-6)
        for k in range(5):  # (what each layer's forward left in self.out: the step's outputs, with their gradients)
            np.testing.assert_allclose(_arr(ours["layers"][k].out), _arr(theirs["layers"][k].out), rtol=1e-4,
                                       atol=1e-5)
            np.testing.assert_allclose(_arr(ours["layers"][k].out.grad), _arr(theirs["layers"][k].out.grad),
                                       rtol=1e-4, atol=1e-6)
    assert _programs(ours["step"]) == 1
    for p, q in zip(ours["parameters"], theirs["parameters"]):  # (trained values and the last gradients, held)
        np.testing.assert_allclose(_arr(p), _arr(q), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(_arr(p.grad), _arr(q.grad), rtol=1e-4, atol=1e-6)
        assert p.requires_grad and p.is_leaf
    for g in (ours, theirs):
        for layer in g["layers"]:
            layer.training = False
    x, y = _batches(5)[-1]
    with torch.no_grad():
        np.testing.assert_allclose(float(ours["split_loss"](mica.tensor(x), mica.tensor(y))),
                                   float(theirs["split_loss"](torch.tensor(x), torch.tensor(y))), rtol=2e-5)


RUNNING = COMMON + '''
W = P(init["W1"][:, :4])
ema = 0.0
@compiled
def step(x, lr):
    global ema
    loss = (x @ W).square().mean()
    W.grad = None
    loss.backward()
    with torch.no_grad():
        W.data -= lr * W.grad
    ema = 0.9 * ema + 0.1 * loss.detach()
    return loss

def counter():
    total = torch.zeros(4)
    @compiled
    def add(x):
        nonlocal total
        total = total + x.sum(0)
        return total * 2
    return add, lambda: total
'''


def test_a_running_number_and_a_closures_nonlocal_total_are_kept_between_calls():
    ours, theirs = _script(RUNNING, mica), _script(RUNNING, torch)
    rng = np.random.default_rng(5)
    for _ in range(4):
        x = rng.standard_normal((5, N_EMBD * BLOCK)).astype(np.float32)
        np.testing.assert_allclose(float(ours["step"](mica.tensor(x), 0.05)),
                                   float(theirs["step"](torch.tensor(x), 0.05)), rtol=1e-5)
        np.testing.assert_allclose(float(ours["ema"]), float(theirs["ema"]), rtol=1e-5)
    assert isinstance(ours["ema"], mica.Tensor) and tuple(ours["ema"].shape) == ()
    assert _programs(ours["step"]) == 1
    (add, total), (tadd, ttotal) = ours["counter"](), theirs["counter"]()
    for _ in range(3):
        x = rng.standard_normal((2, 4)).astype(np.float32)
        np.testing.assert_allclose(_arr(add(mica.tensor(x))), _arr(tadd(torch.tensor(x))), rtol=1e-6)
        np.testing.assert_allclose(_arr(total()), _arr(ttotal()), rtol=1e-6)
    assert _programs(add) == 1


def test_rebinding_a_trained_tensor_is_a_sentence_naming_the_line():
    W = mica.nn.Parameter(mica.randn(3, 2))
    g = {"W": W, "mica": mica, "np": np}
    exec(compile("def step(x):\n    global W\n    loss = (x @ W).sum()\n    loss.backward()\n"
                 "    W = W - 0.1 * W.grad\n    return loss\n", "sgd.py", "exec"), g)
    with pytest.raises(mica.MicaError, match=r"^the compiled step rebinds the global W, a tensor that requires a "
                                             r"gradient.*W\.data -= lr \* W\.grad.*sgd\.py:\d+\)$"):
        mica.compile(g["step"])(np.ones((4, 3), np.float32))
    assert g["W"] is W  # (put back as it was)


def test_retain_grad_keeps_a_non_leafs_gradient_inside_the_step_as_torchs():
    rng = np.random.default_rng(2)
    w0, x = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)

    def run(lib, compiled):
        w = lib.nn.Parameter(lib.tensor(w0))

        def step(x):
            h = lib.tanh(x @ w)
            h.retain_grad()
            assert h.retains_grad
            loss = (h * h).sum()
            loss.backward()
            return h.grad * 1.0, w.grad * 1.0

        return [_arr(t) for t in (compiled(step) if compiled else step)(lib.tensor(x))]

    for got, want in zip(run(mica, mica.compile), run(torch, None)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert mica.ones(2).grad is None  # (a tensor that requires no gradient has none, as torch's)


FIRST_CALL = COMMON + '''
running = None
class Slotted:
    __slots__ = ("m", "calls")
    def __init__(self):
        self.m = torch.zeros(3)
        self.calls = 0
holder = Slotted()
W = torch.tensor(init["W1"][:3, :3])
W.requires_grad = True

@compiled
def step(x):
    global running, W
    m = x.mean(0)
    if running is None:
        running = m
    else:
        running = 0.9 * running + 0.1 * m
    holder.m = holder.m * 0.5 + m
    loss = (x @ W).square().mean()
    W.grad = None
    loss.backward()
    with torch.no_grad():
        W -= 0.1 * W.grad
    return m.sum()
'''


def test_a_global_started_as_none_an_objects_slots_and_an_in_place_update_of_a_global_leaf_are_torchs():
    """From an attack on the feature: `if running is None: running = m` on the first call was the
    'reads before assigning' sentence; an object with __slots__ kept a dead traced tensor;
    `W -= lr * W.grad` on a global leaf rebound the name. A list of tensors is a sentence."""
    ours, theirs = _script(FIRST_CALL, mica), _script(FIRST_CALL, torch)
    rng = np.random.default_rng(4)
    for _ in range(4):
        x = rng.standard_normal((5, 3)).astype(np.float32)
        np.testing.assert_allclose(float(ours["step"](mica.tensor(x))), float(theirs["step"](torch.tensor(x))),
                                   rtol=1e-6)
        for got, want in ((ours["running"], theirs["running"]), (ours["holder"].m, theirs["holder"].m),
                          (ours["W"], theirs["W"])):
            np.testing.assert_allclose(_arr(got), _arr(want), rtol=1e-5, atol=1e-7)
    assert type(ours["W"]).__name__ == "LeafTensor" and _programs(ours["step"]) == 2  # (None's branch, then the rest)
    boxed = {"st": [mica.zeros(3), mica.ones(3)], "mica": mica}
    exec(compile("def step(x):\n    global st\n    st = [st[0] + x, st[1] * 2]\n    return x.sum()\n",
                 "boxed.py", "exec"), boxed)
    with pytest.raises(mica.MicaError, match=r"^the compiled step rebinds the global st to a list holding tensors"):
        mica.compile(boxed["step"])(np.ones(3, np.float32))
    assert type(boxed["st"][0]).__name__ == "HostTensor"  # (put back as it was)


def test_a_python_counter_the_step_changes_is_warned_of():
    """`global count; count = count + 1` runs when the step is traced, not at each call: said."""
    g = {"count": 0, "mica": mica}
    exec(compile("def step(x):\n    global count\n    count = count + 1\n    return x * 2\n", "counter.py", "exec"), g)
    with pytest.warns(UserWarning, match=r"changes the global count, a Python number, as Python runs it: when the "
                                         r"step is traced, not at each call"):
        mica.compile(g["step"])(np.ones(2, np.float32))
