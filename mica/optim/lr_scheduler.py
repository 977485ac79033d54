"""torch.optim.lr_scheduler's common schedulers, for a torch-style loop: each sets its optimizer's
param_groups[i]["lr"] between calls (scheduler.step() after optimizer.step()), which a compiled step
reads as an input at its next call, so a schedule compiles nothing.

Each step() computes torch's way, from the groups' current rates (torch's get_lr): so two schedulers
on one optimizer compose, and a rate set by hand in param_groups is carried on, as torch's are;
step(epoch), which torch deprecates, takes the schedule's closed form where torch has one. In a
functional step, a schedule is a function of the step count instead: mica.optim.cosine_with_warmup
and the others (docs/api.md).
"""
import collections
import math

from ..errors import MicaError


class LRScheduler:
    """torch's base: base_lrs from each group's initial_lr (set from its lr when missing), last_epoch
    counting step() calls, the first step taken at construction (`_is_initial` while it runs, as
    torch's, where a resumed schedule leaves the rates it finds)."""

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
        self._step_count, self._is_initial = 0, True
        try:
            self.step()
        finally:
            self._is_initial = False

    def get_lr(self):
        """The groups' rates after this step, from their current ones (torch's chainable form)."""
        raise NotImplementedError

    def closed_form(self):
        """The rates at last_epoch from base_lrs alone (step(epoch)); None where torch has no such form."""
        return None

    def _lrs(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def step(self, epoch=None):
        self._step_count += 1
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = int(epoch)
            values = self.closed_form()
            values = self.get_lr() if values is None else values
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = self._lrs()

    def get_last_lr(self):
        return list(self._last_lr)

    _TYPES = {"last_epoch": int, "_step_count": int, "step_size": int, "T_max": int, "total_iters": int,
              "gamma": float, "eta_min": float, "start_factor": float, "end_factor": float, "factor": float}

    def state_dict(self):
        """torch's: the scheduler's own attributes (its settings too: step_size, gamma, T_max...), not
        the optimizer."""
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict):
        """torch's: the saved attributes replace the scheduler's own, its settings among them (a
        StepLR made with other settings follows the saved schedule)."""
        for key, value in state_dict.items():
            if key == "optimizer" or key == "lr_lambdas":
                continue
            if key in self._TYPES:
                value = self._TYPES[key](value)
            elif key in ("base_lrs", "_last_lr"):
                value = [float(b) for b in value]
            elif key == "milestones":
                value = collections.Counter({int(m): int(n) for m, n in dict(value).items()})
            setattr(self, key, value)
        self._is_initial = False


def _per_group(value, optimizer, what):
    values = list(value) if isinstance(value, (list, tuple)) else [value] * len(optimizer.param_groups)
    if len(values) != len(optimizer.param_groups):
        from ..tensor import user_location

        raise MicaError(f"{what}: {len(values)} given for {len(optimizer.param_groups)} param groups; give one, or "
                        "one per group", user_location())
    return values


class _Lambdas:
    """torch's state_dict of a scheduler with lr_lambdas: one entry per group, None for a function
    (a function is not saved), so torch's load_state_dict reads Mica's and the other way round."""

    def state_dict(self):
        return {**super().state_dict(), "lr_lambdas": [None] * len(self.lr_lambdas)}

    def load_state_dict(self, state_dict):
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "lr_lambdas"})


class LambdaLR(_Lambdas, LRScheduler):
    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.lr_lambdas = _per_group(lr_lambda, optimizer, "LambdaLR's lr_lambda")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * f(self.last_epoch) for base, f in zip(self.base_lrs, self.lr_lambdas)]


class MultiplicativeLR(_Lambdas, LRScheduler):
    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.lr_lambdas = _per_group(lr_lambda, optimizer, "MultiplicativeLR's lr_lambda")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial:
            return self._lrs()
        return [lr * f(self.last_epoch) for lr, f in zip(self._lrs(), self.lr_lambdas)]


class StepLR(LRScheduler):
    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0 or self.last_epoch % self.step_size:
            return self._lrs()
        return [lr * self.gamma for lr in self._lrs()]

    def closed_form(self):
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones, self.gamma = collections.Counter(int(m) for m in milestones), float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch not in self.milestones:
            return self._lrs()
        return [lr * self.gamma ** self.milestones[self.last_epoch] for lr in self._lrs()]

    def closed_form(self):
        passed = sum(n for m, n in self.milestones.items() if m <= self.last_epoch)
        return [base * self.gamma ** passed for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial:  # (a resumed schedule does not move the rate it finds)
            return self._lrs()
        return [lr * self.gamma for lr in self._lrs()]

    def closed_form(self):
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):  # noqa: N803  (torch's names)
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        e, t, low = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return self._lrs()
        if self._step_count == 1 and e > 0:
            return [low + (base - low) * (1 + math.cos(e * math.pi / t)) / 2 for base in self.base_lrs]
        if (e - 1 - t) % (2 * t) == 0:
            return [lr + (base - low) * (1 - math.cos(math.pi / t)) / 2 for lr, base in zip(self._lrs(), self.base_lrs)]
        return [(1 + math.cos(math.pi * e / t)) / (1 + math.cos(math.pi * (e - 1) / t)) * (lr - low) + low
                for lr in self._lrs()]

    def closed_form(self):
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]


class LinearLR(LRScheduler):
    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            from ..tensor import user_location

            raise MicaError("LinearLR: start_factor must be in (0, 1] and end_factor in [0, 1], as torch's",
                            user_location())
        self.start_factor, self.end_factor, self.total_iters = float(start_factor), float(end_factor), int(total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        a, b, n, e = self.start_factor, self.end_factor, self.total_iters, self.last_epoch
        if e == 0:
            return [lr * a for lr in self._lrs()]
        if self._is_initial or e > n:
            return self._lrs()
        return [lr * (1.0 + (b - a) / (n * a + (e - 1) * (b - a))) for lr in self._lrs()]

    def closed_form(self):
        done = min(self.total_iters, self.last_epoch) / self.total_iters if self.total_iters else 1.0
        return [base * (self.start_factor + (self.end_factor - self.start_factor) * done) for base in self.base_lrs]


class ConstantLR(LRScheduler):
    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        self.factor, self.total_iters = float(factor), int(total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0:
            return [lr * self.factor for lr in self._lrs()]
        if self.last_epoch != self.total_iters:
            return self._lrs()
        return [lr * (1.0 / self.factor) for lr in self._lrs()]

    def closed_form(self):
        return [base * (self.factor if self.last_epoch < self.total_iters else 1.0) for base in self.base_lrs]


def __getattr__(name):  # (another torch scheduler: Mica's sentence, with what to do instead)
    if name.startswith("_"):
        raise AttributeError(name)
    from ..errors import MissingVerbError
    from ..tensor import user_location

    raise MissingVerbError(f"Mica has no mica.optim.lr_scheduler.{name} (torch.optim.lr_scheduler.{name}); set "
                           "param_groups[i]['lr'] between calls from your own schedule, or use LambdaLR with it",
                           user_location())
