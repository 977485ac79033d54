"""Data parallelism: the collectives (identity at world size 1 on the oracle and in C, their VJPs,
their MPI lowering across 2 ranks bit for bit, their NCCL lowering in the CUDA simulator), and
`mpirun -np 2 mica train` against one process (the same losses and checkpoint bytes; on the CPU
and on simulated cards), a killed rank, ranks prepared differently.

Open MPI refuses to run as root without OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM), and a machine with fewer
cores than ranks needs --oversubscribe: mpirun() passes both."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import mica
from mica.train import checkpoint
from test_cuda import needs_simulator

HERE = os.path.dirname(os.path.abspath(__file__))
SHAKESPEARE = os.path.join(HERE, "data", "tinyshakespeare.txt")
MPIRUN = shutil.which("mpirun")
needs_mpi = pytest.mark.skipif(MPIRUN is None or shutil.which("mpicc") is None,
                               reason="Open MPI is not installed (apt-get install openmpi-bin libopenmpi-dev)")
TINY = ["--device=cpu", "--compile=False", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32",
        "--batch_size=2", "--eval_iters=2", "--log_interval=1", "--warmup_iters=2", "--lr_decay_iters=40",
        "--threads=1", "--dropout=0.1", "--gradient_accumulation_steps=4"]


def _env():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(k, None)
    return env


def mpirun(np_, *args):
    return [MPIRUN, "-np", str(np_), "--oversubscribe", *args]


def cli(*args):
    return [sys.executable, "-m", "mica.cli", *args]


def run(cmd, cwd, timeout=600, env=None):
    return subprocess.run(cmd, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=timeout)


# ---- the collectives on the oracle and in one process ----------------------------------------------

def test_world_size_one_is_the_identity_on_the_oracle_and_in_c():
    rng = np.random.default_rng(0)
    a, b, c = rng.standard_normal((3, 4, 6)).astype(np.float32)
    x = rng.standard_normal((6, 3)).astype(np.float32)

    def f(a, b, c, x):
        d = mica.distributed
        return d.all_reduce([a, b, c], world=1), d.reduce_scatter(x, world=1), d.all_gather(x, world=1), \
            d.reduce_scatter([c, a, b], world=1), d.reduce_scatter([x, x], world=1, counts=(6,), rank=0), \
            d.all_gather(x, world=1, counts=(6,), rank=0)

    prog = mica.trace(f, mica.f32[4, 6], mica.f32[4, 6], mica.f32[4, 6], mica.f32[6, 3])
    want = ((a + b) + c, x, x, (c + a) + b, x + x, x)
    for got, exp in zip(mica.reference.run(prog, a, b, c, x), want):
        np.testing.assert_allclose(got, exp.astype(np.float64), rtol=1e-6, atol=1e-6)
    for got, exp in zip(prog.lower("cpu").build()(a, b, c, x), want):
        assert np.asarray(got).tobytes() == exp.tobytes()  # (float32 left to right: the same bits)


def test_vjps_are_the_transposed_collectives():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3))
    w = rng.standard_normal((4, 3))

    def loss(x, w):
        d = mica.distributed
        y = d.all_gather(x * w, world=1)
        z = d.reduce_scatter(y * y, world=1)
        z = d.reduce_scatter([z, z], world=1) * 0.5
        return d.all_reduce([z, z * 2.0], world=1).sum()

    prog = mica.trace(lambda x, w: mica.value_and_grad(lambda x: loss(x, w))(x)[1], mica.f64[4, 3], mica.f64[4, 3])
    got = mica.reference.run(prog, x, w)
    np.testing.assert_allclose(got, 2 * 3 * (x * w) * w, rtol=1e-12)  # d/dx of 3 (xw)^2
    ops = [line.split("= ")[1].split()[0] for line in prog.ir.splitlines() if "= " in line]
    # all_reduce's transpose is all_reduce; reduce_scatter's is all_gather; all_gather's, reduce_scatter
    assert ops.count("all_reduce") == 2 and ops.count("all_gather") == 3 and ops.count("reduce_scatter") == 3


def test_collectives_check_their_operands():
    d = mica.distributed
    with pytest.raises(mica.ShapeError, match="divide among 2 ranks"):
        mica.trace(lambda x: d.reduce_scatter(x, world=2), mica.f32[3, 2])
    with pytest.raises(mica.ShapeError, match="every operand must be"):
        mica.trace(lambda a, b: d.all_reduce([a, b], world=1), mica.f32[3], mica.f32[4])
    with pytest.raises(mica.ShapeError, match="floating-point"):
        mica.trace(lambda a: d.all_gather(a, world=1), mica.i64[3])
    with pytest.raises(mica.ShapeError, match="positive count of ranks"):
        mica.trace(lambda a: d.all_gather(a, world=0), mica.f32[3])
    with pytest.raises(mica.ShapeError, match=r"f32\[5\] must hold the ranks' 4 rows"):
        mica.trace(lambda x: d.reduce_scatter(x, world=2, counts=(2, 2), rank=0), mica.f32[5])
    with pytest.raises(mica.ShapeError, match="counts must be a tuple of 2 positive row counts"):
        mica.trace(lambda x: d.reduce_scatter(x, world=2, counts=(5, 0), rank=0), mica.f32[5])
    with pytest.raises(mica.ShapeError, match="rank must say which of the 2 ranks"):
        mica.trace(lambda x: d.all_gather(x, world=2, counts=(2, 3), rank=2), mica.f32[2])
    with pytest.raises(mica.ShapeError, match="must be rank 1's 3 rows"):
        mica.trace(lambda x: d.all_gather(x, world=2, counts=(2, 3), rank=1), mica.f32[2])
    assert mica.trace(lambda x: d.all_gather(x, world=2, counts=(2, 3), rank=1), mica.f32[3, 4]).graph.outputs[0].shape \
        == (5, 4)
    prog = mica.trace(lambda a: d.all_gather(a, world=2), mica.f32[3])
    assert prog.graph.outputs[0].shape == (6,)
    with pytest.raises(mica.MicaError, match="mpirun -np 2"):
        mica.reference.run(prog, np.zeros(3, np.float32))


@needs_mpi
def test_mpi_lowering_sums_in_rank_order_bit_for_bit(tmp_path):
    r = run(mpirun(2, sys.executable, os.path.join(HERE, "mpi", "collectives_check.py")), tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # (each rank's line once and nothing else said: mpirun may interleave the two ranks' writes)
    assert r.stdout.count("rank 0: ok") == r.stdout.count("rank 1: ok") == 1 and "differs" not in r.stdout, r.stdout


@needs_mpi
def test_a_program_for_two_ranks_run_alone_says_so():
    """Loaded by Python without mpirun, the program joins MPI as one rank (mica_mpi.h) and stops
    with a sentence, not MPI's abort."""
    from mica import distributed as d

    exe = mica.compile(lambda a: d.all_reduce([a], world=2), mica.f32[3])
    with pytest.raises(mica.MicaError, match="^this program was compiled for 2 ranks but runs among 1: start it "
                                             "with mpirun -np"):
        exe(np.ones(3, np.float32))


# ---- mpirun -np 2 mica train --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("dp")
    r = run(cli("prepare", "shakespeare-char", "--input", SHAKESPEARE), d)
    assert r.returncode == 0, r.stderr
    return d / "data"


def _folder(tmp_path, name, data):
    d = tmp_path / name
    d.mkdir()
    (d / "data").symlink_to(data)
    return d


def _metrics(path):
    """metrics.jsonl without the clock's values."""
    return [{k: v for k, v in json.loads(line).items() if k not in ("time_ms", "mfu")} for line in open(path)]


def _one_process_and_two_ranks(tmp_path, data, args, lines):
    """`mica train` in one process and under mpirun -np 2, each in a folder of its own: the same
    `lines` log lines (losses), metrics and checkpoint bytes (every tensor, the data position, the
    generator and the metadata). (one folder, two folder, the mpirun's result)."""
    one, two = _folder(tmp_path, "one", data), _folder(tmp_path, "two", data)
    r1 = run(cli(*args), one)
    assert r1.returncode == 0, r1.stderr
    r2 = run(mpirun(2, *cli(*args)), two)
    assert r2.returncode == 0, r2.stdout + r2.stderr
    pattern = re.compile(r"^(?:iter \d+: loss [\d.]+|step \d+: .*$)", re.M)
    losses = pattern.findall(r1.stdout)
    # (mpirun gives its ranks a terminal: rank 0 draws the progress line, cleared by \r and ESC[K)
    assert len(losses) == lines and losses == pattern.findall(re.sub(r"\r|\x1b\[K", "\n", r2.stdout))
    assert _metrics(one / "out" / "metrics.jsonl") == _metrics(two / "out" / "metrics.jsonl")
    assert open(one / "out" / "ckpt.safetensors", "rb").read() == open(two / "out" / "ckpt.safetensors", "rb").read()
    return one, two, r2


@needs_mpi
def test_two_ranks_train_bitwise_like_one_process(tmp_path, data):
    args = ["train", "shakespeare_char", *TINY, "--max_iters=4", "--eval_interval=2", "--always_save_checkpoint=True",
            "--out_dir=out"]
    one, two, r2 = _one_process_and_two_ranks(tmp_path, data, args, 5 + 3)
    assert r2.stdout.count("step 2: train loss") == 1  # rank 0 alone logs
    # every rank resumes from the one checkpoint, still in step with one process
    more = [a.replace("--max_iters=4", "--max_iters=6") for a in args] + ["--init_from=resume"]
    r1, r2 = run(cli(*more), one), run(mpirun(2, *cli(*more)), two)
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    assert open(one / "out" / "ckpt.safetensors", "rb").read() == open(two / "out" / "ckpt.safetensors", "rb").read()


@needs_mpi
@pytest.mark.slow  # (a variant: ZeRO-1 on two ranks is checked by default in the speedrun's run; make test-slow runs it)
def test_zero1_on_two_ranks_is_bitwise_one_process_and_resumes_so(tmp_path, data):
    """zero_stage=1: each rank reduce-scatters the gradients, keeps AdamW's moments of its own
    tensors and all-gathers the parameters; clipping and dropout on. The losses, metrics and
    checkpoint bytes are one process's (rank 0 gathers the moments to write it: the unsharded
    checkpoint), and both resume from it in step. (In one process zero_stage=1 changes nothing.)"""
    args = ["train", "shakespeare_char", *TINY, "--max_iters=4", "--eval_interval=2", "--always_save_checkpoint=True",
            "--out_dir=out", "--zero_stage=1", "--grad_clip=0.05"]
    one, two = _folder(tmp_path, "one", data), _folder(tmp_path, "two", data)
    r1 = run(cli(*args), one)
    assert r1.returncode == 0, r1.stderr
    assert "note: zero_stage=1 shards AdamW's state among the ranks of mpirun -np N" in r1.stdout
    r2 = run(mpirun(2, *cli(*args)), two)
    assert r2.returncode == 0, r2.stdout + r2.stderr
    report = re.search(r"ZeRO-1 over 2 ranks: AdamW's moments, rank 0: (\d+) tensors, ([\d,]+) bytes, rank 1: (\d+) "
                       r"tensors, ([\d,]+) bytes, against ([\d,]+) bytes in one process", r2.stdout)
    assert report, r2.stdout
    n0, b0, n1, b1, full = (int(g.replace(",", "")) for g in report.groups())
    assert n0 + n1 == 15 and b0 + b1 == full and max(b0, b1) < 0.6 * full  # (2 blocks x 6, wte, wpe, ln_f)
    plan = lambda out: int(re.search(r"optimizer state +([\d,]+)", out).group(1).replace(",", ""))  # noqa: E731
    assert b0 + 8 <= plan(r2.stdout) < b0 + 8 + 4096 < full + 8 <= plan(r1.stdout)  # (rank 0's; AdamW's step: 8 bytes)
    pattern = re.compile(r"^(?:iter \d+: loss [\d.]+|step \d+: .*$)", re.M)
    losses = pattern.findall(r1.stdout)
    assert len(losses) == 5 + 3 and losses == pattern.findall(re.sub(r"\r|\x1b\[K", "\n", r2.stdout))
    assert _metrics(one / "out" / "metrics.jsonl") == _metrics(two / "out" / "metrics.jsonl")
    a = (one / "out" / "ckpt.safetensors").read_bytes()
    assert a == (two / "out" / "ckpt.safetensors").read_bytes()
    st = checkpoint.SafeTensors(str(two / "out" / "ckpt.safetensors"))
    assert len([n for n in st.names if n.startswith("optimizer.exp_avg")]) == 2 * 15  # (every moment, whole)
    # each rank resumes its own moments from the one checkpoint; one process resumes all of them
    more = [a.replace("--max_iters=4", "--max_iters=6") for a in args] + ["--init_from=resume"]
    r1, r2 = run(cli(*more), one), run(mpirun(2, *cli(*more)), two)
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    assert (one / "out" / "ckpt.safetensors").read_bytes() == (two / "out" / "ckpt.safetensors").read_bytes()
    assert _metrics(one / "out" / "metrics.jsonl") == _metrics(two / "out" / "metrics.jsonl")


@needs_mpi
def test_a_killed_rank_ends_the_others_with_one_sentence(tmp_path, data):
    d = _folder(tmp_path, "killed", data)
    args = ["train", "shakespeare_char", *TINY, "--max_iters=100000", "--eval_interval=3",
            "--always_save_checkpoint=True", "--out_dir=out"]
    p = subprocess.Popen(mpirun(2, *cli(*args)), cwd=d, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        metrics = d / "out" / "metrics.jsonl"
        deadline = time.time() + 300
        while time.time() < deadline and not (metrics.exists() and '"step": 6' in metrics.read_text()):
            time.sleep(0.2)
        assert metrics.exists() and '"step": 6' in metrics.read_text(), "the run did not get going"
        pid = _trainer_pid(d / "out" / "trainer.rank1.manifest")
        os.kill(pid, signal.SIGKILL)
        t = time.time()
        out, err = p.communicate(timeout=30)
        took = time.time() - t
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0 and took < 20
    assert err.count("mica: rank 0 of 2 stopped:") == 1, err
    sentence = next(line for line in err.splitlines() if line.startswith("mica: rank 0 of 2 stopped:"))
    assert "is untouched" in sentence and "Traceback" not in err
    st = checkpoint.SafeTensors(str(d / "out" / "ckpt.safetensors"))
    assert int(st.metadata["iter_num"]) >= 6
    for name in st.names:
        st.read(name)  # every CRC-32 checks out
    r = run(cli(*[a.replace("--max_iters=100000", f"--max_iters={int(st.metadata['iter_num']) + 1}")
                  for a in args], "--init_from=resume"), d)
    assert r.returncode == 0, r.stderr


def _trainer_pid(manifest):
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if len(cmd) > 1 and cmd[1].decode(errors="replace").endswith(os.path.join("out", manifest.name)) and \
                    os.path.realpath(os.path.join(f"/proc/{pid}/cwd", cmd[1].decode())) == os.path.realpath(manifest):
                return int(pid)
    raise AssertionError(f"no trainer runs {manifest}")


@needs_mpi
def test_ranks_prepared_differently_refuse_to_start(tmp_path, data):
    d = _folder(tmp_path, "mismatch", data)
    args = ["train", "shakespeare_char", *TINY, "--max_iters=2", "--eval_interval=2", "--out_dir=out"]
    cmd = mpirun(1, *cli(*args)) + [":", "-np", "1", *cli(*args, "--eval_iters=3")]
    r = run(cmd, d, timeout=600)
    assert r.returncode != 0
    assert "rank 1 was prepared with another configuration or program than rank 0" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "iter 0:" not in r.stdout


@needs_mpi
def test_a_rank_that_cannot_start_ends_the_others_within_seconds(tmp_path, data):
    d = _folder(tmp_path, "nostart", data)
    args = ["train", "shakespeare_char", *TINY, "--max_iters=2", "--eval_interval=2", "--out_dir=out"]
    # rank 1's settings are refused before it reaches MPI: rank 0, waiting for it, is ended by mpirun
    r = run(mpirun(1, *cli(*args)) + [":", "-np", "1", *cli(*args, "--n_layer=x")], d)
    assert r.returncode != 0 and "mica: error: --n_layer: n_layer must be int" in r.stderr, r.stderr
    # (its sentence once, where its trainer had started; on a loaded machine mpirun may end it still preparing)
    assert r.stderr.count("mica: rank 0 of 2 stopped:") <= 1 and "Traceback" not in r.stderr
    # a rank that never joins (here not Mica at all): rank 0 stops after MICA_START_TIMEOUT seconds
    t = time.time()
    r = run(mpirun(1, *cli(*args)) + [":", "-np", "1", "sleep", "120"], d, env=dict(_env(), MICA_START_TIMEOUT="5"))
    assert r.returncode != 0 and time.time() - t < 100
    assert "mica: rank 0 of 2 stopped: the other ranks did not all join within 5 s" in r.stderr, r.stderr


@needs_mpi
def test_ranks_write_nothing_into_a_folder_their_rank_0_does_not_hold(tmp_path, data):
    """An outside tester's: every rank made and probed out_dir and removed it again on failure (a
    refused launch on 4 ranks could say "cannot write into the out_dir" and leave the folder), and
    ranks other than 0 wrote their starting values and manifests into out_dir without its lock
    (replacing a running run's files, when their rank 0 came late). Now the ranks are checked first,
    only rank 0 makes, probes, locks and cleans up the folder, and the others write there once the
    lock names their own mpirun job."""
    d = _folder(tmp_path, "owner", data)
    args = ["train", "shakespeare_char", *TINY, "--max_iters=2", "--eval_interval=2", "--out_dir=out"]
    r = run(mpirun(3, *cli(*args)), d)
    assert r.returncode != 0 and not (d / "out").exists()
    said = set(re.findall(r"mica: error: [^\n]*", r.stderr.replace("mica: error:", "\nmica: error:")))
    assert said == {"mica: error: gradient_accumulation_steps=4 does not divide among 3 ranks (each takes an equal "
                    "share of the micro-batches); use a multiple of 3"}, r.stderr
    # another run holds out/: this job's rank 0 is refused, and its rank 1 changes nothing there, even
    # when it is ready first (here alone: its rank 0 never comes)
    (d / "out").mkdir()
    files = {"init.safetensors": b"the other run's starting values", "trainer.rank1.manifest": b"its manifest"}
    for name, text in files.items():
        (d / "out" / name).write_bytes(text)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from mica.files import lock_run_folder; "
                               "lock_run_folder('out', owner='another job'); print('held', flush=True); "
                               "time.sleep(300)"], cwd=d, env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = run(mpirun(2, *cli(*args)), d, env=dict(_env(), MICA_START_TIMEOUT="60"))
        assert r.returncode != 0 and "another mica train is running in out" in r.stderr, r.stderr
        rank1 = dict(_env(), OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="1", PMIX_NAMESPACE="this job",
                     MICA_START_TIMEOUT="2")
        r = run(cli(*args), d, env=rank1)
        assert r.returncode == 2 and r.stderr.strip() == (
            "mica: error: rank 0 of this mpirun job did not take the out_dir out within 2 s (it failed, or another run "
            "holds that folder); see rank 0's message"), r.stderr
    finally:
        holder.kill()
        holder.wait()
    assert sorted(p.name for p in (d / "out").iterdir()) == [".mica.lock", *sorted(files)]
    for name, text in files.items():
        assert (d / "out" / name).read_bytes() == text, name


def test_a_rank_waits_for_its_own_rank_0s_lock_and_goes_alone_where_none_appears(tmp_path):
    """wait_for_run_lock: the job's own name in the lock lets it on at once; another job's keeps it
    waiting to the timeout (a sentence); no lock file at all for `alone_after` seconds means this
    machine does not share rank 0's folder (another machine's disk), where it goes on alone."""
    import time

    from mica.errors import MicaError
    from mica.files import wait_for_run_lock

    (tmp_path / ".mica.lock").write_bytes(b"PMIX_NAMESPACE=ours")
    assert wait_for_run_lock(str(tmp_path), "PMIX_NAMESPACE=ours", 5) is True
    (tmp_path / ".mica.lock").write_bytes(b"PMIX_NAMESPACE=theirs")
    with pytest.raises(MicaError, match="did not take the out_dir"):
        wait_for_run_lock(str(tmp_path), "PMIX_NAMESPACE=ours", 0.3, alone_after=0.1)
    (tmp_path / ".mica.lock").unlink()
    t = time.monotonic()
    assert wait_for_run_lock(str(tmp_path), "PMIX_NAMESPACE=ours", 5, alone_after=0.2) is False
    assert time.monotonic() - t < 3


def test_launches_mica_cannot_share_are_sentences(tmp_path, data):
    d = _folder(tmp_path, "env", data)
    args = cli("train", "shakespeare_char", *TINY, "--max_iters=1", "--out_dir=out")
    r = run(args, d, env=dict(_env(), WORLD_SIZE="2", RANK="0", LOCAL_RANK="0"))
    assert r.returncode != 0 and "run mpirun -np 2 mica train" in r.stderr and "Traceback" not in r.stderr
    r = run(args, d, env=dict(_env(), OMPI_COMM_WORLD_SIZE="3", OMPI_COMM_WORLD_RANK="0"))
    assert r.returncode != 0 and "gradient_accumulation_steps=4 does not divide among 3 ranks" in r.stderr
    r = run(args + ["--zero_stage=1", "--dtype=float16"], d, env=dict(_env(), OMPI_COMM_WORLD_SIZE="2",
                                                                     OMPI_COMM_WORLD_RANK="0"))
    assert r.returncode != 0 and "zero_stage=1 with dtype=float16 is not supported yet" in r.stderr, r.stderr
    r = run(args + ["--zero_stage=2"], d)
    assert r.returncode != 0 and "zero_stage must be 0 (off) or 1" in r.stderr and "Traceback" not in r.stderr
    (d / "order.txt").write_text("1 2 3 4 5\n")  # (a batch is 2 x 4 rows; the run draws two: one process's count)
    r = run(args + ["--batch_order=order.txt"], d, env=dict(_env(), OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="0"))
    assert r.returncode != 0 and "batch order file order.txt holds 5 offsets" in r.stderr, r.stderr


def _nccl_ready():
    try:
        from mica.backends.cuda import build as cb
        from mica.backends.cuda import collectives as cc

        cb.nvcc(), cc.nccl_paths(), cb.cuda_libraries()
        return shutil.which("mpicc") is not None
    except mica.MicaError:
        return False


@needs_mpi
@needs_simulator
def test_nccl_lowering_sums_in_rank_order_bit_for_bit_in_the_simulator(tmp_path):
    """mica_nccl.h's all_reduce chain (chunked), reduce_scatter and all_gather, run on 2 ranks in the
    CUDA simulator (its NCCL over MPI), against numpy's sums in rank order, bit for bit."""
    r = run(mpirun(2, sys.executable, os.path.join(HERE, "mpi", "nccl_check.py")), tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # (each rank's line once and nothing else said: mpirun may interleave the two ranks' writes)
    assert r.stdout.count("rank 0: ok") == r.stdout.count("rank 1: ok") == 1 and "differs" not in r.stdout, r.stdout


@needs_mpi
@needs_simulator
@pytest.mark.slow  # (a variant: the default suite checks the NCCL lowering's bits and two ranks on the CPU; make test-slow runs it)
def test_two_simulated_cards_train_bitwise_like_one(tmp_path, data):
    """mpirun -np 2 mica train --device=cuda: each rank its card (here the simulator's), its share of
    the micro-batches, the gradients summed over NCCL in rank order; the same losses, metrics and
    checkpoint bytes as one process, dropout on."""
    args = ["train", "shakespeare_char", *TINY, "--device=cuda", "--simulate=True", "--max_iters=3",
            "--eval_interval=3", "--eval_iters=1", "--out_dir=out"]
    _one_process_and_two_ranks(tmp_path, data, args, 4 + 2)


def test_what_cards_cannot_shard_yet_is_a_sentence(tmp_path, data):
    d = _folder(tmp_path, "cards", data)
    env = dict(_env(), OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="0")
    base = cli("train", "shakespeare_char", *TINY, "--device=cuda", "--simulate=True", "--max_iters=1", "--out_dir=out")
    r = run(base + ["--zero_stage=1"], d, env=env)
    assert r.returncode != 0 and "zero_stage=1 on 2 ranks runs on the CPU only for now" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    r = run(cli("train", "shakespeare_char", *TINY, "--device=mps", "--max_iters=1"), d, env=env)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "mps" in r.stderr, r.stderr


@pytest.mark.skipif(not _nccl_ready(), reason="needs nvcc, the nvidia-nccl-cu13 wheel and Open MPI")
def test_nccl_lowering_compiles_and_links_with_nvcc(tmp_path):
    """(It runs only on a card; here nvcc builds it for one architecture and the library must name
    NCCL's and MPI's entry points.)"""
    from mica.backends.cuda import build as cb
    from mica.backends.cuda import collectives as cc

    def program(a, b, x):
        d = mica.distributed
        return d.all_reduce([a, b], world=2) * 2.0, d.reduce_scatter(x, world=2), d.all_gather(x, world=2)

    src = mica.trace(program, mica.f32[1000], mica.f32[1000], mica.f64[8, 3]).lower("cuda").source
    assert '#include "mica_nccl.h"' in src and "mica_nccl_all_reduce<float>" in src
    cu, so = str(tmp_path / "p.cu"), str(tmp_path / "p.so")
    open(cu, "w").write(src)
    compile_flags, link_flags = cc.build_flags()
    cmd = cb.nvcc_command(cu, so, shared=True, archs=[90], ptx=False)
    at = cmd.index("-shared")
    r = subprocess.run(cmd[:at] + compile_flags + cmd[at:] + link_flags, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    symbols = subprocess.run(["nm", "-D", so], capture_output=True, text=True).stdout
    for name in ("ncclCommInitRank", "ncclSend", "ncclRecv", "ncclBroadcast", "ncclAllGather", "MPI_Bcast"):
        assert name in symbols, name


# ---- mpirun -np 2 mica train with the speedrun recipe -------------------------------------------------

SPEEDRUN = dict(recipe="speedrun", train_files="data/train_*.bin", val_files="data/val_*.bin", vocab_size=40,
                train_steps=6, batch_size=128, seq_len=16, mbs=2, val_tokens=64, val_every=3, num_layers=2,
                model_dim=32, head_dim=16, ns_steps=3, ns_dtype="bfloat16", device="cpu", threads=1,
                log_interval=1, seed=3)


@pytest.fixture(scope="module")
def speedrun_one(tmp_path_factory):
    """Shards that switch mid-run, the config file, and one process's run of it (out_dir=out)."""
    from mica.data import tokens as tok

    folder = tmp_path_factory.mktemp("speedrun_dp")
    rng = np.random.default_rng(0)
    draw = lambda n: np.minimum(rng.geometric(0.15, n) - 1, 29).astype(np.uint16)  # noqa: E731
    for i, n in enumerate((300, 200, 400, 180)):  # six batches of 128 + 1: two shard switches
        tok.write_shard(str(folder / "data" / f"train_{i:06d}.bin"), draw(n))
    tok.write_shard(str(folder / "data" / "val_000000.bin"), draw(100))
    (folder / "tiny.py").write_text("".join(f"{k} = {v!r}\n" for k, v in SPEEDRUN.items()))
    one = folder / "one"
    one.mkdir()
    for name in ("data", "tiny.py"):
        (one / name).symlink_to(folder / name)
    r = run(cli("train", "tiny.py", "--out_dir=out"), one)
    assert r.returncode == 0, r.stderr
    return folder


def _speedrun_folder(base, name):
    d = base / name
    d.mkdir()
    for n in ("data", "tiny.py"):
        (d / n).symlink_to(base / n)
    return d


def _speedrun_metrics(path):
    return [{k: v for k, v in m.items() if k != "train_time"} for m in _metrics(path)]


@needs_mpi
@pytest.mark.slow  # (a variant: the default suite checks sharded Muon with ZeRO-1; make test-slow runs it)
def test_speedrun_on_two_ranks_with_sharded_muon_is_bitwise_one_process(speedrun_one):
    """Each rank takes its half of every batch and orthogonalizes every other Muon matrix (the
    seed's sharding); the losses and the checkpoint's bytes are one process's."""
    two = _speedrun_folder(speedrun_one, "two_sharded")
    r = run(mpirun(2, *cli("train", "tiny.py", "--out_dir=out")), two)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Muon sharded over 2 ranks (the seed's): Newton–Schulz per step, rank 0: 6 matrices" in r.stdout  # (2 blocks x 6 matrices / 2)
    assert [line.split()[0] for line in re.findall(r"step:\d+/6 val_loss:\S+", r.stdout)] == \
        ["step:0/6", "step:3/6", "step:6/6"]  # (rank 0 alone logs)
    one_metrics = _speedrun_metrics(speedrun_one / "one" / "out" / "metrics.jsonl")
    assert len(one_metrics) == 9 and one_metrics == _speedrun_metrics(two / "out" / "metrics.jsonl")
    a = (speedrun_one / "one" / "out" / "ckpt.safetensors").read_bytes()
    assert a == (two / "out" / "ckpt.safetensors").read_bytes()


@needs_mpi
@pytest.mark.slow  # (a variant: the default suite checks a two-rank resume with ZeRO-1; make test-slow runs it)
def test_speedrun_on_two_ranks_unsharded_stops_and_resumes_as_one_process(speedrun_one):
    """shard_muon=False (every rank updates every matrix), stopped at step 3 and resumed by both
    ranks from the one checkpoint: every tensor and loss of one process's straight run."""
    two = _speedrun_folder(speedrun_one, "two_unsharded")
    r = run(mpirun(2, *cli("train", "tiny.py", "--out_dir=out", "--shard_muon=False", "--stop_at=3")), two)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Muon unsharded (shard_muon=False)" in r.stdout
    r = run(mpirun(2, *cli("train", "tiny.py", "--out_dir=out", "--shard_muon=False", "--init_from=resume")), two)
    assert r.returncode == 0, r.stdout + r.stderr
    a = checkpoint.SafeTensors(str(speedrun_one / "one" / "out" / "ckpt.safetensors"))
    b = checkpoint.SafeTensors(str(two / "out" / "ckpt.safetensors"))
    assert sorted(a.names) == sorted(b.names) and any(n.startswith("optimizer.optimizer2.momentum") for n in a.names)
    for name in a.names:
        assert a.read(name).tobytes() == b.read(name).tobytes(), name
    by_step = lambda path: {(m.get("step"), m.get("iter")): m for m in _speedrun_metrics(path)}  # noqa: E731
    want, got = by_step(speedrun_one / "one" / "out" / "metrics.jsonl"), by_step(two / "out" / "metrics.jsonl")
    assert len(want) == 9 and want == got
    # (the resumed run does not validate step 3 again: one row for it, the straight run's value)
    assert [m["val_loss"] for m in _speedrun_metrics(two / "out" / "metrics.jsonl") if m.get("step") == 3] == \
        [want[(3, None)]["val_loss"]]


@needs_mpi
def test_speedrun_on_two_ranks_with_zero1_and_sharded_muon_is_one_process(speedrun_one):
    """zero_stage=1 beside the seed's sharded Muon: AdamW's tensors (the bfloat16 embedding, the
    head, the gains) have one owner each, Muon's gradients are all-reduced as before. Every tensor
    of the checkpoint and every loss is one process's (the config in its metadata says zero_stage=1)."""
    two = _speedrun_folder(speedrun_one, "two_zero1")
    r = run(mpirun(2, *cli("train", "tiny.py", "--out_dir=out", "--zero_stage=1")), two)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ZeRO-1 over 2 ranks: AdamW's moments, rank 0:" in r.stdout and "Muon sharded over 2 ranks" in r.stdout
    a = checkpoint.SafeTensors(str(speedrun_one / "one" / "out" / "ckpt.safetensors"))
    b = checkpoint.SafeTensors(str(two / "out" / "ckpt.safetensors"))
    assert a.names == b.names and "optimizer.optimizer1.exp_avg.embed.weight" in a.names
    for name in a.names:
        assert a.read(name).tobytes() == b.read(name).tobytes(), name
    assert _speedrun_metrics(speedrun_one / "one" / "out" / "metrics.jsonl") == \
        _speedrun_metrics(two / "out" / "metrics.jsonl")


def test_zero1_assigns_whole_tensors_largest_first_to_the_least_loaded_rank():
    from mica.optim.zero import Layout

    shapes = {"a": (4, 8), "b": (10,), "c": (8, 8), "d": (3,), "e": (2, 10), "f": (5,)}
    lay = Layout(shapes, 3)
    # by size: c 64, a 32, e 20, b 10, f 5, d 3 -> c: 0, a: 1, e: 2, b: 2 (20 < 32), f: 2 (30 < 32), d: 1 (32 < 35)
    assert lay.owner == {"a": 1, "b": 2, "c": 0, "d": 1, "e": 2, "f": 2}
    assert lay.owned == [["c"], ["a", "d"], ["b", "e", "f"]]  # (in the given order on the wire)
    assert lay.counts == (64, 35, 35) and lay.starts == (0, 64, 99) and lay.offset["e"] == 10
    assert Layout(shapes, 8).counts == (64, 32, 20, 10, 5, 3, 1, 1)  # (a rank with nothing sends one zero)


def test_ranks_may_differ_in_threads_but_not_in_what_changes_bits():
    """The hash the ranks compare at start-up leaves out `threads` (no bit depends on it, and each
    rank may take its own share of the cores) and keeps every other setting and the programs."""
    from types import SimpleNamespace

    from mica.train import distributed as dist_mod

    lowered = {n: SimpleNamespace(source=f"/* {n} */") for n in ("train", "eval", "logits")}
    cfg = {"n_layer": 2, "threads": 4, "dropout": 0.0}
    assert dist_mod.run_hash(cfg, lowered, 2) == dist_mod.run_hash({**cfg, "threads": 1}, lowered, 2)
    assert dist_mod.run_hash(cfg, lowered, 2) != dist_mod.run_hash({**cfg, "n_layer": 3}, lowered, 2)
    assert dist_mod.run_hash(cfg, lowered, 2) != dist_mod.run_hash(cfg, {**lowered, "eval": lowered["train"]}, 2)


def test_zero1_ranks_run_the_same_collectives_in_the_same_order():
    """Every rank's program differs under ZeRO-1 (its own tensors, its own moments), but MPI needs
    the same collectives in the same order everywhere, with the same blocks; each rank's moments
    are its share only."""
    from mica.train import config as config_mod
    from mica.train import programs

    def collectives(cfg, vocab, rank):
        _, _, progs = programs.build(cfg, vocab, 2, rank)
        lowered = progs["train"].lower("cpu")
        seq = [(k.op, len(k.inputs), k.attrs.get("counts"), (k.outputs if k.op == "all_gather" else k.inputs)[0].numel)
               for k in lowered.schedule.kernels if getattr(k, "op", None) in ("all_reduce", "reduce_scatter",
                                                                               "all_gather")]
        return seq, lowered.plan.class_bytes["optimizer state"]

    nanogpt = config_mod.load("shakespeare_char", ["--device=cpu", "--n_layer=2", "--n_head=2", "--n_embd=32",
                                                    "--block_size=32", "--batch_size=2", "--zero_stage=1",
                                                    "--gradient_accumulation_steps=4"])
    speedrun = {**config_mod.load(None, [f"--{k}={v}" for k, v in SPEEDRUN.items()]), "zero_stage": 1}
    from mica.train.distributed import same_train_on_every_rank

    for cfg, vocab in ((nanogpt, 65), (speedrun, 40)):
        assert not same_train_on_every_rank(cfg) and not same_train_on_every_rank({**cfg, "shard_muon": False})
        (s0, m0), (s1, m1) = collectives(cfg, vocab, 0), collectives(cfg, vocab, 1)
        assert s0 == s1 and [op for op, *_ in s0].count("reduce_scatter") == 1
        _, _, one = programs.build({**cfg, "zero_stage": 0}, vocab, 1, 0)
        full = one["train"].lower("cpu").plan.class_bytes["optimizer state"]
        assert m0 < full and m1 < full


def test_muon_shards_as_the_seed_sorts_by_size():
    """The seed's order: sorted by size, largest first, ties in the group's order (a stable sort);
    rank r takes matrices r, r + N, ...; each rank's gathered share is padded to its chunks' largest."""
    from mica.optim.muon import newton_schulz_flops, sharding_plan

    shapes = {"a": (4, 8), "b": (8, 4), "c": (4, 4), "d": (8, 4), "e": (2, 2)}
    # sorted: b (8, 4), d (8, 4), a (4, 8), c (4, 4), e (2, 2) -> rank 0: b, a, e; rank 1: d, c
    plan = sharding_plan(shapes, 2, 3)
    f = {n: newton_schulz_flops(s, 3) for n, s in shapes.items()}
    assert [(k, fl) for k, fl, _ in plan] == [(3, f["b"] + f["a"] + f["e"]), (2, f["d"] + f["c"])]
    assert plan[0][2] == plan[1][2] == 4 * 2 * (32 + 32 + 4)  # chunks (b, d), (a, c), (e, pad)
    assert f["a"] == f["b"] == 3 * (4 * 4 * 4 * 8 + 2 * 4 ** 3)  # (either way round: the wide orientation)


def test_a_speedrun_batch_the_ranks_cannot_share_is_a_sentence(speedrun_one):
    d = _speedrun_folder(speedrun_one, "three")
    r = run(cli("train", "tiny.py", "--out_dir=out"), d, env=dict(_env(), OMPI_COMM_WORLD_SIZE="3",
                                                                   OMPI_COMM_WORLD_RANK="0"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "batch_size=128 holds 4 micro-batches of mbs * seq_len tokens, which do not divide among 3 ranks" in r.stderr
