"""torch.nn.MultiheadAttention and the Transformer built on it (TransformerEncoderLayer,
TransformerEncoder, TransformerDecoderLayer, TransformerDecoder, Transformer), written with Mica's
verbs: the same parameters (names, shapes, state_dict keys), the same arithmetic, as torch's
F.multi_head_attention_forward computes it, compiled or eager."""
import copy
import math

from .. import dtypes, verbs as F
from ..errors import MicaError
from ..tensor import user_location
from . import init as initializers
from .modules import Dropout, LayerNorm, Linear, Module, ModuleList, Parameter, _device


def _refuse(sentence):
    raise MicaError(sentence, user_location())


def _float_mask(mask, name, dtype):
    """torch's _canonical_mask: a bool mask's True is -inf (not attended), a float mask is added as it is."""
    if mask is None:
        return None
    mask = F.as_tensor(mask)
    if mask.dtype is dtypes.bool_:
        return F.where(mask, float("-inf"), 0.0).to(dtype)
    if mask.dtype.kind != "float":
        _refuse(f"MultiheadAttention: {name} must be bool or floating, got {mask.dtype.name}")
    return mask


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention(embed_dim, num_heads, dropout, bias, kdim, vdim, batch_first):
    in_proj_weight [3E, E] (q_proj_weight, k_proj_weight, v_proj_weight when kdim or vdim differ),
    in_proj_bias, out_proj; forward(query, key, value, key_padding_mask, need_weights, attn_mask,
    average_attn_weights, is_causal) returns (output, the heads' attention weights or their mean, or
    None). add_bias_kv and add_zero_attn are a sentence."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        super().__init__()
        _device(device)
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
            _refuse(f"MultiheadAttention: embed_dim ({embed_dim}) must be a positive multiple of num_heads "
                    f"({num_heads})")
        if add_bias_kv or add_zero_attn:
            _refuse("MultiheadAttention: add_bias_kv and add_zero_attn are not supported; leave them False")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.head_dim = embed_dim // num_heads
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        xavier = initializers.Uniform(*(s * math.sqrt(6.0 / (4 * embed_dim)) for s in (-1, 1)))  # (fans E and 3E)
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(shape=(3 * embed_dim, embed_dim), dtype=dtype, init=xavier)
            self.q_proj_weight = self.k_proj_weight = self.v_proj_weight = None
        else:
            self.in_proj_weight = None
            for name, d in (("q_proj_weight", embed_dim), ("k_proj_weight", self.kdim), ("v_proj_weight", self.vdim)):
                bound = math.sqrt(6.0 / (d + embed_dim))
                setattr(self, name, Parameter(shape=(embed_dim, d), dtype=dtype,
                                              init=initializers.Uniform(-bound, bound)))
        self.in_proj_bias = Parameter(shape=(3 * embed_dim,), dtype=dtype, init=initializers.zeros()) if bias else None
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        if bias:
            self.out_proj.bias = Parameter(shape=(embed_dim,), dtype=dtype, init=initializers.zeros())

    def _projections(self, query, key, value, same):
        E, b = self.embed_dim, self.in_proj_bias
        bq, bk, bv = (None,) * 3 if b is None else (b[:E], b[E:2 * E], b[2 * E:])
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            if same:  # (one product for the three, as torch's packed projection)
                return F.linear(query, w, b).chunk(3, dim=-1)
            ws = (w[:E], w[E:2 * E], w[2 * E:])
        else:
            ws = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        return F.linear(query, ws[0], bq), F.linear(key, ws[1], bk), F.linear(value, ws[2], bv)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        same = query is key and key is value
        query, key, value = (F.as_tensor(t) for t in (query, key, value))
        batched = query.ndim == 3
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            _refuse(f"MultiheadAttention: query, key and value must all be 3-d (batched) or all 2-d, got "
                    f"{query.ndim}-d, {key.ndim}-d and {value.ndim}-d")
        if not batched:
            query, key, value = (t.unsqueeze(1) for t in (query, key, value))
            key_padding_mask = None if key_padding_mask is None else F.as_tensor(key_padding_mask).unsqueeze(0)
        elif self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        L, N, E = query.shape
        S, H, hd = key.shape[0], self.num_heads, self.head_dim
        if E != self.embed_dim or key.shape[1] != N or value.shape[:2] != key.shape[:2]:
            _refuse(f"MultiheadAttention: query {list(query.shape)}, key {list(key.shape)} and value "
                    f"{list(value.shape)} (as [length, batch, features]) do not fit embed_dim {self.embed_dim}")
        if is_causal and attn_mask is None:
            _refuse("MultiheadAttention: is_causal is a hint that attn_mask is the causal mask, as torch's; pass "
                    "the mask too (nn.Transformer.generate_square_subsequent_mask)")
        causal = is_causal and key_padding_mask is None and not need_weights
        if causal:
            attn_mask = None
        attn_mask = _float_mask(attn_mask, "attn_mask", query.dtype)
        key_padding_mask = _float_mask(key_padding_mask, "key_padding_mask", query.dtype)
        q, k, v = self._projections(query, key, value, same)
        if attn_mask is not None:
            want = (L, S) if attn_mask.ndim == 2 else (N * H, L, S)
            if tuple(attn_mask.shape) != want:
                _refuse(f"MultiheadAttention: attn_mask is {list(attn_mask.shape)}, not {list(want)} ([L, S] or "
                        "[batch * num_heads, L, S])")
            if attn_mask.ndim == 2:
                attn_mask = attn_mask.unsqueeze(0)
        q, k, v = (t.reshape(t.shape[0], N * H, hd).transpose(0, 1) for t in (q, k, v))  # [N * H, length, hd]
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (N, S):
                _refuse(f"MultiheadAttention: key_padding_mask is {list(key_padding_mask.shape)}, not [{N}, {S}]")
            padding = key_padding_mask.reshape(N, 1, 1, S).expand(N, H, 1, S).reshape(N * H, 1, S)
            attn_mask = padding if attn_mask is None else attn_mask + padding
        p = self.dropout if self.training else 0.0
        if need_weights:
            scores = q * math.sqrt(1.0 / hd)
            scores = (F.baddbmm(attn_mask, scores, k.transpose(-2, -1)) if attn_mask is not None
                      else F.bmm(scores, k.transpose(-2, -1)))
            weights = F.softmax(scores, dim=-1)
            if p > 0.0:
                weights = F.dropout(weights, p)
            out = F.bmm(weights, v).transpose(0, 1).reshape(L * N, E)
            weights = weights.reshape(N, H, L, S)
            if average_attn_weights:
                weights = weights.mean(dim=1)
        else:
            if attn_mask is not None:
                attn_mask = (attn_mask.unsqueeze(0) if attn_mask.shape[0] == 1 else
                             attn_mask.reshape(N, H, -1, S))
            q, k, v = (t.reshape(N, H, t.shape[1], hd) for t in (q, k, v))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask, p, causal)
            out = out.permute(2, 0, 1, 3).reshape(L * N, E)
            weights = None
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias).reshape(L, N, E)
        if not batched:
            out = out.squeeze(1)
            weights = None if weights is None else weights.squeeze(0)
        elif self.batch_first:
            out = out.transpose(0, 1)
        return out, weights


class NonDynamicallyQuantizableLinear(Linear):
    """torch's name for MultiheadAttention's out_proj (a Linear), so the module prints as torch's."""


def _activation(activation, layer):
    if callable(activation):
        return activation
    if activation in ("relu", "gelu"):
        return getattr(F, activation)
    _refuse(f"{layer}: activation must be 'relu', 'gelu' or a function, got {activation!r}")


def _layer_parts(layer, attentions, d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                 norm_first, bias, dtype):
    """The parts of torch's encoder and decoder layers, registered in torch's order (parameters(), and
    so an optimizer's state_dict indices, follow it): a MultiheadAttention per name in `attentions`,
    the feed-forward's two Linears, and a LayerNorm and a Dropout after each sublayer."""
    for name in attentions:
        setattr(layer, name, MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                                dtype=dtype))
    layer.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
    layer.dropout = Dropout(dropout)
    layer.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
    layer.norm_first = norm_first
    for i in range(1, len(attentions) + 2):
        setattr(layer, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
    for i in range(1, len(attentions) + 2):
        setattr(layer, f"dropout{i}", Dropout(dropout))
    layer.activation = _activation(activation, type(layer).__name__)


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: self-attention, then a feed-forward of two Linears, each with
    dropout and a residual, with LayerNorm after each (or before, norm_first=True)."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu", layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, device=None, dtype=None):
        super().__init__()
        _device(device)
        _layer_parts(self, ("self_attn",), d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                     batch_first, norm_first, bias, dtype)

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))


class TransformerEncoder(Module):
    """torch.nn.TransformerEncoder: num_layers copies of encoder_layer (each starting from its weights,
    as torch's deep copies), then an optional norm."""

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True, mask_check=True):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers, self.norm = num_layers, norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        out = src
        for layer in self.layers:
            out = layer(out, src_mask=mask, is_causal=bool(is_causal), src_key_padding_mask=src_key_padding_mask)
        return self.norm(out) if self.norm is not None else out


class TransformerDecoderLayer(Module):
    """torch.nn.TransformerDecoderLayer: self-attention over the target, attention over the encoder's
    output (memory), then a feed-forward of two Linears, each with dropout and a residual, with
    LayerNorm after each (or before, norm_first=True)."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu", layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, device=None, dtype=None):
        super().__init__()
        _device(device)
        _layer_parts(self, ("self_attn", "multihead_attn"), d_model, nhead, dim_feedforward, dropout, activation,
                     layer_norm_eps, batch_first, norm_first, bias, dtype)

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                           need_weights=False)[0]
        return self.dropout1(x)

    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal):
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                is_causal=is_causal, need_weights=False)[0]
        return self.dropout2(x)

    def _ff_block(self, x):
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
        return self.norm3(x + self._ff_block(x))


class TransformerDecoder(Module):
    """torch.nn.TransformerDecoder: num_layers copies of decoder_layer (each starting from its weights,
    as torch's deep copies), each reading the encoder's output, then an optional norm."""

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(decoder_layer) for _ in range(num_layers)])
        self.num_layers, self.norm = num_layers, norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        out = tgt
        for layer in self.layers:  # (tgt_is_causal is a hint: with a mask, the mask decides, the same values)
            out = layer(out, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                        tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                        tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        return self.norm(out) if self.norm is not None else out


class Transformer(Module):
    """torch.nn.Transformer: a TransformerEncoder and a TransformerDecoder of d_model, each with a
    final LayerNorm (or custom_encoder / custom_decoder), every parameter of two or more dims drawn
    by xavier_uniform_ as torch's _reset_parameters; forward(src, tgt, masks...) is the decoder's
    output over the encoder's memory."""

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6, dim_feedforward=2048,
                 dropout=0.1, activation="relu", custom_encoder=None, custom_decoder=None, layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, device=None, dtype=None):
        super().__init__()
        _device(device)
        for name, custom, layer, stack, count in (
                ("encoder", custom_encoder, TransformerEncoderLayer, TransformerEncoder, num_encoder_layers),
                ("decoder", custom_decoder, TransformerDecoderLayer, TransformerDecoder, num_decoder_layers)):
            if custom is None:  # (torch's: count copies of one layer, then a LayerNorm)
                one = layer(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                            norm_first, bias, dtype=dtype)
                custom = stack(one, count, LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
            setattr(self, name, custom)
        for p in self.parameters():
            if len(p.shape) > 1:
                initializers.xavier_uniform_(p)
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        src, tgt = F.as_tensor(src), F.as_tensor(tgt)
        batch = 0 if self.batch_first else 1
        if src.ndim == 3 and (tgt.ndim != 3 or src.shape[batch] != tgt.shape[batch]):
            _refuse(f"Transformer: src and tgt must have the same batch size (dim {batch}), got {tuple(src.shape)} "
                    f"and {tuple(tgt.shape)}")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            _refuse(f"Transformer: src and tgt must have d_model={self.d_model} features (their last dim), got "
                    f"{tuple(src.shape)} and {tuple(tgt.shape)}")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz, device=None, dtype=None):
        """A float [sz, sz] mask: 0 on and below the diagonal, -inf above (the causal mask); outside
        a trace a host tensor, as torch's eager one (`.to(device)`, `.bool()`, `.masked_fill` work)."""
        import numpy as np

        from ..host import eager

        return eager(F.tensor)(np.triu(np.full((sz, sz), -np.inf, np.float32), 1), dtype=dtype)
