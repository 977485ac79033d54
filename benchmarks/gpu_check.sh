#!/usr/bin/env bash
# The prepared GPU check: run it on a lent GPU machine (the device tool) from the repository root.
# Under 6 minutes; one table printed last. What it checks:
#   1. nvcc builds the test programs for this card;
#   2. the CUDA tests for real (and the collectives' NCCL lowering built and linked, one rank): Mica's kernels give the CPU target's (= the simulator's) bits on
#      the card, the fused (flash-style) attention kernels give the simulator's bits (multi-tile,
#      causal or not, dropout), the MLP and GPT steps match the float64 oracle, 20 iterations of
#      the CUDA trainer give the CPU trainer's losses;
#   3. compute-sanitizer memcheck and racecheck over those programs, attention over several tiles
#      (its shared-memory tiles: racecheck sees the dynamic shared memory the simulator does not
#      check) and the GPT step;
#   4. mica check --device=cuda --method b on shakespeare_char (Mica's CUDA trainer against PyTorch
#      on the card from one start and one batch order, float32, TF32 off), 20 iterations;
#   5. a short mica bench --device=cuda on shakespeare_char (PyTorch eager, default and
#      reduce-overhead; one round): step times, peak GPU memory, the NVIDIA libraries each side maps.
# Offline: nothing is installed; mica runs from this tree (PYTHONPATH=.) and nvcc links the cuBLAS of
# the PyTorch here (its nvidia/cu13 wheel, which mica/backends/cuda/build.py finds by import
# nvidia.cu13). Every step runs under a timeout, cut to what is left of the script's budget
# (DEADLINE_S, default 340 s; a step with under 15 s left is skipped), so the table always comes last.
# What the card's machine lacks comes with the tree: `bash benchmarks/gpu_carry.sh` here fills
# .gpu-carry (Debian's Boost.Context for the simulator, this venv's scipy_openblas32 for the CPU
# trainer), and the device tool's run names it in `carry`; unpacked below when present. Without it
# the tests that compare the card with the simulator or the CPU trainer fail to build those.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -d .gpu-carry/debs ]; then
    for f in .gpu-carry/debs/*.deb; do dpkg -x "$f" /; done
    ldconfig
fi
export PYTHONPATH=".:$PWD/.gpu-carry/site${PYTHONPATH:+:$PYTHONPATH}"
out=${OUT:-/tmp/gpu-check}
work=${WORK:-/tmp/gpu-check-work}  # data, checkpoints, run folders: too large to bring back
mkdir -p "$out" "$work"
# (at most 8 files under $out, what the device tool brings back: table.md, pytest.txt, the two
# sanitizers', check-b.txt and its verdict, bench.txt and its JSON; the rest under $work)
row() { printf '| %-44s | %-6s | %s |\n' "$1" "$2" "$3" >> "$out/table.md"; }
: > "$out/table.md"
start=$(date +%s)
deadline=$(( start + ${DEADLINE_S:-340} ))
# within N CMD...: CMD under a timeout of N s, or of what is left of the budget; 125 (not run) when
# under 15 s are left. (Never `timeout 0`, which would mean no limit.)
within() {
    local n=$1 left=$(( deadline - $(date +%s) ))
    shift
    [ "$left" -lt "$n" ] && n=$left
    [ "$n" -lt 15 ] && return 125
    timeout "$n" "$@"
}
verdict() { case $1 in 0) echo pass ;; 125) echo skip ;; *) echo FAIL ;; esac; }
nvidia-smi -L > "$work/gpu.txt" 2>&1
card=$(head -1 "$work/gpu.txt")

# 1-2. the CUDA tests on the card
t0=$(date +%s)
within 200 env PYTHONPATH=$PYTHONPATH $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_cuda_train.py \
    -k "gpu or nvcc or sentence" \
    > "$out/pytest.txt" 2>&1
rc=$?
detail=$(tail -1 "$out/pytest.txt"); [ $rc = 124 ] && detail="timed out: $detail"
row "CUDA tests on the card (pytest)" "$(verdict $rc)" "$detail ($(( $(date +%s) - t0 )) s)"
# the collectives' NCCL lowering, one rank: nvcc builds and links it (it skips without Open MPI's mpicc)
t0=$(date +%s)
within 90 env PYTHONPATH=$PYTHONPATH $PY -m pytest -q -p no:cacheprovider tests/test_distributed.py -k nccl > "$work/nccl.txt" 2>&1
rc=$?
row "NCCL lowering builds (pytest, one rank)" "$(verdict $rc)" "$(tail -1 "$work/nccl.txt") ($(( $(date +%s) - t0 )) s)"
for prog in no_products row_kernels mlp_step; do
    within 60 env PYTHONPATH=$PYTHONPATH:tests $PY - "$prog" "$work" <<'PYEOF' > "$work/build-$prog.txt" 2>&1
import sys, numpy as np
import test_cuda as t
name, out = sys.argv[1], sys.argv[2]
program = getattr(t, name)()
exe = program.lower("cuda").build()
open(f"{out}/{name}.lib", "w").write(exe.library)
PYEOF
done

# 3. compute-sanitizer
if command -v compute-sanitizer > /dev/null; then
    for tool in memcheck racecheck; do
        within 90 env PYTHONPATH=$PYTHONPATH:tests compute-sanitizer --tool "$tool" --error-exitcode 9 $PY - <<'PYEOF' \
            > "$out/sanitizer-$tool.txt" 2>&1
import numpy as np
import test_cuda as t
import mica
from test_cpu_gpt import _setup
for make, args in ((t.no_products, lambda: t.data(((33, 40), (33, 57)), seed=1)), (t.row_kernels, t.row_data),
                   (t.mlp_step, lambda: t.data(t.SHAPES))):
    make().lower("cuda").build()(*args(), seed=3)
program, shapes = t.attention_cases(t.ATTENTION_CASES[4:])  # the fused attention kernels over several tiles
program.lower("cuda").build()([tuple(t.data(case, seed=2)) for case in shapes], seed=4)
step, specs, params, state, batch = _setup(dropout=0.1)  # attention, the graph, cuBLASLt's products
mica.trace(step, *specs).lower("cuda").build()(params, state, *batch, seed=3)
program, shapes = t.attention_cases(t.TF32_CASES)  # the TF32 tensor-core kernels (wmma, shared tiles)
program.lower("cuda", tf32=True).build()([tuple(t.data(case, seed=2)) for case in shapes], seed=4)
PYEOF
        rc=$?
        row "compute-sanitizer $tool (6 programs)" "$(verdict $rc)" \
            "$(grep -m1 'SUMMARY' "$out/sanitizer-$tool.txt" || echo "exit $rc")"
    done
else
    row "compute-sanitizer" "skip" "not installed"
fi

# 4. method B on the card: both sides from one start, one batch order, float32 with TF32 off
data="$work/data/shakespeare_char"
within 60 env PYTHONPATH=$PYTHONPATH $PY -m mica.cli prepare shakespeare-char --input tests/data/tinyshakespeare.txt \
    --out "$data" > "$work/prepare.txt" 2>&1
t0=$(date +%s)
within 150 env PYTHONPATH=$PYTHONPATH $PY -m mica.cli check --device=cuda --method b --model shakespeare_char --iters 20 \
    --data_dir "$data" --out "$work/check-b" > "$out/check-b.txt" 2>&1
rc=$?
cp "$work/check-b/verdict.json" "$out/check-b-verdict.json" 2>/dev/null
case $rc in
    0|1) detail=$(grep -m1 '^method B' "$out/check-b.txt" || tail -1 "$out/check-b.txt") ;;
    124) detail="timed out" ;;
    125) detail="out of time" ;;
    *) detail=$(tail -1 "$out/check-b.txt") ;;
esac
row "mica check --device=cuda --method b" "$(verdict $rc)" "$detail ($(( $(date +%s) - t0 )) s)"

# 5. the protocol on the card, short: one round, 20 steps of warm-up, a window of 60
t0=$(date +%s)
within 200 env PYTHONPATH=$PYTHONPATH $PY -m mica.cli bench --device=cuda --model shakespeare_char --data_dir "$data" \
    --modes eager default reduce-overhead --rounds 1 --warmup 20 --window 60 --every 10 --out "$work/bench" \
    > "$out/bench.txt" 2>&1
rc=$?
cp "$work/bench/bench-shakespeare_char.json" "$out/" 2>/dev/null
if [ $rc = 0 ] && [ -f "$out/bench-shakespeare_char.json" ]; then
    # one row per configuration (a failed or OOM mode too), and whether Mica's trainer mapped NVRTC
    $PY - "$out/bench-shakespeare_char.json" >> "$out/table.md" <<'PYEOF'
import json, sys
res = json.load(open(sys.argv[1]))
def row(check, result, detail):
    print(f"| {check:<44} | {result:<6} | {detail} |")
for name, c in res["configs"].items():
    gpu = f"unknown ({c.get('peak_gpu_unknown')})" if c.get("peak_gpu_mb") is None else f"{c['peak_gpu_mb']:.0f} MB"
    torch = f", PyTorch reserved {c['torch_max_reserved_mb']:.0f} MB" if "torch_max_reserved_mb" in c else ""
    verdict = f", {c['verdict']} ({c['ratio']:.2f}x)" if "verdict" in c else ""
    row(f"bench shakespeare_char: {name}", "ran", f"{c['median_ms']:.2f} ms/step, GPU {gpu}{torch}, RSS "
        f"{c['peak_rss_mb']:.0f} MB{verdict}")
    if name.startswith("mica"):
        row(f"bench: {name} maps no NVRTC", "FAIL" if c.get("nvrtc") else "pass",
            ", ".join(n.split(".so")[0] for n in c.get("nvidia_libraries", [])) or "no NVIDIA library")
for name, why in res["failures"].items():
    row(f"bench shakespeare_char: {name}", res.get("failure_kinds", {}).get(name, "failed"), why[:100])
PYEOF
fi
case $rc in
    0) detail="table in bench.txt" ;;
    124) detail="timed out" ;;
    125) detail="out of time" ;;
    *) detail=$(tail -1 "$out/bench.txt") ;;
esac
row "mica bench --device=cuda (short)" "$(verdict $rc)" "$detail ($(( $(date +%s) - t0 )) s)"

echo
echo "GPU check on: $card   (commit $(git rev-parse --short HEAD 2>/dev/null), $(( $(date +%s) - start )) s)"
echo "| check                                        | result | detail |"
echo "|---|---|---|"
cat "$out/table.md"
