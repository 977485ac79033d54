"""Several optimizers over disjoint parameters, stepped together (the speedrun's AdamW + Muon, as
its loop calls `for opt in optimizers: opt.step()`). The state is {optimizer name: its state}."""
from ..errors import MicaError


class Optimizers:
    def __init__(self, **optimizers):
        if not optimizers:
            raise MicaError("Optimizers needs at least one optimizer")
        self.optimizers = dict(optimizers)

    def managed(self, names):
        out, owner = [], {}
        for key, opt in self.optimizers.items():
            for n in opt.managed(names):
                if n in owner:
                    raise MicaError(f"parameter {n!r} is managed by both {owner[n]} and {key}")
                owner[n] = key
                out.append(n)
        return out

    def init(self, params):
        self.managed(list(params))
        return {key: opt.init(params) for key, opt in self.optimizers.items()}

    def state_specs(self, param_specs):
        self.managed(list(param_specs))
        return {key: opt.state_specs(param_specs) for key, opt in self.optimizers.items()}

    def update(self, params, grads, state, lr=None, lr_scale=None):
        new_state = {}
        for key, opt in self.optimizers.items():
            params, new_state[key] = opt.update(params, grads, state[key], lr=lr, lr_scale=lr_scale)
        return params, new_state
