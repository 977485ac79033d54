#!/usr/bin/env bash
# GPT-2 small and medium on a card through `mica train --device=cuda` (the issue's "GPT-2 small and
# medium train"), at nanoGPT's own config/train_gpt2.py batch: 12 sequences of 1024 tokens a
# micro-batch, 40 micro-batches a step (GPT_ACCUM to change it), float32 with TF32 permitted, on
# random GPT-2 token ids (the work of a step does not depend on which tokens they are). For each:
# the build (lowering, nvcc), the memory plan against the card's peak use (nvidia-smi, sampled),
# and a few steps' losses and times from the trainer's own log. At most 150 s for small and 225 s
# for medium (GPT_TIMEOUT=N: N and 1.5 N), so it fits one device run; it needs no carry.
# --memory_budget=auto (nine tenths of the card's free memory): on an H200 nothing is recomputed;
# on an 80 GB H100 medium's plan (about 85,500 MiB at this batch) is made to fit by recomputing.
# One table last, also written row by row to $OUT/table.md (a run cut short keeps its rows).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="."
work=/tmp/gpt2w; mkdir -p $work/data
OUT=${OUT:-$work/out}; mkdir -p $OUT
ITERS=${GPT_ITERS:-3}; ACCUM=${GPT_ACCUM:-40}
python3 - $work/data <<'EOF'
import sys, numpy as np
rng = np.random.default_rng(0)
for split, n in (("train", 4_000_000), ("val", 400_000)):
    rng.integers(0, 50257, n).astype(np.uint16).tofile(f"{sys.argv[1]}/{split}.bin")
EOF
rows=()
echo "| GPT-2 | tokens a step | exit | wall s | plan | card's peak (nvidia-smi) | iter:loss@ms |" > $OUT/table.md
for model in small medium; do
  shape="--n_layer=12 --n_head=12 --n_embd=768"
  limit=${GPT_TIMEOUT:-150}
  [ $model = medium ] && shape="--n_layer=24 --n_head=16 --n_embd=1024" && limit=$(( limit * 3 / 2 ))
  log=$OUT/gpt2-$model.log; smi=$work/smi-$model.csv
  : > $smi
  ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >> $smi 2>/dev/null; sleep 0.5; done ) &
  sampler=$!
  t0=$(date +%s)
  timeout $limit python3 -m mica.cli train --device=cuda --tf32=True --dtype=float32 --compile=False \
    --data_dir=$work/data --out_dir=$work/out-$model $shape --block_size=1024 --batch_size=12 \
    --gradient_accumulation_steps=$ACCUM --dropout=0.0 --bias=False --max_iters=$ITERS --lr_decay_iters=$ITERS \
    --warmup_iters=1 --eval_interval=100000 --eval_iters=1 --log_interval=1 --always_save_checkpoint=False --memory_budget=auto > $log 2>&1
  rc=$?
  kill $sampler 2>/dev/null
  wall=$(( $(date +%s) - t0 ))
  plan=$(grep -o "holds [0-9,]* bytes ([0-9,.]* MiB)" $log | head -1 | grep -o "([0-9,.]* MiB)")
  peak=$(sort -n $smi 2>/dev/null | tail -1)
  steps=$(grep -o "^iter [0-9]*: loss [0-9.]*, time [0-9.]*ms" $log | sed 's/, time /@/; s/^iter //; s/: loss /:/' | tr '\n' ' ')
  rows+=("| $model | $ACCUM x 12 x 1024 | $rc | $wall | $plan | ${peak:-?} MiB | $steps |")
  printf '%s\n' "${rows[-1]}" >> $OUT/table.md
  tail -3 $log
done
echo
echo "| GPT-2 | tokens a step | exit | wall s | plan | card's peak (nvidia-smi) | iter:loss@ms |"
echo "|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
