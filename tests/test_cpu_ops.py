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

TARGETS = [pytest.param("cpu", id="cpu"), pytest.param("cuda-sim", id="cuda-sim", marks=needs_simulator)]


@pytest.fixture(scope="module", params=TARGETS)
def compiled(request):
    """All cases in one program (one compile) for a target, and the oracle's answers."""
    bodies, inputs, ids = [], [], []
    for param in CASES:
        fn, ins, _, _, grad = param.values
        rng = np.random.default_rng(zlib.crc32(("cpu-" + param.id).encode()))
        arrays, u, body = _case_program(fn, ins, grad, rng)
        bodies.append(body)
        inputs.append((arrays, u))
        ids.append(param.id)

    def everything(all_inputs):
        return [body(xs, u) for body, (xs, u) in zip(bodies, all_inputs)]

    specs = [([spec_of(a) for a in xs], spec_of(u)) for xs, u in inputs]
    program = mica.trace(everything, specs)
    if request.param == "cpu":
        got = program.lower("cpu", opt_level=2).build()(inputs, threads=2)
    else:
        got = program.lower("cuda", simulate=True).build()(inputs)
    want64 = mica.reference.run(program, inputs)
    want32 = mica.reference.run(program, inputs, precision="float32")
    return dict(zip(ids, zip(got, want64, want32)))


@pytest.mark.parametrize("case_id", [p.id for p in CASES])
def test_compiled_case_matches_oracle(compiled, case_id):
    """Programs in float64 match the float64 oracle to 1e-12. Programs that round through float32
    or bfloat16 (casts) match the float32 oracle, which rounds exactly where they do."""
    (out, grads), want64, want32 = compiled[case_id]
    narrow = case_id in ("float_double", "to_type_as", "bfloat16_roundtrip")
    (want_out, want_grads), tol = (want32, 1e-6) if narrow else (want64, 1e-12)
    if np.asarray(want_out).dtype.kind == "f":
        assert rel_err(out, want_out) <= tol
    else:
        np.testing.assert_array_equal(out, want_out)
    assert len(grads) == len(want_grads)
    for g, w in zip(grads, want_grads):
        assert rel_err(g, w) <= tol
