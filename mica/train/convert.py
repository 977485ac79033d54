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
    if os.path.isdir(to):
        raise MicaError(f"--to {to} is a folder; give the path of the file to write, e.g. {os.path.join(to, 'ckpt.pt')}")
    st = ckpt.SafeTensors(os.path.join(out_dir, "ckpt.safetensors"))
    try:
        cfg = json.loads(st.metadata.get("config", "{}"))
    except ValueError:
        raise MicaError(f"checkpoint {st.path} has unreadable config metadata") from None
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
    ck = {"model": model, "optimizer": optimizer, "model_args": model_args,
          "iter_num": int(st.metadata.get("iter_num", 0)),
          "best_val_loss": float(st.metadata.get("best_val_loss", 1e9)), "config": cfg}
    _save_atomically(torch, ck, to)


def _save_atomically(torch, obj, to):
    """torch.save to a temporary file beside `to`, then rename: a failure never leaves a partial
    ckpt.pt (nor replaces a good one). A missing folder is created, as mica import's --out_dir is."""
    from ..files import writable_folder

    writable_folder(os.path.dirname(os.path.abspath(to)), "folder of --to")
    tmp = f"{to}.tmp{os.getpid()}"
    try:
        torch.save(obj, tmp)
        os.replace(tmp, to)
    except (OSError, RuntimeError) as e:  # torch reports a failed write as a RuntimeError
        try:
            os.unlink(tmp)
        except OSError:
            pass
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().splitlines()[-1][:200]
        raise MicaError(f"cannot write {to} ({why}); choose a path in a folder you can write to") from None


def import_nanogpt(path, out_dir):
    torch = _torch()
    if not os.path.exists(path):
        raise MicaError(f"{path} does not exist")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
        sd = {k.removeprefix("_orig_mod."): v for k, v in ck["model"].items()}
    except Exception as e:
        raise MicaError(f"{path} is not a readable nanoGPT checkpoint ({type(e).__name__})") from None
    tensors = {k: v.detach().float().numpy() for k, v in sd.items() if k != "lm_head.weight"}
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
            tensors[f"optimizer.exp_avg.{n}"] = s["exp_avg"].float().numpy()
            tensors[f"optimizer.exp_avg_sq.{n}"] = s["exp_avg_sq"].float().numpy()
            tensors["optimizer.step"] = np.asarray(int(float(s["step"])), dtype=np.int64)
    cfg = dict(ck.get("config", {}))
    cfg.update({k: v for k, v in ck.get("model_args", {}).items() if k != "vocab_size"})
    out = os.path.join(out_dir, "ckpt.safetensors")
    ckpt.write(out, tensors, {"format": "mica", "imported_from": os.path.abspath(path),
                              "iter_num": ck.get("iter_num", 0), "best_val_loss": ck.get("best_val_loss", 1e9),
                              "config": json.dumps(cfg)})
    return out
