"""The float math of the C runtime (exp, log, tanh, erf, sigmoid, exact GELU and its slope), compiled
in float32, against float64 truth from Python's math module over a dense sweep of inputs and a
random draw, tails included. The bounds are in units of float32's rounding (2^-24 relative); they
sit just above what each function measures, so a change that loses accuracy fails here."""
import math

import numpy as np
import pytest

import mica

ULP = 2.0 ** -24


@pytest.fixture(scope="module")
def results():
    rng = np.random.default_rng(7)
    x = np.concatenate([np.linspace(-12.0, 12.0, 1 << 16), rng.standard_normal(1 << 15) * 3.0]).astype(np.float32)
    pos = np.concatenate([np.geomspace(1e-30, 1e30, 1 << 14), rng.uniform(0.0, 4.0, 1 << 14)]).astype(np.float32)

    def step(x, pos):
        return dict(exp=mica.exp(x), log=mica.log(pos), tanh=mica.tanh(x), erf=mica.erf(x),
                    sigmoid=mica.sigmoid(x), gelu=mica.gelu(x), gelu_slope=mica.grad(mica.gelu(x).sum(), x))

    got = mica.compile(step, mica.f32[x.size], mica.f32[pos.size])(x, pos, threads=2)
    xd, pd = x.astype(np.float64), pos.astype(np.float64)
    cdf = np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in xd])
    want = dict(exp=np.exp(xd), log=np.log(pd), tanh=np.tanh(xd), erf=np.array([math.erf(v) for v in xd]),
                sigmoid=1.0 / (1.0 + np.exp(-xd)), gelu=xd * cdf,
                gelu_slope=cdf + xd * np.exp(-0.5 * xd * xd) / math.sqrt(2.0 * math.pi))
    return got, want


@pytest.mark.parametrize("name,ulps", [("exp", 2), ("log", 4), ("tanh", 3), ("erf", 4), ("sigmoid", 3),
                                       ("gelu", 10)])
def test_relative_error_in_ulps(results, name, ulps):
    """Relative error wherever the true value is a normal float: GELU included, down its negative
    tail (x = -12, GELU ~ -2e-32), where 1 + erf(x/sqrt 2) would cancel to nothing."""
    got, want = results
    g, w = got[name].astype(np.float64), want[name]
    normal = np.abs(w) > 1.2e-38
    rel = np.abs(g - w)[normal] / np.abs(w)[normal]
    assert rel.max() <= ulps * ULP, f"{name}: {rel.max() / ULP:.1f} ulp"


def test_gelu_slope(results):
    """GELU's slope crosses zero near x = -0.75, so its error is bounded absolutely (it is O(1))."""
    got, want = results
    assert np.abs(got["gelu_slope"] - want["gelu_slope"]).max() <= 4e-7
