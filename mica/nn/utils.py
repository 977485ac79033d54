"""torch.nn.utils: clip_grad_norm_ on the gradients a torch-style compiled step keeps (mica/stateful.py)."""
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
        raise MicaError("clip_grad_norm_ clips the gradients backward() gave in a compiled step (@mica.compile); in "
                        "a functional step use mica.optim.clip_grad_norm(grads, max_norm)", user_location())
    params = _parameters(parameters, step, "clip_grad_norm_")
    grads = {i: step.grads[id(p)] for i, p in enumerate(params) if id(p) in step.grads}
    if not grads:
        from .. import verbs as F

        return F.zeros(())
    return clip_grad_norm(grads, max_norm, norm_type, error_if_nonfinite)


clip_grad_norm = clip_grad_norm_


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
        raise MicaError("clip_grad_value_ clamps the gradients backward() gave in a compiled step (@mica.compile)",
                        user_location())
    for p in _parameters(parameters, step, "clip_grad_value_"):
        if id(p) in step.grads:
            step.grads[id(p)] = F.clamp(step.grads[id(p)], -float(clip_value), float(clip_value))


def parameters_to_vector(parameters):
    """torch's: the parameters' values flattened and joined, in order."""
    import mica  # (its eager-wrapped verbs: this runs outside a trace too)

    return mica.cat([mica.reshape(p, (-1,)) for p in parameters], 0)


def __getattr__(name):  # (torch.nn.utils's other functions: Mica's sentence, not an AttributeError)
    if name.startswith("_"):
        raise AttributeError(name)
    from ..errors import missing_verb

    raise missing_verb("mica.nn.utils.", name, "torch.nn.utils.")
