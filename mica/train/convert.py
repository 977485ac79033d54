"""Move between Mica's checkpoints and nanoGPT's ckpt.pt (torch needed for the .pt side)."""
import errno
import json
import os
import re
import warnings

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


FLOATS = (np.dtype(np.float32), np.dtype(np.float16), ckpt.BFLOAT16)


def check_gpt_tensors(found, args, where, dtypes=(np.dtype(np.float32),)):
    """`found` ({name: (dtype, shape)}) must be exactly nanoGPT's GPT of `args` (n_layer, n_head,
    n_embd, block_size, bias, vocab_size) in one of `dtypes`: the sentence names what differs."""
    from ..models.gpt import GPT, GPTConfig

    n_embd, n_head = args.get("n_embd"), args.get("n_head")
    small = [k for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")
             if isinstance(args.get(k), int) and args[k] < 1]
    if small:
        raise MicaError(f"{where} holds a GPT with {small[0]}={args[small[0]]}; a model needs at least one of each "
                        "(layers, heads, width, positions, tokens), so it is damaged or not a trained GPT")
    if isinstance(n_embd, int) and isinstance(n_head, int) and n_head > 0 and n_embd % n_head:
        raise MicaError(f"{where} says n_embd={n_embd} with n_head={n_head}, which does not divide it; a GPT's "
                        "heads share its width evenly, so it is damaged or not nanoGPT's model")
    try:
        config = GPTConfig(**{k: args[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")})
        want = {n: tuple(spec.shape) for n, spec in GPT(config).param_specs().items()}
    except Exception:  # (settings missing or of the wrong kind: no model to hold the tensors against)
        raise MicaError(f"{where} does not say which GPT it holds (n_layer, n_head, n_embd, block_size, bias, "
                        "vocabulary); it is not a checkpoint of nanoGPT's model") from None
    missing = [n for n in want if n not in found]
    extra = [n for n in found if n not in want]
    kinds = " or ".join(d.name for d in dtypes)
    wrong = [f"{n} is {found[n][0].name}{list(found[n][1])} where {list(want[n])} {kinds} belongs"
             for n in want if n in found and (tuple(found[n][1]) != want[n] or found[n][0] not in dtypes)]
    if missing or extra or wrong:
        parts = [f"missing {', '.join(missing[:3])}"] if missing else []
        parts += [f"unknown {', '.join(extra[:3])}"] if extra else []
        parts += wrong[:2]
        raise MicaError(f"{where} is not nanoGPT's GPT with n_layer={args['n_layer']}, n_embd={args['n_embd']}: "
                        f"{'; '.join(parts)}")


def _torch_tensor(torch, st, name):
    """A stored tensor as a torch tensor of its own dtype (BF16 from its bits, exactly)."""
    if st.info(name)[0] is ckpt.BFLOAT16:
        return torch.from_numpy(st.read_bits(name).view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(st.read(name).copy())


EXPORT_DTYPES = ("float32", "bfloat16", "float16")


def export_nanogpt(out_dir, to, dtype=None, force=True):
    """out_dir's checkpoint as nanoGPT's ckpt.pt: each weight in the dtype it is stored in, or all
    of them rounded to `dtype` (float32, bfloat16, float16: half copies of the float32 masters,
    rounded to nearest even, as torch's .to()); the optimizer's moments stay as stored. Without
    `force` a file already at `to` (nanoGPT's own checkpoint, maybe) is refused, not replaced."""
    if not to:
        raise MicaError("--to is empty; give the path of the ckpt.pt to write")
    if os.path.isdir(to):
        raise MicaError(f"--to {to} is a folder; give the path of the file to write, e.g. {os.path.join(to, 'ckpt.pt')}")
    _check_export_target(out_dir, to)
    if not force and os.path.isfile(to):
        raise MicaError(f"--to {to} already exists (a nanoGPT checkpoint?); give another path, or add --force to "
                        "replace it")
    if dtype is not None and dtype not in EXPORT_DTYPES:
        raise MicaError(f"--dtype must be one of {', '.join(EXPORT_DTYPES)}, got {dtype!r}")
    torch = _torch()  # (after the checks of the arguments: a refusal comes at once)
    st = ckpt.SafeTensors(os.path.join(out_dir, "ckpt.safetensors"))
    st.check_metadata()  # (its iteration and config go into the ckpt.pt)
    from .run import _saved_config

    cfg = _saved_config(st)  # (a dict whose model settings are checked)
    if cfg.get("recipe") == "speedrun":
        raise MicaError(f"{st.path} holds the speedrun recipe's model, which nanoGPT's ckpt.pt cannot hold (it is "
                        "nanoGPT's GPT only); sample from it with mica sample, or use the safetensors file itself")
    params = [n for n in st.names if not n.startswith(("optimizer.", "data."))]
    shapes = {n: st.info(n)[1] for n in params}
    if "transformer.wte.weight" not in shapes:
        raise MicaError(f"{st.path} holds no GPT weights (transformer.wte.weight)")
    check_gpt_tensors({n: st.info(n)[:2] for n in params},
                      {**cfg, "vocab_size": shapes["transformer.wte.weight"][0]}, st.path, dtypes=FLOATS)
    model = {n: _torch_tensor(torch, st, n) for n in params}
    if dtype is not None:
        half = {n: t.to(getattr(torch, dtype)) for n, t in model.items()}
        over = [n for n in params if bool((torch.isinf(half[n]) & torch.isfinite(model[n])).any())]
        if over:
            raise MicaError(f"{len(over)} weight(s) of {st.path} hold values past {dtype}'s range, which would be "
                            f"written as inf ({', '.join(over[:3])}{', ...' if len(over) > 3 else ''}); export them "
                            "in float32 or bfloat16 instead")
        model = half
    model["lm_head.weight"] = model["transformer.wte.weight"]  # the tie, one tensor under both names
    decay, nodecay = _groups(params, shapes)
    order = decay + nodecay
    state = {}
    if "optimizer.step" in st.names:
        step = float(st.read("optimizer.step"))
        for i, n in enumerate(order):
            state[i] = {"step": torch.tensor(step), "exp_avg": _torch_tensor(torch, st, f"optimizer.exp_avg.{n}"),
                        "exp_avg_sq": _torch_tensor(torch, st, f"optimizer.exp_avg_sq.{n}")}
    try:
        iter_num = int(st.metadata.get("iter_num", 0))
        best_val_loss = float(st.metadata.get("best_val_loss", 1e9))
        if not 0 <= iter_num < 2**62:
            raise ValueError
    except ValueError:
        raise MicaError(f"checkpoint {st.path} has no readable iter_num / best_val_loss in its metadata; use another "
                        "checkpoint") from None
    group = dict(lr=nanogpt_lr(cfg, iter_num), betas=(cfg.get("beta1", 0.9), cfg.get("beta2", 0.95)), eps=1e-8,
                 amsgrad=False, foreach=None, maximize=False, capturable=False, differentiable=False, fused=None)
    optimizer = {"state": state, "param_groups": [
        {**group, "weight_decay": cfg.get("weight_decay", 0.1), "params": list(range(len(decay)))},
        {**group, "weight_decay": 0.0, "params": list(range(len(decay), len(order)))}]}
    model_args = {k: cfg.get(k) for k in MODEL_ARGS}
    model_args["vocab_size"] = shapes["transformer.wte.weight"][0]
    ck = {"model": model, "optimizer": optimizer, "model_args": model_args,
          "iter_num": iter_num, "best_val_loss": torch.tensor(best_val_loss),
          "config": cfg}  # (best_val_loss as train.py keeps it: estimate_loss's mean, a 0-d float32 tensor)
    _save_atomically(torch, ck, to, need=os.path.getsize(st.path))


RUN_FILES = ("ckpt.safetensors", "init.safetensors", "init.new.safetensors", "metrics.jsonl", "trainer.manifest",
             "sample.manifest", ".mica.lock")  # what mica train keeps in a run's folder


def _check_export_target(out_dir, to):
    """A ckpt.pt goes to a new path or over a regular file: never over a device, a pipe or a socket
    (the rename would put a file in its place), a run's own files, or anything ending .safetensors
    (which would hold a PyTorch pickle). nanoGPT's ckpt.pt beside a run's files is fine."""
    import stat

    try:
        mode = os.stat(to).st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise MicaError(f"--to {to} is not a regular file (a device, a pipe or a socket); give the path of a "
                        "ckpt.pt to write")
    if to.endswith(".safetensors"):
        raise MicaError(f"--to {to} ends in .safetensors, but export writes nanoGPT's ckpt.pt (a PyTorch pickle); "
                        "give a path ending in .pt")
    folder, name = os.path.split(os.path.realpath(to))
    if name in RUN_FILES and (folder == os.path.realpath(out_dir) or os.path.exists(os.path.join(folder, ".mica.lock"))):
        raise MicaError(f"--to {to} is one of a mica run's own files, which export would replace; write the "
                        f"ckpt.pt beside them instead, e.g. {os.path.join(os.path.dirname(to), 'ckpt.pt')}")


def nanogpt_lr(cfg, iter_num):
    """The learning rate train.py's optimizer holds when it saves at `iter_num`: each iteration sets
    every group's lr to get_lr(iter_num) (or learning_rate without decay_lr) before its estimate and
    checkpoint, so a resume from the file starts where the schedule stands."""
    from ..optim.schedules import cosine_with_warmup
    from .config import DEFAULTS

    s = {k: cfg.get(k, DEFAULTS[k]) for k in ("decay_lr", "learning_rate", "warmup_iters", "lr_decay_iters", "min_lr")}
    if not s["decay_lr"]:
        return float(s["learning_rate"])
    return float(cosine_with_warmup(iter_num, s["learning_rate"], s["warmup_iters"], s["lr_decay_iters"], s["min_lr"]))


def _save_atomically(torch, obj, to, need=0):
    """torch.save to a temporary file beside `to`, then rename: a failure never leaves a partial
    ckpt.pt (nor replaces a good one). A missing folder is created, as mica import's --out_dir is.
    `need`, about the bytes it writes, tells a full disk (torch's error does not say) from the rest."""
    import shutil

    from ..files import writable_folder

    folder = os.path.dirname(os.path.abspath(to))
    writable_folder(folder, "folder of --to")
    tmp = f"{to}.tmp{os.getpid()}"
    try:
        torch.save(obj, tmp)
        os.replace(tmp, to)
    except (OSError, RuntimeError) as e:  # torch reports a failed write as a RuntimeError
        try:
            os.unlink(tmp)
        except OSError:
            pass
        free = shutil.disk_usage(folder).free
        if free < need or (isinstance(e, OSError) and e.errno == errno.ENOSPC):
            raise MicaError(f"cannot write {to}: its disk is full ({free:,} bytes free, about {need:,} needed); "
                            "free some space or choose a path on another disk") from None
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().splitlines()[-1][:200]
        raise MicaError(f"cannot write {to} ({why}); choose a path in a folder you can write to") from None


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


def looks_like_torch_save(path):
    """Whether `path` starts as torch.save's files do: its zip archive, or the legacy format's pickle."""
    with open(path, "rb") as f:
        head = f.read(4)
    return head == b"PK\x03\x04" or head[:1] == b"\x80"


def import_nanogpt(path, out_dir):
    torch = _torch()
    if not os.path.exists(path):
        raise MicaError(f"{path} does not exist; give the path of nanoGPT's ckpt.pt (or a GPT-2 model.safetensors) "
                        "to import")
    try:
        torch_file = looks_like_torch_save(path)
    except OSError as e:
        raise MicaError(f"cannot read {path} ({e.strerror})") from None
    if not torch_file:
        raise MicaError(f"{path} is not a PyTorch checkpoint (torch.save writes a zip archive, this file is "
                        "something else); give nanoGPT's ckpt.pt, or a Hugging Face model.safetensors")
    try:  # weights_only: a checkpoint is data; loading must never run code a pickle carries
        with warnings.catch_warnings():  # (a damaged file's warnings would come before the sentence)
            warnings.simplefilter("ignore")
            ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        if "unsupported global" in str(e).lower() or "weights only load failed" in str(e).lower():
            raise MicaError(f"{path} holds Python objects besides tensors and plain values, which Mica does not load "
                            "(loading them could run code); save the checkpoint with plain dicts, as nanoGPT does") \
                from None
        from .config_files import first_line

        said = first_line(e).split(". ")[0].rstrip(".")  # (torch's first sentence; the rest is advice)
        raise MicaError(f"{path} is not a readable PyTorch checkpoint (torch.load: {said[:150]}); it may be "
                        "truncated or damaged: copy it again, or give another checkpoint") from None
    if not isinstance(ck, dict) or not isinstance(ck.get("model"), dict):
        bare = isinstance(ck, dict) and any(str(k).endswith("wte.weight") for k in ck)
        raise MicaError(f"{path} " + ("holds bare model weights (a state_dict) without nanoGPT's model_args, so its "
                                      "number of heads is unknown; save it as nanoGPT's train.py does, "
                                      "{'model': state_dict, 'model_args': {...}, ...}" if bare else
                                      "has no 'model' entry, where nanoGPT's ckpt.pt keeps the weights; give a "
                                      "checkpoint that nanoGPT's train.py saved"))
    try:
        sd = {k.removeprefix("_orig_mod."): v for k, v in ck["model"].items()}
        sd = {k: v for k, v in sd.items() if not _is_mask_buffer(k, v)}
        tensors = {k: v.detach().float().numpy() for k, v in sd.items() if k != "lm_head.weight"}
    except Exception:
        raise MicaError(f"{path} is not a nanoGPT checkpoint: its 'model' entry is not a table of tensors by name, as "
                        "nanoGPT's train.py saves it; give a checkpoint that train.py saved") from None
    if "transformer.wte.weight" not in tensors and "lm_head.weight" not in sd:
        raise MicaError(f"{path} holds no GPT weights (no transformer.wte.weight or lm_head.weight); is it a nanoGPT "
                        "checkpoint?")
    if "transformer.wte.weight" not in tensors and "lm_head.weight" in sd:
        if not isinstance(sd["lm_head.weight"], torch.Tensor):
            raise MicaError(f"{path} is not a nanoGPT checkpoint: its lm_head.weight is a "
                            f"{type(sd['lm_head.weight']).__name__}, not a tensor")
        tensors["transformer.wte.weight"] = sd["lm_head.weight"].float().numpy()
    shapes = {n: a.shape for n, a in tensors.items()}
    if len(shapes["transformer.wte.weight"]) != 2:
        raise MicaError(f"{path} is not a nanoGPT checkpoint: its transformer.wte.weight is "
                        f"{list(shapes['transformer.wte.weight'])}, where a [vocabulary, n_embd] matrix belongs")
    head = sd.get("lm_head.weight")
    if head is not None and (not isinstance(head, torch.Tensor) or tuple(head.shape) != shapes["transformer.wte.weight"]
                             or not bool((head.float().numpy() == tensors["transformer.wte.weight"]).all())):
        raise MicaError(f"{path} has an lm_head.weight apart from transformer.wte.weight; nanoGPT's GPT ties them, "
                        "and so does Mica's")
    opt, config, model_args = ck.get("optimizer"), ck.get("config", {}), ck.get("model_args", {})
    if not all(isinstance(x, dict) for x in (opt or {}, config, model_args)) or not isinstance(
            (opt or {}).get("state", {}), dict):
        raise MicaError(f"{path} is not a nanoGPT checkpoint: its optimizer, config or model_args is not a dict")
    args = {**_plain(dict(config)), **_plain(dict(model_args)), "vocab_size": shapes["transformer.wte.weight"][0]}
    check_gpt_tensors({n: (a.dtype, a.shape) for n, a in tensors.items()}, args, path)
    if opt and opt.get("state"):
        order = sum(_groups(list(tensors), shapes), [])
        for i, n in enumerate(order):
            s = opt["state"].get(i)
            if s is None:
                continue
            try:
                m, v = s["exp_avg"].float().numpy(), s["exp_avg_sq"].float().numpy()
                step = int(float(s["step"]))
                if not 0 <= step < 2**62:  # (the trainer's step count is an int64)
                    raise ValueError("a step count out of range")
            except Exception as e:
                raise MicaError(f"{path}: the optimizer state of {n} is unreadable ({type(e).__name__})") from None
            if m.shape != shapes[n] or v.shape != shapes[n]:
                raise MicaError(f"{path}: the optimizer state {i} is {list(m.shape)}, but parameter {n} (its place in "
                                f"nanoGPT's groups) is {list(shapes[n])}; the checkpoint's optimizer does not "
                                "match its model")
            tensors[f"optimizer.exp_avg.{n}"] = m
            tensors[f"optimizer.exp_avg_sq.{n}"] = v
            tensors["optimizer.step"] = np.asarray(step, dtype=np.int64)
    cfg = _plain(dict(config))
    cfg.update({k: v for k, v in _plain(dict(model_args)).items() if k != "vocab_size"})
    if not all(isinstance(k, str) for k in cfg):
        raise MicaError(f"{path} is not a nanoGPT checkpoint: its config or model_args has a key that is not a name "
                        f"({next(repr(k) for k in cfg if not isinstance(k, str))[:40]})")
    try:
        iter_num, best = int(_plain(ck.get("iter_num", 0))), float(_plain(ck.get("best_val_loss", 1e9)))
        if not 0 <= iter_num < 2**62:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise MicaError(f"{path} has an iter_num or best_val_loss that is not a number (iter_num counts from 0)") from None
    out = os.path.join(out_dir, "ckpt.safetensors")
    ckpt.write(out, tensors, {"format": "mica", "imported_from": os.path.abspath(path),
                              "iter_num": iter_num, "best_val_loss": repr(best),
                              "config": json.dumps(cfg, default=str)})
    return out


# ---- Hugging Face GPT-2 (model.safetensors) -------------------------------------------------

GPT2_HEADS = {768: 12, 1024: 16, 1280: 20, 1600: 25}  # gpt2, -medium, -large, -xl
# HF's Conv1D keeps weights as [in, out]; nanoGPT's Linear as [out, in] (from_pretrained's list)
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
HF_IGNORED = (".attn.bias", ".attn.masked_bias")  # buffers: the causal mask and its fill value
_LAYER = {"ln_1.weight": "C", "ln_1.bias": "C", "attn.c_attn.weight": "C,3C", "attn.c_attn.bias": "3C",
          "attn.c_proj.weight": "C,C", "attn.c_proj.bias": "C", "ln_2.weight": "C", "ln_2.bias": "C",
          "mlp.c_fc.weight": "C,4C", "mlp.c_fc.bias": "4C", "mlp.c_proj.weight": "4C,C", "mlp.c_proj.bias": "C"}


def _open(path):
    """SafeTensors(path): float32, float16 and bfloat16 files alike (read() widens to float32)."""
    return ckpt.SafeTensors(path)


def _hf_names(st):
    """{HF name without 'transformer.': stored name} of the tensors that are not buffers or the head."""
    out = {}
    for name in st.names:
        short = name.removeprefix("transformer.")
        if short == "lm_head.weight" or short.endswith(HF_IGNORED):
            continue
        out[short] = name
    return out


def is_hf_gpt2(path):
    """Whether a .safetensors file holds GPT-2 in Hugging Face's layout: its first block's c_attn
    weight is Conv1D's [n_embd, 3 * n_embd] (nanoGPT's and Mica's Linear is [3 * n_embd, n_embd])."""
    st = _open(path)
    names = _hf_names(st)
    if "h.0.attn.c_attn.weight" not in names:
        return False
    shape = st.info(names["h.0.attn.c_attn.weight"])[1]
    return len(shape) == 2 and shape[1] == 3 * shape[0]


def _n_head(path, n_embd):
    cfg_path = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    if os.path.isfile(cfg_path):
        try:
            with open(cfg_path, encoding="utf-8") as f:
                hf = json.load(f)
            n_head = hf["n_head"] if isinstance(hf, dict) else None
        except (OSError, ValueError, KeyError, RecursionError):
            n_head = None
        if type(n_head) is not int or n_head <= 0 or n_embd % n_head:
            raise MicaError(f"{cfg_path} beside {path} gives no usable n_head (a positive divisor of n_embd "
                            f"{n_embd}); fix it or remove it (GPT-2's own sizes are known without it)")
        return n_head
    if n_embd in GPT2_HEADS:
        return GPT2_HEADS[n_embd]
    raise MicaError(f"{path} has n_embd {n_embd}, not one of GPT-2's sizes, so its number of heads is unknown; put "
                    "Hugging Face's config.json (with n_head) beside it")


def hf_gpt2_args(path):
    """nanoGPT's model_args for a Hugging Face GPT-2 file, as from_pretrained sets them: n_layer from
    the blocks h.N, n_embd and vocab_size from wte, block_size from wpe, bias=True, n_head from
    config.json beside the file or GPT-2's table. Reads only the header."""
    st = _open(path)
    names = _hf_names(st)
    for need in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"):
        if need not in names:
            raise MicaError(f"{path} has no tensor {need!r}, so it is not a Hugging Face GPT-2 file")
    wte, wpe = st.info(names["wte.weight"])[1], st.info(names["wpe.weight"])[1]
    if len(wte) != 2 or len(wpe) != 2 or wpe[1] != wte[1]:
        raise MicaError(f"{path}: wte.weight {list(wte)} and wpe.weight {list(wpe)} are not two matrices of one width")
    layers = sorted({int(n.split(".")[1]) for n in names
                     if n.startswith("h.") and re.fullmatch(r"[0-9]+", n.split(".")[1])})
    if not layers or layers != list(range(len(layers))):
        raise MicaError(f"{path} has blocks h.{layers} rather than h.0 .. h.N-1; is it a whole GPT-2 file?")
    n_embd = wte[1]
    if min(wte[0], wpe[0], n_embd) < 1:
        raise MicaError(f"{path}: wte.weight {list(wte)} and wpe.weight {list(wpe)} hold a GPT without tokens, positions "
                        "or width; it is damaged or not a trained GPT-2")
    args = dict(n_layer=len(layers), n_head=_n_head(path, n_embd), n_embd=n_embd, block_size=wpe[0], bias=True,
                vocab_size=wte[0], dropout=0.0)
    _check_hf_config(path, args)
    return args


HF_KEYS = {"n_layer": "n_layer", "n_embd": "n_embd", "n_positions": "block_size", "vocab_size": "vocab_size"}
GELUS = ("gelu_new", "gelu", "gelu_fast", "gelu_pytorch_tanh")  # (nanoGPT's model, and Mica's, take each as its GELU)


def _check_hf_config(path, args):
    """Hugging Face's config.json beside the file, where there is one, describes the file's model:
    sizes that disagree with its tensors, or an activation other than a GELU, mean it is another
    model's (from_pretrained would refuse the first and compute another function for the second)."""
    cfg_path = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            hf = json.load(f)
    except (OSError, ValueError, RecursionError):
        return  # (none, or unreadable: _n_head has said what it needs)
    if not isinstance(hf, dict):
        return
    for key, ours in HF_KEYS.items():
        if key in hf and hf[key] != args[ours]:
            raise MicaError(f"{cfg_path} gives {key}={hf[key]!r}, but {path} holds {args[ours]!r} ({ours}, from its "
                            "tensors); the config is another model's: fix it or remove it")
    act = hf.get("activation_function", "gelu_new")
    if act not in GELUS:
        raise MicaError(f"{cfg_path} gives activation_function={act!r}, but nanoGPT's model (and Mica's) computes a "
                        "GELU, so these weights would compute another function; import a GPT-2 with a GELU")


def read_hf_gpt2(path, block_size=None):
    """(tensors in nanoGPT's names and layout as float32 arrays, model_args) of a Hugging Face GPT-2
    model.safetensors: Conv1D weights transposed, the mask buffers left out, no lm_head (tied to
    wte); with block_size smaller than the file's, wpe cropped to it (nanoGPT's crop_block_size)."""
    args = hf_gpt2_args(path)
    st = _open(path)
    names = _hf_names(st)
    C = args["n_embd"]
    sizes = {"C": C, "3C": 3 * C, "4C": 4 * C}
    want = {"wte.weight": (args["vocab_size"], C), "wpe.weight": (args["block_size"], C)}  # nanoGPT's order
    for i in range(args["n_layer"]):
        for k, dims in _LAYER.items():
            want[f"h.{i}.{k}"] = tuple(sizes[d] for d in dims.split(","))
    want.update({"ln_f.weight": (C,), "ln_f.bias": (C,)})
    extra = sorted(set(names) - set(want))
    missing = sorted(set(want) - set(names))
    if missing or extra:
        raise MicaError(f"{path} is not a GPT-2 file Mica can read: "
                        + (f"missing {', '.join(missing[:3])}" if missing else f"unknown {', '.join(extra[:3])}"))
    tensors = {}
    for short, shape in want.items():
        dtype, got, _ = st.info(names[short])
        if tuple(got) != shape:
            raise MicaError(f"{path}: {names[short]} is {list(got)}, but a GPT-2 of n_embd {C} needs {list(shape)}")
        if dtype.kind != "f":
            raise MicaError(f"{path}: {names[short]} holds {dtype.name}, not floating-point weights")
        a = st.read(names[short]).astype(np.float32)
        if short.endswith(CONV1D):
            a = np.ascontiguousarray(a.T)
        tensors["transformer." + short] = a
    if block_size is not None and block_size < args["block_size"]:
        tensors["transformer.wpe.weight"] = tensors["transformer.wpe.weight"][:block_size].copy()
        args["block_size"] = block_size
    return tensors, args


def import_hf_gpt2(path, out_dir):
    """out_dir/ckpt.safetensors from a Hugging Face GPT-2 file (weights only, iteration 0)."""
    if not os.path.exists(path):
        raise MicaError(f"{path} does not exist; give the path of a Hugging Face GPT-2 model.safetensors to import")
    if not is_hf_gpt2(path):
        raise MicaError(f"{path} is not GPT-2 in Hugging Face's layout (its c_attn weights are not Conv1D's "
                        "[n_embd, 3 * n_embd]); a Mica checkpoint needs no import: pass --init_from=PATH")
    tensors, args = read_hf_gpt2(path)
    out = os.path.join(out_dir, "ckpt.safetensors")
    ckpt.write(out, tensors, {"format": "mica", "imported_from": os.path.abspath(path), "iter_num": 0,
                              "best_val_loss": 1e9, "config": json.dumps({k: v for k, v in args.items()
                                                                         if k != "vocab_size"})})
    return out, args
