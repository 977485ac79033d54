"""One record per primitive.

An OpDef holds everything about a primitive: its shape and type rule (`infer`, raising ShapeError),
its numpy reference implementation (`ref`, the oracle's arithmetic), its vector-Jacobian product
written with Mica's own verbs (`vjp`), and its family, which tells a backend how to lower it.
Adding a primitive touches one family module and one row of the op test table.
"""


class KernelABI:
    """A hand-written kernel's calling convention, as data the shared passes read (no pass names
    a kernel): which leading inputs it reads through strides (last stride 1) and which leading
    outputs it may write through strides (laid out as their reader walks them), whether it can
    report bad input (an index out of range: the program stops), which attribute, when
    nonzero, makes it draw random numbers, and which attribute (set by the lowering option
    fp_half_intermediates, passes/widen.py) names the half type it may round intermediates to.
    `inplace`: (output, input) index pairs where the kernel reads every element of the input
    before it writes the output's element at the same place, so the memory plan may put that
    output over that input when the input dies there (cross-entropy's gradient over the logits)."""

    __slots__ = ("strided_inputs", "strided_outputs", "may_fail", "rng_attr", "half_round_attr", "inplace")

    def __init__(self, strided_inputs=0, strided_outputs=0, may_fail=False, rng_attr=None, half_round_attr=None,
                 inplace=()):
        self.strided_inputs, self.strided_outputs = strided_inputs, strided_outputs
        self.may_fail, self.rng_attr, self.half_round_attr = may_fail, rng_attr, half_round_attr
        self.inplace = tuple(inplace)

    def uses_rng(self, attrs):
        return bool(self.rng_attr and attrs.get(self.rng_attr))


REMAT_BY_FAMILY = {"source": "recompute", "elementwise": "recompute", "shape": "recompute", "reduce": "recompute",
                   "matmul": "asked", "kernel": "never"}


class OpDef:
    __slots__ = ("name", "infer", "ref", "vjp", "family", "c", "kernel", "remat", "from_statistics", "flops")

    def __init__(self, name, infer, ref, vjp, family, c, kernel=None, remat=None, from_statistics=None, flops=None):
        self.name = name
        self.infer = infer    # infer(specs, **attrs) -> [(shape, dtype), ...]
        self.ref = ref        # ref(arrays, attrs, run) -> array or tuple of arrays
        self.vjp = vjp        # vjp(cotangents, outs, ins, attrs, needed) -> [Tensor|None per input]
        self.family = family  # "source" | "elementwise" | "reduce" | "shape" | "matmul" | "kernel"
        # C lowering of an elementwise op: an expression template ({0}, {1}: operands; {T}: the C
        # compute type; {S}: f32 or f64), or a function of the node's attributes giving one
        self.c = c
        # a "kernel" primitive's calling convention (lowered per target: mica/targets.py)
        self.kernel = kernel or (KernelABI() if family == "kernel" else None)
        # may the backward recompute it (passes/remat.py): "recompute" (cheap and exact to repeat),
        # "asked" (only under a memory budget's block checkpoints: products, attention), "never"
        self.remat = remat or REMAT_BY_FAMILY[family]
        # a norm: from_statistics(emit, ins, attrs) rebuilds output 0 from the input and the saved
        # statistics (outputs 1:) with the elementwise steps its kernel takes, in its order
        self.from_statistics = from_statistics
        self.flops = flops    # flops(node) -> floating-point operations, where not elementwise-like

    def __repr__(self):
        return f"OpDef({self.name}, {self.family})"


OPS = {}


def defop(name, *, infer, ref, vjp=None, family, c=None, kernel=None, remat=None, from_statistics=None, flops=None):
    if name in OPS:
        raise ValueError(f"primitive {name} is defined twice")
    OPS[name] = OpDef(name, infer, ref, vjp, family, c, kernel, remat, from_statistics, flops)
    return OPS[name]


class _LazyVerbs:
    """The verbs module, imported on first use: VJP rules are written with verbs, which need ops."""

    def __getattr__(self, name):
        from .. import verbs

        return getattr(verbs, name)


F = _LazyVerbs()

from . import elementwise, reduce, shape, matmul, nn, collective  # noqa: E402,F401  (each registers its family)
