"""The pipeline every target shares, one direction, every stage kept for inspection:

    program.lower(target, **options)
      widen      half-type kernels and products in float32      .graph
      simplify   exact rewrites, CSE, DCE                       .graph
      order      costly slopes computed beside their forward    .graph
      fuse       Schedule: loops, reductions, products, calls   .schedule
      memory     MemoryPlan: an offset per buffer, one arena    .plan, .memory_report
      render     the target's source text                       .source
    .build()     the target's compiler: an in-process Executable

A Target (mica/targets.py) answers everything that differs between targets; nothing here names one.
"""
from .passes import fuse, memory, order, simplify, widen
from .targets import get_target


class Lowered:
    """A Program lowered for a target: its graph, schedule, exact memory plan and source."""

    def __init__(self, program, target):
        self.program = program
        self.target = target
        self.opt_level = target.opt_level
        self.graph = simplify.simplify(widen.widen(program.graph, target))
        if target.opt_level > 0:
            order.hoist(self.graph)
        self.schedule = fuse.build(self.graph, target, fuse=target.opt_level > 0)
        self.plan = memory.plan(self.schedule, target)
        self.memory_report = self.plan.report(program.name)
        self.source = target.render(self)

    def build(self, **options):
        """Compile (cached) and load: an Executable to call with numpy arrays."""
        return self.target.build(self, **options)


def lower(program, target, **options):
    """Lower `program` for `target` (a name or a Target); options go to the target."""
    return Lowered(program, get_target(target, **options))
