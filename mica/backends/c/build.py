"""Build generated C into a shared library, cached by the source's hash and the flags."""
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

from ...errors import MicaError
from .emit import INCLUDES, RUNTIME_HEADERS

BASE_FLAGS = ["-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-fPIC",
              "-mprefer-vector-width=512", "-std=gnu11", "-Wno-unused-function", "-Wno-unused-variable"]
GCC_OPT = {0: "-O1", 1: "-O2", 2: "-O3"}


def cache_dir():
    """Where built programs are kept: MICA_CACHE, else $XDG_CACHE_HOME/mica or ~/.cache/mica."""
    root = os.environ.get("MICA_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                         os.path.expanduser("~/.cache"), "mica")
    try:
        os.makedirs(root, exist_ok=True)
        if not os.access(root, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as e:
        named = "MICA_CACHE" if os.environ.get("MICA_CACHE") else "the build cache"
        raise MicaError(f"{named} {root} cannot be a folder Mica writes built programs into ({e.strerror}); set "
                        "MICA_CACHE to a folder you can write") from None
    return root


def cached(path):
    """True when a built file is in the cache whole: its digest matches the one written beside it
    when it was built (a truncated or damaged binary is rebuilt, never run)."""
    try:
        with open(path + ".sha256") as f:
            want = f.read().strip()
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest() == want
    except OSError:
        return False


def install(tmp, path, tool="the compiler"):
    """Move a freshly built file into the cache under `path`, its digest beside it. An empty file
    (a compiler that said it succeeded and wrote nothing: CC=true) is a failed build, never a
    cache entry."""
    if not os.path.exists(tmp) or os.path.getsize(tmp) == 0:
        remove_quietly(tmp)
        advice = "is CC a compiler? set CC to gcc" if "C compiler" in tool else f"check {tool}'s installation"
        raise MicaError(f"{tool} reported success but wrote nothing to {path}; {advice} and run again")
    with open(tmp, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    try:
        _write_file(tmp + ".sha256", digest + "\n")
        os.replace(tmp, path)
        os.replace(tmp + ".sha256", path + ".sha256")
    except OSError as e:
        for p in (tmp, tmp + ".sha256"):
            remove_quietly(p)
        raise _cache_write_error(path, e) from None


# the names of a build's own temporaries: tempfile's tmpXXXXXXXX (and .part/.so/.sha256), and the
# objects native.py's _temporary names name.XXXXXXXX.o
_TEMPORARY = re.compile(r"tmp[a-z0-9_]{8}(\.part|\.so|\.sha256|\.so\.sha256)?|[a-z_0-9]+\.[a-z0-9_]{8}\.o(\.sha256)?")


def sweep_temporaries(folder, age=3600.0):
    """Remove the temporary files a build killed outright (SIGKILL, a power cut) left in a cache
    entry: its own temporaries' names (tempfile's tmpXXXXXXXX, name.XXXXXXXX.o), only when older
    than `age` seconds (a build of the same entry running now in another process keeps its own)."""
    import time

    try:
        names = os.listdir(folder)
    except OSError:
        return
    now = time.time()
    for name in names:
        path = os.path.join(folder, name)
        try:
            if _TEMPORARY.fullmatch(name) and now - os.path.getmtime(path) > age:
                os.unlink(path)
        except OSError:
            pass


def remove_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _write_file(path, text):
    with open(path, "w") as f:
        f.write(text)


def _cache_write_error(path, e):
    """One sentence for a file Mica could not write (a full disk, a read-only folder), naming it."""
    return MicaError(f"cannot write {path} ({e.strerror or e}); free space there, or set MICA_CACHE to a folder with "
                     "room that you can write")


def write_whole(path, text):
    """Write `text` to `path` through a temporary file and a rename, so a compiler another process
    has started on the same cache entry never reads half a file; a write that fails leaves nothing
    behind and is one sentence naming the file."""
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".part")
    except OSError as e:
        raise _cache_write_error(path, e) from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        remove_quietly(tmp)
        raise _cache_write_error(path, e) from None


def compiler():
    cc = os.environ.get("CC") or "gcc"
    path = shutil.which(cc)
    if path is None:
        raise MicaError(f"no C compiler found ({cc!r} is not on PATH): install gcc (apt install gcc) or set CC")
    return path


def flags(opt_level):
    return [GCC_OPT.get(opt_level, "-O3")] + BASE_FLAGS


def blas_flags(blas):
    """Compile and link flags for the product library."""
    if blas == "own":
        return [], []
    if blas != "openblas":
        raise MicaError(f"unknown BLAS {blas!r}; use 'openblas' or 'own'")
    try:
        import scipy_openblas32
    except ImportError:
        raise MicaError("OpenBLAS is not installed: pip install scipy-openblas32 (or lower with blas='own' "
                        "to use Mica's own product kernel)") from None
    lib = scipy_openblas32.get_lib_dir()
    return ["-DMICA_OPENBLAS"], ["-L", lib, "-l" + scipy_openblas32.get_library(), f"-Wl,-rpath,{lib}"]


def _headers_digest():
    h = hashlib.sha256()
    for path in RUNTIME_HEADERS:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def build(source, opt_level, name="program", profile=False, blas="openblas"):
    """Compile `source` to a shared library (cached); returns its path. `profile` times every
    kernel (mica_kernel_time)."""
    cc = compiler()
    cflags, ldflags = blas_flags(blas)
    if '#include "mica_collectives.h"' in source:  # collectives across ranks: Open MPI
        from .collectives import mpi_flags

        mpi_c, mpi_l = mpi_flags()
        cflags, ldflags = [*cflags, *mpi_c], [*ldflags, *mpi_l]
    fl = flags(opt_level) + cflags + (["-DMICA_PROFILE"] if profile else [])
    key = hashlib.sha256("\0".join([source, cc, *fl, *ldflags, _headers_digest()]).encode()).hexdigest()[:24]
    return compile_cached(source, os.path.join(cache_dir(), key), "program.c", "the C compiler", name,
                          lambda src, out: [cc, *fl, "-shared", *INCLUDES, src, "-o", out, *ldflags, "-lm"])


def run_tools(commands):
    """Run the compiler commands at once, each in its own process group; [(exit status, stderr)].
    If this process is interrupted meanwhile (Ctrl-C, SIGTERM), every group is killed (gcc's cc1
    and as with it) before the interruption goes on: no compiler is left running without a parent."""
    procs = []
    try:
        for cmd in commands:
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                          start_new_session=True))
        errs = [p.communicate()[1] for p in procs]
        return [(p.returncode, err) for p, err in zip(procs, errs)]
    except BaseException:
        import signal

        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
        for p in procs:
            p.wait()
        raise


def first_error(stderr, status):
    """The line of a compiler's stderr that says what failed (or its start), or its exit status."""
    found = next((line for line in stderr.splitlines() if "error" in line or "cannot find" in line), stderr.strip()[:300])
    return found.strip() or f"it exited with status {status} and said nothing"


def compile_cached(source, out_dir, src_name, compiler_name, name, command):
    """The shared library built from `source` in `out_dir` (the cache entry): kept when whole,
    else `command(source path, output path)` runs and a failure is one sentence naming the source."""
    lib = os.path.join(out_dir, "libmica_program.so")
    if cached(lib):
        sweep_temporaries(out_dir)  # (what a killed build of this entry left: an entry built since is only read)
        return lib
    os.makedirs(out_dir, exist_ok=True)
    src = os.path.join(out_dir, src_name)
    write_whole(src, source)
    with tempfile.NamedTemporaryFile(dir=out_dir, suffix=".so", delete=False) as tmp:
        tmp_path = tmp.name
    try:
        [(status, stderr)] = run_tools([command(src, tmp_path)])
    except BaseException:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)
        raise
    if status != 0:
        if os.path.exists(tmp_path):  # (a compiler that failed while linking has removed it itself)
            os.unlink(tmp_path)
        hint = "; install Debian's libboost-context-dev, which the CUDA simulator's threads need" \
            if "boost" in stderr else ""
        raise MicaError(f"{compiler_name} failed on the generated program for {name} ({first_error(stderr, status)}); "
                        f"the source is at {src}{hint}")
    install(tmp_path, lib, compiler_name)
    sweep_temporaries(out_dir)
    return lib
