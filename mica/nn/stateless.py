"""torch.nn's modules without parameters: activations, reshapes and losses, each one verb (its
arguments kept from the constructor, as torch's)."""
from .. import verbs as F
from .modules import Module


class _Verb(Module):
    """A module whose forward is one verb with the constructor's keyword arguments."""

    verb = None
    names = ()
    unshown = ()  # (settings torch's repr leaves out)

    def __init__(self, *args, **kwargs):
        super().__init__()
        if len(args) > len(self.names):
            raise TypeError(f"{type(self).__name__} takes at most {len(self.names)} arguments ({', '.join(self.names)})")
        settings = dict(self.defaults)
        settings.update(zip(self.names, args))
        unknown = set(kwargs) - set(settings)
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected argument(s) {sorted(unknown)}")
        settings.update(kwargs)
        self.settings = settings

    def forward(self, *inputs):
        return getattr(F, self.verb)(*inputs, **self.settings)

    def extra_repr(self):
        if type(self).__name__.endswith("Loss"):  # (torch's losses print their name alone: HuberLoss())
            return ""
        return ", ".join(f"{k}={v!r}" for k, v in self.settings.items()
                         if k not in self.unshown and (k != "inplace" or v))  # (as torch's)


def _module(name, verb, **defaults):
    return type(name, (_Verb,), {"verb": verb, "names": tuple(defaults), "defaults": defaults,
                                 "__doc__": f"torch.nn.{name}: mica.nn.functional.{verb} as a module."})


Tanh = _module("Tanh", "tanh")
Sigmoid = _module("Sigmoid", "sigmoid")
SiLU = _module("SiLU", "silu", inplace=False)
LeakyReLU = _module("LeakyReLU", "leaky_relu", negative_slope=0.01, inplace=False)
ELU = _module("ELU", "elu", alpha=1.0, inplace=False)
Softplus = _module("Softplus", "softplus", beta=1.0, threshold=20.0)
Hardtanh = _module("Hardtanh", "hardtanh", min_val=-1.0, max_val=1.0, inplace=False)
ReLU6 = _module("ReLU6", "relu6", inplace=False)
Softsign = _module("Softsign", "softsign")
LogSigmoid = _module("LogSigmoid", "logsigmoid")
GLU = _module("GLU", "glu", dim=-1)
Softmax = _module("Softmax", "softmax", dim=None)
LogSoftmax = _module("LogSoftmax", "log_softmax", dim=None)
Mish = _module("Mish", "mish", inplace=False)
Hardswish = _module("Hardswish", "hardswish", inplace=False)
Hardsigmoid = _module("Hardsigmoid", "hardsigmoid", inplace=False)
Hardswish.unshown = Hardsigmoid.unshown = ("inplace",)
SELU = _module("SELU", "selu", inplace=False)
CELU = _module("CELU", "celu", alpha=1.0, inplace=False)
Threshold = _module("Threshold", "threshold", threshold=None, value=None, inplace=False)
Tanhshrink = _module("Tanhshrink", "tanhshrink")
Softshrink = _module("Softshrink", "softshrink", lambd=0.5)
Hardshrink = _module("Hardshrink", "hardshrink", lambd=0.5)
Softmin = _module("Softmin", "softmin", dim=None)
PairwiseDistance = _module("PairwiseDistance", "pairwise_distance", p=2.0, eps=1e-6, keepdim=False)
Flatten = _module("Flatten", "flatten", start_dim=1, end_dim=-1)
PixelShuffle = _module("PixelShuffle", "pixel_shuffle", upscale_factor=2)
PixelUnshuffle = _module("PixelUnshuffle", "pixel_unshuffle", downscale_factor=2)
MSELoss = _module("MSELoss", "mse_loss", size_average=None, reduce=None, reduction="mean")
L1Loss = _module("L1Loss", "l1_loss", size_average=None, reduce=None, reduction="mean")
SmoothL1Loss = _module("SmoothL1Loss", "smooth_l1_loss", size_average=None, reduce=None, reduction="mean", beta=1.0)
HuberLoss = _module("HuberLoss", "huber_loss", reduction="mean", delta=1.0)
BCELoss = _module("BCELoss", "binary_cross_entropy", weight=None, size_average=None, reduce=None, reduction="mean")
BCEWithLogitsLoss = _module("BCEWithLogitsLoss", "binary_cross_entropy_with_logits", weight=None, size_average=None,
                            reduce=None, reduction="mean", pos_weight=None)
CrossEntropyLoss = _module("CrossEntropyLoss", "cross_entropy", weight=None, size_average=None, ignore_index=-100,
                           reduce=None, reduction="mean", label_smoothing=0.0)
NLLLoss = _module("NLLLoss", "nll_loss", weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean")
KLDivLoss = _module("KLDivLoss", "kl_div", size_average=None, reduce=None, reduction="mean", log_target=False)
MarginRankingLoss = _module("MarginRankingLoss", "margin_ranking_loss", margin=0.0, size_average=None, reduce=None,
                            reduction="mean")
HingeEmbeddingLoss = _module("HingeEmbeddingLoss", "hinge_embedding_loss", margin=1.0, size_average=None, reduce=None,
                             reduction="mean")
SoftMarginLoss = _module("SoftMarginLoss", "soft_margin_loss", size_average=None, reduce=None, reduction="mean")
CosineEmbeddingLoss = _module("CosineEmbeddingLoss", "cosine_embedding_loss", margin=0.0, size_average=None,
                              reduce=None, reduction="mean")
TripletMarginLoss = _module("TripletMarginLoss", "triplet_margin_loss", margin=1.0, p=2.0, eps=1e-6, swap=False,
                            size_average=None, reduce=None, reduction="mean")
GaussianNLLLoss = _module("GaussianNLLLoss", "gaussian_nll_loss", full=False, eps=1e-6, reduction="mean")
PoissonNLLLoss = _module("PoissonNLLLoss", "poisson_nll_loss", log_input=True, full=False, size_average=None,
                         eps=1e-8, reduce=None, reduction="mean")
MultiLabelSoftMarginLoss = _module("MultiLabelSoftMarginLoss", "multilabel_soft_margin_loss", weight=None,
                                   size_average=None, reduce=None, reduction="mean")
MultiMarginLoss = _module("MultiMarginLoss", "multi_margin_loss", p=1, margin=1.0, weight=None, size_average=None,
                          reduce=None, reduction="mean")
CosineSimilarity = _module("CosineSimilarity", "cosine_similarity", dim=1, eps=1e-8)


class Unflatten(Module):
    def __init__(self, dim, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x):
        return F.unflatten(x, self.dim, self.unflattened_size)
