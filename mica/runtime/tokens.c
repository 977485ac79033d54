/* Token data: nanoGPT's .bin (raw uint16) and the speedrun's shards (256 int32 of header: magic
 * 20240520, version 1, token count; then uint16 tokens), memory-mapped. A split may span several
 * files (shards, in sorted order): a row is any window of block + 1 tokens inside one file, and
 * windows are numbered across the files in order, so with one file a window is its offset. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime.h"

#define SHARD_MAGIC 20240520
#define SHARD_HEADER 1024

static void open_one(token_file *t, const file_spec *spec, const char *what) {
    t->path = spec->path;
    int fd = open(spec->path, O_RDONLY);
    if (fd < 0) die(2, "cannot open the %s file %s: %s", what, spec->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        die(2, "the %s file %s is not a regular file; point data_dir at a folder of token files", what, spec->path);
    int64_t size = st.st_size;
    if (spec->header != 0 && spec->header != SHARD_HEADER) die(2, "the manifest gives %s an unknown header", spec->path);
    if (size < spec->header || (size - spec->header) % 2)
        die(2, "the %s file %s is truncated (%lld bytes); prepare it again", what, spec->path, (long long)size);
    if (spec->header) {
        int32_t head[3];
        if (pread(fd, head, sizeof head, 0) != (ssize_t)sizeof head || head[0] != SHARD_MAGIC || head[1] != 1 ||
            (int64_t)head[2] * 2 != size - spec->header)
            die(2, "the %s shard %s has a damaged header (it changed after mica checked it); prepare it again",
                what, spec->path);
    }
    t->n = (size - spec->header) / 2;
    t->tok = 0;
    if (size > 0) {
        void *p = mmap(0, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) die(2, "cannot map the %s file %s: %s", what, spec->path, strerror(errno));
        t->tok = (const uint16_t *)((const char *)p + spec->header);
    }
    close(fd);
}

void tokens_open(token_set *set, const file_spec *specs, int n, const char *what) {
    set->files = calloc(n, sizeof *set->files);
    set->nfiles = n;
    set->what = what;
    set->windows = 0;
    for (int i = 0; i < n; i++) {
        token_file *t = &set->files[i];
        open_one(t, &specs[i], what);
        t->first_window = set->windows;
        if (t->n > S.block) set->windows += t->n - S.block;
    }
    if (set->windows == 0)
        die(2, "the %s holds no file with block_size + 1 = %lld tokens; use a smaller block_size or more data", what,
            (long long)(S.block + 1));
}

void tokens_row(const token_set *set, int64_t window, int64_t *x, int64_t *y) {
    if (window < 0 || window >= set->windows)
        die(2, "batch offset %lld lies outside the %s (%lld rows fit in it); resume or replay with the data the run "
            "was trained on", (long long)window, set->what, (long long)set->windows);
    int lo = 0, hi = set->nfiles - 1; /* the last file whose first window is <= window */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (set->files[mid].first_window <= window) lo = mid;
        else hi = mid - 1;
    }
    const token_file *t = &set->files[lo];
    const uint16_t *row = t->tok + (window - t->first_window);
    for (int64_t i = 0; i <= S.block; i++)
        if (row[i] >= S.vocab)
            die(2, "the %s file %s holds token id %u at position %lld, beyond the vocabulary of %lld (it changed "
                "after mica checked it); prepare it again", set->what, t->path, row[i],
                (long long)(window - t->first_window + i), (long long)S.vocab);
    for (int64_t i = 0; i < S.block; i++) {
        x[i] = row[i];
        y[i] = row[i + 1];
    }
}
