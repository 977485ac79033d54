"""The speedrun seed's data loader: shards in sorted order, the batch sequence and its shard
switches as the seed's distributed_data_generator takes them (its PyTorch transcription), shards
made by `mica prepare text --format shards --shard_tokens N`, and bad shards as sentences."""
import glob
import os

import numpy as np
import pytest

from helpers import mica_cli
from mica.bench import torch_speedrun as TS
from mica.data import tokens as tok
from mica.errors import MicaError
from mica.train import run


def _shards(folder, lengths, seed=0, prefix="train"):
    rng = np.random.default_rng(seed)
    data = []
    for i, n in enumerate(lengths):
        t = rng.integers(0, 60000, n).astype(np.uint16)
        tok.write_shard(os.path.join(folder, f"{prefix}_{i:06d}.bin"), t)
        data.append(t)
    return data


@pytest.mark.parametrize("lengths,batch", [
    ([150, 100, 200, 90, 65], 64),   # switches mid-run; 200 holds three batches; 65 = batch + 1 exactly
    ([50, 300, 129, 129], 64),       # a first shard too short is skipped, as the seed's first check does
    ([1000], 7),                     # one shard, an odd batch
])
def test_the_batch_sequence_is_the_seeds_generator(tmp_path, lengths, batch):
    data = _shards(str(tmp_path), lengths, seed=len(lengths))
    gen = TS.distributed_data_generator(str(tmp_path / "train_*.bin"), batch, seq_len=batch)
    count = 0
    while True:
        try:
            x, y = next(gen)
        except StopIteration:  # (the seed's generator raises it when the shards run out)
            break
        except RuntimeError:
            break
        count += 1
    where = tok.seed_batches(lengths, batch, count)
    gen = TS.distributed_data_generator(str(tmp_path / "train_*.bin"), batch, seq_len=batch)
    for file, pos in where:
        x, y = next(gen)
        assert np.array_equal(x.numpy().ravel(), data[file][pos:pos + batch])
        assert np.array_equal(y.numpy().ravel(), data[file][pos + 1:pos + batch + 1])
    assert len({f for f, _ in where}) > 1 or len(lengths) == 1
    with pytest.raises(MicaError, match="runs out after"):
        tok.seed_batches(lengths, batch, count + 1)


def test_a_short_shard_after_a_switch_is_a_sentence():
    with pytest.raises(MicaError, match=r"shard b holds 20 tokens, fewer than one batch of 64 \+ 1"):
        tok.seed_batches([100, 20, 500], 64, 3, paths=["a", "b", "c"])


def test_shards_are_read_in_sorted_order(tmp_path):
    for name in ("train_000002.bin", "train_000000.bin", "train_000001.bin"):
        tok.write_shard(str(tmp_path / name), np.arange(10, dtype=np.uint16))
    assert [os.path.basename(p) for p in run.speedrun_files(str(tmp_path / "train_*.bin"), "training data")] == \
        ["train_000000.bin", "train_000001.bin", "train_000002.bin"]
    with pytest.raises(MicaError, match="no validation data files match"):
        run.speedrun_files(str(tmp_path / "val_*.bin"), "validation data")


def _bad(path, header, payload):
    with open(path, "wb") as f:
        f.write(np.asarray(header, dtype=np.int32).tobytes())
        f.write(np.asarray(payload, dtype=np.uint16).tobytes())


def test_bad_shards_are_sentences(tmp_path):
    head = np.zeros(256, np.int32)
    cases = {
        "version": ((20240520, 2, 10), 10, "is a shard of version 2; only version 1"),
        "short": ((20240520, 1, 10), 7, "claims 10 tokens in its header but holds 7: the file"),
        "magic": ((20240521, 1, 10), 10, "its magic number is 20240521, not 20240520"),
        "raw": ((5, 5, 5), 3, "is not a shard"),
    }
    for name, (fields, n, message) in cases.items():
        h = head.copy()
        h[:3] = fields
        path = tmp_path / f"{name}_000000.bin"
        _bad(path, h, np.arange(n))
        with pytest.raises(MicaError, match=message):
            run._speedrun_split(str(tmp_path / f"{name}_*.bin"), 100, 4, 1, "training data", print)
    truncated = tmp_path / "cut_000000.bin"
    truncated.write_bytes(np.asarray([20240520, 1], np.int32).tobytes())
    with pytest.raises(MicaError, match="truncated shard"):
        run._speedrun_split(str(tmp_path / "cut_*.bin"), 100, 4, 1, "training data", print)


def test_fuzzed_shard_headers_never_escape_as_tracebacks(tmp_path):
    rng = np.random.default_rng(7)
    for i in range(60):
        h = np.zeros(256, np.int32)
        h[:3] = (20240520 if i % 2 else rng.integers(-2**31, 2**31), rng.integers(-2, 3), rng.integers(-5, 40))
        path = tmp_path / f"f{i}_000000.bin"
        payload = rng.integers(0, 2**16, rng.integers(0, 40))
        data = h.tobytes()[:rng.integers(0, 1025)] if i % 7 == 0 else h.tobytes()
        path.write_bytes(data + payload.astype(np.uint16).tobytes()[:rng.integers(0, 81)])
        try:
            run._speedrun_split(str(path), 2**16, 4, 1, "training data", lambda s: None)
        except MicaError as e:
            assert str(e) and "\n" not in str(e)


def test_prepare_writes_shards_of_at_most_shard_tokens(tmp_path):
    text = "".join(chr(97 + (i * 7) % 26) for i in range(5000))
    (tmp_path / "in.txt").write_text(text)
    mica_cli("prepare", "text", "--input", "in.txt", "--format", "shards", "--shard_tokens", "1000", "--out", "d",
             cwd=tmp_path, check=True)
    train = sorted(glob.glob(str(tmp_path / "d" / "train_*.bin")))
    val = sorted(glob.glob(str(tmp_path / "d" / "val_*.bin")))
    assert [len(tok.open_tokens(p)) for p in train] == [1000, 1000, 1000, 1000, 500]
    assert [len(tok.open_tokens(p)) for p in val] == [500]
    joined = np.concatenate([tok.open_tokens(p) for p in train + val])
    import json

    itos = json.loads((tmp_path / "d" / "meta.json").read_text())["itos"]
    assert "".join(itos[i] for i in joined) == text
    # a second preparation with larger shards leaves none of the first's behind
    mica_cli("prepare", "text", "--input", "in.txt", "--format", "shards", "--shard_tokens", "3000", "--out", "d",
             cwd=tmp_path, check=True)
    assert len(glob.glob(str(tmp_path / "d" / "train_*.bin"))) == 2
    r = mica_cli("prepare", "text", "--input", "in.txt", "--shard_tokens", "10", "--out", "e", cwd=tmp_path)
    assert r.returncode != 0 and "pass it with --format shards" in r.stderr and "Traceback" not in r.stderr
    r = mica_cli("prepare", "text", "--input", "in.txt", "--format", "shards", "--shard_tokens", "1", "--out", "d",
                 cwd=tmp_path)  # (a mistyped count: thousands of one-token files, refused before any is written)
    assert r.returncode == 2 and "--shard_tokens 1 makes shards of one token" in r.stderr
    r = mica_cli("prepare", "text", "--input", "in.txt", "--format", "shards", "--shard_tokens", "0.4e0", "--out", "d",
                 cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(glob.glob(str(tmp_path / "d" / "train_*.bin"))) == 2
    # the other format in the same folder: the shards go, nanoGPT's files take their place (and back)
    r = mica_cli("prepare", "text", "--input", "in.txt", "--out", "d", cwd=tmp_path, check=True)
    assert "removed train_000000.bin, train_000001.bin, val_000000.bin of an earlier preparation" in r.stdout
    assert sorted(os.listdir(tmp_path / "d")) == ["meta.json", "meta.pkl", "train.bin", "val.bin"]
    mica_cli("prepare", "text", "--input", "in.txt", "--format", "shards", "--out", "d", cwd=tmp_path, check=True)
    assert sorted(os.listdir(tmp_path / "d")) == ["meta.json", "meta.pkl", "train_000000.bin", "val_000000.bin"]


def test_prepare_text_inputs_and_tokenizer_names(tmp_path):
    (tmp_path / "a.txt").write_text("abc\n" * 50)
    (tmp_path / "b.txt").write_text("xyz\n" * 50)
    mica_cli("prepare", "text", "--input", "a.txt", "--input", "b.txt", "--out", "d", cwd=tmp_path, check=True)
    itos = __import__("json").loads((tmp_path / "d" / "meta.json").read_text())["itos"]
    assert itos == ["\n", "a", "b", "c", "x", "y", "z"]  # (both files, as --input a.txt b.txt)
    for bad, said in (("bpex", "unknown tokenizer 'bpex'"), ("bpe500", "unknown tokenizer 'bpe500'"),
                      ("bpe:x", "the vocabulary size after bpe: must be a whole number")):
        r = mica_cli("prepare", "text", "--input", "a.txt", "--tokenizer", bad, "--out", "e", cwd=tmp_path)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = mica_cli("prepare", "text", "--input", "a.txt", "--out=", cwd=tmp_path)
    assert r.returncode == 2 and "--out is empty" in r.stderr
    assert not (tmp_path / "e").exists() and not (tmp_path / "data").exists()


def test_validation_shards_of_another_tokenizer_are_refused(tmp_path, monkeypatch):
    (tmp_path / "in.txt").write_text("to be or not to be, that is the question\n" * 200)
    (tmp_path / "other.txt").write_text("ABCDEFG\n" * 900)
    for text, out in (("in.txt", "a"), ("other.txt", "b")):
        mica_cli("prepare", "text", "--input", text, "--format", "shards", "--out", out, cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    from mica.train import config as config_mod

    cfg = config_mod.load("speedrun_tiny", ["--train_files=a/train_*.bin", "--val_files=b/val_*.bin"], log=None)
    with pytest.raises(MicaError, match=r"the validation shards' vocabulary \(b/meta.json: char, 8 tokens\) is not the "
                                        r"training shards' \(a/meta.json: char, 15 tokens\)"):
        run.speedrun_vocab(cfg, log=lambda s: None)
    cfg = config_mod.load("speedrun_tiny", ["--train_files=a/train_*.bin", "--val_files=a/val_*.bin"], log=None)
    assert run.speedrun_vocab(cfg, log=lambda s: None) == 128
    said = []  # the seed's GPT-2 vocabulary over 15 characters: trained as asked, with a note that says so
    cfg = config_mod.load("speedrun", ["--train_files=a/train_*.bin", "--val_files=a/val_*.bin"], log=None)
    assert run.speedrun_vocab(cfg, log=said.append) == 50304
    assert said == ["note: vocab_size=50,304 is 3354x the 15 tokens of a/meta.json: the embedding and head rows "
                    "beyond them never see a token; --vocab_size=0 follows the data"]


def test_too_little_text_for_two_splits_is_a_sentence(tmp_path):
    (tmp_path / "one.txt").write_text("a")
    for command in (["prepare", "text", "--input", "one.txt"], ["prepare", "shakespeare-char", "--input", "one.txt"]):
        r = mica_cli(*command, cwd=tmp_path)
        assert r.returncode == 2 and "too few to split into training and validation data" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["one.txt"]


def test_a_shard_count_past_ten_thousand_is_refused_before_any_is_written(tmp_path):
    from mica.data.prepare import prepare_text
    from mica.errors import MicaError

    (tmp_path / "in.txt").write_text("".join(chr(97 + (i * 7) % 26) for i in range(30000)))
    with pytest.raises(MicaError, match=r"^--shard_tokens 2 would cut the 27,000 training tokens into 13,500 shards "
                                        r"\(at most 10,000\); give a larger count"):
        prepare_text([str(tmp_path / "in.txt")], out_dir=str(tmp_path / "d"), fmt="shards", shard_tokens=2,
                     log=lambda *a: None)
    assert not (tmp_path / "d").exists()
