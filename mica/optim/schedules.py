"""Learning-rate schedules as scalar functions of the step counter. Given a Python number they
return a Python float; given a traced step they return a float64 Tensor computed in the step."""
import math

from .. import dtypes, verbs as F
from ..tensor import Tensor


def cosine_with_warmup(it, learning_rate, warmup_iters, lr_decay_iters, min_lr):
    """nanoGPT's get_lr: linear warmup from lr/(warmup+1), cosine to min_lr, then min_lr."""
    if not isinstance(it, Tensor):
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        decay_ratio = (it - warmup_iters) / _span(warmup_iters, lr_decay_iters)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (learning_rate - min_lr)
    t = F.to(it, dtypes.float64)
    warm = learning_rate * (t + 1) / (warmup_iters + 1)
    span = _span(warmup_iters, lr_decay_iters)
    decay_ratio = (t - warmup_iters) / span
    cosine = min_lr + 0.5 * (1.0 + F.cos(math.pi * decay_ratio)) * (learning_rate - min_lr)
    return F.where(t < warmup_iters, warm, F.where(t > lr_decay_iters, F.as_tensor(float(min_lr), dtypes.float64),
                                                   cosine))


def _span(warmup_iters, lr_decay_iters):
    """get_lr's divisor (lr_decay_iters - warmup_iters); 1 where nanoGPT's would be zero or negative,
    which only a step its other branches catch first could reach."""
    span = lr_decay_iters - warmup_iters
    return span if span > 0 else 1


def stable_then_decay(step, train_steps, cooldown_frac=0.7):
    """The speedrun's multiplier: 1 for the first (1 - cooldown_frac) of training, then linear to 0."""
    if not isinstance(step, Tensor):
        progress = step / train_steps
        return 1.0 if progress < 1 - cooldown_frac else (1 - progress) / cooldown_frac
    progress = F.to(step, dtypes.float64) / train_steps
    return F.where(progress < 1 - cooldown_frac, F.as_tensor(1.0, dtypes.float64), (1 - progress) / cooldown_frac)


def cosine(step, total_steps, base_lr, min_lr=0.0):
    """Cosine decay from base_lr at step 0 to min_lr at total_steps (no warmup)."""
    if not isinstance(step, Tensor):
        return min_lr + 0.5 * (1 + math.cos(math.pi * step / total_steps)) * (base_lr - min_lr)
    t = F.to(step, dtypes.float64)
    return min_lr + 0.5 * (1 + F.cos(t * (math.pi / total_steps))) * (base_lr - min_lr)
