"""F.group_norm and nn.GroupNorm against torch's: outputs and gradients compiled in float32 and
bfloat16 (computed in float32, rounded once), the module's parameters and repr, refusals."""
import numpy as np
import pytest
import torch

import mica


@pytest.mark.parametrize("shape,groups,dtype", [((2, 8, 5, 3), 4, "float32"), ((3, 6, 7), 3, "float32"),
                                                ((2, 6, 4), 1, "float32"), ((2, 8, 9), 2, "bfloat16")])
def test_group_norm_and_its_gradients_are_torchs(shape, groups, dtype):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    w, b = (rng.standard_normal(shape[1]).astype(np.float32) for _ in range(2))
    half = dtype == "bfloat16"
    tx = torch.tensor(x).to(getattr(torch, dtype)).requires_grad_()
    tw, tb = torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)
    ty = torch.nn.functional.group_norm(tx, groups, tw.to(tx.dtype), tb.to(tx.dtype))
    g = torch.randn(ty.shape, generator=torch.Generator().manual_seed(2))
    (ty.float() * g).sum().backward()

    def step(x, w, b):
        t = getattr(mica, dtype)
        y = mica.nn.functional.group_norm(x.to(t), groups, w.to(t), b.to(t))
        return (y.float(),) + tuple(mica.grad((y.float() * mica.tensor(g.numpy())).sum(), [x, w, b]))

    got = mica.compile(step)(x, w, b)
    bound = 2.0 ** -7 if half else 1e-6  # (a bfloat16 rounding; float32's, reordered)
    for mine, theirs in zip(got, (ty.float(), tx.grad.float(), tw.grad, tb.grad)):
        theirs = theirs.detach().numpy()
        assert np.abs(np.asarray(mine) - theirs).max() <= bound * np.abs(theirs).max()


def test_the_group_norm_module_is_torchs():
    for theirs, mine in [(torch.nn.GroupNorm(2, 6), mica.nn.GroupNorm(2, 6)),
                         (torch.nn.GroupNorm(3, 6, eps=1e-3, affine=False), mica.nn.GroupNorm(3, 6, eps=1e-3,
                                                                                              affine=False)),
                         (torch.nn.GroupNorm(3, 6, bias=False), mica.nn.GroupNorm(3, 6, bias=False))]:
        assert repr(mine) == repr(theirs) and list(mine.state_dict()) == list(theirs.state_dict())
        x = torch.randn(4, 6, 5)
        assert np.abs(np.asarray(mine(x.numpy())) - theirs(x).detach().numpy()).max() < 1e-5


def test_what_group_norm_cannot_take_is_a_sentence():
    x = np.zeros((2, 6, 4), np.float32)
    F = mica.nn.functional
    for make, sentence in [(lambda: F.group_norm(x, 4), r"^group_norm: 6 channels do not divide into num_groups=4"),
                           (lambda: F.group_norm(x, 2, np.ones(5, np.float32)), r"^group_norm: weight must be \[6\]"),
                           (lambda: F.group_norm(np.zeros(6, np.float32), 2), r"^group_norm: input must be \[N, C, \*\]"),
                           (lambda: mica.nn.GroupNorm(4, 6), r"^GroupNorm: num_channels \(6\) must divide")]:
        with pytest.raises(mica.MicaError, match=sentence):
            make()
