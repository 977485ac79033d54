"""Render a Schedule and its MemoryPlan as one C file: a function per kernel, named after the
user's ops with the user's line beside it, and a small C API (mica_run and friends).

The generated file includes the runtime headers (package data next to this module); it is meant
to be read: every kernel says what it computes, where the user wrote it, and which buffers (by
arena offset) it touches.
"""
import os

from ... import __version__, dtypes
from ...passes.schedule import Call
from ..cstyle.expr import ProductLayout
from ..cstyle.render import CStyleRenderer
from .collectives import headers as collective_headers
from . import bf16gemm
from .loops import copy_body, loop_body, reduce_body, tile_body


HALF_PRODUCTS = {"bfloat16": "bf16", "float16": "f16"}  # mica_bf16gemm.h's mica_bf16gemm, mica_f16gemm, ...


class Emitter(CStyleRenderer):
    """The C target's renderer: OpenMP loops (loops.py), products through OpenBLAS tiles or Mica's
    own kernel (bfloat16 and float16 ones through mica_bf16gemm.h), and the C API around the kernels."""

    def __init__(self, schedule, plan, name, target):
        super().__init__(schedule, plan, name, target)
        self.blas = target.blas

    def loop(self, kern):
        return loop_body(self, kern)

    def reduce(self, kern, name):
        return reduce_body(self, kern, name)

    def copy(self, kern):
        return copy_body(self, kern)

    def product(self, kern, name):
        if kern.out.src.id in self.plan.unstored:
            return self.unstored_product(kern, name)
        return [], self.gemm(kern)

    def unstored_product(self, kern, name):
        """A bfloat16 product whose float32 result only its epilogue reads (passes/memory.py's
        `unstored`): the epilogue becomes a function of one block of the sums, which the product
        calls with each block in cache (mica_bf16gemm_stored), and the result has no buffer."""
        a, b, out = kern.a, kern.b, kern.out
        p = ProductLayout(kern)
        epi = kern.epilogue
        views = [e.view for e in epi.exprs if e.kind == "load" and e.view.src is not out.src] + [v for v, _ in epi.stores]
        body = tile_body(self, epi, sums=out.src)
        store = f"{name}_sums"
        helper = [f"/* {name}'s epilogue on the product's float32 sums, rows [r0, r0 + h) and columns [c0, c0 + w)"
                  f" of its [{p.M}, {p.N}] result, a block at a time (sums[r * ld + c]); the result itself is"
                  " never stored */",
                  f"static void {store}(const float *sums, int64_t ld, int64_t r0, int64_t h, int64_t c0, int64_t w, "
                  "char *A) {"]
        helper += ["    " + x for x in self.declare_pointers(views)]
        helper += ["    for (int64_t r = 0; r < h; r++) {",
                   "        const int64_t i0 = r0 + r;",
                   "        #pragma omp simd  /* (elements are independent: loops.py) */",
                   "        for (int64_t c = 0; c < w; c++) {",
                   "            const int64_t i1 = c0 + c;"]
        helper += ["            " + x for x in body] + ["        }", "    }", "}"]
        pa, pb = self.accessor.base(a), self.accessor.base(b)
        call = (f"mica_bf16gemm_stored({p.M}, {p.N}, {p.K}, {pa} + {p.offset(a)}, {p.lda}, {p.ta}, "
                f"{pb} + {p.offset(b)}, {p.ldb}, {p.tb}, {store}, A, work, scratch);")
        return helper, [call]

    def gemm(self, kern):
        a, b, out = kern.a, kern.b, kern.out
        dt = out.dtype
        p = ProductLayout(kern)
        M, N, K, ta, lda, tb, ldb, batch, off = p.M, p.N, p.K, p.ta, p.lda, p.tb, p.ldb, p.batch, p.offset

        pa, pb, pc = self.accessor.base(a), self.accessor.base(b), self.accessor.base(out)
        operands = (f"{M}, {N}, {K}, {pa} + {off(a)}, {lda}, {ta}, {pb} + {off(b)}, {ldb}, {tb}, "
                    f"{pc} + {off(out)}, {N}")  # (C[M,N] = op(A) op(B) at their offsets, for either grid)
        half = HALF_PRODUCTS.get(a.dtype.name)  # (mica_bf16gemm.h's products of half operands)
        if kern.epilogue is not None and half and not batch:
            args = f"{operands}, {int(dt is a.dtype)}, work, scratch"
            body = tile_body(self, kern.epilogue)
            return [f"mica_{half}_product p = mica_{half}_product_make({args});",
                    "#pragma omp parallel if (p.parallel)",
                    "{",
                    f"    mica_{half}_product_begin(&p);",
                    "    #pragma omp for schedule(static)",
                    "    for (int64_t t = 0; t < p.tiles; t++) {  /* each tile of the product, then its epilogue */",
                    "        int64_t r0, r1, c0, c1;",
                    f"        mica_{half}_product_tile(&p, t, &r0, &r1, &c0, &c1);",
                    "        for (int64_t i0 = r0; i0 < r1; i0++)",
                    "            #pragma omp simd  /* (elements are independent: loops.py) */",
                    "            for (int64_t i1 = c0; i1 < c1; i1++) {"] + \
                ["                " + x for x in body] + ["            }", "    }", f"    mica_{half}_product_end(&p);", "}"]
        if kern.epilogue is not None and self.blas == "openblas" and not batch:
            body = tile_body(self, kern.epilogue)
            return [f"mica_product p = mica_product_grid({operands});",
                    "#pragma omp parallel for schedule(static) if (mica_product_parallel(&p))",
                    "for (int64_t t = 0; t < p.tm * p.tn; t++) {",
                    "    int64_t r0, r1, c0, c1;",
                    "    mica_product_tile(&p, t);",
                    "    mica_product_bounds(&p, t, &r0, &r1, &c0, &c1);",
                    "    for (int64_t i0 = r0; i0 < r1; i0++)",
                    "        for (int64_t i1 = c0; i1 < c1; i1++) {"] + \
                ["            " + x for x in body] + ["        }", "}"]
        if half:
            call = (f"mica_{half}gemm({M}, {N}, {K}, {pa} + {off(a)}, {lda}, {ta}, {pb} + {off(b)}, {ldb}, {tb}, "
                    f"{pc} + {off(out)}, {N}, {int(dt is a.dtype)}, work, scratch);")
        elif dt is dtypes.float32 and self.blas == "openblas":
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
        lines = p.over_batch(call)
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
        out += [" *", " * %N below names a value of lowered.ir (program.ir after the passes, renumbered)."]
        if any(b.dtype is dtypes.bfloat16 for b in s.buffers):
            kernel = self.target.bf16_gemm
            out.append(f" * bfloat16 products: the {kernel} kernel (mica_bf16gemm.h), "
                       + bf16gemm.how_chosen(self.target.bf16_asked))
        else:  # (no bfloat16 here: the choice is moot, and left out of the program's source and build key)
            kernel = "f32"
        out += [" */", f"#define MICA_BF16_GEMM {bf16gemm.KERNELS[kernel]}  /* {kernel} */",
                '#include "mica_runtime.h"', '#include "mica_blas.h"', '#include "mica_bf16gemm.h"',
                '#include "mica_kernels.h"']
        out += [f'#include "{h}"' for h in collective_headers(s)] + [""]
        out.append(f"#define MICA_ARENA_BYTES {plan.total}LL")
        out.append(f"#define MICA_MAX_THREADS {self.target.max_threads}")
        out.append("")
        out += self.literals()
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
            f"void *{api}arena_alloc(int64_t bytes) {{",
            "    if (bytes < MICA_ARENA_BYTES) bytes = MICA_ARENA_BYTES;",
            "    void *p = aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));",
            "    if (p) memset(p, 0, (size_t)bytes);",
            "    return p;",
            "}",
            f"void *{api}arena_new(void) {{ return {api}arena_alloc(MICA_ARENA_BYTES); }}",
            f"void {api}arena_free(void *p) {{ free(p); }}",
            "",
            *self.abi_lines(api),
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
SHARED_DIR = os.path.join(os.path.dirname(RUNTIME_DIR), "cstyle")  # mica_math.h, shared with CUDA
RUNTIME_HEADERS = (os.path.join(RUNTIME_DIR, name) for name in
                   ("mica_runtime.h", "mica_gemm.h", "mica_blas.h", "mica_bf16gemm.h", "mica_kernels.h",
                    "mica_collectives.h"))
SHARED_HEADERS = tuple(os.path.join(SHARED_DIR, name) for name in ("mica_math.h", "mica_rows.h", "mica_mpi.h"))
RUNTIME_HEADERS = (*RUNTIME_HEADERS, *SHARED_HEADERS)
INCLUDES = ("-I", RUNTIME_DIR, "-I", SHARED_DIR)
