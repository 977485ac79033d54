"""nanoGPT's training configuration, read as nanoGPT's configurator reads it.

A config file is Python that assigns some of train.py's globals; then every `--key=value`
overrides one, its value parsed as a Python literal and required to have the default's type.
Unknown keys are errors that name the nearest known key; keys Mica cannot honour yet are
sentences, not silence.
"""
import ast
import difflib
import math
import os
import re
import reprlib

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
    "simulate": False,     # device=cuda: run the CUDA trainer on the CPU simulator (no GPU needed)
    "tf32": False,         # device=cuda: products may use TF32 (nanoGPT's train.py allows it)
    "recipe": "nanogpt",   # or "speedrun": the speedrun seed's model, optimizers and loop (SPEEDRUN_DEFAULTS)
    "memory_budget": None,  # bytes, a size (2GB), or "auto": recompute more until the arenas fit
    "fp_half_intermediates": False,  # half attention rounds where PyTorch's CPU attention rounds
    "zero_stage": 0,       # 1: under mpirun, AdamW's state sharded among the ranks (ZeRO-1, mica/optim/zero.py)
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

# The speedrun seed's settings (train_gpt_simple.py), for configs with recipe = "speedrun": its model
# (mica.models.speedrun), AdamW + Muon, stable-then-decay, and its data loader over shards in order.
SPEEDRUN_DEFAULTS = {
    "recipe": "speedrun",
    "out_dir": "out-speedrun",
    "train_files": "data/fineweb10B/fineweb_train_*.bin",
    "val_files": "data/fineweb10B/fineweb_val_*.bin",
    "vocab_size": 50304,
    "train_steps": 3500,
    "batch_size": 8 * 64 * 1024,
    "seq_len": 1024,
    "mbs": 64,
    "val_tokens": 20 * 524288,
    "val_every": 125,
    "num_layers": 12,
    "model_dim": 768,
    "head_dim": 128,
    "embed_lr": 0.3,
    "head_lr": 1 / 320,
    "scalar_lr": 0.01,
    "muon_lr": 0.025,
    "muon_weight_decay": 0.0125,
    "mu": 0.95,
    "ns_steps": 12,
    "ns_dtype": "bfloat16",
    "cooldown_frac": 0.7,
    "log_interval": 1,
    "stop_at": 0,
    "init_from": "scratch",
    "seed": 1337,
    "device": "cuda",
    "dtype": "bfloat16",
}
SPEEDRUN_MICA_DEFAULTS = {k: MICA_DEFAULTS[k] for k in ("threads", "opt_level", "time_every_iter", "simulate", "tf32")}
SPEEDRUN_MICA_DEFAULTS["shard_muon"] = True  # under mpirun: each rank orthogonalizes every N-th matrix (the seed's)
SPEEDRUN_MICA_DEFAULTS["zero_stage"] = 0  # 1: under mpirun, AdamW's state sharded among the ranks (ZeRO-1)
BUILTIN_CONFIGS.update({
    # the seed as it stands: 162M parameters, 3,500 steps of 524,288 tokens, on FineWeb's GPT-2 shards
    "speedrun": dict(SPEEDRUN_DEFAULTS),
    # the same recipe small enough for a CPU: 4 blocks of width 256, sequences of 256, 300 steps,
    # on shards made by `mica prepare text --format shards --out data/speedrun_tiny`
    "speedrun_tiny": dict(SPEEDRUN_DEFAULTS, out_dir="out-speedrun-tiny", train_files="data/speedrun_tiny/train_*.bin",
                          val_files="data/speedrun_tiny/val_*.bin", vocab_size=0, train_steps=300,
                          batch_size=8 * 256, seq_len=256, mbs=4, val_tokens=8 * 256, val_every=50, num_layers=4,
                          model_dim=256, head_dim=64, log_interval=10, device="cpu"),
})

SPEEDRUN_DESCRIPTIONS = {
    "shard_muon": "under mpirun -np N: each rank orthogonalizes every N-th Muon matrix and the updated ones are "
                  "all-gathered, as the seed shards Muon (the same bits either way); False: every rank updates all",
    "recipe": "speedrun: the speedrun seed's model, optimizers and loop (nanogpt: nanoGPT's)",
    "out_dir": "the run's folder: ckpt.safetensors, metrics.jsonl, init.safetensors",
    "train_files": "glob of the training shards, read in sorted order (the folder's meta.json names the tokenizer)",
    "val_files": "glob of the validation shards (the validation set: the first val_tokens + 1 tokens of the first shard "
                 "longer than that, as the seed takes them)",
    "vocab_size": "the model's vocabulary; 0: the data's meta.json vocabulary rounded up to a multiple of 128",
    "train_steps": "optimizer steps",
    "batch_size": "tokens per step (a multiple of mbs * seq_len)",
    "seq_len": "tokens per sequence",
    "mbs": "sequences per micro-batch (gradients are summed over the micro-batches)",
    "val_tokens": "tokens of the validation set (a multiple of mbs * seq_len)",
    "val_every": "steps between validations (and checkpoints); one more after the last step",
    "num_layers": "transformer blocks",
    "model_dim": "embedding width (a multiple of head_dim)",
    "head_dim": "channels per attention head (the seed's 128)",
    "embed_lr": "AdamW's learning rate for the embedding",
    "head_lr": "AdamW's learning rate for the output head",
    "scalar_lr": "AdamW's learning rate for the gains and biases",
    "muon_lr": "Muon's learning rate for the blocks' matrices",
    "muon_weight_decay": "Muon's decoupled weight decay",
    "mu": "Muon's momentum",
    "ns_steps": "Newton-Schulz iterations (2, -1.5, 0.5) per Muon update",
    "ns_dtype": "bfloat16 (the seed's) or float32: the element type of the Newton-Schulz products",
    "cooldown_frac": "the last fraction of steps, over which the learning rates decay linearly to zero",
    "log_interval": "steps between the seed's step:N/M train_time lines",
    "stop_at": "0, or a step to stop after (validated and saved; resume with --init_from=resume)",
    "init_from": "scratch, resume (out_dir/ckpt.safetensors) or PATH.safetensors (weights under the seed's names)",
    "seed": "seeds the initialization (any 64-bit int)",
    "device": "cpu, or cuda (an NVIDIA GPU)",
    "dtype": "bfloat16 (the seed's: a bf16 embedding, its optimizer's state bf16 as fused AdamW's, and the "
             "activations bf16 where the seed's are) or float32 (every parameter and activation float32)"
}


def defaults_for(recipe):
    if recipe == "speedrun":
        return {**SPEEDRUN_DEFAULTS, **SPEEDRUN_MICA_DEFAULTS}
    return {**DEFAULTS, **MICA_DEFAULTS}

# one line per setting for `mica train --help`
DESCRIPTIONS = {
    "out_dir": "the run's folder: ckpt.safetensors, metrics.jsonl, init.safetensors",
    "eval_interval": "iterations between loss estimates (and checkpoints)",
    "log_interval": "iterations between log lines",
    "eval_iters": "batches per split in each loss estimate",
    "eval_only": "estimate the losses at iteration 0 and stop (as nanoGPT: a resumed run trains on)",
    "always_save_checkpoint": "save at every estimate, not only when val loss improves",
    "init_from": "scratch, resume (out_dir/ckpt.safetensors) or PATH.safetensors",
    "wandb_log": "ignored (True gets a note): Mica logs every value to out_dir/metrics.jsonl",
    "wandb_project": "accepted, unused (no wandb)",
    "wandb_run_name": "accepted, unused (no wandb)",
    "dataset": "the data folder is data/<dataset> unless data_dir is set",
    "gradient_accumulation_steps": "micro-batches per iteration",
    "batch_size": "sequences per micro-batch",
    "block_size": "context length in tokens",
    "n_layer": "transformer blocks",
    "n_head": "attention heads per block",
    "n_embd": "embedding width (a multiple of n_head)",
    "dropout": "dropout probability, in [0, 1)",
    "bias": "biases in the Linear and LayerNorm layers",
    "learning_rate": "AdamW's peak learning rate",
    "max_iters": "iterations to train",
    "weight_decay": "AdamW's weight decay (on 2-D weights only)",
    "beta1": "AdamW's beta1",
    "beta2": "AdamW's beta2",
    "grad_clip": "clip gradients to this global norm; 0.0 turns clipping off",
    "decay_lr": "linear warmup then cosine decay; False keeps learning_rate",
    "warmup_iters": "iterations of linear warmup",
    "lr_decay_iters": "iteration where the cosine reaches min_lr",
    "min_lr": "the learning rate after lr_decay_iters",
    "backend": "accepted, unused (one process, no DDP)",
    "device": "cpu, or cuda (an NVIDIA GPU; cuda:0 is the same)",
    "dtype": "float32, or bfloat16: the products and attention in bfloat16 under autocast, as torch.autocast (on a CPU nanoGPT trains float32, so a CPU run does too unless dtype is given); float16 adds GradScaler's loss scaling, as nanoGPT",
    "compile": "accepted; Mica's step is always compiled",
    "seed": "seeds the initialization, the batches and dropout (any 64-bit int, negative too; nanoGPT's train.py "
            "seeds with 1337 itself)",
    "threads": "trainer threads; 0: one per core, at most max(8, cores) (results are the same for any count)",
    "opt_level": "0, 1 or 2: gcc -O1/-O2/-O3; 0 also turns fusion off",
    "batch_order": "a file of recorded batch offsets to train on instead of random ones (batch_size x "
                   "gradient_accumulation_steps a batch, from this run's first iteration on: a resume's too)",
    "simulate": "with device=cuda: run the CUDA trainer on the CPU simulator (slow; for tiny configs)",
    "tf32": "with device=cuda: let products and attention use TF32, as nanoGPT's train.py does; False: float32 throughout",
    "data_dir": "the data folder (train.bin and val.bin, or shards; meta.json or meta.pkl); default data/<dataset>",
    "time_every_iter": "record every iteration's time in metrics.jsonl (mica bench)",
    "recipe": "nanogpt (these settings) or speedrun (the speedrun seed's: mica train speedrun --help)",
    "memory_budget": "bytes (or 2GB, 800MiB) the trainer's arenas may take, or auto (nine tenths of the free "
                     "memory): the backward recomputes more, up to whole blocks, until the plan fits",
    "zero_stage": "0, or 1 (ZeRO-1): under mpirun -np N each rank keeps AdamW's moments of its share of the "
                  "tensors, gets only their summed gradients (reduce-scatter) and all-gathers the updated ones "
                  "(the same bits; in one process nothing changes)",
    "fp_half_intermediates": "with dtype=bfloat16 or float16: attention rounds its unnormalized weights (and, backward, P "
                             "and dS) to the half type where PyTorch's CPU autocast does; False keeps every other digit",
}


def help_text(usage, intro, groups, descriptions, defaults):
    """`usage`, `intro`, then each (title, keys) group: one `--key=default  description` line per key."""
    lines = [usage, "", intro]
    width = max(len(f"--{k}={defaults[k]!r}") for _, keys in groups for k in keys) + 2
    for title, keys in groups:
        lines += ["", title]
        for k in keys:
            lines.append(f"  {f'--{k}={defaults[k]!r}':<{width}}{descriptions[k]}")
    return "\n".join(lines)


def train_help(items=()):
    """`mica train [ITEMS] --help`: every setting with its value after the config files and
    --key=value items given (the defaults without any)."""
    defaults = load(None, items, log=lambda _: None)
    where = f"values after {' '.join(items)}" if items else "defaults"
    if defaults["recipe"] == "speedrun":
        return help_text(
            "usage: mica train CONFIG [--key=value ...]",
            f"CONFIG sets recipe = 'speedrun' (as the built-in speedrun and speedrun_tiny do): the speedrun seed's\n"
            f"model, AdamW + Muon and loop. Each --key=value overrides one setting; the settings and their {where}:",
            [("the speedrun seed's settings:", list(SPEEDRUN_DEFAULTS)), ("Mica's settings:", list(SPEEDRUN_MICA_DEFAULTS))],
            {**DESCRIPTIONS, **SPEEDRUN_DESCRIPTIONS}, defaults)
    return help_text(
        "usage: mica train [CONFIG ...] [--key=value ...]",
        "CONFIG is a nanoGPT config file (Python assigning some of the settings below) or a built-in name\n"
        f"({', '.join(BUILTIN_CONFIGS)}). Each --key=value overrides one setting: a Python literal of the default's\n"
        "type (a whole float is taken for a count, as a config's max_iters / 10, and an int for a float, which\n"
        "nanoGPT's configurator refuses), or a bare word as a string (everything after the first '='). As in\n"
        "nanoGPT, configs and settings apply in the order given, and a config file sees the settings before it\n"
        "and train.py's imports (os, np, torch, ...).\n"
        f"The settings and their {where}:",
        # (nanoGPT's train.py seeds with 1337 itself: `seed` is Mica's setting)
        [("nanoGPT's settings (train.py):", [k for k in DEFAULTS if k != "seed"]),
         ("Mica's settings:", ["seed", *MICA_DEFAULTS])],
        DESCRIPTIONS, defaults)


# int settings that nanoGPT only computes with (get_lr), so a fraction means what it says there
FRACTIONAL_OK = ("warmup_iters", "lr_decay_iters")


def _check_type(key, value, source, defaults, nullable=()):
    """`value` for the setting `key`, of its default's type: an int where a float belongs is widened,
    a whole float where an int belongs is taken as that int (a config's `max_iters / 10`, as nanoGPT
    takes it), and the schedule's iteration counts keep a fraction (nanoGPT's get_lr divides by them)."""
    default = defaults[key]
    if value is None and key in nullable:
        return None
    value = _plain(value)
    value = _fits(key, value, source, default)
    if type(default) is float and type(value) is int:
        return float(value)
    if type(default) is int and type(value) is float and math.isfinite(value):
        if value.is_integer():
            return int(value)
        if key in FRACTIONAL_OK:
            return value
    if default is not None and type(value) is not type(default):
        also = " or None" if key in nullable else ""
        kind = "a whole number" if type(default) is int and type(value) is float else type(default).__name__
        quote = (f"; a string that reads as a number is quoted: --{key}=\"'{value}'\""
                 if type(default) is str and source.startswith("--") and type(value) in (int, float, bool) else "")
        raise MicaError(f"{source}: {key} must be {kind}{also} (like its default {default!r}), got {_show(value)}"
                        f"{quote}")
    return value


def _plain(value):
    """A numpy scalar as the Python number it is (a config file's np.float64(2e-3): nanoGPT reads it
    as the float it subclasses)."""
    import numpy as np

    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _fits(key, value, source, default):
    """A whole number the trainer keeps in 64 bits (the seed's range is its own: check_seed)."""
    if key == "seed" or type(default) is not int:
        return value
    whole = value if type(value) is int else int(value) if type(value) is float and math.isfinite(value) \
        and value.is_integer() else None
    if whole is not None and not -2**63 <= whole < 2**63:
        raise MicaError(f"{source}: {key}={_show(value)} does not fit in 64 bits (the trainer counts in 64-bit "
                        "integers); use a smaller value")
    return value


def _show(value):
    """A short repr of a user's value (a config file can assign anything)."""
    try:
        return reprlib.repr(value)
    except Exception:
        return f"a {type(value).__name__}"


# nanoGPT's settings and the speedrun recipe's for the same thing (a name that spells alike is not)
SPEEDRUN_NAMES = {
    "data_dir": "train_files and val_files", "dataset": "train_files and val_files", "block_size": "seq_len",
    "eval_interval": "val_every", "eval_iters": "val_tokens", "max_iters": "train_steps", "n_layer": "num_layers",
    "n_embd": "model_dim", "learning_rate": "embed_lr, head_lr, scalar_lr and muon_lr",
    "weight_decay": "muon_weight_decay", "gradient_accumulation_steps": "batch_size (tokens a step) and mbs",
    "lr_decay_iters": "cooldown_frac", "warmup_iters": "cooldown_frac (the seed has no warmup)",
}


def _nearest(key, known):
    if key in SPEEDRUN_NAMES and "train_steps" in known:
        return f"; the speedrun recipe's setting for it is {SPEEDRUN_NAMES[key]}"
    if "train_steps" in known and (key in MICA_DEFAULTS or key in DEFAULTS):
        return "; it is a setting of nanoGPT's recipe, which the speedrun recipe (recipe='speedrun') does not take"
    near = difflib.get_close_matches(key, list(known), n=1)
    return f"; did you mean {near[0]!r}?" if near else ""


def apply_overrides(settings, items, nullable=(), defaults=None):
    """--key=value items over `settings` (its values fix each key's type; `defaults`, where given,
    are the values an error names as the defaults), as nanoGPT's configurator reads them: a Python
    literal, or a bare word as a string. Keys in `nullable` also take None."""
    out = dict(settings)
    for item in items:
        if not item.startswith("--") or "=" not in item:
            raise MicaError(f"expected --key=value, got {item!r}" + ("; a setting starts with two dashes"
                                                                    if item.startswith("-") and "=" in item else ""))
        key, raw = item[2:].split("=", 1)
        if key not in out:
            raise MicaError(f"unknown setting {key!r}{_nearest(key, out) or '; --help lists every setting'}")
        try:
            value = ast.literal_eval(raw)
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            value = raw  # (TypeError: an unhashable key, as in {[1]: 2})
        out[key] = _check_type(key, value, f"--{key}", defaults or settings, nullable)
    return out


def _without_value(item, after, defaults=None):
    """The sentence for a setting given without '=' (`after`: the item that follows it, which the
    example takes for its value when it looks like one; else True for a yes/no setting, or the
    setting's default as an example of its type)."""
    if defaults is not None and re.fullmatch(r"--\w+", item) and item[2:] not in defaults:  # (no value to add)
        return MicaError(f"unknown setting {item[2:]!r}{_nearest(item[2:], defaults) or '; --help lists every setting'}")
    default = (defaults or {}).get(item[2:], True)
    value = after if after and not after.startswith("-") and not os.path.isfile(after) and \
        after not in BUILTIN_CONFIGS and not after.endswith(".py") else \
        "True" if isinstance(default, bool) or default is None else default if isinstance(default, str) else repr(default)
    example = f"; a setting takes its value after '=', e.g. {item}={value}" if re.fullmatch(r"--\w+", item) else ""
    return MicaError(f"expected --key=value, got {item!r}{example}")


def load_script_settings(items, defaults, nullable=()):
    """Another nanoGPT script's settings (sample.py's) from its command line, read as its
    configurator reads it: config files (or built-in names) and --key=value items in order. A file
    may set anything; what is not one of this script's settings is ignored, as the script ignores
    it (a training config's n_layer means nothing to sample.py, its out_dir does). A Config: the
    origin of each setting a file gave, for a later check to name its line."""
    out, names, origin, given, made = dict(defaults), {}, {}, set(), {}
    for i, item in enumerate(items):
        if "=" not in item and item.startswith("-"):
            raise _without_value(item, items[i + 1] if i + 1 < len(items) else "", defaults)
        key = item[2:].partition("=")[0] if item.startswith("--") else None
        if key in made and key not in out:  # (a name an earlier config file made, max_iters of a training
            made.update(apply_overrides(made, [item]))  # config: the script takes it and ignores it, as its own)
            continue
        if "=" in item or item.startswith("-"):
            out = apply_overrides(out, [item], nullable, defaults)
            origin.pop(item.lstrip("-").partition("=")[0], None)
            given.add(item.lstrip("-").partition("=")[0])
        elif item in BUILTIN_CONFIGS and not os.path.exists(item):
            builtin = {k: v for k, v in BUILTIN_CONFIGS[item].items() if k in out}
            made.update({k: v for k, v in BUILTIN_CONFIGS[item].items() if k not in out})
            out.update(builtin)
            origin.update(dict.fromkeys(builtin, f"the built-in config {item}"))
            given.update(builtin)
        elif not item:
            raise MicaError("an empty argument is neither a config file nor --key=value; remove it")
        else:
            ran = _run_file(item, out, names)
            names = ran.names
            made.update({k: v for k, v in ran.others.items() if isinstance(v, (bool, int, float, str))})
            for key, value in ran.settings.items():
                out[key] = _check_type(key, value, _at(ran, item, key), defaults, nullable)
                origin[key] = _at(ran, item, key)
                given.add(key)
    return Config(out, origin, given)


def _run_file(path, settings, names):
    """config_files.run of a config file named on the command line, or the sentence why not."""
    from . import config_files

    if not os.path.exists(path):
        from ..files import missing

        near = difflib.get_close_matches(path.replace("-", "_"), BUILTIN_CONFIGS, n=1)
        meant = f"; did you mean {near[0]}?" if near else ""
        raise MicaError(f"config file {path} {missing(path)} (built-in configs: {', '.join(BUILTIN_CONFIGS)}){meant}")
    return config_files.run(path, settings, names)


def load(config=None, overrides=(), log=print):
    """The full configuration from a config file (or built-in name) and items, read as nanoGPT's
    configurator reads its command line: each item without "=" is a config file (or built-in name),
    run in its turn over the settings so far; each --key=value overrides one setting. A config file
    may define helper names of its own, as nanoGPT allows (they are ignored, said once); a name one
    letter or so from a setting is taken for a typo and refused."""
    items = ([config] if config else []) + list(overrides)
    guess = recipe_guess(items)
    notes = []
    cfg = _load(items, guess, notes.append)
    if cfg["recipe"] != guess and cfg["recipe"] in RECIPES:  # (a file set it in a way the guess cannot read)
        notes = []
        cfg = _load(items, cfg["recipe"], notes.append)
    if cfg["recipe"] not in RECIPES:
        where = f"{cfg.origin['recipe']}: " if "recipe" in cfg.origin else ""
        raise MicaError(f"{where}recipe must be 'nanogpt' or 'speedrun', got {_show(cfg['recipe'])}")
    for n in notes:
        log(n)
    return cfg


RECIPES = ("nanogpt", "speedrun")


def recipe_guess(items):
    """The recipe whose defaults the items start from, read without running any file: the last a
    built-in, a config file's plain `recipe = '...'` or --recipe=... names (nanogpt without any)."""
    from . import config_files

    recipe, where = "nanogpt", ""
    for item in items:
        if item.startswith("--recipe="):
            recipe, where = item.split("=", 1)[1], ""
        elif "=" in item or item.startswith("-"):
            continue
        elif item in BUILTIN_CONFIGS and not os.path.exists(item):
            recipe, where = BUILTIN_CONFIGS[item].get("recipe", "nanogpt"), ""
        elif os.path.isfile(item) and config_files.literal_recipe(item):
            recipe, line = config_files.literal_recipe(item)
            where = f"{item}:{line}: "
    if recipe not in RECIPES:
        raise MicaError(f"{where}recipe must be 'nanogpt' or 'speedrun', got {_show(recipe)}")
    return recipe


def _load(items, recipe, log):
    cfg = defaults_for(recipe)
    explicit, origin, names = set(), {}, {}  # (names: what config files made besides settings, for the next)
    for i, item in enumerate(items):
        if "=" in item:
            if not item.startswith("--"):
                raise MicaError(f"expected --key=value, got {item!r}" + ("; a setting starts with two dashes"
                                                                        if item.startswith("-") else ""))
            key = item[2:].split("=", 1)[0]
            cfg = apply_overrides(cfg, [item], defaults=defaults_for(recipe))
            explicit.add(key)
            origin.pop(key, None)  # (the command line's own --key=value names the key already)
        elif item.startswith("-"):
            raise _without_value(item, items[i + 1] if i + 1 < len(items) else "", defaults_for(recipe))
        elif not item:
            raise MicaError("an empty argument is neither a config file nor --key=value; remove it")
        elif item in BUILTIN_CONFIGS and not os.path.exists(item):
            builtin = BUILTIN_CONFIGS[item]
            if any(k not in cfg for k in builtin):
                raise MicaError(f"the built-in config {item} is the {builtin.get('recipe', 'nanogpt')} recipe's, but "
                                f"the other configs and settings given are the {cfg['recipe']} recipe's; give configs "
                                "of one recipe")
            cfg.update(builtin)
            explicit.update(builtin)
            for key in builtin:
                origin.pop(key, None)
        else:
            ran = _run_file(item, cfg, names)
            names = ran.names
            for key, value in ran.others.items():
                if callable(value) or type(value).__name__ == "module":
                    continue
                at = _at(ran, item, key)
                if difflib.get_close_matches(key, list(cfg), n=1, cutoff=0.8) or \
                        (key in SPEEDRUN_NAMES and "train_steps" in cfg):  # a typo, or nanoGPT's name, surely
                    raise MicaError(f"{at}: unknown setting {key!r}{_nearest(key, cfg)}")
                log(f"note: {at}: {key} is not a setting; ignored (a helper variable?)")
            for key, value in ran.settings.items():
                at = _at(ran, item, key)
                cfg[key] = _check_type(key, value, at, defaults_for(recipe))
                explicit.add(key)
                origin[key] = at
    if recipe == "nanogpt" and "dtype" not in explicit and isinstance(cfg["device"], str) and \
            cfg["device"].startswith("cpu"):
        cfg["dtype"] = "float32"  # nanoGPT trains float32 on a CPU (nullcontext) whatever its default dtype says
    return Config(cfg, origin, explicit)


class Config(dict):
    """A run's settings (a plain dict to every reader), with `origin`: for each setting a config file
    gave (and no --key=value overrode), FILE:LINE of its assignment, so that a later check of its
    value can name the line to fix; and `given`, every setting given at all (not a default)."""

    def __init__(self, settings, origin=None, given=()):
        super().__init__(settings)
        self.origin = dict(origin or {})
        self.given = set(given)  # (the settings a config file, built-in or --key=value gave)


def _at(ran, config, key):
    """FILE:LINE of the config file's (last) assignment to `key` in its text, else FILE."""
    line = ran.lines.get(key)
    return f"{config}:{line}" if line else config


def check_seed(seed):
    """nanoGPT takes any seed torch.manual_seed takes: an int in [-2**63, 2**64)."""
    if not -2**63 <= seed < 2**64:
        raise MicaError(f"seed must fit in 64 bits (from -2**63 to 2**64 - 1), got {seed}")
    return seed


def check_threads(threads):
    """0 (one per core) or a count up to what a CPU trainer is built for (its scratch is per thread):
    max(8, this machine's cores)."""
    from ..backends.c.target import default_max_threads

    most = default_max_threads()
    if not 0 <= threads <= most:
        raise MicaError(f"threads must be 0 (one per core) or a count from 1 to {most} (the most a trainer on this "
                        f"machine is built for), got {threads}")
    return threads


def seed_int64(seed):
    """The seed as the trainer's int64 reads it: the same 64 bits, as two's complement."""
    return (check_seed(seed) + 2**63) % 2**64 - 2**63


def device(name):
    """nanoGPT's device string as Mica's target: "cpu" or "cuda"."""
    if not isinstance(name, str):
        raise MicaError(f"device must be 'cpu' or 'cuda', got {name!r}")
    if name == "cpu" or name.startswith("cpu:"):
        return "cpu"
    if name in ("cuda", "cuda:0"):
        return "cuda"
    if name.startswith("cuda:"):
        raise MicaError(f"device={name!r}: Mica's trainer runs on the first visible GPU; pass --device=cuda and "
                        f"choose the card with CUDA_VISIBLE_DEVICES={name[5:]}")
    raise MicaError(f"device={name!r} is not available; pass --device=cpu or --device=cuda")


def cuda_unusable():
    """None when the NVIDIA driver sees a GPU here, else why not (a few words)."""
    from ..backends.cuda.build import unusable

    return unusable()


def check_supported(cfg, log=print):
    """Refuse what Mica cannot do yet; say what is accepted but means nothing here."""
    try:
        for key, value in cfg.items():  # (paths above all: the trainer's manifest has a setting a line)
            if isinstance(value, str) and any(c in value for c in "\n\r\0"):
                raise MicaError(f"{key} holds a line break or a NUL character ({value[:40]!r}), which Mica's "
                                "trainer cannot take; give it without one")
        cfg["device"] = device(cfg["device"])
        _check_device(cfg)
        if cfg.get("tf32") and cfg["device"] != "cuda":
            log("note: tf32=True lets a card's products and attention use TF32; on the CPU they stay float32")
        elif cfg.get("tf32") and cfg.get("simulate"):
            log("note: tf32=True lets a card's products and attention use TF32; in the simulator cuBLASLt's "
                "products stay float32 and attention rounds its operands to TF32, as the card's tensor cores do")
        if cfg.get("recipe") == "speedrun":
            return _check_speedrun(cfg)
        return _check_nanogpt(cfg, log)
    except MicaError as e:
        raise _located(cfg, e) from None


def check_settings(cfg):
    """The recipe's checks of the settings alone, as mica train makes them (no device, data or
    weights: mica inspect shows the program mica train would build, or refuses as it would)."""
    import copy

    settings = copy.copy(cfg)
    settings["init_from"] = "scratch"  # (a finetuning config's gpt2* weights: inspect builds no weights)
    try:
        return _check_speedrun(settings) if cfg.get("recipe") == "speedrun" else _check_nanogpt(settings, lambda _: None)
    except MicaError as e:
        raise _located(cfg, e) from None


DTYPES = ("float32", "bfloat16", "float16")


def check_dtype(cfg):
    """A nanoGPT-recipe config's dtype: one of nanoGPT's three names, as train.py takes them (led by
    the config file's line that set it)."""
    if cfg["dtype"] not in DTYPES:
        near = _dtype_meant(cfg["dtype"]) if isinstance(cfg["dtype"], str) else ""
        raise _located(cfg, MicaError(f"dtype must be 'float32', 'bfloat16' or 'float16', got {cfg['dtype']!r}{near}"))


# the other names of the three (torch's aliases and the usual short ones)
DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
                 "f16": "float16", "half": "float16"}


def _dtype_meant(text):
    """'; did you mean ...?' for a dtype spelled another way: another case, a short name or an alias."""
    key = text.strip().lower().removeprefix("torch.")
    if key in ("float64", "double", "fp64", "f64"):
        return "; float32 is the widest type nanoGPT's recipe trains in: did you mean 'float32'?"
    meant = key if key in DTYPES else DTYPE_ALIASES.get(key)
    return f"; did you mean {meant!r}?" if meant else _nearest(key, DTYPES)


def check_heads(cfg):
    """n_embd splits into n_head heads, or a sentence naming where each was set."""
    if cfg["n_embd"] % cfg["n_head"]:
        raise MicaError(f"the width n_embd ({cfg['n_embd']}{_set_at(cfg, 'n_embd')}) must be divisible by n_head "
                        f"({cfg['n_head']}{_set_at(cfg, 'n_head')}); give n_head a divisor of n_embd")


def _set_at(cfg, key):
    """', set at FILE:LINE' or ', from --key' for a setting a config file or the command line gave."""
    origin = getattr(cfg, "origin", {}).get(key)
    if origin:
        return f", set at {origin}"
    return f", from --{key}" if key in getattr(cfg, "given", ()) else ""


def _located(cfg, e):
    """`e`, led by the FILE:LINE that set the setting its sentence is about (the sentence's first
    word, or the KEY of its leading KEY=), when a config file set it."""
    origin = getattr(cfg, "origin", {})
    first = re.match(r"[A-Za-z_][A-Za-z0-9_]*", e.sentence)
    if not first or first.group(0) not in origin or e.loc:
        return e
    return MicaError(f"{origin[first.group(0)]}: {e.sentence}")


def check_speedrun(cfg):
    """The speedrun settings' own rules, each a sentence (led by the line that set the setting)."""
    try:
        return _check_speedrun(cfg)
    except MicaError as e:
        raise _located(cfg, e) from None


def _check_speedrun(cfg):
    for key in ("train_steps", "batch_size", "seq_len", "mbs", "val_tokens", "val_every", "num_layers", "model_dim",
                "head_dim", "ns_steps", "log_interval"):
        if cfg[key] <= 0:
            raise MicaError(f"{key} must be positive, got {cfg[key]}")
    if not 0 <= cfg["stop_at"] <= cfg["train_steps"]:
        raise MicaError(f"stop_at must be 0 or a step from 1 to train_steps ({cfg['train_steps']}), got {cfg['stop_at']}")
    if cfg["vocab_size"] < 0:
        raise MicaError(f"vocab_size must be positive (or 0: from the data's meta.json), got {cfg['vocab_size']}")
    rows = cfg["mbs"] * cfg["seq_len"]
    for key in ("batch_size", "val_tokens"):
        if cfg[key] % rows:
            raise MicaError(f"{key} ({cfg[key]:,}) must be a multiple of mbs * seq_len ({rows:,}): the seed cuts it "
                            "into micro-batches of mbs sequences")
    if cfg["model_dim"] % cfg["head_dim"] or cfg["head_dim"] % 4:
        raise MicaError(f"model_dim ({cfg['model_dim']}) must be a multiple of head_dim ({cfg['head_dim']}), and "
                        "head_dim a multiple of 4")
    if not 0.0 <= cfg["cooldown_frac"] <= 1.0:
        raise MicaError(f"cooldown_frac must be in [0, 1], got {cfg['cooldown_frac']}")
    _check_optimizer(cfg, rates=("embed_lr", "head_lr", "scalar_lr", "muon_lr"), decays=("muon_weight_decay",),
                     betas=("mu",))
    _check_zero_stage(cfg)
    if cfg["ns_dtype"] not in ("bfloat16", "float32"):
        raise MicaError(f"ns_dtype must be 'bfloat16' or 'float32', got {_show(cfg['ns_dtype'])}")
    if cfg["dtype"] not in ("bfloat16", "float32"):
        raise MicaError(f"dtype must be 'bfloat16' (the seed's) or 'float32' for the speedrun recipe, got "
                        f"{_show(cfg['dtype'])}")
    if not isinstance(cfg["init_from"], str) or (cfg["init_from"] not in ("scratch", "resume") and
                                                  not cfg["init_from"].endswith(".safetensors")):
        raise MicaError(f"init_from must be scratch, resume or PATH.safetensors (weights with the seed's names) for the "
                        f"speedrun recipe, got {_show(cfg['init_from'])}")
    check_seed(cfg["seed"])
    check_threads(cfg["threads"])
    return cfg


def _check_optimizer(cfg, rates=(), decays=(), betas=()):
    """The ranges torch.optim.AdamW (and Muon) accept, each refused value one sentence naming its
    setting: learning rates and weight decays finite and >= 0, betas and momenta in [0, 1)."""
    import math

    for key in rates + decays:
        if not (math.isfinite(cfg[key]) and cfg[key] >= 0.0):
            raise MicaError(f"{key} must be finite and 0 or more (as torch's optimizers require), got {cfg[key]}")
    for key in betas:
        if not 0.0 <= cfg[key] < 1.0:
            raise MicaError(f"{key} must be in [0, 1) (as torch's optimizers require), got {cfg[key]}")


def _check_zero_stage(cfg):
    if cfg["zero_stage"] not in (0, 1):
        raise MicaError(f"zero_stage must be 0 (off) or 1 (AdamW's state sharded among the ranks); Mica has no stage "
                        f"{cfg['zero_stage']} (its gradients and parameters stay whole on every rank)")


def _check_device(cfg):
    if cfg["device"] == "cuda" and not cfg["simulate"]:
        why = cuda_unusable()
        if why:
            raise MicaError(f"device=cuda needs an NVIDIA GPU and its driver, and {why}; pass --device=cpu, or "
                            "--simulate=True to run the CUDA trainer on the CPU simulator (slow: tiny configs only)")
    if cfg["simulate"] and cfg["device"] != "cuda":
        raise MicaError("simulate=True simulates the CUDA trainer; pass it with --device=cuda")


def _check_nanogpt(cfg, log):
    if isinstance(cfg["init_from"], str) and cfg["init_from"].startswith("gpt2"):
        raise MicaError(f"init_from={cfg['init_from']!r} downloads GPT-2 from a hub, which Mica never does; get "
                        "Hugging Face's model.safetensors (and its config.json) yourself and pass "
                        "--init_from=PATH/model.safetensors, or convert it with mica import PATH/model.safetensors "
                        "--out_dir DIR")
    if cfg["wandb_log"]:
        log("note: wandb_log=True is ignored: Mica logs every value to out_dir/metrics.jsonl (mica plot draws it)")
    notes = []
    check_dtype(cfg)
    if cfg["dtype"] == "float32" and cfg.get("fp_half_intermediates"):
        notes.append("fp_half_intermediates=True changes nothing with dtype=float32: it lets a half type's "
                     "attention round as PyTorch's does, with dtype=bfloat16 or float16")
    if cfg["device"] == "cuda" and cfg["dtype"] != "float32" and "dtype" not in getattr(cfg, "given", ("dtype",)):
        notes.append(f"dtype={cfg['dtype']} (nanoGPT's default on a card): the products and attention run under "
                     f"{cfg['dtype']} autocast; --dtype=float32 trains in float32, as a CPU run does")
    if cfg["dtype"] != "float32" and cfg["device"] == "cpu":
        notes.append(f"dtype={cfg['dtype']} on the CPU: Mica trains under {cfg['dtype']} autocast"
                     f"{' with loss scaling' if cfg['dtype'] == 'float16' else ''} (nanoGPT's train.py trains "
                     "float32 on a CPU whatever dtype says; --dtype=float32 gives its numbers)")
    if cfg["compile"] is False:
        notes.append("compile=False: Mica's step is always compiled")
    for key in ("eval_interval", "eval_iters", "log_interval", "batch_size", "block_size", "n_layer", "n_head",
                "n_embd", "gradient_accumulation_steps"):
        if cfg[key] <= 0:
            raise MicaError(f"{key} must be positive, got {cfg[key]}")
    if cfg["max_iters"] < 0:
        raise MicaError(f"max_iters must be 0 or more, got {cfg['max_iters']}")
    check_seed(cfg["seed"])
    check_threads(cfg["threads"])
    check_heads(cfg)
    if not 0.0 <= cfg["dropout"] < 1.0:
        raise MicaError(f"dropout must be in [0, 1), got {cfg['dropout']}")
    _check_optimizer(cfg, rates=("learning_rate", "min_lr"), decays=("weight_decay",), betas=("beta1", "beta2"))
    if not cfg["grad_clip"] >= 0.0:  # (NaN too; inf clips nothing, as in torch)
        raise MicaError(f"grad_clip must be 0.0 (no clipping) or a positive norm, got {cfg['grad_clip']}")
    if cfg["warmup_iters"] < 0 or cfg["lr_decay_iters"] < 0:
        key = "warmup_iters" if cfg["warmup_iters"] < 0 else "lr_decay_iters"
        raise MicaError(f"{key} must be 0 or more, got {cfg[key]}")
    _check_zero_stage(cfg)
    for n in notes:
        log(f"note: {n}")
    return cfg
