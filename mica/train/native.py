"""Build the native trainer (the C runtime linked with the three generated programs) and write
the manifest that tells it where everything lives."""
import hashlib
import math
import os
import tempfile

from ..backends.c import build as cbuild
from ..backends.c import collectives
from ..errors import MicaError

RUNTIME_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime")
# the trainer's runtime modules (mica/runtime/runtime.h says what each does)
RUNTIME_SOURCES = ("main.c", "manifest.c", "programs.c", "tokens.c", "rng.c", "checkpoint.c", "log.c", "loop.c",
                   "speedrun.c", "sampler.c", "dist.c")
PROGRAMS = ("train", "eval", "logits")


def _runtime_text():
    parts = []
    for name in ("runtime.h", *RUNTIME_SOURCES):
        with open(os.path.join(RUNTIME_DIR, name)) as f:
            parts.append(f.read())
    return "\0".join(parts)


def build_trainer(programs, opt_level=2, log=print, device="cpu", simulate=False, tf32=False, memory_budget=None,
                  fp_half_intermediates=False):
    """Lower the programs for the device, compile and link them with the runtime (cached); returns
    (executable path, {name: Lowered}). `memory_budget`: bytes the run's arenas may take (memory_plan.lower_train_within);
    `fp_half_intermediates`: the pipeline's option (mica/lower.py)."""
    if device == "cuda":
        return _build_cuda_trainer(programs, opt_level, log, simulate, tf32, memory_budget, fp_half_intermediates)
    lowered = _lower_all(programs, memory_budget, "cpu", opt_level=opt_level, fp_half_intermediates=fp_half_intermediates)
    blas = lowered["train"].target.blas
    cflags, ldflags = cbuild.blas_flags(blas)
    if collectives.distributed(lowered["train"].schedule):  # a data-parallel trainer: Open MPI (runtime/dist.c)
        mpi_c, mpi_l = collectives.mpi_flags()
        cflags, ldflags = [*cflags, "-DMICA_MPI", *mpi_c], [*ldflags, *mpi_l]
    flags = cbuild.flags(opt_level) + cflags
    sources = {name: lowered[name].target.render(lowered[name], api=f"{name}_") for name in PROGRAMS}
    runtime = _runtime_text()
    cc = cbuild.compiler()
    out_dir, exe = _place("trainer-", [*sources.values(), runtime, cc, *flags, *ldflags, cbuild._headers_digest()])
    if cbuild.cached(exe):
        cbuild.sweep_temporaries(out_dir)
        return exe, lowered
    log(f"compiling the trainer ({sum(len(lowered[n].schedule.kernels) for n in PROGRAMS)} kernels) ...")
    _compile_and_link(out_dir, exe, sources, ".c", lambda src, obj: [cc, *flags, "-c", *cbuild.INCLUDES, src, "-o", obj],
                      runtime, cc, flags, lambda objects, tmp: [cc, *flags, *objects, "-o", tmp, *ldflags, "-lm"],
                      "the C compiler")
    return exe, lowered


def _compile_and_link(out_dir, exe, sources, ext, compile_cmd, runtime, cc, runtime_flags, link_cmd, tool):
    """Compile each program's source (`compile_cmd(source, object)`) and the runtime (cached once per
    `runtime_flags`) at once, link them (`link_cmd(objects, output)`) and install the executable; the
    programs' objects live only as long as the build."""
    jobs, objects = [], []
    for name, path in _write_sources(out_dir, sources, ext).items():
        objects.append(_temporary(out_dir, name + ".o"))
        jobs.append((name, compile_cmd(path, objects[-1])))
    runtime_jobs, runtime_objects = _runtime_objects(runtime, cc, runtime_flags)
    try:
        _run_all(jobs + runtime_jobs)  # (the programs' compiles take most of the time: run together)
        for tmp, obj in runtime_objects:
            if tmp is not None:
                cbuild.install(tmp, obj, "the C compiler")
        for folder in {os.path.dirname(obj) for _, obj in runtime_objects}:
            cbuild.sweep_temporaries(folder)
        _link(out_dir, exe, lambda tmp: link_cmd([*objects, *(obj for _, obj in runtime_objects)], tmp), tool)
    finally:
        for path in [*objects, *(tmp for tmp, _ in runtime_objects if tmp is not None)]:
            cbuild.remove_quietly(path)


def _temporary(folder, name):
    """A fresh file name in `folder` for an object only this build writes (another process may be
    building the same cache entry at the same time)."""
    fd, path = tempfile.mkstemp(dir=folder, prefix=name[:-2] + ".", suffix=name[-2:])
    os.close(fd)
    return path


def _runtime_objects(runtime, cc, flags):
    """The C runtime's objects for these flags, compiled once into the cache and shared by every
    trainer built with the same flags: ([(what, command)] still to run, [(temporary or None, object)]).
    Each object is compiled to a temporary name and installed whole after its job succeeds."""
    out_dir, _ = _place("runtime-", [runtime, cc, *flags])
    os.makedirs(out_dir, exist_ok=True)
    jobs, objects = [], []
    for name in RUNTIME_SOURCES:
        obj = os.path.join(out_dir, name[:-2] + ".o")
        if cbuild.cached(obj):
            objects.append((None, obj))
            continue
        tmp = _temporary(out_dir, name[:-2] + ".o")
        jobs.append(("runtime", [cc, *flags, "-I", RUNTIME_DIR, "-c", os.path.join(RUNTIME_DIR, name), "-o", tmp]))
        objects.append((tmp, obj))
    return jobs, objects


def _lower_all(programs, memory_budget, target, **options):
    """Each program lowered; under a budget the train program gets what the eval arena leaves."""
    from .memory_plan import lower_train_within

    lowered = {name: programs[name].lower(target, **options) for name in PROGRAMS if name != "train"}
    return {"train": lower_train_within(programs["train"], memory_budget, lowered["eval"], target, **options),
            **lowered}


def _place(prefix, parts):
    """(folder, executable path) in the cache for a trainer built from `parts` (sources, flags)."""
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    out_dir = os.path.join(cbuild.cache_dir(), prefix + key)
    return out_dir, os.path.join(out_dir, "mica-trainer")


def _write_sources(out_dir, sources, ext):
    """{program name: path} of its source written into out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for name, src in sources.items():
        paths[name] = os.path.join(out_dir, name + ext)
        cbuild.write_whole(paths[name], src)
    return paths


def _link(out_dir, exe, command, tool):
    """Link to a temporary file (`command(tmp)`) and install it as `exe` (never half a file)."""
    fd, tmp = tempfile.mkstemp(dir=out_dir)
    os.close(fd)
    _run(command(tmp), "trainer", tool)
    os.chmod(tmp, 0o755)
    cbuild.install(tmp, exe, tool)
    cbuild.sweep_temporaries(out_dir)


def _build_cuda_trainer(programs, opt_level, log, simulate, tf32, memory_budget=None, fp_half_intermediates=False):
    """The CUDA trainer: each program's CUDA source compiled by nvcc (a fatbin for every
    architecture) or, simulated, by g++ against mica_cudasim.h; the same C runtime; linked by nvcc
    (cuBLASLt from the nvidia-cublas wheel, by rpath) or g++ (Boost.Context)."""
    from ..backends.cuda import build as cuda_build

    lowered = _lower_all(programs, memory_budget, "cuda", opt_level=opt_level, simulate=simulate, tf32=tf32,
                         fp_half_intermediates=fp_half_intermediates)
    sources = {name: lowered[name].target.render(lowered[name], api=f"{name}_") for name in PROGRAMS}
    cc = cbuild.compiler()
    runtime_flags, rank_c, rank_l = ["-O2", "-std=gnu11", "-fPIC"], [], []
    if collectives.distributed(lowered["train"].schedule):  # data-parallel: NCCL (simulated: over MPI), Open MPI
        from ..backends.cuda.collectives import build_flags

        rank_c, rank_l = build_flags(simulate)
        runtime_flags += ["-DMICA_MPI", *collectives.mpi_flags()[0]]
    if simulate:
        compile_cmd = lambda src, obj: cuda_build.simulator_command(src, obj, shared=False) + rank_c  # noqa: E731
        link = ["g++", "-lboost_context", "-lpthread", *rank_l, "-lm"]
        what = "g++ (the CUDA simulator)"
    else:
        compile_cmd = lambda src, obj: cuda_build.nvcc_command(src, obj, shared=False) + rank_c  # noqa: E731
        link = [cuda_build.nvcc(), *cuda_build.link_flags(), *rank_l, "-lm"]
        what = "nvcc"
    runtime = _runtime_text()
    out_dir, exe = _place(f"trainer-cuda{'-sim' if simulate else ''}-", [
        *sources.values(), runtime, cc, what, str(tf32), *compile_cmd("x", "y"), *link, *runtime_flags,
        cuda_build.headers_digest()])
    if cbuild.cached(exe):
        cbuild.sweep_temporaries(out_dir)
        return exe, lowered
    log(f"compiling the CUDA trainer with {what} ({sum(len(lowered[n].schedule.kernels) for n in PROGRAMS)} "
        "kernels) ...")
    _compile_and_link(out_dir, exe, sources, ".cu", compile_cmd, runtime, cc, runtime_flags,
                      lambda objects, tmp: [link[0], *objects, "-o", tmp, *link[1:]], "the linker")
    return exe, lowered


def _run_all(jobs):
    """Run (what, command) jobs at once; the first failure becomes a sentence."""
    results = cbuild.run_tools([cmd for _, cmd in jobs])
    for (what, _), (status, err) in zip(jobs, results):
        if status != 0:
            raise MicaError(f"the compiler failed on the {what} program ({cbuild.first_error(err, status)})")


def _run(cmd, what, tool="the C compiler"):
    [(status, err)] = cbuild.run_tools([cmd])
    if status != 0:
        raise MicaError(f"{tool} failed on the {what} program ({cbuild.first_error(err, status)})")


def _input_index(lowered):
    """{input name: its index in the program's ABI}."""
    return {name: i for i, name in enumerate(lowered.program.input_names)}


class Remote:
    """A slot of the checkpoint that another rank holds (ZeRO-1's optimizer state): its owner,
    shape and dtype; rank 0 receives its bytes when it writes a checkpoint."""

    def __init__(self, owner, shape, dtype):
        self.owner, self.shape, self.dtype = owner, tuple(shape), dtype


def state_slots(lowered, param_names, shards=None, rank=0):
    """[(kind, tensor name, train input name)] for parameters (kind 0) and optimizer state (kind 1),
    in order. Under ZeRO-1 `shards` is [(tensor name, shape, dtype, owner rank or -1: every rank's)]
    of one process's optimizer state, in its order: this rank's own shards are kind 2 (sent to
    rank 0 for a checkpoint) and the others' kind 3, with a Remote for the input name, so that
    every rank's list is one process's checkpoint."""
    slots = [(0, n, f"params[{n!r}]") for n in param_names]
    local = {}
    for name in lowered["train"].program.input_names:
        if name.startswith("opt_state["):
            inner = name[len("opt_state"):]
            parts = [p.strip("[]'") for p in inner.split("][")]
            local["optimizer." + ".".join(parts)] = name
    if shards is None:
        return slots + [(1, tensor, name) for tensor, name in local.items()]
    for tensor, shape, dtype, owner in shards:
        if owner in (-1, rank):
            slots.append((1 if owner == -1 else 2, tensor, local.pop(tensor)))
        else:
            slots.append((3, tensor, Remote(owner, shape, dtype)))
    assert not local, f"internal: optimizer state {sorted(local)} is not one process's"
    return slots


def check_in_place(lowered):
    """Every state input of the train program must be updated where it lies (the trainer runs the
    same arena step after step)."""
    sched = lowered.schedule
    inputs = {id(v.src): n for n, v in zip(lowered.program.input_names, sched.inputs)}
    n_state = sum(1 for n in lowered.program.input_names if n.startswith(("params[", "opt_state[")))
    outs = [v for v in sched.outputs][:n_state]
    for name, view in zip([n for n in lowered.program.input_names if n.startswith(("params[", "opt_state["))], outs):
        src = sched.inputs[lowered.program.input_names.index(name)].src
        if lowered.plan.root(view.src) is not src:
            raise MicaError(f"internal: {name} is not updated in place ({inputs.get(id(view.src), 'a new buffer')})")


class Fill:
    """A slot's starting bytes written into the manifest (a `fill` line) where the file it starts
    from lacks the tensor: a fresh loss scaler, a few bytes."""

    def __init__(self, index, data):
        self.index, self.data = index, bytes(data)


def write_manifest(path, settings, slots, lowered, loads=(), files=()):
    """The trainer's manifest: settings, the token files (`train_file`/`val_file HEADER PATH`), the
    programs' inputs and outputs the loop uses (by their index in each program's ABI, never an
    arena offset), a `slot` line per state tensor (a `remote` line for one another rank holds), and a `load INDEX OFFSET CRC32` line per tensor
    to read from init_file (a `fill INDEX HEX` line for a Fill in `loads`). Lines have no length limit."""
    tr, ev, lg = (_input_index(lowered[n]) for n in PROGRAMS)
    n_out = len(lowered["train"].schedule.outputs)  # ..., then the loss and the learning rate
    lines = [f"{k} {v}" for k, v in settings.items()]
    if settings.get("mode") == "train":
        from .memory_plan import eval_offset

        offset = eval_offset(lowered["train"])
        lines.append(f"eval_offset {-1 if offset is None else offset}")
    lines += [f"{split}_file {header} {file}" for split, file, header in files]
    lines += [f"train.x {tr['x']}", f"train.y {tr['y']}", f"train.iter {tr['iter_num']}",
              f"train.loss {n_out - 2}", f"train.lr {n_out - 1}",
              f"eval.x {ev['x']}", f"eval.y {ev['y']}", "eval.loss 0", f"logits.idx {lg['idx']}", "logits.out 0"]
    views = dict(zip(lowered["train"].program.input_names, lowered["train"].schedule.inputs))
    codes = {"float32": "F32", "float64": "F64", "int64": "I64", "int32": "I32", "bfloat16": "BF16"}
    for kind, tensor, input_name in slots:
        if kind == 3:  # held by another rank (ZeRO-1): "remote OWNER NBYTES DTYPE NDIM DIMS... NAME"
            r = input_name
            nbytes = math.prod(r.shape) * r.dtype.itemsize
            lines.append(f"remote {r.owner} {nbytes} {codes[r.dtype.name]} {len(r.shape)} "
                         f"{' '.join(str(d) for d in r.shape)} {tensor}".replace("  ", " "))
            continue
        v = views[input_name]
        shape = " ".join(str(s) for s in v.shape)
        lines.append(f"slot {kind} {tr[input_name]} {ev.get(input_name, -1)} {lg.get(input_name, -1)} "
                     f"{v.src.nbytes} {codes[v.dtype.name]} {len(v.shape)} {shape} {tensor}".replace("  ", " "))
    for item in loads:
        if isinstance(item, Fill):
            lines.append(f"fill {item.index} {item.data.hex()}")
            continue
        index, offset, crc = item
        lines.append(f"load {index} {offset} {'-' if crc is None else f'{crc:08x}'}")
    for line in lines:
        if "\n" in line or "\r" in line or "\0" in line:
            raise MicaError(f"a setting holds a line break or NUL, which the trainer cannot take: {line[:60]!r}")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        cbuild.remove_quietly(tmp)
        raise MicaError(f"cannot write the trainer's manifest {path} ({e.strerror}); check that its folder is "
                        "writable and the disk has room") from None

