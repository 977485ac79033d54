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


_ROW_MAX_C = r"""
#include <stdio.h>
#include <string.h>
#include "mica_rows.h"
static uint64_t s = 88172645463325252ull;
static uint64_t next(void) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; }
static float pick_f(void) {  /* few distinct values, so ties, zeros of both signs and NaNs are common */
    uint32_t pool[] = {0x00000000u, 0x80000000u, 0x7FC00000u, 0x7FC00001u, 0xFFC00002u, 0x7F800000u, 0xFF800000u,
                       0x3F800000u, 0xBF800000u, 0x40000000u, 0x00000001u, 0x80000001u};
    uint64_t r = next();
    if (r % 3) { float f = (float)((int64_t)(r >> 20) % 1000) / 7.0f; return f; }
    float f; memcpy(&f, &pool[(r >> 8) % 12], 4); return f;
}
int main(void) {
    float x[300]; double d[300];
    long bad = 0, rows = 0;
    for (int t = 0; t < 200000; t++) {
        int64_t n = 1 + next() % 300;
        int nan_ok = next() % 4 == 0, neg = next() % 2;
        for (int64_t j = 0; j < n; j++) {
            float f = pick_f();
            if (!nan_ok && f != f) f = 0.0f;
            if (neg && f > 0) f = -f;   /* rows whose maximum is a zero, or negative */
            x[j] = f; d[j] = (double)f;
        }
        float a = mica_row_max_f32(x, n), b = mica_row_max_seq_f32(x, n);
        double c = mica_row_max_f64(d, n), e = mica_row_max_seq_f64(d, n);
        bad += memcmp(&a, &b, 4) != 0 || memcmp(&c, &e, 8) != 0;
        /* attention's row: n visible of a row `len` long, its loops padded to mica_attn_row_span */
        int64_t len = n + next() % 40, w = mica_attn_row_span(n, len);
        float xp[340]; double dp[340];
        memcpy(xp, x, 4 * n); memcpy(dp, d, 8 * n);
        for (int64_t j = n; j < len; j++) { xp[j] = pick_f(); dp[j] = (double)xp[j]; }  /* not visible */
        float ap = mica_attn_row_max_f32(xp, n, w);
        double cp = mica_attn_row_max_f64(dp, n, w);
        bad += memcmp(&ap, &b, 4) != 0 || memcmp(&cp, &e, 8) != 0 || memcmp(xp, x, 4 * n) != 0
               || memcmp(dp, d, 8 * n) != 0;
        rows++;
    }
    printf("%ld %ld\n", rows, bad);
    return 0;
}
"""


def test_the_vectorized_row_maximum_is_the_left_to_right_one_bit_for_bit(tmp_path):
    """mica_row_max (softmax, cross-entropy, attention rows) takes sixteen lanes at a time; on 200,000
    fuzzed rows of 1-300 values (ties, zeros of both signs, infinities, NaNs with different payloads,
    subnormals) it returns the very bits of mica_max applied left to right: the first NaN, else the
    last largest. So does attention's padded row maximum (mica_attn_row_max: the row's visible
    values followed by up to 39 it must not see, any of them NaN), leaving the visible ones as they
    were."""
    import subprocess

    from mica.backends.c.build import BASE_FLAGS, INCLUDES

    src, exe = tmp_path / "rowmax.c", tmp_path / "rowmax"
    src.write_text(_ROW_MAX_C)
    subprocess.run(["gcc", "-O3", *[f for f in BASE_FLAGS if f != "-fPIC"], *INCLUDES, str(src), "-o", str(exe),
                    "-lm"], check=True)
    rows, bad = map(int, subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split())
    assert rows == 200000 and bad == 0


def test_float16_conversions_are_the_hardwares_bit_for_bit():
    """The C runtime converts float16 with integer and float operations (so loops over float16
    vectorize): every one of the 65,536 float16 values widens exactly, and float32 values from
    the whole range (random bit patterns; the edges of the subnormals, of the largest finite half
    and of its overflow, ties both ways) round to nearest even as numpy's (and F16C's) conversion
    does; NaN stays NaN."""
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    rng = np.random.default_rng(16)
    edges = np.array([0.0, -0.0, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -26,
                      65504.0, 65519.99, 65520.0, 65535.0, 65536.0, 1e30, np.inf, -np.inf, np.nan,
                      1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 2.0 ** -14 - 2.0 ** -25, 6.1e-5], np.float64)
    floats = np.concatenate([rng.integers(0, 1 << 32, 1 << 17, dtype=np.uint64).astype(np.uint32).view(np.float32),
                             (rng.standard_normal(1 << 15) * np.exp2(rng.integers(-30, 18, 1 << 15))).astype(np.float32),
                             edges.astype(np.float32), -edges.astype(np.float32)])

    def convert(h, x):
        return h.to(mica.float32), x.to(mica.float16)

    exe = mica.compile(convert, mica.dtypes.Spec(halves.shape, mica.float16), mica.f32[floats.size])
    wide, narrow = exe(halves, floats, threads=2)
    with np.errstate(over="ignore"):
        want_wide, want_narrow = halves.astype(np.float32), floats.astype(np.float16)
    nan = np.isnan(want_wide)
    assert np.array_equal(np.isnan(wide), nan)
    assert np.array_equal(wide[~nan].view(np.uint32), want_wide[~nan].view(np.uint32))
    nan = np.isnan(want_narrow)
    assert np.array_equal(np.isnan(narrow), nan)
    assert np.array_equal(narrow[~nan].view(np.uint16), want_narrow[~nan].view(np.uint16))


def test_float16_products_convert_their_operands_and_results_as_the_loops_do():
    """A float16 product widens its operands and rounds its float32 results in bulk (eight at a
    time by the processor's F16C instructions where it has them, mica_bf16gemm.h); the bits must be
    the loops' (and numpy's): every one of the 65,536 float16 values times factors whose exact
    float32 products land on ties, subnormals, overflow and NaN, rounded once to float16, and
    widened as they are where the factor is 1."""
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    factors = np.array([1.0, 0.5, 2.0 ** -10, 3.0, -1.5, 2.0 ** -14, 1.0 + 2.0 ** -10, 1000.0, -(2.0 ** 11) - 1.0],
                       np.float16)

    def outer(a, b):
        return mica.matmul(a, b), mica.matmul(a, b).to(mica.float32), mica.matmul(a, b[:, :1].to(mica.float32).to(mica.float16))

    F16 = mica.float16
    exe = mica.compile(outer, mica.dtypes.Spec((halves.size, 1), F16), mica.dtypes.Spec((1, factors.size), F16))
    narrow, _, wide = exe(halves[:, None], factors[None, :], threads=2)
    with np.errstate(over="ignore", invalid="ignore"):
        # exact (22 bits); + 0: a product's sum starts from +0, so -0 comes out +0
        exact = halves.astype(np.float32)[:, None] * factors.astype(np.float32)[None, :] + np.float32(0)
        want = exact.astype(np.float16)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(narrow), nan)
    assert np.array_equal(narrow[~nan].view(np.uint16), want[~nan].view(np.uint16))
    assert np.count_nonzero(~nan & (want != exact)) > 100_000  # (results that round: the test means something)
    nan = np.isnan(halves)
    wide = np.asarray(wide, np.float32)[:, 0]
    assert np.array_equal(np.isnan(wide), nan)
    assert np.array_equal(wide[~nan].view(np.uint32), (halves[~nan].astype(np.float32) + np.float32(0)).view(np.uint32))
