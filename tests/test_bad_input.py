"""Every bad input gets one clear sentence and a non-zero exit, never a traceback, and never
loses earlier work."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from mica.data import tokens as tok

TINY = ["shakespeare_char", "--device=cpu", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16",
        "--batch_size=2", "--eval_iters=1", "--log_interval=1", "--max_iters=3", "--eval_interval=2"]


def mica(*args, cwd):
    return subprocess.run([sys.executable, "-m", "mica.cli", *args], cwd=cwd, capture_output=True, text=True)


def assert_sentence(r, needle, code=2):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("mica: error:")]
    assert len(errors) == 1, r.stderr
    assert needle in errors[0], errors[0]


@pytest.fixture()
def data(tmp_path):
    d = tmp_path / "data" / "shakespeare_char"
    d.mkdir(parents=True)
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40
    from mica.data.prepare import prepare_char

    prepare_char(text, str(d), log=lambda *a: None)
    return tmp_path, d


def test_missing_data_file(data):
    root, d = data
    os.unlink(d / "val.bin")
    assert_sentence(mica("train", *TINY, cwd=root), "val.bin does not exist")


def test_missing_data_folder(tmp_path):
    assert_sentence(mica("train", *TINY, cwd=tmp_path), "data folder data/shakespeare_char does not exist")


def test_odd_byte_count(data):
    root, d = data
    with open(d / "train.bin", "ab") as f:
        f.write(b"\x01")
    assert_sentence(mica("train", *TINY, cwd=root), "odd number of bytes")


def test_token_ids_beyond_the_vocabulary(data):
    root, d = data
    t = np.fromfile(d / "train.bin", dtype=np.uint16)
    t[100] = 70
    t.tofile(d / "train.bin")
    assert_sentence(mica("train", *TINY, cwd=root), "holds token id 70 (first bad one at position 100)")


def test_block_size_larger_than_the_data(data):
    root, _ = data
    assert_sentence(mica("train", *TINY, "--block_size=4096", cwd=root), "fewer than the 4,097 one batch row needs")


@pytest.mark.parametrize("damage,needle", [
    ("magic", "its magic number is 7"),
    ("version", "version 3"),
    ("count", "claims 999,999 tokens"),
    ("truncated", "truncated shard"),
])
def test_broken_shards(data, damage, needle):
    root, d = data
    tokens = np.fromfile(d / "train.bin", dtype=np.uint16)
    path = d / "train.bin"
    tok.write_shard(str(path), tokens)
    raw = bytearray(open(path, "rb").read())
    header = np.frombuffer(raw[:1024], dtype=np.int32).copy()
    if damage == "magic":
        header[0] = 7
    elif damage == "version":
        header[1] = 3
    elif damage == "count":
        header[2] = 999_999
    raw[:1024] = header.tobytes()
    if damage == "truncated":
        raw = raw[:600]
    open(path, "wb").write(bytes(raw))
    assert_sentence(mica("train", *TINY, cwd=root), needle)


def test_config_value_of_the_wrong_type(data):
    root, _ = data
    assert_sentence(mica("train", *TINY, "--batch_size=abc", cwd=root), "batch_size must be int")


def test_unknown_key_names_the_nearest(data):
    root, _ = data
    assert_sentence(mica("train", *TINY, "--learning_rat=0.1", cwd=root), "did you mean 'learning_rate'?")


def test_keys_that_do_not_apply_yet(data):
    root, _ = data
    assert_sentence(mica("train", *TINY[:1], "--device=cuda", cwd=root), "pass --device=cpu")
    assert_sentence(mica("train", *TINY, "--wandb_log=True", cwd=root), "wandb_log=True is not supported")


def test_bad_config_file(data):
    root, _ = data
    (root / "bad.py").write_text("batch_size = 12\nn_layr = 4\n")
    assert_sentence(mica("train", "bad.py", "--device=cpu", cwd=root), "did you mean 'n_layer'?")
    (root / "broken.py").write_text("batch_size = = 3\n")
    assert_sentence(mica("train", "broken.py", cwd=root), "not valid Python")


def test_corrupt_checkpoint_on_resume(data):
    root, _ = data
    assert mica("train", *TINY, "--always_save_checkpoint=True", cwd=root).returncode == 0
    ckpt = root / "out-shakespeare-char" / "ckpt.safetensors"
    good = ckpt.read_bytes()
    ckpt.write_bytes(good[: len(good) // 2])
    assert_sentence(mica("train", *TINY, "--init_from=resume", cwd=root), "truncated or corrupt")
    ckpt.write_bytes(b"not a checkpoint at all")
    assert_sentence(mica("train", *TINY, "--init_from=resume", cwd=root), "not a readable safetensors file")
    os.unlink(ckpt)
    assert_sentence(mica("train", *TINY, "--init_from=resume", cwd=root), "does not exist")


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(data):
    root, _ = data
    common = [*TINY, "--always_save_checkpoint=True", "--eval_interval=2"]
    assert mica("train", *common, "--max_iters=4", cwd=root).returncode == 0
    from mica.train import checkpoint

    path = str(root / "out-shakespeare-char" / "ckpt.safetensors")
    good = checkpoint.SafeTensors(path)
    good_tensors = {n: good.read(n).tobytes() for n in good.names}
    r = mica("train", *common, "--max_iters=40", "--init_from=resume", "--learning_rate=1e30", "--decay_lr=False",
             cwd=root)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert "loss is not finite at step" in r.stderr or "the loss is nan at iter" in r.stderr, r.stderr
    after = checkpoint.SafeTensors(path)  # still the step-4 state, readable and whole
    assert after.metadata["iter_num"] == "4"
    assert {n: after.read(n).tobytes() for n in after.names} == good_tensors


def test_sample_without_a_checkpoint(tmp_path):
    assert_sentence(mica("sample", "--out_dir=nowhere", cwd=tmp_path), "does not exist")


def test_prepare_with_a_missing_input(tmp_path):
    assert_sentence(mica("prepare", "shakespeare-char", "--input", "nope.txt", cwd=tmp_path), "does not exist")
