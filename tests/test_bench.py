"""mica bench and mica check run as a user runs them (structure only: timings are not tested)."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from mica.data.prepare import prepare_char
from mica.errors import MicaError

SHAKESPEARE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tinyshakespeare.txt")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    prepare_char(open(SHAKESPEARE).read()[:200_000], str(d / "data" / "shakespeare_char"), log=lambda *a: None)
    return d


def test_bench_records_everything_the_protocol_asks(data):
    r = subprocess.run([sys.executable, "-m", "mica.cli", "bench", "--rounds", "1", "--warmup", "10", "--window",
                        "10", "--modes", "eager", "--batch_size", "2", "--out", "b"], cwd=data, capture_output=True,
                       text=True)  # (the protocol's records: a small batch does)
    assert r.returncode == 0, r.stderr
    assert "| mica O2 |" in r.stdout and "| pytorch eager |" in r.stdout
    res = json.load(open(data / "b" / "bench-cpu.json"))
    table = open(data / "b" / "bench-cpu.md").read()  # (the printed table, kept beside the raw numbers)
    assert "| mica O2 |" in table and table.strip() in r.stdout
    mica = res["configs"]["mica O2"]
    assert mica["verdict"] in ("faster", "level", "slower") and mica["ratio"] > 0
    assert len(mica["own_step_ms"]) == 1 and "void_runs" in mica
    assert mica["program"].endswith("mica-trainer")
    assert not any("libtorch" in lib for lib in mica["libraries"])
    assert any("libtorch" in lib for lib in res["configs"]["pytorch eager"]["libraries"])
    assert mica["peak_rss_mb"] > 0 and mica["first_step_s"] > 0
    assert (data / "b" / "steps-cpu.png").exists() and (data / "b" / "losses-cpu.png").exists()
    # the machine is named under the table's title, and a verdict from one round says so
    m = res["machine"]
    assert m["cores"] == os.cpu_count() and m["processor"] and m["torch"] and "bf16_gemm" not in m
    assert f"on {m['processor']} ({m['cores']} cores, {m['vector']}), PyTorch {m['torch']}" in r.stdout
    assert ", 1 round," in r.stdout and "from 1 round only" in r.stdout
    assert {line.count("|") for line in r.stdout.splitlines() if line.startswith("| ")} == {10}, r.stdout


def test_a_shared_machine_and_the_bfloat16_kernel_are_said_under_the_title():
    from mica.bench import protocol

    res = {"threads": 2, "configs": {"mica O2": {"runnable": [6.1, 6.4, 5.2]}, "pytorch eager": {}}}
    assert protocol._busy(res) == ("The machine was shared: up to 6.1 tasks were runnable during the runs of 2 "
                                   "threads, so these times are not a fair measure; run again on a quiet machine.")
    res["configs"]["mica O2"]["runnable"] = [2.9, 3.4, 3.0]
    assert protocol._busy(res) == ""
    # a bfloat16 bench names the kernel Mica's builds take on this processor
    from mica.backends.c import bf16gemm

    m = protocol.machine("bfloat16")
    assert m["bf16_gemm"] == bf16gemm.choose()
    assert f"Mica's bfloat16 products: the {m['bf16_gemm']} kernel (" in protocol._machine_line(m)


@pytest.mark.slow  # (a variant: the default suite checks the protocol on nanoGPT's model; make test-slow runs it)
def test_bench_runs_the_tutorial_model(tmp_path):
    """The tutorial's step through the same protocol: Mica's compiled step driven from Python, whose
    own clock (the times on its lines) is checked against the outside one."""
    r = subprocess.run([sys.executable, "-m", "mica.cli", "bench", "--model", "tutorial", "--rounds", "1", "--warmup",
                        "10", "--window", "600", "--modes", "eager", "--out", "t"], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    res = json.load(open(tmp_path / "t" / "bench-tutorial.json"))
    mica, torch = res["configs"]["mica O2"], res["configs"]["pytorch eager"]
    assert mica["verdict"] in ("faster", "level", "slower")
    assert len(mica["own_step_ms"]) == 1 and mica["own_step_ms"][0] > 0 and torch["median_ms"] > 0
    assert any("libmica" in lib for lib in mica["libraries"]), mica["libraries"]
    assert (tmp_path / "t" / "losses-tutorial.png").exists()


def test_check_method_b_passes(data):
    r = subprocess.run([sys.executable, "-m", "mica.cli", "check", "--method", "b", "--iters", "10", "--out", "cb"],
                       cwd=data, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout
    v = json.load(open(data / "cb" / "verdict.json"))
    assert v["passed"] and len(v["mica"]) == len(v["pytorch"]) == 11
    assert (data / "cb" / "curves.png").exists()


def test_check_method_a_compares_families(data):
    from mica.bench import check

    cwd = os.getcwd()
    os.chdir(data)
    said = []
    try:
        v = check.method_a("cpu", iters=20, eval_every=10, eval_batches=2, seeds=(1337, 1338), out_dir="ca",
                           threads=2, log=said.append)
    finally:
        os.chdir(cwd)
    # what runs, said first; then each seed's two runs with their times, and what is left
    assert said[0].startswith("method A, model cpu, float32: 2 seeds a side, 20 iterations each") and "4 training runs" in said[0]
    took = r"(\d+ s|[\d.]+ min)"  # (a loaded machine's run may take minutes)
    assert re.fullmatch(rf"seed 1337: Mica {took}, PyTorch {took}; about {took} left", said[1]), said[1]
    assert re.fullmatch(rf"seed 1338: Mica {took}, PyTorch {took}", said[2]), said[2]
    assert {k: v[k] for k in ("model", "dtype", "iters", "eval_every", "eval_batches")} == \
        {"model": "cpu", "dtype": "float32", "iters": 20, "eval_every": 10, "eval_batches": 2}
    assert [r["step"] for r in v["evaluations"]] == [0, 10, 20]
    assert [r["judged"] for r in v["evaluations"]] == [False, True, True]
    for r in v["evaluations"]:
        assert r["larger_range"] >= 0 and r["difference"] == abs(r["mica_median"] - r["pytorch_median"])
    # both families start from their own nanoGPT-style inits at about ln(65)
    assert all(abs(v["curves"][side][s][0] - 4.17) < 0.1 for side in ("mica", "pytorch") for s in (1337, 1338))
    assert isinstance(v["passed"], bool) and (data / "ca" / "verdict.json").exists()
    ev = v["evaluations"]  # (the CLI notes a check of barely trained models: a fall under 5%)
    assert v["loss_drop"] == min(1 - ev[-1][k] / ev[0][k] for k in ("mica_median", "pytorch_median"))


def test_torch_side_profile_groups_families():
    from mica.bench.step import torch_profile

    fams = torch_profile("cpu", threads=2)
    assert fams["products"] > 0 and fams.get("optimizer", 0) > 0 and fams.get("norms", 0) > 0


def test_mica_side_profile_groups_families():
    """Every kernel of one profiled step lands in a family, the optimizer's loops among them (they
    store into the parameters' and optimizer state's buffers)."""
    from mica.bench.step import profile

    fams = profile("cpu", steps=1, threads=1)
    assert {"products", "attention", "norms", "optimizer", "elementwise"} <= set(fams)
    assert fams["products"] > 0 and fams["optimizer"] > 0 and min(fams.values()) >= 0


# ---- TR-2's GPT-2 small and medium (never trained here: the entries, the command lines, a miniature) --------

def test_gpt2_models_are_tr2s_shapes():
    from mica.bench.protocol import DEFAULTS, MODELS
    from mica.models.gpt import GPT
    from mica.train.programs import model_config

    sizes = {"gpt2": 123.59, "gpt2-medium": 353.55}
    for name, millions in sizes.items():
        cfg = MODELS[name]
        assert (cfg["block_size"], cfg["batch_size"], cfg["gradient_accumulation_steps"], cfg["bias"]) == \
            (1024, 1, 1, False)
        assert round(GPT(model_config(cfg, 50304)).get_num_params() / 1e6, 2) == millions
        assert {k: DEFAULTS[name][k] for k in ("warmup", "window", "every")} == dict(warmup=2, window=4, every=1)
    assert (MODELS["gpt2-medium"]["n_layer"], MODELS["gpt2-medium"]["n_head"], MODELS["gpt2-medium"]["n_embd"]) == \
        (24, 16, 1024)


def test_gpt2_command_lines_carry_the_same_model_to_both_sides(tmp_path):
    from mica.bench import protocol
    from mica.train import config as config_mod

    cmd = protocol._mica_cmd("gpt2-medium", "data/owt", str(tmp_path / "m"), 6, 2, 2, every=1)
    assert cmd[:4] == [sys.executable, "-m", "mica.cli", "train"]
    cfg = config_mod.load(None, cmd[4:])  # what `mica train` will read from these flags
    torch_cmd = protocol._torch_cmd("gpt2-medium", "data/owt", "default", 6, 2, every=1)
    tcfg = json.loads(torch_cmd[torch_cmd.index("--config") + 1])
    for k in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "gradient_accumulation_steps", "bias",
              "learning_rate", "beta2", "weight_decay", "grad_clip", "warmup_iters"):
        assert cfg[k] == tcfg[k] == protocol.MODELS["gpt2-medium"][k], k
    assert (cfg["n_layer"], cfg["n_embd"], cfg["max_iters"], cfg["log_interval"], cfg["data_dir"]) == \
        (24, 1024, 6, 1, "data/owt")
    assert torch_cmd[torch_cmd.index("--mode") + 1] == "default" and torch_cmd[torch_cmd.index("--iters") + 1] == "6"


def test_batch_size_and_memory_budgets_reach_the_sides_they_belong_to(tmp_path):
    """--batch_size goes to both sides; each --memory_budgets entry is a Mica configuration of its own
    whose `mica train` reads that budget (auto left for the trainer to read when it starts)."""
    from mica.bench import protocol
    from mica.train import config as config_mod
    from mica.train.memory_plan import parse_budget

    budgets = protocol.check_mica_options("gpt2", 12, ["none", "15958859199", "12GB", "auto"])
    assert budgets == [None, "15958859199", "12GB", "auto"]
    assert [protocol.mica_config_name(2, b) for b in budgets[:2]] == ["mica O2", "mica O2 budget=15958859199"]
    for b, want in zip(budgets, (None, 15958859199, 12 * 10 ** 9, "auto")):
        cmd = protocol._mica_cmd("gpt2", "d", str(tmp_path / "m"), 2, 2, 2, every=1, batch_size=12, memory_budget=b)
        cfg = config_mod.load(None, cmd[4:])
        assert cfg["batch_size"] == 12 and cfg["block_size"] == 1024, cmd
        assert cfg["memory_budget"] == want if want is None or want == "auto" else \
            parse_budget(cfg["memory_budget"]) == want, (b, cfg["memory_budget"])
    t = protocol._torch_cmd("gpt2", "d", "eager", 2, 2, every=1, batch_size=12)
    assert json.loads(t[t.index("--config") + 1])["batch_size"] == 12
    assert protocol.MODELS["gpt2"]["batch_size"] == 1  # (the model's own entry untouched)
    plain = protocol._torch_cmd("gpt2", "d", "eager", 2, 2)
    assert json.loads(plain[plain.index("--config") + 1])["batch_size"] == 1
    for args, says in ((("tutorial", 4, None), "--model tutorial has its own step"),
                       (("speedrun_tiny", None, ["auto"]), "--model speedrun_tiny has its own step"),
                       (("gpt2", 0, None), "--batch_size must be a whole number of sequences, 1 or more; got 0"),
                       (("gpt2", None, ["12 parsecs"]), "memory_budget must be a number of bytes, a size such as 2GB"),
                       (("gpt2", None, ["auto", "AUTO"]), "--memory_budgets names auto twice")):
        with pytest.raises(MicaError, match=re.escape(says)):
            protocol.check_mica_options(*args)


def test_bench_refuses_a_bad_budget_in_one_sentence(data):
    r = subprocess.run([sys.executable, "-m", "mica.cli", "bench", "--model", "shakespeare_char", "--memory_budgets",
                        "none", "0"], cwd=data, capture_output=True, text=True)
    assert r.returncode == 2 and "memory_budget must be" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not os.path.exists(data / "bench")  # nothing ran, nothing was written


def test_bench_refuses_a_bfloat16_kernel_this_processor_lacks_before_running_anything(data):
    from mica.backends.c import bf16gemm

    missing = next((k for k in ("amx", "avx512bf16") if k not in bf16gemm.available()), None)
    if missing is None:
        pytest.skip("this processor runs every bfloat16 kernel")
    r = subprocess.run([sys.executable, "-m", "mica.cli", "bench", "--model", "cpu", "--dtype", "bfloat16", "--out",
                        "bench-k"], cwd=data, capture_output=True, text=True, env={**os.environ, "MICA_BF16_GEMM": missing})
    assert r.returncode == 2 and f"which the {missing} bfloat16 product kernel needs" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not os.path.exists(data / "bench-k")


def test_a_failure_cell_is_cut_at_a_word():
    from mica.bench import protocol

    assert protocol._cut("short", 10) == "short"
    assert protocol._cut("this processor lacks amx_bf16, amx_tile, which", 30) == "this processor lacks …"


def test_gpt2_refuses_a_character_vocabulary(data):
    r = subprocess.run([sys.executable, "-m", "mica.cli", "bench", "--model", "gpt2", "--data_dir",
                        "data/shakespeare_char"], cwd=data, capture_output=True, text=True)
    assert r.returncode == 2 and "needs GPT-2's vocabulary (50,257 tokens or more)" in r.stderr, r.stderr
    vocab = json.load(open(data / "data" / "shakespeare_char" / "meta.json"))["vocab_size"]
    assert f"data/shakespeare_char has {vocab};" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "mica.cli", "bench", "--model", "gpt2-medium"], cwd=data,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "data/openwebtext does not exist" in r.stderr, r.stderr


@pytest.mark.slow  # (a variant: the default suite runs the protocol on nanoGPT's CPU model; make test-slow runs it)
def test_gpt2_protocol_in_miniature(tmp_path, monkeypatch):
    """The GPT-2 path end to end with the model shrunk (GPT-2's vocabulary, no meta file, the
    model's default window): both sides run, Mica's plan is recorded beside its peak RSS."""
    from mica.bench import protocol

    folder = tmp_path / "owt"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 20_000), ("val", 4_000)):
        rng.integers(0, 50257, n).astype(np.uint16).tofile(folder / f"{split}.bin")
    monkeypatch.setitem(protocol.MODELS, "gpt2", {**protocol.MODELS["gpt2"], "n_layer": 1, "n_head": 2, "n_embd": 32,
                                                  "block_size": 32})
    res = protocol.bench(model="gpt2", data_dir=str(folder), rounds=1, torch_modes=("eager",),
                         out=str(tmp_path / "b"), threads=2, log=lambda *a: None)
    assert res["failures"] == {} and (res["warmup"], res["window"]) == (2, 4)
    mica, torch = res["configs"]["mica O2"], res["configs"]["pytorch eager"]
    # the trainer's arenas are zeroed when allocated, so all of the plan is resident
    assert 0 < mica["plan_mb"] < mica["peak_rss_mb"] and "plan_mb" not in torch
    assert len(mica["runnable"]) == 1 and mica["runnable"][0] >= 1  # its own process, at least
    assert len(mica["own_step_ms"]) == 1 and mica["void_runs"] in (0, 1)
    assert f"| {mica['plan_mb']:.0f} |" in protocol.table(res)
    saved = json.load(open(tmp_path / "b" / "bench-gpt2.json"))
    assert saved["configs"]["mica O2"]["plan_mb"] == mica["plan_mb"]


def test_a_half_dtype_goes_to_both_sides(data):
    """--dtype bfloat16 / float16: Mica's trainer gets --dtype, the PyTorch runner trains under
    torch.autocast (float16 with a GradScaler), and the table says so."""
    from mica.bench import protocol

    cmd = protocol._mica_cmd("cpu", "d", "o", 30, 2, 2, dtype="bfloat16")
    assert "--dtype='bfloat16'" in cmd
    assert protocol._torch_cmd("cpu", "d", "eager", 30, 2, dtype="float16")[-2:] == ["--dtype", "float16"]
    assert "--dtype" not in protocol._torch_cmd("cpu", "d", "eager", 30, 2)
    for dtype in ("bfloat16", "float16"):
        r = subprocess.run(protocol.torch_runner_cmd({**protocol.MODELS["cpu"], "n_layer": 1, "seed": 1}, str(
            data / "data" / "shakespeare_char"), "eager", 4, 2, 0, 1, threads=2, dtype=dtype),
            capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        losses = [float(line.split("loss ")[1].split(",")[0]) for line in r.stdout.splitlines() if line.startswith("iter")]
        assert len(losses) == 3 and all(3.0 < x < 5.0 for x in losses), r.stdout
    r = subprocess.run([sys.executable, "-m", "mica.cli", "check", "--method", "b", "--dtype", "bfloat16"], cwd=data,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "method B is float32 by definition" in r.stderr


def test_a_half_dtype_benches_the_build_with_pytorchs_roundings_beside_the_one_without(tmp_path):
    """The report publishes each half type's build with fp_half_intermediates and puts the build
    with every digit kept beside it: `mica bench --dtype bfloat16` runs both (or the one asked for),
    each its own configuration, and only the first takes the option; float32 has one build."""
    from mica.bench import protocol
    from mica.train import config as config_mod

    assert protocol.half_builds("bfloat16", "both") == (True, False)
    assert protocol.half_builds("float16", "off") == (False,)
    assert protocol.half_builds("float32", "both") == (False,)
    assert protocol.mica_config_name(2, None, True) == "mica O2 fp_half_intermediates"
    assert protocol.mica_config_name(2, "12GB", True) == "mica O2 budget=12GB fp_half_intermediates"
    for half in (True, False):
        cmd = protocol._mica_cmd("cpu", "d", str(tmp_path / "m"), 30, 2, 2, dtype="bfloat16", half_roundings=half)
        cfg = config_mod.load(None, cmd[4:])
        assert cfg["fp_half_intermediates"] is half and cfg["dtype"] == "bfloat16", cmd
    for args, says in ((("float32", "on"), "--fp_half_intermediates=on names the half types' roundings"),
                       (("bfloat16", "yes"), "--fp_half_intermediates must be both, on or off")):
        with pytest.raises(MicaError, match=re.escape(says)):
            protocol.half_builds(*args)


def test_bench_where_every_configuration_fails_says_so_and_fails(tmp_path):
    """Nothing measured is not a result: exit status 2 and one sentence, and no chart named that was
    not drawn (the JSON keeps the failures)."""
    (tmp_path / "empty").mkdir()
    r = subprocess.run([sys.executable, "-m", "mica.cli", "bench", "--model", "cpu", "--rounds", "1", "--warmup", "0",
                        "--window", "1", "--every", "1", "--modes", "eager", "--data_dir", "empty"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("mica: error: every configuration failed (mica O2: ")
    assert "nothing was measured" in r.stderr and "charts:" not in r.stdout
    failures = json.load(open(tmp_path / "bench" / "bench-cpu.json"))["failures"]
    assert sorted(failures) == ["mica O2", "pytorch eager"]


def test_void_runs_are_left_out_and_a_failure_is_its_reason_not_torchs_footer():
    """A Mica run whose own clock disagrees with the outside one is void: the median and range leave it
    out (with every run void they are all there is, said). A failed mode's reason is its exception
    line, not torch.compile's TORCHDYNAMO_VERBOSE footer; a half dtype's results have files of their own."""
    from mica.bench import protocol

    def run(ms, void=False):
        return {"step_ms": ms, "first_step_s": 1.0, "own_step_ms": ms, "void": void}

    runs = {"mica_O2": [run(5.0, void=True), run(10.0), run(11.0)], "pytorch_eager": [run(12.5), run(13.0)]}
    res = protocol.summarize("cpu", 2, 3, 1, 2, runs, {}, {})
    mica = res["configs"]["mica_O2"]
    assert (mica["median_ms"], mica["min_ms"], mica["max_ms"]) == (10.5, 10.0, 11.0) and mica["void_runs"] == 1
    assert mica["verdict"] == "faster" and "1 void (left out)" in protocol._verdict(mica)
    every = protocol.summarize("cpu", 2, 2, 1, 2, {"mica_O2": [run(5.0, True), run(7.0, True)]}, {}, {})
    assert every["configs"]["mica_O2"]["median_ms"] == 6.0
    assert "2 void (all counted: no other run)" in protocol._verdict(every["configs"]["mica_O2"])
    err = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
           "torch._inductor.exc.InductorError: InvalidCxxCompiler: No working C++ compiler found\n\n"
           "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace (please do this especially if you're reporting a "
           "bug to PyTorch).\n")
    assert protocol.failure_reason(err, 1) == ("torch._inductor.exc.InductorError: InvalidCxxCompiler: No working "
                                               "C++ compiler found")
    assert protocol.failure_reason("noise\nmica: error: the data is gone\nmore\n", 2) == "mica: error: the data is gone"
    assert protocol.failure_reason("", 9) == "exit status 9"
    assert protocol.result_stem({"model": "cpu", "dtype": "bfloat16"}) == "cpu-bfloat16"
    assert protocol.result_stem({"model": "cpu", "dtype": "float32"}) == "cpu"


def test_results_that_cannot_be_saved_leave_the_table_and_a_sentence(tmp_path, monkeypatch):
    """Where bench-MODEL.json cannot be written (here a folder holds its name) the measured result
    still comes back, saying what was not saved, and no temporary file is left: the command prints
    the table, then the sentence (the runs are faked: this is about the saving)."""
    from mica.bench import protocol

    def fake_run(cmd, env, warmup, window, gpu=False):
        return {"step_ms": 10.0, "first_step_s": 0.1, "losses": {0: 2.0, 10: 1.5}, "line_ms": {10: 100.0}}

    monkeypatch.setattr(protocol, "run_once", fake_run)
    (tmp_path / "bench-tutorial.json").mkdir()
    res = protocol.bench(model="tutorial", rounds=1, warmup=0, window=10, every=10, torch_modes=["eager"],
                         out=str(tmp_path), log=lambda *a: None)
    assert res["unsaved"] == f"{tmp_path}/bench-tutorial.json: Is a directory"
    assert "| mica O2 | 10.0 | 10.0 – 10.0 |" in protocol.table(res)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench-tutorial.json"]


def test_a_ctrl_c_to_the_bench_alone_ends_the_run_it_waits_on(tmp_path):
    """Ctrl-C sent to the bench's process alone (kill -INT PID, not the terminal's group) reaches only
    it: the program it is timing is ended with it, not left running on its own."""
    import signal
    import time

    from mica.bench import protocol

    pid_file = tmp_path / "pid"
    child = [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
             "print('iter 0: loss 1.0', flush=True); time.sleep(120)"]

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.alarm(2)
    try:
        with pytest.raises(KeyboardInterrupt):
            protocol.run_once(child, dict(os.environ), 0, 10)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    pid = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the timed program outlived the bench's Ctrl-C")
