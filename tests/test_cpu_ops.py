"""Every program of the op table, compiled for the CPU and for CUDA (run on the simulator), against
the float64 oracle on fresh random inputs (forward values and gradients, computed in float64 by
both)."""
import zlib

import numpy as np
import pytest

import mica
from helpers import rel_err, spec_of
from test_ops import CASES


def _case_program(fn, inputs, grad, rng):
    arrays = [i.draw(rng) for i in inputs]
    floats = [k for k, a in enumerate(arrays) if a.dtype.kind == "f"]
    probe = mica.trace(lambda *xs: fn(mica, *xs), *[spec_of(a) for a in arrays])
    out_spec = probe.outputs
    differentiable = grad and floats and out_spec.dtype.kind == "float"
    u = np.asarray(rng.standard_normal(out_spec.shape))

    def body(xs, cot):
        out = fn(mica, *xs)
        if not differentiable:
            return out, []
        return out, mica.grad(out, [xs[k] for k in floats], grad_output=cot)

    return arrays, u, body


from test_cuda import needs_simulator

TARGETS = [pytest.param(("cpu", "float64"), id="cpu"),
           pytest.param(("cuda-sim", "float64"), id="cuda-sim", marks=needs_simulator),
           pytest.param(("cpu", "bfloat16"), id="cpu-bf16"), pytest.param(("cpu", "float16"), id="cpu-f16"),
           pytest.param(("cuda-sim", "bfloat16"), id="cuda-sim-bf16", marks=needs_simulator),
           pytest.param(("cuda-sim", "float16"), id="cuda-sim-f16", marks=needs_simulator)]
# a half type's eps: the oracle's half-rounding mode is matched to one rounding (products sum in
# another order); against float64, which also skips rounding the inputs, to ten
HALF_EPS = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
MIXED = ("flatten",)  # (builds a float64 tensor of its own: no half-type program)


@pytest.fixture(scope="module", params=TARGETS)
def compiled(request):
    """All cases in one program (one compile) for a target and element type (the table's float64
    inputs, or the same values held in a half type), and the oracle's answers."""
    target, dtype = request.param
    bodies, inputs, ids = [], [], []
    for param in CASES:
        if dtype != "float64" and param.id in MIXED:
            continue
        fn, ins, _, _, grad = param.values
        rng = np.random.default_rng(zlib.crc32(("cpu-" + param.id).encode()))
        arrays, u, body = _case_program(fn, ins, grad, rng)
        bodies.append(body)
        inputs.append((arrays, u))
        ids.append(param.id)

    def everything(all_inputs):
        return [body(xs, u) for body, (xs, u) in zip(bodies, all_inputs)]

    def spec(a):
        s = spec_of(a)
        return mica.dtypes.Spec(s.shape, getattr(mica, dtype)) if s.dtype is mica.float64 else s

    specs = [([spec(a) for a in xs], spec(u)) for xs, u in inputs]
    program = mica.trace(everything, specs)
    if target == "cpu":
        got = program.lower("cpu", opt_level=2).build()(inputs, threads=2)
    else:
        got = program.lower("cuda", simulate=True).build()(inputs)
    want64 = mica.reference.run(program, inputs)
    want32 = mica.reference.run(program, inputs, precision="float32")
    return dtype, dict(zip(ids, zip(got, want64, want32)))


@pytest.mark.parametrize("case_id", [p.id for p in CASES])
def test_compiled_case_matches_oracle(compiled, case_id):
    """Programs in float64 match the float64 oracle to 1e-12. Programs that round through float32
    or bfloat16 (casts) match the float32 oracle, which rounds exactly where they do. In a half
    type: the oracle's half-rounding mode to one rounding, the float64 oracle to ten."""
    dtype, cases = compiled
    if case_id not in cases:
        pytest.skip(f"{case_id} builds a float64 tensor of its own")
    (out, grads), want64, want32 = cases[case_id]
    if dtype != "float64":
        eps = HALF_EPS[dtype]
        for got, tight, loose in zip([out, *grads], [want32[0], *want32[1]], [want64[0], *want64[1]]):
            if np.asarray(tight).dtype.kind == "f":
                assert rel_err(got, tight) <= eps and rel_err(got, loose) <= 10 * eps
            else:
                np.testing.assert_array_equal(got, tight)
        return
    narrow = case_id in ("float_double", "to_type_as", "bfloat16_roundtrip")
    (want_out, want_grads), tol = (want32, 1e-6) if narrow else (want64, 1e-12)
    if np.asarray(want_out).dtype.kind == "f":
        assert rel_err(out, want_out) <= tol
    else:
        np.testing.assert_array_equal(out, want_out)
    assert len(grads) == len(want_grads)
    for g, w in zip(grads, want_grads):
        assert rel_err(g, w) <= tol


def test_attention_with_fewer_queries_than_keys_after_another_attention():
    """The backward's dK/dV products read key columns past a row block's last visible key: they must
    be zeros, not what an earlier kernel left in the scratch (a float32 bug the bf16 table found)."""
    F = mica.nn.functional

    def step(a, b, c, u1, u2):
        o1 = F.scaled_dot_product_attention(a, a, a, is_causal=True)
        o2 = F.scaled_dot_product_attention(b, c, c, is_causal=True, scale=0.12)
        return mica.grad(o1, [a], grad_output=u1) + mica.grad(o2, [b, c], grad_output=u2)

    shapes = ((1, 2, 8, 8), (1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 8, 8), (1, 2, 4, 8))
    program = mica.trace(step, *(mica.f32[s] for s in shapes))
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = program.lower("cpu").build()(*args, threads=2)
    want = mica.reference.run(program, *args)
    for g, w in zip(got, want):
        assert rel_err(g, w) < 1e-5
