#!/usr/bin/env bash
# A short lease's run (about 3 minutes on an H200; the device tool's run with carry [".gpu-carry"]
# and timeout_s near 360, so a rerun fits):
#   1. mica bench --device=cuda on shakespeare_char, float32 with TF32 permitted on both sides,
#      PyTorch's reduce-overhead, one round (the issue's headline comparison, briefly);
#   2. benchmarks/gpu_profile.sh: the CUDA step kernel by kernel (MICA_PROFILE), TF32 off then on;
#   3. the CUDA tests that need the card (Mica's kernels give the CPU target's bits there, attention
#      through every path against the oracle, the fused kernels against the simulator, the TF32
#      tensor-core kernels against the simulator's wmma to rounding);
#      compute-sanitizer's racecheck and memcheck on the tensor-core kernels;
#   4. benchmarks/gpu_attention_ab.py: attention alone, the TF32 tensor-core kernels against
#      cuBLASLt's products with the CPU's rows, at shakespeare_char's and GPT-2's shapes.
# Every step runs under a timeout cut to what is left of one budget (DEADLINE_S, default 330 s; a
# step with under 15 s left is skipped, as gpu_check.sh's), and writes its exit to $OUT/steps.txt as
# it ends, so a run cut short still says how far it came. At most 8 files under $OUT (what the
# device tool brings back). Prints the steps' exits, the bench table and the profiles' summaries last.
# The full check (compute-sanitizer on every program, method B, PyTorch's other modes) is gpu_check.sh.
set -u
cd "$(dirname "$0")/.."
if [ -d .gpu-carry/debs ]; then for f in .gpu-carry/debs/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
export PYTHONPATH=".:$PWD/.gpu-carry/site"
export OUT=${OUT:-/tmp/gpu-quick}; work=/tmp/w; mkdir -p "$OUT" $work  # (gpu_profile.sh writes there too)
start=$(date +%s); deadline=$(( start + ${DEADLINE_S:-330} ))
within() {  # within N CMD...: CMD under a timeout of N s or what is left of the budget; 125 when under 15 s
    local n=$1 left=$(( deadline - $(date +%s) )); shift
    [ "$left" -lt "$n" ] && n=$left
    [ "$n" -lt 15 ] && return 125
    timeout "$n" "$@"
}
said() { case $1 in 0) echo "exit 0" ;; 124) echo "timed out" ;; 125) echo "skipped (out of time)" ;; *) echo "exit $1" ;; esac; }
step() { echo "$1: $(said $2) ($(( $(date +%s) - $3 )) s)${4:+ $4}" >> "$OUT/steps.txt"; }
: > "$OUT/steps.txt"
echo "card: $(nvidia-smi -L 2>&1 | head -1); commit $(git rev-parse --short HEAD 2>/dev/null)" >> "$OUT/steps.txt"
# 1. the headline: mica bench, TF32 permitted on both sides, PyTorch's reduce-overhead (one round)
t0=$(date +%s); within 60 python3 -m mica.cli prepare shakespeare-char --input tests/data/tinyshakespeare.txt \
  --out $work/data > $work/prepare.txt 2>&1
rc=$?; [ $rc = 0 ] || step prepare $rc $t0 "$(tail -1 $work/prepare.txt)"
t0=$(date +%s); within 130 python3 -m mica.cli bench --device=cuda --tf32 --dtype float32 --model shakespeare_char \
  --data_dir $work/data --modes reduce-overhead --rounds 1 --warmup 20 --window 60 --every 10 --out $work/bench \
  > "$OUT/bench.txt" 2>&1
step bench $? $t0
cp $work/bench/bench-shakespeare_char.json "$OUT/" 2>/dev/null
# 2. the profile, float32 then TF32 (each trainer's own timeout inside the one the step is given)
# (gpu_profile.sh appends its trainers' lines to $OUT/steps.txt itself; its inner timeouts, 20 + 2 x 55,
# stay under the outer one, which would not reach a trainer its own `timeout` runs in another process
# group; with under 150 s left the step is skipped rather than cut short)
t0=$(date +%s)
if [ $(( deadline - $(date +%s) )) -ge 150 ]; then
  TORCH=0 WORK=$work/prof TRAIN_TIMEOUT=55 timeout 150 bash benchmarks/gpu_profile.sh > $work/profile.log 2>&1
else (exit 125); fi
step profile $? $t0
# 3. the new kernels' bits on the card (CPU target = simulator), attention both ways
t0=$(date +%s); within 160 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "on_the_gpu" > "$OUT/pytest.txt" 2>&1
step pytest $? $t0 "$(tail -1 "$OUT/pytest.txt")"
# 3b. the tensor-core kernels under compute-sanitizer (their shared tiles: racecheck; memcheck)
for tool in racecheck memcheck; do
  t0=$(date +%s)
  PYTHONPATH=$PYTHONPATH:tests within 90 compute-sanitizer --tool $tool --error-exitcode 9 python3 -c "
import test_cuda as t
program, shapes = t.attention_cases(t.TF32_CASES)
program.lower('cuda', tf32=True).build()([tuple(t.data(case, seed=2)) for case in shapes], seed=4)" \
    > $work/sanitizer-$tool.txt 2>&1
  step "compute-sanitizer $tool (TF32 attention)" $? $t0 "$(grep -m1 'SUMMARY' $work/sanitizer-$tool.txt)"
done
# 4. attention alone: the tensor-core kernels against the products path, side by side
: > "$OUT/attention_ab.txt"
for shape in shakespeare_char gpt2; do
  t0=$(date +%s)
  within 75 python3 benchmarks/gpu_attention_ab.py --shape $shape --paths tf32,products --rounds 5 --runs 10 \
    > $work/ab-$shape.txt 2>&1
  step "attention A/B $shape" $? $t0
  tail -5 $work/ab-$shape.txt >> "$OUT/attention_ab.txt"
done
echo "total: $(( $(date +%s) - start )) s" >> "$OUT/steps.txt"
cat "$OUT/steps.txt"; grep -B2 -A12 "^| config\|ratio" "$OUT/bench.txt" | tail -20; cat "$OUT/attention_ab.txt"
grep -A7 "^## TF32" "$OUT/summary.txt" 2>/dev/null; grep -A22 "host calls by part" "$OUT/summary.txt" 2>/dev/null | head -48
