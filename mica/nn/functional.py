"""`import mica.nn.functional as F`, as one writes torch.nn.functional: the same verbs as `mica.`."""
from ..verbs import (  # noqa: F401
    cross_entropy, dropout, embedding, gelu, layer_norm, linear, log_softmax, nll_loss, pad, relu, rms_norm,
    scaled_dot_product_attention, sigmoid, silu, softmax, tanh,
)


def __getattr__(name):
    if name.startswith("_"):
        raise AttributeError(name)
    from ..errors import missing_verb

    raise missing_verb("mica.nn.functional.", name, "torch.nn.functional.")
