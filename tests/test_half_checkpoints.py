"""bfloat16 and float16 tensors in safetensors files (written, read, checked, fuzzed), nanoGPT
exports that keep the stored dtypes or round to the one asked for, and weights files in a half
type that the trainer widens to its float32 masters."""
import json
import os
import random
import struct
import subprocess

import numpy as np
import pytest
import torch

from mica.bench.torch_gpt import TorchGPT
from mica.errors import MicaError
from mica.models.gpt import GPT
from mica.train import checkpoint, convert, run
from mica.train.programs import model_config
from test_runtime import CKPT, QUIET, TINY, train, work  # noqa: F401  (work: the prepared folder, as a fixture)


def torch_bits(a):
    """torch's own float32 -> bfloat16 rounding, as uint16 bit patterns."""
    return torch.from_numpy(np.asarray(a, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def hand_written(path, tensors):
    """A safetensors file written without Mica's writer: {name: torch tensor} in its own dtype."""
    codes = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dim() else t.reshape(1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def test_bfloat16_rounding_is_torchs():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(200000) * 10.0 ** rng.integers(-44, 38, 200000)).astype(np.float32)
    ties = (rng.integers(0, 0x7F80, 2000).astype(np.uint32) << 16 | 0x8000).view(np.float32)  # exactly halfway
    specials = np.array([np.inf, -np.inf, 0.0, -0.0, 3.4e38, -3.4028235e38, 1e-45, -1e-40, 1.00390625], np.float32)
    x = np.concatenate([x, ties, specials])
    got = checkpoint.BF16Tensor.round(x).bits
    assert np.array_equal(got, torch_bits(x))
    assert np.array_equal(checkpoint.widen_bf16(got), torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    nan = checkpoint.BF16Tensor.round(np.array([np.nan, -np.nan], np.float32))
    assert np.isnan(nan.float32()).all()
    assert checkpoint.BF16Tensor.round(np.float32(1.5)).bits.shape == ()  # a 0-d tensor stays 0-d


def test_half_tensors_round_trip_with_their_checksums(tmp_path):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((5, 7)).astype(np.float32)
    h = rng.standard_normal((3,)).astype(np.float16)
    path = str(tmp_path / "half.safetensors")
    checkpoint.write(path, {"w": checkpoint.BF16Tensor.round(w), "h": h, "f": w, "s": checkpoint.BF16Tensor.round(2.0)})
    st = checkpoint.SafeTensors(path)
    assert st.info("w")[0] is checkpoint.BFLOAT16 and st.info("w")[0].name == "bfloat16" and st.info("w")[1] == (5, 7)
    assert st.info("h")[0] == np.float16 and st.info("f")[0] == np.float32
    assert st.read("w").dtype == np.float32
    assert np.array_equal(st.read("w"), torch.from_numpy(w).to(torch.bfloat16).float().numpy())
    assert np.array_equal(st.read_bits("w"), torch_bits(w))
    assert np.array_equal(st.read("h"), h) and np.array_equal(st.read("f"), w) and float(st.read("s")) == 2.0
    assert st.info("w")[0] != np.float32 and st.info("w")[0] != np.uint16  # never taken for another type
    # the bytes a bf16 tensor holds are checked like any other's
    raw = bytearray(open(path, "rb").read())
    offset = st.info("w")[2]
    raw[offset] ^= 1
    open(path, "wb").write(bytes(raw))
    with pytest.raises(MicaError, match="tensor w does not match its checksum"):
        checkpoint.SafeTensors(path).read("w")


def test_files_written_by_other_tools_read_and_mica_files_read_elsewhere(tmp_path):
    rng = np.random.default_rng(2)
    a = torch.from_numpy(rng.standard_normal((4, 6)).astype(np.float32))
    hand_written(tmp_path / "theirs.safetensors", {"a": a.to(torch.bfloat16), "b": a.to(torch.float16), "c": a})
    st = checkpoint.SafeTensors(str(tmp_path / "theirs.safetensors"))
    assert not st.checksummed
    assert np.array_equal(st.read("a"), a.to(torch.bfloat16).float().numpy())
    assert np.array_equal(st.read("b"), a.to(torch.float16).numpy()) and np.array_equal(st.read("c"), a.numpy())
    # Mica's BF16 bytes, parsed without Mica's reader
    checkpoint.write(str(tmp_path / "ours.safetensors"), {"a": checkpoint.BF16Tensor.round(a.numpy())})
    raw = open(tmp_path / "ours.safetensors", "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    entry = json.loads(raw[8:8 + n])["a"]
    assert entry["dtype"] == "BF16" and entry["shape"] == [4, 6]
    lo, hi = entry["data_offsets"]
    theirs = torch.frombuffer(bytearray(raw[8 + n + lo:8 + n + hi]), dtype=torch.bfloat16).reshape(4, 6)
    assert torch.equal(theirs, a.to(torch.bfloat16))


def test_types_mica_does_not_read_and_damaged_half_entries_are_sentences(tmp_path):
    path = tmp_path / "f8.safetensors"
    head = json.dumps({"a": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + bytes(4))
    with pytest.raises(MicaError, match="holds tensor 'a' as F8_E4M3, a type Mica does not read"):
        checkpoint.SafeTensors(str(path))
    head = json.dumps({"a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 16]}}).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + bytes(16))  # 16 bytes where 8 belong
    with pytest.raises(MicaError, match="tensor 'a' does not fit the file"):
        checkpoint.SafeTensors(str(path))


def test_fuzzed_half_files_are_sentences_or_read(tmp_path):
    rng = np.random.default_rng(3)
    good = tmp_path / "good.safetensors"
    checkpoint.write(str(good), {"w": checkpoint.BF16Tensor.round(rng.standard_normal((8, 8))),
                                 "h": rng.standard_normal(9).astype(np.float16)})
    raw = good.read_bytes()
    r = random.Random(4)
    for i in range(300):
        b = bytearray(raw)
        for _ in range(r.randint(1, 6)):
            at = r.randrange(len(b))
            b[at] = r.choice([0, 0xFF, r.randrange(256), ord('"'), ord("B"), ord("F"), ord("1"), ord("6")])
        if r.random() < 0.2:
            b = b[:r.randrange(len(b))]
        bad = tmp_path / f"bad{i}.safetensors"
        bad.write_bytes(bytes(b))
        try:
            st = checkpoint.SafeTensors(str(bad))
            for name in st.names:
                st.read(name)
        except MicaError as e:
            assert str(e).count("\n") == 0
        finally:
            bad.unlink()


def _gpt_checkpoint(path, cfg, vocab, store=lambda a: a, seed=5, iter_num=7, best="2.5"):
    """A Mica checkpoint of nanoGPT's GPT with random weights (each stored through `store`)."""
    model = GPT(model_config(cfg, vocab))
    rng = np.random.default_rng(seed)
    tensors = {n: store((rng.standard_normal(s.shape) * 0.1).astype(np.float32)) for n, s in model.param_specs().items()}
    checkpoint.write(path, tensors, {"format": "mica", "iter_num": iter_num, "best_val_loss": best,
                                     "config": json.dumps(cfg)})
    return model


CFG = dict(n_layer=1, n_head=2, n_embd=16, block_size=8, bias=True, dropout=0.0, learning_rate=1e-3,
           weight_decay=0.1, beta1=0.9, beta2=0.95)


def _nanogpt_loss(ck, x, y):
    gpt = TorchGPT(model_config({**CFG, **ck["model_args"]}, ck["model_args"]["vocab_size"]))
    gpt.load_state_dict(ck["model"])  # a float32 model takes the half tensors, converted, as nanoGPT's would
    gpt.eval()
    with torch.no_grad():
        return gpt(x, y)[1].item()


def test_export_keeps_the_stored_dtypes_or_rounds_to_the_one_asked_for(tmp_path):
    f32 = str(tmp_path / "f32" / "ckpt.safetensors")
    os.makedirs(os.path.dirname(f32))
    _gpt_checkpoint(f32, CFG, 11)
    st = checkpoint.SafeTensors(f32)
    params = [n for n in st.names]
    torch.manual_seed(0)
    x, y = torch.randint(0, 11, (2, 8)), torch.randint(0, 11, (2, 8))
    losses = {}
    for dtype in (None, "bfloat16", "float16", "float32"):
        to = str(tmp_path / f"{dtype}.pt")
        convert.export_nanogpt(str(tmp_path / "f32"), to, dtype=dtype)
        ck = torch.load(to, weights_only=True)
        want = getattr(torch, dtype or "float32")
        for n in params:
            t = ck["model"][n]
            assert t.dtype == want, n
            assert torch.equal(t, torch.from_numpy(st.read(n)).to(want)), n  # torch's own rounding, bit for bit
        assert ck["iter_num"] == 7 and ck["model_args"]["vocab_size"] == 11
        losses[dtype] = _nanogpt_loss(ck, x, y)
    assert losses[None] == losses["float32"]
    assert losses["bfloat16"] != losses[None] and abs(losses["bfloat16"] / losses[None] - 1) < 2e-2
    assert abs(losses["float16"] / losses[None] - 1) < 2e-3
    # a checkpoint that stores bf16 weights exports them as they are, bit for bit
    bf = str(tmp_path / "bf" / "ckpt.safetensors")
    os.makedirs(os.path.dirname(bf))
    _gpt_checkpoint(bf, CFG, 11, store=checkpoint.BF16Tensor.round)
    convert.export_nanogpt(str(tmp_path / "bf"), str(tmp_path / "bf.pt"))
    ck = torch.load(str(tmp_path / "bf.pt"), weights_only=True)
    sb = checkpoint.SafeTensors(bf)
    for n in params:
        assert ck["model"][n].dtype == torch.bfloat16
        assert np.array_equal(ck["model"][n].view(torch.int16).numpy().view(np.uint16), sb.read_bits(n)), n
    with pytest.raises(MicaError, match="--dtype must be one of float32, bfloat16, float16"):
        convert.export_nanogpt(str(tmp_path / "bf"), str(tmp_path / "x.pt"), dtype="int8")


def test_export_to_float16_refuses_weights_past_its_range_and_writes_nothing(tmp_path):
    """float16 holds nothing past 65504: a checkpoint whose weights go beyond (a run blown up by its
    learning rate) is not written as infs in float16; the sentence names the weights, and float32 and
    bfloat16 (float32's range) still export it."""
    path = str(tmp_path / "big" / "ckpt.safetensors")
    os.makedirs(os.path.dirname(path))
    _gpt_checkpoint(path, CFG, 11, store=lambda a: a * np.float32(1e6))
    to = str(tmp_path / "big16.pt")
    with pytest.raises(MicaError, match=r"weight\(s\) of .* hold values past float16's range, which would be written "
                                        r"as inf \(transformer\.wte\.weight, .*\); export them in float32 or bfloat16"):
        convert.export_nanogpt(str(tmp_path / "big"), to, dtype="float16")
    assert not os.path.exists(to)
    for dtype in ("float32", "bfloat16"):
        convert.export_nanogpt(str(tmp_path / "big"), str(tmp_path / f"big_{dtype}.pt"), dtype=dtype)
        ck = torch.load(str(tmp_path / f"big_{dtype}.pt"), weights_only=True)
        assert all(bool(torch.isfinite(t).all()) for t in ck["model"].values())


def test_a_hugging_face_gpt2_file_in_bfloat16_is_read_widened(tmp_path):
    from test_nanogpt_compat import hf_gpt2

    hf = hf_gpt2(13, n_layer=1, n_embd=8)
    (tmp_path / "config.json").write_text(json.dumps({"n_head": 2}))
    hand_written(tmp_path / "model.safetensors", {n: torch.from_numpy(np.asarray(a, np.float32)).to(torch.bfloat16)
                                                  for n, a in hf.items()})
    tensors, args = convert.read_hf_gpt2(str(tmp_path / "model.safetensors"))
    assert args["n_layer"] == 1 and args["vocab_size"] == 13
    w = hf["h.0.mlp.c_fc.weight"]
    assert tensors["transformer.h.0.mlp.c_fc.weight"].dtype == np.float32
    assert np.array_equal(tensors["transformer.h.0.mlp.c_fc.weight"],
                          torch.from_numpy(np.asarray(w, np.float32).T.copy()).to(torch.bfloat16).float().numpy())


def _first_loss(out_dir):
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    return [r["loss"] for r in rows if "loss" in r and "iter" in r]


def test_init_from_bfloat16_weights_trains_their_exact_float32_widening(work):
    train([*TINY, "--max_iters=2"])
    st = checkpoint.SafeTensors(CKPT)
    weights = {n: st.read(n) for n in st.names if not n.startswith(("optimizer.", "data."))}
    checkpoint.write("half.safetensors", {n: checkpoint.BF16Tensor.round(a) for n, a in weights.items()})
    checkpoint.write("wide.safetensors", {n: torch.from_numpy(a).to(torch.bfloat16).float().numpy()
                                          for n, a in weights.items()})
    logs = []
    exe, manifest, _ = run.prepare_run(TINY[0], [*TINY[1:], "--init_from=half.safetensors", "--out_dir=from_half"],
                                       log=logs.append)
    assert any("holds" in line and "bfloat16" in line and "widened from them exactly" in line for line in logs)
    widened = checkpoint.SafeTensors("from_half/init.safetensors")
    for n in weights:
        assert widened.info(n)[0] == np.float32 and np.array_equal(widened.read(n), checkpoint.SafeTensors(
            "wide.safetensors").read(n)), n
    a = subprocess.run([exe, manifest], capture_output=True, text=True, timeout=60)
    train([*TINY, "--init_from=wide.safetensors", "--out_dir=from_wide"])
    assert a.returncode == 0, a.stderr
    assert _first_loss("from_half") == _first_loss("from_wide") and len(_first_loss("from_half")) >= 2


def test_a_speedrun_checkpoint_is_not_exported_as_nanogpts(tmp_path):
    os.makedirs(tmp_path / "sr")
    checkpoint.write(str(tmp_path / "sr" / "ckpt.safetensors"), {"embed.weight": np.ones((4, 8), np.float32)},
                     {"config": json.dumps({"recipe": "speedrun", "num_layers": 1})})
    with pytest.raises(MicaError, match="holds the speedrun recipe's model, which nanoGPT's ckpt.pt cannot hold"):
        convert.export_nanogpt(str(tmp_path / "sr"), str(tmp_path / "x.pt"))
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.parametrize("iter_num", [1, 4, 9, 10, 23, 60, 61, 500])
@pytest.mark.parametrize("decay_lr", [True, False])
def test_export_holds_train_pys_lr_at_the_saved_iter_num_and_its_best_val_loss_tensor(tmp_path, iter_num, decay_lr):
    """train.py sets every group's lr to get_lr(iter_num) before it estimates and saves, and saves
    best_val_loss as estimate_loss's mean (a 0-d float32 tensor): an export holds both, for each
    part of the schedule (warmup below 10, the cosine to 60, min_lr after)."""
    from torch_nanogpt import get_lr

    sched = dict(decay_lr=decay_lr, learning_rate=3e-3, warmup_iters=10, lr_decay_iters=60, min_lr=2e-4)
    cfg = {**CFG, **sched}
    best = float(np.float32(1.0 + np.random.default_rng(iter_num).random()))  # as the float32 mean it was
    os.makedirs(tmp_path / "run")
    _gpt_checkpoint(str(tmp_path / "run" / "ckpt.safetensors"), cfg, 11, iter_num=iter_num, best=repr(best))
    convert.export_nanogpt(str(tmp_path / "run"), str(tmp_path / "ckpt.pt"))
    ck = torch.load(str(tmp_path / "ckpt.pt"), weights_only=True)
    want = get_lr(cfg, iter_num)
    assert [g["lr"] for g in ck["optimizer"]["param_groups"]] == [want, want]
    if decay_lr and iter_num != 10:
        assert want != cfg["learning_rate"]  # (the base lr, what the export used to hold)
    b = ck["best_val_loss"]
    assert isinstance(b, torch.Tensor) and b.shape == () and b.dtype == torch.float32 and b.item() == best
    assert ck["iter_num"] == iter_num
