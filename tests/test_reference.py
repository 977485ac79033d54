"""The oracle's two precisions, bf16 rounding, and counter-based dropout."""
import numpy as np
import pytest
import torch

import mica
from helpers import rel_err, to_torch
from mica.ops.philox import philox4x32


def test_philox_known_answers():
    # Random123's published known-answer vectors for Philox4x32-10
    cases = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
              (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in cases:
        got = philox4x32(*(np.array([c], np.uint64) for c in ctr), *key)
        assert tuple(int(g[0]) for g in got) == want


def test_float32_precision_matches_torch_float32():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)
    prog = mica.trace(lambda x, w: mica.softmax(mica.gelu(x @ w), -1), mica.f32[8, 16], mica.f32[16, 4])
    got = mica.reference.run(prog, x, w, precision="float32")
    assert got.dtype == np.float32
    want = torch.softmax(torch.nn.functional.gelu(to_torch(x) @ to_torch(w)), -1).numpy()
    assert rel_err(got, want) < 1e-6
    exact = mica.reference.run(prog, x, w)
    assert exact.dtype == np.float64 and 1e-9 < rel_err(got, exact) < 1e-5


def test_bfloat16_values_round_like_torch():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(1000) * 10).astype(np.float32)
    prog = mica.trace(lambda x: (x.bfloat16() * 3).float(), mica.f32[1000])
    got = mica.reference.run(prog, x, precision="float32")
    want = (to_torch(x).bfloat16() * 3).float().numpy()
    np.testing.assert_array_equal(got, want)


def test_bfloat16_product_accumulates_in_float32():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((4, 64)).astype(np.float32), rng.standard_normal((64, 3)).astype(np.float32)
    prog = mica.trace(lambda a, b: (a.bfloat16() @ b.bfloat16()).float(), mica.f32[4, 64], mica.f32[64, 3])
    got = mica.reference.run(prog, a, b, precision="float32")
    want = (to_torch(a).bfloat16() @ to_torch(b).bfloat16()).float().numpy()
    assert rel_err(got, want) < 1e-2


def test_precision_must_be_named():
    prog = mica.trace(lambda x: x, mica.f32[1])
    with pytest.raises(mica.MicaError, match="precision"):
        mica.reference.run(prog, np.ones(1), precision="float16")


def test_dropout_mask_rate_scale_and_gradient():
    p = 0.3
    n = 40_000

    def fn(x):
        y = mica.dropout(x, p)
        return y, mica.grad((y * 1.0).sum(), x)

    prog = mica.trace(fn, mica.f64[n])
    x = np.random.default_rng(3).uniform(1, 2, n)
    y, g = mica.reference.run(prog, x, seed=11, offset=2)
    kept = y != 0
    assert abs(kept.mean() - (1 - p)) < 0.01
    assert rel_err(y[kept], x[kept] / (1 - p)) < 1e-15
    np.testing.assert_array_equal(g != 0, kept)  # the backward applies the same mask
    y2, _ = mica.reference.run(prog, x, seed=11, offset=2)
    y3, _ = mica.reference.run(prog, x, seed=12, offset=2)
    np.testing.assert_array_equal(y, y2)
    assert not np.array_equal(y, y3)


def test_two_dropout_sites_draw_different_masks():
    prog = mica.trace(lambda x: (mica.dropout(x, 0.5), mica.dropout(x, 0.5)), mica.f32[1000])
    a, b = mica.reference.run(prog, np.ones(1000, np.float32))
    assert not np.array_equal(a != 0, b != 0)


def test_dropout_off_when_not_training():
    prog = mica.trace(lambda x: mica.dropout(x, 0.5, training=False), mica.f32[10])
    assert not prog.uses_rng
    assert all(prog.graph.nodes[i].op == "input" for i in range(len(prog.graph.nodes)))


def test_attention_dropout_is_consistent_between_forward_and_backward():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 5, 4)) for _ in range(3))

    def loss(q, k, v):
        return (mica.scaled_dot_product_attention(q, k, v, dropout_p=0.25, is_causal=True) ** 2).sum()

    prog = mica.trace(lambda q, k, v: mica.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v), *[mica.f64[2, 5, 4]] * 3)
    (val, grads) = mica.reference.run(prog, q, k, v, seed=5)
    fwd = mica.trace(loss, *[mica.f64[2, 5, 4]] * 3)
    dv = rng.standard_normal(v.shape)
    h = 1e-6
    fd = (mica.reference.run(fwd, q, k, v + h * dv, seed=5) - mica.reference.run(fwd, q, k, v - h * dv, seed=5)) / (2 * h)
    assert abs(fd - np.sum(grads[2] * dv)) < 1e-6 * max(1.0, abs(fd))
