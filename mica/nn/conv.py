"""torch.nn.Conv1d, Conv2d and Conv3d: torch's parameters (weight [out, in / groups, *kernel_size],
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
        text = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}")
        if self.padding != (0,) * self.nd:  # (torch's: a string always, unquoted)
            text += f", padding={self.padding}"
        if self.dilation != (1,) * self.nd:
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text + (", bias=False" if self.bias is None else "")


class Conv1d(_ConvNd):
    nd = 1


class Conv2d(_ConvNd):
    nd = 2


class Conv3d(_ConvNd):
    nd = 3
