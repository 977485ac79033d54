"""The oracle: interpret any Program in numpy, node by node, with each primitive's reference code.

precision="float64" computes every floating value in float64 (casts between floating types are
then exact no-ops): the yardstick that compiled float32 results and PyTorch are compared with.
precision="float32" computes float32 values in float32 and rounds bfloat16/float16 values to their
own precision after every primitive, as a float32 machine would. A bfloat16 product reads its
operands as the CPU's bfloat16 kernels do (mica_bf16gemm.h): subnormal values as zeros, then sums
in float32 (in another order than the compiled kernel: compiled and oracle products differ by
float32 roundings of the sum, and by at most one bfloat16 rounding of a result that lies near a
rounding boundary; tests/test_bf16_gemm.py bounds both).
fp_half_intermediates=True runs the program as `program.lower(..., fp_half_intermediates=True)`
compiles it: its half-type attention rounds where PyTorch's CPU attention rounds (passes/widen.py).
"""
import numpy as np

from .. import dtypes, pytree
from ..errors import MicaError
from ..ops import OPS


def round_bf16(a):
    """Round float32 values to the nearest bfloat16 (ties to even), kept in float32."""
    a = np.array(a, dtype=np.float32, copy=True)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(a), a, rounded)


def flush_bf16_subnormals(a):
    """bfloat16 values (held in float32) with subnormals replaced by zeros of their sign, as the
    bfloat16 dot-product instructions (vdpbf16ps, tdpbf16ps) read them."""
    a = np.asarray(a, dtype=np.float32)
    return np.where(np.abs(a) < np.float32(2.0 ** -126), np.copysign(np.float32(0), a), a)


class Run:
    """What a primitive's reference code may ask of the interpreter."""

    def round_half(self, array, half):
        """`array` rounded to the half type named `half` ("bfloat16" or "float16"), in its own type."""
        a = np.asarray(array)
        b = np.asarray(a, dtype=np.float32)
        b = round_bf16(b) if half == "bfloat16" else b.astype(np.float16).astype(np.float32)
        return b.astype(a.dtype, copy=False)

    def __init__(self, precision, seed, offset):
        if precision not in ("float64", "float32"):
            raise MicaError(f"precision must be 'float64' or 'float32', got {precision!r}")
        self.precision = precision
        self.rng = (int(seed), int(offset))

    def np(self, dtype):
        """numpy type in which values of `dtype` are computed."""
        if dtype.kind == "float":
            return np.float64 if self.precision == "float64" or dtype is dtypes.float64 else np.float32
        return dtype.np_storage

    def coerce(self, array, dtype):
        a = np.asarray(array).astype(self.np(dtype), copy=False)
        if self.precision == "float32":
            if dtype is dtypes.bfloat16:
                a = round_bf16(a)
            elif dtype is dtypes.float16:
                a = a.astype(np.float16).astype(np.float32)
        return a


def run(program, *args, precision="float64", seed=0, offset=0, fp_half_intermediates=False):
    """Run `program` on numpy arrays shaped like its inputs; returns numpy results in the program's
    output structure. `seed` and `offset` key the random streams (dropout); `fp_half_intermediates`
    rounds half-type attention as the lowering option of that name does."""
    from ..passes.widen import HALF, half_round_attrs
    from ..ops.philox import check_key

    r = Run(precision, *check_key(seed, offset))
    graph = program.graph
    inputs = program.flatten_args(args)
    last_use = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            last_use[v.id] = i
    keep = {v.id for v in graph.outputs}
    env = {}
    for i, node in enumerate(graph.nodes):
        if node.op == "input":
            v = node.out
            env[v.id] = r.coerce(inputs[node.attrs["index"]], v.dtype)
            continue
        args = [env[v.id] for v in node.inputs]
        if node.op == "matmul" and r.precision == "float32" and node.inputs[0].dtype is dtypes.bfloat16:
            args = [flush_bf16_subnormals(a) for a in args]
        attrs = node.attrs
        if fp_half_intermediates:
            attrs = half_round_attrs(node, next((v.dtype for v in node.inputs if v.dtype in HALF), None))
        with np.errstate(all="ignore"):  # (IEEE arithmetic, as compiled code's: inf and NaN are values, and a
            result = OPS[node.op].ref(args, attrs, r)  # where's unused branch may hold them, unwarned)
        results = result if isinstance(result, tuple) else (result,)
        assert len(results) == len(node.outputs), node.op
        for v, a in zip(node.outputs, results):
            a = r.coerce(a, v.dtype)
            assert a.shape == v.shape, (node.op, a.shape, v.shape)
            env[v.id] = a
        for v in node.inputs:
            if last_use.get(v.id) == i and v.id not in keep:
                env.pop(v.id, None)
    return pytree.unflatten(program.out_tree, [env[v.id] for v in graph.outputs])
