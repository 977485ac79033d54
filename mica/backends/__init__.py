"""Backends turn a Program into results: `reference` interprets it in numpy (the oracle)."""


class Switches:
    """A group of torch.backends' switches (torch.backends.cuda.matmul, torch.backends.cudnn): the
    ones named here can be read and set to True or False; any other is a sentence."""

    def __init__(self, where, meaning, **defaults):
        object.__setattr__(self, "_where", where)
        object.__setattr__(self, "_meaning", meaning)
        object.__setattr__(self, "_values", dict(defaults))

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._values:
            return self._values[name]
        raise _switch(f"{self._where}.{name}")

    def __setattr__(self, name, value):
        from ..errors import MicaError
        from ..tensor import user_location

        if name not in self._values:
            raise _switch(f"{self._where}.{name}")
        if not isinstance(value, bool):
            raise MicaError(f"{self._where.replace('torch.', 'mica.')}.{name} is True or False, not {value!r}",
                            user_location())
        self._values[name] = value

    def __repr__(self):
        return f"<{self._where.replace('torch.', 'mica.')}: {self._meaning}>"


# torch's defaults: TF32 products off (torch.backends.cuda.matmul.allow_tf32, since torch 1.12), cuDNN's
# switches on; Mica has no convolutions, so cudnn's are kept and change nothing
cudnn = Switches("torch.backends.cudnn", "Mica has no convolutions: kept, changing nothing", allow_tf32=True,
                 benchmark=False, deterministic=False, enabled=True)


class _Absent:
    """torch.backends.mps (and mkldnn, openmp...): whether a device or library is there, asked by a
    script choosing its device (the DQN tutorial's `"mps" if torch.backends.mps.is_available()`):
    Mica trains on the CPU and on NVIDIA cards, so the answer is no."""

    def __init__(self, where):
        self._where = where

    def is_available(self):
        return False

    def is_built(self):
        return False

    def __repr__(self):
        return f"<{self._where}: not in Mica>"


mps = _Absent("mica.backends.mps")


def tf32_allowed():
    """torch.backends.cuda.matmul.allow_tf32 (or set_float32_matmul_precision("high")): the CUDA
    target's tf32 where a program does not choose it."""
    from .cuda import matmul

    return matmul.allow_tf32


def set_float32_matmul_precision(precision):
    """torch's: "highest" keeps float32 products in float32; "high" and "medium" permit TF32 on an
    NVIDIA card (the CUDA target's default tf32; the CPU computes in float32 either way)."""
    from ..errors import MicaError
    from ..tensor import user_location
    from .cuda import matmul

    if precision not in ("highest", "high", "medium"):
        raise MicaError(f"set_float32_matmul_precision takes 'highest', 'high' or 'medium', not {precision!r}",
                        user_location())
    matmul.allow_tf32 = precision != "highest"


def get_float32_matmul_precision():
    from .cuda import matmul

    return "high" if matmul.allow_tf32 else "highest"


def __getattr__(name):  # (torch.backends.cuda.matmul.allow_tf32 = ...: torch's switches)
    if name == "cuda":
        import importlib

        return importlib.import_module(".cuda", __name__)
    if name.startswith("_"):
        raise AttributeError(name)
    raise _switch(f"torch.backends.{name}")


def _switch(what):
    from ..errors import MissingVerbError
    from ..tensor import user_location

    return MissingVerbError(f"Mica has no {what.replace('torch.', 'mica.')} ({what}): of torch's switches Mica has "
                            "mica.backends.cuda.matmul.allow_tf32 (TF32 products on a card; also per program: "
                            "mica.compile(..., target='cuda', tf32=True), mica train --tf32) and cudnn's, which "
                            "change nothing; drop the line", user_location())
