"""torch.optim.swa_utils: an averaged copy of a model (stochastic weight averaging, or an
exponential moving average: `AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))`), the
SWALR schedule, and update_bn, which recomputes a model's batch-norm statistics over a loader.

The averaging is torch's arithmetic on the CPU, written with the verbs, so its values are torch's
bits: the default (SWA) average `avg + (p - avg) / (n + 1)` per tensor, the EMA forms a lerp with
weight 1 - decay (torch's `_foreach_lerp_`). update_parameters() runs between calls of a compiled
step, as torch's loop calls it; the averaged copy is a module of its own, which a compiled
evaluation reads as it reads any model.
"""
import copy
import itertools
import math

from ..errors import MicaError
from ..nn.modules import Module
from .lr_scheduler import LRScheduler, _per_group


def get_ema_multi_avg_fn(decay=0.999):
    """torch's: an exponential moving average over lists of tensors, in place."""

    def ema_update(ema_param_list, current_param_list, _):
        from .. import _foreach_lerp_, is_floating_point, no_grad

        with no_grad():
            if is_floating_point(ema_param_list[0]):
                _foreach_lerp_(ema_param_list, current_param_list, 1 - decay)
            else:
                for p_ema, p_model in zip(ema_param_list, current_param_list):
                    p_ema.copy_(p_ema * decay + p_model * (1 - decay))
    return ema_update


def get_swa_multi_avg_fn():
    """torch's: the running equal-weight average over lists of tensors, in place."""

    def swa_update(averaged_param_list, current_param_list, num_averaged):
        from .. import _foreach_lerp_, is_floating_point, no_grad

        with no_grad():
            if is_floating_point(averaged_param_list[0]):
                _foreach_lerp_(averaged_param_list, current_param_list, 1 / (float(num_averaged) + 1))
            else:
                for p_avg, p_model in zip(averaged_param_list, current_param_list):
                    p_avg.add_((p_model - p_avg) / (num_averaged + 1))
    return swa_update


def get_ema_avg_fn(decay=0.999):
    """torch's: one tensor's exponential moving average, a new tensor."""

    def ema_update(ema_param, current_param, num_averaged):
        return decay * ema_param + (1 - decay) * current_param
    return ema_update


def get_swa_avg_fn():
    """torch's: one tensor's running equal-weight average, a new tensor."""

    def swa_update(averaged_param, current_param, num_averaged):
        return averaged_param + (current_param - averaged_param) / (num_averaged + 1)
    return swa_update


class AveragedModel(Module):
    """torch's AveragedModel: `module`, a deep copy of the model whose parameters (and, with
    use_buffers=True, buffers) update_parameters(model) averages; n_averaged, a buffer, counts the
    updates (the first copies the model). forward() is the copy's."""

    def __init__(self, model, device=None, avg_fn=None, multi_avg_fn=None, use_buffers=False):
        from .. import int64, tensor
        from ..tensor import user_location

        super().__init__()
        if not isinstance(model, Module):
            raise MicaError(f"AveragedModel takes a module (an nn.Module), got a {type(model).__name__}",
                            user_location())
        self.module = copy.deepcopy(model)
        self.register_buffer("n_averaged", tensor(0, dtype=int64))
        self.avg_fn, self.multi_avg_fn, self.use_buffers = avg_fn, multi_avg_fn, use_buffers

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _pairs(self, model):
        if self.use_buffers:
            mine = list(itertools.chain(self.module.parameters(), self.module.buffers()))
            theirs = list(itertools.chain(model.parameters(), model.buffers()))
        else:
            mine, theirs = list(self.parameters()), list(model.parameters())
        if len(mine) != len(theirs):
            from ..tensor import user_location

            raise MicaError(f"AveragedModel.update_parameters: the model holds {len(theirs)} "
                            f"{'tensors' if self.use_buffers else 'parameters'} where the averaged copy holds "
                            f"{len(mine)}; pass the model the average was made from", user_location())
        return mine, theirs

    def update_parameters(self, model):
        """torch's: the first call copies the model's values, each later one averages them in."""
        import numpy as np

        from .. import no_grad, where
        from ..tensor import Tensor

        mine, theirs = self._pairs(model)
        averaged = [p.detach() for p in mine]
        current = [p.detach() for p in theirs]
        n = self.n_averaged
        with no_grad():
            traced = isinstance(n, Tensor)  # (in a compiled step: the average, then the model's values where n is 0)
            if not traced and int(np.asarray(n)) == 0:
                for a, c in zip(averaged, current):
                    a.copy_(c)
            elif self.multi_avg_fn is not None or self.avg_fn is None:
                for kind in _by_type(averaged, current):  # (torch groups the lists by type before the call)
                    a, c = [averaged[i] for i in kind], [current[i] for i in kind]
                    if self.multi_avg_fn is not None:
                        self.multi_avg_fn(a, c, n)
                    else:  # (on the CPU torch's default is the per-tensor SWA average, not its foreach form)
                        swa = get_swa_avg_fn()
                        for x, y in zip(a, c):
                            x.copy_(swa(x, y, n))
            else:
                for a, c in zip(averaged, current):
                    a.copy_(self.avg_fn(a, c, n))
            if traced:
                first = n == 0
                for a, c in zip(averaged, current):
                    a.copy_(where(first, c, a))
            if not self.use_buffers:  # (the buffers follow the model's, as torch's)
                for b_avg, b_model in zip(self.module.buffers(), model.buffers()):
                    b_avg.detach().copy_(b_model.detach())
        self.n_averaged += 1


def _by_type(averaged, current):
    """The positions of the pairs, grouped by their element types in first-seen order (torch's
    _group_tensors_by_device_and_dtype, on one device)."""
    groups = {}
    for i, (a, c) in enumerate(zip(averaged, current)):
        groups.setdefault((str(a.dtype), str(c.dtype)), []).append(i)
    return list(groups.values())


def update_bn(loader, model, device=None):
    """torch's: reset every batch norm's running statistics and recompute them as a cumulative
    average over the loader's inputs (a batch's first element where it is a list or tuple), the
    model in training mode, its mode and momenta restored after."""
    from .. import no_grad
    from ..nn.modules import _BatchNorm

    momenta = {}
    for module in model.modules():
        if isinstance(module, _BatchNorm):
            module.reset_running_stats()
            momenta[module] = module.momentum
    if not momenta:
        return
    was_training = model.training
    model.train()
    for module in momenta:
        module.momentum = None
    with no_grad():
        for batch in loader:
            if isinstance(batch, (list, tuple)):
                batch = batch[0]
            model(batch)
    for module, momentum in momenta.items():
        module.momentum = momentum
    model.train(was_training)


class SWALR(LRScheduler):
    """torch's SWALR: anneals each group's rate from its current value to its swa_lr over
    anneal_epochs steps ("cos" or "linear"), then holds it."""

    def __init__(self, optimizer, swa_lr, anneal_epochs=10, anneal_strategy="cos", last_epoch=-1):
        from ..tensor import user_location

        for value, group in zip(_per_group(swa_lr, optimizer, "SWALR's swa_lr"), optimizer.param_groups):
            group["swa_lr"] = value
        if anneal_strategy not in ("cos", "linear"):
            raise MicaError(f"SWALR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}",
                            user_location())
        if not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise MicaError(f"SWALR: anneal_epochs must be an int >= 0, got {anneal_epochs!r}", user_location())
        self._anneal_strategy, self.anneal_epochs = anneal_strategy, anneal_epochs  # (torch's attribute names:
        super().__init__(optimizer, last_epoch)                                      # its state_dict's keys)

    def anneal_func(self, t):
        return (1 - math.cos(math.pi * t)) / 2 if self._anneal_strategy == "cos" else t

    @staticmethod
    def _get_initial_lr(lr, swa_lr, alpha):
        return swa_lr if alpha == 1 else (lr - alpha * swa_lr) / (1 - alpha)

    def get_lr(self):
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        prev_alpha = self.anneal_func(max(0, min(1, (step - 1) / max(1, self.anneal_epochs))))
        prev = [self._get_initial_lr(g["lr"], g["swa_lr"], prev_alpha) for g in self.optimizer.param_groups]
        alpha = self.anneal_func(max(0, min(1, step / max(1, self.anneal_epochs))))
        return [g["swa_lr"] * alpha + lr * (1 - alpha) for g, lr in zip(self.optimizer.param_groups, prev)]
