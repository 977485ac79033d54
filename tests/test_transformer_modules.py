"""nn.MultiheadAttention, the Transformer encoder, decoder and both (nn.Transformer) against torch's:
the same state_dict keys, values and gradients (eager and compiled), and a model written for torch's
tutorial trained by a compiled step as torch trains it."""
import numpy as np
import pytest
import torch

import mica
from helpers import rel_err
from torch_transformer_tutorial import make

E, H, L, S, N = 16, 4, 5, 7, 3


def _load(mine, theirs):
    mine.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})


def _masks():
    g = torch.Generator().manual_seed(1)
    padding = torch.zeros(N, S, dtype=torch.bool)
    padding[0, -2:] = True
    scores = torch.randn(L, S, generator=g)
    return {"none": {}, "float mask": {"attn_mask": scores}, "padding": {"key_padding_mask": padding},
            "bool mask and padding": {"attn_mask": scores > 1.0, "key_padding_mask": padding},
            "sdpa path": {"need_weights": False, "attn_mask": scores},
            "each head's weights": {"average_attn_weights": False},
            "per-head mask": {"attn_mask": torch.randn(N * H, L, S, generator=g)}}


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("case", list(_masks()))
def test_multihead_attention_is_torchs(batch_first, case):
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(E, H, batch_first=batch_first)
    mine = mica.nn.MultiheadAttention(E, H, batch_first=batch_first)
    assert sorted(mine.state_dict()) == sorted(theirs.state_dict())
    _load(mine, theirs)
    kw = _masks()[case]
    shapes = ((N, L, E), (N, S, E)) if batch_first else ((L, N, E), (S, N, E))
    q, k, v = torch.randn(*shapes[0]), torch.randn(*shapes[1]), torch.randn(*shapes[1])
    want, want_w = theirs(q, k, v, **kw)
    (want ** 2).sum().backward()
    args = {a: b.numpy() for a, b in kw.items() if hasattr(b, "numpy")} | {a: b for a, b in kw.items()
                                                                            if not hasattr(b, "numpy")}
    out, w = mine(q.numpy(), k.numpy(), v.numpy(), **args)  # (eager)
    assert rel_err(np.asarray(out), want.detach().numpy()) < 1e-6
    assert (w is None) == (want_w is None)
    if w is not None:
        assert rel_err(np.asarray(w), want_w.detach().numpy()) < 1e-6

    if not batch_first or case in ("none", "padding", "each head's weights"):
        return  # (compiled for the cases that reach every path; the others and the layouts checked eagerly)

    @mica.compile
    def step(q, k, v):
        o, _ = mine(q, k, v, **args)
        (o ** 2).sum().backward()
        return o

    assert rel_err(np.asarray(step(q.numpy(), k.numpy(), v.numpy())), want.detach().numpy()) < 1e-6
    for name, p in theirs.named_parameters():
        assert rel_err(np.asarray(mine.get_parameter(name).grad), p.grad.numpy()) < 1e-5, name


def test_multihead_attention_other_forms_are_torchs():
    """kdim/vdim (three projection weights), an unbatched call, and the causal hint with its mask on
    one input given as query, key and value (one packed projection)."""
    torch.manual_seed(0)
    theirs, mine = torch.nn.MultiheadAttention(E, H, kdim=6, vdim=10), mica.nn.MultiheadAttention(E, H, kdim=6, vdim=10)
    assert sorted(mine.state_dict()) == sorted(theirs.state_dict())
    _load(mine, theirs)
    q, k, v = torch.randn(L, N, E), torch.randn(S, N, 6), torch.randn(S, N, 10)
    assert rel_err(np.asarray(mine(q.numpy(), k.numpy(), v.numpy())[0]), theirs(q, k, v)[0].detach().numpy()) < 1e-6
    theirs = torch.nn.MultiheadAttention(E, H, batch_first=True)
    mine = mica.nn.MultiheadAttention(E, H, batch_first=True)
    _load(mine, theirs)
    x = torch.randn(L, E)
    for got, want in zip(mine(x.numpy(), x.numpy(), x.numpy()), theirs(x, x, x)):
        assert rel_err(np.asarray(got), want.detach().numpy()) < 1e-6
    x = torch.randn(N, L, E)
    mask = mica.nn.Transformer.generate_square_subsequent_mask(L)
    np.testing.assert_array_equal(np.asarray(mask), torch.nn.Transformer.generate_square_subsequent_mask(L).numpy())
    got = mica.compile(lambda x: mine(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)[0])(x.numpy())
    want = theirs(x, x, x, attn_mask=torch.nn.Transformer.generate_square_subsequent_mask(L), need_weights=False,
                  is_causal=True)[0]
    assert rel_err(np.asarray(got), want.detach().numpy()) < 1e-6


@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_transformer_encoder_is_torchs(norm_first, activation):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, activation=activation, batch_first=True,
                                             norm_first=norm_first)
    theirs = torch.nn.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(E), enable_nested_tensor=False)
    mine = mica.nn.TransformerEncoder(mica.nn.TransformerEncoderLayer(
        E, H, 32, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first), 2,
        norm=mica.nn.LayerNorm(E))
    assert sorted(mine.state_dict()) == sorted(theirs.state_dict())
    _load(mine, theirs)
    x = torch.randn(N, L, E)
    padding = torch.zeros(N, L, dtype=torch.bool)
    padding[1, -1] = True
    mask = torch.nn.Transformer.generate_square_subsequent_mask(L)
    got = mica.compile(lambda x: mine(x, mask=mask.numpy(), is_causal=True))(x.numpy())
    assert rel_err(np.asarray(got), theirs(x, mask=mask, is_causal=True).detach().numpy()) < 1e-6
    got = mine(x.numpy(), src_key_padding_mask=padding.numpy())
    assert rel_err(np.asarray(got), theirs(x, src_key_padding_mask=padding).detach().numpy()) < 1e-6


@pytest.mark.parametrize("batch_first,norm_first,activation", [
    (False, False, "relu"),
    pytest.param(True, True, "gelu", marks=pytest.mark.slow)])  # (the other layout: make test-slow runs it)
def test_the_encoder_decoder_transformer_is_torchs(batch_first, norm_first, activation):
    """nn.Transformer (encoder, decoder, their final norms) and so TransformerDecoderLayer and
    TransformerDecoder: torch's state_dict keys; from torch's weights the same output with a causal
    target mask and padding on source and target, its gradients, and three compiled AdamW steps at
    torch's losses; a fresh one's matrices drawn by xavier_uniform_ as torch's."""
    torch.manual_seed(0)
    kw = dict(dropout=0.0, activation=activation, batch_first=batch_first, norm_first=norm_first)
    theirs = torch.nn.Transformer(E, H, 1, 2, 32, **kw)  # (one encoder layer, two decoder layers: its copies)
    mine = mica.nn.Transformer(E, H, 1, 2, 32, **kw)
    assert list(mine.state_dict()) == list(theirs.state_dict())  # (in torch's order: an optimizer's indices)
    for name, p in mine.named_parameters():
        if len(p.shape) > 1:  # (xavier_uniform_'s bound, and not the Linears' own init)
            bound = np.sqrt(6.0 / sum(p.shape))
            assert np.abs(np.asarray(p)).max() <= bound and np.abs(np.asarray(p)).max() > 0.8 * bound, name
    _load(mine, theirs)
    g = torch.Generator().manual_seed(3)
    shape = (lambda n, t: (n, t, E)) if batch_first else (lambda n, t: (t, n, E))
    src, tgt = torch.randn(*shape(N, S), generator=g), torch.randn(*shape(N, L), generator=g)
    src_pad, tgt_pad = torch.zeros(N, S, dtype=torch.bool), torch.zeros(N, L, dtype=torch.bool)
    src_pad[0, -2:], tgt_pad[2, -1] = True, True
    causal = torch.nn.Transformer.generate_square_subsequent_mask(L)
    masks = dict(tgt_mask=causal, src_key_padding_mask=src_pad, memory_key_padding_mask=src_pad,
                 tgt_key_padding_mask=tgt_pad)
    want = theirs(src, tgt, **masks)
    got = mine(src.numpy(), tgt.numpy(), **{k: v.numpy() for k, v in masks.items()})
    assert rel_err(np.asarray(got), want.detach().numpy()) < 1e-5
    y = torch.randn(*want.shape, generator=g)  # (a normalized output's own mean square is constant: a target)
    ((want - y) ** 2).mean().backward()
    opt = mica.optim.AdamW(mine.parameters(), lr=1e-2)
    topt = torch.optim.AdamW(theirs.parameters(), lr=1e-2)
    grads = {n: p.grad.numpy().copy() for n, p in theirs.named_parameters()}

    @mica.compile
    def step(src, tgt):
        loss = ((mine(src, tgt, **{k: v.numpy() for k, v in masks.items()}) - mica.tensor(y.numpy())) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    @mica.compile
    def gradients(src, tgt):
        loss = ((mine(src, tgt, **{k: v.numpy() for k, v in masks.items()}) - mica.tensor(y.numpy())) ** 2).mean()
        return mica.autograd.grad(loss, list(mine.parameters()))

    for (n, _), gm in zip(mine.named_parameters(), gradients(src.numpy(), tgt.numpy())):
        assert rel_err(np.asarray(gm), grads[n]) < 1e-4, n
    topt.zero_grad()
    for _ in range(3):
        loss = ((theirs(src, tgt, **masks) - y) ** 2).mean()
        topt.zero_grad()
        loss.backward()
        topt.step()
        assert float(step(src.numpy(), tgt.numpy())) == pytest.approx(loss.item(), rel=1e-5)


def test_torchs_transformer_tutorial_model_trains_as_torchs():
    """PyTorch's tutorial model (positional encoding buffer, TransformerEncoder of two layers, the
    causal mask from nn.Transformer, its init through .data.uniform_), ported by its imports: five
    SGD steps with clipping give torch's losses."""
    torch.manual_seed(0)
    theirs = make(torch, torch.nn)(50, 32, 2, 64, 2, dropout=0.0)
    mine = make(mica, mica.nn)(50, 32, 2, 64, 2, dropout=0.0)
    _load(mine, theirs)
    topt, mopt = torch.optim.SGD(theirs.parameters(), lr=0.5), mica.optim.SGD(mine.parameters(), lr=0.5)

    @mica.compile
    def step(data, targets):
        loss = mica.nn.functional.cross_entropy(mine(data).view(-1, 50), targets)
        mopt.zero_grad()
        loss.backward()
        mica.nn.utils.clip_grad_norm_(mine.parameters(), 0.5)
        mopt.step()
        return loss

    for _ in range(5):
        data, targets = torch.randint(0, 50, (12, 4)), torch.randint(0, 50, (48,))
        loss = torch.nn.functional.cross_entropy(theirs(data).view(-1, 50), targets)
        topt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.5)
        topt.step()
        assert float(step(data.numpy(), targets.numpy())) == pytest.approx(loss.item(), rel=1e-5)


def test_what_torchs_attention_modules_refuse_is_a_sentence():
    m = mica.nn.MultiheadAttention(E, H)
    x = np.zeros((L, N, E), np.float32)
    cases = [
        (lambda: mica.nn.MultiheadAttention(10, 3),
         r"^MultiheadAttention: embed_dim \(10\) must be a positive multiple"),
        (lambda: mica.nn.MultiheadAttention(E, H, add_bias_kv=True), r"^MultiheadAttention: add_bias_kv"),
        (lambda: m(x, x, x, is_causal=True), r"^MultiheadAttention: is_causal is a hint"),
        (lambda: m(x, x, x, attn_mask=np.zeros((L, L + 1), np.float32)), r"^MultiheadAttention: attn_mask is \[5, 6\]"),
        (lambda: m(x, x, x, key_padding_mask=np.zeros((N, L + 1), bool)), r"^MultiheadAttention: key_padding_mask"),
        (lambda: m(x, x[:, :2], x), r"^MultiheadAttention: query \[5, 3, 16\]"),
        (lambda: mica.nn.TransformerEncoderLayer(E, H, activation="tanh"), r"^TransformerEncoderLayer: activation"),
        (lambda: mica.nn.Transformer(E, H, 1, 1, 32)(np.zeros((S, N, E), np.float32), np.zeros((L, N + 1, E), np.float32)),
         r"^Transformer: src and tgt must have the same batch size \(dim 1\)"),
        (lambda: mica.nn.Transformer(E, H, 1, 1, 32)(np.zeros((S, N, E), np.float32), np.zeros((L, N, E - 1), np.float32)),
         r"^Transformer: src and tgt must have d_model=16 features"),
        (lambda: mica.nn.TransformerDecoderLayer(E, H, activation="tanh"), r"^TransformerDecoderLayer: activation"),
    ]
    for make_it, sentence in cases:
        with pytest.raises(mica.MicaError, match=sentence):
            make_it()


def test_the_causal_mask_outside_a_trace_is_a_host_tensor_as_torchs():
    """generate_square_subsequent_mask called eagerly (a greedy decoding loop) gives a tensor whose
    methods work, with dtype= honored: it gave a numpy array (`.to(device)`, `.bool()`,
    `.masked_fill` raised AttributeError) and dtype= failed inside Mica."""
    want = torch.nn.Transformer.generate_square_subsequent_mask(4)
    for dtype, tdtype in [(None, None), (mica.float32, torch.float32), (mica.float64, torch.float64)]:
        got = mica.nn.Transformer.generate_square_subsequent_mask(4, dtype=dtype)
        assert isinstance(got, mica.HostTensor) and str(got.dtype).split(".")[-1] == str(
            torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=tdtype).dtype).split(".")[-1]
        np.testing.assert_array_equal(np.asarray(got), want.numpy())
    got = mica.nn.Transformer.generate_square_subsequent_mask(4).to("cpu")
    np.testing.assert_array_equal(np.asarray(got.bool()), want.bool().numpy())
    np.testing.assert_array_equal(np.asarray(got.masked_fill(got == 0, 2.0)), want.masked_fill(want == 0, 2.0).numpy())
    program = mica.trace(lambda x: x + mica.nn.Transformer.generate_square_subsequent_mask(4, dtype=mica.bfloat16),
                         mica.f32[4, 4])
    assert "bf16[4, 4] = literal" in program.ir
