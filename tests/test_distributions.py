"""mica.distributions against torch.distributions 2.13: log_prob, entropy, mean, variance, cdf and
kl_divergence eagerly and inside a compiled step (with their gradients: a REINFORCE loss, a VAE's
KL term, a reparametrised sample), sample shapes, and samples' frequencies (Mica's generator, not
torch's numbers)."""
import numpy as np
import pytest

import mica
import mica.distributions as md

torch = pytest.importorskip("torch")
td = torch.distributions

RNG = np.random.default_rng(0)
LOGITS = RNG.standard_normal((4, 5)).astype(np.float32)
PROBS = RNG.random((4, 5)).astype(np.float32) + 0.05
LOC, SCALE = RNG.standard_normal((3, 2)).astype(np.float32), RNG.random((3, 2)).astype(np.float32) + 0.3
BPROBS = RNG.random(6).astype(np.float32) * 0.9 + 0.05


def _pairs():
    """(name, mica distribution, torch distribution, a value of its support)"""
    return [
        ("categorical probs", md.Categorical(probs=mica.tensor(PROBS)), td.Categorical(probs=torch.tensor(PROBS)),
         np.array([0, 4, 2, 1])),
        ("categorical logits", md.Categorical(logits=mica.tensor(LOGITS)), td.Categorical(logits=torch.tensor(LOGITS)),
         np.array([3, 3, 0, 1])),
        ("normal", md.Normal(mica.tensor(LOC), mica.tensor(SCALE)), td.Normal(torch.tensor(LOC), torch.tensor(SCALE)),
         RNG.standard_normal((3, 2)).astype(np.float32)),
        ("normal numbers", md.Normal(0.5, 2.0), td.Normal(0.5, 2.0), np.float32(0.25)),
        ("bernoulli probs", md.Bernoulli(probs=mica.tensor(BPROBS)), td.Bernoulli(probs=torch.tensor(BPROBS)),
         np.array([0, 1, 1, 0, 1, 0], np.float32)),
        ("bernoulli logits", md.Bernoulli(logits=mica.tensor(LOGITS[0])), td.Bernoulli(logits=torch.tensor(LOGITS[0])),
         np.array([1, 1, 0, 0, 1], np.float32)),
        ("uniform", md.Uniform(mica.tensor(LOC), mica.tensor(LOC + SCALE)),
         td.Uniform(torch.tensor(LOC), torch.tensor(LOC + SCALE)), LOC + SCALE * 0.5),
        ("independent normal", md.Independent(md.Normal(mica.tensor(LOC), mica.tensor(SCALE)), 1),
         td.Independent(td.Normal(torch.tensor(LOC), torch.tensor(SCALE)), 1), LOC * 0.5),
        ("one-hot", md.OneHotCategorical(probs=mica.tensor(PROBS)), td.OneHotCategorical(probs=torch.tensor(PROBS)),
         np.eye(5, dtype=np.float32)[[1, 0, 4, 2]]),
    ]


@pytest.mark.parametrize("index", range(len(_pairs())), ids=[p[0] for p in _pairs()])
def test_values_are_torchs(index):
    _, ours, theirs, value = _pairs()[index]
    assert ours.batch_shape == tuple(theirs.batch_shape) and ours.event_shape == tuple(theirs.event_shape)
    checks = [("log_prob", lambda d, v: d.log_prob(v)), ("entropy", lambda d, v: d.entropy())]
    for attr in ("mean", "variance", "stddev"):
        checks.append((attr, lambda d, v, a=attr: getattr(d, a)))
    if not isinstance(ours, (md.Categorical, md.OneHotCategorical, md.Bernoulli, md.Independent)):
        checks.append(("cdf", lambda d, v: d.cdf(v)))
    for what, f in checks:
        got = np.asarray(f(ours, mica.tensor(value)))
        want = f(theirs, torch.tensor(value)).numpy()
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, err_msg=what)
    for shape in ((), (7,), (2, 3)):
        assert tuple(ours.sample(shape).shape) == tuple(theirs.sample(shape).shape)


def test_kl_divergences_are_torchs():
    p, q = (LOC, SCALE), (LOC[::-1].copy(), SCALE[::-1].copy() + 0.1)
    cases = [(md.Normal(*map(mica.tensor, p)), md.Normal(*map(mica.tensor, q)),
              td.Normal(*map(torch.tensor, p)), td.Normal(*map(torch.tensor, q))),
             (md.Categorical(logits=mica.tensor(LOGITS)), md.Categorical(probs=mica.tensor(PROBS)),
              td.Categorical(logits=torch.tensor(LOGITS)), td.Categorical(probs=torch.tensor(PROBS))),
             (md.Bernoulli(probs=mica.tensor(BPROBS)), md.Bernoulli(probs=mica.tensor(BPROBS[::-1].copy())),
              td.Bernoulli(probs=torch.tensor(BPROBS)), td.Bernoulli(probs=torch.tensor(BPROBS[::-1].copy()))),
             (md.Uniform(0.0, 1.0), md.Uniform(-1.0, 2.0), td.Uniform(0.0, 1.0), td.Uniform(-1.0, 2.0)),
             (md.Independent(md.Normal(*map(mica.tensor, p)), 1), md.Independent(md.Normal(*map(mica.tensor, q)), 1),
              td.Independent(td.Normal(*map(torch.tensor, p)), 1), td.Independent(td.Normal(*map(torch.tensor, q)), 1))]
    for a, b, ta, tb in cases:
        np.testing.assert_allclose(np.asarray(md.kl_divergence(a, b)), td.kl_divergence(ta, tb).numpy(), rtol=2e-6,
                                   atol=2e-6)
    with pytest.raises(mica.MicaError, match="kl_divergence between Normal and Bernoulli is not one Mica has"):
        md.kl_divergence(cases[0][0], cases[2][0])


def test_a_reinforce_loss_and_a_vae_kl_in_a_compiled_step_have_torchs_gradients():
    """The policy-gradient example's loss, recomputed in a compiled step from the episode's states
    and actions (`-Categorical(probs).log_prob(actions) * returns`, minus an entropy bonus), and a
    VAE's `kl_divergence(Normal(mu, sigma), Normal(0, 1))` with a reparametrised sample."""
    rng = np.random.default_rng(1)
    states, actions = rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, 3, 6)
    returns = rng.standard_normal(6).astype(np.float32)
    w = rng.standard_normal((4, 3)).astype(np.float32)

    def loss(lib, dist, w, states, actions, returns):
        probs = lib.nn.functional.softmax(states @ w, dim=-1)
        m = dist.Categorical(probs)
        mu, sigma = states @ w[:, :2], lib.exp(0.1 * (states @ w[:, 1:]))
        kl = dist.kl_divergence(dist.Normal(mu, sigma), dist.Normal(lib.zeros_like(mu), lib.ones_like(sigma)))
        return (-(m.log_prob(actions) * returns).sum() - 0.01 * m.entropy().mean() + kl.sum(1).mean()
                + dist.Bernoulli(logits=mu).log_prob((mu > 0).float()).mean())

    got_loss, got_grad = mica.compile(lambda *a: mica.value_and_grad(lambda w, *r: loss(mica, md, w, *r))(*a))(
        mica.tensor(w), mica.tensor(states), mica.tensor(actions), mica.tensor(returns))
    tw = torch.tensor(w, requires_grad=True)
    want = loss(torch, td, tw, torch.tensor(states), torch.tensor(actions), torch.tensor(returns))
    want.backward()
    np.testing.assert_allclose(float(got_loss), float(want), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got_grad), tw.grad.numpy(), rtol=1e-4, atol=1e-6)

    def reparametrised(mu):  # (rsample: loc + eps * scale, the gradient reaching loc and scale)
        z = md.Normal(mu, mica.exp(mu)).rsample((3,))
        return z.sum(), z

    mica.manual_seed(0)
    mu = rng.standard_normal(4).astype(np.float32)
    def both(m):
        total, z = reparametrised(m)
        return z, mica.grad(total, m)

    z, g = mica.compile(both)(mica.tensor(mu))
    z = np.asarray(z)
    assert z.shape == (3, 4) and np.all(np.isfinite(z))
    # d/dmu of sum_s (mu + eps_s * exp(mu)) is 3 + sum_s eps_s * exp(mu) = 3 + sum_s (z_s - mu)
    np.testing.assert_allclose(np.asarray(g), 3 + (z - mu).sum(0), rtol=1e-5, atol=1e-5)


def test_samples_follow_their_distributions_and_repeat_from_a_seed():
    probs = np.array([0.1, 0.6, 0.3], np.float32)
    mica.manual_seed(5)
    drawn = np.asarray(md.Categorical(mica.tensor(probs)).sample((20000,)))
    np.testing.assert_allclose(np.bincount(drawn, minlength=3) / 20000, probs, atol=0.015)
    mica.manual_seed(5)
    np.testing.assert_array_equal(np.asarray(md.Categorical(mica.tensor(probs)).sample((20000,))), drawn)
    normal = np.asarray(md.Normal(mica.tensor([2.0]), mica.tensor([0.5])).sample((20000,)))
    assert normal.shape == (20000, 1) and abs(normal.mean() - 2) < 0.02 and abs(normal.std() - 0.5) < 0.02
    ones = np.asarray(md.Bernoulli(probs=mica.tensor([0.25])).sample((20000,)))
    assert abs(ones.mean() - 0.25) < 0.015
    traced = np.asarray(mica.compile(lambda p: md.Categorical(p).sample((4000,)))(mica.tensor(probs)))
    assert traced.shape == (4000,)
    np.testing.assert_allclose(np.bincount(traced, minlength=3) / 4000, probs, atol=0.03)
    with pytest.raises(mica.MicaError, match="Categorical takes either probs or logits, not both"):
        md.Categorical(probs=mica.tensor(probs), logits=mica.tensor(probs))
    with pytest.raises(mica.MicaError, match="Mica has no mica.distributions.Dirichlet"):
        md.Dirichlet(mica.ones(3))


def test_an_unbatched_categorical_samples_a_0d_index_as_torchs():
    """actor_critic.py's select_action: probs of one state, [2], sample a 0-d action."""
    probs = mica.tensor([0.3, 0.7])
    for shape, want in (((), ()), ((4,), (4,)), ((2, 3), (2, 3))):
        drawn = md.Categorical(probs).sample(shape)
        assert tuple(drawn.shape) == want == tuple(td.Categorical(torch.tensor([0.3, 0.7])).sample(shape).shape)
        assert np.asarray(drawn).dtype == np.int64
    traced = mica.compile(lambda p: md.Categorical(p).sample())(probs)
    assert tuple(traced.shape) == () and int(traced) in (0, 1)


def test_parameters_given_as_lists_and_numbers_are_tensors_as_torchs_broadcast():
    np.testing.assert_allclose(float(md.Categorical(probs=[0.2, 0.8]).log_prob(1)), np.log(0.8), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(md.Normal([0.0, 1.0], 1.0).mean), [0.0, 1.0])
