"""torch.nn.Conv1d, Conv2d and Conv3d (and the parameterless pools and resamplers, MaxPool1d/2d, AvgPool1d/2d,
AdaptiveAvgPool1d/2d/3d, Upsample, UpsamplingNearest2d/Bilinear2d): torch's parameters (weight [out, in / groups, *kernel_size],
bias [out]), their default init (U(+-1/sqrt(fan_in)), fan_in = in / groups * prod(kernel_size)) and
forward (F.conv1d / conv2d / conv3d, mica/verbs/conv.py). padding_mode other than 'zeros' is a
sentence (Mica's F.pad pads with a constant)."""
import math

from .. import verbs as F
from ..errors import MicaError
from ..tensor import user_location
from . import init as initializers
from .modules import Module, Parameter, _device


class _ConvNd(Module):
    nd = None

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        _device(device)
        name = type(self).__name__
        if padding_mode != "zeros":
            raise MicaError(f"{name}: padding_mode={padding_mode!r} is not supported (Mica pads with zeros); pad the "
                            "input yourself and use padding=0", user_location())
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise MicaError(f"{name}: in_channels ({in_channels}) and out_channels ({out_channels}) must divide by "
                            f"groups ({groups})", user_location())
        tup = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,) * self.nd  # noqa: E731
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.dilation = tup(kernel_size), tup(stride), tup(dilation)
        self.padding = padding if isinstance(padding, str) else tup(padding)
        self.padding_mode = padding_mode
        self.transposed, self.output_padding = False, (0,) * self.nd  # (torch's _ConvNd has them)
        if isinstance(padding, str) and padding not in ("valid", "same"):
            raise MicaError(f"{name}: padding must be 'valid', 'same', an int or a tuple, got {padding!r}",
                            user_location())
        if padding == "same" and any(s != 1 for s in self.stride):
            raise MicaError(f"{name}: padding='same' needs stride 1 (as torch's), got stride={self.stride}",
                            user_location())
        fan_in = in_channels // groups * math.prod(self.kernel_size)
        self.weight = Parameter(shape=(out_channels, in_channels // groups) + self.kernel_size, dtype=dtype,
                                init=initializers.fan_in_uniform(fan_in))
        self.bias = Parameter(shape=(out_channels,), dtype=dtype,
                              init=initializers.fan_in_uniform(fan_in)) if bias else None

    def forward(self, input):
        conv = getattr(F, f"conv{self.nd}d")
        return conv(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self):
        return _conv_repr(self)


def _conv_repr(m):
    """torch's _ConvNd.extra_repr, for the convolutions and the transposed ones: what differs from
    the defaults (a string padding always, unquoted)."""
    text = f"{m.in_channels}, {m.out_channels}, kernel_size={m.kernel_size}, stride={m.stride}"
    if m.padding != (0,) * m.nd:
        text += f", padding={m.padding}"
    if m.dilation != (1,) * m.nd:
        text += f", dilation={m.dilation}"
    if m.output_padding != (0,) * m.nd:
        text += f", output_padding={m.output_padding}"
    if m.groups != 1:
        text += f", groups={m.groups}"
    return text + (", bias=False" if m.bias is None else "")


class Conv1d(_ConvNd):
    nd = 1


class Conv2d(_ConvNd):
    nd = 2


class Conv3d(_ConvNd):
    nd = 3


class _ConvTransposeNd(Module):
    """torch.nn.ConvTranspose1d/2d/3d: weight [in_channels, out_channels / groups, *k] (torch's layout
    and init: its fan-in is out_channels / groups * prod(k)); forward(input, output_size=None), the
    output_size picking output_padding as torch's."""
    nd = None

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        _device(device)
        name = type(self).__name__
        if padding_mode != "zeros":
            raise MicaError(f"{name}: only padding_mode='zeros' is supported, as torch's transposed convolutions",
                            user_location())
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise MicaError(f"{name}: in_channels ({in_channels}) and out_channels ({out_channels}) must divide by "
                            f"groups ({groups})", user_location())
        tup = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,) * self.nd  # noqa: E731
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.padding = tup(kernel_size), tup(stride), tup(padding)
        self.output_padding, self.dilation = tup(output_padding), tup(dilation)
        self.padding_mode, self.transposed = padding_mode, True
        fan_in = out_channels // groups * math.prod(self.kernel_size)
        self.weight = Parameter(shape=(in_channels, out_channels // groups) + self.kernel_size, dtype=dtype,
                                init=initializers.fan_in_uniform(fan_in))
        self.bias = Parameter(shape=(out_channels,), dtype=dtype,
                              init=initializers.fan_in_uniform(fan_in)) if bias else None

    def _output_padding(self, input, output_size):
        if output_size is None:
            return self.output_padding
        sizes = list(output_size)[-self.nd:]
        spatial = tuple(input.shape)[-self.nd:]
        out = []
        for n, size, s, p, d, k in zip(spatial, sizes, self.stride, self.padding, self.dilation, self.kernel_size):
            least = (n - 1) * s - 2 * p + d * (k - 1) + 1
            if not least <= int(size) < least + s:
                raise MicaError(f"{type(self).__name__}: output_size {list(output_size)} is not reachable from the "
                                f"input {list(input.shape)}: each size must be in [{least}, {least + s - 1}] here",
                                user_location())
            out.append(int(size) - least)
        return tuple(out)

    def forward(self, input, output_size=None):
        conv = getattr(F, f"conv_transpose{self.nd}d")
        return conv(input, self.weight, self.bias, self.stride, self.padding, self._output_padding(input, output_size),
                    self.groups, self.dilation)

    def extra_repr(self):
        return _conv_repr(self)


class ConvTranspose1d(_ConvTransposeNd):
    nd = 1


class ConvTranspose2d(_ConvTransposeNd):
    nd = 2


class ConvTranspose3d(_ConvTransposeNd):
    nd = 3


class _Pool(Module):
    """A pool's settings, kept as torch's module keeps them (its repr too); forward is the verb's."""

    verb, keys = None, ()

    def __init__(self, kernel_size, stride=None, padding=0, *rest, **settings):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride if stride is not None else kernel_size, padding
        for key, value in zip(self.keys, rest):
            settings.setdefault(key, value)
        defaults = dict(self.defaults)
        unknown = set(settings) - set(defaults)
        if unknown:
            raise MicaError(f"{type(self).__name__}: unknown setting(s) {sorted(unknown)}; known: kernel_size, stride, "
                            f"padding, {', '.join(defaults)}", user_location())
        for key, value in {**defaults, **settings}.items():
            setattr(self, key, value)

    def forward(self, input):
        kw = {k: getattr(self, k) for k in self.defaults}
        return getattr(F, self.verb)(input, self.kernel_size, self.stride, self.padding, **kw)

    def extra_repr(self):
        return ", ".join(f"{k}={getattr(self, k)}" for k in ("kernel_size", "stride", "padding", *self.repr_keys))


class MaxPool1d(_Pool):
    verb, keys = "max_pool1d", ("dilation", "return_indices", "ceil_mode")
    defaults = {"dilation": 1, "return_indices": False, "ceil_mode": False}
    repr_keys = ("dilation", "ceil_mode")


class MaxPool2d(MaxPool1d):
    verb = "max_pool2d"


class AvgPool1d(_Pool):
    verb, keys = "avg_pool1d", ("ceil_mode", "count_include_pad")
    defaults = {"ceil_mode": False, "count_include_pad": True}
    repr_keys = ()

    def __init__(self, *args, **settings):
        super().__init__(*args, **settings)
        one = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,)  # noqa: E731  (torch's _single)
        self.kernel_size, self.stride, self.padding = one(self.kernel_size), one(self.stride), one(self.padding)


class AvgPool2d(_Pool):
    verb, keys = "avg_pool2d", ("ceil_mode", "count_include_pad", "divisor_override")
    defaults = {"ceil_mode": False, "count_include_pad": True, "divisor_override": None}
    repr_keys = ()


class AdaptiveAvgPool1d(Module):
    """torch.nn.AdaptiveAvgPool1d: F.adaptive_avg_pool1d to output_size."""

    verb = "adaptive_avg_pool1d"

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return getattr(F, self.verb)(x, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


class AdaptiveAvgPool2d(AdaptiveAvgPool1d):
    verb = "adaptive_avg_pool2d"


class AdaptiveAvgPool3d(AdaptiveAvgPool1d):
    verb = "adaptive_avg_pool3d"


class Upsample(Module):
    """torch.nn.Upsample: F.interpolate with the module's size or scale_factor, mode and align_corners."""

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None):
        super().__init__()
        self.name = type(self).__name__
        self.size = size
        if isinstance(scale_factor, (tuple, list)):
            self.scale_factor = tuple(float(s) for s in scale_factor)
        else:
            self.scale_factor = float(scale_factor) if scale_factor else None
        self.mode, self.align_corners, self.recompute_scale_factor = mode, align_corners, recompute_scale_factor

    def forward(self, input):
        return F.interpolate(input, self.size, self.scale_factor, self.mode, self.align_corners,
                             recompute_scale_factor=self.recompute_scale_factor)

    def extra_repr(self):
        info = f"scale_factor={self.scale_factor!r}" if self.scale_factor is not None else f"size={self.size!r}"
        return f"{info}, mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    """torch.nn.UpsamplingNearest2d: Upsample, nearest."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    """torch.nn.UpsamplingBilinear2d: Upsample, bilinear with aligned corners."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)
