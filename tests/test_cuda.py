"""The NVIDIA target: CUDA C from the shared pipeline, compiled by nvcc for every architecture and
run here, without a GPU, on the CPU simulator that runs the very same source. Mica's own kernels
give the same bits in the simulator as on the CPU target (and so as on a card: no FMA contraction,
Mica's own math); only products may differ (cuBLASLt, OpenBLAS and the simulator's plain product
each sum in their own order)."""
import os
import re
import shutil
import sys
import subprocess

import numpy as np
import pytest
from pathlib import Path

import mica
from helpers import rel_err
from mica.errors import MicaError


def _has_boost_context():
    return os.path.exists("/usr/include/boost/context/fiber.hpp") or os.path.exists(
        "/usr/include/boost/context/continuation.hpp")


needs_simulator = pytest.mark.skipif(not _has_boost_context(), reason="libboost-context-dev is not installed")


def _nvcc():
    return shutil.which("nvcc") or ("/usr/local/bin/nvcc" if os.path.exists("/usr/local/bin/nvcc") else None)


def _wheels():
    try:
        import nvidia.cu13  # noqa: F401
    except ImportError:
        return False
    return True


needs_nvcc = pytest.mark.skipif(not (_nvcc() and _wheels()),
                                reason="nvcc or the nvidia-cublas / nvidia-cuda-runtime wheels are missing")

SHAPES = ((24, 40), (40, 8), (16, 24), (16, 8))


def mlp_step(dropout=0.0):
    """A two-layer MLP's SGD step: products, GELU, dropout, a mean, the backward, an update."""
    def step(w1, w2, x, y):
        h = mica.gelu(x @ w1)
        if dropout:
            h = mica.dropout(h, dropout, training=True)
        loss = ((h @ w2) - y).square().mean()
        g1, g2 = mica.grad(loss, [w1, w2])
        return {"loss": loss, "w1": w1 - 0.1 * g1, "w2": w2 - 0.1 * g2, "col": g1.sum(dim=0), "t": g2.transpose(0, 1)}

    return mica.trace(step, *(mica.f32[s] for s in SHAPES))


def no_products():
    """Only Mica's own kernels: loops (GELU, dropout, tanh, exp), reductions over rows, columns and
    everything, a pad and a concat."""
    def step(x, z):
        h = mica.dropout(mica.gelu(x) * mica.tanh(z[:, :40]) + mica.exp(-x.abs()), 0.25, training=True)
        rows, cols, total = h.sum(dim=1), h.amax(dim=0), (h * h).sum()
        both = mica.cat([h, z[:, 40:]], dim=1)
        padded = mica.grad((mica.tanh(z[:, 3:40:2]) * 2.0).sum(), z)  # a slice's gradient is a pad
        return {"rows": rows, "cols": cols, "total": total, "both": both, "padded": padded}

    return mica.trace(step, mica.f32[33, 40], mica.f32[33, 57])


def row_kernels():
    """Every row kernel the CUDA target has, forward and backward, and no product: embedding,
    layer norm, RMS norm, softmax, log-softmax, cross-entropy."""
    F = mica.nn.functional

    def step(wte, w, b, idx, targets):
        x = F.embedding(idx, wte)
        h = F.rms_norm(F.layer_norm(x, (24,), w, b), (24,), w)
        h = mica.softmax(h, dim=-1) * 3.0 + mica.log_softmax(h * 2.0, dim=-1)
        loss = F.cross_entropy(h.view(-1, 24), targets.view(-1))
        g_wte, g_w, g_b = mica.grad(loss, [wte, w, b])
        return {"loss": loss, "wte": g_wte, "w": g_w, "b": g_b}

    return mica.trace(step, mica.f32[30, 24], mica.f32[24], mica.f32[24], mica.i64[3, 7], mica.i64[3, 7])


def half_products(dtype):
    """Products of a half type under autocast: plain, with a transposed operand, batched, and the
    backward's (which read the half operands' transposes)."""
    def step(x, w, q, k):
        with mica.autocast(device_type="cuda", dtype=dtype):
            y = x @ w
            s = q @ k.transpose(-2, -1)
            t = x.transpose(0, 1) @ x
        loss = (y.float() * y.float()).sum() + s.float().sum() + t.float().mean()
        gx, gw = mica.grad(loss, [x, w])
        return {"y": y, "s": s, "t": t, "gx": gx, "gw": gw}

    return mica.trace(step, mica.f32[12, 20], mica.f32[20, 9], mica.f32[2, 3, 5, 8], mica.f32[2, 3, 7, 8])


def row_data():
    rng = np.random.default_rng(4)
    wte, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((30, 24), (24,), (24,)))
    idx = rng.integers(0, 30, (3, 7))
    idx[0, :3] = 5  # a row used several times: embedding's backward sums in position order
    return wte, w, b, idx, rng.integers(0, 24, (3, 7))


def data(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


@needs_simulator
def test_the_simulated_step_matches_the_float64_oracle():
    program = mlp_step(dropout=0.1)
    args = data(SHAPES)
    got = program.lower("cuda", simulate=True).build()(*args, seed=5)
    want = mica.reference.run(program, *args, seed=5)
    assert rel_err(got["loss"], want["loss"]) < 1e-5
    for k in ("w1", "w2", "col", "t"):
        assert rel_err(got[k], want[k]) < 1e-4, k


@needs_simulator
def test_the_same_bits_for_any_launch_configuration():
    program = mlp_step(dropout=0.1)
    args = data(SHAPES)
    runs = [program.lower("cuda", simulate=True, threads_per_block=t).build()(*args, seed=3) for t in (32, 256, 1024)]
    for r in runs[1:]:
        for k in r:
            assert np.array_equal(r[k], runs[0][k]), k


@needs_simulator
@pytest.mark.parametrize("dtype", [mica.bfloat16, mica.float16], ids=["bfloat16", "float16"])
def test_half_products_go_to_cublaslt_as_they_are_and_keep_the_widened_bits(dtype, monkeypatch):
    """The CUDA target takes half products itself (cuBLASLt's 16BF/16F with COMPUTE_32F): no casts
    around them in the source; in the simulator they give the bits of the same product widened to
    float32 and rounded once, and match the oracle's half-rounding mode to one rounding."""
    from mica.backends.cuda.target import CudaTarget

    program = half_products(dtype)
    args = data(((12, 20), (20, 9), (2, 3, 5, 8), (2, 3, 7, 8)), seed=6)
    native = program.lower("cuda", simulate=True)
    suffix = "bf16" if dtype is mica.bfloat16 else "f16"
    assert f"mica_gemm_{suffix}(" in native.source and "mica_gemm_f32(" not in native.source
    got = native.build()(*args)
    monkeypatch.setattr(CudaTarget, "half_kernel", lambda self, op, dtype=None: False)
    widened = program.lower("cuda", simulate=True)
    assert "mica_gemm_f32(" in widened.source and f"mica_gemm_{suffix}(" not in widened.source
    want = widened.build()(*args)
    for k in got:
        assert np.array_equal(got[k], want[k]), k
    oracle = mica.reference.run(program, *args, precision="float32")
    eps = 2.0 ** -8 if dtype is mica.bfloat16 else 2.0 ** -11
    for k in ("y", "s", "t"):
        assert rel_err(got[k], oracle[k]) <= 2 * eps, k


@needs_simulator
def test_mica_kernels_give_the_cpu_targets_bits():
    program = no_products()
    args = data(((33, 40), (33, 57)), seed=1)
    cuda = program.lower("cuda", simulate=True).build()(*args, seed=9)
    cpu = program.lower("cpu").build()(*args, seed=9, threads=2)
    want = mica.reference.run(program, *args, seed=9)
    for k in cpu:
        assert np.array_equal(cuda[k], cpu[k]), k
        assert rel_err(cuda[k], want[k]) < 1e-5, k


@needs_simulator
@pytest.mark.parametrize("dt", [mica.f32, mica.f64], ids=["float32", "float64"])
def test_long_reductions_run_by_lanes_and_keep_the_cpu_targets_bits(dt):
    """Columns over 9,000 rows, a sum over 140,014 elements (18 blocks of 8,192), a max, a mean:
    lanes of blocks summed by separate threads, then combined in the canonical order."""
    def step(x, y):
        return {"cols": x.sum(dim=0), "rows": x.sum(dim=1), "all": (x * x).sum(), "mx": x.amax(dim=0),
                "y": y.sum(dim=(0, 2)), "m": y.mean(), "short": y[:, :50, 0].sum(dim=1)}

    program = mica.trace(step, dt[9000, 3], dt[7, 20001, 2])
    rng = np.random.default_rng(8)
    kind = np.float32 if dt is mica.f32 else np.float64
    args = [rng.standard_normal((9000, 3)).astype(kind), rng.standard_normal((7, 20001, 2)).astype(kind)]
    cpu = program.lower("cpu").build()(*args, threads=2)
    assert "_lanes" in program.lower("cuda", simulate=True).source
    for threads in (32, 1024):
        got = program.lower("cuda", simulate=True, threads_per_block=threads).build()(*args)
        for k in cpu:
            assert np.array_equal(got[k], cpu[k]), (k, threads)


@needs_simulator
def test_the_row_kernels_give_the_cpu_targets_bits():
    program = row_kernels()
    args = row_data()
    cuda = program.lower("cuda", simulate=True).build()(*args)
    cpu = program.lower("cpu").build()(*args, threads=2)
    want = mica.reference.run(program, *args)
    for k in cpu:
        assert np.array_equal(cuda[k], cpu[k]), k
        assert rel_err(cuda[k], want[k]) < 1e-4, k


@needs_simulator
def test_results_with_no_elements_run_no_loop():
    """A kernel whose output has no elements ran its loop once (divisions by a dim of 0: SIGFPE in
    the simulator) and wrote element 0 of its empty buffer, which the plan lays over a live one (a
    loss three times too large): now nothing runs, on the CPU's values."""
    F = mica.nn.functional

    def step(x, e, w):
        loss, grads = mica.value_and_grad(lambda x, e, w: x.sum() + (e * w).sum(), argnums=(0, 1, 2))(x, e, w)
        empty = x[:, 2:2] * 2.0
        return (loss, grads, empty, F.softmax(empty, -1).sum() + F.log_softmax(x[:0], 0).sum()
                + mica.logsumexp(e, dim=1).sum())

    program = mica.trace(step, mica.f32[3, 4], mica.f32[3, 0, 4], mica.f32[1, 0, 4])
    x = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5) / 7
    e, w = np.zeros((3, 0, 4), np.float32), np.zeros((1, 0, 4), np.float32)
    cuda = program.lower("cuda", simulate=True).build()(x, e, w)
    cpu = program.lower("cpu").build()(x, e, w)
    assert float(cuda[0]) == float(cpu[0]) and abs(float(cuda[0]) - x.astype(np.float64).sum()) < 1e-6
    assert float(cuda[3]) == float(cpu[3]) == -np.inf  # (log of an empty sum, as torch's logsumexp)
    assert cuda[2].shape == (3, 0) and all(np.array_equal(a, b) for a, b in zip(cuda[1], cpu[1]))


@needs_simulator
def test_an_index_out_of_range_is_a_sentence_on_the_device():
    program = row_kernels()
    wte, w, b, idx, targets = row_data()
    idx[1, 2] = 30
    exe = program.lower("cuda", simulate=True).build()
    with pytest.raises(MicaError, match="embedding: index 30 is out of range for 30 embeddings"):
        exe(wte, w, b, idx, targets)
    idx[1, 2] = 3  # and the program runs again afterwards
    assert np.isfinite(exe(wte, w, b, idx, targets)["loss"])


# ---- the cooperative row kernels: 8 threads per row, the CPU's bits at every width -----------------
THREADS = (32, 256, 1024)
WIDTHS = (1, 7, 8, 9, 8191, 8192, 8193, 20000)  # around the sums' 8 lanes and their blocks of 8192


def _builds(program, threads=THREADS):
    """The CPU target's executable and the simulator's for each threads_per_block, built at once."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1 + len(threads)) as pool:
        cpu = pool.submit(lambda: program.lower("cpu").build())
        sims = [pool.submit(lambda t=t: program.lower("cuda", simulate=True, threads_per_block=t).build())
                for t in threads]
        return cpu.result(), [f.result() for f in sims]


def _same_bits(a, b):
    from mica.pytree import flatten

    fa, fb = flatten(a)[0], flatten(b)[0]
    return len(fa) == len(fb) and all(np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(fa, fb))


def every_row_kernel(rows, dtype, widths=WIDTHS, attention=None):
    """For each width n: layer norm (weight and bias), RMS norm (weight), softmax, log-softmax and
    cross-entropy (per row, one target ignored) of [rows, n] inputs, and the gradients of their
    inputs and weights (the row backward kernels and the norms' column sums). With `attention`
    (an attention_step case), that attention too, in the same element type (one more input)."""
    F = mica.nn.functional
    T = mica.f32 if dtype == np.float32 else mica.f64

    def step(inputs):
        out = {}
        for n in widths:
            x1, x2, x3, x4, x5, w1, b1, w2, t, g, gl = inputs[f"n{n}"]
            ln, rms = F.layer_norm(x1, (n,), w1, b1), F.rms_norm(x2, (n,), w2)
            sm, lsm = mica.softmax(x3, dim=-1), mica.log_softmax(x4, dim=-1)
            ce = F.cross_entropy(x5, t, reduction="none")
            loss = (ln * g).sum() + (rms * g).sum() + (sm * g).sum() + (lsm * g).sum() + (ce * gl).sum()
            grads = mica.grad(loss, [x1, x2, x3, x4, x5, w1, b1, w2])
            out[f"n{n}"] = dict(ln=ln, rms=rms, sm=sm, lsm=lsm, ce=ce,
                                **dict(zip(("dx1", "dx2", "dx3", "dx4", "dx5", "dw1", "db1", "dw2"), grads)))
        return out

    specs = {f"n{n}": (*[T[rows, n]] * 5, T[n], T[n], T[n], mica.i64[rows], T[rows, n], T[rows]) for n in widths}
    if attention is None:
        return mica.trace(step, specs)
    attend, shapes = attention_cases_step([attention])
    return mica.trace(lambda rows, qkvg: {**step(rows), **attend(qkvg)}, specs, [tuple(T[s] for s in shapes[0])])


def every_row_kernel_data(rows, dtype, widths=WIDTHS, seed=0):
    rng = np.random.default_rng(seed)
    data = {}
    for n in widths:
        xs = [(rng.standard_normal((rows, n)) * scale + shift).astype(dtype)
              for scale, shift in ((1, 0.5), (2, 0), (3, 0), (3, -1), (4, 0))]
        ws = [rng.standard_normal(n).astype(dtype) for _ in range(3)]
        t = rng.integers(0, n, rows)
        t[1 % rows] = -100 if rows > 1 else t[0]  # an ignored target
        data[f"n{n}"] = (*xs, *ws, t, rng.standard_normal((rows, n)).astype(dtype),
                         rng.standard_normal(rows).astype(dtype))
    return data


@needs_simulator
@pytest.mark.parametrize("rows", [1, 37])
@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64, marks=pytest.mark.slow)])
def test_every_row_kernel_gives_the_cpu_targets_bits_at_every_width(rows, dtype):
    """Rows of 1, 7, 8, 9, 8191, 8192, 8193 and 20000 elements, one row or many (more than a block
    of 32 threads holds), float32 and float64: the simulator's bits are the CPU target's for 32,
    256 and 1024 threads per block."""
    program = every_row_kernel(rows, dtype)
    args = every_row_kernel_data(rows, dtype)
    cpu_exe, sims = _builds(program)
    cpu = cpu_exe(args, threads=2)
    for threads, exe in zip(THREADS, sims):
        got = exe(args)
        for n in WIDTHS:
            for k, want in cpu[f"n{n}"].items():
                assert np.asarray(got[f"n{n}"][k]).tobytes() == np.asarray(want).tobytes(), (threads, n, k)
    oracle = mica.reference.run(program, args)
    for n in WIDTHS[1:]:  # (a norm's gradient over one element is all cancellation)
        for k in cpu[f"n{n}"]:
            assert rel_err(cpu[f"n{n}"][k], oracle[f"n{n}"][k]) < (1e-4 if dtype == np.float32 else 1e-11), (n, k)


@needs_simulator
def test_the_row_kernels_keep_their_bits_when_the_grid_strides():
    """300000 rows need 2.4 million threads: with 32 threads per block that is more than
    mica_blocks' 65535 blocks, so every group of 8 also takes rows further on."""
    F = mica.nn.functional
    rows = 300000

    def step(x, w, b, g):
        y = F.layer_norm(x, (1,), w, b) + mica.softmax(x, dim=-1) + F.rms_norm(x, (1,), w)
        dx, dw, db = mica.grad((y * g).sum(), [x, w, b])
        return {"y": y, "dx": dx, "dw": dw, "db": db}

    program = mica.trace(step, mica.f32[rows, 1], mica.f32[1], mica.f32[1], mica.f32[rows, 1])
    assert "mica_blocks(2400000)" in program.lower("cuda").source
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((rows, 1), (1,), (1,), (rows, 1))]
    cpu_exe, (sim,) = _builds(program, threads=(32,))
    assert _same_bits(sim(*args), cpu_exe(*args, threads=2))


@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda-sim", marks=needs_simulator)])
def test_embedding_takes_int32_indices_as_pytorch_does(target):
    """int32 indices (PyTorch takes them) pick the same rows and sum the same gradients as int64
    ones: the verb casts them (a visible node). The kernels read int64, so an int32 buffer was read
    two indices at a time on the CPU (wrong rows, silently) and did not compile for CUDA."""
    F = mica.nn.functional
    rng = np.random.default_rng(32)
    w = rng.standard_normal((9, 5)).astype(np.float32)
    idx = rng.integers(0, 9, (3, 7)).astype(np.int32)
    g = rng.standard_normal((3, 7, 5)).astype(np.float32)

    def step(w, idx, g):
        out = F.embedding(idx, w)
        return out, mica.grad((out * g).sum(), w)

    program = mica.trace(step, mica.f32[9, 5], mica.i32[3, 7], mica.f32[3, 7, 5])
    assert "cast" in program.ir and "dtype=i64" in program.ir
    options = {"simulate": True} if target == "cuda-sim" else {}
    out, grad = program.lower(target.split("-")[0], **options).build()(w, idx, g)
    assert np.array_equal(np.asarray(out), w[idx])
    want = np.zeros_like(w, dtype=np.float64)
    np.add.at(want, idx.reshape(-1), g.reshape(-1, 5).astype(np.float64))
    assert np.abs(np.asarray(grad) - want).max() <= 1e-5 * np.abs(want).max()


@needs_simulator
def test_embedding_and_its_backward_give_the_cpu_targets_bits():
    """Tables of 1, 7, 9 and 40 columns; positions that repeat a row (its gradients summed in
    position order), rows no position names (zero gradients), several vocabulary rows per block."""
    F = mica.nn.functional
    dims, V, count = (1, 7, 9, 40), 50, (6, 53)

    def step(idx, tables, grads):
        out = {}
        for D, w, g in zip(dims, tables, grads):
            y = F.embedding(idx, w)
            out[f"y{D}"], out[f"dw{D}"] = y, mica.grad((y * g).sum(), w)
        return out

    program = mica.trace(step, mica.i64[count], tuple(mica.f32[V, D] for D in dims),
                         tuple(mica.f32[(*count, D)] for D in dims))
    rng = np.random.default_rng(5)
    idx = rng.integers(0, V - 10, count)  # the last 10 rows are never named
    idx[0, :9] = 3
    args = (idx, tuple(rng.standard_normal((V, D)).astype(np.float32) for D in dims),
            tuple(rng.standard_normal((*count, D)).astype(np.float32) for D in dims))
    cpu_exe, sims = _builds(program)
    cpu = cpu_exe(*args, threads=2)
    for threads, exe in zip(THREADS, sims):
        assert _same_bits(exe(*args), cpu), threads
    assert not cpu["dw40"][V - 10:].any() and cpu["dw9"][3].any()


@needs_simulator
@pytest.mark.parametrize("count", [3000, 70001])
def test_embedding_backward_keeps_position_order_across_its_chunks(count):
    """embedding_backward orders the positions chunk by chunk (1024 to a block, 2048 past 64 chunks:
    lowerings.embedding_chunk): a few rows named thousands of times across every chunk's border,
    one row only in the last chunk, one index repeated at each border, still the CPU's bits (the
    sum of a row's gradients in increasing position) for 32, 256 and 1024 threads per block."""
    from mica.backends.cuda.lowerings import embedding_chunk

    F = mica.nn.functional
    V, D = 9, 6
    assert embedding_chunk(3000) == 1024 and embedding_chunk(70001) == 2048 and embedding_chunk(10**7) == 8192

    def step(idx, w, g):
        return mica.grad((F.embedding(idx, w) * g).sum(), w)

    program = mica.trace(step, mica.i64[count], mica.f32[V, D], mica.f32[count, D])
    rng = np.random.default_rng(count)
    idx = rng.integers(0, V - 2, count)
    idx[-1] = V - 2  # a row only the last position names (the last row: none)
    for border in range(embedding_chunk(count), count, embedding_chunk(count)):
        idx[border - 1:border + 1] = 4
    args = (idx, rng.standard_normal((V, D)).astype(np.float32),
            (rng.standard_normal((count, D)) * 10.0 ** rng.integers(-3, 4, (count, 1))).astype(np.float32))
    cpu_exe, sims = _builds(program)
    cpu = cpu_exe(*args, threads=2)
    for threads, exe in zip(THREADS, sims):
        assert np.asarray(exe(*args)).tobytes() == np.asarray(cpu).tobytes(), threads
    assert not cpu[V - 1].any() and cpu[V - 2].any()
    want = np.zeros((V, D))
    np.add.at(want, idx, args[2].astype(np.float64))
    assert rel_err(cpu, want) < 1e-5


@needs_simulator
def test_the_cooperative_sum_and_max_give_the_sequential_bits(tmp_path):
    """mica_cuda_kernels.h's helpers against mica_sum, MICA_SUM_EXPR and mica_row_max on their own
    (tests/cudasim/coop_rows.cu): random magnitudes, NaNs with different payloads, signed zeros and
    tied maxima, infinities, widths 0..20000; 32, 256 and 1024 threads per block, and once under
    AddressSanitizer."""
    import concurrent.futures

    from mica.backends.cuda import build

    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cudasim", "coop_rows.cu")
    builds = [(t, False) for t in THREADS] + [(256, True)]

    def compile_one(threads, sanitize):
        exe = str(tmp_path / f"coop_rows_{threads}{'_asan' if sanitize else ''}")
        cmd = build.simulator_command(src, exe, threads_per_block=threads, sanitize=sanitize, shared=False)
        cmd = [c for c in cmd if c != "-c"] + ["-lboost_context", "-lpthread"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return exe

    with concurrent.futures.ThreadPoolExecutor(len(builds)) as pool:
        exes = list(pool.map(lambda b: compile_one(*b), builds))
    for (threads, sanitize), exe in zip(builds, exes):
        r = subprocess.run([exe], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, MICA_CUDASIM_THREADS="2", ASAN_OPTIONS="detect_leaks=1"))
        assert r.returncode == 0 and r.stderr == "", (threads, sanitize, r.stdout, r.stderr)
        assert r.stdout.split("\n")[:2] == ["f32 720 same bits", "f64 720 same bits"], r.stdout


def test_a_block_size_that_splits_a_row_group_is_a_sentence():
    with pytest.raises(MicaError, match="threads_per_block must be a multiple of 8 from 8 to 1024"):
        row_kernels().lower("cuda", simulate=True, threads_per_block=100)


def attention_step(causal, dropout_p, q=(3, 2, 5, 8), k=None, v=None, dtype=mica.f32):
    """Attention's forward and the gradients of q, k and v (against a random output gradient)."""
    F = mica.nn.functional

    def step(q, k, v, g):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout_p)
        dq, dk, dv = mica.grad((o * g).sum(), [q, k, v])
        return {"o": o, "dq": dq, "dk": dk, "dv": dv}

    k, v = k or q, v or k or q
    shapes = (q, k, v, q[:-1] + v[-1:])
    return mica.trace(step, *(dtype[s] for s in shapes)), shapes


# (the kernels' tiles: 32 query or key rows for head dims up to 40 or so in float32, fewer past that)
ATTENTION_CASES = [(True, 0.0, (3, 2, 5, 8), None, None), (True, 0.2, (3, 2, 5, 8), None, None),
                   (False, 0.0, (1, 4, 6, 8), (1, 4, 9, 8), (1, 4, 9, 12)), (True, 0.1, (2, 7, 8), (2, 5, 8), None),
                   (True, 0.0, (1, 2, 70, 8), None, None),  # three query and key tiles, the last one partial
                   (False, 0.15, (2, 1, 19, 12), (2, 1, 75, 12), (2, 1, 75, 20)),  # keys over three tiles; rows
                   # long enough for the rows' loads ahead (MICA_ROW_EACH) with dropout
                   (True, 0.1, (1, 2, 45, 4), (1, 2, 33, 4), (1, 2, 33, 9)),  # more queries than keys, tiles
                   (False, 0.0, (1, 1, 40, 64), None, None),  # GPT-2's head dim: key tiles of 16
                   (True, 0.1, (1, 1, 20, 160), None, None),  # forward tiles of 16, backward 8
                   (True, 0.0, (1, 1, 9, 400), None, None)]  # tiles of 8 past 48 KiB of shared memory


def attention_cases_step(cases):
    """A step running several attention_step cases: {"c<index>": their results}."""
    F = mica.nn.functional

    def step(inputs):
        out = {}
        for n, ((causal, p, *_), (q, k, v, g)) in enumerate(zip(cases, inputs)):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=p)
            dq, dk, dv = mica.grad((o * g).sum(), [q, k, v])
            out[f"c{n}"] = {"o": o, "dq": dq, "dk": dk, "dv": dv}
        return out

    return step, [attention_step(*case)[1] for case in cases]


def attention_cases(cases, dtypes=None):
    """The cases in one program (one compile), each of its element type (float32 unless `dtypes`
    says), and their shapes."""
    step, shapes = attention_cases_step(cases)
    dtypes = dtypes or [mica.f32] * len(cases)
    return mica.trace(step, [tuple(dt[s] for s in case) for dt, case in zip(dtypes, shapes)]), shapes


# float64 (tiles of 32 for these head dims): causal with dropout, 40 queries over 37 keys
F64_CASE = (True, 0.1, (2, 1, 40, 8), (2, 1, 37, 8), None)


@needs_simulator
@pytest.mark.parametrize("path", ["auto", "fused"])
def test_attention_in_the_simulator_matches_the_oracle(path):
    """B > H, B < H (and other key and value lengths), no head dim at all with more queries than
    keys; lengths that are not multiples of the kernels' tiles, causal or not; dropout (the CPU's
    mask: the same Philox stream, so the oracle's); head dims that take each tile size (and more
    than 48 KiB of shared memory); and float64 over several tiles, to float64's rounding. Both
    paths: cuBLASLt's products with the CPU's rows (what "auto" takes for these), and the fused
    kernels."""
    cases = ATTENTION_CASES + [F64_CASE]
    program, shapes = attention_cases(cases, [mica.f32] * len(ATTENTION_CASES) + [mica.f64])
    args = [tuple(data(case, seed=2 + n)) for n, case in enumerate(shapes)]
    args[-1] = tuple(np.random.default_rng(7).standard_normal(s) for s in shapes[-1])
    lowered = program.lower("cuda", simulate=True, attention=path)
    assert ("mica_attention_gemm_backward_cuda<" in lowered.source) == (path == "auto")
    got = lowered.build()(args, seed=4)
    want = mica.reference.run(program, args, seed=4)
    for n, case in enumerate(cases):
        for key, value in got[f"c{n}"].items():
            assert rel_err(value, want[f"c{n}"][key]) < (1e-12 if case is F64_CASE else 1e-5), (case, key)


def test_fused_attention_keeps_no_score_matrix():
    """The fused kernels' plan holds no [B, H, L, S] scores: the forward takes no scratch, the
    backward D alone (one value per query row), and the whole workspace is far below one score
    matrix. "auto" takes them by itself where one head's [L, S] scores pass the products path's
    bound."""
    from mica.backends.cuda import lowerings

    B, H, L, E = 4, 2, 512, 8
    program, _ = attention_step(True, 0.1, (B, H, L, E))
    lowered = program.lower("cuda", simulate=True, attention="fused")
    target = lowered.target
    work = {k.op: target.workspace(k) for k in lowered.schedule.kernels if getattr(k, "op", "").startswith("attention")}
    assert work == {"attention": (0, 0), "attention_backward": (0, B * H * L * 4)}
    assert lowered.plan.class_bytes["workspace"] < B * H * L * L * 4 // 100
    assert "mica_attention_backward_cuda<float, 8, 8>" in lowered.source
    big = int((lowerings.SCORES_BOUND // 4) ** 0.5) + 1  # one [big, big] of floats: past the bound
    program, _ = attention_step(True, 0.0, (1, 2, big, 8))
    assert "mica_attention_backward_cuda<float, 8, 8>" in program.lower("cuda", simulate=True).source
    with pytest.raises(MicaError, match="attention='products' needs float32 or float64 scores whose"):
        program.lower("cuda", simulate=True, attention="products")


@needs_simulator
def test_attention_through_products_keeps_one_chunk_of_scores_and_its_bits_in_chunks(monkeypatch):
    """The products path's scratch is one chunk of [L, S] scores (the backward: D and two chunks), as
    many heads as fit the bound; with a bound that splits the heads into chunks of 2 (3 batch
    elements, so one pass is short) the results keep their bits, and the oracle's values."""
    from mica.backends.cuda import lowerings

    B, H, L, E = 3, 2, 40, 8
    program, shapes = attention_step(True, 0.1, (B, H, L, E))
    args = data(shapes, seed=3)
    lowered = program.lower("cuda", simulate=True)
    work = {k.op: lowered.target.workspace(k) for k in lowered.schedule.kernels
            if getattr(k, "op", "").startswith("attention")}
    scores = B * L * L * 4  # (B > H: the products batch over B, a pass per head)
    assert work == {"attention": (scores, 0), "attention_backward": (-(-B * H * L // 64) * 64 * 4 + 2 * scores, 0)}
    whole = lowered.build()(*args, seed=5)
    monkeypatch.setattr(lowerings, "SCORES_BOUND", 2 * L * L * 4)
    chunked = program.lower("cuda", simulate=True)
    assert "mica_attention_gemm_cuda<float>(stream, &shape, " in chunked.source and ", 2, (float *)work)" in chunked.source
    got = chunked.build()(*args, seed=5)
    assert _same_bits(got, whole)
    want = mica.reference.run(program, *args, seed=5)
    for key in got:
        assert rel_err(got[key], want[key]) < 1e-5, key


SAME_BITS_RUN = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
import test_cuda as t
program, shapes = t.attention_step(True, 0.1, (2, 3, 45, 8))
got = program.lower("cuda", simulate=True, threads_per_block=32).build()(*t.data(shapes, seed=6), seed=2)
np.savez(sys.argv[1], **got)
"""


@needs_simulator
def test_attention_keeps_its_bits_run_after_run_and_for_any_os_threads(tmp_path):
    """Causal rows over two tiles with dropout: the same bits twice in a row, and with 1 or 3 OS
    threads running the simulator's blocks (the GPT step below varies the threads per block); and
    the oracle's values."""
    program, shapes = attention_step(True, 0.1, (2, 3, 45, 8))
    args = data(shapes, seed=6)
    exe = program.lower("cuda", simulate=True, threads_per_block=32).build()
    runs = [exe(*args, seed=2), exe(*args, seed=2)]
    assert _same_bits(runs[1], runs[0])
    script = SAME_BITS_RUN.format(tests=os.path.dirname(os.path.abspath(__file__)))
    for threads in (1, 3):  # (the build is the one above, from the cache)
        out = tmp_path / f"t{threads}.npz"
        r = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, MICA_CUDASIM_THREADS=str(threads)))
        assert r.returncode == 0, r.stderr
        assert _same_bits(dict(np.load(out)), runs[0]), threads
    want = mica.reference.run(program, *args, seed=2)
    for key in runs[0]:
        assert rel_err(runs[0][key], want[key]) < 1e-5, key


@needs_simulator
def test_attention_rounds_where_the_oracle_does_with_fp_half_intermediates():
    """bfloat16 attention with fp_half_intermediates over several key tiles: the forward's first pass
    finds each row's max, so exp(s - max) rounds as the oracle's rounding mode rounds it."""
    F = mica.nn.functional

    def step(q, k, v, g):
        with mica.autocast(device_type="cuda", dtype=mica.bfloat16):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1).float()
        return (o, *mica.grad((o * g).sum(), [q, k, v]))

    shape = (1, 2, 70, 8)
    program = mica.trace(step, *[mica.f32[shape]] * 4)
    rng = np.random.default_rng(9)
    args = [(rng.standard_normal(shape) * 2).astype(np.float32) for _ in range(4)]
    got = program.lower("cuda", simulate=True, fp_half_intermediates=True).build()(*args, seed=3)
    want = mica.reference.run(program, *args, precision="float32", fp_half_intermediates=True, seed=3)
    plain = mica.reference.run(program, *args, precision="float32", seed=3)
    for name, x, w, p in zip(("o", "dq", "dk", "dv"), got, want, plain):
        same = float(np.mean(mica.reference.round_bf16(x) == mica.reference.round_bf16(w)))
        assert same > 0.99 and rel_err(x, w) < 1e-5, (name, same)
        assert rel_err(x, w) < rel_err(x, p) / 100, name


# head dims that are multiples of 16, so the TF32 tensor-core kernels take them (tiles of 64 rows)
TF32_CASES = [(True, 0.0, (1, 2, 70, 16), None, None),  # two query and key tiles, the last one partial
              (False, 0.1, (2, 1, 19, 16), (2, 1, 75, 16), (2, 1, 75, 32)),  # keys over two tiles, Ev != E
              (True, 0.1, (1, 2, 45, 16), (1, 2, 33, 16), (1, 2, 33, 32)),  # more queries than keys
              (True, 0.0, (1, 1, 130, 64), None, None),  # GPT-2's head dim over three tiles
              (False, 0.0, (3, 2, 5, 32), None, None), (True, 0.2, (2, 7, 48), None, None)]

TF32_KEEP_RUN = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
import test_cuda as t
program, shapes = t.attention_cases(t.TF32_CASES)
args = [tuple(t.data(case, seed=2 + n)) for n, case in enumerate(shapes)]
got = program.lower("cuda", simulate=True, tf32=True).build()(args, seed=4)
np.savez(sys.argv[1], **{{f"{{c}}.{{k}}": v for c, d in got.items() for k, v in d.items()}})
"""


def test_attention_takes_the_tensor_cores_where_tf32_is_permitted():
    """With tf32=True "auto" takes the TF32 kernels for float32 with head dims that are multiples of
    16 (their only scratch the backward's D); without it, or with other head dims, the paths of
    before; asking for them where they cannot run is a sentence."""
    B, H, L = 1, 2, 70
    program, _ = attention_step(True, 0.0, (B, H, L, 16))
    lowered = program.lower("cuda", simulate=True, tf32=True)
    assert "mica_attention_tc_backward_cuda<16, 16>(stream, &shape, " in lowered.source
    assert '#include "mica_cuda_attention_tc.h"' in lowered.source
    work = {k.op: lowered.target.workspace(k) for k in lowered.schedule.kernels
            if getattr(k, "op", "").startswith("attention")}
    assert work == {"attention": (0, 0), "attention_backward": (0, B * H * L * 4)}
    plain = program.lower("cuda", simulate=True).source
    assert "mica_attention_tc" not in plain and "mica_attention_gemm_backward_cuda<float>" in plain
    eight, _ = attention_step(True, 0.0, (B, H, L, 8))
    assert "mica_attention_gemm_backward_cuda<float>" in eight.lower("cuda", simulate=True, tf32=True).source
    with pytest.raises(MicaError, match="attention='tf32' runs on TF32 tensor cores, but the program is not built "
                                        "with tf32=True; leave attention='auto'"):
        program.lower("cuda", simulate=True, attention="tf32")
    with pytest.raises(MicaError, match=r"but its head dims \(8, 8\) are not multiples of 16"):
        eight.lower("cuda", simulate=True, tf32=True, attention="tf32")
    double, _ = attention_step(True, 0.0, (B, H, L, 16), dtype=mica.f64)
    with pytest.raises(MicaError, match="but its type is float64, not float32"):
        double.lower("cuda", simulate=True, tf32=True, attention="tf32")
    wide, _ = attention_step(True, 0.0, (B, H, L, 256))
    with pytest.raises(MicaError, match=r"need [0-9,]+ bytes of shared memory a block, past 101,376"):
        wide.lower("cuda", simulate=True, tf32=True, attention="tf32")
    assert "mica_attention_tc" not in wide.lower("cuda", simulate=True, tf32=True).source


@needs_simulator
def test_tf32_attention_in_the_simulator_matches_the_oracle(tmp_path):
    """The tensor-core kernels (the simulator's wmma: operands rounded to TF32 as the card rounds
    them) over one to three tiles, causal or not, dropout, more queries than keys, Ev != E: the
    oracle's values to TF32's rounding, the same bits twice; and with TF32's rounding off
    (MICA_CUDASIM_TF32=keep) to float32's, so what is left is the rounding, not the algorithm."""
    program, shapes = attention_cases(TF32_CASES)
    args = [tuple(data(case, seed=2 + n)) for n, case in enumerate(shapes)]
    exe = program.lower("cuda", simulate=True, tf32=True).build()
    got, again = exe(args, seed=4), exe(args, seed=4)
    assert _same_bits(got, again)
    want = mica.reference.run(program, args, seed=4)
    out = tmp_path / "keep.npz"
    r = subprocess.run([sys.executable, "-c", TF32_KEEP_RUN.format(tests=os.path.dirname(os.path.abspath(__file__))),
                        str(out)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, MICA_CUDASIM_TF32="keep"))
    assert r.returncode == 0, r.stderr
    kept = np.load(out)
    for n, case in enumerate(TF32_CASES):
        for key, value in got[f"c{n}"].items():
            err, exact = rel_err(value, want[f"c{n}"][key]), rel_err(kept[f"c{n}.{key}"], want[f"c{n}"][key])
            assert 1e-5 < err < 2e-3 and exact < 1e-5, (case, key, err, exact)


@pytest.fixture(scope="module")
def gpt_step():
    from test_cpu_gpt import _setup

    step, specs, params, state, batch = _setup(dropout=0.1)
    return mica.trace(step, *specs), params, state, batch


@needs_simulator
def test_the_gpt_step_in_the_simulator_matches_the_oracle(gpt_step):
    """nanoGPT's model with dropout (on the attention weights and the residuals), AdamW, clipping."""
    program, params, state, batch = gpt_step
    new_params, new_state, m = program.lower("cuda", simulate=True).build()(params, state, *batch, seed=3)
    want_params, want_state, want = mica.reference.run(program, params, state, *batch, seed=3)
    assert rel_err(m["loss"], want["loss"]) < 1e-5
    assert rel_err(m["norm"], want["norm"]) < 1e-5
    for name in params:
        assert rel_err(m["grads"][name], want["grads"][name]) < 1e-4, name
        assert rel_err(new_params[name], want_params[name]) < 1e-4, name
        assert rel_err(new_state["exp_avg_sq"][name], want_state["exp_avg_sq"][name]) < 1e-4, name


@needs_simulator
@pytest.mark.slow  # (a variant: the TF32 attention kernels have their own cases; the float32 GPT step runs by default; make test-slow runs it)
def test_the_gpt_step_with_tf32_attention_in_the_simulator_matches_the_oracle(gpt_step):
    """The same step with tf32=True: its attention (head dim 16) on the tensor-core kernels, the
    loss and every gradient within TF32's rounding of the oracle's."""
    program, params, state, batch = gpt_step
    lowered = program.lower("cuda", simulate=True, tf32=True)
    assert "mica_attention_tc_backward_cuda<16, 16>" in lowered.source
    _, _, m = lowered.build()(params, state, *batch, seed=3)
    _, _, want = mica.reference.run(program, params, state, *batch, seed=3)
    assert rel_err(m["loss"], want["loss"]) < 1e-5
    for name in params:
        assert rel_err(m["grads"][name], want["grads"][name]) < 3e-3, name


@needs_simulator
def test_the_gpt_step_has_the_same_bits_twice_and_for_any_launch_configuration(gpt_step):
    """Threads per block, and each kernel in a launch of its own instead of groups (groups.py)."""
    program, params, state, batch = gpt_step
    runs = []
    for threads, grouped in ((32, True), (256, False), (32, True)):
        exe = program.lower("cuda", simulate=True, threads_per_block=threads, group_launches=grouped).build()
        runs.append(exe(params, state, *batch, seed=3))
    from mica.pytree import flatten

    flat = [flatten(r)[0] for r in runs]
    for other in flat[1:]:
        for a, b in zip(flat[0], other):
            assert np.array_equal(np.asarray(a), np.asarray(b))


def test_kernels_that_differ_only_in_their_buffers_share_one_function(gpt_step, tmp_path):
    """A layer's kernels are the text of the layer before's on other buffers (a micro-batch's, of the
    one before): each function is written once, takes its buffers as parameters, and is launched with
    each kernel's pointers; every kernel is still launched once, in order, and the profile's reader
    names each launch by its own op and kind."""

    lowered = gpt_step[0].lower("cuda", group_launches=False)  # (each kernel its own launch: groups below)
    src, n = lowered.source, len(lowered.schedule.kernels)
    defined = [int(k) for k in re.findall(r"^static (?:__global__ void MICA_THREAD_BOUNDS|int) k(\d+)\(", src, re.M)]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from gpu_profile import RUNS, kinds

    runs = RUNS.findall(src)  # (function, mark) of every launch
    assert [int(mark) for _, mark in runs] == list(range(n))
    assert sorted({int(fn) for fn, _ in runs}) == defined
    assert len(defined) < 0.75 * n, (len(defined), n)  # (two layers, and their backward)
    assert all(int(fn) <= int(mark) for fn, mark in runs)  # (a function is defined by its first kernel)
    functions = src.split("/* the program's C API")[0].splitlines()
    assert [line for line in functions if "A + " in line  # (only the shared scratch and the rng are at fixed places)
            and not line.startswith(("/*", " *"))  # (the arena's table of buffers, a comment)
            and "char *work = A + " not in line and "int64_t *rng = (const int64_t *)(A + " not in line] == []
    (tmp_path / "train.cu").write_text(src)
    what = kinds(str(tmp_path / "train.cu"))
    assert sorted(what) == list(range(n))
    titles = dict(re.findall(r"/\* k(\d+): (.*?)(?: \(|:| \*/)", src))
    for fn, mark in runs:
        assert what[int(mark)][0].startswith(titles[mark]), (mark, what[int(mark)])
        assert what[int(mark)][1] == what[int(fn)][1], mark
    assert {"generated", "product", "attention"} <= {kind for _, kind, *_ in what.values()}


def _bytes_touched(kern, plan, target):
    """(arena byte ranges read, written, uses the workspace) of a kernel, from the plan: a kernel
    that is not a generated loop or reduction counts as writing all it touches."""
    from mica.backends.cuda.render import reduce_scratch
    from mica.passes.schedule import Buffer, Gemm, Loop, Reduce

    def spans(views):
        return {(plan.offset(plan.root(v.src)), plan.offset(plan.root(v.src)) + plan.root(v.src).nbytes)
                for v in views if isinstance(v.src, Buffer)}

    if isinstance(kern, (Loop, Reduce)):
        loads = [e.view for e in kern.exprs if e.kind == "load"]
        stores = [v for v, _ in kern.stores] if isinstance(kern, Loop) else [kern.out]
        return spans(loads), spans(stores), reduce_scratch(kern) > 0
    views = [kern.a, kern.b, kern.out] if isinstance(kern, Gemm) else [*kern.inputs, *getattr(kern, "outputs", [])]
    if hasattr(kern, "out") and not isinstance(kern, Gemm):
        views.append(kern.out)
    return set(), spans(views), target.workspace(kern) != (0, 0)


def test_independent_kernels_share_a_launch_in_an_order_that_keeps_every_dependence(gpt_step):
    """groups.py: the optimizer's per-tensor square-sums share launches, so do their square roots and
    the AdamW updates (most of each in one). Every kernel runs once; for every two kernels that
    touch the same arena bytes (one writing), or both use the workspace, the first runs first
    (checked from the plan here, apart from groups.py's reading); a reduction by lanes has a
    scratch slice of its own in its group; the source launches each group once."""
    from mica.backends.cuda import groups
    from mica.backends.cuda.render import reduce_scratch

    program, params = gpt_step[0], gpt_step[1]
    lowered = program.lower("cuda")
    s, plan, target = lowered.schedule, lowered.plan, lowered.target
    units = groups.launch_units(s, plan, target)
    n = len(s.kernels)
    assert sorted(k for u in units for k in u.members) == list(range(n))
    names = [k.name for k in s.kernels]
    update = max((nm for nm in names if nm.endswith("sqrt, div")), key=names.count)  # (AdamW's fused elementwise)
    for name in ("mul -> sum", "eq, where, sqrt", update):  # (square-sums, norms, AdamW)
        most = max(sum(s.kernels[k].name == name for k in u.members) for u in units)
        assert most >= len(params) // 2, (name, most, len(params))
    assert len(units) < 0.75 * n, (len(units), n)
    where = {k: i for i, u in enumerate(units) for k in u.members}
    touched = [_bytes_touched(kern, plan, target) for kern in s.kernels]

    def overlap(xs, ys):
        return any(a < d and c < b for a, b in xs for c, d in ys)

    for i in range(n):
        ri, wi, si = touched[i]
        for j in range(i + 1, n):
            rj, wj, sj = touched[j]
            if overlap(wi, rj | wj) or overlap(ri, wj):
                assert where[i] < where[j], (i, j)
            elif si and sj:
                assert where[i] < where[j] or (where[i] == where[j] and i in units[where[i]].scratch), (i, j)
    for u in units:
        slices = sorted((u.scratch[k], u.scratch[k] + reduce_scratch(s.kernels[k])) for k in u.scratch)
        assert all(a[1] <= b[0] for a, b in zip(slices, slices[1:])), slices
        assert not slices or slices[-1][1] <= plan.per_unit_bytes
    grouped = [u for u in units if len(u.members) > 1]
    src = lowered.source
    assert len(re.findall(r"MICA_LAUNCH\(g(\d+)(?:_sums)?, ", src)) == len(grouped) + sum(bool(u.scratch) for u in grouped)
    assert sorted(int(k) for k in re.findall(r"MICA_MARK\(stream, (\d+)\);", src)) == sorted(u.members[0] for u in units)


def picks_and_roundings():
    """The verbs built on index checks and exact roundings (gather, x[t], topk, one_hot, floor, fmod,
    ...), with gradients: their CUDA source as nvcc sees it."""
    def step(a, b, i):
        y = (mica.floor(a) + mica.ceil(a) * mica.round(a) + mica.trunc(a) + mica.fmod(a, b) + a.gather(1, i)
             + a.topk(2).values.sum() + a.cumsum(1) + mica.nn.functional.one_hot(i[0], 4).float().sum()
             + a[:, i[0]].sum() + mica.nn.functional.softplus(a) + (a // b) + a.remainder(b))
        return y, mica.grad(y.sum(), [a, b])
    return mica.trace(step, mica.f32[3, 4], mica.f32[3, 4], mica.i64[3, 4])


@needs_nvcc
def test_nvcc_builds_every_architecture_with_warnings_as_errors_and_no_spills(tmp_path, gpt_step):
    """The GPT training step (loops, reductions, row kernels, attention, products) for sm_80..sm_120
    plus PTX; the other row kernels (in float32 and float64, with attention in float64), attention on
    TF32 tensor cores (GPT-2's head dim) for sm_80 and sm_120; with
    the host compiler's -Wall -Wextra as errors too; ptxas reports no register spills in any of
    Mica's kernels."""
    from mica.backends.cuda import build

    tf32 = attention_cases([TF32_CASES[3]])[0]  # (GPT-2's head dim, 64)
    # the GPT trainer's step for every architecture; the other kernels for the oldest and the newest
    # (the step holds most of them; a real build takes all five for every program: this keeps the test short)
    ends = [build.ARCHS[0], build.ARCHS[-1]]
    for name, program, options, archs in (
            ("gpt", gpt_step[0], {}, None), ("rows", row_kernels(), {}, ends),
            ("rows64", every_row_kernel(4, np.float64, widths=(24,), attention=F64_CASE), {}, ends),
            ("bf16", half_products(mica.bfloat16), {}, ends), ("tf32", tf32, {"tf32": True}, ends),
            ("picks", picks_and_roundings(), {}, ends)):
        src = tmp_path / f"{name}.cu"
        src.write_text(program.lower("cuda", **options).source)
        assert ("#define MICA_TF32 1" in src.read_text()) == bool(options)  # (the source says: nvcc needs no flag)
        obj = tmp_path / f"{name}.o"
        r = subprocess.run(build.nvcc_command(str(src), str(obj), shared=False, archs=archs, ptx=archs is None) +
                           ["-Xptxas", "-v", "-Xcompiler", "-Wall,-Wextra,-Werror"],  # (the host side too)
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        reports = [line for line in r.stderr.splitlines() if "spill stores" in line]
        assert reports, r.stderr[-2000:]
        assert all(" 0 bytes spill stores, 0 bytes spill loads" in line for line in reports), \
            [line for line in reports if " 0 bytes spill stores" not in line]
        if shutil.which("cuobjdump"):  # (PyPI: nvidia-cuda-cuobjdump)
            listing = subprocess.run(["cuobjdump", "--list-elf", str(obj)], capture_output=True, text=True)
            for arch in (build.ARCHS if archs is None else (build.ARCHS[0], build.ARCHS[-1])):
                assert f"sm_{arch}" in listing.stdout, arch


@needs_nvcc
def test_every_kernel_fits_the_registers_of_1024_threads_a_block(tmp_path):
    """An outside reviewer's: without launch bounds ptxas gave the float64 layer norm's backward
    168 registers and a float64 sum's lanes 255, so threads_per_block=512 or 1024 (which the target
    accepts and the simulator ran) could not launch on a card (65,536 registers a block). Every
    kernel launched with MICA_THREADS threads now says so (MICA_THREAD_BOUNDS), and ptxas keeps it
    within 65,536 / MICA_THREADS registers."""
    from mica.backends.cuda import build

    rows = every_row_kernel(4, np.float64, widths=(24,), attention=F64_CASE)
    sums = mica.trace(lambda x, y: ((x * x).sum(), (x.float() * y).sum(1)), mica.f64[4096], mica.f32[64, 4096])
    for name, program in (("rows64", rows), ("sums", sums)):
        src = tmp_path / f"{name}.cu"
        src.write_text(program.lower("cuda", threads_per_block=1024).source)
        cmd = build.nvcc_command(str(src), str(tmp_path / f"{name}.o"), shared=False, archs=(90,), ptx=False,
                                 threads_per_block=1024) + ["-Xptxas", "-v"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        used, entry = {}, None
        for line in r.stderr.splitlines():
            m = re.search(r"Compiling entry function '(\S+)'", line)
            entry = m.group(1) if m else entry
            m = re.search(r"Used (\d+) registers", line)
            if m and entry:
                used[entry] = int(m.group(1))
        assert len(used) >= (20 if name == "rows64" else 2), r.stderr[-2000:]
        assert max(used.values()) <= 65536 // 1024, {k: v for k, v in used.items() if v > 64}


@needs_nvcc
def test_without_a_gpu_the_program_says_so_in_a_sentence():
    if subprocess.run(["nvidia-smi"], capture_output=True).returncode == 0 if shutil.which("nvidia-smi") else False:
        pytest.skip("a GPU is present")
    lowered = mlp_step().lower("cuda")
    with pytest.raises(MicaError, match="a CUDA program built here could not run: it needs an NVIDIA GPU and its "
                                        "driver, and (no NVIDIA driver is installed|the NVIDIA driver finds no)"):
        lowered.build()  # (before nvcc's minutes)
    # a library built elsewhere and loaded here says so itself
    from mica.backends.cstyle.executable import AbiExecutable
    from mica.backends.cuda import build

    with pytest.raises(MicaError, match="no CUDA device is usable here"):
        AbiExecutable(lowered, build.build(lowered.source, "mlp", archs=build.ARCHS[:1]))  # (one card's: quicker)


def _gpu():
    return shutil.which("nvidia-smi") is not None and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


needs_gpu = pytest.mark.skipif(not (_gpu() and _nvcc() and _wheels()), reason="no NVIDIA GPU here")


@needs_gpu
@pytest.mark.parametrize("make,args", [(no_products, lambda: data(((33, 40), (33, 57)), seed=1)),
                                        (row_kernels, row_data)])
def test_on_the_gpu_mica_kernels_give_the_cpu_targets_bits(make, args):
    """The CPU target gives the simulator's bits (tested above on every machine), so equal bits here
    mean the card gives the simulator's bits too."""
    program, a = make(), args()
    gpu = program.lower("cuda").build()(*a, seed=9)
    cpu = program.lower("cpu", blas="own").build()(*a, seed=9, threads=1)
    for k in cpu:
        assert np.array_equal(gpu[k], cpu[k]), k


@needs_gpu
@pytest.mark.parametrize("path", ["auto", "fused"])
def test_on_the_gpu_attention_matches_the_oracle_and_keeps_its_bits(path):
    """Attention on the card through cuBLASLt's products and through the fused kernels, over several
    tiles (causal or not, dropout): the oracle's values, the same bits twice."""
    program, shapes = attention_cases(ATTENTION_CASES)
    args = [tuple(data(case, seed=2 + n)) for n, case in enumerate(shapes)]
    exe = program.lower("cuda", attention=path).build()
    got, again = exe(args, seed=4), exe(args, seed=4)
    want = mica.reference.run(program, args, seed=4)
    assert _same_bits(got, again)
    for n, case in enumerate(ATTENTION_CASES):
        for key, value in got[f"c{n}"].items():
            assert rel_err(value, want[f"c{n}"][key]) < 1e-5, (case, key)


@needs_gpu
@needs_simulator
def test_on_the_gpu_tf32_attention_matches_the_oracle_and_the_simulator():
    """The tensor-core kernels on the card: the oracle's values to TF32's rounding, the same bits
    twice, and the simulator's wmma to rounding (the card adds a step's products in an order of
    its own, so not to the bit)."""
    program, shapes = attention_cases(TF32_CASES)
    args = [tuple(data(case, seed=2 + n)) for n, case in enumerate(shapes)]
    exe = program.lower("cuda", tf32=True).build()
    got, again = exe(args, seed=4), exe(args, seed=4)
    sim = program.lower("cuda", simulate=True, tf32=True).build()(args, seed=4)
    want = mica.reference.run(program, args, seed=4)
    assert _same_bits(got, again)
    for n, case in enumerate(TF32_CASES):
        for key, value in got[f"c{n}"].items():
            assert rel_err(value, want[f"c{n}"][key]) < 2e-3, (case, key)
            assert rel_err(value, sim[f"c{n}"][key]) < 2e-3, (case, key)


@needs_gpu
@needs_simulator
def test_on_the_gpu_attention_gives_the_simulators_bits():
    """The fused attention kernels are Mica's kernels alone (no product): the card gives the
    simulator's bits."""
    program, shapes = attention_cases(ATTENTION_CASES)
    args = [tuple(data(case, seed=2 + n)) for n, case in enumerate(shapes)]
    gpu = program.lower("cuda", attention="fused").build()(args, seed=4)
    sim = program.lower("cuda", simulate=True, attention="fused").build()(args, seed=4)
    assert _same_bits(gpu, sim)


@needs_gpu
def test_on_the_gpu_the_step_matches_the_float64_oracle():
    program = mlp_step(dropout=0.1)
    args = data(SHAPES)
    got = program.lower("cuda").build()(*args, seed=5)
    want = mica.reference.run(program, *args, seed=5)
    assert rel_err(got["loss"], want["loss"]) < 1e-5
    for k in ("w1", "w2", "col", "t"):
        assert rel_err(got[k], want[k]) < 1e-4, k


@needs_gpu
@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_on_the_gpu_half_products_with_a_bias_are_rounded_once(half):
    """cuBLASLt's half products on the card: plain (C in the half type) and with a bias (half A and B,
    a float32 C the bias joins before one rounding), forward and gradients: the CPU target's values to
    a half type's rounding (the card sums in an order of its own), and the same bits twice."""
    dt = getattr(mica, half)

    def step(x, w, b, v):
        with mica.autocast(dtype=dt):
            h = mica.nn.functional.linear(x, w, b)
            y = mica.nn.functional.linear(h, v)
        loss = (y.float() ** 2).mean()
        return (loss,) + tuple(mica.grad(loss, [x, w, b, v]))

    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((3, 40, 96), (72, 96), (72,), (24, 72))]
    program = mica.trace(step, *[mica.f32[a.shape] for a in args])
    exe = program.lower("cuda").build()
    got, again = exe(*args), exe(*args)
    cpu = program.lower("cpu").build()(*args)
    for g, a, c in zip(got, again, cpu):
        assert np.array_equal(np.asarray(g), np.asarray(a))
        assert rel_err(np.asarray(g), np.asarray(c)) < 1e-2


PRODUCTS_RUN = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
import test_cuda as t
got = t.mlp_step().lower("cuda", simulate=True).build()(*t.data(t.SHAPES), seed=5)
np.save(sys.argv[1], got["w1"])
"""


def _run_with_record(tmp_path, record, name):
    out = tmp_path / f"{name}.npy"
    env = dict(os.environ, MICA_PRODUCTS=str(record))
    script = PRODUCTS_RUN.format(tests=os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", script, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return np.load(out)


def _products(record):
    return [line for line in record.read_text().splitlines() if line.startswith("product ")]


@needs_simulator
def test_the_products_record_is_made_once_and_read_after(tmp_path):
    """The first run records every product shape (the MLP step: 2 forward, 4 backward products);
    a later process reads it and times nothing (the file is not rewritten)."""
    record = tmp_path / "products.txt"
    first = _run_with_record(tmp_path, record, "a")
    lines = record.read_text().splitlines()
    assert lines[0].startswith("# Mica products record") and lines[1].startswith("machine the CUDA simulator")
    assert len(_products(record)) == len(set(_products(record))) == 6
    stamp = record.stat().st_mtime_ns, record.read_text()
    second = _run_with_record(tmp_path, record, "b")
    assert (record.stat().st_mtime_ns, record.read_text()) == stamp
    assert np.array_equal(first, second)


@needs_simulator
def test_a_record_from_another_machine_or_damaged_is_not_used(tmp_path):
    import random

    record = tmp_path / "products.txt"
    want = _run_with_record(tmp_path, record, "good")
    good = record.read_text()
    other = good.replace("machine the CUDA simulator", "machine NVIDIA H200 sm_90 driver 13000 cublasLt 130100")
    record.write_text(other)
    assert np.array_equal(_run_with_record(tmp_path, record, "other"), want)
    assert record.read_text() == good  # rewritten for this machine
    rng = random.Random(5)
    for case in range(12):  # damaged files: never a crash, the same results, a whole record after
        text = list(good)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(text))
            text[at] = rng.choice(["", "x", "9", " ", "\n", "-", "\0", text[at] * 50])
        record.write_text("".join(text))
        assert np.array_equal(_run_with_record(tmp_path, record, f"fuzz{case}"), want), case
        assert len(_products(record)) >= 6 or record.read_text() == "".join(text), case


@needs_gpu
def test_on_the_gpu_the_gpt_step_matches_the_float64_oracle(gpt_step):
    """Attention (Mica's fused kernels), the CUDA graph and the products record on the card."""
    program, params, state, batch = gpt_step
    new_params, _, m = program.lower("cuda").build()(params, state, *batch, seed=3)
    want_params, _, want = mica.reference.run(program, params, state, *batch, seed=3)
    assert rel_err(m["loss"], want["loss"]) < 1e-5
    for name in params:
        assert rel_err(m["grads"][name], want["grads"][name]) < 1e-4, name
        assert rel_err(new_params[name], want_params[name]) < 1e-4, name


def test_a_simulator_that_cannot_be_built_is_a_sentence(tmp_path):
    """A machine without Boost.Context: the linker fails and removes its output itself (as g++ does);
    the build says so in a sentence naming the package, not a missing file (seen on the lent GPU
    machine: FileNotFoundError for the cache's temporary .so)."""
    from mica.backends.c.build import compile_cached

    def command(src, out):
        return ["sh", "-c", f"echo x > {out}; rm -f {out}; echo '/usr/bin/ld: cannot find -lboost_context: "
                "No such file or directory' >&2; exit 1"]

    with pytest.raises(MicaError) as e:
        compile_cached("int x;", str(tmp_path / "entry"), "program.cu", "g++ (the CUDA simulator)", "step", command)
    assert str(e.value).startswith("g++ (the CUDA simulator) failed on the generated program for step "
                                   "(/usr/bin/ld: cannot find -lboost_context")
    assert "install Debian's libboost-context-dev" in str(e.value)
    assert os.listdir(tmp_path / "entry") == ["program.cu"]  # (no temporary left behind)


def test_a_cached_program_names_the_cublaslt_it_links_and_a_library_that_cannot_load_is_a_sentence(tmp_path,
                                                                                                    monkeypatch):
    """Programs built by nvcc find cuBLASLt by an rpath into the venv that built them: the cache key
    holds it, so a venv made elsewhere (a second checkout sharing ~/.cache/mica) builds its own
    instead of loading one whose rpath leads nowhere; and a library that cannot load says so."""
    from mica.backends.c.executable import load_library
    from mica.backends.cuda import build

    folders = []
    monkeypatch.setattr(build, "compile_cached", lambda source, out_dir, *a: folders.append(out_dir))
    for lib in ("/one/venv/nvidia/cu13/lib", "/another/venv/nvidia/cu13/lib", "/one/venv/nvidia/cu13/lib"):
        monkeypatch.setattr(build, "cuda_libraries", lambda lib=lib: ("/include", lib))
        build.build("int x;", simulate=False)
        build.build("int x;", simulate=True)
    assert folders[0] != folders[2] and folders[0] == folders[4] and folders[1] == folders[3] == folders[5]
    # a program whose library is gone since it was built
    (tmp_path / "dep.c").write_text("int dep(void) { return 7; }\n")
    (tmp_path / "main.c").write_text("int dep(void);\nint entry(void) { return dep(); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "dep.c"), "-o", str(tmp_path / "libdep.so")], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "main.c"), "-L", str(tmp_path), "-ldep", "-o",
                    str(tmp_path / "libmain.so")], check=True)
    with pytest.raises(MicaError, match=r"^the compiled program .*libmain.so cannot be loaded \(libdep.so: cannot "
                                        r"open shared object file.*\); delete its folder from Mica's cache"):
        load_library(str(tmp_path / "libmain.so"))
