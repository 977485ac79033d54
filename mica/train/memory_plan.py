"""What the native trainer will hold, from the compiled programs' exact memory plans, printed by
`mica train` before the first step.

A training run holds two arenas (the native runtime, mica/runtime): the train program's (parameters,
gradients, optimizer state, the step's activations, its io and workspace) and the eval
program's (its own copy of the parameters among its inputs, one batch's activations). Evaluation
runs only between optimizer steps, when every train value but the state (the parameters and the
optimizer state, updated in place, at the front of the train arena) is dead: so the eval arena is
placed inside the train arena, right after the state, and the trainer makes one allocation of
max(train, state + eval) bytes (`eval_offset`, recorded in the manifest). MICA_SEPARATE_ARENAS=1
keeps the two apart (the sum), to compare against. The allocation is zeroed, so every byte of it is
resident from the start. The logits arena is allocated only when sampling. The trainer's measured
peak RSS is this allocation plus the program, its shared libraries and the pages of the token
files it has read.
"""
import os
import re

from ..errors import MicaError
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


UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
         "k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30, "t": 2 ** 40,
         "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}
SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e(\d{1,2}))?\s*([a-z]*)\s*$")
AUTO_RESERVE = 0.9  # `auto` leaves a tenth of the free memory for the program, its libraries and the data


def parse_budget(value, device="cpu"):
    """The setting memory_budget as bytes: None (no budget), a positive int, a size with a unit
    ("2.5GB", "800MiB", "3G") or "auto" (nine tenths of the memory now free: RAM on the CPU, the
    GPU's on cuda)."""
    if value is None or value == "" or (isinstance(value, str) and value.strip().lower() == "none"):
        return None  # ("none" as mica bench --memory_budgets writes it)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise MicaError(f"memory_budget must be a number of bytes, a size such as 2GB, or auto; got {value!r}")
    if isinstance(value, str) and value.strip().lower() == "auto":
        return int(free_memory(device) * AUTO_RESERVE)
    given, unit = value, ""
    if isinstance(value, str):
        m = SIZE.match(value.lower())
        if not m or m.group(3) not in UNITS:
            raise MicaError(f"memory_budget must be a number of bytes, a size such as 2GB, or auto; got {value!r}")
        unit = m.group(3)
        value = float(m.group(1)) * 10 ** int(m.group(2) or 0) * UNITS[unit]
    if value != value or not 1 <= value <= 2 ** 62:
        raise MicaError(f"memory_budget must be from 1 byte to 2**62 bytes, got {given!r}")
    if not UNITS.get(unit, 1) > 1 and value != int(value):  # (a size in KB, GiB... may end in a fraction of a byte)
        raise MicaError(f"memory_budget must be a whole number of bytes (or a size such as 2GB), got {given!r}")
    return int(value)


def free_memory(device="cpu"):
    """Bytes free now: the kernel's MemAvailable on the CPU, nvidia-smi's memory.free on cuda."""
    if str(device).startswith("cuda"):
        import subprocess

        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", "0"],
                                 capture_output=True, text=True, timeout=30).stdout
            return int(out.split()[0]) * 2 ** 20
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            raise MicaError("memory_budget=auto could not read the GPU's free memory from nvidia-smi; give the "
                            "budget in bytes") from None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    raise MicaError("memory_budget=auto could not read the free memory (/proc/meminfo); give the budget in bytes")


STATE = ("params[", "opt_state[")
OVERLAP_ALIGN = 4096  # the eval arena starts on a page (and on every target's alignment)


def separate_arenas():
    """Whether MICA_SEPARATE_ARENAS=1 asks for the two arenas apart (to compare against)."""
    return os.environ.get("MICA_SEPARATE_ARENAS", "") not in ("", "0")


def state_bytes(program, align):
    """Bytes at the front of the train arena that hold the state (parameters, then optimizer
    state), from the program's inputs alone: the same for every plan of the program."""
    def up(n):
        return (n + align - 1) // align * align

    specs = [v.spec for name, v in zip(program.input_names, program.graph.inputs) if name.startswith(STATE)]
    return _page(sum(up(spec.nbytes) for spec in specs))


def _page(n):
    return (n + OVERLAP_ALIGN - 1) // OVERLAP_ALIGN * OVERLAP_ALIGN


def eval_offset(train_lowered):
    """Where the eval arena lies in the train arena (None: apart): the first page past every state
    value. Everything from there on is dead between optimizer steps: the train program writes each
    of its other values before it reads it, and its other inputs (the batch, the step number) are
    set before every step."""
    if separate_arenas():
        return None
    plan, sched, names = train_lowered.plan, train_lowered.schedule, train_lowered.program.input_names
    end = 0
    for name, view in zip(names, sched.inputs):
        if name.startswith(STATE):
            root = plan.root(view.src)
            end = max(end, plan.offset(root) + root.nbytes)
    for b in sched.buffers:  # nothing else may lie among the state
        if b.id not in plan.aliases and plan.offset(b) < end and b.nbytes and b.cls not in ("parameters", "optimizer state"):
            raise MicaError(f"internal: {b.name} lies among the train program's state")
    offset = _page(end)
    assert offset == state_bytes(train_lowered.program, train_lowered.target.align), (offset, end)
    return offset


def trainer_bytes(lowered):
    """The bytes a training run allocates for its arenas: max(train, state + eval), or their sum apart."""
    train, ev = lowered["train"].plan.total, lowered["eval"].plan.total
    offset = eval_offset(lowered["train"])
    return train + ev if offset is None else max(train, offset + ev)


def train_budget(budget, eval_lowered, state=0):
    """What the train arena may take when the run must fit in `budget` bytes (None: no budget; 0 or
    less: nothing is left for it). Overlapped, the train arena may take the whole budget (the eval
    arena lies in its dead bytes, after `state`); apart, what the eval arena leaves."""
    if budget is None:
        return None
    return budget - eval_lowered.plan.total if separate_arenas() else budget


def lower_train_within(train, budget, eval_lowered, target, **options):
    """The train program lowered so that the run (max(train, state + eval) bytes, or the sum apart)
    fits in `budget` bytes; where no plan fits, the sentence names the run's smallest total."""
    from ..lower import BudgetError, mode_words

    ev = eval_lowered.plan.total
    state = state_bytes(train, eval_lowered.target.align)
    apart = separate_arenas()

    def smallest(train_bytes):
        return train_bytes + ev if apart else max(train_bytes, state + ev)

    def refuse(need, train_bytes, mode):
        arena = f"the train arena's {train_bytes:,} {mode_words(mode)}"
        how = (f"{arena}, plus the eval arena's {ev:,}" if apart else
               f"{arena}, or the state's {state:,} plus the eval arena's {ev:,}, whichever is more")
        unit = "byte" if budget == 1 else "bytes"
        return MicaError(f"memory_budget={budget:,} {unit} is less than the smallest plan Mica can make for this run "
                         f"({need:,} bytes: {how}); give at least {need:,} bytes, or memory_budget=auto")

    left = train_budget(budget, eval_lowered)
    try:
        lowered = train.lower(target, memory_budget=max(left, 1) if left is not None else None, **options)
    except BudgetError as e:
        raise refuse(smallest(e.smallest), e.smallest, e.mode) from None
    if budget is not None and not apart and state + ev > budget:
        raise refuse(smallest(lowered.plan.total), lowered.plan.total, lowered.remat.mode)
    return lowered


def trainer_plan(lowered):
    """{arena: {class: bytes}} for the arenas a training run allocates, from each Lowered's plan."""
    return {name: {c: lowered[name].plan.class_bytes[c] for c in ORDER} for name in ARENAS}


def _mib(n):
    return f"{n / 2 ** 20:,.1f} MiB"


def report(lowered, rank=None):
    """The text `mica train` prints: every class of both arenas, each arena's size and the total
    (`rank`: of rank `rank` of a data-parallel run, whose plans may differ from rank to rank)."""
    plan = trainer_plan(lowered)
    total, offset = trainer_bytes(lowered), eval_offset(lowered["train"])
    gpu = lowered["train"].target.name == "cuda"
    where = " of GPU memory" if gpu else ""
    who = "" if rank is None else f", on rank {rank} (each rank's plan is its own)"
    how = (f"in {len(plan)} arenas" if offset is None else
           f"in one allocation: the eval arena lies in the train arena's bytes dead between steps, at offset "
           f"{offset:,} (after the parameters and optimizer state)")
    lines = [f"memory plan (exact, before the first step): the trainer holds {total:,} bytes ({_mib(total)}){where} "
             + how + who]
    for name, classes in plan.items():
        size = sum(classes.values())
        assert size == lowered[name].plan.total
        lines.append(f"  {name + ' arena':<18} {size:>16,} bytes ({_mib(size)})")
        for c in ORDER:
            if classes[c] or name == "train":
                note = NOTES[name].get(c, "the peak of the live values" if c == "activations" else "")
                if c == "gradients" and not classes[c] and lowered[name].plan.placed_in:
                    note = "each placed among the activations, by its lifetime"
                lines.append(f"    {c:<16} {classes[c]:>16,}   {note}".rstrip())
    if offset is not None:
        lines.append(f"  one allocation: max(train {lowered['train'].plan.total:,}, state {offset:,} + eval "
                     f"{lowered['eval'].plan.total:,}) = {total:,} bytes (apart they would take "
                     f"{lowered['train'].plan.total + lowered['eval'].plan.total:,})")
    train = lowered["train"]
    lines.append("  train " + train.remat.summary())
    if train.memory_budget is not None:
        lines.append(f"  memory budget: the train arena fits in the {train.memory_budget:,} bytes the budget leaves it")
    if gpu:
        lines.append("  (the logits arena is allocated only by mica sample; the GPU also holds cuBLASLt's 32 MiB "
                     "workspace per program and the CUDA context)")
    else:
        lines.append("  (the logits arena is allocated only by mica sample; the measured RSS adds the program, its "
                     "libraries and the token files' pages)")
    return "\n".join(lines)
