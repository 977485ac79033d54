"""The C-style renderer every C-like target starts from (tinygrad's CStyleLanguage is the model):
a kernel per Schedule entry, named after the user's ops with their file:line, its buffers named
b<id> and found at their planned arena offsets, hand-written kernels called through the target's
registered lowering. A target fills in a handful of hooks: how a kernel function is declared, how
the elements of a loop, a reduction, a product or a copy are iterated, and the file around them."""
import os

import numpy as np

from ...passes.schedule import Buffer, Call, Copy, Gemm, Literal, Loop, Reduce
from ...errors import MicaError
from ...ops.nn import RANDOM
from . import types as ct
from .expr import Accessor


DTYPE_CODES = {"float32": "F32", "float64": "F64", "int64": "I64", "int32": "I32", "bfloat16": "BF16",
               "float16": "F16", "bool": "BOOL"}


def _c_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'




def place(kern):
    """' (model.py:33-36)': the user's lines a kernel computes (a fused loop's, every one), for its
    comment; '' where it has none."""
    lines = {}
    for path, line in getattr(kern, "locs", None) or ([kern.loc] if kern.loc else []):
        lines.setdefault(os.path.basename(path), set()).add(line)
    parts = []
    for name, found in lines.items():
        runs, ordered = [], sorted(found)
        for n in ordered:
            if runs and n == runs[-1][1] + 1:
                runs[-1][1] = n
            else:
                runs.append([n, n])
        parts.append(f"{name}:" + ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs))
    return f" ({'; '.join(parts)})" if parts else ""


def literal_items(lit):
    """A literal's elements as C initializers of its storage type: a half type's by its bits
    (bfloat16's storage is the bits; float16's is the bits, __half or _Float16 by target:
    MICA_F16_LIT, mica_math.h), others as exact literals of the type."""
    if lit.dtype.name == "bfloat16":  # (held as float32 values already rounded to bfloat16)
        bits = np.frombuffer(lit.data, dtype=np.float32).view(np.uint32) >> 16
        return [f"0x{int(b):04x}" for b in bits]
    if lit.dtype.name == "float16":
        values = np.frombuffer(lit.data, dtype=np.float16)
        return [f"MICA_F16_LIT(0x{int(b):04x}, {ct.const(float(v), lit.dtype)})"
                for b, v in zip(values.view(np.uint16), values)]
    values = memoryview(lit.data).cast(lit.dtype.np_storage.char if lit.dtype.kind != "bool" else "B")
    return [ct.const(x, lit.dtype) for x in values.tolist()]

class CStyleRenderer:
    kernel_qualifier = "static void"       # CUDA: static __global__ void
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

    def function_header(self, name):
        """The opening line of a kernel function whose pointers were just declared."""
        return f"{self.kernel_qualifier} {name}(char *A) {{"

    def literals(self):
        out = []
        for lit in self.s.literals:
            items = ", ".join(literal_items(lit))
            out.append(f"{self.constant_qualifier} {ct.stype(lit.dtype)} lit{lit.id}[{max(lit.numel, 1)}] = {{{items}}};")
        return out

    # ---- kernels ---------------------------------------------------------------------------------
    def kernel(self, k, kern):
        where = place(kern)
        title = f"/* k{k}: {kern.name}{where} */"
        self._declared = {}
        helpers = []
        if isinstance(kern, Loop):
            body = self.loop(kern)
            views = [e.view for e in kern.exprs if e.kind == "load"] + [v for v, _ in kern.stores]
            needs_rng = any(e.kind == "op" and e.op in RANDOM for e in kern.exprs)
        elif isinstance(kern, Reduce):
            helpers, body = self.reduce(kern, f"k{k}")
            views = [e.view for e in kern.exprs if e.kind == "load"] + [kern.out]
            needs_rng = False
        elif isinstance(kern, Gemm):
            helpers, body = self.product(kern, f"k{k}")
            views = [kern.a, kern.b, kern.out]
            if kern.out.src.id in self.plan.unstored:  # (the epilogue is a helper of its own)
                views = [kern.a, kern.b]
            elif kern.epilogue is not None:
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
        lines = [title] + helpers + [self.function_header(f"k{k}")]
        lines += ["    " + x for x in decls + body]
        lines.append("}")
        return lines

    # ---- the program's ABI: inputs and outputs by index -------------------------------------------
    def abi_lines(self, api):
        """Tables of every input's and output's name, element type, shape and place, and the
        functions a runtime uses to move data in and out, so it never works out an arena offset
        itself (on a GPU it could not: the arena is device memory). Outputs may be strided views:
        get_output writes them dense, row-major."""
        s, plan = self.s, self.plan
        ins = [(name, view, plan.offset(view.src)) for name, view in zip(s.input_names, s.inputs)]
        outs = [(f"output {i}", view, plan.view_offset(view)) for i, view in enumerate(s.outputs)]
        for _, view, _ in ins + outs:
            if len(view.shape) > 8:
                raise MicaError(f"{self.name}: an input or output of {len(view.shape)} dims; the program ABI takes "
                                "at most 8 (reshape it)")
        lines = ["/* ---- the ABI: inputs and outputs by index ---- */"]
        for kind, table in (("input", ins), ("output", outs)):
            n = len(table)
            rows = [(name, view, off) for name, view, off in table] or [("", None, 0)]
            lines.append(f"static const int64_t mica_abi_{kind}_offset[{max(n, 1)}] = "
                         f"{{{', '.join(str(off) for _, _, off in rows)}}};")
            lines.append(f"static const int mica_abi_{kind}_ndim[{max(n, 1)}] = "
                         f"{{{', '.join(str(len(v.shape)) if v else '0' for _, v, _ in rows)}}};")
            lines.append(f"static const int64_t mica_abi_{kind}_shape[{max(n, 1)}][8] = "
                         f"{{{', '.join(self._dims(v.shape if v else ()) for _, v, _ in rows)}}};")
            if kind == "output":  # (inputs are whole buffers)
                lines.append(f"static const int64_t mica_abi_{kind}_stride[{max(n, 1)}][8] = "
                             f"{{{', '.join(self._dims(v.strides if v else ()) for _, v, _ in rows)}}};")
                lines.append(f"static const int mica_abi_{kind}_dense[{max(n, 1)}] = "
                             f"{{{', '.join(str(int(bool(v) and self._dense(v))) for _, v, _ in rows)}}};")
            lines.append(f"static const int mica_abi_{kind}_itemsize[{max(n, 1)}] = "
                         f"{{{', '.join(str(v.dtype.itemsize) if v else '0' for _, v, _ in rows)}}};")
            lines.append(f"static const char *mica_abi_{kind}_dtype[{max(n, 1)}] = "
                         f"{{{', '.join(chr(34) + (DTYPE_CODES[v.dtype.name] if v else '') + chr(34) for _, v, _ in rows)}}};")
            lines.append(f"static const char *mica_abi_{kind}_name[{max(n, 1)}] = "
                         f"{{{', '.join(_c_string(name) for name, _, _ in rows)}}};")
            lines += [
                f"int {api}{kind}_count(void) {{ return {n}; }}",
                f"const char *{api}{kind}_name(int i) {{ return i >= 0 && i < {n} ? mica_abi_{kind}_name[i] : 0; }}",
                f"const char *{api}{kind}_dtype(int i) {{ return i >= 0 && i < {n} ? mica_abi_{kind}_dtype[i] : 0; }}",
                f"int {api}{kind}_ndim(int i) {{ return i >= 0 && i < {n} ? mica_abi_{kind}_ndim[i] : -1; }}",
                f"int64_t {api}{kind}_dim(int i, int d) {{",
                f"    return i >= 0 && i < {n} && d >= 0 && d < mica_abi_{kind}_ndim[i] ? mica_abi_{kind}_shape[i][d] : -1;",
                "}",
                f"int64_t {api}{kind}_bytes(int i) {{",
                f"    if (i < 0 || i >= {n}) return -1;",
                f"    int64_t n = mica_abi_{kind}_itemsize[i];",
                f"    for (int d = 0; d < mica_abi_{kind}_ndim[i]; d++) n *= mica_abi_{kind}_shape[i][d];",
                "    return n;",
                "}",
            ]
        lines += [
            "/* inputs are whole buffers: one copy each way (state updated in place is read back with get_input);",
            " * the _part forms copy bytes [start, start + n) of one, so a runtime can stream a large tensor */",
            f"void {api}set_input_part(void *arena, int i, int64_t start, int64_t n, const void *src) {{",
            f"    {self.copy_to_arena('(char *)arena + mica_abi_input_offset[i] + start', 'src', 'n')}",
            "}",
            f"void {api}get_input_part(const void *arena, int i, int64_t start, int64_t n, void *dst) {{",
            f"    {self.copy_from_arena('dst', '(const char *)arena + mica_abi_input_offset[i] + start', 'n')}",
            "}",
            f"void {api}set_input(void *arena, int i, const void *src) {{ {api}set_input_part(arena, i, 0, "
            f"{api}input_bytes(i), src); }}",
            f"void {api}get_input(const void *arena, int i, void *dst) {{ {api}get_input_part(arena, i, 0, "
            f"{api}input_bytes(i), dst); }}",
            "/* an output may be a strided view: elements [start, start + count) of it, row-major, written dense */",
            f"void {api}get_output_part(const void *arena, int i, int64_t start, int64_t count, void *dst) {{",
            "    if (count <= 0) return;",
            "    int nd = mica_abi_output_ndim[i], size = mica_abi_output_itemsize[i];",
            "    int64_t index[8] = {0}, rest = start;",
            "    for (int d = nd - 1; d >= 0; d--) { index[d] = rest % mica_abi_output_shape[i][d]; rest /= mica_abi_output_shape[i][d]; }",
            "    const char *base = (const char *)arena + mica_abi_output_offset[i];",
            "    if (mica_abi_output_dense[i]) {  /* row-major already: one copy */",
            f"        {self.copy_from_arena('dst', 'base + start * size', 'count * size')}",
            "        return;",
            "    }",
            "    for (int64_t k = 0; k < count; k++) {",
            "        int64_t at = 0;",
            "        for (int d = 0; d < nd; d++) at += index[d] * mica_abi_output_stride[i][d];",
            f"        {self.copy_from_arena('(char *)dst + k * size', 'base + at * size', 'size')}",
            "        for (int d = nd - 1; d >= 0 && ++index[d] == mica_abi_output_shape[i][d]; d--) index[d] = 0;",
            "    }",
            "}",
            f"void {api}get_output(const void *arena, int i, void *dst) {{",
            f"    {api}get_output_part(arena, i, 0, {api}output_bytes(i) / mica_abi_output_itemsize[i], dst);",
            "}",
            "",
        ]
        return lines

    @staticmethod
    def _dense(view):
        """Are a view's elements row-major and contiguous (sizes of 1 take any stride)?"""
        want = 1
        for n, st in zip(reversed(view.shape), reversed(view.strides)):
            if n != 1 and st != want:
                return False
            want *= n
        return True

    @staticmethod
    def _dims(values):
        return "{" + ", ".join(str(v) for v in list(values) + [0] * (8 - len(values))) + "}"

    def copy_to_arena(self, dst, src, n):
        return f"memcpy({dst}, {src}, (size_t)({n}));"

    def copy_from_arena(self, dst, src, n):
        return f"memcpy({dst}, {src}, (size_t)({n}));"

    # ---- the hooks a target fills in -------------------------------------------------------------
    def workspace_lines(self):
        """Declarations of the kernel's scratch pointers."""
        ws = self.plan.workspace_offset
        return [f"char *work = A + {ws}, *scratch = A + {ws + self.plan.shared_bytes};", "(void)work; (void)scratch;"]

    def loop(self, kern):
        raise NotImplementedError

    def reduce(self, kern, name):
        raise NotImplementedError

    def product(self, kern, name):
        """(helper functions, the kernel's body) of product kernel `kern`, the kernel named `name`."""
        raise NotImplementedError

    def copy(self, kern):
        raise NotImplementedError
