"""mica bench / mica check --device=cuda, in every piece that runs without a GPU: the nvidia-smi
parser and sampler, the libraries read from /proc/PID/maps, a failed or out-of-memory mode kept
in the table and the JSON, the command lines each side gets on a card, the sentence where there is
no GPU, and the protocol end to end with Mica's CUDA trainer on the simulator. What needs a card
runs in benchmarks/gpu_check.sh."""
import json
import os
import random
import stat
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from mica.bench import check, protocol, torch_runner
from mica.data.prepare import prepare_char
from mica.train import config as config_mod
from test_cuda import needs_simulator

SHAKESPEARE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tinyshakespeare.txt")
TINY = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=2)


def _mica(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "mica.cli", *args], capture_output=True, text=True, cwd=cwd)


# ---- nvidia-smi's compute-apps list ------------------------------------------------------------------------------

def test_compute_apps_parser_reads_the_pids_line():
    text = "4242, 1536\n99, 80\n4242, 512\n"
    assert protocol.parse_compute_apps(text, 4242) == 2048  # one line a GPU: summed
    assert protocol.parse_compute_apps(text, 99) == 80
    assert protocol.parse_compute_apps(text, 7) is None  # not listed: unknown, not zero
    assert protocol.parse_compute_apps("", 7) is None
    assert protocol.parse_compute_apps("4242, [N/A]\n", 4242) is None
    assert protocol.parse_compute_apps("4242, [Not Supported]\n99, 3", 4242) is None
    assert protocol.parse_compute_apps("  4242 ,  0 \r\n", 4242) == 0  # listed, holding nothing yet
    assert protocol.parse_compute_apps("No running processes found\n", 4242) is None
    for odd in ("4242, 1_000", "4242, ١٢٣", "4242, 12.5", "4242, -3", "4242, 12, 3", "4242,", ",12", "0x1092, 5",
                "4242 12", "4242, 9999999999999999999999"):
        assert protocol.parse_compute_apps(odd, 4242) is None, odd
    assert protocol.parse_compute_apps(None, 4242) is None and protocol.parse_compute_apps(b"4242, 3", 4242) is None


def test_compute_apps_parser_survives_mutated_lines():
    rng = random.Random(7)
    good = ["4242, 1536", "17, 80", "4242, 512", "123456, 70000"]
    alphabet = "0123456789, \t\n\r[]/NAabc-.:;\x00\xff\u0661\u00a0"
    for _ in range(3000):
        lines = list(good)
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(lines))
            s = lines[i]
            op = rng.randrange(4)
            k = rng.randrange(len(s) + 1)
            if op == 0:
                s = s[:k] + rng.choice(alphabet) + s[k:]
            elif op == 1:
                s = s[:k] + s[k + 1:]
            elif op == 2:
                s = s[:k] + rng.choice(alphabet) + s[k + 1:]
            else:
                s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
            lines[i] = s
        got = protocol.parse_compute_apps("\n".join(lines), 4242)
        assert got is None or (type(got) is int and got >= 0)
    for _ in range(500):  # garbage without one well-formed line: always unknown
        junk = "".join(rng.choice("[]NA/abc ,.-\t:;\n") for _ in range(rng.randint(0, 200)))
        assert protocol.parse_compute_apps(junk, 4242) is None


def _fake_nvidia_smi(folder, body):
    folder.mkdir(exist_ok=True)
    path = folder / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(folder)


def test_the_sampler_reads_nvidia_smi_for_the_running_process(tmp_path, monkeypatch):
    """A stand-in nvidia-smi that lists every process on the machine at 640 MiB: the sampler finds
    the one it watches; one that lists nothing readable gives unknown, with why."""
    cmd = [sys.executable, "-c", "import time; time.sleep(1.0); print('iter 0: loss 1.0'); print('iter 1: loss 1.0')"]
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path / "a", "for p in $(ls /proc | grep -E '^[0-9]+$'); do "
                                                "echo \"$p, 640\"; done\n") + os.pathsep + os.environ["PATH"])
    r = protocol.run_once(cmd, dict(os.environ), 0, 1, gpu=True)
    assert r["peak_gpu_mib"] == 640 and "peak_gpu_unknown" not in r and "gpu_sampled" not in r
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path / "b", "echo '1, [N/A]'\n") + os.pathsep + os.environ["PATH"])
    r = protocol.run_once(cmd, dict(os.environ), 0, 1, gpu=True)
    assert r["peak_gpu_mib"] is None and r["peak_gpu_unknown"] == "nvidia-smi did not list the process"
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path / "c", "echo broken >&2; exit 9\n") + os.pathsep
                       + os.environ["PATH"])
    r = protocol.run_once(cmd, dict(os.environ), 0, 1, gpu=True)
    assert r["peak_gpu_mib"] is None and r["peak_gpu_unknown"].startswith("nvidia-smi failed (broken")
    monkeypatch.setattr(protocol.shutil, "which", lambda name: None)
    r = protocol.run_once(cmd, dict(os.environ), 0, 1, gpu=True)
    assert r["peak_gpu_mib"] is None and r["peak_gpu_unknown"] == "nvidia-smi is not installed"
    r = protocol.run_once(cmd, dict(os.environ), 0, 1)  # the CPU path never asks
    assert "peak_gpu_mib" not in r and "peak_gpu_unknown" not in r
    assert r["peak_rss_kb"] > 0


# ---- /proc/PID/maps ------------------------------------------------------------------------------------------------

MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1 /home/u/.cache/mica/trainer-cuda-1/mica-trainer
7f0000000000-7f0000021000 rw-p 00000000 00:00 0
7f1000000000-7f1000200000 r-xp 00000000 fd:01 2 /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06
7f1100000000-7f1100100000 r-xp 00000000 fd:01 3 /venv/site-packages/nvidia/cu13/lib/libcublasLt.so.13
7f1100100000-7f1100200000 r--p 00100000 fd:01 3 /venv/site-packages/nvidia/cu13/lib/libcublasLt.so.13
7f1200000000-7f1200100000 r-xp 00000000 fd:01 4 /venv/site-packages/nvidia/cu13/lib/libcublas.so.13
7f1300000000-7f1300100000 r-xp 00000000 fd:01 5 /venv/site-packages/nvidia/cu13/lib/libcudart.so.13
7f1400000000-7f1400100000 r-xp 00000000 fd:01 6 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1500000000-7f1500100000 r-xp 00000000 fd:01 7 /usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30
7f1600000000-7f1600100000 r-xp 00000000 fd:01 8 /usr/lib/x86_64-linux-gnu/libcurl.so.4.8.0
7f1700000000-7f1700100000 r-xp 00000000 fd:01 9 /opt/my libs/libnvidia-ml.so.1
7f1800000000-7f1800100000 r-xp 00000000 fd:01 10 /tmp/old/libfoo.so (deleted)
7f1900000000-7f1900100000 r--p 00000000 fd:01 11 /usr/lib/locale/locale-archive
7f1a00000000-7f1a00100000 rw-s 00000000 00:05 12 /dev/nvidia0
7f1b00000000-7f1b00100000 rw-s 00000000 00:01 13 /memfd:cuda-ipc (deleted)
7f1c00000000-7f1c00100000 r-xp 00000000 fd:01 14 /opt/lib.so.d/plugin.conf
7f1d00000000-7f1d00100000 r-xp 00000000 fd:01 15 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
7ffd00100000-7ffd00102000 r-xp 00000000 00:00 0 [vdso]
garbage line
"""


def test_libraries_from_a_maps_file():
    libs = protocol.maps_libraries(MAPS)
    assert sorted(os.path.basename(p) for p in libs) == [
        "ld-linux-x86-64.so.2", "libc.so.6", "libcublas.so.13", "libcublasLt.so.13", "libcuda.so.580.65.06",
        "libcudart.so.13", "libcurl.so.4.8.0", "libfoo.so", "libnvidia-ml.so.1", "libstdc++.so.6.0.30"]
    assert "/opt/my libs/libnvidia-ml.so.1" in libs and "/tmp/old/libfoo.so" in libs
    assert protocol.nvidia_libraries(libs) == ["libcublas.so.13", "libcublasLt.so.13", "libcuda.so.580.65.06",
                                               "libcudart.so.13", "libnvidia-ml.so.1"]  # (not libcurl)
    assert not protocol.nvrtc_mapped(libs)
    with_nvrtc = MAPS + "7f1e00000000-7f1e00100000 r-xp 00000000 fd:01 16 /cu13/lib/libnvrtc-builtins.so.13.0\n"
    assert protocol.nvrtc_mapped(protocol.maps_libraries(with_nvrtc))
    assert "libnvrtc-builtins.so.13.0" in protocol.nvidia_libraries(protocol.maps_libraries(with_nvrtc))
    assert protocol.maps_libraries("") == set() and protocol.maps_libraries("\n\n x y z\n") == set()


def test_libraries_of_this_very_process():
    with open(f"/proc/{os.getpid()}/maps") as f:
        libs = protocol.maps_libraries(f.read())
    names = [os.path.basename(p) for p in libs]
    assert any(n.startswith("libc.so") or n.startswith("libc-") for n in names), names
    assert any(n.startswith("_multiarray_umath") for n in names)  # numpy, imported above
    assert all(os.path.isabs(p) and protocol.SHARED_OBJECT.search(os.path.basename(p)) for p in libs)
    assert not protocol.nvrtc_mapped(libs)


# ---- a mode that fails or runs out of memory (amendment 5) ----------------------------------------------------------

FAKE_RUNNER = textwrap.dedent("""
    import json, os, sys, time
    side, iters, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if side == "mica":
        os.makedirs(out, exist_ok=True)
        print("memory plan (exact, before the first step): the trainer holds 1,048,576 bytes (1.0 MiB) in 2 arenas")
    if side == "oom":
        print("CUDA out of memory in mode max-autotune: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a "
              "total capacity of 139.80 GiB", file=sys.stderr)
        sys.exit(3)
    if side == "broken":
        print("Traceback (most recent call last):", file=sys.stderr)
        print("torch._inductor.exc.InductorError: RuntimeError: Triton compilation failed", file=sys.stderr)
        sys.exit(1)
    if side == "oom-later":  # runs once, then the card is full
        flag = os.path.join(out, "ran")
        if os.path.exists(flag):
            print("mica: error: the GPU has no room for the train program's 9 bytes (out of memory)", file=sys.stderr)
            sys.exit(2)
        open(flag, "w").close()
    time.sleep(0.3)
    step = {"mica": 0.004, "eager": 0.008}.get(side, 0.002)
    with open(os.path.join(out, "metrics.jsonl"), "w") if side == "mica" else open(os.devnull, "w") as m:
        t0 = time.perf_counter()
        for it in range(iters + 1):
            time.sleep(step)
            t1 = time.perf_counter()
            m.write(json.dumps({"iter": it, "time_ms": (t1 - t0) * 1000}) + "\\n")
            print(f"iter {it}: loss 4.0, time {(t1 - t0) * 1000:.2f}ms", flush=True)
            t0 = t1
    if side != "mica":
        print("cuda memory: max_memory_reserved 104857600 bytes, max_memory_allocated 52428800 bytes")
""")


def test_a_failed_or_oom_mode_stays_in_the_table_and_the_json(tmp_path, monkeypatch):
    runner = tmp_path / "runner.py"
    runner.write_text(FAKE_RUNNER)
    sides = {"eager": "eager", "default": "broken", "reduce-overhead": "oom-later", "max-autotune": "oom"}
    calls = []

    def mica_cmd(model, data_dir, out_dir, iters, threads, opt_level, every=10, **device):
        calls.append(("mica", device))
        return [sys.executable, str(runner), "mica", str(iters), out_dir]

    def torch_cmd(model, data_dir, mode, iters, threads, every=10, **device):
        calls.append((mode, device))
        return [sys.executable, str(runner), sides[mode], str(iters), str(tmp_path)]

    monkeypatch.setattr(protocol, "_mica_cmd", mica_cmd)
    monkeypatch.setattr(protocol, "_torch_cmd", torch_cmd)
    monkeypatch.setattr(protocol, "check_device", lambda device, tf32, simulate: device)  # as if a card were here
    monkeypatch.setattr(protocol, "gpu_name", lambda: "NVIDIA H200")
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path / "smi", "for p in $(ls /proc | grep -E '^[0-9]+$'); do "
                                                "echo \"$p, 700\"; done\n") + os.pathsep + os.environ["PATH"])
    out = tmp_path / "b"
    (tmp_path / "data").mkdir()  # (the runners are fakes, but the protocol checks the folder is there)
    res = protocol.bench(model="shakespeare_char", data_dir=str(tmp_path / "data"), rounds=2, warmup=10, window=10,
                         every=10, out=str(out), threads=1, device="cuda", tf32=True, log=lambda *a: None)
    assert ("mica", dict(device="cuda", tf32=True, simulate=False, dtype="float32")) in calls
    assert ("eager", dict(device="cuda", tf32=True, dtype="float32")) in calls
    saved = json.load(open(out / "bench-shakespeare_char.json"))
    for r in (res, saved):
        assert set(r["failures"]) == {"pytorch default", "pytorch reduce-overhead", "pytorch max-autotune"}
        assert r["failure_kinds"] == {"pytorch default": "failed", "pytorch reduce-overhead": "OOM",
                                      "pytorch max-autotune": "OOM"}
        assert "CUDA out of memory. Tried to allocate 20.00 GiB" in r["failures"]["pytorch max-autotune"]
        assert "Triton compilation failed" in r["failures"]["pytorch default"]
        assert "the GPU has no room" in r["failures"]["pytorch reduce-overhead"]
        assert (r["device"], r["tf32"], r["gpu"], r["simulated"]) == ("cuda", True, "NVIDIA H200", False)
        # reduce-overhead ran its discarded run, then ran out: kept, but never the comparison
        assert r["fastest_pytorch"] == "pytorch eager"
        assert "pytorch max-autotune" not in r["configs"] and "pytorch default" not in r["configs"]
        eager, mica = r["configs"]["pytorch eager"], r["configs"]["mica O2"]
        assert eager["torch_max_reserved_mb"] == 100 and eager["torch_max_allocated_mb"] == 50
        assert "torch_max_reserved_mb" not in mica and mica["plan_mb"] == 1
        assert eager["peak_gpu_mb"] == mica["peak_gpu_mb"] == 700 and eager["peak_rss_mb"] > 0
        assert mica["nvidia_libraries"] == [] and mica["nvrtc"] is False
        assert mica["verdict"] in ("faster", "level", "slower")
    table = protocol.table(res)
    assert "| pytorch max-autotune | OOM: CUDA out of memory in mode max-autotune" in table
    assert "| pytorch default | failed: torch._inductor.exc.InductorError" in table
    assert "| pytorch reduce-overhead | OOM: mica: error: the GPU has no room" in table
    assert "NVIDIA H200" in table and "TF32 on on both sides" in table
    assert "| peak GPU MB (nvidia-smi) | PyTorch max reserved MB (allocated) |" in table
    assert "| 700 | 100 (50) |" in table
    widths = {line.count("|") for line in table.splitlines() if line.startswith("|")}
    assert widths == {11}, table  # every row, failed ones too, has the table's ten columns


def test_a_mode_that_fails_everywhere_still_gives_a_table(tmp_path, monkeypatch):
    runner = tmp_path / "runner.py"
    runner.write_text(FAKE_RUNNER)
    monkeypatch.setattr(protocol, "_mica_cmd", lambda *a, **k: [sys.executable, str(runner), "oom", "1", "x"])
    monkeypatch.setattr(protocol, "_torch_cmd", lambda *a, **k: [sys.executable, str(runner), "broken", "1", "x"])
    monkeypatch.setattr(protocol, "check_device", lambda device, tf32, simulate: device)
    monkeypatch.setattr(protocol, "check_data", lambda model, data_dir: None)
    res = protocol.bench(model="gpt2", rounds=1, warmup=1, window=1, every=1, torch_modes=("eager",),
                         out=str(tmp_path / "b"), device="cuda", log=lambda *a: None)
    assert res["configs"] == {} and res["failure_kinds"] == {"mica O2": "OOM", "pytorch eager": "failed"}
    assert "| mica O2 | OOM: CUDA out of memory" in protocol.table(res)


def test_the_runners_oom_is_one_line_and_exit_status_3(monkeypatch, capsys):
    import torch

    def full(a, _torch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                     "79.19 GiB of which 1.2 GiB is free.\nOf the allocated memory ...")

    monkeypatch.setattr(torch_runner, "train", full)
    assert torch_runner.main(["--data", "d", "--mode", "max-autotune", "--device", "cuda"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["CUDA out of memory in mode max-autotune: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                   "has a total capacity of 79.19 GiB of which 1.2 GiB is free."]
    assert protocol.failure_kind(err[0]) == "OOM"

    def wrapped(a, _torch):  # as torch.compile's backends wrap it
        raise RuntimeError("backend='inductor' raised:\nRuntimeError: CUDA error: out of memory\n")

    monkeypatch.setattr(torch_runner, "train", wrapped)
    assert torch_runner.main(["--data", "d", "--device", "cuda"]) == 3
    said = "CUDA out of memory in mode eager: RuntimeError: CUDA error: out of memory"
    assert capsys.readouterr().err.strip() == said

    def other(a, _torch):
        raise RuntimeError("Triton compilation failed")

    monkeypatch.setattr(torch_runner, "train", other)
    with pytest.raises(RuntimeError, match="Triton"):  # not memory: its traceback's last line is the reason
        torch_runner.main(["--data", "d", "--device", "cuda"])
    assert protocol.failure_kind("RuntimeError: Triton compilation failed") == "failed"


# ---- the command lines on a card -------------------------------------------------------------------------------

def test_command_lines_on_cuda_carry_the_device_and_tf32(tmp_path):
    for tf32 in (False, True):
        cmd = protocol._mica_cmd("shakespeare_char", "data/sc", str(tmp_path / "m"), 400, 4, 2, device="cuda",
                                 tf32=tf32)
        cfg = config_mod.load(None, cmd[4:])  # what `mica train` reads from them
        assert (cfg["device"], cfg["tf32"], cfg["dtype"], cfg["simulate"]) == ("cuda", tf32, "float32", False)
        assert f"--tf32={tf32}" in cmd and not any(a.startswith("--simulate") for a in cmd)
        t = protocol._torch_cmd("shakespeare_char", "data/sc", "reduce-overhead", 400, 4, device="cuda", tf32=tf32)
        assert t[t.index("--device") + 1] == "cuda" and ("--tf32" in t) == tf32
        seen = {}
        torch_runner_args(t[3:], seen)
        assert (seen["device"], seen["tf32"], seen["mode"]) == ("cuda", tf32, "reduce-overhead")
        assert json.loads(t[t.index("--config") + 1])["n_embd"] == cfg["n_embd"] == 384
    sim = protocol._mica_cmd("shakespeare_char", "d", "o", 4, 2, 2, device="cuda", simulate=True)
    assert config_mod.load(None, sim[4:])["simulate"] is True


def torch_runner_args(argv, seen):
    def record(a, _torch):
        seen.update(vars(a))
        return 0

    original = torch_runner.train
    torch_runner.train = record
    try:
        assert torch_runner.main(argv) == 0
    finally:
        torch_runner.train = original


def test_the_cpu_command_lines_are_unchanged(tmp_path):
    out = str(tmp_path / "m")
    cmd = protocol._mica_cmd("cpu", "data/sc", out, 30, 2, 2, every=10)
    settings = {**protocol.MODELS["cpu"], "max_iters": 30, "eval_interval": 130, "eval_iters": 1, "log_interval": 10,
                "always_save_checkpoint": False, "out_dir": out, "device": "cpu", "data_dir": "data/sc", "threads": 2,
                "opt_level": 2, "time_every_iter": True}
    assert cmd == protocol.mica_train_cmd(settings)
    t = protocol._torch_cmd("cpu", "data/sc", "eager", 30, 2)
    assert "--device" not in t and "--tf32" not in t and t[-2:] == ["--threads", "2"]
    assert check._device_settings("cpu", False) == ["--device=cpu"]


def test_pytorch_precision_is_tf32_only_when_both_sides_may():
    calls = []
    fake = types.SimpleNamespace(backends=types.SimpleNamespace(cuda=types.SimpleNamespace(
        matmul=types.SimpleNamespace(allow_tf32=None)), cudnn=types.SimpleNamespace(allow_tf32=None)),
        set_float32_matmul_precision=calls.append)
    torch_runner.precision(fake, False)
    assert (fake.backends.cuda.matmul.allow_tf32, fake.backends.cudnn.allow_tf32, calls) == (False, False, ["highest"])
    torch_runner.precision(fake, True)
    assert (fake.backends.cuda.matmul.allow_tf32, fake.backends.cudnn.allow_tf32, calls[-1]) == (True, True, "high")


def test_method_b_on_cuda_is_float32_without_tf32():
    settings = check._device_settings("cuda", False)
    cfg = config_mod.load("shakespeare_char", settings)
    assert (cfg["device"], cfg["tf32"], cfg["dtype"], cfg["simulate"]) == ("cuda", False, "float32", False)
    assert "--simulate=True" in check._device_settings("cuda", True)


def test_cuda_defaults_are_the_reports_window():
    assert "tutorial" not in protocol.CUDA_DEFAULTS
    for name in ("shakespeare_char", "gpt2", "gpt2-medium", "cpu"):
        d = protocol.CUDA_DEFAULTS[name]
        assert (d["warmup"], d["window"], d["every"], d["rounds"]) == (100, 300, 10, 5)
        assert d["data_dir"] == protocol.DEFAULTS[name]["data_dir"] and d["modes"] == protocol.TORCH_MODES


# ---- no GPU here: one sentence, before anything runs -----------------------------------------------------------

@pytest.mark.parametrize("args", [["bench", "--device=cuda"], ["bench", "--device=cuda", "--model", "gpt2-medium"],
                                  ["bench", "--device=cuda", "--tf32", "--modes", "eager"],
                                  ["check", "--method", "b", "--device=cuda"],
                                  ["check", "--method", "a", "--device", "cuda"]])
def test_no_gpu_is_one_sentence_before_anything_runs(tmp_path, args):
    if protocol.cuda_problem() is None:
        pytest.skip("this machine has a GPU that PyTorch can use")
    r = _mica(*args, "--out", "o", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mica: error: ") and "Traceback" not in r.stderr, r.stderr
    assert "trains both sides on an NVIDIA GPU, but " in lines[0] and lines[0].endswith("pass --device=cpu to measure "
                                                                                         "on the CPU")
    assert r.stdout == "" and os.listdir(tmp_path) == []  # nothing built, run or written


def test_why_there_is_no_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(config_mod, "cuda_unusable", lambda: None)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert protocol.cuda_problem() == f"PyTorch {torch.__version__} here is built without CUDA"
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert protocol.cuda_problem() == f"PyTorch {torch.__version__} finds no usable GPU"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert protocol.cuda_problem() is None
    monkeypatch.setattr(config_mod, "cuda_unusable", lambda: "the NVIDIA driver finds no usable GPU here")
    assert protocol.cuda_problem() == "the NVIDIA driver finds no usable GPU here"


@pytest.mark.parametrize("args, said", [
    (["bench", "--tf32"], "--tf32 lets both sides' products use TF32 on an NVIDIA GPU; pass it with --device=cuda"),
    (["bench", "--device=tpu"], "device='tpu' is not available; pass --device=cpu or --device=cuda"),
    (["bench", "--device=cuda:1"], "choose the card with CUDA_VISIBLE_DEVICES=1"),
    (["bench", "--simulate"], "--simulate runs Mica's CUDA trainer on the CPU simulator; pass it with --device=cuda"),
    (["bench", "--device=cuda", "--model", "tutorial"], "--model tutorial times the tutorial's step on the CPU only"),
    (["check", "--method", "b", "--device=cuda:2"], "CUDA_VISIBLE_DEVICES=2"),
    (["bench", "--frobnicate"], "unexpected arguments: --frobnicate"),
])
def test_device_mistakes_are_one_sentence(tmp_path, args, said):
    r = _mica(*args, cwd=tmp_path)
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and os.listdir(tmp_path) == []


def test_bench_help_names_the_device_flags():
    r = _mica("bench", "--help")
    assert r.returncode == 0 and "--device" in r.stdout and "--tf32" in r.stdout and "--simulate" in r.stdout
    r = _mica("check", "--help")
    assert r.returncode == 0 and "--device" in r.stdout and "--simulate" in r.stdout and "simulator" in r.stdout


# ---- end to end, Mica's CUDA trainer on the simulator --------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench-cuda") / "data" / "shakespeare_char"
    prepare_char(open(SHAKESPEARE).read()[:50_000], str(d), log=lambda *a: None)
    return str(d)


@needs_simulator
def test_the_protocol_end_to_end_with_the_simulated_cuda_trainer(tiny_data, tmp_path, monkeypatch):
    """The CUDA path of the protocol on a tiny model: Mica's CUDA trainer (the same source nvcc builds,
    on the simulator) beside PyTorch on the CPU; GPU memory unknown (no nvidia-smi), no NVIDIA
    library mapped by the simulated trainer."""
    monkeypatch.setitem(protocol.MODELS, "shakespeare_char", {**protocol.MODELS["shakespeare_char"], **TINY})
    monkeypatch.setattr(protocol.shutil, "which", lambda name: None)  # (as here: no nvidia-smi)
    # (long enough for the sampler, polling every 50 ms, to see the trainer's image after the exec)
    res = protocol.bench(model="shakespeare_char", data_dir=tiny_data, rounds=1, warmup=40, window=80, every=40,
                         torch_modes=("eager",), out=str(tmp_path / "b"), threads=2, device="cuda", simulate=True,
                         log=lambda *a: None)
    assert res["failures"] == {} and (res["device"], res["simulated"], res["tf32"]) == ("cuda", True, False)
    mica, torch = res["configs"]["mica O2"], res["configs"]["pytorch eager"]
    assert "trainer-cuda-sim-" in mica["program"] and mica["program"].endswith("mica-trainer")
    assert mica["peak_gpu_mb"] is None and mica["peak_gpu_unknown"] == "nvidia-smi is not installed"
    assert mica["nvidia_libraries"] == [] and mica["nvrtc"] is False and mica["plan_mb"] > 0
    assert len(mica["own_step_ms"]) == 1 and mica["verdict"] in ("faster", "level", "slower")
    assert torch["peak_gpu_mb"] is None and "torch_max_reserved_mb" not in torch  # (PyTorch ran on the CPU)
    table = protocol.table(res)
    assert "Mica's CUDA trainer on the CPU simulator" in table and "| mica O2 |" in table
    assert "Peak GPU memory unknown where nvidia-smi is not installed." in table
    saved = json.load(open(tmp_path / "b" / "bench-shakespeare_char.json"))
    assert saved["configs"]["mica O2"]["peak_gpu_mb"] is None and saved["simulated"] is True


@needs_simulator
def test_check_method_b_with_the_simulated_cuda_trainer(tiny_data, tmp_path):
    overrides = [f"--{k}={v}" for k, v in {**protocol.MODELS["shakespeare_char"], **TINY}.items()]
    v = check.method_b("shakespeare_char", overrides + [f"--data_dir={tiny_data}"], iters=5,
                       out_dir=str(tmp_path / "cb"), threads=2, device="cuda", simulate=True, log=lambda *a: None)
    assert (v["device"], v["pytorch_device"], v["tf32"]) == ("cuda", "cpu", False)
    assert len(v["mica"]) == len(v["pytorch"]) == 6 and v["passed"], v["relative_difference"]
    assert np.isfinite(v["mica"]).all() and v["relative_difference"][0] < 1e-5
