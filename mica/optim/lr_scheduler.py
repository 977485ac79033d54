"""torch.optim.lr_scheduler's common schedulers, for a torch-style loop: each sets its optimizer's
param_groups[i]["lr"] between calls (scheduler.step() after optimizer.step()), which a compiled step
reads as an input at its next call, so a schedule compiles nothing.

The learning rate after n calls of step() is torch's closed form for the schedule: the same numbers
as torch's to float64 rounding (the step takes it in float32). In a functional step, a schedule is
a function of the step count instead: mica.optim.cosine_with_warmup and the others (docs/api.md).
"""
import bisect
import math

from ..errors import MicaError


class LRScheduler:
    """torch's base: base_lrs from each group's initial_lr (set from its lr when missing), last_epoch
    counting step() calls, the first lr set at construction."""

    def __init__(self, optimizer, last_epoch=-1):
        from ..tensor import user_location

        if not getattr(optimizer, "param_groups", None):
            raise MicaError(f"{type(self).__name__} takes an optimizer made with the model's parameters (its "
                            "param_groups: the learning rates it sets)", user_location())
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        elif any("initial_lr" not in g for g in optimizer.param_groups):
            raise MicaError(f"{type(self).__name__}: last_epoch={last_epoch} resumes a schedule, which needs each "
                            "group's 'initial_lr' (load the optimizer's state_dict first)", user_location())
        self.base_lrs = [float(g["initial_lr"]) for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, base_lr, epoch, group_index):
        raise NotImplementedError

    def step(self, epoch=None):
        self.last_epoch = self.last_epoch + 1 if epoch is None else int(epoch)
        for i, group in enumerate(self.optimizer.param_groups):
            group["lr"] = self.lr_at(self.base_lrs[i], self.last_epoch, i)
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def get_last_lr(self):
        return list(self._last_lr)

    def state_dict(self):
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs), "_last_lr": list(self._last_lr)}

    def load_state_dict(self, state_dict):
        self.last_epoch = int(state_dict["last_epoch"])
        self.base_lrs = [float(b) for b in state_dict["base_lrs"]]
        self._last_lr = list(state_dict.get("_last_lr", self.base_lrs))


def _per_group(value, optimizer, what):
    values = list(value) if isinstance(value, (list, tuple)) else [value] * len(optimizer.param_groups)
    if len(values) != len(optimizer.param_groups):
        from ..tensor import user_location

        raise MicaError(f"{what}: {len(values)} given for {len(optimizer.param_groups)} param groups; give one, or "
                        "one per group", user_location())
    return values


class LambdaLR(LRScheduler):
    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.lr_lambdas = _per_group(lr_lambda, optimizer, "LambdaLR's lr_lambda")
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, i):
        return base_lr * self.lr_lambdas[i](epoch)


class MultiplicativeLR(LRScheduler):
    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.lr_lambdas = _per_group(lr_lambda, optimizer, "MultiplicativeLR's lr_lambda")
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, i):
        group = self.optimizer.param_groups[i]
        return group["lr"] * self.lr_lambdas[i](epoch) if epoch > 0 else group["lr"]


class StepLR(LRScheduler):
    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, i):
        return base_lr * self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones, self.gamma = sorted(int(m) for m in milestones), float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, i):
        return base_lr * self.gamma ** bisect.bisect_right(self.milestones, epoch)


class ExponentialLR(LRScheduler):
    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, i):
        return base_lr * self.gamma ** epoch


class CosineAnnealingLR(LRScheduler):
    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):  # noqa: N803  (torch's names)
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, i):
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class LinearLR(LRScheduler):
    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            from ..tensor import user_location

            raise MicaError("LinearLR: start_factor must be in (0, 1] and end_factor in [0, 1], as torch's",
                            user_location())
        self.start_factor, self.end_factor, self.total_iters = float(start_factor), float(end_factor), int(total_iters)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, i):
        done = min(self.total_iters, epoch) / self.total_iters if self.total_iters else 1.0
        return base_lr * (self.start_factor + (self.end_factor - self.start_factor) * done)


class ConstantLR(LRScheduler):
    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        self.factor, self.total_iters = float(factor), int(total_iters)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, i):
        return base_lr * (self.factor if epoch < self.total_iters else 1.0)


def __getattr__(name):  # (another torch scheduler: Mica's sentence, with what to do instead)
    if name.startswith("_"):
        raise AttributeError(name)
    from ..errors import MissingVerbError
    from ..tensor import user_location

    raise MissingVerbError(f"Mica has no mica.optim.lr_scheduler.{name} (torch.optim.lr_scheduler.{name}); set "
                           "param_groups[i]['lr'] between calls from your own schedule, or use LambdaLR with it",
                           user_location())
