"""Every bad input gets one clear sentence and a non-zero exit, never a traceback, and never
loses earlier work."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from helpers import mica_cli
from mica.data import tokens as tok

TINY = ["shakespeare_char", "--device=cpu", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16",
        "--batch_size=2", "--eval_iters=1", "--log_interval=1", "--max_iters=3", "--eval_interval=2"]


mica = mica_cli


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


def test_a_refused_run_prints_its_sentence_without_the_notes_about_its_settings(tmp_path):
    """The notes a run's settings earn (dtype on the CPU, compile=False) are said once its checks
    pass: a run refused for its data or its checkpoint prints the one sentence alone."""
    for extra, needle in ((["--init_from=resume", "--out_dir=nope"], "checkpoint nope/ckpt.safetensors does not exist"),
                          ([], "data folder data/shakespeare_char does not exist")):
        r = mica("train", *TINY, "--dtype=bfloat16", "--compile=False", *extra, cwd=tmp_path)
        assert_sentence(r, needle)
        assert "note:" not in r.stdout + r.stderr, r.stdout + r.stderr


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
    assert_sentence(mica("train", *TINY, cwd=root), "holds token id 70 at position 100 (and ids up to 70)")


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
    from mica.train import config as config_mod

    notes = []
    config_mod.check_supported(config_mod.load(TINY[0], [*TINY[1:], "--wandb_log=True"]), notes.append)
    assert any("wandb_log=True is ignored" in n for n in notes), notes  # nanoGPT's train_gpt2.py sets it


def test_bad_config_file(data):
    root, _ = data
    (root / "bad.py").write_text("batch_size = 12\nn_layr = 4\n")
    assert_sentence(mica("train", "bad.py", "--device=cpu", cwd=root),
                    "bad.py:2: unknown setting 'n_layr'; did you mean 'n_layer'?")
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
    # (nanoGPT's folder name, shakespeare_char, is the same preparation)
    assert_sentence(mica("prepare", "shakespeare_char", "--input", "nope.txt", cwd=tmp_path), "does not exist")


# ---- paths that used to end in a traceback: each row a setup, the command, the sentence ---------------

def _text(name, content):
    """A setup that writes `content` (str or bytes) to root/name."""
    def setup(root, d):
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return setup


def _folder(name):
    return lambda root, d: (root / name).mkdir(parents=True)


def _token_file_is_a_folder(name):
    def setup(root, d):
        os.unlink(d / "train.bin")
        (d / name).mkdir()
    return setup


def _weights_of_another_width(name):
    """A Mica weights file of TINY's model, but 32 wide where TINY is 16 (another run's)."""
    def setup(root, d):
        from mica.models.gpt import GPT, GPTConfig
        from mica.train import checkpoint

        vocab = json.loads((d / "meta.json").read_text())["vocab_size"]
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=vocab, bias=False))
        checkpoint.write(str(root / name), dict(model.init(0)), {"format": "mica"})
    return setup


def _hf_named_not_conv1d(name):
    """A file named as Hugging Face's GPT-2 names its tensors, whose c_attn is not Conv1D's layout."""
    def setup(root, d):
        import numpy as np
        from mica.train import checkpoint

        C = 16
        checkpoint.write(str(root / name), {"wte.weight": np.zeros((65, C), np.float32),
                                            "wpe.weight": np.zeros((16, C), np.float32),
                                            "h.0.attn.c_attn.weight": np.zeros((3 * C, C), np.float32)}, {})
    return setup


NO_SETUP = None
TRACEBACK_PATHS = [
    ("a run name that reads as a number", NO_SETUP, ["train", *TINY, "--wandb_run_name=2024"],
     "--wandb_run_name: wandb_run_name must be str (like its default 'gpt2'), got 2024; a string that reads as a "
     "number is quoted: --wandb_run_name=\"'2024'\""),
    ("bench without its data", NO_SETUP, ["bench", "--model", "cpu", "--rounds", "1", "--data_dir", "nope"],
     "--model cpu trains on the data in nope, which does not exist; make it with mica prepare shakespeare-char "
     "--input input.txt --out nope, or give --data_dir"),  # (nanoGPT's CPU config trains on shakespeare_char)
    ("sample init_from=gpt2", NO_SETUP, ["sample", "--init_from=gpt2"],
     "init_from='gpt2' downloads GPT-2 from a hub, which Mica never does; get Hugging Face's model.safetensors"),
    ("check --simulate=yes", NO_SETUP, ["check", "--method", "b", "--simulate=yes"],
     "argument --simulate: expected True or False, got 'yes'"),
    ("speedrun with a setting of nanoGPT's recipe", NO_SETUP, ["train", "speedrun_tiny", "--memory_budget=1KB"],
     "unknown setting 'memory_budget'; it is a setting of nanoGPT's recipe, which the speedrun recipe"),
    ("check b with method A's evaluations", NO_SETUP, ["check", "--method", "b", "--eval_every", "7"],
     "--eval_every is method A's (its evaluations); method B compares the two sides' losses step by step, so drop "
     "it, or pass --method a"),
    # (id, setup(root, data folder), command, the sentence's fragment)
    ("init_from a file named as HF's GPT-2, of another layout", _hf_named_not_conv1d("hf.safetensors"),
     ["train", *TINY, "--init_from=hf.safetensors"], "hf.safetensors names its tensors as Hugging Face's GPT-2 does, "
     "but its h.0.attn.c_attn.weight is [48, 16], not Conv1D's [n_embd, 3 * n_embd]"),
    ("train.bin is a folder", _token_file_is_a_folder("train.bin"), ["train", *TINY],
     "training data data/shakespeare_char/train.bin is a folder, not a file of tokens"),
    ("a train shard is a folder", _token_file_is_a_folder("train_000000.bin"), ["train", *TINY],
     "train_000000.bin is a folder, not a file of tokens"),
    ("config raises NameError", _text("bad.py", "batch_size = 12\nn_layer = foo\n"),
     ["train", "bad.py", "--device=cpu"], "config file bad.py raised NameError at bad.py:2: name 'foo' is not defined"),
    ("config raises ZeroDivisionError", _text("bad.py", "# a comment\nbatch_size = 12\nn_layer = 4 // 0\n"),
     ["train", "bad.py", "--device=cpu"], "raised ZeroDivisionError at bad.py:3"),
    ("config calls exit()", _text("bad.py", "import sys\nsys.exit(3)\n"), ["train", "bad.py"],
     "raised SystemExit at bad.py:2"),
    ("config is not UTF-8", _text("bad.py", b"batch_size = 12\n# caf\xe9\n"), ["train", "bad.py"],
     "config file bad.py is not UTF-8 text: byte 0xe9 at bad.py:2"),
    ("config is a folder", _folder("conf.py"), ["train", "conf.py"], "config file conf.py is a folder, not a file"),
    ("out_dir is a file", _text("afile", "x"), ["train", *TINY, "--out_dir=afile"],
     "out_dir afile exists and is a file, not a folder"),
    ("train threads=-1", NO_SETUP, ["train", *TINY, "--threads=-1"],
     "threads must be 0 (one per core) or a count from 1 to "),
    ("train threads=100000", NO_SETUP, ["train", *TINY, "--threads=100000"],
     "(the most a trainer on this machine is built for), got 100000"),
    ("prepare --input a folder", _folder("texts"), ["prepare", "shakespeare-char", "--input", "texts", "--out", "p"],
     "input texts is a folder"),
    ("prepare --out a file", _text("afile", "x"), ["prepare", "text", "--input", "data/in.txt", "--out", "afile"],
     "output folder (--out) afile exists and is a file"),
    ("plot: metrics.jsonl is a folder", _folder("run/metrics.jsonl"), ["plot", "run"],
     "run/metrics.jsonl is not a file"),
    ("plot: a line that is not an object", _text("run/metrics.jsonl", '{"iter": 0, "loss": 4.1}\n3\n'), ["plot", "run"],
     "run/metrics.jsonl:2 is not a JSON object"),
    ("import a missing file", NO_SETUP, ["import", "nope.pt", "--out_dir", "imported"], "nope.pt does not exist"),
    ("batch_order a folder", _folder("order"), ["train", *TINY, "--batch_order=order"],
     "batch order file order is a folder; give the path of the file in it"),
    ("max_iters=-1", NO_SETUP, ["train", *TINY, "--max_iters=-1"], "max_iters must be 0 or more, got -1"),
    ("seed beyond 64 bits", NO_SETUP, ["train", *TINY, f"--seed={2**64}"],
     "seed must fit in 64 bits (from -2**63 to 2**64 - 1), got 18446744073709551616"),
    ("prepare --tokenizer bpe:abc", NO_SETUP, ["prepare", "text", "--input", "data/in.txt", "--tokenizer", "bpe:abc"],
     "--tokenizer bpe:abc: the vocabulary size after bpe: must be a whole number"),
    ("inspect n_head=0", NO_SETUP, ["inspect", "--n_head=0"], "n_head must be positive, got 0"),
    ("inspect n_embd not divisible", NO_SETUP, ["inspect", "--n_embd=7", "--n_head=2"],
     "the width n_embd (7, from --n_embd) must be divisible by n_head (2, from --n_head); give n_head a divisor"),
    ("plot --out not an image", _text("run/metrics.jsonl", '{"iter": 0, "loss": 4.1}\n'),
     ["plot", "run", "--out", "curves.py"], "cannot write curves.py: Format 'py' is not supported"),
    # AdamW's settings in the ranges torch.optim.AdamW takes (and a schedule that counts forwards)
    ("learning_rate=-1", NO_SETUP, ["train", *TINY, "--learning_rate=-1"],
     "learning_rate must be finite and 0 or more (as torch's optimizers require), got -1.0"),
    ("min_lr=-0.5", NO_SETUP, ["train", *TINY, "--min_lr=-0.5"], "min_lr must be finite and 0 or more"),
    ("an infinite learning_rate in a config", _text("lr.py", "import math\nlearning_rate = math.inf\n"),
     ["train", *TINY, "lr.py"], "lr.py:2: learning_rate must be finite and 0 or more"),
    ("beta1=1.0", NO_SETUP, ["train", *TINY, "--beta1=1.0"],
     "beta1 must be in [0, 1) (as torch's optimizers require), got 1.0"),
    ("beta2 in a config", _text("b.py", "beta2 = -0.1\n"), ["train", *TINY, "b.py"], "b.py:1: beta2 must be in [0, 1)"),
    ("weight_decay=-0.1", NO_SETUP, ["train", *TINY, "--weight_decay=-0.1"],
     "weight_decay must be finite and 0 or more (as torch's optimizers require), got -0.1"),
    ("grad_clip=-1", NO_SETUP, ["train", *TINY, "--grad_clip=-1.0"],
     "grad_clip must be 0.0 (no clipping) or a positive norm, got -1.0"),
    ("warmup_iters=-5", NO_SETUP, ["train", *TINY, "--warmup_iters=-5"], "warmup_iters must be 0 or more, got -5"),
    ("speedrun mu=1.0", NO_SETUP, ["train", "speedrun_tiny", "--mu=1.0"], "mu must be in [0, 1)"),
    # where the weights come from, refused before a plan is printed or a folder made
    ("resume without a checkpoint", NO_SETUP, ["train", *TINY, "--init_from=resume", "--out_dir=fresh"],
     "checkpoint fresh/ckpt.safetensors does not exist; start with --init_from=scratch, or point --out_dir at the "
     "folder of the run to resume"),
    # (nanoGPT's folder is converted first, as mica import would: a damaged ckpt.pt is import's sentence)
    ("resume beside a damaged ckpt.pt", _text("run/ckpt.pt", "x"), ["train", *TINY, "--init_from=resume", "--out_dir=run"],
     "run/ckpt.pt is not a PyTorch checkpoint (torch.save writes a zip archive"),
    ("sample beside a damaged ckpt.pt", _text("run/ckpt.pt", "x"), ["sample", "--out_dir=run"],
     "run/ckpt.pt is not a PyTorch checkpoint (torch.save writes a zip archive"),
    ("init_from a .pt", _text("w.pt", "PK\x03\x04"), ["train", *TINY, "--init_from=w.pt"],
     "init_from=w.pt is a PyTorch checkpoint; convert it first with mica import w.pt --out_dir DIR"),
    ("init_from a .bin of tokens", _text("t.bin", "\x01\x00\x02\x00"), ["train", *TINY, "--init_from=t.bin"],
     "init_from file t.bin is not a PyTorch checkpoint (not torch.save's zip or pickle; a file of tokens?)"),
    ("init_from a missing .pt", NO_SETUP, ["train", *TINY, "--init_from=nope.pt"],
     "init_from file nope.pt does not exist; give the path of nanoGPT's ckpt.pt"),
    ("an out_dir with a line break", NO_SETUP, ["train", *TINY, "--out_dir=a\nb"],
     "out_dir holds a line break or a NUL character"),
    ("a config named as prepare names it", NO_SETUP, ["train", "shakespeare-char"],
     "did you mean shakespeare_char?"),
    ("init_from a missing file", NO_SETUP, ["train", *TINY, "--init_from=nope.safetensors"],
     "init_from file nope.safetensors does not exist; give the path of a .safetensors file"),
    ("init_from a word", NO_SETUP, ["train", *TINY, "--init_from=gtp2"], "init_from='gtp2' is not available"),
    # nanoGPT's command line: config files and settings in any order
    ("a setting without its value", NO_SETUP, ["train", *TINY, "--eval_only"],
     "expected --key=value, got '--eval_only'; a setting takes its value after '=', e.g. --eval_only=True"),
    ("configs of two recipes", NO_SETUP, ["train", "speedrun_tiny", "shakespeare_char"],
     "the built-in config speedrun_tiny is the speedrun recipe's, but the other configs and settings given are the "
     "nanogpt recipe's"),
    ("a second config that does not exist", _text("a.py", "n_layer = 1\n"), ["train", "a.py", "b.py"],
     "config file b.py does not exist"),
    ("a config deletes a setting", _text("d.py", "del batch_size\n"), ["train", *TINY, "d.py"],
     "config file d.py deletes the setting batch_size"),
    ("openwebtext without its folder", NO_SETUP, ["train", "--device=cpu", "--dataset=openwebtext"],
     "data folder data/openwebtext does not exist; prepare it first: mica prepare text --input FILE [FILE ...] "
     "--tokenizer gpt2 --out data/openwebtext"),
    # argparse's own refusals, one sentence each
    ("import without --out_dir", NO_SETUP, ["import", "x.pt"],
     "mica import: the following arguments are required: --out_dir; see mica import --help"),
    ("an unknown command", NO_SETUP, ["trian"], "mica: error: 'trian' is not a mica command (choose from prepare, train"),
    ("prepare an unknown kind", NO_SETUP, ["prepare", "words"],
     "'words' is not something mica prepare makes (choose from shakespeare-char, text)"),
    ("export --dtype float64", NO_SETUP, ["export", "out", "--to", "x.pt", "--dtype", "float64"],
     "--dtype 'float64' is not one of float32, bfloat16, float16"),
    # what prepare shakespeare-char would have ignored
    ("shakespeare-char with two inputs", NO_SETUP, ["prepare", "shakespeare-char", "--input", "data/in.txt",
                                                    "data/in.txt"], "mica prepare shakespeare-char reads one text file"),
    ("shakespeare-char with a tokenizer", NO_SETUP, ["prepare", "shakespeare-char", "--tokenizer", "gpt2"],
     "--tokenizer is for mica prepare text"),
    # empty and misplaced paths
    ("an empty out_dir", NO_SETUP, ["train", *TINY, "--out_dir="], "the out_dir is empty; give the path of a folder"),
    ("export --to an empty path", NO_SETUP, ["export", "out", "--to="], "--to is empty"),
    ("import --out_dir an empty path", _text("x.pt", "x"), ["import", "x.pt", "--out_dir="], "--out_dir is empty"),
    ("data_dir a file", _text("afile", "x"), ["train", *TINY, "--data_dir=afile"],
     "data folder afile is a file; give the folder that holds train.bin and val.bin"),
    ("plot --out a folder", _text("run/metrics.jsonl", '{"iter": 0, "loss": 4.1}\n'), ["plot", "run", "--out", "data"],
     "--out data is a folder; give the path of the image to write, e.g. data/loss.png"),
    ("a config file chooses a missing checkpoint", _text("res.py", "init_from = 'resume'\nout_dir = 'gone'\n"),
     ["train", *TINY, "res.py"], "res.py:1: checkpoint gone/ckpt.safetensors does not exist"),
    ("one dash", NO_SETUP, ["train", *TINY, "-max_iters=5"],
     "expected --key=value, got '-max_iters=5'; a setting starts with two dashes"),
    ("an unknown setting far from any", NO_SETUP, ["train", *TINY, "--zzzz=1"],
     "unknown setting 'zzzz'; --help lists every setting"),
    ("an unknown setting without a value", NO_SETUP, ["train", *TINY, "--max_iter"],
     "unknown setting 'max_iter'; did you mean 'max_iters'?"),
    ("sample's unknown setting without a value", NO_SETUP, ["sample", "--frobnicate"],
     "unknown setting 'frobnicate'; --help lists every setting"),
    ("out_dir a device", NO_SETUP, ["train", *TINY, "--out_dir=/dev/null"],
     "out_dir /dev/null is not a folder (a device or other special file); choose a folder's path"),
    ("export with a misspelt flag", NO_SETUP, ["export", "out", "--to", "x.pt", "--dtpye", "bfloat16"],
     "unexpected arguments: --dtpye bfloat16; mica export --help lists what it takes"),
    ("import of two files", _text("x.pt", "x"), ["import", "x.pt", "x.pt", "--out_dir", "imp"],
     "unexpected arguments: x.pt; mica import --help lists what it takes (one checkpoint at a time)"),
    # batch orders, checked before the trainer starts
    ("batch order of words", _text("order.txt", "12 7\nabc\n"), ["train", *TINY, "--batch_order=order.txt"],
     "batch order file order.txt:2 holds 'abc', not a row offset"),
    ("batch order beyond the data", _text("order.txt", "5 99999999\n"), ["train", *TINY, "--batch_order=order.txt"],
     "batch order file order.txt:1 has offset 99999999, beyond the training data's"),
    ("batch order too short", _text("order.txt", "1 2 3\n"), ["train", *TINY, "--batch_order=order.txt"],
     "batch order file order.txt holds 3 offsets, but this run draws 8 (2 a batch"),
    ("batch order empty", _text("order.txt", "\n"), ["train", *TINY, "--batch_order=order.txt"],
     "batch order file order.txt holds no offsets"),
    # the protocol's settings, checked before anything runs
    ("bench --rounds 0", NO_SETUP, ["bench", "--rounds", "0"], "--rounds must be a whole number, 1 or more; got 0"),
    ("bench --window 0", NO_SETUP, ["bench", "--window", "0"], "--window must be a whole number, 1 or more; got 0"),
    ("bench an unknown mode", NO_SETUP, ["bench", "--modes", "eager", "fast"],
     "--modes: 'fast' is not one of PyTorch's modes (eager, default, reduce-overhead, max-autotune)"),
    ("bench --opt_levels 3", NO_SETUP, ["bench", "--opt_levels", "2", "3"], "--opt_levels takes Mica's levels 0, 1 and 2"),
    ("bench a mode twice", NO_SETUP, ["bench", "--modes", "eager", "eager"], "--modes names one twice"),
    ("check --iters 0", NO_SETUP, ["check", "--method", "a", "--iters", "0"], "--iters must be 1 or more, got 0"),
    ("check --seeds 1", NO_SETUP, ["check", "--method", "a", "--seeds", "1"],
     "--seeds must be 2 or more (a family's range is what the medians are judged by), got 1"),
    ("check b with --seeds", NO_SETUP, ["check", "--method", "b", "--seeds", "3"], "--seeds is method A's"),
    ("check, an evaluation interval past the run", NO_SETUP, ["check", "--method", "a", "--iters", "20",
     "--eval_every", "50"], "--eval_every (50) must be at most --iters (20): method A judges the evaluations after"),
    # dtypes: inspect reads them as train does; speedrun_tiny's check is float32 method B alone
    ("inspect --dtype=fp16", NO_SETUP, ["inspect", "shakespeare_char", "--n_layer=1", "--dtype=fp16", "--ir"],
     "dtype must be 'float32', 'bfloat16' or 'float16', got 'fp16'"),
    ("inspect --dtype=half", NO_SETUP, ["inspect", "shakespeare_char", "--dtype=half"],
     "dtype must be 'float32', 'bfloat16' or 'float16', got 'half'"),
    ("inspect a config's dtype", _text("c.py", "n_layer = 1\ndtype = 'bf16'\n"), ["inspect", "c.py", "--ir"],
     "c.py:2: dtype must be 'float32', 'bfloat16' or 'float16', got 'bf16'"),
    ("check speedrun_tiny in bfloat16", NO_SETUP, ["check", "--method", "b", "--model", "speedrun_tiny", "--dtype",
                                                   "bfloat16"],
     "--model speedrun_tiny is checked by method B alone (one shared start, in float32); pass --method b without"),
    ("check speedrun_tiny by method A", NO_SETUP, ["check", "--method", "a", "--model", "speedrun_tiny", "--dtype",
                                                   "bfloat16"], "--model speedrun_tiny is checked by method B alone"),
]


@pytest.mark.parametrize("setup,command,needle", [r[1:] for r in TRACEBACK_PATHS],
                         ids=[r[0] for r in TRACEBACK_PATHS])
def test_no_traceback(data, setup, command, needle):
    root, d = data
    (root / "data" / "in.txt").write_text("to be or not to be\n" * 20)
    if setup:
        setup(root, d)
    before = sorted(p.name for p in root.iterdir())
    assert_sentence(mica(*command, cwd=root), needle)
    assert sorted(p.name for p in root.iterdir()) == before  # a refusal creates nothing (no out_dir, no folder)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished TINY run (with a checkpoint) and its data, shared by the sampling rows."""
    root = tmp_path_factory.mktemp("run")
    d = root / "data" / "shakespeare_char"
    d.mkdir(parents=True)
    from mica.data.prepare import prepare_char

    prepare_char("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40, str(d), log=lambda *a: None)
    r = mica("train", *TINY, "--always_save_checkpoint=True", cwd=root)
    assert r.returncode == 0, r.stderr
    return root


SAMPLE = ["sample", "--out_dir=out-shakespeare-char", "--num_samples=1", "--max_new_tokens=8"]
SAMPLE_PATHS = [
    ("--start=FILE: missing", NO_SETUP, ["--start=FILE:nope.txt"], "--start prompt file nope.txt does not exist"),
    ("--start=FILE: a device", NO_SETUP, ["--start=FILE:/dev/zero"],
     "--start prompt file /dev/zero is a device or a socket, not a file"),
    ("--start=FILE: a folder", _folder("prompts"), ["--start=FILE:prompts"], "prompt file prompts is a folder"),
    ("--start=FILE: not UTF-8", _text("p.txt", b"First \xff\n"), ["--start=FILE:p.txt"],
     "prompt file p.txt is not UTF-8 text: byte 0xff at p.txt:1 (offset 6)"),
    ("sample dtype=bf16", NO_SETUP, ["--dtype=bf16"], "dtype must be 'float32', 'bfloat16' or 'float16', got 'bf16'"),
    ("a value after a space", NO_SETUP, ["--num_samples", "2"],
     "expected --key=value, got '--num_samples'; a setting takes its value after '=', e.g. --num_samples=2"),
    ("sample threads=-1", NO_SETUP, ["--threads=-1"], "threads must be 0 (one per core) or a count from 1 to "),
    ("sample threads=100000", NO_SETUP, ["--threads=100000"], "built for), got 100000"),
    ("top_k=-5", NO_SETUP, ["--top_k=-5"], "top_k must be a positive count of tokens to keep, or None for no cut; got -5"),
    ("top_k=0", NO_SETUP, ["--top_k=0"], "top_k must be a positive count"),
    ("top_k a word", NO_SETUP, ["--top_k=all"], "--top_k: top_k must be int or None"),
    ("temperature=0", NO_SETUP, ["--temperature=0"], "temperature must be a positive, finite number (lower is more "
     "conservative), got 0"),
    ("temperature inf from a config", _text("hot.py", "temperature = float('inf')\n"), ["hot.py"],
     "temperature must be a positive, finite number (lower is more conservative), got inf"),
    ("max_new_tokens=-1", NO_SETUP, ["--max_new_tokens=-1"], "max_new_tokens must be 0 or more, got -1"),
    ("max_new_tokens past memory", NO_SETUP, ["--max_new_tokens=2305843009213693952"],  # (the sampler's byte count
     "max_new_tokens=2305843009213693952 asks for a sample of 2,305,843,009,213,693,953 tokens"),  # overflowed)
    ("a config's name of the wrong type", _text("t.py", "max_iters = 5\n"), ["t.py", "--max_iters=2.5"],
     "--max_iters: max_iters must be a whole number"),
    ("num_samples=0", NO_SETUP, ["--num_samples=0"], "num_samples must be 1 or more, got 0"),
    ("dtype a typo", NO_SETUP, ["--dtype=bfloat64"], "dtype must be 'float32', 'bfloat16' or 'float16', got 'bfloat64'; did you mean 'bfloat16'?"),
]


@pytest.mark.parametrize("setup,flags,needle", [r[1:] for r in SAMPLE_PATHS], ids=[r[0] for r in SAMPLE_PATHS])
def test_sample_no_traceback(run_dir, setup, flags, needle):
    if setup:
        setup(run_dir, None)
    assert_sentence(mica(*SAMPLE, *flags, cwd=run_dir), needle)


def test_a_refused_run_into_a_finished_runs_folder_changes_nothing(run_dir, tmp_path):
    """Settings refused before the trainer starts (too many threads, a batch order that is not one)
    leave the earlier run's files as they were: its metrics, checkpoint and starting weights."""
    import shutil

    work = tmp_path / "copy"
    shutil.copytree(run_dir, work)
    folder = work / "out-shakespeare-char"
    before = {p: (folder / p).read_bytes() for p in os.listdir(folder) if p != ".mica.lock"}
    (work / "order.txt").write_text("abc\n")
    for flag in ("--threads=100000", "--batch_order=order.txt", "--init_from=nope.pt"):
        r = mica("train", *TINY, flag, cwd=work)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert {p: (folder / p).read_bytes() for p in os.listdir(folder) if p != ".mica.lock"} == before, flag


def test_sample_reads_config_files_as_sample_py_does(run_dir):
    """nanoGPT's sample.py runs its configurator too: a training config's out_dir (and device) are
    sample.py's settings, its model settings are ignored, and --key=value after it still wins."""
    want = mica(*SAMPLE, cwd=run_dir)
    assert want.returncode == 0, want.stderr
    (run_dir / "cfg.py").write_text("out_dir = 'out-shakespeare-char'\nn_layer = 7\nnum_samples = 5\n")
    for first in ("shakespeare_char", "cfg.py"):
        r = mica("sample", first, *SAMPLE[2:], cwd=run_dir)  # (SAMPLE[1] is --out_dir)
        assert r.returncode == 0 and r.stdout == want.stdout, (first, r.stderr)
    (run_dir / "bad.py").write_text("top_k = 'many'\n")
    assert_sentence(mica("sample", "bad.py", cwd=run_dir), "bad.py:1: top_k must be int or None")
    # (a name a config file made, a training config's max_iters, takes --key=value after it and is
    # ignored, as sample.py's configurator takes it; without that config it is an unknown setting)
    (run_dir / "train.py").write_text("out_dir = 'out-shakespeare-char'\nmax_iters = 5000\n")
    r = mica("sample", "train.py", *SAMPLE[2:], "--max_iters=3", cwd=run_dir)
    assert r.returncode == 0 and r.stdout == want.stdout, r.stderr
    assert_sentence(mica(*SAMPLE, "--max_iters=3", cwd=run_dir), "unknown setting 'max_iters'")
    r = mica("sample", "shakespeare_char", *SAMPLE[1:], "--max_iters=3", cwd=run_dir)  # (the built-in config's too)
    assert r.returncode == 0 and r.stdout == want.stdout, r.stderr


def test_sample_with_a_training_configs_init_from_names_its_line(run_dir):
    """A training config sets init_from='scratch'; sample.py would fail on it with a NameError. Mica
    says which line sets it and that --init_from=resume after the config samples."""
    (run_dir / "train_cfg.py").write_text("out_dir = 'out-shakespeare-char'\ninit_from = 'scratch'\n")
    assert_sentence(mica("sample", "train_cfg.py", *SAMPLE[2:], cwd=run_dir),
                    "but train_cfg.py:2 sets init_from='scratch' (a training setting); pass --init_from=resume after "
                    "the config")
    r = mica("sample", "train_cfg.py", "--init_from=resume", *SAMPLE[2:], cwd=run_dir)
    assert r.returncode == 0 and r.stdout == mica(*SAMPLE, cwd=run_dir).stdout, r.stderr


def test_resuming_on_data_of_another_vocabulary_is_refused_and_keeps_the_checkpoint(run_dir, tmp_path):
    """The run's token ids mean its data's characters: resuming on a folder of another vocabulary
    (or of none) is one sentence before anything is trained or written, and the checkpoint is as it
    was (it could not have been sampled after)."""
    work = tmp_path / "copy"
    shutil.copytree(run_dir, work)
    from mica.data.prepare import prepare_char

    other = work / "data" / "other"
    other.mkdir()
    prepare_char("we few, we happy few, we band of brothers;\n" * 40, str(other), log=lambda *a: None)
    ckpt = work / "out-shakespeare-char" / "ckpt.safetensors"
    before = ckpt.read_bytes()
    r = mica("train", *TINY, "--init_from=resume", "--dataset=other", "--max_iters=5", cwd=work)
    assert_sentence(r, "data/other/meta.json's vocabulary (18 tokens) is not the one")
    assert "is not the one the checkpoint in out-shakespeare-char was trained with" in r.stderr
    for meta in ("meta.json", "meta.pkl"):
        if (other / meta).exists():
            os.unlink(other / meta)
    r = mica("train", *TINY, "--init_from=resume", "--dataset=other", "--max_iters=5", cwd=work)
    assert_sentence(r, "data/other holds no vocabulary (meta.json or meta.pkl), not the one the checkpoint")
    assert ckpt.read_bytes() == before


def test_a_torn_metrics_line_is_dropped_when_the_run_resumes(run_dir, tmp_path):
    """A crash can cut metrics.jsonl's last row short; the resume drops that line with a note (the
    trainer would otherwise append to it, and mica plot refuses the file), so every line after is
    a whole row."""
    work = tmp_path / "copy"
    shutil.copytree(run_dir, work)
    metrics = work / "out-shakespeare-char" / "metrics.jsonl"
    with open(metrics, "ab") as f:
        f.write(b'{"iter": 3, "lo')
    r = mica("train", *TINY, "--init_from=resume", "--max_iters=4", cwd=work)
    assert r.returncode == 0, r.stderr
    assert "was not a JSON row (a write cut short by a crash, or an edit) and is left out of this resume's log" \
        in r.stdout + r.stderr
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert any(row.get("iter") == 4 for row in rows)


def test_sampling_from_another_folder_finds_the_runs_data(run_dir, tmp_path):
    """The run trained in run_dir with data/shakespeare_char (relative); its checkpoint keeps the
    path as given (its bytes do not depend on the folder), and mica sample run from elsewhere finds
    the vocabulary from where out_dir lies."""
    want = mica(*SAMPLE, cwd=run_dir)
    r = mica("sample", f"--out_dir={run_dir / 'out-shakespeare-char'}", *SAMPLE[2:], cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == want.stdout, r.stderr


def test_top_k_none_means_no_cut(run_dir):
    """nanoGPT's sample.py accepts top_k=None: every token stays, the same draw as a top_k past the vocabulary."""
    none = mica(*SAMPLE, "--top_k=None", "--max_new_tokens=40", cwd=run_dir)
    assert none.returncode == 0 and "error" not in none.stderr, none.stderr
    everything = mica(*SAMPLE, "--top_k=100000", "--max_new_tokens=40", cwd=run_dir)
    assert none.stdout == everything.stdout
    assert len(none.stdout.split("---------------")[0]) >= 40


def test_weights_of_another_model_are_refused_before_compiling(data):
    """The file's header is read before anything is built: the refusal comes without a compile."""
    root, d = data
    _weights_of_another_width("other.safetensors")(root, d)
    r = mica("train", *TINY, "--init_from=other.safetensors", cwd=root)
    assert_sentence(r, "other.safetensors does not fit this model: tensors 9 of another shape "
                       "(transformer.wte.weight is [27, 32] where this model needs [27, 16]")
    assert "compiling" not in r.stdout + r.stderr
    assert not (root / "out-shakespeare-char").exists()


def test_export_into_a_missing_folder_creates_it(run_dir):
    pytest.importorskip("torch")
    r = mica("export", "out-shakespeare-char", "--to", "exported/deeper/ckpt.pt", cwd=run_dir)
    assert r.returncode == 0, r.stderr
    assert os.listdir(run_dir / "exported" / "deeper") == ["ckpt.pt"]  # no temporary file left beside it
    assert_sentence(mica("export", "out-shakespeare-char", "--to", "exported", cwd=run_dir),
                    "--to exported is a folder; give the path of the file to write")
    # a file already there (nanoGPT's own ckpt.pt, maybe) is replaced only when asked
    target = run_dir / "exported" / "deeper" / "ckpt.pt"
    target.write_bytes(b"nanoGPT's own")
    assert_sentence(mica("export", "out-shakespeare-char", "--to", str(target), cwd=run_dir),
                    f"--to {target} already exists (a nanoGPT checkpoint?); give another path, or add --force")
    assert target.read_bytes() == b"nanoGPT's own"
    assert mica("export", "out-shakespeare-char", "--to", str(target), "--force", cwd=run_dir).returncode == 0
    assert target.read_bytes()[:2] == b"PK"  # (torch.save's zip)
    # --force replaces a file, never a device or pipe, the run's own files or a .safetensors name
    run = run_dir / "out-shakespeare-char"
    files = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    os.mkfifo(run_dir / "pipe")
    for to, says in (("pipe", "--to pipe is not a regular file (a device, a pipe or a socket)"),
                     ("/dev/null", "--to /dev/null is not a regular file"),
                     (str(run / "ckpt.safetensors"), "ends in .safetensors, but export writes nanoGPT's ckpt.pt"),
                     (str(run / "metrics.jsonl"), "is one of a mica run's own files, which export would replace")):
        assert_sentence(mica("export", "out-shakespeare-char", "--to", to, "--force", cwd=run_dir), says)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == files
    assert (run_dir / "pipe").is_fifo() and os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_negative_seed_trains_and_samples_without_a_warning(data):
    root, _ = data
    r = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "mica.cli", "train", *TINY, "--seed=-1",
                        "--always_save_checkpoint=True"], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Warning" not in r.stderr
    r = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "mica.cli", *SAMPLE, "--seed=-1"],
                       cwd=root, capture_output=True, text=True)
    assert r.returncode == 0 and "Warning" not in r.stderr, r.stderr
    # -1 is 2**64 - 1 in 64 bits, as torch.manual_seed takes both: the same run, loss for loss
    assert mica("train", *TINY, f"--seed={2**64 - 1}", "--out_dir=wrapped", cwd=root).returncode == 0
    losses = [[(m["iter"], m["loss"]) for m in map(json.loads, open(root / d / "metrics.jsonl")) if "loss" in m]
              for d in ("out-shakespeare-char", "wrapped")]
    assert [i for i, _ in losses[0]] == [0, 1, 2, 3] and losses[0] == losses[1]
    assert mica(*SAMPLE, "--seed=-1", cwd=root).stdout == mica(*SAMPLE, f"--seed={2**64 - 1}", cwd=root).stdout


def test_parameter_streams_for_any_int_seed():
    """A negative seed is its 64-bit two's complement (nanoGPT takes any int); seeds below 2**53 draw what the
    earlier list-keyed Philox drew, so existing runs are unchanged."""
    import warnings
    import zlib

    from mica.nn.init import stream

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        minus_one = stream(-1, "transformer.wte.weight").random(4)
        zero = stream(0, "transformer.wte.weight").random(4)
    assert np.array_equal(minus_one, stream(2**64 - 1, "transformer.wte.weight").random(4))
    assert not np.array_equal(minus_one, zero)
    old = np.random.Generator(np.random.Philox(key=[1337, zlib.crc32(b"lm_head.weight")])).random(4)
    assert np.array_equal(stream(1337, "lm_head.weight").random(4), old)


# ---- read-only and full folders: tmpfs mounts (root ignores chmod) ----------------------------------------

@pytest.fixture()
def tmpfs(tmp_path):
    """mount(name, size) -> a fresh tmpfs folder; ro(path) remounts it read-only; all unmounted afterwards."""
    mounted = []

    def mount(name, size="2m"):
        path = tmp_path / name
        path.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode})")
        mounted.append(path)
        return path

    def ro(path):
        r = subprocess.run(["mount", "-o", "remount,ro", str(path)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot remount a tmpfs read-only here ({r.stderr.strip()})")

    yield mount, ro
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_read_only_out_dir_fails_before_compiling(data, tmpfs, tmp_path):
    root, _ = data
    mount, ro = tmpfs
    folder = mount("ro")
    ro(folder)
    cache = tmp_path / "fresh-cache"  # an empty build cache: a compile would leave a trainer-* folder in it
    env = {**os.environ, "MICA_CACHE": str(cache)}
    for out_dir, needle in [(folder / "run", f"cannot create the out_dir {folder / 'run'} (Read-only file system)"),
                            (folder, f"cannot write into the out_dir {folder} (Read-only file system)")]:
        r = subprocess.run([sys.executable, "-m", "mica.cli", "train", *TINY, f"--out_dir={out_dir}"], cwd=root,
                           capture_output=True, text=True, env=env)
        assert_sentence(r, needle)
        assert "compiling" not in r.stdout
        assert not cache.exists() or not [p for p in os.listdir(cache) if p.startswith("trainer-")]


def test_read_only_run_folder_resumes_with_a_sentence_and_samples(data, tmpfs, tmp_path):
    root, _ = data
    mount, ro = tmpfs
    folder = mount("run")
    assert mica("train", *TINY, "--always_save_checkpoint=True", f"--out_dir={folder}", cwd=root).returncode == 0
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    ro(folder)
    before = {p: (folder / p).read_bytes() for p in os.listdir(folder)}
    assert_sentence(mica("train", *TINY, "--init_from=resume", f"--out_dir={folder}", cwd=root),
                    f"cannot write into the out_dir {folder} (Read-only file system)")
    flags = ["--num_samples=2", "--max_new_tokens=30", "--seed=7"]
    r = mica("sample", f"--out_dir={folder}", *flags, cwd=root)
    assert r.returncode == 0, r.stderr
    writable = mica("sample", f"--out_dir={copy}", *flags, cwd=root)
    assert r.stdout == writable.stdout and r.stdout.count("---------------") == 2
    assert sorted(os.listdir(copy)) == sorted(before)  # sampling writes nothing into the run folder
    assert {p: (folder / p).read_bytes() for p in os.listdir(folder)} == before
    # the other commands that write say so in one sentence too
    (root / "in.txt").write_text("to be or not to be\n" * 20)
    assert_sentence(mica("prepare", "text", "--input", "in.txt", "--out", str(folder / "p"), cwd=root),
                    f"cannot create the output folder (--out) {folder / 'p'} (Read-only file system)")
    assert_sentence(mica("plot", str(folder), cwd=root), f"cannot write {folder / 'loss.png'} (Read-only file system)")
    if importlib.util.find_spec("torch"):
        assert_sentence(mica("export", str(folder), "--to", str(folder / "ckpt.pt"), cwd=root),
                        f"cannot write into the folder of --to {folder} (Read-only file system)")
        assert mica("export", str(folder), "--to", "ckpt.pt", cwd=root).returncode == 0
        assert_sentence(mica("import", "ckpt.pt", "--out_dir", str(folder / "imported"), cwd=root),
                        f"cannot create the --out_dir {folder / 'imported'} (Read-only file system)")
    assert {p: (folder / p).read_bytes() for p in os.listdir(folder)} == before


def test_disk_full_at_the_first_write(data, tmpfs):
    root, _ = data
    mount, _ = tmpfs
    folder = mount("full", "256k")
    with open(folder / "filler", "wb", buffering=0) as f:  # fill it: the run's first write (init.safetensors) fails
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    r = mica("train", *TINY, f"--out_dir={folder / 'run'}", cwd=root)
    assert_sentence(r, "No space left on device")
    assert not (folder / "run").exists()  # (the folder the run made is gone again, temporary files and all)
    (root / "in.txt").write_text("to be or not to be\n" * 2000)
    r = mica("prepare", "text", "--input", "in.txt", "--out", str(folder / "p"), cwd=root)
    assert_sentence(r, f"cannot write {folder / 'p' / 'train.bin'} (No space left on device)")
    assert not (folder / "p").exists()  # (the folder it made is gone again: nothing was written)
    # room for the run's start, not for its first checkpoint: nothing to resume from, said so
    small = mount("small", "48k")
    r = mica("train", *TINY, "--always_save_checkpoint=True", f"--out_dir={small / 'run'}", cwd=root)
    assert_sentence(r, f"writing the checkpoint in {small / 'run'} failed (No space left on device); this run saved "
                       f"no checkpoint (any ckpt.safetensors in {small / 'run'} is from an earlier run, untouched): "
                       "free space (or fix the folder), then start the run again")


def test_a_config_files_helper_variables_are_ignored_with_a_note(tmp_path):
    from mica.train import config as config_mod

    (tmp_path / "c.py").write_text("base_lr = 1e-3\nlearning_rate = base_lr * 2\ntokens_per_iter = 12 * 1024\n")
    notes = []
    cfg = config_mod.load(str(tmp_path / "c.py"), [], notes.append)
    assert cfg["learning_rate"] == 2e-3
    assert sorted(n.split(": ")[2].split(" ")[0] for n in notes) == ["base_lr", "tokens_per_iter"], notes


@pytest.mark.parametrize("text, fragment", [
    ("batch_size = 12\n\nn_layr = 4\n", "c.py:3: unknown setting 'n_layr'; did you mean 'n_layer'?"),
    ("batch_size = 12x\n", "config file c.py is not valid Python: invalid decimal literal (c.py:1)"),
    ("# nanoGPT\nif True:\n    n_layer = 4.5\n", "c.py:3: n_layer must be a whole number (like its default 12), got 4.5"),
    ("n_layer = 2\nn_layer = '2'\n", "c.py:2: n_layer must be int"),  # (the last assignment wins, as in Python)
    ("def f():\n    return 1.5\n\ndropout = f()\n", "c.py:4: dropout must be in [0, 1), got 1.5"),
    ("[recipe for recipe in 'ab']\nn_head = 3\nn_embd = 64\n", "the width n_embd (64, set at c.py:3) must be divisible by n_head (3, set at c.py:2)"),
    ("n_layer = 0\n", "c.py:1: n_layer must be positive, got 0"),
    ("x = 1\nrecipe = 'nanogtp'\n", "c.py:2: recipe must be 'nanogpt' or 'speedrun', got 'nanogtp'"),
])
def test_config_file_errors_name_the_line(tmp_path, monkeypatch, text, fragment):
    """Every error about a config file's content names FILE:LINE of the assignment (or the line
    Python's parser reports): at load, and when a value loads but check_supported refuses it."""
    from mica.errors import MicaError
    from mica.train import config as config_mod

    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.py").write_text(text)
    with pytest.raises(MicaError) as e:
        config_mod.check_supported(config_mod.load("c.py", ["--device=cpu"], log=lambda _: None), lambda _: None)
    assert fragment in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_config_origin_names_each_settings_line(tmp_path):
    from mica.train import config as config_mod

    (tmp_path / "c.py").write_text("import math\nhelper = 3\nn_layer = 3\nfor _ in range(2):\n    n_head = 4\n")
    notes = []
    cfg = config_mod.load(str(tmp_path / "c.py"), ["--n_embd=64", "--n_layer=2"], notes.append)
    assert (cfg["n_layer"], cfg["n_head"], cfg["n_embd"]) == (2, 4, 64)
    assert cfg.origin == {"n_head": f"{tmp_path / 'c.py'}:5"}  # (n_layer: the command line's, now)
    assert notes == [f"note: {tmp_path / 'c.py'}:2: helper is not a setting; ignored (a helper variable?)"]


def test_a_reader_that_leaves_early_stops_the_run_with_sigpipes_status(run_dir):
    """`mica train ... | head`: once the reader is gone mica stops (the run may not have started) and
    says so, with the status of a program killed by SIGPIPE (141), so `set -o pipefail` sees it."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "mica.cli", "train", *TINY, "--out_dir=piped"], cwd=run_dir,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.readline()
    p.stdout.close()  # (the reader leaves after one line; mica's next lines come after its compile)
    err = p.stderr.read()
    assert p.wait(timeout=300) == 141, err
    assert "mica: stopped: the program reading mica's output closed it" in err and "Traceback" not in err


def test_a_reader_that_leaves_after_training_started_stops_the_trainer(run_dir):
    """The reader leaves once the native trainer prints its steps: the trainer stops as a command in
    a pipe does (killed by SIGPIPE), instead of training on to max_iters with its lines discarded."""
    import signal
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "mica.cli", "train", *TINY, "--out_dir=piped_late",
                          "--max_iters=100000000", "--eval_interval=100000000"], cwd=run_dir,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("iter "):
            break
    p.stdout.close()
    try:
        rc = p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("the trainer went on training after its reader had left")
    assert rc == -signal.SIGPIPE, rc


def _edited_run(run_dir, name, **changes):
    """A copy of run_dir's run whose checkpoint metadata says `changes` (its CRCs made again, as a
    careful hand would): what sample, export and resume read from it is checked, not trusted."""
    import shutil

    from mica.train import checkpoint

    folder = run_dir / name
    shutil.copytree(run_dir / "out-shakespeare-char", folder)
    os.unlink(folder / ".mica.lock")
    st = checkpoint.SafeTensors(str(folder / "ckpt.safetensors"))
    meta = {k: v for k, v in st.metadata.items() if k not in ("crc32", "meta_crc32")}
    cfg = json.loads(meta["config"])
    cfg.update({k: v for k, v in changes.items() if k != "iter_num"})
    meta.update(config=json.dumps(cfg), **{k: v for k, v in changes.items() if k == "iter_num"})
    checkpoint.write(str(folder / "ckpt.safetensors"), {n: st.read(n) for n in st.names}, meta)
    return name


@pytest.mark.parametrize("changes,says,commands", [
    (dict(n_head=3), "its config says n_embd=16 with n_head=3, which does not divide it", "export train sample"),
    (dict(n_layer="x"), "n_layer must be int", "sample"),
    (dict(n_embd=-16), "its config says n_embd=-16, which must be positive", "export"),
    (dict(iter_num=str(2**70)), "has no readable iter_num / best_val_loss in its metadata", "train"),
    (dict(iter_num="-7"), "has no readable iter_num / best_val_loss in its metadata", "export"),
], ids=["n_head", "n_layer", "n_embd", "iter_huge", "iter_negative"])
def test_an_edited_checkpoints_settings_are_sentences(run_dir, changes, says, commands):
    name = _edited_run(run_dir, f"edited-{next(iter(changes))}-{abs(hash(str(changes))) % 1000}", **changes)
    if "export" in commands:
        pytest.importorskip("torch")
    args = {"export": ["export", name, "--to", f"{name}.pt"],
            "train": ["train", *TINY, f"--out_dir={name}", "--init_from=resume"],
            "sample": ["sample", f"--out_dir={name}", "--max_new_tokens=4", "--num_samples=1"]}
    for command in commands.split():  # (sample, export and resume read the config through one check)
        assert_sentence(mica(*args[command], cwd=run_dir), says)


def test_a_deeply_nested_metrics_line_is_dropped_by_a_resume_and_refused_by_plot(run_dir):
    import shutil

    shutil.copytree(run_dir / "out-shakespeare-char", run_dir / "nested")
    with open(run_dir / "nested" / "metrics.jsonl", "a") as f:
        f.write("[" * 100000 + "]" * 100000 + "\n")
    r = mica("plot", "nested", cwd=run_dir)
    assert "Traceback" not in r.stderr and r.returncode != 0
    r = mica("train", *TINY, "--out_dir=nested", "--init_from=resume", cwd=run_dir)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "[[[" not in (run_dir / "nested" / "metrics.jsonl").read_text()


def test_sigterm_while_compiling_stops_the_compilers_with_a_sentence(data, tmp_path):
    """SIGTERM (or SIGHUP) before the trainer starts is Ctrl-C's way out: the compiler's whole process
    group is killed (no gcc or cc1 left running without a parent), the sentence, status 128 + 15, and
    no folder left behind."""
    import signal
    import time

    root, _ = data
    cache = tmp_path / "own-cache"  # (nothing built yet: it compiles)
    p = subprocess.Popen([sys.executable, "-m", "mica.cli", "train", *TINY, "--n_embd=24", "--out_dir=stopped"],
                         cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "MICA_CACHE": str(cache)})
    for line in p.stdout:
        if line.startswith("compiling"):
            break
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM and "mica: stopped by SIGTERM" in err and "Traceback" not in err, err
    time.sleep(0.5)
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(cache).encode() in f.read():
                    left.append(pid)
        except OSError:
            pass
    assert not left, f"compilers left running: {left}"
    assert not (root / "stopped").exists()


def test_a_script_ending_in_a_mica_error_prints_its_sentence_not_a_traceback(tmp_path):
    """An uncaught Mica error ends a user's script as the mica command's do: its one sentence with
    the script's file:line, exit status 1; MICA_TRACEBACK=1 gives Python's traceback; an error that
    is not Mica's keeps Python's traceback; `from mica.optim import Rprop` is the missing verb's sentence."""
    script = tmp_path / "model.py"
    script.write_text("import mica\n\ndef f(x, w):\n    return x @ w\n\n"
                      "mica.compile(f, mica.f32[5, 6], mica.f32[4, 8])\n")
    other = tmp_path / "other.py"
    other.write_text("import mica\nraise ValueError('not mica')\n")
    own = tmp_path / "own.py"  # (a Mica error the user raises, without a line: Python's traceback shows where)
    own.write_text("import mica\nraise mica.MicaError('wrapped')\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    env.pop("MICA_TRACEBACK", None)
    run = lambda path, **extra: subprocess.run([sys.executable, str(path)], capture_output=True, text=True,  # noqa: E731
                                               cwd=tmp_path, env={**env, **extra})
    r = run(script)
    assert_sentence(r, "matmul: cannot multiply f32[5, 6] by f32[4, 8]", code=1)
    assert r.stderr.strip().endswith("(model.py:4)") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = run(script, MICA_TRACEBACK="1")
    assert r.returncode == 1 and "Traceback" in r.stderr and "ShapeError: matmul" in r.stderr, r.stderr
    r = run(other)
    assert r.returncode == 1 and "Traceback" in r.stderr and "ValueError: not mica" in r.stderr, r.stderr
    r = run(own)
    assert r.returncode == 1 and "own.py" in r.stderr and "MicaError: wrapped" in r.stderr, r.stderr
    unplaced = tmp_path / "unplaced.py"  # (one Mica raises without a line: the user's call into Mica names it)
    unplaced.write_text("import mica\n\nmica.nn.Parameter()\n")
    r = run(unplaced)
    assert_sentence(r, "a Parameter needs initial data or a shape", code=1)
    assert r.stderr.strip().endswith("(unplaced.py:3)") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    ported = tmp_path / "port.py"  # (a name torch's module has and Mica's lacks, imported by name)
    ported.write_text("import mica\nimport numpy\nfrom mica.optim import Rprop\n")
    r = run(ported)
    assert_sentence(r, "Mica has no mica.optim.Rprop (torch.optim.Rprop); write it from what mica.optim has", code=1)
    assert r.stderr.strip().endswith("(port.py:3)") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" in run(ported, MICA_TRACEBACK="1").stderr
    (tmp_path / "theirs.py").write_text("import mica\nfrom numpy import Rprop\n")  # (not Mica's: Python's)
    assert "Traceback" in run(tmp_path / "theirs.py").stderr
    # (an outside tester's: under python -c, or a script on stdin, Python names the code "<string>" or
    # "<stdin>", and a Mica error raised without a line printed a traceback through Mica's frames)
    code = "import numpy as np, mica\nmica.nn.functional.group_norm(np.zeros((2, 6, 4), np.float32), 4)\n"
    for cmd, stdin, where in (([sys.executable, "-c", code], None, "<string>:2"), ([sys.executable, "-"], code,
                                                                                 "<stdin>:2")):
        r = subprocess.run(cmd, input=stdin, capture_output=True, text=True, cwd=tmp_path, env=env)
        assert_sentence(r, "group_norm: 6 channels do not divide into num_groups=4 groups", code=1)
        assert r.stderr.strip().endswith(f"({where})") and len(r.stderr.strip().splitlines()) == 1, r.stderr


def _cli_env(data_root, **extra):
    """`python -m mica.cli` in data_root with environment additions (a build cache of its own)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "MICA_CACHE": str(data_root / "cache"), **extra}
    return lambda *args, **kw: subprocess.run([sys.executable, "-m", "mica.cli", *args], cwd=data_root, env=env,
                                              capture_output=True, text=True, **kw)


def test_a_compiler_that_writes_nothing_is_a_failed_build_never_a_cache_entry(data):
    """CC=true exits 0 and writes no object: one sentence, twice (nothing was kept to run)."""
    root, _ = data
    run = _cli_env(root, CC="true")
    for _ in range(2):
        assert_sentence(run("train", *TINY), "reported success but wrote nothing")
    kept = [os.path.join(d, f) for d, _, fs in os.walk(root / "cache") for f in fs if f.endswith((".o", "trainer"))]
    assert kept == [], kept


def test_a_cache_write_that_fails_leaves_nothing_and_names_the_file(tmp_path, monkeypatch):
    """A full disk under the cache: the temporary file is removed and the sentence names the file;
    the mfu's ceiling, which only a log line needs, is skipped instead of stopping the run."""
    import errno

    from mica.backends.c import build
    from mica.errors import MicaError
    from mica.train import programs

    real = os.fdopen

    class Full:
        def __init__(self, fd, *a, **k):
            self.f = real(fd, *a, **k)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", Full)
    with pytest.raises(MicaError, match=r"cannot write .*program\.c \(No space left on device\); free space there"):
        build.write_whole(str(tmp_path / "program.c"), "int x;")
    assert os.listdir(tmp_path) == []
    monkeypatch.setenv("MICA_CACHE", str(tmp_path))
    assert programs.peak_flops() > 0 and os.listdir(tmp_path) == []


def test_system_errors_without_a_path_say_what_to_do(tmp_path):
    """Errors whose cause is not a file: too many open files names the limit, a full disk the
    folders to free, a trainer that cannot start on a noexec cache says so; a deleted working
    folder does not break naming a user's line."""
    import errno

    from mica.cli import _os_error_sentence
    from mica.errors import format_loc
    from mica.train.run import cannot_run

    assert "ulimit -n" in _os_error_sentence(OSError(errno.EMFILE, "Too many open files"))
    assert "MICA_CACHE" in _os_error_sentence(OSError(errno.ENOSPC, "No space left on device"))
    assert "noexec" in str(cannot_run("/c/mica-trainer", PermissionError(errno.EACCES, "Permission denied")))
    gone = tmp_path / "gone"
    gone.mkdir()
    here = os.getcwd()
    try:
        os.chdir(gone)
        gone.rmdir()
        assert format_loc(("/x/model.py", 3)) == "/x/model.py:3"
    finally:
        os.chdir(here)


def test_a_build_sweeps_what_a_killed_build_left_in_its_cache_entry(tmp_path, monkeypatch):
    """A build killed outright leaves its temporaries (tmpXXXXXXXX.part, name.XXXXXXXX.o); the next
    build of the entry removes those older than an hour and keeps anything else."""
    import time

    import mica as m

    monkeypatch.setenv("MICA_CACHE", str(tmp_path))
    step = lambda x: (x * 2).sum()  # noqa: E731
    entry = os.path.dirname(m.compile(step, m.f32[3]).library)
    old = [os.path.join(entry, n) for n in ("tmpab12cd34.part", "tmpzz99yy88.so", "train.k3j4h5g6.o")]
    young, other = os.path.join(entry, "tmpqq11ww22.part"), os.path.join(entry, "notes.txt")
    for path in [*old, young, other]:
        open(path, "w").close()
    for path in old + [other]:
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    os.unlink(os.path.join(entry, "libmica_program.so"))  # (so the entry is built again)
    assert m.compile(step, m.f32[3])(np.ones(3, np.float32)) == 6
    assert [os.path.exists(p) for p in old] == [False] * 3 and os.path.exists(young) and os.path.exists(other)


def _header_edited_run(run_dir, name, edit):
    """A copy of run_dir's run whose checkpoint header `edit(header)` changes a tensor's dtype or
    shape over the same bytes, so every CRC-32 (which covers the bytes) still matches."""
    import shutil
    import struct

    folder = run_dir / name
    shutil.copytree(run_dir / "out-shakespeare-char", folder)
    os.unlink(folder / ".mica.lock")
    raw = (folder / "ckpt.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    (folder / "ckpt.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n:])  # (offsets are
    return name                                                                                  # the data's own)


def _retype(name, dtype):
    def edit(h):
        h[name]["dtype"] = dtype
    return edit


def _reshape(name, shape):
    def edit(h):
        h[name]["shape"] = shape
    return edit


@pytest.mark.parametrize("edit,says,commands", [
    (_retype("data.next_offsets", "F64"), "its data position (data.next_offsets) is float64[", "train"),
    (_reshape("data.next_offsets", [4, -1]), "malformed entry", "train"),
    (lambda h: h["data.next_offsets"].update(shape=[], data_offsets=[h["data.next_offsets"]["data_offsets"][0],
                                                                      h["data.next_offsets"]["data_offsets"][0] + 8]),
     "its data position (data.next_offsets) is int64[], not one int64 offset a row", "train"),
], ids=["offsets-float64", "offsets-negative-dim", "offsets-0d"])
def test_a_checkpoint_header_that_retypes_its_data_position_is_damage(run_dir, edit, says, commands):
    """The CRC-32s cover a tensor's bytes, not its header entry: a data position the header calls
    float64 (the same bytes: a resume from other batches, rc 0, before) or 0-d (an IndexError) is
    one sentence saying the checkpoint is damaged."""
    name = _header_edited_run(run_dir, f"hdr-{abs(hash(says)) % 10000}", edit)
    for command in commands.split():
        assert_sentence(mica("train", *TINY, f"--out_dir={name}", "--init_from=resume", cwd=run_dir), says)


def test_a_checkpoint_header_that_transposes_the_embedding_is_damage_not_the_datas_fault(run_dir):
    """wte's shape given as [n_embd, vocabulary] over the same bytes: resume and sample say the
    checkpoint is damaged (they blamed the data's token ids, or its vocabulary, before)."""
    import re as _re

    def edit(h):
        h["transformer.wte.weight"]["shape"] = h["transformer.wte.weight"]["shape"][::-1]
    name = _header_edited_run(run_dir, "hdr-wte", edit)
    says = _re.compile(r"is damaged: its transformer\.wte\.weight is \[16, \d+\], not \[vocabulary, 16\]")
    for r in (mica("train", *TINY, f"--out_dir={name}", "--init_from=resume", cwd=run_dir),
              mica("sample", f"--out_dir={name}", "--max_new_tokens=4", "--num_samples=1", cwd=run_dir)):
        assert r.returncode == 2 and says.search(r.stderr) and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("meta", ["meta.json", "meta.pkl"])
def test_a_pipe_in_place_of_the_vocabulary_file_is_refused_not_waited_on(data, meta):
    """A FIFO where the data folder's meta.json or meta.pkl belongs made train wait forever for a
    writer (token files that are pipes were already refused): now one sentence, at once."""
    root, d = data
    for name in ("meta.json", "meta.pkl"):  # (the pipe the folder's only vocabulary file)
        os.unlink(d / name)
    os.mkfifo(d / meta)
    assert_sentence(mica("train", *TINY, cwd=root), f"vocabulary file data/shakespeare_char/{meta} is not a regular file")
