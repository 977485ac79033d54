"""The speedrun seed's precision (dtype="bfloat16"): a bfloat16 embedding, bf16 activations where
the seed's are, and AdamW on that bf16 parameter as torch's fused AdamW (the seed's fused=True)
computes it; compiled for the CPU against PyTorch's own bf16 arithmetic."""
import numpy as np
import torch

import mica
from mica.train import checkpoint as ckpt


def _bf16(a):
    """float32 values rounded to bfloat16, as float32 (how a bf16 input travels in numpy)."""
    return ckpt.BF16Tensor.round(a).float32()


def test_adamw_on_a_bfloat16_parameter_is_torchs_fused_adamw_bit_for_bit():
    """Five steps (lr changing, as the schedule changes it; and weight decay) on 3 x 4099 values:
    the parameter and both bf16 moments equal torch's CPU _fused_adamw_ bit for bit."""
    shape, steps = (3, 4099), 5
    rng = np.random.default_rng(0)
    p0 = _bf16(rng.standard_normal(shape).astype(np.float32))
    grads = [_bf16((s + 1) * rng.standard_normal(shape).astype(np.float32)) for s in range(steps)]
    for wd in (0.0, 0.1):
        opt = mica.optim.adamw(lr=0.3, betas=(0.8, 0.95), eps=1e-10, weight_decay=wd)
        specs = {"w": mica.Spec(shape, mica.bfloat16)}
        state_specs = opt.state_specs(specs)
        assert state_specs["exp_avg"]["w"].dtype is mica.bfloat16
        assert state_specs["exp_avg_sq"]["w"].dtype is mica.bfloat16

        def step(params, state, g, scale):
            return opt.update(params, {"w": g}, state, lr_scale=scale)

        exe = mica.trace(step, specs, state_specs, mica.Spec(shape, mica.bfloat16),
                         mica.f64[()]).lower("cpu", opt_level=2).build()
        tp = torch.from_numpy(p0.copy()).bfloat16().requires_grad_()
        topt = torch.optim.AdamW([tp], lr=0.3, betas=(0.8, 0.95), eps=1e-10, weight_decay=wd, fused=True)
        params, state = {"w": p0}, opt.init({"w": p0})
        for s, g in enumerate(grads):
            scale = 1.0 - 0.15 * s
            params, state = exe(params, state, g, np.float64(scale), threads=2)
            topt.param_groups[0]["lr"] = 0.3 * scale
            tp.grad = torch.from_numpy(g).bfloat16()
            topt.step()
        ts = topt.state[tp]
        assert ts["exp_avg"].dtype is torch.bfloat16
        assert np.array_equal(params["w"], tp.detach().float().numpy())
        assert np.array_equal(state["exp_avg"]["w"], ts["exp_avg"].float().numpy())
        assert np.array_equal(state["exp_avg_sq"]["w"], ts["exp_avg_sq"].float().numpy())
        assert not np.array_equal(params["w"], p0)
