"""What a user with an existing nanoGPT setup brings: its own data folder (meta.pkl), a ckpt.pt that
real torch wrote after training, and Hugging Face's GPT-2 model.safetensors. All the mica train
runs here share one model (2 layers, 4 heads, width 32, biases) and one compiled trainer."""
import json
import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest

from mica.train import checkpoint

torch = pytest.importorskip("torch")

import mica  # noqa: E402
from mica.bench.check import _mica_losses  # noqa: E402
from mica.bench.torch_gpt import TorchGPT  # noqa: E402
from mica.models.gpt import GPT, GPTConfig  # noqa: E402
from mica.train import config as config_mod  # noqa: E402
from mica.train import convert  # noqa: E402

from helpers import rel_err  # noqa: E402
from torch_nanogpt import Run  # noqa: E402

SHAKESPEARE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tinyshakespeare.txt")
SETTINGS = dict(dataset="shakespeare_char", device="cpu", compile=False, n_layer=2, n_head=4, n_embd=32,
                block_size=16, bias=True, dropout=0.0, batch_size=4, gradient_accumulation_steps=1,
                learning_rate=1e-2, warmup_iters=2, lr_decay_iters=40, min_lr=1e-3, beta2=0.99, eval_iters=2,
                eval_interval=1000, log_interval=1)
FLAGS = [f"--{k}={v}" for k, v in SETTINGS.items()]
SAVED_AT = 6  # nanoGPT's checkpoint: after 6 iterations
MORE = 3      # iterations Mica continues for


def mica_cli(*args, cwd, check=True):
    r = subprocess.run([sys.executable, "-m", "mica.cli", *args], cwd=cwd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"mica {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture(scope="module")
def nanogpt(tmp_path_factory):
    """nanoGPT's data/shakespeare_char folder as its prepare.py leaves it (train.bin, val.bin,
    meta.pkl; no meta.json), and a ckpt.pt from training on it in PyTorch."""
    d = tmp_path_factory.mktemp("nanogpt")
    data_dir = d / "data" / "shakespeare_char"
    data_dir.mkdir(parents=True)
    data = open(SHAKESPEARE).read()[:60000]
    chars = sorted(list(set(data)))
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = {i: ch for i, ch in enumerate(chars)}
    n = len(data)
    train_ids = np.array([stoi[c] for c in data[:int(n * 0.9)]], dtype=np.uint16)
    val_ids = np.array([stoi[c] for c in data[int(n * 0.9):]], dtype=np.uint16)
    train_ids.tofile(data_dir / "train.bin")
    val_ids.tofile(data_dir / "val.bin")
    with open(data_dir / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, f)

    cfg = {**config_mod.DEFAULTS, **SETTINGS, "max_iters": SAVED_AT + MORE, "out_dir": "out"}
    rng = np.random.default_rng(0)
    before = rng.integers(0, len(train_ids) - cfg["block_size"], (SAVED_AT, cfg["batch_size"])).tolist()
    after = rng.integers(0, len(train_ids) - cfg["block_size"], (MORE, cfg["batch_size"])).tolist()
    np.savetxt(d / "after.txt", np.array(after).ravel(), fmt="%d")
    run = Run(cfg, len(chars), train_ids, val_ids)
    for offsets in before:
        run.step(offsets)
    saved = run.save(d / "ckpt.pt")
    moments = {n: (run.optimizer.state[p]["exp_avg"].clone(), run.optimizer.state[p]["exp_avg_sq"].clone())
               for n, p in run.model.named_parameters()}
    weights = {k: v.clone() for k, v in run.model.state_dict().items()}
    continued = [run.step(offsets) for offsets in after]
    # the control: the same weights, the optimizer state lost
    fresh = Run(cfg, len(chars), train_ids, val_ids)
    fresh.model.load_state_dict(weights)
    fresh.iter_num = SAVED_AT
    reset = [fresh.step(offsets) for offsets in after]
    return dict(dir=d, vocab=len(chars), saved=saved, moments=moments, continued=continued, reset=reset,
                train=train_ids, after=after)


def test_mica_reads_nanogpts_own_folder(nanogpt):
    from mica.train import run

    vocab, path = run.vocab_size(str(nanogpt["dir"] / "data" / "shakespeare_char"), log=print)
    assert vocab == nanogpt["vocab"] == 59 and path.endswith("meta.pkl")


def test_import_converts_tensors_and_keeps_the_optimizer_state_exactly(nanogpt):
    d = nanogpt["dir"]
    assert isinstance(nanogpt["saved"]["best_val_loss"], torch.Tensor)  # as nanoGPT saves it
    assert "transformer.h.0.attn.bias" in nanogpt["saved"]["model"]      # older nanoGPT's mask buffer
    mica_cli("import", "ckpt.pt", "--out_dir", "imported", cwd=d)
    st = checkpoint.SafeTensors(str(d / "imported" / "ckpt.safetensors"))
    assert st.metadata["iter_num"] == str(SAVED_AT)
    assert float(st.metadata["best_val_loss"]) == nanogpt["saved"]["best_val_loss"].item()
    assert not [n for n in st.names if n.endswith(".attn.bias")]
    assert int(st.read("optimizer.step")) == SAVED_AT
    for name, (m, v) in nanogpt["moments"].items():
        assert np.array_equal(st.read(f"optimizer.exp_avg.{name}"), m.numpy()), name
        assert np.array_equal(st.read(f"optimizer.exp_avg_sq.{name}"), v.numpy()), name
    cfg = json.loads(st.metadata["config"])
    assert cfg["n_head"] == 4 and cfg["bias"] is True and cfg["learning_rate"] == 1e-2


def test_an_imported_checkpoint_resumes_where_pytorch_would_have_gone(nanogpt):
    d = nanogpt["dir"]
    if not (d / "imported").exists():
        mica_cli("import", "ckpt.pt", "--out_dir", "imported", cwd=d)
    r = mica_cli("train", *FLAGS, "--out_dir=imported", "--init_from=resume", "--batch_order=after.txt",
                 f"--max_iters={SAVED_AT + MORE - 1}", "--threads=2", cwd=d)
    assert "defaulting to vocab_size" not in r.stdout
    losses = _mica_losses(str(d / "imported"))
    assert len(losses) == MORE and f"iter {SAVED_AT}: loss" in r.stdout and f"iter {SAVED_AT - 1}:" not in r.stdout
    want, control = nanogpt["continued"], nanogpt["reset"]
    # the first loss needs only the weights; the next ones AdamW's moments, its step count and
    # the learning rate at iter_num: all as PyTorch's own continued run has them
    for got, w in zip(losses, want):
        assert abs(got - w) / w < 1e-5, (losses, want)
    assert control[0] == pytest.approx(want[0], rel=1e-6)
    assert min(abs(c - w) / w for c, w in zip(control[1:], want[1:])) > 1e-3, (control, want)

    # mica sample decodes with nanoGPT's meta.pkl (the folder has no meta.json)
    out = mica_cli("sample", "--out_dir=imported", "--start=ROMEO:", "--num_samples=1", "--max_new_tokens=20",
                   cwd=d).stdout
    assert out.startswith("ROMEO:") and len(out.split("\n---------------\n")[0]) == len("ROMEO:") + 20


def test_plain_numbers_from_tensors_and_numpy_scalars():
    got = convert._plain({"best": torch.tensor(3.5745), "it": np.int64(7), "lr": np.float32(0.5),
                          "args": [torch.tensor(2), (np.bool_(True), "x")], "big": torch.zeros(3)})
    assert got["best"] == pytest.approx(3.5745) and type(got["best"]) is float
    assert got["it"] == 7 and type(got["it"]) is int and got["lr"] == 0.5 and type(got["lr"]) is float
    assert got["args"] == [2, (True, "x")] and type(got["args"][1][0]) is bool
    assert isinstance(got["big"], torch.Tensor)  # not a number: left for the caller to refuse
