"""The CUDA simulator's own tests (mica/backends/cuda/mica_cudasim.h).

Small CUDA programs (tests/cudasim/*.cu) are compiled by g++ against the simulator header, as
CI will compile Mica's generated CUDA C, and run; their printed values are checked against
numpy's float32 arithmetic in the same order (bitwise) or against exact counts. Planted bugs
must abort with the simulator's one-line message (or AddressSanitizer's report). The same
sources must also compile with nvcc where it is installed.
"""
import concurrent.futures
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
HEADER_DIR = ROOT / "mica" / "backends" / "cuda"
MATH_DIR = ROOT / "mica" / "backends" / "cstyle"  # mica_math.h
SRC = Path(__file__).resolve().parent / "cudasim"
BOOST_HEADER = Path("/usr/include/boost/context/fiber.hpp")
NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if os.access("/usr/local/bin/nvcc", os.X_OK) else None)
CXX = shutil.which("g++")

pytestmark = [
    pytest.mark.skipif(CXX is None, reason="g++ is not installed"),
    pytest.mark.skipif(not BOOST_HEADER.exists(),
                       reason="libboost-context-dev is not installed (make test installs it)"),
]

FLAGS = ["-x", "c++", "-std=c++17", "-O1", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror",
         f"-I{HEADER_DIR}", f"-I{MATH_DIR}"]
LIBS = ["-lboost_context", "-pthread"]
ASAN = ["-fsanitize=address", "-fno-omit-frame-pointer"]
BUILDS = {  # name: (source, extra flags)
    "correct": ("correct.cu", []),
    "correct_asan": ("correct.cu", ASAN),
    "bugs_asan": ("bugs.cu", ASAN),
    "race": ("race.cu", ["-DMICA_CUDASIM_RACECHECK"]),
    "libinprocess.so": ("inprocess.cu", ["-fPIC", "-shared"]),
}


def _compile(out_dir, name):
    src, extra = BUILDS[name]
    exe = out_dir / name
    cmd = [CXX, *FLAGS, *extra, str(SRC / src), "-o", str(exe), *LIBS]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    return exe


@pytest.fixture(scope="session")
def programs(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("cudasim")
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, min(len(BUILDS), os.cpu_count() or 2))) as pool:
        futures = {name: pool.submit(_compile, out_dir, name) for name in BUILDS}
        return {name: f.result() for name, f in futures.items()}


def run(exe, *args, threads=2):
    env = dict(os.environ, MICA_CUDASIM_THREADS=str(threads), ASAN_OPTIONS="detect_leaks=1")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, env=env)


def run_ok(exe, *args, threads=2):
    res = run(exe, *args, threads=threads)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    return res.stdout.splitlines()


# ---- numpy's float32 in the kernels' order ----------------------------------------------------
def inputs(start, count):
    i = np.arange(start, start + count, dtype=np.int64)
    return ((i * 7919) % 10007).astype(np.float32) / np.float32(10007) - np.float32(0.5)


def tree_sum(v):
    """Pairs (t, t+s) for s = pow2ceil(n)/2, ..., 1: the order of block_sum in correct.cu."""
    v = np.array(v, dtype=np.float32)
    n = len(v)
    p = 1
    while p < n:
        p <<= 1
    s = p // 2
    while s > 0:
        m = max(0, min(s, n - s))
        v[:m] = v[:m] + v[s:s + m]
        s //= 2
    return v[0]


def sites(path):
    """Line numbers of the `// @name` markers in a source, so messages can be checked by site."""
    out = {}
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if "// @" in text:
            out[text.split("// @")[1].strip()] = number
    return out


def hexbits(x):
    return f"{int(np.float32(x).view(np.uint32)):08x}"


BOTH = pytest.mark.parametrize("build", ["correct", "correct_asan"])


# ---- (a) block tree reduction ------------------------------------------------------------------
@BOTH
def test_block_tree_reduction_equals_the_host_tree_bitwise(programs, build):
    lines = run_ok(programs[build], "reduce")
    sizes = [1, 2, 3, 31, 32, 33, 64, 100, 255, 256, 1000, 1023, 1024]
    assert [ln.split()[1] for ln in lines] == [f"n={n}" for n in sizes]
    for n, ln in zip(sizes, lines):
        x = inputs(0, 5 * n)
        want = [hexbits(tree_sum(x[b * n:(b + 1) * n])) for b in range(5)]
        assert ln.split()[2:] == want, f"n={n}"
    # the order matters: a left-to-right sum of the 1000-thread block gives other bits
    x = inputs(0, 1000)
    assert hexbits(np.cumsum(x, dtype=np.float32)[-1]) != lines[10].split()[2]


# ---- (b) warp shuffles ---------------------------------------------------------------------------
@BOTH
def test_warp_shuffle_reduction_is_the_same_tree(programs, build):
    lines = run_ok(programs[build], "shuffle")
    sums = lines[:5]
    for n, ln in zip([32, 64, 96, 256, 1024], sums):
        words = ln.split()
        assert words[1] == f"n={n}"
        blocks, warps = words[2:5], words[6:]
        x = inputs(0, 3 * n)
        want_warps, want_blocks = [], []
        for b in range(3):
            w = [tree_sum(x[b * n + 32 * k: b * n + 32 * (k + 1)]) for k in range(n // 32)]
            want_warps += [hexbits(v) for v in w]
            want_blocks.append(hexbits(tree_sum(w + [np.float32(0)] * (32 - len(w)))))
        assert warps == want_warps and blocks == want_blocks, f"n={n}"
    # a 32-thread block: the shuffle tree and the shared-memory tree give the same bits
    reduce32 = next(ln for ln in run_ok(programs["correct"], "reduce") if ln.startswith("reduce n=32 "))
    assert sums[0].split()[2:5] == reduce32.split()[2:5]

    kinds = {ln.split()[0]: ln.split()[1:] for ln in lines[5:]}
    t = np.arange(64)
    assert [int(v) for v in kinds["xor"]] == [528] * 32 + [1552] * 32
    base = (t // 32) * 32
    scan = [sum(k * 1000000007 for k in range(b, i + 1)) for i, b in zip(t, base)]
    assert [int(v) for v in kinds["scan"]] == scan
    assert [float(v) for v in kinds["seg"]] == [float((i & ~7) + 3) + 0.25 for i in t]
    assert [int(v) for v in kinds["rot"]] == [3 * (b + (i + 1) % 32) for i, b in zip(t, base)]
    half = [float(i + 1 if i % 32 < 15 else i) if i % 32 < 16 else 0.0 for i in t]
    assert [float(v) for v in kinds["half"]] == half


# ---- (c) votes -------------------------------------------------------------------------------------
@BOTH
def test_votes_and_ballot(programs, build):
    lines = run_ok(programs[build], "votes")
    for w in range(3):
        ballot = sum(1 << lane for lane in range(32) if (32 * w + lane) % 3 == 0)
        any_ = int(w == 2)  # only thread 70 votes yes
        assert lines[w] == f"warp {w} ballot {ballot:08x} all 1 any {any_} lowhalf 0000aaaa"
    assert lines[3] == f"count {sum(1 for t in range(96) if t % 3 == 0)}"


# ---- (d) atomics -----------------------------------------------------------------------------------
@BOTH
def test_atomics_from_many_blocks_on_two_os_threads(programs, build):
    n = 64 * 256
    want_max = max((g * 37) % 10007 for g in range(n))
    for _ in range(3):
        (line,) = run_ok(programs[build], "atomics", threads=2)
        assert line == f"count {n} fsum {float(n):.1f} dsum {n / 2:.1f} max {want_max} cas {2 * n} exch 42"


# ---- (e) grid-stride axpy --------------------------------------------------------------------------
@BOTH
def test_grid_stride_axpy_gives_the_same_bits_for_every_launch(programs, build):
    n = 10007
    x, y = inputs(0, n), inputs(12345, n)
    out = np.float32(0.3) * x + y
    bits = out.view(np.uint32)
    want = f"bitsum={int(bits.astype(np.uint64).sum())} first={bits[0]:08x} last={bits[-1]:08x}"
    lines = run_ok(programs[build], "axpy")
    configs = [(1, 1), (1, 32), (3, 64), (7, 100), (40, 256), (20, 1024)]
    assert lines == [f"axpy grid={g} block={b} {want}" for g, b in configs]


def test_results_do_not_depend_on_the_number_of_os_threads(programs):
    for mode in ["reduce", "shuffle", "axpy"]:
        assert run_ok(programs["correct"], mode, threads=1) == run_ok(programs["correct"], mode, threads=2)


# ---- (f) planted bugs ------------------------------------------------------------------------------
PLANTED = {
    "divergent": "divergent barrier in divergent block (0,0,0): thread (0,0,0) waits at __syncthreads at "
                 "{f}:{divergent_a}, thread (32,0,0) at __syncthreads at {f}:{divergent_b}",
    "exited_barrier": "barrier reached after some threads exited in barrier_after_exit block (0,0,0): 100 of "
                      "128 threads wait at __syncthreads at {f}:{exited_barrier}, thread (100,0,0) and 27 others "
                      "have returned",
    "exited_shuffle": "__shfl_down_sync at {f}:{exited_shuffle} in shuffle_exited block (0,0,0): mask 0xffffffff "
                      "names lane 16 (thread (16,0,0)), which has exited",
    "shuffle_sites": "mismatched warp exchange in shuffle_sites block (0,0,0): lane 0 calls __shfl_xor_sync at "
                     "{f}:{sites_even} with mask 0xffffffff, lane 1 calls __shfl_xor_sync at {f}:{sites_odd} "
                     "with mask 0xffffffff",
    "partial_warp": "__shfl_down_sync at {f}:{partial} in partial_warp block (0,0,0): lane 0 (thread (32,0,0)) "
                    "reads lane 16, which does not exist (the block has 48 threads)",
    "outside_mask": "__shfl_sync at {f}:{outside} in outside_mask block (0,0,0): lane 3 (thread (3,0,0)) reads "
                    "lane 20, which is not in the mask 0x0000ffff and has exited",
    "shuffle_vs_barrier": "deadlock in shuffle_vs_barrier block (0,0,0): thread (0,0,0) waits in __shfl_sync at "
                          "{f}:{vs_shuffle} with mask 0xffffffff, but thread (5,0,0) in that mask waits at "
                          "__syncthreads at {f}:{vs_barrier}",
}


@pytest.mark.parametrize("mode", sorted(PLANTED))
def test_planted_bug_aborts_with_one_line(programs, mode):
    res = run(programs["bugs_asan"], mode)
    assert res.returncode != 0
    assert "finished" not in res.stdout
    want = PLANTED[mode].format(f=SRC / "bugs.cu", **sites(SRC / "bugs.cu"))
    assert res.stderr.splitlines() == ["mica_cudasim: " + want]


def test_out_of_bounds_write_is_caught_by_addresssanitizer(programs):
    res = run(programs["bugs_asan"], "oob")
    assert res.returncode != 0
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in res.stderr
    assert "WRITE of size 4" in res.stderr and "oob(float*, int)" in res.stderr
    # the same kernel with the bound right runs clean under ASan
    assert run_ok(programs["bugs_asan"], "none") == ["finished none"]


def test_race_check_catches_a_missing_syncthreads(programs):
    f, at = SRC / "race.cu", sites(SRC / "race.cu")
    res = run(programs["race"], "missing_sync")
    assert res.returncode != 0
    assert res.stderr.splitlines() == [
        f"mica_cudasim: shared-memory race on sh[1] at {f}:{at['missing']} in tree_missing_sync block (0,0,0): "
        "thread (1,0,0) writes it after thread (0,0,0) read it, with no barrier between (a missing "
        "__syncthreads?)"]
    res = run(programs["race"], "stale_read")
    assert res.returncode != 0
    assert res.stderr.splitlines() == [
        f"mica_cudasim: shared-memory race on tile[31] at {f}:{at['stale']} in stale_read block (0,0,0): "
        "thread (32,0,0) writes it after thread (31,0,0) read it, with no barrier between (a missing "
        "__syncthreads?)"]


def test_race_check_bounds_checks_shared_arrays(programs):
    f, at = SRC / "race.cu", sites(SRC / "race.cu")
    res = run(programs["race"], "overrun")
    assert res.returncode != 0
    assert res.stderr.splitlines() == [
        f"mica_cudasim: tile[64] at {f}:{at['overrun']} in overrun block (0,0,0): index out of bounds (the array "
        "has 64 elements)"]


def test_race_check_accepts_correct_barriers_and_syncwarp(programs):
    (line, _) = run_ok(programs["race"], "clean")
    h = np.arange(512) % 7
    x = h[:64].astype(np.float32)
    exchange = [2 * x[(j & ~31) + 31 - (j & 31)] for j in range(64)]
    assert line == (f"clean sums {h[:256].sum()} {h[256:].sum()} exchange "
                    f"{exchange[63]:g} {exchange[0]:g}")


# ---- (g) streams, events, graphs; (h) the device ---------------------------------------------------
@BOTH
def test_streams_events_and_a_graph_replayed_three_times(programs, build):
    lines = run_ok(programs[build], "graph")
    assert lines == [
        "stream v[0]=0 v[299]=299 elapsed_ok=1",
        "captured nodes=3 v[299] after capture=299",  # capturing records, runs nothing
        f"replayed v[0]=0 v[1]={1 + 3 * 1.5:g} v[299]={299 + 3 * 1.5 * 299:g}",
    ]


@BOTH
def test_the_device_is_the_simulator(programs, build):
    assert run_ok(programs[build], "device") == [
        "devices 1 name Mica CPU simulator warp 32 maxthreads 1024 simulated 1",
        "launch 1025 threads: cudaErrorInvalidConfiguration (invalid configuration argument); then cudaSuccess",
        "launch 64 KiB dynamic shared: cudaErrorInvalidConfiguration",
        "after cudaFuncSetAttribute: cudaSuccess",
        "coords bad=0",
        f"scale<int, 3> c[25]={3 * (1000 * 1 + 1)}",
    ]


@BOTH
def test_micas_own_math_runs_in_kernels_with_the_hosts_bits(programs, build):
    lines = run_ok(programs[build], "math")
    assert lines[0] == "math host mismatches 0"
    from math import erf, exp, sqrt, tanh

    def f32(h):
        return float(np.array([int(h, 16)], dtype=np.uint32).view(np.float32)[0])
    for ln in lines[1:]:
        w = ln.split()
        x, got = f32(w[1]), {k: f32(v) for k, v in zip(w[2::2], w[3::2])}
        want = {"exp": exp(x), "tanh": tanh(x), "erf": erf(x), "gelu": 0.5 * x * (1 + erf(x / sqrt(2)))}
        for k, v in want.items():
            assert abs(got[k] - v) <= 1e-6 * abs(v) + 1e-7, (k, x, got[k], v)


def test_kernels_run_in_process_from_a_shared_library(programs):
    script = f"""
import ctypes, numpy as np
lib = ctypes.CDLL({str(programs["libinprocess.so"])!r})
x = (np.arange(1000, dtype=np.float32) - 500) / 7
want = (x * x).reshape(-1, 2)[:, ::-1].ravel()
for _ in range(3):
    y = np.zeros_like(x)
    rc = lib.run(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), 1000)
    print(rc, np.array_equal(y.view(np.uint32), want.view(np.uint32)))
"""
    env = dict(os.environ, MICA_CUDASIM_THREADS="2")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["0 True"] * 3


def test_approximate_intrinsics_are_refused_at_compile_time(tmp_path):
    src = tmp_path / "fast.cu"
    src.write_text('#include "mica_cudasim.h"\n__global__ void k(float* y) { y[0] = __expf(y[0]); }\n'
                   "int main() { return 0; }\n")
    res = subprocess.run([CXX, *FLAGS, "-fsyntax-only", str(src)], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "mica_cudasim: __expf is the GPU's approximate intrinsic" in res.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_same_sources_compile_with_nvcc(tmp_path):
    for name in ["correct.cu", "race.cu"]:
        cmd = [NVCC, "-arch=sm_80", "--fmad=false", "-Werror", "all-warnings", f"-I{HEADER_DIR}", f"-I{MATH_DIR}", "-c",
               str(SRC / name), "-o", str(tmp_path / (name + ".o"))]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
        assert (tmp_path / (name + ".o")).stat().st_size > 0
