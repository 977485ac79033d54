"""Modules, parameters and initializers, named as torch.nn's."""
from . import functional, init, utils  # noqa: F401
from .modules import (  # noqa: F401
    BatchNorm1d, BatchNorm2d, BatchNorm3d, DataParallel, InstanceNorm1d, InstanceNorm2d, InstanceNorm3d, EmbeddingBag, GELU, Dropout, Dropout1d, Dropout2d, Dropout3d, Embedding, GroupNorm, Identity, LayerNorm, Linear, Module, ModuleDict, ModuleList, Parameter, ParameterDict,
    ParameterList, PReLU, ReLU, RMSNorm, Sequential, functional_call,
)
from .conv import (  # noqa: F401
    AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d, AvgPool1d, AvgPool2d, Conv1d, Conv2d, Conv3d,
    ConvTranspose1d, ConvTranspose2d, ConvTranspose3d, MaxPool1d,
    MaxPool2d, Upsample, UpsamplingBilinear2d, UpsamplingNearest2d,
)
from .padding import (  # noqa: F401
    CircularPad1d, CircularPad2d, CircularPad3d, ConstantPad1d, ConstantPad2d, ConstantPad3d, ReflectionPad1d,
    ReflectionPad2d, ReflectionPad3d, ReplicationPad1d, ReplicationPad2d, ReplicationPad3d, ZeroPad1d, ZeroPad2d,
    ZeroPad3d,
)
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase  # noqa: F401
from .transformer import (  # noqa: F401
    MultiheadAttention, Transformer, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder,
    TransformerEncoderLayer,
)
from .stateless import (  # noqa: F401
    CELU, ELU, GLU, SELU, BCELoss, BCEWithLogitsLoss, CosineSimilarity, CrossEntropyLoss, Flatten, Hardshrink,
    Hardsigmoid, Hardswish, Hardtanh, HuberLoss, KLDivLoss, L1Loss, LeakyReLU, LogSigmoid, LogSoftmax, Mish, MSELoss,
    NLLLoss, PairwiseDistance, PixelShuffle, PixelUnshuffle, ReLU6, Sigmoid, SiLU, SmoothL1Loss, Softmax, Softmin, Softplus, Softshrink,
    Softsign, Tanh, Tanhshrink, Threshold, Unflatten, MarginRankingLoss, HingeEmbeddingLoss, SoftMarginLoss,
    CosineEmbeddingLoss, TripletMarginLoss, GaussianNLLLoss, PoissonNLLLoss, MultiLabelSoftMarginLoss, MultiMarginLoss,
)


def __getattr__(name):  # (a module or helper torch.nn has and Mica does not: one sentence)
    if name.startswith("_"):
        raise AttributeError(name)
    from ..errors import missing_verb

    raise missing_verb("mica.nn.", name, "torch.nn.")
