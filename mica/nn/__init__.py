"""Modules, parameters and initializers, named as torch.nn's."""
from . import functional, init  # noqa: F401
from .modules import (  # noqa: F401
    GELU, Dropout, Embedding, Identity, LayerNorm, Linear, Module, ModuleDict, ModuleList, Parameter, ReLU,
    RMSNorm, Sequential, functional_call,
)
