"""Complex tensors as transformer code uses them: Meta's LLaMA rotary embedding (torch.polar,
view_as_complex over feature pairs, a complex product, view_as_real), in a compiled training step,
an eager call and on host tensors, against torch (mica/complex.py)."""
import numpy as np
import pytest
import torch

import mica
from helpers import load_values, rel_err


def _llama_rotary(lib):
    """An attention score block with the rotary embedding as Meta's llama/model.py writes it."""
    def precompute_freqs_cis(dim, end, theta=10000.0):
        freqs = 1.0 / (theta ** (lib.arange(0, dim, 2)[: (dim // 2)].float() / dim))
        t = lib.arange(end, device=freqs.device)
        freqs = lib.outer(t, freqs).float()
        return lib.polar(lib.ones_like(freqs), freqs)  # complex64

    def reshape_for_broadcast(freqs_cis, x):
        ndim = x.ndim
        assert freqs_cis.shape == (x.shape[1], x.shape[-1])
        shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
        return freqs_cis.view(*shape)

    def apply_rotary_emb(xq, xk, freqs_cis):
        xq_ = lib.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = lib.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
        xq_out = lib.view_as_real(xq_ * freqs_cis).flatten(3)
        xk_out = lib.view_as_real(xk_ * freqs_cis).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)

    class Scores(lib.nn.Module):
        def __init__(self, dim=16, n_heads=2, max_seq_len=32):
            super().__init__()
            self.n_heads, self.head_dim = n_heads, dim // n_heads
            self.wq = lib.nn.Linear(dim, dim, bias=False)
            self.wk = lib.nn.Linear(dim, dim, bias=False)
            self.freqs_cis = precompute_freqs_cis(self.head_dim, max_seq_len * 2)
            self.register_buffer("rot", precompute_freqs_cis(self.head_dim, max_seq_len), persistent=False)

        def forward(self, x, start_pos):
            bsz, seqlen, _ = x.shape
            xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
            xk = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim)
            self.freqs_cis = self.freqs_cis.to(x.device)
            freqs_cis = self.freqs_cis[start_pos: start_pos + seqlen]
            xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis * self.rot[:seqlen].conj())
            return (xq.transpose(1, 2) @ xk.transpose(1, 2).transpose(2, 3)).softmax(-1)
    return Scores


def test_llamas_rotary_embedding_trains_as_torchs():
    rng = np.random.default_rng(0)
    weights = {"wq.weight": rng.standard_normal((16, 16)).astype(np.float32) * 0.3,
               "wk.weight": rng.standard_normal((16, 16)).astype(np.float32) * 0.3}
    xv, target = rng.standard_normal((2, 5, 16)).astype(np.float32), rng.random((2, 2, 5, 5)).astype(np.float32)
    got = {}
    for lib in (mica, torch):
        m = _llama_rotary(lib)()
        load_values(lib, m, weights)
        x = lib.tensor(xv)
        eager = m(x, 3)

        def step(x, t):
            loss = ((m(x, 3) - t) ** 2).sum()
            loss.backward()
            return loss
        if lib is mica:
            step = mica.compile(step)
        loss = float(step(x, lib.tensor(target)))
        got[lib.__name__] = (np.asarray(eager.detach() if lib is torch else eager), loss,
                             np.asarray(m.wq.weight.grad).copy(), np.asarray(m.wk.weight.grad).copy())
        assert list(dict(m.named_buffers())) == ["rot"] and "rot" not in m.state_dict()
    for a, b in zip(got["mica"], got["torch"]):
        assert rel_err(np.asarray(a), np.asarray(b)) < 1e-5


def test_complex_arithmetic_and_its_gradients_follow_torch():
    """polar of traced values (a learned angle), products, quotients, conj, abs, real/imag, a
    Python complex number and a complex buffer, differentiated: torch's loss and gradient."""
    rng = np.random.default_rng(1)
    av, tv = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    xv = rng.standard_normal((2, 4, 6)).astype(np.float32)
    got = {}
    for lib in (mica, torch):
        class M(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.theta = lib.nn.Parameter(lib.tensor(tv))
                self.register_buffer("fc", lib.polar(lib.ones(4, 3), lib.tensor(av)), persistent=False)

            def forward(self, x):
                c = lib.view_as_complex(x.reshape(2, 4, 3, 2))
                r = lib.polar(lib.ones_like(self.theta), self.theta)
                y = (c * r * self.fc) / (r + 2.0) - lib.complex(self.theta, x[0, :, :3])
                z = lib.view_as_real(y.conj() - 1j * y).flatten(2)
                return z.real.sum() + y.abs().sum() + y.real.mean() * y.imag.mean() + (2 * y).unsqueeze(0)[0, 1].real.sum()
        m = M()

        def step(x):
            loss = m(x)
            loss.backward()
            return loss
        if lib is mica:
            step = mica.compile(step)
        got[lib.__name__] = (float(step(lib.tensor(xv))), np.asarray(m.theta.grad).copy())
    (ml, mg), (tl, tg) = got["mica"], got["torch"]
    assert abs(ml - tl) <= 1e-5 * abs(tl) and rel_err(mg, tg) < 1e-5


def test_complex_host_tensors_print_and_convert_as_torchs():
    for lib in (mica, torch):
        f = lib.polar(lib.ones(2, 3), lib.arange(6).float().view(2, 3))
        assert repr(f) == repr(torch.polar(torch.ones(2, 3), torch.arange(6).float().view(2, 3)))
        assert f.dtype == lib.complex64 and lib.is_complex(f) and tuple(lib.view_as_real(f).shape) == (2, 3, 2)
        back = lib.view_as_complex(lib.view_as_real(f))
        assert np.array_equal(np.asarray(back), np.asarray(f))


def test_complex_tensors_a_program_cannot_hold_are_sentences():
    with pytest.raises(mica.MicaError, match=r"^a traced function returns a complex tensor, which a compiled program "
                                             r"cannot hold; return torch.view_as_real of it"):
        mica.compile(lambda x: mica.view_as_complex(x) * 2)(mica.ones(3, 2))
    with pytest.raises(mica.MicaError, match=r"^view_as_complex needs a last dim of size 2"):
        mica.compile(lambda x: mica.view_as_real(mica.view_as_complex(x)))(mica.ones(3, 3))
    with pytest.raises(mica.MicaError, match=r"^view_as_complex takes float32 or float64, got bfloat16"):
        mica.compile(lambda x: mica.view_as_real(mica.view_as_complex(x.bfloat16())))(mica.ones(3, 2))
    with pytest.raises(mica.MicaError, match=r"^a complex tensor converted to float32 would drop its imaginary part"):
        mica.compile(lambda x: mica.view_as_complex(x).to(mica.float32))(mica.ones(3, 2))


def test_every_operand_order_with_a_complex_tensor_is_torchs():
    """A real Tensor or number on either side of a traced complex tensor or a complex host tensor
    (real / complex recursed; real * host complex dropped the imaginary part), powers, exp, sum,
    mean, and complex numbers made by mica.tensor."""
    rng = np.random.default_rng(4)
    xv, rv = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    hv = (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex64)
    ops = [lambda c, r, h: r / c, lambda c, r, h: 2.0 / c, lambda c, r, h: r * h, lambda c, r, h: h * r,
           lambda c, r, h: r + h, lambda c, r, h: h - r, lambda c, r, h: r - h, lambda c, r, h: h / r,
           lambda c, r, h: r / h, lambda c, r, h: c ** 2, lambda c, r, h: c ** -1, lambda c, r, h: 1j * r,
           lambda c, r, h: c.exp(), lambda c, r, h: c.sum(0, keepdim=True), lambda c, r, h: c.mean(),
           lambda c, r, h: c - r, lambda c, r, h: c * h]
    for op in ops:
        got = mica.compile(lambda x, r: mica.view_as_real(op(mica.view_as_complex(x), r, mica.tensor(hv))))(xv, rv)
        want = torch.view_as_real(op(torch.view_as_complex(torch.tensor(xv)), torch.tensor(rv), torch.tensor(hv)))
        assert rel_err(np.asarray(got), want.numpy()) < 1e-6
    for lib in (mica, torch):
        t = lib.tensor([1 + 2j, 3j])
        assert t.dtype == lib.complex64 and t.is_complex() and repr(t) == "tensor([1.+2.j, 0.+3.j])"
        assert lib.complex(lib.tensor([1.0]), lib.tensor([float("inf")])).tolist() == [complex(1, float("inf"))]
        assert repr(lib.complex(lib.tensor([]), lib.tensor([]))) == "tensor([], dtype=torch.complex64)"


def test_a_module_called_eagerly_takes_a_complex_argument():
    """Meta's generate() calls model.forward itself, so each block is called outside a trace with
    the complex rotations as an argument (it was refused, naming float32)."""
    for lib in (mica, torch):
        class Rot(lib.nn.Module):
            def forward(self, x, freqs_cis):
                xc = lib.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
                return lib.view_as_real(xc * freqs_cis).flatten(-2)
        f = lib.polar(lib.ones(4, 2), lib.arange(8.0).view(4, 2))
        out = Rot()(lib.arange(16.0).view(4, 4), f)
        if lib is mica:
            got = np.asarray(out)
        else:
            assert rel_err(got, out.numpy()) < 1e-6


def test_what_a_complex_tensor_cannot_do_is_a_sentence():
    with pytest.raises(mica.MicaError, match=r"^a complex tensor in Mica has no .cumsum"):
        mica.compile(lambda x: mica.view_as_real(mica.view_as_complex(x).cumsum(0)))(np.ones((3, 2), np.float32))
    with pytest.raises(mica.MicaError, match=r"^mica.cat takes real tensors, and this one is complex"):
        hc = mica.polar(mica.ones(3), mica.zeros(3))
        mica.compile(lambda r: mica.cat([r, hc]).sum())(np.ones(3, np.float32))


def test_a_complex_host_tensors_methods_and_a_real_dtype_are_torchs():
    """c.sum(), c.mean(), c.exp(), c.cumsum(0) outside a trace are torch's (they recursed without
    end); complex data given a real dtype is refused, as torch refuses it."""
    for lib in (mica, torch):
        c = lib.tensor([1 + 2j, 3 - 1j])
        got = [c.sum(), c.mean(), c.exp(), c.cumsum(0), c.sum(0, keepdim=True), c.abs()]
        if lib is mica:
            mine = [np.asarray(t) for t in got]
        else:
            for m, t in zip(mine, got):
                assert m.dtype == t.numpy().dtype and np.allclose(m, t.numpy(), rtol=1e-6)
    with pytest.raises(mica.MicaError, match=r"^tensor: complex numbers cannot be held as float32"):
        mica.tensor([1 + 2j], dtype=mica.float32)
    with pytest.raises(mica.MicaError, match=r"^cumprod of a complex host tensor is not in Mica"):
        mica.tensor([1 + 2j]).cumprod(0)
