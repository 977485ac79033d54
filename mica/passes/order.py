"""Ordering: compute a costly slope in the forward, beside the function it is the slope of; and
compute a weight's gradient as soon as its operands exist.

Autodiff places each gradient's ingredients in the backward, next to their use. Some depend only on
a forward value x: GELU's slope, gelu_slope(x), is as costly as gelu(x) itself (an exp and a CDF),
and the backward would recompute all of it from a saved x. Moved to right after the forward's last
other reader of x (gelu(x)), fusion computes both in one pass over x while it is in cache (gcc
shares their common arithmetic) and the slope is kept for the backward instead of x, which then
dies: the backward's part becomes one multiply.

A move never grows memory: x must be an activation (not an input, output or state), every other
reader of its storage must already come before the move, and the slope must be no larger than x,
so x's storage dies where the slope is born. Elementwise results do not depend on where they are
computed, so the bits are the same as without the move (opt_level 0 does not move anything).
A slope whose GELU is a copy the rematerialization pass made in the backward stays where it is:
there it is read by one multiply of a product's output, so fusion computes it in that product's
epilogue and it is never stored.

A product whose result is a parameter's gradient (dW = a^T g, at the weight's own layout) reads
an activation `a` that often dies there, and the input's gradient (g W, as large as `a`) is
usually computed just before it. Moved to right after the last producer of its operands, the
product lets `a` die before the input's gradient is born: the two are never live together. A
product's bits do not depend on when it runs, so nothing else changes.
"""
from ..ops import OPS

HOISTED = {"gelu_slope"}  # elementwise ops worth computing where their input is produced
VIEW_OPS = {"reshape", "permute", "slice", "expand"}


def _storage_readers(v, consumers):
    """The value whose storage `v` views, and every node that reads that storage (through views)."""
    base = v
    while base.node.op in VIEW_OPS:
        base = base.node.inputs[0]
    views, readers, stack = [base], [], [base]
    while stack:
        w = stack.pop()
        for c in consumers.get(w.id, []):
            if c.op in VIEW_OPS:
                views.append(c.outputs[0])
                stack.append(c.outputs[0])
            elif c not in readers:
                readers.append(c)
    return base, views, readers


def hoist(graph):
    """Reorder graph.nodes in place; returns how many nodes moved."""
    backward = graph.backward_values()
    return _hoist_slopes(graph, backward) + _weight_gradients_early(graph, backward)


def _move_after(nodes, order, group, at):
    """Put `group` (nodes after position `at`, in their order) right after position `at`, the nodes
    in between keeping theirs: as removing the group and inserting it there, but in time (and
    `order`'s updates) proportional to the span it crosses, not to the graph."""
    end, ids = order[id(group[-1])], {id(m) for m in group}
    span = group + [m for m in nodes[at + 1:end + 1] if id(m) not in ids]
    nodes[at + 1:end + 1] = span
    for k, m in enumerate(span, at + 1):
        order[id(m)] = k


def _weight_gradients_early(graph, backward):
    """Move every backward product that makes a parameter's gradient to right after the last
    producer of its operands; returns how many moved."""
    moved = 0
    order = {id(m): k for k, m in enumerate(graph.nodes)}  # (kept up to date by _move_after)
    for n in [n for n in graph.nodes if n.op == "matmul" and graph.roles.get(n.out.id) == "gradient"
              and n.out.id in backward]:
        views, stack = [], list(n.inputs)  # the views it reads through move with it
        while stack:
            u = stack.pop()
            if u.node.op in VIEW_OPS and u.node not in views:
                views.append(u.node)
                stack += u.node.inputs
        at = max((order[id(u.node)] for m in views + [n] for u in m.inputs if u.node not in views), default=-1)
        group = sorted((m for m in views + [n] if order[id(m)] > at), key=lambda m: order[id(m)])
        if all(order[id(m)] == at + 1 + i for i, m in enumerate(group)):
            continue
        _move_after(graph.nodes, order, group, at)
        moved += 1
    return moved


def _hoist_slopes(graph, backward):
    consumers = graph.consumers()
    out_ids = {v.id for v in graph.outputs}
    moved = 0
    order = {id(m): k for k, m in enumerate(graph.nodes)}  # (kept up to date by _move_after)
    for n in [n for n in graph.nodes if n.op in HOISTED]:
        if len(n.inputs) != 1:
            continue
        x = n.inputs[0]
        base, views, readers = _storage_readers(x, consumers)
        if (base.node.op == "input" or any(w.id in out_ids or w.id in graph.roles for w in views)
                or n.out.shape != x.shape or n.out.dtype.itemsize > x.dtype.itemsize):
            continue
        others = [r for r in readers if r is not n]
        if not others or any(order[id(r)] > order[id(n)] for r in others):
            continue
        last = max(others, key=lambda r: order[id(r)])
        if last.out.id in backward:
            continue  # a recomputed GELU's slope: fused into the product epilogue that reads it
        if OPS[last.op].family != "elementwise" or last.out.shape != n.out.shape:
            continue  # moved only to share a pass with an elementwise reader of x
        if order[id(last)] + 1 == order[id(n)]:
            continue
        _move_after(graph.nodes, order, [n], order[id(last)])
        moved += 1
    return moved
