"""Which of a CUDA program's generated kernels run together, one launch for several.

A launch costs a few microseconds on a card whatever its size, and a small kernel (a layer norm's
[384] weight's gradient square-sum, its AdamW update) leaves nearly the whole card idle, so an
optimizer step of one kernel per tensor is a chain of waits. Kernels that do not depend on each
other can share a launch: each block runs one of them (render.py writes the group kernels).

`launch_units` walks the schedule in order and puts each generated kernel (a loop, or a reduction
but argmax) into the earliest group it may join: one whose members it does not depend on, and
no kernel between that group and its own place touches its bytes. Dependence is read off the
memory plan — the arena bytes each kernel reads and writes, whole root buffers — so it covers a
value read, a value written over, and bytes the plan reuses for another buffer alike. A reduction
by lanes (render.cooperative) takes a slice of the stream's scratch of its own within its group
(its partials, then the sums), so it may neither cross another kernel that uses the workspace
nor join a group whose slices fill the scratch. Products, kernel primitives and copies stay where
they are, launched alone. The order of what every kernel reads and writes is unchanged, so every
value is what the program computed before, bit for bit.
"""
from ...passes.schedule import Buffer, Call, Copy, Gemm, Loop, Reduce
from .render import reduce_scratch

MAX_MEMBERS = 64  # kernels in one group launch
MAX_POINTERS = 480  # a launch's parameters: 8 bytes each and the arena's, within CUDA's 4 KiB
WINDOW = 64  # launch units a kernel may move back across (the scan is linear, not quadratic)
SLICE = 256  # a member's scratch slice is aligned as the arena's buffers are


def groupable(kern):
    return isinstance(kern, Loop) or (isinstance(kern, Reduce) and kern.op != "argmax")


def _views(kern):
    """(views read, views written) of a kernel; a kernel that is not a generated one is taken to
    write everything it touches."""
    if isinstance(kern, Loop):
        return [e.view for e in kern.exprs if e.kind == "load"], [v for v, _ in kern.stores]
    if isinstance(kern, Reduce):
        return [e.view for e in kern.exprs if e.kind == "load"], [kern.out]
    if isinstance(kern, Gemm):
        views = [kern.a, kern.b, kern.out]
        if kern.epilogue is not None:
            views += [e.view for e in kern.epilogue.exprs if e.kind == "load"] + [v for v, _ in kern.epilogue.stores]
        return [], views
    if isinstance(kern, (Call, Copy)):
        return [], list(kern.inputs) + list(getattr(kern, "outputs", [])) + ([kern.out] if isinstance(kern, Copy) else [])
    raise TypeError(kern)


def _ranges(views, plan):
    out = set()
    for v in views:
        if isinstance(v.src, Buffer):
            root = plan.root(v.src)
            out.add((plan.offset(root), plan.offset(root) + root.nbytes))
    return sorted(out)


def _overlap(xs, ys):
    return any(a < d and c < b for a, b in xs for c, d in ys)


class Unit:
    """One launch (or, with a reduction by lanes among its members, two: the lanes, then the sums)."""

    def __init__(self, k, groupable_, reads, writes, workspace, scratch=0, params=0):
        self.members = [k]
        self.groupable = groupable_
        self.reads, self.writes = list(reads), list(writes)
        self.workspace = workspace  # does a member use the workspace (a slice of the scratch, or more)?
        self.scratch = {k: 0} if scratch else {}  # member -> its slice's offset in the scratch
        self.scratch_end = -(-scratch // SLICE) * SLICE
        self.params = params

    def depends(self, reads, writes):
        return _overlap(writes, self.reads) or _overlap(writes, self.writes) or _overlap(reads, self.writes)

    def fits(self, scratch, params, capacity):
        return (len(self.members) < MAX_MEMBERS and self.params + params <= MAX_POINTERS
                and (not scratch or self.scratch_end + scratch <= capacity))

    def add(self, k, reads, writes, scratch, params):
        self.members.append(k)
        self.reads += reads
        self.writes += writes
        self.params += params
        if scratch:
            self.scratch[k] = self.scratch_end
            self.scratch_end += -(-scratch // SLICE) * SLICE
            self.workspace = True


def launch_units(schedule, plan, target):
    """[Unit] in launch order: every kernel once; a unit of several members is a group launch."""
    units = []
    capacity = plan.per_unit_bytes
    for k, kern in enumerate(schedule.kernels):
        read_views, write_views = _views(kern)
        reads, writes = _ranges(read_views, plan), _ranges(write_views, plan)
        if not groupable(kern):
            units.append(Unit(k, False, reads, writes, target.workspace(kern) != (0, 0)))
            continue
        scratch = reduce_scratch(kern)
        # (the pointers its function takes: one per root buffer it touches)
        params = len({plan.root(v.src).id for v in read_views + write_views if isinstance(v.src, Buffer)})
        best = None
        for u in reversed(units[-WINDOW:]):
            if u.depends(reads, writes):
                break
            if u.groupable and u.fits(scratch, params, capacity):
                best = u
            if scratch and u.workspace:  # (its slice is not placed yet: it cannot pass another user of the scratch)
                break
        if best is not None:
            best.add(k, reads, writes, scratch, params)
        else:
            units.append(Unit(k, True, reads, writes, bool(scratch), scratch, params))
    return units


def single_units(schedule):
    """Every kernel its own launch (the target option group_launches=False)."""
    return [Unit(k, False, [], [], False) for k in range(len(schedule.kernels))]
