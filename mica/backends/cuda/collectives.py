"""The CUDA target's lowering of the collectives (mica/ops/collective.py): host calls into
mica_nccl.h, which moves bytes over NCCL and adds in Mica's fixed rank order. At world size 1 a
single-operand collective is a device copy. Building one needs NCCL's headers and library (the
nvidia-nccl-cu13 wheel: pip install -e '.[cuda]') and Open MPI's (the id is broadcast over MPI)."""

from ...errors import MicaError
from ...ops.collective import COLLECTIVES
from ...passes.schedule import Call
from ...targets import register_lowering
from ..c.collectives import distributed, mpi_flags
from ..cstyle import types as ct

HEADER = "mica_nccl.h"


def headers(schedule):
    return [HEADER] if distributed(schedule) else []


def setup(schedule):
    """The statements that make the communicator before the program's graph is captured (none
    without collectives across ranks)."""
    worlds = {k.attrs["world"] for k in schedule.kernels
              if isinstance(k, Call) and k.op in COLLECTIVES and k.attrs["world"] > 1}
    return [f"if (mica_nccl_ready({w})) return 1;" for w in sorted(worlds)]


def nccl_paths():
    """(include dir, lib dir) of the nvidia-nccl-cu13 wheel."""
    from .build import wheel_dirs

    return wheel_dirs("nvidia.nccl", "NCCL is not installed: pip install nvidia-nccl-cu13 (or pip install -e '.[cuda]')")


def build_flags(simulate=False):
    """(compile flags, link flags) for a program with collectives across ranks: nvcc's, with NCCL
    and Open MPI; or, simulated, g++'s with Open MPI alone (mica_cudasim_nccl.h is NCCL there)."""
    mpi_c, mpi_l = mpi_flags()
    if simulate:
        return list(mpi_c), list(mpi_l)
    include, lib = nccl_paths()
    compile_flags = ["-I", include] + [f for f in mpi_c if f.startswith("-I")]
    link = ["-L", lib, "-l:libnccl.so.2", "-Xlinker", f"-rpath,{lib}"]
    link += [f if not f.startswith("-Wl,") else "-Xlinker=" + f[4:] for f in mpi_l if not f.startswith("-pthread")]
    return compile_flags, link


def _types(kernel):
    dt = kernel.outputs[0].dtype
    if dt.name not in ("float32", "float64"):
        raise MicaError(f"{kernel.op} on {dt.name} is not supported by the CUDA backend yet; cast to float32 first")
    return ct.ctype(dt)


def _copy(e, x, out):
    return [f"if (cudaMemcpyAsync({e.ptr(out)}, {e.ptr(x)}, {out.numel * out.dtype.itemsize}, "
            "cudaMemcpyDeviceToDevice, stream) != cudaSuccess) return 1;"]


def _scatter_scratch(kernel):
    x = kernel.inputs[0]
    return (x.numel * x.dtype.itemsize if kernel.attrs["world"] > 1 else 0), 0


@register_lowering("all_reduce", "cuda", host=True)
def _all_reduce(e, kernel):
    t, world, ins, out = _types(kernel), kernel.attrs["world"], kernel.inputs, kernel.outputs[0]
    if world == 1:
        if len(ins) > 1:
            raise MicaError("all_reduce of several operands at world size 1 is not lowered for CUDA yet; add them "
                            "before the collective")
        return _copy(e, ins[0], out)
    operands = ", ".join(e.ptr(x) for x in ins)
    return [f"const {t} *operands[{len(ins)}] = {{{operands}}};",
            f"if (mica_nccl_all_reduce<{t}>({e.ptr(out)}, operands, {len(ins)}, {out.numel}LL, {world}, stream)) "
            "return 1;"]


@register_lowering("reduce_scatter", "cuda", scratch=_scatter_scratch, host=True)
def _reduce_scatter(e, kernel):
    t, world, x, out = _types(kernel), kernel.attrs["world"], kernel.inputs[0], kernel.outputs[0]
    if len(kernel.inputs) > 1 or kernel.attrs.get("counts") is not None:
        raise MicaError("reduce_scatter of several operands or uneven blocks is not lowered for CUDA yet (ZeRO-1 "
                        "trains on the CPU)")
    if world == 1:
        return _copy(e, x, out)
    return [f"if (mica_nccl_reduce_scatter<{t}>({e.ptr(out)}, {e.ptr(x)}, {out.numel}LL, {world}, ({t} *)work, "
            "stream)) return 1;"]


@register_lowering("all_gather", "cuda", host=True)
def _all_gather(e, kernel):
    t, world, x, out = _types(kernel), kernel.attrs["world"], kernel.inputs[0], kernel.outputs[0]
    if kernel.attrs.get("counts") is not None:
        raise MicaError("all_gather of uneven blocks is not lowered for CUDA yet (ZeRO-1 trains on the CPU)")
    if world == 1:
        return _copy(e, x, out)
    return [f"if (mica_nccl_all_gather<{t}>({e.ptr(out)}, {e.ptr(x)}, {x.numel}LL, {world}, stream)) return 1;"]
