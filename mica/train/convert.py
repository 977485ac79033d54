"""Move between Mica's checkpoints and nanoGPT's ckpt.pt (torch needed for the .pt side)."""
import json
import os

import numpy as np

from ..errors import MicaError
from . import checkpoint as ckpt

MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")


def _torch():
    try:
        import torch
    except ImportError:
        raise MicaError("converting to or from nanoGPT's ckpt.pt needs PyTorch: pip install torch") from None
    return torch


def _groups(names, shapes):
    """nanoGPT's optimizer groups as index lists: 2-D and larger decay, the rest do not."""
    return [[n for n in names if len(shapes[n]) >= 2], [n for n in names if len(shapes[n]) < 2]]


def export_nanogpt(out_dir, to):
    torch = _torch()
    st = ckpt.SafeTensors(os.path.join(out_dir, "ckpt.safetensors"))
    cfg = json.loads(st.metadata.get("config", "{}"))
    params = [n for n in st.names if not n.startswith(("optimizer.", "data."))]
    shapes = {n: st.info(n)[1] for n in params}
    model = {n: torch.from_numpy(st.read(n).copy()) for n in params}
    model["lm_head.weight"] = model["transformer.wte.weight"]  # the tie, one tensor under both names
    decay, nodecay = _groups(params, shapes)
    order = decay + nodecay
    state = {}
    if "optimizer.step" in st.names:
        step = float(st.read("optimizer.step"))
        for i, n in enumerate(order):
            state[i] = {"step": torch.tensor(step), "exp_avg": torch.from_numpy(st.read(f"optimizer.exp_avg.{n}").copy()),
                        "exp_avg_sq": torch.from_numpy(st.read(f"optimizer.exp_avg_sq.{n}").copy())}
    group = dict(lr=cfg.get("learning_rate", 6e-4), betas=(cfg.get("beta1", 0.9), cfg.get("beta2", 0.95)), eps=1e-8,
                 amsgrad=False, foreach=None, maximize=False, capturable=False, differentiable=False, fused=None)
    optimizer = {"state": state, "param_groups": [
        {**group, "weight_decay": cfg.get("weight_decay", 0.1), "params": list(range(len(decay)))},
        {**group, "weight_decay": 0.0, "params": list(range(len(decay), len(order)))}]}
    model_args = {k: cfg.get(k) for k in MODEL_ARGS}
    model_args["vocab_size"] = shapes["transformer.wte.weight"][0]
    torch.save({"model": model, "optimizer": optimizer, "model_args": model_args,
                "iter_num": int(st.metadata.get("iter_num", 0)),
                "best_val_loss": float(st.metadata.get("best_val_loss", 1e9)), "config": cfg}, to)


def _plain(value):
    """A value from a ckpt.pt as plain Python: nanoGPT saves best_val_loss as a 0-d tensor (and a
    config may hold numpy scalars); dicts, lists and tuples are converted throughout."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return value.item()
    if type(value).__module__.startswith("torch") and hasattr(value, "numel") and value.numel() == 1:
        return value.item()
    return value


def _is_mask_buffer(name, value):
    """Older nanoGPT (no flash attention) registers its causal mask as `attn.bias`, a 4-D buffer
    (not a parameter, and not `attn.c_attn.bias`)."""
    return name.endswith(".attn.bias") and getattr(value, "ndim", 4) != 1


def import_nanogpt(path, out_dir):
    torch = _torch()
    if not os.path.exists(path):
        raise MicaError(f"{path} does not exist")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
        sd = {k.removeprefix("_orig_mod."): v for k, v in ck["model"].items()}
        sd = {k: v for k, v in sd.items() if not _is_mask_buffer(k, v)}
        tensors = {k: v.detach().float().numpy() for k, v in sd.items() if k != "lm_head.weight"}
    except Exception as e:
        raise MicaError(f"{path} is not a readable nanoGPT checkpoint ({type(e).__name__})") from None
    if "transformer.wte.weight" not in tensors and "lm_head.weight" in sd:
        tensors["transformer.wte.weight"] = sd["lm_head.weight"].float().numpy()
    shapes = {n: a.shape for n, a in tensors.items()}
    opt = ck.get("optimizer")
    if opt and opt.get("state"):
        order = sum(_groups(list(tensors), shapes), [])
        for i, n in enumerate(order):
            s = opt["state"].get(i)
            if s is None:
                continue
            try:
                m, v = s["exp_avg"].float().numpy(), s["exp_avg_sq"].float().numpy()
                step = int(float(s["step"]))
            except Exception as e:
                raise MicaError(f"{path}: the optimizer state of {n} is unreadable ({type(e).__name__})") from None
            if m.shape != shapes[n] or v.shape != shapes[n]:
                raise MicaError(f"{path}: the optimizer state {i} is {list(m.shape)}, but parameter {n} (its place in "
                                f"nanoGPT's groups) is {list(shapes[n])}; the checkpoint's optimizer does not "
                                "match its model")
            tensors[f"optimizer.exp_avg.{n}"] = m
            tensors[f"optimizer.exp_avg_sq.{n}"] = v
            tensors["optimizer.step"] = np.asarray(step, dtype=np.int64)
    cfg = _plain(dict(ck.get("config", {})))
    cfg.update({k: v for k, v in _plain(dict(ck.get("model_args", {}))).items() if k != "vocab_size"})
    try:
        iter_num, best = int(_plain(ck.get("iter_num", 0))), float(_plain(ck.get("best_val_loss", 1e9)))
    except (TypeError, ValueError):
        raise MicaError(f"{path} has an iter_num or best_val_loss that is not a number") from None
    out = os.path.join(out_dir, "ckpt.safetensors")
    ckpt.write(out, tensors, {"format": "mica", "imported_from": os.path.abspath(path),
                              "iter_num": iter_num, "best_val_loss": repr(best),
                              "config": json.dumps(cfg, default=str)})
    return out
