"""torch's verbs an outside tester found missing (addmm and its family, dot, mv, linalg's norms,
cdist, the activations mish ... softshrink, xlogy, logaddexp, nan_to_num, nansum ...): each against
torch, compiled and eager, values and types, and gradients where they have them."""
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import mica
import mica.nn.functional as MF
from helpers import load_values, rel_err

rng = np.random.default_rng(0)
A, B, C = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (4, 5), (3, 5)))
b1, b2 = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((2, 4, 5)).astype(np.float32)
v = rng.standard_normal(4).astype(np.float32)
x = rng.standard_normal((2, 3, 6)).astype(np.float32) * 4
x[0, 0, :3] = [np.nan, np.inf, -np.inf]
pos = np.abs(x[1]) / 5 + 0.01  # (in (0, 1): logit's domain)
cases = {
    "addmm": (lambda m, a, b, c: m.addmm(c, a, b, beta=0.5, alpha=2.0), (A, B, C)),
    "addmm_bias": (lambda m, a, b, c: m.addmm(c[0], a, b), (A, B, C)),
    "baddbmm": (lambda m, a, b, c: m.baddbmm(c, a, b, alpha=0.5), (b1, b2, C)),
    "addbmm": (lambda m, a, b, c: m.addbmm(c, a, b), (b1, b2, C)),
    "addmv": (lambda m, a, v, c: m.addmv(c[:, 0], a, v, beta=2), (A, v, C)),
    "dot": (lambda m, a, b: m.dot(a, b), (v, v * 2)),
    "mv": (lambda m, a, b: m.mv(a, b), (A, v)),
    "reciprocal": (lambda m, a: m.reciprocal(a), (C,)),
    "rsub": (lambda m, a, b: m.rsub(a, b, alpha=2), (C, C * 3)),
    "xlogy": (lambda m, a, b: m.xlogy(a, b), (np.array([0, 1, 2, 0, -1, 0], np.float32), np.array([0.5, 2, np.nan, np.nan, 3, -1], np.float32))),
    "logaddexp": (lambda m, a, b: m.logaddexp(a, b), (np.array([0, 1, np.inf, -np.inf, 100, -np.inf], np.float32), np.array([0, 2, np.inf, -np.inf, -100, 3], np.float32))),
    "logit": (lambda m, a: m.logit(a), (pos,)), "logit_eps": (lambda m, a: m.logit(a, eps=0.1), (pos,)),
    "nan_to_num": (lambda m, a: m.nan_to_num(a), (x,)),
    "nan_to_num2": (lambda m, a: m.nan_to_num(a, nan=1.0, posinf=2.0), (x,)),
    "count_nonzero": (lambda m, a: m.count_nonzero(a.round(), dim=1), (C,)),
    "nansum": (lambda m, a: m.nansum(a, 2), (x,)), "nanmean": (lambda m, a: m.nanmean(a, 2), (x,)),
    "mish": (lambda m, a: (TF if m is torch else MF).mish(a), (x[1],)),
    "hardswish": (lambda m, a: (TF if m is torch else MF).hardswish(a), (x[1],)),
    "hardsigmoid": (lambda m, a: (TF if m is torch else MF).hardsigmoid(a), (x[1],)),
    "selu": (lambda m, a: (TF if m is torch else MF).selu(a), (x[1],)),
    "celu": (lambda m, a: (TF if m is torch else MF).celu(a, 0.7), (x[1],)),
    "prelu": (lambda m, a, w: (TF if m is torch else MF).prelu(a, w), (x[1][None], np.array([0.1, 0.2, 0.3], np.float32))),
    "prelu1": (lambda m, a, w: (TF if m is torch else MF).prelu(a, w), (x[1], np.array([0.25], np.float32))),
    "threshold": (lambda m, a: (TF if m is torch else MF).threshold(a, 0.5, -1.0), (x[1],)),
    "tanhshrink": (lambda m, a: (TF if m is torch else MF).tanhshrink(a), (x[1],)),
    "softshrink": (lambda m, a: (TF if m is torch else MF).softshrink(a, 1.0), (x[1],)),
    "hardshrink": (lambda m, a: (TF if m is torch else MF).hardshrink(a, 1.0), (x[1],)),
    "softmin": (lambda m, a: (TF if m is torch else MF).softmin(a, dim=-1), (x[1],)),
    "pairwise": (lambda m, a, b: (TF if m is torch else MF).pairwise_distance(a, b), (b1[0], b1[1])),
    "cdist": (lambda m, a, b: m.cdist(a, b), (b1, b1[:, :2] * 2)),
    "cdist1": (lambda m, a, b: m.cdist(a, b, p=1.0), (b1, b1[:, :2])),
    "vector_norm": (lambda m, a: m.linalg.vector_norm(a), (C,)),
    "vector_norm3": (lambda m, a: m.linalg.vector_norm(a, 3, dim=1, keepdim=True), (C,)),
    "vn_keep": (lambda m, a: m.linalg.vector_norm(a, keepdim=True), (b1,)),
    "vn_inf": (lambda m, a: m.linalg.vector_norm(a, float("inf"), dim=(0, 1)), (b1,)),
    "linalg_norm": (lambda m, a: m.linalg.norm(a), (b1,)),
    "linalg_norm_fro": (lambda m, a: m.linalg.norm(a, "fro"), (C,)),
    "linalg_norm_vec": (lambda m, a: m.linalg.norm(a, 1, dim=1), (C,)),
    "matrix_norm": (lambda m, a: m.linalg.matrix_norm(a), (b1,)),
    "vecdot": (lambda m, a, b: m.linalg.vecdot(a, b), (C, C * 2)),
    "t_addmm": (lambda m, a, b, c: c.addmm(a, b), (A, B, C)), "t_dot": (lambda m, a, b: a.dot(b), (v, v)),
}


@pytest.mark.parametrize("name", list(cases))
def test_a_verb_is_torchs_compiled_and_eager(name):
    f, args = cases[name]
    want = f(torch, *[torch.tensor(a) for a in args]).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (an eager call's initial-values notes)
        compiled = np.asarray(mica.compile(lambda *a: f(mica, *a))(*args))
        eager = np.asarray(f(mica, *[mica.as_tensor(a) for a in args]))
    for got in (compiled, eager):
        assert got.shape == want.shape and got.dtype == want.dtype, (got.dtype, want.dtype, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("name", ["addmm", "baddbmm", "addbmm", "addmv", "mish", "hardswish", "hardsigmoid", "selu",
                                  "celu", "prelu", "cdist", "logaddexp", "xlogy", "pairwise", "softmin",
                                  "vector_norm3", "logit_eps", "softshrink", "mv"])
def test_a_verbs_gradient_is_torchs(name):
    f, args = cases[name]
    args = [np.nan_to_num(a, nan=0.5, posinf=3.0, neginf=-3.0) for a in args]
    ts = [torch.tensor(a, requires_grad=True) for a in args]
    out = f(torch, *ts)
    weights = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    (out * torch.tensor(weights)).sum().backward()
    grads = mica.compile(lambda *a: mica.grad((f(mica, *a) * mica.tensor(weights)).sum(), list(a)))(*args)
    for g, t in zip(grads, ts):
        np.testing.assert_allclose(np.asarray(g), t.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_the_new_modules_are_torchs():
    x = np.random.default_rng(2).standard_normal((2, 3, 5)).astype(np.float32) * 3
    pairs = [(mica.nn.Mish(), torch.nn.Mish()), (mica.nn.Hardswish(), torch.nn.Hardswish()),
             (mica.nn.SELU(), torch.nn.SELU()), (mica.nn.CELU(0.5), torch.nn.CELU(0.5)),
             (mica.nn.Softshrink(0.7), torch.nn.Softshrink(0.7)), (mica.nn.Threshold(0.1, 20.0),
                                                                   torch.nn.Threshold(0.1, 20.0)),
             (mica.nn.Softmin(dim=1), torch.nn.Softmin(dim=1)), (mica.nn.PReLU(3), torch.nn.PReLU(3))]
    for m, t in pairs:
        want = t(torch.tensor(x)).detach().numpy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = np.asarray(mica.compile(lambda a: m(a))(x))
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=type(m).__name__)
    assert [n for n, _ in mica.nn.PReLU(3).named_parameters()] == ["weight"]


def test_what_the_new_verbs_refuse_is_a_sentence():
    with pytest.raises(mica.MicaError, match=r"^addmm: mat1 must be 2-d, got f32\[3\]"):
        mica.trace(lambda a, b: mica.addmm(b, a, b), mica.f32[3], mica.f32[3, 3])
    with pytest.raises(mica.MicaError, match=r"^dot: the vectors f32\[3\] and f32\[4\] differ in length"):
        mica.trace(lambda a, b: mica.dot(a, b), mica.f32[3], mica.f32[4])
    with pytest.raises(mica.MicaError, match="^linalg.norm: ord='nuc'"):
        mica.trace(lambda a: mica.linalg.norm(a, "nuc"), mica.f32[3, 3])
    with pytest.raises(mica.MicaError, match="^prelu: the weight f32\\[2\\] must have one element or one per channel"):
        mica.trace(lambda a, w: MF.prelu(a, w), mica.f32[4, 3], mica.f32[2])


x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)  # (the cases above hold theirs)
more = {
 "empty": (lambda T, a: T.empty(2, 3).shape[0] + a.sum() * 0, (x,)),
 "clone": (lambda T, a: T.clone(a) * 2, (x,)), "broadcast_to": (lambda T, a: T.broadcast_to(a[0], (2, 4)), (x,)),
 "vstack": (lambda T, a: T.vstack([a, a[0]]), (x,)),
 "hstack": (lambda T, a: T.hstack([a, a]), (x,)),
 "hstack1": (lambda T, a: T.hstack([a[0], a[1]]), (x,)),
 "meshgrid": (lambda T, a: T.meshgrid(a[0], a[1, :3], indexing="ij")[1], (x,)),
 "meshgrid_xy": (lambda T, a: T.meshgrid(a[0], a[1, :3], indexing="xy")[0], (x,)),
 "tril_indices": (lambda T, a: T.tril_indices(3, 4, 1).float() + a.sum() * 0, (x,)),
 "triu_indices": (lambda T, a: T.triu_indices(4, 3, -1).float() + a.sum() * 0, (x,)),
 "diff": (lambda T, a: T.diff(a, dim=1), (x,)), "diff2": (lambda T, a: a.diff(n=2, dim=0, prepend=a[:1]), (x,)),
 "logcumsumexp": (lambda T, a: T.logcumsumexp(a * 30, dim=1), (x,)),
 "stride": (lambda T, a: T.tensor(list(a.t().stride()) + [int(a.t().is_contiguous()), a.element_size(), a.nbytes]).float() + a.sum() * 0, (x,)),
 "tril_": (lambda T, a: a.clone().tril_(), (x,)), "addmm_": (lambda T, a: a.clone().addmm_(a, T.ones(4, 4)), (x,)),
}


@pytest.mark.parametrize("name", list(more))
def test_a_name_ported_code_calls_is_torchs(name):
    """Names an outside tester's HF-style ports called (torch.empty in GPT-2's Conv1D, broadcast_to,
    meshgrid, stride(), tril_indices, logcumsumexp, ...), compiled and eager, against torch."""
    f, args = more[name]
    want = np.asarray(f(torch, *[torch.tensor(a) for a in args]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for got in (mica.compile(lambda *a: f(mica, *a))(*args), f(mica, *[mica.as_tensor(a) for a in args])):
            got = np.asarray(got)
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


def test_embedding_padding_idx_parameter_containers_and_checkpoint_are_torchs():
    torch.manual_seed(0)
    te = torch.nn.Embedding(5, 3, padding_idx=-4)
    me = mica.nn.Embedding(5, 3, padding_idx=-4)
    assert me.padding_idx == 1 and repr(me) == "Embedding(5, 3, padding_idx=1)"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not np.asarray(me.weight)[1].any()  # (torch's: the padding row starts at 0)
    me.load_state_dict({"weight": te.weight.detach().numpy()})
    ids = np.array([[0, 1, 2, 1]])
    opt = mica.optim.SGD(me.parameters(), lr=1.0)

    @mica.compile
    def step(i):
        loss = (me(i) ** 2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    step(ids)
    t_opt = torch.optim.SGD(te.parameters(), lr=1.0)
    (te(torch.tensor(ids)) ** 2).sum().backward()
    t_opt.step()
    np.testing.assert_allclose(np.asarray(me.weight), te.weight.detach().numpy(), atol=1e-6)  # (row 1 unmoved)
    frozen = mica.nn.Embedding.from_pretrained(np.ones((4, 2), np.float32))
    assert not frozen.weight.requires_grad
    with pytest.raises(mica.MicaError, match="max_norm, scale_grad_by_freq and sparse=True are not supported"):
        mica.nn.Embedding(4, 2, max_norm=1.0)

    class M(mica.nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = mica.nn.ParameterList([mica.nn.Parameter(np.ones(3, np.float32)), np.zeros(2, np.float32)])
            self.pd = mica.nn.ParameterDict({"a": np.full(3, 2.0, np.float32)})

        def forward(self, x):
            return (x * self.ps[0] + self.pd["a"]).sum() + self.ps[1].sum()

    m = M()
    assert [n for n, _ in m.named_parameters()] == ["ps.0", "ps.1", "pd.a"]
    assert float(mica.compile(lambda x: m(x))(np.ones(3, np.float32))) == 9.0
    from mica.utils.checkpoint import checkpoint

    assert float(mica.compile(lambda x: checkpoint(lambda y: (y * 2).sum(), x, use_reentrant=False))(
        np.ones(3, np.float32))) == 6.0
    assert mica.is_grad_enabled() and mica.get_default_dtype() is mica.float32


def test_a_diff_reviews_corners_are_torchs():
    """NaN through threshold/softshrink/hardshrink, hardswish at -inf and its slope at +-3, addmm's
    alpha 0 (the product unread), xlogy(0, inf), flip(input=x) a copy, and a Python int an int32
    cannot hold as a fill or bound (a sentence, as torch's)."""
    x = np.float32([np.nan, -np.inf, -5, -3, -1, 0, 1, 3, 5, np.inf])
    for name, fn in [("threshold", lambda F, a: F.threshold(a, 0.5, -2.0)), ("softshrink", lambda F, a: F.softshrink(a, 1.0)),
                     ("hardshrink", lambda F, a: F.hardshrink(a, 1.0)), ("hardswish", lambda F, a: F.hardswish(a))]:
        want = fn(TF, torch.tensor(x)).numpy()
        np.testing.assert_array_equal(np.asarray(mica.compile(lambda a: fn(MF, a))(x)), want, err_msg=name)
    t = torch.tensor(x[2:-1], requires_grad=True)
    TF.hardswish(t).sum().backward()
    got = mica.compile(lambda a: mica.grad(MF.hardswish(a).sum(), [a])[0])(x[2:-1])
    np.testing.assert_allclose(np.asarray(got), t.grad.numpy(), rtol=1e-6)
    a, b, c = np.float32([[np.inf, 1]]), np.ones((2, 2), np.float32), np.ones((1, 2), np.float32)
    np.testing.assert_array_equal(np.asarray(mica.compile(lambda a, b, c: mica.addmm(c, a, b, alpha=0))(a, b, c)),
                                  torch.addmm(torch.tensor(c), torch.tensor(a), torch.tensor(b), alpha=0).numpy())
    assert float(mica.compile(lambda a, b: mica.xlogy(a, b))(np.float32(0), np.float32(np.inf))) == 0.0

    def flipped(y):
        z = mica.flip(input=y, dims=[0])
        y.add_(1)
        return z

    np.testing.assert_array_equal(np.asarray(mica.compile(flipped)(np.float32([2.0]))), [2.0])
    ints = np.array([1, 2], np.int32)
    for fn in (lambda m: m.clamp(max=2 ** 32), lambda m: mica.where(m > 1, m, 2 ** 32 + 3),
               lambda m: m.masked_fill(m > 1, 2 ** 32), lambda m: mica.full((2,), 2 ** 40, dtype=mica.int32)):
        with pytest.raises(mica.MicaError, match="does not fit int32"):
            mica.compile(fn)(ints)
    np.testing.assert_array_equal(np.asarray(mica.compile(lambda m: m + 2 ** 33)(ints)), ints)  # (arithmetic wraps)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_integer_products_are_torchs_exact_wrapping_ones(dtype):
    """An outside fuzzer's: an integer matmul worked eagerly and was refused compiled; torch's is
    exact and wraps. matmul, @, mm, bmm, dot, mv, addmm and einsum on integers, bit for bit."""
    rng = np.random.default_rng(7)
    a = rng.integers(-2 ** 31, 2 ** 31, (2, 3, 4)).astype(dtype)
    b = rng.integers(-2 ** 31, 2 ** 31, (4, 5)).astype(dtype)
    v = rng.integers(-9, 9, 4).astype(dtype)
    for fn in (lambda T, x, y, w: x @ y, lambda T, x, y, w: x @ w, lambda T, x, y, w: w @ y,
               lambda T, x, y, w: T.dot(w, w), lambda T, x, y, w: x.bmm(x.transpose(1, 2)),
               lambda T, x, y, w: x[0].mm(y), lambda T, x, y, w: T.mv(x[0], w),
               lambda T, x, y, w: T.addmm(y[0], x[0], y), lambda T, x, y, w: T.einsum("bij,jk->bik", x, y)):
        want = fn(torch, *(torch.from_numpy(t) for t in (a, b, v))).numpy()
        got = np.asarray(mica.compile(lambda *t: fn(mica, *t))(a, b, v))
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_a_second_reviews_findings_are_torchs():
    """clip_grad_value_ and clip_grad_norm_ given model.weight (inside a step, a tensor: its rows were
    taken for parameters, and nothing was clipped); parameters_to_vector and tril_indices(dtype=)
    outside a trace; empty(size=...); a NaN in a tensor bound of clamp."""
    torch.manual_seed(0)
    tl = torch.nn.Linear(4, 3)
    ml = mica.nn.Linear(4, 3)
    ml.load_state_dict({k: v.detach().numpy() for k, v in tl.state_dict().items()})
    opt = mica.optim.SGD(ml.parameters(), lr=0.1)
    x = np.random.default_rng(5).standard_normal((8, 4)).astype(np.float32) * 10

    @mica.compile
    def step(a):
        loss = (ml(a) ** 2).sum()
        loss.backward()
        mica.nn.utils.clip_grad_value_(ml.weight, 0.01)
        norm = mica.nn.utils.clip_grad_norm_(ml.bias, 0.5)
        opt.step()
        opt.zero_grad()
        return norm

    t_opt = torch.optim.SGD(tl.parameters(), lr=0.1)
    (tl(torch.tensor(x)) ** 2).sum().backward()
    torch.nn.utils.clip_grad_value_(tl.weight, 0.01)
    want_norm = torch.nn.utils.clip_grad_norm_(tl.bias, 0.5)
    t_opt.step()
    got_norm = step(x)
    assert rel_err(float(got_norm), want_norm.item()) < 1e-5
    for name, p in tl.named_parameters():
        np.testing.assert_allclose(np.asarray(getattr(ml, name)), p.detach().numpy(), rtol=1e-5, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vec = mica.nn.utils.parameters_to_vector(ml.parameters())
    np.testing.assert_allclose(np.asarray(vec), torch.nn.utils.parameters_to_vector(tl.parameters()).detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    got = mica.tril_indices(3, 4, dtype=mica.int32)
    assert got.dtype == np.int32 and np.array_equal(np.asarray(got), torch.tril_indices(3, 4).numpy())
    assert mica.empty(size=(2, 3)).shape == (2, 3) and mica.zeros(size=4).shape == (4,)
    lo = np.full(3, np.nan, np.float32)
    got = mica.compile(lambda a, b: mica.clamp(a, min=b))(np.float32([1, -2, np.inf]), lo)
    assert np.isnan(np.asarray(got)).all()


def test_is_grad_enabled_follows_no_grad_outside_a_trace_and_containers_print_their_parameters():
    assert mica.is_grad_enabled()
    with mica.no_grad():
        assert not mica.is_grad_enabled()
        with mica.enable_grad():
            assert mica.is_grad_enabled()
        assert not mica.is_grad_enabled()
    assert mica.is_grad_enabled()
    assert mica.no_grad()(lambda: mica.is_grad_enabled())() is False and mica.is_grad_enabled()
    held = mica.nn.ParameterDict({"a": np.ones(2, np.float32)})
    assert "(a): Parameter containing: [float32 of size (2,)]" in repr(held) and held.get("b") is None


def test_refusals_and_tensor_arguments_an_index_fuzzer_found_are_torchs():
    """torch refuses a bool tensor in a subtraction and an integer tensor's std, var and norm (Mica
    computed them, or named `mean`, a verb the user did not write); narrow takes a 0-d tensor as its
    start, as torch's (Mica spoke of an `if`)."""
    b = np.array([True, False])
    for f in (lambda t: t - 0.5, lambda t: 1 - t, lambda t: t - t.long()):
        with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool tensor is not supported"):
            f(torch.tensor(b))
        with pytest.raises(mica.MicaError, match=r"^sub: subtraction with a bool tensor is not defined"):
            mica.compile(f)(b)
        with pytest.raises(mica.MicaError, match=r"^sub: subtraction with a bool tensor is not defined"):
            f(mica.tensor(b))
    for verb, text in (("std", "std and var take a floating tensor, got int64"),
                       ("var", "std and var take a floating tensor, got int64"),
                       ("norm", "norm takes a floating tensor, got int64")):
        with pytest.raises(RuntimeError):
            getattr(torch.arange(4), verb)()
        with pytest.raises(mica.MicaError, match="^" + text):
            mica.compile(lambda t: getattr(t, verb)())(np.arange(4))
    x = np.arange(12.0, dtype=np.float32).reshape(4, 3)
    want = torch.tensor(x).narrow(0, torch.tensor(1), 2).numpy()
    assert np.array_equal(np.asarray(mica.compile(lambda t: t.narrow(0, mica.tensor(1), 2))(x)), want)
    assert np.array_equal(np.asarray(mica.tensor(x).narrow(0, mica.tensor(1), mica.tensor(2))), want)
    with pytest.raises(mica.MicaError, match=r"^narrow: start is a tensor computed in the trace"):
        mica.compile(lambda t, i: t.narrow(0, i, 2))(x, np.int64(1))


def test_lerp_addcmul_and_a_0d_operand_round_as_torchs_kernels_bit_for_bit():
    """torch's vectorized CPU lerp and addcmul fuse their multiply-add (start + w d for |w| < 0.5,
    else end + (w - 1) d; input + (value t1) t2), and read a 0-d tensor beside a half tensor in
    float32 as a Python number: Mica's were plain products (1 ulp off in a quarter of the elements,
    AdamW's moments with them) and rounded a traced 0-d lr to bfloat16 first."""
    g = np.random.default_rng(9)
    a, b = g.standard_normal(50000).astype(np.float32), (3 * g.standard_normal(50000)).astype(np.float32)
    c = (np.abs(g.standard_normal(50000)) + 0.1).astype(np.float32)
    for w in (0.2, -0.3, 0.5, 0.9, 1.7):
        got = mica.compile(lambda x, y: mica.lerp(x, y, w))(a, b)
        assert np.array_equal(np.asarray(got), torch.tensor(a).lerp(torch.tensor(b), w).numpy()), w
    wt = g.random(50000).astype(np.float32) * 1.4 - 0.2
    got = mica.compile(lambda x, y, z: mica.lerp(x, y, z))(a, b, wt)
    assert np.array_equal(np.asarray(got), torch.tensor(a).lerp(torch.tensor(b), torch.tensor(wt)).numpy())
    got = mica.compile(lambda x, y, z: mica.addcmul(x, y, z, value=-0.0123456))(a, b, c)
    assert np.array_equal(np.asarray(got), torch.tensor(a).addcmul(torch.tensor(b), torch.tensor(c), value=-0.0123456).numpy())
    for al in (0.1, -2.5):  # (add's and sub's alpha: one fused multiply-add, as torch's)
        for op in ("add", "sub"):
            got = mica.compile(lambda x, y: getattr(mica, op)(x, y, alpha=al))(a, b)
            assert np.array_equal(np.asarray(got), getattr(torch.tensor(a), op)(torch.tensor(b), alpha=al).numpy())
    s = 0.0123456789  # (torch 2.13: x * s, x / s, s * x read s in float32; x + s, s - x, t * x round it first;
    forms = [lambda x, t: x + s, lambda x, t: s - x, lambda x, t: x * s, lambda x, t: s * x,  # s / x is
             lambda x, t: x / s, lambda x, t: s / x, lambda x, t: x + t, lambda x, t: t - x,  # x.reciprocal() * s)
             lambda x, t: x * t, lambda x, t: t * x, lambda x, t: x / t, lambda x, t: t / x]
    for dt, tdt in ((mica.bfloat16, torch.bfloat16), (mica.float16, torch.float16), (mica.float32, torch.float32)):
        for k, f in enumerate(forms):
            got = mica.compile(lambda x, t: f(x.to(dt), t).float())(a, np.float32(s))
            assert np.array_equal(np.asarray(got), f(torch.tensor(a).to(tdt), torch.tensor(s)).float().numpy()), (dt, k)
        got = mica.compile(lambda x, y: mica.lerp(x.to(dt), y.to(dt), 0.2).float())(a, b)
        assert np.array_equal(np.asarray(got), torch.tensor(a).to(tdt).lerp(torch.tensor(b).to(tdt), 0.2).float().numpy())


def test_activations_torch_takes_on_floats_only_refuse_an_integer_tensor():
    x = np.array([[1, 2, 3], [4, 5, 7]])
    for verb, call in (("normalize", lambda t: MF.normalize(t)), ("cdist", lambda t: mica.cdist(t, t)),
                       ("cosine_similarity", lambda t: MF.cosine_similarity(t, t)), ("softplus", MF.softplus),
                       ("elu", MF.elu), ("gelu", MF.gelu), ("silu", MF.silu), ("leaky_relu", MF.leaky_relu),
                       ("hardshrink", MF.hardshrink)):
        with pytest.raises(mica.MicaError, match=f"^{verb} takes a floating tensor, got int64"):
            mica.compile(call)(x)
    assert np.allclose(np.asarray(mica.compile(MF.softsign)(x)), TF.softsign(torch.tensor(x)).numpy())  # (torch's too)


@pytest.mark.parametrize("dt,tdt", [(mica.bfloat16, torch.bfloat16), (mica.float16, torch.float16)])
def test_adam_family_on_a_half_parameter_is_torchs_either_path_and_per_group(dt, tdt):
    """fused=True (on the optimizer or one group, read at each step as torch's) takes torch's fused
    kernel's arithmetic for bfloat16 and float16 parameters, the default its single-tensor path:
    three steps with weight decay, bit for bit, a group's own setting honoured."""
    g = np.random.default_rng(12)
    w0 = g.standard_normal((8, 16)).astype(np.float32)
    b0 = g.standard_normal(8).astype(np.float32)
    x = g.standard_normal((4, 16)).astype(np.float32)
    for kind in ("AdamW", "Adam"):
        for fused, group_fused in ((None, None), (True, None), (None, True)):
            got = []
            for lib in (mica, torch):
                lin = lib.nn.Linear(16, 8)
                load_values(lib, lin, {"weight": w0, "bias": b0})
                lin.to(dt if lib is mica else tdt)
                groups = [{"params": [lin.weight]}, {"params": [lin.bias], **({"fused": group_fused}
                                                                             if group_fused else {})}]
                opt = getattr(lib.optim, kind)(groups, lr=1e-2, weight_decay=0.1, fused=fused,
                                               **({} if lib is mica else {"foreach": False}))

                def step(x, half=dt if lib is mica else tdt):
                    opt.zero_grad()
                    loss = lin(x.to(half)).float().square().mean()
                    loss.backward()
                    opt.step()
                    return loss
                if lib is mica:
                    step = mica.compile(step)
                for _ in range(3):
                    step(lib.tensor(x))
                got.append([np.asarray(t.detach().float() if lib is torch else t.float()) for t in (lin.weight, lin.bias)])
            for m, t in zip(*got):
                assert np.array_equal(m, t), (kind, fused, group_fused)


@pytest.mark.parametrize("where", ["eager", "compiled"])
def test_corners_an_outside_fuzzer_found_are_torchs(where):
    """Each gave another value or type than torch 2.13's: a NaN clamp bound was ignored (torch: NaN
    everywhere), logsumexp of a 0-d tensor was log(exp(x)) (-inf for -1000), a compiled abs(-0.0)
    kept its sign (1 / |x| was -inf), a bool add with alpha=2 became int64 (torch keeps bool),
    addcmul of bools and an int32 gave int64, a 0-d float tensor beside a half one with alpha= was
    not rounded to the half type first."""
    def check(fn, *arrays):
        want = fn(torch, *[torch.from_numpy(a) for a in arrays])
        got = fn(mica, *[mica.from_numpy(a) for a in arrays]) if where == "eager" else \
            mica.compile(lambda *xs: fn(mica, *xs))(*arrays)
        want, got = want.float().numpy() if want.dtype == torch.bfloat16 else want.numpy(), np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want)) if got.dtype.kind == "f" else True

    x = np.array([0.0, 1.0, -2.0, np.nan], np.float32)
    check(lambda m, a: m.clamp(a, min=float("nan")), x)
    check(lambda m, a: m.clamp(a, min=-1.0, max=float("nan")), x)
    check(lambda m, a: m.logsumexp(a, 0), np.array(-1000.0, np.float32))
    check(lambda m, a: m.logsumexp(a, 0), np.array(-853176015))
    check(lambda m, a: m.logsumexp(a, 0), np.array(-0.0, np.float32))
    check(lambda m, a: 1 / a.abs(), np.array([-0.0, -1.5, 0.0, np.inf], np.float32))
    check(lambda m, a: a.abs(), np.array([-0.0, -1.5], np.float64))
    b = np.array([True, False, True, False])
    check(lambda m, a, c: a.add(c, alpha=2), b, b[::-1].copy())
    check(lambda m, a: a.add(True, alpha=2), b)
    check(lambda m, a, c: a.add(c, alpha=0), b, b[::-1].copy())
    check(lambda m, a, c: m.addcmul(a, a, c, value=2), b, np.array([2, 3, -4, 5], np.int32))
    check(lambda m, a, c: m.addcmul(c, c, c, value=-1.7), b, np.array([2, 3, -4, 5], np.int32))  # (value truncated)
    half = np.array([-0.1, 0.37, 1.3, -2.2, 0.011, 5.3], np.float32)
    for dt in ("bfloat16", "float16"):
        if where == "eager" and dt == "bfloat16":
            continue  # (an eager bfloat16 tensor computes in float32: docs/api.md)
        check(lambda m, s, y: s.sub(y.to(getattr(m, dt)), alpha=2), np.array(1.2345678), half)
        check(lambda m, s, y: s.add(y.to(getattr(m, dt)), alpha=2), np.array(1.2345678), half)
        check(lambda m, s, y: y.to(getattr(m, dt)).sub(s, alpha=2), np.array(1.2345678), half)
        check(lambda m, y: y.to(getattr(m, dt)).add(1.2345678, alpha=2), half)  # (the number rounded first too)


def test_eager_operators_compute_in_torchs_type():
    """Outside a trace numpy computed a float16 beside a 0-d float32 in float32, and an int32 beside
    a float32 in float64; torch rounds the operands to the type it computes in first (float16;
    float32): a comparison and a remainder came out otherwise. A shift of a float tensor raised
    numpy's TypeError; it is the verb's sentence, as compiled."""
    h = np.array([0.1, 0.2], np.float16)
    z = np.array(0.1, np.float32)
    assert np.array_equal(np.asarray(mica.from_numpy(h) == mica.from_numpy(z)),
                          (torch.from_numpy(h) == torch.from_numpy(z)).numpy())
    a, b = np.array([2147483001, -1999999999], np.int32), np.array([-4.5, 7.25], np.float32)
    for op in (lambda p, q: p % q, lambda p, q: p - q, lambda p, q: p / q, lambda p, q: q * p, lambda p, q: p >= q):
        want = op(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        got = np.asarray(op(mica.from_numpy(a), mica.from_numpy(b)))
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    h = np.random.default_rng(0).standard_normal(500).astype(np.float16)
    h[:3] = [0.0, -0.0, 60000.0]
    for op in (lambda p: p * 0.1, lambda p: 0.1 * p, lambda p: p / 0.3, lambda p: p * 2 ** 31, lambda p: 0.3 / p,
               lambda p: p + 0.1):  # (a float16 tensor and a number: torch's float32 arithmetic, its s / x)
        want = op(torch.from_numpy(h)).numpy()
        got = np.asarray(op(mica.from_numpy(h)))
        assert got.dtype == np.float16 and np.array_equal(got.view(np.uint16), want.view(np.uint16))
    with pytest.raises(mica.MicaError, match=r"^bitwise_left_shift \(<<\) works on integer tensors"):
        mica.tensor([1.0, 2.0]) << 1
    with pytest.raises(mica.MicaError, match=r"^addcdiv: integer division is not supported"):
        mica.addcdiv(mica.tensor([1, 2]), mica.tensor([3, 4]), mica.tensor([5, 6]))
    with pytest.raises(mica.MicaError, match=r"^addcmul of bool tensors is not defined"):
        mica.addcmul(mica.tensor([True]), mica.tensor([True]), mica.tensor([True]))
    for t in (mica.tensor([1, 2]), mica.tensor([True, False])):  # (torch: an integral sum takes an integral alpha)
        with pytest.raises(mica.MicaError, match=r"^(add|sub): alpha=0.5 is a float but the result is"):
            t.add(t, alpha=0.5)
    np.testing.assert_array_equal(np.asarray(mica.tensor([1, 2]).add(1.5, alpha=2)), [4.0, 5.0])
    x, s = np.array([1.5, -7.25, 3.0], np.float16), np.array(0.1)  # (a float16 times a 0-d float64: in float32)
    for op in (lambda p, q: p * q, lambda p, q: p / q, lambda p, q: p // q, lambda p, q: p + q, lambda p, q: p < q):
        want = op(torch.from_numpy(x), torch.from_numpy(s)).numpy()
        got = np.asarray(op(mica.from_numpy(x), mica.from_numpy(s)))
        assert got.dtype == want.dtype and np.array_equal(got, want)
    a = np.array([16777217, -7, 3], np.int32)  # (an integer tensor to a wide float power: numpy's, torch's)
    np.testing.assert_array_equal(np.asarray(mica.from_numpy(a) ** 16777217.5), (torch.from_numpy(a) ** 16777217.5).numpy())


@pytest.mark.parametrize("values", ["normal", "constant", "wide"])
def test_histc_and_histogram_on_host_tensors_are_torchs(values):
    """makemore's activation and gradient plots (`hy, hx = torch.histogram(t, density=True)`): Mica
    had neither; on host tensors they are torch's counts and edges, and a traced tensor is told
    to come out of the step first."""
    import torch

    rng = np.random.default_rng(4)
    a = {"normal": rng.standard_normal(1000), "constant": np.full(10, 3.0),
         "wide": rng.random((7, 9)) * 50 - 20}[values].astype(np.float32)
    for kw in ({}, {"bins": 7}, {"bins": 5, "min": -1, "max": 1}):
        np.testing.assert_array_equal(np.asarray(mica.histc(mica.tensor(a), **kw)),
                                      torch.histc(torch.tensor(a), **kw).numpy())
    edges = np.array([-1.0, 0.0, 0.5, 2.0], np.float32)
    w = rng.random(a.shape).astype(np.float32)
    for kw in ({}, {"bins": 7, "density": True}, {"bins": 5, "range": (-1.0, 1.0)}, {"bins": edges},
               {"bins": 4, "weight": w}):
        th, te = torch.histogram(torch.tensor(a), **{k: torch.tensor(v) if isinstance(v, np.ndarray) else v
                                                      for k, v in kw.items()})
        mh, me = mica.histogram(mica.tensor(a), **kw)
        np.testing.assert_allclose(np.asarray(mh), th.numpy(), rtol=1e-6)
        scale = float(np.abs(te.numpy()).max())  # (torch's vectorized linspace rounds an edge near 0 its own way)
        np.testing.assert_allclose(np.asarray(me), te.numpy(), rtol=1e-6, atol=2e-7 * scale)
    np.testing.assert_array_equal(np.asarray(mica.tensor(a).histc(bins=3)), torch.tensor(a).histc(bins=3).numpy())
    with pytest.raises(mica.MicaError, match=r"^histc runs on host tensors, outside a compiled step"):
        mica.compile(lambda x: mica.histc(x))(a)


def test_an_index_mixing_a_range_or_list_with_a_tensor_and_grad_of_a_parameter_are_torchs():
    """makemore part 4: `logprobs[range(n), Yb]` in a compiled step was refused ('cannot index with
    range'); mica.grad refused a Parameter in wrt that autograd.grad takes; allclose and equal give
    Python bools eagerly, as torch's."""
    import torch

    rng = np.random.default_rng(6)
    lp, y = rng.standard_normal((5, 7)).astype(np.float32), rng.integers(0, 7, 5)
    want = -torch.tensor(lp)[range(5), torch.tensor(y)].mean()
    got = mica.compile(lambda a, b: -a[range(5), b].mean())(lp, y)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    got = mica.compile(lambda a, b: a[[4, 0, 2], b[:3]])(lp, y)
    np.testing.assert_array_equal(np.asarray(got), torch.tensor(lp)[[4, 0, 2], torch.tensor(y[:3])].numpy())

    def put(a, b):
        a = a * 1.0
        a[range(5), b] = 0.0
        return a

    want = torch.tensor(lp).clone()
    want[range(5), torch.tensor(y)] = 0.0
    np.testing.assert_array_equal(np.asarray(mica.compile(put)(lp, y)), want.numpy())
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    W = mica.tensor(w0, requires_grad=True)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    gh, gw = mica.compile(lambda x: mica.grad((x @ W).tanh().sum(), [x @ W, W]))(x)
    tw = torch.tensor(w0, requires_grad=True)
    h = torch.tensor(x) @ tw
    th, tgw = torch.autograd.grad(h.tanh().sum(), [h, tw])
    np.testing.assert_allclose(np.asarray(gh), th.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(gw), tgw.numpy(), rtol=1e-5, atol=1e-7)
    a = mica.tensor(lp)
    assert mica.allclose(a, a) is True and mica.equal(a, a + 1) is False and a.allclose(a) is True


def test_foreach_list_forms_update_an_ema_as_torchs_inside_a_compiled_step_and_outside():
    """torch._foreach_mul_/_add_/_lerp_ (diffusion repos' EMA) were a Python traceback
    (AttributeError: _foreach_mul_); they are the tensors' own methods over the lists."""
    import copy

    import torch

    def run(lib, compiled):
        torch.manual_seed(0)
        theirs = torch.nn.Linear(3, 3)
        m = theirs if lib is torch else mica.nn.Linear(3, 3)
        if lib is mica:
            m.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
        ema = copy.deepcopy(m)
        opt = lib.optim.SGD(m.parameters(), lr=0.1)

        def step(x):
            loss = m(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            with lib.no_grad():
                lib._foreach_mul_(list(ema.parameters()), 0.9)
                lib._foreach_add_(list(ema.parameters()), list(m.parameters()), alpha=0.1)
                lib._foreach_lerp_(list(ema.parameters()), list(m.parameters()), 0.01)
            return loss

        step = compiled(step) if compiled else step
        for i in range(3):
            step(lib.tensor(np.full((2, 3), i + 1.0, np.float32)))
        with lib.no_grad():
            doubled = lib._foreach_mul(list(ema.parameters()), 2.0)
        return [np.asarray(t.detach() if lib is torch else t) for t in list(ema.parameters()) + list(doubled)]

    for got, want in zip(run(mica, mica.compile), run(torch, None)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
    with pytest.raises(mica.MicaError, match=r"^Mica has no mica\._foreach_frobnicate_"):
        mica._foreach_frobnicate_([])


def test_a_masked_assignment_of_a_tensor_of_values_in_a_trace_is_torchs():
    """The DQN tutorial's `next_state_values[non_final_mask] = target_net(next_states).max(1).values`
    (one value per True element, the count known when traced) and a mask of x's leading dims given
    a row or a number, were sentences in a trace; each is torch's, gradients included."""
    import torch

    rng = np.random.default_rng(21)
    mask = rng.random(16) > 0.3
    values = rng.standard_normal(int(mask.sum())).astype(np.float32)
    rows_mask, x = np.array([True, False, True, True]), rng.standard_normal((4, 3)).astype(np.float32)
    rows, row = rng.standard_normal((3, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    weights = rng.standard_normal(16).astype(np.float32)

    def f(lib, mask, values, rows_mask, x, rows, row):
        out = lib.zeros(16)
        out[mask] = values * 2
        a, b, c = x.clone(), x.clone(), x.clone()
        a[rows_mask] = rows
        b[rows_mask] = row
        c[rows_mask] = 5.0
        return out, a, b, c, (out * lib.tensor(weights)).sum()

    got = mica.compile(lambda *t: f(mica, *t))(*(mica.tensor(a) for a in (mask, values, rows_mask, x, rows, row)))
    ts = [torch.tensor(a) for a in (mask, values, rows_mask, x, rows, row)]
    ts[1].requires_grad_()
    want = f(torch, *ts)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w.detach().numpy())
    grad = mica.compile(lambda *t: mica.grad(f(mica, *t)[-1], t[1]))(
        *(mica.tensor(a) for a in (mask, values, rows_mask, x, rows, row)))
    want[-1].backward()
    np.testing.assert_array_equal(np.asarray(grad), ts[1].grad.numpy())
    with pytest.raises(mica.MicaError, match=r"the mask selects rows of shape \[3\]; give one value, a row"):
        mica.compile(lambda m, v, x: f(mica, np.ones(16, bool), np.ones(16, np.float32), m, x, v, row))(
            mica.tensor(rows_mask), mica.tensor(np.ones((3, 2), np.float32)), mica.tensor(x))


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_masked_assignment_whose_mask_holds_another_count_stops_with_a_sentence(target):
    """One value per True element, the count fixed when traced: a call whose mask holds more or fewer
    stops with torch's refusal as a sentence at the assignment's line (it took the last value again,
    or dropped one, silently), on the CPU and in the CUDA source (on the simulator)."""
    if target == "cuda" and not __import__("test_cuda")._has_boost_context():
        pytest.skip("libboost-context-dev is not installed")

    def f(mask, values):
        x = mica.arange(5).float()
        x[mask] = values
        return x

    program = mica.trace(f, mica.b8[5], mica.f32[3])
    run = program.lower(target, **({"simulate": True} if target == "cuda" else {})).build()
    values = np.array([10, 20, 30], np.float32)
    np.testing.assert_array_equal(np.asarray(run(np.array([1, 0, 1, 1, 0], bool), values)), [10, 1, 20, 30, 4])
    for mask, count in (([1, 1, 1, 1, 0], 4), ([1, 0, 0, 1, 0], 2), ([0, 0, 0, 0, 0], 0)):
        with pytest.raises(mica.MicaError, match=rf"^x\[mask\] = values: the mask selects {count} elements and values "
                                                 r"holds 3; give one value per True element .*test_more_verbs"):
            run(np.array(mask, bool), values)
    with pytest.raises(mica.MicaError, match=r"the mask selects 1 elements and values holds 3"):
        mica.reference.run(program, np.array([1, 0, 0, 0, 0], bool), values)


def test_bincount_and_memory_formats_are_torchs():
    """An MoE's tokens per expert, `torch.bincount(indices, minlength=E)` (in a trace minlength is
    the static length, a larger value a sentence when the program runs), and torchvision's
    `--channels-last` lines, which change nothing here."""
    import torch

    rng = np.random.default_rng(22)
    idx, w = rng.integers(0, 5, 12), rng.random(12).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(mica.bincount(mica.tensor(idx))), torch.bincount(torch.tensor(idx)).numpy())
    np.testing.assert_allclose(np.asarray(mica.bincount(mica.tensor(idx), mica.tensor(w), minlength=7)),
                               torch.bincount(torch.tensor(idx), torch.tensor(w), minlength=7).numpy(), rtol=1e-6)
    counts, weighted = mica.compile(lambda i, w: (mica.bincount(i, minlength=6), mica.bincount(i, w, minlength=6)))(
        mica.tensor(idx), mica.tensor(w))
    np.testing.assert_array_equal(np.asarray(counts), torch.bincount(torch.tensor(idx), minlength=6).numpy())
    np.testing.assert_allclose(np.asarray(weighted), torch.bincount(torch.tensor(idx), torch.tensor(w), minlength=6),
                               rtol=1e-6)
    with pytest.raises(mica.MicaError, match="an index tensor holds 9, out of range for a dim of 6 elements"):
        mica.compile(lambda i: mica.bincount(i, minlength=6))(mica.tensor(np.array([0, 9, 1])))
    with pytest.raises(mica.MicaError, match="bincount inside a trace counts into minlength bins"):
        mica.compile(lambda i: mica.bincount(i))(mica.tensor(idx))
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    conv = mica.nn.Conv2d(3, 2, 3).to(memory_format=mica.channels_last)
    out = mica.compile(lambda x: conv(x.contiguous(memory_format=mica.channels_last)).to(
        memory_format=mica.contiguous_format))(mica.tensor(x))
    assert tuple(out.shape) == (2, 2, 2, 2) and repr(mica.channels_last) == "mica.channels_last"
