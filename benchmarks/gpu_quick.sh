#!/usr/bin/env bash
# A short lease's run (about 3 minutes on an H200; the device tool's run with carry [".gpu-carry"]):
#   1. mica bench --device=cuda on shakespeare_char, float32 with TF32 permitted on both sides,
#      PyTorch's reduce-overhead, one round (the issue's headline comparison, briefly);
#   2. benchmarks/gpu_profile.sh: the CUDA step kernel by kernel (MICA_PROFILE), TF32 off then on;
#   3. the CUDA tests that need the card (Mica's kernels give the CPU target's bits there, attention
#      through every path against the oracle, the fused kernels against the simulator, the TF32
#      tensor-core kernels against the simulator's wmma to rounding);
#      compute-sanitizer's racecheck and memcheck on the tensor-core kernels;
#   4. benchmarks/gpu_attention_ab.py: attention alone, the TF32 tensor-core kernels against
#      cuBLASLt's products with the CPU's rows, at shakespeare_char's and GPT-2's shapes.
# Prints the steps' exits, the bench table and the profiles' summaries last. The full check
# (compute-sanitizer, method B, PyTorch's other modes) is benchmarks/gpu_check.sh.
set -u
cd "$(dirname "$0")/.."
if [ -d .gpu-carry/debs ]; then for f in .gpu-carry/debs/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
export PYTHONPATH=".:$PWD/.gpu-carry/site"
work=/tmp/w; mkdir -p $work
# 1. the headline: mica bench, TF32 permitted on both sides, PyTorch's reduce-overhead (one round)
timeout 130 python3 -m mica.cli prepare shakespeare-char --input tests/data/tinyshakespeare.txt --out $work/data > /dev/null 2>&1
t0=$(date +%s); timeout 130 python3 -m mica.cli bench --device=cuda --tf32 --dtype float32 --model shakespeare_char --data_dir $work/data \
  --modes reduce-overhead --rounds 1 --warmup 20 --window 60 --every 10 --out $work/bench > $OUT/bench.txt 2>&1
echo "bench: exit $? ($(( $(date +%s) - t0 )) s)" > $OUT/steps.txt
cp $work/bench/bench-shakespeare_char.json $OUT/ 2>/dev/null
# 2. the profile, float32 then TF32
t0=$(date +%s); TORCH=0 WORK=$work/prof timeout 110 bash benchmarks/gpu_profile.sh > $work/profile.log 2>&1
echo "profile: exit $? ($(( $(date +%s) - t0 )) s)" >> $OUT/steps.txt
# 3. the new kernels' bits on the card (CPU target = simulator), attention both ways
t0=$(date +%s); timeout 160 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "on_the_gpu" > $OUT/pytest.txt 2>&1
echo "pytest: exit $? ($(( $(date +%s) - t0 )) s) $(tail -1 $OUT/pytest.txt)" >> $OUT/steps.txt
# 3b. the tensor-core kernels under compute-sanitizer (their shared tiles: racecheck; memcheck)
t0=$(date +%s); for tool in racecheck memcheck; do
  PYTHONPATH=$PYTHONPATH:tests timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 python3 -c "
import test_cuda as t
program, shapes = t.attention_cases(t.TF32_CASES)
program.lower('cuda', tf32=True).build()([tuple(t.data(case, seed=2)) for case in shapes], seed=4)" \
    > $work/sanitizer-$tool.txt 2>&1
  echo "compute-sanitizer $tool (TF32 attention): exit $? $(grep -m1 'ERROR SUMMARY' $work/sanitizer-$tool.txt)" >> $OUT/steps.txt
done
# 4. attention alone: the tensor-core kernels against the products path, side by side
t0=$(date +%s); for shape in shakespeare_char gpt2; do
  timeout 75 python3 benchmarks/gpu_attention_ab.py --shape $shape --paths tf32,products --rounds 5 --runs 10 2>&1 | tail -5
done > $OUT/attention_ab.txt 2>&1
echo "attention A/B: exit $? ($(( $(date +%s) - t0 )) s)" >> $OUT/steps.txt
cat $OUT/steps.txt; grep -B2 -A12 "^| config\|ratio" $OUT/bench.txt | tail -20; cat $OUT/attention_ab.txt
grep -A7 "^## TF32" $OUT/summary.txt; grep -A22 "host calls by part" $OUT/summary.txt | head -48
