"""Compile-time memory per rank, one process against the ranks of an N-rank run with and without
ZeRO-1 (BENCHMARKS.md section 9). The train and eval programs are lowered and planned; nothing runs.

    python benchmarks/zero_plan.py CONFIG [--world=2] [--vocab=65] [--ranks=0,1] [--paper] [overrides ...]

CONFIG is a nanoGPT config or built-in (shakespeare_char, ...) or a speedrun one (speedrun_tiny;
its ranks shard Muon as the seed does, shard_muon's default). --paper lowers nothing and prints
what ZeRO-1 leaves each rank from the shapes alone (parameters, AdamW's moments, the bytes each
rank sends per step), for models too large to lower here in reasonable time.
"""
import math
import sys

from mica.train import config as config_mod
from mica.train import memory_plan, programs
from mica.train.native import _lower_all


def plan(cfg, vocab, world, rank):
    _, _, progs = programs.build(cfg, vocab, world, rank)
    lowered = _lower_all(progs, None, "cpu", opt_level=cfg["opt_level"])
    return memory_plan.trainer_plan(lowered)


def paper(cfg, vocab, world):
    from mica.train.programs import _unsharded_optimizer, zero_layout

    model = programs.speedrun_model(cfg, vocab) if cfg["recipe"] == "speedrun" else \
        programs.GPT(programs.model_config(cfg, vocab))
    specs = model.param_specs()
    opt = _unsharded_optimizer(cfg, model)
    layout = zero_layout({**cfg, "zero_stage": 1}, specs, opt, world)
    nbytes = {n: math.prod(s.shape) * s.dtype.itemsize for n, s in specs.items()}
    params = sum(nbytes.values())
    moments = [2 * sum(nbytes[n] for n in names) for names in layout.owned]
    print(f"{len(specs)} tensors, {sum(math.prod(s.shape) for s in specs.values()):,} parameters, {params:,} bytes; "
          f"AdamW's moments in one process {2 * params:,} bytes")
    print("| rank | tensors | AdamW's moments (bytes) | of one process's |")
    print("|---|---|---|---|")
    for r, names in enumerate(layout.owned):
        print(f"| {r} | {len(names)} | {moments[r]:,} | {moments[r] / (2 * params):.1%} |")
    largest = max(specs, key=lambda n: nbytes[n])
    print(f"largest tensor: {largest} ({nbytes[largest]:,} bytes, {nbytes[largest] / params:.1%}); even split: "
          f"{2 * params / world:,.0f} bytes of moments per rank")


def main(argv):
    world, vocab, ranks, on_paper, rest, config = 2, 65, None, False, [], None
    for a in argv:
        if a.startswith("--world="):
            world = int(a.split("=", 1)[1])
        elif a.startswith("--vocab="):
            vocab = int(a.split("=", 1)[1])
        elif a.startswith("--ranks="):
            ranks = [int(r) for r in a.split("=", 1)[1].split(",")]
        elif a == "--paper":
            on_paper = True
        elif not a.startswith("--") and config is None:
            config = a
        else:
            rest.append(a)
    cfg = config_mod.check_supported(config_mod.load(config, rest), lambda *a: None)
    if on_paper:
        return paper(cfg, vocab, world)
    ranks = list(range(world)) if ranks is None else ranks
    columns = [("one process", {**cfg, "zero_stage": 0}, 1, 0)]
    columns += [(f"rank {r} of {world}", {**cfg, "zero_stage": 0}, world, r) for r in ranks]
    columns += [(f"rank {r} of {world}, ZeRO-1", {**cfg, "zero_stage": 1}, world, r) for r in ranks]
    plans = [(label, plan(c, vocab, w, r)) for label, c, w, r in columns]
    print("| bytes | " + " | ".join(label for label, _ in plans) + " |")
    print("|---" * (len(plans) + 1) + "|")
    for k in memory_plan.ORDER:
        print(f"| {k} | " + " | ".join(f"{p['train'][k]:,}" for _, p in plans) + " |")
    print("| the train arena | " + " | ".join(f"{sum(p['train'].values()):,}" for _, p in plans) + " |")
    print("| the trainer (train + eval arenas) | " +
          " | ".join(f"{sum(sum(a.values()) for a in p.values()):,}" for _, p in plans) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
