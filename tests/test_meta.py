"""A data folder's vocabulary: Mica's meta.json and nanoGPT's meta.pkl, read safely; any damaged
file is one sentence, never a traceback, a hang, or code run."""
import json
import os
import pickle
import random
import subprocess
import sys

import pytest

from mica.data import meta
from mica.data.prepare import _write_meta, prepare_char, prepare_text
from mica.errors import MicaError
from mica.train import run

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\nAll: Speak, speak.\n" * 20


def nanogpt_meta(text):
    """The dict nanoGPT's data/shakespeare_char/prepare.py pickles."""
    chars = sorted(list(set(text)))
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = {i: ch for i, ch in enumerate(chars)}
    return {"vocab_size": len(chars), "itos": itos, "stoi": stoi}


def test_prepare_writes_a_meta_pkl_nanogpts_sample_reads(tmp_path):
    prepare_char(TEXT, str(tmp_path), log=lambda *a: None)
    with open(tmp_path / "meta.pkl", "rb") as f:  # as nanoGPT's sample.py reads it
        m = pickle.load(f)
    assert m == nanogpt_meta(TEXT)
    stoi, itos = m["stoi"], m["itos"]
    assert "".join(itos[i] for i in [stoi[c] for c in "hear me"]) == "hear me"
    assert json.load(open(tmp_path / "meta.json", encoding="utf-8"))["itos"] == [itos[i] for i in range(len(itos))]
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def test_prepare_text_writes_meta_pkl_only_for_characters(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text(TEXT)
    out = tmp_path / "out"
    prepare_text([str(src)], "char", str(out), log=lambda *a: None)
    assert pickle.load(open(out / "meta.pkl", "rb")) == nanogpt_meta(TEXT)
    # what prepare_text writes for bpe (tokenizers) and gpt2 (tiktoken), which need packages:
    _write_meta(str(out), {"tokenizer": "bpe:300", "vocab_size": 300, "tokenizer_file": "tokenizer.json"})
    assert not (out / "meta.pkl").exists()  # the stale character one is gone
    assert meta.read(str(out)).tokenizer_file == "tokenizer.json"


def test_a_failed_bpe_preparation_writes_nothing(tmp_path):
    """BPE's tokenizer.json is written with the tokens, once they pass: a preparation refused for too
    few tokens leaves an earlier good folder byte for byte as it was (its runs still sample), and
    creates no folder where there was none. A character preparation after a BPE one removes the
    tokenizer.json its meta no longer names."""
    pytest.importorskip("tokenizers")
    src, ten = tmp_path / "in.txt", tmp_path / "ten.txt"
    src.write_text(TEXT * 5)
    ten.write_text("abcdefghij")
    out = tmp_path / "bpe"
    prepare_text([str(src)], "bpe:300", str(out), log=lambda *a: None)
    m = meta.read(str(out))
    assert m.tokenizer_file == "tokenizer.json" and 256 < m.vocab_size <= 300
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    assert set(before) == {"tokenizer.json", "meta.json", "train.bin", "val.bin"}
    for folder in (out, tmp_path / "new"):
        with pytest.raises(MicaError, match="too few to split into training and validation data"):
            prepare_text([str(ten)], "bpe:300", str(folder), log=lambda *a: None)
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
    assert not (tmp_path / "new").exists()
    prepare_text([str(src)], "char", str(out), log=lambda *a: None)
    assert sorted(os.listdir(out)) == ["meta.json", "meta.pkl", "train.bin", "val.bin"]


def test_a_meta_json_older_than_nanogpts_meta_pkl_is_named(tmp_path):
    """mica prepare wrote meta.json and meta.pkl; then nanoGPT's prepare.py ran again over other text,
    rewriting meta.pkl and the tokens only. Reading the stale json would decode the new ids wrongly."""
    prepare_char(TEXT, str(tmp_path), log=lambda *a: None)
    assert meta.read(str(tmp_path)).itos == sorted(set(TEXT))  # (the two agree)
    lower = TEXT.lower()
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump(nanogpt_meta(lower), f)
    os.utime(tmp_path / "meta.json", (1e9, 1e9))
    n, m = len(set(TEXT)), len(set(lower))
    with pytest.raises(MicaError, match=rf"holds a meta.json and a meta.pkl that disagree \(vocab_size {n} against "
                                        rf"{m}\); meta.pkl is the newer, so the data was probably prepared again: "
                                        "delete meta.json if it is stale"):
        meta.read(str(tmp_path))
    same_size = TEXT.replace("F", "Z")  # (as many characters, other ones)
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump(nanogpt_meta(same_size), f)
    with pytest.raises(MicaError, match="other characters"):
        meta.read(str(tmp_path))
    os.remove(tmp_path / "meta.json")
    assert meta.read(str(tmp_path)).itos == sorted(set(same_size))
    # a GPT-2 folder's meta.pkl (nanoGPT's openwebtext has none; a user's may hold only the size)
    _write_meta(str(tmp_path), {"tokenizer": "gpt2", "vocab_size": 50257})
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 50257}, f)
    assert meta.read(str(tmp_path)).tokenizer == "gpt2"


def test_vocab_from_nanogpts_own_folder(tmp_path):
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump(nanogpt_meta(TEXT), f)
    vocab, path = run.vocab_size(str(tmp_path), log=lambda *a: None)
    assert vocab == len(set(TEXT)) and path.endswith("meta.pkl")
    encode, decode = run._codec({"data_dir": str(tmp_path)}, vocab)
    assert decode(encode("Speak, speak.")) == "Speak, speak."
    with pytest.raises(MicaError, match="has a vocabulary of"):
        run._codec({"data_dir": str(tmp_path)}, vocab + 1)


def test_no_meta_file_and_a_small_vocab_is_a_sentence(tmp_path):
    with pytest.raises(MicaError, match="no vocabulary in"):
        run._codec({"data_dir": str(tmp_path)}, 65)


class Hostile:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_hostile_pickle_is_refused_and_nothing_runs(tmp_path, protocol):
    marker = tmp_path / "ran"
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 3, "x": Hostile(marker)}, f, protocol=protocol)
    with pytest.raises(MicaError) as e:
        meta.read(str(tmp_path))
    assert "system, which a vocabulary file never needs, so it was refused" in str(e.value)
    assert not marker.exists()
    # and through the CLI: one sentence, exit 2
    r = subprocess.run([sys.executable, "-m", "mica.cli", "train", "--device=cpu", f"--data_dir={tmp_path}"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "was refused" in r.stderr
    assert r.stderr.count("\n") == 1 and not marker.exists()


def _write(path, obj):
    if path.endswith(".pkl"):
        data = pickle.dumps(obj)
    else:
        data = json.dumps(obj).encode()
    with open(path, "wb") as f:
        f.write(data)
    return path


@pytest.mark.parametrize("obj, needle", [
    ([1, 2], "holds a list, not a dict"),
    ({"itos": ["a"]}, "has no vocab_size"),
    ({"vocab_size": 0}, "not a positive whole number"),
    ({"vocab_size": "65"}, "not a positive whole number"),
    ({"vocab_size": True}, "not a positive whole number"),
    ({"vocab_size": 2, "itos": ["a", "b"]}, "has itos without stoi"),
    ({"vocab_size": 2, "itos": ["a", "b"], "stoi": {"a": 0, "b": 0}}, "disagree"),
    ({"vocab_size": 1, "itos": ["a", "b"], "stoi": {"a": 0, "b": 1}}, "says vocab_size 1 but has 2 itos"),
    ({"vocab_size": 3, "itos": ["a", "b"], "stoi": {"a": 0, "b": 1, "c": 2}}, "says vocab_size 3 but has 2 itos"),
    ({"vocab_size": 2, "itos": "ab", "stoi": {"a": 0, "b": 1}}, "not a list or dict"),
    ({"vocab_size": 2, "itos": [1, 2], "stoi": {1: 0, 2: 1}}, "not a string"),
    ({"vocab_size": 2, "itos": {"0": "a", "2": "b"}, "stoi": {"a": 0, "b": 1}}, "not 0..1"),
    ({"vocab_size": 2, "tokenizer": 5}, "not a string"),
])
@pytest.mark.parametrize("kind", ["meta.json", "meta.pkl"])
def test_malformed_meta_files_are_sentences(tmp_path, obj, needle, kind):
    if kind == "meta.json" and obj == {"vocab_size": 2, "itos": [1, 2], "stoi": {1: 0, 2: 1}}:
        obj = {"vocab_size": 2, "itos": [1, 2], "stoi": {"1": 0, "2": 1}}
    _write(str(tmp_path / kind), obj)
    with pytest.raises(MicaError, match=needle):
        meta.read(str(tmp_path))


@pytest.mark.parametrize("kind", ["meta.json", "meta.pkl"])
def test_a_padded_character_vocabulary_is_read_as_nanogpt_reads_it(tmp_path, kind):
    """vocab_size above the characters' count (rows no character names, as in a vocabulary padded to 128):
    nanoGPT trains it; the model takes vocab_size rows and sampling decodes the characters."""
    _write(str(tmp_path / kind), {"vocab_size": 128, "itos": ["a", "b"], "stoi": {"a": 0, "b": 1}})
    m = meta.read(str(tmp_path))
    assert m.vocab_size == 128 and m.itos == ["a", "b"]


def test_other_broken_files_are_sentences(tmp_path):
    (tmp_path / "meta.json").mkdir()
    with pytest.raises(MicaError, match="is a directory"):
        meta.read(str(tmp_path))
    os.rmdir(tmp_path / "meta.json")
    (tmp_path / "meta.json").write_bytes(b'{"vocab_size": 65, "x": "\xff"}')
    with pytest.raises(MicaError, match="not UTF-8"):
        meta.read(str(tmp_path))
    (tmp_path / "meta.json").write_bytes(b"[" * 100000)
    with pytest.raises(MicaError, match="not valid JSON"):
        meta.read(str(tmp_path))
    os.unlink(tmp_path / "meta.json")
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps(nanogpt_meta(TEXT))[:-5])
    with pytest.raises(MicaError, match="not a readable pickle"):
        meta.read(str(tmp_path))
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 2, "b": b"bytes"}))
    with pytest.raises(MicaError, match="holds a bytes"):
        meta.read(str(tmp_path))
    loop = []
    loop.append(loop)
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 2, "loop": loop}))
    assert meta.read(str(tmp_path)).vocab_size == 2  # self-reference is plain data, checked without recursing


def _mutations(data, rng, n):
    """Seeded byte flips, truncations, insertions and deletions of one file."""
    for _ in range(n):
        b = bytearray(data)
        kind = rng.randrange(4)
        if kind == 0:
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind == 1:
            del b[rng.randrange(len(b)):]
        elif kind == 2:
            at = rng.randrange(len(b) + 1)
            b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            at = rng.randrange(len(b))
            del b[at:at + rng.randint(1, 8)]
        yield bytes(b)


@pytest.mark.parametrize("kind", ["meta.pkl", "meta.json"])
def test_fuzz_mutated_meta_files_read_correctly_or_are_sentences(tmp_path, kind):
    good = nanogpt_meta(TEXT)
    if kind == "meta.pkl":
        files = [pickle.dumps(good, protocol=p) for p in (0, 2, 4)]
    else:
        files = [json.dumps({**good, "itos": [good["itos"][i] for i in range(good["vocab_size"])],
                             "tokenizer": "char"}, ensure_ascii=False, indent=1).encode()]
    rng = random.Random(9)
    path = tmp_path / kind
    read = refused = 0
    for data in files:
        for mutated in _mutations(data, rng, 300 // len(files)):
            path.write_bytes(mutated)
            try:
                v = meta.load(str(path))
            except MicaError as e:
                assert str(e) and str(e).isprintable()
                refused += 1
                continue
            read += 1  # what is read is a consistent vocabulary
            assert type(v.vocab_size) is int and v.vocab_size > 0
            if v.itos is not None:
                assert len(v.itos) == len(v.stoi) == v.vocab_size
                assert all(v.stoi[s] == i for i, s in enumerate(v.itos))
    assert refused > 100 and read + refused == 300


def test_no_meta_file_and_gpt2s_vocab_decodes_with_tiktoken_or_says_why(tmp_path):
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        with pytest.raises(MicaError, match="GPT-2's encoding is not available here"):
            run._codec({"data_dir": str(tmp_path)}, 50304)
        return
    encode, decode = run._codec({"data_dir": str(tmp_path)}, 50304)
    assert decode(encode("Hello world")) == "Hello world" and encode("Hello") == [15496]


def test_sampling_refuses_a_data_folder_prepared_again_since_training(tmp_path):
    """A run keeps a digest of the vocabulary it trained with; a data folder prepared again over
    other text (the same size of vocabulary or not) would decode its tokens as other characters."""
    import shutil

    from helpers import mica_cli

    (tmp_path / "in.txt").write_text(TEXT)
    mica_cli("prepare", "shakespeare-char", "--input", "in.txt", cwd=tmp_path, check=True)
    shutil.copytree(tmp_path / "data" / "shakespeare_char", tmp_path / "kept")
    tiny = ["--device=cpu", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=2",
            "--eval_iters=1", "--max_iters=2", "--eval_interval=2", "--out_dir=run"]
    mica_cli("train", "shakespeare_char", *tiny, cwd=tmp_path, check=True)
    sample = ["sample", "--out_dir=run", "--num_samples=1", "--max_new_tokens=5", "--start=S"]
    assert mica_cli(*sample, cwd=tmp_path).returncode == 0
    (tmp_path / "in.txt").write_text(TEXT.replace("e", "E"))  # (as many characters, one of them another)
    mica_cli("prepare", "shakespeare-char", "--input", "in.txt", cwd=tmp_path, check=True)
    r = mica_cli(*sample, cwd=tmp_path)
    assert r.returncode == 2 and "the vocabulary in data/shakespeare_char/meta.json is not the one this run trained " \
                                 "with" in r.stderr, r.stderr
    assert mica_cli(*sample, "--data_dir=kept", cwd=tmp_path).returncode == 0


def test_a_preparation_that_fails_part_way_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    """Every file of a preparation is written before any is moved into place: a write that fails
    after train.bin (a full disk at val.bin) leaves the earlier tokens and vocabulary whole, never new
    tokens beside an old vocabulary; and a staging folder is not left behind."""
    from mica.data import prepare as prep
    from mica.data import tokens as tok

    out = tmp_path / "d"
    prepare_char("abc\n" * 300, str(out), log=lambda *a: None)
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    real = tok.write_bin

    def full_at_val(path, tokens):
        if os.path.basename(path) == "val.bin":
            raise MicaError(f"cannot write {path} (No space left on device)")
        real(path, tokens)

    monkeypatch.setattr(tok, "write_bin", full_at_val)
    for attempt in (lambda: prepare_char(TEXT, str(out), log=lambda *a: None),
                    lambda: prep._prepare_text(TEXT, "char", str(out), "bin", lambda *a: None, None)):
        with pytest.raises(MicaError, match="No space left on device"):
            attempt()
        assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
    monkeypatch.setattr(tok, "write_bin", real)
    prep._prepare_text(TEXT, "char", str(out), "shards", lambda *a: None, 500)  # (another layout: the old one goes)
    assert sorted(os.listdir(out)) == ["meta.json", "meta.pkl", "train_000000.bin", "train_000001.bin",
                                       "train_000002.bin", "val_000000.bin"]


def test_nanogpts_character_preparation_reads_windows_line_ends_as_its_prepare_py(tmp_path):
    """prepare.py reads input.txt in Python's text mode, so '\\r\\n' (and a lone '\\r') is '\\n'; a
    text of more than 65,536 distinct characters is a sentence, as prepare text's is."""
    from mica.data.prepare import prepare_shakespeare_char

    src = tmp_path / "crlf.txt"
    src.write_bytes(TEXT.replace("\n", "\r\n").encode() + b"old\rmac\r")
    prepare_shakespeare_char(str(src), str(tmp_path / "d"), log=lambda *a: None)
    assert pickle.load(open(tmp_path / "d" / "meta.pkl", "rb")) == nanogpt_meta(TEXT + "old\nmac\n")
    src.write_text("".join(chr(0x10000 + i) for i in range(70000)), encoding="utf-8")
    with pytest.raises(MicaError, match="the text has 70,000 distinct characters, more than uint16 tokens can hold"):
        prepare_shakespeare_char(str(src), str(tmp_path / "d"), log=lambda *a: None)


def test_a_character_table_has_one_digest_from_meta_pkl_or_meta_json(tmp_path):
    """nanoGPT's meta.pkl names no tokenizer and Mica's meta.json says "char": the same table is the same
    vocabulary, so a run trained on one folder samples with the other; digests made before (the
    tokenizer as each file said it) still match; another table does not."""
    import pickle

    from mica.data import meta

    chars = sorted(set("First Citizen: speak"))
    stoi, itos = {c: i for i, c in enumerate(chars)}, {i: c for i, c in enumerate(chars)}
    (tmp_path / "pkl").mkdir()
    with open(tmp_path / "pkl" / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, f)
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "meta.json").write_text(json.dumps({"vocab_size": len(chars), "itos": chars,
                                                              "stoi": stoi, "tokenizer": "char"}))
    pkl, js = meta.read(str(tmp_path / "pkl")), meta.read(str(tmp_path / "json"))
    assert meta.digest(pkl) == meta.digest(js)
    assert meta.trained_with(js, meta.digest(pkl, legacy=True)) and meta.trained_with(pkl, meta.digest(js, legacy=True))
    other = meta.Vocab(path="x", vocab_size=len(chars), itos=chars[::-1], stoi={}, tokenizer="char")
    assert not meta.trained_with(other, meta.digest(js)) and not meta.trained_with(None, meta.digest(js))
