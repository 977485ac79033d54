"""nn.RNN, LSTM, GRU and their cells against torch's: state_dict keys and shapes in torch's order,
reprs, and, from torch's weights, the outputs and final states eagerly and compiled, with every
parameter's gradient (through time, both directions, stacked layers, LSTM projections, given
initial states, unbatched inputs). torch's CPU kernel sums its products in another order (oneDNN's
where it takes them), so values agree to float32 rounding."""
import warnings

import numpy as np
import pytest
import torch

import mica

L, N, I, H = 5, 3, 4, 6


def _flat(o):
    return [o] if not isinstance(o, tuple) else [z for y in o for z in _flat(y)]


def _states(rng, *shapes):
    return tuple(rng.standard_normal(s).astype(np.float32) for s in shapes)


CASES = {
    "lstm": (lambda nn: nn.LSTM(I, H), (L, N, I), None),
    "gru 2 layers": (lambda nn: nn.GRU(I, H, num_layers=2), (L, N, I), None),
    "rnn relu bidirectional": (lambda nn: nn.RNN(I, H, nonlinearity="relu", bidirectional=True), (L, N, I), None),
    "lstm stacked bidirectional projected batch_first": (
        lambda nn: nn.LSTM(I, H, num_layers=2, bidirectional=True, proj_size=3, batch_first=True), (N, L, I), None),
    "gru unbatched no bias with h0": (lambda nn: nn.GRU(I, H, bias=False, bidirectional=True), (L, I), [(2, H)]),
    "lstm with (h0, c0)": (lambda nn: nn.LSTM(I, H, num_layers=2), (L, N, I), [(2, N, H), (2, N, H)]),
    "lstm cell": (lambda nn: nn.LSTMCell(I, H), (N, I), None),
    "gru cell with h": (lambda nn: nn.GRUCell(I, H), (N, I), [(N, H)]),
    "rnn cell unbatched": (lambda nn: nn.RNNCell(I, H, nonlinearity="relu", bias=False), (I,), None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_recurrent_modules_are_torchs(name):
    make, shape, state_shapes = CASES[name]
    rng = np.random.default_rng(len(name))
    torch.manual_seed(0)
    theirs, mine = make(torch.nn), make(mica.nn)
    assert repr(mine) == repr(theirs)
    assert [(k, tuple(v.shape)) for k, v in mine.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in theirs.state_dict().items()]
    mine.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x = rng.standard_normal(shape).astype(np.float32)
    hx = None if state_shapes is None else _states(rng, *state_shapes)
    hx = hx if hx is None or "lstm" in name else hx[0]
    thx = None if hx is None else (tuple(map(torch.tensor, hx)) if isinstance(hx, tuple) else torch.tensor(hx))
    want = _flat(theirs(torch.tensor(x), thx) if thx is not None else theirs(torch.tensor(x)))
    cotangents = [rng.standard_normal(tuple(o.shape)).astype(np.float32) for o in want]
    sum((o * torch.tensor(g)).sum() for o, g in zip(want, cotangents)).backward()

    eager = _flat(mine(mica.from_numpy(x), hx) if hx is not None else mine(mica.from_numpy(x)))
    for got, w in zip(eager, want):
        assert got.shape == tuple(w.shape)
        np.testing.assert_allclose(np.asarray(got), w.detach().numpy(), rtol=0, atol=1e-6)

    @mica.compile
    def step(x, *gs):
        out = _flat(mine(x, hx) if hx is not None else mine(x))
        sum((o * g).sum() for o, g in zip(out, gs)).backward()
        return out, [p.grad for p in mine.parameters()]

    out, grads = step(x, *cotangents)
    for got, w in zip(out, want):
        w = w.detach().numpy()
        assert np.abs(np.asarray(got) - w).max() <= 2e-6 * max(1.0, np.abs(w).max())
    for (pname, p), g in zip(theirs.named_parameters(), grads):
        w = p.grad.numpy()
        assert np.abs(np.asarray(g) - w).max() <= 2e-6 * max(1.0, np.abs(w).max()), pname


def test_dropout_between_layers_only_in_training():
    """dropout acts between stacked layers in training mode (outputs differ from eval's, the last
    layer's states too) and not in eval mode (the same as dropout=0)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((L, N, I)).astype(np.float32)
    m = mica.nn.GRU(I, H, num_layers=2, dropout=0.5)
    plain = mica.nn.GRU(I, H, num_layers=2)
    plain.load_state_dict(m.state_dict())
    m.eval()
    np.testing.assert_array_equal(np.asarray(m(mica.from_numpy(x))[0]), np.asarray(plain(mica.from_numpy(x))[0]))
    m.train()
    mica.manual_seed(3)
    out = mica.compile(lambda x: m(x)[0])(x)
    assert not np.allclose(np.asarray(out), np.asarray(plain(mica.from_numpy(x))[0]))


@pytest.mark.parametrize("make,call,says", [
    (lambda: mica.nn.LSTM(4, 6), lambda m: m(np.zeros((5, 3, 5), np.float32)), r"^LSTM: input has 5 features"),
    (lambda: mica.nn.GRU(4, 6), lambda m: m(np.zeros((5, 3, 2, 4), np.float32)), r"^GRU: input must be \[L, N, 4\]"),
    (lambda: mica.nn.LSTM(4, 6), lambda m: m(np.zeros((5, 3, 4), np.float32), np.zeros((1, 3, 6), np.float32)),
     r"^LSTM: hx must be a tuple \(h_0, c_0\)"),
    (lambda: mica.nn.RNN(4, 6, num_layers=2), lambda m: m(np.zeros((5, 3, 4), np.float32), np.zeros((1, 3, 6), np.float32)),
     r"^RNN: h_0 must be \[2, 3, 6\]"),
    (lambda: mica.nn.LSTMCell(4, 6), lambda m: m(np.zeros((3, 5), np.float32)), r"^LSTMCell: input must be \[N, 4\]"),
    (lambda: mica.nn.RNN(4, 6, nonlinearity="sigmoid"), None, r"^RNN: nonlinearity must be 'tanh' or 'relu'"),
    (lambda: mica.nn.LSTM(4, 6, proj_size=6), None, r"^LSTM: proj_size \(6\) must be smaller than hidden_size"),
    (lambda: mica.nn.GRU(4, 0), None, r"^GRU: hidden_size must be a positive int"),
    (lambda: mica.nn.GRU(4, 6, proj_size=2), None, r"^GRU: proj_size is only an LSTM's"),
    (lambda: mica.nn.GRU(4, 6), lambda m: m(np.zeros((5, 3, 4), np.float32), (np.zeros((1, 3, 6), np.float32),) * 2),
     r"^GRU: hx must be one tensor h_0"),
    (lambda: mica.nn.LSTM(4, 6), lambda m: m(np.zeros((0, 3, 4), np.float32)), r"^LSTM: the sequence is empty"),
    (lambda: mica.nn.LSTM(4, 6), lambda m: m(mica.from_numpy(np.zeros((5, 3, 4)))),
     r"^LSTM: the input is float64 but the parameters are float32"),
    (lambda: mica.nn.GRU(4, 6, dropout=1.5), None, r"^GRU: dropout must be a probability"),
])
def test_mistakes_are_sentences(make, call, says):
    with pytest.raises(mica.MicaError, match=says + r".*\(.*test_rnn.py:\d+\)$"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (initial values, said once)
        m = make()
        call(m)


def test_all_weights_as_torchs():
    """all_weights (and _all_weights, _flat_weights) per layer and direction, as older init code
    loops over them."""
    theirs, mine = torch.nn.LSTM(4, 6, num_layers=2, bidirectional=True), mica.nn.LSTM(4, 6, num_layers=2,
                                                                                       bidirectional=True)
    assert mine._all_weights == theirs._all_weights
    assert [[tuple(w.shape) for w in ws] for ws in mine.all_weights] == \
        [[tuple(w.shape) for w in ws] for ws in theirs.all_weights]
    assert [tuple(w.shape) for w in mine._flat_weights] == [tuple(w.shape) for w in theirs._flat_weights]
