"""The intermediate representation: a flat, single-assignment list of nodes with static types.

A Node applies one primitive (`op`) to input Values and defines one or more output Values; each
node keeps the user's source location. Nodes are hash-consed by structure, so a common
subexpression is built once. Graphs print one node per line with the user's line beside it.
"""
import math

from .dtypes import Spec
from .errors import format_loc


class Value:
    """One SSA value: the `index`-th output of `node`, with a static shape and element type."""

    __slots__ = ("id", "shape", "dtype", "node", "index")

    def __init__(self, id, shape, dtype, node, index):
        self.id = id
        self.shape = shape
        self.dtype = dtype
        self.node = node
        self.index = index

    @property
    def spec(self):
        return Spec(self.shape, self.dtype)

    @property
    def numel(self):
        return math.prod(self.shape)

    @property
    def nbytes(self):
        return self.numel * self.dtype.itemsize

    def __repr__(self):
        return f"%{self.id}:{self.spec!r}"


class Node:
    __slots__ = ("op", "inputs", "attrs", "outputs", "loc")

    def __init__(self, op, inputs, attrs, loc):
        self.op = op              # name of the primitive (an OpDef in mica.ops)
        self.inputs = inputs      # tuple of Value
        self.attrs = attrs        # dict of static attributes (hashable values)
        self.outputs = ()         # tuple of Value, set by Graph.add
        self.loc = loc            # (path, line) of the user's code, or None

    @property
    def out(self):
        """The single output of a one-output node."""
        assert len(self.outputs) == 1, self.op
        return self.outputs[0]

    def __repr__(self):
        return format_node(self)


def freeze(v):
    """A hashable key for an attribute value; floats keyed by repr so -0.0 and nan are distinct."""
    if isinstance(v, float):
        return ("f", repr(v))
    if isinstance(v, (list, tuple)):
        return tuple(freeze(x) for x in v)
    if hasattr(v, "short"):
        return ("dtype", v.name)
    return v


class Graph:
    """Nodes in program order, the input values (with their readable names) and the outputs."""

    def __init__(self):
        self.nodes = []
        self.inputs = []          # Values defined by "input" nodes, in argument order
        self.input_names = []     # readable path of each input: "params['wte.weight']"
        self.outputs = []         # Values the program returns, in flattened order
        self.rng = None           # the Value holding (seed, offset) when any random op is used
        self.roles = {}           # value id -> "parameter" | "gradient" | "optimizer state"
        self.updates = {}         # value id of a new state value -> value id of the one it replaces
        self.backward = []        # per mica.grad call, the ids of the values its VJPs defined
        self.unreached = set()    # ids of mica.grad's zeros for tensors the loss does not reach (torch's None)
        self._cons = {}
        self._next_id = 0

    def add(self, op, inputs, attrs, out_types, loc, cse=True):
        """Append (or find, when structurally equal) a node; returns the Node."""
        inputs = tuple(inputs)
        key = None
        if cse:
            key = (op, tuple(v.id for v in inputs), tuple(sorted((k, freeze(a)) for k, a in attrs.items())))
            found = self._cons.get(key)
            if found is not None:
                return found
        node = Node(op, inputs, dict(attrs), loc)
        outs = []
        for i, (shape, dtype) in enumerate(out_types):
            outs.append(Value(self._next_id, tuple(shape), dtype, node, i))
            self._next_id += 1
        node.outputs = tuple(outs)
        self.nodes.append(node)
        if key is not None:
            self._cons[key] = node
        return node

    def add_input(self, spec, name, loc=None):
        node = self.add("input", (), {"index": len(self.inputs)}, [(spec.shape, spec.dtype)], loc, cse=False)
        self.inputs.append(node.out)
        self.input_names.append(name)
        return node.out

    def backward_values(self):
        """The ids of every value a mica.grad call's backward defined (all calls together)."""
        return set().union(*self.backward)

    def consumers(self):
        """Map from value id to the list of nodes that read it."""
        users = {}
        for n in self.nodes:
            for v in n.inputs:
                users.setdefault(v.id, []).append(n)
        return users

    def text(self):
        lines = [format_node(n, self) for n in self.nodes]
        lines.append("return " + ", ".join(f"%{v.id}" for v in self.outputs))
        return "\n".join(lines)


def format_attr(v):
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (tuple, list)):
        return "[" + ",".join(format_attr(x) for x in v) + "]"
    if hasattr(v, "short"):
        return v.short
    if isinstance(v, str):
        return v
    return repr(v)


def format_node(node, graph=None):
    lhs = ", ".join(f"%{v.id}:{v.spec!r}" for v in node.outputs)
    parts = [node.op]
    if node.op == "input" and graph is not None:
        parts.append(graph.input_names[node.attrs["index"]])
    else:
        args = ", ".join(f"%{v.id}" for v in node.inputs)
        if args:
            parts.append(args)
        parts += [f"{k}={format_attr(a)}" for k, a in node.attrs.items()]
    text = f"{lhs} = {' '.join(parts)}"
    if node.loc:
        import os

        text = f"{text:<56}  # {os.path.basename(node.loc[0])}:{node.loc[1]}"
    return text
