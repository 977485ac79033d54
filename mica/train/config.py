"""nanoGPT's training configuration, read as nanoGPT's configurator reads it.

A config file is Python that assigns some of train.py's globals; then every `--key=value`
overrides one, its value parsed as a Python literal and required to have the default's type.
Unknown keys are errors that name the nearest known key; keys Mica cannot honour yet are
sentences, not silence.
"""
import ast
import difflib
import os

from ..errors import MicaError

# train.py's globals and their defaults (nanoGPT, GPT-2 on OpenWebText)
DEFAULTS = {
    "out_dir": "out",
    "eval_interval": 2000,
    "log_interval": 1,
    "eval_iters": 200,
    "eval_only": False,
    "always_save_checkpoint": True,
    "init_from": "scratch",
    "wandb_log": False,
    "wandb_project": "owt",
    "wandb_run_name": "gpt2",
    "dataset": "openwebtext",
    "gradient_accumulation_steps": 5 * 8,
    "batch_size": 12,
    "block_size": 1024,
    "n_layer": 12,
    "n_head": 12,
    "n_embd": 768,
    "dropout": 0.0,
    "bias": False,
    "learning_rate": 6e-4,
    "max_iters": 600000,
    "weight_decay": 1e-1,
    "beta1": 0.9,
    "beta2": 0.95,
    "grad_clip": 1.0,
    "decay_lr": True,
    "warmup_iters": 2000,
    "lr_decay_iters": 600000,
    "min_lr": 6e-5,
    "backend": "nccl",
    "device": "cuda",
    "dtype": "bfloat16",
    "compile": True,
    "seed": 1337,
}
# Mica's own settings, beside nanoGPT's
MICA_DEFAULTS = {
    "threads": 0,          # 0: one per core
    "opt_level": 2,
    "batch_order": "",     # a file of recorded batch offsets to train on instead of random ones
    "data_dir": "",        # default: data/<dataset>
    "time_every_iter": False,  # record every iteration's time in metrics.jsonl (mica bench)
}
BUILTIN_CONFIGS = {
    # config/train_shakespeare_char.py of nanoGPT: a baby GPT on Shakespeare's characters
    "shakespeare_char": dict(out_dir="out-shakespeare-char", eval_interval=250, eval_iters=200, log_interval=10,
                             always_save_checkpoint=False, wandb_log=False, wandb_project="shakespeare-char",
                             wandb_run_name="mini-gpt", dataset="shakespeare_char", gradient_accumulation_steps=1,
                             batch_size=64, block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.2,
                             learning_rate=1e-3, max_iters=5000, lr_decay_iters=5000, min_lr=1e-4, beta2=0.99,
                             warmup_iters=100),
}


def _check_type(key, value, source, defaults):
    default = defaults[key]
    if type(default) is float and type(value) is int:
        return float(value)
    if default is not None and type(value) is not type(default):
        raise MicaError(f"{source}: {key} must be {type(default).__name__} (like its default {default!r}), "
                        f"got {value!r}")
    return value


def _nearest(key, known):
    near = difflib.get_close_matches(key, list(known), n=1)
    return f"; did you mean {near[0]!r}?" if near else ""


def apply_overrides(settings, items):
    """--key=value items over `settings` (its values are the defaults that fix each key's type),
    as nanoGPT's configurator reads them: a Python literal, or a bare word as a string."""
    out = dict(settings)
    for item in items:
        if not item.startswith("--") or "=" not in item:
            raise MicaError(f"expected --key=value, got {item!r}")
        key, raw = item[2:].split("=", 1)
        if key not in out:
            raise MicaError(f"unknown setting {key!r}{_nearest(key, out)}")
        try:
            value = ast.literal_eval(raw)
        except (SyntaxError, ValueError):
            value = raw
        out[key] = _check_type(key, value, f"--{key}", settings)
    return out


def load(config=None, overrides=()):
    """The full configuration from an optional config file (or built-in name) and --key=value items."""
    cfg = {**DEFAULTS, **MICA_DEFAULTS}
    if config:
        if config in BUILTIN_CONFIGS and not os.path.exists(config):
            cfg.update(BUILTIN_CONFIGS[config])
        elif not os.path.exists(config):
            raise MicaError(f"config file {config} does not exist (built-in configs: {', '.join(BUILTIN_CONFIGS)})")
        else:
            scope = {}
            try:
                with open(config) as f:
                    exec(compile(f.read(), config, "exec"), scope)
            except SyntaxError as e:
                raise MicaError(f"config file {config} is not valid Python: {e.msg} (line {e.lineno})") from None
            for key, value in scope.items():
                if key.startswith("_") or callable(value) or type(value).__name__ == "module":
                    continue
                if key not in cfg:
                    raise MicaError(f"{config}: unknown setting {key!r}{_nearest(key, cfg)}")
                cfg[key] = _check_type(key, value, config, cfg)
    return apply_overrides(cfg, overrides)


def check_supported(cfg, log=print):
    """Refuse what Mica cannot do yet; say what is accepted but means nothing here."""
    if cfg["device"] != "cpu" and not cfg["device"].startswith("cpu"):
        raise MicaError(f"device={cfg['device']!r} is not available yet: Mica trains on the CPU for now; "
                        "pass --device=cpu")
    if isinstance(cfg["init_from"], str) and cfg["init_from"].startswith("gpt2"):
        raise MicaError(f"init_from={cfg['init_from']!r} downloads GPT-2 from a hub, which Mica never does; get "
                        "Hugging Face's model.safetensors (and its config.json) yourself and pass "
                        "--init_from=PATH/model.safetensors, or convert it with mica import PATH/model.safetensors "
                        "--out_dir DIR")
    if cfg["wandb_log"]:
        raise MicaError("wandb_log=True is not supported: Mica logs to out_dir/metrics.jsonl; "
                        "pass --wandb_log=False")
    notes = []
    if cfg["dtype"] != "float32":
        notes.append(f"dtype={cfg['dtype']} applies to CUDA autocast; on the CPU training is float32, as nanoGPT's is")
    if cfg["compile"] is False:
        notes.append("compile=False: Mica's step is always compiled")
    for key in ("eval_interval", "eval_iters", "log_interval", "batch_size", "block_size", "n_layer", "n_head",
                "n_embd", "gradient_accumulation_steps"):
        if cfg[key] <= 0:
            raise MicaError(f"{key} must be positive, got {cfg[key]}")
    if cfg["n_embd"] % cfg["n_head"]:
        raise MicaError(f"n_embd ({cfg['n_embd']}) must be divisible by n_head ({cfg['n_head']})")
    if not 0.0 <= cfg["dropout"] < 1.0:
        raise MicaError(f"dropout must be in [0, 1), got {cfg['dropout']}")
    for n in notes:
        log(f"note: {n}")
    return cfg
