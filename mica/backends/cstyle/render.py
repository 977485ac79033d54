"""The C-style renderer every C-like target starts from (tinygrad's CStyleLanguage is the model):
a kernel per Schedule entry, named after the user's ops with their file:line, its buffers named
b<id> and found at their planned arena offsets, hand-written kernels called through the target's
registered lowering. A target fills in a handful of hooks: how a kernel function is declared, how
the elements of a loop, a reduction, a product or a copy are iterated, and the file around them."""
import os

from ...passes.schedule import Buffer, Call, Copy, Gemm, Literal, Loop, Reduce
from . import types as ct
from .expr import Accessor


class CStyleRenderer:
    kernel_qualifier = "static void"       # CUDA: __global__ void
    constant_qualifier = "static const"    # CUDA: static __device__ const

    def __init__(self, schedule, plan, name, target):
        self.s = schedule
        self.plan = plan
        self.name = name
        self.target = target
        self.accessor = Accessor(self)
        self._declared = None

    # ---- names -----------------------------------------------------------------------------------
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
                    t = ct.stype(v.src.dtype)
                    lines.append(f"{t} *b{b.id} = ({t} *)(A + {self.plan.offset(b)});"
                                 f"  /* {b.cls}: {b.name or 'b%d' % b.id} */")
        return lines

    def literals(self):
        out = []
        for lit in self.s.literals:
            values = memoryview(lit.data).cast(lit.dtype.np_storage.char if lit.dtype.kind != "bool" else "B")
            items = ", ".join(ct.const(x, lit.dtype) for x in values.tolist())
            out.append(f"{self.constant_qualifier} {ct.stype(lit.dtype)} lit{lit.id}[{max(lit.numel, 1)}] = {{{items}}};")
        return out

    # ---- kernels ---------------------------------------------------------------------------------
    def kernel(self, k, kern):
        where = f" ({os.path.basename(kern.loc[0])}:{kern.loc[1]})" if kern.loc else ""
        title = f"/* k{k}: {kern.name}{where} */"
        self._declared = {}
        helpers = []
        if isinstance(kern, Loop):
            body = self.loop(kern)
            views = [e.view for e in kern.exprs if e.kind == "load"] + [v for v, _ in kern.stores]
            needs_rng = any(e.kind == "op" and e.op == "dropout" for e in kern.exprs)
        elif isinstance(kern, Reduce):
            helpers, body = self.reduce(kern, f"k{k}")
            views = [e.view for e in kern.exprs if e.kind == "load"] + [kern.out]
            needs_rng = False
        elif isinstance(kern, Gemm):
            body = self.product(kern)
            views = [kern.a, kern.b, kern.out]
            if kern.epilogue is not None:
                views += [e.view for e in kern.epilogue.exprs if e.kind == "load"] + [v for v, _ in kern.epilogue.stores]
            needs_rng = False
        elif isinstance(kern, Call):
            body = self.target.lowering(kern.op).rule(self, kern)
            views = list(kern.inputs) + list(kern.outputs)
            needs_rng = self.target.kernel_abi(kern.op).uses_rng(kern.attrs)
        elif isinstance(kern, Copy):
            body = self.copy(kern)
            views = list(kern.inputs) + [kern.out]
            needs_rng = False
        else:
            raise TypeError(kern)
        self._declared = None
        decls = self.declare_pointers(views) + self.workspace_lines()
        if needs_rng:
            decls.append(f"const int64_t *rng = (const int64_t *)(A + {self.plan.offset(self.s.rng)});")
        lines = [title] + helpers + [f"{self.kernel_qualifier} k{k}(char *A) {{"]
        lines += ["    " + x for x in decls + body]
        lines.append("}")
        return lines

    # ---- the hooks a target fills in -------------------------------------------------------------
    def workspace_lines(self):
        """Declarations of the kernel's scratch pointers."""
        ws = self.plan.workspace_offset
        return [f"char *work = A + {ws}, *scratch = A + {ws + self.plan.shared_bytes};", "(void)work; (void)scratch;"]

    def loop(self, kern):
        raise NotImplementedError

    def reduce(self, kern, name):
        raise NotImplementedError

    def product(self, kern):
        raise NotImplementedError

    def copy(self, kern):
        raise NotImplementedError
