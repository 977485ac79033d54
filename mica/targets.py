"""Targets: everything that differs between the machines Mica compiles for, in one object each.

The shared pipeline (mica/lower.py) never names a target or a kernel's calling convention; it asks
the Target:

- `align`: byte alignment of every buffer in the arena;
- `workspace(kernel)`: (shared bytes, bytes per unit) of scratch a kernel needs, and
  `workspace_units`: how many units run at once (threads on a CPU, streams on a GPU);
- `product_epilogue(gemm, loop)`: may this elementwise loop ride on this product's output tiles;
  `product_keeps_sums(gemm)`: can the product hand its float32 sums to that epilogue without storing
  them (so an output nothing else reads needs no memory: passes/memory.py's `unstored`);
- `kernel_abi(op)`: a hand-written kernel's calling convention (the op record's, by default);
- `half_kernel(op, dtype)`: does it compute a product or kernel primitive on operands of half type
  `dtype` itself (else the pipeline computes it in float32 between casts, passes/widen.py);
- `render(lowered)` -> source text, `build(lowered)` -> an in-process Executable.

Per-op lowering lives with each target's kernels, registered per platform as JAX does it:
`register_lowering("layer_norm", "c", rule, scratch=...)`. Adding a kernel primitive touches its op
record (mica/ops), its kernels and lowering rules (a backend), and its test row.
"""
import importlib

from .errors import MicaError
from .ops import OPS


class Lowering:
    """How one platform lowers one kernel primitive: `rule(renderer, kernel) -> lines`, and
    `scratch(kernel) -> (shared bytes, bytes per unit)` of workspace. `host`: the lines run on the
    host and launch the device work themselves (a GPU's attention: products and row kernels), rather
    than being the body of one kernel."""

    __slots__ = ("rule", "scratch", "host")

    def __init__(self, rule, scratch=None, host=False):
        self.rule, self.scratch, self.host = rule, scratch, host


_LOWERINGS = {}


def register_lowering(op, platform, rule=None, scratch=None, host=False):
    """Register `rule` as `platform`'s lowering of primitive `op` (usable as a decorator)."""
    if op not in OPS or OPS[op].family != "kernel":
        raise ValueError(f"{op} is not a kernel primitive")

    def add(rule):
        if (platform, op) in _LOWERINGS:
            raise ValueError(f"{platform} lowers {op} twice")
        _LOWERINGS[(platform, op)] = Lowering(rule, scratch, host)
        return rule

    return add(rule) if rule is not None else add


def lowering_of(op, platform):
    """The Lowering `platform` registered for `op`, or None."""
    return _LOWERINGS.get((platform, op))


class Target:
    """The questions the shared pipeline asks; a backend subclasses it."""

    name = "abstract"
    platform = None        # the key its lowering rules are registered under
    align = 64             # bytes
    workspace_units = 1    # threads (CPU) or streams (GPU) that each need their own scratch
    unit_name = "unit"

    def __init__(self, opt_level=2):
        if opt_level not in (0, 1, 2):
            raise MicaError(f"opt_level must be 0, 1 or 2, got {opt_level!r}")
        self.opt_level = opt_level

    def kernel_abi(self, op):
        return OPS[op].kernel

    def lowering(self, op):
        rule = _LOWERINGS.get((self.platform, op))
        if rule is None:
            raise MicaError(f"the {self.name} target has no kernel for {op}")
        return rule

    def half_kernel(self, op, dtype):
        """Does this target compute primitive `op` (or a product, "matmul") on operands of half type
        `dtype` (bfloat16 or float16) itself? Otherwise the shared pipeline widens them to float32
        around it."""
        return False

    def workspace(self, kernel):
        """A kernel primitive's scratch, as its lowering says; other kernels need none."""
        from .passes.schedule import Call

        if isinstance(kernel, Call):
            scratch = self.lowering(kernel.op).scratch
            return scratch(kernel) if scratch else (0, 0)
        return 0, 0

    def product_epilogue(self, gemm, loop):
        return False

    def product_keeps_sums(self, gemm):
        return False

    def render(self, lowered):
        raise NotImplementedError

    def build(self, lowered, **options):
        raise NotImplementedError


# targets by name: a module path (imported on first use) or a factory
_TARGETS = {"cpu": "mica.backends.c.target", "cuda": "mica.backends.cuda.target"}


def register_target(name, factory):
    """Make `program.lower(name, **options)` use `factory(**options)` (a Target subclass)."""
    _TARGETS[name] = factory


def get_target(name, **options):
    if isinstance(name, Target):
        return name
    factory = _TARGETS.get(name)
    if factory is None:
        raise MicaError(f"target {name!r} is not available; use one of {', '.join(sorted(_TARGETS))}")
    if isinstance(factory, str):
        factory = importlib.import_module(factory).TARGET
        _TARGETS[name] = factory
    import inspect

    try:
        accepted = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        accepted = None
    if accepted is not None and not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        unknown = [k for k in options if k not in accepted]
        if unknown:
            known = [k for k in accepted if k != "self"]
            raise MicaError(f"the {name} target has no option {unknown[0]!r}; its options are {', '.join(known)} "
                            "(and the pipeline's remat, memory_budget and fp_half_intermediates)")
    return factory(**options)
