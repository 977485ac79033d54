"""torch.nn.functional.conv1d / conv2d / conv3d (and the pools, avg_pool and max_pool in 1 and 2
dims, over the same windows): each output position's patch gathered by strided
slices of the (padded) input, one per kernel offset (im2col), and multiplied by the weight as one
product per group: so the gradients are the slices' and the product's, and a half type's product
reads half operands and sums in float32 as every product does. The sums' order is the product's,
not torch's direct convolution's: results agree to float32 rounding, not bit for bit."""
import itertools
import math

import numpy as np

from .. import amp
from ..tensor import fail
from .core import add, as_tensor, div, max as _max, mean, ones_like, sum as _sum, to, written, zeros_like
from .nn import _matmul_nd, _widened
from .shape import cat, narrow, pad, permute, reshape, stack, unsqueeze, squeeze

__all__ = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "avg_pool1d", "avg_pool2d", "max_pool1d", "max_pool2d", "adaptive_avg_pool1d",
           "adaptive_avg_pool2d", "adaptive_avg_pool3d", "dropout1d", "dropout2d", "dropout3d"]


def _spatial(verb, name, value, nd):
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,) * nd
    if len(values) == 1:
        values = values * nd
    if len(values) != nd or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        fail(f"{verb}: {name} must be an int or {nd} ints, got {value!r}")
    return values


def _conv(verb, nd, input, weight, bias, stride, padding, dilation, groups):
    input, weight = amp.lower(verb, as_tensor(input), as_tensor(weight))
    if bias is not None:
        (bias,) = amp.lower(verb, as_tensor(bias))
    if weight.ndim != nd + 2:
        fail(f"{verb}: the weight must be [out_channels, in_channels / groups, {', '.join(['k'] * nd)}], got "
             f"{weight.value.spec!r}")
    if input.ndim not in (nd + 1, nd + 2):
        fail(f"{verb}: input must be [N, C, {', '.join('LHW'[-nd:] if nd < 3 else 'DHW')}] or unbatched without N, "
             f"got {input.value.spec!r}")
    if input.dtype.kind != "float" or input.dtype is not weight.dtype:
        fail(f"{verb}: input {input.value.spec!r} and weight {weight.value.spec!r} must be of one floating type, as "
             "torch's; cast one to the other's (or compute under mica.autocast)")
    batched = input.ndim == nd + 2
    x = input if batched else unsqueeze(input, 0)
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        fail(f"{verb}: groups must be a positive int, got {groups!r}")
    N, C = x.shape[0], x.shape[1]
    O, per, ks = weight.shape[0], weight.shape[1], tuple(weight.shape[2:])
    if C % groups or O % groups or per * groups != C:
        fail(f"{verb}: input {x.value.spec!r} has {C} channels, but weight {weight.value.spec!r} with groups={groups} "
             f"takes {per * groups} (in_channels / groups = {per}) and {O} output channels must divide by groups")
    stride, dilation = _spatial(verb, "stride", stride, nd), _spatial(verb, "dilation", dilation, nd)
    if min(stride) < 1 or min(dilation) < 1:
        fail(f"{verb}: stride and dilation must be >= 1, got stride={stride}, dilation={dilation}")
    if padding == "valid":
        pads = [(0, 0)] * nd
    elif padding == "same":
        if max(stride) != 1:
            fail(f"{verb}: padding='same' needs stride 1 (as torch's), got stride={stride}")
        pads = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for d, k in zip(dilation, ks)]
    elif isinstance(padding, str):
        fail(f"{verb}: padding must be 'valid', 'same', an int or {nd} ints, got {padding!r}")
    else:
        p = _spatial(verb, "padding", padding, nd)
        if min(p) < 0:
            fail(f"{verb}: padding must be >= 0, got {padding!r}")
        pads = [(a, a) for a in p]
    patches, outs = _patches(verb, x, ks, stride, dilation, pads)
    K, P = math.prod(ks), math.prod(outs)
    patches = reshape(patches, (N, groups, per * K, P))  # [N, g, C/g * K, P]
    w = reshape(weight, (groups, O // groups, per * K))
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != O):
        fail(f"{verb}: bias must be [{O}] (one per output channel), got {bias.value.spec!r}")
    # (a half bias joins the product's float32 sums and is rounded once, as linear's)
    b, half = _widened(bias, x) if bias is not None else (None, None)
    y = reshape(_matmul_nd(verb, w, patches, half is not None), (N, O) + tuple(outs))  # (each group's product)
    if bias is not None:
        y = add(y, reshape(b, (O,) + (1,) * nd))
        y = to(y, half) if half is not None else y
    return y if batched else squeeze(y, 0)


def _patches(verb, x, ks, stride, dilation, pads, value=None):
    """([N, C, K, *outs]: each output position's window of x [N, C, *spatial] padded by `pads`
    (`value`, else zeros), K the kernel's offsets in row-major order; outs)."""
    if any(lo or hi for lo, hi in pads):
        x = pad(x, [v for lo_hi in reversed(pads) for v in lo_hi], value=value)  # (F.pad: the last dim first)
    sizes = x.shape[2:]
    outs = [(n - d * (k - 1) - 1) // s + 1 for n, d, k, s in zip(sizes, dilation, ks, stride)]
    if min(outs) < 1:
        fail(f"{verb}: the kernel {list(ks)} (dilation {list(dilation)}) is larger than the padded input "
             f"{list(sizes)}; pad the input or use a smaller kernel")
    cols = []
    for offsets in itertools.product(*(range(k) for k in ks)):
        at = (slice(None), slice(None)) + tuple(slice(o * d, o * d + s * (m - 1) + 1, s)
                                                for o, d, s, m in zip(offsets, dilation, stride, outs))
        cols.append(x[at])
    return stack(cols, dim=2), outs


def _pool(verb, nd, input, kernel_size, stride, padding, dilation, ceil_mode, how, count_include_pad=True,
          divisor_override=None):
    x = as_tensor(input)
    if x.ndim not in (nd + 1, nd + 2):
        fail(f"{verb}: input must be [N, C, {', '.join('LHW'[-nd:])}] or unbatched without N, got {x.value.spec!r}")
    if ceil_mode:
        fail(f"{verb}: ceil_mode=True is not supported; leave it False (or pad the input)")
    batched = x.ndim == nd + 2
    x = x if batched else unsqueeze(x, 0)
    ks = _spatial(verb, "kernel_size", kernel_size, nd)
    stride = ks if stride is None or stride == [] or stride == () else _spatial(verb, "stride", stride, nd)
    dilation, p = _spatial(verb, "dilation", dilation, nd), _spatial(verb, "padding", padding, nd)
    if min(ks) < 1 or min(stride) < 1 or min(dilation) < 1 or min(p) < 0:
        fail(f"{verb}: kernel_size, stride and dilation must be >= 1 and padding >= 0, got kernel_size={ks}, "
             f"stride={stride}, padding={p}, dilation={dilation}")
    if any(2 * a > k for a, k in zip(p, ks)):
        fail(f"{verb}: padding {p} must be at most half the kernel_size {ks}, as torch's")
    pads = [(a, a) for a in p]
    if how == "max":
        windows, outs = _patches(verb, x, ks, stride, dilation, pads, value=float("-inf"))
        y = _max(windows, dim=2).values  # (the gradient to each window's first largest, as torch's)
    else:
        windows, outs = _patches(verb, x, ks, stride, dilation, pads)
        if divisor_override:
            y = div(_sum(windows, dim=2), float(divisor_override))
        elif count_include_pad or not any(p):
            y = mean(windows, dim=2)
        else:  # (each window's count of the input's own elements)
            counts, _ = _patches(verb, ones_like(x[:1, :1]), ks, stride, dilation, pads)
            y = div(_sum(windows, dim=2), _sum(counts, dim=2))
    return y if batched else squeeze(y, 0)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """torch.nn.functional.avg_pool1d: the mean of each window (padding counted, unless
    count_include_pad=False)."""
    return _pool("avg_pool1d", 1, input, kernel_size, stride, padding, 1, ceil_mode, "avg", count_include_pad)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """torch.nn.functional.avg_pool2d: the mean of each window (or its sum over divisor_override)."""
    return _pool("avg_pool2d", 2, input, kernel_size, stride, padding, 1, ceil_mode, "avg", count_include_pad,
                 divisor_override)


def _adaptive(verb, nd, input, output_size):
    """torch's adaptive average pool: output element o of a dim of L inputs is the mean of inputs
    floor(o L / n) up to ceil((o + 1) L / n), over every pooled dim at once (one sum, one division)."""
    (x,) = amp.float32(verb, as_tensor(input))
    if x.ndim not in (nd + 1, nd + 2):
        fail(f"{verb}: input must be [N, C, {', '.join('LHW'[-nd:] if nd < 3 else 'DHW')}] or unbatched without N, got "
             f"{x.value.spec!r}")
    sizes = list(output_size) if isinstance(output_size, (tuple, list)) else [output_size] * nd
    if len(sizes) != nd:
        fail(f"{verb}: output_size must be one size or {nd} of them, got {output_size!r}")
    spatial = x.shape[-nd:]
    sizes = [L if n is None else n for n, L in zip(sizes, spatial)]  # (None keeps that dim, as torch's)
    sizes = [int(n) if isinstance(n, np.integer) else n for n in sizes]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
        fail(f"{verb}: output_size must be sizes of 0 or more (or None), got {output_size!r}")
    dims = list(range(x.ndim - nd, x.ndim))
    if 0 in sizes:  # (torch's: an empty result)
        return reshape(narrow(x, dims[sizes.index(0)], 0, 0), x.shape[:-nd] + tuple(sizes))
    windows = [[(o * L // n, -(-(o + 1) * L // n)) for o in range(n)] for n, L in zip(sizes, spatial)]
    if all(len(w) == 1 and w[0] == (0, L) for w, L in zip(windows, spatial)):  # (a global pool)
        return mean(x, dims, keepdim=True)
    out = []
    for corner in itertools.product(*windows):
        piece = x
        for d, (a, b) in zip(dims, corner):
            piece = narrow(piece, d, a, b - a)
        out.append(mean(piece, dims))
    return reshape(stack(out, -1), x.shape[:-nd] + tuple(sizes))


def adaptive_avg_pool1d(input, output_size):
    """torch.nn.functional.adaptive_avg_pool1d: [N, C, L] (or [C, L]) to output_size means."""
    return _adaptive("adaptive_avg_pool1d", 1, input, output_size)


def adaptive_avg_pool2d(input, output_size):
    """torch.nn.functional.adaptive_avg_pool2d: [N, C, H, W] (or [C, H, W]) to output_size means."""
    return _adaptive("adaptive_avg_pool2d", 2, input, output_size)


def adaptive_avg_pool3d(input, output_size):
    """torch.nn.functional.adaptive_avg_pool3d: [N, C, D, H, W] (or [C, D, H, W]) to output_size means."""
    return _adaptive("adaptive_avg_pool3d", 3, input, output_size)


def _channel_dropout(verb, nd, input, p, training, inplace=False):
    """torch's dropout1d/2d/3d: whole channels zeroed (each kept one scaled by 1 / (1 - p)), one
    draw per (sample, channel); a 3-d input to dropout2d is [N, C, L], as torch reads it."""
    from .core import ones
    from .nn import _probability, dropout

    x = as_tensor(input)
    p = _probability(verb, "p", p)
    if x.ndim not in (nd + 1, nd + 2):
        fail(f"{verb}: input must be {nd + 1}-d (unbatched) or {nd + 2}-d (batched), got {x.value.spec!r}")
    if not training or p == 0:
        return dropout(x, p, training)  # (its checks of p, and x as it is)
    lead = 2 if x.ndim == nd + 2 or verb == "dropout2d" else 1  # (the sample and channel dims)
    keep = dropout(ones(*x.shape[:lead], *(1,) * (x.ndim - lead), dtype=x.dtype), p, True)
    return written(x, x * keep, inplace)


def dropout1d(input, p=0.5, training=True, inplace=False):
    return _channel_dropout("dropout1d", 1, input, p, training, inplace)


def dropout2d(input, p=0.5, training=True, inplace=False):
    return _channel_dropout("dropout2d", 2, input, p, training, inplace)


def dropout3d(input, p=0.5, training=True, inplace=False):
    return _channel_dropout("dropout3d", 3, input, p, training, inplace)


def _no_indices(verb, return_indices):
    if return_indices:
        fail(f"{verb}: return_indices=True is not supported; leave it False")


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """torch.nn.functional.max_pool1d: the largest of each window (padding is -inf)."""
    _no_indices("max_pool1d", return_indices)
    return _pool("max_pool1d", 1, input, kernel_size, stride, padding, dilation, ceil_mode, "max")


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """torch.nn.functional.max_pool2d: the largest of each window (padding is -inf)."""
    _no_indices("max_pool2d", return_indices)
    return _pool("max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode, "max")


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv1d: input [N, C, L] (or [C, L]), weight [O, C / groups, k]."""
    return _conv("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv2d: input [N, C, H, W] (or [C, H, W]), weight [O, C / groups, kh, kw]."""
    return _conv("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv3d: input [N, C, D, H, W] (or unbatched), weight [O, C / groups, kd, kh, kw]."""
    return _conv("conv3d", 3, input, weight, bias, stride, padding, dilation, groups)


def _transposed(verb, nd, input, weight, bias, stride, padding, output_padding, groups, dilation):
    """torch's transposed convolution (the gradient of conv with respect to its input, DCGAN's and
    U-Net's upsampling): the input spread `stride` apart (zeros between), padded by
    dilation * (k - 1) - padding each side (output_padding more after), and convolved at stride 1
    with the kernel flipped and each group's in/out channels swapped. Weight [C_in, C_out / groups,
    *k]; out = (in - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1."""
    x, w = as_tensor(input), as_tensor(weight)
    if w.ndim != nd + 2:
        fail(f"{verb}: the weight must be [in_channels, out_channels / groups, {', '.join(['k'] * nd)}], got "
             f"{w.value.spec!r}")
    if x.ndim not in (nd + 1, nd + 2):
        fail(f"{verb}: input must be [N, C, {', '.join('LHW'[-nd:] if nd < 3 else 'DHW')}] or unbatched without N, "
             f"got {x.value.spec!r}")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        fail(f"{verb}: groups must be a positive int, got {groups!r}")
    C, per, ks = w.shape[0], w.shape[1], tuple(w.shape[2:])
    if x.shape[-nd - 1] != C or C % groups:
        fail(f"{verb}: input {x.value.spec!r} has {x.shape[-nd - 1]} channels, but weight {w.value.spec!r} takes "
             f"{C} (its first dim), which must divide by groups={groups}")
    stride, dilation = _spatial(verb, "stride", stride, nd), _spatial(verb, "dilation", dilation, nd)
    pads, extra = _spatial(verb, "padding", padding, nd), _spatial(verb, "output_padding", output_padding, nd)
    if min(stride) < 1 or min(dilation) < 1 or min(pads) < 0 or min(extra) < 0:
        fail(f"{verb}: stride and dilation must be >= 1, padding and output_padding >= 0, got stride={stride}, "
             f"dilation={dilation}, padding={pads}, output_padding={extra}")
    if any(e >= max(s, d) for e, s, d in zip(extra, stride, dilation)):
        fail(f"{verb}: output_padding {extra} must be smaller than either stride {stride} or dilation {dilation}, "
             "as torch's")
    batched = x.ndim == nd + 2
    x = x if batched else unsqueeze(x, 0)
    for i, s in enumerate(stride):  # (zeros between the inputs along each spatial dim)
        if s > 1 and x.shape[2 + i] > 1:
            d, L = 2 + i, x.shape[2 + i]
            spread = cat([unsqueeze(x, d + 1), zeros_like(narrow(unsqueeze(x, d + 1), d + 1, 0, 1)).expand(
                *x.shape[:d + 1], s - 1, *x.shape[d + 1:])], d + 1)
            x = narrow(reshape(spread, x.shape[:d] + (L * s,) + x.shape[d + 1:]), d, 0, (L - 1) * s + 1)
    for i, (k, d, p, e) in enumerate(zip(ks, dilation, pads, extra)):
        lo, hi = d * (k - 1) - p, d * (k - 1) - p + e
        dim = 2 + i
        if lo < 0 or hi < 0:  # (more padding than the kernel reaches: the edges cropped)
            start, end = max(-lo, 0), x.shape[dim] - max(-hi, 0)
            if end <= start:
                fail(f"{verb}: padding {pads} leaves no output for the input {list(input.shape)}; use less padding")
            x = narrow(x, dim, start, end - start)
            lo, hi = max(lo, 0), max(hi, 0)
        if lo or hi:
            widths = [0, 0] * nd
            widths[2 * (nd - 1 - i)], widths[2 * (nd - 1 - i) + 1] = lo, hi  # (F.pad: the last dim first)
            x = pad(x, widths)
    from .positions import flip

    out = per * groups
    k = reshape(w, (groups, C // groups, per) + ks)
    k = permute(k, 0, 2, 1, *range(3, nd + 3))  # (each group's [out / g, in / g, *k])
    k = flip(reshape(k, (out, C // groups) + ks), list(range(2, nd + 2)))
    y = _conv(verb, nd, x, k, bias, 1, 0, dilation, groups)
    return y if batched else squeeze(y, 0)


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """torch.nn.functional.conv_transpose1d: input [N, C_in, L], weight [C_in, C_out / groups, k]."""
    return _transposed("conv_transpose1d", 1, input, weight, bias, stride, padding, output_padding, groups, dilation)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """torch.nn.functional.conv_transpose2d: input [N, C_in, H, W], weight [C_in, C_out / groups, kh, kw]."""
    return _transposed("conv_transpose2d", 2, input, weight, bias, stride, padding, output_padding, groups, dilation)


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """torch.nn.functional.conv_transpose3d: input [N, C_in, D, H, W], weight [C_in, C_out / groups, kd, kh, kw]."""
    return _transposed("conv_transpose3d", 3, input, weight, bias, stride, padding, output_padding, groups, dilation)
