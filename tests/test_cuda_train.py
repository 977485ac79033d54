"""The CUDA trainer (`mica train --device=cuda`), run here on the CPU simulator of the very CUDA
source nvcc builds for a card: the same losses as the CPU trainer from the same init and batch
order, an exact resume, sampling, and a sentence for every device setting it cannot take."""
import json
import os
import subprocess

import numpy as np
import pytest

from helpers import mica_cli
from mica.errors import MicaError
from mica.train import checkpoint, run
from test_cuda import needs_gpu, needs_simulator
from test_runtime import work  # noqa: F401  (the prepared folder, as a fixture)

TINY = ["shakespeare_char", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
        "--eval_iters=2", "--log_interval=1", "--max_iters=20", "--eval_interval=10", "--dropout=0.1",
        "--compile=False", "--dtype=float32", "--always_save_checkpoint=True"]
SIM = ["--device=cuda", "--simulate=True"]
QUIET = dict(log=lambda *a: None)


def train(args):
    exe, manifest, cfg = run.prepare_run(args[0], args[1:], **QUIET)
    r = subprocess.run([exe, manifest], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    steps = {r["iter"]: r["loss"] for r in rows if "loss" in r and "train_loss" not in r}
    evals = {r["step"]: (r["train_loss"], r["val_loss"]) for r in rows if "train_loss" in r}
    return steps, evals


@pytest.mark.parametrize("device", [pytest.param(SIM, id="simulated", marks=needs_simulator),
                                    pytest.param(["--device=cuda"], id="on-the-gpu", marks=needs_gpu)])
def test_twenty_cuda_iterations_give_the_cpu_trainers_losses(work, device):
    """Same seed: the same init, batches and dropout masks (one Philox stream on both targets); only
    the products' summation order differs, so the losses agree to float32 rounding, not bit for bit.
    Two micro-batches a step: the CUDA program's second runs the first one's kernel functions.
    memory_budget=auto reads the card's free memory, or in the simulator (whose card is this
    machine's memory) the host's."""
    train([*TINY, *device, "--out_dir=gpu", "--gradient_accumulation_steps=2", "--memory_budget=auto"])
    train([*TINY, "--device=cpu", "--out_dir=cpu", "--gradient_accumulation_steps=2"])
    (gpu, gpu_eval), (cpu, cpu_eval) = metrics("gpu"), metrics("cpu")
    assert sorted(gpu) == sorted(cpu) == list(range(21))
    for it in cpu:
        assert abs(gpu[it] - cpu[it]) <= 1e-4 * abs(cpu[it]), (it, gpu[it], cpu[it])
    assert sorted(gpu_eval) == sorted(cpu_eval) == [0, 10, 20]
    for it in cpu_eval:
        for a, b in zip(gpu_eval[it], cpu_eval[it]):
            assert abs(a - b) <= 1e-4 * abs(b), it
    assert len(set(cpu.values())) > 15  # (it trained: the losses moved)
    a, b = checkpoint.SafeTensors("gpu/ckpt.safetensors"), checkpoint.SafeTensors("cpu/ckpt.safetensors")
    assert set(a.names) == set(b.names)
    for name in a.names:
        x, y = a.read(name), b.read(name)
        assert x.shape == y.shape and x.dtype == y.dtype, name
        if x.dtype.kind == "f":
            assert np.linalg.norm(x - y) <= 1e-4 * max(np.linalg.norm(y), 1e-30), name
        else:
            assert np.array_equal(x, y), name  # the step, the sampler's state, the next batch


@needs_simulator
def test_a_simulated_run_resumes_bit_for_bit(work):
    train([*TINY, *SIM, "--out_dir=straight"])
    train([*TINY, *SIM, "--out_dir=halves", "--max_iters=10"])
    train([*TINY, *SIM, "--out_dir=halves", "--init_from=resume"])
    a, b = checkpoint.SafeTensors("straight/ckpt.safetensors"), checkpoint.SafeTensors("halves/ckpt.safetensors")
    for name in a.names:
        assert np.array_equal(a.read(name), b.read(name)), name
    assert metrics("straight")[0][20] == metrics("halves")[0][20]


@needs_simulator
def test_sampling_on_the_simulator_gives_the_cpus_text(work):
    train([*TINY, *SIM, "--out_dir=gpu", "--max_iters=10"])
    args = ["sample", "--out_dir=gpu", "--num_samples=2", "--max_new_tokens=30", "--seed=7"]
    on_gpu = mica_cli(*args, "--device=cuda", "--simulate=True", check=True)
    on_cpu = mica_cli(*args, "--device=cpu", check=True)
    assert on_gpu.stdout == on_cpu.stdout and on_gpu.stdout.count("---------------") == 2


@pytest.mark.parametrize("flags,sentence", [
    (["--device=cuda:1"], "choose the card with CUDA_VISIBLE_DEVICES=1"),
    (["--device=mps"], "device='mps' is not available; pass --device=cpu or --device=cuda"),
    (["--device=cpu", "--simulate=True"], "simulate=True simulates the CUDA trainer; pass it with --device=cuda"),
])
def test_device_settings_it_cannot_take_are_sentences(work, flags, sentence):
    with pytest.raises(MicaError) as e:
        run.prepare_run(TINY[0], [*TINY[1:], *flags], **QUIET)
    assert sentence in str(e.value)


def test_without_a_gpu_device_cuda_says_so_before_compiling(work):
    from mica.train import config

    if config.cuda_unusable() is None:
        pytest.skip("a GPU is present")
    r = mica_cli("train", *TINY, "--device=cuda")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "device=cuda needs an NVIDIA GPU and its driver" in r.stderr and "--simulate=True" in r.stderr
    assert "compiling" not in r.stdout + r.stderr
