"""Rematerialization: which forward values the backward keeps, and which it recomputes.

Autodiff leaves the backward reading whatever forward values its VJP rules name: a LayerNorm's
output (for the next product's weight gradient) beside its input and statistics, a GELU's output
beside its input, every intermediate of an elementwise chain. Keeping them all is the activation
peak. As AOTAutograd's min-cut partitioner does, this pass cuts the joint graph: every forward value
the backward reads must reach it either saved or recomputed from saved values, and a max-flow /
min-cut over the forward values between the program's free values (inputs, state, constants: held
anyway) and the backward's reads finds the saved set of the fewest bytes. A node may be recomputed
when it is cheap and exact to repeat: elementwise (casts, GELU, dropout, whose mask is a function
of the Philox key, never stored), views, reductions, and the row kernels (norms, softmax):
a norm's output from its saved statistics by its kernel's own elementwise steps; and embeddings
(a gather: one row copied per index). Products and attention are never recomputed unless a memory
budget asks: first the min-cut may repeat the cheapest products (those of the smallest inner
dimension free the most bytes per FLOP; among them the smallest, then the earliest), as few as the
budget needs; then block checkpoints save the residual stream's bottlenecks and recompute whole
blocks.

Recomputed nodes are copies placed in the backward just before their first reader there, so fusion
puts them in the backward's loops; each copy repeats the forward node's float operations in the
same order, so every bit of the step is the same with or without this pass.
"""
from ..ops import OPS

VIEW_OPS = {"reshape", "permute", "slice", "expand"}
INF = 1 << 120


class Choice:
    """What the pass decided for one program: the values saved for the backward, those recomputed
    there (by the forward nodes copied), and the copies' FLOPs."""

    def __init__(self, mode, saved, recomputed, flops, checkpoints=0):
        self.mode = mode                # "off" | "min-cut" | "checkpoint every k"
        self.saved = saved              # [Value] the backward reads from the forward
        self.recomputed = recomputed    # [Node] forward nodes copied into the backward (not views)
        self.flops = flops              # FLOPs the copies add to a step
        self.checkpoints = checkpoints  # values saved as block boundaries (checkpoint mode)

    @property
    def saved_bytes(self):
        return sum(v.nbytes for v in self.saved)

    @property
    def recomputed_bytes(self):
        """The bytes of the values recomputed: a node's outputs the backward keeps (a layer norm's
        statistics, its output recomputed from them) count as kept, not again here."""
        kept = {v.id for v in self.saved}
        return sum(o.nbytes for n in self.recomputed for o in n.outputs if o.id not in kept)

    def summary(self):
        if self.mode == "off":
            return ("rematerialization off: the backward keeps every forward value it reads "
                    "(a memory budget recomputes instead)")
        ops = {}
        for n in self.recomputed:
            ops[n.op] = ops.get(n.op, 0) + 1
        what = ", ".join(f"{c} {op}" for op, c in sorted(ops.items(), key=lambda x: (-x[1], x[0]))) or "nothing"
        return (f"rematerialization ({self.mode}): the backward keeps {len(self.saved)} forward values "
                f"({self.saved_bytes:,} bytes) and recomputes {len(self.recomputed)} ({self.recomputed_bytes:,} "
                f"bytes: {what}), {_flops(self.flops)} more a step")


def _flops(n):
    return f"{n / 1e9:,.2f} GFLOP" if n >= 1e7 or n == 0 else f"{n / 1e6:,.3f} MFLOP"


def node_flops(node):
    """Floating-point operations of one node, as the copies' cost is reported."""
    op = OPS[node.op]
    if op.flops is not None:
        return op.flops(node)
    if node.op in VIEW_OPS or op.family == "source":
        return 0
    if op.family == "matmul":
        return 2 * node.out.numel * node.inputs[0].shape[-1]
    if op.family == "kernel":
        return 8 * max(v.numel for v in node.inputs)
    if op.family == "reduce":
        return node.inputs[0].numel
    return sum(o.numel for o in node.outputs)


def _recomputable(node, asked, allowed=frozenset()):
    """May the backward recompute `node`: its op record says (asked: under block checkpoints;
    `allowed`: the ids of the products a budget lets the min-cut repeat)."""
    if node.op in ("input", "rng_key"):
        return False
    rule = OPS[node.op].remat
    return rule == "recompute" or (asked and rule == "asked") or (rule == "asked" and id(node) in allowed)


def product_candidates(graph):
    """The forward products a memory budget may let the min-cut recompute, cheapest first: a
    product's output costs 2K FLOPs per element to repeat (K its inner dimension), so the ones of
    smallest K free the most bytes per FLOP; among equals the smallest (a budget is met with the
    least recomputed beyond what it needs), then the earliest (its values are live the longest)."""
    backward = graph.backward_values()
    free = _free_values(graph)
    found = []
    for i, n in enumerate(graph.nodes):
        if n.op == "matmul" and n.out.id not in backward and n.out.id not in free:
            found.append((n.inputs[0].shape[-1], n.out.nbytes, i, n))
    return [t[-1] for t in sorted(found, key=lambda t: t[:3])]


class _Flow:
    """Dinic's max-flow on integer capacities."""

    def __init__(self):
        self.adj, self.to, self.cap = [], [], []

    def vertex(self):
        self.adj.append([])
        return len(self.adj) - 1

    def edge(self, u, v, c):
        self.adj[u].append(len(self.to))
        self.to.append(v)
        self.cap.append(c)
        self.adj[v].append(len(self.to))
        self.to.append(u)
        self.cap.append(0)

    def _levels(self, s):
        level = [-1] * len(self.adj)
        level[s] = 0
        queue = [s]
        for u in queue:
            for e in self.adj[u]:
                if self.cap[e] > 0 and level[self.to[e]] < 0:
                    level[self.to[e]] = level[u] + 1
                    queue.append(self.to[e])
        return level

    def maxflow(self, s, t):
        total = 0
        while True:
            level = self._levels(s)
            if level[t] < 0:
                return total
            it = [0] * len(self.adj)
            while True:
                pushed = self._augment(s, t, level, it)
                if not pushed:
                    break
                total += pushed

    def _augment(self, s, t, level, it):
        """One blocking-flow path found depth-first without recursion; the bottleneck pushed."""
        path, u = [], s
        while True:
            if u == t:
                f = min(self.cap[e] for e in path)
                for e in path:
                    self.cap[e] -= f
                    self.cap[e ^ 1] += f
                return f
            adj = self.adj[u]
            while it[u] < len(adj):
                e = adj[it[u]]
                v = self.to[e]
                if self.cap[e] > 0 and level[v] == level[u] + 1:
                    break
                it[u] += 1
            else:
                if not path:
                    return 0
                level[u] = -1  # dead end
                e = path.pop()
                u = self.to[e ^ 1]
                it[u] += 1
                continue
            path.append(adj[it[u]])
            u = self.to[adj[it[u]]]

    def reachable(self, s):
        seen = {s}
        stack = [s]
        while stack:
            u = stack.pop()
            for e in self.adj[u]:
                if self.cap[e] > 0 and self.to[e] not in seen:
                    seen.add(self.to[e])
                    stack.append(self.to[e])
        return seen


def _norm_from_statistics(graph, node, ins, keep, pending):
    """A norm's output recomputed from its input and its saved statistics by the elementwise steps
    of its kernel (the op record's `from_statistics`), so the same bits; None where that does not
    apply (no such rule, statistics not saved, a mixed-type norm, several normalized dims)."""
    rebuild = OPS[node.op].from_statistics
    if rebuild is None or node.attrs.get("ndims") != 1:
        return None
    x, stats = ins[0], node.outputs[1:]
    if any(v.id not in keep for v in stats) or any(v.dtype is not x.dtype for v in node.outputs):
        return None

    def emit(op, inputs, attrs, shape):
        n = graph.add(op, tuple(inputs), attrs, [(shape, x.dtype)], node.loc, cse=False)
        graph.nodes.pop()
        pending.append(n)
        return n.out

    return rebuild(emit, list(ins) + list(stats), node.attrs)


def _base(v):
    """The value whose storage a view reads (the value itself when it is no view)."""
    while v.node.op in VIEW_OPS:
        v = v.node.inputs[0]
    return v


def _free_values(graph):
    """Values the step holds anyway or needs no memory for: inputs, state, results, constants and
    views of them."""
    held = {v.id for v in graph.outputs} | set(graph.roles) | set(graph.updates) | set(graph.updates.values())
    free = set()
    for n in graph.nodes:
        fam = OPS[n.op].family
        if fam == "source" or any(o.id in held for o in n.outputs) or \
                (n.op in VIEW_OPS and n.inputs[0].id in free):
            free.update(o.id for o in n.outputs)
    return free


def _bottlenecks(graph, region, free, position):
    """Forward values that alone carry the forward from one side of a point to the other (the
    residual stream between blocks), in program order: the places a block checkpoint can be."""
    first = min((position[id(n)] for n in graph.nodes if n.outputs and n.outputs[0].id in region), default=0)
    # this backward's forward: what the values it reads are computed from (not another micro-batch's)
    mine, stack = set(), [u.node for n in graph.nodes[first:] if n.outputs and n.outputs[0].id in region
                          for u in n.inputs if u.id not in region and u.id not in free]
    while stack:
        n = stack.pop()
        if id(n) not in mine:
            mine.add(id(n))
            stack += [u.node for u in n.inputs if u.id not in free]
    forward = [n for n in graph.nodes[:first] if id(n) in mine and n.outputs[0].id not in free
               and n.outputs[0].id not in region and n.op not in VIEW_OPS]
    last_use, defined = {}, {}
    for n in graph.nodes[:first]:
        if id(n) not in mine:
            continue
        for u in n.inputs:
            b = _base(u)
            if b.id not in free and b.node.op not in VIEW_OPS:
                last_use[b.id] = max(last_use.get(b.id, -1), position[id(n)])
    for n in forward:
        for o in n.outputs:
            defined[o.id] = (position[id(n)], o)
    found, live = [], {}
    for n in forward:
        p = position[id(n)]
        for o in n.outputs:
            if last_use.get(o.id, -1) > p:
                live[o.id] = o
        for vid in [vid for vid in live if last_use[vid] <= p]:
            del live[vid]
        if len(live) == 1:
            (v,) = live.values()
            if OPS[v.node.op].family != "source" and (not found or found[-1] is not v):
                found.append(v)
    return found


def rematerialize(graph, mode="min-cut", every=1, products=()):
    """Rewrite `graph` in place (mode "min-cut", letting it recompute the `products` (indices in
    `product_candidates`), or "checkpoint" saving every `every`-th bottleneck of the forward and
    recomputing the rest, products and attention included); returns a Choice."""
    cands = product_candidates(graph) if mode == "min-cut" and products else []
    allowed = frozenset(id(cands[i]) for i in products)
    free = _free_values(graph)
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    consumers = graph.consumers()
    asked = mode == "checkpoint"
    saved, recomputed, flops, n_checkpoints = [], [], 0, 0
    inserts = {}   # index of a node -> copies to place right after it
    for k, region in enumerate(graph.backward):
        forced = set()
        if mode == "checkpoint":
            points = _bottlenecks(graph, region, free, position)
            chosen = points[::-1][::every]
            forced = {v.id for v in chosen}
            n_checkpoints += len(chosen)
            saved += chosen
        cut = _min_cut(graph, region, free | forced, asked, position, allowed)
        saved += [v for v in cut if v.id not in free]
        keep = {v.id for v in cut} | free | forced
        copies, made, anchor = {}, [], {}  # anchor: copy's value id -> the index it is placed after
        region_nodes = [n for n in graph.nodes if n.outputs and n.outputs[0].id in region]

        def resolve(v, pending):
            """v, or its copy in the backward (made, with its own recomputed inputs, into `pending`)."""
            stack = [v]
            while stack:
                w = stack[-1]
                if w.id in keep or w.id in region or w.id in copies:
                    stack.pop()
                    continue
                todo = [u for u in w.node.inputs
                        if not (u.id in keep or u.id in region or u.id in copies)]
                if todo:
                    stack += todo
                    continue
                stack.pop()
                node = w.node
                ins = tuple(u if u.id in keep or u.id in region else copies[u.id] for u in node.inputs)
                norm = _norm_from_statistics(graph, node, ins, keep, pending)
                if norm is not None and w is node.outputs[0]:
                    copies[w.id] = norm
                    made.append(node)
                    continue
                if node.op in VIEW_OPS and all(a is b for a, b in zip(ins, node.inputs)):
                    copies[w.id] = w
                    continue
                new = graph.add(node.op, ins, node.attrs, [(o.shape, o.dtype) for o in node.outputs],
                                node.loc, cse=False)
                graph.nodes.pop()  # placed below, before the backward node that first reads it
                for o, c in zip(node.outputs, new.outputs):
                    copies[o.id] = c
                pending.append(new)
                if node.op not in VIEW_OPS:
                    made.append(node)
            return v if v.id in keep or v.id in region else copies[v.id]

        for n in region_nodes:
            pending = []
            ins = tuple(resolve(u, pending) for u in n.inputs)
            if pending:
                # as early as the reader's other backward operands allow (and after the copies it
                # reuses), so a recomputed slope is ready before the product whose epilogue uses it
                used = {c.id for p in pending for c in p.inputs} | {u.id for u in ins}
                reader = n
                while reader.op in VIEW_OPS and consumers.get(reader.out.id):  # (a view of a copy: where its reader is)
                    reader = consumers[reader.out.id][0]
                others = [position[id(_base(u).node)] for u in reader.inputs if u.id in region and u.id not in copies
                          and _base(u).id not in copies and position[id(_base(u).node)] < position[id(n)]]
                at = max(others + [anchor[c] for c in used if c in anchor], default=position[id(n)] - 1)
                inserts.setdefault(at, []).extend(pending)
                for p in pending:
                    for o in p.outputs:
                        anchor[o.id] = at
            if any(a is not b for a, b in zip(ins, n.inputs)):
                n.inputs = ins
        graph.backward[k] = region | {o.id for p in inserts.values() for c in p for o in c.outputs}
        recomputed += made
        flops += sum(node_flops(n) for n in made)
    if inserts:
        order = inserts.get(-1, [])
        for i, n in enumerate(graph.nodes):
            order.append(n)
            order += inserts.get(i, [])
        graph.nodes = order
    seen = set()
    saved = [v for v in saved if not (v.id in seen or seen.add(v.id))]
    if mode == "min-cut":
        label = "min-cut" if not products else \
            f"min-cut, free to repeat {len(products)} of the forward's cheapest products"
    else:
        label = f"checkpoint every {every} of the forward's bottlenecks"
    return Choice(label, saved, recomputed, flops, n_checkpoints)


def _min_cut(graph, region, free, asked, position, allowed=frozenset()):
    """The forward values to save for the backward `region`: the fewest bytes (ties: the latest
    values, so the least is recomputed) from which every value it reads can be recomputed."""
    needed = {}
    for n in graph.nodes:
        if n.outputs and n.outputs[0].id in region:
            for u in n.inputs:
                if u.id not in region and u.id not in free:
                    needed[u.id] = u
    if not needed:
        return []
    flow = _Flow()
    src, sink = flow.vertex(), flow.vertex()
    vin, vout, values = {}, {}, {}
    n_nodes = len(graph.nodes) + 1
    scale = n_nodes * n_nodes

    def vertices(v):
        if v.id not in vin:
            vin[v.id], vout[v.id] = flow.vertex(), flow.vertex()
            values[v.id] = v
        return vin[v.id], vout[v.id]

    stack, seen = list(needed.values()), set()
    while stack:
        v = stack.pop()
        if v.id in seen:
            continue
        seen.add(v.id)
        i, o = vertices(v)
        if v.id in free:
            continue  # held anyway: reading it costs nothing (no edge: its cut is free)
        node = v.node
        view = node.op in VIEW_OPS
        # saving v costs its bytes (a view costs nothing itself: its base is what is kept);
        # among equal cuts the later value wins, so less is recomputed
        flow.edge(i, o, INF if view else v.nbytes * scale + (n_nodes - position[id(node)]))
        other = any(x.id in b for x in node.outputs for b in graph.backward if b is not region)
        stats = OPS[node.op].from_statistics is not None and v is not node.outputs[0] and not asked
        # (a norm's statistics are a row's two scalars: kept, so its output is a few multiplies away)
        if not _recomputable(node, asked, allowed) or other or stats:
            flow.edge(src, i, INF)
            continue
        for u in node.inputs:
            _, uo = vertices(u)
            flow.edge(uo, i, INF)
            stack.append(u)
    for vid in needed:
        flow.edge(vout[vid], sink, INF)
    flow.maxflow(src, sink)
    reach = flow.reachable(src)
    return [values[vid] for vid in vin if vin[vid] in reach and vout[vid] not in reach]
