"""Optimizers, gradient clipping and schedules, built from the verbs so they compile into the step."""
from .adamw import Adam, AdamW, adamw, nanogpt_param_groups  # noqa: F401
from .base import Optimizer  # noqa: F401
from .clip import clip_grad_norm  # noqa: F401
from .muon import QUINTIC_COEFFICIENTS, SEED_COEFFICIENTS, Muon, muon, zeropower_via_newtonschulz  # noqa: F401
from .schedules import cosine, cosine_with_warmup, stable_then_decay  # noqa: F401
from .sgd import SGD, sgd  # noqa: F401
from .rmsprop import RMSprop  # noqa: F401
from .adagrad import Adagrad  # noqa: F401
from .nadam import NAdam, RAdam  # noqa: F401
from .adamax import Adadelta, Adamax  # noqa: F401
from .combined import Optimizers  # noqa: F401
from . import lr_scheduler  # noqa: F401,E402  (torch's schedulers over param_groups, for a torch-style loop)
from . import swa_utils  # noqa: F401,E402  (torch's averaged model: SWA and EMA copies)


def __getattr__(name):  # (an optimizer or helper torch.optim has and Mica does not: one sentence)
    if name.startswith("_"):
        raise AttributeError(name)
    from ..errors import missing_verb

    raise missing_verb("mica.optim.", name, "torch.optim.")
