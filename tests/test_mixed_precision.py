"""Mixed precision: mica.autocast as torch.autocast (casts as visible IR nodes, PyTorch's op lists),
half types computed in float32 where a target has no half kernel, and nanoGPT's step under bfloat16
against PyTorch's own CPU autocast from the same weights and batch."""
import json

import numpy as np
import pytest
import torch

import mica
from helpers import rel_err, to_torch
from mica.bench.torch_gpt import TorchGPT
from mica.errors import MicaError
from mica.models.gpt import GPT, GPTConfig, loss_fn
from test_cuda import needs_simulator
from test_runtime import work  # noqa: F401  (the prepared folder, as a fixture)

F = mica.nn.functional


def test_autocast_casts_are_nodes_with_the_users_line():
    def step(x, w, b, t):
        with mica.autocast(dtype=mica.bfloat16):
            h = F.gelu(F.linear(x, w, b))
            return F.cross_entropy(h, t)

    program = mica.trace(step, mica.f32[4, 8], mica.f32[6, 8], mica.f32[6], mica.i64[4])
    lines = program.ir.splitlines()
    casts = [line for line in lines if "= cast" in line and "b8[" not in line.split("= cast")[1]]
    # x, w and b to bf16; the bias to f32, to join the product's float32 sums, and their sum rounded to
    # bf16 once (torch's addmm); the logits back to f32 for cross_entropy (PyTorch's fp32 list); (and
    # the mean's count of valid targets, a bool cast, as without autocast)
    assert [line.split(" dtype=")[1].split()[0] for line in casts if "dtype=" in line][:6] == \
        ["bf16"] * 3 + ["f32", "bf16", "f32"]
    assert all("test_mixed_precision.py:" in line for line in casts)
    assert any(line.startswith("%") and ":f32[4, 6] = matmul" in line and "dtype=f32" in line for line in lines)
    assert any(":bf16[4, 6] = gelu" in line for line in lines)
    assert any(":f32[4], " in line and "cross_entropy" in line for line in lines)


def test_autocast_follows_pytorchs_lists():
    """Each case's result type, beside what torch.autocast("cpu", bfloat16) gives for the same call."""
    cases = [  # (name, mica's call, torch's call or the type PyTorch's lists give)
        ("linear", lambda m, x, d, y: m.nn.functional.linear(x, x), lambda t, x, d, y: t.nn.functional.linear(x, x)),
        ("sdpa", lambda m, x, d, y: m.nn.functional.scaled_dot_product_attention(x[None], x[None], x[None]),
         lambda t, x, d, y: t.nn.functional.scaled_dot_product_attention(x[None], x[None], x[None])),
        ("float64 is left alone", lambda m, x, d, y: d @ d, lambda t, x, d, y: d @ d),
        ("softmax keeps its input's type", lambda m, x, d, y: m.softmax(y, dim=-1), lambda t, x, d, y: t.softmax(y, -1)),
        ("float16 operands become bfloat16", lambda m, x, d, y: y.half() @ y.half(), lambda t, x, d, y: y.half() @ y.half()),
        ("cross_entropy in float32", lambda m, x, d, y: m.cross_entropy(y, m.zeros(4, dtype=m.long)),
         lambda t, x, d, y: t.nn.functional.cross_entropy(y, t.zeros(4, dtype=t.long))),
        ("a residual add promotes", lambda m, x, d, y: x + y, lambda t, x, d, y: x + y),
    ]

    def step(x, d, y):
        with mica.autocast(dtype=mica.bfloat16):
            return [f(mica, x, d, y) for _, f, _ in cases]

    program = mica.trace(step, mica.f32[4, 4], mica.f64[4, 4], mica.bf16[4, 4])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x, d, y = torch.eye(4), torch.eye(4, dtype=torch.float64), torch.eye(4).bfloat16()
        want = [str(g(torch, x, d, y).dtype).removeprefix("torch.") for _, _, g in cases]
    got = [v.dtype.name for v in program.graph.outputs]
    assert got == want, [c[0] for c, a, b in zip(cases, got, want) if a != b]


_LIST_CASES = {  # (name: a call both libraries take, given the library, its functional module, x and y)
    "mse_loss": lambda L, F, x, y: F.mse_loss(x, y), "l1_loss": lambda L, F, x, y: F.l1_loss(x, y),
    "smooth_l1_loss": lambda L, F, x, y: F.smooth_l1_loss(x, y), "huber_loss": lambda L, F, x, y: F.huber_loss(x, y),
    "kl_div": lambda L, F, x, y: F.kl_div(x, y, reduction="batchmean"),
    "binary_cross_entropy": lambda L, F, x, y: F.binary_cross_entropy(L.sigmoid(x), L.sigmoid(y)),
    "binary_cross_entropy_with_logits": lambda L, F, x, y: F.binary_cross_entropy_with_logits(x, L.sigmoid(y)),
    "cross_entropy": lambda L, F, x, y: F.cross_entropy(x, L.softmax(y, -1)),
    "nll_loss": lambda L, F, x, y: F.nll_loss(x, L.zeros(4, dtype=L.long)),
    "prod": lambda L, F, x, y: x.prod(), "prod(dim)": lambda L, F, x, y: x.prod(1),
    "cumsum": lambda L, F, x, y: x.cumsum(1), "cumprod": lambda L, F, x, y: x.cumprod(1),
    "logsumexp": lambda L, F, x, y: L.logsumexp(x, 1), "softplus": lambda L, F, x, y: F.softplus(x),
    "cosine_similarity": lambda L, F, x, y: F.cosine_similarity(x, y),
    "rms_norm": lambda L, F, x, y: F.rms_norm(x, (4,)),
    "layer_norm": lambda L, F, x, y: F.layer_norm(x, (4,)), "exp": lambda L, F, x, y: x.exp(),
    "log": lambda L, F, x, y: x.abs().log(), "expm1": lambda L, F, x, y: x.expm1(),
    "log1p": lambda L, F, x, y: x.abs().log1p(), "rsqrt": lambda L, F, x, y: x.abs().rsqrt(),
    "pow": lambda L, F, x, y: x.pow(2), "norm": lambda L, F, x, y: x.norm(), "sum": lambda L, F, x, y: x.sum(),
    "mean": lambda L, F, x, y: x.mean(), "softmax": lambda L, F, x, y: F.softmax(x, -1),
    "log_softmax": lambda L, F, x, y: F.log_softmax(x, -1), "std": lambda L, F, x, y: x.std(),
    "gelu": lambda L, F, x, y: F.gelu(x), "normalize": lambda L, F, x, y: F.normalize(x),
    "logsigmoid": lambda L, F, x, y: F.logsigmoid(x), "einsum": lambda L, F, x, y: L.einsum("ij,jk->ik", x, y),
    "bmm": lambda L, F, x, y: L.bmm(x[None], y[None]), "outer": lambda L, F, x, y: L.outer(x[0], y[0]),
    "conv1d": lambda L, F, x, y: F.conv1d(x[None], y[:, :, None]),
    "conv2d": lambda L, F, x, y: F.conv2d(x[None, None], y[None, None, :2, :2], padding=1),
}


@pytest.mark.parametrize("given", ["float32", "bfloat16"])
def test_every_verb_on_or_off_the_cpu_lists_gives_torchs_type(given):
    """Each verb's result type under autocast("cpu", bfloat16), from float32 and from bfloat16
    operands, beside torch.autocast's for the same call: the losses and prod in float32 (an
    outside tester found mse_loss and the other losses left in bfloat16, 2e-3 from torch's value)."""
    def step(x, y):
        with mica.autocast(dtype=mica.bfloat16):
            return [f(mica, F, x, y) for f in _LIST_CASES.values()]

    spec = getattr(mica, given)
    program = mica.trace(step, mica.Spec((4, 4), spec), mica.Spec((4, 4), spec))
    rng = np.random.default_rng(0)
    x, y = (torch.tensor(rng.standard_normal((4, 4)), dtype=getattr(torch, given)) for _ in range(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = [str(f(torch, torch.nn.functional, x, y).dtype).removeprefix("torch.") for f in _LIST_CASES.values()]
    got = [v.dtype.name for v in program.graph.outputs]
    assert got == want, {n: (a, b) for n, a, b in zip(_LIST_CASES, got, want) if a != b}


def test_a_loss_after_a_product_under_autocast_is_torchs_value():
    """The product in bfloat16, the loss on it in float32: torch's value to float32's rounding (the
    loss left in bfloat16 was 2e-3 away)."""
    rng = np.random.default_rng(1)
    a, b, t = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(3))

    def step(a, b, t):
        with mica.autocast(dtype=mica.bfloat16):
            return [F.mse_loss(a @ b, t), F.l1_loss(a @ b, t), F.huber_loss(a @ b, t)]

    got = mica.compile(step, *[mica.f32[64, 64]] * 3)(a, b, t)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ta, tb, tt = map(torch.tensor, (a, b, t))
        want = [f(ta @ tb, tt) for f in (torch.nn.functional.mse_loss, torch.nn.functional.l1_loss,
                                         torch.nn.functional.huber_loss)]
    for g, w in zip(got, want):
        assert w.dtype == torch.float32 and rel_err(np.asarray(g), w.numpy()) < 1e-5, (g, w)


def test_the_cuda_float32_list_is_torchs():
    """autocast("cuda")'s float32 list against the one torch's own header gives (AT_FORALL_FP32 and
    the ops it runs in float32 when no dtype is given), restricted to Mica's verbs; and torch's
    refusal of binary_cross_entropy there is Mica's too."""
    import os
    import re

    from mica import amp

    header = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "autocast_mode.h")
    if not os.path.exists(header):
        pytest.skip("this torch ships no ATen headers")
    text = open(header).read()
    names = set()
    for macro in ("AT_FORALL_FP32", "AT_FORALL_FP32_SET_OPT_DTYPE"):
        body = text[text.index(f"#define {macro}("):]
        body = body[:body.index("\n\n")]
        names |= set(re.findall(r"_\((\w+)", body))
    alias = {"native_layer_norm": "layer_norm", "linalg_vector_norm": "norm", "frobenius_norm": "norm",
             "nll_loss2d": "nll_loss", **{n: "interpolate" for n in names if "upsample" in n}}
    mine = {alias.get(n, n) for n in names} & {n for n in dir(F) + dir(mica) + dir(mica.Tensor)
                                               if not n.startswith("_")}
    assert mine - amp.FLOAT32["cuda"] == set()
    assert amp.FLOAT32["cuda"] - mine == {"cross_entropy"}  # (torch's is log_softmax then nll_loss: both listed)

    def bce(x, y):
        with mica.autocast("cuda", dtype=mica.bfloat16):
            return F.binary_cross_entropy(x.sigmoid(), y.sigmoid())

    with pytest.raises(MicaError, match="binary_cross_entropy is unsafe under autocast"):
        mica.trace(bce, mica.f32[4], mica.f32[4])


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_a_norm_after_a_product_under_autocast_is_pytorchs_mixed_type_norm(half):
    """Linear -> LayerNorm -> GELU -> Linear (and an RMS norm with a weight) under autocast: the
    product's half output meets float32 norm weights, which PyTorch normalizes in float32 and
    rounds once to the half type; loss and gradients against torch.autocast on the same weights.
    An RMS norm's default eps is float32's machine epsilon for the half types too (PyTorch's
    opmath type), where Mica took the half type's own (2^-7 for bfloat16)."""
    rng = np.random.default_rng(7)
    shapes = {"w1": (24, 10), "b1": (24,), "g": (24,), "b": (24,), "r": (24,), "w2": (3, 24), "b2": (3,)}
    p = {k: (rng.standard_normal(s) * 0.3).astype(np.float32) for k, s in shapes.items()}
    x, y = rng.standard_normal((5, 10)).astype(np.float32), rng.integers(0, 3, 5)
    dt = getattr(mica, half)

    def loss(q, x, y):
        with mica.autocast(dtype=dt):
            h = F.layer_norm(F.linear(x, q["w1"], q["b1"]), (24,), q["g"], q["b"])
            h = F.rms_norm(F.gelu(h), (24,), q["r"])
            return F.cross_entropy(F.linear(h, q["w2"], q["b2"]), y)

    program = mica.trace(lambda q, x, y: mica.value_and_grad(loss)(q, x, y),
                         {k: mica.f32[s] for k, s in shapes.items()}, mica.f32[5, 10], mica.i64[5])
    got_loss, got = program.lower("cpu").build()(p, x, y)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    with torch.autocast("cpu", dtype=getattr(torch, half)):
        tf = torch.nn.functional
        h = tf.layer_norm(tf.linear(torch.tensor(x), tp["w1"], tp["b1"]), (24,), tp["g"], tp["b"])
        h = tf.rms_norm(tf.gelu(h), (24,), tp["r"])
        want = tf.cross_entropy(tf.linear(h, tp["w2"], tp["b2"]), torch.tensor(y))
    want.backward()
    assert rel_err(float(got_loss), float(want)) < 1e-2
    for k in shapes:
        g, w = got[k], tp[k].grad.numpy()
        assert np.abs(g - w).max() <= 3e-2 * np.abs(w).max(), k
    # the default eps: float32's, as torch's for a half input (bit for bit here, one rounding each)
    xs = (rng.standard_normal((6, 16)) * 0.02).astype(np.float32)
    mine = np.asarray(mica.compile(lambda v: F.rms_norm(v.to(dt), (16,)).to(mica.float32), mica.f32[6, 16])(xs))
    theirs = torch.nn.functional.rms_norm(torch.tensor(xs).to(getattr(torch, half)), (16,)).float().numpy()
    assert np.abs(mine - theirs).max() <= 2.0 ** -7 * np.abs(theirs).max()
    other = torch.nn.functional.rms_norm(torch.tensor(xs).to(getattr(torch, half)), (16,), eps=2.0 ** -7).float()
    assert np.abs(mine - other.numpy()).max() > 0.05  # (the half type's own eps moves these rows)


def test_autocast_disabled_and_on_cuda():
    def step(x, y):
        with mica.autocast(dtype=mica.bfloat16):
            with mica.autocast(enabled=False):
                plain = x @ x
        with mica.autocast("cuda", dtype=mica.bfloat16):  # CUDA's float32 list is longer
            cuda = [F.softmax(y, dim=-1), F.layer_norm(y, (4,)), mica.exp(y), x @ x, y.mean(-1), y.sum(-1)]
        with mica.autocast("cuda"):  # (torch's CUDA default: float16)
            half = x @ x
        return [plain, *cuda, half]

    program = mica.trace(step, mica.f32[4, 4], mica.bf16[4, 4])
    got = [v.dtype.name for v in program.graph.outputs]
    # (mean keeps its input's type there, as torch's: only sum is on CUDA's float32 list)
    assert got == ["float32", "float32", "float32", "float32", "bfloat16", "bfloat16", "float32", "float16"]


def test_autocast_settings_it_cannot_take_are_sentences():
    with pytest.raises(MicaError, match="device_type must be 'cpu' or 'cuda'"):
        mica.autocast("mps")
    with pytest.raises(MicaError, match="dtype must be mica.bfloat16 or mica.float16"):
        mica.autocast(dtype=mica.float64)


def _gpt_case():
    cfg = GPTConfig(block_size=16, vocab_size=29, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)
    model = GPT(cfg)
    rng = np.random.default_rng(0)
    params = {n: (a + 0.05 * rng.standard_normal(a.shape)).astype(np.float32) for n, a in model.init(seed=3).items()}
    B, T = 4, 16
    idx, tgt = rng.integers(0, 29, (B, T)), rng.integers(0, 29, (B, T))
    specs = (model.param_specs(), mica.i64[B, T], mica.i64[B, T])
    return cfg, model, params, idx, tgt, specs


@pytest.fixture(scope="module")
def bf16_step():
    cfg, model, params, idx, tgt, specs = _gpt_case()

    def step(p, x, y):
        with mica.autocast(dtype=mica.bfloat16):
            return mica.value_and_grad(loss_fn(model))(p, x, y)

    exact = mica.trace(lambda p, x, y: mica.value_and_grad(loss_fn(model))(p, x, y), *specs)
    return cfg, mica.trace(step, *specs), params, idx, tgt, mica.reference.run(exact, params, idx, tgt)


@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda", marks=needs_simulator)])
def test_the_gpt_step_under_bfloat16_is_pytorchs_cpu_autocast(bf16_step, target):
    """Same weights and batch: the loss agrees with torch.autocast's to 1e-4 (bf16's eps is 4e-3), and
    every gradient is as close to the float64 answer as PyTorch's own bfloat16 gradient is (the two
    sides round the same values to bfloat16; their float32 sums run in other orders)."""
    cfg, program, params, idx, tgt, (loss64, grads64) = bf16_step
    options = {"simulate": True} if target == "cuda" else {}
    loss, grads = program.lower(target, **options).build()(params, idx, tgt)
    oracle_loss, oracle_grads = mica.reference.run(program, params, idx, tgt, precision="float32")
    tmodel = TorchGPT(cfg).load_arrays(params)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, tloss = tmodel(to_torch(idx), to_torch(tgt))
    tloss.backward()
    tgrads = {n: p.grad.numpy() for n, p in tmodel.named_parameters()}
    assert rel_err(loss, tloss.item()) < 1e-4
    assert rel_err(loss, oracle_loss) < 1e-5  # (the oracle's half-rounding mode: the same roundings)
    for name, g in grads.items():
        assert grads[name].dtype == np.float32  # float32 weights get float32 gradients
        assert rel_err(g, oracle_grads[name]) < 1e-4, name
        assert rel_err(g, tgrads[name]) < 3e-2, name
        assert rel_err(g, grads64[name]) < 2 * rel_err(tgrads[name], grads64[name]) + 2e-3, name
    assert max(rel_err(g, grads64[n]) for n, g in grads.items()) > 1e-3  # (it is bfloat16, not float32's answer)


def test_the_bfloat16_step_is_the_same_for_any_thread_count_and_opt_level(bf16_step):
    _, program, params, idx, tgt, _ = bf16_step
    runs = [program.lower("cpu", opt_level=o).build()(params, idx, tgt, threads=t) for o, t in ((2, 1), (2, 2), (0, 2))]
    for loss, grads in runs[1:]:
        assert np.array_equal(loss, runs[0][0])
        for name in grads:
            assert np.array_equal(grads[name], runs[0][1][name]), name


TINY = ["shakespeare_char", "--device=cpu", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32",
        "--batch_size=4", "--eval_iters=2", "--log_interval=1", "--max_iters=8", "--eval_interval=4",
        "--dropout=0.1", "--always_save_checkpoint=True", "--compile=False"]


def _train(args):
    import subprocess

    from mica.train import run

    notes = []
    exe, manifest, cfg = run.prepare_run(args[0], args[1:], log=notes.append)
    r = subprocess.run([exe, manifest], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return notes


def _losses(out_dir):
    import json

    with open(f"{out_dir}/metrics.jsonl") as f:
        return {m["iter"]: m["loss"] for m in map(json.loads, f) if "iter" in m and "loss" in m}


def test_training_in_bfloat16_resumes_bit_for_bit_and_is_not_float32(work):
    from mica.train import checkpoint

    notes = _train([*TINY, "--dtype=bfloat16", "--out_dir=straight"])
    assert any("dtype=bfloat16 on the CPU: Mica trains under bfloat16 autocast" in n for n in notes)
    from mica.backends.c import bf16gemm
    assert bf16gemm.describe(bf16gemm.choose()) in notes  # which product kernel this processor got
    assert "chosen for the processor that built it" in bf16gemm.describe(bf16gemm.choose())
    _train([*TINY, "--dtype=bfloat16", "--out_dir=halves", "--max_iters=4"])
    _train([*TINY, "--dtype=bfloat16", "--out_dir=halves", "--init_from=resume"])
    a, b = checkpoint.SafeTensors("straight/ckpt.safetensors"), checkpoint.SafeTensors("halves/ckpt.safetensors")
    for name in a.names:
        assert np.array_equal(a.read(name), b.read(name)), name
    assert a.read("transformer.wte.weight").dtype == np.float32  # float32 master weights
    _train([*TINY, "--out_dir=f32"])  # (on a CPU without --dtype: float32, as nanoGPT)
    bf, f32 = _losses("straight"), _losses("f32")
    assert bf != f32 and all(abs(bf[i] - f32[i]) < 1e-2 * f32[i] for i in f32)


@pytest.mark.slow  # (a variant: bfloat16 resumes are checked by default; make test-slow runs it)
def test_a_resume_keeps_fp_half_intermediates_as_its_checkpoint_trained(work):
    """fp_half_intermediates changes the step's roundings: a resume that does not give it goes on
    with the checkpoint's, said, and is bit for bit the run straight through; one that gives
    another is said not to be. A resume whose --dtype is no dtype gets the one sentence, with no
    note before it that takes the bad name for a dtype, and its checkpoint is left as it was."""
    from mica.train import checkpoint, config, run

    half = [*TINY, "--dtype=bfloat16", "--fp_half_intermediates=True"]
    _train([*half, "--out_dir=straight"])
    _train([*half, "--out_dir=halves", "--max_iters=4"])
    notes = _train([*TINY, "--out_dir=halves", "--init_from=resume"])
    assert "resuming in the checkpoint's dtype=bfloat16 (--dtype=float32 trains on in that instead)" in notes
    assert ("resuming with the checkpoint's fp_half_intermediates=True (--fp_half_intermediates=False trains on with "
            "that instead)") in notes, notes
    a, b = checkpoint.SafeTensors("straight/ckpt.safetensors"), checkpoint.SafeTensors("halves/ckpt.safetensors")
    for name in a.names:
        assert np.array_equal(a.read(name), b.read(name)), name
    assert json.loads(b.metadata["config"])["fp_half_intermediates"] is True
    notes = []  # (the resume's settings, as prepare_run reads them before it builds anything)
    cfg = config.load(TINY[0], [*TINY[1:], "--out_dir=halves", "--init_from=resume", "--fp_half_intermediates=False"],
                      log=lambda _: None)
    run._follow_resumed_dtype(cfg, notes.append)
    assert cfg["fp_half_intermediates"] is False and any("the checkpoint was trained with fp_half_intermediates=True; this run goes on with "
               "fp_half_intermediates=False from its weights (not bit for bit" in n for n in notes), notes
    with open("halves/ckpt.safetensors", "rb") as f:
        before = f.read()
    for bad in ("bf16", "float64"):
        notes = []
        with pytest.raises(MicaError, match=f"dtype must be 'float32', 'bfloat16' or 'float16', got '{bad}'"):
            run.prepare_run(TINY[0], [*TINY[1:], "--out_dir=halves", "--init_from=resume", f"--dtype={bad}"],
                            log=notes.append)
        assert not any("dtype" in n for n in notes), notes
    with open("halves/ckpt.safetensors", "rb") as f:
        assert f.read() == before


def test_a_resume_on_another_bfloat16_product_kernel_says_it_is_not_bit_for_bit(work):
    """The checkpoint's config records the bfloat16 product kernel its run took (it depends on the
    processor); a resume whose trainer takes another (MICA_BF16_GEMM, another machine) says so."""
    from mica.backends.c import bf16gemm
    from mica.train import checkpoint, config, run

    kernel = bf16gemm.choose()
    _train([*TINY, "--dtype=bfloat16", "--out_dir=k", "--max_iters=4"])
    assert json.loads(checkpoint.SafeTensors("k/ckpt.safetensors").metadata["config"])["bf16_gemm"] == kernel
    cfg = config.load(TINY[0], [*TINY[1:], "--out_dir=k", "--init_from=resume"], log=lambda _: None)
    for took, said in ((kernel, False), ("f32" if kernel != "f32" else "avx512bf16", True)):
        notes = []  # (what prepare_run says once it has built the resume's trainer, on kernel `took`)
        run._say_other_product_kernel(cfg, took, notes.append)
        assert any(f"the checkpoint's run took its bfloat16 products on the {kernel} kernel and this trainer takes "
                   f"them on the {took} kernel: it goes on from the same state, not bit for bit" in n
                   for n in notes) == said, notes


@pytest.mark.slow  # (a variant: the default suite checks half-type resumes; make test-slow runs it)
def test_a_resume_of_an_imported_half_runs_checkpoint_names_the_dtype_it_trains_in(work):
    """An imported checkpoint's config keeps nanoGPT's dtype setting, which Mica does not follow on
    its own (nanoGPT's default is a half type on a card): the resume says so, and how to follow it."""
    import subprocess
    import sys

    from mica.train import run

    _train([*TINY, "--dtype=bfloat16", "--out_dir=half", "--max_iters=4"])
    for args in (["export", "half", "--to", "half.pt"], ["import", "half.pt", "--out_dir", "imported"]):
        r = subprocess.run([sys.executable, "-m", "mica.cli", *args], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    notes = []
    run.prepare_run(TINY[0], [*TINY[1:], "--out_dir=imported", "--init_from=resume"], log=notes.append)
    assert any("the imported checkpoint's config says dtype=bfloat16" in n and "pass --dtype=bfloat16" in n
               for n in notes), notes
    notes = []
    run.prepare_run(TINY[0], [*TINY[1:], "--out_dir=imported", "--init_from=resume", "--dtype=bfloat16"],
                    log=notes.append)
    assert not any("imported checkpoint's config says" in n for n in notes)
    # nanoGPT's own train.py on a CPU: its config says float16 (no card with bfloat16) and trained float32
    ck = torch.load("half.pt", weights_only=False)
    ck["config"] = {k: v for k, v in ck["config"].items() if k != "recipe"} | {"device": "cpu", "dtype": "float16"}
    torch.save(ck, "cpu.pt")
    r = subprocess.run([sys.executable, "-m", "mica.cli", "import", "cpu.pt", "--out_dir", "from_cpu"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    notes = []
    run.prepare_run(TINY[0], [*TINY[1:], "--out_dir=from_cpu", "--init_from=resume"], log=notes.append)
    assert any("says dtype=float16, but it trained on device='cpu', where nanoGPT trains in float32 whatever dtype "
               "says; so does this run" in n for n in notes), notes


def test_float16_training_keeps_its_loss_scaler_in_the_checkpoint_and_resumes_exactly(work):
    from mica.train import checkpoint, run

    _train([*TINY, "--dtype=float16", "--out_dir=straight"])
    _train([*TINY, "--dtype=float16", "--out_dir=halves", "--max_iters=4"])
    mid = checkpoint.SafeTensors("halves/ckpt.safetensors")
    assert float(mid.read("optimizer.scaler.scale")) == 2.0 ** 16 and int(mid.read("optimizer.scaler.growth_tracker")) == 4
    _train([*TINY, "--dtype=float16", "--out_dir=halves", "--init_from=resume"])
    a, b = checkpoint.SafeTensors("straight/ckpt.safetensors"), checkpoint.SafeTensors("halves/ckpt.safetensors")
    for name in a.names:
        assert np.array_equal(a.read(name), b.read(name)), name
    # without --dtype a resume goes on in the checkpoint's dtype (a CPU run's default is float32)
    notes = _train([*TINY, "--out_dir=halves", "--init_from=resume", "--max_iters=12"])
    assert "resuming in the checkpoint's dtype=float16 (--dtype=float32 trains on in that instead)" in notes
    assert int(checkpoint.SafeTensors("halves/ckpt.safetensors").read("optimizer.scaler.growth_tracker")) == 12


def test_a_resume_in_another_dtype_starts_or_leaves_the_loss_scaler_as_nanogpt(work):
    """nanoGPT never saves its GradScaler: a float16 resume starts a new one. Mica keeps it, so a
    checkpoint without one (another dtype's, an import) starts afresh, and a float16 checkpoint
    resumed in another dtype, asked for, leaves it out; each said."""
    from mica.train import checkpoint, convert

    _train([*TINY, "--dtype=bfloat16", "--out_dir=bf16", "--max_iters=4"])
    notes = _train([*TINY, "--dtype=float16", "--out_dir=bf16", "--init_from=resume"])
    assert any("holds no loss scaler (trained in another dtype, or imported): float16 training starts a new one at "
               "scale 65536" in n for n in notes), notes
    assert any("the checkpoint was trained in bfloat16; this run goes on in dtype=float16" in n for n in notes)
    after = checkpoint.SafeTensors("bf16/ckpt.safetensors")
    assert float(after.read("optimizer.scaler.scale")) == 2.0 ** 16  # (no overflow in 4 steps, no growth in 2000)
    assert int(after.read("optimizer.scaler.growth_tracker")) == 4  # (iterations 5..8 after a fresh start)
    assert json.loads(after.metadata["config"])["dtype"] == "float16"
    # float16 -> float32, asked for: the scaler is left out of the next checkpoint
    notes = _train([*TINY, "--dtype=float32", "--out_dir=bf16", "--init_from=resume", "--max_iters=10"])
    assert any("holds a float16 run's loss scaler, which a float32 run does not use" in n for n in notes), notes
    assert "optimizer.scaler.scale" not in checkpoint.SafeTensors("bf16/ckpt.safetensors").names
    # weights alone, in float16
    notes = _train([*TINY, "--dtype=float16", "--out_dir=new", "--init_from=bf16/ckpt.safetensors", "--max_iters=4"])
    assert float(checkpoint.SafeTensors("new/ckpt.safetensors").read("optimizer.scaler.scale")) == 2.0 ** 16
    # a float16 run exported to nanoGPT's ckpt.pt and imported (nanoGPT keeps no scaler) resumes in float16
    _train([*TINY, "--dtype=float16", "--out_dir=f16", "--max_iters=4"])
    convert.export_nanogpt("f16", "f16.pt")
    convert.import_nanogpt("f16.pt", "imported")
    # weights of a float16 run: its scaler is not taken (a run from weights starts one, as from scratch)
    _train([*TINY, "--dtype=float16", "--out_dir=fromw", "--init_from=f16/ckpt.safetensors", "--max_iters=4"])
    assert int(checkpoint.SafeTensors("fromw/ckpt.safetensors").read("optimizer.scaler.growth_tracker")) == 4
    notes = _train([*TINY, "--dtype=float16", "--out_dir=imported", "--init_from=resume", "--max_iters=8"])
    assert any("holds no loss scaler" in n for n in notes), notes
    a, b = checkpoint.SafeTensors("f16/ckpt.safetensors"), checkpoint.SafeTensors("imported/ckpt.safetensors")
    assert int(b.metadata["iter_num"]) == 8
    assert not np.array_equal(a.read("transformer.wte.weight"), b.read("transformer.wte.weight"))  # (it trained)


@pytest.mark.slow  # (a variant: the default suite checks float16's loss scaling; make test-slow runs it)
def test_float16_with_gradient_accumulation_trains(work):
    """The loss a float16 step reports is the unscaled micro-batch loss, not the scaled one divided
    back after the scale was updated in place (with accum > 1 that read came after the update).
    At opt_level=0 (no fusion: the guarded updates are new buffers, not written in place) it trains
    the same bits; it stopped at an internal assertion (those buffers lay among the state)."""
    args = [*TINY, "--max_iters=3", "--gradient_accumulation_steps=2", "--batch_size=2"]
    _train([*args, "--dtype=float16", "--out_dir=f16"])
    _train([*args, "--dtype=float16", "--opt_level=0", "--out_dir=f16o0"])
    _train([*args, "--out_dir=f32"])
    f16, f32 = _losses("f16"), _losses("f32")
    assert _losses("f16o0") == f16
    assert sorted(f16) == [0, 1, 2, 3] and f16 != f32
    assert all(abs(f16[i] - f32[i]) < 1e-2 * f32[i] for i in f32)


def test_grad_scaler_takes_torchs_arguments_and_refuses_mismatched_trees():
    """torch.amp.GradScaler's signature (device first); a step whose `new` is not `old`'s structure
    (swapped, or the optimizer state left out) is a sentence at the user's line, where it compiled
    with wrong shapes, raised StopIteration or dropped leaves; a hand-made state without the growth
    tracker, and autocast's dtype given as a string it does not know, are sentences too."""
    assert mica.amp.GradScaler("cpu", growth_interval=5).growth_interval == 5
    assert mica.amp.GradScaler(device="cuda").init_scale == 2.0 ** 16
    with pytest.raises(MicaError, match="pass init_scale by name"):
        mica.amp.GradScaler(4.0)
    sc, opt = mica.amp.GradScaler(init_scale=4.0), mica.optim.SGD(lr=0.5)
    ps = {"w": mica.f32[3, 2], "b": mica.f32[2]}

    def step(arrange):
        def f(p, o, s, x):
            loss, g = mica.value_and_grad(lambda q: sc.scale((x @ q["w"] + q["b"]).square().mean(), s))(p)
            g, found = sc.unscale(g, s)
            new = opt.update(p, g, o)
            return sc.step(found, *arrange(p, o, new))
        return f

    for arrange in (lambda p, o, new: ((p, o), (new[1], new[0])), lambda p, o, new: ((p, o), new[0]),
                    lambda p, o, new: (p, new)):
        with pytest.raises(MicaError, match=r"GradScaler.step: `new` must have the structure.*test_mixed_precision"):
            mica.trace(step(arrange), ps, opt.state_specs(ps), sc.state_specs(), mica.f32[4, 3])
    mica.trace(step(lambda p, o, new: ((p, o), new)), ps, opt.state_specs(ps), sc.state_specs(), mica.f32[4, 3])
    with pytest.raises(MicaError, match="GradScaler.update: the state must be the dict scaler.init"):
        mica.trace(lambda s, x: sc.update(s, x.sum() > 0), {"scale": mica.f32[()]}, mica.f32[3])
    with pytest.raises(MicaError, match="autocast: dtype must be mica.bfloat16 or mica.float16, got 'fp16'"):
        mica.autocast(dtype="fp16")


def test_grad_scaler_takes_torchs_decisions_on_the_same_numbers():
    """float16 autocast with a GradScaler (growth every 3 steps): inputs that grow and shrink make
    steps overflow (skipped, the scale halved), grow the scale, and overflow twice in a row; every
    decision, scale and growth tracker is torch.amp.GradScaler's, and a skipped step keeps every bit."""
    scaler = mica.amp.GradScaler(growth_interval=3)
    opt = mica.optim.adamw(lr=1e-2, weight_decay=0.0)

    def step(params, opt_state, sc, x):
        def loss_of(p):
            with mica.autocast(dtype=mica.float16):
                y = F.linear(x, p["w"])
            return (y.float() ** 2).mean()

        loss, grads = mica.value_and_grad(lambda p: scaler.scale(loss_of(p), sc))(params)
        grads, found = scaler.unscale(grads, sc)
        new = opt.update(params, grads, opt_state)
        params, opt_state = scaler.step(found, (params, opt_state), new)
        return params, opt_state, scaler.update(sc, found), found

    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((3, 8)).astype(np.float32)
    spec = {"w": mica.f32[3, 8]}
    program = mica.trace(step, spec, opt.state_specs(spec), scaler.state_specs(), mica.f32[4, 8])
    exe = program.lower("cpu").build()
    mult = [1, 1, 1, 1, 40, 1, 1, 1, 1, 1, 300, 300, 1, 1, 1, 1, 1]
    xs = [(rng.standard_normal((4, 8)) * m * 0.05).astype(np.float32) for m in mult]
    params, ostate, sc, ours = {"w": w0}, opt.init({"w": w0}), scaler.init(), []
    for x in xs:
        before = params["w"].copy()
        params, ostate, sc, found = exe(params, ostate, sc, x, threads=1)
        ours.append((bool(found), float(sc["scale"]), int(sc["growth_tracker"])))
        if found:
            assert np.array_equal(params["w"], before)
    tw = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    topt = torch.optim.AdamW([tw], lr=1e-2, weight_decay=0.0)
    tscaler, theirs = torch.amp.GradScaler("cpu", growth_interval=3), []
    for x in xs:
        topt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            y = torch.nn.functional.linear(torch.from_numpy(x), tw)
        tscaler.scale((y.float() ** 2).mean()).backward()
        before = tscaler.get_scale()
        tscaler.step(topt)
        tscaler.update()
        theirs.append((tscaler.get_scale() < before, tscaler.get_scale(), int(tscaler._growth_tracker.item())))
    assert ours == theirs
    assert [s for s, _, _ in ours].count(True) == 3 and max(v for _, v, _ in ours) == 2.0 ** 17
    assert rel_err(params["w"], tw.detach().numpy()) < 1e-6


@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda", marks=needs_simulator)])
def test_muons_bfloat16_newton_schulz_compiles_and_rounds_where_the_oracle_does(target):
    """The speedrun seed's zeropower_via_newtonschulz5 runs in bf16: every product and every
    elementwise step rounds to bf16; compiled, it is the oracle's half-rounding mode (their float32
    sums run in other orders, which the bf16 rounding after each product all but hides)."""
    from mica.optim import SEED_COEFFICIENTS

    program = mica.trace(lambda g: mica.optim.zeropower_via_newtonschulz(g, SEED_COEFFICIENTS).float(), mica.f32[24, 40])
    g = np.random.default_rng(0).standard_normal((24, 40)).astype(np.float32)
    options = {"simulate": True} if target == "cuda" else {}
    got = program.lower(target, **options).build()(g)
    want = mica.reference.run(program, g, precision="float32")
    assert rel_err(got, want) < 1e-6
    assert 1e-4 < rel_err(got, mica.reference.run(program, g)) < 5e-2  # (bf16, not float64's answer)


def test_mfu_is_measured_against_the_ceiling_of_the_runs_product_dtype(tmp_path, monkeypatch):
    """A bfloat16 run's mfu divides by this machine's bfloat16 product rate (Mica's own kernel), a
    float32 run's by the float32 one; side by side in one cache file, each the best this machine
    ever measured (a reading taken while it was busy does not stay), a damaged file measured over."""
    import json

    from mica.backends.c import bf16gemm
    from mica.train import programs

    monkeypatch.setenv("MICA_CACHE", str(tmp_path))
    f32, bf16 = programs.peak_flops("float32"), programs.peak_flops("bfloat16")
    assert 1e8 < f32 < 1e14 and 1e8 < bf16 < 1e14
    known = json.loads((tmp_path / "peak_flops.json").read_text())
    assert known == {"flops": f32, f"flops bfloat16 {bf16gemm.choose()}": bf16}
    assert programs.peak_flops("bfloat16") >= bf16  # (measured again: the best is kept)
    f16 = programs.peak_flops("float16")  # (the CPU widens float16 products to float32: float32's key, and at
    assert f16 >= f32 and json.loads((tmp_path / "peak_flops.json").read_text())["flops"] == f16  # least its best)
    known["flops"] = 1e15  # (faster than this machine: kept)
    (tmp_path / "peak_flops.json").write_text(json.dumps(known))
    assert programs.peak_flops("float32") == 1e15
    known["flops"] = 123.0  # (a busy machine's reading: replaced by the next, better one)
    (tmp_path / "peak_flops.json").write_text(json.dumps(known))
    assert 1e8 < programs.peak_flops("float32") == json.loads((tmp_path / "peak_flops.json").read_text())["flops"]
    (tmp_path / "peak_flops.json").write_text("[1, 2")
    assert 1e8 < programs.peak_flops("bfloat16") < 1e14


def test_grad_scaler_and_autocast_used_torchs_way_are_sentences_at_the_users_line():
    """What a PyTorch user writes first: torch.autocast around traced verbs (which Mica's trace would
    not see: the step would train in float32 unsaid), scaler.scale(loss) and scaler.step(opt) as
    methods of objects, a state made inside the step (a constant scale), unscale twice (a second
    division), non-Tensor gradients, a string dtype in .to() (a device there, as in torch)."""
    sc = mica.amp.GradScaler()
    W, st = mica.f32[4, 4], sc.state_specs()

    def refused(fn, *specs):
        with pytest.raises(MicaError) as e:
            mica.trace(fn, *specs)
        assert "test_mixed_precision.py:" in str(e.value), e.value
        return e.value.sentence

    def under_torch(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.linear(x, w).sum()

    assert refused(under_torch, W, W).startswith("linear runs under torch.autocast('cpu'), which Mica's trace does "
                                                 "not see; write mica.autocast('cpu', dtype=...) instead")
    assert refused(lambda w: sc.scale(w.sum()), W).startswith("GradScaler.scale: the state must be the dict")
    assert refused(lambda w: sc.step(object()), W).startswith("GradScaler.step takes (found_inf, old, new)")
    assert "the state's values are constants here" in refused(lambda w: sc.scale(w.sum(), sc.init()), W)
    assert refused(lambda w, s: sc.unscale([w], s["scale"]), W, st).startswith("GradScaler.unscale: the state must")
    assert refused(lambda w, s: sc.unscale([w, 3.0], s), W, st).endswith("as mica.grad gives), got float")
    assert "unscaled already" in refused(lambda w, s: sc.unscale(sc.unscale([w], s)[0], s), W, st)
    # one scaler for two optimizers' gradients unscales each set once, as torch's unscale_(opt) per optimizer
    mica.trace(lambda w, v, s: (sc.unscale([w], s)[0][0] + sc.unscale([v], s)[0][0]).sum(), W, W, st)
    assert refused(lambda x: x.to("bfloat16").sum(), W).startswith(
        "to: a string is a device in Tensor.to, as in PyTorch, not an element type; write .to(mica.bfloat16)")
    assert "not a device PyTorch knows" in refused(lambda x: x.to("gpu").sum(), W)
    assert "cast" not in mica.trace(lambda x: x.to("cuda:0").sum(), W).ir
    with pytest.raises(MicaError, match=r"autocast: dtype must be mica.bfloat16 or mica.float16, got float32 "
                                        r"\(.*test_mixed_precision.py:\d+\)"):
        mica.autocast(dtype=mica.float32)


def test_a_value_beyond_a_narrower_inputs_range_is_a_sentence_not_inf():
    """numpy's cast would make 7e4 an infinity in a float16 input (warning on stderr); the program
    says so instead. Infinities and NaNs given as such pass, and values that round to the largest
    finite one do."""
    exe = mica.compile(lambda x: (x.float() * 2).sum(), mica.f16[4])
    assert exe(np.array([1, 2, 3, 65519.9], np.float32)) == 2 * (6 + 65504)
    for bad in (np.full(4, 7e4, np.float32), np.array([1, np.inf, 2, 7e4]), np.array([70000, 1, 2, 3])):
        with pytest.raises(MicaError, match=r"input 0 \(x\) is f16\[4\] and got 70000(\.0)?, beyond float16's largest "
                                            r"value \(65504\); scale the values"):
            exe(bad)
    assert np.isnan(exe(np.array([1, np.inf, np.nan, -np.inf], np.float32)))
    exe32 = mica.compile(lambda x: x.sum(), mica.f32[2])
    with pytest.raises(MicaError, match="got 1e\\+39, beyond float32's largest value"):
        exe32(np.array([1e39, 1.0]))


def test_a_bad_grad_scaler_setting_names_the_users_line():
    for bad in (dict(init_scale=-1.0), dict(init_scale=1e60), dict(growth_factor=1.0), dict(growth_interval=0),
                dict(device=3)):  # (1e60: beyond float32, an infinite scale that would skip every step)
        with pytest.raises(MicaError, match=r"GradScaler: .*test_mixed_precision\.py:\d+\)$"):
            mica.amp.GradScaler(**bad)


_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "binary_cross_entropy_with_logits")


@pytest.mark.parametrize("types", [("bfloat16", "float32"), ("float32", "bfloat16"), ("float16", "float32"),
                                   ("float32", "float64")])
def test_a_loss_of_two_float_types_outside_autocast_is_torchs_type_and_value(types):
    """An outside tester's: mse_loss(bf16, f32) was rounded to bfloat16 (torch's is float32). Each
    loss takes torch's type for mixed operands (huber's the input's, the logits loss the target's)
    and its value to float32's rounding; binary_cross_entropy refuses them, as torch's."""
    rng = np.random.default_rng(1)
    x, t = rng.random((6, 5)).astype(np.float32), rng.random((6, 5)).astype(np.float32)
    a, b = (getattr(mica, n) for n in types)
    got = mica.compile(lambda x, t: [getattr(F, n)(x.to(a), t.to(b)) for n in _LOSSES])(x, t)
    ta, tb = (getattr(torch, n) for n in types)
    for name, g in zip(_LOSSES, got):
        want = getattr(torch.nn.functional, name)(torch.tensor(x).to(ta), torch.tensor(t).to(tb))
        bound = 3e-7 if want.dtype in (torch.float32, torch.float64) else 4e-3  # (a half type's: its rounding)
        assert rel_err(float(g), want.item()) < bound, name
        held = {torch.float64: np.float64, torch.float16: np.float16}.get(want.dtype, np.float32)  # (bf16: widened)
        assert np.asarray(g).dtype == held, name
    with pytest.raises(MicaError, match="binary_cross_entropy: input .* and target .* differ in type"):
        mica.trace(lambda x, t: F.binary_cross_entropy(x.to(a), t.to(b)), mica.f32[3], mica.f32[3])
    kl = mica.compile(lambda i, t: F.kl_div(i, t, reduction="none"))(np.float32([-0.2, -0.5, -1.0]),
                                                                     np.float32([-0.1, 0.0, 0.3]))
    want = torch.nn.functional.kl_div(torch.tensor([-0.2, -0.5, -1.0]), torch.tensor([-0.1, 0.0, 0.3]),
                                      reduction="none")
    np.testing.assert_allclose(np.asarray(kl), want.numpy(), rtol=1e-6)  # (a negative target: NaN, torch's xlogy)


_COMPOSITES = {
    "log1p": lambda m, x: m.log1p(x.abs()), "expm1": lambda m, x: m.expm1(x), "log2": lambda m, x: m.log2(x.abs()),
    "log10": lambda m, x: m.log10(x.abs()), "softplus": lambda m, x: m.nn.functional.softplus(x),
    "logsigmoid": lambda m, x: m.nn.functional.logsigmoid(x), "elu": lambda m, x: m.nn.functional.elu(x),
    "silu": lambda m, x: m.nn.functional.silu(x), "glu": lambda m, x: m.nn.functional.glu(x),
    "cumsum": lambda m, x: x.cumsum(-1), "cumprod": lambda m, x: (x[:, :8] * 0.5).cumprod(-1),
    "var": lambda m, x: x.var(-1), "std": lambda m, x: x.std(0),
}


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_a_verb_made_of_several_primitives_rounds_a_half_type_once_as_torchs_kernels(half):
    """silu, softplus, cumsum, var... on a half type: computed in float32 and rounded once, as
    torch's kernels compute them (each primitive rounding to the half type put 10-60% of the
    elements an ulp or more away, cumsum's running sum up to 0.4 in bfloat16)."""
    x = (np.random.default_rng(2).random((32, 64)).astype(np.float32) * 8 - 4)
    dt = getattr(mica, half)
    got = mica.compile(lambda a: [f(mica, a.to(dt)).float() for f in _COMPOSITES.values()])(x)
    tx = torch.tensor(x).to(getattr(torch, half))
    for name, g in zip(_COMPOSITES, got):
        want = _COMPOSITES[name](torch, tx).float().numpy()
        once = _COMPOSITES[name](torch, tx.float()).to(getattr(torch, half)).float().numpy()
        g = np.asarray(g)
        assert np.array_equal(np.isnan(g), np.isnan(once)), name
        ulp = np.maximum(np.abs(once) * (2.0 ** -7 if half == "bfloat16" else 2.0 ** -10),
                         2.0 ** -133 if half == "bfloat16" else 2.0 ** -24)  # (the subnormals' spacing)
        assert np.nanmax(np.abs(g - once) / ulp) <= 1.0, name  # (float32's rounding, then the half type's once)
        agree = np.mean((g == want) | (np.isnan(g) & np.isnan(want)))
        assert agree > (0.9 if name in ("var", "std", "cumprod") else 0.97), (name, agree)


@pytest.mark.parametrize("equation,shapes", [
    ("i,j->ij", [(4,), (5,)]), ("ij,ij->ij", [(3, 4), (3, 4)]), ("bi,bj->bij", [(2, 3), (2, 4)]),
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("ij,ij->i", [(3, 4), (3, 4)]), ("i,i->", [(4,), (4,)]),
    ("bij,bkj->bik", [(2, 3, 4), (2, 5, 4)]), ("bij->bji", [(2, 3, 4)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)])])
def test_einsum_under_autocast_casts_only_where_torchs_sums_as_a_product(equation, shapes):
    """An outside tester's: an outer or elementwise einsum under autocast was bfloat16; torch's
    multiplies there (no matmul, so no cast) and stays float32."""
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]

    def f(*xs):
        with mica.autocast(dtype=mica.bfloat16):
            return mica.einsum(equation, *xs)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch.einsum(equation, *[torch.tensor(a) for a in arrays])
    program = mica.trace(f, *[mica.Spec(s, mica.float32) for s in shapes])
    assert program.graph.outputs[0].dtype.name == str(want.dtype).removeprefix("torch.")
    np.testing.assert_array_equal(np.asarray(mica.compile(f)(*arrays)), want.float().numpy())


def test_half_type_constants_hold_their_values_on_every_target(tmp_path):
    """An outside tester's LLaMA after model.bfloat16(): its rotary inv_freq buffer, a bfloat16
    constant of the program, was written into the C source as float literals of a 16-bit integer
    type (1.0 became the bits 0x0001), so cos and sin were garbage and q's gradient 140% off; a
    float16 constant stopped the build. Now both are their bits (MICA_F16_LIT), and the CPU, the
    oracle, the CUDA simulator and nvcc agree."""
    import subprocess

    from test_cuda import _has_boost_context

    values = np.float32([1.0, 0.1, -0.01, 1e-3, 3.0e38, np.inf, -0.0, 65504.0])

    def f(x):
        a = mica.tensor(values, dtype=mica.bfloat16).float()
        b = mica.tensor(values, dtype=mica.float16).float()
        return a + x, b + x

    program = mica.trace(f, mica.f32[8])
    x = np.zeros(8, np.float32)
    want = (torch.tensor(values).bfloat16().float().numpy(), torch.tensor(values).half().float().numpy())
    runs = [program.lower("cpu").build(), lambda a: mica.reference.run(program, a, precision="float32")]
    runs += [program.lower("cuda", simulate=True).build()] if _has_boost_context() else []
    for run in runs:
        for got, w in zip(run(x), want):
            np.testing.assert_array_equal(np.asarray(got), w)

    class Rotary(mica.nn.Module):  # (the tester's case: a float buffer of a module made bfloat16)
        def __init__(self):
            super().__init__()
            self.register_buffer("inv_freq", 1.0 / (10000 ** (mica.arange(0, 8, 2).float() / 8)), persistent=False)

    r = Rotary().bfloat16()
    got = np.asarray(mica.compile(lambda p: (r.inv_freq.float()[:, None] * p).cos())(np.arange(4, dtype=np.float32)))
    t = (1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))).bfloat16()
    np.testing.assert_allclose(got, (t.float()[:, None] * torch.arange(4).float()).cos().numpy(), rtol=3e-7,
                               atol=1e-7)  # (the buffer's values exact; cos within an ulp of torch's)
    from test_cuda import _nvcc, _wheels

    if _nvcc() and _wheels():  # (nvcc takes the __half initializers: MICA_F16_LIT's constexpr form)
        from mica.backends.cuda import build

        src = tmp_path / "literals.cu"
        src.write_text(program.lower("cuda").source)
        r = subprocess.run(build.nvcc_command(str(src), str(tmp_path / "literals.o"), shared=False,
                                              archs=[build.ARCHS[0]], ptx=False), capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_a_second_half_type_fuzz_finds_torchs_values(half):
    """An outside half-type fuzzer's findings, each against torch on the same rounded inputs:
    a number written into a slice of a half tensor was stored as raw bits (x[:, 0] = 0.1 gave 0);
    a Python number beside a half tensor was rounded to the half type first (x * 0.1 an ulp off on
    20-40% of elements; torch keeps it in float32); a folded cast of a half constant forgot its
    rounding; lerp, addcmul, addcdiv, logaddexp and smooth_l1 rounded at every step; float16
    binary_cross_entropy at 0 or 1 was NaN; cross_entropy of half logits with float32
    probabilities was half (torch: float32)."""
    rng = np.random.default_rng(11)
    x, y = ((rng.standard_normal(2048) * 4).astype(np.float32) for _ in range(2))
    T, M = torch, mica
    cases = {
        "slice": lambda m, a, b: _written(m, a, half),
        "x*0.1": lambda m, a, b: a * 0.1,
        "x/0.3": lambda m, a, b: a / 0.3,
        "leaky": lambda m, a, b: m.nn.functional.leaky_relu(a, 0.1),
        "add alpha": lambda m, a, b: m.add(a, b, alpha=0.1), "lerp": lambda m, a, b: m.lerp(a, b, 0.75),
        "addcmul": lambda m, a, b: m.addcmul(a, b, a, value=0.5),
        "addcdiv": lambda m, a, b: m.addcdiv(a, b, a.abs() + 1, value=2),
        "logaddexp": lambda m, a, b: m.logaddexp(a, b),
        "smooth_l1": lambda m, a, b: m.nn.functional.smooth_l1_loss(a, b, beta=0.7, reduction="none"),
        "bce at 0 and 1": lambda m, a, b: m.nn.functional.binary_cross_entropy(
            m.clamp(a, 0, 1).round(), m.clamp(b, 0, 1).round(), reduction="none"),
    }
    if half == "float16":
        del cases["smooth_l1"]  # (torch's float16 smooth_l1 rounds in float16 within: Mica keeps float32's digits)
    for name, fn in cases.items():
        want = fn(T, torch.tensor(x).to(getattr(T, half)), torch.tensor(y).to(getattr(T, half))).float().numpy()
        got = np.asarray(mica.compile(lambda a, b: fn(M, a.to(getattr(M, half)), b.to(getattr(M, half))).float())(x, y))
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert float(mica.compile(lambda a: mica.full((), 0.1, dtype=getattr(M, half)).float() + a)(np.float32(0))) == \
        torch.tensor(0.1).to(getattr(T, half)).float().item()
    p, logits = np.float32([[.2, .3, .5], [.6, .3, .1]]), np.float32([[1, 2, 3], [.5, -1, 2]])
    got = mica.compile(lambda a, b: F.cross_entropy(a.to(getattr(M, half)), b))(logits, p)
    want = torch.nn.functional.cross_entropy(torch.tensor(logits).to(getattr(T, half)), torch.tensor(p))
    assert got.dtype == np.float32 and want.dtype == torch.float32  # (the log-probabilities within the half
    assert rel_err(float(got), want.item()) < 2 ** -8                # type's rounding: Mica's are rounded once)
    xf, yh = torch.tensor(x[:64]), torch.tensor(y[:64]).to(getattr(T, half))
    np.testing.assert_array_equal(  # (a float32 input with half operands: float32 throughout, as torch's)
        np.asarray(mica.compile(lambda a, b: mica.addcmul(a, b.to(getattr(M, half)), b.to(getattr(M, half)),
                                                          value=0.5))(x[:64], y[:64])),
        torch.addcmul(xf, yh, yh, value=0.5).numpy())


def _written(m, a, half):
    z = a.clone()
    z[:8] = 2.5
    z[8:16] = 0.1
    z[16] = -1.0
    return z


_BIASED = {  # (torch's verbs that add to a product's float32 sums and round once)
    "linear 2-d": (lambda m, x, w, b: m.nn.functional.linear(x, w, b), ((16, 48), (40, 48), (40,))),
    "linear 3-d": (lambda m, x, w, b: m.nn.functional.linear(x, w, b), ((3, 16, 48), (40, 48), (40,))),
    "addmm": (lambda m, x, w, b: m.addmm(b, x, w.T, beta=0.5, alpha=2), ((16, 48), (40, 48), (16, 40))),
    "baddbmm": (lambda m, x, w, b: m.baddbmm(b, x, w.T.expand(3, 48, 40)), ((3, 16, 48), (40, 48), (3, 16, 40))),
    "addbmm": (lambda m, x, w, b: m.addbmm(b, x, w, beta=0.5, alpha=2), ((4, 16, 48), (4, 48, 24), (16, 24))),
    "addmv": (lambda m, x, w, b: m.addmv(b, x, w), ((40, 64), (64,), (40,))),
}


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_a_bias_joins_the_products_float32_sums_and_is_rounded_once_as_torchs(half):
    """F.linear with a bias, addmm, baddbmm and addmv in a half type: torch adds the bias to the
    product's float32 sums and rounds once (addbmm: once per batch, as its addmm per batch); Mica
    rounded the product, then the sum (30% of the elements an ulp off, up to 20 ulps where the bias
    cancels the product). Now the product keeps its sums in float32 (matmul's dtype=float32,
    visible in the IR) and the sum is rounded once: bfloat16 gives torch's bits; float16 too but
    where torch's CPU kernel sums in another order. The simulator (cuBLASLt's half operands with a
    float32 C) gives the CPU's bits where OpenBLAS's kernel sums each element in k order as the
    simulator's product does (AVX-512 machines); where it does not (an AVX2-only machine: one
    element in 1920), the same values to the half type's rounding."""
    from test_cuda import _has_boost_context

    rng = np.random.default_rng(7)
    dt, tdt = getattr(mica, half), getattr(torch, half)
    for name, (f, shapes) in _BIASED.items():
        arrays = [rng.standard_normal(s).astype(np.float32) * (3 if i == 2 else 1) for i, s in enumerate(shapes)]
        arrays = [torch.tensor(a).to(tdt).float().numpy() for a in arrays]  # (values the half type holds)
        program = mica.trace(lambda x, w, b: f(mica, x, w, b).float(), *[dt[s] for s in shapes])
        assert "dtype=f32" in [ln for ln in program.ir.splitlines() if " matmul " in ln][0], name
        want = f(torch, *[torch.tensor(a).to(tdt) for a in arrays]).float().numpy()
        got = np.asarray(program.lower("cpu").build()(*arrays))
        same = np.mean(got == want)
        ulp = np.abs(want) * (2.0 ** -8 if half == "bfloat16" else 2.0 ** -11)
        assert same == 1.0 if half == "bfloat16" else same > 0.99, (name, same)
        assert np.all(np.abs(got - want) <= ulp + 1e-3), name  # (float16: float32 sums in another order, one rounding)
        oracle = mica.reference.run(program, *arrays, precision="float32")
        assert np.mean(np.asarray(oracle) == got) > 0.99, name
        if _has_boost_context() and name in ("linear 3-d", "baddbmm"):  # (one product and a batched one: the
            sim = np.asarray(program.lower("cuda", simulate=True).build()(*arrays))  # simulator's builds are slow)
            assert np.mean(sim == got) > 0.99 and np.all(np.abs(sim - got) <= ulp + 1e-3), name
            if "avx512f" in open("/proc/cpuinfo").read():  # (OpenBLAS's AVX-512 kernels sum in k order)
                np.testing.assert_array_equal(sim, got)


def test_a_biased_linears_gradients_under_autocast_are_torchs():
    """The float32 product's gradient is taken in the half type (its cotangent rounded back, as the
    half result's was): the gradients of a step under autocast are torch's autocast gradients."""
    rng = np.random.default_rng(8)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 16, 48), (40, 48), (40,)))

    def step(x, w, b):
        with mica.autocast(dtype=mica.bfloat16):
            y = mica.nn.functional.linear(x, w, b)
        loss = (y.float() ** 2).mean()
        return (loss,) + tuple(mica.grad(loss, [x, w, b]))

    got = mica.compile(step)(x, w, b)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ty = torch.nn.functional.linear(tx, tw, tb)
    tloss = (ty.float() ** 2).mean()
    tloss.backward()
    assert float(got[0]) == pytest.approx(tloss.item(), rel=1e-6)
    for g, t in zip(got[1:], (tx.grad, tw.grad, tb.grad)):
        t = t.numpy()
        assert np.asarray(g).dtype == np.float32
        assert np.max(np.abs(np.asarray(g) - t)) <= 2.0 ** -7 * np.max(np.abs(t))  # (a bfloat16 ulp of the largest)


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_geluss_gradient_in_a_half_type_is_rounded_once_as_torchs(half, approximate):
    """An outside tester's: GELU's gradient in bfloat16 was its slope rounded to bfloat16, then the
    product rounded again (2.5e-3 relative error against float64, torch's 1.6e-3; 73% of elements
    torch's bits). Now slope and product are float32, rounded once, as torch's gelu_backward."""
    rng = np.random.default_rng(9)
    dt, tdt = getattr(mica, half), getattr(torch, half)
    x, g = (torch.tensor(rng.standard_normal(4096).astype(np.float32) * 3).to(tdt).float().numpy() for _ in range(2))

    def f(x, g):
        y = mica.nn.functional.gelu(x, approximate=approximate)
        return mica.grad((y.float() * g.float()).sum(), x).float()

    got = np.asarray(mica.compile(f, dt[4096], dt[4096])(x, g))
    tx = torch.tensor(x).to(tdt).requires_grad_()
    torch.nn.functional.gelu(tx, approximate=approximate).backward(torch.tensor(g).to(tdt))
    want = tx.grad.float().numpy()
    ulp = np.maximum(np.abs(want), np.abs(got)) * (2.0 ** -7 if half == "bfloat16" else 2.0 ** -10)
    assert np.all(np.abs(got - want) <= ulp + 1e-5)  # (float32's last bits of erf and exp; below -5, where
    # torch's float32 arithmetic gives 0, Mica's keeps some of the true 1e-8 to 1e-5)
    assert np.mean(got == want) > 0.95
    exact = (np.asarray(g, np.float64) * torch.ops.aten.gelu_backward(
        torch.ones(4096, dtype=torch.float64), torch.tensor(x, dtype=torch.float64), approximate=approximate).numpy())
    err = lambda v: np.linalg.norm(v - exact) / np.linalg.norm(exact)  # noqa: E731
    assert err(got) <= err(want) * 1.05  # (before: 1.5x torch's)
