"""torch.optim.swa_utils (mica/optim/swa_utils.py) against torch 2.13: the averaged copy's values
after each update (SWA's default average, the EMA forms, buffers averaged or followed), eagerly
bit for bit from the same model values, and inside a compiled step to float32 rounding; SWALR's
rates; update_bn's recomputed statistics."""
import numpy as np
import pytest

import mica

torch = pytest.importorskip("torch")

KINDS = ["swa", "ema multi", "ema avg_fn", "swa multi", "swa use_buffers", "ema use_buffers"]


def _net(lib):
    nn = lib.nn
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.BatchNorm1d(8), nn.Linear(8, 3))  # (a bias BN cannot cancel)


def _averaged(lib, model, kind):
    su = lib.optim.swa_utils
    buffers = kind.endswith("use_buffers")
    if kind.startswith("ema multi") or kind == "ema use_buffers":
        return su.AveragedModel(model, multi_avg_fn=su.get_ema_multi_avg_fn(0.9), use_buffers=buffers)
    if kind == "ema avg_fn":
        return su.AveragedModel(model, avg_fn=su.get_ema_avg_fn(0.75))
    if kind == "swa multi":
        return su.AveragedModel(model, multi_avg_fn=su.get_swa_multi_avg_fn())
    return su.AveragedModel(model, use_buffers=buffers)


def _values(rng, model):
    return {k: (rng.standard_normal(tuple(v.shape)).astype(np.float32) if v.dtype == torch.float32
                else np.array(rng.integers(0, 9), np.int64)) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind", KINDS)
def test_the_averaged_copy_holds_torchs_bits_after_each_update(kind):
    rng = np.random.default_rng(3)
    tm, mm = _net(torch), _net(mica)
    ta, ma = _averaged(torch, tm, kind), _averaged(mica, mm, kind)
    for _ in range(4):  # (the model's values change between updates, as training changes them)
        values = _values(rng, tm)
        tm.load_state_dict({k: torch.tensor(v) for k, v in values.items()})
        mm.load_state_dict({k: mica.tensor(v) for k, v in values.items()})
        ta.update_parameters(tm)
        ma.update_parameters(mm)
        want, got = ta.state_dict(), ma.state_dict()
        assert list(got) == list(want)
        for k in want:
            np.testing.assert_array_equal(np.asarray(got[k]), want[k].numpy(), err_msg=k)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    ta.eval(), ma.eval()
    with torch.no_grad():
        np.testing.assert_allclose(np.asarray(ma(mica.tensor(x))), ta(torch.tensor(x)).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("inside", [False, True])
def test_an_ema_updated_in_or_after_a_compiled_step_follows_torchs_loop(inside):
    """The EMA updated after each compiled step (torch's loop), or inside it (its parameters and
    n_averaged the step's state: the first update a copy, chosen by n_averaged), compiled once."""
    rng = np.random.default_rng(4)
    tm, mm = _net(torch), _net(mica)
    mm.load_state_dict({k: mica.tensor(v.numpy()) for k, v in tm.state_dict().items()})
    su_t, su_m = torch.optim.swa_utils, mica.optim.swa_utils
    ta = su_t.AveragedModel(tm, multi_avg_fn=su_t.get_ema_multi_avg_fn(0.8), use_buffers=True)
    ma = su_m.AveragedModel(mm, multi_avg_fn=su_m.get_ema_multi_avg_fn(0.8), use_buffers=True)
    topt, mopt = torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.9), mica.optim.SGD(mm.parameters(), lr=0.1, momentum=0.9)

    def train(x, y):
        loss = mica.nn.functional.cross_entropy(mm(x), y)
        mopt.zero_grad()
        loss.backward()
        mopt.step()
        return loss

    def train_and_average(x, y):
        loss = train(x, y)
        ma.update_parameters(mm)
        return loss

    step = mica.compile(train_and_average if inside else train)

    for _ in range(4):
        x, y = rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, 3, 6)
        loss = torch.nn.functional.cross_entropy(tm(torch.tensor(x)), torch.tensor(y))
        topt.zero_grad()
        loss.backward()
        topt.step()
        ta.update_parameters(tm)
        np.testing.assert_allclose(float(step(mica.tensor(x), mica.tensor(y))), float(loss), rtol=1e-5)
        if not inside:
            ma.update_parameters(mm)
        want, got = ta.state_dict(), ma.state_dict()
        for k in want:
            np.testing.assert_allclose(np.asarray(got[k]), want[k].numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    assert len({id(p) for p in step.built.values()}) == 1


@pytest.mark.parametrize("strategy,epochs", [("cos", 3), ("linear", 4), ("cos", 0)])
def test_swalr_anneals_to_the_swa_rate_as_torchs(strategy, epochs):
    rates = {}
    for lib in (torch, mica):
        opt = lib.optim.SGD([lib.nn.Parameter(lib.zeros(2))], lr=0.3)
        scheduler = lib.optim.swa_utils.SWALR(opt, swa_lr=0.02, anneal_epochs=epochs, anneal_strategy=strategy)
        rates[lib.__name__] = [opt.param_groups[0]["lr"]]
        for _ in range(6):
            if lib is torch:
                opt.step()  # (torch warns of a scheduler stepped first; Mica's optimizers step in a compiled step)
            scheduler.step()
            rates[lib.__name__].append(opt.param_groups[0]["lr"])
    np.testing.assert_allclose(rates["mica"], rates["torch"], rtol=1e-13)
    with pytest.raises(mica.MicaError, match="anneal_strategy must be 'cos' or 'linear'"):
        mica.optim.swa_utils.SWALR(mica.optim.SGD([mica.nn.Parameter(mica.zeros(2))], lr=0.1), 0.1,
                                   anneal_strategy="exp")


def test_update_bn_recomputes_the_running_statistics_over_a_loader_as_torchs():
    rng = np.random.default_rng(5)
    tm, mm = _net(torch), _net(mica)
    mm.load_state_dict({k: mica.tensor(v.numpy()) for k, v in tm.state_dict().items()})
    tm.eval(), mm.eval()
    batches = [rng.standard_normal((7, 4)).astype(np.float32) * 3 + 1 for _ in range(3)]
    torch.optim.swa_utils.update_bn([(torch.tensor(b), 0) for b in batches], tm)
    mica.optim.swa_utils.update_bn([(mica.tensor(b), 0) for b in batches], mm)
    assert not mm.training and mm[2].momentum == 0.1
    want, got = tm.state_dict(), mm.state_dict()
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), want[k].numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    assert int(np.asarray(got["2.num_batches_tracked"])) == 3


def test_a_timm_style_ema_through_state_dict_inside_the_step_is_torchs():
    """timm's ModelEmaV2 updates `ema_v.copy_(decay * ema_v + (1 - decay) * model_v)` over
    zip(ema.state_dict().values(), model.state_dict().values()); inside a compiled step state_dict()
    gave the initial values as constants, so the EMA never moved (silently). Its values are the
    step's live ones now, and the copy writes the EMA's parameters and buffers."""
    import copy

    rng = np.random.default_rng(8)
    tm, mm = _net(torch), _net(mica)
    mm.load_state_dict({k: mica.tensor(v.numpy()) for k, v in tm.state_dict().items()})
    tema, mema = copy.deepcopy(tm), copy.deepcopy(mm)
    topt, mopt = torch.optim.SGD(tm.parameters(), lr=0.1), mica.optim.SGD(mm.parameters(), lr=0.1)

    def update(lib, ema, model, decay=0.75):
        with lib.no_grad():
            for ema_v, model_v in zip(ema.state_dict().values(), model.state_dict().values()):
                ema_v.copy_(decay * ema_v + (1.0 - decay) * model_v)

    @mica.compile
    def step(x, y):
        loss = mica.nn.functional.cross_entropy(mm(x), y)
        mopt.zero_grad()
        loss.backward()
        mopt.step()
        update(mica, mema, mm)
        return loss

    for _ in range(3):
        x, y = rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, 3, 6)
        loss = torch.nn.functional.cross_entropy(tm(torch.tensor(x)), torch.tensor(y))
        topt.zero_grad()
        loss.backward()
        topt.step()
        update(torch, tema, tm)
        np.testing.assert_allclose(float(step(mica.tensor(x), mica.tensor(y))), float(loss), rtol=1e-5)
    for k, v in tema.state_dict().items():
        np.testing.assert_allclose(np.asarray(mema.state_dict()[k]), v.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    assert len({id(p) for p in step.built.values()}) == 1
