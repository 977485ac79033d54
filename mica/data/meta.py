"""A data folder's vocabulary: `meta.json` as `mica prepare` writes it, or `meta.pkl` as nanoGPT's
`data/*/prepare.py` writes it ({'vocab_size': int, 'itos': {int: str}, 'stoi': {str: int}}).

A pickle can run code when it is loaded, so `meta.pkl` is read by a restricted unpickler: it
builds only dicts, lists, tuples, strings, numbers, booleans and None, and refuses every global
(a class or function named in the file) before anything is looked up. Every problem with either
file is one sentence (MicaError), never a traceback.
"""
import dataclasses
import io
import json
import os
import pickle
from dataclasses import dataclass

from ..errors import MicaError

MAX_BYTES = 64 << 20  # a vocabulary of 65,536 characters is about a megabyte
MAX_VOCAB = 1 << 31


@dataclass
class Vocab:
    """What a meta file says: vocab_size; for a character tokenizer itos (a list, id -> string)
    and stoi (string -> id), inverse to each other; otherwise maybe a tokenizer name or file."""
    path: str
    vocab_size: int
    itos: list = None
    stoi: dict = None
    tokenizer: str = None
    tokenizer_file: str = None


def find(folder):
    """The meta file of a data folder: meta.json (Mica's) before meta.pkl (nanoGPT's), or None."""
    for name in ("meta.json", "meta.pkl"):
        path = os.path.join(folder, name)
        if os.path.lexists(path):
            return path
    return None


def read(folder):
    """The folder's Vocab, or None when it has neither meta.json nor meta.pkl. Where both lie there
    they must agree: nanoGPT's prepare.py rewrites meta.pkl (and the token files) but not the
    meta.json an earlier `mica prepare` left, whose stale table would decode the new tokens wrongly."""
    path = find(folder)
    if not path:
        return None
    vocab = load(path)
    pkl = os.path.join(folder, "meta.pkl")
    if path.endswith("meta.json") and os.path.isfile(pkl):
        try:
            theirs = load(pkl)
        except MicaError:
            return vocab  # (an unreadable meta.pkl beside a good meta.json: Mica reads the json, as before)
        if (theirs.vocab_size, theirs.itos) != (vocab.vocab_size, vocab.itos) and \
                (theirs.itos is not None or theirs.vocab_size != vocab.vocab_size):
            newer = "meta.pkl" if os.path.getmtime(pkl) > os.path.getmtime(path) else "meta.json"
            stale = "meta.json" if newer == "meta.pkl" else "meta.pkl"
            other = ", other characters" if vocab.vocab_size == theirs.vocab_size else ""
            raise MicaError(f"data folder {folder} holds a meta.json and a meta.pkl that disagree (vocab_size "
                            f"{vocab.vocab_size} against {theirs.vocab_size}{other}); "
                            f"{newer} is the newer, so the data was probably prepared again: delete {stale} "
                            "if it is stale, or prepare the data again")
    return vocab


def digest(v, legacy=False):
    """16 hex digits that change when the vocabulary's encoding does (its size, table, tokenizer and
    tokenizer file), kept in a run's config so sampling can tell whether a data folder still holds
    the vocabulary the run trained with. A character table is "char" whether its file names the
    tokenizer (meta.json) or not (nanoGPT's meta.pkl); `legacy`: as digests were made before that."""
    import hashlib

    tokenizer = v.tokenizer if legacy or v.tokenizer is not None or v.itos is None else "char"
    h = hashlib.sha256(json.dumps([v.vocab_size, v.itos, tokenizer], ensure_ascii=False).encode("utf-8"))
    if v.tokenizer_file:
        try:
            with open(os.path.join(os.path.dirname(v.path), v.tokenizer_file), "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(b"(missing)")
    return h.hexdigest()[:16]


def trained_with(v, saved):
    """Whether `saved`, a run's vocab_digest, is this vocabulary's (made now, or before char tables
    from meta.pkl and meta.json were one digest)."""
    if v is None:
        return False
    made = {digest(v), digest(v, legacy=True)}
    if v.tokenizer == "char":  # (a run trained on the same table from nanoGPT's meta.pkl, before)
        made.add(digest(dataclasses.replace(v, tokenizer=None), legacy=True))
    return saved in made


def load(path):
    """The Vocab in one meta.json or meta.pkl file (the kind from its name; .pkl is a pickle)."""
    data = _read_bytes(path)
    obj = _unpickle(path, data) if path.endswith(".pkl") else _parse_json(path, data)
    return _check(path, obj)


# ---- reading ---------------------------------------------------------------------------------

def _read_bytes(path):
    import stat

    if os.path.isdir(path):
        raise MicaError(f"vocabulary file {path} is a directory; remove it or put the meta file there")
    if os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):  # (a pipe would wait for a writer)
        raise MicaError(f"vocabulary file {path} is not a regular file (a pipe, a device or a socket); put the meta "
                        "file mica prepare or nanoGPT's prepare.py wrote there")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise MicaError(f"cannot read vocabulary file {path}: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise MicaError(f"vocabulary file {path} is larger than {MAX_BYTES >> 20} MiB, so it is not a meta file")
    return data


def _parse_json(path, data):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise MicaError(f"vocabulary file {path} is not UTF-8 text, so it is not the JSON mica prepare writes; "
                        "prepare the data again") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError; so are too-long integers
        raise MicaError(f"vocabulary file {path} is not valid JSON (truncated or corrupt?); prepare the data "
                        "again") from None


class _Refused(Exception):
    def __init__(self, what):
        self.what = what


class _PlainUnpickler(pickle._Unpickler):
    """The pure-Python unpickler (its memo is a dict, so no index in a corrupt file can make it
    allocate), with every opcode that could reach code refused: globals (find_class raises before
    any lookup), extensions, persistent ids and the opcodes that call or build objects."""

    def find_class(self, module, name):
        what = f"{module}.{name}"
        raise _Refused(what if what.isprintable() and len(what) <= 80 else ascii(what[:80]))

    def persistent_load(self, pid):
        raise _Refused("a persistent id")

    def _refuse(self):
        raise _Refused("an object-building instruction")

    dispatch = dict(pickle._Unpickler.dispatch)
    for _op in (pickle.EXT1, pickle.EXT2, pickle.EXT4, pickle.REDUCE, pickle.BUILD, pickle.INST, pickle.OBJ,
                pickle.NEWOBJ, pickle.NEWOBJ_EX, pickle.PERSID, pickle.BINPERSID):
        dispatch[_op[0]] = _refuse
    del _op


def _unpickle(path, data):
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except _Refused as e:
        numpy = " (numpy numbers: save int(n), not np.int64(n))" if e.what.startswith("numpy") else ""
        raise MicaError(f"{path} asks to load {e.what}, which a vocabulary file never needs, so it was refused "
                        f"unread (a meta.pkl may hold only dicts, lists, strings and Python numbers{numpy})") from None
    except Exception:  # a corrupt pickle can fail in many ways (EOF, bad opcode, wrong stack types...)
        raise MicaError(f"{path} is not a readable pickle (truncated or corrupt?); prepare the data again") from None


# ---- checking --------------------------------------------------------------------------------

_PLAIN = (dict, list, tuple, str, int, float, bool, type(None))


def _only_plain(path, obj):
    """Every object reachable from obj is a plain type (iteratively, so a deep or self-referential
    structure cannot exhaust the stack)."""
    seen, todo = set(), [obj]
    while todo:
        o = todo.pop()
        if type(o) not in _PLAIN:
            raise MicaError(f"{path} holds a {type(o).__name__}, but a vocabulary file holds only dicts, lists, "
                            "strings and numbers")
        if isinstance(o, (dict, list, tuple)):
            if id(o) in seen:
                continue
            seen.add(id(o))
            todo.extend(o.keys() if isinstance(o, dict) else ())
            todo.extend(o.values() if isinstance(o, dict) else o)


def _short(v):
    """repr(v), cut to fit in a sentence."""
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _is_int(v):
    return type(v) is int


def _check(path, obj):
    bad = f"vocabulary file {path}"
    _only_plain(path, obj)
    if not isinstance(obj, dict):
        raise MicaError(f"{bad} holds a {type(obj).__name__}, not a dict with vocab_size; prepare the data again")
    if "vocab_size" not in obj:
        raise MicaError(f"{bad} has no vocab_size; prepare the data again")
    n = obj["vocab_size"]
    if _is_int(n) and n > MAX_VOCAB:
        raise MicaError(f"{bad} has vocab_size {n:,}, more than the {MAX_VOCAB:,} tokens Mica's models take; "
                        "prepare the data again")
    if not _is_int(n) or not 0 < n:
        raise MicaError(f"{bad} has vocab_size {_short(n)}, not a positive whole number; prepare the data again")
    vocab = Vocab(path=path, vocab_size=n)
    for key in ("tokenizer", "tokenizer_file"):
        if obj.get(key) is not None:
            if not isinstance(obj[key], str):
                raise MicaError(f"{bad} has {key} {_short(obj[key])}, not a string; prepare the data again")
            setattr(vocab, key, obj[key])
    if "itos" in obj or "stoi" in obj:
        vocab.itos, vocab.stoi = _char_tables(bad, obj.get("itos"), obj.get("stoi"), n)
    return vocab


def _char_tables(bad, itos, stoi, n):
    """itos as a list and stoi as a dict, checked to be inverse to each other and n long."""
    if itos is None or stoi is None:
        raise MicaError(f"{bad} has {'stoi' if itos is None else 'itos'} without "
                        f"{'itos' if itos is None else 'stoi'}; a character vocabulary needs both")
    if isinstance(itos, dict):  # nanoGPT's {int: str}; JSON turns the keys into strings
        table = {}
        for k, v in itos.items():
            if isinstance(k, str) and k.isascii() and k.isdigit() and k == str(int(k)):
                k = int(k)
            if not _is_int(k):
                raise MicaError(f"{bad} has an itos key {_short(k)} that is not a token id")
            table[k] = v
        if sorted(table) != list(range(len(table))):
            raise MicaError(f"{bad} has itos ids that are not 0..{len(table) - 1}; prepare the data again")
        itos = [table[i] for i in range(len(table))]
    elif isinstance(itos, (list, tuple)):
        itos = list(itos)
    else:
        raise MicaError(f"{bad} has itos of type {type(itos).__name__}, not a list or dict")
    if not isinstance(stoi, dict):
        raise MicaError(f"{bad} has stoi of type {type(stoi).__name__}, not a dict")
    if not all(isinstance(s, str) for s in itos):
        raise MicaError(f"{bad} has an itos entry that is not a string")
    # (fewer entries than vocab_size: a padded vocabulary, whose model has rows no character names; nanoGPT
    # trains it, and sampling refuses an id beyond the entries)
    if len(itos) != len(stoi) or len(itos) > n or not itos:
        raise MicaError(f"{bad} says vocab_size {n} but has {len(itos)} itos and {len(stoi)} stoi entries; "
                        "prepare the data again")
    for i, s in enumerate(itos):
        if stoi.get(s) != i or not _is_int(stoi.get(s)):
            raise MicaError(f"{bad} has stoi and itos that disagree (itos[{i}] is {_short(s)}, stoi of it is "
                            f"{_short(stoi.get(s))}); prepare the data again")
    return itos, dict(stoi)
