"""What the native trainer will hold, from the compiled programs' exact memory plans, printed by
`mica train` before the first step.

A training run allocates two arenas (the native runtime, mica/runtime): the train program's (parameters,
gradients, optimizer state, the step's activations, its io and workspace) and the eval
program's (its own copy of the parameters among its inputs, one batch's activations). Both are
zeroed when allocated, so every byte of them is resident from the start. The logits arena is
allocated only when sampling. The trainer's measured peak RSS is these arenas plus the program,
its shared libraries and the pages of the token files it has read.
"""
from ..passes.memory import CLASSES

ARENAS = ("train", "eval")  # what a training run allocates; "logits" only for mica sample
ORDER = ("parameters", "gradients", "optimizer state", "activations", "io", "workspace")
assert sorted(ORDER) == sorted(CLASSES)

NOTES = {
    "train": {"io": "the batch, the step number, the loss and the learning rate",
              "workspace": "shared scratch for products and rows"},
    "eval": {"io": "its own copy of the parameters, the batch and the loss",
             "workspace": "shared scratch for products and rows"},
}


def trainer_plan(lowered):
    """{arena: {class: bytes}} for the arenas a training run allocates, from each Lowered's plan."""
    return {name: {c: lowered[name].plan.class_bytes[c] for c in ORDER} for name in ARENAS}


def _mib(n):
    return f"{n / 2 ** 20:,.1f} MiB"


def report(lowered):
    """The text `mica train` prints: every class of both arenas, each arena's size and the total."""
    plan = trainer_plan(lowered)
    total = sum(sum(classes.values()) for classes in plan.values())
    gpu = lowered["train"].target.name == "cuda"
    where = " of GPU memory" if gpu else ""
    lines = [f"memory plan (exact, before the first step): the trainer holds {total:,} bytes ({_mib(total)}){where} "
             f"in {len(plan)} arenas"]
    for name, classes in plan.items():
        size = sum(classes.values())
        assert size == lowered[name].plan.total
        lines.append(f"  {name + ' arena':<18} {size:>16,} bytes ({_mib(size)})")
        for c in ORDER:
            if classes[c] or name == "train":
                note = NOTES[name].get(c, "the peak of the live values" if c == "activations" else "")
                lines.append(f"    {c:<16} {classes[c]:>16,}   {note}".rstrip())
    if gpu:
        lines.append("  (the logits arena is allocated only by mica sample; the GPU also holds cuBLASLt's 32 MiB "
                     "workspace per program and the CUDA context)")
    else:
        lines.append("  (the logits arena is allocated only by mica sample; the measured RSS adds the program, its "
                     "libraries and the token files' pages)")
    return "\n".join(lines)
