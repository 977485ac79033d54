"""Simplify a graph without changing a single bit of its results.

Rebuilds the graph in order, so hash-consing merges common subexpressions (CSE), and only what
the outputs need is kept (DCE; a collective across ranks always is). Rewrites are exact: multiplying by a constant one, casting to the
same type, composing reshapes and permutes, folding arithmetic on scalar constants in their own
element type (IEEE, as the compiled code would compute it), and turning a sum of disjoint pads —
what the gradient of a split looks like — into one concat.
"""
import numpy as np

from .. import dtypes
from ..backends.reference import round_bf16
from ..ir import Graph

_FOLDABLE = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "neg": np.negative}


def _const_value(v):
    n = v.node
    return n.attrs["value"] if n.op == "const" else None


def _broadcast_const(v):
    """The value of a constant seen through reshapes and expands (a broadcast scalar), else None."""
    n = v.node
    while n.op in ("reshape", "expand"):
        n = n.inputs[0].node
    return n.attrs["value"] if n.op == "const" else None


def _fold(op, dtype, values):
    np_t = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64}.get(dtype.name)
    if np_t is None or (op == "div" and dtype.kind != "float"):
        return None
    with np.errstate(all="ignore"):
        r = _FOLDABLE[op](*(np_t(x) for x in values))
    return float(r) if dtype.kind == "float" else int(r)


def _cast_const(value, dtype):
    if dtype.kind == "bool":
        return bool(value)
    if dtype.kind == "int":
        return int(value) if not isinstance(value, float) or np.isfinite(value) else None
    if dtype is dtypes.float64:
        return float(value)
    if dtype is dtypes.float32:
        return float(np.float32(value))
    if dtype is dtypes.bfloat16:
        return float(round_bf16(np.float32(value)))
    return float(np.float16(value))


class _Rebuilder:
    def __init__(self, graph):
        self.old = graph
        self.new = Graph()
        self.map = {}
        self.pieces = {}  # new value id -> (axis, [(start, stop, value)]) for sums of disjoint pads

    def add(self, node, op, inputs, attrs, loc):
        n = self.new.add(op, inputs, attrs, [(v.shape, v.dtype) for v in node.outputs], loc)
        return n.outputs

    def permute(self, v, perm, loc):
        if v.node.op == "permute":
            inner = v.node.attrs["perm"]
            perm = tuple(inner[p] for p in perm)
            v = v.node.inputs[0]
        if perm == tuple(range(len(perm))):
            return v
        shape = tuple(v.shape[p] for p in perm)
        return self.new.add("permute", (v,), {"perm": perm}, [(shape, v.dtype)], loc).out

    def matmul(self, a, b, attrs, loc):
        shape = a.shape[:-1] + (b.shape[-1],)
        return self.new.add("matmul", (a, b), attrs, [(shape, attrs.get("dtype") or a.dtype)], loc).out

    def _narrowed_back(self, x, dtype, loc):
        """cast(x, dtype) without the cast where it undoes a widening, seen through reshapes: x a
        widened `dtype` value (the value itself), or a float32 sum of one (the half sum: it accumulates
        in float32 and rounds once); else None. (A half product kept in float32 has its cotangent
        widened, reshaped, then rounded back, and a bias's gradient summed from it.)"""
        views = []
        while x.node.op == "reshape":
            views.append(x)
            x = x.node.inputs[0]
        n = x.node
        if n.op == "cast" and n.inputs[0].dtype is dtype and _widens(dtype, x.dtype):
            out = n.inputs[0]
        elif (n.op == "sum" and x.dtype is dtypes.float32 and dtype in dtypes.HALF and n.inputs[0].node.op == "cast"
              and n.inputs[0].node.inputs[0].dtype is dtype):
            out = self.new.add("sum", n.inputs[0].node.inputs, n.attrs, [(x.shape, dtype)], loc).out
        else:
            return None
        for v in reversed(views):
            out = self.new.add("reshape", (out,), v.node.attrs, [(v.shape, dtype)], loc).out
        return out

    def const(self, value, dtype, loc):
        return self.new.add("const", (), {"value": value, "dtype": dtype}, [((), dtype)], loc).out

    def rewrite(self, node, ins):
        """The new output values for `node` given its (new) inputs, or None to copy it as is."""
        op, a, loc = node.op, node.attrs, node.loc
        out = node.outputs[0] if node.outputs else None
        if op in _FOLDABLE and all(v.node.op == "const" for v in ins) and out.shape == ():
            r = _fold(op, out.dtype, [_const_value(v) for v in ins])
            if r is not None:
                return [self.const(r, out.dtype, loc)]
        if op == "mul" and out.dtype.kind == "float":
            for x, y in ((ins[0], ins[1]), (ins[1], ins[0])):
                if _broadcast_const(y) == 1.0 and x.shape == out.shape:
                    return [x]
        if op == "cast":
            x = ins[0]
            if x.dtype is a["dtype"]:
                return [x]
            if x.node.op == "const":  # (the constant as its own type holds it first: a bfloat16 0.1 is 0.10009765625)
                held = _cast_const(x.node.attrs["value"], x.dtype)
                r = None if held is None else _cast_const(held, a["dtype"])
                if r is not None:
                    return [self.const(r, a["dtype"], loc)]
            back = self._narrowed_back(x, a["dtype"], loc)
            if back is not None:
                return [back]
        if op in ("reshape", "expand") and ins[0].shape == out.shape:
            return [ins[0]]
        if op == "custom_grad":  # (a torch.autograd.Function's result: its value, once its gradient is taken)
            return [ins[-1]]
        if op == "reshape" and ins[0].node.op == "reshape":
            return self.add(node, "reshape", ins[0].node.inputs, a, loc)
        if op == "permute":
            if list(a["perm"]) == sorted(a["perm"]):
                return [ins[0]]
            perm, x = tuple(a["perm"]), ins[0]
            swap = tuple(range(len(perm) - 2)) + (len(perm) - 1, len(perm) - 2)
            if perm == swap and x.node.op == "matmul":
                # (A B)^T = B^T A^T, summed over k in the same order: the product is born in the
                # layout its reader wants (a weight's gradient in the weight's own layout)
                xa, xb = x.node.inputs
                return [self.matmul(self.permute(xb, swap, loc), self.permute(xa, swap, loc), x.node.attrs, loc)]
            if ins[0].node.op == "permute":
                inner = ins[0].node.attrs["perm"]
                perm = tuple(inner[p] for p in a["perm"])
                if perm == tuple(range(len(perm))):
                    return [ins[0].node.inputs[0]]
                return self.add(node, "permute", ins[0].node.inputs, {"perm": perm}, loc)
        if op == "pad" and all(s == 1 for s in a["steps"]):
            axes = [d for d, (n, s) in enumerate(zip(ins[0].shape, out.shape)) if n != s]
            if len(axes) == 1:
                d = axes[0]
                res = self.add(node, op, ins, a, loc)
                self.pieces[res[0].id] = (d, [(a["starts"][d], a["starts"][d] + ins[0].shape[d], ins[0])])
                return res
        if op == "add" and ins[0].id in self.pieces and ins[1].id in self.pieces:
            (da, pa), (db, pb) = self.pieces[ins[0].id], self.pieces[ins[1].id]
            if da == db:
                merged = sorted(pa + pb, key=lambda p: p[0])
                if all(p[1] <= q[0] for p, q in zip(merged, merged[1:])):
                    return self._pieces_value(node, ins, da, merged, loc)
        return None

    def _pieces_value(self, node, ins, axis, pieces, loc):
        out = node.outputs[0]
        size = out.shape[axis]
        if pieces[0][0] == 0 and pieces[-1][1] == size and all(p[1] == q[0] for p, q in zip(pieces, pieces[1:])):
            n = self.new.add("concat", [p[2] for p in pieces], {"axis": axis}, [(out.shape, out.dtype)], loc)
            return [n.out]
        res = self.add(node, "add", ins, {}, loc)
        self.pieces[res[0].id] = (axis, pieces)
        return res

    def run(self):
        g = self.old
        needed = _live_nodes(g)
        region = {vid: k for k, ids in enumerate(g.backward) for vid in ids}
        backward = [set() for _ in g.backward]
        for node in g.nodes:
            if id(node) not in needed and node.op != "input":
                continue
            if node.op == "input":
                v = self.new.add_input(node.out.spec, g.input_names[node.attrs["index"]], node.loc)
                self.map[node.out.id] = v
                continue
            if node.op == "rng_key":
                n = self.new.add("rng_key", (), {}, [((2,), dtypes.int64)], None, cse=False)
                self.new.rng = n.out
                self.map[node.out.id] = n.out
                continue
            ins = [self.map[v.id] for v in node.inputs]
            fresh = self.new._next_id
            outs = self.rewrite(node, ins)
            if outs is None:
                outs = self.add(node, node.op, ins, node.attrs, node.loc)
            for old, new in zip(node.outputs, outs):
                self.map[old.id] = new
            k = region.get(node.outputs[0].id) if node.outputs else None
            if k is not None:  # what a backward node made stays backward (not what CSE found in the forward)
                backward[k].update(range(fresh, self.new._next_id))
        self.new.outputs = [self.map[v.id] for v in g.outputs]
        for vid, role in g.roles.items():
            if vid in self.map:
                self.new.roles.setdefault(self.map[vid].id, role)
        self.new.backward = [frozenset(ids) for ids in backward]
        for new_id, old_id in g.updates.items():
            if new_id in self.map and old_id in self.map:
                self.new.updates.setdefault(self.map[new_id].id, self.map[old_id].id)
        return dce(self.new)


def _widens(small, big):
    """True when every value of `small` is exactly representable in `big` (a round trip is exact)."""
    order = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}
    return small.kind == big.kind == "float" and order[big.name] > order[small.name]


def _live_nodes(graph):
    """The nodes the outputs need, and every collective across ranks: its result may be unused here
    but not on another rank (ZeRO-1's non-owners take part in a sum only its owner keeps), and every
    rank must run the same collectives in the same order."""
    from ..ops.collective import COLLECTIVES

    live = set()
    stack = [v.node for v in graph.outputs]
    stack += [n for n in graph.nodes if n.op in COLLECTIVES and n.attrs["world"] > 1]
    while stack:
        n = stack.pop()
        if id(n) in live:
            continue
        live.add(id(n))
        stack.extend(v.node for v in n.inputs)
    return live


def dce(graph):
    """Drop nodes the outputs do not need (inputs always stay: they are the signature)."""
    live = _live_nodes(graph)
    graph.nodes = [n for n in graph.nodes if id(n) in live or n.op == "input"]
    if graph.rng is not None and id(graph.rng.node) not in live:
        graph.rng = None
    return graph


def simplify(graph):
    return _Rebuilder(graph).run()
