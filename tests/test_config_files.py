"""nanoGPT's command line as its configurator reads it: config files and --key=value settings in
the order given, each file run over the settings before it."""
import pytest

from helpers import mica_cli
from mica.errors import MicaError
from mica.train import config as config_mod


def _write(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def test_config_files_apply_in_order_with_settings_between(tmp_path):
    a = _write(tmp_path, "a.py", "n_layer = 2\nbatch_size = 4\n")
    b = _write(tmp_path, "b.py", "batch_size = 8\n")
    cfg = config_mod.load(a, ["--batch_size=6", "--n_layer=3", b])
    assert (cfg["n_layer"], cfg["batch_size"]) == (3, 8)  # b.py's batch_size comes after the flag
    assert cfg.origin == {"batch_size": f"{b}:1"}  # (n_layer: the command line's, so no line)
    cfg = config_mod.load(a, [b, "--batch_size=6"])
    assert cfg["batch_size"] == 6 and cfg.origin == {"n_layer": f"{a}:1"}


def test_a_config_file_reads_the_settings_before_it(tmp_path):
    """As in nanoGPT, where every config file runs in train.py's globals."""
    first = _write(tmp_path, "first.py", "max_iters = 100\n")
    double = _write(tmp_path, "double.py", "max_iters = max_iters * 2\nlr_decay_iters = max_iters\n"
                                           "tokens = batch_size * block_size\n")
    notes = []
    cfg = config_mod.load("shakespeare_char", [first, "--batch_size=3", double], notes.append)
    assert (cfg["max_iters"], cfg["lr_decay_iters"]) == (200, 200)
    assert notes == [f"note: {double}:3: tokens is not a setting; ignored (a helper variable?)"]
    assert cfg["block_size"] == 256 and cfg["batch_size"] == 3  # (read, not changed: still the config's and flag's)


def test_an_assignment_that_ran_counts_even_with_the_same_value(tmp_path):
    """dtype given in a file is given, even where it equals the default (a CPU run then trains in it);
    an assignment in a branch that did not run is not."""
    same = _write(tmp_path, "same.py", "device = 'cpu'\ndtype = 'bfloat16'\n")
    assert config_mod.load(same)["dtype"] == "bfloat16"
    assert config_mod.load(same).origin["dtype"] == f"{same}:2"
    skipped = _write(tmp_path, "skipped.py", "device = 'cpu'\nif device == 'cuda':\n    dtype = 'bfloat16'\n")
    assert config_mod.load(skipped)["dtype"] == "float32"  # (nanoGPT trains float32 on a CPU)
    assert "dtype" not in config_mod.load(skipped).origin


def test_the_recipe_follows_the_configs(tmp_path):
    plain = _write(tmp_path, "plain.py", "recipe = 'speedrun'\ntrain_steps = 7\n")
    computed = _write(tmp_path, "computed.py", "recipe = 'speed' + 'run'\ntrain_steps = 9\n")
    assert config_mod.load(plain)["train_steps"] == 7
    assert config_mod.load(computed)["train_steps"] == 9  # (read again with the speedrun's settings)
    assert config_mod.load("speedrun_tiny", [plain])["train_steps"] == 7
    assert config_mod.load("speedrun_tiny", [plain, "--train_steps=3"])["train_steps"] == 3
    with pytest.raises(MicaError, match="unknown setting 'n_layer'"):
        config_mod.load(plain, ["--n_layer=2"])


def test_a_config_runs_once(tmp_path):
    counter = tmp_path / "runs.txt"
    c = _write(tmp_path, "c.py", f"with open({str(counter)!r}, 'a') as f:\n    f.write('x')\nn_layer = 2\n")
    assert config_mod.load(c)["n_layer"] == 2
    assert counter.read_text() == "x"


def test_mica_train_takes_two_configs_as_nanogpt_does(tmp_path):
    """`mica train a.py b.py --key=value` trains with both, as nanoGPT's `train.py a.py b.py` would."""
    from mica.data.prepare import prepare_char

    d = tmp_path / "data" / "shakespeare_char"
    d.mkdir(parents=True)
    prepare_char("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40, str(d), log=lambda *a: None)
    _write(tmp_path, "model.py", "n_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 16\n")
    _write(tmp_path, "run.py", "batch_size = 2\neval_iters = 1\neval_interval = 2\nmax_iters = 3\n"
                               "log_interval = 1\nout_dir = 'two'\n")
    r = mica_cli("train", "shakespeare_char", "model.py", "--device=cpu", "run.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "iter 3:" in r.stdout and "iter 4:" not in r.stdout and (tmp_path / "two" / "metrics.jsonl").exists()
    help_text = mica_cli("train", "shakespeare_char", "model.py", "--help", cwd=tmp_path).stdout
    assert "values after shakespeare_char model.py" in help_text and "--n_embd=16" in help_text


def test_plot_reads_nanogpt_and_speedrun_rows(tmp_path):
    """nanoGPT's evaluations carry train and val estimates; the speedrun's validations only val_loss:
    both are plotted (and a name without an extension gets the .png matplotlib writes)."""
    pytest.importorskip("matplotlib")
    from mica.train import plot

    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 0, "val_loss": 4.5, "train_time": 0.1}\n{"iter": 0, "loss": 4.6}\n{"iter": 1, "loss": 4.4}\n'
        '{"step": 2, "val_loss": 4.2, "train_time": 0.3}\n{"step": 4, "train_loss": 4.0, "val_loss": 4.1}\n')
    iters, evals = plot.read_metrics(str(tmp_path))
    assert iters == {0: 4.6, 1: 4.4}
    assert evals == {0: (None, 4.5), 2: (None, 4.2), 4: (4.0, 4.1)}
    assert plot.plot(str(tmp_path), str(tmp_path / "curves")) == str(tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_later_config_files_see_what_earlier_ones_defined(tmp_path):
    """One namespace for every file, as in nanoGPT: a helper or import of a.py is there in b.py (and
    its note is said once, where it was made)."""
    a = _write(tmp_path, "a.py", "import math\nbase_lr = 1e-3\n")
    b = _write(tmp_path, "b.py", "learning_rate = base_lr * math.sqrt(4)\n")
    notes = []
    cfg = config_mod.load(a, [b], notes.append)
    assert cfg["learning_rate"] == 2e-3
    assert notes == [f"note: {a}:2: base_lr is not a setting; ignored (a helper variable?)"]


def test_a_config_imports_from_the_current_folder(tmp_path, monkeypatch):
    """nanoGPT runs `python train.py config/x.py` in its folder, which is on the module path: a
    config may import a module there (or another config, `from config.base import *`)."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "base.py").write_text("n_layer = 3\nn_head = 2\n")
    (tmp_path / "helpers_of_mine.py").write_text("WIDTH = 96\n")
    _write(tmp_path, "config/child.py", "from config.base import *\nimport helpers_of_mine\n"
                                        "n_embd = helpers_of_mine.WIDTH\n")
    monkeypatch.chdir(tmp_path)
    cfg = config_mod.load("config/child.py")
    assert (cfg["n_layer"], cfg["n_head"], cfg["n_embd"]) == (3, 2, 96)
    assert str(tmp_path) not in __import__("sys").path  # (only while the file runs)


def test_whole_floats_are_iteration_counts_as_in_nanogpt(tmp_path):
    """A config's `max_iters / 10` is a float; nanoGPT runs with it. A whole one is taken as the int;
    the schedule's counts keep a fraction (nanoGPT's get_lr computes with it); elsewhere a fraction
    is refused with the line."""
    c = _write(tmp_path, "c.py", "max_iters = 50\nwarmup_iters = max_iters / 10\nlr_decay_iters = max_iters * 1.5\n"
                                 "eval_interval = 10.0\n")
    cfg = config_mod.load(c)
    assert (cfg["warmup_iters"], cfg["lr_decay_iters"], cfg["eval_interval"]) == (5, 75, 10)
    assert all(type(cfg[k]) is int for k in ("warmup_iters", "lr_decay_iters", "eval_interval"))
    frac = _write(tmp_path, "frac.py", "warmup_iters = 2.5\nlr_decay_iters = 7.25\n")
    cfg = config_mod.load(frac)
    assert (cfg["warmup_iters"], cfg["lr_decay_iters"]) == (2.5, 7.25)
    from mica.optim.schedules import cosine_with_warmup
    lr = cosine_with_warmup(4, 1e-3, cfg["warmup_iters"], cfg["lr_decay_iters"], 1e-4)
    import math
    assert lr == 1e-4 + 0.5 * (1.0 + math.cos(math.pi * ((4 - 2.5) / (7.25 - 2.5)))) * (1e-3 - 1e-4)  # (get_lr's)
    bad = _write(tmp_path, "bad.py", "batch_size = 12 / 5\n")
    with pytest.raises(MicaError, match=r"bad.py:1: batch_size must be a whole number \(like its default 12\), got 2.4"):
        config_mod.load(bad)
    for value in ("float('inf')", "float('nan')"):
        with pytest.raises(MicaError, match="lr_decay_iters must be a whole number"):
            config_mod.load(_write(tmp_path, "inf.py", f"lr_decay_iters = {value}\n"))


def test_type_errors_name_the_real_default_and_a_value(tmp_path):
    with pytest.raises(MicaError, match=r"n_embd must be a whole number \(like its default 768\), got 2.5"):
        config_mod.load(None, ["--n_embd=32", "--n_embd=2.5"])
    c = _write(tmp_path, "c.py", "n_embd = 64\n")
    with pytest.raises(MicaError, match=r"n_embd must be int \(like its default 768\), got '64'"):
        config_mod.load(c, ["--n_embd='64'"])
    with pytest.raises(MicaError, match=r"e.g. --max_iters=3$"):
        config_mod.load(None, ["--max_iters", "3"])


def test_a_flag_without_its_value_before_a_config_suggests_true(tmp_path):
    with pytest.raises(MicaError, match=r"e.g. --eval_only=True$"):
        config_mod.load(None, ["--eval_only", "shakespeare_char"])
    with pytest.raises(MicaError, match=r"e.g. --eval_only=True$"):
        config_mod.load(None, ["--eval_only", "config/missing.py"])
    # a setting that is not yes/no: its default as the example of its type (True would be refused)
    with pytest.raises(MicaError, match=r"e.g. --learning_rate=0.0006$"):
        config_mod.load(None, ["--learning_rate"])
    with pytest.raises(MicaError, match=r"e.g. --out_dir=out$"):
        config_mod.load(None, ["--out_dir", "shakespeare_char"])


def test_settings_must_fit_in_64_bits_and_numpy_numbers_are_numbers(tmp_path):
    """A count beyond 64 bits is one sentence naming the setting (it reached the trainer's manifest,
    which called itself damaged); a config's numpy scalars are the numbers they are, as in nanoGPT."""
    for item in ("--eval_interval=99999999999999999999", "--max_iters=1e30", "--max_iters=-9223372036854775809"):
        with pytest.raises(MicaError, match=r"does not fit in 64 bits"):
            config_mod.load(None, [item])
    assert config_mod.load(None, ["--max_iters=9223372036854775807"])["max_iters"] == 2 ** 63 - 1
    c = _write(tmp_path, "np.py", "import numpy as np\nbatch_size = np.int64(4)\nlearning_rate = np.float64(2e-3)\n"
                                  "bias = np.bool_(True)\n")
    cfg = config_mod.load(c)
    assert (cfg["batch_size"], cfg["learning_rate"], cfg["bias"]) == (4, 2e-3, True)
    assert (type(cfg["batch_size"]), type(cfg["learning_rate"]), type(cfg["bias"])) == (int, float, bool)


def test_a_deleted_current_folder_does_not_break_an_absolute_config(tmp_path, monkeypatch):
    c = _write(tmp_path, "c.py", "n_layer = 2\n")
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert config_mod.load(c)["n_layer"] == 2


def test_a_wider_dtype_than_nanogpts_is_pointed_to_float32(tmp_path):
    from mica.train import config

    assert config._dtype_meant("float64").endswith("float32 is the widest type nanoGPT's recipe trains in: did you "
                                                   "mean 'float32'?")
    assert config._dtype_meant("torch.double").endswith("did you mean 'float32'?")
    assert config._dtype_meant("BF16") == "; did you mean 'bfloat16'?"


def test_a_config_sees_what_train_py_imported_as_in_nanogpt(tmp_path, monkeypatch):
    """nanoGPT runs a config in train.py's globals, after its imports: os, time, math, pickle,
    nullcontext, np and torch are there (torch imported only when used), and none is a helper of the
    config's own to note."""
    import torch

    path = _write(tmp_path, "g.py", "dtype = 'bfloat16' if torch.cuda.is_available() else 'float32'\n"
                                    "out_dir = os.path.join('out', 'g')\nmax_iters = int(math.sqrt(16)) + "
                                    "int(np.int64(1))\nwith nullcontext():\n    eval_iters = 3\n"
                                    "here = os.path.dirname(__file__)\n")
    monkeypatch.chdir(tmp_path)
    notes = []
    cfg = config_mod.load(path, [], notes.append)
    assert (cfg["dtype"], cfg["out_dir"], cfg["max_iters"], cfg["eval_iters"]) == \
        ("bfloat16" if torch.cuda.is_available() else "float32", "out/g", 5, 3)
    assert notes == [f"note: {path}:6: here is not a setting; ignored (a helper variable?)"]


def test_sample_settings_know_which_were_given(tmp_path):
    """mica sample notes a dtype only where one was given (sample.py's default float32 is not one):
    a flag, a config file's assignment or a built-in config's setting counts, a default does not."""
    from mica.cli import SAMPLE_DEFAULTS

    s = config_mod.load_script_settings(["--top_k=5"], SAMPLE_DEFAULTS, nullable=("top_k",))
    assert s.given == {"top_k"} and s["dtype"] == "float32"
    path = _write(tmp_path, "c.py", "dtype = 'bfloat16'\nn_layer = 3\n")
    s = config_mod.load_script_settings([path, "--seed=2"], SAMPLE_DEFAULTS, nullable=("top_k",))
    assert {"dtype", "seed"} <= s.given and "top_k" not in s.given and s["dtype"] == "bfloat16"
