"""Modules, parameters and initializers, named as torch.nn's."""
from . import functional, init, utils  # noqa: F401
from .modules import (  # noqa: F401
    GELU, Dropout, Embedding, Identity, LayerNorm, Linear, Module, ModuleDict, ModuleList, Parameter, ReLU,
    RMSNorm, Sequential, functional_call,
)
from .stateless import (  # noqa: F401
    ELU, GLU, BCELoss, BCEWithLogitsLoss, CosineSimilarity, CrossEntropyLoss, Flatten, Hardtanh, HuberLoss, KLDivLoss,
    L1Loss, LeakyReLU, LogSigmoid, LogSoftmax, MSELoss, NLLLoss, ReLU6, Sigmoid, SiLU, SmoothL1Loss, Softmax, Softplus,
    Softsign, Tanh, Unflatten,
)


def __getattr__(name):  # (a module or helper torch.nn has and Mica does not: one sentence)
    if name.startswith("_"):
        raise AttributeError(name)
    from ..errors import missing_verb

    raise missing_verb("mica.nn.", name, "torch.nn.")
