"""`mica train` and `mica sample`: check everything a run needs, build the native trainer, and
hand over to it (the training loop itself runs without Python)."""
import glob
import json
import os
import re
import signal
import subprocess
import tempfile

import numpy as np

from .. import amp as mica_amp
from .. import dtypes
from ..backends.c import bf16gemm
from ..backends.c import build as cbuild
from ..data import meta as meta_mod
from ..data import prepare
from ..data import tokens as tok
from ..errors import MicaError
from . import checkpoint as ckpt
from . import config as config_mod
from . import convert
from . import distributed, memory_plan, native, programs
from ..files import (atomic_write, lock_run_folder, no_empty_folders_left, read_text, run_folder_in_use,
                     wait_for_run_lock, writable_folder)

MODEL_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "bias")


def data_files(cfg, log=None):
    """(folder, [train files], [val files]): `train.bin` / `val.bin` (nanoGPT), or else every shard
    of the split in sorted order (`train_*.bin`, or the speedrun's `fineweb_train_*.bin`)."""
    folder = cfg["data_dir"] or os.path.join("data", cfg["dataset"])
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise MicaError(f"data folder {folder} is a file; give the folder that holds train.bin and val.bin (or "
                        "shards)")
    if not os.path.isdir(folder):
        raise MicaError(f"data folder {folder} does not exist; prepare it first: "
                        f"{prepare.hint(folder, cfg.get('dataset'))}")
    splits = []
    for split in ("train", "val"):
        single = os.path.join(folder, f"{split}.bin")
        found = set()
        for pattern in (f"{split}_*.bin", f"*_{split}_*.bin"):
            found.update(glob.glob(os.path.join(glob.escape(folder), pattern)))
        if os.path.exists(single):
            if found and log:
                log(f"note: {folder} holds {split}.bin and {len(found)} {split} shards: reading {split}.bin only")
            splits.append([single])
            continue
        splits.append(sorted(found) or [single])  # none: open_tokens says what is missing
    return folder, splits


def _check_split(paths, vocab, need, what, log):
    """Check every file of a split; at least one must hold a whole batch row (block_size + 1
    tokens). Returns ([(path, header bytes)], [tokens in each file])."""
    if len(paths) == 1:
        lengths = [len(tok.open_tokens(paths[0], vocab, need, what))]
    else:
        lengths = [len(tok.open_tokens(p, vocab, 0, what)) for p in paths]
        if max(lengths) < need:
            tok.open_tokens(paths[0], vocab, need, what)  # says how short it is
        log(f"{what}: {len(paths)} files, {sum(lengths):,} tokens, from {paths[0]} to {os.path.basename(paths[-1])}")
    return [(os.path.abspath(p), tok.token_layout(p)[1]) for p in paths], lengths


def _check_batch_order(path, windows, needed=None, rows=None):
    """A recorded batch order: whole numbers separated by white space, one training row's offset
    each, within the training data's `windows` rows (as the trainer numbers them across files), and
    at least `needed` of them where the run's count is known (`rows` a step)."""
    if not os.path.exists(path):
        raise MicaError(f"batch order file {path} does not exist; check the path, or leave batch_order empty for "
                        "the seed's random batches")
    if os.path.isdir(path):
        raise MicaError(f"batch order file {path} is a folder; give the path of the file in it")
    if not os.path.isfile(path):
        raise MicaError(f"batch order file {path} is not a regular file (a device or a pipe); give the path of a "
                        "text file of row offsets")
    text = read_text(path, "batch order file")
    count = 0
    for number, line in enumerate(text.splitlines(), 1):
        for word in line.split():
            if not re.fullmatch(r"[+-]?[0-9]+", word):  # (ASCII digits: what the trainer reads)
                raise MicaError(f"batch order file {path}:{number} holds {word[:40]!r}, not a row offset; the file "
                                "holds whole numbers, one offset of a training row each")
            if not 0 <= int(word) < windows:
                raise MicaError(f"batch order file {path}:{number} has offset {word}, beyond the training data's "
                                f"{windows:,} rows (0 to {windows - 1:,}); record the order on this data")
            count += 1
    if not count:
        raise MicaError(f"batch order file {path} holds no offsets; give one offset per training row, or leave "
                        "batch_order empty for the seed's random batches")
    if needed is not None and count < needed:
        raise MicaError(f"batch order file {path} holds {count:,} offsets, but this run draws {needed:,} "
                        f"({rows:,} a batch: batch_size x gradient_accumulation_steps); record a longer order, or "
                        "train fewer max_iters")


_TEMPORARY = re.compile(r"(?:ckpt\.safetensors|init\.safetensors|metrics\.jsonl|trainer(?:\.rank\d+)?\.manifest)\.tmp(\d+)")


def _take_out_dir(cfg, rank, log):
    """out_dir, made, proved writable and locked by rank 0, which owns it; another rank of the job
    waits until its rank 0 holds the lock before it writes its own files there (its manifest and
    starting values), so that it never writes into a folder another run holds; on a machine whose
    disk is not rank 0's (no lock there at all for a minute) it makes the folder as before."""
    if rank == 0:
        out_dir = writable_folder(cfg["out_dir"], "out_dir")
        lock_run_folder(out_dir, owner=distributed.job() or None)
        _remove_stale_temporaries(out_dir, log)
        return out_dir
    if not wait_for_run_lock(cfg["out_dir"], distributed.job(), distributed.start_timeout()):
        # (no lock appeared: this machine does not share rank 0's folder, so this rank's files go
        # into a folder of its own here, as they must for its trainer to read them)
        return writable_folder(cfg["out_dir"], "out_dir")
    return cfg["out_dir"]


def _remove_stale_temporaries(out_dir, log):
    """A run killed while writing leaves NAME.tmpPID behind: remove those whose process is gone."""
    for name in sorted(os.listdir(out_dir)):
        m = _TEMPORARY.fullmatch(name)
        if not m or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        try:
            os.unlink(os.path.join(out_dir, name))
            log(f"removed {name}, left in {out_dir} by an interrupted run")
        except OSError:
            pass


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def vocab_size(folder, log=print):
    """(vocab_size, meta file) from the folder's meta.json or nanoGPT's meta.pkl; without either,
    GPT-2's vocabulary padded as nanoGPT pads it."""
    size, vocab = _data_vocab(folder, log)
    return size, vocab.path if vocab is not None else None


def _data_vocab(folder, log):
    """(vocab_size, the folder's meta_mod.Vocab or None): vocab_size's reading, the Vocab kept."""
    vocab = meta_mod.read(folder)
    if vocab is not None:
        return vocab.vocab_size, vocab
    log("no meta.json or meta.pkl in the data folder: defaulting to vocab_size of GPT-2 to 50304 "
        "(50257 rounded up)")
    return 50304, None


class _Held:
    """A log that holds its lines until said (`say`): the notes about a run's settings and data
    are printed once every check has passed, so a refused run prints its one sentence alone."""

    def __init__(self, log):
        self.log, self.lines = log, []

    def __call__(self, line):
        self.lines.append(line)

    def say(self):
        for line in self.lines:
            self.log(line)
        self.lines = []


def prepare_run(config_path=None, overrides=(), log=print):
    """Everything up to the trainer's manifest. Returns (executable, manifest path, cfg)."""
    held = _Held(log)
    cfg = config_mod.load(config_path, overrides, held)
    if cfg["init_from"] == "resume":
        adopt_nanogpt_checkpoint(cfg["out_dir"], held)
    _follow_resumed_dtype(cfg, held)  # (before check_supported, whose notes are about the dtype trained in)
    cfg = config_mod.check_supported(cfg, held)
    try:
        _check_init_from(cfg)
    except MicaError as e:  # (led by the config line that chose the weights, where a file did)
        if cfg["init_from"] == "resume" and isinstance(cfg["out_dir"], str) and run_folder_in_use(cfg["out_dir"]):
            raise MicaError(f"another mica train is running in {cfg['out_dir']} and has saved no checkpoint there "
                            "yet; wait for it to finish (or stop it), then resume") from None
        origin = getattr(cfg, "origin", {})
        at = origin.get("init_from") or (origin.get("out_dir") if cfg["init_from"] == "resume" else None)
        raise (MicaError(f"{at}: {e.sentence}") if at else e) from None
    _, rank = distributed.ranks(cfg)  # (before out_dir is touched: a launch that cannot run writes nothing)
    # a run refused before it wrote anything leaves no folder (rank 0's: the only rank that makes it)
    with no_empty_folders_left(cfg["out_dir"] if rank == 0 else None):
        if cfg["recipe"] == "speedrun":
            held.say()
            return prepare_speedrun(cfg, log)
        return _prepare_nanogpt(cfg, log, held)


def _prepare_nanogpt(cfg, log, held):
    """(`held`: the notes so far, said once the data and the folder pass their checks; the data's
    own notes join them)"""
    log, say = held, log
    folder, (train_paths, val_paths) = data_files(cfg, log)
    vocab, data_meta = _data_vocab(folder, log if cfg["init_from"] == "scratch" else _quiet)  # (the note: scratch's)
    vocab = _follow_hf_weights(cfg, vocab, log)
    vocab = _follow_resumed_model(cfg, vocab, log)
    _check_resumed_vocabulary(cfg, folder, data_meta)
    _check_weights_fit(cfg, vocab)
    need = cfg["block_size"] + 1
    train_files, train_lengths = _check_split(train_paths, vocab, need, "training data", log)
    files = [("train", *f) for f in train_files]
    files += [("val", *f) for f in _check_split(val_paths, vocab, need, "validation data", log)[0]]
    if cfg["batch_order"]:
        windows = sum(max(n - cfg["block_size"], 0) for n in train_lengths)  # (as the trainer numbers rows)
        rows = cfg["batch_size"] * cfg["gradient_accumulation_steps"]
        # (a run from its start draws one batch before iteration 0 and one more for each of max_iters)
        needed = None if cfg["init_from"] == "resume" else \
            rows * (1 if cfg["eval_only"] else cfg["max_iters"] + 1)
        _check_batch_order(cfg["batch_order"], windows, needed, rows)
    world, rank = distributed.ranks(cfg)
    out_dir = _take_out_dir(cfg, rank, log)  # before compiling: a read-only folder fails here
    held.say()
    log = say
    steps = cfg["gradient_accumulation_steps"] // world * world  # (nanoGPT's: each rank takes its share)
    log(f"tokens per iteration will be: {steps * cfg['batch_size'] * cfg['block_size']:,}")  # (train.py's line)

    model, _, progs = programs.build(cfg, vocab, world, rank)
    log(f"number of parameters: {model.get_num_params() / 1e6:.2f}M")
    shards = _zero(cfg, model, world, log)
    budget = memory_plan.parse_budget(cfg["memory_budget"], "cpu" if cfg["simulate"] else cfg["device"])
    exe, lowered = native.build_trainer(progs, cfg["opt_level"], log, device=cfg["device"], simulate=cfg["simulate"],
                                        tf32=cfg["tf32"], memory_budget=budget,
                                        fp_half_intermediates=cfg["fp_half_intermediates"])
    _products_record(cfg["device"], cfg["simulate"])
    native.check_in_place(lowered["train"])
    log(memory_plan.report(lowered, rank if world > 1 else None))  # what the trainer will hold, exact
    _say_product_kernel(lowered, log)
    slots = native.state_slots(lowered, [n for n, _ in model.named_parameters()], shards, rank)
    expected = _expected(slots, lowered)
    settings = dict(mode="train", out_dir=out_dir, vocab=vocab, block=cfg["block_size"],
                    batch=cfg["batch_size"], accum=cfg["gradient_accumulation_steps"], max_iters=cfg["max_iters"],
                    eval_interval=cfg["eval_interval"], eval_iters=cfg["eval_iters"],
                    log_interval=cfg["log_interval"], eval_only=int(cfg["eval_only"]),
                    always_save=int(cfg["always_save_checkpoint"]), seed=config_mod.seed_int64(cfg["seed"]),
                    threads=cfg["threads"] or os.cpu_count() or 1, time_every_iter=int(cfg["time_every_iter"]),
                    flops_per_iter=programs.flops_per_iter(cfg, model),
                    peak_flops=A100_BF16_PEAK if cfg["device"] == "cuda" and not cfg["simulate"] else
                    programs.peak_flops(cfg["dtype"] if cfg["device"] == "cpu" else "float32"))
    if cfg["batch_order"]:
        settings["batch_order"] = os.path.abspath(cfg["batch_order"])
    kernel = _product_kernel(lowered)
    _say_other_product_kernel(cfg, kernel, log)
    saved = {**_with_vocab_digest(cfg, data_meta), **({"bf16_gemm": kernel} if kernel else {})}
    settings["config_json"] = json.dumps(saved, separators=(",", ":"))
    loads = _initial_state(cfg, model, expected, out_dir, settings, log)
    if rank == 0 and settings.get("resume"):  # (nanoGPT's loop evaluates again at the iteration it resumes at,
        at = settings["resume_iter"]          # where that is a multiple of this run's eval_interval)
        _metrics_up_to(out_dir, at, evaluated_again=at % int(cfg["eval_interval"]) == 0, log=log, settings=settings)
    return exe, _write_manifest(cfg, out_dir, world, rank, settings, slots, lowered, loads, files), cfg


PYTORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")


def _looks_like_torch_save(path):
    """convert.looks_like_torch_save, or True where the file cannot be read (convert says why)."""
    try:
        return convert.looks_like_torch_save(path)
    except OSError:
        return True


def _iter_of(path):
    """The iteration a Mica checkpoint was saved at (-1 where it cannot be read)."""
    try:
        return int(ckpt.SafeTensors(path).metadata.get("iter_num", -1))
    except (MicaError, OSError, ValueError, TypeError):
        return -1


def _iter_of_pt(pt):
    """The iter_num of nanoGPT's ckpt.pt, read without loading its tensors (torch.load's mmap), or
    None where it cannot be read so."""
    try:
        import warnings

        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ck = torch.load(pt, map_location="cpu", weights_only=True, mmap=True)
        return int(convert._plain(ck.get("iter_num"))) if isinstance(ck, dict) else None
    except Exception:  # (a file the conversion will name, or an old format mmap cannot map)
        return None


def _ckpt_pt_to_take(out_dir):
    """nanoGPT's ckpt.pt in out_dir where it may be the checkpoint to go on from: there is none of
    Mica's, or it was written after Mica's (nanoGPT's train.py went on from an export); else None."""
    path, pt = os.path.join(out_dir, "ckpt.safetensors"), os.path.join(out_dir, "ckpt.pt")
    if not os.path.isfile(pt):
        return None
    if not os.path.lexists(path):
        return pt
    try:
        return pt if os.path.getmtime(pt) > os.path.getmtime(path) else None
    except OSError:
        return None


def nanogpt_checkpoint(out_dir, log, into=None):
    """The checkpoint to resume or sample from in out_dir, as nanoGPT's train.py and sample.py would
    take it: Mica's ckpt.safetensors, or nanoGPT's ckpt.pt converted (as `mica import` does) where
    there is no checkpoint of Mica's, or where ckpt.pt was saved at a later iteration than it (a run
    that goes back and forth between nanoGPT and Mica). The conversion is written into `into` (a
    folder of the caller's: sampling writes nothing into out_dir), else it replaces out_dir's
    checkpoint, with a note; the ckpt.pt stays as it is. Where a conversion cannot be made (no
    PyTorch to read it, a folder this process cannot write or another command holds, several
    ranks) out_dir's own path is given and a missing checkpoint's sentence names the import."""
    path = os.path.join(out_dir, "ckpt.safetensors") if isinstance(out_dir, str) and out_dir else None
    if path is None:
        return path
    pt = _ckpt_pt_to_take(out_dir)
    if pt is None or (into is None and (not os.access(out_dir, os.W_OK) or run_folder_in_use(out_dir))) \
            or distributed.ranks()[0] > 1:
        return path
    try:
        import torch  # noqa: F401  (convert's reader)
    except ImportError:
        return path
    mine = os.path.lexists(path)
    if mine:
        peeked = _iter_of_pt(pt)
        if peeked is not None and peeked == _iter_of(path):
            return path  # (an export of this very iteration: nothing to convert, and only its iter_num read)
    with tempfile.TemporaryDirectory(dir=into or out_dir, prefix=".mica-import-") as folder:
        try:
            converted = convert.import_nanogpt(pt, folder)
        except MicaError as e:
            if not mine:
                raise
            log(f"note: {pt} is newer than {path}, but cannot be read ({e.sentence}); going on from {path}")
            return path
        theirs, ours = _iter_of(converted), _iter_of(path) if mine else -1
        if mine and theirs <= ours:
            if theirs < ours:
                log(f"note: {pt} is newer than {path} but was saved at iter {theirs}, before its iter {ours}; going on "
                    f"from {path} (to go on from {pt} instead: mica import {pt} --out_dir {out_dir} --force)")
            return path
        said = (f"{out_dir} holds nanoGPT's ckpt.pt and no Mica checkpoint" if not mine else
                f"{pt} was saved at iter {theirs}, after {path}'s iter {ours}")
        target = os.path.join(into, "ckpt.safetensors") if into else path
        log(f"note: {said}; " + (f"reading it converted (as mica import {pt} does; nothing is written into "
                                  f"{out_dir})" if into else
                                  f"converting it to {path} first (as mica import {pt} --out_dir {out_dir} "
                                  "does; the ckpt.pt stays as it is)"))
        os.replace(converted, target)
        return target


def adopt_nanogpt_checkpoint(out_dir, log):
    """A resume's nanogpt_checkpoint: converted into out_dir, where the run goes on."""
    nanogpt_checkpoint(out_dir, log)


def _check_init_from(cfg):
    """Where the starting weights come from, checked before anything is built or written: resume
    needs out_dir's checkpoint, a path must be a .safetensors file, and PyTorch's files are named
    with the import that converts them."""
    init = cfg["init_from"]
    if init == "scratch" or not isinstance(init, str):
        return
    if init == "resume":
        path = os.path.join(cfg["out_dir"], "ckpt.safetensors")
        if not os.path.exists(path):
            raise MicaError(ckpt.missing(path, then="start with --init_from=scratch, or point --out_dir at the folder "
                                                    "of the run to resume"))
        return
    if init.endswith(PYTORCH_SUFFIXES) and not os.path.isfile(init):
        raise MicaError(f"init_from file {init} " + ("is a folder" if os.path.isdir(init) else "does not exist")
                        + "; give the path of nanoGPT's ckpt.pt to convert with mica import, or a .safetensors file")
    if init.endswith(PYTORCH_SUFFIXES) and not _looks_like_torch_save(init):
        raise MicaError(f"init_from file {init} is not a PyTorch checkpoint (not torch.save's zip or pickle; a file "
                        "of tokens?); give nanoGPT's ckpt.pt to convert with mica import, or a .safetensors file")
    if init.endswith(PYTORCH_SUFFIXES):
        raise MicaError(f"init_from={init} is a PyTorch checkpoint; convert it first with mica import {init} "
                        "--out_dir DIR, then train with --init_from=resume --out_dir=DIR (or "
                        "--init_from=DIR/ckpt.safetensors for its weights alone)")
    if not init.endswith(".safetensors"):  # (the speedrun's config check refused these already)
        raise MicaError(f"init_from={init!r} is not available: use scratch, resume or a .safetensors file (Mica's "
                        "own, or Hugging Face's GPT-2 model.safetensors)")
    if not os.path.isfile(init):
        raise MicaError(f"init_from file {init} " + ("is a folder" if os.path.isdir(init) else "does not exist")
                        + "; give the path of a .safetensors file of weights")


# ---- the speedrun recipe ------------------------------------------------------------------------

SPEEDRUN_MODEL_KEYS = ("num_layers", "model_dim", "head_dim")


def speedrun_files(pattern, what):
    """The files a train_files / val_files glob matches, sorted as the seed sorts them."""
    if not isinstance(pattern, str) or not pattern:
        raise MicaError(f"the {what} glob is empty; give one, e.g. data/fineweb10B/fineweb_train_*.bin")
    paths = sorted(p for p in glob.glob(pattern) if not os.path.isdir(p))
    if not paths:
        raise MicaError(f"no {what} files match {pattern}; prepare shards first, e.g. mica prepare text --input "
                        f"FILE --format shards --out {os.path.dirname(pattern) or '.'}")
    return paths


def _speedrun_split(pattern, vocab, tokens_per_batch, batches, what, log, unit=1):
    """The shards of `pattern`, checked to give `batches` batches of tokens_per_batch (+1) tokens as
    the seed's loader takes them ((path, header bytes) each); `unit`: what a batch size must be a
    multiple of (the validation's mbs * seq_len), for the size the sentence offers."""
    paths = speedrun_files(pattern, what)
    lengths = []
    for p in paths:
        if tok.token_layout(p)[0] != "shard":
            tok.open_tokens(p, None, 0, what)  # a damaged header is named there
            raise MicaError(f"{what} file {p} is not a shard (no magic number {tok.SHARD_MAGIC} at its start); the "
                            "speedrun reads shards: prepare them with mica prepare text --format shards")
        lengths.append(len(tok.open_tokens(p, vocab, 0, what)))
    most = max(max(lengths) - 2, 0) // unit * unit  # (the largest batch a shard holds, in whole units)
    fixes = ("fewer train_steps" if what == "training data" else
             f"fewer val_tokens (a shard here holds at most {most:,}, a multiple of mbs * seq_len)")
    smaller = "use a smaller batch_size" if what == "training data" else f"use fewer val_tokens (at most {most:,} here)"
    tok.seed_batches(lengths, tokens_per_batch, batches, what, paths, fixes, smaller)
    where = f"from {paths[0]} to {os.path.basename(paths[-1])}" if len(paths) > 1 else paths[0]
    log(f"{what}: {len(paths)} shard{'s' if len(paths) > 1 else ''}, {sum(lengths):,} tokens, {where}")
    return [(os.path.abspath(p), tok.token_layout(p)[1]) for p in paths]


def speedrun_vocab(cfg, log=print):
    """The model's vocabulary: vocab_size, or with 0 the data's meta.json vocabulary rounded up to a
    multiple of 128, as the seed rounds GPT-2's 50257 up to 50304."""
    return _speedrun_vocab(cfg, log)[0]


def _speedrun_vocab(cfg, log):
    """(speedrun_vocab's size, the training shards' meta_mod.Vocab or None)."""
    speedrun_files(cfg["train_files"], "training data")  # (no shards at all: say that, not what meta.json lacks)
    folder = os.path.dirname(cfg["train_files"]) or "."
    meta = meta_mod.read(folder) if os.path.isdir(folder) else None
    val_folder = os.path.dirname(cfg["val_files"]) or "."
    theirs = meta_mod.read(val_folder) if os.path.isdir(val_folder) and \
        os.path.realpath(val_folder) != os.path.realpath(folder) else None
    if meta is not None and theirs is not None and meta_mod.digest(meta) != meta_mod.digest(theirs):
        def said(m):
            return f"{m.path}: {m.tokenizer or 'char'}, {m.vocab_size} tokens"
        raise MicaError(f"the validation shards' vocabulary ({said(theirs)}) is not the training shards' ({said(meta)}), "
                        "so their ids mean other text; prepare both splits with one tokenizer (mica prepare text "
                        "writes train_* and val_* together)")
    if cfg["vocab_size"]:
        if meta is not None and meta.vocab_size > cfg["vocab_size"]:
            raise MicaError(f"vocab_size={cfg['vocab_size']} is smaller than the {meta.vocab_size} tokens of {meta.path}; "
                            "pass a larger vocab_size, or 0 to follow the data")
        if meta is not None and cfg["vocab_size"] >= 4 * max(meta.vocab_size, 128):  # (the seed's GPT-2 default on
            log(f"note: vocab_size={cfg['vocab_size']:,} is {cfg['vocab_size'] / meta.vocab_size:.0f}x the "  # a small one)
                f"{meta.vocab_size:,} tokens of {meta.path}: the embedding and head rows beyond them never see a "
                "token; --vocab_size=0 follows the data")
        return cfg["vocab_size"], meta
    if meta is None:
        raise MicaError(f"vocab_size=0 follows the data's meta.json, but {folder} has none; pass --vocab_size=N")
    vocab = -(-meta.vocab_size // 128) * 128
    log(f"vocab_size: {meta.vocab_size} from {meta.path}, rounded up to {vocab}")
    return vocab, meta


def prepare_speedrun(cfg, log):
    """The speedrun recipe up to the trainer's manifest: its shards checked against the seed's
    loader (every batch the run will take exists), its programs built, its starting state."""
    world, rank = distributed.ranks(cfg)
    vocab, data_meta = _speedrun_vocab(cfg, log)
    rows = cfg["mbs"] * cfg["seq_len"]
    files = [("train", *f) for f in _speedrun_split(cfg["train_files"], vocab, cfg["batch_size"], cfg["train_steps"],
                                                     "training data", log)]
    files += [("val", *f) for f in _speedrun_split(cfg["val_files"], vocab, cfg["val_tokens"], 1, "validation data",
                                                   log, unit=rows)]
    out_dir = _take_out_dir(cfg, rank, log)
    if cfg["init_from"] == "resume":  # (before compiling: a mismatch is said in seconds, not minutes)
        resume_step = _check_speedrun_resume(cfg, out_dir, vocab, log)
    model, opt, progs = programs.build(cfg, vocab, world, rank)
    log(f"number of parameters: {model.num_parameters():,}")
    if world > 1:
        log(programs.muon_sharding_report(cfg, model, opt, world))
    shards = _zero(cfg, model, world, log)
    exe, lowered = native.build_trainer(progs, cfg["opt_level"], log, device=cfg["device"], simulate=cfg["simulate"],
                                        tf32=cfg["tf32"])
    _products_record(cfg["device"], cfg["simulate"])
    native.check_in_place(lowered["train"])
    log(memory_plan.report(lowered, rank if world > 1 else None))
    _say_product_kernel(lowered, log)
    slots = native.state_slots(lowered, [n for n, _ in model.named_parameters()], shards, rank)
    expected = _expected(slots, lowered)
    settings = dict(mode="train", loop="speedrun", out_dir=out_dir, vocab=vocab, block=cfg["seq_len"],
                    batch=cfg["mbs"], accum=cfg["batch_size"] // rows, max_iters=cfg["train_steps"],
                    eval_interval=cfg["val_every"], eval_iters=cfg["val_tokens"] // rows,
                    log_interval=cfg["log_interval"], eval_only=0, always_save=1,
                    seed=config_mod.seed_int64(cfg["seed"]), threads=cfg["threads"] or os.cpu_count() or 1,
                    time_every_iter=int(cfg["time_every_iter"]), flops_per_iter=programs.flops_per_iter(cfg, model),
                    peak_flops=1.0, stop_at=cfg["stop_at"],
                    config_json=json.dumps(_with_vocab_digest(cfg, data_meta), separators=(",", ":")))
    if cfg["init_from"] != "resume":
        _say_replaced(out_dir, settings, log)
    if cfg["init_from"] == "scratch":
        log("initializing a new model from scratch")
        path = _init_path(out_dir, settings)
        ckpt.write(path, _stored(model, model.init(cfg["seed"])), {"format": "mica", "config": json.dumps(cfg)})
        loads = _loads(path, expected, settings, params_only=True)
    elif cfg["init_from"] == "resume":
        loads = _speedrun_resume(out_dir, resume_step, expected, settings, log)
        if rank == 0:  # (the seed's loop goes on after the validation it saved at, without redoing it)
            _metrics_up_to(out_dir, resume_step, evaluated_again=False, log=log, settings=settings)
    else:
        log(f"initializing from weights in {cfg['init_from']}")
        loads = _loads(cfg["init_from"], expected, settings, params_only=True)
    return exe, _write_manifest(cfg, out_dir, world, rank, settings, slots, lowered, loads, files), cfg


def _metrics_up_to(out_dir, step, evaluated_again, log, settings):
    ckpt.SafeTensors(os.path.join(out_dir, "ckpt.safetensors")).verify()  # (a damaged one stops the resume first)
    _trim_metrics(out_dir, step, evaluated_again, log, settings)


def _trim_metrics(out_dir, step, evaluated_again, log, settings):
    """The resume's log: metrics.jsonl without the rows a run wrote after the checkpoint it now
    resumes from (a run stopped by Ctrl-C or a crash trained on past its last checkpoint, and the
    resume trains those iterations again): training rows of iterations from `step` on, and
    validation rows after `step` (at `step` too where the loop evaluates again there); and lines
    that are not a JSON row (a write a crash cut short, which the trainer would append to and
    `mica plot` refuses). Where rows go, they go into metrics.jsonl.new, which the resume appends to
    and renames over metrics.jsonl at its first save (settings' `pending` 2, runtime/log.c): a resume
    that stops before one leaves metrics.jsonl whole."""
    path = os.path.join(out_dir, "metrics.jsonl")
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines(keepends=True)
    except OSError:
        return  # (none yet, or unreadable: the trainer says so when it opens it)

    def row_of(line):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            return None
        return row if isinstance(row, dict) else None

    def stale(line):
        row = row_of(line)
        if row is None:
            return False
        if isinstance(row.get("iter"), int) and "step" not in row:
            return row["iter"] >= step
        if isinstance(row.get("step"), int):
            return row["step"] > step or (evaluated_again and row["step"] == step)
        return False

    broken = [n for n, line in enumerate(lines, 1) if line.strip() and row_of(line) is None]
    kept = [line for n, line in enumerate(lines, 1) if not stale(line) and n not in broken and line.strip()]
    if len(kept) == len(lines):
        return
    atomic_write(path + ".new", b"".join(line if line.endswith(b"\n") else line + b"\n" for line in kept))
    settings["pending"] = 2
    dropped = len(lines) - len(kept) - len(broken) - sum(1 for line in lines if not line.strip())
    if dropped:
        log(f"note: {dropped} rows of metrics.jsonl came after the checkpoint (the steps a run takes after its last "
            "save, which this resume takes again) and are left out of this resume's log")
    if broken:
        log(f"note: metrics.jsonl's line{'s' if len(broken) > 1 else ''} {', '.join(map(str, broken[:5]))}"
            f"{' ...' if len(broken) > 5 else ''} {'were' if len(broken) > 1 else 'was'} not a JSON row (a write cut "
            f"short by a crash, or an edit) and {'are' if len(broken) > 1 else 'is'} left out of this resume's log, "
            "so its rows follow whole ones")
    log("note: this resume logs to metrics.jsonl.new, which replaces metrics.jsonl at its first save or its end (a "
        "resume that fails or is stopped before then leaves metrics.jsonl as it is)")


def _train_time_at(metrics, step, log):
    """The speedrun's train_time at the validation of `step`, from the run's metrics.jsonl (wall-clock
    time is kept out of checkpoints, so their bytes stay the same for the same inputs); 0 with a note
    when the file has no readable row for it."""
    from .plot import _numbers  # (the check `mica plot` makes of a row's numbers)

    found = None
    try:
        with open(metrics, errors="replace") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(row, dict) and row.get("step") == step and _numbers(row, "val_loss", "train_time") \
                        and 0 <= row["train_time"] < float("inf"):
                    found = float(row["train_time"])
    except OSError:
        pass
    if found is None:
        log(f"note: {metrics} has no validation row for step {step}, so train_time starts again from 0")
        return 0.0
    return found


def _check_speedrun_resume(cfg, out_dir, vocab, log):
    """The checkpoint a speedrun resumes: the recipe's, of the same model, vocabulary (`vocab`, as
    this run's data and settings make it) and schedule, and short of where this run is to stop.
    Returns its iteration."""
    path = os.path.join(out_dir, "ckpt.safetensors")
    st = ckpt.SafeTensors(path)
    saved = _saved_config(st)
    if saved.get("recipe") != "speedrun":
        raise MicaError(f"the checkpoint in {out_dir} was not trained with the speedrun recipe; resume it with its own "
                        "config, or train into another out_dir")
    rows = _embedding_rows(st, "embed.weight", None) if "embed.weight" in st.tensors else vocab  # (its width: _loads)
    if rows != vocab:
        raise MicaError(f"the checkpoint in {out_dir} has a vocabulary of {rows} tokens, but "
                        f"this run's is {vocab} (from vocab_size or the data's meta.json); resume with the data and "
                        "vocab_size the run was trained with")
    for k in (*SPEEDRUN_MODEL_KEYS, "train_steps", "batch_size", "seq_len", "mbs", "cooldown_frac",
              "dtype"):
        if saved.get(k, cfg[k]) != cfg[k]:
            raise MicaError(f"the checkpoint in {out_dir} was trained with {k}={saved[k]!r}, not {cfg[k]!r}; resume with "
                            "the same settings")
    st.check_metadata()
    try:
        step = int(st.metadata["iter_num"])
    except (KeyError, ValueError):
        raise MicaError(f"checkpoint {path} has no readable iter_num in its metadata; use another checkpoint") from None
    if cfg["stop_at"] and cfg["stop_at"] <= step:
        raise MicaError(f"stop_at={cfg['stop_at']} is not after the checkpoint's step {step}; pass a later stop_at, or "
                        f"0 to train on to train_steps ({cfg['train_steps']})")
    if step >= cfg["train_steps"]:
        log(f"note: the checkpoint in {out_dir} is at step {step} of {cfg['train_steps']}: the run is finished, "
            "nothing is left to train")
    return step


def _speedrun_resume(out_dir, step, expected, settings, log):
    """The resume's settings and loads from out_dir's checkpoint, at `step` (_check_speedrun_resume
    checked it against this run before the build)."""
    path = os.path.join(out_dir, "ckpt.safetensors")
    log(f"resuming training from {out_dir}")
    st = ckpt.SafeTensors(path)
    settings.update(resume=1, resume_iter=step, resume_best=0.0)
    settings["resume_time"] = _train_time_at(os.path.join(out_dir, "metrics.jsonl"), settings["resume_iter"], log)
    if "data.next_offsets" in st.tensors and _offset_rows(st) == 2:
        settings["resume_next"] = " ".join(str(int(v)) for v in st.read("data.next_offsets").reshape(-1))
    has_state = _check_resume_names(st, expected, log)
    return _loads(path, expected, settings, st=st, params_only=not has_state)


A100_BF16_PEAK = 312e12  # nanoGPT's estimate_mfu divides by it on any card; so does Mica's log on a GPU


def _products_record(device, simulate=False):
    """A CUDA trainer times cuBLASLt's routines for each product shape once and keeps the fastest in
    this file (it names the card, driver and cuBLASLt version), so every later run on this machine
    uses the same routines; the simulator keeps its own, so it never displaces a card's.
    MICA_PRODUCTS chooses another file."""
    if device == "cuda":
        name = "cuda-products-simulator.txt" if simulate else "cuda-products.txt"
        os.environ.setdefault("MICA_PRODUCTS", os.path.join(cbuild.cache_dir(), name))


def _follow_resumed_model(cfg, vocab, log):
    """--init_from=resume takes the model's settings from the checkpoint, as nanoGPT's resume does
    (n_layer, n_head, n_embd, block_size, bias and the vocabulary size), saying what it overrides."""
    path = os.path.join(cfg["out_dir"], "ckpt.safetensors")
    if cfg["init_from"] != "resume" or not os.path.isfile(path):
        return vocab  # (a missing checkpoint is _check_init_from's sentence)
    st = ckpt.SafeTensors(path)
    saved = _saved_config(st)
    changed = [f"{k}={saved[k]!r} (not {cfg[k]!r})" for k in MODEL_KEYS if k in saved and saved[k] != cfg[k]]
    for k in MODEL_KEYS:
        if k in saved:
            cfg[k] = config_mod._check_type(k, saved[k], path, config_mod.DEFAULTS)
    if changed:
        log(f"resuming with the checkpoint's model settings: {', '.join(changed)}")
    if "transformer.wte.weight" in st.tensors:
        return _embedding_rows(st, "transformer.wte.weight", cfg["n_embd"])
    return vocab


def _check_resumed_vocabulary(cfg, folder, data_meta):
    """A resume trains on data of the vocabulary its checkpoint was trained with (the config it keeps
    has the data's vocab_digest, as sampling checks it): a model whose token ids meant other
    characters would train on, and its checkpoint could no longer be sampled, so refuse before the
    earlier checkpoint is overwritten."""
    path = os.path.join(cfg["out_dir"], "ckpt.safetensors")
    if cfg["init_from"] != "resume" or not os.path.isfile(path):
        return
    st = ckpt.SafeTensors(path)
    trained = _saved_config(st).get("vocab_digest")
    if not isinstance(trained, str):  # (an imported checkpoint: its vocabulary's size is all it says of its data)
        rows = st.info("transformer.wte.weight")[1][0] if "transformer.wte.weight" in st.names else None
        if data_meta is not None and rows is not None and rows < data_meta.vocab_size:
            raise MicaError(f"the checkpoint in {cfg['out_dir']} embeds {rows} tokens, but {data_meta.path}'s "
                            f"vocabulary has {data_meta.vocab_size}: it was trained on other data; resume with the "
                            "data it trained on (--dataset or --data_dir), or train afresh with --init_from=scratch")
        return
    if meta_mod.trained_with(data_meta, trained):
        return
    what = f"{data_meta.path}'s vocabulary ({data_meta.vocab_size} tokens) is not" if data_meta is not None else \
        f"{folder} holds no vocabulary (meta.json or meta.pkl), not"
    raise MicaError(f"{what} the one the checkpoint in {cfg['out_dir']} was trained with (other data, or the data "
                    "prepared again since), so its token ids would mean other text; resume with the data the run "
                    "trained on (--dataset or --data_dir), or train afresh with --init_from=scratch")


def _follow_resumed_dtype(cfg, log):
    """A nanoGPT-recipe run Mica trained resumes in the dtype it trained in, and with the
    fp_half_intermediates it trained with, unless --dtype (--fp_half_intermediates, or a config)
    says otherwise: then it goes on from the same weights, not bit for bit, said. (An imported
    checkpoint's config holds nanoGPT's dtype setting, which on a CPU it did not train in; the
    speedrun recipe checks its dtype against the checkpoint's itself. A dtype that is no dtype is
    left to check_supported's error, with no note before it.)"""
    path = os.path.join(cfg["out_dir"], "ckpt.safetensors") if isinstance(cfg["out_dir"], str) else None
    if cfg["recipe"] != "nanogpt" or cfg["init_from"] != "resume" or not path or not os.path.isfile(path):
        return
    if cfg["dtype"] not in config_mod.DTYPES:
        return
    try:
        st = ckpt.SafeTensors(path)
        saved = _saved_config(st)
    except MicaError:
        return  # (said where the checkpoint is read for the resume)
    _follow_saved_dtype(cfg, st, saved, log)
    if "imported_from" not in st.metadata and cfg["dtype"] != "float32":
        _follow_resumed_roundings(cfg, saved, log)


def _follow_saved_dtype(cfg, st, saved, log):
    was = saved.get("dtype")
    if was not in config_mod.DTYPES or was == cfg["dtype"]:
        return
    if "imported_from" in st.metadata:
        # nanoGPT's train.py autocasts on cards alone: a checkpoint it trained on a CPU (its config has no
        # recipe, which Mica's exports have) trained in float32 whatever its dtype says
        device = saved.get("device")
        if "recipe" not in saved and isinstance(device, str) and "cuda" not in device:
            if cfg["dtype"] != "float32" or "dtype" in getattr(cfg, "given", ()):
                return
            log(f"note: the imported checkpoint's config says dtype={was}, but it trained on device={device!r}, "
                "where nanoGPT trains in float32 whatever dtype says; so does this run")
        elif "dtype" not in getattr(cfg, "given", ()):
            log(f"note: the imported checkpoint's config says dtype={was} (nanoGPT's setting where it was trained); "
                f"this run trains in dtype={cfg['dtype']}: pass --dtype={was} to train in that")
        return
    if "dtype" in getattr(cfg, "given", ()):
        log(f"note: the checkpoint was trained in {was}; this run goes on in dtype={cfg['dtype']} from its weights "
            "(not bit for bit as a resume in its own dtype)")
        return
    log(f"resuming in the checkpoint's dtype={was} (--dtype={cfg['dtype']} trains on in that instead)")
    cfg["dtype"] = was
    if hasattr(cfg, "given"):  # (the checkpoint's, no default: check_supported's notes say so)
        cfg.given.add("dtype")


def _follow_resumed_roundings(cfg, saved, log):
    """fp_half_intermediates as the checkpoint trained with it (it changes the step's roundings, so a
    resume without it is not the run it continues), unless given: then said, as for dtype."""
    was = saved.get("fp_half_intermediates")
    if not isinstance(was, bool) or was == bool(cfg.get("fp_half_intermediates")):
        return
    if "fp_half_intermediates" in getattr(cfg, "given", ()):
        log(f"note: the checkpoint was trained with fp_half_intermediates={was}; this run goes on with "
            f"fp_half_intermediates={cfg['fp_half_intermediates']} from its weights (not bit for bit as a resume "
            "with its own)")
        return
    log(f"resuming with the checkpoint's fp_half_intermediates={was} (--fp_half_intermediates="
        f"{cfg.get('fp_half_intermediates')} trains on with that instead)")
    cfg["fp_half_intermediates"] = was


def _hf_init(cfg):
    """Whether --init_from names a Hugging Face GPT-2 file (Conv1D layout) rather than Mica's."""
    init = cfg["init_from"]
    return init.endswith(".safetensors") and os.path.isfile(init) and convert.is_hf_gpt2(init)


def _follow_hf_weights(cfg, vocab, log):
    """--init_from=an HF GPT-2 file: the model's settings come from the file, as nanoGPT's come from
    the checkpoint for init_from=gpt2* (n_layer, n_head, n_embd, bias, vocab_size; block_size cropped
    down to the configured one). Changes cfg in place; returns the vocabulary size to build."""
    if not _hf_init(cfg):
        return vocab
    args = convert.hf_gpt2_args(cfg["init_from"])
    cfg.update({k: args[k] for k in ("n_layer", "n_head", "n_embd", "bias")})
    cfg["block_size"] = min(cfg["block_size"], args["block_size"])
    log(f"model settings from {cfg['init_from']} (Hugging Face's GPT-2): n_layer={cfg['n_layer']}, "
        f"n_head={cfg['n_head']}, n_embd={cfg['n_embd']}, bias=True, vocab_size={args['vocab_size']}, "
        f"block_size={cfg['block_size']}")
    return args["vocab_size"]


def _check_weights_fit(cfg, vocab):
    """--init_from=Mica's PATH.safetensors holds this model's weights, by shape, read from its header
    before anything is compiled (the trainer's load checks dtypes and bytes again)."""
    init = cfg["init_from"]
    if not (isinstance(init, str) and init.endswith(".safetensors")) or _hf_init(cfg):
        return
    from ..models.gpt import GPT

    specs = GPT(programs.model_config(cfg, vocab)).param_specs()
    st = ckpt.SafeTensors(init)
    if "h.0.attn.c_attn.weight" in st.tensors and not any(n.startswith("transformer.") for n in st.names):
        raise MicaError(f"{init} names its tensors as Hugging Face's GPT-2 does, but its h.0.attn.c_attn.weight is "
                        f"{list(st.info('h.0.attn.c_attn.weight')[1])}, not Conv1D's [n_embd, 3 * n_embd]; give a GPT-2 "
                        "model.safetensors in Hugging Face's layout, or Mica's own weights")
    missing, wrong = [], []
    for name, spec in specs.items():
        key = "lm_head.weight" if name == "transformer.wte.weight" and name not in st.tensors else name
        if key not in st.tensors:
            missing.append(name)
        elif tuple(st.info(key)[1]) != tuple(spec.shape):
            wrong.append(f"{key} is {list(st.info(key)[1])} where this model needs {list(spec.shape)}")
    extra = [n for n in st.names if not n.startswith(("optimizer.", "data.")) and n not in specs
             and n != "lm_head.weight"]
    _misfit(init, missing, wrong, extra)


def _misfit(path, missing, wrong, extra):
    """The sentence for weights that do not fit the model, if any do not."""
    if missing or wrong or extra:
        parts = [f"{len(missing)} missing ({_some(missing)})"] if missing else []
        parts += [f"{len(wrong)} of another shape ({_some(wrong, 2)})"] if wrong else []
        parts += [f"{len(extra)} this model does not have ({_some(extra)})"] if extra else []
        raise MicaError(f"{path} does not fit this model: tensors {'; '.join(parts)}; use weights of the same "
                        "n_layer, n_head, n_embd, vocabulary and bias")


def _zero(cfg, model, world, log):
    """ZeRO-1's shards of the checkpoint (programs.zero_slots), its report said; None when unsharded."""
    shards = programs.zero_slots(cfg, model, world)
    if shards is not None:
        log(programs.zero_report(cfg, model, world))
    elif cfg.get("zero_stage"):
        log("note: zero_stage=1 shards AdamW's state among the ranks of mpirun -np N; one process holds it all")
    return shards


def _write_manifest(cfg, out_dir, world, rank, settings, slots, lowered, loads, files):
    """The trainer's manifest (one per rank, with the run's hash, under mpirun); its path."""
    manifest = os.path.join(out_dir, "trainer.manifest")
    if world > 1:
        settings.update(world=world, rank=rank, run_hash=distributed.run_hash(cfg, lowered, world))
        manifest = os.path.join(out_dir, f"trainer.rank{rank}.manifest")
    native.write_manifest(manifest, settings, slots, lowered, loads, files)
    return manifest


def _expected(slots, lowered):
    """{tensor name: (slot index, shape, numpy dtype)} of the train program's state; the slot index
    is None for a tensor another rank holds (ZeRO-1's optimizer state: this rank loads none of it)."""
    specs = dict(zip(lowered["train"].program.input_names, (v.spec for v in lowered["train"].program.graph.inputs)))
    out = {}
    for i, (kind, name, inp) in enumerate(slots):
        spec = inp if kind == 3 else specs[inp]
        out[name] = (None if kind == 3 else i, tuple(spec.shape), _file_dtype(spec.dtype))
    return out


def _file_dtype(dtype):
    """The dtype SafeTensors.info gives the tensor of a slot of this dtype: its numpy storage, or
    checkpoint.BFLOAT16 for a bfloat16 slot (numpy has no bfloat16; the file holds BF16)."""
    return ckpt.BFLOAT16 if dtype is dtypes.bfloat16 else dtype.np_storage


def _stored(model, values):
    """The initial values as the trainer's file holds them: a bfloat16 parameter's rounded to
    bfloat16 (ties to even, as the seed's .bfloat16() rounds its float32 init) and stored as BF16."""
    kinds = {n: p.dtype for n, p in model.named_parameters()}
    return {n: ckpt.BF16Tensor.round(a) if kinds.get(n) is dtypes.bfloat16 else a for n, a in values.items()}


def _initial_state(cfg, model, by_name, out_dir, settings, log):
    """Where the trainer's starting values come from: [(slot index, file offset)] of init_file."""
    init = cfg["init_from"]
    if init != "resume":
        _say_replaced(out_dir, settings, log)
    if init == "scratch":
        log("initializing a new model from scratch")
        path = _init_path(out_dir, settings)
        tensors = dict(model.init(cfg["seed"]))
        if cfg.get("dtype") == "float16":  # the loss scaler starts at its init_scale, not at zero
            tensors.update({f"optimizer.scaler.{k}": v for k, v in mica_amp.GradScaler().init().items()})
        ckpt.write(path, tensors, {"format": "mica", "config": json.dumps(cfg)})
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
        st.check_metadata()
        try:
            settings.update(resume=1, resume_iter=int(md["iter_num"]), resume_best=float(md["best_val_loss"]))
            if not 0 <= settings["resume_iter"] < 2**62:  # (the trainer's iterations are int64)
                raise ValueError
        except (KeyError, ValueError):
            raise MicaError(f"checkpoint {path} has no readable iter_num / best_val_loss in its metadata; use another "
                            "checkpoint") from None
        _say_scaler(st, by_name, cfg, log)
        has_state = _check_resume_names(st, by_name, log)
        rows = cfg["batch_size"] * cfg["gradient_accumulation_steps"]
        afresh = "batches come from --batch_order" if cfg.get("batch_order") else "batches start afresh from the seed"
        if "data.next_offsets" in st.tensors and _offset_rows(st) != rows:
            log(f"note: the checkpoint was trained with another batch_size x gradient_accumulation_steps "
                f"({_offset_rows(st)} rows, now {rows}): {afresh}")
        elif "data.next_offsets" in st.tensors and "rng" in md:
            if not re.fullmatch(r"[0-9a-f]{16}( [0-9a-f]{16}){3}", md["rng"]):
                raise MicaError(f"checkpoint {path} is damaged: its batch generator state is unreadable")
            settings["resume_rng"] = md["rng"]
            settings["resume_next"] = " ".join(str(int(x)) for x in st.read("data.next_offsets").reshape(-1))
        else:
            log(f"note: the checkpoint holds no data position (an imported one?): {afresh}")
        return _loads(path, by_name, settings, st=st, params_only=not has_state)
    if init.endswith(".safetensors"):
        log(f"initializing from weights in {init}")
        if cfg.get("dtype") == "float16":
            log("the loss scaler starts at GradScaler's init_scale (65536), as in a run from scratch")
        if _hf_init(cfg):  # Hugging Face's names and Conv1D layout: converted to Mica's first
            tensors, _ = convert.read_hf_gpt2(init, block_size=cfg["block_size"])
            init = _init_path(out_dir, settings)
            ckpt.write(init, tensors, {"format": "mica", "converted_from": os.path.abspath(cfg["init_from"]),
                                       "config": json.dumps(cfg)})
        else:
            init = _widened(init, by_name, _init_path(out_dir, settings), cfg, log)
        return _loads(init, by_name, settings, params_only=True, fresh_scaler=True)
    raise AssertionError(f"init_from={init!r} passed _check_init_from")


def _widened(path, by_name, out, cfg, log):
    """A weights file whose floating tensors are half types (bfloat16, float16) where the model's
    are float32: the trainer keeps float32 master weights, so the file's values are widened
    (exactly) into `out` (the run's init file); any other file is read as it is."""
    st = ckpt.SafeTensors(path)
    half = [n for n in st.names if st.info(n)[0] in (ckpt.BFLOAT16, np.dtype(np.float16))
            and by_name.get(n, (0, 0, np.float32))[2] == np.float32]
    if not half:
        return path
    log(f"note: {path} holds {len(half)} tensors in {st.info(half[0])[0].name}; the model trains float32 "
        "master weights, widened from them exactly")
    tensors = {n: (st.read(n).astype(np.float32) if n in half else st.read(n)) for n in st.names}
    ckpt.write(out, tensors, {"format": "mica", "converted_from": os.path.abspath(path), "config": json.dumps(cfg)})
    return out


def _saved_config(st):
    try:
        saved = json.loads(st.metadata.get("config", "{}"))
    except (ValueError, RecursionError):
        saved = None
    if not isinstance(saved, dict):
        raise MicaError(f"checkpoint {st.path} has unreadable config metadata")
    _check_saved_model(saved, st.path)
    return saved


def _check_saved_model(saved, path):
    """The model's settings a checkpoint's config holds, checked as a config's are (an edited one
    could say n_head=3 beside n_embd=32): a sentence naming the checkpoint, not an error deep in
    the model's code."""
    speedrun = saved.get("recipe") == "speedrun"
    keys = SPEEDRUN_MODEL_KEYS if speedrun else MODEL_KEYS
    defaults = config_mod.defaults_for("speedrun" if speedrun else "nanogpt")
    for k in keys:
        if k in saved:
            saved[k] = config_mod._check_type(k, saved[k], f"checkpoint {path}", defaults)
            if k != "bias" and saved[k] <= 0:
                raise MicaError(f"checkpoint {path}: its config says {k}={saved[k]}, which must be positive; the "
                                "checkpoint's metadata was edited or damaged, use another checkpoint")
    if not speedrun and isinstance(saved.get("n_embd"), int) and isinstance(saved.get("n_head"), int) \
            and saved["n_embd"] % saved["n_head"]:
        raise MicaError(f"checkpoint {path}: its config says n_embd={saved['n_embd']} with n_head={saved['n_head']}, "
                        "which does not divide it; the checkpoint's metadata was edited or damaged, use another "
                        "checkpoint")


def _product_kernel(lowered):
    """The bfloat16 product kernel a CPU trainer was built with (it depends on the processor), or
    None where the trainer has no bfloat16 products on the CPU."""
    from ..passes.schedule import Gemm

    target = lowered["train"].target
    if target.name == "cpu" and any(isinstance(k, Gemm) and k.a.dtype is dtypes.bfloat16
                                    for k in lowered["train"].schedule.kernels):
        return target.bf16_gemm
    return None


def _say_product_kernel(lowered, log):
    """Which bfloat16 product kernel a CPU trainer was built with."""
    if _product_kernel(lowered):
        target = lowered["train"].target
        log(bf16gemm.describe(target.bf16_gemm, target.bf16_asked))


def _say_other_product_kernel(cfg, kernel, log):
    """A note when a resume's bfloat16 products run on another kernel than the checkpoint's run did
    (another processor, or MICA_BF16_GEMM): its sums go in another order, so the run goes on from the
    same state but not bit for bit. (Checkpoints older than the record say nothing.)"""
    if cfg["init_from"] != "resume" or kernel is None:
        return
    try:
        was = _saved_config(ckpt.SafeTensors(os.path.join(cfg["out_dir"], "ckpt.safetensors"))).get("bf16_gemm")
    except MicaError:
        return
    if isinstance(was, str) and was != kernel:
        log(f"note: the checkpoint's run took its bfloat16 products on the {was} kernel and this trainer takes them "
            f"on the {kernel} kernel: it goes on from the same state, not bit for bit (MICA_BF16_GEMM={was} picks "
            "that kernel where this processor has it)")


def _say_replaced(out_dir, settings, log):
    """A note when a run that does not resume starts in a folder holding an earlier run's
    checkpoint, which its first save replaces (as nanoGPT's does): the moment to stop if
    --init_from=resume was meant. Until then that run's metrics.jsonl and init.safetensors stay as
    they are too (settings' `pending`: this run logs to metrics.jsonl.new and starts from
    init.new.safetensors, renamed into place at its first save; a run that saves none leaves them, runtime/log.c)."""
    settings["pending"] = int(os.path.isfile(os.path.join(out_dir, "ckpt.safetensors")))
    if settings["pending"]:
        log(f"note: {out_dir} holds an earlier run's checkpoint; this run does not resume it and replaces it, its "
            "metrics.jsonl and init.safetensors at its first save (Ctrl-C now and pass --init_from=resume to continue "
            "that run instead)")


def _init_path(out_dir, settings):
    """Where this run's starting values are written: init.safetensors, or init.new.safetensors while an
    earlier run's files stay (`pending`, _say_replaced)."""
    return os.path.join(out_dir, "init.new.safetensors" if settings.get("pending") else "init.safetensors")


def _say_scaler(st, by_name, cfg, log):
    """A note where the checkpoint's loss scaler and this run's dtype differ: nanoGPT never saves its
    GradScaler, so a float16 resume starts a new one; Mica keeps it for an exact resume, so a
    checkpoint without one (trained in another dtype, or imported) starts afresh, and one with a
    scaler resumed in another dtype leaves it out."""
    needed = any(n.startswith("optimizer.scaler.") for n in by_name)
    held = "optimizer.scaler.scale" in st.tensors
    if needed and not held:
        log(f"note: {st.path} holds no loss scaler (trained in another dtype, or imported): float16 training "
            "starts a new one at scale 65536, as nanoGPT's resume does")
    elif held and not needed:
        log(f"note: {st.path} holds a float16 run's loss scaler, which a {cfg['dtype']} run does not use: its "
            "checkpoints will hold none")


def _check_resume_names(st, by_name, log):
    """A checkpoint to resume from holds this model's tensors and nothing else: an unknown name (a
    damaged header, another model) is an error, and so is a partial optimizer state. True when the
    optimizer state is there; a checkpoint of weights alone (an import) starts AdamW afresh, said."""
    known = set(by_name) | {"data.next_offsets", "lm_head.weight", *SCALER}
    unknown = [n for n in st.names if n not in known]
    if unknown:
        raise MicaError(f"checkpoint {st.path} holds tensors this model does not have ({_some(unknown)}); it was "
                        "written for another model, or its header is damaged")
    optimizer = [n for n in by_name if n.startswith("optimizer.") and n not in SCALER]
    present = [n for n in optimizer if n in st.tensors]
    if present and len(present) < len(optimizer):
        missing = [n for n in optimizer if n not in st.tensors]
        raise MicaError(f"checkpoint {st.path} lacks part of the optimizer state ({_some(missing)}); it is damaged: "
                        "resume from another checkpoint")
    if not st.checksummed:
        log(f"note: {st.path} holds no checksums (written by an older Mica or another tool): its bytes are not "
            "verified")
    if not present:
        log("note: the checkpoint holds weights but no optimizer state: AdamW's moments start from zero")
    return bool(present)


SCALER = ("optimizer.scaler.scale", "optimizer.scaler.growth_tracker")  # (a float16 run's; see _say_scaler)


def _offset_rows(st):
    """The rows of the checkpoint's data position (data.next_offsets: int64, one offset a row), or a
    sentence where its header gives it another type or shape (the checksum covers only its bytes)."""
    dtype, shape, _ = st.info("data.next_offsets")
    if dtype != np.int64 or len(shape) != 1:
        name = dtype.name if dtype is ckpt.BFLOAT16 else np.dtype(dtype).name
        raise MicaError(f"checkpoint {st.path} is damaged: its data position (data.next_offsets) is {name}{list(shape)}, "
                        "not one int64 offset a row; resume from another checkpoint")
    return shape[0]


def _embedding_rows(st, name, width):
    """The vocabulary the checkpoint's embedding `name` holds: its rows, where it is [rows, width] as
    the model's (the checksum covers only its bytes: a header that gives it another shape is damage)."""
    shape = st.info(name)[1]
    if len(shape) != 2 or (width is not None and shape[1] != width) or shape[0] < 1:
        raise MicaError(f"checkpoint {st.path} is damaged: its {name} is {list(shape)}, not [vocabulary, "
                        f"{'width' if width is None else width}] as its model's; use another checkpoint")
    return int(shape[0])


def _some(names, n=4):
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _loads(path, by_name, settings, params_only=False, st=None, fresh_scaler=False):
    """[(slot index, file offset, CRC-32 or None)] of the tensors to read from `path`, and a
    native.Fill for a loss scaler the file lacks (it starts afresh, as nanoGPT's resume starts a new
    GradScaler, and for every run `fresh_scaler` starts from weights); every other tensor the model
    needs must be there with its shape and dtype (the error names all that differ)."""
    st = st or ckpt.SafeTensors(path)
    settings["init_file"] = os.path.abspath(path)
    loads, missing, wrong = [], [], []
    fresh = mica_amp.GradScaler().init()
    for name, (index, shape, dtype) in by_name.items():
        if params_only and name.startswith("optimizer.") and not name.startswith("optimizer.scaler."):
            continue
        key = name
        if index is None and key in st.tensors:  # (another rank's to load; the file holds it, as it must)
            continue
        if key not in st.tensors and name == "transformer.wte.weight" and "lm_head.weight" in st.tensors:
            key = "lm_head.weight"  # the tie: either name holds the matrix
        if (fresh_scaler or key not in st.tensors) and name.startswith("optimizer.scaler.") and index is not None:
            loads.append(native.Fill(index, np.asarray(fresh[name.rsplit(".", 1)[1]], dtype).tobytes()))
            continue
        if key not in st.tensors:
            missing.append(name)
            continue
        got_dtype, got_shape, offset = st.info(key)
        if tuple(got_shape) != tuple(shape) or got_dtype != dtype:
            wrong.append(f"{key} is {got_dtype.name}{list(got_shape)} where this model needs "
                         f"{dtype.name if dtype is ckpt.BFLOAT16 else np.dtype(dtype).name}{list(shape)}")
            continue
        loads.append((index, offset, st.crc(key)))
    extra = [n for n in st.names if not n.startswith(("optimizer.", "data.")) and n not in by_name
             and n != "lm_head.weight"]
    _misfit(path, missing, wrong, extra)
    return loads


def train(config_path=None, overrides=(), log=print, execute=True):
    if distributed.ranks()[1] > 0:  # (rank 0 says what every rank would)
        log = _quiet
    exe, manifest, cfg = prepare_run(config_path, overrides, log)
    if execute:
        # Python ignores SIGPIPE, and an ignored signal stays ignored across exec: the trainer would
        # train on to the end after `mica train ... | head` had gone, its lines discarded. With the
        # default back, it stops as any command in a pipe does (its checkpoints are written to a
        # temporary file and renamed, so one cut short loses nothing)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        try:
            os.execv(exe, [exe, manifest])
        except OSError as e:
            raise cannot_run(exe, e) from None
    try:
        return subprocess.run([exe, manifest]).returncode
    except OSError as e:
        raise cannot_run(exe, e) from None


def cannot_run(exe, e):
    """The sentence for a built trainer the system refuses to start: a cache on a file system
    mounted noexec (common for /tmp), or a damaged file."""
    import errno

    if e.errno == errno.EACCES:
        return MicaError(f"the built trainer {exe} cannot be started ({e.strerror}): the cache's file system does "
                         "not let programs run from it (mounted noexec?); set MICA_CACHE to a folder on another one")
    return MicaError(f"the built trainer {exe} cannot be started ({e.strerror}); delete its folder from Mica's cache "
                     "to build it again")


def _quiet(message):
    pass


# ---- sampling -------------------------------------------------------------------------------------

def _as_trained(folder, out_dir, saved_out_dir):
    """A data folder the run named relative to the folder it trained in: as it stands from here
    when it exists, else from that folder, found from where out_dir is now (the run trained in the
    folder holding its out_dir as it named it, e.g. `out`); checkpoints keep paths as given, so
    their bytes do not depend on where a run was made."""
    if os.path.isabs(folder) or os.path.isdir(folder) or not isinstance(saved_out_dir, str):
        return folder
    parts = os.path.normpath(saved_out_dir).split(os.sep)
    here = os.path.abspath(out_dir)
    if os.path.isabs(saved_out_dir) or ".." in parts or here.split(os.sep)[-len(parts):] != parts:
        return folder
    base = os.sep.join(here.split(os.sep)[:-len(parts)]) or os.sep
    return os.path.join(base, folder) if os.path.isdir(os.path.join(base, folder)) else folder


def _with_vocab_digest(cfg, vocab):
    """The config a checkpoint keeps, with `vocab_digest` (meta.digest) of the data folder's
    vocabulary (`vocab`, as read for the run) where it has one: sampling checks the folder it
    decodes with against it."""
    return {**cfg, "vocab_digest": meta_mod.digest(vocab)} if vocab is not None else dict(cfg)


def _codec(cfg, vocab=None, padded=False):
    """(encode, decode) for sampling, from the data folder's meta.json or meta.pkl, as nanoGPT's
    sample.py decodes; with neither, GPT-2's encoding (tiktoken) for a model of GPT-2's vocabulary.
    `vocab` is the model's vocabulary size, checked against the meta file's."""
    folder = cfg.get("data_dir") or os.path.join("data", cfg["dataset"])
    m = meta_mod.read(folder)
    trained = cfg.get("vocab_digest")
    if isinstance(trained, str) and m is None and not os.path.isdir(folder):
        raise MicaError(f"the data folder {folder} does not exist, so there is no vocabulary to decode with; point "
                        "--data_dir at the data the run trained on")
    if isinstance(trained, str) and not meta_mod.trained_with(m, trained):
        what = f"the vocabulary in {m.path} is not" if m is not None else f"{folder} holds no vocabulary, not"
        raise MicaError(f"{what} the one this run trained with (the data was prepared again since, or --data_dir "
                        "names other data), so its tokens would decode as other text; point --data_dir at the data "
                        "the run trained on")
    if m is None:
        if vocab is not None and vocab < 50257:
            where = f"no vocabulary in {folder} (meta.json or meta.pkl)" if os.path.isdir(folder) else \
                f"the data folder {folder} does not exist (moved?), so there is no vocabulary"
            raise MicaError(f"{where} to decode this model's {vocab} tokens with; sampling needs the data folder it "
                            "was trained on: pass it as --data_dir")
        return _gpt2_codec(folder)
    if vocab is not None and (m.vocab_size > vocab or (m.stoi is not None and m.vocab_size != vocab and not padded)):
        raise MicaError(f"{m.path} has a vocabulary of {m.vocab_size} tokens but the checkpoint's model has {vocab}; "
                        "point data_dir at the data the model was trained on")
    if m.stoi is not None:
        stoi, itos = m.stoi, m.itos

        def encode(s):
            bad = sorted(set(c for c in s if c not in stoi))
            if bad:
                raise MicaError(f"the start text has characters the vocabulary lacks: {''.join(bad)!r}; start with "
                                "characters of the text the model was trained on")
            return [stoi[c] for c in s]

        return encode, _checked(lambda ids: "".join(itos[i] for i in ids), len(itos))
    if m.tokenizer_file:
        path = os.path.join(folder, m.tokenizer_file)
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise MicaError(f"{m.path} names a Hugging Face tokenizer: pip install tokenizers") from None
        try:
            t = Tokenizer.from_file(path)
        except Exception:
            raise MicaError(f"the tokenizer file {path} that {m.path} names is missing or unreadable; prepare the "
                            "data again") from None
        return (lambda s: t.encode(s).ids), _checked(lambda ids: t.decode(ids), m.vocab_size)
    if m.tokenizer == "gpt2":
        return _gpt2_codec(folder)
    raise MicaError(f"{m.path} names no tokenizer Mica can decode (no stoi/itos, no tokenizer_file)")


def _gpt2_codec(folder):
    """GPT-2's encoding as nanoGPT's sample.py uses it without a meta.pkl (tiktoken)."""
    try:
        import tiktoken

        enc = tiktoken.get_encoding("gpt2")
    except Exception as e:  # not installed, or the encoding cannot be fetched offline
        why = "tiktoken is not installed" if isinstance(e, ImportError) else "tiktoken cannot load it offline"
        raise MicaError(f"no meta.json or meta.pkl in {folder}, so this model's tokens are GPT-2's, but GPT-2's "
                        f"encoding is not available here ({why}); install tiktoken with its encoding cached, or "
                        "point data_dir at the data folder the model was trained on") from None
    return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})), _checked(enc.decode, enc.n_vocab)


def _checked(decode, n):
    """decode, refusing (with a sentence) ids of a padded model's rows that the vocabulary lacks."""
    def run(ids):
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise MicaError(f"the model sampled token {bad[0]}, beyond the {n} its vocabulary decodes (a padded "
                            "vocabulary's unused row); sample again with a lower temperature or top_k")
        return decode(ids)
    return run


def _stderr(message):
    import sys

    print(message, file=sys.stderr)


def sample(out_dir, start="\n", num_samples=10, max_new_tokens=500, temperature=0.8, top_k=200, seed=1337,
           threads=None, log=_stderr, data_dir="", device="cpu", simulate=False, dtype=None):
    """Generate from out_dir's checkpoint; the vocabulary comes from the data folder it was trained on,
    or from `data_dir`. `dtype` (sample.py's setting) is accepted; a note says when it is not the
    dtype sampling computes in."""
    with tempfile.TemporaryDirectory(prefix="mica-sample-") as scratch:  # (a converted ckpt.pt, read from here)
        path = nanogpt_checkpoint(out_dir, log, into=scratch)
        return _sample(out_dir, path, start, num_samples, max_new_tokens, temperature, top_k, seed, threads, log,
                       data_dir, device, simulate, dtype)


def _check_sample_length(n_start, max_new_tokens):
    """A sample's text (its token ids, 8 bytes each, and its characters) must fit in this machine's
    memory: a count past it is a sentence, not a failed allocation (or an overflowed one)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 1 << 40
    need = (n_start + max_new_tokens) * 16  # (the ids, and the text decoded from them)
    if need > memory:
        raise MicaError(f"max_new_tokens={max_new_tokens} asks for a sample of {n_start + max_new_tokens:,} tokens, "
                        f"about {need / 2 ** 30:,.0f} GiB to hold, more than this machine's {memory / 2 ** 30:.0f} "
                        "GiB of memory; ask for fewer")


def _sample(out_dir, path, start, num_samples, max_new_tokens, temperature, top_k, seed, threads, log, data_dir,
            device, simulate, dtype):
    st = ckpt.SafeTensors(path)
    st.check_metadata()  # (the config it reads: the model's shape, the data folder)
    saved = _saved_config(st)
    speedrun = saved.get("recipe") == "speedrun"
    cfg = {**config_mod.defaults_for(saved.get("recipe", "nanogpt") if speedrun else "nanogpt"), **saved}
    if data_dir:
        cfg["data_dir"] = data_dir
    else:  # the run's own data folder (the speedrun's: where its shards are, their meta.json)
        trained = (os.path.dirname(cfg["train_files"]) or ".") if speedrun else \
            (cfg["data_dir"] or os.path.join("data", cfg["dataset"]))
        cfg["data_dir"] = _as_trained(trained, out_dir, saved.get("out_dir"))
    embedding = "embed.weight" if speedrun else "transformer.wte.weight"
    if embedding not in st.tensors:
        raise MicaError(f"{path} holds no GPT weights ({embedding})")
    vocab = _embedding_rows(st, embedding, cfg["model_dim"] if speedrun else cfg["n_embd"])
    if start.startswith("FILE:"):
        if not start[5:]:
            raise MicaError("--start=FILE: names no file; give its path, e.g. --start=FILE:prompt.txt")
        start = read_text(start[5:], "--start prompt file")
    if not temperature > 0 or temperature == float("inf"):
        raise MicaError(f"temperature must be a positive, finite number (lower is more conservative), got "
                        f"{temperature}")
    if max_new_tokens < 0:
        raise MicaError(f"max_new_tokens must be 0 or more, got {max_new_tokens}")
    if num_samples < 1:
        raise MicaError(f"num_samples must be 1 or more, got {num_samples}")
    if top_k is not None and top_k < 1:
        raise MicaError(f"top_k must be a positive count of tokens to keep, or None for no cut; got {top_k}")
    config_mod.check_threads(threads or 0)
    config_mod.check_seed(seed)
    encode, decode = _codec(cfg, vocab, padded=speedrun)  # (the speedrun pads its vocabulary to 128s)
    ids = encode(start)
    if not ids:
        raise MicaError("the start text is empty; give at least one character")
    _check_sample_length(len(ids), max_new_tokens)
    # (sampling computes in float32, as nanoGPT's sample.py on a CPU; a speedrun keeps the dtype it was
    # trained in, as its embedding's slot is that dtype: an older checkpoint's config says float32)
    cfg.update(device=device, dtype=saved.get("dtype", "float32") if speedrun else "float32")
    if dtype is not None and dtype != cfg["dtype"]:
        why = ("the dtype the run trained in" if speedrun else
               "from the float32 weights" + (f" of a run trained in {saved['dtype']}"
                                             if saved.get("dtype", "float32") != "float32" else ""))
        log(f"note: sampling computes in {cfg['dtype']}, {why}; dtype={dtype} is accepted and changes nothing")
    model, _, progs = programs.build(cfg, vocab)
    exe, lowered = native.build_trainer(progs, cfg.get("opt_level", 2), log, device=device, simulate=simulate)
    _products_record(device, simulate)
    slots = native.state_slots(lowered, [n for n, _ in model.named_parameters()])
    settings = dict(mode="sample", vocab=vocab, block=cfg["seq_len" if speedrun else "block_size"],
                    seed=config_mod.seed_int64(seed),
                    threads=threads or os.cpu_count() or 1, num_samples=num_samples,
                    max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k or 0,
                    start_tokens=" ".join(map(str, ids)))
    meta = meta_mod.read(cfg["data_dir"]) if speedrun else None
    if meta is not None and meta.vocab_size < vocab:
        settings["decodable"] = meta.vocab_size
    loads = _loads(path, _expected(slots, lowered), settings, params_only=True)
    # the manifest goes to a private folder, so sampling writes nothing into out_dir (it may be read-only)
    with tempfile.TemporaryDirectory(prefix="mica-sample-") as tmp:
        manifest = os.path.join(tmp, "sample.manifest")
        native.write_manifest(manifest, settings, slots, lowered, loads)
        try:
            r = subprocess.run([exe, manifest], capture_output=True, text=True)
        except OSError as e:
            raise cannot_run(exe, e) from None
    if r.returncode != 0:
        raise MicaError(r.stderr.strip().removeprefix("mica: error: ") or "sampling failed")
    texts = []
    for line in r.stdout.splitlines():
        texts.append(decode([int(t) for t in line.split()]))
    return texts
