"""A compiled program driven in this process through its ABI alone (inputs and outputs by index):
the way to run a program whose arena is not host memory (CUDA, or its simulator)."""
import ctypes

import numpy as np

from ... import pytree
from ...errors import MicaError
from ...ops.philox import check_key
from ..c.executable import Calls, _from_storage, _to_storage, check_threads, load_library, run_error


class AbiExecutable(Calls):
    def __init__(self, lowered, library, api="mica_"):
        self.lowered = lowered
        self.library = library
        self.source = lowered.source
        self.memory_report = lowered.memory_report
        self._lib = lib = load_library(library)
        self._start_calls()
        f = lambda name, res, *args: self._fn(api + name, res, args)  # noqa: E731
        self._arena_bytes = f("arena_bytes", ctypes.c_int64)
        self._arena_new = f("arena_new", ctypes.c_void_p)
        self._arena_free = f("arena_free", None, ctypes.c_void_p)
        self._run = f("run", ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
        self._error = f("error", ctypes.c_char_p)
        self._set = f("set_input", None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
        self._get = f("get_output", None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
        self.arena_bytes = self._arena_bytes()
        self._arena = self._arena_new()
        if not self._arena:
            raise MicaError(self._error().decode() or f"could not allocate the program's {self.arena_bytes:,} bytes")

    def _fn(self, name, res, args):
        fn = getattr(self._lib, name)
        fn.restype, fn.argtypes = res, list(args)
        return fn

    def __del__(self):
        arena = getattr(self, "_arena", None)
        if arena:
            self._arena_free(arena)
            self._arena = None

    def _put(self, index, a):
        view = self.lowered.schedule.inputs[index]
        data = np.ascontiguousarray(_to_storage(a, view.dtype).reshape(view.shape))
        self._set(self._arena, index, data.ctypes.data)

    def run(self, threads=None, seed=0, offset=0):
        threads, (seed, offset) = (1 if threads is None else check_threads(threads)), check_key(seed, offset)
        rc = self._run(self._arena, threads, seed, offset)
        if rc != 0:
            raise run_error(self._error().decode(), self.lowered.program)

    def results(self):
        outs = []
        for i, view in enumerate(self.lowered.schedule.outputs):
            storage = {"bfloat16": np.uint16, "float16": np.float16}.get(view.dtype.name, view.dtype.np_storage)
            a = np.empty(view.shape, dtype=storage)
            self._get(self._arena, i, a.ctypes.data)
            outs.append(_from_storage(a, view.dtype))
        return pytree.unflatten(self.lowered.program.out_tree, outs)
