"""Fuzz tests for the parsers that read a user's files: seeded random mutations, each case either
parsed correctly or refused with one MicaError sentence, never another exception or a hang.

(Each parser's cases live in their own test functions: config files, --key=value overrides,
token files and shards here; more parsers may be added beside them.)"""
import os
import random
import re
import signal

import numpy as np
import pytest

from mica.data import tokens as tok
from mica.errors import MicaError
from mica.train import config

CASES = 400


class _Hang(BaseException):
    """Raised by the alarm; a BaseException so no `except Exception` in a parser can swallow it."""


@pytest.fixture()
def deadline():
    """deadline(seconds) arms an alarm for the case about to run; a hang fails the test, naming the case."""
    def on_alarm(signum, frame):
        raise _Hang()

    old = signal.signal(signal.SIGALRM, on_alarm)
    yield lambda seconds=5: signal.alarm(seconds)
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _outcome(fn, case, deadline):
    """('ok', value) or ('error', sentence); any other exception, or a hang, fails naming the case."""
    deadline()
    try:
        return "ok", fn()
    except MicaError as e:
        message = str(e)
        assert message and "\n" not in message, (case, message)  # one line for `mica: error: ...`
        return "error", message
    except _Hang:
        pytest.fail(f"case {case}: the parser hung")
    except Exception as e:  # noqa: BLE001 (the point of the test)
        pytest.fail(f"case {case}: {type(e).__name__}: {e}")
    finally:
        signal.alarm(0)


# ---- config files ---------------------------------------------------------------------------------

# nanoGPT's config/train_shakespeare_char.py, written out from the built-in config
SHAKESPEARE_CHAR = b"""# train a miniature character-level shakespeare model
# good for debugging and playing on macbooks and such

out_dir = 'out-shakespeare-char'
eval_interval = 250 # keep frequent because we'll overfit
eval_iters = 200
log_interval = 10 # don't print too too often

# we expect to overfit on this small dataset, so only save when val improves
always_save_checkpoint = False

wandb_log = False # override via command line if you like
wandb_project = 'shakespeare-char'
wandb_run_name = 'mini-gpt'

dataset = 'shakespeare_char'
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256 # context of up to 256 previous characters

# baby GPT model :)
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2

learning_rate = 1e-3 # with baby networks can afford to go a bit higher
max_iters = 5000
lr_decay_iters = 5000 # make equal to max_iters usually
min_lr = 1e-4 # learning_rate / 10 usually
beta2 = 0.99 # make a bit bigger because number of tokens per iter is small

warmup_iters = 100 # not super necessary potentially

# on macbook also add
# device = 'cpu'  # run on cpu only
# compile = False # do not torch compile the model
"""

# what a mutation may insert: Python fragments, quotes, brackets, undefined names, runtime errors,
# bytes that are not UTF-8, NUL, a call to exit
JUNK = [b"(", b")", b"[", b"'", b'"', b"'''", b"\\", b":", b"=", b"==", b"\t", b"    ", b"\n", b"#", b"\x00", b"\xff",
        b"\xe9", b"\xc3", b"foo", b"1/0", b"None", b"True", b"-", b"*", b"**2", b"e", b"1e999", b"[1, 2]", b"{}",
        b"n_layer = n_layer + 1\n", b"n_layr = 4\n", b"del n_layer\n", b"import math\n", b"exit()\n",
        b"raise ValueError('x')\n", b"dropout = 'high'\n", b"batch_size = 0\n", b"n_head = 5\n", b"lambda: 0",
        b"if True:\n", b"def f():\n", b"class C: pass\n", b"x = C()\n", "é".encode()]


def _mutate(rng, data):
    data = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.choice(["flip", "byte", "truncate", "insert", "delete", "duplicate"])
        at = rng.randrange(len(data) + 1)
        if op == "flip" and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif op == "byte" and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif op == "truncate":
            data = data[:at]
        elif op == "insert":
            data[at:at] = rng.choice(JUNK)
        elif op == "delete":
            del data[at:at + rng.randint(1, 20)]
        elif op == "duplicate":
            data[at:at] = data[max(0, at - 40):at]
    return bytes(data)


def test_fuzz_config_files_the_unmutated_file_is_the_builtin(tmp_path):
    path = tmp_path / "train_shakespeare_char.py"
    path.write_bytes(SHAKESPEARE_CHAR)
    assert config.load(str(path)) == config.load("shakespeare_char")


def test_fuzz_config_files(tmp_path, deadline):
    """Mutated copies of nanoGPT's train_shakespeare_char.py through config.load and check_supported."""
    rng = random.Random(20240901)
    known = {**config.DEFAULTS, **config.MICA_DEFAULTS}
    counts = {"ok": 0, "error": 0}
    for case in range(CASES):
        path = tmp_path / f"case{case}.py"
        path.write_bytes(_mutate(rng, SHAKESPEARE_CHAR))
        kind, value = _outcome(lambda: config.check_supported(config.load(str(path), ["--device=cpu"]),
                                                              log=lambda *a: None), case, deadline)
        counts[kind] += 1
        if kind == "ok":  # a config that loads holds exactly the known settings, each of its default's type
            assert set(value) == set(known), case
            assert all(type(value[k]) is type(known[k]) for k in known), case
    # the mutations reach both sides: some still load, many are refused
    assert counts["ok"] >= CASES // 10 and counts["error"] >= CASES // 10, counts


def test_fuzz_config_overrides(deadline):
    """Random --key=value text for keys of every type: a value of the key's type, or a sentence."""
    rng = random.Random(7)
    known = {**config.DEFAULTS, **config.MICA_DEFAULTS}
    keys = ["batch_size", "learning_rate", "bias", "out_dir", "n_layr", "dropout"]
    alphabet = "0123456789.-+eE_jx'\"()[]{}:,=\\ TrueFalseNone\t"
    counts = {"ok": 0, "error": 0}
    for case in range(CASES):
        raw = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.2:
            raw = rng.choice(["{[1]: 2}", "{{}}", "-" * 200 + "1", "(" * 150 + ")" * 150, "1" * 5000, "1e999", "None"])
        item = f"--{rng.choice(keys)}={raw}" if rng.random() < 0.95 else raw
        kind, value = _outcome(lambda: config.apply_overrides(known, [item]), case, deadline)
        counts[kind] += 1
        if kind == "ok":
            assert all(type(value[k]) is type(known[k]) for k in known), (case, item)
    assert counts["ok"] and counts["error"], counts


def test_fuzz_command_lines(tmp_path, deadline):
    """Random command lines of config files (good, broken, missing), built-in names, --key=value
    items and stray words, in any order, as nanoGPT's configurator takes them: the settings, each
    of its default's type, or a sentence."""
    rng = random.Random(11)
    (tmp_path / "good.py").write_bytes(SHAKESPEARE_CHAR)
    (tmp_path / "reads.py").write_text("max_iters = max_iters * 2\nhelper = batch_size + 1\n")
    (tmp_path / "speed.py").write_text("recipe = 'speedrun'\ntrain_steps = 5\n")
    (tmp_path / "broken.py").write_text("n_layer = (\n")
    words = [str(tmp_path / n) for n in ("good.py", "reads.py", "speed.py", "broken.py", "missing.py")]
    words += ["shakespeare_char", "speedrun_tiny", "--n_layer=2", "--batch_size=3", "--recipe=speedrun",
              "--train_steps=4", "--dtype=float16", "--eval_only", "n_layer=2", "-x", "--=1", "--", ""]
    known = {"nanogpt": {**config.DEFAULTS, **config.MICA_DEFAULTS}, "speedrun": config.defaults_for("speedrun")}
    counts = {"ok": 0, "error": 0}
    for case in range(CASES):
        items = [rng.choice(words) for _ in range(rng.randint(0, 5))]
        kind, value = _outcome(lambda: config.load(None, items, log=lambda *a: None), case, deadline)
        counts[kind] += 1
        if kind == "ok":
            want = known[value["recipe"]]
            assert set(value) == set(want), (case, items)
            assert all(type(value[k]) is type(want[k]) for k in want if want[k] is not None), (case, items)
    assert counts["ok"] >= CASES // 10 and counts["error"] >= CASES // 10, counts


def test_fuzz_batch_order_files(tmp_path, deadline):
    """Random batch-order text (numbers, signs, words, blank lines, bytes that are not UTF-8) through
    the check mica train makes before the trainer starts: accepted only when every word is a whole
    number within the rows and there are enough of them, else a sentence."""
    from mica.train import run

    rng = random.Random(5)
    path = tmp_path / "order.txt"
    counts = {"ok": 0, "error": 0}
    pieces = ["0", "7", "99", "100", "-1", "+3", "1e3", "0x10", "abc", "\n", " ", "\t", "\r\n", "3.5", "٣"]
    for case in range(CASES):
        pool = pieces if rng.random() < 0.5 else ["0", "7", "99", "+3", "42", "\n"]  # (half: numbers only)
        words = [rng.choice(pool) for _ in range(rng.randint(0, 12))]
        raw = " ".join(words).encode()
        if rng.random() < 0.05:
            raw += b"\xff"
        path.write_bytes(raw)
        kind, _ = _outcome(lambda: run._check_batch_order(str(path), 100, needed=4, rows=2), case, deadline)
        counts[kind] += 1
        if kind == "ok":
            numbers = raw.decode().split()
            assert len(numbers) >= 4 and all(re.fullmatch(r"\+?[0-9]+", w) and int(w) < 100 for w in numbers), \
                (case, raw)
    assert counts["ok"] and counts["error"], counts


# ---- token files and shards -----------------------------------------------------------------------

VOCAB = 65


def _valid_tokens():
    return np.random.default_rng(3).integers(0, VOCAB, 3000).astype(np.uint16)


def _mutate_tokens(rng, data, header):
    """Byte flips in the header (its first `header` bytes, or the first 16 of a .bin) and the data,
    header fields set to odd values, truncations, appended bytes."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 2)):
        op = rng.choice(["flip_header", "flip_data", "field", "truncate", "append"])
        if op == "flip_header":
            data[rng.randrange(min(len(data), header or 16))] ^= 1 << rng.randrange(8)
        elif op == "flip_data" and len(data) > header:
            data[rng.randrange(header, len(data))] = rng.randrange(256)
        elif op == "field" and len(data) >= 12:
            field = rng.randrange(3)
            value = rng.choice([0, 1, -1, 2, 3, 7, tok.SHARD_MAGIC, (len(data) - header) // 2,
                                (len(data) - header) // 2 + 1, 2**31 - 1, -2**31, rng.randrange(-2**31, 2**31)])
            data[4 * field:4 * field + 4] = np.int32(value).tobytes()
        elif op == "truncate":
            data = data[:rng.randrange(len(data) + 1)]
        elif op == "append":
            data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
    return bytes(data)


def _fuzz_token_file(tmp_path, deadline, write, header, seed):
    good = tmp_path / "good.bin"
    write(str(good), _valid_tokens())
    raw = good.read_bytes()
    assert np.array_equal(tok.open_tokens(str(good), VOCAB, 17), _valid_tokens())
    rng = random.Random(seed)
    counts = {"ok": 0, "error": 0}
    for case in range(CASES):
        path = tmp_path / f"case{case}.bin"  # a new file each time: a returned memmap stays valid
        path.write_bytes(_mutate_tokens(rng, raw, header))
        kind, tokens = _outcome(lambda: tok.open_tokens(str(path), VOCAB, 17, "training data"), case, deadline)
        counts[kind] += 1
        if kind == "ok":  # what open_tokens returns keeps its promises
            assert len(tokens) >= 17 and int(tokens.max()) < VOCAB, case
            assert len(tokens) * 2 + (tok.HEADER_INTS * 4 if tok.token_layout(str(path))[0] == "shard" else 0) \
                == os.path.getsize(path), case
            del tokens
    assert counts["ok"] and counts["error"] >= CASES // 4, counts


def test_fuzz_token_bin_files(tmp_path, deadline):
    _fuzz_token_file(tmp_path, deadline, tok.write_bin, 0, 11)


def test_fuzz_token_shards(tmp_path, deadline):
    _fuzz_token_file(tmp_path, deadline, tok.write_shard, tok.HEADER_INTS * 4, 12)
