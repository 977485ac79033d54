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

# a kernel's title: above its function, or beside a launch of an earlier kernel's function (the same text)
COMMENT = re.compile(r"(?:^|MICA_MARK\(stream, \d+\);  )/\* k(\d+): (.*?) \*/$", re.M)
HOST = re.compile(r"static int k(\d+)\((?:char \*A, )?cudaStream_t stream[^)]*\) \{(.*?)\n\}", re.S)
RUNS = re.compile(r"^    (?:MICA_LAUNCH\(|if \()k(\d+).*MICA_MARK\(stream, (\d+)\);", re.M)  # function, mark
GEMM = re.compile(r"mica_gemm_(\w+)\(stream, (\d+), (\d+), (\d+),")


# a host call's parts (MICA_PART in its routine), by the primitive
PARTS = {"attention": {1: "S = scale Q K^T", 2: "the CPU's softmax rows", 3: "O = P V"},
         "attention_backward": {1: "D = dO . O", 2: "S = scale Q K^T", 3: "dP = dO V^T", 4: "the CPU's backward rows",
                                5: "dV = P^T dO", 6: "dQ = dS K", 7: "dK = dS^T Q",
                                8: "dQ on tensor cores (TF32)", 9: "dK, dV on tensor cores (TF32)"},
         "layer_norm_backward": {1: "rows (dx)", 2: "columns' lane partials", 0: "columns' trees"},
         "rms_norm_backward": {1: "rows (dx)", 2: "columns' lane partials", 0: "columns' trees"},
         "embedding_backward": {1: "positions' bucket order", 0: "rows' sums"}}


def profile(path, program):
    """[(k, part or None, microseconds)]: the part of a host call ("k<N>.<part>"), or what is left of
    it after its last part (part 0), or a kernel (None)"""
    out = []
    for line in open(path):
        fields = line.split()
        if len(fields) == 3 and fields[0] == program and fields[1].startswith("k"):
            k, _, part = fields[1][1:].partition(".")
            out.append((int(k), int(part) if part else None, float(fields[2])))
    if not out:
        raise SystemExit(f"{path} holds no run of the {program} program")
    with_parts = {k for k, part, _ in out if part is not None}
    return [(k, 0 if part is None and k in with_parts else part, us) for k, part, us in out]


def kinds(path):
    """{k: (label, kind[, flops])} from the CUDA source"""
    src = open(path).read()
    labels = {int(m.group(1)): m.group(2) for m in COMMENT.finditer(src)}
    host = {}  # host function k: (what follows its label, its kind[, flops])
    for m in HOST.finditer(src):
        k, body = int(m.group(1)), m.group(2)
        g = GEMM.search(body)
        if g:
            flops = 2 * int(g.group(2)) * int(g.group(3)) * int(g.group(4)) * max(1, body.count("mica_gemm_"))
            host[k] = (f" [{g.group(1)} {g.group(2)}x{g.group(3)}x{g.group(4)}]", "product", flops)
        else:
            host[k] = ("", "attention" if "mica_attention" in body else "host call")
    runs = {int(mark): int(fn) for fn, mark in RUNS.findall(src)}
    out = {}
    for k, label in labels.items():
        fn = runs.get(k, k)
        if fn in host:
            suffix, kind, *flops = host[fn]
            out[k] = (label + suffix, kind, *flops)
        else:
            out[k] = (label, "generated")
    return out


def main(argv):
    program = argv[3] if len(argv) > 3 else "train"
    top = int(argv[4]) if len(argv) > 4 else 30
    marks = profile(argv[1], program)
    what = kinds(argv[2])
    rows = {}
    for k, _, us in marks:  # (a host call's parts summed)
        rows[k] = rows.get(k, 0.0) + us
    rows = list(rows.items())
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
    by_part = defaultdict(lambda: [0, 0.0])
    for k, part, us in marks:
        if part is not None:
            op = what.get(k, ("?",))[0].split(" (")[0]
            by_part[(op, part)][0] += 1
            by_part[(op, part)][1] += us
    if by_part:
        print("\n| host calls by part | times | ms | share |\n|---|---|---|---|")
        for (op, part), (n, us) in sorted(by_part.items(), key=lambda kv: -kv[1][1]):
            name = PARTS.get(op, {}).get(part, f"part {part}" if part else "the rest")
            print(f"| {op}: {name} | {n} | {us / 1e3:.3f} | {us / total:.1%} |")
    print(f"\n| the {top} longest | us |\n|---|---|")
    for k, us in sorted(rows, key=lambda r: -r[1])[:top]:
        print(f"| k{k}: {what.get(k, ('?',))[0]} | {us:.1f} |")


if __name__ == "__main__":
    try:
        main(sys.argv)
    except OSError as e:  # (a trainer that failed or timed out wrote no profile, or no source was kept)
        raise SystemExit(f"no summary: {e.filename} could not be read ({e.strerror}); see the trainer's log")
