"""torch.utils.checkpoint: a function whose activations torch recomputes in the backward pass
instead of keeping. Mica decides what to keep and what to recompute for the whole step, from its
memory budget (docs/design.md, rematerialization), so checkpoint(fn, *args) is fn(*args): the same
values and gradients as torch's."""


def checkpoint(function, *args, use_reentrant=None, context_fn=None, determinism_check="default", debug=False,
               preserve_rng_state=True, **kwargs):
    return function(*args, **kwargs)


def checkpoint_sequential(functions, segments, input, use_reentrant=None, **kwargs):
    """torch's: the modules of `functions` applied in turn (recomputation is Mica's planner's)."""
    for f in (functions.children() if hasattr(functions, "children") else functions):
        input = f(input)
    return input
