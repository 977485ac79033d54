"""Compile-time memory plan of the CUDA trainer's programs (nothing is built or run: the programs are
lowered for the CUDA target and planned), for the models of BENCHMARKS.md section 10.

    python benchmarks/cuda_plan.py [shakespeare_char|gpt2 ...]

Prints, per model, the train and eval arenas by class and the largest workspace a kernel asks for
(attention's, on CUDA), with the vocabulary nanoGPT uses for the model (65 characters, or GPT-2's
50,304).
"""
import sys

from mica.bench.protocol import MODELS
from mica.train import config as config_mod
from mica.train import memory_plan, programs
from mica.train.native import _lower_all

SHAPES = {"shakespeare_char": (dict(batch_size=64, block_size=256), 65),
          "gpt2": (dict(batch_size=12, block_size=1024), 50304)}


def plan(model):
    overrides, vocab = SHAPES[model]
    settings = {**MODELS[model], **overrides, "device": "cuda", "dtype": "float32", "compile": False}
    cfg = config_mod.load(None, [f"--{k}={v}" for k, v in settings.items()], log=lambda *_: None)
    _, _, progs = programs.build(cfg, vocab)
    lowered = _lower_all(progs, None, "cuda")
    return memory_plan.trainer_plan(lowered), lowered


def main(argv):
    for model in argv or list(SHAPES):
        classes, lowered = plan(model)
        total = sum(sum(c.values()) for c in classes.values())
        print(f"{model} ({', '.join(f'{k}={v}' for k, v in SHAPES[model][0].items())}), CUDA, float32: "
              f"{total:,} bytes in both arenas")
        for name, c in classes.items():
            print(f"  {name}: {sum(c.values()):,} bytes; " + ", ".join(f"{k} {v:,}" for k, v in c.items()))
        for name in ("train", "eval"):
            t = lowered[name].target
            biggest = max((t.workspace(k) for k in lowered[name].schedule.kernels), key=lambda w: w[0] + w[1])
            print(f"  {name}: the largest kernel workspace {sum(biggest):,} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
