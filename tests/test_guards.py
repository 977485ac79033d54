"""mica.compile in torch.compile's form never runs a program made for Python values that have since
changed (guards.py): globals and closure variables the function reads, a module's mode, attributes,
buffers and Dropout p, another model of the same shape, an object argument's attributes. Each case
is an outside tester's, compared with the same code run eagerly (Mica's, and torch's)."""
import warnings

import numpy as np
import pytest
import torch

import mica
import mica.nn as mnn

SCALE = 2.0
ARRAY = np.ones(4, np.float32)
MODEL = None


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(fn(*args))


def test_globals_and_closure_variables_read_again_at_every_call():
    global SCALE, ARRAY

    @mica.compile
    def f(x):
        return x * SCALE + mica.as_tensor(ARRAY)

    x = np.arange(4, dtype=np.float32)
    seen = []
    for scale, array in ((2.0, np.ones(4, np.float32)), (3.0, None), (3.0, np.full(4, 10.0, np.float32)),
                         (3.0, "in place")):
        SCALE = scale
        if isinstance(array, np.ndarray):
            ARRAY = array
        elif array == "in place":
            ARRAY[:] = 7.0
        seen.append(_quiet(f, x))
        np.testing.assert_array_equal(seen[-1], (torch.from_numpy(x) * SCALE + torch.from_numpy(ARRAY)).numpy())

    def factory(s, items):
        def g(x):
            return x * s + len(items) * items[-1]
        return g

    items = [1.0]
    g = mica.compile(factory(2.0, items))
    np.testing.assert_array_equal(_quiet(g, x), x * 2 + 1)
    items.append(5.0)  # (a captured list grown between calls)
    np.testing.assert_array_equal(_quiet(g, x), x * 2 + 10)


def test_two_models_of_one_shape_and_a_rebound_global_model_are_each_their_own():
    global MODEL
    mica.manual_seed(0)
    a, b = mnn.Linear(4, 2), mnn.Linear(4, 2)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    forward = mica.compile(lambda model, v: model(v))
    np.testing.assert_allclose(_quiet(forward, a, x), np.asarray(a(x)), rtol=1e-6)
    np.testing.assert_allclose(_quiet(forward, b, x), np.asarray(b(x)), rtol=1e-6)

    opt = mica.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.1)

    @mica.compile
    def step(model, v):
        loss = model(v).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    before_a, before_b = np.asarray(a(x)).sum(), np.asarray(b(x)).sum()
    assert abs(float(_quiet(step, a, x)) - before_a) < 1e-5
    assert abs(float(_quiet(step, b, x)) - before_b) < 1e-5  # (it trained a instead: the same repr)
    assert abs(np.asarray(b(x)).sum() - before_b) > 1e-3 and abs(np.asarray(a(x)).sum() - before_a) > 1e-3

    MODEL = a
    g = mica.compile(lambda v: MODEL(v))
    np.testing.assert_allclose(_quiet(g, x), np.asarray(a(x)), rtol=1e-6)
    MODEL = b
    np.testing.assert_allclose(_quiet(g, x), np.asarray(b(x)), rtol=1e-6)


class _Shifted(mnn.Module):
    def __init__(self):
        super().__init__()
        self.fc = mnn.Linear(2, 1)
        self.register_buffer("shift", mica.zeros(2))
        self.scale = 1.0

    def forward(self, x):
        return self.fc(x + self.shift) * self.scale


@pytest.mark.parametrize("change", ["scale", "buffer assigned", "buffer filled"])
def test_a_modules_attribute_and_buffers_reach_a_compiled_step_as_torchs(change):
    """A torch-style step (backward, SGD): after the change, the loss is the eager module's; the
    parameters trained as torch's twin trains its own."""
    torch.manual_seed(0)
    m = _Shifted()
    tm = torch.nn.Linear(2, 1)
    m.fc.load_state_dict(tm.state_dict())
    opt, topt = mica.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(tm.parameters(), lr=0.1)

    @mica.compile
    def step(x):
        loss = m(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    x = np.ones((1, 2), np.float32)
    scale, shift = 1.0, np.zeros(2, np.float32)
    for i in range(5):
        if i == 3:
            if change == "scale":
                m.scale = scale = 3.0
            elif change == "buffer assigned":
                m.shift = mica.full((2,), 10.0)
                shift = np.full(2, 10.0, np.float32)
            else:
                m.shift.fill_(-10.0)
                shift = np.full(2, -10.0, np.float32)
        want = float(np.asarray(m(x)).sum())
        got = float(_quiet(step, x))
        tloss = (tm(torch.from_numpy(x + shift)) * scale).sum()
        topt.zero_grad()
        tloss.backward()
        topt.step()
        assert abs(got - want) < 1e-5 and abs(got - tloss.item()) < 1e-5, (i, got, want, tloss.item())
    np.testing.assert_allclose(np.asarray(m.fc.weight), tm.weight.detach().numpy(), rtol=1e-5)


def test_dropouts_mode_and_p_and_an_object_arguments_attributes_make_another_program():
    d = mnn.Dropout(0.5)
    f = mica.compile(lambda v: d(v))
    x = np.ones(4000, np.float32)
    zeros = lambda y: float(np.mean(np.asarray(y) == 0))  # noqa: E731
    assert 0.45 < zeros(_quiet(f, x)) < 0.55
    d.eval()
    np.testing.assert_array_equal(_quiet(f, x), x)
    d.train()
    d.p = 0.9
    out = _quiet(f, x)
    assert 0.87 < zeros(out) < 0.93 and abs(out.max() - 10.0) < 1e-5

    class Settings:
        def __init__(self, s):
            self.scale = s

    g = mica.compile(lambda v, cfg: v * cfg.scale)
    cfg = Settings(2.0)
    np.testing.assert_array_equal(_quiet(g, x[:3], cfg), x[:3] * 2)
    cfg.scale = 5.0
    np.testing.assert_array_equal(_quiet(g, x[:3], cfg), x[:3] * 5)


def test_recompiles_for_what_changes_outside_the_arguments_are_said_once_naming_it():
    global SCALE
    f = mica.compile(lambda v: v * SCALE)
    x = np.ones(2, np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in (1.0, 2.0, 3.0, 4.0):
            SCALE = s
            np.testing.assert_array_equal(np.asarray(f(x)), x * s)
    said = [str(w.message) for w in caught if "compiled a third time" in str(w.message)]
    assert len(said) == 1 and "(SCALE)" in said[0] and "besides its arguments" in said[0], said
    SCALE = 2.0


def test_a_linear_without_bias_prints_and_keys_a_call():
    m = mnn.Linear(4, 1, bias=False)
    assert repr(m) == "Linear(in_features=4, out_features=1, bias=False)"
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(_quiet(mica.compile(lambda model, v: model(v)), m, x), np.asarray(m(x)), rtol=1e-6)


class _Config:
    k = 2.0


def test_a_module_or_class_attribute_is_read_again_and_a_loops_name_is_not_read():
    """`Config.k` and `settings.SCALE` (a class's or module's attribute: their identity covers
    neither) trace again when changed; a global loop variable that shares its name with an attribute
    the step uses (`for step in ...` beside `opt.step()`) is not read by the step, so a loop compiles
    once (it compiled at every call); a module's class-level attribute read as self.k counts too."""
    import types

    settings = types.ModuleType("settings")
    settings.SCALE = 2.0
    globals()["settings"] = settings
    f = mica.compile(lambda v: v * settings.SCALE + _Config.k)
    x = np.ones(2, np.float32)
    np.testing.assert_array_equal(_quiet(f, x), x * 4)
    settings.SCALE, _Config.k = 5.0, 3.0
    np.testing.assert_array_equal(_quiet(f, x), x * 8)
    _Config.k = 2.0

    m = mnn.Linear(2, 1)
    opt = mica.optim.SGD(m.parameters(), lr=0.01)

    def train_step(v):
        loss = m(v).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    compiled = mica.compile(train_step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(6):  # noqa: B007  (the name the step's `opt.step()` shares)
            globals()["step"] = step
            compiled(np.ones((1, 2), np.float32))
    assert len(compiled.built) == 1 and not [w for w in caught if "compiled a third time" in str(w.message)]

    class Scaled(mnn.Module):
        k = 2.0

        def __init__(self):
            super().__init__()
            self.fc = mnn.Linear(2, 1)

        def forward(self, v):
            return self.fc(v) * self.k

    s = Scaled()
    g = mica.compile(lambda v: s(v))
    first = _quiet(g, x[None])
    Scaled.k = 4.0
    np.testing.assert_allclose(_quiet(g, x[None]), first * 2, rtol=1e-6)


class _Base(mnn.Module):
    @staticmethod
    def twice(v):
        return v * SCALE


def test_a_second_attack_on_the_guards_finds_no_stale_value_no_endless_retrace_and_no_crash():
    """From an outside attack: a global read in a base class's static method, a slots object's
    attribute, a callable object compiled, a global read seven functions deep and a maximize set in a
    group are each seen; a traced tensor the forward keeps (`self.last = y`) traces once more, not at
    every call; a buffer written in place is seen by its write count, not read whole; torch tensors
    numpy cannot hold (sparse, float8, conjugate views) never stop a call; the warning names the
    global that changed, not super()'s __class__."""
    global SCALE
    SCALE = 2.0
    x = np.ones(2, np.float32)

    class Net(_Base):
        def forward(self, v):
            return self.twice(v)

    net = Net()
    f = mica.compile(lambda v: net(v))
    np.testing.assert_array_equal(_quiet(f, x), x * 2)
    SCALE = 3.0
    np.testing.assert_array_equal(_quiet(f, x), x * 3)

    class Slotted:
        __slots__ = ("k",)

        def __init__(self):
            self.k = 2.0

    cfg = Slotted()
    g = mica.compile(lambda v: v * cfg.k)
    _quiet(g, x)
    cfg.k = 5.0
    np.testing.assert_array_equal(_quiet(g, x), x * 5)

    class Times:
        def __init__(self):
            self.k = 2.0

        def __call__(self, v):
            return v * self.k

    times = Times()
    h = mica.compile(times)
    _quiet(h, x)
    times.k = 4.0
    np.testing.assert_array_equal(_quiet(h, x), x * 4)

    table = [1.0]

    def d1(v): return v * table[0]  # noqa: E704
    def d2(v): return d1(v)  # noqa: E704
    def d3(v): return d2(v)  # noqa: E704
    def d4(v): return d3(v)  # noqa: E704
    def d5(v): return d4(v)  # noqa: E704
    def d6(v): return d5(v)  # noqa: E704
    def d7(v): return d6(v)  # noqa: E704

    deep = mica.compile(d7)
    _quiet(deep, x)
    table[0] = 3.0
    np.testing.assert_array_equal(_quiet(deep, x), x * 3)

    class Keep(mnn.Module):
        def __init__(self):
            super().__init__()
            self.lin = mnn.Linear(2, 2)
            self.register_buffer("mask", mica.ones(2))

        def forward(self, v):
            y = self.lin(v) * self.mask
            self.last = y
            return y

    keep = Keep()
    k = mica.compile(lambda v: keep(v))
    for _ in range(5):
        _quiet(k, x[None])
    assert len(k.built) <= 2
    keep.mask[0] = 0.0  # (through the host tensor's own write: counted)
    out = _quiet(k, x[None])
    assert out[0, 0] == 0.0 and out[0, 1] != 0.0

    for weird in (torch.eye(3).to_sparse(), torch.zeros(3, dtype=torch.float8_e4m3fn),
                  torch.polar(torch.ones(3), torch.arange(3.0)).conj()):
        holder = [weird]
        w = mica.compile(lambda v: v * 2 if holder[0] is not None else v)
        np.testing.assert_array_equal(_quiet(w, x), x * 2)

    model = Net()
    s = mica.compile(lambda v: model(v) * SCALE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for value in (1.0, 2.0, 3.0):
            SCALE = value
            s(x)
    said = [str(c.message) for c in caught if "compiled a third time" in str(c.message)]
    assert said and "(SCALE)" in said[0], said
    SCALE = 2.0

    lin = mnn.Linear(2, 1)
    opt = mica.optim.AdamW(lin.parameters(), lr=0.1)

    @mica.compile
    def step(v):
        loss = lin(v).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    step(x[None])
    opt.param_groups[0]["maximize"] = True
    with pytest.raises(mica.MicaError, match=r"^AdamW: a param group sets maximize=True"):
        step(x[None])


def test_a_large_buffer_and_a_large_torch_tensor_compile_once_and_a_write_is_seen():
    """A 36 MB buffer is known by its writes (it was read whole, and past 16 MiB by a temporary
    view's identity, a new program at every call); a 20 MB torch tensor by its own identity. (The
    forward reads a small buffer: a large one read would be a 36 MB constant of the program.)"""
    big = torch.zeros(5_000_000)

    class Masked(mnn.Module):
        def __init__(self):
            super().__init__()
            self.lin = mnn.Linear(2, 2)
            self.register_buffer("table", mica.ones(3000, 3000))
            self.register_buffer("gain", mica.ones(2))

        def forward(self, v):
            return self.lin(v) * self.gain

    m = Masked()
    f = mica.compile(lambda v: m(v) + float(big.shape[0] > 0))
    x = np.ones((1, 2), np.float32)
    for _ in range(4):
        _quiet(f, x)
    assert len(f.built) == 1
    m.table[0, 0] = 3.0  # (a write into the large one: counted, so traced again)
    m.gain[0] = 3.0
    np.testing.assert_allclose(_quiet(f, x), np.asarray(m(x)) + 1, rtol=1e-6)
    assert len(f.built) == 2


def test_a_function_that_trains_nothing_runs_its_python_once_a_trace_and_a_step_twice():
    """A function reading no Parameter is lowered from the trace that looked for them: its
    Python's side effects happen once per program (a training step: once to find, once as the step)."""
    runs = []

    @mica.compile
    def f(x, y=None):
        runs.append(1)  # (a container the function appends to: read by the guards, and known by its length)
        return x * 2 + (0 if y is None else y)

    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(_quiet(f, x), x * 2)
    assert len(runs) == 1
    assert "= input x " in f.ir  # (the program's inputs keep the function's names)
    np.testing.assert_array_equal(_quiet(lambda a: f(a, y=a), x), x * 3)
    assert len(runs) == 2

    model = mnn.Linear(4, 2)
    opt = mica.optim.SGD(model.parameters(), lr=0.1)
    steps = []

    @mica.compile
    def step(x):
        steps.append(1)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for _ in range(3):
        _quiet(step, x)
    assert len(steps) == 2

    @mica.compile
    def nothing(x):
        loss = (x * 2).sum()
        loss.backward()
        return loss

    with pytest.raises(mica.MicaError, match="nothing"):
        nothing(x)


@pytest.mark.parametrize("source", ["generator", "global", "python", "argument"])
def test_numbers_drawn_from_numpys_or_pythons_random_while_traced_are_said_to_be_constants(source):
    import random

    g = np.random.default_rng(5)

    def draw(gen):
        if source == "generator":
            return g.standard_normal(3)
        if source == "global":
            return np.random.rand(3)
        if source == "python":
            return np.full(3, random.random())
        return gen.random(3)

    @mica.compile
    def f(x, gen):
        return x + mica.tensor(draw(gen).astype(np.float32))

    x = np.arange(3, dtype=np.float32)
    gen = np.random.RandomState(1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first, second = np.asarray(f(x, gen)), np.asarray(f(x, gen))
    said = [str(w.message) for w in seen if "drew from" in str(w.message)]
    assert len(said) == 1 and "constants of its program" in said[0], said
    np.testing.assert_array_equal(first, second)  # (what the warning says: the same numbers at every call)
    assert not np.array_equal(first, x)

    @mica.compile
    def plain(x):
        return x * 2

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(np.asarray(plain(x)), x * 2)


def test_a_trainer_objects_attributes_the_step_never_reads_compile_nothing_and_one_it_reads_does():
    """minGPT's Trainer: the compiled step reads self.model and self.optimizer, and the loop sets
    self.loss and self.iter_num (and appends to a global list through a callback) at every call.
    Those attributes made a program per call (the warning named `self`); the guards now read what
    the traced code reads, as torch.compile's. An attribute the step does read still traces again."""
    import warnings

    rng = np.random.default_rng(12)
    times = []

    class Trainer:
        def __init__(self):
            self.model = mica.nn.Linear(4, 1)
            self.optimizer = mica.optim.SGD(self.model.parameters(), lr=0.1)
            self.scale, self.iter_num, self.loss = 1.0, 0, None
            self.callbacks = [lambda t: times.append(t.iter_num)]

        def run(self, batches):
            def step(x, y):
                loss = ((self.model(x) - y) ** 2).mean() * self.scale
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                return loss

            step = mica.compile(step)
            out = []
            for x, y in batches:
                self.loss = step(x, y)
                self.iter_num += 1
                for cb in self.callbacks:
                    cb(self)
                out.append(float(self.loss))
            return step, out

    batches = [(rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 1)).astype(np.float32))
               for _ in range(5)]
    t = Trainer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step, losses = t.run(batches)
    assert len({id(b) for b in step.built.values()}) == 1 and times == [1, 2, 3, 4, 5]
    assert not [w for w in caught if "compiled a third time" in str(w.message)]
    t.scale = 2.0  # (read by the step: its new value is another program's constant)
    step2, losses2 = t.run(batches[:1])
    x, y = batches[0]
    assert len(losses2) == 1 and np.isfinite(losses2[0])
    t.scale = 3.0
    before = (np.asarray(t.model.weight).copy(), np.asarray(t.model.bias).copy())
    got = float(step2(x, y))
    want = float(((x @ before[0].T + before[1] - y) ** 2).mean() * 3.0)
    assert got == pytest.approx(want, rel=1e-5) and len({id(b) for b in step2.built.values()}) == 2


@pytest.mark.parametrize("how", ["getattr", "getattr by a name", "vars", "__dict__", "hasattr", "module getattr"])
def test_an_attribute_read_by_a_name_in_a_string_is_still_guarded(how):
    """From an attack on the narrowed guards: getattr(self, "c"), vars(self)["c"], self.__dict__
    and hasattr read attributes the bytecode does not name, and a change of them kept the old
    program (a stale constant); where the user's code reads that way nothing is narrowed."""
    class Plain:
        def __init__(self):
            self.c = 1.0

    class Mod(mica.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = 1.0

    t = Mod() if how == "module getattr" else Plain()
    name = "c"

    def read(x):
        if how in ("getattr", "module getattr"):
            s = getattr(t, "c")
        elif how == "getattr by a name":
            s = getattr(t, name)
        elif how == "vars":
            s = vars(t)["c"]
        elif how == "__dict__":
            s = t.__dict__["c"]
        else:
            s = 2.0 if hasattr(t, "zz") else 1.0
        return x * s

    f = mica.compile(read)
    x = np.ones(2, np.float32)
    assert float(f(x)[0]) == 1.0
    t.c, t.zz = 5.0, 5.0
    assert float(f(x)[0]) == (2.0 if how == "hasattr" else 5.0)


def test_a_modules_parameter_updated_in_place_by_name_in_a_step_stays_its_parameter():
    """`with no_grad(): m.w -= lr * m.w.grad` in a compiled step said 'cannot assign a Tensor as
    parameter'; torch's is in place, as Mica's `for p in m.parameters(): p -= ...` was."""
    import torch

    class M:
        def __init__(self, lib):
            base = lib.nn.Module

            class Inner(base):
                def __init__(self):
                    super().__init__()
                    self.w = lib.nn.Parameter(lib.tensor(np.array([0.5, -1.0, 2.0], np.float32)))

                def forward(self, x):
                    return (x * self.w).sum()
            self.m = Inner()

    def run(lib, compiled):
        m = M(lib).m

        def step(x):
            loss = m(x) ** 2
            m.zero_grad()
            loss.backward()
            with lib.no_grad():
                m.w -= 0.1 * m.w.grad
            return loss

        step = compiled(step) if compiled else step
        x = lib.tensor(np.array([1.0, 2.0, 3.0], np.float32))
        return [float(step(x)) for _ in range(3)], np.asarray(m.w.detach() if lib is torch else m.w)

    (got, w), (want, tw) = run(mica, mica.compile), run(torch, None)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(w, tw, rtol=1e-6)


def test_a_deque_and_other_containers_without_attributes_are_read_by_their_items():
    """The DQN tutorial's replay memory is a deque (`if len(memory) < BATCH_SIZE: return` in the
    step): a deque, a ChainMap and a mappingproxy had no attributes for the guards to read, so a
    compiled step never saw them change and kept its first program (no training, silently)."""
    import collections
    import types

    class Memory:
        def __init__(self):
            self.memory = collections.deque([], maxlen=50)

        def __len__(self):
            return len(self.memory)

    memory, plain = Memory(), collections.deque()
    settings = {"scale": 1.0}
    chained, proxy = collections.ChainMap({}, settings), types.MappingProxyType(settings)

    def make(read):
        return mica.compile(lambda x: x * read())

    cases = [(make(lambda: len(memory)), lambda i: memory.memory.append(i), lambda i: i + 1),
             (make(lambda: len(plain)), lambda i: plain.append(i), lambda i: i + 1),
             (make(lambda: chained["scale"]), lambda i: settings.update(scale=i * 2.0), lambda i: i * 2.0),
             (make(lambda: proxy["scale"]), lambda i: settings.update(scale=i * 3.0), lambda i: i * 3.0)]
    x = np.ones(2, np.float32)
    for f, change, want in cases:
        for i in range(3):
            change(i)
            np.testing.assert_array_equal(_quiet(f, x), x * want(i))


def test_a_third_shape_of_the_arguments_is_said_once():
    """Every sequence length compiles a program of its own (the char-RNN tutorial's names): the third
    shape says so once, naming the shapes, and what to do."""
    f = mica.compile(lambda x: x * 2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for n in (3, 4, 3, 5, 6, 7):
            np.testing.assert_array_equal(np.asarray(f(np.ones(n, np.float32))), np.full(n, 2.0))
    said = [str(w.message) for w in seen if "new shapes" in str(w.message)]
    assert len(said) == 1 and "([3], [4], [5])" in said[0] and "pad or cut inputs to a few fixed lengths" in said[0]
