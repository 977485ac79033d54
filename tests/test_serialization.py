"""mica.save / mica.load (mica/serialization.py): torch.save's file format without torch, checked
against torch 2.13 itself in both directions: what Mica saves, torch.load reads with its default
weights_only=True (tensors, shared storage, Parameters, dtypes) and loads into a torch model; what
torch saves (state_dicts, optimizer states, bfloat16, views with strides and offsets), Mica reads.
Damaged files are sentences, and a failed save leaves the last good file."""
import dataclasses
import zipfile
import io
import os

import numpy as np
import pytest

import mica
import mica.nn as mnn

torch = pytest.importorskip("torch")


@dataclasses.dataclass
class Config:
    n_layer: int = 2
    name: str = "tiny"


def _model(lib):
    nn = lib.nn
    return nn.Sequential(nn.Embedding(7, 4), nn.Linear(4, 4), nn.LayerNorm(4), nn.BatchNorm1d(3))


def test_what_mica_saves_torch_loads_with_its_default_weights_only(tmp_path):
    mica.manual_seed(1)
    m = _model(mica)
    sd = m.state_dict()
    rng = np.random.default_rng(0)
    extra = {"ints": mica.tensor(rng.integers(-9, 9, (2, 3))), "half": mica.tensor(rng.random(5), dtype=mica.float16),
             "double": mica.tensor(rng.random((2, 2)), dtype=mica.float64), "mask": mica.tensor(rng.random(4) > 0.5),
             "scalar": mica.tensor(2.5), "empty": mica.zeros(0, 3), "view": mica.arange(6).view(2, 3).t(),
             "param": mnn.Parameter(mica.tensor(rng.standard_normal(3).astype(np.float32))), "dtype": mica.bfloat16}
    path = tmp_path / "ckpt.pt"
    mica.save({"model": sd, "tied": sd["1.weight"], "step": 3, "loss": 1.5, "extra": extra, "tag": b"\x00x"}, path)
    got = torch.load(path)  # (weights_only=True: the file holds tensors, containers and numbers only)
    assert got["step"] == 3 and got["loss"] == 1.5 and got["tag"] == b"\x00x"
    for k, v in sd.items():
        np.testing.assert_array_equal(got["model"][k].numpy(), np.asarray(v), err_msg=k)
    assert got["tied"].data_ptr() == got["model"]["1.weight"].data_ptr()  # (one tensor saved twice: one storage)
    for k, v in extra.items():
        if k == "dtype":
            assert got["extra"][k] is torch.bfloat16
            continue
        want = np.asarray(v)
        assert tuple(got["extra"][k].shape) == want.shape and str(got["extra"][k].dtype) == f"torch.{want.dtype}"
        np.testing.assert_array_equal(got["extra"][k].numpy() if k != "param" else got["extra"][k].detach().numpy(), want)
    assert isinstance(got["extra"]["param"], torch.nn.Parameter) and got["extra"]["param"].requires_grad
    theirs = _model(torch)
    theirs.load_state_dict(got["model"])  # (a torch model takes Mica's state_dict as torch saved it)


def test_what_torch_saves_mica_loads(tmp_path):
    torch.manual_seed(2)
    tm = _model(torch)
    opt = torch.optim.AdamW(tm.parameters(), lr=0.01)
    tm(torch.randint(0, 7, (2, 3))).square().mean().backward()
    opt.step()
    base = torch.arange(12, dtype=torch.float32).view(3, 4)
    path = tmp_path / "torch.pt"
    torch.save({"model": tm.state_dict(), "optimizer": opt.state_dict(), "iter_num": 5,
                "best_val_loss": torch.tensor(1.25), "bf16": torch.tensor([1.5, -2.25, 3e-3], dtype=torch.bfloat16),
                "strided": base.t(), "offset": base[1:, 2:], "size": torch.Size([2, 3]), "dtype": torch.int64,
                "config": {"n_layer": 2, "bias": False}, "names": {"a", "b"}}, path)
    got = mica.load(path, map_location="cpu")
    for k, v in tm.state_dict().items():
        np.testing.assert_array_equal(np.asarray(got["model"][k]), v.numpy(), err_msg=k)
    np.testing.assert_array_equal(np.asarray(got["bf16"]), [1.5, -2.25, torch.tensor(3e-3, dtype=torch.bfloat16).float().item()])
    np.testing.assert_array_equal(np.asarray(got["strided"]), base.t().numpy())
    np.testing.assert_array_equal(np.asarray(got["offset"]), base[1:, 2:].numpy())
    assert float(got["best_val_loss"]) == 1.25 and got["iter_num"] == 5 and got["size"] == (2, 3)
    assert got["dtype"] is mica.int64 and got["names"] == {"a", "b"} and got["config"] == {"n_layer": 2, "bias": False}
    m = _model(mica)
    m.load_state_dict(got["model"])
    state = got["optimizer"]["state"]
    for i, p in enumerate(tm.parameters()):
        np.testing.assert_array_equal(np.asarray(state[i]["exp_avg"]), opt.state[p]["exp_avg"].numpy())


def test_mica_to_mica_keeps_every_value_and_a_file_object_works():
    rng = np.random.default_rng(3)
    obj = {"a": mica.tensor(rng.standard_normal((3, 5)).astype(np.float32)),
           "nested": [mica.tensor(rng.integers(0, 5, 4)), (mica.tensor(True), 7, None, "s")],
           "array": rng.standard_normal(4)}  # (a numpy array: saved as a tensor of its type)
    buffer = io.BytesIO()
    mica.save(obj, buffer)
    buffer.seek(0)
    back = mica.load(buffer)
    np.testing.assert_array_equal(np.asarray(back["a"]), np.asarray(obj["a"]))
    np.testing.assert_array_equal(np.asarray(back["nested"][0]), np.asarray(obj["nested"][0]))
    assert bool(back["nested"][1][0]) and back["nested"][1][1:] == (7, None, "s")
    np.testing.assert_array_equal(np.asarray(back["array"]), obj["array"])
    assert np.asarray(back["array"]).dtype == np.float64


def test_weights_only_refuses_other_classes_in_one_sentence_as_torch(tmp_path):
    path = tmp_path / "cfg.pt"
    mica.save({"model": {"w": mica.ones(2)}, "config": Config()}, path)
    with pytest.raises(mica.MicaError, match=r"holds a .*Config, which weights_only=True \(torch's default\) does not "
                                             r"load; pass weights_only=False if you trust the file"):
        mica.load(path)
    assert mica.load(path, weights_only=False)["config"] == Config()
    mica.serialization.add_safe_globals([Config])
    try:
        assert mica.load(path)["config"] == Config()
    finally:
        mica.serialization._SAFE.clear()
    assert torch.load(path, weights_only=False)["config"] == Config()  # (torch reads Mica's pickle of it)


def test_a_damaged_or_foreign_file_is_one_sentence_and_a_failed_save_keeps_the_last_file(tmp_path):
    path = tmp_path / "good.pt"
    mica.save({"w": mica.tensor(np.arange(40, dtype=np.float32)), "n": 3}, path)
    data = path.read_bytes()
    rng = np.random.default_rng(4)
    for trial in range(60):
        damaged = bytearray(data)
        if trial % 3 == 0:
            damaged = damaged[:rng.integers(0, len(damaged))]
        else:
            for _ in range(rng.integers(1, 6)):
                damaged[rng.integers(0, len(damaged))] = rng.integers(0, 256)
        bad = tmp_path / f"bad{trial}.pt"
        bad.write_bytes(bytes(damaged))
        try:
            mica.load(bad)
        except mica.MicaError as e:
            assert str(e).startswith("mica.load: ")
    torch.save({"w": torch.ones(2)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(mica.MicaError, match="is a torch file in the format before torch 1.6"):
        mica.load(tmp_path / "legacy.pt")
    (tmp_path / "text.pt").write_text("not a checkpoint")
    with pytest.raises(mica.MicaError, match="is not a torch file"):
        mica.load(tmp_path / "text.pt")
    with pytest.raises(mica.MicaError, match="does not exist"):
        mica.load(tmp_path / "missing.pt")
    with pytest.raises(mica.MicaError, match="cannot save this object"):
        mica.save({"w": mica.ones(2), "f": lambda x: x}, path)
    assert path.read_bytes() == data and not [p for p in os.listdir(tmp_path) if ".tmp" in p]
    with pytest.raises(mica.MicaError, match="does not exist; make it first"):
        mica.save({}, tmp_path / "no" / "such.pt")


def test_a_torch_compiled_models_checkpoint_loads_into_the_model(tmp_path):
    """build-nanogpt saves `raw_model.state_dict()` of `torch.compile(model)`: every key under
    `_orig_mod.` (torch's OptimizedModule holds the model there). mica.compile(model) is the model
    itself, so its load_state_dict takes such a state, the prefix dropped."""
    torch.manual_seed(3)
    compiled = torch.compile(_model(torch))
    torch.save({"model": compiled.state_dict()}, tmp_path / "compiled.pt")
    state = mica.load(tmp_path / "compiled.pt")["model"]
    assert all(k.startswith("_orig_mod.") for k in state)
    m = mica.compile(_model(mica))
    m.load_state_dict(state)
    for k, v in compiled.state_dict().items():
        np.testing.assert_array_equal(np.asarray(m.state_dict()[k[len("_orig_mod."):]]), v.numpy())
    with pytest.raises(mica.MicaError, match="unexpected"):
        m.load_state_dict({**state, "other.weight": state["_orig_mod.1.weight"]})  # (not all under the prefix)


def test_views_of_one_tensor_share_one_storage_after_loading_as_torchs(tmp_path):
    base = mica.arange(12).float().view(3, 4)
    mica.save({"a": base, "rows": base[1:], "t": base.t(), "column": base[:, 1]}, tmp_path / "views.pt")
    for load in (torch.load, mica.load):
        got = load(tmp_path / "views.pt")
        np.testing.assert_array_equal(np.asarray(got["t"]), np.asarray(base).T)
        got["a"][1, 1] = 100  # (a write through one is seen through the others, as torch's views)
        assert float(got["rows"][0, 1]) == 100 and float(got["t"][1, 1]) == 100 and float(got["column"][1]) == 100
    with zipfile.ZipFile(tmp_path / "views.pt") as z:
        assert len([n for n in z.namelist() if "/data/" in n]) == 1


def test_a_leaf_tensor_keeps_requires_grad_through_a_file_as_torchs(tmp_path):
    """makemore's parameters are plain tensors made leaves (`p.requires_grad = True`): saved, torch
    loads them as leaves, and so does Mica (and a torch leaf comes back a leaf)."""
    w = mica.tensor(np.arange(6, dtype=np.float32).reshape(3, 2))
    w.requires_grad = True
    mica.save({"w": w, "x": mica.ones(2)}, tmp_path / "leaf.pt")
    theirs = torch.load(tmp_path / "leaf.pt")
    assert theirs["w"].requires_grad and not theirs["x"].requires_grad
    ours = mica.load(tmp_path / "leaf.pt")
    assert ours["w"].requires_grad and ours["w"].is_leaf and not ours["x"].requires_grad
    np.testing.assert_array_equal(np.asarray(ours["w"]), np.asarray(w))
    torch.save({"p": torch.ones(2, requires_grad=True)}, tmp_path / "torch_leaf.pt")
    assert mica.load(tmp_path / "torch_leaf.pt")["p"].requires_grad
