"""The CUDA target's renderer, on the C-style base: every elementwise loop a grid-stride kernel
over its coalesced index space; every reduction a kernel with one thread per output that sums in
the canonical order of mica_math.h (eight lanes by index inside blocks of 8192, blocks left to
right) — the CPU's order, so the result never depends on the launch configuration; pad and concat
as grid-stride copies; products as host calls of one wrapper (mica_cuda.h: cuBLASLt on a card, a
plain CPU product in the simulator). Launches go through MICA_LAUNCH, so only nvcc sees <<<>>>.
"""
import math
import re

from ... import __version__
from ...passes.schedule import Buffer, Call, Const, Gemm, Iota, Literal, Reduce, row_major
from ..cstyle import types as ct
from ..cstyle.expr import Accessor, ExprWriter, coalesce, combine as _combine, loop_statements, offset_expr
from ..cstyle.expr import ProductLayout, canonical_sum, reduce_init as _init
from ..cstyle.render import CStyleRenderer, _c_string, place
from .collectives import headers as collective_headers, setup as collective_setup

THREADS = 256  # threads per block; results do not depend on it (tests change it)

GEMM_SUFFIX = {"float32": "f32", "float64": "f64", "bfloat16": "bf16", "float16": "f16"}  # mica_cuda.h's


def gemm_suffix(a, out):
    """mica_cuda.h's product of operands of `a`'s type giving `out`'s: mica_gemm_bf16, or mica_gemm_bf16_f32
    for half operands whose sums are kept in float32."""
    s = GEMM_SUFFIX[a.dtype.name]
    return s if out.dtype is a.dtype else f"{s}_{GEMM_SUFFIX[out.dtype.name]}"


def _decompose(dims, names, flat="t"):
    """Statements splitting the flat index `flat` into one index per coalesced dim (row-major)."""
    lines, rest = [], flat
    for d in range(len(dims) - 1, -1, -1):
        size = dims[d][0]
        if d == 0:
            lines.append(f"const int64_t {names[d]} = {rest};")
        else:
            lines.append(f"const int64_t {names[d]} = {rest} % {size};")
            lines.append(f"const int64_t q{d} = {rest} / {size};")
            rest = f"q{d}"
    return lines


def _outputs(kern):
    return math.prod(n for d, n in enumerate(kern.in_shape) if d not in kern.axes)


def _reduced(kern):
    return math.prod(kern.in_shape[d] for d in kern.axes)


_KERNEL_NAME = re.compile(r"\bk([0-9]+)(?![0-9])")  # a kernel function's name k<N> (or k<N>_lanes)


def _blocks(R):
    return max(-(-R // 8192), 1)


def cooperative(kern):
    """Does this reduction run by lanes (a thread per output, block and lane, then one per output)?
    When a thread per output would leave the card idle, or walk a long way: the same bits either way."""
    from ...passes.schedule import Reduce

    if not isinstance(kern, Reduce) or kern.op == "argmax":
        return False
    return _reduced(kern) >= 64 and _outputs(kern) < 32768


def ahead(kern):
    """How many of a lane reduction's terms are computed before they are added (their loads in flight
    together). A lane is a chain of up to 1,024 terms whatever the tensor's size, so a thread waits
    on memory 1,024 / ahead times: a gradient norm's square-sums (one or two loads a term, few lanes)
    take 64 terms of 4 bytes (32 of 8), a wider term 16, within the registers a thread has."""
    loads = sum(1 for e in kern.exprs if e.kind == "load")
    if loads > 2:
        return 16
    return 64 if kern.exprs[kern.result].dtype.itemsize <= 4 else 32


def _lane_threads(kern):
    """Threads of a reduction by lanes' first kernel: one per (output, block of 8192, lane)."""
    return _outputs(kern) * _blocks(_reduced(kern)) * 8


def reduce_scratch(kern):
    """Bytes of scratch a cooperative reduction's lane partials take."""
    if not cooperative(kern):
        return 0
    itemsize = kern.exprs[kern.result].dtype.itemsize
    return _lane_threads(kern) * max(itemsize, 4)


def _grid_stride(total, body, block="blockIdx.x", blocks="gridDim.x"):
    """A grid-stride loop over `total` indices t; a kernel run as a member of a group launch is
    given its block and block count (mica_bx, mica_gx) instead of the launch's own. No elements, no
    loop (its body would index dims of size 0)."""
    if total == 0:
        return ["/* no elements: nothing to do */"]
    return ([f"for (int64_t t = {block} * (int64_t)blockDim.x + threadIdx.x; t < {total}; "
             f"t += (int64_t){blocks} * blockDim.x) {{"] + ["    " + b for b in body] + ["}"])


class _CudaAccessor(Accessor):
    """A literal is a __device__ array: device code names it, host code (a product's call) passes the
    device address resolved before the first capture (the array's name there is its host shadow)."""

    def base(self, view):
        if isinstance(view.src, Literal) and self.e.on_host:
            return f"lit{view.src.id}_dev"
        return super().base(view)


class CudaRenderer(CStyleRenderer):
    kernel_qualifier = "static __global__ void MICA_THREAD_BOUNDS"
    constant_qualifier = "static __device__ const"

    def __init__(self, schedule, plan, name, target):
        super().__init__(schedule, plan, name, target)
        self.accessor = _CudaAccessor(self)
        self.on_host = False  # rendering a host function: a literal is named by its device address
        self.launches = []  # per launch unit (groups.py): (its first kernel, the statements that run it, a note)
        self.may_fail = False  # does a kernel check its input (an index in range)?
        # A kernel's functions take their buffers as parameters p0, p1, ... (named in order of first
        # use), so kernels that differ only in their buffers (a layer's, a micro-batch's) are one
        # function, compiled once and launched with each one's pointers.
        self._params = None  # root buffer id -> parameter name, while one kernel's functions are written
        self._pending = []  # (name, type, arena offset) of the parameters just declared
        self._args = {}  # function name -> the arguments a launch passes for its parameters
        self._functions = {}  # a kernel's text, its own name made K -> the kernel that defines it
        # Kernels that share a launch (groups.py) are written as device functions k<N>_at taking the
        # block they run and the block count (mica_bx, mica_gx); a group kernel calls one per block.
        self._block = ("blockIdx.x", "gridDim.x")  # the names a grid-stride loop reads them from
        self._member = False  # writing a group member's functions
        self._sliced = False  # a group member's reduction by lanes: its scratch slice is a parameter, mica_so
        self._types = {}  # function name -> its parameters' pointer types, while one kernel is written
        self._calls = {}  # member k -> (the kernel whose functions it runs, {name: args}, {name: types})
        self._launch_of = {}  # k -> (the statement that runs it alone, a note)

    def pointer(self, buf):
        name = super().pointer(buf)
        if self._params is None:
            return name
        return self._params.setdefault(self.plan.root(buf).id, f"p{len(self._params)}")

    def declare_pointers(self, views):
        """A function's buffers are its parameters: they are noted for function_header, in the order
        of their names; nothing is declared in its body."""
        if self._params is None:
            return super().declare_pointers(views)
        seen = {}
        for v in views:
            if isinstance(v.src, Buffer) and self.plan.root(v.src).id not in seen:
                b = self.plan.root(v.src)
                seen[b.id] = (self.pointer(v.src), ct.stype(v.src.dtype), self.plan.offset(b))
        self._pending = sorted(seen.values(), key=lambda p: int(p[0][1:]))
        return []

    def function_header(self, name, host=False, arena=True):
        params = (["char *A"] if arena else []) + (["cudaStream_t stream"] if host else [])
        params += [f"{t} *{n}" for n, t, _ in self._pending]
        self._args[name] = "".join(f", ({t} *)(A + {off})" for _, t, off in self._pending)
        self._types[name] = [t for _, t, _ in self._pending]
        self._pending = []
        if self._member:  # (a group kernel calls it for the blocks it is given, and a lane reduction its slice)
            return (f"static __device__ __noinline__ void {name}_at(unsigned mica_bx, unsigned mica_gx, "
                    f"{'int64_t mica_so, ' if self._sliced else ''}{', '.join(params)}) {{")
        return f"{'static int' if host else self.kernel_qualifier} {name}({', '.join(params)}) {{"

    def ptr(self, view):
        if isinstance(view.src, Literal) and self.on_host:
            return f"(lit{view.src.id}_dev + {view.offset})"
        return super().ptr(view)

    def literals(self):
        out = super().literals()
        for lit in self.s.literals:
            out.append(f"static const {ct.stype(lit.dtype)} *lit{lit.id}_dev;  /* lit{lit.id}'s device address */")
        out += ["/* the literals' device addresses, for host code (products, attention) to pass */",
                "static int mica_resolve_literals(void) {"]
        for lit in self.s.literals:
            out.append(f"    if (cudaGetSymbolAddress((void **)&lit{lit.id}_dev, lit{lit.id}) != cudaSuccess) "
                       "return mica_cuda_failed(\"finding a constant on the GPU\");")
        out += ["    return 0;", "}", ""]
        return out

    def workspace_lines(self):
        # the scratch pointers a kernel primitive's call may name (nvcc warns of an unused one)
        ws = self.plan.workspace_offset
        return [f"[[maybe_unused]] char *work = A + {ws}, *scratch = A + {ws + self.plan.shared_bytes};"]

    def _grid_stride(self, total, body):
        return _grid_stride(total, body, *self._block)

    # ---- elementwise loops -----------------------------------------------------------------------
    def loop(self, kern):
        dims, names, body = loop_statements(self, kern)
        return self._grid_stride(math.prod(kern.shape), _decompose(dims, names) + body)

    # ---- reductions: a thread per output, the canonical order ------------------------------------
    def reduce(self, kern, name):
        shape, axes = kern.in_shape, kern.axes
        kept = [d for d in range(len(shape)) if d not in axes]
        names = {d: f"i{d}" for d in range(len(shape))}
        writer = ExprWriter(self, kern.exprs,
                            lambda v: offset_expr(v.offset, v.strides, [names[d] for d in range(len(shape))]))
        out = kern.out
        dtype = kern.exprs[kern.result].dtype
        t = ct.ctype(dtype)
        O = math.prod(shape[d] for d in kept)
        kept_dims = [(shape[d], None) for d in kept]
        body = _decompose(kept_dims, [names[d] for d in kept], "t") if kept else []
        oidx = offset_expr(out.offset, row_major([shape[d] for d in kept]), [names[d] for d in kept])
        if kern.op == "argmax":
            axis = axes[0]
            v = f"v{kern.result}"
            body += [f"{t} best = 0; int64_t at = 0;",
                     f"for (int64_t {names[axis]} = 0; {names[axis]} < {shape[axis]}; {names[axis]}++) {{"]
            body += ["    " + x for x in writer.lines()]
            body += [f"    if ({names[axis]} == 0 || {v} > best || ({v} != {v} && best == best)) "
                     f"{{ best = {v}; at = {names[axis]}; }}", "}",
                     f"{self.accessor.base(out)}[{oidx}] = at;"]
            return [], self._grid_stride(O, body)
        comb = lambda a, b: _combine(kern.op, dtype, a, b)  # noqa: E731
        tree = comb(comb(comb("a[0]", "a[1]"), comb("a[2]", "a[3]")), comb(comb("a[4]", "a[5]"), comb("a[6]", "a[7]")))
        init = _init(kern.op, dtype)
        if cooperative(kern):
            return self._reduce_by_lanes(kern, name, writer, names, kept, body, oidx, comb, tree, init, t)
        body += canonical_sum(names, shape, axes, writer.lines(), kern.result, comb, tree, init, t)
        body.append(f"{self.accessor.base(out)}[{oidx}] = {ct.store(out.dtype, 'tot')};")
        return [], self._grid_stride(O, body)

    def _lanes_kernels(self, k, kern):
        where = place(kern)
        self._declared = {}
        helper, body = self.reduce(kern, f"k{k}")
        self._declared = None
        decls = self.declare_pointers([kern.out]) + self.workspace_lines()  # (the combining kernel reads no input)
        return ([f"/* k{k}: {kern.name}{where} */"] + helper + [self.function_header(f"k{k}")]
                + ["    " + x for x in decls + body] + ["}"])

    def _reduce_by_lanes(self, kern, name, writer, names, kept, out_index, oidx, comb, tree, init, t):
        """The canonical order, cooperatively: a thread per (output, block of 8192, lane) sums its lane
        of its block in increasing index (exactly the sequential code's partial), into scratch; then a
        thread per output adds the lanes by the same tree and the blocks left to right."""
        shape, axes, out = kern.in_shape, kern.axes, kern.out
        O, R = _outputs(kern), math.prod(shape[d] for d in axes)
        nblk = _blocks(R)
        part = f"(({t} *)(scratch + mica_so))" if self._sliced else f"(({t} *)scratch)"
        lanes = [f"const int64_t o = t % {O}, lane = (t / {O}) % 8, blk = t / {O * 8};"]
        lanes += _decompose([(shape[d], None) for d in kept], [names[d] for d in kept], "o") if kept else []
        lanes += [f"(void){names[d]};" for d in kept]  # (a broadcast load may not need every index)
        red = _decompose([(shape[d], None) for d in axes], [names[d] for d in axes], "r")
        term = red + writer.lines()  # (the term of index r: v<result>)
        AHEAD = {64: "MICA_AHEAD64", 32: "MICA_AHEAD32"}.get(ahead(kern), ahead(kern))  # (mica_cuda.h: 16 on sm_120)
        # a thread's chain of adds waits on its loads: AHEAD terms are computed first (their loads in
        # flight together), then added in order, the same sum bit for bit; the rest one at a time
        lanes += [f"{t} acc = {init};",
                  f"const int64_t r1 = blk * 8192 + 8192 < {R} ? blk * 8192 + 8192 : {R};",
                  "int64_t r0 = blk * 8192 + lane;",
                  f"for (; r0 + 8 * ({AHEAD} - 1) < r1; r0 += 8 * {AHEAD}) {{",
                  f"    {t} ahead[{AHEAD}];",
                  f"    MICA_UNROLL({AHEAD})",
                  f"    for (int u = 0; u < {AHEAD}; u++) {{",
                  "        const int64_t r = r0 + 8 * u;"]
        lanes += ["        " + x for x in term]
        lanes += [f"        ahead[u] = v{kern.result};", "    }",
                  f"    MICA_UNROLL({AHEAD})",
                  f"    for (int u = 0; u < {AHEAD}; u++) acc = {comb('acc', 'ahead[u]')};", "}",
                  "for (int64_t r = r0; r < r1; r += 8) {"]
        lanes += ["    " + x for x in term]
        lanes += [f"    acc = {comb('acc', f'v{kern.result}')};", "}",
                  f"{part}[(o * {nblk} + blk) * 8 + lane] = acc;"]
        helper_decls = self.declare_pointers([e.view for e in kern.exprs if e.kind == "load"]) + self.workspace_lines()
        helper = ([f"/* {name}'s lanes: a thread per (output, block, lane) */", self.function_header(f"{name}_lanes")]
                  + ["    " + x for x in helper_decls + self._grid_stride(_lane_threads(kern), lanes)] + ["}", ""])
        body = list(out_index) + [f"{t} tot = {init};",
                                  f"for (int64_t blk = 0; blk < {nblk}; blk++) {{",
                                  f"    const {t} *a = {part} + (o_ * {nblk} + blk) * 8;",
                                  f"    tot = blk == 0 ? {tree} : {comb('tot', tree)};", "}",
                                  f"{self.accessor.base(out)}[{oidx}] = {ct.store(out.dtype, 'tot')};"]
        body = ["const int64_t o_ = t;"] + body
        return helper, self._grid_stride(O, body)

    # ---- pad and concat --------------------------------------------------------------------------
    def copy(self, kern):
        out = kern.out
        if kern.op == "pad":  # each output element: its input element, or zero outside it
            x, starts, steps = kern.inputs[0], kern.attrs["starts"], kern.attrs["steps"]
            dims = [(n, None) for n in out.shape]
            names = [f"o{d}" for d in range(len(out.shape))]
            body = _decompose(dims, names, "t") if dims else []
            conds, src = [], []
            for d, (s0, st, n) in enumerate(zip(starts, steps, x.shape)):
                body.append(f"const int64_t s{d} = o{d} - {s0};")
                conds.append(f"s{d} >= 0 && s{d} % {st} == 0 && s{d} / {st} < {n}")
                src.append(f"s{d} / {st}")
            s_idx = " + ".join([str(x.offset)] + [f"({e}) * {st}" for e, st in zip(src, x.strides) if st]) or "0"
            d_idx = offset_expr(out.offset, out.strides, names)
            value = self._element(x, s_idx)
            cond = " && ".join(conds) or "1"
            body.append(f"{self.accessor.base(out)}[{d_idx}] = ({cond}) ? {value} : {ct.const(0, out.dtype)};")
            return self._grid_stride(out.numel, body)
        axis, start, lines = kern.attrs["axis"], 0, []
        for x in kern.inputs:  # disjoint slices of the output: no ordering between them
            starts, stops = [0] * len(out.shape), list(out.shape)
            starts[axis], stops[axis] = start, start + x.shape[axis]
            dst = out.slice(starts, stops, [1] * len(out.shape))
            dims = coalesce(x.shape, [x.strides, dst.strides])
            names = [f"i{d}" for d in range(len(dims))]
            s_idx = offset_expr(x.offset, [d[1][0] for d in dims], names)
            d_idx = offset_expr(dst.offset, [d[1][1] for d in dims], names)
            body = _decompose(dims, names) + [f"{self.accessor.base(dst)}[{d_idx}] = "
                                              f"{self._element(x, s_idx, dst.dtype)};"]
            lines += self._grid_stride(x.numel, body)
            start += x.shape[axis]
        return lines

    def _load(self, x, idx):
        if isinstance(x.src, Const):
            return ct.const(x.src.value, x.dtype)
        if isinstance(x.src, Iota):
            return f"({ct.ctype(x.dtype)})({idx})"
        return ct.load(x.dtype, f"{self.accessor.base(x)}[{idx}]")

    def _element(self, x, idx, dtype=None):
        """Element `idx` of view `x` stored as a `dtype` element (x's own type by default): a
        buffer's bits as they are where the types are the same."""
        dtype = dtype or x.dtype
        if isinstance(x.src, (Const, Iota)):
            return ct.store(dtype, self._load(x, idx))
        return ct.copied(x.dtype, dtype, f"{self.accessor.base(x)}[{idx}]")

    # ---- products: host calls (mica_gemm_<type>) --------------------------------------------------------------------
    def product(self, kern, name):
        raise AssertionError("products are host calls (see kernel)")

    def kernel(self, k, kern, member=False):
        """kernel k's functions (none where an earlier kernel's text is the same: it is launched with
        k's buffers), and its launch noted for mica_enqueue; or, as a `member` of a group launch,
        device functions, the call noted for the group (which passes a lane reduction its slice of
        the scratch)."""
        self._params, self._args, self._types = {}, {}, {}
        self._member = member
        self._sliced = self._member and isinstance(kern, Reduce) and cooperative(kern)
        self._block = ("mica_bx", "mica_gx") if self._member else ("blockIdx.x", "gridDim.x")
        try:
            lines, launch = self._kernel(k, kern)
        finally:
            self._params, self._member, self._sliced = None, False, False
            self._block = ("blockIdx.x", "gridDim.x")

        def own(name):  # (k's name, and its lanes kernel's k<k>_lanes, made `name`)
            return lambda m: name if m.group(1) == str(k) else m.group(0)

        c = self._functions.setdefault(_KERNEL_NAME.sub(own("K"), "\n".join(lines[1:])), k)  # (lines[0]: its title)
        if member:
            self._calls[k] = (c, self._args, self._types)
        else:  # (a launch of another kernel's function: k's title beside it, for a reader and the profile)
            self._launch_of[k] = (_KERNEL_NAME.sub(own(f"k{c}"), launch), "" if c == k else f"  {lines[0]}")
        return lines if c == k else []

    def group(self, unit):
        """The group kernels of a unit of several kernels (groups.py): the first runs every member's
        (a reduction by lanes: its lanes'), the second the lane reductions' sums; each block runs
        one member, given its block among the member's own and their count, so every member runs
        exactly as its own launch would. (lines, the statement that launches them)"""
        first = unit.members[0]
        phases = [[], []]
        for k in unit.members:
            kern = self.s.kernels[k]
            c, args, types = self._calls[k]
            if isinstance(kern, Reduce) and cooperative(kern):  # (its scratch slice's offset passed first)
                at = f"{unit.scratch[k]}, "
                phases[0].append((k, f"k{c}_lanes_at", at, args[f"k{k}_lanes"], types[f"k{k}_lanes"],
                                  _lane_threads(kern)))
                phases[1].append((k, f"k{c}_at", at, args[f"k{k}"], types[f"k{k}"], self._work(kern)))
            else:
                phases[0].append((k, f"k{c}_at", "", args[f"k{k}"], types[f"k{k}"], self._work(kern)))
        titles = ", ".join(f"k{k}" for k in unit.members)
        lines = [f"/* g{first}: kernels {titles}, independent of each other, in one launch (a block runs one) */"]
        launches = []
        for name, calls in ((f"g{first}", phases[0]), (f"g{first}_sums", phases[1])):
            if not calls:
                continue
            params, body, passed, counts, q = [], [], "", [], 0
            for k, fn, at, args, types, work in calls:
                mine = [f"q{q + i}" for i in range(len(types))]
                params.append(f"    {', '.join(f'{t} *{n}' for t, n in zip(types, mine))},  /* k{k} */")
                q += len(types)
                body += [f"    if (b < (n = mica_blocks({work}))) {{ {fn}(b, n, {at}A{''.join(', ' + x for x in mine)}); "
                         f"return; }}  /* k{k} */", "    b -= n;"]
                passed += args
                counts.append(f"mica_blocks({work})")
            params[-1] = params[-1].replace(",  /*", ") {  /*", 1)
            lines += [f"static __global__ void MICA_THREAD_BOUNDS {name}(char *A,", *params, "    unsigned b = blockIdx.x, n;", *body, "}"]
            launches.append(f"MICA_LAUNCH({name}, {' + '.join(counts)}, MICA_THREADS, 0, stream, A{passed});")
        names = sorted({self.s.kernels[k].name for k in unit.members})
        note = f"  /* k{first}: group [{'; '.join(names)}] of {len(unit.members)} kernels */"
        return lines + [""], (" ".join(launches), note)

    def _kernel(self, k, kern):
        """(kernel k's lines, the statement that runs it with k's buffers)"""
        if isinstance(kern, Call) and self.target.lowering(kern.op).host:
            lines = self.host_call(k, kern)
            return lines, f"if (k{k}(A, stream{self._args[f'k{k}']}) != 0) return 1;"
        if not isinstance(kern, Gemm):
            if isinstance(kern, Call) and self.target.kernel_abi(kern.op).may_fail:
                self.may_fail = True  # (its flag is read once the step has run)
            lanes = isinstance(kern, Reduce) and cooperative(kern)
            lines = self._lanes_kernels(k, kern) if lanes else super().kernel(k, kern)
            launch = f"MICA_LAUNCH(k{k}, mica_blocks({self._work(kern)}), MICA_THREADS, 0, stream, A{self._args[f'k{k}']});"
            if lanes:
                launch = (f"MICA_LAUNCH(k{k}_lanes, mica_blocks({_lane_threads(kern)}), "
                          f"MICA_THREADS, 0, stream, A{self._args[f'k{k}_lanes']}); " + launch)
            return lines, launch
        a, b, out = kern.a, kern.b, kern.out
        s = gemm_suffix(a, out)
        p = ProductLayout(kern)
        off = p.offset
        self._declared, self.on_host = {}, True
        pa, pb, pc = self.accessor.base(a), self.accessor.base(b), self.accessor.base(out)
        self._declared, self.on_host = None, False
        call = (f"if (mica_gemm_{s}(stream, {p.M}, {p.N}, {p.K}, {pa} + {off(a)}, {p.lda}, {p.ta}, {pb} + {off(b)}, "
                f"{p.ldb}, {p.tb}, {pc} + {off(out)}, {p.N}) != 0) return 1;")
        # (a product needs no arena: its buffers are its parameters, and cuBLASLt has its own workspace)
        lines = self._host_function(k, kern, "a product", self.declare_pointers([a, b, out]), p.over_batch(call),
                                    arena=False)
        return lines, f"if (k{k}(stream{self._args[f'k{k}']}) != 0) return 1;"

    def host_call(self, k, kern):
        """A kernel primitive whose lowering runs on the host and launches its own device work."""
        if self.target.kernel_abi(kern.op).may_fail:
            self.may_fail = True  # (its flag is read once the step has run)
        self._declared, self.on_host = {}, True
        body = self.target.lowering(kern.op).rule(self, kern)
        used, self._declared, self.on_host = self._declared, None, False
        views = [v for v in list(kern.inputs) + list(kern.outputs)
                 if isinstance(v.src, Buffer) and self.plan.root(v.src).id in used]  # (the rng is named apart)
        decls = self.declare_pointers(views) + self.workspace_lines()
        if self.target.kernel_abi(kern.op).uses_rng(kern.attrs):
            decls.append(f"const int64_t *rng = (const int64_t *)(A + {self.plan.offset(self.s.rng)});")
        return self._host_function(k, kern, "launched from the host", decls, body)

    def _host_function(self, k, kern, what, decls, body, arena=True):
        where = place(kern)
        return ([f"/* k{k}: {kern.name}{where}: {what} */", self.function_header(f"k{k}", host=True, arena=arena)]
                + ["    " + x for x in decls + body] + ["    return 0;", "}"])

    @staticmethod
    def _work(kern):
        from ...passes.schedule import Copy, Loop, Reduce

        if isinstance(kern, Call):  # rows (or columns, or vocabulary rows), 8 threads each
            from .lowerings import threads

            return threads(kern)
        if isinstance(kern, Loop):
            return max(math.prod(kern.shape), 1)
        if isinstance(kern, Reduce):
            return max(math.prod(n for d, n in enumerate(kern.in_shape) if d not in kern.axes), 1)
        if isinstance(kern, Copy):
            return max(kern.out.numel, 1)
        return 1

    # ---- the ABI's copies go through the device ----------------------------------------------------
    def copy_to_arena(self, dst, src, n):
        return f"mica_check(cudaMemcpy({dst}, {src}, (size_t)({n}), cudaMemcpyHostToDevice));"

    def copy_from_arena(self, dst, src, n):
        return f"mica_check(cudaMemcpy({dst}, {src}, (size_t)({n}), cudaMemcpyDeviceToHost));"

    # ---- the file --------------------------------------------------------------------------------
    ENQUEUE_PART = 64  # launches per function of mica_enqueue (the host compiler slows down more than
    # linearly in one function's length: GPT-2 small's 12,950 in one took it minutes)

    def enqueue_lines(self):
        """mica_enqueue: every kernel and product of one run, in order, in functions of ENQUEUE_PART."""
        self.launches = [(u.members[0], *self._launch_of[u.members[0]]) for u in self.units]
        parts = [self.launches[i:i + self.ENQUEUE_PART] for i in range(0, len(self.launches), self.ENQUEUE_PART)]
        out = ["/* Every kernel and product of one run, in order, on `stream` (captured into the graph); each",
               " * followed by a mark, which records an event only in a run that MICA_PROFILE times (mica_cuda.h). */"]
        for j, part in enumerate(parts):
            out += [f"static int mica_enqueue_{j}(char *A, cudaStream_t stream) {{",
                    "    (void)A;  /* (products alone would not name it) */",
                    *[f"    {x} MICA_MARK(stream, {k});{note}" for k, x, note in part], "    return 0;", "}"]
        out += ["static int mica_enqueue(char *A, cudaStream_t stream) {",
                *[f"    if (mica_enqueue_{j}(A, stream) != 0) return 1;" for j in range(len(parts))],
                "    (void)A; (void)stream;", "    return 0;", "}", ""]
        return out

    def buffer_table(self):
        """A comment naming what lies where in the arena (the launches pass `A + offset`): each root
        buffer's offset, bytes, class and value."""
        roots = sorted({self.plan.root(b).id: self.plan.root(b) for b in self.s.buffers}.values(),
                       key=lambda b: (self.plan.offset(b), b.id))
        lines = ["/* the arena: A + offset, bytes, class: value (what the launches below pass)"]
        lines += [f" *   A + {self.plan.offset(b):<12} {b.nbytes:>12}  {b.cls}: {b.name or 'b%d' % b.id}"
                  for b in roots if b.nbytes]
        return lines + [" */", ""]

    def source(self, report, api="mica_"):
        s, plan = self.s, self.plan
        out = [f"/* {self.name}: generated by Mica {__version__} for CUDA. Regenerate instead of editing.", " *"]
        out += [" * " + line for line in report.splitlines()]
        out += [" *", " * %N below names a value of lowered.ir (program.ir after the passes, renumbered)."]
        out += [" *", " * Built by Mica's nvcc command (mica.backends.cuda.build.nvcc_command): its headers are in Mica's",
                " * mica/backends/cuda and mica/backends/cstyle, cuBLASLt's in the nvidia-cublas wheel."]
        out += [" */", *(["#define MICA_TF32 1  /* tf32=True: cuBLASLt's float32 products may round to TF32 */"]
                         if self.target.tf32 else []), "#ifndef MICA_THREADS",
                f"#define MICA_THREADS {self.target.threads_per_block or THREADS}  /* per block: the results do not "
                "depend on it */", "#endif",
                '#include "mica_cuda.h"', '#include "mica_cuda_kernels.h"', '#include "mica_cuda_attention.h"',
                '#include "mica_cuda_attention_gemm.h"', '#include "mica_cuda_sweeps.h"',
                *[f'#include "{h}"' for h in collective_headers(s)], "", f"#define MICA_ARENA_BYTES {plan.total}LL", ""]
        out += self.buffer_table()
        from .groups import launch_units, single_units

        self.units = launch_units(s, plan, self.target) if self.target.group_launches else single_units(s)
        members = {k for u in self.units if len(u.members) > 1 for k in u.members}
        kernels = []
        for k, kern in enumerate(s.kernels):
            kernels += self.kernel(k, kern, k in members) + [""]
        for u in self.units:
            if len(u.members) > 1:
                lines, self._launch_of[u.members[0]] = self.group(u)
                kernels += lines
        if any("mica_attention_tc" in line for line in kernels):  # (only then: it brings in nvcc's mma.h)
            out.insert(out.index('#include "mica_cuda_sweeps.h"') + 1, '#include "mica_cuda_attention_tc.h"')
        out += self.literals() + kernels
        out += [
            "/* the program's C API (callable from C, Python's ctypes, the trainer) */",
            'extern "C" {',
            f"int64_t {api}arena_bytes(void) {{ return MICA_ARENA_BYTES; }}",
            f"const char *{api}error(void) {{ return mica_error_text; }}",
            f"void *{api}arena_alloc(int64_t bytes) {{",
            "    void *p = 0;",
            "    if (bytes < MICA_ARENA_BYTES) bytes = MICA_ARENA_BYTES;",
            "    if (!mica_cuda_ready()) return 0;",
            "    if (cudaMalloc(&p, (size_t)bytes) != cudaSuccess) {",
            "        snprintf(mica_error_text, sizeof mica_error_text, \"the GPU has no room for the %s program's %lld "
            "bytes (%s); train a smaller model or batch, or free the GPU\", " + _c_string(self.name)
            + ", (long long)bytes, cudaGetErrorString(cudaGetLastError()));",
            "        return 0;",
            "    }",
            "    if (cudaMemset(p, 0, (size_t)bytes) != cudaSuccess) { cudaFree(p); return 0; }",
            "    return p;",
            "}",
            f"void *{api}arena_new(void) {{ return {api}arena_alloc(MICA_ARENA_BYTES); }}",
            f"void {api}arena_free(void *p) {{ cudaFree(p); }}",
            "",
            *self.abi_lines(api),
            *self.enqueue_lines(),
            "/* Run the program once over `arena` (device memory): inputs must be in place; results are left in place.",
            " * The whole run is one CUDA graph, captured on the first run over an arena and replayed after (a",
            " * product shape the products record lacks is timed after the first capture, which is then redone). */",
            f"int {api}run(void *arena, int threads, int64_t seed, int64_t offset) {{",
            "    static cudaStream_t stream;",
            "    static cudaGraphExec_t graph;",
            "    static void *graph_arena;",
            "    static long runs;",
            "    (void)threads;",
            "    char *A = (char *)arena;",
            "    if (!stream && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)",
            "        return mica_cuda_failed(\"creating a stream\");",
        ]
        if s.rng is not None:
            new_rng = ["    int64_t key[2] = {seed, offset};",
                       f"    if (cudaMemcpy(A + {plan.offset(s.rng)}, key, sizeof key, cudaMemcpyHostToDevice) "
                       "!= cudaSuccess) return mica_cuda_failed(\"copying the random key\");"]
        else:
            new_rng = ["    (void)seed; (void)offset;"]
        out += new_rng
        out += ["    if (graph_arena != arena) {",
                "        if (graph) cudaGraphExecDestroy(graph);",
                "        graph = 0, graph_arena = 0;",
                *["        " + line for line in collective_setup(s)],
                "        if (mica_resolve_literals() != 0 || mica_capture(stream, A, mica_enqueue, &graph) != 0) return 1;",
                "        graph_arena = arena;",
                "    }",
                "    /* (the ABI's copies run on the legacy stream, and a copy from pageable memory may still be on its",
                "     * way when cudaMemcpy returns: the graph's stream does not wait for it by itself) */",
                "    if (cudaDeviceSynchronize() != cudaSuccess) return mica_cuda_failed(\"copying the inputs\");",
                "    if (mica_profile_due(++runs)) {  /* (MICA_PROFILE: this run kernel by kernel, outside the graph) */",
                f"        if (mica_profile_run({_c_string(self.name)}, stream, A, mica_enqueue) != 0) return 1;",
                "    } else if (cudaGraphLaunch(graph, stream) != cudaSuccess || cudaStreamSynchronize(stream) != cudaSuccess) {",
                "        return mica_cuda_failed(\"running the program\");",
                "    }",
                "    if (cudaGetLastError() != cudaSuccess) return mica_cuda_failed(\"running the program\");"]
        if self.may_fail:
            out.append("    if (mica_cuda_kernel_failed()) return 1;")
        out += ["    return 0;", "}", "}  /* extern \"C\" */", ""]
        return "\n".join(out)
