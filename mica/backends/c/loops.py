"""Generated kernels: elementwise loops, reductions and copies, as readable C.

A loop nest covers the kernel's iteration shape after coalescing the dimensions that every access
walks contiguously; the outer dimensions run in parallel (OpenMP, over outputs only), the inner
one is left for gcc to vectorize. Reductions follow the canonical order of mica_runtime.h (eight
lanes by index inside blocks of 8192, blocks added left to right), whatever the loop shape.
"""
import math

from ...passes.schedule import Const, Iota, row_major
from ..cstyle import types as ct
from ..cstyle.expr import ExprWriter, coalesce, loop_statements, offset_expr
from ..cstyle.expr import canonical_sum, combine as _combine, reduce_init as _init

PARALLEL_MIN = 8192  # elements below which a loop runs on one thread (a parallel region costs more)


def _pragma(total, collapse, simd=False):
    clause = f" collapse({collapse})" if collapse > 1 else ""
    what = "for simd" if simd else "for"
    return f"#pragma omp parallel {what} schedule(static){clause} if ({total} > {PARALLEL_MIN})"


def loop_body(emitter, kernel):
    """C body of an elementwise Loop kernel."""
    dims, names, body = loop_statements(emitter, kernel)
    return _nest(dims, names, body, kernel.shape)


def tile_body(emitter, kernel, sums=None):
    """The statements of a Loop over [M, N] for one element (i0, i1), without the loops: a
    product's epilogue runs them over each of its tiles. `sums`: the product's output buffer, read
    instead from the block of float32 sums in hand (sums[r * ld + c], mica_bf16gemm_stored)."""
    def index_of(view):
        if view.src is sums:
            return "r * ld + c"
        return offset_expr(view.offset, view.strides, ["i0", "i1"])

    def base(view):
        return "sums" if view.src is sums else emitter.accessor.base(view)

    writer = ExprWriter(emitter, kernel.exprs, index_of, f"i0 * {kernel.shape[1]} + i1", kernel.stores, base)
    body = writer.lines()
    for view, k in kernel.stores:
        body.append(f"{emitter.accessor.base(view)}[{index_of(view)}] = {writer.stored(k, view.dtype)};")
    return body


def _nest(dims, names, body, shape):
    lines = []
    total = math.prod(shape)
    if not dims:
        return ["{"] + ["    " + b for b in body] + ["}"]
    # Every element of a Loop is independent (an in-place store writes the very element its own
    # iteration read: memory planning allows nothing else), so the innermost loop is declared
    # `simd`: gcc then vectorizes it without proving that the arena's buffers do not overlap,
    # which it cannot do once OpenMP has moved the loop into a function of its own (it gives up
    # past ten run-time overlap tests, e.g. on AdamW's update). The arithmetic of each element is
    # the same in a vector lane as in a scalar one, so the bits do not change.
    lines.append(_pragma(total, max(1, len(dims) - 1), simd=len(dims) == 1))
    depth = 0
    for d, ((size, _), n) in enumerate(zip(dims, names)):
        if d == len(dims) - 1 and d > 0:
            lines.append("    " * depth + "#pragma omp simd")
        lines.append("    " * depth + f"for (int64_t {n} = 0; {n} < {size}; {n}++) {{")
        depth += 1
    lines += ["    " * depth + b for b in body]
    for d in range(len(dims) - 1, -1, -1):
        lines.append("    " * d + "}")
    return lines


# ---- reductions ------------------------------------------------------------------------------------

def reduce_body(emitter, kernel, name):
    """C body of a Reduce kernel; also returns helper functions it needs (the element value)."""
    if kernel.op == "argmax":
        return _argmax_body(emitter, kernel)
    shape, axes = kernel.in_shape, kernel.axes
    kept = [d for d in range(len(shape)) if d not in axes]
    loads = [e.view for e in kernel.exprs if e.kind == "load"]
    out = kernel.out
    dtype = kernel.exprs[kernel.result].dtype
    t = ct.ctype(dtype)
    R = math.prod(shape[d] for d in axes)
    O = math.prod(shape[d] for d in kept)
    # the element value as a function of (kept index o, reduced index j) when both groups coalesce
    kept_dims = coalesce([shape[d] for d in kept], [[v.strides[d] for d in kept] for v in loads]
                         + [[r for r in row_major([shape[d] for d in kept])]])
    red_dims = coalesce([shape[d] for d in axes], [[v.strides[d] for d in axes] for v in loads]
                        + [[r for r in row_major([shape[d] for d in axes])]])
    simple = len(kept_dims) <= 1 and len(red_dims) <= 1
    comb = lambda a, b: _combine(kernel.op, dtype, a, b)  # noqa: E731
    tree = f"{comb(comb(comb('a[0]', 'a[1]'), comb('a[2]', 'a[3]')), comb(comb('a[4]', 'a[5]'), comb('a[6]', 'a[7]')))}"
    helpers = []
    if simple:
        so = {id(v): (kept_dims[0][1][k] if kept_dims else 0) for k, v in enumerate(loads)}
        sr = {id(v): (red_dims[0][1][k] if red_dims else 0) for k, v in enumerate(loads)}
        writer = ExprWriter(emitter, kernel.exprs,
                            lambda v: offset_expr(v.offset, [so[id(v)], sr[id(v)]], ["o", "j"]))
        fn = f"{name}_value"
        helpers.append(f"static inline {t} {fn}(char *A, int64_t o, int64_t j) {{")
        helpers += ["    " + line for line in emitter.declare_pointers(loads)]
        helpers += ["    (void)o; (void)j;"]
        helpers += ["    " + line for line in writer.lines()]
        helpers.append(f"    return v{kernel.result};")
        helpers.append("}")
        outp = emitter.accessor.base(out)
        columns = bool(kept) and max(axes) < min(kept) if axes else False
        init = _init(kernel.op, dtype)
        if columns and O > 1:
            body = _columns(fn, O, R, t, init, comb, outp, out)
        else:
            body = _rows(fn, O, R, t, init, tree, comb, outp, out)
        return helpers, body
    return _generic(emitter, kernel, t, comb, tree, dtype)


def _store(out, value):
    return ct.store(out.dtype, value)


def _rows(fn, O, R, t, init, tree, comb, outp, out):
    """Reduced axes innermost (or every axis): lanes along j, parallel over outputs or blocks."""
    blocks = max(1, -(-R // 8192))
    lines = []
    block = [
        f"{t} a[8] = {{{', '.join([init] * 8)}}};",
        "int64_t j0 = b * 8192, j1 = j0 + 8192 < R ? j0 + 8192 : R, jb = j0;",
        "for (; jb + 8 <= j1; jb += 8)",
        f"    for (int l = 0; l < 8; l++) a[l] = {comb('a[l]', f'{fn}(A, o, jb + l)')};",
        f"for (int l = 0; jb + l < j1; l++) a[l] = {comb('a[l]', f'{fn}(A, o, jb + l)')};",
        f"part = {tree};",
    ]
    lines.append(f"const int64_t R = {R};")
    if O == 1 and blocks > 1:
        lines.append(f"{t} parts[{blocks}];")
        lines.append(f"#pragma omp parallel for schedule(static) if (R > {PARALLEL_MIN})")
        lines.append(f"for (int64_t b = 0; b < {blocks}; b++) {{")
        lines.append("    const int64_t o = 0;")
        lines.append(f"    {t} part;")
        lines += ["    " + x for x in block]
        lines.append("    parts[b] = part;")
        lines.append("}")
        lines.append(f"{t} tot = parts[0];")
        lines.append(f"for (int64_t b = 1; b < {blocks}; b++) tot = {comb('tot', 'parts[b]')};")
        lines.append(f"{outp}[{out.offset}] = {_store(out, 'tot')};")
        return lines
    lines.append(f"#pragma omp parallel for schedule(static) if ({O} * R > {PARALLEL_MIN} && {O} > 1)")
    lines.append(f"for (int64_t o = 0; o < {O}; o++) {{")
    lines.append(f"    {t} tot = {init}, part;")
    lines.append(f"    for (int64_t b = 0; b < {blocks}; b++) {{")
    lines += ["        " + x for x in block]
    lines.append(f"        tot = b == 0 ? part : {comb('tot', 'part')};")
    lines.append("    }")
    lines.append(f"    {outp}[{out.offset} + o] = {_store(out, 'tot')};")
    lines.append("}")
    return lines


def _columns(fn, O, R, t, init, comb, outp, out):
    """Reduced axes outermost: eight accumulator rows, vectorized along the kept (column) index."""
    blocks = max(1, -(-R // 8192))
    tree = lambda k: comb(comb(comb(f"a[0][{k}]", f"a[1][{k}]"), comb(f"a[2][{k}]", f"a[3][{k}]")),  # noqa: E731
                          comb(comb(f"a[4][{k}]", f"a[5][{k}]"), comb(f"a[6][{k}]", f"a[7][{k}]")))
    return [
        f"const int64_t R = {R};",
        f"#pragma omp parallel for schedule(static) if ({O} * R > {PARALLEL_MIN})",
        f"for (int64_t c0 = 0; c0 < {O}; c0 += 64) {{",
        f"    int64_t cw = {O} - c0 < 64 ? {O} - c0 : 64;",
        f"    {t} a[8][64], tot[64];",
        f"    for (int64_t b = 0; b < {blocks}; b++) {{",
        "        int64_t j0 = b * 8192, j1 = j0 + 8192 < R ? j0 + 8192 : R;",
        f"        for (int l = 0; l < 8; l++) for (int64_t c = 0; c < cw; c++) a[l][c] = {init};",
        "        for (int64_t j = j0; j < j1; j++) {",
        f"            {t} *al = a[(j - j0) & 7];",
        f"            for (int64_t c = 0; c < cw; c++) al[c] = {comb('al[c]', f'{fn}(A, c0 + c, j)')};",
        "        }",
        f"        for (int64_t c = 0; c < cw; c++) tot[c] = b == 0 ? {tree('c')} : {comb('tot[c]', tree('c'))};",
        "    }",
        f"    for (int64_t c = 0; c < cw; c++) {outp}[{out.offset} + c0 + c] = {_store(out, 'tot[c]')};",
        "}",
    ]


def _generic(emitter, kernel, t, comb, tree, dtype):
    """Any axes: nested loops, the reduced index counted in row-major order for the lanes."""
    shape, axes = kernel.in_shape, kernel.axes
    kept = [d for d in range(len(shape)) if d not in axes]
    names = {d: f"i{d}" for d in range(len(shape))}
    writer = ExprWriter(emitter, kernel.exprs, lambda v: offset_expr(v.offset, v.strides, [names[d] for d in range(len(shape))]))
    init = _init(kernel.op, dtype)
    out = kernel.out
    kept_strides = row_major([shape[d] for d in kept])
    oidx = offset_expr(out.offset, kept_strides, [names[d] for d in kept])
    lines = []
    depth = 0
    if kept:
        lines.append(f"#pragma omp parallel for schedule(static) if ({math.prod(shape)} > {PARALLEL_MIN})")
    for d in kept:
        lines.append("    " * depth + f"for (int64_t {names[d]} = 0; {names[d]} < {shape[d]}; {names[d]}++) {{")
        depth += 1
    pad = "    " * depth
    lines += [pad + x for x in canonical_sum(names, shape, axes, writer.lines(), kernel.result, comb, tree, init, t)]
    lines.append(pad + f"{emitter.accessor.base(out)}[{oidx}] = {_store(out, 'tot')};")
    for _ in kept:
        depth -= 1
        lines.append("    " * depth + "}")
    return [], lines


def _argmax_body(emitter, kernel):
    shape, axis = kernel.in_shape, kernel.axes[0]
    names = [f"i{d}" for d in range(len(shape))]
    writer = ExprWriter(emitter, kernel.exprs, lambda v: offset_expr(v.offset, v.strides, names))
    kept = [d for d in range(len(shape)) if d != axis]
    dtype = kernel.exprs[kernel.result].dtype
    out = kernel.out
    oidx = offset_expr(out.offset, row_major([shape[d] for d in kept]), [names[d] for d in kept])
    lines, depth = [], 0
    for d in kept:
        lines.append("    " * depth + f"for (int64_t {names[d]} = 0; {names[d]} < {shape[d]}; {names[d]}++) {{")
        depth += 1
    pad = "    " * depth
    lines += [pad + f"{ct.ctype(dtype)} best = 0; int64_t at = 0;",
              pad + f"for (int64_t {names[axis]} = 0; {names[axis]} < {shape[axis]}; {names[axis]}++) {{"]
    lines += [pad + "    " + x for x in writer.lines()]
    v = f"v{kernel.result}"
    lines += [pad + f"    if ({names[axis]} == 0 || {v} > best || ({v} != {v} && best == best)) {{ best = {v}; at = {names[axis]}; }}",
              pad + "}",
              pad + f"{emitter.accessor.base(out)}[{oidx}] = at;"]
    for _ in kept:
        depth -= 1
        lines.append("    " * depth + "}")
    return [], lines


# ---- copies (pad, concat) ----------------------------------------------------------------------------

def copy_body(emitter, kernel):
    out = kernel.out
    lines = []
    if kernel.op == "pad":
        lines.append(f"memset({emitter.accessor.base(out)} + {out.offset}, 0, {out.numel} * sizeof(*{emitter.accessor.base(out)}));")
        x = kernel.inputs[0]
        dst = out.slice(kernel.attrs["starts"],
                        [b + (n - 1) * s + 1 if n else b for b, n, s in zip(kernel.attrs["starts"], x.shape, kernel.attrs["steps"])],
                        kernel.attrs["steps"])
        lines += _copy_nest(emitter, x, dst)
        return lines
    axis, start = kernel.attrs["axis"], 0
    for x in kernel.inputs:
        starts = [0] * len(out.shape)
        stops = list(out.shape)
        starts[axis], stops[axis] = start, start + x.shape[axis]
        lines += _copy_nest(emitter, x, out.slice(starts, stops, [1] * len(out.shape)))
        start += x.shape[axis]
    return lines


def _copy_nest(emitter, src, dst):
    dims = coalesce(src.shape, [src.strides, dst.strides])
    names = [f"i{d}" for d in range(len(dims))]
    s_idx = offset_expr(src.offset, [d[1][0] for d in dims], names)
    d_idx = offset_expr(dst.offset, [d[1][1] for d in dims], names)
    if isinstance(src.src, Const):  # (stored as the destination holds it: a half type's bits, not the number)
        value = ct.store(dst.dtype, ct.const(src.src.value, src.dtype))
    elif isinstance(src.src, Iota):
        value = ct.store(dst.dtype, f"({ct.ctype(src.dtype)})({s_idx})")
    else:
        value = ct.copied(src.dtype, dst.dtype, f"{emitter.accessor.base(src)}[{s_idx}]")
    return _nest(dims, names, [f"{emitter.accessor.base(dst)}[{d_idx}] = {value};"], src.shape)
