"""The pipeline every target shares, one direction, every stage kept for inspection:

    program.lower(target, **options)
      widen      half-type kernels and products in float32      .graph
      simplify   exact rewrites, CSE, DCE                       .graph
      remat      what the backward keeps or recomputes          .graph, .remat
      order      costly slopes beside their forward; weight     .graph
                 gradients as soon as their operands exist
      fuse       Schedule: loops, reductions, products, calls   .schedule
      memory     MemoryPlan: an offset per buffer, one arena    .plan, .memory_report
      render     the target's source text                       .source
    .build()     the target's compiler: an in-process Executable

A Target (mica/targets.py) answers everything that differs between targets; nothing here names one.
`remat` and `memory_budget` (bytes of the program's arena) are the pipeline's own options: `remat`
turns the min-cut rematerialization on (off by default: on the CPU its recomputation may cost up
to a few percent of a shakespeare_char step, BENCHMARKS.md section 10); under a budget the pipeline recomputes
as much as the plan needs to fit (the min-cut first, then the min-cut repeating the fewest of the
cheapest products that fit, then block checkpoints).
`fp_half_intermediates` (off by default) lets half-type attention round where PyTorch's CPU
attention rounds (passes/widen.py); without it every digit but the outputs' is kept.
"""
import math
import numbers

import numpy as np

from .errors import MicaError
from .passes import fuse, memory, order, remat as remat_pass, simplify, widen
from .targets import get_target

MAX_EVERY = 8  # block checkpoints at most this many bottlenecks apart are tried under a budget


EVERY_COUNT = 32  # up to this many cheap products, a budget's search plans every count of them


class BudgetError(MicaError):
    """No plan fits the memory budget: `smallest` is the fewest bytes one can take."""

    def __init__(self, message, smallest, mode):
        super().__init__(message)
        self.smallest, self.mode = smallest, mode


class Lowered:
    """A Program lowered for a target: its graph, schedule, exact memory plan and source."""

    def __init__(self, program, target, remat=False, memory_budget=None, fp_half_intermediates=False):
        self.program = program
        self.target = target
        self.fp_half_intermediates = _check_flag("fp_half_intermediates", fp_half_intermediates)
        self.opt_level = target.opt_level
        self.memory_budget = _check_budget(memory_budget)
        remat = _check_flag("remat", remat)
        self._plan(*(("min-cut", ()) if remat else ("off", 0)))
        if self.memory_budget is not None and self.plan.total > self.memory_budget:
            self._fit(remat)
        self.memory_report = self.plan.report(program.name)
        if self._planned[0] != "off":  # (without it the report, and so the source, is as before the pass)
            self.memory_report += "\n  " + self.remat.summary()
        if self.memory_budget is not None:
            self.memory_report += f"\n  memory budget {self.memory_budget:,} bytes: the plan fits"
        self.source = target.render(self)

    @property
    def ir(self):
        """The graph the source was made from, as text (program.ir after widen, simplify, remat and
        order: renumbered, so the source's %N are this text's, not program.ir's)."""
        return self.graph.text()

    def _fit(self, remat):
        """Of the plans that recompute more (the min-cut; the min-cut repeating the fewest of the
        cheapest products that fits; block checkpoints, one every k bottlenecks of the forward),
        the one within the budget that adds the fewest FLOPs (then the fewest bytes): so a smaller
        budget never gets a larger plan."""
        tried = [(self.plan.total, self.remat.flops, ("min-cut", ()) if remat else ("off", 0))]
        if not remat:
            self._plan("min-cut", ())
            tried.append((self.plan.total, self.remat.flops, ("min-cut", ())))
        if self.plan.total > self.memory_budget:
            tried += self._fewest_products()
        self._plan("checkpoint", 1)
        tried.append((self.plan.total, self.remat.flops, ("checkpoint", 1)))
        for every in range(2, min(self.remat.checkpoints, MAX_EVERY) + 1):
            self._plan("checkpoint", every)
            tried.append((self.plan.total, self.remat.flops, ("checkpoint", every)))
        fits = [t for t in tried if t[0] <= self.memory_budget]
        if not fits:  # (every plan tried here is one every budget tries: the ladder's, the checkpoints')
            best = min(tried, key=lambda t: (t[0], t[1]))
            self._plan(*best[2])
            unit = "byte" if self.memory_budget == 1 else "bytes"
            raise BudgetError(f"memory_budget={self.memory_budget:,} {unit} is less than the smallest plan Mica can "
                              f"make for {self.program.name} ({best[0]:,} bytes, {mode_words(self.remat.mode)}); "
                              f"give at least {best[0]:,} bytes", smallest=best[0], mode=self.remat.mode)
        choice = min(fits, key=lambda t: (t[1], t[0]))
        if choice[2] != self._planned:
            self._plan(*choice[2])

    def _fewest_products(self):
        """The min-cut free to repeat some of the cheapest forward products. First the plans no
        budget chooses: the first n of them for every n (on a ladder, 1, 2, 4, ... all, past
        EVERY_COUNT candidates), and the smallest of those less each product it is no larger
        without; a refusal's smallest plan is one of these, so a budget at least that large always
        meets it again. Repeating more products does not always take fewer bytes (the plan's peak
        moves), so no search may assume it. Then, where one fits, the fewest products: each the
        fitting plan still fits without is dropped. The plans tried."""
        tried = []

        def planned(products):
            self._plan("min-cut", tuple(products))
            tried.append((self.plan.total, self.remat.flops, ("min-cut", tuple(products))))
            return self.plan.total

        count = len(remat_pass.product_candidates(self.graph))
        sizes = range(1, count + 1) if count <= EVERY_COUNT else \
            sorted({min(2 ** i, count) for i in range(count.bit_length() + 1)})
        for n in sizes:
            planned(range(n))
        if not tried:
            return tried
        total, _, (_, best) = min(tried, key=lambda t: (t[0], t[1]))
        if len(best) <= EVERY_COUNT:
            keep = list(best)
            for i in best:  # (no budget in it: the smallest plan, made smaller where it can be)
                if len(keep) == 1:
                    break
                size = planned([j for j in keep if j != i])
                if size <= total:
                    keep.remove(i)
                    total = size
        fitting = [t for t in tried if t[0] <= self.memory_budget]
        if fitting:
            keep = list(min(fitting, key=lambda t: (len(t[2][1]), t[1]))[2][1])
            for i in list(keep):  # (what this budget lets go: fewer products, fewer FLOPs)
                without = [j for j in keep if j != i]
                if without and planned(without) <= self.memory_budget:
                    keep = without
        return tried

    def _plan(self, mode, k):
        """Plan with rematerialization `mode`: "off", "min-cut" (`k`: which of the cheapest
        products it may repeat, indices in remat.product_candidates) or "checkpoint" (at every
        `k`-th bottleneck)."""
        target = self.target
        self._planned = (mode, k)
        self.graph = simplify.simplify(widen.widen(self.program.graph, target, self.fp_half_intermediates))
        if mode == "off":
            self.remat = remat_pass.Choice("off", [], [], 0)
        elif mode == "min-cut":
            self.remat = remat_pass.rematerialize(self.graph, mode, products=k)
        else:
            self.remat = remat_pass.rematerialize(self.graph, mode, k)
        if target.opt_level > 0:
            order.hoist(self.graph)
        self.schedule = fuse.build(self.graph, target, fuse=target.opt_level > 0)
        self.plan = memory.plan(self.schedule, target)

    def build(self, **options):
        """Compile (cached) and load: an Executable to call with numpy arrays."""
        import inspect

        with _at_users_line():
            known = [k for k in inspect.signature(self.target.build).parameters if k != "lowered"]
            unknown = [k for k in options if k not in known]
            if unknown:
                raise MicaError(f"build() takes {'the option ' + ', '.join(known) if known else 'no options'} here, "
                                f"not {unknown[0]}=...; the target's options (simulate, tf32, ...) are lower()'s, or "
                                "mica.compile()'s")
            return self.target.build(self, **options)


class _at_users_line:
    """A MicaError raised inside, without a place, is given the user's line that called into Mica
    (lower(), build(), compile(): their options and what their compilers say)."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        from . import errors
        from .tensor import user_location

        if isinstance(error, MicaError) and error.loc is None and not errors.IN_CLI:  # (the mica command's
            error.locate(user_location())  # errors name the settings or files at fault themselves)
        return False


def mode_words(mode):
    """A plan's recomputation in words, for a sentence: "with min-cut", or "recomputing nothing"."""
    return "recomputing nothing" if mode == "off" else f"with {mode}"


def _check_flag(name, value):
    if not isinstance(value, bool):
        raise MicaError(f"{name} must be True or False, got {value!r}")
    return value


def _check_budget(budget):
    """A whole, positive number of bytes (an int, numpy's too, or a float such as 1e6 that is one)."""
    if budget is None:
        return None
    if isinstance(budget, str):
        raise MicaError(f"memory_budget here is a whole number of bytes, got {budget!r}; sizes such as '2GB' and "
                        "'auto' are mica train's --memory_budget (mica.train.memory_plan.parse_budget reads them)")
    whole = isinstance(budget, numbers.Integral) or (isinstance(budget, numbers.Real) and math.isfinite(budget)
                                                     and float(budget).is_integer())
    if isinstance(budget, (bool, np.bool_)) or not whole or budget <= 0:
        raise MicaError(f"memory_budget must be a whole, positive number of bytes, got {budget!r}")
    return int(budget)


def lower(program, target, remat=False, memory_budget=None, fp_half_intermediates=False, **options):
    """Lower `program` for `target` (a name or a Target); `remat`, `memory_budget` and
    `fp_half_intermediates` are the pipeline's (see above), other options go to the target."""
    with _at_users_line():
        return Lowered(program, get_target(target, **options), remat=remat, memory_budget=memory_budget,
                       fp_half_intermediates=fp_half_intermediates)
