"""`mica train` prints the trainer's exact memory plan before the first step: every class of the
train and eval arenas, as the compiled programs plan them and as the C allocates them."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import mica
from mica.data.prepare import prepare_char
from mica.train import config as config_mod
from mica.train import memory_plan, native, programs

SHAKESPEARE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tinyshakespeare.txt")

TINY = ["--device=cpu", "--compile=False", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32",
        "--batch_size=4", "--gradient_accumulation_steps=2", "--eval_iters=2", "--log_interval=1", "--max_iters=2",
        "--eval_interval=100", "--always_save_checkpoint=False", "--dropout=0.0"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny `mica train` as a user runs it, and the same config's programs lowered here."""
    d = tmp_path_factory.mktemp("plan")
    vocab = prepare_char(open(SHAKESPEARE).read()[:100_000], str(d / "data" / "shakespeare_char"),
                         log=lambda *a: None)["vocab_size"]
    r = subprocess.run([sys.executable, "-m", "mica.cli", "train", "shakespeare_char", *TINY, "--out_dir=o"], cwd=d,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = config_mod.check_supported(config_mod.load("shakespeare_char", TINY), lambda *a: None)  # as mica train
    model, _, progs = programs.build(cfg, vocab)
    lowered = {n: progs[n].lower("cpu", opt_level=cfg["opt_level"]) for n in native.PROGRAMS}
    return r.stdout, lowered, model, vocab


def _printed(stdout):
    """{arena: {class: bytes}} and the total, read back from the printed plan."""
    total = int(re.search(r"the trainer holds ([\d,]+) bytes", stdout).group(1).replace(",", ""))
    arenas, current = {}, None
    for line in stdout.splitlines():
        m = re.match(r"  (\w+) arena +([\d,]+) bytes", line)
        if m:
            current = arenas.setdefault(m.group(1), {"size": int(m.group(2).replace(",", ""))})
            continue
        m = re.match(r"    (parameters|gradients|optimizer state|activations|io|workspace) +([\d,]+)", line)
        if m and current is not None:
            current[m.group(1)] = int(m.group(2).replace(",", ""))
    return arenas, total


def test_the_plan_is_printed_before_the_first_step(run):
    stdout = run[0]
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("memory plan (exact, before the first step)"))
    first_step = next(i for i, line in enumerate(lines) if line.startswith(("step 0:", "iter 0:")))
    assert at < first_step
    arenas, _ = _printed(stdout)
    assert list(arenas) == ["train", "eval"]  # the logits arena is sampling's
    assert list(arenas["train"])[1:] == ["parameters", "gradients", "optimizer state", "activations", "io",
                                         "workspace"]


def test_the_printed_classes_sum_to_the_arenas_the_trainer_allocates(run):
    stdout, lowered, model, _ = run
    arenas, total = _printed(stdout)
    for name, classes in arenas.items():
        size = classes.pop("size")
        plan = lowered[name].plan
        # every class as the Lowered plan has it (the eval arena prints only its non-empty ones)
        assert classes == {c: b for c, b in plan.class_bytes.items() if b or name == "train"}
        assert sum(classes.values()) == size == plan.total
        # the C the trainer is built from allocates exactly this
        assert f"#define MICA_ARENA_BYTES {size}LL" in lowered[name].source
    # one allocation: the eval arena lies past the train arena's state (parameters, optimizer state)
    offset = memory_plan.eval_offset(lowered["train"])
    state = lowered["train"].plan.class_bytes
    assert offset == (state["parameters"] + state["optimizer state"] + 4095) // 4096 * 4096
    assert total == max(lowered["train"].plan.total, offset + lowered["eval"].plan.total) == \
        memory_plan.trainer_bytes(lowered)
    assert f"at offset {offset:,}" in stdout
    assert "gradients                       0   each placed among the activations, by its lifetime" in stdout


def test_the_classes_are_the_models_state(run):
    _, lowered, model, _ = run
    plan = memory_plan.trainer_plan(lowered)
    tensors = [np.prod(p.shape) * 4 for _, p in model.named_parameters()]  # float32
    aligned = sum((n + 63) // 64 * 64 for n in tensors)
    train = plan["train"]
    assert train["parameters"] == aligned
    prog = lowered["train"].program
    state = [v.spec.nbytes for n, v in zip(prog.input_names, prog.graph.inputs) if n.startswith("opt_state[")]
    assert train["optimizer state"] == sum((n + 63) // 64 * 64 for n in state)
    assert train["optimizer state"] >= 2 * aligned  # AdamW's two moments per parameter
    # the gradients are placed by lifetime among the activations (no region of their own);
    # clipping reads every gradient before the update writes any parameter: all are live at once
    plan_ = lowered["train"].plan
    grads = [b for b in plan_.schedule.buffers if b.cls == "gradients" and b.id not in plan_.aliases]
    assert train["gradients"] == 0 and sum(b.nbytes for b in grads) >= sum(tensors)
    assert all(plan_.placed_in[b.id] == "activations" for b in grads)
    act, end = plan_.class_offsets["activations"], plan_.class_offsets["activations"] + train["activations"]
    assert all(act <= plan_.offset(b) and plan_.offset(b) + b.nbytes <= end for b in grads)
    assert train["activations"] >= aligned and train["workspace"] > 0
    assert "more placed among the activations, by lifetime" in plan_.report()
    assert plan["eval"]["parameters"] == 0 and plan["eval"]["io"] >= aligned  # its own copy, as an input


def _lm_step(vocab=97):
    """A GPT step whose head is wide enough that the logits are the largest activation."""
    import mica
    from mica.models.gpt import GPT, GPTConfig, loss_fn

    model = GPT(GPTConfig(block_size=16, vocab_size=vocab, n_layer=1, n_head=2, n_embd=16, dropout=0.0, bias=True))
    rng = np.random.default_rng(4)
    params = {n: (a + 0.05 * rng.standard_normal(a.shape)).astype(np.float32) for n, a in model.init(seed=1).items()}

    def step(params, idx, targets):
        return mica.value_and_grad(loss_fn(model))(params, idx, targets)

    program = mica.trace(step, model.param_specs(), mica.i64[4, 16], mica.i64[4, 16])
    targets = rng.integers(0, vocab, (4, 16))
    targets[0, :3] = -1  # nanoGPT's ignore_index: rows with no gradient
    return program, (params, rng.integers(0, vocab, (4, 16)), targets)


@pytest.mark.parametrize("target", ["cpu", "cuda-sim"])
def test_the_logits_gradient_is_written_over_the_logits(monkeypatch, target):
    """cross_entropy_backward's record lets its gradient take the logits' memory (they die there):
    the plan holds one logits-sized buffer at that point, not two, and the step's bits do not
    change (the kernel reads each row's target logit before it writes the row)."""
    import shutil

    import mica
    from mica.ops import OPS

    if target == "cuda-sim" and shutil.which("g++") is None:
        pytest.skip("the CUDA simulator needs g++")
    name, opts = ("cpu", {}) if target == "cpu" else ("cuda", {"simulate": True})
    program, args = _lm_step()

    def ce_backward(lowered):
        return next(k for k in lowered.schedule.kernels if getattr(k, "op", None) == "cross_entropy_backward")

    lowered = program.lower(name, **opts)
    call = ce_backward(lowered)
    assert lowered.plan.root(call.outputs[0].src) is lowered.plan.root(call.inputs[1].src)
    got = lowered.build()(*args)
    monkeypatch.setattr(OPS["cross_entropy_backward"].kernel, "inplace", ())
    apart = program.lower(name, **opts)
    call = ce_backward(apart)
    assert apart.plan.root(call.outputs[0].src) is not apart.plan.root(call.inputs[1].src)
    assert apart.plan.class_bytes["activations"] > lowered.plan.class_bytes["activations"]
    want = apart.build()(*args)
    flat_g, flat_w = mica.pytree.flatten(got)[0], mica.pytree.flatten(want)[0]
    assert [np.asarray(a).tobytes() for a in flat_g] == [np.asarray(a).tobytes() for a in flat_w]
    oracle = mica.reference.run(program, *args)
    assert abs(float(got[0]) - float(oracle[0])) < 1e-5 * abs(float(oracle[0]))


@pytest.mark.parametrize("seed", range(4))
def test_first_fit_placement_is_the_plain_loops_and_never_overlaps_live_buffers(seed):
    """The planner's first fit (over arrays, for plans of tens of thousands of buffers) against the
    plain loop it replaced, on random sizes and lifetimes (ties in size and equal clashes included);
    and no two buffers alive at once share a byte."""
    from types import SimpleNamespace

    from mica.passes.memory import _place

    rng = np.random.default_rng(seed)
    n = 300
    bufs = [SimpleNamespace(id=i, nbytes=int(rng.choice([0, 1, 64, 100, 4096, int(rng.integers(1, 50000))])))
            for i in range(n)]
    first = {b.id: int(rng.integers(0, 200)) for b in bufs}
    last = {b.id: first[b.id] + int(rng.choice([0, 1, int(rng.integers(0, 80))])) for b in bufs}

    def align(x):
        return (x + 63) // 64 * 64

    placed, want, size = [], {}, 0
    for b in sorted(bufs, key=lambda b: (-b.nbytes, b.id)):
        clashes = sorted((want[p.id], want[p.id] + align(p.nbytes)) for p in placed
                         if not (last[p.id] < first[b.id] or first[p.id] > last[b.id]))
        off = 0
        for start, stop in clashes:
            if off + align(b.nbytes) <= start:
                break
            off = max(off, stop)
        want[b.id] = off
        size = max(size, off + align(b.nbytes))
        placed.append(b)
    got, got_size = _place(bufs, first, last, align)
    assert got == want and got_size == size
    for a in bufs:
        for b in bufs:
            if a.id < b.id and a.nbytes and b.nbytes and not (last[a.id] < first[b.id] or first[a.id] > last[b.id]):
                assert got[a.id] + a.nbytes <= got[b.id] or got[b.id] + b.nbytes <= got[a.id], (a.id, b.id)


def test_a_value_of_another_type_is_never_written_over_a_dying_one():
    """An elementwise loop may write its output over an activation that dies in it, of the same size
    and type only: nll_loss's int64 targets (t - 1) cast to float64 over themselves were stored as
    integers through the kernel's one int64 pointer and read back as float64 denormals (a mean of
    -inf). Every opt level gives the oracle's value and gradient."""
    F = mica.nn.functional

    def f(x, t, u):
        out = F.nll_loss(x, t - 1, ignore_index=-1)
        return out, mica.grad(out, [x], grad_output=u)

    program = mica.trace(f, mica.f64[8, 4], mica.i64[8], mica.f64[()])
    x, t, u = np.random.default_rng(0).standard_normal((8, 4)), np.array([2, 0, 3, 0, 3, 4, 1, 0]), np.float64(0.7)
    want_out, (want_grad,) = mica.reference.run(program, x, t, u)
    for level in (0, 1, 2):
        out, (grad,) = program.lower("cpu", opt_level=level).build()(x, t, u)
        assert out == want_out and np.array_equal(grad, want_grad), level


def test_a_gradient_that_is_a_view_of_its_buffer_is_counted_as_a_gradient():
    """A bias's gradient is a reshape of a sum: its buffer holds the gradient, and the report
    counts it among the gradients (it was counted among the activations), so the gradients'
    bytes are the parameters' bytes."""
    def step(w, b, x):
        loss = (x @ w + b).square().mean()
        return loss, mica.grad(loss, [w, b])

    low = mica.trace(step, mica.f32[64, 32], mica.f32[32], mica.f32[16, 64]).lower("cpu")
    plan = low.plan
    assert plan.class_bytes["gradients"] == plan.class_bytes["parameters"] == 64 * 32 * 4 + 32 * 4
    assert re.search(r"gradients +8,320 +2 buffers", low.memory_report), low.memory_report
