"""`with mica.autocast(dtype=mica.bfloat16):` — mixed precision as torch.autocast gives it.

Inside the region, while a function is traced, a verb on PyTorch's lower-precision list casts its
floating operands (float32, or the other half type; never float64) to the region's half type, and
a verb on the float32 list casts half operands to float32; every other verb runs in its inputs'
types (so a residual `x + y` of float32 and bfloat16 is float32, by promotion). The casts are
ordinary `cast` nodes with the user's line, visible in `program.ir`; their gradients cast back, so
float32 weights get float32 gradients. The lists are PyTorch's for the device type (CPU: the
products and attention in the half type, the losses and prod in float32; CUDA adds softmax,
log-softmax, layer and RMS norms, norms, cosine similarity, sums, products, running sums and
products, logsumexp, exp, expm1, log, log1p, rsqrt, powers and softplus to the float32 list, and
refuses binary_cross_entropy, as PyTorch does), restricted to Mica's verbs.

What the half type means for the work itself (every target): a product reads half operands and
accumulates in float32; a kernel (norms, softmax, attention, cross-entropy) computes in float32 and
rounds its half outputs once; elementwise operations on half values compute in float32 and round
each result; sums accumulate in float32 (passes/widen.py, backends/cstyle/expr.py).
"""
import functools
import sys
import weakref

from . import dtypes
from .errors import MicaError

LOWER = frozenset({"matmul", "linear", "scaled_dot_product_attention", "addmm", "baddbmm", "addbmm", "prelu",
                   "conv1d", "conv2d", "conv3d"})
_LOSSES = frozenset({"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
                     "binary_cross_entropy_with_logits"})
FLOAT32 = {  # (torch 2.13's lists, restricted to Mica's verbs; tests/test_mixed_precision.py checks both)
    "cpu": _LOSSES | {"binary_cross_entropy", "prod", "adaptive_avg_pool3d"},
    "cuda": _LOSSES | {"softmax", "log_softmax", "layer_norm", "group_norm", "rms_norm", "norm", "cosine_similarity", "sum", "prod",
                       "cumsum", "cumprod", "logsumexp", "exp", "expm1", "log", "log1p", "log2", "log10", "rsqrt", "pow",
                       "softplus", "cdist", "reciprocal", "interpolate", "margin_ranking_loss", "hinge_embedding_loss",
                       "soft_margin_loss", "cosine_embedding_loss", "triplet_margin_loss", "poisson_nll_loss",
                       "multi_margin_loss"},
}
_DEFAULT_DTYPE = {"cpu": dtypes.bfloat16, "cuda": dtypes.float16}  # torch.get_autocast_dtype's defaults

_REGIONS = []  # (device_type, dtype or None when disabled), innermost last
_UNSCALED = weakref.WeakKeyDictionary()  # a graph being traced -> the ids of the gradients unscale returned


class autocast:  # noqa: N801  (PyTorch's name)
    """torch.autocast's signature: autocast(device_type="cpu", dtype=None, enabled=True,
    cache_enabled=None); a context manager or a decorator."""

    def __init__(self, device_type="cpu", dtype=None, enabled=True, cache_enabled=None):
        from .tensor import user_location

        if device_type not in FLOAT32:
            raise MicaError(f"autocast: device_type must be 'cpu' or 'cuda', got {device_type!r}", user_location())
        try:
            dtype = _DEFAULT_DTYPE[device_type] if dtype is None else dtypes.as_dtype(dtype)
        except (TypeError, KeyError):
            raise MicaError(f"autocast: dtype must be mica.bfloat16 or mica.float16, got {dtype!r}",
                            user_location()) from None
        if dtype not in dtypes.HALF:
            raise MicaError(f"autocast: dtype must be mica.bfloat16 or mica.float16, got {dtype.name}",
                            user_location())
        self.device_type, self.dtype, self.enabled = device_type, dtype, bool(enabled)

    def __enter__(self):
        _REGIONS.append((self.device_type, self.dtype if self.enabled else None))
        return self

    def __exit__(self, *exc):
        _REGIONS.pop()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with autocast(self.device_type, self.dtype, self.enabled):
                return fn(*args, **kwargs)

        return wrapped


def active():
    """(device_type, half dtype) of the innermost enabled region, or None."""
    return _REGIONS[-1] if _REGIONS and _REGIONS[-1][1] is not None else None


def _no_torch_region(verb):
    """A sentence where torch.autocast is on around a traced verb it would cast (it changes nothing
    in a Mica trace, so the step would train in float32 unsaid)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for device in ("cpu", "cuda"):
        try:
            on = torch.is_autocast_enabled(device)
        except Exception:  # (an older torch: no device argument)
            on = False
        if on:
            from .tensor import fail

            fail(f"{verb} runs under torch.autocast('{device}'), which Mica's trace does not see; write "
                 f"mica.autocast('{device}', dtype=...) instead (the same arguments) so its casts are in the program")


def lower(verb, *tensors):
    """The operands of a lower-precision verb, cast to the region's half type."""
    region = active()
    if region is None and verb in LOWER:
        _no_torch_region(verb)
    if region is None or verb not in LOWER:
        return tensors
    from .verbs.core import to

    half = region[1]
    return tuple(to(t, half) if _castable(t) and t.dtype is not half and t.dtype is not dtypes.float64 else t
                 for t in tensors)


def float32(verb, *tensors):
    """The operands of a float32-list verb, half ones cast to float32."""
    region = active()
    if region is None or verb not in FLOAT32[region[0]]:
        return tensors
    from .verbs.core import to

    return tuple(to(t, dtypes.float32) if _castable(t) and t.dtype in dtypes.HALF else t
                 for t in tensors)


def _castable(t):
    from .tensor import Tensor

    return isinstance(t, Tensor) and t.dtype.kind == "float"


def _times(outputs, scale):
    """outputs * scale for a Tensor, or each Tensor of a list or tuple (nested), as torch's scale."""
    from .tensor import Tensor, fail

    if isinstance(outputs, (list, tuple)):
        return type(outputs)(_times(o, scale) for o in outputs)
    if not isinstance(outputs, Tensor):
        fail(f"GradScaler.scale: outputs must be a Tensor or a list or tuple of Tensors (as torch's), got "
             f"{type(outputs).__name__}")
    return outputs * scale


class GradScaler:
    """torch.amp.GradScaler's arithmetic, functional like Mica's optimizers: its state (the scale,
    float32, and the growth tracker, int32) goes in and out of the traced step.

        state = scaler.init()                                    # outside the trace
        loss, grads = mica.value_and_grad(lambda p: scaler.scale(f(p), state))(params)
        grads, found_inf = scaler.unscale(grads, state)          # (then clip the unscaled grads)
        params, opt_state = scaler.step(found_inf, (params, opt_state), opt.update(params, grads, opt_state))
        state = scaler.update(state, found_inf)

    The same decisions as GradScaler on the same numbers: the gradients are multiplied by the
    reciprocal of the scale (computed in float64, rounded to float32) and any non-finite value skips
    the step (parameters and optimizer state keep their bits) and multiplies the scale by
    backoff_factor; growth_interval steps in a row without one multiply it by growth_factor."""

    def __init__(self, device="cuda", init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        # (torch.amp.GradScaler's signature; `device` changes nothing here: the target decides where it runs)
        import numpy as np

        from .tensor import user_location

        if not isinstance(device, str):
            raise MicaError(f"GradScaler: device is a name such as 'cuda' or 'cpu' (torch.amp.GradScaler's first "
                            f"argument), got {device!r}; pass init_scale by name", user_location())
        try:
            ok = 0 < init_scale <= float(np.finfo(np.float32).max) and growth_factor > 1 and \
                0 < backoff_factor < 1 and int(growth_interval) >= 1 and int(growth_interval) == growth_interval
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise MicaError("GradScaler: init_scale must be > 0 and at most float32's largest value (3.4e38), "
                            "growth_factor > 1, backoff_factor in (0, 1) and growth_interval a positive count",
                            user_location())
        self.device = device
        self.init_scale, self.growth_factor = float(init_scale), float(growth_factor)
        self.backoff_factor, self.growth_interval = float(backoff_factor), int(growth_interval)
        self.enabled = bool(enabled)

    def init(self):
        import numpy as np

        return {"scale": np.float32(self.init_scale), "growth_tracker": np.int32(0)}

    def state_specs(self):
        return {"scale": dtypes.Spec((), dtypes.float32), "growth_tracker": dtypes.Spec((), dtypes.int32)}

    # how the functional calls go, for the sentences of a call shaped like torch's
    _FORM = "docs/api.md shows the whole step"

    def _check_state(self, verb, state, keys=("scale",)):
        """The scaler's state as a traced step holds it (Tensors: inputs of the step), or a sentence."""
        from .tensor import Tensor, fail

        if not isinstance(state, dict) or not all(k in state for k in keys):
            fail(f"GradScaler.{verb}: the state must be the dict scaler.init() gives ('scale' and "
                 f"'growth_tracker'), made outside the step and passed in (traced with scaler.state_specs()); "
                 f"{self._FORM}")
        if not all(isinstance(state[k], Tensor) for k in keys):
            fail(f"GradScaler.{verb}: the state's values are constants here (scaler.init() called inside the "
                 f"step?), so the scale could never change; {self._FORM}")

    # torch's stateful form, in a torch-style compiled step (mica/stateful.py): the scaler holds its
    # scale and growth tracker between calls (numpy values, `_held_state`), which go in and out of
    # the compiled step as the functional form's state does; with enabled=False (nanoGPT's
    # `GradScaler(enabled=(dtype == 'float16'))` in float32 and bfloat16) each call is torch's no-op
    def _torch_form(self, verb):
        from .tensor import user_location

        raise MicaError(f"GradScaler.{verb} in torch's form (the scaler holding its scale) runs inside a compiled "
                        "step: put the loop body that calls scale(loss).backward(), step(optimizer) and update() "
                        "under @mica.compile (or use the functional scaler: docs/api.md, Mixed precision)",
                        user_location())

    def _held(self):
        """The scale and growth tracker a torch-form scaler holds between calls (numpy)."""
        held = getattr(self, "_held_state", None)
        return held if held is not None else self.init()

    def _settings(self):
        return (self.growth_factor, self.backoff_factor, self.growth_interval)

    def is_enabled(self):
        return self.enabled

    def get_scale(self):
        """torch's: 1.0 when disabled, else the scale the scaler holds (after the last step's update)."""
        if not self.enabled:
            return 1.0
        from .tensor import in_trace

        if in_trace():
            self._torch_form_value("get_scale")
        return float(self._held()["scale"])

    def _torch_form_value(self, verb):
        from .tensor import user_location

        raise MicaError(f"GradScaler.{verb}() in a compiled step would read the scale when the step is compiled, "
                        "not at each call; call it outside the step", user_location())

    def state_dict(self):
        """torch's: {} when disabled (nanoGPT saves nothing then), else its keys and values."""
        if not self.enabled:
            return {}
        held = self._held()
        return {"scale": float(held["scale"]), "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": int(held["growth_tracker"])}

    def load_state_dict(self, state_dict):
        """torch's: the scale, the growth tracker and the settings from state_dict() (Mica's or torch's)."""
        import numpy as np

        from .tensor import user_location

        if not self.enabled:
            return
        if not state_dict:
            raise MicaError("GradScaler.load_state_dict: the state dict is empty (saved from a scaler made with "
                            "enabled=False?); give the one an enabled scaler's state_dict() saved", user_location())
        try:
            scale, tracker = float(state_dict["scale"]), int(state_dict["_growth_tracker"])
            settings = (float(state_dict["growth_factor"]), float(state_dict["backoff_factor"]),
                        int(state_dict["growth_interval"]))
        except (KeyError, TypeError, ValueError) as e:
            raise MicaError(f"GradScaler.load_state_dict: the state dict lacks or mistypes {e}; give the one "
                            "GradScaler.state_dict() saved (keys scale, growth_factor, backoff_factor, "
                            "growth_interval, _growth_tracker)", user_location()) from None
        self.growth_factor, self.backoff_factor, self.growth_interval = settings
        self._held_state = {"scale": np.float32(scale), "growth_tracker": np.int32(tracker)}

    def __getattr__(self, name):  # (another torch.amp.GradScaler method: Mica's sentence)
        if name.startswith("_"):
            raise AttributeError(name)
        from .errors import missing_verb

        raise missing_verb("amp.GradScaler.", name, "torch.amp.GradScaler.")

    @staticmethod
    def _in_torch_step():
        from . import stateful

        return stateful.active() is not None

    def unscale_(self, optimizer):
        if self.enabled and self._torch_form_here("unscale_"):
            from . import stateful

            stateful.scaler_unscale(self, optimizer)
        elif self.enabled:
            self._torch_form("unscale_")  # (no functional unscale_: the functional form is unscale(grads, state))

    def _torch_form_here(self, verb):
        """A call in torch's form (no state given): True in a torch-style step, which holds the
        scaler's state; outside any trace a sentence; in a functional trace False (the functional
        form's own sentence follows)."""
        from .tensor import in_trace

        if self._in_torch_step():
            return True
        if not in_trace():
            self._torch_form(verb)
        return False

    def scale(self, loss, state=None):
        """The loss (a Tensor, or lists and tuples of them, as torch's `outputs`) times the scale."""
        if self.enabled and state is None and self._torch_form_here("scale"):
            from . import stateful

            state = stateful.note_scaler(self)
            return loss if state is None else _times(loss, state["scale"])  # (None: the finding trace, never run)
        if self.enabled:
            self._check_state("scale", state)
        return _times(loss, state["scale"]) if self.enabled else loss

    def unscale(self, grads, state=None):
        """(the gradients times 1/scale, a 0-d bool: did any hold an inf or NaN)."""
        from . import pytree
        from . import verbs as F
        from .tensor import Tensor, current, fail

        leaves, tree = pytree.flatten(grads, is_leaf=lambda x: isinstance(x, Tensor))
        if not self.enabled:
            return grads, F.as_tensor(False)
        self._check_state("unscale", state)
        if not leaves or not all(isinstance(g, Tensor) and g.dtype.kind == "float" for g in leaves):
            fail("GradScaler.unscale: the gradients must be floating-point Tensors (a Tensor, or a list, tuple or "
                 "dict of them, as mica.grad gives), got " + (
                     "none" if not leaves else type(next(g for g in leaves if not isinstance(g, Tensor)
                                                        or g.dtype.kind != "float")).__name__))
        done = _UNSCALED.setdefault(current("GradScaler.unscale").graph, set())
        if any(g.value.id in done for g in leaves):
            fail("GradScaler.unscale: these gradients were unscaled already (a second unscale divides them by the "
                 "scale again; PyTorch refuses unscale_ twice in a step): unscale each gradient once")
        inv = F.to(F.as_tensor(1.0, dtypes.float64) / F.to(state["scale"], dtypes.float64), dtypes.float32)
        flags = [F.amax(F.to((g - g) != 0, dtypes.float32)) for g in leaves]  # inf - inf and NaN - NaN are NaN
        found = F.amax(F.stack(flags)) > 0
        # (in float32, then back to the gradient's type, as GradScaler: 1/scale in a half type could round to 0)
        out = [F.to(F.to(g, dtypes.float32) * inv, g.dtype) for g in leaves]
        done.update(g.value.id for g in out)
        return pytree.unflatten(tree, out), found

    def step(self, found_inf, old=None, new=None):
        """`new` (the optimizer's result) where the step is taken, else `old`, leaf by leaf."""
        from . import pytree
        from . import verbs as F
        from .tensor import Tensor, fail

        if hasattr(found_inf, "param_groups") and old is None and self._torch_form_here("step"):  # (step(opt))
            if self.enabled:
                from . import stateful

                return stateful.scaler_step(self, found_inf)
            return found_inf.step()
        if not isinstance(found_inf, Tensor) or old is None or new is None:
            fail("GradScaler.step takes (found_inf, old, new), unscale's flag, the parameters and optimizer state "
                 "before the step and the optimizer's result, and returns the one to keep (Mica's optimizers are "
                 f"functions, not objects); {self._FORM}")
        if not self.enabled:
            return new
        is_leaf = lambda x: isinstance(x, Tensor)  # noqa: E731
        a, tree = pytree.flatten(old, is_leaf=is_leaf)
        b, other = pytree.flatten(new, is_leaf=is_leaf)
        shapes = [(x.shape, x.dtype) if is_leaf(x) else None for x in a]
        if tree != other or shapes != [(y.shape, y.dtype) if is_leaf(y) else None for y in b]:
            from .tensor import fail

            fail("GradScaler.step: `new` must have the structure, shapes and dtypes of `old` (the optimizer's "
                 "result for the same parameters and state, in the same order), e.g. scaler.step(found_inf, "
                 "(params, opt_state), opt.update(params, grads, opt_state))")
        chosen = pytree.unflatten(tree, [x if x is y else F.where(found_inf, x, y) for x, y in zip(a, b)])
        from .tensor import current

        graph = current("GradScaler.step").graph
        for x, y in zip(a, pytree.flatten(chosen, is_leaf=is_leaf)[0]):  # (the memory plan updates them in place)
            if is_leaf(x) and is_leaf(y) and x.value.node.op == "input":
                graph.roles.setdefault(y.value.id, graph.roles.get(x.value.id, "optimizer state"))
                graph.updates.setdefault(y.value.id, x.value.id)
        return chosen

    def update(self, state=None, found_inf=None):
        from . import verbs as F

        if not self.enabled:
            return state
        if state is None and found_inf is None and self._torch_form_here("update"):  # (torch's update())
            from . import stateful

            return stateful.scaler_update(self)
        self._check_state("update", state, ("scale", "growth_tracker"))
        if set(state) != {"scale", "growth_tracker"}:
            from .tensor import fail

            fail("GradScaler.update: the state must be the dict scaler.init() gives ('scale' and "
                 "'growth_tracker'; specs: scaler.state_specs())")
        scale, tracker = state["scale"], state["growth_tracker"]
        grown = tracker + 1 == self.growth_interval
        wider = F.to(F.to(scale, dtypes.float64) * self.growth_factor, dtypes.float32)
        narrower = F.to(F.to(scale, dtypes.float64) * self.backoff_factor, dtypes.float32)
        new_scale = F.where(found_inf, narrower, F.where(F.logical_and(grown, (wider - wider) == 0), wider, scale))
        new_tracker = F.where(F.logical_or(found_inf, grown), F.zeros_like(tracker), tracker + 1)
        new = {"scale": new_scale, "growth_tracker": new_tracker}
        from .optim.base import _record_updates

        _record_updates(state, new, "optimizer state")
        return new
