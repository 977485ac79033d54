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
#include <string.h>
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
/* log.c: the run's folder and world, and what a rank would say if a signal ended it */
static char stop_text[9000];
void dist_set_stop_text(const char *text) { snprintf(stop_text, sizeof stop_text, "%s", text); }
const char *last_stop_text(void) { return stop_text; }
void set_run(const char *out_dir, long long pending, long long world) {
    S.out_dir = strdup(out_dir); S.pending = pending; S.world = world; S.rank = 0;
}
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
           os.path.join(RUNTIME, "log.c"), "-o", str(so)]
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
    lib.set_run.argtypes = [ctypes.c_char_p, ctypes.c_longlong, ctypes.c_longlong]
    lib.last_stop_text.restype = ctypes.c_char_p
    lib.log_last_good.restype = ctypes.c_char_p
    lib.log_last_good.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    lib.log_stop_text.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    lib.log_interrupted.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64]
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


def test_a_stopped_run_names_what_it_left_in_the_loops_unit(lib, capfd):
    """log.c's sentences, which the nanoGPT loop (iters) and the speedrun's (steps) both say: the
    last checkpoint of this run, or none, with an earlier run's files untouched; the text a rank of
    several gives when mpirun ends it; Ctrl-C's line in stderr."""
    lib.set_run(b"out", 0, 1)
    assert lib.log_last_good(b"step", 12) == b"the last good checkpoint, out/ckpt.safetensors (step 12), is untouched"
    assert lib.log_last_good(b"iter", -1) == (b"this run saved no checkpoint (any ckpt.safetensors in out is from an "
                                               b"earlier run, untouched)")
    lib.log_stop_text(b"iter", 5)
    assert lib.last_stop_text() == b""  # (one process: its own signal handler speaks)
    lib.set_run(b"runs/b", 1, 2)
    assert lib.log_last_good(b"iter", -1) == (b"this run saved no checkpoint (the earlier run's ckpt.safetensors, "
                                               b"metrics.jsonl and init.safetensors in runs/b are untouched; this "
                                               b"run's log is metrics.jsonl.new)")
    lib.log_stop_text(b"step", 40)
    assert lib.last_stop_text() == (b"mpirun ended this run (another rank failed or the run was interrupted); the "
                                    b"last good checkpoint, runs/b/ckpt.safetensors (step 40), is untouched")
    capfd.readouterr()
    assert lib.log_interrupted(b"after", b"step", 41, 40) == 130
    assert lib.log_interrupted(b"while validating at", b"step", 3, -1) == 130
    err = capfd.readouterr().err.splitlines()
    assert err == ["mica: interrupted after step 41; the last good checkpoint is runs/b/ckpt.safetensors (step 40): "
                   "resume with --init_from=resume",
                   "mica: interrupted while validating at step 3; this run saved no checkpoint (the earlier run's "
                   "ckpt.safetensors, metrics.jsonl and init.safetensors in runs/b are untouched; this run's log is "
                   "metrics.jsonl.new)"]
