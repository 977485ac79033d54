"""The speedrun recipe's settings and commands: built-in configs, config files with recipe =
"speedrun", --help, mica inspect, and every bad setting as one sentence."""
import pytest

from helpers import mica_cli
from mica.errors import MicaError
from mica.train import config as config_mod


def test_the_builtin_speedrun_is_the_seeds_settings():
    cfg = config_mod.load("speedrun")
    assert cfg["recipe"] == "speedrun"
    assert (cfg["train_steps"], cfg["batch_size"], cfg["seq_len"], cfg["mbs"], cfg["val_tokens"], cfg["val_every"]) == \
        (3500, 524288, 1024, 64, 10485760, 125)
    assert (cfg["embed_lr"], cfg["head_lr"], cfg["scalar_lr"], cfg["muon_lr"], cfg["muon_weight_decay"]) == \
        (0.3, 1 / 320, 0.01, 0.025, 0.0125)
    assert cfg["train_files"] == "data/fineweb10B/fineweb_train_*.bin" and cfg["cooldown_frac"] == 0.7
    tiny = config_mod.check_speedrun(config_mod.load("speedrun_tiny"))
    assert (tiny["num_layers"], tiny["model_dim"], tiny["seq_len"], tiny["device"]) == (4, 256, 256, "cpu")
    assert "n_layer" not in cfg and "block_size" not in cfg  # nanoGPT's keys are not the speedrun's


def test_a_config_file_with_recipe_speedrun_takes_its_keys(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text('recipe = "speedrun"\ntrain_steps = 10\nmodel_dim = 256\n')
    cfg = config_mod.load(str(path), ["--mbs=2"])
    assert (cfg["train_steps"], cfg["model_dim"], cfg["mbs"], cfg["num_layers"]) == (10, 256, 2, 12)
    with pytest.raises(MicaError, match="unknown setting 'n_layers'; did you mean 'num_layers'"):
        config_mod.load(str(path), ["--n_layers=2"])
    assert config_mod.load(None)["recipe"] == "nanogpt"


@pytest.mark.parametrize("override,message", [
    ("--batch_size=1000", "batch_size (1,000) must be a multiple of mbs * seq_len (1,024)"),
    ("--val_tokens=100", "val_tokens (100) must be a multiple of mbs * seq_len"),
    ("--head_dim=6", "model_dim (256) must be a multiple of head_dim (6)"),
    ("--cooldown_frac=1.5", "cooldown_frac must be in [0, 1]"),
    ("--ns_dtype=float16", "ns_dtype must be 'bfloat16' or 'float32'"),
    ("--dtype=float16", "dtype must be 'bfloat16' (the seed's) or 'float32' for the speedrun recipe"),
    ("--init_from=gpt2", "init_from must be scratch, resume or PATH.safetensors"),
    ("--train_steps=0", "train_steps must be positive"),
    ("--stop_at=400", "stop_at must be 0 or a step from 1 to train_steps (300)"),
    ("--recipe=modded", "recipe must be 'nanogpt' or 'speedrun'"),
    # nanoGPT's names: the speedrun's own setting, not a look-alike (data_dir is not out_dir)
    ("--data_dir=d", "unknown setting 'data_dir'; the speedrun recipe's setting for it is train_files and val_files"),
    ("--block_size=64", "unknown setting 'block_size'; the speedrun recipe's setting for it is seq_len"),
    ("--eval_iters=2", "unknown setting 'eval_iters'; the speedrun recipe's setting for it is val_tokens"),
])
def test_bad_speedrun_settings_are_sentences(override, message):
    with pytest.raises(MicaError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]").replace("*", r"\*")):
        config_mod.check_supported(config_mod.load("speedrun_tiny", [override]))


def test_help_inspect_and_missing_shards_from_the_command_line(tmp_path):
    r = mica_cli("train", "speedrun", "--help", cwd=tmp_path, check=True)
    for key in ("--train_files=", "--val_every=125", "--muon_lr=0.025", "--cooldown_frac=0.7", "--stop_at=0"):
        assert key in r.stdout
    r = mica_cli("inspect", "speedrun", cwd=tmp_path, check=True)
    assert "number of parameters: 162,354,816" in r.stdout
    r = mica_cli("inspect", "speedrun_tiny", cwd=tmp_path, check=True)  # (no shards here: GPT-2's size, said)
    assert "note: vocab_size=0 follows the shards' meta.json, which cannot be read" in r.stdout
    assert "speedrun GPT(vocab_size=50304," in r.stdout
    r = mica_cli("inspect", "speedrun_tiny", "--ir", "--num_layers=1", "--model_dim=64", "--head_dim=32",
                 "--vocab_size=64", "--batch_size=512", "--mbs=1", "--val_tokens=256", cwd=tmp_path, check=True)
    assert "params['blocks.0.attn.q.weight']" in r.stdout and "opt_state['optimizer2']['momentum']" in r.stdout
    r = mica_cli("train", "speedrun_tiny", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "vocab_size=0 follows the data's meta.json, but data/speedrun_tiny has none" in r.stderr or \
        "no training data files match data/speedrun_tiny/train_*.bin" in r.stderr
    r = mica_cli("train", "speedrun_tiny", "--vocab_size=128", cwd=tmp_path)
    assert "no training data files match data/speedrun_tiny/train_*.bin; prepare shards first" in r.stderr


def test_a_resume_with_data_of_another_vocabulary_is_refused_before_compiling(tmp_path):
    """The checkpoint's embedding says its vocabulary; this run's comes from vocab_size or the data
    (vocab_size=0 in both configs says nothing), checked before the build."""
    import json

    import numpy as np

    from mica.train import checkpoint, run

    cfg = config_mod.load("speedrun_tiny", [f"--out_dir={tmp_path}", "--init_from=resume"])
    checkpoint.write(str(tmp_path / "ckpt.safetensors"), {"embed.weight": np.zeros((384, 4), np.float32)},
                     {"format": "mica", "iter_num": "20", "config": json.dumps(dict(cfg))})
    with pytest.raises(MicaError, match=r"has a vocabulary of 384 tokens, but this run's is 128 \(from vocab_size or "
                                        r"the data's meta.json\)"):
        run._check_speedrun_resume(cfg, str(tmp_path), 128, lambda s: None)
    assert run._check_speedrun_resume(cfg, str(tmp_path), 384, lambda s: None) == 20
