"""Nested dicts, lists and tuples of leaves ("pytrees"), flattened in a fixed order and rebuilt.

Dicts keep their insertion order (a model's parameters stay in PyTorch's order); None is an empty
subtree. What counts as a leaf is the caller's choice.
"""
from collections import OrderedDict


class TreeDef:
    __slots__ = ("kind", "meta", "children")

    def __init__(self, kind, meta, children):
        self.kind = kind          # "leaf" | "none" | "const" | "dict" | "list" | "tuple" | "namedtuple"
        self.meta = meta          # dict keys, namedtuple class
        self.children = children  # tuple of TreeDef

    @property
    def num_leaves(self):
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)  # (a "const": a Python value kept in the tree, no leaf)

    def __eq__(self, other):
        return (isinstance(other, TreeDef) and self.kind == other.kind and self.meta == other.meta
                and type(self.meta) is type(other.meta)
                and self.children == other.children)

    def __hash__(self):
        return hash((self.kind, self.meta, self.children))

    def __repr__(self):
        return f"TreeDef({unflatten(self, ['*'] * self.num_leaves)!r})"


class _Ordered(tuple):
    """An OrderedDict's keys (it is rebuilt as one, as torch.compile gives it back)."""


_LEAF = TreeDef("leaf", None, ())
_NONE = TreeDef("none", None, ())


def flatten(tree, is_leaf=None):
    """(leaves, treedef). Containers are dict, list, tuple and namedtuple; everything else is a leaf."""
    leaves = []

    def walk(node):
        if is_leaf is not None and is_leaf(node):
            leaves.append(node)
            return _LEAF
        if node is None:
            return _NONE
        if isinstance(node, dict):
            keys = (_Ordered if isinstance(node, OrderedDict) else tuple)(node.keys())
            return TreeDef("dict", keys, tuple(walk(node[k]) for k in keys))
        if isinstance(node, tuple) and hasattr(node, "_fields"):
            return TreeDef("namedtuple", type(node), tuple(walk(c) for c in node))
        if isinstance(node, (list, tuple)):
            return TreeDef(type(node).__name__ if type(node) in (list, tuple) else "list", None,
                           tuple(walk(c) for c in node))
        if type(node).__name__ == "Deferred" and type(node).__module__ == "mica.tensor":  # (x.item() in a trace:
            return TreeDef("item", None, (walk(node.tensor),))                            # its tensor, a number back)
        leaves.append(node)
        return _LEAF

    treedef = walk(tree)
    return leaves, treedef


def with_constants(treedef, constants):
    """treedef with the leaves at the indices of `constants` ({leaf index: Python value}) made
    "const" nodes: unflatten gives those values back, and they take no leaf."""
    count = [0]

    def walk(td):
        if td.kind == "leaf":
            i = count[0]
            count[0] += 1
            return TreeDef("const", constants[i], ()) if i in constants else td
        if not td.children:
            return td
        return TreeDef(td.kind, td.meta, tuple(walk(c) for c in td.children))
    return walk(treedef)


def unflatten(treedef, leaves):
    it = iter(leaves)

    def build(td):
        if td.kind == "leaf":
            return next(it)
        if td.kind == "none":
            return None
        if td.kind == "const":
            return td.meta
        kids = [build(c) for c in td.children]
        if td.kind == "item":
            return _number(kids[0])
        if td.kind == "dict":
            return (OrderedDict if isinstance(td.meta, _Ordered) else dict)(zip(td.meta, kids))
        if td.kind == "list":
            return kids
        if td.kind == "tuple":
            return tuple(kids)
        return td.meta(*kids)

    out = build(treedef)
    rest = list(it)
    if rest:
        raise ValueError(f"unflatten was given {len(rest)} leaves too many")
    return out


def _number(value):
    """What x.item() gives for a value a program returned (a Python number), or, for a traced
    tensor (the tree rebuilt inside a trace), the deferred number again."""
    from .tensor import Deferred, Tensor

    if isinstance(value, Tensor):
        return Deferred(value)
    import numpy as np

    return np.asarray(value).item()


def tree_map(fn, tree, *rest, is_leaf=None):
    leaves, td = flatten(tree, is_leaf)
    others = [flatten(r, is_leaf)[0] for r in rest]
    return unflatten(td, [fn(x, *(o[i] for o in others)) for i, x in enumerate(leaves)])


def leaf_paths(tree, is_leaf=None, prefix=""):
    """A readable path for each leaf, in flatten order: "params['wte']", "args[1]"."""
    paths = []

    def walk(node, path):
        if is_leaf is not None and is_leaf(node):
            paths.append(path)
        elif node is None:
            return
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}[{k!r}]")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
        else:
            paths.append(path)

    walk(tree, prefix)
    return paths


def describe_difference(got, want):
    """Where treedef `got` first differs from `want`, in words (each a tuple of a call's arguments):
    'argument 2['bias'] is missing', 'argument 1 is a list where one array was traced', ..."""
    if got.kind == want.kind == "tuple" and len(got.children) != len(want.children):
        n, m = len(got.children), len(want.children)
        return f"called with {n} argument{'s' * (n != 1)}, traced with {m}"
    noun = {"leaf": "an array", "none": "None", "dict": "a dict", "list": "a list", "tuple": "a tuple",
            "namedtuple": "a namedtuple"}

    def walk(g, w, path):
        if g.kind != w.kind or (g.kind == "namedtuple" and g.meta != w.meta):
            hint = " (pass it as one: np.asarray)" if w.kind == "leaf" and g.kind in ("list", "tuple") else ""
            return f"{path} is {noun[g.kind]} where {noun[w.kind]} was traced{hint}"
        if g.kind == "dict" and g.meta != w.meta:
            missing = [k for k in w.meta if k not in g.meta]
            extra = [k for k in g.meta if k not in w.meta]
            if missing:
                return f"{path} lacks {', '.join(map(repr, missing))}"
            if extra:
                return f"{path} has {', '.join(map(repr, extra))}, which the traced one does not"
            return f"{path}'s keys come in another order than the traced one's"
        if g.kind in ("list", "tuple") and len(g.children) != len(w.children):
            return f"{path} has {len(g.children)} items where {len(w.children)} were traced"
        keys = g.meta if g.kind == "dict" else range(len(g.children))
        for k, gc, wc in zip(keys, g.children, w.children):
            found = walk(gc, wc, f"{path}[{k!r}]")
            if found:
                return found
        return None

    for i, (g, w) in enumerate(zip(got.children, want.children)):
        found = walk(g, w, f"argument {i}")
        if found:
            return found
    return "the structures differ"
