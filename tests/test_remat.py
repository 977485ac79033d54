"""The rematerialization pass (passes/remat.py) and the memory budget (lower(..., memory_budget=)):
the rematerialized step is bitwise the step without it, on the CPU and on the oracle; it saves
fewer bytes than it did; a budget's plan is below it and monotone in it; an impossible budget is a
sentence naming the smallest plan."""
import copy

import numpy as np
import pytest

import mica
from helpers import rel_err
from mica.errors import MicaError
from mica.models.gpt import GPT, GPTConfig, loss_fn
from mica.models.tutorial import TutorialConfig, TutorialModel, make_step, specs as tutorial_specs


def _gpt(dropout, bias, n_layer=2):
    cfg = GPTConfig(block_size=16, vocab_size=29, n_layer=n_layer, n_head=2, n_embd=32, dropout=dropout, bias=bias)
    model = GPT(cfg)
    rng = np.random.default_rng(0)
    params = {n: (a + 0.05 * rng.standard_normal(a.shape)).astype(np.float32) for n, a in model.init(seed=3).items()}
    opt = mica.optim.adamw(lr=1e-3, betas=(0.9, 0.95),
                           param_groups=mica.optim.nanogpt_param_groups(params, weight_decay=0.1))

    def step(params, state, idx, targets):
        loss, grads = mica.value_and_grad(loss_fn(model))(params, idx, targets)
        norm = mica.optim.clip_grad_norm(grads, 1.0)
        new_params, new_state = opt.update(params, grads, state, lr=1e-3)
        return new_params, new_state, {"loss": loss, "norm": norm}

    B, T = 4, 16
    program = mica.trace(step, model.param_specs(), opt.state_specs(model.param_specs()), mica.i64[B, T],
                         mica.i64[B, T])
    args = (params, opt.init(params), rng.integers(0, 29, (B, T)), rng.integers(0, 29, (B, T)))
    return program, args


def _tutorial():
    model = TutorialModel(TutorialConfig(dim=8, hidden=32, batch=3, seq=5, vocab_size=7))
    step, opt = make_step(model)
    program = mica.trace(step, *tutorial_specs(model, opt))
    params = model.init(4)
    rng = np.random.default_rng(2)
    args = (params, opt.init(params), rng.integers(0, 7, (3, 5)), rng.integers(0, 7, (3, 5)))
    return program, args


PROGRAMS = {"gpt": lambda: _gpt(0.0, True), "gpt-dropout": lambda: _gpt(0.1, False), "tutorial": _tutorial}


def _bits(result):
    return [np.asarray(x).tobytes() for x in mica.pytree.flatten(result)[0]]


def _on_oracle(program, graph, args, **kw):
    """The oracle running `graph` (a lowered program's, rematerialized) in place of the traced one."""
    p = copy.copy(program)
    p.graph = graph
    return mica.reference.run(p, *args, **kw)


@pytest.fixture(scope="module", params=sorted(PROGRAMS))
def case(request):
    return (request.param, *PROGRAMS[request.param]())


def test_the_pass_recomputes_and_saves_fewer_bytes(case):
    name, program, _ = case
    on, off = program.lower("cpu"), program.lower("cpu", remat=False)
    assert on.remat.recomputed and not off.remat.recomputed
    # every forward value the backward read without the pass is still there, saved or recomputed
    assert on.plan.class_bytes["activations"] <= off.plan.class_bytes["activations"]
    assert "rematerialization (min-cut)" in on.memory_report
    assert any(n.op in ("layer_norm", "rms_norm") for n in on.remat.recomputed), name


@pytest.mark.parametrize("opt_level", [0, 2])
def test_rematerialized_step_is_bitwise_the_step_without_it(case, opt_level):
    name, program, args = case
    runs = {}
    for remat in (True, False):
        exe = program.lower("cpu", opt_level=opt_level, remat=remat).build()
        runs[remat] = _bits(exe(*args, threads=2, seed=5, offset=1))
    assert runs[True] == runs[False], name


def test_rematerialized_graph_matches_the_oracle(case):
    name, program, args = case
    lowered = program.lower("cpu")
    want = mica.reference.run(program, *args, seed=5, offset=1)
    got = _on_oracle(program, lowered.graph, args, seed=5, offset=1)
    assert _bits(got) == _bits(want), name  # the same float64 operations in the same order
    compiled = lowered.build()(*args, threads=2, seed=5, offset=1)
    assert rel_err(compiled[2]["loss"], want[2]["loss"]) < 1e-5, name
    flat_c, flat_w = mica.pytree.flatten(compiled)[0], mica.pytree.flatten(want)[0]
    for c, w in zip(flat_c, flat_w):  # (AdamW's first step divides by a tiny gradient's root)
        if np.asarray(w).dtype.kind == "f":
            assert rel_err(c, w) < 1e-3, name


def test_budget_plans_are_monotone_and_below_the_budget():
    program, _ = _gpt(0.0, False, n_layer=4)
    default = program.lower("cpu").plan.total
    smallest = None
    plans = []
    for frac in (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6):
        budget = int(default * frac)
        try:
            low = program.lower("cpu", memory_budget=budget)
        except MicaError as e:
            smallest = e
            break
        assert low.plan.total <= budget
        plans.append(low.plan.total)
    assert plans == sorted(plans, reverse=True) and len(plans) >= 3
    assert "checkpoint" in program.lower("cpu", memory_budget=plans[-1]).remat.mode
    if smallest is None:
        with pytest.raises(MicaError) as info:
            program.lower("cpu", memory_budget=1000)
        smallest = info.value
    msg = str(smallest)
    assert "is less than the smallest plan" in msg and "give at least" in msg and "\n" not in msg


def test_checkpointing_is_bitwise_and_the_report_counts_its_work():
    program, args = _gpt(0.1, True, n_layer=3)
    default = program.lower("cpu")
    tight = program.lower("cpu", memory_budget=int(default.plan.total * 0.9))
    assert tight.plan.total < default.plan.total
    assert any(n.op == "matmul" for n in tight.remat.recomputed)
    assert tight.remat.flops > default.remat.flops > 0
    assert "GFLOP more a step" in tight.memory_report and "memory budget" in tight.memory_report
    a = _bits(tight.build()(*args, threads=2, seed=9, offset=0))
    b = _bits(program.lower("cpu", remat=False).build()(*args, threads=2, seed=9, offset=0))
    assert a == b


@pytest.mark.parametrize("bad", [0, -5, 1.5, "lots", True])
def test_a_bad_budget_is_a_sentence(bad):
    program, _ = _gpt(0.0, False)
    with pytest.raises(MicaError, match="memory_budget must be a positive number of bytes"):
        program.lower("cpu", memory_budget=bad)
