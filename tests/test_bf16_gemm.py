"""The CPU's bfloat16 products (mica_bf16gemm.h): every kernel the machine has (AMX tiles,
AVX512-BF16, the float32 fallback), on shapes that are no multiple of the tiles, transposed and
batched operands, against the oracle's half-rounding mode (tight: equal but for results whose
float32 sum lies near a bfloat16 rounding boundary, and those one bfloat16 step apart) and torch's
float64 product of the same bfloat16 values (one bfloat16 rounding); the same bits for any thread
count and opt level; subnormal inputs read as zeros by every kernel and by the oracle."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import mica
from helpers import rel_err
from mica.backends.c import bf16gemm
from mica.backends.c.target import CTarget
from mica.errors import MicaError

BF16 = mica.bfloat16
HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = bf16gemm.machine_flags()
KERNELS = [pytest.param(k, marks=pytest.mark.skipif(not all(f in FLAGS for f in bf16gemm.NEEDS[k]),
                                                    reason=f"this processor has no {k}"))
           for k in ("amx", "avx512bf16", "f32")]

# (batch, M, N, K, A transposed, B transposed): none a multiple of the 32 x 32 blocks or the 32-deep
# k step, K odd, k shorter than one step, and sizes large enough to run on both threads
SHAPES = [((), 1, 1, 1, 0, 0), ((), 7, 5, 3, 0, 0), ((), 33, 17, 65, 0, 1), ((), 65, 37, 99, 1, 0),
          ((), 65, 37, 99, 1, 1), ((), 130, 97, 161, 0, 0), ((), 96, 130, 64, 1, 1), ((2, 3), 19, 40, 33, 0, 1),
          ((3,), 45, 29, 70, 1, 0), ((), 33, 600, 1400, 1, 0)]  # (the last in two k chunks)


def _program(batch, M, N, K, ta, tb):
    sa = (*batch, K, M) if ta else (*batch, M, K)
    sb = (*batch, N, K) if tb else (*batch, K, N)

    def product(a, b):
        return mica.matmul(a.mT if ta else a, b.mT if tb else b)

    return mica.trace(product, mica.dtypes.Spec(sa, BF16), mica.dtypes.Spec(sb, BF16)), sa, sb


def _bf16_values(rng, shape):
    """Random values that bfloat16 holds exactly, of varied magnitudes (float32 arrays)."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, shape))
    return mica.reference.round_bf16(x.astype(np.float32))


def _ulp_bf16(x):
    """The spacing of bfloat16 values at |x| (2^-133 below the normal range)."""
    e = np.floor(np.log2(np.maximum(np.abs(x), 2.0 ** -126)))
    return np.exp2(e - 7)


def _check_against_oracle(got, want, K, size):
    """Equal bits but for results whose float32 sums (in two orders, K roundings each, 2^-24 of
    sum |a||b| = `size` apiece) straddle a bfloat16 rounding boundary: at most 2% of them, apart
    by one bfloat16 step plus those sums' difference."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    differ = got != want
    assert differ.mean() <= 0.02, f"{differ.sum()} of {got.size} results differ from the oracle"
    bound = _ulp_bf16(np.maximum(np.abs(got), np.abs(want))) + 2 * K * 2.0 ** -24 * size
    assert np.all(np.abs(got - want)[differ] <= bound[differ])


def _run(kernel, shape, a, b, threads=2, opt_level=2):
    program, _, _ = _program(*shape)
    lowered = program.lower("cpu", opt_level=opt_level, bf16_gemm=kernel)
    return np.asarray(lowered.build()(a, b, threads=threads), np.float32), program


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, (*s[0], *s[1:4]))) + f"-{s[4]}{s[5]}")
def test_products_match_the_oracle_and_torch_float64(kernel, shape):
    rng = np.random.default_rng(abs(hash(shape)) % 2 ** 32)
    program, sa, sb = _program(*shape)
    a, b = _bf16_values(rng, sa), _bf16_values(rng, sb)
    got, program = _run(kernel, shape, a, b)
    ta, tb = shape[4:]
    ta_, tb_ = torch.from_numpy(a).double(), torch.from_numpy(b).double()
    exact = torch.matmul(ta_.mT if ta else ta_, tb_.mT if tb else tb_).numpy()
    size = torch.matmul((ta_.mT if ta else ta_).abs(), (tb_.mT if tb else tb_).abs()).numpy()
    K = shape[3]
    _check_against_oracle(got, mica.reference.run(program, a, b, precision="float32"), K, size)
    # one bfloat16 rounding of each result (half a step: 2^-8 of it), plus the float32 sum's error
    # (K roundings of 2^-24, taken as 2^-23 each, of sum |a||b|)
    assert np.all(np.abs(got - exact) <= 2.0 ** -8 * np.abs(exact) + K * 2.0 ** -23 * size)


def test_the_bits_do_not_depend_on_threads_or_opt_level():
    shape = ((), 130, 97, 161, 1, 0)
    rng = np.random.default_rng(5)
    _, sa, sb = _program(*shape)
    a, b = _bf16_values(rng, sa), _bf16_values(rng, sb)
    kernels = [k for k in ("amx", "avx512bf16", "f32") if all(f in FLAGS for f in bf16gemm.NEEDS[k])]
    for kernel in kernels:
        runs = [_run(kernel, shape, a, b, threads, opt)[0] for threads in (1, 2) for opt in (0, 2)]
        for r in runs[1:]:
            np.testing.assert_array_equal(r.view(np.uint32), runs[0].view(np.uint32))


def test_subnormal_inputs_read_as_zeros_everywhere():
    """2^-130 (a bfloat16 subnormal) times 2^100 would be 2^-30; the bf16 instructions, the float32
    fallback and the oracle all read it as zero, so only the normal terms remain."""
    shape = ((), 40, 33, 35, 0, 0)
    rng = np.random.default_rng(9)
    a = _bf16_values(rng, (40, 35))
    b = _bf16_values(rng, (35, 33))
    a[:, 3] = 2.0 ** -130
    a[:, 4] = -(2.0 ** -128)
    b[3, :] = 2.0 ** 100
    b[4, :] = 2.0 ** 100
    kernels = [k for k in ("amx", "avx512bf16", "f32") if all(f in FLAGS for f in bf16gemm.NEEDS[k])]
    program, _, _ = _program(*shape)
    want = mica.reference.run(program, a, b, precision="float32")
    keep = np.ones(35, bool)
    keep[[3, 4]] = False
    normal = mica.reference.round_bf16(a[:, keep].astype(np.float64) @ b[keep].astype(np.float64))
    size = np.abs(a[:, keep]).astype(np.float64) @ np.abs(b[keep]).astype(np.float64)
    _check_against_oracle(want, normal, 35, size)
    for kernel in kernels:
        _check_against_oracle(_run(kernel, shape, a, b)[0], want, 35, size)


def test_half_products_stay_products_of_half_operands():
    """bfloat16 and float16 products keep their half operands in the graph (no widening casts
    around them): mica_bf16gemm on the chosen kernel, mica_f16gemm widening inside the product."""
    def product(a, b):
        return mica.matmul(a, b)

    for dtype, call in ((mica.bfloat16, "mica_bf16gemm(4, 3, 8,"), (mica.float16, "mica_f16gemm(4, 3, 8,")):
        program = mica.trace(product, mica.dtypes.Spec((4, 8), dtype), mica.dtypes.Spec((8, 3), dtype))
        lowered = program.lower("cpu", bf16_gemm="f32")
        products = [n for n in lowered.graph.nodes if n.op == "matmul"]
        assert [n.inputs[0].dtype is dtype for n in products] == [True]
        assert not any(n.op == "cast" for n in lowered.graph.nodes)
        assert call in lowered.source
    source = mica.trace(product, mica.dtypes.Spec((4, 8), BF16), mica.dtypes.Spec((8, 3), BF16)).lower(
        "cpu", bf16_gemm="f32").source
    assert "#define MICA_BF16_GEMM 0  /* f32 */" in source


def _f16_values(rng, shape):
    """Random float16 values (held in float32) of varied magnitudes, a few of them subnormal."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, shape))
    x[rng.random(shape) < 0.05] *= 2.0 ** -20  # (float16's subnormals start below 2^-14)
    return x.astype(np.float16).astype(np.float32)


def test_float16_products_against_the_oracle_and_torch_float64():
    """float16 products, widened inside the product (subnormals kept: every float16 value is a
    float32 value), plain, transposed, batched and with an epilogue (GELU on each tile), one
    float16 rounding from torch's float64 product of the same values and the oracle's bits but
    for results near a float16 rounding boundary; the same bits at 1 and 2 threads."""
    F16 = mica.float16
    F = mica.nn.functional

    def products(a, b, c, d, e, f):
        return mica.matmul(a, b.mT), mica.matmul(c.mT, d), F.gelu(mica.matmul(a, b.mT)), mica.matmul(e, f)

    shapes = [(130, 97), (61, 97), (161, 65), (161, 37), (2, 3, 19, 33), (2, 3, 33, 40)]
    program = mica.trace(products, *(mica.dtypes.Spec(s, F16) for s in shapes))
    rng = np.random.default_rng(16)
    args = [_f16_values(rng, s) for s in shapes]
    lowered = program.lower("cpu")
    assert sum(k.kind == "gemm" and k.epilogue is not None for k in lowered.schedule.kernels) == 1
    exe = lowered.build()
    got = [np.asarray(g, np.float64) for g in exe(*args, threads=2)]
    again = exe(*args, threads=1)
    for g, w in zip(got, again):
        np.testing.assert_array_equal(g, np.asarray(w, np.float64))
    want = [np.asarray(w, np.float64) for w in mica.reference.run(program, *args, precision="float32")]
    a, b, c, d, e, f = (torch.tensor(x, dtype=torch.float64) for x in args)
    exact = [a @ b.mT, c.mT @ d, None, e @ f]
    sizes = [abs(a) @ abs(b.mT), abs(c.mT) @ abs(d), None, abs(e) @ abs(f)]
    for i in (0, 1, 3):
        differ = got[i] != want[i]
        assert differ.mean() <= 0.02, f"product {i}: {differ.sum()} of {got[i].size} differ from the oracle"
        ulp = np.exp2(np.floor(np.log2(np.maximum(np.abs(want[i]), 2.0 ** -14))) - 10)
        assert np.all(np.abs(got[i] - want[i])[differ] <= ulp[differ] + 2 * 200 * 2.0 ** -24 * sizes[i].numpy()[differ])
        assert np.all(np.abs(got[i] - exact[i].numpy()) <= ulp / 2 + 200 * 2.0 ** -24 * sizes[i].numpy() + 2.0 ** -25)
    assert rel_err(got[2], want[2]) <= 2.0 ** -9
    # the subnormal operands counted: flushing them to zero would move these products
    flushed = [np.where(np.abs(x) < 2.0 ** -14, 0.0, x) for x in args[:2]]
    assert not np.array_equal(flushed[0] @ flushed[1].T, args[0].astype(np.float64) @ args[1].T.astype(np.float64))


def test_the_kernel_is_chosen_from_the_processor_flags():
    amx = {"amx_bf16", "amx_tile", "avx512_bf16", "avx2"}
    intel, amd = "GenuineIntel", "AuthenticAMD"
    assert bf16gemm.choose(flags=amx, vendor=intel) == "amx"
    # Intel's vdpbf16ps without AMX measured slower than OpenBLAS's float32 product; AMD's faster
    assert bf16gemm.choose(flags={"avx512_bf16", "avx2"}, vendor=intel) == "f32"
    assert bf16gemm.choose(flags={"avx512_bf16", "avx2"}, vendor=amd) == "avx512bf16"
    assert bf16gemm.choose(flags={"avx512_bf16", "avx2"}, vendor="") == "f32"
    for vendor in (intel, amd):
        assert bf16gemm.choose(flags={"avx2", "fma"}, vendor=vendor) == "f32"
    assert bf16gemm.choose("f32", flags=amx) == "f32"
    assert bf16gemm.choose("avx512bf16", flags=amx) == "avx512bf16"
    with pytest.raises(MicaError, match="lacks amx_bf16, amx_tile, avx512_bf16"):
        bf16gemm.choose("amx", flags={"avx2"})
    with pytest.raises(MicaError, match="unknown bfloat16 product kernel 'tiles'"):
        bf16gemm.choose("tiles", flags=amx)
    with pytest.raises(MicaError, match="use MICA_BF16_GEMM=avx512bf16 or f32 "):  # what this one has
        bf16gemm.choose("amx", flags={"avx512_bf16", "avx2"})


def test_the_kernel_line_says_whether_it_was_chosen_or_asked_for(monkeypatch):
    monkeypatch.delenv("MICA_BF16_GEMM", raising=False)
    zen = {"avx512_bf16", "avx2"}
    assert bf16gemm.describe("avx512bf16", flags=zen) == (
        "bfloat16 products: the avx512bf16 kernel (AVX512-BF16's vdpbf16ps), chosen for the processor that built "
        "it; MICA_BF16_GEMM=f32 picks another")
    assert bf16gemm.describe("f32", flags={"avx2"}).endswith(
        "chosen for the processor that built it (this processor has no bfloat16 product instructions)")
    assert bf16gemm.describe("f32", "f32", flags=zen).endswith("(operands widened to float32), as the target was asked")
    monkeypatch.setenv("MICA_BF16_GEMM", "f32")
    assert bf16gemm.describe("f32", flags=zen).endswith("(operands widened to float32), as MICA_BF16_GEMM=f32 asks")


def test_a_kernel_this_processor_lacks_stops_only_programs_with_bfloat16_products(monkeypatch):
    """MICA_BF16_GEMM names a kernel the processor cannot run: a float32 program builds and runs as
    ever (its source does not depend on the variable); a bfloat16 product is refused in a sentence."""
    missing = next((k for k in ("amx", "avx512bf16") if k not in bf16gemm.available()), None)
    if missing is None:
        pytest.skip("this processor runs every bfloat16 kernel")
    product = lambda a, b: a @ b  # noqa: E731
    f32 = mica.trace(product, mica.dtypes.Spec((4, 8), mica.float32), mica.dtypes.Spec((8, 3), mica.float32))
    before = f32.lower("cpu").source
    monkeypatch.setenv("MICA_BF16_GEMM", missing)
    assert f32.lower("cpu").source == before
    a, b = np.random.default_rng(0).standard_normal((4, 8)), np.random.default_rng(1).standard_normal((8, 3))
    out = mica.compile(product, mica.dtypes.Spec((4, 8), mica.float32), mica.dtypes.Spec((8, 3), mica.float32))(
        a.astype(np.float32), b.astype(np.float32))
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    half = mica.trace(product, mica.dtypes.Spec((4, 8), BF16), mica.dtypes.Spec((8, 3), BF16))
    with pytest.raises(MicaError, match=f"this processor lacks .* which the {missing} bfloat16 product kernel needs"):
        half.lower("cpu")


@pytest.mark.skipif(not all(f in FLAGS for f in bf16gemm.NEEDS["amx"]), reason="this processor has no AMX")
def test_amx_refused_falls_back_to_avx512bf16():
    """MICA_NO_AMX stands in for a kernel that refuses the tile state: the AVX512-BF16 kernel runs on
    the same packed operands, and the results are those of an AVX512-BF16 build."""
    script = (
        "import numpy as np, mica, sys\n"
        "sys.path.insert(0, %r)\n"
        "from test_bf16_gemm import _program, _bf16_values, _run\n"
        "shape = ((), 65, 37, 99, 1, 1)\n"
        "_, sa, sb = _program(*shape)\n"
        "rng = np.random.default_rng(2)\n"
        "a, b = _bf16_values(rng, sa), _bf16_values(rng, sb)\n"
        "amx = _run('amx', shape, a, b)[0]\n"
        "avx = _run('avx512bf16', shape, a, b)[0]\n"
        "print(int(np.array_equal(amx.view(np.uint32), avx.view(np.uint32))))\n" % HERE)
    env = dict(os.environ, MICA_NO_AMX="1")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "1"


class _WidenedAttention(CTarget):
    """The CPU target with its bfloat16 attention kernels widened to float32 around the float ones."""

    def half_kernel(self, op, dtype):
        return op == "matmul" and super().half_kernel(op, dtype)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal", [True, False])
def test_bfloat16_attention_against_the_widened_float_attention(causal, kernel):
    """The bfloat16 attention kernels widen each head in scratch and round their results once. With
    the float32 fallback that is the same bits as widening the tensors around the float kernels,
    forward and backward. With bfloat16 products (AMX, AVX512-BF16) the two products of bfloat16
    operands (Q K^T, dO V^T) run on that kernel: the same float32 sums of exact products in another
    order, so the results agree with the widened ones to float32's accuracy, not to the bit. On
    strided heads (the columns of a fused qkv tensor, as in the GPT) with fewer queries than keys,
    and against the oracle."""
    F = mica.nn.functional

    def step(qkv, u):
        q, k, v = qkv.split(24, dim=-1)
        q, k, v = (t.reshape(2, 9, 3, 8).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q[:, :, :7], k, v, is_causal=causal)
        return o, mica.grad(o, [qkv], grad_output=u)

    program = mica.trace(step, mica.dtypes.Spec((2, 9, 72), BF16), mica.dtypes.Spec((2, 3, 7, 8), BF16))
    rng = np.random.default_rng(4)
    args = [_bf16_values(rng, s) for s in ((2, 9, 72), (2, 3, 7, 8))]
    native = program.lower(CTarget(bf16_gemm=kernel))
    assert sum(n.op.startswith("attention") and n.inputs[0].dtype is BF16 for n in native.graph.nodes) == 2
    got = native.build()(*args, threads=2)
    want = program.lower(_WidenedAttention(bf16_gemm=kernel)).build()(*args, threads=2)
    for g, w in zip(mica.pytree.flatten(got)[0], mica.pytree.flatten(want)[0]):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        if kernel == "f32":
            np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
        else:
            assert rel_err(g, w) <= 2.0 ** -16
    oracle = mica.reference.run(program, *args, precision="float32")
    for g, w in zip(mica.pytree.flatten(got)[0], mica.pytree.flatten(oracle)[0]):
        assert rel_err(g, w) <= 2.0 ** -8


def test_the_float32_fallback_runs_on_mica_own_float32_kernel_too():
    """Without OpenBLAS (blas="own") the fallback's float32 product is mica_sgemm, its packing in the
    bfloat16 product's scratch: the same bound against the oracle, batched and transposed."""
    shape = ((2,), 70, 45, 131, 1, 1)
    rng = np.random.default_rng(12)
    program, sa, sb = _program(*shape)
    a, b = _bf16_values(rng, sa), _bf16_values(rng, sb)
    got = np.asarray(program.lower("cpu", blas="own", bf16_gemm="f32").build()(a, b, threads=2), np.float32)
    size = np.abs(np.swapaxes(a, -1, -2)).astype(np.float64) @ np.abs(np.swapaxes(b, -1, -2)).astype(np.float64)
    _check_against_oracle(got, mica.reference.run(program, a, b, precision="float32"), 131, size)


class _NoBf16Epilogue(CTarget):
    """The CPU target with every elementwise loop after a bfloat16 product run as its own pass."""

    def product_epilogue(self, gemm, loop):
        return gemm.a.dtype is not BF16 and super().product_epilogue(gemm, loop)


@pytest.mark.parametrize("kernel", KERNELS)
def test_elementwise_loops_riding_on_bfloat16_products_change_no_bit(kernel):
    """gelu on a bfloat16 product, a float32 residual add after another, and the backward's casts:
    run on each tile of the product (a 32-row block of the packed kernels, one of the float32
    fallback's OpenBLAS tiles), the same bits as run as passes of their own (the packed kernels'
    B past the L2 budget: their k in chunks, the epilogue after the last)."""
    F = mica.nn.functional

    def step(x, w1, w2, u):
        with mica.autocast(dtype=mica.bfloat16):
            h = F.gelu(F.linear(x, w1))
            y = x + F.linear(h, w2)
        return y, mica.grad(y, [x, w1, w2], grad_output=u)

    shapes = ((70, 4000), (200, 4000), (4000, 200), (70, 4000))
    program = mica.trace(step, *(mica.f32[s] for s in shapes))
    rng = np.random.default_rng(8)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    fused = program.lower(CTarget(bf16_gemm=kernel))
    assert sum(k.kind == "gemm" and k.epilogue is not None for k in fused.schedule.kernels) >= 2
    got = fused.build()(*args, threads=2)
    want = program.lower(_NoBf16Epilogue(bf16_gemm=kernel)).build()(*args, threads=2)
    for g, w in zip(mica.pytree.flatten(got)[0], mica.pytree.flatten(want)[0]):
        np.testing.assert_array_equal(np.asarray(g, np.float32).view(np.uint32), np.asarray(w, np.float32).view(np.uint32))
    oracle = mica.reference.run(program, *args, precision="float32")
    for g, w in zip(mica.pytree.flatten(got)[0], mica.pytree.flatten(oracle)[0]):
        assert rel_err(g, w) <= 2.0 ** -8


class _SumsStored(CTarget):
    """The CPU target with every product's float32 sums stored before its epilogue reads them."""

    def product_keeps_sums(self, gemm):
        return False


@pytest.mark.parametrize("kernel", KERNELS[:2])
def test_a_biased_products_float32_sums_go_to_its_epilogue_unstored(kernel):
    """A bfloat16 linear with a bias keeps its product's float32 sums, for the bias to join them
    before the one rounding; only the epilogue reads them, so the packed kernels hand it each 32 x 32
    block of sums in cache (mica_bf16gemm_stored) and the [M, N] float32 result takes no memory (it
    was +13-17% of a biased half model's activations). The same bits as stored and read back, for
    one thread or two, with k in one pass or in chunks (K = 4000: packed B past the L2 budget)."""
    F = mica.nn.functional

    def step(x, w1, b1, w2, b2, u):
        with mica.autocast(dtype=mica.bfloat16):
            h = F.gelu(F.linear(x, w1, b1))
            y = x + F.linear(h, w2, b2)
        return y, mica.grad(y, [x, w1, b1, w2, b2], grad_output=u)

    shapes = ((70, 4000), (200, 4000), (200,), (4000, 200), (4000,), (70, 4000))
    program = mica.trace(step, *(mica.f32[s] for s in shapes))
    rng = np.random.default_rng(18)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    unstored = program.lower(CTarget(bf16_gemm=kernel))
    stored = program.lower(_SumsStored(bf16_gemm=kernel))
    plan = unstored.plan
    sizes = sorted(b.nbytes for b in unstored.schedule.buffers if b.id in plan.unstored)
    assert sizes == [70 * 200 * 4, 70 * 4000 * 4], sizes  # (both forward products' float32 sums)
    assert "2 products' float32 results (1,176,000 bytes) are never stored" in unstored.memory_report
    assert "mica_bf16gemm_stored(" in unstored.source and "mica_bf16gemm_stored(" not in stored.source
    assert plan.class_bytes["activations"] < stored.plan.class_bytes["activations"]
    want = stored.build()(*args, threads=2)
    exe = unstored.build()
    for threads in (1, 2):
        got = exe(*args, threads=threads)
        for g, w in zip(mica.pytree.flatten(got)[0], mica.pytree.flatten(want)[0]):
            np.testing.assert_array_equal(np.asarray(g, np.float32).view(np.uint32),
                                          np.asarray(w, np.float32).view(np.uint32))
    oracle = mica.reference.run(program, *args, precision="float32")
    for g, w in zip(mica.pytree.flatten(got)[0], mica.pytree.flatten(oracle)[0]):
        assert rel_err(g, w) <= 2.0 ** -8
    fallback = program.lower(CTarget(bf16_gemm="f32"))  # (whose OpenBLAS tiles store their sums first)
    assert not fallback.plan.unstored and "never stored" not in fallback.memory_report


_CHUNKS_C = r"""
#include "mica_bf16gemm.h"
#include <stdio.h>
/* each shape's product (bfloat16 out, then float32 out) written to stdout as bytes, after
 * mica_bf16gemm_shared_bytes on stderr */
int main(void) {
    int shapes[][5] = {{40, 70, 20000, 0, 1}, {33, 600, 1400, 1, 0}, {65, 50, 13000, 1, 1}};
    for (int s = 0; s < 3; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ta = shapes[s][3], tb = shapes[s][4];
        mica_bf16 *a = malloc(2 * (size_t)M * K), *b = malloc(2 * (size_t)K * N);
        float *c = malloc(4 * (size_t)M * N);
        uint32_t x = 7u + s;
        for (long i = 0; i < (long)M * K; i++) { x = x * 1664525u + 1013904223u; a[i] = mica_bf16_store((int)(x >> 9) / 4194304.0f - 1.0f); }
        for (long i = 0; i < (long)K * N; i++) { x = x * 1664525u + 1013904223u; b[i] = mica_bf16_store((int)(x >> 9) / 4194304.0f - 1.0f); }
        int64_t shared = mica_bf16gemm_shared_bytes(M, N, K);
        fprintf(stderr, "%d %d %d %lld\n", M, N, K, (long long)shared);
        char *work = aligned_alloc(64, (shared + 63) / 64 * 64), *scratch = aligned_alloc(64, 8 * mica_bf16gemm_thread_bytes(K));
        for (int out_bf16 = 1; out_bf16 >= 0; out_bf16--) {
            mica_bf16gemm(M, N, K, a, ta ? M : K, ta, b, tb ? K : N, tb, c, N, out_bf16, work, scratch);
            fwrite(c, out_bf16 ? 2 : 4, (size_t)M * N, stdout);
        }
        free(a); free(b); free(c); free(work); free(scratch);
    }
    return 0;
}
"""


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k.values[0] != "f32"])
def test_k_chunks_change_no_bit_and_the_scratch_sizes_agree(kernel, tmp_path):
    """Products whose packed B passes the L2 budget run in k chunks, each block's float32 sums kept
    between them: the same bits as one pass over k (a build with the budget raised), for 1 and 2
    threads; and mica_bf16gemm_shared_bytes is what bf16gemm.shared_bytes reserves."""
    from mica.backends.c.build import INCLUDES

    src = tmp_path / "chunks.c"
    src.write_text(_CHUNKS_C)
    outs = {}
    for budget in ("", "-DMICA_BF16_L2=(1LL<<40)"):
        exe = str(tmp_path / f"chunks{len(outs)}")
        subprocess.run(["gcc", "-O2", "-march=native", "-fopenmp", "-ffp-contract=off", *INCLUDES,
                        f"-DMICA_BF16_GEMM={bf16gemm.KERNELS[kernel]}", *([budget] if budget else []), str(src),
                        "-o", exe, "-lm"], check=True)
        for threads in (1, 2):
            r = subprocess.run([exe], capture_output=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads)),
                               check=True)
            outs[(budget, threads)] = r.stdout
            if not budget:
                for line in r.stderr.decode().split("\n")[:-1]:
                    M, N, K, shared = map(int, line.split())
                    assert shared == bf16gemm.shared_bytes(kernel, M, N, K)
                    assert bf16gemm.k_chunk(-(-K // 32) * 32, -(-N // 32) * 32) < -(-K // 32) * 32  # chunked
    first = outs[("", 1)]
    assert len(first) == 6 * (40 * 70 + 33 * 600 + 65 * 50)
    assert all(o == first for o in outs.values())
