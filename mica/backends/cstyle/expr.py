"""Writing a kernel's arithmetic as C-style statements, for every C-style target: one local per
expression (the user's ops in order), loads through strided indices, exact literals, dropout's
Philox mask; and the index arithmetic of strided views (coalescing dims every access walks as
one). A target adds only how the elements are iterated (OpenMP loops, or GPU threads)."""
from ... import dtypes
from ...ops import OPS
from ...passes.schedule import Buffer, Iota, Literal
from . import types as ct


def coalesce(shape, stride_lists):
    """Merge adjacent dims that every access walks as one: [(size, [stride per access])]."""
    dims = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        st = [s[d] for s in stride_lists]
        if dims and all(ps == s * n for ps, s in zip(dims[-1][1], st)):
            dims[-1] = (dims[-1][0] * n, st)
        else:
            dims.append((n, st))
    return dims


class Accessor:
    """How generated code names and indexes the source of a view."""

    def __init__(self, emitter):
        self.e = emitter

    def base(self, view):
        src = view.src
        if isinstance(src, Buffer):
            return self.e.pointer(src)
        if isinstance(src, Literal):
            return f"lit{src.id}"
        raise TypeError(src)


def offset_expr(offset, strides, names):
    terms = [str(offset)] if offset else []
    for s, n in zip(strides, names):
        if s == 0:
            continue
        terms.append(n if s == 1 else f"{n} * {s}")
    return " + ".join(terms) if terms else "0"


class ExprWriter:
    """Writes a kernel's expressions as C statements, one local per expression.

    A float16 expression that a loop stores (`stores`: the kernel's (view, expression) pairs) is
    also kept as its bits, h<k>: the bits loaded, or the rounding's own result, stored as they are.
    Rounding to float16 is a conversion there and back (mica_round_f16), and storing the rounded
    value converted it a third time; a copy converted twice. The bits are the same either way
    (a rounded value converts exactly), only the work differs; bfloat16's conversions are shifts,
    and its stores take the bits of the rounded float (mica_bf16_exact)."""

    def __init__(self, emitter, kernel_exprs, index_of, flat_index=None, stores=(), base=None):
        self.e = emitter
        self.base = base or emitter.accessor.base  # view -> the C array it is read from
        self.exprs = kernel_exprs
        self.index_of = index_of      # view -> C index expression for the current element
        self.flat_index = flat_index  # C expression of the row-major index (dropout)
        self.bits = {k for v, k in stores if v.dtype is dtypes.float16 and self._has_bits(kernel_exprs[k])}
        self.read = {a for x in kernel_exprs for a in x.args}

    @staticmethod
    def _has_bits(x):
        """Whether float16 expression `x` is made as bits: a load from memory or a rounding (not a
        literal, nor an index, which the store rounds)."""
        if x.dtype is not dtypes.float16 or x.kind == "const":
            return False
        return not (x.kind == "load" and isinstance(x.view.src, Iota))

    def lines(self):
        out = []
        for k, x in enumerate(self.exprs):
            t = ct.ctype(x.dtype)
            if k not in self.bits:
                out.append(f"{t} v{k} = {self.value(x)};")
                continue
            ref = f"{self.base(x.view)}[{self.index_of(x.view)}]" if x.kind == "load" else None
            out.append(f"{ct.stype(x.dtype)} h{k} = {ref or self.value(x, rounded=False)};")
            if k in self.read:
                out.append(f"{t} v{k} = {ct.load(x.dtype, f'h{k}')};")
        return out

    def stored(self, k, dtype):
        """The value expression `k` writes to a buffer of `dtype`."""
        if k in self.bits and dtype is dtypes.float16:
            return f"h{k}"
        return ct.store_expr(self.exprs[k], dtype, f"v{k}")

    def value(self, x, rounded=True):
        """Expression `x`'s value, rounded to its type where it is a half type; `rounded=False`:
        its bits (a float16 rounding made once, stored as it is: `bits`)."""
        rnd = ct.rounded if rounded else (lambda dtype, e: ct.store(dtype, e))
        if x.kind == "const":
            return ct.const(x.value, x.dtype)
        if x.kind == "load":
            v = x.view
            if isinstance(v.src, Iota):
                return f"({ct.ctype(x.dtype)})({self.index_of(v)})"
            ref = f"{self.base(v)}[{self.index_of(v)}]"
            return ct.load(x.dtype, ref)
        args = [f"v{a}" for a in x.args]
        if x.op == "cast":
            return self.cast(x, args[0], rnd)
        if x.op == "rand":
            draw = f"mica_uniform(rng, {x.attrs['stream']}u, (uint64_t)({self.flat_index}))"
            return rnd(x.dtype, f"({ct.ctype(x.dtype)}){draw}")
        if x.op == "dropout":
            keep = f"mica_keep(rng, {x.attrs['stream']}u, (uint64_t)({self.flat_index}), {x.attrs['threshold']}u)"
            scale = ct.const(1.0 / (1.0 - x.attrs["p"]), x.dtype)
            return rnd(x.dtype, f"({keep} ? {args[0]} * {scale} : ({ct.ctype(x.dtype)})0)")
        if x.dtype.kind == "int":
            wrapped = ct.integer_arithmetic(x.op, x.dtype, args)
            if wrapped is not None:
                return wrapped
        tmpl = OPS[x.op].c
        if callable(tmpl):
            tmpl = tmpl(x.attrs)
        src_dtype = self.exprs[x.args[0]].dtype if x.args else x.dtype
        t = ct.ctype(x.dtype if x.dtype.kind != "bool" else src_dtype)
        expr = tmpl.format(*args, T=t, S=ct.suffix(src_dtype))
        return rnd(x.dtype, expr)

    def cast(self, x, arg, rnd=ct.rounded):
        src = self.exprs[x.args[0]].dtype if x.args else x.dtype
        dst = x.dtype
        if dst.kind == "bool":
            return f"({arg} != 0)"
        if dst.kind == "int" and src.kind == "float":
            return f"({ct.ctype(dst)})({arg})"
        return rnd(dst, f"({ct.ctype(dst)})({arg})")


def combine(op, dtype, a, b):
    """Two partial results of a reduction combined. A sum of a half type accumulates in float32
    (its compute type) and is rounded once, when stored: every digit is kept, as the oracle's
    float32 mode sums."""
    if op == "sum":
        return ct.integer_arithmetic("add", dtype, (a, b)) if dtype.kind == "int" else f"({a} + {b})"
    if dtype.kind == "float":
        return f"mica_max_{ct.suffix(dtype)}({a}, {b})"
    return f"({a} > {b} ? {a} : {b})"


def reduce_init(op, dtype):
    """The identity a reduction starts from."""
    if op == "sum":
        return ct.const(0, dtype)
    if dtype.kind == "float":
        return "(-INFINITY)"
    return {"int32": "INT32_MIN", "int64": "INT64_MIN", "bool": "0"}[dtype.name]


def loop_statements(renderer, kernel):
    """An elementwise Loop's iteration space and per-element statements, for any C-style target:
    (coalesced dims [(size, strides)], their index names, the statements of one element: loads,
    the expressions, stores). A target wraps them in its own iteration (OpenMP loops, GPU threads)."""
    from ...passes.schedule import row_major

    accesses = [e.view for e in kernel.exprs if e.kind == "load"] + [v for v, _ in kernel.stores]
    dims = coalesce(kernel.shape, [v.strides for v in accesses] + [row_major(kernel.shape)])
    names = [f"i{d}" for d in range(len(dims))]
    strides_of = {id(v): [d[1][k] for d in dims] for k, v in enumerate(accesses)}
    flat_strides = [d[1][-1] for d in dims]

    def index_of(view):
        return offset_expr(view.offset, strides_of[id(view)], names)

    writer = ExprWriter(renderer, kernel.exprs, index_of, offset_expr(0, flat_strides, names), kernel.stores)
    body = writer.lines()
    for view, k in kernel.stores:
        body.append(f"{renderer.accessor.base(view)}[{index_of(view)}] = {writer.stored(k, view.dtype)};")
    return dims, names, body


def product_operand(view):
    """(transposed, leading dimension) of a product operand's [rows, cols] view, row-major terms:
    a unit column stride reads it as it lies, a unit row stride as its transpose."""
    sr, sc = view.strides[-2:]
    rows, cols = view.shape[-2:]
    if sc == 1 and (sr >= cols or rows == 1):
        return 0, max(sr, cols)
    return 1, max(sc, rows)


class ProductLayout:
    """A product C[..., M, N] = A[..., M, K] B[..., K, N] in the terms a BLAS call takes: sizes, each
    operand's (transposed, leading dimension), the batch dims' index names and, per operand, the
    C expression of a batch member's element offset."""

    def __init__(self, kern):
        a, b = kern.a, kern.b
        self.M, self.K = a.shape[-2:]
        self.N = b.shape[-1]
        self.ta, self.lda = product_operand(a)
        self.tb, self.ldb = product_operand(b)
        self.batch = a.shape[:-2]
        self.names = [f"n{d}" for d in range(len(self.batch))]

    def offset(self, view):
        return " + ".join([str(view.offset)] + [f"{n} * {st}" for n, st in zip(self.names, view.strides[:-2]) if st])

    def over_batch(self, call):
        """The statement `call` inside a loop per batch dim."""
        lines = [f"{'    ' * d}for (int64_t {n} = 0; {n} < {size}; {n}++)"
                 for d, (n, size) in enumerate(zip(self.names, self.batch))]
        return lines + ["    " * len(self.batch) + call]


def canonical_sum(names, shape, axes, element_lines, result, comb, tree, init, t):
    """The statements that sum v<result> over `axes` (nested loops, the reduced index r counted in
    row-major order) in the canonical order: eight lanes by index inside blocks of 8192, blocks
    added left to right. They leave the total in `tot`; the caller stores it."""
    lines, pad = [f"{t} a[8] = {{{', '.join([init] * 8)}}}, tot = {init};", "int64_t r = 0;"], ""
    for d in axes:
        lines.append(pad + f"for (int64_t {names[d]} = 0; {names[d]} < {shape[d]}; {names[d]}++) {{")
        pad += "    "
    lines += [pad + x for x in element_lines]
    lines += [pad + f"a[r & 7] = {comb('a[r & 7]', f'v{result}')};",
              pad + "if (++r % 8192 == 0) {",
              pad + f"    tot = r == 8192 ? {tree} : {comb('tot', tree)};",
              pad + f"    for (int l = 0; l < 8; l++) a[l] = {init};",
              pad + "}"]
    for _ in axes:
        pad = pad[:-4]
        lines.append(pad + "}")
    lines.append(f"if (r % 8192 != 0 || r == 0) tot = r <= 8192 ? {tree} : {comb('tot', tree)};")
    return lines
