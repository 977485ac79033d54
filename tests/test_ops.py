"""The op table: every verb's forward and gradient against PyTorch in float64, on random inputs,
in at least two shapes (broadcast and batched among them), plus the VJP inner-product check
<J v, u> = <v, J^T u> with central finite differences on the oracle.

Each case is written once, as a function of a namespace `m`: run with `m = mica` it traces Mica's
verbs, with `m = torch` (and torch.nn.functional) it runs PyTorch. The same line means the same
thing in both, which is the point.
"""
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import mica
from helpers import rel_err, spec_of, to_torch


class TorchNS:
    """torch.nn.functional first, then torch: one namespace with PyTorch's verbs."""

    def __getattr__(self, name):
        return getattr(TF, name) if hasattr(TF, name) else getattr(torch, name)


T = TorchNS()


class In:
    def __init__(self, shape, kind="float", high=None):
        self.shape, self.kind, self.high = tuple(shape), kind, high

    def draw(self, rng):
        if self.kind == "float":
            return rng.standard_normal(self.shape)
        if self.kind == "pos":
            return rng.uniform(0.5, 2.0, self.shape)
        if self.kind == "int":
            return rng.integers(0, self.high, self.shape).astype(np.int64)
        if self.kind == "bool":
            return rng.random(self.shape) < 0.5
        raise ValueError(self.kind)


def Fl(*s): return In(s)
def Pos(*s): return In(s, "pos")
def Int(*s, high): return In(s, "int", high)
def Bool(*s): return In(s, "bool")


def case(name, fn, inputs, fwd_tol=1e-12, grad_tol=1e-10, grad=True):
    return pytest.param(fn, inputs, fwd_tol, grad_tol, grad, id=name)


CASES = [
    # arithmetic, with broadcasting and Python scalars
    case("add_same", lambda m, a, b: a + b, [Fl(3, 4), Fl(3, 4)]),
    case("add_broadcast", lambda m, a, b: m.add(a, b, alpha=0.5), [Fl(2, 3, 4), Fl(4)]),
    case("add_scalar", lambda m, a: 2.5 + a + 1, [Fl(5)]),
    case("sub_broadcast", lambda m, a, b: a - b, [Fl(3, 1), Fl(1, 4)]),
    case("rsub_scalar", lambda m, a: 1 - a, [Fl(2, 3)]),
    case("mul_broadcast", lambda m, a, b: a * b, [Fl(2, 3, 4), Fl(3, 1)]),
    case("mul_scalar", lambda m, a: a * 3.0, [Fl(4, 2)]),
    case("div_broadcast", lambda m, a, b: a / b, [Fl(2, 3), Pos(3)]),
    case("rdiv_scalar", lambda m, a: 2.0 / a, [Pos(4, 3)]),
    case("pow_scalar_exp", lambda m, a: a ** 3, [Fl(3, 4)]),
    case("pow_fractional", lambda m, a: a ** 1.7, [Pos(2, 5)]),
    case("pow_tensor_tensor", lambda m, a, b: a ** b, [Pos(3, 4), Fl(4)]),
    case("rpow_scalar_base", lambda m, a: 0.9 ** a, [Fl(6)]),
    case("neg", lambda m, a: -a, [Fl(2, 3, 4)]),
    case("square", lambda m, a: a.square(), [Fl(7)]),
    case("maximum", lambda m, a, b: m.maximum(a, b), [Fl(3, 4), Fl(4)]),
    case("minimum", lambda m, a, b: m.minimum(a, b), [Fl(2, 1, 3), Fl(2, 3)]),
    case("clamp", lambda m, a: m.clamp(a, -0.5, 0.7), [Fl(4, 5)]),
    case("clamp_max_only", lambda m, a: a.clamp(max=0.2), [Fl(10)]),
    case("pow_integers", lambda m, a: a ** 3 + (a - 2) ** 5 + a ** 0, [Int(3, 4, high=9)], grad=False),
    case("clamp_integers_by_a_float", lambda m, a: a.clamp(min=0.5, max=2.5), [Int(3, 4, high=4)], grad=False),
    case("lerp_small_weight", lambda m, a, b: m.lerp(a, b, 0.1), [Fl(3, 4), Fl(3, 4)]),
    case("lerp_large_weight", lambda m, a, b: a.lerp(b, 0.95), [Fl(5), Fl(2, 5)]),
    case("addcmul", lambda m, a, b, c: m.addcmul(a, b, c, value=0.3), [Fl(3, 4), Fl(3, 4), Fl(4)]),
    case("addcdiv", lambda m, a, b, c: m.addcdiv(a, b, c, value=-0.2), [Fl(2, 3), Fl(2, 3), Pos(2, 3)]),
    # unary maps
    case("exp", lambda m, a: m.exp(a), [Fl(3, 4)]),
    case("exp_method_batched", lambda m, a: a.exp(), [Fl(2, 3, 4)]),
    case("log", lambda m, a: m.log(a), [Pos(3, 4)]),
    case("log_method", lambda m, a: a.log(), [Pos(2, 2, 5)]),
    case("tanh", lambda m, a: m.tanh(a), [Fl(3, 4)]),
    case("tanh_batched", lambda m, a: a.tanh(), [Fl(2, 3, 2)]),
    case("sqrt", lambda m, a: m.sqrt(a), [Pos(3, 4)]),
    case("sqrt_method", lambda m, a: a.sqrt(), [Pos(6)]),
    case("rsqrt", lambda m, a: m.rsqrt(a), [Pos(3, 4)]),
    case("rsqrt_method", lambda m, a: a.rsqrt() * 2, [Pos(2, 3, 1)]),
    case("sin", lambda m, a: m.sin(a), [Fl(3, 4)]),
    case("sin_method", lambda m, a: a.sin(), [Fl(8)]),
    case("cos", lambda m, a: m.cos(a), [Fl(3, 4)]),
    case("cos_method", lambda m, a: a.cos(), [Fl(2, 4, 2)]),
    case("erf", lambda m, a: m.erf(a), [Fl(3, 4)]),
    case("erf_batched", lambda m, a: a.erf(), [Fl(2, 3, 3)]),
    case("sigmoid", lambda m, a: m.sigmoid(a * 4), [Fl(3, 4)]),
    case("sigmoid_method", lambda m, a: a.sigmoid(), [Fl(5, 2)]),
    case("relu", lambda m, a: m.relu(a), [Fl(3, 4)]),
    case("relu_method", lambda m, a: a.relu(), [Fl(2, 3, 4)]),
    case("relu_square", lambda m, a: a.relu().square(), [Fl(4, 6)]),
    case("abs", lambda m, a: a.abs(), [Fl(3, 5)]),
    case("gelu_exact", lambda m, a: m.gelu(a), [Fl(3, 4)]),
    case("gelu_exact_batched", lambda m, a: m.gelu(a, approximate="none"), [Fl(2, 3, 5)]),
    case("gelu_tanh", lambda m, a: m.gelu(a, approximate="tanh"), [Fl(3, 4)]),
    case("gelu_tanh_batched", lambda m, a: m.gelu(a * 3, approximate="tanh"), [Fl(2, 2, 6)]),
    case("silu", lambda m, a: m.silu(a), [Fl(4, 4)]),
    # products
    case("matmul_2d", lambda m, a, b: a @ b, [Fl(3, 4), Fl(4, 5)]),
    case("matmul_batched_weight", lambda m, a, b: m.matmul(a, b), [Fl(2, 3, 4), Fl(4, 5)]),
    case("matmul_batched_broadcast", lambda m, a, b: a @ b, [Fl(2, 1, 3, 4), Fl(3, 4, 2)]),
    case("matmul_vector_right", lambda m, a, b: a @ b, [Fl(3, 4), Fl(4)]),
    case("matmul_vector_left", lambda m, a, b: a @ b, [Fl(4), Fl(2, 4, 3)]),
    case("matmul_dot", lambda m, a, b: a @ b, [Fl(5), Fl(5)]),
    case("linear_bias", lambda m, x, w, b: m.linear(x, w, b), [Fl(2, 3, 4), Fl(5, 4), Fl(5)]),
    case("linear_nobias", lambda m, x, w: m.linear(x, w), [Fl(6, 4), Fl(3, 4)]),
    case("outer", lambda m, a, b: m.outer(a, b), [Fl(3), Fl(4)]),
    # reductions
    case("sum_all", lambda m, a: a.sum(), [Fl(3, 4)]),
    case("sum_dim_keepdim", lambda m, a: a.sum(1, keepdim=True), [Fl(2, 3, 4)]),
    case("sum_dims", lambda m, a: m.sum(a, dim=(0, 2)), [Fl(2, 3, 4)]),
    case("mean_all", lambda m, a: a.mean(), [Fl(3, 4)]),
    case("mean_dim", lambda m, a: a.mean(-1, keepdim=True), [Fl(2, 3, 4)]),
    case("max_all", lambda m, a: a.max(), [Fl(3, 4)]),
    case("max_dim_values", lambda m, a: a.max(1).values, [Fl(2, 5, 3)]),
    case("max_dim_keepdim", lambda m, a: a.max(dim=-1, keepdim=True)[0] * 2, [Fl(4, 6)]),
    case("max_dim_indices", lambda m, a: a.max(1).indices, [Fl(3, 7)], grad=False),
    case("amax_dims", lambda m, a: m.amax(a, dim=(0, 2)), [Fl(3, 2, 4)]),
    case("min_dim", lambda m, a: a.min(0).values, [Fl(4, 3)]),
    case("argmax", lambda m, a: a.argmax(-1), [Fl(3, 5)], grad=False),
    case("var", lambda m, a: a.var(-1, keepdim=True), [Fl(3, 6)]),
    case("batch_norm_eval", lambda m, x, i, w, b: m.nn.functional.batch_norm(  # (running statistics take no gradient)
        x, i.double() * 0.3 - 0.5, i.double() * 0.25 + 0.5, w, b, False), [Fl(4, 3, 5), Int(3, high=5), Fl(3), Fl(3)],
        1e-12, 1e-9),
    case("batch_norm_train_no_stats", lambda m, x, w, b: m.nn.functional.batch_norm(x, None, None, w, b, True, 0.1, 1e-3),
         [Fl(4, 3, 2, 2), Fl(3), Fl(3)], 1e-12, 1e-9),
    case("var_mean", lambda m, a: m.stack(m.var_mean(a, 1, correction=0)), [Fl(3, 6)]),
    case("std_mean", lambda m, a: m.cat(m.std_mean(a, (0, 2), keepdim=True), 1), [Fl(3, 4, 5)]),
    case("tensor_split_sections", lambda m, a: m.cat([p.flatten() * (i + 1) for i, p in enumerate(m.tensor_split(a, 3, dim=1))]),
         [Fl(2, 7)]),
    case("tensor_split_indices", lambda m, a: m.cat([p.flatten() * (i + 1) for i, p in enumerate(a.tensor_split([1, -2, 2, 9], 1))]),
         [Fl(3, 5)]),
    case("diag_embed", lambda m, a: m.diag_embed(a), [Fl(2, 4)]),
    case("diag_embed_offset_dims", lambda m, a: a.diag_embed(-1, 0, 2), [Fl(2, 3)]),
    case("tensordot_int", lambda m, a, b: m.tensordot(a, b, 2), [Fl(2, 3, 4), Fl(3, 4, 5)]),
    case("tensordot_pairs", lambda m, a, b: m.tensordot(a, b, ([0, 2], [2, 0])), [Fl(4, 3, 2), Fl(2, 5, 4)]),
    case("swapaxes", lambda m, a: a.swapaxes(0, 2) * m.swapdims(a, 2, 0), [Fl(2, 3, 4)]),
    case("adaptive_avg_pool1d", lambda m, a: m.nn.functional.adaptive_avg_pool1d(a, 4), [Fl(2, 3, 10)]),
    case("adaptive_avg_pool2d", lambda m, a: m.nn.functional.adaptive_avg_pool2d(a, (3, None)), [Fl(2, 7, 5)]),
    case("adaptive_avg_pool2d_global", lambda m, a: m.nn.AdaptiveAvgPool2d(1)(a), [Fl(2, 3, 4, 5)]),
    case("adaptive_avg_pool3d", lambda m, a: m.nn.functional.adaptive_avg_pool3d(a, (2, 3, 1)), [Fl(2, 3, 4, 5, 3)]),
    case("interpolate_nearest", lambda m, a: m.nn.functional.interpolate(a, scale_factor=(1.7, 0.6)), [Fl(2, 3, 4, 5)]),
    case("interpolate_nearest_exact", lambda m, a: m.nn.functional.interpolate(a, size=7, mode="nearest-exact"),
         [Fl(2, 3, 5)]),
    case("interpolate_linear_corners", lambda m, a: m.nn.functional.interpolate(a, size=9, mode="linear",
                                                                                 align_corners=True), [Fl(1, 2, 4)]),
    case("interpolate_bilinear", lambda m, a: m.nn.Upsample(scale_factor=1.5, mode="bilinear")(a), [Fl(2, 2, 3, 4)]),
    case("interpolate_trilinear_down", lambda m, a: m.nn.functional.interpolate(a, size=(2, 3, 2), mode="trilinear"),
         [Fl(1, 2, 3, 5, 4)]),
    case("interpolate_bicubic", lambda m, a: m.nn.functional.interpolate(a, scale_factor=2, mode="bicubic"),
         [Fl(1, 2, 3, 4)]),
    case("interpolate_area", lambda m, a: m.nn.functional.interpolate(a, scale_factor=0.5, mode="area"), [Fl(2, 2, 6, 5)]),
    case("norm_fro", lambda m, a: a.norm(), [Fl(3, 4)]),
    case("norm_dims_keepdim", lambda m, a: a.norm(dim=(-2, -1), keepdim=True), [Fl(2, 3, 4)]),
    case("norm_p3_dim", lambda m, a: a.norm(p=3, dim=1), [Fl(3, 4)]),
    case("norm_p0", lambda m, a: a.norm(p=0), [Fl(3, 4)], grad=False),
    # shape
    case("view", lambda m, a: a.view(4, 3) * m.arange(3, dtype=m.float64), [Fl(2, 6)]),
    case("view_infer", lambda m, a: a.view(-1, 2)[:, :1], [Fl(2, 3, 4)]),
    case("reshape", lambda m, a: a.reshape(3, -1).exp(), [Fl(6, 2)]),
    case("transpose", lambda m, a: a.transpose(0, 2) * m.arange(4, dtype=m.float64).view(1, 1, 4), [Fl(4, 3, 2)]),
    case("T", lambda m, a: a.T @ a, [Fl(3, 4)]),
    case("mT", lambda m, a: a.mT.exp() * m.arange(3, dtype=m.float64), [Fl(2, 3, 3)]),
    case("permute_contiguous", lambda m, a: a.permute(2, 0, 1).contiguous().view(4, 6).tanh(), [Fl(2, 3, 4)]),
    case("split_size", lambda m, a: (lambda p: p[0] * 2 + p[1] * p[2][:, :1])(a.split(2, dim=1)), [Fl(3, 5)]),
    case("split_sections", lambda m, a: (lambda p: p[0].sum(-1) + p[1].exp().sum(-1))(a.split([1, 3], dim=-1)),
         [Fl(2, 3, 4)]),
    case("chunk", lambda m, a: (lambda p: p[0] * p[1].sin())(a.chunk(2, dim=-1)), [Fl(3, 6)]),
    case("chunk_dim0", lambda m, a: (lambda p: p[0] - 3 * p[1])(a.chunk(2, 0)), [Fl(4, 3)]),
    case("slice_basic", lambda m, a: a[:, :3] * 2, [Fl(4, 5)]),
    case("slice_step_batched", lambda m, a: a[1:, ::2, 1] + a[:-1, 1::2, 0], [Fl(3, 4, 2)]),
    case("index_none", lambda m, a, b: a[None] * b[:, None], [Fl(3, 4), Fl(3, 4)]),
    case("index_ellipsis", lambda m, a: a[..., -1] + a[0, ...].sum(), [Fl(2, 3, 4)]),
    case("index_list", lambda m, a: a[:, [-1], :].exp(), [Fl(2, 3, 4)]),
    case("unsqueeze_squeeze", lambda m, a: a.unsqueeze(1).squeeze(1) * a.unsqueeze(-1).squeeze(), [Fl(3, 4)]),
    case("flatten", lambda m, a: a.flatten(1) @ m.ones(12, 2, dtype=m.float64), [Fl(2, 3, 4)]),
    case("expand", lambda m, a: a.expand(2, 3, 4) * m.arange(4, dtype=m.float64), [Fl(3, 1)]),
    case("repeat", lambda m, a: a.repeat(2, 3).sin(), [Fl(2, 3)]),
    case("cat", lambda m, a, b: m.cat([a, b.exp()], dim=1), [Fl(2, 3), Fl(2, 4)]),
    case("cat_batched", lambda m, a, b: m.cat((a, b), -1), [Fl(2, 2, 3), Fl(2, 2, 1)]),
    case("stack", lambda m, a, b: m.stack([a, b * 2], dim=0), [Fl(3, 4), Fl(3, 4)]),
    case("stack_last", lambda m, a, b: m.stack([a, b], -1).sum(0), [Fl(2, 3), Fl(2, 3)]),
    case("tril", lambda m, a: m.tril(a), [Fl(4, 4)]),
    case("triu_batched", lambda m, a: m.triu(a, 1), [Fl(2, 3, 5)]),
    # selection
    case("where", lambda m, c, a, b: m.where(c, a, b), [Bool(3, 4), Fl(3, 4), Fl(4)]),
    case("where_scalar", lambda m, c, a: m.where(c, a, 0.0), [Bool(2, 3), Fl(2, 3)]),
    case("where_compare", lambda m, a, b: m.where(a > b, a, b * 2), [Fl(3, 4), Fl(3, 4)]),
    case("masked_fill", lambda m, a, c: a.masked_fill(c, -1.5), [Fl(3, 4), Bool(4)]),
    case("masked_fill_fn", lambda m, a, c: m.masked_fill(a, c, 0.0), [Fl(2, 3, 4), Bool(2, 3, 4)]),
    case("compare_ops", lambda m, a, b: ((a < b) | (a >= 0.5)).float() + (a != b).double(), [Fl(3, 4), Fl(4)],
         grad=False),
    # picking by index tensors and by order (verbs/positions.py)
    case("gather", lambda m, a, i: m.gather(a, 1, i), [Fl(3, 5), Int(3, 4, high=5)]),
    case("gather_dim0_smaller", lambda m, a, i: a.gather(0, i), [Fl(4, 3), Int(2, 2, high=4)]),
    case("take_along_dim_negative", lambda m, a, i: m.take_along_dim(a, i - 2, 1), [Fl(3, 5), Int(3, 4, high=5)]),
    case("index_select", lambda m, a, i: a.index_select(0, i), [Fl(4, 3), Int(6, high=4)]),
    case("index_select_dim1_batched", lambda m, a, i: m.index_select(a, 1, i), [Fl(2, 4, 3), Int(5, high=4)]),
    case("tensor_index", lambda m, a, i: a[i], [Fl(4, 3), Int(2, 3, high=4)]),
    case("tensor_index_pair_apart", lambda m, a, i, j: a[i, :, j], [Fl(4, 2, 3), Int(5, high=4), Int(5, high=3)]),
    case("tensor_index_negative_after_int", lambda m, a, i: a[1, :, i - 2] + a[:, 0][:, i[0]].sum(),
         [Fl(3, 2, 4), Int(2, 2, high=4)]),
    case("topk", lambda m, a: (lambda r: r.values * 2 + r.indices)(m.topk(a, 3)), [Fl(4, 6)]),
    case("topk_smallest_dim0", lambda m, a: (lambda v, i: v + i)(*a.topk(2, dim=0, largest=False)), [Fl(5, 3)]),
    case("sort_descending", lambda m, a: (lambda r: r.values + r.indices * 0.5)(m.sort(a, dim=1, descending=True)),
         [Fl(3, 5)]),
    case("argsort_dim0", lambda m, a: m.argsort(a, dim=0), [Fl(5, 3)], grad=False),
    case("cumsum_cumprod", lambda m, a: m.cumsum(a, 1) + a.cumprod(0), [Fl(3, 7)]),
    case("cumsum_integers", lambda m, a: a.cumsum(0) + m.cumsum(a > 2, 1), [Int(6, 2, high=5)], grad=False),
    case("flip_roll", lambda m, a: m.flip(a, (0, 2)) + m.roll(a, (1, -2), (1, 2)) * 2 + a.roll(3), [Fl(2, 3, 4)]),
    case("one_hot", lambda m, i: m.nn.functional.one_hot(i, 6), [Int(2, 3, high=6)], grad=False),
    case("prod", lambda m, a: a.prod(1) + a[0].prod(), [Fl(3, 5)]),
    case("bitwise_integers", lambda m, a, b: (a & b) + (a | (b - 3)) * 10 + (a ^ b) * 100 + (~(a - 4)) * 1000 + (a & 6)
         + (True & (a > 2)).long() + (b.int() ^ 5), [Int(3, 4, high=9), Int(3, 4, high=5)], grad=False),
    case("any_all", lambda m, a: (a > 0.5).any(1).double() + (a > -2).all(0).double().sum() + m.any(a > 3).double(),
         [Fl(3, 4)], grad=False),
    case("index_add_repeats", lambda m, a, b, i: a.index_add(0, i, b, alpha=2), [Fl(4, 5), Fl(3, 5), Int(3, high=4)]),
    case("index_copy_fill", lambda m, a, b: a.index_copy(0, m.tensor([3, 0, 1]), b).index_fill(1, m.tensor([4, 1]), -2.0),
         [Fl(4, 5), Fl(3, 5)]),
    case("scatter_add", lambda m, a, b, i: a.scatter_add(1, i, b), [Fl(4, 5), Fl(4, 3), Int(4, 3, high=5)]),
    case("scatter_permutation_and_value", lambda m, a, b, r: a.scatter(1, m.argsort(r, dim=1)[:, :3], b)
         .scatter(0, m.argsort(r, dim=0)[:2], 1.5), [Fl(4, 5), Fl(4, 3), Fl(4, 5)]),
    case("median_unfold", lambda m, a: a.median(1).values + a.unfold(1, 3, 2).sum(-1).sum(-1) + a.median(), [Fl(3, 7)]),
    case("setitem_tensor_index", lambda m, a, b, i: _written(m, a, b, i), [Fl(4, 5), Fl(3, 5), Int(3, high=4)]),
    # roundings, remainders, tests of values
    case("floor_ceil_trunc_round_frac", lambda m, a: m.floor(a * 3) + m.ceil(a * 2) * 2 + m.trunc(a * 5) * 3
         + m.round(a * 4) * 4 + a.frac() + m.round(a, decimals=2), [Fl(3, 4)]),
    case("fmod_remainder", lambda m, a, b: m.fmod(a * 5, b) + m.remainder(a * 5, -b) * 2 + (a * 3) % b, [Fl(3, 4), Pos(4)]),
    case("div_rounding_modes", lambda m, a, b: m.div(a * 5, b, rounding_mode="floor")
         + m.div(a * 5, b, rounding_mode="trunc") * 2 + a, [Fl(3, 4), Pos(3, 4)]),
    case("floor_divide_floats", lambda m, a, b: (a * 7) // b + m.floor_divide(a, -b), [Fl(3, 4), Pos(4)], grad=False),
    case("integer_division", lambda m, a, b: (a - 4) // (b + 1) * 100 + (a - 4) % (b + 1) * 10
         + m.div(a - 4, -(b + 1), rounding_mode="trunc") + m.fmod(a - 4, b + 1) * 1000,
         [Int(3, 4, high=9), Int(3, 4, high=4)], grad=False),
    case("sign_and_tests", lambda m, a: m.sign(a) * a + m.isnan(a).double() + m.isfinite(a).double()
         + m.isclose(a, a * (1 + 1e-9)).double() + m.log1p(a * a) + m.expm1(a * 0.3), [Fl(3, 4)]),
    # other activations and losses of torch.nn.functional (verbs/activations.py)
    case("softplus_logsigmoid", lambda m, a: m.nn.functional.softplus(a * 4) + m.nn.functional.logsigmoid(a * 8)
         + m.nn.functional.softplus(a, beta=2, threshold=3), [Fl(3, 5)]),
    case("leaky_elu_hardtanh", lambda m, a: m.nn.functional.leaky_relu(a, 0.2) + m.nn.functional.elu(a, 0.7)
         + m.nn.functional.hardtanh(a, -0.5, 0.8) + m.nn.functional.relu6(a * 5) + m.nn.functional.softsign(a),
         [Fl(4, 5)]),
    case("glu_normalize_cosine", lambda m, a, b: m.nn.functional.glu(a).sum(1) + m.nn.functional.normalize(a, dim=1).sum(1)
         + m.nn.functional.cosine_similarity(a, b), [Fl(3, 6), Fl(3, 6)]),
    case("regression_losses", lambda m, a, b: m.nn.functional.mse_loss(a, b) + m.nn.functional.l1_loss(a, b, reduction="sum")
         + m.nn.functional.smooth_l1_loss(a, b, beta=0.5) + m.nn.functional.huber_loss(a, b, delta=0.7), [Fl(3, 4), Fl(3, 4)]),
    case("binary_cross_entropies", lambda m, a, b: m.nn.functional.binary_cross_entropy(m.sigmoid(a), m.sigmoid(b))
         + m.nn.functional.binary_cross_entropy_with_logits(a * 3, m.sigmoid(b), reduction="sum"), [Fl(3, 4), Fl(3, 4)]),
    case("kl_div", lambda m, a, b: m.nn.functional.kl_div(m.log_softmax(a, 1), m.softmax(b, 1), reduction="batchmean")
         + m.nn.functional.kl_div(a, b, reduction="sum", log_target=True), [Fl(3, 4), Fl(3, 4)]),
    # casts, constants, ranges
    case("float_double", lambda m, a: a.float().double() * 2, [Fl(3, 4)], fwd_tol=1e-6, grad_tol=1e-6),
    case("to_type_as", lambda m, a, b: a.to(m.float32).type_as(b) + b, [Fl(3), Fl(3)], fwd_tol=1e-6, grad_tol=1e-6),
    case("bfloat16_roundtrip", lambda m, a: a.bfloat16().to(m.float64) * 3, [Fl(4, 2)], fwd_tol=1e-2, grad_tol=1e-2),
    case("zeros_ones_full", lambda m, a: a + m.ones(3, 4, dtype=m.float64) - m.zeros(4, dtype=m.float64)
         + m.full((3, 4), 2.5, dtype=m.float64), [Fl(3, 4)]),
    case("arange_float", lambda m, a: a * m.arange(0.5, 3.0, 0.5, dtype=m.float64), [Fl(2, 5)]),
    case("arange_long", lambda m, a: a + m.arange(4).double(), [Fl(3, 4)]),
    # row-wise verbs of torch.nn.functional
    case("softmax_last", lambda m, a: m.softmax(a, -1), [Fl(3, 5)]),
    case("softmax_dim1_batched", lambda m, a: m.softmax(a * 3, dim=1), [Fl(2, 4, 3)]),
    case("log_softmax", lambda m, a: m.log_softmax(a, -1), [Fl(4, 6)]),
    case("log_softmax_dim0", lambda m, a: a.log_softmax(0), [Fl(5, 3)]),
    case("layer_norm_affine", lambda m, x, w, b: m.layer_norm(x, (6,), w, b), [Fl(2, 3, 6), Fl(6), Fl(6)]),
    case("layer_norm_plain", lambda m, x: m.layer_norm(x, [6], eps=1e-3), [Fl(4, 6)]),
    case("layer_norm_weight_only", lambda m, x, w: m.layer_norm(x, (5,), w), [Fl(3, 5), Fl(5)]),
    case("layer_norm_2d_shape", lambda m, x, w, b: m.layer_norm(x, (3, 4), w, b), [Fl(2, 3, 4), Fl(3, 4), Fl(3, 4)]),
    case("rms_norm_weight", lambda m, x, w: m.rms_norm(x, (6,), w), [Fl(2, 3, 6), Fl(6)]),
    case("rms_norm_plain_eps_none", lambda m, x: m.rms_norm(x, (x.size(-1),)), [Fl(5, 4)]),
    case("rms_norm_eps", lambda m, x, w: m.rms_norm(x, [3, 4], w, eps=1e-2), [Fl(2, 3, 4), Fl(3, 4)]),
    case("embedding", lambda m, i, w: m.embedding(i, w), [Int(2, 5, high=7), Fl(7, 3)]),
    case("embedding_repeat_idx", lambda m, i, w: m.embedding(i, w).sum(0), [Int(12, high=3), Fl(3, 4)]),
    case("cross_entropy_mean", lambda m, x, t: m.cross_entropy(x, t), [Fl(6, 5), Int(6, high=5)]),
    case("cross_entropy_sum", lambda m, x, t: m.cross_entropy(x * 2, t, reduction="sum"), [Fl(4, 7), Int(4, high=7)]),
    case("cross_entropy_none_3d", lambda m, x, t: m.cross_entropy(x, t, reduction="none"),
         [Fl(2, 4, 3), Int(2, 3, high=4)]),
    case("cross_entropy_ignore", lambda m, x, t: m.cross_entropy(x, t - 1, ignore_index=-1), [Fl(8, 4), Int(8, high=5)]),
    case("cross_entropy_1d", lambda m, x, t: m.cross_entropy(x, t[0]), [Fl(5), Int(1, high=5)]),
    case("cross_entropy_label_smoothing", lambda m, x, t: m.cross_entropy(x, t, label_smoothing=0.1),
         [Fl(6, 5), Int(6, high=5)]),
    case("cross_entropy_label_smoothing_3d_ignore_sum",
         lambda m, x, t: m.cross_entropy(x, t - 1, ignore_index=-1, reduction="sum", label_smoothing=0.3),
         [Fl(2, 4, 3), Int(2, 3, high=5)]),
    case("cross_entropy_probabilities", lambda m, x, p: m.cross_entropy(x, m.softmax(p, 1), label_smoothing=0.1),
         [Fl(4, 5), Fl(4, 5)]),
    case("cross_entropy_probabilities_3d_none", lambda m, x, p: m.cross_entropy(x, m.softmax(p * 2, 1), reduction="none"),
         [Fl(2, 3, 4), Fl(2, 3, 4)]),
    case("cross_entropy_probabilities_1d_sum", lambda m, x, p: m.cross_entropy(x, m.softmax(p, 0), reduction="sum"),
         [Fl(5), Fl(5)]),
    case("nll_loss_mean", lambda m, x, t: m.nll_loss(m.log_softmax(x, 1), t), [Fl(6, 5), Int(6, high=5)]),
    case("nll_loss_3d_none", lambda m, x, t: m.nll_loss(x, t, reduction="none"), [Fl(2, 4, 3), Int(2, 3, high=4)]),
    case("nll_loss_ignore_sum", lambda m, x, t: m.nll_loss(x, t - 1, ignore_index=-1, reduction="sum"),
         [Fl(8, 4), Int(8, high=5)]),
    case("nll_loss_ignore_mean", lambda m, x, t: m.nll_loss(x, t - 1, ignore_index=-1), [Fl(8, 4), Int(8, high=5)]),
    case("nll_loss_1d", lambda m, x, t: m.nll_loss(x, t[0]), [Fl(5), Int(1, high=5)]),
    case("sdpa", lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v), [Fl(2, 4, 3), Fl(2, 5, 3), Fl(2, 5, 2)]),
    case("sdpa_causal_heads", lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v, is_causal=True),
         [Fl(2, 3, 5, 4), Fl(2, 3, 5, 4), Fl(2, 3, 5, 4)]),
    case("sdpa_causal_scale_rect", lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.12),
         [Fl(1, 2, 4, 8), Fl(1, 2, 6, 8), Fl(1, 2, 6, 3)]),
    case("sdpa_broadcast_batch", lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v),
         [Fl(2, 3, 4, 2), Fl(1, 3, 5, 2), Fl(3, 5, 2)]),
    case("sdpa_bool_mask", lambda m, q, k, v, c: m.scaled_dot_product_attention(q, k, v, attn_mask=c | m.eye(4, 5, dtype=m.bool)),
         [Fl(2, 4, 3), Fl(2, 5, 3), Fl(2, 5, 3), Bool(4, 5)]),
    case("sdpa_float_mask", lambda m, q, k, v, b: m.scaled_dot_product_attention(q, k, v, attn_mask=b),
         [Fl(3, 4), Fl(5, 4), Fl(5, 2), Fl(3, 5)]),
    # both a mask and is_causal: torch 2.13's CPU kernel applies the mask, then the top-left causal one
    case("sdpa_gqa_causal", lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
         [Fl(1, 6, 4, 3), Fl(1, 2, 5, 3), Fl(1, 2, 5, 2)]),
    case("sdpa_gqa_3d", lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v, enable_gqa=True),
         [Fl(6, 4, 3), Fl(3, 4, 3), Fl(1, 4, 3)]),
    # (4-d, one batch and head count, E == Ev, no dropout: where torch's CPU kernel takes both)
    case("sdpa_bool_mask_causal", lambda m, q, k, v, c: m.scaled_dot_product_attention(
        q, k, v, attn_mask=c | m.eye(4, 5, dtype=m.bool), is_causal=True),
         [Fl(2, 2, 4, 3), Fl(2, 2, 5, 3), Fl(2, 2, 5, 3), Bool(2, 1, 4, 5)]),
    case("sdpa_float_mask_causal", lambda m, q, k, v, c: m.scaled_dot_product_attention(
        q, k, v, attn_mask=((c.float() - 1) * 3.0).to(q.dtype), is_causal=True), [Fl(1, 2, 4, 3), Fl(1, 2, 6, 3), Fl(1, 2, 6, 3), Bool(4, 6)]),
]


def _written(m, a, b, i):
    """x[t] = v and x[t] += v with integer Tensors (torch's index_put_), distinct rows and columns."""
    x = a * 1.0
    rows = m.argsort(i.double() * 0 + m.arange(3, dtype=m.float64) * -1.0)  # ([2, 1, 0])
    x[rows] = b
    x[:, i] = -1.0  # (a repeated index: the same value)
    x[rows[:2], rows[1:] + 2] += b[0, :2]
    return x


def _run_torch(fn, arrays, cot_seed):
    targs = [to_torch(a, requires_grad=True) for a in arrays]
    out = fn(T, *targs)
    return targs, out


@pytest.mark.parametrize("fn,inputs,fwd_tol,grad_tol,grad", CASES)
def test_op(request, fn, inputs, fwd_tol, grad_tol, grad):
    rng = np.random.default_rng(zlib.crc32(request.node.callspec.id.encode()))
    arrays = [i.draw(rng) for i in inputs]
    specs = [spec_of(a) for a in arrays]
    targs, tout = _run_torch(fn, arrays, 0)
    expected = tout.detach().numpy()
    floats = [k for k, a in enumerate(arrays) if a.dtype.kind == "f"]
    differentiable = grad and floats and tout.is_floating_point()

    # forward, on the float64 oracle
    forward = mica.trace(lambda *xs: fn(mica, *xs), *specs)
    got = mica.reference.run(forward, *arrays)
    assert got.shape == expected.shape
    if expected.dtype.kind == "f":
        assert rel_err(got, expected) <= fwd_tol
    else:
        np.testing.assert_array_equal(got, expected)
    if not differentiable:
        return

    # gradient, against torch.autograd with the same cotangent u
    u = np.asarray(rng.standard_normal(expected.shape))
    tgrads = torch.autograd.grad(tout, [targs[k] for k in floats], to_torch(u), allow_unused=True)

    def with_grads(*xs):
        *args, cot = xs
        out = fn(mica, *args)
        return out, mica.grad(out, [args[k] for k in floats], grad_output=cot)

    program = mica.trace(with_grads, *specs, spec_of(u))
    _, grads = mica.reference.run(program, *arrays, u)
    for k, g, tg in zip(floats, grads, tgrads):
        want = np.zeros_like(arrays[k]) if tg is None else tg.numpy()
        assert rel_err(g, want) <= grad_tol, f"gradient of input {k}"

    # VJP inner product: <J v, u> (central differences on the oracle) = <v, J^T u> (mica.grad)
    vs = {k: rng.standard_normal(arrays[k].shape) for k in floats}
    h = 1e-6

    def shifted(s):
        args = [a + s * vs[k] if k in vs else a for k, a in enumerate(arrays)]
        return mica.reference.run(forward, *args)

    jv = (shifted(h) - shifted(-h)) / (2 * h)
    lhs = float(np.sum(jv * u))
    rhs = float(sum(np.sum(g * vs[k]) for k, g in zip(floats, grads)))
    scale = max(abs(lhs), abs(rhs), float(np.linalg.norm(jv.ravel()) * np.linalg.norm(u.ravel())) * 1e-3, 1e-12)
    assert abs(lhs - rhs) <= 1e-6 * scale, (lhs, rhs)


def _corner_pairs():
    """Values at the corners where a derivative needs torch's convention (no finite differences
    there): a zero vector's norm, x ** 0 at x = 0, ties in max(dim)/min(dim), a 0-d literal."""
    ties = np.array([[3.0, 1.0, 3.0], [2.0, 5.0, 5.0], [-1.0, -1.0, -1.0]])
    zero_row = np.array([[1.0, -2.0, 3.0], [0.0, 0.0, 0.0]])
    with_zero = np.array([1.5, 0.0, -2.0])
    return [
        ("norm_of_a_zero_row", lambda m, a: a.norm(dim=-1), [zero_row]),
        ("norm_p3_of_a_zero_row", lambda m, a: a.norm(p=3, dim=1), [zero_row]),
        ("norm_of_zero_and_the_rest", lambda m, a: a.norm() + a[1].norm(), [zero_row]),
        ("pow_zero_at_zero", lambda m, a: m.pow(a, 0.0) * 3 + a ** 0, [with_zero]),
        ("pow_tensor_exponent_zero_at_zero", lambda m, a, e: m.pow(a, e), [abs(with_zero), np.array([0.0, 0.0, 2.0])]),
        ("max_dim_ties", lambda m, a: a.max(dim=1).values * 2 + a.min(1)[0], [ties]),
        ("max_dim_ties_keepdim", lambda m, a: a.max(dim=0, keepdim=True).values, [ties]),
        ("literal_0d", lambda m, a: m.tensor(2.5, dtype=a.dtype) * a + m.tensor(3.0, dtype=a.dtype), [with_zero[0]]),
    ]


@pytest.mark.parametrize("name,fn,arrays", _corner_pairs(), ids=[c[0] for c in _corner_pairs()])
def test_corners_take_torchs_values_and_gradients(name, fn, arrays):
    """The oracle and the compiled program give torch's values and gradients (the gradient goes to
    the index max(dim) returns; 0 for a zero vector's norm and for x ** 0), never NaN."""
    targs = [to_torch(np.asarray(a), requires_grad=True) for a in arrays]
    tout = fn(T, *targs)
    u = np.random.default_rng(0).standard_normal(tuple(tout.shape))
    want = [g.numpy() for g in torch.autograd.grad(tout, targs, to_torch(u))]

    def with_grads(*xs):
        *args, cot = xs
        out = fn(mica, *args)
        return out, mica.grad(out, list(args), grad_output=cot)

    specs = [spec_of(np.asarray(a)) for a in arrays] + [spec_of(u)]
    program = mica.trace(with_grads, *specs)
    for got_out, grads in (mica.reference.run(program, *arrays, u),
                           program.lower("cpu").build()(*arrays, u)):
        assert np.asarray(got_out).shape == tuple(tout.shape)
        assert rel_err(got_out, tout.detach().numpy()) <= 1e-12
        for g, w in zip(grads, want):
            assert np.isfinite(g).all() and rel_err(g, w) <= 1e-12, (g, w)


def test_masks_keep_bool_and_bitwise_verbs_are_logical_on_bools_only():
    """tril/triu keep their input's dtype (a bool mask stays bool: as int64 it was added to the scores),
    ~ & | ^ on bools are torch's logical results (on integers bit by bit: the op table), and what
    torch refuses (bits of floats), an integer attn_mask and an integer masked_fill mask are
    sentences at the user's line."""
    n = 5
    x = np.random.default_rng(3).standard_normal((1, 2, n, 8)).astype(np.float32)

    def masks(m, q):
        causal = m.ones(n, n, dtype=m.bool).tril()
        above = m.ones(n, n, dtype=m.bool).triu(1)
        s = q[0, 0, :, :n]
        pos, big = s > 0, s > 0.5
        return (m.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=causal),
                s.masked_fill(above, float("-inf")).softmax(-1),
                pos & ~above, pos | big, pos ^ big, True & big, m.ones(n, n, dtype=m.int64).tril(-1))

    want = masks(torch, torch.tensor(x))
    program = mica.trace(lambda q: masks(mica, q), mica.f32[1, 2, n, 8])
    for got in (mica.reference.run(program, x), program.lower("cpu").build()(x)):
        for g, w in zip(got, want):
            assert str(np.asarray(g).dtype) == str(w.dtype).split(".")[1] or w.dtype.is_floating_point
            assert rel_err(np.asarray(g).astype(np.float64), w.numpy().astype(np.float64)) <= 1e-6
    for bad, says in ((lambda q: ~q, r"^bitwise_not \(~\) works on integer and bool tensors, got float32"),
                      (lambda q: q.long() & 3.5, r"^bitwise_and \(&\) works on integer and bool tensors, got float32"),
                      (lambda q: mica.scaled_dot_product_attention(q, q, q, attn_mask=mica.ones(n, n, dtype=mica.int64)),
                       r"^scaled_dot_product_attention: attn_mask must be bool .* got int64"),
                      (lambda q: q.masked_fill(q.long(), 0.0), r"^masked_fill: the mask must be a bool tensor, got int64"),
                      (lambda q: mica.scaled_dot_product_attention(q, q, q, attn_mask=q > 0, is_causal=True),  # (torch's
                       r"^scaled_dot_product_attention: attn_mask with is_causal=True is taken, as torch's CPU kernel"),  # math path refuses)
                      (lambda q: mica.scaled_dot_product_attention(q[None].expand(3, n, n), q[None].expand(2, n, n), q[None],
                                                                   enable_gqa=True),
                       r"^scaled_dot_product_attention: enable_gqa: the 2 key and 1 value heads must each divide the 3")):
        with pytest.raises(mica.MicaError, match=says + r".*\(.*test_ops.py:\d+\)$"):
            mica.trace(bad, mica.f32[n, n])


def test_shifts_and_integer_powers_take_torchs_values_and_types():
    """<< and >> (bitwise_left_shift/right_shift) are torch's on int64 and int32, by a number or a
    tensor of counts, counts out of range included (0 to the left, the sign to the right; a traced
    shift was a Python TypeError); an integer tensor ** 2.0 is a float, as torch's (it was int64)."""
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.integers(-2**62, 2**62, 12), [5, -5, -1, 0, 2**63 - 1, -2**63]]).astype(np.int64)
    counts = np.array([0, 1, 2, 31, 32, 33, 62, 63, 64, 65, -1, -64, 7, 13, 40, 3, 1, 63], dtype=np.int64)
    x32, counts32 = (x >> 20).astype(np.int32), np.clip(counts, -40, 40).astype(np.int32)

    def shifts(m, v, s, v32, s32):
        out = [v << s, v >> s, 3 << s, -3 >> s, v32 << s32, v32 >> s32, m.bitwise_left_shift(v, 5),
               v.bitwise_right_shift(9), (v < 0) << 2]
        for n in (0, 1, 31, 62, 63, 64, -1):
            out += [v << n, v >> n, v32 << n, v32 >> n]
        return tuple(out)

    want = shifts(torch, *(torch.tensor(a) for a in (x, counts, x32, counts32)))
    got = mica.compile(lambda *a: shifts(mica, *a))(x, counts, x32, counts32)
    for g, w in zip(got, want):
        assert np.asarray(g).dtype == w.numpy().dtype and np.array_equal(np.asarray(g), w.numpy())
    with pytest.raises(mica.MicaError, match=r"^bitwise_left_shift \(<<\) works on integer tensors, got float32.*"
                                             r"\(.*test_ops.py:\d+\)$"):
        mica.trace(lambda q: q << 1, mica.f32[3])

    ints = rng.integers(-6, 7, 9)
    for e in (2.0, 2, 3, 3.0, 0.5, 1.0):
        w = torch.tensor(ints) ** e
        g = np.asarray(mica.compile(lambda v: v ** e)(ints))
        assert g.dtype == w.numpy().dtype, (e, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, equal_nan=True)
    assert abs(float(mica.compile(lambda v: (v ** 2.0).mean())(ints)) - float((torch.tensor(ints) ** 2.0).mean())) < 1e-5


def test_integer_division_is_exact_for_every_int64():
    """// % fmod and trunc division of int64 beyond 2**53, where float64 rounds the dividend: the
    quotient through float64 was off by up to |a| / 2**52 (a // 1 gave a - 39), silently."""
    rng = np.random.default_rng(12)
    a = np.concatenate([rng.integers(-2**63, 2**63 - 1, 600, dtype=np.int64), [2**63 - 1, -2**63 + 1, 2**53 + 1]])
    b = np.concatenate([rng.integers(-2**63, 2**63 - 1, 150, dtype=np.int64), rng.integers(-40, 40, 150),
                        rng.integers(-2**40, 2**40, 150), rng.integers(-2**60, 2**60, 150), [1, -1, 3]])
    b[b == 0] = 7
    got = mica.compile(lambda x, y: (x // y, x % y, mica.div(x, y, rounding_mode="trunc"), mica.fmod(x, y)))(a, b)
    ta, tb = torch.tensor(a), torch.tensor(b)
    for g, w in zip(got, (ta // tb, ta % tb, torch.div(ta, tb, rounding_mode="trunc"), torch.fmod(ta, tb))):
        assert np.array_equal(np.asarray(g), w.numpy())

    # the type's least value as a divisor (its magnitude wrapped: 0 // -2**63 was -1), in the oracle too
    least = np.array([0, -2**63, -2**63, 2**63 - 1, -5, -2**63 + 1, 7], dtype=np.int64)
    divisor = np.array([-2**63, -2**63, 7, -2**63, -2**63, -2**63, -2], dtype=np.int64)
    f = lambda x, y: (x // y, x % y, mica.div(x, y, rounding_mode="trunc"), mica.fmod(x, y))  # noqa: E731
    ta, tb = torch.tensor(least), torch.tensor(divisor)
    want = (ta // tb, ta % tb, torch.div(ta, tb, rounding_mode="trunc"), torch.fmod(ta, tb))
    program = mica.trace(f, mica.i64[7], mica.i64[7])
    for got in (mica.compile(f)(least, divisor), mica.reference.run(program, least, divisor)):
        for g, w in zip(got, want):
            assert np.array_equal(np.asarray(g), w.numpy()), (g, w)


def test_integer_arithmetic_wraps_as_torchs_where_the_compiler_sees_constants():
    """int64 and int32 +, -, *, negation, abs and sums wrap on overflow as torch's: the C the
    target emits did them in the signed type, whose overflow is undefined, so gcc folded a constant
    operand on that premise (INT64_MAX << 1 was INT64_MAX, INT64_MAX // 2 one too large)."""
    big, small = 2**63 - 1, -2**63
    y = np.array([0, 1, 2, 31, 62, 63], dtype=np.int64)

    def cases(lib, v):
        return (big << v, lib.full_like(v, big) << v, big >> v, big // (v + 1), small >> v, (v - big) * 3,
                -(v + small), (v + small).abs(), (v + big).sum(), (v * big).cumsum(0), (v + big).prod())

    got, want = mica.compile(lambda v: cases(mica, v))(y), cases(torch, torch.tensor(y))
    for g, w in zip(got, want):
        assert np.array_equal(np.asarray(g), w.numpy()), (g, w)
    y32 = y[:5].astype(np.int32)
    for g, w in zip(mica.compile(lambda v: (v.min(0).values, v.max(0)[0]))(y32),
                    (torch.tensor(y32).min(0).values, torch.tensor(y32).max(0)[0])):  # (int32 values stay int32)
        assert np.asarray(g).dtype == np.int32 and int(g) == int(w)
    got = mica.compile(lambda v: (2147483647 << v, (v - 2147483647) * 5, -(v - 2147483647 - 1)))(y32)
    t = torch.tensor(y32)
    for g, w in zip(got, (2147483647 << t, (t - 2147483647) * 5, -(t - 2147483647 - 1))):
        assert np.array_equal(np.asarray(g), w.numpy()), (g, w)


def test_nll_loss_takes_torchs_arguments_and_refuses_what_torch_refuses():
    """Targets of the wrong shape are a sentence at the user's line (torch raises too), as are class
    weights; a target out of range stops the program with a sentence, as torch raises (it was a NaN
    loss), on the CPU, the CUDA simulator and the oracle; -inf log-probabilities of other classes
    stay out of the sum; a 0-d literal is a 0-d target."""
    with pytest.raises(mica.MicaError, match=r"^nll_loss: input f32\[4, 3\] needs targets of shape \[4\], got "
                                             r"i64\[1\] \(.*test_ops.py:\d+\)"):
        mica.trace(lambda x, t: mica.nn.functional.nll_loss(x, t), mica.f32[4, 3], mica.i64[1])
    with pytest.raises(mica.MicaError, match="^nll_loss: class weights .* are not supported"):
        mica.trace(lambda x, t: mica.nn.functional.nll_loss(x, t, x[0]), mica.f32[4, 3], mica.i64[4])
    program = mica.trace(lambda x, t: mica.nn.functional.nll_loss(x, t), mica.f32[2, 3], mica.i64[2])
    logp = np.array([[-np.inf, -0.25, -2.0], [-1.0, -np.inf, -0.5]], np.float32)
    from test_cuda import _has_boost_context

    runs = [program.lower("cpu").build(), lambda *a: mica.reference.run(program, *a)]
    runs += [program.lower("cuda", simulate=True).build()] if _has_boost_context() else []
    for exe in runs:
        assert exe(logp, np.array([1, 2])) == np.float32(0.375)
        assert exe(logp, np.array([1, -100])) == np.float32(0.25)  # (ignore_index's -100: out of the mean)
        for bad in (3, -2):
            with pytest.raises(mica.MicaError, match=rf"^nll_loss: target {bad} is out of range for 3 classes; give "
                                                     "targets below the class count, or ignore_index"):
                exe(logp, np.array([1, bad]))
    exe = mica.compile(lambda z: mica.nn.functional.cross_entropy(z, mica.tensor(3)), mica.f32[5])
    z = np.arange(5, dtype=np.float32)
    assert rel_err(exe(z), TF.cross_entropy(torch.tensor(z), torch.tensor(3)).item()) < 1e-6


@pytest.mark.parametrize("fn,says", [
    (lambda x: x ** -1, "pow: integers cannot be raised to a negative integer power (-1), as in torch"),
    (lambda x: x.float().masked_fill(x > 0, mica.ones(4)), "masked_fill: the value must be a number or a 0-d "
     "tensor, got one of shape [4]"),
    (lambda x: mica.nn.functional.linear(x.float(), mica.ones(3, 5)), "linear: input f32[4] needs 5 features in its "
     "last dim, as weight f32[3, 5] takes (in_features 5)"),
])
def test_what_torch_refuses_is_a_sentence(fn, says):
    with pytest.raises(mica.MicaError) as e:
        mica.trace(fn, mica.i64[4])
    assert str(e.value).startswith(says) and "test_ops.py:" in str(e.value), str(e.value)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_integers_to_integer_tensor_powers_are_torchs_wrapping_products(dtype):
    """2 ** n and x ** n for integer tensors n: torch's integer pow (repeated squaring, wrapping;
    a negative power 1, -1 or 0), compiled, eager and on bools, bit for bit."""
    rng = np.random.default_rng(3)
    x = rng.integers(-7, 8, (3, 6)).astype(dtype)
    x[0] = [-1, 1, -1, 1, 0, 2]
    n = rng.integers(-4, 70 if dtype == np.int64 else 40, 6).astype(dtype)
    n[:3] = [np.iinfo(dtype).max, 0, -3]
    want = (torch.from_numpy(x) ** torch.from_numpy(n)).numpy()
    got = mica.compile(lambda a, b: a ** b)(x, n)
    assert got.dtype == want.dtype and np.array_equal(np.asarray(got), want)
    assert np.array_equal(np.asarray(mica.as_tensor(x) ** mica.as_tensor(n)), want)
    want = (3 ** torch.from_numpy(n)).numpy()
    assert np.array_equal(np.asarray(mica.compile(lambda b: 3 ** b)(n)), want)
    flags = np.array([True, False, True])
    assert np.array_equal(np.asarray(mica.compile(lambda b: 2 ** b)(flags)), (2 ** torch.from_numpy(flags)).numpy())
    squared = mica.as_tensor(flags) ** 2  # (numpy's square keeps a bool; torch's power is int64)
    assert squared.dtype == np.int64 and np.array_equal(np.asarray(squared), [1, 0, 1])
    other = np.array([False, False, True])
    for verb in ("maximum", "minimum"):  # (torch's on bools: or, and)
        want = getattr(torch, verb)(torch.from_numpy(flags), torch.from_numpy(other)).numpy()
        got = mica.compile(lambda a, b: getattr(a, verb)(b))(flags, other)
        assert got.dtype == np.bool_ and np.array_equal(np.asarray(got), want)


def _corners(m, x, q, k, v, z):
    """Corners an outside differential tester found wrong or missing, written as a torch user would
    (var(dim=[])'s gradient is torch 2.13's inf, a bug of its own: compared by value only)."""
    F = m.nn.functional
    mask = m.arange(4).reshape(4, 1).expand(4, 4) > 0  # (query 0 may see no key: a padding row)
    float_mask = m.where(mask, 0.0, float("-inf"))
    y = x.clone()
    y.mul_(2.0)  # (a clone is a tensor of its own: x stays as it was)
    h = (x * 1.0)[:, 0]
    h.mul_(3.0)
    q5, k5 = x.reshape(3, 1, 2, 2, 5), x.reshape(1, 3, 2, 2, 5)
    return (F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask),
            F.scaled_dot_product_attention(q5, k5, q5, is_causal=True),
            F.cross_entropy(z, m.tensor([-100, -100, -100, -100]), label_smoothing=0.2),
            F.cross_entropy(z, m.tensor([-100, 1, 4, 2]), label_smoothing=0.1),
            x.sum(dim=[]), x.mean(dim=[]), x.amax(dim=[]), x.amin(dim=[]), x.var(dim=[]).detach(), x.norm(dim=[]),
            m.linspace(3, 5, 1) * x[0, 0, 0], x.norm(p=float("-inf"), dim=-1), x.norm(p=float("-inf")),
            x[True], x[:, False], x[:, [True, False, True, True]], x[1, :, True, 2:4], x.argmax(keepdim=True),
            x.std(1), x.std(dim=(0, 2), correction=0, keepdim=True), x.logsumexp(-1), m.logsumexp(x, (0, 2)),
            m.mm(x[0], x[1].T), x.bmm(x.transpose(1, 2)), x.clamp_min(0.1).clamp_max(0.5),
            x.softmax(axis=1), m.cat([x, x], axis=2), m.sum(x, axis=1), x.reshape(shape=(5, 12)), y, x, h)


def _weighted_against_torch(fn, inputs, weights):
    """fn(m, *inputs)'s outputs and the gradients of the sum of each floating output times its
    weight: Mica's compiled from the float32 inputs, torch's in float64 (results as numpy)."""
    def loss(outs, constant):
        return sum((o * constant(w)).sum() for o, w in zip(outs, weights) if o.dtype.is_floating_point and o.numel())

    def step(*xs):
        outs = fn(mica, *xs)
        return outs, mica.grad(loss(outs, mica.tensor), list(xs))

    got, grads = mica.compile(step, *[spec_of(a) for a in inputs])(*inputs)
    ts = [to_torch(a.astype(np.float64), requires_grad=True) for a in inputs]
    want = fn(torch, *ts)
    want_grads = torch.autograd.grad(loss(want, torch.from_numpy), ts)
    return got, grads, [w.detach().numpy() for w in want], [g.numpy() for g in want_grads]


def test_corners_an_outside_tester_found_follow_torch():
    """Each result and every gradient against torch float64, in one program: a query the mask leaves no
    key gives 0 and finite gradients (was NaN in every v gradient), label smoothing's ignored rows give
    gradient 0 (was 0/0), dim=[] reduces every dim (was none), linspace(a, b, 1) is [a], norm(-inf)
    the smallest magnitude, bools index as torch's, argmax(keepdim) keeps every dim, attention over
    three batch dims, a clone is its own tensor; std, logsumexp, mm, bmm, clamp_min/max, axis=."""
    rng = np.random.default_rng(11)
    x, q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4, 5), (4, 6), (4, 6), (4, 3)))
    z = rng.standard_normal((4, 7)).astype(np.float32)
    z[0, 2] = -np.inf  # (an ignored row's -inf logit: torch's loss stays finite)
    inputs = (x, q, k, v, z)
    program = mica.trace(lambda *a: _corners(mica, *a), *[spec_of(a) for a in inputs])
    weights = [rng.standard_normal(o.shape) for o in program.outputs]
    got, grads, want, want_grads = _weighted_against_torch(_corners, inputs, weights)
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.shape(g) == w.shape, i
        assert np.allclose(np.asarray(g, np.float64), w, rtol=2e-5, atol=1e-6, equal_nan=True), (i, g, w)
    assert np.isnan(got[3]) and np.isfinite(got[4]) and not np.any(got[0][0]) and not np.any(got[1][0])
    for g, w in zip(grads, want_grads):
        assert np.all(np.isfinite(g)) and rel_err(g, w) <= 1e-5
    # x**e at x == 0 and e < 0: the exponent's gradient is -inf, as torch's (was 0)
    e = np.array([-2.0, -0.5, 1.5], np.float32)
    got = mica.compile(lambda e: mica.grad(mica.pow(mica.zeros(3), e).sum(), e), mica.f32[3])(e)
    te = to_torch(e, requires_grad=True)
    assert got.tolist() == torch.autograd.grad(torch.pow(torch.zeros(3), te).sum(), te)[0].tolist()


@pytest.mark.parametrize("bad, says", [
    (lambda x: x.sum((1, 1)), r"^sum: dims \[1, 1\] name a dim twice"),
    (lambda x: x.amax((0, -3)), r"^amax: dims \[0, -3\] name a dim twice"),
    (lambda x: x.flatten(2, 1), r"^flatten: start_dim 2 comes after end_dim 1"),
    (lambda x: mica.where(x > 0), r"^where\(condition\) with one argument is torch.nonzero"),
    (lambda x: mica.cat([x[0, 0, 0], x[0, 0, 1]]), r"^cat: zero-dimensional tensors cannot be concatenated"),
    (lambda x: x[[[0, 1], [2, 0]]], r"^a list of lists as an index is read one way by torch 2"),
    (lambda x: x[:, [True, False]], r"^a mask of \[2\] bools cannot index dim 1 of size 4"),
    (lambda x: x.norm(p="nuc"), r"^norm: p='nuc' is not supported"),
    (lambda x: mica.linspace(0, 1, -1), r"^linspace: steps must be an int, 0 or more"),
    (lambda x: mica.mm(x, x), r"^mm: both operands must be 2-d"),
    (lambda x: mica.nn.functional.cross_entropy(x, x.softmax(1), ignore_index=1),
     r"^cross_entropy: ignore_index applies to class indices"),
])
def test_what_torch_refuses_is_a_sentence(bad, says):
    """Calls torch refuses: one sentence at the user's line."""
    with pytest.raises(mica.MicaError, match=says + r".*\(.*test_ops.py:\d+\)$"):
        mica.trace(bad, mica.f32[3, 4, 5])


def _writes(m, x, v):
    """In-place steps and item assignment as torch users write them: each reaches every tensor
    sharing the memory (the tensor a view views, its other views, an alias)."""
    y = x * 1.0
    y[:, 0].mul_(5.0)  # through a slice
    z = y.view(12, 5)
    z[3] += 1.0  # through a view of the base, with +=
    h = y[1]
    y.add_(0.5)  # the base in place: the view h sees it
    w = x * 2.0
    w[0, 1:3, ::2] = 7.0
    w[:, [0, 2]] = w[:, [1, 1]]  # a list index: torch's index_put
    w[..., [True, False, True, False, True]] = -1.0
    u = x * 3.0
    t = u.transpose(0, 1)
    t[0].zero_()  # through a transpose
    s = x.detach() * 1.0
    q, r = s.split([2, 1], 0)
    r.mul_(10.0)  # through split
    c = x.clone()
    c += 1.0  # a clone is its own tensor
    a = x * 1.0
    b = a
    b += 2.0  # an alias: a sees it
    e = x * 1.0
    e[x > 0.5] = 0.0  # a bool mask of x's shape: masked_fill
    f = x * 1.0
    f[1] = v[0].unsqueeze(0) * 2.0  # a tensor value, broadcast, with a gradient
    f[0] *= 3.0
    return y, z, h, w, u, t, s, q, r, c, a, e, f, x


def test_in_place_steps_and_item_assignment_write_through_as_torchs():
    """Every result and both gradients against torch float64."""
    rng = np.random.default_rng(5)
    x, v = rng.standard_normal((3, 4, 5)).astype(np.float32), rng.standard_normal((2, 4, 5)).astype(np.float32)
    weights = [rng.standard_normal(o.shape) for o in _writes(torch, torch.tensor(x), torch.tensor(v))]
    got, grads, want, want_grads = _weighted_against_torch(_writes, (x, v), weights)
    for g, w in zip(got, want):
        assert rel_err(g, w) <= 1e-6
    for g, w in zip(grads, want_grads):
        assert rel_err(g, w) <= 1e-6


def _einsum_pad_repeat(m, a, b, c):
    F = m.nn.functional
    return (m.einsum("bij,bjk->bik", a, b), m.einsum("bij,bjk,kl->bil", a, b, c), m.einsum("...ij,...jk", a, b),
            m.einsum("bij,bij->b", a, a), m.einsum("bij->jb", a), m.einsum("ij,kl->ijkl", a[0], c),
            F.pad(a, (1, 2)), F.pad(a, (-1, 2, 1, -1), "constant", 2.5), F.pad(a, (0, 0, 0, 0, 1, 1), value=-1.0),
            a.repeat_interleave(2, 1), m.repeat_interleave(a, 3),
            a.repeat_interleave(m.tensor([1, 0, 2]) if m is torch else [1, 0, 2], dim=1),  # (counts: torch's a tensor)
            m.einsum("bii->bi", b[:, :, :4]), m.einsum("ii", c[:3]), m.einsum("...ii,ij->...j", b[:, :, :4], b[0]),
            m.diagonal(a, 1, 1, 2), a.diagonal(-1, 0, 2), m.diag(c[:, 0]), m.diag(c, -2), m.diag(c[0], 1))


def test_einsum_pad_and_repeat_interleave_compute_as_torchs():
    """Values and gradients against torch float64: einsum's pairwise products (broadcast batch,
    summed letters, `...`, implicit output, a letter twice in an operand: its diagonal), pad's counts
    from the last dim (negative ones cut), repeat_interleave by a count and by counts, diagonal and
    diag (offsets either side)."""
    rng = np.random.default_rng(12)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 4), (2, 4, 5), (5, 3))]
    weights = [rng.standard_normal(o.shape) for o in _einsum_pad_repeat(torch, *[torch.tensor(a) for a in inputs])]
    got, grads, want, want_grads = _weighted_against_torch(_einsum_pad_repeat, inputs, weights)
    for g, w in zip(got, want):
        assert rel_err(g, w) <= 1e-6
    for g, w in zip(grads, want_grads):
        assert rel_err(g, w) <= 1e-6
    spiky = np.array([np.inf, 1.0, np.nan], np.float32)  # (diag chooses, never multiplies: inf and NaN stay put)
    np.testing.assert_array_equal(np.asarray(mica.diag(mica.tensor(spiky))), torch.diag(torch.tensor(spiky)).numpy())
    for bad, says in ((lambda a: mica.einsum("ii->i", a[0, :, :2]), r"^einsum: letter 'i' stands for sizes 3 and 2 in "
                                                                     r"one operand"),
                      (lambda a: mica.einsum("ij,jk->ik", a, a), r"^einsum: operand 'ij' names 2 dims"),
                      (lambda a: mica.nn.functional.pad(a, (1, 1), mode="mirror"), r"^pad: mode 'mirror' is not one of "
                                                                                         r"torch's"),
                      (lambda a: mica.nn.functional.pad(a, (3, 1), mode="reflect"), r"^pad: reflect padding of 3 on a "
                                                                                     r"dim of size 3"),
                      (lambda a: a.repeat_interleave([1, 2], dim=0), r"^repeat_interleave: 2 counts for dim 0")):
        with pytest.raises(mica.MicaError, match=says + r".*\(.*test_ops.py:\d+\)$"):
            mica.trace(bad, mica.f32[3, 3, 3])


def test_finfo_and_iinfo_are_torchs():
    """HF-style masks write (1.0 - mask) * torch.finfo(dtype).min: every field torch gives, for each
    type, from a Mica, numpy or torch dtype (a traced Tensor's .dtype too)."""
    for name in ("float16", "bfloat16", "float32", "float64"):
        want = torch.finfo(getattr(torch, name))
        for given in (getattr(mica, name), getattr(torch, name)):
            got = mica.finfo(given)
            assert [getattr(got, k) for k in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution")] \
                == [getattr(want, k) for k in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution")]
    assert mica.finfo().max == mica.finfo(np.float32).max == torch.finfo().max
    for name in ("int32", "int64"):
        want, got = torch.iinfo(getattr(torch, name)), mica.iinfo(getattr(mica, name))
        assert (got.bits, got.min, got.max) == (want.bits, want.min, want.max)
    exe = mica.compile(lambda x, m: x + (1.0 - m) * mica.finfo(x.dtype).min, mica.f32[3], mica.f32[3])
    assert exe(np.zeros(3, np.float32), np.array([1, 0, 1], np.float32)).tolist() == [0, np.finfo(np.float32).min, 0]
    with pytest.raises(mica.MicaError, match=r"^finfo takes a floating type .*got mica.int32.*\(.*test_ops.py:\d+\)$"):
        mica.finfo(mica.int32)


def _history(m, x):
    """Writes that change a tensor's data and not its history, as torch's: under no_grad, through a
    detached alias, through an identity view taken under no_grad; and corners a fuzzer found."""
    a = x * 1.0
    with m.no_grad():
        a -= 2.0
    b = x * 1.0
    b.detach()[0].mul_(3.0)
    c = x * 1.0
    with m.no_grad():
        p = c.permute(0, 1, 2)
    d = x * 1.0
    t = d.detach()
    t *= x
    e = x * 1.0
    e.expand(1, 3, 4, 5).add_(1.0)  # (an expand that repeats nothing: torch writes through it)
    f = x * 1.0
    f.fill_(x[0, 0, 0])
    g = x * 1.0  # (partial writes under no_grad: the written elements keep their history too)
    with m.no_grad():
        g[0] = 5.0
        g[1].mul_(2.0)
        g[:, 1] *= 3
        g[[2]] = -1.0
    return a, b, p + c, d, t, e, f, g, x[-1, 4:4].chunk(1, -1)[0], x[None, :-3, 2:]


def test_writes_without_history_and_zero_size_views_as_torchs():
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 4, 5))
    weights = [rng.standard_normal(o.shape) for o in _history(torch, torch.tensor(x))]

    def step(x):
        outs = _history(mica, x)
        return outs, mica.grad(sum((o * mica.tensor(w, dtype=mica.float64)).sum() for o, w in zip(outs, weights)),
                               [x])[0]

    tx = to_torch(x, requires_grad=True)
    want = _history(torch, tx)
    want_grad = torch.autograd.grad(sum((o * torch.from_numpy(w)).sum() for o, w in zip(want, weights)), tx)[0]
    program = mica.trace(step, mica.f64[3, 4, 5])
    compiled = program.lower("cpu").build()
    for got, grad in (mica.reference.run(program, x), compiled(x)):
        for g, w in zip(got, want):
            assert np.shape(g) == tuple(w.shape) and rel_err(g, w.detach().numpy()) <= 1e-12
        assert rel_err(grad, want_grad.numpy()) <= 1e-12


def _copies(m, x):
    """reshape, flatten and contiguous of a transpose copy in torch: a later write to the tensor
    does not reach them; of an ordered tensor they view it, and it does."""
    a = x * 1.0
    t = a.T
    r, c, fl = t.reshape(-1), t.contiguous(), t.flatten()
    v, w = a.reshape(-1), a.contiguous()
    a.mul_(2.0)
    return r, c, fl, v, w


def test_reshape_of_a_transpose_copies_and_of_an_ordered_tensor_views_as_torchs():
    x = np.random.default_rng(15).standard_normal((3, 4))
    program = mica.trace(lambda x: (_copies(mica, x), mica.grad(sum(o.sum() for o in _copies(mica, x)), [x])[0]),
                         mica.f64[3, 4])
    got, grad = mica.reference.run(program, x)
    tx = to_torch(x, requires_grad=True)
    want = _copies(torch, tx)
    for g, w in zip(got, want):
        assert np.array_equal(g, w.detach().numpy())
    assert np.array_equal(grad, torch.autograd.grad(sum(o.sum() for o in want), tx)[0].numpy())


@pytest.mark.parametrize("step, spec, bad, says", [
    (lambda x, i: x.gather(1, i), [mica.f32[2, 3], mica.i64[2, 2]], np.array([[0, 3], [1, 2]]),
     "an index tensor holds 3, out of range for a dim of 3 elements; give indices from 0 to size - 1"),
    (lambda x, i: x.index_select(1, i[0]), [mica.f32[2, 3], mica.i64[2, 2]], np.array([[-1, 0], [0, 0]]),
     "an index tensor holds -1, out of range for a dim of 3 elements; give indices from 0 to size - 1"),
    (lambda x, i: x[:, i], [mica.f32[2, 3], mica.i64[2, 2]], np.array([[-4, 0], [0, 0]]),
     "an index tensor holds -4, out of range for a dim of 3 elements; give indices from -size to size - 1"),
    (lambda x, i: mica.nn.functional.one_hot(i, 3).float() + x.sum(), [mica.f32[2, 3], mica.i64[2, 2]],
     np.array([[0, -1], [0, 0]]), "one_hot: class -1 is out of range for 3 classes; give classes from 0 to "
     "num_classes - 1"),
])
def test_an_index_tensor_out_of_range_stops_the_program_with_a_sentence(step, spec, bad, says):
    """torch raises on an index out of range; a compiled program stops with the same sentence on
    every target, and a negative index wraps where torch's wraps it (x[t], take_along_dim)."""
    from test_cuda import _has_boost_context

    program = mica.trace(step, *spec)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    targets = [mica.reference.run, program.lower("cpu").build()]
    if _has_boost_context():
        targets.append(program.lower("cuda", simulate=True).build())
    for run in targets:
        with pytest.raises(mica.MicaError) as e:
            run(*([program] if run is mica.reference.run else []), x, bad)
        assert says in str(e.value)
        good = run(*([program] if run is mica.reference.run else []), x, np.zeros((2, 2), np.int64) + 1)
        assert np.isfinite(np.asarray(good)).all()


def _picking_corners():
    """What a differential fuzz of the new verbs met: infinities in isclose, NaN in median, an
    input broadcast in cosine_similarity, probabilities of exactly 0 and 1, elu at -inf, empty
    dims (any/all, index writes, glu), a rounded quotient by 0, 0-d tensors; from a second one, ties
    in median() of all elements and index_fill's indices from the end."""
    inf, nan = np.inf, np.nan
    return [
        ("isclose_infinities", lambda m, a, b: m.isclose(a, b).double() + m.isclose(a, b, equal_nan=True).double(),
         [np.array([1.5, -2.0, inf, -inf, 0.0]), np.array([inf, -inf, -inf, -inf, inf])]),
        ("median_nan", lambda m, a: m.median(a, 0).values + m.median(a, 0).indices + m.median(a[:, 1]),
         [np.array([[1.0, 4.0], [nan, 2.0], [3.0, 0.5]])]),
        ("cosine_similarity_broadcast", lambda m, a, b: m.nn.functional.cosine_similarity(a, b, dim=1),
         [np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]]), np.array([[2.0], [-3.0]])]),
        ("bce_at_0_and_1", lambda m, p, t: m.nn.functional.binary_cross_entropy(p, t.detach(), reduction="sum"),
         [np.array([0.0, 1.0, 0.5]), np.array([0.7, 0.3, 1.0])]),
        ("elu_at_infinities", lambda m, a: m.nn.functional.elu(a), [np.array([inf, -inf, 1.0, -0.5])]),
        ("rounded_quotient_by_0", lambda m, a, b: m.div(a, b, rounding_mode="floor") + m.div(a, b, rounding_mode="trunc"),
         [np.array([1.5, -2.0, 3.0]), np.array([0.0, 0.5, -0.7])]),
        ("empty_any_all", lambda m, a: m.any(a > 0).double() + (a > 0).all(1).double().sum() + (a > 0).all().double(),
         [np.zeros((2, 0))]),
        ("empty_index_writes", lambda m, a: (a.index_add(0, m.tensor([1, 1]), a[:2] * 2).sum() + a.flip(0).sum()
                                             + m.nn.functional.glu(a[0, :0]).sum()), [np.zeros((4, 0))]),
        ("zero_d_index_verbs", lambda m, a: a.index_fill(0, m.tensor([0]), 2.5) + a.index_select(0, m.tensor(0))
         + a.unfold(0, 1, 1).sum(), [np.array(1.25)]),
        ("median_of_all_with_ties", lambda m, a: m.median(a) * 3 + m.median(a[0]),  # (the gradient shared)
         [np.array([[1.0, 2.0, 2.0], [2.0, 0.5, 3.0]])]),
        ("index_fill_from_the_end", lambda m, a: a.index_fill(1, m.tensor([-1, 0]), 5.0) * a,
         [np.array([[1.5, -2.0, 0.25, 4.0], [2.0, 0.5, -3.0, 1.0]])]),
    ]


@pytest.mark.parametrize("name,fn,arrays", _picking_corners(), ids=[c[0] for c in _picking_corners()])
def test_corners_of_the_picking_and_rounding_verbs_follow_torch(name, fn, arrays):
    targs = [to_torch(a, requires_grad=True) for a in arrays]
    want = fn(T, *targs)
    differentiable = want.requires_grad
    tgrads = torch.autograd.grad(want.sum(), targs, allow_unused=True) if differentiable else [None] * len(targs)

    def step(*xs):
        out = fn(mica, *xs)
        return out, (mica.grad(out.sum(), list(xs)) if differentiable else [])

    program = mica.trace(step, *[spec_of(a) for a in arrays])
    got, grads = mica.reference.run(program, *arrays)
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-12, atol=0, equal_nan=True)
    for g, tg, a in zip(grads, tgrads, arrays):
        np.testing.assert_allclose(g, np.zeros_like(a) if tg is None else tg.numpy(), rtol=1e-9, atol=1e-15,
                                   equal_nan=True)
    host = fn(mica, *[mica.tensor(a, dtype=mica.float64) for a in arrays])  # (outside a trace: the same)
    np.testing.assert_allclose(host, want.detach().numpy(), rtol=1e-12, atol=0, equal_nan=True)


def test_torch_trace_in_ported_code_is_the_diagonals_sum_and_mica_trace_still_traces():
    """An outside tester's: after `import mica as torch`, torch.trace(x) called Mica's tracer on a
    tensor (a traceback); given a tensor alone it is torch.trace, eager, compiled and as a method."""
    x = np.random.default_rng(5).standard_normal((4, 4)).astype(np.float32)
    want = torch.trace(torch.tensor(x)).item()
    assert rel_err(float(mica.trace(mica.as_tensor(x))), want) < 1e-6
    assert rel_err(float(mica.as_tensor(x).trace()), want) < 1e-6
    assert rel_err(float(mica.compile(lambda a: mica.trace(a) + a.trace())(x)), 2 * want) < 1e-6
    ints = np.arange(9).reshape(3, 3).astype(np.int32)
    got = mica.compile(lambda a: a.trace())(ints)
    assert got.dtype == np.int64 and int(got) == 12  # (torch's: an integer trace is int64)
    assert isinstance(mica.trace(lambda a: a * 2, mica.f32[3]), mica.Program)
    with pytest.raises(mica.MicaError, match=r"^trace: takes a matrix \(a 2-d tensor\), got f32\[3\]"):
        mica.trace(mica.ones(3))


@pytest.mark.parametrize("name", ["repeat", "repeat_interleave", "flip", "fliplr", "roll", "cumsum", "cumprod", "prod",
                                  "cumsum_0d"])
def test_a_verb_torch_copies_for_is_a_tensor_of_its_own_after_an_in_place_step(name):
    """An outside fuzzer's: over a dim of size 1 these were views of their operand in a compiled
    step, so a later x.add_(100) reached the result (and flip(...).add_ the caller's array)."""
    op = {"repeat": lambda x: x.repeat(1, 2), "repeat_interleave": lambda x: x.repeat_interleave(2, dim=1),
          "flip": lambda x: x.flip(1), "fliplr": lambda x: x.fliplr(), "roll": lambda x: x.roll(1, 1),
          "cumsum": lambda x: x.cumsum(1), "cumprod": lambda x: x.cumprod(1), "prod": lambda x: x.prod(1),
          "cumsum_0d": lambda x: x[0, 0].cumsum(0)}[name]

    def later(x):
        y = op(x)
        x.add_(100)
        return y

    def into(x):
        y = op(x)
        y.add_(100)
        return y

    x = np.array([[1.0], [2.0]], np.float32)
    for fn in (later, into):
        given = x.copy()
        want_given = torch.from_numpy(x.copy())
        want = fn(want_given)
        np.testing.assert_array_equal(np.asarray(mica.compile(fn)(given)), want.numpy())
        np.testing.assert_array_equal(given, want_given.numpy())  # (the caller's array, written back as torch's)


def test_fuzzed_corners_of_bools_powers_and_special_values_are_torchs():
    """An outside fuzzer's: bool + bool stored 2 in a bool, a bool's square was a bool, prod's dtype
    was dropped, log1p(inf) was NaN, sign(NaN) NaN, and x ** 0.5 of -inf inf (torch's: its sqrt)."""
    b, at = np.array([True, False, True]), np.array([0, 0, 2])
    cases = [
        (lambda T, a, i: (a + a).long(), (b, at)), (lambda T, a, i: ((a + True) ^ True).long(), (b, at)),
        (lambda T, a, i: T.scatter_add(a, 0, i, a).long(), (b, at)), (lambda T, a, i: T.index_add(a, 0, i, a).long(),
                                                                       (b, at)),
        (lambda T, a, i: a.square(), (b, at)), (lambda T, a, i: T.pow(a, False), (b, at)),
        (lambda T, a, i: i.prod(dtype=T.int32), (b, at + 1)), (lambda T, a, i: i.reshape(1, 3).prod(1, dtype=T.int32),
                                                               (b, at + 1)),
    ]
    for fn, args in cases:
        want = fn(torch, *[torch.from_numpy(a) for a in args]).numpy()
        got = np.asarray(mica.compile(lambda *a: fn(mica, *a))(*args))
        assert got.dtype == want.dtype and np.array_equal(got, want), (got, want)
        eager = np.asarray(fn(mica, *[mica.as_tensor(a) for a in args]))
        assert eager.dtype == want.dtype and np.array_equal(eager, want), (eager, want)
    x = np.array([np.inf, -np.inf, np.nan, -1.0, -2.0, -0.5, 1e-10, 0.0, 3.0], np.float32)
    t = torch.tensor(x, requires_grad=True)
    torch.log1p(t).sum().backward()
    value, slope = mica.compile(lambda a: (mica.log1p(a), mica.grad(mica.log1p(a).sum(), [a])[0]))(x)
    np.testing.assert_array_equal(np.asarray(value), torch.log1p(torch.tensor(x)).numpy())
    np.testing.assert_allclose(np.asarray(slope), t.grad.numpy(), rtol=1e-6)  # (-1 / 1 at -2: torch's slope)
    for fn in (lambda a: a.sign(), lambda a: a ** 0.5, lambda a: a ** -0.5, lambda a: a ** 3, lambda a: a ** -1):
        want = fn(torch.tensor(x)).numpy()
        np.testing.assert_array_equal(np.asarray(mica.compile(fn)(x)), want)


def test_eager_corners_a_fuzzer_found_are_torchs():
    """dtype arguments given as an eager tensor's (numpy's) dtype, a softmax over no elements, an
    int32 beside a Python int beyond it (wrapping, as torch's), a strided slice unflattened (a view)
    and argmax over nothing (a sentence) did not run as torch's."""
    x = mica.as_tensor(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert mica.ones(2, 3).to(x.dtype).dtype == np.int32 and mica.ones(2, 3).sum(dtype=x.dtype).dtype == np.int32
    assert mica.ones(2, 0).softmax(-1).shape == (2, 0) and mica.ones(0, 3).log_softmax(0).shape == (0, 3)
    ti = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(x + 2 ** 40), (ti + 2 ** 40).numpy())
    np.testing.assert_array_equal(np.asarray(x * 2 ** 33), (ti * 2 ** 33).numpy())
    np.testing.assert_array_equal(np.asarray(mica.compile(lambda a: a * 2 ** 33 + 2 ** 40)(np.asarray(x))),
                                  (ti * 2 ** 33 + 2 ** 40).numpy())
    big = mica.as_tensor(np.arange(30, dtype=np.float32).reshape(3, 10))
    y = big[:, ::2].unflatten(-1, (1, 5))
    y[1, 0, 2] = -1.0
    assert y.shape == (3, 1, 5) and float(big[1, 4]) == -1.0  # (a view, as torch's)
    with pytest.raises(mica.MicaError, match="no element along the dim"):
        mica.ones(2, 0).argmax(1)
    with pytest.raises(mica.MicaError, match="takes no bool tensor"):
        mica.trace(lambda a: a.argmax(), mica.b8[3])
