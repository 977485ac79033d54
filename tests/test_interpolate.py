"""F.interpolate / nn.Upsample against torch's CPU kernels: every mode, sizes and factors up and
down, align_corners both ways, in float32 (compiled: values and gradients), the half types, and
the sentences for what torch refuses. (The float64 op table has its cases too: tests/test_ops.py.)"""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import mica

F = mica.nn.functional
SETTINGS = [dict(scale_factor=2), dict(scale_factor=1.7), dict(scale_factor=0.6), dict(size=5), dict(size=1),
            dict(scale_factor=2.5, recompute_scale_factor=True)]
MODES = [("nearest", 1), ("nearest", 3), ("nearest-exact", 2), ("linear", 1), ("bilinear", 2), ("trilinear", 3),
         ("bicubic", 2), ("area", 2)]


def _cases():
    for mode, nd in MODES:
        for k, kw in enumerate(SETTINGS):
            for corners in ([None, True, False] if mode in ("linear", "bilinear", "trilinear", "bicubic") else [None]):
                yield pytest.param(mode, nd, kw, corners, id=f"{mode}-{nd}d-{k}-{corners}")


@pytest.fixture(scope="module")
def compiled_cases():
    """Every case in one compiled program (one build): [(case, inputs, torch's output and gradient)]."""
    rng = np.random.default_rng(7)
    cases, specs = [], []
    for p in _cases():
        mode, nd, kw, corners = p.values
        shape = (2, 3) + tuple(int(n) for n in rng.integers(2, 6, nd))
        x = rng.standard_normal(shape).astype(np.float32)
        tx = torch.tensor(x, requires_grad=True)
        ty = TF.interpolate(tx, mode=mode, align_corners=corners, **kw)
        g = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
        (ty * torch.tensor(g)).sum().backward()
        cases.append((p.id, (mode, kw, corners), x, g, ty.detach().numpy(), tx.grad.numpy()))
        specs += [mica.f32[x.shape], mica.f32[g.shape]]

    def step(*arrays):
        out = []
        for (_, (mode, kw, corners), *_), x, g in zip(cases, arrays[::2], arrays[1::2]):
            y = F.interpolate(x, mode=mode, align_corners=corners, **kw)
            out += [y, mica.grad((y * g).sum(), x)]
        return out

    got = mica.compile(step, *specs)(*[a for c in cases for a in c[2:4]])
    return {c[0]: (c, got[2 * k], got[2 * k + 1]) for k, c in enumerate(cases)}


@pytest.mark.parametrize("mode,nd,kw,corners", list(_cases()))
def test_compiled_float32_is_torchs(compiled_cases, request, mode, nd, kw, corners):
    """Values and input gradients of a compiled step: torch's to float32 rounding; nearest modes
    (copies) and 1-d linear (torch's arithmetic, its fused multiply-adds included) bit for bit."""
    (_, _, x, g, want, want_grad), y, gx = compiled_cases[request.node.callspec.id]
    y, gx = np.asarray(y), np.asarray(gx)
    assert y.shape == want.shape and y.dtype == np.float32
    if mode.startswith("nearest") or mode == "linear":
        np.testing.assert_array_equal(y, want)
    else:
        assert np.abs(y - want).max() <= 2e-6 * np.abs(want).max()
    assert np.abs(gx - want_grad).max() <= 2e-6 * np.abs(want_grad).max()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("mode,shape", [("nearest", (2, 3, 5, 6)), ("bilinear", (2, 3, 5, 6)), ("bicubic", (1, 2, 5, 6)),
                                        ("linear", (2, 3, 7))])
def test_half_types_round_once_as_torchs(dtype, mode, shape):
    """A half input computes in float32 and rounds once, as torch's: nearest (a copy) bit for bit;
    bilinear and bicubic (whose weights torch keeps in the half type) nearly all bit for bit (one
    element in a thousand off by an ulp, where float32 sums round differently); 1-d linear is the
    float32 result rounded once (torch's own 1-d half kernel strays further: up to 9 float16 ulps
    from it on these numbers)."""
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    half = torch.tensor(x).to(getattr(torch, dtype))
    want = TF.interpolate(half if mode != "linear" else half.float(), scale_factor=1.7, mode=mode).float()
    want = want.to(half.dtype).float().numpy() if mode == "linear" else want.numpy()
    got = np.asarray(mica.compile(lambda x: F.interpolate(x.to(getattr(mica, dtype)), scale_factor=1.7,
                                                          mode=mode).float(), mica.f32[shape])(x))
    ulp = 2.0 ** (-7 if dtype == "bfloat16" else -10) * np.maximum(np.abs(want), 2.0 ** -14)
    if mode in ("nearest", "linear"):
        np.testing.assert_array_equal(got, want)
    else:
        assert (np.abs(got - want) <= ulp).all()
    if mode in ("bilinear", "bicubic"):
        assert (got != want).mean() < 0.01


def test_eager_and_modules_as_torchs():
    """Outside a trace interpolate computes (host tensors), and nn.Upsample and its two fixed-mode
    forms keep torch's settings and reprs."""
    x = np.random.default_rng(5).standard_normal((1, 2, 3, 4))
    got = F.interpolate(mica.from_numpy(x), size=(5, 7), mode="bilinear", align_corners=True)
    want = TF.interpolate(torch.tensor(x), size=(5, 7), mode="bilinear", align_corners=True).numpy()
    assert got.shape == (1, 2, 5, 7)
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-12)
    for mine, theirs in [(mica.nn.Upsample(scale_factor=2, mode="bilinear"), torch.nn.Upsample(scale_factor=2, mode="bilinear")),
                         (mica.nn.Upsample(size=(3, 4)), torch.nn.Upsample(size=(3, 4))),
                         (mica.nn.Upsample(scale_factor=(2, 3)), torch.nn.Upsample(scale_factor=(2, 3))),
                         (mica.nn.UpsamplingBilinear2d(scale_factor=2), torch.nn.UpsamplingBilinear2d(scale_factor=2)),
                         (mica.nn.UpsamplingNearest2d(size=6), torch.nn.UpsamplingNearest2d(size=6))]:
        assert repr(mine) == repr(theirs)
        np.testing.assert_allclose(np.asarray(mine(mica.from_numpy(x))), theirs(torch.tensor(x)).numpy(), atol=1e-12)


@pytest.mark.parametrize("call,says", [
    (lambda x: F.interpolate(x, scale_factor=2, mode="linear"), r"^interpolate: mode='linear' takes a 3-d input"),
    (lambda x: F.interpolate(x, size=(3,)), r"^interpolate: the input has 2 spatial dims \[4, 4\] but size has 1"),
    (lambda x: F.interpolate(x, size=(0, 3)), r"^interpolate: input and output sizes must be greater than 0"),
    (lambda x: F.interpolate(x, scale_factor=0.1), r"^interpolate: input and output sizes must be greater than 0"),
    (lambda x: F.interpolate(x, scale_factor=2, align_corners=False), r"^interpolate: align_corners is only for"),
    (lambda x: F.interpolate(x), r"^interpolate: give size or scale_factor"),
    (lambda x: F.interpolate(x, size=3, scale_factor=2), r"^interpolate: give size or scale_factor, not both"),
    (lambda x: F.interpolate(x, size=3, recompute_scale_factor=True), r"^interpolate: recompute_scale_factor=True"),
    (lambda x: F.interpolate(x, scale_factor=2, mode="foo"), r"^interpolate: mode must be one of"),
    (lambda x: F.interpolate(x, size=3.0), r"^interpolate: size must be an int or 2 ints"),
    (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", antialias=True), r"^interpolate: antialias=True"),
    (lambda x: F.interpolate(x[0, 0], scale_factor=2), r"^interpolate: the input must be \[N, C, d1\]"),
    (lambda x: F.interpolate(x.long(), scale_factor=2), r"^interpolate: the input must be a floating tensor"),
])
@pytest.mark.parametrize("where", ["eager", "traced"])
def test_what_torch_refuses_is_a_sentence(call, says, where):
    x = np.random.default_rng(0).standard_normal((1, 1, 4, 4)).astype(np.float32)
    with pytest.raises(mica.MicaError, match=says + r".*\(.*test_interpolate.py:\d+\)$"):
        if where == "eager":
            call(mica.tensor(x))
        else:
            mica.trace(call, mica.f32[x.shape])
