"""One CUDA run's time by kernel, from the trainer's own profile (MICA_PROFILE=<file>: each program's
third run enqueued outside its graph with an event after every kernel or host call, written as
"<program> k<N> <microseconds>" lines; mica_cuda.h) and the program's CUDA source, which says what
each kN computes (its comment) and, for a product, its shape.

    python benchmarks/gpu_profile.py PROFILE train.cu [program] [top]

Prints the run's total, the time by kind (generated kernels, products, attention and the other
host calls), by the ops of the generated kernels, and the longest kernels."""
import re
import sys
from collections import defaultdict

COMMENT = re.compile(r"^/\* k(\d+): (.*?) \*/$", re.M)
HOST = re.compile(r"static int k(\d+)\(char \*A, cudaStream_t stream\) \{(.*?)\n\}", re.S)
GEMM = re.compile(r"mica_gemm_(\w+)\(stream, (\d+), (\d+), (\d+),")


def profile(path, program):
    out = []
    for line in open(path):
        parts = line.split()
        if len(parts) == 3 and parts[0] == program and parts[1].startswith("k"):
            out.append((int(parts[1][1:]), float(parts[2])))
    if not out:
        raise SystemExit(f"{path} holds no run of the {program} program")
    return out


def kinds(path):
    """{k: (label, kind)} from the CUDA source"""
    src = open(path).read()
    out = {}
    for m in COMMENT.finditer(src):
        out[int(m.group(1))] = (m.group(2), "generated")
    for m in HOST.finditer(src):
        k, body = int(m.group(1)), m.group(2)
        g = GEMM.search(body)
        label = out.get(k, ("?",))[0]
        if g:
            flops = 2 * int(g.group(2)) * int(g.group(3)) * int(g.group(4)) * max(1, body.count("mica_gemm_"))
            out[k] = (f"{label} [{g.group(1)} {g.group(2)}x{g.group(3)}x{g.group(4)}]", "product", flops)
        else:
            out[k] = (label, "attention" if "mica_attention" in body else "host call")
    return out


def main(argv):
    program = argv[3] if len(argv) > 3 else "train"
    top = int(argv[4]) if len(argv) > 4 else 30
    rows = profile(argv[1], program)
    what = kinds(argv[2])
    total = sum(us for _, us in rows)
    print(f"one {program} run, kernel by kernel outside the graph: {len(rows)} marks, {total / 1e3:.2f} ms")
    by_kind, by_op = defaultdict(lambda: [0, 0.0, 0]), defaultdict(lambda: [0, 0.0])
    for k, us in rows:
        label, kind, *flops = what.get(k, ("?", "?"))
        by_kind[kind][0] += 1
        by_kind[kind][1] += us
        by_kind[kind][2] += flops[0] if flops else 0
        op = re.sub(r" \(.*?\)", "", label) if kind == "generated" else kind
        by_op[op][0] += 1
        by_op[op][1] += us
    print("\n| kind | calls | ms | share | TFLOP/s |\n|---|---|---|---|---|")
    for kind, (n, us, flops) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        rate = f"{flops / us / 1e6:.1f}" if flops else ""
        print(f"| {kind} | {n} | {us / 1e3:.2f} | {us / total:.0%} | {rate} |")
    print("\n| what (generated kernels by their ops) | kernels | ms | share |\n|---|---|---|---|")
    for op, (n, us) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"| {op} | {n} | {us / 1e3:.3f} | {us / total:.1%} |")
    print(f"\n| the {top} longest | us |\n|---|---|")
    for k, us in sorted(rows, key=lambda r: -r[1])[:top]:
        print(f"| k{k}: {what.get(k, ('?',))[0]} | {us:.1f} |")


if __name__ == "__main__":
    main(sys.argv)
