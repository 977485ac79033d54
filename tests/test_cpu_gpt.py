"""The GPT training step compiled for the CPU: against the float64 oracle, bitwise deterministic
across thread counts and optimization levels, and in the arena its memory report promised."""
import numpy as np
import pytest

import mica
from helpers import rel_err
from mica.models.gpt import GPT, GPTConfig, loss_fn


def _setup(dropout=0.0, bias=True):
    cfg = GPTConfig(block_size=16, vocab_size=29, n_layer=2, n_head=2, n_embd=32, dropout=dropout, bias=bias)
    model = GPT(cfg)
    rng = np.random.default_rng(0)
    # random weights everywhere (not the init's zero biases), so no gradient sits at rounding level
    params = {n: (a + 0.05 * rng.standard_normal(a.shape)).astype(np.float32) for n, a in model.init(seed=3).items()}
    groups = mica.optim.nanogpt_param_groups(params, weight_decay=0.1)
    opt = mica.optim.adamw(lr=1e-3, betas=(0.9, 0.95), param_groups=groups)
    state = opt.init(params)
    sched = dict(learning_rate=1e-3, warmup_iters=2, lr_decay_iters=10, min_lr=1e-4)

    def step(params, state, idx, targets):
        loss, grads = mica.value_and_grad(loss_fn(model))(params, idx, targets)
        norm = mica.optim.clip_grad_norm(grads, 1.0)
        lr = mica.optim.cosine_with_warmup(state["step"], **sched)
        new_params, new_state = opt.update(params, grads, state, lr=lr)
        return new_params, new_state, {"loss": loss, "norm": norm, "grads": grads}

    B, T = 4, 16
    batch = rng.integers(0, 29, (B, T)), rng.integers(0, 29, (B, T))
    specs = (model.param_specs(), opt.state_specs(model.param_specs()), mica.i64[B, T], mica.i64[B, T])
    return step, specs, params, state, batch


@pytest.fixture(scope="module")
def gpt_step():
    step, specs, params, state, batch = _setup()
    program = mica.trace(step, *specs)
    return program, params, state, batch


@pytest.mark.parametrize("blas", ["openblas", "own"])
def test_training_step_matches_the_float64_oracle(gpt_step, blas):
    program, params, state, batch = gpt_step
    exe = program.lower("cpu", opt_level=2, blas=blas).build()
    new_params, new_state, m = exe(params, state, *batch, threads=2)
    want_params, want_state, want = mica.reference.run(program, params, state, *batch)
    assert rel_err(m["loss"], want["loss"]) < 1e-5
    assert rel_err(m["norm"], want["norm"]) < 1e-5
    for name in params:
        assert rel_err(m["grads"][name], want["grads"][name]) < 1e-4, name
        assert rel_err(new_params[name], want_params[name]) < 1e-4, name
        assert rel_err(new_state["exp_avg"][name], want_state["exp_avg"][name]) < 1e-4, name
    assert int(new_state["step"]) == 1


@pytest.mark.parametrize("blas", ["openblas", "own"])
def test_bitwise_identical_across_threads_and_opt_levels(gpt_step, blas):
    program, params, state, batch = gpt_step
    runs = []
    for opt_level in (0, 2):
        exe = program.lower("cpu", opt_level=opt_level, blas=blas).build()
        for threads in (1, 2, 4):
            p, s, m = exe(params, state, *batch, threads=threads)
            leaves = mica.pytree.flatten((p, s, m))[0]
            runs.append(((opt_level, threads), [np.asarray(x).tobytes() for x in leaves]))
    (first, ref), rest = runs[0], runs[1:]
    for key, leaves in rest:
        assert leaves == ref, f"{key} differs from {first}"


def test_arena_equals_the_memory_report(gpt_step):
    program = gpt_step[0]
    lowered = program.lower("cpu", opt_level=2)
    exe = lowered.build()
    assert exe.arena_bytes == lowered.plan.total
    report = exe.memory_report
    assert f"one arena of {lowered.plan.total:,} bytes" in report
    for cls in ("parameters", "optimizer state", "gradients", "activations", "workspace"):
        assert cls in report
    # parameters are updated in place: the new values live where the old ones did
    sched = lowered.schedule
    assert sum(1 for new, old in sched.updates if lowered.plan.root(new) is old and old.cls == "parameters") == len(gpt_step[1])
    assert lowered.plan.class_bytes["parameters"] == sum(a.nbytes for a in gpt_step[1].values())


def test_several_steps_stay_with_the_oracle_and_dropout_is_deterministic():
    step, specs, params, state, batch = _setup(dropout=0.1, bias=False)
    program = mica.trace(step, *specs)
    exe = program.lower("cpu").build()
    p, s = params, state
    rp, rs = params, state
    for i in range(3):
        p, s, m = exe(p, s, *batch, threads=2, seed=5, offset=i)
        rp, rs, rm = mica.reference.run(program, rp, rs, *batch, precision="float32", seed=5, offset=i)
        assert rel_err(m["loss"], rm["loss"]) < 1e-5
    again = exe(params, state, *batch, threads=1, seed=5, offset=0)[2]["loss"]
    first = exe(params, state, *batch, threads=2, seed=5, offset=0)[2]["loss"]
    assert again.tobytes() == first.tobytes()


def test_the_source_is_readable(gpt_step):
    source = gpt_step[0].lower("cpu").source
    assert "mica_layer_norm_f32" in source and "mica_attention_f32" in source and "mica_blas_sgemm" in source
    assert "(gpt.py:" in source          # the user's line beside each kernel
    assert "activations:" in source      # buffers named by class


def test_bad_token_ids_are_reported():
    step, specs, params, state, batch = _setup()
    exe = mica.compile(step, *specs, opt_level=2)
    idx = batch[0].copy()
    idx[1, 3] = 99
    with pytest.raises(mica.MicaError, match="index 99 is out of range for 29 embeddings"):
        exe(params, state, idx, batch[1])


def _mlp_program(gelu_on_input=False):
    def loss(w1, w2, x):
        h = x if gelu_on_input else x @ w1
        return (mica.gelu(h) @ w2).square().mean()

    def step(w1, w2, x):
        return mica.grad(loss(w1, w2, x), [w1, w2, x])

    return mica.trace(step, mica.f32[16, 32], mica.f32[32, 8], mica.f32[24, 16 if not gelu_on_input else 32])


def _kernel_names(lowered):
    return [k.name for k in lowered.schedule.kernels]


def test_gelu_slope_is_computed_beside_gelu_in_the_forward():
    """At opt_level 2 the slope joins gelu(x) on the forward product's tiles and the backward only
    multiplies; x's storage then dies in the forward, so the activations do not grow, and the bits
    equal opt_level 0's (which computes the slope in the backward from a kept x)."""
    program = _mlp_program()
    o2, o0 = program.lower("cpu", opt_level=2), program.lower("cpu", opt_level=0)
    names = _kernel_names(o2)
    assert "matmul + gelu, gelu_slope" in names
    assert not any("gelu_slope" in n for n in names[names.index("matmul + gelu, gelu_slope") + 1:])
    assert any(n == "gelu_slope" for n in _kernel_names(o0))
    assert o2.plan.class_bytes["activations"] <= o0.plan.class_bytes["activations"]
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s.shape).astype(np.float32) for s in program.inputs]
    a, b = o2.build()(*args, threads=2), o0.build()(*args, threads=1)
    for x, y in zip(a, b):
        assert x.tobytes() == y.tobytes()
    want = mica.reference.run(program, *args)
    for x, y in zip(a, want):
        assert rel_err(x, y) < 1e-5


def test_gelu_slope_of_an_input_stays_in_the_backward():
    """Moving the slope of a program input forward would keep the slope and the input both alive:
    it is not moved."""
    names = _kernel_names(_mlp_program(gelu_on_input=True).lower("cpu", opt_level=2))
    assert "gelu" in names and "matmul + gelu_slope, mul" in names
