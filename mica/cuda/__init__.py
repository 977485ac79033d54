"""torch.cuda's questions, answered for Mica: torch code asks them to choose a device and a dtype
(nanoGPT: `torch.cuda.is_available() and torch.cuda.is_bf16_supported()`). Mica's programs run
where they are compiled for (`mica.compile(..., target="cuda")`, `mica train --device=cuda`); these
say whether this machine has an NVIDIA card its CUDA programs can run on."""
from . import amp  # noqa: F401  (torch.cuda.amp: autocast and GradScaler with its signatures)


def is_available():
    """Whether an NVIDIA GPU and its driver are usable here."""
    from ..backends.cuda.build import unusable

    return unusable() is None


def device_count():
    return 1 if is_available() else 0


def is_bf16_supported(including_emulation=True):
    return is_available()


def synchronize(device=None):
    """(Mica's calls return when their work is done.)"""


def manual_seed(seed):
    from ..random import manual_seed as seed_all

    seed_all(seed)


manual_seed_all = manual_seed


def __getattr__(name):  # (another torch.cuda function: Mica's sentence)
    if name.startswith("_"):
        raise AttributeError(name)
    from ..errors import missing_verb

    raise missing_verb("mica.cuda.", name, "torch.cuda.")
