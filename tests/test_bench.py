"""mica bench and mica check run as a user runs them (structure only: timings are not tested)."""
import json
import os
import subprocess
import sys

import pytest

from mica.data.prepare import prepare_char

SHAKESPEARE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tinyshakespeare.txt")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    prepare_char(open(SHAKESPEARE).read()[:200_000], str(d / "data" / "shakespeare_char"), log=lambda *a: None)
    return d


def test_bench_records_everything_the_protocol_asks(data):
    r = subprocess.run([sys.executable, "-m", "mica.cli", "bench", "--rounds", "1", "--warmup", "10", "--window",
                        "10", "--modes", "eager", "--out", "b"], cwd=data, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "| mica O2 |" in r.stdout and "| pytorch eager |" in r.stdout
    res = json.load(open(data / "b" / "bench-cpu.json"))
    mica = res["configs"]["mica O2"]
    assert mica["verdict"] in ("faster", "level", "slower") and mica["ratio"] > 0
    assert len(mica["own_step_ms"]) == 1 and "void_runs" in mica
    assert mica["program"].endswith("mica-trainer")
    assert not any("libtorch" in lib for lib in mica["libraries"])
    assert any("libtorch" in lib for lib in res["configs"]["pytorch eager"]["libraries"])
    assert mica["peak_rss_mb"] > 0 and mica["first_step_s"] > 0
    assert (data / "b" / "steps-cpu.png").exists() and (data / "b" / "losses-cpu.png").exists()


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
    try:
        v = check.method_a("cpu", iters=20, eval_every=10, eval_batches=2, seeds=(1337, 1338), out_dir="ca",
                           threads=2, log=lambda *a: None)
    finally:
        os.chdir(cwd)
    assert [r["step"] for r in v["evaluations"]] == [0, 10, 20]
    assert [r["judged"] for r in v["evaluations"]] == [False, True, True]
    for r in v["evaluations"]:
        assert r["larger_range"] >= 0 and r["difference"] == abs(r["mica_median"] - r["pytorch_median"])
    # both families start from their own nanoGPT-style inits at about ln(65)
    assert all(abs(v["curves"][side][s][0] - 4.17) < 0.1 for side in ("mica", "pytorch") for s in (1337, 1338))
    assert isinstance(v["passed"], bool) and (data / "ca" / "verdict.json").exists()


def test_torch_side_profile_groups_families():
    from mica.bench.step import torch_profile

    fams = torch_profile("cpu", threads=2)
    assert fams["products"] > 0 and fams.get("optimizer", 0) > 0 and fams.get("norms", 0) > 0
