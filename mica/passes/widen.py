"""Half types computed in float32 where a target has no half-type kernel.

A product or a kernel primitive (norms, softmax, cross-entropy, attention, embedding, and their
backwards) whose floating operands are bfloat16 or float16 becomes: its half operands widened to
float32 (exact: every half value is a float32 value), the primitive in float32, and each half
output rounded once to its type. That is the semantics Mica gives these primitives in every dtype
(products accumulate in float32, every other digit is kept: see mica.autocast), written as visible
cast nodes, so every target runs half-type programs with its float32 kernels; a target that has a
half kernel for a primitive says so (`Target.half_kernel(op, dtype)`: the CPU's bfloat16 products)
and keeps the node as it is.

With `fp_half_intermediates` (a lowering option, off by default) a kernel of half operands whose
ABI names a `half_round_attr` (attention and its backward) also rounds where PyTorch's CPU kernel
rounds: its node gets that attribute (the half type's name), which every target's kernel reads
(the attention rows of mica_rows.h) and the oracle's reference code follows
(reference.run(..., fp_half_intermediates=True)). Products need no
such attribute: PyTorch's CPU half products accumulate in float32 and round once, as Mica's do.
"""
from .. import dtypes
from ..ops import OPS
from .simplify import _Rebuilder

HALF = dtypes.HALF


def half_round_attrs(node, half):
    """`node`'s attributes with fp_half_intermediates' rounding named, where its kernel's ABI has
    an attribute for it (its own attributes otherwise)."""
    abi = OPS[node.op].kernel
    if abi is not None and abi.half_round_attr and half is not None:
        return {**node.attrs, abi.half_round_attr: half.name}
    return node.attrs


def _half_type(node):
    """The half type a product or kernel primitive computes on (None when it has no half operand)."""
    if node.op != "matmul" and OPS[node.op].family != "kernel":
        return None
    return next((v.dtype for v in list(node.inputs) + list(node.outputs) if v.dtype in HALF), None)


class _Widener(_Rebuilder):
    def __init__(self, graph, target, half_intermediates):
        super().__init__(graph)
        self.target = target
        self.half_intermediates = half_intermediates

    def cast(self, v, dtype, loc):
        return self.new.add("cast", (v,), {"dtype": dtype}, [(v.shape, dtype)], loc).out

    def rewrite(self, node, ins):
        half = _half_type(node)
        attrs = half_round_attrs(node, half) if self.half_intermediates else node.attrs
        if half is None:
            return None
        loc = node.loc
        if self.target.half_kernel(node.op, half):
            if attrs is node.attrs:
                return None
            return self.new.add(node.op, ins, attrs, [(o.shape, o.dtype) for o in node.outputs], loc).outputs
        wide = [self.cast(v, dtypes.float32, loc) if v.dtype in HALF else v for v in ins]
        types = [(o.shape, dtypes.float32 if o.dtype in HALF else o.dtype) for o in node.outputs]
        outs = self.new.add(node.op, wide, attrs, types, loc).outputs
        return [self.cast(n, o.dtype, loc) if o.dtype in HALF else n for n, o in zip(outs, node.outputs)]


def widen(graph, target, half_intermediates=False):
    """`graph` with every half-type product and kernel primitive the target has no half kernel for
    computed in float32 between casts (the graph itself when there is none); with
    `half_intermediates` its half attention kernels carry `half_round`."""
    if not any(_half_type(n) is not None for n in graph.nodes):
        return graph
    return _Widener(graph, target, bool(half_intermediates)).run()
