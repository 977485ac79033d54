"""mica.models.gpt against an independent PyTorch GPT of the same math, in float64."""
import numpy as np
import pytest
import torch

import mica
from helpers import rel_err, to_torch
from mica.bench.torch_gpt import TorchGPT
from mica.models.gpt import GPT, GPTConfig, loss_fn


def _specs(params, B, T, dtype=mica.float64):
    return ({n: mica.Spec(a.shape, dtype) for n, a in params.items()}, mica.i64[B, T], mica.i64[B, T])


@pytest.mark.parametrize("bias", [True, False])
def test_loss_and_every_gradient_match_torch(bias):
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=16, dropout=0.0, bias=bias)
    model = GPT(cfg)
    params = {n: a.astype(np.float64) for n, a in model.init(seed=7).items()}
    # Give every parameter random values (not only the init's zeros and ones), so each gradient is tested.
    rng = np.random.default_rng(1)
    params = {n: a + 0.1 * rng.standard_normal(a.shape) for n, a in params.items()}
    B, T = 3, 8
    idx = rng.integers(0, cfg.vocab_size, (B, T))
    targets = rng.integers(0, cfg.vocab_size, (B, T))
    targets[0, :2] = -1  # nanoGPT's ignore_index

    step = mica.trace(lambda p, x, y: mica.value_and_grad(loss_fn(model))(p, x, y), *_specs(params, B, T))
    loss, grads = mica.reference.run(step, params, idx, targets)

    tmodel = TorchGPT(cfg).double().load_arrays(params)
    _, tloss = tmodel(to_torch(idx), to_torch(targets))
    tloss.backward()
    assert rel_err(loss, tloss.item()) < 1e-10
    tparams = dict(tmodel.named_parameters())
    assert set(grads) == set(tparams)
    for name, g in grads.items():
        assert rel_err(g, tparams[name].grad.numpy()) < 1e-10, name


def test_parameter_names_are_nanogpts_state_dict_keys():
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=16, bias=True)
    model = GPT(cfg)
    params = model.init(seed=0)
    tmodel = TorchGPT(cfg)
    assert list(model.state_dict(params)) == list(tmodel.state_dict())
    assert list(params) == [n for n, _ in tmodel.named_parameters()]
    # the tie: one parameter, two state_dict names
    sd = model.state_dict(params)
    assert sd["lm_head.weight"] is sd["transformer.wte.weight"]


def test_parameter_counts_match_nanogpt():
    shakespeare = GPT(GPTConfig(block_size=256, vocab_size=65, n_layer=6, n_head=6, n_embd=384, bias=False))
    assert shakespeare.get_num_params() == 10_646_784   # nanoGPT prints 10.65M
    gpt2 = GPT(GPTConfig(block_size=1024, vocab_size=50304, n_layer=12, n_head=12, n_embd=768, bias=False))
    assert round(gpt2.get_num_params() / 1e6, 2) == 123.59


def test_init_follows_nanogpt():
    cfg = GPTConfig(block_size=32, vocab_size=50, n_layer=4, n_head=2, n_embd=64, bias=True)
    params = GPT(cfg).init(seed=3)
    assert np.all(params["transformer.h.0.ln_1.weight"] == 1) and np.all(params["transformer.h.0.ln_1.bias"] == 0)
    assert np.all(params["transformer.h.1.attn.c_attn.bias"] == 0)
    assert abs(params["transformer.h.0.mlp.c_fc.weight"].std() - 0.02) < 0.002
    assert abs(params["transformer.h.0.mlp.c_proj.weight"].std() - 0.02 / np.sqrt(8)) < 0.001
    assert abs(params["transformer.wpe.weight"].std() - 0.02) < 0.002
    again = GPT(cfg).init(seed=3)
    assert all(np.array_equal(params[n], again[n]) for n in params)
    other = GPT(cfg).init(seed=4)
    assert not np.array_equal(params["transformer.wpe.weight"], other["transformer.wpe.weight"])


def test_dropout_is_seeded_and_keyed_by_offset():
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=16, dropout=0.2)
    model = GPT(cfg)
    params = model.init(seed=0)
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, 11, (2, 8)), rng.integers(0, 11, (2, 8))
    prog = mica.trace(loss_fn(model), *_specs(params, 2, 8, mica.float32))
    assert prog.uses_rng
    a = mica.reference.run(prog, params, idx, targets, seed=1, offset=5)
    b = mica.reference.run(prog, params, idx, targets, seed=1, offset=5)
    c = mica.reference.run(prog, params, idx, targets, seed=1, offset=6)
    assert a == b and a != c
    model.eval()
    evalprog = mica.trace(loss_fn(model), *_specs(params, 2, 8, mica.float32))
    assert not evalprog.uses_rng


def test_inference_takes_the_last_position():
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=16)
    model = GPT(cfg)
    params = model.init(seed=0)

    def logits(p, idx):
        out, loss = mica.nn.functional_call(model, p, idx)
        assert loss is None
        return out

    prog = mica.trace(logits, model.param_specs(), mica.i64[2, 5])
    assert prog.outputs.shape == (2, 1, 11)
    idx = np.random.default_rng(0).integers(0, 11, (2, 5))
    tmodel = TorchGPT(cfg).load_arrays(params)
    want, _ = tmodel(to_torch(idx))
    assert rel_err(mica.reference.run(prog, params, idx, precision="float32"), want.detach().numpy()) < 1e-5
