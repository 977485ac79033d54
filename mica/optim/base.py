"""What every optimizer shares: parameter groups over a {name: tensor} dict, state handling."""
import math

import numpy as np

from ..dtypes import Spec
from ..errors import MicaError


# torch's keyword arguments that choose how a step is computed, not what it computes (fused and
# foreach kernels give the same update); and options Mica has only in their off setting
_SAME_STEP = ("fused", "foreach", "capturable", "differentiable")
_FALSE_ONLY = ("maximize", "amsgrad")


def switched_on(groups, optimizer=None):
    """The first of torch's options Mica does not have (maximize; amsgrad but in Adam and AdamW)
    that a param group sets True, or None."""
    takes = getattr(optimizer, "defaults", {})
    return next((k for g in groups if isinstance(g, dict) for k in _FALSE_ONLY if g.get(k) and k not in takes), None)


def _name_of(param, names, optimizer, group):
    """A Parameter object in a group (torch's way, from model.parameters()) as the name the step's
    parameters have it under: one of the names model.named_parameters() gave it."""
    known = [n for n in getattr(param, "_names", ()) if n in names]
    if len(known) != 1:
        raise MicaError(f"{optimizer}: group {group} holds a Parameter "
                        + ("that is not among the model's parameters" if not known else
                           f"known by several names ({', '.join(sorted(known))})")
                        + "; name the parameters in the group instead: {'params': [n for n, p in "
                        "model.named_parameters() if ...]}")
    return known[0]


class _Group(dict):
    """A parameter group (torch's dict): a learning rate set in a step being compiled is noted
    (mica/stateful.py: computed there, it is the step's; the group gets each call's value)."""

    def __setitem__(self, key, value):
        if key == "lr":
            from .. import stateful

            stateful.set_lr(self, value)
        dict.__setitem__(self, key, value)


def _leaves_as_parameters(groups):
    """Host tensors made leaves in place (makemore's `p.requires_grad = True`, host.LeafTensor) as
    the Parameters that hold their values, in a list of them or in groups' "params"."""
    leaf = lambda p: p.__dict__["_mica_leaf"] if type(p).__name__ == "LeafTensor" else p  # noqa: E731
    if isinstance(groups, (list, tuple)):
        return [({**g, "params": [leaf(p) for p in g["params"]] if isinstance(g["params"], (list, tuple))
                  else leaf(g["params"])} if isinstance(g, dict) and "params" in g else leaf(g)) for g in groups]
    return groups


def _group(g):
    """A group as given, its "params" a list (a generator, model.parameters(), is read once, as torch's)."""
    params = g["params"]
    if type(params).__name__ == "Parameter" or isinstance(params, str):
        params = [params]
    elif not callable(params):
        params = list(params)  # (a copy: the user's list stays as given)
    return {**g, "params": params, **({"lr": _number_of(g["lr"])} if "lr" in g else {})}


class Optimizer:
    """A functional optimizer. `init(params)` gives its state (numpy, outside a trace);
    `update(params, grads, state, lr=..., lr_scale=...)` runs inside a trace and returns
    (new_params, new_state). Only parameters named by a group are updated."""

    defaults = {}
    # settings a torch-form compiled step takes as inputs at each call (mica/stateful.py), as it takes
    # the learning rate: what OneCycleLR moves at every step ("betas": its first, beta1)
    live = ()

    def __init__(self, param_groups=None, *args, **hyper):
        from ..tensor import user_location

        hyper = self._positional(args, hyper)  # (torch's Adam(params, 1e-3): the settings in torch's order)
        for name, value in list(hyper.items()):  # (torch's implementation choices: the same step here)
            if name in _SAME_STEP:
                hyper.pop(name)
            elif name in _FALSE_ONLY and not value and name not in self.defaults:
                hyper.pop(name)
        unsupported = [name for name in _FALSE_ONLY if hyper.get(name) and name not in self.defaults]
        if unsupported:
            raise MicaError(f"{type(self).__name__}: {unsupported[0]}=True is torch's option Mica does not have; leave "
                            "it False (the default)", user_location())
        unknown = set(hyper) - set(self.defaults)
        if unknown:
            raise MicaError(f"{type(self).__name__}: unknown hyperparameter(s) {sorted(unknown)}; "
                            f"known: {sorted(self.defaults)}", user_location())
        if param_groups is not None and not isinstance(param_groups, (list, tuple, dict)):
            param_groups = list(param_groups)  # (model.parameters(): a generator)
        param_groups = _leaves_as_parameters(param_groups)
        if param_groups and all(type(p).__name__ == "Parameter" for p in param_groups):
            param_groups = [{"params": list(param_groups)}]  # (torch's AdamW(model.parameters(), ...): one group)
        if isinstance(param_groups, (list, tuple)) and all(isinstance(g, dict) and "params" in g for g in param_groups):
            param_groups = [_group(g) for g in param_groups]
        hyper = {k: _number_of(v) if k == "lr" else v for k, v in hyper.items()}  # (torch takes a tensor lr)
        from ..nn import Parameter

        for g in param_groups or ():
            if isinstance(g, dict) and not callable(g.get("params")) and any(
                    type(p).__name__ == "Parameter" and not isinstance(p, Parameter) for p in g.get("params", ())):
                raise MicaError(f"{type(self).__name__} was given another library's Parameters (a torch model's?); "
                                "give it the Mica model's, model.parameters()", user_location())
        if param_groups is not None and (not isinstance(param_groups, (list, tuple))
                                         or not all(isinstance(g, dict) and "params" in g for g in param_groups)):
            raise MicaError(f"{type(self).__name__} takes the model's Parameters, or param_groups (a list of dicts "
                            "like {'params': [names or Parameters], 'weight_decay': 0.0}), or settings only, as "
                            f"{type(self).__name__}(lr=...); the values come to init(params) and update(params, "
                            "grads, state) (Mica's optimizers are functional)", user_location())
        self.hyper = {**self.defaults, **hyper}
        self.defaults = dict(self.hyper)  # (torch's: the settings it was made with)
        if isinstance(param_groups, (list, tuple)) and not param_groups:
            name = type(self).__name__
            raise MicaError(f"{name} got an empty parameter list (torch refuses it too); give it the model's "
                            f"parameters, or settings only, as {name}(lr=...)", user_location())
        _one_group_each(type(self).__name__, [g["params"] for g in param_groups or ()])
        # (each group holds every setting, as torch's: a loop may read and set g["lr"])
        self.param_groups = None if param_groups is None else [_Group({**self.hyper, **g}) for g in param_groups]
        self._check(self.hyper, "")
        for i, g in enumerate(param_groups or ()):
            self._check(self._hyper_of(g), f"group {i}: ")

    def _positional(self, args, hyper):
        """Settings given by position, named in torch's order (the class's defaults keep it)."""
        from ..tensor import user_location

        names = list(type(self).defaults)
        if len(args) > len(names):
            raise MicaError(f"{type(self).__name__} takes at most {len(names)} settings after the parameters "
                            f"({', '.join(names)}), got {len(args)}", user_location())
        for name, value in zip(names, args):
            if name in hyper:
                raise MicaError(f"{type(self).__name__} got {name} both by position and by keyword", user_location())
            hyper[name] = value
        return hyper

    def _hyper_of(self, group):
        """A group's hyperparameters: the optimizer's, overridden by the group's own."""
        return {**self.hyper, **{k: v for k, v in group.items() if k != "params"}}

    def _check(self, hyper, where):
        """Refuse hyperparameters torch's optimizer of the same name refuses (one sentence each)."""

    def _require(self, hyper, where, names, rule):
        """Each of `names` in `hyper` a plain number (or a learning rate computed in the step) that
        passes `rule`, one of RULES."""
        ok, text = RULES[rule]
        for name in names:
            value = hyper[name]
            if not (_traced(value) and name == "lr") and not (_number(value) and ok(value)):
                self._refuse(where, name, value, text)

    def _refuse(self, where, name, value, rule):
        from ..tensor import user_location

        raise MicaError(f"{type(self).__name__}: {where}{name} must be {rule}, got {value!r}", user_location())

    def groups(self, names):
        """[(group hyperparameters, [names])], checking that no parameter is in two groups."""
        if self.param_groups is None:
            return [(dict(self.hyper), list(names))]
        out, owner = [], {}
        for i, g in enumerate(self.param_groups):
            sel = g.get("params")
            if callable(sel):
                chosen = [n for n in names if sel(n)]
            else:
                chosen = [_name_of(p, names, type(self).__name__, i) if type(p).__name__ == "Parameter" else p
                          for p in sel]
                missing = [n for n in chosen if n not in names]
                if missing:
                    raise MicaError(f"{type(self).__name__}: group {i} names unknown parameter {missing[0]!r}")
            for n in chosen:
                if n in owner:
                    raise MicaError(f"{type(self).__name__}: parameter {n!r} is in groups {owner[n]} and {i}")
                owner[n] = i
            out.append((self._hyper_of(g), chosen))
        return out

    def managed(self, names):
        return [n for _, ns in self.groups(names) for n in ns]

    def init(self, params):
        from collections.abc import Mapping

        from ..tensor import user_location

        if not isinstance(params, Mapping) or any(type(v).__name__ == "Parameter" for v in params.values()):
            raise MicaError(f"{type(self).__name__}.init takes the parameters' values, {{name: array}} (params = "
                            "model.init(seed)), not the Parameter objects", user_location())
        return self._init({n: np.asarray(params[n]) for n in self.managed(list(params))})

    def add_param_group(self, param_group):
        """torch's: another group, its settings defaulting to the optimizer's."""
        from ..tensor import user_location

        if not isinstance(param_group, dict) or "params" not in param_group:
            raise MicaError(f"{type(self).__name__}.add_param_group takes a dict with 'params'", user_location())
        group = _Group({**self.hyper, **_group(param_group)})
        _one_group_each(type(self).__name__, [g["params"] for g in (self.param_groups or []) + [group]])
        self._check(self._hyper_of(group), f"group {len(self.param_groups or ())}: ")
        self.param_groups = (self.param_groups or []) + [group]

    def _members(self):
        """[[Parameter]] per group, in torch's order (the indices its state_dict keys them by)."""
        keys = getattr(self, "_held_keys", None) or {}
        return [[keys.get(p) if isinstance(p, str) else p for p in g["params"]] if not callable(g["params"]) else []
                for g in self.param_groups or ()]

    def state_dict(self):
        """torch's layout: {"state": {index: {"step": ..., "exp_avg": ..., ...}}, "param_groups":
        [{settings, "params": [index, ...]}]}, each parameter its index in the groups' order, with
        the state a torch-style compiled step keeps (mica/stateful.py; numpy arrays). A functional
        step's state is the value its update returns."""
        held, keys = getattr(self, "_held_state", None), getattr(self, "_held_keys", None) or {}
        name_of = {id(p): n for n, p in keys.items()}
        state, groups, index = {}, [], 0
        for g, members in zip(self.param_groups or (), self._members()):
            groups.append({**{k: v for k, v in g.items() if k != "params"},
                           "params": list(range(index, index + len(members)))})
            for p in members:
                n = name_of.get(id(p))
                entry = {part: value[n] for part, value in (held or {}).items() if isinstance(value, dict) and n in value}
                if entry:
                    entry.update({part: value for part, value in held.items() if not isinstance(value, dict)})
                    entry = self._torch_entry(entry, g)
                if entry:
                    state[index] = entry
                index += 1
        return {"state": state, "param_groups": groups}

    eager_state = False  # (True: torch's optimizer makes every parameter's state when it is made, Adagrad's)
    optional_state = ()  # (state parts kept only under some settings: Adam's max_exp_avg_sq with amsgrad)

    def _torch_entry(self, entry, group):
        """A parameter's state as torch's optimizer keeps it: none for one never stepped (frozen, or
        one the loss never reached), the count a float32 as torch's; a subclass drops what torch's
        keeps only under some settings."""
        if "step" in entry:
            count = float(np.asarray(entry["step"]))
            if count == 0 and not self.eager_state:
                return {}
            entry["step"] = np.asarray(count, np.float32)
        return entry

    def load_state_dict(self, state_dict):
        """torch's: a state_dict() of this optimizer, or of torch's own (its tensors read as numpy),
        matched to this one's parameters by their places in the groups."""
        from ..tensor import user_location

        name = type(self).__name__
        if not isinstance(state_dict, dict) or not isinstance(state_dict.get("state"), dict) or \
                not isinstance(state_dict.get("param_groups"), (list, tuple)):
            raise MicaError(f"{name}.load_state_dict takes an optimizer's state_dict() (a dict with 'state' and "
                            "'param_groups'), as torch's", user_location())
        saved, members = state_dict["param_groups"], self._members()
        sizes = [len(g.get("params", ())) if isinstance(g, dict) else -1 for g in saved]
        if sizes != [len(m) for m in members]:
            raise MicaError(f"{name}.load_state_dict: the state has groups of {sizes} parameters, this optimizer "
                            f"groups of {[len(m) for m in members]}; make it with the same groups as the one saved",
                            user_location())
        try:  # (the parts this optimizer's state has, from a small one of its own)
            known = set(self._init({"p": np.zeros((2, 2), np.float32)}))
        except Exception:
            known = None
        if known is not None:
            known |= set(self.optional_state)
        taken = switched_on(saved, self)  # (an option this optimizer refuses when made is refused when loaded)
        if taken:
            raise MicaError(f"{name}.load_state_dict: the state was saved with {taken}=True, torch's option "
                            f"Mica does not have, so it cannot go on as that run did", user_location())
        held, keys = {}, {}
        for g, saved_group, ps in zip(self.param_groups or (), saved, members):
            g.update({k: v for k, v in saved_group.items() if k != "params"})
            for index, p in zip(saved_group["params"], ps):
                entry = state_dict["state"].get(index, state_dict["state"].get(str(index)))
                if not entry or p is None:
                    continue
                unknown = sorted(set(entry) - known) if known is not None else []
                if unknown:
                    raise MicaError(f"{name}.load_state_dict: the state holds {unknown[0]!r}, which {name} does not "
                                    "keep: it is another optimizer's", user_location())
                key = f"#{len(keys)}"
                keys[key] = p
                for part, value in entry.items():
                    if value is not None:  # (torch's SGD without momentum keeps momentum_buffer None)
                        held.setdefault(part, {})[key] = _state_array(part, value)
                if "step" in (known or ()) and "step" not in entry:  # (torch's SGD keeps no count: a state means it stepped)
                    held.setdefault("step", {})[key] = np.asarray(1, np.int64)
        self._held_state, self._held_keys = (held, keys) if held else (None, None)

    def __getattr__(self, name):  # (a torch.optim.Optimizer method Mica lacks: its sentence)
        if name.startswith("_"):
            raise AttributeError(name)
        from ..errors import missing_verb

        raise missing_verb(f"{type(self).__name__}.", name, "torch.optim.Optimizer.")

    def zero_grad(self, set_to_none=True):
        """(Mica's gradients are values a step returns; in a torch-style compiled step, mica/stateful.py,
        those of this optimizer's parameters are dropped.)"""
        from .. import stateful

        if stateful.active() is not None:
            stateful.zero_grad([p for _, ps in stateful._groups_of(self, stateful.active()) for p in ps], set_to_none)
        else:
            stateful.zero_held_grads([p for g in self.param_groups or () if not callable(g["params"])
                                      for p in g["params"] if type(p).__name__ == "Parameter"], set_to_none)

    def step(self, closure=None):
        from .. import stateful
        from ..tensor import user_location

        if stateful.active() is not None:
            if closure is None:
                return stateful.step(self)
            from ..grad import enable_grad

            with enable_grad():  # (torch's: the closure recomputes the loss and its gradients, then the step)
                loss = closure()
            stateful.step(self)
            return loss
        raise MicaError(f"{type(self).__name__}.step() updates parameters in a compiled step: put the step in a "
                        "function under @mica.compile, or write params, state = optimizer.update(params, grads, "
                        "state) in a traced one, with state = optimizer.init(params) made once outside "
                        "(docs/api.md, Optimizers)", user_location())

    def state_specs(self, param_specs):
        """The state's signature from the parameters' Specs (for tracing without values)."""
        from .. import pytree

        fake = {n: np.zeros(param_specs[n].shape, param_specs[n].dtype.np_storage)
                for n in self.managed(list(param_specs))}
        return pytree.tree_map(Spec.of, self._init(fake))

    def update(self, params, grads, state, lr=None, lr_scale=None):
        """A parameter the loss never reads (its gradient is zero by construction: torch's None) is
        left as it is with its state, as torch's optimizers skip it: no decay, no momentum."""
        new_params = dict(params)
        new_state = self._update(new_params, grads, state, self._group_lrs(params, lr, lr_scale))
        for n in self.managed(list(params)):
            if n in grads and not has_gradient(grads[n]):
                new_params[n] = params[n]
                for key, part in new_state.items():
                    if isinstance(part, dict) and n in part and isinstance(state.get(key), dict) and n in state[key]:
                        part[n] = state[key][n]
        _record_updates(params, new_params, "parameter")
        _record_updates(state, new_state, "optimizer state")
        return new_params, new_state

    def _group_lrs(self, params, lr, lr_scale):
        result = []
        for hyper, names in self.groups(list(params)):
            g_lr = hyper["lr"] if lr is None else lr
            if lr_scale is not None:
                g_lr = g_lr * lr_scale
            result.append((hyper, names, g_lr))
        return result

    def _init(self, params):
        raise NotImplementedError

    def _update(self, params, grads, state, groups):
        raise NotImplementedError


# ops whose result is 0 wherever the inputs named are 0 (all of them: every input; "any": one)
_ZERO_IF = {"expand": "all", "reshape": "all", "permute": "all", "slice": "all", "cast": "all", "neg": "all",
            "detach": "all", "add": "all", "sub": "all", "mul": "any", "div": "first", "where": "branches",
            "all_reduce": "all", "reduce_scatter": "all", "all_gather": "all"}


def has_gradient(g):
    """False where a gradient is mica.grad's zeros for a tensor the loss does not reach (torch's
    None), however it was since summed, scaled (clipping) or reshaped; a gradient the loss reaches
    through a product with 0 (torch's zeros: `0.0 * p.sum()`) is one, decayed and counted."""
    from ..tensor import Tensor

    return not isinstance(g, Tensor) or not _zero_by_construction(g._value, g._ctx.graph.unreached)


def _zero_by_construction(value, unreached):
    todo, seen = [value], set()
    while todo:
        v = todo.pop()
        if v.id in seen or v.id in unreached:
            continue
        seen.add(v.id)
        node, rule = v.node, _ZERO_IF.get(v.node.op)
        if node.op == "const":
            return False
        elif rule == "any":
            if not any(_zero_by_construction(i, unreached) for i in node.inputs):
                return False
        elif rule == "first":
            todo.append(node.inputs[0])
        elif rule == "branches":
            todo.extend(node.inputs[1:3])
        elif rule == "all":
            todo.extend(node.inputs)
        else:
            return False
    return True


def _record_updates(old, new, role):
    """Tell the compiler which new values replace which inputs, so the memory plan updates in place."""
    from .. import pytree
    from ..grad import mark_role
    from ..tensor import Tensor, current

    is_t = lambda x: isinstance(x, Tensor)  # noqa: E731
    old_leaves, old_tree = pytree.flatten(old, is_leaf=is_t)
    new_leaves, new_tree = pytree.flatten(new, is_leaf=is_t)
    if old_tree != new_tree:
        return
    graph = current("optimizer update").graph
    for o, n in zip(old_leaves, new_leaves):
        if is_t(o) and is_t(n):
            mark_role(graph, o, role)
            mark_role(graph, n, role)
            if o.value.node.op == "input":
                graph.updates.setdefault(n.value.id, o.value.id)


def step_counts(state):
    """(the state's step count plus one: one count, or one per parameter as torch keeps them in a
    torch-form step (mica/stateful.py's state); a function of a parameter's name giving its new count
    as float64, as torch's step.item() is a Python float, converted once per count)."""
    from .. import dtypes, verbs as F

    steps, converted = state["step"], {}
    each = isinstance(steps, dict)
    new = {n: s + 1 for n, s in steps.items()} if each else steps + 1

    def count(name):
        key = name if each else None
        if key not in converted:
            converted[key] = F.to(new[name] if each else new, dtypes.float64)
        return converted[key]

    return new, count


def zeros_like_tree(params):
    return {n: np.zeros_like(a) for n, a in params.items()}


RULES = {"rate": (lambda v: 0.0 <= v < float("inf"), "a finite number >= 0"),
         "fraction": (lambda v: 0.0 <= v < 1.0, "a number in [0, 1)"),
         "nonnegative": (lambda v: 0.0 <= v, "a number >= 0"),
         "unit": (lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]")}


def _one_group_each(name, groups):
    """A Parameter object named by two groups: torch's sentence, at the user's line. One named twice
    in a group is refused too: torch keeps both entries and steps it twice, warning that this will
    be an error; here it would be stepped once, so it is a sentence rather than another model."""
    from ..tensor import user_location

    seen = {}
    for i, params in enumerate(groups):
        if callable(params):
            continue
        unique = []
        for p in params:
            if type(p).__name__ == "Parameter" and any(p is q for q in unique):
                raise MicaError(f"{name}: a parameter appears twice in parameter group {i} (torch steps it twice "
                                "and warns that this will be an error); list each parameter once", user_location())
            unique.append(p)
            if type(p).__name__ == "Parameter":
                if id(p) in seen:
                    raise MicaError(f"{name}: some parameters appear in more than one parameter group (groups "
                                    f"{seen[id(p)]} and {i}); give each parameter one group", user_location())
                seen[id(p)] = i
        params[:] = unique


def _state_array(part, value):
    """A saved state entry (numpy, or a torch tensor) as the step holds it: the count an int64."""
    from ..nn.modules import _from_torch

    arr = np.asarray(_from_torch(value))
    return np.asarray(int(float(arr)), np.int64) if part == "step" else np.array(arr)


def _number_of(x):
    """A learning rate given as a tensor (torch takes one) as its number."""
    from ..tensor import Tensor

    from ..nn.modules import _from_torch

    if hasattr(x, "shape") and not isinstance(x, (int, float, np.generic, Tensor)) and math.prod(x.shape) == 1:
        return float(np.asarray(_from_torch(x)).reshape(()))
    return x


def _number(x):
    """A plain Python or numpy real."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _traced(x):
    """A value computed in the step (a learning rate's schedule): the step's to check."""
    from ..tensor import Tensor

    return isinstance(x, Tensor)
