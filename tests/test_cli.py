"""The `mica` command as a user runs it."""
import subprocess
import sys

import pytest


def _mica(*args):
    return subprocess.run([sys.executable, "-m", "mica.cli", *args], capture_output=True, text=True)


def test_inspect_counts_parameters_like_nanogpt():
    r = _mica("inspect", "--n_layer=6", "--n_head=6", "--n_embd=384", "--block_size=256", "--vocab_size=65",
              "--bias=False")
    assert r.returncode == 0, r.stderr
    assert "number of parameters: 10.65M" in r.stdout
    # any n_layer is counted at once (a model of 100000 blocks was built, and the kernel killed it), and
    # the count is the built model's: GPT-2 small's 123.69M, and 1000 of its blocks
    r = _mica("inspect", "--n_layer=100000", "--n_embd=100000", "--n_head=1")
    assert r.returncode == 0 and "number of parameters: 12000135030.60M" in r.stdout, r.stderr
    assert "number of parameters: 123.69M" in _mica("inspect", "--n_layer=12", "--n_head=12", "--n_embd=768").stdout
    from mica.models.gpt import GPT, GPTConfig

    built = GPT(GPTConfig(n_layer=7, n_head=2, n_embd=40, block_size=9, vocab_size=11, bias=True)).get_num_params()
    r = _mica("inspect", "--n_layer=7", "--n_head=2", "--n_embd=40", "--block_size=9", "--vocab_size=11")
    assert f"number of parameters: {built / 1e6:.2f}M" in r.stdout


def test_inspect_prints_the_step_ir():
    r = _mica("inspect", "--ir", "--n_layer=1", "--n_head=2", "--n_embd=8", "--block_size=4", "--vocab_size=7")
    assert r.returncode == 0, r.stderr
    assert " = attention_backward " in r.stdout and "gpt.py:" in r.stdout
    # without a config, --dtype too: the step under autocast (it was an unknown setting)
    r = _mica("inspect", "--ir", "--n_layer=1", "--n_head=2", "--n_embd=8", "--block_size=4", "--vocab_size=7",
              "--dtype=bfloat16")
    assert r.returncode == 0, r.stderr
    assert ":bf16[4, 7] = matmul" in r.stdout and "cast" in r.stdout  # (the head; a product with a bias keeps
    assert ":f32[4, 24] = matmul" in r.stdout and "dtype=f32" in r.stdout  # its float32 sums for the bias)


def test_unknown_setting_names_the_nearest_one():
    r = _mica("inspect", "--n_layr=3")
    assert r.returncode == 2
    assert r.stderr.strip() == "mica: error: unknown setting 'n_layr'; did you mean 'n_layer'?"
    assert "Traceback" not in r.stderr
    # python -m mica is the mica command too, its status included
    r = subprocess.run([sys.executable, "-m", "mica", "inspect", "--n_layr=3"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().endswith("did you mean 'n_layer'?")


def test_inspect_reads_config_files_as_mica_train_does(tmp_path):
    """A nanoGPT config describes the model mica train builds from it (train.py's bias=False, the
    data folder's vocabulary), not model.py's GPTConfig defaults."""
    (tmp_path / "more.py").write_text("n_layer = 2\n")
    r = subprocess.run([sys.executable, "-m", "mica.cli", "inspect", "shakespeare_char", "--vocab_size=65"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "number of parameters: 10.65M" in r.stdout and "bias=False" in r.stdout and "dropout=0.2" in r.stdout
    r = subprocess.run([sys.executable, "-m", "mica.cli", "inspect", "shakespeare_char", "more.py", "--n_embd=64",
                        "--n_head=4"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "n_layer=2, n_head=4, n_embd=64" in r.stdout and "vocab_size=50304" in r.stdout  # (no data folder here)
    assert "note: the data folder data/shakespeare_char does not exist, so the model takes GPT-2's vocabulary" in \
        r.stdout  # (said, as mica train would: a silent 50304 misled a user about the model's size)
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)  # (a folder without meta.json / meta.pkl)
    r = subprocess.run([sys.executable, "-m", "mica.cli", "inspect", "shakespeare_char", "--n_layer=1"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert "note: no meta.json or meta.pkl in the data folder: defaulting to vocab_size of GPT-2" in r.stdout


def test_inspect_ir_of_a_config_is_the_train_program_in_its_dtype(tmp_path):
    """With a config, --ir shows the train program mica train builds: under --dtype=bfloat16 its
    autocast casts and bfloat16 products, and gradient accumulation's micro-batches."""
    common = ["inspect", "shakespeare_char", "--ir", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=8",
              "--batch_size=2", "--vocab_size=11"]
    outs = {}
    for dtype in ("float32", "bfloat16"):
        r = subprocess.run([sys.executable, "-m", "mica.cli", *common, f"--dtype={dtype}",
                            "--gradient_accumulation_steps=2"], capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        outs[dtype] = r.stdout
    assert "bf16[" not in outs["float32"] and "= cast " in outs["bfloat16"] and "bf16[2, 8, 16]" in outs["bfloat16"]
    assert "i64[2, 2, 8]" in outs["float32"]  # (the two micro-batches of x, as the trainer feeds them)


def test_ctrl_c_while_the_mica_command_starts_is_its_sentence_not_a_traceback():
    """The command's imports take a while on a loaded machine: a Ctrl-C then ends it as one later
    does (status 130, "mica: interrupted"), where Python printed a traceback from an import. Only the
    command: a program importing mica keeps Python's KeyboardInterrupt."""
    # (Python's own start where SIGINT is not ignored: a shell's background job, as CI's may be, ignores it)
    starting = ("import os, signal, sys, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
                "sys.argv[0] = '/usr/bin/mica'\nimport mica\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\n")
    r = subprocess.run([sys.executable, "-c", starting], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (130, "mica: interrupted\n")
    r = subprocess.run([sys.executable, "-c", starting.replace("/usr/bin/mica", "train.py")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 130 and "KeyboardInterrupt" in r.stderr


def test_inspect_refuses_the_settings_mica_train_refuses(tmp_path):
    """--ir shows the program mica train would build: settings train refuses are refused here too,
    in its words and at the config's line (not an internal error, nor a program of empty batches)."""
    (tmp_path / "tiny.py").write_text("n_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 8\nbatch_size = 2\n")
    (tmp_path / "bad.py").write_text("n_embd = 60\nn_head = 7\n")
    for flag, said in (("--gradient_accumulation_steps=0", "gradient_accumulation_steps must be positive, got 0"),
                       ("--batch_size=0", "batch_size must be positive, got 0"),
                       ("--dropout=1.5", "dropout must be in [0, 1), got 1.5")):
        r = subprocess.run([sys.executable, "-m", "mica.cli", "inspect", "tiny.py", "--ir", flag], cwd=tmp_path,
                           capture_output=True, text=True)
        assert (r.returncode, r.stderr.strip()) == (2, f"mica: error: {said}"), r.stderr
    r = subprocess.run([sys.executable, "-m", "mica.cli", "inspect", "bad.py"], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.stderr.strip() == "mica: error: the width n_embd (60, set at bad.py:1) must be divisible by n_head (7, set at bad.py:2); " \
        "give n_head a divisor of n_embd", r.stderr


@pytest.mark.parametrize("command", [["bench"], ["check", "--method", "b"]])
def test_bench_and_check_without_pytorch_say_so(command, monkeypatch, capsys):
    import importlib.util

    from mica import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert cli.main(command) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mica: error: mica {command[0]} runs PyTorch beside Mica, and PyTorch is not installed") \
        and err.count("\n") == 1, err
