"""A compiled CPU program loaded in this process (ctypes): call it with numpy arrays."""
import ctypes
import os
import threading

import numpy as np

from ... import pytree
from ...backends.reference import round_bf16
from ...dtypes import bfloat16, float16
from ...errors import MicaError
from ...ops.philox import check_key
from ...tensor import user_location


def check_threads(threads):
    """`threads` as a count of OpenMP threads, or one sentence."""
    if isinstance(threads, (bool, np.bool_)) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise MicaError(f"threads must be a positive whole number (OpenMP threads to run with), got {threads!r}",
                        user_location())
    return int(threads)


def refuse_keywords(unknown, known):
    """One sentence for keywords a compiled program's call does not take (where Python's TypeError was)."""
    if unknown:
        raise MicaError(f"a compiled program takes its traced arguments and the keywords {', '.join(known)}, not "
                        f"{next(iter(unknown))}=...; the target and its options are lower()'s", user_location())


def run_error(text, program):
    """A failed run's sentence (a kernel's, led by its verb: "embedding: index 12 is out of range ..."),
    at the line that traced that verb where the program has one such node, else at the call's line."""
    verb = text.split(":", 1)[0]
    places = {n.loc for n in program.graph.nodes if n.op == verb and n.loc}
    if not places and text.startswith("an index tensor holds"):  # (a gather's, index_select's, x[t]'s check)
        places = {n.loc for n in program.graph.nodes if n.op == "check_range" and n.loc
                  and n.attrs.get("mode") in ("index", "positions")}
    if not places and text.startswith("x[mask] = values"):  # (a masked assignment's count)
        places = {n.loc for n in program.graph.nodes if n.op == "check_range" and n.loc
                  and n.attrs.get("mode") == "count"}
    return MicaError(text, places.pop() if len(places) == 1 else user_location())


def _to_storage(array, dtype):
    a = np.asarray(array)
    if dtype is bfloat16:
        bits = round_bf16(a.astype(np.float32)).view(np.uint32) >> 16
        return bits.astype(np.uint16)
    if dtype is float16:
        return a.astype(np.float16)
    return a.astype(dtype.np_storage)


def _from_storage(a, dtype):
    if dtype is bfloat16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


_STORAGE_NP = {"bfloat16": np.dtype(np.uint16), "float16": np.dtype(np.float16)}



def load_library(path):
    """The compiled program at `path`, loaded into this process; a library that cannot load (one it
    links, such as cuBLASLt, moved or gone since it was built) is a sentence."""
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        if "failed to map segment" in str(e) or "Permission denied" in str(e):
            raise MicaError(f"the compiled program {path} cannot be loaded ({e}): the cache's file system does not "
                            "let programs run from it (mounted noexec?); set MICA_CACHE to a folder on another one") \
                from None
        raise MicaError(f"the compiled program {path} cannot be loaded ({e}); delete its folder from Mica's cache "
                        "(MICA_CACHE, else ~/.cache/mica) to build it again") from None


class Calls:
    """What both ways of running a program in this process share: a call copies its arguments in, runs once
    and returns the results, and calls from several threads take turns (one arena). A subclass says how
    one input goes in (`_put`), how a run goes (`run`) and how results come out (`results`)."""

    def _start_calls(self):
        self._calls = threading.Lock()

    def __call__(self, *args, threads=None, seed=0, offset=0, **unknown):
        """Copy the arguments in, run once, return the results (numpy, in the program's structure).
        `seed` and `offset` key dropout's stream: the same pair, the same masks (a loop passes its step)."""
        refuse_keywords(unknown, ("threads", "seed", "offset"))
        with self._calls:  # (the arguments, the run and the results of one call, never mixed with another's)
            self.load(*args)
            self.run(threads=threads, seed=seed, offset=offset)
            return self.results()

    def load(self, *args):
        """Copy every argument into the arena."""
        for i, a in enumerate(self.lowered.program.flatten_args(args)):  # (checked there)
            self._put(i, a)

    def set_input(self, index, array):
        """Overwrite one input (by its flat index) — e.g. the next batch between steps."""
        self._put(index, self.lowered.program.checked_input(index, array))


class Executable(Calls):
    """A compiled program loaded in this process: call it with numpy arrays."""

    def __init__(self, lowered, library):
        self.lowered = lowered
        self.library = library
        self.source = lowered.source
        self.memory_report = lowered.memory_report
        self._lib = lib = load_library(library)
        lib.mica_arena_bytes.restype = ctypes.c_int64
        lib.mica_arena_new.restype = ctypes.c_void_p
        lib.mica_arena_free.argtypes = [ctypes.c_void_p]
        lib.mica_run.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        lib.mica_error.restype = ctypes.c_char_p
        lib.mica_kernel_label.restype = ctypes.c_char_p
        lib.mica_kernel_time.restype = ctypes.c_double
        self.arena_bytes = lib.mica_arena_bytes()
        self._arena = lib.mica_arena_new()
        if not self._arena:
            raise MicaError(f"could not allocate the program's arena of {self.arena_bytes:,} bytes")
        self._mem = np.ctypeslib.as_array((ctypes.c_uint8 * self.arena_bytes).from_address(self._arena))
        self._start_calls()

    def __del__(self):
        lib, arena = getattr(self, "_lib", None), getattr(self, "_arena", None)
        if lib is not None and arena:
            lib.mica_arena_free(arena)
            self._arena = None

    def _buffer(self, buf):
        storage = _STORAGE_NP.get(buf.dtype.name, buf.dtype.np_storage)
        offset = self.lowered.plan.offset(buf)
        return self._mem[offset:offset + buf.nbytes].view(storage)

    def _read(self, view):
        flat = self._buffer(view.src)
        size = flat.itemsize
        arr = np.lib.stride_tricks.as_strided(flat[view.offset:], shape=view.shape,
                                              strides=[s * size for s in view.strides])
        return _from_storage(np.array(arr), view.dtype)

    def _put(self, index, a):
        view = self.lowered.schedule.inputs[index]
        self._buffer(view.src)[...] = _to_storage(a, view.dtype).reshape(-1)

    def run(self, threads=None, seed=0, offset=0):
        """Run once over what is in the arena. State updated in place stays there for the next run."""
        threads = min(os.cpu_count() or 1, self.lowered.target.max_threads) if threads is None else \
            check_threads(threads)
        seed, offset = check_key(seed, offset)
        rc = self._lib.mica_run(self._arena, int(threads), seed, offset)
        if rc != 0:
            raise run_error(self._lib.mica_error().decode(), self.lowered.program)

    def results(self):
        schedule = self.lowered.schedule
        return pytree.unflatten(self.lowered.program.out_tree, [self._read(v) for v in schedule.outputs])

    @property
    def state_in_place(self):
        """True when every state input is updated where it lies (so run() can be repeated)."""
        g = self.lowered.graph
        updated = set(g.updates.values())
        plan = self.lowered.plan
        return bool(updated) and all(plan.root(new) is old for new, old in self.lowered.schedule.updates) and \
            len(self.lowered.schedule.updates) == len(updated)

    def profile(self):
        """[(kernel label, seconds)] accumulated since load (needs build(profile=True))."""
        lib = self._lib
        return [(lib.mica_kernel_label(k).decode(), lib.mica_kernel_time(k)) for k in range(lib.mica_kernel_count())]
