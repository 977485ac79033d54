"""torch.nn.utils: clip_grad_norm_ on the gradients a torch-style compiled step keeps (mica/stateful.py): inside
the step, or outside it on those the last step left (torch's p.grad)."""
import numpy as np

from ..errors import MicaError


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scale the gradients backward() gave `parameters` so their global norm is at most max_norm;
    returns the norm before clipping (torch's). In a functional step, mica.optim.clip_grad_norm(grads,
    max_norm) does the same on the grads dict."""
    from .. import stateful
    from ..optim import clip_grad_norm
    from ..tensor import user_location

    step = stateful.active()
    if step is None:
        held = _held_grads(parameters, "clip_grad_norm_")
        if held is None:
            raise MicaError("clip_grad_norm_ clips the gradients backward() gave in a compiled step (@mica.compile); "
                            "in a functional step use mica.optim.clip_grad_norm(grads, max_norm)", user_location())
        if not held:  # (torch's: no gradients, a norm of 0)
            from ..host import host

            return host(np.zeros((), np.float32))
        from ..host import run

        # (outside a step: the gradients the last compiled step left, clipped in place as torch's p.grad;
        # with error_if_nonfinite their norm is found first on copies, so a refusal changes none of them)
        if error_if_nonfinite and not np.isfinite(float(run(
                lambda *gs: clip_grad_norm(list(gs), max_norm, norm_type), [g.copy() for g in held], {}))):
            raise MicaError(f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is non-finite, so "
                            "it cannot be clipped; find where they overflow, or pass error_if_nonfinite=False",
                            user_location())
        return run(lambda *gs: clip_grad_norm(list(gs), max_norm, norm_type), held, {})
    params = _parameters(parameters, step, "clip_grad_norm_")
    grads = {i: step.grads[id(p)] for i, p in enumerate(params) if id(p) in step.grads}
    if not grads:
        from .. import verbs as F

        return F.zeros(())
    return clip_grad_norm(grads, max_norm, norm_type, error_if_nonfinite)


clip_grad_norm = clip_grad_norm_


def _held_grads(parameters, verb):
    """Outside any trace: the gradients the Parameters `parameters` names keep between compiled steps
    (torch's p.grad), as arrays written in place; None inside a trace that is not a compiled step."""
    from ..tensor import in_trace, user_location

    if in_trace():
        return None
    given = [parameters] if type(parameters).__name__ == "Parameter" else list(parameters)
    for x in given:
        if type(x).__name__ != "Parameter":
            raise MicaError(f"{verb} takes the model's parameters (model.parameters(), or one parameter), got a "
                            f"{type(x).__name__}", user_location())
    return [p._held_grad for p in given if getattr(p, "_held_grad", None) is not None]


def _parameters(given, step, verb):
    """The Parameters `given` names: one Parameter, or the tensor a step reads for one (model.weight
    inside the step), or an iterable of either (model.parameters()); never a tensor's rows."""
    from ..tensor import Tensor, user_location

    def one(x):
        if type(x).__name__ == "Parameter":
            return x
        p = step.parameter_of(x) if isinstance(x, Tensor) else None
        if p is None:
            raise MicaError(f"{verb} takes the model's parameters (model.parameters(), or one parameter), got a "
                            f"{type(x).__name__} that is not one", user_location())
        return p
    if type(given).__name__ == "Parameter" or isinstance(given, Tensor):
        return [one(given)]
    return [one(x) for x in given]


def clip_grad_value_(parameters, clip_value, foreach=None):
    """torch's: each gradient backward() gave `parameters` clamped to [-clip_value, clip_value]."""
    from .. import stateful
    from .. import verbs as F
    from ..tensor import user_location

    step = stateful.active()
    if step is None:
        held = _held_grads(parameters, "clip_grad_value_")
        if held is None:
            raise MicaError("clip_grad_value_ clamps the gradients backward() gave in a compiled step (@mica.compile)",
                            user_location())
        for g in held:  # (outside a step: the kept gradients, in place, as torch's p.grad)
            np.clip(g, -float(clip_value), float(clip_value), out=g)
        return None
    for p in _parameters(parameters, step, "clip_grad_value_"):
        if id(p) in step.grads:
            step.grads[id(p)] = F.clamp(step.grads[id(p)], -float(clip_value), float(clip_value))


def parameters_to_vector(parameters):
    """torch's: the parameters' values flattened and joined, in order."""
    import mica  # (its eager-wrapped verbs: this runs outside a trace too)

    return mica.cat([mica.reshape(p, (-1,)) for p in parameters], 0)


def pad_sequence(sequences, batch_first=False, padding_value=0.0, padding_side="right"):
    """torch.nn.utils.rnn.pad_sequence: tensors [L_i, *] padded with padding_value to the longest
    and stacked, [L, B, *] (or [B, L, *] with batch_first); padding_side "left" pads before."""
    import mica
    from ..tensor import user_location

    sequences = list(sequences)
    if not sequences:
        raise MicaError("pad_sequence takes at least one tensor", user_location())
    if padding_side not in ("left", "right"):
        raise MicaError(f"pad_sequence: padding_side must be 'left' or 'right', got {padding_side!r}", user_location())
    rest = {tuple(s.shape[1:]) for s in sequences}
    if len(rest) > 1 or any(s.ndim == 0 for s in sequences):
        raise MicaError(f"pad_sequence takes tensors [L, *] that differ only in L, got shapes "
                        f"{[tuple(s.shape) for s in sequences]}", user_location())
    longest = max(s.shape[0] for s in sequences)
    padded = []
    for s in sequences:
        missing = longest - s.shape[0]
        counts = [0, 0] * (s.ndim - 1) + ([missing, 0] if padding_side == "left" else [0, missing])
        padded.append(mica.nn.functional.pad(s, tuple(counts), value=padding_value) if missing else s)
    return mica.stack(padded, 0 if batch_first else 1)


def _rnn_module():
    """torch.nn.utils.rnn: pad_sequence; packed sequences are a sentence (Mica's recurrent modules
    take padded batches: mask the padded steps' outputs instead)."""
    import sys
    import types

    module = types.ModuleType(__name__ + ".rnn", _rnn_module.__doc__)
    module.pad_sequence = pad_sequence

    def _missing(name):
        if name.startswith("_"):
            raise AttributeError(name)
        from ..errors import missing_verb

        raise missing_verb("mica.nn.utils.rnn.", name, "torch.nn.utils.rnn.")
    module.__getattr__ = _missing
    sys.modules[module.__name__] = module
    return module


rnn = _rnn_module()


def __getattr__(name):  # (torch.nn.utils's other functions: Mica's sentence, not an AttributeError)
    if name.startswith("_"):
        raise AttributeError(name)
    from ..errors import missing_verb

    raise missing_verb("mica.nn.utils.", name, "torch.nn.utils.")
