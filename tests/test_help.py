"""`mica train --help` and `mica sample --help` list every setting with its default and a line
about it, nanoGPT's apart from Mica's."""
import subprocess
import sys

from mica.cli import SAMPLE_DEFAULTS, SAMPLE_NANOGPT
from mica.train.config import BUILTIN_CONFIGS, DEFAULTS, DESCRIPTIONS, MICA_DEFAULTS


def _help(*args):
    r = subprocess.run([sys.executable, "-m", "mica.cli", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    return r.stdout.splitlines()


def _listed(lines, title):
    """{key: (default text, description)} of the lines under `title` until the next blank line."""
    start = lines.index(title) + 1
    out = {}
    for line in lines[start:]:
        if not line.strip():
            break
        setting, description = line.strip().split(None, 1)
        key, default = setting[2:].split("=", 1)
        out[key] = (default, description)
    return out


def test_train_help_lists_every_setting_with_its_default():
    for flag in ("--help", "-h"):
        lines = _help("train", flag)
        assert lines[0] == "usage: mica train [CONFIG ...] [--key=value ...]"
        nanogpt = _listed(lines, "nanoGPT's settings (train.py):")
        mica = _listed(lines, "Mica's settings:")
        # (nanoGPT's train.py has no seed setting: it seeds with 1337 itself, so seed is listed as Mica's)
        assert list(nanogpt) == [k for k in DEFAULTS if k != "seed"] and list(mica) == ["seed", *MICA_DEFAULTS]
        for key, (default, description) in {**nanogpt, **mica}.items():
            assert default == repr({**DEFAULTS, **MICA_DEFAULTS}[key])
            assert description == DESCRIPTIONS[key]
    assert nanogpt["n_layer"] == ("12", "transformer blocks")
    assert mica["threads"][0] == "0"


def test_train_help_after_a_config_shows_its_values():
    nanogpt = _listed(_help("train", "shakespeare_char", "--help"), "nanoGPT's settings (train.py):")
    assert nanogpt["n_layer"][0] == "6" and nanogpt["dropout"][0] == "0.2"
    assert nanogpt["out_dir"][0] == repr(BUILTIN_CONFIGS["shakespeare_char"]["out_dir"])


def test_sample_help_lists_every_setting_with_its_default():
    lines = _help("sample", "--help")
    assert lines[0] == "usage: mica sample [CONFIG ...] [--key=value ...]"
    nanogpt = _listed(lines, "nanoGPT's settings (sample.py):")
    mica = _listed(lines, "Mica's settings:")
    assert list(nanogpt) == list(SAMPLE_NANOGPT) and list(mica) == ["threads", "data_dir", "simulate"]
    for key, (default, _) in {**nanogpt, **mica}.items():
        assert default == repr(SAMPLE_DEFAULTS[key])
    assert nanogpt["top_k"] == ("200", "keep the k most likely tokens (a positive int), or None for no cut")


def test_every_setting_has_a_description():
    assert set(DESCRIPTIONS) == set(DEFAULTS) | set(MICA_DEFAULTS)
