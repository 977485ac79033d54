"""torch.nn's padding modules (ReflectionPad2d, ReplicationPad1d, ZeroPad2d, ConstantPad3d,
CircularPad2d, ...): F.pad with the module's counts, mode and value. An int pads every side of the
module's dims by it; a tuple is F.pad's (left, right, top, bottom, front, back)."""
from .. import verbs as F
from ..errors import MicaError
from ..tensor import user_location
from .modules import Module


class _Pad(Module):
    mode, dims = "constant", 1

    def __init__(self, padding, value=0.0):
        super().__init__()
        if isinstance(padding, int) and not isinstance(padding, bool):
            padding = (padding,) * (2 * self.dims)
        padding = tuple(padding) if isinstance(padding, (tuple, list)) else None
        if padding is None or len(padding) != 2 * self.dims or not all(isinstance(p, int) for p in padding):
            raise MicaError(f"{type(self).__name__} takes an int or {2 * self.dims} ints (torch's order: the last dim's "
                            f"two sides first), got {padding!r}", user_location())
        self.padding = padding
        if self.mode == "constant":
            self.value = value

    def forward(self, input):
        return F.pad(input, self.padding, self.mode, self.value if self.mode == "constant" else None)

    def extra_repr(self):
        if self.mode == "constant" and not isinstance(self, _ZeroPad):  # (torch's reprs)
            return f"padding={self.padding}, value={self.value}"
        return f"{self.padding}"


def _family(mode, base_name):
    made = []
    for dims in (1, 2, 3):
        made.append(type(f"{base_name}{dims}d", (_Pad,), {"mode": mode, "dims": dims, "__module__": __name__}))
    return made


ReflectionPad1d, ReflectionPad2d, ReflectionPad3d = _family("reflect", "ReflectionPad")
ReplicationPad1d, ReplicationPad2d, ReplicationPad3d = _family("replicate", "ReplicationPad")
CircularPad1d, CircularPad2d, CircularPad3d = _family("circular", "CircularPad")
ConstantPad1d, ConstantPad2d, ConstantPad3d = _family("constant", "ConstantPad")


class _ZeroPad(_Pad):
    def __init__(self, padding):
        super().__init__(padding, 0.0)


ZeroPad1d, ZeroPad2d, ZeroPad3d = (type(f"ZeroPad{d}d", (_ZeroPad,), {"dims": d, "__module__": __name__})
                                   for d in (1, 2, 3))
