"""torch.optim.lr_scheduler's common schedulers, for a torch-style loop: each sets its optimizer's
param_groups[i]["lr"] between calls (scheduler.step() after optimizer.step()), which a compiled step
reads as an input at its next call, so a schedule compiles nothing.

Each step() computes torch's way, from the groups' current rates (torch's get_lr): so two schedulers
on one optimizer compose, and a rate set by hand in param_groups is carried on, as torch's are;
step(epoch), which torch deprecates, takes the schedule's closed form where torch has one. In a
functional step, a schedule is a function of the step count instead: mica.optim.cosine_with_warmup
and the others (docs/api.md).
"""
import bisect
import collections
import math
import types

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
        self._initial_step()

    def _initial_step(self):
        """torch's first step, taken at construction (again by SequentialLR when a scheduler's turn
        comes)."""
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
        self._update_lr(epoch)

    def _update_lr(self, epoch=None):
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
    (a function is not saved), a callable object's attributes (its __dict__, restored on load), so
    torch's load_state_dict reads Mica's and the other way round."""

    def state_dict(self):
        return {**super().state_dict(), "lr_lambdas": [None if isinstance(f, types.FunctionType) else dict(f.__dict__)
                                                       for f in self.lr_lambdas]}

    def load_state_dict(self, state_dict):
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "lr_lambdas"})
        for f, saved in zip(self.lr_lambdas, state_dict.get("lr_lambdas") or ()):
            if saved is not None:
                f.__dict__.update(saved)


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


class PolynomialLR(LRScheduler):
    def __init__(self, optimizer, total_iters=5, power=1.0, last_epoch=-1):
        self.total_iters, self.power = int(total_iters), float(power)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        e, n = self.last_epoch, self.total_iters
        if self._is_initial or e > n:
            return self._lrs()
        decay = ((1.0 - e / n) / (1.0 - (e - 1) / n)) ** self.power
        return [lr * decay for lr in self._lrs()]

    def closed_form(self):
        return [base * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters) ** self.power
                for base in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """torch's SGDR: a cosine from each base rate to eta_min over T_i steps, T_i starting at T_0 and
    multiplied by T_mult at each restart."""

    def __init__(self, optimizer, T_0, T_mult=1, eta_min=0.0, last_epoch=-1):  # noqa: N803  (torch's names)
        if not isinstance(T_0, int) or isinstance(T_0, bool) or T_0 <= 0:
            _refuse(f"CosineAnnealingWarmRestarts: T_0 must be a positive integer, got {T_0!r}")
        if not isinstance(T_mult, int) or isinstance(T_mult, bool) or T_mult < 1:
            _refuse(f"CosineAnnealingWarmRestarts: T_mult must be an integer >= 1, got {T_mult!r}")
        self.T_0, self.T_i, self.T_mult, self.eta_min = T_0, T_0, T_mult, float(eta_min)
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
                for base in self.base_lrs]

    def step(self, epoch=None):
        self._step_count += 1
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur += 1
            if self.T_cur >= self.T_i:
                self.T_cur, self.T_i = self.T_cur % self.T_i, self.T_i * self.T_mult
        elif epoch < 0:
            _refuse(f"CosineAnnealingWarmRestarts.step: the epoch must not be negative, got {epoch!r}")
        elif epoch >= self.T_0:
            if self.T_mult == 1:
                self.T_cur = epoch % self.T_0
            else:
                n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
                self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
                self.T_i = self.T_0 * self.T_mult ** n
        else:
            self.T_i, self.T_cur = self.T_0, epoch
        self.last_epoch = math.floor(epoch)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = self._lrs()


def _cycled_momenta(scheduler, cycle_momentum, base_momentum, max_momentum, last_epoch):
    """OneCycleLR's and CyclicLR's momenta, as torch's: with cycle_momentum, ([base], [max]) per group
    and, from the start, each group's momentum (SGD's, or Adam's beta1: use_beta1) at its max, its
    base_momentum and max_momentum kept in the group; None without."""
    name, optimizer = type(scheduler).__name__, scheduler.optimizer
    scheduler.cycle_momentum = bool(cycle_momentum)
    if not scheduler.cycle_momentum:
        return None
    defaults = getattr(optimizer, "defaults", {})
    if "momentum" not in defaults and "betas" not in defaults:
        _refuse(f"{name}: cycle_momentum needs an optimizer with momentum or betas, and {type(optimizer).__name__} "
                "has neither; pass cycle_momentum=False")
    scheduler.use_beta1 = "betas" in defaults
    bases = [float(b) for b in _per_group(base_momentum, optimizer, f"{name}'s base_momentum")]
    tops = [float(m) for m in _per_group(max_momentum, optimizer, f"{name}'s max_momentum")]
    if last_epoch == -1:
        for top, base, group in zip(tops, bases, optimizer.param_groups):
            scheduler._set_momentum(group, top)
            group["max_momentum"], group["base_momentum"] = top, base
    return bases, tops


class OneCycleLR(LRScheduler):
    """torch's one-cycle policy: from max_lr / div_factor up to max_lr over pct_start of total_steps,
    then down to that over final_div_factor (three_phase: back to the start first), by a cosine or a
    line; with cycle_momentum the momentum (Adam's beta1) moves the other way between base_momentum and
    max_momentum. The rates and momenta are param_groups settings a compiled step reads at each call."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None, pct_start=0.3,
                 anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85, max_momentum=0.95, div_factor=25.0,
                 final_div_factor=1e4, three_phase=False, last_epoch=-1):
        self.optimizer = optimizer
        if total_steps is not None:
            if not isinstance(total_steps, int) or isinstance(total_steps, bool) or total_steps <= 0:
                _refuse(f"OneCycleLR: total_steps must be a positive integer, got {total_steps!r}")
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            for name, v in (("epochs", epochs), ("steps_per_epoch", steps_per_epoch)):
                if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                    _refuse(f"OneCycleLR: {name} must be a positive integer, got {v!r}")
            self.total_steps = epochs * steps_per_epoch
        else:
            _refuse("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            _refuse(f"OneCycleLR: pct_start must be a float from 0 to 1, got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            _refuse(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self._anneal_func_type = anneal_strategy
        up, n = float(pct_start * self.total_steps) - 1, self.total_steps - 1
        if three_phase:
            self._schedule_phases = [
                {"end_step": up, "start_lr": "initial_lr", "end_lr": "max_lr",
                 "start_momentum": "max_momentum", "end_momentum": "base_momentum"},
                {"end_step": float(2 * pct_start * self.total_steps) - 2, "start_lr": "max_lr", "end_lr": "initial_lr",
                 "start_momentum": "base_momentum", "end_momentum": "max_momentum"},
                {"end_step": n, "start_lr": "initial_lr", "end_lr": "min_lr",
                 "start_momentum": "max_momentum", "end_momentum": "max_momentum"}]
        else:
            self._schedule_phases = [
                {"end_step": up, "start_lr": "initial_lr", "end_lr": "max_lr",
                 "start_momentum": "max_momentum", "end_momentum": "base_momentum"},
                {"end_step": n, "start_lr": "max_lr", "end_lr": "min_lr",
                 "start_momentum": "base_momentum", "end_momentum": "max_momentum"}]
        max_lrs = _per_group(max_lr, optimizer, "OneCycleLR's max_lr")
        if last_epoch == -1:
            for group, top in zip(optimizer.param_groups, max_lrs):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        _cycled_momenta(self, cycle_momentum, base_momentum, max_momentum, last_epoch)
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, group, value):
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _anneal(self, start, end, pct):
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        step = self.last_epoch
        if step > self.total_steps:
            _refuse(f"OneCycleLR: stepped {step} times, beyond its total_steps of {self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if step <= end or i == len(self._schedule_phases) - 1:
                    pct = (step - start) / (end - start)
                    lr = self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    momentum = (self._anneal(group[phase["start_momentum"]], group[phase["end_momentum"]], pct)
                                if self.cycle_momentum else None)
                    break
                start = phase["end_step"]
            lrs.append(lr)
            if self.cycle_momentum:
                self._set_momentum(group, momentum)
        return lrs


class CyclicLR(LRScheduler):
    """torch's cyclical learning rate: between base_lr and max_lr and back over step_size_up +
    step_size_down steps, each cycle's height scaled by mode ("triangular": 1; "triangular2": halved
    each cycle; "exp_range": gamma ** iterations) or by scale_fn(cycle or iteration, scale_mode);
    with cycle_momentum the momentum (Adam's beta1) moves the other way between max_momentum and
    base_momentum, as a setting the compiled step reads at each call."""

    def __init__(self, optimizer, base_lr, max_lr, step_size_up=2000, step_size_down=None, mode="triangular",
                 gamma=1.0, scale_fn=None, scale_mode="cycle", cycle_momentum=True, base_momentum=0.8,
                 max_momentum=0.9, last_epoch=-1):
        self.optimizer = optimizer
        if not getattr(optimizer, "param_groups", None):
            _refuse("CyclicLR takes an optimizer made with the model's parameters (its param_groups: the learning "
                    "rates it sets)")
        base_lrs = [float(b) for b in _per_group(base_lr, optimizer, "CyclicLR's base_lr")]
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups):
                group["lr"] = lr
        self.max_lrs = [float(m) for m in _per_group(max_lr, optimizer, "CyclicLR's max_lr")]
        for name, size in (("step_size_up", step_size_up), ("step_size_down", step_size_down)):
            if size is not None and (isinstance(size, bool) or not isinstance(size, (int, float)) or size <= 0):
                _refuse(f"CyclicLR: {name} must be a positive number of steps, got {size!r}")
        up = float(step_size_up)
        down = float(step_size_down) if step_size_down is not None else up
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            _refuse(f"CyclicLR: mode must be 'triangular', 'triangular2' or 'exp_range' (or give scale_fn), got "
                    f"{mode!r}")
        if scale_mode not in ("cycle", "iterations"):
            _refuse(f"CyclicLR: scale_mode must be 'cycle' or 'iterations', got {scale_mode!r}")
        self.mode, self.gamma = mode, gamma
        self._scale_fn_custom, self.scale_mode = scale_fn, scale_mode
        self._init_scale_fn()
        momenta = _cycled_momenta(self, cycle_momentum, base_momentum, max_momentum, last_epoch)
        if momenta is not None:
            self.base_momentums, self.max_momentums = momenta
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def _init_scale_fn(self):
        if self._scale_fn_custom is not None:
            return
        if self.mode in ("triangular", "triangular2", "exp_range"):  # (torch's: the mode sets it)
            self.scale_mode = "iterations" if self.mode == "exp_range" else "cycle"

    def scale_fn(self, x):
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        if self.mode == "exp_range":
            return self.gamma ** x
        return 1.0

    _set_momentum = OneCycleLR._set_momentum

    def get_lr(self):
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        scale_factor = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        at = cycle if self.scale_mode == "cycle" else self.last_epoch
        lrs = [base + (top - base) * scale_factor * self.scale_fn(at) for base, top in zip(self.base_lrs, self.max_lrs)]
        if self.cycle_momentum:
            for group, base, top in zip(self.optimizer.param_groups, self.base_momentums, self.max_momentums):
                self._set_momentum(group, top - (top - base) * scale_factor * self.scale_fn(at))
        return lrs

    _TYPES = {**LRScheduler._TYPES, "total_size": float, "step_ratio": float}

    def state_dict(self):
        """torch's: a scale_fn function is not saved (None), a callable object's attributes are."""
        state = super().state_dict()
        fn = state.pop("_scale_fn_custom")
        state["_scale_fn_custom"] = None if fn is None or isinstance(fn, types.FunctionType) else dict(fn.__dict__)
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        fn = state_dict.pop("_scale_fn_custom", None)
        state_dict.pop("_scale_fn_ref", None)
        super().load_state_dict(state_dict)
        if fn is not None and self._scale_fn_custom is not None:
            self._scale_fn_custom.__dict__.update(fn)
        self._init_scale_fn()


def _schedulers_of(kind, optimizer, schedulers):
    schedulers = list(schedulers)
    if not schedulers:
        _refuse(f"{kind} takes at least one scheduler")
    for i, s in enumerate(schedulers):
        if isinstance(s, ReduceLROnPlateau):
            _refuse(f"{kind} cannot take ReduceLROnPlateau (scheduler {i}): its step needs the metric; step it "
                    "yourself")
        if getattr(s, "optimizer", None) is not optimizer:
            _refuse(f"{kind}: scheduler {i} ({type(s).__name__}) belongs to another optimizer; every scheduler must "
                    "belong to the one optimizer")
    return schedulers


class _Nested:
    """torch's state_dict of a scheduler of schedulers: its own attributes and each one's state_dict."""

    def state_dict(self):
        return {**super().state_dict(), "_schedulers": [s.state_dict() for s in self._schedulers]}

    def load_state_dict(self, state_dict):
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "_schedulers"})
        for s, state in zip(self._schedulers, state_dict.get("_schedulers", ())):
            s.load_state_dict(state)


class SequentialLR(_Nested, LRScheduler):
    """torch's: schedulers[0] until milestones[0], then schedulers[1] started afresh, and so on."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        self._schedulers = _schedulers_of("SequentialLR", optimizer, schedulers)
        self._milestones = [int(m) for m in milestones]
        if len(self._milestones) != len(self._schedulers) - 1:
            _refuse(f"SequentialLR takes one milestone fewer than schedulers, got {len(self._schedulers)} schedulers "
                    f"and {len(self._milestones)} milestones")
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        for s in self._schedulers:  # (undo the steps their construction took)
            _undo(s)
        first = self._schedulers[bisect.bisect_right(self._milestones, 0)]
        first._initial_step()
        self._last_lr = first.get_last_lr()

    def step(self):
        self.last_epoch += 1
        i = bisect.bisect_right(self._milestones, self.last_epoch)
        s = self._schedulers[i]
        if i > 0 and self._milestones[i - 1] == self.last_epoch:
            s._update_lr(0)
        else:
            s.step()
        self._last_lr = s.get_last_lr()


def _undo(s):
    for inner in getattr(s, "_schedulers", ()):
        _undo(inner)
    if not hasattr(s, "_schedulers") and hasattr(s, "last_epoch"):
        s.last_epoch -= 1


class ChainedScheduler(_Nested, LRScheduler):
    """torch's: every scheduler stepped, in order, at each step."""

    def __init__(self, schedulers, optimizer=None):
        schedulers = list(schedulers)
        optimizer = optimizer or (getattr(schedulers[0], "optimizer", None) if schedulers else None)
        self._schedulers = _schedulers_of("ChainedScheduler", optimizer, schedulers)
        self.optimizer = optimizer
        self._last_lr = self._lrs()

    def step(self):
        for s in self._schedulers:
            s.step()
        self._last_lr = self._lrs()


class ReduceLROnPlateau(LRScheduler):
    """torch's: the rates times factor when the metric given to step(metric) has not improved (by
    threshold, relative or absolute) for more than patience steps, then cooldown steps of rest; never
    below min_lr, and a change smaller than eps is not made. The metric is a Python number (a loss a
    compiled step returned)."""

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4, threshold_mode="rel",
                 cooldown=0, min_lr=0, eps=1e-8):
        if factor >= 1.0:
            _refuse(f"ReduceLROnPlateau: factor must be below 1, got {factor!r}")
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            _refuse(f"ReduceLROnPlateau: mode must be 'min' or 'max' and threshold_mode 'rel' or 'abs', got "
                    f"{mode!r} and {threshold_mode!r}")
        self.optimizer, self.factor = optimizer, float(factor)
        if isinstance(min_lr, (list, tuple)):
            self.default_min_lr, self.min_lrs = None, list(_per_group(list(min_lr), optimizer,
                                                                        "ReduceLROnPlateau's min_lr"))
        else:
            self.default_min_lr, self.min_lrs = min_lr, [min_lr] * len(optimizer.param_groups)
        self.patience, self.cooldown, self.eps = int(patience), int(cooldown), float(eps)
        self.mode, self.threshold, self.threshold_mode = mode, float(threshold), threshold_mode
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.last_epoch = 0
        self._last_lr = self._lrs()
        self.best, self.cooldown_counter, self.num_bad_epochs = self.mode_worse, 0, 0

    def _is_better(self, a, best):
        if self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold) if self.mode == "min" else a > best * (self.threshold + 1.0)
        return a < best - self.threshold if self.mode == "min" else a > best + self.threshold

    def step(self, metrics, epoch=None):
        current = float(metrics)
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        if self._is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            if len(self.min_lrs) != len(self.optimizer.param_groups):
                if self.default_min_lr is None:
                    _refuse("ReduceLROnPlateau: the optimizer has another number of param groups than its min_lr "
                            "list; set min_lrs to one per group")
                self.min_lrs = [self.default_min_lr] * len(self.optimizer.param_groups)
            for group, low in zip(self.optimizer.param_groups, self.min_lrs):
                old = float(group["lr"])
                new = max(old * self.factor, low)
                if old - new > self.eps:
                    group["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = self._lrs()

    @property
    def in_cooldown(self):
        return self.cooldown_counter > 0


def _refuse(sentence):
    from ..tensor import user_location

    raise MicaError(sentence, user_location())


def __getattr__(name):  # (another torch scheduler: Mica's sentence, with what to do instead)
    if name.startswith("_"):
        raise AttributeError(name)
    from ..errors import MissingVerbError
    from ..tensor import user_location

    raise MissingVerbError(f"Mica has no mica.optim.lr_scheduler.{name} (torch.optim.lr_scheduler.{name}); set "
                           "param_groups[i]['lr'] between calls from your own schedule, or use LambdaLR with it",
                           user_location())
