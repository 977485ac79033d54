"""The schedule's vocabulary: where a value lives (Buffer, or a strided View onto a buffer or a
virtual source) and the kernels that compute values (loops, reductions, products, hand-written
calls, copies). Built by `fuse`, placed in memory by `memory` (a MemoryPlan beside it), rendered by a target.
"""
import math


class Buffer:
    """A dense, row-major block of `numel` elements of `dtype`; `cls` is its memory class. Where it
    lives in memory is the MemoryPlan's answer (passes/memory.py), not the buffer's."""

    __slots__ = ("id", "numel", "dtype", "cls", "name", "persistent")

    def __init__(self, id, numel, dtype, cls="activations", name=""):
        self.id = id
        self.numel = numel
        self.dtype = dtype
        self.cls = cls
        self.name = name
        self.persistent = False  # live for the whole program (inputs, state, outputs)

    @property
    def nbytes(self):
        return self.numel * self.dtype.itemsize

    def __repr__(self):
        return f"b{self.id}:{self.dtype.short}[{self.numel}]"


class Const:
    """A scalar constant: every element of a view onto it is `value`."""

    __slots__ = ("value", "dtype")

    def __init__(self, value, dtype):
        self.value, self.dtype = value, dtype


class Iota:
    """Element i of a view onto it is i (in `dtype`)."""

    __slots__ = ("dtype",)

    def __init__(self, dtype):
        self.dtype = dtype


class Literal:
    """Constant data compiled into the program."""

    __slots__ = ("id", "data", "dtype", "numel")

    def __init__(self, id, data, dtype, numel):
        self.id, self.data, self.dtype, self.numel = id, data, dtype, numel


def row_major(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


class View:
    """Element [i0, i1, ...] of the view is element offset + sum(i_d * strides[d]) of `src`."""

    __slots__ = ("src", "shape", "strides", "offset")

    def __init__(self, src, shape, strides, offset=0):
        self.src, self.shape, self.strides, self.offset = src, tuple(shape), tuple(strides), offset

    @classmethod
    def of(cls, src, shape):
        if isinstance(src, Const):
            return cls(src, shape, (0,) * len(shape), 0)
        return cls(src, shape, row_major(shape), 0)

    @property
    def dtype(self):
        return self.src.dtype

    @property
    def numel(self):
        return math.prod(self.shape)

    def is_dense(self):
        """Row-major over its own shape (any offset): the elements are one contiguous run."""
        return all(st == rm for st, rm, n in zip(self.strides, row_major(self.shape), self.shape) if n != 1)

    def is_whole(self):
        """The entire buffer, row-major."""
        return isinstance(self.src, Buffer) and self.offset == 0 and self.is_dense() and self.numel == self.src.numel

    def permute(self, perm):
        return View(self.src, [self.shape[p] for p in perm], [self.strides[p] for p in perm], self.offset)

    def slice(self, starts, stops, steps):
        shape = [max(0, (e - b + s - 1) // s) for b, e, s in zip(starts, stops, steps)]
        offset = self.offset + sum(b * st for b, st in zip(starts, self.strides))
        return View(self.src, shape, [st * s for st, s in zip(self.strides, steps)], offset)

    def expand(self, shape):
        return View(self.src, shape, [0 if n != m else st for st, n, m in zip(self.strides, self.shape, shape)],
                    self.offset)

    def reshape(self, shape):
        """The same elements in a new shape, or None when strides cannot express it."""
        if isinstance(self.src, Const):
            return View.of(self.src, shape)
        if self.is_dense() or math.prod(shape) == 0:  # (no elements: any strides address them all)
            return View(self.src, shape, row_major(shape), self.offset)
        # drop size-1 dims, then regroup dims whose strides chain
        dims = [(n, st) for n, st in zip(self.shape, self.strides) if n != 1]
        new_strides, i = [], 0
        for n in shape:
            if n == 1:
                new_strides.append(0)
                continue
            if i >= len(dims):
                return None
            size, st = dims[i]
            if size % n == 0 and size != n:  # split one old dim
                inner = size // n
                dims[i] = (inner, st)
                new_strides.append(st * inner)
                continue
            acc, j = size, i
            while acc < n and j + 1 < len(dims) and dims[j][1] == dims[j + 1][0] * dims[j + 1][1]:
                j += 1
                acc *= dims[j][0]
            if acc != n:
                return None
            new_strides.append(dims[j][1])
            i = j + 1
        if i != len(dims):
            return None
        return View(self.src, shape, new_strides, self.offset)

    def __repr__(self):
        return f"View({self.src!r}, {list(self.shape)}, {list(self.strides)}, +{self.offset})"


class Expr:
    """One operation inside a generated kernel, evaluated per element (SSA within the kernel)."""

    __slots__ = ("kind", "dtype", "op", "args", "attrs", "view", "value")

    def __init__(self, kind, dtype, op=None, args=(), attrs=None, view=None, value=None):
        self.kind = kind      # "load" | "const" | "op"
        self.dtype = dtype
        self.op = op
        self.args = tuple(args)
        self.attrs = attrs or {}
        self.view = view
        self.value = value


class Kernel:
    kind = "kernel"

    def __init__(self, name, loc):
        self.name = name
        self.loc = loc
        self.locs = [loc] if loc else []  # (a fused loop's: every node's line)

    def reads(self):
        """Views this kernel reads."""
        return []

    def writes(self):
        """Buffers this kernel writes."""
        return []


class Loop(Kernel):
    """An elementwise loop over `shape`; `stores` are (View, expr index) pairs."""

    kind = "loop"

    def __init__(self, name, loc, shape, exprs, stores):
        super().__init__(name, loc)
        self.shape, self.exprs, self.stores = tuple(shape), exprs, stores

    def reads(self):
        return [e.view for e in self.exprs if e.kind == "load"]

    def writes(self):
        return [v.src for v, _ in self.stores]


class Reduce(Kernel):
    """out[kept] = reduce over `axes` of expression `result` evaluated on the input shape."""

    kind = "reduce"

    def __init__(self, name, loc, in_shape, axes, op, exprs, result, out):
        super().__init__(name, loc)
        self.in_shape, self.axes, self.op = tuple(in_shape), tuple(axes), op
        self.exprs, self.result, self.out = exprs, result, out

    def reads(self):
        return [e.view for e in self.exprs if e.kind == "load"]

    def writes(self):
        return [self.out.src]


class Gemm(Kernel):
    """out[b] = a[b] @ b_[b] for every batch index b; operands may be transposed views. An
    `epilogue` (a Loop over the output's [M, N]) runs on each output tile right after the tile is
    computed, while it is in cache: the same arithmetic as a separate loop, one pass less."""

    kind = "gemm"

    def __init__(self, name, loc, a, b, out):
        super().__init__(name, loc)
        self.a, self.b, self.out = a, b, out
        self.epilogue = None

    def reads(self):
        return [self.a, self.b] + (self.epilogue.reads() if self.epilogue else [])

    def writes(self):
        return [self.out.src] + (self.epilogue.writes() if self.epilogue else [])


class Call(Kernel):
    """A hand-written kernel for primitive `op`."""

    kind = "call"

    def __init__(self, name, loc, op, inputs, outputs, attrs):
        super().__init__(name, loc)
        self.op, self.inputs, self.outputs, self.attrs = op, inputs, outputs, attrs

    def reads(self):
        return list(self.inputs)

    def writes(self):
        return [v.src for v in self.outputs]


class Copy(Kernel):
    """pad (zero, then place the input) or concat (place each input in its slice)."""

    kind = "copy"

    def __init__(self, name, loc, op, inputs, out, attrs):
        super().__init__(name, loc)
        self.op, self.inputs, self.out, self.attrs = op, inputs, out, attrs

    def reads(self):
        return list(self.inputs)

    def writes(self):
        return [self.out.src]


class Schedule:
    """Kernels in execution order, the buffers they use, and where each program input and output
    lives (a View), with the graph's input names."""

    def __init__(self):
        self.kernels = []
        self.buffers = []
        self.literals = []
        self.inputs = []        # View per program input (whole buffers)
        self.input_names = []
        self.outputs = []       # View per program output
        self.rng = None         # Buffer of (seed, offset) when the program draws random numbers

    def new_buffer(self, numel, dtype, cls="activations", name=""):
        b = Buffer(len(self.buffers), numel, dtype, cls, name)
        self.buffers.append(b)
        return b
