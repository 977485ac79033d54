"""Memory planning: liveness over the schedule, in-place updates, offsets in one arena per class.

Classes, in arena order: parameters, optimizer state, gradients, activations, io (data inputs,
the random key, results), workspace (scratch shared by kernels, one region reused by all).
Parameters, optimizer state and io live for the whole program; activations are placed by their
lifetimes, so buffers whose lifetimes do not overlap share bytes, and so are the gradients, in the
activation region (a parameter's gradient is born in the backward, as the activations die); only
gradients that persist across calls (accumulated) have a region of their own. A product's output
that only its own epilogue reads, where the target's product hands that epilogue its float32 sums
block by block (`product_keeps_sums`), takes no memory at all (`unstored`). A new value of
a state input (the optimizer's update of a parameter) is written over the old one when nothing
reads the old one afterwards, and an elementwise loop may write its result over an input that
dies in that loop. The report is exact and exists before anything runs.

The plan is a value: a byte offset per buffer and the buffers that reuse another's memory. The
Schedule is not changed, so one Schedule can be planned for two targets (the target gives the
alignment and the scratch each kernel needs, per thread or per stream).
"""
import numpy as np

from ..ops import OPS
from .schedule import Buffer, Call, Gemm, Loop

CLASSES = ("parameters", "optimizer state", "gradients", "activations", "io", "workspace")


class MemoryPlan:
    def __init__(self, schedule, offsets, aliases, class_bytes, class_offsets, naive_bytes, shared_bytes,
                 per_unit_bytes, units, unit_name, placed_in=None, unstored=()):
        self.schedule = schedule
        self.unstored = frozenset(unstored)   # ids of products' outputs never stored (their epilogues take the sums)
        self.placed_in = placed_in or {}      # buffer id -> the class region it is placed in, where not its own
        self.offsets = offsets                # buffer id -> byte offset in the arena
        self.aliases = aliases                # buffer id -> the Buffer whose memory it reuses
        self.class_bytes = class_bytes        # bytes of each class region
        self.class_offsets = class_offsets    # start of each class region in the arena
        self.naive_bytes = naive_bytes        # every buffer its own region
        self.shared_bytes = shared_bytes      # workspace shared by every unit
        self.per_unit_bytes = per_unit_bytes  # workspace of each thread (CPU) or stream (GPU)
        self.units = units
        self.unit_name = unit_name

    @property
    def inplace(self):
        """Number of buffers written over another."""
        return len(self.aliases)

    def root(self, buf):
        """The buffer whose memory `buf` occupies (itself unless it was planned in place)."""
        while buf.id in self.aliases:
            buf = self.aliases[buf.id]
        return buf

    def offset(self, buf):
        """Byte offset of `buf` in the arena."""
        return self.offsets[buf.id]

    def view_offset(self, view):
        """Byte offset of a view's first element in the arena."""
        return self.offsets[view.src.id] + view.offset * view.dtype.itemsize

    @property
    def total(self):
        return sum(self.class_bytes.values())

    @property
    def workspace_offset(self):
        return self.class_offsets["workspace"]

    def report(self, name="program"):
        lines = [f"memory plan for {name}: one arena of {self.total:,} bytes (exact, before any run)"]
        counts = {c: 0 for c in CLASSES}
        elsewhere = {c: 0 for c in CLASSES}
        for b in self.schedule.buffers:
            if b.id not in self.aliases and b.id not in self.unstored:
                counts[self.placed_in.get(b.id, b.cls)] += 1
                elsewhere[b.cls] += b.id in self.placed_in
        for c in CLASSES:
            note = f"{counts[c]} buffers" if c != "workspace" else \
                f"shared scratch; {self.per_unit_bytes:,} bytes per {self.unit_name} x {self.units} {self.unit_name}s"
            if c == "activations":
                note += " (the activation peak)"
            if elsewhere[c]:
                note += f"; {elsewhere[c]} more placed among the activations, by lifetime"
            lines.append(f"  {c:<16} {self.class_bytes[c]:>14,}   {note}")
        if self.unstored:
            n = sum(b.nbytes for b in self.schedule.buffers if b.id in self.unstored)
            what = ("1 product's float32 result ({:,} bytes) is never stored: its epilogue takes"
                    if len(self.unstored) == 1 else
                    f"{len(self.unstored)} products' float32 results ({{:,}} bytes) are never stored: their "
                    "epilogues take")
            lines.append("  " + what.format(n) + " the sums block by block")
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


def _elementwise_part(kern, root):
    """(loop, buffers it must not overwrite): a Loop kernel, or a product's epilogue — which must
    not overwrite the product's operands, that other tiles still read."""
    if isinstance(kern, Loop):
        return kern, set()
    if isinstance(kern, Gemm) and kern.epilogue is not None:
        return kern.epilogue, {root(v.src).id for v in (kern.a, kern.b) if isinstance(v.src, Buffer)}
    return None, set()


def _plan_inplace(schedule, first, last):  # noqa: C901
    """{buffer id: the Buffer whose memory it takes}."""
    aliases = {}

    def root(b):
        while b.id in aliases:
            b = aliases[b.id]
        return b

    kernels = schedule.kernels
    written_at = {}
    for k, kern in enumerate(kernels):
        for b in kern.writes():
            written_at.setdefault(b.id, k)
    # 1. state updates: the new value takes the old one's place
    for new, old in getattr(schedule, "updates", []):
        k = written_at.get(new.id, -1)
        old_reads_after = any(v.src is old for kern in kernels[k + 1:] for v in kern.reads())
        if old_reads_after or new.nbytes != old.nbytes or new.id in aliases:
            continue
        kern = kernels[k] if k >= 0 else None
        loop, operands = _elementwise_part(kern, root)
        if loop is None or not _identity_reads(loop, old) or root(old).id in operands:
            if any(v.src is old for v in (kern.reads() if kern else [])):
                continue
        if any(a is old for a in aliases.values()):
            continue
        aliases[new.id] = old
    # 2. an elementwise loop writes over an activation that dies in it
    for k, kern in enumerate(kernels):
        loop, operands = _elementwise_part(kern, root)
        if loop is None:
            continue
        taken = set(operands)
        for view, _ in loop.stores:
            out = view.src
            if out.id in aliases or out.persistent or out.cls not in ("activations", "gradients"):
                continue
            for e in loop.exprs:
                if e.kind != "load" or not isinstance(e.view.src, Buffer):
                    continue
                dying, src = e.view.src, root(e.view.src)
                if src.id in taken or not _may_take(out, dying, src, k, last) or not _identity_reads(loop, dying):
                    continue
                aliases[out.id] = src
                taken.add(src.id)
                break
    # 3. a hand-written kernel's output over an input it reads first (its record's `inplace`)
    for k, kern in enumerate(kernels):
        if not isinstance(kern, Call) or kern.op not in OPS or OPS[kern.op].kernel is None:
            continue
        for o, i in OPS[kern.op].kernel.inplace:
            view, inp = kern.outputs[o], kern.inputs[i]
            out, dying = view.src, inp.src
            if not (isinstance(dying, Buffer) and view.is_whole() and inp.is_whole()):
                continue
            src = root(dying)
            if (out.id in aliases or out.persistent or out.cls not in ("activations", "gradients")
                    or not _may_take(out, dying, src, k, last)
                    or any(v.src is dying for j, v in enumerate(kern.inputs) if j != i)):
                continue
            aliases[out.id] = src
    return aliases


def _unstored(schedule, target, aliases):
    """Ids of the products' outputs that need no memory: the product's own epilogue is their only
    reader, and the target's product hands it the float32 sums block by block instead of storing
    them (the CPU's packed bfloat16 kernels, mica_bf16gemm_stored)."""
    readers = {}
    for k, kern in enumerate(schedule.kernels):
        for v in kern.reads():
            if isinstance(v.src, Buffer):
                readers.setdefault(v.src.id, set()).add(k)
    taken = set(aliases) | {b.id for b in aliases.values()}
    outputs = {v.src.id for v in schedule.outputs}
    found = set()
    for k, kern in enumerate(schedule.kernels):
        if not (isinstance(kern, Gemm) and kern.epilogue is not None and target.product_keeps_sums(kern)):
            continue
        b = kern.out.src
        if (b.persistent or b.id in taken or b.id in outputs or not kern.out.is_whole()
                or readers.get(b.id, set()) - {k} or any(v.src is b for v, _ in kern.epilogue.stores)):
            continue
        found.add(b.id)
    return found


def _may_take(out, dying, src, k, last):
    """May `out` be written over `dying` (which occupies `src`'s memory) in kernel k: `dying` is
    read for the last time there, and its memory is planned, of out's class, size and element type
    (a kernel names a buffer by one typed pointer: int64 indices cast to float64 over themselves
    were stored as integers and read back as float64 denormals)."""
    return (not src.persistent and src.cls == out.cls and src.nbytes == out.nbytes and out.dtype is dying.dtype
            and last[dying.id] == k)


def _place(buffers, first, last, align):
    """First-fit offsets for buffers with lifetimes, largest first; returns (offsets by id, region
    size). Each buffer goes at the lowest offset where it fits between the placed buffers whose
    lifetimes meet its own, taken in order of (start, stop): found over arrays of the placed ones,
    so a step of GPT-2's 40 micro-batches (tens of thousands of buffers) is placed in seconds."""
    order = sorted(buffers, key=lambda b: (-b.nbytes, b.id))
    n = len(order)
    firsts, lasts = np.zeros(n, np.int64), np.zeros(n, np.int64)  # the placed buffers' lifetimes
    starts, stops = np.zeros(n, np.int64), np.zeros(n, np.int64)  # and their places
    offsets, size = {}, 0
    for m, b in enumerate(order):
        lo, hi, need = first[b.id], last[b.id], align(b.nbytes)
        meet = (lasts[:m] >= lo) & (firsts[:m] <= hi)
        st, sp = starts[:m][meet], stops[:m][meet]
        off = 0
        if len(st):
            by = np.lexsort((sp, st))
            st, sp = st[by], sp[by]
            before = np.maximum.accumulate(sp)  # the lowest free offset after each clash, in order
            before = np.concatenate(([0], before[:-1]))
            fits = np.flatnonzero(before + need <= st)
            off = int(before[fits[0]]) if len(fits) else max(int(before[-1]), int(sp[-1]))
        offsets[b.id] = off
        size = max(size, off + need)
        firsts[m], lasts[m], starts[m], stops[m] = lo, hi, off, off + need
    return offsets, size


def plan(schedule, target):
    """Place every buffer. `target.workspace(kernel)` gives the (shared, per-unit) scratch bytes a
    kernel needs; the workspace holds the largest shared need and one slot of the largest
    per-unit need for each of `target.workspace_units` threads or streams."""
    def align(n):
        return (n + target.align - 1) // target.align * target.align

    first, last = _lifetimes(schedule)
    aliases = _plan_inplace(schedule, first, last)

    def root(b):
        while b.id in aliases:
            b = aliases[b.id]
        return b

    # an alias extends its root's lifetime
    for b in schedule.buffers:
        if b.id in aliases:
            r = root(b)
            first[r.id] = min(first[r.id], first[b.id])
            last[r.id] = max(last[r.id], last[b.id])
    unstored = _unstored(schedule, target, aliases)
    roots = [b for b in schedule.buffers if b.id not in aliases and b.id not in unstored]
    class_bytes, local, region = {}, {}, {}
    inputs = {v.src.id for v in schedule.inputs}
    for c in CLASSES[:-1]:
        members = [b for b in roots if b.cls == c]
        if c in ("parameters", "optimizer state"):
            # a new value not written over its old one (no fusion, opt_level=0) is an output the
            # caller copies back: placed among the activations, so that the state the program
            # reads lies in one run at the arena's front (a trainer's eval arena follows it)
            for b in members:
                if b.id not in inputs:
                    region[b.id] = "activations"
            members = [b for b in members if b.id in inputs]
        if c == "gradients":
            # a gradient lives from its product in the backward to the update: placed by lifetime
            # among the activations (whose bytes the backward frees as it goes); only the
            # persistent ones (accumulated across micro-steps) have their own region
            offs, size = {}, 0
            for b in members:
                if b.persistent:
                    offs[b.id] = size
                    size += align(b.nbytes)
                else:
                    region[b.id] = "activations"
        elif c == "activations":
            members += [b for b in roots if region.get(b.id) == "activations"]
            offs, size = _place([b for b in members if not b.persistent], first, last, align)
            rest = [b for b in members if b.persistent]
            for b in rest:
                offs[b.id] = size
                size += align(b.nbytes)
        else:
            offs, size = {}, 0
            for b in members:
                offs[b.id] = size
                size += align(b.nbytes)
        local.update(offs)
        class_bytes[c] = size
    needs = [target.workspace(k) for k in schedule.kernels]
    shared = max([align(n[0]) for n in needs] + [0])
    per_unit = max([align(n[1]) for n in needs] + [0])
    class_bytes["workspace"] = align(shared + per_unit * target.workspace_units)
    class_offsets, at = {}, 0
    for c in CLASSES:
        class_offsets[c] = at
        at += class_bytes[c]
    offsets = {b.id: class_offsets[region.get(b.id, b.cls)] + local[b.id] for b in roots}
    for b in schedule.buffers:
        if b.id in aliases:
            offsets[b.id] = offsets[root(b).id]
        elif b.id in unstored:
            offsets[b.id] = class_offsets["activations"]  # (never read or written there)
    naive = sum(align(b.nbytes) for b in schedule.buffers) + class_bytes["workspace"]
    return MemoryPlan(schedule, offsets, aliases, class_bytes, class_offsets, naive, shared, per_unit,
                      target.workspace_units, target.unit_name, region, unstored)
