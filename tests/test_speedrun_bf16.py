"""The speedrun seed's precision (dtype="bfloat16"): a bfloat16 embedding, bf16 activations where
the seed's are, and AdamW on that bf16 parameter as torch's fused AdamW (the seed's fused=True)
computes it; compiled for the CPU against PyTorch's own bf16 arithmetic."""
import numpy as np
import pytest
import torch

import mica
from mica.train import checkpoint as ckpt


def _bf16(a):
    """float32 values rounded to bfloat16, as float32 (how a bf16 input travels in numpy)."""
    return ckpt.BF16Tensor.round(a).float32()


@pytest.mark.parametrize("fused", [True, False])
def test_adamw_on_a_bfloat16_parameter_is_torchs_adamw_bit_for_bit(fused):
    """Five steps (lr changing, as the schedule changes it; and weight decay) on 3 x 4099 values:
    the parameter and both bf16 moments equal torch's CPU AdamW bit for bit: its _fused_adamw_ with
    fused=True (the seed's), its single-tensor path by default (each step rounded to bfloat16, a
    traced lr read in float32 as torch reads a Python number: it was rounded to bfloat16 first)."""
    shape, steps = (3, 4099), 5
    rng = np.random.default_rng(0)
    p0 = _bf16(rng.standard_normal(shape).astype(np.float32))
    grads = [_bf16((s + 1) * rng.standard_normal(shape).astype(np.float32)) for s in range(steps)]
    for wd in (0.0, 0.1):
        opt = mica.optim.adamw(lr=0.3, betas=(0.8, 0.95), eps=1e-10, weight_decay=wd, fused=fused or None)
        specs = {"w": mica.Spec(shape, mica.bfloat16)}
        state_specs = opt.state_specs(specs)
        assert state_specs["exp_avg"]["w"].dtype is mica.bfloat16
        assert state_specs["exp_avg_sq"]["w"].dtype is mica.bfloat16

        def step(params, state, g, scale):
            return opt.update(params, {"w": g}, state, lr_scale=scale)

        exe = mica.trace(step, specs, state_specs, mica.Spec(shape, mica.bfloat16),
                         mica.f64[()]).lower("cpu", opt_level=2).build()
        tp = torch.from_numpy(p0.copy()).bfloat16().requires_grad_()
        topt = torch.optim.AdamW([tp], lr=0.3, betas=(0.8, 0.95), eps=1e-10, weight_decay=wd, fused=fused or None,
                                 foreach=False)
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


V, L, D, HD = 37, 2, 32, 16      # vocabulary, layers, width, head_dim (two heads)
MBS, T = 2, 8


def test_the_bfloat16_step_compiled_equals_the_seeds_model_in_bfloat16():
    """The seed's model as it trains (bf16 embedding, so bf16 activations into every Linear, norms
    and the rotary cast up to float32 and back, the logits cast up): the summed loss within 1e-2 of
    PyTorch's bf16 model (it is ~1e-4), and every gradient as far from float64's as bf16 puts
    PyTorch's own (each side's bf16 roundings fall in other places, so they agree to bf16's
    noise, ~1e-2, not bit for bit), and far from float32's answer (the bf16 really is there)."""
    from helpers import rel_err
    from mica.bench import torch_speedrun as TS
    from mica.models import speedrun as S

    model = S.build(V, L, D, HD)
    specs = model.param_specs()
    assert specs["embed.weight"].dtype is mica.bfloat16
    assert all(s.dtype is mica.float32 for n, s in specs.items() if n != "embed.weight")
    rng = np.random.default_rng(1)
    params = {n: (a.astype(np.float64) + 0.1 * rng.standard_normal(a.shape)).astype(np.float32)
              for n, a in model.init(seed=1).items()}
    params["embed.weight"] = _bf16(params["embed.weight"])
    prog = mica.trace(lambda p, x, y: mica.value_and_grad(S.loss_fn(model))(p, x, y), specs, mica.i64[MBS, T],
                      mica.i64[MBS, T])
    exe = prog.lower("cpu", opt_level=2).build()
    x, y = rng.integers(0, V, (MBS, T)), rng.integers(0, V, (MBS, T))
    loss, grads = exe(params, x, y, threads=2)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    sides = {}
    for dtype in ("bfloat16", "float64"):
        tmodel = TS.make_model(V, L, D, HD, dtype=dtype).load_arrays(params)
        tloss = tmodel(tx, ty)
        tloss.backward()
        sides[dtype] = tloss.item(), {n: p.grad.double().numpy() for n, p in tmodel.named_parameters()}
    assert dict(TS.make_model(V, L, D, HD).named_parameters())["embed.weight"].dtype is torch.bfloat16
    assert rel_err(loss, sides["bfloat16"][0]) < 1e-2
    for name in params:
        torch_bf16, exact = sides["bfloat16"][1][name], sides["float64"][1][name]
        assert rel_err(grads[name], torch_bf16) < 5e-2, name
        assert 1e-3 < rel_err(grads[name], exact) < 2 * rel_err(torch_bf16, exact) + 1e-3, name
