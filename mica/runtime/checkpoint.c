/* Checkpoints in safetensors: an 8-byte header length, a JSON header (metadata, then each
 * tensor's dtype, shape and byte range), then the bytes. Written to a temporary file, synced and
 * renamed, so a crash or a full disk never spoils the last good one. The metadata holds a CRC-32
 * (zlib's) of every tensor, checked whenever a tensor is read back. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime.h"

/* ---- CRC-32, reflected polynomial 0xEDB88320, eight bytes a step (slicing-by-8) --------------- */
static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 255];
}

uint32_t crc32_update(uint32_t crc, const void *data, size_t n) {
    if (!crc_table[0][1]) crc_init();
    const unsigned char *p = data;
    crc = ~crc;
    for (; n && ((uintptr_t)p & 7); n--) crc = crc_table[0][(crc ^ *p++) & 255] ^ (crc >> 8);
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = crc_table[7][lo & 255] ^ crc_table[6][(lo >> 8) & 255] ^ crc_table[5][(lo >> 16) & 255] ^
              crc_table[4][lo >> 24] ^ crc_table[3][hi & 255] ^ crc_table[2][(hi >> 8) & 255] ^
              crc_table[1][(hi >> 16) & 255] ^ crc_table[0][hi >> 24];
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 255] ^ (crc >> 8);
    return ~crc;
}

/* ---- a growing text buffer for the header ---------------------------------------------------- */
typedef struct {
    char *p;
    size_t n, cap;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = t->cap - t->n;
        int k = vsnprintf(t->p + t->n, room, fmt, ap);
        va_end(ap);
        if (k >= 0 && (size_t)k < room) {
            t->n += k;
            return;
        }
        t->cap = t->cap * 2 + k + 64;
        t->p = realloc(t->p, t->cap);
    }
}

/* a JSON string of `s` (metadata values are strings, so JSON inside them is escaped) */
static void put_escaped(text *t, const char *s) {
    put(t, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') put(t, "\\%c", *s);
        else if ((unsigned char)*s < 32) put(t, "\\u%04x", *s);
        else put(t, "%c", *s);
    }
    put(t, "\"");
}

/* the header; the CRCs are fixed width, so it has the same length before and after they are known */
static void header(text *t, int64_t iter, double best, int64_t nnext, const uint64_t gen[4], const uint32_t *crc) {
    t->n = 0;
    /* the metadata a resume reads, and a CRC-32 of it: iter_num, best_val_loss, rng and config, each
     * as stored, joined by newlines (mica/train/checkpoint.py checks the same) */
    text meta = {0};
    put(&meta, "%lld\n%.17g\n%016llx %016llx %016llx %016llx\n%s", (long long)iter, best, (unsigned long long)gen[0],
        (unsigned long long)gen[1], (unsigned long long)gen[2], (unsigned long long)gen[3],
        S.config_json ? S.config_json : "{}");
    put(t, "{\"__metadata__\":{\"format\":\"mica\",\"iter_num\":\"%lld\",\"best_val_loss\":\"%.17g\","
        "\"rng\":\"%016llx %016llx %016llx %016llx\",\"meta_crc32\":\"%08x\",\"config\":", (long long)iter, best,
        (unsigned long long)gen[0], (unsigned long long)gen[1], (unsigned long long)gen[2], (unsigned long long)gen[3],
        crc32_update(0, meta.p, meta.n));
    free(meta.p);
    put_escaped(t, S.config_json ? S.config_json : "{}");
    text sums = {0};
    put(&sums, "{");
    for (int i = 0; i < S.nslots; i++) put(&sums, "\"%s\":\"%08x\",", S.slots[i].name, crc[i]);
    put(&sums, "\"data.next_offsets\":\"%08x\"}", crc[S.nslots]);
    put(t, ",\"crc32\":");
    put_escaped(t, sums.p);
    free(sums.p);
    put(t, "}");
    int64_t data = 0;
    for (int i = 0; i < S.nslots; i++) {
        slot *s = &S.slots[i];
        put(t, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", s->name, s->dtype);
        for (int d = 0; d < s->ndim; d++) put(t, d ? ",%lld" : "%lld", (long long)s->shape[d]);
        put(t, "],\"data_offsets\":[%lld,%lld]}", (long long)data, (long long)(data + s->nbytes));
        data += s->nbytes;
    }
    put(t, ",\"data.next_offsets\":{\"dtype\":\"I64\",\"shape\":[%lld],\"data_offsets\":[%lld,%lld]}}",
        (long long)nnext, (long long)data, (long long)(data + nnext * 8));
    while (t->n % 8) put(t, " ");
}

/* a rank other than 0: its shards of the optimizer state (kind 2 slots), in order, to rank 0 */
static void send_shards(void) {
    char *buffer = staging();
    for (int i = 0; i < S.nslots; i++)
        for (int64_t at = 0; S.slots[i].kind == 2 && at < S.slots[i].nbytes; at += STAGING_BYTES) {
            int64_t n = S.slots[i].nbytes - at < STAGING_BYTES ? S.slots[i].nbytes - at : STAGING_BYTES;
            prog_get_input_part(ARENA_TRAIN, (int)S.slots[i].input[ARENA_TRAIN], at, n, buffer);
            dist_send_to_root(buffer, n);
        }
}

static int64_t last_written = -2; /* the iter of the last good checkpoint (this run's, or the one it resumed); -1: none */

void checkpoint_save(int64_t iter, double best, const int64_t *next, int64_t nnext, const uint64_t gen[4]) {
    if (last_written == -2) last_written = S.resume ? S.resume_iter : -1;
    if (S.rank != 0) {
        send_shards();
        return;
    }
    char path[8192], tmp[8300];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", S.out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    uint32_t *crc = calloc(S.nslots + 1, sizeof *crc);
    text h = {0};
    header(&h, iter, best, nnext, gen, crc);
    FILE *f = fopen(tmp, "wb");
    if (!f) die(2, "cannot write a checkpoint in %s: %s; nothing was replaced", S.out_dir, strerror(errno));
    uint64_t hlen = h.n;
    int ok = fwrite(&hlen, 8, 1, f) == 1 && fwrite(h.p, 1, h.n, f) == h.n;
    char *buffer = staging();
    int lost = -1; /* a rank whose shard did not arrive */
    for (int i = 0; i < S.nslots && ok; i++)
        for (int64_t at = 0; at < S.slots[i].nbytes && ok; at += STAGING_BYTES) {
            int64_t n = S.slots[i].nbytes - at < STAGING_BYTES ? S.slots[i].nbytes - at : STAGING_BYTES;
            if (S.slots[i].kind != 3)
                prog_get_input_part(ARENA_TRAIN, (int)S.slots[i].input[ARENA_TRAIN], at, n, buffer);
            else if (dist_recv_from(S.slots[i].owner, buffer, n)) {
                lost = S.slots[i].owner;
                ok = 0;
                break;
            }
            crc[i] = crc32_update(crc[i], buffer, n);
            ok = fwrite(buffer, 1, n, f) == (size_t)n;
        }
    crc[S.nslots] = crc32_update(0, next, nnext * 8);
    ok = ok && fwrite(next, 8, nnext, f) == (size_t)nnext;
    size_t before = h.n;
    header(&h, iter, best, nnext, gen, crc);
    ok = ok && h.n == before && fseeko(f, 8, SEEK_SET) == 0 && fwrite(h.p, 1, h.n, f) == h.n;
    ok = fflush(f) == 0 && ok && fsync(fileno(f)) == 0;
    int err = errno;
    if (lost >= 0) {
        fclose(f);
        unlink(tmp);
        die(2, "rank %d stopped before it sent its share of the optimizer state, so no checkpoint was written (the "
            "last good one in %s is untouched); see its message", lost, S.out_dir);
    }
    if (fclose(f) != 0 || !ok) {
        unlink(tmp);
        const char *unit = strcmp(S.loop, "speedrun") ? "iter" : "step";
        die(2, "writing the checkpoint in %s failed (%s); %s: free space (or fix the folder), then %s", S.out_dir,
            strerror(err ? err : errno), log_last_good(unit, last_written),
            last_written >= 0 ? "resume from it with --init_from=resume" : "start the run again");
    }
    if (rename(tmp, path) != 0) {
        err = errno;
        unlink(tmp);
        die(2, "cannot move the checkpoint into place in %s: %s", S.out_dir, strerror(err));
    }
    last_written = iter;
    free(h.p);
    free(crc);
}

void checkpoint_load(int which) {
    for (int i = 0; i < S.nslots; i++)
        if (S.slots[i].fill && S.slots[i].input[which] >= 0)
            prog_set_input_part(which, (int)S.slots[i].input[which], 0, S.slots[i].nbytes, S.slots[i].fill);
    if (!S.init_file) return;
    FILE *f = fopen(S.init_file, "rb");
    if (!f) die(2, "cannot read %s: %s", S.init_file, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) die(2, "%s is not a regular file", S.init_file);
    char *buffer = staging();
    for (int i = 0; i < S.nslots; i++) {
        slot *s = &S.slots[i];
        if (s->load_at < 0 || s->input[which] < 0) continue;
        if (s->load_at > st.st_size || s->nbytes > st.st_size - s->load_at || fseeko(f, s->load_at, SEEK_SET) != 0)
            die(2, "%s is truncated: tensor %s does not fit in it; use another checkpoint", S.init_file, s->name);
        uint32_t crc = 0;
        for (int64_t at = 0; at < s->nbytes; at += STAGING_BYTES) {
            int64_t n = s->nbytes - at < STAGING_BYTES ? s->nbytes - at : STAGING_BYTES;
            if (fread(buffer, 1, n, f) != (size_t)n)
                die(2, "%s is truncated: tensor %s could not be read; use another checkpoint", S.init_file, s->name);
            crc = crc32_update(crc, buffer, n);
            prog_set_input_part(which, (int)s->input[which], at, n, buffer);
        }
        if (s->has_crc && crc != s->crc) /* (nothing has run yet: the program's copy is simply never used) */
            die(2, "%s is corrupt: tensor %s does not match its checksum (its bytes changed after it was written); "
                "use another checkpoint", S.init_file, s->name);
    }
    fclose(f);
}
