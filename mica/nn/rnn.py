"""torch.nn.RNN, LSTM and GRU (and RNNCell, LSTMCell, GRUCell): torch's parameters (names, shapes,
order, U(+-1/sqrt(hidden_size)) init), arguments (num_layers, bias, batch_first, dropout between
layers, bidirectional, LSTM's proj_size, unbatched inputs, h0 / (h0, c0)) and results.

The recurrence is unrolled when traced (shapes are static, so the sequence length is known): each
layer and direction projects the whole sequence at once (one product, x W_ih^T + b_ih, as torch's
CPU kernel does), then each step adds h W_hh^T + b_hh and applies the cell's gates. The gradient
through time is the unrolled steps' gradient. torch's CPU kernel (oneDNN's where it takes it) sums
its products in another order: values agree to float32 rounding, not bit for bit. Packed
sequences are not supported (a sentence says so).
"""
from .. import amp, verbs as F
from ..errors import MicaError
from ..tensor import user_location
from . import init as initializers
from .modules import Module, Parameter, _device

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _refuse(sentence):
    raise MicaError(sentence, user_location())


def _positive(name, value, what):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        _refuse(f"{name}: {what} must be a positive int, got {value!r}")


def _step(mode, x_part, h, c, w_hh, b_hh, w_hr):
    """One step of a cell: (h', c') from the input's projection x_part (x W_ih^T + b_ih), as torch's
    gates (c' is None but for an LSTM)."""
    hidden = F.linear(h, w_hh, b_hh)
    if mode == "LSTM":
        i, f, g, o = F.chunk(x_part + hidden, 4, -1)
        c = F.sigmoid(f) * c + F.sigmoid(i) * F.tanh(g)
        h = F.sigmoid(o) * F.tanh(c)
        return (F.linear(h, w_hr) if w_hr is not None else h), c
    if mode == "GRU":
        xr, xz, xn = F.chunk(x_part, 3, -1)
        hr, hz, hn = F.chunk(hidden, 3, -1)
        r, z = F.sigmoid(xr + hr), F.sigmoid(xz + hz)
        n = F.tanh(xn + r * hn)
        return (1 - z) * n + z * h, None
    pre = x_part + hidden
    return (F.tanh(pre) if mode == "RNN_TANH" else F.relu(pre)), None


class RNNBase(Module):
    """What RNN, LSTM and GRU share: the parameters per layer and direction, and the unrolled
    forward."""

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__()
        _device(device)
        name = type(self).__name__
        _positive(name, input_size, "input_size")
        _positive(name, hidden_size, "hidden_size")
        _positive(name, num_layers, "num_layers")
        if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout <= 1:
            _refuse(f"{name}: dropout must be a probability in [0, 1], got {dropout!r}")
        if not isinstance(proj_size, int) or isinstance(proj_size, bool) or proj_size < 0:
            _refuse(f"{name}: proj_size must be an int >= 0, got {proj_size!r}")
        if proj_size and mode != "LSTM":
            _refuse(f"{name}: proj_size is only an LSTM's (as torch's); leave it 0")
        if proj_size >= hidden_size:
            _refuse(f"{name}: proj_size ({proj_size}) must be smaller than hidden_size ({hidden_size}), as torch's")
        self.mode, self.input_size, self.hidden_size, self.num_layers = mode, input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.proj_size = bidirectional, proj_size
        gates, out = _GATES[mode] * hidden_size, proj_size or hidden_size
        directions = 2 if bidirectional else 1
        init = initializers.fan_in_uniform(hidden_size)
        self._flat_weights_names = []
        for layer in range(num_layers):
            for direction in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                shapes = [("weight_ih", (gates, input_size if layer == 0 else out * directions)),
                          ("weight_hh", (gates, out))]
                if bias:
                    shapes += [("bias_ih", (gates,)), ("bias_hh", (gates,))]
                if proj_size:
                    shapes.append(("weight_hr", (proj_size, hidden_size)))
                for stem, shape in shapes:
                    setattr(self, stem + suffix, Parameter(shape=shape, dtype=dtype, init=init))
                    self._flat_weights_names.append(stem + suffix)

    def _weights(self, layer, direction):
        suffix = f"_l{layer}" + ("_reverse" if direction else "")
        get = lambda stem: getattr(self, stem + suffix) if hasattr(self, stem + suffix) else None  # noqa: E731
        return get("weight_ih"), get("weight_hh"), get("bias_ih"), get("bias_hh"), get("weight_hr")

    def _state(self, hx, batch, batched, dtype):
        """The initial states [layers * directions, N, size], zeros where not given."""
        name, directions = type(self).__name__, 2 if self.bidirectional else 1
        out = self.proj_size or self.hidden_size
        sizes = [out, self.hidden_size] if self.mode == "LSTM" else [out]
        if hx is None:
            return [F.zeros(self.num_layers * directions, batch, n, dtype=dtype) for n in sizes]
        given = list(hx) if isinstance(hx, (tuple, list)) else [hx]
        if len(given) != len(sizes):
            _refuse(f"{name}: hx must be {'a tuple (h_0, c_0)' if self.mode == 'LSTM' else 'one tensor h_0'}, as "
                    f"torch's, got {type(hx).__name__}")
        states = []
        for label, h, n in zip(("h_0", "c_0"), given, sizes):
            h = F.as_tensor(h)
            want = (self.num_layers * directions, batch, n) if batched else (self.num_layers * directions, n)
            if tuple(h.shape) != want:
                _refuse(f"{name}: {label} must be {list(want)} (num_layers * num_directions, "
                        f"{'batch, ' if batched else ''}size), got {list(h.shape)}")
            states.append(h if batched else F.unsqueeze(h, 1))
        return states

    def forward(self, input, hx=None):
        name = type(self).__name__
        if type(input).__name__ == "PackedSequence":
            _refuse(f"{name}: packed sequences are not supported; pad the batch to one length (and mask the loss)")
        x = F.as_tensor(input)
        if x.ndim not in (2, 3):
            _refuse(f"{name}: input must be [L, N, {self.input_size}] ([N, L, {self.input_size}] with batch_first) or "
                    f"unbatched [L, {self.input_size}], got {list(x.shape)}")
        if x.shape[-1] != self.input_size:
            _refuse(f"{name}: input has {x.shape[-1]} features (its last dim), but input_size is {self.input_size}")
        if x.dtype.kind != "float":
            _refuse(f"{name}: input must be a floating tensor, got {x.dtype.name}; cast it with .float()")
        weight = self._weights(0, 0)[0]
        if x.dtype is not weight.dtype and amp.active() is None:
            _refuse(f"{name}: the input is {x.dtype.name} but the parameters are {weight.dtype.name}; convert one to the "
                    f"other's (input.to({weight.dtype.name}) or the module's .to(...)), as torch asks")
        batched = x.ndim == 3
        if not batched:
            x = F.unsqueeze(x, 1)
        elif self.batch_first:
            x = F.transpose(x, 0, 1)
        L, N = x.shape[0], x.shape[1]
        if L == 0:
            _refuse(f"{name}: the sequence is empty (length 0); give at least one step, as torch asks")
        states = self._state(hx, N, batched, x.dtype)
        directions = 2 if self.bidirectional else 1
        last_h, last_c = [], []
        for layer in range(self.num_layers):
            if layer and self.dropout and self.training:
                x = F.dropout(x, self.dropout)
            outs = []
            for direction in range(directions):
                w_ih, w_hh, b_ih, b_hh, w_hr = self._weights(layer, direction)
                k = layer * directions + direction
                h = states[0][k]
                c = states[1][k] if self.mode == "LSTM" else None
                projected = F.linear(x, w_ih, b_ih)  # [L, N, gates]: the whole sequence's input projection
                steps = range(L - 1, -1, -1) if direction else range(L)
                seq = [None] * L
                for t in steps:
                    h, c = _step(self.mode, projected[t], h, c, w_hh, b_hh, w_hr)
                    seq[t] = h
                outs.append(F.stack(seq, 0))
                last_h.append(h)
                if c is not None:
                    last_c.append(c)
            x = outs[0] if directions == 1 else F.cat(outs, -1)
        if not batched:
            output = F.squeeze(x, 1)
        else:
            output = F.transpose(x, 0, 1) if self.batch_first else x
        h_n = F.stack(last_h, 0)
        h_n = h_n if batched else F.squeeze(h_n, 1)
        if self.mode != "LSTM":
            return output, h_n
        c_n = F.stack(last_c, 0)
        return output, (h_n, c_n if batched else F.squeeze(c_n, 1))

    @property
    def _all_weights(self):
        """The parameters' names per layer and direction, as torch's."""
        per = len(self._flat_weights_names) // (self.num_layers * (2 if self.bidirectional else 1))
        names = self._flat_weights_names
        return [names[k:k + per] for k in range(0, len(names), per)]

    @property
    def all_weights(self):
        """The parameters per layer and direction, as torch's (weight-init code loops over them)."""
        return [[getattr(self, n) for n in names] for names in self._all_weights]

    @property
    def _flat_weights(self):
        return [getattr(self, n) for n in self._flat_weights_names]

    def flatten_parameters(self):
        """torch's cuDNN layout call: nothing to do."""

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s


class RNN(RNNBase):
    """torch.nn.RNN: h_t = tanh (or relu) of x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None, proj_size=0):
        if nonlinearity not in ("tanh", "relu"):
            _refuse(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__("RNN_" + nonlinearity.upper(), input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, device=device, dtype=dtype)
        self.nonlinearity = nonlinearity


class LSTM(RNNBase):
    """torch.nn.LSTM: gates i, f, g, o (in that order in the weights); forward gives output,
    (h_n, c_n)."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device=device, dtype=dtype)


class GRU(RNNBase):
    """torch.nn.GRU: gates r, z, n (in that order in the weights); n reads r * (h W_hn^T + b_hn)."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, device=None, dtype=None, proj_size=0):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device=device, dtype=dtype)


class RNNCellBase(Module):
    """One step: RNNCell, LSTMCell and GRUCell (weight_ih, weight_hh, bias_ih, bias_hh)."""

    mode = None

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None, mode=None):
        super().__init__()
        _device(device)
        self.mode = mode or self.mode
        name = type(self).__name__
        _positive(name, input_size, "input_size")
        _positive(name, hidden_size, "hidden_size")
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        gates = _GATES[self.mode] * hidden_size
        init = initializers.fan_in_uniform(hidden_size)
        self.weight_ih = Parameter(shape=(gates, input_size), dtype=dtype, init=init)
        self.weight_hh = Parameter(shape=(gates, hidden_size), dtype=dtype, init=init)
        self.bias_ih = Parameter(shape=(gates,), dtype=dtype, init=init) if bias else None
        self.bias_hh = Parameter(shape=(gates,), dtype=dtype, init=init) if bias else None

    def forward(self, input, hx=None):
        name = type(self).__name__
        x = F.as_tensor(input)
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
            _refuse(f"{name}: input must be [N, {self.input_size}] or unbatched [{self.input_size}], got "
                    f"{list(x.shape)}")
        batched = x.ndim == 2
        x = x if batched else F.unsqueeze(x, 0)
        N, lstm = x.shape[0], self.mode == "LSTM"
        if hx is None:
            given = [F.zeros(N, self.hidden_size, dtype=x.dtype)] * (2 if lstm else 1)
        else:
            given = list(hx) if isinstance(hx, (tuple, list)) else [hx]
            if len(given) != (2 if lstm else 1):
                _refuse(f"{name}: hx must be {'a tuple (h, c)' if lstm else 'one tensor h'}, as torch's")
            want = (N, self.hidden_size) if batched else (self.hidden_size,)
            for h in given:
                if tuple(F.as_tensor(h).shape) != want:
                    _refuse(f"{name}: the hidden state must be {list(want)}, got {list(F.as_tensor(h).shape)}")
            given = [F.as_tensor(h) if batched else F.unsqueeze(F.as_tensor(h), 0) for h in given]
        h, c = _step(self.mode, F.linear(x, self.weight_ih, self.bias_ih), given[0], given[1] if lstm else None,
                     self.weight_hh, self.bias_hh, None)
        if not batched:
            h, c = F.squeeze(h, 0), (F.squeeze(c, 0) if c is not None else None)
        return (h, c) if lstm else h

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s


class RNNCell(RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            _refuse(f"RNNCell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, bias, device, dtype, mode="RNN_" + nonlinearity.upper())
        self.nonlinearity = nonlinearity


class LSTMCell(RNNCellBase):
    mode = "LSTM"


class GRUCell(RNNCellBase):
    mode = "GRU"
