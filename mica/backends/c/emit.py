"""Render a Schedule and its MemoryPlan as one C file: a function per kernel, named after the
user's ops with the user's line beside it, and a small C API (mica_run and friends).

The generated file includes the runtime headers (package data next to this module); it is meant
to be read: every kernel says what it computes, where the user wrote it, and which buffers (by
arena offset) it touches.
"""
import math
import os

from ... import __version__, dtypes
from ...passes.schedule import Buffer, Call, Copy, Gemm, Literal, Loop, Reduce
from . import ctypes_ as ct
from .loops import Accessor, copy_body, loop_body, reduce_body, tile_body


class Emitter:
    def __init__(self, schedule, plan, name, target):
        self.s = schedule
        self.plan = plan
        self.name = name
        self.target = target
        self.blas = target.blas
        self.accessor = Accessor(self)
        self._declared = None

    # ---- names ---------------------------------------------------------------------------------
    def pointer(self, buf):
        """Local name of a buffer's base pointer inside a kernel function."""
        root = self.plan.root(buf)
        if self._declared is not None:
            self._declared[root.id] = buf
        return f"b{root.id}"

    def ptr(self, view):
        """Pointer expression for the first element of a view (for hand-written kernels)."""
        if isinstance(view.src, Literal):
            return f"(lit{view.src.id} + {view.offset})"
        base = self.pointer(view.src)
        return f"({base} + {view.offset})" if view.offset else base

    def rng_pointer(self):
        return "rng"

    def declare_pointers(self, views):
        seen, lines = set(), []
        for v in views:
            if isinstance(v.src, Buffer):
                b = self.plan.root(v.src)
                if b.id not in seen:
                    seen.add(b.id)
                    lines.append(f"{ct.stype(v.src.dtype)} *b{b.id} = ({ct.stype(v.src.dtype)} *)(A + {self.plan.offset(b)});"
                                 f"  /* {b.cls}: {b.name or 'b%d' % b.id} */")
        return lines

    # ---- kernels ---------------------------------------------------------------------------------
    def kernel(self, k, kern):
        where = f" ({os.path.basename(kern.loc[0])}:{kern.loc[1]})" if kern.loc else ""
        title = f"/* k{k}: {kern.name}{where} */"
        self._declared = {}
        helpers = []
        if isinstance(kern, Loop):
            body = loop_body(self, kern)
            views = [e.view for e in kern.exprs if e.kind == "load"] + [v for v, _ in kern.stores]
            needs_rng = any(e.kind == "op" and e.op == "dropout" for e in kern.exprs)
        elif isinstance(kern, Reduce):
            helpers, body = reduce_body(self, kern, f"k{k}")
            views = [e.view for e in kern.exprs if e.kind == "load"] + [kern.out]
            needs_rng = False
        elif isinstance(kern, Gemm):
            body = self.gemm(kern)
            views = [kern.a, kern.b, kern.out]
            if kern.epilogue is not None:
                views += [e.view for e in kern.epilogue.exprs if e.kind == "load"] + [v for v, _ in kern.epilogue.stores]
            needs_rng = False
        elif isinstance(kern, Call):
            body = self.target.lowering(kern.op).rule(self, kern)
            views = list(kern.inputs) + list(kern.outputs)
            needs_rng = self.target.kernel_abi(kern.op).uses_rng(kern.attrs)
        elif isinstance(kern, Copy):
            body = copy_body(self, kern)
            views = list(kern.inputs) + [kern.out]
            needs_rng = False
        else:
            raise TypeError(kern)
        self._declared = None
        decls = self.declare_pointers(views)
        ws = self.plan.workspace_offset
        decls.append(f"char *work = A + {ws}, *scratch = A + {ws + self.plan.shared_bytes};")
        decls.append("(void)work; (void)scratch;")
        if needs_rng:
            decls.append(f"const int64_t *rng = (const int64_t *)(A + {self.plan.offset(self.s.rng)});")
        lines = [title] + helpers + [f"static void k{k}(char *A) {{"]
        lines += ["    " + x for x in decls + body]
        lines.append("}")
        return lines

    def gemm(self, kern):
        a, b, out = kern.a, kern.b, kern.out
        dt = out.dtype
        M, K = a.shape[-2:]
        N = b.shape[-1]

        def operand(v):
            sr, sc = v.strides[-2:]
            rows, cols = v.shape[-2:]
            if sc == 1 and (sr >= cols or rows == 1):
                return 0, max(sr, cols)
            return 1, max(sc, rows)

        ta, lda = operand(a)
        tb, ldb = operand(b)
        batch = a.shape[:-2]
        names = [f"n{d}" for d in range(len(batch))]

        def off(v):
            terms = [str(v.offset)] + [f"{n} * {st}" for n, st in zip(names, v.strides[:-2]) if st]
            return " + ".join(terms)

        pa, pb, pc = self.accessor.base(a), self.accessor.base(b), self.accessor.base(out)
        if kern.epilogue is not None and self.blas == "openblas" and not batch:
            args = (f"{M}, {N}, {K}, {pa} + {off(a)}, {lda}, {ta}, {pb} + {off(b)}, {ldb}, {tb}, "
                    f"{pc} + {off(out)}, {N}")
            body = tile_body(self, kern.epilogue)
            return [f"mica_product p = mica_product_grid({args});",
                    "#pragma omp parallel for schedule(static) if (mica_product_parallel(&p))",
                    "for (int64_t t = 0; t < p.tm * p.tn; t++) {",
                    "    int64_t r0, r1, c0, c1;",
                    "    mica_product_tile(&p, t);",
                    "    mica_product_bounds(&p, t, &r0, &r1, &c0, &c1);",
                    "    for (int64_t i0 = r0; i0 < r1; i0++)",
                    "        for (int64_t i1 = c0; i1 < c1; i1++) {"] + \
                ["            " + x for x in body] + ["        }", "}"]
        if dt is dtypes.float32 and self.blas == "openblas":
            call = (f"mica_blas_sgemm({M}, {N}, {K}, {pa} + {off(a)}, {lda}, {ta}, {pb} + {off(b)}, {ldb}, {tb}, "
                    f"{pc} + {off(out)}, {N});")
        elif dt is dtypes.float32:
            call = (f"mica_sgemm({M}, {N}, {K}, {pa} + {off(a)}, {lda}, {ta}, {pb} + {off(b)}, {ldb}, {tb}, "
                    f"0.0f, {pc} + {off(out)}, {N}, (float *)work, (float *)scratch);")
        elif dt is dtypes.float64:
            call = (f"mica_dgemm({M}, {N}, {K}, {pa} + {off(a)}, {lda}, {ta}, {pb} + {off(b)}, {ldb}, {tb}, "
                    f"0.0, {pc} + {off(out)}, {N});")
        else:
            from ...errors import MicaError

            raise MicaError(f"matmul on {dt.name} is not supported by the CPU backend yet; cast to float32 first")
        lines, depth = [], 0
        for n, size in zip(names, batch):
            lines.append("    " * depth + f"for (int64_t {n} = 0; {n} < {size}; {n}++)")
            depth += 1
        lines.append("    " * depth + call)
        if kern.epilogue is not None:  # without a tile loop to ride on: after the product, as its own loop
            lines += loop_body(self, kern.epilogue)
        return lines

    # ---- the file --------------------------------------------------------------------------------
    def source(self, report, api="mica_"):
        """The C file. Its entry points are named `api` + run, arena_bytes, ... (several programs
        can then be linked into one executable)."""
        s, plan = self.s, self.plan
        out = [f"/* {self.name}: generated by Mica {__version__}. Regenerate instead of editing.", " *"]
        out += [" * " + line for line in report.splitlines()]
        out += [" */", '#include "mica_runtime.h"', '#include "mica_blas.h"', '#include "mica_kernels.h"', ""]
        out.append(f"#define MICA_ARENA_BYTES {plan.total}LL")
        out.append(f"#define MICA_MAX_THREADS {self.target.max_threads}")
        out.append("")
        for lit in s.literals:
            values = memoryview(lit.data).cast(lit.dtype.np_storage.char if lit.dtype.kind != "bool" else "B")
            items = ", ".join(ct.const(x, lit.dtype) for x in values.tolist())
            out.append(f"static const {ct.stype(lit.dtype)} lit{lit.id}[{max(lit.numel, 1)}] = {{{items}}};")
        fail_after = []
        for k, kern in enumerate(s.kernels):
            out += self.kernel(k, kern)
            out.append("")
            fail_after.append(isinstance(kern, Call) and self.target.kernel_abi(kern.op).may_fail)
        names = ", ".join('"k%d %s"' % (k, kern.name.replace('"', "'")) for k, kern in enumerate(s.kernels))
        out += [
            "/* per-kernel wall time, when built with -DMICA_PROFILE (mica bench --profile) */",
            f"#define MICA_KERNELS {len(s.kernels)}",
            f"static const char *mica_kernel_name[MICA_KERNELS + 1] = {{{names}{', ' if names else ''}0}};",
            "static double mica_kernel_seconds[MICA_KERNELS + 1];",
            f"int {api}kernel_count(void) {{ return MICA_KERNELS; }}",
            f"const char *{api}kernel_label(int k) {{ return mica_kernel_name[k]; }}",
            f"double {api}kernel_time(int k) {{ return mica_kernel_seconds[k]; }}",
            "#ifdef MICA_PROFILE",
            "#define MICA_TIMED(k, call) do { double t0_ = omp_get_wtime(); call; mica_kernel_seconds[k] += omp_get_wtime() - t0_; } while (0)",
            "#else",
            "#define MICA_TIMED(k, call) call",
            "#endif",
            "",
            f"int64_t {api}arena_bytes(void) {{ return MICA_ARENA_BYTES; }}",
            f"int {api}max_threads(void) {{ return MICA_MAX_THREADS; }}",
            f"const char *{api}error(void) {{ return mica_error_text; }}",
            f"void *{api}arena_new(void) {{",
            "    void *p = aligned_alloc(64, (size_t)((MICA_ARENA_BYTES + 63) / 64 * 64));",
            "    if (p) memset(p, 0, (size_t)MICA_ARENA_BYTES);",
            "    return p;",
            "}",
            f"void {api}arena_free(void *p) {{ free(p); }}",
            "",
            "/* Run the program once over `arena`: inputs must be in place; results are left in place. */",
            f"int {api}run(void *arena, int threads, int64_t seed, int64_t offset) {{",
            "    char *A = (char *)arena;",
            "    if (threads < 1 || threads > MICA_MAX_THREADS) {",
            '        snprintf(mica_error_text, sizeof mica_error_text, "threads must be between 1 and %d", MICA_MAX_THREADS);',
            "        return 2;",
            "    }",
            "    omp_set_num_threads(threads);",
            "    mica_blas_init();",
            "    mica_failed = 0;",
        ]
        if s.rng is not None:
            out.append(f"    ((int64_t *)(A + {plan.offset(s.rng)}))[0] = seed;")
            out.append(f"    ((int64_t *)(A + {plan.offset(s.rng)}))[1] = offset;")
        else:
            out.append("    (void)seed; (void)offset;")
        for k, fails in enumerate(fail_after):
            out.append(f"    MICA_TIMED({k}, k{k}(A));" + (" if (mica_failed) return 1;" if fails else ""))
        out += ["    return 0;", "}", ""]
        return "\n".join(out)


RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))
RUNTIME_HEADERS = ("mica_runtime.h", "mica_gemm.h", "mica_blas.h", "mica_kernels.h")
