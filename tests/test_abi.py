"""The program ABI every generated program exports: its inputs and outputs by index (name,
dtype, shape, bytes) and the copies in and out of its arena, so a runtime never computes an arena
offset itself (a device arena requires it). Round trips against the in-process Executable."""
import ctypes

import numpy as np

import mica


def _program():
    def step(w, x, scale):
        y = mica.gelu(x @ w) * scale
        return {"t": y.transpose(0, 1), "total": y.sum(), "w2": w * 2.0}

    return mica.trace(step, mica.f32[6, 5], mica.f32[4, 6], mica.f64[()])


def _abi(exe):
    lib = ctypes.CDLL(exe.library)
    for name, res, args in [("input_count", ctypes.c_int, []), ("output_count", ctypes.c_int, []),
                            ("input_name", ctypes.c_char_p, [ctypes.c_int]),
                            ("input_dtype", ctypes.c_char_p, [ctypes.c_int]),
                            ("input_ndim", ctypes.c_int, [ctypes.c_int]),
                            ("input_dim", ctypes.c_int64, [ctypes.c_int, ctypes.c_int]),
                            ("input_bytes", ctypes.c_int64, [ctypes.c_int]),
                            ("output_bytes", ctypes.c_int64, [ctypes.c_int]),
                            ("run", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]),
                            ("set_input", None, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]),
                            ("get_input", None, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]),
                            ("get_output", None, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]),
                            ("get_output_part", None, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                                                       ctypes.c_int64, ctypes.c_void_p])]:
        f = getattr(lib, "mica_" + name)
        f.restype, f.argtypes = res, args
    return lib


def test_the_abi_describes_every_input_and_output():
    program = _program()
    exe = program.lower("cpu").build()
    lib = _abi(exe)
    assert lib.mica_input_count() == 3 and lib.mica_output_count() == 3
    for i, (name, v) in enumerate(zip(program.input_names, program.graph.inputs)):
        assert lib.mica_input_name(i).decode() == name
        assert lib.mica_input_dtype(i).decode() == {"float32": "F32", "float64": "F64"}[v.dtype.name]
        assert [lib.mica_input_dim(i, d) for d in range(lib.mica_input_ndim(i))] == list(v.shape)
        assert lib.mica_input_bytes(i) == v.numel * v.dtype.itemsize
    assert [lib.mica_output_bytes(i) for i in range(3)] == [4 * 5 * 4, 4, 6 * 5 * 4]
    assert lib.mica_input_name(3) is None and lib.mica_input_bytes(-1) == -1  # out of range: no crash


def test_set_input_run_get_output_equals_the_executable():
    program = _program()
    exe = program.lower("cpu").build()
    lib = _abi(exe)
    rng = np.random.default_rng(3)
    w, x = rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal((4, 6)).astype(np.float32)
    scale = np.float64(1.5)
    want = exe(w, x, scale, threads=1)
    arena = exe._arena
    for i, a in enumerate((w, x, np.asarray(scale))):
        lib.mica_set_input(arena, i, np.ascontiguousarray(a).ctypes.data)
    assert lib.mica_run(arena, 1, 0, 0) == 0
    got_t = np.empty((5, 4), np.float32)  # a strided view of the product's output, written dense
    lib.mica_get_output(arena, 0, got_t.ctypes.data)
    assert np.array_equal(got_t, want["t"])
    total = np.empty((), np.float32)
    lib.mica_get_output(arena, 1, total.ctypes.data)
    assert total == want["total"]
    part = np.empty(7, np.float32)  # elements [6, 13) of the row-major output
    lib.mica_get_output_part(arena, 0, 6, 7, part.ctypes.data)
    assert np.array_equal(part, want["t"].reshape(-1)[6:13])
    back = np.empty((6, 5), np.float32)
    lib.mica_get_input(arena, 0, back.ctypes.data)
    assert np.array_equal(back, w)
