"""What a user with an existing nanoGPT setup brings: its own data folder (meta.pkl), a ckpt.pt that
real torch wrote after training, and Hugging Face's GPT-2 model.safetensors. All the mica train
runs here share one model (2 layers, 4 heads, width 32, biases) and one compiled trainer."""
import functools
import json
import os
import pickle
import re
import shutil
import struct

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

import helpers  # noqa: E402
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


mica_cli = functools.partial(helpers.mica_cli, check=True)


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


def test_import_never_replaces_a_run_unasked(nanogpt):
    """A checkpoint already in --out_dir stays unless --force says otherwise; a folder another
    command holds (a training run's lock) is refused, and either refusal changes no byte."""
    from mica import files

    d = nanogpt["dir"]
    mica_cli("import", "ckpt.pt", "--out_dir", "twice", cwd=d)
    target = d / "twice" / "ckpt.safetensors"
    target.write_bytes(target.read_bytes()[:-1] + b"!")  # (marked: a replacement would show)
    marked = target.read_bytes()
    r = mica_cli("import", "ckpt.pt", "--out_dir", "twice", cwd=d, check=False)
    assert r.returncode == 2 and r.stderr.strip() == (
        "mica: error: twice/ckpt.safetensors already exists; pass --force to replace it, or import into another "
        "--out_dir"), r.stderr
    assert target.read_bytes() == marked
    target.unlink()
    files.lock_run_folder(str(d / "twice"))  # (as a trainer holds it while it runs)
    try:
        r = mica_cli("import", "ckpt.pt", "--out_dir", "twice", cwd=d, check=False)
    finally:
        os.close(files._LOCKS.pop(os.path.realpath(d / "twice")))
    assert r.returncode == 2 and "another mica train is running in twice; wait for it to finish or import into " \
        "another folder" in r.stderr, r.stderr
    assert not target.exists()
    mica_cli("import", "ckpt.pt", "--out_dir", "twice", cwd=d)
    first = target.read_bytes()
    target.write_bytes(marked)
    mica_cli("import", "ckpt.pt", "--out_dir", "twice", "--force", cwd=d)
    assert target.read_bytes() == first  # (the marked file replaced by the conversion)


def test_an_imported_checkpoints_metadata_is_checksummed(nanogpt):
    """An import's iteration, best loss and config carry the trainer's checksum: a changed byte in
    them is refused by a resume, an export and sampling, not trained on or written on."""
    d = nanogpt["dir"]
    mica_cli("import", "ckpt.pt", "--out_dir", "edited", cwd=d)
    path = d / "edited" / "ckpt.safetensors"
    st = checkpoint.SafeTensors(str(path))
    assert st.metadata["meta_crc32"] == f"{checkpoint.metadata_crc(st.metadata):08x}"
    st.check_metadata()
    raw = path.read_bytes()
    was = f'"iter_num":"{SAVED_AT}"'.encode()
    assert raw.count(was) == 1
    path.write_bytes(raw.replace(was, f'"iter_num":"{SAVED_AT + 1}"'.encode()[:len(was)]))
    for command in (["train", *FLAGS, "--out_dir=edited", "--init_from=resume"],
                    ["export", "edited", "--to", "edited.pt"],
                    ["sample", "--out_dir=edited", "--num_samples=1", "--max_new_tokens=4"]):
        r = mica_cli(*command, cwd=d, check=False)
        assert r.returncode == 2 and "does not match its checksum" in r.stderr, (command, r.stderr)
    assert not (d / "edited.pt").exists()


def test_export_writes_the_ckpt_pt_nanogpt_itself_wrote(nanogpt):
    """nanoGPT's ckpt.pt through mica import and mica export again: the optimizer's lr is train.py's
    get_lr at the saved iter_num (not the base learning_rate) and best_val_loss its 0-d float32
    tensor, so nanoGPT resumes from the export as from its own file."""
    d = nanogpt["dir"]
    if not (d / "imported").exists():
        mica_cli("import", "ckpt.pt", "--out_dir", "imported", cwd=d)
    mica_cli("export", "imported", "--to", "exported.pt", cwd=d)
    got, want = torch.load(d / "exported.pt", weights_only=True), torch.load(d / "ckpt.pt", weights_only=True)
    assert got["iter_num"] == want["iter_num"] == SAVED_AT
    lr = [g["lr"] for g in got["optimizer"]["param_groups"]]
    assert lr == [g["lr"] for g in want["optimizer"]["param_groups"]]
    ratio = (SAVED_AT - SETTINGS["warmup_iters"]) / (SETTINGS["lr_decay_iters"] - SETTINGS["warmup_iters"])
    schedule = SETTINGS["min_lr"] + 0.5 * (1 + np.cos(np.pi * ratio)) * (SETTINGS["learning_rate"] - SETTINGS["min_lr"])
    assert lr == [pytest.approx(schedule, rel=1e-15)] * 2 and abs(lr[0] / SETTINGS["learning_rate"] - 1) > 0.01
    best = got["best_val_loss"]
    assert isinstance(best, torch.Tensor) and best.dim() == 0 and best.dtype == torch.float32
    assert torch.equal(best, want["best_val_loss"])
    assert [g["weight_decay"] for g in got["optimizer"]["param_groups"]] == [0.1, 0.0]
    for name, t in want["model"].items():
        if not name.endswith(".attn.bias"):
            assert torch.equal(got["model"][name], t), name


def test_nanogpts_own_run_folder_resumes_where_pytorch_would_have_gone(nanogpt):
    """nanoGPT's out_dir as its train.py left it (ckpt.pt alone): --init_from=resume converts it first,
    as mica import would, and goes on with PyTorch's own losses; then mica sample reads it."""
    d = nanogpt["dir"]
    (d / "theirs").mkdir()
    shutil.copy(d / "ckpt.pt", d / "theirs" / "ckpt.pt")
    r = mica_cli("train", *FLAGS, "--out_dir=theirs", "--init_from=resume", "--batch_order=after.txt",
                 f"--max_iters={SAVED_AT + MORE - 1}", "--threads=2", cwd=d)
    assert r.returncode == 0, r.stderr
    assert "note: theirs holds nanoGPT's ckpt.pt and no Mica checkpoint; converting it to theirs/ckpt.safetensors " \
           "first (as mica import theirs/ckpt.pt --out_dir theirs does; the ckpt.pt stays as it is)" in r.stdout
    assert (d / "theirs" / "ckpt.pt").read_bytes() == (d / "ckpt.pt").read_bytes()
    assert "defaulting to vocab_size" not in r.stdout
    # (nanoGPT's checkpoint holds no data position; the batches are the file's, not the seed's)
    assert "holds no data position (an imported one?): batches come from --batch_order" in r.stdout, r.stdout
    losses = _mica_losses(str(d / "theirs"))
    assert len(losses) == MORE and f"iter {SAVED_AT}: loss" in r.stdout and f"iter {SAVED_AT - 1}:" not in r.stdout
    want, control = nanogpt["continued"], nanogpt["reset"]
    # the first loss needs only the weights; the next ones AdamW's moments, its step count and
    # the learning rate at iter_num: all as PyTorch's own continued run has them
    for got, w in zip(losses, want):
        assert abs(got - w) / w < 1e-5, (losses, want)
    assert control[0] == pytest.approx(want[0], rel=1e-6)
    assert min(abs(c - w) / w for c, w in zip(control[1:], want[1:])) > 1e-3, (control, want)

    # mica sample decodes with nanoGPT's meta.pkl (the folder has no meta.json)
    out = mica_cli("sample", "--out_dir=theirs", "--start=ROMEO:", "--num_samples=1", "--max_new_tokens=20",
                   cwd=d).stdout
    assert out.startswith("ROMEO:") and len(out.split("\n---------------\n")[0]) == len("ROMEO:") + 20
    # sampling from nanoGPT's folder reads it converted, saying so on stderr (the text alone on stdout),
    # and writes nothing there: a read-only folder samples as well (an outside tester's case)
    (d / "theirs2").mkdir()
    shutil.copy(d / "ckpt.pt", d / "theirs2" / "ckpt.pt")
    os.chmod(d / "theirs2", 0o555)
    try:
        r = mica_cli("sample", "--out_dir=theirs2", "--start=ROMEO:", "--num_samples=1", "--max_new_tokens=20", cwd=d)
    finally:
        os.chmod(d / "theirs2", 0o755)
    assert r.returncode == 0 and "reading it converted (as mica import theirs2/ckpt.pt does; nothing is written " \
        "into theirs2)" in r.stderr, r.stderr
    assert r.stdout.split("\n---------------\n")[0] == out.split("\n---------------\n")[0]  # (same weights, seed)
    assert sorted(p.name for p in (d / "theirs2").iterdir()) == ["ckpt.pt"]


# ---- Hugging Face's GPT-2 ------------------------------------------------------------------

def write_safetensors(path, arrays, metadata):
    """safetensors as Hugging Face writes it (written here, not with Mica's writer)."""
    header, blobs, at = {"__metadata__": metadata}, [], 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        blobs.append(a.tobytes())
        at += a.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def hf_gpt2(vocab, n_layer=2, n_embd=32, n_positions=64, seed=0, prefix=""):
    """Random GPT-2 weights under HF's names, Conv1D's [in, out] layout, its mask buffers."""
    rng = np.random.default_rng(seed)
    C = n_embd

    def w(*shape, std=0.1):
        return rng.normal(0, std, shape).astype(np.float32)

    t = {"wte.weight": w(vocab, C, std=0.3), "wpe.weight": w(n_positions, C, std=0.1)}
    for i in range(n_layer):
        h = f"h.{i}."
        t.update({h + "ln_1.weight": 1 + w(C), h + "ln_1.bias": w(C),
                  h + "attn.bias": np.tril(np.ones((n_positions, n_positions)))[None, None],
                  h + "attn.masked_bias": np.array(-1e4),
                  h + "attn.c_attn.weight": w(C, 3 * C, std=0.3), h + "attn.c_attn.bias": w(3 * C),
                  h + "attn.c_proj.weight": w(C, C), h + "attn.c_proj.bias": w(C),
                  h + "ln_2.weight": 1 + w(C), h + "ln_2.bias": w(C),
                  h + "mlp.c_fc.weight": w(C, 4 * C), h + "mlp.c_fc.bias": w(4 * C),
                  h + "mlp.c_proj.weight": w(4 * C, C), h + "mlp.c_proj.bias": w(C)})
    t.update({"ln_f.weight": 1 + w(C), "ln_f.bias": w(C)})
    return {prefix + k: v for k, v in t.items()}


def torch_from_hf(hf, cfg):
    """TorchGPT with HF's weights put in by torch: each Conv1D weight (y = x @ W + b) becomes the
    Linear weight W.T; wpe cropped to the block size."""
    model = TorchGPT(cfg)
    sd = {}
    for k, v in hf.items():
        if k.endswith((".attn.bias", ".attn.masked_bias")):  # the buffers, not c_attn.bias
            continue
        t = torch.from_numpy(v)
        if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            t = t.t()
        if k == "wpe.weight":
            t = t[:cfg.block_size]
        sd["transformer." + k] = t
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    model.load_state_dict(sd)
    model.eval()
    return model


@pytest.fixture(scope="module")
def hf_file(nanogpt):
    d = nanogpt["dir"] / "gpt2"
    d.mkdir()
    hf = hf_gpt2(nanogpt["vocab"])
    write_safetensors(d / "model.safetensors", hf, {"format": "pt"})
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_head": 4, "n_embd": 32, "n_layer": 2,
                                               "n_positions": 64, "vocab_size": nanogpt["vocab"]}))
    return d / "model.safetensors", hf


def test_train_from_a_hugging_face_gpt2_file(nanogpt, hf_file):
    d = nanogpt["dir"]
    path, hf = hf_file
    # the model settings given (or defaulted) are overridden by the file's, as nanoGPT's gpt2* are
    flags = [f for f in FLAGS if not f.startswith(("--n_layer", "--n_head", "--n_embd", "--bias"))]
    r = mica_cli("train", *flags, "--n_layer=1", "--n_head=2", "--out_dir=from_hf", f"--init_from={path}",
                 "--batch_order=after.txt", "--max_iters=0", cwd=d)
    assert "n_layer=2, n_head=4, n_embd=32, bias=True" in r.stdout
    st = checkpoint.SafeTensors(str(d / "from_hf" / "init.safetensors"))
    params = {n: st.read(n) for n in st.names}
    assert params["transformer.wpe.weight"].shape == (16, 32)  # cropped to block_size
    assert params["transformer.h.1.attn.c_attn.weight"].shape == (96, 32)

    # (i) Mica's GPT from those weights gives the logits of HF's math done by torch
    cfg = GPTConfig(block_size=16, vocab_size=nanogpt["vocab"], n_layer=2, n_head=4, n_embd=32, bias=True)
    model = GPT(cfg)
    model.eval()

    def logits(p, idx, targets):
        return mica.nn.functional_call(model, p, idx, targets)[0]

    idx = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 16))
    prog = mica.trace(logits, model.param_specs(), mica.i64[2, 16], mica.i64[2, 16])
    got = mica.reference.run(prog, params, idx, idx, precision="float32")
    with torch.no_grad():
        want, _ = torch_from_hf(hf, cfg)(torch.from_numpy(idx), torch.from_numpy(idx))
    assert rel_err(got, want.numpy()) < 1e-5
    assert want.std() > 0.5  # the weights are not near-zero: the comparison means something

    # (ii) the first training loss is that model's on the first batch
    rows = nanogpt["after"][0]  # the batch order's first rows
    x = torch.from_numpy(np.stack([nanogpt["train"][o:o + 16] for o in rows]).astype(np.int64))
    y = torch.from_numpy(np.stack([nanogpt["train"][o + 1:o + 17] for o in rows]).astype(np.int64))
    with torch.no_grad():
        _, loss0 = torch_from_hf(hf, cfg)(x, y)
    assert _mica_losses(str(d / "from_hf"))[0] == pytest.approx(loss0.item(), rel=1e-5)

    # mica import of the same file: the same tensors (wpe whole), and the file's model settings
    r = mica_cli("import", str(path), "--out_dir", "imported_hf", cwd=d)
    assert "n_layer=2, n_head=4, n_embd=32, block_size=64" in r.stdout
    imp = checkpoint.SafeTensors(str(d / "imported_hf" / "ckpt.safetensors"))
    assert sorted(imp.names) == sorted(params)
    for n in params:
        a = imp.read(n)
        assert np.array_equal(a[:16] if n == "transformer.wpe.weight" else a, params[n]), n


def test_hf_names_with_the_transformer_prefix_and_heads_from_gpt2s_table(tmp_path):
    hf = hf_gpt2(50257, n_layer=1, n_embd=768 // 8, prefix="transformer.")
    write_safetensors(tmp_path / "model.safetensors", hf, {"format": "pt"})
    with pytest.raises(mica.MicaError, match="number of heads is unknown; put Hugging Face's config.json"):
        convert.read_hf_gpt2(str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"n_head": 8}))
    tensors, args = convert.read_hf_gpt2(str(tmp_path / "model.safetensors"), block_size=32)
    assert args == dict(n_layer=1, n_head=8, n_embd=96, block_size=32, bias=True, vocab_size=50257, dropout=0.0)
    assert np.array_equal(tensors["transformer.h.0.mlp.c_fc.weight"], hf["transformer.h.0.mlp.c_fc.weight"].T)
    assert convert.is_hf_gpt2(str(tmp_path / "model.safetensors"))
    # Mica's own files share the names but not the layout
    checkpoint.write(str(tmp_path / "mica.safetensors"), tensors)
    assert not convert.is_hf_gpt2(str(tmp_path / "mica.safetensors"))
    os.unlink(tmp_path / "config.json")
    hf = hf_gpt2(50257, n_layer=1, n_embd=768)
    write_safetensors(tmp_path / "model.safetensors", hf, {"format": "pt"})
    assert convert.hf_gpt2_args(str(tmp_path / "model.safetensors"))["n_head"] == 12  # gpt2's


def test_a_config_json_of_another_model_is_refused_not_ignored(tmp_path):
    """The config.json beside a Hugging Face file describes its model: sizes other than its tensors',
    or an activation that is not a GELU, are one sentence naming the key (the file would otherwise
    load as a different model than its config says, silently)."""
    hf = hf_gpt2(300, n_layer=2, n_embd=32, n_positions=64)
    write_safetensors(tmp_path / "model.safetensors", hf, {"format": "pt"})
    path = str(tmp_path / "model.safetensors")
    good = {"n_head": 4, "n_layer": 2, "n_embd": 32, "n_positions": 64, "vocab_size": 300}
    for config in (good, {**good, "activation_function": "gelu_new"}, {"n_head": 4, "activation_function": "gelu"}):
        (tmp_path / "config.json").write_text(json.dumps(config))
        assert convert.hf_gpt2_args(path)["n_layer"] == 2
    for change, says in (({"n_layer": 3}, "gives n_layer=3, but"), ({"n_positions": 1024}, "gives n_positions=1024"),
                         ({"vocab_size": 50257}, "gives vocab_size=50257, but"),
                         ({"activation_function": "relu"}, "gives activation_function='relu', but nanoGPT's model")):
        (tmp_path / "config.json").write_text(json.dumps({**good, **change}))
        with pytest.raises(mica.MicaError, match=says):
            convert.hf_gpt2_args(path)
        r = mica_cli("import", path, "--out_dir", str(tmp_path / "out"), cwd=tmp_path, check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr and says in r.stderr, r.stderr
        assert not (tmp_path / "out" / "ckpt.safetensors").exists()


@pytest.mark.parametrize("name", ["gpt2", "gpt2-medium", "gpt2-xl"])
def test_init_from_gpt2_is_refused_before_anything_compiles(tmp_path, name):
    r = mica_cli("train", "shakespeare_char", "--device=cpu", f"--init_from={name}", cwd=tmp_path, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"mica: error: init_from='{name}' downloads GPT-2 from a hub")
    assert "--init_from=PATH/model.safetensors" in r.stderr and "mica import" in r.stderr
    assert "compiling" not in r.stdout + r.stderr and "number of parameters" not in r.stdout


def test_files_that_are_not_hugging_faces_gpt2_are_sentences(tmp_path):
    hf = hf_gpt2(11, n_layer=1, n_embd=8)
    (tmp_path / "config.json").write_text(json.dumps({"n_head": 2}))
    del hf["h.0.mlp.c_fc.bias"]
    write_safetensors(tmp_path / "model.safetensors", hf, {"format": "pt"})
    with pytest.raises(mica.MicaError, match="missing h.0.mlp.c_fc.bias"):
        convert.read_hf_gpt2(str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"n_head": 3}))
    with pytest.raises(mica.MicaError, match="gives no usable n_head"):
        convert.read_hf_gpt2(str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"n_head": 2}))
    write_safetensors(tmp_path / "model.safetensors", hf_gpt2(11, n_layer=1, n_embd=8), {"format": "pt"})
    raw = (tmp_path / "model.safetensors").read_bytes().replace(b'"F32"', b'"I32"', 1)
    (tmp_path / "ints.safetensors").write_bytes(raw)
    with pytest.raises(mica.MicaError, match="holds int32, not floating-point weights"):
        convert.read_hf_gpt2(str(tmp_path / "ints.safetensors"))
    checkpoint.write(str(tmp_path / "mica.safetensors"), {"transformer.h.0.attn.c_attn.weight": np.zeros((24, 8),
                                                                                                       np.float32)})
    r = mica_cli("import", "mica.safetensors", "--out_dir", "x", cwd=tmp_path, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "is not GPT-2 in Hugging Face's layout" in r.stderr


def test_plain_numbers_from_tensors_and_numpy_scalars():
    got = convert._plain({"best": torch.tensor(3.5745), "it": np.int64(7), "lr": np.float32(0.5),
                          "args": [torch.tensor(2), (np.bool_(True), "x")], "big": torch.zeros(3)})
    assert got["best"] == pytest.approx(3.5745) and type(got["best"]) is float
    assert got["it"] == 7 and type(got["it"]) is int and got["lr"] == 0.5 and type(got["lr"]) is float
    assert got["args"] == [2, (True, "x")] and type(got["args"][1][0]) is bool
    assert isinstance(got["big"], torch.Tensor)  # not a number: left for the caller to refuse


def test_checkpoints_that_are_not_nanogpts_are_sentences(tmp_path):
    torch.save([1, 2], tmp_path / "list.pt")
    torch.save({"model": {"transformer.wte.weight": torch.zeros(3, 2)}, "config": [1]}, tmp_path / "cfg.pt")
    for name, needle in [("list.pt", "list.pt has no 'model' entry, where nanoGPT's ckpt.pt keeps the weights"),
                         ("cfg.pt", "its optimizer, config or model_args is not a dict")]:
        r = mica_cli("import", name, "--out_dir", "x", cwd=tmp_path, check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr and needle in r.stderr, r.stderr


def test_a_pickle_that_runs_code_is_never_loaded(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"model": {}, "x": Payload()}, tmp_path / "evil.pt")
    r = mica_cli("import", str(tmp_path / "evil.pt"), "--out_dir", str(tmp_path / "out"), cwd=tmp_path, check=False)
    assert r.returncode == 2 and "holds Python objects besides tensors" in r.stderr, r.stderr
    assert not marker.exists() and not (tmp_path / "out" / "ckpt.safetensors").exists()


def test_an_imported_checkpoint_of_other_data_is_named_as_such(nanogpt):
    """An imported checkpoint keeps no digest of its vocabulary, only its embedding's size: where the
    data's vocabulary is larger the checkpoint was trained on other data, which is said before the
    data's own checks would blame its token ids."""
    d = nanogpt["dir"]
    (d / "wide" / "data" / "shakespeare_char").mkdir(parents=True)
    mica_cli("prepare", "shakespeare-char", "--input", SHAKESPEARE, "--out", str(d / "wide" / "data" /
                                                                               "shakespeare_char"), cwd=d)
    rows = pickle.load(open(d / "data" / "shakespeare_char" / "meta.pkl", "rb"))["vocab_size"]
    assert rows < len(set(open(SHAKESPEARE).read())) == 65  # (the fixture's data: a part of the text)
    mica_cli("import", str(d / "ckpt.pt"), "--out_dir", str(d / "wide" / "out"), cwd=d)
    r = mica_cli("train", *FLAGS, "--out_dir=out", "--init_from=resume", cwd=d / "wide", check=False)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"mica: error: the checkpoint in out embeds {rows} tokens, but data/shakespeare_char/meta.json's vocabulary "
        "has 65: it was trained on other data; resume with the data it trained on (--dataset or --data_dir), or "
        "train afresh with --init_from=scratch"), r.stderr


@pytest.mark.slow  # (a variant: ckpt.pt imports and resumes are checked by default; make test-slow runs it)
def test_a_ckpt_pt_saved_at_a_later_iteration_beside_micas_checkpoint_is_the_one_taken(nanogpt):
    """A run going back and forth: nanoGPT's train.py went on from an export in the run's folder and
    saved ckpt.pt at a later iteration. A resume takes it (converted, with a note) and sampling reads
    it; a ckpt.pt of the same iteration (an export) changes nothing, one of an earlier one is noted."""
    import time

    from mica.train import run

    d = nanogpt["dir"]
    mica_cli("import", "ckpt.pt", "--out_dir", "newer", cwd=d)
    ours = (d / "newer" / "ckpt.safetensors").read_bytes()
    later = time.time() + 60
    shutil.copy(d / "ckpt.pt", d / "newer" / "ckpt.pt")  # (the same iteration: an export, say)
    os.utime(d / "newer" / "ckpt.pt", (later, later))
    cwd = os.getcwd()
    os.chdir(d)
    try:
        notes = []
        run.prepare_run(None, [*FLAGS, "--out_dir=newer", "--init_from=resume"], log=notes.append)
        assert not [n for n in notes if "ckpt.pt" in n], notes
        assert (d / "newer" / "ckpt.safetensors").read_bytes() == ours
        ck = torch.load(d / "ckpt.pt", weights_only=True)
        ck["iter_num"] = SAVED_AT + 7
        torch.save(ck, d / "newer" / "ckpt.pt")
        os.utime(d / "newer" / "ckpt.pt", (later, later))
        r = mica_cli("sample", "--out_dir=newer", "--num_samples=1", "--max_new_tokens=2", cwd=d)
        assert f"newer/ckpt.pt was saved at iter {SAVED_AT + 7}, after newer/ckpt.safetensors's iter {SAVED_AT}; " \
               "reading it converted" in r.stderr, r.stderr
        assert (d / "newer" / "ckpt.safetensors").read_bytes() == ours  # (sampling writes nothing)
        notes = []
        run.prepare_run(None, [*FLAGS, "--out_dir=newer", "--init_from=resume"], log=notes.append)
        assert any(f"newer/ckpt.pt was saved at iter {SAVED_AT + 7}, after newer/ckpt.safetensors's iter {SAVED_AT}; "
                   "converting it to newer/ckpt.safetensors first" in n for n in notes), notes
        assert int(checkpoint.SafeTensors("newer/ckpt.safetensors").metadata["iter_num"]) == SAVED_AT + 7
        ck["iter_num"] = 1  # (an earlier iteration, written later: Mica's own is kept, and that is said)
        torch.save(ck, d / "newer" / "ckpt.pt")
        os.utime(d / "newer" / "ckpt.pt", (later + 60, later + 60))
        notes = []
        run.prepare_run(None, [*FLAGS, "--out_dir=newer", "--init_from=resume"], log=notes.append)
        assert any(f"but was saved at iter 1, before its iter {SAVED_AT + 7}; going on from newer/ckpt.safetensors"
                   in n for n in notes), notes
    finally:
        os.chdir(cwd)


def _small_ckpt(torch):
    """A nanoGPT ckpt.pt's dict for a 1-layer GPT (zeros), with one AdamW state entry."""
    args = dict(n_layer=1, n_head=2, n_embd=8, block_size=8, bias=False, vocab_size=11, dropout=0.0)
    specs = GPT(GPTConfig(**{k: v for k, v in args.items() if k != "dropout"})).param_specs()
    model = {n: torch.zeros(tuple(s.shape)) for n, s in specs.items()}
    model["lm_head.weight"] = model["transformer.wte.weight"]
    state = {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(11, 8), "exp_avg_sq": torch.zeros(11, 8)}}
    return {"model": model, "model_args": args, "config": dict(args), "iter_num": 3, "best_val_loss": torch.tensor(2.0),
            "optimizer": {"state": state, "param_groups": []}}


@pytest.mark.parametrize("damage,says", [
    (lambda c, t: c["model"].update({"lm_head.weight": t.zeros(11, 7)}), "has an lm_head.weight apart from"),
    (lambda c, t: c["model"].update({"transformer.wte.weight": t.zeros(10, 8)}), "has an lm_head.weight apart from"),
    (lambda c, t: c["model"].update({"lm_head.weight": "x"}), "has an lm_head.weight apart from"),
    (lambda c, t: [c["model"].pop("lm_head.weight"), c["model"].update({"transformer.wte.weight": t.tensor(1.0)})],
     "its transformer.wte.weight is [], where a [vocabulary, n_embd] matrix belongs"),
    (lambda c, t: c["optimizer"]["state"][0].update(step=t.tensor(1e30)), "the optimizer state of"),
    (lambda c, t: c["config"].update({(1, 2): 3}), "its config or model_args has a key that is not a name"),
    (lambda c, t: [c["model_args"].update(block_size=0), c["model"].update(
        {"transformer.wpe.weight": t.zeros(0, 8)})], "holds a GPT with block_size=0"),
], ids=["head-shape", "wte-resized", "head-str", "wte-0d", "step-huge", "config-key", "no-positions"])
def test_importing_a_damaged_nanogpt_checkpoint_is_one_sentence(tmp_path, damage, says):
    """ckpt.pt files an outside fuzzer made: each gave a traceback (a tie checked before the shapes,
    a 0-d embedding, a step past int64, a config key json cannot write), or imported a model of no
    positions with rc 0; each is now the import's sentence, and nothing is written."""
    import torch

    ck = _small_ckpt(torch)
    damage(ck, torch)
    torch.save(ck, tmp_path / "ckpt.pt")
    with pytest.raises(mica.MicaError, match=re.escape(says)):
        convert.import_nanogpt(str(tmp_path / "ckpt.pt"), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "ckpt.safetensors").exists()
    good = _small_ckpt(torch)
    torch.save(good, tmp_path / "good.pt")
    convert.import_nanogpt(str(tmp_path / "good.pt"), str(tmp_path / "good"))  # (the undamaged one imports)


@pytest.mark.parametrize("damage,config,says", [
    (lambda t: t.update({"h.\u00b2.ln_1.weight": np.zeros(32, np.float32)}), '{"n_head": 4}', "unknown h.\u00b2.ln_1.weight"),
    (lambda t: None, "[" * 100000 + "]" * 100000, "gives no usable n_head"),
    (lambda t: t.update({"wpe.weight": np.zeros((0, 32), np.float32)}), '{"n_head": 4}',
     "hold a GPT without tokens, positions or width"),
    (lambda t: t.update({"wte.weight": np.zeros((0, 32), np.float32)}), '{"n_head": 4}',
     "hold a GPT without tokens, positions or width"),
], ids=["superscript-block", "deep-config", "no-positions", "no-tokens"])
def test_importing_a_damaged_hugging_face_file_is_one_sentence(tmp_path, damage, config, says):
    """Hugging Face files an outside fuzzer made: a block named with a superscript digit (isdigit()
    but not int()), a config.json nested past Python's recursion limit (tracebacks), and a model
    without positions or tokens (imported with rc 0, to fail later inside the trainer)."""
    t = hf_gpt2(11, n_layer=1)
    damage(t)
    write_safetensors(tmp_path / "model.safetensors", t, {"format": "pt"})
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(mica.MicaError, match=re.escape(says)):
        convert.import_hf_gpt2(str(tmp_path / "model.safetensors"), str(tmp_path / "out"))
