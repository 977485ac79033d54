"""F.conv1d / conv2d / conv3d and nn.Conv1d / Conv2d / Conv3d against torch's: outputs and every
gradient compiled (strides, padding by number, 'same' and 'valid', dilation, groups, with and
without bias, unbatched), under bfloat16 autocast, the modules' parameters, init and repr, and a
small patch-embedding model trained by a compiled step at torch's losses."""
import numpy as np
import pytest
import torch

import mica
from helpers import rel_err

CASES = [  # (dims, N, C, O, spatial size, kernel, stride, padding, dilation, groups, bias, batched)
    (1, 2, 4, 6, (11,), (3,), 1, 0, 1, 1, True, True),
    (1, 2, 4, 6, (11,), (3,), 2, 1, 2, 2, True, True),
    (1, 2, 4, 4, (11,), (5,), 1, "same", 2, 4, False, True),
    (1, 1, 4, 6, (9,), (2,), 1, "valid", 1, 1, True, False),
    (2, 2, 3, 8, (9, 10), (3, 2), (2, 1), (1, 0), (1, 2), 1, True, True),
    (2, 2, 4, 8, (8, 8), (4, 4), 4, 0, 1, 1, True, True),
    (2, 2, 4, 8, (7, 9), (3, 3), 1, "same", 1, 2, True, True),
    (3, 1, 2, 4, (5, 6, 4), (2, 3, 2), 1, 1, 1, 2, True, True),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}d-{i}" for i, c in enumerate(CASES)])
def test_convolutions_and_their_gradients_are_torchs(case):
    nd, N, C, O, size, k, stride, padding, dilation, groups, bias, batched = case
    rng = np.random.default_rng(len(size) * 10 + N)
    x = rng.standard_normal((N, C) + size).astype(np.float32)[slice(None) if batched else 0]
    w = (rng.standard_normal((O, C // groups) + k) * 0.3).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32) if bias else None
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True) if bias else None
    ty = getattr(torch.nn.functional, f"conv{nd}d")(tx, tw, tb, stride, padding, dilation, groups)
    g = torch.randn(ty.shape, generator=torch.Generator().manual_seed(1))
    (ty * g).sum().backward()
    conv = getattr(mica.nn.functional, f"conv{nd}d")

    def step(x, w, *b):
        y = conv(x, w, b[0] if b else None, stride, padding, dilation, groups)
        return (y,) + tuple(mica.grad((y * mica.tensor(g.numpy())).sum(), [x, w, *b]))

    got = mica.compile(step)(x, w, *([b] if bias else []))
    for mine, theirs in zip(got, [ty, tx.grad, tw.grad] + ([tb.grad] if bias else [])):
        theirs = theirs.detach().numpy()
        assert np.asarray(mine).shape == theirs.shape
        assert np.abs(np.asarray(mine) - theirs).max() <= 1e-6 * np.abs(theirs).max()  # (float32's sums, reordered)
    eager = conv(x, w, b, stride, padding, dilation, groups)
    assert rel_err(np.asarray(eager), ty.detach().numpy()) < 1e-6


def test_a_convolution_under_bfloat16_autocast_is_torchs():
    """conv2d is on autocast's lower-precision list, as torch's: bfloat16 operands, float32 sums,
    the bias joining them before one rounding; within a bfloat16 rounding of torch's CPU autocast."""
    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 8, 8), (6, 3, 3, 3), (6,)))

    def f(x, w, b):
        with mica.autocast(dtype=mica.bfloat16):
            y = mica.nn.functional.conv2d(x, w, b, padding=1)
        return y

    got = mica.compile(f)(x, w, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), padding=1)
    mine, theirs = np.asarray(got, np.float32), want.float().numpy()
    assert want.dtype == torch.bfloat16
    assert np.all(np.abs(mine - theirs) <= np.abs(theirs) * 2.0 ** -7 + 1e-2)
    assert np.mean(mine == theirs) > 0.8


def test_conv_modules_have_torchs_parameters_init_and_repr():
    assert mica.nn.Conv2d(3, 8, 3).output_padding == torch.nn.Conv2d(3, 8, 3).output_padding == (0, 0)
    assert mica.nn.Conv1d(3, 8, 3).transposed is torch.nn.Conv1d(3, 8, 3).transposed is False
    for theirs, mine in [(torch.nn.Conv2d(3, 8, 3, padding=1), mica.nn.Conv2d(3, 8, 3, padding=1)),
                         (torch.nn.Conv1d(4, 8, 5, stride=2, groups=2, bias=False),
                          mica.nn.Conv1d(4, 8, 5, stride=2, groups=2, bias=False)),
                         (torch.nn.Conv2d(3, 8, 4, stride=4, padding="valid"),
                          mica.nn.Conv2d(3, 8, 4, stride=4, padding="valid")),
                         (torch.nn.Conv3d(2, 4, (1, 2, 3), dilation=2), mica.nn.Conv3d(2, 4, (1, 2, 3), dilation=2))]:
        assert repr(mine) == repr(theirs)
        assert list(mine.state_dict()) == list(theirs.state_dict())
        for (name, p), (_, q) in zip(theirs.named_parameters(), mine.named_parameters()):
            bound = 1 / np.sqrt(theirs.weight.shape[1] * np.prod(theirs.kernel_size))
            assert tuple(p.shape) == np.asarray(q).shape and 0.5 * bound < np.abs(np.asarray(q)).max() <= bound, name


def test_a_patch_embedding_model_trains_as_torchs():
    """A ViT's front (Conv2d with stride = kernel), a norm and a linear head: four compiled AdamW
    steps from torch's weights give torch's losses."""
    def make(nn):
        return nn.Sequential(nn.Conv2d(3, 16, 4, stride=4), nn.Flatten(2), nn.GELU(), nn.Flatten(1), nn.Linear(64, 5))

    torch.manual_seed(0)
    theirs, mine = make(torch.nn), make(mica.nn)
    mine.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    topt, mopt = torch.optim.AdamW(theirs.parameters(), lr=1e-2), mica.optim.AdamW(mine.parameters(), lr=1e-2)

    @mica.compile
    def step(x, y):
        loss = mica.nn.functional.cross_entropy(mine(x), y)
        mopt.zero_grad()
        loss.backward()
        mopt.step()
        return loss

    for i in range(4):
        x, y = torch.randn(6, 3, 8, 8), torch.randint(0, 5, (6,))
        loss = torch.nn.functional.cross_entropy(theirs(x), y)
        topt.zero_grad()
        loss.backward()
        topt.step()
        assert float(step(x.numpy(), y.numpy())) == pytest.approx(loss.item(), rel=1e-5), i


def test_what_a_convolution_cannot_take_is_a_sentence():
    x, w = np.zeros((2, 4, 9), np.float32), np.zeros((6, 2, 3), np.float32)
    F = mica.nn.functional
    cases = [
        (lambda: F.conv1d(x, w), r"^conv1d: input \[2, 4, 9\]|conv1d: input f32\[2, 4, 9\] has 4 channels"),
        (lambda: F.conv1d(x, w, groups=2, stride=2, padding="same"), r"^conv1d: padding='same' needs stride 1"),
        (lambda: F.conv1d(x, np.zeros((6, 4, 12), np.float32)), r"^conv1d: the kernel \[12\]"),
        (lambda: F.conv1d(x, np.zeros((6, 4), np.float32)), r"^conv1d: the weight must be"),
        (lambda: F.conv1d(x, w, groups=2, padding="full"), r"^conv1d: padding must be 'valid', 'same'"),
        (lambda: F.conv1d(x, w, np.zeros(5, np.float32), groups=2), r"^conv1d: bias must be \[6\]"),
        (lambda: mica.nn.Conv2d(3, 4, 3, padding_mode="reflect"), r"^Conv2d: padding_mode='reflect' is not supported"),
        # (an outside tester's: a mix of types named the patches' and the weight's reshapes, not the user's tensors)
        (lambda: F.conv1d(x, w.astype(np.float64), groups=2),
         r"^conv1d: input f32\[2, 4, 9\] and weight f64\[6, 2, 3\] must be of one floating type"),
        (lambda: mica.nn.Conv2d(3, 4, 3, groups=2), r"^Conv2d: in_channels \(3\) and out_channels \(4\) must divide"),
    ]
    for make, sentence in cases:
        with pytest.raises(mica.MicaError, match=sentence):
            make()


POOLS = [  # (verb, input shape, args, kwargs)
    ("max_pool1d", (2, 3, 11), (3,), {}),
    ("max_pool1d", (2, 3, 11), (3, 2, 1, 2), {}),
    ("avg_pool1d", (2, 3, 11), (4, 3, 2), {}),
    ("avg_pool1d", (2, 3, 11), (4, 3, 2), {"count_include_pad": False}),
    ("max_pool2d", (2, 3, 9, 8), ((3, 2), (2, 1), (1, 1)), {}),
    ("max_pool2d", (3, 9, 8), (2,), {}),
    ("avg_pool2d", (2, 3, 9, 8), (3, 2, 1), {"count_include_pad": False}),
    ("avg_pool2d", (2, 3, 9, 8), (2,), {"divisor_override": 3}),
]


@pytest.mark.parametrize("verb,shape,args,kwargs", POOLS, ids=[f"{p[0]}-{i}" for i, p in enumerate(POOLS)])
def test_pools_and_their_gradients_are_torchs(verb, shape, args, kwargs):
    """Max and average pools over the convolutions' windows: torch's values and gradients, a max
    pool's to each window's first largest (here ReLU's zeros tie), padding counted or not."""
    rng = np.random.default_rng(len(shape))
    x = np.maximum(rng.standard_normal(shape), -0.2).astype(np.float32)  # (ties at -0.2 in the max pools' windows)
    tx = torch.tensor(x, requires_grad=True)
    ty = getattr(torch.nn.functional, verb)(tx, *args, **kwargs)
    g = torch.randn(ty.shape, generator=torch.Generator().manual_seed(1))
    (ty * g).sum().backward()

    def step(x):
        y = getattr(mica.nn.functional, verb)(x, *args, **kwargs)
        return y, mica.grad((y * mica.tensor(g.numpy())).sum(), x)

    y, gx = mica.compile(step)(x)
    assert np.abs(np.asarray(y) - ty.detach().numpy()).max() <= 1e-6
    assert np.abs(np.asarray(gx) - tx.grad.numpy()).max() <= 1e-6


def test_pool_modules_are_torchs():
    x = np.random.default_rng(5).standard_normal((2, 3, 9, 9)).astype(np.float32)
    for name, args, kw in [("MaxPool2d", (3, 2, 1), {}), ("AvgPool2d", (2,), {"count_include_pad": False}),
                           ("MaxPool1d", (2,), {"dilation": 2}), ("AvgPool1d", (4, 2, 1), {})]:
        theirs, mine = getattr(torch.nn, name)(*args, **kw), getattr(mica.nn, name)(*args, **kw)
        assert repr(mine) == repr(theirs)
        xi = x[:, :, 0] if name.endswith("1d") else x
        assert np.abs(np.asarray(mine(xi)) - theirs(torch.tensor(xi)).numpy()).max() <= 1e-6, name
    for make, sentence in [(lambda: mica.nn.functional.max_pool2d(x, 2, ceil_mode=True), r"^max_pool2d: ceil_mode"),
                           (lambda: mica.nn.functional.max_pool2d(x, 2, return_indices=True),
                            r"^max_pool2d: return_indices=True is not supported"),
                           (lambda: mica.nn.functional.avg_pool2d(x, 2, padding=2), r"^avg_pool2d: padding \(2, 2\)")]:
        with pytest.raises(mica.MicaError, match=sentence):
            make()


@pytest.mark.parametrize("verb,shape,lead", [("dropout1d", (4, 64, 5), 2), ("dropout1d", (64, 5), 1),
                                             ("dropout2d", (4, 64, 3, 3), 2), ("dropout2d", (4, 64, 5), 2),
                                             ("dropout3d", (2, 64, 2, 2, 3), 2), ("dropout3d", (64, 2, 2, 3), 1)])
def test_channel_dropout_zeroes_whole_channels_as_torchs(verb, shape, lead):
    """F.dropout1d/2d/3d: each (sample, channel) slab is kept whole, scaled by 1 / (1 - p), or zeroed
    (a 3-d input to dropout2d is [N, C, L], as torch reads it), about p of them zeroed, in a
    compiled program and its gradient; not in training, the input as it is."""
    rng = np.random.default_rng(5)
    x = (rng.random(shape) + 0.5).astype(np.float32)
    verb_of = getattr(mica.nn.functional, verb)

    def step(x):
        y = verb_of(x, 0.25)
        return y, mica.grad((y * 3.0).sum(), x), verb_of(x, 0.25, training=False)

    y, g, same = mica.compile(step, mica.f32[shape])(x, seed=3)
    y, g = np.asarray(y), np.asarray(g)
    ratio = (y / x).reshape(shape[:lead] + (-1,))
    assert np.allclose(ratio, ratio[..., :1], rtol=0, atol=1e-6)  # (one value per slab)
    kept = ratio[..., 0]
    assert set(np.round(np.unique(kept).astype(np.float64), 5).tolist()) <= {0.0, round(1 / 0.75, 5)}
    assert 0.1 <= np.mean(kept == 0) <= 0.4
    assert np.allclose(g, 3.0 * (y / x), rtol=1e-6) and np.array_equal(np.asarray(same), x)
    with pytest.raises(mica.MicaError, match=rf"^{verb}: input must be"):
        mica.trace(lambda x: verb_of(x, 0.5), mica.f32[(3,) * (len(shape) + 2 - lead + 2)])
    module = getattr(mica.nn, verb.capitalize())(0.25)
    assert repr(module) == repr(getattr(torch.nn, verb.capitalize())(0.25))


def test_orthogonal_init_is_torchs_draw():
    """nn.init.orthogonal_: wide and tall weights (and a conv's, flattened) have orthonormal rows or
    columns times gain, as torch's; a 1-d tensor is refused, as torch's."""
    for shape, gain in (((4, 6), 1.0), ((5, 3), 2.0), ((3, 2, 2, 2), 0.5)):
        p = mica.nn.Parameter(mica.zeros(*shape))
        mica.nn.init.orthogonal_(p, gain=gain)
        w = np.asarray(p, dtype=np.float64).reshape(shape[0], -1)
        gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
        assert np.allclose(gram, gain ** 2 * np.eye(len(gram)), atol=1e-5)
        t = torch.empty(shape)
        torch.nn.init.orthogonal_(t, gain=gain)
        tw = t.reshape(shape[0], -1).double().numpy()
        assert np.allclose(tw @ tw.T if w.shape[0] <= w.shape[1] else tw.T @ tw, gram, atol=1e-5)
    with pytest.raises(mica.MicaError, match="^orthogonal_: only tensors of 2 or more dims"):
        mica.nn.init.orthogonal_(mica.nn.Parameter(mica.zeros(3)))
    from mica.nn.init import Orthogonal

    for shape in ((3, 5), (5, 3), (2, 2, 3)):  # (torch's construction on the same normal draws: transposes, signs)
        draws = np.random.default_rng(9).normal(0.0, 1.0, (shape[0], int(np.prod(shape[1:]))))
        flat = torch.tensor(draws)
        if flat.shape[0] < flat.shape[1]:
            flat = flat.t()
        q, r = torch.linalg.qr(flat)
        q = q * torch.diag(r, 0).sign()
        if shape[0] < np.prod(shape[1:]):
            q = q.t()
        got = Orthogonal(1.5).sample(shape, np.random.default_rng(9))
        assert np.allclose(got, 1.5 * q.numpy().reshape(shape), atol=1e-10)


def test_an_adaptive_pool_to_no_outputs_is_empty_as_torchs():
    """adaptive_avg_pool1d/2d to an output size of 0 give torch's empty result (they were refused);
    a negative size is a sentence."""
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 4)).astype(np.float32)
    for size in ((0, 2), (3, 0)):
        got = mica.nn.functional.adaptive_avg_pool2d(mica.tensor(x), size)
        assert got.shape == tuple(torch.nn.functional.adaptive_avg_pool2d(torch.tensor(x), size).shape)
    assert mica.nn.functional.adaptive_avg_pool1d(mica.tensor(x[0]), 0).shape == (2, 5, 0)
    with pytest.raises(mica.MicaError, match=r"^adaptive_avg_pool2d: output_size must be sizes of 0 or more"):
        mica.nn.functional.adaptive_avg_pool2d(mica.tensor(x), (-1, 2))


TRANSPOSED = [  # (dims, input shape, weight shape, settings)
    (1, (2, 2, 7), (2, 5, 5), dict(stride=3, padding=4)),
    (2, (2, 4, 5, 5), (4, 3, 3, 3), dict()),
    (2, (2, 4, 5, 5), (4, 3, 4, 4), dict(stride=2, padding=1)),
    (2, (2, 4, 5, 6), (4, 3, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    (2, (1, 4, 4, 5), (4, 3, 3, 3), dict(stride=(2, 3), padding=(0, 2), groups=2, dilation=(1, 2))),
    (2, (4, 3, 3), (4, 2, 4, 4), dict()),  # (unbatched)
    (2, (1, 2, 4, 4), (2, 2, 4, 4), dict(stride=2, padding=3)),  # (more padding than the kernel reaches)
    (3, (1, 2, 3, 3, 3), (2, 2, 2, 2, 2), dict(stride=2, padding=1)),
]


@pytest.mark.parametrize("case", TRANSPOSED, ids=[f"{c[0]}d-{i}" for i, c in enumerate(TRANSPOSED)])
def test_transposed_convolutions_and_their_gradients_are_torchs(case):
    """F.conv_transpose1d/2d/3d (DCGAN's generator, U-Net's upsampling; an outside tester's port
    had to write its own): outputs and the input's, weight's and bias's gradients."""
    nd, xs, ws, kw = case
    rng = np.random.default_rng(len(xs) * 7 + ws[1])
    x, w = rng.standard_normal(xs).astype(np.float32), (rng.standard_normal(ws) * 0.3).astype(np.float32)
    b = rng.standard_normal(ws[1] * kw.get("groups", 1)).astype(np.float32)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = getattr(torch.nn.functional, f"conv_transpose{nd}d")(tx, tw, tb, **kw)
    g = torch.randn(ty.shape, generator=torch.Generator().manual_seed(2))
    (ty * g).sum().backward()
    conv = getattr(mica.nn.functional, f"conv_transpose{nd}d")

    def step(x, w, b):
        y = conv(x, w, b, **kw)
        return (y,) + tuple(mica.grad((y * mica.tensor(g.numpy())).sum(), [x, w, b]))

    for mine, theirs in zip(mica.compile(step)(x, w, b), [ty, tx.grad, tw.grad, tb.grad]):
        theirs = theirs.detach().numpy()
        assert np.asarray(mine).shape == theirs.shape
        assert np.abs(np.asarray(mine) - theirs).max() <= 2e-6 * np.abs(theirs).max()  # (float32's sums, reordered)
    assert rel_err(np.asarray(conv(x, w, b, **kw)), ty.detach().numpy()) < 1e-6


def test_a_dcgan_generator_of_transposed_convolutions_trains_as_torchs():
    """ConvTranspose2d modules (torch's weight layout, init bound, repr and output_size=) in a DCGAN
    generator with BatchNorm2d, trained by compiled Adam steps from torch's weights."""
    def make(nn):
        return nn.Sequential(nn.ConvTranspose2d(8, 6, 4, 1, 0, bias=False), nn.BatchNorm2d(6), nn.ReLU(True),
                             nn.ConvTranspose2d(6, 3, 4, 2, 1, bias=False), nn.Tanh())

    torch.manual_seed(0)
    theirs, mine = make(torch.nn), make(mica.nn)
    assert repr(mine) == repr(theirs)
    assert np.abs(np.asarray(mica.nn.ConvTranspose2d(8, 4, 3, groups=2).weight)).max() <= 1 / np.sqrt(2 * 9)
    mine.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    topt = torch.optim.Adam(theirs.parameters(), lr=2e-3, betas=(0.5, 0.999))
    mopt = mica.optim.Adam(mine.parameters(), lr=2e-3, betas=(0.5, 0.999))

    @mica.compile
    def step(z, target):
        loss = mica.nn.functional.mse_loss(mine(z), target)
        mopt.zero_grad()
        loss.backward()
        mopt.step()
        return loss

    for i in range(3):
        z, target = torch.randn(4, 8, 1, 1), torch.rand(4, 3, 8, 8) * 2 - 1
        loss = torch.nn.functional.mse_loss(theirs(z), target)
        topt.zero_grad()
        loss.backward()
        topt.step()
        assert float(step(z.numpy(), target.numpy())) == pytest.approx(loss.item(), rel=1e-5), i
    up, tup = mica.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1), torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1)
    x = torch.randn(1, 3, 5, 5)
    assert tuple(up(x.numpy(), output_size=[1, 2, 10, 10]).shape) == tuple(tup(x, output_size=[10, 10]).shape)
    with pytest.raises(mica.MicaError, match=r"output_size \[12, 12\] is not reachable .* \[9, 10\]"):
        up(x.numpy(), output_size=[12, 12])
    with pytest.raises(mica.MicaError, match=r"output_padding \(2, 2\) must be smaller than either stride"):
        mica.nn.functional.conv_transpose2d(x.numpy(), np.ones((3, 2, 3, 3), np.float32), stride=2, output_padding=2)
