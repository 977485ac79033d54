"""Memory planning: liveness over the schedule, in-place updates, offsets in one arena per class.

Classes, in arena order: parameters, optimizer state, gradients, activations, io (data inputs,
the random key, results), workspace (scratch shared by kernels, one region reused by all).
Parameters, optimizer state and io live for the whole program; gradients and activations are
placed by their lifetimes, so buffers whose lifetimes do not overlap share bytes. A new value of
a state input (the optimizer's update of a parameter) is written over the old one when nothing
reads the old one afterwards, and an elementwise loop may write its result over an input that
dies in that loop. The report is exact and exists before anything runs.
"""
from .schedule import Buffer, Gemm, Loop

CLASSES = ("parameters", "optimizer state", "gradients", "activations", "io", "workspace")
ALIGN = 64


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


class MemoryPlan:
    def __init__(self, schedule, class_bytes, class_offsets, naive_bytes, per_thread_bytes, max_threads,
                 inplace):
        self.schedule = schedule
        self.class_bytes = class_bytes        # bytes of each class region
        self.class_offsets = class_offsets    # start of each class region in the arena
        self.naive_bytes = naive_bytes        # every buffer its own region
        self.per_thread_bytes = per_thread_bytes
        self.max_threads = max_threads
        self.inplace = inplace                # number of buffers written over another

    @property
    def total(self):
        return sum(self.class_bytes.values())

    @property
    def workspace_offset(self):
        return self.class_offsets["workspace"]

    def report(self, name="program"):
        lines = [f"memory plan for {name}: one arena of {self.total:,} bytes (exact, before any run)"]
        counts = {c: 0 for c in CLASSES}
        for b in self.schedule.buffers:
            if b.alias is None:
                counts[b.cls] += 1
        for c in CLASSES:
            note = f"{counts[c]} buffers" if c != "workspace" else \
                f"shared scratch; {self.per_thread_bytes:,} bytes per thread x {self.max_threads} threads"
            if c == "activations":
                note += " (the activation peak)"
            lines.append(f"  {c:<16} {self.class_bytes[c]:>14,}   {note}")
        saved = self.naive_bytes - self.total
        pct = 100.0 * saved / self.naive_bytes if self.naive_bytes else 0.0
        lines.append(f"  every value in its own buffer would take {self.naive_bytes:,} bytes; the plan saves "
                     f"{saved:,} ({pct:.1f}%), {self.inplace} values written in place")
        return "\n".join(lines)


def _lifetimes(schedule):
    """first and last kernel index of every buffer (persistent ones span the program)."""
    first, last = {}, {}
    end = len(schedule.kernels)
    for k, kern in enumerate(schedule.kernels):
        for v in kern.reads():
            if isinstance(v.src, Buffer):
                last[v.src.id] = k
                first.setdefault(v.src.id, k)
        for b in kern.writes():
            first.setdefault(b.id, k)
            last[b.id] = max(last.get(b.id, k), k)
    for b in schedule.buffers:
        if b.persistent:
            first[b.id], last[b.id] = -1, end
        first.setdefault(b.id, -1)
        last.setdefault(b.id, first[b.id])
    return first, last


def _identity_reads(loop, buf):
    """True when every read of `buf` in `loop` is at the loop's own (row-major) index."""
    views = [e.view for e in loop.exprs if e.kind == "load" and e.view.src is buf]
    return all(v.is_whole() and v.shape == loop.shape for v in views)


def _elementwise_part(kern):
    """(loop, buffers it must not overwrite): a Loop kernel, or a product's epilogue — which must
    not overwrite the product's operands, that other tiles still read."""
    if isinstance(kern, Loop):
        return kern, set()
    if isinstance(kern, Gemm) and kern.epilogue is not None:
        return kern.epilogue, {v.src.root().id for v in (kern.a, kern.b) if isinstance(v.src, Buffer)}
    return None, set()


def _plan_inplace(schedule, first, last):  # noqa: C901
    count = 0
    kernels = schedule.kernels
    written_at = {}
    for k, kern in enumerate(kernels):
        for b in kern.writes():
            written_at.setdefault(b.id, k)
    # 1. state updates: the new value takes the old one's place
    for new, old in getattr(schedule, "updates", []):
        k = written_at.get(new.id, -1)
        old_reads_after = any(v.src is old for kern in kernels[k + 1:] for v in kern.reads())
        if old_reads_after or new.nbytes != old.nbytes or new.alias is not None:
            continue
        kern = kernels[k] if k >= 0 else None
        loop, operands = _elementwise_part(kern)
        if loop is None or not _identity_reads(loop, old) or old.root().id in operands:
            if any(v.src is old for v in (kern.reads() if kern else [])):
                continue
        if any(b.alias is old for b in schedule.buffers):
            continue
        new.alias = old
        count += 1
    # 2. an elementwise loop writes over an activation that dies in it
    for k, kern in enumerate(kernels):
        loop, operands = _elementwise_part(kern)
        if loop is None:
            continue
        taken = set(operands)
        for view, _ in loop.stores:
            out = view.src
            if out.alias is not None or out.persistent or out.cls not in ("activations", "gradients"):
                continue
            for e in loop.exprs:
                if e.kind != "load" or not isinstance(e.view.src, Buffer):
                    continue
                dying, src = e.view.src, e.view.src.root()
                if (src.id in taken or src.persistent or src.cls != out.cls or src.nbytes != out.nbytes
                        or last[dying.id] != k or not _identity_reads(loop, dying)):
                    continue
                out.alias = src
                taken.add(src.id)
                count += 1
                break
    return count


def _place(buffers, first, last):
    """First-fit offsets for buffers with lifetimes; returns (offsets by id, region size)."""
    placed, offsets, size = [], {}, 0
    for b in sorted(buffers, key=lambda b: (-b.nbytes, b.id)):
        lo, hi = first[b.id], last[b.id]
        clashes = sorted((offsets[p.id], offsets[p.id] + _align(p.nbytes)) for p in placed
                         if not (last[p.id] < lo or first[p.id] > hi))
        off = 0
        for start, stop in clashes:
            if off + _align(b.nbytes) <= start:
                break
            off = max(off, stop)
        offsets[b.id] = off
        size = max(size, off + _align(b.nbytes))
        placed.append(b)
    return offsets, size


def plan(schedule, scratch, max_threads):
    """Place every buffer. `scratch(kernel)` gives the (shared, per-thread) workspace bytes a
    backend's kernel needs; the workspace holds the largest shared need and one per-thread slot
    of the largest per-thread need for each of `max_threads` threads."""
    first, last = _lifetimes(schedule)
    inplace = _plan_inplace(schedule, first, last)
    # an alias extends its root's lifetime
    for b in schedule.buffers:
        if b.alias is not None:
            r = b.root()
            first[r.id] = min(first[r.id], first[b.id])
            last[r.id] = max(last[r.id], last[b.id])
    roots = [b for b in schedule.buffers if b.alias is None]
    class_bytes, local = {}, {}
    for c in CLASSES[:-1]:
        members = [b for b in roots if b.cls == c]
        if c in ("gradients", "activations"):
            offs, size = _place([b for b in members if not b.persistent], first, last)
            rest = [b for b in members if b.persistent]
            for b in rest:
                offs[b.id] = size
                size += _align(b.nbytes)
        else:
            offs, size = {}, 0
            for b in members:
                offs[b.id] = size
                size += _align(b.nbytes)
        local.update(offs)
        class_bytes[c] = size
    needs = [scratch(k) for k in schedule.kernels]
    shared = max([_align(n[0]) for n in needs] + [0])
    per_thread_bytes = max([_align(n[1]) for n in needs] + [0])
    class_bytes["workspace"] = _align(shared + per_thread_bytes * max_threads)
    class_offsets, at = {}, 0
    for c in CLASSES:
        class_offsets[c] = at
        at += class_bytes[c]
    for b in roots:
        b.offset = class_offsets[b.cls] + local[b.id]
    for b in schedule.buffers:
        if b.alias is not None:
            b.offset = b.root().offset
    naive = sum(_align(b.nbytes) for b in schedule.buffers) + class_bytes["workspace"]
    mp = MemoryPlan(schedule, class_bytes, class_offsets, naive, per_thread_bytes, max_threads, inplace)
    mp.shared_bytes = shared
    return mp
