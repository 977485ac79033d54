"""The trainer runtime's modules on their own: each C module compiled with a small harness of
stubs and driven from Python (the end-to-end behaviour is in test_runtime.py)."""
import ctypes
import os
import random
import subprocess
import zlib

import numpy as np
import pytest

RUNTIME = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mica", "runtime")

HARNESS = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "runtime.h"
settings S;
volatile sig_atomic_t interrupted;
void die(int code, const char *fmt, ...) { va_list ap; va_start(ap, fmt); vfprintf(stderr, fmt, ap); va_end(ap); exit(code); }
double now(void) { return 0; }
void prog_get_input_part(int which, int i, int64_t s, int64_t n, void *dst) { (void)which; (void)i; (void)s; (void)n; (void)dst; }
void prog_set_input_part(int which, int i, int64_t s, int64_t n, const void *src) { (void)which; (void)i; (void)s; (void)n; (void)src; }
char *staging(void) { static char b[1]; return b; }
void dist_send_to_root(const void *d, int64_t n) { (void)d; (void)n; }
int dist_recv_from(int owner, void *d, int64_t n) { (void)owner; (void)d; (void)n; return 1; }
/* tokens.c: open a set of files and read rows */
static token_set set;
int open_set(const char **paths, const long long *headers, int n, long long block, long long vocab) {
    file_spec *specs = calloc(n, sizeof *specs);
    for (int i = 0; i < n; i++) { specs[i].path = (char *)paths[i]; specs[i].header = headers[i]; }
    S.block = block; S.vocab = vocab;
    tokens_open(&set, specs, n, "test data");
    return 0;
}
long long set_windows(void) { return set.windows; }
void set_row(long long w, int64_t *x, int64_t *y) { tokens_row(&set, w, x, y); }
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("rt")
    src = d / "harness.c"
    src.write_text(HARNESS)
    so = d / "harness.so"
    cmd = ["gcc", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-I", RUNTIME, str(src),
           os.path.join(RUNTIME, "checkpoint.c"), os.path.join(RUNTIME, "tokens.c"), os.path.join(RUNTIME, "rng.c"),
           "-o", str(so)]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(str(so))
    lib.crc32_update.restype = ctypes.c_uint32
    lib.crc32_update.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
    lib.rng_next.restype = ctypes.c_uint64
    lib.rng_seed.argtypes = [ctypes.c_uint64]
    lib.rng_uniform.restype = ctypes.c_int64
    lib.rng_uniform.argtypes = [ctypes.c_int64]
    lib.set_windows.restype = ctypes.c_longlong
    lib.set_row.argtypes = [ctypes.c_longlong, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def test_the_checkpoint_crc_is_zlibs_at_every_length_and_alignment(lib):
    rng = random.Random(5)
    buf = bytes(rng.randrange(256) for _ in range(5000))
    raw = ctypes.create_string_buffer(buf)
    base = ctypes.addressof(raw)
    for _ in range(300):
        start, n = rng.randrange(64), rng.randrange(4000)
        assert lib.crc32_update(0, base + start, n) == zlib.crc32(buf[start:start + n]), (start, n)
    # in pieces, as a stream: crc(a + b) from crc(a)
    a = lib.crc32_update(0, base, 1234)
    assert lib.crc32_update(a, base + 1234, 2000) == zlib.crc32(buf[:3234])


def test_the_batch_generator_is_seeded_and_unbiased_in_range(lib):
    lib.rng_seed(1337)
    first = [lib.rng_next() for _ in range(4)]
    lib.rng_seed(1337)
    assert [lib.rng_next() for _ in range(4)] == first
    draws = [lib.rng_uniform(7) for _ in range(7000)]
    assert min(draws) == 0 and max(draws) == 6
    counts = np.bincount(draws, minlength=7)
    assert counts.min() > 850 and counts.max() < 1150  # ~1000 each (4 sigma)


def test_token_windows_span_files_in_order_and_rows_are_shifted_by_one(lib, tmp_path):
    from mica.data import tokens as tok

    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 50, n).astype(np.uint16) for n in (40, 5, 30)]
    paths = []
    for i, p in enumerate(parts):
        path = str(tmp_path / f"train_{i:03d}.bin")
        (tok.write_shard if i == 2 else tok.write_bin)(path, p)
        paths.append(path)
    block = 8
    c_paths = (ctypes.c_char_p * 3)(*[p.encode() for p in paths])
    headers = (ctypes.c_longlong * 3)(0, 0, 1024)
    lib.open_set(c_paths, headers, 3, block, 50)
    assert lib.set_windows() == (40 - block) + 0 + (30 - block)
    x, y = np.zeros(block, np.int64), np.zeros(block, np.int64)
    for w, (part, at) in {0: (0, 0), 31: (0, 31), 32: (2, 0), 53: (2, 21)}.items():
        lib.set_row(w, x.ctypes.data, y.ctypes.data)
        assert np.array_equal(x, parts[part][at:at + block]) and np.array_equal(y, parts[part][at + 1:at + block + 1])
