"""Token files. Two layouts, both uint16 tokens:

- nanoGPT's `.bin`: the raw tokens, nothing else;
- the speedrun's shard: a header of 256 int32 (magic 20240520, version 1, token count, zeros)
  followed by the tokens.

`open_tokens` reads either (memory-mapped) and checks it; every problem is one sentence.
"""
import os

import numpy as np

from ..errors import MicaError
from ..files import atomic_write, missing

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256


def write_bin(path, tokens):
    atomic_write(path, np.asarray(tokens, dtype=np.uint16).tobytes())


def write_shard(path, tokens):
    tokens = np.asarray(tokens, dtype=np.uint16)
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = (SHARD_MAGIC, SHARD_VERSION, len(tokens))
    atomic_write(path, header.tobytes() + tokens.tobytes())


def token_layout(path):
    """('shard', header bytes) or ('bin', 0): a file that starts with the shard magic is a shard."""
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) >= 4 and int(np.frombuffer(head[:4], np.int32)[0]) == SHARD_MAGIC:
        return "shard", HEADER_INTS * 4
    return "bin", 0


def _prepare_hint(path):
    """The `mica prepare` command that makes the folder of the token file `path`."""
    from .prepare import hint  # (prepare imports this module)

    return hint(os.path.dirname(path) or ".")


def open_tokens(path, vocab_size=None, min_tokens=0, what="token file"):
    """The tokens of a .bin or shard file as a read-only uint16 memory map, checked: the file
    exists and is whole, a shard's header agrees with its size, every token is below vocab_size,
    and there are at least min_tokens of them."""
    if not os.path.exists(path):
        raise MicaError(f"{what} {path} {missing(path)}; prepare the data first: {_prepare_hint(path)}")
    if not os.path.isfile(path):
        raise MicaError(f"{what} {path} is {'a folder' if os.path.isdir(path) else 'not a regular file'}, not a "
                        "file of tokens; prepare the data again (mica prepare ...)")
    try:
        return _open_tokens(path, vocab_size, min_tokens, what)
    except OSError as e:
        raise MicaError(f"cannot read {what} {path} ({e.strerror})") from None


def _open_tokens(path, vocab_size, min_tokens, what):
    size = os.path.getsize(path)
    if size == 0:
        raise MicaError(f"{what} {path} is empty; prepare the data again: {_prepare_hint(path)}")
    layout, offset = token_layout(path)
    if layout == "shard":
        if size < offset:
            raise MicaError(f"{what} {path} is a truncated shard: {size} bytes, shorter than its 1024-byte header")
        header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
        if int(header[1]) != SHARD_VERSION:
            raise MicaError(f"{what} {path} is a shard of version {int(header[1])}; only version {SHARD_VERSION} "
                            "is known")
        count = int(header[2])
        if size - offset != 2 * count:
            odd = " and a stray byte" if (size - offset) % 2 else ""
            raise MicaError(f"{what} {path} claims {count:,} tokens in its header but holds "
                            f"{(size - offset) // 2:,}{odd}: the file is truncated or corrupt")
    elif size >= HEADER_INTS * 4:
        header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
        if int(header[1]) == SHARD_VERSION and 2 * int(header[2]) == size - HEADER_INTS * 4 and not header[3:].any():
            raise MicaError(f"{what} {path} looks like a shard (version 1, token count {int(header[2]):,}) but "
                            f"its magic number is {int(header[0])}, not {SHARD_MAGIC}: the header is corrupt")
    if layout == "bin" and size % 2:
        raise MicaError(f"{what} {path} has an odd number of bytes ({size:,}), so it is not a file of uint16 "
                        "tokens; was it written completely?")
    tokens = np.memmap(path, dtype=np.uint16, mode="r", offset=offset)
    if len(tokens) < min_tokens:
        raise MicaError(f"{what} {path} holds {len(tokens):,} tokens, fewer than the {min_tokens:,} one batch row "
                        "needs (block_size + 1); use a smaller block_size or more data")
    if vocab_size is not None and len(tokens):
        top = int(tokens.max())
        if top >= vocab_size:
            where = int(np.argmax(tokens >= vocab_size))
            raise MicaError(f"{what} {path} holds token id {int(tokens[where])} at position {where:,} (and ids up to "
                            f"{top}), but the vocabulary has only {vocab_size} entries; was it prepared with "
                            "another tokenizer?")
    return tokens


def seed_batches(lengths, batch_size, count, what="training data", paths=None, fixes="fewer steps",
                 smaller="use a smaller batch"):
    """Where the speedrun seed's distributed_data_generator (world size 1) takes its first `count`
    batches of batch_size + 1 tokens from shards of these lengths, in order: [(shard index, start)].
    It moves to the next shard when pos + batch_size + 1 >= len(tokens), dropping the rest; where
    the seed would fail (no next shard, or one too short for a batch) this is a sentence (`fixes`:
    the settings that would make the batches fit, as the sentence offers them; `smaller`: the setting
    that makes a batch fit a short shard)."""
    names = paths or [f"shard {i}" for i in range(len(lengths))]
    if not lengths:
        raise MicaError(f"the {what} has no shards")
    out, file, pos = [], 0, 0
    for _ in range(count):
        if pos + batch_size + 1 >= lengths[file]:
            if file + 1 >= len(lengths):
                raise MicaError(f"the {what} runs out after {len(out):,} batches of {batch_size:,} tokens, but "
                                f"{count:,} are needed; give more shards or {fixes}")
            file, pos = file + 1, 0
            if lengths[file] < batch_size + 1:
                raise MicaError(f"the {what} shard {names[file]} holds {lengths[file]:,} tokens, fewer than one batch "
                                f"of {batch_size:,} + 1 (the seed's loader fails there too); prepare larger shards or "
                                f"{smaller}")
        out.append((file, pos))
        pos += batch_size
    return out
