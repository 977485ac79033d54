#!/usr/bin/env bash
# The prepared GPU check: run it on a lent GPU machine (the device tool) from the repository root.
# Under 6 minutes; one table printed last. What it checks today (the CUDA target's first slice):
#   1. nvcc builds the test programs for this card;
#   2. the CUDA tests for real: Mica's kernels give the CPU target's (= the simulator's) bits on
#      the card, the MLP step matches the float64 oracle;
#   3. compute-sanitizer memcheck and racecheck over those programs.
# (Still to come with the CUDA trainer: mica check --method b and mica bench --device=cuda.)
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
row() { printf '| %-44s | %-6s | %s |\n' "$1" "$2" "$3" >> "$out/table.md"; }
: > "$out/table.md"
nvidia-smi -L > "$out/gpu.txt" 2>&1
card=$(head -1 "$out/gpu.txt")
t0=$(date +%s)
if PYTHONPATH=. timeout 300 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "gpu or nvcc or sentence" \
        > "$out/pytest.txt" 2>&1; then r=pass; else r=FAIL; fi
row "CUDA tests on the card (pytest)" "$r" "$(tail -1 "$out/pytest.txt") ($(( $(date +%s) - t0 )) s)"
for prog in no_products row_kernels mlp_step; do
    PYTHONPATH=.:tests $PY - "$prog" "$out" <<'PYEOF' > "$out/build-$prog.txt" 2>&1
import sys, numpy as np
import test_cuda as t
name, out = sys.argv[1], sys.argv[2]
program = getattr(t, name)()
exe = program.lower("cuda").build()
open(f"{out}/{name}.lib", "w").write(exe.library)
PYEOF
done
if command -v compute-sanitizer > /dev/null; then
    for tool in memcheck racecheck; do
        PYTHONPATH=.:tests timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 $PY - <<'PYEOF' \
            > "$out/sanitizer-$tool.txt" 2>&1 && r=pass || r=FAIL
import numpy as np
import test_cuda as t
for make, args in ((t.no_products, lambda: t.data(((33, 40), (33, 57)), seed=1)), (t.row_kernels, t.row_data),
                   (t.mlp_step, lambda: t.data(t.SHAPES))):
    make().lower("cuda").build()(*args(), seed=3)
PYEOF
        row "compute-sanitizer $tool (3 programs)" "$r" "$(grep -m1 'ERROR SUMMARY' "$out/sanitizer-$tool.txt")"
    done
else
    row "compute-sanitizer" "skip" "not installed"
fi
echo
echo "GPU check on: $card   (commit $(git rev-parse --short HEAD 2>/dev/null))"
echo "| check                                        | result | detail |"
echo "|---|---|---|"
cat "$out/table.md"
