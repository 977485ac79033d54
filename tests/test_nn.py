"""Modules: PyTorch's parameter names and order, initializers, and the tutorial model."""
import math

import numpy as np
import pytest
import torch

import mica
import mica.nn as nn
from helpers import rel_err, to_torch
from mica.bench.torch_tutorial import tutorial_loss
from mica.models.tutorial import TutorialConfig, TutorialModel, make_step, specs


class Net(nn.Module):
    def __init__(self, lib):
        super().__init__()
        self.emb = lib.Embedding(10, 6)
        self.blocks = lib.ModuleList([lib.Sequential(lib.Linear(6, 8), lib.ReLU(), lib.Linear(8, 6, bias=False))
                                      for _ in range(2)])
        self.norms = lib.ModuleDict({"ln": lib.LayerNorm(6, bias=False), "rms": lib.RMSNorm(6)})
        self.head = lib.Linear(6, 10)



def _torch_net():
    m = torch.nn.Module()
    t = torch.nn
    m.emb = t.Embedding(10, 6)
    m.blocks = t.ModuleList([t.Sequential(t.Linear(6, 8), t.ReLU(), t.Linear(8, 6, bias=False)) for _ in range(2)])
    m.norms = t.ModuleDict({"ln": t.LayerNorm(6, bias=False), "rms": t.RMSNorm(6)})
    m.head = t.Linear(6, 10)
    return m


def test_names_and_order_equal_torch_state_dict():
    net = Net(nn)
    tnet = _torch_net()
    params = net.init(seed=0)
    assert list(net.state_dict(params)) == list(tnet.state_dict())
    assert {n: p.shape for n, p in net.named_parameters()} == {n: tuple(p.shape) for n, p in tnet.named_parameters()}


def test_layers_compute_as_torch_layers():
    net = Net(nn)
    params = {n: a.astype(np.float64) for n, a in net.init(seed=1).items()}
    params = {n: a + 0.1 * np.random.default_rng(2).standard_normal(a.shape) for n, a in params.items()}
    tnet = _torch_net().double()
    tnet.load_state_dict({n: to_torch(a) for n, a in params.items()})

    def forward(p, idx):
        with net.bind(p):
            x = net.emb(idx)
            for b in net.blocks:
                x = x + b(x)
            return net.head(net.norms["rms"](net.norms["ln"](x)))

    idx = np.random.default_rng(3).integers(0, 10, (2, 5))
    got = mica.reference.run(mica.trace(forward, net.double().param_specs(), mica.i64[2, 5]), params, idx)
    x = tnet.emb(to_torch(idx))
    for b in tnet.blocks:
        x = x + b(x)
    want = tnet.head(tnet.norms["rms"](tnet.norms["ln"](x)))
    assert rel_err(got, want.detach().numpy()) < 1e-12


def test_default_initializers_follow_torch_distributions():
    params = nn.Linear(400, 300).init(seed=0)
    bound = 1 / math.sqrt(400)
    w = params["weight"]
    assert w.dtype == np.float32 and w.shape == (300, 400)
    assert -bound <= w.min() and w.max() <= bound and abs(w.std() - bound / math.sqrt(3)) < 1e-3
    emb = nn.Embedding(1000, 50).init(seed=0)["weight"]
    assert abs(emb.std() - 1.0) < 0.02


def test_overrides_and_per_parameter_streams():
    net = Net(nn)
    base = net.init(seed=5)
    over = net.init(seed=5, overrides={"blocks.*.0.weight": nn.init.zeros(), "head.bias": nn.init.constant(3.0)})
    assert np.all(over["blocks.0.0.weight"] == 0) and np.all(over["blocks.1.0.weight"] == 0)
    assert np.all(over["head.bias"] == 3.0)
    np.testing.assert_array_equal(over["emb.weight"], base["emb.weight"])  # others untouched


def test_module_dtype_conversion():
    emb = nn.Embedding(10, 4).bfloat16()
    assert emb.param_specs()["weight"] == mica.bf16[10, 4]


def test_parameter_attributes_outside_a_trace_are_declarations():
    lin = nn.Linear(3, 2)
    assert lin.weight.shape == (2, 3) and lin.bias.numel() == 2
    with pytest.raises(mica.MicaError, match="no value given"):
        with lin.bind({}):
            pass


def test_tutorial_model_gradients_match_torch():
    cfg = TutorialConfig(dropout=0.0)
    model = TutorialModel(cfg)
    params = {n: a.astype(np.float64) for n, a in model.init(seed=0).items()}
    rng = np.random.default_rng(1)
    params = {n: a + 0.1 * rng.standard_normal(a.shape) for n, a in params.items()}
    tokens, targets = rng.integers(0, 5, (2, 3)), rng.integers(0, 5, (2, 3))

    def loss_and_grads(p, tok, tgt):
        return mica.value_and_grad(lambda p: nn.functional_call(model, p, tok, tgt))(p)

    prog = mica.trace(loss_and_grads, {n: mica.f64[a.shape] for n, a in params.items()}, mica.i64[2, 3], mica.i64[2, 3])
    loss, grads = mica.reference.run(prog, params, tokens, targets)
    tp = {n: to_torch(a, requires_grad=True) for n, a in params.items()}
    tloss = tutorial_loss(tp, to_torch(tokens), to_torch(targets), cfg)
    tloss.backward()
    assert rel_err(loss, tloss.item()) < 1e-12
    for n in params:
        assert rel_err(grads[n], tp[n].grad.numpy()) < 1e-10, n
    # the tied embedding collects both roads: the lookup and the head
    assert np.count_nonzero(grads["e"]) == grads["e"].size


def test_tutorial_training_follows_its_schedule_and_learns():
    model = TutorialModel(TutorialConfig(steps=30))
    step, opt = make_step(model)
    prog = mica.trace(step, *specs(model, opt))
    params = model.init(0)
    state = opt.init(params)
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, 5, (2, 3)), rng.integers(0, 5, (2, 3))
    losses, alphas = [], []
    for i in range(30):
        params, state, m = mica.reference.run(prog, params, state, tokens, targets, precision="float32", offset=i)
        losses.append(float(m["loss"]))
        alphas.append(float(m["alpha"]))
    assert alphas[0] == 0.0625 and alphas[15] == pytest.approx(0.03125)
    assert losses[-1] < 0.5 * losses[0]


def test_module_bookkeeping_follows_torch():
    """What an outside tester found: a non-persistent buffer in state_dict, an array assigned over a
    Parameter (silently untrained), Python floats as float64 parameters, containers' list and dict
    idioms, device= and inplace=, bfloat16 initial values the program cannot hold."""
    from collections import OrderedDict

    def build(lib):
        class M(lib.Module):
            def __init__(self):
                super().__init__()
                self.seq = lib.Sequential(OrderedDict([("fc", lib.Linear(3, 4, device="cpu")),
                                                       ("act", lib.ReLU(inplace=True))]))
                self.layers = lib.ModuleList([lib.Linear(4, 4) for _ in range(3)])
                self.layers.insert(1, lib.LayerNorm(4))
                del self.layers[0]
                self.layers[2] = lib.Linear(4, 2)
                self.layers.extend([lib.Identity()])
                self.heads = lib.ModuleDict({"x": lib.Linear(2, 1)})
                self.heads.update({"y": lib.Linear(2, 5)})
                self.register_buffer("keep", np.ones(2) if lib is nn else torch.ones(2, dtype=torch.float64))
                self.register_buffer("cache", np.zeros(2) if lib is nn else torch.zeros(2), persistent=False)
        return M()

    m, t = build(nn), build(torch.nn)
    assert list(m.state_dict(m.init(0))) == list(t.state_dict())
    assert len(m.heads) == 2 and list(m.heads) == ["x", "y"] and isinstance(m.layers[1:], nn.ModuleList)
    assert isinstance(m.seq[:1], nn.Sequential) and len(m.layers) == 4
    with pytest.raises(mica.MicaError, match=r"^cannot assign a ndarray as parameter 'weight' of Linear \(a "
                                             r"mica.nn.Parameter or None expected"):
        m.seq.fc.weight = np.zeros((4, 3))
    m.keep = np.array([2.0, 3.0])  # (still a buffer, as torch's)
    assert m.state_dict(m.init(0))["keep"].tolist() == [2.0, 3.0]
    assert nn.Parameter([1.0, 2.0]).dtype is mica.float32 and nn.Parameter(np.zeros(2)).dtype is mica.float32
    assert nn.Parameter(np.zeros(2, np.float16)).dtype is mica.float16
    from mica.backends.reference import round_bf16

    w = nn.Embedding(4, 6).bfloat16().init(0)["weight"]
    assert np.array_equal(w, round_bf16(w)) and len(np.unique(w)) > 12
    with pytest.raises(mica.MicaError, match=r"^Mica has no mica.nn.Bilinear \(torch.nn.Bilinear\)"):
        nn.Bilinear
    with pytest.raises(mica.MicaError, match=r"^Mica has no mica.optim.Rprop"):
        mica.optim.Rprop
    # torch.nn.init's fan-based initializers: the bounds and spreads torch computes
    lin = nn.Linear(30, 50)
    nn.init.xavier_uniform_(lin.weight)
    nn.init.trunc_normal_(lin.bias, std=0.5, a=-0.1, b=0.2)
    v = lin.init(3)
    assert np.abs(v["weight"]).max() <= math.sqrt(6 / 80) and np.abs(v["weight"]).max() > 0.9 * math.sqrt(6 / 80)
    assert v["bias"].min() >= -0.1 and v["bias"].max() <= 0.2
    nn.init.kaiming_normal_(lin.weight, nonlinearity="relu")
    assert abs(lin.init(3)["weight"].std() - math.sqrt(2 / 30)) < 0.02


def test_torch_model_files_port_with_their_own_idioms():
    """What ports of nanoGPT's, minGPT's and llama2.c's model files met: @torch.no_grad() on a
    method (now a context and decorator that detaches what it computes, as torch's), _init_weights'
    `p.data.normal_()`, configure_optimizers' `p.requires_grad`, named_buffers, zero_grad (groups of
    Parameter objects, load_state_dict: test_eager.py)."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)
            self.register_buffer("mask", mica.tril(mica.ones(3, 3)).view(1, 3, 3))
            self.apply(self._init_weights)

        def _init_weights(self, module):
            if isinstance(module, nn.Linear):
                module.weight.data.normal_(mean=0.0, std=0.02)
                module.bias.data.zero_()

        @mica.no_grad()
        def scale(self, x):
            return x * 2.0

    net = Net()
    v = net.init(0)
    assert abs(v["fc.weight"].std() - 0.02) < 0.01 and not v["fc.bias"].any()
    assert [n for n, p in net.named_parameters() if p.requires_grad] == ["fc.weight", "fc.bias"]
    assert [n for n, _ in net.named_buffers()] == ["mask"] and net.zero_grad() is None

    def f(m, x, w):
        y = x * w
        with m.no_grad():
            s = (y * 3.0).sum()
            with m.enable_grad():
                z = (y * 2.0).sum()
        return (y * s).sum() + z + net.scale(y).sum() if m is mica else (y * s).sum() + z + (y * 2.0).detach().sum()

    x, w = np.array([1.0, 2.0], np.float32), np.array([0.5, -1.0], np.float32)
    g = mica.compile(lambda x, w: mica.grad(f(mica, x, w), w), mica.f32[2], mica.f32[2])(x, w)
    tw = to_torch(w, requires_grad=True)
    assert np.array_equal(g, torch.autograd.grad(f(torch, to_torch(x), tw), tw)[0].numpy())
    with pytest.raises(mica.MicaError, match=r"^Net.load_state_dict: missing mask, fc.weight, fc.bias \(torch's keys"):
        net.load_state_dict({})


def test_a_modules_to_dtype_reads_its_float_buffers_in_that_type():
    """torch's Module.double() casts floating buffers as well as parameters: a float64 program read
    them as float32 literals (0.1 became 0.10000000149)."""
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", np.array([0.1]))
            self.w = nn.Parameter([1.0])

        def forward(self, x):
            return x * self.c * self.w

    m = Scaled().double()
    exe = mica.compile(lambda p, x: mica.nn.functional_call(m, p, x), m.param_specs(), mica.f64[1])
    assert exe(m.init(0), np.array([1.0])).tolist() == [0.1]


def test_functional_call_takes_torch_funcs_form_too():
    """torch.func.functional_call(model, params, (x, y), {"scale": s}) and params as a tuple of
    dicts, beside Mica's functional_call(model, params, x, y): the same values as torch's."""
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x, y, scale=1.0):
            return (self.lin(x) * y * scale).sum()

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(2).astype(np.float32)
    x, y, s = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32), 0.5
    m = Two()
    forms = (lambda p, x, y: nn.functional_call(m, p, x, y, scale=s),
             lambda p, x, y: nn.functional_call(m, p, (x, y), {"scale": s}),
             lambda p, x, y: nn.functional_call(m, ({"lin.weight": p["lin.weight"]}, {"lin.bias": p["lin.bias"]}),
                                                (x, y), scale=s))
    got = [float(mica.compile(f, m.param_specs(), mica.f32[4, 3], mica.f32[4, 2])(
        {"lin.weight": w, "lin.bias": b}, x, y)) for f in forms]

    class TorchTwo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)

        def forward(self, x, y, scale=1.0):
            return (self.lin(x) * y * scale).sum()

    want = torch.func.functional_call(TorchTwo(), {"lin.weight": torch.tensor(w), "lin.bias": torch.tensor(b)},
                                      (torch.tensor(x), torch.tensor(y)), {"scale": s}).item()
    assert got[0] == got[1] == got[2] and abs(got[0] - want) <= 1e-5 * abs(want), (got, want)


def test_an_attribute_set_to_none_then_to_a_parameter_or_module_is_torchs():
    """HF's masked-LM head: decoder = Linear(D, V, bias=False); decoder.bias = self.bias (a Parameter
    where the Linear had set None), and `self.proj = None` then a module: the forward reads what was
    assigned last and the tied bias gets torch's gradient (it was read as None, and trained nothing)."""
    import torch

    def head(lib):
        class Head(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = None
                self.proj = lib.nn.Linear(3, 3)
                self.decoder = lib.nn.Linear(3, 4, bias=False)
                self.bias = lib.nn.Parameter(lib.zeros(4))
                self.decoder.bias = self.bias
                self.register_parameter("unused", None)

            def forward(self, x):
                return self.decoder(self.proj(x).relu())
        return Head()

    tm, m = head(torch), head(mica)
    assert m.unused is None and type(m.proj).__name__ == "Linear"
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in tm.named_parameters()]
    rng = np.random.default_rng(3)
    with torch.no_grad():
        tm.bias.copy_(torch.tensor(rng.standard_normal(4)))
    m.load_state_dict(tm.state_dict())
    x = rng.standard_normal((5, 3)).astype(np.float32)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    (tm(torch.tensor(x)) * torch.tensor(w)).sum().backward()
    names = [n for n, _ in m.named_parameters()]
    params = {n: np.asarray(v) for n, v in m.state_dict().items() if n in names}
    grads = mica.compile(lambda p, x, w: mica.grad((nn.functional_call(m, p, x) * w).sum(), p),
                         m.param_specs(), mica.f32[5, 3], mica.f32[5, 4])(params, x, w)
    for n, p in tm.named_parameters():
        assert rel_err(grads[n], p.grad.numpy()) < 1e-5, n


def test_module_registry_and_containers_follow_torchs_semantics():
    """What an outside tester found differing from torch.nn, each against torch on the same calls:
    a replaced attribute keeps its place in the registry (state_dict's order: optimizer state loads
    by place), a Sequential's slice and item assignment keep the names, train() asks each child's
    own train(), a float loaded into an integer buffer keeps the type, half()/bfloat16()/double()
    round the values held, shared children and buffers listed once; and the methods torch code
    calls (recurse=False, prefix/keep_vars, named_children, get_submodule, pop, +, *, clear, del)."""
    import collections

    import torch

    def build(lib):
        class Frozen(lib.nn.Module):  # (a sub-network that stays in eval whatever its parent asks)
            def __init__(self):
                super().__init__()
                self.drop = lib.nn.Dropout(0.5)

            def train(self, mode=True):
                return super().train(False)

        class M(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = lib.nn.Linear(2, 3), lib.nn.Linear(3, 2)
                self.a = self.a
                self.b.weight = lib.nn.Parameter(lib.ones(2, 3))
                self.register_buffer("x", lib.arange(3))
                self.register_buffer("y", lib.ones(2))
                self.register_buffer("x", lib.arange(3))
                self.frozen = Frozen()
                self.shared = self.a
                self.seq = lib.nn.Sequential(collections.OrderedDict(fc1=lib.nn.Linear(2, 2), act=lib.nn.ReLU(),
                                                                     fc2=lib.nn.Linear(2, 2)))
                self.seq[0] = lib.nn.Linear(2, 2)
        return M()

    tm, m = build(torch), build(mica)
    assert list(m.state_dict()) == list(tm.state_dict())
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in tm.named_parameters()]
    assert [n for n, _ in m.named_buffers()] == [n for n, _ in tm.named_buffers()]
    assert [n for n, _ in m.named_children()] == [n for n, _ in tm.named_children()]
    assert len(list(m.children())) == len(list(tm.children())) and len(list(m.seq[1:].state_dict())) == 2
    assert list(m.seq[1:].state_dict()) == list(tm.seq[1:].state_dict())
    m.train(), tm.train()
    assert [x.training for x in m.modules()] == [x.training for x in tm.modules()]
    sd = {k: v.numpy() for k, v in tm.state_dict().items()}
    sd["x"] = np.array([1.7, 2.2, 3.9], np.float32)
    m.load_state_dict(sd), tm.load_state_dict({k: torch.tensor(v) for k, v in sd.items()})
    assert m.state_dict()["x"].tolist() == tm.state_dict()["x"].tolist() == [1, 2, 3]
    for cast in ("half", "bfloat16", "double"):
        getattr(m, cast)(), getattr(tm, cast)()
        for (k, v), tv in zip(m.state_dict().items(), tm.state_dict().values()):
            assert np.array_equal(np.asarray(v, np.float64), tv.double().numpy()), (cast, k)
    x64 = np.random.default_rng(4).standard_normal((3, 2))
    assert np.allclose(np.asarray(m.a(x64)), tm.a(torch.tensor(x64)).detach().numpy(), rtol=1e-12)  # (eager, float64)
    assert [n for n, _ in m.named_parameters(recurse=False)] == [] and \
        list(m.a.parameters(recurse=False))[0] is m.a.weight
    assert list(m.state_dict(prefix="model.")) == list(tm.state_dict(prefix="model."))
    assert m.state_dict(keep_vars=True)["a.weight"] is m.a.weight
    assert not mica.nn.Parameter(np.ones(2), requires_grad=False).requires_grad
    assert m.get_submodule("seq.fc2") is m.seq.fc2
    lst = mica.nn.ModuleList([mica.nn.Linear(1, 1) for _ in range(3)])
    popped = lst.pop(1)
    assert len(lst) == 2 and popped not in list(lst) and len(lst + lst) == 4 and len(m.seq * 2) == len(2 * m.seq) == 6
    d = mica.nn.ModuleDict({"p": mica.nn.Linear(1, 1)})
    d.clear()
    assert len(d) == 0
    del m.b
    assert "b.weight" not in m.state_dict() and not hasattr(m, "b")
    def blocks(lib):
        nn_ = lib.nn
        return nn_.ModuleList([nn_.Sequential(nn_.LayerNorm(4), nn_.Linear(4, 4), nn_.GELU(), nn_.Dropout(0.1))
                               for _ in range(3)] + [nn_.LayerNorm(4, bias=False), nn_.Embedding(5, 4)])

    assert repr(blocks(mica)) == repr(blocks(torch)) and "weight" in dir(mica.nn.Linear(1, 1))
    for bad, says in ((lambda: m.add_module("a.b", mica.nn.Linear(1, 1)), r"without '\.'"),
                      (lambda: m.add_module("z", 5), r"must be a mica.nn.Module or None"),
                      (lambda: m.register_buffer("shared", np.ones(1)), r"already has a submodule named 'shared'"),
                      (lambda: setattr(m, "y", 3), r"cannot assign a int as buffer 'y'"),
                      (lambda: m.register_forward_hook(print), r"^Mica has no nn.Module.register_forward_hook"),
                      (lambda: m.register_buffer("training", np.zeros(1)), r"already has an attribute 'training'")):
        with pytest.raises(mica.MicaError, match=says):
            bad()


def test_layer_sizes_must_be_whole_and_a_numpy_copy_of_a_parameter_stays_put():
    """nn.Linear(d, 4 * d * 2 / 3) (LLaMA's MLP width as a float) is refused as torch refuses it:
    int() truncated it into another model; np.array(p) and np.copy(p) are copies, which a
    compiled training step does not change (they followed it), np.asarray(p) the live values."""
    for make in (lambda: nn.Linear(8, 16 / 3), lambda: nn.Linear(8, 5.0), lambda: nn.Embedding(10.0, 4),
                 lambda: nn.Linear(-3, 4), lambda: nn.LayerNorm(4.5), lambda: nn.LayerNorm([4, True])):
        with pytest.raises(mica.MicaError, match=r"^a parameter's sizes must be whole numbers >= 0, got .*test_nn"):
            make()
    assert nn.Linear(np.int64(3), 2).weight.shape == (2, 3) and nn.LayerNorm(np.int32(4)).weight.shape == (4,)

    m = nn.Linear(4, 2)
    opt = mica.optim.SGD(m.parameters(), lr=0.5)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    before, copied = np.array(m.weight), np.copy(m.weight)
    kept = before.copy()

    @mica.compile
    def step(x):
        loss = m(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    step(x)
    assert np.array_equal(before, kept) and np.array_equal(copied, kept)
    assert not np.array_equal(np.asarray(m.weight), kept)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_pad_modes_and_padding_modules_are_torchs_with_gradients(mode):
    """F.pad's reflect, replicate and circular modes (style transfer's ReflectionPad2d, CycleGAN's
    ReplicationPad) were sentences; values are torch's bit for bit, gradients to float32 rounding."""
    import torch

    rng = np.random.default_rng(31)
    for shape, pad in [((2, 3, 6), (2, 1)), ((1, 2, 4, 5), (1, 2, 3, 0)), ((1, 2, 3, 4, 5), (1, 1, 2, 2, 1, 0))]:
        x = rng.standard_normal(shape).astype(np.float32)
        want = torch.nn.functional.pad(torch.tensor(x, requires_grad=True), pad, mode=mode)
        w = rng.standard_normal(tuple(want.shape)).astype(np.float32)
        got, grad = mica.compile(lambda x, w: (lambda y: (y, mica.grad((y * w).sum(), x)))(
            mica.nn.functional.pad(x, pad, mode=mode)))(mica.tensor(x), mica.tensor(w))
        np.testing.assert_array_equal(np.asarray(got), want.detach().numpy())
        tx = torch.tensor(x, requires_grad=True)
        (torch.nn.functional.pad(tx, pad, mode=mode) * torch.tensor(w)).sum().backward()
        np.testing.assert_allclose(np.asarray(grad), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(mica.nn.functional.pad(mica.tensor(x), pad, mode=mode)),
                                      want.detach().numpy())  # (eagerly too)
    name = {"reflect": "ReflectionPad", "replicate": "ReplicationPad", "circular": "CircularPad"}[mode]
    x = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    for module in (f"{name}2d", "ZeroPad2d", "ConstantPad2d"):
        args = (2,) if module != "ConstantPad2d" else ((1, 2, 0, 3), 1.5)
        ours, theirs = getattr(nn, module)(*args), getattr(torch.nn, module)(*args)
        assert repr(ours) == repr(theirs)
        np.testing.assert_array_equal(np.asarray(ours(mica.tensor(x))), theirs(torch.tensor(x)).numpy())
    if mode != "replicate":  # (torch's limits: reflect below the size, circular up to it)
        with pytest.raises(mica.MicaError, match=f"pad: {mode} padding of 6 on a dim of size 5 must be at most"):
            mica.nn.functional.pad(mica.tensor(x), (0, 0, 6, 0), mode=mode)


@pytest.mark.parametrize("affine,track", [(False, False), (True, False), (True, True)])
def test_instance_norm_is_torchs_in_training_and_evaluation(affine, track):
    import torch

    rng = np.random.default_rng(32)
    for cls, shape in (("InstanceNorm1d", (2, 3, 7)), ("InstanceNorm2d", (2, 3, 4, 5)), ("InstanceNorm1d", (3, 6))):
        x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
        theirs, ours = getattr(torch.nn, cls)(3, affine=affine, track_running_stats=track), \
            getattr(nn, cls)(3, affine=affine, track_running_stats=track)
        assert repr(ours) == repr(theirs)
        if affine:
            with torch.no_grad():
                theirs.weight.copy_(torch.tensor(rng.standard_normal(3).astype(np.float32)))
                theirs.bias.copy_(torch.tensor(rng.standard_normal(3).astype(np.float32)))
        ours.load_state_dict(theirs.state_dict())
        step = mica.compile(lambda x: ours(x))
        for mode in ("train", "train", "eval"):
            getattr(theirs, mode)(), getattr(ours, mode)()
            np.testing.assert_allclose(np.asarray(step(mica.tensor(x))), theirs(torch.tensor(x)).detach().numpy(),
                                       rtol=1e-5, atol=2e-6)
        for k, v in theirs.state_dict().items():  # (the running statistics training moved, as torch's)
            np.testing.assert_allclose(np.asarray(ours.state_dict()[k]), v.numpy(), rtol=1e-5, atol=1e-7, err_msg=k)


def test_pixel_shuffle_and_data_parallel_are_torchs():
    import torch

    x = np.random.default_rng(33).standard_normal((2, 8, 3, 5)).astype(np.float32)
    for ours, theirs in ((nn.PixelShuffle(2), torch.nn.PixelShuffle(2)), (nn.PixelUnshuffle(1), torch.nn.PixelUnshuffle(1))):
        assert repr(ours) == repr(theirs)
        np.testing.assert_array_equal(np.asarray(ours(mica.tensor(x))), theirs(torch.tensor(x)).numpy())
    y = np.random.default_rng(34).standard_normal((2, 3, 6, 4)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(mica.compile(lambda y: mica.nn.functional.pixel_unshuffle(y, 2))(y)),
                                  torch.nn.functional.pixel_unshuffle(torch.tensor(y), 2).numpy())
    with pytest.raises(mica.MicaError, match="pixel_shuffle: input must be"):
        mica.nn.functional.pixel_shuffle(mica.tensor(x), 3)
    model = nn.DataParallel(nn.Linear(5, 2))
    theirs = torch.nn.DataParallel(torch.nn.Linear(5, 2))
    assert list(model.state_dict()) == list(theirs.state_dict()) == ["module.weight", "module.bias"]
    model.load_state_dict(theirs.state_dict())
    np.testing.assert_allclose(np.asarray(model(mica.tensor(x[0, 0]))), theirs(torch.tensor(x[0, 0])).detach().numpy(),
                               rtol=1e-6)


_LOSSES = [
    ("margin_ranking_loss", lambda r, f, s: (f(6), f(6), s), dict(margin=0.3)),
    ("hinge_embedding_loss", lambda r, f, s: (f(6, 4), np.sign(f(6, 4))), dict(margin=0.7)),
    ("soft_margin_loss", lambda r, f, s: (f(6, 4), np.sign(f(6, 4))), {}),
    ("cosine_embedding_loss", lambda r, f, s: (f(6, 5), f(6, 5), s), dict(margin=0.2)),
    ("triplet_margin_loss", lambda r, f, s: (f(6, 5), f(6, 5), f(6, 5)), dict(margin=0.5)),
    ("triplet_margin_loss", lambda r, f, s: (f(6, 5), f(6, 5), f(6, 5)), dict(margin=0.5, p=1, swap=True)),
    ("gaussian_nll_loss", lambda r, f, s: (f(6, 4), f(6, 4), np.abs(f(6, 4)) + 1e-7), dict(full=True)),
    ("gaussian_nll_loss", lambda r, f, s: (f(6, 4), f(6, 4), np.abs(f(6))), {}),
    ("poisson_nll_loss", lambda r, f, s: (f(6, 4), r.integers(0, 4, (6, 4)).astype(np.float32)), dict(full=True)),
    ("poisson_nll_loss", lambda r, f, s: (np.abs(f(6, 4)), r.integers(0, 4, (6, 4)).astype(np.float32)),
     dict(log_input=False)),
    ("multilabel_soft_margin_loss", lambda r, f, s: (f(6, 4), (r.random((6, 4)) > 0.5).astype(np.float32)), {}),
    ("multi_margin_loss", lambda r, f, s: (f(6, 4), r.integers(0, 4, 6)), dict(p=2, margin=0.8)),
    ("multi_margin_loss", lambda r, f, s: (f(6, 4), r.integers(0, 4, 6)),
     dict(weight=np.array([0.5, 1.0, 2.0, 0.25], np.float32))),
]


@pytest.mark.parametrize("case", range(len(_LOSSES)), ids=[f"{c[0]}{i}" for i, c in enumerate(_LOSSES)])
def test_margin_embedding_and_likelihood_losses_are_torchs_with_gradients(case):
    import torch

    name, make, settings = _LOSSES[case]
    rng = np.random.default_rng(40 + case)
    args = make(rng, lambda *s: rng.standard_normal(s).astype(np.float32),
                np.where(rng.random(6) > 0.5, 1.0, -1.0).astype(np.float32))
    for reduction in ("mean", "sum", "none"):
        targs = [torch.tensor(a, requires_grad=i == 0) for i, a in enumerate(args)]
        tkw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in settings.items()}
        want = getattr(torch.nn.functional, name)(*targs, reduction=reduction, **tkw)
        w = rng.standard_normal(tuple(want.shape)).astype(np.float32)
        (want * torch.tensor(w)).sum().backward()
        mkw = {k: mica.tensor(v) if isinstance(v, np.ndarray) else v for k, v in settings.items()}

        def loss_and_grad(*a):
            out = getattr(mica.nn.functional, name)(*a, reduction=reduction, **mkw)
            return out, mica.grad((out * mica.tensor(w)).sum(), a[0])

        got, grad = mica.compile(loss_and_grad)(*[mica.tensor(a) for a in args])
        np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(grad), targs[0].grad.numpy(), rtol=1e-5, atol=1e-6)
    module = {"margin_ranking_loss": "MarginRankingLoss", "hinge_embedding_loss": "HingeEmbeddingLoss",
              "soft_margin_loss": "SoftMarginLoss", "cosine_embedding_loss": "CosineEmbeddingLoss",
              "triplet_margin_loss": "TripletMarginLoss", "gaussian_nll_loss": "GaussianNLLLoss",
              "poisson_nll_loss": "PoissonNLLLoss", "multilabel_soft_margin_loss": "MultiLabelSoftMarginLoss",
              "multi_margin_loss": "MultiMarginLoss"}[name]
    ours = getattr(nn, module)(**mkw)
    assert repr(ours) == repr(getattr(torch.nn, module)(**tkw)) == f"{module}()"
    np.testing.assert_allclose(np.asarray(ours(*[mica.tensor(a) for a in args])),
                               getattr(torch.nn, module)(**tkw)(*[torch.tensor(a) for a in args]).numpy(), rtol=1e-5)


@pytest.mark.parametrize("batch_first", [False, True])
def test_pad_sequence_is_torchs_eagerly_and_in_a_trace(batch_first):
    import torch

    from mica.nn.utils.rnn import pad_sequence

    rng = np.random.default_rng(50)
    seqs = [rng.standard_normal((n, 3)).astype(np.float32) for n in (2, 5, 1)]
    for side in ("right", "left"):
        want = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in seqs], batch_first=batch_first,
                                               padding_value=-1.0, padding_side=side).numpy()
        eager = pad_sequence([mica.tensor(s) for s in seqs], batch_first=batch_first, padding_value=-1.0,
                             padding_side=side)
        traced = mica.compile(lambda *x: pad_sequence(list(x), batch_first=batch_first, padding_value=-1.0,
                                                      padding_side=side))(*[mica.tensor(s) for s in seqs])
        np.testing.assert_array_equal(np.asarray(eager), want)
        np.testing.assert_array_equal(np.asarray(traced), want)
    with pytest.raises(mica.MicaError, match="pad_sequence takes tensors"):
        pad_sequence([mica.zeros(2, 3), mica.zeros(2, 4)])


def test_calculate_gain_eye_and_dirac_are_torchs():
    """super_resolution's `init.orthogonal_(w, init.calculate_gain('relu'))`."""
    import torch

    for nonlinearity, param in (("relu", None), ("leaky_relu", 0.2), ("leaky_relu", None), ("tanh", None),
                                ("selu", None), ("conv2d", None), ("sigmoid", None)):
        assert nn.init.calculate_gain(nonlinearity, param) == torch.nn.init.calculate_gain(nonlinearity, param)
    with pytest.raises(mica.MicaError, match="calculate_gain: unsupported nonlinearity 'swish'"):
        nn.init.calculate_gain("swish")
    w = nn.Parameter(mica.zeros(4, 3))
    nn.init.eye_(w)
    np.testing.assert_array_equal(np.asarray(w), torch.nn.init.eye_(torch.zeros(4, 3)).numpy())
    conv = nn.Conv2d(4, 6, 3, groups=2)
    nn.init.dirac_(conv.weight, 2)
    np.testing.assert_array_equal(np.asarray(conv.weight), torch.nn.init.dirac_(torch.zeros(6, 2, 3, 3), 2).numpy())
    x = np.random.default_rng(60).standard_normal((1, 3, 5)).astype(np.float32)
    same = nn.Conv1d(3, 3, 3, padding=1, bias=False)
    nn.init.dirac_(same.weight)
    np.testing.assert_allclose(np.asarray(same(mica.tensor(x))), x, rtol=1e-6)  # (dirac: the identity convolution)


@pytest.mark.parametrize("align_corners", [False, True])
def test_affine_grid_and_grid_sample_are_torchs_with_gradients(align_corners):
    """The spatial transformer tutorial's `F.grid_sample(x, F.affine_grid(theta, x.size()))`: values
    and the gradients reaching the image and theta, bilinear and nearest, zeros and border padding."""
    import torch

    rng = np.random.default_rng(61)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    theta = (np.eye(2, 3)[None] + 0.3 * rng.standard_normal((2, 2, 3))).astype(np.float32)
    size = (2, 3, 4, 7)
    np.testing.assert_allclose(
        np.asarray(mica.nn.functional.affine_grid(mica.tensor(theta), size, align_corners=align_corners)),
        torch.nn.functional.affine_grid(torch.tensor(theta), size, align_corners=align_corners).numpy(), atol=1e-6)
    for mode in ("bilinear", "nearest"):
        for padding in ("zeros", "border"):
            tx, tt = torch.tensor(x, requires_grad=True), torch.tensor(theta, requires_grad=True)
            grid = torch.nn.functional.affine_grid(tt, size, align_corners=align_corners)
            want = torch.nn.functional.grid_sample(tx, grid, mode=mode, padding_mode=padding, align_corners=align_corners)
            w = rng.standard_normal(tuple(want.shape)).astype(np.float32)
            (want * torch.tensor(w)).sum().backward()

            def f(x, th):
                g = mica.nn.functional.affine_grid(th, size, align_corners=align_corners)
                out = mica.nn.functional.grid_sample(x, g, mode=mode, padding_mode=padding,
                                                     align_corners=align_corners)
                loss = (out * mica.tensor(w)).sum()
                return out, mica.grad(loss, x), mica.grad(loss, th)

            out, gx, gt = mica.compile(f)(mica.tensor(x), mica.tensor(theta))
            np.testing.assert_allclose(np.asarray(out), want.detach().numpy(), atol=3e-6)
            np.testing.assert_allclose(np.asarray(gx), tx.grad.numpy(), atol=3e-6)
            np.testing.assert_allclose(np.asarray(gt), tt.grad.numpy(), rtol=1e-5, atol=2e-5)
    with pytest.raises(mica.MicaError, match="padding_mode 'reflection' is not one Mica has"):
        mica.nn.functional.grid_sample(mica.tensor(x), mica.zeros(2, 4, 7, 2), padding_mode="reflection")


_BAGS = [
    (np.array([[1, 4, 4, 0, 9], [3, 3, 8, 2, 7]]), None, {}),
    (np.array([5, 1, 4, 4, 0, 9, 3, 3, 8]), np.array([0, 2, 2, 6]), {}),  # (an empty bag: zeros)
    (np.array([5, 1, 4, 4, 0, 9, 3, 3, 8]), np.array([0, 3, 7, 9]), dict(include_last_offset=True)),
    (np.array([1, 2, 2, 4, 2, 0]), np.array([0, 3]), dict(padding_idx=2)),
    (np.array([[1, 2, 2], [2, 2, 2]]), None, dict(padding_idx=2)),  # (a bag of padding only: zeros)
]


@pytest.mark.parametrize("case", range(len(_BAGS)))
def test_embedding_bag_is_torchs_with_gradients(case):
    """The torchtext classification tutorial's `nn.EmbeddingBag(vocab, dim)(text, offsets)`."""
    import torch

    idx, offsets, settings = _BAGS[case]
    rng = np.random.default_rng(70 + case)
    weight = rng.standard_normal((10, 3)).astype(np.float32)
    for mode in ("sum", "mean", "max"):
        if mode == "max" and offsets is not None:
            continue
        scale = rng.standard_normal(idx.shape).astype(np.float32) if mode == "sum" else None
        tw = torch.tensor(weight, requires_grad=True)
        want = torch.nn.functional.embedding_bag(torch.tensor(idx), tw, None if offsets is None else torch.tensor(offsets),
                                                 mode=mode, per_sample_weights=None if scale is None else
                                                 torch.tensor(scale), **settings)
        g = rng.standard_normal(tuple(want.shape)).astype(np.float32)
        (want * torch.tensor(g)).sum().backward()

        def f(w, i, *o):
            out = mica.nn.functional.embedding_bag(i, w, o[0] if o else None, mode=mode, per_sample_weights=None
                                                   if scale is None else mica.tensor(scale), **settings)
            return out, mica.grad((out * mica.tensor(g)).sum(), w)

        args = [mica.tensor(weight), mica.tensor(idx)] + ([] if offsets is None else [mica.tensor(offsets)])
        out, grad = mica.compile(f)(*args)
        np.testing.assert_allclose(np.asarray(out), want.detach().numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(grad), tw.grad.numpy(), rtol=1e-6, atol=1e-6)
    bag = nn.EmbeddingBag(10, 3, mode="sum", **{k: v for k, v in settings.items() if k == "padding_idx"})
    assert repr(bag) == repr(torch.nn.EmbeddingBag(10, 3, mode="sum",
                                                   **{k: v for k, v in settings.items() if k == "padding_idx"}))
