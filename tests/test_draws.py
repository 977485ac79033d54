"""Random draws inside a compiled step (the rand primitive): torch.rand/randn/rand_like/randn_like/
bernoulli/normal in a traced function draw from the program's stream, keyed as dropout is by the
run's seed and offset (mica.manual_seed repeats a call's draws, the next call draws anew), the
same bits on any thread count and in the oracle; a VAE's reparameterization
(`eps = torch.randn_like(std)`, an outside tester's port) trains compiled. Mica's numbers are not
torch's (another generator): their statistics are checked, not their values."""
import numpy as np
import pytest

import mica


def _draws(x):
    return (mica.randn_like(x), mica.rand(3, 1000), mica.bernoulli(mica.full((4000,), 0.3)),
            mica.normal(x, 2.0), mica.rand_like(x, dtype=mica.float16), mica.randn(2, 2000, dtype=mica.float64),
            mica.randint(3, 13, (6000,)))  # (a diffusion model's timesteps)


def test_draws_in_a_compiled_step_have_their_distributions_and_repeat_with_the_seed():
    step = mica.compile(_draws)
    x = np.full((4, 1000), 3.0, np.float32)
    mica.manual_seed(0)
    first = [np.asarray(t) for t in step(x)]
    n, u, b, shifted, half, wide, ints = first
    assert ints.dtype == np.int64 and ints.min() == 3 and ints.max() == 12
    assert np.abs(np.bincount(ints - 3) / 6000 - 0.1).max() < 0.02
    assert n.dtype == np.float32 and half.dtype == np.float16 and wide.dtype == np.float64
    for draws, mean, std in ((n, 0.0, 1.0), (u, 0.5, 12 ** -0.5), (b, 0.3, 0.21 ** 0.5), (shifted, 3.0, 2.0),
                             (half.astype(np.float32), 0.5, 12 ** -0.5), (wide, 0.0, 1.0)):
        k = draws.size
        assert abs(draws.mean() - mean) < 5 * std / k ** 0.5 and abs(draws.std() - std) < 0.05 * std
    assert 0.0 <= u.min() and u.max() < 1.0 and set(np.unique(b)) == {0.0, 1.0}
    assert abs(np.corrcoef(n.reshape(-1)[:-1], n.reshape(-1)[1:])[0, 1]) < 0.05  # (neighbours independent)
    assert not np.array_equal(n, np.asarray(step(x)[0]))  # (the next call draws anew)
    mica.manual_seed(0)
    again = [np.asarray(t) for t in step(x, threads=1)]  # (the seed repeats them, on any thread count)
    assert all(np.array_equal(p, q) for p, q in zip(first, again))


def test_the_compiled_draws_are_the_oracles():
    x = np.zeros((3, 50), np.float32)
    program = mica.trace(lambda x: (mica.rand_like(x), mica.randn_like(x)), mica.f32[3, 50])
    want = mica.reference.run(program, x, seed=11, offset=4)
    got = mica.compile(lambda x: (mica.rand_like(x), mica.randn_like(x)))(x, seed=11, offset=4)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))  # (24 bits over 2**24: exact)
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-5, atol=1e-5)  # (float32's log, cos)


def test_a_vae_step_with_its_reparameterization_compiles_and_trains():
    """The standard VAE: eps = randn_like(std) inside the step (was a sentence: draw outside)."""
    rng = np.random.default_rng(0)
    enc, mu_head, lv_head, dec = (mica.nn.Linear(16, 8), mica.nn.Linear(8, 2), mica.nn.Linear(8, 2),
                                  mica.nn.Linear(2, 16))
    params = [p for m in (enc, mu_head, lv_head, dec) for p in m.parameters()]
    opt = mica.optim.Adam(params, lr=1e-2)
    F = mica.nn.functional

    @mica.compile
    def step(x):
        h = F.relu(enc(x))
        mu, logvar = mu_head(h), lv_head(h)
        std = mica.exp(0.5 * logvar)
        z = mu + std * mica.randn_like(std)
        recon = F.binary_cross_entropy(mica.sigmoid(dec(z)), x, reduction="sum")
        kl = -0.5 * mica.sum(1 + logvar - mu.pow(2) - logvar.exp())
        loss = (recon + kl) / x.shape[0]
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    data = (rng.random((32, 16)) < np.linspace(0.1, 0.9, 16)).astype(np.float32)
    losses = [float(step(data)) for _ in range(60)]
    assert np.isfinite(losses).all() and np.mean(losses[-10:]) < 0.85 * np.mean(losses[:5])
    with pytest.raises(mica.MicaError, match=r"^mica\.randn\(generator=\.\.\.\) inside a traced step"):
        mica.compile(lambda x: x + mica.randn(3, generator=mica.Generator().manual_seed(1)))(np.zeros(3, np.float32))


@pytest.mark.skipif(not __import__("test_cuda")._has_boost_context(), reason="libboost-context-dev is not installed")
def test_the_cuda_sources_draws_on_the_simulator_are_the_cpus():
    program = mica.trace(lambda x: (mica.rand_like(x), x + mica.randn_like(x), mica.bernoulli(x.sigmoid())),
                         mica.f32[5, 37])
    x = np.random.default_rng(1).standard_normal((5, 37)).astype(np.float32)
    cpu = program.lower("cpu").build()(x, seed=9, offset=2)
    sim = program.lower("cuda", simulate=True).build()(x, seed=9, offset=2)
    for a, b in zip(cpu, sim):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_tensors_in_place_draws_inside_a_step_are_the_programs():
    """timm's drop_path, `x.new_empty(shape).bernoulli_(keep_prob)`, and `empty(...).uniform_()` /
    `.normal_()` inside a compiled step were sentences: each draws from the program's stream, fresh
    at each call and repeated from mica.manual_seed."""
    def drop_path(x, keep=0.75):
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask.div_(keep)

    step = mica.compile(lambda x: (drop_path(x), mica.empty(3, 4).uniform_(-1, 1), mica.zeros(4000).normal_(2.0, 0.5),
                                   x.bernoulli()))
    mica.manual_seed(3)
    first = [np.asarray(t) for t in step(np.full((4000, 2), 0.25, np.float32))]
    kept = first[0][:, 0]
    np.testing.assert_allclose(np.unique(kept), [0.0, 0.25 / 0.75], rtol=1e-6)
    assert abs((kept > 0).mean() - 0.75) < 0.03
    assert np.all(first[0][:, 0] == first[0][:, 1])  # (one draw per sample, broadcast over its row)
    assert first[1].min() >= -1 and first[1].max() < 1 and len(np.unique(first[1])) == 12
    assert abs(first[2].mean() - 2.0) < 0.05 and abs(first[2].std() - 0.5) < 0.05
    assert abs(first[3].mean() - 0.25) < 0.03
    again = [np.asarray(t) for t in step(np.full((4000, 2), 0.25, np.float32))]
    assert not np.array_equal(again[0], first[0])
    mica.manual_seed(3)
    np.testing.assert_array_equal(np.asarray(step(np.full((4000, 2), 0.25, np.float32))[0]), first[0])
