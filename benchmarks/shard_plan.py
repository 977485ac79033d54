"""Compile-time memory per rank of the speedrun's train program, one process against rank 0 of N
with and without the sharded Muon (nothing runs: the programs are lowered and planned).

    python benchmarks/shard_plan.py [--world=2] [--vocab=256] [speedrun_tiny overrides ...]
"""
import sys

from mica.train import config as config_mod
from mica.train import memory_plan, programs
from mica.train.native import _lower_all


def plan(cfg, vocab, world, rank):
    model, opt, progs = programs.build(cfg, vocab, world, rank)
    lowered = _lower_all(progs, None, "cpu", opt_level=cfg["opt_level"])
    return model, opt, memory_plan.trainer_plan(lowered)["train"]


def main(argv):
    world, vocab = 2, 256
    rest = []
    for a in argv:
        if a.startswith("--world="):
            world = int(a.split("=", 1)[1])
        elif a.startswith("--vocab="):
            vocab = int(a.split("=", 1)[1])
        else:
            rest.append(a)
    cfg = config_mod.check_speedrun(config_mod.load("speedrun_tiny", rest))
    rows = []
    for label, w, shard in (("one process", 1, False), (f"rank 0 of {world}, shard_muon=False", world, False),
                            (f"rank 0 of {world}, shard_muon=True", world, True)):
        model, opt, classes = plan({**cfg, "shard_muon": shard}, vocab, w, 0)
        note = programs.muon_sharding_report({**cfg, "shard_muon": shard}, model, opt, w) if w > 1 else ""
        rows.append((label, classes, note))
    keys = list(rows[0][1])
    print("| | " + " | ".join(r[0] for r in rows) + " |")
    print("|---" * (len(rows) + 1) + "|")
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{r[1][k]:,}" for r in rows) + " |")
    print("| the arena | " + " | ".join(f"{sum(r[1].values()):,}" for r in rows) + " |")
    for r in rows[1:]:
        print(f"{r[0]}: {r[2]}")


if __name__ == "__main__":
    main(sys.argv[1:])
