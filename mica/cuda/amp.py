"""torch.cuda.amp's names with torch.cuda.amp's signatures: `autocast(enabled=True, dtype=float16,
cache_enabled=True)` is mica.autocast("cuda", ...) (the card's op lists, float16 unless told), and
`GradScaler(init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
enabled=True)` is mica.amp.GradScaler("cuda", ...): code written for torch.cuda.amp keeps its
precision and its positional arguments."""
from .. import amp as _amp
from .. import dtypes


class autocast(_amp.autocast):  # noqa: N801  (PyTorch's name)
    def __init__(self, enabled=True, dtype=dtypes.float16, cache_enabled=True):
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(_amp.GradScaler):
    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 enabled=True):
        super().__init__("cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled)
