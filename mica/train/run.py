"""`mica train` and `mica sample`: check everything a run needs, build the native trainer, and
hand over to it (the training loop itself runs without Python)."""
import json
import os
import subprocess

import numpy as np

from ..data import tokens as tok
from ..errors import MicaError
from . import checkpoint as ckpt
from . import config as config_mod
from . import native, programs

MODEL_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "bias")


def data_files(cfg):
    folder = cfg["data_dir"] or os.path.join("data", cfg["dataset"])
    if not os.path.isdir(folder):
        raise MicaError(f"data folder {folder} does not exist; prepare it first, e.g. "
                        f"mica prepare shakespeare-char --out {folder}")
    paths = []
    for split in ("train", "val"):
        path = os.path.join(folder, f"{split}.bin")
        if not os.path.exists(path):
            shards = sorted(f for f in os.listdir(folder) if f.startswith(f"{split}_") and f.endswith(".bin"))
            path = os.path.join(folder, shards[0]) if shards else path
        paths.append(path)
    return folder, paths


def vocab_size(folder, log=print):
    meta = os.path.join(folder, "meta.json")
    if os.path.exists(meta):
        try:
            with open(meta) as f:
                return int(json.load(f)["vocab_size"]), meta
        except (OSError, ValueError, KeyError):
            raise MicaError(f"{meta} is not a readable vocabulary file (JSON with vocab_size)") from None
    log("no meta.json in the data folder: defaulting to vocab_size of GPT-2 to 50304 (50257 rounded up)")
    return 50304, None


def _model_config_json(cfg):
    return {k: cfg[k] for k in MODEL_KEYS}


def prepare_run(config_path=None, overrides=(), log=print):
    """Everything up to the trainer's manifest. Returns (executable, manifest path, cfg)."""
    cfg = config_mod.check_supported(config_mod.load(config_path, overrides), log)
    folder, (train_path, val_path) = data_files(cfg)
    vocab, _ = vocab_size(folder, log)
    need = cfg["block_size"] + 1
    train_tokens = tok.open_tokens(train_path, vocab, need, "training data")
    tok.open_tokens(val_path, vocab, need, "validation data")
    out_dir = cfg["out_dir"]
    os.makedirs(out_dir, exist_ok=True)
    if cfg["batch_order"] and not os.path.exists(cfg["batch_order"]):
        raise MicaError(f"batch order file {cfg['batch_order']} does not exist")

    model, _, progs = programs.build(cfg, vocab)
    log(f"number of parameters: {model.get_num_params() / 1e6:.2f}M")
    exe, lowered = native.build_trainer(progs, cfg["opt_level"], log)
    native.check_in_place(lowered["train"])
    from .memory_plan import report as memory_report  # what the trainer will hold, before the first step
    log(memory_report(lowered))
    slots = native.state_slots(lowered, [n for n, _ in model.named_parameters()])
    expected = _expected(slots, lowered)
    settings = dict(mode="train", out_dir=out_dir, vocab=vocab, block=cfg["block_size"],
                    batch=cfg["batch_size"], accum=cfg["gradient_accumulation_steps"], max_iters=cfg["max_iters"],
                    eval_interval=cfg["eval_interval"], eval_iters=cfg["eval_iters"],
                    log_interval=cfg["log_interval"], eval_only=int(cfg["eval_only"]),
                    always_save=int(cfg["always_save_checkpoint"]), seed=cfg["seed"],
                    threads=cfg["threads"] or os.cpu_count() or 1, time_every_iter=int(cfg["time_every_iter"]),
                    flops_per_iter=programs.flops_per_iter(cfg, model), peak_flops=programs.peak_flops())
    settings["train_data"] = f"{os.path.abspath(train_path)} {tok.token_layout(train_path)[1]}"
    settings["val_data"] = f"{os.path.abspath(val_path)} {tok.token_layout(val_path)[1]}"
    if cfg["batch_order"]:
        settings["batch_order"] = os.path.abspath(cfg["batch_order"])
    settings["config_json"] = json.dumps(cfg, separators=(",", ":"))
    loads = _initial_state(cfg, model, expected, out_dir, settings, log)
    del train_tokens
    manifest = os.path.join(out_dir, "trainer.manifest")
    native.write_manifest(manifest, settings, slots, lowered, loads)
    return exe, manifest, cfg


def _expected(slots, lowered):
    """{tensor name: (slot index, shape, numpy dtype)} of the train program's state."""
    specs = dict(zip(lowered["train"].program.input_names, (v.spec for v in lowered["train"].program.graph.inputs)))
    return {name: (i, specs[inp].shape, specs[inp].dtype.np_storage) for i, (_, name, inp) in enumerate(slots)}


def _initial_state(cfg, model, by_name, out_dir, settings, log):
    """Where the trainer's starting values come from: [(slot index, file offset)] of init_file."""
    init = cfg["init_from"]
    if init == "scratch":
        log("initializing a new model from scratch")
        path = os.path.join(out_dir, "init.safetensors")
        ckpt.write(path, model.init(cfg["seed"]), {"format": "mica", "config": json.dumps(cfg)})
        return _loads(path, by_name, settings, params_only=True)
    if init == "resume":
        path = os.path.join(out_dir, "ckpt.safetensors")
        log(f"resuming training from {out_dir}")
        st = ckpt.SafeTensors(path)
        saved = _saved_config(st)
        for k in MODEL_KEYS:
            if saved.get(k, cfg[k]) != cfg[k]:
                raise MicaError(f"the checkpoint in {out_dir} was trained with {k}={saved[k]!r}, not {cfg[k]!r}; "
                                "resume with the same model settings")
        md = st.metadata
        try:
            settings.update(resume=1, resume_iter=int(md["iter_num"]), resume_best=float(md["best_val_loss"]))
        except (KeyError, ValueError):
            raise MicaError(f"checkpoint {path} has no iter_num / best_val_loss in its metadata") from None
        if "data.next_offsets" in st.tensors and "rng" in md:
            settings["resume_rng"] = md["rng"]
            settings["resume_next"] = " ".join(str(int(x)) for x in st.read("data.next_offsets"))
        else:
            log("note: the checkpoint holds no data position (an imported one?): batches start afresh from the seed")
        has_state = all(name in st.tensors for name in by_name)
        return _loads(path, by_name, settings, st=st, params_only=not has_state)
    if init.endswith(".safetensors"):
        log(f"initializing from weights in {init}")
        return _loads(init, by_name, settings, params_only=True)
    raise MicaError(f"init_from={init!r} is not available: use scratch, resume or a .safetensors file "
                    "(gpt2* weights: convert with mica import)")


def _saved_config(st):
    try:
        return json.loads(st.metadata.get("config", "{}"))
    except ValueError:
        raise MicaError(f"checkpoint {st.path} has unreadable config metadata") from None


def _loads(path, by_name, settings, params_only=False, st=None):
    st = st or ckpt.SafeTensors(path)
    settings["init_file"] = os.path.abspath(path)
    loads = []
    for name, (index, shape, dtype) in by_name.items():
        if params_only and name.startswith("optimizer."):
            continue
        key = name
        if key not in st.tensors and name == "transformer.wte.weight" and "lm_head.weight" in st.tensors:
            key = "lm_head.weight"  # the tie: either name holds the matrix
        if key not in st.tensors:
            raise MicaError(f"{path} has no tensor {name!r}; its tensors are named "
                            f"{', '.join(list(st.tensors)[:3])}, ...")
        got_dtype, got_shape, offset = st.info(key)
        if tuple(got_shape) != tuple(shape) or got_dtype != dtype:
            raise MicaError(f"{path}: tensor {key!r} is {got_dtype.name}{list(got_shape)}, but this model needs "
                            f"{np.dtype(dtype).name}{list(shape)}")
        loads.append((index, offset))
    return loads


def train(config_path=None, overrides=(), log=print, execute=True):
    exe, manifest, cfg = prepare_run(config_path, overrides, log)
    if execute:
        os.execv(exe, [exe, manifest])
    return subprocess.run([exe, manifest]).returncode


# ---- sampling -------------------------------------------------------------------------------------

def _codec(cfg):
    folder = cfg.get("data_dir") or os.path.join("data", cfg["dataset"])
    meta = os.path.join(folder, "meta.json")
    if not os.path.exists(meta):
        raise MicaError(f"no vocabulary at {meta}: sampling needs the meta.json that mica prepare wrote")
    with open(meta) as f:
        m = json.load(f)
    if m.get("tokenizer") == "char" or "stoi" in m:
        stoi, itos = m["stoi"], m["itos"]

        def encode(s):
            bad = sorted(set(c for c in s if c not in stoi))
            if bad:
                raise MicaError(f"the start text has characters the vocabulary lacks: {''.join(bad)!r}")
            return [stoi[c] for c in s]

        return encode, lambda ids: "".join(itos[i] for i in ids)
    if m.get("tokenizer_file"):
        from tokenizers import Tokenizer

        t = Tokenizer.from_file(os.path.join(folder, m["tokenizer_file"]))
        return (lambda s: t.encode(s).ids), (lambda ids: t.decode(ids))
    raise MicaError(f"{meta} names no tokenizer Mica can decode")


def _stderr(message):
    import sys

    print(message, file=sys.stderr)


def sample(out_dir, start="\n", num_samples=10, max_new_tokens=500, temperature=0.8, top_k=200, seed=1337,
           threads=None, log=_stderr):
    path = os.path.join(out_dir, "ckpt.safetensors")
    st = ckpt.SafeTensors(path)
    cfg = {**config_mod.DEFAULTS, **config_mod.MICA_DEFAULTS, **_saved_config(st)}
    if "transformer.wte.weight" not in st.tensors:
        raise MicaError(f"{path} holds no GPT weights (transformer.wte.weight)")
    vocab = st.info("transformer.wte.weight")[1][0]
    if start.startswith("FILE:"):
        with open(start[5:], encoding="utf-8") as f:
            start = f.read()
    encode, decode = _codec(cfg)
    ids = encode(start)
    if not ids:
        raise MicaError("the start text is empty; give at least one character")
    if temperature <= 0 or max_new_tokens < 0 or num_samples < 1:
        raise MicaError("temperature must be positive, max_new_tokens >= 0 and num_samples >= 1")
    model, _, progs = programs.build(cfg, vocab)
    exe, lowered = native.build_trainer(progs, cfg.get("opt_level", 2), log)
    slots = native.state_slots(lowered, [n for n, _ in model.named_parameters()])
    settings = dict(mode="sample", vocab=vocab, block=cfg["block_size"], seed=seed,
                    threads=threads or os.cpu_count() or 1, num_samples=num_samples,
                    max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k or 0,
                    start_tokens=" ".join(map(str, ids)))
    loads = _loads(path, _expected(slots, lowered), settings, params_only=True)
    manifest = os.path.join(out_dir, "sample.manifest")
    native.write_manifest(manifest, settings, slots, lowered, loads)
    r = subprocess.run([exe, manifest], capture_output=True, text=True)
    if r.returncode != 0:
        raise MicaError(r.stderr.strip().removeprefix("mica: error: ") or "sampling failed")
    texts = []
    for line in r.stdout.splitlines():
        texts.append(decode([int(t) for t in line.split()]))
    return texts
