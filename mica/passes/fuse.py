"""Fusion: turn a simplified Graph into a Schedule of kernels.

- Shape primitives (reshape, permute, slice, expand) become strided Views: no kernel, no copy.
- Elementwise nodes of one output shape join one loop while nothing outside has read them yet,
  and so does a node that shares an input with the one just before it; a value gets a buffer
  only when something outside its loop (or the caller) reads it.
- A reduction absorbs the elementwise loop that feeds it when nothing else reads that loop, so
  `sum(x * x)` is one pass over memory.
- Products become Gemm kernels reading (possibly transposed) Views; row-wise primitives call
  hand-written kernels; pad and concat are copies.
- A loop reading a product's output at each element's own index rides on the product's tiles as
  its epilogue (where the target allows), and so does a loop just before the product, over the
  same elements, that reads an input the epilogue reads (a sibling).

With `fuse=False` (opt_level 0) every elementwise node is its own loop and every reduction reads a
buffer: the same arithmetic in the same order, so the same bits.
"""
import math


from ..ops import OPS
from ..ops.nn import RANDOM
from .schedule import (Buffer, Call, Const, Copy, Expr, Gemm, Iota, Literal, Loop, Reduce, Schedule,
                       View)

VIEW_OPS = {"reshape", "permute", "slice", "expand"}
ROLE_CLASS = {"parameter": "parameters", "gradient": "gradients", "optimizer state": "optimizer state"}


def _is_elementwise(node):
    return OPS[node.op].family == "elementwise"


def _broadcast_view(view, shape):
    """View of `view` read at every index of `shape` (numpy broadcasting, right-aligned)."""
    lead = len(shape) - len(view.shape)
    v = View(view.src, (1,) * lead + view.shape, (0,) * lead + view.strides, view.offset)
    return v.expand(shape) if v.shape != tuple(shape) else v


def _load_expr(view):
    if isinstance(view.src, Const):
        return Expr("const", view.dtype, value=view.src.value)
    return Expr("load", view.dtype, view=view)


class _Groups:
    """Union-find over elementwise nodes; a group is open until something outside reads it."""

    def __init__(self):
        self.parent = {}
        self.open = {}
        self.members = {}

    def find(self, n):
        while self.parent[n] != n:
            self.parent[n] = self.parent[self.parent[n]]
            n = self.parent[n]
        return n

    def new(self, n):
        self.parent[n] = n
        self.open[n] = True
        self.members[n] = [n]

    def merge(self, a, b):
        a, b = self.find(a), self.find(b)
        if a == b:
            return a
        self.parent[b] = a
        self.members[a] += self.members.pop(b)
        self.open[a] = self.open[a] and self.open.pop(b)
        return a


def build(graph, target, fuse=True):
    """The Schedule of `graph` for `target` (which says what a product's epilogue may be and how
    each hand-written kernel takes its operands)."""
    nodes = graph.nodes
    index = {id(n): i for i, n in enumerate(nodes)}
    consumers = graph.consumers()
    out_ids = {v.id for v in graph.outputs}

    groups = _Groups()
    absorbed = {}  # index of a reduce node -> group root it absorbs

    def producer_group(v):
        n = v.node
        if _is_elementwise(n) and index[id(n)] in groups.parent:
            return groups.find(index[id(n)])
        return None

    for i, node in enumerate(nodes):
        if _is_elementwise(node):
            groups.new(i)
            if not fuse:
                continue
            for v in node.inputs:
                g = producer_group(v)
                if g is None:
                    continue
                if groups.open[g] and v.shape == node.out.shape:
                    groups.merge(g, i)
                else:
                    groups.open[g] = False
            if fuse and groups.find(i) == i and i > 0 and _sibling(nodes[i - 1], node, groups, i - 1):
                groups.merge(groups.find(i - 1), i)
            continue
        for v in node.inputs:
            g = producer_group(v)
            if g is None:
                continue
            if fuse and node.op in ("sum", "max") and groups.open[g] and _absorbable(
                    g, groups, nodes, node, consumers, out_ids):
                absorbed[i] = g
            groups.open[g] = False

    absorbed_groups = set(absorbed.values())
    last_member = {}
    for i, node in enumerate(nodes):
        if i in groups.parent:
            last_member[groups.find(i)] = i

    builder = _Builder(graph, target, groups, absorbed, absorbed_groups, consumers, out_ids, index)
    for i, node in enumerate(nodes):
        builder.visit(i, node, last_member)
    schedule = builder.finish()
    if fuse:
        schedule.kernels = fuse_epilogues(schedule.kernels, target)
    return schedule


def _sibling(prev, node, groups, p):
    """A node that shares an input with the elementwise node just before it (whose loop is still
    open) joins that loop: one pass over the shared input instead of two (gelu(x) and its slope)."""
    if p not in groups.parent or not groups.open[groups.find(p)] or prev.out.shape != node.out.shape:
        return False
    return bool({v.id for v in prev.inputs} & {v.id for v in node.inputs})


def fuse_epilogues(kernels, target, reach=3):
    """A loop that reads a product's output at its own index becomes the product's epilogue (run
    per output tile), when it follows the product within `reach` kernels, nothing in between
    touches what it reads or writes, and the target's product can carry it. The loop's views are
    re-read as [M, N]."""
    kernels = list(kernels)
    out, k = [], 0
    while k < len(kernels):
        g = kernels[k]
        if isinstance(g, Gemm) and g.epilogue is None:
            for j in range(k + 1, min(k + 1 + reach, len(kernels))):
                loop = kernels[j]
                if not isinstance(loop, Loop) or not _movable(loop, kernels[k + 1:j]):
                    continue
                epi = _as_epilogue(g, loop)
                if epi is not None and target.product_epilogue(g, epi):
                    g.epilogue = epi
                    g.name = f"matmul + {loop.name}"
                    del kernels[j]
                    break
        out.append(g)
        k += 1
    return _siblings_into_epilogues(out, target, reach)


def _siblings_into_epilogues(kernels, target, reach):
    """A loop before a product with an epilogue, over the same [M, N] elements and reading a buffer
    that epilogue reads at the same places, joins the epilogue as more stores: one pass over the
    shared input instead of two (a GELU the backward recomputes, beside its slope in the product
    that multiplies it). The kernels between that read the loop's values move after the product,
    which must be free to run before them. The same arithmetic per element, so the same bits."""
    kernels = list(kernels)
    k = 0
    while k < len(kernels):
        g = kernels[k]
        if isinstance(g, Gemm) and g.epilogue is not None:
            for j in range(k - 1, max(-1, k - 1 - reach), -1):
                loop = kernels[j]
                if not isinstance(loop, Loop):
                    continue
                moved = _reordered_for_sibling(kernels[j + 1:k], loop, g)
                epi = _merged_epilogue(g, loop) if moved is not None else None
                if epi is None or not target.product_epilogue(g, epi):
                    continue
                stay, after = moved
                g.epilogue = epi
                g.name = f"{g.name}, {loop.name}"
                kernels[j:k + 1] = stay + [g] + after
                k = j + len(stay)
                break
        k += 1
    return kernels


def _reordered_for_sibling(between, loop, gemm):
    """(kernels that stay before the product, kernels that move after it) when `loop` can run
    inside `gemm`: those reading the loop's values (or their own) move; None when they cannot."""
    loop_writes = {b.id for b in loop.writes()}
    moving = set(loop_writes)
    stay, after = [], []
    for kern in between:
        reads, writes = _buffers(kern.reads()), {b.id for b in kern.writes()}
        if reads & moving or writes & moving:
            after.append(kern)
            moving |= writes
        else:
            stay.append(kern)
    if not _movable(loop, stay):
        return None
    g_reads, g_writes = _buffers(gemm.reads()), {b.id for b in gemm.writes()}
    if g_reads & loop_writes:
        return None  # the product reads the loop's values: a consumer, not a sibling
    for kern in after:
        kr, kw = _buffers(kern.reads()), {b.id for b in kern.writes()}
        if kw & (g_reads | g_writes) or kr & g_writes:
            return None
    for kern in after:  # a kernel that moves must not trade places with one it conflicts with
        mr, mw = _buffers(kern.reads()), {b.id for b in kern.writes()}
        for s in between[between.index(kern) + 1:]:
            if s in stay:
                sr, sw = _buffers(s.reads()), {b.id for b in s.writes()}
                if sw & (mr | mw) or sr & mw:
                    return None
    return stay, after


def _merged_epilogue(gemm, loop):
    """The gemm's epilogue followed by `loop` re-read over [M, N] (its loads of a view the
    epilogue already loads shared), or None when `loop` does not cover the product's elements,
    reads the product's output, or shares no read with the epilogue."""
    M, N = gemm.out.shape
    epi = gemm.epilogue
    reread = _reread(loop, M, N)
    if reread is None:
        return None
    loop_exprs, loop_stores = reread
    loaded = {}
    for i, e in enumerate(epi.exprs):
        if e.kind == "load" and isinstance(e.view.src, Buffer):
            loaded.setdefault(_view_key(e.view), i)
    exprs, remap, shared = list(epi.exprs), {}, False
    for i, e in enumerate(loop_exprs):
        if e.kind == "load":
            if e.view.src is gemm.out.src:
                return None
            key = _view_key(e.view) if isinstance(e.view.src, Buffer) else None
            if key in loaded and exprs[loaded[key]].dtype is e.dtype:
                remap[i], shared = loaded[key], True
                continue
            exprs.append(e)
        elif e.kind == "op":
            exprs.append(Expr("op", e.dtype, op=e.op, args=[remap[a] for a in e.args], attrs=e.attrs))
        else:
            exprs.append(e)
        remap[i] = len(exprs) - 1
    if not shared:
        return None
    stores = list(epi.stores) + [(v, remap[idx]) for v, idx in loop_stores]
    return Loop(epi.name, epi.loc, (M, N), exprs, stores)


def _view_key(view):
    return (view.src.id, tuple(view.shape), tuple(view.strides), view.offset)


def _buffers(views):
    return {v.src.id for v in views if isinstance(v.src, Buffer)}


def _movable(loop, between):
    """The loop may run before the kernels `between` (none of them writes what it reads, or
    reads or writes what it writes)."""
    reads, writes = _buffers(loop.reads()), {b.id for b in loop.writes()}
    for k in between:
        kr, kw = _buffers(k.reads()), {b.id for b in k.writes()}
        if kw & (reads | writes) or kr & writes:
            return False
    return True


def _reread(loop, M, N):
    """(exprs, stores) of `loop` with every view re-read over [M, N], or None when the loop does not
    cover M x N elements (last dimension N), draws random numbers (their index is the loop's own),
    or a view cannot be re-read."""
    if math.prod(loop.shape) != M * N or (loop.shape[-1] != N if loop.shape else True):
        return None
    if any(e.kind == "op" and e.op in RANDOM for e in loop.exprs):
        return None
    exprs = []
    for e in loop.exprs:
        if e.kind == "load":
            v = e.view.reshape((M, N)) if not isinstance(e.view.src, Const) else View.of(e.view.src, (M, N))
            if v is None:
                return None
            exprs.append(Expr("load", e.dtype, view=v))
        else:
            exprs.append(e)
    stores = []
    for view, idx in loop.stores:
        v = view.reshape((M, N))
        if v is None:
            return None
        stores.append((v, idx))
    return exprs, stores


def _as_epilogue(gemm, loop):
    """The loop re-read over the product's [M, N] output, or None when it does not read that
    output at each element's own index (whether the product can carry it is the target's call)."""
    if len(gemm.a.shape) != 2:
        return None
    M, N = gemm.out.shape
    reread = _reread(loop, M, N)
    if reread is None:
        return None
    exprs, stores = reread
    reads_output = False
    for e in exprs:
        if e.kind == "load" and e.view.src is gemm.out.src:
            if not (e.view.offset == 0 and e.view.strides == (N, 1)):
                return None  # the product's output is read elsewhere than at the element's own index
            reads_output = True
    if not reads_output:
        return None
    return Loop(loop.name, loop.loc, (M, N), exprs, stores)


def _absorbable(g, groups, nodes, reduce_node, consumers, out_ids):
    """A loop can live inside the reduction that reads it when nothing else reads any of its
    values (and it draws no random numbers: their index is the loop's own)."""
    member_nodes = {id(nodes[m]) for m in groups.members[g]}
    for m in groups.members[g]:
        if nodes[m].op in RANDOM:
            return False
        for v in nodes[m].outputs:
            if v.id in out_ids:
                return False
            if any(c is not reduce_node and id(c) not in member_nodes for c in consumers.get(v.id, [])):
                return False
    return True


class _Builder:
    def __init__(self, graph, target, groups, absorbed, absorbed_groups, consumers, out_ids, index):
        self.graph = graph
        self.target = target
        self.groups = groups
        self.absorbed = absorbed
        self.absorbed_groups = absorbed_groups
        self.consumers = consumers
        self.out_ids = out_ids
        self.index = index
        self.s = Schedule()
        self.loc = {}  # value id -> View

    # ---- classes and buffers -------------------------------------------------------------------
    def cls_of(self, v):
        role = self.graph.roles.get(v.id)
        if role in ROLE_CLASS:
            return ROLE_CLASS[role]
        return "io" if v.id in self.out_ids else "activations"

    def new_buffer_for(self, v):
        b = self.s.new_buffer(v.numel, v.dtype, self.cls_of(v), name=f"%{v.id}")
        view = View.of(b, v.shape)
        self.loc[v.id] = view
        return view

    def dense(self, v, name, loc):
        """A dense view of value v, copying it when its view is strided."""
        view = self.loc[v.id]
        if view.is_dense() and isinstance(view.src, Buffer):
            return view
        out = View.of(self.s.new_buffer(v.numel, v.dtype, "activations", name=f"%{v.id} (dense)"), v.shape)
        self._copy_loop(view, out, f"copy {name}", loc)
        return out

    def _copy_loop(self, src_view, out_view, name, loc):
        exprs = [_load_expr(src_view)]
        self.s.kernels.append(Loop(name, loc, out_view.shape, exprs, [(out_view, 0)]))

    # ---- visiting nodes --------------------------------------------------------------------------
    def visit(self, i, node, last_member):
        op = node.op
        if op == "input":
            v = node.out
            cls = ROLE_CLASS.get(self.graph.roles.get(v.id), "io")
            b = self.s.new_buffer(v.numel, v.dtype, cls, name=self.graph.input_names[node.attrs["index"]])
            b.persistent = True
            self.loc[v.id] = View.of(b, v.shape)
            self.s.inputs.append(self.loc[v.id])
            self.s.input_names.append(b.name)
        elif op == "rng_key":
            b = self.s.new_buffer(2, node.out.dtype, "io", name="rng (seed, offset)")
            b.persistent = True
            self.s.rng = b
            self.loc[node.out.id] = View.of(b, (2,))
        elif op == "const":
            self.loc[node.out.id] = View.of(Const(node.attrs["value"], node.attrs["dtype"]), ())
        elif op == "iota":
            self.loc[node.out.id] = View.of(Iota(node.attrs["dtype"]), node.out.shape)
        elif op == "literal":
            lit = Literal(len(self.s.literals), node.attrs["data"], node.attrs["dtype"], node.out.numel)
            self.s.literals.append(lit)
            self.loc[node.out.id] = View.of(lit, node.out.shape)
        elif op in VIEW_OPS:
            self.view_op(node)
        elif i in self.groups.parent:
            root = self.groups.find(i)
            if last_member.get(root) == i and root not in self.absorbed_groups:
                self.loop(root)
        elif op in ("sum", "max", "argmax"):
            self.reduce(i, node)
        elif op == "matmul":
            self.gemm(node)
        elif op in ("pad", "concat"):
            out = self.new_buffer_for(node.out)
            self.s.kernels.append(Copy(op, node.loc, op, [self.loc[v.id] for v in node.inputs], out, node.attrs))
        else:
            self.call(node)

    def view_op(self, node):
        v, a = node.inputs[0], node.attrs
        src = self.loc[v.id]
        if node.op == "reshape":
            out = src.reshape(a["shape"])
            if out is None:
                out = self.dense(v, "reshape", node.loc).reshape(a["shape"])
        elif node.op == "permute":
            out = src.permute(a["perm"])
        elif node.op == "slice":
            out = src.slice(a["starts"], a["stops"], a["steps"])
        else:
            out = src.expand(a["shape"])
        self.loc[node.out.id] = out

    def loop(self, root):
        members = sorted(self.groups.members[root])
        nodes = [self.graph.nodes[m] for m in members]
        shape = nodes[0].out.shape
        exprs, results = self._exprs(nodes, shape)
        local = {n.out.id: r for n, r in zip(nodes, results)}
        kernel_stores = []
        member_set = {id(n) for n in nodes}
        for n in nodes:
            v = n.out
            outside = v.id in self.out_ids or any(id(c) not in member_set for c in self.consumers.get(v.id, []))
            if outside:
                kernel_stores.append((self.new_buffer_for(v), local[v.id]))
        name = ", ".join(dict.fromkeys(n.op for n in nodes))
        loop = Loop(name, nodes[-1].loc, shape, exprs, kernel_stores)
        loop.locs = [n.loc for n in nodes if n.loc]  # (every line fused into it, for its comment)
        self.s.kernels.append(loop)

    def _exprs(self, nodes, shape):
        """Expressions for elementwise `nodes` over iteration `shape`; returns (exprs, result index
        per node). Inputs from outside become (deduplicated) loads of broadcast views."""
        exprs, local, loads = [], {}, {}
        results = []

        def load(v):
            view = _broadcast_view(self.loc[v.id], shape)
            if isinstance(view.src, Const):
                key = ("const", view.src.value, view.src.dtype.name)
                if key not in loads:
                    exprs.append(Expr("const", view.src.dtype, value=view.src.value))
                    loads[key] = len(exprs) - 1
                return loads[key]
            key = (id(view.src), view.strides, view.offset)
            if key not in loads:
                exprs.append(Expr("load", view.dtype, view=view))
                loads[key] = len(exprs) - 1
            return loads[key]

        for n in nodes:
            args = []
            for v in n.inputs:
                if n.op in RANDOM and v is n.inputs[1]:
                    continue  # the random key is read by the kernel itself
                args.append(local[v.id] if v.id in local else load(v))
            exprs.append(Expr("op", n.out.dtype, op=n.op, args=args, attrs=n.attrs))
            local[n.out.id] = len(exprs) - 1
            results.append(len(exprs) - 1)
        return exprs, results

    def reduce(self, i, node):
        x = node.inputs[0]
        if i in self.absorbed:
            members = sorted(self.groups.members[self.absorbed[i]])
            nodes = [self.graph.nodes[m] for m in members]
            exprs, results = self._exprs(nodes, x.shape)
            result = results[[n.out.id for n in nodes].index(x.id)]
            name = ", ".join(dict.fromkeys(n.op for n in nodes)) + f" -> {node.op}"
        else:
            exprs = [_load_expr(_broadcast_view(self.loc[x.id], x.shape))]
            result, name = 0, node.op
        a = node.attrs
        axes = a["axes"] if "axes" in a else (a["axis"],)
        out = self.new_buffer_for(node.out)
        self.s.kernels.append(Reduce(name, node.loc, x.shape, axes, node.op, exprs, result, out))

    def gemm(self, node):
        a, b = (self._gemm_operand(v, node) for v in node.inputs)
        out = self.new_buffer_for(node.out)
        self.s.kernels.append(Gemm("matmul", node.loc, a, b, out))

    def _gemm_operand(self, v, node):
        view = self.loc[v.id]
        if isinstance(view.src, (Buffer, Literal)):
            r, c = view.shape[-2:]
            sr, sc = view.strides[-2:]
            if (sc == 1 and (sr >= c or r == 1)) or (sr == 1 and (sc >= r or c == 1)):
                return view
        out = View.of(self.s.new_buffer(v.numel, v.dtype, "activations", name=f"%{v.id} (dense)"), v.shape)
        self._copy_loop(_broadcast_view(view, v.shape), out, "copy matmul operand", node.loc)
        return out

    def _strided_inputs(self, op):
        return self.target.kernel_abi(op).strided_inputs if OPS[op].family == "kernel" else 0

    def call(self, node):
        abi = self.target.kernel_abi(node.op)
        strided = abi.strided_inputs
        inputs = []
        for k, v in enumerate(node.inputs):
            view = self.loc[v.id]
            if k < strided and isinstance(view.src, Buffer) and view.strides[-1] == 1:
                inputs.append(view)
            else:
                inputs.append(self.dense(v, node.op, node.loc))
        outputs = [self.new_buffer_for(v) for v in node.outputs]
        for k in range(abi.strided_outputs):
            outputs[k] = self._reader_layout(node.outputs[k], outputs[k])
        self.s.kernels.append(Call(node.op, node.loc, node.op, inputs, outputs, node.attrs))

    def _reader_layout(self, v, view):
        """Lay out a kernel output the way its only reader, a permute that keeps the last dim,
        walks it (attention's [B, H, T, D] output is stored as [B, T, H, D]): the permute then
        reads it densely and the reshape after it needs no copy."""
        users = self.consumers.get(v.id, [])
        permutes = [u for u in users if u.op == "permute"]
        strided_ok = all(u.op == "permute" or any(x is v for x in u.inputs[:self._strided_inputs(u.op)])
                         for u in users)
        if v.id in self.out_ids or len(permutes) != 1 or not strided_ok:
            return view
        perm = permutes[0].attrs["perm"]
        if perm[-1] != len(perm) - 1:
            return view
        dense = View.of(view.src, tuple(v.shape[p] for p in perm))  # the buffer, in the reader's order
        inverse = [perm.index(d) for d in range(len(perm))]
        laid = View(view.src, v.shape, [dense.strides[i] for i in inverse], 0)
        self.loc[v.id] = laid
        return laid

    def finish(self):
        s = self.s
        for v in self.graph.outputs:
            view = self.loc[v.id]
            if not isinstance(view.src, Buffer):
                buf = View.of(s.new_buffer(v.numel, v.dtype, "io", name=f"%{v.id}"), v.shape)
                self._copy_loop(_broadcast_view(view, v.shape), buf, "materialize output", None)
                view = buf
            elif v.id in self.graph.updates and not view.is_whole():
                # (a state's new value that is part of another buffer, as ZeRO-1's all-gathered
                # parameters are: copied whole, so that it can take the old value's place)
                buf = View.of(s.new_buffer(v.numel, v.dtype, self.cls_of(v), name=f"%{v.id}"), v.shape)
                self._copy_loop(view, buf, "materialize update", None)
                self.loc[v.id] = view = buf
            view.src.persistent = True
            s.outputs.append(view)
        for vid, role in self.graph.roles.items():  # (a gradient that is a view of its buffer, a bias's
            view = self.loc.get(vid)                   # reshaped sum: the buffer holds the gradient)
            if role == "gradient" and view is not None and isinstance(view.src, Buffer) and view.is_whole() \
                    and view.src.cls == "activations":
                view.src.cls = "gradients"
        s.updates = []
        for new_id, old_id in self.graph.updates.items():
            new, old = self.loc.get(new_id), self.loc.get(old_id)
            if new is not None and old is not None and new.is_whole() and old.is_whole() and new.src is not old.src:
                s.updates.append((new.src, old.src))
        return s
