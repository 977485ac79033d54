"""The bfloat16 product ceiling beside the float32 one, on a GPT's product shapes (bf16_shapes.c):
every bfloat16 kernel this processor has (mica_bf16gemm.h: AMX tiles, AVX512-BF16, the float32
fallback) and Mica's float32 product (OpenBLAS tiles). Rounds alternate the builds; each shape's
median over rounds of the best-of-reps time; prints a table of GFLOP/s.

    .venv/bin/python benchmarks/bf16_gemm.py [rounds] [tokens] [n_embd]   # default 5 768 128 (cpu)
"""
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mica.backends.c import bf16gemm  # noqa: E402
from mica.backends.c.build import INCLUDES, blas_flags  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
tokens, embd = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else ("768", "128")
flags = bf16gemm.machine_flags()
kernels = [k for k in bf16gemm.KERNELS if all(f in flags for f in bf16gemm.NEEDS[k])]
_, ld = blas_flags("openblas")
exes, build_dir = {}, tempfile.mkdtemp(prefix="mica-bf16-bench-")
for k in kernels:
    exes[k] = os.path.join(build_dir, f"bf16_shapes_{k}")
    subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", "-ffp-contract=off", *INCLUDES,
                    f"-DMICA_BF16_GEMM={bf16gemm.KERNELS[k]}", os.path.join(here, "bf16_shapes.c"), "-o", exes[k],
                    *ld, "-lm"], check=True)
env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"), OPENBLAS_NUM_THREADS="1")
times = {}  # (kernel or "f32 sgemm", shape) -> [seconds per round]
for r in range(rounds):
    for k in kernels[r % len(kernels):] + kernels[:r % len(kernels)]:
        out = subprocess.run([exes[k], tokens, embd], env=env, capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            shape, t16, t32 = line.split(",")
            times.setdefault((k, shape), []).append(float(t16))
            times.setdefault(("f32 sgemm", shape), []).append(float(t32))
shapes = list(dict.fromkeys(s for _, s in times))
cols = kernels + ["f32 sgemm"]


def gflops(shape, seconds):
    m, n, k = (int(x) for x in shape.split()[0].split("x"))
    return 2.0 * m * n * k / seconds / 1e9


print("| shape (MxNxK op) | " + " | ".join(f"{c} GF/s" for c in cols) + " |")
print("|---|" + "---|" * len(cols))
total = {c: 0.0 for c in cols}
flops = 0.0
for s in shapes:
    m, n, k = (int(x) for x in s.split()[0].split("x"))
    flops += 2.0 * m * n * k
    row = []
    for c in cols:
        t = statistics.median(times[(c, s)])
        total[c] += t
        row.append(f"{gflops(s, t):.1f}")
    print(f"| {s} | " + " | ".join(row) + " |")
print("| all shapes | " + " | ".join(f"{flops / total[c] / 1e9:.1f}" for c in cols) + " |")
