/* The manifest: one setting per line, "key value...", written by `mica train` / `mica sample`.
 * It names every arena offset the loop touches (the compiler knows the memory plan; the runtime
 * never works one out). Every field is checked before use: a damaged or hand-edited manifest is a
 * sentence, never a crash. Lines have no length limit. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

settings S;

static const char *manifest_path;
static long line_no;

static void bad(const char *what) __attribute__((noreturn));
static void bad(const char *what) {
    die(2, "the manifest %s is damaged at line %ld (%s); run mica train or mica sample again to rewrite it",
        manifest_path, line_no, what);
}

static int64_t parse_int(const char *text) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    while (*end == ' ') end++;
    if (end == text || *end || errno) bad("a number was expected");
    return v;
}

static double parse_double(const char *text) {
    char *end;
    double v = strtod(text, &end);
    while (*end == ' ') end++;
    if (end == text || *end) bad("a number was expected");
    return v;
}

/* a list of integers separated by spaces; *count receives how many */
static int64_t *parse_int_list(const char *text, int64_t *count) {
    int64_t n = 0, cap = 16, *out = malloc(cap * sizeof *out);
    const char *p = text;
    for (;;) {
        while (*p == ' ') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || (*end && *end != ' ')) bad("a list of numbers was expected");
        if (n == cap) out = realloc(out, (cap *= 2) * sizeof *out);
        out[n++] = v;
        p = end;
    }
    *count = n;
    return out;
}

static char *copy(const char *text) {
    size_t n = strlen(text) + 1;
    return memcpy(malloc(n), text, n);
}

/* "HEADER PATH": the path is the rest of the line, so it may hold spaces */
static void add_file(file_spec **list, int *n, char *v) {
    char *end;
    long long header = strtoll(v, &end, 10);
    if (end == v || *end != ' ' || header < 0) bad("a token file needs its header size and path");
    *list = realloc(*list, (*n + 1) * sizeof **list);
    (*list)[*n].header = header;
    (*list)[*n].path = copy(end + 1);
    (*n)++;
}

static int64_t itemsize(const char *dtype) {
    if (!strcmp(dtype, "F32") || !strcmp(dtype, "I32")) return 4;
    if (!strcmp(dtype, "F64") || !strcmp(dtype, "I64")) return 8;
    if (!strcmp(dtype, "BF16") || !strcmp(dtype, "F16")) return 2;
    return 0;
}

static void slot_shape(slot *s, char *p);

/* "KIND TRAIN_INPUT EVAL_INPUT LOGITS_INPUT NBYTES DTYPE NDIM DIMS... NAME" (input indices, -1: absent) */
static void add_slot(char *v) {
    S.slots = realloc(S.slots, (S.nslots + 1) * sizeof *S.slots);
    slot *s = &S.slots[S.nslots];
    memset(s, 0, sizeof *s);
    long long kind, input[3], nbytes, ndim;
    int used = 0;
    if (sscanf(v, "%lld %lld %lld %lld %lld %7s %lld %n", &kind, &input[0], &input[1], &input[2], &nbytes, s->dtype,
               &ndim, &used) != 7 || used == 0)
        bad("a slot line is incomplete");
    if (kind < 0 || kind > 2 || ndim < 0 || ndim > 8) bad("a slot has an impossible kind or rank");
    s->kind = (int)kind;
    s->nbytes = nbytes;
    s->ndim = ndim;
    for (int i = 0; i < 3; i++) s->input[i] = input[i];
    slot_shape(s, v + used);
}

/* "OWNER NBYTES DTYPE NDIM DIMS... NAME": a checkpoint tensor another rank holds (ZeRO-1) */
static void add_remote(char *v) {
    S.slots = realloc(S.slots, (S.nslots + 1) * sizeof *S.slots);
    slot *s = &S.slots[S.nslots];
    memset(s, 0, sizeof *s);
    long long owner, nbytes, ndim;
    int used = 0;
    if (sscanf(v, "%lld %lld %7s %lld %n", &owner, &nbytes, s->dtype, &ndim, &used) != 4 || used == 0)
        bad("a remote slot line is incomplete");
    if (owner < 0 || owner > 1 << 20 || ndim < 0 || ndim > 8) bad("a remote slot has an impossible owner or rank");
    s->kind = 3;
    s->owner = (int)owner;
    s->nbytes = nbytes;
    s->ndim = ndim;
    for (int i = 0; i < 3; i++) s->input[i] = -1;
    slot_shape(s, v + used);
}

/* the rest of a slot line, "DIMS... NAME", into s; checks and counts it */
static void slot_shape(slot *s, char *p) {
    int64_t elements = 1;
    for (int d = 0; d < s->ndim; d++) {
        char *end;
        errno = 0;
        long long dim = strtoll(p, &end, 10);
        if (end == p || errno || dim < 0 || dim > (1ll << 40) || (dim && elements > (INT64_MAX / 8) / dim))
            bad("a slot's shape is not a list of sizes");
        s->shape[d] = dim;
        elements *= dim;
        p = end;
    }
    while (*p == ' ') p++;
    if (!*p) bad("a slot has no name");
    for (const char *c = p; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 32) bad("a slot's name has characters a checkpoint cannot hold");
    s->name = copy(p);
    if (!itemsize(s->dtype) || elements * itemsize(s->dtype) != s->nbytes) bad("a slot's size does not match its shape");
    s->load_at = -1;
    S.nslots++;
}

/* "INDEX FILE_OFFSET CRC32" (the CRC as 8 hex digits, or - where the file holds none) */
static void add_load(char *v) {
    long long index, at;
    char crc[16];
    if (sscanf(v, "%lld %lld %15s", &index, &at, crc) != 3) bad("a load line is incomplete");
    if (index < 0 || index >= S.nslots || at < 0) bad("a load line names no slot");
    slot *s = &S.slots[index];
    if (s->kind == 3) bad("a load line names a tensor another rank holds");
    if (s->fill) bad("a load line names a slot a fill line gave");
    s->load_at = at;
    if (strcmp(crc, "-")) {
        char *end;
        unsigned long c = strtoul(crc, &end, 16);
        if (*end || strlen(crc) != 8) bad("a load line's checksum is not 8 hex digits");
        s->crc = (uint32_t)c;
        s->has_crc = 1;
    }
}

/* "fill INDEX HEX": a small slot's starting bytes, written out (a loss scaler the file does not hold) */
static void add_fill(char *v) {
    long long index;
    int used = 0;
    if (sscanf(v, "%lld %n", &index, &used) != 1 || index < 0 || index >= S.nslots) bad("a fill line names no slot");
    slot *s = &S.slots[index];
    const char *hex = v + used;
    if (s->kind == 3 || s->load_at >= 0 || s->fill) bad("a fill line names a slot that is loaded or held elsewhere");
    if ((int64_t)strlen(hex) != 2 * s->nbytes) bad("a fill line's bytes do not match its slot's size");
    s->fill = malloc(s->nbytes ? s->nbytes : 1);
    if (!s->fill) bad("out of memory");
    for (int64_t i = 0; i < s->nbytes; i++) {
        unsigned int byte;
        if (!isxdigit((unsigned char)hex[2 * i]) || !isxdigit((unsigned char)hex[2 * i + 1]) ||
            sscanf(hex + 2 * i, "%2x", &byte) != 1)
            bad("a fill line's bytes are not hex digits");
        s->fill[i] = (unsigned char)byte;
    }
}

/* input i of a program exists and holds n bytes */
static int input_is(int which, int64_t i, int64_t n) {
    return i >= 0 && i < prog_input_count(which) && prog_input_bytes(which, (int)i) == n;
}

static int output_is(int which, int64_t i, int64_t n) {
    return i >= 0 && i < prog_output_count(which) && prog_output_bytes(which, (int)i) == n;
}

static void need(int ok, const char *what) {
    if (!ok) {
        line_no = 0;
        die(2, "the manifest %s is inconsistent (%s); run mica train or mica sample again to rewrite it",
            manifest_path, what);
    }
}

static void validate(void) {
    int train = !strcmp(S.mode, "train");
    need(train || !strcmp(S.mode, "sample"), "its mode is neither train nor sample");
    need(S.vocab >= 1 && S.vocab <= 1 << 24 && S.block >= 1, "vocab and block must be positive");
    if (S.threads < 1) S.threads = 1;
    for (int i = 0; i < S.nslots; i++) { /* each slot is its programs' input of that dtype and shape */
        slot *s = &S.slots[i];
        need(s->kind != 3 || (s->owner < S.world && s->owner != S.rank), "a remote slot's owner is not another rank");
        if (s->kind == 3) continue;
        for (int w = ARENA_TRAIN; w <= ARENA_LOGITS; w++)
            need((w != ARENA_TRAIN && s->input[w] == -1) ||
                     prog_input_matches(w, (int)s->input[w], s->dtype, s->ndim, s->shape),
                 "a slot is not its program's input of that type and shape");
    }
    if (train) {
        need(S.out_dir && S.out_dir[0], "no out_dir");
        need(S.batch >= 1 && S.accum >= 1 && S.max_iters >= 0 && S.eval_interval >= 1 && S.eval_iters >= 1 &&
                 S.log_interval >= 1,
             "a loop setting is not positive");
        need(S.n_train_files >= 1 && S.n_val_files >= 1, "no training or validation data");
        need(S.world >= 1 && S.rank >= 0 && S.rank < S.world && S.accum % S.world == 0,
             "its world size, rank and accumulation steps do not fit together");
        int64_t rows = S.batch * S.accum, cells = rows / S.world * S.block; /* (a rank's share) */
        need(rows / S.accum == S.batch && cells / S.block == rows / S.world && cells < (INT64_MAX / 8), "the batch is too large");
        need(input_is(ARENA_TRAIN, S.tr_x, cells * 8) && input_is(ARENA_TRAIN, S.tr_y, cells * 8) &&
                 input_is(ARENA_TRAIN, S.tr_iter, 8) && output_is(ARENA_TRAIN, S.tr_loss, 4) &&
                 output_is(ARENA_TRAIN, S.tr_lr, 8),
             "the train program has no such inputs or outputs");
        need(input_is(ARENA_EVAL, S.ev_x, S.batch * S.block * 8) && input_is(ARENA_EVAL, S.ev_y, S.batch * S.block * 8) &&
                 output_is(ARENA_EVAL, S.ev_loss, 4),
             "the eval program has no such inputs or outputs");
        need(!S.resume || S.resume_iter >= 0, "a resumed run needs its iteration");
        need(!S.loop[0] || !strcmp(S.loop, "nanogpt") || !strcmp(S.loop, "speedrun"), "its loop is unknown");
        int speedrun = !strcmp(S.loop, "speedrun"); /* (its data position is a shard and a token) */
        need(!S.n_resume_next || S.n_resume_next == (speedrun ? 2 : rows),
             "the checkpoint's batch does not match this configuration");
    } else {
        need(S.num_samples >= 0 && S.max_new_tokens >= 0 && S.top_k >= 0 && S.temperature > 0 &&
                 isfinite(S.temperature),
             "a sampling setting is out of range");
        need(S.n_start >= 1, "no start tokens");
        need(S.decodable >= 0 && S.decodable <= S.vocab, "its decodable count is outside the vocabulary");
        for (int64_t i = 0; i < S.n_start; i++)
            need(S.start_tokens[i] >= 0 && S.start_tokens[i] < S.vocab, "a start token is outside the vocabulary");
        need(S.vocab <= (INT64_MAX / 4) / S.block && input_is(ARENA_LOGITS, S.lg_idx, S.block * 8) &&
                 output_is(ARENA_LOGITS, S.lg_logits, S.block * S.vocab * 4),
             "the logits program has no such inputs or outputs");
    }
}

void read_manifest(const char *path) {
    manifest_path = path;
    FILE *f = fopen(path, "r");
    if (!f) die(2, "cannot read the manifest %s: %s", path, strerror(errno));
    S.tr_x = S.tr_y = S.tr_iter = S.tr_loss = S.tr_lr = S.ev_x = S.ev_y = S.ev_loss = S.lg_idx = S.lg_logits = -1;
    S.vocab = S.block = S.batch = S.accum = S.max_iters = S.eval_interval = S.eval_iters = S.log_interval = -1;
    S.temperature = 1.0;
    S.world = 1;
    S.eval_offset = -1;
    char *line = 0;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        line_no++;
        if (len && line[len - 1] == '\n') line[--len] = 0;
        if ((ssize_t)strlen(line) != len) bad("a line holds a NUL byte");
        char *v = strchr(line, ' ');
        if (!line[0]) continue;
        if (!v) bad("a key has no value");
        *v++ = 0;
        const char *key = line;
#define STR(k, dst) else if (!strcmp(key, k)) dst = copy(v)
#define INT(k, dst) else if (!strcmp(key, k)) dst = parse_int(v)
#define DBL(k, dst) else if (!strcmp(key, k)) dst = parse_double(v)
        if (!strcmp(key, "mode")) snprintf(S.mode, sizeof S.mode, "%s", v);
        else if (!strcmp(key, "loop")) snprintf(S.loop, sizeof S.loop, "%s", v);
        STR("out_dir", S.out_dir); STR("init_file", S.init_file); STR("batch_order", S.batch_order);
        STR("config_json", S.config_json); STR("run_hash", S.run_hash);
        INT("world", S.world); INT("rank", S.rank);
        INT("vocab", S.vocab); INT("block", S.block); INT("batch", S.batch); INT("accum", S.accum);
        INT("max_iters", S.max_iters); INT("eval_interval", S.eval_interval); INT("eval_iters", S.eval_iters);
        INT("log_interval", S.log_interval); INT("eval_only", S.eval_only); INT("always_save", S.always_save);
        INT("seed", S.seed); INT("threads", S.threads); INT("time_every_iter", S.time_every_iter);
        INT("stop_at", S.stop_at); INT("eval_offset", S.eval_offset); INT("pending", S.pending);
        DBL("flops_per_iter", S.flops_per_iter); DBL("peak_flops", S.peak_flops);
        INT("train.x", S.tr_x); INT("train.y", S.tr_y); INT("train.iter", S.tr_iter); INT("train.loss", S.tr_loss);
        INT("train.lr", S.tr_lr); INT("eval.x", S.ev_x); INT("eval.y", S.ev_y); INT("eval.loss", S.ev_loss);
        INT("logits.idx", S.lg_idx); INT("logits.out", S.lg_logits);
        INT("resume", S.resume); INT("resume_iter", S.resume_iter); DBL("resume_best", S.resume_best);
        DBL("resume_time", S.resume_time);
        INT("num_samples", S.num_samples); INT("max_new_tokens", S.max_new_tokens); INT("top_k", S.top_k); INT("decodable", S.decodable);
        DBL("temperature", S.temperature);
        else if (!strcmp(key, "train_file")) add_file(&S.train_files, &S.n_train_files, v);
        else if (!strcmp(key, "val_file")) add_file(&S.val_files, &S.n_val_files, v);
        else if (!strcmp(key, "resume_rng")) {
            unsigned long long r[4];
            char tail;
            if (sscanf(v, "%llx %llx %llx %llx %c", &r[0], &r[1], &r[2], &r[3], &tail) != 4)
                bad("the generator state is not four hex numbers");
            for (int i = 0; i < 4; i++) S.resume_rng[i] = r[i];
            S.has_resume_rng = 1;
        }
        else if (!strcmp(key, "resume_next")) S.resume_next = parse_int_list(v, &S.n_resume_next);
        else if (!strcmp(key, "start_tokens")) S.start_tokens = parse_int_list(v, &S.n_start);
        else if (!strcmp(key, "slot")) add_slot(v);
        else if (!strcmp(key, "remote")) add_remote(v);
        else if (!strcmp(key, "load")) add_load(v);
        else if (!strcmp(key, "fill")) add_fill(v);
        else bad("an unknown key; it was written by another version of Mica");
#undef STR
#undef INT
#undef DBL
    }
    free(line);
    fclose(f);
    validate();
}
