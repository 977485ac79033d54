"""mica prepare / train / sample as a user runs them: nanoGPT's numbers, exact resume, sampling."""
import functools
import json
import os
import re

import numpy as np
import pytest

from helpers import mica_cli
from mica.train import checkpoint

SHAKESPEARE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tinyshakespeare.txt")

TINY = ["--device=cpu", "--compile=False", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32",
        "--batch_size=4", "--eval_iters=2", "--log_interval=1", "--warmup_iters=2", "--lr_decay_iters=40"]


mica = functools.partial(mica_cli, check=True)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    r = mica("prepare", "shakespeare-char", "--input", SHAKESPEARE, cwd=d)
    return d, r.stdout


def test_prepare_reproduces_nanogpts_numbers(workdir):
    d, out = workdir
    assert "vocab size: 65" in out
    assert "train has 1,003,854 tokens" in out and "val has 111,540 tokens" in out
    meta = json.load(open(d / "data" / "shakespeare_char" / "meta.json"))
    assert meta["vocab_size"] == 65 and meta["itos"][0] == "\n"
    train = np.fromfile(d / "data" / "shakespeare_char" / "train.bin", dtype=np.uint16)
    text = open(SHAKESPEARE).read()
    assert "".join(meta["itos"][i] for i in train[:200]) == text[:200]


def _losses(stdout):
    return re.findall(r"^(iter \d+: loss [\d.]+|step \d+: train loss [\d.]+, val loss [\d.]+)", stdout, re.M)


def test_resume_continues_bitwise_exactly(workdir):
    d, _ = workdir
    common = ["shakespeare_char", *TINY, "--eval_interval=4", "--always_save_checkpoint=True", "--dropout=0.1"]
    straight = mica("train", *common, "--max_iters=12", "--out_dir=straight", cwd=d).stdout
    # stopped two iterations past its last checkpoint (at 8), as Ctrl-C would leave it
    mica("train", *common, "--max_iters=10", "--out_dir=resumed", cwd=d)
    resumed = mica("train", *common, "--max_iters=12", "--out_dir=resumed", "--init_from=resume", cwd=d).stdout
    assert "note: 4 rows of metrics.jsonl came after the checkpoint" in resumed  # (its evaluation at 8, iterations 8-10)
    assert "tokens per iteration will be: 128\n" in straight  # (nanoGPT train.py's line: 1 x 4 x 32)
    after = [line for line in _losses(straight) if int(re.search(r"\d+", line).group()) >= 8]
    assert len(after) == 2 + 5  # the evaluations at steps 8 and 12, iterations 8..12
    assert _losses(resumed) == after
    a = checkpoint.SafeTensors(str(d / "straight" / "ckpt.safetensors"))
    b = checkpoint.SafeTensors(str(d / "resumed" / "ckpt.safetensors"))
    assert a.names == b.names and a.metadata["iter_num"] == b.metadata["iter_num"] == "12"
    for name in a.names:
        assert a.read(name).tobytes() == b.read(name).tobytes(), name

    def rows(run):  # (every logged value but the clocks)
        return [{k: v for k, v in json.loads(line).items() if k not in ("time_ms", "mfu")}
                for line in open(d / run / "metrics.jsonl")]
    assert rows("resumed") == rows("straight")  # (no row twice: those past the checkpoint were dropped)

    # a resume that fails before its first save (a loss that turns non-finite, a batch order file that
    # runs out) leaves metrics.jsonl whole: the rows past the checkpoint were deleted before it trained
    mica("train", *common, "--max_iters=10", "--out_dir=failed", cwd=d)
    before = {n: (d / "failed" / n).read_bytes() for n in ("ckpt.safetensors", "metrics.jsonl", "init.safetensors")}
    r = mica_cli("train", *common, "--max_iters=12", "--out_dir=failed", "--init_from=resume",
                 "--always_save_checkpoint=False", "--learning_rate=1e30", "--decay_lr=False", "--grad_clip=0.0", cwd=d)
    assert r.returncode == 3 and "and so is metrics.jsonl (this resume's log is metrics.jsonl.new)" in r.stderr, r.stderr
    assert {n: (d / "failed" / n).read_bytes() for n in before} == before
    new = [json.loads(line) for line in open(d / "failed" / "metrics.jsonl.new")]
    assert new[-1]["stopped"] == "non-finite loss" and all(row.get("iter", 0) <= 9 for row in new[:-1])
    (d / "order.txt").write_text("0\n1\n2\n")
    r = mica_cli("train", *common, "--max_iters=12", "--out_dir=failed", "--init_from=resume",
                 "--always_save_checkpoint=False", "--batch_order=" + str(d / "order.txt"), cwd=d)
    assert r.returncode == 2 and "ran out of offsets" in r.stderr, r.stderr
    assert {n: (d / "failed" / n).read_bytes() for n in before} == before
    # then a resume that finishes makes its log the run's, as the straight run's, and leaves the run's
    # start as it was (an init.new.safetensors beside it is a stopped scratch run's)
    (d / "failed" / "init.new.safetensors").write_bytes(b"a stopped scratch run's start")
    mica("train", *common, "--max_iters=12", "--out_dir=failed", "--init_from=resume", cwd=d)
    assert rows("failed") == rows("straight") and not (d / "failed" / "metrics.jsonl.new").exists()
    assert (d / "failed" / "init.safetensors").read_bytes() == before["init.safetensors"]

    # resumed with another eval_interval, the loop does not evaluate at the checkpoint's step again: its
    # row, logged before the save, is kept (it was dropped, and never written again)
    mica("train", *common, "--max_iters=10", "--out_dir=interval", cwd=d)
    mica("train", *common, "--max_iters=12", "--eval_interval=3", "--out_dir=interval", "--init_from=resume", cwd=d)
    steps = [json.loads(line).get("step") for line in open(d / "interval" / "metrics.jsonl")]
    assert [s for s in steps if s is not None] == [0, 4, 8, 9, 12]

    # a run from scratch into a folder holding another run's checkpoint says it will replace it
    import shutil

    (d / "forgot").mkdir()
    shutil.copy(d / "straight" / "ckpt.safetensors", d / "forgot" / "ckpt.safetensors")
    for name in ("metrics.jsonl", "init.safetensors"):
        shutil.copy(d / "straight" / name, d / "forgot" / name)
    before = {p.name: p.read_bytes() for p in (d / "forgot").iterdir()}
    # stopped before its first save (a loss that turns non-finite at iter 5; the first save is at 8): the
    # earlier run's checkpoint, log and start are as they were, this run's log beside them
    r = mica_cli("train", *common, "--max_iters=12", "--eval_interval=8", "--learning_rate=1e4", "--decay_lr=False",
                 "--grad_clip=0.0", "--out_dir=forgot", cwd=d)
    assert r.returncode == 3 and "the loss is nan" in r.stderr, r.stderr
    assert "note: forgot holds an earlier run's checkpoint; this run does not resume it and replaces it, its " \
           "metrics.jsonl and init.safetensors at its first save" in r.stdout
    assert "the earlier run's ckpt.safetensors, metrics.jsonl and init.safetensors in forgot are untouched" in r.stderr
    assert {n: (d / "forgot" / n).read_bytes() for n in before} == before
    assert b'"stopped": "non-finite loss"' in (d / "forgot" / "metrics.jsonl.new").read_bytes()
    # a run that ends without a save (nanoGPT writes nothing then) leaves them too, its log beside them
    r = mica("train", *common, "--max_iters=0", "--out_dir=forgot", cwd=d)
    assert "note: this run saved no checkpoint, so the earlier run's ckpt.safetensors, metrics.jsonl and " \
           "init.safetensors in forgot stay as they were; this run's log is metrics.jsonl.new" in r.stdout
    assert {n: (d / "forgot" / n).read_bytes() for n in before} == before
    assert (d / "forgot" / "metrics.jsonl.new").exists() and not (d / "forgot" / "init.new.safetensors").exists()
    # a run that saves makes its files the folder's
    mica("train", *common, "--max_iters=4", "--out_dir=forgot", cwd=d)
    assert not (d / "forgot" / "metrics.jsonl.new").exists() and not (d / "forgot" / "init.new.safetensors").exists()
    assert (d / "forgot" / "metrics.jsonl").read_bytes() != before["metrics.jsonl"]
    assert (d / "forgot" / "init.safetensors").read_bytes() != before["init.safetensors"]
    assert json.loads((d / "forgot" / "metrics.jsonl").read_text().splitlines()[0]) == \
        json.loads((d / "straight" / "metrics.jsonl").read_text().splitlines()[0]) | {"step": 0}


def test_sample_produces_text_of_the_asked_length(workdir):
    d, _ = workdir
    mica("train", "shakespeare_char", *TINY, "--max_iters=4", "--eval_interval=2", "--always_save_checkpoint=True",
         "--out_dir=sampled", cwd=d)
    out = mica("sample", "--out_dir=sampled", "--start=ROMEO:", "--num_samples=3", "--max_new_tokens=40", cwd=d).stdout
    samples = out.split("---------------\n")[:-1]
    assert len(samples) == 3
    for s in samples:
        assert s.startswith("ROMEO:") and len(s) == len("ROMEO:") + 40 + 1  # the text, then print's newline
    again = mica("sample", "--out_dir=sampled", "--start=ROMEO:", "--num_samples=3", "--max_new_tokens=40",
                 "--dtype=bfloat16", cwd=d)
    assert again.stdout == out  # seeded; sample.py's dtype accepted, and said to change nothing
    assert ("note: sampling computes in float32, from the float32 weights; dtype=bfloat16 is accepted and changes "
            "nothing") in again.stderr


def test_metrics_and_checkpoint_layout(workdir):
    d, _ = workdir
    lines = [json.loads(line) for line in open(d / "straight" / "metrics.jsonl")]
    assert any("val_loss" in m for m in lines) and any("lr" in m for m in lines)
    st = checkpoint.SafeTensors(str(d / "straight" / "ckpt.safetensors"))
    assert "transformer.wte.weight" in st.names and "optimizer.exp_avg.transformer.wte.weight" in st.names
    assert "optimizer.step" in st.names
    cfg = json.loads(st.metadata["config"])
    assert cfg["n_layer"] == 2 and cfg["dataset"] == "shakespeare_char"


def test_trainer_agrees_with_pytorch_from_a_shared_start(workdir):
    """Method B: PyTorch's initial weights and one batch order on both sides, no dropout."""
    from mica.bench import check

    d, _ = workdir
    cwd = os.getcwd()
    os.chdir(d)
    try:
        v = check.method_b("shakespeare_char", TINY, iters=20, out_dir="check-b", threads=2, log=lambda *a: None)
    finally:
        os.chdir(cwd)
    assert len(v["mica"]) == 21
    assert v["relative_difference"][0] < 1e-5, v["relative_difference"][:3]
    assert max(v["relative_difference"][1:]) < 0.01
    assert v["passed"]


def test_plot_writes_a_png(workdir):
    d, _ = workdir
    r = mica("plot", "straight", cwd=d)
    png = d / "straight" / "loss.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", r.stdout
    mica("plot", "straight", "--out", "plots/new/loss.png", cwd=d)  # (its folders made, as export makes --to's)
    assert (d / "plots" / "new" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_export_to_nanogpt_and_import_back(workdir):
    import torch

    from mica.bench.torch_gpt import TorchGPT
    from mica.models.gpt import GPTConfig

    d, _ = workdir
    mica("export", "straight", "--to", "exported.pt", cwd=d)
    ck = torch.load(d / "exported.pt", weights_only=False)
    args = ck["model_args"]
    assert args["n_layer"] == 2 and args["vocab_size"] == 65 and ck["iter_num"] == 12
    model = TorchGPT(GPTConfig(**{k: args[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "bias",
                                                          "vocab_size", "dropout")}))
    model.load_state_dict(ck["model"])  # nanoGPT's keys, the tie under both names
    assert len(ck["optimizer"]["state"]) == len(list(model.parameters()))
    mica("import", "exported.pt", "--out_dir", "imported", cwd=d)
    a = checkpoint.SafeTensors(str(d / "straight" / "ckpt.safetensors"))
    b = checkpoint.SafeTensors(str(d / "imported" / "ckpt.safetensors"))
    for name in a.names:
        if not name.startswith("data."):
            assert np.array_equal(a.read(name), b.read(name)), name
    out = mica("sample", "--out_dir=imported", "--num_samples=1", "--max_new_tokens=10", cwd=d).stdout
    assert out.endswith("---------------\n")


def test_trainer_refuses_a_step_that_would_not_update_in_place(workdir, monkeypatch):
    """The native loop reruns one arena: state not updated where it lies would silently freeze
    training, so building such a trainer is an error."""
    import mica.passes.memory as memory
    from mica.errors import MicaError
    from mica.train import run

    d, _ = workdir
    monkeypatch.setattr(memory, "_plan_inplace", lambda *a: {})
    monkeypatch.chdir(d)
    with pytest.raises(MicaError, match="not updated in place"):
        run.prepare_run("shakespeare_char", TINY + ["--out_dir=frozen"], log=lambda *a: None)


def _plan_bytes(stdout):
    m = re.search(r"the trainer holds ([\d,]+) bytes", stdout)
    arenas = dict(re.findall(r"^  (train|eval) arena\s+([\d,]+) bytes", stdout, re.M))
    return int(m.group(1).replace(",", "")), {k: int(v.replace(",", "")) for k, v in arenas.items()}


def test_eval_inside_the_train_arena_changes_no_bit(workdir, monkeypatch):
    """The eval arena lies in the train arena's bytes dead between steps: evaluating after every
    step (dropout on) gives bitwise the losses, validation losses and checkpoint of a run that keeps
    the two arenas apart, and the plan is max(train, state + eval). (The resume test's trainer: no
    compile of its own.)"""
    d, _ = workdir
    common = ["shakespeare_char", *TINY, "--eval_interval=1", "--always_save_checkpoint=True", "--dropout=0.1",
              "--max_iters=3"]
    shared = mica("train", *common, "--out_dir=overlap", cwd=d).stdout
    monkeypatch.setenv("MICA_SEPARATE_ARENAS", "1")
    apart = mica("train", *common, "--out_dir=apart", cwd=d).stdout
    metrics = [[line for line in open(d / out / "metrics.jsonl") if "time_ms" not in line or "loss" in line]
               for out in ("overlap", "apart")]
    strip = [[re.sub(r', "(time_ms|mfu)": [^,}]+', "", line) for line in m] for m in metrics]
    assert strip[0] == strip[1] and sum("val_loss" in line for line in strip[0]) == 4
    a = checkpoint.SafeTensors(str(d / "overlap" / "ckpt.safetensors"))
    b = checkpoint.SafeTensors(str(d / "apart" / "ckpt.safetensors"))
    assert a.names == b.names and a.metadata["iter_num"] == "3"
    for name in a.names:
        assert a.read(name).tobytes() == b.read(name).tobytes(), name
    total, arenas = _plan_bytes(shared)
    total_apart, arenas_apart = _plan_bytes(apart)
    assert arenas == arenas_apart and total_apart == arenas["train"] + arenas["eval"]
    state = int(re.search(r"at offset ([\d,]+)", shared).group(1).replace(",", ""))
    st = a.names  # the state: every parameter and optimizer tensor, each on its own alignment
    assert 0 < state < arenas["train"] and state >= sum(a.read(n).nbytes for n in st if n != "optimizer.step")
    assert total == max(arenas["train"], state + arenas["eval"]) < total_apart


def test_a_batch_order_given_to_a_resume_is_that_runs_from_its_first_iteration(workdir):
    """A recorded order's offsets are the run's own from its first iteration, a resume's included:
    the batch its checkpoint drew for that iteration gives way to the file's first rows (as for an
    imported checkpoint, which holds none). Split where the straight run's file is cut, the two
    runs are the same run, bit for bit."""
    d, _ = workdir
    rows, windows = 4, 1_003_854 - 32
    order = np.random.default_rng(7).integers(0, windows, (9, rows))  # a batch before iteration 0, then 8
    np.savetxt(d / "order_all.txt", order.ravel(), fmt="%d")
    np.savetxt(d / "order_late.txt", order[4:].ravel(), fmt="%d")  # the batches of iterations 4..8
    common = ["shakespeare_char", *TINY, "--eval_interval=4", "--dropout=0.1"]
    straight = mica("train", *common, "--max_iters=8", "--out_dir=order_straight", "--batch_order=order_all.txt",
                    cwd=d).stdout
    mica("train", *common, "--max_iters=4", "--out_dir=order_split", "--batch_order=order_all.txt", cwd=d)
    resumed = mica("train", *common, "--max_iters=8", "--out_dir=order_split", "--init_from=resume",
                   "--batch_order=order_late.txt", cwd=d).stdout
    after = [line for line in _losses(straight) if int(re.search(r"\d+", line).group()) >= 4]
    assert _losses(resumed) == after and len(after) == 2 + 5
