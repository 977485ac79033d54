"""Half types computed in float32 where a target has no half-type kernel.

A product or a kernel primitive (norms, softmax, cross-entropy, attention, embedding, and their
backwards) whose floating operands are bfloat16 or float16 becomes: its half operands widened to
float32 (exact: every half value is a float32 value), the primitive in float32, and each half
output rounded once to its type. That is the semantics Mica gives these primitives in every dtype
(products accumulate in float32, every other digit is kept: see mica.autocast), written as visible
cast nodes, so every target runs half-type programs with its float32 kernels; a target that has a
half kernel for a primitive says so (`Target.half_kernel(op, dtype)`: the CPU's bfloat16 products)
and keeps the node as it is.
"""
from .. import dtypes
from ..ops import OPS
from .simplify import _Rebuilder

HALF = (dtypes.bfloat16, dtypes.float16)


def _half_type(node):
    """The half type a product or kernel primitive computes on (None when it has no half operand)."""
    if node.op != "matmul" and OPS[node.op].family != "kernel":
        return None
    return next((v.dtype for v in list(node.inputs) + list(node.outputs) if v.dtype in HALF), None)


class _Widener(_Rebuilder):
    def __init__(self, graph, target):
        super().__init__(graph)
        self.target = target

    def cast(self, v, dtype, loc):
        return self.new.add("cast", (v,), {"dtype": dtype}, [(v.shape, dtype)], loc).out

    def rewrite(self, node, ins):
        half = _half_type(node)
        if half is None or self.target.half_kernel(node.op, half):
            return None
        loc = node.loc
        wide = [self.cast(v, dtypes.float32, loc) if v.dtype in HALF else v for v in ins]
        types = [(o.shape, dtypes.float32 if o.dtype in HALF else o.dtype) for o in node.outputs]
        outs = self.new.add(node.op, wide, node.attrs, types, loc).outputs
        return [self.cast(n, o.dtype, loc) if o.dtype in HALF else n for n, o in zip(outs, node.outputs)]


def widen(graph, target):
    """`graph` with every half-type product and kernel primitive the target has no half kernel for
    computed in float32 between casts (the graph itself when there is none)."""
    if not any(_half_type(n) is not None for n in graph.nodes):
        return graph
    return _Widener(graph, target).run()
