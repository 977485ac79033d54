"""torch.autograd.Function in a traced step (mica/autograd.py, the custom_grad primitive): a
gradient reversal layer, a straight-through estimator and an exp with a saved output (torch 2's
setup_context form), against torch 2.13's values and gradients; in a torch-style compiled training
step; and the sentences for what Mica's Function does not take."""
import numpy as np
import pytest

import mica

torch = pytest.importorskip("torch")


def _functions(lib):
    class GradReverse(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x, alpha):
            ctx.alpha = alpha
            return x.view_as(x) * 1.0

        @staticmethod
        def backward(ctx, grad_output):
            return -ctx.alpha * grad_output, None

    class StraightThrough(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return (x > 0).float()

        @staticmethod
        def backward(ctx, grad_output):
            return grad_output

    class SavedExp(lib.autograd.Function):
        @staticmethod
        def forward(x):
            return x.exp()

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(output)

        @staticmethod
        def backward(ctx, grad_output):
            (y,) = ctx.saved_tensors
            return grad_output * y

    return GradReverse, StraightThrough, SavedExp


def _loss(lib, x, w):
    reverse, straight, saved_exp = _functions(lib)
    h = x @ w
    return (reverse.apply(h, 0.5) * 2).sum() + (straight.apply(h) * h).sum() + saved_exp.apply(h * 0.1).sum()


def test_custom_backwards_give_torchs_gradients():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    want = _loss(torch, tx, tw)
    want.backward()

    def both(x, w):
        loss = _loss(mica, x, w)
        return loss, mica.grad(loss, x), mica.grad(loss, w)

    loss, gx, gw = mica.compile(both)(mica.tensor(x), mica.tensor(w))
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gx), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gw), tw.grad.numpy(), rtol=1e-5, atol=1e-5)
    program = mica.trace(both, mica.f32[3, 4], mica.f32[4, 2])
    oracle = mica.reference.run(program, x, w)  # (the oracle runs the primitive as its identity too)
    np.testing.assert_allclose(np.asarray(oracle[1]), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    assert "custom_grad" not in program.lower("cpu").source  # (gone once the gradient is taken)
    np.testing.assert_array_equal(np.asarray(_functions(mica)[0].apply(mica.tensor(x), 0.5)), x)  # (eagerly: forward)


def test_a_gradient_reversal_layer_in_a_torch_style_step_trains_as_torchs():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    nets = []
    for lib in (torch, mica):
        lib.manual_seed(0)
        nets.append(lib.nn.Linear(4, 2))
    nets[1].load_state_dict(nets[0].state_dict())
    topt, mopt = torch.optim.SGD(nets[0].parameters(), lr=0.1), mica.optim.SGD(nets[1].parameters(), lr=0.1)
    net, (reverse, _, _) = nets[1], _functions(mica)
    treverse = _functions(torch)[0]

    @mica.compile
    def step(x):
        loss = reverse.apply(net(x), 1.0).square().mean()
        mopt.zero_grad()
        loss.backward()
        mopt.step()
        return loss

    for _ in range(3):
        loss = treverse.apply(nets[0](torch.tensor(x)), 1.0).square().mean()
        topt.zero_grad()
        loss.backward()
        topt.step()
        np.testing.assert_allclose(float(step(mica.tensor(x))), float(loss), rtol=1e-5)
    for (k, v), t in zip(net.state_dict().items(), nets[0].state_dict().values()):
        np.testing.assert_allclose(np.asarray(v), t.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)


def test_what_mica_functions_do_not_take_is_a_sentence():
    class Pair(mica.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x, x * 2

        @staticmethod
        def backward(ctx, a, b):
            return a + b

    class WrongShape(mica.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g.sum(0)[:1]

    with pytest.raises(mica.MicaError, match="gives one traced Tensor from forward, got tuple"):
        mica.compile(lambda x: Pair.apply(x)[0])(np.ones((2, 3), np.float32))
    with pytest.raises(mica.MicaError, match=r"WrongShape.backward returned a gradient of shape \[1\] for an argument "
                                             r"of shape \[2, 3\]"):
        mica.compile(lambda x: mica.grad(WrongShape.apply(x).sum(), x))(np.ones((2, 3), np.float32))
