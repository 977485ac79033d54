#!/usr/bin/env bash
# Where the CUDA step's time goes, on a lent GPU machine (the device tool), from the repository root.
# Under 4 minutes. What it writes under $OUT:
#   profile-tf32-{False,True}.txt  `mica train --device=cuda` of shakespeare_char, float32, 30
#                   iterations, TF32 off then permitted, with MICA_PROFILE set: the trainer times each
#                   program's third run kernel by kernel (outside its graph; mica_cuda.h);
#   summary.txt     each profile by kind, by op, by a host call's parts and the longest kernels
#                   (benchmarks/gpu_profile.py, with the train program's source), printed last;
#   steps.txt       each step's exit and time, and the trainer's own step time at iteration 30.
# Under $WORK: the trainers' logs, the sources, and (TORCH=0 skips it) torch.txt, PyTorch eager's
# same step (float32, TF32 off) under torch.profiler: CUDA time by kernel.
# Offline, as gpu_check.sh: mica runs from this tree; nvcc links the cuBLAS of the PyTorch there.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
out=${OUT:-/tmp/gpu-profile}
work=${WORK:-/tmp/gpu-profile-work}
mkdir -p "$out" "$work"
export MICA_CACHE="$work/cache"
args=(shakespeare_char --device=cuda --dtype=float32 --dropout=0.0 --eval_interval=100000 --eval_iters=3
      --log_interval=10 --always_save_checkpoint=False --data_dir="$work/data")
# (only the profiles, their summary and steps.txt stay in $OUT: the device tool brings back 8 files at most)
nvidia-smi -L > "$work/gpu.txt" 2>&1
worst=0  # (the script's exit: its worst trainer's, so a caller's step says when one failed)
timeout 20 $PY -m mica.cli prepare shakespeare-char --input tests/data/tinyshakespeare.txt --out "$work/data" \
    > "$work/prepare.txt" 2>&1
for tf32 in False True; do  # float32 products, then with TF32 permitted
    t0=$(date +%s)
    rm -f "$out/profile-tf32-$tf32.txt"
    MICA_PROFILE="$out/profile-tf32-$tf32.txt" timeout "${TRAIN_TIMEOUT:-150}" $PY -m mica.cli train "${args[@]}" \
        --tf32=$tf32 --max_iters=30 --out_dir="$work/run-$tf32" > "$work/train-tf32-$tf32.txt" 2>&1
    rc=$?; [ $rc -gt $worst ] && worst=$rc
    echo "train --tf32=$tf32: exit $rc ($(( $(date +%s) - t0 )) s); $(grep '^iter 30' "$work/train-tf32-$tf32.txt" ||
        tail -1 "$work/train-tf32-$tf32.txt")" >> "$out/steps.txt"
    cp "$(ls -td "$MICA_CACHE"/trainer-cuda-*/ | head -1)/train.cu" "$work/train-tf32-$tf32.cu" 2>/dev/null
done
t0=$(date +%s)
if [ "${TORCH:-1}" != 1 ]; then
    echo "torch profile: skipped (TORCH=0)" >> "$out/steps.txt"
else
timeout 120 $PY - "$work/data" 0 > "$work/torch.txt" 2>&1 <<'PYEOF'
import sys, numpy as np, torch
from mica.train import config as config_mod
from mica.train.programs import model_config
from mica.bench.torch_gpt import TorchGPT
data, tf32 = sys.argv[1], sys.argv[2] == "1"
torch.backends.cuda.matmul.allow_tf32 = tf32
torch.set_float32_matmul_precision("high" if tf32 else "highest")
cfg = {**config_mod.DEFAULTS, **config_mod.BUILTIN_CONFIGS["shakespeare_char"], "dropout": 0.0}
torch.manual_seed(0)
model = TorchGPT(model_config(cfg, 65)).cuda()
opt = model.nanogpt_optimizer(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]))
B, T = cfg["batch_size"], cfg["block_size"]
x = torch.randint(0, 65, (B, T), device="cuda")
y = torch.randint(0, 65, (B, T), device="cuda")
def step():
    _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
for _ in range(10):
    step()
torch.cuda.synchronize()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        step()
    torch.cuda.synchronize()
print("PyTorch eager, 5 steps, CUDA time by kernel:")
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90))
PYEOF
echo "torch profile: exit $? ($(( $(date +%s) - t0 )) s)" >> "$out/steps.txt"
fi
for tf32 in False True; do
    echo "## TF32 $tf32" >> "$out/summary.txt"
    $PY benchmarks/gpu_profile.py "$out/profile-tf32-$tf32.txt" "$work/train-tf32-$tf32.cu" train 25 >> "$out/summary.txt" 2>&1
done
cat "$out/steps.txt" "$out/summary.txt"
exit $worst
