"""torch.utils's pieces a model's code calls: checkpoint (activation checkpointing) and data
(datasets, samplers and a DataLoader)."""
from . import checkpoint  # noqa: F401
from . import data  # noqa: F401


def __getattr__(name):
    if name.startswith("_"):
        raise AttributeError(name)
    from ..errors import missing_verb

    raise missing_verb("mica.utils.", name, "torch.utils.")
