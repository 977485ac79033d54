"""Attention's CUDA paths side by side on a card: one program holding a model's attention, forward
and backward (q, k, v and the output's gradient in; o, dq, dk, dv out), built once per path for
this card's architecture alone, its inputs loaded once, then rounds alternating between the paths
(the order rotating), each round timing `runs` replays of the program's graph. Prints per path the
median ms of a forward + backward and its range over the rounds, the ratio to the first path, and
each path's largest relative difference from the first (a TF32 path differs by TF32's rounding).

    python benchmarks/gpu_attention_ab.py [--shape shakespeare_char|gpt2|B,H,L,E] [--paths tf32,products]
                                          [--rounds 5] [--runs 20] [--causal 1] [--simulate]

--simulate runs the same on the CPU simulator (tiny shapes only: a check of this script, not a time).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import mica  # noqa: E402
from mica.backends.cstyle.executable import AbiExecutable  # noqa: E402
from mica.backends.cuda import build  # noqa: E402

SHAPES = {"shakespeare_char": (64, 6, 256, 64), "gpt2": (12, 12, 1024, 64)}


def program(B, H, L, E, causal):
    F = mica.nn.functional

    def step(q, k, v, g):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        dq, dk, dv = mica.grad((o * g).sum(), [q, k, v])
        return o, dq, dk, dv

    return mica.trace(step, *[mica.f32[B, H, L, E]] * 4, name="attention")


def arch():
    """This card's compute capability as nvcc names it (90 for an H100 or H200; 90 where none answers)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.split()
    except OSError:
        out = []
    return out[0].replace(".", "") if out else "90"


def executable(prog, path, simulate, workdir):
    lowered = prog.lower("cuda", tf32=True, attention=path, simulate=simulate)
    if simulate:
        return lowered.build()
    src, lib = os.path.join(workdir, f"{path}.cu"), os.path.join(workdir, f"{path}.so")
    with open(src, "w") as f:
        f.write(lowered.source)
    a = arch()
    subprocess.run(build.nvcc_command(src, lib, archs=[a]),
                   check=True)
    return AbiExecutable(lowered, lib)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="shakespeare_char")
    ap.add_argument("--paths", default="tf32,products")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--simulate", action="store_true")
    a = ap.parse_args()
    B, H, L, E = SHAPES.get(a.shape) or tuple(int(x) for x in a.shape.split(","))
    prog = program(B, H, L, E, bool(a.causal))
    paths = a.paths.split(",")
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((B, H, L, E)).astype(np.float32) for _ in range(4)]
    exes, outs = {}, {}
    with tempfile.TemporaryDirectory() as workdir:
        for p in paths:
            t0 = time.time()
            exes[p] = executable(prog, p, a.simulate, workdir)
            exes[p].load(*args)
            for _ in range(3):  # (the first run captures the graph and times the products record's shapes)
                exes[p].run()
            outs[p] = exes[p].results()
            print(f"{p}: built and warmed in {time.time() - t0:.1f} s", flush=True)
        times = {p: [] for p in paths}
        for r in range(a.rounds):
            for p in paths[r % len(paths):] + paths[:r % len(paths)]:
                t0 = time.perf_counter()
                for _ in range(a.runs):
                    exes[p].run()
                times[p].append((time.perf_counter() - t0) / a.runs * 1000)
    flops = 2 * 2 * B * H * L * L * E * (0.5 if a.causal else 1.0)  # the forward's two products
    print(f"\nattention B={B} H={H} L=S={L} E={E} causal={bool(a.causal)}, forward + backward, "
          f"{a.rounds} rounds x {a.runs} runs{' (SIMULATED)' if a.simulate else ''}")
    print("| path | median ms | range | ratio to " + paths[0] + " | TFLOP/s (forward 2 + backward 5 products) "
          "| largest rel. diff from " + paths[0] + " |")
    print("|---|---|---|---|---|---|")
    base = statistics.median(times[paths[0]])
    for p in paths:
        med = statistics.median(times[p])
        diff = max(float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30)) for x, y in zip(outs[p], outs[paths[0]]))
        print(f"| {p} | {med:.3f} | {min(times[p]):.3f} - {max(times[p]):.3f} | {med / base:.2f} | "
              f"{flops * 3.5 / (med / 1000) / 1e12:.1f} | {diff:.2e} |")


if __name__ == "__main__":
    main()
