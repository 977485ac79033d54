"""The verbs, named and behaving as PyTorch's torch / torch.Tensor / torch.nn.functional ones."""
from .core import *  # noqa: F401,F403
from .core import abs, max, min, pow, sum  # noqa: F401  (shadow builtins on purpose)
from .nn import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
from .positions import *  # noqa: F401,F403
from .activations import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .resample import *  # noqa: F401,F403
from .losses import *  # noqa: F401,F403
from .sampling import *  # noqa: F401,F403
from .shape import slice_, pad_into, sum_to, getitem, setitem  # noqa: F401
from .core import canon_dim, as_tensor, const, is_scalar, result_type  # noqa: F401
