"""The CPU's lowering of the collectives (mica/ops/collective.py): at world size 1 the identity
written out in C (all_reduce adds its operands left to right); across ranks a call into
mica_collectives.h, whose sums are Mica's own over bytes MPI moves."""
import shutil
import subprocess

from ...errors import MicaError
from ...ops.collective import COLLECTIVES
from ...passes.schedule import Call
from ...targets import register_lowering
from ..cstyle import types as ct

HEADER = "mica_collectives.h"


def distributed(schedule):
    """Whether the schedule holds a collective over more than one rank (it then needs MPI)."""
    return any(isinstance(k, Call) and k.op in COLLECTIVES and k.attrs["world"] > 1 for k in schedule.kernels)


def headers(schedule):
    return [HEADER] if distributed(schedule) else []


_FLAGS = {}


def mpi_flags():
    """(compile flags, link flags) of Open MPI, from `mpicc --showme`."""
    if "flags" not in _FLAGS:
        mpicc = shutil.which("mpicc")
        if mpicc is None:
            raise MicaError("a program with collectives over several ranks needs Open MPI, which is not installed: "
                            "apt-get install openmpi-bin libopenmpi-dev")
        got = []
        for what in ("compile", "link"):
            r = subprocess.run([mpicc, f"--showme:{what}"], capture_output=True, text=True)
            if r.returncode != 0:
                raise MicaError(f"mpicc --showme:{what} failed ({r.stderr.strip()[:200]}); reinstall Open MPI "
                                "(apt-get install --reinstall openmpi-bin libopenmpi-dev)")
            got.append(r.stdout.split())
        _FLAGS["flags"] = tuple(got)
    return _FLAGS["flags"]


def _elements(view):
    return view.numel


CHAIN_CHUNK = 1 << 18  # elements per message of the chain (MICA_CHAIN_CHUNK in mica_collectives.h)


def _scatter_scratch(kernel):
    """One chunk of the chain's running sum (the last rank sends each owner its part chunk by chunk)."""
    x = kernel.inputs[0]
    return (min(x.numel, CHAIN_CHUNK) * x.dtype.itemsize if kernel.attrs["world"] > 1 else 0), 0


def _checked(kernel):
    dt = kernel.outputs[0].dtype
    if dt.name not in ("float32", "float64"):
        raise MicaError(f"{kernel.op} on {dt.name} is not supported by the CPU backend yet; cast to float32 first")


def _summed_here(p, ins, out, t):
    """A single rank's sum of the operands, left to right (the collective at world size 1)."""
    lines = ["#pragma omp parallel for schedule(static)", f"for (int64_t i = 0; i < {out.numel}; i++) {{",
             f"    {t} acc = {p(ins[0])}[i];"]
    lines += [f"    acc = acc + {p(x)}[i];" for x in ins[1:]]
    return lines + [f"    {p(out)}[i] = acc;", "}"]


def _operands(p, ins, t):
    return f"    const {t} *operands[{len(ins)}] = {{{', '.join(p(x) for x in ins)}}};"


@register_lowering("all_reduce", "c")
def _all_reduce(e, kernel):
    _checked(kernel)
    p, ins, out = e.ptr, kernel.inputs, kernel.outputs[0]
    world, n, t, s = kernel.attrs["world"], _elements(out), ct.ctype(out.dtype), ct.suffix(out.dtype)
    if world == 1:
        return _summed_here(p, ins, out, t)
    return ["{", _operands(p, ins, t),
            f"    if (mica_all_reduce_{s}({p(out)}, operands, {len(ins)}, {n}LL, {world})) return;", "}"]


def _uneven(kernel, x, ctype="int"):
    """`static const` lines of an uneven collective's counts and displacements, in elements."""
    row = x.numel // x.shape[0] if x.shape[0] else 0
    counts = [c * row for c in kernel.attrs["counts"]]
    if ctype == "int" and sum(counts) > 2 ** 31 - 1:
        raise MicaError(f"{kernel.op} moves {sum(counts):,} elements, more than MPI's counts ({2 ** 31 - 1:,}) take")
    displs = [sum(counts[:r]) for r in range(len(counts))]
    return [f"    static const {ctype} counts[{len(counts)}] = {{{', '.join(map(str, counts))}}};",
            f"    static const {ctype} displs[{len(counts)}] = {{{', '.join(map(str, displs))}}};"]


@register_lowering("reduce_scatter", "c", scratch=_scatter_scratch)
def _reduce_scatter(e, kernel):
    _checked(kernel)
    p, ins, out = e.ptr, kernel.inputs, kernel.outputs[0]
    world, t, s = kernel.attrs["world"], ct.ctype(out.dtype), ct.suffix(out.dtype)
    if world == 1:
        return _summed_here(p, ins, out, t) if len(ins) > 1 else \
            [f"memcpy({p(out)}, {p(ins[0])}, {out.numel * out.dtype.itemsize});"]
    if kernel.attrs.get("counts") is not None:
        return ["{", _operands(p, ins, t), *_uneven(kernel, ins[0], "int64_t"),
                f"    if (mica_reduce_scatter_v_{s}({p(out)}, operands, {len(ins)}, {ins[0].numel}LL, counts, displs, "
                f"{world}, ({t} *)work)) return;", "}"]
    return ["{", _operands(p, ins, t), f"    if (mica_reduce_scatter_{s}({p(out)}, operands, {len(ins)}, "
            f"{out.numel}LL, {world}, ({t} *)work)) return;", "}"]


@register_lowering("all_gather", "c")
def _all_gather(e, kernel):
    _checked(kernel)
    p, x, out = e.ptr, kernel.inputs[0], kernel.outputs[0]
    world, s = kernel.attrs["world"], ct.suffix(out.dtype)
    if world == 1:
        return [f"memcpy({p(out)}, {p(x)}, {out.numel * out.dtype.itemsize});"]
    if kernel.attrs.get("counts") is not None:
        return ["{", *_uneven(kernel, out), f"    if (mica_all_gather_v_{s}({p(out)}, {p(x)}, counts, displs, {world})) "
                "return;", "}"]
    return [f"if (mica_all_gather_{s}({p(out)}, {p(x)}, {x.numel}LL, {world})) return;"]
